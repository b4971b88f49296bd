//! Passages: the best chunks of each resource packed as one block per
//! resource, omitted stretches marked (relevance mode's packer).
//!
//! Imports the chunks, the priority packer and the tokenizer.

use super::chunk::Chunked;
use super::pack::{DEFAULT_MIN_USEFUL_TOKENS, PackInput, Packed, pack};
use super::render::{CLOSE_TAG, RenderedBlock};
use crate::id::ResourceId;
use crate::tokenize::{TokenCache, Tokenizer};

/// One resource cut into chunks, for [`pack_passages`].
pub(crate) struct PassageBlock<'a> {
    /// The resource.
    pub id: &'a ResourceId,
    /// Its chunks and rendered head.
    pub chunked: &'a Chunked,
}

/// What [`pack_passages`] packed.
pub(crate) struct Passages {
    /// The message, as [`pack`] returns it.
    pub packed: Packed,
    /// For each included block (same order as `packed.included`): its index
    /// in the input and the chunks it shows in document order, `None` when
    /// it went in whole.
    pub chosen: Vec<(usize, Option<Vec<usize>>)>,
}

/// Packs the best chunks: walks `ranked` (`(block, chunk, score)`, best
/// first) and keeps each chunk whose block still fits by estimate, then
/// renders one block per resource that has any, in input order, its chunks
/// in document order and each omitted stretch as one [`omitted`] line, and
/// packs those with [`pack`], which counts exactly. Should the estimate have
/// been low (so `pack` had to cut or drop), the lowest-ranked chunk goes and
/// it packs again: the message is never over `budget`, and the one cut that
/// `pack` may make is its last resort.
pub(crate) fn pack_passages(
    tok: &Tokenizer,
    cache: &TokenCache,
    preamble: &str,
    budget: usize,
    blocks: &[PassageBlock<'_>],
    ranked: &[(usize, usize, f32)],
) -> Passages {
    let pre = cache.count(tok, &format!("{preamble}\n\n"));
    let sep = cache.count(tok, &format!("{CLOSE_TAG}\n\n"));
    let avail = budget.saturating_sub(pre);
    let mut sel: Vec<Vec<usize>> = vec![Vec::new(); blocks.len()];
    let mut est = vec![0usize; blocks.len()];
    let mut used = 0usize;
    let mut order = Vec::new();
    for &(r, k, _) in ranked {
        // A block not yet in costs at least its opening line, the chunk and
        // a separator: skip what cannot fit without estimating it (once the
        // budget is full, that is nearly every chunk).
        let chunked = blocks[r].chunked;
        if sel[r].is_empty() && used + chunked.open_tokens + chunked.chunks[k].tokens + sep > avail {
            continue;
        }
        let mut s = sel[r].clone();
        if let Err(at) = s.binary_search(&k) {
            s.insert(at, k);
        }
        let e = estimate_passages(tok, cache, blocks[r].chunked, &s) + sep;
        if used - est[r] + e <= avail {
            used = used - est[r] + e;
            est[r] = e;
            sel[r] = s;
            order.push((r, k));
        }
    }
    loop {
        let mut chosen = Vec::new();
        let mut rendered = Vec::new();
        for (r, b) in blocks.iter().enumerate().filter(|(r, _)| !sel[*r].is_empty()) {
            let whole = sel[r].len() == b.chunked.chunks.len();
            let head = if whole { b.chunked.head.clone() } else { render_passages(b.chunked, &sel[r]) };
            rendered.push(RenderedBlock { id: b.id.clone(), head, tail: CLOSE_TAG });
            chosen.push((r, (!whole).then(|| sel[r].clone())));
        }
        let input = PackInput { preamble, blocks: rendered, budget, min_useful_tokens: DEFAULT_MIN_USEFUL_TOKENS };
        let packed = pack(tok, cache, input);
        let clean = packed.dropped.is_empty() && packed.included.iter().all(|i| !i.truncated);
        match order.pop() {
            Some((r, k)) if !clean => sel[r].retain(|&x| x != k),
            _ => {
                let chosen = chosen
                    .into_iter()
                    .filter(|(r, _)| packed.included.iter().any(|i| &i.id == blocks[*r].id))
                    .collect();
                return Passages { packed, chosen };
            }
        }
    }
}

/// The line that stands for an omitted stretch of a resource.
pub(crate) fn omitted(tokens: usize) -> String {
    format!("[… {tokens} tokens omitted …]")
}

/// The stretches of the body that `sel` (chunk indices, ascending) shows:
/// overlapping chunks, and chunks only whitespace apart, become one.
fn passage_ranges(c: &Chunked, sel: &[usize]) -> Vec<(usize, usize)> {
    let body = c.body();
    let mut ranges: Vec<(usize, usize)> = Vec::with_capacity(sel.len());
    for &k in sel {
        let (a, b) = (c.chunks[k].start, c.chunks[k].end);
        match ranges.last_mut() {
            Some(last) if a <= last.1 || body[last.1..a].trim().is_empty() => last.1 = last.1.max(b),
            _ => ranges.push((a, b)),
        }
    }
    ranges
}

/// Tokens a partial block would take, by the chunk index's token offsets.
fn estimate_passages(tok: &Tokenizer, cache: &TokenCache, c: &Chunked, sel: &[usize]) -> usize {
    let body = c.body();
    let mut n = c.open_tokens + 1;
    let mut at = 0;
    let ranges = passage_ranges(c, sel);
    for &(a, b) in &ranges {
        if !body[at..a].trim().is_empty() {
            n += cache.count(tok, &omitted(c.tokens_between(at, a))) + 1;
        }
        n += c.tokens_between(a, b) + 1;
        at = b;
    }
    if !body[at..].trim().is_empty() {
        n += cache.count(tok, &omitted(c.tokens_between(at, body.len()))) + 1;
    }
    n
}

/// A block head showing only the chunks `sel`.
pub(crate) fn render_passages(c: &Chunked, sel: &[usize]) -> String {
    let body = c.body();
    let mut out = String::with_capacity(
        c.body_start + sel.iter().map(|&k| c.chunks[k].end - c.chunks[k].start + 2).sum::<usize>() + 64,
    );
    out.push_str(&c.head[..c.body_start]);
    let mut at = 0;
    for (a, b) in passage_ranges(c, sel) {
        if !body[at..a].trim().is_empty() {
            out.push_str(&omitted(c.tokens_between(at, a)));
            out.push('\n');
        }
        out.push_str(&body[a..b]);
        if !out.ends_with('\n') {
            out.push('\n');
        }
        at = b;
    }
    if !body[at..].trim().is_empty() {
        out.push_str(&omitted(c.tokens_between(at, body.len())));
        out.push('\n');
    }
    out
}
