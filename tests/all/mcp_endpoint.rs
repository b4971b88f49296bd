//! Issue 51: `serve` as one MCP server of each user's governed resources
//! (`serve.mcp`, `/mcp`), with the official Python SDK's client as the host
//! (tests/python-mcp/host.py, `mcp` 2.x in the venv target/py-mcp) on both
//! revisions: 2025-11-25 with a session, 2026-07-28 without a handshake.
//! Behind it the fixture server over stdio, whose read log shows what
//! reached it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use sha2::Digest;

use crate::common::*;
use crate::serve::{Proxy, digest, http};

const POLICY: &str = "\
roles:
  all:
    allow:
      - { server: fx, uri: \"fx://**\" }
  one:
    allow:
      - { server: fx, uri: \"fx://doc/0\" }
users:
  alice: { roles: [all] }
  bob: { roles: [one] }
";

/// A proxy with `serve.mcp` on, the fixture `fx` (4 docs, fx://live, the
/// template fx://user/{id}), keys `key-alice` and `key-bob`, and a file audit sink.
struct Setup {
    proxy: Proxy,
    reads: PathBuf,
    live: PathBuf,
    audit: PathBuf,
    _dir: tempfile::TempDir,
}

impl Setup {
    async fn start() -> Setup {
        let t = tag();
        let dir = tempfile::tempdir().unwrap();
        let (reads, live, audit) =
            (dir.path().join("reads.log"), dir.path().join("live.txt"), dir.path().join("audit.jsonl"));
        std::fs::write(&live, "version one").unwrap();
        let policy = dir.path().join("policy.yaml");
        std::fs::write(&policy, POLICY).unwrap();
        let fx = fixture_server(
            "fx",
            &t,
            &["--n", "4", "--record", reads.to_str().unwrap(), "--subscribe", "--live", live.to_str().unwrap()],
        );
        let body = format!(
            "servers:\n{fx}policy: {policy:?}\ncontext:\n  max_tokens: 4000\naudit:\n  sinks:\n    - file: {{ path: {audit:?} }}\n\
             serve:\n  upstream_api_key: sk-up\n  keys:\n    - {{ sha256: \"{}\", user: alice }}\n    - {{ sha256: \"{}\", user: bob }}\n  mcp: {{ page_size: 2 }}\n",
            digest("key-alice"),
            digest("key-bob"),
        );
        let proxy = Proxy::start_config(&body, "http://127.0.0.1:9/v1", t).await;
        Setup { proxy, reads, live, audit, _dir: dir }
    }

    fn url(&self) -> String {
        format!("{}/mcp", self.proxy.url)
    }

    /// The reads the fixture served (its log also names the cache's `subscribe`s).
    fn reads(&self) -> Vec<String> {
        read_log(&self.reads).into_iter().filter(|l| !l.starts_with("subscribe ")).collect()
    }

    fn audit(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.audit)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

/// Runs host.py with these operations; one JSON value per operation.
fn host(py: &Path, url: &str, token: Option<&str>, mode: &str, ops: Value) -> Vec<Value> {
    let script = Path::new(ROOT).join("tests/python-mcp/host.py");
    let mut cmd = std::process::Command::new(py);
    cmd.arg(script).args(["--url", url, "--mode", mode, "--ops", &ops.to_string()]);
    if let Some(t) = token {
        cmd.args(["--token", t]);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "host.py failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn ours(uri: &str) -> String {
    let enc: String = uri
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    format!("mcp-context://fx/{enc}")
}

fn uris(listing: &Value) -> Vec<String> {
    listing["result"]["resources"].as_array().unwrap().iter().map(|r| r["uri"].as_str().unwrap().to_owned()).collect()
}

fn text(read: &Value) -> String {
    assert_eq!(read["ok"], true, "{read}");
    read["result"]["contents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Not found, as the revision says it (-32002 on 2025-11-25, -32602 on 2026-07-28).
fn assert_not_found(v: &Value, what: &str) {
    assert_eq!(v["ok"], false, "{what}: {v}");
    assert!(matches!(v["code"].as_i64(), Some(-32002 | -32602)), "{what}: {v}");
    assert_eq!(v["message"], "Resource not found", "{what}: {v}");
}

async fn views_reads_and_refusals(mode: &str) {
    let name = format!("python_sdk_host_sees_only_its_view_{mode}");
    let Some(py) = crate::sdk::python() else { return skip(&name, "no target/py-mcp venv with `mcp` (see .ci/run)") };
    let s = Setup::start().await;
    let url = s.url();
    let doc = |i: usize| ours(&format!("fx://doc/{i}"));
    // Bob first: his listing, then alice's resource and forged spellings of his own.
    let forged = [
        doc(0).replace("%3A%2F%2F", "%3a%2f%2f"),
        "mcp-context://fx/fx://doc/0".to_owned(),
        doc(0).replace("doc%2F0", "doc%2F%30"),
        doc(0).replace("mcp-context://fx/", "mcp-context://FX/"),
        format!("{}%2F..%2F1", doc(0)),
        "fx:fx://doc/0".to_owned(),
    ];
    let mut ops = vec![json!(["list"]), json!(["templates"]), json!(["read", doc(1)]), json!(["read", doc(0)])];
    ops.extend(forged.iter().map(|f| json!(["read", f])));
    let bob = host(&py, &url, Some("key-bob"), mode, json!(ops));
    assert_eq!(uris(&bob[0]), vec!["mcp-context://context".to_owned(), doc(0)], "{}", bob[0]);
    assert_eq!(bob[0]["result"]["pages"], 1);
    assert_eq!(bob[1]["result"]["resourceTemplates"], json!([]), "bob may expand no template: {}", bob[1]);
    assert_not_found(&bob[2], "bob reads alice's doc 1");
    assert!(text(&bob[3]).starts_with("Document 0."), "{}", bob[3]);
    for (f, v) in forged.iter().zip(&bob[4..]) {
        assert_not_found(v, f);
    }
    assert_eq!(s.reads(), vec!["fx://doc/0"], "only bob's own doc reached the server");

    // Alice: everything, in pages of 2, with the metadata kept; doc 1 and a template expansion read.
    let alice = host(
        &py,
        &url,
        Some("key-alice"),
        mode,
        json!([["list"], ["templates"], ["read", doc(1)], ["read", ours("fx://user/alice")], ["prompt", "Document 2"]]),
    );
    let listed = uris(&alice[0]);
    let mut want = vec!["mcp-context://context".to_owned()];
    want.extend((0..4).map(doc));
    want.push(ours("fx://live"));
    assert_eq!(listed, want, "{}", alice[0]);
    assert_eq!(alice[0]["result"]["pages"], 3);
    let first = &alice[0]["result"]["resources"][1];
    assert_eq!(first["mimeType"], "text/plain", "{first}");
    assert_eq!(first["_meta"]["mcp-context/source"], json!({"server": "fx", "uri": "fx://doc/0"}), "{first}");
    let t = &alice[1]["result"]["resourceTemplates"];
    assert_eq!(t[0]["uriTemplate"], "mcp-context://fx/fx%3A%2F%2Fuser%2F{id}", "{t}");
    assert!(text(&alice[2]).starts_with("Document 1."), "{}", alice[2]);
    assert_eq!(text(&alice[3]), "user alice");
    let prompt = alice[4]["result"]["messages"][0]["content"]["text"].as_str().unwrap_or_default().to_owned();
    assert!(prompt.contains("Document 2."), "the prompt ranks by its query: {}", alice[4]);
    let reads = s.reads();
    assert!(reads.contains(&"fx://doc/1".to_owned()) && reads.contains(&"fx://user/alice".to_owned()), "{reads:?}");

    // One audit record per read, with the digest of the text returned; a refusal has none.
    assert!(
        eventually(async || s.audit().iter().filter(|r| r["route"] == "mcp:resources/read").count() >= 10).await,
        "{:?}",
        s.audit()
    );
    let records = s.audit();
    let reads_of = |user: &str| -> Vec<&Value> {
        records.iter().filter(|r| r["route"] == "mcp:resources/read" && r["user"] == user).collect()
    };
    let bobs = reads_of("bob");
    assert_eq!(bobs.len(), 2 + forged.len(), "{bobs:?}");
    assert_eq!(bobs.iter().filter(|r| r["included"].as_array().unwrap().is_empty()).count(), 1 + forged.len());
    let alices = reads_of("alice");
    let one = alices.iter().find(|r| r["included"][0]["id"] == "fx:fx://doc/1").expect("alice's read of doc 1");
    let sha = hex(&sha2::Sha256::digest(text(&alice[2]).as_bytes()));
    assert_eq!(one["included"][0]["sha256"], sha, "{one}");
    assert_eq!(one["identity_source"], "key");
    assert!(records.iter().any(|r| r["route"] == "mcp:prompts/get" && r["user"] == "alice"), "{records:?}");
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_host_sees_only_its_view_on_2025_11_25() {
    views_reads_and_refusals("legacy").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_host_sees_only_its_view_on_2026_07_28() {
    views_reads_and_refusals("2026-07-28").await;
}

/// No identity, an unknown key, a token for no one: 401 naming the metadata, which names this endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_identity_gets_401_with_the_resource_metadata() {
    let s = Setup::start().await;
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let metadata = format!("{}/.well-known/oauth-protected-resource/mcp", s.proxy.url);
    for key in [None, Some("key-nobody"), Some("a.b.c")] {
        let mut r = http().post(s.url()).header("accept", "application/json, text/event-stream").json(&init);
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), 401, "{key:?}");
        let challenge = r.headers()["www-authenticate"].to_str().unwrap().to_owned();
        assert!(challenge.starts_with(&format!("Bearer resource_metadata=\"{metadata}\"")), "{key:?}: {challenge}");
    }
    let doc: Value = http().get(&metadata).send().await.unwrap().json().await.unwrap();
    assert_eq!(doc["resource"], s.url(), "{doc}");
    assert!(s.reads().is_empty());
}

/// A subscription sees a change of a resource it may see; bob cannot
/// subscribe to it, and hears nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_hear_only_of_what_they_may_see() {
    let Some(py) = crate::sdk::python() else {
        return skip("subscribers_hear_only_of_what_they_may_see", "no target/py-mcp venv with `mcp` (see .ci/run)");
    };
    let s = Setup::start().await;
    let live = ours("fx://live");
    let (url, py2) = (s.url(), py.clone());
    let bob_live = live.clone();
    let bob = tokio::task::spawn_blocking(move || {
        host(
            &py2,
            &url,
            Some("key-bob"),
            "legacy",
            json!([["subscribe", bob_live], ["subscribe", "mcp-context://context"], ["wait", 4]]),
        )
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let alice = host(
        &py,
        &s.url(),
        Some("key-alice"),
        "legacy",
        json!([
            ["read", live],
            ["subscribe", live],
            ["touch", s.live.to_str().unwrap(), "version two"],
            ["wait", 3],
            ["read", live]
        ]),
    );
    assert_eq!(text(&alice[0]), "version one");
    assert_eq!(alice[1]["ok"], true, "{}", alice[1]);
    let heard = alice[3]["result"]["notifications"].as_array().unwrap().clone();
    assert!(
        heard.iter().any(|n| n["method"] == "notifications/resources/updated" && n["uri"] == live.as_str()),
        "{heard:?}"
    );
    assert_eq!(text(&alice[4]), "version two");
    let bob = bob.await.unwrap();
    assert_not_found(&bob[0], "bob subscribes to fx://live");
    assert_eq!(bob[1]["ok"], true, "{}", bob[1]);
    let heard = bob[2]["result"]["notifications"].as_array().unwrap();
    assert!(heard.iter().all(|n| n["uri"] != live.as_str() && n["uri"] != "mcp-context://context"), "{heard:?}");
}
