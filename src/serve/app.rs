//! The proxy as a whole: [`Proxy`] to mount in an application's own axum
//! app, and [`run`], the process `mcp-context serve` runs (bind, signals,
//! graceful shutdown, policy reload on SIGHUP).

use super::*;

/// Command-line overrides of the `serve:` section.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Options {
    /// `--listen`: the address to listen on (else `serve.listen`).
    pub listen: Option<String>,
    /// `--upstream`: the upstream base URL (else `serve.upstream`, then
    /// `$OPENAI_BASE_URL`, then OpenAI's).
    pub upstream: Option<String>,
    /// `--log-format json`: the start lines on stderr are JSON objects too,
    /// so that every stderr line of a JSON-logging proxy parses.
    pub json_logs: bool,
}

impl Options {
    /// Overrides of the listen address and the upstream.
    pub fn new(listen: Option<String>, upstream: Option<String>) -> Self {
        Options { listen, upstream, json_logs: false }
    }

    /// The same, saying whether stderr carries JSON logs.
    #[must_use]
    pub fn with_json_logs(mut self, json: bool) -> Self {
        self.json_logs = json;
        self
    }
}

/// The proxy, to mount in an application's own axum app: every
/// chat-completions or Responses request through [`Proxy::router`] gets the
/// caller's context and goes on to the upstream, as with `mcp-context
/// serve`. The application binds and serves; `Host` values are checked
/// against `serve.allowed_hosts` when it is set (else any is accepted). The
/// engine is shared: close it ([`McpContext::close`]) when the app stops.
pub struct Proxy {
    pub(super) state: Shared,
}

impl Proxy {
    /// A proxy over `ctx` with `config`'s `serve:` settings, relaying to
    /// `upstream` (a base URL, `http://` or `https://`).
    pub fn new(ctx: Arc<McpContext>, config: &Config, upstream: &str) -> crate::Result<Proxy> {
        let settings = config.serve.clone();
        let hosts = settings.allowed_hosts.clone().map(|h| h.iter().map(|h| h.to_ascii_lowercase()).collect());
        let (upstream, owners) = upstream_and_owners(config, &settings, upstream.to_owned())?;
        Ok(Proxy { state: app_state(ctx, config, settings, (upstream, owners), hosts)? })
    }

    /// The routes (`/v1/...`, `/healthz`, `/readyz`, `/metrics`) as an axum
    /// `Router` with its state: merge it into the application's router, or
    /// use it as a `tower::Service`.
    pub fn router(&self) -> Router {
        router(self.state.clone())
    }

    /// The same proxy answering `/auth/{server}/start` and `/auth/callback`
    /// with `flows` (the servers users connect with OAuth). Call it before
    /// [`Proxy::router`].
    #[must_use]
    pub fn with_oauth(mut self, flows: Arc<crate::credentials::OAuthFlows>) -> Self {
        if let Some(state) = Arc::get_mut(&mut self.state) {
            state.oauth = Some(flows);
        }
        self
    }
}

/// The upstream (`base` checked) and the store of response owners.
fn upstream_and_owners(
    config: &Config,
    settings: &ServeSettings,
    base: String,
) -> crate::Result<(Upstream, Arc<Owners>)> {
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        return Err(crate::Error::serve(format!(
            "the upstream `{}` must start with http:// or https://",
            relay::redact(&base)
        )));
    }
    let upstream = Upstream::new(settings, base)?;
    let owners = Arc::new(Owners::new(settings, &config.cache)?);
    Ok((upstream, owners))
}

/// The Messages API upstream (`serve.anthropic`), if configured.
fn anthropic(settings: &ServeSettings) -> crate::Result<Option<super::messages::Anthropic>> {
    super::messages::Anthropic::new(settings)
}

/// `serve.jwt`'s verifier, its `role_map` checked against the policy (with
/// no policy configured every user sees everything, and roles mean nothing).
/// Its keys are fetched by [`run`] before it serves, or by the first token.
fn verifier(
    ctx: &McpContext,
    config: &Config,
    settings: &ServeSettings,
) -> crate::Result<Option<crate::identity::JwtVerifier>> {
    let Some(jwt) = &settings.jwt else { return Ok(None) };
    if config.policy.is_some() {
        let policy = ctx.policy();
        jwt.check_roles(|r| policy.has_role(r))?;
    }
    crate::identity::JwtVerifier::unfetched(jwt.settings.clone()).map(Some)
}

