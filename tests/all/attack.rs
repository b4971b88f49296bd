//! `mcp-context serve` tried as an attacker would (issue 27): a guest's key
//! or no key at all, hostile paths, headers, bodies and user names, slow
//! senders, against the real binary with the demo policy (alice: staff, bob:
//! member, carol: hr) and an upstream that records every request as bytes
//! and implements OpenAI's stored-object endpoints. Assertions are on what
//! the upstream received, what the caller got back, the proxy's log and its
//! memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::serve::{Proxy, default_serve, http};

// ------------------------------------------------------------ the upstream

/// One request as the upstream received it: the raw body too.
#[derive(Clone, Debug)]
pub struct Got {
    pub method: String,
    /// Path and query as they arrived.
    pub target: String,
    pub headers: HashMap<String, String>,
    pub body: Bytes,
}

impl Got {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

#[derive(Default)]
struct StoreState {
    got: Vec<Got>,
    next: usize,
    /// id -> the stored object (what a read returns).
    objects: HashMap<String, Value>,
}

/// An OpenAI-compatible upstream mounted under `prefix` (e.g.
/// `/gateway/tenant-a/v1`) that stores chat completions (`store: true`),
/// Responses (unless `store: false`) and conversations, lists and returns
/// them, and answers 200 `{"reached": path}` to anything else.
pub struct StoreUpstream {
    pub base: String,
    state: Arc<Mutex<StoreState>>,
    stop: tokio_util::sync::CancellationToken,
}

impl Drop for StoreUpstream {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

type St = (Arc<Mutex<StoreState>>, Arc<str>);

impl StoreUpstream {
    pub async fn start(prefix: &str, query: &str) -> StoreUpstream {
        let state = Arc::new(Mutex::new(StoreState::default()));
        let router = Router::new().fallback(store_handler).with_state((state.clone(), Arc::from(prefix)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let stop = tokio_util::sync::CancellationToken::new();
        let s2 = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).with_graceful_shutdown(s2.cancelled_owned()).await;
        });
        StoreUpstream { base: format!("http://{addr}{prefix}{query}"), state, stop }
    }

