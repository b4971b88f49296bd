//! Per-user upstream credentials, the OAuth side (issue 35), against a real
//! authorization server and real MCP servers that verify bearer tokens:
//!
//! - the authorization server is panva's certified `oidc-provider` (pinned
//!   in tests/oidc/package-lock.json) run by tests/oidc/authz.mjs:
//!   authorization code + PKCE with a headless login (the test plays the
//!   browser: it follows the redirects, keeps the cookies, and logs in with
//!   `?login=NAME`), JWT access tokens per resource, rotated refresh tokens,
//!   revocation and RFC 8693 token exchange; its `/__test/log` lists every
//!   grant it issued or refused, by subject, and counts token requests;
//! - the MCP servers are tests/python-mcp/bearer.py on the official Python
//!   SDK's auth support (`mcp` 2.x in the venv target/py-mcp): RFC 9728
//!   metadata, `401` with `resource_metadata`, a JWT whose `aud` must be its
//!   own URL, per-subject resources, and a log of every presented token's
//!   subject and audience.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use mcp_context::credentials::{MemoryTokenStore, OAuthFlows, OAuthServer, TokenExchanger, TokenStore};
use mcp_context::identity::{Identity, IdentitySource, JwtSettings, JwtVerifier};
use mcp_context::settings::{ClientAuthMethod, OAuthSettings, TokenExchangeSettings};
use secrecy::ExposeSecret;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::common::*;
use crate::serve::{Upstream, http};

const IDENTITY_AUDIENCE: &str = "urn:mcp-context";

/// tests/oidc/authz.mjs, stopped when dropped.
pub struct Authz {
    pub issuer: String,
    child: tokio::process::Child,
}

impl Drop for Authz {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

impl Authz {
    /// The authorization server, access tokens living `ttl` seconds; or why it cannot run here.
    pub async fn start(test: &str, ttl: u64) -> Option<Authz> {
        let (child, v) =
            crate::common::start_oidc_fixture(test, "authz.mjs", &[("AUTHZ_ACCESS_TTL", ttl.to_string())]).await?;
        Some(Authz { issuer: v["issuer"].as_str().unwrap().to_owned(), child })
    }

    /// `user`'s own identity token (client_credentials; `sub` = user, `aud` = urn:mcp-context).
    pub async fn identity_token(&self, user: &str) -> String {
        let body = format!(
            "grant_type=client_credentials&client_id={user}&client_secret={user}-secret&scope=api&resource={IDENTITY_AUDIENCE}"
        );
        let r = http()
            .post(format!("{}/token", self.issuer))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .unwrap();
        let v: Value = r.json().await.unwrap();
        v["access_token"].as_str().unwrap_or_else(|| panic!("no token: {v}")).to_owned()
    }

    /// An identity token for `user` that expired an hour ago, signed by the provider.
    pub async fn expired_token(&self, user: &str) -> String {
        let v: Value = http()
            .get(format!("{}/__test/expired?sub={user}", self.issuer))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["token"].as_str().unwrap().to_owned()
    }

    /// The provider's log: `token_requests` and `events` ({grant_type, client, sub, aud, ok, error}).
    pub async fn log(&self) -> Value {
        http().get(format!("{}/__test/log", self.issuer)).send().await.unwrap().json().await.unwrap()
    }

    /// The successful grants of `grant_type` for `sub`.
    pub async fn granted(&self, grant_type: &str, sub: &str) -> Vec<Value> {
        let log = self.log().await;
        log["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ok"] == true && e["grant_type"] == grant_type && e["sub"] == sub)
            .cloned()
            .collect()
    }

    pub async fn token_requests(&self) -> u64 {
        self.log().await["token_requests"].as_u64().unwrap()
    }

    /// Revokes `token` (a refresh token of the public client) at the revocation endpoint.
    pub async fn revoke(&self, token: &str) {
        let r = http()
            .post(format!("{}/token/revocation", self.issuer))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("token={token}&token_type_hint=refresh_token&client_id=mcp-context-public"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
}

/// The venv with the official Python MCP SDK, or why there is none.
pub fn python_mcp(test: &str) -> Option<PathBuf> {
    match crate::sdk::python() {
        Some(p) => Some(p),
        None => {
            skip(test, "no target/py-mcp venv with `mcp` (see .ci/run)");
            None
        }
    }
}

/// tests/python-mcp/bearer.py: an MCP server trusting `issuer`'s tokens for its own URL.
pub struct Mcp {
    pub url: String,
    record: PathBuf,
    _child: tokio::process::Child,
    _dir: tempfile::TempDir,
}

impl Mcp {
    pub async fn start(py: &Path, issuer: &str) -> Mcp {
        Self::start_with(py, issuer, None).await
    }

    /// With `--deny FILE`.
    pub async fn start_with(py: &Path, issuer: &str, deny: Option<&Path>) -> Mcp {
        let dir = tempfile::tempdir().unwrap();
        let (port_file, record) = (dir.path().join("port"), dir.path().join("record.jsonl"));
        let child = tokio::process::Command::new(py)
            .arg(Path::new(ROOT).join("tests/python-mcp/bearer.py"))
            .args(["--jwks", &format!("{issuer}/jwks"), "--issuer", issuer])
            .arg("--record")
            .arg(&record)
            .arg("--port-file")
            .arg(&port_file)
            .args(deny.map(|d| vec!["--deny".as_ref(), d.as_os_str()]).unwrap_or_default())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let port = crate::common::port_from_file(&port_file, "bearer.py").await;
        Mcp { url: format!("http://127.0.0.1:{port}/mcp"), record, _child: child, _dir: dir }
    }

    /// Every token presented so far: {ok, sub, aud} or {ok: false, why, aud}.
    pub fn presented(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// An `initialize` with `token` as the bearer: the HTTP status.
    pub async fn initialize(&self, token: &str) -> u16 {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25",
            "capabilities": {}, "clientInfo": {"name": "oauth-test", "version": "1"}}});
        http()
            .post(&self.url)
            .bearer_auth(token)
            .header("accept", "application/json, text/event-stream")
            .json(&body)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }
}

