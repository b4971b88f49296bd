//! Who created each stored object the proxy relayed: chat completions
//! created with `store: true`, Responses (stored unless `store: false`) and
//! conversations. All callers reach the upstream with the operator's key, so
//! the upstream cannot tell them apart; this record is what does.
//!
//! A record maps `kind:id` to the SHA-256 of the owner's user name (the name
//! itself is not stored) for `serve.stored_retention_days`. It is kept in
//! this process, bounded by `serve.max_stored_records` (oldest dropped
//! first), and with `cache.backend: redis` also in Redis under
//! `<key_prefix>owner:<kind>:<id>` with the same lifetime, so that every
//! replica knows it. A lookup answers from this process first, then Redis; a
//! record that cannot be found means "not yours": the object answers 404,
//! exactly like a missing one, and the upstream is not asked. When Redis
//! cannot be asked, a lookup fails closed (503) rather than guess.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[cfg(feature = "redis")]
use secrecy::ExposeSecret;
use sha2::{Digest, Sha256};

use super::routes::Stored;

/// The owners' store.
pub(super) struct Owners {
    local: Mutex<Local>,
    max: usize,
    retention: Duration,
    #[cfg(feature = "redis")]
    redis: Option<RedisOwners>,
}

#[derive(Default)]
struct Local {
    owner: HashMap<String, ([u8; 32], Instant)>,
    /// Keys in insertion order: the oldest is dropped first, and expired ones from the front.
    order: VecDeque<String>,
}

/// Whether a caller may use an object.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    Owner,
    NotOwner,
    /// The shared record could not be read (Redis down).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    Unknown,
}

fn key(kind: Stored, id: &str) -> String {
    format!("{}:{id}", kind.name())
}

fn digest(user: &str) -> [u8; 32] {
    Sha256::digest(user.as_bytes()).into()
}

impl Owners {
    pub(super) fn new(
        settings: &crate::settings::ServeSettings,
        cache: &crate::settings::CacheSettings,
    ) -> crate::Result<Self> {
        #[cfg(not(feature = "redis"))]
        let _ = cache;
        Ok(Self {
            local: Mutex::default(),
            max: settings.max_stored_records,
            retention: settings.stored_retention,
            #[cfg(feature = "redis")]
            redis: (cache.backend == crate::settings::CacheBackend::Redis)
                .then(|| RedisOwners::new(cache))
                .transpose()?,
        })
    }

    /// Records `user` as the owner of `id`. Waits for Redis (bounded by its
    /// timeout) so that another replica asked right after knows it too.
    pub(super) async fn record(&self, kind: Stored, id: &str, user: &str) {
        let k = key(kind, id);
        let d = digest(user);
        {
            let mut local = self.local.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            while let Some(front) = local.order.front() {
                let expired = local.owner.get(front).is_none_or(|(_, at)| now.duration_since(*at) > self.retention);
                if !(expired || local.owner.len() >= self.max) {
                    break;
                }
                let front = local.order.pop_front().expect("checked");
                local.owner.remove(&front);
            }
            if local.owner.insert(k.clone(), (d, now)).is_none() {
                local.order.push_back(k.clone());
            }
        }
        #[cfg(feature = "redis")]
        if let Some(r) = &self.redis {
            r.record(&k, &d, self.retention).await;
        }
    }

    /// Whether `user` owns `id`.
    pub(super) async fn check(&self, kind: Stored, id: &str, user: &str) -> Verdict {
        let k = key(kind, id);
        let d = digest(user);
        {
            let local = self.local.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((owner, at)) = local.owner.get(&k)
                && at.elapsed() <= self.retention
            {
                return if *owner == d { Verdict::Owner } else { Verdict::NotOwner };
            }
        }
        #[cfg(feature = "redis")]
        if let Some(r) = &self.redis {
            return match r.owner(&k).await {
                Ok(Some(owner)) if owner == d => Verdict::Owner,
                Ok(_) => Verdict::NotOwner,
                Err(()) => Verdict::Unknown,
            };
        }
        Verdict::NotOwner
    }

