//! Issue 47, items 6, 7 and 9, tried as an attacker would against the real
//! binary: idle and half-open sockets cannot hold `serve.max_connections`
//! (raw TCP, HTTP/1.1 and HTTP/2), one caller's or one server's NUL cannot
//! erase the PostgreSQL audit of everyone's requests (the machine's
//! PostgreSQL, a schema per test), and `/v1/messages` counts every
//! `cache_control` the Messages API accepts and follows a later one-hour TTL
//! (a local Messages stand-in recording the forwarded body).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::post;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::attack::{StoreUpstream, raw_http};
use crate::audit::{Schema, audit_yaml, count, metric, pg, pg_url, wait_until};
use crate::common::*;
use crate::messages::{Stand, breakpoints, our_block, post as post_messages, serve_yaml};
use crate::serve::{Proxy, Upstream, chat_body, default_serve, http};

// ------------------------------------------------------------ 6: idle connections

/// Whether the proxy closes `s` within `within` (EOF or a reset; bytes it sent first are skipped).
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let end = tokio::time::Instant::now() + within;
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(end, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// `max_connections: 8` held by 8 sockets that send nothing or only part of
/// an HTTP/2 preface (which hyper-util waits on before any HTTP timer ran):
/// once `header_timeout_ms` after their accept they are cut off, a real
/// caller's `/healthz` and chat request are served, and nothing of the
/// hostile sockets reached the upstream. Before: the 8 stayed open forever
/// and the caller was never served.
#[tokio::test]
async fn sockets_that_send_nothing_cannot_hold_the_connection_cap() {
    let up = StoreUpstream::start("/v1", "").await;
    let serve = format!("{}  max_connections: 8\n  header_timeout_ms: 1000\n", default_serve());
    let proxy = Proxy::start(&serve, &up.base).await;
    let addr = proxy.url.trim_start_matches("http://").to_owned();
    let mut hostile = Vec::new();
    for i in 0..8 {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        if i % 3 == 2 {
            // The first 20 bytes of the HTTP/2 preface, then nothing.
            s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM").await.unwrap();
        }
        hostile.push(s);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let healthz = raw_http(&proxy.url, "GET /healthz HTTP/1.1\nHost: {host}\nConnection: close\n\n", b"");
    let (status, _, _) = tokio::time::timeout(Duration::from_secs(8), healthz)
        .await
        .expect("a real caller is served once the idle sockets are cut off (8 s passed)");
    assert_eq!(status, 200);
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(4), "served after {waited:?}");
    let r = proxy.post("/v1/chat/completions", Some("key-alice"), &chat_body("hi")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    for (i, s) in hostile.iter_mut().enumerate() {
        assert!(closed_within(s, Duration::from_secs(2)).await, "hostile socket {i} is still open");
    }
    let got = up.got();
    assert_eq!(got.len(), 1, "only the real chat request reached the upstream: {got:#?}");
    assert_eq!(got[0].target, "/v1/chat/completions");
}

/// An HTTP/2 connection (prior knowledge) after one request, no stream open.
async fn h2_after_one_request(
    addr: &str,
) -> (hyper::client::conn::http2::SendRequest<String>, tokio::task::JoinHandle<Instant>) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let io = hyper_util::rt::TokioIo::new(tcp);
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io).await.unwrap();
    let ended = tokio::spawn(async move {
        let _ = conn.await;
        Instant::now()
    });
    let req = http::Request::get(format!("http://{addr}/healthz")).body(String::new()).unwrap();
    let r = send.send_request(req).await.unwrap();
    assert_eq!(r.status(), 200);
    (send, ended)
}

