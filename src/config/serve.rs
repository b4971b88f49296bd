//! The `serve:` section: how `mcp-context serve` listens, whom it forwards
//! to and how it tells callers apart, with the caller keys of `keys` and
//! `keys_file`. May import the config's error helpers, ids and the YAML tree.

use std::cell::RefCell;
use std::path::Path;
use std::time::Duration;

use secrecy::{SecretSlice, SecretString};
use serde::Deserialize;

use super::config_error;
use super::env::{expand_vars, unexpanded};
pub use super::passthrough::PassthroughRule;
use super::vendors::{AnthropicSettings, GeminiSettings};
use super::vendors::{RawAnthropic, RawGemini};
use crate::error::Error;
use crate::id::user_name_problem;
use crate::yaml::{self, Node, Pos};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServe {
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
    max_body_fields: Option<usize>,
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
    idle_timeout_ms: Option<u64>,
    body_timeout_ms: Option<u64>,
    max_inflight_body_bytes: Option<usize>,
    max_unidentified_body_bytes: Option<usize>,
    stored_retention_days: Option<u64>,
    max_stored_records: Option<usize>,
    anthropic: Option<RawAnthropic>,
    gemini: Option<RawGemini>,
    jwt: Option<super::jwt::RawJwt>,
    public_url: Option<String>,
    mcp: Option<super::mcp::RawMcp>,
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
/// Default `serve.max_body_fields`: an API request has a few dozen.
pub const DEFAULT_MAX_BODY_FIELDS: usize = 256;

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

/// One caller key of `serve.keys`: only its SHA-256 digest is stored.
#[derive(Clone, Debug)]
pub struct KeyDigest {
    /// SHA-256 of the key (32 bytes).
    pub sha256: SecretSlice<u8>,
    /// The policy user the key stands for.
    pub user: String,
}

/// The `serve:` section: how `mcp-context serve` listens, whom it forwards
/// to, and how it tells callers apart. Read by the `serve` command only; the
/// library just validates it with the rest of the file.
#[derive(Clone, Debug)]
pub struct ServeSettings {
    /// Address to listen on (`--listen` overrides).
    pub listen: String,
    /// Upstream base URL, ending before `/chat/completions` (e.g.
    /// `http://127.0.0.1:11434/v1`); `None`: `$OPENAI_BASE_URL`, else
    /// [`DEFAULT_UPSTREAM`] (`--upstream` overrides all).
    /// May carry credentials, so it is held as a secret.
    pub upstream: Option<SecretString>,
    /// Sent upstream as `Authorization: Bearer` (unset: `serve` takes `$OPENAI_API_KEY`).
    pub upstream_api_key: Option<SecretString>,
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
    /// Top-level fields a JSON request body may have (default
    /// [`DEFAULT_MAX_BODY_FIELDS`]); more get 400 `too_many_fields`. The
    /// proxy keeps a few words per field beside the body (the values are
    /// read in place, and `messages`, `input` and `system` one item at a
    /// time), so this bounds what a body costs once parsed: about its size.
    pub max_body_fields: usize,
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
    pub pseudonym_key: Option<SecretString>,
    /// `/readyz` shows servers, policy and shared cache, not only the status.
    pub readyz_details: bool,
    /// Open connections at once; past it the proxy stops accepting until one closes.
    pub max_connections: usize,
    /// Longest time a client may take to send a request's headers: the
    /// first request's from the connection's accept (a client that sends
    /// nothing is closed after it), a later one's from its first byte.
    /// Default 10 s.
    pub header_timeout: Duration,
    /// `serve.idle_timeout_ms`: a keep-alive connection with no request in
    /// flight and nothing of a next one is closed after this long, freeing
    /// its `max_connections` slot. Default 30 s: past the 4–5 s after which
    /// the usual client pools (Python's httpx, Node's undici) drop an idle
    /// connection themselves, short enough that idle sockets cannot hold the
    /// cap for long.
    pub idle_timeout: Duration,
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
    /// `serve.anthropic`: the Messages API route (`POST /v1/messages`);
    /// `None`: that route answers 404.
    pub anthropic: Option<AnthropicSettings>,
    /// `serve.gemini`: Gemini's `generateContent` routes; `None`: they answer 404.
    pub gemini: Option<GeminiSettings>,
    /// `serve.jwt`: bearer tokens that are JWTs are verified against this
    /// issuer's keys; `None`: a JWT bearer is treated like any other key.
    #[cfg(feature = "jwt")]
    pub jwt: Option<super::jwt::JwtConfig>,
    /// `serve.public_url`: the proxy's base URL as browsers reach it, for the
    /// redirect URI of `auth: { type: oauth }` servers
    /// (`{public_url}/auth/callback`); `None`: `http://{listen}`.
    pub public_url: Option<String>,
    /// `serve.mcp`: the MCP endpoint of each caller's resources (`/mcp`); `None`: off.
    pub mcp: Option<super::mcp::McpSettings>,
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
            max_body_fields: DEFAULT_MAX_BODY_FIELDS,
            upstream_timeout: Duration::from_millis(600_000),
            shutdown_grace: Duration::from_millis(10_000),
            max_concurrent_upstream: 512,
            passthrough: PassthroughRule::defaults(),
            allowed_hosts: None,
            public_url: None,
            mcp: None,
            upstream_user: UpstreamUser::Identified,
            pseudonym_key: None,
            readyz_details: false,
            max_connections: 1024,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
            max_inflight_body_bytes: 256 << 20,
            max_unidentified_body_bytes: 32 << 20,
            stored_retention: Duration::from_secs(30 * 24 * 3600),
            max_stored_records: 200_000,
            anthropic: None,
            gemini: None,
            #[cfg(feature = "jwt")]
            jwt: None,
        }
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

/// Validates the `serve:` section: `${VAR}` in `upstream` and
/// `upstream_api_key`, exactly one source of upstream credentials, key
/// digests (and `keys_file`, relative to the config), header names.
pub(super) fn settings(
    raw: RawServe,
    node: &Node,
    path: &Path,
    base: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> std::result::Result<ServeSettings, Vec<Error>> {
    // Every problem is recorded and checking goes on (with the default in
    // place of a bad value), so that one run reports them all.
    let problems = RefCell::new(Vec::new());
    let fail = |e: Error| problems.borrow_mut().push(e);
    // Located at the value of `serve.KEY` (else at the key, else at `serve:`).
    let err_at = |pos: Pos, message: String| config_error(path, Some(pos), message);
    let err = |key: &str, message: String| err_at(node.get(key).map_or(node.pos, |n| n.pos), message);
    let expand = |key: &str, v: &str| {
        expand_vars(v, env).map_err(|token| err(key, format!("serve.{key}: {}", unexpanded(&token))))
    };
    let d = ServeSettings::default();
    let expand_or_fail = |key: &str, v: Option<&str>| {
        v.map(|v| expand(key, v)).transpose().unwrap_or_else(|e| {
            fail(e);
            None
        })
    };
    let upstream_api_key = expand_or_fail("upstream_api_key", raw.upstream_api_key.as_deref());
    let upstream = expand_or_fail("upstream", raw.upstream.as_deref());
    if let Some(u) = &upstream
        && !(u.starts_with("http://") || u.starts_with("https://"))
    {
        fail(err("upstream", "serve.upstream must start with http:// or https://".into()));
    }
    if raw.forward_authorization && upstream_api_key.is_some() {
        fail(err(
            "forward_authorization",
            "serve: `forward_authorization: true` and `upstream_api_key` both give the upstream credentials; keep one"
                .into(),
        ));
    }
    let mut keys = Vec::new();
    let key_nodes = node.get("keys").map_or(&[][..], |n| n.items());
    for (i, k) in raw.keys.iter().enumerate() {
        let Some(sha256) = parse_digest(&k.sha256) else {
            let item = key_nodes.get(i).map(|n| n.get("sha256").unwrap_or(n));
            fail(err_at(
                item.map_or(node.pos, |n| n.pos),
                format!(
                    "serve.keys: `{}` is not a SHA-256 hex digest (64 hex digits); \
                     get one with `mcp-context serve hash-key KEY`",
                    k.sha256
                ),
            ));
            continue;
        };
        if let Some(problem) = user_name_problem(&k.user) {
            let item = key_nodes.get(i).map(|n| n.get("user").unwrap_or(n));
            fail(err_at(item.map_or(node.pos, |n| n.pos), format!("serve.keys: {problem}")));
            continue;
        }
        keys.push(KeyDigest { sha256: sha256.to_vec().into(), user: k.user.clone() });
    }
    // The keys file: every problem in it, each located in that file.
    let from_file = |file: &str| -> std::result::Result<Vec<KeyDigest>, Vec<Error>> {
        let file = base.join(file);
        let text = std::fs::read_to_string(&file)
            .map_err(|e| vec![config_error(&file, None, format!("cannot read serve.keys_file: {e}"))])?;
        let file_err = |pos: Option<Pos>, message: String| config_error(&file, pos, message);
        let root = yaml::parse(&text).map_err(|p| vec![file_err(p.pos, p.message)])?;
        let Some(root) = root else { return Ok(Vec::new()) };
        let problems = yaml::Problems::default();
        let list = yaml::from_node::<Vec<yaml::Lenient<RawKey>>>(&root, &problems);
        let mut errors: Vec<Error> = problems
            .into_vec()
            .into_iter()
            .map(|p| file_err(p.pos, format!("{} (expected a list of {{ sha256, user }})", p.message)))
            .collect();
        let list = match list {
            Ok(list) => list,
            Err(p) if errors.is_empty() => {
                return Err(vec![file_err(p.pos, format!("{} (expected a list of {{ sha256, user }})", p.message))]);
            }
            Err(_) => return Err(errors),
        };
        let items = root.items();
        let mut keys = Vec::new();
        for (i, k) in list.into_iter().enumerate() {
            let Some(k) = k.0 else { continue };
            let pos = items.get(i).map(|n| n.get("sha256").unwrap_or(n).pos);
            let Some(sha256) = parse_digest(&k.sha256) else {
                errors.push(file_err(pos, format!("`{}` is not a SHA-256 hex digest (64 hex digits)", k.sha256)));
                continue;
            };
            if let Some(problem) = user_name_problem(&k.user) {
                let pos = items.get(i).map(|n| n.get("user").unwrap_or(n).pos);
                errors.push(file_err(pos, problem));
                continue;
            }
            keys.push(KeyDigest { sha256: sha256.to_vec().into(), user: k.user });
        }
        if errors.is_empty() { Ok(keys) } else { Err(errors) }
    };
    if let Some(file) = &raw.keys_file {
        match from_file(file) {
            Ok(more) => keys.extend(more),
            Err(errors) => errors.into_iter().for_each(fail),
        }
    }
    if raw.forward_authorization && !keys.is_empty() {
        fail(err(
            "forward_authorization",
            "serve: with `forward_authorization: true` the caller's Authorization is the upstream's key, so `keys` \
             cannot identify callers; remove `keys`/`keys_file` or set `forward_authorization: false`"
                .into(),
        ));
    }
    if let Some(h) = &raw.user_header
        && (h.is_empty() || !h.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b)))
    {
        fail(err("user_header", format!("serve.user_header: `{h}` is not an HTTP header name")));
    }
    if let Some(problem) = raw.anonymous_user.as_deref().and_then(user_name_problem) {
        fail(err("anonymous_user", format!("serve.anonymous_user: {problem}")));
    }
    let nonzero = |key: &str, v: Option<u64>, default: u64| match v {
        Some(0) => {
            fail(err(key, format!("serve.{key} must be at least 1")));
            default
        }
        v => v.unwrap_or(default),
    };
    let mut passthrough = PassthroughRule::defaults();
    let rule_nodes = node.get("passthrough").map_or(&[][..], |n| n.items());
    for (i, r) in raw.passthrough.iter().enumerate() {
        match PassthroughRule::parse(r) {
            Ok(rule) => passthrough.push(rule),
            Err(m) => fail(err_at(rule_nodes.get(i).map_or(node.pos, |n| n.pos), format!("serve.passthrough: {m}"))),
        }
    }
    let vendors = super::vendors::Check {
        node,
        err_at: &err_at,
        fail: &fail,
        env,
        forward_authorization: raw.forward_authorization,
    };
    let anthropic = vendors.anthropic(raw.anthropic.as_ref());
    let gemini = vendors.gemini(raw.gemini.as_ref());
    let upstream_user = raw.upstream_user.unwrap_or_default();
    let pseudonym_key = expand_or_fail("pseudonym_key", raw.pseudonym_key.as_deref());
    if upstream_user == UpstreamUser::Pseudonym && pseudonym_key.as_deref().is_none_or(|k| k.len() < 16) {
        fail(err(
            "upstream_user",
            "serve: `upstream_user: pseudonym` needs `pseudonym_key`, a secret of at least 16 characters \
             (e.g. `${MCP_CONTEXT_PSEUDONYM_KEY}`)"
                .into(),
        ));
    }
    if let Some(u) = &raw.public_url
        && url::Url::parse(u).map_or(true, |p| !matches!(p.scheme(), "http" | "https") || p.query().is_some())
    {
        fail(err("public_url", format!("serve.public_url: `{u}` is not an http:// or https:// URL without a query")));
    }
    if let Some(hosts) = &raw.allowed_hosts
        && let Some(bad) = hosts.iter().find(|h| h.is_empty() || h.contains(['/', ' ', '@']))
    {
        fail(err("allowed_hosts", format!("serve.allowed_hosts: `{bad}` is not a host name or host:port")));
    }
    let inflight = nonzero(
        "max_inflight_body_bytes",
        raw.max_inflight_body_bytes.map(|v| v as u64),
        d.max_inflight_body_bytes as u64,
    )
    .min(u32::MAX as u64) as usize;
    let max_body_bytes =
        nonzero("max_body_bytes", raw.max_body_bytes.map(|v| v as u64), d.max_body_bytes as u64) as usize;
    if max_body_bytes > inflight {
        fail(err(
            "max_body_bytes",
            format!("serve.max_body_bytes ({max_body_bytes}) is more than serve.max_inflight_body_bytes ({inflight})"),
        ));
    }
    let jwt_node = node.get("jwt");
    let has_jwt = raw.jwt.is_some();
    #[cfg(feature = "jwt")]
    let jwt = raw.jwt.and_then(|j| super::jwt::settings(j, jwt_node.unwrap_or(node), path, base, env, &|e| fail(e)));
    #[cfg(not(feature = "jwt"))]
    if has_jwt {
        fail(super::jwt::refuse(jwt_node.unwrap_or(node), path));
    }
    if has_jwt && raw.forward_authorization {
        fail(err(
            "jwt",
            "serve: with `forward_authorization: true` the bearer is the upstream's key, so `jwt` cannot verify \
             callers by it; keep one"
                .into(),
        ));
    }
    let settings = ServeSettings {
        listen: raw.listen.unwrap_or(d.listen),
        upstream: upstream.map(SecretString::from),
        upstream_api_key: upstream_api_key.map(SecretString::from),
        forward_authorization: raw.forward_authorization,
        keys,
        user_header: raw.user_header,
        user_from_body: raw.user_from_body,
        anonymous_user: raw.anonymous_user,
        max_body_bytes,
        max_body_fields: nonzero("max_body_fields", raw.max_body_fields.map(|v| v as u64), d.max_body_fields as u64)
            as usize,
        upstream_timeout: Duration::from_millis(nonzero(
            "upstream_timeout_ms",
            raw.upstream_timeout_ms,
            d.upstream_timeout.as_millis() as u64,
        )),
        shutdown_grace: Duration::from_millis(raw.shutdown_grace_ms.unwrap_or(d.shutdown_grace.as_millis() as u64)),
        max_concurrent_upstream: nonzero(
            "max_concurrent_upstream",
            raw.max_concurrent_upstream.map(|v| v as u64),
            d.max_concurrent_upstream as u64,
        ) as usize,
        passthrough,
        allowed_hosts: raw.allowed_hosts,
        public_url: raw.public_url.map(|u| u.trim_end_matches('/').to_owned()),
        upstream_user,
        pseudonym_key: pseudonym_key.map(SecretString::from),
        readyz_details: raw.readyz_details,
        max_connections: nonzero("max_connections", raw.max_connections.map(|v| v as u64), d.max_connections as u64)
            as usize,
        header_timeout: Duration::from_millis(nonzero(
            "header_timeout_ms",
            raw.header_timeout_ms,
            d.header_timeout.as_millis() as u64,
        )),
        idle_timeout: Duration::from_millis(nonzero(
            "idle_timeout_ms",
            raw.idle_timeout_ms,
            d.idle_timeout.as_millis() as u64,
        )),
        body_timeout: Duration::from_millis(nonzero(
            "body_timeout_ms",
            raw.body_timeout_ms,
            d.body_timeout.as_millis() as u64,
        )),
        max_inflight_body_bytes: inflight,
        max_unidentified_body_bytes: nonzero(
            "max_unidentified_body_bytes",
            raw.max_unidentified_body_bytes.map(|v| v as u64),
            d.max_unidentified_body_bytes as u64,
        )
        .min(inflight as u64) as usize,
        stored_retention: Duration::from_secs(
            86_400 * nonzero("stored_retention_days", raw.stored_retention_days, d.stored_retention.as_secs() / 86_400),
        ),
        max_stored_records: nonzero(
            "max_stored_records",
            raw.max_stored_records.map(|v| v as u64),
            d.max_stored_records as u64,
        ) as usize,
        anthropic,
        gemini,
        #[cfg(feature = "jwt")]
        jwt,
        mcp: raw.mcp.and_then(|m| super::mcp::settings(m, node.get("mcp").unwrap_or(node), path, &fail)),
    };
    let problems = problems.into_inner();
    if problems.is_empty() { Ok(settings) } else { Err(problems) }
}
