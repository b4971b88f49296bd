//! Chunks: resource bodies cut into passages, and the index that keeps them.
//!
//! Each resource body, as it would appear in its block (sanitised, tags
//! defused), is split by the `text-splitter` crate into passages of about
//! `context.chunk_tokens` tokens (default [`DEFAULT_CHUNK_TOKENS`]) with
//! `context.chunk_overlap` tokens shared by neighbours (default
//! [`DEFAULT_CHUNK_OVERLAP`]), counted with the model's own tiktoken
//! encoder: the body is encoded once, and the splitter's sizes and the
//! chunks' counts are read off those token offsets. `text/markdown`
//! resources use its Markdown splitter, so headings and paragraphs are
//! boundaries. Chunks, their token counts and their terms are kept in a
//! [`ChunkIndex`] keyed by the very `Arc` of the contents: a changed
//! resource is a new `Arc`, so only it is chunked again, and a request
//! that finds every resource indexed does no chunking or term analysis.
//! The index is bounded in bytes (`context.chunk_index_max_bytes`, an
//! estimate), least recently used content versions out first.
//!
//! Imports the tokenizer, the resource types, the renderer, the term
//! analysis, and hybrid ranking's settings and background embedder.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use text_splitter::{ChunkConfig, MarkdownSplitter, TextSplitter};

use super::fusion::SemanticSettings;
use super::render::render_head_into;
use super::terms;
use crate::resource::{ContentPart, Contents, Resource};
use crate::tokenize::Tokenizer;

/// Default `context.chunk_index_max_bytes` (64 MiB). A content version
/// costs four to six times its text here (the text, the rendered block, four
/// bytes per token, the chunks' term counts), so this holds 10 to 16 MiB of
/// resource text: a few hundred documents of a few tens of KiB. A larger
/// knowledge base in relevance mode wants more, or its least recently used
/// documents are chunked again when next asked for.
pub const DEFAULT_CHUNK_INDEX_MAX_BYTES: usize = 64 << 20;
/// Default chunk size in tokens: a passage long enough to answer a question,
/// short enough that a 4000-token budget holds a dozen.
pub const DEFAULT_CHUNK_TOKENS: usize = 300;
/// Default overlap of neighbouring chunks in tokens (10%).
pub const DEFAULT_CHUNK_OVERLAP: usize = 30;
/// Entries the chunk index holds, however small, before the least recently
/// used half goes (its byte bound is the one that usually acts).
const INDEX_LIMIT: usize = 8192;

/// One passage of a resource body.
#[derive(Debug, Clone)]
pub(crate) struct Chunk {
    /// Byte range in the body.
    pub start: usize,
    pub end: usize,
    /// Its tokens.
    pub tokens: usize,
    /// Its length in terms (BM25's document length).
    pub len: u32,
    /// `(term, count)`, sorted by term.
    pub terms: Box<[(u64, u16)]>,
}

/// How often `term` occurs in `terms` (sorted by term).
pub(crate) fn count_of(terms: &[(u64, u16)], term: u64) -> u16 {
    terms.binary_search_by_key(&term, |(t, _)| *t).map_or(0, |i| terms[i].1)
}

/// A resource cut into chunks, for one encoding and chunk size.
#[derive(Debug)]
pub(crate) struct Chunked {
    /// The whole block head (opening line, body, final `'\n'`), as
    /// [`render_head_into`] writes it.
    pub head: String,
    /// Where the body starts in `head`.
    pub body_start: usize,
    /// Tokens of the opening line (`head[..body_start]`).
    pub open_tokens: usize,
    /// The chunks, in document order.
    pub chunks: Vec<Chunk>,
    /// Byte offset in the body where each token of the body ends: the token
    /// count of any stretch without tokenising it again.
    pub token_ends: Vec<u32>,
    /// `(term, count)` of the resource's name and title, sorted by term:
    /// they describe every chunk (see "Ranking" in the module docs).
    pub fields: Box<[(u64, u16)]>,
    /// The chunks' embeddings, once the background embedder has made them
    /// ([`super::semantic`]).
    #[cfg(feature = "semantic")]
    pub vectors: std::sync::OnceLock<super::semantic::ChunkVectors>,
}

