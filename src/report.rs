//! The record of one injection: what was included, truncated or left out,
//! and why. The CLI, the chatbot, tracing and the tests all read this one
//! value; nothing else describes what happened.
//!
//! Layer: bottom. Imports only `mode` (the two choices it records) and
//! `display` (the table escapes what servers named).

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use crate::display::escape;
use crate::mode::{MessageRole, SelectMode};

/// One included chunk, for the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ChunkReport {
    /// Its position in the resource, from 0.
    pub index: usize,
    /// How many chunks the resource has.
    pub count: usize,
    /// Its tokens.
    pub tokens: usize,
    /// Its combined score (see the module docs), rounded to 3 decimals.
    pub score: f64,
    /// Its BM25 against the query, rounded to 3 decimals.
    pub lexical: f64,
    /// Its cosine similarity with the query by the built-in embedding model, rounded to 3
    /// decimals; absent when semantic ranking is off or this chunk has no vector yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub semantic: Option<f64>,
}

/// Whether relevance mode ranked with the embedding model too (`context.semantic`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Semantic {
    /// Every ranked chunk had its vector: BM25 and cosine similarity together.
    On,
    /// Some chunks were not embedded yet (the background embedder is at them): those ranked by
    /// BM25 alone, the others by both. The request did not wait.
    Partial,
    /// `context.semantic: off`: BM25 alone.
    Off,
    /// This build has no embedding model (cargo feature `semantic` left out): BM25 alone.
    NotBuilt,
}

impl fmt::Display for Semantic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Semantic::On => "on",
            Semantic::Partial => "partial",
            Semantic::Off => "off",
            Semantic::NotBuilt => "not built",
        })
    }
}

/// What both shared lists offer: a slice's view (`$slice`, of the list
/// `$s`), collecting one, and iterating by reference.
macro_rules! shared_list {
    ($list:ident, $item:ident, |$s:ident| $slice:expr) => {
        impl std::ops::Deref for $list {
            type Target = [$item];
            fn deref(&self) -> &[$item] {
                let $s = self;
                $slice
            }
        }

        impl FromIterator<$item> for $list {
            fn from_iter<I: IntoIterator<Item = $item>>(iter: I) -> Self {
                Self::from(iter.into_iter().collect::<Vec<_>>())
            }
        }

        impl<'a> IntoIterator for &'a $list {
            type Item = &'a $item;
            type IntoIter = std::slice::Iter<'a, $item>;
            fn into_iter(self) -> Self::IntoIter {
                self.iter()
            }
        }
    };
}

/// The resources in a [`Report`]'s message, in message order: a list (it
/// dereferences to `[Included]`, and serializes as one), shared like
/// [`Exclusions`], so the warm path's copy of a remembered report copies
/// no entry.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Inclusions(Arc<Vec<Included>>);

impl From<Vec<Included>> for Inclusions {
    fn from(v: Vec<Included>) -> Self {
        Inclusions(Arc::new(v))
    }
}

shared_list!(Inclusions, Included, |list| &list.0);

/// The resources a [`Report`] left out: a list (it dereferences to
/// `[Excluded]`, and serializes as one). Shared: an unchanged request hands
/// out the list remembered with its message instead of copying it (with a
/// thousand visible resources and a small budget it is most of the report),
/// so cloning a report is cheap. The count for each reason is kept with the
/// list, so the proxy's header, metrics and audit record do not walk a
/// thousand entries a request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exclusions(Arc<ExclusionList>);

#[derive(Debug, Clone, Default, PartialEq)]
struct ExclusionList {
    items: Vec<Excluded>,
    /// By [`ExcludeReason::index`].
    counts: [usize; ExcludeReason::COUNT],
}

impl ExclusionList {
    fn of(items: Vec<Excluded>) -> Self {
        let mut counts = [0; ExcludeReason::COUNT];
        for e in &items {
            counts[e.reason.index()] += 1;
        }
        Self { items, counts }
    }
}

impl Serialize for Exclusions {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.items.serialize(s)
    }
}

