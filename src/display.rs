//! Text from outside, shown to people: what MCP servers name (resource
//! URIs, names, descriptions, errors) and what callers send, in the CLI's
//! tables and reports and in the text log lines. Owns the one escaping
//! function all of them use, [`escape`], and what counts as a
//! bidirectional control (`is_bidi_control`, which user names may not
//! hold either).
//!
//! A terminal runs the escape sequences it is sent (ESC `]0;title` BEL sets
//! the window title, others move the cursor or rewrite the screen), a
//! newline starts what reads as a row or log line of its own, and the
//! bidirectional controls (U+202E RIGHT-TO-LEFT OVERRIDE and its kin) make
//! text print in another order than it is. So every character of those
//! kinds is written as a visible escape instead. JSON outputs are not
//! escaped here: serde_json writes control characters as `\u00XX`, and the
//! bytes stay exact for programs.
//!
//! Layer: bottom. Imports nothing of the crate.

use std::borrow::Cow;
use std::fmt::{self, Write as _};

/// Whether `c` is a bidirectional formatting character: U+061C ARABIC
/// LETTER MARK, U+200E/U+200F (LRM, RLM), U+202A–U+202E (the embeddings and
/// overrides) and U+2066–U+2069 (the isolates).
pub(crate) fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Whether [`escape`] writes `c` as an escape: the control characters
/// (C0, DEL, C1), the bidirectional controls, and U+2028/U+2029 (LINE and
/// PARAGRAPH SEPARATOR, which some viewers break lines at).
fn escaped(c: char) -> bool {
    c.is_control() || is_bidi_control(c) || matches!(c, '\u{2028}' | '\u{2029}')
}

/// `text` safe to print on one line of a terminal: `\n`, `\r` and `\t` as
/// those two characters, the other ASCII controls and DEL as `\x1b`-style
/// escapes, C1 controls, bidirectional controls and U+2028/U+2029 as
/// `\u{202e}`-style escapes; everything else as it is (a backslash too: the
/// escapes are for reading, not for parsing back). Borrowed when there is
/// nothing to escape.
pub fn escape(text: &str) -> Cow<'_, str> {
    let Some(first) = text.find(escaped) else { return Cow::Borrowed(text) };
    let mut out = String::with_capacity(text.len() + 16);
    out.push_str(&text[..first]);
    let _ = write_escaped(&mut out, &text[first..]);
    Cow::Owned(out)
}

/// `value`'s `Display` text, escaped as by [`escape`] while it is written
/// (no copy of it is made): for log lines and `format!`.
pub struct Escaped<T>(pub T);

impl<T: fmt::Display> fmt::Display for Escaped<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(EscapingWriter(f), "{}", self.0)
    }
}

/// A `fmt::Write` that escapes what goes through it (each character on its
/// own, so a text written in pieces is escaped as a whole would be).
struct EscapingWriter<'a, W: fmt::Write + ?Sized>(&'a mut W);

impl<W: fmt::Write + ?Sized> fmt::Write for EscapingWriter<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        write_escaped(self.0, s)
    }
}

fn write_escaped<W: fmt::Write + ?Sized>(out: &mut W, text: &str) -> fmt::Result {
    let mut run = 0;
    for (i, c) in text.char_indices() {
        if !escaped(c) {
            continue;
        }
        out.write_str(&text[run..i])?;
        match c {
            '\n' => out.write_str("\\n")?,
            '\r' => out.write_str("\\r")?,
            '\t' => out.write_str("\\t")?,
            c if c.is_ascii() => write!(out, "\\x{:02x}", u32::from(c))?,
            c => write!(out, "\\u{{{:x}}}", u32::from(c))?,
        }
        run = i + c.len_utf8();
    }
    out.write_str(&text[run..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_bidi_become_visible_escapes() {
        assert!(matches!(escape("fx://doc/0 | plain ünïcode"), Cow::Borrowed(_)));
        assert_eq!(escape("a\u{1b}]0;pwned\u{7}b"), "a\\x1b]0;pwned\\x07b");
        assert_eq!(escape("row\n2099\r\tx\u{7f}"), "row\\n2099\\r\\tx\\x7f");
        assert_eq!(escape("csi\u{9b}31m nel\u{85}"), "csi\\u{9b}31m nel\\u{85}");
        assert_eq!(
            escape("txt.\u{202e}exe \u{2066}i\u{2069} \u{200f}\u{61c}"),
            "txt.\\u{202e}exe \\u{2066}i\\u{2069} \\u{200f}\\u{61c}"
        );
        assert_eq!(escape("a\u{2028}b\u{2029}"), "a\\u{2028}b\\u{2029}");
        assert_eq!(escape("back\\slash"), "back\\slash");
        assert_eq!(format!("[{}]", Escaped(format_args!("{}-{}", "x\n", "\u{202e}y"))), "[x\\n-\\u{202e}y]");
    }

    #[test]
    fn bidi_controls_are_exactly_these() {
        let all: Vec<char> = ('\0'..='\u{3000}').filter(|c| is_bidi_control(*c)).collect();
        let expected: Vec<char> =
            "\u{61c}\u{200e}\u{200f}\u{202a}\u{202b}\u{202c}\u{202d}\u{202e}\u{2066}\u{2067}\u{2068}\u{2069}"
                .chars()
                .collect();
        assert_eq!(all, expected);
    }
}
