//! A fast stdio MCP server with the peer lab's workload (`../shared/lab`).
//!
//! Same flags and environment variables as `lab/bench_server.py` (`--n`,
//! `--size`, `--page-size`, `--seed`; `BENCH_*`), same URIs, texts, blobs,
//! annotations and `offset:N` cursors, byte for byte (the generator is a port
//! of CPython's Mersenne Twister, checked against Python in
//! `tests/all/bench.rs`). The Python server tops out near 1500 reads/s and
//! hides client differences, so this one serves **pre-serialised** responses:
//! every list page and read result is JSON-encoded once at start-up, and a
//! request costs one small parse and one write. It speaks newline-delimited
//! JSON-RPC directly (initialize, ping, resources/list, resources/read,
//! resources/templates/list) rather than through an SDK, so the server is
//! never what a client benchmark measures.
//!
//! `--protocol 2026-07-28` serves that revision: `server/discover` is
//! answered, and every list and read result carries `resultType: "complete"`
//! and the cache hints `ttlMs: 30000, cacheScope: "public"` (the lifetime
//! the client's default `cache_ttl_ms` gives a 2025 answer, so both
//! revisions cache alike). The default, `2025-11-25`, answers
//! `server/discover` with "method not found", as servers built before
//! 2026-07-28 do.
//!
//! `--http ADDR` serves the same bytes over Streamable HTTP instead, as the
//! latency lab (`../shared/lab/http/`) asks of a bench server: one endpoint
//! (`/mcp`), stateless (no session id), every request answered with one
//! `application/json` body, notifications and responses with 202, `GET` and
//! `DELETE` with 405, both revisions per request (a request carrying
//! `MCP-Protocol-Version: 2026-07-28` gets the 2026 fields), and
//! `GET /stats?reset=1` with per-run counters (requests by method,
//! connections, most requests in flight). `--delay-ms N` holds every answer
//! N ms (a slow server, for tests without the lab's link) and `--log` prints
//! one line per request to stderr in arrival order (`list <cursor>`,
//! `read <uri>`, ...), which the tests read to see what overlapped.
//!
//! `cargo run --release --example bench_server -- --n 1000 [--protocol 2026-07-28] [--http 0.0.0.0:8765]`

#[path = "bench/http_server.rs"]
mod http;
#[path = "bench/workload.rs"]
mod workload;

use std::collections::HashMap;
use std::io::{BufRead, Write};

use serde_json::{Value, json};

