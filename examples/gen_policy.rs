//! Writes an organisation-sized policy for the policy benchmarks.
//!
//! ```text
//! cargo run --release --example gen_policy -- --roles 455 --rules-per-role 22 \
//!     --users 2000 --roles-per-user 50 --seed 1 > /tmp/org-10k.yaml
//! cargo run --release --example gen_policy -- --rules 10000 > /tmp/org-10k.yaml
//! ```
//! `--rules N` picks roles of 22 rules (20 allow, 2 deny) for about N rules,
//! 2000 users of 50 roles each; the other flags override it. See
//! `examples/bench/policy_gen.rs` for what the rules look like.

#[path = "bench/policy_gen.rs"]
mod policy_gen;

use std::io::Write;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let get = |name: &str| -> Option<usize> {
        let i = args.iter().position(|a| a == name)?;
        Some(args.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name} needs a number")))
    };
    let mut shape = policy_gen::Shape::for_rules(get("--rules").unwrap_or(10_000));
    if let Some(v) = get("--roles") {
        shape.roles = v.max(1);
        shape.roles_per_user = shape.roles_per_user.min(shape.roles);
    }
    if let Some(v) = get("--rules-per-role") {
        shape.rules_per_role = v.max(1);
    }
    if let Some(v) = get("--users") {
        shape.users = v;
    }
    if let Some(v) = get("--roles-per-user") {
        shape.roles_per_user = v.min(shape.roles);
    }
    if let Some(v) = get("--seed") {
        shape.seed = v as u64;
    }
    let yaml = policy_gen::generate(&shape);
    eprintln!(
        "{} roles x {} rules, {} users x {} roles: {} rules, {} bytes",
        shape.roles,
        shape.rules_per_role,
        shape.users,
        shape.roles_per_user,
        shape.rules(),
        yaml.len()
    );
    std::io::stdout().lock().write_all(yaml.as_bytes()).expect("write");
}
