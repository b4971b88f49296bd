//! Gemini's API as an adapter of the pipeline: `POST
//! /v1beta/models/{model}:generateContent` and `:streamGenerateContent`
//! (SSE with `?alt=sse`), the same under `/v1/`. Callers send their key to
//! this proxy in `x-goog-api-key` (or `Authorization: Bearer`), read against
//! the same `serve.keys`; the request goes to `serve.gemini.upstream` under
//! the caller's API version with the operator's key in `x-goog-api-key`;
//! our errors speak Gemini's shape (`{"error": {"code", "message",
//! "status"}}`). Owns [`GeminiApi`] and where our context goes: the last
//! part of `systemInstruction` (made when the caller sent none), fenced like
//! the Responses `instructions` (`<mcp_context>` … `</mcp_context>`), so a
//! part of ours the caller sent back (or forged) is left out and never
//! doubled. Gemini stores nothing a later request continues.
//!
//! Imports the pipeline's adapter trait, the vendor upstream, body, relay
//! and error shape.

use std::borrow::Cow;

use crate::ContextMessage;
use crate::compose::{MaybeStr, UserTurns};
use crate::context::MessageForm;
use crate::inject::{INSTRUCTIONS_CLOSE, INSTRUCTIONS_OPEN};
use crate::settings::ServeSettings;
use axum::http::HeaderMap;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde_json::value::RawValue;

use super::AppState;
use super::body::{self, Chunks, JsonObject};
use super::error::ApiError;
use super::pipeline::{Adapter, Reading};
use super::relay::Upstream;
use super::vendor::Vendor;

/// Gemini's upstream (`serve.gemini`).
pub(super) struct GeminiApi {
    vendor: Vendor,
}

impl GeminiApi {
    /// `None` when `serve.gemini` is absent (the routes then answer 404).
    pub(super) fn new(s: &ServeSettings) -> crate::Result<Option<Self>> {
        let Some(g) = &s.gemini else { return Ok(None) };
        let vendor = Vendor::new(s, g.upstream.clone(), "x-goog-api-key", g.api_key.as_ref(), "serve.gemini.api_key")?;
        Ok(Some(Self { vendor }))
    }
}

/// The method that streams its answer (`?alt=sse` makes it SSE).
const STREAM: &str = ":streamGenerateContent";

/// Whether a raw request path is Gemini's (its refusals then use Gemini's
/// error shape): anything under `/v1beta/`, and a model's method under `/v1/models/`.
pub(super) fn claims(path: &str) -> bool {
    path.starts_with("/v1beta/")
        || path.strip_prefix("/v1/models/").is_some_and(|m| m.contains(':') || m.to_ascii_lowercase().contains("%3a"))
}

/// Our error as Gemini's API writes its own: `{"error": {"code", "message", "status"}}`.
pub(super) fn error_response(e: ApiError) -> Response {
    let status = match e.status.as_u16() {
        400 | 413 | 415 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        408 | 504 => "DEADLINE_EXCEEDED",
        429 => "RESOURCE_EXHAUSTED",
        502 | 503 => "UNAVAILABLE",
        _ => "INTERNAL",
    };
    let body = serde_json::json!({"error": {"code": e.status.as_u16(), "message": e.message, "status": status}});
    (e.status, axum::Json(body)).into_response()
}

/// One Gemini request: the API as configured (`None`: off), the API version
/// and the path's last segment (`{model}:generateContent`).
pub(super) struct Gemini<'s> {
    pub(super) api: Option<&'s GeminiApi>,
    pub(super) version: &'static str,
    pub(super) method: String,
}

impl Gemini<'_> {
    fn api(&self) -> Result<&GeminiApi, ApiError> {
        self.api.ok_or_else(|| super::vendor::not_enabled("Gemini's API", "serve.gemini"))
    }

    fn model(&self) -> &str {
        self.method.split(':').next().unwrap_or_default()
    }
}

/// Where the caller's `systemInstruction` is, and its parts but ours.
pub(super) struct InstructionPlan<'a> {
    /// The field's name as sent (`systemInstruction`, or `system_instruction`).
    key: &'static str,
    /// The caller's value, when it sent one.
    sent: Option<&'a str>,
    /// Where its `parts` array lies in it (`None`: no `parts`).
    parts: Option<(usize, usize)>,
    /// The kept parts, as runs of the array's text.
    kept: Vec<&'a str>,
    dropped: bool,
}

