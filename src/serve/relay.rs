//! The upstream side: one shared HTTP client, headers in and out, and the
//! response relayed as a stream. The body is never collected: SSE chunks
//! reach the caller as the upstream sends them, and when the caller goes
//! away the response (and so the upstream connection) is dropped, which
//! cancels the upstream request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::settings::ServeSettings;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use futures::StreamExt;
use secrecy::ExposeSecret;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::ApiError;
use super::identity::bearer;
use super::path::Base;

/// Hop-by-hop headers (RFC 9110 §7.6.1) and those we set ourselves.
const NOT_FORWARDED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "authorization",
    // A caller's key to this proxy in Anthropic's header: never the upstream's business.
    "x-api-key",
    // And in Gemini's.
    "x-goog-api-key",
    // The relay passes bytes through; asking for identity encoding keeps
    // SSE frames readable by the caller whatever it advertised to us.
    "accept-encoding",
];

/// Headers that choose what the operator's key acts on (another
/// organisation or project of the same account): never taken from a caller
/// when the proxy sends its own key.
const OPERATOR_SCOPE: &[&str] = &["openai-organization", "openai-project"];

/// The upstream: where to send, with which credentials, how many at once.
pub(super) struct Upstream {
    base: Base,
    /// The base URL for messages, without credentials or query.
    redacted: String,
    client: reqwest::Client,
    api_key: Option<HeaderValue>,
    forward_authorization: bool,
    user_header: Option<HeaderName>,
    timeout: Duration,
    permits: Arc<Semaphore>,
}

/// A request to send upstream.
pub(super) struct Outgoing<'a> {
    pub method: Method,
    /// Checked path segments below the base (e.g. `["chat", "completions"]`).
    pub path: &'a [&'a str],
    /// The caller's query, if any (after the base's own).
    pub query: Option<&'a str>,
    pub headers: HeaderMap,
    pub body: reqwest::Body,
}

/// What came back: the response to give the caller, and the time its headers took.
pub(super) struct Relayed {
    pub response: Response,
    pub waited: Duration,
}

impl Upstream {
    pub(super) fn new(s: &ServeSettings, base: String) -> crate::Result<Self> {
        let client = reqwest::Client::builder()
            // Between two chunks of a body: a stalled upstream ends the relay.
            .read_timeout(s.upstream_timeout)
            .connect_timeout(Duration::from_secs(10).min(s.upstream_timeout))
            .pool_max_idle_per_host(s.max_concurrent_upstream)
            .build()
            .map_err(|e| crate::Error::serve(format!("cannot build the upstream HTTP client: {e}")))?;
        let api_key = s
            .upstream_api_key
            .as_ref()
            .map(|k| HeaderValue::from_str(&format!("Bearer {}", k.expose_secret())))
            .transpose()
            .map_err(|_| crate::Error::serve("serve.upstream_api_key holds characters an HTTP header cannot carry"))?
            .map(|mut v| {
                v.set_sensitive(true);
                v
            });
        let user_header = s.user_header.as_deref().and_then(|h| HeaderName::from_bytes(h.as_bytes()).ok());
        Ok(Self {
            redacted: redact(&base),
            base: Base::parse(&base).map_err(|e| crate::Error::serve(format!("upstream `{}`: {e}", redact(&base))))?,
            client,
            api_key,
            forward_authorization: s.forward_authorization,
            user_header,
            timeout: s.upstream_timeout,
            permits: Arc::new(Semaphore::new(s.max_concurrent_upstream)),
        })
    }

    /// The base URL for messages and logs (no credentials, no query).
    pub(super) fn redacted(&self) -> &str {
        &self.redacted
    }

    /// The caller's headers minus hop-by-hop ones, our identity header and
    /// its `Authorization`; then the upstream credentials: the configured
    /// key, or the caller's own `Authorization` (never both: the config
    /// refuses that).
    pub(super) fn headers_for_upstream(&self, incoming: &HeaderMap) -> HeaderMap {
        let mut out = HeaderMap::with_capacity(incoming.len());
        for (k, v) in incoming {
            if NOT_FORWARDED.contains(&k.as_str())
                || self.user_header.as_ref() == Some(k)
                || (!self.forward_authorization && OPERATOR_SCOPE.contains(&k.as_str()))
            {
                continue;
            }
            out.append(k.clone(), v.clone());
        }
        if self.forward_authorization {
            if let Some(v) = incoming.get(header::AUTHORIZATION).filter(|_| bearer(incoming).is_some()) {
                out.insert(header::AUTHORIZATION, v.clone());
            }
        } else if let Some(k) = &self.api_key {
            out.insert(header::AUTHORIZATION, k.clone());
        }
        out
    }

