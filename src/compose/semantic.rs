//! Semantic ranking's data (feature `semantic`): each chunk's embedding, computed off the request
//! path, and the query's, computed per request.
//!
//! Chunk vectors: when the chunk index keeps a newly cut content version (and semantic ranking is
//! on), it hands the [`Chunked`] to [`enqueue`]. One background thread per process (at most one
//! core, whatever the number of indexes or requests) embeds its chunks with the built-in model
//! (`mcp_context_embed`, all-MiniLM-L6-v2) and stores them in the `Chunked` itself, int8 with one
//! scale per chunk (384 + 4 bytes, counted in the index's byte bound). The queue holds weak
//! references: a version evicted or replaced before its turn is not embedded. A request never
//! waits for it: chunks without vectors rank lexically ([`super::fusion`]), and the report says
//! `semantic: partial`.
//!
//! Query vectors: each user turn of the [`Query`] is embedded (its last [`TURN_BYTES`]), weighted
//! as the query weighs it (latest turn 1, earlier ones less), summed and scaled to length 1.
//! Turns repeat from one request of a conversation to the next, so the last [`TURN_MEMO`] turns'
//! vectors are remembered.
//!
//! Imports the chunks, the query and the embedding crate.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};

use mcp_context_embed::{DIM, Encoder};

use super::chunk::Chunked;
use super::query::{Query, tail};

/// Bytes of a user turn that are embedded: its end (the model reads about 250 word pieces).
pub(crate) const TURN_BYTES: usize = 1536;
/// Turn vectors remembered (then all are forgotten at once).
const TURN_MEMO: usize = 512;

/// The vectors of one content version's chunks: `DIM` int8 values and a scale per chunk (value =
/// q · scale), of a unit vector.
#[derive(Debug)]
pub(crate) struct ChunkVectors {
    q: Box<[i8]>,
    scale: Box<[f32]>,
}

impl ChunkVectors {
    /// Embeds every chunk of `chunked` (CPU-bound: about 0.1 s per 300-token chunk), each
    /// text once per process while [`CHUNK_MEMO`] remembers it.
    fn of(chunked: &Chunked) -> ChunkVectors {
        let body = chunked.body();
        let mut q = Vec::with_capacity(chunked.chunks.len() * DIM);
        let mut scale = Vec::with_capacity(chunked.chunks.len());
        for c in &chunked.chunks {
            let (v, s) = chunk_vector(&body[c.start..c.end]);
            q.extend_from_slice(&v);
            scale.push(s);
        }
        ChunkVectors { q: q.into_boxed_slice(), scale: scale.into_boxed_slice() }
    }

    /// Cosine similarity of chunk `k` with the unit vector `query`.
    pub(crate) fn cosine(&self, k: usize, query: &[f32]) -> f32 {
        let v = &self.q[k * DIM..(k + 1) * DIM];
        let dot: f32 = v.iter().zip(query).map(|(&a, &b)| f32::from(a) * b).sum();
        dot * self.scale[k]
    }

    /// Bytes the vectors of `chunks` chunks take (what the index counts for them ahead).
    pub(crate) fn bytes(chunks: usize) -> usize {
        chunks * (DIM + std::mem::size_of::<f32>())
    }
}

/// Chunk vectors remembered by the SHA-256 of their text, across content versions and indexes
/// (an edited document's unchanged chunks, the same document under two configurations): 16384
/// chunks, about 7 MB, then all are forgotten at once.
const CHUNK_MEMO: usize = 16384;

/// Chunk vectors (int8 and scale) by the SHA-256 of their text.
type ChunkMemo = Mutex<HashMap<[u8; 32], (Arc<[i8]>, f32)>>;

fn chunk_memo() -> &'static ChunkMemo {
    static MEMO: OnceLock<ChunkMemo> = OnceLock::new();
    MEMO.get_or_init(Mutex::default)
}

fn digest(text: &str) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(text.as_bytes()).into()
}

