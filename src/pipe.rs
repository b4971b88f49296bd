//! The stdio transport under rmcp's client service: newline-delimited
//! JSON-RPC over a child's stdin/stdout.
//!
//! rmcp keeps the lifecycle (handshake, request ids, responders,
//! notifications); this module only moves bytes, for two measured reasons
//! (BENCHMARKS.md, "read path"):
//! - rmcp's `TokioChildProcess` writes and flushes every message on its own,
//!   so 1000 concurrent reads cost 1000 `write(2)` calls and as many wake-ups
//!   of the server. Here `send` serialises the message and queues it; one
//!   writer task writes whatever is queued in a single call.
//! - rmcp decodes every incoming line through its untagged message enums,
//!   which buffer the whole message and try variant after variant (about
//!   7.6 µs for a 2 KB `resources/read` answer). Here the answer to a request
//!   we sent as `resources/read` is decoded straight into its result type;
//!   every other line still goes through rmcp's own decoder, so notifications,
//!   errors and server requests behave exactly as before.
//!
//! A line longer than [`MAX_LINE`] is not kept whole: it is decoded as it
//! arrives (`large`), so a huge `resources/read` answer keeps its first
//! `max_resource_bytes` of text, cut and marked, in bounded memory; any
//! other over-long message fails its request at once with "answer larger
//! than N bytes" rather than waiting out its timeout. Lines that are not MCP
//! messages (junk, or JSON of another shape) are ignored, where rmcp's own
//! transport answers the second kind with an Invalid Request error that a
//! confused server may echo back; a blank line, a trailing `\r` and a UTF-8
//! byte-order mark are tolerated. The first ignored line is kept in [`Diagnostics`] (a banner, or
//! the wrong program entirely, is what a user needs to see when a handshake
//! fails) and, once connected, warned about once.
//!
//! Layer: sources (a transport). Imports only `large` and `server_process`.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex};

use rmcp::RoleClient;
use rmcp::model::{
    ClientJsonRpcMessage, ClientRequest, JsonRpcError, JsonRpcMessage, JsonRpcResponse, JsonRpcVersion2_0,
    ReadResourceResult, RequestId, ResourceContents, ServerJsonRpcMessage, ServerResult,
};
use rmcp::transport::Transport;
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::mpsc;

use crate::large::LargeAnswer;
use crate::server_process::ServerProcess;

/// Longest line accepted from a server (the same cap as rmcp's).
pub(crate) const MAX_LINE: usize = 16 * 1024 * 1024;
/// Most bytes gathered into one write.
const MAX_BATCH: usize = 1 << 20;

/// Longest excerpt of a non-JSON line kept for messages.
const JUNK_EXCERPT: usize = 120;

/// What the pipe saw that explains a failure: shared with the hub, which
/// outlives the transport (rmcp drops it when a handshake fails).
#[derive(Default)]
pub(crate) struct Diagnostics {
    state: Mutex<DiagState>,
}

#[derive(Default)]
struct DiagState {
    server: String,
    first_junk: Option<String>,
    warned: bool,
    connected: bool,
    exit: Option<std::process::ExitStatus>,
}