    pub fn got(&self) -> Vec<Got> {
        self.state.lock().unwrap().got.clone()
    }
}

async fn store_handler(State((state, prefix)): State<St>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let got = Got {
        method: parts.method.to_string(),
        target: parts.uri.to_string(),
        headers: parts.headers.iter().map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned())).collect(),
        body: body.clone(),
    };
    let mut st = state.lock().unwrap();
    st.got.push(got.clone());
    let Some(rest) = parts.uri.path().strip_prefix(&*prefix) else {
        return axum::Json(json!({"reached": parts.uri.path()})).into_response();
    };
    let segs: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
    let req_body = got.json();
    let stream = req_body["stream"] == true;
    st.next += 1;
    let n = st.next;
    let sse = |frames: Vec<String>| ([("content-type", "text/event-stream")], frames.concat()).into_response();
    match (parts.method.as_str(), segs.as_slice()) {
        ("POST", ["chat", "completions"]) => {
            let id = format!("chatcmpl-{n}");
            if req_body["store"] == true {
                st.objects.insert(
                    id.clone(),
                    json!({"id": id, "object": "chat.completion", "messages": req_body["messages"]}),
                );
            }
            if stream {
                let chunk = json!({"id": id, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hi"}}]});
                return sse(vec![format!("data: {chunk}\n\n"), "data: [DONE]\n\n".into()]);
            }
            axum::Json(json!({"id": id, "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}]})).into_response()
        }
        ("GET", ["chat", "completions"]) => {
            let data: Vec<Value> = st.objects.values().filter(|o| o["object"] == "chat.completion").cloned().collect();
            axum::Json(json!({"object": "list", "data": data})).into_response()
        }
        ("GET", ["chat", "completions", id, "messages"]) => match st.objects.get(*id) {
            Some(o) => axum::Json(json!({"object": "list", "data": o["messages"]})).into_response(),
            None => not_found(),
        },
        (_, ["chat", "completions", id]) | (_, ["responses", id, ..]) | (_, ["conversations", id, ..]) => {
            match st.objects.get(*id) {
                Some(o) => axum::Json(o.clone()).into_response(),
                None => not_found(),
            }
        }
        ("POST", ["responses"]) => {
            let id = format!("resp_{n}");
            let object = json!({"id": id, "object": "response", "instructions": req_body["instructions"], "input": req_body["input"]});
            if req_body["store"] != false {
                st.objects.insert(id.clone(), object.clone());
            }
            if stream {
                let created = json!({"type": "response.created", "response": {"id": id}});
                let done = json!({"type": "response.completed", "response": object});
                return sse(vec![
                    format!("event: response.created\ndata: {created}\n\n"),
                    format!("event: response.completed\ndata: {done}\n\n"),
                ]);
            }
            axum::Json(object).into_response()
        }
        ("POST", ["conversations"]) => {
            let id = format!("conv_{n}");
            st.objects.insert(id.clone(), json!({"id": id, "object": "conversation", "items": req_body["items"]}));
            axum::Json(json!({"id": id, "object": "conversation"})).into_response()
        }
        _ => axum::Json(json!({"reached": parts.uri.path()})).into_response(),
    }
}

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, axum::Json(json!({"error": {"message": "not found", "type": "invalid_request_error"}})))
        .into_response()
}

// ------------------------------------------------------------ raw HTTP

/// A raw HTTP/1.1 request (what reqwest would normalise: dot segments,
/// encodings, duplicate headers), answered as (status, headers, body).
pub async fn raw_http(url: &str, head: &str, body: &[u8]) -> (u16, String, String) {
    let addr = url.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = head.replace("{host}", addr).replace('\n', "\r\n");
    if !req.contains("\r\n\r\n") {
        req.push_str("\r\n");
    }
    s.write_all(req.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let (headers, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = headers.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, headers.to_owned(), body.to_owned())
}

fn get(path: &str, key: &str) -> String {
    format!("GET {path} HTTP/1.1\nHost: {{host}}\nAuthorization: Bearer {key}\nConnection: close\n\n")
}

fn post_json(path: &str, key: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\nHost: {{host}}\nAuthorization: Bearer {key}\nContent-Type: application/json\n\
         Content-Length: {}\nConnection: close\n\n{body}",
        body.len()
    )
}

fn error_code(body: &str) -> String {
    let v: Value = serde_json::from_str(body.trim()).unwrap_or_else(|_| panic!("not JSON: {body}"));
    assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    v["error"]["code"].as_str().unwrap_or_default().to_owned()
}

pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

// ------------------------------------------------------------ 1, 7: paths

#[tokio::test]
async fn no_path_escapes_the_upstream_base_and_variants_never_skip_the_injection() {
    let up = StoreUpstream::start("/gateway/tenant-a/v1", "").await;
    let proxy = Proxy::start(&default_serve(), &up.base).await;
    let (mut refused, mut unmatched) = (0, 0);
    for (path, want) in [
        ("/v1/%2e%2e/%2e%2e/tenant-b/v1/files", 400),
        ("/v1/%2E%2E/%2E%2E/tenant-b/v1/models", 400),
        ("/v1/x/%2e%2e/chat/completions", 400),
        ("/v1/../../tenant-b/v1/models", 400),
        ("/v1/models/..%2f..%2fadmin", 400),
        ("/v1/models/%252e%252e", 400),
        ("/v1/models/a%5cb", 400),
        ("/v1/models\\..\\x", 400),
        ("/v1//models", 400),
        ("/v1/models/", 400),
        ("/v1/chat/completions/", 400),
        ("/v1/chat/./completions", 400),
        ("/v1/chat/completions;x", 400),
        ("/v1/Chat/Completions", 404),
        ("/v1/chat/completions/x/y", 404),
    ] {
        for method in ["GET", "POST"] {
            let head = format!(
                "{method} {path} HTTP/1.1\nHost: {{host}}\nAuthorization: Bearer key-bob\n\
                 Content-Type: application/json\nContent-Length: 2\nConnection: close\n\n{{}}"
            );
            let (status, _, body) = raw_http(&proxy.url, &head, b"").await;
            assert_eq!(status, want, "{method} {path}: {body}");
            // hyper itself refuses some request lines (a backslash) before any route.
            if !body.trim().is_empty() {
                let code = error_code(&body);
                match code.as_str() {
                    "invalid_path" => refused += 1,
                    "unknown_url" => unmatched += 1,
                    other => panic!("{method} {path}: {other}"),
                }
            }
        }
    }
    assert!(refused >= 24 && unmatched == 4, "{refused} {unmatched}");
    assert!(up.got().is_empty(), "refused paths reached the upstream: {:#?}", up.got());

    // The plain spellings reach the upstream under its base, with the injection.
    let (status, _, _) = raw_http(&proxy.url, &get("/v1/models", "key-bob"), b"").await;
    assert_eq!(status, 200);
    let chat = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let (status, _, _) = raw_http(&proxy.url, &post_json("/v1/chat/c%6Fmpletions", "key-bob", &chat), b"").await;
    assert_eq!(status, 200, "an encoded plain letter is the same route");
    let got = up.got();
    assert_eq!(got[0].target, "/gateway/tenant-a/v1/models");
    assert_eq!(got[1].target, "/gateway/tenant-a/v1/chat/completions");
    assert_eq!(got[1].json()["messages"][0]["name"], "mcp_context", "the variant was injected");

    let m = http().get(format!("{}/metrics", proxy.url)).send().await.unwrap().text().await.unwrap();
    assert!(
        m.contains(&format!("mcp_context_http_requests_total{{route=\"refused\",status=\"400\"}} {refused}")),
        "{m}"
    );
    assert!(m.contains("mcp_context_http_requests_total{route=\"unmatched\",status=\"404\"} 4"), "{m}");
    assert!(m.contains("mcp_context_http_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 1"), "{m}");
}

#[tokio::test]
async fn a_base_urls_query_stays_a_query() {
    let up = StoreUpstream::start("/openai/deployments/d", "?api-version=2024-10-21").await;
    let proxy = Proxy::start(&default_serve(), &up.base).await;
    let (status, _, _) = raw_http(&proxy.url, &get("/v1/models?limit=2", "key-bob"), b"").await;
    assert_eq!(status, 200);
    let chat = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let (status, _, _) = raw_http(&proxy.url, &post_json("/v1/chat/completions", "key-bob", &chat), b"").await;
    assert_eq!(status, 200);
    let got = up.got();
    assert_eq!(got[0].target, "/openai/deployments/d/models?api-version=2024-10-21&limit=2");
    assert_eq!(got[1].target, "/openai/deployments/d/chat/completions?api-version=2024-10-21");
}

// ------------------------------------------------------------ 2: allowlist

#[tokio::test]
async fn only_allowlisted_endpoints_are_relayed_with_the_operators_key() {
    let up = StoreUpstream::start("/v1", "").await;
    let proxy = Proxy::start(&format!("{}  anonymous_user: guest\n", default_serve()), &up.base).await;
    let c = http();
    for (method, path) in [
        ("GET", "/v1/files"),
        ("POST", "/v1/files"),
        ("DELETE", "/v1/files/file-1"),
        ("POST", "/v1/batches"),
        ("POST", "/v1/fine_tuning/jobs"),
        ("GET", "/v1/organization/users"),
        ("GET", "/v1/organization/admin_api_keys"),
        ("DELETE", "/v1/models/gpt-4o"),
        ("POST", "/v1/models"),
        ("GET", "/v1/vector_stores"),
    ] {
        for key in [Some("key-alice"), None] {
            let mut r = c.request(method.parse().unwrap(), format!("{}{path}", proxy.url));
            if let Some(k) = key {
                r = r.bearer_auth(k);
            }
            let r = r.header("content-type", "application/json").body("{}").send().await.unwrap();
            assert_eq!(r.status(), 404, "{method} {path} {key:?}");
            assert_eq!(error_code(&r.text().await.unwrap()), "unknown_url");
        }
    }
    assert!(up.got().is_empty(), "{:#?}", up.got());
    for (method, path, body) in [
        ("GET", "/v1/models", ""),
        ("GET", "/v1/models/gpt-4o", ""),
        ("POST", "/v1/embeddings", r#"{"input":"x"}"#),
        ("POST", "/v1/moderations", r#"{"input":"x"}"#),
    ] {
        let mut r = c.request(method.parse().unwrap(), format!("{}{path}", proxy.url)).bearer_auth("key-bob");
        if !body.is_empty() {
            r = r.header("content-type", "application/json").body(body);
        }
        assert_eq!(r.send().await.unwrap().status(), 200, "{method} {path}");
    }
    let got = up.got();
    let methods: Vec<&str> = got.iter().map(|g| g.method.as_str()).collect();
    assert_eq!(methods, ["GET", "GET", "POST", "POST"]);
    assert!(got.iter().all(|g| g.headers["authorization"] == "Bearer sk-upstream-1"));

    // An operator opens more, by method and pattern.
    let up2 = StoreUpstream::start("/v1", "").await;
    let serve = format!("{}  passthrough:\n    - \"GET /v1/files\"\n    - \"GET /v1/files/*\"\n", default_serve());
    let p2 = Proxy::start(&serve, &up2.base).await;
    assert_eq!(c.get(format!("{}/v1/files", p2.url)).bearer_auth("key-bob").send().await.unwrap().status(), 200);
    assert_eq!(c.get(format!("{}/v1/files/f-1", p2.url)).bearer_auth("key-bob").send().await.unwrap().status(), 200);
    let r = c.delete(format!("{}/v1/files/f-1", p2.url)).bearer_auth("key-bob").send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(up2.got().len(), 2);
}

// ------------------------------------------------------------ 3: stored objects

/// Alice stores a chat completion (plain and streamed), two Responses and a
/// conversation; returns their ids.
async fn alice_stores(proxy: &Proxy) -> Vec<(&'static str, String)> {
    let c = http();
    let mut ids = Vec::new();
    for stream in [false, true] {
        let body = json!({"model": "gpt-4o", "store": true, "stream": stream,
            "messages": [{"role": "user", "content": "alice's question"}]});
        let r = proxy.post("/v1/chat/completions", Some("key-alice"), &body).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap();
        let id = text.split("chatcmpl-").nth(1).unwrap().split('"').next().unwrap();
        ids.push(("chat", format!("chatcmpl-{id}")));
        let body = json!({"model": "gpt-4o", "stream": stream, "input": "alice's question"});
        let text = proxy.post("/v1/responses", Some("key-alice"), &body).send().await.unwrap().text().await.unwrap();
        let id = text.split("resp_").nth(1).unwrap().split('"').next().unwrap();
        ids.push(("response", format!("resp_{id}")));
    }
    let r = c
        .post(format!("{}/v1/conversations", proxy.url))
        .bearer_auth("key-alice")
        .json(&json!({"items": [{"role": "user", "content": "alice's secret turn"}]}))
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    ids.push(("conversation", v["id"].as_str().unwrap().to_owned()));
    ids
}

/// The reads of each kind of object, as (method, path).
fn reads(kind: &str, id: &str) -> Vec<(&'static str, String)> {
    match kind {
        "chat" => vec![
            ("GET", format!("/v1/chat/completions/{id}")),
            ("GET", format!("/v1/chat/completions/{id}/messages")),
            ("POST", format!("/v1/chat/completions/{id}")),
            ("DELETE", format!("/v1/chat/completions/{id}")),
        ],
        "response" => vec![
            ("GET", format!("/v1/responses/{id}")),
            ("GET", format!("/v1/responses/{id}/input_items")),
            ("POST", format!("/v1/responses/{id}/cancel")),
            ("DELETE", format!("/v1/responses/{id}")),
        ],
        _ => vec![
            ("GET", format!("/v1/conversations/{id}")),
            ("GET", format!("/v1/conversations/{id}/items")),
            ("POST", format!("/v1/conversations/{id}/items")),
            ("DELETE", format!("/v1/conversations/{id}")),
        ],
    }
}

async fn call(proxy: &Proxy, method: &str, path: &str, key: &str) -> (u16, String) {
    let mut r = http().request(method.parse().unwrap(), format!("{}{path}", proxy.url)).bearer_auth(key);
    if method == "POST" {
        r = r.json(&json!({"metadata": {"k": "v"}}));
    }
    let r = r.send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test]
async fn stored_conversations_are_each_callers_own() {
    let up = StoreUpstream::start("/v1", "").await;
    let proxy = Proxy::start(&default_serve(), &up.base).await;
    let ids = alice_stores(&proxy).await;
    let before = up.got().len();

    // Bob: every read, update, delete of alice's objects is the 404 of a missing id, and never relayed.
    let (_, missing) = call(&proxy, "GET", "/v1/responses/resp_999999", "key-bob").await;
    for (kind, id) in &ids {
        for (method, path) in reads(kind, id) {
            let (status, body) = call(&proxy, method, &path, "key-bob").await;
            assert_eq!(status, 404, "bob {method} {path}: {body}");
            assert!(!body.contains("alice"), "{body}");
            assert_eq!(error_code(&body), "not_found");
            if *kind == "response" && method == "GET" && !path.ends_with("items") {
                assert_eq!(body.replace(id.as_str(), "ID"), missing.replace("resp_999999", "ID"), "same as missing");
            }
        }
    }
    // Listings would show alice's: not relayed.
    for path in ["/v1/chat/completions", "/v1/responses", "/v1/conversations"] {
        let (status, body) = call(&proxy, "GET", path, "key-bob").await;
        assert_eq!(status, 404, "{path}: {body}");
    }
    // Continuing alice's Response or conversation.
    let resp = &ids.iter().find(|(k, _)| *k == "response").unwrap().1;
    let conv = &ids.iter().find(|(k, _)| *k == "conversation").unwrap().1;
    for extra in
        [json!({"previous_response_id": resp}), json!({"conversation": conv}), json!({"conversation": {"id": conv}})]
    {
        let mut body = json!({"model": "gpt-4o", "input": "continue"});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let r = proxy.post("/v1/responses", Some("key-bob"), &body).send().await.unwrap();
        assert_eq!(r.status(), 404, "{extra}");
    }
    assert_eq!(up.got().len(), before, "nothing of bob's reached the upstream: {:#?}", &up.got()[before..]);

    // Alice reads hers (the first of each kind), continues her Response.
    for (kind, id) in ids.iter().take(3) {
        let (method, path) = &reads(kind, id)[0];
        let (status, body) = call(&proxy, method, path, "key-alice").await;
        assert_eq!(status, 200, "alice {path}: {body}");
    }
    let body = json!({"model": "gpt-4o", "input": "continue", "previous_response_id": resp});
    assert_eq!(proxy.post("/v1/responses", Some("key-alice"), &body).send().await.unwrap().status(), 200);
    // `store: false` leaves no record: nobody can read it back (the upstream has none either).
    let body = json!({"model": "gpt-4o", "input": "x", "store": false});
    let v: Value = proxy.post("/v1/responses", Some("key-alice"), &body).send().await.unwrap().json().await.unwrap();
    let (status, _) = call(&proxy, "GET", &format!("/v1/responses/{}", v["id"].as_str().unwrap()), "key-alice").await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn the_official_python_client_gets_not_found_for_another_callers_response() {
    let python = std::path::Path::new(crate::common::ROOT).join("target/py-openai/bin/python");
    if !python.exists() {
        return crate::common::skip(
            "the_official_python_client_gets_not_found_for_another_callers_response",
            "target/py-openai missing (.ci/run creates it)",
        );
    }
    let up = StoreUpstream::start("/v1", "").await;
    let proxy = Proxy::start(&default_serve(), &up.base).await;
    let script = r#"
import json, sys, openai
url = sys.argv[1]
alice = openai.OpenAI(base_url=url, api_key="key-alice")
bob = openai.OpenAI(base_url=url, api_key="key-bob")
r = alice.responses.create(model="gpt-4o", input="alice's question")
out = {"own": alice.responses.retrieve(r.id).id == r.id}
try:
    bob.responses.retrieve(r.id)
    out["bob"] = "read it"
except openai.NotFoundError as e:
    out["bob"] = "not found"
try:
    bob.responses.create(model="gpt-4o", input="go on", previous_response_id=r.id)
    out["continue"] = "continued"
except openai.NotFoundError:
    out["continue"] = "not found"
print(json.dumps(out))
"#;
    let out =
        tokio::process::Command::new(python).args(["-c", script, &format!("{}/v1", proxy.url)]).output().await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v, json!({"own": true, "bob": "not found", "continue": "not found"}));
    assert_eq!(up.got().len(), 2, "bob's two requests never reached the upstream");
}

// ------------------------------------------------------------ 4: bodies before identity

#[tokio::test]
async fn unauthenticated_slow_bodies_and_slow_headers_cannot_hold_the_proxy() {
    let up = StoreUpstream::start("/v1", "").await;
    let serve = format!("{}  header_timeout_ms: 1000\n  body_timeout_ms: 1500\n", default_serve());
    let proxy = Proxy::start(&serve, &up.base).await;
    let pid = proxy.child.id().unwrap();
    let addr = proxy.url.trim_start_matches("http://").to_owned();
    let before = rss_kib(pid);

    // No key, a 9 MiB body declared, sent at a trickle on 20 connections: 401 at once, nothing read.
    let mut trickles = Vec::new();
    for _ in 0..20 {
        let addr = addr.clone();
        trickles.push(tokio::spawn(async move {
            let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
            let head = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\n\r\n",
                9 << 20
            );
            s.write_all(head.as_bytes()).await.unwrap();
            let mut answer = vec![0u8; 512];
            let started = std::time::Instant::now();
            // Trickle until the proxy answers.
            loop {
                tokio::select! {
                    n = s.read(&mut answer) => {
                        let n = n.unwrap_or(0);
                        return (String::from_utf8_lossy(&answer[..n]).into_owned(), started.elapsed());
                    }
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {
                        if s.write_all(&[b'x'; 64]).await.is_err() {
                            return (String::new(), started.elapsed());
                        }
                    }
                }
            }
        }));
    }
    // 50 connections that never finish their headers (slowloris).
    let mut lorises = Vec::new();
    for _ in 0..50 {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ").await.unwrap();
        lorises.push(s);
    }
    // Meanwhile a real caller is served.
    let r = proxy.post("/v1/chat/completions", Some("key-alice"), &crate::serve::chat_body("hi")).send().await.unwrap();
    assert_eq!(r.status(), 200, "served while 70 hostile connections are open");
    for t in trickles {
        let (answer, took) = t.await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
        assert!(took < Duration::from_secs(5), "answered before the body was read: {took:?}");
    }
    // The slow headers are cut off after header_timeout_ms.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for mut s in lorises {
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.expect("closed by the proxy");
        assert!(n.is_ok(), "the connection ended");
    }
    let grown = rss_kib(pid).saturating_sub(before);
    assert!(grown < 40 << 10, "RSS grew by {grown} KiB");
    assert_eq!(up.got().len(), 1);
}

#[tokio::test]
async fn bodies_held_at_once_are_bounded_and_a_stalled_body_times_out() {
    let up = StoreUpstream::start("/v1", "").await;
    // Callers named by the body: only 4 MiB of their bodies at once; stalled bodies end after 1.5 s.
    let serve = "  upstream_api_key: sk-upstream-1\n  user_from_body: true\n  max_body_bytes: 3000000\n  \
                 max_unidentified_body_bytes: 4000000\n  body_timeout_ms: 1500\n";
    let proxy = Proxy::start(serve, &up.base).await;
    let addr = proxy.url.trim_start_matches("http://").to_owned();
    let pid = proxy.child.id().unwrap();
    let before = rss_kib(pid);
    let mut conns = Vec::new();
    for _ in 0..8 {
        let addr = addr.clone();
        conns.push(tokio::spawn(async move {
            let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
            let head = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
                 Content-Length: 2900000\r\n\r\n"
            );
            s.write_all(head.as_bytes()).await.unwrap();
            // 1.9 MB of a 2.9 MB body, then nothing; the answer may come while writing.
            let (mut rd, mut wr) = s.into_split();
            let writer = tokio::spawn(async move {
                let _ = wr.write_all(&vec![b' '; 1_900_000]).await;
                tokio::time::sleep(Duration::from_secs(10)).await;
                drop(wr);
            });
            let mut out = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(10), rd.read_to_end(&mut out)).await;
            writer.abort();
            let text = String::from_utf8_lossy(&out).into_owned();
            text.split(' ').nth(1).unwrap_or("none").to_owned()
        }));
    }
    let mut statuses = Vec::new();
    for c in conns {
        statuses.push(c.await.unwrap());
    }
    assert!(statuses.iter().all(|s| s == "503" || s == "408"), "{statuses:?}");
    assert!(statuses.iter().any(|s| s == "503"), "the budget refused some: {statuses:?}");
    assert!(statuses.iter().any(|s| s == "408"), "the stalled ones timed out: {statuses:?}");
    let grown = rss_kib(pid).saturating_sub(before);
    assert!(grown < 40 << 10, "RSS grew by {grown} KiB");
    // Once they are gone the budget is whole again.
    let body = json!({"model": "m", "user": "alice", "messages": [{"role": "user", "content": "x".repeat(2_000_000)}]});
    assert_eq!(proxy.post("/v1/chat/completions", None, &body).send().await.unwrap().status(), 200);
    assert!(up.got().len() == 1);
}

