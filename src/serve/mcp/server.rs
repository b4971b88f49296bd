//! The MCP server each caller talks to on `/mcp`: one rmcp `ServerHandler`
//! per session (on 2026-07-28, per request), made of the caller's view. Every
//! request takes the caller's identity from the HTTP request it came in
//! (`Caller`, set by `mod.rs` once the headers identified someone), so a
//! session is only ever used by the identity that opened it.
//!
//! - `resources/list` (in pages of `serve.mcp.page_size`): the whole context,
//!   a connect link per per-user server the caller has not connected, then
//!   every resource the policy lets the caller see;
//! - `resources/templates/list`: the templates the caller may expand;
//! - `resources/read`: our URI back to `(server, uri)`, then the gate, the
//!   policy and the content cache, as for an injection; refused, denied,
//!   forged and absent all answer the same "not found", and nothing denied
//!   is read. One audit record per read (route `mcp:resources/read`);
//! - `prompts/get context` (optional `query`): the context message, ranked
//!   by the query when there is one;
//! - `resources/subscribe` and `subscriptions/listen`: see `live.rs`.
//!
//! Imports the engine, the audit types, `uri`, `wire`, `live` and rmcp.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use rmcp::model::*;
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::json;

use super::live::{Live, Notifier, Watcher};
use super::uri::{self, Ours};
use super::{Caller, wire};
use crate::audit::{AuditRecord, Origin, ToolRead};
use crate::mode::SelectMode;
use crate::{ContextRequest, McpContext};

/// The route of the audit record of a read.
pub(super) const READ_ROUTE: &str = "mcp:resources/read";
/// The route of the audit record of the context prompt.
const PROMPT_ROUTE: &str = "mcp:prompts/get";
/// The prompt's name.
const PROMPT: &str = "context";

/// What every session shares.
pub(super) struct Shared {
    pub(super) ctx: Arc<McpContext>,
    pub(super) page_size: usize,
    pub(super) live: Arc<Live>,
    pub(super) flows: Option<Arc<crate::credentials::CredentialFlows>>,
}

/// One session's handler.
#[derive(Clone)]
pub(super) struct Session {
    shared: Arc<Shared>,
    /// The user who opened the session (2025-11-25); every later request
    /// of it must come from them.
    owner: Arc<OnceLock<String>>,
    /// What the session watches (made by `initialize`).
    watcher: Arc<OnceLock<Arc<Watcher>>>,
}

fn not_found(uri: &str) -> ErrorData {
    ErrorData::resource_not_found("Resource not found", Some(json!({ "uri": uri })))
}

