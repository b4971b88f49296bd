//! OpenAI's two injecting APIs as adapters of the pipeline: Chat
//! Completions (`POST /v1/chat/completions`: ours is the message at index
//! 0, any message of ours the caller carried back is left out) and
//! Responses (`POST /v1/responses`: ours goes ahead of the caller's
//! `instructions`; a `previous_response_id` or `conversation` must be the
//! caller's). Both go to `serve.upstream` with its key, speak OpenAI's error
//! shape, and store what the body asks (`store`). Also the body's `user` /
//! `safety_identifier` as `serve.upstream_user` says, for these routes and
//! the relayed ones.
//!
//! Imports the pipeline's adapter trait, the body, the error shape and the
//! stored kinds.

use std::borrow::Cow;

use crate::settings::{ServeSettings, UpstreamUser};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde_json::value::RawValue;

use super::AppState;
use super::body::{self, Chunks, Item, JsonObject, raw};
use super::error::ApiError;
use super::pipeline::{Adapter, Reading};
use super::relay::Upstream;
use super::routes::Stored;
use crate::ContextMessage;
use crate::compose::UserTurns;

/// Chat Completions.
pub(super) struct Chat;

impl Adapter for Chat {
    /// The caller's messages, but any of ours, as runs of the body's bytes.
    type Plan<'a> = body::Runs<'a>;
    const OPENAI_BODY: bool = true;

    fn upstream<'s>(&'s self, state: &'s AppState, _: &Parts) -> Result<&'s Upstream, ApiError> {
        Ok(&state.upstream)
    }

    /// The turns the question is taken from are read one at a time and never
    /// built (a list of any length costs a few words per run and the query's tail).
    fn read<'a>(&self, obj: &JsonObject<'a>) -> Result<Reading<Self::Plan<'a>>, ApiError> {
        let missing = || ApiError::bad_request("missing_messages", "The body needs a `messages` array");
        let messages = obj.sent("messages").ok_or_else(missing)?;
        let mut turns = UserTurns::default();
        let mut kept = body::Runs::new(messages);
        body::each_item(messages, |m| {
            let ours = is_ours(m);
            if !ours {
                turns.push_json(m.get());
            }
            kept.push(m, !ours);
        })
        .ok_or_else(missing)?;
        Ok(Reading::new(turns.query(), obj.str_field("model"), kept))
    }

    /// Ours first, then the caller's turns. Ours is made once per
    /// composition (escaping it for every request cost more than the rest of
    /// a warm request) and goes into the body as those very bytes, not
    /// copied; the caller's go as slices of the body.
    fn place<'a>(
        &self,
        obj: &mut JsonObject<'a>,
        runs: body::Runs<'a>,
        ours: Option<&ContextMessage>,
    ) -> Result<Chunks, ApiError> {
        let ours = ours.map(|m| Item::Shared(m.chat_json()));
        let theirs = runs.finish().map(|run| Item::Shared(obj.share(run)));
        Ok(obj.to_chunks_with("messages", ours.into_iter().chain(theirs).collect()))
    }

    fn upstream_path(&self) -> Cow<'_, [&str]> {
        Cow::Borrowed(&["chat", "completions"])
    }

    fn upstream_label(&self) -> &'static str {
        "/chat/completions"
    }

    fn stores(&self, obj: &JsonObject<'_>) -> Option<Stored> {
        obj.get("store").is_some_and(|v| v.get() == "true").then_some(Stored::ChatCompletion)
    }

    fn error(&self, e: ApiError) -> Response {
        e.into_response()
    }
}

/// Responses.
pub(super) struct Responses;

impl Adapter for Responses {
    type Plan<'a> = ();
    const OPENAI_BODY: bool = true;

    fn upstream<'s>(&'s self, state: &'s AppState, _: &Parts) -> Result<&'s Upstream, ApiError> {
        Ok(&state.upstream)
    }

