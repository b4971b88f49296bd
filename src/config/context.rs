//! The `context:` section: the model, the token budget, the message's role
//! and preamble, the read deadline, and how resources are chosen. May
//! import the config's constants and the composition defaults.

use std::time::Duration;

use serde::Deserialize;

use super::{DEFAULT_MAX_RESOURCE_BYTES, DEFAULT_MAX_TOKENS, Found, SelectMode};
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
    if context.chunk_overlap * 2 > context.chunk_tokens {
        found.add(pos("chunk_overlap"), "context.chunk_overlap must be at most half of context.chunk_tokens".into());
    }
}
