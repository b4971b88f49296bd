//! Both MCP revisions, chosen per server (`protocol: auto | 2026-07-28 |
//! 2025-11-25`): the lifecycle (`server/discover` with the fallback to
//! `initialize`), pushed changes (`subscriptions/listen` on 2026-07-28,
//! `resources/subscribe` on 2025-11-25), cache hints, and both not-found
//! codes. Against rmcp's server (the fixture) in every mode; the official
//! Python SDK's server is in `sdk.rs`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mcp_context::servers::Hub;
use mcp_context::{ContextRequest, Error, McpContext, ResourceId};

use crate::common::*;

/// YAML for a stdio fixture server speaking `protocol` (`None`: the default, auto).
pub fn fixture_as(name: &str, tag: &str, args: &[&str], protocol: Option<&str>) -> String {
    let mut yaml = fixture_server_base(name, tag, args);
    if let Some(p) = protocol {
        yaml.push_str(&format!("    protocol: {p:?}\n"));
    }
    yaml
}

fn id(s: &str) -> ResourceId {
    ResourceId::parse(s).unwrap()
}

pub async fn content(ctx: &McpContext, user: &str) -> String {
    ctx.build(&ContextRequest::for_user(user)).await.unwrap().0.map(|m| m.content.to_string()).unwrap_or_default()
}

/// The `servers:` entry of a server under test, for extra arguments.
pub type ServerYaml = Box<dyn Fn(&[&str]) -> String>;

/// What one server under test serves, for [`exercise`]: `s:` ids, a log of
/// the reads it served (one URI a line), and the file behind its live resource.
pub struct Sut {
    /// The `servers:` entry, named `s`, for the given extra server arguments.
    pub yaml: ServerYaml,
    pub log: PathBuf,
    pub live: PathBuf,
    /// Arguments that make reads say `ttlMs: 300, cacheScope: public`.
    pub ttl_args: Vec<String>,
    /// Arguments that make reads say `cacheScope: private`.
    pub private_args: Vec<String>,
    /// Arguments for the listing part (a blob listed; the other parts inject
    /// everything listed, so they run without these).
    pub list_args: Vec<String>,
    /// The revision the server must have negotiated.
    pub expect_protocol: &'static str,
    /// How many resources it lists (over several pages).
    pub resources: usize,
    /// It sends `ttlMs`/`cacheScope` on this revision (the Python SDK drops
    /// them for 2025-11-25 peers, whose schema has no such fields; rmcp
    /// keeps them): the hint parts of the scenario apply.
    pub hints: bool,
}

pub fn reads_of(log: &Path, uri: &str) -> usize {
    read_log(log).iter().filter(|l| l.as_str() == uri).count()
}

