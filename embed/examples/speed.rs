//! What the model costs on this machine: load time, embedding a typical question (the
//! per-request cost: wall-clock p50, and CPU time per call, which a busy machine inflates less),
//! and one full 256-token window (a chunk, off the request path).
//! `cargo run --release -p mcp-context-embed --example speed`.

use std::time::Instant;

use mcp_context_embed::Encoder;

/// This thread's CPU time in ms (Linux: /proc/thread-self/schedstat), 0 elsewhere.
fn cpu_ms() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |ns| ns / 1e6)
}

fn main() {
    let t = Instant::now();
    let e = Encoder::get();
    println!("load: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let question = "How do I make my program start by itself when I type its name at the shell?";
    let n = 200;
    let cpu = cpu_ms();
    let mut times: Vec<f64> = (0..n)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(e.embed(question));
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    let cpu = (cpu_ms() - cpu) / n as f64;
    times.sort_by(f64::total_cmp);
    println!(
        "question ({} tokens): p50 {:.2} ms, p90 {:.2} ms wall; {cpu:.2} ms CPU per call",
        e.ids(question).len(),
        times[n / 2],
        times[n * 9 / 10]
    );
    let chunk = "The interpreter reads the file, compiles it to byte code and runs it; modules are cached. ".repeat(20);
    let n = 10;
    let (t, cpu) = (Instant::now(), cpu_ms());
    for _ in 0..n {
        std::hint::black_box(e.embed(&chunk));
    }
    let per = t.elapsed().as_secs_f64() * 1e3 / n as f64;
    println!("chunk ({} tokens): {per:.1} ms wall, {:.1} ms CPU", e.ids(&chunk).len(), (cpu_ms() - cpu) / n as f64);
}
