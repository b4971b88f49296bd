//! `mcp-context list`: every resource and template of the configured
//! servers, as text for people or (`--json`) one object for programs. The
//! text escapes what servers named ([`escape`]: URIs, names, descriptions,
//! protocol revisions, problems), so each entry is one line and nothing in
//! it reaches the terminal as a control; the JSON keeps every value exact.
//! Part of the CLI (layer 9): imports the library's public API only.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context as _;
use mcp_context::display::escape;
use mcp_context::servers::{Hub, ServerStatus};

/// `verbose` (the global `-v`/`--verbose`) adds a `Servers:` section to the
/// text form: the negotiated revision, which the JSON form always has.
pub(crate) fn list(hub: &Hub, server: Option<&str>, json: bool, verbose: bool) -> anyhow::Result<ExitCode> {
    let resources = hub.resources();
    let mut out = std::io::stdout().lock();
    if json {
        let v = serde_json::json!({
            "resources": resources,
            "templates": hub.templates(),
            "failed_servers": hub.failures(),
            // Per server: connected, the negotiated revision (`protocol`), counts, timings.
            "servers": hub.status(),
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&v).context("serialising the listing")?)?;
        return Ok(ExitCode::SUCCESS);
    }
    // The lines of `list_mcp_resources` (mcp_context::tools::format_listing), escaped.
    let shown: Vec<_> = resources.iter().filter(|r| server.is_none_or(|s| r.id.server == s)).collect();
    match (shown.is_empty(), server) {
        (true, Some(s)) => writeln!(out, "No resources found for server: {s}")?,
        (true, None) => writeln!(out, "No MCP resources found.")?,
        (false, _) => writeln!(out, "Available MCP Resources:")?,
    }
    for r in shown {
        entry(&mut out, &r.id.to_string(), &r.name, r.description.as_deref())?;
    }
    // Templates under their own heading: `--json` has them, so does the text.
    let templates: Vec<_> = hub.templates().into_iter().filter(|t| server.is_none_or(|s| t.server == s)).collect();
    if !templates.is_empty() {
        writeln!(out, "\nResource templates:")?;
        for t in templates {
            entry(&mut out, &format!("{}:{}", t.server, t.uri_template), &t.name, t.description.as_deref())?;
        }
    }
    if verbose {
        writeln!(out, "\nServers:")?;
        for s in hub.status().into_iter().filter(|s| server.is_none_or(|n| s.name == n)) {
            write!(out, "{}", server_line(&s))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `- ID | NAME | DESCRIPTION`, the empty parts left out, each escaped.
fn entry(out: &mut impl Write, id: &str, name: &str, description: Option<&str>) -> std::io::Result<()> {
    write!(out, "- {}", escape(id))?;
    if !name.is_empty() {
        write!(out, " | {}", escape(name))?;
    }
    if let Some(d) = description.filter(|d| !d.is_empty()) {
        write!(out, " | {}", escape(d))?;
    }
    writeln!(out)
}

/// One server in `list --verbose`, e.g.
/// `- docs: protocol 2026-07-28, 12 resources, 0 templates`.
fn server_line(s: &ServerStatus) -> String {
    let mut line = format!("- {}: ", s.name);
    match (&s.protocol, s.connected) {
        (Some(p), true) => line.push_str(&format!("protocol {}", escape(p))),
        (Some(p), false) => line.push_str(&format!("not connected (last protocol {})", escape(p))),
        (None, _) => line.push_str("not connected"),
    }
    line.push_str(&format!(", {} resources, {} templates", s.resources, s.templates));
    if !s.listing_complete {
        line.push_str(", listing incomplete");
    }
    if s.restarts > 0 {
        line.push_str(&format!(", {} restarts", s.restarts));
    }
    if let Some(problem) = &s.problem {
        line.push_str(&format!(": {}", escape(problem)));
    }
    line.push('\n');
    line
}
