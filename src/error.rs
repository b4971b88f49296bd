//! The one error type of the library.
//!
//! Every variant carries the context an operator needs to act (file and line,
//! server, resource id) so that callers never have to wrap it again. Secrets
//! never enter an error: config errors quote the *name* of an unset variable,
//! never an expanded value.
//!
//! Layer: bottom. Imports only `cause`.

use std::path::PathBuf;

/// Everything that can go wrong in `mcp-context`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration file could not be read or is invalid.
    #[error("{}: {message}", location(path, *line, *column))]
    Config {
        /// The config file.
        path: PathBuf,
        /// 1-based line, when the problem has one.
        line: Option<usize>,
        /// 1-based column, when the problem has one.
        column: Option<usize>,
        /// What is wrong and how to fix it.
        message: String,
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
        /// Why it failed.
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
        /// The server's message.
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
        /// Details.
        message: String,
    },
    /// The LLM endpoint failed.
    /// (The cause is part of the message, so it is not also a `source`,
    /// which would print it twice in a cause chain.)
    #[error("chat completion failed: {}", crate::cause::openai_cause(.0))]
    OpenAI(async_openai::error::OpenAIError),
    /// Anything else, with a message.
    #[error("{0}")]
    Other(String),
}

impl Error {
    pub(crate) fn invalid_id(input: &str, reason: String) -> Self {
        Error::InvalidId { input: input.chars().take(200).collect(), reason }
    }

    /// True for "the resource does not exist".
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }

    /// A copy for fan-out (single-flight reads hand one error to many
    /// waiters); the LLM error, which cannot be cloned, becomes its message.
    pub(crate) fn duplicate(&self) -> Error {
        match self {
            Error::Config { path, line, column, message } => {
                Error::Config { path: path.clone(), line: *line, column: *column, message: message.clone() }
            }
            Error::Policy { path, line, column, message, more } => Error::Policy {
                path: path.clone(),
                line: *line,
                column: *column,
                message: message.clone(),
                more: more.iter().map(Error::duplicate).collect(),
            },
            Error::InvalidId { input, reason } => Error::InvalidId { input: input.clone(), reason: reason.clone() },
            Error::UnknownServer { server, known } => {
                Error::UnknownServer { server: server.clone(), known: known.clone() }
            }
            Error::ServerUnavailable { server, cause } => {
                Error::ServerUnavailable { server: server.clone(), cause: cause.clone() }
            }
            Error::NotFound { id } => Error::NotFound { id: id.clone() },
            Error::Timeout { server, what, after_ms } => {
                Error::Timeout { server: server.clone(), what: what.clone(), after_ms: *after_ms }
            }
            Error::Server { server, what, code, message } => {
                Error::Server { server: server.clone(), what: what.clone(), code: *code, message: message.clone() }
            }
            Error::TransportClosed { server, what } => {
                Error::TransportClosed { server: server.clone(), what: what.clone() }
            }
            Error::Protocol { server, what, message } => {
                Error::Protocol { server: server.clone(), what: what.clone(), message: message.clone() }
            }
            Error::OpenAI(e) => Error::Other(format!("chat completion failed: {}", crate::cause::openai_cause(e))),
            Error::Other(m) => Error::Other(m.clone()),
        }
    }

    /// True for a request timeout.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }

    /// True for configuration and policy errors: the input files must be fixed.
    pub fn is_input(&self) -> bool {
        matches!(self, Error::Config { .. } | Error::Policy { .. } | Error::InvalidId { .. })
    }
}

fn location(path: &std::path::Path, line: Option<usize>, column: Option<usize>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!("{}:{l}:{c}", path.display()),
        (Some(l), None) => format!("{}:{l}", path.display()),
        _ => path.display().to_string(),
    }
}

/// The further problems of a policy load, one per line after the first.
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
