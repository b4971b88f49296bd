//! The YAML layer's tests: positions, scalars, and a fuzz over random bytes.

use super::*;
use proptest::prelude::*;

/// What a config or policy file could hold, for the fuzz below.
#[derive(Debug, serde::Deserialize)]
#[allow(dead_code, reason = "only deserialized")]
struct Anything {
    #[serde(default)]
    a: Lenient<OrderedMap<Lenient<Vec<String>>>>,
    #[serde(default)]
    b: Option<Lenient<u64>>,
    #[serde(default)]
    c: Option<Lenient<bool>>,
}

impl Named for Vec<String> {
    const NOUN: &'static str = "list";
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Any bytes (as text) are parsed and deserialized without a panic,
    /// and every problem is located inside the text.
    #[test]
    fn any_text_is_parsed_or_refused_never_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let text = String::from_utf8_lossy(&bytes);
        check(&text);
    }

    /// Text made of YAML's own punctuation, the likeliest to reach odd
    /// parser states (flow collections, anchors, tags, block scalars).
    #[test]
    fn yaml_punctuation_never_panics(text in "([-:?,\\[\\]{}&*!|>'\"#%@` \n\t]|a|b|1|~){0,80}") {
        check(&text);
    }
}

fn check(text: &str) {
    // Lines as YAML counts them (and libyaml did): `\r\n`, a lone `\r` or `\n` ends one.
    let lines = text.replace("\r\n", "\n").split(['\n', '\r']).count();
    match parse(text) {
        Err(p) => {
            if let Some(pos) = p.pos {
                assert!(pos.line >= 1 && pos.line <= lines + 1, "{pos:?} outside {lines} lines: {text:?}");
            }
        }
        Ok(None) => {}
        Ok(Some(root)) => {
            let problems = Problems::default();
            let _ = from_node::<Anything>(&root, &problems);
            let all = Problems::default();
            let _ = from_node_all::<Anything>(&root, &all);
            for p in problems.into_vec().into_iter().chain(all.into_vec()) {
                let pos = p.pos.expect("a deserialization problem is located");
                assert!(pos.line >= 1 && pos.line <= lines + 1, "{pos:?} outside {lines} lines: {text:?}");
            }
        }
    }
}

#[test]
fn positions_come_from_the_parser_in_block_and_flow_style() {
    let root = parse("a:\n  b: [x, \"y\"]\nc: {d: 1, e: {f: g}}\n").unwrap().unwrap();
    assert_eq!(root.at(&["a", "b"]).unwrap().items()[1].pos, Pos { line: 2, column: 10 });
    assert_eq!(root.at(&["c", "e", "f"]).unwrap().pos, Pos { line: 3, column: 18 });
    assert_eq!(root.key_at("c", 0).unwrap().pos, Pos { line: 3, column: 1 });
    assert!(parse("# only a comment\n").unwrap().is_none());
}

#[test]
fn syntax_errors_and_aliases() {
    let e = parse("a: [1,\nb: 2\n").unwrap_err();
    assert!(e.pos.is_some() && e.message.contains("flow sequence"), "{e:?}");
    let e = parse("a: *nope\n").unwrap_err();
    assert!(e.message.contains("unknown anchor"), "{e:?}");
    let root = parse("a: &x [1, 2]\nb: *x\n").unwrap().unwrap();
    assert_eq!(root.get("b").unwrap().items().len(), 2);
    assert!(parse("a: 1\n---\nb: 2\n").unwrap_err().message.contains("more than one"));
    let bomb = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n";
    assert!(parse(bomb).unwrap_err().message.contains("too many"));
}

#[test]
fn byte_offsets_columns_in_characters_depth_tags_and_control_characters() {
    let src = "é: [ü, \"ñ x\"]\nb: |\n  z\n";
    let root = parse(src).unwrap().unwrap();
    let items = root.get("é").unwrap().items();
    assert_eq!(items[1].pos, Pos { line: 1, column: 8 });
    assert_eq!(&src[items[0].start as usize..items[0].end as usize], "ü");
    assert_eq!(&src[items[1].start as usize..items[1].end as usize], "\"ñ x\"");
    assert!(matches!(items[1].kind, Kind::Scalar { value: Cow::Borrowed("ñ x"), plain: false }));
    assert_eq!(root.get("b").unwrap().as_str(), Some("z\n"));
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let e = parse(&deep).unwrap_err();
    // saphyr refuses flow nesting past 255 while it scans ahead; other nesting stops at MAX_DEPTH.
    assert!(e.message.contains("nested more than") || e.message.contains("recursion limit"), "{e:?}");
    let deep: String = (0..200).map(|i| format!("{}- \n", "  ".repeat(i))).collect();
    assert!(parse(&deep).unwrap_err().message.contains("nested more than 128"));
    assert!(parse("a: !x 1\n").unwrap_err().message.contains("tags"));
    assert_eq!(parse("a: 1\nb: \u{7}\n").unwrap_err().pos, Some(Pos { line: 2, column: 4 }));
    let e = parse("a: &x [*x]\n").unwrap_err();
    assert!(e.message.contains("unknown anchor `x`") && e.pos == Some(Pos { line: 1, column: 8 }), "{e:?}");
    let e = parse("a: *nope\n").unwrap_err();
    assert!(e.message.contains("`nope`") && e.pos == Some(Pos { line: 1, column: 4 }), "{e:?}");
}

