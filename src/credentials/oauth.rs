//! OAuth 2.1 authorization code with PKCE, per user, for servers with
//! `auth: { type: oauth }`: where to send a user to connect a server
//! ([`OAuthFlows::start`]), the redirect back ([`OAuthFlows::finish`]: the
//! code exchanged, the tokens kept in the [`TokenStore`] for that server and
//! that user only), and the user's token when a request needs it, refreshed
//! shortly before it expires ([`OAuthFlows::token`]). A refresh the
//! authorization server refuses (revoked, expired) deletes the stored
//! tokens: that user's state becomes `needs_authorization`; nobody else is
//! affected and nothing fails.
//!
//! Discovery as the MCP authorization spec says: the server's `401` names
//! its protected resource metadata (RFC 9728), which names its
//! authorization server, whose metadata (RFC 8414) gives the endpoints; or
//! `authorization_server` from the config; what discovery may believe is
//! `discovery.rs`'s. The `resource` indicator (RFC 8707) is always the
//! server's own (so the token's audience is that server);
//! `iss` in the redirect is checked when present (RFC 9207). Pending
//! authorizations are bounded: [`PENDING_MAX`] in all, [`PENDING_PER_USER`]
//! per user (in each process that starts them), each valid [`PENDING_TTL`]
//! and usable once. With a shared token store (Redis) they are also kept
//! there, sealed, and taken from there: the redirect may come back to any
//! replica, and only one can use it.
//!
//! # Why not rmcp's `auth` feature
//! rmcp 3.11's `AuthorizationManager` is one OAuth client for one user: it
//! holds one credential store, one PKCE verifier/CSRF state and one
//! metadata discovery per instance, refuses loopback/private addresses
//! unless told otherwise, and has no token exchange grant. Serving many users
//! would need one manager per (server, user), each discovering again, with
//! its states outside our bound, and pull in the `oauth2` crate. The flow
//! itself is a few form posts; this client does them on reqwest (already
//! used), keeps one discovery per server, and uses the shared token store.
//!
//! Layer: sources (credentials). Imports the settings, `cause` and the
//! error type.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use secrecy::{ExposeSecret, SecretString};
use url::Url;

use super::authz::{self, ClientCredentials};
use super::discovery::{self, Discovered};
use super::pending::{Pending, PendingRecord};
use super::single_flight::KeyedLocks;
use super::{CredentialState, TokenSet, TokenStore};
use crate::config::OAuthSettings;
use crate::error::{Error, Result};

/// How many authorizations may be pending at once, all users together.
pub const PENDING_MAX: usize = 1024;
/// How many authorizations one user may have pending (the oldest goes).
pub const PENDING_PER_USER: usize = 4;
/// How long a user has to come back from the authorization server.
pub const PENDING_TTL: Duration = Duration::from_secs(600);
/// An access token is refreshed when it expires within this window.
pub const REFRESH_WINDOW: Duration = Duration::from_secs(60);

/// One server whose users connect with the authorization code flow.
#[derive(Debug, Clone)]
pub struct OAuthServer {
    /// The server's URL (its resource identifier unless `settings.resource` says otherwise).
    pub url: Url,
    /// Its `auth:` block.
    pub settings: OAuthSettings,
}

/// Where to send a user's browser to connect a server.
#[derive(Debug, Clone)]
pub struct AuthorizationStart {
    /// The authorization endpoint with the request's parameters.
    pub url: String,
    /// The `state` parameter (bound to the server and the user, usable once).
    pub state: String,
}

/// What a finished authorization connected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connected {
    /// The server.
    pub server: String,
    /// The user whose tokens are now stored.
    pub user: String,
}

/// The authorization code flows of all `oauth` servers, for all users.
pub struct OAuthFlows {
    http: reqwest::Client,
    store: Arc<dyn TokenStore>,
    servers: HashMap<String, OAuthServer>,
    discovered: Mutex<HashMap<String, Discovered>>,
    pending: Mutex<HashMap<String, Pending>>,
    /// One refresh at a time per (server, user): a rotated refresh token is never used twice.
    refreshing: KeyedLocks,
    refreshes: std::sync::atomic::AtomicU64,
    /// Digests of access tokens obtained by a refresh after the server
    /// refused the previous one: refused again, the user must authorize.
    after_refusal: Mutex<std::collections::HashSet<[u8; 32]>>,
}

impl std::fmt::Debug for OAuthFlows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthFlows")
            .field("servers", &self.servers.keys().collect::<Vec<_>>())
            .field("pending", &self.pending_count())
            .finish_non_exhaustive()
    }
}

