//! The model-driven tool path against a local endpoint that answers with
//! `tool_calls`, and a fixture server that records its reads.

use std::path::Path;
use std::sync::Arc;

use async_openai::types::chat::{ChatCompletionRequestUserMessage, CreateChatCompletionRequestArgs};
use mcp_context::tools::{LIST_TOOL, READ_TOOL};
use mcp_context::{ContextClient, ContextRequest, McpContext, Policy};

use crate::common::*;

const POLICY: &str = r#"
users:
  ann:
    allow: [ { uri: "**" } ]
    deny: [ { uri: "fx://doc/1" } ]
"#;

async fn context(t: &str, log: &Path) -> Arc<McpContext> {
    let yaml = format!(
        "servers:\n{}context:\n  tool_result_max_tokens: 40\n",
        fixture_server("fx", t, &["--n", "3", "--specials", "--size", "400", "--record", log.to_str().unwrap()])
    );
    Arc::new(McpContext::with_policy(&config(&yaml), Policy::from_yaml(POLICY, Path::new("p.yaml")).unwrap()).await)
}

#[tokio::test]
async fn tool_results_and_errors() {
    let t = tag();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("reads.log");
    let ctx = context(&t, &log).await;
    let list = ctx.tools().run("1", LIST_TOOL, "{}", "ann").await;
    assert!(list.content.starts_with("Available MCP Resources:\n- fx:fx://badb64"), "{}", list.content);
    assert!(!list.content.contains("fx://doc/1"), "denied resources are never listed");
    assert_eq!(list.display, format!("Listed {} resources.", list.content.lines().count() - 1));
    assert_eq!(
        ctx.tools().run("2", LIST_TOOL, r#"{"serverName":"zz"}"#, "ann").await.content,
        "No resources found for server: zz\n"
    );
    assert_eq!(ctx.tools().run("3", LIST_TOOL, "{}", "nobody").await.content, "No MCP resources found.\n");

    let read = |args: &'static str| {
        let ctx = ctx.clone();
        async move { ctx.tools().run("r", READ_TOOL, args, "ann").await }
    };
    assert_eq!(read(r#"{"uri":"fx:fx://blob"}"#).await.content, "[Binary Data (image/png)]");
    assert_eq!(read(r#"{"uri":"fx:fx://empty"}"#).await.content, "No content returned from resource.");
    assert_eq!(
        read(r#"{"uri":"fx:fx://multi"}"#).await.content,
        "part one\n[Binary Data (application/octet-stream)]\npart two\n"
    );
    let missing = read("{}").await;
    assert_eq!((missing.content.as_str(), missing.is_error), ("Error: No URI provided.", true));
    assert_eq!(read("not json").await.content, "Error: No URI provided.");
    // Not found and not visible give the same answer; the denied one is never read.
    let absent = read(r#"{"uri":"fx:fx://doc/99"}"#).await;
    let denied = read(r#"{"uri":"fx:fx://doc/1"}"#).await;
    assert_eq!(absent.content, "Error: Resource not found for URI: fx:fx://doc/99");
    assert_eq!(denied.content, "Error: Resource not found for URI: fx:fx://doc/1");
    assert_eq!(read(r#"{"uri":"nope:x://y"}"#).await.content, "Error: Resource not found for URI: nope:x://y");
    assert_eq!(read(r#"{"uri":"no-colon"}"#).await.content, "Error: Resource not found for URI: no-colon");
    assert!(!read_log(&log).contains(&"fx://doc/1".to_string()));
    let failed = read(r#"{"uri":"fx:fx://fail"}"#).await;
    assert!(
        failed.content.starts_with("Error: Failed to read resource: ") && failed.content.contains("boom"),
        "{}",
        failed.content
    );
    // Capped at tool_result_max_tokens with the same marker as injection.
    let long = read(r#"{"uri":"fx:fx://doc/0"}"#).await;
    assert!(long.content.contains("[truncated: kept "), "{}", long.content);
    assert!(tiktoken_rs::o200k_base_singleton().encode_ordinary(&long.content).len() <= 40);
    ctx.close().await;
}

#[tokio::test]
async fn the_tool_loop_over_the_wire() {
    let t = tag();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("reads.log");
    let ctx = context(&t, &log).await;
    let llm = FakeLlm::start(Reply::Text("Done.".into())).await;
    llm.push(Reply::ToolCalls(vec![
        ("call_a".into(), LIST_TOOL.into(), "{}".into()),
        ("call_b".into(), READ_TOOL.into(), r#"{"uri":"fx:fx://doc/2"}"#.into()),
        ("call_c".into(), READ_TOOL.into(), r#"{"uri":"fx:fx://doc/1"}"#.into()),
        ("call_d".into(), READ_TOOL.into(), r#"{"uri":"fx:fx://doc/77"}"#.into()),
    ]));
    let client = ContextClient::new(llm.client(), ctx.clone());
    let request = CreateChatCompletionRequestArgs::default()
        .model("gpt-4o")
        .messages([ChatCompletionRequestUserMessage::from("what is in doc 2?").into()])
        .build()
        .unwrap();
    let mut seen = Vec::new();
    let done = client
        .create_with_tools(request, &ContextRequest::for_user("ann"), true, 3, |r| seen.push(r.name.clone()))
        .await
        .unwrap();
    assert_eq!(done.rounds, 1);
    assert_eq!(seen.len(), 4);
    assert_eq!(done.response.choices[0].message.content.as_deref(), Some("Done."));
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    let tools: Vec<&str> =
        reqs[0]["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert_eq!(tools, [LIST_TOOL, READ_TOOL]);
    let first = reqs[0]["messages"].as_array().unwrap();
    let second = reqs[1]["messages"].as_array().unwrap();
    // The system message is ours, and the tool path did not change it.
    assert_eq!(first[0]["name"], "mcp_context");
    assert_eq!(first[0], second[0]);
    assert_eq!(second.iter().filter(|m| m["name"] == "mcp_context").count(), 1);
    // assistant tool_calls, then one tool message per call with the right id.
    assert_eq!(second[2]["role"], "assistant");
    assert_eq!(second[2]["tool_calls"].as_array().unwrap().len(), 4);
    let tool_msgs: Vec<&serde_json::Value> = second.iter().filter(|m| m["role"] == "tool").collect();
    let ids: Vec<&str> = tool_msgs.iter().map(|m| m["tool_call_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["call_a", "call_b", "call_c", "call_d"]);
    assert!(tool_msgs[0]["content"].as_str().unwrap().starts_with("Available MCP Resources:"));
    assert!(tool_msgs[1]["content"].as_str().unwrap().starts_with("Document 2."));
    assert_eq!(tool_msgs[2]["content"], "Error: Resource not found for URI: fx:fx://doc/1");
    assert_eq!(tool_msgs[3]["content"], "Error: Resource not found for URI: fx:fx://doc/77");
    assert!(!read_log(&log).contains(&"fx://doc/1".to_string()), "a denied resource is never read");
    // The injection path carries no tool messages of its own.
    assert_eq!(first.iter().filter(|m| m["role"] == "tool").count(), 0);
    ctx.close().await;
}
