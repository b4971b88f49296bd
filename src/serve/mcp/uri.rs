//! Our URIs on the MCP endpoint, each reversible to exactly one
//! `(server, uri)` and back, and never the same for two:
//!
//! - `mcp-context://SERVER/ENCODED`: the resource `uri` of the configured
//!   server `SERVER` (its name as configured, case-sensitive), `ENCODED`
//!   being `uri` percent-encoded byte by byte: the unreserved characters
//!   (`A-Z a-z 0-9 - . _ ~`) as they are, every other byte as `%XX` with
//!   upper-case hex digits. That spelling is the only one accepted: a lower-case
//!   digit, an encoded unreserved character, a raw reserved character, a
//!   user, a port, a query or a fragment is no URI of ours, and is answered
//!   as a resource that does not exist. So the URI a server's resource gets
//!   is stable (it depends on the two names only), and no two spellings
//!   name one resource or one spelling two.
//! - `mcp-context://SERVER/` (nothing encoded: no upstream URI is empty): how
//!   to connect `SERVER`, a per-user server the caller has not connected.
//! - `mcp-context://context`: the whole context an injection would send this
//!   caller (no `/`, so no server's resource is ever named so).
//!
//! A template `T` of `SERVER` is published as `mcp-context://SERVER/` then
//! `T` with its literal parts encoded as above and each expression kept as
//! a simple one (`{+var}` as `{var}`, `{#var}` as `%23{var}`): a host that
//! expands it with a value of unreserved characters, or of `/` for a
//! `{+var}` (which the host encodes as `%2F`), names exactly the upstream
//! expansion. Other operators and multi-variable expressions are not
//! published (the gate admits no expansion of them either).
//!
//! Pure; imports only `id`.

use crate::id::ResourceId;

/// The scheme and authority prefix of every URI of ours.
pub(super) const PREFIX: &str = "mcp-context://";
/// The whole context as one resource.
pub(super) const CONTEXT: &str = "mcp-context://context";

/// What one of our URIs names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Ours {
    /// `mcp-context://context`.
    Context,
    /// `mcp-context://SERVER/`: where to connect the server.
    Connect(String),
    /// A server's resource.
    Resource(ResourceId),
}

/// Our URI of a server's resource.
pub(super) fn of(id: &ResourceId) -> String {
    format!("{PREFIX}{}/{}", id.server, encode(&id.uri))
}

/// Our URI for connecting `server`.
pub(super) fn connect(server: &str) -> String {
    format!("{PREFIX}{server}/")
}

/// What `uri` names, when it is one of ours spelled exactly as we spell it.
pub(super) fn parse(uri: &str) -> Option<Ours> {
    if uri == CONTEXT {
        return Some(Ours::Context);
    }
    let rest = uri.strip_prefix(PREFIX)?;
    let (server, encoded) = rest.split_once('/')?;
    if encoded.is_empty() {
        // Validated as a server name (any other is not ours).
        return ResourceId::new(server, "x").ok().map(|_| Ours::Connect(server.to_owned()));
    }
    let decoded = decode(encoded)?;
    let id = ResourceId::new(server, decoded).ok()?;
    // The one spelling: what we would write for it, byte for byte.
    (of(&id) == uri).then_some(Ours::Resource(id))
}

