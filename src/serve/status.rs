//! What the proxy says about itself and about one answer: `/readyz`,
//! `/metrics` (the audit sinks included), and the `x-mcp-context` header.
//! May import the rest of `serve`.

use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::{ExcludeReason, Report};

/// `x-mcp-context`: who, tokens used of the budget, and counts of what the
/// caller's own context holds or lost (budget, read errors, failed servers),
/// never of what the caller is denied.
pub(super) fn compact_report(r: &Report) -> String {
    let user: String =
        r.user.chars().map(|c| if c.is_ascii_graphic() && c != ';' && c != '"' { c } else { '_' }).collect();
    let count = |reason: ExcludeReason| r.excluded.count(reason);
    let clean = |s: &str| -> String {
        s.chars().map(|c| if c.is_ascii_graphic() && !matches!(c, ';' | '"' | ',') { c } else { '_' }).collect()
    };
    // Who, by which source, with which roles: the caller's own, never what they are denied. Both keys are
    // always there (roles may be empty), so the header's shape is the same for every caller.
    let who = format!(
        "; identity={}; roles={}",
        r.identity.as_deref().map_or_else(|| "-".to_owned(), clean),
        r.roles.iter().map(|x| clean(x)).collect::<Vec<_>>().join(",")
    );
    format!(
        "user={user}; tokens={}/{}; included={}; truncated={}; over_budget={}; errors={}; failed={}{who}",
        r.tokens,
        r.budget,
        r.included.len(),
        r.included.iter().filter(|i| i.truncated).count(),
        count(ExcludeReason::Budget),
        count(ExcludeReason::Error),
        r.failed_servers.len(),
    )
}

/// `x-mcp-context-auth`: the caller's state with each per-user server
/// (`drive=needs_authorization; jira=connected`); absent when no server is
/// per user. Where to connect is in the report, not here.
pub(super) const AUTH_HEADER: &str = "x-mcp-context-auth";

/// The report's headers on a relayed answer: `x-mcp-context`, and
/// `x-mcp-context-auth` when the report has per-user servers.
pub(super) fn report_headers(response: &mut Response, r: &Report) {
    if let Ok(v) = HeaderValue::from_str(&compact_report(r)) {
        response.headers_mut().insert(super::REPORT_HEADER, v);
    }
    if !r.auth.is_empty() {
        let text = r.auth.iter().map(|a| format!("{}={}", a.server, a.state)).collect::<Vec<_>>().join("; ");
        if let Ok(v) = HeaderValue::from_str(&text) {
            response.headers_mut().insert(AUTH_HEADER, v);
        }
    }
}

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
    // The identity provider unreachable: the keys held keep verifying, but rotation would not be seen.
    let idp = state.jwt.as_ref().and_then(crate::identity::JwtVerifier::problem);
    let degraded = status.iter().any(|s| !s.connected)
        || shared.as_ref().is_some_and(|s| !s.up)
        || !notes.is_empty()
        || idp.is_some();
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
    if let Some(problem) = idp {
        body["identity_provider"] = problem.into();
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
    if let Some(f) = &state.flows {
        state.metrics.token_grants(f.exchanges(), f.oauth().refreshes());
    }
    let text = state.metrics.render(state.ctx.hub(), state.ctx.shared_cache_status(), &state.ctx.audit_status());
    let mut r = Response::new(Body::from(text));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    r
}
