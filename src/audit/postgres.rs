//! The PostgreSQL sink (feature `postgres`): the tables are created or
//! migrated when the writer first connects, and records are inserted in
//! batches by one task, off the request path. Also the queries of
//! `mcp-context audit`.
//!
//! Two tables: one narrow row per injection, and the sets of resources
//! injections carried, each set stored once:
//!
//! ```text
//! <table>:      id bigserial · at timestamptz · request_id · trace_id · route · model · user_name
//!               identity_source · roles text[] · set_digest · mode · budget · tokens · excluded jsonb (counts)
//!               servers_failed text[] · upstream_status · upstream_ms · injection_ms
//!               indexes: (at), (user_name, at), (set_digest, at)
//! <table>_sets: digest text primary key · resources text[] (the included `server:uri`s) · included jsonb (each
//!               resource's block digest, tokens, cut) · denied text[];  GIN (resources)
//! ```
//!
//! Why two: an unchanged request sends the same blocks again, so most
//! injections repeat a set already stored, and a row that names its set by
//! digest is a fraction of the work of one that carries it (measured with
//! `psql` on 500-record batches of the bench's records: 0.05 ms of
//! PostgreSQL's time a record, against 0.4 ms for one `jsonb` row with the
//! resources in a GIN-indexed array, which is how the first version stored
//! them). "Who received X since T" is the sets holding X (GIN), then their
//! injections since T (`(set_digest, at)`). A set's digest is the SHA-256 of
//! its fields (included, then denied; see `Set::digest`), so replicas writing
//! one table agree on it; each writer remembers which sets it has stored and sends only new ones
//! (`ON CONFLICT DO NOTHING` covers the others').
//!
//! A batch is what arrives within 100 ms of its first record (at most
//! `audit.batch`), sent as one binary `COPY` (prepared once per connection),
//! plus one statement for its new sets. A batch PostgreSQL refuses (its own error: a value or a constraint) is
//! split in halves and each half sent again, down to single records, so only a record that cannot be stored
//! by itself is dropped (counted, with a warning naming why). A failed connect, a lost connection or no answer
//! drops the batch (counted), marks the sink down and is retried at most once a second; meanwhile queued records
//! are dropped as they come, so the queue never backs up into requests.
//!
//! Every text is made storable first: PostgreSQL's `text` and `jsonb` hold no NUL character, and a caller's
//! `model` or a server's resource URI may carry one, so each NUL is stored as U+FFFD (the replacement
//! character; the JSONL sink keeps the exact value). A query for a value with a NUL finds it under U+FFFD.
//!
//! A table of the first layout (one `record jsonb` per row) is migrated in
//! place on start: its sets extracted, its columns filled, the two old
//! columns dropped.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{Json, ToSql, Type};
use tokio_postgres::{Client, NoTls, Statement};

use super::{AuditQuery, AuditRecord, AuditResource, Msg, Stats};
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
/// Set digests a writer remembers as stored (forgotten all at once past this: the next batch sends its sets again).
const KNOWN_SETS: usize = 100_000;

