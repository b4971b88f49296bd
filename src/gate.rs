//! The one gate for *requested* URIs.
//!
//! A `server:uri` that somebody asks for (`preview --select`, an `@server:uri`
//! mention, the model's `read_mcp_resource` call, a policy `include`, a
//! proxied request) is not a resource the server listed: it is a string.
//! MCP URIs are opaque to the host: custom schemes put identifiers in the
//! host position (`users://Bob/profile` and `users://bob/profile` are two
//! users), and the official SDKs match URIs and templates case-sensitively.
//! So nothing requested is ever rewritten: every requested URI passes
//! [`admit`] first, and is admitted, byte for byte as asked, only as one of:
//!
//! 1. **a listed resource**: exactly a URI in the server's current listing.
//!    The listing entry (with its MIME type) is what the policy decides on
//!    and what is read;
//! 2. **an expansion of a listed template** (RFC 6570 levels 1 and 2, as the
//!    SDKs match them: literals case-sensitively, a `{var}` value never
//!    contains `/`, `?` or `#`; a `{+var}` or `{#var}` value may contain
//!    `/`; no value contains `{` or `}`, so the unexpanded template is no
//!    expansion of itself; other operators are not matched, so such
//!    templates admit nothing), that passes [`hygiene`]. It carries the
//!    template's metadata (MIME type, annotations, name, title,
//!    description) into the decision, the block and the report;
//! 3. **one of the user's policy `include` entries** (operator-configured,
//!    `{user}` expanded URL-encoded), that passes [`hygiene`] too, with the
//!    metadata of a template it expands, if any.
//!
//! Anything else is refused and answered exactly like a resource that does
//! not exist: same text, never read. Servers may still normalise what they
//! are sent (lower-case a scheme, percent-decode, resolve `..`): [`hygiene`]
//! refuses the spellings that resolve elsewhere, and the policy's `deny`
//! rules also match with scheme and host case-folded ([`canonical_uri`]),
//! so ambiguity resolves toward deny.
//!
//! Layer: access, above the sources (it admits against the hub's listings). Imports `hub`, `policy`, `id`, `resource`.

use std::fmt;
use std::sync::Arc;

use crate::hub::Hub;
use crate::id::ResourceId;
use crate::policy::UserPolicy;
#[cfg(doc)]
use crate::policy::canonical_uri;
use crate::resource::{Resource, ResourceTemplate};

/// How a requested URI was admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// It is in the server's listing.
    Listing,
    /// It expands this listed template.
    Template(String),
    /// It is one of the user's policy `include` entries.
    Include,
}

/// A requested URI that passed the gate: the resource to decide on and read.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Admitted {
    /// The listing entry, or (for template expansions and includes) a
    /// resource known by the id as requested, with the metadata of the
    /// template it expands, if any.
    pub resource: Arc<Resource>,
    /// Why it was admitted.
    pub via: Via,
}

/// Why a requested URI was refused. Callers answer every refusal the same
/// way, as "not found" ([`Refusal::NOT_FOUND`]); the variants are for the
/// operator (`policy explain`, tracing).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// No server of that name is configured.
    UnknownServer(String),
    /// Not listed, no listed template expands to it, and no include names it.
    NotOffered,
    /// A `.` or `..` path segment (after percent-decoding once).
    DotSegment,
    /// A percent-encoded `.`, `/` or `\` (before or after decoding once).
    EncodedSeparator,
    /// A backslash (after percent-decoding once).
    Backslash,
    /// An empty path segment (`a//b`, a trailing `/`).
    EmptySegment,
    /// A control character (after percent-decoding once).
    ControlCharacter,
}

impl Refusal {
    /// What every refusal is reported as, to users, clients and models.
    pub const NOT_FOUND: &'static str =
        "not found: not in the server's listing, not an expansion of one of its templates, not a policy include";
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::UnknownServer(s) => write!(f, "unknown server `{s}`"),
            Refusal::NotOffered => f.write_str(Refusal::NOT_FOUND),
            Refusal::DotSegment => f.write_str("it contains a `.` or `..` path segment"),
            Refusal::EncodedSeparator => f.write_str("it contains a percent-encoded `.`, `/` or `\\`"),
            Refusal::Backslash => f.write_str("it contains a backslash"),
            Refusal::EmptySegment => f.write_str("it contains an empty path segment"),
            Refusal::ControlCharacter => f.write_str("it contains a control character"),
        }
    }
}

