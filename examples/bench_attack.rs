//! What hostile clients cost `mcp-context serve`: the proxy's memory under a
//! slow-body attack by callers with no key, and the latency of a normal
//! caller's request while a slowloris holds connections open (issue 27).
//!
//! ```text
//! cargo build --release --bin mcp-context --example bench_attack
//! target/release/examples/bench_attack [--exe PATH] [--connections 32] [--mib 8] [--hold-s 8]
//! ```
//!
//! `--exe` names the proxy binary (default: the release `mcp-context` next
//! to this example), so that an older build can be measured with the same
//! bench. The proxy runs the bundled demo server, one caller key
//! (`key-alice`, user alice) and an in-process upstream answering at once.
//!
//! 1. Slow bodies: `--connections` clients with no key each declare a 9 MiB
//!    body, send `--mib` MiB of it at once, then one byte a second for
//!    `--hold-s` seconds. Reported: the proxy's RSS before, at its peak, and
//!    after the clients hang up, and what the clients were answered.
//! 2. Slowloris: 50 connections send a request's first header line and
//!    never finish. Reported: p50/max of 20 normal requests meanwhile, and
//!    how many of the 50 the proxy had closed after 12 s.

use std::time::{Duration, Instant};

use axum::Router;
use axum::response::IntoResponse;
use axum::routing::post;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

fn flag(args: &[String], name: &str, default: usize) -> usize {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

const COMPLETION: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}"#;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let connections = flag(&args, "--connections", 32);
    let mib = flag(&args, "--mib", 8);
    let hold = Duration::from_secs(flag(&args, "--hold-s", 8) as u64);
    let me = std::env::current_exe().unwrap();
    let exe = args
        .iter()
        .position(|a| a == "--exe")
        .and_then(|i| args.get(i + 1))
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| me.parent().unwrap().parent().unwrap().join("mcp-context"));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let app = Router::new().route(
            "/v1/chat/completions",
            post(|| async { ([("content-type", "application/json")], COMPLETION).into_response() }),
        );
        axum::serve(listener, app).await.unwrap();
    });
    let dir = std::env::temp_dir().join(format!("bench-attack-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("c.yaml");
    let digest = hash("key-alice");
    std::fs::write(
        &config,
        format!(
            "servers:\n  demo:\n    command: {exe:?}\n    args: [demo-server]\ncontext:\n  max_tokens: 4000\n\
             serve:\n  keys:\n    - {{ sha256: \"{digest}\", user: alice }}\n  max_body_bytes: 10485760\n"
        ),
    )
    .unwrap();
    let mut child = tokio::process::Command::new(&exe)
        .args(["serve", "--config"])
        .arg(&config)
        .args(["--listen", "127.0.0.1:0", "--upstream", &upstream])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", exe.display()));
    let line = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines().next_line().await.unwrap().unwrap();
    let url = line.split("listening on ").nth(1).unwrap().split(',').next().unwrap().to_owned();
    let addr = url.trim_start_matches("http://").to_owned();
    let pid = child.id().unwrap();
    let client = reqwest::Client::new();
    let normal = || {
        client
            .post(format!("{url}/v1/chat/completions"))
            .bearer_auth("key-alice")
            .header("content-type", "application/json")
            .body(r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#)
            .send()
    };
    for _ in 0..20 {
        assert!(normal().await.unwrap().status().is_success());
    }
    println!("proxy: {}", exe.display());

    // 1. Slow bodies from callers with no key.
    let before = rss_kib(pid);
    let mut peak = before;
    let mut clients = Vec::new();
    for _ in 0..connections {
        let addr = addr.clone();
        clients.push(tokio::spawn(async move {
            let Ok(s) = tokio::net::TcpStream::connect(&addr).await else { return "connect failed".to_owned() };
            let (mut rd, mut wr) = s.into_split();
            let writer = tokio::spawn(async move {
                let head = format!(
                    "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\n\r\n",
                    9 << 20
                );
                wr.write_all(head.as_bytes()).await?;
                wr.write_all(&vec![b' '; mib << 20]).await?;
                let until = Instant::now() + hold;
                while Instant::now() < until {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    wr.write_all(b" ").await?;
                }
                Ok::<_, std::io::Error>(())
            });
            let mut answer = vec![0u8; 64];
            let n = tokio::time::timeout(hold + Duration::from_secs(5), rd.read(&mut answer)).await;
            writer.abort();
            match n {
                Ok(Ok(n)) if n > 12 => String::from_utf8_lossy(&answer[9..12]).into_owned(),
                Ok(_) => "closed".to_owned(),
                Err(_) => "no answer".to_owned(),
            }
        }));
    }
    let sampling = Instant::now();
    while sampling.elapsed() < hold {
        peak = peak.max(rss_kib(pid));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut answers = std::collections::BTreeMap::new();
    for c in clients {
        *answers.entry(c.await.unwrap()).or_insert(0) += 1;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rss_kib(pid);
    println!(
        "slow bodies: {connections} clients x {mib} MiB, no key: RSS before {:.1} MiB, peak {:.1} MiB, after {:.1} MiB; \
         answers {answers:?}",
        before as f64 / 1024.0,
        peak as f64 / 1024.0,
        after as f64 / 1024.0
    );

    // 2. Slowloris.
    let mut lorises = Vec::new();
    for _ in 0..50 {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        lorises.push(s);
    }
    let mut took = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let ok = normal().await.map(|r| r.status().is_success()).unwrap_or(false);
        took.push((t.elapsed().as_secs_f64() * 1e3, ok));
    }
    took.sort_by(|a, b| a.0.total_cmp(&b.0));
    let served = took.iter().filter(|t| t.1).count();
    tokio::time::sleep(Duration::from_secs(12)).await;
    let mut closed = 0;
    for s in &mut lorises {
        let mut b = [0u8; 16];
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(20), s.read(&mut b)).await {
            closed += 1;
        }
    }
    println!(
        "slowloris: 50 connections; 20 normal requests meanwhile: {served} served, p50 {:.2} ms, max {:.2} ms; \
         closed by the proxy after 12 s: {closed} of 50",
        took[10].0, took[19].0
    );
    // SAFETY: kill(2) has no memory-safety preconditions (a system call std lacks).
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(pid as i32, libc::SIGTERM)
    };
    let _ = tokio::time::timeout(Duration::from_secs(15), child.wait()).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Hex SHA-256, as `serve hash-key` prints it.
fn hash(key: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}
