//! What the engine remembers between requests, and when each memo is still
//! right: the selection per grant set, the last compositions, and the last
//! answer to each unchanged request (the warm path), and how much of each
//! is kept (counts; the warm memo by bytes).

use std::sync::Arc;
use std::time::Instant;

use super::ContextMessage;
use super::select::Selection;
use crate::compose::Composition;
use crate::hub::Hub;
use crate::mode::SelectMode;
use crate::policy::{DecisionKey, Policy};
use crate::report::{Excluded, Included, Report, Timings};
use crate::resource::{Contents, Resource};

/// The last few compositions, so an unchanged request (same resources,
/// same read results, same budget) does no rendering or packing at all: the
/// warm path of a host calling the LLM many times a minute. A hit is
/// verified exactly (ids, the very same `Arc`s of contents, listing
/// metadata, budget, encoding, preamble), never by hash alone, so one
/// user's message can never be served for a different set of resources.
#[derive(Default)]
pub(super) struct CompositionMemo {
    pub(super) entries: std::sync::Mutex<std::collections::VecDeque<(CompositionKey, Arc<Composed>)>>,
}

/// Compositions remembered (each holds one message, so at most this many
/// budgets' worth of text).
pub(super) const COMPOSITION_MEMO_SIZE: usize = 8;

/// A [`Composition`] as the memo keeps it: the message shared.
pub(super) struct Composed {
    pub(super) content: Option<Arc<String>>,
    pub(super) tokens: usize,
    pub(super) included: Vec<Included>,
    pub(super) dropped: Vec<Excluded>,
    /// The mode that ran (`auto` resolved).
    pub(super) mode: SelectMode,
    /// Whether the embedding model ranked too (relevance mode).
    pub(super) semantic: Option<crate::report::Semantic>,
    pub(super) warnings: Vec<String>,
    /// What is worked out from the message once, for every request that sends it.
    pub(super) derived: Arc<super::MessageDerived>,
}

impl From<Composition> for Composed {
    fn from(c: Composition) -> Self {
        Self {
            content: c.content.map(Arc::new),
            tokens: c.tokens,
            included: c.included,
            dropped: c.dropped,
            mode: SelectMode::Priority,
            semantic: c.semantic,
            warnings: Vec::new(),
            derived: Arc::default(),
        }
    }
}

/// The last selection for each set of grants (the user's own rules, their
/// roles in order, their expanded includes: a [`DecisionKey`]), at most
/// [`SELECTION_MEMO_SIZE`], valid while the hub's listing generation is
/// unchanged; cleared when the policy is replaced ([`McpContext::set_policy`]).
/// Users with the same roles share one entry, so thousands of them cost one
/// evaluation per listing.
#[derive(Default)]
pub(super) struct SelectionMemo {
    pub(super) entries: std::sync::Mutex<std::collections::HashMap<DecisionKey, MemoEntry>>,
}

/// A remembered selection: the listing generation and the policy it was made under.
pub(super) type MemoEntry = (u64, Arc<Policy>, Arc<Selection>);

/// Grant sets whose selection is remembered; past this the memo starts over.
pub(super) const SELECTION_MEMO_SIZE: usize = 64;

impl SelectionMemo {
    pub(super) fn clear(&self) {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// The remembered selection, if it was made for this listing generation
    /// under this very policy (a request racing a reload cannot leave an old
    /// policy's selection behind).
    pub(super) fn get_or(
        &self,
        key: DecisionKey,
        generation: u64,
        policy: &Arc<Policy>,
        make: impl FnOnce() -> Selection,
    ) -> Arc<Selection> {
        if let Some((g, p, sel)) = self.entries.lock().unwrap_or_else(|p| p.into_inner()).get(&key)
            && *g == generation
            && Arc::ptr_eq(p, policy)
        {
            return sel.clone();
        }
        let sel = Arc::new(make());
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= SELECTION_MEMO_SIZE && !entries.contains_key(&key) {
            entries.clear();
        }
        entries.insert(key, (generation, policy.clone(), sel.clone()));
        sel
    }
}

pub(super) struct CompositionKey {
    pub(super) encoding: &'static str,
    pub(super) preamble: String,
    pub(super) budget: usize,
    pub(super) mode: SelectMode,
    /// [`Query::key`] of the query, if any.
    pub(super) query: Option<String>,
    pub(super) selection: Arc<Selection>,
    /// Index into `selection.resources`, and what was read for it.
    pub(super) ready: Vec<(usize, Arc<Contents>)>,
}

/// What a composition is made from, borrowed: a request's inputs to look up
/// in the memo, or a stored key's (see [`CompositionKey::inputs`]).
pub(super) struct CompositionInputs<'a> {
    pub(super) encoding: &'a str,
    pub(super) preamble: &'a str,
    pub(super) budget: usize,
    pub(super) mode: SelectMode,
    pub(super) query: Option<&'a str>,
    pub(super) selection: &'a Arc<Selection>,
    pub(super) ready: &'a [(usize, Arc<Contents>)],
}

