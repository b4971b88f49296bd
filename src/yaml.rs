//! YAML as the config and the policy read it, and the one way their errors
//! are located.
//!
//! The text is parsed once by libyaml-rs (the parser under `yaml_serde`)
//! into a [`Node`] tree in which every node keeps the line and column the
//! parser gave its first character, so a problem found after parsing (an
//! undefined role, a server name that is invalid, a rule's line) points at
//! the value itself, whatever the layout: block or flow style, short or
//! repeated names. A serde [`Deserializer`](serde::Deserializer) over the
//! tree then fills the raw structs; its errors carry the position of the
//! node at fault, and every one is recorded in a [`Problems`] list, so a
//! caller that wraps independent parts in [`Lenient`] goes on past a bad
//! part and reports every problem at once. [`OrderedMap`] is the one map
//! that keeps file order and rejects a repeated key.
//!
//! Scalars are resolved as `yaml_serde` does (YAML 1.2 core schema): a
//! string is asked for as a string whatever it looks like; `~`, `null` and
//! nothing are null; `true`/`false`, decimal, `0x`, `0o`, `0b` integers and
//! floats are what they look like when a number or a bool is expected.
//!
//! The parser is libyaml's (through `libyaml-rs`'s FFI, the only `unsafe`
//! here), because it gives every node's start mark and fails with the
//! position of the fault, which the config's and policy's errors rely on.
//! Replacing it with a pure-Rust parser that keeps spans (saphyr-parser,
//! marked-yaml) is issue 32's plan and not done yet; until then the whole
//! layer is fuzzed (proptest over random bytes and over YAML punctuation,
//! below): no input panics, and every problem is located inside the text.

// libyaml is a C library: its parser is driven through FFI (see above).
#![allow(unsafe_code)]

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;
use std::mem::MaybeUninit;

use libyaml_rs as sys;
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

/// libyaml-rs's event parser, owned (it is a transpiled C API).
struct Parser<'a> {
    sys: Box<MaybeUninit<sys::yaml_parser_t>>,
    src: &'a str,
    anchors: Vec<(Box<[u8]>, Node<'a>)>,
    /// Nodes made so far, aliases expanded: capped so that a few aliases of
    /// aliases cannot expand into billions of nodes.
    made: usize,
}

/// One event, copied out of the parser.
enum Event<'a> {
    StreamEnd,
    DocumentStart,
    DocumentEnd,
    Alias(Box<[u8]>),
    Scalar { value: Cow<'a, str>, plain: bool, anchor: Option<Box<[u8]>>, tagged: bool },
    SeqStart { anchor: Option<Box<[u8]>>, tagged: bool },
    SeqEnd,
    MapStart { anchor: Option<Box<[u8]>>, tagged: bool },
    MapEnd,
    Other,
}

/// A node being built: its start and what it has so far.
struct Open<'a> {
    pos: Pos,
    start: u32,
    anchor: Option<Box<[u8]>>,
    items: Vec<Node<'a>>,
    map: bool,
}

impl Drop for Parser<'_> {
    fn drop(&mut self) {
        // SAFETY: initialised in `new` (or `new` panicked before a Parser existed).
        unsafe { sys::yaml_parser_delete(self.sys.as_mut_ptr()) }
    }
}

fn pos_of_mark(m: &sys::yaml_mark_t) -> Pos {
    Pos { line: m.line as usize + 1, column: m.column as usize + 1 }
}

/// A NUL-terminated string of the parser's, copied.
///
/// # Safety
/// `p` is null or points at a NUL-terminated string.
unsafe fn c_bytes(p: *const u8) -> Option<Box<[u8]>> {
    if p.is_null() {
        return None;
    }
    // SAFETY: per the contract.
    Some(unsafe { std::ffi::CStr::from_ptr(p.cast()) }.to_bytes().into())
}

impl<'a> Parser<'a> {
    fn new(src: &'a str) -> Self {
        let mut parser = Box::new(MaybeUninit::<sys::yaml_parser_t>::uninit());
        // SAFETY: the parser is initialised before use; `src` outlives it
        // (the Parser borrows it), as libyaml's string input requires.
        unsafe {
            let p = parser.as_mut_ptr();
            if sys::yaml_parser_initialize(p).fail {
                panic!("libyaml-rs could not initialise a parser");
            }
            sys::yaml_parser_set_encoding(p, sys::YAML_UTF8_ENCODING);
            sys::yaml_parser_set_input_string(p, src.as_ptr(), src.len() as u64);
        }
        Parser { sys: parser, src, anchors: Vec::new(), made: 0 }
    }

    /// The parser's error, formatted as `yaml_serde` does but with the
    /// problem's own position left to [`Problem::pos`].
    fn error(&self) -> Problem {
        // SAFETY: the parser is initialised; its error fields are set when a call failed.
        let p = unsafe { &*self.sys.as_ptr() };
        let problem = unsafe { c_bytes(p.problem.cast()) }
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_else(|| "the YAML parser failed".into());
        let mut message = problem;
        let at = pos_of_mark(&p.problem_mark);
        if let Some(context) = unsafe { c_bytes(p.context.cast()) } {
            message.push_str(", ");
            message.push_str(&String::from_utf8_lossy(&context));
            let ctx = pos_of_mark(&p.context_mark);
            if ctx != at && (p.context_mark.line != 0 || p.context_mark.column != 0) {
                message.push_str(&format!(" at line {} column {}", ctx.line, ctx.column));
            }
        }
        let pos = (p.problem_mark.line != 0 || p.problem_mark.column != 0 || p.problem_mark.index != 0).then_some(at);
        Problem { pos, message }
    }

