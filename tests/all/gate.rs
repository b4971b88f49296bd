//! Requested URIs cannot walk around the policy by spelling (case, dot
//! segments, percent-encoding, backslashes, empty segments), through any
//! entry point: `preview --select`, a chatbot `@` mention, the model's read
//! tool, a policy `include` with a hostile user name, and `policy explain`.
//!
//! The servers here (`fixture --fs`) normalise what they are asked for as
//! real ones do (scheme and host lower-cased, percent-decoded once, `\` as
//! `/`, dot and empty segments resolved) and log the *resolved* URI of every
//! read, so a spelling that the policy misjudged would show up as a read of
//! `file:///secrets/key.txt` or `secret://payroll`, and as their canaries.
//!
//! Nothing requested is rewritten (issue 28): servers on the official SDKs
//! (tests/python-mcp/templates.py, tests/node/ts-templates.mjs) match URIs
//! and templates case-sensitively, so `users://Bob/profile` and
//! `users://bob/profile` are two people's records; their read logs show that
//! what was read is exactly what was asked, and that an expansion is decided
//! with its template's MIME type.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use mcp_context::{ContextRequest, McpContext, Policy, ResourceId};
use proptest::strategy::{Strategy, ValueTree};

use crate::chatbot::chatbot_binary;
use crate::common::*;
use crate::handler::{FS_FILES, resolve};

const KEY_CANARY: &str = "KEY-CANARY-93c1";
const PAYROLL_CANARY: &str = "PAYROLL-CANARY-5e7a";

/// alice: everything but secrets (like the demo's staff role); dora and
/// anyone unknown: only `file:///docs/**`, plus an include named after them;
/// erin: only accounts (`acc://users/**`, spelled so).
const POLICY: &str = r#"
default_roles: [docs]
roles:
  staff:
    allow: [ { server: "*", uri: "**" } ]
    deny:
      - { uri: "secret://**" }
      - { server: fs, uri: "file:///secrets/**" }
  docs:
    allow: [ { server: fs, uri: "file:///docs/**" } ]
    include: [ "fs:file:///docs/{user}" ]
users:
  alice: { roles: [staff] }
  dora: { roles: [docs] }
  erin: { allow: [ { server: acc, uri: "acc://users/**" } ] }
"#;

/// Every spelling of a denied resource from the issue, and a few more.
const HOSTILE: &[&str] = &[
    "acc:SECRET://payroll",
    "acc:Secret://PAYROLL",
    "acc:secret://payroll/.",
    "acc:secret://x/../payroll",
    "fs:file:///docs/../secrets/key.txt",
    "fs:file:///docs/%2e%2e/secrets/key.txt",
    "fs:file:///docs/%2E%2E/secrets/key.txt",
    "fs:file:///docs/..%2fsecrets/key.txt",
    "fs:file:///docs/..%2Fsecrets%2Fkey.txt",
    "fs:file:///docs/./../secrets/key.txt",
    "fs:file:///docs/..\\secrets\\key.txt",
    "fs:file:///docs//..//secrets/key.txt",
    "fs:FILE:///docs/../secrets/key.txt",
    "fs:file:///docs/%252e%252e/secrets/key.txt",
    "fs:file:///docs/%2e%2e%5csecrets%5ckey.txt",
    "fs:file:///secrets/key.txt",
    "fs:FILE:///secrets/key.txt",
];

/// Uses that must keep working: listed resources, template expansions with
/// subfolders, an account through `acc://users/{id}`.
const LEGIT: &[(&str, &str)] = &[
    ("fs:file:///docs/readme.txt", "readme: public docs"),
    ("fs:file:///docs/sub/guide.md", "guide: how to"),
    ("fs:file:///docs/a/b/c.txt", "doc at /docs/a/b/c.txt"),
];

struct Setup {
    _dir: tempfile::TempDir,
    config: PathBuf,
    logs: [PathBuf; 2],
}

