//! Interop with a server built on the official Python SDK (`mcp` 2.x,
//! tests/python-mcp/server.py, in the venv target/py-mcp that .ci/run
//! creates), on 2026-07-28 (what `auto` negotiates with it) and forced to
//! 2025-11-25 (the same server, our side pinned): the scenario of
//! `protocol::exercise`.

use std::path::{Path, PathBuf};

use crate::common::*;
use crate::protocol::{Sut, exercise};

fn python() -> Option<PathBuf> {
    let py = Path::new(ROOT).join("target/py-mcp/bin/python");
    let ok = std::process::Command::new(&py).args(["-c", "import mcp"]).output().is_ok_and(|o| o.status.success());
    ok.then_some(py)
}

fn python_sut(py: PathBuf, t: &str, dir: &Path, protocol: Option<&'static str>, expect: &'static str) -> Sut {
    let log = dir.join("reads.log");
    let live = dir.join("live.txt");
    std::fs::write(&live, "version one").unwrap();
    let script = Path::new(ROOT).join("tests/python-mcp/server.py");
    let (t, l, v) = (t.to_owned(), log.clone(), live.clone());
    Sut {
        yaml: Box::new(move |extra: &[&str]| {
            let mut args: Vec<String> = vec![script.to_str().unwrap().into(), "--n".into(), "5".into()];
            for a in ["--record", l.to_str().unwrap(), "--live", v.to_str().unwrap()].iter().chain(extra) {
                args.push((*a).to_owned());
            }
            let args: Vec<String> = args.iter().map(|a| format!("{a:?}")).collect();
            let mut yaml = format!(
                "  s:\n    command: {:?}\n    args: [{}]\n    env: {{ MCP_TEST_TAG: {t:?} }}\n    timeout_ms: 20000\n",
                py.to_str().unwrap(),
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
        // 5 docs, fx://live, fx://blob, over pages of 2.
        resources: 7,
        hints: expect == "2026-07-28",
    }
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