impl Diagnostics {
    /// Diagnostics of the server called `server` (for its warnings).
    pub(crate) fn new(server: &str) -> Arc<Diagnostics> {
        Arc::new(Diagnostics { state: Mutex::new(DiagState { server: server.to_owned(), ..DiagState::default() }) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DiagState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The first line the server wrote on stdout that was not an MCP
    /// message, quoted and truncated.
    pub(crate) fn first_junk(&self) -> Option<String> {
        self.lock().first_junk.clone()
    }

    /// How the process ended, if it did while its stdout was read.
    pub(crate) fn exit_status(&self) -> Option<std::process::ExitStatus> {
        self.lock().exit
    }

    /// The handshake succeeded: junk seen so far (and the first one seen
    /// later) is a warning, once, rather than part of an error.
    pub(crate) fn connected(&self) {
        let mut s = self.lock();
        s.connected = true;
        s.warn_once();
    }

    fn junk(&self, line: &[u8]) {
        let mut s = self.lock();
        if s.first_junk.is_none() {
            s.first_junk = Some(excerpt(line));
        }
        if s.connected {
            s.warn_once();
        }
    }
}

impl DiagState {
    fn warn_once(&mut self) {
        if let Some(junk) = &self.first_junk
            && !std::mem::replace(&mut self.warned, true)
        {
            tracing::warn!("server `{}` wrote non-JSON on stdout (ignored): {junk}", self.server);
        }
    }
}

/// `'text'`, lossy UTF-8, control characters escaped, at most
/// [`JUNK_EXCERPT`] characters (then `…`).
fn excerpt(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    let mut out = String::from("'");
    for (i, c) in text.chars().enumerate() {
        if i == JUNK_EXCERPT {
            out.push('…');
            break;
        }
        if c.is_control() { out.extend(c.escape_default()) } else { out.push(c) }
    }
    out.push('\'');
    out
}

/// A spawned server's pipes, as an rmcp [`Transport`].
pub(crate) struct ChildPipe {
    /// Waited for without being reaped (see `server_process`).
    process: Option<Arc<ServerProcess>>,
    stdout: BufReader<ChildStdout>,
    line: Vec<u8>,
    max_line: usize,
    /// The line being read is over [`MAX_LINE`]: it is decoded as it
    /// arrives instead of being kept.
    discarding: Option<Box<LargeAnswer>>,
    /// Bytes of text kept from an over-long read answer.
    max_text: usize,
    queue: Option<mpsc::UnboundedSender<Vec<u8>>>,
    writer: Option<tokio::task::JoinHandle<()>>,
    /// Ids of our `resources/read` requests still waiting for an answer.
    reads: Arc<Mutex<HashSet<RequestId>>>,
    diag: Arc<Diagnostics>,
}

impl ChildPipe {
    /// Takes the child's stdin and stdout (both must be piped); the child
    /// must lead its own process group, and is kept as a [`ServerProcess`]
    /// ([`ChildPipe::process`]). What the pipe notices (junk, the exit
    /// status) goes to `diag`. An over-long read answer keeps `max_text`
    /// bytes of its text.
    pub(crate) fn new(
        mut child: tokio::process::Child,
        diag: Arc<Diagnostics>,
        max_text: usize,
    ) -> std::io::Result<ChildPipe> {
        let missing = |what| std::io::Error::other(format!("the child's {what} is not piped"));
        let stdin = child.stdin.take().ok_or_else(|| missing("stdin"))?;
        let stdout = child.stdout.take().ok_or_else(|| missing("stdout"))?;
        let (queue, rx) = mpsc::unbounded_channel();
        Ok(ChildPipe {
            process: ServerProcess::new(child).map(Arc::new),
            stdout: BufReader::with_capacity(64 * 1024, stdout),
            line: Vec::new(),
            max_line: MAX_LINE,
            discarding: None,
            max_text,
            queue: Some(queue),
            writer: Some(tokio::spawn(write_loop(stdin, rx))),
            reads: Arc::default(),
            diag,
        })
    }

    /// The server process, for its owner to signal and, at the end, drop.
    pub(crate) fn process(&self) -> Option<Arc<ServerProcess>> {
        self.process.clone()
    }

    /// The server's stdout ended: note how the process ended (it usually
    /// exits at the same moment; a process that only closed stdout is not
    /// waited for long).
    async fn note_exit(&mut self) {
        if let Some(process) = &self.process
            && let Some(status) = process.wait_exit(Some(std::time::Duration::from_millis(500))).await
        {
            self.diag.lock().exit = Some(status);
        }
    }

    /// Reads one line into `self.line`, never holding more than [`MAX_LINE`]
    /// bytes (a longer one comes back as [`Line::Overlong`]). Cancel-safe: a
    /// partial line stays in `self` for the next call (rmcp polls `receive`
    /// inside a `select!`).
    async fn read_line(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            let available = self.stdout.fill_buf().await?;
            if available.is_empty() {
                return Ok(None);
            }
            let (take, done) = match memchr::memchr(b'\n', available) {
                Some(i) => (i + 1, true),
                None => (available.len(), false),
            };
            match &mut self.discarding {
                Some(large) => {
                    large.feed(&available[..take]);
                }
                None if self.line.len() + take > self.max_line => {
                    let mut large = Box::new(LargeAnswer::new(self.max_text, self.max_line));
                    large.feed(&self.line);
                    large.feed(&available[..take]);
                    // Give the buffer back: it held a 16 MiB start of line.
                    self.line = Vec::new();
                    self.discarding = Some(large);
                }
                None => self.line.extend_from_slice(&available[..take]),
            }
            self.stdout.consume(take);
            if done {
                return Ok(Some(match self.discarding.take() {
                    Some(over) => Line::Overlong(over),
                    None => Line::Complete,
                }));
            }
        }
    }

    /// An over-long line, decoded: the read answer with its text cut, or
    /// an error for the request it answers ("answer larger than N bytes"),
    /// so that the caller hears at once; nothing when it has no `id`.
    fn overlong(&self, large: LargeAnswer) -> Option<ServerJsonRpcMessage> {
        let msg = large.finish();
        tracing::debug!(max = self.max_line, usable = msg.is_some(), "a server sent a line over the limit");
        if let Some(
            JsonRpcMessage::Response(JsonRpcResponse { id, .. })
            | JsonRpcMessage::Error(JsonRpcError { id: Some(id), .. }),
        ) = &msg
        {
            self.reads.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
        }
        msg
    }

    fn decode(&self, line: &[u8]) -> Option<ServerJsonRpcMessage> {
        let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
        if let Some(msg) = self.decode_read_answer(line) {
            return Some(msg);
        }
        match serde_json::from_slice::<ServerJsonRpcMessage>(line) {
            Ok(msg) => {
                if let JsonRpcMessage::Response(JsonRpcResponse { id, .. })
                | JsonRpcMessage::Error(JsonRpcError { id: Some(id), .. }) = &msg
                {
                    self.reads.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
                }
                Some(msg)
            }
            Err(e) => {
                tracing::debug!("ignoring a line the server sent that is not an MCP message: {e}");
                self.diag.junk(line);
                None
            }
        }
    }

    /// The fast path: an answer to one of our `resources/read` requests,
    /// decoded without rmcp's untagged enums. `None` sends the line down the
    /// general path (anything unusual: an error, a stray `method`, a result
    /// that does not have the shape of a read result).
    fn decode_read_answer(&self, line: &[u8]) -> Option<ServerJsonRpcMessage> {
        #[derive(Deserialize)]
        struct Envelope<'a> {
            jsonrpc: Option<&'a str>,
            id: Option<RequestId>,
            #[serde(borrow)]
            result: Option<&'a serde_json::value::RawValue>,
            error: Option<serde::de::IgnoredAny>,
            method: Option<serde::de::IgnoredAny>,
        }
        let env: Envelope = serde_json::from_slice(line).ok()?;
        let (Some("2.0"), Some(id), Some(result), None, None) =
            (env.jsonrpc, env.id, env.result, env.error, env.method)
        else {
            return None;
        };
        if !self.reads.lock().unwrap_or_else(|e| e.into_inner()).contains(&id) {
            return None;
        }
        let result = decode_read_result(result.get())?;
        self.reads.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        Some(JsonRpcMessage::Response(JsonRpcResponse {
            jsonrpc: JsonRpcVersion2_0,
            id,
            result: ServerResult::ReadResourceResult(result),
        }))
    }
}

/// What [`ChildPipe::read_line`] read.
enum Line {
    /// A whole line, in `ChildPipe::line`.
    Complete,
    /// A line over the limit, decoded as it arrived.
    Overlong(Box<LargeAnswer>),
}

/// Decodes a `resources/read` result the common way: contents that are each
/// plainly text or plainly a blob, and at most the 2026-07-28 fields every
/// such answer carries: `resultType: "complete"`, `ttlMs` (a non-negative
/// integer) and `cacheScope` (`public` or `private`). Those are decoded
/// here exactly as rmcp decodes them. Anything else goes to rmcp:
/// - a `resultType` other than `complete` (e.g. `input_required`): `None`,
///   so the whole line takes rmcp's general path and becomes whatever rmcp
///   makes of it, never a read result;
/// - `_meta`, an odd `ttlMs` or `cacheScope`, an odd part: rmcp's own
///   `ReadResourceResult`.
///
/// The outcome is the same as rmcp's, only cheaper for the usual case (rmcp's
/// untagged `ResourceContents` buffers every part). The fields known here
/// are [`READ_RESULT_FIELDS`] and [`READ_PART_FIELDS`]; a test fails if rmcp's
/// types gain one, since the fast path would silently drop it.
fn decode_read_result(raw: &str) -> Option<ReadResourceResult> {
    type Raw<'a> = Option<&'a serde_json::value::RawValue>;
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Plain<'a> {
        contents: Vec<Part<'a>>,
        #[serde(borrow)]
        ttl_ms: Raw<'a>,
        #[serde(borrow)]
        cache_scope: Raw<'a>,
        #[serde(borrow)]
        result_type: Raw<'a>,
        #[serde(rename = "_meta", borrow)]
        meta: Raw<'a>,
    }
    #[derive(Deserialize)]
    struct Part<'a> {
        uri: String,
        #[serde(rename = "mimeType")]
        mime_type: Option<String>,
        text: Option<String>,
        blob: Option<String>,
        #[serde(rename = "_meta", borrow)]
        meta: Raw<'a>,
    }
    let full = || serde_json::from_str::<ReadResourceResult>(raw).ok();
    let Ok(plain) = serde_json::from_str::<Plain>(raw) else { return full() };
    let result_type = match plain.result_type.map(|r| r.get()) {
        None => None,
        Some(r#""complete""#) => Some(rmcp::model::ResultType::COMPLETE),
        // Not a finished read (or not understood): rmcp decides what it is.
        Some(_) => return None,
    };
    let ttl_ms = match plain.ttl_ms.map(|r| r.get()) {
        None => None,
        Some(t) => match t.parse::<u64>() {
            Ok(t) => Some(t),
            Err(_) => return full(), // null, negative, fractional: rmcp's rules
        },
    };
    let cache_scope = match plain.cache_scope.map(|r| r.get()) {
        None => None,
        Some(r#""public""#) => Some(rmcp::model::CacheScope::Public),
        Some(r#""private""#) => Some(rmcp::model::CacheScope::Private),
        Some(_) => return full(),
    };
    if plain.meta.is_some() {
        return full();
    }
    let mut contents = Vec::with_capacity(plain.contents.len());
    for p in plain.contents {
        contents.push(match (p.text, p.blob, p.meta) {
            (Some(text), None, None) => {
                ResourceContents::TextResourceContents { uri: p.uri, mime_type: p.mime_type, text, meta: None }
            }
            (None, Some(blob), None) => {
                ResourceContents::BlobResourceContents { uri: p.uri, mime_type: p.mime_type, blob, meta: None }
            }
            _ => return full(),
        });
    }
    let mut result = ReadResourceResult::new(contents);
    result.result_type = result_type; // as on the wire
    result.ttl_ms = ttl_ms;
    result.cache_scope = cache_scope;
    Some(result)
}

/// The fields of a read result [`decode_read_result`] knows.
#[cfg(test)]
const READ_RESULT_FIELDS: &[&str] = &["contents", "ttlMs", "cacheScope", "resultType", "_meta"];
/// The fields of one part of a read result [`decode_read_result`] knows.
#[cfg(test)]
const READ_PART_FIELDS: &[&str] = &["uri", "mimeType", "text", "blob", "_meta"];

/// Writes queued messages, as many as are waiting in one call. Ends when the
/// queue closes (then stdin is dropped, which the server sees as EOF) or
/// when the server stops reading.
async fn write_loop(mut stdin: ChildStdin, mut rx: mpsc::UnboundedReceiver<Vec<u8>>) {
    while let Some(mut batch) = rx.recv().await {
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(more) => batch.extend_from_slice(&more),
                Err(_) => break,
            }
        }
        if let Err(e) = stdin.write_all(&batch).await {
            tracing::debug!("the server stopped reading its stdin: {e}");
            break;
        }
    }
}

