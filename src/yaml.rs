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
use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;

use saphyr_parser as sp;
use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Unexpected, Visitor};

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

// ---------------------------------------------------------------------------
// Building the tree from the parser's events
// ---------------------------------------------------------------------------

/// saphyr's event parser over the text, with what the tree needs besides.
struct Parser<'a> {
    events: sp::Parser<'a, sp::StrInput<'a>>,
    src: &'a str,
    /// Byte offset of every character (and of the end), when the text is not
    /// all ASCII: saphyr's marks count characters, the tree keeps bytes.
    offsets: Option<Vec<u32>>,
    /// The collections open, innermost last: whether a mapping, where, and
    /// whether in flow style (`[`, `{`), to name it in a syntax error's context.
    open: Vec<(bool, Pos, bool)>,
    /// Anchors by saphyr's id (an anchor defined again gets a new id).
    anchors: Vec<(usize, Node<'a>)>,
    /// Nodes made so far, aliases expanded: capped so that a few aliases of
    /// aliases cannot expand into billions of nodes.
    made: usize,
}

/// One event, with what the tree needs of it.
enum Event<'a> {
    StreamEnd,
    DocumentStart,
    Alias(usize),
    Scalar { value: Cow<'a, str>, plain: bool, anchor: usize, tagged: bool },
    SeqStart { anchor: usize, tagged: bool },
    SeqEnd,
    MapStart { anchor: usize, tagged: bool },
    MapEnd,
    Other,
}

/// Where an event starts or ends: line and column, and byte offset.
#[derive(Clone, Copy)]
struct Mark {
    pos: Pos,
    at: u32,
}

/// A node being built: its start and what it has so far.
struct Open<'a> {
    pos: Pos,
    start: u32,
    anchor: usize,
    items: Vec<Node<'a>>,
    map: bool,
}

fn pos_of_marker(m: &sp::Marker) -> Pos {
    // saphyr: 1-based line, 0-based column (in characters).
    Pos { line: m.line().max(1), column: m.col() + 1 }
}

impl<'a> Parser<'a> {
    fn new(src: &'a str) -> Self {
        let offsets = (!src.is_ascii()).then(|| {
            let mut o: Vec<u32> = src.char_indices().map(|(i, _)| i as u32).collect();
            o.push(src.len() as u32);
            o
        });
        Parser { events: sp::Parser::new_from_str(src), src, offsets, open: Vec::new(), anchors: Vec::new(), made: 0 }
    }

    /// Byte offset of saphyr's character index `index`.
    fn byte(&self, index: usize) -> u32 {
        match &self.offsets {
            None => index.min(self.src.len()) as u32,
            Some(o) => o.get(index).or(o.last()).copied().unwrap_or(0),
        }
    }

    fn mark(&self, m: &sp::Marker) -> Mark {
        Mark { pos: pos_of_marker(m), at: self.byte(m.index()) }
    }

    /// The parser's error, with its position (the fault's) left to [`Problem::pos`].
    fn error(&self, e: &sp::ScanError) -> Problem {
        let m = e.marker();
        let pos = Some(pos_of_marker(m));
        let message = if e.info().contains("unknown anchor") {
            self.unknown_anchor(self.byte(m.index()))
        } else {
            e.info().to_string()
        };
        let mut message = message;
        // The flow collection it is in, as libyaml says it (`while parsing a flow sequence at line 3 column 12`).
        if let Some(&(map, at, true)) = self.open.last() {
            message.push_str(if map { ", while parsing a flow mapping" } else { ", while parsing a flow sequence" });
            if Some(at) != pos {
                message.push_str(&format!(" at line {} column {}", at.line, at.column));
            }
        }
        Problem { pos, message }
    }

    /// Whether a collection's start event is a flow one: its span ends with its `[` or `{`.
    fn is_flow(&self, start: Mark, end: Mark) -> bool {
        end.at > start.at && matches!(self.src.as_bytes().get(end.at as usize - 1), Some(b'[' | b'{'))
    }

