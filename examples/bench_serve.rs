//! The latency `mcp-context serve` adds over calling the same local upstream
//! directly: p50 and p99 at 1, 16 and 64 concurrent clients, non-streamed
//! (whole response) and streamed (time to first byte), for chat completions
//! and for Anthropic's Messages API (`--apis chat,messages`), with 1000 visible
//! resources cached and a budget of 8000 tokens; throughput at 64 clients;
//! the proxy's RSS over many requests.
//!
//! By default every client sends its next request as soon as the last one
//! answered, against an upstream that answers at once: the machine is
//! saturated, so "added" is mostly queueing behind the proxy's CPU (16
//! clients × its CPU per request, shared with the clients and the upstream).
//! `--pace-ms M` has each client send at most one request every M ms
//! (clients staggered), an offered load of clients × 1000 / M requests a
//! second, so the rows show what a request waits for the proxy itself at that
//! load; latency is still timed from each request's actual send.
//! `--clients 16` runs only the given concurrency levels (default 1,16,64).
//!
//! `BENCH_PROXY_WRAP` runs each proxy under a command (words split on
//! spaces), e.g. `valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p`
//! to count the instructions a request costs: two runs with different
//! `--requests`, the difference divided by the requests between them
//! (start-up and warm-up cancel out). Proxies are stopped by SIGTERM, so the
//! tool writes its counts.
//!
//! ```text
//! cargo build --release --bin mcp-context --example bench_server --example bench_serve
//! target/release/examples/bench_serve [--requests 2000] [--rss-requests 100000] [--apis chat,messages]
//!     [--clients 1,16,64] [--pace-ms M]
//!     [--audit-pg postgres://postgres@127.0.0.1:5432/test] [--traces [--sample-ratio R]]
//! ```
//!
//! With `--audit-pg URL` a second proxy runs beside the first with the
//! audit trail on (`audit.sinks: [postgres: URL]`, a schema of its own,
//! `bench_audit_<pid>`, dropped at the end with `psql`), and every row is
//! measured three ways in turn (direct, proxy, proxy with audit), so the
//! audit's cost is read off one run; the records written and dropped follow.
//! `--traces` gives that second proxy `telemetry:` too (every request
//! sampled, or the share `--sample-ratio` gives; spans exported over OTLP/HTTP to a sink in this process that
//! only counts the exports); alone, it runs the second proxy with traces only.
//!
//! The upstream is an in-process axum server answering at once (a fixed
//! completion, or three SSE chunks); the proxy is the release binary next to
//! this example, its MCP server the `bench_server` example (`--n 1000 --size
//! 2048`). Direct and proxied runs alternate per concurrency level, on the
//! same keep-alive client, so drift hits both alike.

use std::time::{Duration, Instant};

use axum::Router;
use axum::response::IntoResponse;
use axum::routing::post;
use futures::StreamExt;
use tokio::io::AsyncBufReadExt;

fn flag(args: &[String], name: &str, default: usize) -> usize {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

const COMPLETION: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"Hello from the upstream"},"finish_reason":"stop"}]}"#;

async fn upstream(body: axum::body::Bytes) -> axum::response::Response {
    if memchr_stream(&body) {
        let chunk = |c: &str| {
            format!(
                "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{c}\"}}}}]}}\n\n"
            )
        };
        let sse = format!("{}{}{}data: [DONE]\n\n", chunk("Hel"), chunk("lo"), chunk("!"));
        return ([("content-type", "text/event-stream")], sse).into_response();
    }
    ([("content-type", "application/json")], COMPLETION).into_response()
}

const MESSAGE: &str = r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Hello from the upstream"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":1}}"#;

