//! Unit tests of relevance mode: chunking, term analysis, the query, ranking
//! and the chunk index's bound.

use super::chunk::*;
use super::query::*;
use super::terms;
use super::*;
use crate::resource::ContentPart;

/// Whether the indexed resources need more than `budget` whole.
fn exceeds(tok: &Tokenizer, index: &ChunkIndex, items: &[Candidate<'_>], budget: usize) -> bool {
    Composer { tok, cache: &TokenCache::new(), index, preamble: "", budget }.exceeds(items)
}

/// Relevance mode over `items`, as the engine composes it.
fn compose_relevant(
    tok: &Tokenizer,
    cache: &TokenCache,
    index: &ChunkIndex,
    preamble: &str,
    budget: usize,
    items: &[Candidate<'_>],
    query: Option<&Query>,
) -> Composition {
    Composer { tok, cache, index, preamble, budget }.by_relevance(items, query)
}

#[cfg(test)]
#[allow(clippy::needless_update)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::id::ResourceId;

    fn tok() -> Tokenizer {
        Tokenizer::for_model("gpt-4o").0
    }

    fn res(uri: &str, text: &str, priority: Option<f32>, mime: Option<&str>) -> (Resource, Arc<Contents>) {
        let mut r = Resource::unlisted(ResourceId::new("kb", uri).unwrap());
        r.annotations.priority = priority;
        r.mime_type = mime.map(Into::into);
        let c = Contents {
            parts: vec![ContentPart::Text { text: text.into(), mime_type: None }],
            truncated_bytes: 0,
            ..Default::default()
        };
        (r, Arc::new(c))
    }

    /// A document of `n` paragraphs about `topic`, each about 60 tokens.
    fn doc(topic: &str, n: usize) -> String {
        (0..n)
            .map(|i| {
                format!(
                    "Paragraph {i} of the {topic} notes. The {topic} team writes about {topic} matters here, \
                     with details on planning, reviews, schedules, owners and follow-up items for section {i}."
                )
            })
            .collect::<Vec<_>>()
            .join("\n\n")
    }

    fn corpus() -> Vec<(Resource, Arc<Contents>)> {
        let mut v = vec![
            res("doc://alpha", &doc("alpha", 30), Some(0.9), None),
            res("doc://beta", &doc("beta", 30), Some(0.8), None),
            res("doc://gamma", &doc("gamma", 30), Some(0.1), None),
        ];
        // The answer sits in the middle of a low-priority document.
        let mut text = doc("delta", 15);
        text.push_str("\n\nThe penguin migration starts in the southern winter; penguins walk to the colony.\n\n");
        text.push_str(&doc("delta", 15));
        v.push(res("doc://delta", &text, Some(0.0), None));
        v
    }

    fn items<'a>(v: &'a [(Resource, Arc<Contents>)], forced: &[usize]) -> Vec<Candidate<'a>> {
        v.iter()
            .enumerate()
            .map(|(i, (r, c))| Candidate { resource: r, contents: c, forced: forced.contains(&i) })
            .collect()
    }

    fn run(v: &[(Resource, Arc<Contents>)], budget: usize, mode: SelectMode, q: Option<&str>) -> Composed {
        let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP);
        let query = q.map(Query::text);
        let (tok, cache) = (tok(), TokenCache::new());
        Composer { tok: &tok, cache: &cache, index: &index, preamble: DEFAULT_PREAMBLE, budget }.by_mode(
            &items(v, &[]),
            mode,
            query.as_ref(),
        )
    }

    #[test]
    fn relevant_passage_of_a_low_priority_resource_goes_in() {
        let v = corpus();
        let priority = run(&v, 1500, SelectMode::Priority, Some("when do penguins migrate"));
        assert!(!priority.composition.content.unwrap().contains("penguin"));
        let c = run(&v, 1500, SelectMode::Relevance, Some("when do penguins migrate"));
        assert_eq!(c.mode, SelectMode::Relevance);
        let content = c.composition.content.unwrap();
        assert!(content.contains("The penguin migration starts"), "{content}");
        assert!(c.composition.tokens <= 1500);
        assert_eq!(c.composition.tokens, tok().count(&content));
        // One block per resource, in resource order, omitted stretches marked.
        let delta = c.composition.included.iter().find(|i| i.id == "kb:doc://delta").unwrap();
        let chunks = delta.chunks.as_ref().unwrap();
        assert!(chunks[0].score > 1.0, "{chunks:?}");
        assert!(content.contains(" tokens omitted …]\n"));
        let order: Vec<usize> = ["kb:doc://alpha", "kb:doc://beta", "kb:doc://gamma", "kb:doc://delta"]
            .iter()
            .filter_map(|id| content.find(&format!("<resource id=\"{id}\"")))
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "blocks out of resource order");
        // The highest-scoring chunk is listed with its place in the resource.
        assert!(chunks.iter().all(|k| k.count > 1 && k.index < k.count && k.tokens > 0));
    }

    #[test]
    fn identical_inputs_give_identical_bytes() {
        let v = corpus();
        let a = run(&v, 2000, SelectMode::Relevance, Some("beta reviews schedule"));
        let b = run(&v, 2000, SelectMode::Relevance, Some("beta reviews schedule"));
        assert_eq!(a.composition, b.composition);
        // Also with a shared, warm index and cache.
        let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP);
        let cache = TokenCache::new();
        let q = Query::text("beta reviews schedule");
        let it = items(&v, &[]);
        let warm1 = compose_relevant(&tok(), &cache, &index, DEFAULT_PREAMBLE, 2000, &it, Some(&q));
        let warm2 = compose_relevant(&tok(), &cache, &index, DEFAULT_PREAMBLE, 2000, &it, Some(&q));
        assert_eq!(warm1, warm2);
        assert_eq!(warm1, a.composition);
    }

    #[test]
    fn auto_switches_exactly_when_everything_stops_fitting() {
        let v = corpus();
        let whole = run(&v, 1_000_000, SelectMode::Priority, None).composition;
        assert!(whole.dropped.is_empty());
        let fits = run(&v, whole.tokens, SelectMode::Auto, Some("penguins"));
        assert_eq!(fits.mode, SelectMode::Priority);
        assert_eq!(fits.composition, whole);
        let over = run(&v, whole.tokens - 1, SelectMode::Auto, Some("penguins"));
        assert_eq!(over.mode, SelectMode::Relevance);
        assert!(over.composition.tokens < whole.tokens);
        // With every resource already chunked, `auto` decides from the index
        // without packing by priority first: the same answer at the edge.
        let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP);
        let cache = TokenCache::new();
        let it = items(&v, &[]);
        let q = Query::text("penguins");
        let auto = |budget| {
            let tok = tok();
            Composer { tok: &tok, cache: &cache, index: &index, preamble: DEFAULT_PREAMBLE, budget }.by_mode(
                &it,
                SelectMode::Auto,
                Some(&q),
            )
        };
        assert_eq!(auto(whole.tokens - 1).mode, SelectMode::Relevance);
        assert_eq!(index.len(), v.len());
        assert!(exceeds(&tok(), &index, &it, whole.tokens - 200));
        assert!(!exceeds(&tok(), &index, &it, whole.tokens));
        let edge = whole.tokens;
        let fits = auto(edge);
        assert_eq!((fits.mode, fits.composition), (SelectMode::Priority, whole));
        assert_eq!(auto(edge - 1).mode, SelectMode::Relevance);
    }

    #[test]
    fn forced_resources_rank_first() {
        let v = corpus();
        let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP);
        let q = Query::text("penguins");
        // gamma is forced: its chunks go in before the matching delta chunk.
        let c = compose_relevant(&tok(), &TokenCache::new(), &index, DEFAULT_PREAMBLE, 700, &items(&v, &[2]), Some(&q));
        let ids: Vec<&str> = c.included.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["kb:doc://gamma"]);
    }

    #[test]
    fn every_forced_resource_gets_its_best_chunk_in_first() {
        let v = corpus();
        let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP);
        // Every alpha chunk matches "alpha", none of delta's does; both are
        // mentioned and two chunks fit: one of each, not two of alpha.
        let q = Query::text("alpha notes");
        let c =
            compose_relevant(&tok(), &TokenCache::new(), &index, DEFAULT_PREAMBLE, 700, &items(&v, &[0, 3]), Some(&q));
        let ids: Vec<&str> = c.included.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["kb:doc://alpha", "kb:doc://delta"]);
        // Unforced, alpha's chunks outrank delta's.
        let c = compose_relevant(&tok(), &TokenCache::new(), &index, DEFAULT_PREAMBLE, 700, &items(&v, &[]), Some(&q));
        let ids: Vec<&str> = c.included.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["kb:doc://alpha"]);
    }

    #[test]
    fn a_title_counts_for_every_chunk() {
        // Two documents of the same filler; one is titled with the query's word.
        let mut v = vec![res("doc://a", &doc("plain", 12), None, None), res("doc://b", &doc("plain", 12), None, None)];
        v[1].0.title = Some("Penguin handbook".into());
        let c = run(&v, 400, SelectMode::Relevance, Some("penguin"));
        let scores = |id: &str| -> Vec<f64> {
            let i = c.composition.included.iter().find(|i| i.id == id);
            i.map(|i| i.chunks.as_ref().unwrap().iter().map(|k| k.score).collect()).unwrap_or_default()
        };
        let (a, b) = (scores("kb:doc://a"), scores("kb:doc://b"));
        assert!(!b.is_empty() && b.iter().all(|s| *s > 0.1 && a.iter().all(|a| a < s)), "{a:?} {b:?}");
    }

    #[test]
    fn priority_breaks_ties() {
        let v = corpus();
        // No term matches: chunks fill by priority (alpha first).
        let c = run(&v, 600, SelectMode::Relevance, Some("zzzz qqqq"));
        assert_eq!(c.composition.included[0].id, "kb:doc://alpha");
        let c = run(&v, 600, SelectMode::Relevance, None);
        assert_eq!(c.composition.included[0].id, "kb:doc://alpha");
        assert_eq!(c.warnings.len(), 1);
    }

    #[test]
    fn a_changed_resource_is_chunked_again_and_nothing_else() {
        let t = tok();
        let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP);
        let v = corpus();
        let first: Vec<Arc<Chunked>> = v.iter().map(|(r, c)| index.get(&t, r, c)).collect();
        assert_eq!(index.len(), 4);
        let mut v2 = v.clone();
        v2[1] = res("doc://beta", &doc("beta changed", 10), Some(0.8), None);
        let second: Vec<Arc<Chunked>> = v2.iter().map(|(r, c)| index.get(&t, r, c)).collect();
        for (i, (a, b)) in first.iter().zip(&second).enumerate() {
            assert_eq!(Arc::ptr_eq(a, b), i != 1, "resource {i}");
        }
        assert!(second[1].body().contains("beta changed"));
        // Same contents with other listing metadata: the block shows it, so it is recut.
        let mut r = v[0].0.clone();
        r.name = "renamed".into();
        assert!(!Arc::ptr_eq(&index.get(&t, &r, &v[0].1), &first[0]));
    }

    #[test]
    fn markdown_headings_are_boundaries() {
        let t = tok();
        let index = ChunkIndex::new(60, 0);
        let section = |h: &str| format!("# {h}\n\n{}\n\n", doc(h, 1));
        let text = format!("{}{}{}", section("One"), section("Two"), section("Three"));
        let (r, c) = res("doc://md", &text, None, Some("text/markdown"));
        let chunked = index.chunk(&t, &r, &c);
        let starts: Vec<&str> =
            chunked.chunks.iter().map(|k| &chunked.body()[k.start..k.end]).filter(|s| s.starts_with('#')).collect();
        assert_eq!(
            starts.len(),
            3,
            "{:?}",
            chunked.chunks.iter().map(|k| &chunked.body()[k.start..k.end]).collect::<Vec<_>>()
        );
        assert!(chunked.chunks.iter().all(|k| k.tokens <= 60));
    }

    #[test]
    fn query_from_chat_weights_earlier_turns_lower() {
        use async_openai::types::chat::{
            ChatCompletionRequestAssistantMessage, ChatCompletionRequestUserMessage, CreateChatCompletionRequestArgs,
        };
        let req = CreateChatCompletionRequestArgs::default()
            .model("gpt-4o")
            .messages([
                ChatCompletionRequestUserMessage::from("tell me about penguins").into(),
                ChatCompletionRequestAssistantMessage::from("they are birds").into(),
                ChatCompletionRequestUserMessage::from("when do they migrate").into(),
            ])
            .build()
            .unwrap();
        let q = Query::from_chat(&req).unwrap();
        assert_eq!(q.turns, [("when do they migrate".to_owned(), 1.0), ("tell me about penguins".to_owned(), 0.5)]);
        let term = |w: &str| {
            let mut v = Vec::new();
            terms::each(w, |_, t| v.push(t));
            v[0]
        };
        let (penguin, migrate) = (term("penguins"), term("migrate"));
        let terms = q.terms();
        let w = |t: u64| terms.iter().find(|x| x.0 == t).unwrap().1;
        assert_eq!((w(migrate), w(penguin)), (1.0, 0.5));
    }

    fn words() -> impl Strategy<Value = String> {
        let pool =
            vec!["penguin", "walks", "the", "colony", "\n\n", "# Head\n", "<resource", "é日本", "1234", "  ", "."];
        prop::collection::vec(prop::sample::select(pool), 0..400).prop_map(|v| v.join(" "))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn relevance_never_exceeds_the_budget(
            texts in prop::collection::vec((words(), prop::option::of(0.0f32..1.0), any::<bool>()), 0..5),
            budget in prop_oneof![0usize..300, 0usize..3000],
            chunk in 16usize..200,
            query in words(),
            model in prop::sample::select(vec!["gpt-4o", "gpt-4", "davinci"]),
        ) {
            // o200k and cl100k count by pieces; r50k recounts the message.
            let t = Tokenizer::for_model(model).0;
            let v: Vec<_> = texts
                .iter()
                .enumerate()
                .map(|(i, (text, p, md))| res(&format!("doc://{i}"), text, *p, md.then_some("text/markdown")))
                .collect();
            let index = ChunkIndex::new(chunk, chunk / 8);
            let q = Query::text(query);
            let c = compose_relevant(&t, &TokenCache::new(), &index, DEFAULT_PREAMBLE, budget, &items(&v, &[]), Some(&q));
            prop_assert!(c.tokens <= budget);
            match &c.content {
                None => prop_assert_eq!((c.tokens, c.included.len()), (0, 0)),
                Some(content) => {
                    prop_assert_eq!(c.tokens, t.count(content));
                    let opens = content.lines().filter(|l| l.starts_with("<resource ")).count();
                    prop_assert_eq!(opens, c.included.len());
                }
            }
            prop_assert_eq!(c.included.len() + c.dropped.len(), v.len());
        }
    }
}