impl Session {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        Session { shared, owner: Arc::default(), watcher: Arc::default() }
    }

    /// The caller of this request, checked against the session's owner.
    async fn caller(&self, cx: &RequestContext<RoleServer>) -> Result<(Caller, ContextRequest), ErrorData> {
        let caller = cx
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.extensions.get::<Caller>())
            .cloned()
            .ok_or_else(|| ErrorData::internal_error("the request carries no identity", None))?;
        if let Some(owner) = self.owner.get()
            && *owner != caller.who.user
        {
            return Err(ErrorData::invalid_request("This session was opened by another caller", None));
        }
        if let Some(f) = &self.shared.flows {
            // Refreshed or exchanged credentials are stored for the views; what is not ready is absent.
            let _ = f.prepare(&caller.who).await;
        }
        let req = ContextRequest::for_user(caller.who.user.clone()).with_identity(&caller.who);
        Ok((caller, req))
    }

    /// The session's watcher (a session has one once initialized).
    fn session_watcher(&self) -> Result<&Arc<Watcher>, ErrorData> {
        self.watcher.get().ok_or_else(|| ErrorData::invalid_request("Subscribe within an initialized session", None))
    }

    /// Everything the caller's listing holds, in order.
    async fn listing(&self, req: &ContextRequest) -> Vec<Resource> {
        let view = self.shared.ctx.view_of(req).await;
        let mut all = vec![wire::own(
            uri::CONTEXT.to_owned(),
            "context",
            "Everything you may see that matters",
            "The context an injection would send you: your resources by priority, within your budget".into(),
        )];
        for a in view.auth.iter().filter(|a| a.state != "connected") {
            let Some(url) = &a.url else { continue };
            all.push(wire::own(
                uri::connect(&a.server),
                &format!("connect {}", a.server),
                &format!("Connect {}", a.server),
                format!("Your account on `{}` is not connected ({}): open {url}", a.server, a.state),
            ));
        }
        all.extend(view.resources.iter().map(|r| wire::resource(r)));
        all
    }

    /// The context message for `req` (`query`: ranked by it), audited on `route`.
    async fn context(&self, caller: &Caller, mut req: ContextRequest, query: Option<String>, route: &str) -> String {
        let ctx = &self.shared.ctx;
        req.select = Some(if query.is_some() { SelectMode::Relevance } else { SelectMode::Priority });
        req.query = query;
        match ctx.build_unaudited(&req, None).await {
            Ok((message, report)) => {
                let origin = origin(caller, route);
                if let Some(record) = ctx.audit_record(&report, message.as_ref(), origin) {
                    ctx.audit(record);
                }
                message.map(|m| m.content.to_string()).unwrap_or_default()
            }
            Err(e) => {
                tracing::error!(user = %req.user, "context could not be built: {e}");
                String::new()
            }
        }
    }

    /// One audit record of a read: what came back (`None`: "not found").
    async fn audit_read(&self, caller: &Caller, got: Option<(String, String)>, started: Instant) {
        let ctx = &self.shared.ctx;
        let model = ctx.settings().model.clone();
        let counted = match got {
            Some((id, text)) => {
                let (cache, m) = (ctx.token_cache(), model.clone());
                tokio::task::spawn_blocking(move || {
                    let (tok, _) = crate::tokenize::Tokenizer::for_model(&m);
                    let n = cache.count(&tok, &text);
                    (id, text, n)
                })
                .await
                .ok()
            }
            None => None,
        };
        let who = &caller.who;
        let read = ToolRead {
            user: &who.user,
            model: &model,
            budget: 0,
            got: counted.as_ref().map(|(id, text, n)| (id.clone(), text.as_str(), *n, false)),
            ms: started.elapsed().as_secs_f64() * 1e3,
        };
        let up = ctx.policy().for_identity(&who.user, &who.roles);
        ctx.audit(AuditRecord::tool_read(read, up.roles(), origin(caller, READ_ROUTE)));
    }

    /// A read of one of our URIs.
    async fn read(&self, caller: &Caller, req: &ContextRequest, asked: &str) -> Result<ReadResourceResult, ErrorData> {
        let ctx = &self.shared.ctx;
        match uri::parse(asked) {
            Some(Ours::Context) => {
                let text = self.context(caller, req.clone(), None, READ_ROUTE).await;
                Ok(wire::read_result(asked, vec![(text, Some("text/plain".into()))]))
            }
            Some(Ours::Connect(server)) => {
                let view = ctx.view_of(req).await;
                let link = view.auth.iter().find(|a| a.server == server && a.state != "connected");
                match link.and_then(|a| a.url.as_ref().map(|u| (a, u))) {
                    Some((a, url)) => {
                        let text = format!("Connect your account on `{server}` ({}): open {url}\n", a.state);
                        Ok(wire::read_result(asked, vec![(text, Some("text/plain".into()))]))
                    }
                    None => Err(not_found(asked)),
                }
            }
            Some(Ours::Resource(id)) => {
                let started = Instant::now();
                match ctx.read_as(req, &id).await {
                    Ok(Some((resource, contents))) => {
                        let parts = wire::texts(&contents, resource.mime_type.as_deref());
                        let all: String = parts.iter().map(|(t, _)| t.as_str()).collect::<Vec<_>>().join("\n");
                        self.audit_read(caller, Some((id.to_string(), all)), started).await;
                        Ok(wire::read_result(asked, parts))
                    }
                    Ok(None) => {
                        self.audit_read(caller, None, started).await;
                        let view = ctx.view_of(req).await;
                        let link = view.auth.iter().find(|a| a.server == id.server && a.state != "connected");
                        match link.and_then(|a| a.url.clone()) {
                            // A per-user server the caller has not connected: where to connect it.
                            Some(url) => Err(ErrorData::resource_not_found(
                                format!("Resource not found: connect your account on `{}` first", id.server),
                                Some(json!({ "uri": asked, "connect_url": url })),
                            )),
                            None => Err(not_found(asked)),
                        }
                    }
                    Err(e) => {
                        self.audit_read(caller, None, started).await;
                        Err(ErrorData::internal_error(format!("The resource could not be read: {e}"), None))
                    }
                }
            }
            None => {
                self.audit_read(caller, None, Instant::now()).await;
                Err(not_found(asked))
            }
        }
    }
}