impl From<Vec<Excluded>> for Exclusions {
    fn from(v: Vec<Excluded>) -> Self {
        Exclusions(Arc::new(ExclusionList::of(v)))
    }
}

shared_list!(Exclusions, Excluded, |list| &list.0.items);

impl Exclusions {
    /// How many were left out for `reason`.
    pub fn count(&self, reason: ExcludeReason) -> usize {
        self.0.counts[reason.index()]
    }

    /// Adds one (copying the list only if it is shared).
    #[cfg(test)]
    pub(crate) fn push(&mut self, e: Excluded) {
        let list = Arc::make_mut(&mut self.0);
        list.counts[e.reason.index()] += 1;
        list.items.push(e);
    }
}

/// The shared cache (`cache.backend: redis`) as one request saw it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct SharedCacheReport {
    /// Whether Redis answered and the event subscription was up.
    pub up: bool,
    /// Why it is down (requests go on without it meanwhile).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Resources of this request answered from Redis (another replica's
    /// read) instead of their server.
    pub hits: usize,
    /// Resources of this request whose token counts (and chunks, in
    /// relevance mode) came from Redis, computed by another replica.
    pub derived: usize,
}

/// The state of the shared cache of one process, for `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct SharedCacheStatus {
    /// Whether Redis answered the last command and the event subscription
    /// is up.
    pub up: bool,
    /// Why it is down (the cause, with the URL's credentials removed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Reads answered from Redis instead of the MCP server.
    pub hits: u64,
    /// Token counts and chunks computed by another replica and used here
    /// instead of tokenising again (one per resource).
    pub derived_hits: u64,
    /// Token counts and chunks this replica stored for the others.
    pub derived_stored: u64,
    /// Commands that failed or timed out.
    pub errors: u64,
    /// Invalidations this replica published (changes it learnt of itself).
    pub invalidations_sent: u64,
    /// Invalidations received from other replicas.
    pub invalidations_received: u64,
}

/// A server that could not be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ServerFailure {
    /// The server name.
    pub server: String,
    /// What went wrong.
    pub error: String,
}

/// The MCP revision one connected server speaks (the report's server section).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ServerProtocol {
    /// The server name.
    pub server: String,
    /// The negotiated revision, e.g. `2026-07-28` or `2025-11-25`.
    pub protocol: String,
}

/// Why a resource is not in the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ExcludeReason {
    /// The user's policy does not allow it (it was never read).
    Denied,
    /// `annotations.audience` names only the human user.
    Audience,
    /// It did not fit in the token budget.
    Budget,
    /// Reading it failed.
    Error,
    /// It was requested (selected, mentioned, included) but the server does
    /// not offer it: not listed, not an expansion of a listed template, not a
    /// policy include, or spelled so that a server could read something
    /// else (see [`admit`](crate::access::admit)). It was never read.
    NotFound,
}

impl ExcludeReason {
    /// Every reason, in [`Self::index`] order.
    pub(crate) const ALL: [ExcludeReason; 5] = [
        ExcludeReason::Denied,
        ExcludeReason::Audience,
        ExcludeReason::Budget,
        ExcludeReason::Error,
        ExcludeReason::NotFound,
    ];
    const COUNT: usize = Self::ALL.len();

    /// Its place among [`Self::COUNT`].
    fn index(self) -> usize {
        match self {
            ExcludeReason::Denied => 0,
            ExcludeReason::Audience => 1,
            ExcludeReason::Budget => 2,
            ExcludeReason::Error => 3,
            ExcludeReason::NotFound => 4,
        }
    }
}

impl fmt::Display for ExcludeReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ExcludeReason::Denied => "denied",
            ExcludeReason::Audience => "audience",
            ExcludeReason::Budget => "budget",
            ExcludeReason::Error => "error",
            ExcludeReason::NotFound => "not found",
        })
    }
}

/// A resource in the message.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Included {
    /// `server:uri`.
    pub id: String,
    /// Tokens its block adds to the message.
    pub tokens: usize,
    /// Whether its text was cut to fit.
    pub truncated: bool,
    /// Served from the cache after a failed re-read (`serve_stale`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub stale: bool,
    /// The chunks it shows, when relevance mode chose passages of it;
    /// absent when it went in whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chunks: Option<Vec<ChunkReport>>,
}

