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
//!     .map_err(mcp_context::Error::from)?;
//! let (request, report) = ctx.inject(request, "alice").await?;
//! println!("{} tokens of context", report.tokens);
//! ctx.close().await;
//! # Ok(()) }
//! ```
//!
//! # Layers
//!
//! Each module imports only from the layers below it (README, "Where things
//! are"): the bottom (ids, resources, errors, the report, the two modes),
//! the tokenizer, [`compose`] (pure: render, pack, chunk, rank), the
//! settings (`config`), policy and the gate ([`access`]), the sources
//! ([`servers`]: connections, transports, the content cache), the
//! orchestrator ([`McpContext`], one request in `context/request.rs`; it
//! puts the message in place with [`inject`]), the adapters ([`tools`],
//! [`ContextClient`]) and the proxy (`serve`).
//!
//! # The public API
//!
//! The crate root holds what an application needs to inject context and
//! read the report; the named modules hold the rest on purpose:
//! [`settings`] (the config file's sections), [`access`] (policies and the
//! gate), [`servers`] (the connections), [`compose`] (the pure middle, for
//! callers that read resources themselves), [`inject`] (injection into
//! requests, typed and as JSON), [`tools`] (the model-driven path),
//! [`resource`] (MCP resource types) and [`display`] (outside text escaped
//! for terminals and log lines).

/// The async-openai this crate is built against, so that request and message
/// types match ours exactly.
pub use async_openai;

pub mod audit;
mod breakpoints;
mod cache;
mod cause;
mod client;
pub mod compose;
mod config;
mod context;
pub mod credentials;
/// The bundled demo MCP server (`mcp-context demo-server`), public because
/// the CLI, the chatbot example and the tests start it in-process; feature
/// `cli`.
#[cfg(feature = "cli")]
pub mod demo;
pub mod display;
mod error;
mod gate;
mod http;
mod hub;
mod id;
pub mod identity;
pub mod inject;
mod jsonc;
mod large;
mod lru;
pub mod messages;
mod mode;
mod pipe;
mod policy;
pub mod preflight;
mod report;
pub mod resource;
#[cfg(feature = "serve")]
pub mod serve;
mod server_process;
pub mod telemetry;
mod tokenize;
pub mod tools;
mod yaml;

pub use client::{ContextClient, ToolLoop};
pub use config::Config;
pub use context::{ContextMessage, ContextRequest, McpContext};
pub use error::{Error, Result};
pub use id::ResourceId;
pub use mode::{MessageRole, SelectMode};
pub use policy::Policy;
pub use report::{
    ChunkReport, ExcludeReason, Excluded, Exclusions, Included, Inclusions, Report, Semantic, ServerFailure,
    ServerProtocol, SharedCacheReport, SharedCacheStatus, Timings, UpstreamAuth,
};
pub use resource::{ContentPart, Contents, Resource};
pub use tools::ResourceTools;

/// The config file's sections and their defaults ([`Config`] is at the
/// crate root).
pub mod settings {
    pub use crate::compose::{DEFAULT_CHUNK_INDEX_MAX_BYTES, DEFAULT_CHUNK_OVERLAP, DEFAULT_CHUNK_TOKENS};
    #[cfg(feature = "jwt")]
    pub use crate::config::JwtConfig;
    pub use crate::config::{AnthropicSettings, DEFAULT_ANTHROPIC_UPSTREAM, DEFAULT_GEMINI_UPSTREAM, GeminiSettings};
    pub use crate::config::{
        AuditSettings, AuditSink, DEFAULT_AUDIT_BATCH, DEFAULT_AUDIT_FILE_KEEP, DEFAULT_AUDIT_FILE_MAX_BYTES,
        DEFAULT_AUDIT_QUEUE, DEFAULT_AUDIT_SCHEMA, DEFAULT_AUDIT_TABLE,
    };
    pub use crate::config::{
        CREDENTIALS_KEY_ENV, CredentialSettings, CredentialStoreKind, DEFAULT_AUTH_TIMEOUT_MS, DEFAULT_IDLE_TIMEOUT_MS,
        DEFAULT_MAX_USERS, DEFAULT_TOKENS_FILE, SecretKey,
    };
    pub use crate::config::{
        CacheBackend, CacheSettings, ContextSettings, DEFAULT_KEY_PREFIX, DEFAULT_LISTEN, DEFAULT_MAX_BODY_BYTES,
        DEFAULT_MAX_BODY_FIELDS, DEFAULT_PRIVATE_MAX_BYTES, DEFAULT_REDIS_URL, DEFAULT_UPSTREAM,
        DEFAULT_WARM_MEMO_MAX_BYTES, ENV_ALLOWLIST, HttpMode, KeyDigest, PassthroughRule, Protocol, ServeSettings,
        ServerConfig, Transport, UpstreamUser,
    };
    pub use crate::config::{
        ClientAuthMethod, OAuthSettings, PerUserHeadersSettings, ServerAuth, TokenExchangeSettings,
    };
    pub use crate::config::{DEFAULT_MCP_PAGE_SIZE, McpSettings};
    pub use crate::config::{DEFAULT_SERVICE_NAME, TelemetrySettings};
}

/// Who may see what: the compiled policy ([`Policy`] is at the crate root),
/// its decisions and summaries, and the gate every *requested* `server:uri`
/// passes before the policy decides on it ([`admit`](access::admit)).
pub mod access {
    pub use crate::gate::{Admitted, Refusal, Via, admit};
    pub use crate::id::{MAX_USER_NAME_BYTES, user_name_problem};
    pub use crate::policy::{
        Decision, Effect, PolicySummary, RoleSummary, RuleRef, UserPolicy, UserSummary, canonical_uri,
    };
}

/// The connections to the MCP servers: the [`Hub`](servers::Hub), its
/// events and each server's status.
pub mod servers {
    pub use crate::hub::{Hub, HubEvent, ServerStatus};
}

/// The Rust blocks of the book's chapters (docs/src/), compiled as doctests so that they cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../docs/src/library.md")]
#[doc = include_str!("../docs/src/verified-callers.md")]
struct BookDoctests;
