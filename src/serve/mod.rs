//! `mcp-context serve`: an OpenAI-compatible proxy. Point any OpenAI client's
//! base URL here; every chat-completions or Responses request gets the
//! caller's policy-filtered, budgeted context (one message at index 0, or
//! ahead of the caller's `instructions`) and goes on to the upstream; the
//! answer, streamed or not, comes back unchanged.
//!
//! A client of the library's public API like the rest of the CLI, in its own
//! folder behind the default `serve` feature so that the library stays free
//! of an HTTP server: `identity` (who is calling), `relay` (the upstream
//! side), `metrics`, `error` (our errors in OpenAI's shape), and here the
//! router, the state and the process lifecycle (signals, shutdown, reload).

mod error;
pub mod identity;
mod metrics;
mod relay;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use mcp_context::{Config, ContextRequest, McpContext, Policy, Report, ServeSettings};
use tokio_util::sync::CancellationToken;

use self::error::ApiError;
use self::metrics::Metrics;
use self::relay::{Outgoing, Upstream};

/// The response header carrying the compact report.
pub const REPORT_HEADER: &str = "x-mcp-context";

/// Command-line overrides of the `serve:` section.
pub struct Options {
    pub listen: Option<String>,
    pub upstream: Option<String>,
}

struct AppState {
    ctx: Arc<McpContext>,
    settings: ServeSettings,
    upstream: Upstream,
    metrics: Metrics,
    policy_path: Option<PathBuf>,
    draining: AtomicBool,
}

type Shared = Arc<AppState>;

/// Which injection a route does.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Responses,
}

/// Runs the proxy until SIGTERM or Ctrl-C, then drains and closes every MCP server.
pub async fn run(config: Config, opts: Options) -> anyhow::Result<()> {
    let mut settings = config.serve.clone();
    if let Some(l) = opts.listen {
        settings.listen = l;
    }
    let base = opts
        .upstream
        .or_else(|| settings.upstream.clone())
        .or_else(|| std::env::var("OPENAI_BASE_URL").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| mcp_context::DEFAULT_UPSTREAM.to_owned());
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        anyhow::bail!("the upstream `{}` must start with http:// or https://", relay::redact(&base));
    }
    let addr: SocketAddr = settings
        .listen
        .parse()
        .map_err(|_| anyhow::anyhow!("listen address `{}` is not IP:PORT (e.g. 127.0.0.1:8787)", settings.listen))?;
    let upstream = Upstream::new(&settings, base)?;
    // Signal handlers first: a SIGTERM that arrives while the servers start
    // must still drain and close them, not kill the process and orphan them.
    let signals = Signals::install()?;
    // Bind before connecting to the servers: a port in use fails fast, with no child started.
    let listener =
        tokio::net::TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr()?;
    let ctx = Arc::new(McpContext::from_config(&config).await?);
    for f in ctx.hub().failures() {
        tracing::warn!(server = %f.server, error = %f.error, "MCP server unavailable; serving without it");
    }
    let state = Arc::new(AppState {
        ctx: ctx.clone(),
        settings: settings.clone(),
        upstream,
        metrics: Metrics::new(),
        policy_path: config.policy.clone(),
        draining: AtomicBool::new(false),
    });
    let app = router(state.clone());
    let stop = CancellationToken::new();
    let server = axum::serve(without_nagle(listener), app).with_graceful_shutdown(stop.clone().cancelled_owned());
    let mut server = tokio::spawn(async move { server.await });
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "mcp-context serve: listening on http://{local}, upstream {}",
            relay::redact(&state.upstream.base)
        )?;
        out.flush()?;
    }
    tracing::info!(%local, upstream = %relay::redact(&state.upstream.base), "serving");

    let result = lifecycle(&state, signals, &mut server).await;
    state.draining.store(true, Ordering::SeqCst);
    stop.cancel();
    if result.is_ok() {
        // In-flight requests and streams may finish within the grace period.
        match tokio::time::timeout(settings.shutdown_grace, &mut server).await {
            Ok(_) => tracing::info!("all requests finished"),
            Err(_) => {
                tracing::warn!(
                    grace_ms = settings.shutdown_grace.as_millis() as u64,
                    "requests still running after serve.shutdown_grace_ms; closing them"
                );
                server.abort();
            }
        }
    }
    ctx.close().await;
    result
}

struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

/// Waits for SIGTERM / Ctrl-C (Ok) or the server failing (Err); reloads the
/// policy on SIGHUP meanwhile.
async fn lifecycle(
    state: &Shared,
    signals: Signals,
    server: &mut tokio::task::JoinHandle<std::io::Result<()>>,
) -> anyhow::Result<()> {
    let Signals { mut term, mut int, mut hup } = signals;
    loop {
        tokio::select! {
            _ = term.recv() => { tracing::info!("SIGTERM: draining"); return Ok(()); }
            _ = int.recv() => { tracing::info!("Ctrl-C: draining"); return Ok(()); }
            _ = hup.recv() => reload_policy(state),
            r = &mut *server => {
                return match r {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(anyhow::anyhow!("the HTTP server failed: {e}")),
                    Err(e) => Err(anyhow::anyhow!("the HTTP server stopped: {e}")),
                };
            }
        }
    }
}

