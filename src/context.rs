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

use crate::budget::{DEFAULT_MIN_USEFUL_TOKENS, PackInput, Packed, TokenCache, Tokenizer, pack};
use crate::cache::ContentCache;
use crate::config::{Config, ContextSettings, MessageRole};
use crate::error::{Error, Result};
use crate::hub::Hub;
use crate::id::ResourceId;
use crate::inject::inject_message;
use crate::policy::{Policy, UserPolicy};
use crate::render::{DEFAULT_PREAMBLE, render_block};
use crate::report::{ExcludeReason, Excluded, Included, Report, Timings};
use crate::resource::{Contents, Resource};

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
}

impl ContextRequest {
    /// A request for `user` with everything else from the config.
    pub fn for_user(user: impl Into<String>) -> Self {
        Self { user: user.into(), ..Self::default() }
    }
}

/// The message to inject.
#[derive(Debug, Clone, PartialEq)]
pub struct ContextMessage {
    /// `system` or `developer`.
    pub role: MessageRole,
    /// The text.
    pub content: String,
    /// Its exact token count.
    pub tokens: usize,
}

/// The context engine: the hub, the policy, the tokenizer and the caches,
/// shared by every request. Cheap to share behind an `Arc`.
pub struct McpContext {
    hub: Hub,
    policy: Arc<Policy>,
    settings: ContextSettings,
    tokens: Arc<TokenCache>,
    cache: ContentCache,
    compositions: Arc<CompositionMemo>,
}

impl McpContext {
    /// Loads the policy named by the config (failing closed on any policy
    /// error), then connects to every server.
    pub async fn from_config(config: &Config) -> Result<Self> {
        let policy = match &config.policy {
            Some(p) => Policy::load(p)?,
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
            policy: Arc::new(policy),
            settings: config.context.clone(),
            tokens: Arc::default(),
            cache,
            compositions: Arc::default(),
        }
    }

