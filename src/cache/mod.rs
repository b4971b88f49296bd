//! The content cache: read contents by `(server, uri)`, kept correct.
//!
//! - Servers that support `resources/subscribe` get a subscription for every
//!   cached resource; an entry read after its subscription was acknowledged
//!   lives until `notifications/resources/updated` drops it (or a
//!   `list_changed` re-list shows the resource is gone). The first entry,
//!   read before the subscription was in place, lives `cache_ttl_ms` only: a
//!   change in between is notified to nobody.
//! - Other servers' entries expire after `cache_ttl_ms`; `cache: false`
//!   disables caching for a server.
//! - Server hints win: a read result's `ttlMs` bounds the entry's life, and a
//!   `private` entry is stored under the requesting user and never served to
//!   another.
//! - Private entries are bounded in bytes, all users together
//!   (`cache.private_max_bytes`, approximate: see [`entry_bytes`]): past the
//!   bound the least recently used go, and expired ones are swept then and
//!   every [`SWEEP_EVERY`] (those of `serve_stale` servers stay, as the
//!   fallback they are, until the bound takes them). Shared entries are one
//!   per listed resource, bounded by the listings.
//! - A read that races with an invalidation is not stored (a generation
//!   counter per resource), so an update is never lost.
//! - Concurrent requests for the same cold resource share one read
//!   (single-flight).
//! - `serve_stale: true` lets a failed re-read fall back to the last good
//!   content, marked stale in the report.
//! - With `cache: { backend: redis }`, a local miss looks in Redis before
//!   reading from the server, and what this replica learns of a change is
//!   passed on to every other replica ([`shared`]).
//!
//! Layer: sources, above the hub. Imports `hub`, `config` and the bottom (`report`, `error`, `cause`, `id`,
//! `lru`, `resource`).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::hub::{Hub, HubEvent};
use crate::id::ResourceId;
use crate::resource::Contents;

mod state;
use state::{Flight, State, Subscribed, bump_all, invalidate, on_remote};

#[cfg(feature = "redis")]
mod shared;
#[cfg(feature = "redis")]
pub(crate) use shared::ping as ping_redis;
#[cfg(feature = "redis")]
use shared::{Remote, SharedCache};

/// Without the `redis` feature there is no shared layer: an uninhabited
/// stand-in keeps the code paths the same.
#[cfg(not(feature = "redis"))]
enum SharedCache {}

#[cfg(not(feature = "redis"))]
#[derive(Debug)]
enum Remote {}

#[cfg(not(feature = "redis"))]
impl SharedCache {
    async fn invalidate(&self, _: &str, _: &str) {
        match *self {}
    }
    async fn forget_server(&self, _: &str) {
        match *self {}
    }
}

/// The warm answers for a set of ids, and what they stay valid under.
pub(crate) struct Hits {
    /// `None` where a read is needed.
    pub reads: Vec<Option<CachedRead>>,
    /// The cache's version when they were looked up ([`ContentCache::version`]).
    pub version: u64,
    /// The earliest expiry among the hits (those without one live by their
    /// server's connection; see [`ContentCache::hits`]).
    pub expires: Option<Instant>,
}

/// What a read through the cache returns.
#[derive(Debug, Clone)]
pub(crate) struct CachedRead {
    pub(crate) contents: Arc<Contents>,
    /// The last good content, served because a re-read failed.
    pub(crate) stale: bool,
    pub(crate) origin: Origin,
}

/// Where a read's contents came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// This process: its cache, or a read of the server that no other
    /// replica shares.
    Local,
    /// The server, through the shared layer: the answer was offered to the
    /// other replicas (stored in Redis if it could be).
    Offered,
    /// The shared cache: another replica's read.
    Shared,
}

/// The cached answers for one resource: the shared one, and `private`
/// ones per user (looked up by `&str`, so a warm hit allocates nothing).
/// The private map is boxed: most resources never have one, and an inline
/// map would add 40 bytes to every slot of the table.
#[derive(Default)]
struct Slot {
    shared: Option<Entry>,
    #[expect(clippy::box_collection, reason = "boxed for the slot's size, not to put the map on the heap")]
    private: Option<Box<HashMap<String, Entry>>>,
}

