//! Putting the context message into a chat-completions request.
//!
//! One message, at index 0, marked with `name: "mcp_context"` so that
//! injecting into a request that already carries ours (a conversation
//! replayed turn after turn) replaces it instead of adding a second copy.
//! Every other message — the application's own system prompt, assistant
//! `tool_calls`, `tool` results — is left exactly as it was: resource content
//! never travels in a `tool` message on this path.

use async_openai::types::chat::{
    ChatCompletionRequestDeveloperMessage, ChatCompletionRequestMessage, ChatCompletionRequestSystemMessage,
    CreateChatCompletionRequest,
};

use crate::config::MessageRole;

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
    fn developer_role_and_removal() {
        let mut r = request();
        inject_message(&mut r, Some("CTX"), MessageRole::Developer);
        assert_eq!(serde_json::to_value(&r.messages[0]).unwrap()["role"], "developer");
        inject_message(&mut r, None, MessageRole::Developer);
        assert_eq!(serde_json::to_value(&r.messages).unwrap(), serde_json::to_value(request().messages).unwrap());
    }
}
