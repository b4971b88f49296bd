//! The sampling gate in front of the OpenTelemetry layer: a trace is kept
//! or not once, when its first span opens, and a span of a trace not kept
//! never reaches the OpenTelemetry layer (which otherwise builds its
//! attributes, ids and timestamps for every span and asks the sampler only
//! when the span ends: measured, a ratio of 0.1 cost as much as 1.0).
//!
//! The decision: a request span opened by [`with_caller`] follows the
//! caller's `traceparent` flag when it sent a valid one; any other trace's
//! first span is kept with probability `ratio`. Every span below inherits
//! its parent's decision. A trace not kept still has a W3C context, the
//! caller's (passed on unchanged) or a fresh one flagged `00`, which
//! [`unsampled_context`] finds for the upstream's `traceparent` and the MCP
//! requests' `_meta`, so the services downstream see one trace either way.
//!
//! Layer: inside `telemetry`; imports only its `TraceContext`.

// `Layer::downcast_raw` is an `unsafe` trait method: a layer that wraps
// another forwards it (as `tracing-subscriber`'s own wrappers do), or
// `tracing-opentelemetry` cannot find its span data behind the gate.
#![allow(unsafe_code)]
// The gate itself is installed by the CLI's exporter; without it only the lookups are used.
#![cfg_attr(not(feature = "cli"), allow(dead_code))]

use std::any::TypeId;
use std::cell::RefCell;
use std::sync::Arc;

use tracing::span;
use tracing::{Dispatch, Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

use super::TraceContext;

/// A span's sampling decision, kept in its extensions.
#[derive(Clone)]
enum Decision {
    Sampled,
    /// A trace not kept, and what to pass downstream for it.
    Unsampled(Arc<Downstream>),
}

/// The W3C context passed downstream for a trace not kept: the caller's, or
/// fresh random ids (written out only when something asks for them).
enum Downstream {
    Caller(TraceContext),
    /// Written out the first time it is asked for (the upstream's header,
    /// the audit record, each MCP read ask again), then copied.
    Fresh {
        trace: u128,
        span: u64,
        written: std::sync::OnceLock<TraceContext>,
    },
}

impl Downstream {
    fn context(&self) -> TraceContext {
        match self {
            Downstream::Caller(c) => c.clone(),
            Downstream::Fresh { trace, span, written } => written
                .get_or_init(|| TraceContext {
                    traceparent: format!("00-{trace:032x}-{span:016x}-00"),
                    tracestate: None,
                })
                .clone(),
        }
    }
}

/// The caller's trace, for the first span opened in [`with_caller`].
struct Caller {
    sampled: bool,
    context: TraceContext,
}

thread_local! {
    static CALLER: RefCell<Option<Caller>> = const { RefCell::new(None) };
}

/// Opens a trace's first span (by `open`) under the caller's decision: kept
/// when `sampled`, else not, with `context` passed on downstream.
pub(super) fn with_caller<T>(sampled: bool, context: TraceContext, open: impl FnOnce() -> T) -> T {
    CALLER.with(|c| *c.borrow_mut() = Some(Caller { sampled, context }));
    let opened = open();
    CALLER.with(|c| c.borrow_mut().take());
    opened
}

/// The context to pass downstream when the span `id` belongs to a trace not
/// kept; `None` when it is kept (the OpenTelemetry layer has its context),
/// or when the subscriber has no gate.
pub(super) fn unsampled_context(dispatch: &Dispatch, id: &span::Id) -> Option<TraceContext> {
    match decision(dispatch, id)? {
        Decision::Sampled => None,
        Decision::Unsampled(downstream) => Some(downstream.context()),
    }
}

/// Whether the span `id` belongs to a trace the gate decided not to keep
/// (false when it is kept, or when the subscriber has no gate).
pub(super) fn unkept(dispatch: &Dispatch, id: &span::Id) -> bool {
    matches!(decision(dispatch, id), Some(Decision::Unsampled(_)))
}

fn decision(dispatch: &Dispatch, id: &span::Id) -> Option<Decision> {
    let find = dispatch.downcast_ref::<FindDecision>()?;
    (find.0)(dispatch, id)
}

/// How [`decision`] reaches the registry through a type-erased `Dispatch`
/// (the way `tracing-opentelemetry` reaches its own data).
struct FindDecision(fn(&Dispatch, &span::Id) -> Option<Decision>);

/// The gate: `inner` sees only the spans, and the events in spans, of traces kept.
pub(super) struct Gate<L> {
    inner: L,
    ratio: f64,
    find: FindDecision,
}

impl<L> Gate<L> {
    pub(super) fn new<S>(inner: L, ratio: f64) -> Self
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        L: Layer<S>,
    {
        Gate { inner, ratio, find: FindDecision(find::<S>) }
    }

    fn decide_root(&self) -> Decision {
        if let Some(caller) = CALLER.with(|c| c.borrow_mut().take()) {
            return if caller.sampled {
                Decision::Sampled
            } else {
                Decision::Unsampled(Arc::new(Downstream::Caller(caller.context)))
            };
        }
        // A per-thread generator, not the system's: the draw and the ids of a trace not kept are made for every
        // request, and a system call each was most of the gate's cost. The OpenTelemetry SDK makes its ids the
        // same way (a seeded per-thread generator).
        if fastrand::f64() < self.ratio {
            return Decision::Sampled;
        }
        // Zero is not a valid W3C id.
        let (trace, span) = (fastrand::u128(1..), fastrand::u64(1..));
        Decision::Unsampled(Arc::new(Downstream::Fresh { trace, span, written: std::sync::OnceLock::new() }))
    }
}

fn find<S>(dispatch: &Dispatch, id: &span::Id) -> Option<Decision>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let subscriber = dispatch.downcast_ref::<S>()?;
    // The nearest span with a decision: the current span may be one the gate's filter left out (a `debug` one).
    for span in subscriber.span(id)?.scope() {
        if let Some(decision) = span.extensions().get::<Decision>() {
            return Some(decision.clone());
        }
    }
    None
}

