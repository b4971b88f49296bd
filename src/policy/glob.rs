//! The glob dialect of rule fields (see the parent module's "Globs"): `*`
//! within a segment, `**` anywhere, `?`, classes, escapes and braces; the
//! rewrite of each run of stars for globset, the literal shapes matched
//! without it, the cheap pre-checks ([`Needs`], [`Head`]), and the MIME type
//! normalisation `mime` globs and the types they match share. Its tests
//! include the reference definition (`glob_ref`) the decision property tests
//! judge by.

use std::borrow::Cow;

#[cfg(test)]
use globset::{Candidate, GlobSetBuilder};
use globset::{Glob, GlobBuilder};

use super::canonical_glob;
use crate::error::quote;

/// Most `**` runs one pattern may hold: each doubles the number of globs
/// compiled and tried, and real policies need one or two.
pub(crate) const MAX_RECURSIVE_RUNS: usize = 4;

/// A MIME type's type/subtype, without parameters, trimmed and lower-cased
/// (RFC 2045: both are case-insensitive): `Text/HTML; charset=utf-8` is `text/html`.
pub(super) fn mime_essence(m: &str) -> Cow<'_, str> {
    lower(m.split(';').next().unwrap_or_default().trim())
}

/// A whole MIME type, normalised for rules that name parameters:
/// type/subtype and parameter names lower-cased, blanks around `;` and `=`
/// removed, values and their order kept: `Text/HTML; Charset=UTF-8` is
/// `text/html;charset=UTF-8`.
pub(super) fn mime_with_params(m: &str) -> Cow<'_, str> {
    let mut parts = m.split(';');
    let essence = mime_essence(parts.next().unwrap_or_default());
    let params: Vec<&str> = parts.map(str::trim).filter(|p| !p.is_empty()).collect();
    if params.is_empty() {
        return essence;
    }
    let mut out = essence.into_owned();
    for p in params {
        out.push(';');
        match p.split_once('=') {
            Some((name, value)) => {
                out.push_str(&name.trim().to_ascii_lowercase());
                out.push('=');
                out.push_str(value.trim());
            }
            None => out.push_str(&p.to_ascii_lowercase()),
        }
    }
    Cow::Owned(out)
}

pub(super) fn lower(s: &str) -> Cow<'_, str> {
    if s.bytes().any(|b| b.is_ascii_uppercase()) { Cow::Owned(s.to_ascii_lowercase()) } else { Cow::Borrowed(s) }
}

/// A parsed glob with its source text.
#[derive(Debug, Clone)]
pub(super) struct Pattern {
    pub(super) text: String,
    pub(super) matcher: Matcher,
}

#[derive(Debug, Clone)]
pub(super) enum Matcher {
    /// No glob character: exactly this string.
    Literal(Box<str>, Head),
    /// One run of stars between literals: the string starts with `prefix`,
    /// ends with `suffix`, and what lies between holds no `/` unless `slash`
    /// (the run was `**`). `**` alone is `{ "", "", true }`, `*` alone
    /// `{ "", "", false }`.
    Around { prefix: Box<str>, suffix: Box<str>, slash: bool, head: Head },
    /// Anything else: the globs globset matches (see the module doc for why
    /// there may be several), compiled with the rule set's other globs, and
    /// what any match must contain, checked first (most strings fail it, and
    /// then the set is not run at all).
    Globs(Box<[Glob]>, Needs),
}

/// Necessary conditions for a general glob to match, from its literal runs
/// (the text outside `*`, `?`, classes, braces and escapes): a leading run
/// is a prefix, a trailing run a suffix, the runs between occur in order.
#[derive(Debug, Clone, Default)]
pub(super) struct Needs {
    pub(super) prefix: Box<str>,
    pub(super) suffix: Box<str>,
    pub(super) inner: Box<[Box<str>]>,
}

