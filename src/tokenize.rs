//! Token counting: a model's encoding ([`Tokenizer`]) and counts
//! remembered by content ([`TokenCache`]).
//!
//! The tokenizer layer: imports only the bottom (errors).

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Mutex, MutexGuard, PoisonError};

use tiktoken_rs::tokenizer::{Tokenizer as Encoding, get_tokenizer};
use tiktoken_rs::{CoreBPE, Rank};

use crate::error::quote;

/// How many counts a [`TokenCache`] holds before it forgets them all.
pub(crate) const TOKEN_CACHE_LIMIT: usize = 100_000;

/// The token encoding of a model. Cheap to copy: the encoder tables are
/// process-wide singletons loaded on first use.
#[derive(Clone, Copy)]
pub struct Tokenizer {
    pub(crate) bpe: &'static CoreBPE,
    encoding: &'static str,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Tokenizer").field(&self.encoding).finish()
    }
}

impl Tokenizer {
    /// The encoding tiktoken uses for `model`. An unknown model (a local or
    /// future one) falls back to `o200k_base`, the encoding of current OpenAI
    /// models, and returns a warning to show, since counts may then be off.
    pub fn for_model(model: &str) -> (Tokenizer, Option<String>) {
        match get_tokenizer(model) {
            Some(encoding) => (Self::from_encoding(encoding), None),
            None => (
                Self::from_encoding(Encoding::O200kBase),
                Some(format!(
                    "unknown model {}: counting tokens with o200k_base; counts may differ from the model's",
                    quote(model)
                )),
            ),
        }
    }

    fn from_encoding(encoding: Encoding) -> Tokenizer {
        use tiktoken_rs::{
            cl100k_base_singleton, o200k_base_singleton, o200k_harmony_singleton, p50k_base_singleton,
            p50k_edit_singleton, r50k_base_singleton,
        };
        let (bpe, encoding) = match encoding {
            Encoding::O200kHarmony => (o200k_harmony_singleton(), "o200k_harmony"),
            Encoding::O200kBase => (o200k_base_singleton(), "o200k_base"),
            Encoding::Cl100kBase => (cl100k_base_singleton(), "cl100k_base"),
            Encoding::P50kBase => (p50k_base_singleton(), "p50k_base"),
            Encoding::P50kEdit => (p50k_edit_singleton(), "p50k_edit"),
            Encoding::R50kBase | Encoding::Gpt2 => (r50k_base_singleton(), "r50k_base"),
        };
        Tokenizer { bpe, encoding }
    }

    /// The encoding's tiktoken name: `o200k_base`, `o200k_harmony`,
    /// `cl100k_base`, `p50k_base`, `p50k_edit` or `r50k_base`.
    pub fn encoding(&self) -> &'static str {
        self.encoding
    }

    /// Number of tokens in `text`, encoded as ordinary text: special-token
    /// strings such as `<|endoftext|>` in resources are counted as the plain
    /// text the API will see them as, never as control tokens.
    pub fn count(&self, text: &str) -> usize {
        self.bpe.encode_ordinary(text).len()
    }

    /// The longest prefix of `text` of at most `max_tokens` tokens, cut at a
    /// token boundary (one token earlier while the cut would split a UTF-8
    /// character). Returns `(prefix, kept_tokens, total_tokens)`.
    pub fn truncate(&self, text: &str, max_tokens: usize) -> (String, usize, usize) {
        let tokens = self.bpe.encode_ordinary(text);
        let (kept, len) = self.prefix_len(text, &tokens, max_tokens);
        (text.get(..len).unwrap_or_default().to_owned(), kept, tokens.len())
    }

    /// `(k, bytes)`: the first `k <= max` of `tokens` (the encoding of `text`)
    /// decode to `text[..bytes]`, a char boundary.
    pub(crate) fn prefix_len(&self, text: &str, tokens: &[Rank], max: usize) -> (usize, usize) {
        let mut k = max.min(tokens.len());
        while k > 0 {
            match self.bpe.decode_bytes(&tokens[..k]) {
                Ok(bytes) if text.is_char_boundary(bytes.len()) => return (k, bytes.len()),
                // A split character, or (impossible for our own tokens) an
                // unknown one: keep one token less.
                _ => k -= 1,
            }
        }
        (0, 0)
    }

    /// Byte offset in `text` where each of its tokens ends (encoded as
    /// ordinary text): the token count of any stretch of it, read off
    /// without encoding again.
    pub(crate) fn token_ends(&self, text: &str) -> Vec<u32> {
        let lens = token_lengths(self);
        let mut at = 0u32;
        self.bpe
            .encode_ordinary(text)
            .into_iter()
            .map(|t| {
                at += lens.get(t as usize).copied().unwrap_or(0);
                at
            })
            .collect()
    }

    /// True when counts of pieces cut between `'\n'` and `'<'` add up to the
    /// count of the whole (see the module docs).
    pub(crate) fn is_additive(&self) -> bool {
        matches!(self.encoding, "o200k_base" | "o200k_harmony" | "cl100k_base")
    }
}

