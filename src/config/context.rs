//! The `context:` section: the model, the token budget, the message's role
//! and preamble, the read deadline, and how resources are chosen (with
//! hybrid ranking's `semantic`, `semantic_weight`, `fusion`). May
//! import the config's constants and the composition defaults.

use std::time::Duration;

use serde::Deserialize;

use super::{DEFAULT_MAX_RESOURCE_BYTES, DEFAULT_MAX_TOKENS, Found, SelectMode};
use crate::compose::{DEFAULT_SEMANTIC_WEIGHT, Fusion, SemanticSettings};
use crate::mode::MessageRole;
use crate::yaml::Node;

/// The `context:` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextSettings {
    /// Model name; selects the tokenizer.
    #[serde(default = "default_model")]
    pub model: String,
    /// Token budget of the injected message (a ceiling for every user).
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
    /// Role of the injected message.
    #[serde(default)]
    pub role: MessageRole,
    /// Text that opens the message; `None` uses the built-in preamble.
    #[serde(default)]
    pub preamble: Option<String>,
    /// Text of one resource beyond this many bytes is cut before tokenising.
    #[serde(default = "default_max_resource_bytes")]
    pub max_resource_bytes: usize,
    /// Token cap of one `read_mcp_resource` tool result.
    #[serde(default = "default_tool_max_tokens")]
    pub tool_result_max_tokens: usize,
    /// Longest an injection may wait for reads (`deadline_ms`): a resource not read
    /// by then is left out (reason `error`, "deadline"), so one slow server
    /// never holds up the LLM call beyond this.
    #[serde(rename = "deadline_ms", default = "default_deadline", deserialize_with = "millis")]
    pub deadline: Duration,
    /// How resources are chosen when they do not all fit: `auto` (the
    /// default), `priority` or `relevance` (see [`SelectMode`]).
    #[serde(default)]
    pub select: SelectMode,
    /// Chunk size for relevance mode, in tokens of the model's encoding.
    #[serde(default = "default_chunk_tokens")]
    pub chunk_tokens: usize,
    /// Tokens two neighbouring chunks share, so a passage cut at a chunk
    /// edge is still whole in one of them.
    #[serde(default = "default_chunk_overlap")]
    pub chunk_overlap: usize,
    /// Bytes the warm memo (the last answer per user, for an unchanged
    /// request) may keep, all users together (approximate: each answer's
    /// message, report and query). Past it the least recently used users go
    /// first. `0` keeps none. Default [`DEFAULT_WARM_MEMO_MAX_BYTES`].
    #[serde(default = "default_warm_memo_max_bytes")]
    pub warm_memo_max_bytes: usize,
    /// Bytes the chunk index (relevance mode's passages, terms and token
    /// offsets per content version, with the contents they were cut from)
    /// may keep, all resources and users together (approximate: see
    /// [`ChunkIndex`](crate::compose::ChunkIndex)). Past it the least recently used
    /// content versions go first; one larger than the bound is chunked for
    /// each request and not kept. `0` keeps none. Default
    /// [`DEFAULT_CHUNK_INDEX_MAX_BYTES`].
    #[serde(default = "default_chunk_index_max_bytes")]
    pub chunk_index_max_bytes: usize,
    /// Relevance mode ranks with the built-in embedding model too (`on`, the default when it is
    /// built in: cargo feature `semantic`) or by BM25 alone (`off`). Each content version is
    /// embedded once, in the background; see [`SemanticSettings`].
    #[serde(default = "default_semantic", deserialize_with = "on_off")]
    pub semantic: bool,
    /// Share of the semantic part in the fused score, 0 to 1 (default
    /// [`DEFAULT_SEMANTIC_WEIGHT`]).
    #[serde(default = "default_semantic_weight")]
    pub semantic_weight: f32,
    /// How BM25 and cosine similarity are combined: `mix` (normalised scores, the default) or
    /// `rrf` (reciprocal rank fusion).
    #[serde(default)]
    pub fusion: Fusion,
}

