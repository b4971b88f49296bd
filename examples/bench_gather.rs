//! The whole pipeline, measured: cold gather, warm injection, tokenizer
//! throughput and peak memory, on the peer lab's workload.
//!
//! ```text
//! cargo build --release --example bench_server --example bench_gather
//! target/release/examples/bench_gather [--n 1000] [--size 2048] [--rounds 20] [--server-cmd CMD]
//!     [--current-thread] [--skip-tokenizer] [--protocol 2026-07-28|2025-11-25]
//! target/release/examples/bench_gather --sweep 250,500,1000,2000,4000 [--size 2048] [--current-thread]
//! target/release/examples/bench_gather --relevance [--n 1000] [--size 2048] [--rounds 200]
//! valgrind --tool=callgrind target/release/examples/bench_gather --cold-callgrind [--n 1000] [--size 2048]
//! ```
//! `--relevance`: query-aware context under `context.select: auto` and a
//! 4000-token budget, everything cached: the warm injection of an unchanged
//! request (composition memo hit) against one whose question is new each
//! time (ranked and packed again from the chunk index), and the first,
//! cold, build (read, chunk, index, rank).
//! The default server is the Rust `bench_server` example next to this binary.
//! `--protocol P` makes it serve revision P and pins the client to P;
//! without it the server speaks 2025-11-25 and the client `auto` (the probe
//! then costs one round trip).
//! The runtime is tokio's multi-thread one unless `--current-thread` is given.
//!
//! Memory is peak RSS (`VmHWM`) after the cold gather, over a base taken in
//! the same process after the same pipeline on 10 resources. `--sweep` runs
//! one process per `n` (`--memory-only`, 3 each, median) and fits a line
//! through peak RSS against content size: its slope is what each byte of
//! content costs, its intercept the fixed base, free of whatever the 10-resource
//! run did not warm (a blocking thread's first tokenizer use, say).

#![allow(unsafe_code, reason = "CPU time of this process: clock_gettime(2) / getrusage(2), system calls std lacks")]

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

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(ns) = flag(&args, "--sweep") {
        return sweep(&args, &ns);
    }
    let runtime = if args.iter().any(|a| a == "--current-thread") {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().enable_all().build()
    };
    runtime.expect("runtime").block_on(run(args));
}

/// Runs this binary with `--memory-only` for each `n` and fits peak RSS
/// against content size by least squares.
fn sweep(args: &[String], ns: &str) {
    let size: usize = flag(args, "--size").and_then(|v| v.parse().ok()).unwrap_or(2048);
    let me = std::env::current_exe().expect("current exe");
    let mut points = Vec::new();
    println!("| n | content (MiB) | base (MiB) | peak (MiB) | growth / content (3 runs) |");
    println!("|---:|---:|---:|---:|---|");
    for n in ns.split(',').map(|v| v.trim().parse::<usize>().expect("--sweep takes a list of n")) {
        let mut runs: Vec<(f64, f64)> = (0..3)
            .map(|_| {
                let mut cmd = std::process::Command::new(&me);
                cmd.args(["--memory-only", "--n", &n.to_string(), "--size", &size.to_string()]);
                cmd.args(args.iter().filter(|a| *a == "--current-thread"));
                if let Some(server) = flag(args, "--server-cmd") {
                    cmd.args(["--server-cmd", &server]);
                }
                let out = cmd.output().expect("run bench_gather --memory-only");
                let text = String::from_utf8_lossy(&out.stdout);
                let line = text.lines().find(|l| l.starts_with("memory ")).expect("a memory line");
                let field = |k: &str| -> f64 {
                    line.split_whitespace().find_map(|w| w.strip_prefix(k)).and_then(|v| v.parse().ok()).expect(k)
                };
                (field("base_kib="), field("peak_kib="))
            })
            .collect();
        let content = (n * size) as f64;
        let ratios: Vec<String> = runs.iter().map(|(b, p)| format!("{:.2}x", (p - b) * 1024.0 / content)).collect();
        runs.sort_by(|a, b| a.1.total_cmp(&b.1));
        let (base, peak) = runs[1];
        println!(
            "| {n} | {:.2} | {:.1} | {:.1} | {} |",
            content / 1048576.0,
            base / 1024.0,
            peak / 1024.0,
            ratios.join(" / ")
        );
        points.push((content, peak * 1024.0));
    }
    let k = points.len() as f64;
    let (mx, my) = (points.iter().map(|p| p.0).sum::<f64>() / k, points.iter().map(|p| p.1).sum::<f64>() / k);
    let slope = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum::<f64>()
        / points.iter().map(|(x, _)| (x - mx).powi(2)).sum::<f64>();
    println!("fit (median peaks): peak RSS = {:.1} MiB + {slope:.2} x content", (my - slope * mx) / 1048576.0);
}

