//! The audit trail against the machine's real PostgreSQL (127.0.0.1:5432,
//! database `test`; `MCP_TEST_PG_URL` overrides): records of injections
//! made through `serve` and by the library, `mcp-context audit` answering
//! who received a resource, PostgreSQL going away mid-run, and no resource
//! text in any record. Each test has a schema of its own, dropped at the end.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::common::*;
use crate::serve::{Proxy, Upstream, chat_body, default_serve, http};

pub fn pg_url() -> String {
    std::env::var("MCP_TEST_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A connection to the test database, or `None` (after `skip`) when there is none.
pub async fn pg(test: &str) -> Option<tokio_postgres::Client> {
    match tokio_postgres::connect(&pg_url(), tokio_postgres::NoTls).await {
        Ok((client, conn)) => {
            tokio::spawn(conn);
            Some(client)
        }
        Err(e) => {
            skip(test, &format!("no PostgreSQL at {}: {e}", pg_url()));
            None
        }
    }
}

/// A schema of the test's own, dropped (with everything in it) when this goes.
pub struct Schema(pub String);

impl Schema {
    pub fn new() -> Schema {
        static N: AtomicUsize = AtomicUsize::new(0);
        Schema(format!("audit_t{}x{}x{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst), rand_suffix()))
    }
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() % 100_000
}

impl Drop for Schema {
    fn drop(&mut self) {
        let (url, name) = (pg_url(), self.0.clone());
        // Drop runs outside async: a thread with a runtime of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                if let Ok((c, conn)) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await {
                    tokio::spawn(conn);
                    let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE")).await;
                }
            })
        })
        .join();
    }
}

pub async fn count(c: &tokio_postgres::Client, schema: &str) -> i64 {
    match c.query_one(&format!("SELECT count(*) FROM \"{schema}\".injections"), &[]).await {
        Ok(row) => row.get(0),
        Err(_) => 0,
    }
}

