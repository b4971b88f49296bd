//! The policy at organisation scale: load + compile, and cold selection of
//! 1000 resources (a fresh user's view, every resource decided), for
//! generated policies of about 100, 1k, 10k and 50k rules (roles of 20 allow
//! and 2 deny rules, 2000 users of up to 50 roles; `examples/bench/policy_gen.rs`).
//!
//! `cargo bench --bench policy` (`POLICY_BENCH_SIZES=100,10000` for some sizes)

#![allow(missing_docs, reason = "criterion_group! generates the entry points")]

#[path = "../examples/bench/policy_gen.rs"]
mod policy_gen;

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, black_box, criterion_group, criterion_main};
use mcp_context::{Policy, Resource, ResourceId};

fn sizes() -> Vec<usize> {
    std::env::var("POLICY_BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![100, 1_000, 10_000, 50_000])
}

fn resources(n: usize, roles: usize) -> Vec<Resource> {
    policy_gen::resources(n, roles, 7)
        .into_iter()
        .map(|(server, uri, mime)| {
            mime.into_iter().fold(
                Resource::new(ResourceId::new(server, uri).expect("valid id")).with_name(""),
                Resource::with_mime_type,
            )
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    for rules in sizes() {
        let shape = policy_gen::Shape::for_rules(rules);
        let path = dir.path().join(format!("org-{rules}.yaml"));
        std::fs::write(&path, policy_gen::generate(&shape)).expect("write policy");

        let mut load = c.benchmark_group("policy_load");
        load.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(5));
        load.bench_with_input(BenchmarkId::from_parameter(rules), &path, |b, path| {
            b.iter(|| Policy::load(black_box(path)).expect("policy"))
        });
        load.finish();

        let policy = Policy::load(&path).expect("policy");
        let all = resources(1000, shape.roles);
        let mut select = c.benchmark_group("policy_select_cold_1000");
        select.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
        let mut u = 0usize;
        select.bench_with_input(BenchmarkId::from_parameter(rules), &all, |b, all| {
            b.iter(|| {
                // A different user each time: nothing of the last one's helps.
                u = (u + 1) % shape.users.max(1);
                let up = policy.for_user(&format!("u{u}"));
                all.iter().filter(|r| up.decide(r).allowed).count()
            })
        });
        select.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
