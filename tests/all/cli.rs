//! The `mcp-context` binary, run as a user would: list, read, preview,
//! policy check/explain, and its errors (stderr, non-zero exit).

use std::path::Path;
use std::process::{Command, Output};

use crate::common::*;

fn run(dir: &Path, args: &[&str]) -> Output {
    Command::new(MCP_CONTEXT)
        .args(args)
        .current_dir(dir)
        .env_remove("MCP_CONTEXT_CONFIG")
        .output()
        .expect("run mcp-context")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The repository's own config and policies, as a fresh clone has them.
fn repo() -> &'static Path {
    Path::new(ROOT)
}

#[test]
fn list_prints_every_resource_sorted() {
    let out = run(repo(), &["list"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let (resources, templates) = stdout.split_once("\n\n").expect("templates follow the resources");
    assert_eq!(
        templates,
        "Resource templates:\n- demo:demo://users/{user}/profile | user-profile | A user's account profile\n"
    );
    let lines: Vec<&str> = resources.lines().collect();
    assert_eq!(lines[0], "Available MCP Resources:");
    assert_eq!(lines.len(), 8, "{stdout}");
    assert!(lines.contains(&"- demo:demo://docs/guide | guide | How to create, tag and share notes"));
    let ids: Vec<&str> = lines[1..].iter().map(|l| l.split(' ').nth(1).unwrap()).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted);
}

#[test]
fn list_json_and_server_filter() {
    let out = run(repo(), &["list", "--json", "--server", "demo"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["resources"].as_array().unwrap().len(), 7);
    assert_eq!(v["templates"][0]["uri_template"], "demo://users/{user}/profile");
    let out = run(repo(), &["list", "--server", "nope"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("unknown server `nope` (configured: demo)"), "{}", text(&out.stderr));
}

#[test]
fn read_prints_rendered_text_and_placeholders() {
    let out = run(repo(), &["read", "demo:demo://docs/changelog"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "## 2.1.0\n- Shared notes can be made editable with `--edit`.\n## 2.0.0\n- New sync engine: notes sync every 30 seconds.\n"
    );
    let out = run(repo(), &["read", "demo:demo://images/logo.png"]);
    assert_eq!(text(&out.stdout), "[Binary Data (image/png)]\n");
}

#[test]
fn read_errors_are_clear() {
    for (args, needle) in [
        (vec!["read", "demo:demo://nope"], "resource not found: demo:demo://nope"),
        (vec!["read", "nocolon"], "invalid resource identifier `nocolon`"),
        (vec!["read", ":x"], "server name is empty"),
        (vec!["read", "nope:x://y"], "unknown server `nope`"),
    ] {
        let out = run(repo(), &args);
        assert!(!out.status.success(), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.starts_with("error: ") && err.contains(needle), "{args:?}: {err}");
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn config_errors_name_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mcp-context.yaml"), "servers:\n  demo:\n    comand: x\n").unwrap();
    let out = run(dir.path(), &["list"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("mcp-context.yaml:3:5: servers: unknown field `comand`") || err.contains("mcp-context.yaml:3:5"),
        "{err}"
    );
    // --config and $MCP_CONTEXT_CONFIG are honoured.
    let out = run(dir.path(), &["--config", "/nonexistent.yaml", "list"]);
    assert!(text(&out.stderr).contains("/nonexistent.yaml: cannot read the config file"));
    let out = Command::new(MCP_CONTEXT)
        .arg("list")
        .current_dir(dir.path())
        .env("MCP_CONTEXT_CONFIG", Path::new(ROOT).join("mcp-context.yaml"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn preview_json_is_exact_and_policy_driven() {
    let out = run(repo(), &["preview", "--user", "alice", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["user"], "alice");
    assert_eq!(v["encoding"], "o200k_base");
    assert_eq!(v["budget"], 3000);
    let content = v["message"]["content"].as_str().unwrap();
    assert_eq!(v["message"]["role"], "system");
    let bpe = tiktoken_rs::o200k_base_singleton();
    assert_eq!(v["tokens"].as_u64().unwrap() as usize, bpe.encode_ordinary(content).len());
    assert!(content.contains("demo:demo://docs/guide"));
    assert!(!content.contains("payroll") && !content.contains("91000"), "denied content leaked");
    // Priority order: guide 0.9, faq 0.8, changelog 0.6, the unlisted profile (no priority: 0.5), plants 0.1.
    let order: Vec<&str> = v["included"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap()).collect();
    assert_eq!(
        order,
        [
            "demo:demo://docs/guide",
            "demo:demo://public/faq",
            "demo:demo://docs/changelog",
            "demo:demo://users/alice/profile",
            "demo:demo://notes/low-priority"
        ]
    );
    let excluded = v["excluded"].as_array().unwrap();
    let payroll = excluded.iter().find(|e| e["id"] == "demo:secret://payroll/2026").unwrap();
    assert_eq!(payroll["reason"], "denied");
    assert!(payroll["detail"].as_str().unwrap().contains("deny[0]"));
    let banner = excluded.iter().find(|e| e["id"] == "demo:demo://ui/welcome-banner").unwrap();
    assert_eq!(banner["reason"], "audience");

    // The guest sees only the public FAQ; carol (HR) sees payroll.
    let guest: serde_json::Value =
        serde_json::from_slice(&run(repo(), &["preview", "--user", "someone", "--json"]).stdout).unwrap();
    let ids: Vec<&str> = guest["included"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["demo:demo://public/faq"]);
    let carol: serde_json::Value =
        serde_json::from_slice(&run(repo(), &["preview", "--user", "carol", "--json"]).stdout).unwrap();
    assert!(carol["message"]["content"].as_str().unwrap().contains("91000"));
}

#[test]
fn preview_budget_model_and_nothing_to_inject() {
    let v: serde_json::Value = serde_json::from_slice(
        &run(repo(), &["preview", "--user", "alice", "--json", "--budget", "120", "--model", "gpt-4"]).stdout,
    )
    .unwrap();
    assert_eq!(v["encoding"], "cl100k_base");
    assert_eq!(v["budget"], 120);
    assert!(v["tokens"].as_u64().unwrap() <= 120);
    assert!(v["excluded"].as_array().unwrap().iter().any(|e| e["reason"] == "budget"));
    let v: serde_json::Value =
        serde_json::from_slice(&run(repo(), &["preview", "--user", "alice", "--json", "--budget", "5"]).stdout)
            .unwrap();
    assert!(v["message"].is_null());
    assert_eq!(v["tokens"], 0);
    assert!(v["reason"].as_str().unwrap().contains("budget"));
    // Human output: message on stdout, report table on stderr.
    let out = run(repo(), &["preview", "--user", "bob"]);
    assert!(text(&out.stdout).starts_with("The following resources are reference data"));
    assert!(text(&out.stderr).contains("user bob"));
    assert!(text(&out.stderr).contains("denied"));
}

#[test]
fn policy_check_and_explain() {
    let out = run(repo(), &["policy", "check"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.contains("policy OK") && s.contains("alice") && s.contains("staff"), "{s}");
    let out = run(repo(), &["policy", "explain", "--user", "alice", "demo:secret://payroll/2026"]);
    let s = text(&out.stdout);
    assert!(s.starts_with("DENY demo:secret://payroll/2026 for user alice"), "{s}");
    assert!(s.contains("default.yaml") && s.contains("secret://**"), "{s}");
    let out = run(repo(), &["policy", "explain", "--user", "alice", "demo:demo://docs/guide"]);
    assert!(text(&out.stdout).starts_with("ALLOW"));

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "roles:\n  r:\n    allow:\n      - { uri: \"[abc\" }\n").unwrap();
    let out = run(dir.path(), &["policy", "check", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("bad.yaml:4"), "{err}");
}

#[test]
fn a_policy_error_stops_preview() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("policies")).unwrap();
    std::fs::write(dir.path().join("policies/p.yaml"), "users:\n  a:\n    roles: [ghost]\n").unwrap();
    std::fs::write(
        dir.path().join("mcp-context.yaml"),
        format!("servers:\n  demo:\n    command: {MCP_CONTEXT:?}\n    args: [demo-server]\npolicy: policies\n"),
    )
    .unwrap();
    let out = run(dir.path(), &["preview", "--user", "a"]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "nothing is injected on a policy error");
    let err = text(&out.stderr);
    assert!(err.contains("p.yaml:3") && err.contains("ghost"), "{err}");
}

#[test]
fn ctrl_c_closes_every_server() {
    let t = tag();
    let (_dir, cfg) =
        temp_config(&format!("servers:\n{}", fixture_server("fx", &t, &["--specials", "--dangerous", "--grandchild"])));
    let mut child = Command::new(MCP_CONTEXT)
        .args(["--config", cfg.to_str().unwrap(), "read", "fx:fx://hang"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while tagged_processes(&t).len() < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(tagged_processes(&t).len(), 2, "server and grandchild are up");
    std::thread::sleep(std::time::Duration::from_millis(200));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(tagged_processes(&t).is_empty(), "left behind after Ctrl-C: {:?}", tagged_processes(&t));
}
