//! What traces cost one request, in-process and on one thread, away from the
//! noise of a 2-core machine shared by 16 clients, an upstream, an MCP
//! server and PostgreSQL (where `bench_serve`'s CPU per request varies by
//! ±20 % between runs): the span tree of one warm `serve` request (request,
//! identity, inject, upstream, with the fields they record) made `--n`
//! times under
//!
//! - no OpenTelemetry layer (the spans are disabled, as without `telemetry:`);
//! - the CLI's layer (`telemetry::otlp_layer`, the sampling gate in front)
//!   at `sample_ratio` 0, 0.1 and 1.0;
//! - the layer as it was before the gate: `tracing-opentelemetry` with the
//!   SDK's parent-based ratio sampler at 0.1, which builds every span and
//!   asks the sampler only when the span ends.
//!
//! Every layer exports over OTLP/HTTP to a sink in this process that
//! answers 200 and counts the posts; a configuration's time includes its
//! share of encoding and sending (flushed before its clock stops). Not
//! included: the trace context lookups `serve` makes per request (request
//! ids, the upstream's `traceparent`), which are crate-internal.
//!
//! ```sh
//! cargo run --release --example bench_traces -- [--n 200000] [--rounds 3]
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing::field::Empty;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;

/// The spans of one warm chat request, as `serve` makes them.
fn request(i: u64) {
    let span = tracing::info_span!(
        "mcp_context.request",
        otel.name = %format_args!("{} {}", "POST", "/v1/chat/completions"),
        otel.kind = "server",
        http.request.method = "POST",
        http.route = "/v1/chat/completions",
        http.response.status_code = Empty,
        request_id = Empty,
        trace_id = Empty,
    );
    let _in = span.enter();
    span.record("request_id", "6f1c0e7e3b0f4f0e9a1d2c3b4a5f6e7d")
        .record("trace_id", "4bf92f3577b34da6a3ce929d0e0e4736");
    tracing::info_span!("mcp_context.identity").in_scope(|| std::hint::black_box(i));
    let inject =
        tracing::info_span!("mcp_context.inject", user = ?"bench", warm = Empty, included = Empty, tokens = Empty);
    inject.in_scope(|| std::hint::black_box(i));
    inject.record("warm", true).record("included", 23).record("tokens", 7951);
    drop(inject);
    let upstream = tracing::info_span!(
        "mcp_context.upstream",
        otel.name = "chat",
        otel.kind = "client",
        http.request.method = "POST",
        url.path = "chat/completions",
        gen_ai.operation.name = "chat",
        gen_ai.response.model = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        http.response.status_code = Empty,
    );
    upstream.in_scope(|| std::hint::black_box(i));
    upstream
        .record("http.response.status_code", 200)
        .record("gen_ai.response.model", "gpt-4o")
        .record("gen_ai.usage.input_tokens", 8000)
        .record("gen_ai.usage.output_tokens", 12);
    span.record("http.response.status_code", 200);
}

/// A local OTLP sink: answers 200 to every post, counting them.
async fn sink() -> (String, Arc<AtomicU64>) {
    let posts = Arc::new(AtomicU64::new(0));
    let counted = posts.clone();
    let app = axum::Router::new().fallback(move || {
        let c = counted.clone();
        async move {
            c.fetch_add(1, Ordering::Relaxed);
            "ok"
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, posts)
}

/// This process's CPU time (all threads: the exporter's included), from `/proc/self/stat`, in ns.
fn cpu_ns() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which ends at the last ')'): utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest.split_whitespace().map(|x| x.parse().unwrap_or(0.0)).collect();
    // Clock ticks of 10 ms (USER_HZ is 100 on Linux).
    (f.get(11).unwrap_or(&0.0) + f.get(12).unwrap_or(&0.0)) * 1e7
}

/// (wall, CPU) ns per request of `n` requests under `subscriber`, with `flush` run inside both clocks.
fn measure(n: u64, subscriber: impl tracing::Subscriber + Send + Sync + 'static, flush: impl FnOnce()) -> (f64, f64) {
    let (started, cpu) = (Instant::now(), cpu_ns());
    tracing::subscriber::with_default(subscriber, || {
        for i in 0..n {
            request(i);
        }
    });
    flush();
    (started.elapsed().as_nanos() as f64 / n as f64, (cpu_ns() - cpu) / n as f64)
}

