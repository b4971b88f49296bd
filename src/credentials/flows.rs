//! The token flows of a config's per-user servers, over the credential
//! store that [`Credentials::credential_for`](super::Credentials) reads:
//!
//! - `oauth` servers: the authorization code flows ([`OAuthFlows`], for
//!   serve's connect endpoints and `mcp-context auth login`), and, before a
//!   user's request, their token refreshed when it is about to expire (a
//!   refused refresh deletes it: that user's state is then
//!   `needs_authorization`);
//! - `token_exchange` servers: before a user's request, the caller's own
//!   token exchanged (RFC 8693) when the store holds no fresh token for
//!   (server, user), and the result stored, so the hook sends it and any
//!   replica sharing the store reuses it until it expires.
//!
//! [`CredentialFlows::prepare`] is what a request path calls once it knows
//! the caller ([`Identity`]); it never fails the request: a flow that
//! cannot give a token leaves that server to report its state for that
//! user, and is logged without any token.
//!
//! Layer: sources (credentials). Imports the settings, `identity`, the
//! flows beside it and the error type.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use url::Url;

use super::oauth::{OAuthFlows, OAuthServer};
use super::{TokenExchanger, TokenStore};
use crate::config::{Config, ServerAuth, TokenExchangeSettings, Transport};
use crate::identity::Identity;

/// An exchanged token is exchanged again when it expires within this.
const EXCHANGE_MARGIN: Duration = Duration::from_secs(30);

/// The token flows of every `oauth` and `token_exchange` server of a config.
pub struct CredentialFlows {
    store: Arc<dyn TokenStore>,
    oauth: Arc<OAuthFlows>,
    exchange: Vec<(String, String, TokenExchangeSettings)>,
    exchanger: TokenExchanger,
}

impl std::fmt::Debug for CredentialFlows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialFlows")
            .field("oauth", &self.oauth)
            .field("token_exchange", &self.exchange.iter().map(|(n, _, _)| n).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl CredentialFlows {
    /// The flows of `config`'s `url:` servers with `auth: { type: oauth }`
    /// or `token_exchange`, keeping tokens in `store`; `None` when there
    /// are none.
    pub fn from_config(config: &Config, store: Arc<dyn TokenStore>) -> Option<Self> {
        let mut oauth = HashMap::new();
        let mut exchange = Vec::new();
        for s in &config.servers {
            let Transport::Http { url, .. } = &s.transport else { continue };
            match &s.auth {
                ServerAuth::OAuth(settings) => {
                    let Ok(url) = Url::parse(url) else { continue };
                    oauth.insert(s.name.clone(), OAuthServer { url, settings: settings.clone() });
                }
                ServerAuth::TokenExchange(settings) => exchange.push((s.name.clone(), url.clone(), settings.clone())),
                _ => {}
            }
        }
        if oauth.is_empty() && exchange.is_empty() {
            return None;
        }
        Some(CredentialFlows {
            oauth: Arc::new(OAuthFlows::new(oauth, store.clone())),
            store,
            exchange,
            exchanger: TokenExchanger::default(),
        })
    }

    /// The authorization code flows (serve's `/auth/...`, `auth login`).
    pub fn oauth(&self) -> &Arc<OAuthFlows> {
        &self.oauth
    }

    /// The token exchanges made (for the metrics).
    pub fn exchanges(&self) -> u64 {
        self.exchanger.exchanges()
    }

    /// After an injection: for each server that refused `user`'s token
    /// (`denied_by_server` in the report), an `oauth` token is refreshed
    /// once and then dropped ([`OAuthFlows::refused`]), an exchanged one
    /// dropped (exchanged again next time). Failures are logged.
    pub async fn after_refusals(&self, user: &str, report: &crate::report::Report) {
        for a in report.auth.iter().filter(|a| a.state == "denied_by_server") {
            let server = a.server.as_str();
            if self.oauth.has_server(server) {
                if let Err(e) = self.oauth.refused(server, user).await {
                    tracing::warn!(server, user, error = %e, "cannot renew a refused token");
                }
            } else if self.exchange.iter().any(|(n, _, _)| n == server) {
                self.exchanger.forget(server, user);
                let _ = self.store.delete(server, user).await;
            }
        }
    }

    /// Makes `who`'s tokens ready for a request: `oauth` tokens refreshed
    /// when about to expire, `token_exchange` tokens exchanged when the
    /// store holds no fresh one. Failures are logged (never a token) and
    /// leave the server's state to the report.
    pub async fn prepare(&self, who: &Identity) {
        let user = who.user.as_str();
        let oauth = self.oauth.servers().map(|server| async move {
            if let Err(e) = self.oauth.token(server, user).await {
                tracing::warn!(server, user, error = %e, "cannot refresh the user's token");
            }
        });
        let exchange = self.exchange.iter().map(|(server, url, settings)| async move {
            let held = self.store.get(server, user).await.ok().flatten();
            if held.is_some_and(|t| !t.expires_within(EXCHANGE_MARGIN)) {
                return;
            }
            match self.exchanger.token_for(server, url, settings, who).await {
                Ok(tokens) => {
                    if let Err(e) = self.store.put(server, user, &tokens).await {
                        tracing::warn!(server, user, error = %e, "cannot store the exchanged token");
                    }
                }
                Err(e) => {
                    tracing::info!(server, user, error = %e, "no token for this user");
                    if e.needs_reauthorization() {
                        let _ = self.store.delete(server, user).await;
                    }
                }
            }
        });
        futures::future::join(futures::future::join_all(oauth), futures::future::join_all(exchange)).await;
    }
}
