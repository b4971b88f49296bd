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
//! # Ranking
//!
//! Terms: Unicode words, folded to ASCII and lower-cased, English stop
//! words dropped, Snowball-stemmed; identifiers also split into their parts
//! (`os.popen` gives `os` and `popen`; see [`terms`]). A chunk's terms are
//! its text's, plus its resource's name and title counted [`FIELD_WEIGHT`]
//! times. BM25 with the usual `k1 =` [`K1`] and `b =` [`B`], over the `N`
//! chunks of the resources this user may see (ranking happens after the
//! policy, so what another user may see never changes a score), of which
//! `n(t)` contain the query term `t` of weight `w(t)`, their average length
//! in terms `avgdl`:
//!
//! ```text
//! tf(t,c) = count of t in c + FIELD_WEIGHT · count of t in the name and title
//! idf(t)  = ln(1 + (N − n(t) + 0.5) / (n(t) + 0.5))
//! bm25(c) = Σ_t w(t) · idf(t) · tf(t,c)·(k1+1) / (tf(t,c) + k1·(1 − b + b·len(c)/avgdl))
//! score(c) = bm25(c) · (0.8 + 0.4·p) + 0.01·p
//! ```
//!
//! with `p` the resource's `annotations.priority` (0.5 when absent).
//! Priority scales the relevance by ±20% and, when relevance ties (as with
//! no matching term at all), decides alone. Forced resources (a selection
//! or `@server:uri` mentions) rank before everything else: first the best
//! chunk of each (so each mentioned resource gets in while any chunk of it
//! fits), then their other chunks; remaining ties go to resource order,
//! then to document order.
//!
//! # The query
//!
//! [`ContextRequest::query`](crate::ContextRequest::query) when given
//! (weight 1); otherwise from the chat request: the latest user message has
//! weight 1, and the [`EARLIER_TURNS`] user turns before it
//! [`EARLIER_TURN_WEIGHT`], its square, its cube (the conversation's topic
//! still counts, the current question counts most). A term in several turns
//! takes its highest weight.
//!
//! The query keeps at most [`MAX_QUERY_BYTES`] of user text: the newest
//! turn's last bytes first, then what is left of the budget from the end of
//! each earlier turn, cut on a character boundary. Ranking costs about 0.6 s
//! of CPU per MB of query text, and a caller could send megabytes; the end of
//! a conversation is what it asks now.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_openai::types::chat::{
    ChatCompletionRequestMessage, ChatCompletionRequestUserMessageContent, ChatCompletionRequestUserMessageContentPart,
    CreateChatCompletionRequest,
};
use serde::{Deserialize, Serialize};
use text_splitter::{ChunkConfig, MarkdownSplitter, TextSplitter};

use crate::budget::{PassageBlock, Passages, TokenCache, Tokenizer, pack_passages};
use crate::context::{Composition, compose};
use crate::render::render_head_into;
use crate::report::{ExcludeReason, Excluded, Included};

