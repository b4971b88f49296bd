//! Tests of loading and deciding (the glob dialect's own are in `glob.rs`).

use super::compile::json_quote;
use super::glob::{glob_ref, mime_essence, mime_with_params};
use super::*;
use super::{canonical_glob, canonical_uri};
use crate::error::Error;
use proptest::prelude::*;

/// The demo policy; it moves to `policies/default.yaml` in the real crate.
const DEFAULT_POLICY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/policies/default.yaml");

fn res(id: &str) -> Resource {
    Resource::unlisted(ResourceId::parse(id).unwrap())
}

fn res_mime(id: &str, mime: &str) -> Resource {
    Resource { mime_type: Some(mime.into()), ..res(id) }
}

fn policy(src: &str) -> Policy {
    Policy::from_yaml(src, Path::new("p.yaml")).unwrap_or_else(|e| panic!("{e}"))
}

fn sees(p: &Policy, user: &str, r: &Resource) -> bool {
    p.for_user(user).decide(r).allowed
}

/// (line, column, message, full display) of a load error.
fn err_of(e: Error) -> (Option<usize>, Option<usize>, String, String) {
    let shown = e.to_string();
    match e {
        Error::Policy { line, column, message, .. } => (line, column, message, shown),
        other => panic!("not a policy error: {other}"),
    }
}

fn load_err(src: &str) -> (Option<usize>, Option<usize>, String, String) {
    let e = err_of(Policy::from_yaml(src, Path::new("bad.yaml")).expect_err("should fail"));
    assert!(e.3.starts_with("bad.yaml:"), "names the file and line: {}", e.3);
    e
}

// ---- decisions ----------------------------------------------------------

const TWO_ROLES: &str = r#"
roles:
  reader:
    allow:
      - { server: demo, uri: "demo://**" }
  cautious:
    deny:
      - { uri: "demo://private/**" }
users:
  ann: { roles: [reader, cautious] }
  ben:
    roles: [reader]
    deny:
      - { uri: "demo://docs/draft" }
  cid:
    allow:
      - { server: crm, uri: "crm://cid/**" }
"#;

