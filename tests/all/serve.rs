//! `mcp-context serve`, the real binary, between real clients (raw HTTP, the
//! official Python and Node `openai` packages) and a local OpenAI-compatible
//! upstream that records every request and streams slowly. Assertions are on
//! what went over the wire on both sides.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, post};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Semaphore;

use crate::common::*;

// ---------------------------------------------------------------- upstream

/// One request as the upstream received it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: Value,
    /// The body's length in bytes, as received.
    pub len: usize,
}

#[derive(Default)]
struct UpState {
    seen: Vec<Seen>,
    /// Streams that sent their last event.
    finished: usize,
    /// Streams dropped before their last event (the proxy went away).
    cancelled: usize,
}

/// A recording OpenAI-compatible upstream on loopback. A chat or Responses
/// request whose text contains `GATE` streams three chunks, then waits for
/// [`Upstream::release`] (sending SSE comments meanwhile, so a closed
/// connection is noticed) before its last chunk; `SLOW` waits 3 s before
/// answering; `E429` answers 429 with a `retry-after`.
pub struct Upstream {
    pub base: String,
    state: Arc<Mutex<UpState>>,
    gate: Arc<Semaphore>,
    stop: tokio_util::sync::CancellationToken,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

type Up = (Arc<Mutex<UpState>>, Arc<Semaphore>);

pub const CHUNKS: [&str; 4] = ["Hel", "lo from ", "the ", "upstream"];
pub const ANSWER: &str = "Hello from the upstream";

impl Upstream {
    pub async fn start() -> Upstream {
        let state = Arc::new(Mutex::new(UpState::default()));
        let gate = Arc::new(Semaphore::new(0));
        let router = Router::new()
            .route("/v1/chat/completions", post(up_chat))
            .route("/v1/responses", post(up_responses))
            .route("/v1/{*rest}", any(up_other))
            .with_state((state.clone(), gate.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/v1", listener.local_addr().unwrap());
        let stop = tokio_util::sync::CancellationToken::new();
        let s2 = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).with_graceful_shutdown(s2.cancelled_owned()).await;
        });
        Upstream { base, state, gate, stop }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    pub fn finished(&self) -> usize {
        self.state.lock().unwrap().finished
    }

    pub fn cancelled(&self) -> usize {
        self.state.lock().unwrap().cancelled
    }

    /// Lets one gated stream send its last chunk.
    pub fn release(&self) {
        self.gate.add_permits(1);
    }
}

async fn record(state: &Arc<Mutex<UpState>>, req: Request) -> Seen {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let seen = Seen {
        method: parts.method.to_string(),
        path: parts.uri.to_string(),
        headers: parts.headers.iter().map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned())).collect(),
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        len: bytes.len(),
    };
    state.lock().unwrap().seen.push(seen.clone());
    seen
}

/// Marks a stream finished or cancelled when it is dropped.
struct StreamGuard {
    state: Arc<Mutex<UpState>>,
    done: bool,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let mut s = self.state.lock().unwrap();
        if self.done {
            s.finished += 1;
        } else {
            s.cancelled += 1;
        }
    }
}

/// An SSE body of `frames`; with `gate`, the last frame waits for a permit.
fn sse(up: &Up, frames: Vec<String>, gated: bool) -> Response {
    let (state, gate) = up.clone();
    let frames = Arc::new(frames);
    let guard = StreamGuard { state, done: false };
    let stream = futures::stream::unfold((0usize, guard), move |(i, mut guard)| {
        let frames = frames.clone();
        let gate = gate.clone();
        async move {
            if i >= frames.len() {
                return None;
            }
            if i == frames.len() - 1 && gated {
                // Wait for the test, pinging so that a closed connection is noticed.
                tokio::select! {
                    p = gate.acquire() => p.unwrap().forget(),
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {
                        return Some((Ok::<_, std::io::Error>(Bytes::from_static(b": ping\n\n")), (i, guard)));
                    }
                }
            } else if i > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if i == frames.len() - 1 {
                guard.done = true;
            }
            Some((Ok(Bytes::from(frames[i].clone())), (i + 1, guard)))
        }
    });
    ([("content-type", "text/event-stream")], Body::from_stream(stream)).into_response()
}

fn behaviour(body: &Value) -> (bool, bool, bool) {
    let text = body.to_string();
    (text.contains("GATE"), text.contains("SLOW"), text.contains("E429"))
}

async fn up_chat(State(up): State<Up>, req: Request) -> Response {
    let seen = record(&up.0, req).await;
    let (gated, slow, e429) = behaviour(&seen.body);
    if slow {
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    if e429 {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", "7")],
            axum::Json(
                json!({"error": {"message": "slow down", "type": "requests", "param": null, "code": "rate_limit"}}),
            ),
        )
            .into_response();
    }
    let model = seen.body["model"].as_str().unwrap_or("gpt-4o").to_owned();
    if seen.body["stream"] == true {
        let mut frames: Vec<String> = CHUNKS
            .iter()
            .map(|c| {
                let chunk = json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": model,
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": c}, "finish_reason": null}]});
                format!("data: {chunk}\n\n")
            })
            .collect();
        let last = json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": model,
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
        let n = frames.len();
        frames[n - 1].push_str(&format!("data: {last}\n\ndata: [DONE]\n\n"));
        return sse(&up, frames, gated);
    }
    axum::Json(json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    }))
    .into_response()
}

