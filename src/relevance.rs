//! Query-aware context: when the visible resources do not fit the budget,
//! send the passages that answer this conversation.
//!
//! ```text
//! visible resources (after the policy) → chunks (cached by content)
//!   → BM25 against the query → combined with priority → best chunks
//!   packed by `budget::pack_passages` (exact count, ≤ budget)
//! ```
//!
//! # Chunks
//!
//! Each resource body, as it would appear in its block (sanitised, tags
//! defused), is split by the `text-splitter` crate into passages of about
//! `context.chunk_tokens` tokens (default [`DEFAULT_CHUNK_TOKENS`]) with
//! `context.chunk_overlap` tokens shared by neighbours (default
//! [`DEFAULT_CHUNK_OVERLAP`]), counted with the model's own tiktoken
//! encoder. `text/markdown` resources use its Markdown splitter, so headings
//! and paragraphs are boundaries. Chunks, their token counts and their BM25
//! term weights are kept in a [`ChunkIndex`] keyed by the very `Arc` of the
//! contents: a changed resource is a new `Arc`, so only it is chunked again.
//!
//! # Ranking
//!
//! Terms come from the `bm25` crate's English tokenizer (Unicode words,
//! stop words removed, Snowball stemming). For a query term `t` of weight
//! `w(t)`, over the `N` chunks of the resources this user may see (ranking
//! happens after the policy, so what another user may see never changes a
//! score) of which `n(t)` contain `t`:
//!
//! ```text
//! idf(t)  = ln(1 + (N − n(t) + 0.5) / (n(t) + 0.5))
//! bm25(c) = Σ_t w(t) · idf(t) · tf(t,c)·(k1+1) / (tf(t,c) + k1·(1 − b + b·len(c)/avgdl))
//! score(c) = bm25(c) · (0.8 + 0.4·p) + 0.01·p
//! ```
//!
//! with `k1 = 1.2`, `b = 0.75`, `avgdl =` [`AVG_CHUNK_TERMS`] and `p` the
//! resource's `annotations.priority` (0.5 when absent). Priority scales the
//! relevance by ±20% and, when relevance ties (as with no matching term at
//! all), decides alone. Forced resources (a selection or `@server:uri`
//! mentions) rank before everything else; remaining ties go to resource
//! order, then to document order.
//!
//! # The query
//!
//! [`ContextRequest::query`](crate::ContextRequest::query) when given
//! (weight 1); otherwise from the chat request: the latest user message has
//! weight 1, and the [`EARLIER_TURNS`] user turns before it
//! [`EARLIER_TURN_WEIGHT`], its square, its cube (the conversation's topic
//! still counts, the current question counts most). A term in several turns
//! takes its highest weight.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use async_openai::types::chat::{
    ChatCompletionRequestMessage, ChatCompletionRequestUserMessageContent, ChatCompletionRequestUserMessageContentPart,
    CreateChatCompletionRequest,
};
use bm25::{Embedder, EmbedderBuilder, Language};
use serde::{Deserialize, Serialize};
use text_splitter::{ChunkConfig, MarkdownSplitter, TextSplitter};

use crate::budget::{PassageBlock, Passages, TokenCache, Tokenizer, pack_passages};
use crate::context::{Composition, compose};
use crate::render::render_head_into;
use crate::report::{ExcludeReason, Excluded, Included};
use crate::resource::{ContentPart, Contents, Resource};

/// Default chunk size in tokens: a passage long enough to answer a question,
/// short enough that a 4000-token budget holds a dozen.
pub const DEFAULT_CHUNK_TOKENS: usize = 300;
/// Default overlap of neighbouring chunks in tokens (10%).
pub const DEFAULT_CHUNK_OVERLAP: usize = 30;
/// Weight of the user turn before the latest; each earlier one multiplies
/// by it again.
pub const EARLIER_TURN_WEIGHT: f32 = 0.5;
/// How many user turns before the latest count in the query.
pub const EARLIER_TURNS: usize = 3;
/// BM25's average document length, in terms after stop-word removal: fixed
/// (about what a default chunk holds) so a chunk's weights depend only on
/// its own text and can be cached with it.
pub const AVG_CHUNK_TERMS: f32 = 150.0;
/// Entries the chunk index holds before it keeps only the most recent use.
const INDEX_LIMIT: usize = 8192;

