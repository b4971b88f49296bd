//! mcp-context as a peer of the lab (`../shared/lab`, `EXTRA_PEERS`).
//!
//! Spawns the server command, lists every page, reads every resource (one
//! at a time by default, as the lab's peers do; `--concurrent` for up to 256
//! in flight), builds the
//! lab's canonical context string (text parts and `[Binary Data (MIME)]`
//! joined with "\n\n", in list order), counts o200k tokens, and prints the
//! lab's JSON line. All of it through the library's own hub and renderer.
//!
//! ```text
//! cargo build --release --example lab_peer --example bench_server
//! target/release/examples/lab_peer --concurrent --server-cmd "target/release/examples/bench_server --n 1000"
//! ```
//! `--url URL` gathers from a Streamable HTTP server instead (the latency
//! lab, `../shared/lab/http/`), with the config's own defaults for an HTTP
//! server (`--reads N` sets `max_concurrent_reads`, `--protocol P` the
//! revision). A concurrent gather reads each page while the next is listed
//! (`Hub::connect_reading_ahead`, what `preview` does); `--no-read-ahead`
//! reads after the last page, as before.
//!
//! The client is named `mcp-context-sequential` or `mcp-context-concurrent`
//! (plus `-multi-thread` with that flag), so the lab's own
//! `EXTRA_PEERS='rust|peer;rust --concurrent|peer --concurrent'` gives two
//! distinct rows. (Before 2026-11-30 09:20 UTC the default was concurrent and
//! named plain `mcp-context`; BENCHMARKS.md's older tables use that name.)

use std::time::Instant;

use mcp_context::servers::Hub;
use mcp_context::{Config, ContentPart, ResourceId};

