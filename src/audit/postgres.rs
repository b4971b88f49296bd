//! The PostgreSQL sink (feature `postgres`): the table is created or
//! migrated when the writer first connects, and records are inserted in
//! batches by one task, off the request path. Also the queries of
//! `mcp-context audit`.
//!
//! One table, one row per injection:
//!
//! ```text
//! id bigserial · at timestamptz · request_id · trace_id · route · model · user_name · identity_source
//! roles text[] · resources text[] (the included `server:uri`s) · upstream_status int · record jsonb (the whole record)
//! indexes: (at), (user_name, at), GIN (resources)
//! ```
//!
//! Resources are an array column with a GIN index rather than a child
//! table: "who received X since T" is `resources @> ARRAY[X] AND at >= T`
//! on one index, an insert is one statement per batch, and the digests and
//! tokens of each resource stay in `record->'included'`.
//!
//! A batch is what arrives within 100 ms of its first record (at most
//! `audit.batch`), sent as one JSON array and unpacked by PostgreSQL
//! (`jsonb_array_elements`), so a batch of any size is one round trip. A
//! failed connect or insert drops the batch (counted), marks the sink down
//! and is retried at most once a second; meanwhile queued records are dropped
//! as they come, so the queue never backs up into requests.

use std::sync::Arc;
use std::time::{Duration, Instant};

use secrecy::{ExposeSecret, SecretString};
use tokio::sync::mpsc;
use tokio_postgres::{Client, NoTls};

use super::{AuditQuery, AuditRecord, Msg, Stats};
use crate::cause::redact_url;
use crate::error::{Error, Result};

/// The table written to.
pub(super) struct Target {
    pub(super) url: SecretString,
    pub(super) schema: String,
    pub(super) table: String,
}

/// Longest wait for a connection or one statement.
const TIMEOUT: Duration = Duration::from_secs(5);
/// How long a batch waits for more records after its first.
const LINGER: Duration = Duration::from_millis(100);
/// Time between reconnection attempts while down.
const RETRY: Duration = Duration::from_secs(1);

impl Target {
    fn name(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.table)
    }

    fn shown_url(&self) -> String {
        redact_url(self.url.expose_secret())
    }

    /// Connects (the connection driven by a task of its own) within [`TIMEOUT`].
    async fn connect(&self) -> std::result::Result<Client, String> {
        let url = self.url.expose_secret().to_owned();
        let connecting = tokio_postgres::connect(&url, NoTls);
        match tokio::time::timeout(TIMEOUT, connecting).await {
            Err(_) => Err(format!("{}: no connection within {} s", self.shown_url(), TIMEOUT.as_secs())),
            Ok(Err(e)) => Err(format!("{}: {}", self.shown_url(), describe(&e))),
            Ok(Ok((client, connection))) => {
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                Ok(client)
            }
        }
    }

    /// Creates the schema, the table and its indexes, or adds what an older version lacks. Serialised
    /// between replicas by an advisory lock, so that two starting at once do not race.
    async fn migrate(&self, client: &Client) -> std::result::Result<(), tokio_postgres::Error> {
        let (s, t, name) = (&self.schema, &self.table, self.name());
        let sql = format!(
            "BEGIN;
             SELECT pg_advisory_xact_lock(hashtext('mcp-context audit {s}.{t}'));
             CREATE SCHEMA IF NOT EXISTS \"{s}\";
             CREATE TABLE IF NOT EXISTS {name} (id bigserial PRIMARY KEY);
             ALTER TABLE {name}
               ADD COLUMN IF NOT EXISTS at timestamptz NOT NULL DEFAULT now(),
               ADD COLUMN IF NOT EXISTS request_id text NOT NULL DEFAULT '',
               ADD COLUMN IF NOT EXISTS trace_id text NOT NULL DEFAULT '',
               ADD COLUMN IF NOT EXISTS route text NOT NULL DEFAULT '',
               ADD COLUMN IF NOT EXISTS model text NOT NULL DEFAULT '',
               ADD COLUMN IF NOT EXISTS user_name text NOT NULL DEFAULT '',
               ADD COLUMN IF NOT EXISTS identity_source text NOT NULL DEFAULT '',
               ADD COLUMN IF NOT EXISTS roles text[] NOT NULL DEFAULT '{{}}',
               ADD COLUMN IF NOT EXISTS resources text[] NOT NULL DEFAULT '{{}}',
               ADD COLUMN IF NOT EXISTS upstream_status integer,
               ADD COLUMN IF NOT EXISTS record jsonb NOT NULL DEFAULT '{{}}';
             CREATE INDEX IF NOT EXISTS \"{t}_at\" ON {name} (at);
             CREATE INDEX IF NOT EXISTS \"{t}_user_at\" ON {name} (user_name, at);
             CREATE INDEX IF NOT EXISTS \"{t}_resources\" ON {name} USING gin (resources);
             COMMIT;"
        );
        client.batch_execute(&sql).await
    }

    fn insert_sql(&self) -> String {
        format!(
            "INSERT INTO {} (at, request_id, trace_id, route, model, user_name, identity_source, roles, resources, \
             upstream_status, record)
             SELECT (r->>'at')::timestamptz, r->>'request_id', r->>'trace_id', r->>'route', r->>'model', r->>'user',
                    r->>'identity_source',
                    ARRAY(SELECT jsonb_array_elements_text(r->'roles')),
                    ARRAY(SELECT e->>'id' FROM jsonb_array_elements(r->'included') e),
                    (r->>'upstream_status')::integer, r
             FROM jsonb_array_elements($1::text::jsonb) AS r",
            self.name()
        )
    }
}

