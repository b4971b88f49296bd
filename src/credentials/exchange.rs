//! RFC 8693 token exchange: for a server with `auth: { type: token_exchange }`,
//! the caller's own verified token (the [`Identity`]'s, from `serve.jwt` or
//! the embedding application) is exchanged at the server's authorization
//! server for a token whose audience is that server and whose subject is
//! the caller. The answer is kept per (server, user) until shortly before
//! it expires, so one user's requests cost one exchange per token lifetime.
//!
//! A plain client on reqwest rather than rmcp's `auth` feature: rmcp 3.11's
//! OAuth client has no token exchange grant (see `oauth.rs` for the rest
//! of that choice).
//!
//! Layer: sources (credentials). Imports the settings, `identity`, `cause`
//! and the error type.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use url::Url;

use super::TokenSet;
use super::authz::{self, ClientCredentials};
use crate::config::TokenExchangeSettings;
use crate::error::{Error, Result};
use crate::identity::Identity;

/// The grant type of RFC 8693.
pub const TOKEN_EXCHANGE_GRANT: &str = "urn:ietf:params:oauth:grant-type:token-exchange";

/// An exchanged token is used until this long before it expires.
const EXPIRY_MARGIN: Duration = Duration::from_secs(30);

/// At most this many (server, user) tokens are kept; past it the expired
/// ones go, then all (the next request of each user exchanges again).
const CACHE_MAX: usize = 10_000;

/// Token exchange for any number of servers and users, with the exchanged
/// tokens cached per (server, user) in memory.
pub struct TokenExchanger {
    http: reqwest::Client,
    /// Discovered token endpoints by issuer.
    endpoints: Mutex<HashMap<String, Url>>,
    cache: Mutex<HashMap<(String, String), TokenSet>>,
    exchanges: std::sync::atomic::AtomicU64,
}

impl Default for TokenExchanger {
    fn default() -> Self {
        Self::new(authz::http_client(Duration::from_millis(crate::config::DEFAULT_AUTH_TIMEOUT_MS)))
    }
}

impl std::fmt::Debug for TokenExchanger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenExchanger").field("exchanges", &self.exchanges()).finish_non_exhaustive()
    }
}

impl TokenExchanger {
    /// An exchanger sending its requests with `http`.
    pub fn new(http: reqwest::Client) -> Self {
        TokenExchanger {
            http,
            endpoints: Mutex::default(),
            cache: Mutex::default(),
            exchanges: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// How many exchanges were made (cache misses), for the metrics.
    pub fn exchanges(&self) -> u64 {
        self.exchanges.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A token for `who` at `server` (whose URL is `server_url`, the default
    /// resource): the cached one while it holds, else a new exchange.
    ///
    /// # Errors
    /// [`Error::Authorization`]: the caller has no token to exchange
    /// (identified by a key or a header), the authorization server cannot
    /// be found or reached, or it refused (`reauthorize` when it refused
    /// the subject token: expired or revoked, the caller must sign in again).
    pub async fn token_for(
        &self,
        server: &str,
        server_url: &str,
        settings: &TokenExchangeSettings,
        who: &Identity,
    ) -> Result<TokenSet> {
        let key = (server.to_owned(), who.user.clone());
        if let Some(t) = self.lock_cache().get(&key)
            && !t.expires_within(EXPIRY_MARGIN)
        {
            return Ok(t.clone());
        }
        let Some(subject) = who.token.as_ref() else {
            return Err(Error::authorization(
                server,
                format!(
                    "token exchange needs the caller's own token, and user `{}` was identified by {} (use `serve.jwt`)",
                    who.user, who.source
                ),
                false,
            ));
        };
        let endpoint = self.endpoint(server, settings).await?;
        let resource = settings.resource.as_deref().unwrap_or(server_url);
        let scope = settings.scopes.join(" ");
        let mut form = vec![
            ("grant_type", TOKEN_EXCHANGE_GRANT),
            ("subject_token", subject.expose()),
            ("subject_token_type", settings.subject_token_type.as_str()),
            ("requested_token_type", "urn:ietf:params:oauth:token-type:access_token"),
            ("resource", resource),
        ];
        if let Some(a) = settings.audience.as_deref() {
            form.push(("audience", a));
        }
        if !scope.is_empty() {
            form.push(("scope", &scope));
        }
        let client = ClientCredentials {
            client_id: &settings.client_id,
            client_secret: settings.client_secret.as_ref(),
            method: settings.client_auth,
        };
        self.exchanges.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tokens = authz::token_request(&self.http, server, &endpoint, &client, &form, resource).await?;
        tracing::debug!(server, user = %who.user, "token exchanged");
        let mut cache = self.lock_cache();
        if cache.len() >= CACHE_MAX {
            cache.retain(|_, t| !t.expires_within(EXPIRY_MARGIN));
            if cache.len() >= CACHE_MAX {
                cache.clear();
            }
        }
        cache.insert(key, tokens.clone());
        Ok(tokens)
    }

    /// Forgets the token held for (`server`, `user`) (the server refused it).
    pub fn forget(&self, server: &str, user: &str) {
        self.lock_cache().remove(&(server.to_owned(), user.to_owned()));
    }

    async fn endpoint(&self, server: &str, settings: &TokenExchangeSettings) -> Result<Url> {
        if let Some(u) = &settings.token_endpoint {
            return Ok(u.clone());
        }
        let Some(issuer) = &settings.issuer else {
            return Err(Error::authorization(
                server,
                "token exchange needs `token_endpoint` or `issuer` in the server's `auth:` block",
                false,
            ));
        };
        if let Some(u) = self.endpoints.lock().unwrap_or_else(|e| e.into_inner()).get(issuer.as_str()) {
            return Ok(u.clone());
        }
        let meta = authz::auth_server_metadata(&self.http, server, issuer).await?;
        // A token endpoint elsewhere gets our client secret and the caller's token: only when configured.
        super::discovery::check_token_endpoint(server, issuer, &meta.token_endpoint)?;
        self.endpoints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(issuer.to_string(), meta.token_endpoint.clone());
        Ok(meta.token_endpoint)
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), TokenSet>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}
