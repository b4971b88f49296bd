//! The user turns of a conversation read one message at a time, never the
//! whole list at once: what [`Query`](super::Query) ranks by, taken from a
//! Chat Completions `messages`, a Responses `input` or a Messages API
//! `messages` list, held as parsed JSON or as the text the caller sent.
//!
//! A message is read by serde visitors that keep only its role and the tail
//! of its user text ([`MAX_QUERY_BYTES`]); every other part is skipped
//! without being built. [`UserTurns`] keeps the last
//! [`EARLIER_TURNS`]` + 1` non-blank user texts, so what a list of any
//! length costs is a few times [`MAX_QUERY_BYTES`], not a copy of the list
//! (a 10 MiB body of 190 000 one-letter messages parsed as `Value` held
//! about a gigabyte).
//!
//! The rules are those of the module docs of [`super::query`]: a user
//! turn's text is its `content` string, or its `text` / `input_text`
//! parts joined by a newline; blank texts are skipped.
//!
//! Imports the query's constants and its weighting only.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::query::{EARLIER_TURNS, MAX_QUERY_BYTES, Query, tail};

/// The last non-blank user texts of a message list, oldest first, each its
/// last [`MAX_QUERY_BYTES`] at most.
#[derive(Default)]
pub(crate) struct UserTurns {
    last: VecDeque<String>,
}

impl UserTurns {
    /// Reads one message (anything that is not a user message with text is skipped).
    pub(crate) fn push<'de, D: Deserializer<'de>>(&mut self, message: D) {
        if let Ok(Turn { user: true, text: Some(text) }) = Turn::deserialize(message) {
            self.push_text(text);
        }
    }

    /// The turns of one text (a Responses `input` string).
    #[cfg(feature = "serve")]
    pub(crate) fn of_text(text: String) -> Self {
        let mut t = Tail::default();
        t.push(&text);
        let mut turns = Self::default();
        if let Some(text) = t.finish() {
            turns.push_text(text);
        }
        turns
    }

    /// One message given as JSON text (the proxy's, and this module's tests).
    #[cfg(any(feature = "serve", test))]
    pub(crate) fn push_json(&mut self, message: &str) {
        self.push(&mut serde_json::Deserializer::from_str(message));
    }

    /// One Gemini `contents` item given as JSON text: a user turn (`role`
    /// `user`, or none) and the `text` of its `parts` joined by a newline.
    #[cfg(feature = "serve")]
    pub(crate) fn push_gemini_json(&mut self, content: &str) {
        #[derive(serde::Deserialize)]
        struct GeminiTurn<'a> {
            #[serde(borrow)]
            role: Option<MaybeStr<'a>>,
            parts: Option<GeminiParts>,
        }
        let Ok(turn) = serde_json::from_str::<GeminiTurn<'_>>(content) else { return };
        if turn.role.is_some_and(|r| r.0.as_deref() != Some("user")) {
            return;
        }
        if let Some(GeminiParts(Some(text))) = turn.parts {
            self.push_text(text);
        }
    }

    fn push_text(&mut self, text: TurnText) {
        if text.blank {
            return;
        }
        if self.last.len() > EARLIER_TURNS {
            self.last.pop_front();
        }
        self.last.push_back(text.tail);
    }

    /// The query of the turns read (see [`Query::from_chat`]).
    pub(crate) fn query(&self) -> Option<Query> {
        Query::from_user_turns(self.last.iter().rev().map(|t| Cow::Borrowed(t.as_str())))
    }
}

/// A message as the query reads it: whether it is the user's, and its text.
#[derive(Default)]
struct Turn {
    user: bool,
    text: Option<TurnText>,
}

/// A turn's user text: its last [`MAX_QUERY_BYTES`], and whether all of it is blank.
struct TurnText {
    tail: String,
    blank: bool,
}

