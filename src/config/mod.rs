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
//!
//! One file per owner: [`servers`] (the server map), [`context`] (the
//! `context:` section), [`cache`] (`cache:`), [`serve`] (`serve:`), [`audit`] (`audit:`), [`host`]
//! (other hosts' `.json` configs), [`env`] (`${VAR}` expansion); loading and
//! the collection of problems are here. Every problem of a file is reported
//! in one run, each with its line and column (as the policy loader does):
//! the first in the returned [`Error::Config`], the others in its `more`.
//! May import the located YAML tree, ids, the error type and the
//! composition defaults (`SelectMode`, chunk sizes); nothing above them.

mod audit;
mod auth;
mod auth_block;
mod cache;
mod context;
mod credentials;
mod env;
mod host;
mod jwt;
mod mcp;
mod passthrough;
mod serve;
mod servers;
mod telemetry;
#[cfg(test)]
mod tests;
mod vendors;

use std::path::{Path, PathBuf};

use serde::Deserialize;

use self::audit::RawAudit;
pub use self::audit::{
    AuditSettings, AuditSink, DEFAULT_AUDIT_BATCH, DEFAULT_AUDIT_FILE_KEEP, DEFAULT_AUDIT_FILE_MAX_BYTES,
    DEFAULT_AUDIT_QUEUE, DEFAULT_AUDIT_SCHEMA, DEFAULT_AUDIT_TABLE,
};
pub use self::auth::{ClientAuthMethod, OAuthSettings, PerUserHeadersSettings, ServerAuth, TokenExchangeSettings};
use self::cache::RawCache;
pub use self::cache::{CacheBackend, CacheSettings, DEFAULT_KEY_PREFIX, DEFAULT_PRIVATE_MAX_BYTES, DEFAULT_REDIS_URL};
pub use self::context::{ContextSettings, DEFAULT_WARM_MEMO_MAX_BYTES};
pub use self::credentials::{
    CREDENTIALS_KEY_ENV, CredentialSettings, CredentialStoreKind, DEFAULT_AUTH_TIMEOUT_MS, DEFAULT_IDLE_TIMEOUT_MS,
    DEFAULT_MAX_USERS, DEFAULT_TOKENS_FILE, SecretKey,
};
use self::env::Expander;
#[cfg(feature = "jwt")]
pub use self::jwt::JwtConfig;
pub use self::mcp::{DEFAULT_MCP_PAGE_SIZE, McpSettings};
use self::serve::RawServe;
pub use self::serve::{
    DEFAULT_LISTEN, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_BODY_FIELDS, DEFAULT_UPSTREAM, KeyDigest, PassthroughRule,
    ServeSettings, UpstreamUser,
};
use self::servers::RawServer;
pub use self::servers::{HttpMode, Protocol, ServerConfig, Transport};
pub use self::telemetry::{DEFAULT_SERVICE_NAME, TelemetrySettings};
pub use self::vendors::{AnthropicSettings, DEFAULT_ANTHROPIC_UPSTREAM, DEFAULT_GEMINI_UPSTREAM, GeminiSettings};
use crate::error::{Error, Result};
pub(crate) use crate::mode::SelectMode;
use crate::yaml::{self, Lenient, Node, OrderedMap, Pos, Problems};

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

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default, alias = "mcpServers")]
    servers: Lenient<OrderedMap<Lenient<RawServer>>>,
    #[serde(default)]
    policy: Option<String>,
    #[serde(default)]
    context: Lenient<Option<ContextSettings>>,
    #[serde(default)]
    serve: Lenient<Option<RawServe>>,
    #[serde(default)]
    cache: Lenient<Option<RawCache>>,
    #[serde(default)]
    telemetry: Lenient<Option<telemetry::RawTelemetry>>,
    #[serde(default)]
    audit: Lenient<Option<RawAudit>>,
    #[serde(default)]
    credentials: Lenient<Option<credentials::RawCredentials>>,
}