// ------------------------------------------------------------ 6, 8: names and identity

#[tokio::test]
async fn user_names_cannot_forge_log_lines_and_identity_edges_are_refused() {
    let up = StoreUpstream::start("/v1", "").await;
    let serve = format!("{}  user_from_body: true\n", default_serve());
    let proxy = Proxy::start(&serve, &up.base).await;
    let c = http();
    let url = format!("{}/v1/chat/completions", proxy.url);
    let forged =
        json!({"model": "m", "user": "x\nFAKE LOG LINE user=alice", "messages": [{"role": "user", "content": "hi"}]});
    let r = c.post(&url).json(&forged).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(error_code(&r.text().await.unwrap()), "invalid_user");
    let long = json!({"model": "m", "user": "u".repeat(300), "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(c.post(&url).json(&long).send().await.unwrap().status(), 400);
    let r = c.post(&url).header("X-Test-User", "a\tb").json(&crate::serve::chat_body("hi")).send().await.unwrap();
    assert_eq!(r.status(), 400, "a tab in the header's name");
    // A malformed Authorization is refused even with a user header that would identify someone.
    for auth in ["Basic YWxpY2U6eA==", "Bearer", "Bearer  ", "Token key-alice"] {
        let r = c.post(&url).header("authorization", auth).header("X-Test-User", "carol");
        let r = r.json(&crate::serve::chat_body("hi")).send().await.unwrap();
        assert_eq!(r.status(), 401, "{auth:?}");
    }
    // The user header twice (a gateway that appends): 400, not the first one.
    let json_body = r#"{"messages":[{"role":"user","content":"x"}]}"#;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\nHost: {{host}}\nX-Test-User: carol\nX-Test-User: bob\n\
         Content-Type: application/json\nContent-Length: {}\nConnection: close\n\n{json_body}",
        json_body.len()
    );
    let (status, _, body) = raw_http(&proxy.url, &head, b"").await;
    assert_eq!(status, 400, "{body}");
    assert!(up.got().is_empty());
    // bob names alice in the body: the upstream hears bob.
    let mut body = crate::serve::chat_body("hi");
    body["user"] = json!("alice");
    body["safety_identifier"] = json!("alice");
    let r = proxy.post("/v1/chat/completions", Some("key-bob"), &body).send().await.unwrap();
    assert!(r.headers()["x-mcp-context"].to_str().unwrap().starts_with("user=bob;"));
    let got = up.got();
    assert_eq!(
        (got[0].json()["user"].clone(), got[0].json()["safety_identifier"].clone()),
        (json!("bob"), json!("bob"))
    );
    let log = proxy.stderr();
    assert!(!log.lines().any(|l| l.starts_with("FAKE")), "{log}");

    // A stable pseudonym, or nothing, when configured so.
    let up2 = StoreUpstream::start("/v1", "").await;
    let serve = format!("{}  upstream_user: pseudonym\n  pseudonym_key: k-0123456789abcdef\n", default_serve());
    let p2 = Proxy::start(&serve, &up2.base).await;
    for _ in 0..2 {
        p2.post("/v1/chat/completions", Some("key-bob"), &body).send().await.unwrap();
    }
    let got = up2.got();
    let pseud = got[0].json()["user"].as_str().unwrap().to_owned();
    assert_eq!(pseud.len(), 64);
    assert!(!pseud.contains("bob") && !pseud.contains("alice"));
    assert_eq!(got[1].json()["user"], pseud.as_str(), "stable");
    let up3 = StoreUpstream::start("/v1", "").await;
    let p3 = Proxy::start(&format!("{}  upstream_user: drop\n", default_serve()), &up3.base).await;
    p3.post("/v1/chat/completions", Some("key-bob"), &body).send().await.unwrap();
    let sent = up3.got()[0].json();
    assert!(sent.get("user").is_none() && sent.get("safety_identifier").is_none(), "{sent}");
}

// ------------------------------------------------------------ 9: browsers

#[tokio::test]
async fn a_web_page_cannot_reach_a_loopback_proxy() {
    let up = StoreUpstream::start("/v1", "").await;
    let proxy = Proxy::start("  upstream_api_key: sk-upstream-1\n  anonymous_user: guest\n", &up.base).await;
    let c = http();
    let url = format!("{}/v1/chat/completions", proxy.url);
    let body = crate::serve::chat_body("hi").to_string();
    // A form or fetch() "simple request": text/plain, form-encoded, no type.
    for ct in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"] {
        let r = c.post(&url).header("content-type", ct).body(body.clone()).send().await.unwrap();
        assert_eq!(r.status(), 415, "{ct}");
    }
    assert_eq!(c.post(&url).body(body.clone()).send().await.unwrap().status(), 415);
    // DNS rebinding: the page's own name in Host.
    let port = proxy.url.rsplit(':').next().unwrap();
    for host in [format!("evil.example:{port}"), "localhost.evil.example".into(), format!("127.0.0.2:{port}")] {
        let r = c.post(&url).header("host", &host).header("content-type", "application/json").body(body.clone());
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), 400, "{host}");
        assert_eq!(error_code(&r.text().await.unwrap()), "invalid_host");
    }
    assert!(up.got().is_empty());
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        let r = c.post(&url).header("host", &host).header("content-type", "application/json; charset=utf-8");
        assert_eq!(r.body(body.clone()).send().await.unwrap().status(), 200, "{host}");
    }
    // A preflight gets no CORS permission.
    let r = c
        .request(reqwest::Method::OPTIONS, &url)
        .header("origin", "https://evil.example")
        .header("access-control-request-method", "POST")
        .send()
        .await
        .unwrap();
    assert!(r.headers().keys().all(|k| !k.as_str().starts_with("access-control-")), "{:?}", r.headers());
}

