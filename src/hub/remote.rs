//! Dialing a `url:` server ([`Transport::Http`](crate::config::Transport)):
//! Streamable HTTP, the legacy HTTP+SSE transport of 2024-11-05 (`sse`),
//! or, for a bare `url`, the first and then the second at the same URL when
//! the first `POST` is answered 400, 404 or 405 (the specification's
//! backwards-compatibility rule), said in a log line; and the handshake over
//! either, bounded by the server's timeout. Imports the hub's connection
//! types (`connect`), the SSE transport and the streaming HTTP client.

use rmcp::RoleClient;
use rmcp::transport::StreamableHttpClientTransport;

use super::connect::{Host, Live, lifecycle, live_from, opener, verb};
use super::convert::init_cause;
use crate::cause::redact_url;
use crate::config::{HttpMode, ServerConfig};

/// A failed handshake over HTTP: what to say, and the status of a `POST`
/// the server refused outright (the cue to try the legacy transport).
struct Failed {
    message: String,
    refused: Option<u16>,
}

/// Connects to `url` as `mode` says.
pub(super) async fn connect(
    cfg: &ServerConfig,
    host: Host,
    url: &str,
    headers: &std::collections::BTreeMap<String, String>,
    mode: HttpMode,
    max_text: usize,
) -> Result<Live, String> {
    let mut map = http::HeaderMap::new();
    for (k, v) in headers {
        let name = http::HeaderName::from_bytes(k.as_bytes()).map_err(|_| format!("invalid header name `{k}`"))?;
        let value = http::HeaderValue::from_str(v).map_err(|_| format!("invalid value for header `{k}`"))?;
        map.insert(name, value);
    }
    match mode {
        HttpMode::Sse => sse(cfg, host, url, map).await,
        HttpMode::Streamable => streamable(cfg, host, url, map, max_text, true).await.map_err(|f| f.message),
        HttpMode::StreamableThenSse => match streamable(cfg, host.clone(), url, map.clone(), max_text, false).await {
            Ok(live) => Ok(live),
            Err(Failed { refused: Some(status), message }) => {
                tracing::warn!(
                    server = %cfg.name,
                    "{}: Streamable HTTP refused (the POST was answered HTTP {status}); trying the legacy SSE \
                     transport at the same URL (`type: sse` skips the first attempt, `type: http` forbids the second)",
                    redact_url(url)
                );
                sse(cfg, host, url, map)
                    .await
                    .map_err(|e| format!("{e} (tried after Streamable HTTP failed: {message})"))
            }
            Err(f) => Err(f.message),
        },
    }
}

/// The legacy transport: the event stream at `url`, then the handshake.
async fn sse(cfg: &ServerConfig, host: Host, url: &str, map: http::HeaderMap) -> Result<Live, String> {
    let transport = match tokio::time::timeout(cfg.timeout, super::sse::connect(url, map)).await {
        Err(_) => {
            return Err(format!("no `endpoint` event from {} within {} ms", redact_url(url), cfg.timeout.as_millis()));
        }
        Ok(Err(why)) => return Err(format!("cannot connect to {}: {why}", redact_url(url))),
        Ok(Ok(pair)) => pair,
    };
    handshake(host, transport, cfg, url, false).await.map_err(|f| f.message)
}

/// Streamable HTTP; `hint`: a failure that looks like an SSE-only server says `type: sse`.
async fn streamable(
    cfg: &ServerConfig,
    host: Host,
    url: &str,
    map: http::HeaderMap,
    max_text: usize,
    hint: bool,
) -> Result<Live, Failed> {
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let transport = StreamableHttpClientTransport::with_client(
        crate::http::ReadStreamingClient::with_client(cfg.http_client.clone().unwrap_or_default(), max_text),
        StreamableHttpClientTransportConfig::with_uri(url)
            .custom_headers(map.into_iter().filter_map(|(k, v)| Some((k?, v))).collect())
            .max_concurrent_requests(http_requests_in_flight(cfg.max_concurrent_reads)),
    );
    handshake(host, transport, cfg, url, hint).await
}

/// The handshake over an HTTP transport, bounded by the server's timeout.
async fn handshake<T, E, A>(host: Host, transport: T, cfg: &ServerConfig, url: &str, hint: bool) -> Result<Live, Failed>
where
    T: rmcp::transport::IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    use rmcp::ClientServiceExt;
    let what = opener(cfg.protocol);
    let service = match tokio::time::timeout(cfg.timeout, host.serve_with_lifecycle(transport, lifecycle(cfg.protocol)))
        .await
    {
        Err(_) => {
            let message = format!("no answer to {what} from {} within {} ms", redact_url(url), cfg.timeout.as_millis());
            return Err(Failed { message, refused: None });
        }
        Ok(Err(e)) => {
            let cause = init_cause(&e);
            let hint = if hint && looks_like_sse_only(&cause) {
                " (an SSE-only server? set `type: sse` and the URL of its event stream, often `/sse`)"
            } else {
                ""
            };
            let message = format!("cannot {} {}: {cause}{hint}", verb(cfg.protocol), redact_url(url));
            return Err(Failed { message, refused: refused_post(&e) });
        }
        Ok(Ok(s)) => s,
    };
    Ok(live_from(service, None, cfg).await)
}

/// The status of the `POST` a failed handshake ended on, when it is one of
/// those the specification reads as "no Streamable HTTP here": 400, 404,
/// 405. Read from rmcp's own `HTTP <status>: <body>` of an unexpected
/// answer (after `auto`'s fallback to `initialize`, from that attempt).
fn refused_post(e: &rmcp::service::ClientInitializeError) -> Option<u16> {
    use rmcp::service::ClientInitializeError as E;
    use rmcp::transport::streamable_http_client::StreamableHttpError;
    let error = match e {
        E::LegacyFallbackFailed { fallback, .. } => return refused_post(fallback),
        E::TransportError { error, .. } => error,
        _ => return None,
    };
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(error.error.as_ref());
    while let Some(c) = cur {
        if let Some(StreamableHttpError::UnexpectedServerResponse(text)) =
            c.downcast_ref::<StreamableHttpError<reqwest::Error>>()
        {
            let status: u16 = text.strip_prefix("HTTP ")?.get(..3)?.parse().ok()?;
            return [400, 404, 405].contains(&status).then_some(status);
        }
        cur = c.source();
    }
    None
}

/// Whether a Streamable HTTP failure looks like a server that speaks only
/// the legacy HTTP+SSE transport: `POST` not allowed, or an event stream
/// where JSON was expected.
fn looks_like_sse_only(cause: &str) -> bool {
    cause.contains("HTTP 405") || cause.contains("Method Not Allowed") || cause.contains("`text/event-stream")
}

/// POSTs the Streamable HTTP transport keeps in flight for a server whose
/// reads are bounded by `max_concurrent_reads`: its reads (never more than
/// the global bound allows) and a few more, so that a listing, a
/// subscription or a notification does not queue behind a full window of
/// slow reads. rmcp's own default is 16, which would cap any larger
/// `max_concurrent_reads` on the wire (issue 31).
fn http_requests_in_flight(max_concurrent_reads: usize) -> usize {
    /// Slots beyond the reads, for everything that is not a read.
    const CONTROL_SLOTS: usize = 4;
    max_concurrent_reads.clamp(1, super::GLOBAL_READS) + CONTROL_SLOTS
}