fn response_object(model: &str) -> Value {
    json!({
        "id": "resp_1", "object": "response", "created_at": 1, "status": "completed", "model": model,
        "output": [{"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": ANSWER, "annotations": []}]}],
        "parallel_tool_calls": true, "tool_choice": "auto", "tools": [], "error": null, "incomplete_details": null,
        "instructions": null, "metadata": {}, "temperature": 1.0, "top_p": 1.0
    })
}

async fn up_responses(State(up): State<Up>, req: Request) -> Response {
    let seen = record(&up.0, req).await;
    let (gated, _, _) = behaviour(&seen.body);
    let model = seen.body["model"].as_str().unwrap_or("gpt-4o").to_owned();
    if seen.body["stream"] == true {
        let mut created = response_object(&model);
        created["status"] = json!("in_progress");
        created["output"] = json!([]);
        let mut events = vec![json!({"type": "response.created", "sequence_number": 0, "response": created})];
        for (i, c) in CHUNKS.iter().enumerate() {
            events.push(json!({"type": "response.output_text.delta", "sequence_number": i + 1, "item_id": "msg_1",
                "output_index": 0, "content_index": 0, "delta": c, "logprobs": []}));
        }
        events.push(json!({"type": "response.completed", "sequence_number": CHUNKS.len() + 1,
            "response": response_object(&model)}));
        let mut frames: Vec<String> =
            events.iter().map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap())).collect();
        // The last delta and the completion travel together, after the gate.
        let last = frames.pop().unwrap();
        let n = frames.len();
        frames[n - 1].push_str(&last);
        return sse(&up, frames, gated);
    }
    axum::Json(response_object(&model)).into_response()
}

async fn up_other(State(up): State<Up>, req: Request) -> Response {
    let seen = record(&up.0, req).await;
    if seen.path.starts_with("/v1/models") {
        return axum::Json(
            json!({"object": "list", "data": [{"id": "gpt-4o", "object": "model", "created": 1, "owned_by": "test"}]}),
        )
        .into_response();
    }
    (StatusCode::NOT_FOUND, axum::Json(json!({"error": {"message": "no such route", "type": "invalid_request_error"}})))
        .into_response()
}

// ---------------------------------------------------------------- the proxy