/// The claims of a JWT (not verified: the test reads what the server issued).
pub fn claims(jwt: &str) -> Value {
    let payload = jwt.split('.').nth(1).unwrap();
    serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
}

/// A browser: follows redirects one at a time, keeps cookies (by name: every
/// server here is 127.0.0.1, and cookies do not separate ports), and logs in
/// at the authorization server's interaction page as `login`.
#[derive(Default)]
pub struct Browser {
    jar: HashMap<String, String>,
}

impl Browser {
    fn client() -> reqwest::Client {
        reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
    }

    /// One GET: (status, Location, body); cookies kept.
    pub async fn get(&mut self, url: &str, bearer: Option<&str>) -> (u16, Option<String>, String) {
        let mut req = Self::client().get(url);
        if !self.jar.is_empty() {
            let c: Vec<String> = self.jar.iter().map(|(k, v)| format!("{k}={v}")).collect();
            req = req.header("cookie", c.join("; "));
        }
        if let Some(b) = bearer {
            req = req.bearer_auth(b);
        }
        let r = req.send().await.unwrap();
        for c in r.headers().get_all("set-cookie") {
            let first = c.to_str().unwrap().split(';').next().unwrap();
            if let Some((k, v)) = first.split_once('=') {
                if v.is_empty() {
                    self.jar.remove(k)
                } else {
                    self.jar.insert(k.to_owned(), v.to_owned())
                };
            }
        }
        let status = r.status().as_u16();
        let location = r.headers().get("location").map(|l| {
            let l = l.to_str().unwrap();
            if l.starts_with('/') { format!("{}{l}", origin(url)) } else { l.to_owned() }
        });
        (status, location, r.text().await.unwrap())
    }

    /// Follows redirects from `url` (at the authorization server), logging in
    /// as `login`, until one points at `until` (the redirect URI): that URL.
    pub async fn authorize(&mut self, url: &str, login: &str, until: &str) -> String {
        let mut next = url.to_owned();
        for _ in 0..10 {
            if next.starts_with(until) {
                return next;
            }
            let target = if next.contains("/interaction/") { format!("{next}?login={login}") } else { next.clone() };
            let (status, location, body) = self.get(&target, None).await;
            next = location.unwrap_or_else(|| panic!("{status} without a redirect at {target}: {body}"));
        }
        panic!("too many redirects");
    }

    pub fn cookie(&self, name: &str) -> Option<&str> {
        self.jar.get(name).map(String::as_str)
    }

    pub fn set_cookie(&mut self, name: &str, value: &str) {
        self.jar.insert(name.to_owned(), value.to_owned());
    }
}

fn origin(url: &str) -> String {
    let u = url::Url::parse(url).unwrap();
    u.origin().ascii_serialization()
}

fn query_param(url: &str, k: &str) -> Option<String> {
    url::Url::parse(url).unwrap().query_pairs().find(|(n, _)| n == k).map(|(_, v)| v.into_owned())
}

fn exchange_settings(issuer: &str, client: &str, auth: ClientAuthMethod) -> TokenExchangeSettings {
    TokenExchangeSettings {
        token_endpoint: None,
        issuer: Some(url::Url::parse(issuer).unwrap()),
        audience: None,
        resource: None,
        scopes: vec!["mcp".into()],
        client_id: client.into(),
        client_secret: Some(format!("{client}-secret").into()),
        client_auth: auth,
        subject_token_type: "urn:ietf:params:oauth:token-type:access_token".into(),
    }
}

pub fn oauth_settings() -> OAuthSettings {
    OAuthSettings {
        client_id: "mcp-context".into(),
        client_secret: Some("mcp-context-secret".to_owned().into()),
        client_auth: ClientAuthMethod::Basic,
        scopes: Vec::new(),
        authorization_server: None,
        resource: None,
        token_endpoint: None,
    }
}

async fn verifier(issuer: &str) -> JwtVerifier {
    let mut s = JwtSettings::new(issuer);
    s.audience = vec![IDENTITY_AUDIENCE.into()];
    JwtVerifier::new(s).await.unwrap()
}

