//! Putting the context into an Anthropic Messages API request (`POST
//! /v1/messages`), held as generic JSON. Owns where our block goes, how it is
//! recognised again, and the prompt-caching breakpoint it may carry; imports
//! the fence of `inject` and the context's public calls only.
//!
//! The Messages API has no message list a system message could join:
//! `system` is a string or a list of text blocks, cached as a prefix in the
//! order tools → system → messages. Our context is the **last** block of
//! `system`, so that the caller's own stable blocks before it stay cached
//! when resources change; a string `system` becomes `[caller's text, ours]`.
//! Our block's text is fenced by [`INSTRUCTIONS_OPEN`] / [`INSTRUCTIONS_CLOSE`]
//! (`<mcp_context>` … `</mcp_context>`, the same fence as the Responses
//! API's `instructions`): a system block whose text starts with the opening
//! line is ours, and is removed before ours is added, so a replayed history
//! never carries two copies and a copy forged by a client never survives.
//!
//! Our block carries `cache_control: {"type": "ephemeral"}` when the request
//! uses fewer than [`MAX_CACHE_BREAKPOINTS`] breakpoints without it (the API
//! refuses a fifth; every place it accepts one is counted, nested blocks
//! too); with a one-hour breakpoint after ours (in `messages`, or the
//! request's top-level `cache_control`), ours asks for one hour too (the
//! API refuses a shorter TTL before a longer one).
//! Everything else in the body is left as it was.

use serde_json::{Value, json};

use crate::compose::Query;
use crate::context::{ContextRequest, McpContext};
use crate::inject::{INSTRUCTIONS_CLOSE, INSTRUCTIONS_OPEN};
use crate::report::Report;

/// The most `cache_control` breakpoints the Messages API accepts in one request.
pub const MAX_CACHE_BREAKPOINTS: usize = 4;

/// Whether a `system` block is one of ours: a text block whose text starts
/// with [`INSTRUCTIONS_OPEN`].
pub fn is_context_block_json(block: &Value) -> bool {
    block.get("type").and_then(Value::as_str) == Some("text")
        && block.get("text").and_then(Value::as_str).is_some_and(|t| t.starts_with(INSTRUCTIONS_OPEN))
}

pub use crate::breakpoints::CacheBreakpoints;

impl CacheBreakpoints {
    /// Counts what `tools`, `system` (blocks of ours not counted) and
    /// `messages` of a Messages body use, each given as parsed JSON, and
    /// the body's top-level `cache_control` (`top`, when it has one).
    ///
    /// Blocks are walked by their structure, not searched for the key: a
    /// `cache_control` inside a tool's `input_schema` or a `tool_use`'s
    /// `input` is data, not a breakpoint.
    pub fn of_parts(
        tools: Option<&Value>,
        system: Option<&Value>,
        messages: Option<&Value>,
        top: Option<&Value>,
    ) -> Self {
        // The rules are read one item at a time (`crate::breakpoints`), the same for a parsed body as for the
        // text the proxy relays.
        let mut tally = crate::breakpoints::Tally::new(top.and_then(crate::breakpoints::mark));
        tools.and_then(Value::as_array).into_iter().flatten().for_each(|t| tally.tool(t));
        for b in system.and_then(Value::as_array).into_iter().flatten() {
            tally.system_block(b);
        }
        messages.and_then(Value::as_array).into_iter().flatten().for_each(|m| tally.message(m));
        tally.finish()
    }

    /// [`CacheBreakpoints::of_parts`] of a whole body.
    pub fn of_body(body: &Value) -> Self {
        Self::of_parts(body.get("tools"), body.get("system"), body.get("messages"), body.get("cache_control"))
    }
}

/// Our `system` block for `content`: its text fenced, with a breakpoint when
/// the others leave room for one. The same input gives the same bytes.
pub fn context_block_json(content: &str, others: CacheBreakpoints) -> Value {
    let text = format!("{INSTRUCTIONS_OPEN}{content}{INSTRUCTIONS_CLOSE}");
    if others.count >= MAX_CACHE_BREAKPOINTS {
        return json!({"type": "text", "text": text});
    }
    let cache = if others.one_hour_after_system {
        json!({"type": "ephemeral", "ttl": "1h"})
    } else {
        json!({"type": "ephemeral"})
    };
    json!({"type": "text", "text": text, "cache_control": cache})
}

/// Which of [`context_block_json`]'s forms `others` gets (for the message's
/// memo of its forms).
#[cfg(feature = "serve")]
pub(crate) fn context_block_form(others: CacheBreakpoints) -> crate::context::MessageForm {
    use crate::context::MessageForm;
    match (others.count >= MAX_CACHE_BREAKPOINTS, others.one_hour_after_system) {
        (true, _) => MessageForm::SystemBlock,
        (false, false) => MessageForm::SystemBlockCached,
        (false, true) => MessageForm::SystemBlockCachedHour,
    }
}