/// How resources are chosen for the message (`context.select`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SelectMode {
    /// `priority` when everything visible fits whole, `relevance` otherwise.
    #[default]
    Auto,
    /// Whole resources by `annotations.priority`; the last one cut to fit.
    Priority,
    /// The chunks that best match the query, by BM25 and priority.
    Relevance,
}

impl std::fmt::Display for SelectMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SelectMode::Auto => "auto",
            SelectMode::Priority => "priority",
            SelectMode::Relevance => "relevance",
        })
    }
}

impl std::str::FromStr for SelectMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(SelectMode::Auto),
            "priority" => Ok(SelectMode::Priority),
            "relevance" => Ok(SelectMode::Relevance),
            _ => Err(format!("unknown selection mode `{s}`: expected auto, priority or relevance")),
        }
    }
}

/// One included chunk, for the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChunkReport {
    /// Its position in the resource, from 0.
    pub index: usize,
    /// How many chunks the resource has.
    pub count: usize,
    /// Its tokens.
    pub tokens: usize,
    /// Its combined score (see the module docs), rounded to 3 decimals.
    pub score: f64,
}

/// What to rank by: weighted pieces of text.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    turns: Vec<(String, f32)>,
}

impl Query {
    /// One text of weight 1.
    pub fn text(text: impl Into<String>) -> Query {
        Query { turns: vec![(text.into(), 1.0)] }
    }

    /// The user turns of a chat request: the latest with weight 1, the
    /// [`EARLIER_TURNS`] before it with [`EARLIER_TURN_WEIGHT`]^k. `None`
    /// when the request has no user text.
    pub fn from_chat(request: &CreateChatCompletionRequest) -> Option<Query> {
        let users = request.messages.iter().rev().filter_map(|m| match m {
            ChatCompletionRequestMessage::User(u) => Some(match &u.content {
                ChatCompletionRequestUserMessageContent::Text(t) => t.clone(),
                ChatCompletionRequestUserMessageContent::Array(parts) => parts
                    .iter()
                    .filter_map(|p| match p {
                        ChatCompletionRequestUserMessageContentPart::Text(t) => Some(t.text.as_str()),
                        _ => None,
                    })
                    .collect::<Vec<_>>()
                    .join("\n"),
            }),
            _ => None,
        });
        let turns: Vec<(String, f32)> = users
            .take(EARLIER_TURNS + 1)
            .enumerate()
            .map(|(k, t)| (t, EARLIER_TURN_WEIGHT.powi(k as i32)))
            .filter(|(t, _)| !t.trim().is_empty())
            .collect();
        (!turns.is_empty()).then_some(Query { turns })
    }

    /// A string that is equal for equal queries (for memo keys).
    pub(crate) fn key(&self) -> String {
        self.turns.iter().map(|(t, w)| format!("{w}\u{0}{t}\u{0}")).collect()
    }

    /// Distinct terms with their weight (the highest among the turns that
    /// contain them), sorted by term.
    fn terms(&self) -> Vec<(u32, f32)> {
        let mut terms: HashMap<u32, f32> = HashMap::new();
        for (text, w) in &self.turns {
            for t in EMBEDDER.embed(text).indices() {
                let e = terms.entry(*t).or_insert(0.0);
                *e = e.max(*w);
            }
        }
        let mut v: Vec<_> = terms.into_iter().collect();
        v.sort_by_key(|(t, _)| *t);
        v
    }
}

static EMBEDDER: LazyLock<Embedder> =
    LazyLock::new(|| EmbedderBuilder::with_avgdl(AVG_CHUNK_TERMS).language_mode(Language::English).build());

/// One passage of a resource body.
#[derive(Debug, Clone)]
pub(crate) struct Chunk {
    /// Byte range in the body.
    pub start: usize,
    pub end: usize,
    /// Its tokens.
    pub tokens: usize,
    /// BM25 term-frequency weights, sorted by term.
    terms: Box<[(u32, f32)]>,
}

impl Chunk {
    fn weight(&self, term: u32) -> f32 {
        self.terms.binary_search_by_key(&term, |(t, _)| *t).map_or(0.0, |i| self.terms[i].1)
    }
}

/// A resource cut into chunks, for one encoding and chunk size.
#[derive(Debug)]
pub(crate) struct Chunked {
    /// The whole block head (opening line, body, final `'\n'`), as
    /// [`render_head_into`] writes it.
    pub head: String,
    /// Where the body starts in `head`.
    pub body_start: usize,
    /// The chunks, in document order.
    pub chunks: Vec<Chunk>,
    /// Byte offset in the body where each token of the body ends: the token
    /// count of any stretch without tokenising it again.
    pub token_ends: Vec<u32>,
}

