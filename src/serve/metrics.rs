//! Prometheus metrics (`GET /metrics`, text format), kept with the
//! maintained `prometheus-client` crate: nothing here formats by hand.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::audit::AuditSinkStatus;
use crate::servers::Hub;
use crate::{ExcludeReason, Report, SharedCacheStatus};

type Labels = Vec<(&'static str, String)>;

/// Every metric the proxy keeps.
pub(super) struct Metrics {
    registry: Registry,
    requests: Family<Labels, Counter>,
    injection_seconds: Histogram,
    upstream_seconds: Family<Labels, Histogram>,
    injected_tokens: Counter,
    cache_hits: Counter,
    cache_misses: Counter,
    read_errors: Family<Labels, Counter>,
    restarts: Family<Labels, Gauge>,
    connected: Family<Labels, Gauge>,
    policy_reloads: Family<Labels, Counter>,
    auth_failures: Family<Labels, Counter>,
    upstream_auth: Family<Labels, Counter>,
    /// Token exchanges and refreshes made by the per-user token flows (`kind`: exchange, refresh).
    token_grants: Family<Labels, Counter>,
    shared_up: Gauge,
    shared_hits: Counter,
    shared_derived: Family<Labels, Counter>,
    shared_errors: Counter,
    shared_invalidations: Family<Labels, Counter>,
    /// The shared cache's totals at the last scrape (its counters are the
    /// engine's; these turn them into increments).
    shared_last: std::sync::Mutex<[u64; 6]>,
    audit_records: Family<Labels, Counter>,
    audit_up: Family<Labels, Gauge>,
    /// Each audit sink's totals at the last scrape, by position.
    audit_last: std::sync::Mutex<Vec<(u64, u64)>>,
}

fn latency_buckets() -> Histogram {
    // 50 µs .. ~3.3 min: injection is sub-millisecond when cached, upstream calls take seconds.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 22))
}

impl Metrics {
    /// `shared`: the shared (Redis) cache is configured; its series exist only then.
    pub(super) fn new(shared: bool) -> Self {
        let mut registry = Registry::with_prefix("mcp_context");
        let requests = Family::<Labels, Counter>::default();
        registry.register("http_requests", "HTTP requests answered, by route and status", requests.clone());
        let injection_seconds = latency_buckets();
        registry.register(
            "injection_duration_seconds",
            "Time to build and inject the context of one request",
            injection_seconds.clone(),
        );
        let upstream_seconds = Family::<Labels, Histogram>::new_with_constructor(latency_buckets as fn() -> Histogram);
        registry.register(
            "upstream_duration_seconds",
            "Time until the upstream's response headers, by route",
            upstream_seconds.clone(),
        );
        let injected_tokens = Counter::default();
        registry.register("injected_tokens", "Tokens of context injected", injected_tokens.clone());
        let cache_hits = Counter::default();
        registry.register("cache_hits", "Visible resources answered from the content cache", cache_hits.clone());
        let cache_misses = Counter::default();
        registry.register("cache_misses", "Visible resources read from their server", cache_misses.clone());
        let read_errors = Family::<Labels, Counter>::default();
        registry.register("server_read_errors", "Resource reads that failed, by MCP server", read_errors.clone());
        let restarts = Family::<Labels, Gauge>::default();
        registry.register("server_restarts", "Times an MCP server's connection was re-established", restarts.clone());
        let connected = Family::<Labels, Gauge>::default();
        registry.register("server_connected", "1 when the MCP server is connected", connected.clone());
        let policy_reloads = Family::<Labels, Counter>::default();
        registry.register("policy_reloads", "Policy reloads (SIGHUP), by result", policy_reloads.clone());
        let auth_failures = Family::<Labels, Counter>::default();
        registry.register(
            "auth_failures",
            "Bearer tokens refused (serve.jwt), by reason: expired, bad_signature, wrong_audience, wrong_issuer, \
             unknown_key, algorithm, malformed, missing_claim, not_yet_valid",
            auth_failures.clone(),
        );
        let upstream_auth = Family::<Labels, Counter>::default();
        registry.register(
            "upstream_auth",
            "Injections by per-user server and the caller's state with it: connected, needs_authorization, \
             token_expired, denied_by_server, auth_timeout",
            upstream_auth.clone(),
        );
        let token_grants = Family::<Labels, Counter>::default();
        registry.register(
            "upstream_token_grants",
            "Tokens obtained for per-user servers by kind: exchange (RFC 8693), refresh",
            token_grants.clone(),
        );
        let shared_up = Gauge::default();
        let shared_hits = Counter::default();
        let shared_derived = Family::<Labels, Counter>::default();
        let shared_errors = Counter::default();
        let shared_invalidations = Family::<Labels, Counter>::default();
        if shared {
            registry.register(
                "shared_cache_up",
                "1 when the shared (Redis) cache answers and its event subscription is up; absent with the memory backend",
                shared_up.clone(),
            );
            registry.register(
                "shared_cache_hits",
                "Reads answered from the shared cache instead of the MCP server",
                shared_hits.clone(),
            );
            registry.register(
                "shared_cache_derived",
                "Token counts and chunks (one record per resource) used from other replicas (outcome=used) instead of \
                 tokenising again, or stored for them (outcome=stored)",
                shared_derived.clone(),
            );
            registry.register(
                "shared_cache_errors",
                "Shared cache commands that failed or timed out",
                shared_errors.clone(),
            );
            registry.register(
                "shared_cache_invalidations",
                "Invalidations published by this replica (origin=local) or received from others (origin=remote)",
                shared_invalidations.clone(),
            );
        }
        let audit_records = Family::<Labels, Counter>::default();
        registry.register(
            "audit_records",
            "Audit records by sink (file, postgres) and outcome: written, or dropped (queue full or sink down)",
            audit_records.clone(),
        );
        let audit_up = Family::<Labels, Gauge>::default();
        registry.register("audit_sink_up", "1 when the audit sink's last write went through", audit_up.clone());
        Self {
            audit_records,
            audit_up,
            audit_last: std::sync::Mutex::default(),
            shared_up,
            shared_hits,
            shared_derived,
            shared_errors,
            shared_invalidations,
            shared_last: std::sync::Mutex::default(),
            registry,
            requests,
            injection_seconds,
            upstream_seconds,
            injected_tokens,
            cache_hits,
            cache_misses,
            read_errors,
            restarts,
            connected,
            policy_reloads,
            auth_failures,
            upstream_auth,
            token_grants,
        }
    }

    /// Brings the token grant counters up to the flows' totals (read at each scrape).
    pub(super) fn token_grants(&self, exchanges: u64, refreshes: u64) {
        for (kind, total) in [("exchange", exchanges), ("refresh", refreshes)] {
            let c = self.token_grants.get_or_create(&vec![("kind", kind.to_owned())]);
            c.inc_by(total.saturating_sub(c.get()));
        }
    }

    /// One token refused, for `reason` (an [`AuthFailure`](crate::identity::AuthFailure) word).
    pub(super) fn auth_failure(&self, reason: &str) {
        self.auth_failures.get_or_create(&vec![("reason", reason.to_owned())]).inc();
    }

    pub(super) fn request(&self, route: &str, status: axum::http::StatusCode) {
        self.requests.get_or_create(&vec![("route", route.to_owned()), ("status", status.as_str().to_owned())]).inc();
    }

    pub(super) fn upstream(&self, route: &str, seconds: f64) {
        self.upstream_seconds.get_or_create(&vec![("route", route.to_owned())]).observe(seconds);
    }

    pub(super) fn injection(&self, report: &Report, seconds: f64) {
        self.injection_seconds.observe(seconds);
        self.injected_tokens.inc_by(report.tokens as u64);
        self.cache_hits.inc_by(report.cache_hits as u64);
        self.cache_misses.inc_by(report.cache_misses as u64);
        for a in &report.auth {
            self.upstream_auth.get_or_create(&vec![("server", a.server.clone()), ("state", a.state.clone())]).inc();
        }
        let errors = report.excluded.count(ExcludeReason::Error);
        for e in report.excluded.iter().filter(|e| e.reason == ExcludeReason::Error).take(errors) {
            let server = e.id.split_once(':').map_or(e.id.as_str(), |(s, _)| s);
            self.read_errors.get_or_create(&vec![("server", server.to_owned())]).inc();
        }
    }

    pub(super) fn policy_reload(&self, ok: bool) {
        self.policy_reloads.get_or_create(&vec![("result", if ok { "ok" } else { "error" }.to_owned())]).inc();
    }

    /// The text exposition, with the per-server gauges read from the hub
    /// and the shared cache's state read now.
    pub(super) fn render(&self, hub: &Hub, shared: Option<SharedCacheStatus>, audit: &[AuditSinkStatus]) -> String {
        {
            let mut last = self.audit_last.lock().unwrap_or_else(|p| p.into_inner());
            last.resize(audit.len(), (0, 0));
            for (i, (a, l)) in audit.iter().zip(last.iter_mut()).enumerate() {
                // Two sinks of one kind are told apart by position.
                let sink = if audit.iter().filter(|b| b.sink == a.sink).count() > 1 {
                    format!("{}{i}", a.sink)
                } else {
                    a.sink.clone()
                };
                let written = vec![("sink", sink.clone()), ("outcome", "written".to_owned())];
                self.audit_records.get_or_create(&written).inc_by(a.written.saturating_sub(l.0));
                let dropped = vec![("sink", sink.clone()), ("outcome", "dropped".to_owned())];
                self.audit_records.get_or_create(&dropped).inc_by(a.dropped.saturating_sub(l.1));
                self.audit_up.get_or_create(&vec![("sink", sink)]).set(i64::from(a.up));
                *l = (a.written, a.dropped);
            }
        }
        for s in hub.status() {
            self.restarts.get_or_create(&vec![("server", s.name.clone())]).set(i64::from(s.restarts));
            self.connected.get_or_create(&vec![("server", s.name)]).set(i64::from(s.connected));
        }
        if let Some(s) = shared {
            self.shared_up.set(i64::from(s.up));
            let now =
                [s.hits, s.errors, s.invalidations_sent, s.invalidations_received, s.derived_hits, s.derived_stored];
            let mut last = self.shared_last.lock().unwrap_or_else(|p| p.into_inner());
            let d: Vec<u64> = now.iter().zip(last.iter()).map(|(n, l)| n.saturating_sub(*l)).collect();
            self.shared_hits.inc_by(d[0]);
            self.shared_errors.inc_by(d[1]);
            self.shared_invalidations.get_or_create(&vec![("origin", "local".to_owned())]).inc_by(d[2]);
            self.shared_invalidations.get_or_create(&vec![("origin", "remote".to_owned())]).inc_by(d[3]);
            self.shared_derived.get_or_create(&vec![("outcome", "used".to_owned())]).inc_by(d[4]);
            self.shared_derived.get_or_create(&vec![("outcome", "stored".to_owned())]).inc_by(d[5]);
            *last = now;
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}