impl Slot {
    fn for_user(&self, user: &str) -> Option<&Entry> {
        self.private.as_ref().and_then(|p| p.get(user)).or(self.shared.as_ref())
    }

    fn private_len(&self) -> usize {
        self.private.as_ref().map_or(0, |p| p.len())
    }

    fn private_bytes(&self) -> usize {
        self.private.as_ref().map_or(0, |p| p.values().map(|e| e.bytes).sum())
    }

    fn is_empty(&self) -> bool {
        self.shared.is_none() && self.private_len() == 0
    }
}

struct Entry {
    contents: Arc<Contents>,
    /// `None`: lives as long as its subscription (`subscribed`).
    expires: Option<Instant>,
    epoch: u64,
    /// Kept correct by a subscription on the connection of `epoch` (in place
    /// or being placed): stale once that connection is gone, whatever
    /// `expires` says.
    subscribed: bool,
    /// Approximate bytes kept ([`entry_bytes`]; counted for private entries).
    bytes: usize,
    /// Use tick of the last hit ([`State::clock`]): least recently used go first.
    used: AtomicU64,
}

/// How often expired private entries are swept when nothing else does it.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Approximate bytes a private entry keeps: the capacity of its texts and
/// MIME types, the user name it is stored under, and
/// [`ITEM_OVERHEAD`](crate::lru::ITEM_OVERHEAD) for the entry and each part.
pub(crate) fn entry_bytes(contents: &Contents, user: &str) -> usize {
    crate::lru::contents_bytes(contents) + user.len()
}

pub(crate) struct ContentCache {
    hub: Hub,
    state: Arc<Mutex<State>>,
    settings: HashMap<String, (bool, Duration, bool)>,
    shared: Option<Arc<SharedCache>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for ContentCache {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

impl ContentCache {
    pub(crate) fn new(hub: Hub, config: &Config) -> Self {
        let state = Arc::new(Mutex::new(State {
            private_max: config.cache.private_max_bytes,
            keep_expired: config.servers.iter().filter(|s| s.serve_stale).map(|s| s.name.clone()).collect(),
            ..State::default()
        }));
        let settings = config.servers.iter().map(|s| (s.name.clone(), (s.cache, s.cache_ttl, s.serve_stale))).collect();
        let mut events = hub.events();
        let weak = Arc::downgrade(&state);
        let hub2 = hub.clone();
        let (remote_tx, mut remote) = tokio::sync::mpsc::unbounded_channel::<Remote>();
        let shared = Self::shared(config, remote_tx);
        let shared2 = shared.clone();
        let task = tokio::spawn(async move {
            let mut sweep = tokio::time::interval(SWEEP_EVERY);
            sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let got = tokio::select! {
                    ev = events.recv() => ev,
                    _ = sweep.tick() => {
                        let Some(state) = weak.upgrade() else { return };
                        lock(&state).sweep(Instant::now());
                        continue;
                    }
                    Some(r) = remote.recv() => {
                        if let Some(state) = weak.upgrade() {
                            on_remote(&mut lock(&state), r);
                        }
                        continue;
                    }
                };
                let ev = match got {
                    Ok(ev) => ev,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        // We missed notifications: the only safe answer is to forget everything.
                        if let Some(s) = weak.upgrade() {
                            let mut s = lock(&s);
                            s.clear();
                            bump_all(&mut s);
                        }
                        continue;
                    }
                    Err(_) => return,
                };
                let Some(state) = weak.upgrade() else { return };
                let mut s = lock(&state);
                match ev {
                    HubEvent::Updated { server, uri } => {
                        let id = ResourceId::from_listing(&server, &uri);
                        invalidate(&mut s, &id);
                        if let Some(sh) = shared2.clone() {
                            tokio::spawn(async move { sh.invalidate(&server, &uri).await });
                        }
                    }
                    // Entries and subscriptions of the old connection are already
                    // void by their epoch; this just frees the memory.
                    HubEvent::Restarted { server } => {
                        let epoch = hub2.connection(&server).epoch;
                        let keep = |e: &Entry| !e.subscribed || e.epoch == epoch;
                        let mut freed = 0;
                        for (_, slot) in s.entries.iter_mut().filter(|(id, _)| id.server == server) {
                            slot.shared = slot.shared.take().filter(keep);
                            if let Some(p) = &mut slot.private {
                                p.retain(|_, e| {
                                    let kept = keep(e);
                                    if !kept {
                                        freed += e.bytes;
                                    }
                                    kept
                                });
                            }
                        }
                        s.private_bytes -= freed;
                        s.entries.retain(|_, slot| !slot.is_empty());
                        s.version += 1;
                        s.subscribed.retain(|id, e| id.server != server || e.epoch == epoch);
                        if let Some(sh) = shared2.clone() {
                            tokio::spawn(async move { sh.forget_server(&server).await });
                        }
                    }
                    HubEvent::ListChanged { server } => {
                        let listed: std::collections::HashSet<String> =
                            hub2.resources().into_iter().filter(|r| r.id.server == server).map(|r| r.id.uri).collect();
                        let gone: Vec<ResourceId> = s
                            .entries
                            .keys()
                            .filter(|id| id.server == server && !listed.contains(&id.uri))
                            .cloned()
                            .collect();
                        for id in gone {
                            invalidate(&mut s, &id);
                            s.subscribed.remove(&id);
                            if let Some(sh) = shared2.clone() {
                                tokio::spawn(async move { sh.invalidate(&id.server, &id.uri).await });
                            }
                        }
                    }
                }
            }
        });
        Self { hub, state, settings, shared, task: Some(task) }
    }