impl Chunked {
    /// The body (what follows the opening line).
    pub fn body(&self) -> &str {
        &self.head[self.body_start..]
    }

    /// About how many tokens `body[a..b]` holds: tokens of the whole body
    /// that end within it.
    pub fn tokens_between(&self, a: usize, b: usize) -> usize {
        let end = |x: usize| self.token_ends.partition_point(|&e| (e as usize) <= x);
        end(b).saturating_sub(end(a))
    }
}

/// Chunks and their weights by content, shared across requests: built once
/// per content version. Keyed by the address of the contents' `Arc`, which
/// the entry keeps alive (so the address cannot be reused by other contents
/// while the entry exists), with the encoding and the listing metadata the
/// block shows checked on every hit.
pub struct ChunkIndex {
    chunk_tokens: usize,
    overlap: usize,
    entries: Mutex<HashMap<(usize, &'static str), Entry>>,
}

struct Entry {
    contents: Arc<Contents>,
    meta: (String, Option<String>, Option<String>),
    chunked: Arc<Chunked>,
    used: u64,
}

impl std::fmt::Debug for ChunkIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkIndex").field("chunk_tokens", &self.chunk_tokens).field("len", &self.len()).finish()
    }
}

static USE_CLOCK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl ChunkIndex {
    /// An empty index cutting chunks of `chunk_tokens` tokens, `overlap`
    /// shared with the neighbour (at most half a chunk).
    pub fn new(chunk_tokens: usize, overlap: usize) -> Self {
        let chunk_tokens = chunk_tokens.max(1);
        ChunkIndex { chunk_tokens, overlap: overlap.min(chunk_tokens / 2), entries: Mutex::default() }
    }

    /// Number of resources whose chunks are kept.
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// True when nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The chunks of this resource's contents, cut now if they were not yet.
    pub(crate) fn get(&self, tok: &Tokenizer, resource: &Resource, contents: &Arc<Contents>) -> Arc<Chunked> {
        let key = (Arc::as_ptr(contents) as usize, tok.encoding());
        let meta = (resource.name.clone(), resource.title.clone(), resource.mime_type.clone());
        let now = USE_CLOCK.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        {
            let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(e) = entries.get_mut(&key)
                && Arc::ptr_eq(&e.contents, contents)
                && e.meta == meta
            {
                e.used = now;
                return e.chunked.clone();
            }
        }
        let chunked = Arc::new(self.chunk(tok, resource, contents));
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= INDEX_LIMIT {
            // Keep the most recently used half: the resources of the
            // current requests, not versions replaced long ago.
            let mut ages: Vec<u64> = entries.values().map(|e| e.used).collect();
            ages.sort_unstable();
            let cut = ages[ages.len() / 2];
            entries.retain(|_, e| e.used > cut);
        }
        entries.insert(key, Entry { contents: contents.clone(), meta, chunked: chunked.clone(), used: now });
        chunked
    }

    /// Cuts one resource (CPU-bound).
    pub(crate) fn chunk(&self, tok: &Tokenizer, resource: &Resource, contents: &Contents) -> Chunked {
        let mut head = String::new();
        render_head_into(&mut head, resource, contents);
        let body_start = head.find('\n').map_or(head.len(), |i| i + 1);
        let body = &head[body_start..];
        let markdown = resource
            .mime_type
            .as_deref()
            .or_else(|| match contents.parts.first() {
                Some(ContentPart::Text { mime_type, .. } | ContentPart::Blob { mime_type, .. }) => mime_type.as_deref(),
                None => None,
            })
            .is_some_and(|m| m.eq_ignore_ascii_case("text/markdown"));
        let config = ChunkConfig::new(self.chunk_tokens)
            .with_sizer(tok.bpe())
            .with_overlap(self.overlap)
            .expect("overlap is at most half the chunk size");
        let ranges: Vec<(usize, usize)> = if markdown {
            MarkdownSplitter::new(config).chunk_indices(body).map(|(o, s)| (o, o + s.len())).collect()
        } else {
            TextSplitter::new(config).chunk_indices(body).map(|(o, s)| (o, o + s.len())).collect()
        };
        let mut token_ends = Vec::new();
        let mut at = 0u32;
        for t in tok.bpe().encode_ordinary(body) {
            at += tok.bpe().decode_bytes(&[t]).map_or(0, |b| b.len()) as u32;
            token_ends.push(at);
        }
        let mut chunked =
            Chunked { body_start, chunks: Vec::with_capacity(ranges.len()), token_ends, head: String::new() };
        for (start, end) in ranges {
            let text = &body[start..end];
            let mut terms: Vec<(u32, f32)> = EMBEDDER.embed(text).iter().map(|e| (e.index, e.value)).collect();
            terms.sort_by_key(|t| t.0);
            terms.dedup_by_key(|(t, _)| *t);
            let tokens = chunked.tokens_between(start, end).max(1);
            chunked.chunks.push(Chunk { start, end, tokens, terms: terms.into_boxed_slice() });
        }
        chunked.head = head;
        chunked
    }
}

