//! Answers too large to hold: a `resources/read` answer decoded as its
//! bytes arrive, keeping the first `max_text` bytes of text and only the
//! length of the rest (and of every blob), so memory stays bounded whatever
//! the size (16 MiB, 1 GiB).
//!
//! serde_json (and every pull parser we found) holds a whole string value
//! before handing it over; the text of one resource *is* that string. So
//! this is a small push decoder for exactly one shape, fed by the stdio
//! pipe (an over-long line) and by the HTTP client (a large JSON body or SSE
//! event), in chunks split anywhere:
//!
//! `{"jsonrpc", "id", "result": {"contents": [{"uri", "mimeType", "text" | "blob", …}], "ttlMs", "cacheScope", …}}`
//!
//! in any key order; anything else is skipped. What it cannot use (an
//! error, a listing, a malformed line) becomes an error for the request's
//! `id`: "answer larger than N bytes", at once, never a timeout.
//!
//! A part that was cut carries its cut length in `_meta` under
//! [`TRUNCATED_BYTES`]; a blob is emptied and its length kept under
//! [`BLOB_BYTES`]. The hub turns both into its usual marks.
//!
//! Layer: sources (a transport's reader). Imports nothing of this crate.

use rmcp::model::{
    ErrorCode, ErrorData, JsonRpcError, JsonRpcMessage, JsonRpcResponse, JsonRpcVersion2_0, MetaObject as Meta,
    ReadResourceResult, RequestId, ResourceContents, ServerJsonRpcMessage, ServerResult,
};

/// `_meta` key: bytes of this text part that were not kept.
pub(crate) const TRUNCATED_BYTES: &str = "mcp-context/truncatedBytes";
/// `_meta` key: length of this blob's base64, which was not kept.
pub(crate) const BLOB_BYTES: &str = "mcp-context/blobBytes";
/// JSON-RPC error code of our own "answer larger than N bytes" (in the
/// implementation-defined server-error range); the hub reports it as a
/// protocol error, not as an error the server sent.
pub(crate) const TOO_LARGE: i32 = -32099;
/// Longest `uri`, `mimeType`, `cacheScope` or string `id` kept.
const SMALL: usize = 4096;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Key {
    Id,
    Result,
    Error,
    Contents,
    Uri,
    Mime,
    Text,
    Blob,
    Ttl,
    Scope,
    Other,
}

struct Frame {
    object: bool,
    key: Key,
    expect_key: bool,
}

/// Where the bytes of the string or scalar being read go.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Sink {
    Skip,
    Key,
    Id,
    Uri,
    Mime,
    Text,
    Blob,
    Ttl,
    Scope,
}

#[derive(PartialEq, Eq)]
enum Lex {
    /// Between tokens.
    Between,
    /// Inside a string.
    Str { sink: Sink, escape: Escape },
    /// Inside a number or literal.
    Scalar { sink: Sink },
}

#[derive(PartialEq, Eq, Clone, Copy)]
enum Escape {
    None,
    Backslash,
    /// `\u` and the hex digits so far.
    Unicode {
        digits: u8,
        value: u32,
    },
}

#[derive(Default)]
struct Part {
    uri: String,
    mime: Option<String>,
    text: Option<Vec<u8>>,
    text_cut: u64,
    blob_len: Option<u64>,
}

/// The decoder. Feed it with [`LargeAnswer::feed`] until it says it is
/// done (or the input ends), then take the message with [`LargeAnswer::finish`].
pub(crate) struct LargeAnswer {
    left: usize,
    too_large: String,
    stack: Vec<Frame>,
    lex: Lex,
    /// The key or scalar being read (bounded).
    small: Vec<u8>,
    pending_high: Option<u32>,
    id: Option<RequestId>,
    id_text: Vec<u8>,
    id_is_str: bool,
    is_result: bool,
    is_error: bool,
    has_contents: bool,
    parts: Vec<Part>,
    ttl_ms: Option<u64>,
    scope: Option<String>,
    done: bool,
    malformed: bool,
}

impl LargeAnswer {
    /// A decoder that keeps at most `max_text` bytes of text in total;
    /// `limit` is the size named in the error for an answer it cannot cut.
    pub(crate) fn new(max_text: usize, limit: usize) -> LargeAnswer {
        LargeAnswer {
            left: max_text,
            too_large: format!("answer larger than {limit} bytes"),
            stack: Vec::new(),
            lex: Lex::Between,
            small: Vec::new(),
            pending_high: None,
            id: None,
            id_text: Vec::new(),
            id_is_str: false,
            is_result: false,
            is_error: false,
            has_contents: false,
            parts: Vec::new(),
            ttl_ms: None,
            scope: None,
            done: false,
            malformed: false,
        }
    }