/// Every problem found in one config file (and the `keys_file` it names).
struct Found<'p> {
    path: &'p Path,
    errors: Vec<Error>,
}

impl<'p> Found<'p> {
    fn new(path: &'p Path) -> Self {
        Found { path, errors: Vec::new() }
    }

    /// A problem of the config file itself, at `pos` when known.
    fn add(&mut self, pos: Option<Pos>, message: String) {
        let error = self.error(pos, message);
        self.errors.push(error);
    }

    /// A problem of the config file, as an error.
    fn error(&self, pos: Option<Pos>, message: String) -> Error {
        config_error(self.path, pos, message)
    }

    /// Records a problem found by a part that stops at its first.
    fn push(&mut self, error: Error) {
        self.errors.push(error);
    }

    /// `Ok` when nothing was found; else one error: the first problem by
    /// position (the config file's before any other's), the others in `more`.
    fn finish(mut self) -> Result<()> {
        let key = |e: &Error| match e {
            Error::Config { path, line, column, .. } => {
                (path.as_path() != self.path, line.unwrap_or(usize::MAX), column.unwrap_or(0))
            }
            _ => (true, usize::MAX, 0),
        };
        self.errors.sort_by_key(key);
        self.errors.dedup_by(|a, b| a.to_string() == b.to_string());
        let mut errors = self.errors.into_iter();
        let Some(mut first) = errors.next() else { return Ok(()) };
        if let Error::Config { more, .. } = &mut first {
            more.extend(errors);
        }
        Err(first)
    }
}

/// The folder relative paths of the config file at `path` resolve against.
fn base_of(path: &Path) -> PathBuf {
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    if base.as_os_str().is_empty() { PathBuf::from(".") } else { base }
}

