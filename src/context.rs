//! The orchestrator: one request through the pipeline.
//!
//! ```text
//! registry snapshot → policy (decide before reading) → select (audience,
//! priority, mentions) → read (cache → hub, concurrent) → render → budget →
//! message; every stage adds to one Report
//! ```
//!
//! Ordering: `annotations.priority` high to low, a **missing priority counts
//! as 0.5** (the middle of the spec's 0..1 range: an unannotated resource is
//! neither promoted nor demoted), then server order in the config, then URI.

use std::sync::Arc;
use std::time::Instant;

use async_openai::types::chat::CreateChatCompletionRequest;

use crate::budget::{DEFAULT_MIN_USEFUL_TOKENS, PackInput, Packed, TokenCache, Tokenizer, pack, pack_in_place};
use crate::cache::ContentCache;
use crate::config::{Config, ContextSettings, MessageRole};
use crate::error::{Error, Result};
use crate::gate::{Admitted, Refusal, admit};
use crate::hub::Hub;
use crate::id::ResourceId;
use crate::inject::inject_message;
use crate::policy::{DecisionKey, Policy, UserPolicy};
use crate::relevance::{Candidate, ChunkIndex, Query, SelectMode, compose_with_mode};
use crate::render::DEFAULT_PREAMBLE;
use crate::report::{ExcludeReason, Excluded, Included, Report, Timings};
use crate::resource::{Contents, Resource};
use crate::tools::ResourceTools;

/// How a refused requested URI is reported: exactly like one that does not
/// exist, whatever the reason (the reason is for `policy explain` and tracing).
fn not_found(id: &ResourceId) -> Excluded {
    Excluded { id: id.to_string(), reason: ExcludeReason::NotFound, detail: Some(Refusal::NOT_FOUND.into()) }
}

/// Priority given to resources that carry none.
pub const DEFAULT_PRIORITY: f32 = 0.5;

/// What to build the context for.
#[derive(Debug, Clone, Default)]
pub struct ContextRequest {
    /// The user whose policy applies.
    pub user: String,
    /// Restrict to these resources (as `@server:uri` mentions do); they must
    /// still be visible to the user.
    pub selection: Option<Vec<ResourceId>>,
    /// Override the budget (still capped by `context.max_tokens`... unless
    /// this is the CLI's `--budget`, which *is* the ceiling).
    pub budget: Option<usize>,
    /// Count with this model's tokenizer instead of the configured one.
    pub model: Option<String>,
    /// What the conversation asks, for relevance mode. `None` takes it from
    /// the chat request ([`Query::from_chat`]) when there is one.
    pub query: Option<String>,
    /// Override `context.select` for this request.
    pub select: Option<SelectMode>,
}

impl ContextRequest {
    /// A request for `user` with everything else from the config.
    pub fn for_user(user: impl Into<String>) -> Self {
        Self { user: user.into(), ..Self::default() }
    }
}

/// A user name is a request with everything else from the config, so the
/// calls that take `impl Into<ContextRequest>` accept `"alice"` directly.
impl From<&str> for ContextRequest {
    fn from(user: &str) -> Self {
        Self::for_user(user)
    }
}

impl From<String> for ContextRequest {
    fn from(user: String) -> Self {
        Self::for_user(user)
    }
}

impl From<&String> for ContextRequest {
    fn from(user: &String) -> Self {
        Self::for_user(user.as_str())
    }
}

impl From<&ContextRequest> for ContextRequest {
    fn from(req: &ContextRequest) -> Self {
        req.clone()
    }
}

/// The message to inject.
#[derive(Debug, Clone, PartialEq)]
pub struct ContextMessage {
    /// `system` or `developer`.
    pub role: MessageRole,
    /// The text, shared with the engine's memo of recent compositions: an
    /// unchanged request hands out the same message without copying it (a
    /// message with everything in it is as large as all the contents).
    pub content: Arc<String>,
    /// Its exact token count.
    pub tokens: usize,
}

/// The context engine: the hub, the policy, the tokenizer and the caches,
/// shared by every request. Cheap to share behind an `Arc`.
pub struct McpContext {
    hub: Hub,
    /// Swapped whole by [`McpContext::set_policy`]; a request takes one
    /// `Arc` at its start and decides everything under it.
    policy: std::sync::RwLock<Arc<Policy>>,
    settings: ContextSettings,
    tokens: Arc<TokenCache>,
    cache: ContentCache,
    compositions: Arc<CompositionMemo>,
    selections: SelectionMemo,
    warm: WarmMemo,
    chunks: Arc<ChunkIndex>,
    tokenizers: std::sync::Mutex<std::collections::HashMap<String, (Tokenizer, Option<String>)>>,
}