/// A running `mcp-context serve` with the demo server and a copy of the demo policies.
pub struct Proxy {
    pub url: String,
    pub child: tokio::process::Child,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub tag: String,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

/// The digest `serve hash-key` prints.
pub fn digest(key: &str) -> String {
    let out = std::process::Command::new(MCP_CONTEXT).args(["serve", "hash-key", key]).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Caller keys of the default setup: `key-<user>` for alice, bob and carol.
pub fn keys_yaml() -> String {
    let mut s = String::from("  keys:\n");
    for u in ["alice", "bob", "carol"] {
        s.push_str(&format!("    - {{ sha256: \"{}\", user: {u} }}\n", digest(&format!("key-{u}"))));
    }
    s
}

/// The usual `serve:` body: an upstream key, the three caller keys, a user header.
pub fn default_serve() -> String {
    format!("  upstream_api_key: sk-upstream-1\n{}  user_header: X-Test-User\n  max_body_bytes: 200000\n", keys_yaml())
}

impl Proxy {
    pub async fn start(serve: &str, upstream: &str) -> Proxy {
        let tag = tag();
        let body = format!(
            "servers:\n{}policy: policies/\ncontext:\n  max_tokens: 4000\nserve:\n{serve}",
            demo_server("demo", &tag)
        );
        Self::start_config(&body, upstream, tag).await
    }

    /// A proxy with this whole config file (next to a copy of the demo
    /// policies, in `policies/`).
    pub async fn start_config(body: &str, upstream: &str, tag: String) -> Proxy {
        Self::start_config_with(body, upstream, tag, &[]).await
    }

    /// [`Proxy::start_config`] with more arguments for `serve`.
    pub async fn start_config_with(body: &str, upstream: &str, tag: String, extra: &[&str]) -> Proxy {
        Self::start_config_env(body, upstream, tag, extra, &[("MCP_CONTEXT_LOG", Some("info,rmcp=off"))]).await
    }

    /// [`Proxy::start_config_with`] with these variables set (`Some`) or removed (`None`).
    pub async fn start_config_env(
        body: &str,
        upstream: &str,
        tag: String,
        extra: &[&str],
        env: &[(&str, Option<&str>)],
    ) -> Proxy {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("policies")).unwrap();
        std::fs::copy(policies_dir().join("default.yaml"), dir.path().join("policies/default.yaml")).unwrap();
        let config = dir.path().join("c.yaml");
        std::fs::write(&config, body).unwrap();
        let log = std::fs::File::create(dir.path().join("stderr.log")).unwrap();
        let mut cmd = tokio::process::Command::new(MCP_CONTEXT);
        for (k, _) in env.iter().filter(|(_, v)| v.is_none()) {
            cmd.env_remove(k);
        }
        let mut child = cmd
            .args(["serve", "--config"])
            .arg(&config)
            .args(["--listen", "127.0.0.1:0", "--upstream", upstream])
            .args(extra)
            .env("MCP_TEST_TAG", &tag)
            .envs(env.iter().filter_map(|(k, v)| v.map(|v| (*k, v))))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("serve printed its address")
            .unwrap()
            .unwrap_or_else(|| {
                panic!("serve exited: {}", std::fs::read_to_string(dir.path().join("stderr.log")).unwrap())
            });
        let url = line.split("listening on ").nth(1).unwrap().split(',').next().unwrap().to_owned();
        Proxy { url, child, dir, config, tag }
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default()
    }

    pub fn signal(&self, sig: i32) {
        unsafe { libc::kill(self.child.id().unwrap() as i32, sig) };
    }

    pub fn post(&self, path: &str, key: Option<&str>, body: &Value) -> reqwest::RequestBuilder {
        let mut r = http().post(format!("{}{path}", self.url)).json(body);
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        r
    }

    /// What `preview --user` would inject for `user`, with this proxy's config.
    pub fn preview(&self, user: &str) -> Option<String> {
        let out = std::process::Command::new(MCP_CONTEXT)
            .args(["preview", "--json", "--user", user, "--config"])
            .arg(&self.config)
            .env("MCP_TEST_TAG", &self.tag)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["message"]["content"].as_str().map(str::to_owned)
    }
}

pub fn http() -> reqwest::Client {
    reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap()
}

pub fn chat_body(text: &str) -> Value {
    json!({"model": "gpt-4o", "messages": [{"role": "user", "content": text}]})
}

/// Reads SSE `data:` payloads from a streamed response until `n` content pieces arrived.
async fn read_until(
    stream: &mut (impl futures::Stream<Item = reqwest::Result<Bytes>> + Unpin),
    buf: &mut String,
    done: impl Fn(&str) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done(buf) {
        let next = tokio::time::timeout_at(deadline, stream.next()).await.expect("stream stalled");
        match next {
            Some(Ok(b)) => buf.push_str(&String::from_utf8_lossy(&b)),
            other => panic!("stream ended early: {other:?}; got {buf}"),
        }
    }
}

fn chat_content(sse: &str) -> String {
    sse.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .collect()
}

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..400 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn chat_gets_our_message_first_once_and_everything_else_unchanged() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(&default_serve(), &up.base).await;
    let caller_messages = json!([
        {"role": "system", "content": "stale copy", "name": "mcp_context"},
        {"role": "system", "content": "You are the app."},
        {"role": "user", "content": "What is in the guide?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "tool output"},
    ]);
    let body = json!({
        "model": "gpt-4o", "messages": caller_messages, "temperature": 0.25, "seed": 7,
        "vendor_extension": {"nested": [1, 2.5, "x", null]}, "prompt_cache_key": "pck"
    });
    let resp = proxy
        .post("/v1/chat/completions", Some("key-alice"), &body)
        .header("X-Test-User", "mallory")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let report = resp.headers()["x-mcp-context"].to_str().unwrap().to_owned();
    assert!(report.starts_with("user=alice; tokens="), "{report}");
    assert!(report.contains("/3000; included="), "{report}");
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["choices"][0]["message"]["content"], ANSWER);

    let seen = up.seen();
    assert_eq!(seen.len(), 1);
    let got = &seen[0];
    assert_eq!(got.path, "/v1/chat/completions");
    assert_eq!(got.headers["authorization"], "Bearer sk-upstream-1", "the upstream key, never the caller's");
    assert!(!got.headers.contains_key("x-test-user"), "the identity header stays here");
    // The body (our message shared, the rest copied around it) goes with its length, not chunked.
    assert_eq!(got.headers.get("content-length"), Some(&got.len.to_string()), "{:?}", got.headers);
    assert!(!got.headers.contains_key("transfer-encoding"), "{:?}", got.headers);
    let msgs = got.body["messages"].as_array().unwrap();
    let ours: Vec<_> = msgs.iter().filter(|m| m["name"] == "mcp_context").collect();
    assert_eq!(ours.len(), 1, "exactly one context message");
    let expected = proxy.preview("alice").expect("alice sees something");
    assert_eq!(msgs[0], json!({"role": "system", "content": expected, "name": "mcp_context"}));
    assert_eq!(msgs[1..], caller_messages.as_array().unwrap()[1..], "the caller's messages unchanged");
    for k in ["temperature", "seed", "vendor_extension", "prompt_cache_key", "model"] {
        assert_eq!(got.body[k], body[k], "{k} unchanged");
    }
    assert_eq!(got.body.as_object().unwrap().len(), body.as_object().unwrap().len());
}

#[tokio::test]
async fn nothing_visible_means_nothing_injected() {
    let up = Upstream::start().await;
    // `nobody` has no role: the policy's default_roles is removed.
    let proxy = Proxy::start(&default_serve(), &up.base).await;
    let pol = proxy.dir.path().join("policies/default.yaml");
    let text = std::fs::read_to_string(&pol).unwrap().replace("default_roles: [guest]", "default_roles: []");
    std::fs::write(&pol, text).unwrap();
    proxy.signal(libc::SIGHUP);
    let body = chat_body("hi");
    wait_for("the reload", || proxy.stderr().contains("policy reloaded")).await;
    let resp = proxy.post("/v1/chat/completions", None, &body).header("X-Test-User", "nobody").send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["x-mcp-context"].to_str().unwrap().contains("tokens=0/"));
    assert_eq!(up.seen()[0].body, body, "the body goes upstream exactly as sent");
}