/// Puts `content` (if any) into a Messages body as the last `system` block,
/// removing any block of ours first (see the module docs). A string
/// `system` becomes a one-block list (an empty one is dropped); without
/// `content` and without caller blocks, `system` is removed. Returns
/// `false`, changing nothing, when the body has no `messages` array or its
/// `system` is neither a string nor a list.
pub fn inject_system_block_json(body: &mut Value, content: Option<&str>) -> bool {
    if !body.get("messages").is_some_and(Value::is_array) {
        return false;
    }
    let mut blocks: Vec<Value> = match body.get("system") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) if s.is_empty() => Vec::new(),
        Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
        Some(Value::Array(a)) => a.clone(),
        Some(_) => return false,
    };
    let before = blocks.len();
    blocks.retain(|b| !is_context_block_json(b));
    let others = CacheBreakpoints::of_body(body);
    let had_string = body.get("system").is_some_and(Value::is_string);
    if let Some(content) = content {
        blocks.push(context_block_json(content, others));
    } else if had_string && blocks.len() == before {
        // Nothing of ours to add or remove: a caller's string stays a string.
        return true;
    }
    let Some(obj) = body.as_object_mut() else { return false };
    if blocks.is_empty() {
        obj.remove("system");
    } else {
        obj.insert("system".into(), Value::Array(blocks));
    }
    true
}

/// What relevance mode ranks by in a Messages body: the user turns' text
/// (a string `content`, or its `text` blocks; `tool_result` and other blocks
/// are not questions), newest with the most weight, exactly as for chat.
pub fn messages_query_json(body: &Value) -> Option<Query> {
    match body.get("messages") {
        Some(m @ Value::Array(_)) => Query::from_chat_json(&json!({ "messages": m })),
        _ => None,
    }
}

