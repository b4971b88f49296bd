//! What one request asks the orchestrator for ([`ContextRequest`]): the
//! user, and what differs from the config for this request (a selection, a
//! budget, a model, a query, a mode, the identity's roles). Imports the
//! ids, the modes and the identity; nothing of the pipeline.

use crate::id::ResourceId;
use crate::mode::SelectMode;

/// What to build the context for: [`ContextRequest::for_user`], then the
/// `with_*` setters for what differs from the config (the type may gain
/// fields, so it is not built with a struct literal outside this crate).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ContextRequest {
    /// The user whose policy applies.
    pub user: String,
    /// Restrict to these resources (as `@server:uri` mentions do); they must
    /// still be visible to the user.
    pub selection: Option<Vec<ResourceId>>,
    /// Override the budget (still capped by `context.max_tokens`... unless
    /// this is the CLI's `--budget`, which *is* the ceiling).
    pub budget: Option<usize>,
    /// Count with this model's tokenizer instead of the configured one.
    pub model: Option<String>,
    /// What the conversation asks, for relevance mode. `None` takes it from
    /// the chat request ([`Query::from_chat`](crate::compose::Query::from_chat)) when there is one.
    pub query: Option<String>,
    /// Override `context.select` for this request.
    pub select: Option<SelectMode>,
    /// Roles from the caller's identity provider (mapped groups), added to
    /// their policy entry's ([`crate::Policy::for_identity`]).
    pub roles: Vec<String>,
    /// How the user was identified, for the report ([`ContextRequest::with_identity`]).
    pub source: Option<crate::identity::IdentitySource>,
}

impl ContextRequest {
    /// A request for `user` with everything else from the config.
    pub fn for_user(user: impl Into<String>) -> Self {
        Self { user: user.into(), ..Self::default() }
    }

    /// Only these resources (`None`: everything the user may see).
    pub fn with_selection(mut self, ids: impl Into<Option<Vec<ResourceId>>>) -> Self {
        self.selection = ids.into();
        self
    }

    /// Another budget (`None`: the config's).
    pub fn with_budget(mut self, tokens: impl Into<Option<usize>>) -> Self {
        self.budget = tokens.into();
        self
    }

    /// Count with this model's tokenizer.
    pub fn with_model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// The question relevance mode ranks passages by.
    pub fn with_query(mut self, query: impl Into<String>) -> Self {
        self.query = Some(query.into());
        self
    }

    /// Another way of choosing resources (`None`: the config's `context.select`).
    pub fn with_select(mut self, mode: impl Into<Option<SelectMode>>) -> Self {
        self.select = mode.into();
        self
    }

    /// Roles the caller's identity provider gives them (already mapped to
    /// policy roles), on top of their policy entry's; the application that
    /// sets them vouches for them.
    pub fn with_roles<I, S>(mut self, roles: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.roles =
            crate::identity::Identity::new("", crate::identity::IdentitySource::Application).with_roles(roles).roles;
        self
    }

    /// The user and roles of a verified identity
    /// ([`JwtVerifier::verify`](crate::identity::JwtVerifier)).
    pub fn with_identity(mut self, identity: &crate::identity::Identity) -> Self {
        self.user = identity.user.clone();
        self.roles = identity.roles.clone();
        self.source = Some(identity.source);
        self
    }
}

/// A user name is a request with everything else from the config, so the
/// calls that take `impl Into<ContextRequest>` accept `"alice"` directly.
impl From<&str> for ContextRequest {
    fn from(user: &str) -> Self {
        Self::for_user(user)
    }
}

impl From<String> for ContextRequest {
    fn from(user: String) -> Self {
        Self::for_user(user)
    }
}

impl From<&String> for ContextRequest {
    fn from(user: &String) -> Self {
        Self::for_user(user.as_str())
    }
}

impl From<&ContextRequest> for ContextRequest {
    fn from(req: &ContextRequest) -> Self {
        req.clone()
    }
}
