//! Request bodies: read within a size limit, a time limit and a shared
//! budget of bytes held at once, and JSON bodies kept as the caller wrote
//! them. Owns [`Budget`], [`read`] and [`JsonObject`]; imports the error
//! shape only.
//!
//! A JSON body is held as its top-level fields in order, each value as the
//! exact text the caller sent ([`serde_json::value::RawValue`]): the fields
//! the proxy owns (`messages`, `instructions`, `user`, `safety_identifier`)
//! are replaced, every other one goes upstream byte for byte (integers past
//! 64 bits, key order, `1.0` vs `1`). A body with a key twice is refused: the
//! proxy and the upstream could each read a different one.
//!
//! Why not tower-http's `RequestBodyLimitLayer`: the limit here is one of
//! three checks made on the same bytes as they arrive (size, the time from
//! first byte to last, the budget shared by every request, each refused
//! with its own status and OpenAI-shaped error), and the limit depends on
//! who is calling (`max_unidentified_body_bytes` before an identity is
//! known). The layer would count the same bytes a second time and answer
//! with a bare 413 of its own shape.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use futures::StreamExt;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::ApiError;

/// Bytes of request bodies held at once, shared by all requests; a request
/// that would pass it is answered 503 at once rather than queued (a queue
/// would let slow senders hold everyone else's turn).
#[derive(Clone)]
pub(super) struct Budget {
    bytes: Arc<Semaphore>,
    total: usize,
}

impl Budget {
    pub(super) fn new(total: usize) -> Self {
        Self { bytes: Arc::new(Semaphore::new(total)), total }
    }

    /// Bytes currently free.
    #[cfg(test)]
    pub(super) fn available(&self) -> usize {
        self.bytes.available_permits()
    }
}

/// A body read whole, with the share of the budget it holds (released when dropped).
pub(super) struct Read {
    pub bytes: Bytes,
    _held: Vec<OwnedSemaphorePermit>,
}

/// Reads the body: at most `limit` bytes (413), within `timeout` from the
/// first byte to the last (408), holding budget for every byte as it arrives
/// (503 when the budget is spent). A declared `Content-Length` over the limit
/// is refused before anything is read.
pub(super) async fn read(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    timeout: Duration,
    budgets: &[&Budget],
) -> Result<Read, ApiError> {
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    let mut held = Vec::new();
    let mut take = |n: usize| -> Result<(), ApiError> {
        for b in budgets {
            let n = u32::try_from(n).map_err(|_| ApiError::too_large(limit))?;
            let p = b.bytes.clone().try_acquire_many_owned(n).map_err(|_| busy(b.total))?;
            held.push(p);
        }
        Ok(())
    };
    let collect = async {
        let mut out = Vec::with_capacity(declared.map_or(0, |n| n as usize).min(64 << 10));
        let mut stream = body.into_data_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                ApiError::bad_request("invalid_body", format!("The request body could not be read: {e}"))
            })?;
            if out.len() + chunk.len() > limit {
                return Err(ApiError::too_large(limit));
            }
            take(chunk.len())?;
            out.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(out))
    };
    match tokio::time::timeout(timeout, collect).await {
        Ok(Ok(bytes)) => Ok(Read { bytes, _held: held }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            "request_timeout",
            format!("The request body took longer than {} ms to arrive (serve.body_timeout_ms)", timeout.as_millis()),
        )),
    }
}

fn busy(total: usize) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        "server_busy",
        format!("The proxy holds as many request bytes as it may ({total}); retry shortly"),
    )
}

/// A JSON object's fields in the order sent, each value exactly as sent:
/// borrowed from the body's bytes, never copied (a value the proxy replaces
/// is its own). What the object costs beyond the body is a few words per
/// field, and the fields are at most `serve.max_body_fields`.
#[derive(Debug)]
pub(super) struct JsonObject<'a> {
    body: &'a Bytes,
    fields: Vec<(Cow<'a, str>, Field<'a>)>,
}

/// A field's value: the caller's text, or ours.
#[derive(Debug)]
enum Field<'a> {
    Sent(&'a RawValue),
    Ours(Box<RawValue>),
}