/// Keep-alive connections, HTTP/1.1 and HTTP/2, left idle after a request
/// are closed after `idle_timeout_ms` (2.5 s here, past the 1 s header
/// timeout: the two are distinct), not before; a next request's headers
/// begun and not finished are cut after `header_timeout_ms`; a request in
/// flight longer than both (an upstream 3 s slow, a stream paused 3 s) is
/// never cut. Before: an idle HTTP/2 connection stayed open forever, and an
/// idle HTTP/1.1 one was closed by hyper's header timer after 1 s.
#[tokio::test]
async fn idle_keep_alive_connections_are_closed_after_the_idle_timeout_and_requests_in_flight_never() {
    let up = Upstream::start().await;
    let serve = format!("{}  header_timeout_ms: 1000\n  idle_timeout_ms: 2500\n", default_serve());
    let proxy = Proxy::start(&serve, &up.base).await;
    let addr = proxy.url.trim_start_matches("http://").to_owned();

    // HTTP/1.1: one request, then nothing.
    let mut h1 = TcpStream::connect(&addr).await.unwrap();
    h1.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = h1.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
    let h1_idle = Instant::now();
    // HTTP/2: one request, then nothing.
    let (_send, h2_ended) = h2_after_one_request(&addr).await;
    let h2_idle = Instant::now();
    // HTTP/1.1: a request, then half of the next one's headers.
    let mut slow = TcpStream::connect(&addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let n = slow.read(&mut buf).await.unwrap();
    assert!(n > 0);
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ").await.unwrap();
    let slow_began = Instant::now();

    assert!(closed_within(&mut slow, Duration::from_millis(2200)).await, "the slow next headers were not cut");
    let cut = slow_began.elapsed();
    assert!(cut >= Duration::from_millis(900), "the slow headers were cut after {cut:?}, before the header timeout");

    assert!(
        !closed_within(&mut h1, Duration::from_millis(1800).saturating_sub(h1_idle.elapsed())).await,
        "closed early"
    );
    assert!(closed_within(&mut h1, Duration::from_secs(3)).await, "the idle HTTP/1.1 connection stayed open");
    let h1_after = h1_idle.elapsed();
    assert!(h1_after >= Duration::from_millis(2400), "closed after {h1_after:?}, before idle_timeout_ms");
    let h2_closed = tokio::time::timeout(Duration::from_secs(4), h2_ended)
        .await
        .expect("the idle HTTP/2 connection stayed open")
        .unwrap();
    let h2_after = h2_closed - h2_idle;
    assert!(h2_after >= Duration::from_millis(2400), "closed after {h2_after:?}, before idle_timeout_ms");

    // Requests in flight longer than both timeouts.
    let started = Instant::now();
    let r = proxy.post("/v1/chat/completions", Some("key-alice"), &chat_body("SLOW please")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains(crate::serve::ANSWER));
    assert!(started.elapsed() >= Duration::from_secs(3));
    let mut body = chat_body("GATE then wait");
    body["stream"] = json!(true);
    let r = proxy.post("/v1/chat/completions", Some("key-alice"), &body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let mut stream = r.bytes_stream();
    use futures::StreamExt;
    let first = stream.next().await.unwrap().unwrap();
    assert!(!first.is_empty());
    tokio::time::sleep(Duration::from_secs(3)).await;
    up.release();
    let mut rest = String::new();
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(10), stream.next()).await.unwrap() {
        rest.push_str(&String::from_utf8_lossy(&chunk.expect("the paused stream was not cut")));
    }
    assert!(rest.contains("[DONE]"), "{rest}");
    assert_eq!(up.finished(), 1);
}

/// Not a test: the proxy's RSS with 1024 sockets that send nothing against
/// the default `max_connections` (1024) and `header_timeout_ms` (10 s), and
/// how long a real caller then waits. For BENCHMARKS.md:
/// `cargo test --test all hardening::bench_idle_sockets -- --ignored --nocapture`.
#[tokio::test]
#[ignore]
async fn bench_idle_sockets() {
    let up = StoreUpstream::start("/v1", "").await;
    let proxy = Proxy::start(&default_serve(), &up.base).await;
    let pid = proxy.child.id().unwrap();
    let addr = proxy.url.trim_start_matches("http://").to_owned();
    let rss = || crate::attack::rss_kib(pid);
    // Warm: one request served.
    let (status, _, _) = raw_http(&proxy.url, "GET /healthz HTTP/1.1\nHost: {host}\nConnection: close\n\n", b"").await;
    assert_eq!(status, 200);
    let before = rss();
    let mut idle = Vec::new();
    for _ in 0..1024 {
        idle.push(TcpStream::connect(&addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = rss();
    let started = Instant::now();
    let healthz = raw_http(&proxy.url, "GET /healthz HTTP/1.1\nHost: {host}\nConnection: close\n\n", b"");
    let served = tokio::time::timeout(Duration::from_secs(30), healthz).await.ok().map(|r| r.0);
    let waited = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut closed = 0;
    for s in &mut idle {
        closed += usize::from(closed_within(s, Duration::from_millis(5)).await);
    }
    eprintln!(
        "idle sockets: RSS before {before} KiB, with 1024 idle {held} KiB (+{} KiB), after {} KiB; \
         a caller's /healthz: {served:?} after {waited:?}; {closed} of 1024 closed by the proxy",
        held.saturating_sub(before),
        rss()
    );
}

// ------------------------------------------------------------ 7: the PostgreSQL audit

/// An OpenAI-compatible upstream that answers no chat request until `n`
/// have arrived, then all at once: the proxy then submits their audit
/// records within a few milliseconds, so they go to PostgreSQL as one batch.
struct Barrier {
    base: String,
    models: Arc<Mutex<Vec<String>>>,
    stop: tokio_util::sync::CancellationToken,
}

impl Drop for Barrier {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

type BarrierState = (Arc<tokio::sync::Barrier>, Arc<Mutex<Vec<String>>>);

async fn barrier_chat(State((barrier, models)): State<BarrierState>, body: String) -> axum::response::Response {
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    models.lock().unwrap().push(v["model"].as_str().unwrap_or_default().to_owned());
    let _ = tokio::time::timeout(Duration::from_secs(20), barrier.wait()).await;
    axum::Json(json!({"id": "chatcmpl-b", "object": "chat.completion", "created": 1, "model": v["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}))
    .into_response()
}

impl Barrier {
    async fn start(n: usize) -> Barrier {
        let models = Arc::new(Mutex::new(Vec::new()));
        let state = (Arc::new(tokio::sync::Barrier::new(n)), models.clone());
        let router = Router::new().route("/v1/chat/completions", post(barrier_chat)).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/v1", listener.local_addr().unwrap());
        let stop = tokio_util::sync::CancellationToken::new();
        let s2 = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).with_graceful_shutdown(s2.cancelled_owned()).await;
        });
        Barrier { base, models, stop }
    }
}

/// 22 chat requests at once, 2 of alice's then 20 of bob's, each with its model; all answered 200.
async fn send_22(proxy: &Proxy, alice_models: [&str; 2], bob_models: &dyn Fn(usize) -> String) {
    let mut sent = Vec::new();
    for (i, model) in alice_models.iter().enumerate() {
        let body = json!({"model": model, "messages": [{"role": "user", "content": format!("alice {i}")}]});
        sent.push(proxy.post("/v1/chat/completions", Some("key-alice"), &body).send());
    }
    for i in 0..20 {
        let body = json!({"model": bob_models(i), "messages": [{"role": "user", "content": format!("bob {i}")}]});
        sent.push(proxy.post("/v1/chat/completions", Some("key-bob"), &body).send());
    }
    for r in futures::future::join_all(sent).await {
        assert_eq!(r.unwrap().status(), 200);
    }
}

async fn rows(db: &tokio_postgres::Client, sql: &str) -> Vec<String> {
    db.query(sql, &[]).await.unwrap().iter().map(|r| r.get(0)).collect()
}

/// A `model` of `"gpt-4o\u0000"` from alice and a resource URI with a NUL
/// from an MCP server (which only alice sees) go to PostgreSQL in the same
/// batch as bob's 20 records: all 22 are stored, each NUL as U+FFFD (in the
/// row and in the stored set of resources), and `audit who` finds alice by
/// that id; the JSONL file keeps the exact NULs. Before: PostgreSQL refused
/// the batch (`invalid byte sequence for encoding "UTF8": 0x00`) and bob's
/// records were lost with alice's.
#[tokio::test]
async fn a_nul_from_a_caller_or_a_server_costs_no_audit_record() {
    let test = "a_nul_from_a_caller_or_a_server_costs_no_audit_record";
    let Some(db) = pg(test).await else { return };
    let schema = Schema::new();
    let up = Barrier::start(22).await;
    let opts = Options { n: 1, size: 40, prefix: "nul\u{0}".into(), ..Default::default() };
    let (mcp, _fixture, _stop) = http_fixture(opts).await;
    let tag = tag();
    let body = format!(
        "servers:\n{}  nul:\n    url: {mcp}\npolicy: policies/\ncontext:\n  max_tokens: 4000\nserve:\n{}{}",
        demo_server("demo", &tag),
        default_serve(),
        audit_yaml(&schema.0, &pg_url(), "audit/injections.jsonl")
    );
    let proxy = Proxy::start_config(&body, &up.base, tag).await;
    send_22(&proxy, ["gpt-4o\u{0}", "gpt-4o"], &|_| "gpt-4o".into()).await;
    assert!(up.models.lock().unwrap().iter().any(|m| m == "gpt-4o\u{0}"), "the NUL model went upstream as sent");
    wait_until("22 rows", Duration::from_secs(20), async || count(&db, &schema.0).await == 22).await;
    let s = &schema.0;
    let bob: i64 = db
        .query_one(&format!("SELECT count(*) FROM \"{s}\".injections WHERE user_name = 'bob'"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(bob, 20, "bob's records are all there");
    let models =
        rows(&db, &format!("SELECT model FROM \"{s}\".injections WHERE user_name = 'alice' ORDER BY model")).await;
    assert_eq!(models, ["gpt-4o", "gpt-4o\u{FFFD}"], "the NUL is stored as U+FFFD");
    let nul_id = "nul:nul\u{FFFD}fx://doc/0";
    let sets = rows(&db, &format!("SELECT resources::text FROM \"{s}\".injections_sets")).await;
    assert!(sets.iter().any(|r| r.contains(nul_id)), "the server's URI, NUL replaced: {sets:?}");
    let included = rows(&db, &format!("SELECT included::text FROM \"{s}\".injections_sets")).await;
    assert!(included.iter().any(|r| r.contains(nul_id)), "{included:?}");
    let out = std::process::Command::new(MCP_CONTEXT)
        .args(["audit", "who", "--resource", nul_id, "--json", "--config"])
        .arg(&proxy.config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let who: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(who.iter().map(|r| r["user"].as_str().unwrap()).collect::<Vec<_>>(), ["alice", "alice"]);
    let m = http().get(format!("{}/metrics", proxy.url)).send().await.unwrap().text().await.unwrap();
    assert_eq!(metric(&m, r#"mcp_context_audit_records_total{sink="postgres",outcome="written"}"#), 22.0, "{m}");
    assert_eq!(metric(&m, r#"mcp_context_audit_records_total{sink="postgres",outcome="dropped"}"#), 0.0, "{m}");
    let file = std::fs::read_to_string(proxy.dir.path().join("audit/injections.jsonl")).unwrap();
    assert_eq!(file.lines().count(), 22);
    assert!(file.contains(r#""model":"gpt-4o\u0000""#), "the file keeps the exact value");
}

/// The operator's table refuses one record (a CHECK constraint on `model`):
/// only that record is dropped (counted in `/metrics`, a warning in the
/// log), the 21 others of its batch are stored and the sink stays up.
/// Before: the whole batch was dropped and the sink marked down.
#[tokio::test]
async fn a_record_the_database_refuses_costs_only_itself() {
    let test = "a_record_the_database_refuses_costs_only_itself";
    let Some(db) = pg(test).await else { return };
    let schema = Schema::new();
    let s = &schema.0;
    db.batch_execute(&format!(
        "CREATE SCHEMA \"{s}\"; CREATE TABLE \"{s}\".injections (id bigserial PRIMARY KEY, \
         model text NOT NULL DEFAULT '' CHECK (model <> 'refused-model'))"
    ))
    .await
    .unwrap();
    let up = Barrier::start(22).await;
    let serve = default_serve() + &audit_yaml(s, &pg_url(), "audit/injections.jsonl");
    let proxy = Proxy::start(&serve, &up.base).await;
    send_22(&proxy, ["gpt-4o", "gpt-4o"], &|i| if i == 7 { "refused-model".into() } else { "gpt-4o".into() }).await;
    let dropped = r#"mcp_context_audit_records_total{sink="postgres",outcome="dropped"}"#;
    let written = r#"mcp_context_audit_records_total{sink="postgres",outcome="written"}"#;
    let mut m = String::new();
    wait_until("22 records written or dropped", Duration::from_secs(20), async || {
        m = http().get(format!("{}/metrics", proxy.url)).send().await.unwrap().text().await.unwrap();
        metric(&m, dropped) + metric(&m, written) >= 22.0
    })
    .await;
    assert_eq!((metric(&m, written), metric(&m, dropped)), (21.0, 1.0), "{m}");
    assert!(m.contains(r#"mcp_context_audit_sink_up{sink="postgres"} 1"#), "{m}");
    assert_eq!(count(&db, s).await, 21);
    let bob: i64 = db
        .query_one(&format!("SELECT count(*) FROM \"{s}\".injections WHERE user_name = 'bob'"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(bob, 19, "bob's other 19 are stored");
    assert!(proxy.stderr().contains("refused 1 record(s)"), "{}", proxy.stderr());
}

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
