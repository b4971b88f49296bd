//! What OAuth discovery may believe (issue 47, items 2 and 4), tried as an
//! attacker would against the real `mcp-context serve`: a hostile MCP server
//! whose protected resource metadata names another server's URL as its
//! `resource` (to collect that server's tokens), a hostile authorization
//! server issuing a token for another audience, metadata naming an internal
//! URL with a query as its authorization server, and an authorization
//! server naming a token endpoint on another origin (to collect our client
//! secret, the code and the PKCE verifier). Assertions are on what reached
//! each listener (its request log), the real authorization server's log of
//! grants (tests/oidc/authz.mjs), what the MCP servers were presented, and
//! the token store.
//!
//! The hostile parties are small recording listeners here; the honest ones
//! are the real fixtures of tests/all/oauth.rs (oidc-provider, the Python
//! SDK's bearer-checking MCP server).

use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use mcp_context::credentials::TokenStore;
use serde_json::{Value, json};

use crate::attack::Got;
use crate::common::*;
use crate::oauth::{Authz, Browser, Mcp, claims, python_mcp};
use crate::serve::{Proxy, Upstream, chat_body, keys_yaml};

const STORE_KEY: &str = "8899aabbccddeeff00112233445566778899aabbccddeeff0011223344556677";

type Answer = Arc<dyn Fn(&Got, &str) -> Response + Send + Sync>;
type RecorderState = (Arc<Mutex<Vec<Got>>>, Answer, Arc<str>);

/// A listener on loopback that records every request it receives and
/// answers with `answer(request, its own base URL)`.
struct Recorder {
    base: String,
    got: Arc<Mutex<Vec<Got>>>,
    stop: tokio_util::sync::CancellationToken,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Recorder {
    async fn start(answer: impl Fn(&Got, &str) -> Response + Send + Sync + 'static) -> Recorder {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let got = Arc::new(Mutex::new(Vec::new()));
        let state: RecorderState = (got.clone(), Arc::new(answer), Arc::from(base.as_str()));
        let router = Router::new().fallback(record).with_state(state);
        let stop = tokio_util::sync::CancellationToken::new();
        let s2 = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).with_graceful_shutdown(s2.cancelled_owned()).await;
        });
        Recorder { base, got, stop }
    }

    fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }
}

async fn record(State((got, answer, base)): State<RecorderState>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20).await.unwrap_or_default();
    let g = Got {
        method: parts.method.to_string(),
        target: parts.uri.to_string(),
        headers: parts.headers.iter().map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned())).collect(),
        body,
    };
    got.lock().unwrap().push(g.clone());
    answer(&g, &base)
}

