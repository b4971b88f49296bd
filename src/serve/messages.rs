//! The Anthropic Messages API route (`POST /v1/messages` and
//! `/v1/messages/count_tokens`): who is calling (`x-api-key` or
//! `Authorization: Bearer`, the same `serve.keys`), the caller's context as
//! the last `system` block by the library's rules (`crate::
//! context_block_json`), the request relayed to `serve.anthropic.upstream`
//! with the operator's key as `x-api-key`, and our errors in Anthropic's
//! shape. Owns [`Anthropic`] (that upstream) and the error shape; imports
//! the proxy's state, identity, body, relay and report header, nothing else
//! of the proxy's.
//!
//! The body is held as raw fields ([`JsonObject`]): only `system` changes,
//! and in it the caller's own blocks keep their bytes; a `system` string
//! becomes `[{"type": "text", "text": <the same string>}, ours]`. The lists
//! the proxy reads (`messages`, `system`, `tools`) are read one item at a
//! time where they lie in the body, never built, and what goes upstream is
//! made of slices of the body: a body costs about its own size.

use std::time::Instant;

use crate::breakpoints::Tally;
use crate::compose::MaybeStr;
use crate::inject::INSTRUCTIONS_OPEN;
use crate::messages::{context_block_form, context_block_json};
use crate::settings::ServeSettings;
use crate::{ContextRequest, SelectMode};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};

use super::Shared;
use super::body::{self, Item, JsonObject};
use super::error::ApiError;
use super::identity::{self, FromHeaders};
use super::relay::{Outgoing, Upstream};

const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// Which Messages endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Endpoint {
    Messages,
    CountTokens,
}

impl Endpoint {
    fn path(self) -> &'static [&'static str] {
        match self {
            Endpoint::Messages => &["messages"],
            Endpoint::CountTokens => &["messages", "count_tokens"],
        }
    }
}

/// The Messages API upstream: its own connection pool and key.
pub(super) struct Anthropic {
    upstream: Upstream,
    api_key: Option<HeaderValue>,
    forward: bool,
    select: SelectMode,
}

impl Anthropic {
    /// `None` when `serve.anthropic` is absent (the route then answers 404).
    pub(super) fn new(s: &ServeSettings) -> crate::Result<Option<Self>> {
        let Some(a) = &s.anthropic else { return Ok(None) };
        // The shared relay sends no credentials of its own here: ours go in
        // `x-api-key`, set per request below.
        let relay_settings = ServeSettings { upstream_api_key: None, ..s.clone() };
        let upstream = Upstream::new(&relay_settings, a.upstream.clone())?;
        let api_key = a
            .api_key
            .as_ref()
            .map(|k| HeaderValue::from_str(secrecy::ExposeSecret::expose_secret(k)))
            .transpose()
            .map_err(|_| crate::Error::serve("serve.anthropic.api_key holds characters an HTTP header cannot carry"))?
            .map(|mut v| {
                v.set_sensitive(true);
                v
            });
        Ok(Some(Self { upstream, api_key, forward: s.forward_authorization, select: a.select }))
    }
}

/// Whether a raw request path is under `/v1/messages` (its refusals then
/// use Anthropic's error shape).
pub(super) fn claims(path: &str) -> bool {
    path == "/v1/messages" || path.starts_with("/v1/messages/") || path.starts_with("/v1/messages%")
}

/// One Messages request, answered: the upstream's response, or our error in Anthropic's shape.
pub(super) async fn handle(state: &Shared, req: Request, endpoint: Endpoint) -> Response {
    match forward(state, req, endpoint).await {
        Ok(r) => r,
        Err(e) => error_response(e),
    }
}

/// Our error as Anthropic's API writes its own: `{"type": "error", "error": {"type", "message"}}`.
pub(super) fn error_response(e: ApiError) -> Response {
    let kind = match e.status.as_u16() {
        400 | 415 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        408 | 504 => "timeout_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        _ => "api_error",
    };
    let body = serde_json::json!({"type": "error", "error": {"type": kind, "message": e.message}});
    (e.status, axum::Json(body)).into_response()
}

