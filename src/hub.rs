//! Connections to MCP servers: spawn or dial, handshake, list, read, close.
//!
//! Each server lives in its own [`Server`] slot. A server that fails to start
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
//! The protocol is pinned to the newest revision that still has the
//! `initialize` handshake (2025-11-25): it is what deployed servers speak, and
//! the only one with `resources/subscribe` and notification callbacks.

use std::collections::HashSet;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, RwLock};
use std::time::{Duration, SystemTime};

use futures::future::join_all;
use process_wrap::tokio::{CommandWrap, KillOnDrop, ProcessGroup};
use rmcp::model::{
    ClientCapabilities, ClientConfig, ClientRequest, ErrorCode, Implementation, PaginatedRequestParams,
    ProtocolVersion, ReadResourceRequest, ReadResourceRequestParams, ReadResourceResult, ResourceContents,
    ResourceUpdatedNotificationParam, ServerResult,
};
use rmcp::service::{NotificationContext, Peer, PeerRequestOptions, RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use tokio::sync::{Semaphore, broadcast};

use crate::config::{Config, ENV_ALLOWLIST, ServerConfig, Transport, redact_url};
use crate::error::{Error, Result};
use crate::id::ResourceId;
use crate::pipe::{ChildPipe, Diagnostics};
use crate::resource::{Annotations, Audience, ContentPart, Contents, Resource, ResourceTemplate};

/// Most pages we follow in one listing before calling it incomplete.
pub const MAX_LIST_PAGES: usize = 1000;
/// How long a server may take to exit after its stdin closes, on `close()`.
const EXIT_GRACE: Duration = Duration::from_millis(1500);
/// How long after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_millis(1000);
/// Longest stderr line forwarded to tracing.
const MAX_STDERR_LINE: usize = 4096;
/// Last stderr lines of a server quoted when it fails to start.
const STDERR_TAIL_LINES: usize = 8;
/// Longest stderr line quoted when a server fails to start, in characters.
const STDERR_TAIL_WIDTH: usize = 200;

/// Something a server told us about its resources.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// A server that could not be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ServerFailure {
    /// The server name.
    pub server: String,
    /// What went wrong.
    pub error: String,
}

/// Connection state of one server, for status displays.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
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

#[derive(Clone)]
struct Host {
    server: Arc<str>,
    events: broadcast::Sender<HubEvent>,
    relist: tokio::sync::mpsc::UnboundedSender<Arc<str>>,
}

impl ClientHandler for Host {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(ClientCapabilities::default(), Implementation::new("mcp-context", env!("CARGO_PKG_VERSION")))
            .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _cx: NotificationContext<RoleClient>,
    ) {
        let _ = self.events.send(HubEvent::Updated { server: self.server.to_string(), uri: params.uri });
    }

    async fn on_resource_list_changed(&self, _cx: NotificationContext<RoleClient>) {
        let _ = self.relist.send(self.server.clone());
    }
}

/// A live connection.
struct Live {
    peer: Peer<RoleClient>,
    service: tokio::sync::Mutex<Option<RunningService<RoleClient, Host>>>,
    /// Process group of a stdio server (its leader's pid).
    pgid: Option<i32>,
    protocol: String,
    subscribe: bool,
    list_changed: bool,
    has_resources: bool,
}

impl Drop for Live {
    fn drop(&mut self) {
        if let Some(pgid) = self.pgid {
            // Synchronous and unconditional: the only kill that is certain to
            // happen when a hub is dropped during runtime shutdown.
            kill_group(pgid, libc::SIGKILL);
        }
    }
}

#[derive(Default)]
pub(crate) struct Listing {
    /// Shared so that selections hold pointers, not copies.
    pub(crate) resources: Vec<Arc<Resource>>,
    pub(crate) templates: Vec<ResourceTemplate>,
    complete: bool,
    problem: Option<String>,
}

