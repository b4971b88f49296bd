//! Composition: already-read resources in, one message under a token
//! budget out. Pure and synchronous (CPU-bound: callers run it off the
//! async runtime); nothing here does I/O, knows a user or a server
//! connection.
//!
//! ```text
//! priority mode:  render (render.rs) → pack whole blocks by priority,
//!                 the last one cut to fit (pack.rs)
//! relevance mode: chunks, cached by content (chunk.rs, terms.rs), embedded
//!                 in the background (semantic.rs, feature `semantic`)
//!   → BM25 against the query (query.rs), fused with the cosine similarity
//!     of the query's embedding (fusion.rs), combined with priority (rank.rs)
//!   → best chunks packed as passages, exact count ≤ budget (passages.rs)
//! auto:           priority when everything fits whole, else relevance
//! ```
//!
//! `Composer` holds what every step needs (tokenizer, token cache, chunk
//! index, preamble, budget); [`compose`] and [`compose_by_relevance`] are
//! the same middle for callers that read resources themselves.
//!
//! Layer: composition. May import the bottom (`id`, `resource`, `report`,
//! `mode`, `error`, `lru`) and the tokenizer (`tokenize`); nothing above
//! (no config, policy, hub, cache, orchestrator or adapter).

use std::sync::Arc;

use crate::mode::SelectMode;
use crate::report::{ExcludeReason, Excluded, Included, Semantic};
use crate::resource::{Contents, Resource};

mod chunk;
mod fusion;
mod pack;
mod passages;
mod query;
mod rank;
mod render;
#[cfg(feature = "semantic")]
mod semantic;
mod terms;
mod turns;

/// The tokenizer every composition counts with.
pub use crate::tokenize::{TokenCache, Tokenizer};
#[cfg(feature = "redis")]
pub(crate) use chunk::term_probe;
#[cfg(feature = "redis")]
pub(crate) use chunk::{Chunk, Chunked};
pub use chunk::{ChunkIndex, DEFAULT_CHUNK_INDEX_MAX_BYTES, DEFAULT_CHUNK_OVERLAP, DEFAULT_CHUNK_TOKENS};
pub use fusion::{DEFAULT_SEMANTIC_WEIGHT, Fusion, SemanticSettings};
pub(crate) use pack::{DEFAULT_MIN_USEFUL_TOKENS, cut_to_fit, marker};
use pack::{PackInput, Packed, pack, pack_in_place};
#[cfg(test)]
pub(crate) use query::user_texts_json;
pub use query::{EARLIER_TURN_WEIGHT, EARLIER_TURNS, MAX_QUERY_BYTES, Query};
#[cfg(feature = "redis")]
pub(crate) use render::render_head_into;
pub use render::{DEFAULT_PREAMBLE, EMPTY_CONTENT, render_text};
#[cfg(feature = "serve")]
pub(crate) use turns::UserTurns;
pub(crate) use turns::{MaybeStr, not_a_map, scalars};

/// Priority given to resources that carry none.
pub const DEFAULT_PRIORITY: f32 = 0.5;

/// What every composition step needs, borrowed for one composition: the
/// model's tokenizer, the token counts remembered by content, the chunk
/// index, the message's preamble and its budget in tokens.
#[derive(Clone, Copy)]
pub(crate) struct Composer<'a> {
    pub tok: &'a Tokenizer,
    pub cache: &'a TokenCache,
    pub index: &'a ChunkIndex,
    pub preamble: &'a str,
    pub budget: usize,
}

/// The result of [`compose`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Composition {
    /// The message content; `None` when nothing fits.
    pub content: Option<String>,
    /// Exact token count of `content` (0 when `None`).
    pub tokens: usize,
    /// Included resources, in message order.
    pub included: Vec<Included>,
    /// Resources left out for the budget.
    pub dropped: Vec<Excluded>,
    /// In relevance mode: whether the embedding model ranked too.
    pub semantic: Option<Semantic>,
}

/// One visible resource going into a composition.
pub(crate) struct Candidate<'a> {
    pub resource: &'a Resource,
    pub contents: &'a Arc<Contents>,
    /// Selected or mentioned: its chunks rank first.
    pub forced: bool,
}

/// The result of [`Composer::by_mode`]: the composition and which mode ran.
pub(crate) struct Composed {
    pub composition: Composition,
    pub mode: SelectMode,
    pub warnings: Vec<String>,
}