    /// The shared layer, when the config asks for one (and this build has it).
    #[cfg(feature = "redis")]
    fn shared(config: &Config, remote: tokio::sync::mpsc::UnboundedSender<Remote>) -> Option<Arc<SharedCache>> {
        if config.cache.backend != crate::config::CacheBackend::Redis {
            return None;
        }
        SharedCache::start(config, remote)
            .inspect_err(|e| tracing::error!(target: "mcp_context::cache", "shared cache not used: {e}"))
            .ok()
    }

    #[cfg(not(feature = "redis"))]
    fn shared(_: &Config, _: tokio::sync::mpsc::UnboundedSender<Remote>) -> Option<Arc<SharedCache>> {
        None
    }

    /// The shared cache's state (`None` with the memory backend).
    pub(crate) fn shared_status(&self) -> Option<crate::report::SharedCacheStatus> {
        #[cfg(feature = "redis")]
        return self.shared.as_ref().map(|s| s.status());
        #[cfg(not(feature = "redis"))]
        return self.shared.as_ref().map(|s| match **s {});
    }

    /// Derived-data records (`context::derived`) kept in the shared cache
    /// next to these resources' contents, read as `user` (`true`: the
    /// contents are private); `None` where there is none, or no shared cache.
    #[cfg(feature = "redis")]
    pub(crate) async fn derived(&self, wanted: &[(&ResourceId, bool)], user: &str, name: &str) -> Vec<Option<Vec<u8>>> {
        match &self.shared {
            Some(sh) => sh.derived(wanted, user, name).await,
            None => vec![None; wanted.len()],
        }
    }

    /// Stores derived-data records next to their contents in the shared
    /// cache, in the background (a request never waits for it).
    #[cfg(feature = "redis")]
    pub(crate) fn store_derived(&self, records: Vec<(ResourceId, bool, Vec<u8>)>, user: String, name: String) {
        if let Some(sh) = self.shared.clone()
            && !records.is_empty()
        {
            tokio::spawn(async move { sh.store_derived(&records, &user, &name).await });
        }
    }

    /// Counts records another replica computed that this one used.
    #[cfg(feature = "redis")]
    pub(crate) fn derived_used(&self, n: usize) {
        if let Some(sh) = &self.shared {
            sh.derived_used(n);
        }
    }

    /// Number of cached entries (shared and private).
    pub(crate) fn len(&self) -> usize {
        lock(&self.state).entries.values().map(|s| usize::from(s.shared.is_some()) + s.private_len()).sum()
    }