/// `--relevance` (see the module docs).
async fn relevance(server: &str, n: usize, size: usize, rounds: usize) {
    let mut parts: Vec<String> = server.split_whitespace().map(str::to_owned).collect();
    parts.extend(["--n".into(), n.to_string(), "--size".into(), size.to_string()]);
    let yaml = serde_json::json!({
        "servers": {"bench": {"command": parts[0], "args": &parts[1..], "timeout_ms": 60000}},
        "context": {"model": "gpt-4o", "max_tokens": 4000, "select": "auto"}
    })
    .to_string();
    let config = Config::from_yaml(&yaml, std::path::Path::new("./bench.yaml")).expect("config");
    let ctx = McpContext::with_policy(&config, Policy::allow_all()).await;
    // Questions of words from the resources' own text, a different one each round.
    let words: Vec<String> = workload::make_text(workload::resource_seed(workload::DEFAULT_SEED, 0), 4096)
        .split_whitespace()
        .map(|w| w.trim_matches(|c: char| !c.is_alphanumeric()).to_lowercase())
        .filter(|w| w.len() > 3)
        .collect();
    let question =
        |i: usize| (0..6).map(|k| words[(i * 7 + k * 13) % words.len()].as_str()).collect::<Vec<_>>().join(" ") + "?";
    let request = |q: String| ContextRequest::for_user("bench").with_query(q);
    let t = Instant::now();
    let (m, report) = ctx.build(&request(question(0))).await.expect("build");
    let cold = t.elapsed();
    assert_eq!(report.mode, Some(mcp_context::SelectMode::Relevance));
    let tokens = m.expect("a message").tokens;
    let mut same = Vec::new();
    let mut fresh = Vec::new();
    let mut pack = Vec::new();
    for i in 0..rounds {
        let t = Instant::now();
        let (_, r) = ctx.build(&request(question(0))).await.expect("build");
        same.push(t.elapsed());
        assert_eq!(r.tokens, tokens);
        let t = Instant::now();
        let (_, r) = ctx.build(&request(question(i + 1))).await.expect("build");
        fresh.push(t.elapsed());
        assert_eq!(r.mode, Some(mcp_context::SelectMode::Relevance));
        assert!(r.tokens <= 4000);
        pack.push(Duration::from_secs_f64(r.timings.pack_ms / 1e3));
    }
    ctx.close().await;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (same, fresh, pack) = (median(same), median(fresh), median(pack));
    let (texts, chunk_cpu, tokenise_cpu, ratios) = cold_cpu(n, size);
    println!("workload: n={n} size={size} (every 10th a blob), budget 4000, select auto, {rounds} rounds");
    println!("| figure | value |");
    println!("|---|---:|");
    println!("| cold build (read all, chunk, index, rank, pack) | {:.1} ms |", ms(cold));
    println!("| warm injection, unchanged request (memo hit), median | {:.3} ms |", ms(same));
    println!("| warm injection, new question each time, median | {:.3} ms |", ms(fresh));
    println!("|  of which rank + pack (report.timings.pack_ms), median | {:.3} ms |", ms(pack));
    println!("| added by ranking a new question | {:.3} ms |", ms(fresh) - ms(same));
    println!(
        "| cold chunk + index of the {texts} texts, thread CPU, median of {COLD_PAIRS} | {:.1} ms |",
        ms(chunk_cpu)
    );
    println!("| tokenising the same texts once, thread CPU, median of {COLD_PAIRS} | {:.1} ms |", ms(tokenise_cpu));
    let q = |f: f64| ratios[((ratios.len() - 1) as f64 * f).round() as usize];
    println!(
        "| chunk + index / tokenising, per pair: median (middle half; all) | {:.2}x ({:.2}–{:.2}x; {:.2}–{:.2}x) |",
        q(0.5),
        q(0.25),
        q(0.75),
        ratios[0],
        ratios[ratios.len() - 1]
    );
}

