//! Relevance mode: every chunk ranked against the query by BM25 and
//! priority, the best packed as passages.
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
//! With the embedding model built in and `context.semantic: on`, `bm25(c)`
//! above is replaced by the fusion of BM25 and the cosine similarity of the
//! chunk's and the query's embeddings ([`super::fusion`]); chunks not
//! embedded yet keep their BM25, and the report says `semantic: partial`.
//!
//! Imports the chunk index, the query, the passage packer, the fusion, the
//! embeddings and the report's entries.

use std::sync::Arc;

use super::chunk::{Chunk, Chunked, count_of};
use super::passages::{PassageBlock, Passages, pack_passages};
use super::query::Query;
use super::{Candidate, Composer, Composition, DEFAULT_PRIORITY};
use crate::report::{ChunkReport, ExcludeReason, Excluded, Included, Semantic};

/// BM25's term-frequency saturation (the usual value).
pub(crate) const K1: f32 = 1.2;
/// BM25's length normalisation (the usual value).
pub(crate) const B: f32 = 0.75;
/// How much an occurrence in the resource's name or title counts, against
/// one in the chunk's text: a title says what the whole resource is about.
pub(crate) const FIELD_WEIGHT: f32 = 2.0;

impl Composer<'_> {
    /// Ranks every chunk of `items` against `query` and packs the best.
    pub(crate) fn by_relevance(&self, items: &[Candidate<'_>], query: Option<&Query>) -> Composition {
        let Composer { tok, cache, index, preamble, budget } = *self;
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
        // Every chunk's BM25, in resource then document order (`flat`).
        let mut lexical: Vec<f32> = Vec::with_capacity(n);
        for c in &chunked {
            for chunk in &c.chunks {
                let norm = k1 * (1.0 - b + b * chunk.len as f32 / avgdl);
                let bm25: f32 = terms
                    .iter()
                    .zip(&idf)
                    .map(|((t, w), idf)| {
                        let f = tf(c, chunk, *t);
                        if f > 0.0 { w * idf * f * (k1 + 1.0) / (f + norm) } else { 0.0 }
                    })
                    .sum();
                lexical.push(bm25);
            }
        }
        let (cosine, semantic) = cosines(index, &chunked, query, n);
        let fused = match index.semantic() {
            Some(settings) if cosine.iter().any(Option::is_some) => super::fusion::fuse(settings, &lexical, &cosine),
            _ => lexical.clone(),
        };
        let starts: Vec<usize> = chunked
            .iter()
            .scan(0, |at, c| {
                let start = *at;
                *at += c.chunks.len();
                Some(start)
            })
            .collect();
        let mut ranked: Vec<(usize, usize, f32)> = Vec::with_capacity(n);
        for (r, (c, item)) in chunked.iter().zip(items).enumerate() {
            let p = item.resource.annotations.priority.unwrap_or(DEFAULT_PRIORITY);
            for k in 0..c.chunks.len() {
                ranked.push((r, k, fused[starts[r] + k] * (0.8 + 0.4 * p) + 0.01 * p));
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
        let round = |x: f32| (f64::from(x) * 1000.0).round() / 1000.0;
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
                                score: round(score(*r, k)),
                                lexical: round(lexical[starts[*r] + k]),
                                semantic: cosine[starts[*r] + k].map(round),
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
            semantic,
        }
    }
}

/// Each chunk's cosine similarity with the query (`None`: no vector yet), in resource then
/// document order, and what the report says of it (`None`: no query to embed).
fn cosines(
    index: &super::ChunkIndex,
    chunked: &[Arc<Chunked>],
    query: Option<&Query>,
    n: usize,
) -> (Vec<Option<f32>>, Option<Semantic>) {
    #[cfg(feature = "semantic")]
    {
        if index.semantic().is_none() {
            return (vec![None; n], Some(Semantic::Off));
        }
        let Some(q) = query.and_then(super::semantic::query_vector) else {
            return (vec![None; n], None);
        };
        let mut all = true;
        let mut out = Vec::with_capacity(n);
        for c in chunked {
            match super::semantic::embedded(c) {
                Some(v) => out.extend((0..c.chunks.len()).map(|k| Some(v.cosine(k, &q)))),
                None => {
                    all = false;
                    out.extend((0..c.chunks.len()).map(|_| None));
                }
            }
        }
        (out, Some(if all { Semantic::On } else { Semantic::Partial }))
    }
    #[cfg(not(feature = "semantic"))]
    {
        let _ = (index, chunked, query);
        (vec![None; n], Some(Semantic::NotBuilt))
    }
}