#[test]
fn deny_in_one_role_beats_allow_in_another() {
    let p = policy(TWO_ROLES);
    let ann = p.for_user("ann");
    assert!(ann.decide(&res("demo:demo://docs/a")).allowed);
    let d = ann.decide(&res("demo:demo://private/x"));
    assert!(!d.allowed);
    let rule = d.rule.as_ref().unwrap();
    assert_eq!((rule.owner.as_str(), rule.effect, rule.index), ("role cautious", Effect::Deny, 0));
    assert_eq!(d.detail(), r#"denied by p.yaml:8: role cautious deny[0] { uri: "demo://private/**" }"#);
    let ok = ann.decide(&res("demo:demo://docs/a"));
    assert_eq!(ok.detail(), r#"allowed by p.yaml:5: role reader allow[0] { server: "demo", uri: "demo://**" }"#);
}

#[test]
fn users_own_rules_count() {
    let p = policy(TWO_ROLES);
    assert!(sees(&p, "ben", &res("demo:demo://docs/a")));
    assert!(sees(&p, "ben", &res("demo:demo://private/x")));
    let d = p.for_user("ben").decide(&res("demo:demo://docs/draft"));
    assert!(!d.allowed);
    assert_eq!(d.rule.unwrap().owner, "user ben");
    assert!(sees(&p, "cid", &res("crm:crm://cid/notes")));
    assert!(!sees(&p, "cid", &res("crm:crm://dan/notes")));
    assert!(!sees(&p, "cid", &res("demo:demo://docs/a")));
    assert!(p.for_user("cid").roles().is_empty());
    assert!(p.for_user("cid").is_known());
}

#[test]
fn unknown_users_get_default_roles_or_nothing() {
    let with = policy("default_roles: [public]\nroles:\n  public:\n    allow: [{ uri: \"demo://public/**\" }]\n");
    let u = with.for_user("stranger");
    assert!(!u.is_known());
    assert_eq!(u.roles(), ["public"]);
    assert!(u.decide(&res("demo:demo://public/faq")).allowed);
    let d = u.decide(&res("demo:demo://docs/guide"));
    assert_eq!(d, Decision { allowed: false, rule: None });
    assert_eq!(d.detail(), "no allow rule matches");
    assert_eq!(u.explain(&d), "no allow rule matches (user stranger (not listed under users), roles: public)");

    for src in ["roles:\n  public:\n    allow: [{}]\n", "default_roles: []\nroles:\n  public:\n    allow: [{}]\n"] {
        let without = policy(src);
        let u = without.for_user("stranger");
        assert!(u.roles().is_empty());
        assert!(!u.decide(&res("demo:demo://public/faq")).allowed);
        assert!(u.explain(&u.decide(&res("demo:x"))).ends_with("roles: none)"));
    }
}

#[test]
fn empty_policy_shows_nothing() {
    for src in ["", "# nothing\n", "roles:\nusers:\n"] {
        let p = policy(src);
        assert!(!sees(&p, "anyone", &res("demo:demo://public/faq")));
        assert_eq!(p.for_user("anyone").max_tokens(), None);
        assert!(p.for_user("anyone").includes().is_empty());
    }
}

#[test]
fn allow_all_allows_everything() {
    let p = Policy::allow_all();
    for r in [res("demo:demo://a"), res("x:secret://a/b/c"), res_mime("d:z", "image/png")] {
        let d = p.for_user("whoever").decide(&r);
        assert!(d.allowed, "{r:?}");
        assert!(d.detail().starts_with("allowed by (built-in allow-all policy)"), "{}", d.detail());
    }
    assert_eq!(p.for_user("x").max_tokens(), None);
}

#[test]
fn mime_rules_need_a_listed_mime_type() {
    let p = policy(
        r#"
roles:
  r:
    allow:
      - { mime: "text/*" }
      - { uri: "img://**" }
    deny:
      - { mime: "image/*" }
users:
  u: { roles: [r] }
"#,
    );
    assert!(sees(&p, "u", &res_mime("s:doc://a", "text/plain")));
    assert!(!sees(&p, "u", &res_mime("s:doc://a", "application/json")));
    // No MIME type: the text/* allow cannot match...
    assert!(!sees(&p, "u", &res("s:doc://a")));
    // ...and neither can the image/* deny.
    assert!(sees(&p, "u", &res("s:img://logo")));
    assert!(!sees(&p, "u", &res_mime("s:img://logo", "image/png")));
}

#[test]
fn budget_is_users_else_largest_of_roles_else_none() {
    let p = policy(
        r#"
roles:
  small: { max_tokens: 100 }
  big: { max_tokens: 900 }
  none: {}
users:
  own: { roles: [small, big], max_tokens: 50 }
  roles: { roles: [small, big, none] }
  nothing: { roles: [none] }
"#,
    );
    assert_eq!(p.for_user("own").max_tokens(), Some(50));
    assert_eq!(p.for_user("roles").max_tokens(), Some(900));
    assert_eq!(p.for_user("nothing").max_tokens(), None);
    assert_eq!(p.for_user("stranger").max_tokens(), None);
}

#[test]
fn includes_expand_encoded_user_deduplicated_in_order() {
    let p = policy(
        r#"
roles:
  a:
    include: ["crm:crm://users/{user}/profile", "docs:docs://shared"]
  b:
    include: ["docs:docs://shared", "crm:crm://users/{user}/profile"]
users:
  "j doe/x":
    roles: [a, b]
    include: ["docs:docs://mine/{user}"]
"#,
    );
    let u = p.for_user("j doe/x");
    let got: Vec<String> = u.includes().iter().map(ToString::to_string).collect();
    assert_eq!(got, ["docs:docs://mine/j%20doe%2Fx", "crm:crm://users/j%20doe%2Fx/profile", "docs:docs://shared"]);
    // Unreserved characters stay, everything else (UTF-8 bytes too) is encoded.
    let odd = p.for_user("x~.-_é:");
    assert!(odd.includes().is_empty(), "not listed, no default roles");
    let p = policy("roles:\n  a:\n    include: [\"s:s://{user}\"]\nusers:\n  \"x~.-_é:\": { roles: [a] }\n");
    assert_eq!(p.for_user("x~.-_é:").includes()[0].uri, "s://x~.-_%C3%A9%3A");
    let p = policy("default_roles: [a]\nroles:\n  a:\n    include: [\"s:s://{user}/x\", \"s:s://fixed\"]\n");
    assert_eq!(p.for_user("..").includes(), [ResourceId::parse("s:s://fixed").unwrap()]);
    assert_eq!(p.for_user("...").includes()[0].uri, "s://.../x");
}

#[test]
fn policy_is_send_sync_and_user_policy_is_cheap() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Policy>();
    assert_send_sync::<UserPolicy>();
    let p = policy(TWO_ROLES);
    let a = p.for_user("ann");
    let b = p.for_user("ann");
    assert!(Arc::ptr_eq(&a.grants[1], &b.grants[1]), "rules are shared, not recompiled");
}

// ---- rule references and lines --------------------------------------

#[test]
fn rule_lines_in_common_layouts() {
    let src = "roles:\n  r:\n    allow:\n    - uri: \"a\"\n      server: x\n    # a comment\n\n    - uri: \"b\"\n    deny: [{ uri: c }, { uri: d }]\nusers:\n  \"u\":\n    roles:\n      - r\n    deny:\n      -   { mime: \"x/*\" }\n";
    let p = policy(src);
    let u = p.for_user("u");
    let line = |effect: Effect, owner: &str, i: usize| {
        u.grants
            .iter()
            .flat_map(|g| g.rules(effect))
            .find(|r| r.reference.owner == owner && r.reference.index == i)
            .map(|r| r.reference.line)
            .unwrap()
    };
    assert_eq!(line(Effect::Allow, "role r", 0), Some(4));
    assert_eq!(line(Effect::Allow, "role r", 1), Some(8));
    assert_eq!(line(Effect::Deny, "role r", 1), Some(9));
    assert_eq!(line(Effect::Deny, "user u", 0), Some(15));
    let d = u.decide(&res_mime("x:b", "x/y"));
    assert_eq!(d.rule.unwrap().to_string(), "p.yaml:15: user u deny[0] { mime: \"x/*\" }");
    // Flow style everywhere: the line comes from the parser too.
    let p = policy("{roles: {r: {allow: [{uri: a}]}}, users: {u: {roles: [r]}}}");
    let d = p.for_user("u").decide(&res("s:a"));
    assert_eq!(d.rule.unwrap().to_string(), "p.yaml:1: role r allow[0] { uri: \"a\" }");
    let p = policy("{roles: {r: {allow: [{uri: a},\n  {uri: b}]}},\n users: {u: {roles: [r]}}}");
    assert_eq!(p.for_user("u").decide(&res("s:b")).rule.unwrap().line, Some(2));
}

#[test]
fn summary_lists_files_roles_and_users() {
    let s = policy(TWO_ROLES).summary();
    assert_eq!(s.files, [PathBuf::from("p.yaml")]);
    assert_eq!(s.roles.len(), 2);
    assert_eq!(s.roles[1], RoleSummary { name: "reader".into(), allow: 1, deny: 0, max_tokens: None, include: 0 });
    assert_eq!(s.users[0], UserSummary { name: "ann".into(), roles: vec!["reader".into(), "cautious".into()] });
    let text = s.to_string();
    for needle in [
        "policy files: p.yaml",
        "default roles: none",
        "cautious: 0 allow, 1 deny",
        "ann: reader, cautious",
        "cid: (no roles)",
    ] {
        assert!(text.contains(needle), "{needle} in\n{text}");
    }
}

// ---- loading errors ---------------------------------------------------

#[test]
fn invalid_yaml_names_file_and_line() {
    let (line, _, msg, shown) = load_err("roles:\n  staff:\n    allow: [\n      { uri: a }\n    deny: []\n");
    assert_eq!(line, Some(5), "{shown}");
    assert!(shown.starts_with("bad.yaml:5:"), "{shown}");
    assert!(!msg.contains("at line 5"), "location not repeated: {msg}");
    assert!(msg.contains("flow sequence at line 3"), "context kept: {msg}");
    let (line, _, msg, _) = load_err("roles:\n  r:\n    allow:\n      - { server: *, uri: a }\n");
    assert_eq!(line, Some(4));
    assert!(msg.contains("must be quoted"), "{msg}");
    let (_, _, msg, _) = load_err("- a\n- b\n");
    assert!(msg.contains("invalid type"), "{msg}");
}

#[test]
fn unknown_key_names_file_and_line() {
    let (line, col, msg, _) = load_err("roles:\n  staff:\n    alow:\n      - { uri: a }\n");
    assert_eq!((line, col), (Some(3), Some(5)));
    assert!(msg.contains("unknown field `alow`") && msg.contains("`allow`"), "{msg}");
    let (line, _, msg, _) = load_err("roles:\n  r:\n    allow:\n      - { url: a }\n");
    assert_eq!(line, Some(4));
    assert!(msg.contains("`url`"), "{msg}");
    let (line, _, msg, _) = load_err("users:\n  a: {}\ngroups: {}\n");
    assert_eq!(line, Some(3));
    assert!(msg.contains("`groups`"), "{msg}");
}

#[test]
fn undefined_role_names_the_reference() {
    let (line, col, msg, shown) = load_err("roles:\n  staff: {}\nusers:\n  alice:\n    roles: [staff, ghost]\n");
    assert_eq!((line, col), (Some(5), Some(20)), "{shown}");
    assert!(msg.contains("`ghost`") && msg.contains("alice") && msg.contains("defined: staff"), "{msg}");
    let (line, col, _, _) = load_err("users:\n  bob:\n    roles:\n      - \"ghost\"  # typo\n");
    assert_eq!((line, col), (Some(4), Some(9)));
    let (line, _, msg, _) = load_err("roles:\n  staff: {}\n\ndefault_roles: [guest]\n");
    assert_eq!(line, Some(4));
    assert!(msg.contains("default_roles") && msg.contains("`guest`"), "{msg}");
}

#[test]
fn invalid_glob_points_at_the_value() {
    let (line, col, msg, _) = load_err("roles:\n  r:\n    allow:\n      - { server: demo, uri: \"[abc\" }\n");
    assert_eq!((line, col), (Some(4), Some(30)));
    assert!(msg.contains("invalid glob `[abc`") && msg.contains("unclosed"), "{msg}");
    let (line, _, msg, _) = load_err("roles:\n  r:\n    deny:\n      - mime: \"a/**/**/**/**/**\"\n");
    assert_eq!(line, Some(4));
    assert!(msg.contains("at most 4"), "{msg}");
}

#[test]
fn bad_include_and_zero_budget_point_at_the_value() {
    let (line, _, msg, _) = load_err("roles:\n  r:\n    include:\n      - \"crm:ok\"\n      - \"no-colon\"\n");
    assert_eq!(line, Some(5));
    assert!(msg.contains("invalid include `no-colon`") && msg.contains("SERVER:URI"), "{msg}");
    let (line, _, msg, _) = load_err("users:\n  u:\n    include: [\"{user}:x\"]\n");
    assert_eq!(line, Some(3));
    assert!(msg.contains("only in the URI"), "{msg}");
    let (line, _, msg, _) = load_err("users:\n  u:\n    include: [\"s:a\\u0007b\"]\n");
    assert_eq!(line, Some(3));
    assert!(msg.contains("U+0007"), "{msg}");
    let (line, col, msg, _) = load_err("roles:\n  r:\n    max_tokens: 0\n");
    assert_eq!((line, col), (Some(3), Some(17)));
    assert!(msg.contains("at least 1"), "{msg}");
    let (line, _, _, _) = load_err("users:\n  u:\n    max_tokens: -5\n");
    assert_eq!(line, Some(3));
    let (line, _, msg, _) = load_err("users:\n  u:\n    max_tokens: lots\n");
    assert_eq!(line, Some(3));
    assert!(msg.contains("positive number"), "{msg}");
}

/// Every problem of a load: (line, column, message) of the first and of `more`.
fn all_errs(e: Error) -> Vec<(Option<usize>, Option<usize>, String)> {
    match e {
        Error::Policy { line, column, message, more, .. } => std::iter::once((line, column, message))
            .chain(more.into_iter().map(|e| {
                let (l, c, m, _) = err_of(e);
                (l, c, m)
            }))
            .collect(),
        other => panic!("not a policy error: {other}"),
    }
}

#[test]
fn all_policy_errors_reported_at_once() {
    let src = "\
roles:
  a:
    allow:
      - { uri: \"[abc\" }
      - { uri: ok }
      - { server: x, uri: \"a/**/**/**/**/**\" }
  b:
    alow: []
  c:
    max_tokens: 0
users:
  u:
    roles: [a, ghost]
    include: [\"no-colon\"]
  v: { roles: [b, nope], deny: [{ url: x }] }
  u: {}
default_roles: [missing]
";
    let e = Policy::from_yaml(src, Path::new("bad.yaml")).expect_err("should fail");
    let shown = e.to_string();
    let all = all_errs(e);
    let at: Vec<(Option<usize>, Option<usize>)> = all.iter().map(|(l, c, _)| (*l, *c)).collect();
    assert_eq!(
        at,
        [
            (Some(4), Some(16)),
            (Some(6), Some(27)),
            (Some(8), Some(5)),
            (Some(10), Some(17)),
            (Some(14), Some(15)),
            (Some(15), Some(35)),
            (Some(16), Some(3)),
            (Some(17), Some(17)),
        ],
        "{shown}"
    );
    let messages: Vec<&str> = all.iter().map(|(_, _, m)| m.as_str()).collect();
    for (i, needle) in [
        "invalid glob `[abc`",
        "at most 4",
        "unknown field `alow`",
        "at least 1",
        "invalid include `no-colon`",
        "unknown field `url`",
        "user `u` is defined twice",
        "`missing`",
    ]
    .iter()
    .enumerate()
    {
        assert!(messages[i].contains(needle), "{i}: {needle} in {}", messages[i]);
    }
    // One problem per line, each with file:line:col.
    assert_eq!(shown.lines().count(), 8, "{shown}");
    assert!(shown.lines().all(|l| l.starts_with("bad.yaml:")), "{shown}");

    // Without the repeated user, the undefined roles are found too.
    let src = src.replace("  u: {}\n", "");
    let all = all_errs(Policy::from_yaml(&src, Path::new("bad.yaml")).expect_err("should fail"));
    let find = |needle: &str| all.iter().find(|(_, _, m)| m.contains(needle)).map(|(l, c, _)| (*l, *c));
    assert_eq!(find("`ghost`"), Some((Some(13), Some(16))), "{all:?}");
    assert_eq!(find("`nope`"), Some((Some(15), Some(19))), "{all:?}");
    assert_eq!(find("invalid include `no-colon`"), Some((Some(14), Some(15))), "{all:?}");
    assert_eq!(find("unknown field `url`"), Some((Some(15), Some(35))), "{all:?}");

    // Problems in several files: each names its own file, in merge order.
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", "roles:\n  r:\n    allow: [{ uri: \"[x\" }]\n");
    write(dir.path(), "b.yaml", "users:\n  u: { roles: [r], max_tokens: 0 }\n");
    let shown = Policy::load(dir.path()).err().unwrap().to_string();
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), 2, "{shown}");
    assert!(lines[0].contains("a.yaml:3:20:") && lines[1].contains("b.yaml:2:32:"), "{shown}");
}

#[test]
fn error_positions_in_flow_style_and_with_short_names() {
    // All on one line: each problem at its own column.
    let src = "{roles: {r: {allow: [{uri: \"[abc\"}]}, s: {max_tokens: 0}}, users: {u: {roles: [r, g]}}}";
    let all = all_errs(Policy::from_yaml(src, Path::new("bad.yaml")).expect_err("should fail"));
    let col = |needle: &str| Some(src.find(needle).unwrap() + 1);
    let at: Vec<(Option<usize>, Option<usize>)> = all.iter().map(|(l, c, _)| (*l, *c)).collect();
    assert_eq!(at, [(Some(1), col("\"[abc")), (Some(1), col("0}")), (Some(1), col("g]"))], "{all:?}");
    // A short role name that occurs earlier inside longer names.
    let (line, col, msg, _) = load_err("roles:\n  admin: {}\n  ab: {}\nusers:\n  a:\n    roles: [admin, ab, a]\n");
    assert_eq!((line, col), (Some(6), Some(24)));
    assert!(msg.contains("role `a`"), "{msg}");
    // A short user name defined twice: the repeat, not the first `a` in the text.
    let (line, col, msg, _) = load_err("users:\n  ab: {}\n  a: {}\n  b: {}\n  a: {}\n");
    assert_eq!((line, col), (Some(5), Some(3)));
    assert!(msg.contains("user `a` is defined twice"), "{msg}");
    // Repeated keys in flow style.
    let (line, col, msg, _) = load_err("{roles: {r: {allow: [], deny: [], allow: []}}}");
    assert_eq!((line, col), (Some(1), Some(35)));
    assert!(msg.contains("duplicate field `allow`"), "{msg}");
}

#[test]
fn duplicates_within_a_file() {
    let (line, _, msg, _) = load_err("users:\n  alice: {}\n  bob: {}\n  alice:\n    roles: []\n");
    assert_eq!(line, Some(4));
    assert!(msg.contains("user `alice` is defined twice"), "{msg}");
    let (line, _, msg, _) = load_err("roles:\n  r: {}\n  'r': {}\n");
    assert_eq!(line, Some(3));
    assert!(msg.contains("role `r` is defined twice"), "{msg}");
    let (line, _, msg, _) = load_err("users: {}\nroles: {}\n\nusers:\n  a: {}\n");
    assert_eq!(line, Some(4));
    assert!(msg.contains("duplicate field `users`"), "{msg}");
    let (line, _, _, _) = load_err("roles:\n  r:\n    allow: []\n    deny: []\n    allow: []\n");
    assert_eq!(line, Some(5));
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn folder_merges_in_name_order() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "b.yml", "users:\n  bob: { roles: [r] }\n");
    write(dir.path(), "a.yaml", "default_roles: [r]\nroles:\n  r:\n    allow: [{ uri: \"x://**\" }]\n");
    write(dir.path(), "c.yaml", "default_roles: [r]\n");
    write(dir.path(), "notes.txt", "not: [yaml");
    write(dir.path(), ".hidden.yaml", "not: [yaml");
    std::fs::create_dir(dir.path().join("sub.yaml")).unwrap();
    let p = Policy::load(dir.path()).unwrap();
    let names: Vec<_> = p.summary().files.iter().map(|f| f.file_name().unwrap().to_owned()).collect();
    assert_eq!(names, ["a.yaml", "b.yml", "c.yaml"]);
    assert!(sees(&p, "bob", &res("s:x://1")));
    assert!(sees(&p, "stranger", &res("s:x://1")));
    let single = Policy::load(&dir.path().join("a.yaml")).unwrap();
    assert_eq!(single.summary().files.len(), 1);
}

#[test]
fn user_or_role_in_two_files() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", "roles:\n  r: {}\nusers:\n  alice: { roles: [r] }\n");
    write(dir.path(), "b.yaml", "# second\nusers:\n  bob: {}\n  alice:\n    roles: [r]\n");
    let (line, _, msg, shown) = err_of(Policy::load(dir.path()).err().unwrap());
    assert_eq!(line, Some(4));
    assert!(shown.contains("b.yaml:4:"), "{shown}");
    assert!(msg.contains("user `alice` is already defined in") && msg.contains("a.yaml"), "{msg}");

    write(dir.path(), "b.yaml", "\n\nroles:\n    r:\n        allow: []\n");
    let (line, _, msg, shown) = err_of(Policy::load(dir.path()).err().unwrap());
    assert_eq!(line, Some(4));
    assert!(shown.contains("b.yaml:4:") && msg.contains("role `r` is already defined"), "{shown}");

    write(dir.path(), "a.yaml", "default_roles: [r]\nroles:\n  r: {}\n");
    write(dir.path(), "b.yaml", "roles:\n  s: {}\ndefault_roles: [s]\n");
    let (line, _, msg, shown) = err_of(Policy::load(dir.path()).err().unwrap());
    assert_eq!(line, Some(3));
    assert!(shown.contains("b.yaml:3:") && msg.contains("set it in one file only"), "{shown}");
}

#[test]
fn unreadable_or_empty_paths() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.yaml");
    let (line, _, msg, shown) = err_of(Policy::load(&missing).err().unwrap());
    assert_eq!(line, None);
    assert!(shown.starts_with(&missing.display().to_string()) && msg.contains("cannot read"), "{shown}");

    let (_, _, msg, shown) = err_of(Policy::load(dir.path()).err().unwrap());
    assert!(msg.contains("no policy files") && shown.contains(&dir.path().display().to_string()), "{shown}");

    let bad = write(dir.path(), "bin.yaml", "");
    std::fs::write(&bad, [0xff, 0xfe, 0x00]).unwrap();
    let (_, _, msg, shown) = err_of(Policy::load(dir.path()).err().unwrap());
    assert!(msg.contains("cannot read policy file") && shown.contains("bin.yaml"), "{shown}");
}

