//! The `redis` credential store: sealed records in the Redis of the shared
//! cache (`cache.url`, `cache.ca_file`), under its key prefix, so that every
//! replica sees a credential any replica stored. One key per record:
//! `{prefix}cred:{server}:{sha256(user) hex}` (server names are letters,
//! digits, `-` and `_`; the user's name never appears). Values are the
//! sealed bytes; they carry no expiry (a credential lasts until replaced or
//! logged out; an expired OAuth token is refreshed or replaced by its flow).
//!
//! Pending OAuth authorizations are kept here too, so that the callback may
//! reach any replica: `{prefix}oauth-pending:{sha256(state) hex}`, sealed,
//! expiring with the authorization, taken with `GETDEL` (used once, by one
//! replica).
//!
//! Unlike the shared cache, a Redis that is down is an error here (the
//! caller then reports the server as not connected for that request).
//!
//! Layer: sources (credentials). Imports the settings, the sealing and the error type.

use futures::future::BoxFuture;
use redis::AsyncCommands as _;
use secrecy::ExposeSecret;
use secrecy::zeroize::Zeroizing;
use std::time::Duration;

use super::seal::{Sealer, store_error};
use super::{TokenSet, TokenStore, sha256_hex, user_key};
use crate::cause::redact_url;
use crate::config::CacheSettings;
use crate::error::{Error, Result};

/// Sealed records in Redis.
pub struct RedisTokenStore {
    client: redis::Client,
    prefix: String,
    url: String,
    timeout: std::time::Duration,
    sealer: Sealer,
    conn: tokio::sync::OnceCell<redis::aio::ConnectionManager>,
}

impl std::fmt::Debug for RedisTokenStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTokenStore").field("url", &self.url).field("prefix", &self.prefix).finish()
    }
}

impl RedisTokenStore {
    /// A store in the Redis of `cache` (connected on first use).
    pub fn new(cache: &CacheSettings, sealer: Sealer) -> Result<Self> {
        let url = redact_url(cache.url.expose_secret());
        let client = match &cache.ca_file {
            None => redis::Client::open(cache.url.expose_secret()),
            Some(f) => {
                let pem = std::fs::read(f)
                    .map_err(|e| store_error(&format!("cache.ca_file `{}`: cannot read it", f.display()), e))?;
                redis::Client::build_with_tls(
                    cache.url.expose_secret(),
                    redis::TlsCertificates { client_tls: None, root_cert: Some(pem) },
                )
            }
        }
        .map_err(|e| store_error(&format!("Redis at {url}"), e))?;
        Ok(RedisTokenStore {
            client,
            prefix: cache.key_prefix.clone(),
            url,
            // Credentials are read once per user connection, not per request: allow a slower Redis than the cache does.
            timeout: cache.timeout.max(std::time::Duration::from_secs(2)),
            sealer,
            conn: tokio::sync::OnceCell::new(),
        })
    }

    /// The key of (`server`, `user`).
    pub fn key(&self, server: &str, user: &str) -> String {
        format!("{}cred:{server}:{}", self.prefix, user_key(user))
    }

    /// The key of a pending authorization (`{prefix}oauth-pending:{sha256(state) hex}`: the state, which
    /// works like a password for the callback, is not a key) and its associated data, which binds the sealed
    /// record to that key: a record moved under another state does not open.
    fn pending_key(&self, state: &str) -> (String, Vec<u8>) {
        let hex = sha256_hex(state);
        let mut ad = b"mcp-context/oauth-pending/v1/".to_vec();
        ad.extend_from_slice(hex.as_bytes());
        (format!("{}oauth-pending:{hex}", self.prefix), ad)
    }

