//! `mcp-context serve`: an OpenAI-compatible proxy. Point any OpenAI client's
//! base URL here; every chat-completions or Responses request gets the
//! caller's policy-filtered, budgeted context (one message at index 0, or
//! ahead of the caller's `instructions`) and goes on to the upstream; the
//! answer, streamed or not, comes back unchanged.
//!
//! A library module behind the default `serve` feature, so that the bare
//! library stays free of an HTTP server: `mcp-context serve` runs it
//! ([`run`]), and an application mounts it in its own axum app ([`Proxy`]:
//! its [`Proxy::router`] is an axum `Router`, a `tower::Service`). Here: the
//! router, the state and the process lifecycle (signals, shutdown, reload);
//! beside it `identity` (who is calling), `relay` (the upstream side),
//! `metrics`, `error` (our errors in OpenAI's shape).
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
mod identity;
mod listen;
mod mcp;
mod messages;
mod metrics;
mod owners;
mod path;
mod relay;
mod routes;
mod status;
mod usage;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::settings::{ServeSettings, UpstreamUser};
use crate::{Config, ContextRequest, McpContext, Policy};
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use self::body::{Budget, JsonObject, raw};
use self::error::ApiError;
use self::identity::{FromHeaders, Source};
use self::metrics::Metrics;
use self::owners::{Owners, Verdict};
use self::path::Canonical;
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

