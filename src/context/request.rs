//! One request through the pipeline, as one value read top to bottom:
//!
//! ```text
//! Run::start → warm (the warm memo replays a finished answer) → select →
//! read → compose → finish → (message, Report)
//! ```
//!
//! Each step keeps what it learnt in the [`Run`]; the [`Report`] is
//! assembled once, by [`Run::finish`].

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::memo::{
    CacheStamp, Composed, CompositionInputs, CompositionKey, Connections, WarmCheck, WarmEntry, WarmKey,
};
use super::select::Selection;
use super::{ContextMessage, ContextRequest, McpContext, derived, read, select};
use crate::cache::Origin;
use crate::compose::{Candidate, Composer, DEFAULT_PREAMBLE, Query};
use crate::error::{Error, Result};
use crate::mode::SelectMode;
use crate::policy::{Policy, UserPolicy};
use crate::report::{
    ExcludeReason, Excluded, Report, Semantic, ServerFailure, ServerProtocol, SharedCacheReport, Timings,
};
use crate::resource::Contents;
use crate::tokenize::Tokenizer;

/// A request in progress.
pub(super) struct Run<'a> {
    ctx: &'a McpContext,
    req: &'a ContextRequest,
    query: Option<Query>,
    query_key: Option<String>,
    started: Instant,
    policy: Arc<Policy>,
    listing_generation: u64,
    warm_key: Option<WarmKey>,
}

/// What [`Run::prepare`] settled: the user's policy, the tokenizer and the
/// budget, and the servers' state when the request began.
pub(super) struct Prepared {
    up: UserPolicy,
    model: String,
    tok: Tokenizer,
    budget: usize,
    warnings: Vec<String>,
    failed_servers: Vec<ServerFailure>,
    servers: Vec<ServerProtocol>,
    /// The user's views of per-user servers (`views.rs`), and their states.
    views: super::views::UserViews,
}

/// What [`Run::read`] got.
pub(super) struct Reads {
    /// `(index in the selection, contents)` of every resource read.
    ready: Vec<(usize, Arc<Contents>)>,
    origins: Vec<Origin>,
    stale: HashSet<String>,
    errors: Vec<Excluded>,
    hits: usize,
    misses: usize,
    shared_hits: usize,
    /// The shared cache's state after the reads.
    shared: Option<crate::report::SharedCacheStatus>,
    restarted_servers: Vec<String>,
    stamp: CacheStamp,
    connections: Connections,
}

impl Reads {
    /// How many selected resources the in-process cache answered up front.
    pub(super) fn hits(&self) -> usize {
        self.hits
    }
}

impl<'a> Run<'a> {
    /// Starts `req`, ranking by `query` in relevance mode.
    pub(super) fn start(ctx: &'a McpContext, req: &'a ContextRequest, query: Option<Query>) -> Self {
        let started = Instant::now();
        let policy = ctx.policy();
        let model = req.model.as_deref().unwrap_or(&ctx.settings.model);
        let query_key = query.as_ref().map(Query::key);
        // The warm memo cannot see a per-user view change: off when there are per-user servers.
        let warm_key = (req.selection.is_none() && ctx.views.is_none()).then(|| WarmKey {
            user: req.user.clone(),
            roles: req.roles.clone(),
            source: req.source,
            model: model.to_owned(),
            budget: req.budget,
            select: req.select,
            query: query_key.clone(),
        });
        let listing_generation = ctx.hub.listing_generation();
        Run { ctx, req, query, query_key, started, policy, listing_generation, warm_key }
    }

    /// The warm path: the same request's answer, when nothing it depends on
    /// has changed since it last ran (see `WarmMemo`).
    pub(super) fn warm(&self) -> Option<(Option<ContextMessage>, Report)> {
        let ctx = self.ctx;
        let key = self.warm_key.as_ref()?;
        let now = WarmCheck {
            policy: &self.policy,
            listing_generation: self.listing_generation,
            cache_version: ctx.cache.version(),
            hub: &ctx.hub,
        };
        ctx.warm.replay(key, now, ctx.cache.shared_status(), self.started)
    }

    /// The user's policy, the tokenizer and the budget.
    pub(super) async fn prepare(&self) -> Result<Prepared> {
        let ctx = self.ctx;
        let up = self.policy.for_identity(&self.req.user, &self.req.roles);
        let model = self.req.model.as_deref().unwrap_or(&ctx.settings.model).to_owned();
        let (tok, warning) = ctx.tokenizer(&model).await?;
        let ceiling = self.req.budget.unwrap_or(ctx.settings.max_tokens);
        let budget = up.max_tokens().map_or(ceiling, |b| b.min(ceiling));
        let views = ctx.user_views(&self.req.user).await;
        let mut failed_servers = ctx.hub.failures();
        failed_servers.extend(views.failures.iter().cloned());
        Ok(Prepared {
            up,
            model,
            tok,
            budget,
            warnings: warning.into_iter().collect(),
            failed_servers,
            servers: ctx.hub.protocols(),
            views,
        })
    }

