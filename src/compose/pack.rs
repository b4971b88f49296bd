//! Priority packing: rendered blocks into one message under a token budget,
//! the last one cut to fit.
//!
//! The guarantee callers rely on: [`Packed::tokens`] is the exact ordinary
//! token count of [`Packed::content`] (preamble included) and never exceeds
//! the budget.
//!
//! # Why the message is counted piece by piece
//!
//! Re-tokenising the whole message on every request would cost as much as the
//! first request. Instead each block's head is counted once (cached by
//! content) and the message count is the sum of its pieces. That is exact for
//! `o200k_base`, `o200k_harmony` and `cl100k_base` when every cut is between a
//! `'\n'` and a `'<'`:
//!
//! - no pre-token piece of their split regexes contains `"\n<"`: letter and
//!   digit pieces exclude `'\n'`; the punctuation piece
//!   (` ?[^\s\p{L}\p{N}]+[\r\n/]*` in o200k, `...[\r\n]*+` in cl100k) only
//!   has newlines (and, in o200k, `/`) at its end; the remaining pieces are
//!   all whitespace. So the cut is a piece boundary. (The `/` is why the cut
//!   must be before `<`, not before any non-space: o200k reads `">\n/"` as one
//!   piece.)
//! - the pieces left of the cut split the same with or without what follows:
//!   a whitespace run ending in `'\n'` is taken whole by `\s*[\r\n]+`
//!   (o200k) or `\s*[\r\n]` (cl100k, after `\s++$` fails) before a `'<'`, and
//!   by that same alternative or `\s++$` at the end of the string; no
//!   lookahead ever looks at the cut. The pieces right of the cut do not
//!   depend on what precedes it: the patterns have no lookbehind or anchors
//!   other than `$`.
//!
//! The message is `preamble + "\n\n" | head₁ | "</resource>\n\n" | head₂ | … |
//! "</resource>"`, every head starting with `<resource` and ending with
//! `'\n'`, so every cut has that shape. The legacy encodings (`r50k_base`,
//! `p50k_base`, `p50k_edit`) split `"\n\n"` differently before a non-space
//! (`\s+(?!\S)`), so for them, and for hand-made blocks not of that shape,
//! [`pack`] counts the assembled message exactly and shrinks until it fits.

//!
//! Imports the tokenizer, the renderer and the resource types.

use std::borrow::Cow;

use super::render::{CLOSE_TAG, RenderedBlock, render_head_into, render_len_hint};
use crate::id::ResourceId;
use crate::resource::{Contents, Resource};
use crate::tokenize::{TokenCache, Tokenizer};

/// Fewest body tokens worth sending as a truncated block: a shorter excerpt
/// is mostly marker and rarely helps the model.
pub(crate) const DEFAULT_MIN_USEFUL_TOKENS: usize = 32;

/// What to pack.
#[derive(Debug, Clone)]
pub(crate) struct PackInput<'a> {
    /// First paragraph of the message, used verbatim (operator text: it must
    /// not contain lines starting with `<resource`).
    pub preamble: &'a str,
    /// Blocks in priority order: earlier blocks get the budget first.
    pub blocks: Vec<RenderedBlock>,
    /// Most tokens the whole message may have.
    pub budget: usize,
    /// Fewest body tokens a truncated block must keep to be included (at
    /// least 1); usually [`DEFAULT_MIN_USEFUL_TOKENS`].
    pub min_useful_tokens: usize,
}

/// The packed message and what went into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Packed {
    /// The message, or `None` when no block fits: then nothing is injected.
    pub content: Option<String>,
    /// Exact token count of `content` (0 when `None`); never over the budget.
    pub tokens: usize,
    /// Included blocks, in input order.
    pub included: Vec<PackedItem>,
    /// Blocks left out, in input order.
    pub dropped: Vec<Dropped>,
}

/// One included block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PackedItem {
    /// The resource.
    pub id: ResourceId,
    /// Tokens the block adds to the message, closing tag and the blank line
    /// after it included; the preamble plus all items' tokens equals
    /// [`Packed::tokens`] (an estimate for legacy encodings).
    pub tokens: usize,
    /// True when the body was cut to fit.
    pub truncated: bool,
    /// Body tokens kept.
    pub kept: usize,
    /// Body tokens in the whole block.
    pub total: usize,
}

/// One block left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Dropped {
    /// The resource.
    pub id: ResourceId,
    /// E.g. `needs 812 tokens, 40 left of 4000`: what including it whole
    /// would have added (the preamble too, for a first block) and what was
    /// still free.
    pub detail: String,
}