struct Server {
    cfg: ServerConfig,
    live: RwLock<Option<Arc<Live>>>,
    error: RwLock<Option<String>>,
    listing: RwLock<Arc<Listing>>,
    reads: Semaphore,
    /// (connect, list) durations of the last connection, in ms.
    timings: RwLock<(f64, f64)>,
    /// Serialises reconnection attempts and holds their backoff.
    restart: tokio::sync::Mutex<Backoff>,
    restarts: AtomicU32,
    /// Bumped on every successful (re)connection.
    epoch: AtomicU64,
}

/// Reconnection backoff: 250 ms after the first failure, doubling, at most 30 s.
#[derive(Default)]
struct Backoff {
    failures: u32,
    next_try: Option<tokio::time::Instant>,
}

impl Backoff {
    fn failed(&mut self) {
        self.failures += 1;
        let delay = Duration::from_millis(250u64.saturating_mul(1 << self.failures.min(7).saturating_sub(1)));
        self.next_try = Some(tokio::time::Instant::now() + delay.min(Duration::from_secs(30)));
    }
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
}

/// Connections to every configured server. Cheap to clone; all clones share
/// the connections. Call [`Hub::close`] before the runtime stops.
#[derive(Clone)]
pub struct Hub {
    shared: Arc<Shared>,
}

/// Reads in flight across all servers at once.
const GLOBAL_READS: usize = 256;

