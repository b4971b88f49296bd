//! What a request body costs the proxy once parsed (issue 47, item 1): the
//! real `mcp-context serve` binary, bodies an identified caller may send
//! (within `max_body_bytes`) that are dense in JSON values, and the
//! proxy's peak resident set (`VmHWM` in `/proc`) while it handles them.
//! A body of 190 000 one-letter chat messages, or of 380 000 text blocks on
//! `/v1/messages`, must cost about its size (at most 3x), and eight at once
//! no more than the body budget admits; bodies over `serve.max_body_fields`
//! top-level fields are refused in the route's own error shape, and nothing
//! of them reaches the upstream.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::serve::{Proxy, keys_yaml};

/// What the upstream received: each request's path and bytes.
type Recorded = Arc<Mutex<Vec<(String, Bytes)>>>;

/// An upstream for both APIs that records each request's path and bytes
/// (never parsing them: the test process must not pay what the proxy must
/// not) and answers with a short completion of the right shape.
struct Recorder {
    base: String,
    got: Recorded,
    stop: tokio_util::sync::CancellationToken,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Recorder {
    async fn start() -> Recorder {
        async fn answer(State(got): State<Recorded>, req: Request) -> Response {
            let path = req.uri().path().to_owned();
            let bytes = axum::body::to_bytes(req.into_body(), usize::MAX).await.unwrap_or_default();
            got.lock().unwrap().push((path.clone(), bytes));
            if path.ends_with("/messages") {
                axum::Json(json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
                    "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
                    "usage": {"input_tokens": 1, "output_tokens": 1}}))
                .into_response()
            } else {
                axum::Json(json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}))
                .into_response()
            }
        }
        let got = Arc::new(Mutex::new(Vec::new()));
        let router = Router::new().fallback(answer).with_state(got.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/v1", listener.local_addr().unwrap());
        let stop = tokio_util::sync::CancellationToken::new();
        let s2 = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).with_graceful_shutdown(s2.cancelled_owned()).await;
        });
        Recorder { base, got, stop }
    }

    fn got(&self) -> Vec<(String, Bytes)> {
        self.got.lock().unwrap().clone()
    }
}

/// A `/proc/<pid>/status` figure in KiB (`VmHWM`: the peak resident set).
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A POST over a raw socket, the body written while the answer is read (a
/// refusal may come before the body is all sent): the status and the
/// answer's body.
async fn post(url: &str, path: &str, headers: &str, body: Arc<Vec<u8>>) -> (u16, String) {
    let addr = url.trim_start_matches("http://").to_owned();
    let s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(head.as_bytes()).await;
        let _ = wr.write_all(&body).await;
        wr
    });
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(120), rd.read_to_end(&mut out)).await;
    drop(writer.await);
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, body.to_owned())
}

const ALICE: &str = "Authorization: Bearer key-alice\r\n";
const ALICE_MESSAGES: &str = "x-api-key: key-alice\r\nanthropic-version: 2023-06-01\r\n";

/// `n` copies of `item`, comma-separated (the inside of a JSON array).
fn repeated(item: &str, n: usize) -> String {
    let mut s = String::with_capacity(n * (item.len() + 1));
    for i in 0..n {
        if i > 0 {
            s.push(',');
        }
        s.push_str(item);
    }
    s
}

/// The serve section: alice's key, big bodies allowed, the Messages route to `up`.
fn serve_yaml(up: &Recorder, extra: &str) -> String {
    format!(
        "  upstream_api_key: sk-upstream-1\n{}  max_body_bytes: 11000000\n  anthropic:\n    upstream: {}\n    \
         api_key: sk-ant-op\n    select: relevance\n{extra}",
        keys_yaml(),
        up.base
    )
}

