//! Putting the context message into a chat-completions request.
//!
//! One message, at index 0, marked with `name: "mcp_context"` so that
//! injecting into a request that already carries ours (a conversation
//! replayed turn after turn) replaces it instead of adding a second copy.
//! Every other message — the application's own system prompt, assistant
//! `tool_calls`, `tool` results — is left exactly as it was: resource content
//! never travels in a `tool` message on this path.
//!
//! Layer: the message's place in a request, above composition and below the orchestrator (which calls
//! it). Imports only `compose` (the query from a JSON body) and `mode`.

use async_openai::types::chat::{
    ChatCompletionRequestDeveloperMessage, ChatCompletionRequestMessage, ChatCompletionRequestSystemMessage,
    CreateChatCompletionRequest,
};

use crate::mode::MessageRole;

/// The `name` that marks our message.
pub const MESSAGE_NAME: &str = "mcp_context";

/// Whether a message is one we injected.
pub fn is_context_message(m: &ChatCompletionRequestMessage) -> bool {
    match m {
        ChatCompletionRequestMessage::System(s) => s.name.as_deref() == Some(MESSAGE_NAME),
        ChatCompletionRequestMessage::Developer(d) => d.name.as_deref() == Some(MESSAGE_NAME),
        _ => false,
    }
}

/// Removes any message of ours, then inserts `content` (if any) at index 0.
pub fn inject_message(request: &mut CreateChatCompletionRequest, content: Option<&str>, role: MessageRole) {
    request.messages.retain(|m| !is_context_message(m));
    let Some(content) = content else { return };
    let message: ChatCompletionRequestMessage = match role {
        MessageRole::System => {
            ChatCompletionRequestSystemMessage { content: content.into(), name: Some(MESSAGE_NAME.into()) }.into()
        }
        MessageRole::Developer => {
            ChatCompletionRequestDeveloperMessage { content: content.into(), name: Some(MESSAGE_NAME.into()) }.into()
        }
    };
    request.messages.insert(0, message);
}

/// Whether a JSON chat message is one we injected: role `system` or
/// `developer` and our [`MESSAGE_NAME`], the same test as
/// [`is_context_message`] on the typed request.
pub fn is_context_message_json(m: &serde_json::Value) -> bool {
    matches!(m.get("role").and_then(|r| r.as_str()), Some("system" | "developer"))
        && m.get("name").and_then(|n| n.as_str()) == Some(MESSAGE_NAME)
}

/// [`inject_message`] on a chat-completions body held as generic JSON, for a
/// proxy that must pass every field it does not know through unchanged.
/// Only the `messages` array is touched: any message of ours is removed, then
/// `content` (if any) goes in at index 0. Returns `false`, changing nothing,
/// when the body has no `messages` array.
pub fn inject_message_json(body: &mut serde_json::Value, content: Option<&str>, role: MessageRole) -> bool {
    let Some(messages) = body.get_mut("messages").and_then(|m| m.as_array_mut()) else { return false };
    messages.retain(|m| !is_context_message_json(m));
    if let Some(content) = content {
        let message = serde_json::json!({"role": role.to_string(), "content": content, "name": MESSAGE_NAME});
        messages.insert(0, message);
    }
    true
}

/// Opens our part of Responses `instructions`.
pub const INSTRUCTIONS_OPEN: &str = "<mcp_context>\n";
/// Closes our part of Responses `instructions`; the caller's own follow.
pub const INSTRUCTIONS_CLOSE: &str = "\n</mcp_context>";

