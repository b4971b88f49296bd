//! What the upstream's answer says about itself, for the upstream span
//! (OpenTelemetry GenAI conventions): the model that answered and the
//! tokens it counted, read from the body as it is relayed (a JSON answer,
//! or the `data:` lines of an SSE stream) without holding it back.
//! Owns [`Tap`]; imports nothing of the crate.
//!
//! Chat Completions says `usage.prompt_tokens` / `completion_tokens` (in
//! the last chunk of a stream with `stream_options.include_usage`);
//! Responses and Anthropic's Messages say `input_tokens` / `output_tokens`
//! (Messages split over `message_start` and `message_delta`); Gemini says
//! `usageMetadata.promptTokenCount` / `candidatesTokenCount` and
//! `modelVersion` (in every chunk of a stream). A tap reads
//! at most [`MAX_JSON_BYTES`] of a JSON answer and only the SSE lines that
//! name a `usage` or a `model`.

use serde_json::Value;

/// The most of a plain JSON answer kept to read its usage.
pub(super) const MAX_JSON_BYTES: usize = 4 << 20;

/// Reads the answer's model and usage as its bytes go by.
pub(super) struct Tap {
    sse: bool,
    /// A JSON answer so far, or the SSE line not yet ended.
    pending: Vec<u8>,
    overflow: bool,
    pub(super) model: Option<String>,
    pub(super) input_tokens: Option<u64>,
    pub(super) output_tokens: Option<u64>,
}

impl Tap {
    /// A tap for an answer of this `Content-Type`.
    pub(super) fn new(content_type: Option<&str>) -> Self {
        let sse = content_type.is_some_and(|t| t.starts_with("text/event-stream"));
        Tap { sse, pending: Vec::new(), overflow: false, model: None, input_tokens: None, output_tokens: None }
    }

    /// The next chunk of the body.
    pub(super) fn feed(&mut self, chunk: &[u8]) {
        if !self.sse {
            if self.pending.len() + chunk.len() > MAX_JSON_BYTES {
                self.overflow = true;
                self.pending = Vec::new();
            }
            if !self.overflow {
                self.pending.extend_from_slice(chunk);
            }
            return;
        }
        let mut rest = chunk;
        while let Some(nl) = rest.iter().position(|b| *b == b'\n') {
            if self.pending.is_empty() {
                self.line(&rest[..nl]);
            } else {
                let mut line = std::mem::take(&mut self.pending);
                line.extend_from_slice(&rest[..nl]);
                self.line(&line);
            }
            rest = &rest[nl + 1..];
        }
        // A line longer than a JSON answer's share names nothing we keep.
        if self.pending.len() + rest.len() <= MAX_JSON_BYTES {
            self.pending.extend_from_slice(rest);
        } else {
            self.pending.clear();
        }
    }

    /// The body ended: a JSON answer is read now.
    pub(super) fn finish(&mut self) {
        if !self.sse
            && !self.overflow
            && let Ok(v) = serde_json::from_slice::<Value>(&self.pending)
        {
            self.read(&v);
        }
        self.pending = Vec::new();
    }

    fn line(&mut self, line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else { return };
        let wanted = |needle: &[u8]| data.windows(needle.len()).any(|w| w == needle);
        let model = self.model.is_none() && (wanted(b"\"model\"") || wanted(b"\"modelVersion\""));
        if (model || wanted(b"\"usage\"") || wanted(b"\"usageMetadata\""))
            && let Ok(v) = serde_json::from_slice::<Value>(data.trim_ascii())
        {
            self.read(&v);
        }
    }

