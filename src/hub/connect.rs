//! Connecting to one server and supervising it: spawn a stdio server as the
//! leader of its own process group, set to die with us (or dial an HTTP
//! one), the `initialize` handshake, the explanation of a failed start (exit
//! status, the telling stderr lines of `super::stderr`, junk on stdout),
//! reconnection with backoff when its process ended, and the bounded
//! shutdown (close stdin, SIGTERM the group, SIGKILL it).

// The parent-death signal is a system call (`prctl(2)`) that std does not
// offer. Signals to the process group are `crate::server_process`'s.
#![allow(unsafe_code)]

use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use rmcp::model::{
    ClientCapabilities, ClientConfig, Implementation, ProtocolVersion, ResourceUpdatedNotificationParam,
};
use rmcp::service::{NotificationContext, Peer, RunningService};
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient};
use tokio::sync::broadcast;

use super::list::list_server;
use super::listen::{Listener, ListenerConfig};
use super::server::{Backoff, Server};
use super::stderr::{StderrTail, TAIL_LINES, drain_stderr, missing_vars, pick};
use super::{Hub, HubEvent, Shared};
use crate::config::{ENV_ALLOWLIST, Protocol, ServerConfig, Transport};
use crate::error::{Error, Result};
use crate::pipe::{ChildPipe, Diagnostics};
use crate::server_process::ServerProcess;

/// How long a server may take to exit after its stdin closes, on `close()`.
const EXIT_GRACE: Duration = Duration::from_millis(1500);
/// How long after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_millis(1000);