/// Default `context.chunk_index_max_bytes` (64 MiB). A content version
/// costs four to six times its text here (the text, the rendered block, four
/// bytes per token, the chunks' term counts), so this holds 10 to 16 MiB of
/// resource text: a few hundred documents of a few tens of KiB. A larger
/// knowledge base in relevance mode wants more, or its least recently used
/// documents are chunked again when next asked for.
pub const DEFAULT_CHUNK_INDEX_MAX_BYTES: usize = 64 << 20;
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
/// Bytes of user text a [`Query`] keeps, all turns together: the last ones,
/// newest turn first (see "The query" in the module docs).
pub const MAX_QUERY_BYTES: usize = 16 * 1024;
/// BM25's term-frequency saturation (the usual value).
pub(crate) const K1: f32 = 1.2;
/// BM25's length normalisation (the usual value).
pub(crate) const B: f32 = 0.75;
/// How much an occurrence in the resource's name or title counts, against
/// one in the chunk's text: a title says what the whole resource is about.
pub(crate) const FIELD_WEIGHT: f32 = 2.0;
/// Entries the chunk index holds, however small, before the least recently
/// used half goes (its byte bound is the one that usually acts).
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
    /// One text of weight 1 (its last [`MAX_QUERY_BYTES`]).
    pub fn text(text: impl Into<String>) -> Query {
        let mut text = text.into();
        let start = text.len() - tail(&text, MAX_QUERY_BYTES).len();
        if start > 0 {
            text = text.split_off(start);
        }
        Query { turns: vec![(text, 1.0)] }
    }

    /// The user turns of a chat request: the latest with weight 1, the
    /// [`EARLIER_TURNS`] before it with [`EARLIER_TURN_WEIGHT`]^k. `None`
    /// when the request has no user text.
    pub fn from_chat(request: &CreateChatCompletionRequest) -> Option<Query> {
        let users = request.messages.iter().rev().filter_map(|m| match m {
            ChatCompletionRequestMessage::User(u) => Some(match &u.content {
                ChatCompletionRequestUserMessageContent::Text(t) => Cow::Borrowed(t.as_str()),
                ChatCompletionRequestUserMessageContent::Array(parts) => Cow::Owned(
                    parts
                        .iter()
                        .filter_map(|p| match p {
                            ChatCompletionRequestUserMessageContentPart::Text(t) => Some(t.text.as_str()),
                            _ => None,
                        })
                        .collect::<Vec<_>>()
                        .join("\n"),
                ),
            }),
            _ => None,
        });
        Self::from_user_turns(users)
    }

    /// [`Query::from_chat`] on a Chat Completions or Responses body held as
    /// generic JSON (what `serve` relays): the same turns, the same weights.
    pub fn from_chat_json(body: &serde_json::Value) -> Option<Query> {
        Self::from_user_turns(crate::inject::user_texts_json(body))
    }

    /// The one weighting of user turns, given newest first, and the one
    /// cap on their text ([`MAX_QUERY_BYTES`], from the end).
    fn from_user_turns<'a>(newest_first: impl Iterator<Item = Cow<'a, str>>) -> Option<Query> {
        let mut left = MAX_QUERY_BYTES;
        let turns: Vec<(String, f32)> = newest_first
            .filter(|t| !t.trim().is_empty())
            .take(EARLIER_TURNS + 1)
            .map_while(|t| {
                let kept = tail(&t, left);
                left -= kept.len();
                (!kept.is_empty()).then(|| kept.to_owned())
            })
            .enumerate()
            .map(|(k, t)| (t, EARLIER_TURN_WEIGHT.powi(k as i32)))
            .collect();
        (!turns.is_empty()).then_some(Query { turns })
    }

    /// A string that is equal for equal queries (for memo keys).
    pub(crate) fn key(&self) -> String {
        self.turns.iter().map(|(t, w)| format!("{w}\u{0}{t}\u{0}")).collect()
    }

    /// Distinct terms with their weight (the highest among the turns that
    /// contain them), sorted by term.
    fn terms(&self) -> Vec<(u64, f32)> {
        let mut terms: HashMap<u64, f32> = HashMap::new();
        for (text, w) in &self.turns {
            terms::each(text, |_, t| {
                let e = terms.entry(t).or_insert(0.0);
                *e = e.max(*w);
            });
        }
        let mut v: Vec<_> = terms.into_iter().collect();
        v.sort_by_key(|(t, _)| *t);
        v
    }
}

