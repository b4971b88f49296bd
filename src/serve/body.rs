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

/// A JSON object's fields in the order sent, each value exactly as sent.
#[derive(Debug)]
pub(super) struct JsonObject {
    fields: Vec<(String, Box<RawValue>)>,
}

impl JsonObject {
    /// Parses a body that must be one JSON object with no key twice.
    pub(super) fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let fields = de.deserialize_map(FieldsVisitor).map_err(|e| {
            let text = e.to_string();
            if text.contains("duplicate key") {
                ApiError::bad_request("duplicate_key", format!("The request body is refused: {text}"))
            } else {
                ApiError::bad_request("invalid_json", format!("The request body is not a JSON object: {text}"))
            }
        })?;
        de.end()
            .map_err(|e| ApiError::bad_request("invalid_json", format!("The request body is not valid JSON: {e}")))?;
        Ok(Self { fields })
    }

    /// The raw value of a field.
    pub(super) fn get(&self, key: &str) -> Option<&RawValue> {
        self.fields.iter().find(|(k, _)| k == key).map(|(_, v)| &**v)
    }

    /// A field parsed as `T`; `None` when absent, an error naming the field when malformed.
    pub(super) fn parse_field<'a, T: serde::Deserialize<'a>>(&'a self, key: &str) -> Result<Option<T>, ApiError> {
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
            Some((_, v)) => *v = value,
            None => self.fields.push((key.to_owned(), value)),
        }
    }

    pub(super) fn remove(&mut self, key: &str) {
        self.fields.retain(|(k, _)| k != key);
    }

    /// The body to send: every field in its place, the untouched ones byte for byte.
    pub(super) fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.written_len());
        self.write(None, &mut |piece| match piece {
            Piece::Raw(b) => out.extend_from_slice(b),
            Piece::Shared(b) => out.extend_from_slice(&b),
        });
        out
    }

    /// The body to send, with `key`'s field (in its place, else last) the
    /// JSON array of `items`, as chunks: a shared item (the injected
    /// message, tens of KB, the same bytes for every request of a
    /// composition) is not copied at all, the rest is copied once.
    pub(super) fn to_chunks_with(&self, key: &str, items: Vec<Item<'_>>) -> Chunks {
        let mut chunks = Vec::with_capacity(3);
        let mut cur: Vec<u8> = Vec::with_capacity(self.written_len());
        self.write(Some((key, items)), &mut |piece| match piece {
            Piece::Raw(b) => cur.extend_from_slice(b),
            Piece::Shared(b) => {
                chunks.push(Bytes::from(std::mem::take(&mut cur)));
                chunks.push(b);
            }
        });
        chunks.push(Bytes::from(cur));
        Chunks::new(chunks)
    }

    /// About the bytes the fields take written out (keys, values, quotes, colon and comma; the braces).
    fn written_len(&self) -> usize {
        self.fields.iter().map(|(k, v)| k.len() + v.get().len() + 4).sum::<usize>() + 2
    }

    /// Writes the object, `array`'s field the JSON array of its items.
    fn write(&self, array: Option<(&str, Vec<Item<'_>>)>, out: &mut impl FnMut(Piece<'_>)) {
        out(Piece::Raw(b"{"));
        let placed = array.as_ref().is_some_and(|(key, ..)| self.fields.iter().any(|(k, _)| k == key));
        let last = array.as_ref().filter(|_| !placed).map(|(k, ..)| (*k, None));
        let fields = self.fields.iter().map(|(k, v)| (k.as_str(), Some(&**v))).chain(last);
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
                            Item::Raw(v) => out(Piece::Raw(v.get().as_bytes())),
                            Item::Shared(b) => out(Piece::Shared(b)),
                        }
                    }
                    out(Piece::Raw(b"]"));
                }
                None => out(Piece::Raw(v.map_or("null", RawValue::get).as_bytes())),
            }
        }
        out(Piece::Raw(b"}"));
    }
}