    fn next(&mut self) -> Result<(Event<'a>, sys::yaml_mark_t, sys::yaml_mark_t), Problem> {
        let mut event = MaybeUninit::<sys::yaml_event_t>::uninit();
        // SAFETY: the parser is initialised; a parsed event is read, copied
        // and deleted before the next call.
        unsafe {
            let e = event.as_mut_ptr();
            if sys::yaml_parser_parse(self.sys.as_mut_ptr(), e).fail {
                return Err(self.error());
            }
            let ev = &*e;
            let out = match ev.type_ {
                sys::YAML_STREAM_END_EVENT => Event::StreamEnd,
                sys::YAML_DOCUMENT_START_EVENT => Event::DocumentStart,
                sys::YAML_DOCUMENT_END_EVENT => Event::DocumentEnd,
                sys::YAML_ALIAS_EVENT => Event::Alias(c_bytes(ev.data.alias.anchor).unwrap_or_default()),
                sys::YAML_SCALAR_EVENT => {
                    let s = &ev.data.scalar;
                    let bytes = std::slice::from_raw_parts(s.value, s.length as usize);
                    // Borrow the text when the source holds it as is (plain, or inside quotes).
                    let (from, to) = (ev.start_mark.index as usize, ev.end_mark.index as usize);
                    let src = self.src.as_bytes();
                    let value = if src.get(from..to) == Some(bytes) {
                        Cow::Borrowed(&self.src[from..to])
                    } else if to > from + 1 && src.get(from + 1..to - 1) == Some(bytes) {
                        Cow::Borrowed(&self.src[from + 1..to - 1])
                    } else {
                        Cow::Owned(String::from_utf8_lossy(bytes).into_owned())
                    };
                    Event::Scalar {
                        value,
                        plain: s.style == sys::YAML_PLAIN_SCALAR_STYLE,
                        anchor: c_bytes(s.anchor),
                        tagged: !s.tag.is_null(),
                    }
                }
                sys::YAML_SEQUENCE_START_EVENT => Event::SeqStart {
                    anchor: c_bytes(ev.data.sequence_start.anchor),
                    tagged: !ev.data.sequence_start.tag.is_null(),
                },
                sys::YAML_SEQUENCE_END_EVENT => Event::SeqEnd,
                sys::YAML_MAPPING_START_EVENT => Event::MapStart {
                    anchor: c_bytes(ev.data.mapping_start.anchor),
                    tagged: !ev.data.mapping_start.tag.is_null(),
                },
                sys::YAML_MAPPING_END_EVENT => Event::MapEnd,
                _ => Event::Other,
            };
            let (start, end) = (ev.start_mark, ev.end_mark);
            sys::yaml_event_delete(e);
            Ok((out, start, end))
        }
    }

    fn document(mut self) -> Result<Option<Node<'a>>, Problem> {
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
                            pos: Some(pos_of_mark(&start)),
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
            let pos = pos_of_mark(&start);
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
                    let node = Node {
                        pos,
                        start: start.index as u32,
                        end: end.index as u32,
                        kind: Kind::Scalar { value, plain },
                    };
                    self.anchor(anchor, &node);
                    node
                }
                Event::Alias(name) => match self.anchors.iter().rev().find(|(a, _)| *a == name) {
                    Some((_, node)) => {
                        let node = node.clone();
                        self.made += count(&node);
                        if self.made > 4 * self.src.len() + 1024 {
                            return Err(Problem { pos: Some(pos), message: "aliases expand to too many nodes".into() });
                        }
                        Node { pos, start: start.index as u32, end: end.index as u32, ..node }
                    }
                    None => {
                        return Err(Problem {
                            pos: Some(pos),
                            message: format!(
                                "unknown anchor `{}` (an alias `*name` needs an anchor `&name` before it)",
                                String::from_utf8_lossy(&name)
                            ),
                        });
                    }
                },
                Event::SeqStart { anchor, .. } | Event::MapStart { anchor, .. } => {
                    if stack.len() >= MAX_DEPTH {
                        return Err(Problem {
                            pos: Some(pos),
                            message: format!("nested more than {MAX_DEPTH} levels deep"),
                        });
                    }
                    stack.push(Open { pos, start: start.index as u32, anchor, items: Vec::new(), map: is_map });
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
                    let node = Node { pos: open.pos, start: open.start, end: end.index as u32, kind };
                    self.anchor(open.anchor, &node);
                    node
                }
                Event::StreamEnd | Event::DocumentStart | Event::DocumentEnd | Event::Other => continue,
            };
            self.made += 1;
            match stack.last_mut() {
                Some(open) => open.items.push(done),
                None => return Ok(done),
            }
        }
    }

    fn anchor(&mut self, anchor: Option<Box<[u8]>>, node: &Node<'a>) {
        if let Some(a) = anchor {
            self.anchors.push((a, node.clone()));
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
        let lines = text.split('\n').count();
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