impl Needs {
    pub(super) fn of(glob: &str) -> Needs {
        let chars: Vec<char> = glob.chars().collect();
        let (mut runs, mut cur, mut i) = (Vec::new(), String::new(), 0);
        let (mut starts_literal, mut ends_literal) = (true, true);
        while i < chars.len() {
            let c = chars[i];
            let meta = matches!(c, '*' | '?' | '[' | '{' | '\\');
            if !meta {
                cur.push(c);
                i += 1;
                ends_literal = true;
                continue;
            }
            if runs.is_empty() && cur.is_empty() {
                starts_literal = false;
            }
            runs.push(std::mem::take(&mut cur));
            ends_literal = false;
            i = match c {
                '\\' => i + 2,
                '[' => {
                    // Byte offsets and char offsets agree on the ASCII prefix class_end reads.
                    let s: String = chars[i..].iter().collect();
                    i + s[..class_end(s.as_bytes(), 0)].chars().count()
                }
                '{' => {
                    let mut depth = 0usize;
                    let mut j = i;
                    while j < chars.len() {
                        match chars[j] {
                            '\\' => j += 1,
                            '{' => depth += 1,
                            '}' => {
                                depth -= 1;
                                if depth == 0 {
                                    break;
                                }
                            }
                            _ => {}
                        }
                        j += 1;
                    }
                    j + 1
                }
                _ => i + 1,
            };
        }
        runs.push(cur);
        let mut runs: Vec<String> = runs;
        let suffix = if ends_literal && runs.len() > 1 { runs.pop().unwrap_or_default() } else { String::new() };
        let prefix = if starts_literal && !runs.is_empty() { runs.remove(0) } else { String::new() };
        let inner = runs.into_iter().filter(|r| !r.is_empty()).map(String::into_boxed_str).collect();
        Needs { prefix: prefix.into(), suffix: suffix.into(), inner }
    }

    pub(super) fn admits(&self, s: &str) -> bool {
        if s.len() < self.prefix.len() + self.suffix.len()
            || (!self.prefix.is_empty() && !s.starts_with(&*self.prefix))
            || (!self.suffix.is_empty() && !s.ends_with(&*self.suffix))
        {
            return false;
        }
        let mut rest = &s.as_bytes()[self.prefix.len()..s.len() - self.suffix.len()];
        for run in self.inner.iter() {
            match memchr::memmem::find(rest, run.as_bytes()) {
                Some(at) => rest = &rest[at + run.len()..],
                None => return false,
            }
        }
        true
    }
}

/// The first 16 bytes of a literal prefix, to reject most strings with two
/// integer comparisons before comparing bytes: a rule set's candidates
/// mostly differ from the string within them (`docs://teams/t3/` against
/// `docs://teams/t7/…`), and a call to compare bytes per candidate was most
/// of the cost of a decision.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Head {
    pub(super) bytes: [u64; 2],
    pub(super) mask: [u64; 2],
}

impl Head {
    pub(super) fn of(prefix: &str) -> Head {
        let mut bytes = [0u8; 16];
        let n = prefix.len().min(16);
        bytes[..n].copy_from_slice(&prefix.as_bytes()[..n]);
        let mut mask = [0u8; 16];
        mask[..n].fill(0xff);
        let word = |b: [u8; 16], i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap_or_default());
        Head { bytes: [word(bytes, 0), word(bytes, 1)], mask: [word(mask, 0), word(mask, 1)] }
    }

    /// The first 16 bytes of `s`, zero-padded (the `bytes` of [`Head::of`]).
    pub(super) fn of_subject(s: &str) -> [u64; 2] {
        Head::of(s).bytes
    }

    /// False when `s` (given by its [`Head::of_subject`]) cannot start with the prefix.
    pub(super) fn admits(&self, s: [u64; 2]) -> bool {
        s[0] & self.mask[0] == self.bytes[0] && s[1] & self.mask[1] == self.bytes[1]
    }
}

impl Matcher {
    /// For `Literal` and `Around`; `Globs` need their rule set.
    #[cfg(test)]
    pub(super) fn is_simple_match(&self, s: &str) -> bool {
        self.is_simple_match_at(s, Head::of_subject(s))
    }

    /// [`Matcher::is_simple_match`] with the string's head computed once.
    pub(super) fn is_simple_match_at(&self, s: &str, head: [u64; 2]) -> bool {
        match self {
            Matcher::Literal(l, h) => h.admits(head) && **l == *s,
            Matcher::Around { prefix, suffix, slash, head: h } => {
                // A prefix of up to 16 bytes is all in its head; an empty
                // suffix needs no comparison (each is a call to memcmp).
                h.admits(head)
                    && s.len() >= prefix.len() + suffix.len()
                    && (prefix.len() <= 16 || s.starts_with(&**prefix))
                    && (suffix.is_empty() || s.ends_with(&**suffix))
                    && (*slash || !s.as_bytes()[prefix.len()..s.len() - suffix.len()].contains(&b'/'))
            }
            Matcher::Globs(..) => false,
        }
    }
}

