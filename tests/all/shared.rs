//! The shared (Redis) content cache across replicas: real `mcp-context
//! serve` processes over one real Redis and one MCP server (the fixture over
//! Streamable HTTP, counting the reads it serves), with a recording upstream.
//! Assertions are on what reached the upstream, on the MCP server's read
//! count and on what Redis holds.
//!
//! Redis: `$MCP_TEST_REDIS_URL`, else 127.0.0.1:6379 (the project's machines
//! run one). Each test uses its own key prefix and deletes its keys. The
//! test that kills Redis starts its own `redis-server` on a free port.

use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::Value;

use crate::common::*;
use crate::serve::{Proxy, Upstream, chat_body, default_serve, http};

fn redis_url() -> String {
    std::env::var("MCP_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

/// A connection to the test Redis, or a skip (a failure under CI=true).
fn redis_or_skip(test: &str) -> Option<redis::Connection> {
    let url = redis_url();
    match redis::Client::open(url.as_str()).and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2))) {
        Ok(c) => Some(c),
        Err(e) => {
            skip(test, &format!("no Redis at {url}: {e}"));
            None
        }
    }
}

/// This run's key prefix; its keys are deleted when it is dropped.
struct Prefix {
    prefix: String,
    url: String,
}

impl Prefix {
    fn new(url: &str) -> Self {
        Self { prefix: format!("mcp-context-test:{}:", tag()), url: url.to_owned() }
    }

    fn keys(&self, conn: &mut redis::Connection) -> Vec<String> {
        redis::cmd("KEYS").arg(format!("{}*", self.prefix)).query(conn).unwrap_or_default()
    }
}

impl Drop for Prefix {
    fn drop(&mut self) {
        if let Ok(mut c) = redis::Client::open(self.url.as_str()).and_then(|c| c.get_connection()) {
            let keys = self.keys(&mut c);
            if !keys.is_empty() {
                let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query(&mut c);
            }
        }
    }
}

/// The MCP server is pinned to 2025-11-25: these tests wait for
/// `resources/subscribe` in the fixture's log. (The replica that once missed
/// a change under 2026-07-28 was the fixture's fault: it dropped a closed
/// listener by its JSON-RPC id, which another replica's open one shared.
/// Several replicas on 2026-07-28: `protocol::streamable_http_on_2026_07_28_with_listen`
/// and `bench_shared`.)
fn config(mcp_url: &str, redis_url: &str, prefix: &str) -> String {
    format!(
        "servers:\n  kb:\n    url: {mcp_url}\n    protocol: \"2025-11-25\"\ncontext:\n  max_tokens: 4000\n\
         cache:\n  backend: redis\n  url: {redis_url}\n  key_prefix: \"{prefix}\"\n  timeout_ms: 300\n\
         serve:\n{}  readyz_details: true\n",
        default_serve()
    )
}

async fn start(n: usize, mcp_url: &str, redis_url: &str, prefix: &str, upstream: &str) -> Vec<Proxy> {
    let body = config(mcp_url, redis_url, prefix);
    futures::future::join_all((0..n).map(|_| Proxy::start_config(&body, upstream, tag()))).await
}

/// One chat request as `user` through `proxy`; returns the system message
/// the upstream received with it.
async fn ask(proxy: &Proxy, up: &Upstream, user: &str, text: &str) -> String {
    let r = proxy.post("/v1/chat/completions", Some(&format!("key-{user}")), &chat_body(text)).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    let seen = up.seen();
    let req = seen.iter().rev().find(|s| s.body["messages"].to_string().contains(text)).expect("the upstream got it");
    let first = &req.body["messages"][0];
    assert_eq!(first["role"], "system", "{}", req.body);
    first["content"].as_str().unwrap().to_owned()
}

async fn metric(proxy: &Proxy, name: &str) -> f64 {
    let text = http().get(format!("{}/metrics", proxy.url)).send().await.unwrap().text().await.unwrap();
    let values: Vec<f64> =
        text.lines().filter(|l| l.starts_with(name)).filter_map(|l| l.rsplit(' ').next()?.parse().ok()).collect();
    assert!(!values.is_empty(), "no {name} in /metrics of {}:\n{text}", proxy.url);
    values.iter().sum()
}

/// The HTTP fixture serving only `fx://live` (`dir`/live.txt, starting as
/// `text`), which notifies subscribers of changes and logs to `dir`/reads.log.
async fn live_fixture(
    dir: &tempfile::TempDir,
    text: &str,
    timing: Options,
) -> (String, Fixture, tokio_util::sync::CancellationToken) {
    let live = dir.path().join("live.txt");
    std::fs::write(&live, text).unwrap();
    http_fixture(Options {
        n: 0,
        subscribe: true,
        live: Some(live.to_string_lossy().into_owned()),
        record: Some(dir.path().join("reads.log").to_string_lossy().into_owned()),
        ..timing
    })
    .await
}

