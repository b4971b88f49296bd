//! The audit trail: a record of every injection (who received which
//! resources, as digests of the exact blocks sent, and what was left out),
//! handed to each configured sink off the request path.
//!
//! ```text
//! request → AuditRecord (ids, digests, counts; never content)
//!         → Auditor::submit: try_send into one bounded channel per sink (never waits)
//!         → the sink's writer task: file.rs (JSONL, rotated by size) | postgres.rs (batched inserts)
//! ```
//!
//! A full channel or a sink that fails drops records and counts them
//! ([`AuditSinkStatus`]); a request is never failed or slowed by its audit.
//! Who writes the record: the library, when a public entry point builds a
//! context ([`McpContext::build`](crate::McpContext::build) and everything
//! on it); `serve` builds through a crate-internal entry that does not, and
//! writes the record itself once the upstream has answered, with its status
//! and latency, so that each injection has exactly one record.
//!
//! Layer: sinks, beside the sources: imports the bottom (report, error,
//! cause) and the settings; the orchestrator and the proxy import it.

mod file;
#[cfg(feature = "postgres")]
mod postgres;
mod record;
mod since;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

pub use self::record::{AuditRecord, AuditResource};
pub(crate) use self::record::{Origin, ToolRead};
pub(crate) use self::record::{digests, included};
#[cfg(feature = "serve")]
pub(crate) use self::record::{random_hex, trace_id_of, usable_request_id};
pub use self::since::since;
use crate::config::{AuditSettings, AuditSink};
use crate::error::{Error, Result};

/// What one sink's writer is sent.
enum Msg {
    Record(Arc<AuditRecord>),
    /// Answered once everything sent before it is written (or dropped).
    Flush(oneshot::Sender<()>),
}

/// One sink's counters and state, shared with its writer.
#[derive(Default)]
struct Stats {
    written: AtomicU64,
    dropped: AtomicU64,
    up: AtomicBool,
    error: std::sync::Mutex<Option<String>>,
}