/// The byte length of every ordinary token of `tok`'s encoding, by rank:
/// built once per encoding and process (decoding each token once, some
/// milliseconds), so that token offsets cost a table lookup per token.
fn token_lengths(tok: &Tokenizer) -> &'static [u32] {
    static TABLES: Mutex<Vec<(&'static str, &'static [u32])>> = Mutex::new(Vec::new());
    let mut tables = TABLES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, t)) = tables.iter().find(|(e, _)| *e == tok.encoding) {
        return t;
    }
    // Ranks are dense from 0; the largest ordinary vocabulary (o200k) has
    // about 200 000. Stop after a long run of unknown ranks.
    let mut lens = Vec::new();
    let mut misses = 0;
    while misses < 4096 {
        match tok.bpe.decode_bytes(&[lens.len() as Rank]) {
            Ok(b) => {
                misses = 0;
                lens.push(b.len() as u32);
            }
            Err(_) => {
                misses += 1;
                lens.push(0);
            }
        }
    }
    let table: &'static [u32] = Box::leak(lens.into_boxed_slice());
    tables.push((tok.encoding, table));
    table
}

/// Token counts by content, shared across requests and threads, so each
/// distinct resource is tokenised once.
///
/// Keys are a 64-bit SipHash of encoding and text under a per-process random
/// key, so a server cannot craft colliding contents; an accidental collision
/// (about 1 in 10^9 with a full cache) would miscount one entry. Tokenising
/// happens outside the lock. When the cache reaches `TOKEN_CACHE_LIMIT`
/// entries it is emptied: simpler than LRU, and entries are cheap to rebuild.
pub struct TokenCache {
    map: Mutex<HashMap<u64, usize>>,
    hasher: RandomState,
    limit: usize,
}

impl TokenCache {
    /// An empty cache that forgets everything past `limit` counts (tests).
    #[cfg(test)]
    pub(crate) fn with_limit(limit: usize) -> Self {
        TokenCache { limit, ..TokenCache::new() }
    }

    /// An empty cache.
    pub fn new() -> Self {
        TokenCache { map: Mutex::default(), hasher: RandomState::new(), limit: TOKEN_CACHE_LIMIT }
    }

    /// `tok.count(text)`, from the cache when this content was counted before.
    pub fn count(&self, tok: &Tokenizer, text: &str) -> usize {
        let key = self.key(tok, text);
        if let Some(&n) = self.lock().get(&key) {
            return n;
        }
        let n = tok.count(text);
        self.put(key, n);
        n
    }

    /// The count of `text` if it is cached (nothing is tokenised).
    #[cfg(feature = "redis")]
    pub(crate) fn peek(&self, tok: &Tokenizer, text: &str) -> Option<usize> {
        self.lock().get(&self.key(tok, text)).copied()
    }

    /// Remembers `n` as the count of `text`: for counts known without
    /// tokenising here (another replica's, through the shared cache).
    #[cfg(feature = "redis")]
    pub(crate) fn insert(&self, tok: &Tokenizer, text: &str, n: usize) {
        self.put(self.key(tok, text), n);
    }

    fn key(&self, tok: &Tokenizer, text: &str) -> u64 {
        let mut h = self.hasher.build_hasher();
        tok.encoding.hash(&mut h);
        text.hash(&mut h);
        h.finish()
    }

    fn put(&self, key: u64, n: usize) {
        let mut map = self.lock();
        if map.len() >= self.limit {
            map.clear();
        }
        map.insert(key, n);
    }

    /// Number of cached counts.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, usize>> {
        // A panic elsewhere cannot leave a wrong count behind (inserts are
        // whole), so a poisoned map is still good.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for TokenCache {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenCache").field("len", &self.len()).finish()
    }
}
