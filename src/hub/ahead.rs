//! Reading ahead while servers list (issue 31): each page of a first listing
//! is offered to a decision (the caller's policy, for one user), and the
//! reads it allows start at once, while the next page is being listed.
//! Their results wait here until [`Hub::read`](super::Hub::read) asks for
//! them (once each), or until [`ReadAhead::stop`] drops and cancels them.
//!
//! Nothing is read that the decision did not allow, and the decision sees
//! each resource before any read of it: the policy still decides first, page
//! by page. Only a hub made with `Hub::connect_reading_ahead` reads ahead, and
//! only on its first listing (not on re-listings or reconnections).
//!
//! May import: the hub (its read), resource types, tokio.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;
use tokio::task::AbortHandle;

use crate::error::Result;
use crate::id::ResourceId;
use crate::resource::{Contents, Resource};

/// Which listed resources may be read before anyone asks for them.
pub(crate) type Decide = Arc<dyn Fn(&Resource) -> bool + Send + Sync>;

/// The pending reads of one hub (empty and inert unless it was made to read ahead).
#[derive(Default)]
pub(super) struct ReadAhead {
    state: Mutex<Option<State>>,
    /// False once stopped (or never started): every [`Hub::read`](super::Hub::read)
    /// asks [`ReadAhead::take`], and a hub that does not read ahead must not
    /// pay a lock for it.
    on: AtomicBool,
}

struct State {
    decide: Decide,
    pending: HashMap<ResourceId, Pending>,
}

struct Pending {
    result: oneshot::Receiver<Result<Contents>>,
    task: AbortHandle,
}

impl ReadAhead {
    pub(super) fn new(decide: Option<Decide>) -> Self {
        let on = AtomicBool::new(decide.is_some());
        Self { state: Mutex::new(decide.map(|decide| State { decide, pending: HashMap::new() })), on }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<State>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether reads are still started ahead.
    pub(super) fn active(&self) -> bool {
        self.lock().is_some()
    }

    /// Starts the reads `page` allows (each resource once), with `read`.
    pub(super) fn page<F, Fut>(&self, page: &[Arc<Resource>], read: F)
    where
        F: Fn(ResourceId) -> Fut,
        Fut: std::future::Future<Output = Result<Contents>> + Send + 'static,
    {
        let Some(decide) = self.lock().as_ref().map(|s| s.decide.clone()) else { return };
        // The decision runs outside the lock: it is the caller's code.
        let allowed: Vec<&Arc<Resource>> = page.iter().filter(|r| decide(r)).collect();
        let mut guard = self.lock();
        let Some(state) = guard.as_mut() else { return };
        for r in allowed {
            if state.pending.contains_key(&r.id) {
                continue;
            }
            let (tx, rx) = oneshot::channel();
            let fut = read(r.id.clone());
            let task = tokio::spawn(async move {
                let _ = tx.send(fut.await);
            });
            state.pending.insert(r.id.clone(), Pending { result: rx, task: task.abort_handle() });
        }
    }

    /// The read started ahead for `id`, if any (each is handed out once).
    pub(super) fn take(&self, id: &ResourceId) -> Option<oneshot::Receiver<Result<Contents>>> {
        if !self.on.load(Ordering::Acquire) {
            return None;
        }
        self.lock().as_mut()?.pending.remove(id).map(|p| p.result)
    }

    /// Ends reading ahead: no more reads start, and those nobody took are
    /// cancelled (their servers are told) and their results dropped.
    pub(super) fn stop(&self) {
        self.on.store(false, Ordering::Release);
        if let Some(state) = self.lock().take() {
            for p in state.pending.into_values() {
                p.task.abort();
            }
        }
    }

    /// Reads started ahead and not yet taken.
    pub(super) fn pending(&self) -> usize {
        self.lock().as_ref().map_or(0, |s| s.pending.len())
    }
}