    /// The connections.
    pub fn hub(&self) -> &Hub {
        &self.hub
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The `context:` settings.
    pub fn settings(&self) -> &ContextSettings {
        &self.settings
    }

    pub(crate) fn content_cache(&self) -> &ContentCache {
        &self.cache
    }

    pub(crate) fn token_cache_arc(&self) -> Arc<TokenCache> {
        self.tokens.clone()
    }

    /// Entries in the content cache (all users).
    pub fn cached_entries(&self) -> usize {
        self.cache.len()
    }

    /// Listed resources (plus the user's policy includes) that `user` may
    /// see, in listing order. Nothing is read.
    pub fn visible_resources(&self, user: &str) -> Vec<Resource> {
        let up = self.policy.for_user(user);
        self.candidates(&up).into_iter().filter(|r| up.decide(r).allowed).collect()
    }

    fn candidates(&self, up: &UserPolicy) -> Vec<Resource> {
        let mut all = self.hub.resources();
        for inc in up.includes() {
            if !all.iter().any(|r| &r.id == inc) {
                all.push(self.hub.resource(inc).unwrap_or_else(|| Resource::unlisted(inc.clone())));
            }
        }
        all
    }

    /// Builds the context message for a request. `Ok((None, report))` when
    /// nothing is to be injected (the report says why).
    pub async fn build(&self, req: &ContextRequest) -> Result<(Option<ContextMessage>, Report)> {
        let started = Instant::now();
        let up = self.policy.for_user(&req.user);
        let model = req.model.clone().unwrap_or_else(|| self.settings.model.clone());
        let m = model.clone();
        let (tok, warning) = tokio::task::spawn_blocking(move || Tokenizer::for_model(&m))
            .await
            .map_err(|e| Error::Other(format!("tokenizer failed to load: {e}")))?;
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

        // 1. Who may see what: decided before anything is read.
        let mut candidates = self.candidates(&up);
        if let Some(sel) = &req.selection {
            let mut chosen = Vec::new();
            for id in sel {
                if chosen.iter().any(|r: &Resource| &r.id == id) {
                    continue;
                }
                match candidates.iter().find(|r| &r.id == id) {
                    Some(r) => chosen.push(r.clone()),
                    None if self.hub.server_index(&id.server).is_some() => chosen.push(Resource::unlisted(id.clone())),
                    None => report.excluded.push(Excluded {
                        id: id.to_string(),
                        reason: ExcludeReason::Error,
                        detail: Some(format!("unknown server `{}`", id.server)),
                    }),
                }
            }
            candidates = chosen;
        }
        let mut selected = Vec::new();
        for r in candidates {
            let d = up.decide(&r);
            if !d.allowed {
                report.excluded.push(Excluded {
                    id: r.id.to_string(),
                    reason: ExcludeReason::Denied,
                    detail: Some(d.detail()),
                });
            } else if r.is_user_only() {
                report.excluded.push(Excluded {
                    id: r.id.to_string(),
                    reason: ExcludeReason::Audience,
                    detail: Some("annotations.audience is [user]: meant for the human, not the model".into()),
                });
            } else {
                selected.push(r);
            }
        }
        let order = |r: &Resource| self.hub.server_index(&r.id.server).unwrap_or(usize::MAX);
        selected.sort_by(|a, b| {
            let pa = a.annotations.priority.unwrap_or(DEFAULT_PRIORITY);
            let pb = b.annotations.priority.unwrap_or(DEFAULT_PRIORITY);
            pb.total_cmp(&pa).then(order(a).cmp(&order(b))).then_with(|| a.id.uri.cmp(&b.id.uri))
        });
        let t_select = started.elapsed();
        let any_selected = !selected.is_empty();

        // 2. Read what is visible, concurrently (cache first).
        let restarts_before: Vec<u32> = self.hub.status().iter().map(|s| s.restarts).collect();
        let reads = self.read_within_deadline(&selected, &req.user).await;
        for (s, before) in self.hub.status().into_iter().zip(restarts_before) {
            if s.restarts > before {
                report.restarted_servers.push(s.name);
            }
        }
        let t_read = started.elapsed();
        let mut ready = Vec::with_capacity(selected.len());
        let mut stale = std::collections::HashSet::new();
        for (r, got) in selected.into_iter().zip(reads) {
            match got {
                Ok(c) => {
                    if c.stale {
                        stale.insert(r.id.to_string());
                    }
                    ready.push((r, c.contents));
                }
                Err(e) => report.excluded.push(Excluded {
                    id: r.id.to_string(),
                    reason: ExcludeReason::Error,
                    detail: Some(e.to_string()),
                }),
            }
        }
        let any_read = !ready.is_empty();

        // 3. Render and fit the budget, off the async runtime (tokenising can be slow).
        let preamble = self.settings.preamble.clone().unwrap_or_else(|| DEFAULT_PREAMBLE.to_owned());
        let cache = self.tokens.clone();
        let compositions = self.compositions.clone();
        let packed = tokio::task::spawn_blocking(move || {
            if let Some(hit) = compositions.find(&tok, &preamble, budget, &ready) {
                return hit;
            }
            let key = CompositionKey::new(&tok, &preamble, budget, &ready);
            let blocks = ready.iter().map(|(r, c)| render_block(r, c)).collect();
            let composed = Arc::new(pack_blocks(&tok, &cache, &preamble, budget, blocks));
            compositions.put(key, composed.clone());
            composed
        })
        .await
        .map_err(|e| Error::Other(format!("packing failed: {e}")))?;
        report.excluded.extend(packed.dropped.iter().cloned());
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
        Ok((message, report))
    }

    /// Reads every selected resource through the cache, concurrently, with
    /// one timer for the whole injection (`deadline_ms`): what is not read by
    /// then is a timeout error for that resource; finished reads are kept.
    async fn read_within_deadline(&self, selected: &[Resource], user: &str) -> Vec<Result<crate::cache::CachedRead>> {
        use futures::StreamExt;
        let mut results: Vec<Option<Result<crate::cache::CachedRead>>> =
            self.cache.hits(selected.iter().map(|r| &r.id), user).into_iter().map(|h| h.map(Ok)).collect();
        let mut pending: futures::stream::FuturesUnordered<_> = selected
            .iter()
            .enumerate()
            .filter(|(i, _)| results[*i].is_none())
            .map(|(i, r)| async move { (i, self.cache.read(&r.id, user).await) })
            .collect();
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
        results
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
            .collect()
    }

    /// Builds the context for `user` and prepends it to `request` (replacing
    /// any earlier copy of ours). Nothing is injected when nothing is visible
    /// or fits; the report says why.
    pub async fn inject(
        &self,
        request: CreateChatCompletionRequest,
        user: &str,
    ) -> Result<(CreateChatCompletionRequest, Report)> {
        self.inject_with(request, &ContextRequest::for_user(user)).await
    }

    /// [`McpContext::inject`] with selection, budget or model overrides.
    pub async fn inject_with(
        &self,
        mut request: CreateChatCompletionRequest,
        req: &ContextRequest,
    ) -> Result<(CreateChatCompletionRequest, Report)> {
        let mut req = req.clone();
        if req.model.is_none() && !request.model.is_empty() {
            req.model = Some(request.model.clone());
        }
        let (message, report) = self.build(&req).await?;
        inject_message(&mut request, message.as_ref().map(|m| m.content.as_str()), self.settings.role);
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
    let blocks = items.iter().map(|(r, c)| render_block(r, c)).collect();
    pack_blocks(tok, cache, preamble, budget, blocks)
}

fn pack_blocks(
    tok: &Tokenizer,
    cache: &TokenCache,
    preamble: &str,
    budget: usize,
    blocks: Vec<crate::render::RenderedBlock>,
) -> Composition {
    let packed: Packed =
        pack(tok, cache, PackInput { preamble, blocks, budget, min_useful_tokens: DEFAULT_MIN_USEFUL_TOKENS });
    Composition {
        content: packed.content,
        tokens: packed.tokens,
        included: packed
            .included
            .into_iter()
            .map(|i| Included { id: i.id.to_string(), tokens: i.tokens, truncated: i.truncated, stale: false })
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
    entries: std::sync::Mutex<std::collections::VecDeque<(CompositionKey, Arc<Composition>)>>,
}

/// Compositions remembered (each holds one message, so at most this many
/// budgets' worth of text).
const COMPOSITION_MEMO_SIZE: usize = 8;

/// What of a listing entry the rendered block shows: name, title, MIME type.
type ListingMeta = (String, Option<String>, Option<String>);

#[derive(PartialEq)]
struct CompositionKey {
    encoding: &'static str,
    preamble: String,
    budget: usize,
    items: Vec<(ResourceId, Arc<Contents>, ListingMeta)>,
}

impl CompositionKey {
    fn new(tok: &Tokenizer, preamble: &str, budget: usize, ready: &[(Resource, Arc<Contents>)]) -> Self {
        Self {
            encoding: tok.encoding(),
            preamble: preamble.to_owned(),
            budget,
            items: ready
                .iter()
                .map(|(r, c)| (r.id.clone(), c.clone(), (r.name.clone(), r.title.clone(), r.mime_type.clone())))
                .collect(),
        }
    }

    fn same(&self, other: &Self) -> bool {
        self.encoding == other.encoding
            && self.budget == other.budget
            && self.preamble == other.preamble
            && self.items.len() == other.items.len()
            && self.items.iter().zip(&other.items).all(|(a, b)| a.0 == b.0 && Arc::ptr_eq(&a.1, &b.1) && a.2 == b.2)
    }
}

impl CompositionKey {
    /// Whether this key describes exactly these inputs (no allocation).
    fn matches(&self, tok: &Tokenizer, preamble: &str, budget: usize, ready: &[(Resource, Arc<Contents>)]) -> bool {
        self.encoding == tok.encoding()
            && self.budget == budget
            && self.preamble == preamble
            && self.items.len() == ready.len()
            && self.items.iter().zip(ready).all(|(a, (r, c))| {
                a.0 == r.id && Arc::ptr_eq(&a.1, c) && a.2.0 == r.name && a.2.1 == r.title && a.2.2 == r.mime_type
            })
    }
}

impl CompositionMemo {
    fn find(
        &self,
        tok: &Tokenizer,
        preamble: &str,
        budget: usize,
        ready: &[(Resource, Arc<Contents>)],
    ) -> Option<Arc<Composition>> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.iter().find(|(k, _)| k.matches(tok, preamble, budget, ready)).map(|(_, c)| c.clone())
    }

    fn put(&self, key: CompositionKey, composed: Arc<Composition>) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.retain(|(k, _)| !k.same(&key));
        if entries.len() >= COMPOSITION_MEMO_SIZE {
            entries.pop_front();
        }
        entries.push_back((key, composed));
    }
}

fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}
