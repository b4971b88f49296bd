//! The HTTP mode of the bench server (`bench_server --http ADDR`): the same
//! pre-serialised answers as its stdio mode, over Streamable HTTP, stateless,
//! one `application/json` body per request. What the latency lab
//! (`../shared/lab/http/README.md`, "What a bench server must do") asks of
//! a server that is never what a client benchmark measures.
//!
//! May import: the bench server's `Workload` and `answer` (its parent), axum,
//! tokio, serde_json.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use serde_json::{Value, json};

use super::{Workload, answer};

/// The knobs of the HTTP mode.
pub(crate) struct Options {
    /// Held before every answer (a slow server, for tests without the lab's link).
    pub(crate) delay: Duration,
    /// One line per request on stderr, in arrival order.
    pub(crate) log: bool,
    /// Answer `server/discover` (a 2026-07-28 server); otherwise "method not found".
    pub(crate) discover: bool,
}

struct App {
    legacy: Workload,
    current: Workload,
    options: Options,
    in_flight: AtomicUsize,
    stats: Mutex<Stats>,
}

#[derive(Default)]
struct Stats {
    methods: BTreeMap<String, u64>,
    peers: HashSet<SocketAddr>,
    max_in_flight: usize,
}

/// Serves until killed. Prints `listening on http://ADDR/mcp` to stderr once
/// bound (the tests read the port from it when ADDR ends in `:0`).
pub(crate) fn run(addr: &str, legacy: Workload, current: Workload, options: Options) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        eprintln!("listening on http://{}/mcp", listener.local_addr()?);
        let app = Arc::new(App { legacy, current, options, in_flight: AtomicUsize::new(0), stats: Mutex::default() });
        let not_allowed = || async { StatusCode::METHOD_NOT_ALLOWED };
        let router = axum::Router::new()
            .route("/mcp", post(mcp).get(not_allowed).delete(not_allowed))
            .route("/stats", get(stats))
            .with_state(app);
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>()).await
    })
}

struct InFlight<'a>(&'a AtomicUsize);
impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn mcp(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let now = app.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    let _guard = InFlight(&app.in_flight);
    let Ok(msg) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "not JSON").into_response();
    };
    let method = match (msg["method"].as_str(), msg.get("id")) {
        (Some(m), _) => m.to_owned(),
        (None, _) => "(response)".to_owned(),
    };
    if app.options.log {
        let what = match method.as_str() {
            "resources/list" => format!("list {}", msg["params"]["cursor"].as_str().unwrap_or("-")),
            "resources/read" => format!("read {}", msg["params"]["uri"].as_str().unwrap_or("")),
            "resources/templates/list" => "templates".to_owned(),
            other => other.to_owned(),
        };
        eprintln!("{what}");
    }
    if let Ok(mut s) = app.stats.lock() {
        *s.methods.entry(method.clone()).or_default() += 1;
        s.peers.insert(peer);
        s.max_in_flight = s.max_in_flight.max(now);
    }
    let modern = headers.get("mcp-protocol-version").is_some_and(|v| v == "2026-07-28");
    let w = match method.as_str() {
        "server/discover" if app.options.discover => &app.current,
        "server/discover" => &app.legacy,
        _ if modern => &app.current,
        _ => &app.legacy,
    };
    let out = answer(w, &msg);
    if !app.options.delay.is_zero() {
        tokio::time::sleep(app.options.delay).await;
    }
    match out {
        None => StatusCode::ACCEPTED.into_response(),
        Some(s) => ([(header::CONTENT_TYPE, "application/json")], s).into_response(),
    }
}

async fn stats(State(app): State<Arc<App>>, Query(q): Query<BTreeMap<String, String>>) -> Response {
    let Ok(mut s) = app.stats.lock() else { return StatusCode::INTERNAL_SERVER_ERROR.into_response() };
    let body = json!({
        "requests": s.methods,
        "reads": s.methods.get("resources/read").copied().unwrap_or(0),
        "connections": s.peers.len(),
        "max_in_flight": s.max_in_flight,
    });
    if q.get("reset").is_some_and(|v| v == "1") {
        *s = Stats::default();
    }
    axum::Json(body).into_response()
}