    /// Step 1: who may see what: decided before anything is read. Without a
    /// selection the answer depends only on the user and the listings, so
    /// it is remembered until a listing changes.
    pub(super) fn select(&self, p: &Prepared) -> Arc<Selection> {
        let (ctx, up) = (self.ctx, &p.up);
        // The selection memo is shared by users of one policy entry: not with per-user listings.
        if ctx.views.is_some() {
            return Arc::new(select::select(&ctx.hub, up, self.req.selection.as_deref(), &p.views));
        }
        match &self.req.selection {
            None => ctx.selections.get_or(up.decision_key(), self.listing_generation, &self.policy, || {
                select::select(&ctx.hub, up, None, &p.views)
            }),
            Some(wanted) => Arc::new(select::select(&ctx.hub, up, Some(wanted), &p.views)),
        }
    }

    /// Step 2: reads what is visible, concurrently (cache first).
    pub(super) async fn read(&self, p: &Prepared, selection: &Selection) -> Reads {
        let ctx = self.ctx;
        let selected = &selection.resources;
        let restarts = ctx.hub.restart_mark();
        // Before the lookup: a reconnection after it must void what is built here.
        let connections = Connections::of(&ctx.hub, selected);
        let (reads, hits, stamp) =
            read::read_within_deadline(&ctx.hub, &ctx.cache, ctx.settings.deadline, selected, &self.req.user, &p.views)
                .await;
        let shared_hits = reads.iter().filter(|r| r.as_ref().is_ok_and(|c| c.origin == Origin::Shared)).count();
        let shared = ctx.cache.shared_status();
        let restarted_servers = ctx.hub.restarted_since(restarts);
        let mut ready = Vec::with_capacity(selected.len());
        let mut origins = Vec::with_capacity(selected.len());
        let mut stale = HashSet::new();
        let mut errors = Vec::new();
        for (i, (r, got)) in selected.iter().zip(reads).enumerate() {
            match got {
                Ok(c) => {
                    if c.stale {
                        stale.insert(r.id.to_string());
                    }
                    ready.push((i, c.contents));
                    origins.push(c.origin);
                }
                Err(e) => {
                    if p.views.view(&r.id.server).is_some() && crate::credentials::looks_denied(&e.to_string()) {
                        p.views.mark_denied(&r.id.server);
                    }
                    errors.push(Excluded {
                        id: r.id.to_string(),
                        reason: ExcludeReason::Error,
                        detail: Some(e.to_string()),
                    })
                }
            }
        }
        Reads {
            ready,
            origins,
            stale,
            errors,
            hits,
            misses: selected.len() - hits,
            shared_hits,
            shared,
            restarted_servers,
            stamp,
            connections,
        }
    }

    /// Step 3: renders and fits the budget, off the async runtime (tokenising can
    /// be slow), unless the composition memo holds the same composition.
    /// Also returns how many records of derived data another replica gave.
    pub(super) async fn compose(
        &self,
        p: &Prepared,
        selection: &Arc<Selection>,
        reads: &Reads,
    ) -> Result<(Arc<Composed>, usize)> {
        let ctx = self.ctx;
        let preamble = ctx.settings.preamble.as_deref().unwrap_or(DEFAULT_PREAMBLE);
        let mode = self.mode();
        let inputs = CompositionInputs {
            encoding: p.tok.encoding(),
            preamble,
            budget: p.budget,
            mode,
            query: self.query_key.as_deref(),
            selection,
            ready: &reads.ready,
        };
        if let Some(hit) = ctx.compositions.find(&inputs) {
            return Ok((hit, 0));
        }
        // Token counts and chunks another replica computed for what came
        // from the shared cache (`derived`).
        let mut exchange = {
            let candidates: Vec<_> =
                reads.ready.iter().zip(&reads.origins).map(|((i, c), o)| (&*selection.resources[*i], c, *o)).collect();
            derived::Exchange::fetch(&ctx.cache, &ctx.chunks, &p.tok, &candidates, &self.req.user).await
        };
        let preamble = preamble.to_owned();
        let (tok, budget) = (p.tok, p.budget);
        let cache = ctx.tokens.clone();
        let compositions = ctx.compositions.clone();
        let selection = selection.clone();
        let ready = reads.ready.clone();
        let index = ctx.chunks.clone();
        let forced = self.req.selection.is_some();
        let query = self.query.clone();
        let query_key = self.query_key.clone();
        let (composed, used, offered) = tokio::task::spawn_blocking(move || {
            let items: Vec<Candidate<'_>> = ready
                .iter()
                .map(|(i, c)| Candidate { resource: &selection.resources[*i], contents: c, forced })
                .collect();
            let pairs: Vec<_> = items.iter().map(|c| (c.resource, c.contents)).collect();
            let used = exchange.seed(&tok, &cache, &index, &pairs);
            let composer = Composer { tok: &tok, cache: &cache, index: &index, preamble: &preamble, budget };
            let c = composer.by_mode(&items, mode, query.as_ref());
            let offered = (exchange.export(&tok, &cache, &index, &pairs), exchange);
            drop(pairs);
            let composed = Arc::new(Composed { mode: c.mode, warnings: c.warnings, ..Composed::from(c.composition) });
            drop(items);
            // Ranked before every chunk had its embedding: the same request ranks better once the
            // background embedder is done, so this one is not remembered.
            if composed.semantic != Some(Semantic::Partial) {
                compositions.put(
                    CompositionKey {
                        encoding: tok.encoding(),
                        preamble,
                        budget,
                        mode,
                        query: query_key,
                        selection,
                        ready,
                    },
                    composed.clone(),
                );
            }
            (composed, used, offered)
        })
        .await
        .map_err(Error::task("packing"))?;
        let (records, exchange) = offered;
        exchange.finish(&ctx.cache, used, records, self.req.user.clone());
        Ok((composed, used))
    }

