//! The server map (`servers:`, or a host's `mcpServers`): one entry's
//! raw form, its checks, and what it resolves to ([`ServerConfig`]). May
//! import the config's constants, `${VAR}` expansion and the YAML tree.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use super::env::{Expander, unexpanded};
use super::{
    DEFAULT_CACHE_TTL_MS, DEFAULT_MAX_CONCURRENT_READS, DEFAULT_MAX_CONCURRENT_READS_HTTP, DEFAULT_TIMEOUT_MS,
};
use crate::cause::redact_url;
use crate::error::Error;
use crate::id::validate_server_name;
use crate::yaml::{self, Named, Node, Pos};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    /// `type: sse` (also `transport: sse`, and Cline's `transportType`).
    #[serde(default, rename = "type", alias = "transportType", alias = "transport")]
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
    auth: Option<super::auth_block::RawAuth>,
}

impl Named for RawServer {
    const NOUN: &'static str = "server";
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
        /// Which HTTP transport, or both in turn.
        mode: HttpMode,
    },
}

/// How a `url:` server is spoken to, as the host configs that name it mean it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HttpMode {
    /// Streamable HTTP only (`type: http`, Gemini CLI's `httpUrl`).
    Streamable,
    /// The legacy HTTP+SSE transport of MCP 2024-11-05 only (`type: sse`, a
    /// `url` in Gemini CLI's `settings.json`): `GET` the event stream, `POST`
    /// to the endpoint it names.
    Sse,
    /// A `url` with no `type`: Streamable HTTP, then the legacy transport at
    /// the same URL when the first `POST` is answered 400, 404 or 405 (the
    /// MCP specification's backwards-compatibility rule, as VS Code and
    /// Cursor do it).
    StreamableThenSse,
}

/// The one hand-written redacting `Debug` left in the config (the others
/// became `secrecy` types): `env` and header values, `args` and `command`
/// are all `${VAR}`-expanded and may hold a secret, yet every one is needed
/// in the clear to start the server, and wrapping each string would move
/// `expose_secret` into every test and call site for no gain in safety.
impl fmt::Debug for Transport {
    /// Never prints `env` or header values, nor the arguments: they may hold secrets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transport::Stdio { command_display, args, env, cwd, .. } => f
                .debug_struct("Stdio")
                .field("command", command_display)
                .field("args", &args.len())
                .field("env", &env.keys().collect::<Vec<_>>())
                .field("cwd", cwd)
                .finish(),
            Transport::Http { url, headers, mode } => f
                .debug_struct("Http")
                .field("url", &redact_url(url))
                .field("mode", mode)
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
    /// (the constant `DEFAULT_MAX_CONCURRENT_READS_HTTP` in `config/mod.rs` says why). Over HTTP it is also
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
    /// How requests are authorised (`auth:`; `Static`, the `headers`, by default).
    pub auth: super::auth::ServerAuth,
    /// Values expanded from `${VAR}` for this server; never shown.
    pub(crate) secrets: Secrets,
    /// Why this server cannot be started though its entry is valid (a
    /// transport this build lacks): its connection fails with this, alone.
    pub(crate) unsupported: Option<String>,
    /// The HTTP client a Streamable HTTP connection sends with: `None`, one
    /// of its own; per-user views of a server share their context's one (one
    /// connection pool, each view's requests carrying that user's headers).
    pub(crate) http_client: Option<reqwest::Client>,
}

/// Secret values (longest first), hidden from `Debug`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Secrets(pub(crate) Vec<SecretString>);

impl ServerConfig {
    /// Removes this server's secrets (expanded `${VAR}` values, URL query
    /// and userinfo) from a message before it is logged, reported or returned.
    pub(crate) fn scrub(&self, message: &str) -> String {
        let mut out = message.to_owned();
        for s in &self.secrets.0 {
            out = out.replace(s.expose_secret(), "***");
        }
        if let Transport::Http { url, .. } = &self.transport {
            out = out.replace(url.as_str(), &redact_url(url));
        }
        out
    }
}

/// What checking one server needs from the whole file.
pub(super) struct Cx<'a> {
    /// The config's text (to locate a `${VAR}` inside a value).
    pub(super) src: &'a str,
    /// The config file, for errors.
    pub(super) path: &'a Path,
    /// The file's tree.
    pub(super) root: &'a Node<'a>,
    /// Another host's `.json` config.
    pub(super) host: bool,
    /// The config's folder, absolute.
    pub(super) abs_base: &'a Path,
    /// `${VAR}` expansion, recording the values it used.
    pub(super) expander: &'a Expander<'a>,
}