fn kept<S>(id: &span::Id, ctx: &Context<'_, S>) -> bool
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    ctx.span(id).is_some_and(|s| matches!(s.extensions().get::<Decision>(), Some(Decision::Sampled)))
}

impl<S, L> Layer<S> for Gate<L>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    L: Layer<S>,
{
    fn on_register_dispatch(&self, subscriber: &Dispatch) {
        self.inner.on_register_dispatch(subscriber);
    }

    fn on_layer(&mut self, subscriber: &mut S) {
        self.inner.on_layer(subscriber);
    }

    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let parent = match attrs.parent() {
            Some(p) => ctx.span(p),
            None if attrs.is_contextual() => ctx.lookup_current(),
            None => None,
        };
        let inherited = parent.and_then(|p| p.extensions().get::<Decision>().cloned());
        let decision = inherited.unwrap_or_else(|| self.decide_root());
        let sampled = matches!(decision, Decision::Sampled);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(decision);
        }
        if sampled {
            self.inner.on_new_span(attrs, id, ctx);
        }
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        if kept(id, &ctx) {
            self.inner.on_record(id, values, ctx);
        }
    }

    fn on_follows_from(&self, id: &span::Id, follows: &span::Id, ctx: Context<'_, S>) {
        if kept(id, &ctx) && kept(follows, &ctx) {
            self.inner.on_follows_from(id, follows, ctx);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let span = match event.parent() {
            Some(p) => ctx.span(p),
            None if event.is_contextual() => ctx.lookup_current(),
            None => None,
        };
        if span.is_some_and(|s| matches!(s.extensions().get::<Decision>(), Some(Decision::Sampled))) {
            self.inner.on_event(event, ctx);
        }
    }

    // No `on_enter`/`on_exit`: with context activation and inactivity tracking off (as `otlp_layer` builds it),
    // the OpenTelemetry layer's only work there is stamping an end time on every poll's exit, which the close
    // stamps anyway; so the layer is spared a lookup and a clock read per poll of every instrumented future.

    fn on_close(&self, id: span::Id, ctx: Context<'_, S>) {
        if kept(&id, &ctx) {
            self.inner.on_close(id, ctx);
        }
    }

    /// The gate's own lookup, else the inner layer's (`tracing-opentelemetry`
    /// finds its span data through this).
    unsafe fn downcast_raw(&self, id: TypeId) -> Option<*const ()> {
        // SAFETY (the two answers below): each pointer is to a field of `self` (or `self`) of exactly the type
        // `id` names, valid as long as `self` is.
        if id == TypeId::of::<Self>() {
            Some(self as *const Self as *const ())
        } else if id == TypeId::of::<FindDecision>() {
            Some(&self.find as *const FindDecision as *const ())
        } else {
            // SAFETY: the pointer is the inner layer's answer for `id`, returned unchanged: it points to a value of
            // the type `id` names, owned by the inner layer, which lives as long as `self`.
            unsafe { self.inner.downcast_raw(id) }
        }
    }
}