impl Pattern {
    pub(super) fn any() -> Self {
        let matcher = Matcher::Around { prefix: "".into(), suffix: "".into(), slash: true, head: Head::default() };
        Pattern { text: "**".into(), matcher }
    }

    /// `*`, the default `server`.
    pub(super) fn no_slash() -> Self {
        let matcher = Matcher::Around { prefix: "".into(), suffix: "".into(), slash: false, head: Head::default() };
        Pattern { text: "*".into(), matcher }
    }

    pub(super) fn compile(text: &str) -> std::result::Result<Self, String> {
        Self::compile_as(text, text)
    }

    /// A `uri` glob with its scheme and host lower-cased (`SECRET://**` is
    /// `secret://**`), shown as written; `None` when that changes nothing.
    /// A `deny` rule matches with it too, against URIs with their scheme and
    /// host lower-cased, so that a server that normalises cannot read what
    /// a differently spelled request named.
    pub(super) fn compile_folded_uri(text: &str) -> std::result::Result<Option<Self>, String> {
        match canonical_glob(text) {
            Cow::Borrowed(_) => Ok(None),
            Cow::Owned(folded) => Self::compile_as(text, &folded).map(Some),
        }
    }

    /// A `mime` glob: matched case-insensitively, so lower-cased, and
    /// normalised like the MIME types it is matched against (see
    /// [`mime_with_params`]).
    pub(super) fn compile_mime(text: &str) -> std::result::Result<Self, String> {
        Self::compile_as(text, &mime_with_params(text))
    }

    /// Compiles `glob`, shown to people as `text`.
    pub(super) fn compile_as(text_shown: &str, text: &str) -> std::result::Result<Self, String> {
        let pieces = split_star_runs(text);
        let runs = pieces.len() - 1;
        if runs > MAX_RECURSIVE_RUNS {
            return Err(format!(
                "glob {} has {runs} `**`; at most {MAX_RECURSIVE_RUNS} are allowed (split it into several rules)",
                quote(text)
            ));
        }
        let matcher = match simple_shape(text) {
            Some(m) => m,
            None => {
                let mut globs = Vec::with_capacity(1 << runs);
                for mask in 0..(1usize << runs) {
                    // `pieces` is never empty: split_star_runs always pushes the tail.
                    let mut glob = String::from(pieces[0]);
                    for (i, piece) in pieces[1..].iter().enumerate() {
                        glob.push_str(if mask & (1 << i) == 0 { "*" } else { "*/**/*" });
                        glob.push_str(piece);
                    }
                    let compiled = GlobBuilder::new(&glob)
                        .literal_separator(true)
                        .backslash_escape(true)
                        .build()
                        .map_err(|e| {
                            let kind = e.kind().to_string();
                            format!(
                                "invalid glob {}: {kind} (write `\\[`, `\\*`, `\\?`, `\\{{` for literal characters)",
                                quote(text)
                            )
                        })?;
                    globs.push(compiled);
                }
                Matcher::Globs(globs.into(), Needs::of(text))
            }
        };
        Ok(Pattern { text: text_shown.to_owned(), matcher })
    }

    /// Matches one string, building a one-pattern set for general globs:
    /// the glob dialect's tests; rules match through their [`RuleSet`].
    #[cfg(test)]
    pub(super) fn is_match(&self, s: &str) -> bool {
        match &self.matcher {
            Matcher::Globs(globs, _) => {
                let mut b = GlobSetBuilder::new();
                globs.iter().for_each(|g| {
                    b.add(g.clone());
                });
                b.build().unwrap().is_match_candidate(&Candidate::from_bytes(s.as_bytes()))
            }
            m => m.is_simple_match(s),
        }
    }
}

/// `x`, `x*y` or `x**y` with `x` and `y` free of glob characters: matched
/// without globset. Every other glob (`?`, classes, braces, escapes, two
/// runs of stars) is `None`.
pub(super) fn simple_shape(p: &str) -> Option<Matcher> {
    if p.bytes().any(|b| matches!(b, b'?' | b'[' | b']' | b'{' | b'}' | b'\\')) {
        return None;
    }
    let Some(start) = p.find('*') else {
        return Some(Matcher::Literal(p.into(), Head::of(p)));
    };
    let run = p[start..].bytes().take_while(|&b| b == b'*').count();
    let suffix = &p[start + run..];
    if suffix.contains('*') {
        return None;
    }
    let prefix = &p[..start];
    Some(Matcher::Around { prefix: prefix.into(), suffix: suffix.into(), slash: run >= 2, head: Head::of(prefix) })
}

