//! The injection path over the wire: a real local OpenAI-compatible server
//! records what `ContextClient` actually sent.

use std::sync::Arc;

use async_openai::types::chat::{
    ChatCompletionMessageToolCall, ChatCompletionMessageToolCalls, ChatCompletionRequestAssistantMessage,
    ChatCompletionRequestSystemMessage, ChatCompletionRequestToolMessage, ChatCompletionRequestUserMessage,
    CreateChatCompletionRequest, CreateChatCompletionRequestArgs, FunctionCall,
};
use futures::StreamExt;
use mcp_context::{ContextClient, ContextRequest, McpContext, Policy, ResourceId};
use serde_json::json;

use crate::common::*;

fn conversation() -> CreateChatCompletionRequest {
    #[allow(deprecated)]
    let assistant = ChatCompletionRequestAssistantMessage {
        tool_calls: Some(vec![ChatCompletionMessageToolCalls::Function(ChatCompletionMessageToolCall {
            id: "call_1".into(),
            function: FunctionCall { name: "get_weather".into(), arguments: "{\"city\":\"Oslo\"}".into() },
        })]),
        ..Default::default()
    };
    CreateChatCompletionRequestArgs::default()
        .model("gpt-4o")
        .messages([
            ChatCompletionRequestSystemMessage::from("You are the Acme assistant.").into(),
            ChatCompletionRequestUserMessage::from("weather?").into(),
            assistant.into(),
            ChatCompletionRequestToolMessage { content: "sunny".into(), tool_call_id: "call_1".into() }.into(),
            ChatCompletionRequestUserMessage::from("and how do I share a note?").into(),
        ])
        .build()
        .unwrap()
}

async fn demo_context(t: &str) -> Arc<McpContext> {
    let yaml =
        format!("servers:\n{}policy: {:?}\ncontext:\n  max_tokens: 4000\n", demo_server("demo", t), policies_dir());
    Arc::new(McpContext::from_config(&config(&yaml)).await.unwrap())
}

#[tokio::test]
async fn create_sends_our_message_first_and_everything_else_untouched() {
    let t = tag();
    let llm = FakeLlm::start(Reply::Text("Use n share.".into())).await;
    let ctx = demo_context(&t).await;
    let client = ContextClient::new(llm.client(), ctx.clone());
    let (resp, report) = client.create(conversation(), "alice").await.unwrap();
    assert_eq!(resp.choices[0].message.content.as_deref(), Some("Use n share."));
    let sent = &llm.requests()[0];
    let messages = sent["messages"].as_array().unwrap();
    assert_eq!(messages[0]["role"], "system");
    assert_eq!(messages[0]["name"], "mcp_context");
    let content = messages[0]["content"].as_str().unwrap();
    assert!(content.starts_with("The following resources are reference data"));
    assert!(content.contains("<resource id=\"demo:demo://docs/guide\""));
    assert!(!content.contains("91000"));
    let bpe = tiktoken_rs::o200k_base_singleton();
    assert_eq!(report.tokens, bpe.encode_ordinary(content).len());
    // Every original message follows, byte for byte.
    let original = serde_json::to_value(&conversation().messages).unwrap();
    assert_eq!(&messages[1..], original.as_array().unwrap().as_slice());
    // Tool messages were not used for resources.
    assert_eq!(messages.iter().filter(|m| m["role"] == "tool").count(), 1);
    assert_eq!(sent["model"], "gpt-4o");
    ctx.close().await;
}

#[tokio::test]
async fn a_second_injection_replaces_instead_of_duplicating() {
    let t = tag();
    let llm = FakeLlm::start(Reply::Text("ok".into())).await;
    let ctx = demo_context(&t).await;
    let (once, _) = ctx.inject(conversation(), "alice").await.unwrap();
    let (twice, _) = ctx.inject(once.clone(), "bob").await.unwrap();
    assert_eq!(twice.messages.len(), once.messages.len());
    let v = serde_json::to_value(&twice.messages).unwrap();
    assert_eq!(v.as_array().unwrap().iter().filter(|m| m["name"] == "mcp_context").count(), 1);
    // Now bob's context: no profile of alice.
    let c = v[0]["content"].as_str().unwrap();
    assert!(c.contains("demo://users/bob/profile") && !c.contains("users/alice"), "{c}");
    // Over the wire too.
    let client = ContextClient::new(llm.client(), ctx.clone());
    client.create(twice, "bob").await.unwrap();
    let sent = &llm.requests()[0]["messages"];
    assert_eq!(sent.as_array().unwrap().iter().filter(|m| m["name"] == "mcp_context").count(), 1);
    ctx.close().await;
}

#[tokio::test]
async fn create_stream_streams_with_the_context() {
    let t = tag();
    let llm = FakeLlm::start(Reply::Stream(vec!["Use ".into(), "n share".into(), ".".into()])).await;
    let ctx = demo_context(&t).await;
    let client = ContextClient::new(llm.client(), ctx.clone());
    let (mut stream, report) = client.create_stream(conversation(), "bob").await.unwrap();
    let mut text = String::new();
    while let Some(chunk) = stream.next().await {
        for c in chunk.unwrap().choices {
            text.push_str(c.delta.content.as_deref().unwrap_or(""));
        }
    }
    assert_eq!(text, "Use n share.");
    let sent = &llm.requests()[0];
    assert_eq!(sent["stream"], true);
    assert_eq!(sent["messages"][0]["name"], "mcp_context");
    assert!(report.included.iter().any(|i| i.id == "demo:demo://docs/guide"));
    ctx.close().await;
}

