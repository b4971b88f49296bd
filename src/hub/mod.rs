//! Connections to MCP servers: spawn or dial, handshake, list, read, close.
//!
//! This module owns [`Hub`], the one public handle on every configured
//! server, its public types ([`HubEvent`], [`ServerStatus`]) and the read
//! path (`resources/read` bounded per server and overall, abandoned reads
//! cancelled). Its jobs live in submodules:
//! - `connect`: spawning or dialing a server, the handshake, process-group
//!   supervision, reconnection with backoff and the bounded shutdown;
//! - `remote`: dialing a `url:` server (Streamable HTTP, legacy SSE, or
//!   the first then the second);
//! - `list`: listing resources and templates, following every page;
//! - `convert`: rmcp's wire types turned into ours (no rmcp type leaves
//!   this module);
//! - `listen`: `subscriptions/listen` on 2026-07-28 connections;
//! - `ahead`: reads started while the first listing goes on, for a hub
//!   made with [`Hub::connect_reading_ahead`];
//! - `server`: the per-server state.
//!
//! Each server lives in its own slot. A server that fails to start
//! or to answer is recorded with its cause and the others carry on: a hub
//! always comes up, with whatever servers could be reached.
//!
//! Lifecycle follows rmcp (`RunningService` owns the connection; dropping it
//! cancels the loop) with two additions rmcp leaves to us:
//! - stdio servers are spawned as leaders of their own process group, so a
//!   signal reaches `npx`-style trees (grandchildren) too, and
//! - [`Hub::close`] ends every server with a bounded sequence (close stdin,
//!   wait, SIGTERM the group, wait, SIGKILL the group). If a hub is dropped
//!   without `close()`, `Drop` sends SIGKILL to each group synchronously,
//!   because rmcp's kill-on-drop is a spawned task that may never run while a
//!   runtime shuts down.
//!
//! Each server speaks the revision its `protocol:` names: `auto` (the
//! default) probes `server/discover` and falls back to the `initialize`
//! handshake of 2025-11-25 at once when the server does not know it
//! (`connect`). Changes are pushed through `resources/subscribe` and
//! notification callbacks on 2025-11-25, through `subscriptions/listen` on
//! 2026-07-28 (`listen`); both end in the same hub events. rmcp's own
//! response cache is off on every connection: the content cache (`cache.rs`)
//! honours `ttlMs` and `cacheScope` per user.
//!
//! Layer: sources. Imports the settings (`config`), the transports (`pipe`, `http`, `large`) and the bottom
//! (`report`, `error`, `cause`, `id`, `resource`).

mod ahead;
mod connect;
mod convert;
mod list;
mod listen;
mod remote;
mod server;
mod sse;
mod stderr;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use futures::future::join_all;
use rmcp::RoleClient;
use rmcp::model::{ClientRequest, ReadResourceRequest, ReadResourceRequestParams, ReadResourceResult, ServerResult};
use rmcp::service::{Peer, PeerRequestOptions, ServiceError};
use tokio::sync::{Semaphore, broadcast};

use crate::config::{Config, ServerConfig};
use crate::error::{Error, Result};
use crate::id::ResourceId;
use crate::report::ServerFailure;
use crate::resource::{Contents, Resource, ResourceTemplate};

use connect::{connect_one, shutdown};
use convert::{convert_contents, map_service_error, scrub_error};
pub(crate) use list::Listing;
use list::{list_server, relist_loop};
use server::{Server, lock_backoff};

/// Something a server told us about its resources.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HubEvent {
    /// `notifications/resources/updated` for one URI.
    Updated {
        /// The server.
        server: String,
        /// The resource URI.
        uri: String,
    },
    /// `notifications/resources/list_changed`: the hub has re-listed the server.
    ListChanged {
        /// The server.
        server: String,
    },
    /// The server's connection was re-established (its process had ended):
    /// everything cached from it, subscriptions included, is void.
    Restarted {
        /// The server.
        server: String,
    },
}

