//! The policy, enforced before reading, against a real server that records
//! every `resources/read` it serves.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use mcp_context::{ContextRequest, ExcludeReason, McpContext, Policy};
use proptest::prelude::*;

use crate::common::*;

const POLICY: &str = r#"
default_roles: [reader]
roles:
  reader:
    allow:
      - { server: fx, uri: "fx://doc/*" }
    deny:
      - { uri: "fx://doc/1" }
  admin:
    allow:
      - { uri: "**" }
users:
  root:
    roles: [admin]
  eve:
    roles: [reader]
    deny:
      - { uri: "fx://doc/[0-2]" }
"#;

#[tokio::test]
async fn a_denied_resource_is_never_read_never_injected_and_reported() {
    let t = tag();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("reads.log");
    let yaml = format!("servers:\n{}", fixture_server("fx", &t, &["--n", "5", "--record", log.to_str().unwrap()]));
    let policy = Policy::from_yaml(POLICY, Path::new("policies/test.yaml")).unwrap();
    let ctx = McpContext::with_policy(&config(&yaml), policy).await;
    let (message, report) = ctx.build(&ContextRequest::for_user("eve")).await.unwrap();
    let content = message.unwrap().content;
    let reads: BTreeSet<String> = read_log(&log).into_iter().collect();
    assert_eq!(reads, BTreeSet::from(["fx://doc/3".to_string(), "fx://doc/4".to_string()]));
    for i in 0..3 {
        let id = format!("fx:fx://doc/{i}");
        assert!(!content.contains(&id) && !content.contains(&format!("Document {i}.")));
        let e = report.excluded(&id).unwrap();
        assert_eq!(e.reason, ExcludeReason::Denied);
        assert!(e.detail.as_deref().unwrap().contains("policies/test.yaml"), "{e:?}");
    }
    // The model-facing tool path asks the same policy: no read either.
    let r = ctx.tools().run("c1", mcp_context::tools::READ_TOOL, r#"{"uri":"fx:fx://doc/0"}"#, "eve").await;
    assert_eq!(r.content, "Error: Resource not found for URI: fx:fx://doc/0");
    assert_eq!(read_log(&log).len(), 2, "the tool path read nothing");
    // doc/0 is denied by eve's own rule; for an unknown user (default role
    // reader) doc/1 is denied by the role's rule.
    assert!(report.excluded("fx:fx://doc/0").unwrap().detail.as_deref().unwrap().contains("user eve deny[0]"));
    let (_, report) = ctx.build(&ContextRequest::for_user("mallory")).await.unwrap();
    assert!(report.excluded("fx:fx://doc/1").unwrap().detail.as_deref().unwrap().contains("role reader deny[0]"));
    assert!(!read_log(&log).contains(&"fx://doc/1".to_string()));
    ctx.close().await;
}

#[tokio::test]
async fn concurrent_injections_for_different_users_stay_apart() {
    let t = tag();
    let yaml = format!("servers:\n{}", fixture_server("fx", &t, &["--n", "6"]));
    let policy = Policy::from_yaml(
        r#"
users:
  u0: { allow: [ { uri: "fx://doc/0" } ] }
  u1: { allow: [ { uri: "fx://doc/1" } ] }
  u2: { allow: [ { uri: "fx://doc/2" } ] }
  u3: { allow: [ { uri: "fx://doc/3" } ] }
  u4: { allow: [ { uri: "fx://doc/[45]" } ] }
"#,
        Path::new("p.yaml"),
    )
    .unwrap();
    let ctx = Arc::new(McpContext::with_policy(&config(&yaml), policy).await);
    let mut tasks = Vec::new();
    for round in 0..20 {
        for u in 0..6 {
            let ctx = ctx.clone();
            tasks.push(tokio::spawn(async move {
                let user = format!("u{u}");
                let (m, report) = ctx.build(&ContextRequest::for_user(&user)).await.unwrap();
                (u, round, m.map(|m| m.content), report)
            }));
        }
    }
    for task in tasks {
        let (u, _round, content, report) = task.await.unwrap();
        let expected: Vec<String> = match u {
            0..=3 => vec![format!("fx:fx://doc/{u}")],
            4 => vec!["fx:fx://doc/4".into(), "fx:fx://doc/5".into()],
            _ => vec![], // u5 is unknown: no default roles, nothing visible
        };
        let mut got: Vec<String> = report.included.iter().map(|i| i.id.clone()).collect();
        got.sort();
        assert_eq!(got, expected, "user u{u}");
        let content = content.unwrap_or_default();
        for i in 0..6 {
            let id = format!("fx:fx://doc/{i}");
            assert_eq!(content.contains(&format!("\"{id}\"")), expected.contains(&id), "u{u} / {id}");
        }
    }
    ctx.close().await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// For random policies over a real server's resources: nothing the policy
    /// denies is ever in the message, and everything included is allowed.
    #[test]
    fn nothing_denied_is_ever_injected(
        allows in proptest::collection::vec(0usize..8, 0..4),
        denies in proptest::collection::vec(0usize..8, 0..3),
        budget in 50usize..2000,
    ) {
        let globs = ["fx://doc/*", "fx://doc/1", "fx://doc/[0-3]", "**", "fx://doc/?", "fx://blob", "fx://multi", "fx://*"];
        let rules = |ix: &[usize]| ix.iter().map(|i| format!("      - {{ uri: {:?} }}\n", globs[*i])).collect::<String>();
        let yaml_policy = format!("users:\n  p:\n    allow:\n{}    deny:\n{}", rules(&allows), rules(&denies))
            .replace("    allow:\n    deny:", "    allow: []\n    deny:")
            .trim_end_matches("    deny:\n")
            .to_string();
        let yaml_policy = if yaml_policy.ends_with("deny:") { format!("{yaml_policy} []") } else { yaml_policy };
        let policy = Policy::from_yaml(&yaml_policy, Path::new("gen.yaml")).unwrap_or_else(|e| panic!("{e}\n{yaml_policy}"));
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async {
            let t = tag();
            let yaml = format!("servers:\n{}", fixture_server("fx", &t, &["--n", "6", "--specials"]));
            let check = Policy::from_yaml(&yaml_policy, Path::new("gen.yaml")).unwrap();
            let ctx = McpContext::with_policy(&config(&yaml), policy).await;
            let req = ContextRequest::for_user("p").with_budget(budget);
            let (m, report) = ctx.build(&req).await.unwrap();
            let content = m.map(|m| m.content).unwrap_or_default();
            let up = check.for_user("p");
            for r in ctx.hub().resources() {
                let allowed = up.decide(&r).allowed;
                let marker = format!("id=\"{}\"", r.id);
                if !allowed {
                    prop_assert!(!content.contains(&marker), "{} denied but injected", r.id);
                    prop_assert_eq!(report.excluded(&r.id.to_string()).map(|e| e.reason), Some(ExcludeReason::Denied));
                }
            }
            for i in &report.included {
                let r = ctx.hub().resources().into_iter().find(|r| r.id.to_string() == i.id).unwrap();
                prop_assert!(up.decide(&r).allowed);
            }
            ctx.close().await;
            Ok(())
        })?;
    }
}
