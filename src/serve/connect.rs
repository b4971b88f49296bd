//! Connecting a user to a server with `auth: { type: oauth }` (issue 35):
//!
//! - `GET /auth/{server}/start`: the caller, identified as on every other
//!   route (a key, a verified JWT, the gateway's header; never anonymous or
//!   by body), is sent (302) to the server's authorization endpoint. The
//!   `state` is bound to (server, user), usable once, expires
//!   ([`crate::credentials::PENDING_TTL`]) and is also set in an HttpOnly,
//!   SameSite=Lax cookie scoped to the callback; when `serve.public_url`
//!   is `https`, the cookie is `__Host-mcp_context_auth` (Secure, `Path=/`,
//!   no `Domain`: no other host or path can set or shadow it);
//! - `GET /auth/callback`: the state must be pending and equal to the
//!   cookie (a forged, replayed or another browser's state is refused
//!   before the token endpoint is called), and the caller, identified
//!   from the headers as on every route whatever the source (a key, a
//!   verified JWT, the gateway's user header), must be the state's user:
//!   the check and the taking of the state are one step, so another
//!   identified caller is refused, nothing is stored, and the state is
//!   cancelled (its code came back to someone else: its owner could
//!   otherwise finish it with that user's code). A callback that carries no identity at all (a browser
//!   coming back from the authorization server sends no bearer) is bound
//!   by the cookie alone; one whose identity is refused (an unknown key,
//!   a bad JWT) is refused. The code is exchanged and the tokens stored
//!   for that user; a short text page says so.
//!
//! The redirect URI is `{serve.public_url}/auth/callback` (default
//! `http://{serve.listen}`). No token is logged or shown.
//!
//! Imports the credentials' flows, the proxy's identity and error shapes.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::identity::{FromHeaders, Source};
use super::{AppState, caller};
use crate::credentials::{OAuthFlows, PENDING_TTL};

/// The cookie holding the pending `state`.
const COOKIE: &str = "mcp_context_auth";
/// Its name when `serve.public_url` is `https` (RFC 6265bis `__Host-`).
const HOST_COOKIE: &str = "__Host-mcp_context_auth";

/// The state cookie's name and attributes but its value and `Max-Age`:
/// `__Host-` with `Secure; Path=/` behind `https`, else scoped to the callback.
fn cookie_shape(state: &AppState) -> (&'static str, String) {
    if state.settings.public_url.as_deref().is_some_and(|u| u.starts_with("https://")) {
        (HOST_COOKIE, "HttpOnly; SameSite=Lax; Path=/; Secure".to_owned())
    } else {
        (COOKIE, format!("HttpOnly; SameSite=Lax; Path={}", callback_path(state)))
    }
}

/// The path of the redirect URI (the cookie's `Path`): `/auth/callback`
/// under `serve.public_url`'s own path, if it has one.
fn callback_path(state: &AppState) -> String {
    url::Url::parse(&redirect_uri(state)).map_or_else(|_| "/auth/callback".to_owned(), |u| u.path().to_owned())
}

/// The redirect URI serve registers at authorization servers.
pub(super) fn redirect_uri(state: &AppState) -> String {
    let base = state.settings.public_url.clone().unwrap_or_else(|| format!("http://{}", state.settings.listen));
    format!("{base}/auth/callback")
}

fn flows(state: &AppState) -> Result<&Arc<OAuthFlows>, ApiError> {
    state.oauth.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "unknown_server",
            "No server here connects with OAuth",
        )
    })
}

/// `GET /auth/{server}/start`.
pub(super) async fn start(state: &AppState, req: Request, server: &str) -> Result<Response, ApiError> {
    let flows = flows(state)?;
    if !flows.has_server(server) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "unknown_server",
            "Unknown server: it is not one that users connect with OAuth (`auth: { type: oauth }`)",
        ));
    }
    let (who, _) = caller(state, req.headers()).await?;
    let user = match who {
        FromHeaders::User(id) if matches!(id.source, Source::Key | Source::Jwt | Source::Header) => id.user,
        _ => {
            return Err(ApiError::unauthorized(
                "unidentified",
                "Connecting a server needs an identified caller (a key, a JWT or the gateway's user header)",
            ));
        }
    };
    let started = flows.start(server, &user, &redirect_uri(state)).await.map_err(|e| {
        tracing::warn!(server, user, error = %e, "cannot start an authorization");
        ApiError::new(StatusCode::BAD_GATEWAY, "server_error", "authorization_unavailable", e.to_string())
    })?;
    let (name, attributes) = cookie_shape(state);
    let cookie = format!("{name}={}; {attributes}; Max-Age={}", started.state, PENDING_TTL.as_secs());
    let mut r = StatusCode::FOUND.into_response();
    let h = r.headers_mut();
    h.insert(header::LOCATION, HeaderValue::from_str(&started.url).map_err(|_| bad("the authorization URL"))?);
    h.insert(header::SET_COOKIE, HeaderValue::from_str(&cookie).map_err(|_| bad("the state cookie"))?);
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(r)
}

