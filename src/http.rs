//! The Streamable HTTP client under rmcp's transport: reqwest's, except for
//! the answers to `resources/read`, which are read as a stream.
//!
//! rmcp's reqwest client holds a whole JSON body or SSE event before
//! decoding it, and refuses one over 16 MiB, so a huge resource can be
//! neither read nor cut. Here a read's answer is taken as it arrives: a JSON
//! body or an SSE event up to rmcp's own limit is decoded as usual; past it,
//! the bytes go through [`LargeAnswer`] (the first `max_resource_bytes` of
//! text kept, the rest counted), whose small result is handed to rmcp like
//! any other message. Every other message goes through reqwest's client
//! unchanged (sessions, protocol headers, auth and limits as rmcp does them).
//!
//! Layer: sources (a transport). Imports only `large`.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use http::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, JsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::common::client_side_sse::BoxedSseResponse;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use sse_stream::Sse;

use crate::large::LargeAnswer;

type HttpError = StreamableHttpError<reqwest::Error>;

/// reqwest's client with streamed `resources/read` answers.
#[derive(Clone)]
pub(crate) struct ReadStreamingClient {
    inner: reqwest::Client,
    max_text: usize,
}

impl ReadStreamingClient {
    /// Over `inner` (a clone shares its connection pool).
    pub(crate) fn with_client(inner: reqwest::Client, max_text: usize) -> Self {
        ReadStreamingClient { inner, max_text }
    }
}

