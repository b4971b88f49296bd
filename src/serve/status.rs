//! `/readyz` and `/metrics`: the proxy's state for probes and scrapers,
//! the audit sinks included. May import the proxy's state and the engine's
//! status calls.

use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use super::AppState;

/// Ready once the config and policy are loaded (they are, or the process
/// would not be listening); MCP servers or the shared cache being down is
/// `degraded`, still 200. While draining after SIGTERM: 503. Only the status
/// is shown (anyone may ask); `serve.readyz_details: true` adds the policy
/// path, each server's state and the shared cache's. An audit sink that is
/// down degrades too (records are dropped and counted, requests go on) and
/// adds a note naming the sink (its cause only with the details).
pub(super) fn readyz(state: &AppState) -> Response {
    let status = state.ctx.hub().status();
    // A shared cache that is down degrades, never blocks: requests go on
    // with the local cache and MCP reads.
    let shared = state.ctx.shared_cache_status();
    let audit = state.ctx.audit_status();
    let notes: Vec<String> = audit
        .iter()
        .filter(|a| !a.up)
        .map(|a| format!("audit sink `{}` is down: its records are dropped (counted in /metrics)", a.sink))
        .collect();
    let degraded = status.iter().any(|s| !s.connected) || shared.as_ref().is_some_and(|s| !s.up) || !notes.is_empty();
    let draining = state.draining.load(Ordering::SeqCst);
    let word = if draining {
        "draining"
    } else if degraded {
        "degraded"
    } else {
        "ready"
    };
    let mut body = serde_json::json!({ "status": word });
    if !notes.is_empty() {
        body["notes"] = notes.into();
    }
    if state.settings.readyz_details {
        let servers: Vec<_> = status
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
        body["policy"] = state
            .policy_path
            .as_ref()
            .map_or("allow-all (no policy configured)".into(), |p| p.display().to_string())
            .into();
        body["servers"] = servers.into();
        body["shared_cache"] = serde_json::to_value(shared).unwrap_or_default();
        body["audit"] = serde_json::to_value(audit).unwrap_or_default();
    }
    let code = if draining { axum::http::StatusCode::SERVICE_UNAVAILABLE } else { axum::http::StatusCode::OK };
    (code, axum::Json(body)).into_response()
}

pub(super) fn metrics(state: &AppState) -> Response {
    let text = state.metrics.render(state.ctx.hub(), state.ctx.shared_cache_status(), &state.ctx.audit_status());
    let mut r = Response::new(Body::from(text));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    r
}
