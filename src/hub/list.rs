//! Listing one server: `resources/list` and `resources/templates/list`,
//! following `nextCursor` to the end (or to a stated reason it stopped),
//! and the re-listing that `notifications/resources/list_changed` asks for.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rmcp::model::PaginatedRequestParams;
use rmcp::service::ServiceError;

use super::connect::Live;
use super::convert::{convert_resource, convert_template, map_service_error};
use super::{Hub, HubEvent, Shared};
use crate::config::ServerConfig;
use crate::resource::{Resource, ResourceTemplate};

/// Most pages we follow in one listing before calling it incomplete.
const MAX_LIST_PAGES: usize = 1000;

/// What one server listed, replaced whole on every (re)listing so that
/// readers (the gate, selections) hold one consistent listing.
#[derive(Default)]
pub(crate) struct Listing {
    /// Shared so that selections hold pointers, not copies.
    pub(crate) resources: Vec<Arc<Resource>>,
    pub(crate) templates: Vec<ResourceTemplate>,
    /// Every page was followed to the end.
    pub(super) complete: bool,
    /// Why the listing is incomplete (or the templates failed).
    pub(super) problem: Option<String>,
    /// The shortest `ttlMs` of its `resources/list` pages, when the server
    /// sent one (templates are re-listed with the resources).
    pub(super) ttl_ms: Option<u64>,
}

/// The shortest re-list period a list `ttlMs` can ask for.
const MIN_RELIST: Duration = Duration::from_secs(1);

impl Listing {
    /// When this listing should be replaced: its `ttlMs` (at least
    /// [`MIN_RELIST`]) on a server that does not announce `list_changed`.
    /// A `ttlMs` of 0 (what SDKs send when a server sets no hint) and an
    /// absent one promise nothing: such a listing is replaced on
    /// `list_changed` and on reconnection, as on 2025-11-25. A `private`
    /// list needs nothing more: the hub lists with its own identity, once,
    /// and each user sees only what the policy allows of it.
    pub(super) fn relist_after(&self, list_changed: bool) -> Option<Duration> {
        let ttl = self.ttl_ms.filter(|t| *t > 0)?;
        (!list_changed).then(|| Duration::from_millis(ttl).max(MIN_RELIST))
    }
}

/// Re-lists the servers that sent `list_changed`, a burst at a time, and
/// tells subscribers (the cache) with [`HubEvent::ListChanged`]. Ends with
/// the hub (it holds only a weak reference).
pub(super) async fn relist_loop(
    shared: std::sync::Weak<Shared>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Arc<str>>,
) {
    while let Some(first) = rx.recv().await {
        // Coalesce a burst: wait a moment, then re-list each server named once.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut names: Vec<Arc<str>> = vec![first];
        while let Ok(n) = rx.try_recv() {
            if !names.contains(&n) {
                names.push(n);
            }
        }
        let Some(shared) = shared.upgrade() else { return };
        for name in names {
            let hub = Hub { shared: shared.clone() };
            if hub.relist(&name).await.is_ok() {
                let _ = shared.events.send(HubEvent::ListChanged { server: name.to_string() });
            }
        }
    }
}

/// Asks for a re-list of `server` once its listing's `ttlMs` has passed
/// (see [`Listing::relist_after`]), if `live` is then still its connection.
pub(super) fn schedule_relist(shared: &Arc<Shared>, server: &str, live: &Arc<Live>, listing: &Listing) {
    let Some(after) = listing.relist_after(live.list_changed) else { return };
    let (weak, live, name) = (Arc::downgrade(shared), Arc::downgrade(live), Arc::<str>::from(server));
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        let (Some(shared), Some(live)) = (weak.upgrade(), live.upgrade()) else { return };
        let current = shared.servers.iter().find(|s| *s.cfg.name == *name).and_then(|s| s.state().live.clone());
        if current.is_some_and(|c| Arc::ptr_eq(&c, &live)) {
            tracing::debug!(server = %name, "listing expired (ttlMs); re-listing");
            let _ = shared.relist_tx.send(name);
        }
    });
}

/// What is told of each page of resources as it is listed (new URIs only).
pub(super) type OnPage<'a> = dyn Fn(&[Arc<Resource>]) + Sync + 'a;