/// Refreshes the keys every `refresh_interval` until `stop`; a failure is
/// logged and shown by `/readyz`, and the keys held keep verifying.
fn refresh_keys(v: crate::identity::JwtVerifier, stop: CancellationToken) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(v.settings().refresh_interval) => {}
            }
            if let Err(e) = v.refresh().await {
                tracing::warn!(
                    "serve.jwt: the identity provider's keys could not be refreshed; the held keys keep verifying: {e}"
                );
            }
        }
    });
}

/// The shared state of the proxy's handlers.
fn app_state(
    ctx: Arc<McpContext>,
    config: &Config,
    settings: ServeSettings,
    (upstream, owners): (Upstream, Arc<Owners>),
    hosts: Option<Vec<String>>,
) -> crate::Result<Shared> {
    let flows = ctx
        .credentials()
        .and_then(|c| crate::credentials::CredentialFlows::from_config(config, c.store().clone()))
        .map(Arc::new);
    let mcp = super::mcp::Endpoint::new(&ctx, &settings, flows.clone())?;
    Ok(Arc::new(AppState {
        jwt: verifier(&ctx, config, &settings)?,
        anthropic: anthropic(&settings)?,
        gemini: super::gemini::GeminiApi::new(&settings)?,
        ctx,
        bodies: Budget::new(settings.max_inflight_body_bytes),
        unidentified: Budget::new(settings.max_unidentified_body_bytes),
        owners,
        hosts,
        settings,
        upstream,
        metrics: Metrics::new(config.cache.backend == crate::settings::CacheBackend::Redis),
        policy_path: config.policy.clone(),
        draining: AtomicBool::new(false),
        oauth: flows.as_ref().map(|f| f.oauth().clone()),
        mcp,
        flows,
    }))
}

/// Runs the proxy until SIGTERM or Ctrl-C, then drains and closes every MCP server.
pub async fn run(config: Config, opts: Options) -> crate::Result<()> {
    let mut settings = config.serve.clone();
    if let Some(l) = opts.listen {
        settings.listen = l;
    }
    super::startup::check_identifiable(&settings, &config.path)?;
    let key_sources = super::startup::upstream_keys(&mut settings, &|var| std::env::var(var).ok());
    let base = opts
        .upstream
        .or_else(|| settings.upstream.as_ref().map(|u| secrecy::ExposeSecret::expose_secret(u).to_owned()))
        .or_else(|| std::env::var("OPENAI_BASE_URL").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| crate::settings::DEFAULT_UPSTREAM.to_owned());
    let addr: SocketAddr = settings.listen.parse().map_err(|_| {
        crate::Error::serve(format!("listen address `{}` is not IP:PORT (e.g. 127.0.0.1:8787)", settings.listen))
    })?;
    let (upstream, owners) = upstream_and_owners(&config, &settings, base)?;
    // Signal handlers first: a SIGTERM that arrives while the servers start
    // must still drain and close them, not kill the process and orphan them.
    let signals = Signals::install()?;
    // Bind before connecting to the servers: a port in use fails fast, with no child started.
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| crate::Error::serve(format!("cannot listen on {addr}: {e}")))?;
    let local = listener.local_addr().map_err(crate::Error::serve_io("cannot read the address listened on"))?;
    // The address actually bound (port 0 resolved): the default redirect URI of `oauth` servers names it.
    settings.listen = local.to_string();
    let ctx = Arc::new(McpContext::from_config(&config).await?);
    ctx.load_model();
    // `needs_authorization` names this proxy's `/auth/{server}/start`.
    if let Some(c) = ctx.credentials() {
        c.set_auth_base(Some(config.serve.public_url.clone().unwrap_or_else(|| format!("http://{local}"))));
    }
    for f in ctx.hub().failures() {
        tracing::warn!(server = %f.server, error = %f.error, "MCP server unavailable; serving without it");
    }
    let hosts = allowed_hosts(&settings, local);
    let state = app_state(ctx.clone(), &config, settings.clone(), (upstream, owners), hosts)?;
    let stop = CancellationToken::new();
    if let Some(v) = &state.jwt {
        // Fetched before serving: with no keys no token could verify.
        if let Err(e) = v.refresh().await {
            ctx.close().await;
            return Err(e);
        }
        refresh_keys(v.clone(), stop.clone());
    }
    let app = router(state.clone());
    let limits = listen::Limits {
        max_connections: settings.max_connections,
        header_timeout: settings.header_timeout,
        idle_timeout: settings.idle_timeout,
    };
    let server = listen::serve(listener, app, limits, stop.clone());
    let mut server = tokio::spawn(server);
    {
        use std::io::Write;
        // Where each upstream's key comes from, said without -v (never the key itself).
        let mut err = std::io::stderr().lock();
        for line in &key_sources {
            let _ = if opts.json_logs {
                let (what, source) = line.split_once(": ").unwrap_or((line.as_str(), ""));
                let event = serde_json::json!({
                    "level": "INFO",
                    "fields": {"message": what, "source": source},
                    "target": "mcp_context::serve::startup",
                });
                writeln!(err, "{event}")
            } else {
                writeln!(err, "mcp-context serve: {line}")
            };
        }
        drop(err);
        let mut out = std::io::stdout().lock();
        writeln!(out, "mcp-context serve: listening on http://{local}, upstream {}", state.upstream.redacted())
            .and_then(|()| out.flush())
            .map_err(crate::Error::serve_io("cannot write to standard output"))?;
    }
    tracing::info!(%local, upstream = %state.upstream.redacted(), "serving");

    let result = lifecycle(&state, signals, &mut server).await;
    state.draining.store(true, Ordering::SeqCst);
    stop.cancel();
    if result.is_ok() {
        // In-flight requests and streams may finish within the grace period.
        match tokio::time::timeout(settings.shutdown_grace, &mut server).await {
            Ok(_) => tracing::info!("all requests finished"),
            Err(_) => {
                tracing::warn!(
                    grace_ms = settings.shutdown_grace.as_millis() as u64,
                    "requests still running after serve.shutdown_grace_ms; closing them"
                );
                server.abort();
            }
        }
    }
    ctx.close().await;
    result
}

