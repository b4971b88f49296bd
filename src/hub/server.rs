//! The per-server state: its config, its connection, its last error and
//! listing, its timings and restarts, the limit of its reads in flight and
//! the backoff between reconnection attempts.

use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::Semaphore;

use super::connect::Live;
use super::list::Listing;
use crate::config::ServerConfig;

pub(super) struct Server {
    pub(super) cfg: ServerConfig,
    pub(super) live: RwLock<Option<Arc<Live>>>,
    pub(super) error: RwLock<Option<String>>,
    pub(super) listing: RwLock<Arc<Listing>>,
    pub(super) reads: Semaphore,
    /// (connect, list) durations of the last connection, in ms.
    pub(super) timings: RwLock<(f64, f64)>,
    /// Serialises reconnection attempts and holds their backoff.
    pub(super) restart: tokio::sync::Mutex<Backoff>,
    pub(super) restarts: AtomicU32,
    /// Bumped on every successful (re)connection.
    pub(super) epoch: AtomicU64,
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

pub(super) fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

pub(super) fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}