    /// The mode asked for: the request's, else `context.select`.
    fn mode(&self) -> SelectMode {
        self.req.select.unwrap_or(self.ctx.settings.select)
    }

    /// Step 4: the message and the one report of everything above; a request
    /// answered wholly from the cache is remembered for the warm path.
    pub(super) fn finish(
        self,
        p: Prepared,
        selection: &Selection,
        reads: Reads,
        (composed, derived_used): (&Composed, usize),
        (t_select, t_read): (Duration, Duration),
    ) -> (Option<ContextMessage>, Report) {
        let ctx = self.ctx;
        let selected = selection.resources.len();
        let any_read = !reads.ready.is_empty();
        let all_warm = reads.hits == selected && reads.stale.is_empty();
        let message = composed.content.clone().map(|content| ContextMessage {
            role: ctx.settings.role,
            content,
            tokens: composed.tokens,
            derived: composed.derived.clone(),
        });
        let reason = message.is_none().then(|| {
            if selected == 0 {
                "no resource is visible to this user".into()
            } else if !any_read {
                "every visible resource failed to read".into()
            } else {
                format!("nothing fits in the budget of {} tokens", p.budget)
            }
        });
        let mut included = composed.included.clone();
        for i in &mut included {
            i.stale = reads.stale.contains(&i.id);
        }
        let excluded: Vec<Excluded> =
            selection.excluded.iter().cloned().chain(reads.errors).chain(composed.dropped.iter().cloned()).collect();
        let mut warnings = p.warnings;
        warnings.extend(composed.warnings.iter().cloned());
        let total = self.started.elapsed();
        let report = Report {
            user: self.req.user.clone(),
            identity: self.req.source.map(|s| s.as_str().to_owned()),
            roles: p.up.roles().to_vec(),
            model: p.model,
            encoding: p.tok.encoding().to_owned(),
            role: Some(ctx.settings.role),
            mode: any_read.then_some(composed.mode),
            semantic: any_read.then_some(composed.semantic).flatten(),
            budget: p.budget,
            tokens: composed.tokens,
            included: included.into(),
            excluded: excluded.into(),
            failed_servers: p.failed_servers,
            servers: p.servers,
            restarted_servers: reads.restarted_servers,
            auth: p.views.auth.clone(),
            cache_hits: reads.hits,
            cache_misses: reads.misses,
            shared_cache: reads.shared.map(|s| SharedCacheReport {
                up: s.up,
                error: s.error,
                hits: reads.shared_hits,
                derived: derived_used,
            }),
            reason,
            warnings,
            timings: Timings {
                select_ms: ms(t_select),
                read_ms: ms(t_read - t_select),
                pack_ms: ms(total - t_read),
                total_ms: ms(total),
            },
        };
        report.trace();
        // Everything came from the cache: the same request gives the same
        // answer until the cache, the listings, the policy or a connection
        // changes, or one of these entries expires.
        if let Some(key) = self.warm_key
            && all_warm
            && composed.semantic != Some(Semantic::Partial)
        {
            ctx.warm.put(
                key,
                WarmEntry {
                    policy: self.policy,
                    listing_generation: self.listing_generation,
                    stamp: reads.stamp,
                    connections: reads.connections,
                    message: message.clone(),
                    report: report.clone(),
                },
            );
        }
        (message, report)
    }

    /// Time since the request started.
    pub(super) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

pub(super) fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}
