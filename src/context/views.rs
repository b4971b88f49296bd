//! Per-user views of the servers whose `auth:` is per user (issue 35).
//!
//! Such a server is not in the shared hub. For each user that holds a
//! credential for it, a *view* is opened: a hub over that one server whose
//! every HTTP request carries that user's credential headers, and a content
//! cache of its own in this process's memory (never the shared Redis
//! cache, whatever the server's `cacheScope` says). One MCP connection per
//! (server, user) on both protocol revisions (on 2025-11-25 that is the
//! user's session; on 2026-07-28 it keeps the listing, which the server
//! makes per user, apart), all sending through **one HTTP client** shared
//! by every view: one connection pool, each request carrying its own
//! user's `Authorization` (a view costs its session and listing, not a pool). Views are bounded: at most `credentials.max_users` at once
//! (the least recently used closed first) and each closed after
//! `credentials.idle_timeout_ms` unused.
//!
//! A user with no credential gets no view and no connection (so any number
//! of such users costs nothing); the report says `needs_authorization`. A
//! server that refuses a user's credential (HTTP 401/403) is
//! `denied_by_server` for that user only, until the credential changes.
//!
//! Layer: orchestrator (beside `context/mod.rs`). Imports the sources (hub,
//! cache, credentials), the settings and the report types.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use secrecy::{ExposeSecret, SecretString};
use sha2::Digest as _;

use crate::cache::ContentCache;
use crate::config::{CacheSettings, Config, ServerConfig, Transport};
use crate::credentials::{Credential, CredentialState, Credentials, looks_denied};
use crate::hub::Hub;
use crate::report::{ServerFailure, UpstreamAuth};
use crate::resource::Resource;

/// One user's connection to one per-user server.
pub(crate) struct View {
    pub(crate) hub: Hub,
    pub(crate) cache: ContentCache,
    /// SHA-256 of the headers it was opened with: another credential opens another view.
    fingerprint: [u8; 32],
    /// The server refused the credential on a read.
    denied: AtomicBool,
    /// When it was opened (a failed connection is retried after [`RETRY_FAILED`]).
    opened: Instant,
}

/// A view whose connection failed (not a refusal: the server down, a
/// timeout) is opened again by the first request this long after.
const RETRY_FAILED: Duration = Duration::from_secs(5);

struct Slot {
    view: tokio::sync::Mutex<Option<Arc<View>>>,
    /// Use tick (LRU) and time of last use (idle timeout).
    used: AtomicU64,
    last: StdMutex<Instant>,
}

/// The open views by (server, user).
type Slots = Arc<StdMutex<HashMap<(String, String), Arc<Slot>>>>;

/// The per-user servers and the views open on them.
pub(crate) struct Views {
    servers: Vec<ServerConfig>,
    template: Config,
    /// One HTTP client for every view: a view holds its session and its
    /// user's headers, not a connection pool of its own.
    http: reqwest::Client,
    credentials: Arc<Credentials>,
    max_users: usize,
    slots: Slots,
    tick: AtomicU64,
    sweeper: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Views {
    fn drop(&mut self) {
        if let Some(t) = self.sweeper.take() {
            t.abort();
        }
    }
}

/// What one user's request sees of the per-user servers.
#[derive(Default)]
pub(crate) struct UserViews {
    /// Open, usable views, by server.
    pub(crate) views: Vec<(String, Arc<View>)>,
    /// Every per-user server's state for this user.
    pub(crate) auth: Vec<UpstreamAuth>,
    /// Views whose connection or store failed (not a refusal).
    pub(crate) failures: Vec<ServerFailure>,
}

impl UserViews {
    /// The view serving `server`, if the user has one.
    pub(crate) fn view(&self, server: &str) -> Option<&Arc<View>> {
        self.views.iter().find(|(s, _)| s == server).map(|(_, v)| v)
    }

    /// Every resource listed by the user's views, in config order.
    pub(crate) fn resources(&self) -> Vec<Arc<Resource>> {
        self.views.iter().flat_map(|(_, v)| v.hub.resources_shared()).collect()
    }