fn bad(what: &str) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        "internal",
        format!("{what} is not a valid header"),
    )
}

/// `GET /auth/callback?code=..&state=..[&iss=..]` (or `?error=..`).
pub(super) async fn callback(state: &AppState, req: Request) -> Result<Response, ApiError> {
    let flows = flows(state)?;
    let query: Vec<(String, String)> =
        url::form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes()).into_owned().collect();
    let param = |k: &str| {
        let mut all = query.iter().filter(|(n, _)| n == k);
        match (all.next(), all.next()) {
            (Some((_, v)), None) => Some(v.as_str()),
            _ => None,
        }
    };
    let refuse = |why: &str| page(StatusCode::BAD_REQUEST, &format!("Not connected: {why}. Start again."));
    let Some(st) = param("state") else { return Ok(refuse("the answer has no state")) };
    let (name, attributes) = cookie_shape(state);
    let cookie = cookie(req.headers(), name);
    if !cookie.is_some_and(|c| bool::from(c.as_bytes().ct_eq(st.as_bytes()))) {
        tracing::warn!("authorization callback refused: its state is not this browser's");
        return Ok(refuse("this browser did not start this authorization"));
    }
    // The caller, however identified, must be the state's user; `finish` checks it again as it takes the state.
    let me = identified(state, req.headers()).await?;
    if let (Some(me), Some((_, owner))) = (&me, flows.pending_user(st).await)
        && *me != owner
    {
        // Its code came back to someone else: nobody may use it any more, its owner included (who could
        // otherwise finish it with the other user's code and hold their tokens).
        flows.abandon(st).await;
        tracing::warn!("authorization callback refused: another user's state (cancelled)");
        return Ok(refuse("this authorization was started by someone else; it is cancelled"));
    }
    if let Some(e) = param("error") {
        // The state is consumed: an answer without a code cannot finish it later.
        flows.abandon(st).await;
        let e: String = e.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_').take(60).collect();
        return Ok(refuse(&format!("the authorization server said `{e}`")));
    }
    let Some(code) = param("code") else { return Ok(refuse("the answer has no code")) };
    match flows.finish(st, code, param("iss"), me.as_deref()).await {
        Ok(done) => {
            let mut r = page(
                StatusCode::OK,
                &format!("Connected: {} can now use `{}`. You can close this page.", done.user, done.server),
            );
            let clear = format!("{name}=; {attributes}; Max-Age=0");
            r.headers_mut().insert(header::SET_COOKIE, HeaderValue::from_str(&clear).map_err(|_| bad("the cookie"))?);
            Ok(r)
        }
        Err(e) => {
            tracing::warn!(error = %e, "authorization callback refused");
            Ok(refuse(&e.to_string()))
        }
    }
}

/// The callback's caller as the headers identify them (a key, a verified
/// JWT, the gateway's user header); `None` when they carry no identity
/// (nor does `anonymous_user` or the body count as one).
///
/// # Errors
/// The route's 401/400 when they carry one that is refused.
async fn identified(state: &AppState, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let user_header = state.settings.user_header.as_deref().is_some_and(|h| headers.contains_key(h));
    if !headers.contains_key(header::AUTHORIZATION) && !user_header {
        return Ok(None);
    }
    Ok(match caller(state, headers).await?.0 {
        FromHeaders::User(id) if matches!(id.source, Source::Key | Source::Jwt | Source::Header) => Some(id.user),
        _ => None,
    })
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find_map(|(k, v)| (k == name && !v.is_empty()).then_some(v))
}

fn page(status: StatusCode, text: &str) -> Response {
    let mut r = (status, format!("{text}\n")).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}
