//! The accept loop: at most `serve.max_connections` open connections (past
//! it the proxy stops accepting until one closes, and the kernel's backlog
//! holds the rest), `TCP_NODELAY` on each, HTTP/1.1 and HTTP/2 from one
//! port, a client that takes longer than `serve.header_timeout_ms` to send
//! its headers is disconnected, and graceful shutdown: on the token, stop
//! accepting and let the requests in flight finish. Imports nothing of ours;
//! what runs on a connection is the router it is given.
//!
//! `axum::serve` has neither a connection cap nor a header timeout, which
//! let a client with no key hold the proxy's memory with slow requests.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Limits of the accept loop.
pub(super) struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// Serves `app` on `listener` until `stop` is cancelled; then waits for the
/// connections' requests in flight (the caller bounds that wait).
pub(super) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);
    loop {
        let slot = tokio::select! {
            _ = stop.cancelled() => break,
            s = slots.clone().acquire_owned() => s.expect("the semaphore is never closed"),
        };
        let (tcp, _) = tokio::select! {
            _ = stop.cancelled() => break,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: wait, do not spin.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        nodelay(&tcp);
        let service = TowerToHyperService::new(app.clone());
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(tcp), service).into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// `TCP_NODELAY` on an accepted connection. A streamed answer is many small
/// writes, and under Nagle's algorithm each one waits while the last is
/// unacknowledged, which a client that delays its ACKs (Linux: up to 40 ms)
/// turns into stalls: measured on the MCP side (`bench_shared`, an HTTP
/// server without it), 200 reads on 2025-11-25 took 595 ms instead of 157 ms.
pub(super) fn nodelay(tcp: &tokio::net::TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "cannot set TCP_NODELAY on a connection");
    }
}