/// Packs `input.blocks` in order into one message of at most `input.budget`
/// tokens.
///
/// A block that fits whole is included. One that does not is cut at a token
/// boundary, with a `[truncated: kept K of N tokens]` line (body tokens)
/// before its closing tag, if at least `min_useful_tokens` body tokens fit;
/// else it is dropped and later, smaller blocks are still tried.
pub(crate) fn pack(tok: &Tokenizer, cache: &TokenCache, input: PackInput<'_>) -> Packed {
    let additive = tok.is_additive() && input.blocks.iter().all(well_formed);
    let mut limit = input.budget;
    loop {
        let packed = pack_within(tok, cache, &input, limit, additive);
        let Some(content) = &packed.content else {
            return packed;
        };
        if additive {
            debug_assert_eq!(packed.tokens, tok.count(content), "additive count is not exact");
            return packed;
        }
        let exact = tok.count(content);
        if exact <= input.budget {
            return Packed { tokens: exact, ..packed };
        }
        // The estimate was low: pack again with a smaller limit. Terminates:
        // the limit shrinks every time, and at 0 nothing is included.
        limit = limit.saturating_sub(exact - input.budget);
    }
}

/// [`pack`] for the case where everything fits, without a copy per block:
/// each block is rendered straight into the message, so with a budget that
/// takes everything the message is the only rendered copy of the contents
/// (peak memory: contents + message, not contents + blocks + message).
///
/// Returns exactly what `pack` would return for the same blocks, or, when
/// something does not fit (or the encoding is not additive, or a block is
/// not well formed), the rendered blocks for `pack` to do the general work.
pub(crate) fn pack_in_place(
    tok: &Tokenizer,
    cache: &TokenCache,
    preamble: &str,
    budget: usize,
    items: &[(&Resource, &Contents)],
) -> std::result::Result<Packed, Vec<RenderedBlock>> {
    let mut buf = String::with_capacity(
        preamble.len() + items.iter().map(|(_, c)| render_len_hint(c) + CLOSE_TAG.len() + 2).sum::<usize>(),
    );
    buf.push_str(preamble);
    let mut spans = Vec::with_capacity(items.len());
    for (r, c) in items {
        buf.push_str("\n\n");
        let start = buf.len();
        render_head_into(&mut buf, r, c);
        spans.push((start, buf.len()));
        buf.push_str(CLOSE_TAG);
    }
    let blocks = |buf: &str, spans: &[(usize, usize)]| {
        spans
            .iter()
            .zip(items)
            .map(|(&(a, b), (r, _))| RenderedBlock { id: r.id.clone(), head: buf[a..b].to_owned(), tail: CLOSE_TAG })
            .collect::<Vec<_>>()
    };
    if items.is_empty() || !tok.is_additive() {
        return Err(blocks(&buf, &spans));
    }
    let pre = cache.count(tok, &format!("{preamble}\n\n"));
    let close = cache.count(tok, CLOSE_TAG);
    let sep = cache.count(tok, &format!("{CLOSE_TAG}\n\n"));
    let mut used = pre + close + sep * (items.len() - 1);
    let mut included = Vec::with_capacity(items.len());
    for (i, (&(a, b), (r, _))) in spans.iter().zip(items).enumerate() {
        let head = &buf[a..b];
        if !head.starts_with('<') {
            return Err(blocks(&buf, &spans));
        }
        let head_tokens = cache.count(tok, head);
        used += head_tokens;
        if used > budget {
            return Err(blocks(&buf, &spans));
        }
        let (open, body) = split_head(head);
        let total = body_tokens(tok, cache, true, open, body, head_tokens);
        let tokens = head_tokens + if i + 1 == items.len() { close } else { sep };
        included.push(PackedItem { id: r.id.clone(), tokens, truncated: false, kept: total, total });
    }
    debug_assert_eq!(used, tok.count(&buf), "additive count is not exact");
    Ok(Packed { content: Some(buf), tokens: used, included, dropped: Vec::new() })
}

/// The shape additive counting needs (see the module docs).
fn well_formed(block: &RenderedBlock) -> bool {
    block.head.starts_with('<') && block.head.ends_with('\n') && block.tail == CLOSE_TAG
}