/// A resource left out.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Excluded {
    /// `server:uri`.
    pub id: String,
    /// Why.
    pub reason: ExcludeReason,
    /// Details for the operator (the deciding rule, the error, the sizes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Where the time went, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Timings {
    /// Policy and selection.
    pub select_ms: f64,
    /// Reading (cache or servers).
    pub read_ms: f64,
    /// Rendering, counting and packing.
    pub pack_ms: f64,
    /// Everything.
    pub total_ms: f64,
}

/// One per-user server's state for the user of a request (the report's
/// `auth` list, `serve`'s `x-mcp-context-auth` header and its metrics).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct UpstreamAuth {
    /// The server.
    pub server: String,
    /// `connected`, `needs_authorization`, `token_expired`, `denied_by_server` or `auth_timeout`.
    pub state: String,
    /// For `needs_authorization`: where to connect (serve's
    /// `/auth/{server}/start`, or the CLI command to run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

impl UpstreamAuth {
    /// `server`'s state, with where to connect when there is somewhere.
    pub fn new(server: impl Into<String>, state: impl Into<String>, url: Option<String>) -> Self {
        UpstreamAuth { server: server.into(), state: state.into(), url }
    }
}

/// What one injection did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Report {
    /// The user the context was built for.
    pub user: String,
    /// How the user was identified (`jwt`, `key`, `header`, `body`,
    /// `anonymous`, `application`), when the caller said
    /// ([`ContextRequest::with_identity`](crate::ContextRequest::with_identity), the proxy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// The roles the policy was applied with: the user's entry's plus the
    /// identity provider's, or `default_roles`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
    /// The model whose tokenizer counted.
    pub model: String,
    /// The tokenizer's encoding.
    pub encoding: String,
    /// Role of the injected message.
    pub role: Option<MessageRole>,
    /// How resources were chosen: `priority` or `relevance` (what `auto`
    /// resolved to); absent when nothing was composed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<SelectMode>,
    /// In relevance mode: whether the embedding model ranked too (`on`, `partial`, `off`,
    /// `not_built`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub semantic: Option<Semantic>,
    /// The budget applied (after the user's policy and the ceiling).
    pub budget: usize,
    /// Exact token count of the message content (0 when nothing is injected).
    pub tokens: usize,
    /// In the message, in message order.
    pub included: Inclusions,
    /// Left out, with the reason for each.
    pub excluded: Exclusions,
    /// Servers that could not be used, or whose listing is incomplete.
    pub failed_servers: Vec<ServerFailure>,
    /// The revision each connected server speaks.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<ServerProtocol>,
    /// Servers whose connection was re-established during this request
    /// (their process had ended); their subscriptions were renewed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub restarted_servers: Vec<String>,
    /// Per-user servers (`auth:` other than static): this user's state with
    /// each (`connected`, `needs_authorization` with where to connect,
    /// `token_expired`, `denied_by_server`). A server not connected for
    /// the user is left out of this injection; the others go on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub auth: Vec<UpstreamAuth>,
    /// Visible resources answered from the content cache without a read.
    pub cache_hits: usize,
    /// Visible resources that had to be read from their server (or, with
    /// the shared cache, from Redis: see `shared_cache.hits`).
    pub cache_misses: usize,
    /// The shared cache, with `cache.backend: redis`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_cache: Option<SharedCacheReport>,
    /// Why nothing was injected, when nothing was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Anything else worth knowing (e.g. unknown model, tokenizer fallback).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Where the time went.
    pub timings: Timings,
}

impl Report {
    /// Whether a message was injected.
    pub fn injected(&self) -> bool {
        !self.included.is_empty()
    }

    /// The exclusion of one id, if any.
    pub fn excluded(&self, id: &str) -> Option<&Excluded> {
        self.excluded.iter().find(|e| e.id == id)
    }

