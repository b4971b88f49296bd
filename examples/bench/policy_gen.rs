//! Organisation-sized policies for the policy benchmarks (`examples/gen_policy.rs`,
//! `examples/policy_scale.rs`, `benches/policy.rs`): roles of team-scoped rules
//! over a handful of servers, users with many roles each, and resources that
//! some of those rules match.
//!
//! The rules are what an organisation writes: mostly a literal server with a
//! URI prefix (`docs://teams/t7/**`), some one-segment globs, literal URIs,
//! MIME-restricted rules, a few glob servers (`git-*`, `{docs,wiki}`, `*`)
//! and a few URIs that need a full glob (`**/t7/**/notes*`, `[a-m]*`). Each
//! role has `rules_per_role` rules, one in eleven of them (at least one) a
//! deny. Deterministic for a seed.

#![allow(unreachable_pub, reason = "shared by several examples, benches and tests through #[path]")]
#![allow(dead_code)]

use std::fmt::Write;

/// The servers rules name (the bench server's is `bench`).
pub const SERVERS: &[&str] = &["bench", "docs", "wiki", "crm", "tickets", "git-core", "git-web", "drive", "hr", "chat"];

/// What to generate.
#[derive(Clone, Debug)]
pub struct Shape {
    pub roles: usize,
    pub rules_per_role: usize,
    pub users: usize,
    pub roles_per_user: usize,
    pub seed: u64,
}

impl Shape {
    /// Roles of 22 rules (20 allow, 2 deny), 2000 users of 50 roles (fewer
    /// when there are fewer roles), for about `rules` rules in all.
    pub fn for_rules(rules: usize) -> Shape {
        let roles = rules.div_ceil(22).max(1);
        Shape { roles, rules_per_role: 22, users: 2000, roles_per_user: 50.min(roles), seed: 1 }
    }

    /// Rules in all (roles' and users' own).
    pub fn rules(&self) -> usize {
        self.roles * self.rules_per_role + self.users.div_ceil(10)
    }
}

/// SplitMix64: small, fast, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn role_name(r: usize) -> String {
    format!("team-{r}")
}