/// Waits until the fixture has `n` subscriptions to fx://live (its log).
async fn subscribed(log: &std::path::Path, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while read_log(log).iter().filter(|l| l.as_str() == "subscribe fx://live").count() < n {
        assert!(tokio::time::Instant::now() < deadline, "{n} subscriptions: {:?}", read_log(log));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn ready(proxy: &Proxy) -> Value {
    http().get(format!("{}/readyz", proxy.url)).send().await.unwrap().json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_read_each_change_once_and_a_new_replica_starts_warm() {
    let Some(mut redis) = redis_or_skip("replicas_read_each_change_once_and_a_new_replica_starts_warm") else { return };
    let url = redis_url();
    let prefix = Prefix::new(&url);
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live.txt");
    let (mcp, fixture, _stop) =
        live_fixture(&dir, "version one of the live page", Options { delay_ms: 300, ..Options::default() }).await;
    let up = Upstream::start().await;
    let replicas = start(3, &mcp, &url, &prefix.prefix, &up.base).await;

    // A cold resource wanted by all three at once is read once.
    let first = futures::future::join_all(replicas.iter().enumerate().map(|(i, p)| {
        let up = &up;
        async move { ask(p, up, "alice", &format!("first question {i}")).await }
    }))
    .await;
    for m in &first {
        assert!(m.contains("version one of the live page"), "{m}");
    }
    assert_eq!(fixture.reads.load(Ordering::SeqCst), 1, "one read for three replicas");

    // A change pushed by the server (once every replica has subscribed: a
    // change before that reaches nobody): every replica drops its copy; the next
    // requests on all three carry the new content, for one more read.
    subscribed(&dir.path().join("reads.log"), 3).await;
    std::fs::write(&live, "version two of the live page").unwrap();
    for p in &replicas {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while metric(p, "mcp_context_shared_cache_invalidations_total{origin=\"local\"}").await < 1.0 {
            assert!(tokio::time::Instant::now() < deadline, "replica {} never saw the change: {}", p.url, p.stderr());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let second = futures::future::join_all(replicas.iter().enumerate().map(|(i, p)| {
        let up = &up;
        async move { ask(p, up, "alice", &format!("second question {i}")).await }
    }))
    .await;
    for m in &second {
        assert!(m.contains("version two of the live page") && !m.contains("version one"), "{m}");
    }
    assert_eq!(fixture.reads.load(Ordering::SeqCst), 2, "one read for the change, not one per replica");

    // A fourth replica serves its first request without any MCP read.
    let fourth = start(1, &mcp, &url, &prefix.prefix, &up.base).await;
    let m = ask(&fourth[0], &up, "alice", "a question for the new replica").await;
    assert!(m.contains("version two of the live page"), "{m}");
    assert_eq!(fixture.reads.load(Ordering::SeqCst), 2, "the new replica started warm");
    assert!(metric(&fourth[0], "mcp_context_shared_cache_hits_total").await >= 1.0);
    assert_eq!(metric(&fourth[0], "mcp_context_shared_cache_up").await, 1.0);

    // What Redis holds is under this run's prefix only.
    assert!(prefix.keys(&mut redis).iter().any(|k| k.starts_with(&format!("{}c:kb.", prefix.prefix))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_private_answer_is_never_served_to_another_user_on_any_replica() {
    let Some(mut redis) = redis_or_skip("a_private_answer_is_never_served_to_another_user_on_any_replica") else {
        return;
    };
    let url = redis_url();
    let prefix = Prefix::new(&url);
    // One document whose read results say `cacheScope: private`.
    let (mcp, fixture, _stop) = http_fixture(Options { n: 1, size: 64, private: true, ..Options::default() }).await;
    let up = Upstream::start().await;
    let replicas = start(2, &mcp, &url, &prefix.prefix, &up.base).await;
    let reads = || fixture.reads.load(Ordering::SeqCst);

    let alice = ask(&replicas[0], &up, "alice", "alice asks on replica one").await;
    assert!(alice.contains("Document 0."), "{alice}");
    assert_eq!(reads(), 1);
    // Bob, on the other replica: alice's private answer is not his.
    ask(&replicas[1], &up, "bob", "bob asks on replica two").await;
    assert_eq!(reads(), 2, "bob's request read for bob");
    // Each user's own answer is shared across replicas.
    ask(&replicas[1], &up, "alice", "alice asks on replica two").await;
    ask(&replicas[0], &up, "bob", "bob asks on replica one").await;
    assert_eq!(reads(), 2, "each user's private answer came from Redis");

    // In Redis: one field per user, none public.
    let data: Vec<String> =
        prefix.keys(&mut redis).into_iter().filter(|k| k.starts_with(&format!("{}c:", prefix.prefix))).collect();
    assert_eq!(data.len(), 1, "{data:?}");
    let fields: Vec<String> = redis::cmd("HKEYS").arg(&data[0]).query(&mut redis).unwrap();
    assert_eq!(fields.iter().filter(|f| f.starts_with("u:")).count(), 2, "{fields:?}");
    // Token counts of private contents are private too (`d:u:…`).
    assert!(fields.iter().all(|f| f.starts_with("u:") || f.starts_with("d:u:")), "no public entry: {fields:?}");
}

/// What a replica computed from shared contents (token counts, chunks and
/// their terms) is stored next to them, and another replica uses it instead
/// of tokenising again, with a byte-identical result; a record that was not
/// computed from the same block is ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn token_counts_and_chunks_are_computed_once_for_all_replicas() {
    let Some(mut redis) = redis_or_skip("token_counts_and_chunks_are_computed_once_for_all_replicas") else {
        return;
    };
    let url = redis_url();
    let prefix = Prefix::new(&url);
    // 40 documents of ~150 tokens: far over the 4000-token budget, so
    // `auto` ranks chunks (relevance mode).
    let (mcp, fixture, _stop) = http_fixture(Options { n: 40, size: 2400, ..Options::default() }).await;
    let up = Upstream::start().await;
    let question = "which notes share the gamma sync";
    const USED: &str = "mcp_context_shared_cache_derived_total{outcome=\"used\"}";
    const STORED: &str = "mcp_context_shared_cache_derived_total{outcome=\"stored\"}";

    let first = start(1, &mcp, &url, &prefix.prefix, &up.base).await;
    let a = ask(&first[0], &up, "alice", question).await;
    assert!(a.contains("omitted"), "chunks were ranked, not whole documents: {a}");
    assert_eq!(fixture.reads.load(Ordering::SeqCst), 40);
    // Stored in the background, one record per document, public.
    assert!(eventually(async || metric(&first[0], STORED).await == 40.0).await, "40 records stored");
    let data: Vec<String> =
        prefix.keys(&mut redis).into_iter().filter(|k| k.starts_with(&format!("{}c:", prefix.prefix))).collect();
    assert_eq!(data.len(), 40);
    for k in &data {
        let fields: Vec<String> = redis::cmd("HKEYS").arg(k).query(&mut redis).unwrap();
        assert!(fields.iter().any(|f| f.starts_with("d:p:")), "{k}: {fields:?}");
    }

    // A second replica: contents and derived data from Redis, the same message.
    let second = start(1, &mcp, &url, &prefix.prefix, &up.base).await;
    let b = ask(&second[0], &up, "alice", question).await;
    assert_eq!(a, b, "byte-identical across replicas");
    assert_eq!(fixture.reads.load(Ordering::SeqCst), 40, "no MCP read");
    assert_eq!(metric(&second[0], USED).await, 40.0);

    // One document's record replaced by another's: computed from another
    // block, so it is ignored and that document is chunked again.
    let field = |k: &str, redis: &mut redis::Connection| -> String {
        let fields: Vec<String> = redis::cmd("HKEYS").arg(k).query(redis).unwrap();
        fields.into_iter().find(|f| f.starts_with("d:p:")).unwrap()
    };
    let (f0, f1) = (field(&data[0], &mut redis), field(&data[1], &mut redis));
    let other: Vec<u8> = redis::cmd("HGET").arg(&data[0]).arg(&f0).query(&mut redis).unwrap();
    let _: () = redis::cmd("HSET").arg(&data[1]).arg(&f1).arg(other).query(&mut redis).unwrap();
    let third = start(1, &mcp, &url, &prefix.prefix, &up.base).await;
    let c = ask(&third[0], &up, "alice", question).await;
    assert_eq!(a, c, "byte-identical with one document chunked locally");
    assert_eq!(metric(&third[0], USED).await, 39.0);
    // ... and its own record put in place of the wrong one.
    assert!(eventually(async || metric(&third[0], STORED).await == 1.0).await, "the wrong record replaced");
    let back: Vec<u8> = redis::cmd("HGET").arg(&data[1]).arg(&f1).query(&mut redis).unwrap();
    let theirs: Vec<u8> = redis::cmd("HGET").arg(&data[0]).arg(&f0).query(&mut redis).unwrap();
    assert_ne!(back, theirs);
}

/// A Redis of the test's own on a free port, so it can be killed.
struct OwnRedis {
    child: std::process::Child,
    port: u16,
}

impl OwnRedis {
    fn start(port: u16) -> Option<OwnRedis> {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let url = format!("redis://127.0.0.1:{port}/0");
        for _ in 0..200 {
            if redis::Client::open(url.as_str()).and_then(|c| c.get_connection()).is_ok() {
                return Some(OwnRedis { child, port });
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        None
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_redis_loses_no_request_and_it_is_used_again_when_back() {
    let test = "killing_redis_loses_no_request_and_it_is_used_again_when_back";
    let port = free_port();
    let Some(own) = OwnRedis::start(port) else {
        skip(test, "redis-server could not be started (install Debian's redis-server)");
        return;
    };
    let url = own.url();
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live.txt");
    std::fs::write(&live, "the live page").unwrap();
    let (mcp, _fixture, _stop) =
        http_fixture(Options { n: 3, size: 64, live: Some(live.to_string_lossy().into_owned()), ..Options::default() })
            .await;
    let up = Upstream::start().await;
    let replicas = start(2, &mcp, &url, "mcp-context-test:kill:", &up.base).await;
    for p in &replicas {
        ask(p, &up, "alice", &format!("warm-up on {}", p.url)).await;
        assert_eq!(ready(p).await["shared_cache"]["up"], true);
    }

    // Requests keep coming on both replicas while Redis dies.
    let mut own = Some(own);
    for i in 0..40 {
        if i == 10 {
            drop(own.take());
        }
        let p = &replicas[i % 2];
        let m = ask(p, &up, if i % 3 == 0 { "bob" } else { "alice" }, &format!("question {i} while Redis dies")).await;
        assert!(m.contains("the live page") && m.contains("Document 0."), "request {i}: {m}");
    }
    for p in &replicas {
        let r = ready(p).await;
        assert_eq!(r["shared_cache"]["up"], false, "{r}");
        assert_eq!(r["status"], "degraded", "{r}");
        let error = r["shared_cache"]["error"].as_str().unwrap_or_default().to_owned();
        eprintln!("readyz while Redis is down: {r}");
        assert!(error.contains(&format!("127.0.0.1:{port}")) && !error.contains("RedisError"), "{error}");
        assert_eq!(metric(p, "mcp_context_shared_cache_up").await, 0.0);
    }

    // Back on the same port: used again, and each replica, whose event
    // subscription was broken meanwhile, dropped its local entries (it may
    // have missed invalidations): its next request reads again.
    let misses: Vec<f64> =
        futures::future::join_all(replicas.iter().map(|p| metric(p, "mcp_context_cache_misses_total"))).await;
    let _back = OwnRedis::start(port).expect("redis-server restarts");
    let mut n = 0;
    for p in &replicas {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            n += 1;
            ask(p, &up, "carol", &format!("is it back yet, try {n}")).await;
            if ready(p).await["shared_cache"]["up"] == true {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{} never saw Redis back: {}", p.url, p.stderr());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    for (p, before) in replicas.iter().zip(misses) {
        ask(p, &up, "alice", &format!("after the resync on {}", p.url)).await;
        assert!(metric(p, "mcp_context_cache_misses_total").await > before, "{} kept its local entries", p.url);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_that_began_before_a_change_never_stores_the_old_content() {
    let Some(_redis) = redis_or_skip("a_read_that_began_before_a_change_never_stores_the_old_content") else { return };
    let url = redis_url();
    let prefix = Prefix::new(&url);
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live.txt");
    // Every read takes its content, then answers 800 ms later.
    let (mcp, _fixture, _stop) =
        live_fixture(&dir, "live version one", Options { answer_after_ms: 800, ..Options::default() }).await;
    let up = Upstream::start().await;
    let r = start(2, &mcp, &url, &prefix.prefix, &up.base).await;
    assert!(ask(&r[0], &up, "alice", "warm-up on one").await.contains("live version one"));
    assert!(ask(&r[1], &up, "alice", "warm-up on two").await.contains("live version one"));
    subscribed(&dir.path().join("reads.log"), 2).await;
    let local = "mcp_context_shared_cache_invalidations_total{origin=\"local\"}";
    let seen = |n: f64| {
        let r = &r;
        async move {
            for p in r {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                while metric(p, local).await < n {
                    assert!(tokio::time::Instant::now() < deadline, "{} never saw change {n}", p.url);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    };

    std::fs::write(&live, "live version two").unwrap();
    seen(1.0).await;
    // Replica one re-reads: the server takes version two, and while its
    // answer is on the way the content changes again.
    let slow = ask(&r[0], &up, "alice", "re-read on one");
    let change = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        std::fs::write(&live, "live version three").unwrap();
        seen(2.0).await;
    };
    let (old, ()) = tokio::join!(slow, change);
    assert!(old.contains("live version two"), "{old}");
    // The late answer was not stored: replica two reads the new content.
    let fresh = ask(&r[1], &up, "alice", "after the second change on two").await;
    assert!(fresh.contains("live version three"), "{fresh}");
    let again = ask(&r[0], &up, "alice", "after the second change on one").await;
    assert!(again.contains("live version three"), "{again}");
}

#[test]
fn an_unreachable_redis_is_reported_and_the_context_still_built() {
    let t = tag();
    let port = free_port();
    let (_dir, cfg) = temp_config(&format!(
        "servers:\n{}cache:\n  backend: redis\n  url: redis://:s3cret-pw@127.0.0.1:{port}/0\n",
        fixture_server("fx", &t, &["--n", "2", "--size", "32"])
    ));
    let out = std::process::Command::new(MCP_CONTEXT)
        .args(["preview", "--json", "--user", "alice", "--config"])
        .arg(&cfg)
        .env("MCP_TEST_TAG", &t)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("s3cret-pw"), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["message"]["content"].as_str().unwrap().contains("Document 1."), "{v}");
    let shared = &v["shared_cache"];
    assert_eq!(shared["up"], false, "{v}");
    let error = shared["error"].as_str().unwrap();
    assert!(error.contains(&format!("127.0.0.1:{port}")) && error.contains("connection refused"), "{error}");
    assert!(!error.contains("s3cret-pw") && !error.contains("RedisError"), "{error}");
}

/// A Redis that speaks only TLS, with a certificate for 127.0.0.1 signed by
/// a private CA (`ca.pem`), both made by `openssl`.
fn tls_redis(dir: &std::path::Path) -> Result<(std::process::Child, u16), String> {
    std::fs::write(dir.join("ext.cnf"), "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n").unwrap();
    let steps: [&[&str]; 3] = [
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=test-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ],
        &["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "key.pem", "-out", "req.csr"],
        &[
            "x509",
            "-req",
            "-in",
            "req.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            "cert.pem",
            "-extfile",
            "ext.cnf",
        ],
    ];
    for args in steps {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .map_err(|e| format!("openssl: {e}"))?;
        if !out.status.success() {
            return Err(format!("openssl: {}", String::from_utf8_lossy(&out.stderr)));
        }
    }
    let port = free_port();
    let child = std::process::Command::new("redis-server")
        .args(["--port", "0", "--tls-port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
        .args(["--tls-auth-clients", "no", "--tls-cert-file"])
        .arg(dir.join("cert.pem"))
        .arg("--tls-key-file")
        .arg(dir.join("key.pem"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("redis-server: {e}"))?;
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok((child, port));
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    Err("redis-server with TLS did not start".into())
}

#[test]
fn rediss_with_a_private_ca_is_used_and_an_untrusted_certificate_is_named() {
    let test = "rediss_with_a_private_ca_is_used_and_an_untrusted_certificate_is_named";
    let dir = tempfile::tempdir().unwrap();
    let (mut redis, port) = match tls_redis(dir.path()) {
        Ok(r) => r,
        Err(e) => return skip(test, &e),
    };
    let t = tag();
    let preview = |ca: bool| {
        let ca = if ca { format!("  ca_file: {}\n", dir.path().join("ca.pem").display()) } else { String::new() };
        let (_d, cfg) = temp_config(&format!(
            "servers:\n{}cache:\n  backend: redis\n  url: rediss://127.0.0.1:{port}/0\n  key_prefix: \"mcp-context-test:{t}:\"\n  timeout_ms: 2000\n{ca}",
            fixture_server("fx", &t, &["--n", "3", "--size", "32"])
        ));
        let out = std::process::Command::new(MCP_CONTEXT)
            .args(["preview", "--json", "--user", "alice", "--config"])
            .arg(&cfg)
            .env("MCP_TEST_TAG", &t)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    // Trusting the server's certificate: the first run fills Redis over
    // TLS, the second is answered from it.
    let first = preview(true);
    assert_eq!(first["shared_cache"]["hits"], 0, "{first}");
    let second = preview(true);
    assert_eq!(second["shared_cache"]["hits"], 3, "{second}");
    assert!(second["message"]["content"].as_str().unwrap().contains("Document 2."));
    // Not trusting it: the context is still built, and the cause is named.
    let untrusted = preview(false);
    assert_eq!(untrusted["shared_cache"]["up"], false, "{untrusted}");
    let error = untrusted["shared_cache"]["error"].as_str().unwrap().to_lowercase();
    assert!(error.contains("certificate"), "{error}");
    assert!(untrusted["message"]["content"].as_str().unwrap().contains("Document 2."));
    let _ = redis.kill();
    let _ = redis.wait();
}

/// Waits until every replica reports the shared cache up on /metrics and
/// `ready` on /readyz; returns when the last one did.
async fn all_up(replicas: &[Proxy], within: Duration) -> tokio::time::Instant {
    let deadline = tokio::time::Instant::now() + within;
    for p in replicas {
        while metric(p, "mcp_context_shared_cache_up").await != 1.0 || ready(p).await["status"] != "ready" {
            assert!(tokio::time::Instant::now() < deadline, "{} never came back up: {}", p.url, p.stderr());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    tokio::time::Instant::now()
}

/// Keys under `prefix` in the Redis at `url`.
fn keys_at(url: &str, prefix: &str) -> Vec<String> {
    let mut c = redis::Client::open(url).and_then(|c| c.get_connection()).expect("the test's Redis answers");
    let mut keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}*")).query(&mut c).unwrap();
    keys.sort();
    keys
}

/// Issue 29, defect 1: Redis killed and restarted on the same port. A
/// replica says the shared cache is up only once a command has gone
/// through, and then the first request on each replica is answered from
/// Redis and stored there: one MCP read per resource for all three, with
/// no failed command. Replicas 0 and 1 had commands fail during the outage
/// (two resources appeared meanwhile); replica 2 sent none, so its old
/// connection is simply dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_redis_restart_the_first_request_on_every_replica_uses_it() {
    let test = "after_a_redis_restart_the_first_request_on_every_replica_uses_it";
    let port = free_port();
    let Some(own) = OwnRedis::start(port) else {
        skip(test, "redis-server could not be started (install Debian's redis-server)");
        return;
    };
    let url = own.url();
    let prefix = "mcp-context-test:restart:";
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("reads.log");
    let list = dir.path().join("n.txt");
    std::fs::write(&list, "5").unwrap();
    let (mcp, _fixture, _stop) = http_fixture(Options {
        n: 5,
        size: 64,
        subscribe: true,
        list_file: Some(list.to_string_lossy().into_owned()),
        record: Some(log.to_string_lossy().into_owned()),
        ..Options::default()
    })
    .await;
    let reads = || read_log(&log).iter().filter(|l| l.starts_with("fx://doc/")).count();
    let up = Upstream::start().await;
    let replicas = start(3, &mcp, &url, prefix, &up.base).await;
    for (i, p) in replicas.iter().enumerate() {
        assert!(ask(p, &up, "alice", &format!("warm-up {i}")).await.contains("Document 4."));
    }
    assert_eq!(reads(), 5, "one read per resource for three replicas");
    all_up(&replicas, Duration::from_secs(5)).await;

    // Redis dies; two resources appear, which replicas 0 and 1 read
    // without it (their lookups fail).
    let mut own = Some(own);
    drop(own.take());
    for p in &replicas {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while metric(p, "mcp_context_shared_cache_up").await != 0.0 {
            assert!(tokio::time::Instant::now() < deadline, "{} never saw Redis die", p.url);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    std::fs::write(&list, "7").unwrap();
    for (i, p) in replicas[..2].iter().enumerate() {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut j = 0;
        while !ask(p, &up, "alice", &format!("while Redis is down {i}.{j}")).await.contains("Document 6.") {
            assert!(tokio::time::Instant::now() < deadline, "{} never listed the new resources", p.url);
            tokio::time::sleep(Duration::from_millis(20)).await;
            j += 1;
        }
        assert!(metric(p, "mcp_context_shared_cache_errors_total").await >= 1.0, "{} sent no command", p.url);
    }

    // Back, empty, on the same port.
    let restarted = tokio::time::Instant::now();
    let _back = OwnRedis::start(port).expect("redis-server restarts");
    let at = all_up(&replicas, Duration::from_secs(10)).await;
    eprintln!("{test}: every replica up {} ms after the restart", (at - restarted).as_millis());
    // Waiting longer must not matter either way.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let errors: Vec<f64> =
        futures::future::join_all(replicas.iter().map(|p| metric(p, "mcp_context_shared_cache_errors_total"))).await;
    let hits: Vec<f64> =
        futures::future::join_all(replicas.iter().map(|p| metric(p, "mcp_context_shared_cache_hits_total"))).await;
    let before = reads();

    // Every replica dropped its local entries when its subscription came
    // back (it may have missed invalidations): replica 0 reads and stores,
    // 1 and 2 are answered from Redis.
    for (i, p) in replicas.iter().enumerate() {
        assert!(ask(p, &up, "alice", &format!("after the restart {i}")).await.contains("Document 6."));
    }
    assert_eq!(reads() - before, 7, "one read per resource after the restart, for all three replicas");
    let data: Vec<String> =
        keys_at(&url, prefix).into_iter().filter(|k| k.starts_with(&format!("{prefix}c:"))).collect();
    assert_eq!(data.len(), 7, "the answers were stored again: {data:?}");
    for (i, p) in replicas.iter().enumerate() {
        assert_eq!(metric(p, "mcp_context_shared_cache_errors_total").await, errors[i], "{}: a command failed", p.url);
        let expected = if i == 0 { 0.0 } else { 7.0 };
        assert_eq!(metric(p, "mcp_context_shared_cache_hits_total").await - hits[i], expected, "{}", p.url);
        assert_eq!(metric(p, "mcp_context_shared_cache_up").await, 1.0);
        assert_eq!(ready(p).await["status"], "ready");
    }
}

/// A TCP proxy to 127.0.0.1:`target` that holds every byte `delay` each
/// way, as for a replica farther from Redis than the others. Its tasks end
/// with the test's runtime.
async fn latency_proxy(target: u16, delay: Duration) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    async fn pipe(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf, delay: Duration) {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
        let read = async move {
            let mut buf = vec![0u8; 65536];
            while let Ok(n @ 1..) = from.read(&mut buf).await {
                let _ = tx.send((tokio::time::Instant::now() + delay, buf[..n].to_vec()));
            }
        };
        let write = async move {
            while let Some((due, bytes)) = rx.recv().await {
                tokio::time::sleep_until(due).await;
                if to.write_all(&bytes).await.is_err() {
                    break;
                }
            }
            let _ = to.shutdown().await;
        };
        tokio::join!(read, write);
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let Ok(outbound) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else { continue };
            let _ = (inbound.set_nodelay(true), outbound.set_nodelay(true));
            let (ri, wi) = inbound.into_split();
            let (ro, wo) = outbound.into_split();
            tokio::spawn(pipe(ri, wo, delay));
            tokio::spawn(pipe(ro, wi, delay));
        }
    });
    port
}

/// `rounds` rounds of "change fx://live, wait until every replica has
/// learnt of it, then one request on every replica at once" over `n`
/// replicas of the Redis at `port`, all but the first `far` from it (see
/// [`latency_proxy`]), over an MCP server whose reads take `read_ms`;
/// returns the MCP reads of fx://live in each round (the first is the cold
/// one).
async fn race_rounds(n: usize, rounds: usize, port: u16, far: Duration, read_ms: u64) -> Vec<usize> {
    let url = format!("redis://127.0.0.1:{port}/0");
    let prefix = Prefix::new(&url);
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live.txt");
    let log = dir.path().join("reads.log");
    let (mcp, _fixture, _stop) =
        live_fixture(&dir, "round 0 of the race", Options { delay_ms: read_ms, ..Options::default() }).await;
    let reads = || read_log(&log).iter().filter(|l| l.as_str() == "fx://live").count();
    let up = Upstream::start().await;
    let far_url =
        if far.is_zero() { url.clone() } else { format!("redis://127.0.0.1:{}/0", latency_proxy(port, far).await) };
    let mut replicas = start(1, &mcp, &url, &prefix.prefix, &up.base).await;
    replicas.extend(start(n - 1, &mcp, &far_url, &prefix.prefix, &up.base).await);
    let mut per_round = Vec::new();
    for round in 0..=rounds {
        let before = reads();
        if round > 0 {
            // Renamed into place: a write in place could be seen half done
            // (empty) by the server's poll, as two changes.
            let next = dir.path().join("live.next");
            std::fs::write(&next, format!("round {round} of the race")).unwrap();
            std::fs::rename(&next, &live).unwrap();
            for p in &replicas {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                while metric(p, "mcp_context_shared_cache_invalidations_total{origin=\"local\"}").await < round as f64 {
                    assert!(tokio::time::Instant::now() < deadline, "{} never saw change {round}", p.url);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
        let answers = futures::future::join_all(replicas.iter().enumerate().map(|(i, p)| {
            let up = &up;
            async move { ask(p, up, "alice", &format!("round {round} on {i}")).await }
        }))
        .await;
        for m in &answers {
            assert!(m.contains(&format!("round {round} of the race")), "round {round}: {m}");
        }
        per_round.push(reads() - before);
        if round == 0 {
            // Changes reach only replicas that have subscribed.
            subscribed(&log, n).await;
        }
    }
    per_round
}

/// Issue 29, defect 2: three replicas, 100 rounds of "change, then three
/// requests at once": exactly one MCP read per round, however close the
/// requests arrive. Two replicas are 10 ms (each way) farther from Redis
/// than the third and reads take 15 ms, so that their lookup runs before the
/// near replica stored its answer and their lock request after it released
/// the lock: the lookup and the lock must be one step, and a replica that
/// lost the lock must wait for the holder's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_read_per_change_however_close_the_requests_of_three_replicas() {
    let test = "one_read_per_change_however_close_the_requests_of_three_replicas";
    let port = free_port();
    let Some(_own) = OwnRedis::start(port) else {
        skip(test, "redis-server could not be started (install Debian's redis-server)");
        return;
    };
    let per_round = race_rounds(3, 100, port, Duration::from_millis(10), 15).await;
    let extra: Vec<(usize, usize)> = per_round.iter().copied().enumerate().filter(|(_, r)| *r != 1).collect();
    assert!(extra.is_empty(), "{} rounds with other than one read (round, reads): {extra:?}", extra.len());
}

/// Figures for BENCHMARKS.md: MCP reads per change for 1, 3 and 8 replicas
/// under simultaneous requests, all as near Redis, and all but one 10 ms
/// farther (`ROUNDS`, 100 by default; `cargo test --test all shared::reads_per_change_bench -- --ignored --nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a benchmark: prints figures"]
async fn reads_per_change_bench() {
    let port = free_port();
    let Some(_own) = OwnRedis::start(port) else { panic!("redis-server could not be started") };
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(100);
    for (far, read_ms) in [(0, 0), (10, 15)] {
        for n in [1, 3, 8] {
            let per_round = race_rounds(n, rounds, port, Duration::from_millis(far), read_ms).await;
            let changes = &per_round[1..];
            let extra = changes.iter().filter(|r| **r != 1).count();
            println!(
                "{n} replicas, all but one {far} ms farther, reads of {read_ms} ms: cold {} read(s); {rounds} changes, {:.3} reads per change, {extra} rounds with more than one",
                per_round[0],
                changes.iter().sum::<usize>() as f64 / rounds as f64
            );
        }
    }
}

/// Figures for BENCHMARKS.md: the time from a Redis restart (after an
/// outage of `OUTAGE_MS`, 3 s by default) to every one of three replicas
/// reporting the shared cache up, and whether the next request on each was
/// answered from Redis (`cargo test --test all shared::restart_bench -- --ignored --nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a benchmark: prints figures"]
async fn restart_bench() {
    let port = free_port();
    let mut own = OwnRedis::start(port);
    assert!(own.is_some(), "redis-server could not be started");
    let url = format!("redis://127.0.0.1:{port}/0");
    let outage = Duration::from_millis(std::env::var("OUTAGE_MS").ok().and_then(|r| r.parse().ok()).unwrap_or(3000));
    let (mcp, fixture, _stop) = http_fixture(Options { n: 5, size: 64, ..Options::default() }).await;
    let up = Upstream::start().await;
    let replicas = start(3, &mcp, &url, "mcp-context-test:restart-bench:", &up.base).await;
    for (i, p) in replicas.iter().enumerate() {
        ask(p, &up, "alice", &format!("warm-up {i}")).await;
    }
    for round in 0..5 {
        drop(own.take());
        for p in &replicas {
            while metric(p, "mcp_context_shared_cache_up").await != 0.0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        tokio::time::sleep(outage).await;
        let restarted = tokio::time::Instant::now();
        own = OwnRedis::start(port);
        let mut times = Vec::new();
        for p in &replicas {
            while metric(p, "mcp_context_shared_cache_up").await != 1.0 {
                assert!(restarted.elapsed() < Duration::from_secs(20), "{} never came back", p.url);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            times.push(restarted.elapsed().as_millis());
        }
        let before = fixture.reads.load(Ordering::SeqCst);
        let hits: Vec<f64> =
            futures::future::join_all(replicas.iter().map(|p| metric(p, "mcp_context_shared_cache_hits_total"))).await;
        for (i, p) in replicas.iter().enumerate() {
            ask(p, &up, "alice", &format!("after restart {round} on {i}")).await;
        }
        let mut from_redis = 0.0;
        for (p, h) in replicas.iter().zip(hits) {
            from_redis += metric(p, "mcp_context_shared_cache_hits_total").await - h;
        }
        println!(
            "restart {round}: up on each replica after {times:?} ms; then {} MCP reads and {from_redis} answers from Redis for 3 requests of 5 resources",
            fixture.reads.load(Ordering::SeqCst) - before
        );
    }
}
