//! The hub against real servers: the demo and the fault fixture as child
//! processes, the fixture over Streamable HTTP, and the reference TypeScript
//! server-everything from npm.

use std::time::{Duration, Instant};

use mcp_context::compose::render_text;
use mcp_context::servers::Hub;
use mcp_context::{ContentPart, Error, ResourceId};

use crate::common::*;

fn id(s: &str) -> ResourceId {
    ResourceId::parse(s).unwrap()
}

#[tokio::test]
async fn demo_server_lists_every_page_and_templates() {
    let t = tag();
    let hub = Hub::connect(&config(&format!("servers:\n{}", demo_server("demo", &t)))).await;
    assert!(hub.failures().is_empty(), "{:?}", hub.failures());
    let uris: Vec<String> = hub.resources().into_iter().map(|r| r.id.uri).collect();
    // 7 resources over 3 pages of 3, sorted by URI.
    assert_eq!(uris.len(), 7, "{uris:?}");
    assert!(uris.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!(hub.templates()[0].uri_template, "demo://users/{user}/profile");
    let guide = hub.resource(&id("demo:demo://docs/guide")).unwrap();
    assert_eq!(guide.annotations.priority, Some(0.9));
    assert_eq!(guide.mime_type.as_deref(), Some("text/markdown"));
    let status = &hub.status()[0];
    assert_eq!(status.protocol.as_deref(), Some("2025-11-25"));
    hub.close().await;
    assert!(wait_gone(&t, Duration::from_secs(5)).await.is_empty());
}

#[tokio::test]
async fn pagination_follows_an_empty_string_cursor() {
    let t = tag();
    let hub = Hub::connect(&config(&format!(
        "servers:\n{}",
        fixture_server("fx", &t, &["--n", "10", "--page-size", "3", "--empty-cursor"])
    )))
    .await;
    assert!(hub.failures().is_empty(), "{:?}", hub.failures());
    assert_eq!(hub.resources().len(), 10);
    assert!(hub.status()[0].listing_complete);
    hub.close().await;
}

#[tokio::test]
async fn a_repeated_cursor_stops_and_is_reported() {
    let t = tag();
    let hub = Hub::connect(&config(&format!(
        "servers:\n{}",
        fixture_server("fx", &t, &["--n", "10", "--page-size", "3", "--repeat-cursor"])
    )))
    .await;
    let failures = hub.failures();
    assert_eq!(failures.len(), 1);
    assert!(failures[0].error.contains("repeated cursor"), "{failures:?}");
    assert!(!hub.status()[0].listing_complete);
    // What was listed before the loop is still there, not silently dropped.
    assert_eq!(hub.resources().len(), 3);
    hub.close().await;
}

#[tokio::test]
async fn the_same_uri_on_two_servers_is_two_resources() {
    let t = tag();
    let hub = Hub::connect(&config(&format!(
        "servers:\n{}{}",
        fixture_server("one", &t, &["--n", "2"]),
        fixture_server("two", &t, &["--n", "2"])
    )))
    .await;
    let ids: Vec<String> = hub.resources().iter().map(|r| r.id.to_string()).collect();
    assert_eq!(ids, ["one:fx://doc/0", "one:fx://doc/1", "two:fx://doc/0", "two:fx://doc/1"]);
    let a = hub.read(&id("one:fx://doc/0")).await.unwrap();
    let b = hub.read(&id("two:fx://doc/0")).await.unwrap();
    assert_eq!(a, b);
    hub.close().await;
}

#[tokio::test]
async fn broken_servers_are_reported_and_the_others_carry_on() {
    let t = tag();
    let yaml = format!(
        "servers:\n  missing:\n    command: /nonexistent/mcp-server\n{}{}{}{}",
        fixture_server("exits", &t, &["--exit-at-start"]),
        fixture_server("garbage", &t, &["--garbage", "--n", "1"]),
        fixture_server("hangs", &t, &["--hang-init"]).replace("timeout_ms: 20000", "timeout_ms: 500"),
        fixture_server("good", &t, &["--n", "2"]),
    );
    let started = Instant::now();
    let hub = Hub::connect(&config(&yaml)).await;
    assert!(started.elapsed() < Duration::from_secs(5), "connect took {:?}", started.elapsed());
    let failures = hub.failures();
    let failed: Vec<&str> = failures.iter().map(|f| f.server.as_str()).collect();
    assert!(failed.contains(&"missing") && failed.contains(&"exits") && failed.contains(&"hangs"), "{failures:?}");
    assert!(!failed.contains(&"good"));
    let missing = failures.iter().find(|f| f.server == "missing").unwrap();
    assert!(missing.error.contains("cannot start"), "{missing:?}");
    let hangs = failures.iter().find(|f| f.server == "hangs").unwrap();
    assert!(hangs.error.contains("500 ms"), "{hangs:?}");
    assert_eq!(hub.resources().iter().filter(|r| r.id.server == "good").count(), 2);
    let err = hub.read(&id("missing:x://y")).await.unwrap_err();
    assert!(matches!(err, Error::ServerUnavailable { .. }), "{err}");
    hub.close().await;
    assert!(wait_gone(&t, Duration::from_secs(5)).await.is_empty());
}

#[tokio::test]
async fn reads_time_out_fail_and_miss_with_typed_errors() {
    let t = tag();
    let yaml = format!(
        "servers:\n{}",
        fixture_server("fx", &t, &["--specials"]).replace("timeout_ms: 20000", "timeout_ms: 1500")
    );
    let hub = Hub::connect(&config(&yaml)).await;
    let started = Instant::now();
    let e = hub.read(&id("fx:fx://hang")).await.unwrap_err();
    assert!(e.is_timeout(), "{e}");
    assert!(started.elapsed() < Duration::from_secs(4));
    let e = hub.read(&id("fx:fx://nope")).await.unwrap_err();
    assert!(e.is_not_found(), "{e}");
    assert_eq!(e.to_string(), "resource not found: fx:fx://nope");
    let e = hub.read(&id("fx:fx://fail")).await.unwrap_err();
    assert!(matches!(&e, Error::Server { code: -32603, message, .. } if message == "boom"), "{e}");
    let e = hub.read(&id("nope:fx://x")).await.unwrap_err();
    assert!(matches!(e, Error::UnknownServer { .. }));
    // The connection survives all of that.
    assert!(hub.read(&id("fx:fx://doc/0")).await.is_ok());
    hub.close().await;
}

#[tokio::test]
async fn binary_empty_and_multipart_contents() {
    let t = tag();
    let hub = Hub::connect(&config(&format!("servers:\n{}", fixture_server("fx", &t, &["--specials"])))).await;
    let blob = hub.read(&id("fx:fx://blob")).await.unwrap();
    assert!(matches!(&blob.parts[..], [ContentPart::Blob { mime_type: Some(m), .. }] if m == "image/png"));
    assert_eq!(render_text(&blob, None), "[Binary Data (image/png)]");
    let nomime = hub.read(&id("fx:fx://blob-nomime")).await.unwrap();
    assert_eq!(render_text(&nomime, None), "[Binary Data (application/octet-stream)]");
    let empty = hub.read(&id("fx:fx://empty")).await.unwrap();
    assert!(empty.parts.is_empty());
    assert_eq!(render_text(&empty, None), "No content returned from resource.");
    let multi = hub.read(&id("fx:fx://multi")).await.unwrap();
    assert_eq!(render_text(&multi, None), "part one\n[Binary Data (application/octet-stream)]\npart two\n");
    hub.close().await;
}

#[tokio::test]
async fn reads_run_concurrently() {
    let t = tag();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("reads.log");
    // 8 reads of a slow resource; the server logs how many are in flight at
    // once, and holds each read until 4 are (or 10 s pass): a client that
    // reads one at a time logs 1, one that ignores the bound logs 8, and a
    // slow machine only makes the test slower.
    let yaml = format!(
        "servers:\n{}    max_concurrent_reads: 4\n",
        fixture_server(
            "fx",
            &t,
            &["--specials", "--slow-ms", "100", "--slow-wait-for", "4", "--record", log.to_str().unwrap()]
        )
    );
    let hub = Hub::connect(&config(&yaml)).await;
    let ids: Vec<ResourceId> = (0..8).map(|_| id("fx:fx://slow")).collect();
    let results = hub.read_many(&ids).await;
    assert!(results.iter().all(Result::is_ok));
    let max = read_log(&log).iter().filter_map(|l| l.strip_prefix("inflight ")?.parse::<usize>().ok()).max();
    // Concurrent, and bounded by the server's max_concurrent_reads.
    assert_eq!(max, Some(4), "{:?}", read_log(&log));
    hub.close().await;
}

#[tokio::test]
async fn streamable_http_server_on_loopback() {
    let (url, fixture, stop) = http_fixture(Options { n: 5, page_size: 2, specials: true, ..Default::default() }).await;
    let hub = Hub::connect(&config(&format!("servers:\n  web:\n    url: {url}\n"))).await;
    assert!(hub.failures().is_empty(), "{:?}", hub.failures());
    assert_eq!(hub.resources().iter().filter(|r| r.id.uri.starts_with("fx://doc/")).count(), 5);
    let c = hub.read(&id("web:fx://doc/3")).await.unwrap();
    assert_eq!(render_text(&c, None), "Document 3. ");
    assert!(hub.read(&id("web:fx://nope")).await.unwrap_err().is_not_found());
    assert_eq!(fixture.reads.load(std::sync::atomic::Ordering::SeqCst), 2);
    hub.close().await;
    stop.cancel();
}

/// Reads `n` resources from an HTTP fixture whose reads each take 300 ms,
/// and returns the most reads the server saw in flight at once.
async fn http_reads_in_flight(n: usize, json: bool, setting: &str) -> usize {
    let (url, fixture, stop) =
        http_fixture_as(Options { n, page_size: 1000, delay_ms: 300, ..Default::default() }, json).await;
    let hub = Hub::connect(&config(&format!("servers:\n  web:\n    url: {url}\n{setting}"))).await;
    assert!(hub.failures().is_empty(), "{:?}", hub.failures());
    let ids: Vec<ResourceId> = (0..n).map(|i| id(&format!("web:fx://doc/{i}"))).collect();
    let results = hub.read_many(&ids).await;
    assert!(results.iter().all(Result::is_ok));
    hub.close().await;
    stop.cancel();
    fixture.peak_delayed.load(std::sync::atomic::Ordering::SeqCst)
}

#[tokio::test]
async fn http_reads_in_flight_follow_max_concurrent_reads() {
    // rmcp's Streamable HTTP client sends at most 16 POSTs at once unless
    // told otherwise: `max_concurrent_reads` must reach it (issue 31).
    let peak = http_reads_in_flight(64, false, "    max_concurrent_reads: 48\n").await;
    assert!(peak > 16 && peak <= 48, "{peak} reads in flight, want 17..=48");
    // An HTTP server's default is 64 (stdio's is 16); stateless JSON answers too.
    let peak = http_reads_in_flight(100, true, "").await;
    assert!(peak > 48 && peak <= 64, "{peak} reads in flight by default, want 49..=64");
}

#[tokio::test]
async fn close_ends_stubborn_servers_and_grandchildren() {
    let t = tag();
    let dir = tempfile::tempdir().unwrap();
    let gc = dir.path().join("gc.pid");
    let gc_s = gc.to_string_lossy().to_string();
    let yaml = format!(
        "servers:\n{}{}",
        fixture_server("stubborn", &t, &["--ignore-term", "--grandchild", "--grandchild-pid-file", &gc_s]),
        fixture_server("plain", &t, &["--n", "1"]),
    );
    let hub = Hub::connect(&config(&yaml)).await;
    assert!(hub.failures().is_empty(), "{:?}", hub.failures());
    let before = tagged_processes(&t);
    assert_eq!(before.len(), 3, "two servers and one grandchild: {before:?}");
    let grandchild: u32 = std::fs::read_to_string(&gc).unwrap().trim().parse().unwrap();
    assert!(before.contains(&grandchild));
    hub.close().await;
    let left = wait_gone(&t, Duration::from_secs(2)).await;
    assert!(left.is_empty(), "left behind: {left:?}");
    hub.close().await; // idempotent
}

#[tokio::test]
async fn a_dropped_hub_leaves_no_process() {
    let t = tag();
    let yaml =
        format!("servers:\n{}{}", fixture_server("a", &t, &["--ignore-term", "--grandchild"]), demo_server("demo", &t));
    let hub = Hub::connect(&config(&yaml)).await;
    assert_eq!(tagged_processes(&t).len(), 3);
    drop(hub);
    let left = wait_gone(&t, Duration::from_secs(3)).await;
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// The reference TypeScript server, installed from npm by `.ci/run`
/// (`tests/node`, pinned in package-lock.json).
#[tokio::test]
async fn reference_server_everything() {
    let entry = std::path::Path::new(ROOT)
        .join("tests/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    if !entry.exists() || std::process::Command::new("node").arg("--version").output().is_err() {
        skip(
            "reference_server_everything",
            "node or tests/node/node_modules missing (run `npm ci --prefix tests/node`)",
        );
        return;
    }
    let t = tag();
    let yaml = format!(
        "servers:\n  everything:\n    command: node\n    args: [{:?}, stdio]\n    env: {{ MCP_TEST_TAG: {t:?} }}\n    timeout_ms: 20000\n",
        entry.to_string_lossy()
    );
    let hub = Hub::connect(&config(&yaml)).await;
    assert!(hub.failures().is_empty(), "{:?}", hub.failures());
    let resources = hub.resources();
    assert!(!resources.is_empty());
    let mut texts = 0;
    let mut blobs = 0;
    for r in &resources {
        let c = hub.read(&r.id).await.unwrap_or_else(|e| panic!("{}: {e}", r.id));
        for p in &c.parts {
            match p {
                ContentPart::Text { .. } => texts += 1,
                ContentPart::Blob { .. } => blobs += 1,
                other => panic!("a part of an unknown kind: {other:?}"),
            }
        }
    }
    assert!(texts > 0, "server-everything has text resources");
    eprintln!("server-everything: {} resources, {texts} text parts, {blobs} blob parts", resources.len());
    hub.close().await;
    assert!(wait_gone(&t, Duration::from_secs(5)).await.is_empty());
}

/// Linux hands pids out again once they wrap (32,768 by default), and a
/// process group is addressed by its leader's pid. A server that ended on
/// its own leaves its group number free; a process group started later by
/// anybody may get it. The hub must never signal that group: here a decoy
/// is made to take the number if it can (through `ns_last_pid`, as root),
/// and the hub is closed and dropped; the decoy must live. While the hub
/// may still signal the server's group, the number must stay taken.
#[tokio::test]
async fn a_group_id_freed_by_an_ended_server_never_receives_the_hubs_signals() {
    const TEST: &str = "a_group_id_freed_by_an_ended_server_never_receives_the_hubs_signals";
    let ns_last_pid = "/proc/sys/kernel/ns_last_pid";
    if std::fs::OpenOptions::new().write(true).open(ns_last_pid).is_err() {
        return skip(TEST, "/proc/sys/kernel/ns_last_pid is not writable (needs root)");
    }
    let t = tag();
    let hub = Hub::connect(&config(&format!("servers:\n{}", fixture_server("fx", &t, &["--exit-on-read"])))).await;
    assert!(hub.failures().is_empty(), "{:?}", hub.failures());
    let server = tagged_processes(&t);
    assert_eq!(server.len(), 1);
    let server = server[0];
    // The server exits (status 7) while answering; the hub sees its stdout end.
    assert!(hub.read(&id("fx:fx://doc/0")).await.is_err());
    assert!(wait_gone(&t, Duration::from_secs(5)).await.is_empty());
    tokio::time::sleep(Duration::from_millis(700)).await; // the pipe notes the exit (up to 500 ms)
    // Asks the kernel for that number for a new process group, many times
    // (other tests spawn processes meanwhile).
    let mut decoy = None;
    for _ in 0..200 {
        std::fs::write(ns_last_pid, (server - 1).to_string()).unwrap();
        let mut cmd = std::process::Command::new("sleep");
        std::os::unix::process::CommandExt::process_group(cmd.arg("1000"), 0);
        let child = cmd.spawn().unwrap();
        if child.id() == server {
            decoy = Some(child);
            break;
        }
        let mut child = child;
        let _ = child.kill();
        let _ = child.wait();
    }
    let took = decoy.is_some();
    let mut decoy = match decoy {
        Some(d) => d,
        None => {
            let mut cmd = std::process::Command::new("sleep");
            std::os::unix::process::CommandExt::process_group(cmd.arg("1000"), 0);
            cmd.spawn().unwrap()
        }
    };
    hub.close().await;
    drop(hub);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let alive = decoy.try_wait().unwrap().is_none();
    let _ = decoy.kill();
    let _ = decoy.wait();
    assert!(alive, "the hub signalled process group {server}, which is no longer its server's");
    assert!(!took, "group number {server} was free while the hub could still signal it");
}