/// CPU time of this thread (steadier than wall time on a shared machine).
fn thread_cpu() -> Duration {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to write to, and a clock every Linux has.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// The workload's texts (not its blobs) as cached resources.
fn cold_items(n: usize, size: usize) -> Vec<(mcp_context::Resource, std::sync::Arc<mcp_context::Contents>)> {
    use mcp_context::{Contents, Resource, ResourceId};
    use std::sync::Arc;
    (0..n)
        .filter(|i| !workload::is_blob(*i))
        .map(|i| {
            let text = workload::make_text(workload::resource_seed(workload::DEFAULT_SEED, i), size);
            let id = ResourceId::new("bench", format!("bench://doc/{i}")).expect("id");
            let resource =
                Resource::new(id).with_name(format!("doc-{i}")).with_mime_type("text/plain").with_size(size as u64);
            let contents = Contents::text(text, Some("text/plain"));
            (resource, Arc::new(contents))
        })
        .collect()
}

type Items = [(mcp_context::Resource, std::sync::Arc<mcp_context::Contents>)];

/// Chunks and indexes `items` from scratch (a new index); the number indexed.
fn chunk_all(tok: &mcp_context::compose::Tokenizer, items: &Items) -> usize {
    let index = mcp_context::compose::ChunkIndex::new(
        mcp_context::compose::DEFAULT_CHUNK_TOKENS,
        mcp_context::compose::DEFAULT_CHUNK_OVERLAP,
    );
    for (r, c) in items {
        index.prepare(tok, r, c);
    }
    index.len()
}

/// Tokenises the texts of `items` once; their tokens.
fn tokenise_all(tok: &mcp_context::compose::Tokenizer, items: &Items) -> usize {
    let mut tokens = 0;
    for (_, c) in items {
        if let mcp_context::ContentPart::Text { text, .. } = &c.parts[0] {
            tokens += tok.count(text);
        }
    }
    tokens
}

/// Thread CPU time of chunking and indexing the workload's texts (not its
/// blobs) from scratch (a new index each run), and of tokenising them once.
///
/// One warm-up of each, then [`COLD_PAIRS`] pairs, the order inside a pair
/// alternating: a pair's two runs are a few tens of milliseconds apart, so
/// the ratio of each pair is steadier than a ratio of medians taken over
/// the whole loop on a VM whose speed drifts. Returns the number of texts,
/// the medians of each, and the pairs' ratios, sorted.
fn cold_cpu(n: usize, size: usize) -> (usize, Duration, Duration, Vec<f64>) {
    let (tok, _) = mcp_context::compose::Tokenizer::for_model("gpt-4o");
    let items = cold_items(n, size);
    let chunk_once = || {
        let t = thread_cpu();
        assert_eq!(chunk_all(&tok, &items), items.len());
        thread_cpu() - t
    };
    let tokenise_once = || {
        let t = thread_cpu();
        assert!(tokenise_all(&tok, &items) > 0);
        thread_cpu() - t
    };
    chunk_once();
    tokenise_once();
    let (mut chunk, mut tokenise, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..COLD_PAIRS {
        let (c, t) = if i % 2 == 0 {
            (chunk_once(), tokenise_once())
        } else {
            let t = tokenise_once();
            (chunk_once(), t)
        };
        ratios.push(c.as_secs_f64() / t.as_secs_f64());
        chunk.push(c);
        tokenise.push(t);
    }
    ratios.sort_by(f64::total_cmp);
    (items.len(), median(chunk), median(tokenise), ratios)
}

/// Pairs of cold runs [`cold_cpu`] measures.
const COLD_PAIRS: usize = 15;

/// `--cold-callgrind`: the cold ratio of `--relevance` as instruction
/// counts, which other work on the machine does not change. Both steps run
/// once to warm up (as [`cold_cpu`]'s pairs are), then once each in
/// their own function; read their inclusive counts with
/// `valgrind --tool=callgrind --callgrind-out-file=cg.out target/release/examples/bench_gather --cold-callgrind`
/// and `callgrind_annotate --inclusive=yes cg.out | grep measured_`.
fn cold_callgrind(n: usize, size: usize) {
    let (tok, _) = mcp_context::compose::Tokenizer::for_model("gpt-4o");
    let items = cold_items(n, size);
    chunk_all(&tok, &items);
    tokenise_all(&tok, &items);
    let indexed = measured_chunk_and_index(&tok, &items);
    let tokens = measured_tokenise(&tok, &items);
    println!("{indexed} texts chunked and indexed; {tokens} tokens");
}

#[inline(never)]
fn measured_chunk_and_index(tok: &mcp_context::compose::Tokenizer, items: &Items) -> usize {
    std::hint::black_box(chunk_all(tok, std::hint::black_box(items)))
}

#[inline(never)]
fn measured_tokenise(tok: &mcp_context::compose::Tokenizer, items: &Items) -> usize {
    std::hint::black_box(tokenise_all(tok, std::hint::black_box(items)))
}

async fn run(args: Vec<String>) {
    if args.iter().any(|a| a == "--cold-callgrind") {
        let n = flag(&args, "--n").and_then(|v| v.parse().ok()).unwrap_or(1000);
        let size = flag(&args, "--size").and_then(|v| v.parse().ok()).unwrap_or(2048);
        return cold_callgrind(n, size);
    }
    if args.iter().any(|a| a == "--relevance") {
        let me = std::env::current_exe().expect("current exe");
        let server = flag(&args, "--server-cmd")
            .unwrap_or_else(|| me.with_file_name("bench_server").to_string_lossy().into_owned());
        let n = flag(&args, "--n").and_then(|v| v.parse().ok()).unwrap_or(1000);
        let size = flag(&args, "--size").and_then(|v| v.parse().ok()).unwrap_or(2048);
        let rounds = flag(&args, "--rounds").and_then(|v| v.parse().ok()).unwrap_or(200);
        return relevance(&server, n, size, rounds).await;
    }
    let n: usize = flag(&args, "--n").and_then(|v| v.parse().ok()).unwrap_or(1000);
    let size: usize = flag(&args, "--size").and_then(|v| v.parse().ok()).unwrap_or(2048);
    let rounds: usize = flag(&args, "--rounds").and_then(|v| v.parse().ok()).unwrap_or(20);
    let server = flag(&args, "--server-cmd").unwrap_or_else(|| {
        let me = std::env::current_exe().expect("current exe");
        me.with_file_name("bench_server").to_string_lossy().into_owned()
    });
    let protocol = flag(&args, "--protocol");
    let config_for = |n: usize| {
        let mut parts: Vec<String> = server.split_whitespace().map(str::to_owned).collect();
        parts.extend(["--n".into(), n.to_string(), "--size".into(), size.to_string()]);
        let mut bench = serde_json::json!({"command": parts[0], "args": &parts[1..], "timeout_ms": 60000});
        if let Some(p) = &protocol {
            bench["args"].as_array_mut().expect("args").extend([serde_json::json!("--protocol"), serde_json::json!(p)]);
            bench["protocol"] = serde_json::json!(p);
        }
        let yaml = serde_json::json!({
            "servers": {"bench": bench},
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
    if args.iter().any(|a| a == "--memory-only") {
        println!("memory n={n} size={size} base_kib={rss_base} peak_kib={rss_cold}");
        return;
    }

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
        "workload: n={n} size={size} (every 10th a blob), {} runtime, message {} tokens, {} chars",
        if args.iter().any(|a| a == "--current-thread") { "current-thread" } else { "multi-thread" },
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