fn config(endpoint: &str, ratio: f64) -> mcp_context::settings::TelemetrySettings {
    let yaml = format!("servers: {{}}\ntelemetry:\n  otlp_endpoint: {endpoint}\n  sample_ratio: {ratio}\n");
    let config = mcp_context::Config::from_yaml(&yaml, std::path::Path::new("bench.yaml")).unwrap();
    config.telemetry.unwrap()
}

/// The layer before the sampling gate (as of 5a65d74), exporting through reqwest like the CLI's.
fn before(endpoint: &str, ratio: f64) -> (impl Layer<tracing_subscriber::Registry>, SdkTracerProvider) {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(Client { http: reqwest::Client::new(), rt: tokio::runtime::Handle::current() })
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(format!("{endpoint}/v1/traces"))
        .build()
        .unwrap();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio))))
        .build();
    let filter = tracing_subscriber::filter::filter_fn(|meta| {
        let floor = if meta.is_span() { tracing::Level::INFO } else { tracing::Level::WARN };
        *meta.level() <= floor && !meta.target().starts_with("rmcp")
    });
    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("mcp-context"))
        .with_tracked_inactivity(false)
        .with_threads(false)
        .with_location(false)
        .with_filter(filter);
    (layer, provider)
}

#[derive(Debug)]
struct Client {
    http: reqwest::Client,
    rt: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Client {
    async fn send_bytes(
        &self,
        request: http::Request<opentelemetry_http::Bytes>,
    ) -> Result<http::Response<opentelemetry_http::Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let send = self.http.request(parts.method, parts.uri.to_string()).headers(parts.headers).body(body);
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.rt.spawn(async move {
            let answer = async {
                let response = send.send().await?;
                let status = response.status();
                Ok::<_, reqwest::Error>((status, response.bytes().await?))
            };
            let _ = tx.send(answer.await);
        });
        let (status, body) = rx.await??;
        let mut response = http::Response::new(body);
        *response.status_mut() = status;
        Ok(response)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: u64| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (n, rounds) = (arg("--n", 200_000), arg("--rounds", 3));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let _rt = rt.enter();
    let (endpoint, posts) = rt.block_on(sink());
    let names =
        ["no OpenTelemetry layer", "gate, ratio 0", "gate, ratio 0.1", "gate, ratio 1.0", "before the gate, ratio 0.1"];
    let mut results: Vec<Vec<(f64, f64)>> = vec![Vec::new(); names.len()];
    for _ in 0..rounds {
        // The configurations alternate within each round, so that a slower moment of the machine falls on all.
        results[0].push(measure(n, tracing_subscriber::registry(), || ()));
        for (k, ratio) in [(1, 0.0), (2, 0.1), (3, 1.0)] {
            let (layer, telemetry) = mcp_context::telemetry::otlp_layer(&config(&endpoint, ratio)).unwrap();
            results[k].push(measure(n, tracing_subscriber::registry().with(layer), || telemetry.shutdown()));
        }
        let (layer, provider) = before(&endpoint, 0.1);
        results[4].push(measure(n, tracing_subscriber::registry().with(layer), || {
            let _ = provider.force_flush();
            let _ = provider.shutdown();
        }));
        std::thread::sleep(Duration::from_millis(200));
    }
    let median_of =
        |r: &[(f64, f64)], cpu: bool| median(&r.iter().map(|x| if cpu { x.1 } else { x.0 }).collect::<Vec<_>>());
    let (wall0, cpu0) = (median_of(&results[0], false), median_of(&results[0], true));
    println!(
        "{n} requests of 4 spans each, {rounds} rounds (median), one thread making spans; OTLP posts received: {}",
        posts.load(Ordering::Relaxed)
    );
    println!("| layer | wall ns per request | CPU ns per request (all threads) | CPU added over no layer (µs) |");
    println!("|---|---:|---:|---:|");
    for (name, r) in names.iter().zip(&results) {
        let (wall, cpu) = (median_of(r, false), median_of(r, true));
        println!("| {name} | {wall:.0} | {cpu:.0} | {:.2} |", (cpu - cpu0) / 1000.0);
    }
    let _ = wall0;
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