/// RFC 8693 with the caller's verified token: alice's exchanged token has
/// `sub` alice and `aud` the server, bob's bob; a second call is served from
/// the cache (one exchange in the provider's log); each token works at its
/// own server and is refused by the other (audience); an expired subject
/// token is refused cleanly (`reauthorize`, no token in the message); a
/// caller without a token of their own cannot exchange; both client
/// authentications work; nothing of a token in any `Debug`.
#[tokio::test]
async fn token_exchange_per_user_at_a_real_authorization_server() {
    let test = "token_exchange_per_user_at_a_real_authorization_server";
    let Some(authz) = Authz::start(test, 600).await else { return };
    let Some(py) = python_mcp(test) else { return };
    let (s1, s2) = (Mcp::start(&py, &authz.issuer).await, Mcp::start(&py, &authz.issuer).await);
    let v = verifier(&authz.issuer).await;
    let alice = v.verify(&authz.identity_token("alice").await).await.unwrap();
    let bob = v.verify(&authz.identity_token("bob").await).await.unwrap();
    let raw_alice = alice.token.as_ref().unwrap().expose().to_owned();
    assert!(!format!("{alice:?}").contains(&raw_alice), "the caller's token in Debug");

    let ex = TokenExchanger::default();
    let basic = exchange_settings(&authz.issuer, "gateway", ClientAuthMethod::Basic);
    let a1 = ex.token_for("s1", &s1.url, &basic, &alice).await.unwrap();
    let a1_again = ex.token_for("s1", &s1.url, &basic, &alice).await.unwrap();
    let b1 = ex.token_for("s1", &s1.url, &basic, &bob).await.unwrap();
    let (a1, b1) = (a1.access_token.expose_secret().to_owned(), b1.access_token.expose_secret().to_owned());
    assert_eq!(a1, a1_again.access_token.expose_secret(), "served from the cache");
    assert_eq!((claims(&a1)["sub"].as_str(), claims(&a1)["aud"].as_str()), (Some("alice"), Some(s1.url.as_str())));
    assert_eq!((claims(&b1)["sub"].as_str(), claims(&b1)["aud"].as_str()), (Some("bob"), Some(s1.url.as_str())));
    assert_eq!(a1_again.resource, s1.url);
    let exchange = "urn:ietf:params:oauth:grant-type:token-exchange";
    assert_eq!(authz.granted(exchange, "alice").await.len(), 1, "one exchange for two calls");
    assert_eq!(ex.exchanges(), 2);

    // Another server, another audience: client_secret_post this time.
    let post = exchange_settings(&authz.issuer, "gateway-post", ClientAuthMethod::Post);
    let a2 = ex.token_for("s2", &s2.url, &post, &alice).await.unwrap();
    assert_eq!(claims(a2.access_token.expose_secret())["aud"], s2.url.as_str());
    assert!(!format!("{a2:?}").contains(a2.access_token.expose_secret()));

    // Each token works at its own server only.
    assert_eq!(s1.initialize(&a1).await, 200);
    assert_eq!(s1.initialize(&b1).await, 200);
    assert_eq!(s2.initialize(a2.access_token.expose_secret()).await, 200);
    let seen1 = s1.presented();
    assert_eq!(
        seen1.iter().filter(|e| e["ok"] == true).map(|e| e["sub"].as_str().unwrap()).collect::<Vec<_>>(),
        ["alice", "bob"]
    );
    assert!(seen1.iter().chain(s2.presented().iter()).all(|e| e["ok"] == true), "a token reached the wrong server");
    assert!(s2.presented().iter().all(|e| e["aud"] == s2.url.as_str()));

    // An expired subject token: refused by the authorization server, said cleanly.
    let expired = authz.expired_token("carol").await;
    let carol = Identity::new("carol", IdentitySource::Jwt).with_token(expired.clone());
    let e = ex.token_for("s1", &s1.url, &basic, &carol).await.unwrap_err();
    assert!(e.needs_reauthorization(), "{e}");
    assert!(e.to_string().contains("invalid_grant") && !e.to_string().contains(&expired), "{e}");
    // A caller identified by a key holds no token to exchange.
    let keyed = Identity::new("dave", IdentitySource::Key);
    let e = ex.token_for("s1", &s1.url, &basic, &keyed).await.unwrap_err();
    assert!(!e.needs_reauthorization() && e.to_string().contains("serve.jwt"), "{e}");
    // A wrong client secret: a configuration problem, not the user's.
    let mut wrong = basic.clone();
    wrong.client_secret = Some("nope".to_owned().into());
    let e = ex.token_for("s3", &s1.url, &wrong, &bob).await.unwrap_err();
    assert!(!e.needs_reauthorization() && e.to_string().contains("invalid_client"), "{e}");
}