fn arg(args: &[String], name: &str, env: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .or_else(|| std::env::var(env).ok().filter(|v| !v.is_empty()))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Pre-serialised `result` objects: list pages by cursor, reads by URI.
struct Workload {
    pages: HashMap<Option<String>, String>,
    reads: HashMap<String, String>,
    /// Serve 2026-07-28.
    modern: bool,
}

/// The 2026-07-28 fields of every list and read result.
const MODERN_FIELDS: &str = r#""resultType":"complete","ttlMs":30000,"cacheScope":"public","#;

/// Inserts [`MODERN_FIELDS`] at the start of a serialised result object.
fn modernise(result: String) -> String {
    format!("{{{MODERN_FIELDS}{}", &result[1..])
}

fn build(n: usize, size: usize, page_size: usize, seed: u64, modern: bool) -> Workload {
    let finish = |s: String| if modern { modernise(s) } else { s };
    let specs = workload::build(n, size, page_size, seed);
    let mut reads = HashMap::with_capacity(n);
    let resources: Vec<Value> = specs
        .iter()
        .map(|s| {
            let content = match (&s.text, &s.blob_b64) {
                (Some(t), _) => json!({"uri": s.uri, "mimeType": s.mime, "text": t}),
                (None, Some(b)) => json!({"uri": s.uri, "mimeType": s.mime, "blob": b}),
                (None, None) => json!({"uri": s.uri, "text": ""}),
            };
            reads.insert(s.uri.clone(), finish(json!({"contents": [content]}).to_string()));
            json!({
                "uri": s.uri, "name": s.name, "title": s.title, "description": s.description,
                "mimeType": s.mime, "size": s.size,
                "annotations": {"audience": ["assistant"], "priority": s.priority},
            })
        })
        .collect();
    let mut pages = HashMap::new();
    for (cursor, range, next) in workload::page_cursors(n, page_size) {
        let mut page = json!({"resources": &resources[range]});
        if let Some(next) = next {
            page["nextCursor"] = json!(next);
        }
        pages.insert(cursor, finish(page.to_string()));
    }
    Workload { pages, reads, modern }
}

/// One JSON-RPC answer line (no newline) for `msg`, `None` for a
/// notification or a response. Shared by the stdio and HTTP modes.
fn answer(w: &Workload, msg: &Value) -> Option<String> {
    let id = msg.get("id")?;
    msg.get("method")?;
    let ok = |result: &str| Some(format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{result}}}"));
    let err = |code: i32, message: &str| {
        Some(json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}).to_string())
    };
    let params = &msg["params"];
    match msg["method"].as_str().unwrap_or("") {
        "initialize" => {
            let asked = params["protocolVersion"].as_str().unwrap_or("2025-11-25");
            let version = if ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"].contains(&asked) {
                asked
            } else {
                "2025-11-25"
            };
            let result = json!({
                "protocolVersion": version,
                "capabilities": {"resources": {}},
                "serverInfo": {"name": "mcp-context-bench", "version": "0.1.0"},
            });
            ok(&result.to_string())
        }
        "server/discover" if w.modern => {
            let result = json!({
                "resultType": "complete",
                "supportedVersions": ["2026-07-28"],
                "capabilities": {"resources": {}},
                "ttlMs": 0,
                "cacheScope": "public",
            });
            ok(&result.to_string())
        }
        "ping" => ok("{}"),
        "resources/list" => {
            let cursor = params["cursor"].as_str().map(str::to_owned);
            match w.pages.get(&cursor) {
                Some(page) => ok(page),
                None => err(-32602, &format!("invalid cursor: {cursor:?}")),
            }
        }
        "resources/templates/list" if w.modern => ok(&modernise("{\"resourceTemplates\":[]}".into())),
        "resources/templates/list" => ok("{\"resourceTemplates\":[]}"),
        "resources/read" => {
            let uri = params["uri"].as_str().unwrap_or("");
            match w.reads.get(uri) {
                Some(result) => ok(result),
                // Not found: -32602 on 2026-07-28, -32002 before.
                None => err(if w.modern { -32602 } else { -32002 }, &format!("Resource not found: {uri}")),
            }
        }
        other => err(-32601, &format!("method not found: {other}")),
    }
}

fn serve(w: &Workload) -> std::io::Result<()> {
    let stdin = std::io::stdin().lock();
    let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    for line in stdin.lines() {
        let line = line?;
        let Ok(msg) = serde_json::from_str::<Value>(&line) else { continue };
        if let Some(a) = answer(w, &msg) {
            writeln!(out, "{a}")?;
            out.flush()?;
        }
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n = arg(&args, "--n", "BENCH_N", workload::DEFAULT_N as u64) as usize;
    let size = arg(&args, "--size", "BENCH_SIZE", workload::DEFAULT_SIZE as u64) as usize;
    let page_size = arg(&args, "--page-size", "BENCH_PAGE_SIZE", workload::DEFAULT_PAGE_SIZE as u64).max(1) as usize;
    let seed = arg(&args, "--seed", "BENCH_SEED", workload::DEFAULT_SEED);
    let started = std::time::Instant::now();
    let modern = match args.iter().position(|a| a == "--protocol").and_then(|i| args.get(i + 1)).map(String::as_str) {
        None | Some("2025-11-25") => false,
        Some("2026-07-28") => true,
        Some(other) => {
            eprintln!("bench_server: --protocol must be 2026-07-28 or 2025-11-25, not {other}");
            std::process::exit(2);
        }
    };
    if let Some(addr) = args.iter().position(|a| a == "--http").and_then(|i| args.get(i + 1)) {
        // Both revisions per request (the lab's rule): a 2026-07-28 request
        // gets the 2026 fields; `--protocol 2025-11-25` (the default) still
        // answers `server/discover` with "method not found".
        let legacy = build(n, size, page_size, seed, false);
        let current = build(n, size, page_size, seed, true);
        let options = http::Options {
            delay: std::time::Duration::from_millis(arg(&args, "--delay-ms", "BENCH_DELAY_MS", 0)),
            log: args.iter().any(|a| a == "--log"),
            discover: modern,
        };
        if let Err(e) = http::run(addr, legacy, current, options) {
            eprintln!("bench_server: {e}");
            std::process::exit(1);
        }
        return;
    }
    let w = build(n, size, page_size, seed, modern);
    if args.iter().any(|a| a == "--verbose") {
        eprintln!("[bench_server] n={n} size={size} page_size={page_size} seed={seed} build={:?}", started.elapsed());
    }
    if let Err(e) = serve(&w)
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        eprintln!("bench_server: {e}");
    }
}