impl ContextSettings {
    /// Hybrid ranking's settings, `None` when `semantic: off`.
    pub fn semantic_settings(&self) -> Option<SemanticSettings> {
        self.semantic.then_some(SemanticSettings { weight: self.semantic_weight, fusion: self.fusion })
    }
}

fn default_semantic() -> bool {
    true
}
fn default_semantic_weight() -> f32 {
    DEFAULT_SEMANTIC_WEIGHT
}
/// `on` / `off` (or `true` / `false`).
fn on_off<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<bool, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OnOff {
        Bool(bool),
        Word(String),
    }
    match OnOff::deserialize(d)? {
        OnOff::Bool(b) => Ok(b),
        OnOff::Word(w) if w == "on" => Ok(true),
        OnOff::Word(w) if w == "off" => Ok(false),
        OnOff::Word(w) => Err(serde::de::Error::custom(format!("expected `on` or `off`, found `{w}`"))),
    }
}

/// Default `context.warm_memo_max_bytes` (32 MiB): a 16 KiB message and its
/// report for about 1500 users.
pub const DEFAULT_WARM_MEMO_MAX_BYTES: usize = 32 << 20;

fn default_warm_memo_max_bytes() -> usize {
    DEFAULT_WARM_MEMO_MAX_BYTES
}

/// Default `context.chunk_index_max_bytes`: defined with the chunk index it bounds.
use crate::compose::DEFAULT_CHUNK_INDEX_MAX_BYTES;

fn default_chunk_index_max_bytes() -> usize {
    DEFAULT_CHUNK_INDEX_MAX_BYTES
}

fn default_model() -> String {
    "gpt-4o".into()
}
fn default_max_tokens() -> usize {
    DEFAULT_MAX_TOKENS
}
fn default_max_resource_bytes() -> usize {
    DEFAULT_MAX_RESOURCE_BYTES
}
fn default_tool_max_tokens() -> usize {
    2000
}
fn default_deadline() -> Duration {
    Duration::from_millis(15_000)
}
/// A duration written in milliseconds.
fn millis<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Duration, D::Error> {
    u64::deserialize(d).map(Duration::from_millis)
}
fn default_chunk_tokens() -> usize {
    crate::compose::DEFAULT_CHUNK_TOKENS
}
fn default_chunk_overlap() -> usize {
    crate::compose::DEFAULT_CHUNK_OVERLAP
}

impl Default for ContextSettings {
    fn default() -> Self {
        Self {
            model: default_model(),
            max_tokens: DEFAULT_MAX_TOKENS,
            role: MessageRole::System,
            preamble: None,
            max_resource_bytes: DEFAULT_MAX_RESOURCE_BYTES,
            tool_result_max_tokens: default_tool_max_tokens(),
            deadline: default_deadline(),
            select: SelectMode::default(),
            chunk_tokens: default_chunk_tokens(),
            chunk_overlap: default_chunk_overlap(),
            warm_memo_max_bytes: DEFAULT_WARM_MEMO_MAX_BYTES,
            chunk_index_max_bytes: DEFAULT_CHUNK_INDEX_MAX_BYTES,
            semantic: default_semantic(),
            semantic_weight: DEFAULT_SEMANTIC_WEIGHT,
            fusion: Fusion::default(),
        }
    }
}

/// Records every problem of a `context:` section that was read.
pub(super) fn check(context: &ContextSettings, root: &Node<'_>, found: &mut Found<'_>) {
    let pos = |key: &str| root.at(&["context", key]).map(|n| n.pos);
    if context.max_tokens == 0 {
        found.add(pos("max_tokens"), "context.max_tokens must be at least 1".into());
    }
    if context.chunk_tokens < 16 {
        found.add(pos("chunk_tokens"), "context.chunk_tokens must be at least 16".into());
    }
    if !(0.0..=1.0).contains(&context.semantic_weight) {
        found.add(pos("semantic_weight"), "context.semantic_weight must be between 0 and 1".into());
    }
    if context.chunk_overlap * 2 > context.chunk_tokens {
        found.add(pos("chunk_overlap"), "context.chunk_overlap must be at most half of context.chunk_tokens".into());
    }
}
