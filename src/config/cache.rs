//! The `cache:` section: where read contents are kept besides this
//! process (Redis, shared by replicas) and how many private bytes it keeps.
//! May import the config's constants and error helpers.

use std::path::{Path, PathBuf};
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use super::env::{expand_vars, unexpanded};
use super::{DEFAULT_TIMEOUT_MS, config_error};
use crate::cause::redact_url;
use crate::error::Result;
use crate::yaml::Node;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCache {
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
#[derive(Clone, Debug)]
pub struct CacheSettings {
    /// `memory` (default) or `redis`.
    pub backend: CacheBackend,
    /// Redis URL (`redis://`, `rediss://` for TLS, `redis+unix://`); may
    /// carry credentials, so it is held as a secret (shown with
    /// `redact_url` in `cause.rs`).
    pub url: SecretString,
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

/// Validates the `cache:` section: `${VAR}` in `url` (credentials belong
/// in the environment), the URL's scheme, positive durations, and that this
/// build has the Redis backend.
pub(super) fn settings(
    raw: RawCache,
    node: &Node,
    path: &Path,
    base: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<CacheSettings> {
    let err = |key: &str, message: String| config_error(path, Some(node.get(key).map_or(node.pos, |n| n.pos)), message);
    let d = CacheSettings::default();
    let url = match raw.url.as_deref() {
        None => d.url.expose_secret().to_owned(),
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
        url: url.into(),
        key_prefix: raw.key_prefix.unwrap_or(d.key_prefix),
        ttl: ms("ttl_ms", raw.ttl_ms, d.ttl)?,
        lock,
        wait: ms("wait_ms", raw.wait_ms, lock)?,
        timeout: ms("timeout_ms", raw.timeout_ms, d.timeout)?,
        ca_file,
        private_max_bytes: raw.private_max_bytes.unwrap_or(d.private_max_bytes),
    })
}