/// The authorization code flow driven end to end through `serve`'s
/// endpoints, the test playing alice's browser against the real provider:
/// discovery from the MCP server's 401, PKCE, `resource`, `iss`; the tokens
/// end up in the store for alice only, and work at the server as alice.
/// Then the attacker's attempts: a forged state, a replayed callback, bob's
/// state in alice's browser, bob's state with bob's cookie but alice's key,
/// a callback without the cookie, unknown and odd server names, an
/// unidentified start: none stores a token or reaches the token endpoint.
#[tokio::test]
async fn authorization_code_through_serves_endpoints() {
    let test = "authorization_code_through_serves_endpoints";
    let Some(authz) = Authz::start(test, 600).await else { return };
    let Some(py) = python_mcp(test) else { return };
    let drive = Mcp::start(&py, &authz.issuer).await;
    let up = Upstream::start().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let tag = tag();
    let yaml = format!(
        "servers:\n{}policy: {:?}\ncontext:\n  max_tokens: 4000\nserve:\n{}  public_url: {url}\n",
        demo_server("demo", &tag),
        policies_dir().join("default.yaml"),
        crate::serve::default_serve()
    );
    let config = config(&yaml);
    let ctx = Arc::new(mcp_context::McpContext::from_config(&config).await.unwrap());
    let store = Arc::new(MemoryTokenStore::default());
    let servers = HashMap::from([(
        "drive".to_owned(),
        OAuthServer { url: url::Url::parse(&drive.url).unwrap(), settings: oauth_settings() },
    )]);
    let flows = Arc::new(OAuthFlows::new(servers, store.clone()));
    let proxy = mcp_context::serve::Proxy::new(ctx.clone(), &config, &up.base).unwrap().with_oauth(flows.clone());
    let app = proxy.router();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    // Alice connects.
    let mut browser = Browser::default();
    let (status, location, _) = browser.get(&format!("{url}/auth/drive/start"), Some("key-alice")).await;
    assert_eq!(status, 302);
    let to_authz = location.unwrap();
    assert!(to_authz.starts_with(&format!("{}/auth?", authz.issuer)), "{to_authz}");
    assert_eq!(query_param(&to_authz, "resource").as_deref(), Some(drive.url.as_str()));
    assert_eq!(query_param(&to_authz, "code_challenge_method").as_deref(), Some("S256"));
    assert_eq!(query_param(&to_authz, "redirect_uri"), Some(format!("{url}/auth/callback")));
    let state = query_param(&to_authz, "state").unwrap();
    assert_eq!(browser.cookie("mcp_context_auth"), Some(state.as_str()));
    let callback = browser.authorize(&to_authz, "alice", &format!("{url}/auth/callback")).await;
    assert_eq!(query_param(&callback, "iss").as_deref(), Some(authz.issuer.as_str()), "RFC 9207");
    let (status, _, page) = browser.get(&callback, None).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Connected: alice"), "{page}");
    let held = store.get("drive", "alice").await.unwrap().expect("alice's tokens stored");
    assert!(store.get("drive", "bob").await.unwrap().is_none());
    assert_eq!(held.resource, drive.url);
    assert!(held.refresh_token.is_some());
    let access = held.access_token.expose_secret().to_owned();
    assert_eq!(
        (claims(&access)["sub"].as_str(), claims(&access)["aud"].as_str()),
        (Some("alice"), Some(drive.url.as_str()))
    );
    assert!(!page.contains(&access));
    assert_eq!(drive.initialize(&access).await, 200);
    assert_eq!(drive.presented().last().unwrap()["sub"], "alice");
    assert_eq!(authz.granted("authorization_code", "alice").await.len(), 1);

    // The state cookie: HttpOnly, SameSite=Lax, only sent to the callback.
    let raw = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let r = raw.get(format!("{url}/auth/drive/start")).header("X-Test-User", "dave").send().await.unwrap();
    let set = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(set.contains("; HttpOnly; SameSite=Lax; Path=/auth/callback; Max-Age=600"), "{set}");

    // The attacker's attempts, none of which may reach the token endpoint.
    let before = authz.token_requests().await;
    let cb = |state: &str| format!("{url}/auth/callback?code=stolen-or-made-up&state={state}");
    // A forged state, with a matching forged cookie.
    let mut mallory = Browser::default();
    mallory.set_cookie("mcp_context_auth", "forged");
    let (status, _, page) = mallory.get(&cb("forged"), None).await;
    assert_eq!(status, 400, "{page}");
    // Replaying alice's successful callback (her state is used up).
    let (status, _, _) = browser.get(&callback, None).await;
    assert_eq!(status, 400);
    // Bob's pending state, finished in alice's browser (her cookie holds her own new state).
    let mut bobs = Browser::default();
    let (_, bob_location, _) = bobs.get(&format!("{url}/auth/drive/start"), Some("key-bob")).await;
    let bob_state = query_param(&bob_location.unwrap(), "state").unwrap();
    let (_, _, _) = browser.get(&format!("{url}/auth/drive/start"), Some("key-alice")).await;
    let (status, _, page) = browser.get(&cb(&bob_state), None).await;
    assert_eq!(status, 400, "{page}");
    // Bob's state with bob's cookie, but the request identified as alice.
    let (status, _, page) = bobs.get(&cb(&bob_state), Some("key-alice")).await;
    assert_eq!(status, 400, "{page}");
    assert!(page.contains("someone else"), "{page}");
    // No cookie at all.
    let (status, _, _) = Browser::default().get(&cb(&bob_state), None).await;
    assert_eq!(status, 400);
    // Unknown or odd server names, and an unidentified caller.
    for path in ["/auth/nope/start", "/auth/demo/start"] {
        let (status, _, _) = Browser::default().get(&format!("{url}{path}"), Some("key-alice")).await;
        assert_eq!(status, 404, "{path}");
    }
    for path in ["/auth/..%2Fdrive/start", "/auth/dr%2Fve/start", "/auth/drive%00/start", "/auth/%2e%2e/start"] {
        let (status, _, _) = Browser::default().get(&format!("{url}{path}"), Some("key-alice")).await;
        // The client itself resolves `%2e%2e` (to `/start`, unmatched): 404; the others are refused as paths.
        let expected = if path.contains("%2e") { 404 } else { 400 };
        assert_eq!(status, expected, "{path}");
    }
    let (status, _, _) = Browser::default().get(&format!("{url}/auth/drive/start"), None).await;
    assert_eq!(status, 401);
    let (status, _, _) = Browser::default().get(&format!("{url}/auth/drive/start"), Some("key-unknown")).await;
    assert_eq!(status, 401);
    assert_eq!(authz.token_requests().await, before, "an attack reached the token endpoint");
    assert!(store.get("drive", "bob").await.unwrap().is_none());
    assert_eq!(store.get("drive", "alice").await.unwrap().unwrap().access_token.expose_secret(), access);
    // Pending authorizations are bounded per user.
    for _ in 0..10 {
        let _ = Browser::default().get(&format!("{url}/auth/drive/start"), Some("key-carol")).await;
    }
    // Pending: alice's second start, dave's, and carol's last ones (bob's was cancelled when alice came back
    // with it).
    assert_eq!(flows.pending_count(), 2 + mcp_context::credentials::PENDING_PER_USER);
    server.abort();
    ctx.close().await;
}