impl CompositionKey {
    pub(super) fn inputs(&self) -> CompositionInputs<'_> {
        CompositionInputs {
            encoding: self.encoding,
            preamble: &self.preamble,
            budget: self.budget,
            mode: self.mode,
            query: self.query.as_deref(),
            selection: &self.selection,
            ready: &self.ready,
        }
    }

    /// Whether this key describes exactly these inputs: the very same
    /// contents (`Arc` identity) for resources with the same id and the same
    /// listing metadata the block shows (name, title, MIME type).
    pub(super) fn matches(&self, other: &CompositionInputs<'_>) -> bool {
        let same_listing = Arc::ptr_eq(&self.selection, other.selection);
        self.encoding == other.encoding
            && self.budget == other.budget
            && self.mode == other.mode
            // Priority mode ignores the query: a new question hits the memo.
            && (self.mode == SelectMode::Priority || self.query.as_deref() == other.query)
            && self.preamble == other.preamble
            && self.ready.len() == other.ready.len()
            && self.ready.iter().zip(other.ready).all(|((ia, ca), (ib, cb))| {
                Arc::ptr_eq(ca, cb)
                    && (same_listing && ia == ib || {
                        let (a, b) = (&self.selection.resources[*ia], &other.selection.resources[*ib]);
                        a.id == b.id && a.name == b.name && a.title == b.title && a.mime_type == b.mime_type
                    })
            })
    }
}

impl CompositionMemo {
    pub(super) fn find(&self, inputs: &CompositionInputs<'_>) -> Option<Arc<Composed>> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.iter().find(|(k, _)| k.matches(inputs)).map(|(_, c)| c.clone())
    }

    pub(super) fn put(&self, key: CompositionKey, composed: Arc<Composed>) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.retain(|(k, _)| !k.matches(&key.inputs()));
        if entries.len() >= COMPOSITION_MEMO_SIZE {
            entries.pop_front();
        }
        entries.push_back((key, composed));
    }
}

/// The last answer to each unchanged request, so that the warm path of a
/// host or proxy calling the LLM many times a minute costs a few lookups,
/// whatever the number of resources: no cache lookup per resource, no
/// composition to verify, no report to copy (its exclusion list is shared).
/// Only answers built entirely from the cache (no read, no error, no stale
/// content, no explicit selection) are kept, and one is used only while
/// everything it was made from is unchanged: the policy (the same `Arc`),
/// the listing generation, the content cache's version, the connection of
/// every server it used, and no entry it used has expired. Keyed by user,
/// not by grant set: `private` cache entries are per user.
///
/// Bounded in bytes (`context.warm_memo_max_bytes`, approximate: see
/// [`WarmEntry::bytes`]): past the bound the least recently used users'
/// answers go first ([`crate::lru`]).
pub(super) struct WarmMemo {
    pub(super) entries: std::sync::Mutex<Warm>,
}

/// What the warm memo keeps, and its byte count.
#[derive(Default)]
pub(super) struct Warm {
    /// By user: the last request of each (a new question replaces the
    /// previous one's answer rather than adding a message's worth of memory).
    users: std::collections::HashMap<String, WarmSlot>,
    /// Sum of the slots' `bytes`.
    bytes: usize,
    max: usize,
    /// Use ticks for [`WarmSlot::used`].
    clock: u64,
}

struct WarmSlot {
    key: WarmKey,
    entry: WarmEntry,
    bytes: usize,
    used: u64,
}

/// What a request asks, besides its user's policy.
#[derive(PartialEq, Eq)]
pub(super) struct WarmKey {
    pub(super) user: String,
    /// The identity provider's roles: the same user with other roles from
    /// another token decides otherwise, and must not be served this answer.
    pub(super) roles: Vec<String>,
    pub(super) source: Option<crate::identity::IdentitySource>,
    pub(super) model: String,
    pub(super) budget: Option<usize>,
    pub(super) select: Option<SelectMode>,
    pub(super) query: Option<String>,
}

pub(super) struct WarmEntry {
    pub(super) policy: Arc<Policy>,
    pub(super) listing_generation: u64,
    pub(super) stamp: CacheStamp,
    pub(super) connections: Connections,
    pub(super) message: Option<ContextMessage>,
    pub(super) report: Report,
}

/// What a remembered answer is checked against: the state now.
pub(super) struct WarmCheck<'a> {
    pub(super) policy: &'a Arc<Policy>,
    pub(super) listing_generation: u64,
    pub(super) cache_version: u64,
    pub(super) hub: &'a Hub,
}

/// The content cache's state that a set of hits stays valid under.
#[derive(Clone, Copy)]
pub(super) struct CacheStamp {
    pub(super) version: u64,
    pub(super) expires: Option<Instant>,
}

/// The connection epoch of each server a selection reads from.
pub(super) struct Connections(Vec<(String, u64)>);

impl Connections {
    pub(super) fn of(hub: &Hub, selected: &[Arc<Resource>]) -> Self {
        let mut servers: Vec<(String, u64)> = Vec::new();
        for r in selected {
            if !servers.iter().any(|(s, _)| *s == r.id.server) {
                servers.push((r.id.server.clone(), hub.connection(&r.id.server).epoch));
            }
        }
        Self(servers)
    }