/// The audit origin of a request of `caller` on `route`.
fn origin(caller: &Caller, route: &str) -> Origin {
    Origin {
        route: route.to_owned(),
        identity_source: caller.who.source.as_str().to_owned(),
        request_id: caller.ids.request_id.clone(),
        trace_id: caller.ids.trace_id.clone(),
    }
}

/// The span of one MCP request.
fn span(method: &'static str, user: &str) -> tracing::Span {
    tracing::info_span!("mcp_context.mcp", otel.name = method, mcp.method.name = method, user = %user)
}

/// `offset` as a cursor, and back.
fn page<T: Clone>(all: &[T], cursor: Option<&str>, size: usize) -> Result<(Vec<T>, Option<String>), ErrorData> {
    let start = match cursor {
        None => 0,
        Some(c) => c
            .parse::<usize>()
            .ok()
            .filter(|s| *s <= all.len())
            .ok_or_else(|| ErrorData::invalid_params("unknown cursor", None))?,
    };
    let end = (start + size).min(all.len());
    Ok((all[start..end].to_vec(), (end < all.len()).then(|| end.to_string())))
}

#[allow(deprecated)]
impl ServerHandler for Session {
    fn get_info(&self) -> ServerConfig {
        let mut caps = ServerCapabilities::builder()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_resources_list_changed()
            .build();
        caps.prompts = Some(PromptsCapability::default());
        ServerConfig::new(caps)
            .with_server_info(Implementation::new("mcp-context", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "The resources of every MCP server you may see, under your organisation's policy. \
                 Read mcp-context://context for everything that matters at once.",
            )
    }

    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        std::borrow::Cow::Owned(vec![ProtocolVersion::V_2025_11_25, ProtocolVersion::V_2026_07_28])
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        let (caller, _) = self.caller(&cx).await?;
        let _ = self.owner.set(caller.who.user.clone());
        cx.peer.set_peer_info(request.clone());
        let result = self.negotiate_initialize(&request)?;
        let watcher = self.shared.live.add(Notifier::Peer(cx.peer.clone()), caller.who, true).await;
        let _ = self.watcher.set(watcher);
        Ok(result)
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        cx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let (_, req) = self.caller(&cx).await?;
        let run = async {
            let all = self.listing(&req).await;
            let cursor = request.as_ref().and_then(|r| r.cursor.as_deref());
            let (items, next) = page(&all, cursor, self.shared.page_size)?;
            let mut out = ListResourcesResult::with_all_items(items);
            out.next_cursor = next;
            Ok(out)
        };
        tracing::Instrument::instrument(run, span("resources/list", &req.user)).await
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        cx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let (_, req) = self.caller(&cx).await?;
        let run = async {
            let view = self.shared.ctx.view_of(&req).await;
            let all: Vec<ResourceTemplate> = view.templates.iter().filter_map(wire::template).collect();
            let cursor = request.as_ref().and_then(|r| r.cursor.as_deref());
            let (items, next) = page(&all, cursor, self.shared.page_size)?;
            let mut out = ListResourceTemplatesResult::with_all_items(items);
            out.next_cursor = next;
            Ok(out)
        };
        tracing::Instrument::instrument(run, span("resources/templates/list", &req.user)).await
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let (caller, req) = self.caller(&cx).await?;
        let run = self.read(&caller, &req, &request.uri);
        tracing::Instrument::instrument(run, span("resources/read", &req.user)).await.map(Into::into)
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        cx: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        self.caller(&cx).await?;
        let query = PromptArgument::new("query")
            .with_description("What the conversation is about: the passages that match it best, within your budget")
            .with_required(false);
        let prompt = Prompt::new(
            PROMPT,
            Some("Everything you may see that matters, as one message (ranked by `query` when given)"),
            Some(vec![query]),
        )
        .with_title("Context");
        Ok(ListPromptsResult::with_all_items(vec![prompt]))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let (caller, req) = self.caller(&cx).await?;
        if request.name != PROMPT {
            return Err(ErrorData::invalid_params(format!("No prompt named `{}`", request.name.escape_debug()), None));
        }
        let query = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("query"))
            .and_then(|q| q.as_str())
            .map(str::trim)
            .filter(|q| !q.is_empty())
            .map(str::to_owned);
        let user = req.user.clone();
        let run = self.context(&caller, req, query, PROMPT_ROUTE);
        let text = tracing::Instrument::instrument(run, span("prompts/get", &user)).await;
        let mut result = GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)]);
        result.description = Some("The context your organisation's policy gives you".into());
        Ok(result.into())
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let (_, req) = self.caller(&cx).await?;
        let id = match uri::parse(&request.uri) {
            Some(Ours::Context) => None,
            Some(Ours::Resource(id)) => Some(id),
            _ => return Err(not_found(&request.uri)),
        };
        if let Some(id) = &id {
            // Only what the caller may see now (a listed resource or an include).
            let visible = self.shared.ctx.view_of(&req).await.resources.iter().any(|r| r.id == *id);
            if !visible {
                return Err(not_found(&request.uri));
            }
            // Updates of it reach us only through the server's own subscription.
            let _ = self.shared.ctx.hub().subscribe(id).await;
        }
        self.session_watcher()?.subscribe(&request.uri);
        Ok(())
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.caller(&cx).await?;
        self.session_watcher()?.unsubscribe(&request.uri);
        Ok(())
    }

    fn accepted_subscription_filter(&self, requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::new();
        accepted.resources_list_changed = requested.resources_list_changed;
        accepted.resource_subscriptions = requested.resource_subscriptions.clone();
        Some(accepted)
    }

    async fn listen(&self, cx: SubscriptionContext) -> Result<(), ErrorData> {
        let (caller, req) = self.caller(cx.request_context()).await?;
        let list_changed = cx.accepted().resources_list_changed == Some(true);
        let watcher = self.shared.live.add(Notifier::Sink(cx.sink().clone()), caller.who.clone(), list_changed).await;
        let visible = self.shared.ctx.view_of(&req).await;
        for asked in cx.accepted().resource_subscriptions.iter().flatten() {
            match uri::parse(asked) {
                Some(Ours::Context) => watcher.subscribe(asked),
                Some(Ours::Resource(id)) if visible.resources.iter().any(|r| r.id == id) => {
                    let _ = self.shared.ctx.hub().subscribe(&id).await;
                    watcher.subscribe(asked);
                }
                // What the caller may not see is never watched for it (and nothing says so).
                _ => {}
            }
        }
        cx.cancelled().await;
        self.shared.live.remove(&watcher);
        Ok(())
    }
}
