//! Per-user upstream credentials (issue 35): what a user holds for one
//! server, where it is kept, and what state a user's connection is in.
//!
//! Shared vocabulary of the per-user pieces: the token store (encrypted at
//! rest: a file, or Redis beside the shared cache), token exchange
//! (`exchange.rs`), the OAuth authorization code flow (`oauth.rs`), and the
//! per-user views of servers built on them. A token never appears in a
//! `Debug`, a log line or a report, and is only ever sent to the server
//! whose audience it names.
//!
//! Layer: sources (beside `hub`). May import the settings (`config::auth`),
//! ids and the error type; nothing above them.

mod authz;
mod discovery;
mod exchange;
mod flows;
mod loopback;
mod oauth;
mod pending;
mod single_flight;

pub use exchange::{TOKEN_EXCHANGE_GRANT, TokenExchanger};
pub use flows::{CredentialFlows, Prepared};
pub use loopback::loopback_login;
pub use oauth::{
    AuthorizationStart, Connected, OAuthFlows, OAuthServer, PENDING_MAX, PENDING_PER_USER, PENDING_TTL, REFRESH_WINDOW,
};

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use secrecy::SecretString;
use secrecy::zeroize::Zeroizing;

use crate::error::{Error, Result};

// Per-user foundation (helper A): sealing, the file and Redis stores, and
// the one resolution hook every auth kind goes through (`resolve.rs`).
mod file;
#[cfg(feature = "redis")]
mod redis_store;
mod resolve;
mod seal;

pub use file::FileTokenStore;
#[cfg(feature = "redis")]
pub use redis_store::RedisTokenStore;
pub use resolve::{Credential, Credentials, looks_denied};
pub use seal::Sealer;

/// The key of a user's records in a store: the SHA-256 of the name, in
/// hex. Whatever a user name holds (`/`, `..`, `:`, case), it never
/// becomes a path or a key prefix of its own, and two names that differ in
/// any byte never share a record.
pub fn user_key(user: &str) -> String {
    sha256_hex(user)
}

/// The SHA-256 of `text`, in lower-case hex: how names and states become keys.
pub(crate) fn sha256_hex(text: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// What one user holds for one server: an OAuth token set, or stored
/// header values (`per_user_headers`).
#[derive(Clone)]
#[non_exhaustive]
pub struct TokenSet {
    /// The access token (or, for `per_user_headers`, empty).
    pub access_token: SecretString,
    /// The refresh token, when the authorization server issued one.
    pub refresh_token: Option<SecretString>,
    /// When the access token expires, when known.
    pub expires_at: Option<SystemTime>,
    /// The scopes granted.
    pub scopes: Vec<String>,
    /// The audience / resource the token was issued for; it is never sent
    /// to any other server.
    pub resource: String,
    /// Stored header values by name (`per_user_headers`).
    pub headers: Vec<(String, SecretString)>,
}

impl TokenSet {
    /// A bearer token for `resource`.
    pub fn bearer(access_token: SecretString, resource: impl Into<String>) -> Self {
        TokenSet {
            access_token,
            refresh_token: None,
            expires_at: None,
            scopes: Vec::new(),
            resource: resource.into(),
            headers: Vec::new(),
        }
    }

    /// Whether the access token expires within `margin` from now.
    pub fn expires_within(&self, margin: std::time::Duration) -> bool {
        self.expires_at.is_some_and(|t| t <= SystemTime::now() + margin)
    }
}

impl std::fmt::Debug for TokenSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSet")
            .field("access_token", &"<redacted>")
            .field("refresh_token", &self.refresh_token.as_ref().map(|_| "<redacted>"))
            .field("expires_at", &self.expires_at)
            .field("scopes", &self.scopes)
            .field("resource", &self.resource)
            .field("headers", &self.headers.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .finish()
    }
}

/// The state of one user's connection to one per-user server, as the
/// report, the metrics and `x-mcp-context-auth` say it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
#[non_exhaustive]
pub enum CredentialState {
    /// A usable credential is held.
    Connected,
    /// Nothing held yet: the user must connect, at this URL (serve's
    /// `/auth/{server}/start`, or `mcp-context auth login`).
    NeedsAuthorization {
        /// Where to go to connect.
        url: Option<String>,
    },
    /// The token expired and could not be refreshed.
    TokenExpired,
    /// The server refused the credential (401/403 after a refresh).
    DeniedByServer,
    /// Its authorization server did not answer in time (a refresh or a
    /// token exchange this request needed): the server was left out.
    AuthTimeout,
}

