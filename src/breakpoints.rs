//! Counting the `cache_control` breakpoints of a Messages API body one
//! tool, block or message at a time, never holding the body as a tree: the
//! rules of [`CacheBreakpoints`] (owned here, re-exported by `messages`), read by
//! serde visitors that skip what they do not look at. The same visitors read
//! a parsed `Value` (the library's [`CacheBreakpoints::of_parts`], re-exported
//! by the messages module) and the text a caller sent
//! (the proxy's `/v1/messages`, where a body of 380 000 blocks parsed as a
//! `Value` held some 600 MiB).
//!
//! Imports the fence of `inject` and the query's JSON helpers only (never
//! `messages`, which builds on this).

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::compose::{MaybeStr, not_a_map, scalars};
use crate::inject::INSTRUCTIONS_OPEN;

/// The breakpoints a Messages body already uses outside our block.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheBreakpoints {
    /// `cache_control` objects wherever the Messages API accepts one: tools,
    /// the caller's system blocks, message content blocks of every kind and
    /// the blocks nested in them (a `tool_result`'s or a `search_result`'s
    /// `content`, a `document`'s `source.content`, at any depth), and the
    /// request's own top-level one.
    pub count: usize,
    /// A breakpoint after ours (in `messages`, or the top-level one, which
    /// marks the request's last block) asks for `ttl: "1h"`: the longest
    /// TTL the API offers, so ours must ask for it too (the API refuses a
    /// shorter TTL before a longer one). Breakpoints before ours (tools, the
    /// caller's system blocks) do not bind ours.
    pub one_hour_after_system: bool,
}

/// The breakpoints counted so far.
pub(crate) struct Tally(CacheBreakpoints);

/// How deep blocks nest before the count stops looking (the API nests two
/// or three levels; a body nesting deeper is refused upstream anyway), so a
/// hostile body cannot recurse us away.
const MAX_DEPTH: usize = 8;

impl Tally {
    /// A tally that starts with the request's own top-level breakpoint, if
    /// any: `Some(asks for an hour)`. It marks the request's last block,
    /// after ours, so its TTL binds ours.
    pub(crate) fn new(top: Option<bool>) -> Self {
        Self(CacheBreakpoints { count: usize::from(top.is_some()), one_hour_after_system: top == Some(true) })
    }

    /// One tool: its breakpoint counts (its `input_schema` is data).
    pub(crate) fn tool<'de, D: Deserializer<'de>>(&mut self, tool: D) {
        if let Ok(b) = tool.deserialize_any(BlockVisitor { depth: None }) {
            self.0.count += usize::from(b.mark.is_some());
        }
    }

    /// One `system` block: its breakpoint counts unless the block is ours.
    /// Returns whether it is ours (a text block whose text opens with our fence).
    pub(crate) fn system_block<'de, D: Deserializer<'de>>(&mut self, block: D) -> bool {
        let Ok(b) = block.deserialize_any(BlockVisitor { depth: None }) else { return false };
        let ours = b.text && b.fenced;
        if !ours {
            self.0.count += usize::from(b.mark.is_some());
        }
        ours
    }

    /// One message: the breakpoints of its content blocks and of the blocks
    /// nested in them (a `tool_result`'s or `search_result`'s `content`, a
    /// `document`'s `source.content`), and whether one asks for an hour.
    pub(crate) fn message<'de, D: Deserializer<'de>>(&mut self, message: D) {
        if let Ok(Message(m)) = Message::deserialize(message) {
            self.0.count += m.count;
            self.0.one_hour_after_system |= m.one_hour_after_system;
        }
    }

    pub(crate) fn finish(self) -> CacheBreakpoints {
        self.0
    }
}

/// A `cache_control` value as the count reads it: `Some(asks for an hour)`
/// when it is an object, `None` otherwise (not a breakpoint).
pub(crate) fn mark<'de, D: Deserializer<'de>>(value: D) -> Option<bool> {
    Mark::deserialize(value).ok().and_then(|m| m.0)
}

/// A block (or tool) as the count reads it.
#[derive(Default)]
struct Block {
    /// Its `cache_control`, when an object: whether it asks for `ttl: "1h"`.
    mark: Option<bool>,
    /// `type: "text"`.
    text: bool,
    /// Its `text` starts with [`INSTRUCTIONS_OPEN`].
    fenced: bool,
    /// The marks of the blocks nested in it (`content`, `source.content`), at any depth.
    inner: CacheBreakpoints,
}

