//! The read fan-out: every selected resource through the cache,
//! concurrently, a window per server, under one deadline for the request.

use std::sync::Arc;

use super::memo::CacheStamp;
use crate::cache::ContentCache;
use crate::error::{Error, Result};
use crate::hub::Hub;
use crate::resource::Resource;

/// Reads every selected resource through the cache, concurrently, with
/// one timer for the whole injection (`deadline_ms`): what is not read by
/// then is a timeout error for that resource; finished reads are kept.
/// Also returns how many were answered by the cache up front.
pub(super) async fn read_within_deadline(
    hub: &Hub,
    cache: &ContentCache,
    within: std::time::Duration,
    selected: &[Arc<Resource>],
    user: &str,
    own: &super::views::UserViews,
) -> (Vec<Result<crate::cache::CachedRead>>, usize, CacheStamp) {
    use futures::StreamExt;
    let hits = cache.hits(selected.iter().map(|r| &r.id), user);
    let stamp = CacheStamp { version: hits.version, expires: hits.expires };
    let mut results: Vec<Option<Result<crate::cache::CachedRead>>> =
        hits.reads.into_iter().map(|h| h.map(Ok)).collect();
    let hits = results.iter().filter(|r| r.is_some()).count();
    // One window of reads per server, twice its in-flight limit: a read
    // future exists only shortly before it can run (1000 futures created
    // at once held ~1 MB for a 1000-resource gather), and a slow server
    // fills only its own window, never another server's.
    let mut by_server: Vec<(&str, Vec<usize>)> = Vec::new();
    for (i, r) in selected.iter().enumerate().filter(|(i, _)| results[*i].is_none()) {
        match by_server.iter_mut().find(|(s, _)| *s == r.id.server) {
            Some((_, v)) => v.push(i),
            None => by_server.push((&r.id.server, vec![i])),
        }
    }
    let mut pending = futures::stream::select_all(by_server.into_iter().map(|(server, idx)| {
        let window = hub
            .server_config(server)
            .map_or(crate::config::DEFAULT_MAX_CONCURRENT_READS, |c| c.max_concurrent_reads)
            .max(1)
            * 2;
        futures::stream::iter(idx)
            .map(move |i| {
                // One span per read past the in-process cache: the shared
                // cache's answer or the server's (`mcp.read`, with the MCP
                // request's `_meta` carrying its trace context).
                let id = &selected[i].id;
                let span = crate::telemetry::child_span(|| {
                    tracing::info_span!("mcp.read", server = %id.server, uri = %id.uri, cache = tracing::field::Empty)
                });
                tracing::Instrument::instrument(
                    async move {
                        // A per-user server's resource is read through the user's own view
                        // (its private cache, its connection with the user's credential).
                        let got = match own.view(&id.server) {
                            Some(v) => v.cache.read(id, user).await,
                            None => cache.read(id, user).await,
                        };
                        let cache = match &got {
                            Ok(c) if c.origin == crate::cache::Origin::Shared => "shared_hit",
                            Ok(_) => "miss",
                            Err(_) => "error",
                        };
                        tracing::Span::current().record("cache", cache);
                        (i, got)
                    },
                    span,
                )
            })
            .buffer_unordered(window)
            .boxed()
    }));
    let deadline = tokio::time::sleep(within);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            next = pending.next() => match next {
                Some((i, r)) => results[i] = Some(r),
                None => break,
            },
            _ = &mut deadline => break,
        }
    }
    let results = results
        .into_iter()
        .zip(selected)
        .map(|(r, res)| {
            r.unwrap_or_else(|| {
                Err(Error::Timeout {
                    server: res.id.server.clone(),
                    what: format!("resources/read {} (injection deadline)", res.id.uri),
                    after_ms: within.as_millis() as u64,
                })
            })
        })
        .collect();
    (results, hits, stamp)
}
