//! The connection for commands and scripts, and the client it is made by
//! (also what `mcp-context check` pings).

use super::*;

/// The client of `cache.url` (with `cache.ca_file`'s roots, when set).
pub(super) fn client(settings: &CacheSettings, path: &std::path::Path) -> Result<redis::Client> {
    let config_error =
        |message: String| Error::Config { path: path.to_owned(), line: None, column: None, message, more: Vec::new() };
    match &settings.ca_file {
        None => redis::Client::open(settings.url.expose_secret()),
        Some(f) => {
            let pem = std::fs::read(f)
                .map_err(|e| config_error(format!("cache.ca_file `{}`: cannot read it: {e}", f.display())))?;
            redis::Client::build_with_tls(
                settings.url.expose_secret(),
                redis::TlsCertificates { client_tls: None, root_cert: Some(pem) },
            )
        }
    }
    .map_err(|e| config_error(format!("cache.url `{}`: {e}", redact_url(settings.url.expose_secret()))))
}

/// Connects to `cache.url` and sends a `PING`, within `cache.timeout`: `Err` says why not, the URL
/// without its credentials.
pub(crate) async fn ping(settings: &CacheSettings, path: &std::path::Path) -> std::result::Result<(), String> {
    let client = client(settings, path).map_err(|e| e.to_string())?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(settings.timeout))
        .set_response_timeout(Some(settings.timeout));
    let url = redact_url(settings.url.expose_secret());
    let mut c = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| format!("{url}: cannot connect: {}", describe(&e)))?;
    let pong: String =
        redis::cmd("PING").query_async(&mut c).await.map_err(|e| format!("{url}: PING failed: {}", describe(&e)))?;
    if pong == "PONG" { Ok(()) } else { Err(format!("{url}: PING answered `{pong}`")) }
}

/// The connection for commands and scripts: one multiplexed connection,
/// made on first use and dropped after any failure, so that the next
/// command connects afresh. (redis' `ConnectionManager` kept a failed
/// reconnection attempt as its connection, or a dead connection until a
/// command failed on it: a restarted Redis was never used again, issue 29.)
pub(super) struct Commands {
    pub(super) client: redis::Client,
    pub(super) config: redis::AsyncConnectionConfig,
    /// The connection and its number (a failure drops only the connection
    /// it happened on, not a newer one).
    pub(super) current: Mutex<Option<(u64, MultiplexedConnection)>>,
    /// Held while connecting: concurrent commands wait for one connection
    /// attempt instead of each making one.
    pub(super) connecting: tokio::sync::Mutex<()>,
    pub(super) made: AtomicU64,
}

impl Commands {
    fn current(&self) -> std::sync::MutexGuard<'_, Option<(u64, MultiplexedConnection)>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current connection, or a new one.
    pub(super) async fn get(&self) -> redis::RedisResult<(u64, MultiplexedConnection)> {
        if let Some(c) = self.current().clone() {
            return Ok(c);
        }
        let _connecting = self.connecting.lock().await;
        if let Some(c) = self.current().clone() {
            return Ok(c);
        }
        let c = self.client.get_multiplexed_async_connection_with_config(&self.config).await?;
        let n = self.made.fetch_add(1, Ordering::Relaxed) + 1;
        *self.current() = Some((n, c.clone()));
        Ok((n, c))
    }

    /// Drops connection `n` (whichever is current with `None`) if it is
    /// still the current one.
    pub(super) fn drop_connection(&self, n: Option<u64>) {
        let mut current = self.current();
        if current.as_ref().is_some_and(|(m, _)| n.is_none_or(|n| n == *m)) {
            *current = None;
        }
    }
}
