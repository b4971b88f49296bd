//! Tests of the pipeline's shared steps (serve/pipeline.rs), each where it
//! can fail, through a probe adapter that records what it was asked, a real
//! proxy state and a real local upstream that records what it received.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, request::Parts};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::*;

/// What the probe adapter was asked, in order.
#[derive(Default)]
struct Probe {
    asked: Mutex<Vec<&'static str>>,
    continues: Vec<(Stored, String)>,
    stores: Option<Stored>,
}

impl Probe {
    fn ask(&self, what: &'static str) {
        self.asked.lock().unwrap().push(what);
    }
    fn asked(&self) -> Vec<&'static str> {
        self.asked.lock().unwrap().clone()
    }
}

impl Adapter for Probe {
    type Plan<'a> = ();
    fn upstream<'s>(&'s self, state: &'s AppState, _: &Parts) -> Result<&'s Upstream, ApiError> {
        self.ask("upstream");
        Ok(&state.upstream)
    }
    fn identity_headers<'h>(&self, headers: &'h HeaderMap) -> Result<Cow<'h, HeaderMap>, ApiError> {
        self.ask("identity");
        Ok(Cow::Borrowed(headers))
    }
    fn read<'a>(&self, obj: &JsonObject<'a>) -> Result<Reading<()>, ApiError> {
        self.ask("read");
        let mut r = Reading::new(None, obj.str_field("model"), ());
        r.continues = self.continues.clone();
        Ok(r)
    }
    fn place<'a>(&self, obj: &mut JsonObject<'a>, (): (), ours: Option<&ContextMessage>) -> Result<Chunks, ApiError> {
        self.ask("place");
        obj.set("ours", body::raw(&ours.is_some()));
        Ok(obj.to_chunks())
    }
    fn upstream_path(&self) -> Cow<'_, [&str]> {
        Cow::Borrowed(&["probe"])
    }
    fn upstream_label(&self) -> &'static str {
        "/probe"
    }
    fn credentials(&self, _: &HeaderMap, out: &mut HeaderMap) {
        self.ask("credentials");
        out.insert("x-probe-key", HeaderValue::from_static("operator"));
    }
    fn stores(&self, _: &JsonObject<'_>) -> Option<Stored> {
        self.stores
    }
    fn error(&self, e: ApiError) -> Response {
        let mut r = e.into_response();
        r.headers_mut().insert("x-probe-error", HeaderValue::from_static("1"));
        r
    }
}

/// What the upstream received: headers and body.
type Seen = Arc<Mutex<Vec<(HeaderMap, serde_json::Value)>>>;