    /// The first character YAML does not allow (a control character, as
    /// libyaml refuses them: saphyr reads them as text), as an error.
    fn unprintable(&self) -> Result<(), Problem> {
        let printable = |c: char| {
            matches!(c, '\t' | '\n' | '\r' | ' '..='~' | '\u{85}' | '\u{A0}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}')
                || c >= '\u{10000}'
        };
        let Some((at, _)) = self.src.char_indices().find(|&(_, c)| !printable(c)) else { return Ok(()) };
        // Lines as the parser counts them: `\r\n`, `\r` or `\n` ends one.
        let before = &self.src[..at];
        let line_start = before.rfind(['\n', '\r']).map_or(0, |i| i + 1);
        let line = before.matches('\n').count() + before.matches('\r').count() - before.matches("\r\n").count() + 1;
        Err(Problem {
            pos: Some(Pos { line, column: before[line_start..].chars().count() + 1 }),
            message: "control characters are not allowed".into(),
        })
    }

    /// The message for the alias at byte `at` (`*name`), whose anchor is not defined before it.
    fn unknown_anchor(&self, at: u32) -> String {
        let alias = self.src.get(at as usize..).unwrap_or("").strip_prefix('*').unwrap_or("");
        let name: String = alias.chars().take_while(|c| !c.is_whitespace() && !",[]{}".contains(*c)).collect();
        format!("unknown anchor `{name}` (an alias `*name` needs an anchor `&name` before it)")
    }