    /// Marks the user's view of `server` refused by the server (a read
    /// answered 401/403): the next request reports `denied_by_server`.
    pub(crate) fn mark_denied(&self, server: &str) {
        if let Some(v) = self.view(server) {
            v.denied.store(true, Ordering::Relaxed);
        }
    }
}

fn state(server: &str, s: &CredentialState) -> UpstreamAuth {
    let url = match s {
        CredentialState::NeedsAuthorization { url } => url.clone(),
        _ => None,
    };
    UpstreamAuth::new(server, s.as_str(), url)
}

impl Views {
    /// The per-user servers of `config` (`None` when it has none).
    pub(crate) fn new(config: &Config, credentials: Arc<Credentials>) -> Option<Views> {
        let servers: Vec<ServerConfig> = config.servers.iter().filter(|s| s.auth.is_per_user()).cloned().collect();
        if servers.is_empty() {
            return None;
        }
        let mut template = config.clone();
        template.servers.clear();
        // A view's cache is this process's memory only: per-user contents never reach Redis.
        template.cache =
            CacheSettings { private_max_bytes: config.cache.private_max_bytes, ..CacheSettings::default() };
        template.audit = Default::default();
        let slots: Slots = Arc::default();
        let idle = config.credentials.idle_timeout;
        let weak = Arc::downgrade(&slots);
        let every = (idle / 2).clamp(Duration::from_millis(100), Duration::from_secs(30));
        let sweeper = tokio::spawn(async move {
            let mut t = tokio::time::interval(every);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                t.tick().await;
                let Some(slots) = weak.upgrade() else { return };
                let now = Instant::now();
                let idle_ones: Vec<Arc<Slot>> = {
                    let mut map = slots.lock().unwrap_or_else(|p| p.into_inner());
                    let keys: Vec<_> = map
                        .iter()
                        .filter(|(_, s)| now.duration_since(*s.last.lock().unwrap_or_else(|p| p.into_inner())) >= idle)
                        .map(|(k, _)| k.clone())
                        .collect();
                    keys.iter().filter_map(|k| map.remove(k)).collect()
                };
                for s in idle_ones {
                    close_slot(s);
                }
            }
        });
        Some(Views {
            servers,
            template,
            http: reqwest::Client::new(),
            credentials,
            max_users: config.credentials.max_users,
            slots,
            tick: AtomicU64::new(0),
            sweeper: Some(sweeper),
        })
    }

    /// The credentials this uses.
    pub(crate) fn credentials(&self) -> &Arc<Credentials> {
        &self.credentials
    }

    /// Names of the per-user servers, in config order.
    pub(crate) fn server_names(&self) -> impl Iterator<Item = &str> {
        self.servers.iter().map(|s| s.name.as_str())
    }

    /// Whether `server` is one of the per-user servers.
    pub(crate) fn serves(&self, server: &str) -> bool {
        self.servers.iter().any(|s| s.name == server)
    }

