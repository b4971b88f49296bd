//! Other hosts' configs (Claude Desktop and Code, Cursor, VS Code, Gemini
//! CLI, Cline, Windsurf): which of their keys are ours, which are theirs.
//! May import the YAML tree only.

use std::path::Path;

use crate::yaml::{self, Node};

/// The keys of [`RawServer`], aliases included: what a host's server entry
/// keeps (see [`host_view`]).
pub(super) const SERVER_KEYS: &[&str] = &[
    "type",
    "transportType",
    "transport",
    "command",
    "args",
    "env",
    "inherit_env",
    "envFile",
    "cwd",
    "url",
    "httpUrl",
    "serverUrl",
    "headers",
    "timeout_ms",
    "timeout",
    "disabled",
    "max_concurrent_reads",
    "cache",
    "cache_ttl_ms",
    "serve_stale",
    "protocol",
];

/// Per-server keys of other hosts' own features, dropped without a word
/// from a `.json` config (README, "Configs from other hosts"). Any other
/// unknown key is dropped too, with a warning (it may be a typo).
pub(super) const FOREIGN_SERVER_KEYS: &[&str] = &[
    // Gemini CLI
    "trust",
    "includeTools",
    "excludeTools",
    "description",
    "oauth",
    "authProviderType",
    "targetAudience",
    "targetServiceAccount",
    "extensionName",
    // Cline, Roo Code, Windsurf
    "autoApprove",
    "alwaysAllow",
    "disabledTools",
    "networkTimeout",
    "watchPaths",
    // Claude Code, VS Code, Cursor
    "dev",
    "gallery",
    "version",
    "auth",
    "name",
    "enabled",
];

/// The top-level sections of our own that a `.json` config may also hold.
const OWN_SECTIONS: &[&str] = &["servers", "mcpServers", "policy", "context", "serve", "cache", "audit"];

/// The keys of [`ContextSettings`]: a `context` holding any other key is
/// Gemini CLI's (`fileName`, `includeDirectories`…), not ours.
const CONTEXT_KEYS: &[&str] = &[
    "model",
    "max_tokens",
    "role",
    "preamble",
    "max_resource_bytes",
    "tool_result_max_tokens",
    "deadline_ms",
    "select",
    "chunk_tokens",
    "chunk_overlap",
];

/// Whether a server's `url` (no `type`) means the legacy SSE transport, as
/// in Gemini CLI's `settings.json` (where `httpUrl` is Streamable HTTP);
/// elsewhere a bare `url` is Streamable HTTP with the SSE fallback.
pub(super) fn url_means_sse(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == "settings.json")
}

/// Whether `path` is another host's config (`.json`, `.jsonc`), read as it is.
pub(super) fn is_host_file(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("json") || e.eq_ignore_ascii_case("jsonc"))
}

/// Another host's config as we read it: of the top level only our sections
/// (`mcpServers` / `servers`, and `policy`, `context`, `serve`, `cache` when
/// they are ours), and of each server only the keys we know. What is
/// dropped belongs to the host (Gemini's `theme`, VS Code's `inputs`, Cline's
/// `autoApprove`); an unknown server key not in [`FOREIGN_SERVER_KEYS`] is
/// logged as a warning with its place, since it may be a misspelt one of ours.
pub(super) fn host_view<'a>(root: Node<'a>, path: &Path) -> Node<'a> {
    let keep = |entries: Vec<(Node<'a>, Node<'a>)>, f: &dyn Fn(&Node<'a>, &Node<'a>) -> bool| {
        entries.into_iter().filter(|(k, v)| f(k, v)).collect::<Vec<_>>()
    };
    let yaml::Kind::Map(top) = root.kind else { return root };
    let top = keep(top, &|k, v| match k.as_str() {
        Some("context") => v.entries().all(|(k, _)| k.as_str().is_some_and(|k| CONTEXT_KEYS.contains(&k))),
        Some(k) => OWN_SECTIONS.contains(&k),
        None => false,
    });
    let top = top
        .into_iter()
        .map(|(k, mut v)| {
            if matches!(k.as_str(), Some("servers" | "mcpServers"))
                && let yaml::Kind::Map(servers) = &mut v.kind
            {
                for (name, server) in servers.iter_mut() {
                    let yaml::Kind::Map(entries) = &mut server.kind else { continue };
                    *entries = keep(std::mem::take(entries), &|key, _| {
                        let key_text = key.as_str().unwrap_or("");
                        if SERVER_KEYS.contains(&key_text) {
                            return true;
                        }
                        if !FOREIGN_SERVER_KEYS.contains(&key_text) {
                            tracing::warn!(
                                "{}:{}:{}: server `{}`: `{key_text}` is not a key mcp-context knows; ignored",
                                path.display(),
                                key.pos.line,
                                key.pos.column,
                                name.as_str().unwrap_or("")
                            );
                        }
                        false
                    });
                }
            }
            (k, v)
        })
        .collect();
    Node { kind: yaml::Kind::Map(top), ..root }
}
