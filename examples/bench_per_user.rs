//! Per-user upstream credentials (issue 35): 100 users, each with their own
//! view of one MCP server that authorises every request by the caller's key
//! (tests/mcp_auth/server.py, the official Python SDK's bearer-token
//! support, over Streamable HTTP on loopback).
//!
//! Measures, for each user in turn: the cold injection (the user's view
//! opened: connect, list the user's notes, read them) and the warm one (the
//! view open, contents from its private cache), p50 and p90; and the memory
//! per user (RSS after the 100 views are open, less RSS before, / 100).
//!
//! ```sh
//! python3 -m venv target/py-mcp && target/py-mcp/bin/pip install -r tests/python-mcp/requirements.txt
//! cargo run --release --example bench_per_user [-- USERS]
//! ```

use std::path::Path;
use std::time::{Duration, Instant};

use mcp_context::credentials::TokenSet;
use mcp_context::{Config, McpContext, Policy};

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4096
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() {
    let users: usize = std::env::args().nth(1).and_then(|n| n.parse().ok()).unwrap_or(100);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let py = root.join("target/py-mcp/bin/python");
    let dir = tempfile::tempdir().unwrap();
    let keys: serde_json::Map<String, serde_json::Value> =
        (0..users).map(|i| (format!("bench-key-{i:04}-s3cr3t"), serde_json::Value::from(format!("user{i}")))).collect();
    std::fs::write(dir.path().join("keys.json"), serde_json::to_vec(&keys).unwrap()).unwrap();
    let port_file = dir.path().join("port");
    let mut server = tokio::process::Command::new(&py)
        .arg(root.join("tests/mcp_auth/server.py"))
        .arg("--keys")
        .arg(dir.path().join("keys.json"))
        .arg("--log")
        .arg(dir.path().join("server.log"))
        .arg("--port-file")
        .arg(&port_file)
        .kill_on_drop(true)
        .spawn()
        .expect("target/py-mcp/bin/python (see the doc comment)");
    let port = loop {
        if let Ok(p) = std::fs::read_to_string(&port_file) {
            break p.trim().to_owned();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let yaml = format!(
        "servers:\n  notes:\n    url: http://127.0.0.1:{port}/mcp\n    auth: {{ type: per_user_headers, headers: [Authorization] }}\n\
         credentials:\n  store: memory\n  max_users: {}\n",
        users.max(1)
    );
    let config = Config::from_yaml(&yaml, &dir.path().join("c.yaml")).unwrap();
    let ctx = McpContext::with_policy(&config, Policy::allow_all()).await;
    let store = ctx.credentials().unwrap().store().clone();
    for i in 0..users {
        let mut t = TokenSet::bearer(String::new().into(), "notes");
        t.headers = vec![("Authorization".into(), format!("Bearer bench-key-{i:04}-s3cr3t").into())];
        store.put("notes", &format!("user{i}"), &t).await.unwrap();
    }
    // One user first, outside the figures: the tokenizer and the first connection's setup.
    let _ = ctx.build(&"nobody".into()).await.unwrap();
    let rss0 = rss_bytes();
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    let mut stages = [0.0f64; 3];
    for i in 0..users {
        let user = format!("user{i}");
        let t = Instant::now();
        let (_, r) = ctx.build(&user.as_str().into()).await.unwrap();
        cold.push(t.elapsed());
        assert_eq!(r.included.len(), 3, "user{i}: {r:?}");
    }
    let rss1 = rss_bytes();
    for _round in 0..5 {
        for i in 0..users {
            let user = format!("user{i}");
            let t = Instant::now();
            let (_, r) = ctx.build(&user.as_str().into()).await.unwrap();
            warm.push(t.elapsed());
            assert_eq!(r.included.len(), 3);
            stages[0] += r.timings.select_ms;
            stages[1] += r.timings.read_ms;
            stages[2] += r.timings.pack_ms;
        }
    }
    println!("users: {users}, views open: {}", ctx.per_user_views());
    println!(
        "cold injection (view opened: connect, list, read 3): p50 {:.2} ms, p90 {:.2} ms",
        pct(&mut cold, 0.5),
        pct(&mut cold, 0.9)
    );
    println!(
        "warm injection (view open, private cache):            p50 {:.3} ms, p90 {:.3} ms",
        pct(&mut warm, 0.5),
        pct(&mut warm, 0.9)
    );
    let n = warm.len() as f64;
    println!(
        "warm stages (mean): select {:.3} ms (credential lookup, view, policy), read {:.3} ms, pack {:.3} ms",
        stages[0] / n,
        stages[1] / n,
        stages[2] / n
    );
    println!(
        "memory: RSS {:.1} MiB -> {:.1} MiB, {:.0} KiB per user",
        rss0 as f64 / 1048576.0,
        rss1 as f64 / 1048576.0,
        (rss1.saturating_sub(rss0)) as f64 / users as f64 / 1024.0
    );
    ctx.close().await;
    let _ = server.kill().await;
}
