//! The file form of a policy, deserialized straight from the text so that
//! the YAML parser reports line and column. Patterns, includes and budgets
//! are validated while deserializing, so their errors point at the
//! offending value.

use std::collections::HashSet;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use super::USER_PLACEHOLDER;
use super::glob::Pattern;
use crate::error::{Error, quote};
use crate::id::ResourceId;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a policy: a mapping with default_roles, roles and users")]
pub(super) struct RawFile {
    #[serde(default)]
    pub(super) default_roles: Option<Vec<String>>,
    #[serde(default)]
    pub(super) roles: Entries<RawRole>,
    #[serde(default)]
    pub(super) users: Entries<RawUser>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a role: a mapping with allow, deny, max_tokens, include")]
pub(super) struct RawRole {
    #[serde(default, deserialize_with = "null_as_default")]
    pub(super) allow: Vec<RawRule>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub(super) deny: Vec<RawRule>,
    #[serde(default)]
    pub(super) max_tokens: Option<MaxTokens>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub(super) include: Vec<Include>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a user: a mapping with roles, allow, deny, max_tokens, include")]
pub(super) struct RawUser {
    #[serde(default, deserialize_with = "null_as_default")]
    pub(super) roles: Vec<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub(super) allow: Vec<RawRule>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub(super) deny: Vec<RawRule>,
    #[serde(default)]
    pub(super) max_tokens: Option<MaxTokens>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub(super) include: Vec<Include>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a rule: a mapping such as { server: demo, uri: \"demo://**\" }")]
pub(super) struct RawRule {
    pub(super) server: Option<Pattern>,
    pub(super) uri: Option<UriPattern>,
    pub(super) mime: Option<MimePattern>,
}

/// A `uri` glob, compiled for canonical URIs (see [`Pattern::compile_uri`]).
pub(super) struct UriPattern(pub(super) Pattern);

/// A `mime` glob, compiled for normalised MIME types (see [`Pattern::compile_mime`]).
pub(super) struct MimePattern(pub(super) Pattern);

/// `max_tokens`, at least 1.
pub(super) struct MaxTokens(pub(super) usize);

/// A YAML mapping kept in file order, remembering the first duplicate key
/// (serde's maps silently keep the last, which would hide a mistake).
pub(super) struct Entries<T> {
    pub(super) items: Vec<(String, T)>,
    pub(super) duplicate: Option<String>,
}

impl<T> Default for Entries<T> {
    fn default() -> Self {
        Entries { items: Vec::new(), duplicate: None }
    }
}

/// Lets `key:` with no value mean "empty" rather than a type error.
pub(super) fn null_as_default<'de, D, T>(d: D) -> std::result::Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

impl<'de, T: Deserialize<'de> + Default> Deserialize<'de> for Entries<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de> + Default> Visitor<'de> for V<T> {
            type Value = Entries<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping of names to definitions")
            }
            fn visit_unit<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
                Ok(Entries::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Self::Value, A::Error> {
                let mut out = Entries::default();
                let mut seen = HashSet::new();
                while let Some(key) = map.next_key::<String>()? {
                    let value = map.next_value::<Option<T>>()?.unwrap_or_default();
                    if out.duplicate.is_none() && !seen.insert(key.clone()) {
                        out.duplicate = Some(key.clone());
                    }
                    out.items.push((key, value));
                }
                Ok(out)
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

impl<'de> Deserialize<'de> for Pattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_str(PatternVisitor(Pattern::compile))
    }
}

impl<'de> Deserialize<'de> for UriPattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_str(PatternVisitor(Pattern::compile_uri)).map(UriPattern)
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
    // Validating inside the visitor makes serde_yaml blame the scalar's position.
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