// ------------------------------------------------------------ 10: bytes unchanged

#[tokio::test]
async fn fields_the_proxy_does_not_own_go_upstream_byte_for_byte() {
    let up = StoreUpstream::start("/v1", "").await;
    let proxy = Proxy::start(&default_serve(), &up.base).await;
    let tail = r#""zeta":123456789012345678901234567890,"alpha":1.0,"nested":{"b":1e2,"a":[0.10,-0]},"s":"\u00e9\ud83d\ude00""#;
    let body = format!(r#"{{"model":"gpt-4o",{tail},"messages":[{{"role":"user","content":"hi"}}]}}"#);
    let (status, _, answer) = raw_http(&proxy.url, &post_json("/v1/chat/completions", "key-bob", &body), b"").await;
    assert_eq!(status, 200, "{answer}");
    let sent = String::from_utf8(up.got()[0].body.to_vec()).unwrap();
    assert!(sent.starts_with(&format!(r#"{{"model":"gpt-4o",{tail},"messages":[{{"role":"system""#)), "{sent}");
    assert!(sent.ends_with(r#"{"role":"user","content":"hi"}]}"#), "{sent}");

    // Responses: instructions that are not a string are refused, not replaced.
    let r = format!(r#"{{"model":"m","input":"hi","instructions":[{{"role":"system","content":"x"}}],{tail}}}"#);
    let (status, _, answer) = raw_http(&proxy.url, &post_json("/v1/responses", "key-bob", &r), b"").await;
    assert_eq!(status, 400);
    assert_eq!(error_code(&answer), "unsupported_instructions");
    let r = format!(r#"{{"model":"m","input":"hi","instructions":"Be brief.",{tail}}}"#);
    let (status, _, _) = raw_http(&proxy.url, &post_json("/v1/responses", "key-bob", &r), b"").await;
    assert_eq!(status, 200);
    let sent = String::from_utf8(up.got()[1].body.to_vec()).unwrap();
    assert!(sent.ends_with(&format!(r#"\n\nBe brief.",{tail}}}"#)), "{sent}");
    // A key twice: the proxy and the upstream could each read another one.
    let dup = r#"{"model":"m","messages":[],"messages":[{"role":"user","content":"x"}]}"#;
    let (status, _, answer) = raw_http(&proxy.url, &post_json("/v1/chat/completions", "key-bob", dup), b"").await;
    assert_eq!(status, 400);
    assert_eq!(error_code(&answer), "duplicate_key");
    assert_eq!(up.got().len(), 2);
}

// ------------------------------------------------------------ 11: what a guest learns

#[tokio::test]
async fn a_guest_learns_nothing_about_what_he_is_denied() {
    let up = StoreUpstream::start("/v1", "").await;
    let proxy = Proxy::start(&default_serve(), &up.base).await;
    let c = http();
    let v: Value = c.get(format!("{}/readyz", proxy.url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(v, json!({"status": "ready"}), "no policy path, server names or counts");
    let m = c.get(format!("{}/metrics", proxy.url)).send().await.unwrap().text().await.unwrap();
    assert!(!m.contains("shared_cache"), "no shared-cache series with the memory backend:\n{m}");
    let header = |key: &'static str| {
        let proxy = &proxy;
        async move {
            let r = proxy.post("/v1/chat/completions", Some(key), &crate::serve::chat_body("hi")).send().await.unwrap();
            r.headers()["x-mcp-context"].to_str().unwrap().to_owned()
        }
    };
    let (bob, alice) = (header("key-bob").await, header("key-alice").await);
    for h in [&bob, &alice] {
        assert!(!h.contains("excluded") && !h.contains("denied"), "{h}");
        assert!(h.contains("; over_budget=") && h.contains("; errors="), "{h}");
    }
    // The same keys for everybody: counts of what the caller's own context holds or lost, and the caller's own
    // identity source and roles (issue 34), nothing else.
    for h in [&bob, &alice] {
        let keys: Vec<&str> = h.split("; ").map(|kv| kv.split('=').next().unwrap()).collect();
        assert_eq!(
            keys,
            ["user", "tokens", "included", "truncated", "over_budget", "errors", "failed", "identity", "roles"],
            "{h}"
        );
    }

    // Details only when the operator asks for them.
    let p2 = Proxy::start(&format!("{}  readyz_details: true\n", default_serve()), &up.base).await;
    let v: Value = c.get(format!("{}/readyz", p2.url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(v["servers"][0]["name"], "demo");
}

#[tokio::test]
async fn replicas_on_one_redis_know_whose_object_it_is() {
    let url = std::env::var("MCP_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
    let mut redis =
        match redis::Client::open(url.as_str()).and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2))) {
            Ok(c) => c,
            Err(e) => {
                return crate::common::skip("replicas_on_one_redis_know_whose_object_it_is", &format!("no Redis: {e}"));
            }
        };
    let up = StoreUpstream::start("/v1", "").await;
    let t = crate::common::tag();
    let prefix = format!("mcp-context-test:{t}:");
    let body = format!(
        "servers:\n{}policy: policies/\ncontext:\n  max_tokens: 4000\ncache:\n  backend: redis\n  url: {url}\n  \
         key_prefix: \"{prefix}\"\nserve:\n{}",
        crate::common::demo_server("demo", &t),
        default_serve()
    );
    let a = Proxy::start_config(&body, &up.base, t.clone()).await;
    let b = Proxy::start_config(&body, &up.base, crate::common::tag()).await;
    let r = a.post("/v1/responses", Some("key-alice"), &json!({"model": "m", "input": "hi"})).send().await.unwrap();
    let id = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/responses/{id}");
    assert_eq!(call(&b, "GET", &path, "key-bob").await.0, 404, "bob on the other replica");
    assert_eq!(call(&b, "GET", &path, "key-alice").await.0, 200, "alice on the other replica");
    let key = format!("{prefix}owner:response:{id}");
    let ttl: i64 = redis::cmd("TTL").arg(&key).query(&mut redis).unwrap();
    assert!(ttl > 29 * 86_400 && ttl <= 30 * 86_400, "the record lives as long as the upstream keeps it: {ttl}");
    let stored: Vec<u8> = redis::cmd("GET").arg(&key).query(&mut redis).unwrap();
    assert!(!String::from_utf8_lossy(&stored).contains("alice"), "a digest, not the name");
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}*")).query(&mut redis).unwrap();
    if !keys.is_empty() {
        let _: () = redis::cmd("DEL").arg(keys).query(&mut redis).unwrap();
    }
}

#[tokio::test]
async fn open_connections_are_capped_and_a_slot_frees_when_a_slow_client_is_cut_off() {
    let up = StoreUpstream::start("/v1", "").await;
    let serve = format!("{}  max_connections: 3\n  header_timeout_ms: 1500\n", default_serve());
    let proxy = Proxy::start(&serve, &up.base).await;
    let addr = proxy.url.trim_start_matches("http://").to_owned();
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A fourth connection is not served while three are open…
    let started = std::time::Instant::now();
    let (status, _, _) = raw_http(&proxy.url, "GET /healthz HTTP/1.1\nHost: {host}\nConnection: close\n\n", b"").await;
    // …until the slow ones are cut off by the header timeout.
    assert_eq!(status, 200);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(900), "served at once: {waited:?}, so there is no cap");
    drop(held);
}
