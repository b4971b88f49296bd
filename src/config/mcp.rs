//! `serve.mcp`: the MCP endpoint of `serve` (`/mcp`), where each caller's
//! governed resources are one MCP server (src/serve/mcp/). Off unless the
//! section is there. May import the config's error helpers and the YAML tree.

use std::path::Path;

use serde::Deserialize;

use super::config_error;
use crate::error::Error;
use crate::yaml::Node;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMcp {
    enabled: Option<bool>,
    page_size: Option<usize>,
    resource: Option<String>,
}

/// Default `serve.mcp.page_size`: resources per `resources/list` page.
pub const DEFAULT_MCP_PAGE_SIZE: usize = 500;

/// The largest `serve.mcp.page_size` accepted.
const MAX_PAGE_SIZE: usize = 10_000;

/// `serve.mcp`: the MCP endpoint of the callers' resources.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct McpSettings {
    /// Resources per `resources/list` page (default [`DEFAULT_MCP_PAGE_SIZE`]).
    pub page_size: usize,
    /// The endpoint's own URL, as hosts reach it: the `resource` of its
    /// protected resource metadata and the audience a JWT for it must carry.
    /// `None`: `{serve.public_url}/mcp`, else `http://{listen}/mcp`.
    pub resource: Option<String>,
}

impl Default for McpSettings {
    fn default() -> Self {
        Self { page_size: DEFAULT_MCP_PAGE_SIZE, resource: None }
    }
}

/// Checks `serve.mcp` (`None` when `enabled: false`); each problem is
/// handed to `fail`, located at its value.
pub(super) fn settings(raw: RawMcp, node: &Node, path: &Path, fail: &dyn Fn(Error)) -> Option<McpSettings> {
    let at = |k: &str| node.get(k).map_or(node.pos, |n| n.pos);
    let mut s = McpSettings::default();
    match raw.page_size {
        Some(n) if n == 0 || n > MAX_PAGE_SIZE => fail(config_error(
            path,
            Some(at("page_size")),
            format!("serve.mcp.page_size must be between 1 and {MAX_PAGE_SIZE} (found {n})"),
        )),
        Some(n) => s.page_size = n,
        None => {}
    }
    if let Some(r) = raw.resource {
        let ok = url::Url::parse(&r)
            .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.query().is_none() && u.fragment().is_none());
        if ok {
            s.resource = Some(r.trim_end_matches('/').to_owned());
        } else {
            fail(config_error(
                path,
                Some(at("resource")),
                format!("serve.mcp.resource: `{r}` is not an http:// or https:// URL without a query or fragment"),
            ));
        }
    }
    raw.enabled.unwrap_or(true).then_some(s)
}
