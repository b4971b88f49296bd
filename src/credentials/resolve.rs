//! The one hook every auth kind goes through: what to send to a per-user
//! server for one user ([`Credentials::credential_for`]), or why nothing
//! can be sent yet (a [`CredentialState`]).
//!
//! - `per_user_headers`: the header values stored for (server, user); only
//!   the header names the config lists are sent.
//! - `token_exchange` and `oauth`: the bearer token stored for (server,
//!   user) as `Authorization: Bearer`; none stored is `needs_authorization`,
//!   an expired one `token_expired`. The flows that obtain, exchange and
//!   refresh tokens (`oauth.rs`, `exchange.rs`) store them here, or replace
//!   these arms.
//!
//! Never falls back to another user's or the operator's credential.
//!
//! Layer: sources (credentials). Imports the settings, the stores and the error type.

use std::sync::Arc;

use secrecy::{ExposeSecret, SecretString};

use super::{CredentialState, FileTokenStore, MemoryTokenStore, Sealer, TokenStore};
use crate::config::{Config, CredentialStoreKind, ServerAuth, ServerConfig};
use crate::error::{Error, Result};

/// What to send to a server for one user, or why nothing can be sent.
#[derive(Clone)]
#[non_exhaustive]
pub enum Credential {
    /// These request headers (name, value), on every request of that user's connection.
    Headers(Vec<(String, SecretString)>),
    /// No usable credential: the state to report.
    State(CredentialState),
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::Headers(h) => {
                f.debug_tuple("Headers").field(&h.iter().map(|(k, _)| k).collect::<Vec<_>>()).finish()
            }
            Credential::State(s) => f.debug_tuple("State").field(s).finish(),
        }
    }
}

/// The credential store and how a user is told to connect.
pub struct Credentials {
    store: Arc<dyn TokenStore>,
    /// `serve`'s public base URL (`http://host:port`), when a proxy is on:
    /// `needs_authorization` then names `{base}/auth/{server}/start`.
    auth_base: std::sync::RwLock<Option<String>>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").finish_non_exhaustive()
    }
}

impl Credentials {
    /// Over `store`.
    pub fn with_store(store: Arc<dyn TokenStore>) -> Self {
        Credentials { store, auth_base: std::sync::RwLock::new(None) }
    }

    /// The store `config.credentials` names (sealed with its key).
    pub fn open(config: &Config) -> Result<Self> {
        let settings = &config.credentials;
        let sealer = || {
            settings.key.as_ref().map(Sealer::new).ok_or_else(|| Error::TokenStore {
                what: format!(
                    "no key to seal credentials with: set `credentials.key` or {}",
                    crate::config::CREDENTIALS_KEY_ENV
                ),
                source: None,
            })
        };
        let store: Arc<dyn TokenStore> = match settings.store {
            CredentialStoreKind::Memory => Arc::new(MemoryTokenStore::default()),
            CredentialStoreKind::File => Arc::new(FileTokenStore::new(&settings.path, sealer()?)),
            #[cfg(feature = "redis")]
            CredentialStoreKind::Redis => Arc::new(super::RedisTokenStore::new(&config.cache, sealer()?)?),
            #[cfg(not(feature = "redis"))]
            CredentialStoreKind::Redis => {
                return Err(Error::TokenStore { what: "this build has no Redis support".into(), source: None });
            }
        };
        Ok(Self::with_store(store))
    }