    /// Same connections, still up (entries without expiry live by them).
    pub(super) fn unchanged(&self, hub: &Hub) -> bool {
        self.0.iter().all(|(s, epoch)| {
            let c = hub.connection(s);
            c.up && c.epoch == *epoch
        })
    }
}

impl WarmEntry {
    /// Approximate bytes this answer keeps with its key: the message (counted
    /// whole though the composition memo may share it: once that memo moves
    /// on, this is its only holder), the report's lists, the key's query, and
    /// [`ITEM_OVERHEAD`](crate::lru::ITEM_OVERHEAD) per list item, and the
    /// slot itself: key, report and entry inline (about a KiB) and the map's
    /// copy of the user name, most of what a small answer costs.
    pub(super) fn bytes(&self, key: &WarmKey) -> usize {
        use crate::lru::ITEM_OVERHEAD;
        let r = &self.report;
        let included: usize = r.included.iter().map(|i| i.id.len() + ITEM_OVERHEAD).sum();
        let excluded: usize =
            r.excluded.iter().map(|e| e.id.len() + e.detail.as_ref().map_or(0, String::len) + ITEM_OVERHEAD).sum();
        let texts: usize = r.warnings.iter().chain(&r.reason).map(String::len).sum();
        let message = self.message.as_ref().map_or(0, |m| m.content.len());
        let key_bytes = key.user.len()
            + key.roles.iter().map(String::len).sum::<usize>()
            + key.model.len()
            + key.query.as_ref().map_or(0, String::len);
        let slot = std::mem::size_of::<(String, WarmSlot)>() + key.user.len();
        message + included + excluded + texts + key_bytes + r.user.len() + r.model.len() + slot + ITEM_OVERHEAD
    }
}

impl WarmMemo {
    /// An empty memo keeping at most about `max_bytes`.
    pub(super) fn new(max_bytes: usize) -> Self {
        Self { entries: std::sync::Mutex::new(Warm { max: max_bytes, ..Warm::default() }) }
    }

    pub(super) fn clear(&self) {
        let mut w = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        w.users.clear();
        w.bytes = 0;
    }

    /// Approximate bytes kept, all users together.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).bytes
    }

    /// Users with a remembered answer.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).users.len()
    }

    pub(super) fn get(
        &self,
        key: &WarmKey,
        policy: &Arc<Policy>,
        listing_generation: u64,
        cache_version: u64,
        hub: &Hub,
    ) -> Option<(Option<ContextMessage>, Report)> {
        let mut w = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        w.clock += 1;
        let tick = w.clock;
        let slot = w.users.get_mut(&key.user)?;
        if slot.key != *key {
            return None;
        }
        slot.used = tick;
        let e = &slot.entry;
        let valid = Arc::ptr_eq(&e.policy, policy)
            && e.listing_generation == listing_generation
            && e.stamp.version == cache_version
            && e.stamp.expires.is_none_or(|t| Instant::now() < t)
            && e.connections.unchanged(hub);
        valid.then(|| (e.message.clone(), e.report.clone()))
    }

    /// The warm path's whole answer: the remembered message and report,
    /// with what is of this moment brought up to date (the servers' state,
    /// the shared cache's, which lent nothing this time, and the time
    /// taken), or `None` when the memo cannot answer (see [`WarmMemo::get`]).
    pub(super) fn replay(
        &self,
        key: &WarmKey,
        now: WarmCheck<'_>,
        shared: Option<crate::report::SharedCacheStatus>,
        started: Instant,
    ) -> Option<(Option<ContextMessage>, Report)> {
        let WarmCheck { policy, listing_generation, cache_version, hub } = now;
        let (message, mut report) = self.get(key, policy, listing_generation, cache_version, hub)?;
        report.failed_servers = hub.failures();
        report.servers = hub.protocols();
        // Everything came from the local cache this time.
        report.shared_cache =
            shared.map(|s| crate::report::SharedCacheReport { up: s.up, error: s.error, hits: 0, derived: 0 });
        let total = super::request::ms(started.elapsed());
        report.timings = Timings { select_ms: 0.0, read_ms: 0.0, pack_ms: 0.0, total_ms: total };
        report.trace();
        Some((message, report))
    }

    /// Remembers `entry` as the user's answer (replacing their previous
    /// one), then brings the memo back under its bound. An answer larger
    /// than the bound is not kept.
    pub(super) fn put(&self, key: WarmKey, entry: WarmEntry) {
        let bytes = entry.bytes(&key);
        let mut w = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = w.users.remove(&key.user) {
            w.bytes -= old.bytes;
        }
        if bytes > w.max {
            return;
        }
        w.clock += 1;
        let used = w.clock;
        w.bytes += bytes;
        w.users.insert(key.user.clone(), WarmSlot { key, entry, bytes, used });
        if w.bytes > w.max {
            let excess = w.bytes - crate::lru::low_water(w.max);
            let gone = crate::lru::oldest(w.users.iter().map(|(u, s)| (s.used, s.bytes, u.clone())), excess);
            for user in gone {
                if let Some(s) = w.users.remove(&user) {
                    w.bytes -= s.bytes;
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "memo_tests.rs"]
mod tests;