impl Field<'_> {
    fn raw(&self) -> &RawValue {
        match self {
            Field::Sent(v) => v,
            Field::Ours(v) => v,
        }
    }
}

/// Sent values at least this long go upstream as slices of the body
/// itself; shorter ones are copied (a slice costs more than a few bytes).
const SHARE_FROM: usize = 1024;

impl<'a> JsonObject<'a> {
    /// Parses a body that must be one JSON object with no key twice and at
    /// most `max_fields` fields (`serve.max_body_fields`).
    pub(super) fn parse(body: &'a Bytes, max_fields: usize) -> Result<Self, ApiError> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let fields = de.deserialize_map(FieldsVisitor { max: max_fields }).map_err(|e| {
            let text = e.to_string();
            if text.contains("duplicate key") {
                ApiError::bad_request("duplicate_key", format!("The request body is refused: {text}"))
            } else if text.starts_with(TOO_MANY_FIELDS) {
                ApiError::bad_request(
                    "too_many_fields",
                    format!(
                        "The request body has more than {max_fields} top-level fields (serve.max_body_fields); \
                         send the API's fields only"
                    ),
                )
            } else {
                ApiError::bad_request("invalid_json", format!("The request body is not a JSON object: {text}"))
            }
        })?;
        de.end()
            .map_err(|e| ApiError::bad_request("invalid_json", format!("The request body is not valid JSON: {e}")))?;
        Ok(Self { body, fields })
    }

    /// The raw value of a field.
    pub(super) fn get(&self, key: &str) -> Option<&RawValue> {
        self.fields.iter().find(|(k, _)| k == key).map(|(_, v)| v.raw())
    }

    /// The raw value of a field as the caller sent it (borrowed from the
    /// body, so its items can be too); `None` when absent or replaced.
    pub(super) fn sent(&self, key: &str) -> Option<&'a RawValue> {
        self.fields.iter().find(|(k, _)| k == key).and_then(|(_, v)| match v {
            Field::Sent(v) => Some(*v),
            Field::Ours(_) => None,
        })
    }

    /// A piece of the body's text (a sent value, or a run of its items) as
    /// bytes shared with the body.
    pub(super) fn share(&self, text: &'a str) -> Bytes {
        self.body.slice_ref(text.as_bytes())
    }

    /// A field parsed as `T`; `None` when absent, an error naming the field when malformed.
    pub(super) fn parse_field<'b, T: serde::Deserialize<'b>>(&'b self, key: &str) -> Result<Option<T>, ApiError> {
        self.get(key)
            .map(|v| {
                serde_json::from_str(v.get()).map_err(|e| {
                    ApiError::bad_request("invalid_field", format!("The body's `{key}` is not what it should be: {e}"))
                })
            })
            .transpose()
    }

    /// A string field, if the field is a JSON string.
    pub(super) fn str_field(&self, key: &str) -> Option<String> {
        self.get(key).and_then(|v| serde_json::from_str::<String>(v.get()).ok())
    }

    /// Replaces a field's value where it stands, or appends it.
    pub(super) fn set(&mut self, key: &str, value: Box<RawValue>) {
        match self.fields.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = Field::Ours(value),
            None => self.fields.push((Cow::Owned(key.to_owned()), Field::Ours(value))),
        }
    }

    pub(super) fn remove(&mut self, key: &str) {
        self.fields.retain(|(k, _)| k != key);
    }

    /// The body to send: every field in its place, the untouched ones byte
    /// for byte (the long ones shared with the body, not copied).
    pub(super) fn to_chunks(&self) -> Chunks {
        self.chunks(None)
    }

    /// The body to send, with `key`'s field (in its place, else last) the
    /// JSON array of `items`, as chunks: a shared item (the injected
    /// message, tens of KB, the same bytes for every request of a
    /// composition; a run of the caller's items, a slice of the body) is
    /// not copied at all, the rest is copied once.
    pub(super) fn to_chunks_with(&self, key: &str, items: Vec<Item>) -> Chunks {
        self.chunks(Some((key, items)))
    }

    fn chunks(&self, array: Option<(&str, Vec<Item>)>) -> Chunks {
        let mut chunks = Vec::with_capacity(3);
        let mut cur: Vec<u8> = Vec::with_capacity(self.copied_len());
        self.write(array, &mut |piece| match piece {
            Piece::Raw(b) => cur.extend_from_slice(b),
            Piece::Shared(b) => {
                chunks.push(Bytes::from(std::mem::take(&mut cur)));
                chunks.push(b);
            }
        });
        chunks.push(Bytes::from(cur));
        Chunks::new(chunks)
    }

    /// The body to send as one piece (tests).
    #[cfg(test)]
    pub(super) fn to_vec(&self) -> Vec<u8> {
        self.to_chunks().concat()
    }

    /// About the bytes the fields take written out that are copied (keys,
    /// short values, quotes, colon and comma; the braces).
    fn copied_len(&self) -> usize {
        let value = |v: &Field<'_>| match v {
            Field::Sent(v) if v.get().len() >= SHARE_FROM => 0,
            v => v.raw().get().len(),
        };
        self.fields.iter().map(|(k, v)| k.len() + value(v) + 4).sum::<usize>() + 2
    }

    /// Writes the object, `array`'s field the JSON array of its items.
    fn write(&self, array: Option<(&str, Vec<Item>)>, out: &mut impl FnMut(Piece<'_>)) {
        out(Piece::Raw(b"{"));
        let placed = array.as_ref().is_some_and(|(key, ..)| self.fields.iter().any(|(k, _)| k == key));
        let last = array.as_ref().filter(|_| !placed).map(|(k, ..)| (*k, None));
        let fields = self.fields.iter().map(|(k, v)| (k.as_ref(), Some(v))).chain(last);
        let mut array = array;
        for (i, (k, v)) in fields.enumerate() {
            if i > 0 {
                out(Piece::Raw(b","));
            }
            if k.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
                out(Piece::Raw(b"\""));
                out(Piece::Raw(k.as_bytes()));
                out(Piece::Raw(b"\""));
            } else {
                // Writing a string into a Vec cannot fail.
                out(Piece::Raw(&serde_json::to_vec(k).unwrap_or_default()));
            }
            out(Piece::Raw(b":"));
            match array.take_if(|(key, ..)| *key == k) {
                Some((_, items)) => {
                    out(Piece::Raw(b"["));
                    for (i, item) in items.into_iter().enumerate() {
                        if i > 0 {
                            out(Piece::Raw(b","));
                        }
                        match item {
                            Item::Shared(b) => out(Piece::Shared(b)),
                            Item::TextBlock(b) => {
                                out(Piece::Raw(br#"{"type":"text","text":"#));
                                out(Piece::Shared(b));
                                out(Piece::Raw(b"}"));
                            }
                        }
                    }
                    out(Piece::Raw(b"]"));
                }
                None => match v {
                    Some(Field::Sent(v)) if v.get().len() >= SHARE_FROM => out(Piece::Shared(self.share(v.get()))),
                    Some(v) => out(Piece::Raw(v.raw().get().as_bytes())),
                    None => out(Piece::Raw(b"null")),
                },
            }
        }
        out(Piece::Raw(b"}"));
    }
}

/// The items of a JSON array held as text, each borrowed from it (the array
/// is never built); `None` when the text is not an array.
pub(super) fn each_item<'a>(array: &'a RawValue, mut f: impl FnMut(&'a RawValue)) -> Option<()> {
    struct Items<F>(F);
    impl<'de, F: FnMut(&'de RawValue)> Visitor<'de> for Items<F> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an array")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
            while let Some(item) = seq.next_element::<&'de RawValue>()? {
                (self.0)(item);
            }
            Ok(())
        }
    }
    let mut de = serde_json::Deserializer::from_str(array.get());
    de.deserialize_seq(Items(&mut f)).ok()
}

