//! Shared test fixtures: real MCP servers (the demo and the fault fixture
//! over stdio, the fixture over Streamable HTTP on loopback) and a real
//! OpenAI-compatible HTTP endpoint that records what went over the wire.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use mcp_context::Config;

pub use crate::handler::{Fixture, Options};

pub const MCP_CONTEXT: &str = env!("CARGO_BIN_EXE_mcp-context");

/// The `mcp-fixture` test server: a workspace member of its own
/// (`tests/fixture`), not a binary of the published package. `cargo test` at
/// the root builds it (default-members); a targeted run (`cargo test --test
/// all x`) may not have, so when it is missing or older than its sources the
/// first use builds it, into the same target folder and profile.
pub fn fixture_exe() -> &'static str {
    static EXE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    EXE.get_or_init(|| {
        // target/<profile>/deps/<test binary>
        let test_exe = std::env::current_exe().unwrap();
        let profile_dir = test_exe.parent().unwrap().parent().unwrap();
        let exe = profile_dir.join("mcp-fixture");
        let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let sources = ["tests/support/mcp_fixture.rs", "tests/support/fixture.rs", "tests/fixture/Cargo.toml"];
        let newest_source = sources.iter().filter_map(|s| modified(&Path::new(ROOT).join(s))).max();
        if modified(&exe).is_some_and(|built| newest_source.is_none_or(|src| built >= src)) {
            return exe.to_string_lossy().into_owned();
        }
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        let target_dir = profile_dir.parent().unwrap();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = std::process::Command::new(cargo);
        build.args(["build", "--quiet", "-p", "mcp-fixture", "--target-dir"]).arg(target_dir).current_dir(ROOT);
        if release {
            build.arg("--release");
        }
        let status = build.status().expect("cargo runs");
        assert!(status.success(), "building the mcp-fixture test server failed");
        exe.to_string_lossy().into_owned()
    })
}
pub const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Says a test cannot run here. On a developer's box that is a SKIPPED line;
/// under `CI=true` it is a failure, so a missing install step in `.ci/run`
/// cannot hide behind a skip.
pub fn skip(test: &str, why: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!("{test} cannot run: {why} (CI=true: .ci/run must provide it)");
    }
    eprintln!("SKIPPED {test}: {why}");
}

/// A unique tag for the processes a test starts (set as an env variable on
/// the server and inherited by its children), so tests can count them.
pub fn tag() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("t{}x{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst))
}

/// Live (non-zombie) processes carrying `MCP_TEST_TAG=tag` in their environment.
pub fn tagged_processes(tag: &str) -> Vec<u32> {
    let needle = format!("MCP_TEST_TAG={tag}");
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return out };
    for e in dir.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        if !env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) {
            continue;
        }
        if is_alive(pid) {
            out.push(pid);
        }
    }
    out
}

/// Each process as `pid state ppid pgrp: command line`, for failure messages.
pub fn describe_processes(pids: &[u32]) -> String {
    let one = |pid: &u32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let fields: Vec<&str> =
            stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().take(3).collect()).unwrap_or_default();
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        format!("{pid} {}: {}", fields.join(" "), cmd.trim_end())
    };
    pids.iter().map(one).collect::<Vec<_>>().join("; ")
}

/// Running or sleeping, not a zombie.
pub fn is_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(')').next().and_then(|r| r.split_whitespace().next()).unwrap_or("X");
            state != "Z" && state != "X"
        }
        Err(_) => false,
    }
}

/// Waits until no tagged process is alive (bounded), returning those left.
pub async fn wait_gone(tag: &str, within: Duration) -> Vec<u32> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let left = tagged_processes(tag);
        if left.is_empty() || tokio::time::Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// YAML for a stdio fixture server, pinned to 2025-11-25: the tests written
/// for that revision (`resources/subscribe`, answers without cache hints)
/// stay what they were; tests/all/protocol.rs covers 2026-07-28 and `auto`.
pub fn fixture_server(name: &str, tag: &str, args: &[&str]) -> String {
    fixture_server_base(name, tag, args) + "    protocol: \"2025-11-25\"\n"
}

/// YAML for a stdio fixture server with the default `protocol` (auto).
pub fn fixture_server_base(name: &str, tag: &str, args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|a| format!("{a:?}")).collect();
    format!(
        "  {name}:\n    command: {:?}\n    args: [{}]\n    env: {{ MCP_TEST_TAG: {tag:?} }}\n    timeout_ms: 20000\n",
        fixture_exe(),
        args.join(", ")
    )
}