/// The loopback login of `mcp-context auth login` (library side), then
/// refresh and revocation: with access tokens that live less than the
/// refresh window, asking for alice's token refreshes it (a refresh grant
/// in the provider's log, the rotated token stored); once her refresh token
/// is revoked, asking again deletes her tokens and says she must connect
/// again (no error), while bob, connected too, is untouched.
#[tokio::test]
async fn loopback_login_refresh_and_revocation() {
    let test = "loopback_login_refresh_and_revocation";
    let Some(authz) = Authz::start(test, 30).await else { return };
    let Some(py) = python_mcp(test) else { return };
    let drive = Mcp::start(&py, &authz.issuer).await;
    let store = Arc::new(MemoryTokenStore::default());
    let mut settings = oauth_settings();
    // A public client this time, and discovery from the config's authorization server.
    settings.client_id = "mcp-context-public".into();
    settings.client_secret = None;
    settings.client_auth = ClientAuthMethod::None;
    settings.authorization_server = Some(url::Url::parse(&authz.issuer).unwrap());
    settings.scopes = vec!["openid".into(), "mcp".into()];
    let servers =
        HashMap::from([("drive".to_owned(), OAuthServer { url: url::Url::parse(&drive.url).unwrap(), settings })]);
    let flows = Arc::new(OAuthFlows::new(servers, store.clone()));

    for user in ["alice", "bob"] {
        let (tx, rx) = tokio::sync::oneshot::channel::<String>();
        let f = flows.clone();
        let login = tokio::spawn(async move {
            mcp_context::credentials::loopback_login(&f, "drive", user, Duration::from_secs(60), |u| {
                tx.send(u.to_owned()).unwrap();
            })
            .await
        });
        let url = rx.await.unwrap();
        let redirect = query_param(&url, "redirect_uri").unwrap();
        assert!(redirect.starts_with("http://127.0.0.1:") && redirect.ends_with("/callback"), "{redirect}");
        let mut browser = Browser::default();
        // A stray request with another state cannot end the flow.
        let (status, _, _) = browser.get(&format!("{redirect}?code=x&state=not-it"), None).await;
        assert_eq!(status, 400);
        let back = browser.authorize(&url, user, &redirect).await;
        let (status, _, page) = browser.get(&back, None).await;
        assert_eq!(status, 200, "{page}");
        let done = login.await.unwrap().unwrap();
        assert_eq!(done.user, user);
    }
    let first = store.get("drive", "alice").await.unwrap().unwrap();
    assert_eq!(claims(first.access_token.expose_secret())["sub"], "alice");

    // Within the refresh window: refreshed, rotated, stored.
    let fresh = flows.token("drive", "alice").await.unwrap().expect("refreshed");
    assert_ne!(fresh.access_token.expose_secret(), first.access_token.expose_secret());
    assert_ne!(
        fresh.refresh_token.as_ref().unwrap().expose_secret(),
        first.refresh_token.as_ref().unwrap().expose_secret()
    );
    assert_eq!(claims(fresh.access_token.expose_secret())["sub"], "alice");
    assert_eq!(authz.granted("refresh_token", "alice").await.len(), 1);
    assert_eq!(drive.initialize(fresh.access_token.expose_secret()).await, 200);

    // Revoked: alice must connect again; bob is untouched.
    authz.revoke(fresh.refresh_token.as_ref().unwrap().expose_secret()).await;
    let after = flows.token("drive", "alice").await.unwrap();
    assert!(after.is_none(), "{}", authz.log().await);
    assert!(store.get("drive", "alice").await.unwrap().is_none(), "the refused tokens are deleted");
    let state = flows.state("drive", "alice", Some("/auth/drive/start".into())).await;
    assert_eq!(
        state,
        mcp_context::credentials::CredentialState::NeedsAuthorization { url: Some("/auth/drive/start".into()) }
    );
    let bobs = flows.token("drive", "bob").await.unwrap().expect("bob still connected");
    assert_eq!(claims(bobs.access_token.expose_secret())["sub"], "bob");
    assert_eq!(flows.refreshes(), 3);
}