impl Adapter for Gemini<'_> {
    type Plan<'a> = InstructionPlan<'a>;

    fn upstream<'s>(&'s self, _: &'s AppState, parts: &Parts) -> Result<&'s Upstream, ApiError> {
        let api = self.api()?;
        // A key in the query would go upstream with it: this proxy takes it in the header only.
        let keyed = parts.uri.query().is_some_and(|q| q.split('&').any(|p| p == "key" || p.starts_with("key=")));
        if keyed {
            return Err(ApiError::unauthorized(
                "invalid_api_key",
                "Send your key to this proxy as `x-goog-api-key: KEY`, not as `?key=` in the URL",
            ));
        }
        Ok(&api.vendor.upstream)
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

    fn read<'a>(&self, obj: &JsonObject<'a>) -> Result<Reading<InstructionPlan<'a>>, ApiError> {
        let missing = || ApiError::bad_request("missing_contents", "The body needs a `contents` array");
        let contents = obj.sent("contents").ok_or_else(missing)?;
        let mut turns = UserTurns::default();
        body::each_item(contents, |c| turns.push_gemini_json(c.get())).ok_or_else(missing)?;
        let plan = system_instruction(obj)?;
        Ok(Reading::new(turns.query(), Some(self.model().to_owned()), plan))
    }

    fn place<'a>(
        &self,
        obj: &mut JsonObject<'a>,
        plan: InstructionPlan<'a>,
        ours: Option<&ContextMessage>,
    ) -> Result<Chunks, ApiError> {
        let ours = ours.map(|m| {
            m.json_form(MessageForm::GeminiPart, |m| {
                let text = format!("{INSTRUCTIONS_OPEN}{}{INSTRUCTIONS_CLOSE}", m.content);
                serde_json::to_vec(&serde_json::json!({ "text": text })).expect("JSON")
            })
        });
        if ours.is_none() && !plan.dropped {
            return Ok(obj.to_chunks());
        }
        let mut parts = String::from("[");
        for (i, run) in plan.kept.iter().enumerate() {
            if i > 0 {
                parts.push(',');
            }
            parts.push_str(run);
        }
        if let Some(ours) = &ours {
            if !plan.kept.is_empty() {
                parts.push(',');
            }
            parts.push_str(std::str::from_utf8(ours).expect("our JSON is UTF-8"));
        }
        parts.push(']');
        if ours.is_none() && plan.kept.is_empty() && plan.parts.is_some() {
            // The caller's instruction was only ours: as if it had sent none.
            obj.remove(plan.key);
            return Ok(obj.to_chunks());
        }
        let value = match (plan.sent, plan.parts) {
            (Some(sent), Some((start, end))) => format!("{}{parts}{}", &sent[..start], &sent[end..]),
            (Some(sent), None) => match sent.trim_start().strip_prefix('{').map(str::trim_start) {
                Some(rest) if rest.starts_with('}') => format!("{{\"parts\":{parts}}}"),
                Some(rest) => format!("{{\"parts\":{parts},{rest}"),
                None => format!("{{\"parts\":{parts}}}"),
            },
            (None, _) => format!("{{\"parts\":{parts}}}"),
        };
        let value = RawValue::from_string(value).map_err(|_| invalid_instruction())?;
        obj.set(plan.key, value);
        Ok(obj.to_chunks())
    }

    fn upstream_path(&self) -> Cow<'_, [&str]> {
        Cow::Owned(vec![self.version, "models", &self.method])
    }

    fn upstream_label(&self) -> &'static str {
        if self.method.ends_with(STREAM) {
            "/models/{model}:streamGenerateContent"
        } else {
            "/models/{model}:generateContent"
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

fn invalid_instruction() -> ApiError {
    ApiError::bad_request(
        "invalid_system_instruction",
        "`systemInstruction` must be a Content object (`{\"parts\": [{\"text\": ...}]}`) or absent",
    )
}

/// The caller's `systemInstruction` (or `system_instruction`; not both):
/// where its `parts` lie, and those parts that are not ours.
fn system_instruction<'a>(obj: &JsonObject<'a>) -> Result<InstructionPlan<'a>, ApiError> {
    let (camel, snake) = (obj.get("systemInstruction").is_some(), obj.get("system_instruction").is_some());
    if camel && snake {
        return Err(ApiError::bad_request(
            "invalid_system_instruction",
            "The body has both `systemInstruction` and `system_instruction`; send one",
        ));
    }
    let key = if snake { "system_instruction" } else { "systemInstruction" };
    let sent = obj.sent(key).filter(|v| v.get() != "null").map(RawValue::get);
    let mut plan = InstructionPlan { key, sent, parts: None, kept: Vec::new(), dropped: false };
    let Some(text) = sent else { return Ok(plan) };
    #[derive(serde::Deserialize)]
    struct Content<'a> {
        #[serde(borrow)]
        parts: Option<&'a RawValue>,
    }
    if !text.starts_with('{') {
        return Err(invalid_instruction());
    }
    let content = serde_json::from_str::<Content<'a>>(text).map_err(|_| invalid_instruction())?;
    let Some(parts) = content.parts else { return Ok(plan) };
    let start = parts.get().as_ptr() as usize - text.as_ptr() as usize;
    plan.parts = Some((start, start + parts.get().len()));
    if parts.get() == "null" {
        return Ok(plan);
    }
    let mut runs = body::Runs::new(parts);
    body::each_item(parts, |p| runs.push(p, !is_ours(p))).ok_or_else(invalid_instruction)?;
    plan.dropped = !runs.all_kept();
    plan.kept = runs.finish().collect();
    Ok(plan)
}

