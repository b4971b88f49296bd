//! The benchmark workload: the Rust port reproduces the lab's Python
//! generator byte for byte, and `examples/bench_server` serves it as a real
//! MCP server.

use std::path::Path;

use mcp_context::ContentPart;
use mcp_context::servers::Hub;

use crate::common::*;

#[path = "../../examples/bench/workload.rs"]
mod workload;

#[test]
fn default_workload_has_the_labs_size() {
    let specs = workload::build(1000, 2048, 100, workload::DEFAULT_SEED);
    let context = workload::context_string(&specs);
    // The lab README: every correct client reports chars = 1847698.
    assert_eq!(context.chars().count(), 1_847_698);
}

/// Compared with CPython running the lab's own `workload.py`, when the lab
/// (`../shared/lab` next to the repository) and python3 are there.
#[test]
fn workload_matches_python_byte_for_byte() {
    let lab = Path::new(ROOT).join("../shared/lab");
    if !lab.join("workload.py").exists() {
        skip("workload_matches_python_byte_for_byte", &format!("{} not found", lab.display()));
        return;
    }
    let code = "import sys, base64\nsys.path.insert(0, '.')\nimport workload as w\n\
        n, size, seed = 120, 700, 20240601\n\
        parts = []\n\
        for i in range(n):\n\
        \x20   s = w.resource_seed(seed, i)\n\
        \x20   parts.append(w.blob_placeholder(w.BLOB_MIME) if w.is_blob(i) else w.make_text(s, size))\n\
        sys.stdout.write(w.CONTEXT_JOINER.join(parts))\n\
        sys.stdout.write('\\n--blob--\\n' + base64.b64encode(w.blob_bytes(w.resource_seed(seed, 9), 33)).decode())\n";
    let out = match std::process::Command::new("python3").arg("-c").arg(code).current_dir(&lab).output() {
        Ok(o) if o.status.success() => String::from_utf8(o.stdout).unwrap(),
        other => {
            skip("workload_matches_python_byte_for_byte", &format!("python3 failed: {other:?}"));
            return;
        }
    };
    let (text, blob) = out.split_once("\n--blob--\n").unwrap();
    let ours = workload::context_string(&workload::build(120, 700, 100, workload::DEFAULT_SEED));
    assert!(ours == text, "the Rust workload differs from workload.py");
    use base64::Engine as _;
    let ours_blob = base64::engine::general_purpose::STANDARD
        .encode(workload::blob_bytes(workload::resource_seed(workload::DEFAULT_SEED, 9), 33));
    assert_eq!(ours_blob, blob);
}

/// `cargo test` builds the examples next to the test binaries.
#[tokio::test]
async fn bench_server_is_a_real_mcp_server_with_that_workload() {
    let exe = std::env::current_exe().unwrap();
    let server = exe.parent().unwrap().parent().unwrap().join("examples").join("bench_server");
    let t = tag();
    let yaml = format!(
        "servers:\n  bench:\n    command: {:?}\n    args: [\"--n\", \"30\", \"--size\", \"300\", \"--page-size\", \"7\"]\n    env: {{ MCP_TEST_TAG: {t:?} }}\n",
        server.to_string_lossy()
    );
    let hub = Hub::connect(&config(&yaml)).await;
    assert!(hub.failures().is_empty(), "{:?}", hub.failures());
    let listed = hub.listed("bench");
    assert_eq!(listed.len(), 30);
    assert_eq!(listed[9].mime_type.as_deref(), Some("image/png"));
    assert_eq!(listed[3].annotations.priority, Some(0.3));
    let mut parts = Vec::new();
    for r in &listed {
        for p in hub.read(&r.id).await.unwrap().parts {
            parts.push(match p {
                ContentPart::Text { text, .. } => text,
                ContentPart::Blob { mime_type, .. } => format!("[Binary Data ({})]", mime_type.unwrap_or_default()),
                other => panic!("a part of a kind the workload never serves: {other:?}"),
            });
        }
    }
    let expected = workload::context_string(&workload::build(30, 300, 7, workload::DEFAULT_SEED));
    assert!(parts.join("\n\n") == expected, "served contents differ from the workload");
    assert!(hub.read(&mcp_context::ResourceId::parse("bench:bench://nope").unwrap()).await.unwrap_err().is_not_found());
    hub.close().await;
}