#[cfg(test)]
mod query_cap {
    use async_openai::types::chat::CreateChatCompletionRequest;
    use serde_json::json;

    use super::*;

    fn lens(q: &Query) -> Vec<(usize, f32)> {
        q.turns.iter().map(|(t, w)| (t.len(), *w)).collect()
    }

    #[test]
    fn a_query_keeps_the_last_bytes_of_the_newest_turns() {
        let older = format!("{}OLDEST-END", "a ".repeat(5_000));
        let newest = format!("NEWEST-START {}", "b ".repeat(5_000));
        let body = json!({"messages": [
            {"role": "user", "content": "the first turn, past the cap"},
            {"role": "user", "content": older},
            {"role": "assistant", "content": "x"},
            {"role": "user", "content": newest},
        ]});
        let q = Query::from_chat_json(&body).unwrap();
        // The newest turn whole, the end of the one before, nothing older.
        assert_eq!(lens(&q), [(newest.len(), 1.0), (MAX_QUERY_BYTES - newest.len(), 0.5)]);
        assert!(q.turns[0].0.starts_with("NEWEST-START") && q.turns[1].0.ends_with("OLDEST-END"));
        assert_eq!(q.turns.iter().map(|(t, _)| t.len()).sum::<usize>(), MAX_QUERY_BYTES);
    }