/// An MCP server that is only an OAuth protected resource: `401` naming its
/// metadata to anything, and metadata naming `resource` (its own URL when
/// `None`) and `authorization_servers`. Its URL is `{base}/mcp`.
async fn protected_resource(resource: Option<String>, authorization_servers: Vec<String>) -> Recorder {
    Recorder::start(move |got, base| {
        if got.target.starts_with("/.well-known/oauth-protected-resource") {
            let resource = resource.clone().unwrap_or_else(|| format!("{base}/mcp"));
            return axum::Json(json!({"resource": resource, "authorization_servers": authorization_servers,
                "scopes_supported": ["mcp"]}))
            .into_response();
        }
        let challenge = format!(r#"Bearer resource_metadata="{base}/.well-known/oauth-protected-resource/mcp""#);
        (StatusCode::UNAUTHORIZED, [("www-authenticate", challenge)]).into_response()
    })
    .await
}

/// An unsigned JWT with these claims (what a token endpoint may answer).
fn jwt(claims: Value) -> String {
    let b64 = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    format!("{}.{}.c2ln", b64(&json!({"alg": "RS256", "typ": "at+jwt"})), b64(&claims))
}

/// A token endpoint answer whose access token is a JWT for `aud`.
fn token_answer(aud: &str) -> Response {
    axum::Json(json!({"access_token": jwt(json!({"sub": "alice", "aud": aud, "exp": 4_000_000_000u64})),
        "token_type": "Bearer", "expires_in": 3600, "refresh_token": "refresh-1"}))
    .into_response()
}

/// An authorization server that authorizes anything at once (302 back to
/// the redirect URI with a code), names `token_endpoint` (its own `/token`
/// when `None`) and issues there JWTs for `aud`.
async fn authorization_server(token_endpoint: Option<String>, aud: &'static str) -> Recorder {
    Recorder::start(move |got, base| {
        let path = got.target.split('?').next().unwrap_or_default();
        match (got.method.as_str(), path) {
            ("GET", "/.well-known/oauth-authorization-server") => axum::Json(json!({"issuer": base,
                "authorization_endpoint": format!("{base}/authorize"),
                "token_endpoint": token_endpoint.clone().unwrap_or_else(|| format!("{base}/token")),
                "code_challenge_methods_supported": ["S256"]}))
            .into_response(),
            ("GET", "/authorize") => {
                let q = |k: &str| query_param(&format!("{base}{}", got.target), k).unwrap_or_default();
                let back = format!("{}?code=code-1&state={}", q("redirect_uri"), q("state"));
                (StatusCode::FOUND, [("location", back)]).into_response()
            }
            ("POST", "/token") => token_answer(aud),
            _ => StatusCode::NOT_FOUND.into_response(),
        }
    })
    .await
}

fn query_param(url: &str, k: &str) -> Option<String> {
    url::Url::parse(url).unwrap().query_pairs().find(|(n, _)| n == k).map(|(_, v)| v.into_owned())
}

/// A serve config with these `servers:` entries, tokens in a file in `dir`.
fn config(servers: &str, dir: &Path) -> String {
    format!(
        "servers:\n{servers}context:\n  max_tokens: 4000\ncredentials:\n  store: file\n  path: {}\n  key: \"{STORE_KEY}\"\n\
         serve:\n  upstream_api_key: sk-upstream-1\n{}",
        dir.join("tokens.json").display(),
        keys_yaml()
    )
}

fn oauth_entry(name: &str, url: &str, more: &str) -> String {
    format!("  {name}:\n    url: {url}\n    auth: {{ type: oauth, client_id: mcp-context{more} }}\n")
}

fn token_store(dir: &Path) -> mcp_context::credentials::FileTokenStore {
    mcp_context::credentials::FileTokenStore::new(
        dir.join("tokens.json"),
        mcp_context::credentials::Sealer::new(&mcp_context::settings::SecretKey::parse(STORE_KEY).unwrap()),
    )
}

/// Alice's browser at `/auth/{server}/start`, following wherever the proxy
/// sends her (the authorization server, then back to the callback): the
/// start's (status, body) and the callback's (status, page), if reached.
async fn connect(serve: &Proxy, server: &str) -> ((u16, String), Option<(u16, String)>) {
    let mut browser = Browser::default();
    let (status, location, body) = browser.get(&format!("{}/auth/{server}/start", serve.url), Some("key-alice")).await;
    let Some(to) = location.filter(|_| status == 302) else { return ((status, body), None) };
    let back = browser.authorize(&to, "alice", &format!("{}/auth/callback", serve.url)).await;
    let (s, _, page) = browser.get(&back, None).await;
    ((status, body), Some((s, page)))
}

/// Alice's chat: the `x-mcp-context-auth` states by server.
async fn alices_states(serve: &Proxy) -> std::collections::BTreeMap<String, String> {
    let r =
        serve.post("/v1/chat/completions", Some("key-alice"), &chat_body("what are my notes?")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let h = r.headers().get("x-mcp-context-auth").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    h.split("; ").filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
}

/// The bearer tokens a listener was presented.
fn bearers(got: &[Got]) -> Vec<String> {
    got.iter().filter_map(|g| g.headers.get("authorization")?.strip_prefix("Bearer ").map(str::to_owned)).collect()
}

/// Item 2. `evil` and `payroll` share one (real) authorization server;
/// evil's protected resource metadata names payroll's URL as its resource.
/// Before, `/auth/evil/start` asked for a token for payroll, stored it under
/// evil and sent evil a bearer for payroll. Now the start is refused (502,
/// naming both URLs), the authorization server issues nothing for payroll in
/// evil's flow, and evil is never presented a token at all; alice then
/// connects payroll itself, whose token reaches payroll only.
#[tokio::test]
async fn a_server_naming_another_servers_resource_gets_no_token_for_it() {
    let test = "a_server_naming_another_servers_resource_gets_no_token_for_it";
    let Some(authz) = Authz::start(test, 600).await else { return };
    let Some(py) = python_mcp(test) else { return };
    let payroll = Mcp::start(&py, &authz.issuer).await;
    let evil = protected_resource(Some(payroll.url.clone()), vec![authz.issuer.clone()]).await;
    let evil_url = format!("{}/mcp", evil.base);
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let secret = ", client_secret: mcp-context-secret";
    let servers = oauth_entry("evil", &evil_url, secret) + &oauth_entry("payroll", &payroll.url, secret);
    let serve = Proxy::start_config(&config(&servers, dir.path()), &up.base, tag()).await;

    let ((status, body), callback) = connect(&serve, "evil").await;
    let states = alices_states(&serve).await;
    let log = authz.log().await;
    let for_payroll =
        |log: &Value| log["events"].as_array().unwrap().iter().filter(|e| e["aud"] == payroll.url.as_str()).count();
    assert_eq!(for_payroll(&log), 0, "the authorization server issued a token for payroll in evil's flow: {log}");
    assert_eq!(log["token_requests"], 0, "{log}");
    let presented = bearers(&evil.got());
    let auds: Vec<Value> = presented.iter().map(|t| claims(t)["aud"].clone()).collect();
    assert!(presented.is_empty(), "evil was presented bearers for {auds:?}");
    assert_eq!(status, 502, "{body} / {callback:?}");
    assert!(body.contains(&payroll.url) && body.contains(&evil_url) && body.contains("RFC 9728"), "{body}");
    assert_eq!(states.get("evil").map(String::as_str), Some("needs_authorization"), "{states:?}");
    assert!(token_store(dir.path()).get("evil", "alice").await.unwrap().is_none());

    // Payroll's own flow still works, and its token goes to payroll only.
    let ((status, body), callback) = connect(&serve, "payroll").await;
    assert_eq!(status, 302, "{body}");
    let (status, page) = callback.unwrap();
    assert!(status == 200 && page.contains("Connected: alice"), "{page}");
    assert_eq!(alices_states(&serve).await.get("payroll").map(String::as_str), Some("connected"));
    assert_eq!(for_payroll(&authz.log().await), 1, "one grant for payroll, in payroll's flow");
    assert!(payroll.presented().iter().all(|e| e["ok"] == true && e["aud"] == payroll.url.as_str()));
    assert!(payroll.presented().iter().any(|e| e["sub"] == "alice"));
    assert!(bearers(&evil.got()).is_empty(), "evil was presented a bearer");
}

/// Item 2. An authorization server answers the code with a JWT whose `aud`
/// is another server's: before, it was stored and presented to the server;
/// now the callback refuses it (naming the audience), nothing is stored,
/// and the server is never presented a token.
#[tokio::test]
async fn a_token_for_another_audience_is_refused_and_not_stored() {
    let foreign = "https://payroll.example/mcp";
    let authz = authorization_server(None, foreign).await;
    let drive = protected_resource(None, vec![authz.base.clone()]).await;
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let servers = oauth_entry("drive", &format!("{}/mcp", drive.base), "");
    let serve = Proxy::start_config(&config(&servers, dir.path()), &up.base, tag()).await;

    let ((status, body), callback) = connect(&serve, "drive").await;
    assert_eq!(status, 302, "{body}");
    let states = alices_states(&serve).await;
    let presented = bearers(&drive.got());
    assert!(presented.is_empty(), "drive was presented {} bearer(s) for {foreign}", presented.len());
    assert!(authz.got().iter().any(|g| g.method == "POST"), "the code was exchanged");
    let (status, page) = callback.expect("the browser came back");
    assert_eq!(status, 400, "{page}");
    assert!(page.contains(foreign) && page.contains("another audience") && page.contains("not stored"), "{page}");
    assert!(token_store(dir.path()).get("drive", "alice").await.unwrap().is_none(), "stored");
    assert_eq!(states.get("drive").map(String::as_str), Some("needs_authorization"), "{states:?}");
}

/// Item 4. Metadata naming `http://127.0.0.1:I/internal/admin/purge?confirm=yes`
/// as its authorization server: before, discovery sent three GETs with that
/// path and query to the internal listener; now nothing reaches it, the
/// start says why (a query), and a server listing a proper authorization
/// server after it is sent to that one.
#[tokio::test]
async fn discovery_sends_nothing_to_an_authorization_server_url_with_a_query() {
    let internal = Recorder::start(|_, _| StatusCode::NOT_FOUND.into_response()).await;
    let purge = format!("{}/internal/admin/purge?confirm=yes", internal.base);
    let good = authorization_server(None, "unused").await;
    let only_bad = protected_resource(None, vec![purge.clone()]).await;
    let bad_then_good = protected_resource(None, vec![purge.clone(), good.base.clone()]).await;
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let servers = oauth_entry("purge", &format!("{}/mcp", only_bad.base), "")
        + &oauth_entry("fallback", &format!("{}/mcp", bad_then_good.base), "");
    let serve = Proxy::start_config(&config(&servers, dir.path()), &up.base, tag()).await;

    let mut browser = Browser::default();
    let (status, _, body) = browser.get(&format!("{}/auth/purge/start", serve.url), Some("key-alice")).await;
    let (fb_status, fb_location, fb_body) =
        browser.get(&format!("{}/auth/fallback/start", serve.url), Some("key-alice")).await;
    let reached: Vec<String> = internal.got().iter().map(|g| format!("{} {}", g.method, g.target)).collect();
    assert!(reached.is_empty(), "the internal listener was sent {reached:?}");
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("query") && body.contains("authorization_server"), "{body}");
    assert!(!body.contains("confirm=yes"), "{body}");
    assert_eq!(fb_status, 302, "{fb_body}");
    assert!(fb_location.unwrap().starts_with(&format!("{}/authorize?", good.base)));
}

/// A listener answering every POST as a token endpoint would (an opaque token).
async fn token_collector() -> Recorder {
    Recorder::start(|got, _| match got.method.as_str() {
        "POST" => {
            axum::Json(json!({"access_token": "opaque-1", "token_type": "Bearer", "expires_in": 3600})).into_response()
        }
        _ => StatusCode::NOT_FOUND.into_response(),
    })
    .await
}

const SECRET: &str = "s3cret-of-mcp-context";

fn basic_secret() -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("mcp-context:{SECRET}"))
}