/// Appends texts joined by `\n`, keeping only the last [`MAX_QUERY_BYTES`]
/// (the buffer is cut back whenever it reaches twice that).
#[derive(Default)]
struct Tail {
    buf: String,
    any: bool,
    blank: bool,
}

impl Tail {
    fn push(&mut self, text: &str) {
        if self.any {
            self.buf.push('\n');
        } else {
            self.blank = true;
        }
        self.any = true;
        self.blank &= text.trim().is_empty();
        self.buf.push_str(tail(text, 2 * MAX_QUERY_BYTES));
        if self.buf.len() > 2 * MAX_QUERY_BYTES {
            let start = self.buf.len() - tail(&self.buf, MAX_QUERY_BYTES).len();
            self.buf.drain(..start);
        }
    }

    fn finish(self) -> Option<TurnText> {
        self.any.then(|| TurnText { tail: tail(&self.buf, MAX_QUERY_BYTES).to_owned(), blank: self.blank })
    }
}

/// A JSON string, borrowed where it has no escapes; `None` for any other value.
pub(crate) struct MaybeStr<'a>(pub(crate) Option<Cow<'a, str>>);

/// Implements the visits of a visitor whose `Value` is `Default` for every
/// JSON type but maps: such a value is not what is looked for, and is
/// skipped without error (an array is drained, not built).
macro_rules! not_a_map {
    () => {
        $crate::compose::scalars!();
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(Default::default())
        }
    };
}

/// The scalar visits of a visitor looking for a map or a list: any scalar
/// is not what is looked for and gives the default value.
macro_rules! scalars {
    () => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
    };
}
pub(crate) use not_a_map;
pub(crate) use scalars;