/// SIGHUP: load the policy again; a valid one applies from the next
/// request, an invalid one is logged (file:line:col) and the old one stays.
fn reload_policy(state: &Shared) {
    let Some(path) = &state.policy_path else {
        tracing::info!("SIGHUP: the config names no policy; nothing to reload");
        return;
    };
    match Policy::load(path) {
        Ok(p) => {
            state.ctx.set_policy(p);
            state.metrics.policy_reload(true);
            tracing::info!(path = %path.display(), "SIGHUP: policy reloaded");
        }
        Err(e) => {
            state.metrics.policy_reload(false);
            tracing::error!("SIGHUP: policy reload rejected, the previous policy stays in force: {e}");
        }
    }
}

fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/responses", post(responses))
        .route("/v1/{*rest}", any(passthrough))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .layer(axum::middleware::from_fn_with_state(state.clone(), count))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}

/// Counts every answer by route and status.
async fn count(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map_or("unmatched", |m| m.as_str()).to_owned();
    let response = next.run(req).await;
    state.metrics.request(&route, response.status().as_u16());
    response
}

async fn chat(State(state): State<Shared>, req: Request) -> Response {
    inject_and_forward(state, req, Kind::Chat).await.unwrap_or_else(IntoResponse::into_response)
}

async fn responses(State(state): State<Shared>, req: Request) -> Response {
    inject_and_forward(state, req, Kind::Responses).await.unwrap_or_else(IntoResponse::into_response)
}

/// Reads the body (bounded), identifies the caller, injects the context by
/// the library's rules on the generic JSON, forwards, relays.
async fn inject_and_forward(state: Shared, req: Request, kind: Kind) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let limit = state.settings.max_body_bytes;
    check_length(&parts.headers, limit)?;
    let bytes = read_body(body, limit).await?;
    let mut body: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request("invalid_json", format!("The request body is not valid JSON: {e}")))?;
    match kind {
        Kind::Chat if !body.get("messages").is_some_and(|m| m.is_array()) => {
            return Err(ApiError::bad_request("missing_messages", "The body needs a `messages` array"));
        }
        Kind::Responses if !body.is_object() || body.get("input").is_none_or(|i| i.is_null()) => {
            return Err(ApiError::bad_request("missing_input", "The body needs an `input`"));
        }
        _ => {}
    }
    let user = identity::identify(&state.settings, &parts.headers, Some(&body))?;

    let started = Instant::now();
    let mut request = ContextRequest::for_user(user);
    request.model = body.get("model").and_then(|m| m.as_str()).filter(|m| !m.is_empty()).map(str::to_owned);
    // Relevance mode ranks by the conversation: the latest user turn, earlier
    // ones with less weight, exactly as the library's typed `inject`.
    let query = mcp_context::Query::from_chat_json(&body);
    let (message, report) = state.ctx.build_ranked(&request, query).await.map_err(|e| {
        tracing::error!(user = %request.user, "context could not be built: {e}");
        ApiError::new(500, "server_error", "context_failed", format!("The context could not be built: {e}"))
    })?;
    let content = message.as_ref().map(|m| m.content.as_str());
    match kind {
        Kind::Chat => mcp_context::inject_message_json(&mut body, content, state.ctx.settings().role),
        Kind::Responses => mcp_context::inject_instructions_json(&mut body, content),
    };
    state.metrics.injection(&report, started.elapsed().as_secs_f64());
    tracing::info!(report = %serde_json::to_string(&report).unwrap_or_default(), "injected");

    let forwarded = serde_json::to_vec(&body).map_err(|e| {
        ApiError::new(500, "server_error", "encode_failed", format!("The request could not be re-encoded: {e}"))
    })?;
    let mut headers = state.upstream.headers_for_upstream(&parts.headers);
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let path = match kind {
        Kind::Chat => "/chat/completions",
        Kind::Responses => "/responses",
    };
    let path_and_query = format!("{path}{}", parts.uri.query().map(|q| format!("?{q}")).unwrap_or_default());
    let relayed =
        state.upstream.send(Outgoing { method: Method::POST, path_and_query, headers, body: forwarded.into() }).await?;
    state.metrics.upstream(path, relayed.waited.as_secs_f64());
    let mut response = relayed.response;
    if let Ok(v) = HeaderValue::from_str(&compact_report(&report)) {
        response.headers_mut().insert(REPORT_HEADER, v);
    }
    Ok(response)
}

/// `x-mcp-context`: who, tokens used of the budget, and counts.
fn compact_report(r: &Report) -> String {
    let user: String =
        r.user.chars().map(|c| if c.is_ascii_graphic() && c != ';' && c != '"' { c } else { '_' }).collect();
    format!(
        "user={user}; tokens={}/{}; included={}; truncated={}; excluded={}; failed={}",
        r.tokens,
        r.budget,
        r.included.len(),
        r.included.iter().filter(|i| i.truncated).count(),
        r.excluded.len(),
        r.failed_servers.len()
    )
}

