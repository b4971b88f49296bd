//! The id of an object the upstream stored for a caller, taken from its
//! answer (a JSON body, or the first event of an SSE stream) and recorded as
//! the caller's ([`Owners`]) before the id reaches the caller, so that the
//! caller's very next request may use it. Imports the owners' store.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::Response;
use futures::StreamExt;

use super::owners::Owners;
use super::routes::Stored;

/// A non-streamed answer larger than this is relayed without its id recorded
/// (its owner then gets 404 when asking for it later, nobody gets more).
const MAX_RECORDED_BODY: usize = 32 << 20;
/// The bytes of a stream searched for its id before giving up.
const MAX_SCANNED_STREAM: usize = 256 << 10;

/// `response`, its created object recorded as `user`'s.
pub(super) async fn record(response: Response, kind: Stored, user: String, owners: Arc<Owners>) -> Response {
    if !response.status().is_success() {
        return response;
    }
    let sse = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let (parts, body) = response.into_parts();
    if sse {
        return Response::from_parts(parts, tap_stream(body, kind, user, owners));
    }
    match axum::body::to_bytes(body, MAX_RECORDED_BODY).await {
        Ok(bytes) => {
            if let Some(id) = id_of(&bytes) {
                owners.record(kind, &id, &user).await;
            }
            Response::from_parts(parts, Body::from(bytes))
        }
        Err(e) => {
            tracing::warn!(error = %e, "an upstream answer could not be read whole; its id is not recorded");
            let mut r = Response::new(Body::empty());
            *r.status_mut() = axum::http::StatusCode::BAD_GATEWAY;
            r
        }
    }
}

/// The id of a JSON object (`id`), or of the Response an event carries (`response.id`).
fn id_of(json: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Inner {
        id: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Outer {
        id: Option<String>,
        response: Option<Inner>,
    }
    let v: Outer = serde_json::from_slice(json).ok()?;
    v.response.and_then(|r| r.id).or(v.id).filter(|id| !id.is_empty())
}

/// The stream, passed through as it comes; the chunk that completes the
/// first `data:` line carrying an id waits until the id is recorded.
fn tap_stream(body: Body, kind: Stored, user: String, owners: Arc<Owners>) -> Body {
    struct Scan {
        seen: Vec<u8>,
        done: bool,
    }
    let mut scan = Scan { seen: Vec::new(), done: false };
    let stream = body.into_data_stream().then(move |chunk| {
        let found = match &chunk {
            Ok(bytes) if !scan.done => {
                scan.seen.extend_from_slice(bytes);
                let id = first_id(&scan.seen);
                if id.is_some() || scan.seen.len() > MAX_SCANNED_STREAM {
                    scan.done = true;
                    scan.seen = Vec::new();
                }
                id
            }
            _ => None,
        };
        let (owners, user) = (owners.clone(), user.clone());
        async move {
            if let Some(id) = found {
                owners.record(kind, &id, &user).await;
            }
            chunk.map(|b: Bytes| b)
        }
    });
    Body::from_stream(stream)
}

/// The id in the first complete `data:` line that has one.
fn first_id(seen: &[u8]) -> Option<String> {
    let mut rest = seen;
    while let Some(end) = rest.iter().position(|b| *b == b'\n') {
        let line = &rest[..end];
        rest = &rest[end + 1..];
        if let Some(data) = line.strip_prefix(b"data:")
            && let Some(id) = id_of(data.trim_ascii())
        {
            return Some(id);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_from_objects_and_events() {
        assert_eq!(id_of(br#"{"id":"chatcmpl-1","object":"chat.completion"}"#).as_deref(), Some("chatcmpl-1"));
        assert_eq!(id_of(br#"{"type":"response.created","response":{"id":"resp_9"}}"#).as_deref(), Some("resp_9"));
        let sse =
            b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_2\"}}\n\n";
        assert_eq!(first_id(sse).as_deref(), Some("resp_2"));
        assert_eq!(first_id(b"data: {\"id\":\"chatcmpl-3\"").as_deref(), None, "an incomplete line waits");
        assert_eq!(first_id(b": ping\n\ndata: {\"id\":\"chatcmpl-3\"}\n").as_deref(), Some("chatcmpl-3"));
    }
}