/// The scenario every server must pass on every revision: every page
/// listed, text and blob read, a pushed change reaching the next injection
/// (with no read sent before it), `ttlMs` expiry, a `private` answer not
/// served to a second user, and not-found reported as not found.
pub async fn exercise(sut: &Sut, what: &str) {
    // Listing, reads, not found.
    let args: Vec<&str> = sut.list_args.iter().map(String::as_str).collect();
    let hub = Hub::connect(&config(&format!("servers:\n{}", (sut.yaml)(&args)))).await;
    assert!(hub.failures().is_empty(), "{what}: {:?}", hub.failures());
    let status = &hub.status()[0];
    assert_eq!(status.protocol.as_deref(), Some(sut.expect_protocol), "{what}");
    assert!(status.listing_complete, "{what}");
    assert_eq!(hub.resources().len(), sut.resources, "{what}: {:?}", hub.resources());
    let text = hub.read(&id("s:fx://doc/1")).await.unwrap();
    assert!(mcp_context::compose::render_text(&text, None).contains("Document 1"), "{what}: {text:?}");
    let blob = hub.read(&id("s:fx://blob")).await.unwrap();
    assert!(matches!(blob.parts[0], mcp_context::ContentPart::Blob { .. }), "{what}: {blob:?}");
    let missing = hub.read(&id("s:fx://doc/999")).await.unwrap_err();
    assert!(matches!(missing, Error::NotFound { .. }), "{what}: not found must be NotFound, got {missing:?}");
    hub.close().await;

    // A pushed change reaches the next injection; nothing is read before it.
    let ctx = McpContext::from_config(&config(&format!("servers:\n{}", (sut.yaml)(&[])))).await.unwrap();
    assert!(content(&ctx, "u").await.contains("version one"), "{what}");
    // Subscriptions are in place once every cached resource is covered.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Reads only (the log also has subscribe/listen lines).
    let reads = || read_log(&sut.log).into_iter().filter(|l| l.starts_with("fx://")).count();
    let cold = reads();
    for _ in 0..5 {
        assert!(content(&ctx, "u").await.contains("version one"), "{what}");
    }
    assert_eq!(reads(), cold, "{what}: a warm injection sent a read: {:?}", read_log(&sut.log));
    std::fs::write(&sut.live, "version two").unwrap();
    assert!(eventually(async || content(&ctx, "u").await.contains("version two")).await, "{what}: push not heard");
    assert_eq!(reads_of(&sut.log, "fx://live"), 2, "{what}: {:?}", read_log(&sut.log));
    assert_eq!(reads_of(&sut.log, "fx://doc/1"), 2, "{what}: only the changed resource is read again");
    ctx.close().await;

    if !sut.hints {
        return;
    }
    // ttlMs: kept while fresh, read again once expired.
    let args: Vec<&str> = sut.ttl_args.iter().map(String::as_str).collect();
    let ctx = McpContext::from_config(&config(&format!("servers:\n{}", (sut.yaml)(&args)))).await.unwrap();
    let before = reads_of(&sut.log, "fx://doc/0");
    content(&ctx, "u").await;
    content(&ctx, "u").await;
    assert_eq!(reads_of(&sut.log, "fx://doc/0"), before + 1, "{what}: within ttlMs the cache answers");
    tokio::time::sleep(Duration::from_millis(400)).await;
    content(&ctx, "u").await;
    assert_eq!(reads_of(&sut.log, "fx://doc/0"), before + 2, "{what}: after ttlMs it reads again");
    ctx.close().await;

    // private: cached for its user only.
    let args: Vec<&str> = sut.private_args.iter().map(String::as_str).collect();
    let ctx = McpContext::from_config(&config(&format!("servers:\n{}", (sut.yaml)(&args)))).await.unwrap();
    let before = reads_of(&sut.log, "fx://doc/0");
    content(&ctx, "ann").await;
    content(&ctx, "ann").await;
    assert_eq!(reads_of(&sut.log, "fx://doc/0"), before + 1, "{what}: ann's private entry serves ann");
    content(&ctx, "ben").await;
    assert_eq!(reads_of(&sut.log, "fx://doc/0"), before + 2, "{what}: ben never gets ann's private entry");
    ctx.close().await;
}

/// A server's read log and live page in `dir` (the page starting as
/// "version one").
pub fn live_files(dir: &Path) -> (PathBuf, PathBuf) {
    let live = dir.join("live.txt");
    std::fs::write(&live, "version one").unwrap();
    (dir.join("reads.log"), live)
}

/// The rmcp fixture, one revision.
fn rmcp_sut(t: &str, dir: &Path, protocol: Option<&'static str>, expect: &'static str) -> Sut {
    let (log, live) = live_files(dir);
    let (t, l, v) = (t.to_owned(), log.clone(), live.clone());
    Sut {
        yaml: Box::new(move |extra: &[&str]| {
            let mut args = vec!["--n", "5", "--page-size", "2", "--subscribe", "--record-lifecycle"];
            args.extend(["--record", l.to_str().unwrap(), "--live", v.to_str().unwrap()]);
            args.extend_from_slice(extra);
            fixture_as("s", &t, &args, protocol)
        }),
        log,
        live,
        ttl_args: vec!["--read-ttl-ms".into(), "300".into()],
        private_args: vec!["--private".into()],
        list_args: vec!["--specials".into()],
        expect_protocol: expect,
        // 5 docs, fx://live, 13 specials (the dangerous ones are not listed).
        resources: 19,
        hints: true,
    }
}

#[tokio::test]
async fn rmcp_server_on_2026_07_28() {
    let (t, dir) = (tag(), tempfile::tempdir().unwrap());
    exercise(&rmcp_sut(&t, dir.path(), Some("2026-07-28"), "2026-07-28"), "rmcp pinned 2026").await;
    let log = read_log(&dir.path().join("reads.log"));
    assert!(log.iter().any(|l| l.starts_with("listen ")), "2026-07-28 uses subscriptions/listen: {log:?}");
    assert!(!log.iter().any(|l| l == "initialize"), "{log:?}");
}

#[tokio::test]
async fn rmcp_server_on_2025_11_25() {
    let (t, dir) = (tag(), tempfile::tempdir().unwrap());
    exercise(&rmcp_sut(&t, dir.path(), Some("2025-11-25"), "2025-11-25"), "rmcp pinned 2025").await;
    let log = read_log(&dir.path().join("reads.log"));
    assert!(log.iter().any(|l| l.starts_with("subscribe ")), "2025-11-25 uses resources/subscribe: {log:?}");
    assert!(!log.iter().any(|l| l == "discover" || l.starts_with("listen ")), "{log:?}");
}

