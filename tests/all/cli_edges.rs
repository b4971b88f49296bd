//! Issue 49 item 5, the CLI's small edges, through the real binary and the
//! demo server: `auth status` with nothing per user, `audit` on the JSONL
//! sink (rotated files included) and its `--since` checked by us, the hint
//! for a URI without its `SERVER:` everywhere one is taken, `--select` of an
//! unknown id, and `read --help` saying it bypasses the policy.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::common::*;
use crate::serve::{Upstream, chat_body, keys_yaml};

fn run(config: &Path, args: &[&str]) -> Output {
    Command::new(MCP_CONTEXT)
        .args(args)
        .arg("--config")
        .arg(config)
        .env_remove("MCP_CONTEXT_LOG")
        .env_remove("MCP_CONTEXT_CREDENTIALS_KEY")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn demo_config() -> (tempfile::TempDir, std::path::PathBuf) {
    temp_config(&format!("servers:\n{}policy: {}\n", demo_server("demo", &tag()), policies_dir().display()))
}

/// `auth status` on a config with no per-user server exits 0 and says so,
/// without asking for a credential store or its key.
#[test]
fn auth_status_without_per_user_servers_exits_0_saying_so() {
    let (_dir, config) = demo_config();
    let out = run(&config, &["auth", "status"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("no server of") && text(&out.stdout).contains("per-user `auth:`"));
    let out = run(&config, &["auth", "status", "--user", "alice", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "[]");
}

/// `audit who` and `audit user` read the JSONL sink when there is no
/// PostgreSQL sink, its rotated files included, oldest first; `--since`
/// filters, and a bad one is a usage error (exit 2) in our words.
#[tokio::test]
async fn audit_reads_the_jsonl_sink_and_its_rotated_files() {
    let up = Upstream::start().await;
    let audit_dir = tempfile::tempdir().unwrap();
    let audit = audit_dir.path().join("audit.jsonl");
    // One record is about 1 KB: 600 bytes per file rotates at every record, four files kept.
    let body = format!(
        "servers:\n{}policy: policies/\ncontext:\n  max_tokens: 4000\naudit:\n  sinks:\n    - file: {{ path: {:?}, \
         max_bytes: 600, keep: 4 }}\nserve:\n{}",
        demo_server("demo", &tag()),
        audit,
        keys_yaml()
    );
    let mut proxy = crate::first_run::serve(&body, &up.base, &[]).await;
    for key in ["key-alice", "key-bob", "key-alice"] {
        assert_eq!(proxy.post("/v1/chat/completions", Some(key), &chat_body("hi")).send().await.unwrap().status(), 200);
    }
    let written = || {
        (0..=4)
            .map(|n| if n == 0 { audit.clone() } else { Path::new(&format!("{}.{n}", audit.display())).to_owned() })
            .map(|p| std::fs::read_to_string(p).unwrap_or_default().lines().count())
            .sum::<usize>()
    };
    assert!(eventually(async || written() == 3).await, "three records written: {}", written());
    proxy.child.start_kill().unwrap();
    let config = proxy.config.clone();
    assert!(Path::new(&format!("{}.1", audit.display())).exists(), "the file was rotated");

    let out = run(&config, &["audit", "user", "alice", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let records: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(records.len(), 2, "{records:?}");
    assert!(records.iter().all(|r| r["user"] == "alice") && records[0]["at"].as_str() <= records[1]["at"].as_str());
    let out = run(&config, &["audit", "who", "--resource", "demo:demo://docs/guide"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert_eq!(table.lines().filter(|l| l.contains(" alice ")).count(), 2, "{table}");
    assert_eq!(table.lines().filter(|l| l.contains(" bob ")).count(), 1, "{table}");
    let out = run(&config, &["audit", "user", "alice", "--since", "2999-01-01", "--json"]);
    assert_eq!(text(&out.stdout).trim(), "[]", "{}", text(&out.stderr));
    let out = run(&config, &["audit", "user", "alice", "--since", "1h", "--json"]);
    assert_eq!(serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap().len(), 2);

    let out = run(&config, &["audit", "who", "--resource", "demo:demo://docs/guide", "--since", "bogus"]);
    assert_eq!(out.status.code(), Some(2), "a usage error");
    let err = text(&out.stderr);
    assert!(err.contains("`bogus` is not a time") && err.contains("24h"), "{err}");
    assert!(!err.to_lowercase().contains("postgres") && !err.contains("timestamptz"), "{err}");
}

/// A URI given without its `SERVER:` prefix is refused with the identifier
/// meant, wherever one is taken.
#[test]
fn a_uri_without_its_server_prefix_gets_the_hint_everywhere() {
    let (_dir, config) = demo_config();
    for args in [
        &["read", "demo://docs/guide"][..],
        &["preview", "--user", "alice", "--select", "demo://docs/guide"],
        &["policy", "explain", "--user", "alice", "demo://docs/guide"],
        &["audit", "who", "--resource", "demo://docs/guide"],
    ] {
        let out = run(&config, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.contains("did you mean `demo:demo://docs/guide`"), "{args:?}: {err}");
    }
}

/// `preview --select` of an id no server offers exits 1, naming it; a
/// known one still exits 0.
#[test]
fn select_of_an_unknown_id_exits_1() {
    let (_dir, config) = demo_config();
    let out = run(&config, &["preview", "--user", "alice", "--select", "demo:demo://nope"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("--select: no server offers `demo:demo://nope`"), "{err}");
    let out = run(&config, &["preview", "--user", "alice", "--select", "demo:demo://docs/guide"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("Acme Notes guide"));
}

/// `read --help` says it is an operator's tool that bypasses the policy.
#[test]
fn read_help_says_it_bypasses_the_policy() {
    let out = Command::new(MCP_CONTEXT).args(["read", "--help"]).output().unwrap();
    assert!(out.status.success());
    let help = text(&out.stdout);
    assert!(help.contains("operator's tool") && help.contains("bypassing the policy"), "{help}");
}
