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
//!
//! Here: [`McpContext`] and the request flow (`build`, `inject`). The
//! stages it calls live beside it: `select` (the pure selection step:
//! candidates, decide, sort), `read` (the deadline-bounded read fan-out),
//! `memo` (the selection, composition and warm-request memos and when each
//! is still right).
//!
//! Layer: orchestrator. Imports every layer below it (composition, `inject`, settings, access,
//! sources, the audit sinks); no adapter (`tools`, `client`) or proxy: those import it.

use std::sync::Arc;

use async_openai::types::chat::CreateChatCompletionRequest;

use crate::audit::{AuditRecord, AuditSinkStatus, Auditor, Origin};
use crate::cache::ContentCache;
use crate::compose::{ChunkIndex, Query};
use crate::config::{Config, ContextSettings};
use crate::error::{Error, Result};
use crate::gate::{Admitted, Refusal, admit};
use crate::hub::Hub;
use crate::id::ResourceId;
use crate::inject::inject_message;
use crate::policy::Policy;
use crate::report::Report;
use crate::resource::{Contents, Resource};
use crate::tokenize::{TokenCache, Tokenizer};

#[cfg(feature = "redis")]
mod derived;
/// Without the shared cache there is nothing to exchange.
#[cfg(not(feature = "redis"))]
mod derived {
    use std::sync::Arc;

    use crate::cache::{ContentCache, Origin};
    use crate::compose::ChunkIndex;
    use crate::id::ResourceId;
    use crate::resource::{Contents, Resource};
    use crate::tokenize::{TokenCache, Tokenizer};

    pub(crate) struct Exchange;

    type Pairs<'a> = [(&'a Resource, &'a Arc<Contents>)];

    impl Exchange {
        pub(crate) async fn fetch(
            _: &ContentCache,
            _: &ChunkIndex,
            _: &Tokenizer,
            _: &[(&Resource, &Arc<Contents>, Origin)],
            _: &str,
        ) -> Exchange {
            Exchange
        }
        pub(crate) fn seed(&mut self, _: &Tokenizer, _: &TokenCache, _: &ChunkIndex, _: &Pairs<'_>) -> usize {
            0
        }
        pub(crate) fn export(
            &self,
            _: &Tokenizer,
            _: &TokenCache,
            _: &ChunkIndex,
            _: &Pairs<'_>,
        ) -> Vec<(ResourceId, bool, Vec<u8>)> {
            Vec::new()
        }
        pub(crate) fn finish(self, _: &ContentCache, _: usize, _: Vec<(ResourceId, bool, Vec<u8>)>, _: String) {}
    }
}
mod context_request;
mod memo;
mod message;
mod read;
mod select;
mod served;

mod request;
mod views;

pub use context_request::ContextRequest;
use memo::{CompositionMemo, SelectionMemo, WarmMemo};
pub use message::ContextMessage;
pub(crate) use message::MessageDerived;
#[cfg(feature = "serve")]
pub(crate) use message::MessageForm;
use request::Run;

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
    /// The audit trail's sinks (`audit:`), if any.
    audit: Option<Auditor>,
    /// Per-user servers and each user's view of them (`views.rs`); `None`
    /// when every server is shared.
    views: Option<views::Views>,
}

impl McpContext {
    /// Loads the policy named by the config (failing closed on any policy
    /// error), then connects to every server.
    pub async fn from_config(config: &Config) -> Result<Self> {
        let policy = load_policy(config).await?;
        Ok(Self::with_policy(config, policy).await)
    }

    /// Like [`McpContext::from_config`], made for a first build for `user`
    /// (a one-shot command such as `preview`): while the servers list, the
    /// resources of each page that the policy lets `user` see (its decision
    /// and the audience rule, as a build applies them, before any read) are
    /// read at once instead of after the last page. The next
    /// [`McpContext::build`] takes those reads; whatever it did not take is
    /// then cancelled and dropped. At network latency this overlaps a cold
    /// gather's listing with its reads (BENCHMARKS.md, "Remote servers").
    pub async fn from_config_for_user(config: &Config, user: &str) -> Result<Self> {
        let policy = load_policy(config).await?;
        let up = policy.for_user(user);
        let decide = move |r: &Resource| up.decide(r).allowed && !r.is_user_only();
        let shared = shared_servers(config);
        let hub = Hub::connect_reading_ahead(&shared, decide);
        Ok(Self::assemble(config, policy, hub).await)
    }