impl Block {
    /// Its own mark and its nested ones, added to `n`.
    fn add_to(&self, n: &mut CacheBreakpoints) {
        if let Some(hour) = self.mark {
            n.count += 1;
            n.one_hour_after_system |= hour;
        }
        n.count += self.inner.count;
        n.one_hour_after_system |= self.inner.one_hour_after_system;
    }
}

/// Reads a block; `depth`: `Some(d)` for a message's block `d` levels down,
/// whose nested blocks are read too while `d < MAX_DEPTH`; `None` for a
/// tool or system block (their own mark only).
#[derive(Clone, Copy)]
struct BlockVisitor {
    depth: Option<usize>,
}

impl BlockVisitor {
    /// The depth of the blocks nested in this one, if they are read.
    fn below(self) -> Option<usize> {
        self.depth.filter(|d| *d < MAX_DEPTH).map(|d| d + 1)
    }
}

impl<'de> Visitor<'de> for BlockVisitor {
    type Value = Block;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a content block")
    }
    not_a_map!();
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Block, A::Error> {
        let mut b = Block::default();
        let below = self.below();
        while let Some(MaybeStr(key)) = map.next_key::<MaybeStr<'de>>()? {
            match (key.as_deref(), below) {
                (Some("cache_control"), _) => b.mark = map.next_value::<Mark>()?.0,
                (Some("type"), _) => b.text = map.next_value::<MaybeStr<'de>>()?.0.as_deref() == Some("text"),
                (Some("text"), _) => {
                    b.fenced = map.next_value::<MaybeStr<'de>>()?.0.is_some_and(|t| t.starts_with(INSTRUCTIONS_OPEN))
                }
                (Some("content"), Some(d)) => add(&mut b.inner, map.next_value_seed(List(d))?),
                (Some("source"), Some(d)) => add(&mut b.inner, map.next_value_seed(Source(d))?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(b)
    }
}

fn add(n: &mut CacheBreakpoints, more: CacheBreakpoints) {
    n.count += more.count;
    n.one_hour_after_system |= more.one_hour_after_system;
}

/// A `cache_control` value: `Some(asks for an hour)` when it is an object.
#[derive(Default)]
struct Mark(Option<bool>);

impl<'de> Deserialize<'de> for Mark {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Mark;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a cache_control")
            }
            not_a_map!();
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Mark, A::Error> {
                let mut hour = false;
                while let Some(MaybeStr(key)) = map.next_key::<MaybeStr<'de>>()? {
                    if key.as_deref() == Some("ttl") {
                        hour = map.next_value::<MaybeStr<'de>>()?.0.as_deref() == Some("1h");
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(Mark(Some(hour)))
            }
        }
        d.deserialize_any(V)
    }
}

/// A list of blocks at a depth (a message's `content`, or one nested in a
/// block): the marks of each block and of what it nests. Anything but a
/// list holds no breakpoint.
#[derive(Clone, Copy)]
struct List(usize);

impl<'de> de::DeserializeSeed<'de> for List {
    type Value = CacheBreakpoints;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<CacheBreakpoints, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for List {
    type Value = CacheBreakpoints;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a content list")
    }
    scalars!();
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<CacheBreakpoints, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(CacheBreakpoints::default())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<CacheBreakpoints, A::Error> {
        let mut n = CacheBreakpoints::default();
        while let Some(b) = seq.next_element_seed(BlockVisitor { depth: Some(self.0) })? {
            b.add_to(&mut n);
        }
        Ok(n)
    }
}

impl<'de> de::DeserializeSeed<'de> for BlockVisitor {
    type Value = Block;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Block, D::Error> {
        d.deserialize_any(self)
    }
}

/// A `document`'s `source`: the blocks of its `content` list (a content source).
#[derive(Clone, Copy)]
struct Source(usize);

