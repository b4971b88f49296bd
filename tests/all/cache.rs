//! The warm path: cache, subscriptions, change notifications, TTL,
//! stale-on-error, restart, single-flight. The fixture logs every read (and
//! subscribe) it serves, so "no request was sent" is checked on the server.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use mcp_context::{ContextRequest, McpContext};

use crate::common::*;

fn reads_of(log: &Path, uri: &str) -> usize {
    read_log(log).iter().filter(|l| l.as_str() == uri).count()
}

async fn content(ctx: &McpContext, user: &str) -> String {
    ctx.build(&ContextRequest::for_user(user)).await.unwrap().0.map(|m| m.content.to_string()).unwrap_or_default()
}

struct Files {
    _dir: tempfile::TempDir,
    log: std::path::PathBuf,
    live: std::path::PathBuf,
    list: std::path::PathBuf,
    fail: std::path::PathBuf,
}

/// Loads the tokenizer with a build that reads nothing. The first build of
/// a context awaits the tokenizer on the blocking pool, and which of several
/// concurrent first builds comes back first is up to the OS: after this, the
/// spawned builds of the single-flight tests reach the cache in spawn order
/// (the test runtime has one thread), whatever the machine's load. Each
/// joins the read before any answer can be handled, so the slow read (500 ms)
/// only has to outlast a few polls.
async fn load_tokenizer(ctx: &McpContext) {
    let req = ContextRequest::for_user("warm-up").with_selection(vec![]);
    ctx.build(&req).await.unwrap();
}

fn files() -> Files {
    let dir = tempfile::tempdir().unwrap();
    let f = |n: &str| dir.path().join(n);
    let files = Files { log: f("reads.log"), live: f("live.txt"), list: f("n.txt"), fail: f("fail"), _dir: dir };
    std::fs::write(&files.live, "version one").unwrap();
    std::fs::write(&files.list, "3").unwrap();
    files
}

