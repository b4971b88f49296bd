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
/// anyone unknown: only `file:///docs/**`, plus an include named after them.
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
    for user in ["alice", "dora"] {
        let mut args = vec!["preview", "--user", user, "--json"];
        for id in HOSTILE.iter().chain(LEGIT.iter().map(|(id, _)| id)) {
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
        for id in HOSTILE {
            // Either refused by the gate as not found, or admitted as the
            // listed resource it names (scheme and host lower-cased) and denied.
            let (server, uri) = id.split_once(':').unwrap();
            let canonical = format!("{server}:{}", mcp_context::canonical_uri(uri));
            assert!(!included.contains(id) && !included.contains(&canonical.as_str()), "{user}: {id} included");
            let e = excluded.iter().find(|e| e["id"] == *id || e["id"] == canonical);
            let reason = e.map_or("(absent)", |e| e["reason"].as_str().unwrap());
            let expected = if e.is_some_and(|e| e["id"] == *id && *id != canonical) { "not_found" } else { "denied" };
            assert!(reason == expected || reason == "not_found", "{user}: {id}: {reason}");
        }
        // The listed secret is what `SECRET://payroll` is decided as, by the team's deny rule.
        let payroll = excluded.iter().find(|e| e["id"] == "acc:secret://payroll").expect("payroll decided");
        assert_eq!(payroll["reason"], "denied", "{user}");
        if user == "alice" {
            assert!(payroll["detail"].as_str().unwrap().contains("secret://**"), "{payroll}");
        }
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
            let r = ctx.tools().run("call", mcp_context::READ_TOOL, &args, user).await;
            assert_eq!(r.content, format!("Error: Resource not found for URI: {id}"), "{user}: {id}");
            assert!(r.is_error);
        }
        for (id, text) in LEGIT {
            let args = serde_json::json!({ "uri": id }).to_string();
            let r = ctx.tools().run("call", mcp_context::READ_TOOL, &args, user).await;
            assert_eq!(r.content.trim_end(), *text, "{user}: {id}");
        }
        s.assert_no_denied_read(user);
    }
    // A template expansion that is not under /docs: read for alice, refused for dora.
    let args = serde_json::json!({ "uri": "acc:acc://users/alice" }).to_string();
    assert_eq!(ctx.tools().run("c", mcp_context::READ_TOOL, &args, "alice").await.content.trim_end(), "account alice");
    assert!(ctx.tools().run("c", mcp_context::READ_TOOL, &args, "dora").await.is_error);
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
    let (_, stdout, _) = s.cli(&["policy", "explain", "--user", "alice", "acc:SECRET://payroll"]);
    assert!(stdout.contains("decided on (and read as) acc:secret://payroll"), "{stdout}");
    assert!(stdout.contains("secret://**"), "the deciding rule is named:\n{stdout}");
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
    let noise = proptest::sample::select(vec!["sub", ".", "%2e", "", "a.b", "SUB", "%73ub"]);
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
    ]);
    let sep = proptest::sample::select(vec!["/", "//", "\\", "%2f", "%2F", "%5c", "/./", "/%2e/"]);
    let scheme = proptest::sample::select(vec!["file", "FILE", "File", "fIlE"]);
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
    let uris: Vec<String> = (0..400).map(|_| strategy.new_tree(&mut runner).unwrap().current()).collect();
    let mut admitted = 0;
    for (i, uri) in uris.iter().enumerate() {
        let args = serde_json::json!({ "uri": uri }).to_string();
        let r = ctx.tools().run("call", mcp_context::READ_TOOL, &args, "dora").await;
        assert_no_canary(uri, &r.content);
        admitted += usize::from(!r.is_error);
        if i % 8 == 0 {
            let Ok(id) = ResourceId::parse(uri) else { continue };
            let req = ContextRequest { selection: Some(vec![id]), ..ContextRequest::for_user("dora") };
            let (message, _) = ctx.build(&req).await.unwrap();
            assert_no_canary(uri, message.as_ref().map_or("", |m| m.content.as_str()));
        }
    }
    // Every read the server did, resolved its way, is one dora may see.
    s.assert_no_denied_read("dora");
    for read in s.reads() {
        let (_, uri) = read.split_once(':').unwrap();
        assert_eq!(resolve(uri), uri, "the log holds resolved URIs");
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