/// Passes a requested `server:uri` through the gate for `user` (see the
/// module doc). Nothing is read; the policy has not decided yet: call
/// [`UserPolicy::decide`] on the admitted resource.
pub fn admit(hub: &Hub, user: &UserPolicy, id: &ResourceId) -> Result<Admitted, Refusal> {
    let Some(listing) = hub.listing_of(&id.server) else {
        return Err(Refusal::UnknownServer(id.server.clone()));
    };
    if let Some(r) = listing.resources.iter().find(|r| r.id.uri == id.uri) {
        return Ok(Admitted { resource: r.clone(), via: Via::Listing });
    }
    hygiene(&id.uri)?;
    // The first template that expands to it, as the SDKs try them in order.
    let template = listing.templates.iter().find(|t| template_matches(&t.uri_template, &id.uri));
    let resource = || Arc::new(expansion(id, template));
    if user.includes().iter().any(|inc| inc == id) {
        return Ok(Admitted { resource: resource(), via: Via::Include });
    }
    match template {
        Some(t) => Ok(Admitted { resource: resource(), via: Via::Template(t.uri_template.clone()) }),
        None => Err(Refusal::NotOffered),
    }
}

/// The resource an unlisted URI names: known by its id only, with the
/// metadata of the template it expands, if any (an expansion has no
/// listing entry of its own to take them from).
fn expansion(id: &ResourceId, template: Option<&ResourceTemplate>) -> Resource {
    let mut r = Resource::unlisted(id.clone());
    if let Some(t) = template {
        r.name = t.name.clone();
        r.title = t.title.clone();
        r.description = t.description.clone();
        r.mime_type = t.mime_type.clone();
        r.annotations = t.annotations.clone();
    }
    r
}

/// The checks a requested URI that is not listed must pass: after
/// percent-decoding once, no dot segment, no percent-encoded `.`, `/` or
/// `\` (before or after decoding: double encoding is refused too), no
/// backslash, no empty path segment (a trailing `/` is one), no control
/// character. These are the spellings that servers resolve to a resource
/// other than the one the string seems to name.
pub(crate) fn hygiene(uri: &str) -> Result<(), Refusal> {
    let encoded_separator = |s: &str| {
        ["%2e", "%2f", "%5c"].iter().any(|e| s.as_bytes().windows(3).any(|w| w.eq_ignore_ascii_case(e.as_bytes())))
    };
    if encoded_separator(uri) {
        return Err(Refusal::EncodedSeparator);
    }
    let decoded = percent_encoding::percent_decode_str(uri).decode_utf8_lossy();
    if encoded_separator(&decoded) {
        return Err(Refusal::EncodedSeparator);
    }
    if decoded.contains('\\') {
        return Err(Refusal::Backslash);
    }
    if decoded.chars().any(char::is_control) {
        return Err(Refusal::ControlCharacter);
    }
    // What follows the scheme (and the authority, when there is one).
    let rest = match decoded.split_once(':') {
        Some((scheme, rest)) if !scheme.is_empty() && !scheme.contains('/') => rest,
        _ => &decoded[..],
    };
    let path_and_more = match rest.strip_prefix("//") {
        Some(after) => &after[after.find(['/', '?', '#']).unwrap_or(after.len())..],
        None => rest,
    };
    if path_and_more.split(['/', '?', '#', '&', '=', ';']).any(|seg| seg == "." || seg == "..") {
        return Err(Refusal::DotSegment);
    }
    let path = &path_and_more[..path_and_more.find(['?', '#']).unwrap_or(path_and_more.len())];
    let mut segments = path.split('/');
    if path.starts_with('/') {
        segments.next();
    }
    if !path.is_empty() && segments.any(str::is_empty) {
        return Err(Refusal::EmptySegment);
    }
    Ok(())
}

/// One piece of a parsed template.
enum Piece<'a> {
    Literal(&'a str),
    /// A variable; `reserved` (`{+var}`, `{#var}`) lets its value hold `/`.
    Var {
        reserved: bool,
    },
}

/// Parses an RFC 6570 level 1-2 template; `None` for anything else
/// (operators `/ . ; ? &`, several variables, modifiers, stray braces).
fn parse_template(t: &str) -> Option<Vec<Piece<'_>>> {
    let mut pieces = Vec::new();
    let mut rest = t;
    while let Some(open) = rest.find('{') {
        if rest[..open].contains('}') {
            return None;
        }
        if open > 0 {
            pieces.push(Piece::Literal(&rest[..open]));
        }
        let close = open + rest[open..].find('}')?;
        let expr = &rest[open + 1..close];
        let (op, name) = match expr.as_bytes().first()? {
            b'+' => (Some('+'), &expr[1..]),
            b'#' => (Some('#'), &expr[1..]),
            _ => (None, expr),
        };
        let valid_name =
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'%' || b == b'.');
        if !valid_name {
            return None;
        }
        if op == Some('#') {
            pieces.push(Piece::Literal("#"));
        }
        pieces.push(Piece::Var { reserved: op.is_some() });
        rest = &rest[close + 1..];
    }
    if rest.contains('}') {
        return None;
    }
    if !rest.is_empty() {
        pieces.push(Piece::Literal(rest));
    }
    Some(pieces)
}