    fn next(&mut self) -> Result<(Event<'a>, Mark, Mark), Problem> {
        let (ev, span) = match self.events.next_event() {
            Some(Ok(ev)) => ev,
            Some(Err(e)) => return Err(self.error(&e)),
            None => {
                return Ok((Event::StreamEnd, self.mark(&sp::Marker::default()), self.mark(&sp::Marker::default())));
            }
        };
        let (start, mut end) = (self.mark(&span.start), self.mark(&span.end));
        let out = match ev {
            sp::Event::StreamEnd => Event::StreamEnd,
            sp::Event::DocumentStart(_) => Event::DocumentStart,
            sp::Event::Alias(id) => Event::Alias(id),
            sp::Event::Scalar(value, style, anchor, tag) => {
                let plain = style == sp::ScalarStyle::Plain;
                if plain && value.is_empty() {
                    // An empty value: saphyr spans the token after it; it is nothing, where it starts.
                    end = start;
                }
                // Borrow the text when the source holds it as is (plain, or inside quotes).
                let (from, to) = (start.at as usize, end.at as usize);
                let value = match value {
                    Cow::Borrowed(s) => Cow::Borrowed(s),
                    Cow::Owned(s) => {
                        if self.src.get(from..to) == Some(&s) {
                            Cow::Borrowed(&self.src[from..to])
                        } else if to > from + 1 && self.src.get(from + 1..to - 1) == Some(&s) {
                            Cow::Borrowed(&self.src[from + 1..to - 1])
                        } else {
                            Cow::Owned(s)
                        }
                    }
                };
                Event::Scalar { value, plain, anchor, tagged: tag.is_some() }
            }
            sp::Event::SequenceStart(anchor, tag) => {
                self.open.push((false, start.pos, self.is_flow(start, end)));
                Event::SeqStart { anchor, tagged: tag.is_some() }
            }
            sp::Event::MappingStart(anchor, tag) => {
                self.open.push((true, start.pos, self.is_flow(start, end)));
                Event::MapStart { anchor, tagged: tag.is_some() }
            }
            sp::Event::SequenceEnd => {
                self.open.pop();
                Event::SeqEnd
            }
            sp::Event::MappingEnd => {
                self.open.pop();
                Event::MapEnd
            }
            sp::Event::Nothing | sp::Event::StreamStart | sp::Event::DocumentEnd => Event::Other,
        };
        Ok((out, start, end))
    }
    fn document(mut self) -> Result<Option<Node<'a>>, Problem> {
        self.unprintable()?;
        let mut root = None;
        let mut documents = 0;
        loop {
            let (event, start, _) = self.next()?;
            match event {
                Event::StreamEnd => return Ok(root),
                Event::DocumentStart => {
                    documents += 1;
                    if documents > 1 {
                        return Err(Problem {
                            pos: Some(start.pos),
                            message: "this file holds more than one YAML document (`---`); keep one".into(),
                        });
                    }
                    root = Some(self.node()?);
                }
                _ => {}
            }
        }
    }

    /// Reads one whole node (the events up to its end).
    fn node(&mut self) -> Result<Node<'a>, Problem> {
        let mut stack: Vec<Open<'a>> = Vec::new();
        loop {
            let (event, start, end) = self.next()?;
            let pos = start.pos;
            let tag_error = || Problem {
                pos: Some(pos),
                message: "YAML tags (`!name`) are not supported here; remove the tag".into(),
            };
            let is_map = matches!(event, Event::MapStart { .. });
            let done = match event {
                Event::Scalar { tagged: true, .. }
                | Event::SeqStart { tagged: true, .. }
                | Event::MapStart { tagged: true, .. } => return Err(tag_error()),
                Event::Scalar { value, plain, anchor, .. } => {
                    let node = Node { pos, start: start.at, end: end.at, kind: Kind::Scalar { value, plain } };
                    self.anchor(anchor, &node);
                    node
                }
                Event::Alias(id) => match self.anchors.iter().rev().find(|(a, _)| *a == id) {
                    Some((_, node)) => {
                        let node = node.clone();
                        self.made += count(&node);
                        if self.made > 4 * self.src.len() + 1024 {
                            return Err(Problem { pos: Some(pos), message: "aliases expand to too many nodes".into() });
                        }
                        Node { pos, start: start.at, end: end.at, ..node }
                    }
                    None => {
                        // An alias inside the node its anchor names (`&x [*x]`).
                        return Err(Problem { pos: Some(pos), message: self.unknown_anchor(start.at) });
                    }
                },
                Event::SeqStart { anchor, .. } | Event::MapStart { anchor, .. } => {
                    if stack.len() >= MAX_DEPTH {
                        return Err(Problem {
                            pos: Some(pos),
                            message: format!("nested more than {MAX_DEPTH} levels deep"),
                        });
                    }
                    stack.push(Open { pos, start: start.at, anchor, items: Vec::new(), map: is_map });
                    continue;
                }
                Event::SeqEnd | Event::MapEnd => {
                    let Some(open) = stack.pop() else { continue };
                    let kind = if open.map {
                        let mut items = open.items.into_iter();
                        let mut pairs = Vec::with_capacity(items.len() / 2);
                        while let (Some(k), Some(v)) = (items.next(), items.next()) {
                            pairs.push((k, v));
                        }
                        Kind::Map(pairs)
                    } else {
                        let mut items = open.items;
                        items.shrink_to_fit();
                        Kind::Seq(items)
                    };
                    let node = Node { pos: open.pos, start: open.start, end: end.at, kind };
                    self.anchor(open.anchor, &node);
                    node
                }
                Event::StreamEnd | Event::DocumentStart | Event::Other => continue,
            };
            self.made += 1;
            match stack.last_mut() {
                Some(open) => open.items.push(done),
                None => return Ok(done),
            }
        }
    }

    fn anchor(&mut self, anchor: usize, node: &Node<'a>) {
        // saphyr's ids start at 1; 0 is no anchor.
        if anchor != 0 {
            self.anchors.push((anchor, node.clone()));
        }
    }
}

fn count(n: &Node<'_>) -> usize {
    1 + match &n.kind {
        Kind::Scalar { .. } => 0,
        Kind::Seq(s) => s.iter().map(count).sum(),
        Kind::Map(m) => m.iter().map(|(k, v)| count(k) + count(v)).sum(),
    }
}

