//! `mcp-context`: the command line.
//!
//! `main` returns an exit code; `run` returns `anyhow::Result` and errors are
//! printed with their cause chain. A closed stdout (`| head`) is success.
//! Every command that connects to servers closes them before exiting, on
//! success, on error and on SIGINT (Ctrl-C), SIGTERM or SIGHUP at any point,
//! the start-up included, so no child process is left behind.
//!
//! Exit codes (README, "Exit codes"): 0 success (some servers may have
//! failed, with a warning each); 1 an error, including "all N servers
//! failed"; 2 a usage error; 128 + the signal's number when interrupted
//! (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP).

// The layered subscriber's type (logs, traces and their filters) is deep.
#![recursion_limit = "256"]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::bail;
use clap::{Parser, Subcommand};
use mcp_context::access::Via;
use mcp_context::compose::render_text;
use mcp_context::display::escape;
use mcp_context::servers::Hub;
use mcp_context::{Config, ContextRequest, McpContext, Policy, ResourceId};

#[cfg(feature = "serve")]
use mcp_context::serve;

mod cli_audit;
mod cli_auth;
mod cli_auth_login;
mod cli_check;
mod cli_ids;
mod cli_list;
mod cli_log;

use cli_log::{LogFormat, init_tracing, log_subscriber};

