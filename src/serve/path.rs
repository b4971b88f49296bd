//! The request path as the proxy decides on it, and the upstream URL built
//! from it. Owns the refusals of paths that a server could read as another
//! (dot segments plain or encoded, encoded `/` `\` `%`, backslashes, empty
//! segments, characters outside a small safe set) and the rule that an
//! upstream URL always stays under the configured base path, with the base's
//! own query (`?api-version=…`) kept as a query. Imports nothing of ours but
//! the error shape.
//!
//! Every route is decided on [`Canonical`]: the path is percent-decoded once,
//! and a path whose decoding could differ at the upstream (anything encoded
//! that is not a plain safe character) is refused with 400 before routing.
//! The upstream then receives the decoded segments, each made of safe
//! characters only, so what we decided on is byte for byte what it reads.

use reqwest::Url;

use super::error::ApiError;

/// A checked request path: its segments, decoded, each non-empty and made of
/// [`is_safe`] characters only, none `.` or `..`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Canonical {
    segments: Vec<String>,
}

impl Canonical {
    /// Checks a raw request path (without its query).
    pub(super) fn parse(raw: &str) -> Result<Canonical, ApiError> {
        let refuse = |why: &str| {
            ApiError::bad_request("invalid_path", format!("The request path is refused: {why}; send the plain path"))
        };
        let Some(rest) = raw.strip_prefix('/') else { return Err(refuse("it does not start with `/`")) };
        if rest.is_empty() {
            return Ok(Canonical { segments: Vec::new() });
        }
        let mut segments = Vec::new();
        for raw_segment in rest.split('/') {
            if raw_segment.is_empty() {
                return Err(refuse("it has an empty segment (`//` or a trailing `/`)"));
            }
            let mut segment = String::with_capacity(raw_segment.len());
            let bytes = raw_segment.as_bytes();
            let mut i = 0;
            while i < bytes.len() {
                let c = bytes[i];
                if c == b'%' {
                    let decoded = bytes
                        .get(i + 1..i + 3)
                        .and_then(|h| std::str::from_utf8(h).ok())
                        .and_then(|h| u8::from_str_radix(h, 16).ok())
                        .ok_or_else(|| refuse("it has a malformed percent-encoding"))?;
                    // An encoded `.`, `/`, `\` or `%` (double encoding) reads
                    // differently after another decoding: never accepted.
                    if !is_safe(decoded) || decoded == b'.' {
                        return Err(refuse("it has an encoded `.`, `/`, `\\`, `%` or control character"));
                    }
                    segment.push(decoded as char);
                    i += 3;
                } else if c == b'\\' {
                    return Err(refuse("it has a backslash"));
                } else if is_safe(c) {
                    segment.push(c as char);
                    i += 1;
                } else {
                    return Err(refuse("it has a character outside letters, digits and `-._~:@!$'()*+,=`"));
                }
            }
            if segment == "." || segment == ".." {
                return Err(refuse("it has a `.` or `..` segment"));
            }
            segments.push(segment);
        }
        Ok(Canonical { segments })
    }

    /// The decoded segments.
    pub(super) fn segments(&self) -> Vec<&str> {
        self.segments.iter().map(String::as_str).collect()
    }

    /// The decoded path, `/a/b`.
    pub(super) fn as_path(&self) -> String {
        let mut s = String::new();
        for seg in &self.segments {
            s.push('/');
            s.push_str(seg);
        }
        if s.is_empty() {
            s.push('/');
        }
        s
    }
}

/// Characters a path segment may hold (RFC 3986 unreserved and sub-delims,
/// `:` and `@`), decoded or not. No `/`, `\`, `%`, `?`, `#`, spaces, quotes,
/// control or non-ASCII bytes.
fn is_safe(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"-._~:@!$'()*+,=".contains(&c)
}

/// The upstream base, parsed once: scheme, host, base path and its query.
#[derive(Debug, Clone)]
pub(super) struct Base {
    url: Url,
}