impl<'de> de::DeserializeSeed<'de> for Source {
    type Value = CacheBreakpoints;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<CacheBreakpoints, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Source {
    type Value = CacheBreakpoints;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a document source")
    }
    not_a_map!();
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<CacheBreakpoints, A::Error> {
        let mut n = CacheBreakpoints::default();
        while let Some(MaybeStr(key)) = map.next_key::<MaybeStr<'de>>()? {
            if key.as_deref() == Some("content") {
                add(&mut n, map.next_value_seed(List(self.0))?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(n)
    }
}

/// A message: the marks of its content blocks and of the blocks inside them.
#[derive(Default)]
struct Message(CacheBreakpoints);

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Message;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a message")
            }
            not_a_map!();
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Message, A::Error> {
                let mut n = CacheBreakpoints::default();
                while let Some(MaybeStr(key)) = map.next_key::<MaybeStr<'de>>()? {
                    if key.as_deref() == Some("content") {
                        // Blocks at the top of `content`, with their inner ones.
                        n = map.next_value_seed(List(0))?;
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(Message(n))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// The rules as they were written on parsed values.
    fn reference(
        tools: Option<&Value>,
        system: Option<&Value>,
        messages: Option<&Value>,
        top: bool,
    ) -> CacheBreakpoints {
        fn marks(v: &Value) -> Option<&Value> {
            v.get("cache_control").filter(|c| c.is_object())
        }
        let mut count = usize::from(top);
        let mut one_hour_after_system = false;
        for t in tools.and_then(Value::as_array).into_iter().flatten() {
            count += usize::from(marks(t).is_some());
        }
        for b in
            system.and_then(Value::as_array).into_iter().flatten().filter(|b| {
                !(b["type"] == "text" && b["text"].as_str().is_some_and(|t| t.starts_with(INSTRUCTIONS_OPEN)))
            })
        {
            count += usize::from(marks(b).is_some());
        }
        fn walk(b: &Value, depth: usize, count: &mut usize, hour: &mut bool) {
            if let Some(c) = marks(b) {
                *count += 1;
                *hour |= c.get("ttl").and_then(Value::as_str) == Some("1h");
            }
            if depth >= MAX_DEPTH {
                return;
            }
            let nested = b.get("content").and_then(Value::as_array).into_iter().flatten();
            let in_source =
                b.get("source").and_then(|s| s.get("content")).and_then(Value::as_array).into_iter().flatten();
            for inner in nested.chain(in_source) {
                walk(inner, depth + 1, count, hour);
            }
        }
        for m in messages.and_then(Value::as_array).into_iter().flatten() {
            for b in m.get("content").and_then(Value::as_array).into_iter().flatten() {
                walk(b, 0, &mut count, &mut one_hour_after_system);
            }
        }
        CacheBreakpoints { count, one_hour_after_system }
    }

    #[test]
    fn the_text_the_value_and_the_rules_agree() {
        let cc = json!({"type": "ephemeral"});
        let hour = json!({"type": "ephemeral", "ttl": "1h"});
        let tools = json!([{"name": "a", "cache_control": cc}, {"name": "b"}, 3, {"cache_control": "x"}]);
        let system = json!([
            {"type": "text", "text": "s", "cache_control": cc},
            {"type": "text", "text": "<mcp_context>\nours\n</mcp_context>", "cache_control": cc},
            {"type": "text", "text": "t", "content": [{"cache_control": cc}]}, "x"
        ]);
        let messages = json!([
            {"role": "user", "content": "plain"},
            {"role": "user", "content": [{"type": "text", "text": "q", "cache_control": cc}, 5, null]},
            {"role": "user", "content": [{"type": "tool_result", "content": [
                {"type": "text", "text": "r", "cache_control": hour},
                {"type": "text", "content": [{"cache_control": cc}]}]}]},
            {"role": "user", "content": [{"type": "document", "source": {"type": "content", "content": [
                {"type": "text", "text": "d", "cache_control": cc}]}}]},
            7, [1], {"content": {"cache_control": cc}}
        ]);
        for top in [false, true] {
            let want = reference(Some(&tools), Some(&system), Some(&messages), top);
            // The text block two levels down in the tool_result counts too (nested blocks at any depth).
            assert_eq!(want, CacheBreakpoints { count: 6 + usize::from(top), one_hour_after_system: true });
            let mut t = Tally::new(top.then_some(false));
            tools.as_array().unwrap().iter().for_each(|v| t.tool(v));
            let ours: Vec<bool> = system.as_array().unwrap().iter().map(|v| t.system_block(v)).collect();
            assert_eq!(ours, [false, true, false, false]);
            messages.as_array().unwrap().iter().for_each(|v| t.message(v));
            assert_eq!(t.finish(), want);
            let mut t = Tally::new(top.then_some(false));
            let text = |v: &Value| v.to_string();
            for v in tools.as_array().unwrap() {
                t.tool(&mut serde_json::Deserializer::from_str(&text(v)));
            }
            for v in system.as_array().unwrap() {
                t.system_block(&mut serde_json::Deserializer::from_str(&text(v)));
            }
            for v in messages.as_array().unwrap() {
                t.message(&mut serde_json::Deserializer::from_str(&text(v)));
            }
            assert_eq!(t.finish(), want);
        }
    }
}