/// The Messages API: a fixed message, or its SSE events.
async fn messages_upstream(body: axum::body::Bytes) -> axum::response::Response {
    if memchr_stream(&body) {
        let ev = |t: &str, d: &str| format!("event: {t}\ndata: {d}\n\n");
        let sse = [
            ev("message_start", r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":1}}}"#),
            ev("content_block_start", r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#),
            ev("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello!"}}"#),
            ev("content_block_stop", r#"{"type":"content_block_stop","index":0}"#),
            ev("message_delta", r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":1}}"#),
            ev("message_stop", r#"{"type":"message_stop"}"#),
        ]
        .concat();
        return ([("content-type", "text/event-stream")], sse).into_response();
    }
    ([("content-type", "application/json")], MESSAGE).into_response()
}

fn memchr_stream(body: &[u8]) -> bool {
    body.windows(14).any(|w| w == b"\"stream\":true")
}

/// One request; the latency to its whole body (or to its first chunk when streamed).
async fn one(client: &reqwest::Client, url: &str, stream: bool) -> Duration {
    let messages = url.ends_with("/messages");
    let body = match (messages, stream) {
        (false, true) => r#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"What is new?"}]}"#,
        (false, false) => r#"{"model":"gpt-4o","messages":[{"role":"user","content":"What is new?"}]}"#,
        (true, true) => {
            r#"{"model":"claude-sonnet-4-5","max_tokens":64,"stream":true,"system":[{"type":"text","text":"You are a helper.","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"What is new?"}]}"#
        }
        (true, false) => {
            r#"{"model":"claude-sonnet-4-5","max_tokens":64,"system":[{"type":"text","text":"You are a helper.","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"What is new?"}]}"#
        }
    };
    let started = Instant::now();
    let resp = client.post(url).header("content-type", "application/json").body(body).send().await.expect("request");
    assert!(resp.status().is_success(), "{}", resp.status());
    let mut chunks = resp.bytes_stream();
    let mut first = None;
    while let Some(c) = chunks.next().await {
        c.expect("body");
        first.get_or_insert_with(|| started.elapsed());
    }
    if stream { first.expect("a first chunk") } else { started.elapsed() }
}

/// `total` requests from `concurrency` clients, each sending at most one
/// every `pace` when given (else back to back); every latency, and the wall time.
async fn run(
    client: &reqwest::Client,
    url: &str,
    stream: bool,
    concurrency: usize,
    total: usize,
    pace: Option<Duration>,
) -> (Vec<f64>, f64) {
    let started = Instant::now();
    let per = total / concurrency;
    let tasks: Vec<_> = (0..concurrency)
        .map(|i| {
            let (client, url) = (client.clone(), url.to_owned());
            tokio::spawn(async move {
                let mut v = Vec::with_capacity(per);
                // Clients staggered across one interval, so the load is even.
                let mut next = pace.map(|p| tokio::time::Instant::now() + p * i as u32 / concurrency as u32);
                for _ in 0..per {
                    if let (Some(at), Some(p)) = (next.as_mut(), pace) {
                        tokio::time::sleep_until(*at).await;
                        *at = (*at + p).max(tokio::time::Instant::now());
                    }
                    v.push(one(&client, &url, stream).await.as_secs_f64() * 1e3);
                }
                v
            })
        })
        .collect();
    let mut all = Vec::with_capacity(total);
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_by(f64::total_cmp);
    (all, started.elapsed().as_secs_f64())
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU time (user + system) a process has used so far, in ms.
fn cpu_ms(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    // Fields after the command name (which may hold spaces) end at its last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|u| u.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no memory-safety preconditions.
    #[allow(unsafe_code)]
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks * 1e3 / hz
}

/// CPU time used so far by every process named `postgres` (the server and its backends), in ms.
fn postgres_cpu_ms() -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc") else { return 0.0 };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "postgres"))
        .map(cpu_ms)
        .sum()
}

/// Stops a proxy as an operator would (SIGTERM, then waits for it to drain and exit), so a tool it runs under
/// (`BENCH_PROXY_WRAP`) writes its output; killed if it has not exited within a minute.
async fn stop(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) has no memory-safety preconditions (a system call std lacks).
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(pid as i32, libc::SIGTERM)
        };
    }
    if tokio::time::timeout(Duration::from_secs(60), child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}

/// Starts the release proxy on `yaml` (written to `config`); the child and its base URL.
async fn start_proxy(
    exe: &std::path::Path,
    config: &std::path::Path,
    yaml: &str,
    upstream: &str,
) -> (tokio::process::Child, String) {
    std::fs::write(config, yaml).unwrap();
    let wrap: Vec<String> =
        std::env::var("BENCH_PROXY_WRAP").map(|w| w.split_whitespace().map(String::from).collect()).unwrap_or_default();
    let mut command = match wrap.split_first() {
        Some((tool, args)) => {
            let mut c = tokio::process::Command::new(tool);
            c.args(args).arg(exe);
            c
        }
        None => tokio::process::Command::new(exe),
    };
    let mut child = command
        .args(["serve", "--config"])
        .arg(config)
        .args(["--listen", "127.0.0.1:0", "--upstream", upstream])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e} (build it with --release)", exe.display()));
    let line = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines().next_line().await.unwrap().unwrap();
    let url = line.split("listening on ").nth(1).unwrap().split(',').next().unwrap().to_owned();
    (child, url)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let requests = flag(&args, "--requests", 2000);
    let rss_requests = flag(&args, "--rss-requests", 100_000);
    let n = flag(&args, "--n", 1000);
    // The contents' cache lifetime: an hour, so no row pays for re-reading and re-tokenising all n resources
    // mid-run (with the default 30 s, a run of a minute did, in whichever rows it fell; `--cache-ttl-ms 30000`
    // puts it back).
    let ttl = flag(&args, "--cache-ttl-ms", 3_600_000);
    let pace =
        args.iter().any(|a| a == "--pace-ms").then(|| Duration::from_millis(flag(&args, "--pace-ms", 10) as u64));
    let levels: Vec<usize> = args
        .iter()
        .position(|a| a == "--clients")
        .and_then(|i| args.get(i + 1))
        .map_or_else(|| vec![1, 16, 64], |l| l.split(',').map(|c| c.parse().expect("--clients 1,16,64")).collect());
    let apis = args
        .iter()
        .position(|a| a == "--apis")
        .and_then(|i| args.get(i + 1))
        .map_or_else(|| "chat,messages".to_owned(), String::clone);

    let audit_pg = args.iter().position(|a| a == "--audit-pg").and_then(|i| args.get(i + 1)).cloned();
    let traces = args.iter().any(|a| a == "--traces");
    // The share of requests traced (`telemetry.sample_ratio`), 1.0 unless given.
    let sample_ratio: f64 = args
        .iter()
        .position(|a| a == "--sample-ratio")
        .and_then(|i| args.get(i + 1))
        .map_or(1.0, |r| r.parse().unwrap());
    static EXPORTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let local = listener.local_addr().unwrap();
    let direct_base = format!("http://{local}/v1");
    tokio::spawn(async move {
        let app = Router::new()
            .route("/v1/chat/completions", post(upstream))
            .route("/v1/messages", post(messages_upstream))
            .route(
                "/v1/traces",
                post(|| async {
                    EXPORTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    [("content-type", "application/x-protobuf")]
                }),
            );
        axum::serve(listener, app).await.unwrap();
    });

    let me = std::env::current_exe().unwrap();
    let server = me.with_file_name("bench_server");
    let exe = me.parent().unwrap().parent().unwrap().join("mcp-context");
    let dir = std::env::temp_dir().join(format!("bench-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let base_yaml = format!(
        "servers:\n  bench:\n    command: {server:?}\n    args: [\"--n\", \"{n}\", \"--size\", \"2048\"]\n    timeout_ms: 60000\n    cache_ttl_ms: {ttl}\n\
         context:\n  max_tokens: 8000\nserve:\n  anonymous_user: bench\n  max_concurrent_upstream: 1024\n\
         \x20 anthropic:\n    upstream: {direct_base}\n"
    );
    let (mut child, proxy) = start_proxy(&exe, &dir.join("c.yaml"), &base_yaml, &direct_base).await;
    let pid = child.id().unwrap();
    let schema = format!("bench_audit_{}", std::process::id());
    let audited = if audit_pg.is_some() || traces {
        let mut yaml = base_yaml.clone();
        if let Some(url) = &audit_pg {
            yaml.push_str(&format!("audit:\n  sinks:\n    - postgres: {{ url: {url:?}, schema: {schema} }}\n"));
        }
        if traces {
            yaml.push_str(&format!("telemetry:\n  otlp_endpoint: http://{local}\n  sample_ratio: {sample_ratio:?}\n"));
        }
        Some(start_proxy(&exe, &dir.join("audit.yaml"), &yaml, &direct_base).await)
    } else {
        None
    };
    let second = match (&audit_pg, traces) {
        (Some(_), true) => ", audit to PostgreSQL + traces",
        (Some(_), false) => ", audit to PostgreSQL",
        _ => ", traces (OTLP)",
    };

    let client = reqwest::Client::builder().pool_max_idle_per_host(256).build().unwrap();
    let direct = format!("{direct_base}/chat/completions");
    let via = format!("{proxy}/v1/chat/completions");
    if let Some((_, a)) = &audited {
        let audited_via = format!("{a}/v1/chat/completions");
        one(&client, &audited_via, false).await;
        for _ in 0..200 {
            one(&client, &audited_via, false).await;
            one(&client, &format!("{a}/v1/messages"), false).await;
        }
    }
    // Warm: the first injection reads and tokenises all n resources.
    let warm = Instant::now();
    let r = client
        .post(&via)
        .header("content-type", "application/json")
        .body(r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await
        .unwrap();
    let report = r.headers().get("x-mcp-context").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    r.bytes().await.unwrap();
    println!("cold first request {:.0} ms; {report}", warm.elapsed().as_secs_f64() * 1e3);
    for _ in 0..200 {
        one(&client, &via, false).await;
        one(&client, &direct, false).await;
        one(&client, &format!("{proxy}/v1/messages"), false).await;
        one(&client, &format!("{direct_base}/messages"), false).await;
    }
    let rss_start = rss_kib(pid);

    println!(
        "\n| api | clients | mode | direct p50 | proxy p50 | added p50 | direct p99 | proxy p99 | added p99 | proxy req/s | proxy CPU ms/req | postgres CPU ms/req |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    if let Some(p) = pace {
        println!("(paced: each client sends at most one request every {} ms)", p.as_millis());
    }
    for concurrency in levels {
        for (api, direct, via) in [
            ("chat", direct.clone(), via.clone()),
            ("messages", format!("{direct_base}/messages"), format!("{proxy}/v1/messages")),
        ] {
            if !apis.split(',').any(|a| a == api) {
                continue;
            }
            for stream in [false, true] {
                let total = requests.max(concurrency) / concurrency * concurrency;
                let (d, _) = run(&client, &direct, stream, concurrency, total, pace).await;
                let (cpu0, pg0) = (cpu_ms(pid), postgres_cpu_ms());
                let (p, wall) = run(&client, &via, stream, concurrency, total, pace).await;
                let cpu = (cpu_ms(pid) - cpu0, postgres_cpu_ms() - pg0);
                let mode = if stream { "streamed (TTFB)" } else { "whole response" };
                let row = |label: &str, p: &[f64], wall: f64, (cpu, pg): (f64, f64)| {
                    println!(
                        "| {api} | {concurrency} | {mode}{label} | {:.3} | {:.3} | **{:.3}** | {:.3} | {:.3} | **{:.3}** | {:.0} | {:.3} | {:.3} |",
                        pct(&d, 0.5),
                        pct(p, 0.5),
                        pct(p, 0.5) - pct(&d, 0.5),
                        pct(&d, 0.99),
                        pct(p, 0.99),
                        pct(p, 0.99) - pct(&d, 0.99),
                        total as f64 / wall,
                        cpu / total as f64,
                        pg / total as f64,
                    )
                };
                row("", &p, wall, cpu);
                if let Some((child, a)) = &audited {
                    let url = via.replace(&proxy, a);
                    let apid = child.id().unwrap_or(0);
                    let (cpu0, pg0) = (cpu_ms(apid), postgres_cpu_ms());
                    let (pa, wall) = run(&client, &url, stream, concurrency, total, pace).await;
                    row(second, &pa, wall, (cpu_ms(apid) - cpu0, postgres_cpu_ms() - pg0));
                }
            }
        }
    }
    println!("(ms; added = proxy - direct at the same percentile)");
    if let Some((mut audit_child, a)) = audited {
        let metrics = client.get(format!("{a}/metrics")).send().await.unwrap().text().await.unwrap();
        for l in metrics.lines().filter(|l| l.starts_with("mcp_context_audit_records_total")) {
            println!("{l}");
        }
        stop(&mut audit_child).await;
        if traces {
            println!("OTLP exports received: {}", EXPORTS.load(std::sync::atomic::Ordering::Relaxed));
        }
        let drop_schema = format!("DROP SCHEMA IF EXISTS {schema} CASCADE");
        let url = audit_pg.as_deref().unwrap_or_default();
        let _ = std::process::Command::new("psql").args([url, "-qc", &drop_schema]).status();
    }

    if rss_requests > 0 {
        let mut samples = vec![(0, rss_start)];
        let step = rss_requests / 5;
        let started = Instant::now();
        for i in 1..=5 {
            run(&client, &via, i % 2 == 0, 64, step, None).await;
            samples.push((i * step, rss_kib(pid)));
        }
        let secs = started.elapsed().as_secs_f64();
        let text: Vec<String> =
            samples.iter().map(|(n, kib)| format!("{n}: {:.1} MiB", *kib as f64 / 1024.0)).collect();
        println!(
            "\nproxy RSS over {rss_requests} requests at 64 clients ({:.0} req/s): {}",
            rss_requests as f64 / secs,
            text.join(", ")
        );
    }
    stop(&mut child).await;
    let _ = std::fs::remove_dir_all(&dir);
}