/// Gives `chunked` its vectors now if every chunk's text was embedded before (a content version
/// re-read with the same text, the same document in another index): true when it did.
pub(crate) fn fill_known(chunked: &Chunked) -> bool {
    let body = chunked.body();
    let memo = chunk_memo().lock().unwrap_or_else(|p| p.into_inner());
    let mut q = Vec::with_capacity(chunked.chunks.len() * DIM);
    let mut scale = Vec::with_capacity(chunked.chunks.len());
    for c in &chunked.chunks {
        let Some((v, s)) = memo.get(&digest(&body[c.start..c.end])) else {
            return false;
        };
        q.extend_from_slice(v);
        scale.push(*s);
    }
    drop(memo);
    let _ = chunked.vectors.set(ChunkVectors { q: q.into_boxed_slice(), scale: scale.into_boxed_slice() });
    true
}

/// One chunk text's vector, int8, and its scale.
fn chunk_vector(text: &str) -> (Arc<[i8]>, f32) {
    let memo = chunk_memo();
    let key = digest(text);
    if let Some(known) = memo.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return known.clone();
    }
    let v = Encoder::get().embed(text);
    let max = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let s = if max > 0.0 { max / 127.0 } else { 1.0 };
    let q: Arc<[i8]> = v.iter().map(|x| (x / s).round().clamp(-127.0, 127.0) as i8).collect();
    let mut m = memo.lock().unwrap_or_else(|p| p.into_inner());
    if m.len() >= CHUNK_MEMO {
        m.clear();
    }
    m.insert(key, (q.clone(), s));
    (q, s)
}

/// The background embedder's queue.
struct Queue {
    jobs: Mutex<VecDeque<Weak<Chunked>>>,
    ready: Condvar,
}

fn queue() -> &'static Queue {
    static QUEUE: OnceLock<&'static Queue> = OnceLock::new();
    QUEUE.get_or_init(|| {
        let q: &'static Queue = Box::leak(Box::new(Queue { jobs: Mutex::default(), ready: Condvar::new() }));
        let spawned = std::thread::Builder::new().name("mcp-context-embed".into()).spawn(move || run(q));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "the embedding thread could not start: relevance ranks lexically");
        }
        q
    })
}

/// Loads the model and starts the background thread, if not yet done.
pub(crate) fn load() {
    Encoder::get();
    queue();
}

/// Asks the background thread to embed the chunks of `chunked` (at once if it is idle).
pub(crate) fn enqueue(chunked: &Arc<Chunked>) {
    let q = queue();
    q.jobs.lock().unwrap_or_else(|p| p.into_inner()).push_back(Arc::downgrade(chunked));
    q.ready.notify_one();
}

fn run(q: &Queue) {
    loop {
        let job = {
            let mut jobs = q.jobs.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if let Some(job) = jobs.pop_front() {
                    break job;
                }
                jobs = q.ready.wait(jobs).unwrap_or_else(|p| p.into_inner());
            }
        };
        if let Some(chunked) = job.upgrade()
            && chunked.vectors.get().is_none()
        {
            let _ = chunked.vectors.set(ChunkVectors::of(&chunked));
        }
    }
}

/// The query's vector (unit length), `None` when it has no text.
pub(crate) fn query_vector(query: &Query) -> Option<Vec<f32>> {
    static MEMO: OnceLock<Mutex<HashMap<String, Arc<[f32]>>>> = OnceLock::new();
    let memo = MEMO.get_or_init(Mutex::default);
    let mut sum = vec![0.0f32; DIM];
    for (text, w) in &query.turns {
        let text = tail(text, TURN_BYTES);
        let known = memo.lock().unwrap_or_else(|p| p.into_inner()).get(text).cloned();
        let v = known.unwrap_or_else(|| {
            let v: Arc<[f32]> = Encoder::get().embed(text).into();
            let mut m = memo.lock().unwrap_or_else(|p| p.into_inner());
            if m.len() >= TURN_MEMO {
                m.clear();
            }
            m.insert(text.to_owned(), v.clone());
            v
        });
        sum.iter_mut().zip(v.iter()).for_each(|(s, x)| *s += w * x);
    }
    let len = sum.iter().map(|x| x * x).sum::<f32>().sqrt();
    (len > 0.0).then(|| sum.into_iter().map(|x| x / len).collect())
}

/// Whether the chunks of `chunked` have vectors.
pub(crate) fn embedded(chunked: &Chunked) -> Option<&ChunkVectors> {
    chunked.vectors.get()
}
