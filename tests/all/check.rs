//! `mcp-context check` (issue 50 item 6) and every config problem in one
//! run (item 5), through the real binary: real servers over stdio and
//! Streamable HTTP, the machine's Redis (127.0.0.1:6379) and PostgreSQL
//! (127.0.0.1:5432, database `test`), the real OIDC provider for the JWKS,
//! a recording upstream and one that nobody listens on.

use std::path::Path;
use std::process::Output;

use serde_json::Value;

use crate::audit::{pg, pg_url};
use crate::common::*;

/// Runs the binary with `args` in `dir` (its config named by `--config`).
async fn run(config: &Path, args: &[&str]) -> Output {
    tokio::process::Command::new(MCP_CONTEXT)
        .args(args)
        .arg("--config")
        .arg(config)
        .current_dir(config.parent().unwrap())
        .env_remove("MCP_CONTEXT_CONFIG")
        .output()
        .await
        .expect("run mcp-context")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// An address nobody listens on (bound, then let go).
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn redis_url() -> String {
    std::env::var("MCP_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

/// Five independent problems in three sections (two servers, `serve:`
/// twice, `context:`), one of `serve:`'s a key serde stops at: all five
/// reported, each at its line and column, by `preview` and by `check`.
#[tokio::test]
async fn five_problems_in_three_sections_are_reported_in_one_run() {
    let yaml = "servers:\n  a:\n    url: ftp://x/mcp\n  b:\n    command: x\n    colour: red\n\
                serve:\n  colour: blue\n  upstream: ftp://u\ncontext:\n  max_tokens: 0\n";
    let (_dir, path) = temp_config(yaml);
    let out = run(&path, &["preview"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    let shown = path.display().to_string();
    let lines: Vec<String> =
        stderr.lines().map(|l| l.trim_start_matches("error: ").replace(&shown, "c.yaml")).collect();
    let starts: Vec<&str> = lines.iter().map(|l| l.split(": ").next().unwrap()).collect();
    assert_eq!(starts, ["c.yaml:3:10", "c.yaml:6:5", "c.yaml:8:3", "c.yaml:9:13", "c.yaml:11:15"], "{stderr}");
    assert!(lines[2].contains("unknown field `colour`") && lines[3].contains("serve.upstream must start"), "{stderr}");

    let out = run(&path, &["check", "--json"]).await;
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false);
    let names: Vec<String> =
        v["checks"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap().replace(&shown, "c.yaml")).collect();
    assert_eq!(names, ["c.yaml:3:10", "c.yaml:6:5", "c.yaml:8:3", "c.yaml:9:13", "c.yaml:11:15"], "{v}");
    assert!(v["checks"].as_array().unwrap().iter().all(|c| c["kind"] == "config" && c["ok"] == false));
}

/// A config with a problem whose policy has two: all three in one run.
#[tokio::test]
async fn the_policy_problems_come_with_the_config_problems() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("p.yaml"),
        "default_roles: [nobody]\nroles:\n  staff:\n    allow:\n      - { server: a, colour: red }\n",
    )
    .unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, "servers: {}\npolicy: p.yaml\ncontext:\n  max_tokens: 0\n").unwrap();
    let out = run(&path, &["preview"]).await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("c.yaml:4:15: context.max_tokens must be at least 1"), "{stderr}");
    assert!(stderr.contains("p.yaml:5:") && stderr.contains("colour"), "{stderr}");
    assert!(stderr.contains("p.yaml:1:") && stderr.contains("nobody"), "{stderr}");
    let out = run(&path, &["check"]).await;
    let stdout = text(&out.stdout);
    assert_eq!(stdout.lines().filter(|l| l.starts_with("FAIL config ")).count(), 1, "{stdout}");
    assert_eq!(stdout.lines().filter(|l| l.starts_with("FAIL policy ")).count(), 2, "{stdout}");
}

/// The unclosed flow sequence of the issue, on line 6: reported there, with
/// what was expected (libyaml said `line 6, column 30: expected ',' or ']',
/// but got '}'`; saphyr alone said `7:1: invalid indentation`).
#[tokio::test]
async fn a_flow_sequence_closed_by_a_brace_is_reported_on_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let policy = "roles:\n  staff:\n    allow:\n      - { server: acc, uri: \"acc://x\" }\n\n      \
                  - { server: acc, uri: [\"acc://public/**\" }\n  other:\n    allow: []\n";
    std::fs::write(dir.path().join("p.yaml"), policy).unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, "servers: {}\npolicy: p.yaml\n").unwrap();
    let out = run(&path, &["check"]).await;
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let p = dir.path().join("p.yaml").display().to_string();
    assert!(
        stdout.contains(&format!(
            "FAIL policy {p}:6:48: expected ',' or ']', but got '}}', while parsing a flow sequence at line 6 column 29"
        )),
        "{stdout}"
    );
}