/// Our side of one connection (rmcp's client handler): it announces the
/// handshake revision (2025-11-25, for `initialize`) and turns the server's notifications into hub events
/// and re-list requests.
#[derive(Clone)]
pub(super) struct Host {
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
pub(super) struct Live {
    pub(super) peer: Peer<RoleClient>,
    service: tokio::sync::Mutex<Option<RunningService<RoleClient, Host>>>,
    /// A stdio server's process, leader of its group.
    process: Option<Arc<ServerProcess>>,
    /// The negotiated revision, e.g. `2026-07-28`.
    pub(super) protocol: String,
    /// `subscriptions/listen`, on a revision without `initialize`
    /// (2026-07-28 on), where it replaces `resources/subscribe`.
    pub(super) listener: Option<Listener>,
    pub(super) subscribe: bool,
    pub(super) list_changed: bool,
    pub(super) has_resources: bool,
}

impl Drop for Live {
    fn drop(&mut self) {
        if let Some(process) = &self.process {
            // Synchronous and unconditional: the only kill that is certain to
            // happen when a hub is dropped during runtime shutdown (the pipe
            // may hold the process a while longer).
            process.signal_group(libc::SIGKILL);
        }
    }
}

impl Hub {
    /// The server's live connection; if its process ended (or it never
    /// came up), reconnects, at most once per backoff period.
    pub(super) async fn live(&self, server: &Server) -> Result<Arc<Live>> {
        let usable = |s: &Server| s.state().usable().cloned();
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
        let last_error = server.state().error.clone().unwrap_or_else(|| "its process ended".into());
        if let Some(t) = backoff.next_try
            && tokio::time::Instant::now() < t
        {
            // The backoff is the hub's business; the caller needs the cause.
            let wait = t - tokio::time::Instant::now();
            tracing::debug!(server = %server.cfg.name, "next reconnect attempt in {} ms", wait.as_millis());
            return Err(unavailable(last_error));
        }
        let old = server.take_live(false);
        let was_up = old.is_some();
        if let Some(old) = old {
            tracing::warn!(server = %server.cfg.name, "connection lost; restarting");
            Box::pin(shutdown(&old)).await;
        }
        // Boxed: a reconnect future is kilobytes, and it would otherwise be
        // part of every read future (1000 pending reads, 6 MB, measured).
        if Box::pin(connect_one(&self.shared, server, was_up)).await {
            *backoff = Backoff::default();
            let _ = self.shared.events.send(HubEvent::Restarted { server: server.cfg.name.clone() });
            usable(server).ok_or_else(|| unavailable("connection closed right after restart".into()))
        } else {
            backoff.failed();
            Err(unavailable(server.state().error.clone().unwrap_or(last_error)))
        }
    }
}

/// Connects (or reconnects) one server and lists it. Records the outcome;
/// `restart`: it replaces a connection that was lost.
pub(super) async fn connect_one(shared: &Arc<Shared>, s: &Server, restart: bool) -> bool {
    let host =
        Host { server: s.cfg.name.as_str().into(), events: shared.events.clone(), relist: shared.relist_tx.clone() };
    let started = std::time::Instant::now();
    match connect_server(&s.cfg, host, shared.max_resource_bytes).await.map_err(|e| s.cfg.scrub(&e)) {
        Ok(live) => {
            let connected = started.elapsed();
            tracing::info!(server = %s.cfg.name, protocol = %live.protocol, setting = %s.cfg.protocol,
                connect_ms = connected.as_millis() as u64, "connected");
            let live = Arc::new(live);
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            // Usable at once (reads need no listing); the listing follows,
            // alongside (2026-07-28) the `listen` for list changes, so that
            // a change during the listing is heard and the listing not delayed.
            let restarted_at = restart.then(|| shared.restarts.fetch_add(1, Ordering::SeqCst) + 1);
            s.connected(live.clone(), ms(connected), restarted_at);
            let listen = async {
                if let Some(l) = live.listener.as_ref().filter(|l| l.useful())
                    && let Err(e) = l.start().await
                {
                    tracing::warn!(server = %s.cfg.name, error = %e, "subscriptions/listen failed");
                }
            };
            // Reads ahead start from each page of a first listing (`ahead`).
            let hub = super::Hub { shared: shared.clone() };
            let read_ahead = |page: &[Arc<crate::resource::Resource>]| hub.read_ahead(page);
            let on_page = (!restart && shared.ahead.active()).then_some(&read_ahead as &super::list::OnPage);
            let (listing, ()) = tokio::join!(list_server(&s.cfg, &live, on_page), listen);
            super::list::schedule_relist(shared, &s.cfg.name, &live, &listing);
            if s.listed(&live, listing, Some(ms(started.elapsed() - connected))) {
                shared.generation.fetch_add(1, Ordering::SeqCst);
            }
            true
        }
        Err(e) => {
            // Debug, not warn: the failure is returned (failures(), the
            // report), and whoever shows it says it once.
            tracing::debug!(server = %s.cfg.name, error = %e, "server unavailable");
            s.failed(e);
            false
        }
    }
}

pub(super) async fn shutdown(live: &Live) {
    let service = live.service.lock().await.take();
    if let Some(mut service) = service {
        // close() closes stdin and waits for the loop to end; rmcp's own
        // graceful shutdown would wait 3 s + 3 s, so bound it and finish the
        // job on the process group ourselves.
        let _ = tokio::time::timeout(EXIT_GRACE, service.close()).await;
    }
    if let Some(process) = &live.process {
        if process.group_running() {
            process.signal_group(libc::SIGTERM);
            let deadline = tokio::time::Instant::now() + TERM_GRACE;
            while process.group_running() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        process.signal_group(libc::SIGKILL);
    }
}

async fn connect_server(cfg: &ServerConfig, host: Host, max_text: usize) -> std::result::Result<Live, String> {
    let timeout = cfg.timeout;
    if let Some(why) = &cfg.unsupported {
        return Err(why.clone());
    }
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
            die_with_parent(&mut cmd);
            cmd.process_group(0).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
            let mut child = cmd.spawn().map_err(|e| format!("cannot start `{command_display}`: {e}"))?;
            let tail = Arc::new(StdMutex::new(std::collections::VecDeque::new()));
            let drain = child.stderr.take().map(|e| tokio::spawn(drain_stderr(cfg.name.clone(), e, tail.clone())));
            let diag = Diagnostics::new(&cfg.name);
            let transport = ChildPipe::new(child, diag.clone(), max_text)
                .map_err(|e| format!("cannot start `{command_display}`: {e}"))?;
            // Ends the group if connecting fails half-way.
            let mut guard = GroupGuard(transport.process());
            let what = opener(cfg.protocol);
            let failure = match tokio::time::timeout(
                timeout,
                host.serve_with_lifecycle(transport, lifecycle(cfg.protocol)),
            )
            .await
            {
                Err(_) => format!("no answer to {what} within {} ms", timeout.as_millis()),
                Ok(Err(e)) => match diag.exit_status() {
                    Some(status) => format!("{} before answering {what}", describe_exit(status)),
                    None if matches!(e, rmcp::service::ClientInitializeError::ConnectionClosed(_)) => {
                        format!("closed its stdout before answering {what}")
                    }
                    None => format!("{what} failed: {}", super::convert::init_cause(&e)),
                },
                Ok(Ok(s)) => {
                    diag.connected();
                    return Ok(live_from(s, guard.0.take(), cfg).await);
                }
            };
            // The process is gone or about to be killed: let its stderr
            // reach EOF (a grandchild may hold it open, so bounded).
            drop(guard);
            if let Some(drain) = drain {
                let _ = tokio::time::timeout(Duration::from_millis(300), drain).await;
            }
            let passed =
                |v: &str| ENV_ALLOWLIST.contains(&v) || inherit_env.iter().any(|n| n == v) || env.contains_key(v);
            Err(explain_start_failure(failure, diag.first_junk(), &tail, &passed))
        }
        Transport::Http { url, headers, mode } => {
            super::remote::connect(cfg, host, url, headers, *mode, max_text).await
        }
    }
}