impl Target {
    fn name(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.table)
    }

    fn sets(&self) -> String {
        format!("\"{}\".\"{}_sets\"", self.schema, self.table)
    }

    fn shown_url(&self) -> String {
        redact_url(self.url.expose_secret())
    }

    /// Connects (the connection driven by a task of its own) within [`TIMEOUT`].
    pub(super) async fn connect(&self) -> std::result::Result<Client, String> {
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

    /// Creates the schema, the tables and their indexes, or adds what an older version lacks (and moves a
    /// first-layout table's rows into this one). Serialised between replicas by an advisory lock, so that two
    /// starting at once do not race.
    async fn migrate(&self, client: &Client) -> std::result::Result<(), tokio_postgres::Error> {
        let (s, t, name, sets) = (&self.schema, &self.table, self.name(), self.sets());
        // The first layout's sets: digests of their own ('v1-' and md5), never equal to a new one.
        let v1 = "'v1-' || md5(coalesce(record->'included', '[]')::text || coalesce(record->'denied', '[]')::text)";
        let texts = |field: &str| format!("ARRAY(SELECT jsonb_array_elements_text(coalesce(record->'{field}', '[]')))");
        let sql = format!(
            "BEGIN;
             SELECT pg_advisory_xact_lock(hashtext('mcp-context audit {s}.{t}'));
             CREATE SCHEMA IF NOT EXISTS \"{s}\";
             CREATE TABLE IF NOT EXISTS {sets} (digest text PRIMARY KEY, resources text[] NOT NULL,
               included jsonb NOT NULL, denied text[] NOT NULL DEFAULT '{{}}');
             CREATE INDEX IF NOT EXISTS \"{t}_sets_resources\" ON {sets} USING gin (resources);
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
               ADD COLUMN IF NOT EXISTS set_digest text,
               ADD COLUMN IF NOT EXISTS mode text,
               ADD COLUMN IF NOT EXISTS budget bigint NOT NULL DEFAULT 0,
               ADD COLUMN IF NOT EXISTS tokens bigint NOT NULL DEFAULT 0,
               ADD COLUMN IF NOT EXISTS excluded jsonb NOT NULL DEFAULT '{{}}',
               ADD COLUMN IF NOT EXISTS servers_failed text[] NOT NULL DEFAULT '{{}}',
               ADD COLUMN IF NOT EXISTS upstream_status integer,
               ADD COLUMN IF NOT EXISTS upstream_ms double precision,
               ADD COLUMN IF NOT EXISTS injection_ms double precision NOT NULL DEFAULT 0;
             DO $migrate$ BEGIN
               IF EXISTS (SELECT 1 FROM information_schema.columns
                          WHERE table_schema = '{s}' AND table_name = '{t}' AND column_name = 'record') THEN
                 UPDATE {name} SET set_digest = {v1}, mode = record->>'mode',
                   budget = coalesce((record->>'budget')::bigint, 0), tokens = coalesce((record->>'tokens')::bigint, 0),
                   excluded = coalesce(record->'excluded', '{{}}'), servers_failed = {failed},
                   upstream_ms = (record->>'upstream_ms')::double precision,
                   injection_ms = coalesce((record->>'injection_ms')::double precision, 0)
                 WHERE set_digest IS NULL;
                 INSERT INTO {sets} (digest, resources, included, denied)
                   SELECT DISTINCT ON (set_digest) set_digest,
                     ARRAY(SELECT e->>'id' FROM jsonb_array_elements(coalesce(record->'included', '[]')) e),
                     coalesce(record->'included', '[]'), {denied}
                   FROM {name} WHERE record IS NOT NULL
                   ON CONFLICT (digest) DO NOTHING;
                 ALTER TABLE {name} DROP COLUMN record, DROP COLUMN IF EXISTS resources;
               END IF;
             END $migrate$;
             CREATE INDEX IF NOT EXISTS \"{t}_at\" ON {name} (at);
             CREATE INDEX IF NOT EXISTS \"{t}_user_at\" ON {name} (user_name, at);
             CREATE INDEX IF NOT EXISTS \"{t}_set_at\" ON {name} (set_digest, at);
             COMMIT;",
            failed = texts("servers_failed"),
            denied = texts("denied"),
        );
        client.batch_execute(&sql).await
    }

    /// The records go in by binary `COPY`: no statement to plan or run per row (measured with `psql` on the
    /// bench's rows, 1.5–2x less of PostgreSQL's time a row than `INSERT … SELECT FROM unnest`).
    fn copy_sql(&self) -> String {
        format!(
            "COPY {} (at, request_id, trace_id, route, model, user_name, identity_source, roles, set_digest, mode,
               budget, tokens, excluded, servers_failed, upstream_status, upstream_ms, injection_ms) FROM STDIN BINARY",
            self.name()
        )
    }

    fn insert_sets_sql(&self) -> String {
        format!(
            "INSERT INTO {} (digest, resources, included, denied)
             SELECT d, ARRAY(SELECT jsonb_array_elements_text(r::jsonb)), i::jsonb,
               ARRAY(SELECT jsonb_array_elements_text(dn::jsonb))
             FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS u(d, r, i, dn)
             ON CONFLICT (digest) DO NOTHING",
            self.sets()
        )
    }
}