    #[test]
    fn one_long_turn_is_cut_on_a_character_boundary_from_its_end() {
        // 3-byte characters: 16384 is not a multiple of 3.
        let text = format!("START{}", "€".repeat(100_000));
        let q = Query::from_chat_json(&json!({"input": text})).unwrap();
        assert_eq!(lens(&q), [(MAX_QUERY_BYTES / 3 * 3, 1.0)]);
        assert!(q.turns[0].0.chars().all(|c| c == '€'));
        assert_eq!(Query::text(text.clone()), q, "a given query is capped the same way");
        assert_eq!(Query::text("short"), Query { turns: vec![("short".into(), 1.0)] });
    }

    #[test]
    fn the_typed_request_and_its_json_give_the_same_capped_query() {
        let big = "word ".repeat(20_000);
        let body = json!({"model": "gpt-4o", "messages": [
            {"role": "user", "content": "earlier"},
            {"role": "user", "content": [{"type": "text", "text": big}, {"type": "text", "text": "tail"}]},
        ]});
        let typed: CreateChatCompletionRequest = serde_json::from_value(body.clone()).unwrap();
        let q = Query::from_chat(&typed).unwrap();
        assert_eq!(Some(q.clone()), Query::from_chat_json(&body));
        assert_eq!(lens(&q), [(MAX_QUERY_BYTES, 1.0)]);
        assert!(q.turns[0].0.ends_with("\ntail"));
    }
}

