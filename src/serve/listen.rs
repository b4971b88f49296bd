//! The accept loop: at most `serve.max_connections` open connections (past
//! it the proxy stops accepting until one closes, and the kernel's backlog
//! holds the rest), `TCP_NODELAY` on each, HTTP/1.1 and HTTP/2 from one
//! port, idle and slow connections closed (below), and graceful shutdown: on
//! the token, stop accepting and let the requests in flight finish. Imports
//! nothing of ours; what runs on a connection is the router it is given.
//!
//! `axum::serve` has neither a connection cap nor a header timeout, which
//! let a client with no key hold the proxy's memory with slow requests.
//!
//! Each connection has a [`Watch`]: it knows whether a request is in flight
//! (from the moment its headers are parsed until its answer's body is done)
//! and when the connection last went idle, and closes it, with no request
//! in flight, when
//! - its first request's headers are not complete within
//!   `serve.header_timeout_ms` of the accept (a client that sends nothing
//!   at all, or part of a request line, or an HTTP/2 preface and no stream);
//! - (HTTP/1.1) a later request's headers are not complete within
//!   `header_timeout_ms` of their first byte (HTTP/2 sends frames of its
//!   own while idle, so there bytes are not a request begun);
//! - it has been idle (keep-alive, nothing of a next request) for
//!   `serve.idle_timeout_ms`.
//!
//! hyper's own header timer is off: it started only once hyper-util had seen
//! the first bytes (so 8 sockets that sent nothing held a cap of 8 forever),
//! and on a keep-alive connection it also ran while idle.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::service::Service;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Limits of the accept loop.
pub(super) struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
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
    // The Watch times headers (hyper's default would be 30 s from hyper's first read).
    builder.http1().timer(TokioTimer::new()).header_read_timeout(None);
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
        let watch = Arc::new(Watch::new(&limits));
        let io = TokioIo::new(Watched { tcp, watch: watch.clone(), first: true });
        let service = Tracked { inner: TowerToHyperService::new(app.clone()), watch: watch.clone() };
        let conn = builder.serve_connection_with_upgrades(io, service).into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            tokio::select! {
                ended = conn => if let Err(e) = ended {
                    tracing::debug!(error = %e, "connection ended with an error");
                },
                () = watch.expired() => tracing::debug!("connection closed: idle, or its headers too slow"),
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

// ------------------------------------------------------------ the watch

/// What one connection is doing, for the decision to close it (see the module docs).
struct Watch {
    header_timeout: Duration,
    idle_timeout: Duration,
    state: Mutex<State>,
    /// Idle and no byte read since: the next read starts the header timer.
    waiting: AtomicBool,
    /// The connection is HTTP/2 (it opened with the preface): reads never start the header timer.
    h2: AtomicBool,
    /// Told when the deadline may have moved earlier or come back.
    changed: Notify,
}

struct State {
    /// Requests in flight (HTTP/2 runs several).
    busy: usize,
    /// A request has been seen on this connection.
    served: bool,
    /// The accept, or the end of the last request.
    idle_since: Instant,
    /// The first byte read since then, once a next request has begun arriving.
    head_since: Option<Instant>,
}

impl Watch {
    fn new(limits: &Limits) -> Self {
        Watch {
            header_timeout: limits.header_timeout,
            idle_timeout: limits.idle_timeout,
            state: Mutex::new(State { busy: 0, served: false, idle_since: Instant::now(), head_since: None }),
            waiting: AtomicBool::new(false),
            h2: AtomicBool::new(false),
            changed: Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request's headers are parsed: no deadline while it runs.
    fn begin(&self) {
        let mut s = self.state();
        s.busy += 1;
        s.served = true;
        s.head_since = None;
        self.waiting.store(false, Ordering::Relaxed);
    }

    /// A request's answer is done (or dropped).
    fn end(&self) {
        let mut s = self.state();
        s.busy = s.busy.saturating_sub(1);
        if s.busy == 0 {
            s.idle_since = Instant::now();
            s.head_since = None;
            self.waiting.store(!self.h2.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        drop(s);
        self.changed.notify_one();
    }

    /// Bytes arrived: on an idle connection, a next request has begun.
    fn read(&self) {
        if self.waiting.swap(false, Ordering::Relaxed) {
            let mut s = self.state();
            if s.busy == 0 && s.head_since.is_none() {
                s.head_since = Some(Instant::now());
            }
            drop(s);
            self.changed.notify_one();
        }
    }

    /// When the connection is to be closed if nothing changes; `None` while a request runs.
    fn deadline(&self) -> Option<Instant> {
        let s = self.state();
        if s.busy > 0 {
            return None;
        }
        if !s.served {
            return Some(s.idle_since + self.header_timeout);
        }
        let idle = s.idle_since + self.idle_timeout;
        Some(s.head_since.map_or(idle, |h| idle.min(h + self.header_timeout)))
    }

    /// Completes once the connection is past its deadline with no request in flight.
    async fn expired(&self) {
        loop {
            let changed = self.changed.notified();
            match self.deadline() {
                None => changed.await,
                Some(d) if d <= Instant::now() => return,
                Some(d) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(d) => {}
                        () = changed => {}
                    }
                }
            }
        }
    }
}

/// The accepted socket, telling its [`Watch`] when bytes arrive.
struct Watched {
    tcp: TcpStream,
    watch: Arc<Watch>,
    /// Nothing read yet (the first bytes say whether it is HTTP/2).
    first: bool,
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if buf.filled().len() > before {
            if std::mem::take(&mut self.first) && buf.filled()[before..].starts_with(b"PRI ") {
                self.watch.h2.store(true, Ordering::Relaxed);
            }
            self.watch.read();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// A request in flight on a watched connection, until dropped.
struct Busy(Arc<Watch>);

impl Busy {
    fn new(watch: &Arc<Watch>) -> Self {
        watch.begin();
        Busy(watch.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// The router as hyper calls it, each request [`Busy`] until its answer's body is done.
#[derive(Clone)]
struct Tracked {
    inner: TowerToHyperService<Router>,
    watch: Arc<Watch>,
}

type Answer = http::Response<Body>;

impl Service<http::Request<Incoming>> for Tracked {
    type Response = Answer;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Answer, Infallible>> + Send>>;

    fn call(&self, req: http::Request<Incoming>) -> Self::Future {
        let busy = Busy::new(&self.watch);
        let answer = self.inner.call(req);
        Box::pin(async move {
            let answer = answer.await?;
            Ok(answer.map(|body| Body::new(BusyBody { body, _busy: busy })))
        })
    }
}

/// An answer's body that holds its request [`Busy`] until hyper is done with it.
struct BusyBody {
    body: Body,
    _busy: Busy,
}

impl HttpBody for BusyBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