/// Connection state of one server, for status displays.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct ServerStatus {
    /// The server name.
    pub name: String,
    /// Connected and usable.
    pub connected: bool,
    /// Protocol version negotiated.
    pub protocol: Option<String>,
    /// Resources listed.
    pub resources: usize,
    /// Templates listed.
    pub templates: usize,
    /// Whether the listing reached its end.
    pub listing_complete: bool,
    /// Problem with the connection or the listing.
    pub problem: Option<String>,
    /// The server supports `resources/subscribe`.
    pub subscribe: bool,
    /// The server announces `notifications/resources/list_changed`.
    pub list_changed: bool,
    /// Time from spawning (or dialing) to the end of the handshake, in ms.
    pub connect_ms: f64,
    /// Time to list every page of resources and templates, in ms.
    pub list_ms: f64,
    /// How many times the connection was re-established.
    pub restarts: u32,
}

impl ServerStatus {
    /// Whether the server counts as failed (the CLI's "all N servers
    /// failed"): it is not connected, or it is but its listing failed with
    /// no resource listed (a database server pointed at a closed port; its
    /// templates alone give no context). A partial listing, or a server that
    /// simply has no resources, is no failure.
    pub fn failed(&self) -> bool {
        !self.connected || (self.problem.is_some() && self.resources == 0)
    }
}

/// A server's connection at one moment (see [`Hub::connection`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Connection {
    /// Bumped on every (re)connection.
    pub(crate) epoch: u64,
    /// The connection is up (its transport is open).
    pub(crate) up: bool,
    /// The server supports `resources/subscribe`.
    pub(crate) subscribe: bool,
}

struct Shared {
    servers: Vec<Server>,
    max_resource_bytes: usize,
    events: broadcast::Sender<HubEvent>,
    reads: Semaphore,
    relist_task: StdMutex<Option<tokio::task::JoinHandle<()>>>,
    relist_tx: tokio::sync::mpsc::UnboundedSender<Arc<str>>,
    closed: AtomicBool,
    /// Bumped whenever any server's listing is replaced.
    generation: AtomicU64,
    ahead: ahead::ReadAhead,
    /// Lost connections re-established so far, all servers together: the
    /// clock of [`State::restarted_at`](server::State).
    restarts: AtomicU64,
}

/// Connections to every configured server. Cheap to clone; all clones share
/// the connections. Call [`Hub::close`] before the runtime stops.
#[derive(Clone)]
pub struct Hub {
    shared: Arc<Shared>,
}

/// Reads in flight across all servers at once.
pub(crate) const GLOBAL_READS: usize = 256;

impl Hub {
    /// Connects to every server of `config` concurrently, each bounded by its
    /// own timeout, and lists their resources and templates. Never fails:
    /// servers that cannot be used are in [`Hub::failures`].
    pub async fn connect(config: &Config) -> Hub {
        Self::connect_with(config, None).await
    }

    /// Like [`Hub::connect`], and while each server lists, the resources of
    /// every page that `decide` allows are read at once, alongside the next
    /// page, instead of after the last one: at network latency, a cold
    /// gather overlaps its listing with its reads. `decide` sees each
    /// resource before any read of it (give it the policy's decision for
    /// the user the reads are for). The results wait for [`Hub::read`] to
    /// ask for them, once each; [`Hub::stop_reading_ahead`] drops the rest.
    /// Only the first listing reads ahead.
    pub async fn connect_reading_ahead(
        config: &Config,
        decide: impl Fn(&Resource) -> bool + Send + Sync + 'static,
    ) -> Hub {
        Self::connect_with(config, Some(Arc::new(decide))).await
    }

    /// Ends reading ahead (see [`Hub::connect_reading_ahead`]): reads nobody
    /// took are cancelled and their results dropped. Idempotent; a no-op on
    /// a hub that does not read ahead.
    pub fn stop_reading_ahead(&self) {
        self.shared.ahead.stop();
    }

    /// Reads started ahead that no [`Hub::read`] took yet.
    pub fn reads_ahead(&self) -> usize {
        self.shared.ahead.pending()
    }

    async fn connect_with(config: &Config, decide: Option<ahead::Decide>) -> Hub {
        let (events, _) = broadcast::channel(1024);
        let (relist_tx, relist_rx) = tokio::sync::mpsc::unbounded_channel();
        let servers: Vec<Server> = config.servers.iter().map(Server::new).collect();
        let shared = Arc::new(Shared {
            servers,
            max_resource_bytes: config.context.max_resource_bytes,
            events: events.clone(),
            reads: Semaphore::new(GLOBAL_READS),
            relist_task: StdMutex::new(None),
            relist_tx,
            closed: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            ahead: ahead::ReadAhead::new(decide),
            restarts: AtomicU64::new(0),
        });
        join_all(shared.servers.iter().map(|s| async {
            if !connect_one(&shared, s, false).await {
                lock_backoff(s).await.failed();
            }
        }))
        .await;
        let task = tokio::spawn(relist_loop(Arc::downgrade(&shared), relist_rx));
        if let Ok(mut t) = shared.relist_task.lock() {
            *t = Some(task);
        }
        Hub { shared }
    }

