//! The one error type of the library.
//!
//! Every variant carries the context an operator needs to act (file and line,
//! server, resource id) so that callers never have to wrap it again. Secrets
//! never enter an error: config errors quote the *name* of an unset variable,
//! never an expanded value.
//!
//! Layer: bottom. Imports only `cause`.

use std::path::PathBuf;
use std::sync::Arc;

/// Everything that can go wrong in `mcp-context`.
///
/// `Clone` (single-flight reads hand one error to many waiters): the causes
/// that are not themselves `Clone` are held in an [`Arc`].
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration file could not be read or is invalid. Loading
    /// reports every problem it finds: the first here, the others (each an
    /// `Error::Config` too) in `more`, shown one per line.
    #[error("{}: {message}{}", location(path, *line, *column), more_lines(more))]
    Config {
        /// The config file.
        path: PathBuf,
        /// 1-based line, when the problem has one.
        line: Option<usize>,
        /// 1-based column, when the problem has one.
        column: Option<usize>,
        /// What is wrong and how to fix it.
        message: String,
        /// The other problems found in the same load, by position.
        more: Vec<Error>,
    },
    /// A policy file could not be read or is invalid. Nothing is injected.
    /// Loading reports every problem it finds: the first here, the others
    /// (each an `Error::Policy` too) in `more`, shown one per line.
    #[error("{}: {message}{}", location(path, *line, *column), more_lines(more))]
    Policy {
        /// The policy file (or folder).
        path: PathBuf,
        /// 1-based line, when the problem has one.
        line: Option<usize>,
        /// 1-based column, when the problem has one.
        column: Option<usize>,
        /// What is wrong and how to fix it.
        message: String,
        /// The other problems found in the same load, in file order and then by position.
        more: Vec<Error>,
    },
    /// A `server:uri` identifier is malformed.
    #[error("invalid resource identifier {}: {reason}", quote(input))]
    InvalidId {
        /// The identifier as given (shown escaped).
        input: String,
        /// Why it was rejected.
        reason: String,
    },
    /// No server of that name is configured.
    #[error("unknown server `{server}` (configured: {known})")]
    UnknownServer {
        /// The name asked for.
        server: String,
        /// The configured names, comma separated.
        known: String,
    },
    /// The server could not be reached when the hub connected.
    #[error("server `{server}` is not connected: {cause}")]
    ServerUnavailable {
        /// The server name.
        server: String,
        /// Why it failed, in words an operator can act on (`cannot start
        /// \`srv\`: No such file or directory`, `HTTP 401 from
        /// https://h/mcp`). Text on purpose, not a `source`: the transport's
        /// own errors name our dependencies' types and may quote a URL with
        /// its credentials or a header's value; this sentence was built
        /// from them with the server's secrets scrubbed, and is also what
        /// the server's status and `/readyz` show.
        cause: String,
    },
    /// The server says the resource does not exist (-32002, or -32602 from
    /// 2026-07-28 servers).
    #[error("resource not found: {id}")]
    NotFound {
        /// `server:uri` of the resource.
        id: String,
    },
    /// A request to a server took longer than its timeout.
    #[error("server `{server}` did not answer {what} within {after_ms} ms")]
    Timeout {
        /// The server name.
        server: String,
        /// The request, e.g. `resources/read demo://x`.
        what: String,
        /// The timeout that expired.
        after_ms: u64,
    },
    /// The server answered with a JSON-RPC error.
    #[error("server `{server}` failed {what}: {message} (code {code})")]
    Server {
        /// The server name.
        server: String,
        /// The request.
        what: String,
        /// JSON-RPC error code.
        code: i32,
        /// The server's message (at most 500 characters, the server's
        /// secrets scrubbed): data the server sent, not an error of ours.
        message: String,
    },
    /// The connection to the server is gone (process exited, socket closed).
    #[error("connection to server `{server}` closed during {what}")]
    TransportClosed {
        /// The server name.
        server: String,
        /// The request.
        what: String,
    },
    /// Any other protocol-level failure talking to a server.
    #[error("server `{server}`: {what}: {message}")]
    Protocol {
        /// The server name.
        server: String,
        /// The request.
        what: String,
        /// Details, in words, scrubbed of the server's secrets (text for
        /// the reason given on [`Error::ServerUnavailable`]'s `cause`).
        message: String,
    },
    /// The LLM endpoint failed.
    /// (The cause is part of the message, so it is not also a `source`,
    /// which would print it twice in a cause chain.)
    #[error("chat completion failed: {}", crate::cause::openai_cause(.0))]
    OpenAI(Arc<async_openai::error::OpenAIError>),
    /// Work moved off the async runtime (policy compilation, packing,
    /// tokenizer loading) panicked or was cancelled.
    #[error("{what} failed")]
    Task {
        /// What the task was doing, e.g. `policy loading`.
        what: &'static str,
        /// Why the task did not finish.
        #[source]
        source: Arc<tokio::task::JoinError>,
    },
    /// The trace exporter (`telemetry:`) cannot start.
    #[error("telemetry: {what}")]
    Telemetry {
        /// What went wrong, with what to fix.
        what: String,
    },
    /// The `serve` proxy cannot start or had to stop: a setting it cannot
    /// use, an address already in use, the HTTP server failing.
    #[error("{what}")]
    Serve {
        /// What went wrong, with what to fix.
        what: String,
        /// The underlying failure, when there is one.
        #[source]
        source: Option<Arc<std::io::Error>>,
    },
    /// The audit trail cannot be queried (`mcp-context audit`): no sink,
    /// PostgreSQL unreachable, a query refused, a file unreadable, a
    /// `since` that is not a time. (Writing
    /// records never fails a request: a failing sink drops and counts.)
    #[error("audit trail: {what}")]
    Audit {
        /// What went wrong, with what to fix.
        what: String,
        /// The underlying failure, when there is one.
        #[source]
        source: Option<Arc<dyn std::error::Error + Send + Sync>>,
    },
    /// A bearer token was refused: its signature, issuer, audience, lifetime
    /// or claims do not verify (the identity module's `JwtVerifier`). The token itself is
    /// never part of the error.
    #[error("token refused ({}): {detail}", reason.as_str())]
    Unauthenticated {
        /// Why, as one of a few words (also the metrics label).
        reason: AuthFailure,
        /// What exactly, for the caller and the log.
        detail: String,
        /// The verifier's own error, when there is one.
        #[source]
        source: Option<Arc<dyn std::error::Error + Send + Sync>>,
    },
    /// The identity provider's keys (its discovery document or JWKS) could
    /// not be fetched or read.
    #[error("identity provider keys: {what}")]
    Jwks {
        /// What failed, with the URL (without credentials).
        what: String,
        /// The underlying failure, when there is one.
        #[source]
        source: Option<Arc<dyn std::error::Error + Send + Sync>>,
    },
    /// A user's credential for an upstream server could not be obtained or
    /// renewed (token exchange, an authorization code, a refresh). No token
    /// is ever part of it. When `reauthorize` is true the user must connect
    /// again (`/auth/{server}/start`, `mcp-context auth login`): the grant
    /// was refused, expired or revoked; otherwise it is a configuration or
    /// network problem.
    #[error("server `{server}`: {what}")]
    Authorization {
        /// The server name.
        server: String,
        /// What failed, with what to do.
        what: String,
        /// Whether the user has to authorize again.
        reauthorize: bool,
    },
    /// The per-user credential store (`credentials:`) cannot be read or
    /// written, or a record in it does not open with the key (a wrong key,
    /// or a record moved to another user or server). Never carries a secret.
    #[error("credential store: {what}")]
    TokenStore {
        /// What failed, with what to fix.
        what: String,
        /// The underlying failure, when there is one.
        #[source]
        source: Option<Arc<dyn std::error::Error + Send + Sync>>,
    },
}