/// A local upstream that records each request and answers `{"id": "resp_1"}`.
async fn upstream() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let s2 = seen.clone();
    let app = axum::Router::new().fallback(move |req: Request| {
        let seen = s2.clone();
        async move {
            let (parts, body) = req.into_parts();
            let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
            seen.lock().unwrap().push((parts.headers, serde_json::from_slice(&bytes).unwrap_or_default()));
            axum::Json(json!({"id": "resp_1"}))
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, seen)
}

/// A proxy state with alice's key, relaying to `base`.
async fn state(base: &str, extra: &str) -> Shared {
    let yaml = format!(
        "servers: {{}}\nserve:\n  keys:\n    - {{ sha256: {}, user: alice }}\n  upstream_api_key: sk-op\n{extra}",
        super::super::hash_key("key-alice")
    );
    let config = crate::Config::from_yaml(&yaml, std::path::Path::new("/tmp/c.yaml")).unwrap();
    let ctx = Arc::new(crate::McpContext::with_policy(&config, crate::Policy::allow_all()).await);
    super::super::Proxy::new(ctx, &config, base).unwrap().state
}

fn request(key: Option<&str>, body: &str) -> Request {
    let mut b = axum::http::Request::post("/v1/probe").header("content-type", "application/json");
    if let Some(k) = key {
        b = b.header("authorization", format!("Bearer {k}"));
    }
    let mut req = b.body(Body::from(body.to_owned())).unwrap();
    req.extensions_mut().insert(audit::Ids::of(&HeaderMap::new()));
    req
}

#[tokio::test]
async fn the_steps_run_in_order_and_the_upstream_gets_the_placed_body_with_our_headers() {
    let (base, seen) = upstream().await;
    let state = state(&base, "").await;
    let probe = Probe { stores: Some(Stored::Response), ..Probe::default() };
    let r = run(&state, request(Some("key-alice"), r#"{"model":"m","user":"mallory"}"#), "/v1/probe", &probe).await;
    assert_eq!(r.status(), 200);
    assert_eq!(probe.asked(), ["upstream", "identity", "read", "place", "credentials"]);
    // Headers: the report on the answer.
    assert!(r.headers()["x-mcp-context"].to_str().unwrap().starts_with("user=alice;"));
    let seen = seen.lock().unwrap().clone();
    let (headers, body) = &seen[0];
    assert_eq!(body, &json!({"model": "m", "user": "mallory", "ours": false}), "the adapter's body, as placed");
    assert_eq!(headers["authorization"], "Bearer sk-op", "the operator's key, never the caller's");
    assert_eq!(headers["x-probe-key"], "operator");
    assert_eq!(headers["content-type"], "application/json");
    assert!(headers.contains_key("traceparent"));
    // Ownership: what the upstream stored is the caller's, no one else's.
    assert!(matches!(state.owners.check(Stored::Response, "resp_1", "alice").await, Verdict::Owner));
    assert!(matches!(state.owners.check(Stored::Response, "resp_1", "bob").await, Verdict::NotOwner));
}

#[tokio::test]
async fn a_refused_identity_reads_no_body_and_answers_in_the_adapters_shape() {
    let (base, seen) = upstream().await;
    let state = state(&base, "").await;
    for key in [Some("key-eve"), None] {
        let probe = Probe::default();
        let r = run(&state, request(key, r#"{"model":"m"}"#), "/v1/probe", &probe).await;
        assert_eq!(r.status(), 401, "{key:?}");
        assert!(r.headers().contains_key("x-probe-error"));
        assert_eq!(probe.asked(), ["upstream", "identity"], "{key:?}");
    }
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_body_past_its_limits_or_not_json_is_refused_before_the_adapter_reads_it() {
    let (base, seen) = upstream().await;
    let state = state(&base, "  max_body_bytes: 64\n  max_body_fields: 2\n").await;
    for (body, status) in [
        (format!(r#"{{"model":"{}"}}"#, "m".repeat(100)), 413),
        (r#"{"a":1,"b":2,"c":3}"#.to_owned(), 400),
        ("not json".to_owned(), 400),
    ] {
        let probe = Probe::default();
        let r = run(&state, request(Some("key-alice"), &body), "/v1/probe", &probe).await;
        assert_eq!(r.status(), status, "{body}");
        assert_eq!(probe.asked(), ["upstream", "identity"], "{body}");
    }
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_continued_object_of_someone_else_is_a_404_and_nothing_is_built_or_sent() {
    let (base, seen) = upstream().await;
    let state = state(&base, "").await;
    state.owners.record(Stored::Response, "resp_bob", "bob").await;
    let probe = Probe { continues: vec![(Stored::Response, "resp_bob".into())], ..Probe::default() };
    let r = run(&state, request(Some("key-alice"), r#"{"model":"m"}"#), "/v1/probe", &probe).await;
    assert_eq!(r.status(), 404);
    assert_eq!(probe.asked(), ["upstream", "identity", "read"]);
    assert!(seen.lock().unwrap().is_empty());
    state.owners.record(Stored::Response, "resp_alice", "alice").await;
    let mine = Probe { continues: vec![(Stored::Response, "resp_alice".into())], ..Probe::default() };
    assert_eq!(run(&state, request(Some("key-alice"), "{}"), "/v1/probe", &mine).await.status(), 200);
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_502_in_the_adapters_shape() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let state = state(&format!("http://127.0.0.1:{port}/v1"), "").await;
    let probe = Probe::default();
    let r = run(&state, request(Some("key-alice"), "{}"), "/v1/probe", &probe).await;
    assert_eq!(r.status(), 502);
    assert!(r.headers().contains_key("x-probe-error"));
    assert_eq!(probe.asked(), ["upstream", "identity", "read", "place", "credentials"]);
}

#[test]
fn a_context_that_cannot_be_built_is_a_500_saying_why() {
    let e = build_failed("alice", crate::Error::serve("the cache is gone"));
    assert_eq!((e.status.as_u16(), e.code), (500, "context_failed"));
    assert!(e.message.contains("the cache is gone"), "{}", e.message);
    assert_eq!(verdict(Verdict::Unknown, Stored::Response, "r").unwrap_err().status, 503);
}
