//! The demo MCP server bundled with the crate (`mcp-context demo-server`).
//!
//! A small, realistic catalogue that exercises every rendering and policy
//! path: plain text, a multi-part text, a binary image, a resource meant only
//! for the human user (`audience: [user]`), different priorities, a "secret"
//! for policy demos, and a per-user template. It speaks stdio and needs
//! nothing installed: the repository's `mcp-context.yaml` launches it through
//! the running executable (`${MCP_CONTEXT_EXE} demo-server`).
//!
//! Layer: CLI (the bundled demo server). Imports nothing of this crate.

use rmcp::model::{
    Annotations, CacheScope, ErrorData, Implementation, ListResourceTemplatesResult, ListResourcesResult,
    PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ResourceTemplate, Role, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler, ServiceExt};

/// How long a read answer may be served from a cache (`ttlMs`).
const DEMO_TTL_MS: u64 = 300_000;

/// Resources per `resources/list` page, small so that clients must paginate.
const PAGE: usize = 3;

/// A 1×1 transparent PNG.
const LOGO_PNG_B64: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

struct Entry {
    uri: &'static str,
    name: &'static str,
    title: &'static str,
    description: &'static str,
    mime: &'static str,
    priority: Option<f32>,
    user_only: bool,
}

const ENTRIES: &[Entry] = &[
    Entry {
        uri: "demo://docs/guide",
        name: "guide",
        title: "Acme Notes user guide",
        description: "How to create, tag and share notes",
        mime: "text/markdown",
        priority: Some(0.9),
        user_only: false,
    },
    Entry {
        uri: "demo://docs/changelog",
        name: "changelog",
        title: "Changelog",
        description: "Release notes, one part per release",
        mime: "text/markdown",
        priority: Some(0.6),
        user_only: false,
    },
    Entry {
        uri: "demo://public/faq",
        name: "faq",
        title: "Frequently asked questions",
        description: "Public answers for everyone",
        mime: "text/plain",
        priority: Some(0.8),
        user_only: false,
    },
    Entry {
        uri: "demo://images/logo.png",
        name: "logo",
        title: "Acme logo",
        description: "The product logo",
        mime: "image/png",
        priority: Some(0.3),
        user_only: false,
    },
    Entry {
        uri: "demo://ui/welcome-banner",
        name: "welcome-banner",
        title: "Welcome banner",
        description: "Shown to the human in the UI, not meant for the model",
        mime: "text/plain",
        priority: Some(1.0),
        user_only: true,
    },
    Entry {
        uri: "demo://notes/low-priority",
        name: "office-plants",
        title: "Office plants rota",
        description: "Who waters the plants",
        mime: "text/plain",
        priority: Some(0.1),
        user_only: false,
    },
    Entry {
        uri: "secret://payroll/2026",
        name: "payroll-2026",
        title: "Payroll 2026",
        description: "Salaries (HR only)",
        mime: "text/csv",
        priority: Some(0.5),
        user_only: false,
    },
];

fn text_of(uri: &str) -> Option<Vec<ResourceContents>> {
    let t = |s: &str| ResourceContents::text(s, uri);
    Some(match uri {
        "demo://docs/guide" => vec![
            t("# Acme Notes guide\n\nCreate a note with `n new TITLE`. Tag it with `n tag ID TAG`.\n\
             Share a note with a teammate with `n share ID USER`; shared notes are read-only\n\
             unless you pass `--edit`. Notes sync every 30 seconds; `n sync` forces it.")
            .with_mime_type("text/markdown"),
        ],
        "demo://docs/changelog" => vec![
            t("## 2.1.0\n- Shared notes can be made editable with `--edit`.").with_mime_type("text/markdown"),
            t("## 2.0.0\n- New sync engine: notes sync every 30 seconds.").with_mime_type("text/markdown"),
        ],
        "demo://public/faq" => vec![t("Q: Is Acme Notes free?\nA: Yes, for up to 3 users.\n\
             Q: Where is my data stored?\nA: In the EU region you picked at sign-up.")],
        "demo://images/logo.png" => {
            vec![ResourceContents::blob(LOGO_PNG_B64, uri).with_mime_type("image/png")]
        }
        "demo://ui/welcome-banner" => vec![t("Welcome back! You have 3 unread notes.")],
        "demo://notes/low-priority" => vec![t("Plants: Mon Ana, Wed Ben, Fri Chen.")],
        "secret://payroll/2026" => vec![t("name,salary\nana,91000\nben,87000\nchen,99000").with_mime_type("text/csv")],
        _ => {
            let user = uri.strip_prefix("demo://users/")?.strip_suffix("/profile")?;
            if user.is_empty() || user.contains('/') {
                return None;
            }
            vec![t(&format!("Profile of {user}: plan Team, region EU, 42 notes."))]
        }
    })
}

/// The demo server's handler.
#[derive(Clone, Default)]
pub struct DemoServer;

impl ServerHandler for DemoServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_resources().build())
            .with_server_info(Implementation::new("mcp-context-demo", env!("CARGO_PKG_VERSION")))
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let start = match request.and_then(|r| r.cursor) {
            None => 0,
            Some(c) => c.parse().map_err(|_| ErrorData::invalid_params("unknown cursor", None))?,
        };
        let end = (start + PAGE).min(ENTRIES.len());
        let items = ENTRIES
            .get(start..end)
            .unwrap_or_default()
            .iter()
            .map(|e| {
                let mut a = Annotations::default();
                if let Some(p) = e.priority {
                    a = a.with_priority(p);
                }
                if e.user_only {
                    a = a.with_audience(vec![Role::User]);
                }
                let size = text_of(e.uri).map(|c| c.len() as u64).unwrap_or(0);
                Resource::new(e.uri, e.name)
                    .with_title(e.title)
                    .with_description(e.description)
                    .with_mime_type(e.mime)
                    .with_size(size)
                    .with_annotations(a)
            })
            .collect();
        let mut page = ListResourcesResult::with_all_items(items);
        page.next_cursor = (end < ENTRIES.len()).then(|| end.to_string());
        Ok(page)
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            ResourceTemplate::new("demo://users/{user}/profile", "user-profile")
                .with_description("A user's account profile")
                .with_mime_type("text/plain"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        match text_of(&request.uri) {
            // Cache hints (2026-07-28): the same for every user, fresh for 5 minutes, so a second
            // request within them is answered from the cache (the warm path) instead of read again.
            Some(contents) => Ok(ReadResourceResult::new(contents)
                .with_ttl_ms(DEMO_TTL_MS)
                .with_cache_scope(CacheScope::Public)
                .into()),
            None => Err(ErrorData::resource_not_found(
                format!("no resource {}", request.uri),
                Some(serde_json::json!({ "uri": request.uri })),
            )),
        }
    }
}

/// Serves the demo over stdio until the client closes stdin.
pub async fn serve_stdio() -> std::io::Result<()> {
    let running = DemoServer.serve(rmcp::transport::stdio()).await.map_err(|e| std::io::Error::other(e.to_string()))?;
    running.waiting().await.map_err(std::io::Error::other)?;
    Ok(())
}
