//! Token counts and chunks shared between replicas, next to the contents
//! they were computed from (feature `redis`).
//!
//! A replica that gets contents from the shared cache would otherwise
//! tokenise and chunk them again: the most CPU a cold request costs. So the
//! first replica to compute them stores them in the same Redis hash as the
//! contents (field `d:<scope>:<name>`, see [`name`]), and the others seed
//! their [`TokenCache`] and [`ChunkIndex`] from there instead.
//!
//! A record is used only for the exact block it was computed from: it
//! starts with the SHA-256 of the rendered block head (contents and listing
//! metadata), which the reader renders and checks, so a record left over
//! from an older version, or written for another resource, is ignored, never
//! misapplied. Its ranges are checked against the body before use. Records
//! are written by a script only where the contents' hash still exists (an
//! invalidation deletes the hash and its records with it) and only when
//! they add something (chunks where only counts were stored, or another
//! head).
//!
//! Layout: one byte of kind (0: counts, 1: counts and chunks), the 32-byte
//! head digest, then the [`Body`] in postcard's compact form.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::cache::{ContentCache, Origin};
use crate::compose::{Chunk, ChunkIndex, Chunked, render_head_into, term_probe};
use crate::id::ResourceId;
use crate::resource::{Contents, Resource};
use crate::tokenize::{TokenCache, Tokenizer};

const COUNTS: u8 = 0;
const CHUNKS: u8 = 1;
const HEADER: usize = 33;

/// What the record holds: its kind byte.
fn kind(record: &[u8]) -> u8 {
    record.first().copied().unwrap_or(COUNTS)
}

#[derive(Serialize, Deserialize)]
struct Body {
    /// [`term_probe`] of the writer: term ids are hashes of this build.
    probe: u64,
    /// Tokens of the block head (opening line, body, final newline).
    head_tokens: u32,
    /// Tokens of the opening line.
    open_tokens: u32,
    chunks: Option<Chunks>,
}

#[derive(Serialize, Deserialize)]
struct Chunks {
    /// Bytes of each body token (the token end offsets, as differences:
    /// mostly one byte each in this form).
    token_lengths: Vec<u32>,
    chunks: Vec<ChunkForm>,
    fields: Vec<(u64, u16)>,
}

#[derive(Serialize, Deserialize)]
struct ChunkForm {
    start: u32,
    end: u32,
    tokens: u32,
    len: u32,
    terms: Vec<(u64, u16)>,
}

/// The part of the field name that says what computed the record: the
/// crate version (a rolling upgrade may chunk differently), the encoding and
/// the chunk settings.
fn name(tok: &Tokenizer, index: &ChunkIndex) -> String {
    let (size, overlap) = index.params();
    format!("{}:{}:{size}:{overlap}", env!("CARGO_PKG_VERSION"), tok.encoding())
}

fn digest(head: &str) -> [u8; 32] {
    Sha256::digest(head.as_bytes()).into()
}

/// The record of what this replica knows of the resource's block: counts
/// and chunks if it has chunked it, counts alone if it only counted it, or
/// `None` if it computed neither.
fn export(
    tok: &Tokenizer,
    tokens: &TokenCache,
    index: &ChunkIndex,
    resource: &Resource,
    contents: &Arc<Contents>,
) -> Option<Vec<u8>> {
    let chunked = index.peek(tok, resource, contents);
    let rendered;
    let (head, body_start) = match &chunked {
        Some(c) => (c.head.as_str(), c.body_start),
        None => {
            let mut h = String::new();
            render_head_into(&mut h, resource, contents);
            rendered = h;
            let at = rendered.find('\n').map_or(rendered.len(), |i| i + 1);
            (rendered.as_str(), at)
        }
    };
    let head_tokens = match &chunked {
        Some(c) => c.whole_head_tokens(tok).or_else(|| tokens.peek(tok, head)).unwrap_or_else(|| tok.count(head)),
        None => tokens.peek(tok, head)?,
    };
    let open_tokens = match &chunked {
        Some(c) => c.open_tokens,
        None => tokens.peek(tok, &head[..body_start]).unwrap_or_else(|| tok.count(&head[..body_start])),
    };
    let chunks = chunked.as_ref().map(|c| {
        let mut last = 0;
        Chunks {
            token_lengths: c
                .token_ends
                .iter()
                .map(|&e| {
                    let d = e - last;
                    last = e;
                    d
                })
                .collect(),
            chunks: c
                .chunks
                .iter()
                .map(|k| ChunkForm {
                    start: k.start as u32,
                    end: k.end as u32,
                    tokens: k.tokens as u32,
                    len: k.len,
                    terms: k.terms.to_vec(),
                })
                .collect(),
            fields: c.fields.to_vec(),
        }
    });
    let body = Body { probe: term_probe(), head_tokens: head_tokens as u32, open_tokens: open_tokens as u32, chunks };
    let mut out = Vec::with_capacity(HEADER + 64);
    out.push(if body.chunks.is_some() { CHUNKS } else { COUNTS });
    out.extend_from_slice(&digest(head));
    postcard::to_io(&body, &mut out).ok()?;
    Some(out)
}

