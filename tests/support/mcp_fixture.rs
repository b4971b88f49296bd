//! `mcp-fixture`: the test MCP server over stdio (test-only binary).
//!
//! Flags configure the workload (see `fixture.rs`) and process-level faults:
//! `--exit-at-start`, `--hang-init` (never answers), `--garbage` (writes
//! non-JSON to stdout first), `--ignore-term` (ignores SIGTERM and stdin EOF),
//! `--fs` (a normalising file-like server), `--grandchild` (spawns a long-lived child in its process group, pid written
//! to `--pid-file`), `--traceback` (a Python-like traceback on stderr, with
//! the value of $FIXTURE_SECRET in it, then exit 1), `--banner` (a banner line
//! on stdout before serving), `--hang-list` (never answers resources/list),
//! `--only-2026` (rejects `initialize`), `--only-2025` (no `server/discover`),
//! `--record-lifecycle` (also logs discover/initialize/listen), `--list-ttl-ms N` / `--read-ttl-ms N` (list / read results carry
//! `ttlMs: N`, `cacheScope: public`), `--change-before-subscribe TEXT` (the
//! live file takes TEXT, unnotified, just before fx://live's first subscription).

#[path = "fixture.rs"]
mod handler;

use handler::{Fixture, Options};
use rmcp::ServiceExt;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |n: &str| args.iter().any(|a| a == n);
    let val = |n: &str| args.iter().position(|a| a == n).and_then(|i| args.get(i + 1)).cloned();
    let num = |n: &str, d: usize| val(n).and_then(|v| v.parse().ok()).unwrap_or(d);
    if flag("--exit-at-start") {
        std::process::exit(3);
    }
    if flag("--traceback") {
        let secret = std::env::var("FIXTURE_SECRET").unwrap_or_default();
        eprintln!("INFO starting server");
        for i in 0..30 {
            eprintln!("DEBUG noise line {i}");
        }
        eprintln!("Traceback (most recent call last):");
        eprintln!("  File \"/srv/app/server.py\", line 12, in <module>");
        eprintln!("    client = connect(token=\"{secret}\")");
        eprintln!("  File \"/srv/app/db.py\", line 40, in connect");
        eprintln!("    raise ConnectionError(f\"database refused token {{token}}\")");
        eprintln!("ConnectionError: database refused token {secret} at db.internal:5432 {}", "x".repeat(400));
        std::process::exit(1);
    }
    if flag("--banner") {
        println!("Serving HTTP on 0.0.0.0 port 8000 (http://0.0.0.0:8000/) ...");
    }
    if let Some(pid_file) = val("--pid-file") {
        let _ = std::fs::write(pid_file, std::process::id().to_string());
    }
    if flag("--ignore-term") {
        // SAFETY: setting a signal disposition to SIG_IGN is always sound.
        unsafe {
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
        }
    }
    if flag("--grandchild") {
        // Deliberately never waited for: it must outlive us unless killed.
        #[allow(clippy::zombie_processes)]
        let child = std::process::Command::new("sleep").arg("1000").spawn().expect("spawn sleep");
        if let Some(f) = val("--grandchild-pid-file") {
            let _ = std::fs::write(f, child.id().to_string());
        }
    }
    let opts = Options {
        n: num("--n", 3),
        size: num("--size", 0),
        page_size: num("--page-size", 0),
        empty_cursor: flag("--empty-cursor"),
        repeat_cursor: flag("--repeat-cursor"),
        specials: flag("--specials"),
        prefix: val("--prefix").unwrap_or_default(),
        record: val("--record"),
        slow_ms: num("--slow-ms", 50) as u64,
        slow_wait_for: num("--slow-wait-for", 0),
        big_bytes: num("--big-bytes", 4 << 20),
        blob_bytes: num("--blob-bytes", 0),
        exit_on_read: flag("--exit-on-read"),
        no_templates: flag("--no-templates"),
        dangerous: flag("--dangerous"),
        subscribe: flag("--subscribe"),
        live: val("--live"),
        list_file: val("--list-file"),
        fail_file: val("--fail-file"),
        private: flag("--private"),
        flood: num("--flood", 0),
        list_hang: flag("--hang"),
        hang_list: flag("--hang-list"),
        fs: flag("--fs"),
        dir: val("--dir"),
        only_2026: flag("--only-2026"),
        only_2025: flag("--only-2025"),
        record_lifecycle: flag("--record-lifecycle"),
        list_ttl_ms: val("--list-ttl-ms").and_then(|v| v.parse().ok()),
        read_ttl_ms: val("--read-ttl-ms").and_then(|v| v.parse().ok()),
        delay_ms: num("--delay-ms", 0) as u64,
        answer_after_ms: num("--answer-after-ms", 0) as u64,
        change_before_subscribe: val("--change-before-subscribe"),
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async move {
        if flag("--hang-init") {
            tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
        }
        if flag("--garbage") {
            println!("this is not json");
        }
        let running = match Fixture::new(opts).serve(rmcp::transport::stdio()).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("fixture: {e}");
                return;
            }
        };
        let _ = running.waiting().await;
        if flag("--ignore-term") {
            // Stdin is closed; a stubborn server keeps running anyway.
            tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
        }
    });
}