    /// Like [`McpContext::from_config`] with a policy given directly.
    pub async fn with_policy(config: &Config, policy: Policy) -> Self {
        Self::assemble(config, policy, Hub::connect(&shared_servers(config))).await
    }

    async fn assemble(config: &Config, policy: Policy, hub: impl std::future::Future<Output = Hub>) -> Self {
        // Build the tokenizer once, off the runtime (0.2-0.7 s the first time).
        let model = config.context.model.clone();
        let warm = tokio::task::spawn_blocking(move || {
            let _ = Tokenizer::for_model(&model);
        });
        let hub = hub.await;
        let _ = warm.await;
        // Per-user servers are not in the shared hub, nor known to the shared cache.
        let cache = ContentCache::new(hub.clone(), &shared_servers(config));
        let views = if config.servers.iter().any(|s| s.auth.is_per_user()) {
            views::Views::new(config, Arc::new(crate::credentials::Credentials::open_or_broken(config)))
        } else {
            None
        };
        Self {
            hub,
            policy: std::sync::RwLock::new(Arc::new(policy)),
            settings: config.context.clone(),
            tokens: Arc::default(),
            cache,
            compositions: Arc::default(),
            selections: SelectionMemo::default(),
            warm: WarmMemo::new(config.context.warm_memo_max_bytes),
            chunks: Arc::new(
                ChunkIndex::new(config.context.chunk_tokens, config.context.chunk_overlap)
                    .with_max_bytes(config.context.chunk_index_max_bytes)
                    .with_semantic(config.context.semantic_settings()),
            ),
            tokenizers: std::sync::Mutex::default(),
            audit: Auditor::start(&config.audit),
            views,
        }
    }

    /// The per-user credentials (`None` when no server is per user): the
    /// store `mcp-context auth` and `serve` write to, and where
    /// `needs_authorization` tells a user to connect.
    pub fn credentials(&self) -> Option<&Arc<crate::credentials::Credentials>> {
        self.views.as_ref().map(views::Views::credentials)
    }

    /// Names of the servers seen per user (`auth:` other than static).
    pub fn per_user_servers(&self) -> Vec<String> {
        self.views.as_ref().map(|v| v.server_names().map(str::to_owned).collect()).unwrap_or_default()
    }