/// One pass of packing against `limit`, counting by pieces.
fn pack_within(tok: &Tokenizer, cache: &TokenCache, input: &PackInput<'_>, limit: usize, additive: bool) -> Packed {
    let pre = cache.count(tok, &format!("{}\n\n", input.preamble));
    let close = cache.count(tok, CLOSE_TAG);
    let sep = cache.count(tok, &format!("{CLOSE_TAG}\n\n"));
    let min_useful = input.min_useful_tokens.max(1);

    let mut chosen: Vec<(&RenderedBlock, Cow<'_, str>)> = Vec::new();
    let mut included: Vec<PackedItem> = Vec::new();
    let mut dropped = Vec::new();
    // Tokens of the message so far (0 while it is empty).
    let mut used = 0;
    for block in &input.blocks {
        let left = limit.saturating_sub(used);
        // Besides its head, a block costs the preamble and its closing tag if
        // it is the first; else the previous closing tag's blank line and its
        // own tag.
        let overhead = if included.is_empty() { pre + close } else { sep };
        let head_tokens = cache.count(tok, &block.head);
        let (open, body) = split_head(&block.head);
        let (head, head_tokens, truncated, kept, total) = if overhead + head_tokens <= left {
            let total = body_tokens(tok, cache, additive, open, body, head_tokens);
            (Cow::Borrowed(block.head.as_str()), head_tokens, false, total, total)
        } else if let Some(cut) = cut_to_fit(tok, open, body, left.saturating_sub(overhead), min_useful, "\n") {
            (Cow::Owned(cut.head), cut.tokens, true, cut.kept, cut.total)
        } else {
            let detail = format!("needs {} tokens, {left} left of {limit}", overhead + head_tokens);
            dropped.push(Dropped { id: block.id.clone(), detail });
            continue;
        };
        used += overhead + head_tokens;
        // Its closing tag is added below, once it is known whether a blank
        // line follows.
        included.push(PackedItem { id: block.id.clone(), tokens: head_tokens, truncated, kept, total });
        chosen.push((block, head));
    }
    if chosen.is_empty() {
        return Packed { content: None, tokens: 0, included, dropped };
    }
    let last = included.len() - 1;
    for (i, item) in included.iter_mut().enumerate() {
        item.tokens += if i == last { close } else { sep };
    }

    let len = input.preamble.len() + chosen.iter().map(|(b, h)| h.len() + b.tail.len() + 2).sum::<usize>();
    let mut content = String::with_capacity(len);
    content.push_str(input.preamble);
    for (block, head) in &chosen {
        content.push_str("\n\n");
        content.push_str(head);
        content.push_str(block.tail);
    }
    Packed { content: Some(content), tokens: used, included, dropped }
}

/// Body tokens of a block counted whole, without tokenising the body again
/// when possible: the opening line ends in `">\n"`, and that last piece only
/// runs on into the body over newlines (and `/` in o200k), so otherwise the
/// cut after it is additive too. Else the body is counted, through the cache.
fn body_tokens(tok: &Tokenizer, cache: &TokenCache, additive: bool, open: &str, body: &str, head: usize) -> usize {
    if additive && open.ends_with(">\n") && !body.starts_with(['\n', '\r', '/']) {
        let n = head.saturating_sub(cache.count(tok, open));
        debug_assert_eq!(n, tok.count(body), "opening line and body do not add up");
        n
    } else {
        cache.count(tok, body)
    }
}

/// The opening line (with its `'\n'`) and the body of a block head.
fn split_head(head: &str) -> (&str, &str) {
    head.split_at(head.find('\n').map_or(0, |i| i + 1))
}

/// A text cut to fit: `head` is the opening, the kept prefix and the marker.
pub(crate) struct Cut {
    pub(crate) head: String,
    pub(crate) tokens: usize,
    pub(crate) kept: usize,
    pub(crate) total: usize,
}

/// The one truncation of this crate, used by the packer (a block's body) and
/// by tool results: `open`, then the longest token prefix of `body`, then the
/// marker line ([`marker`]) and `tail`, all in at most `avail` tokens, keeping
/// as many body tokens as possible (at least `min_useful`). `None` when not
/// even that fits.
pub(crate) fn cut_to_fit(
    tok: &Tokenizer,
    open: &str,
    body: &str,
    avail: usize,
    min_useful: usize,
    tail: &str,
) -> Option<Cut> {
    if avail < min_useful {
        return None;
    }
    let tokens = tok.bpe.encode_ordinary(body);
    let total = tokens.len();
    let build = |k: usize| -> (String, usize) {
        let (kept, len) = tok.prefix_len(body, &tokens, k);
        let prefix = body.get(..len).unwrap_or_default();
        let marker = marker(kept, total);
        let mut head = String::with_capacity(open.len() + prefix.len() + marker.len() + tail.len() + 1);
        head.push_str(open);
        head.push_str(prefix);
        if !prefix.is_empty() && !prefix.ends_with('\n') {
            head.push('\n');
        }
        head.push_str(&marker);
        head.push_str(tail);
        (head, kept)
    };
    // First guess: the pieces counted apart. Merges at the cuts make the real
    // count differ by a token or two, so verify and walk down, then up.
    let fixed = tok.count(open) + tok.count(&marker(total, total)) + tok.count(tail) + 1;
    let mut k = avail.saturating_sub(fixed).min(total.saturating_sub(1));
    let mut best = loop {
        let (head, kept) = build(k);
        if kept < min_useful {
            return None;
        }
        let n = tok.count(&head);
        if n <= avail {
            break Cut { head, tokens: n, kept, total };
        }
        if kept == 0 {
            return None;
        }
        k = kept.saturating_sub(n - avail);
    };
    let mut k = best.kept + 1;
    while k < total {
        let (head, kept) = build(k);
        if kept > best.kept {
            let n = tok.count(&head);
            if n > avail {
                break;
            }
            best = Cut { head, tokens: n, kept, total };
        }
        k += 1;
    }
    Some(best)
}

/// The truncation marker: `[truncated: kept K of N tokens]`.
pub(crate) fn marker(kept: usize, total: usize) -> String {
    format!("[truncated: kept {kept} of {total} tokens]")
}

#[cfg(test)]
#[path = "pack_tests.rs"]
mod tests;
