//! Issue 30, run as a new user would: other hosts' config files loaded as
//! they are written (comments included) and their servers listed; relative
//! paths from anywhere; exit code 1 when every server failed, listing
//! included; errors that explain; 128 + N on a signal during shutdown; no
//! child left after `kill -9`.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

fn run_in(dir: &Path, config: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(MCP_CONTEXT);
    cmd.arg("--config").arg(config).args(args).current_dir(dir).env_remove("MCP_CONTEXT_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run mcp-context")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Writes `name` (a path under a fresh temp folder) with `body`.
fn write(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, body).unwrap();
    path
}

// ---- item 1: other hosts' files, as they are ----

#[test]
fn gemini_settings_json_loads_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let t = tag();
    let path = write(
        dir.path(),
        ".gemini/settings.json",
        &format!(
            r#"{{
  "theme": "GitHub",
  "selectedAuthType": "oauth-personal",
  "context": {{ "fileName": "GEMINI.md" }},
  "mcpServers": {{
    "demo": {{
      "command": {MCP_CONTEXT:?},
      "args": ["demo-server"],
      "env": {{ "MCP_TEST_TAG": "{t}" }},
      "cwd": ".",
      "timeout": 30000,
      "trust": true,
      "includeTools": ["a"],
      "excludeTools": ["b"]
    }}
  }}
}}"#
        ),
    );
    let out = run_in(dir.path(), &path, &["list"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("- demo:demo://docs/guide"), "{}", text(&out.stdout));
    assert!(!text(&out.stderr).contains("warning"), "known foreign keys are silent: {}", text(&out.stderr));
}

#[test]
fn claude_code_mcp_json_expands_defaults_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let t = tag();
    let path = write(
        dir.path(),
        ".mcp.json",
        &format!(
            r#"{{
  "mcpServers": {{
    "demo": {{
      "type": "stdio",
      "command": "${{T30_EXE:-{MCP_CONTEXT}}}",
      "args": ["${{T30_ARG:-demo-server}}"],
      "env": {{ "MCP_TEST_TAG": "${{T30_TAG:-{t}}}" }}
    }}
  }}
}}"#
        ),
    );
    // Unset: the defaults.
    let out = run_in(dir.path(), &path, &["list"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("- demo:demo://docs/guide"));
    // Set: the values (a wrong one shows it was used).
    let out = run_in(dir.path(), &path, &["list"], &[("T30_ARG", "no-such-command")]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("server `demo` failed"), "{}", text(&out.stderr));
}

#[test]
fn vscode_mcp_json_with_comments_inputs_env_file_and_sse() {
    let dir = tempfile::tempdir().unwrap();
    let t = tag();
    write(dir.path(), ".vscode/demo.env", &format!("MCP_TEST_TAG={t}\n"));
    let path = write(
        dir.path(),
        ".vscode/mcp.json",
        &format!(
            r#"{{
  // Written by VS Code
  "inputs": [
    {{ "type": "promptString", "id": "api-key", "description": "API key", "password": true }},
  ],
  "servers": {{
    "demo": {{
      "type": "stdio",
      "command": {MCP_CONTEXT:?},
      "args": ["demo-server"],
      /* the tag comes from the file */
      "envFile": "${{workspaceFolder}}/.vscode/demo.env",
    }},
    "legacy": {{ "type": "sse", "url": "http://127.0.0.1:9/sse" }},
  }},
}}
"#
        ),
    );
    let out = run_in(dir.path(), &path, &["list"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("- demo:demo://docs/guide"));
    let err = text(&out.stderr);
    assert!(err.contains("server `legacy` failed: cannot connect to http://127.0.0.1:9/sse: "), "{err}");
    assert!(wait_gone_blocking(&t).is_empty());

    // `${input:…}` cannot be prompted for: named, located.
    let path = write(
        dir.path(),
        "other/.vscode/mcp.json",
        "{\n  \"servers\": {\n    \"gh\": {\n      \"command\": \"x\",\n      \"env\": { \"TOKEN\": \"${input:api-key}\" }\n    }\n  }\n}\n",
    );
    let out = run_in(dir.path(), &path, &["list"], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("mcp.json:5:") && err.contains("`${input:api-key}`") && err.contains("cannot prompt"),
        "{err}"
    );
}

#[test]
fn cline_settings_with_approvals_and_a_disabled_server() {
    let dir = tempfile::tempdir().unwrap();
    let t = tag();
    let path = write(
        dir.path(),
        "cline_mcp_settings.json",
        &format!(
            r#"{{
  "mcpServers": {{
    "demo": {{
      "command": {MCP_CONTEXT:?},
      "args": ["demo-server"],
      "env": {{ "MCP_TEST_TAG": "{t}" }},
      "autoApprove": ["read"],
      "alwaysAllow": [],
      "disabled": false,
      "timeout": 60,
      "transportType": "stdio"
    }},
    "off": {{ "command": "/nonexistent/server", "disabled": true, "autoApprove": [] }}
  }}
}}"#
        ),
    );
    let out = run_in(dir.path(), &path, &["list"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!text(&out.stderr).contains("off"), "a disabled server is not started: {}", text(&out.stderr));
}

