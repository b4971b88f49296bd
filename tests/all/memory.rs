//! The proxy's memory under many users and large conversations: the real
//! `mcp-context serve` binary, its resident set read from `/proc`, waves of
//! distinct callers with `cacheScope: private` answers, and multi-megabyte
//! user texts. What is bounded: the private cache entries
//! (`cache.private_max_bytes`), the warm memo (`context.warm_memo_max_bytes`),
//! relevance mode's chunk index (`context.chunk_index_max_bytes`) and the
//! query text the ranker reads (`MAX_QUERY_BYTES`).

use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Request;
use axum::routing::post;
use futures::StreamExt;
use serde_json::{Value, json};

use crate::common::*;
use crate::serve::{Proxy, http};

/// A loopback OpenAI-compatible upstream that answers every chat request
/// with the same short completion and keeps nothing (the recording
/// `Upstream` of `serve.rs` would hold every multi-megabyte body).
async fn forgetful_upstream() -> (String, tokio_util::sync::CancellationToken) {
    async fn chat(req: Request) -> axum::Json<Value> {
        let _ = axum::body::to_bytes(req.into_body(), usize::MAX).await;
        axum::Json(json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        }))
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    let s2 = stop.clone();
    let router = Router::new().route("/v1/chat/completions", post(chat));
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).with_graceful_shutdown(s2.cancelled_owned()).await;
    });
    (base, stop)
}

/// The process's resident set (`VmRSS`), in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb / 1024.0
}

/// CPU seconds the process has used (user + system).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Sends one chat request per `(user, text)`, `concurrency` at a time;
/// every one must be answered 200 with our context in it: `x-mcp-context`
/// names the user and `included` resources (at least one when `None`).
async fn send_all(proxy: &Proxy, requests: Vec<(String, String)>, concurrency: usize, included: Option<usize>) {
    let client = http();
    let url = format!("{}/v1/chat/completions", proxy.url);
    futures::stream::iter(requests)
        .map(|(user, text)| {
            let r = client
                .post(&url)
                .header("X-Test-User", &user)
                .json(&json!({"model": "gpt-4o", "messages": [{"role": "user", "content": text}]}))
                .send();
            async move {
                let r = r.await.unwrap();
                assert_eq!(r.status(), 200, "{user}");
                let h = r.headers()["x-mcp-context"].to_str().unwrap().to_owned();
                assert!(h.starts_with(&format!("user={user};")), "{h}");
                match included {
                    Some(n) => assert!(h.contains(&format!("; included={n};")), "{h}"),
                    None => assert!(!h.contains("; included=0;"), "{h}"),
                }
                r.bytes().await.unwrap();
            }
        })
        .buffer_unordered(concurrency)
        .collect::<Vec<()>>()
        .await;
}

fn serve_yaml() -> &'static str {
    "serve:\n  upstream_api_key: sk-up\n  user_header: X-Test-User\n"
}

/// Starts `serve` on `config` (with [`serve_yaml`]) and sends `waves` waves of
/// `per` new users, `concurrency` at a time, each asking `question(i)` and
/// expecting `included` resources (see [`send_all`]): the proxy's RSS at
/// the start and after each wave, once it has checked that nothing was
/// logged as an error.
async fn rss_over_waves(
    config: &str,
    (waves, per, concurrency): (usize, usize, usize),
    question: impl Fn(usize) -> String,
    included: Option<usize>,
) -> Vec<f64> {
    let (upstream, _stop) = forgetful_upstream().await;
    let t = tag();
    let body = config.replace("{tag}", &t) + serve_yaml();
    let proxy = Proxy::start_config(&body, &upstream, t).await;
    let pid = proxy.child.id().unwrap();
    let mut rss = vec![rss_mib(pid)];
    let started = Instant::now();
    for wave in 0..waves {
        let requests = (0..per).map(|i| (format!("w{wave}-user{i}"), question(i))).collect();
        send_all(&proxy, requests, concurrency, included).await;
        rss.push(rss_mib(pid));
    }
    eprintln!("RSS MiB at start and after each wave {rss:.1?}, {:.1?}", started.elapsed());
    assert!(proxy.stderr().lines().all(|l| !l.contains("ERROR")), "{}", proxy.stderr());
    rss
}

#[tokio::test]
async fn private_answers_for_waves_of_new_users_stay_within_the_byte_bound() {
    // Two private documents of 32 KiB, read for each new user (those who
    // join another user's read of a private answer read again, uncached):
    // tens of MiB per wave of 2000 users if nothing bounded it.
    let config = format!(
        "servers:\n{}context:\n  max_tokens: 40000\n  select: priority\n  warm_memo_max_bytes: 4000000\ncache:\n  private_max_bytes: 4000000\n",
        fixture_server("fx", "{tag}", &["--private", "--n", "2", "--size", "32768"]),
    );
    let rss = rss_over_waves(&config, (4, 2000, 8), |i| format!("question {i}"), Some(2)).await;
    // Unbounded, each wave added its private entries; bounded, the later
    // waves add nothing but allocator noise.
    let growth = rss[4] - rss[2];
    assert!(growth < 6.0, "RSS grew {growth:.1} MiB between waves 2 and 4: {rss:.1?}");
    assert!(rss[4] < rss[0] + 48.0, "{rss:.1?}");
}

