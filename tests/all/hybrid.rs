//! Hybrid retrieval (BM25 + the built-in embedding model), measured on data that ships with the
//! repository: tests/data/python-faq/ (the Python FAQ's 175 answers, PSF License; see its
//! LICENSE), served by a real MCP server (`mcp-fixture --dir`), each question the query, recall =
//! the answer's block is in the message at a 4000-token budget. Two question sets:
//!
//! - `questions.tsv`: the FAQ's own questions, which use the answers' words;
//! - `plain.tsv`: one question per entry written in plain words, checked here to share no rare
//!   word with its answer (every shared stemmed word occurs in at least 10% of the answers).
//!
//! Lexical (`context.semantic: off`), semantic alone (`semantic_weight: 1`) and hybrid (the
//! defaults) are printed, with floors that fail the test.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mcp_context::compose::Fusion;
use mcp_context::{ContextRequest, McpContext, Policy, Semantic};

use crate::common::*;

const BUDGET: usize = 4000;

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/python-faq")
}

fn questions(file: &str) -> Vec<(String, String)> {
    std::fs::read_to_string(data().join(file))
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('\t').map(|(q, f)| (q.to_owned(), f.to_owned())))
        .collect()
}

/// Stemmed words without NLTK's English stop words, split at every non-alphanumeric character
/// (stricter than the ranking's own analysis: identifiers' parts count as words).
fn words(text: &str) -> HashSet<String> {
    use rust_stemmers::{Algorithm, Stemmer};
    let stemmer = Stemmer::create(Algorithm::English);
    let stop: HashSet<String> =
        stop_words::get(stop_words::LANGUAGE::English).iter().map(|w| w.to_lowercase()).collect();
    text.to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty() && !stop.contains(*w))
        .map(|w| stemmer.stem(w).into_owned())
        .collect()
}

#[test]
fn plain_words_questions_share_no_rare_word_with_their_answer() {
    let kb = data().join("kb");
    let mut pages: HashMap<String, HashSet<String>> = HashMap::new();
    for e in std::fs::read_dir(&kb).unwrap() {
        let e = e.unwrap();
        pages.insert(e.file_name().to_string_lossy().into_owned(), words(&std::fs::read_to_string(e.path()).unwrap()));
    }
    let mut df: HashMap<&str, usize> = HashMap::new();
    for w in pages.values().flatten() {
        *df.entry(w).or_default() += 1;
    }
    let plain = questions("plain.tsv");
    assert!(plain.len() >= 150, "{} plain-words questions", plain.len());
    let answered: HashSet<&str> = plain.iter().map(|(_, f)| f.as_str()).collect();
    assert_eq!(answered.len(), plain.len(), "one question per entry");
    let mut rare = Vec::new();
    for (q, f) in &plain {
        let page = &pages[f];
        let mut shared: Vec<String> =
            words(q).into_iter().filter(|w| page.contains(w) && df[w.as_str()] * 10 < pages.len()).collect();
        shared.sort();
        if !shared.is_empty() {
            rare.push(format!("{f}: {shared:?} in {q:?}"));
        }
    }
    assert!(rare.is_empty(), "questions sharing a rare word with their answer:\n{}", rare.join("\n"));
}

async fn engine(t: &str, context: &str) -> McpContext {
    let kb = data().join("kb");
    let yaml = format!(
        "servers:\n{}context:\n  select: relevance\n{context}",
        fixture_server("kb", t, &["--n", "0", "--dir", kb.to_str().unwrap()])
    );
    McpContext::with_policy(&config(&yaml), Policy::allow_all()).await
}

fn req(q: &str) -> ContextRequest {
    ContextRequest::for_user("eval").with_budget(BUDGET).with_query(q)
}

/// Recall of `set` at [`BUDGET`]; every report's `semantic` must be `expect`.
async fn recall(ctx: &McpContext, set: &[(String, String)], expect: Semantic) -> f64 {
    let mut hits = 0;
    for (q, file) in set {
        let (msg, report) = ctx.build(&req(q)).await.unwrap();
        assert!(report.tokens <= BUDGET);
        assert_eq!(report.semantic, Some(expect), "{q}");
        if msg.is_some_and(|m| m.content.contains(&format!("<resource id=\"kb:kb://{file}\""))) {
            hits += 1;
        }
    }
    hits as f64 / set.len() as f64
}

