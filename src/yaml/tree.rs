//! Building the [`Node`] tree from saphyr-parser's events (see the module
//! above for why saphyr).

use std::borrow::Cow;

use saphyr_parser as sp;

use super::{Kind, MAX_DEPTH, Node, Pos, Problem};

/// saphyr's event parser over the text, with what the tree needs besides.
pub(super) struct Parser<'a> {
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
    pub(super) fn new(src: &'a str) -> Self {
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
        // A flow collection closed by the wrong bracket before it (or at it): the fault is there.
        if let Some((at, message)) = super::flow::mismatch(self.src, self.byte(m.index()) as usize)
            && pos.is_none_or(|p| (at.line, at.column) <= (p.line, p.column))
        {
            return Problem { pos: Some(at), message };
        }
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
    pub(super) fn document(mut self) -> Result<Option<Node<'a>>, Problem> {
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