    /// Sends the request and relays the response (status, headers that
    /// matter, body as a stream). Waits for a slot when `max_concurrent_upstream`
    /// requests are in flight; the slot is held until the body is relayed.
    ///
    /// Under the span `mcp_context.upstream` (a client span, named after the
    /// GenAI operation: `chat`, `embeddings`; its `gen_ai.*` attributes read
    /// from the answer as it is relayed, see `usage`), whose W3C trace
    /// context replaces the caller's `traceparent` when traces are on.
    pub(super) async fn send(&self, mut out: Outgoing<'_>) -> Result<Relayed, ApiError> {
        let operation = match out.path {
            ["chat", "completions"] | ["responses"] | ["messages"] => "chat",
            [_, "models", m] if m.ends_with(":generateContent") || m.ends_with(":streamGenerateContent") => "chat",
            ["embeddings"] => "embeddings",
            _ => "http",
        };
        let span = crate::telemetry::child_span(|| {
            tracing::info_span!(
                "mcp_context.upstream",
                otel.name = operation,
                otel.kind = "client",
                http.request.method = %out.method,
                url.path = %out.path.join("/"),
                gen_ai.operation.name = operation,
                gen_ai.response.model = tracing::field::Empty,
                gen_ai.usage.input_tokens = tracing::field::Empty,
                gen_ai.usage.output_tokens = tracing::field::Empty,
                http.response.status_code = tracing::field::Empty,
            )
        });
        let traced = span.in_scope(crate::telemetry::current);
        if let Some(trace) = &traced {
            out.headers.remove("tracestate");
            if let Ok(v) = HeaderValue::from_str(&trace.traceparent) {
                out.headers.insert("traceparent", v);
            }
            if let Some(v) = trace.tracestate.as_deref().and_then(|s| HeaderValue::from_str(s).ok()) {
                out.headers.insert("tracestate", v);
            }
        }
        let permit = self.permits.clone().acquire_owned().await.map_err(|_| unavailable())?;
        let url = self.base.join(out.path, out.query);
        let started = Instant::now();
        let request = self.client.request(out.method, url).headers(out.headers).body(out.body);
        let sent = tracing::Instrument::instrument(tokio::time::timeout(self.timeout, request.send()), span.clone());
        let response = match sent.await {
            Err(_) => return Err(timeout(self.timeout)),
            Ok(Err(e)) if e.is_timeout() => return Err(timeout(self.timeout)),
            Ok(Err(e)) => return Err(unreachable(&self.redacted, &e)),
            Ok(Ok(r)) => r,
        };
        let waited = started.elapsed();
        span.record("http.response.status_code", i64::from(response.status().as_u16()));
        // The answer is read for the span only when it is exported (a trace kept).
        let span = traced.filter(|t| t.sampled()).map(|_| span);
        Ok(Relayed { response: relay_response(response, permit, span), waited })
    }
}

/// The upstream's response for the caller, its body streamed through; with
/// `span`, the answer's model and usage are recorded on it when the body
/// ends (and the span ends then).
fn relay_response(upstream: reqwest::Response, permit: OwnedSemaphorePermit, span: Option<tracing::Span>) -> Response {
    let status = upstream.status();
    let mut headers = HeaderMap::with_capacity(upstream.headers().len());
    for (k, v) in upstream.headers() {
        if NOT_FORWARDED.contains(&k.as_str()) {
            continue;
        }
        headers.append(k.clone(), v.clone());
    }
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    let tap = span.map(|span| (super::usage::Tap::new(content_type), span));
    let stream = Relay { inner: upstream.bytes_stream().boxed(), _permit: permit, tap };
    let mut response = Response::new(Body::from_stream(stream));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// The body on its way to the caller. The permit lives as long as the
/// body is being relayed; the tap (when traces are on) reads each chunk and
/// records what it learnt on the upstream span when the body ends or the
/// caller goes away.
struct Relay {
    inner: futures::stream::BoxStream<'static, reqwest::Result<axum::body::Bytes>>,
    _permit: OwnedSemaphorePermit,
    tap: Option<(super::usage::Tap, tracing::Span)>,
}

impl futures::Stream for Relay {
    type Item = std::io::Result<axum::body::Bytes>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let next = self.inner.poll_next_unpin(cx);
        if let (std::task::Poll::Ready(Some(Ok(bytes))), Some((tap, _))) = (&next, &mut self.tap) {
            tap.feed(bytes);
        }
        next.map(|item| item.map(|chunk| chunk.map_err(|e| std::io::Error::other(describe(&e)))))
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some((mut tap, span)) = self.tap.take() {
            tap.finish();
            if let Some(model) = &tap.model {
                span.record("gen_ai.response.model", model.as_str());
            }
            if let Some(n) = tap.input_tokens {
                span.record("gen_ai.usage.input_tokens", n as i64);
            }
            if let Some(n) = tap.output_tokens {
                span.record("gen_ai.usage.output_tokens", n as i64);
            }
        }
    }
}

fn timeout(after: Duration) -> ApiError {
    ApiError::new(
        StatusCode::GATEWAY_TIMEOUT,
        "upstream_error",
        "upstream_timeout",
        format!("The upstream did not answer within {} ms (serve.upstream_timeout_ms)", after.as_millis()),
    )
}

fn unavailable() -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "shutting_down", "The proxy is shutting down")
}

fn unreachable(redacted: &str, e: &reqwest::Error) -> ApiError {
    ApiError::new(
        StatusCode::BAD_GATEWAY,
        "upstream_error",
        "upstream_unreachable",
        format!("The upstream {redacted} could not be reached: {}", describe(e)),
    )
}

/// The innermost cause in words (refused, DNS, TLS, reset), without our
/// dependencies' type names.
fn describe(e: &reqwest::Error) -> String {
    let mut cause: &dyn std::error::Error = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    let text = cause.to_string();
    if e.is_connect() && !text.is_empty() {
        format!("connection failed ({text})")
    } else if text.is_empty() {
        "the connection failed".into()
    } else {
        text
    }
}

/// The base URL without userinfo or query, for messages.
pub(super) fn redact(url: &str) -> String {
    crate::cause::redact_url(url)
}
