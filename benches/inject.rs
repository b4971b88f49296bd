//! render + budget + inject for 100 already-read resources of 2 KB, token
//! counts already cached (the warm path of every LLM call).
//!
//! `cargo bench --bench inject`

#![allow(missing_docs, reason = "criterion_group! generates the entry points")]

use async_openai::types::chat::{ChatCompletionRequestUserMessage, CreateChatCompletionRequestArgs};
use criterion::{Criterion, black_box, criterion_group, criterion_main};
use mcp_context::compose::{ChunkIndex, DEFAULT_CHUNK_OVERLAP, DEFAULT_CHUNK_TOKENS, Query, compose_by_relevance};
use mcp_context::compose::{DEFAULT_PREAMBLE, TokenCache, Tokenizer, compose};
use mcp_context::inject::inject_message;
use mcp_context::{ContentPart, Contents, MessageRole, Resource, ResourceId};
use std::sync::Arc;

fn text(i: usize, size: usize) -> String {
    let words = ["context", "server", "resource", "the", "model", "token", "budget", "policy", "user", "reads"];
    let mut s = format!("Document {i}. ");
    let mut k = i;
    while s.len() < size {
        s.push_str(words[k % words.len()]);
        s.push(if k.is_multiple_of(13) { '\n' } else { ' ' });
        k = k.wrapping_mul(7).wrapping_add(3);
    }
    s.truncate(size);
    s
}

fn workload(n: usize) -> Vec<(Resource, Contents)> {
    (0..n)
        .map(|i| {
            let id = ResourceId::new("bench", format!("bench://doc/{i}")).unwrap();
            let resource = Resource::new(id).with_name(format!("doc-{i}")).with_mime_type("text/plain").with_size(2048);
            let contents = Contents::text(text(i, 2048), Some("text/plain"));
            (resource, contents)
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let (tok, _) = Tokenizer::for_model("gpt-4o");
    let cache = TokenCache::new();
    let items = workload(100);
    let refs: Vec<(&Resource, &Contents)> = items.iter().map(|(r, c)| (r, c)).collect();
    let request = CreateChatCompletionRequestArgs::default()
        .model("gpt-4o")
        .messages([ChatCompletionRequestUserMessage::from("hello").into()])
        .build()
        .unwrap();
    // Warm the token cache: the benchmark measures the cached path.
    let first = compose(&tok, &cache, DEFAULT_PREAMBLE, 1_000_000, &refs);
    assert_eq!(first.included.len(), 100);
    c.bench_function("render+budget+inject 100x2KB (cached counts)", |b| {
        b.iter(|| {
            let composed = compose(&tok, &cache, DEFAULT_PREAMBLE, black_box(1_000_000), black_box(&refs));
            let mut req = request.clone();
            inject_message(&mut req, composed.content.as_deref(), MessageRole::System);
            black_box(req)
        })
    });
    c.bench_function("render+budget+inject 100x2KB, budget 8000 (truncation)", |b| {
        b.iter(|| {
            let composed = compose(&tok, &cache, DEFAULT_PREAMBLE, black_box(8000), black_box(&refs));
            let mut req = request.clone();
            inject_message(&mut req, composed.content.as_deref(), MessageRole::System);
            black_box(req)
        })
    });
}

/// Relevance mode (issue 15): 1000 cached resources of 2 KB, budget 4000.
/// Warm: chunks and weights already indexed, a new question ranked and
/// packed. Cold: chunking and indexing from scratch, against tokenising the
/// same content once.
fn relevance(c: &mut Criterion) {
    let (tok, _) = Tokenizer::for_model("gpt-4o");
    let cache = TokenCache::new();
    let items: Vec<(Resource, Arc<Contents>)> = workload(1000).into_iter().map(|(r, c)| (r, Arc::new(c))).collect();
    let refs: Vec<(&Resource, &Arc<Contents>)> = items.iter().map(|(r, c)| (r, c)).collect();
    let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP);
    let query = Query::text("which policy budget does the model use for user reads");
    let first = compose_by_relevance(&tok, &cache, &index, DEFAULT_PREAMBLE, 4000, &refs, Some(&query));
    assert!(first.tokens <= 4000 && !first.included.is_empty());
    c.bench_function("relevance: rank+pack 1000x2KB, budget 4000 (warm index)", |b| {
        b.iter(|| compose_by_relevance(&tok, &cache, &index, DEFAULT_PREAMBLE, black_box(4000), &refs, Some(&query)))
    });
    let mut group = c.benchmark_group("cold 100x2KB");
    group.sample_size(10);
    let few = &refs[..100];
    group.bench_function("chunk+index", |b| {
        b.iter(|| {
            let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP);
            for (r, c) in few {
                index.prepare(&tok, r, c);
            }
            index
        })
    });
    group.bench_function("chunk+index+rank+pack", |b| {
        b.iter(|| {
            let index = ChunkIndex::new(DEFAULT_CHUNK_TOKENS, DEFAULT_CHUNK_OVERLAP);
            compose_by_relevance(&tok, &cache, &index, DEFAULT_PREAMBLE, black_box(4000), few, Some(&query))
        })
    });
    group.bench_function("tokenise once", |b| {
        b.iter(|| {
            few.iter()
                .map(|(_, c)| match &c.parts[0] {
                    ContentPart::Text { text, .. } => tok.count(black_box(text)),
                    _ => 0,
                })
                .sum::<usize>()
        })
    });
    group.finish();
}

criterion_group!(benches, bench, relevance);
criterion_main!(benches);
