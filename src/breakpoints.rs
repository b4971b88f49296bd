//! Counting the `cache_control` breakpoints of a Messages API body one
//! tool, block or message at a time, never holding the body as a tree: the
//! rules of [`CacheBreakpoints`](crate::messages::CacheBreakpoints), read by
//! serde visitors that skip what they do not look at. The same visitors read
//! a parsed `Value` (the library's [`CacheBreakpoints::of_parts`]
//! (crate::messages::CacheBreakpoints::of_parts)) and the text a caller sent
//! (the proxy's `/v1/messages`, where a body of 380 000 blocks parsed as a
//! `Value` held some 600 MiB).
//!
//! Imports the fence of `inject` and the query's JSON helpers only.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::compose::{MaybeStr, not_a_map};
use crate::inject::INSTRUCTIONS_OPEN;
use crate::messages::CacheBreakpoints;

/// The breakpoints counted so far.
pub(crate) struct Tally(CacheBreakpoints);

impl Tally {
    /// A tally that starts with the request's own top-level breakpoint, if any.
    pub(crate) fn new(top: bool) -> Self {
        Self(CacheBreakpoints { count: usize::from(top), one_hour_after_system: false })
    }

    /// One tool: its breakpoint counts.
    pub(crate) fn tool<'de, D: Deserializer<'de>>(&mut self, tool: D) {
        if let Ok(b) = Block::deserialize(tool) {
            self.0.count += usize::from(b.mark.is_some());
        }
    }

    /// One `system` block: its breakpoint counts unless the block is ours.
    /// Returns whether it is ours (a text block whose text opens with our fence).
    pub(crate) fn system_block<'de, D: Deserializer<'de>>(&mut self, block: D) -> bool {
        let Ok(b) = Block::deserialize(block) else { return false };
        let ours = b.text && b.fenced;
        if !ours {
            self.0.count += usize::from(b.mark.is_some());
        }
        ours
    }

    /// One message: the breakpoints of its content blocks and of the blocks
    /// inside them (a `tool_result`'s), and whether one asks for an hour.
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

/// A block (or tool) as the count reads it.
#[derive(Default)]
struct Block {
    /// Its `cache_control`, when an object: whether it asks for `ttl: "1h"`.
    mark: Option<bool>,
    /// `type: "text"`.
    text: bool,
    /// Its `text` starts with [`INSTRUCTIONS_OPEN`].
    fenced: bool,
    /// The marks of the blocks in its `content` list.
    inner: CacheBreakpoints,
}

impl<'de> Deserialize<'de> for Block {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(BlockVisitor { inner: true })
    }
}

/// Reads a block; `inner`: also the blocks of its `content` (one level, as the API nests them).
struct BlockVisitor {
    inner: bool,
}

