//! The local cache's state behind its one lock: entries, generations,
//! reads in flight, subscriptions, the private entries' byte count; and the
//! changes another replica announces.

use super::*;

/// A read in flight: the contents, and where they came from.
pub(super) type Flight = Shared<BoxFuture<'static, std::result::Result<(Arc<Contents>, Origin), Error>>>;

#[derive(Default)]
pub(super) struct State {
    pub(super) entries: HashMap<ResourceId, Slot>,
    /// Bumped on every change to `entries` (a store, an invalidation, a
    /// prune): what was built from a set of hits is still right while this
    /// is unchanged and none of those hits has expired (see [`Hits`]).
    pub(super) version: u64,
    /// Bumped on every invalidation of an id; a read only stores its result
    /// if the generation it started with is still current.
    pub(super) generation: HashMap<ResourceId, u64>,
    /// Reads in flight, with the user who started each: a `private` answer
    /// is that user's only, and other waiters read again for themselves.
    pub(super) inflight: HashMap<ResourceId, (Flight, String)>,
    /// Subscribed ids (and those being subscribed).
    pub(super) subscribed: HashMap<ResourceId, Subscribed>,
    /// Bytes of the private entries ([`entry_bytes`]), all users together.
    pub(super) private_bytes: usize,
    /// `cache.private_max_bytes`.
    pub(super) private_max: usize,
    /// Servers with `serve_stale`: their expired private entries are the
    /// fallback for a failed re-read, so only the byte bound drops them.
    pub(super) keep_expired: HashSet<String>,
    /// Use ticks for [`Entry::used`].
    pub(super) clock: AtomicU64,
}

/// A subscription: the connection epoch it lives on, and when it was
/// acknowledged (`None` while the request is in flight).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Subscribed {
    pub(super) epoch: u64,
    pub(super) since: Option<Instant>,
}

impl State {
    pub(super) fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// Stores a private entry for `user`, then brings the private entries
    /// back under their bound. An entry larger than the bound is not kept.
    pub(super) fn store_private(&mut self, id: &ResourceId, user: String, entry: Entry, now: Instant) {
        if entry.bytes > self.private_max {
            return;
        }
        self.private_bytes += entry.bytes;
        let slot = self.entries.entry(id.clone()).or_default();
        if let Some(old) = slot.private.get_or_insert_default().insert(user, entry) {
            self.private_bytes -= old.bytes;
        }
        if self.private_bytes > self.private_max {
            self.sweep(now);
        }
    }

    /// Drops expired private entries, then, while over the bound, the least
    /// recently used down to [`low_water`](crate::lru::low_water) of it.
    pub(super) fn sweep(&mut self, now: Instant) {
        let before = self.private_bytes;
        let keep_expired = &self.keep_expired;
        let mut freed = 0;
        for (id, slot) in &mut self.entries {
            if let Some(p) = &mut slot.private
                && !keep_expired.contains(&id.server)
            {
                p.retain(|_, e| {
                    let live = e.expires.is_none_or(|t| t > now);
                    if !live {
                        freed += e.bytes;
                    }
                    live
                });
            }
        }
        self.private_bytes -= freed;
        if self.private_bytes > self.private_max {
            let excess = self.private_bytes - crate::lru::low_water(self.private_max);
            let items = self.entries.iter().flat_map(|(id, slot)| {
                slot.private.iter().flat_map(move |p| {
                    p.iter().map(move |(user, e)| (e.used.load(Ordering::Relaxed), e.bytes, (id, user.as_str())))
                })
            });
            let gone: Vec<(ResourceId, String)> =
                crate::lru::oldest(items, excess).into_iter().map(|(id, user)| (id.clone(), user.to_owned())).collect();
            for (id, user) in gone {
                if let Some(e) =
                    self.entries.get_mut(&id).and_then(|s| s.private.as_mut()).and_then(|p| p.remove(&user))
                {
                    self.private_bytes -= e.bytes;
                }
            }
        }
        if self.private_bytes != before {
            for slot in self.entries.values_mut() {
                if slot.private.as_ref().is_some_and(|p| p.is_empty()) {
                    slot.private = None;
                }
            }
            self.entries.retain(|_, slot| !slot.is_empty());
            self.version += 1;
        }
    }

    /// Removes every entry of `id`.
    pub(super) fn remove(&mut self, id: &ResourceId) {
        if let Some(slot) = self.entries.remove(id) {
            self.private_bytes -= slot.private_bytes();
        }
    }

    /// Removes every entry.
    pub(super) fn clear(&mut self) {
        self.entries.clear();
        self.private_bytes = 0;
    }
}

/// What another replica told us.
pub(super) fn on_remote(s: &mut State, r: Remote) {
    #[cfg(feature = "redis")]
    match r {
        Remote::Invalidate { server, uri } => invalidate(s, &ResourceId::from_listing(&server, &uri)),
        Remote::Resync => {
            s.clear();
            bump_all(s);
        }
    }
    #[cfg(not(feature = "redis"))]
    {
        let _ = s;
        match r {}
    }
}

pub(super) fn invalidate(s: &mut State, id: &ResourceId) {
    s.remove(id);
    s.version += 1;
    *s.generation.entry(id.clone()).or_default() += 1;
}

pub(super) fn bump_all(s: &mut State) {
    s.version += 1;
    for g in s.generation.values_mut() {
        *g += 1;
    }
    // Reads in flight for ids without a generation yet must not store either.
    let ids: Vec<ResourceId> = s.inflight.keys().cloned().collect();
    for id in ids {
        *s.generation.entry(id).or_default() += 1;
    }
}
