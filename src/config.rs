//! The configuration file (`mcp-context.yaml`).
//!
//! Parsed strictly (unknown keys are errors) from the located YAML tree
//! (`crate::yaml`, shared with the policy) so that every error carries the
//! line and column of the value at fault.
//!
//! A `.json` file is another host's config (Claude Desktop and Code, Cursor,
//! VS Code, Gemini CLI, Cline, Windsurf), read as it is: JSONC
//! (`crate::jsonc`), only the server map and our own sections taken, and
//! keys that belong to the host's own features (tool approval, trust, UI)
//! dropped before the same strict checks ([`host_view`]).
//!
//! `${VAR}` and `${VAR:-default}` are expanded from the environment in
//! `command`, `args`, `env`, `envFile`, `cwd`, `url` and `headers`. An unset
//! variable is an error naming the variable and the line, never its value.
//! `${MCP_CONTEXT_EXE}` defaults to the running executable, which is how the
//! bundled demo server is launched (`mcp-context demo-server`) without any
//! install. A stdio server runs in the config file's folder unless `cwd`
//! says otherwise, so relative `args` mean the same from anywhere.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::cause::redact_url;
use crate::error::{Error, Result};
use crate::id::{user_name_problem, validate_server_name};
pub use crate::mode::MessageRole;
pub(crate) use crate::mode::SelectMode;
use crate::yaml::{self, Named, Node, OrderedMap, Pos};

/// Default per-request timeout.
pub(crate) const DEFAULT_TIMEOUT_MS: u64 = 10_000;
/// Default token budget of the injected message.
pub(crate) const DEFAULT_MAX_TOKENS: usize = 4000;
/// Default cap on the text of one resource, applied before tokenising.
pub(crate) const DEFAULT_MAX_RESOURCE_BYTES: usize = 1 << 20;
/// Default number of reads in flight per stdio server.
pub(crate) const DEFAULT_MAX_CONCURRENT_READS: usize = 16;
/// Default number of reads in flight per HTTP server: 64. A remote server
/// costs a round trip per read, so reads finish in about
/// `n / max_concurrent_reads` round trips. At 10 ms RTT, 1000 reads took
/// 0.40 s with 64 in flight, under the raw client that keeps 64 in flight
/// (0.425 s); 32 in flight costs ~31 round trips of reads (~0.31 s) plus the
/// listing's ~15, past 1.1x of that client. More than 64 gains little (0.35 s
/// at 128) and asks more of a server that may rate-limit us.
pub(crate) const DEFAULT_MAX_CONCURRENT_READS_HTTP: usize = 64;
/// Default cache lifetime for servers that cannot notify us of changes.
pub(crate) const DEFAULT_CACHE_TTL_MS: u64 = 30_000;

/// Environment variables a stdio server inherits from the host by default.
/// Everything else must be named in the server's `env` or `inherit_env`: the
/// host's environment is full of secrets that a third-party server has no
/// business seeing.
pub const ENV_ALLOWLIST: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "TMPDIR",
    "TZ",
    "SYSTEMROOT",
    "NODE_PATH",
    "NVM_DIR",
    "RUST_LOG",
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default, alias = "mcpServers")]
    servers: OrderedMap<RawServer>,
    #[serde(default)]
    policy: Option<String>,
    #[serde(default)]
    context: Option<ContextSettings>,
    #[serde(default)]
    serve: Option<RawServe>,
    #[serde(default)]
    cache: Option<RawCache>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCache {
    #[serde(default)]
    backend: CacheBackend,
    url: Option<String>,
    key_prefix: Option<String>,
    ttl_ms: Option<u64>,
    lock_ms: Option<u64>,
    wait_ms: Option<u64>,
    timeout_ms: Option<u64>,
    ca_file: Option<String>,
    private_max_bytes: Option<usize>,
}

impl fmt::Debug for RawCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RawCache { .. }")
    }
}

/// Where read contents are kept (`cache.backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CacheBackend {
    /// In this process only (the default).
    #[default]
    Memory,
    /// In this process and in Redis, shared by every replica that names the
    /// same Redis and key prefix.
    Redis,
}

/// Default `cache.url`.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379/0";
/// Default `cache.key_prefix`.
pub const DEFAULT_KEY_PREFIX: &str = "mcp-context:";
/// Default `cache.private_max_bytes` (64 MiB): about 4000 private answers
/// of 16 KiB, a small share of a 512 MiB container.
pub const DEFAULT_PRIVATE_MAX_BYTES: usize = 64 << 20;

/// The `cache:` section: whether read contents are also shared through
/// Redis by every replica of a deployment (see the `cache` module), and how
/// many bytes of `private` answers this process keeps.
///
/// The per-server `cache`, `cache_ttl_ms` and `serve_stale` settings still
/// decide what is cached at all and for how long; this section adds the
/// shared layer behind the in-process cache and bounds its private entries.
#[derive(Clone)]
pub struct CacheSettings {
    /// `memory` (default) or `redis`.
    pub backend: CacheBackend,
    /// Redis URL (`redis://`, `rediss://` for TLS, `redis+unix://`); may
    /// carry credentials, so it is never printed whole (see `Debug`).
    pub url: String,
    /// Prefix of every key and channel, so deployments can share one Redis.
    pub key_prefix: String,
    /// Redis expiry of entries that have neither a server `ttlMs` hint nor a
    /// TTL of their own (those of servers that notify changes): a backstop
    /// for changes that no replica was subscribed to see.
    pub ttl: Duration,
    /// Life of the single-flight lock: a replica that dies while reading
    /// holds the others up at most this long.
    pub lock: Duration,
    /// How long a replica waits for another's read of the same resource
    /// before reading it itself.
    pub wait: Duration,
    /// Longest wait for one Redis command; past it the shared cache counts as
    /// down and requests go on without it.
    pub timeout: Duration,
    /// PEM certificate(s) to trust for `rediss://` besides the system's
    /// roots (a private CA or a self-signed server), resolved against the
    /// config's folder.
    pub ca_file: Option<PathBuf>,
    /// Bytes of `cacheScope: private` answers kept in this process, all
    /// users together (approximate: the text kept plus a fixed cost per
    /// entry). Past it the least recently used go first; expired ones are
    /// swept as well. `0` keeps none. Default [`DEFAULT_PRIVATE_MAX_BYTES`].
    pub private_max_bytes: usize,
}

impl Default for CacheSettings {
    fn default() -> Self {
        Self {
            backend: CacheBackend::Memory,
            url: DEFAULT_REDIS_URL.into(),
            key_prefix: DEFAULT_KEY_PREFIX.into(),
            ttl: Duration::from_millis(300_000),
            lock: Duration::from_millis(DEFAULT_TIMEOUT_MS),
            wait: Duration::from_millis(DEFAULT_TIMEOUT_MS),
            timeout: Duration::from_millis(250),
            ca_file: None,
            private_max_bytes: DEFAULT_PRIVATE_MAX_BYTES,
        }
    }
}

impl fmt::Debug for CacheSettings {
    /// Never prints the URL's credentials.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheSettings")
            .field("backend", &self.backend)
            .field("url", &redact_url(&self.url))
            .field("key_prefix", &self.key_prefix)
            .field("ttl", &self.ttl)
            .field("lock", &self.lock)
            .field("wait", &self.wait)
            .field("timeout", &self.timeout)
            .field("ca_file", &self.ca_file)
            .field("private_max_bytes", &self.private_max_bytes)
            .finish()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServe {
    listen: Option<String>,
    upstream: Option<String>,
    upstream_api_key: Option<String>,
    #[serde(default)]
    forward_authorization: bool,
    #[serde(default)]
    keys: Vec<RawKey>,
    keys_file: Option<String>,
    user_header: Option<String>,
    #[serde(default)]
    user_from_body: bool,
    anonymous_user: Option<String>,
    max_body_bytes: Option<usize>,
    upstream_timeout_ms: Option<u64>,
    shutdown_grace_ms: Option<u64>,
    max_concurrent_upstream: Option<usize>,
    #[serde(default)]
    passthrough: Vec<String>,
    allowed_hosts: Option<Vec<String>>,
    upstream_user: Option<UpstreamUser>,
    pseudonym_key: Option<String>,
    #[serde(default)]
    readyz_details: bool,
    max_connections: Option<usize>,
    header_timeout_ms: Option<u64>,
    body_timeout_ms: Option<u64>,
    max_inflight_body_bytes: Option<usize>,
    max_unidentified_body_bytes: Option<usize>,
    stored_retention_days: Option<u64>,
    max_stored_records: Option<usize>,
}

impl fmt::Debug for RawServe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RawServe { .. }")
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKey {
    sha256: String,
    user: String,
}

/// Default `serve.listen`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8787";
/// The upstream when neither the config, `--upstream` nor `$OPENAI_BASE_URL` names one.
pub const DEFAULT_UPSTREAM: &str = "https://api.openai.com/v1";
/// Default `serve.max_body_bytes` (10 MiB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 10 << 20;

/// What the upstream is told of the caller in the body's `user` and
/// `safety_identifier` (`serve.upstream_user`), when the caller sent them:
/// never what the caller wrote, which could name someone else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamUser {
    /// The identified user's name (the default).
    #[default]
    Identified,
    /// A stable pseudonym: HMAC-SHA256 of the name under `serve.pseudonym_key`.
    Pseudonym,
    /// Removed from the body.
    Drop,
}