#[tokio::test]
async fn streams_are_relayed_as_they_arrive_and_a_disconnect_cancels_the_upstream() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(&default_serve(), &up.base).await;
    let mut body = chat_body("GATE please");
    body["stream"] = json!(true);

    // Chunks arrive while the upstream is still holding its last one.
    let resp = proxy.post("/v1/chat/completions", Some("key-bob"), &body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let mut stream = resp.bytes_stream();
    let mut buf = String::new();
    read_until(&mut stream, &mut buf, |b| chat_content(b) == CHUNKS[..3].concat()).await;
    assert_eq!(up.finished(), 0, "the client had three chunks before the upstream finished");
    up.release();
    read_until(&mut stream, &mut buf, |b| b.contains("data: [DONE]")).await;
    assert_eq!(chat_content(&buf), ANSWER);
    wait_for("the upstream to finish", || up.finished() == 1).await;

    // A client that goes away mid-stream: the upstream sees its connection close.
    let resp = proxy.post("/v1/chat/completions", Some("key-bob"), &body).send().await.unwrap();
    let mut stream = resp.bytes_stream();
    let mut buf = String::new();
    read_until(&mut stream, &mut buf, |b| chat_content(b).starts_with(CHUNKS[0])).await;
    drop(stream);
    wait_for("the upstream request to be cancelled", || up.cancelled() == 1).await;
    assert_eq!(up.finished(), 1);
}

#[tokio::test]
async fn errors_are_in_openai_shape_and_upstream_errors_pass_unchanged() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(&default_serve(), &up.base).await;
    let check = |v: &Value, code: &str| {
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(v["error"]["type"].is_string(), "{v}");
        assert_eq!(v["error"]["code"], code, "{v}");
    };
    let c = http();
    let url = format!("{}/v1/chat/completions", proxy.url);

    let r = c.post(&url).bearer_auth("key-bob").header("content-type", "application/json").body("{not json");
    let r = r.send().await.unwrap();
    assert_eq!(r.status(), 400);
    check(&r.json().await.unwrap(), "invalid_json");
    let r = proxy.post("/v1/chat/completions", Some("key-bob"), &json!({"model": "m"})).send().await.unwrap();
    assert_eq!(r.status(), 400);
    check(&r.json().await.unwrap(), "missing_messages");
    let r = proxy.post("/v1/responses", Some("key-bob"), &json!({"model": "m"})).send().await.unwrap();
    assert_eq!(r.status(), 400);
    check(&r.json().await.unwrap(), "missing_input");
    // An unknown key is refused even with a user header that would identify someone.
    let r = proxy
        .post("/v1/chat/completions", Some("key-eve"), &chat_body("hi"))
        .header("X-Test-User", "bob")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    check(&r.json().await.unwrap(), "invalid_api_key");
    let r = proxy.post("/v1/chat/completions", None, &chat_body("hi")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    check(&r.json().await.unwrap(), "missing_identity");
    let r = c.get(format!("{}/v1/models", proxy.url)).send().await.unwrap();
    assert_eq!(r.status(), 401, "passthrough routes need an identity too");
    let big = chat_body(&"x".repeat(300_000));
    let r = proxy.post("/v1/chat/completions", Some("key-bob"), &big).send().await.unwrap();
    assert_eq!(r.status(), 413);
    check(&r.json().await.unwrap(), "request_too_large");
    // A passthrough body sent chunked (no Content-Length) is bounded too.
    let chunks = futures::stream::iter((0..40).map(|_| Ok::<_, std::io::Error>(vec![b'x'; 10_000])));
    let sent = c
        .post(format!("{}/v1/embeddings", proxy.url))
        .bearer_auth("key-bob")
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await;
    // The proxy answers 413 as soon as the limit is passed and closes the
    // connection; a client still writing the rest may see the close first.
    match sent {
        Ok(r) => {
            assert_eq!(r.status(), 413);
            check(&r.json().await.unwrap(), "request_too_large");
        }
        Err(e) => assert!(format!("{e:?}").contains("BodyWrite"), "not an early close: {e:?}"),
    }
    assert!(up.seen().is_empty(), "nothing refused reached the upstream");

    // The upstream's own error: status, the header that matters and the body, unchanged.
    let r = proxy.post("/v1/chat/completions", Some("key-bob"), &chat_body("E429")).send().await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "7");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v, json!({"error": {"message": "slow down", "type": "requests", "param": null, "code": "rate_limit"}}));

    // 502: nothing listens upstream.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}/v1", closed.local_addr().unwrap());
    drop(closed);
    let p502 = Proxy::start(&default_serve(), &dead).await;
    let r = p502.post("/v1/chat/completions", Some("key-bob"), &chat_body("hi")).send().await.unwrap();
    assert_eq!(r.status(), 502);
    let v: Value = r.json().await.unwrap();
    check(&v, "upstream_unreachable");
    assert!(v["error"]["message"].as_str().unwrap().contains("refused"), "{v}");

    // 504: the upstream takes longer than serve.upstream_timeout_ms.
    let p504 = Proxy::start(&format!("{}  upstream_timeout_ms: 300\n", default_serve()), &up.base).await;
    let r = p504.post("/v1/chat/completions", Some("key-bob"), &chat_body("SLOW")).send().await.unwrap();
    assert_eq!(r.status(), 504);
    check(&r.json().await.unwrap(), "upstream_timeout");
}

