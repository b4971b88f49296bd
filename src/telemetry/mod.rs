//! Traces: the W3C trace context of the current span, carried to MCP
//! servers (a request's `_meta`, 2026-07-28 / SEP-414) and to the upstream
//! (the `traceparent` header); a caller's `traceparent` continued; and the
//! OTLP/HTTP exporter the CLI installs from `telemetry:`.
//!
//! The library only makes `tracing` spans (`mcp_context.inject`,
//! `mcp_context.select`, `mcp_context.read`, `mcp.read` per resource read
//! past the in-process cache, `mcp_context.compose`; `serve` adds the
//! request, identity and upstream spans). They become OpenTelemetry spans
//! when the subscriber has an OpenTelemetry layer: the CLI's (from
//! [`otlp_layer`]) or an embedding application's own
//! `tracing_opentelemetry` layer. Without one (or without the `otel`
//! feature) every function here is a no-op and nothing is propagated.
//!
//! Layer: bottom. Imports only `error` (and, for the exporter, the settings
//! type it is handed).

/// The W3C trace context of the current span, if it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TraceContext {
    /// `00-{trace id}-{span id}-{flags}`.
    pub(crate) traceparent: String,
    /// The vendor state carried along, if any.
    pub(crate) tracestate: Option<String>,
}

#[cfg(feature = "otel")]
mod on {
    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::TraceContextExt;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::TraceContext;

    /// The current span's context, when an OpenTelemetry layer gave it a valid one.
    pub(crate) fn current() -> Option<TraceContext> {
        let cx = tracing::Span::current().context();
        if !cx.span().span_context().is_valid() {
            return None;
        }
        let mut fields = std::collections::HashMap::new();
        TraceContextPropagator::new().inject_context(&cx, &mut fields);
        Some(TraceContext { traceparent: fields.remove("traceparent")?, tracestate: fields.remove("tracestate") })
    }

    /// Makes `span` a child of the caller's trace when `headers` carry a
    /// valid `traceparent`.
    pub(crate) fn continue_from(span: &tracing::Span, headers: &http::HeaderMap) {
        // Most requests carry no trace, and a span nobody records needs no parent.
        if span.is_disabled() || !headers.contains_key("traceparent") {
            return;
        }
        let cx = TraceContextPropagator::new().extract(&opentelemetry_http::HeaderExtractor(headers));
        if cx.span().span_context().is_valid() {
            let _ = span.set_parent(cx);
        }
    }
}

#[cfg(feature = "otel")]
pub(crate) use on::{continue_from, current};

/// The current span's context (none without the `otel` feature).
#[cfg(not(feature = "otel"))]
pub(crate) fn current() -> Option<TraceContext> {
    None
}

/// Continues the caller's trace (nothing without the `otel` feature).
#[cfg(all(not(feature = "otel"), feature = "serve"))]
pub(crate) fn continue_from(_span: &tracing::Span, _headers: &http::HeaderMap) {}

#[cfg(all(feature = "otel", feature = "cli"))]
mod export;
#[cfg(all(feature = "otel", feature = "cli"))]
pub use export::{Telemetry, otlp_layer};