/// Why a token was refused ([`Error::Unauthenticated`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AuthFailure {
    /// Past its `exp` (beyond the leeway).
    Expired,
    /// Its `nbf` is still in the future.
    NotYetValid,
    /// The signature does not verify with the key it names.
    BadSignature,
    /// Its `aud` is not one of the configured audiences (or missing).
    WrongAudience,
    /// Its `iss` is not the configured issuer (or missing).
    WrongIssuer,
    /// It names a key id the provider does not publish (after a refresh, when one was allowed).
    UnknownKey,
    /// Its `alg` is not accepted (`none`, HMAC without a shared secret, or
    /// not the algorithm of the key it names).
    Algorithm,
    /// It is not a well-formed JWS.
    Malformed,
    /// A required claim (the user claim, `exp`, one of `required_claims`) is missing or unusable.
    MissingClaim,
}

impl AuthFailure {
    /// The reason as a short word, e.g. `bad_signature` (the metrics label).
    pub fn as_str(self) -> &'static str {
        match self {
            AuthFailure::Expired => "expired",
            AuthFailure::NotYetValid => "not_yet_valid",
            AuthFailure::BadSignature => "bad_signature",
            AuthFailure::WrongAudience => "wrong_audience",
            AuthFailure::WrongIssuer => "wrong_issuer",
            AuthFailure::UnknownKey => "unknown_key",
            AuthFailure::Algorithm => "algorithm",
            AuthFailure::Malformed => "malformed",
            AuthFailure::MissingClaim => "missing_claim",
        }
    }
}

