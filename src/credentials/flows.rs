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
//! user, and is logged without any token. Nor does it hang it: each flow
//! runs once per (server, user) at a time as a task of its own (every
//! request of that user waits for the same run), each call to an
//! authorization server is given up after `credentials.auth_timeout_ms`,
//! and the request waits for them all at most that long, or its own
//! deadline when shorter; a server still waiting is left out of that
//! request (`auth_timeout`, [`Prepared::note`]) while its flow finishes in
//! the background (a refresh token the server rotated is still kept).
//!
//! Layer: sources (credentials). Imports the settings, `identity`, the
//! flows beside it and the error type.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use url::Url;

use super::oauth::{OAuthFlows, OAuthServer, REFRESH_WINDOW};
use super::single_flight::{Failure, Flights};
use super::{CredentialState, TokenExchanger, TokenStore};
use crate::config::{Config, ServerAuth, TokenExchangeSettings, Transport};
use crate::identity::Identity;
use crate::report::{Report, ServerFailure};

/// An exchanged token is exchanged again when it expires within this.
const EXCHANGE_MARGIN: Duration = Duration::from_secs(30);

/// The token flows of every `oauth` and `token_exchange` server of a config.
pub struct CredentialFlows {
    store: Arc<dyn TokenStore>,
    oauth: Arc<OAuthFlows>,
    exchange: Vec<(String, String, TokenExchangeSettings)>,
    exchanger: Arc<TokenExchanger>,
    flights: Flights,
    /// How long one call to an authorization server may take.
    timeout: Duration,
    /// How long a request waits for its credentials, and which setting says so.
    wait: (Duration, &'static str),
}

/// What [`CredentialFlows::prepare`] could not make ready in time.
#[derive(Debug, Default)]
#[must_use = "the servers left out are said in the report with `note`"]
pub struct Prepared {
    late: Vec<(String, String)>,
}

impl Prepared {
    /// The servers whose credentials were still awaited when the request
    /// stopped waiting.
    pub fn late(&self) -> impl Iterator<Item = &str> {
        self.late.iter().map(|(s, _)| s.as_str())
    }

