//! `mcp-context serve`: an OpenAI-compatible proxy (and Anthropic's Messages
//! API, and Gemini's). Point any OpenAI client's base URL here; every
//! chat-completions or Responses request gets the caller's policy-filtered,
//! budgeted context (one message at index 0, or ahead of the caller's
//! `instructions`) and goes on to the upstream; the answer, streamed or not,
//! comes back unchanged.
//!
//! A library module behind the default `serve` feature, so that the bare
//! library stays free of an HTTP server: `mcp-context serve` runs it
//! ([`run`]), and an application mounts it in its own axum app ([`Proxy`]:
//! its [`Proxy::router`] is an axum `Router`, a `tower::Service`). Here: the
//! router, the state and the process lifecycle (signals, shutdown, reload);
//! beside it `pipeline` (the one injection path) and its adapters, one per
//! wire API (`openai`, `messages`, `gemini`), `identity` (who is calling),
//! `relay` (the upstream side), `metrics`, `error` (our errors in OpenAI's shape).
//!
//! Layer: the proxy, above everything else of the crate; it may import
//! any module below it, and only the CLI imports it.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use std::sync::Arc;
//! use mcp_context::{Config, McpContext};
//! let config = Config::load(std::path::Path::new("mcp-context.yaml"))?;
//! let ctx = Arc::new(McpContext::from_config(&config).await?);
//! let proxy = mcp_context::serve::Proxy::new(ctx, &config, "https://api.openai.com")?;
//! let app = axum::Router::new()
//!     .route("/health", axum::routing::get(|| async { "ok" }))
//!     .merge(proxy.router());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8787").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```

mod audit;
mod body;
mod connect;
mod created;
mod error;
mod gemini;
mod identity;
mod listen;
mod mcp;
mod messages;
mod metrics;
mod misplaced;
mod openai;
mod owners;
mod path;
mod pipeline;
mod relay;
mod routes;
mod startup;
mod status;
mod usage;
mod vendor;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::settings::ServeSettings;
use crate::{Config, McpContext, Policy};
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio_util::sync::CancellationToken;

use self::body::{Budget, JsonObject};
use self::error::ApiError;
use self::identity::FromHeaders;
use self::messages::Endpoint;
use self::metrics::Metrics;
use self::owners::Owners;
use self::path::Canonical;
use self::pipeline::{caller, owned};
use self::relay::{Outgoing, Upstream};
use self::routes::{NoRoute, Route, Stored};

/// The response header carrying the compact report.
pub const REPORT_HEADER: &str = "x-mcp-context";

pub use self::identity::hash_key;

mod app;
pub use app::{Options, Proxy, run};

struct AppState {
    ctx: Arc<McpContext>,
    settings: ServeSettings,
    upstream: Upstream,
    metrics: Metrics,
    policy_path: Option<PathBuf>,
    draining: AtomicBool,
    /// Request body bytes held, all callers.
    bodies: Budget,
    /// The share of `bodies` for callers the headers did not identify.
    unidentified: Budget,
    owners: Arc<Owners>,
    /// `Host` values accepted on `/v1/` (lower-case); `None`: any.
    hosts: Option<Vec<String>>,
    /// The Messages API upstream (`serve.anthropic`), if configured.
    anthropic: Option<messages::Anthropic>,
    /// Gemini's upstream (`serve.gemini`), if configured.
    gemini: Option<gemini::GeminiApi>,
    /// `serve.jwt`: the verifier of JWT bearers.
    jwt: Option<crate::identity::JwtVerifier>,
    /// The authorization code flows of `auth: { type: oauth }` servers
    /// (`/auth/{server}/start`, `/auth/callback`).
    oauth: Option<Arc<crate::credentials::OAuthFlows>>,
    /// The token flows run before a request (refresh, token exchange).
    flows: Option<Arc<crate::credentials::CredentialFlows>>,
    /// `serve.mcp`: the MCP endpoint (`/mcp`), if on.
    mcp: Option<mcp::Endpoint>,
}

type Shared = Arc<AppState>;

/// Whether the request's `Host` (HTTP/1) or authority (HTTP/2) is one the
/// proxy answers to: a web page that rebinds its own name to 127.0.0.1
/// sends its own name, and is refused. An allowed entry without a port
/// accepts any port.
fn host_allowed(hosts: &Option<Vec<String>>, req: &Request) -> bool {
    let Some(hosts) = hosts else { return true };
    let given = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()));
    let Some(given) = given.map(|g| g.to_ascii_lowercase()) else { return false };
    let host_only = match given.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && !h.is_empty() => h,
        _ => given.as_str(),
    };
    hosts.iter().any(|a| *a == given || (!a.contains(':') || a.ends_with(']')) && *a == host_only)
}

fn router(state: Shared) -> Router {
    let router = Router::new().fallback(dispatch).layer(axum::middleware::map_response(nosniff));
    router.layer(tower_http::trace::TraceLayer::new_for_http()).with_state(state)
}