#[derive(serde::Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Thing {
    n: Option<u64>,
    s: Option<String>,
    b: Option<bool>,
}

impl Named for Thing {
    const NOUN: &'static str = "thing";
}

#[test]
fn scalars_resolve_like_yaml_serde_and_every_error_is_located() {
    let t: OrderedMap<Thing> = from_str("x: { n: 0x10, s: 12, b: true }\ny: {}\n").unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(t.0[0].1.n, Some(16));
    assert_eq!(t.0[0].1.s.as_deref(), Some("12"));
    assert_eq!(t.0[0].1.b, Some(true));
    assert!(from_str::<OrderedMap<Thing>>("x: {}\ny: { n: \"5\" }\n").unwrap_err().message.contains("invalid type"));

    // Lenient parts: both bad things are reported, each where it is.
    let root = parse("x: { n: lots }\ny: { m: 1 }\nx: {}\n").unwrap().unwrap();
    let problems = Problems::default();
    let all: Result<OrderedMap<Lenient<Thing>>, _> = from_node(&root, &problems);
    let problems = problems.into_vec();
    let at: Vec<(usize, usize)> = problems.iter().map(|p| p.pos.map_or((0, 0), |p| (p.line, p.column))).collect();
    assert_eq!(at, [(1, 9), (2, 6), (3, 1)], "{problems:?}");
    assert!(problems[2].message.contains("thing `x` is defined twice"), "{problems:?}");
    assert!(all.is_err());
}

#[derive(serde::Deserialize, Debug)]
#[serde(deny_unknown_fields)]
#[allow(dead_code, reason = "only deserialized")]
struct Section {
    a: Option<u64>,
    b: Option<bool>,
    need: String,
    list: Option<Vec<u64>>,
    inner: Option<Thing>,
}

/// Past a struct's first bad field: every bad field of one section is
/// reported, each where it is, once; a field missing only because its bad
/// entry was skipped is no problem, a field missing in the text is.
#[test]
fn every_bad_field_of_a_struct_is_reported_not_only_the_first() {
    let src = "a: x\ncolour: red\nb: maybe\nneed: ok\nlist: [1, two, 3]\ninner: { n: z, s: fine, extra: 1 }\n";
    let root = parse(src).unwrap().unwrap();
    // One pass stops at the first.
    let once = Problems::default();
    assert!(from_node::<Section>(&root, &once).is_err());
    assert_eq!(once.into_vec().len(), 1);
    let problems = Problems::default();
    let _ = from_node_all::<Section>(&root, &problems);
    let problems = problems.into_vec();
    let at: Vec<(usize, usize)> = problems.iter().map(|p| p.pos.map_or((0, 0), |p| (p.line, p.column))).collect();
    assert_eq!(at, [(1, 4), (2, 1), (3, 4), (5, 11), (6, 13), (6, 25)], "{problems:?}");
    assert!(problems[1].message.contains("unknown field `colour`"), "{problems:?}");
    assert!(problems.iter().all(|p| !p.message.contains("missing")), "{problems:?}");
    // `need` skipped for its bad value: no "missing field"; absent from the text: one.
    let root = parse("need: [x]\n").unwrap().unwrap();
    let problems = Problems::default();
    let _ = from_node_all::<Section>(&root, &problems);
    assert_eq!(problems.into_vec().len(), 1);
    let root = parse("a: 1\n").unwrap().unwrap();
    let problems = Problems::default();
    let _ = from_node_all::<Section>(&root, &problems);
    let problems = problems.into_vec();
    assert!(problems.len() == 1 && problems[0].message.contains("missing field `need`"), "{problems:?}");
}

/// The flow check: the fixture is reported on its line, at the brace.
#[test]
fn a_wrong_closing_bracket_is_reported_where_it_is() {
    let src = "roles:\n  staff:\n    allow:\n      - { server: acc, uri: \"acc://x\" }\n\n      - { server: acc, uri: [\"acc://public/**\" }\n  other:\n    allow: []\n";
    let e = parse(src).unwrap_err();
    assert_eq!(e.pos, Some(Pos { line: 6, column: 48 }), "{e:?}");
    assert!(e.message.starts_with("expected ',' or ']', but got '}'"), "{e:?}");
    // The last line too, and a mapping closed by `]`.
    let e = parse("a: {b: [1, 2}\n").unwrap_err();
    assert_eq!(e.pos, Some(Pos { line: 1, column: 13 }), "{e:?}");
    let e = parse("a: [{b: 1]\n").unwrap_err();
    assert!(e.message.starts_with("expected ',' or '}', but got ']'"), "{e:?}");
}