/// YAML for the demo server (pinned to 2025-11-25, like [`fixture_server`]).
pub fn demo_server(name: &str, tag: &str) -> String {
    format!(
        "  {name}:\n    command: {MCP_CONTEXT:?}\n    args: [demo-server]\n    env: {{ MCP_TEST_TAG: {tag:?} }}\n    protocol: \"2025-11-25\"\n"
    )
}

/// Parses a config written in a test (paths relative to a temp folder).
pub fn config(yaml: &str) -> Config {
    Config::from_yaml(yaml, Path::new("/tmp/mcp-context-test.yaml")).expect("test config is valid")
}

/// Writes a config file into a fresh temp folder (for tests that run the CLI).
pub fn temp_config(yaml: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, yaml).unwrap();
    (dir, path)
}

pub fn policies_dir() -> PathBuf {
    Path::new(ROOT).join("policies")
}

/// A fixture over Streamable HTTP on 127.0.0.1 (ephemeral port). Returns the
/// URL and a guard that stops the server when dropped.
pub async fn http_fixture(opts: Options) -> (String, Fixture, tokio_util::sync::CancellationToken) {
    http_fixture_as(opts, false).await
}

/// [`http_fixture`], answering each request with one JSON body (stateless
/// mode) when `json`, with an SSE stream (sessions) otherwise.
pub async fn http_fixture_as(opts: Options, json: bool) -> (String, Fixture, tokio_util::sync::CancellationToken) {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    let ct = tokio_util::sync::CancellationToken::new();
    let fixture = Fixture::new(opts);
    let shared = fixture.clone();
    let service = StreamableHttpService::new(
        move || Ok(shared.clone()),
        LocalSessionManager::default().into(),
        if json {
            StreamableHttpServerConfig::default()
                .with_legacy_session_mode(false)
                .with_json_response(true)
                .with_cancellation_token(ct.child_token())
        } else {
            StreamableHttpServerConfig::default().with_cancellation_token(ct.child_token())
        },
    );
    let router = Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let stop = ct.clone();
    tokio::spawn(async move {
        let _ = axum::serve(nodelay(listener), router)
            .with_graceful_shutdown(async move { stop.cancelled_owned().await })
            .await;
    });
    (url, fixture, ct)
}

/// `listener` with `TCP_NODELAY` on its connections, as real servers set
/// it: without it, a streamed (SSE) answer's second write waits for the
/// client's delayed ACK (up to 40 ms a time on Linux).
pub fn nodelay(
    listener: tokio::net::TcpListener,
) -> axum::serve::TapIo<tokio::net::TcpListener, fn(&mut tokio::net::TcpStream)> {
    use axum::serve::ListenerExt;
    let tap: fn(&mut tokio::net::TcpStream) = |tcp| {
        let _ = tcp.set_nodelay(true);
    };
    listener.tap_io(tap)
}

/// How the fake LLM answers one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A plain JSON chat completion with this text.
    Text(String),
    /// An SSE stream of these chunks.
    Stream(Vec<String>),
    /// An SSE stream of these chunks that then stays open without `[DONE]`.
    StreamThenHang(Vec<String>),
    /// A tool call answer: (id, name, arguments).
    ToolCalls(Vec<(String, String, String)>),
    /// An HTTP error status with a body.
    Status(u16, String),
}

#[derive(Default)]
pub struct LlmState {
    pub requests: Vec<serde_json::Value>,
    pub replies: std::collections::VecDeque<Reply>,
    pub default: Option<Reply>,
    /// Answer this status when the last message contains the text.
    pub fail_on: Option<(String, u16)>,
}

/// A local OpenAI-compatible endpoint. `base` ends in `/v1`.
pub struct FakeLlm {
    pub base: String,
    pub state: Arc<Mutex<LlmState>>,
    stop: tokio_util::sync::CancellationToken,
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl FakeLlm {
    pub async fn start(default: Reply) -> FakeLlm {
        let state = Arc::new(Mutex::new(LlmState { default: Some(default), ..Default::default() }));
        let router = Router::new().route("/v1/chat/completions", post(handle)).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/v1", listener.local_addr().unwrap());
        let stop = tokio_util::sync::CancellationToken::new();
        let s2 = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(nodelay(listener), router)
                .with_graceful_shutdown(async move { s2.cancelled_owned().await })
                .await;
        });
        FakeLlm { base, state, stop }
    }

    pub fn push(&self, r: Reply) {
        self.state.lock().unwrap().replies.push_back(r);
    }

    pub fn requests(&self) -> Vec<serde_json::Value> {
        self.state.lock().unwrap().requests.clone()
    }

    pub fn client(&self) -> async_openai::Client<async_openai::config::OpenAIConfig> {
        async_openai::Client::with_config(
            async_openai::config::OpenAIConfig::new().with_api_base(&self.base).with_api_key("test-key"),
        )
    }
}