/// The error's own words (tokio-postgres puts the server's message in its `source`).
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => db.message().to_owned(),
        None => {
            let inner = std::error::Error::source(e).map(|s| format!(": {s}")).unwrap_or_default();
            format!("{e}{inner}")
        }
    }
}

/// The writer: connects and migrates, then inserts what arrives, a batch at a time.
pub(super) async fn run(target: Target, batch: usize, mut rx: mpsc::Receiver<Msg>, stats: Arc<Stats>) {
    let insert = target.insert_sql();
    let mut client: Option<Client> = None;
    let mut next_try = Instant::now();
    let mut records: Vec<Arc<AuditRecord>> = Vec::with_capacity(batch);
    let mut flushes = Vec::new();
    // The first connection at start, so the table exists before the first request.
    connect(&target, &mut client, &mut next_try, &stats).await;
    while let Some(msg) = rx.recv().await {
        // A batch is what arrives within LINGER of its first record (or `batch` records, or a flush): one
        // statement and one commit for many requests, so PostgreSQL's own work per record stays small.
        let deadline = tokio::time::Instant::now() + LINGER;
        let mut next = Some(msg);
        while let Some(msg) = next.take() {
            match msg {
                Msg::Record(r) => records.push(r),
                Msg::Flush(done) => flushes.push(done),
            }
            if records.len() < batch && flushes.is_empty() {
                next = tokio::time::timeout_at(deadline, rx.recv()).await.ok().flatten();
            }
        }
        if !records.is_empty() {
            if client.is_none() && Instant::now() >= next_try {
                connect(&target, &mut client, &mut next_try, &stats).await;
            }
            let n = records.len();
            match &client {
                None => stats.dropped(n),
                Some(c) => {
                    let body = serde_json::to_string(&records).unwrap_or_else(|_| "[]".into());
                    match tokio::time::timeout(TIMEOUT, c.execute(insert.as_str(), &[&body])).await {
                        Ok(Ok(_)) => {
                            stats.written(n);
                            stats.up();
                        }
                        failed => {
                            let why = match failed {
                                Ok(Err(e)) => describe(&e),
                                _ => format!("no answer within {} s", TIMEOUT.as_secs()),
                            };
                            stats.dropped(n);
                            stats.down(format!("{}: insert failed: {why}", target.shown_url()));
                            client = None;
                            next_try = Instant::now() + RETRY;
                        }
                    }
                }
            }
            records.clear();
        }
        for done in flushes.drain(..) {
            let _ = done.send(());
        }
    }
}

async fn connect(target: &Target, client: &mut Option<Client>, next_try: &mut Instant, stats: &Stats) {
    let got = match target.connect().await {
        Ok(c) => match tokio::time::timeout(TIMEOUT, target.migrate(&c)).await {
            Ok(Ok(())) => Ok(c),
            Ok(Err(e)) => Err(format!("{}: creating {}: {}", target.shown_url(), target.name(), describe(&e))),
            Err(_) => Err(format!("{}: creating {}: no answer within {} s", target.shown_url(), target.name(), 5)),
        },
        Err(e) => Err(e),
    };
    match got {
        Ok(c) => {
            *client = Some(c);
            stats.up();
        }
        Err(why) => {
            stats.down(why);
            *next_try = Instant::now() + RETRY;
        }
    }
}

/// Answers an [`AuditQuery`], oldest first.
pub(super) async fn query(target: &Target, q: &AuditQuery) -> Result<Vec<AuditRecord>> {
    let client = target.connect().await.map_err(Error::audit)?;
    let (column, value, since) = match q {
        AuditQuery::WhoReceived { resource, since } => ("resources @> ARRAY[$1::text]", resource, since),
        AuditQuery::ReceivedBy { user, since } => ("user_name = $1::text", user, since),
    };
    let since = since.as_deref().unwrap_or("-infinity");
    let sql = format!(
        "SELECT record::text FROM {} WHERE {column} AND at >= $2::text::timestamptz ORDER BY at, id",
        target.name()
    );
    let rows = client.query(sql.as_str(), &[value, &since]).await.map_err(Error::audit_by(format!(
        "querying {} at {}",
        target.name(),
        target.shown_url()
    )))?;
    rows.iter()
        .map(|row| {
            let text: String = row.get(0);
            serde_json::from_str(&text).map_err(Error::audit_by(format!("a record of {} is unreadable", target.name())))
        })
        .collect()
}
