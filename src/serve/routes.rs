//! Which endpoint a request is, decided once on the canonical path
//! ([`Canonical`]) and the method: one route per endpoint, so that a spelling
//! variant either reaches the same handler or is refused, never relayed
//! around the injection. Owns the list of stored-object endpoints (whose ids
//! are checked against their owner) and the passthrough allowlist's matching.
//! Imports the path type and the config's rule type only.

use crate::settings::PassthroughRule;
use axum::http::Method;

use super::path::Canonical;

/// The kinds of objects the upstream stores for a caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stored {
    /// A chat completion created with `store: true` (`chatcmpl-…`).
    ChatCompletion,
    /// A Response (`resp_…`), stored unless `store: false`.
    Response,
    /// A conversation (`conv_…`).
    Conversation,
}

impl Stored {
    pub(super) fn name(self) -> &'static str {
        match self {
            Stored::ChatCompletion => "chat",
            Stored::Response => "response",
            Stored::Conversation => "conversation",
        }
    }
}

/// What a request is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Route {
    /// `POST /v1/chat/completions`: injected.
    Chat,
    /// `POST /v1/responses`: injected.
    Responses,
    /// `POST /v1/conversations`: relayed, its id recorded as the caller's.
    CreateConversation,
    /// A read, update, delete or listing of items of one stored object:
    /// relayed only for its owner.
    StoredObject {
        kind: Stored,
        id: String,
    },
    /// `POST /v1/messages` (Anthropic's Messages API): injected.
    Messages,
    /// `POST /v1/messages/count_tokens`: injected, so the count includes ours.
    CountTokens,
    /// `POST /{version}/models/{model}:generateContent` or
    /// `:streamGenerateContent` (Gemini's API, `v1beta` or `v1`): injected.
    Gemini {
        version: &'static str,
        /// The path's last segment, `{model}:{method}`.
        method: String,
    },
    /// An allowlisted endpoint: relayed as it is.
    Passthrough,
    /// `HEAD /`: the reachability probe Claude Code sends first.
    Root,
    Health,
    Ready,
    Metrics,
    /// `GET /auth/{server}/start`: connect the caller to an OAuth server.
    AuthStart {
        server: String,
    },
    /// `GET /auth/callback`: the authorization server's redirect back.
    AuthCallback,
    /// `/mcp` (`serve.mcp`): the MCP endpoint of the caller's resources.
    Mcp,
    /// `GET /.well-known/oauth-protected-resource[/mcp]`: its metadata (RFC 9728).
    ProtectedResource,
}

impl Route {
    /// The label in metrics (one per route, never the caller's path).
    pub(super) fn label(&self) -> &'static str {
        match self {
            Route::Chat => "/v1/chat/completions",
            Route::Responses => "/v1/responses",
            Route::CreateConversation => "/v1/conversations",
            Route::StoredObject { kind: Stored::ChatCompletion, .. } => "/v1/chat/completions/{id}",
            Route::StoredObject { kind: Stored::Response, .. } => "/v1/responses/{id}",
            Route::StoredObject { kind: Stored::Conversation, .. } => "/v1/conversations/{id}",
            // The label of the catch-all route before the allowlist, kept for dashboards.
            Route::Passthrough => "/v1/{*rest}",
            Route::Messages => "/v1/messages",
            Route::CountTokens => "/v1/messages/count_tokens",
            Route::Gemini { version, method } => match (*version, method.ends_with(":streamGenerateContent")) {
                ("v1", false) => "/v1/models/{model}:generateContent",
                ("v1", true) => "/v1/models/{model}:streamGenerateContent",
                (_, false) => "/v1beta/models/{model}:generateContent",
                (_, true) => "/v1beta/models/{model}:streamGenerateContent",
            },
            Route::Root => "/",
            Route::Health => "/healthz",
            Route::Ready => "/readyz",
            Route::Metrics => "/metrics",
            Route::AuthStart { .. } => "/auth/{server}/start",
            Route::AuthCallback => "/auth/callback",
            Route::Mcp => "/mcp",
            Route::ProtectedResource => "/.well-known/oauth-protected-resource",
        }
    }
}

/// Why a request has no route: answered 404, nothing relayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NoRoute {
    /// A listing of stored objects: it would show other callers' objects.
    Listing,
    /// Anything else.
    Unknown,
}

