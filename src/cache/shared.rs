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
//! - channel `P events`: invalidations (every replica drops its local copy)
//!   and "filled" notes (waiters look again at once instead of at their next
//!   poll).
//!
//! Degrade, never fail: every command has a short timeout; a failure marks
//! the shared cache down for [`RETRY_AFTER`] and requests go on with the
//! local cache and MCP reads. A replica whose event subscription broke may
//! have missed invalidations: when it is back it drops its local entries.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, mpsc};

use crate::cause::redact_url;
use crate::config::{CacheSettings, Config, Transport};
use crate::error::{Error, Result};
use crate::id::ResourceId;
use crate::report::SharedCacheStatus;
use crate::resource::Contents;

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

struct Keys {
    data: String,
    generation: String,
    lock: String,
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
}

pub(crate) struct SharedCache {
    conn: ConnectionManager,
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
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for SharedCache {
    fn drop(&mut self) {
        if let Some(t) = self.task.lock().unwrap_or_else(|p| p.into_inner()).take() {
            t.abort();
        }
    }
}

/// Stores an answer only if the resource's generation is the one the reader
/// saw, and keeps the key alive as long as its longest-lived field.
const STORE: &str = r"
local g = redis.call('GET', KEYS[2]) or '0'
if g ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
local life = tonumber(ARGV[4])
local left = redis.call('PTTL', KEYS[1])
if left < life then redis.call('PEXPIRE', KEYS[1], life) end
return 1
";

/// Stores a derived-data record (`context::derived`) next to its contents:
/// only while the contents' hash exists (an invalidation deletes both), and
/// only if it adds something (byte 1 is its kind, bytes 2..33 its head
/// digest): another head, or chunks where counts alone were stored.
const STORE_DERIVED: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur and string.sub(cur, 2, 33) == string.sub(ARGV[2], 2, 33)
  and string.byte(cur, 1) >= string.byte(ARGV[2], 1) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
";

/// Releases the lock only if this replica still holds it.
const UNLOCK: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

fn hex(bytes: &[u8], len: usize) -> String {
    bytes
        .iter()
        .flat_map(|b| [b >> 4, b & 15])
        .take(len)
        .map(|n| char::from_digit(n.into(), 16).unwrap_or('0'))
        .collect()
}

fn digest(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.len().to_le_bytes());
        h.update(p.as_bytes());
    }
    hex(&h.finalize(), 32)
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A server's identity across replicas: its name and a digest of how it is
/// reached (command and arguments, or URL). The environment is left out:
/// it holds secrets and host-specific values, not what the server serves.
fn identity(name: &str, transport: &Transport) -> String {
    let fp = match transport {
        Transport::Stdio { command, args, .. } => {
            let mut parts = vec!["stdio", command.as_str()];
            parts.extend(args.iter().map(String::as_str));
            digest(&parts)
        }
        Transport::Http { url, .. } => digest(&["http", url]),
    };
    format!("{name}.{}", &fp[..16])
}