impl Stats {
    fn up(&self) {
        self.up.store(true, Ordering::Relaxed);
        *self.error.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn down(&self, why: String) {
        if self.up.swap(false, Ordering::Relaxed) {
            tracing::warn!("audit sink down, records are dropped until it is back: {why}");
        }
        *self.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
    }

    fn dropped(&self, n: usize) {
        self.dropped.fetch_add(n as u64, Ordering::Relaxed);
    }

    fn written(&self, n: usize) {
        self.written.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// One sink as `/metrics` and `/readyz` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct AuditSinkStatus {
    /// `file` or `postgres`.
    pub sink: String,
    /// Whether its last write went through (a sink that has written nothing yet counts as up once opened).
    pub up: bool,
    /// Why it is down.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Records written.
    pub written: u64,
    /// Records dropped: the queue was full or the sink failed.
    pub dropped: u64,
}

struct Sink {
    kind: &'static str,
    tx: mpsc::Sender<Msg>,
    stats: Arc<Stats>,
}

/// The sinks of one process. Records go to every sink; each has its own
/// bounded queue and writer, so a slow one never holds another up.
pub(crate) struct Auditor {
    sinks: Vec<Sink>,
    denied_ids: bool,
}

impl Auditor {
    /// Starts a writer per sink (needs a Tokio runtime). `None` without sinks.
    pub(crate) fn start(settings: &AuditSettings) -> Option<Auditor> {
        if settings.sinks.is_empty() {
            return None;
        }
        let sinks = settings
            .sinks
            .iter()
            .map(|s| {
                let (tx, rx) = mpsc::channel(settings.queue);
                let stats = Arc::new(Stats::default());
                match s {
                    AuditSink::File { path, max_bytes, keep } => {
                        file::spawn(path.clone(), *max_bytes, *keep, rx, stats.clone());
                    }
                    #[cfg(feature = "postgres")]
                    AuditSink::Postgres { url, schema, table } => {
                        let target =
                            postgres::Target { url: url.clone(), schema: schema.clone(), table: table.clone() };
                        tokio::spawn(postgres::run(target, settings.batch, rx, stats.clone()));
                    }
                    #[cfg(not(feature = "postgres"))]
                    AuditSink::Postgres { .. } => {
                        // The config refuses it in such a build; should one get here, it drops.
                        drop(rx);
                        stats.down("this build has no PostgreSQL support".into());
                    }
                }
                Sink { kind: s.kind(), tx, stats }
            })
            .collect();
        Some(Auditor { sinks, denied_ids: settings.denied_ids })
    }

    /// The record of `report`, whose message's resources (if it had one) are
    /// `included` (see [`included`]), with the roles the policy was applied with.
    pub(crate) fn record(
        &self,
        report: &crate::report::Report,
        included: Option<Arc<[AuditResource]>>,
        origin: Origin,
    ) -> AuditRecord {
        let included = included.unwrap_or_else(|| record::included(report, None));
        AuditRecord::new(report, included, &report.roles, origin, self.denied_ids)
    }

    /// Hands a record to every sink without waiting: a full queue drops it (counted).
    pub(crate) fn submit(&self, record: AuditRecord) {
        let record = Arc::new(record);
        for s in &self.sinks {
            if s.tx.try_send(Msg::Record(record.clone())).is_err() {
                s.stats.dropped(1);
            }
        }
    }

    /// Waits (at most `within`) until every record submitted so far is written or dropped.
    pub(crate) async fn flush(&self, within: Duration) {
        let waits = self.sinks.iter().map(|s| async move {
            let (tx, rx) = oneshot::channel();
            if s.tx.send(Msg::Flush(tx)).await.is_ok() {
                let _ = rx.await;
            }
        });
        let _ = tokio::time::timeout(within, futures::future::join_all(waits)).await;
    }

    /// Each sink's state.
    pub(crate) fn status(&self) -> Vec<AuditSinkStatus> {
        self.sinks
            .iter()
            .map(|s| AuditSinkStatus {
                sink: s.kind.to_owned(),
                up: s.stats.up.load(Ordering::Relaxed),
                error: s.stats.error.lock().unwrap_or_else(|p| p.into_inner()).clone(),
                written: s.stats.written.load(Ordering::Relaxed),
                dropped: s.stats.dropped.load(Ordering::Relaxed),
            })
            .collect()
    }
}

/// A question for the audit trail (`mcp-context audit`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AuditQuery {
    /// Who received this `server:uri`, since a time.
    WhoReceived {
        /// `server:uri`.
        resource: String,
        /// A time as [`since`] reads it (RFC 3339, a date, or `24h` back); `None`: since ever.
        since: Option<String>,
    },
    /// What this user received, since a time.
    ReceivedBy {
        /// The user name.
        user: String,
        /// As for `WhoReceived`.
        since: Option<String>,
    },
}

/// Answers `query` from the first PostgreSQL sink of `settings`, else from
/// the first file sink (its rotated files included), oldest record first.
///
/// # Errors
///
/// [`Error::Audit`] when no sink is configured (or the only one is
/// PostgreSQL and the build has none), a `since` that is not a time (see
/// [`since`]), PostgreSQL cannot be reached or refuses the query, or a
/// file cannot be read or holds a line that is not a record.
pub async fn query(settings: &AuditSettings, query: &AuditQuery) -> Result<Vec<AuditRecord>> {
    // Checked and written as the records write theirs: every sink compares like with like.
    let query = &match query {
        AuditQuery::WhoReceived { resource, since: t } => {
            AuditQuery::WhoReceived { resource: resource.clone(), since: t.as_deref().map(since).transpose()? }
        }
        AuditQuery::ReceivedBy { user, since: t } => {
            AuditQuery::ReceivedBy { user: user.clone(), since: t.as_deref().map(since).transpose()? }
        }
    };
    let postgres = settings.sinks.iter().find(|s| matches!(s, AuditSink::Postgres { .. }));
    let file = settings.sinks.iter().find(|s| matches!(s, AuditSink::File { .. }));
    let Some(AuditSink::Postgres { url, schema, table }) = postgres else {
        let Some(AuditSink::File { path, keep, .. }) = file else {
            return Err(Error::audit("the config has no `audit.sinks` entry (`file:` or `postgres:`) to query"));
        };
        let (path, keep, query) = (path.clone(), *keep, query.clone());
        return tokio::task::spawn_blocking(move || file::query(&path, keep, &query))
            .await
            .map_err(Error::task("reading the audit file"))?;
    };
    #[cfg(feature = "postgres")]
    {
        let target = postgres::Target { url: url.clone(), schema: schema.clone(), table: table.clone() };
        postgres::query(&target, query).await
    }
    #[cfg(not(feature = "postgres"))]
    {
        let _ = (url, schema, table, query);
        Err(Error::audit("this build has no PostgreSQL support (feature `postgres`)"))
    }
}

/// Connects to the database of a PostgreSQL sink and runs `SELECT 1` (what
/// `mcp-context check` does): `Err` says why not, the URL without its password.
#[cfg(feature = "postgres")]
pub(crate) async fn ping_postgres(url: &secrecy::SecretString) -> std::result::Result<(), String> {
    let target = postgres::Target { url: url.clone(), schema: String::new(), table: String::new() };
    let client = target.connect().await?;
    let shown = crate::cause::redact_url(secrecy::ExposeSecret::expose_secret(url));
    client.simple_query("SELECT 1").await.map(drop).map_err(|e| format!("{shown}: SELECT 1 failed: {e}"))
}
