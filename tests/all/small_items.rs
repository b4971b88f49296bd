//! Issue 47, item 11, against the real binary: a `groups` claim given as
//! one string is split on ASCII spaces only (a signed token through `serve`,
//! judged by what the MCP server read and the upstream received), the audit
//! JSONL file and its rotations are made mode 0600, and every answer of
//! `serve` (probes, errors, relayed answers, auth routes) says
//! `X-Content-Type-Options: nosniff`, read off the raw socket.
//!
//! Tokens are HS256, signed here with the `serve.jwt.hmac_secret` (what an
//! identity provider sharing a secret would issue): the claims are the
//! test's to choose, which a real provider's fixed clients would not allow.

use std::path::Path;

use serde_json::{Value, json};

use crate::attack::raw_http;
use crate::common::*;
use crate::serve::{Proxy, Upstream, chat_body, default_serve};

/// The shared secret of the tests' `serve.jwt`.
pub const JWT_SECRET: &str = "a-shared-secret-of-at-least-32-characters";
pub const JWT_ISSUER: &str = "https://idp.test";
pub const JWT_AUDIENCE: &str = "urn:mcp-context";

/// A `serve.jwt` block (at two spaces of indent under `serve:`) accepting
/// HS256 tokens signed with [`JWT_SECRET`], `groups` mapped (`engineering`
/// → `staff`). `serve` fetches the JWKS before it serves, so `dir` gets a
/// JWK set with one (unused) Ed25519 key, RFC 8037's example.
pub fn jwt_yaml(dir: &Path) -> String {
    let jwks = dir.join("jwks.json");
    let key = json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "unused",
        "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]});
    std::fs::write(&jwks, key.to_string()).unwrap();
    format!(
        "  jwt:\n    issuer: {JWT_ISSUER}\n    audience: [{JWT_AUDIENCE}]\n    jwks_file: {}\n    algorithms: [HS256]\n    \
         hmac_secret: \"{JWT_SECRET}\"\n    roles_claim: groups\n    role_map: {{ engineering: staff }}\n",
        jwks.display()
    )
}

/// A token for `sub` with these `groups`, valid for ten minutes.
pub fn jwt(sub: &str, groups: Value) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let claims =
        json!({"iss": JWT_ISSUER, "aud": JWT_AUDIENCE, "sub": sub, "groups": groups, "iat": now, "exp": now + 600});
    let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    jsonwebtoken::encode(&header, &claims, &jsonwebtoken::EncodingKey::from_secret(JWT_SECRET.as_bytes())).unwrap()
}

/// Guests see fx://doc/0; staff fx://doc/0 and fx://doc/1.
const POLICY: &str = "default_roles: [guest]\nroles:\n  guest:\n    allow:\n      - { server: fx, uri: \"fx://doc/0\" }\n  \
                      staff:\n    allow:\n      - { server: fx, uri: \"fx://doc/[01]\" }\n";

/// `"Marketing\u{a0}engineering"` is one group (mapped to nothing), not
/// `engineering`: dave and frank get the guest's context, and the MCP
/// server never reads fx://doc/1 for them; erin's ASCII-spaced string does
/// map `engineering` → `staff`. Failed before: split on any Unicode white
/// space, dave was staff and fx://doc/1 was read and sent for him.
#[tokio::test]
async fn a_groups_string_splits_on_ascii_spaces_only() {
    let up = Upstream::start().await;
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("policy.yaml"), POLICY).unwrap();
    let reads = work.path().join("reads.log");
    let t = tag();
    let config = format!(
        "servers:\n{}policy: {}\ncontext:\n  max_tokens: 4000\nserve:\n  upstream_api_key: sk-upstream-1\n{}",
        fixture_server("fx", &t, &["--n", "3", "--record", reads.to_str().unwrap()]),
        work.path().join("policy.yaml").display(),
        jwt_yaml(work.path()),
    );
    let proxy = Proxy::start_config(&config, &up.base, t).await;
    let ask = async |sub: &str, groups: &str| {
        let r = proxy.post("/v1/chat/completions", Some(&jwt(sub, json!(groups))), &chat_body("What is new?"));
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), 200, "{sub}");
        r.headers()["x-mcp-context"].to_str().unwrap().to_owned()
    };
    for (sub, groups) in [("dave", "Marketing\u{a0}engineering"), ("frank", "ops\u{2003}engineering\u{3000}x")] {
        let header = ask(sub, groups).await;
        assert!(header.contains("identity=jwt") && !header.contains("staff"), "{sub}: {header}");
    }
    let sent: Vec<String> = up.seen().iter().map(|s| s.body["messages"][0]["content"].to_string()).collect();
    assert_eq!(sent.len(), 2);
    for content in &sent {
        assert!(content.contains("fx:fx://doc/0") && !content.contains("fx:fx://doc/1"), "{content}");
    }
    assert!(!read_log(&reads).iter().any(|l| l == "fx://doc/1"), "{:?}", read_log(&reads));
    let header = ask("erin", "  marketing engineering ").await;
    assert!(header.contains("roles=staff"), "{header}");
    let last = up.seen().last().unwrap().body["messages"][0]["content"].to_string();
    assert!(last.contains("fx:fx://doc/1"), "{last}");
    assert!(read_log(&reads).iter().any(|l| l == "fx://doc/1"));
}