impl<'de: 'a, 'a> Deserialize<'de> for MaybeStr<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = MaybeStr<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(MaybeStr(Some(Cow::Borrowed(s))))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(MaybeStr(Some(Cow::Owned(s.to_owned()))))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
                Ok(MaybeStr(Some(Cow::Owned(s))))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(MaybeStr(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(MaybeStr(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(MaybeStr(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(MaybeStr(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(MaybeStr(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(MaybeStr(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(MaybeStr(None))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

impl<'de> Deserialize<'de> for Turn {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Turn;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a message")
            }
            not_a_map!();
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Turn, A::Error> {
                let mut turn = Turn::default();
                while let Some(MaybeStr(key)) = map.next_key::<MaybeStr<'de>>()? {
                    match key.as_deref() {
                        Some("role") => turn.user = map.next_value::<MaybeStr<'de>>()?.0.as_deref() == Some("user"),
                        Some("content") => turn.text = map.next_value::<Content>()?.0,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(turn)
            }
        }
        d.deserialize_any(V)
    }
}

/// A message's `content`: a string, or parts whose text ones count.
struct Content(Option<TurnText>);

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Content;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a message's content")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Content, E> {
                let mut t = Tail::default();
                t.push(s);
                Ok(Content(t.finish()))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Content, E> {
                Ok(Content(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Content, E> {
                Ok(Content(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Content, E> {
                Ok(Content(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Content, E> {
                Ok(Content(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Content, E> {
                Ok(Content(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Content, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Content(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content, A::Error> {
                let mut t = Tail::default();
                while let Some(Part(text)) = seq.next_element::<Part<'de>>()? {
                    if let Some(text) = text {
                        t.push(&text);
                    }
                }
                Ok(Content(t.finish()))
            }
        }
        d.deserialize_any(V)
    }
}

/// A Gemini turn's `parts`: the `text` of each part that has one.
#[cfg(feature = "serve")]
struct GeminiParts(Option<TurnText>);

#[cfg(feature = "serve")]
impl<'de> Deserialize<'de> for GeminiParts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        struct GeminiPart<'a> {
            #[serde(borrow)]
            text: Option<MaybeStr<'a>>,
        }
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = GeminiParts;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of parts")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<GeminiParts, A::Error> {
                let mut t = Tail::default();
                while let Some(part) = seq.next_element::<Option<GeminiPart<'de>>>()? {
                    if let Some(text) = part.and_then(|p| p.text).and_then(|t| t.0) {
                        t.push(&text);
                    }
                }
                Ok(GeminiParts(t.finish()))
            }
        }
        d.deserialize_seq(V)
    }
}

/// A content part: its text when it is a `text` or `input_text` part.
#[derive(Default)]
struct Part<'a>(Option<Cow<'a, str>>);

impl<'de> Deserialize<'de> for Part<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Part<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a content part")
            }
            not_a_map!();
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Part<'de>, A::Error> {
                let (mut is_text, mut text) = (false, None);
                while let Some(MaybeStr(key)) = map.next_key::<MaybeStr<'de>>()? {
                    match key.as_deref() {
                        Some("type") => {
                            is_text =
                                matches!(map.next_value::<MaybeStr<'de>>()?.0.as_deref(), Some("text" | "input_text"))
                        }
                        Some("text") => text = map.next_value::<MaybeStr<'de>>()?.0,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(Part(text.filter(|_| is_text)))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn from_text(messages: &serde_json::Value) -> Option<Query> {
        let mut turns = UserTurns::default();
        for m in messages.as_array().unwrap() {
            turns.push_json(&m.to_string());
        }
        turns.query()
    }

    #[cfg(feature = "serve")]
    #[test]
    fn gemini_user_turns_are_their_parts_text_and_others_are_skipped() {
        let mut turns = UserTurns::default();
        for c in [
            json!({"role": "user", "parts": [{"text": "first"}]}),
            json!({"role": "model", "parts": [{"text": "answer"}]}),
            json!({"parts": [{"text": "second"}, {"inlineData": {"mimeType": "image/png", "data": "AA=="}}, {"text": "more"}]}),
            json!({"role": "user", "parts": [{"text": "  "}]}),
            json!({"role": "user", "parts": "not a list"}),
        ] {
            turns.push_gemini_json(&c.to_string());
        }
        let want = Query::from_user_turns(["second\nmore", "first"].into_iter().map(Cow::Borrowed));
        assert_eq!(turns.query().map(|q| q.key()), want.map(|q| q.key()));
    }

    #[test]
    fn the_text_and_the_parsed_value_give_the_same_query_as_the_typed_request() {
        let big = "word ".repeat(10_000);
        let cases = [
            json!([{"role": "user", "content": "only"}]),
            json!([
                {"role": "user", "content": "first"}, {"role": "assistant", "content": "a"},
                {"role": "user", "content": [{"type": "text", "text": "second"}, {"type": "image_url", "image_url": {}},
                    {"text": "third", "type": "input_text"}]},
                {"role": "user", "content": "   "}, {"role": "user", "content": [{"type": "text", "text": " "}]},
                {"role": "user", "content": format!("{big}end")}, 3, "x", null, [1, 2],
                {"content": "no role"}, {"role": "user", "content": [1, "x", {"type": "text", "text": 7}]},
                {"role": "user", "content": "a\nb \u{e9}t\u{e9}"}, {"role": "user", "content": big.clone() + &big},
            ]),
            json!([]),
            json!([{"role": "system", "content": "s"}]),
        ];
        for messages in cases {
            let body = json!({ "messages": messages });
            // The rules as they were written on parsed values.
            let reference = Query::from_user_turns(super::super::query::user_texts_json(&body));
            assert_eq!(Query::from_chat_json(&body), reference, "{messages}");
            assert_eq!(from_text(&messages), reference, "{messages}");
        }
    }

    #[test]
    fn a_message_of_a_million_parts_keeps_only_the_tail() {
        let parts: Vec<_> = (0..200_000).map(|i| json!({"type": "text", "text": format!("p{i}")})).collect();
        let q = from_text(&json!([{"role": "user", "content": parts}])).unwrap();
        assert!(q.turns[0].0.len() <= MAX_QUERY_BYTES);
        assert!(q.turns[0].0.ends_with("\np199999"));
    }
}
