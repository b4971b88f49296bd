//! Verified OIDC/JWT callers (issue 34), against a real OpenID Connect
//! provider: panva's `oidc-provider` (pinned in tests/oidc/package-lock.json),
//! started by each test as a child process on a free loopback port
//! (tests/oidc/provider.mjs). Its access tokens are JWTs (resourceIndicators,
//! `accessTokenFormat: 'jwt'`) with a `groups` claim, obtained through a real
//! grant from its token endpoint: **client_credentials**, one confidential
//! client per test user (`sub` is the client id, the groups come from
//! `extraTokenClaims`) — the fallback the issue allows, chosen over a
//! headless authorization-code + PKCE run for its simplicity. Forged tokens
//! (another key, `alg: none`, HMAC with the public key as secret, unknown key
//! ids) are made by tests/oidc/forge.mjs with `jose`, as an attacker would.
//! The MCP side is the real fixture server; the upstream a recording stand-in.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use mcp_context::identity::{AuthFailure, IdentitySource, JwksSource, JwtSettings, JwtVerifier};
use serde_json::{Value, json};

use crate::common::*;
use crate::serve::{Proxy, Upstream, chat_body, http};

const AUDIENCE: &str = "urn:mcp-context";

/// The provider, stopped (SIGKILL by pid) when dropped.
struct Idp {
    issuer: String,
    child: Option<tokio::process::Child>,
}

impl Drop for Idp {
    fn drop(&mut self) {
        self.stop();
    }
}

fn oidc_dir() -> PathBuf {
    std::path::Path::new(ROOT).join("tests/oidc")
}

impl Idp {
    /// Starts the provider, or says why it cannot run here (`skip`).
    async fn start(test: &str) -> Option<Idp> {
        let (child, v) = crate::common::start_oidc_fixture(test, "provider.mjs", &[]).await?;
        Some(Idp { issuer: v["issuer"].as_str().unwrap().to_owned(), child: Some(child) })
    }