/// One `serve.passthrough` entry: a method and a path pattern under `/v1/`
/// (`*` one segment, a last `**` one or more), relayed without injection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassthroughRule {
    /// `GET`, `POST`, `PUT`, `PATCH` or `DELETE`.
    pub method: String,
    /// The path's segments, e.g. `["v1", "files", "*"]`.
    pub segments: Vec<String>,
}

impl PassthroughRule {
    /// Parses `METHOD /v1/path/pattern`.
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        let hint = "write `METHOD /v1/PATH`, e.g. `GET /v1/files/*` (`*` one segment, a last `**` the rest)";
        let (method, path) = text.trim().split_once(' ').ok_or_else(|| format!("`{text}`: {hint}"))?;
        let method = method.to_ascii_uppercase();
        if !["GET", "POST", "PUT", "PATCH", "DELETE"].contains(&method.as_str()) {
            return Err(format!("`{text}`: `{method}` is not GET, POST, PUT, PATCH or DELETE"));
        }
        let segments: Vec<String> = path.trim().trim_start_matches('/').split('/').map(str::to_owned).collect();
        if !path.trim().starts_with("/v1/") || segments.len() < 2 {
            return Err(format!("`{text}`: the path must start with `/v1/`; {hint}"));
        }
        for (i, seg) in segments.iter().enumerate() {
            let ok = !seg.is_empty()
                && seg != "."
                && seg != ".."
                && (seg == "*"
                    || (seg == "**" && i == segments.len() - 1)
                    || seg.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.~:@".contains(&b)));
            if !ok {
                return Err(format!("`{text}`: `{seg}` is not a path segment; {hint}"));
            }
        }
        Ok(Self { method, segments })
    }

    /// The default list: what an application needs next to chat, with no
    /// stored state (`GET /v1/models`, `GET /v1/models/*`, `POST /v1/embeddings`, `POST /v1/moderations`).
    pub fn defaults() -> Vec<Self> {
        ["GET /v1/models", "GET /v1/models/*", "POST /v1/embeddings", "POST /v1/moderations"]
            .iter()
            .map(|r| Self::parse(r).expect("the default rules parse"))
            .collect()
    }
}

/// One caller key of `serve.keys`: only its SHA-256 digest is stored.
#[derive(Clone)]
pub struct KeyDigest {
    /// SHA-256 of the key.
    pub sha256: [u8; 32],
    /// The policy user the key stands for.
    pub user: String,
}

impl fmt::Debug for KeyDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyDigest {{ user: {:?} }}", self.user)
    }
}

/// The `serve:` section: how `mcp-context serve` listens, whom it forwards
/// to, and how it tells callers apart. Read by the `serve` command only; the
/// library just validates it with the rest of the file.
#[derive(Clone)]
pub struct ServeSettings {
    /// Address to listen on (`--listen` overrides).
    pub listen: String,
    /// Upstream base URL, ending before `/chat/completions` (e.g.
    /// `http://127.0.0.1:11434/v1`); `None`: `$OPENAI_BASE_URL`, else
    /// [`DEFAULT_UPSTREAM`] (`--upstream` overrides all).
    pub upstream: Option<String>,
    /// Sent upstream as `Authorization: Bearer`.
    pub upstream_api_key: Option<String>,
    /// Send the caller's own `Authorization` upstream instead.
    pub forward_authorization: bool,
    /// Caller keys (from `keys` and `keys_file`).
    pub keys: Vec<KeyDigest>,
    /// Header naming the user, set by a trusted gateway in front.
    pub user_header: Option<String>,
    /// The body's `user` / `safety_identifier` names the user.
    pub user_from_body: bool,
    /// User for requests with no identity; `None`: they get 401.
    pub anonymous_user: Option<String>,
    /// Larger request bodies get 413.
    pub max_body_bytes: usize,
    /// Longest wait for the upstream's response headers (and between two
    /// chunks of its body) before 504.
    pub upstream_timeout: Duration,
    /// How long in-flight requests may run after SIGTERM / Ctrl-C.
    pub shutdown_grace: Duration,
    /// Upstream requests in flight at once; more wait their turn.
    pub max_concurrent_upstream: usize,
    /// Other endpoints relayed as they are (the defaults, then `serve.passthrough`).
    pub passthrough: Vec<PassthroughRule>,
    /// `Host` values accepted on `/v1/` (`serve.allowed_hosts`); `None`: the
    /// listen address, plus `localhost` forms when it is a loopback address,
    /// and any host when it listens on all interfaces (`0.0.0.0`, `::`).
    pub allowed_hosts: Option<Vec<String>>,
    /// What the upstream sees in the body's `user` / `safety_identifier`.
    pub upstream_user: UpstreamUser,
    /// The key of `upstream_user: pseudonym`.
    pub pseudonym_key: Option<String>,
    /// `/readyz` shows servers, policy and shared cache, not only the status.
    pub readyz_details: bool,
    /// Open connections at once; past it the proxy stops accepting until one closes.
    pub max_connections: usize,
    /// Longest time a client may take to send a request's headers.
    pub header_timeout: Duration,
    /// Longest time a client may take to send a request's body.
    pub body_timeout: Duration,
    /// Request body bytes held at once, all requests together; past it: 503.
    pub max_inflight_body_bytes: usize,
    /// The share of `max_inflight_body_bytes` for callers not identified by
    /// their headers (`user_from_body`, `anonymous_user`).
    pub max_unidentified_body_bytes: usize,
    /// How long the owner of a stored completion, response or conversation is
    /// remembered (the upstream's retention; OpenAI keeps them 30 days).
    pub stored_retention: Duration,
    /// Ownership records kept in this process (oldest dropped first: their
    /// objects then answer 404, never someone else's).
    pub max_stored_records: usize,
}

impl Default for ServeSettings {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN.into(),
            upstream: None,
            upstream_api_key: None,
            forward_authorization: false,
            keys: Vec::new(),
            user_header: None,
            user_from_body: false,
            anonymous_user: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            upstream_timeout: Duration::from_millis(600_000),
            shutdown_grace: Duration::from_millis(10_000),
            max_concurrent_upstream: 512,
            passthrough: PassthroughRule::defaults(),
            allowed_hosts: None,
            upstream_user: UpstreamUser::Identified,
            pseudonym_key: None,
            readyz_details: false,
            max_connections: 1024,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_inflight_body_bytes: 256 << 20,
            max_unidentified_body_bytes: 32 << 20,
            stored_retention: Duration::from_secs(30 * 24 * 3600),
            max_stored_records: 200_000,
        }
    }
}

impl fmt::Debug for ServeSettings {
    /// Never prints the upstream key or the key digests.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServeSettings")
            .field("listen", &self.listen)
            .field("upstream", &self.upstream.as_deref().map(redact_url))
            .field("upstream_api_key", &self.upstream_api_key.as_ref().map(|_| "***"))
            .field("forward_authorization", &self.forward_authorization)
            .field("keys", &self.keys.len())
            .field("user_header", &self.user_header)
            .field("user_from_body", &self.user_from_body)
            .field("anonymous_user", &self.anonymous_user)
            .finish_non_exhaustive()
    }
}

/// Parses a 64-digit hex SHA-256 digest.
fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    #[serde(default, rename = "type", alias = "transportType")]
    kind: Option<String>,
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    inherit_env: Vec<String>,
    #[serde(rename = "envFile")]
    env_file: Option<String>,
    cwd: Option<String>,
    #[serde(alias = "httpUrl", alias = "serverUrl")]
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(alias = "timeout")]
    timeout_ms: Option<u64>,
    #[serde(default)]
    disabled: bool,
    max_concurrent_reads: Option<usize>,
    cache: Option<bool>,
    cache_ttl_ms: Option<u64>,
    #[serde(default)]
    serve_stale: bool,
    protocol: Option<String>,
}

/// The keys of [`RawServer`], aliases included: what a host's server entry
/// keeps (see [`host_view`]).
const SERVER_KEYS: &[&str] = &[
    "type",
    "transportType",
    "command",
    "args",
    "env",
    "inherit_env",
    "envFile",
    "cwd",
    "url",
    "httpUrl",
    "serverUrl",
    "headers",
    "timeout_ms",
    "timeout",
    "disabled",
    "max_concurrent_reads",
    "cache",
    "cache_ttl_ms",
    "serve_stale",
    "protocol",
];