/// One visible resource going into [`compose_relevant`].
pub(crate) struct Candidate<'a> {
    pub resource: &'a Resource,
    pub contents: &'a Arc<Contents>,
    /// Selected or mentioned: its chunks rank first.
    pub forced: bool,
}

/// The result of [`compose_with_mode`]: the composition and which mode ran.
pub(crate) struct Composed {
    pub composition: Composition,
    pub mode: SelectMode,
    pub warnings: Vec<String>,
}

/// Composes `items` (in resource order) under `budget` by `mode` (see
/// [`SelectMode`]): `auto` packs by priority and keeps that when nothing
/// was cut or dropped, else ranks chunks.
#[allow(clippy::too_many_arguments)]
pub(crate) fn compose_with_mode(
    tok: &Tokenizer,
    cache: &TokenCache,
    index: &ChunkIndex,
    preamble: &str,
    budget: usize,
    items: &[Candidate<'_>],
    mode: SelectMode,
    query: Option<&Query>,
) -> Composed {
    let by_priority = || {
        let plain: Vec<(&Resource, &Contents)> = items.iter().map(|c| (c.resource, &**c.contents)).collect();
        compose(tok, cache, preamble, budget, &plain)
    };
    let mut warnings = Vec::new();
    match mode {
        SelectMode::Priority => {
            return Composed { composition: by_priority(), mode: SelectMode::Priority, warnings };
        }
        SelectMode::Auto => {
            let c = by_priority();
            if c.dropped.is_empty() && c.included.iter().all(|i| !i.truncated) {
                return Composed { composition: c, mode: SelectMode::Priority, warnings };
            }
        }
        SelectMode::Relevance => {}
    }
    if query.is_none() {
        warnings.push("relevance mode without a query: chunks ranked by priority alone".into());
    }
    let composition = compose_relevant(tok, cache, index, preamble, budget, items, query);
    Composed { composition, mode: SelectMode::Relevance, warnings }
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
    compose_relevant(tok, cache, index, preamble, budget, &items, query)
}

/// Ranks every chunk of `items` against `query` and packs the best.
pub(crate) fn compose_relevant(
    tok: &Tokenizer,
    cache: &TokenCache,
    index: &ChunkIndex,
    preamble: &str,
    budget: usize,
    items: &[Candidate<'_>],
    query: Option<&Query>,
) -> Composition {
    let chunked: Vec<Arc<Chunked>> = items.iter().map(|c| index.get(tok, c.resource, c.contents)).collect();
    let terms = query.map(Query::terms).unwrap_or_default();
    // Document frequencies over the visible chunks only.
    let n: usize = chunked.iter().map(|c| c.chunks.len()).sum();
    let idf: Vec<f32> = terms
        .iter()
        .map(|(t, _)| {
            let df = chunked.iter().flat_map(|c| &c.chunks).filter(|c| c.weight(*t) > 0.0).count() as f32;
            (1.0 + (n as f32 - df + 0.5) / (df + 0.5)).ln()
        })
        .collect();
    let mut ranked: Vec<(usize, usize, f32)> = Vec::with_capacity(n);
    for (r, (c, item)) in chunked.iter().zip(items).enumerate() {
        let p = item.resource.annotations.priority.unwrap_or(crate::context::DEFAULT_PRIORITY);
        for (k, chunk) in c.chunks.iter().enumerate() {
            let bm25: f32 = terms.iter().zip(&idf).map(|((t, w), idf)| w * idf * chunk.weight(*t)).sum();
            ranked.push((r, k, bm25 * (0.8 + 0.4 * p) + 0.01 * p));
        }
    }
    ranked.sort_by(|a, b| {
        items[b.0].forced.cmp(&items[a.0].forced).then(b.2.total_cmp(&a.2)).then(a.0.cmp(&b.0)).then(a.1.cmp(&b.1))
    });
    let blocks: Vec<PassageBlock<'_>> =
        items.iter().zip(&chunked).map(|(item, c)| PassageBlock { id: &item.resource.id, chunked: c }).collect();
    let packed: Passages = pack_passages(tok, cache, preamble, budget, &blocks, &ranked);
    let score = |r: usize, k: usize| ranked.iter().find(|x| x.0 == r && x.1 == k).map_or(0.0, |x| x.2);
    Composition {
        content: packed.packed.content,
        tokens: packed.packed.tokens,
        included: packed
            .packed
            .included
            .iter()
            .zip(&packed.chosen)
            .map(|(i, (r, chosen))| Included {
                id: i.id.to_string(),
                tokens: i.tokens,
                truncated: i.truncated,
                stale: false,
                chunks: chosen.as_ref().map(|ks| {
                    ks.iter()
                        .map(|&k| ChunkReport {
                            index: k,
                            count: chunked[*r].chunks.len(),
                            tokens: chunked[*r].chunks[k].tokens,
                            score: (f64::from(score(*r, k)) * 1000.0).round() / 1000.0,
                        })
                        .collect()
                }),
            })
            .collect(),
        dropped: items
            .iter()
            .enumerate()
            .filter(|(r, _)| !packed.chosen.iter().any(|(x, _)| x == r))
            .map(|(_, item)| Excluded {
                id: item.resource.id.to_string(),
                reason: ExcludeReason::Budget,
                detail: Some("no chunk of it ranked high enough for the budget".into()),
            })
            .collect(),
    }
}

#[cfg(test)]
#[allow(clippy::needless_update)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::id::ResourceId;
    use crate::render::DEFAULT_PREAMBLE;

    fn tok() -> Tokenizer {
        Tokenizer::for_model("gpt-4o").0
    }

    fn res(uri: &str, text: &str, priority: Option<f32>, mime: Option<&str>) -> (Resource, Arc<Contents>) {
        let mut r = Resource::unlisted(ResourceId::new("kb", uri).unwrap());
        r.annotations.priority = priority;
        r.mime_type = mime.map(Into::into);
        let c = Contents {
            parts: vec![ContentPart::Text { text: text.into(), mime_type: None }],
            truncated_bytes: 0,
            ..Default::default()
        };
        (r, Arc::new(c))
    }

    /// A document of `n` paragraphs about `topic`, each about 60 tokens.
    fn doc(topic: &str, n: usize) -> String {
        (0..n)
            .map(|i| {
                format!(
                    "Paragraph {i} of the {topic} notes. The {topic} team writes about {topic} matters here, \
                     with details on planning, reviews, schedules, owners and follow-up items for section {i}."
                )
            })
            .collect::<Vec<_>>()
            .join("\n\n")
    }

    fn corpus() -> Vec<(Resource, Arc<Contents>)> {
        let mut v = vec![
            res("doc://alpha", &doc("alpha", 30), Some(0.9), None),
            res("doc://beta", &doc("beta", 30), Some(0.8), None),
            res("doc://gamma", &doc("gamma", 30), Some(0.1), None),
        ];
        // The answer sits in the middle of a low-priority document.
        let mut text = doc("delta", 15);
        text.push_str("\n\nThe penguin migration starts in the southern winter; penguins walk to the colony.\n\n");
        text.push_str(&doc("delta", 15));
        v.push(res("doc://delta", &text, Some(0.0), None));
        v
    }

    fn items<'a>(v: &'a [(Resource, Arc<Contents>)], forced: &[usize]) -> Vec<Candidate<'a>> {
        v.iter()
            .enumerate()
            .map(|(i, (r, c))| Candidate { resource: r, contents: c, forced: forced.contains(&i) })
            .collect()
    }

    fn run(v: &[(Resource, Arc<Contents>)], budget: usize, mode: SelectMode, q: Option<&str>) -> Composed {
        let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP);
        let query = q.map(Query::text);
        compose_with_mode(
            &tok(),
            &TokenCache::new(),
            &index,
            DEFAULT_PREAMBLE,
            budget,
            &items(v, &[]),
            mode,
            query.as_ref(),
        )
    }

    #[test]
    fn relevant_passage_of_a_low_priority_resource_goes_in() {
        let v = corpus();
        let priority = run(&v, 1500, SelectMode::Priority, Some("when do penguins migrate"));
        assert!(!priority.composition.content.unwrap().contains("penguin"));
        let c = run(&v, 1500, SelectMode::Relevance, Some("when do penguins migrate"));
        assert_eq!(c.mode, SelectMode::Relevance);
        let content = c.composition.content.unwrap();
        assert!(content.contains("The penguin migration starts"), "{content}");
        assert!(c.composition.tokens <= 1500);
        assert_eq!(c.composition.tokens, tok().count(&content));
        // One block per resource, in resource order, omitted stretches marked.
        let delta = c.composition.included.iter().find(|i| i.id == "kb:doc://delta").unwrap();
        let chunks = delta.chunks.as_ref().unwrap();
        assert!(chunks[0].score > 1.0, "{chunks:?}");
        assert!(content.contains(" tokens omitted …]\n"));
        let order: Vec<usize> = ["kb:doc://alpha", "kb:doc://beta", "kb:doc://gamma", "kb:doc://delta"]
            .iter()
            .filter_map(|id| content.find(&format!("<resource id=\"{id}\"")))
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "blocks out of resource order");
        // The highest-scoring chunk is listed with its place in the resource.
        assert!(chunks.iter().all(|k| k.count > 1 && k.index < k.count && k.tokens > 0));
    }

    #[test]
    fn identical_inputs_give_identical_bytes() {
        let v = corpus();
        let a = run(&v, 2000, SelectMode::Relevance, Some("beta reviews schedule"));
        let b = run(&v, 2000, SelectMode::Relevance, Some("beta reviews schedule"));
        assert_eq!(a.composition, b.composition);
        // Also with a shared, warm index and cache.
        let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP);
        let cache = TokenCache::new();
        let q = Query::text("beta reviews schedule");
        let it = items(&v, &[]);
        let warm1 = compose_relevant(&tok(), &cache, &index, DEFAULT_PREAMBLE, 2000, &it, Some(&q));
        let warm2 = compose_relevant(&tok(), &cache, &index, DEFAULT_PREAMBLE, 2000, &it, Some(&q));
        assert_eq!(warm1, warm2);
        assert_eq!(warm1, a.composition);
    }

    #[test]
    fn auto_switches_exactly_when_everything_stops_fitting() {
        let v = corpus();
        let whole = run(&v, 1_000_000, SelectMode::Priority, None).composition;
        assert!(whole.dropped.is_empty());
        let fits = run(&v, whole.tokens, SelectMode::Auto, Some("penguins"));
        assert_eq!(fits.mode, SelectMode::Priority);
        assert_eq!(fits.composition, whole);
        let over = run(&v, whole.tokens - 1, SelectMode::Auto, Some("penguins"));
        assert_eq!(over.mode, SelectMode::Relevance);
        assert!(over.composition.tokens < whole.tokens);
    }

    #[test]
    fn forced_resources_rank_first() {
        let v = corpus();
        let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP);
        let q = Query::text("penguins");
        // gamma is forced: its chunks go in before the matching delta chunk.
        let c = compose_relevant(&tok(), &TokenCache::new(), &index, DEFAULT_PREAMBLE, 700, &items(&v, &[2]), Some(&q));
        let ids: Vec<&str> = c.included.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["kb:doc://gamma"]);
    }

    #[test]
    fn priority_breaks_ties() {
        let v = corpus();
        // No term matches: chunks fill by priority (alpha first).
        let c = run(&v, 600, SelectMode::Relevance, Some("zzzz qqqq"));
        assert_eq!(c.composition.included[0].id, "kb:doc://alpha");
        let c = run(&v, 600, SelectMode::Relevance, None);
        assert_eq!(c.composition.included[0].id, "kb:doc://alpha");
        assert_eq!(c.warnings.len(), 1);
    }

    #[test]
    fn a_changed_resource_is_chunked_again_and_nothing_else() {
        let t = tok();
        let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP);
        let v = corpus();
        let first: Vec<Arc<Chunked>> = v.iter().map(|(r, c)| index.get(&t, r, c)).collect();
        assert_eq!(index.len(), 4);
        let mut v2 = v.clone();
        v2[1] = res("doc://beta", &doc("beta changed", 10), Some(0.8), None);
        let second: Vec<Arc<Chunked>> = v2.iter().map(|(r, c)| index.get(&t, r, c)).collect();
        for (i, (a, b)) in first.iter().zip(&second).enumerate() {
            assert_eq!(Arc::ptr_eq(a, b), i != 1, "resource {i}");
        }
        assert!(second[1].body().contains("beta changed"));
        // Same contents with other listing metadata: the block shows it, so it is recut.
        let mut r = v[0].0.clone();
        r.name = "renamed".into();
        assert!(!Arc::ptr_eq(&index.get(&t, &r, &v[0].1), &first[0]));
    }

    #[test]
    fn markdown_headings_are_boundaries() {
        let t = tok();
        let index = ChunkIndex::new(60, 0);
        let section = |h: &str| format!("# {h}\n\n{}\n\n", doc(h, 1));
        let text = format!("{}{}{}", section("One"), section("Two"), section("Three"));
        let (r, c) = res("doc://md", &text, None, Some("text/markdown"));
        let chunked = index.chunk(&t, &r, &c);
        let starts: Vec<&str> =
            chunked.chunks.iter().map(|k| &chunked.body()[k.start..k.end]).filter(|s| s.starts_with('#')).collect();
        assert_eq!(
            starts.len(),
            3,
            "{:?}",
            chunked.chunks.iter().map(|k| &chunked.body()[k.start..k.end]).collect::<Vec<_>>()
        );
        assert!(chunked.chunks.iter().all(|k| k.tokens <= 60));
    }

    #[test]
    fn query_from_chat_weights_earlier_turns_lower() {
        use async_openai::types::chat::{
            ChatCompletionRequestAssistantMessage, ChatCompletionRequestUserMessage, CreateChatCompletionRequestArgs,
        };
        let req = CreateChatCompletionRequestArgs::default()
            .model("gpt-4o")
            .messages([
                ChatCompletionRequestUserMessage::from("tell me about penguins").into(),
                ChatCompletionRequestAssistantMessage::from("they are birds").into(),
                ChatCompletionRequestUserMessage::from("when do they migrate").into(),
            ])
            .build()
            .unwrap();
        let q = Query::from_chat(&req).unwrap();
        assert_eq!(q.turns, [("when do they migrate".to_owned(), 1.0), ("tell me about penguins".to_owned(), 0.5)]);
        let penguin = EMBEDDER.embed("penguins").indices().next().copied().unwrap();
        let migrate = EMBEDDER.embed("migrate").indices().next().copied().unwrap();
        let terms = q.terms();
        let w = |t: u32| terms.iter().find(|x| x.0 == t).unwrap().1;
        assert_eq!((w(migrate), w(penguin)), (1.0, 0.5));
    }

    fn words() -> impl Strategy<Value = String> {
        let pool =
            vec!["penguin", "walks", "the", "colony", "\n\n", "# Head\n", "<resource", "é日本", "1234", "  ", "."];
        prop::collection::vec(prop::sample::select(pool), 0..400).prop_map(|v| v.join(" "))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn relevance_never_exceeds_the_budget(
            texts in prop::collection::vec((words(), prop::option::of(0.0f32..1.0), any::<bool>()), 0..5),
            budget in prop_oneof![0usize..300, 0usize..3000],
            chunk in 16usize..200,
            query in words(),
        ) {
            let t = tok();
            let v: Vec<_> = texts
                .iter()
                .enumerate()
                .map(|(i, (text, p, md))| res(&format!("doc://{i}"), text, *p, md.then_some("text/markdown")))
                .collect();
            let index = ChunkIndex::new(chunk, chunk / 8);
            let q = Query::text(query);
            let c = compose_relevant(&t, &TokenCache::new(), &index, DEFAULT_PREAMBLE, budget, &items(&v, &[]), Some(&q));
            prop_assert!(c.tokens <= budget);
            match &c.content {
                None => prop_assert_eq!((c.tokens, c.included.len()), (0, 0)),
                Some(content) => {
                    prop_assert_eq!(c.tokens, t.count(content));
                    let opens = content.lines().filter(|l| l.starts_with("<resource ")).count();
                    prop_assert_eq!(opens, c.included.len());
                }
            }
            prop_assert_eq!(c.included.len() + c.dropped.len(), v.len());
        }
    }
}
