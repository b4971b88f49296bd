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

impl TraceContext {
    /// Whether the trace is kept (exported): its `sampled` flag.
    #[cfg_attr(not(feature = "serve"), allow(dead_code))]
    pub(crate) fn sampled(&self) -> bool {
        let flags = self.traceparent.rsplit('-').next().unwrap_or_default();
        u8::from_str_radix(flags, 16).is_ok_and(|f| f & 1 == 1)
    }
}

#[cfg(feature = "otel")]
mod on {
    #[cfg(feature = "serve")]
    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::{TraceContextExt, TraceFlags};
    #[cfg(feature = "serve")]
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::TraceContext;

    /// The current span's context: the OpenTelemetry layer's when its trace
    /// is kept, else the one the sampling gate gave a trace not kept.
    pub(crate) fn current() -> Option<TraceContext> {
        let span = tracing::Span::current();
        let cx = span.context();
        if !cx.span().span_context().is_valid() {
            return span.with_subscriber(|(id, dispatch)| super::gate::unsampled_context(dispatch, id)).flatten();
        }
        Some(of(cx.span().span_context()))
    }

    /// Whether the current span is in a trace the sampling gate decided not to keep.
    pub(crate) fn unkept() -> bool {
        tracing::Span::current().with_subscriber(|(id, dispatch)| super::gate::unkept(dispatch, id)).unwrap_or(false)
    }

    /// What `TraceContextPropagator::inject_context` writes for `sc`, without its map of header names: the
    /// `traceparent` with only the sampled flag, and the trace state as parsed (so a `tracestate` that was not
    /// W3C's, too many entries or bad keys, is not passed on as written).
    fn of(sc: &opentelemetry::trace::SpanContext) -> TraceContext {
        let state = sc.trace_state().header();
        TraceContext {
            traceparent: format!(
                "00-{}-{}-{:02x}",
                sc.trace_id(),
                sc.span_id(),
                (sc.trace_flags() & TraceFlags::SAMPLED).to_u8()
            ),
            tracestate: (!state.is_empty()).then_some(state),
        }
    }

    /// Opens a request's span (by `open`) in the caller's trace when
    /// `headers` carry a valid `traceparent`: kept or not as the caller
    /// decided (the sampling gate's first decision), and when kept, a child
    /// of the caller's span.
    #[cfg(feature = "serve")]
    pub(crate) fn request_span(headers: &http::HeaderMap, open: impl FnOnce() -> tracing::Span) -> tracing::Span {
        // Most requests carry no trace: the gate draws for them.
        if !headers.contains_key("traceparent") {
            return open();
        }
        let cx = TraceContextPropagator::new().extract(&opentelemetry_http::HeaderExtractor(headers));
        let caller = cx.span().span_context().clone();
        if !caller.is_valid() {
            return open();
        }
        // Passed on as parsed, as for a kept trace.
        let context = of(&caller);
        let span = super::gate::with_caller(caller.is_sampled(), context, open);
        if caller.is_sampled() && !span.is_disabled() {
            let _ = span.set_parent(cx);
        }
        span
    }
}

#[cfg(feature = "otel")]
pub(crate) use on::current;

/// A span below a request's (by `open`), or none when the request's trace
/// is not kept: such a span would never be exported, and each one costs
/// its creation and a lookup on every poll. A trace not kept still passes
/// its W3C context downstream (the nearest span's, see `gate.rs`); with
/// `-v` logs, lines inside such a request name only its request span (the
/// request and trace ids are on it). Without the CLI's exporter (an
/// application's own OpenTelemetry layer, or none) every span is made.
pub(crate) fn child_span(open: impl FnOnce() -> tracing::Span) -> tracing::Span {
    #[cfg(feature = "otel")]
    if on::unkept() {
        return tracing::Span::none();
    }
    open()
}
#[cfg(all(feature = "otel", feature = "serve"))]
pub(crate) use on::request_span;

/// The current span's context (none without the `otel` feature).
#[cfg(not(feature = "otel"))]
pub(crate) fn current() -> Option<TraceContext> {
    None
}

/// Opens a request's span (without the `otel` feature, no trace to continue).
#[cfg(all(not(feature = "otel"), feature = "serve"))]
pub(crate) fn request_span(_headers: &http::HeaderMap, open: impl FnOnce() -> tracing::Span) -> tracing::Span {
    open()
}

#[cfg(all(feature = "otel", feature = "cli"))]
mod export;
#[cfg(feature = "otel")]
mod gate;
#[cfg(all(feature = "otel", feature = "cli"))]
pub use export::{Telemetry, otlp_layer};
#[cfg(feature = "cli")]
mod unpolled;
#[cfg(feature = "cli")]
pub use unpolled::Unpolled;
