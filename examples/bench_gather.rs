//! The whole pipeline, measured: cold gather, warm injection, tokenizer
//! throughput and peak memory, on the peer lab's workload.
//!
//! ```text
//! cargo build --release --example bench_server --example bench_gather
//! target/release/examples/bench_gather [--n 1000] [--size 2048] [--rounds 20] [--server-cmd CMD]
//! ```
//! The default server is the Rust `bench_server` example next to this binary.

#[path = "bench/workload.rs"]
mod workload;

use std::time::{Duration, Instant};

use mcp_context::{Config, ContextRequest, McpContext, Policy};

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = flag(&args, "--n").and_then(|v| v.parse().ok()).unwrap_or(1000);
    let size: usize = flag(&args, "--size").and_then(|v| v.parse().ok()).unwrap_or(2048);
    let rounds: usize = flag(&args, "--rounds").and_then(|v| v.parse().ok()).unwrap_or(20);
    let server = flag(&args, "--server-cmd").unwrap_or_else(|| {
        let me = std::env::current_exe().expect("current exe");
        me.with_file_name("bench_server").to_string_lossy().into_owned()
    });
    let config_for = |n: usize| {
        let mut parts: Vec<String> = server.split_whitespace().map(str::to_owned).collect();
        parts.extend(["--n".into(), n.to_string(), "--size".into(), size.to_string()]);
        let yaml = serde_json::json!({
            "servers": {"bench": {"command": parts[0], "args": &parts[1..], "timeout_ms": 60000}},
            "context": {"model": "gpt-4o", "max_tokens": 100_000_000u64, "max_resource_bytes": 1u64 << 30}
        })
        .to_string();
        Config::from_yaml(&yaml, std::path::Path::new("./bench.yaml")).expect("config")
    };
    let config = config_for(n);
    // Tokenizer load is a once-per-process cost; keep it out of the gather figure.
    let t0 = Instant::now();
    let _ = tiktoken_rs::o200k_base_singleton();
    let bpe_load = t0.elapsed();
    // The fixed base: this process after the same pipeline on 10 resources
    // (runtime, tokenizer tables, rmcp, thread stacks, allocator arenas).
    {
        let small = McpContext::with_policy(&config_for(10), Policy::allow_all()).await;
        let _ = small.build(&ContextRequest::for_user("bench")).await.expect("build");
        small.close().await;
    }
    let rss_base = peak_rss_kib();

    // 1. Cold gather: spawn, handshake, list every page, read all, render, count, build the message.
    let start = Instant::now();
    let ctx = McpContext::with_policy(&config, Policy::allow_all()).await;
    let connected = start.elapsed();
    let (message, report) = ctx.build(&ContextRequest::for_user("bench")).await.expect("build");
    let cold = start.elapsed();
    let message = message.expect("a message");
    let rss_cold = peak_rss_kib();
    assert_eq!(report.included.len(), n, "every resource included: {:?}", report.excluded.first());

    // 2. Warm injection: everything cached, nothing changed.
    let mut warm = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        let (m, r) = ctx.build(&ContextRequest::for_user("bench")).await.expect("build");
        warm.push(t.elapsed());
        if std::env::var_os("BENCH_VERBOSE").is_some() {
            eprintln!("warm timings: {:?}", r.timings);
        }
        assert_eq!(m.map(|m| m.tokens), Some(message.tokens));
        assert_eq!(r.included.len(), n);
    }
    let warm = median(warm);
    ctx.close().await;

    if args.iter().any(|a| a == "--skip-tokenizer") {
        println!("cold {:.1} ms, warm {:.3} ms", cold.as_secs_f64() * 1e3, warm.as_secs_f64() * 1e3);
        return;
    }
    // 3. Tokenizer throughput on 10 MB of English-like text.
    let mut corpus = String::new();
    let mut i = 0usize;
    while corpus.len() < 10_000_000 {
        corpus.push_str(&workload::make_text(workload::resource_seed(workload::DEFAULT_SEED, i), 2048));
        corpus.push_str("\n\n");
        i += 1;
    }
    let bpe = tiktoken_rs::o200k_base_singleton();
    let mut tok_times = Vec::new();
    let mut tokens = 0;
    for _ in 0..3 {
        let t = Instant::now();
        tokens = bpe.encode_ordinary(&corpus).len();
        tok_times.push(t.elapsed());
    }
    let tok = median(tok_times);
    let mbps = corpus.len() as f64 / 1e6 / tok.as_secs_f64();

    let content_bytes: usize = n * size;
    println!(
        "workload: n={n} size={size} (every 10th a blob), message {} tokens, {} chars",
        message.tokens,
        message.content.len()
    );
    println!("| figure | value |");
    println!("|---|---:|");
    println!("| cold gather (spawn → message) | {:.1} ms |", cold.as_secs_f64() * 1e3);
    println!("|  of which spawn+initialize+list | {:.1} ms |", connected.as_secs_f64() * 1e3);
    println!("| warm injection (median of {rounds}) | {:.3} ms |", warm.as_secs_f64() * 1e3);
    println!("| cold / warm | {:.0}x |", cold.as_secs_f64() / warm.as_secs_f64());
    println!("| tokenizer o200k_base, 10 MB ({tokens} tokens) | {mbps:.1} MB/s |");
    println!("| o200k_base load (once per process) | {:.0} ms |", bpe_load.as_secs_f64() * 1e3);
    println!(
        "| peak RSS after cold gather | {:.1} MiB (base after a 10-resource run {:.1} MiB; content {:.1} MiB; growth {:.2}x content) |",
        rss_cold as f64 / 1024.0,
        rss_base as f64 / 1024.0,
        content_bytes as f64 / 1048576.0,
        (rss_cold.saturating_sub(rss_base)) as f64 * 1024.0 / content_bytes as f64
    );
}
