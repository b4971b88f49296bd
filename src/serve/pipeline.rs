//! The one injection path every wire API goes through, its steps run once,
//! here, in this order: the API opened (its upstream), **identity** (from
//! the headers, before any body is read), **body** (read within its limits,
//! held as raw fields), the turns read by the adapter, **ownership** (the
//! stored objects a request continues must be the caller's),
//! **credentials** (the token flows run for the caller), **build** (the
//! caller's context), **audit** (the record begun), our context placed by
//! the adapter, **relay** (the upstream's answer streamed back),
//! **ownership** again (what the upstream stored, recorded as the caller's)
//! and **headers** (the report on the answer).
//!
//! An [`Adapter`] says only what differs between APIs: how the caller's key
//! is sent, where the turns are and how the query is read from them, where
//! our context goes, the upstream and its path, the error shape, what it
//! stores. Chat Completions and Responses (`openai`), Messages (`messages`)
//! and Gemini (`gemini`) are adapters.
//!
//! Imports the proxy's state, body, identity, audit, relay, status and
//! routes' stored kinds; nothing imports it but the dispatcher and the adapters.

use std::borrow::Cow;
use std::time::Instant;

use axum::extract::Request;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;

use super::body::{self, Budget, Chunks, JsonObject};
use super::error::ApiError;
use super::identity::{self, FromHeaders, Source};
use super::owners::Verdict;
use super::relay::{Outgoing, Upstream};
use super::routes::Stored;
use super::{AppState, Shared, audit, created, status};
use crate::compose::Query;
use crate::{ContextMessage, ContextRequest, SelectMode};

/// What one wire API does differently.
pub(super) trait Adapter: Sync {
    /// What [`Adapter::read`] learnt of the body that [`Adapter::place`]
    /// needs (borrowed from the body).
    type Plan<'a>;

    /// Whether the body speaks OpenAI's fields: it may name the caller
    /// (`user`, with `serve.user_from_body`), and its `user` /
    /// `safety_identifier` become what `serve.upstream_user` says.
    const OPENAI_BODY: bool = false;

    /// The API's upstream, or why this request cannot go (the API is off).
    fn upstream<'s>(&'s self, state: &'s AppState, parts: &Parts) -> Result<&'s Upstream, ApiError>;

    /// The caller's headers as the identity chain reads them (a vendor's
    /// key header as the bearer it stands for).
    fn identity_headers<'h>(&self, headers: &'h HeaderMap) -> Result<Cow<'h, HeaderMap>, ApiError> {
        Ok(Cow::Borrowed(headers))
    }

    /// An identity refusal, told the way this API's callers send their key.
    fn identity_refusal(&self, e: ApiError) -> ApiError {
        e
    }

    /// Reads the body: the turns' query, and what `place` needs.
    fn read<'a>(&self, obj: &JsonObject<'a>) -> Result<Reading<Self::Plan<'a>>, ApiError>;

    /// Puts ours (if any) where this API takes it; the body to send.
    fn place<'a>(
        &self,
        obj: &mut JsonObject<'a>,
        plan: Self::Plan<'a>,
        ours: Option<&ContextMessage>,
    ) -> Result<Chunks, ApiError>;

    /// The path below the upstream's base.
    fn upstream_path(&self) -> Cow<'_, [&str]>;

    /// The upstream call's metrics label.
    fn upstream_label(&self) -> &'static str;

    /// Credentials of the API's own, added to the headers going upstream.
    fn credentials(&self, _incoming: &HeaderMap, _out: &mut HeaderMap) {}

    /// What the upstream will store for the caller, as the body asks.
    fn stores(&self, _obj: &JsonObject<'_>) -> Option<Stored> {
        None
    }

    /// Our error in the API's own shape.
    fn error(&self, e: ApiError) -> Response;
}

/// What an adapter read of a body.
pub(super) struct Reading<P> {
    /// What relevance mode ranks by: the latest user turn, earlier ones with less weight.
    pub query: Option<Query>,
    pub model: Option<String>,
    /// The route's own selection mode, if it has one.
    pub select: Option<SelectMode>,
    /// Stored objects the request continues: each must be the caller's.
    pub continues: Vec<(Stored, String)>,
    pub plan: P,
}

impl<P> Reading<P> {
    pub(super) fn new(query: Option<Query>, model: Option<String>, plan: P) -> Self {
        Reading { query, model, select: None, continues: Vec::new(), plan }
    }
}

/// One injecting request, answered: the upstream's response, or our error in the adapter's shape.
pub(super) async fn run<A: Adapter>(state: &Shared, req: Request, route: &'static str, api: &A) -> Response {
    match steps(state, req, route, api).await {
        Ok(r) => r,
        Err(e) => api.error(e),
    }
}