#[tokio::test]
async fn private_answers_chunked_in_relevance_mode_stay_within_the_chunk_index_bound() {
    // Relevance mode with a question: each new user's private answers are
    // new contents, chunked and indexed. The index keeps each entry's
    // rendered block, token offsets and terms (three to five times the
    // text): without a byte bound, 8192 entries of these two 16 KiB
    // documents are some 700 MiB.
    let config = format!(
        "servers:\n{}context:\n  max_tokens: 1000\n  select: relevance\n  warm_memo_max_bytes: 4000000\n  chunk_index_max_bytes: 8000000\ncache:\n  private_max_bytes: 4000000\n",
        fixture_server("fx", "{tag}", &["--private", "--n", "2", "--size", "16384"]),
    );
    let rss = rss_over_waves(&config, (4, 300, 4), |i| format!("what does resource {} say?", i % 2), None).await;
    // Unbounded, each wave of 300 users added about 45 MiB of entries;
    // bounded, the later waves add nothing but allocator noise.
    let growth = rss[4] - rss[2];
    assert!(growth < 8.0, "RSS grew {growth:.1} MiB between waves 2 and 4: {rss:.1?}");
}

#[tokio::test]
async fn multi_megabyte_conversations_keep_memory_bounded_and_are_answered() {
    let (upstream, _stop) = forgetful_upstream().await;
    let t = tag();
    // Relevance mode: the ranker reads every request's query.
    let body = format!(
        "servers:\n{}context:\n  max_tokens: 1000\n  select: relevance\n{}  max_body_bytes: 4000000\n",
        fixture_server("fx", &t, &["--n", "6", "--size", "20000"]),
        serve_yaml()
    );
    let proxy = Proxy::start_config(&body, &upstream, t).await;
    let pid = proxy.child.id().unwrap();
    // One small request loads the tokenizer and the cache.
    send_all(&proxy, vec![("warm".into(), "hello".into())], 1, None).await;
    let (rss0, cpu0) = (rss_mib(pid), cpu_seconds(pid));
    // 96 users, each with 3 MB of user text that ends in a question.
    let mb = 3;
    let requests: Vec<(String, String)> = (0..96)
        .map(|i| {
            (
                format!("big{i}"),
                format!("{}what does document {} say?", "lorem ipsum dolor ".repeat(mb * 58_255), i % 6),
            )
        })
        .collect();
    let bytes: usize = requests.iter().map(|(_, t)| t.len()).sum();
    let started = Instant::now();
    send_all(&proxy, requests, 4, None).await;
    let (rss1, cpu1) = (rss_mib(pid), cpu_seconds(pid));
    eprintln!(
        "large queries: {} requests of {mb} MB in {:.1?}; RSS {rss0:.1} -> {rss1:.1} MiB; proxy CPU {:.2} s ({:.3} s per MB of user text)",
        96,
        started.elapsed(),
        cpu1 - cpu0,
        (cpu1 - cpu0) / (bytes as f64 / 1e6),
    );
    // Without the cap the warm memo alone kept every user's whole query:
    // 288 MB here.
    assert!(rss1 - rss0 < 96.0, "RSS grew {:.1} MiB", rss1 - rss0);
    // A request after them is answered, with context ranked by its question.
    let r = http()
        .post(format!("{}/v1/chat/completions", proxy.url))
        .header("X-Test-User", "after")
        .json(&json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "what does document 2 say?"}]}))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let h = r.headers()["x-mcp-context"].to_str().unwrap().to_owned();
    assert!(h.starts_with("user=after;"), "{h}");
}

/// Issue 47 item 10: 16 waves of 334 new users, private answers that keep
/// one second (`ttlMs` 1000), the private cache and the warm memo both at
/// 4 MiB, relevance mode with its chunk index at its default bound. The
/// index used to keep every new user's private contents alive until that
/// default (64 MiB) was full, though no request could ask for them again
/// once the private cache let them go: RSS rose 75 -> 158 MiB, 10 MiB of it
/// from wave 4 to wave 16 (with 2 KiB documents, 49 MiB). Now its entries
/// live no longer than their contents: 75 -> 103 MiB, 2.5 MiB of it from
/// wave 4 on (debug builds).
#[tokio::test]
async fn short_lived_private_answers_for_many_new_users_keep_rss_flat() {
    let config = format!(
        "servers:\n{}context:\n  max_tokens: 1000\n  select: relevance\n  warm_memo_max_bytes: 4194304\ncache:\n  private_max_bytes: 4194304\n",
        fixture_server_base("fx", "{tag}", &["--private", "--read-ttl-ms", "1000", "--n", "2", "--size", "8192"]),
    );
    let rss = rss_over_waves(&config, (16, 334, 8), |i| format!("what does resource {} say?", i % 2), None).await;
    let (lo, hi) = rss[4..].iter().fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
    assert!(hi - lo <= 8.0, "RSS moved {:.1} MiB from wave 4 to wave 16: {rss:.1?}", hi - lo);
    // Two 4 MiB bounds, the index of the live private answers, the
    // tokenizer: some 30 MiB; unbounded, 80.
    assert!(rss[16] - rss[0] <= 48.0, "RSS grew {:.1} MiB: {rss:.1?}", rss[16] - rss[0]);
}