/// `X-Content-Type-Options: nosniff` on every answer (relayed, error, probe, auth page): a browser takes a
/// body for the type it is labelled, never sniffs an upstream's JSON echoing a caller's text as HTML.
async fn nosniff(mut answer: Response) -> Response {
    answer.headers_mut().insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    answer
}

/// Every request: the path checked and decoded, one route chosen on it, the
/// `Host` checked on `/v1/`, the body's type checked, then the handler. The
/// answer is counted under the route's own label (`refused` and `unmatched`
/// for the others), never under the caller's spelling.
///
/// Each request runs in the server span `mcp_context.request`, a child of the
/// caller's trace when it sent a W3C `traceparent` (with traces on); an
/// injecting request's ids (`request_id`, `trace_id`: the audit record's)
/// are fields of it, so every event of the request carries them.
async fn dispatch(State(state): State<Shared>, req: Request) -> Response {
    let decided = decide(&state, &req);
    let label = match &decided {
        Ok(route) => route.label(),
        Err((label, _)) => label,
    };
    let span = crate::telemetry::request_span(req.headers(), || {
        tracing::info_span!(
            "mcp_context.request",
            otel.name = %format_args!("{} {label}", req.method()),
            otel.kind = "server",
            http.request.method = %req.method(),
            http.route = label,
            http.response.status_code = tracing::field::Empty,
            request_id = tracing::field::Empty,
            trace_id = tracing::field::Empty,
        )
    });
    let (label, response) = tracing::Instrument::instrument(handle(state.clone(), req, decided), span.clone()).await;
    span.record("http.response.status_code", i64::from(response.status().as_u16()));
    state.metrics.request(label, response.status());
    response
}

/// The route's handler, or the refusal; with the route's metrics label.
async fn handle(
    state: Shared,
    mut req: Request,
    decided: Result<Route, (&'static str, ApiError)>,
) -> (&'static str, Response) {
    match decided {
        // Under /v1/messages our refusals speak Anthropic's error shape.
        Err((label, e)) if messages::claims(req.uri().path()) || misplaced::is_anthropic(req.uri().path()) => {
            (label, messages::error_response(e))
        }
        Err((label, e)) if gemini::claims(req.uri().path()) => (label, gemini::error_response(e)),
        Err((label, e)) => (label, e.into_response()),
        Ok(route) => {
            let label = route.label();
            // Injecting routes get their ids now: the record reads them, and every event of the request is
            // logged in the span that carries them.
            if matches!(
                route,
                Route::Chat | Route::Responses | Route::Messages | Route::CountTokens | Route::Gemini { .. }
            ) {
                let ids = audit::Ids::of(req.headers());
                tracing::Span::current()
                    .record("request_id", ids.request_id.as_str())
                    .record("trace_id", ids.trace_id.as_str());
                req.extensions_mut().insert(ids);
            }
            let r = async {
                match route {
                    Route::Chat => Ok(pipeline::run(&state, req, label, &openai::Chat).await),
                    Route::Responses => Ok(pipeline::run(&state, req, label, &openai::Responses).await),
                    Route::CreateConversation => relay_other(&state, req, Some(Stored::Conversation)).await,
                    Route::StoredObject { kind, id } => stored_object(&state, req, kind, &id).await,
                    Route::Passthrough => relay_other(&state, req, None).await,
                    Route::Messages => {
                        let api = messages::Messages { api: state.anthropic.as_ref(), endpoint: Endpoint::Messages };
                        Ok(pipeline::run(&state, req, label, &api).await)
                    }
                    Route::CountTokens => {
                        let api = messages::Messages { api: state.anthropic.as_ref(), endpoint: Endpoint::CountTokens };
                        Ok(pipeline::run(&state, req, label, &api).await)
                    }
                    Route::Gemini { version, method } => {
                        let api = gemini::Gemini { api: state.gemini.as_ref(), version, method };
                        Ok(pipeline::run(&state, req, label, &api).await)
                    }
                    Route::Root => Ok(axum::http::StatusCode::OK.into_response()),
                    Route::Health => Ok("ok\n".into_response()),
                    Route::Ready => Ok(status::readyz(&state)),
                    Route::Metrics => Ok(status::metrics(&state)),
                    Route::AuthStart { server } => connect::start(&state, req, &server).await,
                    Route::AuthCallback => connect::callback(&state, req).await,
                    Route::Mcp => Ok(mcp::handle(&state, req).await),
                    Route::ProtectedResource => Ok(mcp::protected_resource(&state)),
                }
            }
            .await;
            (label, r.unwrap_or_else(IntoResponse::into_response))
        }
    }
}

/// The route, or the refusal with its metrics label.
fn decide(state: &AppState, req: &Request) -> Result<Route, (&'static str, ApiError)> {
    let path = Canonical::parse(req.uri().path()).map_err(|e| ("refused", e))?;
    if matches!(path.segments().first(), Some(&("v1" | "v1beta"))) && !host_allowed(&state.hosts, req) {
        return Err((
            "refused",
            ApiError::bad_request(
                "invalid_host",
                "The Host header is not one this proxy answers to (serve.allowed_hosts)",
            ),
        ));
    }
    let route = routes::route(req.method(), &path, &state.settings.passthrough).map_err(|why| {
        if why == NoRoute::Unknown
            && let Some(e) = misplaced::not_found(&path, req.headers().get(header::HOST).and_then(|h| h.to_str().ok()))
        {
            return ("unmatched", e);
        }
        let message = match why {
            NoRoute::Listing => {
                "Listing stored objects is not available through this proxy: it would show \
                                 other callers' objects. Ask for each of yours by its id"
            }
            NoRoute::Unknown => {
                "Unknown endpoint: this proxy relays chat completions, responses, messages, the caller's own \
                                 stored objects and the endpoints listed in serve.passthrough"
            }
        };
        ("unmatched", ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", "unknown_url", message))
    })?;
    json_content_type(req, &route).map_err(|e| (route.label(), e))?;
    Ok(route)
}

/// A request with a body must say `application/json` (a browser's simple
/// request cannot), except `multipart/form-data` to a passthrough endpoint
/// (file uploads, once an operator adds `/v1/files` to `serve.passthrough`).
fn json_content_type(req: &Request, route: &Route) -> Result<(), ApiError> {
    let h = req.headers();
    let declared = h.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    let has_body = declared.is_some_and(|n| n > 0) || (declared.is_none() && h.contains_key(header::TRANSFER_ENCODING));
    let must = has_body
        || matches!(
            route,
            Route::Chat
                | Route::Responses
                | Route::CreateConversation
                | Route::Messages
                | Route::CountTokens
                | Route::Gemini { .. }
        );
    if !must {
        return Ok(());
    }
    let media = h
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or("").trim().to_ascii_lowercase());
    match media.as_deref() {
        Some("application/json") => Ok(()),
        Some("multipart/form-data") if *route == Route::Passthrough => Ok(()),
        _ => Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            "unsupported_media_type",
            "The request body must be sent as `Content-Type: application/json`",
        )),
    }
}