    /// Records held in this process.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.local.lock().unwrap().owner.len()
    }
}

/// The Redis side: one multiplexed connection, made on first use and
/// dropped after any failure so that the next command connects afresh (a
/// restarted Redis is used again at once; redis' `ConnectionManager` could
/// keep a failed reconnection as its connection, issue 29).
#[cfg(feature = "redis")]
struct RedisOwners {
    client: redis::Client,
    config: redis::AsyncConnectionConfig,
    conn: Mutex<Option<redis::aio::MultiplexedConnection>>,
    prefix: String,
}

#[cfg(feature = "redis")]
impl RedisOwners {
    fn new(cache: &crate::settings::CacheSettings) -> crate::Result<Self> {
        let client = match &cache.ca_file {
            None => redis::Client::open(cache.url.expose_secret()),
            Some(f) => {
                let pem = std::fs::read(f).map_err(|e| {
                    crate::Error::serve(format!("cache.ca_file `{}`: cannot read it: {e}", f.display()))
                })?;
                redis::Client::build_with_tls(
                    cache.url.expose_secret(),
                    redis::TlsCertificates { client_tls: None, root_cert: Some(pem) },
                )
            }
        }
        .map_err(|e| crate::Error::serve(format!("cache.url: {e}")))?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(cache.timeout))
            .set_response_timeout(Some(cache.timeout));
        Ok(Self { client, config, conn: Mutex::default(), prefix: format!("{}owner:", cache.key_prefix) })
    }

    /// Runs one command on the current connection (or a new one); a failure drops the connection.
    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        let current = self.conn.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut conn = match current {
            Some(c) => c,
            None => {
                let c = self.client.get_multiplexed_async_connection_with_config(&self.config).await?;
                *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = Some(c.clone());
                c
            }
        };
        let r = cmd.query_async(&mut conn).await;
        if r.is_err() {
            *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        r
    }

    async fn record(&self, key: &str, owner: &[u8; 32], ttl: Duration) {
        let mut cmd = redis::cmd("SET");
        cmd.arg(format!("{}{key}", self.prefix)).arg(&owner[..]).arg("EX").arg(ttl.as_secs().max(1));
        if let Err(e) = self.query::<()>(&cmd).await {
            tracing::warn!(error = %e, "an ownership record could not be stored in Redis; other replicas will answer 404 for it");
        }
    }

    async fn owner(&self, key: &str) -> Result<Option<[u8; 32]>, ()> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(format!("{}{key}", self.prefix));
        match self.query::<Option<Vec<u8>>>(&cmd).await {
            Ok(v) => Ok(v.and_then(|v| <[u8; 32]>::try_from(v.as_slice()).ok())),
            Err(e) => {
                tracing::warn!(error = %e, "an ownership record could not be read from Redis");
                Err(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owners(max: usize) -> Owners {
        let s = crate::settings::ServeSettings { max_stored_records: max, ..Default::default() };
        Owners::new(&s, &crate::settings::CacheSettings::default()).unwrap()
    }

    #[tokio::test]
    async fn only_the_creator_owns_and_the_store_is_bounded() {
        let o = owners(3);
        o.record(Stored::Response, "resp_1", "alice").await;
        assert_eq!(o.check(Stored::Response, "resp_1", "alice").await, Verdict::Owner);
        assert_eq!(o.check(Stored::Response, "resp_1", "bob").await, Verdict::NotOwner);
        assert_eq!(o.check(Stored::ChatCompletion, "resp_1", "alice").await, Verdict::NotOwner, "kinds apart");
        assert_eq!(o.check(Stored::Response, "resp_2", "alice").await, Verdict::NotOwner);
        for i in 2..10 {
            o.record(Stored::Response, &format!("resp_{i}"), "alice").await;
        }
        assert_eq!(o.len(), 3);
        assert_eq!(o.check(Stored::Response, "resp_1", "alice").await, Verdict::NotOwner, "the oldest went first");
        assert_eq!(o.check(Stored::Response, "resp_9", "alice").await, Verdict::Owner);
    }
}
