//! What one caller may see and read, as `serve`'s MCP endpoint serves it
//! (`serve.mcp`): the listing, the templates and the reads of a verified
//! identity (its user **and** the roles of its token), under the same gate,
//! policy and cache as an injection. The model's tools (`tools.rs`) and the
//! CLI ask the same questions for a bare user name through
//! [`McpContext::visible_resources`] and [`McpContext::read_for`], which
//! come here.
//!
//! Layer: orchestrator (beside `context/mod.rs`). Imports the access layer
//! (gate, policy), the sources' types and the report.

use std::sync::Arc;

use super::{ContextRequest, McpContext, select};
use crate::error::{Error, Result};
use crate::gate::admit;
use crate::id::ResourceId;
use crate::report::UpstreamAuth;
use crate::resource::{Contents, Resource, ResourceTemplate};

/// One caller's view of every configured server, shared and per user.
#[derive(Debug, Default)]
// Without `serve` only the resources are read (the CLI's and the tools' listing).
#[cfg_attr(not(feature = "serve"), allow(dead_code))]
pub(crate) struct CallerView {
    /// What the policy lets the caller see: the listings, then the user's
    /// includes, in config order. `audience: [user]` resources are kept
    /// (the host decides who sees them).
    pub(crate) resources: Vec<Arc<Resource>>,
    /// The templates of the servers that answer for the caller whose own
    /// text the policy allows (a template is decided on as a resource whose
    /// URI is the template, with its MIME type): an expansion is still
    /// admitted by the gate and decided on by itself when it is read.
    pub(crate) templates: Vec<ResourceTemplate>,
    /// Every per-user server's state for this user (where to connect).
    pub(crate) auth: Vec<UpstreamAuth>,
}

impl McpContext {
    /// The view of `req`'s identity (user and roles). Nothing is read.
    pub(crate) async fn view_of(&self, req: &ContextRequest) -> CallerView {
        let up = self.policy().for_identity(&req.user, &req.roles);
        let own = self.user_views(&req.user).await;
        let (all, _) = select::candidates(&self.hub, &up, &own);
        let resources = all.into_iter().filter(|r| up.decide(r).allowed).collect();
        let mut templates = self.hub.templates();
        for (_, v) in &own.views {
            templates.extend(v.hub.templates());
        }
        templates.retain(|t| {
            let Ok(id) = ResourceId::new(t.server.clone(), t.uri_template.clone()) else { return false };
            let mut r = Resource::unlisted(id);
            r.mime_type = t.mime_type.clone();
            up.decide(&r).allowed
        });
        CallerView { resources, templates, auth: own.auth }
    }

    /// Reads one requested resource for `req`'s identity: the gate, then the
    /// policy, then the cache. `Ok(None)` is "not found" in every sense a
    /// caller must not tell apart (refused by the gate, denied and never
    /// read, absent on the server, a per-user server the user has not
    /// connected).
    pub(crate) async fn read_as(
        &self,
        req: &ContextRequest,
        id: &ResourceId,
    ) -> Result<Option<(Arc<Resource>, Arc<Contents>)>> {
        let user = req.user.as_str();
        // One policy snapshot for the gate and the decision.
        let up = self.policy().for_identity(user, &req.roles);
        let own = self.views_serving(user, &id.server).await;
        let (hub, cache) = match &own {
            Some(own) => match own.view(&id.server) {
                Some(v) => (&v.hub, &v.cache),
                None => return Ok(None),
            },
            None => (&self.hub, &self.cache),
        };
        let Ok(admitted) = admit(hub, &up, id) else { return Ok(None) };
        if !up.decide(&admitted.resource).allowed {
            return Ok(None);
        }
        match cache.read(&admitted.resource.id, user).await {
            Ok(c) => Ok(Some((admitted.resource, c.contents))),
            Err(Error::NotFound { .. }) => Ok(None),
            Err(e) => {
                // The server refused the user's credential: `denied_by_server` from now on, as after an injection's read.
                if let Some(own) = &own
                    && crate::credentials::looks_denied(&e.to_string())
                {
                    own.mark_denied(&id.server);
                }
                Err(e)
            }
        }
    }
}
