//! Resource identifiers: `server:uri`, split at the first colon.
//!
//! The same URI on two servers is two resources, so every public handle on a
//! resource carries its server name. Server names may never contain `:`, which
//! is what makes the first-colon split unambiguous (`docs:file:///a.txt` is
//! server `docs`, uri `file:///a.txt`).
//!
//! Layer: bottom. Imports only `error` and `display`.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, quote};

/// Longest identifier we accept, in bytes. Anything longer is almost certainly
/// garbage or an attack, and would only bloat logs and reports.
pub(crate) const MAX_ID_LEN: usize = 8192;

/// Longest user name accepted, in bytes, from any source: a policy, a caller
/// key's mapping, a header or a body. A name is an identifier, not a text.
pub const MAX_USER_NAME_BYTES: usize = 256;

/// What is wrong with a user name, if anything: empty, longer than
/// [`MAX_USER_NAME_BYTES`], or holding a control character or a
/// bidirectional control (U+202E and its kin, as [`display`](crate::display) lists them). A
/// newline in a name would forge log lines, and a name that prints
/// differently from what it is (`alice\u{202e}` shown as another) cannot
/// be audited. The same check for every source: a policy, a caller key's
/// mapping, a header, a body, a verified token's claim.
pub fn user_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        Some("a user name cannot be empty".into())
    } else if name.len() > MAX_USER_NAME_BYTES {
        Some(format!("a user name is at most {MAX_USER_NAME_BYTES} bytes (this one has {})", name.len()))
    } else if let Some(c) = name.chars().find(|c| c.is_control()) {
        Some(format!("a user name cannot hold control characters (found U+{:04X})", c as u32))
    } else {
        let bidi = name.chars().find(|c| crate::display::is_bidi_control(*c));
        bidi.map(|c| {
            format!(
                "a user name cannot hold bidirectional controls, which make it print as another name (found U+{:04X})",
                c as u32
            )
        })
    }
}

/// A resource's identity: the configured server name plus the URI the server
/// gave it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct ResourceId {
    /// Name of the server in the configuration.
    pub server: String,
    /// URI exactly as the server listed it.
    pub uri: String,
}

impl ResourceId {
    /// Builds an identifier from parts, validating both.
    pub fn new(server: impl Into<String>, uri: impl Into<String>) -> Result<Self, Error> {
        let (server, uri) = (server.into(), uri.into());
        let shown = format!("{server}:{uri}");
        validate_server_name(&server).map_err(|reason| Error::invalid_id(&shown, reason))?;
        validate_uri(&uri).map_err(|reason| Error::invalid_id(&shown, reason))?;
        Ok(Self { server, uri })
    }

    /// Parses `server:uri`, splitting at the first colon.
    pub fn parse(input: &str) -> Result<Self, Error> {
        if input.len() > MAX_ID_LEN {
            return Err(Error::invalid_id(
                input,
                format!("identifier is {} bytes; the limit is {MAX_ID_LEN}", input.len()),
            ));
        }
        let Some((server, uri)) = input.split_once(':') else {
            return Err(Error::invalid_id(
                input,
                "expected SERVER:URI (for example `demo:demo://guide`), found no ':'".into(),
            ));
        };
        Self::new(server, uri)
    }

    /// Builds an identifier for a URI a server returned, without judging the
    /// server's URI: the server name was validated when the config loaded.
    pub(crate) fn from_listing(server: &str, uri: &str) -> Self {
        Self { server: server.to_owned(), uri: uri.to_owned() }
    }
}

impl fmt::Display for ResourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.server, self.uri)
    }
}

impl FromStr for ResourceId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Self::parse(s)
    }
}

/// Server names: ASCII letters, digits, `-` and `_`, 1 to 64 characters.
pub(crate) fn validate_server_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the server name is empty (expected SERVER:URI)".into());
    }
    if name.len() > 64 {
        return Err(format!("server name is {} characters; the limit is 64", name.len()));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_')) {
        return Err(format!(
            "server name {} contains {}; use only letters, digits, '-' and '_'",
            quote(name),
            describe_char(c)
        ));
    }
    Ok(())
}

fn validate_uri(uri: &str) -> Result<(), String> {
    if uri.is_empty() {
        return Err("the URI is empty (expected SERVER:URI)".into());
    }
    if uri.len() > MAX_ID_LEN {
        return Err(format!("URI is {} bytes; the limit is {MAX_ID_LEN}", uri.len()));
    }
    if let Some(c) = uri.chars().find(|c| c.is_control()) {
        return Err(format!("URI contains the control character {}", describe_char(c)));
    }
    Ok(())
}

fn describe_char(c: char) -> String {
    if c.is_control() { format!("U+{:04X}", c as u32) } else { format!("'{c}'") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_at_first_colon() {
        let id = ResourceId::parse("docs:file:///a.txt").unwrap();
        assert_eq!((id.server.as_str(), id.uri.as_str()), ("docs", "file:///a.txt"));
        let id = ResourceId::parse("a:b:c").unwrap();
        assert_eq!((id.server.as_str(), id.uri.as_str()), ("a", "b:c"));
        assert_eq!(id.to_string(), "a:b:c");
    }

    #[test]
    fn rejects_malformed() {
        for (input, needle) in [
            (":x", "server name is empty"),
            ("x:", "URI is empty"),
            ("nocolon", "no ':'"),
            ("", "no ':'"),
            ("bad name:x", "' '"),
            ("a:b\u{7}c", "U+0007"),
            ("a:b\nc", "U+000A"),
            ("dé:x", "'é'"),
        ] {
            let err = ResourceId::parse(input).unwrap_err().to_string();
            assert!(err.contains(needle), "{input:?}: {err}");
        }
        let huge = format!("a:{}", "x".repeat(MAX_ID_LEN + 1));
        assert!(ResourceId::parse(&huge).unwrap_err().to_string().contains("limit"));
    }

    #[test]
    fn user_names_print_as_what_they_are() {
        assert_eq!(user_name_problem("alice"), None);
        assert_eq!(user_name_problem("Zoë O'Brien"), None);
        assert!(user_name_problem("a\nb").is_some_and(|p| p.contains("control characters (found U+000A)")));
        for (name, code) in
            [("mallory\u{202e}ecila", "U+202E"), ("\u{2066}bob\u{2069}", "U+2066"), ("x\u{200f}", "U+200F")]
        {
            let problem = user_name_problem(name).unwrap_or_default();
            assert!(problem.contains("bidirectional controls") && problem.contains(code), "{name:?}: {problem}");
        }
    }

    #[test]
    fn percent_escapes_are_just_text() {
        let id = ResourceId::parse("a:x%ff%00").unwrap();
        assert_eq!(id.uri, "x%ff%00");
    }
}