impl OAuthFlows {
    /// The flows of `servers` (by name), keeping tokens in `store`.
    pub fn new(servers: HashMap<String, OAuthServer>, store: Arc<dyn TokenStore>) -> Self {
        OAuthFlows {
            http: authz::http_client(Duration::from_millis(crate::config::DEFAULT_AUTH_TIMEOUT_MS)),
            store,
            servers,
            discovered: Mutex::default(),
            pending: Mutex::default(),
            refreshing: KeyedLocks::default(),
            refreshes: std::sync::atomic::AtomicU64::new(0),
            after_refusal: Mutex::default(),
        }
    }

    /// Every call to an authorization server given up after `timeout` (`credentials.auth_timeout_ms`).
    pub fn with_auth_timeout(mut self, timeout: Duration) -> Self {
        self.http = authz::http_client(timeout);
        self
    }

    /// Whether `server` is one of these flows' servers.
    pub fn has_server(&self, server: &str) -> bool {
        self.servers.contains_key(server)
    }

    /// The servers' names.
    pub fn servers(&self) -> impl Iterator<Item = &str> {
        self.servers.keys().map(String::as_str)
    }

    /// How many authorizations are pending.
    pub fn pending_count(&self) -> usize {
        self.lock_pending().len()
    }

    /// How many refreshes were made, for the metrics.
    pub fn refreshes(&self) -> u64 {
        self.refreshes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Begins connecting `user` to `server`: the authorization URL to send
    /// the user's browser to, which comes back to `redirect_uri`.
    ///
    /// # Errors
    /// [`Error::UnknownServer`] for a server without `auth: { type: oauth }`;
    /// [`Error::Authorization`] when discovery fails or too many
    /// authorizations are pending.
    pub async fn start(&self, server: &str, user: &str, redirect_uri: &str) -> Result<AuthorizationStart> {
        let found = self.discover(server).await?;
        let Some(endpoint) = found.meta.authorization_endpoint.clone() else {
            return Err(Error::authorization(
                server,
                "its authorization server publishes no authorization_endpoint",
                false,
            ));
        };
        let settings = &self.servers[server].settings;
        let state = random_b64(32);
        let verifier = random_b64(32);
        let challenge = b64(&<sha2::Sha256 as sha2::Digest>::digest(verifier.as_bytes()));
        let record;
        {
            let mut pending = self.lock_pending();
            pending.retain(|_, p| p.created.elapsed() < PENDING_TTL);
            let mut mine: Vec<(String, Instant)> =
                pending.iter().filter(|(_, p)| p.user == user).map(|(k, p)| (k.clone(), p.created)).collect();
            if mine.len() >= PENDING_PER_USER {
                mine.sort_by_key(|(_, t)| *t);
                for (k, _) in &mine[..=mine.len() - PENDING_PER_USER] {
                    pending.remove(k);
                }
            }
            if pending.len() >= PENDING_MAX {
                return Err(Error::authorization(
                    server,
                    "too many authorizations are pending; try again later",
                    false,
                ));
            }
            let p = Pending {
                server: server.to_owned(),
                user: user.to_owned(),
                verifier: SecretString::from(verifier),
                redirect_uri: redirect_uri.to_owned(),
                created: Instant::now(),
            };
            record = self.store.shares_pending().then(|| PendingRecord::of(&p));
            pending.insert(state.clone(), p);
        }
        // Where the store is shared (Redis), the callback may reach any replica: it finds the authorization there.
        if let Some(record) = record {
            let kept = match serde_json::to_vec(&record) {
                Ok(b) => self.store.put_pending(&state, &secrecy::zeroize::Zeroizing::new(b), PENDING_TTL).await,
                Err(e) => Err(Error::TokenStore {
                    what: "cannot encode a pending authorization".into(),
                    source: Some(Arc::new(e)),
                }),
            };
            if let Err(e) = kept {
                self.lock_pending().remove(&state);
                return Err(Error::authorization(server, format!("cannot keep the authorization: {e}"), false));
            }
        }
        let mut url = endpoint;
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("response_type", "code")
                .append_pair("client_id", &settings.client_id)
                .append_pair("redirect_uri", redirect_uri)
                .append_pair("state", &state)
                .append_pair("code_challenge", &challenge)
                .append_pair("code_challenge_method", "S256")
                .append_pair("resource", &found.resource);
            if !found.scopes.is_empty() {
                q.append_pair("scope", &found.scopes.join(" "));
            }
        }
        Ok(AuthorizationStart { url: url.into(), state })
    }