/// An item of an array written into a body: JSON to copy, or JSON to share.
pub(super) enum Item<'a> {
    Raw(&'a RawValue),
    Shared(Bytes),
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

struct FieldsVisitor;

impl<'de> Visitor<'de> for FieldsVisitor {
    type Value = Vec<(String, Box<RawValue>)>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields: Vec<(String, Box<RawValue>)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        while let Some(k) = map.next_key::<String>()? {
            if !seen.insert(k.clone()) {
                return Err(serde::de::Error::custom(format!("duplicate key `{}`", k.escape_debug())));
            }
            fields.push((k, map.next_value()?));
        }
        Ok(fields)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untouched_fields_go_out_byte_for_byte_in_order() {
        let text = r#"{"z":123456789012345678901234567890,"a":1.0,"m":[1,2],"instructions":{"x":1e400}}"#;
        let mut o = JsonObject::parse(text.as_bytes()).unwrap();
        assert_eq!(String::from_utf8(o.to_vec()).unwrap(), text);
        o.set("m", raw(&["ours"]));
        o.remove("a");
        assert_eq!(
            String::from_utf8(o.to_vec()).unwrap(),
            r#"{"z":123456789012345678901234567890,"m":["ours"],"instructions":{"x":1e400}}"#
        );
    }

    #[test]
    fn an_array_is_written_in_its_fields_place_or_last_its_first_item_shared() {
        let ours = raw(&serde_json::json!({"role": "system", "content": "a \"quoted\" line"}));
        let shared = Bytes::copy_from_slice(ours.get().as_bytes());
        let turn = raw(&serde_json::json!({"role": "user", "content": "hi"}));
        let sent = |o: &JsonObject, first: Option<Bytes>, rest: &[&RawValue]| {
            let items = first.map(Item::Shared).into_iter().chain(rest.iter().map(|r| Item::Raw(r))).collect();
            let chunks = o.to_chunks_with("messages", items);
            let body = chunks.concat();
            assert_eq!(hyper::body::Body::size_hint(&chunks).exact(), Some(body.len() as u64));
            String::from_utf8(body).unwrap()
        };
        let o = JsonObject::parse(br#"{"model":"m","messages":[{"role":"user","content":"old"}],"n":1}"#).unwrap();
        let chunks = o.to_chunks_with("messages", vec![Item::Raw(&turn), Item::Shared(shared.clone())]);
        // The shared message is the very same bytes, not a copy.
        assert!(chunks.chunks.iter().any(|c| c.as_ptr() == shared.as_ptr() && c.len() == shared.len()));
        let last = format!(r#"{{"model":"m","messages":[{},{}],"n":1}}"#, turn.get(), ours.get());
        assert_eq!(String::from_utf8(chunks.concat()).unwrap(), last);
        let want = format!(r#"{{"model":"m","messages":[{},{}],"n":1}}"#, ours.get(), turn.get());
        assert_eq!(sent(&o, Some(shared.clone()), &[&turn]), want);
        let o = JsonObject::parse(br#"{"model":"m"}"#).unwrap();
        assert_eq!(sent(&o, Some(shared.clone()), &[]), format!(r#"{{"model":"m","messages":[{}]}}"#, ours.get()));
        assert_eq!(sent(&o, None, &[&turn, &turn]), format!(r#"{{"model":"m","messages":[{0},{0}]}}"#, turn.get()));
        let o = JsonObject::parse(b"{}").unwrap();
        assert_eq!(sent(&o, None, &[]), r#"{"messages":[]}"#);
        // A key that needs escaping is written escaped.
        let o = JsonObject::parse(br#"{"a\"b":1}"#).unwrap();
        assert_eq!(sent(&o, None, &[]), r#"{"a\"b":1,"messages":[]}"#);
        assert_eq!(String::from_utf8(o.to_vec()).unwrap(), r#"{"a\"b":1}"#);
        let parsed: serde_json::Value = serde_json::from_str(&want).unwrap();
        assert_eq!(parsed["messages"][0]["content"], "a \"quoted\" line");
    }

    #[test]
    fn a_key_twice_or_no_object_is_refused() {
        for bad in [r#"{"messages":[],"messages":[]}"#, r#"{"user":"a","us\u0065r":"b"}"#] {
            assert_eq!(JsonObject::parse(bad.as_bytes()).unwrap_err().code, "duplicate_key", "{bad}");
        }
        for bad in ["[1]", "{", r#"{"a":1} x"#, "\"s\""] {
            assert_eq!(JsonObject::parse(bad.as_bytes()).unwrap_err().code, "invalid_json", "{bad}");
        }
    }

    #[tokio::test]
    async fn the_budget_is_held_while_the_body_is_and_refuses_past_it() {
        let budget = Budget::new(100);
        let h = HeaderMap::new();
        let r = read(&h, Body::from(vec![b'x'; 60]), 1000, Duration::from_secs(5), &[&budget]).await.unwrap();
        assert_eq!(budget.available(), 40);
        let e = read(&h, Body::from(vec![b'x'; 60]), 1000, Duration::from_secs(5), &[&budget]).await;
        assert_eq!(e.err().unwrap().status, 503);
        drop(r);
        assert_eq!(budget.available(), 100);
        let e = read(&h, Body::from(vec![b'x'; 60]), 50, Duration::from_secs(5), &[&budget]).await;
        assert_eq!(e.err().unwrap().status, 413);
    }
}