    /// Names of the configured servers, in config order.
    pub fn server_names(&self) -> Vec<String> {
        self.shared.servers.iter().map(|s| s.cfg.name.clone()).collect()
    }

    /// Position of a server in the config (ties in priority are broken by it).
    pub fn server_index(&self, name: &str) -> Option<usize> {
        self.shared.servers.iter().position(|s| s.cfg.name == name)
    }

    /// Status of every server.
    pub fn status(&self) -> Vec<ServerStatus> {
        self.shared
            .servers
            .iter()
            .map(|s| {
                let state = s.state();
                let (live, listing) = (state.live.as_ref(), &state.listing);
                ServerStatus {
                    name: s.cfg.name.clone(),
                    connected: live.is_some(),
                    protocol: live.map(|l| l.protocol.clone()),
                    resources: listing.resources.len(),
                    templates: listing.templates.len(),
                    listing_complete: listing.complete,
                    problem: state.error.clone().or_else(|| listing.problem.clone()),
                    subscribe: live.is_some_and(|l| l.subscribe),
                    list_changed: live.is_some_and(|l| l.list_changed),
                    connect_ms: state.connect_ms,
                    list_ms: state.list_ms,
                    restarts: state.restarts,
                }
            })
            .collect()
    }

    /// The revision each connected server speaks, in config order.
    pub fn protocols(&self) -> Vec<crate::report::ServerProtocol> {
        self.shared
            .servers
            .iter()
            .filter_map(|s| {
                let state = s.state();
                let live = state.live.as_ref()?;
                Some(crate::report::ServerProtocol { server: s.cfg.name.clone(), protocol: live.protocol.clone() })
            })
            .collect()
    }

    /// Servers that failed to connect, and servers whose listing is incomplete.
    pub fn failures(&self) -> Vec<ServerFailure> {
        self.status()
            .into_iter()
            .filter_map(|s| s.problem.map(|error| ServerFailure { server: s.name, error }))
            .collect()
    }

    /// Every listed resource, sorted by server name then URI.
    pub fn resources(&self) -> Vec<Resource> {
        self.resources_shared().into_iter().map(Arc::unwrap_or_clone).collect()
    }