impl McpContext {
    /// Loads the policy named by the config (failing closed on any policy
    /// error), then connects to every server.
    pub async fn from_config(config: &Config) -> Result<Self> {
        // Parsing and compiling an organisation's policy is CPU work: keep it off the runtime.
        let policy = match config.policy.clone() {
            Some(p) => tokio::task::spawn_blocking(move || Policy::load(&p))
                .await
                .map_err(|e| Error::Other(format!("policy loading failed: {e}")))??,
            None => Policy::allow_all(),
        };
        Ok(Self::with_policy(config, policy).await)
    }

    /// Like [`McpContext::from_config`] with a policy given directly.
    pub async fn with_policy(config: &Config, policy: Policy) -> Self {
        // Build the tokenizer once, off the runtime (0.2-0.7 s the first time).
        let model = config.context.model.clone();
        let warm = tokio::task::spawn_blocking(move || {
            let _ = Tokenizer::for_model(&model);
        });
        let hub = Hub::connect(config).await;
        let _ = warm.await;
        let cache = ContentCache::new(hub.clone(), config);
        Self {
            hub,
            policy: std::sync::RwLock::new(Arc::new(policy)),
            settings: config.context.clone(),
            tokens: Arc::default(),
            cache,
            compositions: Arc::default(),
            selections: SelectionMemo::default(),
            warm: WarmMemo::default(),
            chunks: Arc::new(ChunkIndex::new(config.context.chunk_tokens, config.context.chunk_overlap)),
            tokenizers: std::sync::Mutex::default(),
        }
    }

    /// The connections.
    pub fn hub(&self) -> &Hub {
        &self.hub
    }