#[tokio::test]
async fn rmcp_server_under_auto_speaks_2026_07_28() {
    let (t, dir) = (tag(), tempfile::tempdir().unwrap());
    exercise(&rmcp_sut(&t, dir.path(), None, "2026-07-28"), "rmcp auto").await;
}

/// A server that only speaks 2026-07-28 (rejects `initialize`) and one that
/// only speaks 2025-11-25 (no `server/discover`) both work under `auto`,
/// each fails with its cause when pinned to the other, and the legacy
/// server's fallback is one round trip on the same process (no re-spawn).
#[tokio::test]
async fn auto_works_with_servers_that_speak_only_one_revision() {
    let t = tag();
    let dir = tempfile::tempdir().unwrap();
    let log = |n: &str| dir.path().join(n);
    let (l26, l25) = (log("only26.log"), log("only25.log"));
    let yaml = format!(
        "servers:\n{}{}",
        fixture_as("new", &t, &["--only-2026", "--record-lifecycle", "--record", l26.to_str().unwrap()], None),
        fixture_as("old", &t, &["--only-2025", "--record-lifecycle", "--record", l25.to_str().unwrap()], None),
    );
    let hub = Hub::connect(&config(&yaml)).await;
    assert!(hub.failures().is_empty(), "{:?}", hub.failures());
    let protocols: Vec<_> = hub.status().into_iter().map(|s| s.protocol.unwrap_or_default()).collect();
    assert_eq!(protocols, ["2026-07-28", "2025-11-25"]);
    assert_eq!(hub.resources().len(), 6);
    assert_eq!(read_log(&l26), ["discover"]);
    assert_eq!(read_log(&l25), ["discover", "initialize"], "fallback on the same connection");
    hub.close().await;

    let yaml = format!(
        "servers:\n{}{}",
        fixture_as("new", &t, &["--only-2026"], Some("2025-11-25")),
        fixture_as("old", &t, &["--only-2025"], Some("2026-07-28")),
    );
    let hub = Hub::connect(&config(&yaml)).await;
    let failures = hub.failures();
    assert_eq!(failures.len(), 2, "{failures:?}");
    assert!(failures[0].error.contains("initialize failed"), "{failures:?}");
    assert!(failures[1].error.contains("server/discover failed"), "{failures:?}");
    assert!(failures[1].error.contains("Method not found"), "{failures:?}");
    hub.close().await;
    assert!(wait_gone(&t, Duration::from_secs(5)).await.is_empty());
}