/// Contiguous runs of an array's items, as the text of each run (items and
/// the commas between them, a slice of the array's text): the items `keep`
/// keeps, in order. An array of any length costs one entry per run, and
/// runs only break where an item is left out.
pub(super) struct Runs<'a> {
    array: &'a str,
    runs: Vec<(usize, usize)>,
    open: Option<(usize, usize)>,
    left_out: bool,
}

impl<'a> Runs<'a> {
    pub(super) fn new(array: &'a RawValue) -> Self {
        Self { array: array.get(), runs: Vec::new(), open: None, left_out: false }
    }

    /// The next item (borrowed from the array), kept or left out.
    pub(super) fn push(&mut self, item: &'a RawValue, keep: bool) {
        let start = item.get().as_ptr() as usize - self.array.as_ptr() as usize;
        let end = start + item.get().len();
        match (keep, &mut self.open) {
            (true, Some((_, e))) => *e = end,
            (true, None) => self.open = Some((start, end)),
            (false, open) => {
                self.left_out = true;
                self.runs.extend(open.take());
            }
        }
    }

    /// Whether every item so far was kept (nothing was left out).
    pub(super) fn all_kept(&self) -> bool {
        !self.left_out
    }

    /// The runs' texts, in order.
    pub(super) fn finish(mut self) -> impl Iterator<Item = &'a str> {
        self.runs.extend(self.open.take());
        let array = self.array;
        self.runs.into_iter().map(move |(s, e)| &array[s..e])
    }
}