/// Item 4. An authorization server (on loopback, as the MCP server is)
/// whose metadata names a token endpoint on another origin: before, the
/// callback POSTed the client secret, the code and the PKCE verifier there;
/// now the start is refused (naming the origin and `token_endpoint`) and
/// nothing at all reaches that origin, nor the secret the authorization
/// server.
#[tokio::test]
async fn no_secret_or_code_goes_to_a_token_endpoint_on_another_origin() {
    let collector = token_collector().await;
    let authz = authorization_server(Some(format!("{}/token", collector.base)), "unused").await;
    let drive = protected_resource(None, vec![authz.base.clone()]).await;
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let servers = oauth_entry("drive", &format!("{}/mcp", drive.base), &format!(", client_secret: {SECRET}"));
    let serve = Proxy::start_config(&config(&servers, dir.path()), &up.base, tag()).await;

    let ((status, body), callback) = connect(&serve, "drive").await;
    let reached: Vec<String> = collector.got().iter().map(|g| format!("{} {}", g.method, g.target)).collect();
    assert!(reached.is_empty(), "the other origin was sent {reached:?} (callback: {callback:?})");
    for g in authz.got() {
        let raw = format!("{:?} {}", g.headers, String::from_utf8_lossy(&g.body));
        assert!(!raw.contains(SECRET) && !raw.contains(&basic_secret()), "the secret reached the authorization server");
    }
    assert_eq!(status, 502, "{body}");
    assert!(body.contains(&collector.base) && body.contains("token_endpoint"), "{body}");
    assert!(token_store(dir.path()).get("drive", "alice").await.unwrap().is_none(), "stored");
}