    /// Emits the report as tracing events (one summary, one per exclusion).
    pub(crate) fn trace(&self) {
        tracing::info!(
            user = ?self.user,
            tokens = self.tokens,
            budget = self.budget,
            included = self.included.len(),
            excluded = self.excluded.len(),
            failed_servers = self.failed_servers.len(),
            total_ms = self.timings.total_ms,
            "context built"
        );
        // Asked once, not for each of a thousand entries.
        if tracing::enabled!(tracing::Level::DEBUG) {
            for e in self.excluded.iter() {
                tracing::debug!(id = %e.id, reason = %e.reason, detail = e.detail.as_deref().unwrap_or(""), "excluded");
            }
        }
        for f in &self.failed_servers {
            // The failure is in the report that the caller shows; a warning
            // here would print it a second time.
            tracing::info!(server = %f.server, error = %f.error, "server failed");
        }
    }
}

/// A readable table, as `mcp-context preview` prints on stderr. What
/// servers and callers named (ids, details, errors, the user, warnings) is
/// escaped ([`escape`]): one line per entry, nothing a terminal would run.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "user {}  model {} ({})  tokens {}/{}  in {:.1} ms{}",
            escape(&self.user),
            escape(&self.model),
            self.encoding,
            self.tokens,
            self.budget,
            self.timings.total_ms,
            self.mode.map(|m| format!("  mode {m}")).unwrap_or_default()
                + &self.semantic.map(|s| format!("  semantic {s}")).unwrap_or_default()
        )?;
        let included: Vec<Cow<'_, str>> = self.included.iter().map(|i| escape(&i.id)).collect();
        let excluded: Vec<Cow<'_, str>> = self.excluded.iter().map(|e| escape(&e.id)).collect();
        let width = included.iter().chain(&excluded).map(|id| id.chars().count()).max().unwrap_or(2).max(2);
        writeln!(f, "  {:<10} {:<width$} {:>7}  detail", "status", "id", "tokens")?;
        for (i, id) in self.included.iter().zip(&included) {
            let status = if i.truncated {
                "truncated"
            } else if i.chunks.is_some() {
                "passages"
            } else {
                "included"
            };
            let mut detail = if i.stale { "stale (last good content)".to_owned() } else { String::new() };
            if let Some(chunks) = &i.chunks {
                let count = chunks.first().map_or(0, |c| c.count);
                let list: Vec<String> = chunks
                    .iter()
                    .map(|c| {
                        let semantic = c.semantic.map(|s| format!(", cosine {s:.2}")).unwrap_or_default();
                        format!(
                            "#{} ({} tokens, score {:.2}, bm25 {:.2}{semantic})",
                            c.index, c.tokens, c.score, c.lexical
                        )
                    })
                    .collect();
                detail = format!("chunks of {count}: {}{}", list.join(", "), if detail.is_empty() { "" } else { "; " })
                    + &detail;
            }
            writeln!(f, "  {status:<10} {id:<width$} {:>7}  {detail}", i.tokens)?;
        }
        for (e, id) in self.excluded.iter().zip(&excluded) {
            let detail = escape(e.detail.as_deref().unwrap_or(""));
            writeln!(f, "  {:<10} {id:<width$} {:>7}  {detail}", e.reason.to_string(), "-")?;
        }
        for s in &self.failed_servers {
            writeln!(f, "  server {} failed: {}", s.server, escape(&s.error))?;
        }
        for s in &self.restarted_servers {
            writeln!(f, "  server {s} was restarted (its process had ended)")?;
        }
        if !self.servers.is_empty() {
            let list: Vec<String> =
                self.servers.iter().map(|s| format!("{} {}", s.server, escape(&s.protocol))).collect();
            writeln!(f, "  servers: {}", list.join(", "))?;
        }
        if let Some(SharedCacheReport { up: false, error, .. }) = &self.shared_cache {
            writeln!(f, "  shared cache down: {}", escape(error.as_deref().unwrap_or("unknown cause")))?;
        }
        for w in &self.warnings {
            writeln!(f, "  warning: {}", escape(w))?;
        }
        if let Some(r) = &self.reason {
            writeln!(f, "  nothing injected: {}", escape(r))?;
        }
        Ok(())
    }
}
