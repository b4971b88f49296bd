//! The second spelling of a URI that `deny` rules match: scheme and host
//! case-folded ([`canonical_uri`]), for servers that normalise. Used by the
//! policy's matching and named by the gate; imports nothing of this crate.

use std::borrow::Cow;

/// Scheme and host lower-cased, nothing else (percent-encodings stay as
/// they are). Never what is read or what `allow` rules match: only the
/// second spelling `deny` rules are matched against, for servers that
/// normalise (RFC 3986 makes both case-insensitive for the URIs it
/// defines). Borrowed when already canonical.
pub fn canonical_uri(uri: &str) -> Cow<'_, str> {
    canonical(uri, |b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
}

/// The same for a `deny` rule's glob: its scheme may hold glob characters too.
pub(crate) fn canonical_glob(glob: &str) -> Cow<'_, str> {
    canonical(glob, |b| !matches!(b, b'/' | b':' | b'#' | b'?' | b'@'))
}

fn canonical(s: &str, scheme_byte: impl Fn(u8) -> bool) -> Cow<'_, str> {
    let Some(colon) = s.find(':') else { return Cow::Borrowed(s) };
    if colon == 0 || !s.as_bytes()[..colon].iter().all(|b| scheme_byte(*b)) {
        return Cow::Borrowed(s);
    }
    // The host: after `//` and any `user@`, up to the path, query or fragment.
    let host = s[colon + 1..].strip_prefix("//").map(|rest| {
        let start = colon + 3;
        let end = start + rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let host_start = s[start..end].rfind('@').map_or(start, |at| start + at + 1);
        (host_start, end)
    });
    let needs = |r: std::ops::Range<usize>| s.as_bytes()[r].iter().any(u8::is_ascii_uppercase);
    if !needs(0..colon) && host.is_none_or(|(a, b)| !needs(a..b)) {
        return Cow::Borrowed(s);
    }
    let mut out = s.as_bytes().to_vec();
    out[..colon].make_ascii_lowercase();
    if let Some((a, b)) = host {
        out[a..b].make_ascii_lowercase();
    }
    // Only ASCII bytes changed, so this is still UTF-8.
    Cow::Owned(String::from_utf8(out).unwrap_or_else(|_| s.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_lowercases_scheme_and_host_only() {
        assert_eq!(canonical_uri("SECRET://payroll"), "secret://payroll");
        assert_eq!(canonical_uri("Secret://PayRoll/Path/X"), "secret://payroll/Path/X");
        assert_eq!(canonical_uri("HTTP://User@EXAMPLE.com:80/A?B#C"), "http://User@example.com:80/A?B#C");
        assert_eq!(canonical_uri("file:///Docs/A"), "file:///Docs/A");
        assert_eq!(canonical_uri("URN:ISBN:ABC"), "urn:ISBN:ABC");
        assert!(matches!(canonical_uri("demo://docs/guide"), Cow::Borrowed(_)));
        // Not a scheme: left alone.
        assert_eq!(canonical_uri("A/B:C"), "A/B:C");
        assert_eq!(canonical_glob("SECRET://**"), "secret://**");
        assert_eq!(canonical_glob("*://HOST/**"), "*://host/**");
        assert_eq!(canonical_glob("**"), "**");
    }
}
