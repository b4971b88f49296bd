//! What verifying a caller's token adds to a request: `JwtVerifier::verify`
//! on a real provider's access tokens (RS256, 2048-bit key, from the
//! `oidc-provider` of tests/oidc), keys cached. Two figures: a token seen for
//! the first time (signature and claims checked; `--fresh` distinct tokens),
//! and the warm request, the same token again (remembered until its `exp`),
//! p50/p90/p99 over `--n` calls.
//!
//! ```text
//! npm ci --prefix tests/oidc
//! cargo build --release --example bench_jwt
//! target/release/examples/bench_jwt [--n 20000]
//! ```
//! The provider runs as a child process on a loopback port for the token and
//! the JWKS; the timed loop makes no network call.

use std::process::Stdio;
use std::time::{Duration, Instant};

use mcp_context::identity::{JwtSettings, JwtVerifier};
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args
        .iter()
        .position(|a| a == "--n")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oidc");
    let mut idp = tokio::process::Command::new("node")
        .arg("provider.mjs")
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let line =
        BufReader::new(idp.stdout.take().ok_or("no stdout")?).lines().next_line().await?.ok_or("provider exited")?;
    let issuer = serde_json::from_str::<serde_json::Value>(&line)?["issuer"].as_str().ok_or("no issuer")?.to_owned();
    let fresh: usize = args
        .iter()
        .position(|a| a == "--fresh")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let http = reqwest::Client::new();
    let mut tokens = Vec::with_capacity(fresh + 1);
    for _ in 0..=fresh {
        let token: serde_json::Value = http
            .post(format!("{issuer}/token"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body("grant_type=client_credentials&client_id=alice&client_secret=alice-secret&scope=api&resource=urn:mcp-context")
            .send()
            .await?
            .json()
            .await?;
        tokens.push(token["access_token"].as_str().ok_or("no token")?.to_owned());
    }
    let token = tokens.pop().ok_or("no token")?;
    let mut s = JwtSettings::new(issuer);
    s.audience = vec!["urn:mcp-context".into()];
    s.roles_claim = Some("groups".into());
    s.role_map.insert("engineering".into(), vec!["staff".into()]);
    let v = JwtVerifier::new(s).await?;
    let report = |what: &str, mut times: Vec<Duration>| {
        times.sort();
        let q = |p: f64| times[((times.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e3;
        println!(
            "verify(), {what}, {} calls: p50 {:.4} ms, p90 {:.4} ms, p99 {:.4} ms",
            times.len(),
            q(0.5),
            q(0.9),
            q(0.99)
        );
    };
    let mut first = Vec::with_capacity(tokens.len());
    for t in &tokens {
        let start = Instant::now();
        std::hint::black_box(v.verify(t).await?);
        first.push(start.elapsed());
    }
    report("a token seen for the first time (RS256 signature + claims)", first);
    for _ in 0..200 {
        v.verify(&token).await?;
    }
    let mut times: Vec<Duration> = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let who = v.verify(&token).await?;
        times.push(t.elapsed());
        std::hint::black_box(who);
    }
    report("the same token again (a warm request)", times);
    idp.kill().await?;
    Ok(())
}
