//! Security: no cross-user leaks under concurrency and change, secrets kept
//! out of logs, errors and reports, minimal child environment, and loaders
//! and identifier parsing that never panic on bad input.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use mcp_context::{Config, ContextRequest, McpContext, Policy, ResourceId};
use proptest::prelude::*;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_cross_user_leaks_while_resources_change() {
    let t = tag();
    let dir = tempfile::tempdir().unwrap();
    let (live, list) = (dir.path().join("live"), dir.path().join("n"));
    std::fs::write(&live, "live v0").unwrap();
    std::fs::write(&list, "8").unwrap();
    let yaml = format!(
        "servers:\n{}",
        fixture_server(
            "fx",
            &t,
            &["--n", "8", "--subscribe", "--live", live.to_str().unwrap(), "--list-file", list.to_str().unwrap()]
        )
    );
    // Twelve users, each allowed a pseudo-random subset of the 8 documents
    // (and user 0 the live resource), some with denies on top.
    let mut policy = String::from("users:\n");
    let mut allowed: Vec<BTreeSet<usize>> = Vec::new();
    let mut seed = 0x2545F491u64;
    for u in 0..12 {
        let mut set = BTreeSet::new();
        let mut rules = String::new();
        for d in 0..8 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            if seed.is_multiple_of(3) {
                set.insert(d);
                rules.push_str(&format!("      - {{ uri: \"fx://doc/{d}\" }}\n"));
            }
        }
        if u == 0 {
            rules.push_str("      - { uri: \"fx://live\" }\n");
        }
        let deny = if u % 4 == 1 { "    deny: [ { uri: \"fx://doc/[0-3]\" } ]\n" } else { "" };
        if u % 4 == 1 {
            set.retain(|d| *d > 3);
        }
        if rules.is_empty() {
            policy.push_str(&format!("  u{u}:\n    allow: []\n{deny}"));
        } else {
            policy.push_str(&format!("  u{u}:\n    allow:\n{rules}{deny}"));
        }
        allowed.push(set);
    }
    let ctx = Arc::new(
        McpContext::with_policy(&config(&yaml), Policy::from_yaml(&policy, Path::new("p.yaml")).unwrap()).await,
    );
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Change things underneath: the live resource and the listing.
    let changer = {
        let (stop, live, list) = (stop.clone(), live.clone(), list.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                i += 1;
                // Replaced whole (written aside, then renamed): a plain write
                // truncates first, and a read in between would see an empty page.
                let write = |path: &std::path::Path, text: String| {
                    let aside = path.with_extension("new");
                    std::fs::write(&aside, text).unwrap();
                    std::fs::rename(&aside, path).unwrap();
                };
                write(&live, format!("live v{i}"));
                write(&list, (if i % 2 == 0 { "8" } else { "6" }).to_owned());
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        })
    };
    let mut tasks = Vec::new();
    for round in 0..25 {
        for u in 0..13usize {
            let ctx = ctx.clone();
            tasks.push(tokio::spawn(async move {
                let user = format!("u{u}");
                let (m, r) = ctx.build(&ContextRequest::for_user(&user)).await.unwrap();
                (u, round, m.map(|m| m.content).unwrap_or_default(), r)
            }));
        }
    }
    for task in tasks {
        let (u, round, content, report) = task.await.unwrap();
        let allow = allowed.get(u).cloned().unwrap_or_default(); // u12 is unknown: nothing
        for d in 0..8 {
            let in_message = content.contains(&format!("id=\"fx:fx://doc/{d}\""));
            assert!(!in_message || allow.contains(&d), "round {round}: u{u} got doc {d}");
            // What is in the message is that document's own text.
            if in_message {
                assert!(content.contains(&format!("Document {d}.")));
            }
        }
        assert_eq!(content.contains("fx:fx://live"), u == 0 && content.contains("live v"), "u{u}");
        for i in &report.included {
            let d: Option<usize> = i.id.strip_prefix("fx:fx://doc/").and_then(|d| d.parse().ok());
            assert!(d.is_none_or(|d| allow.contains(&d)), "u{u} included {}", i.id);
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    changer.await.unwrap();
    ctx.close().await;
}

#[test]
fn secrets_never_reach_logs_errors_or_reports() {
    let t = tag();
    let secret = "s3cr3t-7d1f0a";
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(
        &cfg,
        format!(
            "servers:\n{}    args: [\"--n\", \"1\", \"--token\", \"${{SECRET_TOKEN}}\"]\n  broken:\n    command: \"/nonexistent/${{SECRET_TOKEN}}\"\n    env: {{ KEY: \"${{SECRET_TOKEN}}\" }}\n  web:\n    url: \"http://127.0.0.1:9/mcp?key=${{SECRET_TOKEN}}\"\n    headers: {{ Authorization: \"Bearer ${{SECRET_TOKEN}}\" }}\n    timeout_ms: 500\n",
            fixture_server("fx", &t, &[]).replace("    args: []\n", "")
        ),
    )
    .unwrap();
    for args in [vec!["-vv", "list"], vec!["-vv", "preview", "--json"], vec!["preview"], vec!["read", "broken:x://y"]] {
        let out = Command::new(MCP_CONTEXT)
            .arg("--config")
            .arg(&cfg)
            .args(&args)
            .env("SECRET_TOKEN", secret)
            .output()
            .unwrap();
        let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!all.contains(secret), "{args:?} leaked the secret:\n{all}");
        assert!(all.contains("broken"), "{args:?}: the failing server is still named:\n{all}");
    }
}