    /// Every listed resource, shared (no copy), sorted like [`Hub::resources`].
    pub(crate) fn resources_shared(&self) -> Vec<Arc<Resource>> {
        let mut out = Vec::new();
        for s in &self.shared.servers {
            out.extend(s.state().listing.resources.iter().cloned());
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// A mark of the restarts so far, for [`Hub::restarted_since`].
    pub(crate) fn restart_mark(&self) -> u64 {
        self.shared.restarts.load(Ordering::SeqCst)
    }

    /// The servers whose lost connection was re-established after `mark`
    /// was taken ([`Hub::restart_mark`]), in config order.
    pub(crate) fn restarted_since(&self, mark: u64) -> Vec<String> {
        if self.restart_mark() == mark {
            return Vec::new();
        }
        self.shared.servers.iter().filter(|s| s.state().restarted_at > mark).map(|s| s.cfg.name.clone()).collect()
    }

    /// Changes whenever any listing is replaced (connect, re-list, restart),
    /// so what was derived from the listings can be kept until then. Read
    /// it *before* the listings it stands for.
    pub(crate) fn listing_generation(&self) -> u64 {
        self.shared.generation.load(Ordering::SeqCst)
    }

    /// One server's resources in the order the server listed them.
    pub fn listed(&self, server: &str) -> Vec<Resource> {
        self.server(server)
            .map(|s| s.state().listing.resources.iter().map(|r| Resource::clone(r)).collect())
            .unwrap_or_default()
    }

    /// The listing entry of one resource.
    pub fn resource(&self, id: &ResourceId) -> Option<Resource> {
        let s = self.server(&id.server).ok()?;
        s.state().listing.resources.iter().find(|r| r.id.uri == id.uri).map(|r| Resource::clone(r))
    }

    /// One server's current listing (resources and templates), shared; `None`
    /// for a server that is not configured.
    pub(crate) fn listing_of(&self, server: &str) -> Option<Arc<Listing>> {
        self.server(server).ok().map(Server::listing)
    }

    /// Every listed template, by server then template.
    pub fn templates(&self) -> Vec<ResourceTemplate> {
        let mut out = Vec::new();
        for s in &self.shared.servers {
            out.extend(s.state().listing.templates.iter().cloned());
        }
        out
    }

    /// Notifications from servers (resource updated, list re-read).
    pub fn events(&self) -> broadcast::Receiver<HubEvent> {
        self.shared.events.subscribe()
    }

    /// Whether the server's connection is up (its process has not ended).
    pub fn is_connected(&self, server: &str) -> bool {
        self.connection(server).up
    }

    /// The server's current connection, read at one moment: what the cache
    /// needs to trust entries kept alive by a subscription (only while the
    /// connection they were made on is up) and to decide to subscribe.
    pub(crate) fn connection(&self, server: &str) -> Connection {
        let Ok(s) = self.server(server) else { return Connection::default() };
        let state = s.state();
        Connection {
            epoch: state.epoch,
            up: state.usable().is_some(),
            subscribe: state.live.as_ref().is_some_and(|l| l.subscribe),
        }
    }

    /// The config of one server.
    pub fn server_config(&self, server: &str) -> Option<&ServerConfig> {
        self.server(server).ok().map(|s| &s.cfg)
    }

    fn server(&self, name: &str) -> Result<&Server> {
        self.shared
            .servers
            .iter()
            .find(|s| s.cfg.name == name)
            .ok_or_else(|| Error::UnknownServer { server: name.to_owned(), known: self.server_names().join(", ") })
    }

    /// Reads one resource (`resources/read`), bounded by the server's timeout
    /// and its limit of reads in flight. Text beyond `max_resource_bytes` is
    /// cut here, before anything tokenises it.
    ///
    /// This is the operator's raw read (the `read` command): no policy, no
    /// gate. Anything that reads for a user goes through [`admit`](crate::access::admit)
    /// and the policy first, as [`crate::McpContext`] does.
    ///
    /// On a hub that reads ahead, a read already started for `id` is taken
    /// (and awaited) instead of a new one.
    pub async fn read(&self, id: &ResourceId) -> Result<Contents> {
        if let Some(started) = self.shared.ahead.take(id)
            && let Ok(result) = started.await
        {
            return result;
        }
        self.read_now(id).await
    }

    /// The offer of one listed page to the read-ahead.
    fn read_ahead(&self, page: &[Arc<Resource>]) {
        self.shared.ahead.page(page, |id| {
            let hub = self.clone();
            async move { hub.read_now(&id).await }
        });
    }

    async fn read_now(&self, id: &ResourceId) -> Result<Contents> {
        let server = self.server(&id.server)?;
        let live = self.live(server).await?;
        let _global = self.shared.reads.acquire().await.map_err(|_| closed(server, id))?;
        let _local = server.reads.acquire().await.map_err(|_| closed(server, id))?;
        // Boxed once a permit is held: rmcp's request future is ~4 KB, and
        // unboxed it would sit in every waiting read future.
        let call = Box::pin(read_call(&live.peer, id.uri.clone(), server.cfg.timeout));
        let what = || format!("resources/read {}", id.uri);
        let result = match call.await {
            Err(e) => return Err(scrub_error(&server.cfg, map_service_error(e, &id.server, &what(), Some(id)))),
            Ok(r) => r,
        };
        let mut contents = convert_contents(result.contents, self.shared.max_resource_bytes);
        contents.ttl_ms = result.ttl_ms;
        contents.private = matches!(result.cache_scope, Some(rmcp::model::CacheScope::Private));
        Ok(contents)
    }

    /// Reads many resources concurrently (bounded per server and overall);
    /// results are in the order of `ids`.
    pub async fn read_many(&self, ids: &[ResourceId]) -> Vec<Result<Contents>> {
        join_all(ids.iter().map(|id| self.read(id))).await
    }

    /// Subscribes to updates of one resource, where the server supports it
    /// (`resources/subscribe` on 2025-11-25, `subscriptions/listen` on
    /// 2026-07-28). Returns whether a subscription is now in place. The cache subscribes
    /// for what it keeps; updates arrive as [`HubEvent::Updated`].
    pub(crate) async fn subscribe(&self, id: &ResourceId) -> Result<bool> {
        let server = self.server(&id.server)?;
        let live = self.live(server).await?;
        if !live.subscribe {
            return Ok(false);
        }
        if let Some(listener) = &live.listener {
            let what = format!("subscriptions/listen {}", id.uri);
            return listener.add(&id.uri).await.map_err(|e| map_service_error(e, &id.server, &what, None));
        }
        let what = format!("resources/subscribe {}", id.uri);
        #[allow(deprecated)]
        let call = live.peer.subscribe(rmcp::model::SubscribeRequestParams::new(id.uri.clone()));
        match tokio::time::timeout(server.cfg.timeout, call).await {
            Err(_) => {
                Err(Error::Timeout { server: id.server.clone(), what, after_ms: server.cfg.timeout.as_millis() as u64 })
            }
            Ok(Err(e)) => Err(map_service_error(e, &id.server, &what, Some(id))),
            Ok(Ok(())) => Ok(true),
        }
    }

    /// Ends every server: close stdin (or the HTTP session), wait, SIGTERM
    /// the process group, wait, SIGKILL it. Idempotent.
    pub async fn close(&self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.shared.ahead.stop();
        if let Ok(mut t) = self.shared.relist_task.lock()
            && let Some(t) = t.take()
        {
            t.abort();
        }
        join_all(self.shared.servers.iter().map(|s| async move {
            if let Some(live) = s.take_live(true) {
                shutdown(&live).await;
            }
        }))
        .await;
    }

    /// Re-lists one server now (also done automatically on `list_changed`).
    pub async fn relist(&self, server: &str) -> Result<()> {
        let s = self.server(server)?;
        let live = self.live(s).await?;
        let listing = list_server(&s.cfg, &live, None).await;
        list::schedule_relist(&self.shared, server, &live, &listing);
        // Not stored if the connection was replaced meanwhile: its own
        // connect listed it already.
        if s.listed(&live, listing, None) {
            self.shared.generation.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }
}

fn closed(server: &Server, id: &ResourceId) -> Error {
    Error::TransportClosed { server: server.cfg.name.clone(), what: format!("resources/read {}", id.uri) }
}

/// `resources/read` through rmcp's request API, timing out (with
/// `notifications/cancelled`) after `timeout`. Not `Peer::read_resource`:
/// that also consults rmcp's response cache (off here: ours decides) and
/// clones every answer for it, a measured few µs per read.
async fn read_call(
    peer: &Peer<RoleClient>,
    uri: String,
    timeout: Duration,
) -> std::result::Result<ReadResourceResult, ServiceError> {
    let mut options = PeerRequestOptions::no_options();
    options.timeout = Some(timeout);
    // The caller's trace goes with the request (`_meta`, SEP-414), so that
    // a server's own spans join it.
    if let Some(trace) = crate::telemetry::current() {
        let mut meta = rmcp::model::MetaObject::new();
        meta.set_traceparent(trace.traceparent);
        if let Some(state) = trace.tracestate {
            meta.set_tracestate(state);
        }
        options.meta = Some(rmcp::model::RequestMetaObject(meta));
    }
    let request = ClientRequest::ReadResourceRequest(ReadResourceRequest::new(ReadResourceRequestParams::new(uri)));
    let handle = peer.send_cancellable_request(request, options).await?;
    let mut guard = CancelOnDrop(Some((peer.clone(), handle.id.clone())));
    let result = handle.await_response().await;
    guard.0 = None;
    match result? {
        ServerResult::ReadResourceResult(r) => Ok(r),
        _ => Err(ServiceError::UnexpectedResponse),
    }
}

/// Tells the server a read was abandoned (the caller's deadline passed, or
/// it was dropped), as rmcp's own helpers do.
struct CancelOnDrop(Option<(Peer<RoleClient>, rmcp::model::RequestId)>);
impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some((peer, id)) = self.0.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(async move {
                let reason = Some("request abandoned by the caller".to_owned());
                let _ = peer.notify_cancelled(rmcp::model::CancelledNotificationParam::new(Some(id), reason)).await;
            });
        }
    }
}
