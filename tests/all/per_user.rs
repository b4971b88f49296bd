//! Per-user upstream credentials (issue 35), `per_user_headers`: each user
//! reaches an MCP server as themselves. The server is
//! tests/mcp_auth/server.py, on the official Python SDK and its own
//! bearer-token support: it maps each API key to a subject, serves each
//! subject its own notes, answers 401 without a valid key, and logs every
//! request's subject and every read (what the tests assert on).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use mcp_context::{McpContext, Policy};
use serde_json::Value;

use crate::common::*;
use crate::sdk::python;

/// 32 bytes, hex: the sealing key of these tests' stores.
const KEY: &str = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";
const ALICE_KEY: &str = "key-alice-7f3c9d21";
const BOB_KEY: &str = "key-bob-c44e0b95";

/// The auth server: its child, port and log.
struct AuthServer {
    _child: tokio::process::Child,
    port: u16,
    log: PathBuf,
    keys: PathBuf,
}

impl AuthServer {
    async fn start(py: &Path, dir: &Path, keys: &[(&str, &str)]) -> AuthServer {
        let keys_file = dir.join("keys.json");
        Self::write_keys(&keys_file, keys);
        let (log, port_file) = (dir.join("server.log"), dir.join("server.port"));
        let child = tokio::process::Command::new(py)
            .arg(Path::new(ROOT).join("tests/mcp_auth/server.py"))
            .arg("--keys")
            .arg(&keys_file)
            .arg("--log")
            .arg(&log)
            .arg("--port-file")
            .arg(&port_file)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let port = crate::common::port_from_file(&port_file, "the auth server").await;
        AuthServer { _child: child, port, log, keys: keys_file }
    }

    fn write_keys(path: &Path, keys: &[(&str, &str)]) {
        let map: serde_json::Map<String, Value> = keys.iter().map(|(k, s)| ((*k).into(), Value::from(*s))).collect();
        std::fs::write(path, serde_json::to_vec(&map).unwrap()).unwrap();
    }

