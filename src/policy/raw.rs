//! The file form of a policy, deserialized from the located YAML tree
//! (`crate::yaml`) so that every error has a line and column. Patterns,
//! includes and budgets are validated while deserializing, so their errors
//! point at the offending value. Roles, users, rules, includes and budgets
//! are [`Lenient`] parts: a bad one is recorded and the rest still read, so
//! one load reports every problem.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use super::USER_PLACEHOLDER;
use super::glob::Pattern;
use crate::error::{Error, quote};
use crate::id::ResourceId;
use crate::yaml::{Lenient, Named, OrderedMap};

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a policy: a mapping with default_roles, roles and users")]
pub(super) struct RawFile {
    #[serde(default)]
    pub(super) default_roles: Option<Vec<String>>,
    #[serde(default)]
    pub(super) roles: Lenient<OrderedMap<Lenient<Option<RawRole>>>>,
    #[serde(default)]
    pub(super) users: Lenient<OrderedMap<Lenient<Option<RawUser>>>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a role: a mapping with allow, deny, max_tokens, include")]
pub(super) struct RawRole {
    #[serde(default, deserialize_with = "null_as_default")]
    pub(super) allow: Vec<Lenient<RawRule>>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub(super) deny: Vec<Lenient<RawRule>>,
    #[serde(default)]
    pub(super) max_tokens: Option<Lenient<MaxTokens>>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub(super) include: Vec<Lenient<Include>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a user: a mapping with roles, allow, deny, max_tokens, include")]
pub(super) struct RawUser {
    #[serde(default, deserialize_with = "null_as_default")]
    pub(super) roles: Vec<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub(super) allow: Vec<Lenient<RawRule>>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub(super) deny: Vec<Lenient<RawRule>>,
    #[serde(default)]
    pub(super) max_tokens: Option<Lenient<MaxTokens>>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub(super) include: Vec<Lenient<Include>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a rule: a mapping such as { server: demo, uri: \"demo://**\" }")]
pub(super) struct RawRule {
    pub(super) server: Option<Pattern>,
    pub(super) uri: Option<UriPattern>,
    pub(super) mime: Option<MimePattern>,
}

/// A `uri` glob as written, and, when lower-casing its scheme and host
/// changes it, that folded form too (only `deny` rules use it: see
/// [`Pattern::compile_folded_uri`]).
pub(super) struct UriPattern(pub(super) Pattern, pub(super) Option<Pattern>);

/// A `mime` glob, compiled for normalised MIME types (see [`Pattern::compile_mime`]).
pub(super) struct MimePattern(pub(super) Pattern);

/// `max_tokens`, at least 1.
pub(super) struct MaxTokens(pub(super) usize);

/// Lets `key:` with no value mean "empty" rather than a type error.
pub(super) fn null_as_default<'de, D, T>(d: D) -> std::result::Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

impl Named for RawRole {
    const NOUN: &'static str = "role";
}

impl Named for RawUser {
    const NOUN: &'static str = "user";
}

impl<'de> Deserialize<'de> for Pattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_str(PatternVisitor(Pattern::compile))
    }
}

impl<'de> Deserialize<'de> for UriPattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let exact = d.deserialize_str(PatternVisitor(Pattern::compile))?;
        let folded = Pattern::compile_folded_uri(&exact.text).map_err(de::Error::custom)?;
        Ok(UriPattern(exact, folded))
    }
}

impl<'de> Deserialize<'de> for MimePattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_str(PatternVisitor(Pattern::compile_mime)).map(MimePattern)
    }
}

/// Compiles a glob while deserializing it.
pub(super) struct PatternVisitor(fn(&str) -> std::result::Result<Pattern, String>);

impl Visitor<'_> for PatternVisitor {
    type Value = Pattern;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a glob pattern string")
    }
    // Validating inside the visitor makes the error point at the scalar.
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Pattern, E> {
        (self.0)(v).map_err(E::custom)
    }
}

impl<'de> Deserialize<'de> for Include {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Include;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a SERVER:URI string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Include, E> {
                parse_include(v).map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

pub(super) fn parse_include(text: &str) -> std::result::Result<Include, String> {
    let hint = "an include is SERVER:URI, e.g. `crm:crm://users/{user}/profile`";
    if text.split_once(':').is_some_and(|(server, _)| server.contains(USER_PLACEHOLDER)) {
        return Err(format!("invalid include {}: `{{user}}` may appear only in the URI; {hint}", quote(text)));
    }
    match ResourceId::parse(&text.replace(USER_PLACEHOLDER, "user")) {
        // The server part has no placeholder (checked above), so `id.server` is
        // it verbatim; keep the URI part unexpanded for `for_user`.
        Ok(id) => Ok(Include { server: id.server, uri: text.split_once(':').map_or("", |(_, u)| u).to_owned() }),
        Err(Error::InvalidId { reason, .. }) => Err(format!("invalid include {}: {reason}; {hint}", quote(text))),
        Err(e) => Err(format!("invalid include {}: {e}; {hint}", quote(text))),
    }
}

impl<'de> Deserialize<'de> for MaxTokens {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        const ZERO: &str = "max_tokens must be at least 1; remove it to use the configured context.max_tokens";
        impl Visitor<'_> for V {
            type Value = MaxTokens;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a positive number of tokens")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<MaxTokens, E> {
                match usize::try_from(v) {
                    Ok(0) => Err(E::custom(ZERO)),
                    Ok(n) => Ok(MaxTokens(n)),
                    Err(_) => Err(E::custom("max_tokens is too large")),
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<MaxTokens, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(ZERO)),
                }
            }
        }
        d.deserialize_u64(V)
    }
}

/// An `include` entry, validated: `server` is a valid server name, `uri` is a
/// valid URI once `{user}` is replaced.
#[derive(Debug, Clone)]
pub(super) struct Include {
    pub(super) server: String,
    pub(super) uri: String,
}
