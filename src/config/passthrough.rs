//! `serve.passthrough`: the endpoints relayed without injection, one
//! `METHOD /v1/PATH` pattern each. Imports nothing of ours.

/// One `serve.passthrough` entry: a method and a path pattern under `/v1/`
/// (`*` one segment, a last `**` one or more), relayed without injection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassthroughRule {
    /// `GET`, `POST`, `PUT`, `PATCH` or `DELETE`.
    pub method: String,
    /// The path's segments, e.g. `["v1", "files", "*"]`.
    pub segments: Vec<String>,
}

impl PassthroughRule {
    /// Parses `METHOD /v1/path/pattern`.
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        let hint = "write `METHOD /v1/PATH`, e.g. `GET /v1/files/*` (`*` one segment, a last `**` the rest)";
        let (method, path) = text.trim().split_once(' ').ok_or_else(|| format!("`{text}`: {hint}"))?;
        let method = method.to_ascii_uppercase();
        if !["GET", "POST", "PUT", "PATCH", "DELETE"].contains(&method.as_str()) {
            return Err(format!("`{text}`: `{method}` is not GET, POST, PUT, PATCH or DELETE"));
        }
        let segments: Vec<String> = path.trim().trim_start_matches('/').split('/').map(str::to_owned).collect();
        if !path.trim().starts_with("/v1/") || segments.len() < 2 {
            return Err(format!("`{text}`: the path must start with `/v1/`; {hint}"));
        }
        for (i, seg) in segments.iter().enumerate() {
            let ok = !seg.is_empty()
                && seg != "."
                && seg != ".."
                && (seg == "*"
                    || (seg == "**" && i == segments.len() - 1)
                    || seg.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.~:@".contains(&b)));
            if !ok {
                return Err(format!("`{text}`: `{seg}` is not a path segment; {hint}"));
            }
        }
        Ok(Self { method, segments })
    }

    /// The default list: what an application needs next to chat, with no
    /// stored state (`GET /v1/models`, `GET /v1/models/*`, `POST /v1/embeddings`, `POST /v1/moderations`).
    pub fn defaults() -> Vec<Self> {
        ["GET /v1/models", "GET /v1/models/*", "POST /v1/embeddings", "POST /v1/moderations"]
            .iter()
            .map(|r| Self::parse(r).expect("the default rules parse"))
            .collect()
    }
}