    /// Whom `state` was issued to, while it is pending (not consumed): the
    /// server and the user.
    pub async fn pending_user(&self, state: &str) -> Option<(String, String)> {
        if self.store.shares_pending() {
            let p = self.store.peek_pending(state).await.ok()??;
            return PendingRecord::parse(&p).filter(|p| p.created.elapsed() < PENDING_TTL).map(|p| (p.server, p.user));
        }
        self.lock_pending().get(state).map(|p| (p.server.clone(), p.user.clone()))
    }

    /// Forgets the pending authorization `state` (the authorization server
    /// answered with an error).
    pub async fn abandon(&self, state: &str) {
        self.lock_pending().remove(state);
        if self.store.shares_pending()
            && let Err(e) = self.store.take_pending(state).await
        {
            tracing::warn!(error = %e, "cannot forget a pending authorization (it expires on its own)");
        }
    }

    /// Takes the pending authorization `state` unless it was issued to
    /// someone other than `expect_user`: from the shared store when there is
    /// one (`GETDEL`: one taker in all replicas), else from this process.
    async fn take(&self, state: &str, expect_user: Option<&str>) -> Result<Option<Pending>> {
        if !self.store.shares_pending() {
            let mut all = self.lock_pending();
            return Ok(match all.get(state) {
                Some(p) if expect_user.is_some_and(|u| u != p.user) => None,
                Some(_) => all.remove(state),
                None => None,
            });
        }
        let Some(peeked) = self.store.peek_pending(state).await?.and_then(|b| PendingRecord::parse(&b)) else {
            return Ok(None);
        };
        if expect_user.is_some_and(|u| u != peeked.user) {
            return Ok(None);
        }
        let taken = self.store.take_pending(state).await?.and_then(|b| PendingRecord::parse(&b));
        self.lock_pending().remove(state);
        Ok(taken)
    }

    /// Ends an authorization: `state` must be pending (it is consumed
    /// whatever the outcome, unless it is another user's), issued to
    /// `expect_user` when given, and `iss` (when present)
    /// the authorization server's issuer; then `code` is exchanged and the
    /// tokens stored for that server and user.
    ///
    /// # Errors
    /// [`Error::Authorization`] for an unknown, expired or used state,
    /// another user's state, a wrong `iss`, or a refused code; the token
    /// endpoint is not called for the first three.
    pub async fn finish(
        &self,
        state: &str,
        code: &str,
        iss: Option<&str>,
        expect_user: Option<&str>,
    ) -> Result<Connected> {
        let pending = self.take(state, expect_user).await?;
        let Some(p) = pending.filter(|p| p.created.elapsed() < PENDING_TTL) else {
            return Err(Error::authorization(
                "(unknown)",
                "this authorization is unknown, expired, already used or someone else's; start again",
                false,
            ));
        };
        let found = self.discover(&p.server).await?;
        // RFC 9207: an `iss` must be the issuer's, and is required when the server says it sends one (a
        // redirect without it may come from another authorization server, a mix-up attack).
        let iss_ok = match iss {
            Some(iss) => iss.trim_end_matches('/') == found.meta.issuer.trim_end_matches('/'),
            None => !found.meta.iss_in_response,
        };
        if !iss_ok {
            return Err(Error::authorization(
                &p.server,
                "the redirect names another issuer (`iss`); start again",
                false,
            ));
        }
        let settings = &self.servers[&p.server].settings;
        let form = [
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", p.redirect_uri.as_str()),
            ("code_verifier", p.verifier.expose_secret()),
            ("resource", found.resource.as_str()),
        ];
        let tokens = authz::token_request(
            &self.http,
            &p.server,
            &found.meta.token_endpoint,
            &client(settings),
            &form,
            &found.resource,
        )
        .await?;
        self.store.put(&p.server, &p.user, &tokens).await?;
        tracing::info!(server = %p.server, user = %p.user, "user connected");
        Ok(Connected { server: p.server, user: p.user })
    }