    /// Per-user connections open now, all users together (bounded by
    /// `credentials.max_users`).
    pub fn per_user_views(&self) -> usize {
        self.views.as_ref().map_or(0, views::Views::open)
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
    /// Loads relevance mode's embedding model now, if it ranks with one: a long-running
    /// host (`serve`) calls this at start so that no request pays for the load.
    pub(crate) fn load_model(&self) {
        self.chunks.load_model();
    }

    pub(crate) fn token_cache(&self) -> Arc<TokenCache> {
        self.tokens.clone()
    }

    /// Reads one requested resource for `user` as the model's read tool does:
    /// the gate, then the policy, then the cache. `Ok(None)` means "not
    /// found" in every sense a caller must not tell apart: refused by the
    /// gate, denied by the policy (never read), or absent on the server.
    ///
    /// A per-user server's resource goes through `user`'s own view of it
    /// (its listing for the gate, its private cache, the user's credential),
    /// as in an injection; a user holding no credential for that server gets
    /// `Ok(None)` and opens nothing.
    pub async fn read_for(&self, user: &str, id: &ResourceId) -> Result<Option<(Arc<Resource>, Arc<Contents>)>> {
        self.read_as(&ContextRequest::for_user(user), id).await
    }

    /// The shared cache's state in this process (`None` with the memory
    /// backend): what `/metrics` reports.
    pub fn shared_cache_status(&self) -> Option<crate::report::SharedCacheStatus> {
        self.cache.shared_status()
    }

    /// Entries in the content cache (all users).
    pub fn cached_entries(&self) -> usize {
        self.cache.len()
    }

    /// `user`'s own views of the per-user servers, opened as needed (none
    /// when no server is per user).
    async fn user_views(&self, user: &str) -> views::UserViews {
        match &self.views {
            Some(v) => v.for_user(user).await,
            None => views::UserViews::default(),
        }
    }

    /// `user`'s views when `server` is a per-user server (opened as needed),
    /// else `None`: nothing is opened for a shared server's URI.
    async fn views_serving(&self, user: &str, server: &str) -> Option<views::UserViews> {
        match &self.views {
            Some(v) if v.serves(server) => Some(v.for_user(user).await),
            _ => None,
        }
    }

    /// The resources `user` may see: the shared servers' listings, then
    /// those of the user's own views of per-user servers (opened as for an
    /// injection), then the user's policy includes. Nothing is read.
    pub async fn visible_resources(&self, user: &str) -> Vec<Resource> {
        let view = self.view_of(&ContextRequest::for_user(user)).await;
        view.resources.into_iter().map(Arc::unwrap_or_clone).collect()
    }

    /// Passes a requested `server:uri` through the gate for `user` (see
    /// [`admit`]); the policy still has to decide on the admitted resource.
    /// A per-user server's URI is checked against `user`'s own view of it
    /// (its listing and templates); `UnknownServer` when the user holds no
    /// credential for it.
    pub async fn admit(&self, user: &str, id: &ResourceId) -> std::result::Result<Admitted, Refusal> {
        let own = self.views_serving(user, &id.server).await.unwrap_or_default();
        admit(select::hub_for(&self.hub, &own, &id.server), &self.policy().for_user(user), id)
    }

    /// Builds the context message for a request. `Ok((None, report))` when
    /// nothing is to be injected (the report says why).
    pub async fn build(&self, req: &ContextRequest) -> Result<(Option<ContextMessage>, Report)> {
        self.build_ranked(req, None).await
    }

    /// [`McpContext::build`] ranking by `query` in relevance mode when the
    /// request has no `query` of its own (which wins): how `serve` ranks by
    /// the conversation it relays ([`Query::from_chat_json`]), with the same
    /// turns and weights as [`McpContext::inject`]. The one request path:
    /// every other entry comes here (see `request.rs` for its steps).
    pub async fn build_ranked(
        &self,
        req: &ContextRequest,
        query: Option<Query>,
    ) -> Result<(Option<ContextMessage>, Report)> {
        let built = self.build_unaudited(req, query).await?;
        if let Some(record) = self.audit_record(&built.1, built.0.as_ref(), Origin::library(&built.1)) {
            self.audit(record);
        }
        Ok(built)
    }

    /// [`McpContext::build_ranked`] without its audit record: `serve` writes
    /// the record itself once the upstream has answered.
    pub(crate) async fn build_unaudited(
        &self,
        req: &ContextRequest,
        query: Option<Query>,
    ) -> Result<(Option<ContextMessage>, Report)> {
        let query = req.query.as_deref().map(Query::text).or(query);
        let span = crate::telemetry::child_span(|| {
            tracing::info_span!(
                "mcp_context.inject",
                user = ?req.user,
                warm = tracing::field::Empty,
                included = tracing::field::Empty,
                tokens = tracing::field::Empty,
            )
        });
        let built = tracing::Instrument::instrument(self.run(req, query), span.clone()).await;
        if let Ok((_, report)) = &built {
            // OpenTelemetry takes signed integers (an unsigned one would become text).
            span.record("included", report.included.len() as i64).record("tokens", report.tokens as i64);
        }
        // Reads started ahead serve the first build only.
        self.hub.stop_reading_ahead();
        built
    }

    /// The audit record of an injection, when the audit trail is on.
    pub(crate) fn audit_record(
        &self,
        report: &Report,
        message: Option<&ContextMessage>,
        origin: Origin,
    ) -> Option<AuditRecord> {
        // The roles the policy was applied with (a verified token's included), as the report says.
        let auditor = self.audit.as_ref()?;
        Some(auditor.record(report, message.map(|m| m.audited(report)), origin))
    }

    /// Writes the audit record of a `read_mcp_resource` call (with the
    /// user's roles under the policy in force), when the audit trail is on.
    pub(crate) fn audit_tool_read(&self, read: crate::audit::ToolRead<'_>) {
        if self.audit.is_some() {
            let up = self.policy().for_user(read.user);
            self.audit(AuditRecord::tool_read(read, up.roles(), Origin::tool_read()));
        }
    }

    /// Hands a record to the audit sinks (never waits; a full queue drops it, counted).
    pub(crate) fn audit(&self, record: AuditRecord) {
        if let Some(a) = &self.audit {
            a.submit(record);
        }
    }

    /// Each audit sink's state (empty without `audit:` sinks): what
    /// `/metrics` and `/readyz` show.
    pub fn audit_status(&self) -> Vec<AuditSinkStatus> {
        self.audit.as_ref().map(Auditor::status).unwrap_or_default()
    }

    /// Waits, at most `within`, until every audit record so far is written
    /// (or dropped, when its sink is down).
    pub async fn flush_audit(&self, within: std::time::Duration) {
        if let Some(a) = &self.audit {
            a.flush(within).await;
        }
    }

    async fn run(&self, req: &ContextRequest, query: Option<Query>) -> Result<(Option<ContextMessage>, Report)> {
        use crate::telemetry::child_span as child;
        use tracing::{Instrument, info_span};
        let run = Run::start(self, req, query);
        if let Some(answer) = run.warm() {
            tracing::Span::current().record("warm", true);
            return Ok(answer);
        }
        tracing::Span::current().record("warm", false);
        let prepared = run.prepare().await?;
        let selection = child(|| info_span!("mcp_context.select")).in_scope(|| run.select(&prepared));
        let t_select = run.elapsed();
        let span = child(|| {
            info_span!(
                "mcp_context.read",
                resources = selection.resources.len() as i64,
                cache_hits = tracing::field::Empty
            )
        });
        let reads = run.read(&prepared, &selection).instrument(span.clone()).await;
        span.record("cache_hits", reads.hits() as i64);
        let t_read = run.elapsed();
        let (composed, derived) =
            run.compose(&prepared, &selection, &reads).instrument(child(|| info_span!("mcp_context.compose"))).await?;
        Ok(run.finish(prepared, &selection, reads, (&composed, derived), (t_select, t_read)))
    }

    /// The tokenizer for a model, loaded off the runtime the first time.
    async fn tokenizer(&self, model: &str) -> Result<(Tokenizer, Option<String>)> {
        if let Some(t) = self.tokenizers.lock().unwrap_or_else(|p| p.into_inner()).get(model) {
            return Ok(t.clone());
        }
        let m = model.to_owned();
        let t = tokio::task::spawn_blocking(move || Tokenizer::for_model(&m))
            .await
            .map_err(Error::task("tokenizer loading"))?;
        if let Some(w) = &t.1 {
            // Once per model loaded (not per request), at warn: shown without -v.
            tracing::warn!("{w}");
        }
        let mut tokenizers = self.tokenizers.lock().unwrap_or_else(|p| p.into_inner());
        // Model names come from callers (a proxy passes the request's own):
        // keep the map bounded whatever they send.
        if tokenizers.len() >= TOKENIZER_MEMO_MODELS {
            tokenizers.clear();
        }
        tokenizers.insert(model.to_owned(), t.clone());
        Ok(t)
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
        // The request's own query wins (see `build_ranked`).
        let query = if req.query.is_some() { None } else { Query::from_chat(&request) };
        let (message, report) = self.build_ranked(&req, query).await?;
        inject_message(&mut request, message.as_ref().map(|m| m.content.as_str()), self.settings.role);
        Ok((request, report))
    }

    /// Builds the context for `user` and puts it into a Responses API
    /// request's `instructions`, ahead of the caller's own (which are kept,
    /// after ours; see [`compose_instructions`](crate::inject::compose_instructions)).
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
        // Ranked by the user text of `input`, as `serve` ranks a relayed
        // `/v1/responses` body ([`Query::from_chat_json`]).
        let query = serde_json::to_value(&request.input)
            .ok()
            .and_then(|input| Query::from_chat_json(&serde_json::json!({ "input": input })));
        let (message, report) = self.build_ranked(&req, query).await?;
        request.instructions = crate::inject::compose_instructions(
            request.instructions.as_deref(),
            message.as_ref().map(|m| m.content.as_str()),
        );
        Ok((request, report))
    }

