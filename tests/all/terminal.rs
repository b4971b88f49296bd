//! Issue 47, item 8: what servers and callers name reaches no terminal raw.
//! A real MCP server (the fixture, serving a folder: `--dir`) lists a
//! resource whose URI and name hold an OSC sequence (ESC `]0;pwned` BEL,
//! which retitles a terminal), U+202E and U+2066, a C1 CSI and a newline
//! followed by a forged `audit user` row dated 2099. `list`, `preview`'s
//! report, `audit user` and `audit who` (from the real PostgreSQL) and the
//! log lines of `serve -vv` show it escaped, each entry on one line, while
//! every JSON output keeps it exact. A user name holding a bidirectional
//! control (a verified JWT's `sub`, a body's `user`) is refused, as one
//! holding a control character is.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::audit::{Schema, audit_yaml, count, pg, pg_url, wait_until};
use crate::common::*;
use crate::serve::{Proxy, Upstream, chat_body, keys_yaml};
use crate::small_items::{jwt, jwt_yaml};

/// The file the hostile server serves: the `kb://` resource's URI and name.
const HOSTILE: &str = "guide\u{1b}]0;pwned\u{7}\u{202e}fdp.exe\u{2066}\u{9b}31m\n\
                       2099-01-01T00:00:00Z  kb:kb:payroll  key  chat 200  0123456789abcdef  9  forged";

/// How its start shows, escaped.
const SHOWN: &str = "guide\\x1b]0;pwned\\x07\\u{202e}fdp.exe\\u{2066}\\u{9b}31m\\n2099-01-01T00:00:00Z";

/// What must never reach a terminal raw.
const RAW: [char; 6] = ['\u{1b}', '\u{7}', '\u{202e}', '\u{2066}', '\u{9b}', '\r'];

/// `text` holds none of [`RAW`], and no line of it is the forged row.
fn clean(what: &str, text: &str) {
    if let Some(c) = text.chars().find(|c| RAW.contains(c)) {
        panic!("{what}: a raw U+{:04X} in {text:?}", c as u32);
    }
    assert!(!text.lines().any(|l| l.trim_start().starts_with("2099")), "{what}: a forged line in {text:?}");
}

/// alice sees every resource of `kb`, bob only fx://doc/0.
const POLICY: &str = "roles:\n  all:\n    allow:\n      - { server: kb }\n  plain:\n    allow:\n      \
                      - { server: kb, uri: \"fx://doc/0\" }\nusers:\n  alice: { roles: [all] }\n  bob: { roles: [plain] }\n";

/// The hostile folder, and a config (in `work`) with the fixture serving it
/// as `kb` (plus fx://doc/0 and the template fx://user/{id}), then `rest`.
fn setup(work: &Path, tag: &str, rest: &str) -> String {
    let kb = work.join("kb");
    std::fs::create_dir(&kb).unwrap();
    std::fs::write(kb.join(HOSTILE), "The payroll guide: ask HR.").unwrap();
    std::fs::write(work.join("policy.yaml"), POLICY).unwrap();
    format!(
        "servers:\n{}policy: {}\ncontext:\n  max_tokens: 4000\n{rest}",
        fixture_server("kb", tag, &["--n", "1", "--dir", kb.to_str().unwrap()]),
        work.join("policy.yaml").display()
    )
}

/// `mcp-context ARGS --config CONFIG`: (stdout, stderr), having succeeded.
fn cli(config: &Path, tag: &str, args: &[&str]) -> (String, String) {
    let out = std::process::Command::new(MCP_CONTEXT)
        .args(args)
        .arg("--config")
        .arg(config)
        .env("MCP_TEST_TAG", tag)
        .env_remove("MCP_CONTEXT_LOG")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap());
    assert!(out.status.success(), "{args:?}: {stderr}");
    (stdout, stderr)
}