    /// Says in `report` which servers' authorization servers did not
    /// answer in time: a server left out is `auth_timeout` (with the
    /// reason in `failed_servers`); one still injected with the token held
    /// (a refresh that was only early) gets a warning.
    pub fn note(&self, report: &mut Report) {
        for (server, why) in &self.late {
            match report.auth.iter_mut().find(|a| &a.server == server) {
                Some(a) if a.state == CredentialState::Connected.as_str() => {
                    report.warnings.push(format!("{server}: {why}; the token held was used"));
                }
                Some(a) => {
                    a.state = CredentialState::AuthTimeout.as_str().to_owned();
                    a.url = None;
                    report.failed_servers.push(ServerFailure { server: server.clone(), error: why.clone() });
                }
                None => {}
            }
        }
    }
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
        let timeout = config.credentials.auth_timeout;
        let wait = [
            (timeout, "credentials.auth_timeout_ms"),
            (config.context.deadline, "context.deadline_ms"),
            (config.serve.upstream_timeout, "serve.upstream_timeout_ms"),
        ]
        .into_iter()
        .min_by_key(|(d, _)| *d)
        .unwrap_or((timeout, "credentials.auth_timeout_ms"));
        Some(CredentialFlows {
            oauth: Arc::new(OAuthFlows::new(oauth, store.clone()).with_auth_timeout(timeout)),
            store,
            exchange,
            exchanger: Arc::new(TokenExchanger::new(super::authz::http_client(timeout))),
            flights: Flights::default(),
            timeout,
            wait,
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
    /// dropped (exchanged again next time). Failures are logged. Waits at
    /// most as long as [`CredentialFlows::prepare`] may; a refresh still
    /// running then finishes in the background.
    pub async fn after_refusals(&self, user: &str, report: &crate::report::Report) {
        for a in report.auth.iter().filter(|a| a.state == "denied_by_server") {
            let server = a.server.as_str();
            if self.oauth.has_server(server) {
                let (oauth, s, u) = (self.oauth.clone(), server.to_owned(), user.to_owned());
                let renew = tokio::spawn(async move {
                    if let Err(e) = oauth.refused(&s, &u).await {
                        tracing::warn!(server = %s, user = %u, error = %e, "cannot renew a refused token");
                    }
                });
                if tokio::time::timeout(self.wait.0, renew).await.is_err() {
                    tracing::warn!(server, user, "renewing a refused token goes on in the background");
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
    /// leave the server's state to the report; what is not ready within
    /// the wait (see the module docs) is in the answer, for
    /// [`Prepared::note`].
    pub async fn prepare(&self, who: &Identity) -> Prepared {
        let user = who.user.as_str();
        // What needs a flow: the store read for every server at once, as before.
        let oauth_due = self.oauth.servers().map(|server| async move {
            let held = self.store.get(server, user).await.ok().flatten();
            held.is_some_and(|t| t.expires_within(REFRESH_WINDOW)).then_some(server)
        });
        let exchange_due = self.exchange.iter().map(|e| async move {
            let held = self.store.get(&e.0, user).await.ok().flatten();
            held.is_none_or(|t| t.expires_within(EXCHANGE_MARGIN)).then_some(e)
        });
        let (oauth_due, exchange_due) =
            futures::future::join(futures::future::join_all(oauth_due), futures::future::join_all(exchange_due)).await;
        let mut flights = Vec::new();
        for server in oauth_due.into_iter().flatten() {
            let (oauth, s, u) = (self.oauth.clone(), server.to_owned(), user.to_owned());
            let timeout = self.timeout;
            let run = move || {
                async move {
                    let t = tokio::time::Instant::now();
                    oauth.token(&s, &u).await.map(|_| ()).map_err(|e| {
                        tracing::warn!(server = %s, user = %u, error = %e, "cannot refresh the user's token");
                        Failure::after(t.elapsed(), timeout)
                    })
                }
                .boxed()
            };
            flights.push((server.to_owned(), self.flights.join(server, user, run)));
        }
        for (server, url, settings) in exchange_due.into_iter().flatten() {
            let (ex, store, who) = (self.exchanger.clone(), self.store.clone(), who.clone());
            let (s, url, settings) = (server.clone(), url.clone(), settings.clone());
            let timeout = self.timeout;
            let run = move || {
                async move {
                    let t = tokio::time::Instant::now();
                    exchange(&ex, &*store, &s, &url, &settings, &who)
                        .await
                        .map_err(|()| Failure::after(t.elapsed(), timeout))
                }
                .boxed()
            };
            flights.push((server.clone(), self.flights.join(server, user, run)));
        }
        if flights.is_empty() {
            return Prepared::default();
        }
        let (wait, setting) = self.wait;
        let until = tokio::time::Instant::now() + wait;
        // Late: still running when the wait is over, or ended because its calls took all their time.
        let waits = flights.into_iter().map(|(server, f)| async move {
            match tokio::time::timeout_at(until, f).await {
                Err(_) | Ok(Err(Failure::TimedOut)) => Some(server),
                Ok(_) => None,
            }
        });
        let late = futures::future::join_all(waits).await.into_iter().flatten().map(|server| {
            tracing::warn!(server, user, "its authorization server did not answer in time: left out of this request");
            let why = format!(
                "its authorization server did not answer within {} ms ({setting}); the server is left out of this \
                 request, the next one tries again",
                wait.as_millis()
            );
            (server, why)
        });
        Prepared { late: late.collect() }
    }
}

/// One token exchange for `who` at `server`, the answer stored.
async fn exchange(
    ex: &TokenExchanger,
    store: &dyn TokenStore,
    server: &str,
    url: &str,
    settings: &TokenExchangeSettings,
    who: &Identity,
) -> Result<(), ()> {
    let user = who.user.as_str();
    match ex.token_for(server, url, settings, who).await {
        Ok(tokens) => {
            if let Err(e) = store.put(server, user, &tokens).await {
                tracing::warn!(server, user, error = %e, "cannot store the exchanged token");
            }
            Ok(())
        }
        Err(e) => {
            tracing::info!(server, user, error = %e, "no token for this user");
            if e.needs_reauthorization() {
                let _ = store.delete(server, user).await;
            }
            Err(())
        }
    }
}
