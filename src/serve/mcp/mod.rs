//! `serve.mcp`: `/mcp`, an MCP server (Streamable HTTP, through rmcp) made
//! of each caller's governed resources, for hosts that cannot be put behind
//! the proxy (Claude Desktop, Cursor, VS Code, ...). Both revisions we
//! speak: 2025-11-25 with sessions (and `resources/subscribe`), 2026-07-28
//! without a handshake (and `subscriptions/listen`).
//!
//! Here: the HTTP side. Every request is identified as on the proxy's
//! routes (a JWT verified, then `serve.keys`, the user header,
//! `anonymous_user`) before rmcp sees it, and a request without a valid
//! identity gets `401` with `WWW-Authenticate: Bearer resource_metadata=…`
//! naming this endpoint's protected resource metadata (RFC 9728, served at
//! `/.well-known/oauth-protected-resource[/mcp]`), whose authorization
//! server is `serve.jwt`'s issuer. A JWT must name this endpoint (its
//! `resource` URL) in `aud`: a token for the proxy or for another service
//! is refused. Beside it: `server` (the MCP server of one caller), `uri` (our
//! URIs), `wire` (our types in MCP's), `live` (notifications).
//!
//! May import the proxy's identity, audit ids and errors, the engine and rmcp.

mod live;
mod server;
mod uri;
mod wire;

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use super::audit::Ids;
use super::error::ApiError;
use super::identity::{self, FromHeaders};
use super::{AppState, host_allowed};
use crate::McpContext;
use crate::identity::{Identity, JwtVerifier};
use crate::settings::ServeSettings;

/// Who sent an MCP request, as the HTTP side found out (a request extension rmcp hands on).
#[derive(Clone)]
pub(super) struct Caller {
    pub(super) who: Identity,
    pub(super) ids: Ids,
}

/// The endpoint, when `serve.mcp` is on.
pub(super) struct Endpoint {
    service: StreamableHttpService<server::Session, LocalSessionManager>,
    /// This endpoint's URL: the `resource` of its metadata, the audience of its tokens.
    resource: String,
    /// Where its protected resource metadata is.
    metadata: String,
    /// `serve.jwt` with this endpoint as the only audience.
    jwt: Option<JwtVerifier>,
    stop: CancellationToken,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Endpoint {
    /// The endpoint of `settings.mcp` over `ctx` (`None` when it is off).
    pub(super) fn new(
        ctx: &Arc<McpContext>,
        settings: &ServeSettings,
        flows: Option<Arc<crate::credentials::CredentialFlows>>,
    ) -> crate::Result<Option<Endpoint>> {
        let Some(mcp) = &settings.mcp else { return Ok(None) };
        let base = settings.public_url.clone().unwrap_or_else(|| format!("http://{}", settings.listen));
        let resource = mcp.resource.clone().unwrap_or_else(|| format!("{base}/mcp"));
        let metadata = metadata_url(&resource);
        let jwt = match &settings.jwt {
            Some(j) => {
                let mut s = j.settings.clone();
                s.audience = vec![resource.clone()];
                let v = JwtVerifier::unfetched(s)?;
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    let early = v.clone();
                    // The keys, fetched ahead of the first token (which fetches them itself otherwise).
                    rt.spawn(async move { early.refresh().await.ok() });
                }
                Some(v)
            }
            None => None,
        };
        let shared = Arc::new(server::Shared {
            ctx: ctx.clone(),
            page_size: mcp.page_size,
            live: live::Live::start(ctx.clone()),
            flows,
        });
        let stop = CancellationToken::new();
        // The proxy checks `Host` itself (serve.allowed_hosts, as on /v1/).
        let config = StreamableHttpServerConfig::default()
            .disable_allowed_hosts()
            .with_cancellation_token(stop.child_token())
            .with_max_request_body_bytes(settings.max_body_bytes);
        let service = StreamableHttpService::new(
            move || Ok(server::Session::new(shared.clone())),
            LocalSessionManager::default().into(),
            config,
        );
        Ok(Some(Endpoint { service, resource, metadata, jwt, stop }))
    }

    /// The 401 of a request without a valid identity, naming the metadata.
    fn challenge(&self, mut e: ApiError) -> ApiError {
        if e.status == StatusCode::UNAUTHORIZED {
            let named = format!("Bearer resource_metadata=\"{}\"", self.metadata);
            e.challenge = Some(match e.challenge.as_deref().and_then(|c| c.strip_prefix("Bearer ")) {
                Some(params) => format!("{named}, {params}"),
                None => named,
            });
        }
        e
    }
}

/// RFC 9728 section 3.1: the well-known path goes between the host and the resource's path.
fn metadata_url(resource: &str) -> String {
    match url::Url::parse(resource) {
        Ok(u) => {
            let origin = u.origin().ascii_serialization();
            let path = u.path().trim_end_matches('/');
            format!("{origin}/.well-known/oauth-protected-resource{path}")
        }
        Err(_) => format!("{resource}/.well-known/oauth-protected-resource"),
    }
}

fn not_enabled() -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "unknown_url",
        "The MCP endpoint is off: turn it on with `serve.mcp`",
    )
    .into_response()
}

/// The caller, as on the proxy's routes but with this endpoint's audience for a JWT.
async fn identify(state: &AppState, ep: &Endpoint, headers: &HeaderMap) -> Result<Identity, ApiError> {
    if let Some(who) = identity::verified(ep.jwt.as_ref(), headers, |r| state.metrics.auth_failure(r)).await? {
        return Ok(who);
    }
    match identity::from_headers(&state.settings, headers)? {
        FromHeaders::User(who) => Ok(who),
        FromHeaders::Body => identity::from_body(&state.settings, None),
    }
}

/// `/mcp`: identified, then served by rmcp.
pub(super) async fn handle(state: &AppState, mut req: Request) -> Response {
    let Some(ep) = &state.mcp else { return not_enabled() };
    if !host_allowed(&state.hosts, &req) {
        let e = ApiError::bad_request(
            "invalid_host",
            "The Host header is not one this proxy answers to (serve.allowed_hosts)",
        );
        return e.into_response();
    }
    let who = match identify(state, ep, req.headers()).await {
        Ok(who) => who,
        Err(e) => return ep.challenge(e).into_response(),
    };
    let ids = Ids::of(req.headers());
    tracing::Span::current().record("request_id", ids.request_id.as_str()).record("trace_id", ids.trace_id.as_str());
    req.extensions_mut().insert(Caller { who, ids });
    ep.service.handle(req).await.map(axum::body::Body::new).into_response()
}

/// `/.well-known/oauth-protected-resource[/mcp]`: this endpoint's metadata (RFC 9728).
pub(super) fn protected_resource(state: &AppState) -> Response {
    let Some(ep) = &state.mcp else { return not_enabled() };
    let mut doc = serde_json::json!({
        "resource": ep.resource,
        "bearer_methods_supported": ["header"],
        "resource_name": "mcp-context",
    });
    if let Some(v) = &ep.jwt {
        doc["authorization_servers"] = serde_json::json!([v.settings().issuer]);
    }
    let mut r = axum::Json(doc).into_response();
    r.headers_mut().insert(header::CACHE_CONTROL, axum::http::HeaderValue::from_static("max-age=300"));
    r
}