/// `list` shows the resource escaped on one line (its URI and its name),
/// `preview`'s report shows it escaped in its included (alice) and denied
/// (bob) rows; `list --json` and `preview --json` carry it exact. Failed
/// before: the raw sequence and newline were printed, and the forged row
/// was a line of its own.
#[tokio::test]
async fn list_and_preview_escape_what_a_server_names() {
    let work = tempfile::tempdir().unwrap();
    let t = tag();
    let config = work.path().join("c.yaml");
    std::fs::write(&config, setup(work.path(), &t, "")).unwrap();
    let raw_id = format!("kb:kb://{HOSTILE}");

    let (list, _) = cli(&config, &t, &["list"]);
    clean("list", &list);
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 6, "a heading, two resources, a gap, a heading, one template: {list}");
    let hostile: Vec<&&str> = lines.iter().filter(|l| l.contains(SHOWN)).collect();
    assert_eq!(hostile.len(), 1, "{list}");
    assert!(
        hostile[0].starts_with(&format!("- kb:kb://{SHOWN}")) && hostile[0].contains(&format!(" | {SHOWN}")),
        "{list}"
    );
    let (json, _) = cli(&config, &t, &["list", "--json"]);
    let v: Value = serde_json::from_str(&json).unwrap();
    let listed = v["resources"].as_array().unwrap();
    assert!(listed.iter().any(|r| r["id"]["uri"] == format!("kb://{HOSTILE}") && r["name"] == HOSTILE), "{v}");

    for (user, status) in [("alice", "included"), ("bob", "denied")] {
        let (_, report) = cli(&config, &t, &["preview", "--user", user]);
        clean("preview's report", &report);
        let row = report.lines().find(|l| l.contains(SHOWN)).unwrap_or_else(|| panic!("{user}: {report}"));
        assert!(row.trim_start().starts_with(status), "{user}: {report}");
        let (json, _) = cli(&config, &t, &["preview", "--user", user, "--json"]);
        let v: Value = serde_json::from_str(&json).unwrap();
        let ids: Vec<&Value> =
            v[status.replace("denied", "excluded")].as_array().unwrap().iter().map(|e| &e["id"]).collect();
        assert!(ids.iter().any(|id| **id == raw_id.as_str()), "{user}: {v}");
    }
}