    /// [`Credentials::open`], or, when the store cannot be opened, one
    /// whose every lookup fails with why (each per-user server is then
    /// reported failed, the shared ones go on).
    pub fn open_or_broken(config: &Config) -> Self {
        Self::open(config).unwrap_or_else(|e| {
            tracing::error!("per-user credentials unavailable: {e}");
            Self::with_store(Arc::new(Broken(e.to_string())))
        })
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn TokenStore> {
        &self.store
    }

    /// Makes `needs_authorization` name `{base}/auth/{server}/start` (what
    /// `serve` sets to its public URL); `None` names the CLI command.
    pub fn set_auth_base(&self, base: Option<String>) {
        *self.auth_base.write().unwrap_or_else(|p| p.into_inner()) = base.map(|b| b.trim_end_matches('/').to_owned());
    }

    /// Where `user` goes to connect to `server`.
    pub fn connect_hint(&self, server: &ServerConfig) -> String {
        if let Some(base) = self.auth_base.read().unwrap_or_else(|p| p.into_inner()).as_deref() {
            return format!("{base}/auth/{}/start", server.name);
        }
        match &server.auth {
            ServerAuth::PerUserHeaders(s) => format!(
                "mcp-context auth set {} --user USER --header-stdin {}",
                server.name,
                s.headers.first().map_or("NAME", String::as_str)
            ),
            _ => format!("mcp-context auth login {} --user USER", server.name),
        }
    }

    /// What to send to `server` for `user`. `Err` only when the store
    /// cannot be read (the caller reports the server as failed for this
    /// request); a missing or unusable credential is a [`Credential::State`].
    pub async fn credential_for(&self, server: &ServerConfig, user: &str) -> Result<Credential> {
        let needs = || Credential::State(CredentialState::NeedsAuthorization { url: Some(self.connect_hint(server)) });
        match &server.auth {
            ServerAuth::Static => Ok(Credential::Headers(Vec::new())),
            ServerAuth::PerUserHeaders(settings) => {
                let Some(tokens) = self.store.get(&server.name, user).await? else { return Ok(needs()) };
                let headers: Vec<(String, SecretString)> = tokens
                    .headers
                    .iter()
                    .filter(|(k, v)| {
                        settings.headers.iter().any(|h| h.eq_ignore_ascii_case(k)) && !v.expose_secret().is_empty()
                    })
                    .cloned()
                    .collect();
                Ok(if headers.is_empty() { needs() } else { Credential::Headers(headers) })
            }
            ServerAuth::TokenExchange(_) | ServerAuth::OAuth(_) => {
                let Some(tokens) = self.store.get(&server.name, user).await? else { return Ok(needs()) };
                if tokens.access_token.expose_secret().is_empty() {
                    return Ok(needs());
                }
                if tokens.expires_within(std::time::Duration::ZERO) {
                    return Ok(Credential::State(CredentialState::TokenExpired));
                }
                let value = SecretString::from(format!("Bearer {}", tokens.access_token.expose_secret()));
                Ok(Credential::Headers(vec![("Authorization".into(), value)]))
            }
        }
    }
}

/// A store that could not be opened.
struct Broken(String);

impl TokenStore for Broken {
    fn get<'a>(&'a self, _: &'a str, _: &'a str) -> futures::future::BoxFuture<'a, Result<Option<super::TokenSet>>> {
        Box::pin(async { Err(Error::TokenStore { what: self.0.clone(), source: None }) })
    }
    fn put<'a>(&'a self, _: &'a str, _: &'a str, _: &'a super::TokenSet) -> futures::future::BoxFuture<'a, Result<()>> {
        Box::pin(async { Err(Error::TokenStore { what: self.0.clone(), source: None }) })
    }
    fn delete<'a>(&'a self, _: &'a str, _: &'a str) -> futures::future::BoxFuture<'a, Result<()>> {
        Box::pin(async { Err(Error::TokenStore { what: self.0.clone(), source: None }) })
    }
}

/// Whether a connection or read failure is the server refusing the
/// credential (HTTP 401 or 403), as the hub words it.
pub fn looks_denied(cause: &str) -> bool {
    let cause = cause.to_ascii_lowercase();
    ["http 401", "http 403", "unauthorized", "forbidden", "auth required", "insufficient_scope"]
        .iter()
        .any(|s| cause.contains(s))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::credentials::TokenSet;

    /// A bearer server's credential per user: none held → needs authorization,
    /// expired → `token_expired` (nothing sent), fresh → that user's own
    /// bearer, never another's.
    #[tokio::test]
    async fn a_bearer_servers_state_follows_the_stored_token() {
        let yaml = "servers:\n  drive:\n    url: http://127.0.0.1:9/mcp\n    auth: { type: oauth, client_id: c }\n\
                    credentials: { store: memory }\n";
        let config = Config::from_yaml_with_env(yaml, std::path::Path::new("/tmp/c.yaml"), &|_| None).unwrap();
        let server = &config.servers[0];
        let store = Arc::new(MemoryTokenStore::default());
        let creds = Credentials::with_store(store.clone());

        let got = creds.credential_for(server, "alice").await.unwrap();
        assert!(matches!(got, Credential::State(CredentialState::NeedsAuthorization { .. })), "{got:?}");

        let mut expired = TokenSet::bearer(SecretString::from("alice-old"), "http://127.0.0.1:9/mcp");
        expired.expires_at = Some(SystemTime::now() - Duration::from_secs(5));
        store.put("drive", "alice", &expired).await.unwrap();
        let got = creds.credential_for(server, "alice").await.unwrap();
        assert!(matches!(got, Credential::State(CredentialState::TokenExpired)), "{got:?}");

        let mut fresh = TokenSet::bearer(SecretString::from("alice-new"), "http://127.0.0.1:9/mcp");
        fresh.expires_at = Some(SystemTime::now() + Duration::from_secs(600));
        store.put("drive", "alice", &fresh).await.unwrap();
        match creds.credential_for(server, "alice").await.unwrap() {
            Credential::Headers(h) => {
                assert_eq!(h.len(), 1);
                assert_eq!((h[0].0.as_str(), h[0].1.expose_secret()), ("Authorization", "Bearer alice-new"));
            }
            other => panic!("{other:?}"),
        }
        let bob = creds.credential_for(server, "bob").await.unwrap();
        assert!(matches!(bob, Credential::State(CredentialState::NeedsAuthorization { .. })), "{bob:?}");
    }
}