/// An id as the upstream issues them (`chatcmpl-…`, `resp_…`, `conv_…`):
/// letters, digits, `-` and `_`. Anything else is no id of ours.
fn is_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= 200 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The route for `method` on `path`, stored-object endpoints first (an
/// allowlist entry cannot open them), then the passthrough allowlist.
pub(super) fn route(method: &Method, path: &Canonical, allow: &[PassthroughRule]) -> Result<Route, NoRoute> {
    let segs = path.segments();
    let m = method.as_str();
    let stored = |kind, id: &str| {
        if is_id(id) { Ok(Route::StoredObject { kind, id: id.to_owned() }) } else { Err(NoRoute::Unknown) }
    };
    match (m, segs.as_slice()) {
        ("GET", ["healthz"]) => return Ok(Route::Health),
        ("GET", ["readyz"]) => return Ok(Route::Ready),
        ("GET", ["metrics"]) => return Ok(Route::Metrics),
        ("GET", ["auth", "callback"]) => return Ok(Route::AuthCallback),
        ("GET", ["auth", server, "start"]) => return Ok(Route::AuthStart { server: (*server).to_owned() }),
        ("POST", ["v1", "chat", "completions"]) => return Ok(Route::Chat),
        ("POST", ["v1", "responses"]) => return Ok(Route::Responses),
        ("POST", ["v1", "conversations"]) => return Ok(Route::CreateConversation),
        ("POST", ["v1", "messages"]) => return Ok(Route::Messages),
        ("POST", ["v1", "messages", "count_tokens"]) => return Ok(Route::CountTokens),
        ("HEAD", []) => return Ok(Route::Root),
        ("POST", [v @ ("v1" | "v1beta"), "models", m]) if is_generate(m) => {
            let version = if *v == "v1" { "v1" } else { "v1beta" };
            return Ok(Route::Gemini { version, method: (*m).to_owned() });
        }
        // The rest of Gemini's API (batches, caches, files, tuned models) is not relayed.
        (_, ["v1beta", ..]) => return Err(NoRoute::Unknown),
        ("GET" | "POST" | "DELETE", ["mcp"]) => return Ok(Route::Mcp),
        ("GET", [".well-known", "oauth-protected-resource"] | [".well-known", "oauth-protected-resource", "mcp"]) => {
            return Ok(Route::ProtectedResource);
        }
        // Batches and anything else under it would reach the model without
        // the context: never opened by the allowlist.
        (_, ["v1", "messages", ..]) => return Err(NoRoute::Unknown),
        (_, ["v1", "chat", "completions"] | ["v1", "responses"] | ["v1", "conversations"]) => {
            return Err(NoRoute::Listing);
        }
        ("GET" | "POST" | "DELETE", ["v1", "chat", "completions", id]) => return stored(Stored::ChatCompletion, id),
        ("GET", ["v1", "chat", "completions", id, "messages"]) => return stored(Stored::ChatCompletion, id),
        ("GET" | "DELETE", ["v1", "responses", id])
        | ("POST", ["v1", "responses", id, "cancel"])
        | ("GET", ["v1", "responses", id, "input_items"]) => return stored(Stored::Response, id),
        ("GET" | "POST" | "DELETE", ["v1", "conversations", id])
        | ("GET" | "POST", ["v1", "conversations", id, "items"]) => return stored(Stored::Conversation, id),
        ("GET" | "DELETE", ["v1", "conversations", id, "items", item]) if is_id(item) => {
            return stored(Stored::Conversation, id);
        }
        // Every other path under these three is theirs too: never opened by the allowlist.
        (_, ["v1", "chat", "completions", ..] | ["v1", "responses", ..] | ["v1", "conversations", ..]) => {
            return Err(NoRoute::Unknown);
        }
        _ => {}
    }
    if allow.iter().any(|r| r.method == m && matches(&r.segments, &segs)) {
        return Ok(Route::Passthrough);
    }
    Err(NoRoute::Unknown)
}

/// A model's method that generates text: `{model}:generateContent` or
/// `{model}:streamGenerateContent`, the model named.
fn is_generate(segment: &str) -> bool {
    segment.split_once(':').is_some_and(|(model, method)| {
        !model.is_empty() && matches!(method, "generateContent" | "streamGenerateContent")
    })
}

/// `*` matches one segment, a last `**` one or more, anything else itself
/// (case-sensitively, as the upstream routes).
fn matches(pattern: &[String], path: &[&str]) -> bool {
    match pattern.split_last() {
        Some((last, head)) if last == "**" => {
            path.len() > head.len() && head.iter().zip(path).all(|(p, s)| p == "*" || p == s)
        }
        _ => pattern.len() == path.len() && pattern.iter().zip(path).all(|(p, s)| p == "*" || p == s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(method: &str, path: &str) -> Result<Route, NoRoute> {
        let allow = PassthroughRule::defaults();
        route(&method.parse().unwrap(), &Canonical::parse(path).unwrap(), &allow)
    }

    #[test]
    fn one_route_per_endpoint() {
        assert_eq!(r("POST", "/v1/chat/completions"), Ok(Route::Chat));
        assert_eq!(r("POST", "/v1/chat/c%6fmpletions"), Ok(Route::Chat), "decided on the decoded path");
        for (m, p) in [
            ("POST", "/v1/Chat/Completions"),
            ("GET", "/v1/files"),
            ("DELETE", "/v1/models/gpt-4o"),
            ("POST", "/v1/fine_tuning/jobs"),
            ("GET", "/v1/organization/users"),
            ("POST", "/v1/responses/resp_1/x"),
            ("GET", "/v1/responses/resp.1"),
            ("GET", "/v1/models/a/b"),
        ] {
            assert_eq!(r(m, p), Err(NoRoute::Unknown), "{m} {p}");
        }
        assert_eq!(r("GET", "/v1/chat/completions"), Err(NoRoute::Listing));
        assert_eq!(r("POST", "/v1/messages"), Ok(Route::Messages));
        assert_eq!(r("POST", "/v1/m%65ssages/count_tokens"), Ok(Route::CountTokens));
        assert_eq!(r("HEAD", "/"), Ok(Route::Root));
        for (m, p) in [("POST", "/v1/messages/batches"), ("GET", "/v1/messages"), ("POST", "/v1/Messages")] {
            assert_eq!(r(m, p), Err(NoRoute::Unknown), "{m} {p}");
        }
        assert_eq!(
            r("POST", "/v1beta/models/gemini-2.5-flash:generateContent"),
            Ok(Route::Gemini { version: "v1beta", method: "gemini-2.5-flash:generateContent".into() })
        );
        assert_eq!(
            r("POST", "/v1/models/g:streamGenerateContent"),
            Ok(Route::Gemini { version: "v1", method: "g:streamGenerateContent".into() })
        );
        for (m, p) in [
            ("POST", "/v1beta/models/:generateContent"),
            ("POST", "/v1beta/models/g:batchGenerateContent"),
            ("POST", "/v1beta/models/g:countTokens"),
            ("GET", "/v1beta/models/g:generateContent"),
            ("POST", "/v1beta/cachedContents"),
            ("POST", "/v1/models/g:generateContent:x"),
        ] {
            assert_eq!(r(m, p), Err(NoRoute::Unknown), "{m} {p}");
        }
        assert_eq!(r("GET", "/v1/models"), Ok(Route::Passthrough));
        assert_eq!(r("GET", "/v1/models/ft:gpt-4o:org::x"), Ok(Route::Passthrough));
        assert_eq!(r("POST", "/v1/embeddings"), Ok(Route::Passthrough));
        assert_eq!(
            r("GET", "/v1/responses/resp_1/input_items"),
            Ok(Route::StoredObject { kind: Stored::Response, id: "resp_1".into() })
        );
        assert_eq!(
            r("DELETE", "/v1/conversations/conv_1/items/msg_2"),
            Ok(Route::StoredObject { kind: Stored::Conversation, id: "conv_1".into() })
        );
    }

    #[test]
    fn the_allowlist_cannot_open_stored_objects() {
        let mut allow = PassthroughRule::defaults();
        allow.push(PassthroughRule::parse("GET /v1/**").unwrap());
        let get = |p: &str| route(&Method::GET, &Canonical::parse(p).unwrap(), &allow);
        assert_eq!(get("/v1/files/f1"), Ok(Route::Passthrough));
        assert_eq!(get("/v1/chat/completions"), Err(NoRoute::Listing));
        assert_eq!(get("/v1/responses/x.y"), Err(NoRoute::Unknown));
        assert_eq!(get("/v1/messages/batches"), Err(NoRoute::Unknown));
        allow.push(PassthroughRule::parse("POST /v1/**").unwrap());
        let post = |p: &str| route(&Method::POST, &Canonical::parse(p).unwrap(), &allow);
        assert_eq!(post("/v1/messages/batches"), Err(NoRoute::Unknown));
    }
}
