//! Interop with servers built on the official SDKs, on 2026-07-28 (what
//! `auto` negotiates with them) and forced to 2025-11-25 (the same server,
//! our side pinned): the scenario of `protocol::exercise`. The Python SDK
//! (`mcp` 2.x, tests/python-mcp/server.py, in the venv target/py-mcp that
//! .ci/run creates) and the TypeScript SDK v2 (`@modelcontextprotocol/server`,
//! tests/node/ts-server.mjs, in tests/node/node_modules that .ci/run
//! installs with `npm ci`).

use std::path::{Path, PathBuf};

use crate::common::*;
use crate::protocol::{Sut, exercise, live_files};

pub(crate) fn python() -> Option<PathBuf> {
    let py = Path::new(ROOT).join("target/py-mcp/bin/python");
    let ok = std::process::Command::new(&py).args(["-c", "import mcp"]).output().is_ok_and(|o| o.status.success());
    ok.then_some(py)
}

/// A server script run by `command`, with the arguments both SDK servers
/// share (tests/python-mcp/server.py and tests/node/ts-server.mjs take the
/// same ones): 5 docs, fx://live, fx://blob, over pages of 2.
fn sdk_sut(
    command: &Path,
    script: PathBuf,
    t: &str,
    dir: &Path,
    protocol: Option<&'static str>,
    expect: &'static str,
) -> Sut {
    let (log, live) = live_files(dir);
    let (t, l, v, command) = (t.to_owned(), log.clone(), live.clone(), command.to_owned());
    Sut {
        yaml: Box::new(move |extra: &[&str]| {
            let mut args: Vec<String> = vec![script.to_str().unwrap().into(), "--n".into(), "5".into()];
            for a in ["--record", l.to_str().unwrap(), "--live", v.to_str().unwrap()].iter().chain(extra) {
                args.push((*a).to_owned());
            }
            let args: Vec<String> = args.iter().map(|a| format!("{a:?}")).collect();
            let mut yaml = format!(
                "  s:\n    command: {:?}\n    args: [{}]\n    env: {{ MCP_TEST_TAG: {t:?} }}\n    timeout_ms: 20000\n",
                command.to_str().unwrap(),
                args.join(", ")
            );
            if let Some(p) = protocol {
                yaml.push_str(&format!("    protocol: {p:?}\n"));
            }
            yaml
        }),
        log,
        live,
        ttl_args: vec!["--read-ttl-ms".into(), "300".into()],
        private_args: vec!["--private".into()],
        list_args: vec![],
        expect_protocol: expect,
        resources: 7,
        hints: expect == "2026-07-28",
    }
}

fn python_sut(py: PathBuf, t: &str, dir: &Path, protocol: Option<&'static str>, expect: &'static str) -> Sut {
    sdk_sut(&py, Path::new(ROOT).join("tests/python-mcp/server.py"), t, dir, protocol, expect)
}

#[tokio::test]
async fn python_sdk_server_on_2026_07_28_under_auto() {
    let Some(py) = python() else {
        return skip("python_sdk_server_on_2026_07_28_under_auto", "no target/py-mcp venv with `mcp` (see .ci/run)");
    };
    let (t, dir) = (tag(), tempfile::tempdir().unwrap());
    exercise(&python_sut(py, &t, dir.path(), None, "2026-07-28"), "python sdk, auto").await;
    assert!(!read_log(&dir.path().join("reads.log")).iter().any(|l| l.starts_with("subscribe ")));
}

#[tokio::test]
async fn python_sdk_server_forced_to_2025_11_25() {
    let Some(py) = python() else {
        return skip("python_sdk_server_forced_to_2025_11_25", "no target/py-mcp venv with `mcp` (see .ci/run)");
    };
    let (t, dir) = (tag(), tempfile::tempdir().unwrap());
    exercise(&python_sut(py, &t, dir.path(), Some("2025-11-25"), "2025-11-25"), "python sdk, 2025").await;
    assert!(read_log(&dir.path().join("reads.log")).iter().any(|l| l == "subscribe fx://live"));
}