    /// The pending record of `state`, by `command` (`GET` leaves it,
    /// `GETDEL` takes it); `None` when absent or when it does not open.
    async fn pending(&self, state: &str, command: &str) -> Result<Option<Zeroizing<Vec<u8>>>> {
        let (key, ad) = self.pending_key(state);
        let mut c = self.conn().await?;
        let got: Option<Vec<u8>> =
            redis::cmd(command).arg(key).query_async(&mut c).await.map_err(|e| self.error(command, e))?;
        Ok(got.and_then(|b| self.sealer.open_with(&ad, &b)))
    }

    async fn conn(&self) -> Result<redis::aio::ConnectionManager> {
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        self.conn
            .get_or_try_init(|| redis::aio::ConnectionManager::new_with_config(self.client.clone(), config))
            .await
            .cloned()
            .map_err(|e| self.error("cannot connect", e))
    }

    fn error(&self, what: &str, e: redis::RedisError) -> Error {
        store_error(&format!("Redis at {}: {what}", self.url), e)
    }
}

impl TokenStore for RedisTokenStore {
    fn get<'a>(&'a self, server: &'a str, user: &'a str) -> BoxFuture<'a, Result<Option<TokenSet>>> {
        Box::pin(async move {
            let mut c = self.conn().await?;
            let got: Option<Vec<u8>> = c.get(self.key(server, user)).await.map_err(|e| self.error("GET", e))?;
            got.map(|bytes| self.sealer.open(server, user, &bytes)).transpose()
        })
    }

    fn put<'a>(&'a self, server: &'a str, user: &'a str, tokens: &'a TokenSet) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let sealed = self.sealer.seal(server, user, tokens)?;
            let mut c = self.conn().await?;
            c.set::<_, _, ()>(self.key(server, user), sealed).await.map_err(|e| self.error("SET", e))
        })
    }

    fn delete<'a>(&'a self, server: &'a str, user: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let mut c = self.conn().await?;
            c.del::<_, ()>(self.key(server, user)).await.map_err(|e| self.error("DEL", e))
        })
    }

    fn shares_pending(&self) -> bool {
        true
    }

    fn put_pending<'a>(&'a self, state: &'a str, record: &'a [u8], ttl: Duration) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let (key, ad) = self.pending_key(state);
            let sealed = self.sealer.seal_with(&ad, record)?;
            let mut c = self.conn().await?;
            let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
            c.pset_ex::<_, _, ()>(key, sealed, ms).await.map_err(|e| self.error("SET", e))
        })
    }

    fn peek_pending<'a>(&'a self, state: &'a str) -> BoxFuture<'a, Result<Option<Zeroizing<Vec<u8>>>>> {
        Box::pin(self.pending(state, "GET"))
    }

    fn take_pending<'a>(&'a self, state: &'a str) -> BoxFuture<'a, Result<Option<Zeroizing<Vec<u8>>>>> {
        Box::pin(self.pending(state, "GETDEL"))
    }

    fn count<'a>(&'a self, server: &'a str) -> BoxFuture<'a, Result<Option<usize>>> {
        Box::pin(async move {
            let mut c = self.conn().await?;
            let pattern = format!("{}cred:{server}:*", self.prefix);
            let mut keys: redis::AsyncIter<'_, String> =
                c.scan_match(pattern).await.map_err(|e| self.error("SCAN", e))?;
            let mut n = 0;
            while let Some(k) = futures::StreamExt::next(&mut keys).await {
                k.map_err(|e| self.error("SCAN", e))?;
                n += 1;
            }
            Ok(Some(n))
        })
    }
}

#[cfg(test)]
mod tests {
    use secrecy::{ExposeSecret, SecretString};

    use super::*;
    use crate::config::SecretKey;

    fn sealer(b: u8) -> Sealer {
        Sealer::new(&SecretKey::parse(&format!("{b:02x}").repeat(32)).unwrap())
    }