pub async fn wait_until(what: &str, within: Duration, mut f: impl AsyncFnMut() -> bool) {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

/// `mcp-context audit ARGS --json --config CONFIG`, parsed.
fn audit_cli(proxy: &Proxy, args: &[&str]) -> Vec<Value> {
    let out = std::process::Command::new(MCP_CONTEXT)
        .arg("audit")
        .args(args)
        .args(["--json", "--config"])
        .arg(&proxy.config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `mcp-context audit ARGS --config CONFIG` as a table: its lines, each split into cells.
fn audit_table(proxy: &Proxy, args: &[&str]) -> Vec<Vec<String>> {
    let out = std::process::Command::new(MCP_CONTEXT)
        .arg("audit")
        .args(args)
        .arg("--config")
        .arg(&proxy.config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(|l| l.split_whitespace().map(str::to_owned).collect()).collect()
}

/// Each resource block of a message: (id, the block's SHA-256, its body lines).
fn blocks(message: &str) -> Vec<(String, String, Vec<String>)> {
    let mut out = Vec::new();
    let mut rest = message;
    while let Some(start) = rest.find("\n<resource id=\"") {
        let block = &rest[start + 1..];
        let end = block.find("\n</resource>").unwrap() + "\n</resource>".len();
        let text = &block[..end];
        let id = text["<resource id=\"".len()..].split('"').next().unwrap().to_owned();
        let digest: String = Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        let body = text.lines().skip(1).filter(|l| *l != "</resource>").map(str::to_owned).collect();
        out.push((id, digest, body));
        rest = &block[end..];
    }
    out
}

pub fn audit_yaml(schema: &str, pg: &str, file: &str) -> String {
    format!(
        "audit:\n  sinks:\n    - file: {{ path: {file}, max_bytes: 1000000, keep: 2 }}\n    - postgres: {{ url: \"{pg}\", schema: {schema}, table: injections }}\n"
    )
}

/// Alice's and Bob's requests through `serve` are recorded once each, in
/// the JSONL file and in PostgreSQL, with the digest of the very block the
/// upstream received, the upstream's status, the identity source and roles;
/// `mcp-context audit who` / `audit user` answer from the table; no record
/// holds a line of any resource's text.
#[tokio::test]
async fn serve_records_each_injection_and_audit_answers_who_received_what() {
    let test = "serve_records_each_injection_and_audit_answers_who_received_what";
    let Some(db) = pg(test).await else { return };
    let schema = Schema::new();
    let up = Upstream::start().await;
    let serve = default_serve() + &audit_yaml(&schema.0, &pg_url(), "audit/injections.jsonl");
    let tag = tag();
    let body = format!(
        "servers:\n{}policy: policies/\ncontext:\n  max_tokens: 4000\nserve:\n{serve}",
        demo_server("demo", &tag)
    );
    let proxy = Proxy::start_config_with(&body, &up.base, tag, &["--log-format", "json"]).await;
    for (user, n) in [("alice", 2), ("bob", 1)] {
        for _ in 0..n {
            let resp = proxy
                .post("/v1/chat/completions", Some(&format!("key-{user}")), &chat_body("How do I share a note?"))
                .header("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
                .header("x-request-id", format!("req-{user}"))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
        }
    }
    wait_until("three rows", Duration::from_secs(20), async || count(&db, &schema.0).await == 3).await;
    // Exactly one record per injection: none more arrives.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(count(&db, &schema.0).await, 3);

    // What the upstream received, block by block.
    let seen = up.seen();
    assert_eq!(seen.len(), 3);
    let sent: Vec<(String, String, Vec<String>)> =
        seen.iter().flat_map(|s| blocks(s.body["messages"][0]["content"].as_str().unwrap())).collect();
    assert!(sent.iter().any(|(id, _, _)| id == "demo:demo://users/alice/profile"));

    let guide = audit_cli(&proxy, &["who", "--resource", "demo:demo://docs/guide"]);
    let users: Vec<&str> = guide.iter().map(|r| r["user"].as_str().unwrap()).collect();
    assert_eq!(users, ["alice", "alice", "bob"], "{guide:#?}");
    let profile = audit_cli(&proxy, &["who", "--resource", "demo:demo://users/alice/profile", "--since", "1h"]);
    assert_eq!(profile.len(), 2);
    assert!(profile.iter().all(|r| r["user"] == "alice"));
    assert!(audit_cli(&proxy, &["who", "--resource", "demo:secret://payroll/2026"]).is_empty());
    assert!(
        audit_cli(&proxy, &["who", "--resource", "demo:demo://docs/guide", "--since", "2099-01-01T00:00:00Z"])
            .is_empty()
    );

    // The same answers as tables: a header, then one line per injection (`who`) or per resource sent (`user`).
    let table = audit_table(&proxy, &["who", "--resource", "demo:demo://docs/guide"]);
    assert_eq!(table[0], ["time", "user", "via", "route", "sha256", "tokens", "request"], "{table:?}");
    let rows = &table[1..];
    assert_eq!(rows.iter().map(|r| r[1].as_str()).collect::<Vec<_>>(), users, "{table:?}");
    for (row, json) in rows.iter().zip(&guide) {
        let inc = json["included"].as_array().unwrap().iter().find(|i| i["id"] == "demo:demo://docs/guide").unwrap();
        // The digest's first 16 hex digits (enough to tell blocks apart on a terminal).
        let sha = inc["sha256"].as_str().unwrap();
        assert!(row.iter().any(|c| c.len() == 16 && sha.starts_with(c.as_str())), "{row:?} {sha}");
        assert!(row.contains(&json["request_id"].as_str().unwrap().to_owned()), "{row:?}");
    }

    let bob = audit_cli(&proxy, &["user", "bob"]);
    assert_eq!(bob.len(), 1);
    let table = audit_table(&proxy, &["user", "bob"]);
    assert_eq!(table[0][1], "resource", "{table:?}");
    let listed: Vec<&str> = table[1..].iter().map(|r| r[1].as_str()).collect();
    let sent_to_bob: Vec<&str> =
        bob[0]["included"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap()).collect();
    assert_eq!(listed, sent_to_bob, "{table:?}");
    let r = &bob[0];
    assert_eq!((r["route"].as_str(), r["identity_source"].as_str()), (Some("/v1/chat/completions"), Some("key")));
    assert_eq!(r["upstream_status"], 200);
    assert!(r["upstream_ms"].as_f64().unwrap() >= 0.0);
    assert_eq!(r["request_id"], "req-bob");
    assert_eq!(r["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736", "the caller's traceparent's trace id");
    assert_eq!(r["model"], "gpt-4o");
    assert!(r["roles"].as_array().is_some_and(|a| !a.is_empty()), "{r}");
    assert!(r["denied"].as_array().unwrap().iter().any(|d| d == "demo:secret://payroll/2026"), "{r}");
    assert!(r["excluded"]["denied"].as_u64().unwrap() >= 1);
    for inc in r["included"].as_array().unwrap() {
        let id = inc["id"].as_str().unwrap();
        assert_ne!(id, "demo:demo://users/alice/profile", "bob never got alice's profile");
        let block = sent.iter().find(|(i, _, _)| i == id).expect("the upstream got it");
        assert_eq!(inc["sha256"], block.1, "the digest of exactly the block sent, for {id}");
        assert!(inc["tokens"].as_u64().unwrap() > 0);
    }

    // The table: its indexes, and no resource text anywhere in it or the file.
    let idx: Vec<String> = db
        .query("SELECT indexname FROM pg_indexes WHERE schemaname = $1", &[&schema.0])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for want in ["injections_at", "injections_user_at", "injections_set_at", "injections_sets_resources"] {
        assert!(idx.iter().any(|i| i == want), "{want} in {idx:?}");
    }
    // Alice's two unchanged requests share one stored set of resources; Bob's is another.
    let sets: i64 =
        db.query_one(&format!("SELECT count(*) FROM \"{}\".injections_sets", schema.0), &[]).await.unwrap().get(0);
    assert_eq!(sets, 2, "one set per distinct injection");
    let mut rows: Vec<String> = Vec::new();
    for t in ["injections", "injections_sets"] {
        let q = format!("SELECT t::text FROM \"{}\".{t} t", schema.0);
        rows.extend(db.query(&q, &[]).await.unwrap().iter().map(|r| r.get::<_, String>(0)));
    }
    let table = rows.join("\n");
    let file = std::fs::read_to_string(proxy.dir.path().join("audit/injections.jsonl")).unwrap();
    assert_eq!(file.lines().count(), 3, "one line per injection");
    let mut checked = 0;
    for (id, _, body) in &sent {
        for line in body.iter().filter(|l| l.trim().len() >= 12) {
            assert!(!table.contains(line.as_str()), "the table holds text of {id}: {line}");
            assert!(!file.contains(line.as_str()), "the file holds text of {id}: {line}");
            checked += 1;
        }
    }
    assert!(checked >= 5, "enough content lines checked ({checked})");

    // `--log-format json`: one object per line; the report's event carries the request's ids.
    let log = proxy.stderr();
    let events: Vec<Value> = log.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    assert!(!events.is_empty() && events.len() == log.lines().count(), "{log}");
    for (message, user) in [("context built", "\"bob\""), ("injected", "")] {
        let e = events
            .iter()
            .find(|e| e["fields"]["message"] == message && (user.is_empty() || e["fields"]["user"] == user))
            .unwrap_or_else(|| panic!("no `{message}` event in {log}"));
        // The request's span (outermost) carries them, whichever span the event is in.
        let span = e["spans"].as_array().and_then(|s| s.iter().find(|s| s["name"] == "mcp_context.request"));
        let span = span.unwrap_or_else(|| panic!("no request span around {e}"));
        assert_eq!(span["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736", "{e}");
        assert!(span["request_id"].as_str().is_some_and(|r| r.starts_with("req-")), "{e}");
    }
    drop(proxy);
}

/// A TCP relay to PostgreSQL that the test can cut: `close` stops accepting
/// and drops every connection, as a PostgreSQL that went away would.
struct Relay {
    port: u16,
    stop: CancellationToken,
}

impl Relay {
    async fn start() -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = CancellationToken::new();
        let s = stop.clone();
        tokio::spawn(async move {
            loop {
                let (mut inbound, _) = tokio::select! {
                    a = listener.accept() => a.unwrap(),
                    _ = s.cancelled() => return,
                };
                let s = s.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect("127.0.0.1:5432").await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = s.cancelled() => {}
                    }
                });
            }
        });
        Relay { port, stop }
    }

    fn close(&self) {
        self.stop.cancel();
    }
}

fn metric(text: &str, name_and_labels: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(name_and_labels).and_then(|v| v.trim().parse().ok())).unwrap_or(0.0)
}

/// PostgreSQL going away mid-run fails no request and slows none: the
/// records meanwhile are dropped and counted in `/metrics`, `/readyz` says
/// `degraded` with a note, and the rows written before stay.
#[tokio::test]
async fn postgres_going_away_loses_no_request_and_counts_the_dropped_records() {
    let test = "postgres_going_away_loses_no_request_and_counts_the_dropped_records";
    let Some(db) = pg(test).await else { return };
    let schema = Schema::new();
    let relay = Relay::start().await;
    let up = Upstream::start().await;
    let via_relay = pg_url().replace("127.0.0.1:5432", &format!("127.0.0.1:{}", relay.port));
    let serve = default_serve()
        + &format!(
            "audit:\n  sinks:\n    - postgres: {{ url: \"{via_relay}\", schema: {}, table: injections }}\n",
            schema.0
        );
    let proxy = Proxy::start(&serve, &up.base).await;
    let send = async || {
        let started = Instant::now();
        let resp = proxy.post("/v1/chat/completions", Some("key-alice"), &chat_body("hi")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        started.elapsed()
    };
    for _ in 0..3 {
        send().await;
    }
    wait_until("three rows", Duration::from_secs(20), async || count(&db, &schema.0).await == 3).await;
    // The callers sent no traceparent: the upstream got one with each record's trace id.
    let traces: Vec<String> = db
        .query(&format!("SELECT trace_id FROM \"{}\".injections", schema.0), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for s in up.seen() {
        let tp = &s.headers["traceparent"];
        let trace = tp.split('-').nth(1).unwrap();
        assert!(tp.starts_with("00-") && tp.ends_with("-01") && traces.iter().any(|t| t == trace), "{tp} {traces:?}");
    }
    let ready: Value = http().get(format!("{}/readyz", proxy.url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(ready["status"], "ready", "{ready}");

    relay.close();
    let mut slowest = Duration::ZERO;
    for _ in 0..6 {
        slowest = slowest.max(send().await);
    }
    assert!(slowest < Duration::from_secs(2), "a request waited for the audit sink: {slowest:?}");
    let dropped = r#"mcp_context_audit_records_total{sink="postgres",outcome="dropped"}"#;
    let written = r#"mcp_context_audit_records_total{sink="postgres",outcome="written"}"#;
    let mut text = String::new();
    wait_until("six dropped records counted", Duration::from_secs(20), async || {
        text = http().get(format!("{}/metrics", proxy.url)).send().await.unwrap().text().await.unwrap();
        metric(&text, dropped) == 6.0
    })
    .await;
    assert_eq!(metric(&text, written), 3.0, "{text}");
    assert!(text.contains(r#"mcp_context_audit_sink_up{sink="postgres"} 0"#), "{text}");
    let ready: Value = http().get(format!("{}/readyz", proxy.url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(ready["status"], "degraded", "{ready}");
    assert!(ready["notes"][0].as_str().unwrap().contains("audit sink `postgres` is down"), "{ready}");
    assert_eq!(count(&db, &schema.0).await, 3, "the rows written before stay");
    assert_eq!(up.seen().len(), 9, "every request reached the upstream");
    drop(proxy);
}

/// An injection made by the library itself (no proxy) writes one record,
/// `route: library`, without upstream fields.
#[tokio::test]
async fn a_library_injection_writes_one_record() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("audit.jsonl");
    let tag = tag();
    let yaml = format!(
        "servers:\n{}policy: {:?}\naudit:\n  sinks:\n    - file: {{ path: {:?} }}\n",
        demo_server("demo", &tag),
        policies_dir(),
        file
    );
    let config = mcp_context::Config::from_yaml(&yaml, &dir.path().join("c.yaml")).unwrap();
    let ctx = Arc::new(mcp_context::McpContext::from_config(&config).await.unwrap());
    let request = async_openai::types::chat::CreateChatCompletionRequestArgs::default()
        .model("gpt-4o")
        .messages([async_openai::types::chat::ChatCompletionRequestUserMessage::from("hi").into()])
        .build()
        .unwrap();
    let (_, report) = ctx.inject(request, "alice").await.unwrap();
    // An application that verified its own user's token: the record says so, with the roles the policy was
    // applied with (the token's `member`, not the `default_roles` the name alone would get).
    let who =
        mcp_context::identity::Identity::new("dave", mcp_context::identity::IdentitySource::Jwt).with_roles(["member"]);
    let (_, dave) = ctx.build(&mcp_context::ContextRequest::for_user("dave").with_identity(&who)).await.unwrap();
    assert_eq!(dave.roles, ["member"]);
    ctx.close().await;
    let text = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!((lines[1]["user"].as_str(), lines[1]["identity_source"].as_str()), (Some("dave"), Some("jwt")));
    assert_eq!(lines[1]["roles"], json!(["member"]), "{text}");
    let r = &lines[0];
    assert_eq!((r["route"].as_str(), r["identity_source"].as_str()), (Some("library"), Some("library")));
    assert_eq!(r["user"], "alice");
    assert_eq!(r["tokens"], json!(report.tokens));
    assert_eq!(r["included"].as_array().unwrap().len(), report.included.len());
    assert!(r.get("upstream_status").is_none());
    assert_eq!(ctx.audit_status()[0].written, 2);
}

/// The model's `read_mcp_resource` calls leave records too (route
/// `tool:read_mcp_resource`): the resource returned, with the SHA-256 and
/// tokens of the exact text the model got; a refused read (bob asking for
/// alice's profile: "not found" to the model) is counted as `not found`, with no id
/// and nothing of what was asked. No resource text in any record.
#[tokio::test]
async fn the_models_tool_reads_are_audited_too() {
    use mcp_context::tools::READ_TOOL;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("audit.jsonl");
    let yaml = format!(
        "servers:\n{}policy: {:?}\naudit:\n  sinks:\n    - file: {{ path: {:?} }}\n",
        demo_server("demo", &tag()),
        policies_dir(),
        file
    );
    let config = mcp_context::Config::from_yaml(&yaml, &dir.path().join("c.yaml")).unwrap();
    let ctx = mcp_context::McpContext::from_config(&config).await.unwrap();
    let guide = ctx.tools().run("1", READ_TOOL, r#"{"uri":"demo:demo://docs/guide"}"#, "bob").await;
    assert!(!guide.is_error && guide.content.contains("Acme Notes guide"), "{}", guide.content);
    let refused = ctx.tools().run("2", READ_TOOL, r#"{"uri":"demo:demo://users/alice/profile"}"#, "bob").await;
    assert!(refused.is_error, "{}", refused.content);
    ctx.close().await;
    let text = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "{text}");
    for r in &lines {
        assert_eq!((r["route"].as_str(), r["user"].as_str()), (Some("tool:read_mcp_resource"), Some("bob")));
        assert_eq!(r["identity_source"], "library");
    }
    let got = &lines[0];
    assert_eq!(got["included"][0]["id"], "demo:demo://docs/guide");
    let digest: String = Sha256::digest(guide.content.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(got["included"][0]["sha256"], digest.as_str(), "the digest of exactly what the model got");
    let tokens = tiktoken_rs::o200k_base_singleton().encode_ordinary(&guide.content).len();
    assert_eq!(
        (got["included"][0]["tokens"].as_u64(), got["tokens"].as_u64()),
        (Some(tokens as u64), Some(tokens as u64))
    );
    assert_eq!(got["excluded"], json!({}));
    let no = &lines[1];
    assert_eq!(
        (no["included"].clone(), no["excluded"].clone(), no["tokens"].clone()),
        (json!([]), json!({"not found": 1}), json!(0))
    );
    assert!(!text.contains("Acme Notes guide") && !text.contains("alice"), "{text}");
}

/// A table written by the first layout (one `record jsonb` a row, the resources in a GIN-indexed array) is
/// migrated in place when the audit trail next starts: the query answers with the old record whole, its
/// resources now a stored set, and the old columns gone.
#[tokio::test]
async fn a_table_of_the_first_layout_is_migrated_in_place() {
    let test = "a_table_of_the_first_layout_is_migrated_in_place";
    let Some(db) = pg(test).await else { return };
    let schema = Schema::new();
    let s = &schema.0;
    let old = json!({
        "at": "2026-12-02T10:00:00.123Z", "request_id": "req-1", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
        "route": "/v1/chat/completions", "model": "gpt-4o", "user": "alice", "identity_source": "key",
        "roles": ["staff"], "mode": "priority", "budget": 4000, "tokens": 120,
        "included": [{"id": "demo:demo://docs/guide", "sha256": "ab".repeat(32), "tokens": 120, "truncated": false,
                      "passages": false}],
        "excluded": {"denied": 1}, "denied": ["demo:secret://payroll/2026"], "upstream_status": 200,
        "upstream_ms": 1.5, "injection_ms": 0.25
    });
    db.batch_execute(&format!(
        "CREATE SCHEMA \"{s}\";
         CREATE TABLE \"{s}\".injections (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now(),
           request_id text NOT NULL DEFAULT '', trace_id text NOT NULL DEFAULT '', route text NOT NULL DEFAULT '',
           model text NOT NULL DEFAULT '', user_name text NOT NULL DEFAULT '', identity_source text NOT NULL DEFAULT '',
           roles text[] NOT NULL DEFAULT '{{}}', resources text[] NOT NULL DEFAULT '{{}}', upstream_status integer,
           record jsonb NOT NULL DEFAULT '{{}}');
         CREATE INDEX injections_resources ON \"{s}\".injections USING gin (resources);"
    ))
    .await
    .unwrap();
    db.execute(
        &format!(
            "INSERT INTO \"{s}\".injections (at, request_id, trace_id, route, model, user_name, identity_source, roles,
               resources, upstream_status, record)
             SELECT (r->>'at')::timestamptz, r->>'request_id', r->>'trace_id', r->>'route', r->>'model', r->>'user',
               r->>'identity_source', ARRAY(SELECT jsonb_array_elements_text(r->'roles')),
               ARRAY(SELECT e->>'id' FROM jsonb_array_elements(r->'included') e), (r->>'upstream_status')::integer, r
             FROM (SELECT $1::text::jsonb AS r) x"
        ),
        &[&old.to_string()],
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "servers: {{}}\naudit:\n  sinks:\n    - postgres: {{ url: \"{}\", schema: {s}, table: injections }}\n",
        pg_url()
    );
    let config = mcp_context::Config::from_yaml(&yaml, &dir.path().join("c.yaml")).unwrap();
    use mcp_context::audit::{AuditQuery, query};
    for _ in 0..2 {
        let who = AuditQuery::WhoReceived { resource: "demo:demo://docs/guide".into(), since: None };
        let got = query(&config.audit, &who).await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(serde_json::to_value(&got[0]).unwrap(), old, "the old record, whole");
        let by = AuditQuery::ReceivedBy { user: "alice".into(), since: Some("2026-12-02T09:00:00Z".into()) };
        assert_eq!(query(&config.audit, &by).await.unwrap().len(), 1);
        let none = AuditQuery::WhoReceived { resource: "demo:secret://payroll/2026".into(), since: None };
        assert!(query(&config.audit, &none).await.unwrap().is_empty(), "denied is not received");
    }
    let cols: Vec<String> = db
        .query(
            "SELECT column_name::text FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'injections'",
            &[s],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!cols.iter().any(|c| c == "record" || c == "resources"), "{cols:?}");
    let sets: i64 = db.query_one(&format!("SELECT count(*) FROM \"{s}\".injections_sets"), &[]).await.unwrap().get(0);
    assert_eq!(sets, 1);
}