/// One allow rule of role `r`.
fn allow_rule(rng: &mut Rng, r: usize) -> String {
    let n = rng.below(1000);
    let p = rng.below(100);
    match rng.below(20) {
        0..=4 => format!(r#"{{ server: docs, uri: "docs://teams/t{r}/{}/**" }}"#, ["guides", "specs", "notes"][n % 3]),
        5 | 6 => format!(r#"{{ server: wiki, uri: "wiki://spaces/t{r}/*" }}"#),
        7 => format!(r#"{{ server: crm, uri: "crm://accounts/a{n}" }}"#),
        8 => format!(r#"{{ server: tickets, uri: "tickets://projects/p{p}/**", mime: "text/*" }}"#),
        9 => format!(r#"{{ server: "git-*", uri: "git://repos/t{r}-*/**" }}"#),
        10 => format!(r#"{{ uri: "drive://shared/t{r}/**" }}"#),
        11 | 12 => format!(r#"{{ server: bench, uri: "bench://doc/{}*" }}"#, n % 100),
        13 => format!(r#"{{ server: "{{docs,wiki}}", uri: "**/t{r}/readme.md" }}"#),
        14 => format!(r#"{{ server: chat, uri: "chat://channels/c{p}/**" }}"#),
        15 => format!(r#"{{ server: docs, uri: "docs://projects/p{p}/**/*.md" }}"#),
        16 => format!(r#"{{ server: drive, uri: "drive://files/t{r}/[a-m]*" }}"#),
        17 => format!(r#"{{ server: tickets, uri: "tickets://projects/p{p}/t?{n}" }}"#),
        18 => r#"{ server: docs, uri: "docs://public/**", mime: "text/markdown" }"#.to_owned(),
        _ => format!(r#"{{ server: crm, uri: "crm://accounts/a{n}/contacts/*" }}"#),
    }
}

/// One deny rule of role `r`.
fn deny_rule(rng: &mut Rng, r: usize) -> String {
    let n = rng.below(1000);
    match rng.below(6) {
        0 => r#"{ uri: "secret://**" }"#.to_owned(),
        1 => r#"{ server: hr, uri: "hr://salaries/**" }"#.to_owned(),
        2 => format!(r#"{{ server: bench, uri: "bench://doc/{n}" }}"#),
        3 => format!(r#"{{ server: docs, uri: "docs://teams/t{r}/**", mime: "image/*" }}"#),
        4 => format!(r#"{{ uri: "**/t{r}/**/private*" }}"#),
        _ => format!(r#"{{ server: crm, uri: "crm://accounts/a{n}/**" }}"#),
    }
}

/// The policy as YAML (block style, one flow mapping per rule).
pub fn generate(shape: &Shape) -> String {
    let mut rng = Rng::new(shape.seed);
    let mut out =
        String::with_capacity(shape.roles * shape.rules_per_role * 60 + shape.users * shape.roles_per_user * 10);
    let _ = writeln!(out, "# Generated: {shape:?}");
    out.push_str("default_roles: [team-0]\n\nroles:\n");
    let deny = (shape.rules_per_role / 11).max(1).min(shape.rules_per_role);
    for r in 0..shape.roles {
        let _ = writeln!(out, "  {}:", role_name(r));
        if shape.rules_per_role > deny {
            out.push_str("    allow:\n");
            for _ in 0..shape.rules_per_role - deny {
                let _ = writeln!(out, "      - {}", allow_rule(&mut rng, r));
            }
        }
        out.push_str("    deny:\n");
        for _ in 0..deny {
            let _ = writeln!(out, "      - {}", deny_rule(&mut rng, r));
        }
        if r % 4 == 0 {
            let _ = writeln!(out, "    max_tokens: {}", 2000 + 500 * (r % 8));
        }
    }
    out.push_str("\nusers:\n");
    let per_user = shape.roles_per_user.min(shape.roles);
    for u in 0..shape.users {
        // Distinct roles, in a random order.
        let mut roles: Vec<usize> = Vec::with_capacity(per_user);
        while roles.len() < per_user {
            let r = rng.below(shape.roles);
            if !roles.contains(&r) {
                roles.push(r);
            }
        }
        let names: Vec<String> = roles.into_iter().map(role_name).collect();
        let _ = writeln!(out, "  u{u}:\n    roles: [{}]", names.join(", "));
        if u % 10 == 0 {
            let _ = writeln!(out, "    allow:\n      - {{ server: crm, uri: \"crm://owners/u{u}/**\" }}");
        }
    }
    out
}

/// `n` resources over [`SERVERS`] as `(server, uri, mime)`, shaped so that
/// the generated rules match some of them (team URIs for `roles` teams).
pub fn resources(n: usize, roles: usize, seed: u64) -> Vec<(String, String, Option<String>)> {
    let mut rng = Rng::new(seed.wrapping_add(99));
    (0..n)
        .map(|i| {
            let t = rng.below(roles);
            let k = rng.below(1000);
            let p = rng.below(100);
            let server = SERVERS[i % SERVERS.len()];
            let (uri, mime) = match server {
                "bench" => (format!("bench://doc/{i}"), if i % 10 == 9 { "image/png" } else { "text/plain" }),
                "docs" => match k % 4 {
                    0 => (format!("docs://teams/t{t}/guides/page-{i}.md"), "text/markdown"),
                    1 => (format!("docs://teams/t{t}/specs/img-{i}.png"), "image/png"),
                    2 => (format!("docs://projects/p{p}/design/{i}.md"), "text/markdown"),
                    _ => (format!("docs://public/faq-{i}"), "text/markdown"),
                },
                "wiki" => (format!("wiki://spaces/t{t}/page-{i}"), "text/html; charset=utf-8"),
                "crm" => (format!("crm://accounts/a{k}/contacts/c{i}"), "application/json"),
                "tickets" => (format!("tickets://projects/p{p}/t{}{k}", i % 10), "text/plain"),
                "git-core" | "git-web" => (format!("git://repos/t{t}-svc/src/main-{i}.rs"), "text/x-rust"),
                "drive" => (format!("drive://files/t{t}/{}-report-{i}", ["alpha", "zulu"][i % 2]), "application/pdf"),
                "hr" => (format!("hr://salaries/{k}"), "text/csv"),
                _ => (format!("chat://channels/c{p}/t{t}/private-{i}"), "text/plain"),
            };
            (server.to_owned(), uri, Some(mime.to_owned()))
        })
        .collect()
}
