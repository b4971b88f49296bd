//! `mcp-context auth login SERVER --user U`: connects a user to an `oauth`
//! server with the loopback redirect (127.0.0.1, a random port), as Claude
//! Code and Gemini CLI do: prints the URL to open on stderr (and the line
//! `open: URL` on stdout, for scripts), waits for the browser to come back,
//! and stores the tokens in the credential store for that user only. No
//! token is printed. Part of the CLI (layer 9): imports the library's
//! public API only.

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use mcp_context::Config;
use mcp_context::credentials::{CredentialFlows, Credentials, loopback_login};

pub(crate) async fn run(
    config: &Config,
    credentials: &Credentials,
    server: &str,
    user: &str,
    wait_s: u64,
) -> anyhow::Result<ExitCode> {
    let Some(flows) = CredentialFlows::from_config(config, credentials.store().clone()) else {
        bail!("no server here has `auth: {{ type: oauth }}`");
    };
    if !flows.oauth().has_server(server) {
        bail!("server `{server}` is not `auth: {{ type: oauth }}`: `auth login` is for OAuth servers");
    }
    let done = loopback_login(flows.oauth(), server, user, Duration::from_secs(wait_s), |url| {
        eprintln!("Open this URL in a browser to connect `{user}` to `{server}`:\n\n  {url}\n");
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "open: {url}").and_then(|()| out.flush());
    })
    .await
    .with_context(|| format!("`{user}` is not connected to `{server}`"))?;
    eprintln!("Connected: `{}` can now use `{}`.", done.user, done.server);
    Ok(ExitCode::SUCCESS)
}
