//! Hybrid ranking's arithmetic: BM25 and cosine similarity combined into one score per chunk, by
//! normalised score mixing (the default) or reciprocal rank fusion, and the settings that choose.
//!
//! With `w` the semantic weight (`context.semantic_weight`), `bm25(c)` a chunk's BM25, `M` the
//! highest BM25 among the visible chunks (at least 1), `cos(c)` its cosine similarity with the
//! query:
//!
//! ```text
//! mix: fused(c) = (1 − w)·bm25(c) + w·M·(cos(c) − cos_min) / (cos_max − cos_min)
//! rrf: fused(c) = M·K·((1 − w)/(K + rank_bm25(c)) + w/(K + rank_cos(c)))     K = 60
//! ```
//!
//! (in `rrf`, a chunk with no query term has no BM25 rank, and its term is 0). A chunk with no
//! vector yet (embedding runs in the background) counts its lexical part in place of the semantic
//! one: it ranks lexically. Both forms are in BM25's units, so that priority's share of the final
//! score (see [`super::rank`]) stays what it was, and `w = 0` gives BM25 exactly. Sums run in chunk
//! order on one thread: identical inputs give identical bits.
//!
//! Imports nothing of the crate (plain numbers in, numbers out).

use serde::Deserialize;

/// Reciprocal rank fusion's constant (the usual value).
const RRF_K: f32 = 60.0;
/// Default `context.semantic_weight`: the best measured on tests/data/python-faq at 4000 tokens
/// (tests/all/hybrid.rs; mix at 0.5 / 0.7 / 0.9: 0.977 / 0.983 / 0.989 on the FAQ's own questions,
/// 0.771 / 0.886 / 0.920 on plain words; BM25 alone 0.931 / 0.286, the model alone 0.983 / 0.914).
pub const DEFAULT_SEMANTIC_WEIGHT: f32 = 0.9;

/// How BM25 and cosine similarity are combined (`context.fusion`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fusion {
    /// Normalised score mixing (the default: the better of the two on the evaluation sets; rrf at
    /// 0.8 gave 0.983 / 0.914 where mix at 0.9 gave 0.989 / 0.920).
    #[default]
    Mix,
    /// Reciprocal rank fusion.
    Rrf,
}

/// What hybrid ranking needs to know: the weight of the semantic part and the fusion.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SemanticSettings {
    /// Share of the semantic part, 0 to 1.
    pub weight: f32,
    /// How the two parts are combined.
    pub fusion: Fusion,
}

impl Default for SemanticSettings {
    fn default() -> Self {
        SemanticSettings { weight: DEFAULT_SEMANTIC_WEIGHT, fusion: Fusion::default() }
    }
}

/// The fused score of every chunk, from its BM25 (`lexical`) and its cosine similarity (`None`:
/// no vector yet), in the same order.
#[cfg_attr(not(feature = "semantic"), allow(dead_code))]
pub(crate) fn fuse(settings: SemanticSettings, lexical: &[f32], cosine: &[Option<f32>]) -> Vec<f32> {
    let w = settings.weight.clamp(0.0, 1.0);
    let top = lexical.iter().copied().fold(1.0f32, f32::max);
    match settings.fusion {
        Fusion::Mix => {
            let (lo, hi) =
                cosine.iter().flatten().fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &c| (lo.min(c), hi.max(c)));
            let range = hi - lo;
            lexical
                .iter()
                .zip(cosine)
                .map(|(&l, c)| match c {
                    Some(c) if range > 0.0 => (1.0 - w) * l + w * top * (c - lo) / range,
                    Some(_) => (1.0 - w) * l,
                    None => l,
                })
                .collect()
        }
        Fusion::Rrf => {
            let lex_rank = ranks(lexical.iter().map(|&l| (l > 0.0).then_some(l)));
            let sem_rank = ranks(cosine.iter().copied());
            let part = |rank: Option<usize>| rank.map_or(0.0, |r| 1.0 / (RRF_K + r as f32));
            (0..lexical.len())
                .map(|i| {
                    let l = part(lex_rank[i]);
                    let s = if cosine[i].is_some() { part(sem_rank[i]) } else { l };
                    top * RRF_K * ((1.0 - w) * l + w * s)
                })
                .collect()
        }
    }
}

/// Each item's rank from 1 (highest value first, ties in order), `None` for items without a value.
fn ranks(values: impl Iterator<Item = Option<f32>>) -> Vec<Option<usize>> {
    let values: Vec<Option<f32>> = values.collect();
    let mut order: Vec<usize> = (0..values.len()).filter(|&i| values[i].is_some()).collect();
    order.sort_by(|&a, &b| values[b].unwrap_or(0.0).total_cmp(&values[a].unwrap_or(0.0)).then(a.cmp(&b)));
    let mut rank = vec![None; values.len()];
    for (r, i) in order.into_iter().enumerate() {
        rank[i] = Some(r + 1);
    }
    rank
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weight_zero_is_bm25_and_missing_vectors_rank_lexically() {
        let lexical = [3.0, 0.0, 1.5];
        for fusion in [Fusion::Mix, Fusion::Rrf] {
            let zero = fuse(SemanticSettings { weight: 0.0, fusion }, &lexical, &[Some(0.1), Some(0.9), Some(0.5)]);
            if fusion == Fusion::Mix {
                assert_eq!(zero, lexical);
            }
            assert!(zero[0] > zero[2] && zero[2] > zero[1], "{fusion:?}: {zero:?}");
            // Semantic alone puts the closest chunk first.
            let one = fuse(SemanticSettings { weight: 1.0, fusion }, &lexical, &[Some(0.1), Some(0.9), Some(0.5)]);
            assert!(one[1] > one[2] && one[2] > one[0], "{fusion:?}: {one:?}");
            // No vectors at all: lexical order, whatever the weight.
            let none = fuse(SemanticSettings { weight: 1.0, fusion }, &lexical, &[None, None, None]);
            assert!(none[0] > none[2] && none[2] > none[1], "{fusion:?}: {none:?}");
        }
    }
}
