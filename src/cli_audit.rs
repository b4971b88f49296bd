//! `mcp-context audit`: who received a resource, what a user received,
//! from the audit trail's PostgreSQL sink, else its JSONL file (rotated
//! files included), as a table or JSON. A `--since` that is not a time is a
//! usage error, said by us before any sink is asked. Part of the CLI (layer
//! 9): imports the library's public API and the CLI's `SERVER:URI` reading.

use std::io::Write;
use std::process::ExitCode;

use clap::Subcommand;
use mcp_context::Config;
use mcp_context::audit::{AuditQuery, AuditRecord, query};
use mcp_context::display::escape;

/// The questions `mcp-context audit` answers.
#[derive(Subcommand)]
pub(crate) enum AuditCommand {
    /// Who received a resource: one line per injection that carried it.
    Who {
        /// SERVER:URI, e.g. demo:secret://payroll/2026
        #[arg(long, value_name = "SERVER:URI")]
        resource: String,
        /// Only since then: RFC 3339 (2026-12-01T00:00:00Z), a date (2026-12-01) or a span back from now
        /// (90m, 24h, 7d).
        #[arg(long, value_name = "T", value_parser = since_arg)]
        since: Option<String>,
        /// One JSON array of records on stdout.
        #[arg(long)]
        json: bool,
    },
    /// What a user received: one line per resource of each injection.
    User {
        /// The user name.
        user: String,
        /// As for `who`.
        #[arg(long, value_name = "T", value_parser = since_arg)]
        since: Option<String>,
        /// One JSON array of records on stdout.
        #[arg(long)]
        json: bool,
    },
}

/// `--since`, checked by clap: a bad one is a usage error (exit 2) in our words.
fn since_arg(text: &str) -> Result<String, String> {
    mcp_context::audit::since(text).map_err(|e| match e {
        mcp_context::Error::Audit { what, .. } => what,
        other => other.to_string(),
    })
}

pub(crate) async fn run(config: &Config, command: AuditCommand) -> anyhow::Result<ExitCode> {
    let (q, json, who) = match command {
        AuditCommand::Who { resource, since, json } => {
            let resource = crate::cli_ids::lookup(config, &resource)?;
            (AuditQuery::WhoReceived { resource, since }, json, true)
        }
        AuditCommand::User { user, since, json } => (AuditQuery::ReceivedBy { user, since }, json, false),
    };
    let records = query(&config.audit, &q).await?;
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string(&records)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<[String; 7]> = match &q {
        AuditQuery::WhoReceived { resource, .. } => records
            .iter()
            .map(|r| {
                let res = r.included.iter().find(|i| i.id == *resource);
                row(r, res.map_or("-", |i| &i.sha256), res.map_or(0, |i| i.tokens), &r.user)
            })
            .collect(),
        _ => records
            .iter()
            .flat_map(|r| {
                if r.included.is_empty() {
                    vec![row(r, "-", 0, "(nothing)")]
                } else {
                    r.included.iter().map(|i| row(r, &i.sha256, i.tokens, &i.id)).collect()
                }
            })
            .collect(),
    };
    let head = ["time", if who { "user" } else { "resource" }, "via", "route", "sha256", "tokens", "request"];
    let widths: Vec<usize> =
        (0..7).map(|c| rows.iter().map(|r| r[c].chars().count()).chain([head[c].len()]).max().unwrap_or(0)).collect();
    for line in std::iter::once(head.map(str::to_owned)).chain(rows) {
        let cells: Vec<String> = line.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        writeln!(out, "{}", cells.join("  ").trim_end())?;
    }
    if records.is_empty() {
        eprintln!("(no records)");
    }
    Ok(ExitCode::SUCCESS)
}

/// One table line: time, who or what, how identified, route (and upstream status), digest, tokens, request id.
/// Every cell escaped ([`escape`]): a resource URI or a user name holding a newline, an escape sequence or a
/// bidirectional control is one cell of one line, shown as what it is (`--json` keeps it exact).
fn row(r: &AuditRecord, sha256: &str, tokens: usize, subject: &str) -> [String; 7] {
    let route = match r.upstream_status {
        Some(s) => format!("{} {s}", r.route),
        None => r.route.clone(),
    };
    [&r.at, subject, &r.identity_source, &route, sha256.get(..16).unwrap_or(sha256), &tokens.to_string(), &r.request_id]
        .map(|cell| escape(cell).into_owned())
}