/// A small chat and a small Messages request: tokenizer, cache and pools
/// warm before the peak is measured.
async fn warm(proxy: &Proxy) {
    let chat = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"}]}).to_string();
    assert_eq!(post(&proxy.url, "/v1/chat/completions", ALICE, Arc::new(chat.into_bytes())).await.0, 200);
    let m = json!({"model": "claude", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    assert_eq!(post(&proxy.url, "/v1/messages", ALICE_MESSAGES, Arc::new(m.into_bytes())).await.0, 200);
}

#[tokio::test]
async fn a_body_dense_in_json_values_costs_about_its_size_and_goes_upstream_as_sent() {
    let up = Recorder::start().await;
    let proxy = Proxy::start(&serve_yaml(&up, ""), &up.base).await;
    let pid = proxy.child.id().unwrap();
    warm(&proxy).await;
    let before = status_kib(pid, "VmHWM:");

    // 190 000 one-letter messages: 10 MB.
    let tiny = repeated(r#"{"role":"user","content":[{"type":"text","text":"a"}]}"#, 190_000);
    let chat = format!(r#"{{"model":"gpt-4o","messages":[{tiny}]}}"#);
    let size = chat.len() as u64;
    assert!(size > 10_000_000);
    let (status, answer) = post(&proxy.url, "/v1/chat/completions", ALICE, Arc::new(chat.into_bytes())).await;
    assert_eq!(status, 200, "{answer}");
    let peak = status_kib(pid, "VmHWM:");
    let grown = (peak - before) * 1024;
    eprintln!("chat, {size} bytes of 190000 messages: peak RSS grew {} MiB", grown >> 20);
    assert!(grown <= 3 * size, "one body of {size} bytes grew the peak RSS by {grown} bytes");
    // The upstream got our message first, then every message of the caller's, byte for byte.
    let got = up.got();
    let (path, sent) = got.last().unwrap();
    assert_eq!(path, "/v1/chat/completions");
    let sent = std::str::from_utf8(sent).unwrap();
    assert!(sent.starts_with(r#"{"model":"gpt-4o","messages":[{"role":""#), "{}", &sent[..200]);
    assert!(sent[..sent.len() - tiny.len()].contains(r#""name":"mcp_context""#), "ours first");
    assert!(sent.ends_with(&format!(",{tiny}]}}")), "the caller's messages as sent");

    // On /v1/messages: 380 000 text blocks in `system`, then in a message's content.
    let blocks = repeated(r#"{"type":"text","text":"a"}"#, 380_000);
    let in_system = format!(
        r#"{{"model":"claude","max_tokens":5,"system":[{blocks}],"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    let in_content =
        format!(r#"{{"model":"claude","max_tokens":5,"messages":[{{"role":"user","content":[{blocks}]}}]}}"#);
    for (what, body) in [("system", in_system), ("content", in_content)] {
        let size = body.len() as u64;
        let (status, answer) = post(&proxy.url, "/v1/messages", ALICE_MESSAGES, Arc::new(body.into_bytes())).await;
        assert_eq!(status, 200, "{what}: {answer}");
        let grown = (status_kib(pid, "VmHWM:") - before) * 1024;
        eprintln!("messages, {size} bytes of 380000 blocks in {what}: peak RSS grew {} MiB", grown >> 20);
        assert!(grown <= 3 * size, "{what}: one body of {size} bytes grew the peak RSS by {grown} bytes");
        let got = up.got();
        let (path, sent) = got.last().unwrap();
        assert_eq!(path, "/v1/messages");
        let sent = std::str::from_utf8(sent).unwrap();
        match what {
            // The caller's blocks, as sent, then ours last.
            "system" => {
                let prefix = format!(r#"{{"model":"claude","max_tokens":5,"system":[{blocks},"#);
                assert!(sent.starts_with(&prefix), "{}", &sent[..100]);
                assert!(sent[prefix.len()..].contains("<mcp_context>"), "ours last: {}", &sent[prefix.len()..]);
            }
            // The messages as sent, then `system` (ours alone) added last.
            _ => {
                let prefix = format!(
                    r#"{{"model":"claude","max_tokens":5,"messages":[{{"role":"user","content":[{blocks}]}}],"system":["#
                );
                assert!(sent.starts_with(&prefix), "{}", &sent[..100]);
            }
        }
    }

    // A long conversation of an ordinary shape: a replayed message of ours is
    // dropped, every other message goes on in order, byte for byte.
    let turn = |i: usize| {
        let role = if i.is_multiple_of(2) { "user" } else { "assistant" };
        json!({"role": role, "content": format!("turn {i}: {}", "lorem ipsum ".repeat(20))}).to_string()
    };
    let old_ours = r#"{"role":"system","content":"<old context>","name":"mcp_context"}"#;
    let first: Vec<String> = (0..1500).map(turn).collect();
    let second: Vec<String> = (1500..3000).map(turn).collect();
    let body =
        format!(r#"{{"model":"gpt-4o","messages":[{},{old_ours}, {}],"n":1}}"#, first.join(","), second.join(" ,"));
    let (status, answer) = post(&proxy.url, "/v1/chat/completions", ALICE, Arc::new(body.into_bytes())).await;
    assert_eq!(status, 200, "{answer}");
    let got = up.got();
    let sent: Value = serde_json::from_slice(&got.last().unwrap().1).unwrap();
    let sent = sent["messages"].as_array().unwrap();
    assert_eq!(sent.len(), 3001, "ours and the caller's 3000");
    assert_eq!(sent[0]["name"], "mcp_context");
    assert_ne!(sent[0]["content"], "<old context>");
    let theirs: Vec<String> = sent[1..].iter().map(Value::to_string).collect();
    let want: Vec<String> =
        first.iter().chain(&second).map(|t| serde_json::from_str::<Value>(t).unwrap().to_string()).collect();
    assert_eq!(theirs, want);
}

#[tokio::test]
async fn eight_dense_bodies_at_once_cost_no_more_than_the_body_budget() {
    let up = Recorder::start().await;
    // Room for four 10 MB bodies at once.
    let budget: u64 = 44_000_000;
    let proxy = Proxy::start(&serve_yaml(&up, &format!("  max_inflight_body_bytes: {budget}\n")), &up.base).await;
    let pid = proxy.child.id().unwrap();
    warm(&proxy).await;
    let before = status_kib(pid, "VmHWM:");
    let tiny = repeated(r#"{"role":"user","content":[{"type":"text","text":"a"}]}"#, 190_000);
    let chat = Arc::new(format!(r#"{{"model":"gpt-4o","messages":[{tiny}]}}"#).into_bytes());
    let blocks = repeated(r#"{"type":"text","text":"a"}"#, 380_000);
    let messages = Arc::new(
        format!(r#"{{"model":"claude","max_tokens":5,"messages":[{{"role":"user","content":[{blocks}]}}]}}"#)
            .into_bytes(),
    );
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (url, chat, messages) = (proxy.url.clone(), chat.clone(), messages.clone());
        tasks.push(tokio::spawn(async move {
            match i % 2 {
                0 => post(&url, "/v1/chat/completions", ALICE, chat).await,
                _ => post(&url, "/v1/messages", ALICE_MESSAGES, messages).await,
            }
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap().0);
    }
    let grown = (status_kib(pid, "VmHWM:") - before) * 1024;
    eprintln!(
        "8 bodies of 10 MB at once, budget {budget}: statuses {statuses:?} in {:.1?}, peak RSS grew {} MiB",
        started.elapsed(),
        grown >> 20
    );
    assert!(statuses.iter().all(|s| *s == 200 || *s == 503), "{statuses:?}");
    let served = statuses.iter().filter(|s| **s == 200).count();
    assert!(served >= 1, "{statuses:?}");
    assert_eq!(up.got().len(), served + 2, "each served body reached the upstream once (and the two warm-ups)");
    // Each admitted body costs at most about three times its bytes (the raw body, the copy placed for the upstream,
    // the index of its fields: the issue's bound for one body), and the budget admits bodies by their raw bytes, so
    // eight at once stay within three budgets however they overlap (alone: +64-74 MiB; on a loaded CI machine, where
    // the four admitted ones overlap fully, up to +99 MiB; unbounded: +1,853 MiB).
    assert!(grown <= 3 * budget, "8 bodies at once grew the peak RSS by {grown} bytes (budget {budget})");
}

#[tokio::test]
async fn more_top_level_fields_than_the_limit_are_refused_in_each_routes_shape() {
    let up = Recorder::start().await;
    // The default serve.max_body_fields: 256.
    let proxy = Proxy::start(&serve_yaml(&up, ""), &up.base).await;
    let fields = |n: usize| (0..n).map(|i| format!(r#""x{i}":0"#)).collect::<Vec<_>>().join(",");
    let chat = format!(r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"hi"}}],{}}}"#, fields(255));
    let (status, answer) = post(&proxy.url, "/v1/chat/completions", ALICE, Arc::new(chat.into_bytes())).await;
    assert_eq!(status, 400, "{answer}");
    let v: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(v["error"]["code"], "too_many_fields", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("serve.max_body_fields"), "{v}");
    let m =
        format!(r#"{{"model":"claude","max_tokens":5,"messages":[{{"role":"user","content":"hi"}}],{}}}"#, fields(254));
    let (status, answer) = post(&proxy.url, "/v1/messages", ALICE_MESSAGES, Arc::new(m.into_bytes())).await;
    assert_eq!(status, 400, "{answer}");
    let v: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("more than 256 top-level fields"), "{v}");
    assert!(up.got().is_empty(), "nothing reached the upstream");
    // At the limit, a body goes through.
    let chat = format!(r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"hi"}}],{}}}"#, fields(254));
    let (status, answer) = post(&proxy.url, "/v1/chat/completions", ALICE, Arc::new(chat.into_bytes())).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(up.got().len(), 1);
}