/// The `Host` values `/v1/` accepts: `serve.allowed_hosts`, else the listen
/// address (and `localhost` when it is a loopback one) at the port listened
/// on; `None` (any) when listening on all interfaces without a list.
fn allowed_hosts(s: &ServeSettings, local: SocketAddr) -> Option<Vec<String>> {
    if let Some(list) = &s.allowed_hosts {
        return Some(list.iter().map(|h| h.to_ascii_lowercase()).collect());
    }
    let ip = local.ip();
    if ip.is_unspecified() {
        return None;
    }
    let port = local.port();
    let mut hosts = vec![match ip {
        std::net::IpAddr::V4(v4) => format!("{v4}:{port}"),
        std::net::IpAddr::V6(v6) => format!("[{v6}]:{port}"),
    }];
    if ip.is_loopback() {
        hosts.extend([format!("localhost:{port}"), format!("127.0.0.1:{port}"), format!("[::1]:{port}")]);
    }
    hosts.dedup();
    Some(hosts)
}

struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> crate::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            term: signal(SignalKind::terminate())
                .map_err(crate::Error::serve_io("cannot install the signal handlers"))?,
            int: signal(SignalKind::interrupt())
                .map_err(crate::Error::serve_io("cannot install the signal handlers"))?,
            hup: signal(SignalKind::hangup()).map_err(crate::Error::serve_io("cannot install the signal handlers"))?,
        })
    }
}

/// Waits for SIGTERM / Ctrl-C (Ok) or the server failing (Err); reloads the
/// policy on SIGHUP meanwhile.
async fn lifecycle(
    state: &Shared,
    signals: Signals,
    server: &mut tokio::task::JoinHandle<std::io::Result<()>>,
) -> crate::Result<()> {
    let Signals { mut term, mut int, mut hup } = signals;
    loop {
        tokio::select! {
            _ = term.recv() => { tracing::info!("SIGTERM: draining"); return Ok(()); }
            _ = int.recv() => { tracing::info!("Ctrl-C: draining"); return Ok(()); }
            _ = hup.recv() => reload_policy(state),
            r = &mut *server => {
                return match r {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(crate::Error::serve(format!("the HTTP server failed: {e}"))),
                    Err(e) => Err(crate::Error::serve(format!("the HTTP server stopped: {e}"))),
                };
            }
        }
    }
}

/// SIGHUP: load the policy again; a valid one applies from the next
/// request, an invalid one is logged (file:line:col) and the old one stays.
fn reload_policy(state: &Shared) {
    let Some(path) = &state.policy_path else {
        tracing::info!("SIGHUP: the config names no policy; nothing to reload");
        return;
    };
    match Policy::load(path) {
        Ok(p) => {
            state.ctx.set_policy(p);
            state.metrics.policy_reload(true);
            tracing::info!(path = %path.display(), "SIGHUP: policy reloaded");
        }
        Err(e) => {
            state.metrics.policy_reload(false);
            tracing::error!("SIGHUP: policy reload rejected, the previous policy stays in force: {e}");
        }
    }
}