/// Splits `p` at every run of two or more unescaped `*` outside a `[...]`
/// class, returning the pieces between runs. All the bytes looked at are
/// ASCII, so the slice indices always fall on char boundaries.
pub(super) fn split_star_runs(p: &str) -> Vec<&str> {
    let b = p.as_bytes();
    let (mut pieces, mut start, mut i) = (Vec::new(), 0, 0);
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'[' => i = class_end(b, i),
            b'*' => {
                let run = b[i..].iter().take_while(|&&c| c == b'*').count();
                if run >= 2 {
                    pieces.push(&p[start..i]);
                    start = i + run;
                }
                i += run;
            }
            _ => i += 1,
        }
    }
    pieces.push(&p[start..]);
    pieces
}

/// Index just past the `]` closing the class opened at `open`, following
/// globset's rules (`]` first is literal; `[:name:]` is a POSIX class);
/// `b.len()` for an unclosed class, which globset then rejects.
pub(super) fn class_end(b: &[u8], open: usize) -> usize {
    let mut i = open + 1;
    if matches!(b.get(i), Some(b'!' | b'^')) {
        i += 1;
    }
    if b.get(i) == Some(&b']') {
        i += 1;
    }
    while i < b.len() {
        match b[i] {
            b']' => return i + 1,
            b'[' if b.get(i + 1) == Some(&b':') => {
                let name_len = b[i + 2..].iter().take_while(|c| c.is_ascii_lowercase()).count();
                let end = i + 2 + name_len;
                i = if b.get(end..end + 2) == Some(b":]") { end + 2 } else { i + 1 };
            }
            _ => i += 1,
        }
    }
    b.len()
}