/// Our template for `server`'s template `t` (`None` when it cannot be published).
pub(super) fn template(server: &str, t: &str) -> Option<String> {
    let mut out = format!("{PREFIX}{server}/");
    let mut rest = t;
    while let Some(open) = rest.find('{') {
        if rest[..open].contains('}') {
            return None;
        }
        out.push_str(&encode(&rest[..open]));
        let close = rest[open..].find('}')? + open;
        let expr = &rest[open + 1..close];
        let (op, var) = match expr.chars().next()? {
            c @ ('+' | '#') => (Some(c), &expr[1..]),
            _ => (None, expr),
        };
        let simple = !var.is_empty() && var.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !simple {
            return None;
        }
        if op == Some('#') {
            out.push_str("%23");
        }
        out.push('{');
        out.push_str(var);
        out.push('}');
        rest = &rest[close + 1..];
    }
    if rest.contains('}') {
        return None;
    }
    out.push_str(&encode(rest));
    Some(out)
}

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Every byte but the unreserved ones as `%XX` (upper-case hex).
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if unreserved(b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The inverse of [`encode`] on its own output only: `None` for anything
/// it would not have written (a raw reserved byte, lower-case hex, an
/// encoded unreserved byte, a truncated escape, bytes that are not UTF-8).
fn decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = b.get(i + 1..i + 3)?;
                if !hex.iter().all(|h| h.is_ascii_digit() || (b'A'..=b'F').contains(h)) {
                    return None;
                }
                let v = u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
                if unreserved(v) {
                    return None;
                }
                out.push(v);
                i += 3;
            }
            c if unreserved(c) => {
                out.push(c);
                i += 1;
            }
            _ => return None,
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str, u: &str) -> ResourceId {
        ResourceId::new(s, u).unwrap()
    }

    #[test]
    fn round_trips_and_is_stable() {
        for (s, u) in [
            ("docs", "fx://doc/0"),
            ("a_b-C", "file:///a b/ü?x=1#f"),
            ("s", "%41"),
            ("s", "users://Bob/profile"),
            ("context", "x://y"),
        ] {
            let ours = of(&id(s, u));
            assert_eq!(parse(&ours), Some(Ours::Resource(id(s, u))), "{ours}");
            assert!(!ours[PREFIX.len()..].contains(['?', '#', '@', ':']), "{ours}");
        }
        assert_eq!(of(&id("docs", "fx://doc/0")), "mcp-context://docs/fx%3A%2F%2Fdoc%2F0");
        assert_eq!(of(&id("s", "%41")), "mcp-context://s/%2541", "a literal % stays distinct from what it encodes");
        assert_eq!(parse(CONTEXT), Some(Ours::Context));
        assert_eq!(parse("mcp-context://docs/"), Some(Ours::Connect("docs".into())));
    }

    #[test]
    fn forged_spellings_are_not_ours() {
        for forged in [
            "mcp-context://docs/fx%3a%2f%2fdoc%2f0",    // lower-case hex
            "mcp-context://docs/fx://doc/0",            // raw reserved characters
            "mcp-context://docs/fx%3A%2F%2Fdoc%2F%30",  // an encoded unreserved character
            "mcp-context://DOCS/fx%3A%2F%2Fdoc%2F0/..", // a dot segment after it
            "mcp-context://docs/fx%3A%2F%2Fdoc%2F0%",   // a truncated escape
            "mcp-context://docs/fx%3A%2F%2Fdoc%2F0?x",  // a query
            "mcp-context://docs/fx%3A%2F%2Fdoc%2F0#x",  // a fragment
            "mcp-context://u@docs/fx%3A%2F%2Fdoc%2F0",  // a user
            "mcp-context://docs:80/fx%3A%2F%2Fdoc%2F0", // a port
            "mcp-context://do%63s/fx%3A%2F%2Fdoc%2F0",  // an encoded server name
            "mcp-context://docs/%FF",                   // not UTF-8
            "mcp-context://docs/%0A",                   // a control character
            "MCP-CONTEXT://docs/fx%3A%2F%2Fdoc%2F0",    // the scheme's case
            "mcp-context://context/",                   // a server named so, with nothing
            "mcp-context:/docs/fx",
            "mcp-context://",
        ] {
            assert!(
                !matches!(parse(forged), Some(Ours::Resource(_))) || forged == "mcp-context://context/",
                "{forged}"
            );
        }
        // The server part is the server's name as configured, exactly.
        assert_eq!(
            parse("mcp-context://DOCS/fx%3A%2F%2Fdoc%2F0"),
            Some(Ours::Resource(id("DOCS", "fx://doc/0"))),
            "another name is another server (which the gate then does not know)"
        );
    }

    #[test]
    fn templates_keep_their_expressions() {
        assert_eq!(template("s", "fx://user/{id}").as_deref(), Some("mcp-context://s/fx%3A%2F%2Fuser%2F{id}"));
        assert_eq!(template("fs", "file:///{+path}").as_deref(), Some("mcp-context://fs/file%3A%2F%2F%2F{path}"));
        assert_eq!(template("s", "x://a{#f}").as_deref(), Some("mcp-context://s/x%3A%2F%2Fa%23{f}"));
        for t in ["x://{a,b}", "x://{/p}", "x://{?q}", "x://{a:3}", "x://}{a}", "x://{a"] {
            assert_eq!(template("s", t), None, "{t}");
        }
        // A host's expansion of ours names the upstream expansion.
        let ours = template("fs", "file:///{+path}").unwrap().replace("{path}", "docs%2Freadme.txt");
        assert_eq!(parse(&ours), Some(Ours::Resource(id("fs", "file:///docs/readme.txt"))));
    }
}