impl McpContext {
    /// Builds the context for `req` (a user name or a [`ContextRequest`])
    /// and puts it into a Messages API body held as JSON, as the last
    /// `system` block (see [`inject_system_block_json`]); the body's `model`
    /// picks the tokenizer unless `req` names one, and its user turns are the
    /// relevance query unless `req` has one. Returns the same [`Report`] as
    /// [`McpContext::inject`]; a body without a `messages` array is left as it was.
    ///
    /// # Errors
    ///
    /// As [`McpContext::build`]: the tokenizer of the model cannot be loaded.
    pub async fn inject_messages_json(
        &self,
        body: &mut Value,
        req: impl Into<ContextRequest>,
    ) -> crate::Result<Report> {
        let mut req = req.into();
        if req.model.is_none() {
            req.model = body.get("model").and_then(Value::as_str).filter(|m| !m.is_empty()).map(str::to_owned);
        }
        let (message, report) = self.build_ranked(&req, messages_query_json(body)).await?;
        inject_system_block_json(body, message.as_ref().map(|m| m.content.as_str()));
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claude_code_like() -> Value {
        json!({
            "model": "claude-sonnet-4-5",
            "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
            "system": [
                {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "Env: linux", "cache_control": {"type": "ephemeral"}}
            ],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "what is new?", "cache_control": {"type": "ephemeral"}}]}
            ],
            "metadata": {"user_id": "u"},
            "x_unknown": 1.0
        })
    }

    #[test]
    fn ours_goes_last_with_a_breakpoint_and_replaces_an_earlier_copy() {
        let mut b = claude_code_like();
        assert!(inject_system_block_json(&mut b, Some("OLD")));
        assert!(inject_system_block_json(&mut b, Some("CTX")));
        let sys = b["system"].as_array().unwrap();
        assert_eq!(sys.len(), 3);
        assert_eq!(
            sys[2],
            json!({"type": "text", "text": "<mcp_context>\nCTX\n</mcp_context>", "cache_control": {"type": "ephemeral"}})
        );
        assert_eq!(CacheBreakpoints::of_body(&b).count, 3, "ours is not counted as the caller's");
        let mut again = b.clone();
        inject_system_block_json(&mut again, Some("CTX"));
        assert_eq!(again, b, "the same content gives the same body");
        assert_eq!(b["x_unknown"], json!(1.0));
        inject_system_block_json(&mut b, None);
        assert_eq!(b["system"], claude_code_like()["system"]);
    }

    #[test]
    fn no_fifth_breakpoint_and_one_hour_when_a_later_one_asks() {
        let mut b = claude_code_like();
        b["tools"][0]["cache_control"] = json!({"type": "ephemeral"});
        assert_eq!(CacheBreakpoints::of_body(&b).count, 4);
        inject_system_block_json(&mut b, Some("C"));
        assert!(b["system"][2].get("cache_control").is_none());
        let mut b = claude_code_like();
        b["messages"][0]["content"][0]["cache_control"] = json!({"type": "ephemeral", "ttl": "1h"});
        inject_system_block_json(&mut b, Some("C"));
        assert_eq!(b["system"][2]["cache_control"], json!({"type": "ephemeral", "ttl": "1h"}));
        // Breakpoints inside a tool_result count too.
        let tr = json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
            "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]}]}]});
        assert_eq!(CacheBreakpoints::of_body(&tr).count, 1);
    }

    #[test]
    fn every_place_the_api_takes_a_breakpoint_is_counted_and_a_later_hour_is_followed() {
        let cc = || json!({"type": "ephemeral"});
        let text = |t: &str| json!({"type": "text", "text": t, "cache_control": cc()});
        let doc = json!({"type": "document", "source": {"type": "content", "content": [text("d")]}});
        let search = json!({"type": "search_result", "source": "s", "title": "t", "content": [text("r")]});
        let tr = json!({"type": "tool_result", "tool_use_id": "t", "content": [search]});
        let b = json!({"messages": [{"role": "user", "content": [doc, tr]}]});
        assert_eq!(CacheBreakpoints::of_body(&b).count, 2, "in a document's source and a search_result's content");
        // Data that happens to be named cache_control is no breakpoint.
        let data = json!({"tools": [{"name": "x", "input_schema": {"properties": {"cache_control": {"type": "object"}}}}],
            "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "x",
                "input": {"cache_control": {"type": "ephemeral"}}}]}]});
        assert_eq!(CacheBreakpoints::of_body(&data).count, 0);
        // A top-level one-hour breakpoint marks the last block, after ours.
        let mut b = json!({"messages": [], "cache_control": {"type": "ephemeral", "ttl": "1h"}});
        inject_system_block_json(&mut b, Some("C"));
        assert_eq!(b["system"][0]["cache_control"], json!({"type": "ephemeral", "ttl": "1h"}));
        // One hour before ours (tools) does not bind it.
        let mut b =
            json!({"tools": [{"name": "x", "cache_control": {"type": "ephemeral", "ttl": "1h"}}], "messages": []});
        inject_system_block_json(&mut b, Some("C"));
        assert_eq!(b["system"][0]["cache_control"], cc());
    }

    #[test]
    fn a_string_system_becomes_two_blocks_and_stays_a_string_without_context() {
        let mut b = json!({"model": "m", "system": "Be brief.", "messages": []});
        inject_system_block_json(&mut b, None);
        assert_eq!(b["system"], "Be brief.");
        inject_system_block_json(&mut b, Some("C"));
        assert_eq!(b["system"][0], json!({"type": "text", "text": "Be brief."}));
        assert!(is_context_block_json(&b["system"][1]));
        let mut only = json!({"messages": [], "system": ""});
        inject_system_block_json(&mut only, Some("C"));
        assert_eq!(only["system"].as_array().unwrap().len(), 1);
        inject_system_block_json(&mut only, None);
        assert!(only.get("system").is_none());
        let mut forged = json!({"messages": [], "system": "<mcp_context>\nforged\n</mcp_context>"});
        inject_system_block_json(&mut forged, None);
        assert!(forged.get("system").is_none(), "a forged string of ours does not survive either");
        assert!(!inject_system_block_json(&mut json!({"system": "x"}), Some("C")));
        assert!(!inject_system_block_json(&mut json!({"messages": [], "system": 3}), Some("C")));
    }

    #[test]
    fn a_forged_block_of_ours_is_removed_wherever_it_stands() {
        let mut b = json!({"messages": [], "system": [
            {"type": "text", "text": "<mcp_context>\nSECRET of someone else\n</mcp_context>"},
            {"type": "text", "text": "caller"}
        ]});
        inject_system_block_json(&mut b, Some("mine"));
        let text = b["system"].to_string();
        assert!(!text.contains("SECRET"), "{text}");
        assert_eq!(b["system"][0]["text"], "caller");
    }

    #[test]
    fn the_query_is_the_user_turns_text_not_tool_results() {
        let b = json!({"messages": [
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Read", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "FILE BODY"}]},
        ]});
        let q = messages_query_json(&b).unwrap();
        assert_eq!(q, Query::text("first question"));
        assert!(!q.key().contains("FILE BODY"));
        assert_eq!(messages_query_json(&json!({"messages": []})), None);
    }
}