/// Requests until the background embedder has done every chunk (the first requests rank
/// lexically and say `partial`); returns how long that took.
async fn embedded(ctx: &McpContext) -> Duration {
    let start = Instant::now();
    loop {
        let (_, report) = ctx.build(&req("warm up")).await.unwrap();
        match report.semantic {
            Some(Semantic::On) => return start.elapsed(),
            Some(Semantic::Partial) => {}
            other => panic!("semantic {other:?} in a default build"),
        }
        assert!(start.elapsed() < Duration::from_secs(900), "embedding the FAQ took over 15 minutes");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_beats_lexical_on_plain_words_and_keeps_quoted_questions() {
    let (own, plain) = (questions("questions.tsv"), questions("plain.tsv"));
    let t = tag();
    let lexical = engine(&t, "  semantic: off\n").await;
    let hybrid = engine(&t, "").await;
    let semantic = engine(&t, "  semantic_weight: 1\n").await;
    // The other fusion, and a lower weight (tests/all/hybrid.rs's history has more: mix 0.5 gave
    // 0.977 / 0.771, rrf 0.5 0.983 / 0.674).
    let variants = [
        ("mix, weight 0.7", "  semantic_weight: 0.7\n"),
        ("rrf, weight 0.8", "  fusion: rrf\n  semantic_weight: 0.8\n"),
    ];
    let mut others = Vec::new();
    for (name, yaml) in variants {
        others.push((name, engine(&t, yaml).await));
    }
    // The first request of a fresh index chunks everything and ranks lexically.
    let (_, first) = hybrid.build(&req("How do I copy a file?")).await.unwrap();
    assert_eq!(first.semantic, Some(Semantic::Partial), "the first request did not wait for the embedder");
    let mut times = Vec::new();
    for ctx in [&hybrid, &semantic].into_iter().chain(others.iter().map(|(_, c)| c)) {
        times.push(embedded(ctx).await);
    }
    println!("embedded the FAQ ({} entries) in {times:?}", own.len());
    let mut table = Vec::new();
    println!("| recall@{BUDGET} | FAQ's own questions | plain-words questions |\n|---|---:|---:|");
    let rows =
        [("lexical (semantic: off)", &lexical, Semantic::Off), ("semantic alone (weight 1)", &semantic, Semantic::On)]
            .into_iter()
            .chain(others.iter().map(|(name, c)| (*name, c, Semantic::On)))
            .chain([("hybrid (the defaults)", &hybrid, Semantic::On)]);
    for (name, ctx, expect) in rows {
        let r = (recall(ctx, &own, expect).await, recall(ctx, &plain, expect).await);
        println!("| {name} | {:.3} | {:.3} |", r.0, r.1);
        table.push(r);
    }
    let (lex, hyb) = (table[0], table[table.len() - 1]);
    // Floors, a little under what was measured (0.989 and 0.920 with the defaults; BM25 alone
    // 0.931 and 0.286): far above the target on plain words (0.40) and BM25 there, and
    // nothing lost on the questions that quote the document.
    assert!(hyb.1 >= 0.85 && hyb.1 >= lex.1 + 0.40, "plain words: hybrid {:.3}, lexical {:.3}", hyb.1, lex.1);
    assert!(hyb.0 >= 0.95 && hyb.0 >= lex.0, "own questions: hybrid {:.3}, lexical {:.3}", hyb.0, lex.0);
    for ctx in [lexical, hybrid, semantic].into_iter().chain(others.into_iter().map(|(_, c)| c)) {
        ctx.close().await;
    }
}

#[test]
fn semantic_settings_are_parsed_strictly() {
    let parse =
        |ctx: &str| mcp_context::Config::from_yaml(&format!("servers: {{}}\ncontext:\n{ctx}"), Path::new("c.yaml"));
    let c = parse("  model: gpt-4o\n").unwrap().context;
    assert_eq!(
        (c.semantic, c.semantic_weight, c.fusion),
        (true, mcp_context::compose::DEFAULT_SEMANTIC_WEIGHT, Fusion::Mix)
    );
    let c = parse("  semantic: off\n  semantic_weight: 0.25\n  fusion: rrf\n").unwrap().context;
    assert_eq!((c.semantic, c.semantic_weight, c.fusion), (false, 0.25, Fusion::Rrf));
    assert!(c.semantic_settings().is_none());
    assert!(parse("  semantic: on\n").unwrap().context.semantic);
    assert!(!parse("  semantic: false\n").unwrap().context.semantic);
    let e = parse("  semantic: maybe\n").unwrap_err().to_string();
    assert!(e.starts_with("c.yaml:3:") && e.contains("expected `on` or `off`, found `maybe`"), "{e}");
    let e = parse("  semantic_weight: 1.5\n").unwrap_err().to_string();
    assert!(e.starts_with("c.yaml:3:") && e.contains("semantic_weight must be between 0 and 1"), "{e}");
    let e = parse("  fusion: best\n").unwrap_err().to_string();
    assert!(e.starts_with("c.yaml:3:11:") && e.contains("unknown variant `best`"), "{e}");
}