impl Base {
    /// `http(s)://host[:port]/base/path[?query]`; a fragment or credentials
    /// in the URL are refused (they would not be sent as written).
    pub(super) fn parse(text: &str) -> crate::Result<Base> {
        let url =
            Url::parse(text).map_err(|e| crate::Error::serve(format!("the upstream URL cannot be parsed: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
            return Err(crate::Error::serve("the upstream URL must be http:// or https:// with a host"));
        }
        if url.fragment().is_some() {
            return Err(crate::Error::serve("the upstream URL must not have a `#fragment`"));
        }
        Ok(Base { url })
    }

    /// The URL for `path` (segments below the base, e.g. `chat/completions`)
    /// and the caller's query, if any: the base path, then each segment
    /// (already checked, so percent-encoding changes none), then the base's
    /// query followed by the caller's. No segment can climb out of the base.
    pub(super) fn join(&self, path: &[&str], query: Option<&str>) -> Url {
        let mut url = self.url.clone();
        {
            // A URL with a host always has path segments.
            let mut segs = url.path_segments_mut().expect("an http URL has a path");
            segs.pop_if_empty();
            segs.extend(path);
        }
        let caller = query.filter(|q| !q.is_empty());
        match (self.url.query().filter(|q| !q.is_empty()), caller) {
            (Some(b), Some(c)) => url.set_query(Some(&format!("{b}&{c}"))),
            (None, Some(c)) => url.set_query(Some(c)),
            _ => {}
        }
        url
    }

    /// The base path's segments, for the check that a joined URL stays below it.
    #[cfg(test)]
    fn prefix(&self) -> String {
        self.url.path().trim_end_matches('/').to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(p: &str) -> Vec<String> {
        Canonical::parse(p).unwrap_or_else(|e| panic!("{p}: {}", e.message)).segments
    }

    #[test]
    fn plain_paths_and_safe_encodings_decode() {
        assert_eq!(ok("/v1/chat/completions"), ["v1", "chat", "completions"]);
        assert_eq!(ok("/v1/models/ft:gpt-4o:org::x1"), ["v1", "models", "ft:gpt-4o:org::x1"]);
        assert_eq!(ok("/v1/mod%65ls"), ["v1", "models"]);
        assert_eq!(ok("/"), Vec::<String>::new());
    }

    #[test]
    fn every_spelling_a_server_could_read_otherwise_is_refused() {
        for p in [
            "/v1/../v2",
            "/v1/./chat",
            "/v1/%2e%2e/x",
            "/v1/%2E%2E/x",
            "/v1/.%2e/x",
            "/v1/%2e/x",
            "/v1/%252e%252e/x",
            "/v1/a%2fb",
            "/v1/a%2Fb",
            "/v1/a%5cb",
            "/v1/a\\b",
            "/v1/a%00b",
            "/v1//chat",
            "/v1/chat/",
            "/v1/a%zz",
            "/v1/a%2",
            "/v1/a b",
            "/v1/chat/completions;x",
            "/v1/caf%C3%A9",
            "v1/chat",
        ] {
            assert!(Canonical::parse(p).is_err(), "{p} was accepted");
        }
    }

    #[test]
    fn joined_urls_stay_under_the_base_and_keep_its_query() {
        let b = Base::parse("http://h:1/gateway/tenant-a/v1").unwrap();
        assert_eq!(b.join(&["files"], None).as_str(), "http://h:1/gateway/tenant-a/v1/files");
        let b = Base::parse("https://x.openai.azure.com/openai/deployments/d?api-version=2024-10-21").unwrap();
        assert_eq!(
            b.join(&["chat", "completions"], Some("a=1")).as_str(),
            "https://x.openai.azure.com/openai/deployments/d/chat/completions?api-version=2024-10-21&a=1"
        );
        assert_eq!(b.join(&["models"], None).query(), Some("api-version=2024-10-21"));
        let b = Base::parse("http://h/").unwrap();
        assert_eq!(b.join(&["models"], None).as_str(), "http://h/models");
        assert!(Base::parse("http://h/v1#x").is_err());
        assert!(Base::parse("ftp://h/v1").is_err());
    }

    proptest::proptest! {
        /// Whatever the caller sends, an accepted path joins to a URL whose
        /// path starts with the base path and has exactly its segments after it.
        #[test]
        fn no_accepted_path_leaves_the_base(raw in "(/([a-z.%2eEfF5cC\\\\]{0,4}|\\.\\.|%2e%2e|%252e)){1,5}") {
            let base = Base::parse("http://h/gateway/tenant-a/v1").unwrap();
            if let Ok(c) = Canonical::parse(&raw) {
                let url = base.join(&c.segments(), None);
                let path = url.path();
                if c.segments().is_empty() {
                    proptest::prop_assert_eq!(path, base.prefix());
                    return Ok(());
                }
                proptest::prop_assert!(path.starts_with(&format!("{}/", base.prefix())), "{raw} -> {path}");
                let below = &path[base.prefix().len()..];
                proptest::prop_assert_eq!(below, c.as_path());
            }
        }
    }
}