/// The Responses API has no message list to put ours in: the context goes
/// into `instructions`, ahead of the caller's own, fenced by
/// [`INSTRUCTIONS_OPEN`] / [`INSTRUCTIONS_CLOSE`] so that injecting again
/// replaces our part instead of stacking a second copy (idempotent, like the
/// chat message). `instructions` is not carried over by
/// `previous_response_id`, so this runs on every request.
pub fn compose_instructions(existing: Option<&str>, content: Option<&str>) -> Option<String> {
    let caller = existing.map(strip_context_instructions).filter(|c| !c.is_empty());
    match (content, caller) {
        (None, caller) => caller.map(str::to_owned),
        (Some(ours), None) => Some(format!("{INSTRUCTIONS_OPEN}{ours}{INSTRUCTIONS_CLOSE}")),
        (Some(ours), Some(caller)) => Some(format!("{INSTRUCTIONS_OPEN}{ours}{INSTRUCTIONS_CLOSE}\n\n{caller}")),
    }
}

/// The caller's part of `instructions`: everything after our fenced part, if
/// the text starts with one.
fn strip_context_instructions(s: &str) -> &str {
    match s.strip_prefix(INSTRUCTIONS_OPEN).and_then(|rest| rest.find(INSTRUCTIONS_CLOSE).map(|i| (rest, i))) {
        Some((rest, i)) => rest[i + INSTRUCTIONS_CLOSE.len()..].trim_start_matches('\n'),
        None => s,
    }
}