impl Setup {
    fn new(tag: &str) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let logs = [dir.path().join("fs.log"), dir.path().join("acc.log")];
        let policy = dir.path().join("policy.yaml");
        std::fs::write(&policy, POLICY).unwrap();
        let yaml = format!(
            "servers:\n{}{}policy: {policy:?}\ncontext:\n  max_tokens: 4000\n",
            fixture_server("fs", tag, &["--n", "0", "--fs", "--record", logs[0].to_str().unwrap()]),
            fixture_server("acc", tag, &["--n", "0", "--fs", "--record", logs[1].to_str().unwrap()]),
        );
        let config = dir.path().join("c.yaml");
        std::fs::write(&config, yaml).unwrap();
        Setup { _dir: dir, config, logs }
    }

    /// Every resolved URI the servers read, as `server:uri`.
    fn reads(&self) -> Vec<String> {
        let mut out: Vec<String> = read_log(&self.logs[0]).into_iter().map(|u| format!("fs:{u}")).collect();
        out.extend(read_log(&self.logs[1]).into_iter().map(|u| format!("acc:{u}")));
        out
    }

    /// No read resolved to a resource `user` may not see.
    fn assert_no_denied_read(&self, user: &str) {
        for read in self.reads() {
            let (server, uri) = read.split_once(':').unwrap();
            assert!(may_see(user, server, uri), "{user}: the server read {read}");
        }
    }

    async fn context(&self) -> McpContext {
        McpContext::from_config(&mcp_context::Config::load(&self.config).unwrap()).await.unwrap()
    }

    fn cli(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(MCP_CONTEXT).arg("--config").arg(&self.config).args(args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// The policy above, stated independently over *resolved* URIs.
fn may_see(user: &str, server: &str, resolved: &str) -> bool {
    match user {
        "alice" => !(resolved.starts_with("secret://") || server == "fs" && resolved.starts_with("file:///secrets/")),
        "erin" => server == "acc" && resolved.starts_with("acc://users/"),
        _ => server == "fs" && resolved.starts_with("file:///docs/"),
    }
}

fn assert_no_canary(what: &str, text: &str) {
    assert!(!text.contains(KEY_CANARY) && !text.contains(PAYROLL_CANARY), "{what} leaked a secret:\n{text}");
}

#[test]
fn preview_select_refuses_every_spelling_and_reads_nothing_denied() {
    let t = tag();
    let s = Setup::new(&t);
    // A spelling that is exactly a listed URI is decided as listed (and denied); any other is an id no server
    // offers, and `--select` of one exits 1 naming it, having read nothing.
    let listed = |id: &str| FS_FILES.iter().any(|(f, _)| id.split_once(':').unwrap().1 == *f);
    for user in ["alice", "dora"] {
        let mut args = vec!["preview", "--user", user, "--json"];
        for id in HOSTILE.iter().chain(LEGIT.iter().map(|(id, _)| id)) {
            args.extend(["--select", id]);
        }
        let (ok, stdout, stderr) = s.cli(&args);
        assert!(!ok, "unknown ids are refused: {stdout}");
        assert_no_canary("preview", &stdout);
        assert_no_canary("preview", &stderr);
        for id in HOSTILE.iter().filter(|id| !listed(id)) {
            assert!(stderr.contains(&format!("`{id}`")), "{user}: {id} not named: {stderr}");
        }
        s.assert_no_denied_read(user);

        let mut args = vec!["preview", "--user", user, "--json"];
        for id in HOSTILE.iter().filter(|id| listed(id)).chain(LEGIT.iter().map(|(id, _)| id)) {
            args.extend(["--select", id]);
        }
        let (ok, stdout, stderr) = s.cli(&args);
        assert!(ok, "{stderr}");
        assert_no_canary("preview", &stdout);
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let content = v["message"]["content"].as_str().unwrap_or_default();
        for (id, text) in LEGIT {
            assert!(content.contains(text), "{user}: {id} is missing:\n{content}");
        }
        let included: Vec<&str> = v["included"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap()).collect();
        let excluded = v["excluded"].as_array().unwrap();
        for id in HOSTILE.iter().filter(|id| listed(id)) {
            assert!(!included.contains(id), "{user}: {id} included");
            let e = excluded.iter().find(|e| e["id"] == *id).unwrap_or_else(|| panic!("{user}: {id} absent"));
            assert_eq!(e["reason"], "denied", "{user}: {id}");
        }
        // `SECRET://payroll` is not the listed `secret://payroll`: nothing
        // decided (or read) that listed secret.
        assert!(!excluded.iter().any(|e| e["id"] == "acc:secret://payroll"), "{user}: {excluded:?}");
        s.assert_no_denied_read(user);
    }
    assert!(!s.reads().is_empty(), "the legitimate resources were read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_tool_answers_every_spelling_as_not_found() {
    let t = tag();
    let s = Setup::new(&t);
    let ctx = s.context().await;
    for user in ["alice", "dora"] {
        for id in HOSTILE {
            let args = serde_json::json!({ "uri": id }).to_string();
            let r = ctx.tools().run("call", mcp_context::tools::READ_TOOL, &args, user).await;
            assert_eq!(r.content, format!("Error: Resource not found for URI: {id}"), "{user}: {id}");
            assert!(r.is_error);
        }
        for (id, text) in LEGIT {
            let args = serde_json::json!({ "uri": id }).to_string();
            let r = ctx.tools().run("call", mcp_context::tools::READ_TOOL, &args, user).await;
            assert_eq!(r.content.trim_end(), *text, "{user}: {id}");
        }
        s.assert_no_denied_read(user);
    }
    // A template expansion that is not under /docs: read for alice, refused for dora.
    let args = serde_json::json!({ "uri": "acc:acc://users/alice" }).to_string();
    assert_eq!(
        ctx.tools().run("c", mcp_context::tools::READ_TOOL, &args, "alice").await.content.trim_end(),
        "account alice"
    );
    assert!(ctx.tools().run("c", mcp_context::tools::READ_TOOL, &args, "dora").await.is_error);
    ctx.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_user_name_cannot_steer_an_include() {
    let t = tag();
    let s = Setup::new(&t);
    let ctx = s.context().await;
    // The include is `fs:file:///docs/{user}`, allowed by `file:///docs/**`.
    for user in [
        "../secrets/key.txt",
        "..%2fsecrets%2fkey.txt",
        "%2e%2e/secrets/key.txt",
        "..\\secrets\\key.txt",
        "./../secrets/key.txt",
        "..",
        ".",
        "/../secrets/key.txt",
    ] {
        let (message, report) = ctx.build(&ContextRequest::for_user(user)).await.unwrap();
        assert_no_canary(user, message.as_ref().map_or("", |m| m.content.as_str()));
        // The listed documents only: the include never goes in.
        let ids: Vec<&str> = report.included.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["fs:file:///docs/readme.txt", "fs:file:///docs/sub/guide.md"], "{user}");
        s.assert_no_denied_read(user);
    }
    // The same include for an ordinary name is read.
    let (message, report) = ctx.build(&ContextRequest::for_user("dora")).await.unwrap();
    assert!(message.unwrap().content.contains("doc at /docs/dora"), "{report:#?}");
    let mut reads = read_log(&s.logs[0]);
    reads.sort();
    assert_eq!(reads, ["file:///docs/dora", "file:///docs/readme.txt", "file:///docs/sub/guide.md"]);
    ctx.close().await;
}

#[test]
fn the_chatbot_leaves_every_hostile_mention_out() {
    let t = tag();
    let s = Setup::new(&t);
    let line: Vec<String> = HOSTILE.iter().chain(LEGIT.iter().map(|(id, _)| id)).map(|id| format!("@{id}")).collect();
    for user in ["alice", "dora"] {
        let mut child = Command::new(chatbot_binary())
            .args(["--config", s.config.to_str().unwrap(), "--user", user, "--dry-run"])
            .env_remove("OPENAI_BASE_URL")
            .env_remove("OPENAI_API_KEY")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), format!("{} what?\n", line.join(" ")).as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_no_canary("chatbot", &stdout);
        for id in HOSTILE {
            assert!(stdout.contains(&format!("(@{id} is not available to {user}")), "{user}: {id}:\n{stdout}");
        }
        for (id, text) in LEGIT {
            assert!(stdout.contains(text), "{user}: {id}:\n{stdout}");
        }
        s.assert_no_denied_read(user);
    }
}

#[test]
fn policy_explain_decides_through_the_same_gate() {
    let t = tag();
    let s = Setup::new(&t);
    for user in ["alice", "dora"] {
        for id in HOSTILE {
            let (ok, stdout, stderr) = s.cli(&["policy", "explain", "--user", user, id]);
            assert!(ok, "{stderr}");
            assert!(stdout.starts_with("DENY "), "{user} {id}:\n{stdout}");
        }
        for (id, _) in LEGIT {
            let (_, stdout, _) = s.cli(&["policy", "explain", "--user", user, id]);
            assert!(stdout.starts_with(&format!("ALLOW {id} for user {user}")), "{user} {id}:\n{stdout}");
        }
    }
    // Never rewritten: `SECRET://payroll` is not the listed `secret://payroll`.
    let (_, stdout, _) = s.cli(&["policy", "explain", "--user", "alice", "acc:SECRET://payroll"]);
    assert!(stdout.starts_with("DENY acc:SECRET://payroll for user alice"), "{stdout}");
    assert!(stdout.contains("refused before the policy: not found"), "{stdout}");
    let (_, stdout, _) = s.cli(&["policy", "explain", "--user", "alice", "acc:secret://payroll"]);
    assert!(stdout.contains("secret://**"), "the deciding rule is named:\n{stdout}");
    let (_, stdout, _) = s.cli(&["policy", "explain", "--user", "alice", "acc:acc://users/{id}"]);
    assert!(stdout.contains("refused before the policy: not found"), "the unexpanded template:\n{stdout}");
    let (_, stdout, _) = s.cli(&["policy", "explain", "--user", "dora", "fs:file:///docs/../secrets/key.txt"]);
    assert!(stdout.contains("refused before the policy: it contains a `.` or `..` path segment"), "{stdout}");
    let (_, stdout, _) = s.cli(&["policy", "explain", "--user", "dora", "fs:file:///docs/x/y.txt"]);
    assert!(stdout.contains("an expansion of the template file:///{+path}"), "{stdout}");
    // explain reads nothing.
    assert!(s.reads().is_empty(), "{:?}", s.reads());
}

/// Random URIs built from an allowed prefix plus dot segments, encodings,
/// case changes and separators: whatever the server resolves a request to,
/// it never reads a resource outside what the user may see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_random_spelling_reaches_a_denied_resource() {
    let t = tag();
    let s = Setup::new(&t);
    let ctx = s.context().await;
    // docs/ + noise + a traversal (or none) + a target, joined by random separators.
    let noise = proptest::sample::select(vec!["sub", ".", "%2e", "", "a.b", "SUB", "%73ub", "{x}", "{+path}"]);
    let up = proptest::sample::select(vec![
        "..",
        "%2e%2e",
        "%2E%2e",
        ".%2e",
        "%2e.",
        "%252e%252e",
        "..;",
        ". .",
        "...",
        "%2e%2e%00",
    ]);
    let target = proptest::sample::select(vec![
        "secrets/key.txt",
        "SECRETS/key.txt",
        "%73ecrets/key.txt",
        "readme.txt",
        "x/y.txt",
        "{+path}",
    ]);
    let sep = proptest::sample::select(vec!["/", "//", "\\", "%2f", "%2F", "%5c", "/./", "/%2e/"]);
    // Mostly the listed spelling: the others are never admitted.
    let scheme = proptest::sample::select(vec!["file", "file", "file", "file", "file", "file", "FILE", "File", "fIlE"]);
    let strategy = (
        scheme,
        proptest::collection::vec((noise, sep.clone()), 0..3),
        proptest::collection::vec((up, sep.clone()), 0..3),
        (target, sep),
    )
        .prop_map(|(scheme, noise, ups, (target, last))| {
            let mut uri = format!("fs:{scheme}:///docs/");
            for (piece, sep) in noise.iter().chain(&ups) {
                uri.push_str(piece);
                uri.push_str(sep);
            }
            // The target's own separator may be spelled oddly too.
            uri.push_str(&target.replacen('/', last, 1));
            uri
        });
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let uris: Vec<String> = (0..800).map(|_| strategy.new_tree(&mut runner).unwrap().current()).collect();
    let mut admitted = 0;
    for (i, uri) in uris.iter().enumerate() {
        let args = serde_json::json!({ "uri": uri }).to_string();
        let r = ctx.tools().run("call", mcp_context::tools::READ_TOOL, &args, "dora").await;
        assert_no_canary(uri, &r.content);
        admitted += usize::from(!r.is_error);
        if i % 8 == 0 {
            let Ok(id) = ResourceId::parse(uri) else { continue };
            let req = ContextRequest::for_user("dora").with_selection(vec![id]);
            let (message, _) = ctx.build(&req).await.unwrap();
            assert_no_canary(uri, message.as_ref().map_or("", |m| m.content.as_str()));
        }
    }
    // Every read the server did, resolved its way, is one dora may see.
    s.assert_no_denied_read("dora");
    for read in s.reads() {
        let (_, uri) = read.split_once(':').unwrap();
        assert_eq!(resolve(uri), uri, "the log holds resolved URIs");
        assert!(!uri.contains(['{', '}']), "an unexpanded template was read: {uri}");
    }
    // The generator is not vacuous: some spellings were admitted and read,
    // and a naive check on the raw string would have let denied ones through.
    assert!(admitted > 10, "only {admitted} admitted");
    let policy = Policy::from_yaml(POLICY, Path::new("p.yaml")).unwrap().for_user("dora");
    let naive_leaks = uris
        .iter()
        .filter(|u| {
            let id = ResourceId::parse(u).unwrap();
            let raw_allowed = policy.decide(&mcp_context::Resource::unlisted(id.clone())).allowed;
            raw_allowed && FS_FILES.iter().any(|(f, _)| *f == resolve(&id.uri) && !may_see("dora", "fs", f))
        })
        .count();
    assert!(naive_leaks > 10, "only {naive_leaks} of the generated URIs would fool a raw-string check");
    ctx.close().await;
}

// ---- servers on the official SDKs: never rewrite what is read (issue 28) ----

/// Users `Bob` and `bob` (two people: the SDKs match `users://{user}/profile`
/// case-sensitively) each get their own profile through an include; `tia`
/// may see `tickets://ab` only; `mo` anything but `text/plain`; `staff`
/// everything but `secret://**`.
const SDK_POLICY: &str = r#"
roles:
  own_profile:
    allow: [ { uri: "users://**" } ]
    include: [ "s:users://{user}/profile" ]
users:
  Bob: { roles: [own_profile] }
  bob: { roles: [own_profile] }
  tia: { allow: [ { uri: "tickets://ab" } ] }
  mo:
    allow: [ { uri: "**" } ]
    deny: [ { mime: "text/plain" } ]
  staff:
    allow: [ { uri: "**" } ]
    deny: [ { uri: "secret://**" } ]
"#;

/// One SDK server (`s`) under [`SDK_POLICY`], with its read log.
struct SdkSetup {
    _dir: tempfile::TempDir,
    config: PathBuf,
    log: PathBuf,
}

impl SdkSetup {
    /// `command args...` is the server; `--record LOG` is added.
    fn new(command: &Path, args: &[&Path], tag: &str) -> SdkSetup {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("reads.log");
        let policy = dir.path().join("policy.yaml");
        std::fs::write(&policy, SDK_POLICY).unwrap();
        let mut argv: Vec<String> = args.iter().map(|a| format!("{:?}", a.to_str().unwrap())).collect();
        argv.extend(["\"--record\"".to_owned(), format!("{:?}", log.to_str().unwrap())]);
        let yaml = format!(
            "servers:\n  s:\n    command: {:?}\n    args: [{}]\n    env: {{ MCP_TEST_TAG: {tag:?} }}\n    timeout_ms: 20000\n\
             policy: {policy:?}\ncontext:\n  max_tokens: 4000\n",
            command.to_str().unwrap(),
            argv.join(", ")
        );
        let config = dir.path().join("c.yaml");
        std::fs::write(&config, yaml).unwrap();
        SdkSetup { _dir: dir, config, log }
    }

    /// What the server read since the last call, in order.
    fn take_reads(&self) -> Vec<String> {
        let reads = read_log(&self.log);
        let _ = std::fs::remove_file(&self.log);
        reads
    }
}

/// The message and report for `user`, with `select` as `--select` would.
async fn build_for(ctx: &McpContext, user: &str, select: &[&str]) -> (String, mcp_context::Report) {
    let selection = (!select.is_empty()).then(|| select.iter().map(|id| ResourceId::parse(id).unwrap()).collect());
    let req = ContextRequest::for_user(user).with_selection(selection);
    let (message, report) = ctx.build(&req).await.unwrap();
    (message.map(|m| m.content.to_string()).unwrap_or_default(), report)
}

fn reason_of(report: &mcp_context::Report, id: &str) -> String {
    let e = report.excluded.iter().find(|e| e.id == id).unwrap_or_else(|| panic!("{id} not excluded: {report:#?}"));
    serde_json::to_value(e.reason).unwrap().as_str().unwrap().to_owned()
}

/// The scenario of issue 28 against one SDK server: what each user gets,
/// and what the server actually read.
async fn never_rewrites_what_is_read(s: &SdkSetup, what: &str) {
    let ctx = McpContext::from_config(&mcp_context::Config::load(&s.config).unwrap()).await.unwrap();
    s.take_reads();

    // 1. Bob and bob: the include reads each one's own record, as spelled.
    let (bob_upper, _) = build_for(&ctx, "Bob", &[]).await;
    assert!(bob_upper.contains("admin") && !bob_upper.contains("intern"), "{what}: Bob got\n{bob_upper}");
    assert_eq!(s.take_reads(), ["users://Bob/profile"], "{what}");
    let (bob_lower, _) = build_for(&ctx, "bob", &[]).await;
    assert!(bob_lower.contains("intern") && !bob_lower.contains("admin"), "{what}: bob got\n{bob_lower}");
    assert_eq!(s.take_reads(), ["users://bob/profile"], "{what}");
    // The include expands a template: its block carries the template's MIME type.
    assert!(bob_upper.contains(r#"mime="application/json""#), "{what}:\n{bob_upper}");

    // 2. `allow: tickets://ab` grants the listed `tickets://ab`, not `tickets://AB`
    //    nor the expansion `tickets://Ab`.
    let (tia, report) = build_for(&ctx, "tia", &[]).await;
    assert!(tia.contains("lower-case queue") && !tia.contains("upper-case queue"), "{what}:\n{tia}");
    let included: Vec<&str> = report.included.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(included, ["s:tickets://ab"], "{what}");
    assert_eq!(reason_of(&report, "s:tickets://AB"), "denied", "{what}");
    let (tia, report) = build_for(&ctx, "tia", &["s:tickets://Ab", "s:TICKETS://ab"]).await;
    assert!(tia.is_empty(), "{what}:\n{tia}");
    assert_eq!(reason_of(&report, "s:tickets://Ab"), "denied", "{what}");
    assert_eq!(reason_of(&report, "s:TICKETS://ab"), "not_found", "{what}");
    assert_eq!(s.take_reads(), ["tickets://ab"], "{what}");

    // 3. A MIME deny rule decides on an expansion by its template's MIME type.
    let (mo, report) = build_for(&ctx, "mo", &["s:tickets://T-7", "s:tickets://AB"]).await;
    assert!(mo.contains("upper-case queue") && !mo.contains("printer on fire"), "{what}:\n{mo}");
    assert_eq!(reason_of(&report, "s:tickets://T-7"), "denied", "{what}");
    let detail = report.excluded.iter().find(|e| e.id == "s:tickets://T-7").unwrap().detail.clone().unwrap();
    assert!(detail.contains(r#"mime: "text/plain""#), "{what}: {detail}");
    assert_eq!(s.take_reads(), ["tickets://AB"], "{what}");

    // 4. What is read is what was asked, byte for byte, with the template's
    //    metadata on its block; the unexpanded templates are not found.
    let select = ["s:tickets://T-9", "s:users://Bob/profile", "s:users://{user}/profile", "s:tickets://{id}"];
    let (staff, report) = build_for(&ctx, "staff", &select).await;
    assert!(staff.contains(r#"<resource id="s:tickets://T-9""#), "{what}:\n{staff}");
    assert!(staff.contains("ticket T-9: printer on fire") && staff.contains("admin"), "{what}:\n{staff}");
    let ticket_block = staff.split("<resource ").find(|b| b.starts_with(r#"id="s:tickets://T-9""#)).unwrap();
    assert!(ticket_block.contains(r#"mime="text/plain""#), "{what}: {ticket_block}");
    // The profile template's priority (0.9) puts its expansion first.
    assert!(staff.find("admin").unwrap() < staff.find("printer on fire").unwrap(), "{what}:\n{staff}");
    for id in ["s:users://{user}/profile", "s:tickets://{id}"] {
        assert_eq!(reason_of(&report, id), "not_found", "{what}: {id}");
    }
    // (Bob's profile may come from the cache: it was read for Bob above.)
    let reads = s.take_reads();
    assert!(reads.contains(&"tickets://T-9".to_owned()), "{what}: {reads:?}");
    assert!(reads.iter().all(|r| ["tickets://T-9", "users://Bob/profile"].contains(&r.as_str())), "{what}: {reads:?}");

    // The model's tool and the unexpanded template: not found, never read.
    let args = serde_json::json!({ "uri": "s:tickets://{id}" }).to_string();
    let r = ctx.tools().run("call", mcp_context::tools::READ_TOOL, &args, "staff").await;
    assert!(r.is_error && r.content.contains("not found"), "{what}: {}", r.content);
    assert!(s.take_reads().is_empty(), "{what}");
    ctx.close().await;

    // `policy explain` decides through the same gate, on the same metadata, and reads nothing.
    let explain = |user: &str, id: &str| {
        let out = Command::new(MCP_CONTEXT)
            .arg("--config")
            .arg(&s.config)
            .args(["policy", "explain", "--user", user, id])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let out = explain("mo", "s:tickets://T-7");
    assert!(out.starts_with("DENY s:tickets://T-7 for user mo"), "{what}:\n{out}");
    assert!(out.contains(r#"{ mime: "text/plain" }"#) && out.contains("template's MIME type text/plain"), "{out}");
    let out = explain("staff", "s:tickets://{id}");
    assert!(out.contains("refused before the policy: not found"), "{what}:\n{out}");
    let out = explain("tia", "s:tickets://AB");
    assert!(out.starts_with("DENY s:tickets://AB for user tia") && out.contains("no allow rule matches"), "{out}");
    assert!(s.take_reads().is_empty(), "{what}");
}

/// Issue 28 against the official Python SDK's `MCPServer` (FastMCP).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_templates_read_exactly_what_was_asked() {
    let Some(py) = crate::sdk::python() else {
        return skip(
            "python_sdk_templates_read_exactly_what_was_asked",
            "no target/py-mcp venv with `mcp` (see .ci/run)",
        );
    };
    let script = Path::new(ROOT).join("tests/python-mcp/templates.py");
    never_rewrites_what_is_read(&SdkSetup::new(&py, &[&script], &tag()), "python sdk").await;
}

/// Issue 28 against the official TypeScript SDK v2's `McpServer`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_sdk_templates_read_exactly_what_was_asked() {
    if crate::sdk::node_sdk().is_none() {
        return skip("typescript_sdk_templates_read_exactly_what_was_asked", crate::sdk::NO_NODE_SDK);
    }
    let script = Path::new(ROOT).join("tests/node/ts-templates.mjs");
    never_rewrites_what_is_read(&SdkSetup::new(Path::new("node"), &[&script], &tag()), "typescript sdk").await;
}

/// Random spellings of scheme and host (the position custom schemes put
/// identifiers in), with template braces left in or encoded: a requested
/// URI is read only if it is, byte for byte, listed or an expansion of
/// `acc://users/{id}`; allow rules grant only the exact spelling they name
/// and deny rules stop every case of the scheme and host they name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_random_host_spelling_reaches_another_resource() {
    let t = tag();
    let s = Setup::new(&t);
    let ctx = s.context().await;
    // The listed spellings weigh more, so that some are read.
    let scheme = proptest::sample::select(vec!["acc", "acc", "acc", "ACC", "Acc", "secret", "SECRET", "Secret"]);
    let host = proptest::sample::select(vec![
        "users", "users", "users", "USERS", "Users", "payroll", "PAYROLL", "public", "public", "PUBLIC",
    ]);
    let path = proptest::sample::select(vec![
        "/alice", "/alice", "/Alice", "/bob", "/report", "", "/{id}", "/{+id}", "/{", "/a}", "/{id}x",
    ]);
    let strategy = (scheme, host, path).prop_map(|(scheme, host, path)| format!("acc:{scheme}://{host}{path}"));
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let uris: Vec<String> = (0..300).map(|_| strategy.new_tree(&mut runner).unwrap().current()).collect();
    let policy = Policy::from_yaml(POLICY, Path::new("p.yaml")).unwrap();
    let (mut read_ok, mut denied_by_folding) = (0, 0);
    for uri in &uris {
        let id = ResourceId::parse(uri).unwrap();
        let exact_template = id
            .uri
            .strip_prefix("acc://users/")
            .is_some_and(|v| !v.is_empty() && !v.contains(['/', '?', '#', '{', '}']));
        let listed = FS_FILES.iter().any(|(f, _)| *f == id.uri);
        for user in ["alice", "erin"] {
            let args = serde_json::json!({ "uri": uri }).to_string();
            let r = ctx.tools().run("call", mcp_context::tools::READ_TOOL, &args, user).await;
            assert_no_canary(uri, &r.content);
            if !r.is_error {
                read_ok += 1;
                assert!(listed || exact_template, "{user}: {uri} was read but is neither listed nor an expansion");
                assert!(may_see(user, "acc", &id.uri), "{user}: {uri} was read");
            }
            // The policy alone, on the spelling as it is: allow exactly, deny also folded.
            let d = policy.for_user(user).decide(&mcp_context::Resource::unlisted(id.clone()));
            let folded = mcp_context::access::canonical_uri(&id.uri);
            match user {
                "erin" => assert_eq!(d.allowed, id.uri.starts_with("acc://users/"), "{user}: {uri}"),
                _ => {
                    assert_eq!(d.allowed, !folded.starts_with("secret://"), "{user}: {uri}");
                    denied_by_folding += usize::from(!d.allowed && !id.uri.starts_with("secret://"));
                }
            }
        }
    }
    // What the server read was asked for exactly so: no brace, nothing normalised.
    for read in read_log(&s.logs[1]) {
        assert!(!read.contains(['{', '}']), "the server read {read}");
        assert!(
            uris.iter().any(|u| u.strip_prefix("acc:") == Some(read.as_str())),
            "the server read {read}, never asked"
        );
    }
    s.assert_no_denied_read("alice");
    assert!(read_ok > 10, "only {read_ok} reads: the generator is vacuous");
    assert!(denied_by_folding > 10, "only {denied_by_folding} spellings needed the folded deny");
    ctx.close().await;
}