impl<'de> Visitor<'de> for BlockVisitor {
    type Value = Block;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a content block")
    }
    not_a_map!();
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Block, A::Error> {
        let mut b = Block::default();
        while let Some(MaybeStr(key)) = map.next_key::<MaybeStr<'de>>()? {
            match key.as_deref() {
                Some("cache_control") => b.mark = map.next_value::<Mark>()?.0,
                Some("type") => b.text = map.next_value::<MaybeStr<'de>>()?.0.as_deref() == Some("text"),
                Some("text") => {
                    b.fenced = map.next_value::<MaybeStr<'de>>()?.0.is_some_and(|t| t.starts_with(INSTRUCTIONS_OPEN))
                }
                Some("content") if self.inner => b.inner = map.next_value::<Inner>()?.0,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(b)
    }
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

/// The marks of a `content` list (each block's own; nothing deeper).
#[derive(Default)]
struct Inner(CacheBreakpoints);

impl<'de> Deserialize<'de> for Inner {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Inner;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a content list")
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Inner, E> {
                Ok(Inner::default())
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Inner, E> {
                Ok(Inner::default())
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Inner, E> {
                Ok(Inner::default())
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Inner, E> {
                Ok(Inner::default())
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Inner, E> {
                Ok(Inner::default())
            }
            fn visit_unit<E: de::Error>(self) -> Result<Inner, E> {
                Ok(Inner::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Inner, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Inner::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Inner, A::Error> {
                let mut n = CacheBreakpoints::default();
                while let Some(b) = seq.next_element_seed(Seed)? {
                    if let Some(hour) = b.mark {
                        n.count += 1;
                        n.one_hour_after_system |= hour;
                    }
                    n.count += b.inner.count;
                    n.one_hour_after_system |= b.inner.one_hour_after_system;
                }
                Ok(Inner(n))
            }
        }
        d.deserialize_any(V)
    }
}

/// The blocks of a list read here: their own `content` is not looked into
/// when they are themselves inside a block.
struct Seed;

impl<'de> de::DeserializeSeed<'de> for Seed {
    type Value = Block;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Block, D::Error> {
        d.deserialize_any(BlockVisitor { inner: false })
    }
}

/// A message: the marks of its content blocks and of the blocks inside them.
struct Message(CacheBreakpoints);

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Message;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a message")
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Message, E> {
                Ok(Message(CacheBreakpoints::default()))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Message, E> {
                Ok(Message(CacheBreakpoints::default()))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Message, E> {
                Ok(Message(CacheBreakpoints::default()))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Message, E> {
                Ok(Message(CacheBreakpoints::default()))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Message, E> {
                Ok(Message(CacheBreakpoints::default()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Message, E> {
                Ok(Message(CacheBreakpoints::default()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Message, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Message(CacheBreakpoints::default()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Message, A::Error> {
                let mut n = CacheBreakpoints::default();
                while let Some(MaybeStr(key)) = map.next_key::<MaybeStr<'de>>()? {
                    if key.as_deref() == Some("content") {
                        // Blocks at the top of `content`, with their inner ones.
                        n = map.next_value::<Outer>()?.0;
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

/// A message's `content` list: each block's mark and its inner blocks' marks.
struct Outer(CacheBreakpoints);

impl<'de> Deserialize<'de> for Outer {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Outer;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a content list")
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Outer, E> {
                Ok(Outer(CacheBreakpoints::default()))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Outer, E> {
                Ok(Outer(CacheBreakpoints::default()))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Outer, E> {
                Ok(Outer(CacheBreakpoints::default()))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Outer, E> {
                Ok(Outer(CacheBreakpoints::default()))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Outer, E> {
                Ok(Outer(CacheBreakpoints::default()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Outer, E> {
                Ok(Outer(CacheBreakpoints::default()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Outer, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Outer(CacheBreakpoints::default()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Outer, A::Error> {
                let mut n = CacheBreakpoints::default();
                while let Some(b) = seq.next_element::<Block>()? {
                    if let Some(hour) = b.mark {
                        n.count += 1;
                        n.one_hour_after_system |= hour;
                    }
                    n.count += b.inner.count;
                    n.one_hour_after_system |= b.inner.one_hour_after_system;
                }
                Ok(Outer(n))
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
        for b in system
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|b| !crate::messages::is_context_block_json(b))
        {
            count += usize::from(marks(b).is_some());
        }
        for m in messages.and_then(Value::as_array).into_iter().flatten() {
            for b in m.get("content").and_then(Value::as_array).into_iter().flatten() {
                let inner = b.get("content").and_then(Value::as_array).into_iter().flatten();
                for c in std::iter::once(b).chain(inner).filter_map(marks) {
                    count += 1;
                    one_hour_after_system |= c.get("ttl").and_then(Value::as_str) == Some("1h");
                }
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
            7, [1], {"content": {"cache_control": cc}}
        ]);
        for top in [false, true] {
            let want = reference(Some(&tools), Some(&system), Some(&messages), top);
            assert_eq!(want, CacheBreakpoints { count: 4 + usize::from(top), one_hour_after_system: true });
            let mut t = Tally::new(top);
            tools.as_array().unwrap().iter().for_each(|v| t.tool(v));
            let ours: Vec<bool> = system.as_array().unwrap().iter().map(|v| t.system_block(v)).collect();
            assert_eq!(ours, [false, true, false, false]);
            messages.as_array().unwrap().iter().for_each(|v| t.message(v));
            assert_eq!(t.finish(), want);
            let mut t = Tally::new(top);
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