    /// Consumes `bytes`; returns how many were used (all, unless the
    /// message ended inside them).
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> usize {
        let mut i = 0;
        while i < bytes.len() {
            if self.done {
                return i;
            }
            // Inside a string, everything up to the next quote or backslash
            // goes to its sink in one piece: the text of a huge resource is
            // almost all of the message.
            if let Lex::Str { sink, escape: Escape::None } = self.lex
                && self.pending_high.is_none()
            {
                let run = memchr::memchr2(b'"', b'\\', &bytes[i..]).unwrap_or(bytes.len() - i);
                if run > 0 {
                    self.emit(sink, &bytes[i..i + run]);
                    i += run;
                    continue;
                }
            }
            self.byte(bytes[i]);
            i += 1;
        }
        bytes.len()
    }

    fn byte(&mut self, b: u8) {
        match self.lex {
            Lex::Str { sink, escape } => self.string_byte(sink, escape, b),
            Lex::Scalar { sink } => {
                if matches!(b, b',' | b'}' | b']') || b.is_ascii_whitespace() {
                    self.end_scalar(sink);
                    self.lex = Lex::Between;
                    self.structural(b);
                } else if self.small.len() < 64 {
                    self.small.push(b);
                }
            }
            Lex::Between => self.structural(b),
        }
    }

    fn structural(&mut self, b: u8) {
        match b {
            b' ' | b'\t' | b'\r' | b'\n' => {}
            b'{' | b'[' => {
                self.value_starts();
                let key = self.value_key();
                if self.stack.len() == 1 && key == Key::Result && b == b'{' {
                    self.is_result = true;
                }
                if self.in_result() && self.stack.len() == 2 && key == Key::Contents && b == b'[' {
                    self.has_contents = true;
                }
                if b == b'{' && self.in_contents() && self.stack.len() == 3 {
                    self.parts.push(Part::default());
                }
                self.stack.push(Frame { object: b == b'{', key: Key::Other, expect_key: b == b'{' });
            }
            b'}' | b']' => {
                if self.stack.pop().is_none() {
                    self.malformed = true;
                }
                if self.stack.is_empty() {
                    self.done = true;
                }
            }
            b':' => {}
            b',' => {
                if let Some(f) = self.stack.last_mut()
                    && f.object
                {
                    f.expect_key = true;
                }
            }
            b'"' => {
                let sink = match self.stack.last() {
                    Some(f) if f.object && f.expect_key => Sink::Key,
                    _ => {
                        self.value_starts();
                        self.value_sink(true)
                    }
                };
                if sink == Sink::Text {
                    self.start_text();
                }
                if sink == Sink::Blob
                    && let Some(p) = self.parts.last_mut()
                {
                    p.blob_len = Some(0);
                }
                self.small.clear();
                self.lex = Lex::Str { sink, escape: Escape::None };
            }
            _ => {
                if self.stack.is_empty() {
                    self.malformed = true;
                    self.done = true;
                    return;
                }
                self.value_starts();
                let sink = self.value_sink(false);
                self.small.clear();
                self.small.push(b);
                self.lex = Lex::Scalar { sink };
            }
        }
    }

    /// A value begins in the current container: an object's key is used up.
    fn value_starts(&mut self) {
        if let Some(f) = self.stack.last_mut()
            && f.object
        {
            f.expect_key = false;
        }
    }

    /// The key the value now starting belongs to.
    fn value_key(&self) -> Key {
        match self.stack.last() {
            Some(f) if f.object => f.key,
            _ => Key::Other,
        }
    }

    fn in_result(&self) -> bool {
        self.stack.len() >= 2 && self.stack[0].key == Key::Result
    }

    fn in_contents(&self) -> bool {
        self.in_result() && self.stack.len() >= 3 && self.stack[1].key == Key::Contents && !self.stack[2].object
    }

    fn value_sink(&self, string: bool) -> Sink {
        let key = self.value_key();
        match self.stack.len() {
            1 if key == Key::Id => Sink::Id,
            2 if self.in_result() && key == Key::Ttl && !string => Sink::Ttl,
            2 if self.in_result() && key == Key::Scope && string => Sink::Scope,
            4 if self.in_contents() && string => match key {
                Key::Uri => Sink::Uri,
                Key::Mime => Sink::Mime,
                Key::Text => Sink::Text,
                Key::Blob => Sink::Blob,
                _ => Sink::Skip,
            },
            _ => Sink::Skip,
        }
    }

    fn start_text(&mut self) {
        if let Some(p) = self.parts.last_mut() {
            p.text = Some(Vec::new());
        }
    }