/// Give LLM calls the context your MCP servers hold.
#[derive(Parser)]
#[command(name = "mcp-context", version, about)]
struct Cli {
    /// Config file (else $MCP_CONTEXT_CONFIG, else ./mcp-context.yaml).
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,
    /// More logging on stderr (-v info, -vv debug incl. server stderr).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Log lines as `text` (default) or `json` (one object per line, with the request span's
    /// `request_id` and `trace_id`, for log collectors; meant for `serve`).
    #[arg(long, global = true, value_name = "FORMAT", default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List every resource the configured servers offer (with -v/--verbose,
    /// also each server's negotiated protocol revision and counts).
    List {
        /// Only this server.
        #[arg(long)]
        server: Option<String>,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Read one resource and print its text (blobs as placeholders). An operator's tool: it reads as
    /// the server's own client, bypassing the policy (no user, no rule applies); `preview --user`
    /// shows what a user would get.
    Read {
        /// SERVER:URI, e.g. demo:demo://docs/guide
        id: String,
    },
    /// Print the context message that would be injected for a user, and a report.
    Preview {
        /// The user whose policy applies.
        #[arg(long, default_value = "anonymous")]
        user: String,
        /// Roles from the user's identity provider (mapped groups), added to their policy entry's, as a verified
        /// token's would be.
        #[arg(long, value_name = "ROLE,...", value_delimiter = ',')]
        roles: Vec<String>,
        /// Token budget (overrides context.max_tokens).
        #[arg(long)]
        budget: Option<usize>,
        /// Model whose tokenizer counts.
        #[arg(long)]
        model: Option<String>,
        /// Only these resources (SERVER:URI), like @-mentions.
        #[arg(long = "select", value_name = "SERVER:URI")]
        select: Vec<String>,
        /// The question to rank passages by (relevance mode).
        #[arg(long, value_name = "TEXT")]
        query: Option<String>,
        /// How to choose resources: auto, priority or relevance (overrides context.select).
        #[arg(long, value_name = "MODE")]
        mode: Option<mcp_context::SelectMode>,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// The pre-flight of a rollout: the config and policy loaded (every problem listed), every server started
    /// or dialled, Redis, PostgreSQL, the JWKS and the upstream reached; one line each, exit 1 when any fails.
    Check {
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Validate policies and explain decisions.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Run an OpenAI-compatible proxy that injects each caller's context.
    #[cfg(feature = "serve")]
    Serve {
        /// Address to listen on (overrides serve.listen).
        #[arg(long, value_name = "IP:PORT")]
        listen: Option<String>,
        /// Upstream base URL, e.g. http://127.0.0.1:11434/v1 (overrides
        /// serve.upstream, else $OPENAI_BASE_URL, else OpenAI).
        #[arg(long, value_name = "URL")]
        upstream: Option<String>,
        #[command(subcommand)]
        command: Option<ServeCommand>,
    },
    /// Ask the audit trail who received what (the `audit:` PostgreSQL sink, else its JSONL file).
    Audit {
        #[command(subcommand)]
        command: cli_audit::AuditCommand,
    },
    /// Per-user credentials of servers with a per-user `auth:` block: set, status, logout.
    Auth(cli_auth::AuthArgs),
    /// Run the bundled demo MCP server on stdio.
    #[command(hide = true)]
    DemoServer,
}

#[cfg(feature = "serve")]
#[derive(Subcommand)]
enum ServeCommand {
    /// Print the SHA-256 digest of a caller key, for serve.keys.
    HashKey {
        /// The key; `-` reads it from stdin (keeps it out of shell history).
        key: String,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Validate a policy file or folder (default: the config's) and summarise it.
    Check {
        /// Policy file or folder.
        path: Option<PathBuf>,
    },
    /// Say whether a user may see a resource, and which rule decided.
    Explain {
        /// The user.
        #[arg(long)]
        user: String,
        /// Roles from the user's identity provider (mapped groups), added to their policy entry's.
        #[arg(long, value_name = "ROLE,...", value_delimiter = ',')]
        roles: Vec<String>,
        /// SERVER:URI
        id: String,
    },
}

/// Roles given on the command line must be the policy's: an unknown one would silently grant nothing.
fn known_roles(policy: &Policy, roles: &[String]) -> anyhow::Result<()> {
    let unknown: Vec<&str> = roles.iter().filter(|r| !policy.has_role(r)).map(String::as_str).collect();
    if !unknown.is_empty() {
        let defined: Vec<String> = policy.summary().roles.into_iter().map(|r| r.name).collect();
        bail!("--roles: the policy defines no role {} (it defines: {})", unknown.join(", "), defined.join(", "));
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // `serve` stops on SIGTERM / Ctrl-C by draining, a normal end (exit 0),
    // and reloads on SIGHUP; every other command is interrupted by a signal.
    #[cfg(feature = "serve")]
    let interrupted_by_signal = !matches!(cli.command, Command::Serve { .. });
    #[cfg(not(feature = "serve"))]
    let interrupted_by_signal = true;
    let result = rt.block_on(async {
        if let Err(e) = listen_for_signals() {
            eprintln!("warning: cannot listen for signals: {e}");
        }
        run(cli).await
    });
    // A signal that came while the command was finishing or closing its
    // servers still decides the exit code: 128 + N whatever the outcome.
    if let Some(code) = SIGNALLED.get().and_then(|rx| *rx.borrow()).filter(|_| interrupted_by_signal) {
        return ExitCode::from(code);
    }
    match result {
        Ok(code) => code,
        Err(e) => {
            if is_broken_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            // Each line escaped (what a server said may be in it); the lines our messages break stay.
            let text = format!("{e:#}");
            let lines: Vec<_> = text.lines().map(escape).collect();
            eprintln!("error: {}", lines.join("\n"));
            ExitCode::FAILURE
        }
    }
}

/// `serve hash-key`: needs no config.
fn is_hash_key(command: &Command) -> bool {
    #[cfg(feature = "serve")]
    if let Command::Serve { command: Some(ServeCommand::HashKey { .. }), .. } = command {
        return true;
    }
    let _ = command;
    false
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if matches!(cli.command, Command::DemoServer | Command::Policy { command: PolicyCommand::Check { path: Some(_) } })
        || is_hash_key(&cli.command)
    {
        init_tracing(cli.verbose, cli.log_format, None)?;
    }
    if let Command::DemoServer = cli.command {
        tokio::select! {
            r = mcp_context::demo::serve_stdio() => r?,
            code = signalled() => return Ok(code),
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Command::Policy { command: PolicyCommand::Check { path: Some(p) } } = &cli.command {
        return policy_check(p);
    }
    #[cfg(feature = "serve")]
    if let Command::Serve { command: Some(ServeCommand::HashKey { key }), .. } = &cli.command {
        let key = if key == "-" {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line)?;
            line.trim_end_matches(['\r', '\n']).to_owned()
        } else {
            key.clone()
        };
        writeln!(std::io::stdout().lock(), "{}", serve::hash_key(&key))?;
        return Ok(ExitCode::SUCCESS);
    }
    let config_path = Config::locate(cli.config.as_deref());
    if let Command::Check { json } = cli.command {
        init_tracing(cli.verbose, cli.log_format, None)?;
        return cli_check::check(&config_path, json).await;
    }
    let config = tracing::subscriber::with_default(log_subscriber(cli.verbose, cli.log_format), || {
        Config::load(&config_path).map_err(|e| with_policy_problems(e, &config_path))
    })?;
    let tracing = init_tracing(cli.verbose, cli.log_format, config.telemetry.as_ref())?;
    let result = command(cli, config).await;
    tracing.end().await;
    result
}

/// A config that does not load: the problems of the policy it names too, so that one run shows them all.
fn with_policy_problems(mut e: mcp_context::Error, config_path: &Path) -> mcp_context::Error {
    if let mcp_context::Error::Config { more, .. } = &mut e
        && let Some(policy) = Config::policy_in(config_path)
        && let Err(p) = Policy::load(&policy)
    {
        more.push(p);
    }
    e
}

/// The commands that read the config.
async fn command(cli: Cli, config: Config) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Audit { command } => cli_audit::run(&config, command).await,
        Command::Auth(args) => cli_auth::run(&config, args.command).await,
        Command::List { server, json } => {
            let config = only_server(config, server.as_deref())?;
            let verbose = cli.verbose > 0;
            with_hub(&config, |hub| async move { cli_list::list(&hub, server.as_deref(), json, verbose) }).await
        }
        Command::Read { id } => {
            let id = ResourceId::parse(&id)?;
            let config = server_of(config, &id)?;
            with_hub(&config, |hub| async move {
                let listing_mime = hub.resource(&id).and_then(|r| r.mime_type);
                let contents = hub.read(&id).await?;
                let mut out = std::io::stdout().lock();
                writeln!(out, "{}", render_text(&contents, listing_mime.as_deref()))?;
                Ok(ExitCode::SUCCESS)
            })
            .await
        }
        Command::Preview { user, roles, budget, model, select, query, mode, json } => {
            let selection = if select.is_empty() {
                None
            } else {
                Some(select.iter().map(|s| ResourceId::parse(s)).collect::<Result<Vec<_>, _>>()?)
            };
            if let Some(ids) = &selection {
                for id in ids {
                    server_of(config.clone(), id).map(drop)?;
                }
            }
            let selected: Vec<String> = selection.iter().flatten().map(ToString::to_string).collect();
            // A preview sends nothing to a model: it is no injection, and leaves no audit record.
            let mut config = config;
            config.audit.sinks.clear();
            let ctx = tokio::select! {
                ctx = McpContext::from_config(&config) => ctx?,
                code = signalled() => return Ok(code),
            };
            let servers = config.servers.len();
            let result = interruptible(&ctx, async {
                known_roles(&ctx.policy(), &roles)?;
                let mut req = ContextRequest::for_user(user.clone())
                    .with_roles(roles)
                    .with_selection(selection)
                    .with_budget(budget)
                    .with_select(mode);
                if let Some(m) = model {
                    req = req.with_model(m);
                }
                if let Some(q) = query {
                    req = req.with_query(q);
                }
                let (message, report) = ctx.build(&req).await?;
                let mut out = std::io::stdout().lock();
                if json {
                    let mut v = serde_json::to_value(&report)?;
                    v["message"] = match &message {
                        Some(m) => serde_json::json!({"role": m.role.to_string(), "content": m.content}),
                        None => serde_json::Value::Null,
                    };
                    writeln!(out, "{}", serde_json::to_string(&v)?)?;
                } else {
                    match &message {
                        Some(m) => writeln!(out, "{}", m.content)?,
                        None => eprintln!("(nothing would be injected)"),
                    }
                    out.flush()?;
                    eprint!("\n{report}");
                }
                all_failed(servers, report.failed_servers.iter().filter(|f| is_down(ctx.hub(), &f.server)).count())?;
                // A selected resource no server offers is the caller's mistake, not an empty selection.
                let missing: Vec<&str> = report
                    .excluded
                    .iter()
                    .filter(|e| e.reason == mcp_context::ExcludeReason::NotFound && selected.contains(&e.id))
                    .map(|e| e.id.as_str())
                    .collect();
                if !missing.is_empty() {
                    bail!(
                        "--select: no server offers {} (not listed, nor an expansion of a listed template); \
                         `mcp-context list` shows what each server offers",
                        missing.iter().map(|id| format!("`{}`", escape(id))).collect::<Vec<_>>().join(", ")
                    );
                }
                Ok(ExitCode::SUCCESS)
            })
            .await;
            ctx.close().await;
            result
        }
        Command::Policy { command: PolicyCommand::Check { path: None } } => {
            let Some(p) = config.policy.clone() else {
                bail!("{} names no `policy:`; give a path: mcp-context policy check PATH", config.path.display());
            };
            policy_check(&p)
        }
        Command::Policy { command: PolicyCommand::Explain { user, roles, id } } => {
            let id = ResourceId::parse(&id)?;
            let policy = match &config.policy {
                Some(p) => Policy::load(p)?,
                None => Policy::allow_all(),
            };
            known_roles(&policy, &roles)?;
            let config = server_of(config, &id)?;
            with_hub(&config, |hub| async move {
                // The same gate as every other requested URI: decide on what would be read.
                let up = policy.for_identity(&user, &roles);
                let mut out = std::io::stdout().lock();
                if !roles.is_empty() {
                    writeln!(out, "roles: {} (the policy entry's and --roles)", up.roles().join(", "))?;
                }
                match mcp_context::access::admit(&hub, &up, &id) {
                    Err(why) => {
                        writeln!(out, "DENY {id} for user {user}")?;
                        writeln!(out, "  refused before the policy: {why}")?;
                        writeln!(
                            out,
                            "  a requested URI must be listed by the server, expand one of its templates, or be a \
                             policy include, with no dot segment, encoded separator, backslash or empty segment"
                        )?;
                    }
                    Ok(admitted) => {
                        let r = &admitted.resource;
                        let d = up.decide(r);
                        let (verdict, id) = (if d.allowed { "ALLOW" } else { "DENY" }, r.id.to_string());
                        writeln!(out, "{verdict} {} for user {}", escape(&id), escape(&user))?;
                        writeln!(out, "  {}", escape(&d.detail()))?;
                        match &admitted.via {
                            Via::Listing => {}
                            Via::Template(t) => {
                                writeln!(out, "  note: not listed; an expansion of the template {}", escape(t))?;
                            }
                            Via::Include => writeln!(out, "  note: not listed; one of this user's policy includes")?,
                        }
                        if admitted.via != Via::Listing
                            && let Some(mime) = &r.mime_type
                        {
                            writeln!(out, "  note: decided with the template's MIME type {}", escape(mime))?;
                        }
                    }
                }
                Ok(ExitCode::SUCCESS)
            })
            .await
        }
        #[cfg(feature = "serve")]
        Command::Serve { listen, upstream, command: None } => {
            serve::run(config, serve::Options::new(listen, upstream).with_json_logs(cli.log_format == LogFormat::Json))
                .await?;
            Ok(ExitCode::SUCCESS)
        }
        #[cfg(feature = "serve")]
        Command::Serve { command: Some(_), .. } => unreachable!("handled above"),
        Command::DemoServer
        | Command::Check { .. }
        | Command::Policy { command: PolicyCommand::Check { path: Some(_) } } => {
            unreachable!("handled above")
        }
    }
}

fn policy_check(path: &Path) -> anyhow::Result<ExitCode> {
    let policy = Policy::load(path)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "policy OK: {}", path.display())?;
    write!(out, "{}", policy.summary())?;
    Ok(ExitCode::SUCCESS)
}

/// Keeps only `server` (when given), so `read` and `list --server` start one process, not all.
fn only_server(mut config: Config, server: Option<&str>) -> anyhow::Result<Config> {
    if let Some(name) = server {
        if config.server(name).is_none() {
            let known: Vec<_> = config.servers.iter().map(|s| s.name.as_str()).collect();
            bail!(mcp_context::Error::UnknownServer { server: name.to_owned(), known: known.join(", ") });
        }
        config.servers.retain(|s| s.name == name);
    }
    Ok(config)
}

/// [`only_server`] for the server of `id`; an unknown "server" that is a
/// URI's scheme (`docs://readme`, the server forgotten) is explained.
fn server_of(config: Config, id: &ResourceId) -> anyhow::Result<Config> {
    if let Some(e) = cli_ids::forgotten_server(&config, id) {
        return Err(e);
    }
    only_server(config, Some(&id.server))
}

/// Connects, runs `f`, closes. A signal while connecting drops the
/// half-made hub, whose guards kill every process group started so far; a
/// signal later closes the hub as usual. When every server failed there is
/// nothing to run `f` on: that is an error (exit 1), said once.
async fn with_hub<F, Fut>(config: &Config, f: F) -> anyhow::Result<ExitCode>
where
    F: FnOnce(Hub) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<ExitCode>>,
{
    let hub = tokio::select! {
        hub = Hub::connect(config) => hub,
        code = signalled() => return Ok(code),
    };
    let failures = hub.failures();
    let down: Vec<_> = failures.iter().filter(|f| is_down(&hub, &f.server)).collect();
    let result = if !down.is_empty() && down.len() == config.servers.len() {
        Err(match down.as_slice() {
            // Not escaped here: the final error is escaped line by line where it is printed, so the
            // stderr tail a server error carries keeps its lines.
            [one] => anyhow::anyhow!("server `{}` failed: {}", one.server, one.error),
            all => {
                let each: Vec<String> = all.iter().map(|f| format!("\n  server `{}`: {}", f.server, f.error)).collect();
                anyhow::anyhow!("all {} servers failed:{}", all.len(), each.concat())
            }
        })
    } else {
        for failure in &failures {
            let each: Vec<_> = failure.error.lines().map(escape).collect();
            eprintln!("warning: server `{}` failed: {}", failure.server, each.join("\n"));
        }
        tokio::select! {
            r = f(hub.clone()) => r,
            code = signalled() => Ok(code),
        }
    };
    hub.close().await;
    result
}

/// Whether a server counts as failed for the exit code: its process or
/// connection is down, or its listing failed with nothing listed.
fn is_down(hub: &Hub, server: &str) -> bool {
    !hub.is_connected(server) || hub.status().iter().any(|s| s.name == server && s.failed())
}

async fn interruptible<F>(_ctx: &McpContext, f: F) -> anyhow::Result<ExitCode>
where
    F: std::future::Future<Output = anyhow::Result<ExitCode>>,
{
    tokio::select! {
        r = f => r,
        code = signalled() => Ok(code),
    }
}

/// An error when all `servers` configured failed (`failed` of them).
fn all_failed(servers: usize, failed: usize) -> anyhow::Result<()> {
    match (servers, failed) {
        (0, _) => Ok(()),
        (n, f) if f < n => Ok(()),
        (1, _) => bail!("the server failed (see above)"),
        (n, _) => bail!("all {n} servers failed (see above)"),
    }
}

/// The first SIGINT, SIGTERM or SIGHUP, as the exit code it calls for.
static SIGNALLED: std::sync::OnceLock<tokio::sync::watch::Receiver<Option<u8>>> = std::sync::OnceLock::new();

/// Installs the handlers before anything is spawned: from here on a signal
/// no longer kills us outright (which would leave servers in their own
/// process groups running), it ends the command through [`signalled`].
fn listen_for_signals() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    let (tx, rx) = tokio::sync::watch::channel(None);
    let _ = SIGNALLED.set(rx);
    tokio::spawn(async move {
        let code = tokio::select! {
            _ = int.recv() => 128 + libc::SIGINT,
            _ = term.recv() => 128 + libc::SIGTERM,
            _ = hup.recv() => 128 + libc::SIGHUP,
        };
        let _ = tx.send(Some(code as u8));
        // Keep the handlers installed (and the sender alive) until exit.
        std::future::pending::<()>().await;
        drop((int, term, hup));
    });
    Ok(())
}

/// Resolves once a signal has arrived (at once if one already has).
async fn signalled() -> ExitCode {
    let Some(rx) = SIGNALLED.get() else { return std::future::pending().await };
    let mut rx = rx.clone();
    match rx.wait_for(Option::is_some).await {
        Ok(code) => ExitCode::from(code.unwrap_or(1)),
        Err(_) => std::future::pending().await,
    }
}
