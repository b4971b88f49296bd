//! The Anthropic Messages API route (`POST /v1/messages` and
//! `/v1/messages/count_tokens`): who is calling (`x-api-key` or
//! `Authorization: Bearer`, the same `serve.keys`), the caller's context as
//! the last `system` block by the library's rules (`crate::
//! context_block_json`), the request relayed to `serve.anthropic.upstream`
//! with the operator's key as `x-api-key`, and our errors in Anthropic's
//! shape: an adapter of the pipeline. Owns [`Anthropic`] (that upstream)
//! and the error shape; imports the pipeline's adapter trait, the vendor
//! upstream, body, relay and error shape, nothing else of the proxy's.
//!
//! The body is held as raw fields ([`JsonObject`]): only `system` changes,
//! and in it the caller's own blocks keep their bytes; a `system` string
//! becomes `[{"type": "text", "text": <the same string>}, ours]`. The lists
//! the proxy reads (`messages`, `system`, `tools`) are read one item at a
//! time where they lie in the body, never built, and what goes upstream is
//! made of slices of the body: a body costs about its own size.

use std::borrow::Cow;

use crate::breakpoints::{CacheBreakpoints, Tally};
use crate::compose::MaybeStr;
use crate::inject::INSTRUCTIONS_OPEN;
use crate::messages::{context_block_form, context_block_json};
use crate::settings::ServeSettings;
use crate::{ContextMessage, SelectMode};
use axum::http::HeaderMap;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::body::{self, Chunks, Item, JsonObject};
use super::error::ApiError;
use super::pipeline::{Adapter, Reading};
use super::relay::Upstream;
use super::vendor::Vendor;

/// Which Messages endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Endpoint {
    Messages,
    CountTokens,
}

/// The Messages API upstream: its own connection pool and key.
pub(super) struct Anthropic {
    vendor: Vendor,
    select: SelectMode,
}

impl Anthropic {
    /// `None` when `serve.anthropic` is absent (the route then answers 404).
    pub(super) fn new(s: &ServeSettings) -> crate::Result<Option<Self>> {
        let Some(a) = &s.anthropic else { return Ok(None) };
        let vendor = Vendor::new(s, a.upstream.clone(), "x-api-key", a.api_key.as_ref(), "serve.anthropic.api_key")?;
        Ok(Some(Self { vendor, select: a.select }))
    }
}

/// Whether a raw request path is under `/v1/messages` (its refusals then
/// use Anthropic's error shape).
pub(super) fn claims(path: &str) -> bool {
    path == "/v1/messages" || path.starts_with("/v1/messages/") || path.starts_with("/v1/messages%")
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

/// One Messages request: the API as configured (`None`: off), and which endpoint.
pub(super) struct Messages<'s> {
    pub(super) api: Option<&'s Anthropic>,
    pub(super) endpoint: Endpoint,
}

impl Messages<'_> {
    fn api(&self) -> Result<&Anthropic, ApiError> {
        self.api.ok_or_else(|| super::vendor::not_enabled("The Messages API", "serve.anthropic"))
    }
}

/// What reading a Messages body learnt: the caller's own system blocks (each
/// as sent; a string is one text block of the same string), whether the
/// system was a string and whether a block of ours was left out, and the
/// breakpoints the rest of the request uses.
pub(super) struct SystemPlan {
    kept: Vec<Item>,
    was_string: bool,
    dropped: bool,
    others: CacheBreakpoints,
}

impl Adapter for Messages<'_> {
    type Plan<'a> = SystemPlan;

    fn upstream<'s>(&'s self, _: &'s AppState, _: &Parts) -> Result<&'s Upstream, ApiError> {
        Ok(&self.api()?.vendor.upstream)
    }

    fn identity_headers<'h>(&self, headers: &'h HeaderMap) -> Result<Cow<'h, HeaderMap>, ApiError> {
        self.api()?.vendor.identity_headers(headers)
    }

    fn identity_refusal(&self, e: ApiError) -> ApiError {
        match self.api {
            Some(a) => a.vendor.identity_refusal(e),
            None => e,
        }
    }

    /// `messages`, `system` and `tools` are read one item at a time, in place
    /// (never built as trees): the breakpoints they use, the user turns, and
    /// the caller's system blocks as slices of the body.
    fn read<'a>(&self, obj: &JsonObject<'a>) -> Result<Reading<SystemPlan>, ApiError> {
        let anthropic = self.api()?;
        let missing = || ApiError::bad_request("missing_messages", "The body needs a `messages` array");
        let messages = obj.sent("messages").filter(|m| m.get().starts_with('[')).ok_or_else(missing)?;
        let bad_system = || {
            ApiError::bad_request("invalid_system", "`system` must be a string or a list of content blocks (or absent)")
        };
        // The top-level breakpoint marks the request's last block (after ours): its TTL binds ours.
        let top = obj
            .get("cache_control")
            .and_then(|c| crate::breakpoints::mark(&mut serde_json::Deserializer::from_str(c.get())));
        let mut tally = Tally::new(top);
        if let Some(tools) = obj.sent("tools") {
            let _ = body::each_item(tools, |t| tally.tool(&mut serde_json::Deserializer::from_str(t.get())));
        }
        let mut kept: Vec<Item> = Vec::new();
        let (mut was_string, mut dropped) = (false, false);
        match obj.sent("system") {
            None => {}
            Some(v) if v.get() == "null" => {}
            Some(v) if v.get().starts_with('"') => {
                was_string = true;
                let text =
                    serde_json::from_str::<MaybeStr<'_>>(v.get()).map_err(|_| bad_system())?.0.unwrap_or_default();
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
        let plan = SystemPlan { kept, was_string, dropped, others: tally.finish() };
        let mut reading = Reading::new(turns.and_then(|t| t.query()), obj.str_field("model"), plan);
        reading.select = Some(anthropic.select);
        Ok(reading)
    }

    /// Ours last in `system`, made once per composition and breakpoint form,
    /// going into the body as those very bytes (as the chat message does);
    /// the caller's kept blocks go as slices of the body.
    fn place<'a>(
        &self,
        obj: &mut JsonObject<'a>,
        plan: SystemPlan,
        ours: Option<&ContextMessage>,
    ) -> Result<Chunks, ApiError> {
        let SystemPlan { kept, was_string, dropped, others } = plan;
        let ours = ours.map(|m| {
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
        Ok(match system {
            Some(items) => obj.to_chunks_with("system", items),
            None => obj.to_chunks(),
        })
    }

    fn upstream_path(&self) -> Cow<'_, [&str]> {
        Cow::Borrowed(match self.endpoint {
            Endpoint::Messages => &["messages"],
            Endpoint::CountTokens => &["messages", "count_tokens"],
        })
    }

    fn upstream_label(&self) -> &'static str {
        match self.endpoint {
            Endpoint::Messages => "/messages",
            Endpoint::CountTokens => "/messages/count_tokens",
        }
    }

    fn credentials(&self, incoming: &HeaderMap, out: &mut HeaderMap) {
        if let Some(a) = self.api {
            a.vendor.credentials(incoming, out);
        }
    }

    fn error(&self, e: ApiError) -> Response {
        error_response(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