    /// Views open now (all users and servers).
    pub(crate) fn open(&self) -> usize {
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Closes every view.
    pub(crate) async fn close(&self) {
        let all: Vec<Arc<Slot>> =
            self.slots.lock().unwrap_or_else(|p| p.into_inner()).drain().map(|(_, s)| s).collect();
        for s in all {
            if let Some(v) = s.view.lock().await.take() {
                v.hub.close().await;
            }
        }
    }

    /// `user`'s views, opened as needed, and every per-user server's state
    /// for them.
    pub(crate) async fn for_user(&self, user: &str) -> UserViews {
        let mut out = UserViews::default();
        for server in &self.servers {
            let name = server.name.clone();
            match self.credentials.credential_for(server, user).await {
                Err(e) => {
                    out.failures.push(ServerFailure { server: name, error: server.scrub(&e.to_string()) });
                }
                Ok(Credential::State(s)) => {
                    self.forget(&name, user);
                    out.auth.push(state(&name, &s));
                }
                Ok(Credential::Headers(headers)) => {
                    let view = self.view(server, user, headers).await;
                    let refused = view.denied.load(Ordering::Relaxed)
                        || view.hub.failures().iter().any(|f| looks_denied(&f.error));
                    if refused {
                        out.auth.push(state(&name, &CredentialState::DeniedByServer));
                        continue;
                    }
                    let failures = view.hub.failures();
                    if !failures.is_empty() && view.opened.elapsed() >= RETRY_FAILED {
                        self.forget(&name, user);
                    }
                    out.failures.extend(failures);
                    out.auth.push(state(&name, &CredentialState::Connected));
                    out.views.push((name, view));
                }
            }
        }
        out
    }

    /// Drops (server, user)'s view, if one is open.
    fn forget(&self, server: &str, user: &str) {
        let removed =
            self.slots.lock().unwrap_or_else(|p| p.into_inner()).remove(&(server.to_owned(), user.to_owned()));
        if let Some(s) = removed {
            close_slot(s);
        }
    }

    /// The open view of (server, user) with these headers, or a new one.
    async fn view(&self, server: &ServerConfig, user: &str, headers: Vec<(String, SecretString)>) -> Arc<View> {
        let fingerprint = fingerprint(&headers);
        let slot = self.slot(&server.name, user);
        let mut held = slot.view.lock().await;
        if let Some(v) = held.as_ref().filter(|v| v.fingerprint == fingerprint) {
            return v.clone();
        }
        if let Some(old) = held.take() {
            tokio::spawn(async move { old.hub.close().await });
        }
        let mut cfg = self.template.clone();
        cfg.servers = vec![with_headers(server, headers, &self.http)];
        let hub = Hub::connect(&cfg).await;
        let cache = ContentCache::new(hub.clone(), &cfg);
        tracing::debug!(server = %server.name, "per-user view opened");
        let v = Arc::new(View { hub, cache, fingerprint, denied: AtomicBool::new(false), opened: Instant::now() });
        *held = Some(v.clone());
        v
    }

    /// The slot of (server, user), made (and the least recently used one
    /// closed when past `max_users`) if needed; marked used now.
    fn slot(&self, server: &str, user: &str) -> Arc<Slot> {
        let tick = self.tick.fetch_add(1, Ordering::Relaxed);
        let mut map = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let key = (server.to_owned(), user.to_owned());
        if let Some(s) = map.get(&key) {
            s.used.store(tick, Ordering::Relaxed);
            *s.last.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
            return s.clone();
        }
        while map.len() >= self.max_users {
            let Some(oldest) = map.iter().min_by_key(|(_, s)| s.used.load(Ordering::Relaxed)).map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(s) = map.remove(&oldest) {
                close_slot(s);
            }
        }
        let s = Arc::new(Slot {
            view: tokio::sync::Mutex::new(None),
            used: AtomicU64::new(tick),
            last: StdMutex::new(Instant::now()),
        });
        map.insert(key, s.clone());
        s
    }
}

/// Closes a slot's view in the background.
fn close_slot(s: Arc<Slot>) {
    tokio::spawn(async move {
        if let Some(v) = s.view.lock().await.take() {
            v.hub.close().await;
        }
    });
}

fn fingerprint(headers: &[(String, SecretString)]) -> [u8; 32] {
    let mut h = sha2::Sha256::new();
    for (k, v) in headers {
        h.update((k.len() as u64).to_be_bytes());
        h.update(k.to_ascii_lowercase().as_bytes());
        h.update((v.expose_secret().len() as u64).to_be_bytes());
        h.update(v.expose_secret().as_bytes());
    }
    h.finalize().into()
}

/// `server` with the user's headers on every request (replacing a static
/// header of the same name), and their values recorded as its secrets,
/// sending through the views' shared HTTP client.
fn with_headers(server: &ServerConfig, headers: Vec<(String, SecretString)>, http: &reqwest::Client) -> ServerConfig {
    let mut s = server.clone();
    s.http_client = Some(http.clone());
    if let Transport::Http { headers: h, .. } = &mut s.transport {
        for (name, value) in &headers {
            h.retain(|k, _| !k.eq_ignore_ascii_case(name));
            h.insert(name.clone(), value.expose_secret().to_owned());
        }
    }
    for (_, v) in headers {
        let text = v.expose_secret();
        // The value, and a bearer's token alone, never shown in a message.
        if let Some(token) = text.strip_prefix("Bearer ").filter(|t| t.len() >= 4) {
            s.secrets.0.push(SecretString::from(token.to_owned()));
        }
        if text.len() >= 4 {
            s.secrets.0.push(v);
        }
    }
    s.secrets.0.sort_by_key(|v| std::cmp::Reverse(v.expose_secret().len()));
    s
}
