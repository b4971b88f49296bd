//! JSON with comments and trailing commas (JSONC, as VS Code, Cursor and
//! Gemini CLI write their settings), the format of other hosts' MCP configs.
//!
//! `jsonc-parser` reads the text; this module turns its syntax tree into the
//! located tree YAML gives (`crate::yaml::Node`), so a host's file is checked
//! by the same code as ours and its errors name the same line and column.
//! Only comments and trailing commas are allowed beyond JSON: single quotes,
//! bare keys or missing commas are errors, located.
//!
//! Layer: bottom (a parser for the settings). Imports only `yaml` (the located tree it builds).

use std::borrow::Cow;

use jsonc_parser::ast::{ObjectPropName, Value};
use jsonc_parser::common::Ranged;
use jsonc_parser::{CollectOptions, ParseOptions, parse_to_ast};

use crate::yaml::{Kind, Node, Pos, Problem, pos_of};

/// Parses one JSONC document; `None` when the text holds no value (empty,
/// or only comments).
pub(crate) fn parse(src: &str) -> Result<Option<Node<'_>>, Problem> {
    let options = ParseOptions {
        allow_comments: true,
        allow_trailing_commas: true,
        allow_loose_object_property_names: false,
        allow_missing_commas: false,
        allow_single_quoted_strings: false,
        allow_hexadecimal_numbers: false,
        allow_unary_plus_numbers: false,
        allow_bare_decimal_point_numbers: false,
        allow_non_finite_numbers: false,
        allow_extended_string_escapes: false,
    };
    let parsed = parse_to_ast(src, &CollectOptions::default(), &options).map_err(|e| Problem {
        pos: Some(Pos { line: e.line_display(), column: e.column_display() }),
        message: e.kind().to_string(),
    })?;
    Ok(parsed.value.map(|v| node(src, v)))
}

fn node<'a>(src: &'a str, value: Value<'a>) -> Node<'a> {
    let range = value.range();
    let scalar = |value: Cow<'a, str>, plain: bool| Kind::Scalar { value, plain };
    let kind = match value {
        Value::StringLit(s) => scalar(s.value, false),
        Value::NumberLit(n) => scalar(Cow::Borrowed(n.value), true),
        Value::BooleanLit(b) => scalar(Cow::Borrowed(if b.value { "true" } else { "false" }), true),
        Value::NullKeyword(_) => scalar(Cow::Borrowed("null"), true),
        Value::Array(a) => Kind::Seq(a.elements.into_iter().map(|v| node(src, v)).collect()),
        Value::Object(o) => Kind::Map(
            o.properties
                .into_iter()
                .map(|p| {
                    let (name, range) = match p.name {
                        ObjectPropName::String(s) => (s.value, s.range),
                        ObjectPropName::Word(w) => (Cow::Borrowed(w.value), w.range),
                    };
                    let key = Node {
                        pos: pos_of(src, range.start),
                        start: range.start as u32,
                        end: range.end as u32,
                        kind: scalar(name, false),
                    };
                    (key, node(src, p.value))
                })
                .collect(),
        ),
    };
    Node { pos: pos_of(src, range.start), start: range.start as u32, end: range.end as u32, kind }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_and_trailing_commas_keep_positions() {
        let src =
            "// VS Code\n{\n  /* servers */\n  \"servers\": {\n    \"a\": { \"command\": \"x\", }, // done\n  },\n}\n";
        let root = parse(src).unwrap().unwrap();
        let cmd = root.at(&["servers", "a", "command"]).unwrap();
        assert_eq!(cmd.as_str(), Some("x"));
        assert_eq!(cmd.pos, Pos { line: 5, column: 23 });
        assert_eq!(root.get("servers").and_then(|s| s.key_at("a", 0)).unwrap().pos, Pos { line: 5, column: 5 });
    }

    #[test]
    fn errors_are_located() {
        // Where the comma is missing: right after `1`.
        let e = parse("{\n  \"a\": 1\n  \"b\": 2\n}\n").unwrap_err();
        assert_eq!(e.pos, Some(Pos { line: 2, column: 9 }), "{e:?}");
        assert_eq!(e.message, "Expected comma");
        let e = parse("{\n  \"a\": 'x'\n}\n").unwrap_err();
        assert_eq!(e.pos.map(|p| p.line), Some(2), "{e:?}");
        assert!(parse("// nothing\n").unwrap().is_none());
    }
}