/// A running `mcp-context serve` at debug level (its stderr kept to look for tokens).
struct Serve {
    url: String,
    child: tokio::process::Child,
    log: PathBuf,
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

async fn serve_at_debug(config: &Path, upstream: &str, dir: &Path) -> Serve {
    let log = dir.join("serve.log");
    let mut child = tokio::process::Command::new(MCP_CONTEXT)
        .args(["serve", "--config"])
        .arg(config)
        .args(["--listen", "127.0.0.1:0", "--upstream", upstream])
        .env("MCP_CONTEXT_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await.unwrap().unwrap();
    let line = line.unwrap_or_else(|| panic!("serve exited: {}", std::fs::read_to_string(&log).unwrap()));
    let url = line.split("listening on ").nth(1).unwrap().split(',').next().unwrap().to_owned();
    Serve { url, child, log }
}

const STORE_KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

/// End to end through the binaries: `serve` connects alice to an `oauth`
/// server through `/auth/drive/start` (the test playing her browser), and
/// her next chat completion carries her view of that server (her resources,
/// as the server decides from her token), while bob's says
/// `needs_authorization` and carries none of it; then `mcp-context auth
/// login drive --user bob` connects bob through the loopback redirect, and
/// his next request carries his own view. The MCP server saw alice's token
/// only for alice's requests and bob's only for bob's, each for its own
/// audience; nothing of any token is in serve's debug log or the CLI's.
#[tokio::test]
async fn serve_connects_a_user_and_injects_their_view_and_cli_login() {
    let test = "serve_connects_a_user_and_injects_their_view_and_cli_login";
    let Some(authz) = Authz::start(test, 600).await else { return };
    let Some(py) = python_mcp(test) else { return };
    let drive = Mcp::start(&py, &authz.issuer).await;
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.yaml");
    let yaml = format!(
        "servers:\n  drive:\n    url: {}\n    auth: {{ type: oauth, client_id: mcp-context, client_secret: mcp-context-secret }}\n\
         context:\n  max_tokens: 4000\ncredentials:\n  store: file\n  path: {}\n  key: \"{STORE_KEY}\"\n\
         serve:\n  upstream_api_key: sk-upstream-1\n{}",
        drive.url,
        dir.path().join("tokens.json").display(),
        crate::serve::keys_yaml()
    );
    std::fs::write(&config, yaml).unwrap();
    let serve = serve_at_debug(&config, &up.base, dir.path()).await;
    let chat = |key: &'static str| {
        http()
            .post(format!("{}/v1/chat/completions", serve.url))
            .bearer_auth(key)
            .json(&crate::serve::chat_body("what are my notes?"))
            .send()
    };

    // Before connecting: needs_authorization, pointing at this proxy's start URL.
    let r = chat("key-alice").await.unwrap();
    assert_eq!(r.status(), 200);
    let auth = r.headers()["x-mcp-context-auth"].to_str().unwrap().to_owned();
    assert!(auth.starts_with("drive=needs_authorization"), "{auth}");

    // Alice connects through serve.
    let mut browser = Browser::default();
    let (status, location, body) = browser.get(&format!("{}/auth/drive/start", serve.url), Some("key-alice")).await;
    assert_eq!(status, 302, "{body}");
    let back = browser.authorize(&location.unwrap(), "alice", &format!("{}/auth/callback", serve.url)).await;
    let (status, _, page) = browser.get(&back, None).await;
    assert_eq!(status, 200, "{page}");

    let r = chat("key-alice").await.unwrap();
    assert_eq!(r.headers()["x-mcp-context-auth"].to_str().unwrap(), "drive=connected");
    let r = chat("key-bob").await.unwrap();
    assert!(r.headers()["x-mcp-context-auth"].to_str().unwrap().starts_with("drive=needs_authorization"));
    let seen = up.seen();
    let system = |i: usize| seen[i].body["messages"][0]["content"].as_str().unwrap_or_default().to_owned();
    let alices = system(seen.len() - 2);
    assert!(alices.contains("notes of alice.") && !alices.contains("of bob"), "{alices}");
    assert!(!system(seen.len() - 1).contains("drive://"), "bob got drive's context: {}", system(seen.len() - 1));

    // Bob connects with the CLI's loopback login.
    let mut login = tokio::process::Command::new(MCP_CONTEXT)
        .args(["auth", "login", "drive", "--user", "bob", "--wait-s", "60", "--config"])
        .arg(&config)
        .env("MCP_CONTEXT_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(login.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), out.next_line()).await.unwrap().unwrap().unwrap();
    let url = line.strip_prefix("open: ").unwrap().to_owned();
    let redirect = query_param(&url, "redirect_uri").unwrap();
    let mut bobs = Browser::default();
    let back = bobs.authorize(&url, "bob", &redirect).await;
    let (status, _, page) = bobs.get(&back, None).await;
    assert_eq!(status, 200, "{page}");
    let done = login.wait_with_output().await.unwrap();
    let cli_log = String::from_utf8_lossy(&done.stderr).into_owned();
    assert!(done.status.success(), "{cli_log}");

    let r = chat("key-bob").await.unwrap();
    assert_eq!(r.headers()["x-mcp-context-auth"].to_str().unwrap(), "drive=connected");
    let bobs_context = up.seen().last().unwrap().body["messages"][0]["content"].as_str().unwrap().to_owned();
    assert!(bobs_context.contains("notes of bob.") && !bobs_context.contains("of alice"), "{bobs_context}");

    // Whose token reached the MCP server: each user's for their own requests, each for this server's audience.
    let presented = drive.presented();
    assert!(presented.iter().all(|e| e["ok"] == true && e["aud"] == drive.url.as_str()), "{presented:?}");
    let subs: std::collections::BTreeSet<&str> = presented.iter().map(|e| e["sub"].as_str().unwrap()).collect();
    assert_eq!(subs, ["alice", "bob"].into_iter().collect());

    // Nothing of any token in the logs at debug.
    let store = mcp_context::credentials::FileTokenStore::new(
        dir.path().join("tokens.json"),
        mcp_context::credentials::Sealer::new(&mcp_context::settings::SecretKey::parse(STORE_KEY).unwrap()),
    );
    let serve_log = std::fs::read_to_string(&serve.log).unwrap();
    assert!(serve_log.contains("DEBUG") || serve_log.contains("debug"), "the log is at debug");
    for user in ["alice", "bob"] {
        let t = store.get("drive", user).await.unwrap().expect("stored");
        let secrets = [t.access_token.expose_secret().to_owned(), t.refresh_token.unwrap().expose_secret().to_owned()];
        for s in secrets {
            let tail = &s[s.len().saturating_sub(20)..];
            for log in [&serve_log, &cli_log] {
                assert!(!log.contains(&s) && !log.contains(tail), "a token of {user} in a log");
            }
        }
    }
    let raw = std::fs::read_to_string(dir.path().join("tokens.json")).unwrap();
    assert!(!raw.contains("eyJ"), "tokens are sealed at rest");
}

/// Token exchange end to end through `serve`: callers present their own
/// identity tokens (verified by `serve.jwt`); before each injection serve
/// exchanges them (RFC 8693) at the authorization server for a token for
/// the MCP server, and each user's view carries their own resources. Two
/// requests per user cost one exchange per user (the provider's log); the
/// MCP server only ever saw tokens for its own audience, each user's for
/// that user (never a caller's identity token); a caller identified by a
/// key holds no token to exchange and gets `needs_authorization`.
#[tokio::test]
async fn token_exchange_through_serve() {
    let test = "token_exchange_through_serve";
    let Some(authz) = Authz::start(test, 600).await else { return };
    let Some(py) = python_mcp(test) else { return };
    let jira = Mcp::start(&py, &authz.issuer).await;
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.yaml");
    let yaml = format!(
        "servers:\n  jira:\n    url: {}\n    auth: {{ type: token_exchange, issuer: \"{}\", client_id: gateway, client_secret: gateway-secret, scopes: [mcp] }}\n\
         context:\n  max_tokens: 4000\ncredentials:\n  store: memory\n\
         serve:\n  upstream_api_key: sk-upstream-1\n{}  jwt:\n    issuer: \"{}\"\n    audience: [{IDENTITY_AUDIENCE}]\n",
        jira.url,
        authz.issuer,
        crate::serve::keys_yaml(),
        authz.issuer,
    );
    std::fs::write(&config, yaml).unwrap();
    let serve = serve_at_debug(&config, &up.base, dir.path()).await;
    let (alice, bob) = (authz.identity_token("alice").await, authz.identity_token("bob").await);
    let chat = |key: String| {
        http()
            .post(format!("{}/v1/chat/completions", serve.url))
            .bearer_auth(key)
            .json(&crate::serve::chat_body("what are my notes?"))
            .send()
    };
    for (user, token) in [("alice", &alice), ("bob", &bob), ("alice", &alice), ("bob", &bob)] {
        let r = chat(token.clone()).await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-mcp-context-auth"].to_str().unwrap(), "jira=connected", "{user}");
        let context = up.seen().last().unwrap().body["messages"][0]["content"].as_str().unwrap_or_default().to_owned();
        let other = if user == "alice" { "bob" } else { "alice" };
        assert!(
            context.contains(&format!("notes of {user}.")) && !context.contains(&format!("of {other}")),
            "{context}"
        );
    }
    let exchange = "urn:ietf:params:oauth:grant-type:token-exchange";
    assert_eq!(authz.granted(exchange, "alice").await.len(), 1);
    assert_eq!(authz.granted(exchange, "bob").await.len(), 1);
    let presented = jira.presented();
    assert!(presented.iter().all(|e| e["ok"] == true && e["aud"] == jira.url.as_str()), "{presented:?}");
    let subs: std::collections::BTreeSet<&str> = presented.iter().map(|e| e["sub"].as_str().unwrap()).collect();
    assert_eq!(subs, ["alice", "bob"].into_iter().collect());

    let metrics = http().get(format!("{}/metrics", serve.url)).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("mcp_context_upstream_token_grants_total{kind=\"exchange\"} 2"), "{metrics}");

    // A key-identified caller has no token of their own to exchange.
    let r = chat("key-carol".into()).await.unwrap();
    assert!(r.headers()["x-mcp-context-auth"].to_str().unwrap().starts_with("jira=needs_authorization"));
    let log = std::fs::read_to_string(&serve.log).unwrap();
    for t in [&alice, &bob] {
        assert!(!log.contains(t.as_str()) && !log.contains(&t[t.len() - 20..]), "a caller's token in the log");
    }
}

/// Two `serve` replicas over one Redis (the credential store and the shared
/// cache): alice starts connecting at the first, and the redirect comes back
/// to the second (as a load balancer may send it), which finishes it from
/// the sealed pending record in Redis; replayed at the first, it is refused
/// (used once in all replicas). The first injects her view with the token
/// the second obtained; bob, connected nowhere, gets `needs_authorization`
/// from both. Redis holds her pending authorization and her tokens sealed
/// (no JWT, no verifier, no user name in any key or value).
#[tokio::test]
async fn replicas_share_pending_authorizations_and_tokens() {
    let test = "replicas_share_pending_authorizations_and_tokens";
    let url = std::env::var("MCP_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
    let Ok(mut redis) = redis::Client::open(url.as_str()).and_then(|c| c.get_connection()) else {
        return skip(test, "no Redis");
    };
    let Some(authz) = Authz::start(test, 600).await else { return };
    let Some(py) = python_mcp(test) else { return };
    let drive = Mcp::start(&py, &authz.issuer).await;
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = format!("mcp-context-test:{}:", tag());
    let config = dir.path().join("c.yaml");
    let yaml = format!(
        "servers:\n  drive:\n    url: {}\n    auth: {{ type: oauth, client_id: mcp-context, client_secret: mcp-context-secret }}\n\
         context:\n  max_tokens: 4000\ncredentials:\n  store: redis\n  key: \"{STORE_KEY}\"\n\
         cache:\n  backend: redis\n  url: {url}\n  key_prefix: \"{prefix}\"\n\
         serve:\n  upstream_api_key: sk-upstream-1\n{}",
        drive.url,
        crate::serve::keys_yaml()
    );
    std::fs::write(&config, yaml).unwrap();
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = serve_at_debug(&config, &up.base, d1.path()).await;
    let second = serve_at_debug(&config, &up.base, d2.path()).await;

    let mut browser = Browser::default();
    let (_, location, _) = browser.get(&format!("{}/auth/drive/start", first.url), Some("key-alice")).await;
    // Pending, the authorization is in Redis for every replica, sealed: no user name, verifier or state in clear.
    let pending: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}oauth-pending:*")).query(&mut redis).unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    let location = location.unwrap();
    let state = query_param(&location, "state").unwrap();
    let raw: Vec<u8> = redis::cmd("GET").arg(&pending[0]).query(&mut redis).unwrap();
    for s in ["alice", "drive", "verifier", &state] {
        assert!(!raw.windows(s.len()).any(|w| w == s.as_bytes()) && !pending[0].contains(s), "{s} in clear");
    }
    let back = browser.authorize(&location, "alice", &format!("{}/auth/callback", first.url)).await;
    // A load balancer sends the redirect to the other replica: it finishes the authorization there.
    let (status, _, page) = browser.get(&back.replacen(&first.url, &second.url, 1), None).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Connected: alice"), "{page}");
    // Used once in all replicas: the same redirect, cookie and all, replayed at the first is refused.
    browser.jar.insert("mcp_context_auth".into(), state);
    let (status, _, page) = browser.get(&back, None).await;
    assert_eq!(status, 400, "{page}");
    assert!(page.contains("already used"), "{page}");

    let chat = |base: &str, key: &str| {
        http()
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth(key)
            .json(&crate::serve::chat_body("what are my notes?"))
            .send()
    };
    let r = chat(&first.url, "key-alice").await.unwrap();
    assert_eq!(r.headers()["x-mcp-context-auth"].to_str().unwrap(), "drive=connected");
    let context = up.seen().last().unwrap().body["messages"][0]["content"].as_str().unwrap_or_default().to_owned();
    assert!(context.contains("notes of alice."), "{context}");
    for base in [&first.url, &second.url] {
        let r = chat(base, "key-bob").await.unwrap();
        assert!(r.headers()["x-mcp-context-auth"].to_str().unwrap().starts_with("drive=needs_authorization"));
    }
    assert_eq!(authz.granted("authorization_code", "alice").await.len(), 1, "one authorization for both replicas");
    assert!(drive.presented().iter().all(|e| e["ok"] == true && e["sub"] == "alice"));

    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}*")).query(&mut redis).unwrap();
    assert!(keys.iter().any(|k| k.starts_with(&format!("{prefix}cred:drive:"))), "{keys:?}");
    for k in &keys {
        assert!(!k.contains("alice"), "{k}");
        let dump: Vec<u8> = redis::cmd("DUMP").arg(k).query(&mut redis).unwrap();
        assert!(!String::from_utf8_lossy(&dump).contains("eyJ"), "a JWT in clear in Redis key {k}");
    }
    if !keys.is_empty() {
        let _: redis::RedisResult<()> = redis::cmd("DEL").arg(&keys).query(&mut redis);
    }
}

