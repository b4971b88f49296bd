//! Query-aware context (relevance mode) against a real server serving a
//! directory of text files (`mcp-fixture --dir`), with a real policy.

use std::path::Path;
use std::process::Command;

use mcp_context::{ContextRequest, McpContext, Policy, ResourceId, SelectMode};

use crate::common::*;

/// About 60 tokens of filler per paragraph, so documents span several chunks.
fn filler(topic: &str, n: usize) -> String {
    (0..n)
        .map(|i| {
            format!(
                "Section {i} of the {topic} handbook covers meetings, reviews, owners and schedules; \
                 nothing in it is about birds or travel, only routine {topic} work items for part {i}."
            )
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// A knowledge base where the answer about penguins is in the middle of
/// `secret.txt`, a file the policy hides from eve, and a weaker one in
/// `public.md`.
fn kb() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let w = |name: &str, text: String| std::fs::write(dir.path().join(name), text).unwrap();
    w("a-handbook.txt", filler("finance", 30));
    w("b-handbook.txt", filler("legal", 30));
    w(
        "secret.txt",
        format!(
            "{}\n\nSECRET-CANARY: emperor penguins migrate to the breeding colony in the southern winter.\n\n{}",
            filler("security", 12),
            filler("security", 12)
        ),
    );
    w(
        "public.md",
        format!(
            "# Wildlife\n\n{}\n\n## Penguins\n\nPenguins are birds that cannot fly.\n\n{}",
            filler("zoo", 8),
            filler("zoo", 8)
        ),
    );
    dir
}

const POLICY: &str = r#"
users:
  alice: { allow: [ { uri: "kb://**" } ] }
  eve:
    allow: [ { uri: "kb://**" } ]
    deny: [ { uri: "kb://secret.txt" } ]
"#;

async fn engine(dir: &Path, log: &Path, t: &str) -> McpContext {
    let yaml = format!(
        "servers:\n{}context:\n  select: auto\n",
        fixture_server("kb", t, &["--n", "0", "--dir", dir.to_str().unwrap(), "--record", log.to_str().unwrap()])
    );
    McpContext::with_policy(&config(&yaml), Policy::from_yaml(POLICY, Path::new("p.yaml")).unwrap()).await
}

fn req(user: &str, budget: usize, query: &str) -> ContextRequest {
    ContextRequest::for_user(user).with_budget(budget).with_query(query)
}

#[tokio::test]
async fn ranking_happens_after_the_policy() {
    let (t, dir) = (tag(), kb());
    let log = dir.path().join("..").join(format!("reads-{t}.log"));
    let ctx = engine(dir.path(), &log, &t).await;
    let q = "when do emperor penguins migrate to the colony";
    let (m, report) = ctx.build(&req("alice", 1200, q)).await.unwrap();
    let content = m.unwrap().content;
    assert_eq!(report.mode, Some(SelectMode::Relevance));
    assert!(content.contains("SECRET-CANARY"), "alice may see it: {content}");
    assert!(report.tokens <= 1200);
    let secret = report.included.iter().find(|i| i.id == "kb:kb://secret.txt").unwrap();
    assert!(secret.chunks.as_ref().is_some_and(|c| !c.is_empty()));

    let (m, report) = ctx.build(&req("eve", 1200, q)).await.unwrap();
    let content = m.unwrap().content;
    assert!(!content.contains("SECRET-CANARY") && !content.contains("kb://secret.txt"), "{content}");
    assert!(report.included.iter().all(|i| i.id != "kb:kb://secret.txt"));
    assert!(content.contains("Penguins are birds"), "eve gets the best passage she may see: {content}");
    // Only alice's build read the secret file.
    assert_eq!(read_log(&log).iter().filter(|u| *u == "kb://secret.txt").count(), 1);
    ctx.close().await;
    let _ = std::fs::remove_file(log);
}

#[tokio::test]
async fn auto_switches_exactly_when_the_visible_content_stops_fitting() {
    let (t, dir) = (tag(), kb());
    let log = dir.path().join("..").join(format!("reads-{t}.log"));
    let ctx = engine(dir.path(), &log, &t).await;
    let all = req("eve", 1_000_000, "penguins").with_select(SelectMode::Priority);
    let (whole, report) = ctx.build(&all).await.unwrap();
    let whole = whole.unwrap();
    assert!(report.excluded.iter().all(|e| e.reason != mcp_context::ExcludeReason::Budget));
    let (fits, report) = ctx.build(&req("eve", whole.tokens, "penguins")).await.unwrap();
    assert_eq!(report.mode, Some(SelectMode::Priority));
    assert_eq!(fits.unwrap().content, whole.content, "byte-identical to the priority message");
    assert!(report.included.iter().all(|i| i.chunks.is_none()));
    let (over, report) = ctx.build(&req("eve", whole.tokens - 1, "penguins")).await.unwrap();
    assert_eq!(report.mode, Some(SelectMode::Relevance));
    assert!(over.unwrap().tokens < whole.tokens);
    // Now every resource is chunked, and `auto` may decide from the index:
    // still priority at the exact fit, relevance one token under (new
    // queries, so nothing comes from the composition memo).
    let (fits, report) = ctx.build(&req("eve", whole.tokens, "penguins that fly")).await.unwrap();
    assert_eq!(report.mode, Some(SelectMode::Priority));
    assert_eq!(fits.unwrap().content, whole.content);
    let (_, report) = ctx.build(&req("eve", whole.tokens - 1, "penguins that fly")).await.unwrap();
    assert_eq!(report.mode, Some(SelectMode::Relevance));
    // Identical inputs, identical bytes: from the memo, and from a second
    // engine (its own server process, chunk index and caches).
    let (a, _) = ctx.build(&req("eve", 900, "penguins that cannot fly")).await.unwrap();
    let (b, _) = ctx.build(&req("eve", 900, "penguins that cannot fly")).await.unwrap();
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.content, b.content);
    let other = engine(dir.path(), &log, &t).await;
    let (c, report) = other.build(&req("eve", 900, "penguins that cannot fly")).await.unwrap();
    assert_eq!((report.mode, report.cache_hits), (Some(SelectMode::Relevance), 0));
    assert_eq!(c.unwrap().content, a.content);
    other.close().await;
    ctx.close().await;
    let _ = std::fs::remove_file(log);
}

#[tokio::test]
async fn mentioned_resources_go_in_first() {
    let (t, dir) = (tag(), kb());
    let log = dir.path().join("..").join(format!("reads-{t}.log"));
    let ctx = engine(dir.path(), &log, &t).await;
    // The query matches nothing in the finance handbook; mentioned, it still fills the budget first.
    let id = |f: &str| ResourceId::new("kb", format!("kb://{f}")).unwrap();
    let r = req("alice", 600, "emperor penguins").with_selection(vec![id("a-handbook.txt")]);
    let (m, report) = ctx.build(&r).await.unwrap();
    assert_eq!(report.mode, Some(SelectMode::Relevance));
    let ids: Vec<&str> = report.included.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["kb:kb://a-handbook.txt"]);
    assert!(m.unwrap().content.contains("finance handbook"));
    // Two mentioned: every chunk of the security text matches "security",
    // none of the legal handbook's does, and about two chunks fit. Each
    // mentioned resource still gets its best chunk in.
    let both = vec![id("secret.txt"), id("b-handbook.txt")];
    let r = req("alice", 800, "security").with_selection(both);
    let (m, report) = ctx.build(&r).await.unwrap();
    let ids: Vec<&str> = report.included.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["kb:kb://b-handbook.txt", "kb:kb://secret.txt"], "{report:?}");
    assert!(m.unwrap().content.contains("legal handbook"));
    ctx.close().await;
    let _ = std::fs::remove_file(log);
}

