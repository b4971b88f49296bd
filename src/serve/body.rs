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
        self.to_vec_with(None)
    }

    /// The body to send, with `array`'s field (in its place, else last) the
    /// JSON array of those elements, written straight into the body: the
    /// injected message (tens of KB) is copied once, not once into an array
    /// value and again into the body.
    pub(super) fn to_vec_with(&self, array: Option<(&str, &[&RawValue])>) -> Vec<u8> {
        let mut len: usize = self.fields.iter().map(|(k, v)| k.len() + v.get().len() + 4).sum();
        len += array.map_or(0, |(k, items)| k.len() + 6 + items.iter().map(|v| v.get().len() + 1).sum::<usize>());
        let mut out = Vec::with_capacity(len + 2);
        out.push(b'{');
        let placed = array.is_some_and(|(key, _)| self.fields.iter().any(|(k, _)| k == key));
        let last = array.filter(|_| !placed).map(|(k, _)| (k, None));
        let fields = self.fields.iter().map(|(k, v)| (k.as_str(), Some(&**v))).chain(last);
        for (i, (k, v)) in fields.enumerate() {
            if i > 0 {
                out.push(b',');
            }
            // Writing a string into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut out, k);
            out.push(b':');
            match (array.filter(|(key, _)| *key == k), v) {
                (Some((_, items)), _) => {
                    out.push(b'[');
                    for (i, v) in items.iter().enumerate() {
                        if i > 0 {
                            out.push(b',');
                        }
                        out.extend_from_slice(v.get().as_bytes());
                    }
                    out.push(b']');
                }
                (None, v) => out.extend_from_slice(v.map_or("null", RawValue::get).as_bytes()),
            }
        }
        out.push(b'}');
        out
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
    fn an_array_is_written_in_its_fields_place_or_last() {
        let ours = raw(&serde_json::json!({"role": "system", "content": "a \"quoted\" line"}));
        let turn = raw(&serde_json::json!({"role": "user", "content": "hi"}));
        let items = [&*ours, &*turn];
        let o = JsonObject::parse(br#"{"model":"m","messages":[{"role":"user","content":"old"}],"n":1}"#).unwrap();
        let sent = String::from_utf8(o.to_vec_with(Some(("messages", &items)))).unwrap();
        let want = format!(r#"{{"model":"m","messages":[{},{}],"n":1}}"#, ours.get(), turn.get());
        assert_eq!(sent, want);
        let o = JsonObject::parse(br#"{"model":"m"}"#).unwrap();
        let sent = String::from_utf8(o.to_vec_with(Some(("messages", &items[..1])))).unwrap();
        assert_eq!(sent, format!(r#"{{"model":"m","messages":[{}]}}"#, ours.get()));
        let o = JsonObject::parse(b"{}").unwrap();
        assert_eq!(String::from_utf8(o.to_vec_with(Some(("messages", &[])))).unwrap(), r#"{"messages":[]}"#);
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