    /// `user`'s token for `server`, refreshed first when it expires within
    /// [`REFRESH_WINDOW`]; `None` when the user must (re)connect: nothing
    /// stored, or the refresh was refused (the stored tokens are deleted).
    ///
    /// # Errors
    /// [`Error::Authorization`] (not `reauthorize`) when the authorization
    /// server cannot be reached for a needed refresh and the token has
    /// expired; the token store's errors.
    pub async fn token(&self, server: &str, user: &str) -> Result<Option<TokenSet>> {
        let Some(held) = self.store.get(server, user).await? else { return Ok(None) };
        if !held.expires_within(REFRESH_WINDOW) {
            return Ok(Some(held));
        }
        let _one = self.refreshing.lock(server, user).await;
        // Another request may have refreshed while this one waited.
        let Some(held) = self.store.get(server, user).await? else { return Ok(None) };
        if !held.expires_within(REFRESH_WINDOW) {
            return Ok(Some(held));
        }
        let Some(refresh) = held.refresh_token.clone() else {
            return Ok((!held.expires_within(Duration::ZERO)).then_some(held));
        };
        let found = self.discover(server).await?;
        match self.refresh_grant(server, &found, refresh).await {
            Ok(fresh) => {
                self.store.put(server, user, &fresh).await?;
                tracing::debug!(server, user, "token refreshed");
                Ok(Some(fresh))
            }
            Err(e) if e.needs_reauthorization() => {
                tracing::info!(server, user, "refresh refused; the user must connect again");
                self.store.delete(server, user).await?;
                Ok(None)
            }
            Err(e) if held.expires_within(Duration::ZERO) => Err(e),
            Err(e) => {
                tracing::warn!(server, user, error = %e, "refresh failed; the current token is used until it expires");
                Ok(Some(held))
            }
        }
    }

    /// The server refused `user`'s token (401/403, `insufficient_scope`):
    /// it is refreshed once; refused again (or with nothing to refresh
    /// with), the tokens are deleted and the user must authorize again.
    /// Never touches another user's tokens.
    ///
    /// # Errors
    /// The token store's.
    pub async fn refused(&self, server: &str, user: &str) -> Result<()> {
        if !self.servers.contains_key(server) {
            return Ok(());
        }
        let _one = self.refreshing.lock(server, user).await;
        let Some(held) = self.store.get(server, user).await? else { return Ok(()) };
        let digest: [u8; 32] = <sha2::Sha256 as sha2::Digest>::digest(held.access_token.expose_secret()).into();
        let refreshed_before = self.after_refusal.lock().unwrap_or_else(|e| e.into_inner()).remove(&digest);
        let Some(refresh) = held.refresh_token.clone().filter(|_| !refreshed_before) else {
            tracing::info!(server, user, "the server refused the user's token; the user must connect again");
            return self.store.delete(server, user).await;
        };
        let found = self.discover(server).await?;
        match self.refresh_grant(server, &found, refresh).await {
            Ok(fresh) => {
                let d: [u8; 32] = <sha2::Sha256 as sha2::Digest>::digest(fresh.access_token.expose_secret()).into();
                {
                    let mut set = self.after_refusal.lock().unwrap_or_else(|e| e.into_inner());
                    if set.len() >= PENDING_MAX * 8 {
                        set.clear();
                    }
                    set.insert(d);
                }
                tracing::debug!(server, user, "token refreshed after the server refused it");
                self.store.put(server, user, &fresh).await
            }
            Err(e) if e.needs_reauthorization() => self.store.delete(server, user).await,
            Err(e) => Err(e),
        }
    }

    /// One `refresh_token` grant with `refresh` at `server`'s token endpoint
    /// (`found`), for `found`'s resource (counted); the new set keeps
    /// `refresh` when the answer rotates none.
    async fn refresh_grant(&self, server: &str, found: &Discovered, refresh: SecretString) -> Result<TokenSet> {
        let settings = &self.servers[server].settings;
        // Ours, never what the held set (or metadata) says: the new token is for this server.
        let form = [
            ("grant_type", "refresh_token"),
            ("refresh_token", refresh.expose_secret()),
            ("resource", found.resource.as_str()),
        ];
        self.refreshes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let token_endpoint = &found.meta.token_endpoint;
        let mut fresh =
            authz::token_request(&self.http, server, token_endpoint, &client(settings), &form, &found.resource).await?;
        if fresh.refresh_token.is_none() {
            fresh.refresh_token = Some(refresh);
        }
        Ok(fresh)
    }

    /// `user`'s state for `server`: connected, or needs authorization (with
    /// `start_url`, where to connect).
    pub async fn state(&self, server: &str, user: &str, start_url: Option<String>) -> CredentialState {
        match self.token(server, user).await {
            Ok(Some(_)) => CredentialState::Connected,
            Ok(None) => CredentialState::NeedsAuthorization { url: start_url },
            Err(_) => CredentialState::TokenExpired,
        }
    }

