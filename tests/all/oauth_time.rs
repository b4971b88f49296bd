//! Issue 47, items 3 and 5, as an attacker tries them against the real
//! `mcp-context serve`:
//!
//! - a silent authorization server (its token endpoint accepts and never
//!   answers) must not stall anyone: the caller whose refresh or token
//!   exchange it holds is answered within `credentials.auth_timeout_ms`
//!   with that server left out (`auth_timeout`) and the others injected;
//!   users who would have shared the old 64-stripe refresh lock with her
//!   (names found by brute force over the old `stripe()`), on the same
//!   server or another, are served at once;
//! - the OAuth callback is completed only by the caller that started it,
//!   whatever identifies them (the gateway's header, a key), and behind an
//!   `https` public URL the state cookie is `__Host-`.
//!
//! The authorization server is a small one on loopback ([`FakeAs`]: RFC
//! 8414 metadata, an authorization endpoint that logs in whoever the test
//! names, a token endpoint that logs every request and never answers a
//! refresh token starting with `stall` nor any token exchange); the MCP
//! servers are the fixture over Streamable HTTP, logging every
//! `Authorization` they are sent. Token exchange callers prove who they are
//! with JWTs of the real `oidc-provider` (tests/oidc).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::extract::{Form, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use mcp_context::credentials::{FileTokenStore, Sealer, TokenSet, TokenStore};
use secrecy::SecretString;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::attack::raw_http;
use crate::common::*;
use crate::serve::{Proxy, Upstream, chat_body, default_serve, http};

/// The sealing key of these tests' token files.
const KEY: &str = "6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b";
/// Longer than any wait the proxy may impose (3 s by default): a request
/// not answered by then was held by the authorization server.
const CLIENT_PATIENCE: Duration = Duration::from_secs(12);

// ------------------------------------------------------------ the authorization server

/// An authorization server on loopback; see the module docs.
struct FakeAs {
    issuer: String,
    log: Arc<Mutex<Vec<Value>>>,
    _stop: tokio_util::sync::DropGuard,
}

#[derive(Clone)]
struct AsState {
    issuer: String,
    log: Arc<Mutex<Vec<Value>>>,
}