    fn stop(&mut self) {
        if let Some(pid) = self.child.as_ref().and_then(tokio::process::Child::id) {
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        self.child = None;
    }

    /// An access token for `client` (its secret is `<client>-secret`) and `resource`, through the token endpoint.
    async fn token(&self, client: &str, resource: &str) -> String {
        let body = format!(
            "grant_type=client_credentials&client_id={client}&client_secret={client}-secret&scope=api&resource={resource}"
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

    async fn jwks_fetches(&self) -> u64 {
        let v: Value = http().get(format!("{}/__test/stats", self.issuer)).send().await.unwrap().json().await.unwrap();
        v["jwks_fetches"].as_u64().unwrap()
    }

    /// A new signing key; the old one stays published.
    async fn rotate(&self) -> String {
        let v: Value =
            http().post(format!("{}/__test/rotate", self.issuer)).send().await.unwrap().json().await.unwrap();
        v["kid"].as_str().unwrap().to_owned()
    }

    /// The attacker's tokens (tests/oidc/forge.mjs).
    async fn forge(&self) -> Value {
        let out = tokio::process::Command::new("node")
            .args(["forge.mjs", &self.issuer, AUDIENCE])
            .current_dir(oidc_dir())
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

fn settings(issuer: &str) -> JwtSettings {
    let mut s = JwtSettings::new(issuer);
    s.audience = vec![AUDIENCE.into()];
    s.roles_claim = Some("groups".into());
    s.role_map.insert("engineering".into(), vec!["staff".into()]);
    s.leeway = Duration::ZERO;
    s.min_refresh_interval = Duration::from_secs(1);
    s
}

fn reason(r: mcp_context::Result<mcp_context::identity::Identity>) -> AuthFailure {
    r.expect_err("refused").auth_failure().expect("an authentication failure")
}

/// The library verifier against the real provider: discovery, groups mapped
/// to roles, a rotated key picked up without a restart, every forgery refused
/// with its reason, a flood of unknown key ids costing the provider at most
/// one JWKS fetch, and the provider gone with the held keys still verifying.
#[tokio::test]
async fn verifier_against_a_real_provider() {
    let Some(mut idp) = Idp::start("verifier_against_a_real_provider").await else { return };
    let v = JwtVerifier::new(settings(&idp.issuer)).await.unwrap();
    let alice = v.verify(&idp.token("alice", AUDIENCE).await).await.unwrap();
    assert_eq!(
        (alice.user.as_str(), alice.roles.as_slice(), alice.source),
        ("alice", &["staff".to_owned()][..], IdentitySource::Jwt)
    );
    let bob = v.verify(&idp.token("bob", AUDIENCE).await).await.unwrap();
    assert_eq!(bob.user, "bob");
    assert!(bob.roles.is_empty(), "sales is not mapped: {:?}", bob.roles);

    // Forgeries and wrong tokens.
    let f = idp.forge().await;
    assert_eq!(reason(v.verify(f["other_key"].as_str().unwrap()).await), AuthFailure::BadSignature);
    assert_eq!(reason(v.verify(f["none"].as_str().unwrap()).await), AuthFailure::Algorithm);
    assert_eq!(reason(v.verify(f["hmac_pem"].as_str().unwrap()).await), AuthFailure::Algorithm);
    assert_eq!(reason(v.verify(f["hmac_jwk"].as_str().unwrap()).await), AuthFailure::Algorithm);
    assert_eq!(reason(v.verify(&idp.token("alice", "urn:other").await).await), AuthFailure::WrongAudience);
    let short = idp.token("alice-short", AUDIENCE).await;
    // Verified (and remembered) while valid, refused once expired: the memory of verified tokens keeps no token past its `exp`.
    assert_eq!(v.verify(&short).await.unwrap().user, "alice-short");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(reason(v.verify(&short).await), AuthFailure::Expired);
    // Even with HMAC accepted (a shared secret configured), the provider's public key is no HMAC secret.
    let mut hs = settings(&idp.issuer);
    hs.algorithms.push("HS256".into());
    hs.hmac_secret = Some("a-shared-secret-of-at-least-32-chars!!".to_owned().into());
    let with_hmac = JwtVerifier::new(hs).await.unwrap();
    assert_eq!(reason(with_hmac.verify(f["hmac_pem"].as_str().unwrap()).await), AuthFailure::BadSignature);
    assert_eq!(reason(with_hmac.verify(f["hmac_jwk"].as_str().unwrap()).await), AuthFailure::BadSignature);
    assert_eq!(reason(v.verify("eyJhbGciOiJSUzI1NiJ9.e30.c2ln").await), AuthFailure::BadSignature);
    assert_eq!(reason(v.verify("not-a-jwt").await), AuthFailure::Malformed);

    // A flood of forged key ids: each refused, and at most one JWKS fetch for all of them.
    let before = idp.jwks_fetches().await;
    let flood: Vec<String> =
        f["unknown_kid"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_owned()).collect();
    for _ in 0..3 {
        let all = futures::future::join_all(flood.iter().map(|t| v.verify(t))).await;
        assert!(all.into_iter().all(|r| reason(r) == AuthFailure::UnknownKey));
    }
    let fetched = idp.jwks_fetches().await - before;
    assert!(fetched <= 1, "{fetched} JWKS fetches for 60 forged key ids");

    // Rotation: tokens signed by the new key verify without a restart.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let kid = idp.rotate().await;
    let rotated = idp.token("alice", AUDIENCE).await;
    assert!(rotated.split('.').next().is_some_and(|h| h.len() > 10));
    assert_eq!(v.verify(&rotated).await.unwrap().user, "alice", "signed by {kid}");

    // The provider gone: held keys keep verifying, a refresh fails and says why.
    let old = idp.token("bob", AUDIENCE).await;
    idp.stop();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(v.verify(&old).await.unwrap().user, "bob");
    assert!(v.refresh().await.is_err());
    assert!(v.problem().is_some_and(|p| p.contains("cannot fetch")), "{:?}", v.problem());
    assert_eq!(v.verify(&rotated).await.unwrap().user, "alice");
}

/// `jwks_file` and `jwks_url` work without discovery.
#[tokio::test]
async fn keys_from_a_url_or_a_file() {
    let Some(idp) = Idp::start("keys_from_a_url_or_a_file").await else { return };
    let token = idp.token("alice", AUDIENCE).await;
    let mut s = settings(&idp.issuer);
    s.jwks = JwksSource::Url(format!("{}/jwks", idp.issuer));
    assert_eq!(JwtVerifier::new(s).await.unwrap().verify(&token).await.unwrap().user, "alice");
    let jwks = http().get(format!("{}/jwks", idp.issuer)).send().await.unwrap().text().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("jwks.json"), jwks).unwrap();
    let mut s = settings(&idp.issuer);
    s.jwks = JwksSource::File(dir.path().join("jwks.json"));
    assert_eq!(JwtVerifier::new(s).await.unwrap().verify(&token).await.unwrap().roles, ["staff"]);
}

// ---------------------------------------------------------------- through serve

/// The policy of the serve tests: staff see fx://doc/0 and fx://doc/1,
/// everyone else (`default_roles: [guest]`) fx://doc/0; fx://doc/2 nobody.
const POLICY: &str = "default_roles: [guest]\nroles:\n  guest:\n    allow:\n      - { server: fx, uri: \"fx://doc/0\" }\n  \
                      staff:\n    allow:\n      - { server: fx, uri: \"fx://doc/[01]\" }\n  hr:\n    allow: []\n";

fn serve_config(dir: &std::path::Path, issuer: &str, tag: &str, extra: &str) -> String {
    std::fs::write(dir.join("policy.yaml"), POLICY).unwrap();
    let log = dir.join("reads.log");
    format!(
        "servers:\n{}policy: {}\ncontext:\n  max_tokens: 4000\nserve:\n  upstream_api_key: sk-upstream-1\n  jwt:\n    \
         issuer: {issuer}\n    audience: [{AUDIENCE}]\n    roles_claim: groups\n    role_map: {{ engineering: staff }}\n    \
         leeway_s: 1\n    jwks_refresh_s: 1\n    jwks_min_refresh_s: 1\n{extra}",
        fixture_server("fx", tag, &["--n", "3", "--record", log.to_str().unwrap()]),
        dir.join("policy.yaml").display(),
    )
}

const PY_JWT: &str = r#"
import json, sys
from openai import OpenAI
out = {}
for name, token in [("alice", sys.argv[2]), ("bob", sys.argv[3])]:
    client = OpenAI(base_url=sys.argv[1], api_key=token)
    r = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=[{"role": "user", "content": "What is new?"}])
    out[name] = r.headers.get("x-mcp-context")
try:
    OpenAI(base_url=sys.argv[1], api_key=sys.argv[4]).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
except Exception as e:
    out["forged"] = [type(e).__name__, e.status_code, e.response.headers.get("www-authenticate")]
print(json.dumps(out))
"#;

/// End to end through `serve` with the official `openai` Python client using
/// the provider's tokens as API keys: alice (group engineering → staff) gets
/// staff's context, bob (no mapped group → default_roles) the guest's; the MCP
/// server read nothing either was denied; every forged token is 401 with
/// `WWW-Authenticate`, counted by reason in /metrics; with the provider
/// stopped, /readyz is degraded with the cause and tokens still verify.
#[tokio::test]
async fn serve_end_to_end_with_the_official_client() {
    let test = "serve_end_to_end_with_the_official_client";
    let Some(mut idp) = Idp::start(test).await else { return };
    let python = match crate::serve::python_openai() {
        Ok(p) => p,
        Err(why) => return skip(test, &why),
    };
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let t = tag();
    let proxy = Proxy::start_config(&serve_config(dir.path(), &idp.issuer, &t, ""), &upstream.base, t).await;
    let (alice, bob) = (idp.token("alice", AUDIENCE).await, idp.token("bob", AUDIENCE).await);
    let forged = idp.forge().await;

    let out = tokio::process::Command::new(&python)
        .args(["-c", PY_JWT, &format!("{}/v1", proxy.url), &alice, &bob, forged["other_key"].as_str().unwrap()])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    let header = |u: &str| got[u].as_str().unwrap_or_else(|| panic!("{got}")).to_owned();
    assert!(
        header("alice").starts_with("user=alice;") && header("alice").ends_with("; identity=jwt; roles=staff"),
        "{got}"
    );
    assert!(header("bob").contains("user=bob;") && header("bob").ends_with("; identity=jwt; roles=guest"), "{got}");
    assert_eq!(got["forged"][0], "AuthenticationError");
    assert_eq!(got["forged"][1], 401);
    assert!(got["forged"][2].as_str().unwrap().starts_with("Bearer error=\"invalid_token\""), "{got}");

    let seen = upstream.seen();
    let context = |i: usize| seen[i].body["messages"][0]["content"].as_str().unwrap_or_default().to_owned();
    assert!(context(0).contains("fx://doc/0") && context(0).contains("fx://doc/1"), "{}", context(0));
    assert!(context(1).contains("fx://doc/0") && !context(1).contains("fx://doc/1"), "{}", context(1));
    assert!(seen.iter().all(|s| !s.body.to_string().contains("fx://doc/2")));
    let reads = std::fs::read_to_string(dir.path().join("reads.log")).unwrap_or_default();
    assert!(!reads.contains("fx://doc/2"), "a resource nobody may see was read: {reads}");

    // Each forgery: 401 with the reason in WWW-Authenticate, counted.
    let short = idp.token("alice-short", AUDIENCE).await;
    let other_aud = idp.token("alice", "urn:other").await;
    tokio::time::sleep(Duration::from_millis(3100)).await;
    let cases = [
        (forged["none"].as_str().unwrap(), "algorithm"),
        (forged["hmac_pem"].as_str().unwrap(), "algorithm"),
        (forged["hmac_jwk"].as_str().unwrap(), "algorithm"),
        (short.as_str(), "expired"),
        (other_aud.as_str(), "wrong_audience"),
        (forged["unknown_kid"][0].as_str().unwrap(), "unknown_key"),
    ];
    for (token, why) in cases {
        let r = proxy.post("/v1/chat/completions", Some(token), &chat_body("x")).send().await.unwrap();
        assert_eq!(r.status(), 401, "{why}");
        let challenge = r.headers()["www-authenticate"].to_str().unwrap().to_owned();
        assert!(challenge.contains("error=\"invalid_token\", error_description=\""), "{challenge}");
    }
    // A forged token never falls through to another identity source (here: the user header is not even configured,
    // and an anonymous user would have been served).
    let metrics = http().get(format!("{}/metrics", proxy.url)).send().await.unwrap().text().await.unwrap();
    for (why, n) in [("algorithm", 3), ("expired", 1), ("wrong_audience", 1), ("unknown_key", 1), ("bad_signature", 1)]
    {
        let line = format!("mcp_context_auth_failures_total{{reason=\"{why}\"}} {n}");
        assert!(metrics.contains(&line), "{line} not in\n{metrics}");
    }
    assert!(
        !proxy.stderr().contains(&alice) && !proxy.stderr().contains(forged["none"].as_str().unwrap()),
        "a token was logged"
    );
    assert_eq!(upstream.seen().len(), 2, "no refused request reached the upstream");

    // The provider stopped: degraded with the cause, and the cached keys keep verifying.
    idp.stop();
    let ready = eventually(async || {
        let v: Value = http().get(format!("{}/readyz", proxy.url)).send().await.unwrap().json().await.unwrap();
        v["status"] == "degraded" && v["identity_provider"].as_str().is_some_and(|c| c.contains("cannot fetch"))
    })
    .await;
    assert!(ready, "readyz never said degraded");
    let r = proxy.post("/v1/chat/completions", Some(&alice), &chat_body("again")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["x-mcp-context"].to_str().unwrap().ends_with("roles=staff"));
}

/// A `role_map` naming a role the policy does not define stops `serve` at
/// start, with the config's file, line and column.
#[tokio::test]
async fn unknown_mapped_role_is_a_located_load_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("policy.yaml"), POLICY).unwrap();
    let config = format!(
        "servers: {{}}\npolicy: {}\nserve:\n  upstream_api_key: k\n  jwt:\n    issuer: http://127.0.0.1:9\n    \
         audience: x\n    roles_claim: groups\n    role_map:\n      engineering: staff\n      admins: [root, hr]\n",
        dir.path().join("policy.yaml").display()
    );
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, config).unwrap();
    let out = std::process::Command::new(MCP_CONTEXT)
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:11:16: serve.jwt.role_map: the policy defines no role `root`", path.display())),
        "{err}"
    );
    assert!(!err.contains("role `hr`") && !err.contains("role `staff`"), "{err}");
}