/// Which injection a route does.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Responses,
}

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
        Err((label, e)) if messages::claims(req.uri().path()) => (label, messages::error_response(e)),
        Err((label, e)) => (label, e.into_response()),
        Ok(route) => {
            let label = route.label();
            // Injecting routes get their ids now: the record reads them, and every event of the request is
            // logged in the span that carries them.
            if matches!(route, Route::Chat | Route::Responses | Route::Messages | Route::CountTokens) {
                let ids = audit::Ids::of(req.headers());
                tracing::Span::current()
                    .record("request_id", ids.request_id.as_str())
                    .record("trace_id", ids.trace_id.as_str());
                req.extensions_mut().insert(ids);
            }
            let r = async {
                match route {
                    Route::Chat => inject_and_forward(&state, req, Kind::Chat).await,
                    Route::Responses => inject_and_forward(&state, req, Kind::Responses).await,
                    Route::CreateConversation => relay_other(&state, req, Some(Stored::Conversation)).await,
                    Route::StoredObject { kind, id } => stored_object(&state, req, kind, &id).await,
                    Route::Passthrough => relay_other(&state, req, None).await,
                    Route::Messages => Ok(messages::handle(&state, req, messages::Endpoint::Messages).await),
                    Route::CountTokens => Ok(messages::handle(&state, req, messages::Endpoint::CountTokens).await),
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
    if path.segments().first() == Some(&"v1") && !host_allowed(&state.hosts, req) {
        return Err((
            "refused",
            ApiError::bad_request(
                "invalid_host",
                "The Host header is not one this proxy answers to (serve.allowed_hosts)",
            ),
        ));
    }
    let route = routes::route(req.method(), &path, &state.settings.passthrough).map_err(|why| {
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
            Route::Chat | Route::Responses | Route::CreateConversation | Route::Messages | Route::CountTokens
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

/// Who is calling, from the headers (a JWT bearer verified first, with
/// `serve.jwt`), and the body budgets that caller draws on; in the span
/// `mcp_context.identity`.
async fn caller<'a>(state: &'a AppState, headers: &HeaderMap) -> Result<(FromHeaders, Vec<&'a Budget>), ApiError> {
    let span = crate::telemetry::child_span(|| tracing::info_span!("mcp_context.identity"));
    let verified = identity::verified(state.jwt.as_ref(), headers, |r| state.metrics.auth_failure(r));
    let who = match tracing::Instrument::instrument(verified, span.clone()).await? {
        Some(id) => FromHeaders::User(id),
        None => span.in_scope(|| identity::from_headers(&state.settings, headers))?,
    };
    let budgets = match &who {
        FromHeaders::User(id) if matches!(id.source, Source::Key | Source::Header | Source::Jwt) => vec![&state.bodies],
        _ => vec![&state.bodies, &state.unidentified],
    };
    Ok((who, budgets))
}

/// Identifies the caller from the headers (before any body is read), reads
/// the body within its limits, injects the context by the library's rules
/// into the fields we own, forwards, relays, and records what the upstream
/// stored for the caller.
async fn inject_and_forward(state: &Shared, req: Request, kind: Kind) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let (who, budgets) = caller(state, &parts.headers).await?;
    let s = &state.settings;
    let read = body::read(&parts.headers, body, s.max_body_bytes, s.body_timeout, &budgets).await?;
    let mut obj = JsonObject::parse(&read.bytes, s.max_body_fields)?;
    let who = match who {
        FromHeaders::User(who) => who,
        FromHeaders::Body => identity::from_body(s, Some(&obj))?,
    };
    let prepared = match &state.flows {
        Some(f) => f.prepare(&who).await,
        None => crate::credentials::Prepared::default(),
    };
    let user = who.user.clone();
    // The turns the question is taken from, read one at a time and never
    // built (a list of any length costs a few words per run and the query's
    // tail); the caller's chat messages go on as runs of the body's bytes.
    let mut turns = crate::compose::UserTurns::default();
    let mut runs = None;
    match kind {
        Kind::Chat => {
            let missing = || ApiError::bad_request("missing_messages", "The body needs a `messages` array");
            let messages = obj.sent("messages").ok_or_else(missing)?;
            let mut kept = body::Runs::new(messages);
            body::each_item(messages, |m| {
                let ours = is_ours(m);
                if !ours {
                    turns.push_json(m.get());
                }
                kept.push(m, !ours);
            })
            .ok_or_else(missing)?;
            runs = Some(kept);
        }
        Kind::Responses => match obj.sent("input").filter(|i| i.get() != "null") {
            Some(i) if i.get().starts_with('"') => {
                let text = serde_json::from_str::<String>(i.get()).unwrap_or_default();
                turns = crate::compose::UserTurns::of_text(text);
            }
            Some(i) => {
                let _ = body::each_item(i, |item| turns.push_json(item.get()));
            }
            None => return Err(ApiError::bad_request("missing_input", "The body needs an `input`")),
        },
    }
    if kind == Kind::Responses {
        check_continuation(state, &obj, &user).await?;
    }

    let started = Instant::now();
    let mut request = ContextRequest::for_user(user.clone()).with_identity(&who);
    request.model = obj.str_field("model").filter(|m| !m.is_empty());
    // Relevance mode ranks by the conversation: the latest user turn, earlier
    // ones with less weight, exactly as the library's typed `inject`.
    let query = turns.query();
    drop(turns);
    let (message, mut report) = state.ctx.build_unaudited(&request, query).await.map_err(|e| {
        tracing::error!(user = ?request.user, "context could not be built: {e}");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "context_failed",
            format!("The context could not be built: {e}"),
        )
    })?;
    prepared.note(&mut report);
    let route = match kind {
        Kind::Chat => "/v1/chat/completions",
        Kind::Responses => "/v1/responses",
    };
    let ids = parts.extensions.get::<audit::Ids>();
    let pending = audit::begin(&state.ctx, ids, route, who.source, &report, message.as_ref());
    let content = message.as_ref().map(|m| m.content.as_str());
    if kind == Kind::Responses {
        set_instructions(&mut obj, content)?;
    }
    name_upstream_user(s, &mut obj, &user);
    state.metrics.injection(&report, started.elapsed().as_secs_f64());
    if let Some(f) = &state.flows {
        f.after_refusals(&user, &report).await;
    }
    tracing::info!(report = %serde_json::to_string(&report).unwrap_or_default(), "injected");
    let stores = match kind {
        Kind::Chat => obj.get("store").is_some_and(|v| v.get() == "true"),
        Kind::Responses => obj.get("store").is_none_or(|v| v.get() != "false"),
    };
    // Chat: ours first, then the caller's turns but any message of ours they carried back. Ours is made once
    // per composition (escaping it for every request cost more than the rest of a warm request) and goes into
    // the body as those very bytes, not copied; the caller's go as slices of the body.
    let forwarded = match runs {
        Some(runs) => {
            let ours = message.as_ref().map(|m| body::Item::Shared(m.chat_json()));
            let theirs = runs.finish().map(|run| body::Item::Shared(obj.share(run)));
            reqwest::Body::wrap(obj.to_chunks_with("messages", ours.into_iter().chain(theirs).collect()))
        }
        None => reqwest::Body::wrap(obj.to_chunks()),
    };
    drop(obj);

    let mut headers = state.upstream.headers_for_upstream(&parts.headers);
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    audit::Ids::propagate(ids, &mut headers);
    let path: &[&str] = match kind {
        Kind::Chat => &["chat", "completions"],
        Kind::Responses => &["responses"],
    };
    let label = match kind {
        Kind::Chat => "/chat/completions",
        Kind::Responses => "/responses",
    };
    let relayed = state
        .upstream
        .send(Outgoing { method: Method::POST, path, query: parts.uri.query(), headers, body: forwarded })
        .await;
    pending.finish(&state.ctx, relayed.as_ref());
    let relayed = relayed?;
    // The body's share of the budget is held until the upstream has it.
    drop(read);
    state.metrics.upstream(label, relayed.waited.as_secs_f64());
    let mut response = relayed.response;
    if stores {
        let stored = match kind {
            Kind::Chat => Stored::ChatCompletion,
            Kind::Responses => Stored::Response,
        };
        response = created::record(response, stored, user, state.owners.clone()).await;
    }
    status::report_headers(&mut response, &report);
    Ok(response)
}

/// Whether a raw chat message is one we injected (read in place: no field
/// of it is built but a role or name with escapes).
fn is_ours(m: &RawValue) -> bool {
    use crate::compose::MaybeStr;
    #[derive(serde::Deserialize)]
    struct Peek<'a> {
        #[serde(borrow)]
        role: Option<MaybeStr<'a>>,
        #[serde(borrow)]
        name: Option<MaybeStr<'a>>,
    }
    serde_json::from_str::<Peek<'_>>(m.get()).is_ok_and(|p| {
        matches!(p.role.and_then(|r| r.0).as_deref(), Some("system" | "developer"))
            && p.name.and_then(|n| n.0).as_deref() == Some(crate::inject::MESSAGE_NAME)
    })
}