/// The caller's headers as the identity chain reads them: an `x-api-key`
/// becomes the bearer key it stands for. Two different keys, or a key sent
/// twice, are refused rather than one of them chosen.
fn identity_headers(headers: &HeaderMap) -> Result<std::borrow::Cow<'_, HeaderMap>, ApiError> {
    let keys: Vec<_> = headers.get_all(&X_API_KEY).iter().collect();
    let refuse = |m: &str| ApiError::unauthorized("invalid_api_key", m);
    match keys.as_slice() {
        [] => Ok(std::borrow::Cow::Borrowed(headers)),
        [key] => {
            let key = key.to_str().ok().map(str::trim).filter(|k| !k.is_empty() && !k.contains([' ', '\t']));
            let key = key.ok_or_else(|| refuse("The `x-api-key` header is not a key; send `x-api-key: KEY`"))?;
            if headers.contains_key(header::AUTHORIZATION) {
                return match identity::bearer(headers) {
                    Some(b) if b == key => Ok(std::borrow::Cow::Borrowed(headers)),
                    _ => Err(refuse(
                        "`x-api-key` and `Authorization` name different keys; send one of them (or the same key in both)",
                    )),
                };
            }
            let mut h = headers.clone();
            let bearer = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| refuse("bad x-api-key"))?;
            h.insert(header::AUTHORIZATION, bearer);
            Ok(std::borrow::Cow::Owned(h))
        }
        _ => Err(refuse("Send one `x-api-key` header, not several")),
    }
}

/// An identity refusal, told the way a Messages caller sends its key.
fn for_messages_callers(mut e: ApiError) -> ApiError {
    if e.status == 401 {
        e.message =
            e.message.replace("`Authorization: Bearer KEY`", "`x-api-key: KEY` (or `Authorization: Bearer KEY`)");
    }
    e
}

