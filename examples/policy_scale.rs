//! Loads a policy and decides on 1000 resources, printing load time, peak
//! RSS and decision times: the policy figures of `BENCHMARKS.md`.
//!
//! ```text
//! cargo build --release --example gen_policy --example policy_scale
//! target/release/examples/gen_policy --rules 10000 > /tmp/org-10k.yaml
//! target/release/examples/policy_scale /tmp/org-10k.yaml [--resources 1000] [--users 20]
//! ```
//! Times are wall clock and CPU time (which a busy machine does not inflate;
//! all threads for loading, which compiles on every core, this thread's for
//! deciding). Peak RSS is `VmHWM` from `/proc/self/status`, before loading and after
//! loading and deciding; compare with a 1-rule policy
//! (`gen_policy --roles 1 --rules-per-role 1 --users 1`). "cold" is the
//! first user's 1000 decisions in this process; "per user" the median over
//! the next `--users` users (each a fresh [`UserPolicy`]; nothing is memoized
//! below `McpContext`).

#![allow(unsafe_code, reason = "CPU time of this process: clock_gettime(2) / getrusage(2), system calls std lacks")]

#[path = "bench/policy_gen.rs"]
mod policy_gen;

use std::path::PathBuf;
use std::time::Instant;

use mcp_context::{Policy, Resource, ResourceId};

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix(field)?.trim().strip_suffix("kB")?.trim().parse().ok()).unwrap_or(0)
}

/// CPU time of this thread: the figure that a busy machine does not inflate.
fn cpu() -> f64 {
    clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time of the process, all threads (loading compiles on every core).
fn process_cpu() -> f64 {
    clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

fn clock(id: libc::clockid_t) -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid, writable timespec.
    unsafe { libc::clock_gettime(id, &mut t) };
    t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 / 1e6
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = PathBuf::from(args.first().expect("usage: policy_scale POLICY.yaml [--resources N] [--users N]"));
    let get = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (n, users) = (get("--resources", 1000), get("--users", 20));
    let hwm_before = status_kib("VmHWM:");

    let (t, c) = (Instant::now(), process_cpu());
    let policy = Policy::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let (load, load_cpu) = (t.elapsed(), process_cpu() - c);
    let summary = policy.summary();
    let rules: usize = summary.roles.iter().map(|r| r.allow + r.deny).sum();
    let hwm_loaded = status_kib("VmHWM:");

    let resources: Vec<Resource> = policy_gen::resources(n, summary.roles.len(), 7)
        .into_iter()
        .map(|(server, uri, mime)| {
            mime.into_iter().fold(
                Resource::new(ResourceId::new(server, uri).expect("valid id")).with_name(""),
                Resource::with_mime_type,
            )
        })
        .collect();
    let decide_all = |user: &str| {
        let c = cpu();
        let up = policy.for_user(user);
        let allowed = resources.iter().filter(|r| up.decide(r).allowed).count();
        (cpu() - c, allowed)
    };
    let (cold, allowed) = decide_all("u1");
    let mut per_user: Vec<f64> = (2..2 + users).map(|u| decide_all(&format!("u{u}")).0).collect();
    per_user.sort_by(f64::total_cmp);
    let median = per_user.get(per_user.len() / 2).copied().unwrap_or(0.0);
    println!(
        "{} | role rules {rules} | load+compile {:.1} ms (CPU, all threads, {load_cpu:.1} ms) | VmHWM before {:.1} MiB, after load {:.1} MiB, after deciding {:.1} MiB | \
         cold decide {n} for u1 {cold:.2} ms CPU ({allowed} allowed) | median of {users} more users {median:.2} ms CPU",
        path.display(),
        load.as_secs_f64() * 1e3,
        hwm_before as f64 / 1024.0,
        hwm_loaded as f64 / 1024.0,
        status_kib("VmHWM:") as f64 / 1024.0,
    );
}
