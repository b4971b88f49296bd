//! The per-server state: its config, the limit of its reads in flight, the
//! backoff between reconnection attempts, and what is known about it (its
//! connection, last error, listing, timings, restarts) behind **one** lock,
//! so that every reader sees one moment of it and every change is one step.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use tokio::sync::Semaphore;

use super::connect::Live;
use super::list::Listing;
use crate::config::ServerConfig;

/// One configured server.
pub(super) struct Server {
    pub(super) cfg: ServerConfig,
    /// Its reads in flight, at most `max_concurrent_reads`.
    pub(super) reads: Semaphore,
    /// Serialises reconnection attempts and holds their backoff.
    pub(super) restart: tokio::sync::Mutex<Backoff>,
    state: RwLock<State>,
}

/// What is known about one server at one moment. Changed only through the
/// methods of [`Server`], each of which is one write.
#[derive(Default)]
pub(super) struct State {
    /// The current connection, while there is one (its transport may have
    /// closed since: see [`State::usable`]).
    pub(super) live: Option<Arc<Live>>,
    /// Why the last connection attempt failed, or `closed`.
    pub(super) error: Option<String>,
    /// The last listing of a current connection.
    pub(super) listing: Arc<Listing>,
    /// Spawn (or dial) to the end of the handshake, of the current connection, in ms.
    pub(super) connect_ms: f64,
    /// Listing every page of resources and templates after the handshake, in ms.
    pub(super) list_ms: f64,
    /// How many times a lost connection was re-established.
    pub(super) restarts: u32,
    /// The hub's restart count when this server last restarted (0: never).
    pub(super) restarted_at: u64,
    /// Bumped on every successful (re)connection, so state tied to one
    /// connection (subscriptions, the entries they keep) can tell it is gone.
    pub(super) epoch: u64,
}

impl State {
    /// The connection, if its transport is still open.
    pub(super) fn usable(&self) -> Option<&Arc<Live>> {
        self.live.as_ref().filter(|l| !l.peer.is_transport_closed())
    }
}

impl Server {
    pub(super) fn new(cfg: &ServerConfig) -> Server {
        Server {
            cfg: cfg.clone(),
            reads: Semaphore::new(cfg.max_concurrent_reads),
            restart: tokio::sync::Mutex::new(Backoff::default()),
            state: RwLock::new(State::default()),
        }
    }

    /// The state as it is now; hold the guard only as long as it is read.
    pub(super) fn state(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn state_mut(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The current listing, shared.
    pub(super) fn listing(&self) -> Arc<Listing> {
        self.state().listing.clone()
    }

    /// A connection came up: it is the current one, the last error is void,
    /// the epoch moves on, and (`restarted_at`, the hub's restart count
    /// after this one) a lost connection is counted.
    pub(super) fn connected(&self, live: Arc<Live>, connect_ms: f64, restarted_at: Option<u64>) {
        let mut s = self.state_mut();
        s.live = Some(live);
        s.error = None;
        s.epoch += 1;
        s.connect_ms = connect_ms;
        if let Some(at) = restarted_at {
            s.restarts += 1;
            s.restarted_at = at;
        }
    }

    /// Stores a listing made over `live`, if `live` is still the current
    /// connection (a listing of a connection replaced meanwhile is stale),
    /// with the time it took when it is the listing of a new connection.
    /// Returns whether it was stored.
    pub(super) fn listed(&self, live: &Arc<Live>, listing: Listing, list_ms: Option<f64>) -> bool {
        let mut s = self.state_mut();
        if !s.live.as_ref().is_some_and(|current| Arc::ptr_eq(current, live)) {
            return false;
        }
        s.listing = Arc::new(listing);
        if let Some(ms) = list_ms {
            s.list_ms = ms;
        }
        true
    }

    /// A connection attempt failed, for this reason.
    pub(super) fn failed(&self, error: String) {
        self.state_mut().error = Some(error);
    }

    /// Takes the current connection out, to end it; `closing` also records
    /// that the hub closed it (unless an earlier failure explains more).
    pub(super) fn take_live(&self, closing: bool) -> Option<Arc<Live>> {
        let mut s = self.state_mut();
        if closing {
            s.error.get_or_insert_with(|| "closed".into());
        }
        s.live.take()
    }
}

/// Reconnection backoff: 250 ms after the first failure, doubling, at most 30 s.
#[derive(Default)]
pub(super) struct Backoff {
    pub(super) failures: u32,
    pub(super) next_try: Option<tokio::time::Instant>,
}

impl Backoff {
    pub(super) fn failed(&mut self) {
        self.failures += 1;
        let delay = Duration::from_millis(250u64.saturating_mul(1 << self.failures.min(7).saturating_sub(1)));
        self.next_try = Some(tokio::time::Instant::now() + delay.min(Duration::from_secs(30)));
    }
}

pub(super) async fn lock_backoff(s: &Server) -> tokio::sync::MutexGuard<'_, Backoff> {
    s.restart.lock().await
}