#[test]
fn stdio_servers_get_a_minimal_environment() {
    let t = tag();
    let (_dir, cfg) = temp_config(&format!(
        "servers:\n{}    inherit_env: [PASS_THROUGH_ME]\n",
        fixture_server("fx", &t, &["--specials"]).replace("env: {", "env: { FROM_CONFIG: yes,")
    ));
    let out = Command::new(MCP_CONTEXT)
        .args(["--config", cfg.to_str().unwrap(), "read", "fx:fx://env"])
        .env("HOST_ONLY_SECRET", "x")
        .env("PASS_THROUGH_ME", "y")
        .output()
        .unwrap();
    let names: BTreeSet<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect();
    assert!(names.contains("FROM_CONFIG") && names.contains("PASS_THROUGH_ME") && names.contains("PATH"), "{names:?}");
    assert!(!names.contains("HOST_ONLY_SECRET"), "{names:?}");
    // Nothing beyond the allowlist, the config's env and inherit_env.
    for n in &names {
        assert!(
            mcp_context::settings::ENV_ALLOWLIST.contains(&n.as_str())
                || ["FROM_CONFIG", "PASS_THROUGH_ME", "MCP_TEST_TAG"].contains(&n.as_str()),
            "unexpected variable {n}"
        );
    }
}

/// YAML-ish text built from the config and policy vocabularies, so the
/// fuzzer reaches deep into both loaders, plus raw noise.
fn yamlish() -> impl Strategy<Value = String> {
    let word = prop::sample::select(vec![
        "servers",
        "mcpServers",
        "policy",
        "context",
        "command",
        "args",
        "env",
        "url",
        "httpUrl",
        "headers",
        "timeout_ms",
        "cwd",
        "type",
        "model",
        "max_tokens",
        "role",
        "roles",
        "users",
        "allow",
        "deny",
        "include",
        "default_roles",
        "server",
        "uri",
        "mime",
        "demo",
        "a:b",
        "\"**\"",
        "\"[abc\"",
        "*",
        "&x",
        "*x",
        "!!binary",
        "${HOME}",
        "${NOPE}",
        "-1",
        "0",
        "99999999999999999999",
        "null",
        "~",
        "[",
        "]",
        "{",
        "}",
        "-",
        ":",
        "'",
        "\"",
        "\t",
        "\u{0}",
        "é",
    ]);
    let line = (0usize..4, prop::collection::vec(word, 1..4))
        .prop_map(|(indent, ws)| format!("{}{}", "  ".repeat(indent), ws.join(": ")));
    prop_oneof![prop::collection::vec(line, 0..12).prop_map(|ls| ls.join("\n")), ".{0,200}",]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn loaders_never_panic_and_say_where(src in yamlish()) {
        let path = Path::new("/etc/fuzz/input.yaml");
        if let Err(e) = Config::from_yaml_with_env(&src, path, &|k| (k == "HOME").then(|| "/root".into())) {
            let msg = e.to_string();
            prop_assert!(msg.starts_with("/etc/fuzz/input.yaml"), "{msg}");
            prop_assert!(msg.len() > "/etc/fuzz/input.yaml: ".len() + 5, "{msg}");
        }
        if let Err(e) = Policy::from_yaml(&src, path) {
            let msg = e.to_string();
            prop_assert!(msg.starts_with("/etc/fuzz/input.yaml"), "{msg}");
        }
    }

    #[test]
    fn identifiers_never_panic(input in "(?s).{0,300}", prefix in "[a-z_-]{0,5}") {
        for s in [input.clone(), format!("{prefix}:{input}"), format!("{prefix}:{}", input.repeat(40))] {
            match ResourceId::parse(&s) {
                Ok(id) => {
                    prop_assert_eq!(id.to_string(), s.clone());
                    prop_assert!(!id.server.contains(':') && !id.server.is_empty());
                }
                Err(e) => prop_assert!(e.to_string().starts_with("invalid resource identifier")),
            }
        }
    }
}