// ---- the demo policy ----------------------------------------------------

#[test]
fn the_demo_policy_shows_each_user_their_resources() {
    let p = Policy::load(Path::new(DEFAULT_POLICY)).unwrap_or_else(|e| panic!("{e}"));
    let guide = res_mime("demo:demo://docs/guide", "text/markdown");
    let changelog = res("demo:demo://docs/changelog");
    let faq = res_mime("demo:demo://public/faq", "text/plain");
    let logo = res_mime("demo:demo://images/logo.png", "image/png");
    let banner = res("demo:demo://ui/welcome-banner");
    let notes = res("demo:demo://notes/low-priority");
    let payroll = res_mime("demo:secret://payroll/2026", "text/plain");
    let profile = |u: &str| res(&format!("demo:demo://users/{u}/profile"));
    let all = [&guide, &changelog, &faq, &logo, &banner, &notes, &payroll];
    let visible = |user: &str| -> Vec<bool> {
        let u = p.for_user(user);
        all.iter().map(|r| u.decide(r).allowed).collect()
    };
    //                               guide  changelog faq   logo   banner notes  payroll
    assert_eq!(visible("alice"), [true, true, true, false, true, true, false]);
    assert_eq!(visible("bob"), [true, true, true, false, false, false, false]);
    assert_eq!(visible("carol"), [true, true, true, false, true, true, true]);
    assert_eq!(visible("dave"), [false, false, true, false, false, false, false]);

    let alice = p.for_user("alice");
    assert_eq!(alice.max_tokens(), Some(3000));
    assert_eq!(alice.includes(), [ResourceId::parse("demo:demo://users/alice/profile").unwrap()]);
    assert!(alice.decide(&profile("alice")).allowed);
    let denied = alice.decide(&payroll).detail();
    assert!(
        denied.starts_with("denied by ") && denied.ends_with("role staff deny[0] { uri: \"secret://**\" }"),
        "{denied}"
    );
    let text = std::fs::read_to_string(DEFAULT_POLICY).unwrap();
    let want = text.lines().position(|l| l.contains("- { uri: \"secret://**\" }")).unwrap() + 1;
    assert_eq!(alice.decide(&payroll).rule.unwrap().line, Some(want));

    let bob = p.for_user("bob");
    assert_eq!(bob.includes(), [ResourceId::parse("demo:demo://users/bob/profile").unwrap()]);
    assert!(bob.decide(&profile("bob")).allowed);
    assert!(!bob.decide(&profile("alice")).allowed);
    assert_eq!(bob.max_tokens(), Some(1500));

    let carol = p.for_user("carol");
    assert_eq!(carol.roles(), ["hr"]);
    assert!(carol.decide(&profile("carol")).allowed);
    assert_eq!(carol.includes(), [ResourceId::parse("demo:demo://users/carol/profile").unwrap()]);

    let dave = p.for_user("dave");
    assert!(!dave.is_known());
    assert_eq!(dave.roles(), ["guest"]);
    assert_eq!(dave.max_tokens(), Some(500));
    assert!(dave.includes().is_empty());
    assert!(!dave.decide(&profile("dave")).allowed);
}