/// An item of an array written into a body: JSON shared, not copied.
pub(super) enum Item {
    Shared(Bytes),
    /// `{"type": "text", "text": <a JSON string, shared>}`.
    TextBlock(Bytes),
}

/// A piece of a body being written: bytes to copy, or bytes to share.
enum Piece<'a> {
    Raw(&'a [u8]),
    Shared(Bytes),
}

/// A body made of chunks sent one after another, its length known (so it
/// goes with a `Content-Length`, not chunked).
pub(super) struct Chunks {
    chunks: std::collections::VecDeque<Bytes>,
    left: u64,
}

impl Chunks {
    fn new(chunks: Vec<Bytes>) -> Self {
        let chunks: std::collections::VecDeque<Bytes> = chunks.into_iter().filter(|c| !c.is_empty()).collect();
        let left = chunks.iter().map(|c| c.len() as u64).sum();
        Chunks { chunks, left }
    }

    /// The body as one piece (tests, and what a reader would see).
    #[cfg(test)]
    pub(super) fn concat(&self) -> Vec<u8> {
        self.chunks.iter().flat_map(|c| c.iter().copied()).collect()
    }
}

impl hyper::body::Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let next = self.chunks.pop_front();
        if let Some(c) = &next {
            self.left -= c.len() as u64;
        }
        std::task::Poll::Ready(next.map(|c| Ok(hyper::body::Frame::data(c))))
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.left)
    }
}

/// A value serialised to raw JSON.
pub(super) fn raw<T: serde::Serialize + ?Sized>(value: &T) -> Box<RawValue> {
    serde_json::value::to_raw_value(value).expect("a serialisable value")
}

/// The start of the error a body with too many fields gives.
const TOO_MANY_FIELDS: &str = "too many fields";

struct FieldsVisitor {
    max: usize,
}

/// A key borrowed from the body unless it has escapes.
#[derive(serde::Deserialize, PartialEq, Eq, Hash)]
struct Key<'a>(#[serde(borrow)] Cow<'a, str>);

impl<'de> Visitor<'de> for FieldsVisitor {
    type Value = Vec<(Cow<'de, str>, Field<'de>)>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields: Vec<(Cow<'de, str>, Field<'de>)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        while let Some(Key(k)) = map.next_key::<Key<'de>>()? {
            if fields.len() == self.max {
                return Err(serde::de::Error::custom(TOO_MANY_FIELDS));
            }
            if !seen.insert(k.clone()) {
                return Err(serde::de::Error::custom(format!("duplicate key `{}`", k.escape_debug())));
            }
            fields.push((k, Field::Sent(map.next_value::<&'de RawValue>()?)));
        }
        Ok(fields)
    }
}

#[cfg(test)]
#[path = "body_tests.rs"]
mod tests;
