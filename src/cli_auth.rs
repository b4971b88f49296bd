//! `mcp-context auth`: per-user credentials of the servers whose `auth:`
//! is per user (issue 35): `set` stores a user's header secrets (from
//! stdin, so they stay out of shell history and `ps`), `status` says each
//! server's state for a user (never a secret), `logout` forgets them. Part
//! of the CLI (layer 9): imports the library's public API only.

use std::io::{BufRead as _, Write as _};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Subcommand;
use mcp_context::Config;
use mcp_context::access::user_name_problem;
use mcp_context::credentials::{Credential, Credentials, TokenSet};
use mcp_context::settings::{ServerAuth, ServerConfig};
use secrecy::SecretString;

/// `mcp-context auth ...`.
#[derive(clap::Args)]
pub(crate) struct AuthArgs {
    #[command(subcommand)]
    pub(crate) command: AuthCommand,
}

/// What `mcp-context auth` does.
#[derive(Subcommand)]
pub(crate) enum AuthCommand {
    /// Store a user's secret header values for a `per_user_headers` server.
    Set {
        /// The server (its `auth.type` must be `per_user_headers`).
        server: String,
        /// The user they belong to.
        #[arg(long)]
        user: String,
        /// `Name: value` (repeatable). The value ends up in shell history:
        /// prefer --header-stdin.
        #[arg(long, value_name = "NAME: VALUE")]
        header: Vec<String>,
        /// Read this header's value from the first line of stdin.
        #[arg(long, value_name = "NAME")]
        header_stdin: Option<String>,
    },
    /// Each per-user server's state for a user (or how many users hold a
    /// credential); never a secret.
    Status {
        /// The user.
        #[arg(long)]
        user: Option<String>,
        /// One JSON array on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Connect a user to an `oauth` server through the browser: prints the
    /// URL to open, waits for the redirect to 127.0.0.1 and stores the tokens.
    Login {
        /// The server (its `auth.type` must be `oauth`).
        server: String,
        /// The user the tokens are for.
        #[arg(long)]
        user: String,
        /// How long to wait for the browser, in seconds.
        #[arg(long, default_value_t = 300)]
        wait_s: u64,
    },
    /// Forget what a user holds for a server.
    Logout {
        /// The server.
        server: String,
        /// The user.
        #[arg(long)]
        user: String,
    },
}

fn per_user_server<'a>(config: &'a Config, name: &str) -> anyhow::Result<&'a ServerConfig> {
    let Some(s) = config.server(name) else {
        let names: Vec<&str> = config.servers.iter().map(|s| s.name.as_str()).collect();
        bail!("unknown server `{name}` (configured: {})", names.join(", "))
    };
    if !s.auth.is_per_user() {
        bail!("server `{name}` has no per-user `auth:` block: its credential is the same for everybody (`headers`)");
    }
    Ok(s)
}

fn check_user(user: &str) -> anyhow::Result<()> {
    if let Some(p) = user_name_problem(user) {
        bail!("--user: {p}");
    }
    Ok(())
}

fn kind(auth: &ServerAuth) -> &'static str {
    match auth {
        ServerAuth::PerUserHeaders(_) => "per_user_headers",
        ServerAuth::TokenExchange(_) => "token_exchange",
        ServerAuth::OAuth(_) => "oauth",
        _ => "static",
    }
}