// ---- property: decide == the definition --------------------------------

const SERVER_GLOBS: &[&str] = &["*", "**", "demo", "d*", "crm", "?rm", "[cd]*"];
const URI_GLOBS: &[&str] = &[
    "**",
    "demo://**",
    "demo://*",
    "demo://a/**",
    "demo://a/*",
    "*://a/**",
    "secret://**",
    "**/b",
    "demo://?/b",
    "demo://[ab]/**",
    "demo://[!a]/*",
    "x**",
    "demo**b",
    "demo://a/**/b",
    "**a**",
    "SECRET://**",
    "Demo://A/**",
];
const MIME_GLOBS: &[&str] = &["image/*", "text/*", "*", "**", "*/p*"];
const SERVERS: &[&str] = &["demo", "crm", "d"];
const URIS: &[&str] = &[
    "demo://a",
    "demo://a/b",
    "demo://b/b",
    "demo://a/x/b",
    "demo://c",
    "secret://a/b",
    "crm://a",
    "x/y",
    "demob",
    "demo://a//b",
    "demo://",
    "x",
    "SECRET://a/b",
    "Demo://A/b",
    "DEMO://a",
    "demo://A/b",
    "Secret://a/b",
];
const MIMES: &[&str] = &["text/plain", "image/png", "application/pdf"];