/// `serve -vv` (the default debug filter), spawned as an operator would.
async fn serve_verbose(body: &str, upstream: &str, tag: String) -> Proxy {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.yaml");
    std::fs::write(&config, body).unwrap();
    let log = std::fs::File::create(dir.path().join("stderr.log")).unwrap();
    let mut child = tokio::process::Command::new(MCP_CONTEXT)
        .args(["serve", "-vv", "--config"])
        .arg(&config)
        .args(["--listen", "127.0.0.1:0", "--upstream", upstream])
        .env("MCP_TEST_TAG", &tag)
        .env_remove("MCP_CONTEXT_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await.unwrap().unwrap();
    let line = line
        .unwrap_or_else(|| panic!("serve exited: {}", std::fs::read_to_string(dir.path().join("stderr.log")).unwrap()));
    let url = line.split("listening on ").nth(1).unwrap().split(',').next().unwrap().to_owned();
    Proxy { url, child, dir, config, tag }
}

/// alice's request (the hostile resource sent) and bob's (it denied)
/// through `serve -vv`, recorded in PostgreSQL: `audit user alice` has one
/// line per resource, the hostile one escaped; `audit who` for it (asked
/// by its exact id) one line, and still one, escaped, once its user is a
/// name an older version let in (U+202E, U+2066: written into the table);
/// the JSON forms are exact; no log line holds a raw control and bob's
/// `excluded` debug event shows the id escaped. Failed before: the
/// newline forged an `audit user` row dated 2099, and the logs and tables
/// carried ESC, BEL and the bidirectional controls raw.
#[tokio::test]
async fn audit_tables_and_debug_logs_escape_what_a_server_names() {
    let test = "audit_tables_and_debug_logs_escape_what_a_server_names";
    let Some(db) = pg(test).await else { return };
    let schema = Schema::new();
    let up = Upstream::start().await;
    let work = tempfile::tempdir().unwrap();
    let t = tag();
    let serve = format!(
        "serve:\n  upstream_api_key: sk-upstream-1\n{}{}",
        keys_yaml(),
        audit_yaml(&schema.0, &pg_url(), &work.path().join("audit.jsonl").display().to_string())
    );
    let proxy = serve_verbose(&setup(work.path(), &t, &serve), &up.base, t.clone()).await;
    for user in ["alice", "bob"] {
        let r = proxy.post("/v1/chat/completions", Some(&format!("key-{user}")), &chat_body("Where is the guide?"));
        assert_eq!(r.send().await.unwrap().status(), 200, "{user}");
    }
    wait_until("two rows", Duration::from_secs(20), async || count(&db, &schema.0).await == 2).await;
    let raw_id = format!("kb:kb://{HOSTILE}");

    let (table, _) = cli(&proxy.config, &t, &["audit", "user", "alice"]);
    clean("audit user", &table);
    assert_eq!(table.lines().count(), 3, "a header and alice's two resources: {table}");
    assert!(table.lines().filter(|l| l.contains(&format!("kb:kb://{SHOWN}"))).count() == 1, "{table}");
    let (json, _) = cli(&proxy.config, &t, &["audit", "user", "alice", "--json"]);
    let records: Value = serde_json::from_str(&json).unwrap();
    assert!(records[0]["included"].as_array().unwrap().iter().any(|i| i["id"] == raw_id.as_str()), "{records}");

    let (who, _) = cli(&proxy.config, &t, &["audit", "who", "--resource", &raw_id]);
    clean("audit who", &who);
    assert_eq!(who.lines().count(), 2, "{who}");
    let renamed = "mallory\u{202e}\u{2066}ecila";
    let sql = format!("UPDATE \"{}\".injections SET user_name = $1 WHERE user_name = 'alice'", schema.0);
    assert_eq!(db.execute(&sql, &[&renamed]).await.unwrap(), 1);
    let (who, _) = cli(&proxy.config, &t, &["audit", "who", "--resource", &raw_id]);
    clean("audit who", &who);
    assert_eq!(who.lines().count(), 2, "{who}");
    assert!(who.lines().nth(1).unwrap().contains("mallory\\u{202e}\\u{2066}ecila"), "{who}");
    let (json, _) = cli(&proxy.config, &t, &["audit", "who", "--resource", &raw_id, "--json"]);
    assert_eq!(serde_json::from_str::<Value>(&json).unwrap()[0]["user"], renamed);

    let log = proxy.stderr();
    clean("serve -vv", &log);
    let excluded = log.lines().find(|l| l.contains("excluded") && l.contains(&format!("kb:kb://{SHOWN}")));
    assert!(excluded.is_some(), "bob's denial, escaped: {log}");
}

/// A verified token's `sub` and a body's `user` holding a bidirectional
/// control are refused (401, 400) and say why; nothing reaches the
/// upstream for them, while a plain `sub` is served. Failed before:
/// `mallory\u{202e}ecila` was accepted (200, relayed) as a user name.
#[tokio::test]
async fn bidi_controls_in_user_names_are_refused() {
    let up = Upstream::start().await;
    let work = tempfile::tempdir().unwrap();
    let t = tag();
    let body = format!(
        "servers:\n{}policy: policies/\ncontext:\n  max_tokens: 4000\nserve:\n  upstream_api_key: sk-upstream-1\n  \
         user_from_body: true\n{}",
        demo_server("demo", &t),
        jwt_yaml(work.path())
    );
    let proxy = Proxy::start_config(&body, &up.base, t).await;
    let r = proxy.post("/v1/chat/completions", Some(&jwt("alice", json!([]))), &chat_body("hi")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    for sub in ["mallory\u{202e}ecila", "\u{2066}bob\u{2069}", "eve\u{200f}", "x\u{61c}y"] {
        let r = proxy.post("/v1/chat/completions", Some(&jwt(sub, json!([]))), &chat_body("hi")).send().await.unwrap();
        assert_eq!(r.status(), 401, "{sub:?}");
        let text = r.text().await.unwrap();
        assert!(text.contains("bidirectional controls"), "{sub:?}: {text}");
        let mut in_body = chat_body("hi");
        in_body["user"] = json!(sub);
        let r = proxy.post("/v1/chat/completions", None, &in_body).send().await.unwrap();
        assert_eq!(r.status(), 400, "{sub:?} in the body");
        assert!(r.text().await.unwrap().contains("bidirectional controls"), "{sub:?}");
    }
    assert_eq!(up.seen().len(), 1, "only alice's request went on");
    let log = proxy.stderr();
    assert!(!log.contains('\u{202e}') && !log.contains('\u{2066}'), "{log}");
}