/// Plain scalars are resolved by `yaml_serde` (the YAML 1.2 core schema:
/// `true`/`True`/`TRUE`, `0x1f`, `0o17`, `.inf`, ...), so config and
/// policy read values exactly as the rest of the ecosystem does; only
/// scalars that can be one (a digit, a sign, a dot or a boolean's first
/// letter in front) are handed to it, since most scalars here are globs.
fn resolve<T: de::DeserializeOwned>(s: &str) -> Option<T> {
    let first = s.bytes().next()?;
    (first.is_ascii_digit() || b"+-.tTfF".contains(&first)).then(|| serde_yaml::from_str(s).ok()).flatten()
}

fn parse_bool(s: &str) -> Option<bool> {
    resolve(s)
}

fn parse_unsigned(s: &str) -> Option<u64> {
    resolve(s)
}

fn parse_signed(s: &str) -> Option<i64> {
    resolve(s)
}

fn parse_float(s: &str) -> Option<f64> {
    resolve(s)
}

// ---------------------------------------------------------------------------
// Deserializing from the tree
// ---------------------------------------------------------------------------

/// A deserialization error, located at the node at fault once it has passed
/// through the deserializer.
#[derive(Debug)]
pub(crate) struct Error {
    pos: Option<Pos>,
    message: String,
    /// Already in the [`Problems`] list: do not record it again on the way up.
    recorded: bool,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Error { pos: None, message: msg.to_string(), recorded: false }
    }
}

/// Every problem met while deserializing one text, in the order met.
#[derive(Default)]
pub(crate) struct Problems(RefCell<Vec<Problem>>);

impl Problems {
    /// The problems, in the order met.
    pub(crate) fn into_vec(self) -> Vec<Problem> {
        self.0.into_inner()
    }
}

/// Deserializes `T` from `node`. Every error met is recorded in `problems`;
/// the first is also returned (a `T` made of [`Lenient`] parts goes on past
/// the errors of its parts and returns `Ok`, with them recorded).
pub(crate) fn from_node<'de, T: de::Deserialize<'de>>(node: &'de Node<'de>, problems: &Problems) -> Result<T, Problem> {
    T::deserialize(De { node, problems, path: Path::Root })
        .map_err(|e| Problem { pos: e.pos.or(Some(node.pos)), message: e.message })
}

/// Deserializes `T` from `node`, failing with the first problem (what the
/// config does).
pub(crate) fn from_node_strict<'de, T: de::Deserialize<'de>>(node: &'de Node<'de>) -> Result<T, Problem> {
    let problems = Problems::default();
    let value = from_node::<T>(node, &problems);
    match (value, problems.into_vec().into_iter().next()) {
        (Ok(v), None) => Ok(v),
        (_, Some(first)) => Err(first),
        (Err(e), None) => Err(e),
    }
}

/// Parses and deserializes a whole text, stopping at the first problem.
#[cfg(test)]
fn from_str<T: de::DeserializeOwned>(src: &str) -> Result<T, Problem> {
    let root = parse(src)?.unwrap_or_else(Node::empty_map);
    from_node_strict(&root)
}

#[derive(Clone, Copy)]
struct De<'de, 'p> {
    node: &'de Node<'de>,
    problems: &'p Problems,
    /// Where the node is, for messages: `roles.staff.allow[0].uri: …` (as `yaml_serde` says it).
    path: Path<'p>,
}

/// The keys and indices leading to a node.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => Ok(()),
            Path::Key(Path::Root, key) => f.write_str(key),
            Path::Key(parent, key) => write!(f, "{parent}.{key}"),
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

impl De<'_, '_> {
    /// Locates an error at this node unless a deeper node already did, and records it.
    fn locate(&self, mut e: Error) -> Error {
        self.locate_at(&mut e, self.node.pos);
        e
    }