    /// The log's lines, then empties it.
    fn take_log(&self) -> Vec<String> {
        let lines = read_log(&self.log);
        let _ = std::fs::write(&self.log, "");
        lines
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

/// `notes` (per user) and `demo` (shared, stdio), a policy that denies
/// alice her `plan`, and `credentials` as given.
fn config_yaml(server: &AuthServer, tag: &str, credentials: &str) -> String {
    format!(
        "servers:\n  notes:\n    url: {}\n    auth: {{ type: per_user_headers, headers: [Authorization] }}\n{}policy: policy.yaml\ncredentials:\n{credentials}",
        server.url(),
        demo_server("demo", tag)
    )
}

const POLICY: &str = "default_roles: [reader]\nroles:\n  reader:\n    allow:\n      - { server: notes }\n      - { server: demo, uri: \"demo://public/**\" }\nusers:\n  alice:\n    roles: [reader]\n    deny:\n      - { server: notes, uri: \"notes://alice/plan\" }\n";

fn file_credentials() -> String {
    format!("  store: file\n  path: tokens.json\n  key: \"{KEY}\"\n")
}

/// The config in `dir` (with the policy beside it), loaded.
fn write_config(dir: &Path, yaml: &str) -> (PathBuf, mcp_context::Config) {
    std::fs::write(dir.join("policy.yaml"), POLICY).unwrap();
    let path = dir.join("c.yaml");
    std::fs::write(&path, yaml).unwrap();
    (path.clone(), mcp_context::Config::load(&path).unwrap())
}

/// `mcp-context auth set notes --user U --header-stdin Authorization`, the
/// value on stdin; returns stdout and stderr.
fn auth_set(config: &Path, user: &str, value: &str, extra_env: &[(&str, &str)]) -> (String, String) {
    use std::io::Write as _;
    let mut child = std::process::Command::new(MCP_CONTEXT)
        .args(["auth", "set", "notes", "--user", user, "--header-stdin", "Authorization", "--config"])
        .arg(config)
        .envs(extra_env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(format!("{value}\n").as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let (o, e) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "auth set failed: {o}{e}");
    (o, e)
}

/// The auth server knowing alice's and bob's keys, and the config with both
/// keys stored by `auth set`.
async fn alice_and_bob(py: &Path) -> (tempfile::TempDir, AuthServer, mcp_context::Config) {
    let dir = tempfile::tempdir().unwrap();
    let server = AuthServer::start(py, dir.path(), &[(ALICE_KEY, "alice"), (BOB_KEY, "bob")]).await;
    let (path, config) = write_config(dir.path(), &config_yaml(&server, &tag(), &file_credentials()));
    auth_set(&path, "alice", &format!("Bearer {ALICE_KEY}"), &[]);
    auth_set(&path, "bob", &format!("Bearer {BOB_KEY}"), &[]);
    (dir, server, config)
}

fn included(report: &mcp_context::Report) -> Vec<String> {
    let mut ids: Vec<String> = report.included.iter().map(|i| i.id.clone()).collect();
    ids.sort();
    ids
}

fn auth_state(report: &mcp_context::Report, server: &str) -> String {
    report.auth.iter().find(|a| a.server == server).map(|a| a.state.clone()).unwrap_or_default()
}

async fn context(config: &mcp_context::Config) -> McpContext {
    let policy = Policy::load(config.policy.as_ref().unwrap()).unwrap();
    McpContext::with_policy(config, policy).await
}

macro_rules! python_or_skip {
    ($name:expr) => {
        match python() {
            Some(p) => p,
            None => return skip($name, "no target/py-mcp venv with `mcp` (see .ci/run)"),
        }
    };
}

/// Alice and bob each see what the server gives their own key, and our
/// policy narrows alice's further: her denied `plan` is never read. Every
/// request of bob's view carries bob's key (the server's subject log), and
/// the secrets stored by the CLI are not in its output nor in the file.
#[tokio::test]
async fn each_user_sees_what_the_server_gives_them_and_the_policy_narrows_it() {
    let py = python_or_skip!("each_user_sees_what_the_server_gives_them_and_the_policy_narrows_it");
    let dir = tempfile::tempdir().unwrap();
    let server = AuthServer::start(&py, dir.path(), &[(ALICE_KEY, "alice"), (BOB_KEY, "bob")]).await;
    let t = tag();
    let (path, config) = write_config(dir.path(), &config_yaml(&server, &t, &file_credentials()));
    let (out, err) = auth_set(&path, "alice", &format!("Bearer {ALICE_KEY}"), &[]);
    assert!(out.contains("stored Authorization") && !out.contains(ALICE_KEY) && !err.contains(ALICE_KEY), "{out}{err}");
    auth_set(&path, "bob", &format!("Bearer {BOB_KEY}"), &[]);
    let file = std::fs::read_to_string(dir.path().join("tokens.json")).unwrap();
    assert!(!file.contains(ALICE_KEY) && !file.contains(BOB_KEY) && !file.contains("alice"), "{file}");
    server.take_log();

    let ctx = context(&config).await;
    let (_, alice) = ctx.build(&"alice".into()).await.unwrap();
    assert_eq!(
        included(&alice),
        ["demo:demo://public/faq", "notes:notes://alice/todo", "notes:notes://shared/handbook"],
        "{alice:#?}"
    );
    assert_eq!(auth_state(&alice, "notes"), "connected");
    assert!(alice.excluded.iter().any(|e| e.id == "notes:notes://alice/plan"), "denied by our policy");
    let log = server.take_log();
    assert!(!log.iter().any(|l| l.contains("notes://alice/plan")), "a denied resource is never read: {log:?}");
    assert!(log.iter().all(|l| l == "auth alice" || l.starts_with("read alice ")), "{log:?}");

    let (_, bob) = ctx.build(&"bob".into()).await.unwrap();
    assert_eq!(
        included(&bob),
        ["demo:demo://public/faq", "notes:notes://bob/plan", "notes:notes://bob/todo", "notes:notes://shared/handbook"]
    );
    let log = server.take_log();
    assert!(!log.is_empty());
    assert!(
        log.iter().all(|l| l == "auth bob" || l.starts_with("read bob ")),
        "alice's key presented for bob: {log:?}"
    );
    // Alice again: her own view, from its private cache (the server is not asked for her notes again).
    let (msg, again) = ctx.build(&"alice".into()).await.unwrap();
    assert_eq!(included(&again), included(&alice));
    assert!(!msg.unwrap().content.contains("bob's own"));
    let log = server.take_log();
    assert!(log.iter().all(|l| !l.contains("bob") && !l.starts_with("read ")), "{log:?}");
    ctx.close().await;
}

/// A user with no stored secret: `needs_authorization` with what to do,
/// the shared servers still inject; through `serve`, the
/// `x-mcp-context-auth` header and the metric say so per caller.
#[tokio::test]
async fn a_user_without_a_secret_needs_authorization_and_the_others_still_inject() {
    let py = python_or_skip!("a_user_without_a_secret_needs_authorization_and_the_others_still_inject");
    let dir = tempfile::tempdir().unwrap();
    let server = AuthServer::start(&py, dir.path(), &[(ALICE_KEY, "alice")]).await;
    let t = tag();
    let (path, config) = write_config(dir.path(), &config_yaml(&server, &t, &file_credentials()));
    auth_set(&path, "alice", &format!("Bearer {ALICE_KEY}"), &[]);
    let ctx = context(&config).await;
    let (_, carol) = ctx.build(&"carol".into()).await.unwrap();
    assert_eq!(included(&carol), ["demo:demo://public/faq"]);
    assert_eq!(auth_state(&carol, "notes"), "needs_authorization");
    let hint = carol.auth[0].url.clone().unwrap();
    assert!(hint.contains("mcp-context auth set notes"), "{hint}");
    let json = serde_json::to_value(&carol).unwrap();
    assert_eq!(json["auth"][0]["state"], "needs_authorization");
    ctx.close().await;

    // Through serve: the same config, callers identified by their keys.
    let up = crate::serve::Upstream::start().await;
    let body = format!(
        "{}serve:\n{}",
        std::fs::read_to_string(&path)
            .unwrap()
            .replace("path: tokens.json", &format!("path: {:?}", dir.path().join("tokens.json"))),
        crate::serve::default_serve()
    );
    let body = body.replace("policy: policy.yaml", &format!("policy: {:?}", dir.path().join("policy.yaml")));
    let proxy = crate::serve::Proxy::start_config(&body, &up.base, t.clone()).await;
    for (key, want) in [("key-carol", "notes=needs_authorization"), ("key-alice", "notes=connected")] {
        let resp = proxy.post("/v1/chat/completions", Some(key), &crate::serve::chat_body("hi")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-mcp-context-auth"].to_str().unwrap(), want);
    }
    let metrics = http().get(format!("{}/metrics", proxy.url)).send().await.unwrap().text().await.unwrap();
    for want in [
        "mcp_context_upstream_auth_total{server=\"notes\",state=\"needs_authorization\"} 1",
        "mcp_context_upstream_auth_total{server=\"notes\",state=\"connected\"} 1",
    ] {
        assert!(metrics.contains(want), "{want} in\n{metrics}");
    }
    // The upstream got the demo context for carol, and alice's notes for alice only.
    let seen = up.seen();
    let text = |i: usize| seen[i].body["messages"][0]["content"].as_str().unwrap_or_default().to_owned();
    assert!(!text(0).contains("alice's own") && text(1).contains("alice's own todo"));
}

/// The model's two tools see a per-user server as an injection does: each
/// user lists and reads what their own key gives them, under our policy.
/// Another user's URI, a denied one, forged spellings and a user with no
/// credential all read "not found", and the server is never asked for them
/// (its log of subjects and reads).
#[tokio::test]
async fn the_models_tools_list_and_read_each_users_own_resources_only() {
    use mcp_context::tools::{LIST_TOOL, READ_TOOL};
    let py = python_or_skip!("the_models_tools_list_and_read_each_users_own_resources_only");
    let (_dir, server, config) = alice_and_bob(&py).await;
    server.take_log();
    let ctx = context(&config).await;
    let tools = ctx.tools();

    let list = tools.run("l", LIST_TOOL, r#"{"serverName":"notes"}"#, "alice").await;
    assert_eq!(
        list.content,
        "Available MCP Resources:\n- notes:notes://alice/todo | alice's todo\n- notes:notes://shared/handbook | handbook\n",
        "alice's own listing, without her denied plan"
    );
    let all = ctx.visible_resources("bob").await;
    let ids: Vec<String> = all.iter().map(|r| r.id.to_string()).collect();
    assert_eq!(
        ids,
        ["demo:demo://public/faq", "notes:notes://bob/plan", "notes:notes://bob/todo", "notes:notes://shared/handbook"]
    );

    let read = |uri: &str, user: &str| {
        let (args, user) = (serde_json::json!({ "uri": uri }).to_string(), user.to_owned());
        let tools = ctx.tools();
        async move { tools.run("r", READ_TOOL, &args, &user).await }
    };
    server.take_log();
    let todo = read("notes:notes://alice/todo", "alice").await;
    assert_eq!((todo.content.as_str(), todo.is_error), ("alice's own todo: for alice only.", false));
    let log = server.take_log();
    assert!(log.contains(&"read alice notes://alice/todo".to_owned()), "read with alice's key: {log:?}");
    assert!(log.iter().all(|l| l == "auth alice" || l.starts_with("read alice ")), "{log:?}");

    for (uri, user) in [
        ("notes:notes://bob/todo", "alice"),
        ("notes:notes://alice/plan", "alice"),
        ("notes:notes://alice/../bob/todo", "alice"),
        ("notes:notes://alice/%2e%2e/bob/todo", "alice"),
        ("notes:notes://BOB/todo", "alice"),
        ("notes:notes://alice/todo", "bob"),
        ("notes:notes://alice/todo", "carol"),
        ("notes:notes://shared/handbook", "carol"),
    ] {
        let got = read(uri, user).await;
        assert_eq!(
            (got.content.clone(), got.is_error),
            (format!("Error: Resource not found for URI: {uri}"), true),
            "{user} reading {uri}"
        );
    }
    let log = server.take_log();
    assert!(
        log.iter().all(|l| !l.starts_with("read ") && (l == "auth alice" || l == "auth bob")),
        "nothing refused was read, and carol, who has no key, reached the server as nobody: {log:?}"
    );
    assert_eq!(
        tools.run("l", LIST_TOOL, r#"{"serverName":"notes"}"#, "carol").await.content,
        "No resources found for server: notes\n"
    );
    assert!(server.take_log().is_empty(), "carol opens nothing");
    assert!(!ctx.tools().run("l", LIST_TOOL, "{}", "carol").await.content.contains("notes:"));
    ctx.close().await;
}

/// A per-user server's URIs that no listing shows: a role's `include:`
/// (with `{user}`) and a requested `@server:uri` pass the gate against the
/// user's own listing and templates, and are read with the user's key. A
/// requested id naming another user's path matches none of the user's
/// templates: never read, "not found". An include is the operator's word and
/// is read as written, but with the user's own key: the server gives alice
/// nothing of bob's.
#[tokio::test]
async fn includes_and_requested_uris_on_a_per_user_server_pass_the_users_own_gate() {
    let py = python_or_skip!("includes_and_requested_uris_on_a_per_user_server_pass_the_users_own_gate");
    let (_dir, server, config) = alice_and_bob(&py).await;
    let policy = "default_roles: [reader]\nroles:\n  reader:\n    allow:\n      - { server: notes }\n    include:\n      - \"notes:notes://{user}/day/2026-12-05\"\nusers:\n  alice:\n    roles: [reader]\n    include:\n      - \"notes:notes://bob/day/2026-12-05\"\n";
    std::fs::write(config.policy.as_ref().unwrap(), policy).unwrap();
    server.take_log();
    let ctx = context(&config).await;
    let (msg, alice) = ctx.build(&"alice".into()).await.unwrap();
    assert!(included(&alice).contains(&"notes:notes://alice/day/2026-12-05".to_owned()), "{alice:#?}");
    assert!(!included(&alice).iter().any(|i| i.contains("bob")), "{alice:#?}");
    let text = msg.unwrap().content;
    assert!(text.contains("alice's day 2026-12-05: for alice only.") && !text.contains("bob's"), "{text}");
    let log = server.take_log();
    assert!(log.contains(&"read alice notes://alice/day/2026-12-05".to_owned()), "{log:?}");
    assert!(log.iter().all(|l| l == "auth alice" || l.starts_with("read alice ")), "only alice's key: {log:?}");
    let bobs = alice.excluded.iter().find(|e| e.id == "notes:notes://bob/day/2026-12-05").expect("bob's day excluded");
    assert_eq!(bobs.reason, mcp_context::ExcludeReason::Error, "the server refused alice: {bobs:?}");

    // Requested ids: an expansion of alice's template is read; bob's path and a forged one are not.
    let wanted = [
        "notes:notes://alice/day/2026-12-04",
        "notes:notes://bob/day/2026-12-04",
        "notes:notes://alice/day/%2e%2e/plan",
    ];
    let req = mcp_context::ContextRequest::for_user("alice")
        .with_selection(wanted.iter().map(|w| mcp_context::ResourceId::parse(w).unwrap()).collect::<Vec<_>>());
    let (msg, picked) = ctx.build(&req).await.unwrap();
    assert_eq!(included(&picked), ["notes:notes://alice/day/2026-12-04"], "{picked:#?}");
    assert!(msg.unwrap().content.contains("alice's day 2026-12-04"));
    for refused in &wanted[1..] {
        let e = picked.excluded.iter().find(|e| e.id == *refused).unwrap_or_else(|| panic!("{refused}: {picked:#?}"));
        assert_eq!(e.reason, mcp_context::ExcludeReason::NotFound, "{refused}");
    }
    let log = server.take_log();
    assert!(log.iter().all(|l| l == "auth alice" || l == "read alice notes://alice/day/2026-12-04"), "{log:?}");

    // The gate the chatbot's mentions pass: alice's own templates, nobody else's; carol has no view.
    let id = |s: &str| mcp_context::ResourceId::parse(s).unwrap();
    assert!(ctx.admit("alice", &id("notes:notes://alice/day/2026-01-01")).await.is_ok());
    assert!(ctx.admit("alice", &id("notes:notes://bob/day/2026-01-01")).await.is_err());
    assert!(ctx.admit("carol", &id("notes:notes://carol/day/2026-01-01")).await.is_err());
    assert!(server.take_log().iter().all(|l| !l.starts_with("read ")), "the gate reads nothing");

    // Bob's own include is his, read with his key.
    let (_, bob) = ctx.build(&"bob".into()).await.unwrap();
    assert!(included(&bob).contains(&"notes:notes://bob/day/2026-12-05".to_owned()), "{bob:#?}");
    let log = server.take_log();
    assert!(log.contains(&"read bob notes://bob/day/2026-12-05".to_owned()), "{log:?}");
    assert!(log.iter().all(|l| l == "auth bob" || l.starts_with("read bob ")), "only bob's key: {log:?}");
    ctx.close().await;
}

/// A per-user view follows its server's `list_changed` like a shared
/// server does, on both protocol revisions (2025-11-25's stream, 2026-07-28's
/// `subscriptions/listen`): a resource gone from the server's listing leaves
/// alice's, and one that appears joins it. The server is the Rust
/// fixture over Streamable HTTP, reached with alice's header.
#[tokio::test]
async fn a_views_listing_follows_list_changed_on_both_revisions() {
    for protocol in ["2025-11-25", "2026-07-28"] {
        let dir = tempfile::tempdir().unwrap();
        let list = dir.path().join("n.txt");
        std::fs::write(&list, "3").unwrap();
        let opts = crate::handler::Options {
            n: 3,
            size: 64,
            subscribe: true,
            list_file: Some(list.to_string_lossy().into_owned()),
            ..Default::default()
        };
        let (mcp, _fixture, _stop) = http_fixture(opts).await;
        let yaml = format!(
            "servers:\n  notes:\n    url: {mcp}\n    protocol: \"{protocol}\"\n    auth: {{ type: per_user_headers, headers: [Authorization] }}\ncredentials:\n{}",
            file_credentials()
        );
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, &yaml).unwrap();
        let config = mcp_context::Config::load(&path).unwrap();
        auth_set(&path, "alice", "Bearer key-alice", &[]);
        let ctx = McpContext::from_config(&config).await.unwrap();
        let (_, r) = ctx.build(&"alice".into()).await.unwrap();
        assert_eq!(auth_state(&r, "notes"), "connected", "{protocol}: {r:#?}");
        // The view's listing (nothing read: a read error cannot stand in for a listing change).
        let docs = async |ctx: &McpContext| -> Vec<String> {
            ctx.visible_resources("alice").await.iter().map(|r| r.id.to_string()).collect()
        };
        assert_eq!(docs(&ctx).await, ["notes:fx://doc/0", "notes:fx://doc/1", "notes:fx://doc/2"], "{protocol}");
        std::fs::write(&list, "2").unwrap();
        assert!(
            eventually(async || docs(&ctx).await == ["notes:fx://doc/0", "notes:fx://doc/1"]).await,
            "{protocol}: the view never dropped fx://doc/2: {:?}",
            docs(&ctx).await
        );
        std::fs::write(&list, "4").unwrap();
        assert!(eventually(async || docs(&ctx).await.len() == 4).await, "{protocol}: {:?}", docs(&ctx).await);
        ctx.close().await;
    }
}

fn http() -> reqwest::Client {
    crate::serve::http()
}

/// A key the server refuses (revoked): `denied_by_server` for that user
/// only; the others are unaffected, and nothing falls back to anyone
/// else's key.
#[tokio::test]
async fn a_refused_key_is_denied_by_server_for_that_user_only() {
    let py = python_or_skip!("a_refused_key_is_denied_by_server_for_that_user_only");
    let (_dir, server, config) = alice_and_bob(&py).await;
    // Bob's key is revoked before anything connects.
    AuthServer::write_keys(&server.keys, &[(ALICE_KEY, "alice")]);
    server.take_log();
    let ctx = context(&config).await;
    let (_, bob) = ctx.build(&"bob".into()).await.unwrap();
    assert_eq!(auth_state(&bob, "notes"), "denied_by_server", "{bob:#?}");
    assert_eq!(included(&bob), ["demo:demo://public/faq"]);
    let log = server.take_log();
    assert!(log.iter().all(|l| l == "auth -"), "only bob's refused key was presented: {log:?}");
    let (_, alice) = ctx.build(&"alice".into()).await.unwrap();
    assert_eq!(auth_state(&alice, "notes"), "connected");
    assert!(included(&alice).contains(&"notes:notes://alice/todo".to_owned()));
    // Bob stays denied (no retry with anything else) until his credential changes.
    let (_, bob) = ctx.build(&"bob".into()).await.unwrap();
    assert_eq!(auth_state(&bob, "notes"), "denied_by_server");
    ctx.close().await;
}

/// User names with `/`, `..`, `:`, spaces and other cases never reach
/// alice's record or view; and 2000 users with nothing stored open no
/// connection, while users with one stay within `max_users`.
#[tokio::test]
async fn odd_user_names_reach_nobody_elses_record_and_views_stay_bounded() {
    let py = python_or_skip!("odd_user_names_reach_nobody_elses_record_and_views_stay_bounded");
    let dir = tempfile::tempdir().unwrap();
    let mut keys = vec![(ALICE_KEY.to_owned(), "alice".to_owned())];
    for i in 0..5 {
        keys.push((format!("key-u{i}-000{i}"), format!("u{i}")));
    }
    let pairs: Vec<(&str, &str)> = keys.iter().map(|(k, s)| (k.as_str(), s.as_str())).collect();
    let server = AuthServer::start(&py, dir.path(), &pairs).await;
    let t = tag();
    let creds = format!("{}  max_users: 3\n", file_credentials());
    let (path, config) = write_config(dir.path(), &config_yaml(&server, &t, &creds));
    auth_set(&path, "alice", &format!("Bearer {ALICE_KEY}"), &[]);
    server.take_log();
    let ctx = context(&config).await;
    for odd in [
        "Alice",
        "ALICE",
        "alice ",
        " alice",
        "../alice",
        "alice/..",
        "alice:",
        ":alice",
        "notes:alice",
        "alice/",
        "al/ice",
    ] {
        let (msg, r) = ctx.build(&odd.into()).await.unwrap();
        assert_eq!(auth_state(&r, "notes"), "needs_authorization", "{odd:?}");
        assert!(msg.is_none_or(|m| !m.content.contains("alice's own")), "{odd:?} got alice's notes");
    }
    assert!(server.take_log().is_empty(), "no request was made for any odd name");
    assert_eq!(ctx.per_user_views(), 0);
    for i in 0..2000 {
        let (_, r) = ctx.build(&format!("nobody-{i}").into()).await.unwrap();
        assert_eq!(auth_state(&r, "notes"), "needs_authorization");
    }
    assert_eq!(ctx.per_user_views(), 0, "users with nothing stored open nothing");
    let store = ctx.credentials().unwrap().store().clone();
    for i in 0..5 {
        let mut t = mcp_context::credentials::TokenSet::bearer(String::new().into(), "notes");
        t.headers = vec![("Authorization".into(), format!("Bearer key-u{i}-000{i}").into())];
        store.put("notes", &format!("u{i}"), &t).await.unwrap();
        let (_, r) = ctx.build(&format!("u{i}").into()).await.unwrap();
        assert_eq!(auth_state(&r, "notes"), "connected");
        assert!(included(&r).contains(&format!("notes:notes://u{i}/todo")), "{r:#?}");
        assert!(ctx.per_user_views() <= 3, "{} views open", ctx.per_user_views());
    }
    assert_eq!(ctx.per_user_views(), 3);
    ctx.close().await;
}

/// With the Redis stores: a second replica uses the secret the first
/// stored, and no per-user listing or content reaches Redis (only sealed
/// credentials do).
#[tokio::test]
async fn a_second_replica_uses_the_stored_secret_and_per_user_contents_never_reach_redis() {
    let py = python_or_skip!("a_second_replica_uses_the_stored_secret_and_per_user_contents_never_reach_redis");
    let url = std::env::var("MCP_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
    let Ok(mut redis) = redis::Client::open(url.as_str()).and_then(|c| c.get_connection()) else {
        return skip("a_second_replica_uses_the_stored_secret_and_per_user_contents_never_reach_redis", "no Redis");
    };
    let dir = tempfile::tempdir().unwrap();
    let server = AuthServer::start(&py, dir.path(), &[(ALICE_KEY, "alice")]).await;
    let t = tag();
    let prefix = format!("mcp-context-test:{t}:");
    let creds = format!(
        "  store: redis\n  key: \"{KEY}\"\ncache:\n  backend: redis\n  url: {url}\n  key_prefix: \"{prefix}\"\n"
    );
    let (_, config) = write_config(dir.path(), &config_yaml(&server, &t, &creds));
    let first = context(&config).await;
    let mut tokens = mcp_context::credentials::TokenSet::bearer(String::new().into(), "notes");
    tokens.headers = vec![("Authorization".into(), format!("Bearer {ALICE_KEY}").into())];
    first.credentials().unwrap().store().put("notes", "alice", &tokens).await.unwrap();
    let second = context(&config).await;
    let (_, r) = second.build(&"alice".into()).await.unwrap();
    assert!(included(&r).contains(&"notes:notes://alice/todo".to_owned()), "{r:#?}");
    let (_, r1) = first.build(&"alice".into()).await.unwrap();
    assert_eq!(included(&r1), included(&r));
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}*")).query(&mut redis).unwrap();
    assert!(keys.iter().any(|k| k.starts_with(&format!("{prefix}cred:notes:"))), "{keys:?}");
    for k in &keys {
        assert!(!k.contains("alice") && !k.contains("notes://"), "{k}");
        let kind: String = redis::cmd("TYPE").arg(k).query(&mut redis).unwrap();
        let dump: Vec<u8> = redis::cmd("DUMP").arg(k).query(&mut redis).unwrap();
        let text = String::from_utf8_lossy(&dump);
        for secret in [ALICE_KEY, "alice's own", "notes://alice", "handbook everybody"] {
            assert!(!text.contains(secret), "{secret} in Redis key {k} ({kind})");
        }
    }
    first.close().await;
    second.close().await;
    if !keys.is_empty() {
        let _: redis::RedisResult<()> = redis::cmd("DEL").arg(&keys).query(&mut redis);
    }
}

/// Nothing of a stored secret in the logs at debug level (the CLI's
/// `preview -vv` with every target at debug), nor in its report.
#[tokio::test]
async fn no_secret_in_debug_logs_or_the_report() {
    let py = python_or_skip!("no_secret_in_debug_logs_or_the_report");
    let dir = tempfile::tempdir().unwrap();
    let server = AuthServer::start(&py, dir.path(), &[(ALICE_KEY, "alice")]).await;
    let t = tag();
    let (path, _) = write_config(dir.path(), &config_yaml(&server, &t, &file_credentials()));
    let (o, e) = auth_set(
        &path,
        "alice",
        &format!("Bearer {ALICE_KEY}"),
        &[("MCP_CONTEXT_LOG", "debug"), ("RUST_LOG", "debug")],
    );
    assert!(!o.contains(ALICE_KEY) && !e.contains(ALICE_KEY));
    for log in ["debug", "trace"] {
        let out = std::process::Command::new(MCP_CONTEXT)
            .args(["preview", "--json", "-vv", "--user", "alice", "--config"])
            .arg(&path)
            .env("MCP_CONTEXT_LOG", log)
            .env("RUST_LOG", log)
            .env("MCP_TEST_TAG", &t)
            .output()
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{stderr}");
        assert!(stdout.contains("alice's own todo"), "{stdout}");
        assert!(!stdout.contains(ALICE_KEY), "secret in the report");
        assert!(!stderr.contains(ALICE_KEY) && !stderr.contains("7f3c9d21"), "secret in the {log} log");
        assert!(stderr.len() > 1000, "the {log} log said something ({} bytes)", stderr.len());
    }
    let status = std::process::Command::new(MCP_CONTEXT)
        .args(["auth", "status", "--user", "alice", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&status.stdout);
    assert!(s.contains("notes\tper_user_headers\tstored\tAuthorization") && !s.contains(ALICE_KEY), "{s}");
}

/// A key revoked while its view is open: the read it makes is refused
/// (401), and from then on that user is `denied_by_server`; the others go on.
#[tokio::test]
async fn a_key_revoked_while_connected_becomes_denied_by_server() {
    let py = python_or_skip!("a_key_revoked_while_connected_becomes_denied_by_server");
    let dir = tempfile::tempdir().unwrap();
    let server = AuthServer::start(&py, dir.path(), &[(ALICE_KEY, "alice"), (BOB_KEY, "bob")]).await;
    let t = tag();
    // No content cache for `notes`: every injection reads.
    let yaml = config_yaml(&server, &t, &file_credentials())
        .replace("headers: [Authorization] }\n", "headers: [Authorization] }\n    cache: false\n");
    let (path, config) = write_config(dir.path(), &yaml);
    auth_set(&path, "alice", &format!("Bearer {ALICE_KEY}"), &[]);
    auth_set(&path, "bob", &format!("Bearer {BOB_KEY}"), &[]);
    let ctx = context(&config).await;
    for u in ["alice", "bob"] {
        let (_, r) = ctx.build(&u.into()).await.unwrap();
        assert_eq!(auth_state(&r, "notes"), "connected", "{u}");
    }
    AuthServer::write_keys(&server.keys, &[(BOB_KEY, "bob")]);
    let (_, first) = ctx.build(&"alice".into()).await.unwrap();
    assert!(!included(&first).iter().any(|i| i.starts_with("notes:")), "{first:#?}");
    let (_, alice) = ctx.build(&"alice".into()).await.unwrap();
    assert_eq!(auth_state(&alice, "notes"), "denied_by_server", "{alice:#?}");
    assert_eq!(included(&alice), ["demo:demo://public/faq"]);
    let (_, bob) = ctx.build(&"bob".into()).await.unwrap();
    assert_eq!(auth_state(&bob, "notes"), "connected");
    assert!(included(&bob).contains(&"notes:notes://bob/todo".to_owned()));
    ctx.close().await;
}

/// A view unused for `idle_timeout_ms` is closed (the server sees its
/// session end); the user's next injection opens a new one.
#[tokio::test]
async fn an_idle_view_is_closed_and_reopened_on_demand() {
    let py = python_or_skip!("an_idle_view_is_closed_and_reopened_on_demand");
    let dir = tempfile::tempdir().unwrap();
    let server = AuthServer::start(&py, dir.path(), &[(ALICE_KEY, "alice")]).await;
    let t = tag();
    let creds = format!("{}  idle_timeout_ms: 300\n", file_credentials());
    let (path, config) = write_config(dir.path(), &config_yaml(&server, &t, &creds));
    auth_set(&path, "alice", &format!("Bearer {ALICE_KEY}"), &[]);
    let ctx = context(&config).await;
    let (_, r) = ctx.build(&"alice".into()).await.unwrap();
    assert_eq!(auth_state(&r, "notes"), "connected");
    assert_eq!(ctx.per_user_views(), 1);
    assert!(eventually(async || ctx.per_user_views() == 0).await, "the idle view was not closed");
    server.take_log();
    let (_, r) = ctx.build(&"alice".into()).await.unwrap();
    assert!(included(&r).contains(&"notes:notes://alice/todo".to_owned()));
    assert_eq!(ctx.per_user_views(), 1);
    assert!(server.take_log().iter().any(|l| l == "read alice notes://alice/todo"), "read again through a new view");
    ctx.close().await;
}
