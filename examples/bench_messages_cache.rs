//! How much of a Claude Code-like conversation a prompt cache can keep when
//! our block sits last in `system`: a 10-turn conversation (24 tools, three
//! system blocks with two breakpoints, each turn a question, a `tool_use`, its
//! `tool_result` and an answer; the breakpoint on the last user block, as
//! Claude Code sends them) goes through the library's Messages injection
//! (`McpContext::inject_messages_json`) once with `select: priority` (this
//! route's default) and once with `select: relevance`. For each turn after
//! the first, the request is written in the cache's order (tools → system →
//! messages) and compared with the previous turn's: the bytes both share from
//! the start are what a prompt cache can reuse; the rest is processed again.
//!
//! ```text
//! cargo build --release --example bench_server --example bench_messages_cache
//! target/release/examples/bench_messages_cache [--n 200] [--budget 2000] [--turns 10]
//! ```
//!
//! The MCP server is the `bench_server` example next to this one (`--n`
//! resources of 2 KB pseudo-English); the questions use its vocabulary, a
//! different topic each turn.

use mcp_context::{Config, ContextRequest, McpContext, SelectMode};
use serde_json::{Value, json};

fn flag(args: &[String], name: &str, default: usize) -> usize {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

const QUESTIONS: [&str; 10] = [
    "How does the server handle a request with a large payload?",
    "Why is the cache latency high for this stream buffer?",
    "What does the protocol handshake do with the session capability?",
    "Which configuration parameter sets the default queue size?",
    "How is a token counted in the model context?",
    "What happens to the socket when the process gets a signal?",
    "Explain the schema of the response object and its array field.",
    "Where is the benchmark throughput of the thread pool measured?",
    "How does the cursor page through a notification result?",
    "What environment variable changes the transport version?",
];

/// Claude Code's shape: 24 tools, three system blocks (two breakpoints).
fn conversation_start() -> Value {
    let tools: Vec<Value> = (0..24)
        .map(|i| {
            json!({"name": format!("Tool{i}"), "description": format!("Tool {i} does one thing well. {}", "It is described at length. ".repeat(20)),
                "input_schema": {"type": "object", "properties": {"arg": {"type": "string"}}, "required": ["arg"]}})
        })
        .collect();
    json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "tools": tools,
        "system": [
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": format!("You are an interactive CLI tool. {}", "Follow the instructions. ".repeat(200)), "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "gitStatus: clean"}
        ],
        "messages": [],
        "metadata": {"user_id": "user_x_account__session_1"},
        "stream": true
    })
}

/// Moves the last-user-block breakpoint to the newest user message, as Claude Code does.
fn mark_last_user(messages: &mut [Value]) {
    for m in messages.iter_mut() {
        for b in m["content"].as_array_mut().into_iter().flatten() {
            if let Some(o) = b.as_object_mut() {
                o.remove("cache_control");
            }
        }
    }
    if let Some(last) = messages.iter_mut().rev().find(|m| m["role"] == "user")
        && let Some(b) = last["content"].as_array_mut().and_then(|c| c.last_mut())
    {
        b["cache_control"] = json!({"type": "ephemeral"});
    }
}

/// The request in the cache's order: tools, then system, then messages.
fn cache_order(body: &Value) -> Vec<u8> {
    let mut out = serde_json::to_vec(&body["tools"]).unwrap();
    out.extend(serde_json::to_vec(&body["system"]).unwrap());
    out.extend(serde_json::to_vec(&body["messages"]).unwrap());
    out
}

fn shared_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n = flag(&args, "--n", 200);
    let budget = flag(&args, "--budget", 2000);
    let turns = flag(&args, "--turns", 10).min(QUESTIONS.len());
    let server = std::env::current_exe().unwrap().with_file_name("bench_server");
    let yaml = format!(
        "servers:\n  bench:\n    command: {server:?}\n    args: [\"--n\", \"{n}\", \"--size\", \"2048\"]\n    timeout_ms: 60000\n\
         context:\n  max_tokens: {budget}\n"
    );
    let config = Config::from_yaml(&yaml, &std::env::temp_dir().join("bench-messages-cache.yaml")).unwrap();
    let ctx = McpContext::from_config(&config).await.unwrap();

    println!("{n} resources of 2 KB, budget {budget} tokens, {turns} turns\n");
    println!(
        "| select | turns 2..{turns}: bytes sent | byte-identical prefix kept | re-processed | our block changed on |"
    );
    println!("|---|---:|---:|---:|---:|");
    for mode in [SelectMode::Priority, SelectMode::Relevance] {
        let mut body = conversation_start();
        let (mut sent, mut kept, mut changed) = (0usize, 0usize, 0usize);
        let mut previous: Option<(Vec<u8>, Value)> = None;
        for (turn, q) in QUESTIONS.iter().take(turns).enumerate() {
            let messages = body["messages"].as_array_mut().unwrap();
            messages.push(json!({"role": "user", "content": [{"type": "text", "text": q}]}));
            mark_last_user(messages);
            let mut request = body.clone();
            let mut req = ContextRequest::for_user("bench");
            req.select = Some(mode);
            ctx.inject_messages_json(&mut request, req).await.unwrap();
            let bytes = cache_order(&request);
            let ours = request["system"].as_array().unwrap().last().cloned().unwrap();
            if let Some((prev, prev_ours)) = &previous {
                sent += bytes.len();
                kept += shared_prefix(prev, &bytes);
                changed += usize::from(*prev_ours != ours);
            }
            previous = Some((bytes, ours));
            // The rest of the turn: a tool call, its result, an answer.
            let messages = body["messages"].as_array_mut().unwrap();
            let id = format!("toolu_{turn}");
            messages.push(json!({"role": "assistant", "content": [{"type": "tool_use", "id": id, "name": "Tool1", "input": {"arg": q}}]}));
            messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id,
                "content": format!("result of turn {turn}: {}", "some file contents ".repeat(100))}]}));
            messages.push(json!({"role": "assistant", "content": [{"type": "text", "text": format!("Answer {turn}. {}", "Explanation. ".repeat(40))}]}));
        }
        println!(
            "| {mode} | {sent} | {kept} ({:.1}%) | {} ({:.1}%) | {changed} of {} turns |",
            100.0 * kept as f64 / sent as f64,
            sent - kept,
            100.0 * (sent - kept) as f64 / sent as f64,
            turns - 1
        );
    }
    ctx.close().await;
}
