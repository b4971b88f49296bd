//! Deserializing from the tree: a serde [`Deserializer`](serde::Deserializer)
//! whose errors carry the node's position, the [`Problems`] list, [`Lenient`]
//! and [`OrderedMap`].

use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Visitor};

use super::{Kind, Node, Pos, Problem};

/// Plain scalars are resolved by `yaml_serde` (the YAML 1.2 core schema:
/// `true`/`True`/`TRUE`, `0x1f`, `0o17`, `.inf`, ...), so config and
/// policy read values exactly as the rest of the ecosystem does; only
/// scalars that can be one (a digit, a sign, a dot or a boolean's first
/// letter in front) are handed to it, since most scalars here are globs.
fn resolve<T: de::DeserializeOwned>(s: &str) -> Option<T> {
    let first = s.bytes().next()?;
    (first.is_ascii_digit() || b"+-.tTfF".contains(&first)).then(|| serde_yaml::from_str(s).ok()).flatten()
}

pub(super) fn parse_bool(s: &str) -> Option<bool> {
    resolve(s)
}

pub(super) fn parse_unsigned(s: &str) -> Option<u64> {
    resolve(s)
}

pub(super) fn parse_signed(s: &str) -> Option<i64> {
    resolve(s)
}

pub(super) fn parse_float(s: &str) -> Option<f64> {
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
    /// The field a struct found missing (serde's `missing_field`).
    missing: Option<&'static str>,
    /// Caused by an entry [`from_node_all`] skipped: not reported.
    cascade: bool,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Error { pos: None, message: msg.to_string(), recorded: false, missing: None, cascade: false }
    }

    fn missing_field(field: &'static str) -> Self {
        Error { missing: Some(field), ..<Error as de::Error>::custom(format_args!("missing field `{field}`")) }
    }
}

/// Every problem met while deserializing one text, in the order met.
#[derive(Default)]
pub(crate) struct Problems {
    list: RefCell<Vec<Recorded>>,
    /// Entries read as if absent (by the address of their key or value node): see [`from_node_all`].
    skip: HashSet<usize>,
}

/// One problem, with the entry to skip to get past it.
struct Recorded {
    problem: Problem,
    /// The address of the key or value node of the mapping entry it is in (0: none, the root).
    entry: usize,
    cascade: bool,
}

impl Problems {
    /// The problems, in the order met.
    pub(crate) fn into_vec(self) -> Vec<Problem> {
        self.list.into_inner().into_iter().map(|r| r.problem).collect()
    }
}

/// The identity of a node of the tree, for [`Problems::skip`].
fn addr(node: &Node<'_>) -> usize {
    node as *const Node<'_> as usize
}

/// Deserializes `T` from `node`. Every error met is recorded in `problems`;
/// the first is also returned (a `T` made of [`Lenient`] parts goes on past
/// the errors of its parts and returns `Ok`, with them recorded).
pub(crate) fn from_node<'de, T: de::Deserialize<'de>>(node: &'de Node<'de>, problems: &Problems) -> Result<T, Problem> {
    T::deserialize(De { node, problems, path: Path::Root, entry: 0 })
        .map_err(|e| Problem { pos: e.pos.or(Some(node.pos)), message: e.message })
}

/// Like [`from_node`], but past every problem, not only past [`Lenient`]
/// parts: a struct stops at its first bad field (serde's derived code
/// returns its first error), so the text is read again with the entry at
/// fault taken as absent, until no new problem appears. Every problem of
/// every pass is recorded once, in the order met; a field then found
/// missing because its bad entry was skipped is not one. The value is the
/// last pass's, read with bad entries left out: only for a caller that
/// fails when any problem was recorded, as for [`Lenient`].
pub(crate) fn from_node_all<'de, T: de::Deserialize<'de>>(
    node: &'de Node<'de>,
    problems: &Problems,
) -> Result<T, Problem> {
    // Each pass skips at least one more entry, so the passes are bounded by
    // the entries; the cap only bounds the work on a text full of problems.
    const MAX_PASSES: usize = 64;
    let mut skip = HashSet::new();
    let mut pass = 0;
    loop {
        let this = Problems { list: RefCell::default(), skip: skip.clone() };
        let result = from_node::<T>(node, &this);
        let mut grew = false;
        for r in this.list.into_inner() {
            let mut list = problems.list.borrow_mut();
            if !r.cascade && !list.iter().any(|o| o.problem == r.problem) {
                list.push(Recorded { entry: 0, ..r });
            }
            grew |= r.entry != 0 && skip.insert(r.entry);
        }
        pass += 1;
        if !grew || pass == MAX_PASSES {
            return result;
        }
    }
}