/// Per-server keys of other hosts' own features, dropped without a word
/// from a `.json` config (README, "Configs from other hosts"). Any other
/// unknown key is dropped too, with a warning (it may be a typo).
pub const FOREIGN_SERVER_KEYS: &[&str] = &[
    // Gemini CLI
    "trust",
    "includeTools",
    "excludeTools",
    "description",
    "oauth",
    "authProviderType",
    "targetAudience",
    "targetServiceAccount",
    "extensionName",
    // Cline, Roo Code, Windsurf
    "autoApprove",
    "alwaysAllow",
    "disabledTools",
    "networkTimeout",
    "watchPaths",
    // Claude Code, VS Code, Cursor
    "dev",
    "gallery",
    "version",
    "auth",
    "name",
    "enabled",
];

/// The top-level sections of our own that a `.json` config may also hold.
const OWN_SECTIONS: &[&str] = &["servers", "mcpServers", "policy", "context", "serve", "cache"];

/// The keys of [`ContextSettings`]: a `context` holding any other key is
/// Gemini CLI's (`fileName`, `includeDirectories`…), not ours.
const CONTEXT_KEYS: &[&str] = &[
    "model",
    "max_tokens",
    "role",
    "preamble",
    "max_resource_bytes",
    "tool_result_max_tokens",
    "deadline_ms",
    "select",
    "chunk_tokens",
    "chunk_overlap",
];

/// Whether `path` is another host's config (`.json`, `.jsonc`), read as it is.
fn is_host_file(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("json") || e.eq_ignore_ascii_case("jsonc"))
}

/// Another host's config as we read it: of the top level only our sections
/// (`mcpServers` / `servers`, and `policy`, `context`, `serve`, `cache` when
/// they are ours), and of each server only the keys we know. What is
/// dropped belongs to the host (Gemini's `theme`, VS Code's `inputs`, Cline's
/// `autoApprove`); an unknown server key not in [`FOREIGN_SERVER_KEYS`] is
/// logged as a warning with its place, since it may be a misspelt one of ours.
fn host_view<'a>(root: Node<'a>, path: &Path) -> Node<'a> {
    let keep = |entries: Vec<(Node<'a>, Node<'a>)>, f: &dyn Fn(&Node<'a>, &Node<'a>) -> bool| {
        entries.into_iter().filter(|(k, v)| f(k, v)).collect::<Vec<_>>()
    };
    let yaml::Kind::Map(top) = root.kind else { return root };
    let top = keep(top, &|k, v| match k.as_str() {
        Some("context") => v.entries().all(|(k, _)| k.as_str().is_some_and(|k| CONTEXT_KEYS.contains(&k))),
        Some(k) => OWN_SECTIONS.contains(&k),
        None => false,
    });
    let top = top
        .into_iter()
        .map(|(k, mut v)| {
            if matches!(k.as_str(), Some("servers" | "mcpServers"))
                && let yaml::Kind::Map(servers) = &mut v.kind
            {
                for (name, server) in servers.iter_mut() {
                    let yaml::Kind::Map(entries) = &mut server.kind else { continue };
                    *entries = keep(std::mem::take(entries), &|key, _| {
                        let key_text = key.as_str().unwrap_or("");
                        if SERVER_KEYS.contains(&key_text) {
                            return true;
                        }
                        if !FOREIGN_SERVER_KEYS.contains(&key_text) {
                            tracing::warn!(
                                "{}:{}:{}: server `{}`: `{key_text}` is not a key mcp-context knows; ignored",
                                path.display(),
                                key.pos.line,
                                key.pos.column,
                                name.as_str().unwrap_or("")
                            );
                        }
                        false
                    });
                }
            }
            (k, v)
        })
        .collect();
    Node { kind: yaml::Kind::Map(top), ..root }
}

impl Named for RawServer {
    const NOUN: &'static str = "server";
}

impl fmt::Debug for RawServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RawServer { .. }")
    }
}

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
    /// Longest an injection may wait for reads, in ms: a resource not read
    /// by then is left out (reason `error`, "deadline"), so one slow server
    /// never holds up the LLM call beyond this.
    #[serde(default = "default_deadline_ms")]
    pub deadline_ms: u64,
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
pub use crate::compose::DEFAULT_CHUNK_INDEX_MAX_BYTES;

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
fn default_deadline_ms() -> u64 {
    15_000
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
            deadline_ms: default_deadline_ms(),
            select: SelectMode::default(),
            chunk_tokens: default_chunk_tokens(),
            chunk_overlap: default_chunk_overlap(),
            warm_memo_max_bytes: DEFAULT_WARM_MEMO_MAX_BYTES,
            chunk_index_max_bytes: DEFAULT_CHUNK_INDEX_MAX_BYTES,
        }
    }
}

/// How to reach one server.
#[derive(Clone)]
pub enum Transport {
    /// A child process speaking newline-delimited JSON-RPC on stdio.
    Stdio {
        /// Program to run.
        command: String,
        /// The program as the config wrote it, before `${VAR}` expansion:
        /// what errors and logs show, so no expanded secret reaches them.
        command_display: String,
        /// Its arguments.
        args: Vec<String>,
        /// Variables set for it (on top of the allowlisted host variables).
        env: BTreeMap<String, String>,
        /// Extra host variables to pass through by name.
        inherit_env: Vec<String>,
        /// Working directory.
        cwd: Option<PathBuf>,
    },
    /// Streamable HTTP, or the legacy HTTP+SSE transport (`type: sse`).
    Http {
        /// Endpoint URL (the SSE stream's, for `sse`).
        url: String,
        /// Extra request headers (e.g. `Authorization`).
        headers: BTreeMap<String, String>,
        /// The legacy HTTP+SSE transport of MCP 2024-11-05 (`type: sse`):
        /// `GET` the event stream, `POST` to the endpoint it names.
        sse: bool,
    },
}

impl fmt::Debug for Transport {
    /// Never prints `env` or header values: they hold secrets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transport::Stdio { command, args, env, cwd, .. } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", &args.len())
                .field("env", &env.keys().collect::<Vec<_>>())
                .field("cwd", cwd)
                .finish(),
            Transport::Http { url, headers, sse } => f
                .debug_struct("Http")
                .field("url", &redact_url(url))
                .field("sse", sse)
                .field("headers", &headers.keys().collect::<Vec<_>>())
                .finish(),
        }
    }
}

/// Which MCP revision to speak with one server (`protocol:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum Protocol {
    /// Probe with `server/discover` (2026-07-28); a server that answers it
    /// with an error is legacy and gets the `initialize` handshake
    /// (2025-11-25) at once, on the same connection.
    #[default]
    #[serde(rename = "auto")]
    Auto,
    /// Only 2026-07-28: `server/discover`, no handshake, `subscriptions/listen`.
    #[serde(rename = "2026-07-28")]
    V2026_07_28,
    /// Only 2025-11-25: the `initialize` handshake and `resources/subscribe`.
    #[serde(rename = "2025-11-25")]
    V2025_11_25,
}

impl Protocol {
    /// The values `protocol:` accepts, as written in a config.
    pub const NAMES: &'static [&'static str] = &["auto", "2026-07-28", "2025-11-25"];

    fn parse(s: &str) -> Option<Protocol> {
        match s {
            "auto" => Some(Protocol::Auto),
            "2026-07-28" => Some(Protocol::V2026_07_28),
            "2025-11-25" => Some(Protocol::V2025_11_25),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Auto => "auto",
            Protocol::V2026_07_28 => "2026-07-28",
            Protocol::V2025_11_25 => "2025-11-25",
        })
    }
}

/// One configured server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Its name (letters, digits, `-`, `_`).
    pub name: String,
    /// How to reach it.
    pub transport: Transport,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Reads in flight at once on this server: `max_concurrent_reads`, by
    /// default 16 over stdio and 64 over HTTP
    /// (the constant `DEFAULT_MAX_CONCURRENT_READS_HTTP` in `config.rs` says why). Over HTTP it is also
    /// how many requests the transport sends at once (plus a few for
    /// listings), so it reaches the wire; at most 256 reads are in flight
    /// across all servers.
    pub max_concurrent_reads: usize,
    /// Whether read contents are cached.
    pub cache: bool,
    /// Cache lifetime when the server cannot notify changes.
    pub cache_ttl: Duration,
    /// Serve the last good content when a re-read fails.
    pub serve_stale: bool,
    /// The MCP revision to speak (`auto` by default).
    pub protocol: Protocol,
    /// Values expanded from `${VAR}` for this server; never shown.
    pub(crate) secrets: Secrets,
    /// Why this server cannot be started though its entry is valid (a
    /// transport this build lacks): its connection fails with this, alone.
    pub(crate) unsupported: Option<String>,
}

/// Secret values, hidden from `Debug`.
#[derive(Clone, Default)]
pub(crate) struct Secrets(pub(crate) Vec<String>);

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{} hidden]", self.0.len())
    }
}

impl ServerConfig {
    /// Removes this server's secrets (expanded `${VAR}` values, URL query
    /// and userinfo) from a message before it is logged, reported or returned.
    pub(crate) fn scrub(&self, message: &str) -> String {
        let mut out = message.to_owned();
        for s in &self.secrets.0 {
            out = out.replace(s.as_str(), "***");
        }
        if let Transport::Http { url, .. } = &self.transport {
            out = out.replace(url.as_str(), &redact_url(url));
        }
        out
    }
}

