//! Per-(server, user) exclusion for the token flows, never shared by
//! unrelated users (issue 47, item 3):
//!
//! - [`KeyedLocks`]: one lock per (server, user), so that a rotated refresh
//!   token is not used twice; a user waits only for their own refresh of
//!   that server, never for another user's or another server's (the striped
//!   locks this replaces let a chosen name share alice's stripe);
//! - [`Flights`]: one preparation (refresh, token exchange) per (server,
//!   user) at a time, run as its own task: every request of that user that
//!   comes while it runs waits for the same outcome (no retry per waiter),
//!   and a request that stops waiting (its time is up) leaves it running,
//!   so an answer the authorization server did send (a rotated refresh
//!   token) is still stored.
//!
//! An entry lives only while someone holds, waits for or runs it: memory
//! follows what is in flight, not how many users there ever were.
//!
//! Layer: sources (credentials). Imports nothing of the crate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared};

type Key = (String, String);

/// One async lock per (server, user), made when first wanted and dropped
/// when nobody holds or waits for it.
#[derive(Default)]
pub(crate) struct KeyedLocks {
    map: Mutex<HashMap<Key, Arc<tokio::sync::Mutex<()>>>>,
}

/// Holds (server, user)'s lock; dropping it (or the wait for it) releases
/// the entry when it was the last one.
pub(crate) struct KeyedGuard<'a> {
    owner: &'a KeyedLocks,
    key: Key,
    lock: Arc<tokio::sync::Mutex<()>>,
    held: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl KeyedLocks {
    /// Waits for (`server`, `user`)'s lock. Cancelling the wait is safe.
    pub(crate) async fn lock(&self, server: &str, user: &str) -> KeyedGuard<'_> {
        let key = (server.to_owned(), user.to_owned());
        let lock = self.entries().entry(key.clone()).or_default().clone();
        // The guard exists before the wait, so that a wait given up still removes an entry nobody else wants.
        let mut g = KeyedGuard { owner: self, key, lock, held: None };
        g.held = Some(g.lock.clone().lock_owned().await);
        g
    }

    /// How many (server, user) locks exist now (held or waited for).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries().len()
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<Key, Arc<tokio::sync::Mutex<()>>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for KeyedGuard<'_> {
    fn drop(&mut self) {
        self.held.take();
        let mut map = self.owner.entries();
        // Only the map's reference and ours: nobody else holds or waits. New waiters clone under the map's
        // lock, so none can appear between this check and the removal.
        if Arc::strong_count(&self.lock) == 2 {
            map.remove(&self.key);
        }
    }
}

/// The outcome of a flight, as every waiter sees it (what went wrong is
/// logged by the flight itself).
pub(crate) type Outcome = std::result::Result<(), Failure>;

/// How a flight failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// It took the whole time allowed (its calls were given up): the
    /// authorization server did not answer in time.
    TimedOut,
    /// Anything else (a refusal, an unusable answer): the state the store
    /// now holds says it.
    Failed,
}

impl Failure {
    /// The failure of a flight that ran for `took` when each call may take `timeout`.
    pub(crate) fn after(took: std::time::Duration, timeout: std::time::Duration) -> Failure {
        if took >= timeout { Failure::TimedOut } else { Failure::Failed }
    }
}

/// One running task per (server, user); see the module docs.
#[derive(Default, Clone)]
pub(crate) struct Flights {
    map: Arc<Mutex<HashMap<Key, Shared<BoxFuture<'static, Outcome>>>>>,
}

impl Flights {
    /// The flight of (`server`, `user`): the running one, or `run` started
    /// as a task of its own. The entry goes when the task ends.
    pub(crate) fn join(
        &self,
        server: &str,
        user: &str,
        run: impl FnOnce() -> BoxFuture<'static, Outcome>,
    ) -> Shared<BoxFuture<'static, Outcome>> {
        let key = (server.to_owned(), user.to_owned());
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = map.get(&key) {
            return f.clone();
        }
        let work = run();
        let (map_ref, k) = (self.map.clone(), key.clone());
        let task = tokio::spawn(async move {
            let out = work.await;
            map_ref.lock().unwrap_or_else(|e| e.into_inner()).remove(&k);
            out
        });
        let flight = async move { task.await.unwrap_or(Err(Failure::Failed)) }.boxed().shared();
        map.insert(key, flight.clone());
        flight
    }

    /// How many flights are running.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Alice's held lock does not stop bob (same server) nor alice on
    /// another server; a wait given up and a release leave no entry behind.
    #[tokio::test]
    async fn locks_are_per_server_and_user_and_go_when_unused() {
        let locks = KeyedLocks::default();
        let held = locks.lock("drive", "alice").await;
        for (s, u) in [("drive", "bob"), ("jira", "alice")] {
            let other = tokio::time::timeout(Duration::from_millis(100), locks.lock(s, u)).await;
            assert!(other.is_ok(), "{s}/{u} waited for drive/alice");
        }
        let waited = tokio::time::timeout(Duration::from_millis(50), locks.lock("drive", "alice")).await;
        assert!(waited.is_err(), "the same (server, user) waits");
        assert_eq!(locks.len(), 1, "only the held one is kept");
        drop(held);
        assert_eq!(locks.len(), 0);
    }

    /// Waiters of one (server, user) share one run; a waiter that gives up
    /// leaves it running to the end; the entry then goes.
    #[tokio::test]
    async fn one_flight_per_key_runs_to_the_end() {
        let flights = Flights::default();
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let rx = Arc::new(Mutex::new(Some(rx)));
        let start = || {
            let (runs, rx) = (runs.clone(), rx.clone());
            move || -> BoxFuture<'static, Outcome> {
                runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let rx = rx.lock().unwrap().take();
                async move {
                    if let Some(rx) = rx {
                        let _ = rx.await;
                    }
                    Ok(())
                }
                .boxed()
            }
        };
        let first = flights.join("drive", "alice", start());
        let second = flights.join("drive", "alice", start());
        assert!(tokio::time::timeout(Duration::from_millis(50), first).await.is_err(), "gave up waiting");
        assert_eq!(flights.len(), 1, "still running");
        tx.send(()).unwrap();
        assert_eq!(second.await, Ok(()));
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(flights.len(), 0);
    }
}
