//! The shared layer of the content cache: read contents kept in Redis for
//! every replica of a deployment, so that N replicas cost one MCP read per
//! change instead of N, and a new replica starts warm.
//!
//! Redis only ever holds *contents*; what a user may see is decided by the
//! policy before anything is looked up here, and a lookup names the user, so
//! a `private` answer is only found under its own user's key.
//!
//! Keys, all under `cache.key_prefix` (`P`), per resource of a server whose
//! stable identity is `S` (its name and a digest of its command or URL, so two
//! deployments that give different servers one name never mix) and whose URI
//! digests to `U`:
//! - `P c:S:U`, a hash: field `p` holds the public answer, field `u:<user
//!   digest>` each user's private one; each value carries its own expiry, the
//!   key expires with the longest. One `DEL` drops every scope.
//! - `P g:S:U`, the resource's invalidation generation. A reader notes it
//!   with its lookup and stores its answer only if it is unchanged (a
//!   script), so a slow read that began before a change never puts the old
//!   content back after the change was announced.
//! - `P l:S:U`, the single-flight lock (`SET NX PX`, the holder's replica
//!   id): one replica reads a cold resource, the others wait for its answer.
//!   The lookup and the lock are one script ([`CLAIM`]): a replica that
//!   finds no answer holds the lock in the same step, so an answer stored
//!   between its lookup and its lock can never send it to the MCP server.
//! - channel `P events`: invalidations (every replica drops its local copy)
//!   and "filled" notes (waiters look again at once instead of at their next
//!   poll).
//!
//! Degrade, never fail: every command has a short timeout; a failure marks
//! the shared cache down for [`RETRY_AFTER`] and requests go on with the
//! local cache and MCP reads. A replica whose event subscription broke may
//! have missed invalidations: when it is back it drops its local entries.
//!
//! Connections: one multiplexed connection for commands and scripts
//! ([`Commands`]), dropped after any failure so that the next command
//! connects afresh, and one for the event subscription, made again after
//! any break. The shared cache counts as up only while the subscription is
//! up and the last command succeeded; after a break the listener sends a
//! `PING` as soon as it has subscribed again, so a restarted Redis is used
//! from the next request on.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use secrecy::ExposeSecret;
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, mpsc};

use crate::cause::redact_url;
use crate::config::{CacheSettings, Config, Transport};
use crate::error::{Error, Result};
use crate::id::ResourceId;
use crate::report::SharedCacheStatus;
use crate::resource::Contents;

mod scripts;
use scripts::{CLAIM, STORE, STORE_DERIVED, UNLOCK};

mod commands;
use commands::Commands;
pub(crate) use commands::ping;

mod keys;
use keys::{Keys, digest, identity, now_ms};

mod events;
use events::{describe, listen};

mod flight;
use flight::{LockGuard, Waiting};

/// After a failed command, the shared cache is skipped this long before the
/// next try (requests never queue behind a dead Redis).
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(1);
/// Waiters for another replica's read look again at least this often.
const POLL: Duration = Duration::from_millis(25);
/// Life of a generation key after its last invalidation: far longer than
/// any read, so a reader never sees a generation vanish under it.
const GENERATION_LIFE_MS: u64 = 24 * 3600 * 1000;

/// What the shared layer tells the local cache.
#[derive(Debug)]
pub(crate) enum Remote {
    /// Another replica learnt that this resource changed.
    Invalidate { server: String, uri: String },
    /// The event subscription was broken for a while: invalidations may
    /// have been missed, so no local entry can be trusted.
    Resync,
}

/// A found entry.
pub(crate) struct Found {
    pub(crate) contents: Contents,
    /// How much longer the shared entry lives.
    pub(crate) remaining: Duration,
}