impl FakeAs {
    async fn start() -> FakeAs {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let issuer = format!("http://{}", listener.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let state = AsState { issuer: issuer.clone(), log: log.clone() };
        let router = Router::new()
            .route("/.well-known/oauth-authorization-server", get(as_metadata))
            .route("/authorize", get(as_authorize))
            .route("/token", post(as_token))
            .with_state(state);
        let stop = CancellationToken::new();
        let s = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).with_graceful_shutdown(s.cancelled_owned()).await;
        });
        FakeAs { issuer, log, _stop: stop.drop_guard() }
    }

    /// Every token request so far: {grant_type, refresh_token, code}.
    fn log(&self) -> Vec<Value> {
        self.log.lock().unwrap().clone()
    }

    fn grants(&self, grant_type: &str) -> Vec<Value> {
        self.log().into_iter().filter(|e| e["grant_type"] == grant_type).collect()
    }

    /// Waits until the token endpoint received a request satisfying `what`.
    async fn received(&self, what: impl Fn(&Value) -> bool) {
        let t = Instant::now();
        while !self.log().iter().any(&what) {
            assert!(t.elapsed() < Duration::from_secs(20), "the token endpoint never got it: {:?}", self.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn as_metadata(State(s): State<AsState>) -> axum::Json<Value> {
    axum::Json(json!({
        "issuer": s.issuer,
        "authorization_endpoint": format!("{}/authorize", s.issuer),
        "token_endpoint": format!("{}/token", s.issuer),
        "authorization_response_iss_parameter_supported": true,
    }))
}

/// Logs in `login` (no questions asked) and sends the browser back with a code of theirs.
async fn as_authorize(State(s): State<AsState>, Query(q): Query<HashMap<String, String>>) -> Response {
    let enc = |v: &str| url::form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>();
    let to = format!(
        "{}?code=code-{}&state={}&iss={}",
        q["redirect_uri"],
        enc(&q["login"]),
        enc(&q["state"]),
        enc(&s.issuer)
    );
    (StatusCode::FOUND, [("location", to)]).into_response()
}

async fn as_token(State(s): State<AsState>, Form(f): Form<HashMap<String, String>>) -> Response {
    let grant = f.get("grant_type").cloned().unwrap_or_default();
    let field = |k: &str| f.get(k).cloned().unwrap_or_default();
    s.log
        .lock()
        .unwrap()
        .push(json!({"grant_type": grant, "refresh_token": field("refresh_token"), "code": field("code")}));
    if grant.ends_with(":token-exchange") || field("refresh_token").starts_with("stall") {
        // Accepts, and never answers.
        std::future::pending::<()>().await;
    }
    let who = match grant.as_str() {
        "authorization_code" => field("code").strip_prefix("code-").map(|w| (w.to_owned(), "code")),
        "refresh_token" => field("refresh_token").strip_prefix("rt-").map(|w| (w.to_owned(), "refreshed")),
        _ => None,
    };
    let Some((who, how)) = who else {
        return (StatusCode::BAD_REQUEST, axum::Json(json!({"error": "invalid_grant"}))).into_response();
    };
    axum::Json(json!({"access_token": format!("at-{who}-{how}"), "token_type": "Bearer", "expires_in": 600,
        "refresh_token": format!("rt-{who}")}))
    .into_response()
}

// ------------------------------------------------------------ an MCP server that logs what it is sent

/// The fixture over Streamable HTTP (one resource, `{prefix}-fx://doc/0`),
/// logging the `Authorization` of every request.
struct Mcp {
    url: String,
    seen: Arc<Mutex<Vec<String>>>,
    _stop: tokio_util::sync::DropGuard,
}

impl Mcp {
    async fn start(prefix: &str) -> Mcp {
        use rmcp::transport::streamable_http_server::{
            StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
        };
        let stop = CancellationToken::new();
        let fixture = Fixture::new(Options { n: 1, prefix: format!("{prefix}-"), ..Options::default() });
        let service = StreamableHttpService::new(
            move || Ok(fixture.clone()),
            LocalSessionManager::default().into(),
            StreamableHttpServerConfig::default().with_cancellation_token(stop.child_token()),
        );
        let seen = Arc::new(Mutex::new(Vec::new()));
        let router = Router::new()
            .nest_service("/mcp", service)
            .layer(axum::middleware::from_fn_with_state(seen.clone(), log_authorization));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let s = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).with_graceful_shutdown(s.cancelled_owned()).await;
        });
        Mcp { url, seen, _stop: stop.drop_guard() }
    }

    /// The distinct `Authorization` values it was sent.
    fn authorizations(&self) -> Vec<String> {
        let mut v = self.seen.lock().unwrap().clone();
        v.sort();
        v.dedup();
        v
    }
}

async fn log_authorization(
    State(seen): State<Arc<Mutex<Vec<String>>>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(a) = req.headers().get("authorization") {
        seen.lock().unwrap().push(a.to_str().unwrap_or("<not text>").to_owned());
    }
    next.run(req).await
}

// ------------------------------------------------------------ set-up

/// The refresh lock's stripe of (server, user) before the fix: 64 stripes
/// by Rust's `DefaultHasher` with fixed keys (src/credentials/oauth.rs at
/// dcf7b2e), so anyone could compute which names share alice's.
fn old_stripe(server: &str, user: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (server, user).hash(&mut h);
    h.finish() % 64
}

/// A user name starting with `base` whose old stripe at `server` is the one of `like`.
fn collider(base: &str, server: &str, like: (&str, &str)) -> String {
    let target = old_stripe(like.0, like.1);
    (0..).map(|i| format!("{base}{i}")).find(|u| old_stripe(server, u) == target).unwrap()
}

/// Stores, for each (server, user, refresh token), an access token that
/// expired 5 s ago: the user's next request must refresh it first.
async fn expired_tokens(path: &Path, held: &[(&str, &str, &str, &str)]) {
    let store = FileTokenStore::new(path, Sealer::new(&mcp_context::settings::SecretKey::parse(KEY).unwrap()));
    for (server, url, user, refresh) in held {
        let mut t = TokenSet::bearer(SecretString::from(format!("at-{user}-old")), *url);
        t.refresh_token = Some(SecretString::from((*refresh).to_owned()));
        t.expires_at = Some(SystemTime::now() - Duration::from_secs(5));
        store.put(server, user, &t).await.unwrap();
    }
}