/// A config error in `path`, located when `pos` is known.
fn config_error(path: &Path, pos: Option<Pos>, message: String) -> Error {
    Error::Config {
        path: path.to_owned(),
        line: pos.map(|p| p.line),
        column: pos.map(|p| p.column),
        message,
        more: Vec::new(),
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
    /// The `telemetry:` section (no traces exported when absent).
    pub telemetry: Option<TelemetrySettings>,
    /// The `audit:` section (no records when absent).
    pub audit: AuditSettings,
    /// The `credentials:` section: where per-user upstream credentials are
    /// kept and how many per-user connections stay open.
    pub credentials: CredentialSettings,
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config> {
        let src = std::fs::read_to_string(path)
            .map_err(|e| config_error(path, None, format!("cannot read the config file: {e}")))?;
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
        let mut found = Found::new(path);
        let host = host::is_host_file(path);
        let parsed = if host { crate::jsonc::parse(src) } else { yaml::parse(src) };
        // A text that is not YAML (or JSONC) has nothing more to check.
        let root = parsed.map_err(|p| found.error(p.pos, p.message))?.unwrap_or_else(Node::empty_map);
        let root = if host { host::host_view(root, path) } else { root };
        // The servers that read cleanly: past a bad field, the others' entries are read again without
        // it, and checking such a half entry would report what its absence causes (no `command` nor `url`).
        let unclean: Vec<String> = yaml::from_node::<RawConfig>(&root, &Problems::default())
            .ok()
            .and_then(|r| r.servers.0)
            .map(|m| m.0.into_iter().filter(|(_, s)| s.0.is_none()).map(|(n, _)| n).collect())
            .unwrap_or_default();
        let problems = Problems::default();
        let raw = yaml::from_node_all::<RawConfig>(&root, &problems);
        let mut problems = problems.into_vec();
        if let Err(e) = &raw
            && problems.is_empty()
        {
            problems.push(e.clone());
        }
        for p in problems {
            found.add(p.pos, p.message);
        }
        // What could be read is checked too, so that one run reports all.
        let raw = raw.unwrap_or_default();
        let base = base_of(path);
        // What a stdio server's relative command and default working directory
        // are resolved against: absolute, since the child starts in it.
        let abs_base = std::path::absolute(&base).unwrap_or_else(|_| base.clone());
        let expander = Expander::new(env, &abs_base);
        let cx = servers::Cx { src, path, root: &root, host, abs_base: &abs_base, expander: &expander };
        let mut servers = Vec::new();
        for (name, s) in raw.servers.0.map(|m| m.0).unwrap_or_default() {
            let Some(s) = s.0.filter(|_| !unclean.contains(&name)) else { continue };
            match servers::server(&cx, name, &s) {
                Ok(Some(server)) => servers.push(server),
                Ok(None) => {}
                Err(errors) => errors.into_iter().for_each(|e| found.push(e)),
            }
        }
        let context = raw.context.0.flatten().unwrap_or_default();
        context::check(&context, &root, &mut found);
        let serve = match raw.serve.0.flatten() {
            None => ServeSettings::default(),
            Some(raw) => {
                serve::settings(raw, root.get("serve").unwrap_or(&root), path, &base, env).unwrap_or_else(|problems| {
                    problems.into_iter().for_each(|e| found.push(e));
                    ServeSettings::default()
                })
            }
        };
        let cache = match raw.cache.0.flatten() {
            None => CacheSettings::default(),
            Some(raw) => {
                cache::settings(raw, root.get("cache").unwrap_or(&root), path, &base, env).unwrap_or_else(|e| {
                    found.push(e);
                    CacheSettings::default()
                })
            }
        };
        let telemetry = raw.telemetry.0.flatten().and_then(|raw| {
            telemetry::settings(raw, root.get("telemetry").unwrap_or(&root), path, env)
                .map_err(|problems| problems.into_iter().for_each(|e| found.push(e)))
                .ok()
        });
        let audit = match raw.audit.0.flatten() {
            None => AuditSettings::default(),
            Some(raw) => {
                audit::settings(raw, root.get("audit").unwrap_or(&root), path, &base, env).unwrap_or_else(|problems| {
                    problems.into_iter().for_each(|e| found.push(e));
                    AuditSettings::default()
                })
            }
        };
        let credentials = match raw.credentials.0.flatten() {
            None => CredentialSettings::defaults(&base, cache.backend, env),
            Some(raw) => {
                credentials::settings(raw, root.get("credentials").unwrap_or(&root), path, &base, cache.backend, env)
                    .unwrap_or_else(|problems| {
                        problems.into_iter().for_each(|e| found.push(e));
                        CredentialSettings::defaults(&base, cache.backend, env)
                    })
            }
        };
        let per_user = servers.iter().find(|s| s.auth.is_per_user()).map(|s| s.name.as_str());
        let key_at = root
            .get("credentials")
            .or_else(|| per_user.and_then(|n| root.get("servers").and_then(|s| s.get(n)).and_then(|s| s.get("auth"))));
        if let Err(e) = credentials::require_key(&credentials, per_user, key_at.map(|n| n.pos), path) {
            found.push(e);
        }
        found.finish()?;
        let policy = raw.policy.map(|p| base.join(p));
        Ok(Config { path: path.to_owned(), servers, policy, context, serve, cache, telemetry, audit, credentials })
    }

    /// The policy file or folder the config file at `path` names
    /// (`policy:`), resolved against its folder; read even when the config
    /// has problems, so that they can be reported with the policy's.
    pub fn policy_in(path: &Path) -> Option<PathBuf> {
        let src = std::fs::read_to_string(path).ok()?;
        let root = if host::is_host_file(path) { crate::jsonc::parse(&src) } else { yaml::parse(&src) }.ok()??;
        let policy = root.get("policy")?.as_str()?;
        Some(base_of(path).join(policy))
    }

    /// The server of that name.
    pub fn server(&self, name: &str) -> Option<&ServerConfig> {
        self.servers.iter().find(|s| s.name == name)
    }
}