#[tokio::test]
async fn each_user_gets_exactly_their_own_context_under_concurrent_load() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(&default_serve(), &up.base).await;
    // (how to identify, the policy user)
    let users = [("key-alice", "alice"), ("key-bob", "bob"), ("key-carol", "carol"), ("hdr:dave", "dave")];
    let expected: HashMap<&str, Option<String>> = users.iter().map(|(_, u)| (*u, proxy.preview(u))).collect();
    // Canaries: payroll only for carol (hr); each profile only for its owner; docs not for guests.
    assert!(expected["carol"].as_deref().unwrap().contains("ana,91000"));
    assert!(expected["bob"].as_deref().unwrap().contains("Profile of bob"));
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("isolation seed {seed}");
    let mut x = seed | 1;
    let mut tasks = Vec::new();
    for i in 0..80 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let (how, user) = users[(x % 4) as usize];
        let mut body = chat_body(&format!("request {i}"));
        if x.is_multiple_of(3) {
            body["stream"] = json!(true);
        }
        let req = if let Some(h) = how.strip_prefix("hdr:") {
            proxy.post("/v1/chat/completions", None, &body).header("X-Test-User", h)
        } else {
            proxy.post("/v1/chat/completions", Some(how), &body)
        };
        tasks.push(tokio::spawn(async move {
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 200);
            let h = r.headers()["x-mcp-context"].to_str().unwrap().to_owned();
            assert!(h.starts_with(&format!("user={user};")), "{h}");
            let text = r.text().await.unwrap();
            assert!(text.contains("Hel"), "{text}");
            (format!("request {i}"), user)
        }));
    }
    let sent: HashMap<String, &str> = futures::future::join_all(tasks).await.into_iter().map(|r| r.unwrap()).collect();
    let seen = up.seen();
    assert_eq!(seen.len(), sent.len());
    for s in seen {
        let msgs = s.body["messages"].as_array().unwrap();
        let last = msgs.last().unwrap()["content"].as_str().unwrap().to_owned();
        let user = sent[&last];
        let ctx = msgs[0]["content"].as_str().filter(|_| msgs[0]["name"] == "mcp_context").map(str::to_owned);
        assert_eq!(ctx, expected[user], "{user} got someone else's context");
        let text = ctx.unwrap_or_default();
        assert_eq!(text.contains("ana,91000"), user == "carol", "payroll canary for {user}");
        for owner in ["alice", "bob", "carol", "dave"] {
            if owner != user {
                assert!(!text.contains(&format!("Profile of {owner}")), "{user} saw {owner}'s profile");
            }
        }
    }
}

#[tokio::test]
async fn responses_get_the_context_ahead_of_the_callers_instructions() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(&default_serve(), &up.base).await;
    let body = json!({"model": "gpt-4o", "input": [{"role": "user", "content": "hi"}], "instructions": "Be brief.",
        "store": false, "x_vendor": [1]});
    let r = proxy.post("/v1/responses", Some("key-carol"), &body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v, response_object("gpt-4o"), "the upstream's answer, unchanged");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["instructions"] = Value::Null;
    let r = proxy.post("/v1/responses", Some("key-carol"), &streamed).send().await.unwrap();
    let text = r.text().await.unwrap();
    assert!(text.contains("event: response.completed"), "{text}");

    let expected = proxy.preview("carol").unwrap();
    let seen = up.seen();
    assert_eq!(seen[0].path, "/v1/responses");
    assert_eq!(seen[0].body["instructions"], format!("<mcp_context>\n{expected}\n</mcp_context>\n\nBe brief."));
    assert_eq!(seen[1].body["instructions"], format!("<mcp_context>\n{expected}\n</mcp_context>"));
    for k in ["input", "store", "x_vendor", "model"] {
        assert_eq!(seen[0].body[k], body[k], "{k}");
    }
}

