//! # mcp-context
//!
//! The host-side piece that gives an LLM call the context its MCP servers
//! hold: connect to many servers, discover every resource, keep only what
//! *this user* may see, read it, render it, fit it to a token budget counted
//! with the model's own tokenizer, and prepend **one** system (or developer)
//! message to a chat-completions request, on a path kept apart from tool
//! calls. Every injection returns a [`Report`] of what was included,
//! truncated or left out, and why.
//!
//! ```no_run
//! # async fn demo() -> Result<(), mcp_context::Error> {
//! use mcp_context::{Config, McpContext};
//! let config = Config::load(std::path::Path::new("mcp-context.yaml"))?;
//! let ctx = McpContext::from_config(&config).await?;
//! let request = async_openai::types::chat::CreateChatCompletionRequestArgs::default()
//!     .model("gpt-4o")
//!     .messages([async_openai::types::chat::ChatCompletionRequestUserMessage::from("hi").into()])
//!     .build()
//!     .map_err(mcp_context::Error::OpenAI)?;
//! let (request, report) = ctx.inject(request, "alice").await?;
//! println!("{} tokens of context", report.tokens);
//! ctx.close().await;
//! # Ok(()) }
//! ```
//!
//! The pipeline, one private module per stage: `config` → `hub` (connect,
//! list, read) → `policy` (decide before reading) → `render` → `budget` →
//! `inject`, orchestrated by `context`; every *requested* `server:uri` passes
//! one gate (`gate`: [`admit`]) before the policy decides on it; `client` wraps async-openai and
//! `tools` offers the model-driven path.

#![warn(missing_docs)]

/// The async-openai this crate is built against, so that request and message
/// types match ours exactly.
pub use async_openai;

mod cache;
mod cause;
mod client;
mod compose;
mod config;
mod context;
#[cfg(feature = "cli")]
pub mod demo;
mod error;
mod gate;
mod http;
mod hub;
mod id;
mod inject;
mod jsonc;
mod large;
mod lru;
mod mode;
mod pipe;
mod policy;
mod report;
mod resource;
mod tokenize;
mod tools;
mod yaml;

pub use client::{ContextClient, ToolLoop};
pub use compose::{
    ChunkIndex, Composition, DEFAULT_CHUNK_INDEX_MAX_BYTES, DEFAULT_CHUNK_OVERLAP, DEFAULT_CHUNK_TOKENS,
    DEFAULT_PREAMBLE, DEFAULT_PRIORITY, EARLIER_TURN_WEIGHT, EARLIER_TURNS, EMPTY_CONTENT, MAX_QUERY_BYTES, Query,
    compose, compose_by_relevance, render_text,
};
pub use config::{
    CacheBackend, CacheSettings, Config, ContextSettings, DEFAULT_KEY_PREFIX, DEFAULT_LISTEN, DEFAULT_MAX_BODY_BYTES,
    DEFAULT_PRIVATE_MAX_BYTES, DEFAULT_REDIS_URL, DEFAULT_UPSTREAM, DEFAULT_WARM_MEMO_MAX_BYTES, ENV_ALLOWLIST,
    KeyDigest, PassthroughRule, Protocol, ServeSettings, ServerConfig, Transport, UpstreamUser,
};
pub use context::{ContextMessage, ContextRequest, McpContext};
pub use error::{Error, Result};
pub use gate::{Admitted, Refusal, Via, admit};
pub use hub::{Hub, HubEvent, ServerStatus};
pub use id::{MAX_USER_NAME_BYTES, ResourceId, user_name_problem};
pub use inject::{
    INSTRUCTIONS_CLOSE, INSTRUCTIONS_OPEN, MESSAGE_NAME, compose_instructions, inject_instructions_json,
    inject_message, inject_message_json, is_context_message, is_context_message_json, latest_user_text_json,
};
pub use mode::{MessageRole, SelectMode};
pub use policy::{
    Decision, Effect, Policy, PolicySummary, RoleSummary, RuleRef, UserPolicy, UserSummary, canonical_uri,
};
pub use report::{
    ChunkReport, ExcludeReason, Excluded, Included, Report, ServerFailure, ServerProtocol, SharedCacheReport,
    SharedCacheStatus, Timings,
};
pub use resource::{Annotations, Audience, ContentPart, Contents, Resource, ResourceTemplate};
pub use tokenize::{TokenCache, Tokenizer};
pub use tools::{
    LIST_TOOL, READ_TOOL, ResourceTools, ToolResult, add_tools, format_listing, is_resource_tool, tool_definitions,
};
