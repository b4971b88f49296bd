//! Issue 47, items 6, 7 and 9, tried as an attacker would against the real
//! binary: idle and half-open sockets cannot hold `serve.max_connections`
//! (raw TCP, HTTP/1.1 and HTTP/2), one caller's or one server's NUL cannot
//! erase the PostgreSQL audit of everyone's requests (the machine's
//! PostgreSQL, a schema per test), and `/v1/messages` counts every
//! `cache_control` the Messages API accepts and follows a later one-hour TTL
//! (a local Messages stand-in recording the forwarded body).

use serde_json::{Value, json};

use crate::messages::{Stand, breakpoints, our_block, post as post_messages, serve_yaml};
use crate::serve::Proxy;

// ------------------------------------------------------------ 9: Messages cache breakpoints

/// `system`'s last block as the stand-in received it.
fn last_system(body: &Value) -> Value {
    body["system"].as_array().and_then(|s| s.last()).cloned().unwrap_or(Value::Null)
}

/// A top-level `cache_control` with `ttl: "1h"` marks the request's last
/// block, after ours: ours asks for one hour too (before: five minutes, a
/// shorter TTL before a longer one, which the API refuses). A one-hour
/// breakpoint nested in a `search_result` inside a `tool_result` does the same.
#[tokio::test]
async fn our_breakpoint_follows_a_later_one_hour_ttl_wherever_it_is() {
    let stand = Stand::start().await;
    let proxy = Proxy::start(&serve_yaml(&stand, ""), &stand.base).await;
    let mut ours = our_block(&proxy, "alice");
    ours["cache_control"] = json!({"type": "ephemeral", "ttl": "1h"});
    let sent = r#"{"model":"m","max_tokens":5,"cache_control":{"type":"ephemeral","ttl":"1h"},"messages":[{"role":"user","content":"hi"}]}"#;
    let r = post_messages(&proxy, "/v1/messages", "key-alice", sent.to_owned()).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let g = &stand.messages()[0];
    assert_eq!(last_system(&g.body), ours, "{}", String::from_utf8_lossy(&g.bytes));
    assert_eq!(g.body["cache_control"], json!({"type": "ephemeral", "ttl": "1h"}), "the caller's own, as sent");

    let nested = json!({"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": "find it"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "search", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "search_result", "source": "https://example.com/a", "title": "A", "content": [
                {"type": "text", "text": "found", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}]}]}]});
    let r = post_messages(&proxy, "/v1/messages", "key-alice", nested.to_string()).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(last_system(&stand.messages()[1].body), ours);
}

/// Four breakpoints of the caller's: a tool, a system block, a text block
/// in a `document`'s `source.content`, and a text block of a
/// `search_result` inside a `tool_result`. Ours goes without one: never a
/// fifth (before: the nested two were not counted, ours was the fifth and
/// the API refused the caller's request).
#[tokio::test]
async fn breakpoints_nested_in_documents_and_search_results_are_counted() {
    let stand = Stand::start().await;
    let proxy = Proxy::start(&serve_yaml(&stand, ""), &stand.base).await;
    let cc = json!({"type": "ephemeral"});
    let body = json!({"model": "m", "max_tokens": 5,
        "tools": [{"name": "search", "input_schema": {"type": "object"}, "cache_control": cc}],
        "system": [{"type": "text", "text": "Be brief.", "cache_control": cc}],
        "messages": [
            {"role": "user", "content": [
                {"type": "document", "source": {"type": "content", "content": [
                    {"type": "text", "text": "chapter one", "cache_control": cc}]}},
                {"type": "text", "text": "summarise, then search"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "search", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "search_result", "source": "https://example.com/a", "title": "A", "content": [
                    {"type": "text", "text": "found", "cache_control": cc}]}]}]}]});
    let r = post_messages(&proxy, "/v1/messages", "key-bob", body.to_string()).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let g = &stand.messages()[0];
    let mut plain = our_block(&proxy, "bob");
    plain.as_object_mut().unwrap().remove("cache_control");
    assert_eq!(last_system(&g.body), plain, "ours without a breakpoint");
    assert_eq!(breakpoints(&g.body), 4, "{}", String::from_utf8_lossy(&g.bytes));
}
