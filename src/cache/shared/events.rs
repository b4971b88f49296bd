//! The event side of the shared cache: the listener that keeps the
//! subscription up (and resubscribes after any break) and what an event
//! from another replica does here.

use super::*;

impl SharedCache {
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

/// The event listener: subscribes, relays events, and after any break
/// (including a Redis that was down at start-up) resubscribes and tells the
/// local cache to resync.
pub(super) async fn listen(
    shared: std::sync::Weak<SharedCache>,
    client: redis::Client,
    remote: mpsc::UnboundedSender<Remote>,
) {
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
                me.health().subscribed = true;
                tracing::debug!(target: "mcp_context::cache", url = %me.redacted_url, "listening for shared cache events");
                // Up takes a command that went through as well: one now (on
                // a new connection after a break), then one a second while
                // commands fail, so that Redis is used again as soon as it
                // answers, and not first by a request that pays for a
                // failure.
                me.probe().await;
                let mut messages = pubsub.into_on_message();
                drop(me);
                let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + RETRY_AFTER, RETRY_AFTER);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        msg = messages.next() => {
                            let Some(msg) = msg else { break };
                            let Some(me) = shared.upgrade() else { return };
                            me.on_event(msg.get_payload_bytes(), &remote);
                        }
                        _ = tick.tick() => {
                            let Some(me) = shared.upgrade() else { return };
                            if !me.commands_ok() {
                                me.probe().await;
                            }
                        }
                    }
                }
                let Some(me) = shared.upgrade() else { return };
                // Commands go to the same Redis: their connection is most
                // likely as dead as this one (a restart closes both), so the
                // next command makes a new one, and the first one to go
                // through says the shared cache is up again.
                me.commands.drop_connection(None);
                let mut h = me.health();
                h.subscribed = false;
                h.commands = false;
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
        // At most half a second between attempts: a refused connection
        // costs nothing, and a Redis that is back is used within it.
        backoff = (backoff * 2).min(RETRY_AFTER / 2);
    }
}

/// A Redis error as a cause a user can act on: refused, timed out, auth.
pub(super) fn describe(e: &redis::RedisError) -> String {
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
