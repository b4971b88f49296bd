//! Remote servers at latency (issue 31): what overlaps on the wire, seen in
//! the order a real HTTP server (`examples/bench_server --http`, every
//! answer held a while) logged the requests. Speed itself is measured in
//! BENCHMARKS.md, never here.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use mcp_context::servers::Hub;
use mcp_context::{Config, ContextRequest, McpContext};
use tokio::io::AsyncBufReadExt;

use crate::common::*;

/// `examples/bench_server --http 127.0.0.1:0 --log` with `args`: the child,
/// its URL, and the request lines it logged so far (arrival order).
pub(crate) async fn bench_http(args: &[&str]) -> (tokio::process::Child, String, Arc<Mutex<Vec<String>>>) {
    let exe = std::env::current_exe().unwrap();
    let server: PathBuf = exe.parent().unwrap().parent().unwrap().join("examples").join("bench_server");
    let mut child = tokio::process::Command::new(server)
        .args(["--http", "127.0.0.1:0", "--log"])
        .args(args)
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let first = tokio::time::timeout(std::time::Duration::from_secs(30), lines.next_line()).await;
    let url = match first {
        Ok(Ok(Some(l))) => {
            l.strip_prefix("listening on ").unwrap_or_else(|| panic!("bench_server said {l:?}")).to_owned()
        }
        other => panic!("bench_server did not start: {other:?}"),
    };
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = log.clone();
    tokio::spawn(async move {
        while let Ok(Some(l)) = lines.next_line().await {
            sink.lock().unwrap().push(l);
        }
    });
    (child, url, log)
}

fn http_config(url: &str, policy: Option<&std::path::Path>) -> Config {
    let policy = policy.map(|p| format!("policy: {:?}\n", p.to_string_lossy())).unwrap_or_default();
    config(&format!(
        "{policy}servers:\n  bench:\n    url: {url}\n    timeout_ms: 20000\n    protocol: \"2025-11-25\"\n"
    ))
}

const POLICY: &str = r#"
users:
  alice:
    allow:
      - { server: bench, uri: "bench://doc/**" }
    deny:
      - { uri: "bench://doc/[0-4]" }
"#;

/// A cold build for one user on a server 30 ms away per answer: the first
/// read reaches the server before the last page is asked for, templates
/// are listed alongside the pages, nothing the policy denies is ever read,
/// and the message is the same bytes as without reading ahead.
#[tokio::test]
async fn reads_of_a_page_start_while_the_next_page_is_listed() {
    let (_server, url, log) =
        bench_http(&["--n", "60", "--size", "300", "--page-size", "10", "--delay-ms", "30"]).await;
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, POLICY).unwrap();
    let cfg = http_config(&url, Some(&policy));
    let req = ContextRequest::for_user("alice").with_budget(1_000_000);

    let ctx = McpContext::from_config_for_user(&cfg, "alice").await.unwrap();
    let (ahead, report) = ctx.build(&req).await.unwrap();
    assert_eq!(ctx.hub().reads_ahead(), 0, "what the build did not take is dropped");
    ctx.close().await;
    let lines = std::mem::take(&mut *log.lock().unwrap());
    let last_page = lines.iter().rposition(|l| l.starts_with("list ")).expect("listed");
    let first_read = lines.iter().position(|l| l.starts_with("read ")).expect("read");
    assert!(first_read < last_page, "reads wait for the last page: {lines:?}");
    let templates = lines.iter().position(|l| l == "templates").expect("templates listed");
    assert!(templates < last_page, "templates are asked for after the pages: {lines:?}");
    let reads: Vec<&String> = lines.iter().filter(|l| l.starts_with("read ")).collect();
    assert_eq!(reads.len(), 55, "{reads:?}");
    for i in 0..5 {
        assert!(!lines.contains(&format!("read bench://doc/{i}")), "denied doc/{i} was read: {lines:?}");
    }
    assert_eq!(report.included.len(), 55);

    // The same build on a hub that does not read ahead: the same message.
    let ctx = McpContext::from_config(&cfg).await.unwrap();
    let (plain, _) = ctx.build(&req).await.unwrap();
    ctx.close().await;
    let lines = std::mem::take(&mut *log.lock().unwrap());
    let last_page = lines.iter().rposition(|l| l.starts_with("list ")).unwrap();
    assert!(!lines[..last_page].iter().any(|l| l.starts_with("read ")), "{lines:?}");
    assert!(ahead.unwrap().content == plain.unwrap().content, "reading ahead changed the message");
}

/// A hub that reads ahead and is never asked: closing it (or stopping the
/// read-ahead) leaves nothing pending, and a later read is a fresh one.
#[tokio::test]
async fn reads_ahead_nobody_takes_are_dropped() {
    let (_server, url, log) = bench_http(&["--n", "20", "--size", "200", "--page-size", "10"]).await;
    let hub = Hub::connect_reading_ahead(&http_config(&url, None), |r| r.id.uri.ends_with('7')).await;
    assert_eq!(hub.reads_ahead(), 2, "only what `decide` allowed (doc/7, doc/17)");
    hub.stop_reading_ahead();
    assert_eq!(hub.reads_ahead(), 0);
    let id = mcp_context::ResourceId::parse("bench:bench://doc/7").unwrap();
    hub.read(&id).await.unwrap();
    hub.close().await;
    let lines = log.lock().unwrap().clone();
    let reads: Vec<&String> = lines.iter().filter(|l| l.starts_with("read ")).collect();
    assert!(reads.iter().all(|l| l.ends_with('7')), "{reads:?}");
    // doc/7 and doc/17 ahead (or cancelled before they left), plus the fresh read.
    assert!(lines.iter().filter(|l| *l == "read bench://doc/7").count() >= 1, "{lines:?}");
}