    fn read<'a>(&self, obj: &JsonObject<'a>) -> Result<Reading<()>, ApiError> {
        let turns = match obj.sent("input").filter(|i| i.get() != "null") {
            Some(i) if i.get().starts_with('"') => {
                UserTurns::of_text(serde_json::from_str::<String>(i.get()).unwrap_or_default())
            }
            Some(i) => {
                let mut turns = UserTurns::default();
                let _ = body::each_item(i, |item| turns.push_json(item.get()));
                turns
            }
            None => return Err(ApiError::bad_request("missing_input", "The body needs an `input`")),
        };
        let mut reading = Reading::new(turns.query(), obj.str_field("model"), ());
        reading.continues = continuation(obj)?;
        Ok(reading)
    }

    fn place<'a>(&self, obj: &mut JsonObject<'a>, (): (), ours: Option<&ContextMessage>) -> Result<Chunks, ApiError> {
        set_instructions(obj, ours.map(|m| m.content.as_str()))?;
        Ok(obj.to_chunks())
    }

    fn upstream_path(&self) -> Cow<'_, [&str]> {
        Cow::Borrowed(&["responses"])
    }

    fn upstream_label(&self) -> &'static str {
        "/responses"
    }

    fn stores(&self, obj: &JsonObject<'_>) -> Option<Stored> {
        obj.get("store").is_none_or(|v| v.get() != "false").then_some(Stored::Response)
    }

    fn error(&self, e: ApiError) -> Response {
        e.into_response()
    }
}

/// Whether a raw chat message is one we injected (read in place: no field
/// of it is built but a role or name with escapes).
fn is_ours(m: &RawValue) -> bool {
    use crate::compose::MaybeStr;
    #[derive(serde::Deserialize)]
    struct Peek<'a> {
        #[serde(borrow)]
        role: Option<MaybeStr<'a>>,
        #[serde(borrow)]
        name: Option<MaybeStr<'a>>,
    }
    serde_json::from_str::<Peek<'_>>(m.get()).is_ok_and(|p| {
        matches!(p.role.and_then(|r| r.0).as_deref(), Some("system" | "developer"))
            && p.name.and_then(|n| n.0).as_deref() == Some(crate::inject::MESSAGE_NAME)
    })
}

/// Our part of Responses `instructions`, ahead of the caller's string (or
/// alone when the caller sent none or `null`). Instructions that are not a
/// string cannot be merged with ours: refused rather than replaced.
fn set_instructions(obj: &mut JsonObject<'_>, content: Option<&str>) -> Result<(), ApiError> {
    let existing = match obj.get("instructions") {
        None => None,
        Some(v) if v.get() == "null" => None,
        Some(v) => Some(serde_json::from_str::<String>(v.get()).map_err(|_| {
            ApiError::bad_request(
                "unsupported_instructions",
                "`instructions` must be a string (or absent) for the proxy to put the context ahead of it",
            )
        })?),
    };
    let had_field = obj.get("instructions").is_some();
    match crate::inject::compose_instructions(existing.as_deref(), content) {
        Some(text) => obj.set("instructions", raw(&text)),
        // Nothing to say, and the caller's own part was empty or only ours: as it was, or removed.
        None if had_field && existing.as_deref().is_some_and(|e| e.starts_with(crate::inject::INSTRUCTIONS_OPEN)) => {
            obj.remove("instructions")
        }
        None => {}
    }
    Ok(())
}

/// The `previous_response_id` and `conversation` a Responses body continues:
/// each must be the caller's, or the model would see another's turns.
fn continuation(obj: &JsonObject<'_>) -> Result<Vec<(Stored, String)>, ApiError> {
    let mut continues = Vec::new();
    if let Some(id) = obj.parse_field::<Option<String>>("previous_response_id")?.flatten() {
        continues.push((Stored::Response, id));
    }
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Conversation {
        Id(String),
        Object { id: String },
    }
    if let Some(c) = obj.parse_field::<Option<Conversation>>("conversation")?.flatten() {
        let (Conversation::Id(id) | Conversation::Object { id }) = c;
        continues.push((Stored::Conversation, id));
    }
    Ok(continues)
}

/// The body's `user` and `safety_identifier`, when the caller sent them,
/// become what `serve.upstream_user` says: never a name the caller chose.
pub(super) fn name_upstream_user(s: &ServeSettings, obj: &mut JsonObject<'_>, user: &str) {
    for k in ["user", "safety_identifier"] {
        if obj.get(k).is_none() {
            continue;
        }
        match s.upstream_user {
            UpstreamUser::Identified => obj.set(k, raw(user)),
            UpstreamUser::Pseudonym => {
                let key = s.pseudonym_key.as_ref().map_or("", |k| secrecy::ExposeSecret::expose_secret(k));
                obj.set(k, raw(&pseudonym(key, user)))
            }
            UpstreamUser::Drop => obj.remove(k),
        }
    }
}

/// HMAC-SHA256 of the user name under the operator's key, hex: stable per
/// user, not reversible without the key.
pub(super) fn pseudonym(key: &str, user: &str) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).expect("HMAC takes any key");
    mac.update(user.as_bytes());
    mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
}
