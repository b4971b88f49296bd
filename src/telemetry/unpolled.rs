//! [`Unpolled`]: a `tracing` layer wrapper that drops the per-poll calls.
//!
//! Layer: inside `telemetry`; imports nothing of this crate.

// `Layer::downcast_raw` is an `unsafe` trait method: a layer that wraps
// another forwards it (as `tracing-subscriber`'s own wrappers do).
#![allow(unsafe_code)]

use std::any::TypeId;

use tracing::span;
use tracing::{Dispatch, Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// A layer without the calls made on every poll: a layer with a filter of
/// its own (`with_filter`) looks the span up on each enter and exit to see
/// whether its layer wanted it, twice a poll of every instrumented future,
/// only to call a layer that, like the log formatter without span events
/// and the sampling gate, does nothing there. Everything else is passed
/// through unchanged. For a layer whose `on_enter` and `on_exit` do nothing.
pub struct Unpolled<L>(pub L);

impl<S, L> Layer<S> for Unpolled<L>
where
    S: Subscriber,
    L: Layer<S>,
{
    fn on_register_dispatch(&self, subscriber: &Dispatch) {
        self.0.on_register_dispatch(subscriber);
    }

    fn on_layer(&mut self, subscriber: &mut S) {
        self.0.on_layer(subscriber);
    }

    fn register_callsite(&self, metadata: &'static tracing::Metadata<'static>) -> tracing::subscriber::Interest {
        self.0.register_callsite(metadata)
    }

    fn enabled(&self, metadata: &tracing::Metadata<'_>, ctx: Context<'_, S>) -> bool {
        self.0.enabled(metadata, ctx)
    }

    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        self.0.on_new_span(attrs, id, ctx);
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        self.0.max_level_hint()
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        self.0.on_record(id, values, ctx);
    }

    fn on_follows_from(&self, id: &span::Id, follows: &span::Id, ctx: Context<'_, S>) {
        self.0.on_follows_from(id, follows, ctx);
    }

    fn event_enabled(&self, event: &Event<'_>, ctx: Context<'_, S>) -> bool {
        self.0.event_enabled(event, ctx)
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        self.0.on_event(event, ctx);
    }

    fn on_close(&self, id: span::Id, ctx: Context<'_, S>) {
        self.0.on_close(id, ctx);
    }

    fn on_id_change(&self, old: &span::Id, new: &span::Id, ctx: Context<'_, S>) {
        self.0.on_id_change(old, new, ctx);
    }

    unsafe fn downcast_raw(&self, id: TypeId) -> Option<*const ()> {
        if id == TypeId::of::<Self>() {
            // SAFETY: a pointer to `self`, of the type `id` names, valid as long as `self` is.
            Some(self as *const Self as *const ())
        } else {
            // SAFETY: the inner layer's answer for `id`, unchanged (as a wrapping layer must, so the wrapped one finds its own data).
            unsafe { self.0.downcast_raw(id) }
        }
    }
}