    /// The policy in force (a snapshot: a later [`McpContext::set_policy`]
    /// does not change the one returned here).
    pub fn policy(&self) -> Arc<Policy> {
        self.policy.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the policy for every later request (a reload: `serve` calls
    /// it on SIGHUP with a policy that has already loaded without error, so
    /// an invalid file never replaces a good one). Requests already running
    /// finish under the policy they started with.
    pub fn set_policy(&self, policy: Policy) {
        *self.policy.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(policy);
        // Remembered selections were decided under the old policy.
        self.selections.clear();
        self.warm.clear();
    }

    /// The `context:` settings.
    pub fn settings(&self) -> &ContextSettings {
        &self.settings
    }

    /// Token counts remembered by content, shared with tool results.
    pub(crate) fn token_cache(&self) -> Arc<TokenCache> {
        self.tokens.clone()
    }

    /// The model-driven tools (`list_mcp_resources`, `read_mcp_resource`)
    /// over this engine.
    pub fn tools(&self) -> ResourceTools<'_> {
        ResourceTools::new(self)
    }

    /// Reads one requested resource for `user` as the model's read tool does:
    /// the gate, then the policy, then the cache. `Ok(None)` means "not
    /// found" in every sense a caller must not tell apart: refused by the
    /// gate, denied by the policy (never read), or absent on the server.
    pub async fn read_for(&self, user: &str, id: &ResourceId) -> Result<Option<(Arc<Resource>, Arc<Contents>)>> {
        // One policy snapshot for the gate and the decision.
        let up = self.policy().for_user(user);
        let Ok(admitted) = admit(&self.hub, &up, id) else { return Ok(None) };
        if !up.decide(&admitted.resource).allowed {
            return Ok(None);
        }
        match self.cache.read(&admitted.resource.id, user).await {
            Ok(c) => Ok(Some((admitted.resource, c.contents))),
            Err(Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Entries in the content cache (all users).
    pub fn cached_entries(&self) -> usize {
        self.cache.len()
    }

    /// Listed resources (plus the user's policy includes) that `user` may
    /// see, in listing order. Nothing is read.
    pub fn visible_resources(&self, user: &str) -> Vec<Resource> {
        let up = self.policy().for_user(user);
        self.candidates(&up).0.into_iter().filter(|r| up.decide(r).allowed).map(Arc::unwrap_or_clone).collect()
    }

    /// Passes a requested `server:uri` through the gate for `user` (see
    /// [`admit`]); the policy still has to decide on the admitted resource.
    pub fn admit(&self, user: &str, id: &ResourceId) -> std::result::Result<Admitted, Refusal> {
        admit(&self.hub, &self.policy().for_user(user), id)
    }

    /// Every listed resource plus the user's policy includes that pass the
    /// gate; the includes it refuses come back apart, for the report.
    fn candidates(&self, up: &UserPolicy) -> (Vec<Arc<Resource>>, Vec<Excluded>) {
        let mut all = self.hub.resources_shared();
        let mut refused = Vec::new();
        for inc in up.includes() {
            match admit(&self.hub, up, inc) {
                Ok(a) => {
                    if !all.iter().any(|r| r.id == a.resource.id) {
                        all.push(a.resource);
                    }
                }
                Err(why) => {
                    tracing::warn!(user = up.user(), include = %inc, reason = %why, "policy include refused by the gate");
                    refused.push(not_found(inc));
                }
            }
        }
        (all, refused)
    }

    /// Builds the context message for a request. `Ok((None, report))` when
    /// nothing is to be injected (the report says why).
    pub async fn build(&self, req: &ContextRequest) -> Result<(Option<ContextMessage>, Report)> {
        self.build_for(req, req.query.as_deref().map(Query::text)).await
    }

    /// [`McpContext::build`] ranking by `query` (relevance mode).
    async fn build_for(&self, req: &ContextRequest, query: Option<Query>) -> Result<(Option<ContextMessage>, Report)> {
        let started = Instant::now();
        let policy = self.policy();
        let model = req.model.as_deref().unwrap_or(&self.settings.model);
        let query_key = query.as_ref().map(Query::key);
        // The warm path: nothing this request depends on has changed since
        // the same request last ran (see `WarmMemo`).
        let warm_key = req.selection.is_none().then(|| WarmKey {
            user: req.user.clone(),
            model: model.to_owned(),
            budget: req.budget,
            select: req.select,
            query: query_key.clone(),
        });
        let listing_generation = self.hub.listing_generation();
        if let Some(key) = &warm_key
            && let Some((message, mut report)) =
                self.warm.get(key, &policy, listing_generation, self.cache.version(), &self.hub)
        {
            report.failed_servers = self.hub.failures();
            let total = ms(started.elapsed());
            report.timings = Timings { select_ms: 0.0, read_ms: 0.0, pack_ms: 0.0, total_ms: total };
            report.trace();
            return Ok((message, report));
        }
        let up = policy.for_user(&req.user);
        let model = model.to_owned();
        let (tok, warning) = self.tokenizer(&model).await?;
        let ceiling = req.budget.unwrap_or(self.settings.max_tokens);
        let budget = up.max_tokens().map_or(ceiling, |b| b.min(ceiling));
        let mut report = Report {
            user: req.user.clone(),
            model,
            encoding: tok.encoding().to_owned(),
            role: Some(self.settings.role),
            budget,
            failed_servers: self.hub.failures(),
            warnings: warning.into_iter().collect(),
            ..Report::default()
        };

        // 1. Who may see what: decided before anything is read. Without a
        // selection the answer depends only on the user and the listings, so
        // it is remembered until a listing changes.
        let selection = match &req.selection {
            None => self.selections.get_or(up.decision_key(), listing_generation, &policy, || self.select(&up, None)),
            Some(wanted) => Arc::new(self.select(&up, Some(wanted))),
        };
        Arc::make_mut(&mut report.excluded).extend(selection.excluded.iter().cloned());
        let selected = &selection.resources;
        let t_select = started.elapsed();
        let any_selected = !selected.is_empty();

        // 2. Read what is visible, concurrently (cache first).
        let restarts_before: Vec<u32> = self.hub.status().iter().map(|s| s.restarts).collect();
        // Before the lookup: a reconnection after it must void what is built here.
        let connections = Connections::of(&self.hub, selected);
        let (reads, hits, stamp) = self.read_within_deadline(selected, &req.user).await;
        report.cache_hits = hits;
        report.cache_misses = selected.len() - hits;
        for (s, before) in self.hub.status().into_iter().zip(restarts_before) {
            if s.restarts > before {
                report.restarted_servers.push(s.name);
            }
        }
        let t_read = started.elapsed();
        let mut ready = Vec::with_capacity(selected.len());
        let mut stale = std::collections::HashSet::new();
        for (i, (r, got)) in selected.iter().zip(reads).enumerate() {
            match got {
                Ok(c) => {
                    if c.stale {
                        stale.insert(r.id.to_string());
                    }
                    ready.push((i, c.contents));
                }
                Err(e) => Arc::make_mut(&mut report.excluded).push(Excluded {
                    id: r.id.to_string(),
                    reason: ExcludeReason::Error,
                    detail: Some(e.to_string()),
                }),
            }
        }
        let any_read = !ready.is_empty();

        // 3. Render and fit the budget, off the async runtime (tokenising can be slow).
        let preamble = self.settings.preamble.as_deref().unwrap_or(DEFAULT_PREAMBLE);
        let mode = req.select.unwrap_or(self.settings.select);
        let all_warm = hits == selected.len() && stale.is_empty();
        let inputs = CompositionInputs {
            encoding: tok.encoding(),
            preamble,
            budget,
            mode,
            query: query_key.as_deref(),
            selection: &selection,
            ready: &ready,
        };
        let packed = match self.compositions.find(&inputs) {
            Some(hit) => hit,
            None => {
                let preamble = preamble.to_owned();
                let cache = self.tokens.clone();
                let compositions = self.compositions.clone();
                let selection = selection.clone();
                let index = self.chunks.clone();
                let forced = req.selection.is_some();
                tokio::task::spawn_blocking(move || {
                    let items: Vec<Candidate<'_>> = ready
                        .iter()
                        .map(|(i, c)| Candidate { resource: &selection.resources[*i], contents: c, forced })
                        .collect();
                    let c = compose_with_mode(&tok, &cache, &index, &preamble, budget, &items, mode, query.as_ref());
                    let composed =
                        Arc::new(Composed { mode: c.mode, warnings: c.warnings, ..Composed::from(c.composition) });
                    drop(items);
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
                    composed
                })
                .await
                .map_err(|e| Error::Other(format!("packing failed: {e}")))?
            }
        };
        Arc::make_mut(&mut report.excluded).extend(packed.dropped.iter().cloned());
        report.mode = any_read.then_some(packed.mode);
        report.warnings.extend(packed.warnings.iter().cloned());
        report.included = packed.included.clone();
        for i in &mut report.included {
            i.stale = stale.contains(&i.id);
        }
        report.tokens = packed.tokens;
        let message = packed.content.clone().map(|content| ContextMessage {
            role: self.settings.role,
            content,
            tokens: packed.tokens,
        });
        if message.is_none() {
            report.reason = Some(if !any_selected {
                "no resource is visible to this user".into()
            } else if !any_read {
                "every visible resource failed to read".into()
            } else {
                format!("nothing fits in the budget of {budget} tokens")
            });
        }
        let total = started.elapsed();
        report.timings = Timings {
            select_ms: ms(t_select),
            read_ms: ms(t_read - t_select),
            pack_ms: ms(total - t_read),
            total_ms: ms(total),
        };
        report.trace();
        // Everything came from the cache: the same request gives the same
        // answer until the cache, the listings, the policy or a connection
        // changes, or one of these entries expires.
        if let Some(key) = warm_key
            && all_warm
        {
            self.warm.put(
                key,
                WarmEntry {
                    policy,
                    listing_generation,
                    stamp,
                    connections,
                    message: message.clone(),
                    report: report.clone(),
                },
            );
        }
        Ok((message, report))
    }

    /// The tokenizer for a model, loaded off the runtime the first time.
    async fn tokenizer(&self, model: &str) -> Result<(Tokenizer, Option<String>)> {
        if let Some(t) = self.tokenizers.lock().unwrap_or_else(|p| p.into_inner()).get(model) {
            return Ok(t.clone());
        }
        let m = model.to_owned();
        let t = tokio::task::spawn_blocking(move || Tokenizer::for_model(&m))
            .await
            .map_err(|e| Error::Other(format!("tokenizer failed to load: {e}")))?;
        let mut tokenizers = self.tokenizers.lock().unwrap_or_else(|p| p.into_inner());
        // Model names come from callers (a proxy passes the request's own):
        // keep the map bounded whatever they send.
        if tokenizers.len() >= TOKENIZER_MEMO_MODELS {
            tokenizers.clear();
        }
        tokenizers.insert(model.to_owned(), t.clone());
        Ok(t)
    }

    /// The resources this user may see (or the `wanted` ones of them), in
    /// injection order, and what was left out and why.
    fn select(&self, up: &UserPolicy, wanted: Option<&[ResourceId]>) -> Selection {
        let (candidates, mut excluded) = match wanted {
            None => self.candidates(up),
            // Requested ids pass the gate: what is admitted is what the
            // policy decides on below and what is read.
            Some(sel) => {
                let (mut chosen, mut excluded) = (Vec::<Arc<Resource>>::new(), Vec::new());
                for id in sel {
                    match admit(&self.hub, up, id) {
                        Ok(a) if chosen.iter().any(|r| r.id == a.resource.id) => {}
                        Ok(a) => chosen.push(a.resource),
                        Err(Refusal::UnknownServer(server)) => excluded.push(Excluded {
                            id: id.to_string(),
                            reason: ExcludeReason::Error,
                            detail: Some(format!("unknown server `{server}`")),
                        }),
                        Err(why) => {
                            tracing::debug!(user = up.user(), requested = %id, reason = %why, "requested URI refused");
                            excluded.push(not_found(id));
                        }
                    }
                }
                (chosen, excluded)
            }
        };
        let mut selected = Vec::new();
        for r in candidates {
            let d = up.decide(&r);
            if !d.allowed {
                excluded.push(Excluded {
                    id: r.id.to_string(),
                    reason: ExcludeReason::Denied,
                    detail: Some(d.detail()),
                });
            } else if r.is_user_only() {
                excluded.push(Excluded {
                    id: r.id.to_string(),
                    reason: ExcludeReason::Audience,
                    detail: Some("annotations.audience is [user]: meant for the human, not the model".into()),
                });
            } else {
                selected.push(r);
            }
        }
        let order = |r: &Arc<Resource>| self.hub.server_index(&r.id.server).unwrap_or(usize::MAX);
        selected.sort_by(|a, b| {
            let pa = a.annotations.priority.unwrap_or(DEFAULT_PRIORITY);
            let pb = b.annotations.priority.unwrap_or(DEFAULT_PRIORITY);
            pb.total_cmp(&pa).then(order(a).cmp(&order(b))).then_with(|| a.id.uri.cmp(&b.id.uri))
        });
        Selection { resources: selected, excluded }
    }

    /// Reads every selected resource through the cache, concurrently, with
    /// one timer for the whole injection (`deadline_ms`): what is not read by
    /// then is a timeout error for that resource; finished reads are kept.
    /// Also returns how many were answered by the cache up front.
    async fn read_within_deadline(
        &self,
        selected: &[Arc<Resource>],
        user: &str,
    ) -> (Vec<Result<crate::cache::CachedRead>>, usize, CacheStamp) {
        use futures::StreamExt;
        let hits = self.cache.hits(selected.iter().map(|r| &r.id), user);
        let stamp = CacheStamp { version: hits.version, expires: hits.expires };
        let mut results: Vec<Option<Result<crate::cache::CachedRead>>> =
            hits.reads.into_iter().map(|h| h.map(Ok)).collect();
        let hits = results.iter().filter(|r| r.is_some()).count();
        // One window of reads per server, twice its in-flight limit: a read
        // future exists only shortly before it can run (1000 futures created
        // at once held ~1 MB for a 1000-resource gather), and a slow server
        // fills only its own window, never another server's.
        let mut by_server: Vec<(&str, Vec<usize>)> = Vec::new();
        for (i, r) in selected.iter().enumerate().filter(|(i, _)| results[*i].is_none()) {
            match by_server.iter_mut().find(|(s, _)| *s == r.id.server) {
                Some((_, v)) => v.push(i),
                None => by_server.push((&r.id.server, vec![i])),
            }
        }
        let mut pending = futures::stream::select_all(by_server.into_iter().map(|(server, idx)| {
            let window = self
                .hub
                .server_config(server)
                .map_or(crate::config::DEFAULT_MAX_CONCURRENT_READS, |c| c.max_concurrent_reads)
                .max(1)
                * 2;
            futures::stream::iter(idx)
                .map(move |i| async move { (i, self.cache.read(&selected[i].id, user).await) })
                .buffer_unordered(window)
                .boxed()
        }));
        let deadline = tokio::time::sleep(std::time::Duration::from_millis(self.settings.deadline_ms));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                next = pending.next() => match next {
                    Some((i, r)) => results[i] = Some(r),
                    None => break,
                },
                _ = &mut deadline => break,
            }
        }
        let results = results
            .into_iter()
            .zip(selected)
            .map(|(r, res)| {
                r.unwrap_or_else(|| {
                    Err(Error::Timeout {
                        server: res.id.server.clone(),
                        what: format!("resources/read {} (injection deadline)", res.id.uri),
                        after_ms: self.settings.deadline_ms,
                    })
                })
            })
            .collect();
        (results, hits, stamp)
    }

    /// Builds the context and prepends it to `request` (replacing any earlier
    /// copy of ours). `req` is a user name (`"alice"`) or a full
    /// [`ContextRequest`] with a selection or overrides. Nothing is injected
    /// when nothing is visible or fits; the report says why.
    pub async fn inject(
        &self,
        mut request: CreateChatCompletionRequest,
        req: impl Into<ContextRequest>,
    ) -> Result<(CreateChatCompletionRequest, Report)> {
        let mut req = req.into();
        if req.model.is_none() && !request.model.is_empty() {
            req.model = Some(request.model.clone());
        }
        let query = req.query.as_deref().map(Query::text).or_else(|| Query::from_chat(&request));
        let (message, report) = self.build_for(&req, query).await?;
        inject_message(&mut request, message.as_ref().map(|m| m.content.as_str()), self.settings.role);
        Ok((request, report))
    }

    /// Builds the context for `user` and puts it into a Responses API
    /// request's `instructions`, ahead of the caller's own (which are kept,
    /// after ours; see [`compose_instructions`](crate::compose_instructions)).
    /// Call it on every request: `instructions` is not carried over by
    /// `previous_response_id`. Returns the same [`Report`] as
    /// [`McpContext::inject`].
    #[cfg(feature = "responses")]
    pub async fn inject_response(
        &self,
        mut request: async_openai::types::responses::CreateResponse,
        user: &str,
    ) -> Result<(async_openai::types::responses::CreateResponse, Report)> {
        let mut req = ContextRequest::for_user(user);
        req.model = request.model.clone().filter(|m| !m.is_empty());
        let (message, report) = self.build(&req).await?;
        request.instructions = crate::inject::compose_instructions(
            request.instructions.as_deref(),
            message.as_ref().map(|m| m.content.as_str()),
        );
        Ok((request, report))
    }

    /// Ends every server connection. Call before the runtime stops.
    pub async fn close(&self) {
        self.hub.close().await;
    }
}

/// The result of [`compose`].
#[derive(Debug, Clone, PartialEq)]
pub struct Composition {
    /// The message content; `None` when nothing fits.
    pub content: Option<String>,
    /// Exact token count of `content` (0 when `None`).
    pub tokens: usize,
    /// Included resources, in message order.
    pub included: Vec<Included>,
    /// Resources left out for the budget.
    pub dropped: Vec<Excluded>,
}

/// The pure middle of the pipeline, for callers that read resources
/// themselves: renders already-read resources **in the given order** and
/// packs them under `budget` (exact count, preamble included). Token counts
/// are cached in `cache` by content, so a repeated call with unchanged
/// contents tokenises nothing. CPU-bound: call it off the async runtime.
pub fn compose(
    tok: &Tokenizer,
    cache: &TokenCache,
    preamble: &str,
    budget: usize,
    items: &[(&Resource, &Contents)],
) -> Composition {
    let packed: Packed = match pack_in_place(tok, cache, preamble, budget, items) {
        Ok(packed) => packed,
        Err(blocks) => {
            pack(tok, cache, PackInput { preamble, blocks, budget, min_useful_tokens: DEFAULT_MIN_USEFUL_TOKENS })
        }
    };
    Composition {
        content: packed.content,
        tokens: packed.tokens,
        included: packed
            .included
            .into_iter()
            .map(|i| Included {
                id: i.id.to_string(),
                tokens: i.tokens,
                truncated: i.truncated,
                stale: false,
                chunks: None,
            })
            .collect(),
        dropped: packed
            .dropped
            .into_iter()
            .map(|d| Excluded { id: d.id.to_string(), reason: ExcludeReason::Budget, detail: Some(d.detail) })
            .collect(),
    }
}

/// The last few compositions, so an unchanged request (same resources,
/// same read results, same budget) does no rendering or packing at all: the
/// warm path of a host calling the LLM many times a minute. A hit is
/// verified exactly (ids, the very same `Arc`s of contents, listing
/// metadata, budget, encoding, preamble), never by hash alone, so one
/// user's message can never be served for a different set of resources.
#[derive(Default)]
struct CompositionMemo {
    entries: std::sync::Mutex<std::collections::VecDeque<(CompositionKey, Arc<Composed>)>>,
}

/// Compositions remembered (each holds one message, so at most this many
/// budgets' worth of text).
const COMPOSITION_MEMO_SIZE: usize = 8;

/// A [`Composition`] as the memo keeps it: the message shared.
struct Composed {
    content: Option<Arc<String>>,
    tokens: usize,
    included: Vec<Included>,
    dropped: Vec<Excluded>,
    /// The mode that ran (`auto` resolved).
    mode: SelectMode,
    warnings: Vec<String>,
}

impl From<Composition> for Composed {
    fn from(c: Composition) -> Self {
        Self {
            content: c.content.map(Arc::new),
            tokens: c.tokens,
            included: c.included,
            dropped: c.dropped,
            mode: SelectMode::Priority,
            warnings: Vec::new(),
        }
    }
}

/// Who may see what, for one user and one generation of the listings.
struct Selection {
    /// In injection order.
    resources: Vec<Arc<Resource>>,
    excluded: Vec<Excluded>,
}

/// The last selection for each set of grants (the user's own rules, their
/// roles in order, their expanded includes: a [`DecisionKey`]), at most
/// [`SELECTION_MEMO_SIZE`], valid while the hub's listing generation is
/// unchanged; cleared when the policy is replaced ([`McpContext::set_policy`]).
/// Users with the same roles share one entry, so thousands of them cost one
/// evaluation per listing.
#[derive(Default)]
struct SelectionMemo {
    entries: std::sync::Mutex<std::collections::HashMap<DecisionKey, MemoEntry>>,
}

/// A remembered selection: the listing generation and the policy it was made under.
type MemoEntry = (u64, Arc<Policy>, Arc<Selection>);

/// Models whose tokenizer is remembered; past this the memo starts over.
const TOKENIZER_MEMO_MODELS: usize = 32;

/// Grant sets whose selection is remembered; past this the memo starts over.
const SELECTION_MEMO_SIZE: usize = 64;

impl SelectionMemo {
    fn clear(&self) {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// The remembered selection, if it was made for this listing generation
    /// under this very policy (a request racing a reload cannot leave an old
    /// policy's selection behind).
    fn get_or(
        &self,
        key: DecisionKey,
        generation: u64,
        policy: &Arc<Policy>,
        make: impl FnOnce() -> Selection,
    ) -> Arc<Selection> {
        if let Some((g, p, sel)) = self.entries.lock().unwrap_or_else(|p| p.into_inner()).get(&key)
            && *g == generation
            && Arc::ptr_eq(p, policy)
        {
            return sel.clone();
        }
        let sel = Arc::new(make());
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= SELECTION_MEMO_SIZE && !entries.contains_key(&key) {
            entries.clear();
        }
        entries.insert(key, (generation, policy.clone(), sel.clone()));
        sel
    }
}

struct CompositionKey {
    encoding: &'static str,
    preamble: String,
    budget: usize,
    mode: SelectMode,
    /// [`Query::key`] of the query, if any.
    query: Option<String>,
    selection: Arc<Selection>,
    /// Index into `selection.resources`, and what was read for it.
    ready: Vec<(usize, Arc<Contents>)>,
}

/// What a composition is made from, borrowed: a request's inputs to look up
/// in the memo, or a stored key's (see [`CompositionKey::inputs`]).
struct CompositionInputs<'a> {
    encoding: &'a str,
    preamble: &'a str,
    budget: usize,
    mode: SelectMode,
    query: Option<&'a str>,
    selection: &'a Arc<Selection>,
    ready: &'a [(usize, Arc<Contents>)],
}

impl CompositionKey {
    fn inputs(&self) -> CompositionInputs<'_> {
        CompositionInputs {
            encoding: self.encoding,
            preamble: &self.preamble,
            budget: self.budget,
            mode: self.mode,
            query: self.query.as_deref(),
            selection: &self.selection,
            ready: &self.ready,
        }
    }

    /// Whether this key describes exactly these inputs: the very same
    /// contents (`Arc` identity) for resources with the same id and the same
    /// listing metadata the block shows (name, title, MIME type).
    fn matches(&self, other: &CompositionInputs<'_>) -> bool {
        let same_listing = Arc::ptr_eq(&self.selection, other.selection);
        self.encoding == other.encoding
            && self.budget == other.budget
            && self.mode == other.mode
            // Priority mode ignores the query: a new question hits the memo.
            && (self.mode == SelectMode::Priority || self.query.as_deref() == other.query)
            && self.preamble == other.preamble
            && self.ready.len() == other.ready.len()
            && self.ready.iter().zip(other.ready).all(|((ia, ca), (ib, cb))| {
                Arc::ptr_eq(ca, cb)
                    && (same_listing && ia == ib || {
                        let (a, b) = (&self.selection.resources[*ia], &other.selection.resources[*ib]);
                        a.id == b.id && a.name == b.name && a.title == b.title && a.mime_type == b.mime_type
                    })
            })
    }
}

impl CompositionMemo {
    fn find(&self, inputs: &CompositionInputs<'_>) -> Option<Arc<Composed>> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.iter().find(|(k, _)| k.matches(inputs)).map(|(_, c)| c.clone())
    }

