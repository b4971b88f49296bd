//! The audit record of each injection the proxy makes: begun when the
//! context is built (the library's entry used here writes none), finished
//! with the upstream's status and latency and handed to the sinks, so each
//! injection has exactly one record. A request whose upstream was not
//! reached still gets its record, without a status.
//!
//! Also the ids of each injecting request ([`Ids`]): set once by the
//! dispatcher (as a request extension, and as fields of the
//! `mcp_context.request` span every event of the request is logged in),
//! read by the record.
//!
//! May import the audit module and the proxy's own parts.

use std::time::Duration;

use axum::http::HeaderMap;

use super::error::ApiError;
use super::identity::Source;
use super::relay::Relayed;
use crate::audit::{AuditRecord, Origin, random_hex, trace_id_of, usable_request_id};
use crate::{ContextMessage, McpContext, Report};

/// A request's id and trace id: the caller's `x-request-id` when usable,
/// else random; the trace id of the caller's `traceparent`, else random.
#[derive(Debug, Clone)]
pub(super) struct Ids {
    pub(super) request_id: String,
    pub(super) trace_id: String,
}

impl Ids {
    /// With traces on, the trace id is the current span's (the caller's
    /// when it sent one, else the one the request span started), so the
    /// record and the exported trace name the same trace.
    pub(super) fn of(headers: &HeaderMap) -> Ids {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let traced = crate::telemetry::current().and_then(|t| trace_id_of(&t.traceparent));
        Ids {
            request_id: header("x-request-id").and_then(usable_request_id).unwrap_or_else(random_hex),
            trace_id: traced.or_else(|| header("traceparent").and_then(trace_id_of)).unwrap_or_else(random_hex),
        }
    }

    /// Gives the upstream request a W3C `traceparent` when the caller sent
    /// none (the caller's own goes on unchanged): this trace id, so that the
    /// upstream's logs join the audit record.
    pub(super) fn propagate(ids: Option<&Ids>, headers: &mut HeaderMap) {
        let Some(ids) = ids else { return };
        if headers.contains_key("traceparent") {
            return;
        }
        let parent = &random_hex()[..16];
        if let Ok(v) = axum::http::HeaderValue::from_str(&format!("00-{}-{parent}-01", ids.trace_id)) {
            headers.insert("traceparent", v);
        }
    }
}

/// A record waiting for the upstream's answer.
pub(super) struct Pending(Option<AuditRecord>);

/// Starts the record of an injection on `route` for a caller identified by `source`.
pub(super) fn begin(
    ctx: &McpContext,
    ids: Option<&Ids>,
    route: &str,
    source: Source,
    report: &Report,
    message: Option<&ContextMessage>,
) -> Pending {
    let ids = ids.cloned().unwrap_or_else(|| Ids::of(&HeaderMap::new()));
    let origin = Origin {
        route: route.to_owned(),
        identity_source: source.as_str().to_owned(),
        request_id: ids.request_id,
        trace_id: ids.trace_id,
    };
    Pending(ctx.audit_record(report, message, origin))
}

impl Pending {
    /// Adds the upstream's status and time to headers (when it answered) and hands the record to the sinks.
    pub(super) fn finish(self, ctx: &McpContext, relayed: Result<&Relayed, &ApiError>) {
        let Some(mut record) = self.0 else { return };
        if let Ok(r) = relayed {
            record.upstream_status = Some(r.response.status().as_u16());
            record.upstream_ms = Some(ms(r.waited));
        }
        ctx.audit(record);
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}
