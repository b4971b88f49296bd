//! The `credentials:` section (issue 35): where per-user upstream
//! credentials are kept (`store`), the key that seals them (`key`), and the
//! bounds of the per-user connections (`idle_timeout_ms`, `max_users`),
//! and how long a request waits for an authorization server
//! (`auth_timeout_ms`).
//!
//! ```yaml
//! credentials:
//!   store: file                 # memory | file | redis (default: redis when cache.backend is redis, else file)
//!   path: .mcp-context/tokens.json
//!   key: ${MCP_CONTEXT_CREDENTIALS_KEY}   # 32 bytes, base64 or hex
//!   idle_timeout_ms: 600000
//!   max_users: 1000
//!   auth_timeout_ms: 3000
//! ```
//!
//! May import the config's error helpers, `${VAR}` expansion and the
//! located YAML tree; nothing above them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use super::env::{expand_vars, unexpanded};
use super::{CacheBackend, config_error};
use crate::error::{Error, Result};
use crate::yaml::Node;

/// The environment variable the key is read from when `credentials.key`
/// is not written.
pub const CREDENTIALS_KEY_ENV: &str = "MCP_CONTEXT_CREDENTIALS_KEY";
/// Default `credentials.idle_timeout_ms` (10 minutes).
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 600_000;
/// Default `credentials.auth_timeout_ms` (3 seconds).
pub const DEFAULT_AUTH_TIMEOUT_MS: u64 = 3_000;
/// Default `credentials.max_users`.
pub const DEFAULT_MAX_USERS: usize = 1000;
/// Default `credentials.path`, under the config's folder.
pub const DEFAULT_TOKENS_FILE: &str = ".mcp-context/tokens.json";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCredentials {
    store: Option<String>,
    path: Option<String>,
    key: Option<String>,
    idle_timeout_ms: Option<u64>,
    max_users: Option<usize>,
    auth_timeout_ms: Option<u64>,
}

/// Where per-user credentials are kept (`credentials.store`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialStoreKind {
    /// In this process only: lost on restart (tests, one-off runs).
    Memory,
    /// A local file, sealed record by record, written atomically (mode 0600).
    File,
    /// Redis, under the cache's key prefix: every replica sees what any
    /// replica stored.
    Redis,
}

/// The `credentials:` section, defaults filled in.
#[derive(Debug, Clone)]
pub struct CredentialSettings {
    /// Where the records are kept.
    pub store: CredentialStoreKind,
    /// The file of the `file` store (absolute, or relative to the working
    /// directory when the config's folder was).
    pub path: PathBuf,
    /// The 32-byte sealing key (XChaCha20-Poly1305), when one was given;
    /// never shown.
    pub key: Option<SecretKey>,
    /// A user's connection to a per-user server is closed after this long
    /// unused.
    pub idle_timeout: Duration,
    /// At most this many per-user connections are kept open; past it the
    /// least recently used is closed.
    pub max_users: usize,
    /// Every call to an authorization server (discovery, the token
    /// endpoint: a refresh, a token exchange, a code) is given up after
    /// this long; and the credentials a request waits for, all its servers
    /// together, are given up after this long or the request's own
    /// deadline (`context.deadline_ms`, `serve.upstream_timeout_ms`),
    /// whichever is shorter: that server is then left out of the request
    /// (state `auth_timeout` in its report) and the refresh or exchange,
    /// if sent, finishes in the background for the next one. Default
    /// [`DEFAULT_AUTH_TIMEOUT_MS`].
    pub auth_timeout: Duration,
}

/// A 32-byte key that `Debug` never shows.
#[derive(Clone)]
pub struct SecretKey(pub(crate) std::sync::Arc<[u8; 32]>);

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretKey(<redacted>)")
    }
}

impl SecretKey {
    /// The key's bytes (for the sealing code only).
    pub fn expose(&self) -> &[u8; 32] {
        &self.0
    }

    /// A key from its text: 32 bytes as base64 (standard or URL-safe, with
    /// or without padding) or 64 hex digits.
    pub fn parse(text: &str) -> std::result::Result<SecretKey, String> {
        let t = text.trim();
        let bytes = if t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit()) {
            (0..32).map(|i| u8::from_str_radix(&t[2 * i..2 * i + 2], 16).unwrap_or(0)).collect::<Vec<u8>>()
        } else {
            let engines = [
                base64::engine::general_purpose::STANDARD,
                base64::engine::general_purpose::STANDARD_NO_PAD,
                base64::engine::general_purpose::URL_SAFE,
                base64::engine::general_purpose::URL_SAFE_NO_PAD,
            ];
            engines.iter().find_map(|e| e.decode(t).ok()).ok_or_else(|| {
                "the key is neither base64 nor 64 hex digits (make one with `openssl rand -base64 32`)".to_owned()
            })?
        };
        let key: [u8; 32] = bytes.try_into().map_err(|b: Vec<u8>| {
            format!("the key must be 32 bytes, this one is {} (make one with `openssl rand -base64 32`)", b.len())
        })?;
        Ok(SecretKey(std::sync::Arc::new(key)))
    }
}