    /// Ends every server connection, after writing the audit records still
    /// queued (at most 5 s). Call before the runtime stops.
    pub async fn close(&self) {
        self.flush_audit(std::time::Duration::from_secs(5)).await;
        if let Some(v) = &self.views {
            v.close().await;
        }
        self.hub.close().await;
    }
}

/// `config` without its per-user servers: what the shared hub and cache see.
fn shared_servers(config: &Config) -> std::borrow::Cow<'_, Config> {
    if !config.servers.iter().any(|s| s.auth.is_per_user()) {
        return std::borrow::Cow::Borrowed(config);
    }
    let mut c = config.clone();
    c.servers.retain(|s| !s.auth.is_per_user());
    std::borrow::Cow::Owned(c)
}

/// Models whose tokenizer is remembered; past this the memo starts over.
const TOKENIZER_MEMO_MODELS: usize = 32;

/// The policy the config names (failing closed on any policy error), or
/// allow-all when it names none.
async fn load_policy(config: &Config) -> Result<Policy> {
    // Parsing and compiling an organisation's policy is CPU work: keep it off the runtime.
    match config.policy.clone() {
        Some(p) => {
            tokio::task::spawn_blocking(move || Policy::load(&p)).await.map_err(Error::task("policy loading"))?
        }
        None => Ok(Policy::allow_all()),
    }
}