/// Lists one connection's resources (duplicates by URI dropped) and
/// templates, the two walks side by side (one round trip less at the end:
/// templates used to be asked for after the last resource page). Each page
/// of resources is handed to `on_page` as it arrives, so reads of it can
/// start while the next page is listed. Never fails: what could not be
/// listed is the listing's `problem`, and the rest is kept.
pub(super) async fn list_server(cfg: &ServerConfig, live: &Live, on_page: Option<&OnPage<'_>>) -> Listing {
    let mut listing = Listing { complete: true, ..Listing::default() };
    if !live.has_resources {
        listing.problem = None;
        return listing;
    }
    let name = cfg.name.as_str();
    let now = SystemTime::now();
    let mut seen_uris = HashSet::new();
    let (mut resources, mut templates) = (Vec::new(), Vec::new());
    let pages = paginate(
        cfg,
        "resources/list",
        |params| {
            let peer = live.peer.clone();
            async move { peer.list_resources(params).await.map(|p| (p.resources, p.next_cursor, p.ttl_ms)) }
        },
        |batch| {
            let start = resources.len();
            for r in batch {
                if seen_uris.insert(r.uri.clone()) {
                    resources.push(Arc::new(convert_resource(name, r, now)));
                }
            }
            if let Some(f) = on_page {
                f(&resources[start..]);
            }
        },
    );
    let template_pages = paginate(
        cfg,
        "resources/templates/list",
        |params| {
            let peer = live.peer.clone();
            async move {
                peer.list_resource_templates(params).await.map(|p| (p.resource_templates, p.next_cursor, p.ttl_ms))
            }
        },
        |batch| templates.extend(batch.into_iter().map(|t| convert_template(name, t))),
    );
    let (r, t) = tokio::join!(pages, template_pages);
    listing.ttl_ms = r.ttl_ms;
    listing.resources = resources;
    listing.templates = templates;
    if let Some(p) = r.problem {
        listing.complete = false;
        listing.problem = Some(p);
    }
    if let Some(p) = t.problem
        && !p.contains("-32601")
    {
        // A server without templates may answer "method not found": not a problem.
        listing.problem.get_or_insert(p);
    }
    listing
}

struct Pages {
    problem: Option<String>,
    /// The shortest `ttlMs` of the pages.
    ttl_ms: Option<u64>,
}

/// Follows `nextCursor` until it is absent, handing each page's items to
/// `on_page` as it arrives. An empty string is a cursor, not the end (spec,
/// pagination). A repeated cursor or more than [`MAX_LIST_PAGES`] pages
/// stops the walk and marks the listing incomplete.
async fn paginate<T, F, Fut>(cfg: &ServerConfig, what: &str, mut fetch: F, mut on_page: impl FnMut(Vec<T>)) -> Pages
where
    F: FnMut(Option<PaginatedRequestParams>) -> Fut,
    Fut: std::future::Future<Output = std::result::Result<(Vec<T>, Option<String>, Option<u64>), ServiceError>>,
{
    let mut ttl_ms: Option<u64> = None;
    let mut cursor: Option<String> = None;
    let mut seen = HashSet::new();
    for page in 1..=MAX_LIST_PAGES {
        let params = cursor.clone().map(|c| PaginatedRequestParams::default().with_cursor(Some(c)));
        let result = tokio::time::timeout(cfg.timeout, fetch(params)).await;
        let (batch, next, ttl) = match result {
            Err(_) => {
                return Pages {
                    ttl_ms,
                    problem: Some(format!(
                        "{what} incomplete: page {page} timed out after {} ms",
                        cfg.timeout.as_millis()
                    )),
                };
            }
            Ok(Err(e)) => {
                let e = cfg.scrub(&map_service_error(e, &cfg.name, what, None).to_string());
                return Pages { ttl_ms, problem: Some(format!("{what} incomplete: page {page} failed: {e}")) };
            }
            Ok(Ok(x)) => x,
        };
        on_page(batch);
        if let Some(t) = ttl {
            ttl_ms = Some(ttl_ms.map_or(t, |m| m.min(t)));
        }
        match next {
            None => return Pages { problem: None, ttl_ms },
            Some(c) => {
                if !seen.insert(c.clone()) {
                    return Pages {
                        ttl_ms,
                        problem: Some(format!(
                            "{what} incomplete: the server repeated cursor {:?} on page {page}",
                            c.chars().take(64).collect::<String>()
                        )),
                    };
                }
                cursor = Some(c);
            }
        }
    }
    Pages { ttl_ms, problem: Some(format!("{what} incomplete: stopped after {MAX_LIST_PAGES} pages")) }
}
