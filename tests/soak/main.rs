//! Soak: the middleware serving injections continuously (SOAK_SECS, default
//! 60) across several servers, one of them killed and restarted again and
//! again, one hanging on purpose. Asserts every request is answered, and that
//! open file descriptors and memory do not grow beyond a bound. Its own test
//! binary, so the process figures are this test's alone.

#![allow(unsafe_code, reason = "tests signal the processes they start and read clock ticks: kill(2), sysconf(3)")]
#![allow(unreachable_pub, reason = "helpers shared between the test modules")]

#[path = "../support/fixture.rs"]
mod handler;

#[path = "../all/common.rs"]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use mcp_context::{ContextRequest, McpContext};

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injections_keep_being_served_while_servers_die_and_hang() {
    let secs: u64 = std::env::var("SOAK_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    let (t, t_victim) = (tag(), tag());
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    std::fs::write(&live, "v0").unwrap();
    let yaml = format!(
        "servers:\n{}{}{}{}    timeout_ms: 500\ncontext:\n  deadline_ms: 2000\n",
        demo_server("demo", &t),
        fixture_server("live", &t, &["--n", "20", "--size", "512", "--subscribe", "--live", live.to_str().unwrap()]),
        fixture_server("victim", &t_victim, &["--n", "5"]) + "    cache: false\n",
        fixture_server("hangs", &t, &["--hang", "--n", "1"]).replace("    timeout_ms: 20000\n", ""),
    );
    // Five users never see the hanging server; the sixth sees everything,
    // so one request in six waits for the hang (bounded by the deadline).
    let policy = mcp_context::Policy::from_yaml(
        "default_roles: [most]\nroles:\n  most:\n    allow: [ { uri: \"**\" } ]\n    deny: [ { server: hangs } ]\nusers:\n  u5:\n    allow: [ { uri: \"**\" } ]\n",
        std::path::Path::new("soak.yaml"),
    )
    .unwrap();
    let ctx = Arc::new(McpContext::with_policy(&config(&yaml), policy).await);
    let answered = Arc::new(AtomicUsize::new(0));
    let mut issued = 0usize;
    let mut worst = Duration::ZERO;
    let start = Instant::now();
    let (mut fds0, mut rss0) = (0, 0);
    let mut kills = 0;
    let mut round = 0u64;
    while start.elapsed() < Duration::from_secs(secs) {
        round += 1;
        if round == 5 {
            // Baseline once caches, connections and buffers are warm.
            (fds0, rss0) = (fds(), rss_kib());
        }
        if round.is_multiple_of(5) {
            std::fs::write(&live, format!("v{round}")).unwrap();
        }
        if round.is_multiple_of(10) {
            for pid in tagged_processes(&t_victim) {
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            kills += 1;
        }
        let mut batch = Vec::new();
        let users = if round.is_multiple_of(2) { 0..6 } else { 0..5 };
        for u in users {
            let (ctx, answered) = (ctx.clone(), answered.clone());
            issued += 1;
            batch.push(tokio::spawn(async move {
                let started = Instant::now();
                let req = ContextRequest::for_user(format!("u{u}"));
                let (m, report) = ctx.build(&req).await.unwrap();
                assert!(m.unwrap().content.contains("demo:demo://docs/guide"), "{report:?}");
                if u == 5 && std::env::var_os("SOAK_DEBUG").is_some() {
                    eprintln!("{report}");
                }
                answered.fetch_add(1, Ordering::SeqCst);
                started.elapsed()
            }));
        }
        for b in batch {
            let took = tokio::time::timeout(Duration::from_secs(10), b).await.expect("a request got stuck").unwrap();
            worst = worst.max(took);
        }
    }
    let (fds1, rss1) = (fds(), rss_kib());
    let restarts = ctx.hub().status().iter().find(|s| s.name == "victim").map(|s| s.restarts).unwrap_or(0);
    eprintln!(
        "soak: {secs} s, {issued} injections, all answered: {}; worst latency {worst:?}; victim killed {kills}x, restarted {restarts}x; \
         fds {fds0} -> {fds1}; RSS {:.1} -> {:.1} MiB",
        answered.load(Ordering::SeqCst) == issued,
        rss0 as f64 / 1024.0,
        rss1 as f64 / 1024.0
    );
    assert_eq!(answered.load(Ordering::SeqCst), issued);
    assert!(worst < Duration::from_millis(2000 + 1500), "worst latency {worst:?} beyond the deadline");
    assert!(kills == 0 || restarts >= 1, "the killed server was never restarted");
    assert!(fds1 <= fds0 + 16, "file descriptors grew: {fds0} -> {fds1}");
    assert!(rss1 <= rss0 + 64 * 1024, "memory grew: {rss0} -> {rss1} KiB");
    ctx.close().await;
    assert!(wait_gone(&t, Duration::from_secs(5)).await.is_empty());
    assert!(wait_gone(&t_victim, Duration::from_secs(5)).await.is_empty());
}