impl Chunked {
    /// The body (what follows the opening line).
    pub(crate) fn body(&self) -> &str {
        &self.head[self.body_start..]
    }

    /// About how many tokens `body[a..b]` holds: tokens of the whole body
    /// that end within it.
    pub(crate) fn tokens_between(&self, a: usize, b: usize) -> usize {
        tokens_between(&self.token_ends, a, b)
    }

    /// A lower bound of this block's tokens when it goes in whole, for
    /// `auto` mode to tell without packing that everything cannot fit: the
    /// opening line and the body count apart exactly (`pack::body_tokens`)
    /// when the encoding is additive and the body does not start with a
    /// newline or `/`; else 0.
    pub(crate) fn whole_tokens_at_least(&self, tok: &Tokenizer) -> usize {
        self.whole_head_tokens(tok).unwrap_or(0)
    }

    /// The head's tokens, exactly, when they are the opening line's plus
    /// the body's (the head was encoded whole in [`ChunkIndex::chunk`]).
    pub(crate) fn whole_head_tokens(&self, tok: &Tokenizer) -> Option<usize> {
        (tok.is_additive() && !self.body().starts_with(['\n', '\r', '/']))
            .then(|| self.open_tokens + self.token_ends.len())
    }
}

/// A term id that changes when term ids do (another hash or analysis in
/// another build): chunks with term ids from elsewhere are used only if the
/// two agree.
#[cfg(feature = "redis")]
pub(crate) fn term_probe() -> u64 {
    terms::id("mcp-context term probe")
}

/// Tokens whose end offset (in `ends`, ascending) is in `(a, b]`.
fn tokens_between(ends: &[u32], a: usize, b: usize) -> usize {
    let end = |x: usize| ends.partition_point(|&e| (e as usize) <= x);
    end(b).saturating_sub(end(a))
}

/// `text-splitter`'s sizer for one body: a candidate chunk is a slice of
/// the body, so its size is read off the body's token offsets (counted once
/// with the model's encoder) instead of encoding every candidate again; the
/// splitter tries many. Text that is not a slice of the body (never, in
/// text-splitter 0.33) is encoded.
struct OffsetSizer<'a> {
    body: &'a str,
    ends: &'a [u32],
    tok: Tokenizer,
}

impl text_splitter::ChunkSizer for OffsetSizer<'_> {
    fn size(&self, chunk: &str) -> usize {
        let at = (chunk.as_ptr() as usize).wrapping_sub(self.body.as_ptr() as usize);
        if at <= self.body.len() && chunk.len() <= self.body.len() - at {
            tokens_between(self.ends, at, at + chunk.len())
        } else {
            self.tok.count(chunk)
        }
    }
}

/// Chunks and their terms by content, shared across requests: built once
/// per content version. Keyed by the address of the contents' `Arc`, of
/// which the entry keeps a [`Weak`] (so the address cannot be reused by
/// other contents while the entry exists), with the encoding and the
/// listing metadata the block shows checked on every hit.
///
/// An entry lives no longer than its contents: once the content cache lets
/// them go (an expired or evicted `private` answer, a version replaced by a
/// change), no request can present that `Arc` again, so the entry could
/// never be hit, and it is dropped at the next insert. Without this, each
/// new user's private answers filled the index up to its byte bound with
/// entries nothing would ask for again (issue 47, item 10: 64 MiB at the
/// default bound, 16 waves of 334 new users).
///
/// Bounded in bytes (`context.chunk_index_max_bytes`, default
/// [`DEFAULT_CHUNK_INDEX_MAX_BYTES`](DEFAULT_CHUNK_INDEX_MAX_BYTES)),
/// and to 8192 entries: past the bytes, the least recently used content
/// versions go until 7/8 of the bound is left; past the count, the least
/// recently used half. An entry's bytes are an estimate: the contents it
/// indexes (counted whole, though the content cache holds them), the
/// rendered block, the token offsets, the chunks and their term counts,
/// and a fixed cost per item. Contents larger than the bound are chunked
/// for the request that needs them and not kept.
pub struct ChunkIndex {
    chunk_tokens: usize,
    overlap: usize,
    entries: Mutex<Entries>,
    /// Hybrid ranking's settings; `None`: lexical only, and nothing is embedded.
    semantic: Option<SemanticSettings>,
}