/// `demo` (shared, stdio) and these `oauth` servers of `authz`; the token
/// file at `tokens`; `serve` the default one plus `serve_extra`.
fn config(authz: &FakeAs, oauth: &[(&str, &Mcp)], tokens: &Path, tag: &str, serve_extra: &str) -> String {
    let mut s = format!("servers:\n{}", demo_server("demo", tag));
    for (name, mcp) in oauth {
        s.push_str(&format!(
            "  {name}:\n    url: {}\n    auth: {{ type: oauth, client_id: mcp-context, client_secret: mcp-context-secret, \
             authorization_server: \"{}\" }}\n",
            mcp.url, authz.issuer
        ));
    }
    s + &format!(
        "context:\n  max_tokens: 4000\ncredentials:\n  store: file\n  path: {}\n  key: \"{KEY}\"\nserve:\n{}{serve_extra}",
        tokens.display(),
        default_serve()
    )
}

/// What one chat completion of `user` (identified by the gateway's header) got.
struct Answer {
    took: Duration,
    status: u16,
    /// `x-mcp-context-auth`, by server.
    auth: HashMap<String, String>,
}

async fn chat(proxy: &Proxy, user: &str, bearer: Option<&str>) -> Result<Answer, String> {
    let t = Instant::now();
    let mut req = http()
        .post(format!("{}/v1/chat/completions", proxy.url))
        .json(&chat_body(&format!("what are the documents of {user}?")))
        .timeout(CLIENT_PATIENCE);
    req = match bearer {
        Some(b) => req.bearer_auth(b),
        None => req.header("X-Test-User", user),
    };
    let r = req.send().await.map_err(|e| {
        format!("{user}'s request was not answered within {} s ({e}): the authorization server held it", 12)
    })?;
    let auth = r
        .headers()
        .get("x-mcp-context-auth")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
        .split("; ")
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.split(';').next().unwrap().to_owned()))
        .collect();
    Ok(Answer { took: t.elapsed(), status: r.status().as_u16(), auth })
}

/// The system message the upstream received with `user`'s question.
fn context_of(up: &Upstream, user: &str) -> String {
    let question = format!("what are the documents of {user}?");
    let seen = up.seen();
    let req = seen
        .iter()
        .rev()
        .find(|s| s.body["messages"].as_array().is_some_and(|m| m.iter().any(|m| m["content"] == question.as_str())))
        .unwrap_or_else(|| panic!("{user}'s request never reached the upstream"));
    req.body["messages"][0]["content"].as_str().unwrap_or_default().to_owned()
}

// ------------------------------------------------------------ item 3: a silent authorization server

/// Alice's token for `drive` expired; its refresh goes to a token endpoint
/// that accepts and never answers. Her request is still answered, within
/// the default `credentials.auth_timeout_ms` (3 s) and the same again of
/// slack, with `drive` left out (`auth_timeout`, the reason in the report's
/// failed servers, in serve's log) and `demo`'s context injected; the
/// refresh did reach the authorization server, and `drive` was never sent
/// her old token. Before the fix the request hung (no answer in 12 s).
#[tokio::test]
async fn a_silent_token_endpoint_leaves_the_server_out_within_the_timeout() {
    let (authz, drive, up) = (FakeAs::start().await, Mcp::start("drive").await, Upstream::start().await);
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.json");
    expired_tokens(&tokens, &[("drive", &drive.url, "alice", "stall-alice")]).await;
    let tag = tag();
    let proxy = Proxy::start_config(&config(&authz, &[("drive", &drive)], &tokens, &tag, ""), &up.base, tag).await;

    let a = chat(&proxy, "alice", None).await.unwrap();
    assert_eq!(a.status, 200);
    assert!(a.took < Duration::from_secs(6), "answered only after {:?}", a.took);
    assert_eq!(a.auth.get("drive").map(String::as_str), Some("auth_timeout"), "{:?}", a.auth);
    let context = context_of(&up, "alice");
    assert!(context.contains("demo://docs/guide"), "the other servers' context is injected: {context}");
    assert!(!context.contains("drive-fx://"), "{context}");
    assert_eq!(authz.grants("refresh_token").len(), 1, "the refresh reached the authorization server once");
    assert!(drive.authorizations().is_empty(), "drive was sent {:?}", drive.authorizations());
    let log = proxy.stderr();
    assert!(log.contains("did not answer in time") && !log.contains("stall-alice"), "{log}");
}