/// How a read through the shared layer was answered.
pub(crate) struct SharedRead {
    pub(crate) result: Result<Contents>,
    /// `Some` when the answer came from Redis: its remaining life (a local
    /// copy must not outlive it).
    pub(crate) remaining: Option<Duration>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Stored {
    /// Expiry, in ms since the Unix epoch (per field: one hash holds
    /// answers of different lives).
    x: u64,
    c: Contents,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Event {
    /// The sending replica.
    r: String,
    /// `i`: invalidate; `f`: filled.
    k: char,
    /// Server identity.
    s: String,
    u: String,
}

#[derive(Default)]
struct Health {
    down_until: Option<Instant>,
    error: Option<String>,
    subscribed: bool,
    /// The last command succeeded (false until one has).
    commands: bool,
}

/// What [`SharedCache::claim`] found.
enum Claim {
    /// A live answer for this user.
    Found(Found),
    /// No answer, and this replica now holds the lock: it reads.
    Locked(String),
    /// No answer; another replica holds the lock.
    Held(String),
    /// An entry this replica cannot use (undecodable): it reads without
    /// the lock, and its answer replaces the entry.
    Unusable(String),
}

pub(crate) struct SharedCache {
    commands: Commands,
    settings: CacheSettings,
    redacted_url: String,
    channel: String,
    replica: String,
    /// Server name → stable identity, and back.
    identity: HashMap<String, String>,
    by_identity: HashMap<String, String>,
    health: Mutex<Health>,
    waiters: Mutex<HashMap<String, Arc<Notify>>>,
    hits: AtomicU64,
    /// Derived-data records of other replicas used, and records stored.
    derived_hits: AtomicU64,
    derived_stored: AtomicU64,
    errors: AtomicU64,
    sent: AtomicU64,
    received: Arc<AtomicU64>,
    store: redis::Script,
    store_derived: redis::Script,
    unlock: redis::Script,
    claim: redis::Script,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for SharedCache {
    fn drop(&mut self) {
        if let Some(t) = self.task.lock().unwrap_or_else(|p| p.into_inner()).take() {
            t.abort();
        }
    }
}

impl SharedCache {
    /// Connects lazily (a Redis that is down at start-up is retried, never
    /// fatal) and starts the event listener, which feeds `remote`.
    pub(crate) fn start(config: &Config, remote: mpsc::UnboundedSender<Remote>) -> Result<Arc<Self>> {
        let settings = config.cache.clone();
        let redacted_url = redact_url(settings.url.expose_secret());
        let client = commands::client(&settings, &config.path)?;
        let commands = Commands {
            client: client.clone(),
            config: redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(settings.timeout))
                .set_response_timeout(Some(settings.timeout)),
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            made: AtomicU64::new(0),
        };
        let identity: HashMap<String, String> =
            config.servers.iter().map(|s| (s.name.clone(), identity(&s.name, &s.transport))).collect();
        let by_identity = identity.iter().map(|(n, i)| (i.clone(), n.clone())).collect();
        // Tells this replica's own events apart from the others': random
        // per process (the std hasher's random keys), plus pid and time.
        let random = std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), 0u8);
        let replica = digest(&[&random.to_string(), &std::process::id().to_string(), &now_ms().to_string()]);
        let shared = Arc::new(Self {
            commands,
            channel: format!("{}events", settings.key_prefix),
            settings,
            redacted_url,
            replica: replica[..16].to_owned(),
            identity,
            by_identity,
            health: Mutex::default(),
            waiters: Mutex::default(),
            hits: AtomicU64::new(0),
            derived_hits: AtomicU64::new(0),
            derived_stored: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            received: Arc::default(),
            store: redis::Script::new(STORE),
            store_derived: redis::Script::new(STORE_DERIVED),
            unlock: redis::Script::new(UNLOCK),
            claim: redis::Script::new(CLAIM),
            task: Mutex::new(None),
        });
        let task = tokio::spawn(listen(Arc::downgrade(&shared), client, remote));
        *shared.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        Ok(shared)
    }

    /// Redis expiry of entries that live by a subscription locally.
    pub(crate) fn backstop(&self) -> Duration {
        self.settings.ttl
    }

    pub(crate) fn status(&self) -> SharedCacheStatus {
        let h = self.health();
        // Up only once a command has gone through on the current
        // connections: a subscription alone does not say commands work.
        let down = h.down_until.is_some_and(|t| t > Instant::now()) || !h.subscribed || !h.commands;
        SharedCacheStatus {
            up: !down,
            error: if down { h.error.clone().or_else(|| Some("not connected yet".into())) } else { None },
            hits: self.hits.load(Ordering::Relaxed),
            derived_hits: self.derived_hits.load(Ordering::Relaxed),
            derived_stored: self.derived_stored.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            invalidations_sent: self.sent.load(Ordering::Relaxed),
            invalidations_received: self.received.load(Ordering::Relaxed),
        }
    }

    fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn keys(&self, server: &str, uri: &str) -> Option<Keys> {
        let s = self.identity.get(server)?;
        let u = digest(&[uri]);
        let p = &self.settings.key_prefix;
        Some(Keys { data: format!("{p}c:{s}:{u}"), generation: format!("{p}g:{s}:{u}"), lock: format!("{p}l:{s}:{u}") })
    }

    fn user_field(user: &str) -> String {
        format!("u:{}", digest(&[user]))
    }

    /// The field of a derived-data record: next to the public answer, or
    /// to `user`'s private one (never readable under another user's key).
    fn derived_field(user: &str, private: bool, name: &str) -> String {
        let scope = if private { Self::user_field(user) } else { "p".into() };
        format!("d:{scope}:{name}")
    }

    /// The derived-data records of these resources (`true`: private
    /// contents, looked up under `user`), in one round trip.
    pub(crate) async fn derived(&self, wanted: &[(&ResourceId, bool)], user: &str, name: &str) -> Vec<Option<Vec<u8>>> {
        let mut out = vec![None; wanted.len()];
        let mut pipe = redis::pipe();
        let mut asked = Vec::new();
        for (i, (id, private)) in wanted.iter().enumerate() {
            if let Some(k) = self.keys(&id.server, &id.uri) {
                pipe.cmd("HGET").arg(k.data).arg(Self::derived_field(user, *private, name));
                asked.push(i);
            }
        }
        if asked.is_empty() {
            return out;
        }
        if let Some(values) = self
            .run("derived lookup", |mut c| async move { pipe.query_async::<Vec<Option<Vec<u8>>>>(&mut c).await })
            .await
        {
            for (i, v) in asked.into_iter().zip(values) {
                out[i] = v;
            }
        }
        out
    }

    /// Stores derived-data records (see [`STORE_DERIVED`]), in one round trip.
    pub(crate) async fn store_derived(&self, records: &[(ResourceId, bool, Vec<u8>)], user: &str, name: &str) {
        let mut pipe = redis::pipe();
        pipe.cmd("SCRIPT").arg("LOAD").arg(STORE_DERIVED).ignore();
        let sha = self.store_derived.get_hash();
        for (id, private, record) in records {
            if let Some(k) = self.keys(&id.server, &id.uri) {
                pipe.cmd("EVALSHA")
                    .arg(sha)
                    .arg(1)
                    .arg(k.data)
                    .arg(Self::derived_field(user, *private, name))
                    .arg(record);
            }
        }
        if let Some(stored) =
            self.run("derived store", |mut c| async move { pipe.query_async::<Vec<i64>>(&mut c).await }).await
        {
            self.derived_stored.fetch_add(stored.iter().sum::<i64>() as u64, Ordering::Relaxed);
        }
    }