fn server(t: &str, f: &Files, extra: &[&str]) -> String {
    let mut args = vec![
        "--n",
        "3",
        "--record",
        f.log.to_str().unwrap(),
        "--live",
        f.live.to_str().unwrap(),
        "--list-file",
        f.list.to_str().unwrap(),
        "--fail-file",
        f.fail.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    fixture_server("fx", t, &args)
}

#[tokio::test]
async fn updates_invalidate_and_nothing_is_read_before_them() {
    let t = tag();
    let f = files();
    let yaml = format!("servers:\n{}", server(&t, &f, &["--subscribe"]));
    let ctx = McpContext::from_config(&config(&yaml)).await.unwrap();
    assert!(content(&ctx, "u").await.contains("version one"));
    assert!(eventually(async || read_log(&f.log).iter().filter(|l| l.starts_with("subscribe ")).count() == 4).await);
    let reads = || read_log(&f.log).into_iter().filter(|l| !l.starts_with("subscribe ")).count();
    let cold = reads();
    // Warm: nothing changed, so not a single MCP request.
    for _ in 0..5 {
        assert!(content(&ctx, "u").await.contains("version one"));
    }
    assert_eq!(reads(), cold, "a warm injection sent a read: {:?}", read_log(&f.log));
    std::fs::write(&f.live, "version two").unwrap();
    assert!(eventually(async || content(&ctx, "u").await.contains("version two")).await);
    assert_eq!(reads_of(&f.log, "fx://live"), 2);
    // The other resources were not re-read.
    assert_eq!(reads_of(&f.log, "fx://doc/0"), 1);
    ctx.close().await;
}

/// A change made after a resource's first read and before its subscription
/// is in place is never notified (the fixture makes one). The entry read
/// before the subscription was acknowledged lives only `cache_ttl_ms`, so
/// the change is seen then; the next one, read once the subscription is in
/// place, is kept by the subscription alone (not read again past the TTL)
/// and a notified change still reaches it at once.
#[tokio::test]
async fn a_change_before_the_subscription_is_in_place_is_seen_within_the_ttl() {
    let t = tag();
    let f = files();
    let args = ["--subscribe", "--change-before-subscribe", "version two"];
    let yaml = format!("servers:\n{}    cache_ttl_ms: 500\n", server(&t, &f, &args));
    let ctx = McpContext::from_config(&config(&yaml)).await.unwrap();
    assert!(content(&ctx, "u").await.contains("version one"));
    assert!(eventually(async || reads_of(&f.log, "subscribe fx://live") == 1).await);
    let changed = async || std::fs::read_to_string(&f.live).unwrap() == "version two";
    assert!(eventually(changed).await, "the server changed it, unnotified");
    // Before the fix this entry lived by its subscription, forever.
    assert!(eventually(async || content(&ctx, "u").await.contains("version two")).await);
    assert_eq!(reads_of(&f.log, "fx://live"), 2);
    // Kept by the subscription now: three TTLs on, not read again (a bound on staleness, not a speed).
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert!(content(&ctx, "u").await.contains("version two"));
    assert_eq!(reads_of(&f.log, "fx://live"), 2, "{:?}", read_log(&f.log));
    std::fs::write(&f.live, "version three").unwrap();
    assert!(eventually(async || content(&ctx, "u").await.contains("version three")).await);
    assert_eq!(reads_of(&f.log, "fx://live"), 3);
    ctx.close().await;
}

#[tokio::test]
async fn list_changed_relists_and_drops_what_disappeared() {
    let t = tag();
    let f = files();
    let yaml = format!("servers:\n{}", server(&t, &f, &["--subscribe"]));
    let ctx = McpContext::from_config(&config(&yaml)).await.unwrap();
    assert!(content(&ctx, "u").await.contains("fx:fx://doc/2"));
    std::fs::write(&f.list, "2").unwrap();
    assert!(eventually(async || !content(&ctx, "u").await.contains("fx:fx://doc/2")).await);
    assert_eq!(ctx.hub().resources().iter().filter(|r| r.id.uri.starts_with("fx://doc/")).count(), 2);
    std::fs::write(&f.list, "4").unwrap();
    assert!(eventually(async || content(&ctx, "u").await.contains("fx:fx://doc/3")).await);
    ctx.close().await;
}

#[tokio::test]
async fn ttl_for_servers_without_subscriptions_and_cache_off() {
    let t = tag();
    let f = files();
    // A TTL long enough that a starved machine still makes the second
    // request inside it; the wait after it only has to be longer.
    let yaml = format!("servers:\n{}    cache_ttl_ms: 2000\n", server(&t, &f, &[]));
    let ctx = McpContext::from_config(&config(&yaml)).await.unwrap();
    content(&ctx, "u").await;
    content(&ctx, "u").await;
    assert_eq!(reads_of(&f.log, "fx://doc/0"), 1, "within the TTL the cache answers");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    content(&ctx, "u").await;
    assert_eq!(reads_of(&f.log, "fx://doc/0"), 2, "after the TTL it reads again");
    ctx.close().await;

    let t = tag();
    let f = files();
    let yaml = format!("servers:\n{}    cache: false\n", server(&t, &f, &["--subscribe"]));
    let ctx = McpContext::from_config(&config(&yaml)).await.unwrap();
    for _ in 0..3 {
        content(&ctx, "u").await;
    }
    assert_eq!(reads_of(&f.log, "fx://doc/0"), 3);
    assert!(!read_log(&f.log).iter().any(|l| l.starts_with("subscribe")));
    ctx.close().await;
}

#[tokio::test]
async fn stale_on_error_serves_the_last_good_content_when_allowed() {
    for serve_stale in [true, false] {
        let t = tag();
        let f = files();
        let yaml = format!("servers:\n{}    cache_ttl_ms: 100\n    serve_stale: {serve_stale}\n", server(&t, &f, &[]));
        let ctx = McpContext::from_config(&config(&yaml)).await.unwrap();
        assert!(content(&ctx, "u").await.contains("version one"));
        std::fs::write(&f.fail, "").unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
        let (m, report) = ctx.build(&ContextRequest::for_user("u")).await.unwrap();
        let live = report.included.iter().find(|i| i.id == "fx:fx://live");
        if serve_stale {
            assert!(live.unwrap().stale, "{report:?}");
            assert!(m.unwrap().content.contains("version one"));
            assert!(report.to_string().contains("stale"));
        } else {
            assert!(live.is_none());
            let e = report.excluded("fx:fx://live").unwrap();
            assert!(e.detail.as_deref().unwrap().contains("live source unavailable"), "{e:?}");
        }
        assert_eq!(reads_of(&f.log, "fx://live"), 2, "serve_stale {serve_stale}: {:?} {report:?}", read_log(&f.log));
        ctx.close().await;
    }
}

#[tokio::test]
async fn a_dead_stdio_server_is_restarted_and_resubscribed() {
    let t = tag();
    let f = files();
    let yaml = format!("servers:\n{}", server(&t, &f, &["--subscribe"]));
    let ctx = McpContext::from_config(&config(&yaml)).await.unwrap();
    assert!(content(&ctx, "u").await.contains("version one"));
    assert!(eventually(async || reads_of(&f.log, "subscribe fx://live") == 1).await);
    // Kill the server behind the hub's back.
    for pid in tagged_processes(&t) {
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    assert!(wait_gone(&t, Duration::from_secs(5)).await.is_empty());
    std::fs::write(&f.live, "after restart").unwrap();
    // The next request notices, restarts, reads again and subscribes again.
    assert!(
        eventually(async || {
            let (m, report) = ctx.build(&ContextRequest::for_user("u")).await.unwrap();
            let ok = m.is_some_and(|m| m.content.contains("after restart"));
            if ok {
                assert!(report.restarted_servers == ["fx"] || ctx.hub().status()[0].restarts == 1, "{report:?}");
            }
            ok
        })
        .await
    );
    assert_eq!(ctx.hub().status()[0].restarts, 1);
    assert!(eventually(async || reads_of(&f.log, "subscribe fx://live") == 2).await, "subscription re-established");
    std::fs::write(&f.live, "after restart, updated").unwrap();
    assert!(eventually(async || content(&ctx, "u").await.contains("updated")).await);
    ctx.close().await;
    assert!(wait_gone(&t, Duration::from_secs(5)).await.is_empty());
}

#[tokio::test]
async fn concurrent_injections_share_one_read() {
    let t = tag();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("reads.log");
    let yaml = format!(
        "servers:\n{}",
        fixture_server("fx", &t, &["--n", "0", "--specials", "--slow-ms", "500", "--record", log.to_str().unwrap()])
    );
    let ctx = Arc::new(McpContext::from_config(&config(&yaml)).await.unwrap());
    load_tokenizer(&ctx).await;
    let req =
        ContextRequest::for_user("u").with_selection(vec![mcp_context::ResourceId::parse("fx:fx://slow").unwrap()]);
    let tasks: Vec<_> = (0..12)
        .map(|_| {
            let (ctx, req) = (ctx.clone(), req.clone());
            tokio::spawn(async move { ctx.build(&req).await.unwrap().1 })
        })
        .collect();
    for task in tasks {
        let report = task.await.unwrap();
        assert_eq!(report.included.len(), 1, "{report:?}");
    }
    assert_eq!(reads_of(&log, "fx://slow"), 1, "12 concurrent injections, one read");
    ctx.close().await;
}

#[tokio::test]
async fn private_entries_are_never_served_to_another_user() {
    let t = tag();
    let f = files();
    let yaml = format!("servers:\n{}", server(&t, &f, &["--private"]));
    let ctx = McpContext::from_config(&config(&yaml)).await.unwrap();
    content(&ctx, "ann").await;
    content(&ctx, "ann").await;
    assert_eq!(reads_of(&f.log, "fx://doc/0"), 1, "ann's second request is served from her cache");
    content(&ctx, "ben").await;
    assert_eq!(reads_of(&f.log, "fx://doc/0"), 2, "ben never gets ann's private entry");
    ctx.close().await;
}

#[tokio::test]
async fn a_shared_read_with_a_private_answer_is_not_handed_to_another_user() {
    let t = tag();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("reads.log");
    let yaml = format!(
        "servers:\n{}",
        fixture_server(
            "fx",
            &t,
            &["--n", "0", "--specials", "--private", "--slow-ms", "500", "--record", log.to_str().unwrap()]
        )
    );
    let ctx = Arc::new(McpContext::from_config(&config(&yaml)).await.unwrap());
    // Without this, ben's build could get the tokenizer first and start the
    // read: then both of ann's join his private answer and read again (3).
    load_tokenizer(&ctx).await;
    let slow = vec![mcp_context::ResourceId::parse("fx:fx://slow").unwrap()];
    let tasks: Vec<_> = ["ann", "ann", "ben"]
        .into_iter()
        .map(|user| {
            let ctx = ctx.clone();
            let req = ContextRequest::for_user(user).with_selection(slow.clone());
            tokio::spawn(async move { ctx.build(&req).await.unwrap().1.included.len() })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap(), 1);
    }
    // ann's two requests share one read; ben, joining a read whose answer
    // turned out private, reads for himself.
    assert_eq!(reads_of(&log, "fx://slow"), 2, "{:?}", read_log(&log));
    ctx.close().await;
}