/// The attacker's test of the memos: the same user asking with a token
/// carrying staff's roles, then with none, must not be served staff's
/// remembered answer (the warm memo and the selection memo key by roles).
#[tokio::test]
async fn memos_key_by_roles_not_only_by_user() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("policy.yaml"), POLICY).unwrap();
    let t = tag();
    let yaml = format!(
        "servers:\n{}policy: {}\n",
        fixture_server("fx", &t, &["--n", "3"]),
        dir.path().join("policy.yaml").display()
    );
    let ctx = mcp_context::McpContext::from_config(&config(&yaml)).await.unwrap();
    let ids = |r: &mcp_context::Report| r.included.iter().map(|i| i.id.clone()).collect::<Vec<_>>();
    let staff = mcp_context::ContextRequest::for_user("mallory").with_roles(["staff"]);
    let plain = mcp_context::ContextRequest::for_user("mallory");
    for _ in 0..2 {
        let (_, r) = ctx.build(&staff).await.unwrap();
        assert_eq!(ids(&r), ["fx:fx://doc/0", "fx:fx://doc/1"]);
        assert_eq!(r.roles, ["staff"]);
        let (_, r) = ctx.build(&plain).await.unwrap();
        assert_eq!(ids(&r), ["fx:fx://doc/0"], "a stale decision of another token's roles");
        assert_eq!(r.roles, ["guest"]);
    }
    // Unknown roles grant nothing: fall back to default_roles.
    let (_, r) = ctx.build(&mcp_context::ContextRequest::for_user("mallory").with_roles(["root"])).await.unwrap();
    assert_eq!(ids(&r), ["fx:fx://doc/0"]);
    ctx.close().await;
}

