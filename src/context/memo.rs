//! What the engine remembers between requests, and when each memo is still
//! right: the selection per grant set, the last compositions, and the last
//! answer to each unchanged request (the warm path).

use std::sync::Arc;
use std::time::Instant;

use super::select::Selection;
use super::{Composition, ContextMessage};
use crate::hub::Hub;
use crate::policy::{DecisionKey, Policy};
use crate::relevance::SelectMode;
use crate::report::{Excluded, Included, Report};
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
    pub(super) warnings: Vec<String>,
}

impl From<Composition> for Composed {
    fn from(c: Composition) -> Self {
        Self {
            content: c.content.map(Arc::new),
            tokens: c.tokens,
            included: c.included,
            dropped: c.dropped,
            mode: SelectMode::Priority,
            warnings: Vec::new(),
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
#[derive(Default)]
pub(super) struct WarmMemo {
    /// By user: the last request of each (a new question replaces the
    /// previous one's answer rather than adding a message's worth of memory).
    pub(super) entries: std::sync::Mutex<std::collections::HashMap<String, (WarmKey, WarmEntry)>>,
}

/// Users remembered by the warm memo; past this it starts over (each
/// entry shares its message with the composition memo).
pub(super) const WARM_MEMO_SIZE: usize = 256;

/// What a request asks, besides its user's policy.
#[derive(PartialEq, Eq)]
pub(super) struct WarmKey {
    pub(super) user: String,
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

impl WarmMemo {
    pub(super) fn clear(&self) {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    pub(super) fn get(
        &self,
        key: &WarmKey,
        policy: &Arc<Policy>,
        listing_generation: u64,
        cache_version: u64,
        hub: &Hub,
    ) -> Option<(Option<ContextMessage>, Report)> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let (k, e) = entries.get(&key.user)?;
        if k != key {
            return None;
        }
        let valid = Arc::ptr_eq(&e.policy, policy)
            && e.listing_generation == listing_generation
            && e.stamp.version == cache_version
            && e.stamp.expires.is_none_or(|t| Instant::now() < t)
            && e.connections.unchanged(hub);
        valid.then(|| (e.message.clone(), e.report.clone()))
    }

    pub(super) fn put(&self, key: WarmKey, entry: WarmEntry) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= WARM_MEMO_SIZE && !entries.contains_key(&key.user) {
            entries.clear();
        }
        entries.insert(key.user.clone(), (key, entry));
    }
}