/// Parses and deserializes a whole text, failing with its first problem.
#[cfg(test)]
pub(crate) fn from_str<T: de::DeserializeOwned>(src: &str) -> Result<T, Problem> {
    let root = super::parse(src)?.unwrap_or_else(Node::empty_map);
    let problems = Problems::default();
    let value = from_node::<T>(&root, &problems);
    match (value, problems.into_vec().into_iter().next()) {
        (Ok(v), None) => Ok(v),
        (_, Some(first)) => Err(first),
        (Err(e), None) => Err(e),
    }
}

#[derive(Clone, Copy)]
struct De<'de, 'p> {
    node: &'de Node<'de>,
    problems: &'p Problems,
    /// Where the node is, for messages: `roles.staff.allow[0].uri: …` (as `yaml_serde` says it).
    path: Path<'p>,
    /// The mapping entry the node is in or under (see [`Recorded::entry`]).
    entry: usize,
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
        self.locate_in(e, pos, self.entry);
    }

    /// Locates and records an error, which skipping `entry` gets past.
    fn locate_in(&self, e: &mut Error, pos: Pos, entry: usize) {
        if !e.recorded {
            e.pos.get_or_insert(pos);
            e.recorded = true;
            if !matches!(self.path, Path::Root) {
                e.message = format!("{}: {}", self.path, e.message);
            }
            let problem = Problem { pos: e.pos, message: e.message.clone() };
            self.problems.list.borrow_mut().push(Recorded { problem, entry, cascade: e.cascade });
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
                let items = Items {
                    items: items.iter().enumerate(),
                    problems: self.problems,
                    path: self.path,
                    entry: self.entry,
                };
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
                    last_key: None,
                    skipped: Vec::new(),
                    problems: self.problems,
                    path: self.path,
                };
                let r = visitor.visit_map(&mut access);
                // An error the visitor raises itself (a repeated or missing
                // field) belongs to the key it read last, else to the mapping.
                r.map_err(|mut e| {
                    let pos = access.key_pos.unwrap_or(self.node.pos);
                    match e.missing {
                        // Missing: the mapping is at fault; missing because its entry was skipped: a cascade.
                        Some(field) => {
                            e.cascade = access.skipped.contains(&field);
                            self.locate_at(&mut e, pos);
                        }
                        // Repeated: the entry read last.
                        None => self.locate_in(&mut e, pos, access.last_key.unwrap_or(self.entry)),
                    }
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
    /// A list's items are not skipped one by one (callers find an item's node by its index): the list's entry is.
    entry: usize,
}

impl<'de> SeqAccess<'de> for Items<'de, '_> {
    type Error = Error;
    fn next_element_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<Option<S::Value>, Error> {
        match self.items.next() {
            Some((i, node)) => {
                let path = Path::Index(&self.path, i);
                seed.deserialize(De { node, problems: self.problems, path, entry: self.entry }).map(Some)
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
    /// The address of the key read last.
    last_key: Option<usize>,
    /// The keys of the entries skipped (see [`Problems::skip`]).
    skipped: Vec<&'de str>,
    problems: &'p Problems,
    path: Path<'p>,
}

impl<'de> MapAccess<'de> for &mut Entries<'de, '_> {
    type Error = Error;
    fn next_key_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<Option<S::Value>, Error> {
        for (key, value) in self.entries.by_ref() {
            let skip = &self.problems.skip;
            if !skip.is_empty() && (skip.contains(&addr(key)) || skip.contains(&addr(value))) {
                self.skipped.extend(key.as_str());
                continue;
            }
            self.value = Some((key, value));
            self.key_pos = Some(key.pos);
            self.last_key = Some(addr(key));
            let de = De { node: key, problems: self.problems, path: self.path, entry: addr(key) };
            return seed.deserialize(de).map(Some);
        }
        Ok(None)
    }
    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, Error> {
        let (key, node) = self.value.take().ok_or_else(|| de::Error::custom("a value was asked for before its key"))?;
        let path = Path::Key(&self.path, key.as_str().unwrap_or("?"));
        seed.deserialize(De { node, problems: self.problems, path, entry: addr(node) })
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