/// Item 4. The same token endpoint on another origin, named by the operator
/// (`token_endpoint` in the server's `auth:` block): then it is the one used,
/// with the client secret, the code and the verifier.
#[tokio::test]
async fn a_configured_token_endpoint_on_another_origin_is_used() {
    let collector = token_collector().await;
    let authz = authorization_server(Some(format!("{}/token", collector.base)), "unused").await;
    let drive = protected_resource(None, vec![authz.base.clone()]).await;
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let more = format!(", client_secret: {SECRET}, token_endpoint: \"{}/token\"", collector.base);
    let servers = oauth_entry("drive", &format!("{}/mcp", drive.base), &more);
    let serve = Proxy::start_config(&config(&servers, dir.path()), &up.base, tag()).await;

    let ((status, body), callback) = connect(&serve, "drive").await;
    assert_eq!(status, 302, "{body}");
    let (status, page) = callback.unwrap();
    assert!(status == 200 && page.contains("Connected: alice"), "{page}");
    let posts: Vec<Got> = collector.got().into_iter().filter(|g| g.method == "POST").collect();
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0].headers.get("authorization"), Some(&format!("Basic {}", basic_secret())));
    let form = String::from_utf8_lossy(&posts[0].body).into_owned();
    assert!(form.contains("code=code-1") && form.contains("code_verifier="), "{form}");
    assert!(authz.got().iter().all(|g| g.method == "GET"), "nothing POSTed to the metadata's issuer");
}
