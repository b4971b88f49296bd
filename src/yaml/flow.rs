//! The first flow collection closed by the wrong bracket (`["a" }`), found
//! by a small scan of the text, for the syntax error of a text saphyr
//! refused: saphyr's scanner reads ahead past such a bracket (a scalar
//! might be a key) and reports what it met later (`7:1: invalid
//! indentation`), where libyaml said where the fault is (`expected ',' or
//! ']', but got '}'`). Only called on a text already refused, and only
//! believed when it points before saphyr's error. Imports nothing but
//! [`Pos`].

use super::Pos;

/// Where the first closing bracket that does not match the open flow
/// collection is, up to the character at byte `end`, and what was expected instead.
pub(super) fn mismatch(src: &str, end: usize) -> Option<(Pos, String)> {
    // The character at `end` included: saphyr may stop at the bracket itself.
    let end = src.get(end..).and_then(|r| r.chars().next()).map_or(end, |c| end + c.len_utf8());
    let text = src.get(..end).unwrap_or(src);
    let mut open: Vec<(char, Pos)> = Vec::new();
    let (mut line, mut column) = (1usize, 0usize);
    // Before the first non-blank of the line, and that line's indentation.
    let (mut line_start, mut indent) = (true, 0usize);
    // Lines more indented than this belong to a block scalar (`|`, `>`).
    let mut block_scalar: Option<usize> = None;
    let mut prev = '\n';
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\n' {
            (line, column, line_start, indent, prev) = (line + 1, 0, true, 0, '\n');
            continue;
        }
        column += 1;
        if line_start {
            if c == ' ' {
                indent += 1;
                continue;
            }
            line_start = false;
            match block_scalar {
                Some(at) if indent > at && open.is_empty() => {
                    skip_line(&mut chars, &mut column);
                    continue;
                }
                _ => block_scalar = None,
            }
        }
        let value_start = prev.is_whitespace() || (!open.is_empty() && "[{,".contains(prev));
        let pos = Pos { line, column };
        match c {
            '#' if prev.is_whitespace() => skip_line(&mut chars, &mut column),
            '"' | '\'' if value_start => {
                let closed = skip_quoted(&mut chars, c, &mut line, &mut column);
                if !closed {
                    return None;
                }
            }
            '|' | '>' if open.is_empty() && value_start => block_scalar = Some(indent),
            '[' | '{' if !open.is_empty() || value_start => open.push((c, pos)),
            ']' | '}' if !open.is_empty() => {
                let (opener, at) = open.pop().expect("not empty");
                let wanted = if opener == '[' { ']' } else { '}' };
                if c != wanted {
                    let what = if opener == '[' { "sequence" } else { "mapping" };
                    return Some((
                        pos,
                        format!(
                            "expected ',' or '{wanted}', but got '{c}', while parsing a flow {what} at line {} column {}",
                            at.line, at.column
                        ),
                    ));
                }
            }
            _ => {}
        }
        prev = c;
    }
    None
}

fn skip_line(chars: &mut std::iter::Peekable<std::str::Chars<'_>>, column: &mut usize) {
    while chars.next_if(|&c| c != '\n').is_some() {
        *column += 1;
    }
}

/// Skips a quoted scalar after its opening quote; `false` when it does not end.
fn skip_quoted(
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
    quote: char,
    line: &mut usize,
    column: &mut usize,
) -> bool {
    while let Some(c) = chars.next() {
        *column += 1;
        match c {
            '\n' => (*line, *column) = (*line + 1, 0),
            '\\' if quote == '"' => {
                let escaped = chars.next_if(|&c| c != '\n');
                *column += usize::from(escaped.is_some());
            }
            '\'' if quote == '\'' && chars.peek() == Some(&'\'') => {
                chars.next();
                *column += 1;
            }
            c if c == quote => return true,
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flow_sequence_closed_by_a_brace_is_found_where_it_is() {
        let src = "roles:\n  r:\n    allow:\n      - { server: a, uri: \"x\" }\n\n      - { server: acc, uri: [\"acc://public/**\" }\n    deny: []\n";
        let (pos, message) = mismatch(src, src.len()).unwrap();
        assert_eq!((pos.line, pos.column), (6, 48));
        assert!(message.starts_with("expected ',' or ']', but got '}', while parsing a flow sequence at line 6"));
    }

    #[test]
    fn brackets_in_quotes_comments_block_scalars_and_plain_words_are_not_flow() {
        for src in [
            "a: \"[}\"\nb: '{]'\n",
            "a: x # [}\n",
            "a: |\n  [ } ]\nb: [1, {c: d}]\n",
            "a: f[0]}\n",
            "a: ['it''s', \"q\\\"]\"]\n",
        ] {
            assert_eq!(mismatch(src, src.len()), None, "{src}");
        }
        assert!(mismatch("a: {b: [1}\n", 11).is_some());
    }
}
