//! Resource changes on 2026-07-28 servers: `subscriptions/listen`.
//!
//! That revision has no `resources/subscribe`: a client opens one
//! long-lived `subscriptions/listen` request naming every URI it wants
//! updates for (and whether it wants `list_changed`), and the server sends
//! the notifications on it. rmcp routes them to the [`Subscription`] and
//! **not** to the `ClientHandler` callbacks, so the pump here turns them
//! into exactly the hub events the 2025 callbacks produce (`Updated` for the
//! cache, a re-list request for `list_changed`): the cache invalidates the
//! same way on both revisions.
//!
//! One listener per connection. To add URIs it opens a new `listen` with the
//! whole set, waits for the server's acknowledgment, and only then drops the
//! old one (which sends `notifications/cancelled`), so there is no moment
//! without a subscription. Requests that arrive while a `listen` is being
//! opened wait for it, and the next one covers all of them: a burst of cache
//! fills costs one or two `listen` round trips, not one per URI.
//!
//! A subscription that ends while the connection is up (the server ended it,
//! or notifications were lost) is treated as "anything may have changed":
//! every covered URI is reported updated and the server re-listed, and a new
//! `listen` is opened. A lost connection needs nothing here: the hub's
//! reconnection starts a new listener, and the cache voids what lived by the
//! old connection (its epoch).

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::RoleClient;
use rmcp::model::{ServerNotification, SubscriptionFilter};
use rmcp::service::{Peer, ServiceError, Subscription};
use tokio::sync::broadcast;

use super::HubEvent;

/// The `subscriptions/listen` side of one 2026-07-28 connection.
pub(super) struct Listener {
    inner: Arc<Inner>,
}

struct Inner {
    peer: Peer<RoleClient>,
    server: Arc<str>,
    events: broadcast::Sender<HubEvent>,
    relist: tokio::sync::mpsc::UnboundedSender<Arc<str>>,
    /// The server announced `listChanged`: always ask for it.
    list_changed: bool,
    /// The server announced `subscribe`: ask for URIs.
    subscribe: bool,
    timeout: Duration,
    /// Every URI asked for on this connection.
    wanted: StdMutex<BTreeSet<String>>,
    /// The URIs the current subscription's acknowledgment accepted.
    covered: StdMutex<HashSet<String>>,
    /// The task reading the current subscription; held while a new one is
    /// opened, so that openings do not overlap.
    pump: tokio::sync::Mutex<Option<AbortOnDrop>>,
}

/// A spawned task that ends when its handle is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);
impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn lock<T>(m: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the connection knows that a listener needs.
pub(super) struct ListenerConfig {
    pub(super) peer: Peer<RoleClient>,
    pub(super) server: Arc<str>,
    pub(super) events: broadcast::Sender<HubEvent>,
    pub(super) relist: tokio::sync::mpsc::UnboundedSender<Arc<str>>,
    pub(super) list_changed: bool,
    pub(super) subscribe: bool,
    pub(super) timeout: Duration,
}

impl Listener {
    pub(super) fn new(c: ListenerConfig) -> Listener {
        Listener {
            inner: Arc::new(Inner {
                peer: c.peer,
                server: c.server,
                events: c.events,
                relist: c.relist,
                list_changed: c.list_changed,
                subscribe: c.subscribe,
                timeout: c.timeout,
                wanted: StdMutex::default(),
                covered: StdMutex::default(),
                pump: tokio::sync::Mutex::new(None),
            }),
        }
    }

    /// Whether the server announced anything to listen for.
    pub(super) fn useful(&self) -> bool {
        self.inner.list_changed || self.inner.subscribe
    }

    /// Starts listening for `list_changed` (right after connecting).
    pub(super) async fn start(&self) -> Result<(), ServiceError> {
        self.inner.ensure(None).await.map(|_| ())
    }

    /// Makes sure updates of `uri` are pushed; whether the server accepted it.
    pub(super) async fn add(&self, uri: &str) -> Result<bool, ServiceError> {
        if !self.inner.subscribe {
            return Ok(false);
        }
        self.inner.ensure(Some(uri)).await
    }
}

impl Inner {
    /// Boxed: it spawns the pump, which may call it again (a recursive
    /// future type otherwise).
    fn ensure<'a>(self: &'a Arc<Self>, uri: Option<&'a str>) -> BoxFuture<'a, Result<bool, ServiceError>> {
        Box::pin(self.ensure_inner(uri))
    }

    async fn ensure_inner(self: &Arc<Self>, uri: Option<&str>) -> Result<bool, ServiceError> {
        if let Some(u) = uri {
            lock(&self.wanted).insert(u.to_owned());
        }
        let mut pump = self.pump.lock().await;
        if let Some(u) = uri
            && lock(&self.covered).contains(u)
        {
            return Ok(true); // a listen opened while we waited covers it
        }
        let wanted: Vec<String> = lock(&self.wanted).iter().cloned().collect();
        let mut filter = SubscriptionFilter::builder();
        if self.list_changed {
            filter = filter.resources_list_changed();
        }
        if self.subscribe && !wanted.is_empty() {
            filter = filter.resource_subscriptions(wanted);
        }
        let sub = match tokio::time::timeout(self.timeout, self.peer.listen(filter.build())).await {
            Err(_) => return Err(ServiceError::Timeout { timeout: self.timeout }),
            Ok(r) => r?,
        };
        let accepted: HashSet<String> = sub.acknowledged().resource_subscriptions.iter().flatten().cloned().collect();
        let ok = uri.is_none_or(|u| accepted.contains(u));
        tracing::debug!(server = %self.server, uris = accepted.len(), "subscriptions/listen acknowledged");
        *lock(&self.covered) = accepted;
        // The old subscription is dropped (cancelled) only now.
        *pump = Some(AbortOnDrop(tokio::spawn(pump_loop(Arc::downgrade(self), sub))));
        Ok(ok)
    }
}

/// Turns one subscription's notifications into hub events until it ends.
/// Holds the listener weakly: the connection's end ends it.
async fn pump_loop(inner: Weak<Inner>, mut sub: Subscription) {
    loop {
        let next = sub.next().await;
        let Some(me) = inner.upgrade() else { return };
        match next {
            Ok(Some(ServerNotification::ResourceUpdatedNotification(n))) => {
                let _ = me.events.send(HubEvent::Updated { server: me.server.to_string(), uri: n.params.uri });
            }
            Ok(Some(ServerNotification::ResourceListChangedNotification(_))) => {
                let _ = me.relist.send(me.server.clone());
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                if me.peer.is_transport_closed() {
                    return; // reconnection starts over
                }
                tracing::warn!(server = %me.server, end = ?sub.end(), "subscriptions/listen ended; listening again");
                // Whatever changed meanwhile was not heard: void it all.
                let covered: Vec<String> = std::mem::take(&mut *lock(&me.covered)).into_iter().collect();
                for uri in covered {
                    let _ = me.events.send(HubEvent::Updated { server: me.server.to_string(), uri });
                }
                if me.list_changed {
                    let _ = me.relist.send(me.server.clone());
                }
                // Not from this task: ensure() replaces (aborts) the pump.
                // A pause, so a server that ends every listen at once is
                // not asked again in a tight loop.
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    if let Err(e) = me.ensure(None).await {
                        tracing::warn!(server = %me.server, error = %e, "cannot listen again");
                    }
                });
                return;
            }
        }
    }
}