impl StreamableHttpClient for ReadStreamingClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        let limits = StreamableHttpResponseLimits::default();
        self.post_message_with_response_limits(uri, message, session_id, auth_header, custom_headers, limits).await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        self.post_message_with_response_limits(uri, message, session_id, auth_header, custom_headers, limits).await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        let is_read = matches!(&message, JsonRpcMessage::Request(r) if matches!(r.request, ClientRequest::ReadResourceRequest(_)));
        if !is_read {
            return self
                .inner
                .post_message_with_response_limits(uri, message, session_id, auth_header, custom_headers, limits)
                .await;
        }
        self.post_read(uri, message, session_id, auth_header, custom_headers, limits).await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), HttpError> {
        self.inner.delete_session(uri, session_id, auth_header, custom_headers).await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxedSseResponse, HttpError> {
        self.inner.get_stream(uri, session_id, last_event_id, auth_header, custom_headers).await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxedSseResponse, HttpError> {
        self.inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

impl ReadStreamingClient {
    /// A `resources/read` POST whose answer (JSON or SSE) is read as it arrives.
    async fn post_read(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        let body = serde_json::to_vec(&message)?;
        let mut request = self
            .inner
            .post(uri.as_ref())
            .header(http::header::ACCEPT, "text/event-stream, application/json")
            .header(http::header::CONTENT_TYPE, "application/json");
        if let Some(token) = auth_header {
            request = request.bearer_auth(token);
        }
        for (name, value) in custom_headers {
            request = request.header(name, value);
        }
        let had_session = session_id.is_some();
        if let Some(id) = session_id {
            request = request.header("Mcp-Session-Id", id.as_ref());
        }
        let response = request.body(body).send().await.map_err(StreamableHttpError::Client)?;
        let status = response.status();
        if matches!(status, reqwest::StatusCode::ACCEPTED | reqwest::StatusCode::NO_CONTENT) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if status == reqwest::StatusCode::NOT_FOUND && had_session {
            return Err(StreamableHttpError::SessionExpired);
        }
        let session = response.headers().get("Mcp-Session-Id").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let content_type = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or("").trim().to_ascii_lowercase());
        if !status.is_success() {
            let body = read_prefix(response, limits.max_error_response_size).await;
            if let Ok(msg @ JsonRpcMessage::Error(_)) = serde_json::from_slice::<ServerJsonRpcMessage>(&body) {
                return Ok(StreamableHttpPostResponse::Json(msg, session));
            }
            let text = String::from_utf8_lossy(&body);
            return Err(StreamableHttpError::UnexpectedServerResponse(format!("HTTP {status}: {text}").into()));
        }
        match content_type.as_deref() {
            Some("text/event-stream") => {
                let events = sse_events(response.bytes_stream(), self.max_text, limits.max_sse_event_size);
                Ok(StreamableHttpPostResponse::Sse(events, session))
            }
            Some("application/json") => {
                let msg = json_body(response, self.max_text, limits.max_json_response_size).await?;
                Ok(StreamableHttpPostResponse::Json(msg, session))
            }
            other => Err(StreamableHttpError::UnexpectedContentType(other.map(str::to_owned))),
        }
    }
}

/// At most `max` bytes of a body (for error messages).
async fn read_prefix(response: reqwest::Response, max: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut body = response.bytes_stream();
    while let Some(Ok(chunk)) = body.next().await {
        let room = max.saturating_sub(out.len());
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if out.len() >= max {
            break;
        }
    }
    out
}

/// Where the bytes of one JSON message go: a buffer while it is small,
/// the streaming decoder once it is over `limit`.
enum Message {
    Small(Vec<u8>),
    Large(Box<LargeAnswer>),
}

impl Message {
    fn push(&mut self, bytes: &[u8], max_text: usize, limit: usize) {
        match self {
            Message::Small(buf) if buf.len() + bytes.len() <= limit => buf.extend_from_slice(bytes),
            Message::Small(buf) => {
                let mut large = Box::new(LargeAnswer::new(max_text, limit));
                large.feed(buf);
                large.feed(bytes);
                *self = Message::Large(large);
            }
            Message::Large(large) => {
                large.feed(bytes);
            }
        }
    }

    /// The message, decoded as rmcp would (small) or cut (large).
    fn finish(self) -> Result<Option<ServerJsonRpcMessage>, serde_json::Error> {
        match self {
            Message::Small(buf) => serde_json::from_slice(&buf).map(Some),
            Message::Large(large) => Ok(large.finish()),
        }
    }
}

async fn json_body(
    response: reqwest::Response,
    max_text: usize,
    limit: usize,
) -> Result<ServerJsonRpcMessage, HttpError> {
    let mut message = Message::Small(Vec::new());
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        message.push(&chunk.map_err(StreamableHttpError::Client)?, max_text, limit);
    }
    match message.finish()? {
        Some(msg) => Ok(msg),
        None => Err(StreamableHttpError::UnexpectedServerResponse(
            format!("answer larger than {limit} bytes, and not one that could be cut").into(),
        )),
    }
}

/// An SSE body as events, each event's data taken as it arrives (see
/// [`SseParser`]); a large event's data is replaced by the cut message.
fn sse_events<B: AsRef<[u8]>>(
    body: impl futures::Stream<Item = reqwest::Result<B>> + Send + 'static,
    max_text: usize,
    limit: usize,
) -> BoxedSseResponse {
    let parser = SseParser::new(max_text, limit);
    futures::stream::unfold((Box::pin(body), parser), |(mut body, mut parser)| async move {
        loop {
            if let Some(event) = parser.ready.pop_front() {
                return Some((Ok(event), (body, parser)));
            }
            match body.next().await {
                Some(Ok(chunk)) => parser.feed(chunk.as_ref()),
                Some(Err(e)) => return Some((Err(sse_stream::Error::Body(Box::new(e))), (body, parser))),
                None => {
                    parser.feed(b"\n\n"); // an event not closed by a blank line still counts
                    return parser.ready.pop_front().map(|e| (Ok(e), (body, parser)));
                }
            }
        }
    })
    .boxed()
}

/// The SSE wire format (`field: value` lines, a blank line ends an event),
/// with `data` never held whole: it goes to a [`Message`] as it arrives.
///
/// Why not the `sse-stream` crate's parser (which rmcp uses for every
/// other stream): it keeps the unfinished line (`unfinished_line`) and the
/// event's whole `data` as a `String` until the blank line, with no limit,
/// so an answer of N bytes in one event costs about 2N of memory. Measured
/// (sse-stream 0.2.6, one `data:` line of 64 MiB fed in 64 KiB chunks,
/// a counting allocator): the event arrives with all 64 MiB of data, and
/// the heap peaked at 127 MiB; a 1 GiB answer would need 2 GiB. Here the
/// data goes to [`LargeAnswer`] past rmcp's event limit, and memory stays
/// at that limit plus `max_text` (tests below: `a_huge_event_is_cut`).
struct SseParser {
    max_text: usize,
    limit: usize,
    /// The field name of the current line, or `None` once past its colon.
    field: Option<Vec<u8>>,
    /// The current line's field (once known) and whether the one optional
    /// space after the colon has been seen.
    current: Vec<u8>,
    after_colon: bool,
    value: Vec<u8>,
    data: Option<Message>,
    event: Option<String>,
    id: Option<String>,
    retry: Option<u64>,
    ready: std::collections::VecDeque<Sse>,
}

impl SseParser {
    fn new(max_text: usize, limit: usize) -> Self {
        SseParser {
            max_text,
            limit,
            field: Some(Vec::new()),
            current: Vec::new(),
            after_colon: false,
            value: Vec::new(),
            data: None,
            event: None,
            id: None,
            retry: None,
            ready: Default::default(),
        }
    }

    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match &mut self.field {
                Some(name) => {
                    // Reading the field name.
                    let b = bytes[0];
                    bytes = &bytes[1..];
                    match b {
                        b'\n' => {
                            let name = std::mem::take(name);
                            if name.is_empty() || name == b"\r" {
                                self.dispatch();
                            } else {
                                self.current = name;
                                self.after_colon = true;
                                self.end_line(); // a field with no colon: empty value
                            }
                        }
                        b':' => {
                            self.current = std::mem::take(name);
                            self.field = None;
                            self.after_colon = false;
                            if self.current == b"data" {
                                let line_break = self.data.is_some();
                                let data = self.data.get_or_insert_with(|| Message::Small(Vec::new()));
                                if line_break {
                                    data.push(b"\n", self.max_text, self.limit);
                                }
                            }
                        }
                        _ if name.len() < 64 => name.push(b),
                        _ => {}
                    }
                }
                None => {
                    // Reading a value, up to the end of the line.
                    if !self.after_colon {
                        self.after_colon = true;
                        if bytes[0] == b' ' {
                            bytes = &bytes[1..];
                            continue;
                        }
                    }
                    let end = memchr::memchr(b'\n', bytes);
                    let chunk = &bytes[..end.unwrap_or(bytes.len())];
                    if self.current == b"data" {
                        if let Some(data) = self.data.as_mut() {
                            data.push(chunk, self.max_text, self.limit);
                        }
                    } else if self.value.len() < 4096 {
                        self.value.extend_from_slice(&chunk[..chunk.len().min(4096 - self.value.len())]);
                    }
                    match end {
                        Some(i) => {
                            bytes = &bytes[i + 1..];
                            self.end_line();
                        }
                        None => bytes = &[],
                    }
                }
            }
        }
    }

    fn end_line(&mut self) {
        let value = String::from_utf8_lossy(&std::mem::take(&mut self.value)).trim_end_matches('\r').to_owned();
        match self.current.as_slice() {
            b"event" => self.event = Some(value),
            b"id" => self.id = Some(value),
            b"retry" => self.retry = value.parse().ok(),
            b"data" if self.data.is_none() => self.data = Some(Message::Small(Vec::new())),
            _ => {}
        }
        self.current.clear();
        self.field = Some(Vec::new());
    }

    fn dispatch(&mut self) {
        let data = match self.data.take() {
            None => None,
            // Small: as it was sent; rmcp decodes it.
            Some(Message::Small(buf)) => Some(String::from_utf8_lossy(&buf).into_owned()),
            // Large: decoded and cut; rmcp gets its small JSON.
            Some(Message::Large(large)) => large.finish().map(|m| serde_json::to_string(&m).unwrap_or_default()),
        };
        let (event, id, retry) = (self.event.take(), self.id.take(), self.retry.take());
        if data.is_none() && event.is_none() && id.is_none() && retry.is_none() {
            return;
        }
        self.ready.push_back(Sse { event, data, id, retry });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every event of `body` fed in chunks of `chunk` bytes, ended as a body ends.
    fn parse(body: &[u8], chunk: usize, max_text: usize, limit: usize) -> Vec<Sse> {
        let mut p = SseParser::new(max_text, limit);
        for c in body.chunks(chunk.max(1)) {
            p.feed(c);
        }
        p.feed(b"\n\n");
        p.ready.into_iter().collect()
    }

    fn sse(event: Option<&str>, data: Option<&str>, id: Option<&str>, retry: Option<u64>) -> Sse {
        Sse { event: event.map(Into::into), data: data.map(Into::into), id: id.map(Into::into), retry }
    }

    fn same(a: &[Sse], b: &[Sse]) -> bool {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| x.event == y.event && x.data == y.data && x.id == y.id && x.retry == y.retry)
    }

    /// Fields, the one optional space, multi-line data, comments and CRLF,
    /// whatever the chunks the body arrives in. (A CR before a data line's
    /// LF stays in the data, as it always has: the data is JSON, where it is
    /// white space.)
    #[test]
    fn the_wire_format_is_read_in_chunks_split_anywhere() {
        let body = b"event: message\nid: 7\ndata: {\"a\":\ndata:1}\n\n: a comment\n\nretry: 3000\r\ndata:  two spaces\r\n\r\ndata\n\nid:x\n";
        let want = [
            sse(Some("message"), Some("{\"a\":\n1}"), Some("7"), None),
            sse(None, Some(" two spaces\r"), None, Some(3000)),
            sse(None, Some(""), None, None),
            sse(None, None, Some("x"), None),
        ];
        for chunk in 1..body.len() {
            let got = parse(body, chunk, 1 << 20, 1 << 20);
            assert!(same(&got, &want), "chunks of {chunk}: {got:?}");
        }
    }

    /// A blank event (only comments, or nothing) dispatches nothing; an
    /// unknown field and a bad `retry` are ignored.
    #[test]
    fn empty_and_unknown_fields_make_no_event() {
        assert!(parse(b": keep-alive\n\n\n\n", 3, 64, 64).is_empty());
        let got = parse(b"foo: bar\nretry: soon\ndata: x\n\n", 2, 64, 64);
        assert!(same(&got, &[sse(None, Some("x"), None, None)]), "{got:?}");
    }

    /// Over the event limit, the data goes through the streaming decoder:
    /// what arrives is the small cut answer, never the whole text.
    #[test]
    fn a_huge_event_is_cut() {
        let text = "x".repeat(1 << 20);
        let json = format!(r#"{{"jsonrpc":"2.0","id":3,"result":{{"contents":[{{"uri":"a://1","text":"{text}"}}]}}}}"#);
        let body = format!("event: message\ndata: {json}\n\n");
        let got = parse(body.as_bytes(), 8192, 10, 4096);
        assert_eq!(got.len(), 1);
        let data = got[0].data.as_deref().unwrap();
        assert!(data.len() < 1000, "{} bytes", data.len());
        let v: serde_json::Value = serde_json::from_str(data).unwrap();
        let part = &v["result"]["contents"][0];
        assert_eq!(part["text"], "xxxxxxxxxx");
        assert_eq!(part["_meta"][crate::large::TRUNCATED_BYTES], (1 << 20) - 10);
        assert_eq!(got[0].event.as_deref(), Some("message"));
    }

    /// The stream yields events as they complete, and the last one even
    /// without its closing blank line.
    #[tokio::test]
    async fn the_stream_ends_with_an_unclosed_event() {
        let chunks: Vec<reqwest::Result<&'static [u8]>> = vec![Ok(b"data: 1\n\nda"), Ok(b"ta: 2\n")];
        let events: Vec<_> = sse_events(futures::stream::iter(chunks), 64, 64).collect().await;
        let data: Vec<_> = events.into_iter().map(|e| e.unwrap().data.unwrap()).collect();
        assert_eq!(data, ["1", "2"]);
    }
}
