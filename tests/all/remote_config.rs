//! Issue 49 item 6, every host's remote config as written, through the
//! real binary and the official Python SDK's servers (tests/python-mcp,
//! `SseServerTransport` under uvicorn, and its Streamable HTTP app): a bare
//! `url` tries Streamable HTTP, then the legacy SSE transport when the POST
//! is answered 400/404/405, and says so; `type: http` forbids the fallback;
//! in Gemini CLI's `settings.json`, `url` is SSE and `httpUrl` Streamable HTTP.

use std::path::Path;
use std::process::{Command, Output};

use crate::common::*;
use crate::sdk::{python, python_http_server, python_sse_server};

const NO_PY: &str = "no target/py-mcp venv with `mcp` (see .ci/run)";
const FELL_BACK: &str = "trying the legacy SSE transport at the same URL";

fn run(config: &Path, args: &[&str]) -> Output {
    Command::new(MCP_CONTEXT).args(args).arg("--config").arg(config).env_remove("MCP_CONTEXT_LOG").output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A legacy SSE server configured by a bare `url` is listed and read, after
/// a warning (shown without -v) saying the POST was refused and SSE tried;
/// the same URL with `type: http` fails with that 405, trying nothing else.
#[tokio::test]
async fn a_bare_url_falls_back_to_the_legacy_sse_transport() {
    let Some(py) = python() else { return skip("a_bare_url_falls_back_to_the_legacy_sse_transport", NO_PY) };
    let dir = tempfile::tempdir().unwrap();
    let (_server, port) = python_sse_server(&py, dir.path()).await;
    let (_c, config) =
        temp_config(&format!("servers:\n  s:\n    url: http://127.0.0.1:{port}/sse\n    timeout_ms: 20000\n"));
    let out = run(&config, &["list"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("fx://doc/1") && stdout.contains("fx://blob"), "{stdout}");
    assert!(stderr.contains("answered HTTP 405") && stderr.contains(FELL_BACK), "{stderr}");
    let out = run(&config, &["read", "s:fx://doc/1"]);
    assert!(out.status.success() && text(&out.stdout).contains("Document 1"), "{}", text(&out.stderr));

    let (_c, config) = temp_config(&format!(
        "servers:\n  s:\n    type: http\n    url: http://127.0.0.1:{port}/sse\n    timeout_ms: 20000\n"
    ));
    let out = run(&config, &["list"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("405") && !stderr.contains(FELL_BACK), "{stderr}");
}

/// Gemini CLI's `settings.json` as written: a `url` server is the legacy
/// SSE transport (dialed as such, no Streamable HTTP attempt), an `httpUrl`
/// one Streamable HTTP; both listed.
#[tokio::test]
async fn a_gemini_settings_json_means_sse_by_url_and_streamable_http_by_http_url() {
    let Some(py) = python() else {
        return skip("a_gemini_settings_json_means_sse_by_url_and_streamable_http_by_http_url", NO_PY);
    };
    let (sse_dir, http_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_sse, sse_port) = python_sse_server(&py, sse_dir.path()).await;
    let (_http, http_port) = python_http_server(&py, http_dir.path(), "--http-port-file", &[]).await;
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir(home.path().join(".gemini")).unwrap();
    let settings = home.path().join(".gemini/settings.json");
    let json = serde_json::json!({
        "theme": "GitHub",
        "mcpServers": {
            "legacy": {"url": format!("http://127.0.0.1:{sse_port}/sse"), "timeout": 20000, "trust": true},
            "modern": {"httpUrl": format!("http://127.0.0.1:{http_port}/mcp"), "timeout": 20000}
        }
    });
    std::fs::write(&settings, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    let out = run(&settings, &["list"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    for server in ["legacy", "modern"] {
        assert!(stdout.lines().any(|l| l.contains(server) && l.contains("fx://doc/1")), "{server}: {stdout}");
    }
    assert!(!stderr.contains(FELL_BACK) && !stderr.contains("failed"), "{stderr}");
}