/// Our part of Responses `instructions`, ahead of the caller's string (or
/// alone when the caller sent none or `null`). Instructions that are not a
/// string cannot be merged with ours: refused rather than replaced.
fn set_instructions(obj: &mut JsonObject<'_>, content: Option<&str>) -> Result<(), ApiError> {
    let existing = match obj.get("instructions") {
        None => None,
        Some(v) if v.get() == "null" => None,
        Some(v) => Some(serde_json::from_str::<String>(v.get()).map_err(|_| {
            ApiError::bad_request(
                "unsupported_instructions",
                "`instructions` must be a string (or absent) for the proxy to put the context ahead of it",
            )
        })?),
    };
    let had_field = obj.get("instructions").is_some();
    match crate::inject::compose_instructions(existing.as_deref(), content) {
        Some(text) => obj.set("instructions", raw(&text)),
        // Nothing to say, and the caller's own part was empty or only ours: as it was, or removed.
        None if had_field && existing.as_deref().is_some_and(|e| e.starts_with(crate::inject::INSTRUCTIONS_OPEN)) => {
            obj.remove("instructions")
        }
        None => {}
    }
    Ok(())
}

/// A `previous_response_id` or `conversation` that is not the caller's is
/// refused like a missing one: otherwise the model would see its turns.
async fn check_continuation(state: &AppState, obj: &JsonObject<'_>, user: &str) -> Result<(), ApiError> {
    if let Some(id) = obj.parse_field::<Option<String>>("previous_response_id")?.flatten() {
        owned(state, Stored::Response, &id, user).await?;
    }
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Conversation {
        Id(String),
        Object { id: String },
    }
    if let Some(c) = obj.parse_field::<Option<Conversation>>("conversation")?.flatten() {
        let (Conversation::Id(id) | Conversation::Object { id }) = c;
        owned(state, Stored::Conversation, &id, user).await?;
    }
    Ok(())
}

/// Ok when `user` owns `id`; the 404 of a missing object otherwise.
async fn owned(state: &AppState, kind: Stored, id: &str, user: &str) -> Result<(), ApiError> {
    match state.owners.check(kind, id, user).await {
        Verdict::Owner => Ok(()),
        Verdict::NotOwner => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "not_found",
            format!("No {} found with id '{}'.", kind.name(), id.escape_debug()),
        )),
        Verdict::Unknown => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "ownership_unavailable",
            "Whose object this is cannot be checked now (the shared cache is unreachable); retry shortly",
        )),
    }
}

/// The body's `user` and `safety_identifier`, when the caller sent them,
/// become what `serve.upstream_user` says: never a name the caller chose.
fn name_upstream_user(s: &ServeSettings, obj: &mut JsonObject<'_>, user: &str) {
    for k in ["user", "safety_identifier"] {
        if obj.get(k).is_none() {
            continue;
        }
        match s.upstream_user {
            UpstreamUser::Identified => obj.set(k, raw(user)),
            UpstreamUser::Pseudonym => {
                let key = s.pseudonym_key.as_ref().map_or("", |k| secrecy::ExposeSecret::expose_secret(k));
                obj.set(k, raw(&pseudonym(key, user)))
            }
            UpstreamUser::Drop => obj.remove(k),
        }
    }
}

/// HMAC-SHA256 of the user name under the operator's key, hex: stable per
/// user, not reversible without the key.
fn pseudonym(key: &str, user: &str) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).expect("HMAC takes any key");
    mac.update(user.as_bytes());
    mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
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
            name_upstream_user(s, &mut obj, user);
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