    fn put(&self, key: CompositionKey, composed: Arc<Composed>) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.retain(|(k, _)| !k.matches(&key.inputs()));
        if entries.len() >= COMPOSITION_MEMO_SIZE {
            entries.pop_front();
        }
        entries.push_back((key, composed));
    }
}

/// The last answer to each unchanged request, so that the warm path of a
/// host or proxy calling the LLM many times a minute costs a few lookups,
/// whatever the number of resources: no cache lookup per resource, no
/// composition to verify, no report to copy (its exclusion list is shared).
/// Only answers built entirely from the cache (no read, no error, no stale
/// content, no explicit selection) are kept, and one is used only while
/// everything it was made from is unchanged: the policy (the same `Arc`),
/// the listing generation, the content cache's version, the connection of
/// every server it used, and no entry it used has expired. Keyed by user,
/// not by grant set: `private` cache entries are per user.
#[derive(Default)]
struct WarmMemo {
    entries: std::sync::Mutex<std::collections::HashMap<WarmKey, WarmEntry>>,
}

/// Requests remembered by the warm memo; past this it starts over (each
/// entry shares its message with the composition memo).
const WARM_MEMO_SIZE: usize = 1024;

/// What a request asks, besides its user's policy.
#[derive(PartialEq, Eq, Hash)]
struct WarmKey {
    user: String,
    model: String,
    budget: Option<usize>,
    select: Option<SelectMode>,
    query: Option<String>,
}