/// The body, at most `limit` bytes (413 past it, whatever the framing).
async fn read_body(body: Body, limit: usize) -> Result<axum::body::Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        if is_length_limit(&e) {
            ApiError::too_large(limit)
        } else {
            ApiError::bad_request("invalid_body", format!("The request body could not be read: {e}"))
        }
    })
}

/// A declared body over the limit is refused before it is read.
fn check_length(headers: &HeaderMap, limit: usize) -> Result<(), ApiError> {
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n > limit as u64 => Err(ApiError::too_large(limit)),
        _ => Ok(()),
    }
}

fn is_length_limit(e: &axum::Error) -> bool {
    let mut cause: Option<&dyn std::error::Error> = Some(e);
    while let Some(c) = cause {
        if c.to_string().contains("length limit exceeded") {
            return true;
        }
        cause = c.source();
    }
    false
}

/// Anything else under `/v1/` (`GET /v1/models`, embeddings, files…):
/// relayed unchanged, no injection. Callers must still be identified unless
/// the upstream authenticates them itself (`forward_authorization`).
async fn passthrough(State(state): State<Shared>, req: Request) -> Response {
    async move {
        let (parts, body) = req.into_parts();
        if !state.settings.forward_authorization {
            identity::identify(&state.settings, &parts.headers, None)?;
        }
        check_length(&parts.headers, state.settings.max_body_bytes)?;
        let path = parts.uri.path().strip_prefix("/v1").unwrap_or(parts.uri.path());
        let path_and_query = format!("{path}{}", parts.uri.query().map(|q| format!("?{q}")).unwrap_or_default());
        let headers = state.upstream.headers_for_upstream(&parts.headers);
        // Read whole, within `max_body_bytes`: a chunked body (no
        // Content-Length) is bounded like a declared one, and refused with a
        // 413 before anything reaches the upstream.
        let body = read_body(body, state.settings.max_body_bytes).await?;
        let relayed =
            state.upstream.send(Outgoing { method: parts.method, path_and_query, headers, body: body.into() }).await?;
        state.metrics.upstream("passthrough", relayed.waited.as_secs_f64());
        Ok::<_, ApiError>(relayed.response)
    }
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// Ready once the config and policy are loaded (they are, or the process
/// would not be listening); MCP servers being down is `degraded`, still 200.
/// While draining after SIGTERM: 503.
async fn readyz(State(state): State<Shared>) -> Response {
    let servers: Vec<_> = state
        .ctx
        .hub()
        .status()
        .into_iter()
        .map(|s| {
            serde_json::json!({
                "name": s.name,
                "state": if s.connected { "connected" } else { "down" },
                "protocol": s.protocol,
                "resources": s.resources,
                "restarts": s.restarts,
                "problem": s.problem,
            })
        })
        .collect();
    // A shared cache that is down degrades, never blocks: requests go on
    // with the local cache and MCP reads.
    let shared = state.ctx.shared_cache_status();
    let degraded = servers.iter().any(|s| s["state"] != "connected") || shared.as_ref().is_some_and(|s| !s.up);
    let draining = state.draining.load(Ordering::SeqCst);
    let status = if draining {
        "draining"
    } else if degraded {
        "degraded"
    } else {
        "ready"
    };
    let body = serde_json::json!({
        "status": status,
        "policy": state.policy_path.as_ref().map_or("allow-all (no policy configured)".into(), |p| p.display().to_string()),
        "servers": servers,
        "shared_cache": shared,
    });
    let code = if draining { axum::http::StatusCode::SERVICE_UNAVAILABLE } else { axum::http::StatusCode::OK };
    (code, axum::Json(body)).into_response()
}

async fn metrics(State(state): State<Shared>) -> Response {
    let text = state.metrics.render(state.ctx.hub(), state.ctx.shared_cache_status());
    let mut r = Response::new(Body::from(text));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    r
}

/// `listener`, its connections with `TCP_NODELAY` set (axum leaves it off).
/// A streamed answer is many small writes, and under Nagle's algorithm each
/// one waits while the last is unacknowledged, which a client that delays
/// its ACKs (Linux: up to 40 ms) turns into stalls: measured on the MCP side
/// (`bench_shared`, an HTTP server without it), 200 reads on 2025-11-25 took
/// 595 ms instead of 157 ms.
fn without_nagle(
    listener: tokio::net::TcpListener,
) -> axum::serve::TapIo<tokio::net::TcpListener, fn(&mut tokio::net::TcpStream)> {
    use axum::serve::ListenerExt;
    let tap: fn(&mut tokio::net::TcpStream) = |tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on a connection");
        }
    };
    listener.tap_io(tap)
}

#[cfg(test)]
mod tests {
    use axum::serve::Listener;

    #[tokio::test]
    async fn accepted_connections_do_not_wait_for_acknowledgements() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut listener = super::without_nagle(listener);
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (conn, _) = listener.accept().await;
        assert!(conn.nodelay().unwrap(), "TCP_NODELAY is off on an accepted connection");
    }
}