type TestRule = (Option<&'static str>, Option<&'static str>, Option<&'static str>);

/// Whether `g` matches the rule's `uri` glob against the resource's URI:
/// exactly for allow rules; for deny rules also with scheme and host
/// lower-cased, on either side or both.
fn uri_matches(g: impl Fn(&str, &str) -> bool, glob: &str, uri: &str, effect: Effect) -> bool {
    if effect == Effect::Allow {
        return g(glob, uri);
    }
    let (globs, uris) = ([glob, &canonical_glob(glob)], [uri, &canonical_uri(uri)]);
    globs.iter().any(|p| uris.iter().any(|u| g(p, u)))
}

fn rule_ref_matches((server, uri, mime): &TestRule, r: &Resource, effect: Effect) -> bool {
    let g = |p: &str, s: &str| glob_ref(&p.chars().collect::<Vec<_>>(), &s.chars().collect::<Vec<_>>());
    g(server.unwrap_or("*"), &r.id.server)
        && uri_matches(g, uri.unwrap_or("**"), &r.id.uri, effect)
        && mime.is_none_or(|m| r.mime_type.as_deref().is_some_and(|t| g(m, t)))
}

fn rule_yaml((server, uri, mime): &TestRule) -> String {
    let fields: Vec<String> = [("server", server), ("uri", uri), ("mime", mime)]
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}: {}", json_quote(v))))
        .collect();
    format!("{{ {} }}", fields.join(", "))
}