struct WarmEntry {
    policy: Arc<Policy>,
    listing_generation: u64,
    stamp: CacheStamp,
    connections: Connections,
    message: Option<ContextMessage>,
    report: Report,
}

/// The content cache's state that a set of hits stays valid under.
#[derive(Clone, Copy)]
struct CacheStamp {
    version: u64,
    expires: Option<Instant>,
}

/// The connection epoch of each server a selection reads from.
struct Connections(Vec<(String, u64)>);

impl Connections {
    fn of(hub: &Hub, selected: &[Arc<Resource>]) -> Self {
        let mut servers: Vec<(String, u64)> = Vec::new();
        for r in selected {
            if !servers.iter().any(|(s, _)| *s == r.id.server) {
                servers.push((r.id.server.clone(), hub.connection(&r.id.server).epoch));
            }
        }
        Self(servers)
    }

    /// Same connections, still up (entries without expiry live by them).
    fn unchanged(&self, hub: &Hub) -> bool {
        self.0.iter().all(|(s, epoch)| {
            let c = hub.connection(s);
            c.up && c.epoch == *epoch
        })
    }
}

impl WarmMemo {
    fn clear(&self) {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    fn get(
        &self,
        key: &WarmKey,
        policy: &Arc<Policy>,
        listing_generation: u64,
        cache_version: u64,
        hub: &Hub,
    ) -> Option<(Option<ContextMessage>, Report)> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let e = entries.get(key)?;
        let valid = Arc::ptr_eq(&e.policy, policy)
            && e.listing_generation == listing_generation
            && e.stamp.version == cache_version
            && e.stamp.expires.is_none_or(|t| Instant::now() < t)
            && e.connections.unchanged(hub);
        valid.then(|| (e.message.clone(), e.report.clone()))
    }

    fn put(&self, key: WarmKey, entry: WarmEntry) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= WARM_MEMO_SIZE && !entries.contains_key(&key) {
            entries.clear();
        }
        entries.insert(key, entry);
    }
}

fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}