/// Alice's refresh at `drive` hangs at the authorization server; bob7...,
/// whose name put him on alice's stripe of the old 64-stripe lock, needs a
/// refresh at `drive` too, sent while alice's waits: his request is served
/// at once (well under alice's 3 s wait), his refreshed token reaches
/// `drive`, and the provider refreshed for him. Before the fix bob waited
/// for alice's refresh, forever (no answer in 12 s).
#[tokio::test]
async fn a_user_sharing_the_old_stripe_is_not_held_by_anothers_refresh() {
    let bob = collider("bob", "drive", ("drive", "alice"));
    a_stalled_refresh_holds_nobody_else(&bob, "drive").await;
}

/// The same across servers: alice's refresh at `drive` hangs; carol...,
/// chosen so that (jira, carol...) had alice's old stripe at drive, needs a
/// refresh at `jira` (same authorization server): served at once.
#[tokio::test]
async fn a_stalled_refresh_at_one_server_holds_no_user_of_another() {
    let carol = collider("carol", "jira", ("drive", "alice"));
    a_stalled_refresh_holds_nobody_else(&carol, "jira").await;
}

async fn a_stalled_refresh_holds_nobody_else(other: &str, other_server: &str) {
    let (authz, up) = (FakeAs::start().await, Upstream::start().await);
    let (drive, jira) = (Mcp::start("drive").await, Mcp::start("jira").await);
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.json");
    let other_url = if other_server == "drive" { &drive.url } else { &jira.url };
    let refresh = format!("rt-{other}");
    expired_tokens(
        &tokens,
        &[("drive", &drive.url, "alice", "stall-alice"), (other_server, other_url, other, &refresh)],
    )
    .await;
    let tag = tag();
    let yaml = config(&authz, &[("drive", &drive), ("jira", &jira)], &tokens, &tag, "");
    let proxy = Arc::new(Proxy::start_config(&yaml, &up.base, tag).await);

    let p = proxy.clone();
    let alice = tokio::spawn(async move { chat(&p, "alice", None).await });
    // Alice's refresh is at the authorization server, unanswered: whatever lock it takes is taken.
    authz.received(|e| e["refresh_token"] == "stall-alice").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let theirs = chat(&proxy, other, None).await.unwrap();
    assert_eq!(theirs.status, 200);
    assert!(theirs.took < Duration::from_millis(1500), "{other} waited {:?} for alice's refresh", theirs.took);
    assert!(!alice.is_finished(), "alice's request was still waiting when {other}'s was served");
    assert_eq!(theirs.auth.get(other_server).map(String::as_str), Some("connected"), "{:?}", theirs.auth);
    assert!(
        authz.log().iter().any(|e| e["refresh_token"] == refresh.as_str()),
        "{other}'s refresh reached the authorization server: {:?}",
        authz.log()
    );
    let mcp = if other_server == "drive" { &drive } else { &jira };
    assert!(mcp.authorizations().contains(&format!("Bearer at-{other}-refreshed")), "{:?}", mcp.authorizations());
    assert!(context_of(&up, other).contains(&format!("{other_server}-fx://doc/0")));
    // Alice's own request ends too, drive left out.
    let a = alice.await.unwrap().unwrap();
    assert_eq!(a.auth.get("drive").map(String::as_str), Some("auth_timeout"), "{:?}", a.auth);
    assert!(!drive.authorizations().iter().any(|a| a.contains("alice")), "{:?}", drive.authorizations());
}