impl SharedCache {
    /// Connects lazily (a Redis that is down at start-up is retried, never
    /// fatal) and starts the event listener, which feeds `remote`.
    pub(crate) fn start(config: &Config, remote: mpsc::UnboundedSender<Remote>) -> Result<Arc<Self>> {
        let settings = config.cache.clone();
        let redacted_url = redact_url(&settings.url);
        let config_error =
            |message: String| Error::Config { path: config.path.clone(), line: None, column: None, message };
        let client = match &settings.ca_file {
            None => redis::Client::open(settings.url.as_str()),
            Some(f) => {
                let pem = std::fs::read(f)
                    .map_err(|e| config_error(format!("cache.ca_file `{}`: cannot read it: {e}", f.display())))?;
                redis::Client::build_with_tls(
                    settings.url.as_str(),
                    redis::TlsCertificates { client_tls: None, root_cert: Some(pem) },
                )
            }
        }
        .map_err(|e| config_error(format!("cache.url `{redacted_url}`: {e}")))?;
        let manager_config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(settings.timeout))
            .set_response_timeout(Some(settings.timeout))
            .set_number_of_retries(1);
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), manager_config)
            .map_err(|e| Error::Other(format!("shared cache at {redacted_url}: {e}")))?;
        let identity: HashMap<String, String> =
            config.servers.iter().map(|s| (s.name.clone(), identity(&s.name, &s.transport))).collect();
        let by_identity = identity.iter().map(|(n, i)| (i.clone(), n.clone())).collect();
        // Tells this replica's own events apart from the others': random
        // per process (the std hasher's random keys), plus pid and time.
        let random = std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), 0u8);
        let replica = digest(&[&random.to_string(), &std::process::id().to_string(), &now_ms().to_string()]);
        let shared = Arc::new(Self {
            conn,
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
        let down = h.down_until.is_some_and(|t| t > Instant::now()) || !h.subscribed;
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
        let mut conn = self.conn.clone();
        if let Some(values) = self.run("derived lookup", pipe.query_async::<Vec<Option<Vec<u8>>>>(&mut conn)).await {
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
        let mut conn = self.conn.clone();
        if let Some(stored) = self.run("derived store", pipe.query_async::<Vec<i64>>(&mut conn)).await {
            self.derived_stored.fetch_add(stored.iter().sum::<i64>() as u64, Ordering::Relaxed);
        }
    }

    pub(crate) fn derived_used(&self, n: usize) {
        self.derived_hits.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Runs one Redis command under the timeout; a failure marks the shared
    /// cache down for [`RETRY_AFTER`].
    async fn run<T>(&self, what: &str, f: impl Future<Output = redis::RedisResult<T>>) -> Option<T> {
        {
            let h = self.health();
            if h.down_until.is_some_and(|t| t > Instant::now()) {
                return None;
            }
        }
        let cause = match tokio::time::timeout(self.settings.timeout, f).await {
            Ok(Ok(v)) => {
                let mut h = self.health();
                if h.down_until.take().is_some() {
                    tracing::info!(target: "mcp_context::cache", url = %self.redacted_url, "shared cache is back");
                }
                if h.subscribed {
                    h.error = None;
                }
                return Some(v);
            }
            Ok(Err(e)) => describe(&e),
            Err(_) => format!("no answer within {} ms", self.settings.timeout.as_millis()),
        };
        self.errors.fetch_add(1, Ordering::Relaxed);
        let message = format!("Redis at {}: {what}: {cause}", self.redacted_url);
        let mut h = self.health();
        if h.down_until.is_none() {
            tracing::warn!(target: "mcp_context::cache", "shared cache down, going on without it: {message}");
        }
        h.down_until = Some(Instant::now() + RETRY_AFTER);
        h.error = Some(message);
        None
    }

    /// The shared answer for `user`, its generation and whether another
    /// replica holds the lock, in one round trip.
    async fn lookup(&self, k: &Keys, user: &str) -> Option<(Option<Found>, String, bool)> {
        let mut conn = self.conn.clone();
        let field = Self::user_field(user);
        let (values, generation, locked): (Vec<Option<Vec<u8>>>, Option<String>, bool) = self
            .run(
                "lookup",
                redis::pipe()
                    .cmd("HMGET")
                    .arg(&k.data)
                    .arg(&field)
                    .arg("p")
                    .cmd("GET")
                    .arg(&k.generation)
                    .cmd("EXISTS")
                    .arg(&k.lock)
                    .query_async(&mut conn),
            )
            .await?;
        let now = now_ms();
        // The user's own private answer first, then the public one.
        let found = values.into_iter().flatten().find_map(|v| {
            let s: Stored = serde_json::from_slice(&v).ok()?;
            (s.x > now).then(|| Found { contents: s.c, remaining: Duration::from_millis(s.x - now) })
        });
        Some((found, generation.unwrap_or_else(|| "0".into()), locked))
    }

    async fn put(&self, k: &Keys, user: &str, contents: &Contents, life: Duration, generation: &str) -> bool {
        let field = if contents.private { Self::user_field(user) } else { "p".into() };
        let life_ms = life.as_millis().max(1) as u64;
        let Ok(value) = serde_json::to_vec(&Stored { x: now_ms() + life_ms, c: contents.clone() }) else {
            return false;
        };
        let mut conn = self.conn.clone();
        let stored: Option<i64> = self
            .run(
                "store",
                self.store
                    .key(&k.data)
                    .key(&k.generation)
                    .arg(generation)
                    .arg(field)
                    .arg(value)
                    .arg(life_ms)
                    .invoke_async(&mut conn),
            )
            .await;
        stored == Some(1)
    }

    async fn publish(&self, kind: char, server: &str, uri: &str) {
        let Some(s) = self.identity.get(server) else { return };
        let event = Event { r: self.replica.clone(), k: kind, s: s.clone(), u: uri.to_owned() };
        let Ok(payload) = serde_json::to_string(&event) else { return };
        let mut conn = self.conn.clone();
        let _: Option<i64> = self.run("publish", conn.publish(&self.channel, payload)).await;
    }

    /// Reads `server`'s `uri` for `user` through the shared cache: the
    /// shared answer if there is one; else, if no other replica is reading
    /// it, `read` (stored for the others when `life` gives it a life); else
    /// the other replica's answer, waited for up to `cache.wait_ms`, and
    /// `read` only if none comes (its read failed, or its answer was private).
    pub(crate) async fn read_through(
        self: &Arc<Self>,
        server: &str,
        uri: &str,
        user: &str,
        read: impl Future<Output = Result<Contents>>,
        life: impl Fn(&Contents) -> Option<Duration>,
    ) -> SharedRead {
        let Some(k) = self.keys(server, uri) else { return SharedRead { result: read.await, remaining: None } };
        let Some((found, generation, _)) = self.lookup(&k, user).await else {
            return SharedRead { result: read.await, remaining: None };
        };
        if let Some(f) = found {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return SharedRead { result: Ok(f.contents), remaining: Some(f.remaining) };
        }
        let mut conn = self.conn.clone();
        let lock_ms = self.settings.lock.as_millis() as u64;
        let acquired: Option<Option<String>> = self
            .run(
                "lock",
                redis::cmd("SET")
                    .arg(&k.lock)
                    .arg(&self.replica)
                    .arg("NX")
                    .arg("PX")
                    .arg(lock_ms)
                    .query_async(&mut conn),
            )
            .await;
        let held = matches!(acquired, Some(Some(_)));
        // Released when this read ends, however it ends (a request that
        // gives up on its deadline drops this future mid-read).
        let _guard = held.then(|| LockGuard { shared: self.clone(), key: k.lock.clone() });
        let generation = match acquired {
            // Redis is down: read without it.
            None => return SharedRead { result: read.await, remaining: None },
            Some(Some(_)) => generation,
            Some(None) => match self.wait_for(&k, user).await {
                Ok(f) => {
                    self.hits.fetch_add(1, Ordering::Relaxed);
                    return SharedRead { result: Ok(f.contents), remaining: Some(f.remaining) };
                }
                // The holder failed, or its answer is not for this user:
                // read, and share the answer if it is shareable.
                Err(Some(generation)) => generation,
                Err(None) => return SharedRead { result: read.await, remaining: None },
            },
        };
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

    /// Waits for the lock holder's answer. `Err(Some(generation))`: the lock
    /// is gone without an answer for this user, or the wait ran out; `Err(None)`:
    /// Redis failed meanwhile.
    async fn wait_for(&self, k: &Keys, user: &str) -> std::result::Result<Found, Option<String>> {
        let notify = self
            .waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(k.data.clone())
            .or_insert_with(|| Arc::new(Notify::new()))
            .clone();
        let until = Instant::now() + self.settings.wait;
        let outcome = loop {
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let Some((found, generation, locked)) = self.lookup(k, user).await else { break Err(None) };
            if let Some(f) = found {
                break Ok(f);
            }
            let now = Instant::now();
            if !locked || now >= until {
                break Err(Some(generation));
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(POLL.min(until - now)) => {}
            }
        };
        let mut waiters = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        if Arc::strong_count(&notify) <= 2 {
            waiters.remove(&k.data);
        }
        outcome
    }

    /// This replica learnt that the resource changed: drop the shared
    /// entry (every scope), move its generation on, and tell every replica.
    pub(crate) async fn invalidate(&self, server: &str, uri: &str) {
        let (Some(k), Some(s)) = (self.keys(server, uri), self.identity.get(server)) else { return };
        let event = Event { r: self.replica.clone(), k: 'i', s: s.clone(), u: uri.to_owned() };
        let Ok(payload) = serde_json::to_string(&event) else { return };
        let mut conn = self.conn.clone();
        let done: Option<()> = self
            .run(
                "invalidate",
                redis::pipe()
                    .atomic()
                    .del(&k.data)
                    .ignore()
                    .incr(&k.generation, 1)
                    .ignore()
                    .pexpire(&k.generation, GENERATION_LIFE_MS as i64)
                    .ignore()
                    .publish(&self.channel, payload)
                    .ignore()
                    .query_async(&mut conn),
            )
            .await;
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
        let mut conn = self.conn.clone();
        let mut cursor: u64 = 0;
        loop {
            let Some((next, keys)): Option<(u64, Vec<String>)> = self
                .run(
                    "scan",
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(500)
                        .query_async(&mut conn),
                )
                .await
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
                let _: Option<()> = self.run("forget", pipe.query_async(&mut conn)).await;
            }
            if next == 0 {
                return;
            }
            cursor = next;
        }
    }

    fn on_event(&self, payload: &[u8], remote: &mpsc::UnboundedSender<Remote>) {
        let Ok(e) = serde_json::from_slice::<Event>(payload) else { return };
        if e.r == self.replica {
            return;
        }
        let Some(server) = self.by_identity.get(&e.s) else { return };
        match e.k {
            'i' => {
                self.received.fetch_add(1, Ordering::Relaxed);
                let _ = remote.send(Remote::Invalidate { server: server.clone(), uri: e.u });
            }
            'f' => {
                if let Some(k) = self.keys(server, &e.u)
                    && let Some(n) = self.waiters.lock().unwrap_or_else(|p| p.into_inner()).get(&k.data)
                {
                    n.notify_waiters();
                }
            }
            _ => {}
        }
    }
}

/// Releases a held single-flight lock when the read ends or is dropped.
struct LockGuard {
    shared: Arc<SharedCache>,
    key: String,
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let shared = self.shared.clone();
        let key = std::mem::take(&mut self.key);
        tokio::spawn(async move {
            let mut conn = shared.conn.clone();
            let _: Option<i64> =
                shared.run("unlock", shared.unlock.key(&key).arg(&shared.replica).invoke_async(&mut conn)).await;
        });
    }
}

/// The event listener: subscribes, relays events, and after any break
/// (including a Redis that was down at start-up) resubscribes and tells the
/// local cache to resync.
async fn listen(shared: std::sync::Weak<SharedCache>, client: redis::Client, remote: mpsc::UnboundedSender<Remote>) {
    let mut gap = false;
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some(me) = shared.upgrade() else { return };
        let timeout = me.settings.timeout.max(Duration::from_millis(500));
        let connected = tokio::time::timeout(timeout, async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&me.channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        })
        .await;
        match connected {
            Ok(Ok(pubsub)) => {
                backoff = Duration::from_millis(100);
                if gap {
                    let _ = remote.send(Remote::Resync);
                }
                {
                    let mut h = me.health();
                    h.subscribed = true;
                    if h.down_until.is_none() {
                        h.error = None;
                    }
                }
                tracing::debug!(target: "mcp_context::cache", url = %me.redacted_url, "listening for shared cache events");
                let mut messages = pubsub.into_on_message();
                drop(me);
                while let Some(msg) = messages.next().await {
                    let Some(me) = shared.upgrade() else { return };
                    me.on_event(msg.get_payload_bytes(), &remote);
                }
                let Some(me) = shared.upgrade() else { return };
                let mut h = me.health();
                h.subscribed = false;
                h.error = Some(format!("Redis at {}: the event subscription was closed", me.redacted_url));
                tracing::warn!(target: "mcp_context::cache", "shared cache events lost; local entries will be dropped on reconnect");
            }
            Ok(Err(e)) => {
                let mut h = me.health();
                h.subscribed = false;
                h.error = Some(format!("Redis at {}: {}", me.redacted_url, describe(&e)));
            }
            Err(_) => {
                let mut h = me.health();
                h.subscribed = false;
                h.error = Some(format!("Redis at {}: no answer within {} ms", me.redacted_url, timeout.as_millis()));
            }
        }
        gap = true;
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// A Redis error as a cause a user can act on: refused, timed out, auth.
fn describe(e: &redis::RedisError) -> String {
    if e.is_connection_refusal() {
        "connection refused (is Redis running, and is the URL right?)".into()
    } else if e.is_timeout() {
        "timed out".into()
    } else {
        let s = e.to_string();
        if s.contains("NOAUTH") || s.contains("WRONGPASS") {
            "authentication failed (check the URL's credentials)".into()
        } else if s.contains("invalid peer certificate") {
            format!("TLS: the server's certificate is not trusted ({s}); name its CA in cache.ca_file")
        } else {
            s
        }
    }
}