/// Whether `uri` is an expansion of `template`: literals match exactly
/// (case-sensitively), each variable one or more characters (never `/` for
/// `{var}`, never `?`, `#`, `{` or `}` for any). Runs in O(pieces × length): the set of positions
/// reachable after each piece, no backtracking.
fn template_matches(template: &str, uri: &str) -> bool {
    let Some(pieces) = parse_template(template) else { return false };
    let s = uri.as_bytes();
    let mut reach = vec![false; s.len() + 1];
    reach[0] = true;
    for piece in &pieces {
        let mut next = vec![false; s.len() + 1];
        match piece {
            Piece::Literal(lit) => {
                for p in 0..s.len() {
                    if reach[p] && s[p..].starts_with(lit.as_bytes()) {
                        next[p + lit.len()] = true;
                    }
                }
            }
            Piece::Var { reserved } => {
                let allowed = |b: u8| !matches!(b, b'?' | b'#' | b'{' | b'}') && (*reserved || b != b'/');
                let mut running = false;
                for p in 0..s.len() {
                    running |= reach[p];
                    if !allowed(s[p]) {
                        running = false;
                    } else if running {
                        next[p + 1] = true;
                    }
                }
            }
        }
        reach = next;
    }
    reach[s.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hygiene_refuses_traversal_spellings() {
        for (uri, why) in [
            ("file:///docs/../secrets/key.txt", Refusal::DotSegment),
            ("file:///docs/%2e%2e/secrets/key.txt", Refusal::EncodedSeparator),
            ("file:///docs/%2E%2E/secrets/key.txt", Refusal::EncodedSeparator),
            ("file:///docs/..%2fsecrets/key.txt", Refusal::EncodedSeparator),
            ("file:///docs/%252e%252e/secrets", Refusal::EncodedSeparator),
            ("file:///docs/./../secrets/key.txt", Refusal::DotSegment),
            ("file:///docs/..\\secrets\\key.txt", Refusal::Backslash),
            ("file:///docs/%5csecrets", Refusal::EncodedSeparator),
            ("file:///docs//..//secrets/key.txt", Refusal::DotSegment),
            ("file:///docs//secrets", Refusal::EmptySegment),
            ("file:///docs/", Refusal::EmptySegment),
            ("file:///docs/a%00b", Refusal::ControlCharacter),
            ("file:///docs/a%0Ab", Refusal::ControlCharacter),
            ("demo:..", Refusal::DotSegment),
            ("x://h/a?path=..", Refusal::DotSegment),
        ] {
            assert_eq!(hygiene(uri), Err(why), "{uri}");
        }
        for ok in
            ["file:///docs/readme.txt", "file:///docs/sub/a.b.txt", "demo://users/bob/profile", "urn:a:b", "x://h"]
        {
            assert_eq!(hygiene(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn templates_level_1_and_2() {
        assert!(template_matches("demo://users/{user}/profile", "demo://users/bob/profile"));
        assert!(!template_matches("demo://users/{user}/profile", "demo://users/a/b/profile"));
        assert!(!template_matches("demo://users/{user}/profile", "demo://users//profile"));
        assert!(template_matches("file:///{+path}", "file:///docs/sub/a.txt"));
        assert!(!template_matches("file:///{+path}", "file:///docs?x"));
        assert!(template_matches("x://{a}-{b}", "x://1-2-3"));
        assert!(template_matches("x://p{#frag}", "x://p#a/b"));
        assert!(!template_matches("x://p{#frag}", "x://p"));
        // Literals are case-sensitive, and no value holds a brace: the
        // unexpanded template is no expansion of itself (issue 28).
        assert!(template_matches("tickets://{id}", "tickets://T-7"));
        assert!(!template_matches("tickets://{id}", "TICKETS://T-7"));
        assert!(!template_matches("tickets://{id}", "Tickets://T-7"));
        assert!(!template_matches("users://{user}/profile", "users://{user}/profile"));
        assert!(!template_matches("users://{user}/profile", "users://a}b/profile"));
        assert!(!template_matches("tickets://{id}", "tickets://{id}"));
        assert!(!template_matches("file:///{+path}", "file:///docs/{+path}"));
        assert!(!template_matches("x://p{#frag}", "x://p#{frag}"));
        // Level 3 and 4, and broken templates, match nothing.
        for t in ["x://s{?q}", "x://{a,b}", "x://{/p}", "x://{a:3}", "x://{a*}", "x://{a", "x://a}", "x://{}"] {
            assert!(!template_matches(t, "x://s?q=1"), "{t}");
            assert!(parse_template(t).is_none(), "{t}");
        }
    }
}