/// Every item of a deployment, one broken server among good ones, and an
/// upstream nobody listens on: one line each, the broken items FAIL, every
/// other line ok, exit 1; the same with `--json`.
#[tokio::test]
async fn check_lists_every_item_and_a_broken_one_breaks_only_its_own_line() {
    let Some(_pg) = pg("check_lists_every_item").await else { return };
    let tag = tag();
    let (mcp_url, _fixture, _stop) = http_fixture(Options::default()).await;
    let dead = closed_port();
    let yaml = format!(
        "servers:\n{}{}  remote:\n    url: {mcp_url}\n  broken:\n    command: /nonexistent/mcp-server\n\
         cache:\n  backend: redis\n  url: {}\naudit:\n  sinks:\n    - postgres: {{ url: \"{}\" }}\n\
         serve:\n  upstream: http://127.0.0.1:{dead}/v1\n  upstream_api_key: sk-x\n",
        fixture_server("fx", &tag, &["--n", "3"]),
        demo_server("demo", &tag),
        redis_url(),
        pg_url(),
    );
    let (_dir, path) = temp_config(&yaml);
    let out = run(&path, &["check"]).await;
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    let line =
        |start: &str| stdout.lines().find(|l| l.starts_with(start)).unwrap_or_else(|| panic!("{start}: {stdout}"));
    assert!(line("ok   config ").contains(": 4 servers ("), "{stdout}");
    assert!(line("ok   policy ").contains("none named"), "{stdout}");
    assert!(line("ok   server   fx: 3 resources").contains(" ms)"), "{stdout}");
    assert!(line("ok   server   demo: 7 resources, 1 template").contains("protocol 2025-11-25"), "{stdout}");
    assert!(line("ok   server   remote: ").contains(" ms)"), "{stdout}");
    assert!(line("FAIL server   broken: ").contains("/nonexistent/mcp-server"), "{stdout}");
    assert!(line("ok   redis    redis://127.0.0.1:6379").contains("PONG"), "{stdout}");
    assert!(line("ok   postgres postgres://").contains("SELECT 1"), "{stdout}");
    assert!(
        line(&format!("FAIL upstream http://127.0.0.1:{dead}/v1: cannot reach it")).contains("refused"),
        "{stdout}"
    );
    assert!(stdout.ends_with("2 of 9 checks failed\n"), "{stdout}");
    assert!(!stdout.contains("sk-x"), "{stdout}");

    let out = run(&path, &["check", "--json"]).await;
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false);
    let checks = v["checks"].as_array().unwrap();
    let kinds: Vec<(&str, &str, bool)> = checks
        .iter()
        .map(|c| (c["kind"].as_str().unwrap(), c["name"].as_str().unwrap(), c["ok"].as_bool().unwrap()))
        .collect();
    let (kinds, names): (Vec<_>, Vec<_>) = kinds.iter().map(|(k, n, ok)| ((*k, *ok), *n)).unzip();
    assert_eq!(
        kinds,
        [
            ("config", true),
            ("policy", true),
            ("server", true),
            ("server", true),
            ("server", true),
            ("server", false),
            ("redis", true),
            ("postgres", true),
            ("upstream", false)
        ],
        "{v}"
    );
    assert_eq!(names[2..6], ["fx", "demo", "remote", "broken"]);
    assert!(checks[2..].iter().all(|c| c["ms"].as_f64().is_some_and(|ms| ms > 0.0)), "{v}");
    assert!(wait_gone(&tag, std::time::Duration::from_secs(5)).await.is_empty(), "no server left running");
}

/// All items working: exit 0, the reachable upstream's answer shown, the
/// identity provider's keys fetched; a provider that is down fails its line.
#[tokio::test]
async fn check_passes_when_everything_works_and_names_a_dead_identity_provider() {
    let Some((_idp, v)) = start_oidc_fixture("check_passes_when_everything_works", "provider.mjs", &[]).await else {
        return;
    };
    let issuer = v["issuer"].as_str().unwrap();
    let upstream = FakeLlm::start(Reply::Text("hi".into())).await;
    let tag = tag();
    let jwt = |issuer: &str| {
        format!(
            "servers:\n{}serve:\n  upstream: {}\n  jwt:\n    issuer: {issuer}\n    audience: urn:x\n",
            demo_server("demo", &tag),
            upstream.base
        )
    };
    let (_dir, path) = temp_config(&jwt(issuer));
    let out = run(&path, &["check"]).await;
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert_eq!(stdout.lines().count(), 5, "config, policy, demo, jwks, upstream: {stdout}");
    assert!(stdout.lines().all(|l| l.starts_with("ok ")), "{stdout}");
    assert!(stdout.contains(&format!("ok   jwks     {issuer}: keys fetched")), "{stdout}");
    assert!(stdout.contains(&format!("ok   upstream {}: GET /models answered", upstream.base)), "{stdout}");

    let dead = format!("http://127.0.0.1:{}", closed_port());
    let (_dir2, path) = temp_config(&jwt(&dead));
    let out = run(&path, &["check", "--json"]).await;
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let jwks = v["checks"].as_array().unwrap().iter().find(|c| c["kind"] == "jwks").unwrap().clone();
    assert_eq!((jwks["name"].as_str(), jwks["ok"].as_bool()), (Some(dead.as_str()), Some(false)), "{v}");
    let others: Vec<&Value> = v["checks"].as_array().unwrap().iter().filter(|c| c["kind"] != "jwks").collect();
    assert!(others.iter().all(|c| c["ok"] == true), "one dead provider fails only its own line: {v}");
}