/// `node` and the TypeScript SDK v2 in tests/node/node_modules.
pub(crate) fn node_sdk() -> Option<PathBuf> {
    let sdk = Path::new(ROOT).join("tests/node/node_modules/@modelcontextprotocol/server/package.json");
    let node = std::process::Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success());
    (node && sdk.exists()).then(|| Path::new(ROOT).join("tests/node/ts-server.mjs"))
}

pub(crate) const NO_NODE_SDK: &str =
    "node or tests/node/node_modules/@modelcontextprotocol/server missing (run `npm ci --prefix tests/node`)";

fn ts_sut(script: PathBuf, t: &str, dir: &Path, protocol: Option<&'static str>, expect: &'static str) -> Sut {
    Sut {
        // The TypeScript SDK passes the hints a handler returns on both
        // revisions (its 2025 codec only leaves out the defaults it fills in
        // for 2026-07-28), so the hint parts apply to both.
        hints: true,
        ..sdk_sut(Path::new("node"), script, t, dir, protocol, expect)
    }
}

#[tokio::test]
async fn typescript_sdk_server_on_2026_07_28_under_auto() {
    let Some(script) = node_sdk() else {
        return skip("typescript_sdk_server_on_2026_07_28_under_auto", NO_NODE_SDK);
    };
    let (t, dir) = (tag(), tempfile::tempdir().unwrap());
    exercise(&ts_sut(script, &t, dir.path(), None, "2026-07-28"), "typescript sdk, auto").await;
    let log = read_log(&dir.path().join("reads.log"));
    assert!(
        log.iter().any(|l| l.starts_with("listen ") && l.contains("fx://live")),
        "listen covers fx://live: {log:?}"
    );
    assert!(!log.iter().any(|l| l.starts_with("subscribe ")), "{log:?}");
}

#[tokio::test]
async fn typescript_sdk_server_forced_to_2025_11_25() {
    let Some(script) = node_sdk() else {
        return skip("typescript_sdk_server_forced_to_2025_11_25", NO_NODE_SDK);
    };
    let (t, dir) = (tag(), tempfile::tempdir().unwrap());
    exercise(&ts_sut(script, &t, dir.path(), Some("2025-11-25"), "2025-11-25"), "typescript sdk, 2025").await;
    let log = read_log(&dir.path().join("reads.log"));
    assert!(log.iter().any(|l| l == "subscribe fx://live"), "{log:?}");
    assert!(!log.iter().any(|l| l.starts_with("listen")), "{log:?}");
}

/// tests/python-mcp/server.py on the SDK's legacy HTTP+SSE transport
/// (`SseServerTransport` under uvicorn), and the port it listens on.
pub(crate) async fn python_sse_server(py: &Path, dir: &Path) -> (tokio::process::Child, u16) {
    python_http_server(py, dir, "--sse-port-file", &[]).await
}

/// tests/python-mcp/server.py listening on a free port, `mode` its
/// `--sse-port-file` or `--http-port-file` flag, with `extra` arguments.
pub(crate) async fn python_http_server(
    py: &Path,
    dir: &Path,
    mode: &str,
    extra: &[&str],
) -> (tokio::process::Child, u16) {
    let port_file = dir.join(format!("port{mode}"));
    let (log, live) = live_files(dir);
    let child = tokio::process::Command::new(py)
        .arg(Path::new(ROOT).join("tests/python-mcp/server.py"))
        .args(["--n", "5", "--record", log.to_str().unwrap(), "--live", live.to_str().unwrap()])
        .args(extra)
        .arg(mode)
        .arg(&port_file)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let port = crate::common::port_from_file(&port_file, &format!("the Python server ({mode})")).await;
    (child, port)
}

/// Every listed resource of `hub`'s one server, read and rendered, by URI.
async fn everything(hub: &mcp_context::servers::Hub) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for r in hub.resources() {
        let c = hub.read(&r.id).await.unwrap_or_else(|e| panic!("{}: {e}", r.id));
        out.push((r.id.uri.clone(), mcp_context::compose::render_text(&c, r.mime_type.as_deref())));
    }
    out
}