impl Hub {
    /// Connects to every server of `config` concurrently, each bounded by its
    /// own timeout, and lists their resources and templates. Never fails:
    /// servers that cannot be used are in [`Hub::failures`].
    pub async fn connect(config: &Config) -> Hub {
        let (events, _) = broadcast::channel(1024);
        let (relist_tx, relist_rx) = tokio::sync::mpsc::unbounded_channel();
        let servers: Vec<Server> = config
            .servers
            .iter()
            .map(|cfg| Server {
                cfg: cfg.clone(),
                live: RwLock::new(None),
                error: RwLock::new(None),
                listing: RwLock::new(Arc::new(Listing::default())),
                reads: Semaphore::new(cfg.max_concurrent_reads),
                timings: RwLock::new((0.0, 0.0)),
                restart: tokio::sync::Mutex::new(Backoff::default()),
                restarts: AtomicU32::new(0),
                epoch: AtomicU64::new(0),
            })
            .collect();
        let shared = Arc::new(Shared {
            servers,
            max_resource_bytes: config.context.max_resource_bytes,
            events: events.clone(),
            reads: Semaphore::new(GLOBAL_READS),
            relist_task: StdMutex::new(None),
            relist_tx,
            closed: AtomicBool::new(false),
            generation: AtomicU64::new(0),
        });
        join_all(shared.servers.iter().map(|s| async {
            if !connect_one(&shared, s).await {
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
                let live = read(&s.live).clone();
                let listing = read(&s.listing).clone();
                ServerStatus {
                    name: s.cfg.name.clone(),
                    connected: live.is_some(),
                    protocol: live.as_ref().map(|l| l.protocol.clone()),
                    resources: listing.resources.len(),
                    templates: listing.templates.len(),
                    listing_complete: listing.complete,
                    problem: read(&s.error).clone().or_else(|| listing.problem.clone()),
                    subscribe: live.as_ref().is_some_and(|l| l.subscribe),
                    list_changed: live.as_ref().is_some_and(|l| l.list_changed),
                    connect_ms: read(&s.timings).0,
                    list_ms: read(&s.timings).1,
                    restarts: s.restarts.load(Ordering::SeqCst),
                }
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
            out.extend(read(&s.listing).resources.iter().cloned());
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
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
            .map(|s| read(&s.listing).resources.iter().map(|r| Resource::clone(r)).collect())
            .unwrap_or_default()
    }

    /// The listing entry of one resource.
    pub fn resource(&self, id: &ResourceId) -> Option<Resource> {
        let s = self.server(&id.server).ok()?;
        read(&s.listing).resources.iter().find(|r| r.id.uri == id.uri).map(|r| Resource::clone(r))
    }

    /// One server's current listing (resources and templates), shared; `None`
    /// for a server that is not configured.
    pub(crate) fn listing_of(&self, server: &str) -> Option<Arc<Listing>> {
        self.server(server).ok().map(|s| read(&s.listing).clone())
    }

    /// Every listed template, by server then template.
    pub fn templates(&self) -> Vec<ResourceTemplate> {
        let mut out = Vec::new();
        for s in &self.shared.servers {
            out.extend(read(&s.listing).templates.iter().cloned());
        }
        out
    }

    /// Notifications from servers (resource updated, list re-read).
    pub fn events(&self) -> broadcast::Receiver<HubEvent> {
        self.shared.events.subscribe()
    }

    /// Whether the server's connection is up (its process has not ended).
    /// Entries kept alive by a subscription are only trusted while it is.
    pub fn is_connected(&self, server: &str) -> bool {
        self.server(server).ok().and_then(|s| read(&s.live).clone()).is_some_and(|l| !l.peer.is_transport_closed())
    }

    /// Which connection of the server is current: bumped on every
    /// (re)connection, so state tied to a connection (subscriptions) can
    /// tell that it is gone.
    pub fn connection_epoch(&self, server: &str) -> u64 {
        self.server(server).map(|s| s.epoch.load(Ordering::SeqCst)).unwrap_or(0)
    }

    /// Whether the server supports `resources/subscribe`.
    pub fn supports_subscribe(&self, server: &str) -> bool {
        self.server(server).ok().and_then(|s| read(&s.live).clone()).is_some_and(|l| l.subscribe)
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

    /// The server's live connection; if its process ended (or it never
    /// came up), reconnects, at most once per backoff period.
    async fn live(&self, server: &Server) -> Result<Arc<Live>> {
        let usable = |s: &Server| read(&s.live).clone().filter(|l| !l.peer.is_transport_closed());
        if let Some(live) = usable(server) {
            return Ok(live);
        }
        let unavailable = |cause: String| Error::ServerUnavailable { server: server.cfg.name.clone(), cause };
        if self.shared.closed.load(Ordering::SeqCst) {
            return Err(unavailable("the hub is closed".into()));
        }
        let mut backoff = server.restart.lock().await;
        if let Some(live) = usable(server) {
            return Ok(live); // another request reconnected while we waited
        }
        let last_error = read(&server.error).clone().unwrap_or_else(|| "its process ended".into());
        if let Some(t) = backoff.next_try
            && tokio::time::Instant::now() < t
        {
            // The backoff is the hub's business; the caller needs the cause.
            let wait = t - tokio::time::Instant::now();
            tracing::debug!(server = %server.cfg.name, "next reconnect attempt in {} ms", wait.as_millis());
            return Err(unavailable(last_error));
        }
        let old = write(&server.live).take();
        let was_up = old.is_some();
        if let Some(old) = old {
            tracing::warn!(server = %server.cfg.name, "connection lost; restarting");
            Box::pin(shutdown(&old)).await;
        }
        // Boxed: a reconnect future is kilobytes, and it would otherwise be
        // part of every read future (1000 pending reads, 6 MB, measured).
        if Box::pin(connect_one(&self.shared, server)).await {
            *backoff = Backoff::default();
            if was_up {
                server.restarts.fetch_add(1, Ordering::SeqCst);
            }
            let _ = self.shared.events.send(HubEvent::Restarted { server: server.cfg.name.clone() });
            usable(server).ok_or_else(|| unavailable("connection closed right after restart".into()))
        } else {
            backoff.failed();
            Err(unavailable(read(&server.error).clone().unwrap_or(last_error)))
        }
    }

    /// Reads one resource (`resources/read`), bounded by the server's timeout
    /// and its limit of reads in flight. Text beyond `max_resource_bytes` is
    /// cut here, before anything tokenises it.
    ///
    /// This is the operator's raw read (the `read` command): no policy, no
    /// gate. Anything that reads for a user goes through [`crate::admit`]
    /// and the policy first, as [`crate::McpContext`] does.
    pub async fn read(&self, id: &ResourceId) -> Result<Contents> {
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

    /// Subscribes to updates of one resource, where the server supports it.
    /// Returns whether a subscription is now in place.
    pub async fn subscribe(&self, id: &ResourceId) -> Result<bool> {
        let server = self.server(&id.server)?;
        let live = self.live(server).await?;
        if !live.subscribe {
            return Ok(false);
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
        if let Ok(mut t) = self.shared.relist_task.lock()
            && let Some(t) = t.take()
        {
            t.abort();
        }
        join_all(self.shared.servers.iter().map(|s| async move {
            let live = write(&s.live).take();
            if let Some(live) = live {
                shutdown(&live).await;
            }
            write(&s.error).get_or_insert_with(|| "closed".into());
        }))
        .await;
    }

    /// Re-lists one server now (also done automatically on `list_changed`).
    pub async fn relist(&self, server: &str) -> Result<()> {
        let s = self.server(server)?;
        let live = self.live(s).await?;
        let listing = list_server(&s.cfg, &live).await;
        *write(&s.listing) = Arc::new(listing);
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Connects (or reconnects) one server and lists it. Records the outcome.
async fn connect_one(shared: &Shared, s: &Server) -> bool {
    let host =
        Host { server: s.cfg.name.as_str().into(), events: shared.events.clone(), relist: shared.relist_tx.clone() };
    let started = std::time::Instant::now();
    match connect_server(&s.cfg, host, shared.max_resource_bytes).await.map_err(|e| s.cfg.scrub(&e)) {
        Ok(live) => {
            let connected = started.elapsed();
            let live = Arc::new(live);
            *write(&s.live) = Some(live.clone());
            *write(&s.error) = None;
            s.epoch.fetch_add(1, Ordering::SeqCst);
            let listing = list_server(&s.cfg, &live).await;
            *write(&s.listing) = Arc::new(listing);
            shared.generation.fetch_add(1, Ordering::SeqCst);
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            *write(&s.timings) = (ms(connected), ms(started.elapsed() - connected));
            true
        }
        Err(e) => {
            // Debug, not warn: the failure is returned (failures(), the
            // report), and whoever shows it says it once.
            tracing::debug!(server = %s.cfg.name, error = %e, "server unavailable");
            *write(&s.error) = Some(e);
            false
        }
    }
}

async fn lock_backoff(s: &Server) -> tokio::sync::MutexGuard<'_, Backoff> {
    s.restart.lock().await
}

async fn relist_loop(shared: std::sync::Weak<Shared>, mut rx: tokio::sync::mpsc::UnboundedReceiver<Arc<str>>) {
    while let Some(first) = rx.recv().await {
        // Coalesce a burst: wait a moment, then re-list each server named once.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut names: Vec<Arc<str>> = vec![first];
        while let Ok(n) = rx.try_recv() {
            if !names.contains(&n) {
                names.push(n);
            }
        }
        let Some(shared) = shared.upgrade() else { return };
        for name in names {
            let hub = Hub { shared: shared.clone() };
            if hub.relist(&name).await.is_ok() {
                let _ = shared.events.send(HubEvent::ListChanged { server: name.to_string() });
            }
        }
    }
}

fn closed(server: &Server, id: &ResourceId) -> Error {
    Error::TransportClosed { server: server.cfg.name.clone(), what: format!("resources/read {}", id.uri) }
}

async fn shutdown(live: &Live) {
    let service = live.service.lock().await.take();
    if let Some(mut service) = service {
        // close() closes stdin and waits for the loop to end; rmcp's own
        // graceful shutdown would wait 3 s + 3 s, so bound it and finish the
        // job on the process group ourselves.
        let _ = tokio::time::timeout(EXIT_GRACE, service.close()).await;
    }
    if let Some(pgid) = live.pgid {
        if group_alive(pgid) {
            kill_group(pgid, libc::SIGTERM);
            let deadline = tokio::time::Instant::now() + TERM_GRACE;
            while group_alive(pgid) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        kill_group(pgid, libc::SIGKILL);
    }
}

fn kill_group(pgid: i32, signal: i32) {
    if pgid > 1 {
        // SAFETY: kill(2) has no memory-safety preconditions; a negative pid
        // addresses the process group we created for this server.
        unsafe {
            libc::kill(-pgid, signal);
        }
    }
}

fn group_alive(pgid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    pgid > 1 && unsafe { libc::kill(-pgid, 0) } == 0
}

async fn connect_server(cfg: &ServerConfig, host: Host, max_text: usize) -> std::result::Result<Live, String> {
    let timeout = cfg.timeout;
    match &cfg.transport {
        Transport::Stdio { command, command_display, args, env, inherit_env, cwd } => {
            let mut cmd = tokio::process::Command::new(command);
            cmd.args(args).env_clear();
            for (k, v) in std::env::vars_os() {
                let Some(k) = k.to_str() else { continue };
                if ENV_ALLOWLIST.contains(&k) || inherit_env.iter().any(|n| n == k) {
                    cmd.env(k, v);
                }
            }
            cmd.envs(env);
            if let Some(cwd) = cwd {
                cmd.current_dir(cwd);
            }
            let mut wrapped = CommandWrap::from(cmd);
            wrapped.wrap(ProcessGroup::leader()).wrap(KillOnDrop);
            wrapped.command_mut().stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
            let mut child = wrapped.spawn().map_err(|e| format!("cannot start `{command_display}`: {e}"))?;
            let pgid = child.id().map(|p| p as i32);
            let guard = GroupGuard(pgid);
            let tail = Arc::new(StdMutex::new(std::collections::VecDeque::new()));
            let drain = child.stderr().take().map(|e| tokio::spawn(drain_stderr(cfg.name.clone(), e, tail.clone())));
            let diag = Diagnostics::new(&cfg.name);
            let transport = ChildPipe::new(child, diag.clone(), max_text)
                .map_err(|e| format!("cannot start `{command_display}`: {e}"))?;
            let failure = match tokio::time::timeout(timeout, host.serve(transport)).await {
                Err(_) => format!("no answer to initialize within {} ms", timeout.as_millis()),
                Ok(Err(e)) => match diag.exit_status() {
                    Some(status) => format!("{} before answering initialize", describe_exit(status)),
                    None if matches!(e, rmcp::service::ClientInitializeError::ConnectionClosed(_)) => {
                        "closed its stdout before answering initialize".to_owned()
                    }
                    None => format!("initialize failed: {e}"),
                },
                Ok(Ok(s)) => {
                    diag.connected();
                    std::mem::forget(guard);
                    return Ok(live_from(s, pgid).await);
                }
            };
            // The process is gone or about to be killed: let its stderr
            // reach EOF (a grandchild may hold it open, so bounded).
            drop(guard);
            if let Some(drain) = drain {
                let _ = tokio::time::timeout(Duration::from_millis(300), drain).await;
            }
            Err(explain_start_failure(failure, diag.first_junk(), &tail))
        }
        Transport::Http { url, headers } => {
            use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
            let mut map = std::collections::HashMap::new();
            for (k, v) in headers {
                let name =
                    http::HeaderName::from_bytes(k.as_bytes()).map_err(|_| format!("invalid header name `{k}`"))?;
                let value = http::HeaderValue::from_str(v).map_err(|_| format!("invalid value for header `{k}`"))?;
                map.insert(name, value);
            }
            let transport = StreamableHttpClientTransport::with_client(
                crate::http::ReadStreamingClient::new(max_text),
                StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(map),
            );
            let service = match tokio::time::timeout(timeout, host.serve(transport)).await {
                Err(_) => {
                    return Err(format!(
                        "no answer to initialize from {} within {} ms",
                        redact_url(url),
                        timeout.as_millis()
                    ));
                }
                Ok(Err(e)) => return Err(format!("cannot initialize {}: {}", redact_url(url), init_cause(&e))),
                Ok(Ok(s)) => s,
            };
            Ok(live_from(service, None).await)
        }
    }
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

/// Kills a process group if connecting fails half-way.
struct GroupGuard(Option<i32>);
impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0 {
            kill_group(p, libc::SIGKILL);
        }
    }
}

async fn live_from(service: RunningService<RoleClient, Host>, pgid: Option<i32>) -> Live {
    let peer = service.peer().clone();
    // Our own cache decides freshness; rmcp's would hide read errors behind
    // stale answers.
    peer.set_response_cache_config(rmcp::service::ClientCacheConfig::disabled()).await;
    let info = peer.peer_info();
    let caps = info.as_ref().and_then(|i| i.capabilities.resources.clone());
    Live {
        protocol: info.as_ref().map(|i| i.protocol_version.to_string()).unwrap_or_default(),
        subscribe: caps.as_ref().and_then(|c| c.subscribe).unwrap_or(false),
        list_changed: caps.as_ref().and_then(|c| c.list_changed).unwrap_or(false),
        has_resources: caps.is_some(),
        peer,
        service: tokio::sync::Mutex::new(Some(service)),
        pgid,
    }
}

/// The last lines a server wrote on stderr, each cut to a readable width.
type StderrTail = Arc<StdMutex<std::collections::VecDeque<String>>>;

/// Forwards a server's stderr to tracing (debug) and keeps its last
/// [`STDERR_TAIL_LINES`] lines, which explain a failed start (a Python
/// traceback, "address in use", a missing module).
async fn drain_stderr(server: String, stderr: tokio::process::ChildStderr, tail: StderrTail) {
    use tokio::io::AsyncBufReadExt;
    let mut reader = tokio::io::BufReader::new(stderr);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let line = String::from_utf8_lossy(&buf[..buf.len().min(MAX_STDERR_LINE)]);
                let line = line.trim_end();
                tracing::debug!(target: "mcp_stderr", server = %server, "{line}");
                if line.trim().is_empty() {
                    continue;
                }
                let mut kept: String =
                    line.chars().filter(|c| !c.is_control() || *c == '\t').take(STDERR_TAIL_WIDTH).collect();
                if line.chars().count() > STDERR_TAIL_WIDTH {
                    kept.push('…');
                }
                let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
                if tail.len() == STDERR_TAIL_LINES {
                    tail.pop_front();
                }
                tail.push_back(kept);
            }
        }
    }
}

/// "exited with status 1", "was killed by signal 9 (SIGKILL)".
fn describe_exit(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => {
            let name = match sig {
                libc::SIGKILL => " (SIGKILL)",
                libc::SIGTERM => " (SIGTERM)",
                libc::SIGSEGV => " (SIGSEGV)",
                libc::SIGABRT => " (SIGABRT)",
                libc::SIGINT => " (SIGINT)",
                _ => "",
            };
            format!("was killed by signal {sig}{name}")
        }
        _ => "exited".to_owned(),
    }
}

/// A failed start in words: what happened, the first non-JSON line it
/// wrote on stdout, and the last lines of its stderr (the caller scrubs
/// secrets from the whole).
fn explain_start_failure(what: String, junk: Option<String>, tail: &StderrTail) -> String {
    let mut out = what;
    if let Some(junk) = junk {
        out.push_str(&format!("; it wrote non-JSON on stdout: {junk}"));
    }
    let tail = tail.lock().unwrap_or_else(|e| e.into_inner());
    if !tail.is_empty() {
        out.push_str("; its stderr ends with:");
        for line in tail.iter() {
            out.push_str("\n    | ");
            out.push_str(line);
        }
    }
    out
}

async fn list_server(cfg: &ServerConfig, live: &Live) -> Listing {
    let mut listing = Listing { complete: true, ..Listing::default() };
    if !live.has_resources {
        listing.problem = None;
        return listing;
    }
    let name = cfg.name.as_str();
    let now = SystemTime::now();
    let mut seen_uris = HashSet::new();
    let r = paginate(cfg, "resources/list", |params| {
        let peer = live.peer.clone();
        async move { peer.list_resources(params).await.map(|p| (p.resources, p.next_cursor)) }
    })
    .await;
    for r in r.items {
        if seen_uris.insert(r.uri.clone()) {
            listing.resources.push(Arc::new(convert_resource(name, r, now)));
        }
    }
    if let Some(p) = r.problem {
        listing.complete = false;
        listing.problem = Some(p);
    }
    let t = paginate(cfg, "resources/templates/list", |params| {
        let peer = live.peer.clone();
        async move { peer.list_resource_templates(params).await.map(|p| (p.resource_templates, p.next_cursor)) }
    })
    .await;
    listing.templates = t
        .items
        .into_iter()
        .map(|t| ResourceTemplate {
            server: name.to_owned(),
            uri_template: t.uri_template,
            name: t.name,
            title: t.title,
            description: t.description,
            mime_type: t.mime_type,
        })
        .collect();
    if let Some(p) = t.problem
        && !p.contains("-32601")
    {
        // A server without templates may answer "method not found": not a problem.
        listing.problem.get_or_insert(p);
    }
    listing
}

struct Pages<T> {
    items: Vec<T>,
    problem: Option<String>,
}

/// Follows `nextCursor` until it is absent. An empty string is a cursor, not
/// the end (spec, pagination). A repeated cursor or more than
/// [`MAX_LIST_PAGES`] pages stops the walk and marks the listing incomplete.
async fn paginate<T, F, Fut>(cfg: &ServerConfig, what: &str, mut fetch: F) -> Pages<T>
where
    F: FnMut(Option<PaginatedRequestParams>) -> Fut,
    Fut: std::future::Future<Output = std::result::Result<(Vec<T>, Option<String>), ServiceError>>,
{
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    let mut seen = HashSet::new();
    for page in 1..=MAX_LIST_PAGES {
        let params = cursor.clone().map(|c| PaginatedRequestParams::default().with_cursor(Some(c)));
        let result = tokio::time::timeout(cfg.timeout, fetch(params)).await;
        let (batch, next) = match result {
            Err(_) => {
                return Pages {
                    items,
                    problem: Some(format!(
                        "{what} incomplete: page {page} timed out after {} ms",
                        cfg.timeout.as_millis()
                    )),
                };
            }
            Ok(Err(e)) => {
                let e = cfg.scrub(&map_service_error(e, &cfg.name, what, None).to_string());
                return Pages { items, problem: Some(format!("{what} incomplete: page {page} failed: {e}")) };
            }
            Ok(Ok(x)) => x,
        };
        items.extend(batch);
        match next {
            None => return Pages { items, problem: None },
            Some(c) => {
                if !seen.insert(c.clone()) {
                    return Pages {
                        items,
                        problem: Some(format!(
                            "{what} incomplete: the server repeated cursor {:?} on page {page}",
                            c.chars().take(64).collect::<String>()
                        )),
                    };
                }
                cursor = Some(c);
            }
        }
    }
    Pages { items, problem: Some(format!("{what} incomplete: stopped after {MAX_LIST_PAGES} pages")) }
}

fn convert_resource(server: &str, r: rmcp::model::Resource, now: SystemTime) -> Resource {
    let annotations = r
        .annotations
        .map(|a| Annotations {
            audience: a.audience.map(|v| {
                v.into_iter()
                    .map(|role| match role {
                        rmcp::model::Role::User => Audience::User,
                        _ => Audience::Assistant,
                    })
                    .collect()
            }),
            priority: a.priority.filter(|p| p.is_finite()),
            last_modified: a.last_modified,
        })
        .unwrap_or_default();
    Resource {
        id: ResourceId::from_listing(server, &r.uri),
        name: r.name,
        title: r.title,
        description: r.description,
        mime_type: r.mime_type,
        size: r.size,
        annotations,
        discovered_at: now,
    }
}

/// Converts wire contents, never keeping blob bytes, and cuts text beyond
/// `max_bytes` (at a char boundary) before anything tokenises it.
fn convert_contents(contents: Vec<ResourceContents>, max_bytes: usize) -> Contents {
    // Exactly as many parts as the answer has: a cached resource keeps this
    // vector for its whole life, and growth would leave 4 slots for one part.
    let mut out = Contents { parts: Vec::with_capacity(contents.len()), ..Contents::default() };
    let mut left = max_bytes;
    for c in contents {
        match c {
            ResourceContents::TextResourceContents { mut text, mime_type, meta, .. } => {
                // Cut already while it arrived (an answer too large to hold).
                out.truncated_bytes += crate::large::marks(meta.as_ref()).0;
                if text.len() > left {
                    let mut cut = left;
                    while !text.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    out.truncated_bytes += text.len() - cut;
                    text.truncate(cut);
                    left = 0;
                } else {
                    left -= text.len();
                }
                out.parts.push(ContentPart::Text { text, mime_type });
            }
            ResourceContents::BlobResourceContents { blob, mime_type, meta, .. } => {
                let base64_len = crate::large::marks(meta.as_ref()).1.unwrap_or(blob.len());
                out.parts.push(ContentPart::Blob { mime_type, base64_len });
            }
            _ => {}
        }
    }
    out
}

fn scrub_error(cfg: &ServerConfig, e: Error) -> Error {
    match e {
        Error::Server { server, what, code, message } => {
            Error::Server { server, what, code, message: cfg.scrub(&message) }
        }
        Error::Protocol { server, what, message } => Error::Protocol { server, what, message: cfg.scrub(&message) },
        other => other,
    }
}

fn map_service_error(e: ServiceError, server: &str, what: &str, id: Option<&ResourceId>) -> Error {
    match e {
        // Our transport's own verdict on an over-long answer, not the server's.
        ServiceError::McpError(d) if d.code.0 == crate::large::TOO_LARGE => {
            Error::Protocol { server: server.to_owned(), what: what.to_owned(), message: d.message.to_string() }
        }
        ServiceError::McpError(d)
            if id.is_some() && (d.code == ErrorCode::RESOURCE_NOT_FOUND || d.code == ErrorCode::INVALID_PARAMS) =>
        {
            Error::NotFound { id: id.map(ToString::to_string).unwrap_or_default() }
        }
        ServiceError::McpError(d) => Error::Server {
            server: server.to_owned(),
            what: what.to_owned(),
            code: d.code.0,
            message: d.message.chars().take(500).collect(),
        },
        ServiceError::TransportClosed => Error::TransportClosed { server: server.to_owned(), what: what.to_owned() },
        ServiceError::Timeout { timeout } => {
            Error::Timeout { server: server.to_owned(), what: what.to_owned(), after_ms: timeout.as_millis() as u64 }
        }
        ServiceError::TransportSend(e) => {
            Error::Protocol { server: server.to_owned(), what: what.to_owned(), message: crate::cause::http_cause(&e) }
        }
        other => Error::Protocol { server: server.to_owned(), what: what.to_owned(), message: other.to_string() },
    }
}

/// Why an HTTP handshake failed: the transport's cause in words, else rmcp's text.
fn init_cause(e: &rmcp::service::ClientInitializeError) -> String {
    match e {
        rmcp::service::ClientInitializeError::TransportError { error, .. } => crate::cause::http_cause(error),
        other => crate::cause::one_line(&other.to_string(), 300),
    }
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_text_at_char_boundary() {
        let c = convert_contents(vec![ResourceContents::text("héllo", "u"), ResourceContents::text("more", "u")], 2);
        assert_eq!(c.parts.len(), 2);
        assert_eq!(c.parts[0], ContentPart::Text { text: "h".into(), mime_type: Some("text/plain".into()) });
        // Once the cap is hit nothing more is kept: "éllo" and "more" are cut.
        assert_eq!(c.parts[1], ContentPart::Text { text: "".into(), mime_type: Some("text/plain".into()) });
        assert_eq!(c.truncated_bytes, 9);
    }
}