/// The resources of one injection as stored once: what was included and what was denied.
struct Set<'a> {
    included: &'a [AuditResource],
    denied: &'a [String],
}

impl Set<'_> {
    /// Its digest: the hex SHA-256 of its fields in order, each one
    /// length-prefixed (so no two sets hash the same bytes). Fed to the hash
    /// as they are: writing the set as JSON first was, with its escaping,
    /// the writer's largest cost per record.
    fn digest(&self) -> String {
        fn put(h: &mut Sha256, bytes: &[u8]) {
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        }
        let mut h = Sha256::new();
        put(&mut h, b"mcp-context audit set v2");
        put(&mut h, &(self.included.len() as u64).to_le_bytes());
        for i in self.included {
            put(&mut h, i.id.as_bytes());
            put(&mut h, i.sha256.as_bytes());
            put(&mut h, &(i.tokens as u64).to_le_bytes());
            put(&mut h, &[u8::from(i.truncated), u8::from(i.passages)]);
        }
        put(&mut h, &(self.denied.len() as u64).to_le_bytes());
        for d in self.denied {
            put(&mut h, d.as_bytes());
        }
        super::record::hex_bytes(&h.finalize())
    }
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

/// `s` as PostgreSQL can store it in `text` or `jsonb`: each NUL (which neither may hold) as U+FFFD.
fn storable(s: &str) -> Cow<'_, str> {
    if s.contains('\0') { Cow::Owned(s.replace('\0', "\u{FFFD}")) } else { Cow::Borrowed(s) }
}

/// [`storable`] of each text of a list; `None` when all are storable as they are.
fn storable_all(v: &[String]) -> Option<Vec<String>> {
    v.iter().any(|s| s.contains('\0')).then(|| v.iter().map(|s| storable(s).into_owned()).collect())
}

/// One batch: its records with their set digests, and the sets not stored yet.
struct Batch<'a> {
    records: Vec<(&'a AuditRecord, String)>,
    /// New sets: digest, resources (JSON), included (JSON), denied (JSON).
    sets: [Vec<String>; 4],
}

/// The digests of the sets recently written, by their included list: the
/// records of one composed message share that list (one `Arc`), so its
/// digest is hashed once, not once a record (hashing a set of 23 resources
/// was 2 % of an audited proxy's CPU). Holding the list keeps its address
/// from being reused while remembered, so the same address is the same list.
#[derive(Default)]
struct SetDigests(std::collections::VecDeque<(Arc<[AuditResource]>, Vec<String>, String)>);

impl SetDigests {
    const LEN: usize = 64;

    fn of(&mut self, included: &Arc<[AuditResource]>, denied: &[String]) -> String {
        let same = |(i, d, _): &(Arc<[AuditResource]>, Vec<String>, String)| Arc::ptr_eq(i, included) && d == denied;
        if let Some((_, _, digest)) = self.0.iter().find(|e| same(e)) {
            return digest.clone();
        }
        let digest = Set { included, denied }.digest();
        if self.0.len() == Self::LEN {
            self.0.pop_front();
        }
        self.0.push_back((included.clone(), denied.to_vec(), digest.clone()));
        digest
    }
}