/// Time to the first listing of a legacy (2025-only) server, under `auto`
/// and pinned to 2025-11-25: the probe is one extra round trip. Medians of
/// 7 connections each, printed; the bound is generous for a loaded machine.
#[tokio::test]
async fn auto_costs_a_legacy_server_one_round_trip() {
    let t = tag();
    let mut times: [Vec<f64>; 2] = [vec![], vec![]];
    for _ in 0..7 {
        for (i, p) in [None, Some("2025-11-25")].into_iter().enumerate() {
            let started = Instant::now();
            let hub = Hub::connect(&config(&format!("servers:\n{}", fixture_as("old", &t, &["--only-2025"], p)))).await;
            let elapsed = started.elapsed().as_secs_f64() * 1e3;
            assert_eq!(hub.resources().len(), 3);
            assert_eq!(hub.status()[0].protocol.as_deref(), Some("2025-11-25"));
            times[i].push(elapsed);
            hub.close().await;
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (auto, pinned) = (median(&mut times[0]), median(&mut times[1]));
    eprintln!(
        "time to first listing, legacy server: auto {auto:.2} ms, pinned 2025-11-25 {pinned:.2} ms (medians of 7)"
    );
    assert!(auto - pinned < 50.0, "auto {auto:.2} ms vs pinned {pinned:.2} ms");
}

/// A server that never answers costs its `timeout_ms` under `auto`, not
/// rmcp's built-in 10 s wait for `server/discover`.
#[tokio::test]
async fn a_silent_server_costs_its_timeout_under_auto() {
    let t = tag();
    let yaml = format!("servers:\n{}    timeout_ms: 700\n", fixture_as("mute", &t, &["--hang-init"], None))
        .replace("    timeout_ms: 20000\n", "");
    let started = Instant::now();
    let hub = Hub::connect(&config(&yaml)).await;
    let elapsed = started.elapsed();
    let failures = hub.failures();
    assert!(failures[0].error.contains("no answer to server/discover or initialize within 700 ms"), "{failures:?}");
    assert!(elapsed < Duration::from_millis(3000), "{elapsed:?}");
    hub.close().await;
}

/// The negotiated revision in `list --json`, `list --verbose` and in the report.
#[tokio::test]
async fn the_negotiated_revision_is_shown() {
    let t = tag();
    let (_dir, path) = temp_config(&format!(
        "servers:\n{}{}",
        fixture_as("new", &t, &["--n", "1"], None),
        fixture_as("old", &t, &["--n", "1"], Some("2025-11-25"))
    ));
    let out = std::process::Command::new(MCP_CONTEXT)
        .args(["--config", path.to_str().unwrap(), "list", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let servers = json["servers"].as_array().expect("servers in list --json");
    let protocol = |name: &str| servers.iter().find(|s| s["name"] == name).map(|s| s["protocol"].clone());
    assert_eq!(protocol("new"), Some("2026-07-28".into()), "{json}");
    assert_eq!(protocol("old"), Some("2025-11-25".into()), "{json}");

    // `list --verbose`: the same in the text form, one line a server.
    let out = std::process::Command::new(MCP_CONTEXT)
        .args(["--config", path.to_str().unwrap(), "list", "--verbose"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let servers = text.split("\nServers:\n").nth(1).unwrap_or_else(|| panic!("no Servers: section in {text}"));
    assert_eq!(
        servers.lines().collect::<Vec<_>>(),
        [
            "- new: protocol 2026-07-28, 1 resources, 1 templates",
            "- old: protocol 2025-11-25, 1 resources, 1 templates"
        ],
        "{text}"
    );
    // Without it, the text form is the listing alone.
    let out =
        std::process::Command::new(MCP_CONTEXT).args(["--config", path.to_str().unwrap(), "list"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("Servers:"));

    // The report's server section, in `preview --json` and its table.
    let out = std::process::Command::new(MCP_CONTEXT)
        .args(["--config", path.to_str().unwrap(), "preview", "--user", "u", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        json["servers"],
        serde_json::json!([{"server": "new", "protocol": "2026-07-28"}, {"server": "old", "protocol": "2025-11-25"}]),
        "{json}"
    );
}

/// A list result's `ttlMs` is honoured: a server that cannot announce
/// `list_changed` but says its list keeps 300 ms is re-listed after that
/// (at least 1 s), on both revisions.
#[tokio::test]
async fn list_ttl_re_lists_a_server_without_list_changed() {
    for protocol in ["2026-07-28", "2025-11-25"] {
        let t = tag();
        let dir = tempfile::tempdir().unwrap();
        let n = dir.path().join("n.txt");
        std::fs::write(&n, "2").unwrap();
        let args = ["--list-file", n.to_str().unwrap(), "--list-ttl-ms", "300"];
        let hub = Hub::connect(&config(&format!("servers:\n{}", fixture_as("fx", &t, &args, Some(protocol))))).await;
        assert_eq!(hub.resources().len(), 2, "{protocol}");
        std::fs::write(&n, "3").unwrap();
        let started = Instant::now();
        while hub.resources().len() != 3 && started.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(hub.resources().len(), 3, "{protocol}: re-listed after the list's ttlMs");
        hub.close().await;
    }
}

/// Streamable HTTP on 2026-07-28 (rmcp's server, stateless): discovery,
/// listing, reads, and a change pushed on `subscriptions/listen` (a
/// long-lived POST answered as an event stream) reaching the next injection
/// of every one of three clients (replicas) of the one server: their listen
/// requests carry the same JSON-RPC ids, and each must still hear every change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamable_http_on_2026_07_28_with_listen() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live.txt");
    std::fs::write(&live, "version one").unwrap();
    let opts = crate::handler::Options {
        n: 2,
        subscribe: true,
        live: Some(live.to_string_lossy().into_owned()),
        ..Default::default()
    };
    let (url, fixture, stop) = http_fixture(opts).await;
    let yaml = format!("servers:\n  web:\n    url: {url}\n    protocol: \"2026-07-28\"\n");
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let ctx = McpContext::from_config(&config(&yaml)).await.unwrap();
        assert_eq!(ctx.hub().status()[0].protocol.as_deref(), Some("2026-07-28"), "{:?}", ctx.hub().failures());
        assert!(content(&ctx, "u").await.contains("version one"));
        replicas.push(ctx);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reads = || fixture.reads.load(std::sync::atomic::Ordering::SeqCst);
    for version in ["version two", "version three"] {
        let before = reads();
        for ctx in &replicas {
            assert!(content(ctx, "u").await.contains("version"));
        }
        assert_eq!(reads(), before, "a warm injection sent a read");
        std::fs::write(&live, version).unwrap();
        for (i, ctx) in replicas.iter().enumerate() {
            assert!(
                eventually(async || content(ctx, "u").await.contains(version)).await,
                "replica {i} never heard of {version:?} over HTTP"
            );
        }
    }
    for ctx in replicas {
        ctx.close().await;
    }
    stop.cancel();
}