/// The last `max` bytes of `text` at most, starting on a character boundary.
fn tail(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

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
fn count_of(terms: &[(u64, u16)], term: u64) -> u16 {
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
    /// opening line and the body count apart exactly (`budget::body_tokens`)
    /// when the encoding is additive and the body does not start with a
    /// newline or `/`; else 0.
    fn whole_tokens_at_least(&self, tok: &Tokenizer) -> usize {
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

/// Term analysis, the same for chunks, names and queries.
///
/// Words are Unicode words (UAX #29, `unicode-segmentation`), folded to
/// ASCII (`deunicode`: `é` → `e`, `’` → `'`) and lower-cased; NLTK's English
/// stop words are dropped (`stop-words`) and the rest reduced to their
/// Snowball English stem (`rust-stemmers`): the analysis of the `bm25`
/// crate's English tokenizer, run word by word so each term keeps its
/// offset. A word that joins parts the way identifiers do (`sys.stdout`,
/// `__init__`, `UnboundLocalError`, `HTTPServer`) also gives each part, so a
/// question about `popen` finds `os.popen()`; the whole word is kept as one
/// more term (unstemmed), so the exact identifier still scores highest.
/// Terms are 64-bit hashes (SipHash with fixed keys: the same in every
/// process, so rankings are reproducible).
mod terms {
    use std::cell::RefCell;
    use std::collections::{HashMap, HashSet};
    use std::hash::{Hash, Hasher};
    use std::sync::LazyLock;

    use rust_stemmers::{Algorithm, Stemmer};
    use unicode_segmentation::UnicodeSegmentation;

    static STEMMER: LazyLock<Stemmer> = LazyLock::new(|| Stemmer::create(Algorithm::English));
    static STOP_WORDS: LazyLock<HashSet<String>> = LazyLock::new(|| {
        stop_words::get(stop_words::LANGUAGE::English).iter().map(|w| deunicode::deunicode(w).to_lowercase()).collect()
    });

    pub(crate) fn id(term: &str) -> u64 {
        let mut h = std::hash::DefaultHasher::new();
        term.hash(&mut h);
        h.finish()
    }

    /// `word` folded to lower-case ASCII into `buf`.
    fn fold(word: &str, buf: &mut String) {
        buf.clear();
        if word.is_ascii() {
            buf.push_str(word);
            buf.make_ascii_lowercase();
        } else {
            let ascii = deunicode::deunicode_with_tofu_cow(word, "");
            buf.extend(ascii.trim().chars().map(|c| c.to_ascii_lowercase()));
        }
    }

    thread_local! {
        /// Folded words seen on this thread and their terms (`None`: a stop
        /// word). Stemming is most of the cost of analysing text, and a
        /// knowledge base repeats a vocabulary of some thousand words.
        static SEEN: RefCell<Seen> = RefCell::default();
    }
    /// Words [`SEEN`] holds before it starts over.
    const SEEN_LIMIT: usize = 100_000;

    /// Folded words by a keyed 64-bit hash of their text (`ahash`, random
    /// per thread: a server cannot aim collisions at it), mapped to their
    /// term.
    #[derive(Default)]
    struct Seen {
        key: ahash::RandomState,
        terms: HashMap<u64, Option<u64>, std::hash::BuildHasherDefault<Identity>>,
    }

    /// The key is a keyed hash already: use it as is.
    #[derive(Default)]
    struct Identity(u64);

    impl Hasher for Identity {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            for b in bytes {
                self.0 = self.0.rotate_left(8) ^ u64::from(*b);
            }
        }
        fn write_u64(&mut self, n: u64) {
            self.0 = n;
        }
    }

    /// The term of a plain word, `None` for a stop word.
    fn term(word: &str, buf: &mut String, seen: &mut Seen) -> Option<u64> {
        fold(word, buf);
        if buf.is_empty() {
            return None;
        }
        let key = seen.key.hash_one(buf.as_bytes());
        if let Some(t) = seen.terms.get(&key) {
            return *t;
        }
        let t = (!STOP_WORDS.contains(buf.as_str())).then(|| id(&STEMMER.stem(buf)));
        if seen.terms.len() >= SEEN_LIMIT {
            seen.terms.clear();
        }
        seen.terms.insert(key, t);
        t
    }

    /// Byte ranges of the parts of an identifier-like word: split at `.`
    /// and `_`, and where a lower-case letter or digit meets an upper-case
    /// one (`localError`), or an upper-case run meets a word (`HTTPServer`).
    fn parts(word: &str, out: &mut Vec<(usize, usize)>) {
        out.clear();
        if word.is_ascii() && !word.bytes().skip(1).any(|b| b == b'.' || b == b'_' || b.is_ascii_uppercase()) {
            out.push((0, word.len()));
            return;
        }
        let mut start = None;
        let mut prev: Option<char> = None;
        let mut chars = word.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            if c == '.' || c == '_' {
                if let Some(s) = start.take() {
                    out.push((s, i));
                }
                prev = None;
                continue;
            }
            let next = chars.peek().map(|(_, n)| *n);
            let cut = match prev {
                Some(p) if c.is_uppercase() => {
                    p.is_lowercase() || p.is_ascii_digit() || (p.is_uppercase() && next.is_some_and(char::is_lowercase))
                }
                _ => false,
            };
            match start {
                Some(s) if cut => {
                    out.push((s, i));
                    start = Some(i);
                }
                None => start = Some(i),
                _ => {}
            }
            prev = Some(c);
        }
        if let Some(s) = start {
            out.push((s, word.len()));
        }
    }

    /// Calls `emit(offset, term)` for each term of `text`, in order.
    pub(super) fn each(text: &str, mut emit: impl FnMut(usize, u64)) {
        SEEN.with_borrow_mut(|seen| {
            if text.is_ascii() { each_ascii(text, seen, &mut emit) } else { each_unicode(text, seen, &mut emit) }
        })
    }

    /// [`each`] by the general path: `unicode-segmentation`'s words, then
    /// [`parts`] and [`term`].
    fn each_unicode(text: &str, seen: &mut Seen, emit: &mut impl FnMut(usize, u64)) {
        let mut buf = String::new();
        let mut ranges = Vec::new();
        for (at, word) in text.unicode_word_indices() {
            word_terms(at, word, &mut buf, &mut ranges, seen, emit);
        }
    }

    fn word_terms(
        at: usize,
        word: &str,
        buf: &mut String,
        ranges: &mut Vec<(usize, usize)>,
        seen: &mut Seen,
        emit: &mut impl FnMut(usize, u64),
    ) {
        parts(word, ranges);
        for &(a, b) in ranges.iter() {
            if let Some(t) = term(&word[a..b], buf, seen) {
                emit(at + a, t);
            }
        }
    }

    /// Letters, digits and `_`: what an ASCII word is made of.
    const CORE: u8 = 1;
    /// Letters and digits: a word needs one.
    const ALNUM: u8 = 2;
    /// `_`, `.` or a capital after a word's first byte: split it into parts.
    const SPLIT: u8 = 4;

    /// [`CORE`], [`ALNUM`] and [`SPLIT`] of each byte (one lookup per byte
    /// in [`each_ascii`]'s loop).
    static CLASS: [u8; 256] = {
        let mut t = [0u8; 256];
        let mut b = 0;
        while b < 128 {
            let c = b as u8;
            if c.is_ascii_alphanumeric() {
                t[b] = CORE | ALNUM;
            }
            if c == b'_' {
                t[b] = CORE | SPLIT;
            }
            if c.is_ascii_uppercase() {
                t[b] |= SPLIT;
            }
            b += 1;
        }
        t
    };

    /// `b` between `prev` and `next` stays inside a word (UAX #29 WB6/7,
    /// WB11/12 on ASCII: `3.14`, `1,000`, `e.g`, `don't`, `a:b`).
    fn is_infix(b: u8, prev: u8, next: u8) -> bool {
        match b {
            b'.' | b',' | b';' | b'\'' if prev.is_ascii_digit() && next.is_ascii_digit() => true,
            b'\'' | b'.' | b':' if prev.is_ascii_alphabetic() && next.is_ascii_alphabetic() => true,
            _ => false,
        }
    }

    /// [`each`] on ASCII text in one pass, the same terms as
    /// [`each_unicode`] (test `ascii_path_agrees_with_the_unicode_one`):
    /// words are found as `unicode-segmentation` finds them in ASCII (its
    /// own ASCII rules, here fused with the rest), and a plain word (no
    /// `.`, `_` or capital after its first letter, which most are) is
    /// looked up by its own bytes, without splitting or folding it first.
    /// Chunking is most of the cost of a cold request besides tokenising,
    /// and this was the largest part of it (issue 15).
    fn each_ascii(text: &str, seen: &mut Seen, emit: &mut impl FnMut(usize, u64)) {
        let bytes = text.as_bytes();
        let len = bytes.len();
        let (mut buf, mut ranges) = (String::new(), Vec::new());
        let mut i = 0;
        while i < len {
            let first = CLASS[bytes[i] as usize];
            if first & CORE == 0 {
                i += 1;
                continue;
            }
            let start = i;
            // The first byte's own SPLIT does not count (see `parts`).
            let mut class = first & !SPLIT;
            i += 1;
            while i < len {
                let b = bytes[i];
                let c = CLASS[b as usize];
                if c & CORE != 0 {
                    class |= c;
                } else if i + 1 < len && is_infix(b, bytes[i - 1], bytes[i + 1]) {
                    if b == b'.' {
                        class |= SPLIT;
                    }
                } else {
                    break;
                }
                i += 1;
            }
            if class & ALNUM == 0 {
                continue;
            }
            let word = &text[start..i];
            if class & SPLIT == 0 {
                if let Some(t) = plain_term(word, &mut buf, seen) {
                    emit(start, t);
                }
            } else {
                word_terms(start, word, &mut buf, &mut ranges, seen, emit);
            }
        }
    }

    /// [`term`] of an ASCII word that is its own only part: memoised under
    /// the word as written, so a word seen before costs one hash and one
    /// lookup. (A written form and its folded form map to the same term,
    /// so both keys may stand in [`Seen`].)
    fn plain_term(word: &str, buf: &mut String, seen: &mut Seen) -> Option<u64> {
        let key = seen.key.hash_one(word.as_bytes());
        if let Some(t) = seen.terms.get(&key) {
            return *t;
        }
        let t = term(word, buf, seen);
        if seen.terms.len() >= SEEN_LIMIT {
            seen.terms.clear();
        }
        seen.terms.insert(key, t);
        t
    }

    /// `(term, count)` of `text`, sorted by term.
    pub(super) fn counts(text: &str) -> Vec<(u64, u16)> {
        let mut all = Vec::new();
        each(text, |_, t| all.push(t));
        tally(&mut all)
    }

    /// `(term, count)` of a list of terms (sorted in place), sorted by term.
    pub(super) fn tally(terms: &mut [u64]) -> Vec<(u64, u16)> {
        terms.sort_unstable();
        let mut out: Vec<(u64, u16)> = Vec::new();
        for &t in terms.iter() {
            match out.last_mut() {
                Some((last, n)) if *last == t => *n = n.saturating_add(1),
                _ => out.push((t, 1)),
            }
        }
        out
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn split(word: &str) -> Vec<&str> {
            let mut v = Vec::new();
            parts(word, &mut v);
            v.into_iter().map(|(a, b)| &word[a..b]).collect()
        }

        #[test]
        fn identifiers_split_into_parts() {
            assert_eq!(split("sys.stdout"), ["sys", "stdout"]);
            assert_eq!(split("__init__"), ["init"]);
            assert_eq!(split("UnboundLocalError"), ["Unbound", "Local", "Error"]);
            assert_eq!(split("HTTPServer"), ["HTTP", "Server"]);
            assert_eq!(split("utf8Decode"), ["utf8", "Decode"]);
            assert_eq!(split("don't"), ["don't"]);
            assert_eq!(split("Python"), ["Python"]);
        }

        /// `(offset, term)` in order.
        type Terms = Vec<(usize, u64)>;

        /// The terms of `text` by [`each_ascii`] and by [`each_unicode`].
        fn both_paths(text: &str) -> (Terms, Terms) {
            let (mut fast, mut general) = (Vec::new(), Vec::new());
            SEEN.with_borrow_mut(|seen| {
                each_ascii(text, seen, &mut |at, t| fast.push((at, t)));
                each_unicode(text, seen, &mut |at, t| general.push((at, t)));
            });
            (fast, general)
        }

        #[test]
        fn ascii_path_agrees_on_word_edges() {
            for text in [
                "3.14 1,000 e.g. don't a:b x'y 1'2 a.1 1.a _ __ _x x_ __init__ a__b os.popen() Ab.cD",
                "sys.stdout HTTPServer UnboundLocalError _SomeClassName__spam utf8Decode a\r\nb ...a.. ,1, 'a' :a:",
                "end.",
                ".start",
            ] {
                let (fast, general) = both_paths(text);
                assert_eq!(fast, general, "{text:?}");
            }
        }

        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
            #[test]
            fn ascii_path_agrees_with_the_unicode_one(
                text in prop::collection::vec(prop::sample::select(vec![
                    "a", "B", "z", "Q", "0", "9", ".", ",", ";", ":", "'", "_", " ", "\n", "\r", "-", "(", "/",
                    "the", "The", "Penguins", "don't", "os", "HTTP", "Server", "x1", "\t", "\"",
                ]), 0..40).prop_map(|v: Vec<&str>| v.concat())
            ) {
                let (fast, general) = both_paths(&text);
                prop_assert_eq!(fast, general);
            }
        }

        #[test]
        fn words_are_folded_stemmed_and_stop_words_dropped() {
            let all = |text: &str| {
                let mut v = Vec::new();
                each(text, |at, t| v.push((at, t)));
                v
            };
            let stem = |w: &str| id(&STEMMER.stem(w));
            assert_eq!(all("The migrating Pénguins"), [(4, stem("migrate")), (14, stem("penguin"))]);
            assert_eq!(all("migrate"), all("MIGRATES").iter().map(|(_, t)| (0, *t)).collect::<Vec<_>>());
            // An identifier gives its parts.
            assert_eq!(all("os.popen()"), [(0, stem("os")), (3, stem("popen"))]);
            let terms = |text: &str| all(text).into_iter().map(|(_, t)| t).collect::<Vec<_>>();
            assert_eq!(terms("_SomeClassName__spam"), [stem("class"), stem("name"), stem("spam")]);
            assert!(counts("the and of").is_empty());
        }
    }
}

