//! The connection for commands and scripts.

use super::*;

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