/// The server refuses alice's (valid, unexpired) token: that request says
/// `denied_by_server` and her token is refreshed once (one refresh grant);
/// refused again, her tokens are dropped and she is asked to connect again
/// (`needs_authorization`), never given anyone else's token; once the
/// server accepts her again and she reconnects, she is `connected`.
#[tokio::test]
async fn a_refused_token_is_refreshed_once_then_the_user_reconnects() {
    let test = "a_refused_token_is_refreshed_once_then_the_user_reconnects";
    let Some(authz) = Authz::start(test, 600).await else { return };
    let Some(py) = python_mcp(test) else { return };
    let dir = tempfile::tempdir().unwrap();
    let deny = dir.path().join("deny");
    let drive = Mcp::start_with(&py, &authz.issuer, Some(&deny)).await;
    let up = Upstream::start().await;
    let config = dir.path().join("c.yaml");
    let yaml = format!(
        "servers:\n  drive:\n    url: {}\n    auth: {{ type: oauth, client_id: mcp-context, client_secret: mcp-context-secret }}\n\
         context:\n  max_tokens: 4000\ncredentials:\n  store: file\n  path: {}\n  key: \"{STORE_KEY}\"\n\
         serve:\n  upstream_api_key: sk-upstream-1\n{}",
        drive.url,
        dir.path().join("tokens.json").display(),
        crate::serve::keys_yaml()
    );
    std::fs::write(&config, yaml).unwrap();
    let serve = serve_at_debug(&config, &up.base, dir.path()).await;
    let connect = async || {
        let mut browser = Browser::default();
        let (_, location, _) = browser.get(&format!("{}/auth/drive/start", serve.url), Some("key-alice")).await;
        let back = browser.authorize(&location.unwrap(), "alice", &format!("{}/auth/callback", serve.url)).await;
        assert_eq!(browser.get(&back, None).await.0, 200);
    };
    let state = async || {
        let r = http()
            .post(format!("{}/v1/chat/completions", serve.url))
            .bearer_auth("key-alice")
            .json(&crate::serve::chat_body("what are my notes?"))
            .send()
            .await
            .unwrap();
        r.headers()["x-mcp-context-auth"].to_str().unwrap().split(';').next().unwrap().to_owned()
    };
    connect().await;
    assert_eq!(state().await, "drive=connected");
    std::fs::write(&deny, "alice\n").unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(state().await);
    }
    assert_eq!(seen.last().unwrap(), "drive=needs_authorization", "{seen:?}");
    assert!(seen.contains(&"drive=denied_by_server".to_owned()), "{seen:?}");
    assert_eq!(authz.granted("refresh_token", "alice").await.len(), 1, "refreshed once: {seen:?}");
    std::fs::write(&deny, "").unwrap();
    connect().await;
    assert_eq!(state().await, "drive=connected");
    assert!(drive.presented().iter().all(|e| e["sub"] == "alice" && e["aud"] == drive.url.as_str()));
}
