//! `mcp-context check`: the pre-flight a deployment pipeline runs before a
//! rollout. The config and its policy are loaded with every problem listed
//! (each at its file, line and column), then every item the config names is
//! tried ([`mcp_context::preflight::probe`]: servers, Redis, PostgreSQL, the
//! JWKS, the upstreams). One line per item, escaped ([`escape`]: a server's
//! words reach no terminal as controls); `--json` gives one object. Exit 0
//! when everything works, 1 otherwise. Part of the CLI (layer 9): imports
//! the library's public API only.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use mcp_context::display::escape;
use mcp_context::{Config, Error, Policy};
use serde::Serialize;

/// One line of the check.
#[derive(Serialize)]
struct Item {
    /// `config`, `policy`, `server`, `redis`, `postgres`, `jwks` or `upstream`.
    kind: &'static str,
    /// The file (with line and column for a problem), server or URL.
    name: String,
    ok: bool,
    /// Time it took, in milliseconds (`null` for a problem found by a load).
    ms: Option<f64>,
    detail: String,
}

fn ms_since(start: Instant) -> Option<f64> {
    Some((start.elapsed().as_secs_f64() * 1000.0 * 10.0).round() / 10.0)
}

/// Runs the check of the config at `path`.
pub(crate) async fn check(path: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let mut items = Vec::new();
    let start = Instant::now();
    match Config::load(path) {
        Err(e) => {
            problems(&e, &mut items);
            // The policy's problems too, in the same run.
            if let Some(policy) = Config::policy_in(path)
                && let Err(e) = Policy::load(&policy)
            {
                problems(&e, &mut items);
            }
        }
        Ok(config) => {
            let n = config.servers.len();
            let detail = format!("{n} server{}", if n == 1 { "" } else { "s" });
            items.push(Item { kind: "config", name: shown(path), ok: true, ms: ms_since(start), detail });
            let policy_ok = policy(&config, &mut items);
            if policy_ok {
                for p in mcp_context::preflight::probe(&config).await {
                    let ms = Some((p.ms * 10.0).round() / 10.0);
                    items.push(Item { kind: p.kind, name: p.name, ok: p.ok, ms, detail: p.detail });
                }
            }
        }
    }
    let ok = items.iter().all(|i| i.ok);
    let mut out = std::io::stdout().lock();
    if json {
        let v = serde_json::json!({ "ok": ok, "checks": items });
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        let width = items.iter().map(|i| i.kind.len()).max().unwrap_or(0);
        for i in &items {
            let status = if i.ok { "ok  " } else { "FAIL" };
            let time = i.ms.map(|ms| format!(" ({ms} ms)")).unwrap_or_default();
            let (name, detail) = (escape(&i.name), escape(&i.detail));
            writeln!(out, "{status} {:width$} {name}: {detail}{time}", i.kind)?;
        }
        let failed = items.iter().filter(|i| !i.ok).count();
        if failed > 0 {
            writeln!(out, "{failed} of {} checks failed", items.len())?;
        }
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The policy the config names (all its problems), and `serve.jwt.role_map`
/// against its roles; whether the servers are worth trying after it.
fn policy(config: &Config, items: &mut Vec<Item>) -> bool {
    let Some(path) = &config.policy else {
        let detail = "none named (`policy:`): every listed resource is visible to every user".into();
        items.push(Item { kind: "policy", name: shown(&config.path), ok: true, ms: None, detail });
        return true;
    };
    let start = Instant::now();
    match Policy::load(path) {
        Err(e) => {
            problems(&e, items);
            false
        }
        Ok(policy) => {
            let s = policy.summary();
            let detail = format!("{} files, {} roles, {} users", s.files.len(), s.roles.len(), s.users.len());
            items.push(Item { kind: "policy", name: shown(path), ok: true, ms: ms_since(start), detail });
            if let Some(jwt) = &config.serve.jwt
                && let Err(e) = jwt.check_roles(|r| policy.has_role(r))
            {
                problems(&e, items);
            }
            true
        }
    }
}

/// Every problem of a failed load, one item each (a load reports them all: the first, then `more`).
fn problems(e: &Error, items: &mut Vec<Item>) {
    let (kind, path, line, column, message, more) = match e {
        Error::Config { path, line, column, message, more } => ("config", path, line, column, message, more),
        Error::Policy { path, line, column, message, more } => ("policy", path, line, column, message, more),
        other => {
            items.push(Item { kind: "config", name: String::new(), ok: false, ms: None, detail: other.to_string() });
            return;
        }
    };
    let name = match (line, column) {
        (Some(l), Some(c)) => format!("{}:{l}:{c}", shown(path)),
        (Some(l), None) => format!("{}:{l}", shown(path)),
        _ => shown(path),
    };
    items.push(Item { kind, name, ok: false, ms: None, detail: message.clone() });
    for m in more {
        problems(m, items);
    }
}

fn shown(path: &Path) -> String {
    path.display().to_string()
}