impl CredentialSettings {
    /// The defaults for a config in `base` whose cache backend is `cache`,
    /// the key from [`CREDENTIALS_KEY_ENV`] when set.
    pub(super) fn defaults(base: &Path, cache: CacheBackend, env: &dyn Fn(&str) -> Option<String>) -> Self {
        CredentialSettings {
            store: if cache == CacheBackend::Redis { CredentialStoreKind::Redis } else { CredentialStoreKind::File },
            path: base.join(DEFAULT_TOKENS_FILE),
            key: env(CREDENTIALS_KEY_ENV).filter(|k| !k.is_empty()).and_then(|k| SecretKey::parse(&k).ok()),
            idle_timeout: Duration::from_millis(DEFAULT_IDLE_TIMEOUT_MS),
            max_users: DEFAULT_MAX_USERS,
            auth_timeout: Duration::from_millis(DEFAULT_AUTH_TIMEOUT_MS),
        }
    }
}

impl Default for CredentialSettings {
    fn default() -> Self {
        CredentialSettings {
            store: CredentialStoreKind::Memory,
            path: PathBuf::from(DEFAULT_TOKENS_FILE),
            key: None,
            idle_timeout: Duration::from_millis(DEFAULT_IDLE_TIMEOUT_MS),
            max_users: DEFAULT_MAX_USERS,
            auth_timeout: Duration::from_millis(DEFAULT_AUTH_TIMEOUT_MS),
        }
    }
}

/// Validates the `credentials:` section (the key's presence is checked by
/// [`require_key`], once the servers are known).
pub(super) fn settings(
    raw: RawCredentials,
    node: &Node,
    path: &Path,
    base: &Path,
    cache: CacheBackend,
    env: &dyn Fn(&str) -> Option<String>,
) -> std::result::Result<CredentialSettings, Vec<Error>> {
    let mut errors = Vec::new();
    let err = |key: &str, message: String| config_error(path, Some(node.get(key).map_or(node.pos, |n| n.pos)), message);
    let mut s = CredentialSettings::defaults(base, cache, env);
    match raw.store.as_deref() {
        None => {}
        Some("memory") => s.store = CredentialStoreKind::Memory,
        Some("file") => s.store = CredentialStoreKind::File,
        Some("redis") if cfg!(feature = "redis") => s.store = CredentialStoreKind::Redis,
        Some("redis") => {
            errors.push(err("store", "credentials.store: this build has no Redis support (feature `redis`)".into()))
        }
        Some(other) => {
            errors.push(err("store", format!("credentials.store must be one of memory, file, redis (got `{other}`)")))
        }
    }
    if let Some(p) = raw.path {
        match expand_vars(&p, env) {
            Ok(p) => s.path = base.join(p),
            Err(token) => errors.push(err("path", format!("credentials.path: {}", unexpanded(&token)))),
        }
    }
    if let Some(k) = raw.key {
        match expand_vars(&k, env) {
            Err(token) => errors.push(err("key", format!("credentials.key: {}", unexpanded(&token)))),
            Ok(text) => match SecretKey::parse(SecretString::from(text).expose_secret()) {
                Ok(key) => s.key = Some(key),
                Err(m) => errors.push(err("key", format!("credentials.key: {m}"))),
            },
        }
    } else if let Some(text) = env(CREDENTIALS_KEY_ENV).filter(|k| !k.is_empty())
        && let Err(m) = SecretKey::parse(&text)
    {
        errors.push(err("key", format!("${CREDENTIALS_KEY_ENV}: {m}")));
    }
    match raw.idle_timeout_ms {
        Some(0) => errors.push(err("idle_timeout_ms", "credentials.idle_timeout_ms must be at least 1".into())),
        Some(ms) => s.idle_timeout = Duration::from_millis(ms),
        None => {}
    }
    match raw.auth_timeout_ms {
        Some(0) => errors.push(err(
            "auth_timeout_ms",
            "credentials.auth_timeout_ms must be at least 1 (milliseconds an authorization server may take)".into(),
        )),
        Some(ms) if ms > 600_000 => errors.push(err(
            "auth_timeout_ms",
            format!("credentials.auth_timeout_ms must be at most 600000 (10 minutes), got {ms}"),
        )),
        Some(ms) => s.auth_timeout = Duration::from_millis(ms),
        None => {}
    }
    match raw.max_users {
        Some(0) => errors.push(err("max_users", "credentials.max_users must be at least 1".into())),
        Some(n) => s.max_users = n,
        None => {}
    }
    if errors.is_empty() { Ok(s) } else { Err(errors) }
}

/// A store that keeps records outside this process needs the key once any
/// server is per-user: the error names where to give it.
pub(super) fn require_key(
    s: &CredentialSettings,
    per_user: Option<&str>,
    at: Option<crate::yaml::Pos>,
    path: &Path,
) -> Result<()> {
    let Some(server) = per_user else { return Ok(()) };
    if s.key.is_some() || s.store == CredentialStoreKind::Memory {
        return Ok(());
    }
    Err(config_error(
        path,
        at,
        format!(
            "server `{server}` keeps per-user credentials, which are sealed with a key: set \
             `credentials.key` (e.g. `key: ${{{CREDENTIALS_KEY_ENV}}}`) or the environment variable \
             {CREDENTIALS_KEY_ENV} to 32 random bytes in base64 (`openssl rand -base64 32`), \
             or use `credentials.store: memory`"
        ),
    ))
}