/// Identifies the caller from the headers (before any body is read), reads
/// the body within its limits, puts the context last in `system`, forwards
/// with the operator's key and relays the answer as it arrives.
async fn forward(state: &Shared, req: Request, endpoint: Endpoint) -> Result<Response, ApiError> {
    let Some(anthropic) = &state.anthropic else {
        return Err(ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "invalid_request_error",
            "unknown_url",
            "The Messages API is not enabled on this proxy: its operator has to add `serve.anthropic` \
             (upstream and api_key) to the config",
        ));
    };
    let (parts, body) = req.into_parts();
    let s = &state.settings;
    let headers = identity_headers(&parts.headers)?;
    let (who, budgets) = super::caller(state, &headers).await.map_err(for_messages_callers)?;
    drop(headers);
    let who = match who {
        FromHeaders::User(who) => who,
        // The Messages API has no `user` field: anonymous_user, else 401.
        FromHeaders::Body => identity::from_body(s, None).map_err(for_messages_callers)?,
    };
    let prepared = match &state.flows {
        Some(f) => f.prepare(&who).await,
        None => crate::credentials::Prepared::default(),
    };
    let user = who.user.clone();
    let read = body::read(&parts.headers, body, s.max_body_bytes, s.body_timeout, &budgets).await?;
    let mut obj = JsonObject::parse(&read.bytes, s.max_body_fields)?;

    // `messages`, `system` and `tools` are read one item at a time, in place (never built as trees): the
    // breakpoints they use, the user turns, and the caller's system blocks as slices of the body.
    let missing = || ApiError::bad_request("missing_messages", "The body needs a `messages` array");
    let messages = obj.sent("messages").filter(|m| m.get().starts_with('[')).ok_or_else(missing)?;
    let bad_system =
        || ApiError::bad_request("invalid_system", "`system` must be a string or a list of content blocks (or absent)");
    // The top-level breakpoint marks the request's last block (after ours): its TTL binds ours.
    let top = obj
        .get("cache_control")
        .and_then(|c| crate::breakpoints::mark(&mut serde_json::Deserializer::from_str(c.get())));
    let mut tally = Tally::new(top);
    if let Some(tools) = obj.sent("tools") {
        let _ = body::each_item(tools, |t| tally.tool(&mut serde_json::Deserializer::from_str(t.get())));
    }
    // The caller's own system blocks, each as sent; a string is one text block of the same string.
    let mut kept: Vec<Item> = Vec::new();
    let (mut was_string, mut dropped) = (false, false);
    match obj.sent("system") {
        None => {}
        Some(v) if v.get() == "null" => {}
        Some(v) if v.get().starts_with('"') => {
            was_string = true;
            let text = serde_json::from_str::<MaybeStr<'_>>(v.get()).map_err(|_| bad_system())?.0.unwrap_or_default();
            if text.starts_with(INSTRUCTIONS_OPEN) {
                dropped = true;
            } else if !text.is_empty() {
                kept.push(Item::TextBlock(obj.share(v.get())));
            }
        }
        Some(v) => {
            let mut runs = body::Runs::new(v);
            body::each_item(v, |b| {
                // A block of ours (replayed history, or forged) never goes on.
                let ours = tally.system_block(&mut serde_json::Deserializer::from_str(b.get()));
                runs.push(b, !ours);
            })
            .ok_or_else(bad_system)?;
            dropped = !runs.all_kept();
            kept.extend(runs.finish().map(|run| Item::Shared(obj.share(run))));
        }
    }
    // Priority mode does not rank: no query, so the same user's next turn
    // is answered from the warm memo.
    let mut turns = (anthropic.select != SelectMode::Priority).then(crate::compose::UserTurns::default);
    body::each_item(messages, |m| {
        tally.message(&mut serde_json::Deserializer::from_str(m.get()));
        if let Some(t) = &mut turns {
            t.push_json(m.get());
        }
    })
    .ok_or_else(missing)?;
    let others = tally.finish();
    let query = turns.and_then(|t| t.query());

    let started = Instant::now();
    let mut request = ContextRequest::for_user(user.clone()).with_identity(&who);
    request.model = obj.str_field("model").filter(|m| !m.is_empty());
    request.select = Some(anthropic.select);
    let (message, mut report) = state.ctx.build_unaudited(&request, query).await.map_err(|e| {
        tracing::error!(user = ?request.user, "context could not be built: {e}");
        ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "context_failed",
            format!("The context could not be built: {e}"),
        )
    })?;
    prepared.note(&mut report);
    let route = match endpoint {
        Endpoint::Messages => "/v1/messages",
        Endpoint::CountTokens => "/v1/messages/count_tokens",
    };
    let ids = parts.extensions.get::<super::audit::Ids>();
    let pending = super::audit::begin(&state.ctx, ids, route, who.source, &report, message.as_ref());
    // Ours is made once per composition and breakpoint form, and goes into the body as those very bytes (as the
    // chat message does); the caller's kept blocks go as slices of the body.
    let ours = message.as_ref().map(|m| {
        let form = context_block_form(others);
        m.json_form(form, |m| serde_json::to_vec(&context_block_json(&m.content, others)).expect("JSON"))
    });
    let system = match ours {
        Some(ours) => Some(kept.into_iter().chain([Item::Shared(ours)]).collect()),
        None if was_string && !dropped => None,
        None if kept.is_empty() => {
            obj.remove("system");
            None
        }
        None => Some(kept),
    };
    state.metrics.injection(&report, started.elapsed().as_secs_f64());
    if let Some(f) = &state.flows {
        f.after_refusals(&user, &report).await;
    }
    tracing::info!(report = %serde_json::to_string(&report).unwrap_or_default(), "injected");
    let forwarded = match system {
        Some(items) => reqwest::Body::wrap(obj.to_chunks_with("system", items)),
        None => reqwest::Body::wrap(obj.to_chunks()),
    };
    drop(obj);

    let mut headers = anthropic.upstream.headers_for_upstream(&parts.headers);
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    super::audit::Ids::propagate(ids, &mut headers);
    if anthropic.forward {
        // The upstream authenticates the caller with the caller's own header.
        if let Some(k) = parts.headers.get(&X_API_KEY) {
            headers.insert(X_API_KEY, k.clone());
        }
    } else if let Some(k) = &anthropic.api_key {
        headers.insert(X_API_KEY, k.clone());
    }
    let relayed = anthropic
        .upstream
        .send(Outgoing {
            method: Method::POST,
            path: endpoint.path(),
            query: parts.uri.query(),
            headers,
            body: forwarded,
        })
        .await;
    pending.finish(&state.ctx, relayed.as_ref());
    let relayed = relayed?;
    drop(read);
    let label = match endpoint {
        Endpoint::Messages => "/messages",
        Endpoint::CountTokens => "/messages/count_tokens",
    };
    state.metrics.upstream(label, relayed.waited.as_secs_f64());
    let mut response = relayed.response;
    super::status::report_headers(&mut response, &report);
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        m
    }

    #[test]
    fn x_api_key_stands_for_the_bearer_and_two_keys_are_refused() {
        let sent = h(&[("x-api-key", "k1")]);
        let got = identity_headers(&sent).unwrap();
        assert_eq!(identity::bearer(&got), Some("k1"));
        assert!(identity_headers(&h(&[("x-api-key", "k1"), ("authorization", "Bearer k1")])).is_ok());
        for bad in [
            h(&[("x-api-key", "k1"), ("authorization", "Bearer k2")]),
            h(&[("x-api-key", "k1"), ("x-api-key", "k1")]),
            h(&[("x-api-key", "a b")]),
            h(&[("x-api-key", "")]),
        ] {
            assert_eq!(identity_headers(&bad).unwrap_err().status, 401, "{bad:?}");
        }
        let none = h(&[]);
        assert!(identity::bearer(&identity_headers(&none).unwrap()).is_none());
    }

    #[test]
    fn only_paths_under_messages_are_claimed() {
        for p in ["/v1/messages", "/v1/messages/count_tokens", "/v1/messages/../x", "/v1/messages%2fx"] {
            assert!(claims(p), "{p}");
        }
        for p in ["/v1/messagesx", "/v1/chat/completions", "/"] {
            assert!(!claims(p), "{p}");
        }
    }
}