    async fn discover(&self, server: &str) -> Result<Discovered> {
        let Some(cfg) = self.servers.get(server) else {
            return Err(Error::UnknownServer {
                server: server.chars().take(100).collect(),
                known: {
                    let mut names: Vec<&str> = self.servers.keys().map(String::as_str).collect();
                    names.sort_unstable();
                    names.join(", ")
                },
            });
        };
        if let Some(d) = self.discovered.lock().unwrap_or_else(|e| e.into_inner()).get(server) {
            return Ok(d.clone());
        }
        let found = discovery::discover(&self.http, server, cfg).await?;
        self.discovered.lock().unwrap_or_else(|e| e.into_inner()).insert(server.to_owned(), found.clone());
        Ok(found)
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn client(s: &OAuthSettings) -> ClientCredentials<'_> {
    ClientCredentials { client_id: &s.client_id, client_secret: s.client_secret.as_ref(), method: s.client_auth }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// `n` random bytes, base64url: a `state` or a PKCE verifier.
fn random_b64(n: usize) -> String {
    let mut buf = vec![0u8; n];
    // getrandom fails only without an OS source of randomness, where nothing here could be secure.
    getrandom::fill(&mut buf).expect("the operating system's random source");
    b64(&buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::MemoryTokenStore;

    /// Flows for one server `s` whose discovery is already done (no network).
    fn flows() -> OAuthFlows {
        let url = Url::parse("http://127.0.0.1:1/mcp").unwrap();
        let settings = OAuthSettings {
            client_id: "c".into(),
            client_secret: None,
            client_auth: crate::config::ClientAuthMethod::None,
            scopes: vec!["mcp".into()],
            authorization_server: None,
            resource: None,
            token_endpoint: None,
        };
        let f = OAuthFlows::new(
            HashMap::from([("s".to_owned(), OAuthServer { url: url.clone(), settings })]),
            Arc::new(MemoryTokenStore::default()),
        );
        let meta = authz::AuthServerMetadata {
            issuer: "http://127.0.0.1:2".into(),
            authorization_endpoint: Some(Url::parse("http://127.0.0.1:2/auth").unwrap()),
            token_endpoint: Url::parse("http://127.0.0.1:2/token").unwrap(),
            iss_in_response: true,
        };
        f.discovered.lock().unwrap().insert("s".into(), Discovered { meta, resource: url.into(), scopes: vec![] });
        f
    }

    #[tokio::test]
    async fn pending_authorizations_are_bounded() {
        let f = flows();
        // One user starting again and again keeps at most PENDING_PER_USER.
        for _ in 0..50 {
            f.start("s", "alice", "http://127.0.0.1:3/cb").await.unwrap();
        }
        assert_eq!(f.pending_count(), PENDING_PER_USER);
        // Many users: the total stops at PENDING_MAX, further starts are refused (not stored).
        let mut refused = 0;
        for i in 0..PENDING_MAX + 10 {
            if f.start("s", &format!("u{i}"), "http://127.0.0.1:3/cb").await.is_err() {
                refused += 1;
            }
        }
        assert_eq!(f.pending_count(), PENDING_MAX);
        assert_eq!(refused, PENDING_PER_USER + 10);
    }

    #[tokio::test]
    async fn a_state_is_single_use_and_bound_to_its_user() {
        let f = flows();
        let a = f.start("s", "alice", "http://127.0.0.1:3/cb").await.unwrap();
        assert!(a.url.contains("code_challenge_method=S256") && a.url.contains("resource=http"), "{}", a.url);
        assert_eq!(a.state.len(), 43, "32 random bytes");
        // Without `iss` while the server says it sends one: refused, state used up.
        let b = f.start("s", "alice", "http://127.0.0.1:3/cb").await.unwrap();
        assert!(f.finish(&b.state, "code", None, None).await.unwrap_err().to_string().contains("another issuer"));
        assert!(f.pending_user(&b.state).await.is_none());
        // Another user's state is refused and left pending for its owner.
        assert!(f.finish(&a.state, "code", None, Some("bob")).await.is_err());
        assert_eq!(f.pending_user(&a.state).await, Some(("s".into(), "alice".into())));
        // The wrong issuer: refused before the token endpoint, and the state is used up.
        let e = f.finish(&a.state, "code", Some("http://evil"), None).await.unwrap_err();
        assert!(e.to_string().contains("another issuer"), "{e}");
        assert!(f.pending_user(&a.state).await.is_none());
        assert!(f.finish(&a.state, "code", None, None).await.is_err());
        assert!(f.start("nope", "alice", "http://127.0.0.1:3/cb").await.is_err());
    }
}
