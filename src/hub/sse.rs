//! The legacy HTTP+SSE client transport (MCP 2024-11-05, `type: sse`),
//! which rmcp lacks: `GET` the SSE URL, wait for the `endpoint` event (a URL
//! resolved against the SSE URL, on the same origin), then `POST` each
//! JSON-RPC message to it and take the server's messages from the `message`
//! events of the `GET` stream. Built as a `Sink` + `Stream` pair, which rmcp
//! turns into a client transport, so the hub drives it like any other. A
//! broken stream, or a `POST` the server refuses, ends the connection (the
//! hub then reconnects with backoff).

use std::pin::Pin;

use futures::{Sink, Stream, StreamExt};
use reqwest::Url;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue};
use rmcp::RoleClient;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use sse_stream::SseStream;
use tokio_util::sync::CancellationToken;

use crate::cause::{one_line, redact_url, reqwest_cause};

/// The sending half: each message is one `POST` to the endpoint.
pub(super) type SseSink = Pin<Box<dyn Sink<TxJsonRpcMessage<RoleClient>, Error = std::io::Error> + Send>>;
/// The receiving half: the server's messages, until the stream ends.
pub(super) type SseMessages = Pin<Box<dyn Stream<Item = RxJsonRpcMessage<RoleClient>> + Send>>;

/// Opens the event stream at `url` and waits for its `endpoint` event.
pub(super) async fn connect(url: &str, headers: HeaderMap) -> Result<(SseSink, SseMessages), String> {
    let base = Url::parse(url).map_err(|e| format!("invalid URL {}: {e}", redact_url(url)))?;
    let client = reqwest::Client::new();
    let response = client
        .get(base.clone())
        .headers(headers.clone())
        .header(ACCEPT, "text/event-stream")
        .send()
        .await
        .map_err(|e| reqwest_cause(&e))?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("the SSE stream answered HTTP {status}"));
    }
    let kind = response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    if !kind.starts_with("text/event-stream") {
        return Err(format!(
            "the SSE URL answered with content type `{kind}`, not an event stream (is this a Streamable HTTP \
             server? then use `type: http`)"
        ));
    }
    let mut events = SseStream::from_bytes_stream(response.bytes_stream());
    let endpoint = loop {
        match events.next().await {
            Some(Ok(e)) if e.event.as_deref() == Some("endpoint") => {
                break endpoint_url(&base, e.data.as_deref().unwrap_or("").trim())?;
            }
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(format!("the SSE stream broke before its `endpoint` event: {e}")),
            None => return Err("the SSE stream ended before its `endpoint` event".to_owned()),
        }
    };
    let stop = CancellationToken::new();
    let messages = messages(events, stop.clone());
    let sink = futures::sink::unfold(
        Poster { client, endpoint, headers, stop },
        |poster: Poster, message: TxJsonRpcMessage<RoleClient>| async move {
            let body = serde_json::to_vec(&message).map_err(std::io::Error::other)?;
            // A notification (`notifications/initialized` above all) is
            // delivered before whatever follows it; requests and answers go
            // out at once, so that many are in flight.
            if matches!(message, rmcp::model::JsonRpcMessage::Notification(_)) {
                poster.clone().post(body).await;
            } else {
                tokio::spawn(poster.clone().post(body));
            }
            Ok::<_, std::io::Error>(poster)
        },
    );
    Ok((Box::pin(sink), messages))
}

/// The `endpoint` event's URL, resolved against the SSE URL; one on
/// another origin is refused (it would receive the configured headers).
fn endpoint_url(base: &Url, data: &str) -> Result<Url, String> {
    let url = base.join(data).map_err(|e| format!("the server's `endpoint` event is not a URL ({e})"))?;
    if url.origin() != base.origin() {
        return Err(format!(
            "the server's `endpoint` event points to another origin ({}); refused",
            url.origin().ascii_serialization()
        ));
    }
    Ok(url)
}

/// The server's JSON-RPC messages among the stream's events; it ends with
/// the stream, or when a `POST` failed.
fn messages<S>(events: S, stop: CancellationToken) -> SseMessages
where
    S: Stream<Item = Result<sse_stream::Sse, sse_stream::Error>> + Send + 'static,
{
    let events = events.take_until(stop.cancelled_owned());
    Box::pin(
        events
            .filter_map(|event| async move {
                match event {
                    Ok(e) if matches!(e.event.as_deref(), None | Some("message")) => {
                        let data = e.data?;
                        match serde_json::from_str::<RxJsonRpcMessage<RoleClient>>(&data) {
                            Ok(m) => Some(Some(m)),
                            Err(err) => {
                                tracing::warn!(
                                    "SSE server sent a message that is not JSON-RPC ({err}): {}",
                                    one_line(&data, 200)
                                );
                                None
                            }
                        }
                    }
                    Ok(_) => None,
                    Err(e) => {
                        tracing::warn!("SSE stream broke: {e}");
                        Some(None)
                    }
                }
            })
            .take_while(|m| std::future::ready(m.is_some()))
            .filter_map(std::future::ready),
    )
}

/// What a `POST` needs; cheap to clone.
#[derive(Clone)]
struct Poster {
    client: reqwest::Client,
    endpoint: Url,
    headers: HeaderMap,
    stop: CancellationToken,
}

impl Poster {
    /// Sends one message; a refusal (or no answer) ends the connection.
    async fn post(self, body: Vec<u8>) {
        let sent = self
            .client
            .post(self.endpoint.clone())
            .headers(self.headers.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .body(body)
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => {}
            Ok(r) => {
                tracing::warn!("SSE server refused a message: HTTP {}", r.status());
                self.stop.cancel();
            }
            Err(e) => {
                tracing::warn!("cannot post a message to the SSE server: {}", reqwest_cause(&e));
                self.stop.cancel();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_is_resolved_and_kept_on_its_origin() {
        let base = Url::parse("http://h:8000/sse").unwrap();
        assert_eq!(
            endpoint_url(&base, "/messages/?session_id=1").unwrap().as_str(),
            "http://h:8000/messages/?session_id=1"
        );
        assert_eq!(endpoint_url(&base, "messages?x=1").unwrap().as_str(), "http://h:8000/messages?x=1");
        assert_eq!(endpoint_url(&base, "http://h:8000/m").unwrap().as_str(), "http://h:8000/m");
        assert!(endpoint_url(&base, "http://evil:8000/m").unwrap_err().contains("another origin"));
        assert!(endpoint_url(&base, "https://h:8000/m").is_err());
    }
}