/// How a connection starts, for each `protocol:` setting. `auto` is rmcp's
/// own probe: `server/discover` first; a server that answers it with an
/// error (a legacy server says "method not found") gets `initialize` at
/// once on the same connection, so the fallback costs one round trip and
/// no re-spawn. rmcp falls back from a *silent* server only after 10 s;
/// the whole start is bounded by the server's `timeout_ms` (the caller's
/// `tokio::time::timeout`), so a server that never answers costs exactly
/// that and fails with its cause, with no hidden fixed delay.
pub(super) fn lifecycle(protocol: Protocol) -> ClientLifecycleMode {
    match protocol {
        Protocol::V2025_11_25 => ClientLifecycleMode::Initialize,
        Protocol::V2026_07_28 => {
            ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] }
        }
        Protocol::Auto => ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            legacy_version: Some(ProtocolVersion::V_2025_11_25),
        },
    }
}

/// The request(s) that open a connection under `protocol`, for messages.
pub(super) fn opener(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::V2025_11_25 => "initialize",
        Protocol::V2026_07_28 => "server/discover",
        Protocol::Auto => "server/discover or initialize",
    }
}

/// "cannot initialize URL" / "cannot discover URL".
pub(super) fn verb(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::V2026_07_28 => "discover",
        _ => "initialize",
    }
}

/// Has the server killed (SIGKILL) when this process dies, even when it is
/// killed outright (`kill -9`), where no handler of ours runs to end the
/// process group: Linux's parent-death signal. The kernel ties it to the
/// spawning thread; the runtime's worker threads live as long as the runtime.
/// Grandchildren (`npx` → `node`) are not covered; they see their stdin close.
fn die_with_parent(cmd: &mut tokio::process::Command) {
    #[cfg(target_os = "linux")]
    {
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: runs between fork and exec, so it only makes async-signal-safe
        // calls (prctl, getppid, _exit) and allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent died before the prctl: nobody will send the signal.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cmd;
}

/// Kills a server's process group if connecting fails half-way.
struct GroupGuard(Option<Arc<ServerProcess>>);
impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            p.signal_group(libc::SIGKILL);
        }
    }
}

pub(super) async fn live_from(
    service: RunningService<RoleClient, Host>,
    process: Option<Arc<ServerProcess>>,
    cfg: &ServerConfig,
) -> Live {
    let peer = service.peer().clone();
    // rmcp's response cache (SEP-2549) is turned OFF, in favour of ours
    // (`cache.rs`): one connection serves many users, and rmcp's cache keys
    // a `private` answer by connection, not by our user, so it could serve
    // one user's private answer to another; and with `serve_stale_on_error`
    // it would hide a failing read behind the last good answer. Ours honours
    // `ttlMs` and `cacheScope` per user.
    peer.set_response_cache_config(rmcp::service::ClientCacheConfig::disabled()).await;
    let info = peer.peer_info();
    let caps = info.as_ref().and_then(|i| i.capabilities.resources.clone());
    let version = info.as_ref().map(|i| i.protocol_version.clone());
    let modern = version.as_ref().is_some_and(|v| !v.has_initialize());
    let subscribe = caps.as_ref().and_then(|c| c.subscribe).unwrap_or(false);
    let list_changed = caps.as_ref().and_then(|c| c.list_changed).unwrap_or(false);
    let host = service.service();
    let listener = modern.then(|| {
        Listener::new(ListenerConfig {
            peer: peer.clone(),
            server: host.server.clone(),
            events: host.events.clone(),
            relist: host.relist.clone(),
            list_changed,
            subscribe,
            timeout: cfg.timeout,
        })
    });
    Live {
        listener,
        protocol: version.map(|v| v.to_string()).unwrap_or_default(),
        subscribe,
        list_changed,
        has_resources: caps.is_some(),
        peer,
        service: tokio::sync::Mutex::new(Some(service)),
        process,
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
/// wrote on stdout, the lines of its stderr that explain it, and a hint when
/// it names a host variable it was not given (the caller scrubs secrets
/// from the whole). `passed(name)`: the server was given that variable.
fn explain_start_failure(
    what: String,
    junk: Option<String>,
    tail: &StderrTail,
    passed: &dyn Fn(&str) -> bool,
) -> String {
    let mut out = what;
    if let Some(junk) = junk {
        out.push_str(&format!("; it wrote non-JSON on stdout: {junk}"));
    }
    let tail = tail.lock().unwrap_or_else(|e| e.into_inner());
    let lines: Vec<String> = tail.iter().cloned().collect();
    if !lines.is_empty() {
        out.push_str("; its stderr ends with:");
        for line in pick(&lines, TAIL_LINES) {
            out.push_str("\n    | ");
            out.push_str(line.unwrap_or("…"));
        }
    }
    for var in missing_vars(&lines, passed) {
        out.push_str(&format!(
            "\n  hint: `{var}` is set here but a server only gets the variables it is given; \
             add it to this server's `inherit_env: [{var}]`"
        ));
    }
    out
}