/// A stored object: relayed only for its owner; anyone else gets the 404 a
/// missing id gets, and the upstream is not asked.
async fn stored_object(state: &Shared, req: Request, kind: Stored, id: &str) -> Result<Response, ApiError> {
    let (who, _) = caller(state, req.headers()).await?;
    let user = match who {
        FromHeaders::User(who) => who.user,
        // No body names anyone on a read: anonymous_user, else 401.
        FromHeaders::Body => identity::from_body(&state.settings, None)?.user,
    };
    owned(state, kind, id, &user).await?;
    relay_other(state, req, None).await
}

/// Anything relayed without injection (the allowlist, stored objects,
/// conversations): the caller identified (unless the upstream authenticates
/// callers itself, `forward_authorization`), the body read within its limits
/// and relayed, with `user` / `safety_identifier` in a JSON body named as
/// for chat. With `created`, the new object's id is recorded as the caller's.
async fn relay_other(state: &Shared, req: Request, created: Option<Stored>) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let s = &state.settings;
    let (who, budgets) = if s.forward_authorization && created.is_none() {
        (None, vec![&state.bodies, &state.unidentified])
    } else {
        let (who, budgets) = caller(state, &parts.headers).await?;
        let user = match who {
            FromHeaders::User(who) => who.user,
            FromHeaders::Body => identity::from_body(s, None)?.user,
        };
        (Some(user), budgets)
    };
    let read = body::read(&parts.headers, body, s.max_body_bytes, s.body_timeout, &budgets).await?;
    let is_json = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with("application/json"));
    let bytes = match (&who, is_json && !read.bytes.is_empty()) {
        (Some(user), true) => {
            let mut obj = JsonObject::parse(&read.bytes, s.max_body_fields)?;
            openai::name_upstream_user(s, &mut obj, user);
            reqwest::Body::wrap(obj.to_chunks())
        }
        _ => read.bytes.clone().into(),
    };
    let path = Canonical::parse(parts.uri.path())?;
    let segments = path.segments();
    let headers = state.upstream.headers_for_upstream(&parts.headers);
    let relayed = state
        .upstream
        .send(Outgoing { method: parts.method, path: &segments[1..], query: parts.uri.query(), headers, body: bytes })
        .await?;
    drop(read);
    state.metrics.upstream("passthrough", relayed.waited.as_secs_f64());
    match (created, who) {
        (Some(kind), Some(user)) => Ok(created::record(relayed.response, kind, user, state.owners.clone()).await),
        _ => Ok(relayed.response),
    }
}

#[cfg(test)]
mod tests;
