//! Who is calling, once verified: an [`Identity`] (the user, the roles their
//! identity provider gives them, and how they were identified), and, with the
//! `jwt` feature, [`JwtVerifier`], which turns an OIDC/JWT bearer token into one.
//!
//! The roles of an identity are the *mapped* ones (`role_map` applied to the
//! token's groups); the policy adds the user's own `users:` entry and falls
//! back to `default_roles` ([`crate::Policy::for_identity`]). An application
//! embedding the library verifies its own users' tokens and passes the result
//! on with [`crate::ContextRequest::with_identity`].
//!
//! ```no_run
//! # async fn demo(token: &str) -> mcp_context::Result<()> {
//! use mcp_context::identity::{JwtSettings, JwtVerifier};
//! let mut settings = JwtSettings::new("https://idp.example.com");
//! settings.audience = vec!["mcp-context".into()];
//! settings.roles_claim = Some("groups".into());
//! settings.role_map.insert("engineering".into(), vec!["staff".into()]);
//! let verifier = JwtVerifier::new(settings).await?; // fetches the JWKS (discovery)
//! let who = verifier.verify(token).await?;           // Error::Unauthenticated when refused
//! let request = mcp_context::ContextRequest::for_user("").with_identity(&who);
//! # let _ = request; Ok(()) }
//! ```
//!
//! Layer: 0b, just above the bottom. Imports only the bottom (`error`, `id`);
//! the config, the context and the proxy import it, never the reverse.

#[cfg(feature = "jwt")]
mod jwt;
#[cfg(feature = "jwt")]
mod keys;

pub use crate::error::AuthFailure;
#[cfg(feature = "jwt")]
pub use jwt::{DEFAULT_ALGORITHMS, JwksSource, JwtSettings, JwtVerifier, looks_like_jwt};
#[cfg(feature = "jwt")]
pub(crate) use jwt::{parse_algorithm_name, source_text};

/// How a caller was identified.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IdentitySource {
    /// A verified JWT (`serve.jwt`, [`JwtVerifier`]).
    Jwt,
    /// A static key listed under `serve.keys`.
    Key,
    /// A header set by a trusted gateway (`serve.user_header`).
    Header,
    /// The body's `user` / `safety_identifier` (`serve.user_from_body`).
    Body,
    /// Nobody said: `serve.anonymous_user`.
    Anonymous,
    /// The embedding application, which vouches for it.
    Application,
}

impl IdentitySource {
    /// The source as one word: `jwt`, `key`, `header`, `body`, `anonymous`, `application`.
    pub fn as_str(self) -> &'static str {
        match self {
            IdentitySource::Jwt => "jwt",
            IdentitySource::Key => "key",
            IdentitySource::Header => "header",
            IdentitySource::Body => "body",
            IdentitySource::Anonymous => "anonymous",
            IdentitySource::Application => "application",
        }
    }
}

impl std::fmt::Display for IdentitySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A caller: their user name, the roles their identity provider gives them
/// (already mapped to policy roles; the policy adds its own), and the source.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Identity {
    /// The policy user name (e.g. the token's `sub`, `email` or `preferred_username`).
    pub user: String,
    /// Policy roles from the identity provider, in token order, without repeats.
    pub roles: Vec<String>,
    /// How the caller was identified.
    pub source: IdentitySource,
    /// The verified bearer token itself (a [`JwtVerifier`] keeps it), the
    /// subject token of a token exchange (RFC 8693) for a server with
    /// `auth: { type: token_exchange }`. Never shown: `Debug` says
    /// `<redacted>`.
    pub token: Option<CallerToken>,
}

/// A caller's own bearer token, held for token exchange; its `Debug` never
/// shows it.
#[derive(Clone)]
pub struct CallerToken(secrecy::SecretString);

impl CallerToken {
    /// Wraps `token`.
    pub fn new(token: impl Into<String>) -> Self {
        CallerToken(secrecy::SecretString::from(token.into()))
    }

    /// The token, to send to the authorization server (and nowhere else).
    pub fn expose(&self) -> &str {
        secrecy::ExposeSecret::expose_secret(&self.0)
    }
}

impl std::fmt::Debug for CallerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl PartialEq for CallerToken {
    fn eq(&self, other: &Self) -> bool {
        self.expose() == other.expose()
    }
}

impl Eq for CallerToken {}

impl Identity {
    /// An identity with no roles of its own.
    pub fn new(user: impl Into<String>, source: IdentitySource) -> Self {
        Self { user: user.into(), roles: Vec::new(), source, token: None }
    }

    /// The same identity holding the bearer token that proved it.
    #[must_use]
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(CallerToken::new(token));
        self
    }

    /// The same identity with these roles (repeats dropped).
    #[must_use]
    pub fn with_roles<I, S>(mut self, roles: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.roles.clear();
        for r in roles {
            let r = r.into();
            if !self.roles.contains(&r) {
                self.roles.push(r);
            }
        }
        self
    }
}