/// `token_exchange` whose token endpoint accepts and never answers: two
/// JWT callers (tokens of the real oidc-provider, verified by `serve.jwt`),
/// each sending two requests at once, are all answered within the bound,
/// `jira` left out (`auth_timeout`) and `demo` injected; the exchange
/// reached the endpoint once per user (one flight per user, not one per
/// request). Before the fix every request hung.
#[tokio::test]
async fn a_silent_token_exchange_endpoint_holds_no_jwt_caller() {
    let test = "a_silent_token_exchange_endpoint_holds_no_jwt_caller";
    let Some(idp) = crate::oauth::Authz::start(test, 600).await else { return };
    let (authz, jira, up) = (FakeAs::start().await, Mcp::start("jira").await, Upstream::start().await);
    let tag = tag();
    let yaml = format!(
        "servers:\n{}  jira:\n    url: {}\n    auth: {{ type: token_exchange, token_endpoint: \"{}/token\", client_id: gateway, \
         client_secret: gateway-secret }}\ncontext:\n  max_tokens: 4000\ncredentials:\n  store: memory\n\
         serve:\n{}  jwt:\n    issuer: \"{}\"\n    audience: [urn:mcp-context]\n",
        demo_server("demo", &tag),
        jira.url,
        authz.issuer,
        default_serve(),
        idp.issuer
    );
    let proxy = Proxy::start_config(&yaml, &up.base, tag).await;
    let (alice, bob) = (idp.identity_token("alice").await, idp.identity_token("bob").await);
    let calls = [("alice", &alice), ("bob", &bob), ("alice", &alice), ("bob", &bob)]
        .map(|(user, token)| chat(&proxy, user, Some(token.as_str())));
    for a in futures::future::join_all(calls).await {
        let a = a.unwrap();
        assert_eq!(a.status, 200);
        assert!(a.took < Duration::from_secs(6), "answered only after {:?}", a.took);
        assert_eq!(a.auth.get("jira").map(String::as_str), Some("auth_timeout"), "{:?}", a.auth);
    }
    for user in ["alice", "bob"] {
        assert!(context_of(&up, user).contains("demo://docs/guide"));
    }
    let exchanges = authz.grants("urn:ietf:params:oauth:grant-type:token-exchange");
    assert_eq!(exchanges.len(), 2, "one exchange per user: {exchanges:?}");
    assert!(jira.authorizations().is_empty(), "{:?}", jira.authorizations());
}

// ------------------------------------------------------------ item 5: the callback's identity