    fn cache(prefix: &str) -> CacheSettings {
        let url = std::env::var("MCP_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
        CacheSettings { url: url.into(), key_prefix: prefix.into(), ..CacheSettings::default() }
    }

    /// Round trip, nothing in clear in Redis, a wrong key and a record moved
    /// to another user's key refused; against the local Redis (skipped
    /// without one, a failure under CI=true).
    #[tokio::test]
    async fn sealed_in_redis_and_refused_when_moved_or_under_another_key() {
        let prefix = format!("mcp-context-unit:{}:", std::process::id());
        let store = RedisTokenStore::new(&cache(&prefix), sealer(1)).unwrap();
        let mut t = TokenSet::bearer(SecretString::from("at-SECRET-1".to_owned()), "jira");
        t.headers = vec![("X-Api-Key".into(), SecretString::from("hdr-SECRET-2".to_owned()))];
        if let Err(e) = store.put("jira", "alice", &t).await {
            if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
                panic!("no Redis under CI: {e}");
            }
            eprintln!("SKIPPED sealed_in_redis_and_refused_when_moved_or_under_another_key: {e}");
            return;
        }
        store.put("jira", "bob", &t).await.unwrap();
        let got = store.get("jira", "alice").await.unwrap().unwrap();
        assert_eq!(got.headers[0].1.expose_secret(), "hdr-SECRET-2");
        assert!(store.get("jira", "Alice").await.unwrap().is_none());
        assert_eq!(store.count("jira").await.unwrap(), Some(2));
        let mut c = store.conn().await.unwrap();
        let raw: Vec<u8> = c.get(store.key("jira", "alice")).await.unwrap();
        for s in ["SECRET", "alice", "X-Api-Key"] {
            assert!(!raw.windows(s.len()).any(|w| w == s.as_bytes()), "{s} in clear");
        }
        assert!(!store.key("jira", "alice").contains("alice"));
        let e = RedisTokenStore::new(&cache(&prefix), sealer(2)).unwrap().get("jira", "alice").await.unwrap_err();
        assert!(e.to_string().contains("another key"), "{e}");
        // Bob's record copied over alice's key does not open as alice's.
        let bob: Vec<u8> = c.get(store.key("jira", "bob")).await.unwrap();
        c.set::<_, _, ()>(store.key("jira", "alice"), bob).await.unwrap();
        assert!(store.get("jira", "alice").await.is_err());
        store.delete("jira", "alice").await.unwrap();
        store.delete("jira", "bob").await.unwrap();
        assert!(store.get("jira", "bob").await.unwrap().is_none());

        // Pending authorizations: sealed under a digest of the state, expiring, taken once; a record moved
        // under another state does not open.
        assert!(store.shares_pending());
        let ttl = std::time::Duration::from_secs(600);
        store.put_pending("state-A", b"{\"verifier\":\"v-SECRET\"}", ttl).await.unwrap();
        store.put_pending("state-B", b"other", ttl).await.unwrap();
        let (key_a, _) = store.pending_key("state-A");
        assert!(!key_a.contains("state-A"));
        let raw: Vec<u8> = c.get(&key_a).await.unwrap();
        assert!(!raw.windows(6).any(|w| w == b"SECRET"), "sealed");
        let pttl: i64 = redis::cmd("PTTL").arg(&key_a).query_async(&mut c).await.unwrap();
        assert!(pttl > 590_000 && pttl <= 600_000, "{pttl}");
        assert_eq!(
            store.peek_pending("state-A").await.unwrap().as_deref().map(|b| b.as_slice()),
            Some(&b"{\"verifier\":\"v-SECRET\"}"[..])
        );
        let (key_b, _) = store.pending_key("state-B");
        c.set::<_, _, ()>(&key_b, raw).await.unwrap();
        assert!(store.take_pending("state-B").await.unwrap().is_none(), "moved under another state");
        assert!(store.take_pending("state-A").await.unwrap().is_some());
        assert!(store.take_pending("state-A").await.unwrap().is_none(), "taken once");
        assert!(store.peek_pending("state-A").await.unwrap().is_none());
    }
}