/// The whole configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where it was loaded from (for messages); relative paths resolved against its folder.
    pub path: PathBuf,
    /// Servers, in file order (which breaks priority ties).
    pub servers: Vec<ServerConfig>,
    /// Policy file or folder, resolved.
    pub policy: Option<PathBuf>,
    /// The `context:` section.
    pub context: ContextSettings,
    /// The `serve:` section (defaults when absent).
    pub serve: ServeSettings,
    /// The `cache:` section (the in-process cache only when absent).
    pub cache: CacheSettings,
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config> {
        let src = std::fs::read_to_string(path).map_err(|e| Error::Config {
            path: path.to_owned(),
            line: None,
            column: None,
            message: format!("cannot read the config file: {e}"),
        })?;
        Self::from_yaml(&src, path)
    }

    /// Finds the config the CLI way: `explicit`, else `$MCP_CONTEXT_CONFIG`, else `./mcp-context.yaml`.
    pub fn locate(explicit: Option<&Path>) -> PathBuf {
        if let Some(p) = explicit {
            return p.to_owned();
        }
        match std::env::var_os("MCP_CONTEXT_CONFIG") {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => PathBuf::from("mcp-context.yaml"),
        }
    }

    /// Parses config text; `path` names the file in errors and anchors relative paths.
    pub fn from_yaml(src: &str, path: &Path) -> Result<Config> {
        Self::from_yaml_with_env(src, path, &|k| std::env::var(k).ok())
    }

    /// Like [`Config::from_yaml`] with an explicit environment (for tests and embedding).
    pub fn from_yaml_with_env(src: &str, path: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<Config> {
        let err = |line: Option<usize>, column: Option<usize>, message: String| Error::Config {
            path: path.to_owned(),
            line,
            column,
            message,
        };
        let at = |pos: Option<Pos>| (pos.map(|p| p.line), pos.map(|p| p.column));
        let host = is_host_file(path);
        let parsed = if host { crate::jsonc::parse(src) } else { yaml::parse(src) };
        let root = parsed
            .map_err(|p| {
                let (l, c) = at(p.pos);
                err(l, c, p.message)
            })?
            .unwrap_or_else(Node::empty_map);
        let root = if host { host_view(root, path) } else { root };
        let raw: RawConfig = yaml::from_node_strict(&root).map_err(|p| {
            let (l, c) = at(p.pos);
            err(l, c, p.message)
        })?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let base = if base.as_os_str().is_empty() { PathBuf::from(".") } else { base };
        // What a stdio server's relative command and default working directory
        // are resolved against: absolute, since the child starts in it.
        let abs_base = std::path::absolute(&base).unwrap_or_else(|_| base.clone());
        // VS Code's `${workspaceFolder}`: the folder holding `.vscode/`.
        let workspace = match abs_base.file_name() {
            Some(n) if n == ".vscode" => abs_base.parent().unwrap_or(&abs_base).to_path_buf(),
            _ => abs_base.clone(),
        };
        let servers_node = root.get("servers").or_else(|| root.get("mcpServers"));
        let context_pos = |key: &str| at(root.at(&["context", key]).map(|n| n.pos));
        // Every value that came from the environment: errors and logs about
        // a server are scrubbed of them (see `ServerConfig::scrub`).
        let secrets = std::cell::RefCell::new(Vec::<String>::new());
        let recording_env = |k: &str| {
            match k {
                "workspaceFolder" => return Some(workspace.to_string_lossy().into_owned()),
                "userHome" => return env("HOME"),
                _ => {}
            }
            let v = env(k);
            if let Some(v) = &v
                && v.len() >= 4
                && k != "MCP_CONTEXT_EXE"
            {
                secrets.borrow_mut().push(v.clone());
            }
            v
        };
        let expand = |s: &str, server: &str| -> Result<String> {
            expand_vars(s, &recording_env).map_err(|token| {
                let node = servers_node.and_then(|n| n.get(server)).unwrap_or(&root);
                let (line, column) = at(Some(yaml::pos_within(src, node, &format!("${{{token}}}"))));
                err(line, column, format!("server `{server}`: {}", unexpanded(&token)))
            })
        };

        let mut servers = Vec::new();
        for (name, s) in raw.servers.0 {
            // Where the server is named: its key, as the parser saw it.
            let server_node = servers_node.and_then(|n| n.get(&name));
            let (at, at_col) = at(servers_node.and_then(|n| n.key_at(&name, 0)).map(|k| k.pos));
            validate_server_name(&name).map_err(|m| err(at, at_col, format!("invalid server name: {m}")))?;
            if s.disabled {
                continue;
            }
            let transport = match (&s.command, &s.url) {
                (Some(_), Some(_)) => {
                    return Err(err(at, at_col, format!("server `{name}` has both `command` and `url`; keep one")));
                }
                (None, None) => {
                    return Err(err(
                        at,
                        at_col,
                        format!("server `{name}` needs `command` (stdio) or `url` (Streamable HTTP)"),
                    ));
                }
                (Some(cmd), None) => {
                    if let Some(k) = s.kind.as_deref().filter(|k| *k != "stdio") {
                        return Err(err(
                            at,
                            at_col,
                            format!("server `{name}` has `command` but `type: {k}`; use `type: stdio`"),
                        ));
                    }
                    if !s.headers.is_empty() {
                        return Err(err(at, at_col, format!("server `{name}`: `headers` only apply to `url` servers")));
                    }
                    let command = expand(cmd, &name)?;
                    let command = if command.contains('/') && Path::new(&command).is_relative() {
                        abs_base.join(&command).to_string_lossy().into_owned()
                    } else {
                        command
                    };
                    let mut env_out = BTreeMap::new();
                    for (k, v) in &s.env {
                        env_out.insert(k.clone(), expand(v, &name)?);
                    }
                    if let Some(file) = &s.env_file {
                        let file = abs_base.join(expand(file, &name)?);
                        let value = server_node.and_then(|n| n.get("envFile"));
                        let (line, column) = value.map_or((at, at_col), |v| (Some(v.pos.line), Some(v.pos.column)));
                        let vars = dotenvy::from_path_iter(&file)
                            .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>());
                        let vars = vars.map_err(|e| {
                            err(line, column, format!("server `{name}`: cannot read envFile `{}`: {e}", file.display()))
                        })?;
                        for (k, v) in vars {
                            if v.len() >= 4 {
                                secrets.borrow_mut().push(v.clone());
                            }
                            // `env` wins over the file, as in VS Code.
                            env_out.entry(k).or_insert(v);
                        }
                    }
                    let cwd = match s.cwd.as_deref() {
                        Some(c) => abs_base.join(expand(c, &name)?),
                        None => abs_base.clone(),
                    };
                    Transport::Stdio {
                        command,
                        command_display: cmd.clone(),
                        args: s.args.iter().map(|a| expand(a, &name)).collect::<Result<_>>()?,
                        env: env_out,
                        inherit_env: s.inherit_env.clone(),
                        cwd: Some(cwd),
                    }
                }
                (None, Some(url)) => {
                    if let Some(k) = s.kind.as_deref().filter(|k| {
                        !matches!(*k, "http" | "streamable-http" | "streamableHttp" | "streamable_http" | "sse")
                    }) {
                        return Err(err(
                            at,
                            at_col,
                            format!(
                                "server `{name}`: `type: {k}` is not supported; use Streamable HTTP (`type: http`)"
                            ),
                        ));
                    }
                    if !s.args.is_empty() || !s.env.is_empty() || s.cwd.is_some() || s.env_file.is_some() {
                        return Err(err(
                            at,
                            at_col,
                            format!(
                                "server `{name}`: `args`, `env`, `envFile` and `cwd` only apply to `command` servers"
                            ),
                        ));
                    }
                    let url = expand(url, &name)?;
                    if !(url.starts_with("http://") || url.starts_with("https://")) {
                        // Point at the value as written.
                        let value = server_node.and_then(|n| n.get("url").or_else(|| n.get("httpUrl")));
                        let (line, column) = match value {
                            Some(v) => (Some(v.pos.line), Some(v.pos.column)),
                            None => (at, at_col),
                        };
                        return Err(err(
                            line,
                            column,
                            format!(
                                "server `{name}`: url must start with http:// or https:// (got `{}`)",
                                redact_url(&url)
                            ),
                        ));
                    }
                    let mut headers = BTreeMap::new();
                    for (k, v) in &s.headers {
                        headers.insert(k.clone(), expand(v, &name)?);
                    }
                    Transport::Http { url, headers, sse: s.kind.as_deref() == Some("sse") }
                }
            };
            let mut timeout_ms = s.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
            // Cline writes `timeout` in seconds (60 by default), Gemini CLI in
            // milliseconds (600000): under 1000 it can only be seconds.
            if host && timeout_ms < 1000 && server_node.is_some_and(|n| n.get("timeout").is_some()) {
                timeout_ms *= 1000;
            }
            if timeout_ms == 0 {
                return Err(err(at, at_col, format!("server `{name}`: timeout_ms must be at least 1")));
            }
            let reads = s.max_concurrent_reads.unwrap_or(match transport {
                Transport::Http { .. } => DEFAULT_MAX_CONCURRENT_READS_HTTP,
                Transport::Stdio { .. } => DEFAULT_MAX_CONCURRENT_READS,
            });
            if reads == 0 {
                return Err(err(at, at_col, format!("server `{name}`: max_concurrent_reads must be at least 1")));
            }
            let protocol = match s.protocol.as_deref() {
                None => Protocol::Auto,
                Some(p) => Protocol::parse(p).ok_or_else(|| {
                    // Point at the value as written.
                    let (line, column) = match server_node.and_then(|n| n.get("protocol")) {
                        Some(v) => (Some(v.pos.line), Some(v.pos.column)),
                        None => (at, at_col),
                    };
                    err(
                        line,
                        column,
                        format!("server `{name}`: protocol must be one of {} (got `{p}`)", Protocol::NAMES.join(", ")),
                    )
                })?,
            };
            let mut server_secrets = std::mem::take(&mut *secrets.borrow_mut());
            server_secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
            server_secrets.dedup();
            servers.push(ServerConfig {
                secrets: Secrets(server_secrets),
                name,
                transport,
                timeout: Duration::from_millis(timeout_ms),
                max_concurrent_reads: reads,
                cache: s.cache.unwrap_or(true),
                cache_ttl: Duration::from_millis(s.cache_ttl_ms.unwrap_or(DEFAULT_CACHE_TTL_MS)),
                serve_stale: s.serve_stale,
                protocol,
                unsupported: None,
            });
        }
        let context = raw.context.unwrap_or_default();
        if context.max_tokens == 0 {
            let (l, c) = context_pos("max_tokens");
            return Err(err(l, c, "context.max_tokens must be at least 1".into()));
        }
        if context.chunk_tokens < 16 {
            let (l, c) = context_pos("chunk_tokens");
            return Err(err(l, c, "context.chunk_tokens must be at least 16".into()));
        }
        if context.chunk_overlap * 2 > context.chunk_tokens {
            let (l, c) = context_pos("chunk_overlap");
            return Err(err(l, c, "context.chunk_overlap must be at most half of context.chunk_tokens".into()));
        }
        let serve = match raw.serve {
            None => ServeSettings::default(),
            Some(raw) => serve_settings(raw, root.get("serve").unwrap_or(&root), path, &base, env)?,
        };
        let cache = match raw.cache {
            None => CacheSettings::default(),
            Some(raw) => cache_settings(raw, root.get("cache").unwrap_or(&root), path, &base, env)?,
        };
        Ok(Config { path: path.to_owned(), servers, policy: raw.policy.map(|p| base.join(p)), context, serve, cache })
    }

    /// The server of that name.
    pub fn server(&self, name: &str) -> Option<&ServerConfig> {
        self.servers.iter().find(|s| s.name == name)
    }
}

