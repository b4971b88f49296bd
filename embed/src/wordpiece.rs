//! The model's tokenizer: BERT's uncased normalisation and pre-tokenisation, then WordPiece over the
//! model's vocabulary (embed/model/vocab.txt), as its tokenizer.json says (`BertNormalizer` with
//! clean_text, Chinese characters split, accents stripped, lower-cased; `BertPreTokenizer`; `WordPiece`
//! with `##` continuations, `[UNK]` for a word it cannot cut or longer than 100 characters).
//!
//! Unicode's general categories are not in the standard library: "control" is `char::is_control`
//! plus the usual format characters, "punctuation" is ASCII's plus the punctuation blocks (Latin-1,
//! General Punctuation, CJK, full-width); a symbol outside those stays inside its word, where BERT's
//! own tables would split it. Imports nothing of the crate.

use std::collections::HashMap;

use unicode_normalization::UnicodeNormalization;
use unicode_normalization::char::is_combining_mark;

/// Longest word cut into pieces; a longer one is `[UNK]`.
const MAX_WORD_CHARS: usize = 100;

/// The vocabulary and the ids the encoder needs.
pub(crate) struct WordPiece {
    vocab: HashMap<&'static str, u32>,
    pub(crate) cls: u32,
    pub(crate) sep: u32,
    unk: u32,
}

impl WordPiece {
    /// The vocabulary of `text`: one token a line, the line number its id.
    pub(crate) fn new(text: &'static str) -> WordPiece {
        let vocab: HashMap<&'static str, u32> = text.lines().enumerate().map(|(i, t)| (t, i as u32)).collect();
        let id = |t: &str| *vocab.get(t).expect("the model's vocabulary has BERT's special tokens");
        let (cls, sep, unk) = (id("[CLS]"), id("[SEP]"), id("[UNK]"));
        WordPiece { vocab, cls, sep, unk }
    }

    /// The ids of `text`'s pieces (no `[CLS]`/`[SEP]`), at most `max` of them (the first).
    pub(crate) fn ids(&self, text: &str, max: usize) -> Vec<u32> {
        let mut out = Vec::new();
        let mut word = String::new();
        let flush = |word: &mut String, out: &mut Vec<u32>| {
            if !word.is_empty() {
                self.pieces(word, out);
                word.clear();
            }
        };
        for c in normalise(text) {
            if out.len() >= max {
                break;
            }
            if c.is_whitespace() {
                flush(&mut word, &mut out);
            } else if is_punctuation(c) || is_cjk(c) {
                flush(&mut word, &mut out);
                let mut b = [0; 4];
                self.pieces(c.encode_utf8(&mut b), &mut out);
            } else {
                word.push(c);
            }
        }
        flush(&mut word, &mut out);
        out.truncate(max);
        out
    }

    /// One word's pieces, greedy longest match first, or `[UNK]`.
    fn pieces(&self, word: &str, out: &mut Vec<u32>) {
        if word.chars().count() > MAX_WORD_CHARS {
            out.push(self.unk);
            return;
        }
        let at = out.len();
        let mut start = 0;
        let mut piece = String::new();
        while start < word.len() {
            let mut end = word.len();
            let found = loop {
                piece.clear();
                if start > 0 {
                    piece.push_str("##");
                }
                piece.push_str(&word[start..end]);
                if let Some(&id) = self.vocab.get(piece.as_str()) {
                    break Some(id);
                }
                end = match word[start..end].char_indices().next_back() {
                    Some((i, _)) if i > 0 => start + i,
                    _ => break None,
                };
            };
            let Some(id) = found else {
                out.truncate(at);
                out.push(self.unk);
                return;
            };
            out.push(id);
            start = end;
        }
    }
}

/// BERT's normalisation, character by character: control characters dropped, whitespace made a
/// space, lower-cased, accents stripped (NFD, combining marks dropped).
fn normalise(text: &str) -> impl Iterator<Item = char> + '_ {
    text.chars()
        .filter(|&c| c != '\0' && c != '\u{fffd}' && (!is_control(c) || c.is_whitespace()))
        .map(|c| if c.is_whitespace() { ' ' } else { c })
        .flat_map(char::to_lowercase)
        .nfd()
        .filter(|&c| !is_combining_mark(c))
}

fn is_control(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2064}' | '\u{feff}')
}

fn is_punctuation(c: char) -> bool {
    c.is_ascii_punctuation()
        || matches!(c,
            '\u{a1}' | '\u{a7}' | '\u{ab}' | '\u{b6}' | '\u{b7}' | '\u{bb}' | '\u{bf}'
            | '\u{2010}'..='\u{2027}' | '\u{2030}'..='\u{205e}'
            | '\u{3001}'..='\u{3003}' | '\u{3008}'..='\u{3011}' | '\u{3014}'..='\u{301f}'
            | '\u{ff01}'..='\u{ff0f}' | '\u{ff1a}'..='\u{ff20}' | '\u{ff3b}'..='\u{ff40}' | '\u{ff5b}'..='\u{ff65}')
}

/// The CJK ideographs BERT puts apart, each a word.
fn is_cjk(c: char) -> bool {
    matches!(c,
        '\u{4e00}'..='\u{9fff}' | '\u{3400}'..='\u{4dbf}' | '\u{20000}'..='\u{2a6df}' | '\u{2a700}'..='\u{2b73f}'
        | '\u{2b740}'..='\u{2b81f}' | '\u{2b820}'..='\u{2ceaf}' | '\u{f900}'..='\u{faff}' | '\u{2f800}'..='\u{2fa1f}')
}
