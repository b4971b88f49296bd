//! The shared (Redis) cache, measured: MCP reads per change against the
//! number of replicas, with the memory backend and with Redis; a new
//! replica's first request, and the same over the budget (relevance mode)
//! with and without the token counts and chunks other replicas stored; and
//! what the Redis backend adds to a warm request.
//!
//! ```text
//! cargo build --release --example bench_shared
//! target/release/examples/bench_shared [--redis redis://127.0.0.1:6379/0] [--docs 200] [--size 2048]
//!     [--changes 5] [--warm 2000] [--protocol auto|2025-11-25|2026-07-28]
//! ```
//! Each replica is an `McpContext` of its own (its own MCP connection, its
//! own local cache, its own Redis connections), all in this process, over
//! one MCP server: the test fixture over Streamable HTTP on loopback, which
//! counts the reads it serves and notifies subscribers when `fx://live`
//! changes. Keys go under a prefix of this run, deleted at the end.

#![allow(unsafe_code, reason = "CPU time of this process: clock_gettime(2) / getrusage(2), system calls std lacks")]

#[path = "../tests/support/fixture.rs"]
#[allow(unreachable_pub)]
mod fixture;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use fixture::{Fixture, Options};
use mcp_context::{Config, McpContext, Policy};

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

async fn http_fixture(opts: Options) -> (String, Fixture) {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    let fixture = Fixture::new(opts);
    let shared = fixture.clone();
    let service = StreamableHttpService::new(
        move || Ok(shared.clone()),
        LocalSessionManager::default().into(),
        StreamableHttpServerConfig::default(),
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    // TCP_NODELAY, as real servers set it (axum does not): without it each
    // answer streamed on 2025-11-25 waited for the client's delayed ACK.
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|t| {
        let _ = t.set_nodelay(true);
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    (url, fixture)
}

/// The replicas' `protocol` setting (`--protocol`).
static PROTOCOL: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn config(mcp: &str, redis: Option<(&str, &str)>) -> Config {
    let cache = match redis {
        Some((url, prefix)) => format!("cache:\n  backend: redis\n  url: {url}\n  key_prefix: \"{prefix}\"\n"),
        None => String::new(),
    };
    // `--protocol`, `auto` by default: 2026-07-28 with this fixture, so
    // replicas hear of changes through `subscriptions/listen`.
    let protocol = PROTOCOL.get().map_or("auto", String::as_str);
    let yaml =
        format!("servers:\n  kb:\n    url: {mcp}\n    protocol: \"{protocol}\"\ncontext:\n  max_tokens: 4000\n{cache}");
    Config::from_yaml(&yaml, std::path::Path::new("bench.yaml")).expect("config")
}

async fn replicas(n: usize, mcp: &str, redis: Option<(&str, &str)>) -> Vec<Arc<McpContext>> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(Arc::new(McpContext::with_policy(&config(mcp, redis), Policy::allow_all()).await));
    }
    v
}

async fn all_build(ctxs: &[Arc<McpContext>]) {
    let builds = ctxs.iter().map(|c| async move { c.build(&"alice".into()).await.expect("build") });
    for (_, report) in futures::future::join_all(builds).await {
        assert!(report.injected() && report.excluded.iter().all(|e| e.reason != mcp_context::ExcludeReason::Error));
    }
}

fn cleanup(url: &str, prefix: &str) {
    if let Ok(mut c) = redis::Client::open(url).and_then(|c| c.get_connection()) {
        let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}*")).query(&mut c).unwrap_or_default();
        if !keys.is_empty() {
            let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query(&mut c);
        }
    }
}

/// CPU time of this process (all threads, user + system).
fn cpu() -> Duration {
    // SAFETY: getrusage fills the struct we pass and has no other effect.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let d = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    d(u.ru_utime) + d(u.ru_stime)
}