pub(crate) async fn run(config: &Config, command: AuthCommand) -> anyhow::Result<ExitCode> {
    // Nothing per user: nothing to report, and no credential store (nor its key) is needed to say so.
    if let AuthCommand::Status { json, .. } = &command
        && !config.servers.iter().any(|s| s.auth.is_per_user())
    {
        let mut out = std::io::stdout().lock();
        if *json {
            writeln!(out, "[]")?;
        } else {
            writeln!(
                out,
                "no server of {} has a per-user `auth:` block: every user reaches every server with the same \
                 credentials, and there is nothing to store per user",
                config.path.display()
            )?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let credentials = Credentials::open(config).context("cannot open the credential store (`credentials:`)")?;
    let mut out = std::io::stdout().lock();
    match command {
        AuthCommand::Set { server, user, header, header_stdin } => {
            check_user(&user)?;
            let s = per_user_server(config, &server)?;
            let ServerAuth::PerUserHeaders(settings) = &s.auth else {
                bail!("server `{server}` is `auth: {{ type: {} }}`: use `mcp-context auth login`", kind(&s.auth));
            };
            let mut given: Vec<(String, SecretString)> = Vec::new();
            for h in &header {
                let Some((name, value)) = h.split_once(':') else {
                    bail!("--header takes `Name: value`");
                };
                given.push((name.trim().to_owned(), SecretString::from(value.trim().to_owned())));
            }
            if let Some(name) = header_stdin {
                let mut line = String::new();
                std::io::stdin().lock().read_line(&mut line).context("cannot read the header value from stdin")?;
                let value = line.trim_end_matches(['\r', '\n']).to_owned();
                if value.is_empty() {
                    bail!("--header-stdin {name}: stdin gave an empty value");
                }
                given.push((name, SecretString::from(value)));
            }
            if given.is_empty() {
                bail!("give the value with --header-stdin NAME (or --header 'Name: value')");
            }
            for (name, _) in &given {
                if !settings.headers.iter().any(|h| h.eq_ignore_ascii_case(name)) {
                    bail!("server `{server}` takes the headers {} (got `{name}`)", settings.headers.join(", "));
                }
            }
            let store = credentials.store();
            let mut tokens = match store.get(&server, &user).await? {
                Some(t) => t,
                None => TokenSet::bearer(SecretString::from(String::new()), s.name.clone()),
            };
            for (name, value) in given {
                tokens.headers.retain(|(k, _)| !k.eq_ignore_ascii_case(&name));
                tokens.headers.push((name, value));
            }
            store.put(&server, &user, &tokens).await?;
            let names: Vec<&str> = tokens.headers.iter().map(|(k, _)| k.as_str()).collect();
            writeln!(out, "stored {} for user `{user}` on server `{server}`", names.join(", "))?;
        }
        AuthCommand::Login { server, user, wait_s } => {
            check_user(&user)?;
            per_user_server(config, &server)?;
            return crate::cli_auth_login::run(config, &credentials, &server, &user, wait_s).await;
        }
        AuthCommand::Logout { server, user } => {
            check_user(&user)?;
            per_user_server(config, &server)?;
            credentials.store().delete(&server, &user).await?;
            writeln!(out, "forgot what user `{user}` held for server `{server}`")?;
        }
        AuthCommand::Status { user, json } => {
            if let Some(u) = &user {
                check_user(u)?;
            }
            let mut rows = Vec::new();
            for s in config.servers.iter().filter(|s| s.auth.is_per_user()) {
                let (state, detail) = match &user {
                    Some(u) => match credentials.credential_for(s, u).await {
                        Ok(Credential::Headers(h)) => {
                            ("stored".to_owned(), h.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>().join(", "))
                        }
                        Ok(Credential::State(st)) => (st.as_str().to_owned(), connect_hint(&st)),
                        Ok(_) => ("unknown".to_owned(), String::new()),
                        Err(e) => ("error".to_owned(), e.to_string()),
                    },
                    None => match credentials.store().count(&s.name).await {
                        Ok(Some(n)) => (format!("{n} user(s)"), String::new()),
                        Ok(None) => ("-".to_owned(), String::new()),
                        Err(e) => ("error".to_owned(), e.to_string()),
                    },
                };
                rows.push((s.name.clone(), kind(&s.auth), state, detail));
            }
            if json {
                let v: Vec<_> = rows
                    .iter()
                    .map(|(s, k, st, d)| serde_json::json!({ "server": s, "type": k, "state": st, "detail": d }))
                    .collect();
                writeln!(out, "{}", serde_json::to_string(&v)?)?;
            } else if rows.is_empty() {
                writeln!(out, "no server has a per-user `auth:` block")?;
            } else {
                for (s, k, st, d) in rows {
                    // The detail may quote an authorization server: escaped, one line per server.
                    writeln!(out, "{s}\t{k}\t{st}\t{}", mcp_context::display::escape(&d))?;
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn connect_hint(s: &mcp_context::credentials::CredentialState) -> String {
    match s {
        mcp_context::credentials::CredentialState::NeedsAuthorization { url: Some(u) } => u.clone(),
        _ => String::new(),
    }
}