/// `policy explain --roles` and `preview --roles` decide with claim-derived roles.
#[tokio::test]
async fn cli_explain_and_preview_with_roles() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("policy.yaml"), POLICY).unwrap();
    let t = tag();
    let yaml = format!(
        "servers:\n{}policy: {}\n",
        fixture_server("fx", &t, &["--n", "3"]),
        dir.path().join("policy.yaml").display()
    );
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, yaml).unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(MCP_CONTEXT).args(args).arg("--config").arg(&path).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, out, err) = run(&["policy", "explain", "--user", "zed", "--roles", "staff", "fx:fx://doc/1"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("roles: staff") && out.contains("ALLOW fx:fx://doc/1 for user zed"), "{out}");
    let (_, out, _) = run(&["policy", "explain", "--user", "zed", "fx:fx://doc/1"]);
    assert!(out.contains("DENY fx:fx://doc/1"), "{out}");
    let (ok, _, err) = run(&["policy", "explain", "--user", "zed", "--roles", "root", "fx:fx://doc/1"]);
    assert!(!ok && err.contains("the policy defines no role root"), "{err}");
    let (ok, out, err) = run(&["preview", "--json", "--user", "zed", "--roles", "staff,guest"]);
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["roles"], json!(["staff", "guest"]));
    assert_eq!(v["included"].as_array().unwrap().len(), 2, "{v}");
}