/// Chunks and their terms by content, shared across requests: built once
/// per content version. Keyed by the address of the contents' `Arc`, which
/// the entry keeps alive (so the address cannot be reused by other contents
/// while the entry exists), with the encoding and the listing metadata the
/// block shows checked on every hit.
///
/// Bounded in bytes (`context.chunk_index_max_bytes`, default
/// [`DEFAULT_CHUNK_INDEX_MAX_BYTES`](crate::DEFAULT_CHUNK_INDEX_MAX_BYTES)),
/// and to 8192 entries: past the bytes, the least recently used content
/// versions go until 7/8 of the bound is left; past the count, the least
/// recently used half. An entry's bytes are an estimate: the contents it
/// keeps alive (counted whole, though the content cache may hold the same
/// `Arc`: once that cache drops it, as it does a `private` answer past its
/// own bound, this entry is its only holder), the rendered block, the token
/// offsets, the chunks and their term counts, and a fixed cost per item.
/// Contents larger than the bound are chunked for the request that
/// needs them and not kept.
pub struct ChunkIndex {
    chunk_tokens: usize,
    overlap: usize,
    entries: Mutex<Entries>,
}

/// What the index keeps, and its byte count.
#[derive(Default)]
struct Entries {
    map: HashMap<(usize, &'static str), Entry>,
    /// Sum of the entries' `bytes`.
    bytes: usize,
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

struct Entry {
    contents: Arc<Contents>,
    meta: (String, Option<String>, Option<String>),
    chunked: Arc<Chunked>,
    /// Approximate bytes kept ([`entry_bytes`]).
    bytes: usize,
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
        + 2 * crate::lru::ITEM_OVERHEAD
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
    /// about [`DEFAULT_CHUNK_INDEX_MAX_BYTES`](crate::DEFAULT_CHUNK_INDEX_MAX_BYTES)
    /// (see [`ChunkIndex::with_max_bytes`]).
    pub fn new(chunk_tokens: usize, overlap: usize) -> Self {
        let chunk_tokens = chunk_tokens.max(1);
        let entries = Entries { max: DEFAULT_CHUNK_INDEX_MAX_BYTES, ..Entries::default() };
        ChunkIndex { chunk_tokens, overlap: overlap.min(chunk_tokens / 2), entries: Mutex::new(entries) }
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

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The chunks of this resource's contents if they were cut already.
    pub(crate) fn peek(&self, tok: &Tokenizer, resource: &Resource, contents: &Arc<Contents>) -> Option<Arc<Chunked>> {
        let key = (Arc::as_ptr(contents) as usize, tok.encoding());
        let mut entries = self.lock();
        let e = entries.map.get_mut(&key).filter(|e| Arc::ptr_eq(&e.contents, contents) && e.shows(resource))?;
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
        if bytes > entries.max {
            return;
        }
        entries.bytes += bytes;
        entries.map.insert(key, Entry { contents: contents.clone(), meta, chunked, bytes, used: now });
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
        Chunked { open_tokens, chunks, token_ends, fields: terms::counts(&name).into_boxed_slice(), body_start, head }
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
        // Packing by priority renders every visible resource; when the
        // chunk index already shows that the blocks alone exceed the
        // budget, it could not fit, so skip it (the warm path of a large
        // knowledge base). Otherwise try it: it is the answer if it fits.
        SelectMode::Auto if !exceeds(tok, index, items, budget) => {
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
    let composition = compose_relevant(tok, cache, index, preamble, budget, items, query);
    Composed { composition, mode: SelectMode::Relevance, warnings }
}

/// True when the resources already in `index` need more than `budget`
/// tokens whole, by [`Chunked::whole_tokens_at_least`] (a lower bound, so
/// `true` means that packing by priority would cut or drop something).
fn exceeds(tok: &Tokenizer, index: &ChunkIndex, items: &[Candidate<'_>], budget: usize) -> bool {
    let mut at_least = 0;
    for c in items {
        if let Some(chunked) = index.peek(tok, c.resource, c.contents) {
            at_least += chunked.whole_tokens_at_least(tok);
            if at_least > budget {
                return true;
            }
        }
    }
    false
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
    // Document frequencies and the average length over the visible chunks only.
    let n: usize = chunked.iter().map(|c| c.chunks.len()).sum();
    let total_len: u64 = chunked.iter().flat_map(|c| &c.chunks).map(|c| u64::from(c.len)).sum();
    let avgdl = (total_len as f32 / n.max(1) as f32).max(1.0);
    let tf = |c: &Chunked, chunk: &Chunk, t: u64| -> f32 {
        f32::from(count_of(&chunk.terms, t)) + FIELD_WEIGHT * f32::from(count_of(&c.fields, t))
    };
    let idf: Vec<f32> = terms
        .iter()
        .map(|(t, _)| {
            let df = chunked
                .iter()
                .flat_map(|c| c.chunks.iter().map(move |k| (c, k)))
                .filter(|(c, k)| tf(c, k, *t) > 0.0)
                .count() as f32;
            (1.0 + (n as f32 - df + 0.5) / (df + 0.5)).ln()
        })
        .collect();
    let (k1, b) = (K1, B);
    let mut ranked: Vec<(usize, usize, f32)> = Vec::with_capacity(n);
    for (r, (c, item)) in chunked.iter().zip(items).enumerate() {
        let p = item.resource.annotations.priority.unwrap_or(crate::context::DEFAULT_PRIORITY);
        for (k, chunk) in c.chunks.iter().enumerate() {
            let norm = k1 * (1.0 - b + b * chunk.len as f32 / avgdl);
            let bm25: f32 = terms
                .iter()
                .zip(&idf)
                .map(|((t, w), idf)| {
                    let f = tf(c, chunk, *t);
                    if f > 0.0 { w * idf * f * (k1 + 1.0) / (f + norm) } else { 0.0 }
                })
                .sum();
            ranked.push((r, k, bm25 * (0.8 + 0.4 * p) + 0.01 * p));
        }
    }
    // Each forced resource's best chunk first (so every mentioned resource
    // gets in while anything of it fits), then their other chunks, then the
    // rest, each by score.
    let mut best: Vec<Option<(usize, f32)>> = vec![None; items.len()];
    for &(r, k, score) in &ranked {
        if best[r].is_none_or(|(_, s)| score > s) {
            best[r] = Some((k, score));
        }
    }
    let rank = |&(r, k, _): &(usize, usize, f32)| {
        let forced = items[r].forced;
        (forced && best[r].is_some_and(|(b, _)| b == k), forced)
    };
    ranked.sort_by(|a, b| rank(b).cmp(&rank(a)).then(b.2.total_cmp(&a.2)).then(a.0.cmp(&b.0)).then(a.1.cmp(&b.1)));
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
        // With every resource already chunked, `auto` decides from the index
        // without packing by priority first: the same answer at the edge.
        let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP);
        let cache = TokenCache::new();
        let it = items(&v, &[]);
        let q = Query::text("penguins");
        let auto = |budget| {
            compose_with_mode(&tok(), &cache, &index, DEFAULT_PREAMBLE, budget, &it, SelectMode::Auto, Some(&q))
        };
        assert_eq!(auto(whole.tokens - 1).mode, SelectMode::Relevance);
        assert_eq!(index.len(), v.len());
        assert!(exceeds(&tok(), &index, &it, whole.tokens - 200));
        assert!(!exceeds(&tok(), &index, &it, whole.tokens));
        let edge = whole.tokens;
        let fits = auto(edge);
        assert_eq!((fits.mode, fits.composition), (SelectMode::Priority, whole));
        assert_eq!(auto(edge - 1).mode, SelectMode::Relevance);
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
    fn every_forced_resource_gets_its_best_chunk_in_first() {
        let v = corpus();
        let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP);
        // Every alpha chunk matches "alpha", none of delta's does; both are
        // mentioned and two chunks fit: one of each, not two of alpha.
        let q = Query::text("alpha notes");
        let c =
            compose_relevant(&tok(), &TokenCache::new(), &index, DEFAULT_PREAMBLE, 700, &items(&v, &[0, 3]), Some(&q));
        let ids: Vec<&str> = c.included.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["kb:doc://alpha", "kb:doc://delta"]);
        // Unforced, alpha's chunks outrank delta's.
        let c = compose_relevant(&tok(), &TokenCache::new(), &index, DEFAULT_PREAMBLE, 700, &items(&v, &[]), Some(&q));
        let ids: Vec<&str> = c.included.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["kb:doc://alpha"]);
    }

    #[test]
    fn a_title_counts_for_every_chunk() {
        // Two documents of the same filler; one is titled with the query's word.
        let mut v = vec![res("doc://a", &doc("plain", 12), None, None), res("doc://b", &doc("plain", 12), None, None)];
        v[1].0.title = Some("Penguin handbook".into());
        let c = run(&v, 400, SelectMode::Relevance, Some("penguin"));
        let scores = |id: &str| -> Vec<f64> {
            let i = c.composition.included.iter().find(|i| i.id == id);
            i.map(|i| i.chunks.as_ref().unwrap().iter().map(|k| k.score).collect()).unwrap_or_default()
        };
        let (a, b) = (scores("kb:doc://a"), scores("kb:doc://b"));
        assert!(!b.is_empty() && b.iter().all(|s| *s > 0.1 && a.iter().all(|a| a < s)), "{a:?} {b:?}");
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
        let term = |w: &str| {
            let mut v = Vec::new();
            terms::each(w, |_, t| v.push(t));
            v[0]
        };
        let (penguin, migrate) = (term("penguins"), term("migrate"));
        let terms = q.terms();
        let w = |t: u64| terms.iter().find(|x| x.0 == t).unwrap().1;
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
            model in prop::sample::select(vec!["gpt-4o", "gpt-4", "davinci"]),
        ) {
            // o200k and cl100k count by pieces; r50k recounts the message.
            let t = Tokenizer::for_model(model).0;
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

#[cfg(test)]
mod query_cap {
    use serde_json::json;

    use super::*;

    fn lens(q: &Query) -> Vec<(usize, f32)> {
        q.turns.iter().map(|(t, w)| (t.len(), *w)).collect()
    }

    #[test]
    fn a_query_keeps_the_last_bytes_of_the_newest_turns() {
        let older = format!("{}OLDEST-END", "a ".repeat(5_000));
        let newest = format!("NEWEST-START {}", "b ".repeat(5_000));
        let body = json!({"messages": [
            {"role": "user", "content": "the first turn, past the cap"},
            {"role": "user", "content": older},
            {"role": "assistant", "content": "x"},
            {"role": "user", "content": newest},
        ]});
        let q = Query::from_chat_json(&body).unwrap();
        // The newest turn whole, the end of the one before, nothing older.
        assert_eq!(lens(&q), [(newest.len(), 1.0), (MAX_QUERY_BYTES - newest.len(), 0.5)]);
        assert!(q.turns[0].0.starts_with("NEWEST-START") && q.turns[1].0.ends_with("OLDEST-END"));
        assert_eq!(q.turns.iter().map(|(t, _)| t.len()).sum::<usize>(), MAX_QUERY_BYTES);
    }

    #[test]
    fn one_long_turn_is_cut_on_a_character_boundary_from_its_end() {
        // 3-byte characters: 16384 is not a multiple of 3.
        let text = format!("START{}", "€".repeat(100_000));
        let q = Query::from_chat_json(&json!({"input": text})).unwrap();
        assert_eq!(lens(&q), [(MAX_QUERY_BYTES / 3 * 3, 1.0)]);
        assert!(q.turns[0].0.chars().all(|c| c == '€'));
        assert_eq!(Query::text(text.clone()), q, "a given query is capped the same way");
        assert_eq!(Query::text("short"), Query { turns: vec![("short".into(), 1.0)] });
    }

    #[test]
    fn the_typed_request_and_its_json_give_the_same_capped_query() {
        let big = "word ".repeat(20_000);
        let body = json!({"model": "gpt-4o", "messages": [
            {"role": "user", "content": "earlier"},
            {"role": "user", "content": [{"type": "text", "text": big}, {"type": "text", "text": "tail"}]},
        ]});
        let typed: CreateChatCompletionRequest = serde_json::from_value(body.clone()).unwrap();
        let q = Query::from_chat(&typed).unwrap();
        assert_eq!(Some(q.clone()), Query::from_chat_json(&body));
        assert_eq!(lens(&q), [(MAX_QUERY_BYTES, 1.0)]);
        assert!(q.turns[0].0.ends_with("\ntail"));
    }
}

#[cfg(test)]
mod bound {
    use super::*;
    use crate::id::ResourceId;

    fn tok() -> Tokenizer {
        Tokenizer::for_model("gpt-4o").0
    }

    /// A resource of `kb://{uri}` with `bytes` of varied text: a private
    /// answer read for one user is a new `Arc`, as here.
    fn res(uri: &str, bytes: usize) -> (Resource, Arc<Contents>) {
        let r = Resource::unlisted(ResourceId::new("kb", format!("kb://{uri}")).unwrap());
        let mut text = String::new();
        let mut i = 0;
        while text.len() < bytes {
            text.push_str(&format!("Item {i} of {uri} says the word w{} matters. ", i % 97));
            i += 1;
        }
        let c = Contents { parts: vec![ContentPart::Text { text, mime_type: None }], ..Default::default() };
        (r, Arc::new(c))
    }

    fn one_entry(bytes: usize) -> usize {
        let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP);
        let (r, c) = res("probe", bytes);
        index.prepare(&tok(), &r, &c);
        index.bytes()
    }

    #[test]
    fn an_entry_counts_its_contents_block_offsets_and_chunks() {
        let one = one_entry(32 * 1024);
        eprintln!("one entry of 32 KiB of text: {one} bytes");
        // The text twice (contents and the rendered block), 4 bytes per
        // token, the chunks' terms: several times the text.
        assert!(one > 3 * 32 * 1024, "{one}");
        assert!(one < 12 * 32 * 1024, "{one}");
        assert!(one_entry(64 * 1024) > one * 3 / 2);
    }

    #[test]
    fn the_index_stays_under_its_bytes_least_recently_used_first() {
        let t = tok();
        let one = one_entry(8 * 1024);
        let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP).with_max_bytes(one * 10 + one / 2);
        let v: Vec<_> = (0..10).map(|i| res(&format!("u{i}"), 8 * 1024)).collect();
        for (r, c) in &v {
            index.prepare(&t, r, c);
        }
        // Same length, same words apart from the digits: about the same size.
        assert_eq!(index.len(), 10);
        assert!(index.bytes() <= one * 10 + one / 2, "{} {one}", index.bytes());
        // The first is used again: the most recent now.
        assert!(index.peek(&t, &v[0].0, &v[0].1).is_some());
        let (r, c) = res("u10", 8 * 1024);
        index.prepare(&t, &r, &c);
        assert!(index.bytes() <= crate::lru::low_water(one * 10 + one / 2), "{}", index.bytes());
        assert!(index.peek(&t, &r, &c).is_some(), "the newest: kept");
        assert!(index.peek(&t, &v[0].0, &v[0].1).is_some(), "used lately: kept");
        assert!(index.peek(&t, &v[1].0, &v[1].1).is_none(), "the oldest: gone");
        // Many new versions (a private answer per user): never over the bound.
        let bound = one * 10 + one / 2;
        let mut kept = Vec::new();
        for i in 0..60 {
            let (r, c) = res(&format!("v{i}"), 2 * 1024 + i * 300);
            index.prepare(&t, &r, &c);
            assert!(index.bytes() <= bound, "{} > {bound}", index.bytes());
            kept.push(c);
        }
        // The count is the sum of what is kept, and dropped contents are
        // released (only `kept` holds them now).
        let e = index.lock();
        assert_eq!(e.bytes, e.map.values().map(|e| e.bytes).sum::<usize>());
        drop(e);
        assert!(Arc::strong_count(&v[1].1) == 1);
    }

    #[test]
    fn contents_larger_than_the_bound_are_chunked_but_not_kept() {
        let t = tok();
        let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP).with_max_bytes(one_entry(4096) * 2);
        let (small, sc) = res("small", 4096);
        index.prepare(&t, &small, &sc);
        let (big, bc) = res("big", 64 * 1024);
        let chunked = index.get(&t, &big, &bc);
        assert!(chunked.chunks.len() > 1);
        assert_eq!(index.len(), 1, "the big one is not kept; the small one stays");
        assert!(index.peek(&t, &big, &bc).is_none());
        assert_eq!(Arc::strong_count(&bc), 1);
        let off = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP).with_max_bytes(0);
        assert!(!off.get(&t, &small, &sc).chunks.is_empty());
        assert!(off.is_empty() && off.bytes() == 0);
    }

    #[test]
    fn re_inserting_the_same_contents_replaces_its_count() {
        let t = tok();
        let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP);
        let (r, c) = res("a", 4096);
        let chunked = index.get(&t, &r, &c);
        let once = index.bytes();
        index.insert(&t, &r, &c, chunked);
        assert_eq!((index.len(), index.bytes()), (1, once));
    }
}