/// The audit file `serve` makes, and each file its rotation leaves, is
/// mode 0600 (a record says who received what): like the token file.
/// Failed before: 0644 (the process umask of 022 applied to 0666).
#[tokio::test]
async fn the_audit_file_is_made_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let up = Upstream::start().await;
    let t = tag();
    // Every record is longer than 200 bytes: each one after the first rotates.
    let body = format!(
        "servers:\n{}policy: policies/\ncontext:\n  max_tokens: 4000\nserve:\n{}\
         audit:\n  sinks:\n    - file: {{ path: audit/trail.jsonl, max_bytes: 200, keep: 2 }}\n",
        demo_server("demo", &t),
        default_serve()
    );
    let proxy = Proxy::start_config(&body, &up.base, t).await;
    for _ in 0..3 {
        let r = proxy.post("/v1/chat/completions", Some("key-alice"), &chat_body("hi")).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    let dir = proxy.dir.path().join("audit");
    let files = ["trail.jsonl", "trail.jsonl.1", "trail.jsonl.2"].map(|f| dir.join(f));
    let written = async || files.iter().all(|f| std::fs::metadata(f).is_ok_and(|m| m.len() > 0));
    assert!(eventually(written).await, "three audit files: {:?}", std::fs::read_dir(&dir).map(|d| d.count()));
    for f in &files {
        let mode = std::fs::metadata(f).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}: {mode:o}", f.display());
    }
}

/// Every answer carries `X-Content-Type-Options: nosniff` once: the
/// probes, `/metrics`, `HEAD /`, an answer relayed from the upstream, a
/// refusal (no identity, bad JSON), an unknown path and an auth route.
/// Failed before: none did.
#[tokio::test]
async fn every_answer_says_nosniff() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(&default_serve(), &up.base).await;
    let get = |path: &str| format!("GET {path} HTTP/1.1\nHost: {{host}}\nConnection: close\n\n");
    let post = |key: &str, body: &str| {
        format!(
            "POST /v1/chat/completions HTTP/1.1\nHost: {{host}}\nAuthorization: Bearer {key}\n\
             Content-Type: application/json\nContent-Length: {}\nConnection: close\n\n{body}",
            body.len()
        )
    };
    let chat = chat_body("hi").to_string();
    let cases = [
        ("healthz", get("/healthz"), Some(200)),
        ("readyz", get("/readyz"), None),
        ("metrics", get("/metrics"), None),
        ("head", "HEAD / HTTP/1.1\nHost: {host}\nConnection: close\n\n".to_owned(), None),
        ("relayed", post("key-alice", &chat), Some(200)),
        ("no identity", post("key-nobody", &chat), Some(401)),
        ("bad json", post("key-alice", "{\"messages\": ["), Some(400)),
        ("unknown path", get("/v1/nothing-here"), Some(404)),
        ("auth start", get("/auth/nope/start"), None),
    ];
    for (what, head, status) in cases {
        let (got, headers, _) = raw_http(&proxy.url, &head, b"").await;
        assert!(got != 0 && status.is_none_or(|s| s == got), "{what}: status {got}, wanted {status:?}: {headers}");
        let nosniff = headers
            .lines()
            .filter(|l| l.to_ascii_lowercase().replace(' ', "") == "x-content-type-options:nosniff")
            .count();
        assert_eq!(nosniff, 1, "{what}: {headers}");
    }
    assert_eq!(up.seen().len(), 1, "only the identified, well-formed request was relayed");
}