/// Validates the `cache:` section: `${VAR}` in `url` (credentials belong
/// in the environment), the URL's scheme, positive durations, and that this
/// build has the Redis backend.
fn cache_settings(
    raw: RawCache,
    node: &Node,
    path: &Path,
    base: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<CacheSettings> {
    let err = |key: &str, message: String| {
        let pos = node.get(key).map_or(node.pos, |n| n.pos);
        Error::Config { path: path.to_owned(), line: Some(pos.line), column: Some(pos.column), message }
    };
    let d = CacheSettings::default();
    let url = match raw.url.as_deref() {
        None => d.url.clone(),
        Some(u) => expand_vars(u, env).map_err(|token| err("url", format!("cache.url: {}", unexpanded(&token))))?,
    };
    if !["redis://", "rediss://", "redis+unix://", "unix://"].iter().any(|s| url.starts_with(s)) {
        return Err(err(
            "url",
            format!(
                "cache.url must start with redis://, rediss:// (TLS) or redis+unix:// (got `{}`)",
                redact_url(&url)
            ),
        ));
    }
    if raw.backend == CacheBackend::Redis && !cfg!(feature = "redis") {
        return Err(err("backend", "cache.backend: this build has no Redis support (feature `redis`)".into()));
    }
    #[cfg(feature = "redis")]
    if let Err(e) = redis::Client::open(url.as_str()) {
        return Err(err("url", format!("cache.url `{}` is not a valid Redis URL: {e}", redact_url(&url))));
    }
    let ms = |key: &str, v: Option<u64>, default: Duration| match v {
        Some(0) => Err(err(key, format!("cache.{key} must be at least 1"))),
        Some(v) => Ok(Duration::from_millis(v)),
        None => Ok(default),
    };
    let lock = ms("lock_ms", raw.lock_ms, d.lock)?;
    let ca_file = match raw.ca_file {
        None => None,
        Some(f) => {
            let file = base.join(&f);
            let pem = std::fs::read(&file)
                .map_err(|e| err("ca_file", format!("cache.ca_file `{f}`: cannot read it: {e}")))?;
            #[cfg(feature = "redis")]
            if let Err(e) = redis::Client::build_with_tls(
                url.as_str(),
                redis::TlsCertificates { client_tls: None, root_cert: Some(pem) },
            ) {
                return Err(err("ca_file", format!("cache.ca_file `{f}`: not usable as a PEM CA certificate: {e}")));
            }
            #[cfg(not(feature = "redis"))]
            let _ = pem;
            Some(file)
        }
    };
    Ok(CacheSettings {
        backend: raw.backend,
        url,
        key_prefix: raw.key_prefix.unwrap_or(d.key_prefix),
        ttl: ms("ttl_ms", raw.ttl_ms, d.ttl)?,
        lock,
        wait: ms("wait_ms", raw.wait_ms, lock)?,
        timeout: ms("timeout_ms", raw.timeout_ms, d.timeout)?,
        ca_file,
        private_max_bytes: raw.private_max_bytes.unwrap_or(d.private_max_bytes),
    })
}

/// Validates the `serve:` section: `${VAR}` in `upstream` and
/// `upstream_api_key`, exactly one source of upstream credentials, key
/// digests (and `keys_file`, relative to the config), header names.
fn serve_settings(
    raw: RawServe,
    node: &Node,
    path: &Path,
    base: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ServeSettings> {
    // Located at the value of `serve.KEY` (else at the key, else at `serve:`).
    let err_at = |pos: Pos, message: String| Error::Config {
        path: path.to_owned(),
        line: Some(pos.line),
        column: Some(pos.column),
        message,
    };
    let err = |key: &str, message: String| err_at(node.get(key).map_or(node.pos, |n| n.pos), message);
    let expand = |key: &str, v: &str| {
        expand_vars(v, env).map_err(|token| err(key, format!("serve.{key}: {}", unexpanded(&token))))
    };
    let d = ServeSettings::default();
    let upstream_api_key = raw.upstream_api_key.as_deref().map(|k| expand("upstream_api_key", k)).transpose()?;
    let upstream = raw.upstream.as_deref().map(|u| expand("upstream", u)).transpose()?;
    if let Some(u) = &upstream
        && !(u.starts_with("http://") || u.starts_with("https://"))
    {
        return Err(err("upstream", "serve.upstream must start with http:// or https://".into()));
    }
    if raw.forward_authorization && upstream_api_key.is_some() {
        return Err(err(
            "forward_authorization",
            "serve: `forward_authorization: true` and `upstream_api_key` both give the upstream credentials; keep one"
                .into(),
        ));
    }
    let mut keys = Vec::new();
    let key_nodes = node.get("keys").map_or(&[][..], |n| n.items());
    for (i, k) in raw.keys.iter().enumerate() {
        let sha256 = parse_digest(&k.sha256).ok_or_else(|| {
            let item = key_nodes.get(i).map(|n| n.get("sha256").unwrap_or(n));
            err_at(
                item.map_or(node.pos, |n| n.pos),
                format!(
                    "serve.keys: `{}` is not a SHA-256 hex digest (64 hex digits); \
                     get one with `mcp-context serve hash-key KEY`",
                    k.sha256
                ),
            )
        })?;
        if let Some(problem) = user_name_problem(&k.user) {
            let item = key_nodes.get(i).map(|n| n.get("user").unwrap_or(n));
            return Err(err_at(item.map_or(node.pos, |n| n.pos), format!("serve.keys: {problem}")));
        }
        keys.push(KeyDigest { sha256, user: k.user.clone() });
    }
    if let Some(file) = &raw.keys_file {
        let file = base.join(file);
        let text = std::fs::read_to_string(&file).map_err(|e| Error::Config {
            path: file.clone(),
            line: None,
            column: None,
            message: format!("cannot read serve.keys_file: {e}"),
        })?;
        let file_err = |pos: Option<Pos>, message: String| Error::Config {
            path: file.clone(),
            line: pos.map(|p| p.line),
            column: pos.map(|p| p.column),
            message,
        };
        let root = yaml::parse(&text).map_err(|p| file_err(p.pos, p.message))?;
        let list: Vec<RawKey> = match &root {
            None => Vec::new(),
            Some(root) => yaml::from_node_strict(root)
                .map_err(|p| file_err(p.pos, format!("{} (expected a list of {{ sha256, user }})", p.message)))?,
        };
        let items = root.as_ref().map_or(&[][..], |r| r.items());
        for (i, k) in list.into_iter().enumerate() {
            let pos = items.get(i).map(|n| n.get("sha256").unwrap_or(n).pos);
            let sha256 = parse_digest(&k.sha256).ok_or_else(|| Error::Config {
                path: file.clone(),
                line: pos.map(|p| p.line),
                column: pos.map(|p| p.column),
                message: format!("`{}` is not a SHA-256 hex digest (64 hex digits)", k.sha256),
            })?;
            if let Some(problem) = user_name_problem(&k.user) {
                let pos = items.get(i).map(|n| n.get("user").unwrap_or(n).pos);
                return Err(Error::Config {
                    path: file.clone(),
                    line: pos.map(|p| p.line),
                    column: pos.map(|p| p.column),
                    message: problem,
                });
            }
            keys.push(KeyDigest { sha256, user: k.user });
        }
    }
    if raw.forward_authorization && !keys.is_empty() {
        return Err(err(
            "forward_authorization",
            "serve: with `forward_authorization: true` the caller's Authorization is the upstream's key, so `keys` \
             cannot identify callers; remove `keys`/`keys_file` or set `forward_authorization: false`"
                .into(),
        ));
    }
    if let Some(h) = &raw.user_header
        && (h.is_empty() || !h.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b)))
    {
        return Err(err("user_header", format!("serve.user_header: `{h}` is not an HTTP header name")));
    }
    if let Some(problem) = raw.anonymous_user.as_deref().and_then(user_name_problem) {
        return Err(err("anonymous_user", format!("serve.anonymous_user: {problem}")));
    }
    let nonzero = |key: &str, v: Option<u64>, default: u64| match v {
        Some(0) => Err(err(key, format!("serve.{key} must be at least 1"))),
        v => Ok(v.unwrap_or(default)),
    };
    let mut passthrough = PassthroughRule::defaults();
    let rule_nodes = node.get("passthrough").map_or(&[][..], |n| n.items());
    for (i, r) in raw.passthrough.iter().enumerate() {
        let rule = PassthroughRule::parse(r)
            .map_err(|m| err_at(rule_nodes.get(i).map_or(node.pos, |n| n.pos), format!("serve.passthrough: {m}")))?;
        passthrough.push(rule);
    }
    let upstream_user = raw.upstream_user.unwrap_or_default();
    let pseudonym_key = raw.pseudonym_key.as_deref().map(|k| expand("pseudonym_key", k)).transpose()?;
    if upstream_user == UpstreamUser::Pseudonym && pseudonym_key.as_deref().is_none_or(|k| k.len() < 16) {
        return Err(err(
            "upstream_user",
            "serve: `upstream_user: pseudonym` needs `pseudonym_key`, a secret of at least 16 characters \
             (e.g. `${MCP_CONTEXT_PSEUDONYM_KEY}`)"
                .into(),
        ));
    }
    if let Some(hosts) = &raw.allowed_hosts
        && let Some(bad) = hosts.iter().find(|h| h.is_empty() || h.contains(['/', ' ', '@']))
    {
        return Err(err("allowed_hosts", format!("serve.allowed_hosts: `{bad}` is not a host name or host:port")));
    }
    let inflight = nonzero(
        "max_inflight_body_bytes",
        raw.max_inflight_body_bytes.map(|v| v as u64),
        d.max_inflight_body_bytes as u64,
    )?
    .min(u32::MAX as u64) as usize;
    let max_body_bytes =
        nonzero("max_body_bytes", raw.max_body_bytes.map(|v| v as u64), d.max_body_bytes as u64)? as usize;
    if max_body_bytes > inflight {
        return Err(err(
            "max_body_bytes",
            format!("serve.max_body_bytes ({max_body_bytes}) is more than serve.max_inflight_body_bytes ({inflight})"),
        ));
    }
    Ok(ServeSettings {
        listen: raw.listen.unwrap_or(d.listen),
        upstream,
        upstream_api_key,
        forward_authorization: raw.forward_authorization,
        keys,
        user_header: raw.user_header,
        user_from_body: raw.user_from_body,
        anonymous_user: raw.anonymous_user,
        max_body_bytes,
        upstream_timeout: Duration::from_millis(nonzero(
            "upstream_timeout_ms",
            raw.upstream_timeout_ms,
            d.upstream_timeout.as_millis() as u64,
        )?),
        shutdown_grace: Duration::from_millis(raw.shutdown_grace_ms.unwrap_or(d.shutdown_grace.as_millis() as u64)),
        max_concurrent_upstream: nonzero(
            "max_concurrent_upstream",
            raw.max_concurrent_upstream.map(|v| v as u64),
            d.max_concurrent_upstream as u64,
        )? as usize,
        passthrough,
        allowed_hosts: raw.allowed_hosts,
        upstream_user,
        pseudonym_key,
        readyz_details: raw.readyz_details,
        max_connections: nonzero("max_connections", raw.max_connections.map(|v| v as u64), d.max_connections as u64)?
            as usize,
        header_timeout: Duration::from_millis(nonzero(
            "header_timeout_ms",
            raw.header_timeout_ms,
            d.header_timeout.as_millis() as u64,
        )?),
        body_timeout: Duration::from_millis(nonzero(
            "body_timeout_ms",
            raw.body_timeout_ms,
            d.body_timeout.as_millis() as u64,
        )?),
        max_inflight_body_bytes: inflight,
        max_unidentified_body_bytes: nonzero(
            "max_unidentified_body_bytes",
            raw.max_unidentified_body_bytes.map(|v| v as u64),
            d.max_unidentified_body_bytes as u64,
        )?
        .min(inflight as u64) as usize,
        stored_retention: Duration::from_secs(
            86_400
                * nonzero("stored_retention_days", raw.stored_retention_days, d.stored_retention.as_secs() / 86_400)?,
        ),
        max_stored_records: nonzero(
            "max_stored_records",
            raw.max_stored_records.map(|v| v as u64),
            d.max_stored_records as u64,
        )? as usize,
    })
}