    fn locate_at(&self, e: &mut Error, pos: Pos) {
        if !e.recorded {
            e.pos.get_or_insert(pos);
            e.recorded = true;
            if !matches!(self.path, Path::Root) {
                e.message = format!("{}: {}", self.path, e.message);
            }
            self.problems.0.borrow_mut().push(Problem { pos: e.pos, message: e.message.clone() });
        }
    }

    fn invalid<V>(&self, exp: &dyn de::Expected) -> Result<V, Error> {
        Err(self.locate(de::Error::invalid_type(self.node.unexpected(), exp)))
    }

    fn scalar(&self) -> Option<(&str, bool)> {
        match &self.node.kind {
            Kind::Scalar { value, plain } => Some((value, *plain)),
            _ => None,
        }
    }
}

macro_rules! number {
    ($method:ident, $visit:ident, $ty:ty, $parse:expr) => {
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
            match self.scalar() {
                Some((s, true)) => match ($parse)(s) {
                    Some(n) => visitor.$visit(n as $ty).map_err(|e| self.locate(e)),
                    None => self.deserialize_any(visitor),
                },
                _ => self.deserialize_any(visitor),
            }
        }
    };
}

impl<'de> Deserializer<'de> for De<'de, '_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let r = match &self.node.kind {
            Kind::Seq(_) => return self.deserialize_seq(visitor),
            Kind::Map(_) => return self.deserialize_map(visitor),
            Kind::Scalar { value, plain: false } => visitor.visit_str(value),
            Kind::Scalar { value, plain: true } => {
                if self.node.is_null() {
                    visitor.visit_unit()
                } else if let Some(b) = parse_bool(value) {
                    visitor.visit_bool(b)
                } else if let Some(n) = parse_unsigned(value) {
                    visitor.visit_u64(n)
                } else if let Some(n) = parse_signed(value) {
                    visitor.visit_i64(n)
                } else if let Some(f) = parse_float(value) {
                    visitor.visit_f64(f)
                } else {
                    visitor.visit_str(value)
                }
            }
        };
        r.map_err(|e| self.locate(e))
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.scalar().filter(|s| s.1).and_then(|s| parse_bool(s.0)) {
            Some(b) => visitor.visit_bool(b).map_err(|e| self.locate(e)),
            None => self.deserialize_any(visitor),
        }
    }

    number!(deserialize_u8, visit_u64, u64, parse_unsigned);
    number!(deserialize_u16, visit_u64, u64, parse_unsigned);
    number!(deserialize_u32, visit_u64, u64, parse_unsigned);
    number!(deserialize_u64, visit_u64, u64, parse_unsigned);
    number!(deserialize_i8, visit_i64, i64, parse_signed);
    number!(deserialize_i16, visit_i64, i64, parse_signed);
    number!(deserialize_i32, visit_i64, i64, parse_signed);
    number!(deserialize_i64, visit_i64, i64, parse_signed);
    number!(deserialize_f32, visit_f64, f64, parse_float);
    number!(deserialize_f64, visit_f64, f64, parse_float);

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.scalar() {
            Some((s, _)) => visitor.visit_str(s).map_err(|e| self.locate(e)),
            None => self.invalid(&visitor),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        if self.node.is_null() {
            visitor.visit_none().map_err(|e| self.locate(e))
        } else {
            visitor.visit_some(self).map_err(|e| self.locate(e))
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        if self.node.is_null() { visitor.visit_unit().map_err(|e| self.locate(e)) } else { self.invalid(&visitor) }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self).map_err(|e| self.locate(e))
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match &self.node.kind {
            Kind::Seq(items) => {
                let items = Items { items: items.iter().enumerate(), problems: self.problems, path: self.path };
                visitor.visit_seq(items).map_err(|e| self.locate(e))
            }
            _ => self.invalid(&visitor),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match &self.node.kind {
            Kind::Map(entries) => {
                let mut access = Entries {
                    entries: entries.iter(),
                    value: None,
                    key_pos: None,
                    problems: self.problems,
                    path: self.path,
                };
                let r = visitor.visit_map(&mut access);
                // An error the visitor raises itself (a repeated or missing
                // field) belongs to the key it read last, else to the mapping.
                r.map_err(|mut e| {
                    self.locate_at(&mut e, access.key_pos.unwrap_or(self.node.pos));
                    e
                })
            }
            // `key:` with nothing after it: an empty mapping to a map visitor that accepts it.
            Kind::Scalar { .. } if self.node.is_null() => visitor.visit_unit().map_err(|e| self.locate(e)),
            _ => self.invalid(&visitor),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match &self.node.kind {
            Kind::Map(_) => self.deserialize_map(visitor),
            _ => self.invalid(&visitor),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.scalar() {
            Some((s, _)) => {
                let access: de::value::StrDeserializer<'_, Error> = s.into_deserializer();
                visitor.visit_enum(access).map_err(|e| self.locate(e))
            }
            None => self.invalid(&visitor),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }
}

struct Items<'de, 'p> {
    items: std::iter::Enumerate<std::slice::Iter<'de, Node<'de>>>,
    problems: &'p Problems,
    path: Path<'p>,
}

impl<'de> SeqAccess<'de> for Items<'de, '_> {
    type Error = Error;
    fn next_element_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<Option<S::Value>, Error> {
        match self.items.next() {
            Some((i, node)) => {
                let path = Path::Index(&self.path, i);
                seed.deserialize(De { node, problems: self.problems, path }).map(Some)
            }
            None => Ok(None),
        }
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}

struct Entries<'de, 'p> {
    entries: std::slice::Iter<'de, (Node<'de>, Node<'de>)>,
    value: Option<(&'de Node<'de>, &'de Node<'de>)>,
    key_pos: Option<Pos>,
    problems: &'p Problems,
    path: Path<'p>,
}

impl<'de> MapAccess<'de> for &mut Entries<'de, '_> {
    type Error = Error;
    fn next_key_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<Option<S::Value>, Error> {
        match self.entries.next() {
            Some((key, value)) => {
                self.value = Some((key, value));
                self.key_pos = Some(key.pos);
                seed.deserialize(De { node: key, problems: self.problems, path: self.path }).map(Some)
            }
            None => Ok(None),
        }
    }
    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, Error> {
        let (key, node) = self.value.take().ok_or_else(|| de::Error::custom("a value was asked for before its key"))?;
        let path = Path::Key(&self.path, key.as_str().unwrap_or("?"));
        seed.deserialize(De { node, problems: self.problems, path })
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}

// ---------------------------------------------------------------------------
// Lenient parts and the ordered map
// ---------------------------------------------------------------------------

/// A part whose errors do not stop the whole: `None` when it could not be
/// read, its errors then recorded in the [`Problems`] list. Only for types
/// read with [`from_node`], whose caller fails when any problem was
/// recorded; a loader must never act on a value that had a `None` part.
#[derive(Debug)]
pub(crate) struct Lenient<T>(pub Option<T>);

impl<T> Default for Lenient<T> {
    fn default() -> Self {
        Lenient(None)
    }
}

impl<'de, T: de::Deserialize<'de>> de::Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Lenient(T::deserialize(d).ok()))
    }
}

/// What a map's values are called in "is defined twice" errors.
pub(crate) trait Named {
    /// E.g. `server`, `role`, `user`.
    const NOUN: &'static str;
}

impl<T: Named> Named for Lenient<T> {
    const NOUN: &'static str = T::NOUN;
}

impl<T: Named> Named for Option<T> {
    const NOUN: &'static str = T::NOUN;
}

/// A YAML mapping of names to definitions, kept in file order (which
/// matters: server order breaks priority ties, rules keep file order), where
/// a repeated name is an error at the repeat (serde's maps silently keep
/// the last, which would hide a mistake). `key:` with no value is empty.
#[derive(Debug, Clone)]
pub(crate) struct OrderedMap<V>(pub Vec<(String, V)>);

impl<V> Default for OrderedMap<V> {
    fn default() -> Self {
        OrderedMap(Vec::new())
    }
}

impl<'de, V: de::Deserialize<'de> + Named> de::Deserialize<'de> for OrderedMap<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<V>(PhantomData<V>);
        impl<'de, V: de::Deserialize<'de> + Named> Visitor<'de> for Visit<V> {
            type Value = OrderedMap<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a mapping of {} names to their settings", V::NOUN)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(OrderedMap::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out: Vec<(String, V)> = Vec::new();
                let mut seen = std::collections::HashSet::new();
                while let Some(key) = map.next_key::<String>()? {
                    if !seen.insert(key.clone()) {
                        return Err(de::Error::custom(format!(
                            "{} `{key}` is defined twice in this file; keep one definition",
                            V::NOUN
                        )));
                    }
                    let value = map.next_value::<V>()?;
                    out.push((key, value));
                }
                Ok(OrderedMap(out))
            }
        }
        d.deserialize_map(Visit(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What a config or policy file could hold, for the fuzz below.
    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code, reason = "only deserialized")]
    struct Anything {
        #[serde(default)]
        a: Lenient<OrderedMap<Lenient<Vec<String>>>>,
        #[serde(default)]
        b: Option<Lenient<u64>>,
        #[serde(default)]
        c: Option<Lenient<bool>>,
    }

    impl Named for Vec<String> {
        const NOUN: &'static str = "list";
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Any bytes (as text) are parsed and deserialized without a panic,
        /// and every problem is located inside the text.
        #[test]
        fn any_text_is_parsed_or_refused_never_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let text = String::from_utf8_lossy(&bytes);
            check(&text);
        }

        /// Text made of YAML's own punctuation, the likeliest to reach odd
        /// parser states (flow collections, anchors, tags, block scalars).
        #[test]
        fn yaml_punctuation_never_panics(text in "([-:?,\\[\\]{}&*!|>'\"#%@` \n\t]|a|b|1|~){0,80}") {
            check(&text);
        }
    }

    fn check(text: &str) {
        // Lines as YAML counts them (and libyaml did): `\r\n`, a lone `\r` or `\n` ends one.
        let lines = text.replace("\r\n", "\n").split(['\n', '\r']).count();
        match parse(text) {
            Err(p) => {
                if let Some(pos) = p.pos {
                    assert!(pos.line >= 1 && pos.line <= lines + 1, "{pos:?} outside {lines} lines: {text:?}");
                }
            }
            Ok(None) => {}
            Ok(Some(root)) => {
                let problems = Problems::default();
                let _ = from_node::<Anything>(&root, &problems);
                for p in problems.into_vec() {
                    let pos = p.pos.expect("a deserialization problem is located");
                    assert!(pos.line >= 1 && pos.line <= lines + 1, "{pos:?} outside {lines} lines: {text:?}");
                }
            }
        }
    }

    #[test]
    fn positions_come_from_the_parser_in_block_and_flow_style() {
        let root = parse("a:\n  b: [x, \"y\"]\nc: {d: 1, e: {f: g}}\n").unwrap().unwrap();
        assert_eq!(root.at(&["a", "b"]).unwrap().items()[1].pos, Pos { line: 2, column: 10 });
        assert_eq!(root.at(&["c", "e", "f"]).unwrap().pos, Pos { line: 3, column: 18 });
        assert_eq!(root.key_at("c", 0).unwrap().pos, Pos { line: 3, column: 1 });
        assert!(parse("# only a comment\n").unwrap().is_none());
    }

    #[test]
    fn syntax_errors_and_aliases() {
        let e = parse("a: [1,\nb: 2\n").unwrap_err();
        assert!(e.pos.is_some() && e.message.contains("flow sequence"), "{e:?}");
        let e = parse("a: *nope\n").unwrap_err();
        assert!(e.message.contains("unknown anchor"), "{e:?}");
        let root = parse("a: &x [1, 2]\nb: *x\n").unwrap().unwrap();
        assert_eq!(root.get("b").unwrap().items().len(), 2);
        assert!(parse("a: 1\n---\nb: 2\n").unwrap_err().message.contains("more than one"));
        let bomb = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n";
        assert!(parse(bomb).unwrap_err().message.contains("too many"));
    }

    #[test]
    fn byte_offsets_columns_in_characters_depth_tags_and_control_characters() {
        let src = "é: [ü, \"ñ x\"]\nb: |\n  z\n";
        let root = parse(src).unwrap().unwrap();
        let items = root.get("é").unwrap().items();
        assert_eq!(items[1].pos, Pos { line: 1, column: 8 });
        assert_eq!(&src[items[0].start as usize..items[0].end as usize], "ü");
        assert_eq!(&src[items[1].start as usize..items[1].end as usize], "\"ñ x\"");
        assert!(matches!(items[1].kind, Kind::Scalar { value: Cow::Borrowed("ñ x"), plain: false }));
        assert_eq!(root.get("b").unwrap().as_str(), Some("z\n"));
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let e = parse(&deep).unwrap_err();
        // saphyr refuses flow nesting past 255 while it scans ahead; other nesting stops at MAX_DEPTH.
        assert!(e.message.contains("nested more than") || e.message.contains("recursion limit"), "{e:?}");
        let deep: String = (0..200).map(|i| format!("{}- \n", "  ".repeat(i))).collect();
        assert!(parse(&deep).unwrap_err().message.contains("nested more than 128"));
        assert!(parse("a: !x 1\n").unwrap_err().message.contains("tags"));
        assert_eq!(parse("a: 1\nb: \u{7}\n").unwrap_err().pos, Some(Pos { line: 2, column: 4 }));
        let e = parse("a: &x [*x]\n").unwrap_err();
        assert!(e.message.contains("unknown anchor `x`") && e.pos == Some(Pos { line: 1, column: 8 }), "{e:?}");
        let e = parse("a: *nope\n").unwrap_err();
        assert!(e.message.contains("`nope`") && e.pos == Some(Pos { line: 1, column: 4 }), "{e:?}");
    }

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    struct Thing {
        n: Option<u64>,
        s: Option<String>,
        b: Option<bool>,
    }

    impl Named for Thing {
        const NOUN: &'static str = "thing";
    }

    #[test]
    fn scalars_resolve_like_yaml_serde_and_every_error_is_located() {
        let t: OrderedMap<Thing> =
            from_str("x: { n: 0x10, s: 12, b: true }\ny: {}\n").unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(t.0[0].1.n, Some(16));
        assert_eq!(t.0[0].1.s.as_deref(), Some("12"));
        assert_eq!(t.0[0].1.b, Some(true));
        assert!(
            from_str::<OrderedMap<Thing>>("x: {}\ny: { n: \"5\" }\n").unwrap_err().message.contains("invalid type")
        );

        // Lenient parts: both bad things are reported, each where it is.
        let root = parse("x: { n: lots }\ny: { m: 1 }\nx: {}\n").unwrap().unwrap();
        let problems = Problems::default();
        let all: Result<OrderedMap<Lenient<Thing>>, _> = from_node(&root, &problems);
        let problems = problems.into_vec();
        let at: Vec<(usize, usize)> = problems.iter().map(|p| p.pos.map_or((0, 0), |p| (p.line, p.column))).collect();
        assert_eq!(at, [(1, 9), (2, 6), (3, 1)], "{problems:?}");
        assert!(problems[2].message.contains("thing `x` is defined twice"), "{problems:?}");
        assert!(all.is_err());
    }
}