async fn handle(State(state): State<Arc<Mutex<LlmState>>>, body: String) -> Response {
    let json: serde_json::Value = serde_json::from_str(&body).unwrap_or(serde_json::Value::Null);
    let reply = {
        let mut s = state.lock().unwrap();
        s.requests.push(json.clone());
        let last =
            json["messages"].as_array().and_then(|m| m.last()).map(|m| m["content"].to_string()).unwrap_or_default();
        if let Some((needle, code)) = &s.fail_on
            && last.contains(needle.as_str())
        {
            return Reply::Status(*code, "upstream exploded".into()).into_response_for(&json);
        }
        s.replies.pop_front().or_else(|| s.default.clone()).unwrap_or(Reply::Text("ok".into()))
    };
    reply.into_response_for(&json)
}

fn sse_chunks(model: &str, chunks: Vec<String>) -> String {
    let mut body = String::new();
    for c in chunks {
        let chunk = serde_json::json!({
            "id": "chatcmpl-3", "object": "chat.completion.chunk", "created": 1, "model": model,
            "choices": [{"index": 0, "delta": {"content": c}}]
        });
        body.push_str(&format!("data: {chunk}\n\n"));
    }
    body
}

impl Reply {
    fn into_response_for(self, json: &serde_json::Value) -> Response {
        let model = json["model"].as_str().unwrap_or("gpt-4o").to_owned();
        match self {
            Reply::Text(t) => axum::Json(serde_json::json!({
                "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": t}, "finish_reason": "stop"}]
            }))
            .into_response(),
            Reply::ToolCalls(calls) => {
                let calls: Vec<_> = calls
                .iter()
                .map(|(id, name, args)| serde_json::json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}))
                .collect();
                axum::Json(serde_json::json!({
                "id": "chatcmpl-2", "object": "chat.completion", "created": 1, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": calls}, "finish_reason": "tool_calls"}]
            }))
            .into_response()
            }
            Reply::Stream(chunks) => {
                let mut body = sse_chunks(&model, chunks);
                body.push_str("data: [DONE]\n\n");
                ([(axum::http::header::CONTENT_TYPE, "text/event-stream")], body).into_response()
            }
            Reply::StreamThenHang(chunks) => {
                use futures::StreamExt;
                let first = sse_chunks(&model, chunks);
                let body = futures::stream::once(async move { Ok::<_, std::io::Error>(first) })
                    .chain(futures::stream::pending());
                ([(axum::http::header::CONTENT_TYPE, "text/event-stream")], axum::body::Body::from_stream(body))
                    .into_response()
            }
            Reply::Status(code, msg) => (
                StatusCode::from_u16(code).unwrap(),
                axum::Json(
                    serde_json::json!({"error": {"message": msg, "type": "server_error", "param": null, "code": null}}),
                ),
            )
                .into_response(),
        }
    }
}

/// Lines of a server-side read log (empty if the file does not exist).
pub fn read_log(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).map(|s| s.lines().map(str::to_owned).collect()).unwrap_or_default()
}

/// Polls `cond` every 20 ms for up to 5 s.
pub async fn eventually(mut cond: impl AsyncFnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// The port a test server wrote to `port_file` once listening (waits up to
/// 30 s; panics naming `what` when it never does).
pub async fn port_from_file(port_file: &Path, what: &str) -> u16 {
    for _ in 0..600 {
        if let Ok(p) = std::fs::read_to_string(port_file) {
            return p.trim().parse().unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what} did not start: no port in {}", port_file.display());
}

/// One of the `oidc-provider` fixtures in tests/oidc (`script`, with `env`),
/// and the JSON line it prints once listening; `None` (after [`skip`]) when
/// node or its packages are missing.
pub async fn start_oidc_fixture(
    test: &str,
    script: &str,
    env: &[(&str, String)],
) -> Option<(tokio::process::Child, serde_json::Value)> {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let dir = Path::new(ROOT).join("tests/oidc");
    if !dir.join("node_modules/oidc-provider").exists() {
        skip(test, "tests/oidc/node_modules is missing: run `npm ci --prefix tests/oidc`");
        return None;
    }
    let mut child = match tokio::process::Command::new("node")
        .arg(script)
        .current_dir(&dir)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            skip(test, &format!("node not found: {e}"));
            return None;
        }
    };
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await.unwrap().unwrap().unwrap();
    Some((child, serde_json::from_str(&line).unwrap()))
}