impl Transport<RoleClient> for ChildPipe {
    type Error = std::io::Error;

    /// Queues the message; it is written by the writer task. A write that
    /// fails after this returned shows up as the server's stdout closing.
    fn send(&mut self, item: ClientJsonRpcMessage) -> impl Future<Output = std::io::Result<()>> + Send + 'static {
        let read_id = match &item {
            JsonRpcMessage::Request(r) if matches!(r.request, ClientRequest::ReadResourceRequest(_)) => {
                Some(r.id.clone())
            }
            _ => None,
        };
        let result = serde_json::to_vec(&item).map_err(std::io::Error::other).and_then(|mut bytes| {
            bytes.push(b'\n');
            if let Some(id) = read_id {
                self.reads.lock().unwrap_or_else(|e| e.into_inner()).insert(id);
            }
            let closed = || std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the server's stdin is closed");
            self.queue.as_ref().ok_or_else(closed)?.send(bytes).map_err(|_| closed())
        });
        std::future::ready(result)
    }

    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        loop {
            match self.read_line().await {
                Ok(Some(Line::Complete)) => {}
                Ok(Some(Line::Overlong(large))) => match self.overlong(*large) {
                    Some(msg) => return Some(msg),
                    None => continue,
                },
                Ok(None) => {
                    self.note_exit().await;
                    return None;
                }
                Err(e) => {
                    tracing::debug!("reading the server's stdout failed: {e}");
                    self.note_exit().await;
                    return None;
                }
            }
            let line = std::mem::take(&mut self.line);
            let trimmed = line.strip_suffix(b"\n").unwrap_or(&line);
            let trimmed = trimmed.strip_suffix(b"\r").unwrap_or(trimmed);
            let msg = if trimmed.iter().all(u8::is_ascii_whitespace) { None } else { self.decode(trimmed) };
            self.line = line;
            self.line.clear();
            if let Some(msg) = msg {
                return Some(msg);
            }
        }
    }

    /// Closes stdin once everything queued is written, then waits for the
    /// process to exit. Callers bound the wait and escalate to signals
    /// (see `hub::connect::shutdown`).
    async fn close(&mut self) -> std::io::Result<()> {
        drop(self.queue.take());
        if let Some(writer) = self.writer.take() {
            let _ = writer.await;
        }
        if let Some(process) = &self.process {
            process.wait_exit(None).await;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "pipe_tests.rs"]
mod tests;
