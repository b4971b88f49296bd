//! Live sessions of the MCP endpoint: what each caller watches, and the
//! servers' changes turned into notifications for exactly the callers
//! concerned. A server's `list_changed` (and a restart) reaches a session
//! only when that caller's view changed (the set of URIs it may see, compared
//! by digest); `resources/updated` reaches a subscriber only while the
//! caller may see the resource, and `mcp-context://context` is updated for a
//! subscriber when a resource of its view is. Sessions of 2025-11-25 are told
//! through their peer; 2026-07-28 listeners through their subscription.
//!
//! Changes of the shared servers are watched (the hub's events); the per-user
//! servers' own views are not (yet): their listings are read afresh on every
//! request, but nothing is pushed for them.
//!
//! Imports the engine, the identity type, `uri` and rmcp's peer and sink.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, Weak};

use rmcp::RoleServer;
use rmcp::service::{Peer, SubscriptionSink};
use sha2::{Digest, Sha256};

use super::uri;
use crate::identity::Identity;
use crate::servers::HubEvent;
use crate::{ContextRequest, McpContext};

/// Where a watcher's notifications go.
#[derive(Clone)]
pub(super) enum Notifier {
    /// A 2025-11-25 session's peer.
    Peer(Peer<RoleServer>),
    /// A 2026-07-28 `subscriptions/listen` stream.
    Sink(SubscriptionSink),
}

/// One session (or listen stream) and what it watches.
pub(super) struct Watcher {
    notifier: Notifier,
    who: Identity,
    /// Digest of the URIs the caller could see when last told.
    view: Mutex<[u8; 32]>,
    /// Our URIs subscribed to.
    subscribed: Mutex<BTreeSet<String>>,
    /// Whether `list_changed` was asked for (always, for a session).
    list_changed: bool,
}

impl Watcher {
    /// Adds a subscription to one of our URIs.
    pub(super) fn subscribe(&self, ours: &str) {
        self.subscribed.lock().unwrap_or_else(|p| p.into_inner()).insert(ours.to_owned());
    }

    /// Ends a subscription.
    pub(super) fn unsubscribe(&self, ours: &str) {
        self.subscribed.lock().unwrap_or_else(|p| p.into_inner()).remove(ours);
    }

    fn watches(&self, ours: &str) -> bool {
        self.subscribed.lock().unwrap_or_else(|p| p.into_inner()).contains(ours)
    }

    fn closed(&self) -> bool {
        match &self.notifier {
            Notifier::Peer(p) => p.is_transport_closed(),
            Notifier::Sink(_) => false,
        }
    }

    async fn list_changed(&self) -> bool {
        match &self.notifier {
            Notifier::Peer(p) => p.notify_resource_list_changed().await.is_ok(),
            Notifier::Sink(s) => s.notify_resource_list_changed().await.is_ok(),
        }
    }

    async fn updated(&self, ours: &str) -> bool {
        match &self.notifier {
            Notifier::Peer(p) => {
                p.notify_resource_updated(rmcp::model::ResourceUpdatedNotificationParam::new(ours)).await.is_ok()
            }
            Notifier::Sink(s) => s.notify_resource_updated(ours).await.is_ok(),
        }
    }
}

/// Every watcher, and the task that tells them.
pub(super) struct Live {
    ctx: Arc<McpContext>,
    watchers: Mutex<Vec<Arc<Watcher>>>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Live {
    fn drop(&mut self) {
        if let Some(t) = self.task.lock().unwrap_or_else(|p| p.into_inner()).take() {
            t.abort();
        }
    }
}

/// The digest of a view: its URIs, in order.
fn digest(ids: impl Iterator<Item = String>) -> [u8; 32] {
    let mut h = Sha256::new();
    for id in ids {
        h.update((id.len() as u64).to_be_bytes());
        h.update(id.as_bytes());
    }
    h.finalize().into()
}

impl Live {
    /// The registry, watching `ctx`'s shared servers.
    pub(super) fn start(ctx: Arc<McpContext>) -> Arc<Live> {
        let live = Arc::new(Live { ctx, watchers: Mutex::default(), task: Mutex::default() });
        // Outside a runtime (a proxy built before one runs) nothing is watched.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let task = rt.spawn(watch(Arc::downgrade(&live), live.ctx.hub().events()));
            *live.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        }
        live
    }

    /// The URIs `who` may see now, as a digest.
    async fn view_digest(&self, who: &Identity) -> [u8; 32] {
        let view = self.ctx.view_of(&ContextRequest::for_user(who.user.clone()).with_identity(who)).await;
        digest(view.resources.iter().map(|r| uri::of(&r.id)))
    }

    /// Registers a session or a listen stream of `who`.
    pub(super) async fn add(&self, notifier: Notifier, who: Identity, list_changed: bool) -> Arc<Watcher> {
        let view = Mutex::new(self.view_digest(&who).await);
        let w = Arc::new(Watcher { notifier, who, view, subscribed: Mutex::default(), list_changed });
        self.watchers.lock().unwrap_or_else(|p| p.into_inner()).push(w.clone());
        w
    }

    /// Forgets a watcher (a listen stream that ended).
    pub(super) fn remove(&self, w: &Arc<Watcher>) {
        self.watchers.lock().unwrap_or_else(|p| p.into_inner()).retain(|x| !Arc::ptr_eq(x, w));
    }

    /// The watchers still open (closed sessions are dropped here).
    fn open(&self) -> Vec<Arc<Watcher>> {
        let mut all = self.watchers.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|w| !w.closed());
        all.clone()
    }

    /// A server's listing changed (or it restarted, or events were lost):
    /// each caller whose view is another now is told.
    async fn relisted(&self) {
        for w in self.open() {
            let now = self.view_digest(&w.who).await;
            let changed = std::mem::replace(&mut *w.view.lock().unwrap_or_else(|p| p.into_inner()), now) != now;
            if changed {
                if w.list_changed {
                    w.list_changed().await;
                }
                if w.watches(uri::CONTEXT) {
                    w.updated(uri::CONTEXT).await;
                }
            }
        }
    }

    /// A resource changed: its subscribers that may still see it are told,
    /// and so are the subscribers of the whole context it is part of.
    async fn updated(&self, server: &str, upstream: &str) {
        let Ok(id) = crate::ResourceId::new(server, upstream) else { return };
        let ours = uri::of(&id);
        for w in self.open() {
            let (direct, context) = (w.watches(&ours), w.watches(uri::CONTEXT));
            if !direct && !context {
                continue;
            }
            let req = ContextRequest::for_user(w.who.user.clone()).with_identity(&w.who);
            let visible = self.ctx.view_of(&req).await.resources.iter().any(|r| r.id == id);
            if !visible {
                continue;
            }
            if direct {
                w.updated(&ours).await;
            }
            if context {
                w.updated(uri::CONTEXT).await;
            }
        }
    }
}

async fn watch(live: Weak<Live>, mut events: tokio::sync::broadcast::Receiver<HubEvent>) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let event = events.recv().await;
        let Some(live) = live.upgrade() else { return };
        match event {
            Ok(HubEvent::Updated { server, uri }) => live.updated(&server, &uri).await,
            Ok(HubEvent::ListChanged { .. } | HubEvent::Restarted { .. }) | Err(RecvError::Lagged(_)) => {
                live.relisted().await
            }
            Err(RecvError::Closed) => return,
        }
    }
}