async fn steps<A: Adapter>(state: &Shared, req: Request, route: &str, api: &A) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let upstream = api.upstream(state, &parts)?;
    let s = &state.settings;
    // Identity, from the headers alone.
    let (who, budgets) = {
        let headers = api.identity_headers(&parts.headers)?;
        caller(state, &headers).await.map_err(|e| api.identity_refusal(e))?
    };
    let who = match who {
        FromHeaders::User(who) => Some(who),
        // A body that cannot name anyone: anonymous_user, else 401, before it is read.
        FromHeaders::Body if !A::OPENAI_BODY => {
            Some(identity::from_body(s, None).map_err(|e| api.identity_refusal(e))?)
        }
        FromHeaders::Body => None,
    };
    // The body.
    let read = body::read(&parts.headers, body, s.max_body_bytes, s.body_timeout, &budgets).await?;
    let mut obj = JsonObject::parse(&read.bytes, s.max_body_fields)?;
    let who = match who {
        Some(who) => who,
        None => identity::from_body(s, Some(&obj))?,
    };
    let user = who.user.clone();
    let Reading { query, model, select, continues, plan } = api.read(&obj)?;
    for (kind, id) in &continues {
        owned(state, *kind, id, &user).await?;
    }
    // Credentials, then the context.
    let prepared = match &state.flows {
        Some(f) => f.prepare(&who).await,
        None => crate::credentials::Prepared::default(),
    };
    let started = Instant::now();
    let mut request = ContextRequest::for_user(user.clone()).with_identity(&who);
    request.model = model.filter(|m| !m.is_empty());
    request.select = select;
    let (message, mut report) = state.ctx.build_unaudited(&request, query).await.map_err(|e| build_failed(&user, e))?;
    prepared.note(&mut report);
    let ids = parts.extensions.get::<audit::Ids>();
    let pending = audit::begin(&state.ctx, ids, route, who.source, &report, message.as_ref());
    if A::OPENAI_BODY {
        super::openai::name_upstream_user(s, &mut obj, &user);
    }
    let stores = api.stores(&obj);
    let forwarded = reqwest::Body::wrap(api.place(&mut obj, plan, message.as_ref())?);
    drop(obj);
    state.metrics.injection(&report, started.elapsed().as_secs_f64());
    if let Some(f) = &state.flows {
        f.after_refusals(&user, &report).await;
    }
    tracing::info!(report = %serde_json::to_string(&report).unwrap_or_default(), "injected");

    // Relay.
    let headers = upstream_headers(upstream, &parts.headers, ids, |incoming, out| api.credentials(incoming, out));
    let path = api.upstream_path();
    let relayed = upstream
        .send(Outgoing { method: Method::POST, path: &path, query: parts.uri.query(), headers, body: forwarded })
        .await;
    pending.finish(&state.ctx, relayed.as_ref());
    let relayed = relayed?;
    // The body's share of the budget is held until the upstream has it.
    drop(read);
    state.metrics.upstream(api.upstream_label(), relayed.waited.as_secs_f64());
    let mut response = relayed.response;
    if let Some(stored) = stores {
        response = created::record(response, stored, user, state.owners.clone()).await;
    }
    status::report_headers(&mut response, &report);
    Ok(response)
}

/// Who is calling, from the headers (a JWT bearer verified first, with
/// `serve.jwt`), and the body budgets that caller draws on; in the span
/// `mcp_context.identity`.
pub(super) async fn caller<'a>(
    state: &'a AppState,
    headers: &HeaderMap,
) -> Result<(FromHeaders, Vec<&'a Budget>), ApiError> {
    let span = crate::telemetry::child_span(|| tracing::info_span!("mcp_context.identity"));
    let verified = identity::verified(state.jwt.as_ref(), headers, |r| state.metrics.auth_failure(r));
    let who = match tracing::Instrument::instrument(verified, span.clone()).await? {
        Some(id) => FromHeaders::User(id),
        None => span.in_scope(|| identity::from_headers(&state.settings, headers))?,
    };
    let budgets = budgets(state, &who);
    Ok((who, budgets))
}

/// The body budgets a caller draws on: the shared one, and the share of the
/// unidentified unless the headers named them.
fn budgets<'a>(state: &'a AppState, who: &FromHeaders) -> Vec<&'a Budget> {
    match who {
        FromHeaders::User(id) if matches!(id.source, Source::Key | Source::Header | Source::Jwt) => vec![&state.bodies],
        _ => vec![&state.bodies, &state.unidentified],
    }
}

/// The context could not be built: 500, saying why.
fn build_failed(user: &str, e: crate::Error) -> ApiError {
    tracing::error!(user, "context could not be built: {e}");
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        "context_failed",
        format!("The context could not be built: {e}"),
    )
}

/// The headers going upstream: the caller's, filtered by the relay (hop by
/// hop, our identity headers and keys), then the API's credentials, a JSON
/// body's type, and the request's trace id when the caller sent none.
fn upstream_headers(
    upstream: &Upstream,
    incoming: &HeaderMap,
    ids: Option<&audit::Ids>,
    credentials: impl FnOnce(&HeaderMap, &mut HeaderMap),
) -> HeaderMap {
    let mut headers = upstream.headers_for_upstream(incoming);
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    audit::Ids::propagate(ids, &mut headers);
    credentials(incoming, &mut headers);
    headers
}

/// Ok when `user` owns `id`; the 404 of a missing object otherwise.
pub(super) async fn owned(state: &AppState, kind: Stored, id: &str, user: &str) -> Result<(), ApiError> {
    verdict(state.owners.check(kind, id, user).await, kind, id)
}

fn verdict(v: Verdict, kind: Stored, id: &str) -> Result<(), ApiError> {
    match v {
        Verdict::Owner => Ok(()),
        Verdict::NotOwner => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "not_found",
            format!("No {} found with id '{}'.", kind.name(), id.escape_debug()),
        )),
        Verdict::Unknown => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "ownership_unavailable",
            "Whose object this is cannot be checked now (the shared cache is unreachable); retry shortly",
        )),
    }
}

#[cfg(test)]
#[path = "pipeline_tests.rs"]
mod tests;
