//! A fast stdio MCP server with the peer lab's workload (`../shared/lab`).
//!
//! Same flags and environment variables as `lab/bench_server.py` (`--n`,
//! `--size`, `--page-size`, `--seed`; `BENCH_*`), same URIs, texts, blobs,
//! annotations and `offset:N` cursors, byte for byte (the generator is a
//! port of CPython's Mersenne Twister, checked against Python in
//! `tests/all/bench.rs`). Every page and read result is built once at
//! start-up, so the server costs little per request: the Python server tops
//! out near 1500 reads/s and would hide client differences.
//!
//! `cargo run --release --example bench_server -- --n 1000`

#[path = "bench/workload.rs"]
mod workload;

use std::collections::HashMap;
use std::sync::Arc;

use rmcp::model::*;
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler, ServiceExt};

#[derive(Clone)]
struct Bench {
    pages: Arc<HashMap<Option<String>, ListResourcesResult>>,
    reads: Arc<HashMap<String, ReadResourceResult>>,
}

impl ServerHandler for Bench {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_resources().build())
            .with_server_info(Implementation::new("mcp-context-bench", "0.1.0"))
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let cursor = request.and_then(|r| r.cursor);
        self.pages
            .get(&cursor)
            .cloned()
            .ok_or_else(|| ErrorData::invalid_params(format!("invalid cursor: {cursor:?}"), None))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        match self.reads.get(&request.uri) {
            Some(r) => Ok(r.clone().into()),
            None => Err(ErrorData::resource_not_found(format!("Resource not found: {}", request.uri), None)),
        }
    }
}

fn arg(args: &[String], name: &str, env: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .or_else(|| std::env::var(env).ok().filter(|v| !v.is_empty()))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn build(n: usize, size: usize, page_size: usize, seed: u64) -> Bench {
    let specs = workload::build(n, size, page_size, seed);
    let mut reads = HashMap::with_capacity(n);
    let resources: Vec<Resource> = specs
        .iter()
        .map(|s| {
            let contents = match (&s.text, &s.blob_b64) {
                (Some(t), _) => ResourceContents::text(t.clone(), s.uri.clone()).with_mime_type(s.mime),
                (None, Some(b)) => ResourceContents::blob(b.clone(), s.uri.clone()).with_mime_type(s.mime),
                (None, None) => ResourceContents::text(String::new(), s.uri.clone()),
            };
            reads.insert(s.uri.clone(), ReadResourceResult::new(vec![contents]));
            Resource::new(s.uri.clone(), s.name.clone())
                .with_title(s.title.clone())
                .with_description(s.description.clone())
                .with_mime_type(s.mime)
                .with_size(s.size as u64)
                .with_annotations(
                    Annotations::default().with_audience(vec![Role::Assistant]).with_priority(s.priority as f32),
                )
        })
        .collect();
    let mut pages = HashMap::new();
    for (cursor, range, next) in workload::page_cursors(n, page_size) {
        let mut page = ListResourcesResult::with_all_items(resources[range].to_vec());
        page.next_cursor = next;
        pages.insert(cursor, page);
    }
    Bench { pages: Arc::new(pages), reads: Arc::new(reads) }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n = arg(&args, "--n", "BENCH_N", workload::DEFAULT_N as u64) as usize;
    let size = arg(&args, "--size", "BENCH_SIZE", workload::DEFAULT_SIZE as u64) as usize;
    let page_size = arg(&args, "--page-size", "BENCH_PAGE_SIZE", workload::DEFAULT_PAGE_SIZE as u64).max(1) as usize;
    let seed = arg(&args, "--seed", "BENCH_SEED", workload::DEFAULT_SEED);
    let started = std::time::Instant::now();
    let bench = build(n, size, page_size, seed);
    if args.iter().any(|a| a == "--verbose") {
        eprintln!("[bench_server] n={n} size={size} page_size={page_size} seed={seed} build={:?}", started.elapsed());
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime");
    rt.block_on(async move {
        match bench.serve(rmcp::transport::stdio()).await {
            Ok(running) => {
                let _ = running.waiting().await;
            }
            Err(e) => eprintln!("bench_server: {e}"),
        }
    });
}
