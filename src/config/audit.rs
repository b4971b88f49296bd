//! The `audit:` section: where a record of every injection goes (a JSONL
//! file with size-based rotation, PostgreSQL), how many records may wait for
//! a sink, and whether the ids of denied resources are recorded. May import
//! the config's error helpers, `${VAR}` expansion and the YAML tree.

use std::path::{Path, PathBuf};

use secrecy::SecretString;
use serde::Deserialize;

use super::config_error;
use super::env::{expand_vars, unexpanded};
use crate::cause::redact_url;
use crate::error::Error;
use crate::yaml::Node;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAudit {
    #[serde(default)]
    sinks: Vec<RawSink>,
    queue: Option<usize>,
    batch: Option<usize>,
    denied_ids: Option<bool>,
}

/// One sink: exactly one of its keys.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSink {
    file: Option<RawFile>,
    postgres: Option<RawPostgres>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    path: String,
    max_bytes: Option<u64>,
    keep: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPostgres {
    url: String,
    schema: Option<String>,
    table: Option<String>,
}

/// Default `audit.queue`: records waiting for one sink before new ones are dropped (and counted).
pub const DEFAULT_AUDIT_QUEUE: usize = 10_000;
/// Default `audit.batch`: records written to PostgreSQL in one statement at most.
pub const DEFAULT_AUDIT_BATCH: usize = 256;
/// Default `file.max_bytes` (100 MiB): past it the file is rotated.
pub const DEFAULT_AUDIT_FILE_MAX_BYTES: u64 = 100 << 20;
/// Default `file.keep`: rotated files kept (`PATH.1` newest … `PATH.keep` oldest).
pub const DEFAULT_AUDIT_FILE_KEEP: usize = 5;
/// Default `postgres.schema`.
pub const DEFAULT_AUDIT_SCHEMA: &str = "public";
/// Default `postgres.table`.
pub const DEFAULT_AUDIT_TABLE: &str = "mcp_context_audit";

/// Where audit records go.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AuditSink {
    /// One JSON object per line, appended; rotated by size. Made mode 0600
    /// (owner only) when it does not exist; an existing file keeps its mode.
    File {
        /// The file (relative paths resolve against the config's folder).
        path: PathBuf,
        /// Past this size the file becomes `PATH.1` (older ones shift up).
        max_bytes: u64,
        /// Rotated files kept; `0` keeps none (the full file is removed).
        keep: usize,
    },
    /// A PostgreSQL table, created (or migrated) on start, written in batches.
    Postgres {
        /// `postgres://user:password@host:port/db`; may carry a password, so held as a secret.
        url: SecretString,
        /// The schema of the table (created if missing).
        schema: String,
        /// The table.
        table: String,
    },
}

impl AuditSink {
    /// A short name for metrics and `/readyz`: `file` or `postgres`.
    pub fn kind(&self) -> &'static str {
        match self {
            AuditSink::File { .. } => "file",
            AuditSink::Postgres { .. } => "postgres",
        }
    }
}

/// The `audit:` section. Without sinks nothing is recorded.
#[derive(Debug, Clone)]
pub struct AuditSettings {
    /// Where records go; each gets every record.
    pub sinks: Vec<AuditSink>,
    /// Records waiting for one sink; past it new records are dropped and counted.
    pub queue: usize,
    /// Records per PostgreSQL insert at most.
    pub batch: usize,
    /// Record the ids of denied resources (operator only; default true).
    pub denied_ids: bool,
}

impl Default for AuditSettings {
    fn default() -> Self {
        Self { sinks: Vec::new(), queue: DEFAULT_AUDIT_QUEUE, batch: DEFAULT_AUDIT_BATCH, denied_ids: true }
    }
}

/// A SQL identifier we accept: letters, digits and `_`, not starting with a digit, at most 63 bytes.
fn identifier(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !s.as_bytes()[0].is_ascii_digit()
}

/// Validates the `audit:` section, reporting every problem.
pub(super) fn settings(
    raw: RawAudit,
    node: &Node,
    path: &Path,
    base: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> std::result::Result<AuditSettings, Vec<Error>> {
    let mut errors = Vec::new();
    let at = |n: Option<&Node>| n.map_or(node.pos, |n| n.pos);
    let d = AuditSettings::default();
    let items = node.get("sinks").map(|n| n.items()).unwrap_or_default();
    let mut sinks = Vec::new();
    for (i, s) in raw.sinks.into_iter().enumerate() {
        let item = items.get(i);
        let err =
            |key: &str, message: String| config_error(path, Some(at(item.and_then(|n| n.get(key)).or(item))), message);
        match (s.file, s.postgres) {
            (Some(f), None) => {
                if f.path.is_empty() {
                    errors.push(err("file", "audit.sinks: `file.path` is empty".into()));
                    continue;
                }
                if f.max_bytes == Some(0) {
                    errors.push(err("file", "audit.sinks: `file.max_bytes` must be at least 1".into()));
                }
                sinks.push(AuditSink::File {
                    path: base.join(&f.path),
                    max_bytes: f.max_bytes.unwrap_or(DEFAULT_AUDIT_FILE_MAX_BYTES),
                    keep: f.keep.unwrap_or(DEFAULT_AUDIT_FILE_KEEP),
                });
            }
            (None, Some(p)) => {
                let url = match expand_vars(&p.url, env) {
                    Ok(u) => u,
                    Err(token) => {
                        errors.push(err("postgres", format!("audit.sinks: postgres.url: {}", unexpanded(&token))));
                        continue;
                    }
                };
                if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                    errors.push(err(
                        "postgres",
                        format!("audit.sinks: postgres.url must start with postgres:// (got `{}`)", redact_url(&url)),
                    ));
                }
                if !cfg!(feature = "postgres") {
                    errors.push(err(
                        "postgres",
                        "audit.sinks: this build has no PostgreSQL support (feature `postgres`)".into(),
                    ));
                }
                let schema = p.schema.unwrap_or_else(|| DEFAULT_AUDIT_SCHEMA.into());
                let table = p.table.unwrap_or_else(|| DEFAULT_AUDIT_TABLE.into());
                for (what, v) in [("schema", &schema), ("table", &table)] {
                    if !identifier(v) {
                        errors.push(err(
                            "postgres",
                            format!(
                                "audit.sinks: postgres.{what} `{}` must be letters, digits and `_` (not first), \
                                 at most 63 bytes",
                                v.escape_debug()
                            ),
                        ));
                    }
                }
                sinks.push(AuditSink::Postgres { url: url.into(), schema, table });
            }
            _ => errors.push(err("file", "audit.sinks: each sink is either `file:` or `postgres:`".into())),
        }
    }
    let positive = |key: &str, v: Option<usize>, default: usize, errors: &mut Vec<Error>| match v {
        Some(0) => {
            errors.push(config_error(path, Some(at(node.get(key))), format!("audit.{key} must be at least 1")));
            default
        }
        Some(v) => v,
        None => default,
    };
    let queue = positive("queue", raw.queue, d.queue, &mut errors);
    let batch = positive("batch", raw.batch, d.batch, &mut errors);
    if errors.is_empty() {
        Ok(AuditSettings { sinks, queue, batch, denied_ids: raw.denied_ids.unwrap_or(d.denied_ids) })
    } else {
        Err(errors)
    }
}