/// Expands `${VAR}`, `${VAR:-default}` (the default when VAR is unset or
/// empty, as Claude Code and the shell do) and `${env:VAR}` (VS Code,
/// Cursor); `$${` is a literal `${`. Returns the text between the braces of
/// the first that cannot be expanded (see [`unexpanded`]).
fn expand_vars(s: &str, env: &dyn Fn(&str) -> Option<String>) -> std::result::Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("${") {
        if rest[..i].ends_with('$') {
            out.push_str(&rest[..i - 1]);
            out.push_str("${");
            rest = &rest[i + 2..];
            continue;
        }
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[i..]);
            return Ok(out);
        };
        let token = &after[..end];
        let inner = token.strip_prefix("env:").unwrap_or(token);
        let (var, default) = match inner.split_once(":-") {
            Some((var, default)) => (var, Some(default)),
            None => (inner, None),
        };
        let value = if token.starts_with("input:") { None } else { env(var).or_else(|| builtin_var(var)) };
        match (value, default) {
            (Some(v), Some(d)) if v.is_empty() => out.push_str(d),
            (Some(v), _) => out.push_str(&v),
            (None, Some(d)) => out.push_str(d),
            (None, None) => return Err(token.to_owned()),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Why `${token}` could not be expanded, and what to do.
fn unexpanded(token: &str) -> String {
    if let Some(id) = token.strip_prefix("input:") {
        return format!(
            "`${{input:{id}}}` asks VS Code to prompt for a value, and mcp-context cannot prompt; \
             put the value in an environment variable and write `${{VAR}}` instead"
        );
    }
    let var = token.strip_prefix("env:").unwrap_or(token);
    format!("environment variable `{var}` is not set; set it or remove `${{{token}}}` from the config")
}

fn builtin_var(var: &str) -> Option<String> {
    match var {
        "MCP_CONTEXT_EXE" => std::env::current_exe().ok().map(|p| p.to_string_lossy().into_owned()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(k: &str) -> Option<String> {
        match k {
            "TOKEN" => Some("s3cr3t".into()),
            _ => None,
        }
    }

    fn load(src: &str) -> Result<Config> {
        Config::from_yaml_with_env(src, Path::new("/etc/mc/mcp-context.yaml"), &env)
    }

    #[test]
    fn reads_in_flight_default_by_transport() {
        let c = load("servers:\n  s:\n    command: x\n  h:\n    url: http://h/mcp\n  set:\n    url: http://h/mcp\n    max_concurrent_reads: 8\n")
            .unwrap();
        let reads: Vec<usize> = c.servers.iter().map(|s| s.max_concurrent_reads).collect();
        assert_eq!(reads, [DEFAULT_MAX_CONCURRENT_READS, DEFAULT_MAX_CONCURRENT_READS_HTTP, 8]);
    }

    #[test]
    fn full_example_loads_in_order() {
        let c = load(
            "servers:\n  zeta:\n    command: ./bin/srv\n    args: [\"--t\", \"${TOKEN}\"]\n    env: { A: \"${TOKEN}\" }\n    cwd: docs\n    timeout_ms: 500\n  alpha:\n    httpUrl: http://127.0.0.1:1/mcp\n    headers: { Authorization: \"Bearer ${TOKEN}\" }\npolicy: policies/\ncontext:\n  model: gpt-4\n  max_tokens: 100\n  role: developer\n",
        )
        .unwrap();
        assert_eq!(c.servers[0].name, "zeta");
        assert_eq!(c.servers[1].name, "alpha");
        assert_eq!(c.policy.as_deref(), Some(Path::new("/etc/mc/policies/")));
        assert_eq!(c.context.role, MessageRole::Developer);
        match &c.servers[0].transport {
            Transport::Stdio { command, args, env, cwd, .. } => {
                assert_eq!(command, "/etc/mc/./bin/srv");
                assert_eq!(args[1], "s3cr3t");
                assert_eq!(env["A"], "s3cr3t");
                assert_eq!(cwd.as_deref(), Some(Path::new("/etc/mc/docs")));
            }
            _ => panic!(),
        }
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("s3cr3t"), "{dbg}");
    }

    #[test]
    fn protocol_defaults_to_auto_and_pins() {
        let c = load("servers:\n  a:\n    command: x\n  b:\n    command: x\n    protocol: 2025-11-25\n  c:\n    command: x\n    protocol: \"2026-07-28\"\n").unwrap();
        let p: Vec<_> = c.servers.iter().map(|s| s.protocol).collect();
        assert_eq!(p, [Protocol::Auto, Protocol::V2025_11_25, Protocol::V2026_07_28]);
    }

    #[test]
    fn claude_desktop_json_loads() {
        let c = load(r#"{"mcpServers": {"fs": {"command": "npx", "args": ["-y", "x"], "env": {}}}}"#).unwrap();
        assert_eq!(c.servers[0].name, "fs");
    }

    #[test]
    fn errors_name_file_and_line() {
        let cases = [
            ("servers:\n  a:\n    comand: x\n", "3:5", "unknown field `comand`"),
            ("servers:\n  a:\n    command: \"${NOPE}\"\n", ":3:15", "`NOPE` is not set"),
            ("servers:\n  bad name:\n    command: x\n", ":2:3", "invalid server name"),
            ("servers:\n  a:\n    url: ftp://x/mcp\n", ":3:10", "url must start with http://"),
            ("servers:\n  a:\n    command: x\n    url: http://x\n", ":2", "both `command` and `url`"),
            ("servers:\n  a: {}\n", ":2", "needs `command`"),
            ("context:\n  max_tokens: lots\n", "2:15", "invalid type"),
            ("servers:\n\t a: 1\n", ":2", ""),
            ("servers:\n  a:\n    command: x\n  a:\n    command: y\n", "", "defined twice"),
            (
                "servers:\n  a:\n    command: x\n    protocol: 2026\n",
                ":4:15",
                "protocol must be one of auto, 2026-07-28",
            ),
        ];
        for (src, loc, needle) in cases {
            let e = load(src).unwrap_err().to_string();
            assert!(e.starts_with("/etc/mc/mcp-context.yaml"), "{e}");
            assert!(e.contains(loc), "{src:?}: {e}");
            assert!(e.contains(needle), "{src:?}: {e}");
            assert!(!e.contains("s3cr3t"));
        }
    }

    #[test]
    fn errors_point_at_short_names_and_into_flow_style() {
        // A short name that also occurs inside an earlier name: the server
        // `a` is on line 4, not in `xa:` on line 2.
        let e = load("servers:\n  xa:\n    command: x\n  a:\n    command: x\n    url: http://a\n").unwrap_err();
        assert!(e.to_string().contains("mcp-context.yaml:4:3: server `a` has both"), "{e}");
        let e = load("servers:\n  ab:\n    url: http://x\n  b:\n    url: ftp://b\n").unwrap_err();
        assert!(e.to_string().contains(":5:10: server `b`: url must start"), "{e}");
        // Flow style, all on one line: positions still come from the parser.
        let src = "{servers: {ok: {command: x}, a: {url: \"ftp://x\"}}}";
        let e = load(src).unwrap_err().to_string();
        let col = src.find("\"ftp").unwrap() + 1;
        assert!(e.contains(&format!(":1:{col}: server `a`: url")), "{e}");
        let e = load("{servers: {a: {command: \"${NOPE}\"}}, context: {max_tokens: 0}}").unwrap_err().to_string();
        assert!(e.contains(":1:26:") && e.contains("`NOPE` is not set"), "{e}");
        let e = load("{context: {model: m, max_tokens: 0}}").unwrap_err().to_string();
        assert!(e.contains(":1:34: context.max_tokens"), "{e}");
        let e = load("{servers: {a: {command: x}, b: {command: y}, a: {command: z}}}").unwrap_err().to_string();
        assert!(e.contains(":1:46:") && e.contains("server `a` is defined twice"), "{e}");
        let e = load("serve: {keys: [{sha256: abc, user: a}]}").unwrap_err().to_string();
        assert!(e.contains(":1:25:") && e.contains("not a SHA-256"), "{e}");
    }

    #[test]
    fn serve_section() {
        let digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        let c = load(&format!(
            "servers: {{}}\nserve:\n  listen: 127.0.0.1:1\n  upstream_api_key: ${{TOKEN}}\n  keys:\n    - {{ sha256: \"{digest}\", user: alice }}\n  user_header: X-User\n  anonymous_user: guest\n  max_body_bytes: 100\n"
        ))
        .unwrap();
        assert_eq!(c.serve.listen, "127.0.0.1:1");
        assert_eq!(c.serve.upstream_api_key.as_deref(), Some("s3cr3t"));
        assert_eq!(c.serve.keys[0].user, "alice");
        assert_eq!(c.serve.keys[0].sha256[0], 0x9f);
        assert_eq!(c.serve.max_body_bytes, 100);
        assert!(!format!("{c:?}").contains("s3cr3t"));
        assert_eq!(load("servers: {}\n").unwrap().serve.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
    }

    #[test]
    fn serve_errors_name_file_and_line() {
        let cases = [
            ("serve:\n  listen: x\n  upstream_key: y\n", "3:3", "unknown field `upstream_key`"),
            ("serve:\n  keys:\n    - { sha256: abc, user: a }\n", ":3", "not a SHA-256"),
            ("serve:\n  upstream_api_key: k\n  forward_authorization: true\n", ":3", "keep one"),
            ("serve:\n  upstream: ${NOPE}\n", ":2", "`NOPE` is not set"),
            ("serve:\n  upstream: ftp://x\n", ":2", "http://"),
            ("serve:\n  user_header: \"a b\"\n", ":2", "not an HTTP header name"),
            ("serve:\n  max_body_bytes: 0\n", ":2", "at least 1"),
            ("serve:\n  keys_file: nope.yaml\n", "nope.yaml", "cannot read serve.keys_file"),
            (
                "serve:\n  keys:\n    - { sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08, user: \"a\\nb\" }\n",
                "3:",
                "control characters",
            ),
            ("serve:\n  anonymous_user: \"\"\n", ":2", "cannot be empty"),
            ("serve:\n  passthrough: [\"GET /v1/files\", \"GET /v2/x\"]\n", ":2", "must start with `/v1/`"),
            ("serve:\n  passthrough:\n    - \"FETCH /v1/x\"\n", ":3", "not GET, POST"),
            ("serve:\n  passthrough:\n    - \"GET /v1/../admin\"\n", ":3", "not a path segment"),
            ("serve:\n  upstream_user: pseudonym\n", ":2", "needs `pseudonym_key`"),
            ("serve:\n  max_body_bytes: 2000\n  max_inflight_body_bytes: 1000\n", ":2", "more than"),
        ];
        for (src, loc, needle) in cases {
            let e = load(src).unwrap_err().to_string();
            assert!(e.starts_with("/etc/mc/"), "{e}");
            assert!(e.contains(loc), "{src:?}: {e}");
            assert!(e.contains(needle), "{src:?}: {e}");
        }
    }

    #[test]
    fn keys_file_is_relative_to_the_config_and_strict() {
        let dir = tempfile::tempdir().unwrap();
        let digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        std::fs::write(dir.path().join("keys.yaml"), format!("- {{ sha256: {digest}, user: bob }}\n")).unwrap();
        let cfg = dir.path().join("c.yaml");
        let c = Config::from_yaml("serve:\n  keys_file: keys.yaml\n", &cfg).unwrap();
        assert_eq!(c.serve.keys[0].user, "bob");
        std::fs::write(dir.path().join("keys.yaml"), "- { sha256: x, usr: bob }\n").unwrap();
        let e = Config::from_yaml("serve:\n  keys_file: keys.yaml\n", &cfg).unwrap_err().to_string();
        assert!(e.contains("keys.yaml:1:"), "{e}");
        assert!(e.contains("unknown field `usr`"), "{e}");
    }

    #[test]
    fn env_vars_expand_and_double_dollar_escapes() {
        assert_eq!(expand_vars("a${TOKEN}b", &env).unwrap(), "as3cr3tb");
        assert_eq!(expand_vars("$${TOKEN}", &env).unwrap(), "${TOKEN}");
        assert_eq!(expand_vars("${X}", &env).unwrap_err(), "X");
        assert!(expand_vars("${MCP_CONTEXT_EXE}", &env).is_ok());
    }

    fn load_json(src: &str, path: &str) -> Result<Config> {
        Config::from_yaml_with_env(src, Path::new(path), &env)
    }

    fn stdio(c: &Config, i: usize) -> (&str, &[String], &BTreeMap<String, String>, Option<&Path>) {
        match &c.servers[i].transport {
            Transport::Stdio { command, args, env, cwd, .. } => (command, args, env, cwd.as_deref()),
            t => panic!("{t:?}"),
        }
    }

    #[test]
    fn host_files_keep_servers_and_drop_host_keys() {
        // Gemini CLI: other settings, per-server trust and tool lists, its own `context`.
        let c = load_json(
            r#"{"theme": "GitHub", "context": {"fileName": "GEMINI.md"}, "mcpServers": {"g": {"command": "x", "trust": true, "includeTools": ["a"], "excludeTools": [], "timeout": 30000, "cwd": "sub", "description": "d"}}}"#,
            "/home/u/.gemini/settings.json",
        )
        .unwrap();
        assert_eq!(c.servers[0].timeout, Duration::from_millis(30_000));
        assert_eq!(stdio(&c, 0).3, Some(Path::new("/home/u/.gemini/sub")));
        assert_eq!(c.context.model, "gpt-4o", "Gemini's context is not ours");
        // Cline: approvals, `disabled`, `timeout` in seconds; Windsurf: `serverUrl`.
        let c = load_json(
            r#"{"mcpServers": {"c": {"command": "x", "autoApprove": [], "alwaysAllow": ["r"], "timeout": 60}, "off": {"command": "y", "disabled": true}, "w": {"serverUrl": "https://h/mcp", "headers": {"A": "${TOKEN}"}}}}"#,
            "/x/cline_mcp_settings.json",
        )
        .unwrap();
        assert_eq!(c.servers.len(), 2);
        assert_eq!(c.servers[0].timeout, Duration::from_secs(60));
        assert!(
            matches!(&c.servers[1].transport, Transport::Http { url, headers, sse: false } if url == "https://h/mcp" && headers["A"] == "s3cr3t")
        );
        // Our own sections in a JSON file are still ours, and strict.
        let e = load_json(r#"{"mcpServers": {}, "context": {"max_tokens": 0}}"#, "/x/m.json").unwrap_err();
        assert!(e.to_string().contains("context.max_tokens"), "{e}");
    }

    #[test]
    fn vscode_file_with_comments_workspace_folder_and_inputs() {
        let src = "{\n  // VS Code\n  \"inputs\": [{\"id\": \"k\", \"type\": \"promptString\"},],\n  \"servers\": {\n    \"v\": {\"type\": \"stdio\", \"command\": \"node\", \"args\": [\"${workspaceFolder}/srv.js\", \"${env:TOKEN}\"],},\n    \"s\": {\"type\": \"sse\", \"url\": \"http://h/sse\"},\n  },\n}\n";
        let c = load_json(src, "/p/.vscode/mcp.json").unwrap();
        let (_, args, _, cwd) = stdio(&c, 0);
        assert_eq!(args, ["/p/srv.js", "s3cr3t"]);
        assert_eq!(cwd, Some(Path::new("/p/.vscode")));
        assert!(c.servers[0].unsupported.is_none());
        assert!(matches!(&c.servers[1].transport, Transport::Http { url, sse: true, .. } if url == "http://h/sse"));
        let e = load_json(&src.replace("${env:TOKEN}", "${input:k}"), "/p/.vscode/mcp.json").unwrap_err().to_string();
        assert!(
            e.starts_with("/p/.vscode/mcp.json:5:") && e.contains("`${input:k}`") && e.contains("cannot prompt"),
            "{e}"
        );
        let e = load_json("{\n  \"servers\": {\n    \"v\": {\"command\": 'x'}\n  }\n}\n", "/p/mcp.json").unwrap_err();
        assert!(e.to_string().starts_with("/p/mcp.json:3:"), "{e}");
    }

    #[test]
    fn env_file_loads_and_env_wins() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(".env"), "A=from-file\nB=file-secret\n").unwrap();
        let cfg = dir.path().join("mcp.json");
        let c = Config::from_yaml_with_env(
            r#"{"servers": {"v": {"command": "x", "envFile": ".env", "env": {"A": "mine"}}}}"#,
            &cfg,
            &env,
        )
        .unwrap();
        let (_, _, e, _) = stdio(&c, 0);
        assert_eq!((e["A"].as_str(), e["B"].as_str()), ("mine", "file-secret"));
        assert_eq!(c.servers[0].scrub("file-secret"), "***");
        let e = Config::from_yaml_with_env(r#"{"servers": {"v": {"command": "x", "envFile": "no.env"}}}"#, &cfg, &env)
            .unwrap_err();
        assert!(e.to_string().contains("mcp.json:1:47: server `v`: cannot read envFile"), "{e}");
    }

    #[test]
    fn stdio_servers_run_in_the_config_folder_by_default() {
        let c = load("servers:\n  a:\n    command: x\n").unwrap();
        assert_eq!(stdio(&c, 0).3, Some(Path::new("/etc/mc")));
        let c = Config::from_yaml("servers:\n  a:\n    command: ./x\n", Path::new("rel/c.yaml")).unwrap();
        let (command, _, _, cwd) = stdio(&c, 0);
        assert!(Path::new(command).is_absolute() && cwd.unwrap().is_absolute() && cwd.unwrap().ends_with("rel"));
    }

    #[test]
    fn every_server_key_is_a_field() {
        for key in SERVER_KEYS {
            let value = match *key {
                "args" | "inherit_env" => "[]",
                "env" | "headers" => "{}",
                "disabled" | "serve_stale" | "cache" => "false",
                "timeout_ms" | "timeout" | "max_concurrent_reads" | "cache_ttl_ms" => "100",
                "type" | "transportType" => "stdio",
                _ => "x",
            };
            let e = load(&format!("servers:\n  a:\n    {key}: {value}\n")).err().map(|e| e.to_string());
            assert!(!e.as_deref().unwrap_or("").contains("unknown field"), "{key}: {e:?}");
        }
    }

    #[test]
    fn defaults_expand_when_unset_or_empty() {
        let env = |k: &str| match k {
            "SET" => Some("v".to_owned()),
            "EMPTY" => Some(String::new()),
            _ => None,
        };
        assert_eq!(expand_vars("${SET:-d}/${NOPE:-d2}/${EMPTY:-d3}", &env).unwrap(), "v/d2/d3");
        assert_eq!(expand_vars("${env:SET}", &env).unwrap(), "v");
        assert_eq!(expand_vars("${input:k}", &env).unwrap_err(), "input:k");
        assert!(unexpanded("env:NOPE").contains("`NOPE` is not set"));
    }

    #[test]
    fn urls_lose_userinfo_and_query() {
        assert_eq!(redact_url("https://u:p@h/x?k=1"), "https://***@h/x");
        assert_eq!(redact_url("http://h/a@b"), "http://h/a@b");
    }
}

#[cfg(test)]
mod memory_bounds {
    use super::*;

    fn load(src: &str) -> Result<Config> {
        Config::from_yaml_with_env(src, Path::new("/etc/mc/mcp-context.yaml"), &|_| None)
    }

    #[test]
    fn the_byte_bounds_default_and_are_read_and_a_bad_one_is_located() {
        let c = load("servers: {}\n").unwrap();
        assert_eq!(c.cache.private_max_bytes, DEFAULT_PRIVATE_MAX_BYTES);
        assert_eq!(c.context.warm_memo_max_bytes, DEFAULT_WARM_MEMO_MAX_BYTES);
        assert_eq!(c.context.chunk_index_max_bytes, DEFAULT_CHUNK_INDEX_MAX_BYTES);
        let c = load(
            "context:\n  warm_memo_max_bytes: 0\n  chunk_index_max_bytes: 5000\ncache:\n  private_max_bytes: 1000\n",
        )
        .unwrap();
        assert_eq!((c.cache.private_max_bytes, c.context.warm_memo_max_bytes), (1000, 0));
        assert_eq!(c.context.chunk_index_max_bytes, 5000);
        match load("context:\n  select: relevance\n  chunk_index_max_bytes: -1\n") {
            Err(Error::Config { line: Some(3), column: Some(_), message, .. }) => {
                assert!(message.contains("chunk_index_max_bytes") || message.contains("invalid"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        match load("cache:\n  private_max_bytes: lots\n") {
            Err(Error::Config { line: Some(2), column: Some(_), message, .. }) => {
                assert!(message.contains("private_max_bytes") || message.contains("invalid"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }
}