fn test_rule() -> impl Strategy<Value = TestRule> {
    (
        proptest::option::of(proptest::sample::select(SERVER_GLOBS)),
        proptest::option::of(proptest::sample::select(URI_GLOBS)),
        proptest::option::weighted(0.3, proptest::sample::select(MIME_GLOBS)),
    )
}

fn rules() -> impl Strategy<Value = Vec<TestRule>> {
    proptest::collection::vec(test_rule(), 0..3)
}

proptest! {
    #[test]
    fn decide_agrees_with_the_definition(
        roles in proptest::collection::vec((rules(), rules()), 1..4),
        member_of in proptest::collection::vec(0usize..3, 0..3),
        own in (rules(), rules()),
        resources in proptest::collection::vec(
            (proptest::sample::select(SERVERS), proptest::sample::select(URIS),
             proptest::option::of(proptest::sample::select(MIMES))),
            1..8,
        ),
    ) {
        let member_of: Vec<usize> = member_of.into_iter().filter(|&i| i < roles.len()).collect();
        let mut yaml = String::from("roles:\n");
        for (i, (allow, deny)) in roles.iter().enumerate() {
            yaml += &format!("  r{i}:\n    allow:\n");
            for r in allow { yaml += &format!("      - {}\n", rule_yaml(r)); }
            yaml += "    deny:\n";
            for r in deny { yaml += &format!("      - {}\n", rule_yaml(r)); }
        }
        let names: Vec<String> = member_of.iter().map(|i| format!("r{i}")).collect();
        yaml += &format!("users:\n  u:\n    roles: [{}]\n    allow:\n", names.join(", "));
        for r in &own.0 { yaml += &format!("      - {}\n", rule_yaml(r)); }
        yaml += "    deny:\n";
        for r in &own.1 { yaml += &format!("      - {}\n", rule_yaml(r)); }
        let policy = Policy::from_yaml(&yaml, Path::new("p.yaml")).map_err(|e| TestCaseError::fail(format!("{e}\n{yaml}")))?;
        let user = policy.for_user("u");

        // (owner, rules) in the order decide looks at them.
        let mut seen = Vec::new();
        let mut owners = vec![("user u".to_owned(), &own)];
        for &i in &member_of {
            if !seen.contains(&i) { seen.push(i); owners.push((format!("role r{i}"), &roles[i])); }
        }
        for (server, uri, mime) in resources {
            let mut r = res(&format!("{server}:{uri}"));
            r.mime_type = mime.map(str::to_owned);
            let first = |effect: Effect| owners.iter().find_map(|(owner, (allow, deny))| {
                let list = if effect == Effect::Allow { allow } else { deny };
                list.iter().position(|t| rule_ref_matches(t, &r, effect)).map(|i| (owner.clone(), effect, i))
            });
            let expected = first(Effect::Deny).or_else(|| first(Effect::Allow));
            let allowed = matches!(expected, Some((_, Effect::Allow, _)));
            let d = user.decide(&r);
            prop_assert_eq!(d.allowed, allowed, "{:?}\n{}", r.id, yaml);
            prop_assert_eq!(d.rule.map(|x| (x.owner, x.effect, x.index)), expected);
        }
    }
}

// ---- MIME parameters and case ------------------------------------------