/// One server entry checked and resolved: `None` when it is `disabled`;
/// every problem of the entry otherwise (a check that needs a value an
/// earlier one refused is skipped, so nothing is reported twice).
pub(super) fn server(
    cx: &Cx<'_>,
    name: String,
    s: &RawServer,
) -> std::result::Result<Option<ServerConfig>, Vec<Error>> {
    let root = cx.root;
    let errors = std::cell::RefCell::new(Vec::new());
    let err = |line: Option<usize>, column: Option<usize>, message: String| Error::Config {
        path: cx.path.to_owned(),
        line,
        column,
        message,
        more: Vec::new(),
    };
    let fail = |line: Option<usize>, column: Option<usize>, message: String| {
        errors.borrow_mut().push(err(line, column, message));
    };
    let at = |pos: Option<Pos>| (pos.map(|p| p.line), pos.map(|p| p.column));
    let servers_node = root.get("servers").or_else(|| root.get("mcpServers"));
    // Values recorded for an earlier entry that failed are not this one's.
    drop(cx.expander.take_secrets());
    // `${VAR}` expanded; an unset one is recorded, and stands as "" for the checks that follow.
    let expand = |s: &str, server: &str| -> String {
        cx.expander.expand(s).unwrap_or_else(|token| {
            let node = servers_node.and_then(|n| n.get(server)).unwrap_or(root);
            let (line, column) = at(Some(yaml::pos_within(cx.src, node, &format!("${{{token}}}"))));
            fail(line, column, format!("server `{server}`: {}", unexpanded(&token)));
            String::new()
        })
    };
    // Where the server is named: its key, as the parser saw it.
    let server_node = servers_node.and_then(|n| n.get(&name));
    let value_at =
        |key: &str, (line, column): (Option<usize>, Option<usize>)| match server_node.and_then(|n| n.get(key)) {
            Some(v) => (Some(v.pos.line), Some(v.pos.column)),
            None => (line, column),
        };
    let (at, at_col) = at(servers_node.and_then(|n| n.key_at(&name, 0)).map(|k| k.pos));
    if let Err(m) = validate_server_name(&name) {
        return Err(vec![err(at, at_col, format!("invalid server name: {m}"))]);
    }
    if s.disabled {
        return Ok(None);
    }
    let transport = match (&s.command, &s.url) {
        (Some(_), Some(_)) => {
            fail(at, at_col, format!("server `{name}` has both `command` and `url`; keep one"));
            None
        }
        (None, None) => {
            fail(at, at_col, format!("server `{name}` needs `command` (stdio) or `url` (Streamable HTTP)"));
            None
        }
        (Some(cmd), None) => {
            if let Some(k) = s.kind.as_deref().filter(|k| *k != "stdio") {
                let (line, column) = value_at("type", (at, at_col));
                fail(line, column, format!("server `{name}` has `command` but `type: {k}`; use `type: stdio`"));
            }
            if !s.headers.is_empty() {
                let (line, column) = value_at("headers", (at, at_col));
                fail(line, column, format!("server `{name}`: `headers` only apply to `url` servers"));
            }
            let command = expand(cmd, &name);
            let command = if command.contains('/') && Path::new(&command).is_relative() {
                cx.abs_base.join(&command).to_string_lossy().into_owned()
            } else {
                command
            };
            let mut env_out = BTreeMap::new();
            for (k, v) in &s.env {
                env_out.insert(k.clone(), expand(v, &name));
            }
            if let Some(file) = &s.env_file {
                let file = cx.abs_base.join(expand(file, &name));
                let (line, column) = value_at("envFile", (at, at_col));
                let vars = dotenvy::from_path_iter(&file).and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>());
                match vars {
                    Ok(vars) => {
                        for (k, v) in vars {
                            cx.expander.record(&v);
                            // `env` wins over the file, as in VS Code.
                            env_out.entry(k).or_insert(v);
                        }
                    }
                    Err(e) => {
                        fail(line, column, format!("server `{name}`: cannot read envFile `{}`: {e}", file.display()))
                    }
                }
            }
            let cwd = match s.cwd.as_deref() {
                Some(c) => cx.abs_base.join(expand(c, &name)),
                None => cx.abs_base.to_path_buf(),
            };
            Some(Transport::Stdio {
                command,
                command_display: cmd.clone(),
                args: s.args.iter().map(|a| expand(a, &name)).collect(),
                env: env_out,
                inherit_env: s.inherit_env.clone(),
                cwd: Some(cwd),
            })
        }
        (None, Some(url)) => {
            if let Some(k) = s
                .kind
                .as_deref()
                .filter(|k| !matches!(*k, "http" | "streamable-http" | "streamableHttp" | "streamable_http" | "sse"))
            {
                let (line, column) = value_at("type", (at, at_col));
                fail(
                    line,
                    column,
                    format!("server `{name}`: `type: {k}` is not supported; use Streamable HTTP (`type: http`)"),
                );
            }
            if !s.args.is_empty() || !s.env.is_empty() || s.cwd.is_some() || s.env_file.is_some() {
                fail(
                    at,
                    at_col,
                    format!("server `{name}`: `args`, `env`, `envFile` and `cwd` only apply to `command` servers"),
                );
            }
            let before = errors.borrow().len();
            let url = expand(url, &name);
            // An unset variable was reported already; the URL it left is not the user's.
            if errors.borrow().len() == before && !(url.starts_with("http://") || url.starts_with("https://")) {
                // Point at the value as written.
                let value = server_node.and_then(|n| n.get("url").or_else(|| n.get("httpUrl")));
                let (line, column) = match value {
                    Some(v) => (Some(v.pos.line), Some(v.pos.column)),
                    None => (at, at_col),
                };
                fail(
                    line,
                    column,
                    format!("server `{name}`: url must start with http:// or https:// (got `{}`)", redact_url(&url)),
                );
            }
            let mut headers = BTreeMap::new();
            for (k, v) in &s.headers {
                headers.insert(k.clone(), expand(v, &name));
            }
            let named = |key: &str| server_node.is_some_and(|n| n.get(key).is_some());
            let mode = match s.kind.as_deref() {
                Some("sse") => HttpMode::Sse,
                Some(_) => HttpMode::Streamable,
                None if named("httpUrl") => HttpMode::Streamable,
                None if named("url") && cx.host && super::host::url_means_sse(cx.path) => HttpMode::Sse,
                None => HttpMode::StreamableThenSse,
            };
            Some(Transport::Http { url, headers, mode })
        }
    };
    let mut timeout_ms = s.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
    // Cline writes `timeout` in seconds (60 by default), Gemini CLI in
    // milliseconds (600000): under 1000 it can only be seconds.
    if cx.host && timeout_ms < 1000 && server_node.is_some_and(|n| n.get("timeout").is_some()) {
        timeout_ms *= 1000;
    }
    if timeout_ms == 0 {
        let (line, column) = value_at("timeout_ms", (at, at_col));
        fail(line, column, format!("server `{name}`: timeout_ms must be at least 1"));
    }
    let reads = s.max_concurrent_reads.unwrap_or(match transport {
        Some(Transport::Http { .. }) => DEFAULT_MAX_CONCURRENT_READS_HTTP,
        _ => DEFAULT_MAX_CONCURRENT_READS,
    });
    if reads == 0 {
        let (line, column) = value_at("max_concurrent_reads", (at, at_col));
        fail(line, column, format!("server `{name}`: max_concurrent_reads must be at least 1"));
    }
    let protocol = match s.protocol.as_deref() {
        None => Protocol::Auto,
        Some(p) => Protocol::parse(p).unwrap_or_else(|| {
            // Point at the value as written.
            let (line, column) = value_at("protocol", (at, at_col));
            fail(
                line,
                column,
                format!("server `{name}`: protocol must be one of {} (got `{p}`)", Protocol::NAMES.join(", ")),
            );
            Protocol::Auto
        }),
    };
    let auth = match &s.auth {
        None => super::auth::ServerAuth::Static,
        Some(raw) => super::auth_block::auth(
            &super::auth_block::AuthCx {
                server: &name,
                node: server_node.and_then(|n| n.get("auth")),
                at: (at, at_col),
                url: s.url.is_some(),
                fail: &fail,
                expand: &|v: &str| expand(v, &name),
            },
            raw,
        ),
    };
    let errors = errors.into_inner();
    let Some(transport) = transport.filter(|_| errors.is_empty()) else {
        return Err(errors);
    };
    let mut server_secrets = cx.expander.take_secrets();
    server_secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    server_secrets.dedup();
    Ok(Some(ServerConfig {
        secrets: Secrets(server_secrets.into_iter().map(SecretString::from).collect()),
        name,
        transport,
        timeout: Duration::from_millis(timeout_ms),
        max_concurrent_reads: reads,
        cache: s.cache.unwrap_or(true),
        cache_ttl: Duration::from_millis(s.cache_ttl_ms.unwrap_or(DEFAULT_CACHE_TTL_MS)),
        serve_stale: s.serve_stale,
        protocol,
        auth,
        unsupported: None,
        http_client: None,
    }))
}