#[tokio::test]
async fn other_routes_pass_through_and_health_readiness_metrics_answer() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(&format!("{}  readyz_details: true\n", default_serve()), &up.base).await;
    let c = http();
    let r = c.get(format!("{}/v1/models?limit=2", proxy.url)).bearer_auth("key-bob").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["data"][0]["id"], "gpt-4o");
    let r = c
        .post(format!("{}/v1/embeddings", proxy.url))
        .bearer_auth("key-bob")
        .json(&json!({"input": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "the upstream's own answer");
    let seen = up.seen();
    assert_eq!((seen[0].method.as_str(), seen[0].path.as_str()), ("GET", "/v1/models?limit=2"));
    assert_eq!(seen[0].headers["authorization"], "Bearer sk-upstream-1");
    assert_eq!(seen[1].body, json!({"input": "x"}), "no injection outside chat and responses");

    let r = proxy.post("/v1/chat/completions", Some("key-alice"), &chat_body("hi")).send().await.unwrap();
    assert_eq!(r.status(), 200);

    assert_eq!(c.get(format!("{}/healthz", proxy.url)).send().await.unwrap().status(), 200);
    let r = c.get(format!("{}/readyz", proxy.url)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["status"], "ready");
    assert_eq!(v["servers"][0]["name"], "demo");
    assert_eq!(v["servers"][0]["state"], "connected");
    let m = c.get(format!("{}/metrics", proxy.url)).send().await.unwrap().text().await.unwrap();
    for needle in [
        "mcp_context_http_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 1",
        "mcp_context_http_requests_total{route=\"/v1/{*rest}\",status=\"200\"} 1",
        "mcp_context_injection_duration_seconds_count 1",
        "mcp_context_upstream_duration_seconds_count{route=\"/chat/completions\"} 1",
        "mcp_context_server_connected{server=\"demo\"} 1",
        "mcp_context_server_restarts{server=\"demo\"} 0",
        "mcp_context_cache_misses_total",
        "mcp_context_cache_hits_total",
    ] {
        assert!(m.contains(needle), "{needle} not in\n{m}");
    }
    let tokens: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("mcp_context_injected_tokens_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    assert!(tokens > 0);
}

#[tokio::test]
async fn sighup_with_a_broken_policy_keeps_the_old_one_and_a_good_one_applies() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(&default_serve(), &up.base).await;
    let pol = proxy.dir.path().join("policies/default.yaml");
    let good = std::fs::read_to_string(&pol).unwrap();
    let before = proxy.preview("bob").unwrap();
    assert!(before.contains("Profile of bob"));

    std::fs::write(&pol, good.replace("  bob:\n    roles: [member]", "  bob:\n    roles: [member]\n    alow: []"))
        .unwrap();
    proxy.signal(libc::SIGHUP);
    wait_for("the rejection to be logged", || proxy.stderr().contains("policy reload rejected")).await;
    let log = proxy.stderr();
    assert!(log.contains("default.yaml:"), "the error names the file and line: {log}");
    let r = proxy.post("/v1/chat/completions", Some("key-bob"), &chat_body("one")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(up.seen()[0].body["messages"][0]["content"], before.as_str(), "still served under the old policy");

    // A valid change applies from the next request: bob loses his docs.
    std::fs::write(&pol, good.replace("      - { server: demo, uri: \"demo://docs/**\" }\n      - { server: demo, uri: \"demo://public/**\" }\n    include:\n      - \"demo:demo://users/{user}/profile\"\n    max_tokens: 1500", "      - { server: demo, uri: \"demo://public/**\" }\n    max_tokens: 1500")).unwrap();
    proxy.signal(libc::SIGHUP);
    wait_for("the reload", || proxy.stderr().contains("policy reloaded")).await;
    let r = proxy.post("/v1/chat/completions", Some("key-bob"), &chat_body("two")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let after = up.seen()[1].body["messages"][0]["content"].as_str().unwrap().to_owned();
    assert!(!after.contains("demo://docs/guide"), "{after}");
    assert_eq!(Some(after), proxy.preview("bob"));
    let m = http().get(format!("{}/metrics", proxy.url)).send().await.unwrap().text().await.unwrap();
    assert!(m.contains("mcp_context_policy_reloads_total{result=\"error\"} 1"), "{m}");
    assert!(m.contains("mcp_context_policy_reloads_total{result=\"ok\"} 1"), "{m}");
}

#[tokio::test]
async fn sigterm_lets_a_running_stream_finish_then_exits_leaving_no_process() {
    let up = Upstream::start().await;
    let mut proxy = Proxy::start(&default_serve(), &up.base).await;
    let mut body = chat_body("GATE");
    body["stream"] = json!(true);
    let resp = proxy.post("/v1/chat/completions", Some("key-bob"), &body).send().await.unwrap();
    let mut stream = resp.bytes_stream();
    let mut buf = String::new();
    read_until(&mut stream, &mut buf, |b| chat_content(b).starts_with(CHUNKS[0])).await;
    assert!(!tagged_processes(&proxy.tag).is_empty());
    proxy.signal(libc::SIGTERM);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(proxy.child.try_wait().unwrap().is_none(), "still draining the stream");
    up.release();
    read_until(&mut stream, &mut buf, |b| b.contains("data: [DONE]")).await;
    assert_eq!(chat_content(&buf), ANSWER);
    let status = tokio::time::timeout(Duration::from_secs(15), proxy.child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status:?}: {}", proxy.stderr());
    let left = wait_gone(&proxy.tag, Duration::from_secs(5)).await;
    assert!(left.is_empty(), "processes left: {left:?}");
}

// ---------------------------------------------------------------- official clients

/// The Python of a venv under `target/` with the official `openai` package
/// (`tests/python/requirements.txt`), created on first use (`.ci/run`
/// creates it up front). An error when Python or the install is missing.
pub fn python_openai() -> Result<PathBuf, String> {
    let venv = std::path::Path::new(ROOT).join("target/py-openai");
    let python = venv.join("bin/python");
    let has_openai = |p: &std::path::Path| {
        std::process::Command::new(p).args(["-c", "import openai"]).output().is_ok_and(|o| o.status.success())
    };
    if python.exists() && has_openai(&python) {
        return Ok(python);
    }
    let made = std::process::Command::new("python3").args(["-m", "venv"]).arg(&venv).output();
    match made {
        Ok(o) if o.status.success() => {}
        Ok(o) => return Err(format!("python3 -m venv failed: {}", String::from_utf8_lossy(&o.stderr))),
        Err(e) => return Err(format!("python3 not found: {e}")),
    }
    let requirements = std::path::Path::new(ROOT).join("tests/python/requirements.txt");
    let pip = std::process::Command::new(venv.join("bin/pip")).args(["install", "-q", "-r"]).arg(requirements).output();
    match pip {
        Ok(o) if o.status.success() && has_openai(&python) => Ok(python),
        other => Err(format!("pip install openai failed: {other:?}")),
    }
}

/// Checks what the upstream saw from an official client: four requests
/// (chat, chat streamed, responses, responses streamed), each with bob's
/// context first and once, and the client's own user agent.
fn check_official_client_requests(seen: &[Seen], expected: &str, agent: &str) {
    assert_eq!(seen.len(), 4, "{seen:#?}");
    for s in &seen[..2] {
        assert_eq!(s.path, "/v1/chat/completions");
        let msgs = s.body["messages"].as_array().unwrap();
        assert_eq!(msgs[0], json!({"role": "system", "content": expected, "name": "mcp_context"}));
        assert_eq!(msgs.iter().filter(|m| m["name"] == "mcp_context").count(), 1);
        assert_eq!(msgs[1], json!({"role": "user", "content": "What is new?"}));
        assert_eq!(s.headers["authorization"], "Bearer sk-upstream-1");
        assert!(s.headers["user-agent"].contains(agent), "{:?}", s.headers["user-agent"]);
    }
    assert_eq!(seen[1].body["stream"], true);
    for s in &seen[2..] {
        assert_eq!(s.path, "/v1/responses");
        assert_eq!(s.body["instructions"], format!("<mcp_context>\n{expected}\n</mcp_context>\n\nAnswer briefly."));
        assert_eq!(s.body["input"], "What is new?");
    }
    assert_eq!(seen[3].body["stream"], true);
}

const PY_CLIENT: &str = r#"
import json, sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1], api_key="key-bob")
out = {}
r = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "What is new?"}])
out["chat"] = r.choices[0].message.content
s = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "What is new?"}], stream=True)
out["chat_stream"] = "".join(c.choices[0].delta.content or "" for c in s if c.choices)
r = client.responses.create(model="gpt-4o", input="What is new?", instructions="Answer briefly.")
out["responses"] = r.output_text
s = client.responses.create(model="gpt-4o", input="What is new?", instructions="Answer briefly.", stream=True)
out["responses_stream"] = "".join(e.delta for e in s if e.type == "response.output_text.delta")
try:
    OpenAI(base_url=sys.argv[1], api_key="key-eve").chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