#[test]
fn mime_rules_ignore_parameters_and_case_unless_they_name_parameters() {
    let p = policy(
        r#"
roles:
  r:
    allow:
      - { mime: "text/html" }
      - { mime: "Image/*" }
      - { mime: "application/json; Profile=x" }
    deny:
      - { mime: "text/html;profile=blocked" }
users:
  u: { roles: [r] }
"#,
    );
    let sees_mime = |m: &str| sees(&p, "u", &res_mime("s:a://1", m));
    assert!(sees_mime("text/html"));
    assert!(sees_mime("text/html;profile=mcp-app"), "parameters are ignored");
    assert!(sees_mime("TEXT/Html ; charset=utf-8"), "type/subtype are case-insensitive");
    assert!(sees_mime("image/PNG"));
    assert!(!sees_mime("text/htmlx"));
    assert!(!sees_mime("text/plain"));
    // A rule naming parameters matches the whole type, parameter names case-insensitively.
    assert!(sees_mime("application/json;profile=x"));
    assert!(sees_mime("Application/JSON; PROFILE=x"));
    assert!(!sees_mime("application/json"));
    assert!(!sees_mime("application/json; profile=y"));
    let d = p.for_user("u").decide(&res_mime("s:a://1", "text/html; profile=blocked"));
    assert!(!d.allowed);
    assert_eq!(d.detail(), r#"denied by p.yaml:9: role r deny[0] { mime: "text/html;profile=blocked" }"#);
    // As written in the report, not as normalised.
    let d = p.for_user("u").decide(&res_mime("s:a://1", "image/png"));
    assert_eq!(d.rule.unwrap().rule, r#"{ mime: "Image/*" }"#);
}

#[test]
fn the_deciding_rule_is_shown_as_written_with_json_quoting() {
    // Backslashes and quotes are escaped as JSON escapes them; other text, Unicode included, is as written.
    let p = policy(
        "roles:\n  r:\n    deny:\n      - { server: s, uri: 'a://x\\[1\\]\"q' }\n    allow:\n      - { uri: \"a://é/**\" }\n      - {}\n\
         default_roles: [r]\n",
    );
    let d = p.for_user("u").decide(&res("s:a://x[1]\"q"));
    assert_eq!(d.rule.unwrap().rule, r#"{ server: "s", uri: "a://x\\[1\\]\"q" }"#);
    let d = p.for_user("u").decide(&res("s:a://é/doc"));
    assert_eq!(d.rule.unwrap().rule, r#"{ uri: "a://é/**" }"#);
    let d = p.for_user("u").decide(&res("t:b://other"));
    assert_eq!(d.rule.unwrap().rule, "{}");
}

// ---- property: the indexes == trying every rule in order ---------------

const WIDE_SERVER_GLOBS: &[&str] = &["*", "**", "demo", "crm", "d", "x", "d*", "?rm", "[cd]*", "{demo,x}", "*o"];
const WIDE_URI_GLOBS: &[&str] = &[
    "**",
    "demo://**",
    "demo://a/*",
    "demo://a/b",
    "crm://a",
    "*://a/**",
    "**/b",
    "demo://?/b",
    "demo://[ab]/**",
    "demo://{a,c}/**",
    "**a**",
    "demo://a/**/b",
    "x*/y",
    "DEMO://A/**",
    "demo://A/**",
    "SECRET://**",
    "demo://a/\\*",
    "demo**b",
];
const WIDE_MIME_GLOBS: &[&str] = &["text/*", "Image/*", "*", "text/plain", "text/plain;charset=utf-8", "*/p*"];
const WIDE_SERVERS: &[&str] = &["demo", "crm", "d", "x", "dx", "o"];
const WIDE_URIS: &[&str] = &[
    "demo://a",
    "demo://a/b",
    "demo://b/b",
    "demo://c/x",
    "demo://a/x/b",
    "crm://a",
    "crm://a/b",
    "x/y",
    "xz/y",
    "demob",
    "Demo://A/b",
    "demo://A/b",
    "DEMO://a/b",
    "demo://a/*",
    "demo://a//b",
];
const WIDE_MIMES: &[&str] = &["text/plain", "Text/Plain; Charset=utf-8", "image/png", "application/pdf"];

fn wide_rule() -> impl Strategy<Value = TestRule> {
    (
        proptest::option::of(proptest::sample::select(WIDE_SERVER_GLOBS)),
        proptest::option::of(proptest::sample::select(WIDE_URI_GLOBS)),
        proptest::option::weighted(0.3, proptest::sample::select(WIDE_MIME_GLOBS)),
    )
}

/// A rule tried alone, by the definitions: the glob reference, URIs exactly
/// (and folded too for deny rules), MIME type/subtype (or the whole type when the rule names parameters).
fn wide_rule_matches((server, uri, mime): &TestRule, r: &Resource, effect: Effect) -> bool {
    let g = |p: &str, s: &str| glob_ref(&p.chars().collect::<Vec<_>>(), &s.chars().collect::<Vec<_>>());
    let unescape = |p: &str| p.replace("\\*", "\u{1}");
    let lit = |s: &str| s.replace('*', "\u{1}");
    let brace = |p: &str, s: &str| match p.split_once('{') {
        // `{a,b}`: one alternative at a time (one brace per test glob).
        Some((head, rest)) => {
            let (alts, tail) = rest.split_once('}').unwrap();
            alts.split(',').any(|a| g(&unescape(&format!("{head}{a}{tail}")), &lit(s)))
        }
        None => g(&unescape(p), &lit(s)),
    };
    brace(server.unwrap_or("*"), &r.id.server)
        && uri_matches(brace, uri.unwrap_or("**"), &r.id.uri, effect)
        && mime.is_none_or(|m| {
            r.mime_type.as_deref().is_some_and(|t| {
                if m.contains(';') {
                    brace(&mime_with_params(m), &mime_with_params(t))
                } else {
                    brace(&m.to_ascii_lowercase(), &mime_essence(t))
                }
            })
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn indexed_decisions_agree_with_trying_every_rule_in_order(
        roles in proptest::collection::vec(
            (proptest::collection::vec(wide_rule(), 0..10), proptest::collection::vec(wide_rule(), 0..4)),
            1..6,
        ),
        member_of in proptest::collection::vec(0usize..6, 0..5),
        own in (proptest::collection::vec(wide_rule(), 0..3), proptest::collection::vec(wide_rule(), 0..2)),
        resources in proptest::collection::vec(
            (proptest::sample::select(WIDE_SERVERS), proptest::sample::select(WIDE_URIS),
             proptest::option::of(proptest::sample::select(WIDE_MIMES))),
            1..12,
        ),
    ) {
        let member_of: Vec<usize> = member_of.into_iter().filter(|&i| i < roles.len()).collect();
        // The YAML, remembering each rule's line.
        let mut lines = vec!["roles:".to_owned()];
        let mut line_of = std::collections::HashMap::new();
        let mut section = |lines: &mut Vec<String>, owner: &str, indent: &str, allow: &[TestRule], deny: &[TestRule]| {
            for (effect, list) in [(Effect::Allow, allow), (Effect::Deny, deny)] {
                lines.push(format!("{indent}{effect}:"));
                for (i, r) in list.iter().enumerate() {
                    lines.push(format!("{indent}  - {}", rule_yaml(r)));
                    line_of.insert((owner.to_owned(), effect == Effect::Allow, i), lines.len());
                }
            }
        };
        for (i, (allow, deny)) in roles.iter().enumerate() {
            lines.push(format!("  r{i}:"));
            section(&mut lines, &format!("role r{i}"), "    ", allow, deny);
        }
        let names: Vec<String> = member_of.iter().map(|i| format!("r{i}")).collect();
        lines.push("users:".into());
        lines.push("  u:".into());
        lines.push(format!("    roles: [{}]", names.join(", ")));
        section(&mut lines, "user u", "    ", &own.0, &own.1);
        let yaml = lines.join("\n") + "\n";
        let policy = Policy::from_yaml(&yaml, Path::new("p.yaml")).map_err(|e| TestCaseError::fail(format!("{e}\n{yaml}")))?;
        let user = policy.for_user("u");

        let mut seen = Vec::new();
        let mut owners = vec![("user u".to_owned(), &own)];
        for &i in &member_of {
            if !seen.contains(&i) { seen.push(i); owners.push((format!("role r{i}"), &roles[i])); }
        }
        for (server, uri, mime) in resources {
            let mut r = res(&format!("{server}:{uri}"));
            r.mime_type = mime.map(str::to_owned);
            let first = |effect: Effect| owners.iter().find_map(|(owner, (allow, deny))| {
                let list = if effect == Effect::Allow { allow } else { deny };
                list.iter().position(|t| wide_rule_matches(t, &r, effect)).map(|i| (owner.clone(), effect, i, rule_yaml(&list[i]).replace("{  }", "{}")))
            });
            let expected = first(Effect::Deny).or_else(|| first(Effect::Allow));
            let d = user.decide(&r);
            prop_assert_eq!(d.allowed, matches!(expected, Some((_, Effect::Allow, _, _))), "{:?}\n{}", r, yaml);
            let got = d.rule.map(|x| (x.owner.clone(), x.effect, x.index, x.rule.clone(), x.line, x.file));
            let want = expected.map(|(o, e, i, text)| {
                let line = line_of.get(&(o.clone(), e == Effect::Allow, i)).copied();
                (o, e, i, text, line, PathBuf::from("p.yaml"))
            });
            prop_assert_eq!(got, want, "{:?}\n{}", r, yaml);
        }
    }
}

/// Each rule set's globs are compiled together into one regex: a set too
/// large to compile is a load error, located at its `allow:` key and named,
/// and a valid role beside it does not hide it.
#[test]
fn a_rule_set_too_large_to_compile_is_a_located_load_error() {
    let glob = format!("kb://{}", "[!a]*".repeat(40));
    let rules: String = (0..3000).map(|i| format!("      - {{ uri: \"{glob}{i}\" }}\n")).collect();
    let src = format!("roles:\n  fine:\n    allow: [ {{ uri: \"kb://**\" }} ]\n  huge:\n    allow:\n{rules}");
    let Err(e) = Policy::from_yaml(&src, Path::new("bad.yaml")) else {
        panic!("a 3000-rule set of 40 classes each loaded")
    };
    let (line, column, message, _) = err_of(e);
    assert_eq!((line, column), (Some(5), Some(5)), "{message}");
    assert!(message.starts_with("role huge allow: these rules are too many or too complex"), "{message}");
}

#[test]
fn user_names_that_could_forge_logs_are_located_load_errors() {
    let (line, _, _, msg) = load_err("users:\n  ok: {}\n  \"x\\nFAKE\": {}\n");
    assert_eq!(line, Some(3), "{msg}");
    assert!(msg.contains("control characters"), "{msg}");
    let long = "u".repeat(crate::id::MAX_USER_NAME_BYTES + 1);
    let (_, _, _, msg) = load_err(&format!("users:\n  {long}: {{}}\n"));
    assert!(msg.contains("at most 256 bytes"), "{msg}");
}

// ---- case: allow exactly, deny also folded (issue 28) -------------------

/// Allow rules match a URI exactly, scheme and host included; deny rules
/// also with scheme and host lower-cased, on the glob's side and the URI's,
/// so ambiguity resolves toward deny.
#[test]
fn allow_matches_exactly_and_deny_also_case_folded() {
    let p = policy(
        r#"
roles:
  r:
    allow: [ { uri: "acc://doc/**" }, { uri: "tickets://ab" }, { uri: "**" } ]
    deny: [ { uri: "secret://**" }, { uri: "TICKETS://Q" } ]
users:
  u: { roles: [r] }
  v: { allow: [ { uri: "acc://doc/**" }, { uri: "tickets://ab" } ] }
"#,
    );
    let v = p.for_user("v");
    assert!(v.decide(&res("a:acc://doc/lower")).allowed);
    assert!(v.decide(&res("a:tickets://ab")).allowed);
    for id in ["a:acc://DOC/upper", "a:ACC://doc/x", "a:tickets://AB", "a:tickets://Ab", "a:Tickets://ab"] {
        assert!(!v.decide(&res(id)).allowed, "{id} is not what the allow rule names");
    }
    let u = p.for_user("u");
    let denied_by = |id: &str| {
        let d = u.decide(&res(id));
        assert!(!d.allowed, "{id}");
        d.rule.map(|r| r.index)
    };
    for id in ["a:secret://payroll", "a:SECRET://payroll", "a:Secret://payroll", "a:SECRET://Payroll/x"] {
        assert_eq!(denied_by(id), Some(0), "{id}");
    }
    // A deny glob spelled with an upper-case scheme and host stops every spelling of them.
    for id in ["a:TICKETS://Q", "a:tickets://Q", "a:tickets://q", "a:Tickets://q"] {
        assert_eq!(denied_by(id), Some(1), "{id}");
    }
    // Paths stay case-sensitive for deny too.
    assert!(u.decide(&res("a:tickets://Q/x")).allowed);
    assert!(u.decide(&res("a:secretx://payroll")).allowed);
    // The folded second entry is not counted as a rule of its own.
    assert_eq!(p.summary().roles[0].deny, 2);
}
