//! The CLI's `SERVER:URI` arguments: a URI given without its server
//! (`demo://docs/guide`, which reads as server `demo`, URI `//docs/guide`)
//! is refused everywhere one is taken (`read`, `preview --select`, `policy
//! explain`, `audit who --resource`) with the identifier meant. Part of the
//! CLI (layer 9): imports the library's public API only.

use mcp_context::{Config, ResourceId};

/// The refusal of `id` when it is a URI whose `SERVER:` was forgotten: a
/// URI never starts with `//`, so `demo://x` cannot be server `demo`'s
/// `//x`. Suggests the server named like the URI's scheme, else the first.
pub(crate) fn forgotten_server(config: &Config, id: &ResourceId) -> Option<anyhow::Error> {
    if !id.uri.starts_with("//") {
        return None;
    }
    let known: Vec<&str> = config.servers.iter().map(|s| s.name.as_str()).collect();
    let server = known.iter().find(|s| **s == id.server).or(known.first()).copied().unwrap_or("SERVER");
    Some(anyhow::anyhow!(
        "`{id}` is a URI without its server: identifiers are SERVER:URI; did you mean `{server}:{id}`? \
         (configured servers: {})",
        if known.is_empty() { "none".to_owned() } else { known.join(", ") }
    ))
}

/// `text` as an audit lookup: taken exactly as recorded (an audited id may hold what a server named, control
/// characters included, which `ResourceId::parse` refuses), refused only with the hint when its server was forgotten.
pub(crate) fn lookup(config: &Config, text: &str) -> anyhow::Result<String> {
    match ResourceId::parse(text).ok().and_then(|id| forgotten_server(config, &id)) {
        Some(e) => Err(e),
        None => Ok(text.to_owned()),
    }
}