/// A raw GET with these extra header lines: (status, head, body).
async fn raw_get(base: &str, path: &str, headers: &str) -> (u16, String, String) {
    raw_http(base, &format!("GET {path} HTTP/1.1\nHost: {{host}}\n{headers}Connection: close\n\n"), b"").await
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn path_and_query(url: &str) -> String {
    let u = url::Url::parse(url).unwrap();
    format!("{}?{}", u.path(), u.query().unwrap_or(""))
}

/// Mallory starts connecting `drive` as herself (`X-Test-User: mallory`)
/// and gets alice's code (alice logs in at the authorization server); the
/// callback with mallory's state and cookie but alice's gateway header is
/// refused, and so is it with alice's key; the state is then used up, so
/// mallory finishing it as herself is refused too. The token endpoint was
/// never called, nothing is stored for either (both still
/// `needs_authorization`), and `drive` never saw any token. Before the fix
/// the header callback answered "Connected: mallory".
#[tokio::test]
async fn the_callback_is_refused_to_anyone_but_the_caller_who_started_it() {
    let (authz, drive, up) = (FakeAs::start().await, Mcp::start("drive").await, Upstream::start().await);
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.json");
    let tag = tag();
    let proxy = Proxy::start_config(&config(&authz, &[("drive", &drive)], &tokens, &tag, ""), &up.base, tag).await;

    let mut attempts = Vec::new();
    for impostor in ["X-Test-User: alice\n", "Authorization: Bearer key-alice\n"] {
        let (status, head, body) = raw_get(&proxy.url, "/auth/drive/start", "X-Test-User: mallory\n").await;
        assert_eq!(status, 302, "{head}{body}");
        let to_authz = header(&head, "location").unwrap().to_owned();
        let cookie = header(&head, "set-cookie").unwrap().split(';').next().unwrap().to_owned();
        let state =
            url::Url::parse(&to_authz).unwrap().query_pairs().find(|(k, _)| k == "state").unwrap().1.into_owned();
        assert_eq!(cookie, format!("mcp_context_auth={state}"));
        // Alice logs in at the authorization server: the code that comes back is hers.
        let r = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
            .get(format!("{to_authz}&login=alice"))
            .send()
            .await
            .unwrap();
        let back = r.headers()["location"].to_str().unwrap().to_owned();
        assert!(back.contains("code=code-alice"), "{back}");
        let callback = path_and_query(&back);
        let (status, _, page) = raw_get(&proxy.url, &callback, &format!("Cookie: {cookie}\n{impostor}")).await;
        assert_eq!(status, 400, "{impostor}: {page}");
        assert!(page.contains("someone else") && !page.contains("Connected"), "{page}");
        attempts.push((callback, cookie));
    }
    // The states are used up: mallory, as herself, cannot finish them with alice's code either.
    for (callback, cookie) in &attempts {
        let (status, _, page) =
            raw_get(&proxy.url, callback, &format!("Cookie: {cookie}\nX-Test-User: mallory\n")).await;
        assert_eq!(status, 400, "{page}");
    }
    assert!(authz.grants("authorization_code").is_empty(), "the code was redeemed: {:?}", authz.log());
    for user in ["mallory", "alice"] {
        let a = chat(&proxy, user, None).await.unwrap();
        assert_eq!(a.auth.get("drive").map(String::as_str), Some("needs_authorization"), "{user}: {:?}", a.auth);
        assert!(!context_of(&up, user).contains("drive-fx://"));
    }
    assert!(drive.authorizations().is_empty(), "drive was sent {:?}", drive.authorizations());
}

/// Behind `serve.public_url: https://...` the state cookie is
/// `__Host-mcp_context_auth` (Secure, `Path=/`, no `Domain`); the callback
/// accepts it (and not the same state under the old name, which a sibling
/// host could set), and alice's next request reaches `drive` with her
/// token. Before the fix the cookie was `mcp_context_auth` with
/// `Path=/auth/callback`.
#[tokio::test]
async fn behind_https_the_state_cookie_is_host_prefixed_and_accepted() {
    let (authz, drive, up) = (FakeAs::start().await, Mcp::start("drive").await, Upstream::start().await);
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.json");
    let tag = tag();
    let public = "https://proxy.example.test";
    let yaml = config(&authz, &[("drive", &drive)], &tokens, &tag, &format!("  public_url: {public}\n"));
    let proxy = Proxy::start_config(&yaml, &up.base, tag).await;

    let (status, head, _) = raw_get(&proxy.url, "/auth/drive/start", "X-Test-User: alice\n").await;
    assert_eq!(status, 302, "{head}");
    let set = header(&head, "set-cookie").unwrap().to_owned();
    let attrs: Vec<&str> = set.split(';').map(str::trim).collect();
    assert!(attrs[0].starts_with("__Host-mcp_context_auth="), "{set}");
    for a in ["Secure", "Path=/", "HttpOnly", "SameSite=Lax"] {
        assert!(attrs.contains(&a), "{a} missing: {set}");
    }
    assert!(!attrs.iter().any(|a| a.to_ascii_lowercase().starts_with("domain")), "{set}");
    let cookie = attrs[0].to_owned();
    let state = cookie.split_once('=').unwrap().1.to_owned();
    let to_authz = header(&head, "location").unwrap().to_owned();
    let r = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(format!("{to_authz}&login=alice"))
        .send()
        .await
        .unwrap();
    let back = r.headers()["location"].to_str().unwrap().to_owned();
    assert!(back.starts_with(&format!("{public}/auth/callback?")), "{back}");
    let callback = path_and_query(&back);
    // The same state under the name without the prefix is not this browser's cookie.
    let (status, _, _) = raw_get(&proxy.url, &callback, &format!("Cookie: mcp_context_auth={state}\n")).await;
    assert_eq!(status, 400);
    let (status, head, page) = raw_get(&proxy.url, &callback, &format!("Cookie: {cookie}\nX-Test-User: alice\n")).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Connected: alice"), "{page}");
    let cleared = header(&head, "set-cookie").unwrap();
    assert!(cleared.starts_with("__Host-mcp_context_auth=;") && cleared.contains("Max-Age=0"), "{cleared}");
    assert_eq!(authz.grants("authorization_code").len(), 1);
    let a = chat(&proxy, "alice", None).await.unwrap();
    assert_eq!(a.auth.get("drive").map(String::as_str), Some("connected"), "{:?}", a.auth);
    assert_eq!(drive.authorizations(), ["Bearer at-alice-code"]);
}