impl CredentialState {
    /// The state as one word: `connected`, `needs_authorization`,
    /// `token_expired`, `denied_by_server`, `auth_timeout` (the metrics label and the
    /// `x-mcp-context-auth` value).
    pub fn as_str(&self) -> &'static str {
        match self {
            CredentialState::Connected => "connected",
            CredentialState::NeedsAuthorization { .. } => "needs_authorization",
            CredentialState::TokenExpired => "token_expired",
            CredentialState::DeniedByServer => "denied_by_server",
            CredentialState::AuthTimeout => "auth_timeout",
        }
    }
}

/// Where tokens are kept, keyed by (server, user). Implementations encrypt
/// at rest; the in-memory one is for tests and single-process use.
pub trait TokenStore: Send + Sync {
    /// The token set `user` holds for `server`.
    fn get<'a>(&'a self, server: &'a str, user: &'a str) -> BoxFuture<'a, Result<Option<TokenSet>>>;
    /// Keep `tokens` for (`server`, `user`), replacing what was there.
    fn put<'a>(&'a self, server: &'a str, user: &'a str, tokens: &'a TokenSet) -> BoxFuture<'a, Result<()>>;
    /// Forget what `user` holds for `server`.
    fn delete<'a>(&'a self, server: &'a str, user: &'a str) -> BoxFuture<'a, Result<()>>;
    /// How many users hold a record for `server`, when the store can tell
    /// (`auth status` without `--user`).
    fn count<'a>(&'a self, _server: &'a str) -> BoxFuture<'a, Result<Option<usize>>> {
        Box::pin(async { Ok(None) })
    }
    /// Whether this store keeps pending OAuth authorizations where every
    /// process using it finds them (then its `*_pending` methods are the
    /// authority; else each process keeps its own in memory).
    fn shares_pending(&self) -> bool {
        false
    }
    /// Keeps the pending authorization `record` under `state` for `ttl`
    /// (sealed by the store, keyed by a digest of `state`).
    fn put_pending<'a>(&'a self, _state: &'a str, _record: &'a [u8], _ttl: Duration) -> BoxFuture<'a, Result<()>> {
        Box::pin(async {
            Err(Error::TokenStore { what: "this store keeps no pending authorizations".into(), source: None })
        })
    }
    /// The record pending under `state`, left in place.
    fn peek_pending<'a>(&'a self, _state: &'a str) -> BoxFuture<'a, Result<Option<Zeroizing<Vec<u8>>>>> {
        Box::pin(async { Ok(None) })
    }
    /// The record pending under `state`, removed in the same step (at most
    /// one caller, in any process, gets it).
    fn take_pending<'a>(&'a self, _state: &'a str) -> BoxFuture<'a, Result<Option<Zeroizing<Vec<u8>>>>> {
        Box::pin(async { Ok(None) })
    }
}

/// A token store in this process's memory (tests, one-process use).
#[derive(Default)]
pub struct MemoryTokenStore {
    map: Mutex<HashMap<(String, String), TokenSet>>,
}

impl TokenStore for MemoryTokenStore {
    fn get<'a>(&'a self, server: &'a str, user: &'a str) -> BoxFuture<'a, Result<Option<TokenSet>>> {
        let got =
            self.map.lock().unwrap_or_else(|e| e.into_inner()).get(&(server.to_owned(), user.to_owned())).cloned();
        Box::pin(async move { Ok(got) })
    }
    fn put<'a>(&'a self, server: &'a str, user: &'a str, tokens: &'a TokenSet) -> BoxFuture<'a, Result<()>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).insert((server.to_owned(), user.to_owned()), tokens.clone());
        Box::pin(async { Ok(()) })
    }
    fn delete<'a>(&'a self, server: &'a str, user: &'a str) -> BoxFuture<'a, Result<()>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).remove(&(server.to_owned(), user.to_owned()));
        Box::pin(async { Ok(()) })
    }
    fn count<'a>(&'a self, server: &'a str) -> BoxFuture<'a, Result<Option<usize>>> {
        let n = self.map.lock().unwrap_or_else(|e| e.into_inner()).keys().filter(|(s, _)| s == server).count();
        Box::pin(async move { Ok(Some(n)) })
    }
}