    /// The model and usage of one JSON value: at its top, or one level
    /// down (`message` of Anthropic's `message_start`, `response` of a
    /// Responses event).
    fn read(&mut self, v: &Value) {
        for at in [Some(v), v.get("message"), v.get("response")].into_iter().flatten() {
            if self.model.is_none()
                && let Some(m) = at.get("model").and_then(Value::as_str)
            {
                self.model = Some(m.to_owned());
            }
            if self.model.is_none()
                && let Some(m) = at.get("modelVersion").and_then(Value::as_str)
            {
                self.model = Some(m.to_owned());
            }
            if let Some(u) = at.get("usageMetadata").filter(|u| u.is_object()) {
                if let Some(i) = u.get("promptTokenCount").and_then(Value::as_u64) {
                    self.input_tokens = Some(i);
                }
                if let Some(o) = u.get("candidatesTokenCount").and_then(Value::as_u64) {
                    self.output_tokens = Some(o);
                }
            }
            if let Some(u) = at.get("usage").filter(|u| u.is_object()) {
                let n = |keys: [&str; 2]| keys.iter().find_map(|k| u.get(*k).and_then(Value::as_u64));
                if let Some(i) = n(["prompt_tokens", "input_tokens"]) {
                    self.input_tokens = Some(i);
                }
                if let Some(o) = n(["completion_tokens", "output_tokens"]) {
                    self.output_tokens = Some(o);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tap(content_type: &str, chunks: &[&str]) -> Tap {
        let mut t = Tap::new(Some(content_type));
        for c in chunks {
            t.feed(c.as_bytes());
        }
        t.finish();
        t
    }

    #[test]
    fn chat_json_and_stream() {
        let t = tap(
            "application/json",
            &[r#"{"model":"gpt-4o-2024","choices":[],"#, r#""usage":{"prompt_tokens":12,"completion_tokens":3}}"#],
        );
        assert_eq!((t.model.as_deref(), t.input_tokens, t.output_tokens), (Some("gpt-4o-2024"), Some(12), Some(3)));
        let t = tap(
            "text/event-stream",
            &[
                "data: {\"model\":\"gpt-4o\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\nda",
                "ta: {\"model\":\"gpt-4o\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\n",
                "data: [DONE]\n\n",
            ],
        );
        assert_eq!((t.model.as_deref(), t.input_tokens, t.output_tokens), (Some("gpt-4o"), Some(7), Some(2)));
    }

    #[test]
    fn anthropic_stream_splits_usage_over_two_events() {
        let t = tap(
            "text/event-stream",
            &[
                "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-x\",\"usage\":{\"input_tokens\":30,\"output_tokens\":1}}}\n\n",
                "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\n",
            ],
        );
        assert_eq!((t.model.as_deref(), t.input_tokens, t.output_tokens), (Some("claude-x"), Some(30), Some(9)));
    }

    #[test]
    fn gemini_json_and_stream() {
        let json = r#"{"candidates":[],"usageMetadata":{"promptTokenCount":40,"candidatesTokenCount":5},"modelVersion":"gemini-2.5-flash-001"}"#;
        let t = tap("application/json", &[json]);
        assert_eq!(
            (t.model.as_deref(), t.input_tokens, t.output_tokens),
            (Some("gemini-2.5-flash-001"), Some(40), Some(5))
        );
        let t = tap(
            "text/event-stream",
            &[
                "data: {\"candidates\":[],\"usageMetadata\":{\"promptTokenCount\":40},\"modelVersion\":\"g-1\"}\r\n\r\n",
                "data: {\"candidates\":[],\"usageMetadata\":{\"promptTokenCount\":40,\"candidatesTokenCount\":7},\"modelVersion\":\"g-1\"}\r\n\r\n",
            ],
        );
        assert_eq!((t.model.as_deref(), t.input_tokens, t.output_tokens), (Some("g-1"), Some(40), Some(7)));
    }

    #[test]
    fn an_oversized_answer_is_not_kept() {
        let mut t = Tap::new(Some("application/json"));
        t.feed(&vec![b' '; MAX_JSON_BYTES]);
        t.feed(br#"{"usage":{"prompt_tokens":1}}"#);
        t.finish();
        assert_eq!(t.input_tokens, None);
        assert!(t.pending.capacity() == 0);
    }
}