    fn string_byte(&mut self, sink: Sink, escape: Escape, b: u8) {
        match escape {
            Escape::None => match b {
                b'"' => {
                    self.lex = Lex::Between;
                    self.end_string(sink);
                }
                b'\\' => self.lex = Lex::Str { sink, escape: Escape::Backslash },
                _ => {
                    self.flush_high(sink);
                    self.emit(sink, &[b]);
                }
            },
            Escape::Backslash => {
                let plain = match b {
                    b'n' => Some(b'\n'),
                    b't' => Some(b'\t'),
                    b'r' => Some(b'\r'),
                    b'b' => Some(0x08),
                    b'f' => Some(0x0c),
                    b'u' => None,
                    other => Some(other), // \" \\ \/ (and anything else as itself)
                };
                match plain {
                    Some(c) => {
                        self.flush_high(sink);
                        self.emit(sink, &[c]);
                        self.lex = Lex::Str { sink, escape: Escape::None };
                    }
                    None => self.lex = Lex::Str { sink, escape: Escape::Unicode { digits: 0, value: 0 } },
                }
            }
            Escape::Unicode { digits, value } => {
                let Some(d) = (b as char).to_digit(16) else {
                    self.malformed = true;
                    self.lex = Lex::Str { sink, escape: Escape::None };
                    return;
                };
                let value = value * 16 + d;
                if digits < 3 {
                    self.lex = Lex::Str { sink, escape: Escape::Unicode { digits: digits + 1, value } };
                    return;
                }
                self.lex = Lex::Str { sink, escape: Escape::None };
                self.code_unit(sink, value);
            }
        }
    }

    fn code_unit(&mut self, sink: Sink, unit: u32) {
        match unit {
            0xD800..=0xDBFF => {
                self.flush_high(sink);
                self.pending_high = Some(unit);
            }
            0xDC00..=0xDFFF => match self.pending_high.take() {
                Some(high) => {
                    let c = 0x10000 + ((high - 0xD800) << 10) + (unit - 0xDC00);
                    self.emit_char(sink, char::from_u32(c).unwrap_or('\u{FFFD}'));
                }
                None => self.emit_char(sink, '\u{FFFD}'),
            },
            _ => {
                self.flush_high(sink);
                self.emit_char(sink, char::from_u32(unit).unwrap_or('\u{FFFD}'));
            }
        }
    }

    /// A high surrogate not followed by a low one stands for U+FFFD.
    fn flush_high(&mut self, sink: Sink) {
        if self.pending_high.take().is_some() {
            self.emit_char(sink, '\u{FFFD}');
        }
    }

    fn emit_char(&mut self, sink: Sink, c: char) {
        let mut buf = [0u8; 4];
        self.emit(sink, c.encode_utf8(&mut buf).as_bytes());
    }

    fn emit(&mut self, sink: Sink, bytes: &[u8]) {
        match sink {
            Sink::Skip => {}
            Sink::Text => {
                let Some(p) = self.parts.last_mut() else { return };
                let Some(text) = p.text.as_mut() else { return };
                let keep = bytes.len().min(self.left);
                text.extend_from_slice(&bytes[..keep]);
                self.left -= keep;
                p.text_cut += (bytes.len() - keep) as u64;
            }
            Sink::Blob => {
                if let Some(p) = self.parts.last_mut() {
                    *p.blob_len.get_or_insert(0) += bytes.len() as u64;
                }
            }
            Sink::Key | Sink::Id | Sink::Uri | Sink::Mime | Sink::Scope | Sink::Ttl => {
                if self.small.len() + bytes.len() <= SMALL {
                    self.small.extend_from_slice(bytes);
                }
            }
        }
    }

    fn end_string(&mut self, sink: Sink) {
        self.flush_high(sink);
        let small = || String::from_utf8_lossy(&self.small).into_owned();
        match sink {
            Sink::Key => {
                let depth = self.stack.len();
                let key = match (depth, self.small.as_slice()) {
                    (1, b"id") => Key::Id,
                    (1, b"result") => Key::Result,
                    (1, b"error") | (1, b"method") => Key::Error,
                    (2, b"contents") => Key::Contents,
                    (2, b"ttlMs") => Key::Ttl,
                    (2, b"cacheScope") => Key::Scope,
                    (4, b"uri") => Key::Uri,
                    (4, b"mimeType") => Key::Mime,
                    (4, b"text") => Key::Text,
                    (4, b"blob") => Key::Blob,
                    _ => Key::Other,
                };
                if key == Key::Error {
                    self.is_error = true;
                }
                if let Some(f) = self.stack.last_mut() {
                    f.key = key;
                    f.expect_key = false;
                }
            }
            Sink::Id => {
                self.id_text = self.small.clone();
                self.id_is_str = true;
            }
            Sink::Uri => {
                let uri = small();
                if let Some(p) = self.parts.last_mut() {
                    p.uri = uri;
                }
            }
            Sink::Mime => {
                let mime = small();
                if let Some(p) = self.parts.last_mut() {
                    p.mime = Some(mime);
                }
            }
            Sink::Scope => self.scope = Some(small()),
            Sink::Text | Sink::Blob | Sink::Skip | Sink::Ttl => {}
        }
        self.small.clear();
    }