    pub(crate) fn derived_used(&self, n: usize) {
        self.derived_hits.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Runs one Redis command under the timeout, unless the shared cache
    /// is down; a failure marks it down for [`RETRY_AFTER`].
    async fn run<T, F>(&self, what: &str, command: impl FnOnce(MultiplexedConnection) -> F) -> Option<T>
    where
        F: Future<Output = redis::RedisResult<T>>,
    {
        {
            let h = self.health();
            if h.down_until.is_some_and(|t| t > Instant::now()) {
                return None;
            }
        }
        self.exec(what, command).await
    }

    /// [`run`](Self::run) even while the shared cache is down: the
    /// listener's probe, whose success ends the down time.
    async fn exec<T, F>(&self, what: &str, command: impl FnOnce(MultiplexedConnection) -> F) -> Option<T>
    where
        F: Future<Output = redis::RedisResult<T>>,
    {
        let mut used = None;
        let outcome = tokio::time::timeout(self.settings.timeout, async {
            let (n, conn) = self.commands.get().await?;
            used = Some(n);
            command(conn).await
        })
        .await;
        let cause = match outcome {
            Ok(Ok(v)) => {
                let mut h = self.health();
                if h.down_until.take().is_some() || !h.commands {
                    tracing::info!(target: "mcp_context::cache", url = %self.redacted_url, "shared cache is back");
                }
                h.commands = true;
                if h.subscribed {
                    h.error = None;
                }
                return Some(v);
            }
            Ok(Err(e)) => describe(&e),
            Err(_) => format!("no answer within {} ms", self.settings.timeout.as_millis()),
        };
        // Whatever failed (a dead or hung connection, a refused connect, an
        // error reply), the next command starts on a new connection.
        self.commands.drop_connection(used);
        self.errors.fetch_add(1, Ordering::Relaxed);
        let message = format!("Redis at {}: {what}: {cause}", self.redacted_url);
        let mut h = self.health();
        if h.down_until.is_none() {
            tracing::warn!(target: "mcp_context::cache", "shared cache down, going on without it: {message}");
        }
        h.down_until = Some(Instant::now() + RETRY_AFTER);
        h.commands = false;
        h.error = Some(message);
        None
    }

    /// A `PING` on the command connection, down or not.
    async fn probe(&self) -> bool {
        self.exec("ping", |mut c| async move { redis::cmd("PING").query_async::<String>(&mut c).await }).await.is_some()
    }

    fn commands_ok(&self) -> bool {
        self.health().commands
    }

    /// The user's live answer, or the lock, in one round trip ([`CLAIM`]);
    /// `None` when Redis failed.
    async fn claim(&self, k: &Keys, user: &str) -> Option<Claim> {
        // One "now" for the script and for the decoding below: an answer
        // the script saw live is never found expired here.
        let now = now_ms();
        let mut invocation = self.claim.prepare_invoke();
        invocation
            .key(&k.data)
            .key(&k.generation)
            .key(&k.lock)
            .arg(Self::user_field(user))
            .arg(now)
            .arg(&self.replica)
            .arg(self.settings.lock.as_millis() as u64);
        let (mine, public, generation, state): (Option<Vec<u8>>, Option<Vec<u8>>, String, i64) =
            self.run("lookup", |mut c| async move { invocation.invoke_async(&mut c).await }).await?;
        // The user's own private answer first, then the public one.
        let found = [mine, public].into_iter().flatten().find_map(|v| {
            let s: Stored = serde_json::from_slice(&v).ok()?;
            (s.x > now).then(|| Found { contents: s.c, remaining: Duration::from_millis(s.x - now) })
        });
        Some(match (found, state) {
            (Some(f), _) => Claim::Found(f),
            (None, 1) => Claim::Locked(generation),
            (None, 2) => Claim::Held(generation),
            (None, _) => Claim::Unusable(generation),
        })
    }

    async fn put(&self, k: &Keys, user: &str, contents: &Contents, life: Duration, generation: &str) -> bool {
        let field = if contents.private { Self::user_field(user) } else { "p".into() };
        let life_ms = life.as_millis().max(1) as u64;
        let Ok(value) = serde_json::to_vec(&Stored { x: now_ms() + life_ms, c: contents.clone() }) else {
            return false;
        };
        let mut invocation = self.store.prepare_invoke();
        invocation.key(&k.data).key(&k.generation).arg(generation).arg(field).arg(value).arg(life_ms);
        let stored: Option<i64> = self.run("store", |mut c| async move { invocation.invoke_async(&mut c).await }).await;
        stored == Some(1)
    }

    async fn publish(&self, kind: char, server: &str, uri: &str) {
        let Some(s) = self.identity.get(server) else { return };
        let event = Event { r: self.replica.clone(), k: kind, s: s.clone(), u: uri.to_owned() };
        let Ok(payload) = serde_json::to_string(&event) else { return };
        let _: Option<i64> = self.run("publish", |mut c| async move { c.publish(&self.channel, payload).await }).await;
    }

    /// Reads `server`'s `uri` for `user` through the shared cache: the
    /// shared answer if there is one; else, if this replica gets the lock,
    /// `read` (stored for the others when `life` gives it a life); else the
    /// lock holder's answer, waited for up to `cache.wait_ms`. A holder that
    /// fails, or whose answer is private to another user, releases the lock,
    /// and one of the waiters takes it and reads: never two at once.
    pub(crate) async fn read_through(
        self: &Arc<Self>,
        server: &str,
        uri: &str,
        user: &str,
        read: impl Future<Output = Result<Contents>>,
        life: impl Fn(&Contents) -> Option<Duration>,
    ) -> SharedRead {
        let Some(k) = self.keys(server, uri) else { return SharedRead { result: read.await, remaining: None } };
        let waiting = Waiting::new(self, &k.data);
        let until = Instant::now() + self.settings.wait;
        let (generation, held) = loop {
            // Enabled before the lookup, so that a "filled" event that
            // arrives between the lookup and the wait is not missed.
            let notified = waiting.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.claim(&k, user).await {
                // Redis is down: read without it.
                None => return SharedRead { result: read.await, remaining: None },
                Some(Claim::Found(f)) => {
                    self.hits.fetch_add(1, Ordering::Relaxed);
                    return SharedRead { result: Ok(f.contents), remaining: Some(f.remaining) };
                }
                Some(Claim::Locked(generation)) => break (generation, true),
                Some(Claim::Unusable(generation)) => break (generation, false),
                Some(Claim::Held(generation)) => {
                    let now = Instant::now();
                    // The holder is slower than `wait_ms` (or died holding
                    // the lock): read without it rather than fail.
                    if now >= until {
                        break (generation, false);
                    }
                    tokio::select! {
                        _ = notified => {}
                        _ = tokio::time::sleep(POLL.min(until - now)) => {}
                    }
                }
            }
        };
        drop(waiting);
        // Released when this read ends, however it ends (a request that
        // gives up on its deadline drops this future mid-read), and only
        // after the answer is stored.
        let _guard = held.then(|| LockGuard { shared: self.clone(), key: k.lock.clone() });
        let result = read.await;
        match &result {
            Ok(c) => {
                if let Some(l) = life(c)
                    && self.put(&k, user, c, l, &generation).await
                {
                    self.publish('f', server, uri).await;
                }
            }
            // The resource is gone: so is every replica's copy.
            Err(e) if e.is_not_found() => self.invalidate(server, uri).await,
            Err(_) => {}
        }
        SharedRead { result, remaining: None }
    }

    /// This replica learnt that the resource changed: drop the shared
    /// entry (every scope), move its generation on, and tell every replica.
    pub(crate) async fn invalidate(&self, server: &str, uri: &str) {
        let (Some(k), Some(s)) = (self.keys(server, uri), self.identity.get(server)) else { return };
        let event = Event { r: self.replica.clone(), k: 'i', s: s.clone(), u: uri.to_owned() };
        let Ok(payload) = serde_json::to_string(&event) else { return };
        let mut pipe = redis::pipe();
        pipe.atomic()
            .del(&k.data)
            .ignore()
            .incr(&k.generation, 1)
            .ignore()
            .pexpire(&k.generation, GENERATION_LIFE_MS as i64)
            .ignore()
            .publish(&self.channel, payload)
            .ignore();
        let done: Option<()> = self.run("invalidate", |mut c| async move { pipe.query_async(&mut c).await }).await;
        if done.is_some() {
            self.sent.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// This replica's connection to `server` was re-established: whatever
    /// it missed meanwhile may be missing from the shared entries too, so
    /// they are dropped (others re-read them once, under the lock).
    pub(crate) async fn forget_server(&self, server: &str) {
        let Some(s) = self.identity.get(server) else { return };
        let pattern = format!("{}c:{s}:*", self.settings.key_prefix);
        let mut cursor: u64 = 0;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor).arg("MATCH").arg(&pattern).arg("COUNT").arg(500);
            let Some((next, keys)): Option<(u64, Vec<String>)> =
                self.run("scan", |mut c| async move { scan.query_async(&mut c).await }).await
            else {
                return;
            };
            if !keys.is_empty() {
                let mut pipe = redis::pipe();
                for key in &keys {
                    let generation = key.replacen(
                        &format!("{}c:", self.settings.key_prefix),
                        &format!("{}g:", self.settings.key_prefix),
                        1,
                    );
                    pipe.del(key)
                        .ignore()
                        .incr(&generation, 1)
                        .ignore()
                        .pexpire(&generation, GENERATION_LIFE_MS as i64)
                        .ignore();
                }
                let _: Option<()> = self.run("forget", |mut c| async move { pipe.query_async(&mut c).await }).await;
            }
            if next == 0 {
                return;
            }
            cursor = next;
        }
    }
}