/// What the index keeps, and its byte count.
#[derive(Default)]
pub(super) struct Entries {
    pub(super) map: HashMap<(usize, &'static str), Entry>,
    /// Sum of the entries' `bytes`.
    pub(super) bytes: usize,
    max: usize,
}

impl Entries {
    /// Drops the least recently used entries until their `size`s add up
    /// to `excess`.
    fn drop_oldest(&mut self, excess: usize, size: impl Fn(&Entry) -> usize) {
        let gone = crate::lru::oldest(self.map.iter().map(|(k, e)| (e.used, size(e), *k)), excess);
        for k in gone {
            if let Some(e) = self.map.remove(&k) {
                self.bytes -= e.bytes;
            }
        }
    }
}

pub(super) struct Entry {
    /// The contents indexed: not kept alive here (see [`ChunkIndex`]).
    contents: Weak<Contents>,
    meta: (String, Option<String>, Option<String>),
    chunked: Arc<Chunked>,
    /// Approximate bytes kept ([`entry_bytes`]).
    pub(super) bytes: usize,
    used: u64,
}

impl Entry {
    fn shows(&self, r: &Resource) -> bool {
        self.meta.0 == r.name && self.meta.1 == r.title && self.meta.2 == r.mime_type
    }
}

/// Approximate bytes an index entry keeps: the contents (as the content
/// cache counts them), the resource's name, title and MIME type, the
/// rendered block, four bytes per token offset, each chunk and its term
/// counts, the name's terms, and [`ITEM_OVERHEAD`](crate::lru::ITEM_OVERHEAD)
/// for the entry and the chunked form.
fn entry_bytes(contents: &Contents, meta: &(String, Option<String>, Option<String>), chunked: &Chunked) -> usize {
    use std::mem::size_of;
    let term = size_of::<(u64, u16)>();
    let chunks: usize = chunked.chunks.iter().map(|c| size_of::<Chunk>() + c.terms.len() * term).sum();
    let meta = meta.0.len() + meta.1.as_ref().map_or(0, String::len) + meta.2.as_ref().map_or(0, String::len);
    crate::lru::contents_bytes(contents)
        + meta
        + chunked.head.capacity()
        + chunked.token_ends.capacity() * size_of::<u32>()
        + chunks
        + chunked.fields.len() * term
        + vector_bytes(chunked.chunks.len())
        + 2 * crate::lru::ITEM_OVERHEAD
}

/// What the chunks' embeddings will take once made (counted from the start, so that the bound
/// holds whenever the background embedder gets to them).
#[cfg(feature = "semantic")]
fn vector_bytes(chunks: usize) -> usize {
    super::semantic::ChunkVectors::bytes(chunks)
}

#[cfg(not(feature = "semantic"))]
fn vector_bytes(_chunks: usize) -> usize {
    0
}

impl std::fmt::Debug for ChunkIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let e = self.lock();
        f.debug_struct("ChunkIndex")
            .field("chunk_tokens", &self.chunk_tokens)
            .field("len", &e.map.len())
            .field("bytes", &e.bytes)
            .field("max_bytes", &e.max)
            .finish()
    }
}