/// [`compose_instructions`] on a Responses body held as generic JSON. Only
/// `instructions` is touched (set, replaced, or removed when it would be
/// empty). Returns `false`, changing nothing, when the body is not an object.
pub fn inject_instructions_json(body: &mut serde_json::Value, content: Option<&str>) -> bool {
    let Some(obj) = body.as_object_mut() else { return false };
    let existing = obj.get("instructions").and_then(|i| i.as_str());
    match compose_instructions(existing, content) {
        Some(text) => {
            obj.insert("instructions".into(), serde_json::Value::String(text));
        }
        // Only our own earlier part is removed; a caller's `null` or empty
        // string stays exactly as it was.
        None if existing.is_some_and(|e| e.starts_with(INSTRUCTIONS_OPEN)) => {
            obj.remove("instructions");
        }
        None => {}
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_openai::types::chat::{
        ChatCompletionRequestToolMessage, ChatCompletionRequestUserMessage, CreateChatCompletionRequestArgs,
    };

    fn request() -> CreateChatCompletionRequest {
        CreateChatCompletionRequestArgs::default()
            .model("gpt-4o")
            .messages([
                ChatCompletionRequestSystemMessage::from("app prompt").into(),
                ChatCompletionRequestUserMessage::from("hi").into(),
                ChatCompletionRequestToolMessage { content: "tool out".into(), tool_call_id: "c1".into() }.into(),
            ])
            .build()
            .unwrap()
    }

    #[test]
    fn prepends_once_and_keeps_the_rest() {
        let original = serde_json::to_value(request().messages).unwrap();
        let mut r = request();
        inject_message(&mut r, Some("CTX"), MessageRole::System);
        inject_message(&mut r, Some("CTX2"), MessageRole::System);
        let v = serde_json::to_value(&r.messages).unwrap();
        assert_eq!(v[0], serde_json::json!({"role": "system", "content": "CTX2", "name": "mcp_context"}));
        assert_eq!(v.as_array().unwrap()[1..], original.as_array().unwrap()[..]);
    }

    #[test]
    fn json_sibling_matches_the_typed_injection() {
        let mut typed = request();
        inject_message(&mut typed, Some("CTX"), MessageRole::Developer);
        let mut body = serde_json::to_value(request()).unwrap();
        body["vendor_extension"] = serde_json::json!({"keep": [1, 2]});
        assert!(inject_message_json(&mut body, Some("old"), MessageRole::Developer));
        assert!(inject_message_json(&mut body, Some("CTX"), MessageRole::Developer));
        assert_eq!(body["messages"], serde_json::to_value(&typed.messages).unwrap());
        assert_eq!(body["vendor_extension"], serde_json::json!({"keep": [1, 2]}));
        assert!(inject_message_json(&mut body, None, MessageRole::Developer));
        assert_eq!(body["messages"], serde_json::to_value(request().messages).unwrap());
        assert!(!inject_message_json(&mut serde_json::json!({"input": "x"}), Some("CTX"), MessageRole::System));
    }

    #[test]
    fn instructions_put_ours_first_once_and_keep_the_callers() {
        let once = compose_instructions(Some("Be brief."), Some("CTX")).unwrap();
        assert_eq!(once, "<mcp_context>\nCTX\n</mcp_context>\n\nBe brief.");
        assert_eq!(compose_instructions(Some(&once), Some("CTX2")).unwrap(), once.replace("CTX", "CTX2"));
        assert_eq!(compose_instructions(Some(&once), None).as_deref(), Some("Be brief."));
        assert_eq!(compose_instructions(None, Some("C")).as_deref(), Some("<mcp_context>\nC\n</mcp_context>"));
        assert_eq!(compose_instructions(None, None), None);
        let mut body = serde_json::json!({"input": "hi", "instructions": null, "x": 1});
        inject_instructions_json(&mut body, None);
        assert_eq!(body, serde_json::json!({"input": "hi", "instructions": null, "x": 1}));
        inject_instructions_json(&mut body, Some("C"));
        assert_eq!(body["instructions"], "<mcp_context>\nC\n</mcp_context>");
        inject_instructions_json(&mut body, None);
        assert_eq!(body, serde_json::json!({"input": "hi", "x": 1}));
    }

    #[test]
    fn developer_role_and_removal() {
        let mut r = request();
        inject_message(&mut r, Some("CTX"), MessageRole::Developer);
        assert_eq!(serde_json::to_value(&r.messages[0]).unwrap()["role"], "developer");
        inject_message(&mut r, None, MessageRole::Developer);
        assert_eq!(serde_json::to_value(&r.messages).unwrap(), serde_json::to_value(request().messages).unwrap());
    }

    #[test]
    fn the_latest_user_text_is_the_query_of_a_json_body() {
        use serde_json::json;
        let latest_user_text_json =
            |body: &serde_json::Value| crate::compose::user_texts_json(body).next().map(std::borrow::Cow::into_owned);
        let chat = json!({"messages": [
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "an answer"},
            {"role": "user", "content": [{"type": "text", "text": "second"}, {"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "question"}]},
            {"role": "tool", "content": "tool output", "tool_call_id": "1"}
        ]});
        assert_eq!(latest_user_text_json(&chat).as_deref(), Some("second\nquestion"));
        let blank = json!({"messages": [{"role": "user", "content": "kept"}, {"role": "user", "content": "  "}]});
        assert_eq!(latest_user_text_json(&blank).as_deref(), Some("kept"));
        assert_eq!(latest_user_text_json(&json!({"input": "plain input"})).as_deref(), Some("plain input"));
        let items = json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": "typed"}]}]});
        assert_eq!(latest_user_text_json(&items).as_deref(), Some("typed"));
        assert_eq!(latest_user_text_json(&json!({"messages": [{"role": "system", "content": "s"}]})), None);
    }

    /// The proxy (JSON) and the typed `inject` rank by the same query: the
    /// same turns with the same weights, not only the latest.
    #[test]
    fn the_json_and_typed_queries_are_one() {
        use crate::compose::{EARLIER_TURN_WEIGHT, Query};
        use serde_json::json;
        let body = json!({"model": "m", "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "an answer"},
            {"role": "user", "content": "   "},
            {"role": "user", "content": [{"type": "text", "text": "second"}, {"type": "text", "text": "question"}]},
        ]});
        let typed: async_openai::types::chat::CreateChatCompletionRequest =
            serde_json::from_value(body.clone()).unwrap();
        let from_json = Query::from_chat_json(&body).unwrap();
        assert_eq!(Some(from_json.clone()), Query::from_chat(&typed));
        assert_ne!(from_json, Query::text("second\nquestion"), "earlier turns count too");
        assert!(from_json.key().contains(&format!("{EARLIER_TURN_WEIGHT}\u{0}first question")), "{:?}", from_json);
        assert_eq!(Query::from_chat_json(&json!({"input": "plain"})), Some(Query::text("plain")));
    }
}
