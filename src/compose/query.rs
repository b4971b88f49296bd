//! What to rank passages by: the query.
//!
//! [`ContextRequest::query`](crate::ContextRequest::query) when given
//! (weight 1); otherwise from the chat request: the latest user message has
//! weight 1, and the [`EARLIER_TURNS`] user turns before it
//! [`EARLIER_TURN_WEIGHT`], its square, its cube (the conversation's topic
//! still counts, the current question counts most). A term in several turns
//! takes its highest weight.
//!
//! The query keeps at most [`MAX_QUERY_BYTES`] of user text: the newest
//! turn's last bytes first, then what is left of the budget from the end of
//! each earlier turn, cut on a character boundary. Ranking costs about 0.6 s
//! of CPU per MB of query text, and a caller could send megabytes; the end of
//! a conversation is what it asks now.
//!
//! Imports the term analysis ([`super::terms`]) and the one-pass reading of
//! message lists ([`super::turns`]) only.

use std::borrow::Cow;
use std::collections::HashMap;

use async_openai::types::chat::{
    ChatCompletionRequestMessage, ChatCompletionRequestUserMessageContent, ChatCompletionRequestUserMessageContentPart,
    CreateChatCompletionRequest,
};

use super::terms;

/// Weight of the user turn before the latest; each earlier one multiplies
/// by it again.
pub const EARLIER_TURN_WEIGHT: f32 = 0.5;
/// How many user turns before the latest count in the query.
pub const EARLIER_TURNS: usize = 3;
/// Bytes of user text a [`Query`] keeps, all turns together: the last ones,
/// newest turn first (see "The query" in the module docs).
pub const MAX_QUERY_BYTES: usize = 16 * 1024;

/// What to rank by: weighted pieces of text.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    pub(super) turns: Vec<(String, f32)>,
}

impl Query {
    /// One text of weight 1 (its last [`MAX_QUERY_BYTES`]).
    pub fn text(text: impl Into<String>) -> Query {
        let mut text = text.into();
        let start = text.len() - tail(&text, MAX_QUERY_BYTES).len();
        if start > 0 {
            text = text.split_off(start);
        }
        Query { turns: vec![(text, 1.0)] }
    }

    /// The user turns of a chat request: the latest with weight 1, the
    /// [`EARLIER_TURNS`] before it with [`EARLIER_TURN_WEIGHT`]^k. `None`
    /// when the request has no user text.
    pub fn from_chat(request: &CreateChatCompletionRequest) -> Option<Query> {
        let users = request.messages.iter().rev().filter_map(|m| match m {
            ChatCompletionRequestMessage::User(u) => Some(match &u.content {
                ChatCompletionRequestUserMessageContent::Text(t) => Cow::Borrowed(t.as_str()),
                ChatCompletionRequestUserMessageContent::Array(parts) => Cow::Owned(
                    parts
                        .iter()
                        .filter_map(|p| match p {
                            ChatCompletionRequestUserMessageContentPart::Text(t) => Some(t.text.as_str()),
                            _ => None,
                        })
                        .collect::<Vec<_>>()
                        .join("\n"),
                ),
            }),
            _ => None,
        });
        Self::from_user_turns(users)
    }

    /// [`Query::from_chat`] on a Chat Completions or Responses body held as
    /// generic JSON (what `serve` relays): the same turns, the same weights.
    pub fn from_chat_json(body: &serde_json::Value) -> Option<Query> {
        let items = match (body.get("messages"), body.get("input")) {
            (Some(serde_json::Value::Array(m)), _) => m,
            (_, Some(serde_json::Value::String(s))) => {
                return Self::from_user_turns(std::iter::once(Cow::Borrowed(s.as_str())));
            }
            (_, Some(serde_json::Value::Array(i))) => i,
            _ => return None,
        };
        let mut turns = super::turns::UserTurns::default();
        items.iter().for_each(|m| turns.push(m));
        turns.query()
    }

    /// The one weighting of user turns, given newest first, and the one
    /// cap on their text ([`MAX_QUERY_BYTES`], from the end).
    pub(super) fn from_user_turns<'a>(newest_first: impl Iterator<Item = Cow<'a, str>>) -> Option<Query> {
        let mut left = MAX_QUERY_BYTES;
        let turns: Vec<(String, f32)> = newest_first
            .filter(|t| !t.trim().is_empty())
            .take(EARLIER_TURNS + 1)
            .map_while(|t| {
                let kept = tail(&t, left);
                left -= kept.len();
                (!kept.is_empty()).then(|| kept.to_owned())
            })
            .enumerate()
            .map(|(k, t)| (t, EARLIER_TURN_WEIGHT.powi(k as i32)))
            .collect();
        (!turns.is_empty()).then_some(Query { turns })
    }

    /// A string that is equal for equal queries (for memo keys).
    pub(crate) fn key(&self) -> String {
        self.turns.iter().map(|(t, w)| format!("{w}\u{0}{t}\u{0}")).collect()
    }

    /// Distinct terms with their weight (the highest among the turns that
    /// contain them), sorted by term.
    pub(crate) fn terms(&self) -> Vec<(u64, f32)> {
        let mut terms: HashMap<u64, f32> = HashMap::new();
        for (text, w) in &self.turns {
            terms::each(text, |_, t| {
                let e = terms.entry(t).or_insert(0.0);
                *e = e.max(*w);
            });
        }
        let mut v: Vec<_> = terms.into_iter().collect();
        v.sort_by_key(|(t, _)| *t);
        v
    }
}

/// The user texts of a Chat Completions (`messages`) or Responses (`input`)
/// body, newest first, blank ones skipped; borrowed where a text is one
/// string (a query keeps only the end of a long one). The rules of
/// [`super::turns`] written on parsed values: the tests' reference.
#[cfg(test)]
pub(crate) fn user_texts_json(body: &serde_json::Value) -> Box<dyn Iterator<Item = Cow<'_, str>> + '_> {
    fn text_of(content: &serde_json::Value) -> Option<Cow<'_, str>> {
        match content {
            serde_json::Value::String(s) => Some(Cow::Borrowed(s)),
            serde_json::Value::Array(parts) => {
                let texts: Vec<&str> = parts
                    .iter()
                    .filter(|p| matches!(p.get("type").and_then(|t| t.as_str()), Some("text" | "input_text")))
                    .filter_map(|p| p.get("text").and_then(|t| t.as_str()))
                    .collect();
                (!texts.is_empty()).then(|| Cow::Owned(texts.join("\n")))
            }
            _ => None,
        }
    }
    let items = match (body.get("messages"), body.get("input")) {
        (Some(serde_json::Value::Array(m)), _) => m,
        (_, Some(serde_json::Value::String(s))) => {
            return Box::new(Some(Cow::Borrowed(s.as_str())).filter(|s| !s.trim().is_empty()).into_iter());
        }
        (_, Some(serde_json::Value::Array(i))) => i,
        _ => return Box::new(std::iter::empty()),
    };
    Box::new(
        items
            .iter()
            .rev()
            .filter(|m| m.get("role").and_then(|r| r.as_str()) == Some("user"))
            .filter_map(|m| m.get("content").and_then(text_of))
            .filter(|t| !t.trim().is_empty()),
    )
}

/// The last `max` bytes of `text` at most, starting on a character boundary.
pub(super) fn tail(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}