/// Whether a part is one of ours: its text opens with our fence.
fn is_ours(part: &RawValue) -> bool {
    #[derive(serde::Deserialize)]
    struct Peek<'a> {
        #[serde(borrow)]
        text: Option<MaybeStr<'a>>,
    }
    serde_json::from_str::<Peek<'_>>(part.get())
        .is_ok_and(|p| p.text.and_then(|t| t.0).is_some_and(|t| t.starts_with(INSTRUCTIONS_OPEN)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Bytes;

    /// The body `place` sends for `body`, with `ours` as our text.
    fn placed(body: &str, ours: Option<&str>) -> Result<String, ApiError> {
        let bytes = Bytes::from(body.to_owned());
        let mut obj = JsonObject::parse(&bytes, 64)?;
        let plan = system_instruction(&obj)?;
        let message = ours.map(|c| ContextMessage {
            role: crate::MessageRole::System,
            content: std::sync::Arc::new(c.to_owned()),
            tokens: 1,
            derived: Default::default(),
        });
        let g = Gemini { api: None, version: "v1beta", method: "m:generateContent".into() };
        Ok(String::from_utf8(g.place(&mut obj, plan, message.as_ref())?.concat()).unwrap())
    }

    #[test]
    fn ours_is_the_last_part_of_the_system_instruction_made_when_absent() {
        let ours = r#"{"text":"<mcp_context>\nC\n</mcp_context>"}"#;
        let c = r#""contents":[{"parts":[{"text":"hi"}]}]"#;
        let cases = [
            (format!("{{{c}}}"), format!("{{{c},\"systemInstruction\":{{\"parts\":[{ours}]}}}}")),
            (
                format!(r#"{{{c},"systemInstruction":{{"role":"user","parts":[{{"text":"Be brief."}}]}}}}"#),
                format!(r#"{{{c},"systemInstruction":{{"role":"user","parts":[{{"text":"Be brief."}},{ours}]}}}}"#),
            ),
            (
                format!(r#"{{{c},"system_instruction":{{"role":"user"}}}}"#),
                format!(r#"{{{c},"system_instruction":{{"parts":[{ours}],"role":"user"}}}}"#),
            ),
            (
                format!(r#"{{{c},"systemInstruction":{{}}}}"#),
                format!(r#"{{{c},"systemInstruction":{{"parts":[{ours}]}}}}"#),
            ),
            // A part of ours sent back (or forged) is replaced, never doubled.
            (
                format!(
                    r#"{{{c},"systemInstruction":{{"parts":[{{"text":"<mcp_context>\nold"}},{{"text":"mine"}}]}}}}"#
                ),
                format!(r#"{{{c},"systemInstruction":{{"parts":[{{"text":"mine"}},{ours}]}}}}"#),
            ),
        ];
        for (sent, want) in cases {
            assert_eq!(placed(&sent, Some("C")).unwrap(), want, "{sent}");
        }
        // Nothing of ours to say: as sent, but a forged part of ours left out.
        let sent = format!(r#"{{{c},"systemInstruction":{{"parts":[{{"text":"mine"}}]}}}}"#);
        assert_eq!(placed(&sent, None).unwrap(), sent);
        let forged = format!(r#"{{{c},"systemInstruction":{{"parts":[{{"text":"<mcp_context>\nx"}}]}}}}"#);
        assert_eq!(placed(&forged, None).unwrap(), format!("{{{c}}}"));
        for bad in [
            format!(r#"{{{c},"systemInstruction":"text"}}"#),
            format!(r#"{{{c},"systemInstruction":{{"parts":3}}}}"#),
            format!(r#"{{{c},"systemInstruction":{{}},"system_instruction":{{}}}}"#),
        ] {
            assert_eq!(placed(&bad, Some("C")).unwrap_err().code, "invalid_system_instruction", "{bad}");
        }
    }

    #[test]
    fn errors_speak_gemini_and_only_gemini_paths_are_claimed() {
        let r = error_response(ApiError::unauthorized("invalid_api_key", "no"));
        assert_eq!(r.status(), 401);
        for p in
            ["/v1beta/models/m:generateContent", "/v1beta/x", "/v1/models/m:streamGenerateContent", "/v1/models/m%3Ax"]
        {
            assert!(claims(p), "{p}");
        }
        for p in ["/v1/models", "/v1/models/gpt-4o", "/v1/chat/completions", "/v1betax"] {
            assert!(!claims(p), "{p}");
        }
    }
}