fn split_command(s: &str) -> Vec<String> {
    // Minimal shell-like split: whitespace, with '...' and "..." quoting.
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for c in s.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            (None, c) => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn flag_value(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

/// CPU time of this process (all threads, user + system), in seconds.
#[allow(unsafe_code, reason = "getrusage(2), a system call std lacks")]
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct we pass and has no other effect.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

/// A current-thread runtime: a gather is I/O on one connection, and keeping
/// the service loop and the readers on one thread saves a cross-thread
/// wake-up per answer (measured: read phase 30 ms here against 39 ms on the
/// default multi-thread runtime; `--multi-thread` picks that one).
fn main() {
    let multi = std::env::args().any(|a| a == "--multi-thread");
    let mut rt =
        if multi { tokio::runtime::Builder::new_multi_thread() } else { tokio::runtime::Builder::new_current_thread() };
    rt.enable_all().build().expect("tokio runtime").block_on(run(multi));
}

async fn run(multi: bool) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sequential = !args.iter().any(|a| a == "--concurrent");
    let workload: Vec<String> = ["--n", "--size", "--page-size", "--seed"]
        .iter()
        .filter_map(|f| flag_value(&args, f).map(|v| format!("{f} {v}")))
        .collect();
    let cmd = flag_value(&args, "--server-cmd")
        .or_else(|| std::env::var("BENCH_SERVER_CMD").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| {
            let lab = std::env::var("LAB_DIR").unwrap_or_else(|_| "../shared/lab".into());
            format!("{lab}/.venv/bin/python {lab}/bench_server.py {}", workload.join(" "))
        });
    let mut parts = split_command(&cmd);
    if flag_value(&args, "--server-cmd").is_some() || std::env::var("BENCH_SERVER_CMD").is_ok() {
        // The lab passes workload flags separately; forward them to our server command too.
        for w in &workload {
            parts.extend(w.split(' ').map(str::to_owned));
        }
    }
    // `--url URL`: a Streamable HTTP server (the latency lab, ../shared/lab/http),
    // with the config's defaults unless `--reads N` or `--protocol P` say otherwise.
    let url = flag_value(&args, "--url");
    let mut server = match &url {
        Some(url) => serde_json::json!({"url": url, "timeout_ms": 60000}),
        None => serde_json::json!({
            "command": parts[0], "args": &parts[1..], "timeout_ms": 60000,
            "inherit_env": ["BENCH_N", "BENCH_SIZE", "BENCH_PAGE_SIZE", "BENCH_SEED", "VIRTUAL_ENV", "PYTHONPATH"],
            "max_concurrent_reads": 256
        }),
    };
    if let Some(n) = flag_value(&args, "--reads") {
        server["max_concurrent_reads"] = n.parse::<u64>().expect("--reads N").into();
    }
    if let Some(p) = flag_value(&args, "--protocol") {
        server["protocol"] = p.into();
    }
    let yaml = serde_json::json!({
        "servers": {"bench": server},
        "context": {"max_resource_bytes": 1u64 << 30}
    })
    .to_string();
    let config = Config::from_yaml(&yaml, std::path::Path::new("./lab-peer.yaml")).expect("peer config");
    // Load the tokenizer before the clock starts, as the lab's peers do.
    let bpe = tiktoken_rs::o200k_base_singleton();

    // Concurrent gathers read each page while the next is listed, as
    // `preview` does (`--no-read-ahead`: only after the last page).
    let ahead = !sequential && !args.iter().any(|a| a == "--no-read-ahead");
    let start = Instant::now();
    let hub = if ahead { Hub::connect_reading_ahead(&config, |_| true).await } else { Hub::connect(&config).await };
    if let Some(f) = hub.failures().first() {
        eprintln!("lab_peer: {}: {}", f.server, f.error);
        std::process::exit(1);
    }
    let status = hub.status().remove(0);
    let resources = hub.listed("bench");
    let ids: Vec<ResourceId> = resources.iter().map(|r| r.id.clone()).collect();
    let t_read = Instant::now();
    let cpu_read = cpu_seconds();
    let results = if sequential {
        let mut v = Vec::with_capacity(ids.len());
        for id in &ids {
            v.push(hub.read(id).await);
        }
        v
    } else {
        hub.read_many(&ids).await
    };
    let mut context = String::new();
    for (r, res) in resources.iter().zip(results) {
        let c = res.unwrap_or_else(|e| panic!("read {}: {e}", r.id));
        for p in &c.parts {
            if !context.is_empty() {
                context.push_str("\n\n");
            }
            match p {
                ContentPart::Text { text, .. } => context.push_str(text),
                ContentPart::Blob { mime_type, .. } => {
                    let mime = mime_type.as_deref().or(r.mime_type.as_deref()).unwrap_or("application/octet-stream");
                    context.push_str(&format!("[Binary Data ({mime})]"));
                }
                other => panic!("a part of a kind the lab never serves: {other:?}"),
            }
        }
    }
    let read_s = t_read.elapsed().as_secs_f64();
    let client_cpu_read_s = cpu_seconds() - cpu_read;
    let gather_s = start.elapsed().as_secs_f64();
    let t_tok = Instant::now();
    let tokens = bpe.encode_ordinary(&context).len();
    let tokenize_s = t_tok.elapsed().as_secs_f64();
    let total_s = start.elapsed().as_secs_f64();
    let protocol = status.protocol.clone().unwrap_or_default();
    let t_close = Instant::now();
    hub.close().await;
    let shutdown_s = t_close.elapsed().as_secs_f64();
    let line = serde_json::json!({
        "client": format!(
            "mcp-context{}{}{}",
            if sequential { "-sequential" } else { "-concurrent" },
            if !sequential && !ahead { "-no-read-ahead" } else { "" },
            if multi { "-multi-thread" } else { "" }
        ),
        "resources": resources.len(),
        "chars": context.chars().count(),
        "tokens": tokens,
        "spawn_to_connected_s": status.connect_ms / 1e3,
        "list_s": status.list_ms / 1e3,
        "read_s": read_s,
        "tokenize_s": tokenize_s,
        "total_s": total_s,
        "gather_s": gather_s,
        "shutdown_s": shutdown_s,
        "client_cpu_read_s": client_cpu_read_s,
        "mode": format!(
            "{}{}{}",
            if sequential { "sequential" } else { "concurrent" },
            if ahead { ", read-ahead" } else { "" },
            if multi { ", multi-thread" } else { "" }
        ),
        "pages": serde_json::Value::Null,
        "protocol": protocol,
        "encoding": "o200k_base",
        "impl": format!("mcp-context {} (rmcp 3.11)", env!("CARGO_PKG_VERSION")),
    });
    println!("{line}");
}