static USE_CLOCK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl ChunkIndex {
    /// An empty index cutting chunks of `chunk_tokens` tokens, `overlap`
    /// shared with the neighbour (at most half a chunk), keeping at most
    /// about [`DEFAULT_CHUNK_INDEX_MAX_BYTES`](DEFAULT_CHUNK_INDEX_MAX_BYTES)
    /// (see [`ChunkIndex::with_max_bytes`]).
    pub fn new(chunk_tokens: usize, overlap: usize) -> Self {
        let chunk_tokens = chunk_tokens.max(1);
        let entries = Entries { max: DEFAULT_CHUNK_INDEX_MAX_BYTES, ..Entries::default() };
        ChunkIndex {
            chunk_tokens,
            overlap: overlap.min(chunk_tokens / 2),
            entries: Mutex::new(entries),
            semantic: None,
        }
    }

    /// The same index ranking by BM25 and the built-in embedding model together (`Some`), its
    /// content versions embedded in the background as they are kept; `None` (the default of
    /// [`ChunkIndex::new`]) ranks by BM25 alone. Without the `semantic` feature there is no model,
    /// and this changes nothing.
    #[must_use]
    pub fn with_semantic(mut self, semantic: Option<SemanticSettings>) -> Self {
        // The model is loaded on first use (about 50 MB, a few tenths of a second): a one-shot
        // command that never ranks by relevance never pays for it; `serve` loads it at start
        // ([`ChunkIndex::load_model`]) so that no request does.
        self.semantic = semantic.filter(|_| cfg!(feature = "semantic"));
        self
    }

    /// Loads the embedding model now if this index ranks with it (once per process).
    pub(crate) fn load_model(&self) {
        #[cfg(feature = "semantic")]
        if self.semantic.is_some() {
            super::semantic::load();
        }
    }

    /// Hybrid ranking's settings, when it is on (and built in).
    pub(crate) fn semantic(&self) -> Option<SemanticSettings> {
        self.semantic
    }

    /// The same index keeping at most about `max_bytes` (an estimate: see
    /// the type's docs); `0` keeps nothing.
    #[must_use]
    pub fn with_max_bytes(self, max_bytes: usize) -> Self {
        self.lock().max = max_bytes;
        self
    }

    /// Number of resources whose chunks are kept.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// True when nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Approximate bytes kept, all entries together (see the type's docs).
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The chunks of this resource's contents if they were cut already.
    pub(crate) fn peek(&self, tok: &Tokenizer, resource: &Resource, contents: &Arc<Contents>) -> Option<Arc<Chunked>> {
        let key = (Arc::as_ptr(contents) as usize, tok.encoding());
        let mut entries = self.lock();
        let e = entries
            .map
            .get_mut(&key)
            .filter(|e| std::ptr::eq(e.contents.as_ptr(), Arc::as_ptr(contents)) && e.shows(resource))?;
        e.used = USE_CLOCK.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(e.chunked.clone())
    }

    /// Chunks and indexes this resource's contents now if they were not
    /// yet (a request does it for what it finds missing; this is for
    /// warming an index ahead of requests, and for the benchmarks).
    pub fn prepare(&self, tok: &Tokenizer, resource: &Resource, contents: &Arc<Contents>) {
        self.get(tok, resource, contents);
    }

    /// The chunks of this resource's contents, cut now if they were not yet.
    pub(crate) fn get(&self, tok: &Tokenizer, resource: &Resource, contents: &Arc<Contents>) -> Arc<Chunked> {
        if let Some(c) = self.peek(tok, resource, contents) {
            return c;
        }
        let chunked = Arc::new(self.chunk(tok, resource, contents));
        self.insert(tok, resource, contents, chunked.clone());
        chunked
    }

    /// Chunk size and overlap, in tokens.
    #[cfg(feature = "redis")]
    pub(crate) fn params(&self) -> (usize, usize) {
        (self.chunk_tokens, self.overlap)
    }

    /// Keeps `chunked` as the chunks of this resource's contents (cut here,
    /// or by another replica and checked against the same head), then
    /// brings the index back under its bounds. Chunks larger than the byte
    /// bound are not kept.
    pub(crate) fn insert(&self, tok: &Tokenizer, resource: &Resource, contents: &Arc<Contents>, chunked: Arc<Chunked>) {
        let now = USE_CLOCK.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let meta = (resource.name.clone(), resource.title.clone(), resource.mime_type.clone());
        let bytes = entry_bytes(contents, &meta, &chunked);
        let key = (Arc::as_ptr(contents) as usize, tok.encoding());
        let mut guard = self.lock();
        let entries = &mut *guard;
        if let Some(old) = entries.map.remove(&key) {
            entries.bytes -= old.bytes;
        }
        // Entries whose contents are gone can never be hit again: they go first.
        let mut freed = 0;
        entries.map.retain(|_, e| {
            let alive = e.contents.strong_count() > 0;
            if !alive {
                freed += e.bytes;
            }
            alive
        });
        entries.bytes -= freed;
        if bytes > entries.max {
            return;
        }
        entries.bytes += bytes;
        #[cfg(feature = "semantic")]
        if self.semantic.is_some() && chunked.vectors.get().is_none() && !super::semantic::fill_known(&chunked) {
            super::semantic::enqueue(&chunked);
        }
        entries.map.insert(key, Entry { contents: Arc::downgrade(contents), meta, chunked, bytes, used: now });
        // Past the count, the least recently used half goes (the resources
        // of the current requests stay, not versions replaced long ago);
        // past the bytes, the least recently used down to 7/8 of the bound.
        if entries.map.len() > INDEX_LIMIT {
            let half = entries.map.len() / 2;
            entries.drop_oldest(half, |_| 1);
        }
        if entries.bytes > entries.max {
            let excess = entries.bytes - crate::lru::low_water(entries.max);
            entries.drop_oldest(excess, |e| e.bytes);
        }
    }

    /// Cuts one resource (CPU-bound): the body is encoded once, and both
    /// the splitter's sizes and the chunks' token counts are read off that.
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
        // Encode the head once: when the opening line and the body count
        // apart exactly (see `Chunked::whole_tokens_at_least`), the head's
        // tokens are the line's then the body's.
        let (open_tokens, token_ends) = if tok.is_additive() && !body.starts_with(['\n', '\r', '/']) {
            let mut ends = tok.token_ends(&head);
            let open = ends.partition_point(|&e| (e as usize) <= body_start);
            debug_assert_eq!(open, tok.count(&head[..body_start]));
            ends.drain(..open);
            ends.iter_mut().for_each(|e| *e -= body_start as u32);
            (open, ends)
        } else {
            (tok.count(&head[..body_start]), tok.token_ends(body))
        };
        let sizer = OffsetSizer { body, ends: &token_ends, tok: *tok };
        let config = ChunkConfig::new(self.chunk_tokens)
            .with_sizer(sizer)
            .with_overlap(self.overlap)
            .expect("overlap is at most half the chunk size");
        let ranges: Vec<(usize, usize)> = if markdown {
            MarkdownSplitter::new(config).chunk_indices(body).map(|(o, s)| (o, o + s.len())).collect()
        } else {
            TextSplitter::new(config).chunk_indices(body).map(|(o, s)| (o, o + s.len())).collect()
        };
        // Terms of the body once, then each chunk takes those in its range
        // (neighbours overlap: their shared words are analysed once).
        let mut all: Vec<(u32, u64)> = Vec::with_capacity(body.len() / 5);
        terms::each(body, |at, t| all.push((at as u32, t)));
        let mut scratch = Vec::new();
        let chunks = ranges
            .into_iter()
            .map(|(start, end)| {
                let a = all.partition_point(|(at, _)| (*at as usize) < start);
                let b = all.partition_point(|(at, _)| (*at as usize) < end);
                scratch.clear();
                scratch.extend(all[a..b].iter().map(|(_, t)| *t));
                let terms = terms::tally(&mut scratch).into_boxed_slice();
                let tokens = tokens_between(&token_ends, start, end).max(1);
                Chunk { start, end, tokens, len: (b - a) as u32, terms }
            })
            .collect();
        let name = match resource.title.as_deref() {
            Some(t) if t != resource.name => format!("{}\n{t}", resource.name),
            _ => resource.name.clone(),
        };
        Chunked {
            open_tokens,
            chunks,
            token_ends,
            fields: terms::counts(&name).into_boxed_slice(),
            body_start,
            head,
            #[cfg(feature = "semantic")]
            vectors: Default::default(),
        }
    }
}