/// Deletes the derived-data fields (`d:…`) of every content hash under `prefix`.
fn drop_derived(url: &str, prefix: &str) -> usize {
    let mut c = redis::Client::open(url).and_then(|c| c.get_connection()).expect("redis");
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}c:*")).query(&mut c).unwrap_or_default();
    let mut n = 0;
    for k in keys {
        let fields: Vec<String> = redis::cmd("HKEYS").arg(&k).query(&mut c).unwrap_or_default();
        for f in fields.into_iter().filter(|f| f.starts_with("d:")) {
            let _: redis::RedisResult<()> = redis::cmd("HDEL").arg(&k).arg(f).query(&mut c);
            n += 1;
        }
    }
    n
}

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let redis_url = flag(&args, "--redis").unwrap_or_else(|| "redis://127.0.0.1:6379/0".into());
    let docs: usize = flag(&args, "--docs").map_or(200, |v| v.parse().unwrap());
    let size: usize = flag(&args, "--size").map_or(2048, |v| v.parse().unwrap());
    let changes: usize = flag(&args, "--changes").map_or(5, |v| v.parse().unwrap());
    let warm: usize = flag(&args, "--warm").map_or(2000, |v| v.parse().unwrap());
    let protocol = flag(&args, "--protocol").unwrap_or_else(|| "auto".into());
    PROTOCOL.set(protocol.clone()).expect("set once");
    let run = format!("mcp-context-bench:{}:", std::process::id());
    let dir = tempfile::tempdir().unwrap();

    println!(
        "{docs} resources of {size} B + fx://live, {changes} changes of fx://live, protocol {protocol}; reads counted by the server"
    );
    println!(
        "| replicas | backend | reads, first request on every replica | reads per change | Redis commands failed (first / changes) |"
    );
    println!("|---:|---|---:|---:|---:|");
    for n in [1usize, 3, 8] {
        for redis in [false, true] {
            let live = dir.path().join(format!("live-{n}-{redis}"));
            std::fs::write(&live, "version 0").unwrap();
            let (mcp, fx) = http_fixture(Options {
                n: docs,
                size,
                subscribe: true,
                live: Some(live.to_string_lossy().into_owned()),
                ..Options::default()
            })
            .await;
            let prefix = format!("{run}{n}:");
            let ctxs = replicas(n, &mcp, redis.then_some((redis_url.as_str(), prefix.as_str()))).await;
            all_build(&ctxs).await;
            let cold = fx.reads.load(Ordering::SeqCst);
            let errors = |ctxs: &[Arc<McpContext>]| -> u64 {
                ctxs.iter().filter_map(|c| c.shared_cache_status()).map(|s| s.errors).sum()
            };
            let cold_errors = errors(&ctxs);
            // Subscriptions are set up after the first reads, in the
            // background: a change before they are acknowledged is notified to
            // nobody (seen only when the first entry's `cache_ttl_ms` ends).
            tokio::time::sleep(Duration::from_millis(200)).await;
            let full = docs + 1;
            let mut per_change = Vec::new();
            for c in 1..=changes {
                let before = fx.reads.load(Ordering::SeqCst);
                std::fs::write(&live, format!("version {c}")).unwrap();
                // Wait until every replica has dropped its copy of fx://live
                // (each learns of the change itself: every replica subscribes).
                let t = Instant::now();
                while ctxs.iter().any(|x| x.cached_entries() == full) {
                    assert!(t.elapsed() < Duration::from_secs(10), "a replica never saw the change");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                // Each replica's Redis invalidation is sent in the background: let them land.
                tokio::time::sleep(Duration::from_millis(50)).await;
                all_build(&ctxs).await;
                per_change.push(fx.reads.load(Ordering::SeqCst) - before);
            }
            let mean = per_change.iter().sum::<usize>() as f64 / per_change.len() as f64;
            println!(
                "| {n} | {} | {cold} | {mean:.1} (each: {per_change:?}) | {cold_errors} / {} |",
                if redis { "redis" } else { "memory" },
                errors(&ctxs) - cold_errors
            );
            drop(ctxs);
            cleanup(&redis_url, &prefix);
        }
    }

    // A new replica's first request: everything from Redis, or from the MCP server.
    // A server that notifies changes: on 2026-07-28 its answers say how long
    // they keep (an answer without hints is `ttlMs: 0`, and nothing is shared).
    let (mcp, fx) = http_fixture(Options { n: docs, size, subscribe: true, ..Options::default() }).await;
    let prefix = format!("{run}first:");
    let seed = replicas(1, &mcp, Some((&redis_url, &prefix))).await;
    all_build(&seed).await;
    let mut from_mcp = Vec::new();
    let mut from_redis = Vec::new();
    for _ in 0..5 {
        let before = fx.reads.load(Ordering::SeqCst);
        let m = replicas(1, &mcp, None).await;
        let t = Instant::now();
        all_build(&m).await;
        from_mcp.push(t.elapsed());
        assert_eq!(fx.reads.load(Ordering::SeqCst) - before, docs);
        let r = replicas(1, &mcp, Some((&redis_url, &prefix))).await;
        let before = fx.reads.load(Ordering::SeqCst);
        let t = Instant::now();
        all_build(&r).await;
        from_redis.push(t.elapsed());
        assert_eq!(fx.reads.load(Ordering::SeqCst), before, "the new replica read nothing from the server");
    }
    let (m, r) = (percentile(&mut from_mcp, 0.5), percentile(&mut from_redis, 0.5));
    println!(
        "\nnew replica, first request ({docs} resources, median of 5): from the MCP server {:.1} ms, from Redis {:.1} ms ({:.2}x)",
        m.as_secs_f64() * 1e3,
        r.as_secs_f64() * 1e3,
        m.as_secs_f64() / r.as_secs_f64()
    );
    drop(seed);
    cleanup(&redis_url, &prefix);

    // The same over the budget: a question, so chunks are ranked (relevance
    // mode). Contents come from Redis in both columns; token counts and
    // chunks too in the first, computed by the new replica in the second.
    let prefix = format!("{run}derived:");
    let ask = || mcp_context::ContextRequest::for_user("alice").with_query("which notes share the gamma sync");
    let seed = replicas(1, &mcp, Some((&redis_url, &prefix))).await;
    let (_, report) = seed[0].build(&ask()).await.unwrap();
    assert_eq!(report.mode, Some(mcp_context::SelectMode::Relevance));
    let first = |ctx: Arc<McpContext>| {
        let ask = ask();
        async move {
            let (t, c) = (Instant::now(), cpu());
            let (m, report) = ctx.build(&ask).await.unwrap();
            ((t.elapsed(), cpu() - c), report.shared_cache.map_or(0, |s| s.derived), m.map(|m| m.content))
        }
    };
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let mut message = None;
    for _ in 0..5 {
        // Let the seed's (and the last round's) records land.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let r = replicas(1, &mcp, Some((&redis_url, &prefix))).await;
        let (times, used, m) = first(r[0].clone()).await;
        assert_eq!(used, docs, "every record used");
        with.push(times);
        assert!(message.get_or_insert(m.clone()) == &m, "the same message");
        assert!(drop_derived(&redis_url, &prefix) >= docs);
        let r = replicas(1, &mcp, Some((&redis_url, &prefix))).await;
        let (times, used, m) = first(r[0].clone()).await;
        assert_eq!(used, 0);
        assert!(message.as_ref() == Some(&m), "the same message");
        without.push(times);
    }
    let median = |v: &mut Vec<(Duration, Duration)>, pick: fn(&(Duration, Duration)) -> Duration| {
        let mut x: Vec<Duration> = v.iter().map(pick).collect();
        percentile(&mut x, 0.5)
    };
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (ww, wc) = (median(&mut with, |t| t.0), median(&mut with, |t| t.1));
    let (ow, oc) = (median(&mut without, |t| t.0), median(&mut without, |t| t.1));
    println!(
        "
new replica, first request over the budget ({docs} resources, relevance, median of 5): with shared \
         token counts and chunks {:.1} ms wall, {:.1} ms CPU; computing them {:.1} ms wall, {:.1} ms CPU ({:.2}x wall, {:.2}x CPU)",
        ms(ww),
        ms(wc),
        ms(ow),
        ms(oc),
        ms(ow) / ms(ww),
        ms(oc) / ms(wc)
    );
    drop(seed);
    cleanup(&redis_url, &prefix);

    // A warm request: everything in the local cache, same question.
    println!("\nwarm request ({docs} resources cached, {warm} requests):");
    let mut medians = Vec::new();
    for redis in [false, true] {
        let prefix = format!("{run}warm:");
        let ctx = replicas(1, &mcp, redis.then_some((redis_url.as_str(), prefix.as_str()))).await;
        all_build(&ctx).await;
        let mut times = Vec::with_capacity(warm);
        for _ in 0..warm {
            let t = Instant::now();
            let (_, report) = ctx[0].build(&"alice".into()).await.unwrap();
            times.push(t.elapsed());
            assert_eq!(report.cache_misses, 0);
        }
        let (p50, p99) = (percentile(&mut times, 0.5), percentile(&mut times, 0.99));
        println!(
            "  {:<6}  p50 {:.1} us  p99 {:.1} us",
            if redis { "redis" } else { "memory" },
            p50.as_secs_f64() * 1e6,
            p99.as_secs_f64() * 1e6
        );
        medians.push(p50);
        cleanup(&redis_url, &prefix);
    }
    println!("  redis/memory p50: {:.2}x", medians[1].as_secs_f64() / medians[0].as_secs_f64());
}