impl<'a> Batch<'a> {
    /// The batch of `records`, with the sets `known` does not hold yet.
    fn of(records: &'a [Arc<AuditRecord>], known: &HashSet<String>, digests: &mut SetDigests) -> Batch<'a> {
        let mut b = Batch { records: Vec::with_capacity(records.len()), sets: Default::default() };
        let mut new = HashSet::new();
        for r in records {
            let digest = digests.of(&r.included, &r.denied);
            if !known.contains(&digest) && new.insert(digest.clone()) {
                let ids: Vec<Cow<'_, str>> = r.included.iter().map(|i| storable(&i.id)).collect();
                b.sets[0].push(digest.clone());
                b.sets[1].push(json(&ids));
                // JSON writes a NUL as `\u0000`, which `jsonb` refuses as well.
                if r.included.iter().any(|i| i.id.contains('\0')) {
                    let included: Vec<AuditResource> = r
                        .included
                        .iter()
                        .map(|i| AuditResource { id: storable(&i.id).into_owned(), ..i.clone() })
                        .collect();
                    b.sets[2].push(json(&included));
                } else {
                    b.sets[2].push(json(&r.included));
                }
                b.sets[3].push(json(&storable_all(&r.denied).unwrap_or_else(|| r.denied.clone())));
            }
            b.records.push((r, digest));
        }
        b
    }
}

/// The column types of [`Target::copy_sql`], in order.
const COPY_TYPES: [Type; 17] = [
    Type::TIMESTAMPTZ,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT_ARRAY,
    Type::TEXT,
    Type::TEXT,
    Type::INT8,
    Type::INT8,
    Type::JSONB,
    Type::TEXT_ARRAY,
    Type::INT4,
    Type::FLOAT8,
    Type::FLOAT8,
];

/// A connection and its prepared statements.
struct Conn {
    client: Client,
    copy: Statement,
    insert_sets: Statement,
}

impl Conn {
    /// Writes `b`: its new sets first, then its records.
    async fn write(&self, b: &Batch<'_>) -> std::result::Result<(), tokio_postgres::Error> {
        if !b.sets[0].is_empty() {
            let s = &b.sets;
            self.client.execute(&self.insert_sets, &[&s[0], &s[1], &s[2], &s[3]]).await?;
        }
        let sink = self.client.copy_in(&self.copy).await?;
        let writer = BinaryCopyInWriter::new(sink, &COPY_TYPES);
        futures::pin_mut!(writer);
        for (r, digest) in &b.records {
            // A record's time as it says (made by this module's `rfc3339`), else now.
            let at = super::record::parse_rfc3339(&r.at).unwrap_or_else(std::time::SystemTime::now);
            let (roles, failed) = (storable_all(&r.roles), storable_all(&r.servers_failed));
            let row: [&(dyn ToSql + Sync); 17] = [
                &at,
                &storable(&r.request_id),
                &storable(&r.trace_id),
                &storable(&r.route),
                &storable(&r.model),
                &storable(&r.user),
                &storable(&r.identity_source),
                roles.as_ref().unwrap_or(&r.roles),
                digest,
                &r.mode.as_deref().map(storable),
                &i64::try_from(r.budget).unwrap_or(i64::MAX),
                &i64::try_from(r.tokens).unwrap_or(i64::MAX),
                &Json(&r.excluded),
                failed.as_ref().unwrap_or(&r.servers_failed),
                &r.upstream_status.map(i32::from),
                &r.upstream_ms,
                &r.injection_ms,
            ];
            writer.as_mut().write(&row).await?;
        }
        writer.finish().await?;
        Ok(())
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
    let mut conn: Option<Conn> = None;
    let mut known: HashSet<String> = HashSet::new();
    let mut digests = SetDigests::default();
    let mut next_try = Instant::now();
    let mut records: Vec<Arc<AuditRecord>> = Vec::with_capacity(batch);
    let mut flushes = Vec::new();
    // The first connection at start, so the tables exist before the first request.
    connect(&target, &mut conn, &mut next_try, &stats).await;
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
            if conn.is_none() && Instant::now() >= next_try {
                connect(&target, &mut conn, &mut next_try, &stats).await;
            }
            match &conn {
                None => stats.dropped(records.len()),
                Some(c) => {
                    if let Err(why) = write_all(c, &records, &mut known, &mut digests, &stats).await {
                        stats.down(format!("{}: insert failed: {why}", target.shown_url()));
                        conn = None;
                        next_try = Instant::now() + RETRY;
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

/// Writes `records`, counting each written or dropped. A part PostgreSQL refuses (a `DbError`: a value or a
/// constraint, the connection still good) is split in halves and each sent again, so one bad record costs
/// about 2·log2(batch) more statements and only itself: a record refused alone is dropped, and one warning
/// says how many and why. Any other failure (connection lost, no answer within [`TIMEOUT`]) drops what is
/// left and is returned, for the caller to mark the sink down.
async fn write_all(
    c: &Conn,
    records: &[Arc<AuditRecord>],
    known: &mut HashSet<String>,
    digests: &mut SetDigests,
    stats: &Stats,
) -> std::result::Result<(), String> {
    let mut todo = vec![records];
    // Records refused alone, and the first reason given.
    let (mut refused, mut why_refused) = (0, String::new());
    let warn = |refused: usize, why: &str| {
        if refused > 0 {
            tracing::warn!("audit: PostgreSQL refused {refused} record(s), dropped: {why}");
        }
    };
    while let Some(part) = todo.pop() {
        let b = Batch::of(part, known, digests);
        match tokio::time::timeout(TIMEOUT, c.write(&b)).await {
            Ok(Ok(())) => {
                stats.written(part.len());
                stats.up();
                if known.len() + b.sets[0].len() > KNOWN_SETS {
                    known.clear();
                }
                known.extend(b.sets[0].iter().cloned());
            }
            Ok(Err(e)) if e.as_db_error().is_some() && part.len() > 1 => {
                let (first, second) = part.split_at(part.len() / 2);
                // Popped first half first: records keep their order.
                todo.extend([second, first]);
            }
            Ok(Err(e)) if e.as_db_error().is_some() => {
                stats.dropped(1);
                if refused == 0 {
                    why_refused = describe(&e);
                }
                refused += 1;
            }
            failed => {
                stats.dropped(todo.iter().map(|p| p.len()).sum::<usize>() + part.len());
                warn(refused, &why_refused);
                return Err(match failed {
                    Ok(Err(e)) => describe(&e),
                    _ => format!("no answer within {} s", TIMEOUT.as_secs()),
                });
            }
        }
    }
    warn(refused, &why_refused);
    Ok(())
}

async fn connect(target: &Target, conn: &mut Option<Conn>, next_try: &mut Instant, stats: &Stats) {
    let ready = async {
        let client = target.connect().await?;
        let creating = |e: String| format!("{}: creating {}: {e}", target.shown_url(), target.name());
        let prepared = async {
            target.migrate(&client).await?;
            let copy = client.prepare(&target.copy_sql()).await?;
            let insert_sets = client.prepare(&target.insert_sets_sql()).await?;
            Ok::<_, tokio_postgres::Error>((copy, insert_sets))
        };
        match tokio::time::timeout(TIMEOUT, prepared).await {
            Ok(Ok((copy, insert_sets))) => Ok(Conn { client, copy, insert_sets }),
            Ok(Err(e)) => Err(creating(describe(&e))),
            Err(_) => Err(creating(format!("no answer within {} s", TIMEOUT.as_secs()))),
        }
    };
    match ready.await {
        Ok(c) => {
            *conn = Some(c);
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
    let (name, sets) = (target.name(), target.sets());
    // A table of an older layout is brought up to date first (as a writer starting would).
    target.migrate(&client).await.map_err(Error::audit_by(format!("migrating {name} at {}", target.shown_url())))?;
    let (filter, value, since) = match q {
        AuditQuery::WhoReceived { resource, since } => {
            (format!("r.set_digest IN (SELECT digest FROM {sets} WHERE resources @> ARRAY[$1::text])"), resource, since)
        }
        AuditQuery::ReceivedBy { user, since } => ("r.user_name = $1::text".to_owned(), user, since),
    };
    let since = since.as_deref().unwrap_or("-infinity");
    let sql = format!(
        "SELECT to_char(r.at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'), r.request_id, r.trace_id,
           r.route, r.model, r.user_name, r.identity_source, r.roles, r.mode, r.budget, r.tokens,
           coalesce(s.included, '[]')::text, r.excluded::text, coalesce(s.denied, '{{}}'), r.servers_failed,
           r.upstream_status, r.upstream_ms, r.injection_ms
         FROM {name} r LEFT JOIN {sets} s ON s.digest = r.set_digest
         WHERE {filter} AND r.at >= $2::text::timestamptz ORDER BY r.at, r.id"
    );
    let failed = || Error::audit_by(format!("querying {name} at {}", target.shown_url()));
    let rows = client.query(sql.as_str(), &[value, &since]).await.map_err(failed())?;
    let unreadable = || Error::audit_by(format!("a record of {name} is unreadable"));
    rows.iter()
        .map(|row| {
            let included: String = row.get(11);
            let excluded: String = row.get(12);
            Ok(AuditRecord {
                at: row.get(0),
                request_id: row.get(1),
                trace_id: row.get(2),
                route: row.get(3),
                model: row.get(4),
                user: row.get(5),
                identity_source: row.get(6),
                roles: row.get(7),
                mode: row.get(8),
                budget: usize::try_from(row.get::<_, i64>(9)).unwrap_or(0),
                tokens: usize::try_from(row.get::<_, i64>(10)).unwrap_or(0),
                included: serde_json::from_str(&included).map_err(unreadable())?,
                excluded: serde_json::from_str(&excluded).map_err(unreadable())?,
                denied: row.get(13),
                servers_failed: row.get(14),
                upstream_status: row.get::<_, Option<i32>>(15).and_then(|s| u16::try_from(s).ok()),
                upstream_ms: row.get(16),
                injection_ms: row.get(17),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(id: &str) -> Arc<[AuditResource]> {
        let r = AuditResource { id: id.into(), sha256: "ab".repeat(32), tokens: 7, truncated: false, passages: false };
        Arc::from(vec![r])
    }

    #[test]
    fn a_nul_is_stored_as_the_replacement_character() {
        assert!(matches!(storable("gpt-4o"), Cow::Borrowed("gpt-4o")));
        assert_eq!(storable("gpt-4o\0x\0"), "gpt-4o\u{FFFD}x\u{FFFD}");
        assert_eq!(storable_all(&["a".into()]), None);
        assert_eq!(storable_all(&["a".into(), "\0".into()]), Some(vec!["a".into(), "\u{FFFD}".into()]));
    }

    #[test]
    fn a_shared_list_is_hashed_once_and_its_digest_is_the_sets() {
        let mut memo = SetDigests::default();
        let (a, b) = (list("d:x://a"), list("d:x://b"));
        let first = memo.of(&a, &[]);
        assert_eq!(first, Set { included: &a, denied: &[] }.digest());
        assert_eq!(memo.of(&a, &[]), first);
        assert_eq!(memo.0.len(), 1, "the same list is not hashed again");
        // An equal list elsewhere has the same digest; another list or other denied ids do not.
        assert_eq!(memo.of(&list("d:x://a"), &[]), first);
        assert_ne!(memo.of(&b, &[]), first);
        let denied = ["d:x://secret".to_owned()];
        assert_ne!(memo.of(&a, &denied), first);
        assert_eq!(memo.of(&a, &denied), Set { included: &a, denied: &denied }.digest());
        for i in 0..200 {
            memo.of(&list(&format!("d:x://{i}")), &[]);
        }
        assert_eq!(memo.0.len(), SetDigests::LEN);
    }
}