#[cfg(test)]
mod bound {
    use super::*;
    use crate::id::ResourceId;

    fn tok() -> Tokenizer {
        Tokenizer::for_model("gpt-4o").0
    }

    /// A resource of `kb://{uri}` with `bytes` of varied text: a private
    /// answer read for one user is a new `Arc`, as here.
    fn res(uri: &str, bytes: usize) -> (Resource, Arc<Contents>) {
        let r = Resource::unlisted(ResourceId::new("kb", format!("kb://{uri}")).unwrap());
        let mut text = String::new();
        let mut i = 0;
        while text.len() < bytes {
            text.push_str(&format!("Item {i} of {uri} says the word w{} matters. ", i % 97));
            i += 1;
        }
        let c = Contents { parts: vec![ContentPart::Text { text, mime_type: None }], ..Default::default() };
        (r, Arc::new(c))
    }

    fn one_entry(bytes: usize) -> usize {
        let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP);
        let (r, c) = res("probe", bytes);
        index.prepare(&tok(), &r, &c);
        index.bytes()
    }

    #[test]
    fn an_entry_counts_its_contents_block_offsets_and_chunks() {
        let one = one_entry(32 * 1024);
        eprintln!("one entry of 32 KiB of text: {one} bytes");
        // The text twice (contents and the rendered block), 4 bytes per
        // token, the chunks' terms: several times the text.
        assert!(one > 3 * 32 * 1024, "{one}");
        assert!(one < 12 * 32 * 1024, "{one}");
        assert!(one_entry(64 * 1024) > one * 3 / 2);
    }

    #[test]
    fn the_index_stays_under_its_bytes_least_recently_used_first() {
        let t = tok();
        let one = one_entry(8 * 1024);
        let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP).with_max_bytes(one * 10 + one / 2);
        let v: Vec<_> = (0..10).map(|i| res(&format!("u{i}"), 8 * 1024)).collect();
        for (r, c) in &v {
            index.prepare(&t, r, c);
        }
        // Same length, same words apart from the digits: about the same size.
        assert_eq!(index.len(), 10);
        assert!(index.bytes() <= one * 10 + one / 2, "{} {one}", index.bytes());
        // The first is used again: the most recent now.
        assert!(index.peek(&t, &v[0].0, &v[0].1).is_some());
        let (r, c) = res("u10", 8 * 1024);
        index.prepare(&t, &r, &c);
        assert!(index.bytes() <= crate::lru::low_water(one * 10 + one / 2), "{}", index.bytes());
        assert!(index.peek(&t, &r, &c).is_some(), "the newest: kept");
        assert!(index.peek(&t, &v[0].0, &v[0].1).is_some(), "used lately: kept");
        assert!(index.peek(&t, &v[1].0, &v[1].1).is_none(), "the oldest: gone");
        // Many new versions (a private answer per user): never over the bound.
        let bound = one * 10 + one / 2;
        let mut kept = Vec::new();
        for i in 0..60 {
            let (r, c) = res(&format!("v{i}"), 2 * 1024 + i * 300);
            index.prepare(&t, &r, &c);
            assert!(index.bytes() <= bound, "{} > {bound}", index.bytes());
            kept.push(c);
        }
        // The count is the sum of what is kept, and dropped contents are
        // released (only `kept` holds them now).
        let e = index.lock();
        assert_eq!(e.bytes, e.map.values().map(|e| e.bytes).sum::<usize>());
        drop(e);
        assert!(Arc::strong_count(&v[1].1) == 1);
    }

    #[test]
    fn contents_larger_than_the_bound_are_chunked_but_not_kept() {
        let t = tok();
        let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP).with_max_bytes(one_entry(4096) * 2);
        let (small, sc) = res("small", 4096);
        index.prepare(&t, &small, &sc);
        let (big, bc) = res("big", 64 * 1024);
        let chunked = index.get(&t, &big, &bc);
        assert!(chunked.chunks.len() > 1);
        assert_eq!(index.len(), 1, "the big one is not kept; the small one stays");
        assert!(index.peek(&t, &big, &bc).is_none());
        assert_eq!(Arc::strong_count(&bc), 1);
        let off = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP).with_max_bytes(0);
        assert!(!off.get(&t, &small, &sc).chunks.is_empty());
        assert!(off.is_empty() && off.bytes() == 0);
    }

    #[test]
    fn an_entry_goes_with_its_contents() {
        // A private answer per new user: once the content cache drops a
        // version, no request can present it again, so its entry is dead
        // weight, released at the next insert (issue 47, item 10).
        let t = tok();
        let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP);
        let (kept_r, kept) = res("kept", 4096);
        index.prepare(&t, &kept_r, &kept);
        let one = index.bytes();
        for i in 0..50 {
            let (r, c) = res(&format!("gone{i}"), 4096);
            index.prepare(&t, &r, &c);
            assert!(index.peek(&t, &r, &c).is_some());
            // `c` dropped here, as the cache drops an expired private answer.
        }
        let (r, c) = res("last", 4096);
        index.prepare(&t, &r, &c);
        assert_eq!(index.len(), 2, "only the live contents are indexed");
        assert!(index.bytes() < one * 3, "{} bytes for two entries of about {one}", index.bytes());
        assert!(index.peek(&t, &kept_r, &kept).is_some() && index.peek(&t, &r, &c).is_some());
        assert_eq!(Arc::strong_count(&kept), 1, "the index keeps no contents alive");
    }

    #[test]
    fn re_inserting_the_same_contents_replaces_its_count() {
        let t = tok();
        let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP);
        let (r, c) = res("a", 4096);
        let chunked = index.get(&t, &r, &c);
        let once = index.bytes();
        index.insert(&t, &r, &c, chunked);
        assert_eq!((index.len(), index.bytes()), (1, once));
    }
}
