//! The pre-flight of a deployment (`mcp-context check`): everything a config
//! names that must be reachable, tried once, each on its own, and timed:
//! every server started or dialled and listed, the shared cache's Redis,
//! each PostgreSQL audit sink, the identity provider's keys (`serve.jwt`)
//! and the upstreams `serve` forwards to. A failing item never stops or
//! hides another: each runs concurrently with the others, bounded by its own
//! timeout, and ends as one [`Probe`]. Loading the config and the policy
//! (with all their problems) is the caller's part, before this.
//!
//! Layer: the adapters' (beside `tools` and `serve`): imports the config,
//! the hub, the cache's and audit's probes, the identity verifier and the
//! error helpers; nothing imports it but the CLI.

use std::time::{Duration, Instant};

use futures::future::join_all;
use secrecy::ExposeSecret;
use serde::Serialize;

use crate::cause::redact_url;
use crate::config::Config;
use crate::hub::Hub;

/// How long an upstream may take to answer the probe's `GET …/models`.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(10);

/// One item of the pre-flight.
#[derive(Debug, Clone, Serialize)]
pub struct Probe {
    /// What it is: `server`, `redis`, `postgres`, `jwks` or `upstream`.
    pub kind: &'static str,
    /// Which: the server's name, or the URL (without its credentials).
    pub name: String,
    /// It works.
    pub ok: bool,
    /// How long it took, success or failure, in milliseconds.
    pub ms: f64,
    /// What was found (`7 resources, 1 template, protocol 2025-11-25`), or why it failed.
    pub detail: String,
}

impl Probe {
    fn timed(kind: &'static str, name: String, start: Instant, result: Result<String, String>) -> Self {
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        let (ok, detail) = match result {
            Ok(d) => (true, d),
            Err(d) => (false, d),
        };
        Probe { kind, name, ok, ms, detail }
    }
}

/// Tries every item of `config`, concurrently: the servers in config
/// order, then Redis, PostgreSQL, the JWKS and the upstreams, each present
/// only when configured.
pub async fn probe(config: &Config) -> Vec<Probe> {
    let servers = join_all(config.servers.iter().map(|s| server(config, &s.name)));
    let (mut out, others) = futures::join!(servers, join_all(others(config)));
    out.extend(others);
    out
}

/// One server, on a hub of its own: its time is its own, start-up (or dial) and listing.
async fn server(config: &Config, name: &str) -> Probe {
    let mut one = config.clone();
    one.servers.retain(|s| s.name == name);
    let start = Instant::now();
    let hub = Hub::connect(&one).await;
    let status = hub.status().into_iter().next();
    let result = match status {
        None => Err("not started".to_owned()),
        Some(s) if s.failed() => Err(s.problem.unwrap_or_else(|| "not connected".into())),
        Some(s) => {
            let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
            let mut d = format!("{}, {}", plural(s.resources, "resource"), plural(s.templates, "template"));
            if let Some(p) = &s.protocol {
                d.push_str(&format!(", protocol {p}"));
            }
            if let Some(p) = &s.problem {
                d.push_str(&format!(" (listing incomplete: {p})"));
            }
            Ok(d)
        }
    };
    let probe = Probe::timed("server", name.to_owned(), start, result);
    hub.close().await;
    probe
}

type Pending<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Probe> + Send + 'a>>;

/// Redis, PostgreSQL, the JWKS and the upstreams, as configured.
fn others(config: &Config) -> Vec<Pending<'_>> {
    let mut out: Vec<Pending<'_>> = Vec::new();
    #[cfg(feature = "redis")]
    if config.cache.backend == crate::config::CacheBackend::Redis
        || config.credentials.store == crate::config::CredentialStoreKind::Redis
    {
        out.push(Box::pin(async {
            let start = Instant::now();
            let result = crate::cache::ping_redis(&config.cache, &config.path).await.map(|()| "PONG".to_owned());
            Probe::timed("redis", redact_url(config.cache.url.expose_secret()), start, result)
        }));
    }
    #[cfg(feature = "postgres")]
    for sink in &config.audit.sinks {
        if let crate::config::AuditSink::Postgres { url, .. } = sink {
            out.push(Box::pin(async move {
                let start = Instant::now();
                let result = crate::audit::ping_postgres(url).await.map(|()| "SELECT 1".to_owned());
                Probe::timed("postgres", redact_url(url.expose_secret()), start, result)
            }));
        }
    }
    #[cfg(feature = "jwt")]
    if let Some(jwt) = &config.serve.jwt {
        out.push(Box::pin(async move {
            let start = Instant::now();
            let result = crate::identity::JwtVerifier::new(jwt.settings.clone())
                .await
                .map(|_| "keys fetched".to_owned())
                .map_err(|e| format!("{e}{}", crate::identity::source_text(&e)));
            Probe::timed("jwks", redact_url(&jwt.settings.issuer), start, result)
        }));
    }
    let serve = &config.serve;
    if let Some(url) = &serve.upstream {
        let key = serve.upstream_api_key.as_ref().map(|k| ("authorization", format!("Bearer {}", k.expose_secret())));
        out.push(Box::pin(upstream(url.expose_secret().to_owned(), key, vec![])));
    }
    if let Some(a) = &serve.anthropic {
        let key = a.api_key.as_ref().map(|k| ("x-api-key", k.expose_secret().to_owned()));
        out.push(Box::pin(upstream(a.upstream.clone(), key, vec![("anthropic-version", "2023-06-01")])));
    }
    out
}

/// `GET {base}/models`: any HTTP answer is the upstream reached, but a
/// refusal of the operator's key (401, 403) is a failure: every request
/// would get it.
async fn upstream(base: String, key: Option<(&'static str, String)>, headers: Vec<(&'static str, &str)>) -> Probe {
    let start = Instant::now();
    let shown = redact_url(&base);
    let result = async {
        let client = reqwest::Client::builder()
            .timeout(UPSTREAM_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| crate::cause::reqwest_cause(&e))?;
        let mut req = client.get(format!("{}/models", base.trim_end_matches('/')));
        for (k, v) in headers {
            req = req.header(k, v);
        }
        let has_key = key.is_some();
        if let Some((k, v)) = key {
            req = req.header(k, v);
        }
        let resp = req.send().await.map_err(|e| format!("cannot reach it: {}", crate::cause::reqwest_cause(&e)))?;
        let status = resp.status();
        if has_key && matches!(status.as_u16(), 401 | 403) {
            return Err(format!("GET /models answered {status}: the upstream refuses the configured key"));
        }
        Ok(format!("GET /models answered {status}"))
    }
    .await;
    Probe::timed("upstream", shown, start, result)
}
