//! `mcp-context auth login SERVER --user U`'s flow, as Claude Code and
//! Gemini CLI do it: a one-shot HTTP listener on 127.0.0.1 at a random port
//! is the redirect URI (RFC 8252 §7.3, loopback), the URL to open is handed
//! to the caller (printed), and the first request to `/callback` carrying
//! the pending `state` ends the flow ([`OAuthFlows::finish`]); requests with
//! any other state are answered 400 and ignored (they cannot end it).
//!
//! The listener reads one request line and headers (at most 8 KiB) per
//! connection and writes a short text answer; nothing else is served.
//!
//! Layer: sources (credentials). Imports `oauth` and the error type.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::oauth::{Connected, OAuthFlows};
use crate::error::{Error, Result};

/// The longest a request head may be.
const MAX_HEAD: usize = 8 * 1024;

/// Connects `user` to `server` through the browser: binds 127.0.0.1:0,
/// calls `open` with the authorization URL, waits (up to `wait`) for the
/// redirect and stores the tokens.
///
/// # Errors
/// [`Error::Authorization`] when the loopback port cannot be bound, the
/// flow cannot start, the wait runs out, or the authorization server
/// refuses.
pub async fn loopback_login(
    flows: &OAuthFlows,
    server: &str,
    user: &str,
    wait: Duration,
    open: impl FnOnce(&str),
) -> Result<Connected> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.map_err(|e| {
        Error::authorization(server, format!("cannot listen on 127.0.0.1 for the redirect: {e}"), false)
    })?;
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let redirect = format!("http://127.0.0.1:{port}/callback");
    let started = flows.start(server, user, &redirect).await?;
    open(&started.url);
    let serve = async {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else { continue };
            let Some(target) = read_target(&mut sock).await else {
                let _ = answer(&mut sock, 400, "Bad request").await;
                continue;
            };
            let (path, query) = target.split_once('?').unwrap_or((target.as_str(), ""));
            let q: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes()).into_owned().collect();
            let get = |k: &str| q.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
            if path != "/callback" || get("state") != Some(started.state.as_str()) {
                let _ = answer(&mut sock, 400, "Not the pending authorization.").await;
                continue;
            }
            if let Some(e) = get("error") {
                flows.abandon(&started.state).await;
                let e: String = e.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_').take(60).collect();
                let _ = answer(&mut sock, 400, &format!("Not connected: the authorization server said `{e}`.")).await;
                return Err(Error::authorization(server, format!("the authorization server said `{e}`"), true));
            }
            let result = flows.finish(&started.state, get("code").unwrap_or(""), get("iss"), Some(user)).await;
            let text = match &result {
                Ok(c) => format!("Connected: {} can now use `{}`. You can close this page.", c.user, c.server),
                Err(e) => format!("Not connected: {e}"),
            };
            let _ = answer(&mut sock, if result.is_ok() { 200 } else { 400 }, &text).await;
            return result;
        }
    };
    match tokio::time::timeout(wait, serve).await {
        Ok(r) => r,
        Err(_) => {
            flows.abandon(&started.state).await;
            Err(Error::authorization(server, format!("no answer from the browser within {} s", wait.as_secs()), false))
        }
    }
}

/// The request target of a `GET` (path and query), or `None`.
async fn read_target(sock: &mut tokio::net::TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), sock.read(&mut buf)).await.ok()?.ok()?;
        if n == 0 || head.len() + n > MAX_HEAD {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = std::str::from_utf8(&head).ok()?.lines().next()?;
    let mut parts = line.split(' ');
    (parts.next()? == "GET").then_some(())?;
    parts.next().map(str::to_owned)
}

async fn answer(sock: &mut tokio::net::TcpStream, status: u16, text: &str) -> std::io::Result<()> {
    let reason = if status == 200 { "OK" } else { "Bad Request" };
    let body = format!("{text}\n");
    let msg = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\ncache-control: no-store\r\n\r\n{body}",
        body.len()
    );
    sock.write_all(msg.as_bytes()).await?;
    sock.shutdown().await
}