impl From<async_openai::error::OpenAIError> for Error {
    fn from(e: async_openai::error::OpenAIError) -> Self {
        Error::OpenAI(Arc::new(e))
    }
}

impl Error {
    pub(crate) fn invalid_id(input: &str, reason: String) -> Self {
        Error::InvalidId { input: input.chars().take(200).collect(), reason }
    }

    /// True for "the resource does not exist".
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }

    /// The error of a task run with `spawn_blocking` that did not finish.
    pub(crate) fn task(what: &'static str) -> impl FnOnce(tokio::task::JoinError) -> Error {
        move |e| Error::Task { what, source: Arc::new(e) }
    }

    /// A proxy error ([`Error::Serve`]) saying `what`.
    #[cfg(feature = "serve")]
    pub(crate) fn serve(what: impl Into<String>) -> Self {
        Error::Serve { what: what.into(), source: None }
    }

    /// A proxy error saying `what`, caused by `e`.
    #[cfg(feature = "serve")]
    pub(crate) fn serve_io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |e| Error::Serve { what, source: Some(Arc::new(e)) }
    }

    /// An audit trail error ([`Error::Audit`]) saying `what`.
    pub(crate) fn audit(what: impl Into<String>) -> Self {
        Error::Audit { what: what.into(), source: None }
    }

    /// An audit trail error saying `what`, caused by `e`.
    #[cfg(feature = "postgres")]
    pub(crate) fn audit_by<E: std::error::Error + Send + Sync + 'static>(
        what: impl Into<String>,
    ) -> impl FnOnce(E) -> Error {
        let what = what.into();
        move |e| Error::Audit { what, source: Some(Arc::new(e)) }
    }

    /// Why a token was refused, for [`Error::Unauthenticated`].
    pub fn auth_failure(&self) -> Option<AuthFailure> {
        match self {
            Error::Unauthenticated { reason, .. } => Some(*reason),
            _ => None,
        }
    }

    /// An [`Error::Authorization`] for `server`.
    pub(crate) fn authorization(server: &str, what: impl Into<String>, reauthorize: bool) -> Self {
        Error::Authorization { server: server.to_owned(), what: what.into(), reauthorize }
    }

    /// True when the user has to authorize `server` again
    /// ([`Error::Authorization`] with `reauthorize`).
    pub fn needs_reauthorization(&self) -> bool {
        matches!(self, Error::Authorization { reauthorize: true, .. })
    }

    /// True for a request timeout.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }
}

fn location(path: &std::path::Path, line: Option<usize>, column: Option<usize>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!("{}:{l}:{c}", path.display()),
        (Some(l), None) => format!("{}:{l}", path.display()),
        _ => path.display().to_string(),
    }
}

/// The further problems of a config or policy load, one per line after the first.
fn more_lines(more: &[Error]) -> String {
    more.iter().map(|e| format!("\n{e}")).collect()
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Quotes user input for an error message, escaping anything unprintable and
/// cutting very long input so messages stay one readable line.
pub(crate) fn quote(s: &str) -> String {
    let mut out: String = s.chars().take(120).flat_map(char::escape_debug).collect();
    if s.chars().count() > 120 {
        out.push('…');
    }
    format!("`{out}`")
}