    fn end_scalar(&mut self, sink: Sink) {
        let raw = std::str::from_utf8(&self.small).unwrap_or("");
        match sink {
            Sink::Id => {
                self.id_text = self.small.clone();
                self.id_is_str = false;
            }
            Sink::Ttl => self.ttl_ms = raw.parse::<u64>().ok(),
            _ => {}
        }
        self.small.clear();
    }

    /// The message: the read result with its text cut and its blobs
    /// emptied, or "answer larger than N bytes" for its `id` when it is not
    /// a read result (or is malformed), or `None` when it has no `id`.
    pub(crate) fn finish(mut self) -> Option<ServerJsonRpcMessage> {
        if let Lex::Scalar { sink } = self.lex {
            self.end_scalar(sink); // a top-level scalar ended by EOF
        }
        self.id = if self.id_is_str {
            Some(RequestId::String(String::from_utf8_lossy(&self.id_text).into_owned().into()))
        } else {
            std::str::from_utf8(&self.id_text).ok().and_then(|s| s.parse::<i64>().ok()).map(RequestId::Number)
        };
        let id = self.id.clone()?;
        let usable = self.done && !self.malformed && self.is_result && !self.is_error && self.has_contents;
        if !usable {
            return Some(JsonRpcMessage::Error(JsonRpcError {
                jsonrpc: JsonRpcVersion2_0,
                id: Some(id),
                error: ErrorData::new(ErrorCode(TOO_LARGE), self.too_large.clone(), None),
            }));
        }
        let mut contents = Vec::with_capacity(self.parts.len());
        for p in std::mem::take(&mut self.parts) {
            match (p.text, p.blob_len) {
                (Some(bytes), _) => {
                    let (text, cut_here) = cut_utf8(bytes);
                    let cut = p.text_cut + cut_here as u64;
                    let meta = (cut > 0).then(|| meta_with(TRUNCATED_BYTES, cut));
                    contents.push(ResourceContents::TextResourceContents { uri: p.uri, mime_type: p.mime, text, meta });
                }
                (None, Some(len)) => contents.push(ResourceContents::BlobResourceContents {
                    uri: p.uri,
                    mime_type: p.mime,
                    blob: String::new(),
                    meta: Some(meta_with(BLOB_BYTES, len)),
                }),
                (None, None) => {}
            }
        }
        let mut result = ReadResourceResult::new(contents);
        result.result_type = None;
        result.ttl_ms = self.ttl_ms;
        if let Some(scope) = &self.scope {
            result.cache_scope = serde_json::from_value(serde_json::Value::String(scope.clone())).ok();
        }
        Some(JsonRpcMessage::Response(JsonRpcResponse {
            jsonrpc: JsonRpcVersion2_0,
            id,
            result: ServerResult::ReadResourceResult(result),
        }))
    }
}

/// Kept bytes as text: a character cut in two at the end is dropped (and
/// counted as cut), anything invalid inside is replaced as serde would not.
fn cut_utf8(mut bytes: Vec<u8>) -> (String, usize) {
    match std::str::from_utf8(&bytes) {
        Ok(_) => (String::from_utf8(bytes).unwrap_or_default(), 0),
        Err(e) if e.error_len().is_none() => {
            let cut = bytes.len() - e.valid_up_to();
            bytes.truncate(e.valid_up_to());
            (String::from_utf8_lossy(&bytes).into_owned(), cut)
        }
        Err(_) => (String::from_utf8_lossy(&bytes).into_owned(), 0),
    }
}

fn meta_with(key: &str, n: u64) -> Meta {
    let mut m = Meta::new();
    m.0.insert(key.to_owned(), serde_json::Value::from(n));
    m
}

/// Bytes of a part's text that were cut, or the length of a blob that was
/// not kept, as the decoder marked them (0 / `None` for a normal part).
pub(crate) fn marks(meta: Option<&Meta>) -> (usize, Option<usize>) {
    let get = |k: &str| meta.and_then(|m| m.0.get(k)).and_then(serde_json::Value::as_u64).map(|v| v as usize);
    (get(TRUNCATED_BYTES).unwrap_or(0), get(BLOB_BYTES))
}

#[cfg(test)]
#[path = "large_tests.rs"]
mod tests;