impl Composer<'_> {
    /// Composes `items` (in resource order) by `mode` (see [`SelectMode`]):
    /// `auto` packs by priority and keeps that when nothing was cut or
    /// dropped, else ranks chunks.
    pub(crate) fn by_mode(&self, items: &[Candidate<'_>], mode: SelectMode, query: Option<&Query>) -> Composed {
        let by_priority = || {
            let plain: Vec<(&Resource, &Contents)> = items.iter().map(|c| (c.resource, &**c.contents)).collect();
            self.by_priority(&plain)
        };
        let mut warnings = Vec::new();
        match mode {
            SelectMode::Priority => {
                return Composed { composition: by_priority(), mode: SelectMode::Priority, warnings };
            }
            // Packing by priority renders every visible resource; when the
            // chunk index already shows that the blocks alone exceed the
            // budget, it could not fit, so skip it (the warm path of a large
            // knowledge base). Otherwise try it: it is the answer if it fits.
            SelectMode::Auto if !self.exceeds(items) => {
                let c = by_priority();
                if c.dropped.is_empty() && c.included.iter().all(|i| !i.truncated) {
                    return Composed { composition: c, mode: SelectMode::Priority, warnings };
                }
            }
            SelectMode::Auto => {}
            SelectMode::Relevance => {}
        }
        if query.is_none() {
            warnings.push("relevance mode without a query: chunks ranked by priority alone".into());
        }
        let composition = self.by_relevance(items, query);
        Composed { composition, mode: SelectMode::Relevance, warnings }
    }

    /// True when the resources already in the index need more than the
    /// budget whole, by [`Chunked::whole_tokens_at_least`](chunk::Chunked::whole_tokens_at_least) (a lower bound, so
    /// `true` means that packing by priority would cut or drop something).
    fn exceeds(&self, items: &[Candidate<'_>]) -> bool {
        let mut at_least = 0;
        for c in items {
            if let Some(chunked) = self.index.peek(self.tok, c.resource, c.contents) {
                at_least += chunked.whole_tokens_at_least(self.tok);
                if at_least > self.budget {
                    return true;
                }
            }
        }
        false
    }

    /// Renders `items` **in the given order** and packs them whole, the
    /// last one cut to fit.
    pub(crate) fn by_priority(&self, items: &[(&Resource, &Contents)]) -> Composition {
        let Composer { tok, cache, preamble, budget, .. } = *self;
        let packed: Packed = match pack_in_place(tok, cache, preamble, budget, items) {
            Ok(packed) => packed,
            Err(blocks) => {
                pack(tok, cache, PackInput { preamble, blocks, budget, min_useful_tokens: DEFAULT_MIN_USEFUL_TOKENS })
            }
        };
        Composition {
            content: packed.content,
            tokens: packed.tokens,
            included: packed
                .included
                .into_iter()
                .map(|i| Included {
                    id: i.id.to_string(),
                    tokens: i.tokens,
                    truncated: i.truncated,
                    stale: false,
                    chunks: None,
                })
                .collect(),
            dropped: packed
                .dropped
                .into_iter()
                .map(|d| Excluded { id: d.id.to_string(), reason: ExcludeReason::Budget, detail: Some(d.detail) })
                .collect(),
            semantic: None,
        }
    }
}

/// The pure middle of the pipeline, for callers that read resources
/// themselves: renders already-read resources **in the given order** and
/// packs them under `budget` (exact count, preamble included). Token counts
/// are cached in `cache` by content, so a repeated call with unchanged
/// contents tokenises nothing. CPU-bound: call it off the async runtime.
pub fn compose(
    tok: &Tokenizer,
    cache: &TokenCache,
    preamble: &str,
    budget: usize,
    items: &[(&Resource, &Contents)],
) -> Composition {
    // Priority packing never looks at chunks.
    let index = ChunkIndex::new(1, 0);
    Composer { tok, cache, index: &index, preamble, budget }.by_priority(items)
}

/// The pure middle of relevance mode, for callers that read resources
/// themselves (as [`compose`] is for priority mode): ranks every chunk of
/// `items` (already-read resources in resource order, none forced) against
/// `query` and packs the best under `budget`. Chunks are taken from `index`,
/// and cut there the first time a content version is seen. CPU-bound: call
/// it off the async runtime.
pub fn compose_by_relevance(
    tok: &Tokenizer,
    cache: &TokenCache,
    index: &ChunkIndex,
    preamble: &str,
    budget: usize,
    items: &[(&Resource, &Arc<Contents>)],
    query: Option<&Query>,
) -> Composition {
    let items: Vec<Candidate<'_>> =
        items.iter().map(|(r, c)| Candidate { resource: r, contents: c, forced: false }).collect();
    Composer { tok, cache, index, preamble, budget }.by_relevance(&items, query)
}

#[cfg(test)]
mod relevance_tests;
