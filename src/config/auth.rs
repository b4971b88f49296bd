//! A `url:` server's `auth:` block: how each request to that server is
//! authorised (issue 35). Types only here; the parser that fills them lives
//! with the server map (`servers.rs`).
//!
//! ```yaml
//! servers:
//!   drive:
//!     url: https://drive.example/mcp
//!     auth: { type: oauth, client_id: mcp-context, scopes: [files.read] }
//!   jira:
//!     url: https://jira.example/mcp
//!     auth: { type: token_exchange, audience: jira, client_id: gw, client_secret: "${GW_SECRET}" }
//!   sentry:
//!     url: https://sentry.example/mcp
//!     auth: { type: per_user_headers, headers: [Authorization] }
//! ```
//!
//! May import ids and `url`/`secrecy` types; nothing above the settings layer.

use secrecy::SecretString;
use url::Url;

/// How requests to one server are authorised.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ServerAuth {
    /// One credential for everybody: the server entry's `headers` (today's
    /// behaviour, and the default when there is no `auth:` block).
    Static,
    /// Secrets stored per user (by the operator or the user), sent as these
    /// header names. A user with none stored gets `needs_authorization`.
    PerUserHeaders(PerUserHeadersSettings),
    /// RFC 8693 at the server's authorization server, the caller's verified
    /// token as the subject token.
    TokenExchange(TokenExchangeSettings),
    /// OAuth 2.1 authorization code with PKCE, per user.
    OAuth(OAuthSettings),
}

impl ServerAuth {
    /// Whether the server is seen per user (every kind but `Static`).
    pub fn is_per_user(&self) -> bool {
        !matches!(self, ServerAuth::Static)
    }
}

/// `auth: { type: per_user_headers, headers: [...] }`.
#[derive(Debug, Clone)]
pub struct PerUserHeadersSettings {
    /// The header names a user's stored secrets fill (e.g. `Authorization`,
    /// `X-API-Key`).
    pub headers: Vec<String>,
}

/// How we authenticate ourselves as an OAuth client at a token endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientAuthMethod {
    /// `client_secret_basic` (the default when there is a secret).
    #[default]
    Basic,
    /// `client_secret_post`.
    Post,
    /// A public client: `client_id` in the body, no secret.
    None,
}

/// `auth: { type: token_exchange, ... }` (RFC 8693).
#[derive(Debug, Clone)]
pub struct TokenExchangeSettings {
    /// The token endpoint; when absent, discovered from `issuer`'s
    /// authorization server metadata (RFC 8414, then OpenID discovery).
    pub token_endpoint: Option<Url>,
    /// The authorization server's issuer, for discovery.
    pub issuer: Option<Url>,
    /// `audience` parameter, when the authorization server wants one.
    pub audience: Option<String>,
    /// `resource` parameter (RFC 8707); defaults to the server's `url`.
    pub resource: Option<String>,
    /// Scopes asked for (`scope`, space-joined).
    pub scopes: Vec<String>,
    /// Our client at the authorization server.
    pub client_id: String,
    /// Its secret, when it is a confidential client.
    pub client_secret: Option<SecretString>,
    /// How the client authenticates.
    pub client_auth: ClientAuthMethod,
    /// `subject_token_type`; default
    /// `urn:ietf:params:oauth:token-type:access_token`.
    pub subject_token_type: String,
}

/// `auth: { type: oauth, ... }`: authorization code with PKCE per user.
#[derive(Debug, Clone)]
pub struct OAuthSettings {
    /// A pre-registered client, or the URL of a client ID metadata document
    /// (which is then the `client_id`, the preferred registration).
    pub client_id: String,
    /// Its secret, for a pre-registered confidential client.
    pub client_secret: Option<SecretString>,
    /// How the client authenticates at the token endpoint.
    pub client_auth: ClientAuthMethod,
    /// Scopes asked for; when empty, those the server's protected resource
    /// metadata lists.
    pub scopes: Vec<String>,
    /// Overrides discovery (RFC 9728 from the server's 401, then RFC 8414).
    /// Taken as written (plain `http` too), and the only kind of
    /// authorization server a `client_secret` is sent to besides a
    /// configured `token_endpoint` (or a loopback one for a loopback
    /// server). Discovered ones must be `https` (plain `http` only on
    /// loopback for a loopback server), with no query or fragment.
    pub authorization_server: Option<Url>,
    /// The `resource` indicator (RFC 8707); defaults to the server's `url`.
    /// Always what is sent: the server's protected resource metadata must
    /// name this same resource, or it is refused (RFC 9728 §3.3).
    pub resource: Option<String>,
    /// The token endpoint, overriding the authorization server metadata's.
    /// Default: the metadata's, which must then be on the issuer's origin
    /// (scheme, host and port).
    pub token_endpoint: Option<Url>,
}