#[test]
fn a_jsonc_error_is_located_and_our_yaml_stays_strict() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "mcp.json",
        "{\n  // a comment\n  \"mcpServers\": {\n    \"a\": { \"command\": \"x\" }\n    \"b\": {}\n  }\n}\n",
    );
    let out = run_in(dir.path(), &path, &["list"], &[]);
    assert_eq!(out.status.code(), Some(1));
    // Where the comma is missing: after line 4's value.
    assert!(text(&out.stderr).contains("mcp.json:4:28: Expected comma"), "{}", text(&out.stderr));
    let path = write(dir.path(), "c.yaml", "servers:\n  a:\n    command: x\n    trust: true\n");
    let out = run_in(dir.path(), &path, &["list"], &[]);
    assert!(text(&out.stderr).contains("c.yaml:4:5") && text(&out.stderr).contains("unknown field `trust`"));
}

// ---- item 2: a stdio server runs in the config's folder ----

#[test]
fn relative_args_work_from_any_directory() {
    let conf = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let t = tag();
    let yaml = format!("servers:\n{}", fixture_server("f", &t, &["--pid-file", "server.pid"]));
    let path = write(conf.path(), "mcp-context.yaml", &yaml);
    let out = run_in(elsewhere.path(), &path, &["list"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(conf.path().join("server.pid").exists(), "relative to the config's folder");
    assert!(!elsewhere.path().join("server.pid").exists());
}

// ---- item 3: every server failed, listing failures included ----

#[test]
fn a_failed_listing_counts_as_a_failed_server() {
    let dir = tempfile::tempdir().unwrap();
    let t = tag();
    let hang = fixture_server("db", &t, &["--hang-list"]).replace("timeout_ms: 20000", "timeout_ms: 1500");
    let path = write(dir.path(), "one.yaml", &format!("servers:\n{hang}"));
    for args in [&["list"][..], &["preview"][..]] {
        let out = run_in(dir.path(), &path, args, &[]);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains("failed"), "{args:?}: {}", text(&out.stderr));
    }
    let crash = fixture_server("crash", &t, &["--exit-at-start"]);
    let path = write(dir.path(), "two.yaml", &format!("servers:\n{hang}{crash}"));
    for args in [&["list"][..], &["preview"][..]] {
        let out = run_in(dir.path(), &path, args, &[]);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains("all 2 servers failed"), "{args:?}: {}", text(&out.stderr));
    }
}

// ---- item 4: errors that explain ----

#[test]
fn node_cannot_find_module_is_shown() {
    if Command::new("node").arg("--version").output().is_err() {
        return skip("node_cannot_find_module_is_shown", "node is not installed");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "c.yaml", "servers:\n  docs:\n    command: node\n    args: [./dist/inde.js]\n");
    let out = run_in(dir.path(), &path, &["list"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("Error: Cannot find module"), "{}", text(&out.stderr));
}

#[test]
fn an_id_without_its_server_and_an_unpassed_variable_are_explained() {
    let dir = tempfile::tempdir().unwrap();
    let t = tag();
    let path = write(dir.path(), "c.yaml", &format!("servers:\n{}", demo_server("demo", &t)));
    let out = run_in(dir.path(), &path, &["read", "docs://readme"], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("SERVER:URI") && err.contains("`demo:docs://readme`") && err.contains("demo"), "{err}");

    let path = write(
        dir.path(),
        "env.yaml",
        "servers:\n  gh:\n    command: sh\n    args: [-c, 'echo \"Error: T30_GITHUB_TOKEN environment variable is not set\" >&2; exit 1']\n",
    );
    let out = run_in(dir.path(), &path, &["list"], &[("T30_GITHUB_TOKEN", "s3cr3t-value")]);
    let err = text(&out.stderr);
    assert!(err.contains("inherit_env: [T30_GITHUB_TOKEN]"), "{err}");
    assert!(!err.contains("s3cr3t-value"));
}

// ---- item 5: signals and parents ----

/// `list` on a server that ignores stdin EOF and SIGTERM: once the listing
/// is printed the command spends seconds closing it, and SIGTERM then still
/// gives 143.
#[test]
fn sigterm_during_shutdown_exits_143() {
    let dir = tempfile::tempdir().unwrap();
    let t = tag();
    let path = write(dir.path(), "c.yaml", &format!("servers:\n{}", fixture_server("f", &t, &["--ignore-term"])));
    let mut child = Command::new(MCP_CONTEXT)
        .arg("--config")
        .arg(&path)
        .arg("list")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).expect("the listing is printed");
    std::thread::sleep(Duration::from_millis(300));
    assert!(child.try_wait().unwrap().is_none(), "still closing the server");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let mut rest = Vec::new();
    let _ = stdout.read_to_end(&mut rest);
    assert_eq!(child.wait().unwrap().code(), Some(143));
    assert!(wait_gone_blocking(&t).is_empty());
}

#[test]
fn kill_9_leaves_no_child_after_one_second() {
    let dir = tempfile::tempdir().unwrap();
    let t = tag();
    // It ignores SIGTERM and stdin EOF, and never answers the listing.
    let path = write(
        dir.path(),
        "c.yaml",
        &format!("servers:\n{}", fixture_server("f", &t, &["--ignore-term", "--hang-list"])),
    );
    let mut child = Command::new(MCP_CONTEXT)
        .arg("--config")
        .arg(&path)
        .arg("list")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while tagged_processes(&t).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(tagged_processes(&t).len(), 1, "the server is up");
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    assert!(tagged_processes(&t).is_empty(), "left after kill -9: {:?}", tagged_processes(&t));
}

/// Waits (bounded) until no process carries the tag.
fn wait_gone_blocking(tag: &str) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = tagged_processes(tag);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}