/// The same SDK server over the legacy HTTP+SSE transport (`transport:
/// sse`, the other spelling) and over Streamable HTTP: the same listing and
/// the same contents, a 1.5 MB text in one SSE event included.
#[tokio::test]
async fn python_sdk_server_same_over_sse_and_streamable_http() {
    let Some(py) = python() else {
        return skip(
            "python_sdk_server_same_over_sse_and_streamable_http",
            "no target/py-mcp venv with `mcp` (see .ci/run)",
        );
    };
    let dir = tempfile::tempdir().unwrap();
    let big = ["--big", "1500000"];
    let (_sse, sse_port) = python_http_server(&py, dir.path(), "--sse-port-file", &big).await;
    let (_http, http_port) = python_http_server(&py, dir.path(), "--http-port-file", &big).await;
    let over = |spelling: &str, url: String| {
        format!(
            "context:\n  max_resource_bytes: 4000000\nservers:\n  s:\n    {spelling}\n    url: {url}\n    timeout_ms: 20000\n"
        )
    };
    let sse = mcp_context::servers::Hub::connect(&config(&over(
        "transport: sse",
        format!("http://127.0.0.1:{sse_port}/sse"),
    )))
    .await;
    let http =
        mcp_context::servers::Hub::connect(&config(&over("type: http", format!("http://127.0.0.1:{http_port}/mcp"))))
            .await;
    assert!(sse.failures().is_empty() && http.failures().is_empty(), "{:?} {:?}", sse.failures(), http.failures());
    let (a, b) = (everything(&sse).await, everything(&http).await);
    assert_eq!(a.len(), 8, "{:?}", a.iter().map(|x| &x.0).collect::<Vec<_>>());
    let big = a.iter().find(|(u, _)| u == "fx://big").map(|(_, t)| t.len());
    assert_eq!(big, Some(1_500_000));
    assert!(a == b, "the two transports disagree");
    sse.close().await;
    http.close().await;
}

#[tokio::test]
async fn python_sdk_server_over_legacy_sse() {
    let Some(py) = python() else {
        return skip("python_sdk_server_over_legacy_sse", "no target/py-mcp venv with `mcp` (see .ci/run)");
    };
    let dir = tempfile::tempdir().unwrap();
    let (_server, port) = python_sse_server(&py, dir.path()).await;
    let yaml = format!("servers:\n  s:\n    type: sse\n    url: http://127.0.0.1:{port}/sse\n    timeout_ms: 20000\n");
    let hub = mcp_context::servers::Hub::connect(&config(&yaml)).await;
    assert!(hub.failures().is_empty(), "{:?}", hub.failures());
    assert!(hub.status()[0].listing_complete);
    let mut uris: Vec<String> = hub.resources().iter().map(|r| r.id.uri.clone()).collect();
    uris.sort();
    assert_eq!(uris, ["fx://blob", "fx://doc/0", "fx://doc/1", "fx://doc/2", "fx://doc/3", "fx://doc/4", "fx://live"]);
    let text = hub.read(&mcp_context::ResourceId::parse("s:fx://doc/1").unwrap()).await.unwrap();
    assert!(mcp_context::compose::render_text(&text, None).contains("Document 1"), "{text:?}");
    let blob = hub.read(&mcp_context::ResourceId::parse("s:fx://blob").unwrap()).await.unwrap();
    assert!(matches!(blob.parts[0], mcp_context::ContentPart::Blob { .. }), "{blob:?}");
    let missing = hub.read(&mcp_context::ResourceId::parse("s:fx://doc/999").unwrap()).await.unwrap_err();
    assert!(matches!(missing, mcp_context::Error::NotFound { .. }), "{missing:?}");
    assert!(read_log(&dir.path().join("reads.log")).iter().any(|l| l == "fx://doc/1"));
    hub.close().await;

    // The same URL as Streamable HTTP: `POST /sse` is 405, and the error says `type: sse`.
    let hub = mcp_context::servers::Hub::connect(&config(&yaml.replace("type: sse", "type: http"))).await;
    let failures = format!("{:?}", hub.failures());
    assert!(failures.contains("405") && failures.contains("type: sse"), "{failures}");
    hub.close().await;
}