#[tokio::test]
async fn developer_role_selection_and_nothing_to_inject() {
    let t = tag();
    let yaml = format!("servers:\n{}context:\n  role: developer\n  max_tokens: 2000\n", demo_server("demo", &t));
    let ctx = McpContext::from_config(&config(&yaml)).await.unwrap();
    let req =
        ContextRequest::for_user("anyone").with_selection(vec![ResourceId::parse("demo:demo://public/faq").unwrap()]);
    let (r, report) = ctx.inject(conversation(), &req).await.unwrap();
    let v = serde_json::to_value(&r.messages[0]).unwrap();
    assert_eq!(v["role"], "developer");
    assert_eq!(report.included.len(), 1);
    assert_eq!(report.included[0].id, "demo:demo://public/faq");
    // No policy file: everyone sees everything, except audience [user].
    let (_, report) = ctx.inject(conversation(), "x").await.unwrap();
    assert_eq!(report.excluded.iter().filter(|e| e.reason == mcp_context::ExcludeReason::Audience).count(), 1);
    // Empty policy: nothing visible, nothing injected, request untouched.
    let ctx2 =
        McpContext::with_policy(&config(&yaml), Policy::from_yaml("", std::path::Path::new("empty.yaml")).unwrap())
            .await;
    let (r, report) = ctx2.inject(conversation(), "x").await.unwrap();
    assert_eq!(serde_json::to_value(&r).unwrap(), serde_json::to_value(conversation()).unwrap());
    assert!(report.reason.as_deref().unwrap().contains("no resource is visible"));
    ctx.close().await;
    ctx2.close().await;
}

#[tokio::test]
async fn one_broken_server_is_reported_and_the_rest_injected() {
    let t = tag();
    let yaml = format!(
        "servers:\n{}{}  dead:\n    command: /nonexistent\n",
        demo_server("demo", &t),
        fixture_server("fx", &t, &["--specials"])
    );
    let ctx = McpContext::from_config(&config(&yaml)).await.unwrap();
    let (r, report) = ctx.inject(conversation(), "u").await.unwrap();
    assert!(report.failed_servers.iter().any(|f| f.server == "dead" && f.error.contains("cannot start")));
    let fail = report.excluded("fx:fx://fail").unwrap();
    assert_eq!(fail.reason, mcp_context::ExcludeReason::Error);
    assert!(fail.detail.as_deref().unwrap().contains("boom"));
    let content = serde_json::to_value(&r.messages[0]).unwrap()["content"].as_str().unwrap().to_owned();
    assert!(content.contains("demo:demo://docs/guide"));
    // A hostile resource cannot forge block boundaries.
    assert_eq!(content.lines().filter(|l| l.starts_with("<resource ")).count(), report.included.len());
    assert_eq!(content.lines().filter(|l| *l == "</resource>").count(), report.included.len());
    assert!(!content.contains('\u{1b}') && !content.contains('\0'));
    ctx.close().await;
}

#[tokio::test]
async fn http_error_from_the_model_endpoint_is_an_error() {
    let t = tag();
    let llm = FakeLlm::start(Reply::Status(401, "bad key".into())).await;
    let ctx = demo_context(&t).await;
    let client = ContextClient::new(llm.client(), ctx.clone());
    let e = client.create(conversation(), "alice").await.unwrap_err();
    assert!(e.to_string().contains("bad key"), "{e}");
    let _ = json!({});
    ctx.close().await;
}

/// The Responses API request type: our context into `instructions`, ahead
/// of the caller's, once however often it is injected, with the same report
/// as the chat path.
#[tokio::test]
async fn responses_requests_get_the_context_ahead_of_the_callers_instructions() {
    use async_openai::types::responses::CreateResponseArgs;
    let t = tag();
    let ctx = demo_context(&t).await;
    let request = CreateResponseArgs::default()
        .model("gpt-4o")
        .input("how do I share a note?")
        .instructions("Answer in one line.")
        .previous_response_id("resp_0")
        .build()
        .unwrap();
    let (once, report) = ctx.inject_response(request.clone(), "alice").await.unwrap();
    let (message, chat_report) = ctx.build(&ContextRequest::for_user("alice")).await.unwrap();
    let content = message.unwrap().content;
    assert_eq!(
        once.instructions.as_deref(),
        Some(format!("<mcp_context>\n{content}\n</mcp_context>\n\nAnswer in one line.").as_str())
    );
    assert_eq!((report.tokens, &report.included), (chat_report.tokens, &chat_report.included));
    let (twice, _) = ctx.inject_response(once.clone(), "alice").await.unwrap();
    assert_eq!(twice.instructions, once.instructions, "injecting again replaces ours");
    let mut expected = serde_json::to_value(&request).unwrap();
    expected["instructions"] = json!(once.instructions);
    assert_eq!(serde_json::to_value(&twice).unwrap(), expected, "every other field untouched");
    // A policy swapped in (as serve's SIGHUP does) applies to the next call:
    // under an empty one nothing is ours and the caller's instructions stay as they were.
    ctx.set_policy(Policy::from_yaml("", std::path::Path::new("empty.yaml")).unwrap());
    let (none, report) = ctx.inject_response(twice, "alice").await.unwrap();
    assert!(report.included.is_empty());
    assert_eq!(none.instructions.as_deref(), Some("Answer in one line."));
    ctx.close().await;
}