/// Seeds `tokens` (and `index`, when the record holds chunks) from a record
/// if it was computed from this very block; returns its kind if it was used.
fn seed(
    tok: &Tokenizer,
    tokens: &TokenCache,
    index: &ChunkIndex,
    resource: &Resource,
    contents: &Arc<Contents>,
    record: &[u8],
) -> Option<u8> {
    if record.len() < HEADER {
        return None;
    }
    let mut head = String::new();
    render_head_into(&mut head, resource, contents);
    if record[1..HEADER] != digest(&head) {
        return None;
    }
    let body: Body = postcard::from_bytes(&record[HEADER..]).ok()?;
    let body_start = head.find('\n').map_or(head.len(), |i| i + 1);
    let chunked = match body.chunks {
        None => None,
        Some(c) => Some(chunked(c, head.clone(), body_start, body.open_tokens as usize, body.probe)?),
    };
    tokens.insert(tok, &head, body.head_tokens as usize);
    tokens.insert(tok, &head[..body_start], body.open_tokens as usize);
    let kind = if chunked.is_some() { CHUNKS } else { COUNTS };
    if let Some(c) = chunked {
        index.insert(tok, resource, contents, Arc::new(c));
    }
    Some(kind)
}

/// The chunks of a record, if they fit the body and their term ids are this
/// build's.
fn chunked(c: Chunks, head: String, body_start: usize, open_tokens: usize, probe: u64) -> Option<Chunked> {
    if probe != term_probe() {
        return None;
    }
    let body = &head[body_start..];
    let mut end = 0u32;
    let mut token_ends = Vec::with_capacity(c.token_lengths.len());
    for d in c.token_lengths {
        end = end.checked_add(d)?;
        token_ends.push(end);
    }
    if end as usize > body.len() {
        return None;
    }
    let mut chunks = Vec::with_capacity(c.chunks.len());
    for k in c.chunks {
        let (start, end) = (k.start as usize, k.end as usize);
        if start > end || end > body.len() || !body.is_char_boundary(start) || !body.is_char_boundary(end) {
            return None;
        }
        chunks.push(Chunk { start, end, tokens: k.tokens as usize, len: k.len, terms: k.terms.into_boxed_slice() });
    }
    Some(Chunked {
        head,
        body_start,
        open_tokens,
        chunks,
        token_ends,
        fields: c.fields.into_boxed_slice(),
        #[cfg(feature = "semantic")]
        vectors: Default::default(),
    })
}

/// One resource of a request, as far as sharing its derived data goes.
struct Item {
    /// Its place in the request's ready list.
    at: usize,
    private: bool,
    /// The record another replica stored, if any was looked up.
    fetched: Option<Vec<u8>>,
    /// What a used record held (`None`: none was used).
    used: Option<u8>,
}

/// The derived-data exchange of one cold request: records looked up before
/// composing, seeded into the local caches, and what this replica computed
/// offered afterwards.
pub(crate) struct Exchange {
    name: String,
    items: Vec<Item>,
}

impl Exchange {
    /// Looks up the records of the resources that went through the shared
    /// cache and are not chunked here yet, in one round trip (only those
    /// that came from Redis can have one: for a resource this replica just
    /// read from its server, no other replica has computed anything).
    pub(crate) async fn fetch(
        cache: &ContentCache,
        index: &ChunkIndex,
        tok: &Tokenizer,
        candidates: &[(&Resource, &Arc<Contents>, Origin)],
        user: &str,
    ) -> Exchange {
        let name = name(tok, index);
        let mut items: Vec<Item> = candidates
            .iter()
            .enumerate()
            .filter(|(_, (_, _, o))| *o != Origin::Local)
            .map(|(at, (_, c, _))| Item { at, private: c.private, fetched: None, used: None })
            .collect();
        let wanted: Vec<(usize, (&ResourceId, bool))> = items
            .iter()
            .enumerate()
            .filter(|(_, it)| {
                let (r, c, o) = candidates[it.at];
                o == Origin::Shared && index.peek(tok, r, c).is_none()
            })
            .map(|(i, it)| (i, (&candidates[it.at].0.id, it.private)))
            .collect();
        if !wanted.is_empty() {
            let keys: Vec<(&ResourceId, bool)> = wanted.iter().map(|(_, k)| *k).collect();
            let records = cache.derived(&keys, user, &name).await;
            for ((i, _), r) in wanted.into_iter().zip(records) {
                items[i].fetched = r;
            }
        }
        Exchange { name, items }
    }

    /// Seeds the local caches from the records found; returns how many were
    /// used.
    pub(crate) fn seed(
        &mut self,
        tok: &Tokenizer,
        tokens: &TokenCache,
        index: &ChunkIndex,
        candidates: &[(&Resource, &Arc<Contents>)],
    ) -> usize {
        let mut used = 0;
        for it in &mut self.items {
            if let Some(record) = it.fetched.take() {
                let (r, c) = candidates[it.at];
                it.used = seed(tok, tokens, index, r, c, &record);
                used += usize::from(it.used.is_some());
            }
        }
        used
    }

    /// The records of what this request computed that the shared cache
    /// does not hold yet, as `(resource, private, record)`.
    pub(crate) fn export(
        &self,
        tok: &Tokenizer,
        tokens: &TokenCache,
        index: &ChunkIndex,
        candidates: &[(&Resource, &Arc<Contents>)],
    ) -> Vec<(ResourceId, bool, Vec<u8>)> {
        self.items
            .iter()
            .filter(|it| it.used != Some(CHUNKS))
            .filter_map(|it| {
                let (r, c) = candidates[it.at];
                let record = export(tok, tokens, index, r, c)?;
                (it.used.is_none() || kind(&record) == CHUNKS).then(|| (r.id.clone(), it.private, record))
            })
            .collect()
    }

    /// Counts the records used and hands the new ones (from [`Exchange::export`])
    /// to the shared cache, which writes them in the background.
    pub(crate) fn finish(
        self,
        cache: &ContentCache,
        used: usize,
        records: Vec<(ResourceId, bool, Vec<u8>)>,
        user: String,
    ) {
        cache.derived_used(used);
        cache.store_derived(records, user, self.name);
    }
}