except Exception as e:
    out["error"] = [type(e).__name__, e.status_code, e.code]
print(json.dumps(out))
"#;

const NODE_CLIENT: &str = r#"
const OpenAI = require("openai");
(async () => {
  const client = new OpenAI({ baseURL: process.argv[1], apiKey: "key-bob" });
  const out = {};
  const r = await client.chat.completions.create({ model: "gpt-4o", messages: [{ role: "user", content: "What is new?" }] });
  out.chat = r.choices[0].message.content;
  const s = await client.chat.completions.create({ model: "gpt-4o", messages: [{ role: "user", content: "What is new?" }], stream: true });
  out.chat_stream = "";
  for await (const c of s) out.chat_stream += (c.choices[0] && c.choices[0].delta.content) || "";
  const rr = await client.responses.create({ model: "gpt-4o", input: "What is new?", instructions: "Answer briefly." });
  out.responses = rr.output_text;
  const rs = await client.responses.create({ model: "gpt-4o", input: "What is new?", instructions: "Answer briefly.", stream: true });
  out.responses_stream = "";
  for await (const e of rs) if (e.type === "response.output_text.delta") out.responses_stream += e.delta;
  try {
    await new OpenAI({ baseURL: process.argv[1], apiKey: "key-eve" }).chat.completions.create({ model: "gpt-4o", messages: [{ role: "user", content: "x" }] });
  } catch (e) {
    out.error = [e.constructor.name, e.status, e.code];
  }
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
"#;

fn check_client_output(stdout: &[u8], error_class: &str) {
    let out: Value = serde_json::from_slice(stdout).unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(stdout)));
    for k in ["chat", "chat_stream", "responses", "responses_stream"] {
        assert_eq!(out[k], ANSWER, "{k}: {out}");
    }
    assert_eq!(out["error"], json!([error_class, 401, "invalid_api_key"]), "{out}");
}

