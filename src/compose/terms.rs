//! Term analysis, the same for chunks, names and queries.
//!
//! Words are Unicode words (UAX #29, `unicode-segmentation`), folded to
//! ASCII (`deunicode`: `é` → `e`, `’` → `'`) and lower-cased; NLTK's English
//! stop words are dropped (`stop-words`) and the rest reduced to their
//! Snowball English stem (`rust-stemmers`): the analysis of the `bm25`
//! crate's English tokenizer, run word by word so each term keeps its
//! offset. A word that joins parts the way identifiers do (`sys.stdout`,
//! `__init__`, `UnboundLocalError`, `HTTPServer`) also gives each part, so a
//! question about `popen` finds `os.popen()`; the whole word is kept as one
//! more term (unstemmed), so the exact identifier still scores highest.
//! Terms are 64-bit hashes (SipHash with fixed keys: the same in every
//! process, so rankings are reproducible).
//!
//! Leaf of the composition layer: imports nothing of this crate.

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
