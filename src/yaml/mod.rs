//! YAML as the config and the policy read it, and the one way their errors
//! are located.
//!
//! The text is parsed once by saphyr-parser (a pure-Rust YAML 1.2 event
//! parser) into a [`Node`] tree in which every node keeps the line and
//! column the parser gave its first character, so a problem found after
//! parsing (an undefined role, a server name that is invalid, a rule's line)
//! points at the value itself, whatever the layout: block or flow style,
//! short or repeated names. A serde [`Deserializer`](serde::Deserializer)
//! over the tree then fills the raw structs; its errors carry the position
//! of the node at fault, and every one is recorded in a [`Problems`] list,
//! so a caller that wraps independent parts in [`Lenient`] goes on past a
//! bad part and reports every problem at once. [`OrderedMap`] is the one map
//! that keeps file order and rejects a repeated key.
//!
//! Scalars are resolved as `yaml_serde` does (YAML 1.2 core schema): a
//! string is asked for as a string whatever it looks like; `~`, `null` and
//! nothing are null; `true`/`false`, decimal, `0x`, `0o`, `0b` integers and
//! floats are what they look like when a number or a bool is expected.
//!
//! Why saphyr-parser: it is safe Rust (this module needs no `unsafe`), and
//! every event carries its span (line, column in characters, character
//! index), and an error the position of the fault, which the config's and
//! policy's errors rely on. Only its event API is used here (`Parser`,
//! `Event`, `Marker`, `ScanError`, `ScalarStyle`); its character indices
//! are turned into byte offsets, and what libyaml (the parser used before)
//! did beyond it is kept here: control characters are refused, an error
//! inside a flow collection names it (`while parsing a flow sequence at
//! line 3 column 12`), an unknown alias is named. The whole layer is fuzzed
//! (proptest over random bytes and over YAML punctuation, below): no input
//! panics, and every problem is located inside the text.

use std::borrow::Cow;

use serde::de::Unexpected;

mod deser;
mod flow;
#[cfg(test)]
mod tests;
mod tree;

pub(crate) use deser::*;
use tree::Parser;
/// Deepest nesting accepted (as `yaml_serde`): deeper input is an error, not a stack overflow.
const MAX_DEPTH: usize = 128;

/// 1-based line and column (in characters) of a node or a problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Pos {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
}

/// One node of the tree, with where it starts in the text. Scalars borrow
/// their text from the source when it is written as is (most are), so a
/// large policy's tree costs little beyond the text.
#[derive(Clone, Debug)]
pub(crate) struct Node<'a> {
    /// Where its first character is (for a block mapping or list, its first key or `-`).
    pub pos: Pos,
    /// Byte offsets of its text: `src[start..end]`.
    pub start: u32,
    /// See `start`.
    pub end: u32,
    /// What it is.
    pub kind: Kind<'a>,
}

/// A node's content.
#[derive(Clone, Debug)]
pub(crate) enum Kind<'a> {
    /// A scalar; `plain` when unquoted (only plain scalars can be null, bool or number).
    Scalar {
        /// The value, escapes and folding applied.
        value: Cow<'a, str>,
        /// Written without quotes or block indicators.
        plain: bool,
    },
    /// A list.
    Seq(Vec<Node<'a>>),
    /// A mapping, in file order, repeated keys kept (the deserializer decides).
    Map(Vec<(Node<'a>, Node<'a>)>),
}

impl<'a> Node<'a> {
    /// An empty mapping, what an empty document means.
    pub(crate) fn empty_map() -> Node<'a> {
        Node { pos: Pos { line: 1, column: 1 }, start: 0, end: 0, kind: Kind::Map(Vec::new()) }
    }

    /// The value of the first entry with this key, if this is a mapping.
    pub(crate) fn get(&self, key: &str) -> Option<&Node<'a>> {
        self.entries().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v)
    }

    /// The key node of the `nth` (from 0) entry with this key.
    pub(crate) fn key_at(&self, key: &str, nth: usize) -> Option<&Node<'a>> {
        self.entries().filter(|(k, _)| k.as_str() == Some(key)).nth(nth).map(|(k, _)| k)
    }

    /// The entries of a mapping (none for anything else).
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&Node<'a>, &Node<'a>)> {
        let entries: &[(Node<'a>, Node<'a>)] = match &self.kind {
            Kind::Map(m) => m,
            _ => &[],
        };
        entries.iter().map(|(k, v)| (k, v))
    }

    /// The items of a list (none for anything else).
    pub(crate) fn items(&self) -> &[Node<'a>] {
        match &self.kind {
            Kind::Seq(s) => s,
            _ => &[],
        }
    }

    /// The node at a path of mapping keys.
    pub(crate) fn at(&self, path: &[&str]) -> Option<&Node<'a>> {
        path.iter().try_fold(self, |n, k| n.get(k))
    }

    /// The scalar's text.
    pub(crate) fn as_str(&self) -> Option<&str> {
        match &self.kind {
            Kind::Scalar { value, .. } => Some(value),
            _ => None,
        }
    }

    fn is_null(&self) -> bool {
        matches!(&self.kind, Kind::Scalar { value, plain: true } if matches!(&**value, "" | "~" | "null" | "Null" | "NULL"))
    }

    /// What the node is, in serde's words, for "invalid type" errors.
    fn unexpected(&self) -> Unexpected<'_> {
        match &self.kind {
            Kind::Seq(_) => Unexpected::Seq,
            Kind::Map(_) => Unexpected::Map,
            Kind::Scalar { value, plain } => {
                if !plain {
                    Unexpected::Str(value)
                } else if self.is_null() {
                    Unexpected::Unit
                } else if let Some(b) = parse_bool(value) {
                    Unexpected::Bool(b)
                } else if let Some(n) = parse_unsigned(value) {
                    Unexpected::Unsigned(n)
                } else if let Some(n) = parse_signed(value) {
                    Unexpected::Signed(n)
                } else if let Some(f) = parse_float(value) {
                    Unexpected::Float(f)
                } else {
                    Unexpected::Str(value)
                }
            }
        }
    }
}

/// Where `needle` first occurs in `src` within the node's text, else the node's position.
pub(crate) fn pos_within(src: &str, node: &Node<'_>, needle: &str) -> Pos {
    let (start, end) = (node.start as usize, node.end as usize);
    let text = src.get(start..end.max(start)).unwrap_or("");
    match text.find(needle) {
        Some(at) => pos_of(src, start + at),
        None => node.pos,
    }
}

/// 1-based line and column of byte offset `at` of `src`.
pub(crate) fn pos_of(src: &str, at: usize) -> Pos {
    let before = &src[..at.min(src.len())];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    Pos { line: before.matches('\n').count() + 1, column: before[line_start..].chars().count() + 1 }
}

/// A problem in a YAML text: what, and where when known.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Problem {
    /// Where, when known.
    pub pos: Option<Pos>,
    /// What is wrong.
    pub message: String,
}

/// Parses one YAML document; `None` when the text holds none (empty, or
/// only comments).
pub(crate) fn parse(src: &str) -> Result<Option<Node<'_>>, Problem> {
    Parser::new(src).document()
}