#[tokio::test]
async fn the_official_python_client_works_through_the_proxy() {
    let python = match tokio::task::spawn_blocking(python_openai).await.unwrap() {
        Ok(p) => p,
        Err(why) => return skip("the_official_python_client_works_through_the_proxy", &why),
    };
    let up = Upstream::start().await;
    let proxy = Proxy::start(&default_serve(), &up.base).await;
    let out = tokio::process::Command::new(python)
        .args(["-c", PY_CLIENT, &format!("{}/v1", proxy.url)])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    check_client_output(&out.stdout, "AuthenticationError");
    check_official_client_requests(&up.seen(), &proxy.preview("bob").unwrap(), "OpenAI/Python");
}

#[tokio::test]
async fn the_official_node_client_works_through_the_proxy() {
    let modules = std::path::Path::new(ROOT).join("tests/node/node_modules");
    let node_ok = std::process::Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success());
    if !node_ok || !modules.join("openai/package.json").exists() {
        return skip(
            "the_official_node_client_works_through_the_proxy",
            "node or tests/node/node_modules/openai missing (run `npm ci --prefix tests/node`)",
        );
    }
    let up = Upstream::start().await;
    let proxy = Proxy::start(&default_serve(), &up.base).await;
    let out = tokio::process::Command::new("node")
        .args(["-e", NODE_CLIENT, &format!("{}/v1", proxy.url)])
        .env("NODE_PATH", &modules)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    check_client_output(&out.stdout, "AuthenticationError");
    check_official_client_requests(&up.seen(), &proxy.preview("bob").unwrap(), "OpenAI/JS");
}

#[tokio::test]
async fn forward_authorization_sends_the_callers_own_key_and_the_body_can_name_the_user() {
    let up = Upstream::start().await;
    let proxy = Proxy::start("  forward_authorization: true\n  user_from_body: true\n", &up.base).await;
    let mut body = chat_body("hi");
    body["user"] = json!("carol");
    let r = proxy.post("/v1/chat/completions", Some("sk-callers-own"), &body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["x-mcp-context"].to_str().unwrap().starts_with("user=carol;"));
    // The Responses API names the user with `safety_identifier`.
    let r = proxy
        .post(
            "/v1/responses",
            Some("sk-callers-own"),
            &json!({"model": "gpt-4o", "input": "hi", "safety_identifier": "bob"}),
        )
        .send()
        .await
        .unwrap();
    assert!(r.headers()["x-mcp-context"].to_str().unwrap().starts_with("user=bob;"));
    // No identity in the body: 401, even though the upstream would accept the key.
    let r = proxy.post("/v1/chat/completions", Some("sk-callers-own"), &chat_body("x")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    // Passthrough: the upstream authenticates the caller itself.
    let r = http().get(format!("{}/v1/models", proxy.url)).bearer_auth("sk-callers-own").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let seen = up.seen();
    assert_eq!(seen.len(), 3);
    for s in &seen {
        assert_eq!(s.headers["authorization"], "Bearer sk-callers-own", "{}", s.path);
    }
    assert_eq!(seen[0].body["messages"][0]["content"].as_str(), proxy.preview("carol").as_deref());
    assert_eq!(seen[0].body["user"], "carol", "the body goes on unchanged apart from our message");

    // Neither a key nor forwarding: nothing is sent as credentials.
    let up2 = Upstream::start().await;
    let p2 = Proxy::start("  anonymous_user: guest\n", &up2.base).await;
    let r = p2.post("/v1/chat/completions", Some("sk-not-for-upstream"), &chat_body("x")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(!up2.seen()[0].headers.contains_key("authorization"));
}

/// `mcp_context::serve` mounted in an application's own axum router (beside
/// the application's own route): a real request through it reaches a real
/// local upstream with the caller's context in front, as with the binary.
#[tokio::test]
async fn the_proxy_mounts_in_an_applications_own_router() {
    use mcp_context::{ContextRequest, McpContext};
    let up = Upstream::start().await;
    let tag = tag();
    let yaml = format!(
        "servers:\n{}policy: {:?}\ncontext:\n  max_tokens: 4000\nserve:\n{}",
        demo_server("demo", &tag),
        policies_dir().join("default.yaml"),
        default_serve()
    );
    let config = config(&yaml);
    let ctx = Arc::new(McpContext::from_config(&config).await.unwrap());
    let proxy = mcp_context::serve::Proxy::new(ctx.clone(), &config, &up.base).unwrap();
    let app = Router::new().route("/app/health", axum::routing::get(|| async { "app ok" })).merge(proxy.router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let health = http().get(format!("{url}/app/health")).send().await.unwrap();
    assert_eq!(health.text().await.unwrap(), "app ok", "the application's own route still answers");
    let body = chat_body("how do I share a note?");
    let resp =
        http().post(format!("{url}/v1/chat/completions")).bearer_auth("key-alice").json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["x-mcp-context"].to_str().unwrap().starts_with("user=alice; tokens="));
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["choices"][0]["message"]["content"], ANSWER);
    let seen = up.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].headers["authorization"], "Bearer sk-upstream-1");
    let (message, _) = ctx.build(&ContextRequest::for_user("alice")).await.unwrap();
    let expected = message.expect("alice sees something").content;
    let msgs = seen[0].body["messages"].as_array().unwrap();
    assert_eq!(msgs[0], json!({"role": "system", "content": *expected, "name": "mcp_context"}));
    assert_eq!(msgs[1], body["messages"][0]);
    server.abort();
    ctx.close().await;
}