#[cfg(test)]
/// The glob definition, written the slow obvious way.
pub(super) fn glob_ref(p: &[char], s: &[char]) -> bool {
    match p.first() {
        None => s.is_empty(),
        Some('*') => {
            let run = p.iter().take_while(|c| **c == '*').count();
            let rest = &p[run..];
            (0..=s.len()).take_while(|&i| run >= 2 || i == 0 || s[i - 1] != '/').any(|i| glob_ref(rest, &s[i..]))
        }
        Some('?') => !s.is_empty() && s[0] != '/' && glob_ref(&p[1..], &s[1..]),
        Some('[') => {
            let end = p.iter().position(|c| *c == ']').unwrap();
            let (neg, set) = match p[1] {
                '!' => (true, &p[2..end]),
                _ => (false, &p[1..end]),
            };
            !s.is_empty() && s[0] != '/' && set.contains(&s[0]) != neg && glob_ref(&p[end + 1..], &s[1..])
        }
        Some(c) => s.first() == Some(c) && glob_ref(&p[1..], &s[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, s: &str) -> bool {
        Pattern::compile(pattern).unwrap_or_else(|e| panic!("{e}")).is_match(s)
    }

    // ---- glob semantics ---------------------------------------------------

    #[test]
    fn star_stays_within_a_segment() {
        assert!(m("demo://*", "demo://a"));
        assert!(m("demo://*", "demo://"));
        assert!(!m("demo://*", "demo://a/b"));
        assert!(m("*.png", "logo.png"));
        assert!(!m("*.png", "img/logo.png"));
        assert!(m("*", "demo"));
        assert!(!m("*", "a/b"));
        assert!(m("image/*", "image/png"));
        assert!(!m("image/*", "image/png/x"));
    }

    #[test]
    fn double_star_crosses_slashes_anywhere() {
        assert!(m("**", ""));
        assert!(m("**", "a/b/c"));
        assert!(m("demo://public/**", "demo://public/a/b"));
        assert!(m("demo://public/**", "demo://public/faq"));
        assert!(!m("demo://public/**", "demo://publicity"));
        assert!(m("secret://**", "secret://payroll/2026"));
        assert!(!m("secret://**", "secrets://x"));
        // In the middle: any run including `/`, possibly empty.
        assert!(m("a/**/b", "a/x/b"));
        assert!(m("a/**/b", "a/x/y/b"));
        assert!(m("a/**/b", "a//b"));
        assert!(!m("a/**/b", "a/x/c"));
        // globset would match these zero-segment cases; the spec says `**` is a
        // run between the literal slashes, so both slashes must be there.
        assert!(!m("a/**/b", "a/b"));
        assert!(!m("**/foo", "foo"));
        assert!(m("**/foo", "/foo"));
        assert!(m("**/foo", "x/y/foo"));
    }

    #[test]
    fn double_star_not_next_to_a_slash_still_crosses() {
        // globset treats these as `*`; the spec wins.
        assert!(m("x**", "x/a/b"));
        assert!(m("x**", "x"));
        assert!(m("**x", "a/b/x"));
        assert!(m("a**b", "a/c/d/b"));
        assert!(m("a**b", "ab"));
        assert!(!m("a**b", "a/c/d/bc"));
        assert!(m("secret:**", "secret://payroll/2026"));
        assert!(m("***", "a/b"));
        assert!(m("a***b", "a/x/b"));
        assert!(m("**a**", "x/y/a/z/w"));
        assert!(!m("**a**", "x/y/z"));
        assert!(m("d*/**/*x", "dm/a/b/cx"));
        assert!(m("{a,b}**", "b/c/d"));
    }

    #[test]
    fn question_mark_and_classes() {
        assert!(m("a?c", "abc"));
        assert!(!m("a?c", "ac"));
        assert!(!m("a?c", "abbc"));
        assert!(!m("a?c", "a/c"), "`?` does not match `/`");
        assert!(!m("a?c", "aéc"), "`?` is one byte, so one ASCII character");
        assert!(m("[ab]x", "ax"));
        assert!(m("[ab]x", "bx"));
        assert!(!m("[ab]x", "cx"));
        assert!(m("[a-c]x", "bx"));
        assert!(m("[!a]x", "bx"));
        assert!(!m("[!a]x", "ax"));
        assert!(!m("[!a]x", "/x"));
        // Stars inside a class are literal, not `**`.
        assert!(m("[*]x", "*x"));
        assert!(m("[**]**", "*/a/b"));
        assert!(!m("[**]**", "a/b"));
        assert!(m("[[:digit:]]**", "7/a"));
    }

    #[test]
    fn case_sensitive_whole_string_and_escapes() {
        assert!(!m("demo://*", "Demo://a"));
        assert!(!m("Image/*", "image/png"));
        assert!(!m("demo", "demo2"));
        assert!(!m("demo", "xdemo"));
        assert!(!m("demo://a", "demo://a/b"));
        assert!(m(r"a\*b", "a*b"));
        assert!(!m(r"a\*b", "axb"));
        assert!(m(r"a\*\*b", "a**b"));
        assert!(!m(r"a\*\*b", "a/b"));
        assert!(m(r"u/\{user\}", "u/{user}"));
    }

    #[test]
    fn bad_globs_are_rejected() {
        for bad in ["[abc", "a\\", "a/**/**/**/**/**"] {
            assert!(Pattern::compile(bad).is_err(), "{bad}");
        }
        assert!(Pattern::compile("a/**/**/**/**").is_ok());
    }

    proptest::proptest! {
        /// The dialect (rewrite to globset, literal shapes, pre-checks)
        /// against its definition, pattern by pattern.
        #[test]
        fn globs_agree_with_the_reference_definition(
            tokens in proptest::collection::vec(
                proptest::sample::select(&["a", "b", "/", "*", "**", "***", "?", "[ab]", "[!a]"][..]), 0..7),
            subjects in proptest::collection::vec("[ab/]{0,7}", 1..12),
        ) {
            let pattern: String = tokens.concat();
            if split_star_runs(&pattern).len() - 1 > MAX_RECURSIVE_RUNS {
                return Ok(());
            }
            let compiled = Pattern::compile(&pattern).map_err(proptest::test_runner::TestCaseError::fail)?;
            let p: Vec<char> = pattern.chars().collect();
            for s in subjects {
                let want = glob_ref(&p, &s.chars().collect::<Vec<_>>());
                proptest::prop_assert_eq!(compiled.is_match(&s), want, "{} on {}", pattern, s);
            }
        }
    }
}