#[test]
fn preview_query_shows_chunks_in_json() {
    let (t, dir) = (tag(), kb());
    let yaml = format!(
        "servers:\n{}context:\n  max_tokens: 1000\n",
        fixture_server("kb", &t, &["--n", "0", "--dir", dir.path().to_str().unwrap()])
    );
    let (cfg_dir, cfg) = temp_config(&yaml);
    let out = Command::new(MCP_CONTEXT)
        .args(["--config", cfg.to_str().unwrap(), "preview", "--json", "--query", "emperor penguins migrate"])
        .current_dir(cfg_dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["mode"], "relevance");
    let secret = v["included"].as_array().unwrap().iter().find(|i| i["id"] == "kb:kb://secret.txt").unwrap();
    let chunk = &secret["chunks"][0];
    assert!(chunk["index"].as_u64().is_some() && chunk["count"].as_u64().unwrap() > 1, "{secret}");
    assert!(chunk["tokens"].as_u64().unwrap() > 0 && chunk["score"].as_f64().unwrap() > 1.0);
    assert!(v["message"]["content"].as_str().unwrap().contains("SECRET-CANARY"));
    // A bad mode is a clear error.
    let out = Command::new(MCP_CONTEXT)
        .args(["--config", cfg.to_str().unwrap(), "preview", "--mode", "best"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected auto, priority or relevance"));
}

/// The evaluation on real text this project did not write (BENCHMARKS.md):
/// the Python FAQ (`python3.11-doc`, PSF License), one resource per entry
/// with its question heading removed, each question as the query; recall =
/// the entry's block is in the message. Build the data first:
/// `python3 scripts/python_faq_eval.py /tmp/faq-eval`, then
/// `FAQ_EVAL=/tmp/faq-eval cargo test --test all eval_python_faq -- --ignored --nocapture`.
/// With `FAQ_TARGET=1` it fails unless the issue's target holds: at 4000
/// tokens relevance finds at least 80% of the passages and at least 5 times
/// as many as priority. `FAQ_MISSES=FILE` writes the questions relevance
/// missed at 4000 tokens.
#[tokio::test]
#[ignore = "needs the evaluation data (scripts/python_faq_eval.py); prints recall"]
async fn eval_python_faq() {
    let Ok(data) = std::env::var("FAQ_EVAL") else {
        panic!("set FAQ_EVAL to the output of scripts/python_faq_eval.py")
    };
    let data = Path::new(&data);
    let questions: Vec<(String, String)> = std::fs::read_to_string(data.join("questions.tsv"))
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('\t').map(|(q, f)| (q.to_owned(), f.to_owned())))
        .collect();
    let t = tag();
    // FAQ_CHUNK_TOKENS overrides context.chunk_tokens (default: the crate's), overlap a tenth of it.
    let chunk: usize = std::env::var("FAQ_CHUNK_TOKENS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(mcp_context::compose::DEFAULT_CHUNK_TOKENS);
    let yaml = format!(
        "servers:\n{}context:\n  chunk_tokens: {chunk}\n  chunk_overlap: {}\n",
        fixture_server("kb", &t, &["--n", "0", "--dir", data.join("kb").to_str().unwrap()]),
        chunk / 10
    );
    let ctx = McpContext::with_policy(&config(&yaml), Policy::allow_all()).await;
    let resources = ctx.visible_resources("eval").await.len();
    println!("{} questions, {resources} resources, chunk_tokens {chunk}", questions.len());
    assert!(questions.len() >= 100 && resources == questions.len(), "incomplete evaluation data in {data:?}");
    println!("| budget | priority | relevance | relevance / priority |\n|---:|---:|---:|---:|");
    let mut at_4000 = (0, 0);
    for budget in [2000, 4000, 8000] {
        let mut hits = [0usize; 2];
        let mut missed = Vec::new();
        for (m, mode) in [SelectMode::Priority, SelectMode::Relevance].into_iter().enumerate() {
            for (q, file) in &questions {
                let r = req("eval", budget, q).with_select(mode);
                let (msg, report) = ctx.build(&r).await.unwrap();
                assert!(report.tokens <= budget);
                assert_eq!(report.mode, Some(mode));
                if msg.is_some_and(|msg| msg.content.contains(&format!("<resource id=\"kb:kb://{file}\""))) {
                    hits[m] += 1;
                } else if mode == SelectMode::Relevance {
                    missed.push(format!("{file}\t{q}"));
                }
            }
        }
        let pct = |h: usize| 100.0 * h as f64 / questions.len() as f64;
        let n = questions.len();
        println!(
            "| {budget} | {}/{n} = {:.1}% | {}/{n} = {:.1}% | {:.1}x |",
            hits[0],
            pct(hits[0]),
            hits[1],
            pct(hits[1]),
            hits[1] as f64 / hits[0].max(1) as f64
        );
        if budget == 4000 {
            at_4000 = (hits[0], hits[1]);
            if let Ok(path) = std::env::var("FAQ_MISSES") {
                std::fs::write(path, missed.join("\n") + "\n").unwrap();
            }
        }
    }
    ctx.close().await;
    if std::env::var_os("FAQ_TARGET").is_some() {
        let (priority, relevance) = at_4000;
        assert!(
            relevance * 100 >= questions.len() * 80 && relevance >= 5 * priority,
            "target missed at 4000 tokens: relevance {relevance}, priority {priority} of {}",
            questions.len()
        );
    }
}

#[test]
fn select_mode_and_chunk_settings_are_parsed_strictly() {
    let parse =
        |ctx: &str| mcp_context::Config::from_yaml(&format!("servers: {{}}\ncontext:\n{ctx}"), Path::new("c.yaml"));
    let c = parse("  select: relevance\n  chunk_tokens: 200\n").unwrap();
    assert_eq!((c.context.select, c.context.chunk_tokens, c.context.chunk_overlap), (SelectMode::Relevance, 200, 30));
    assert_eq!(parse("  model: gpt-4o\n").unwrap().context.select, SelectMode::Auto);
    let e = parse("  select: best\n").unwrap_err().to_string();
    assert!(e.starts_with("c.yaml:3:11: context.select: unknown variant `best`"), "{e}");
    let e = parse("  chunk_tokens: 100\n  chunk_overlap: 60\n").unwrap_err().to_string();
    assert!(e.contains("chunk_overlap must be at most half"), "{e}");
}

/// The typed Responses path ranks by the user text of `input`, as the
/// proxy's `/v1/responses` does: the same passages as the same question
/// asked through `ContextRequest::query`.
#[tokio::test]
async fn typed_responses_requests_rank_by_their_input() {
    use async_openai::types::responses::CreateResponseArgs;
    let (t, dir) = (tag(), kb());
    let log = dir.path().join("..").join(format!("reads-{t}.log"));
    let yaml = format!(
        "servers:\n{}context:\n  select: auto\n  max_tokens: 1200\n",
        fixture_server(
            "kb",
            &t,
            &["--n", "0", "--dir", dir.path().to_str().unwrap(), "--record", log.to_str().unwrap()]
        )
    );
    let ctx = McpContext::with_policy(&config(&yaml), Policy::from_yaml(POLICY, Path::new("p.yaml")).unwrap()).await;
    let q = "when do emperor penguins migrate to the colony";
    let request = CreateResponseArgs::default().model("gpt-4o").input(q).build().unwrap();
    let (request, report) = ctx.inject_response(request, "alice").await.unwrap();
    let instructions = request.instructions.unwrap();
    assert_eq!(report.mode, Some(SelectMode::Relevance));
    assert!(report.warnings.is_empty(), "ranked by a query: {:?}", report.warnings);
    assert!(instructions.contains("SECRET-CANARY"), "the passage that answers `input`: {instructions}");
    let asked = ContextRequest::for_user("alice").with_query(q);
    let (message, by_query) = ctx.build(&asked).await.unwrap();
    assert!(instructions.contains(message.unwrap().content.as_str()));
    assert_eq!((report.tokens, &report.included), (by_query.tokens, &by_query.included));
    ctx.close().await;
    let _ = std::fs::remove_file(log);
}