    /// The fresh cached answers for these ids, under one lock and without
    /// awaiting: the warm path of a request. The same lookup gives the same
    /// answers while [`ContentCache::version`] is unchanged, `expires` has
    /// not passed, and the connection epoch of each server whose entries
    /// live by their subscription is unchanged (read it before calling).
    pub(crate) fn hits<'a>(&self, ids: impl Iterator<Item = &'a ResourceId>, user: &str) -> Hits {
        let now = Instant::now();
        let s = lock(&self.state);
        let mut expires: Option<Instant> = None;
        let reads = ids
            .map(|id| {
                let (enabled, _, _) = self.settings.get(&id.server).copied()?;
                if !enabled {
                    return None;
                }
                let e = s.entries.get(id)?.for_user(user)?;
                if !self.fresh(e, &id.server, now) {
                    return None;
                }
                e.used.store(s.tick(), Ordering::Relaxed);
                if let Some(t) = e.expires {
                    expires = Some(expires.map_or(t, |x| x.min(t)));
                }
                Some(CachedRead { contents: e.contents.clone(), stale: false, origin: Origin::Local })
            })
            .collect();
        Hits { reads, version: s.version, expires }
    }

    /// Changes whenever an entry is stored, dropped or expires by an event.
    pub(crate) fn version(&self) -> u64 {
        lock(&self.state).version
    }

    /// Reads one resource through the cache.
    pub(crate) async fn read(&self, id: &ResourceId, user: &str) -> Result<CachedRead> {
        let (enabled, ttl, serve_stale) =
            self.settings.get(&id.server).copied().unwrap_or((false, Duration::ZERO, false));
        let now = Instant::now();
        let (flight, initiator, stale_candidate) = {
            let mut s = lock(&self.state);
            let slot = s.entries.get(id);
            if enabled
                && let Some(e) = slot.and_then(|slot| slot.for_user(user)).filter(|e| self.fresh(e, &id.server, now))
            {
                e.used.store(s.tick(), Ordering::Relaxed);
                return Ok(CachedRead { contents: e.contents.clone(), stale: false, origin: Origin::Local });
            }
            let stale =
                if serve_stale { slot.and_then(|slot| slot.for_user(user)).map(|e| e.contents.clone()) } else { None };
            let (flight, initiator) = match s.inflight.get(id) {
                Some((f, who)) => (f.clone(), who.clone()),
                None => {
                    let f = self.start_read(&mut s, id.clone(), user.to_owned(), enabled, ttl);
                    s.inflight.insert(id.clone(), (f.clone(), user.to_owned()));
                    (f, user.to_owned())
                }
            };
            (flight, initiator, stale)
        };
        // A failed read serves the last good content where allowed.
        let or_stale = |e: Error| match stale_candidate {
            Some(contents) => Ok(CachedRead { contents, stale: true, origin: Origin::Local }),
            None => Err(e),
        };
        match flight.await {
            // A private answer is its initiator's only: anyone else who
            // joined the flight reads for themselves (not cached for them
            // here; their next request caches its own).
            Ok((c, _)) if c.private && initiator != user => match self.hub.read(id).await {
                Ok(own) => Ok(CachedRead { contents: Arc::new(own), stale: false, origin: Origin::Local }),
                Err(e) => or_stale(e),
            },
            Ok((c, origin)) => Ok(CachedRead { contents: c, stale: false, origin }),
            Err(e) => or_stale(e),
        }
    }

    /// Whether an entry may still be served: not expired, and if it lives by
    /// a subscription, that died with the connection: then it must be read
    /// again (which also restarts the server).
    fn fresh(&self, e: &Entry, server: &str, now: Instant) -> bool {
        let alive = || {
            let c = self.hub.connection(server);
            c.up && c.epoch == e.epoch
        };
        e.expires.is_none_or(|t| t > now) && (!e.subscribed || alive())
    }

    fn start_read(&self, s: &mut State, id: ResourceId, user: String, enabled: bool, ttl: Duration) -> Flight {
        let generation = s.generation.get(&id).copied().unwrap_or(0);
        let hub = self.hub.clone();
        let state = self.state.clone();
        let shared = if enabled { self.shared.clone() } else { None };
        async move {
            let started = Instant::now();
            let (result, remaining) = match &shared {
                None => (hub.read(&id).await, None),
                Some(sh) => read_shared(sh, &hub, &id, &user, ttl).await,
            };
            let mut s = lock(&state);
            s.inflight.remove(&id);
            let contents = Arc::new(result?);
            let current = s.generation.get(&id).copied().unwrap_or(0) == generation;
            let hint_ttl = contents.ttl_ms.map(Duration::from_millis);
            let cacheable = enabled && current && hint_ttl != Some(Duration::ZERO);
            let connection = hub.connection(&id.server);
            let epoch = connection.epoch;
            let sub = s.subscribed.get(&id).filter(|x| x.epoch == epoch).copied();
            // An entry lives by its subscription alone only when that was
            // acknowledged before this read began. A change between a read
            // and the acknowledgement is notified to nobody, so an entry read
            // earlier lives `ttl`, and the read that replaces it is covered.
            let covered = sub.and_then(|x| x.since).is_some_and(|t| t <= started);
            let subscribe = cacheable && sub.is_none() && connection.subscribe;
            if cacheable {
                let life = hint_ttl.or(if covered { None } else { Some(ttl) });
                // A copy of a shared entry never outlives it.
                let life = match (life, remaining) {
                    (Some(l), Some(r)) => Some(l.min(r)),
                    (l, _) => l,
                };
                let now = Instant::now();
                let bytes = if contents.private { entry_bytes(&contents, &user) } else { 0 };
                let used = AtomicU64::new(s.tick());
                let subscribed = hint_ttl.is_none() && (sub.is_some() || subscribe);
                let expires = life.map(|l| now + l);
                let entry = Entry { contents: contents.clone(), expires, epoch, subscribed, bytes, used };
                s.version += 1;
                if contents.private {
                    s.store_private(&id, user, entry, now);
                } else {
                    s.entries.entry(id.clone()).or_default().shared = Some(entry);
                }
            }
            if subscribe {
                s.subscribed.insert(id.clone(), Subscribed { epoch, since: None });
                drop(s);
                let hub = hub.clone();
                let state = state.clone();
                tokio::spawn(async move {
                    let placed = matches!(hub.subscribe(&id).await, Ok(true));
                    let mut s = lock(&state);
                    if placed {
                        if let Some(x) = s.subscribed.get_mut(&id).filter(|x| x.epoch == epoch) {
                            x.since = Some(Instant::now());
                        }
                    } else {
                        // Without a subscription the entry must not live forever.
                        s.subscribed.remove(&id);
                        invalidate(&mut s, &id);
                    }
                });
            }
            let origin = match (&shared, remaining) {
                (None, _) => Origin::Local,
                (Some(_), None) => Origin::Offered,
                (Some(_), Some(_)) => Origin::Shared,
            };
            Ok((contents, origin))
        }
        .boxed()
        .shared()
    }
}

/// A read through the shared layer. What is stored there lives as long as
/// it would here, except that entries kept by a subscription here get the
/// shared backstop TTL (`cache.ttl_ms`) there: another replica that copies
/// one cannot know which changes it missed before it subscribed itself.
#[cfg(feature = "redis")]
async fn read_shared(
    sh: &Arc<SharedCache>,
    hub: &Hub,
    id: &ResourceId,
    user: &str,
    ttl: Duration,
) -> (Result<Contents>, Option<Duration>) {
    let notifying = hub.connection(&id.server).subscribe;
    let backstop = sh.backstop();
    let life = |c: &Contents| match c.ttl_ms {
        Some(0) => None,
        Some(ms) => Some(Duration::from_millis(ms)),
        None => Some(if notifying { backstop } else { ttl }),
    };
    let r = sh.read_through(&id.server, &id.uri, user, hub.read(id), life).await;
    (r.result, r.remaining)
}

#[cfg(not(feature = "redis"))]
async fn read_shared(
    sh: &Arc<SharedCache>,
    _: &Hub,
    _: &ResourceId,
    _: &str,
    _: Duration,
) -> (Result<Contents>, Option<Duration>) {
    match **sh {}
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests;
