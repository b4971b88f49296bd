//! The parser of a `url:` server's `auth:` block (issue 35): its raw form
//! and the checks that turn it into a [`ServerAuth`] (the types live in
//! `auth.rs`). Every problem points at the value at fault (file, line,
//! column); secrets (`client_secret`, and anything else written as
//! `${VAR}`) are expanded and recorded so that no message shows them.
//!
//! May import the config's `${VAR}` expansion (through the closure it is
//! given), the located YAML tree and the settings types; nothing above them.

use secrecy::SecretString;
use serde::Deserialize;
use url::Url;

use super::auth::{ClientAuthMethod, OAuthSettings, PerUserHeadersSettings, ServerAuth, TokenExchangeSettings};
use crate::yaml::Node;

/// `auth:` as written. Unknown keys are refused by the reader, at the key.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAuth {
    #[serde(rename = "type")]
    kind: Option<String>,
    headers: Option<Vec<String>>,
    client_id: Option<String>,
    client_secret: Option<String>,
    client_auth: Option<String>,
    scopes: Option<Vec<String>>,
    authorization_server: Option<String>,
    resource: Option<String>,
    token_endpoint: Option<String>,
    issuer: Option<String>,
    audience: Option<String>,
    subject_token_type: Option<String>,
}

/// The `type:` values, as written in a config.
pub(super) const AUTH_TYPES: &[&str] = &["static", "per_user_headers", "token_exchange", "oauth"];

/// RFC 8693's access-token type, the default `subject_token_type`.
pub(super) const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";

/// What checking one `auth:` block needs from its server entry.
pub(super) struct AuthCx<'a> {
    /// The server's name, for messages.
    pub(super) server: &'a str,
    /// The `auth:` node (to locate a value), when the parser saw it.
    pub(super) node: Option<&'a Node<'a>>,
    /// Where the server entry is, for a problem with no better place.
    pub(super) at: (Option<usize>, Option<usize>),
    /// Whether the server is a `url:` one (the only kind `auth:` applies to).
    pub(super) url: bool,
    /// Records a located problem.
    pub(super) fail: &'a dyn Fn(Option<usize>, Option<usize>, String),
    /// `${VAR}` expansion, recording the values as the server's secrets.
    pub(super) expand: &'a dyn Fn(&str) -> String,
}

impl AuthCx<'_> {
    /// Where the value of `key` is (else the block, else the server).
    fn at(&self, key: &str) -> (Option<usize>, Option<usize>) {
        match self.node.and_then(|n| n.get(key)).or(self.node) {
            Some(v) => (Some(v.pos.line), Some(v.pos.column)),
            None => self.at,
        }
    }

    fn fail_at(&self, key: &str, message: String) {
        let (line, column) = self.at(key);
        (self.fail)(line, column, format!("server `{}`: {message}", self.server));
    }
}

/// The block checked; `ServerAuth::Static` with the problems recorded when
/// it is not valid (the entry then fails as a whole).
pub(super) fn auth(cx: &AuthCx<'_>, raw: &RawAuth) -> ServerAuth {
    if !cx.url {
        cx.fail_at("type", "`auth` only applies to `url` servers (a `command` server has one shared identity)".into());
        return ServerAuth::Static;
    }
    let Some(kind) = raw.kind.as_deref() else {
        cx.fail_at("type", format!("`auth` needs a `type`: one of {}", AUTH_TYPES.join(", ")));
        return ServerAuth::Static;
    };
    // The keys each type takes; any other present is refused at its key.
    let allowed: &[&str] = match kind {
        "static" => &[],
        "per_user_headers" => &["headers"],
        "token_exchange" => &[
            "client_id",
            "client_secret",
            "client_auth",
            "scopes",
            "resource",
            "token_endpoint",
            "issuer",
            "audience",
            "subject_token_type",
        ],
        "oauth" => &[
            "client_id",
            "client_secret",
            "client_auth",
            "scopes",
            "authorization_server",
            "resource",
            "token_endpoint",
        ],
        other => {
            cx.fail_at("type", format!("unknown auth type `{other}`; use one of {}", AUTH_TYPES.join(", ")));
            return ServerAuth::Static;
        }
    };
    let present = [
        ("headers", raw.headers.is_some()),
        ("client_id", raw.client_id.is_some()),
        ("client_secret", raw.client_secret.is_some()),
        ("client_auth", raw.client_auth.is_some()),
        ("scopes", raw.scopes.is_some()),
        ("authorization_server", raw.authorization_server.is_some()),
        ("resource", raw.resource.is_some()),
        ("token_endpoint", raw.token_endpoint.is_some()),
        ("issuer", raw.issuer.is_some()),
        ("audience", raw.audience.is_some()),
        ("subject_token_type", raw.subject_token_type.is_some()),
    ];
    let mut ok = true;
    for (key, _) in present.iter().filter(|(k, set)| *set && !allowed.contains(k)) {
        cx.fail_at(key, format!("`{key}` does not apply to `auth: {{ type: {kind} }}`"));
        ok = false;
    }
    let auth = match kind {
        "static" => ServerAuth::Static,
        "per_user_headers" => {
            let headers = raw.headers.clone().unwrap_or_default();
            if headers.is_empty() {
                cx.fail_at("headers", "`per_user_headers` needs `headers`: the header names each user's secrets fill (e.g. [Authorization])".into());
                ok = false;
            }
            for h in &headers {
                if http::HeaderName::from_bytes(h.as_bytes()).is_err() {
                    cx.fail_at("headers", format!("`{h}` is not a valid HTTP header name"));
                    ok = false;
                }
            }
            ServerAuth::PerUserHeaders(PerUserHeadersSettings { headers })
        }
        "token_exchange" => {
            let client = client(cx, raw, &mut ok);
            let token_endpoint = url_of(cx, "token_endpoint", raw.token_endpoint.as_deref(), &mut ok);
            let issuer = issuer_of(cx, "issuer", raw.issuer.as_deref(), &mut ok);
            if raw.token_endpoint.is_none() && raw.issuer.is_none() {
                cx.fail_at("type", "`token_exchange` needs `token_endpoint` or `issuer` (to discover it)".into());
                ok = false;
            }
            ServerAuth::TokenExchange(TokenExchangeSettings {
                token_endpoint,
                issuer,
                audience: raw.audience.as_deref().map(|a| (cx.expand)(a)),
                resource: raw.resource.as_deref().map(|r| (cx.expand)(r)),
                scopes: raw.scopes.clone().unwrap_or_default(),
                client_id: client.0,
                client_secret: client.1,
                client_auth: client.2,
                subject_token_type: raw.subject_token_type.clone().unwrap_or_else(|| ACCESS_TOKEN_TYPE.into()),
            })
        }
        _ => {
            let client = client(cx, raw, &mut ok);
            let authorization_server =
                issuer_of(cx, "authorization_server", raw.authorization_server.as_deref(), &mut ok);
            ServerAuth::OAuth(OAuthSettings {
                client_id: client.0,
                client_secret: client.1,
                client_auth: client.2,
                scopes: raw.scopes.clone().unwrap_or_default(),
                authorization_server,
                resource: raw.resource.as_deref().map(|r| (cx.expand)(r)),
                token_endpoint: url_of(cx, "token_endpoint", raw.token_endpoint.as_deref(), &mut ok),
            })
        }
    };
    if ok { auth } else { ServerAuth::Static }
}

/// `client_id` (required), `client_secret` and `client_auth` (by default
/// `basic` with a secret, `none` without).
fn client(cx: &AuthCx<'_>, raw: &RawAuth, ok: &mut bool) -> (String, Option<SecretString>, ClientAuthMethod) {
    let id = match raw.client_id.as_deref().map(|c| (cx.expand)(c)) {
        Some(id) if !id.is_empty() => id,
        _ => {
            cx.fail_at(
                "client_id",
                "this auth type needs `client_id` (a registered client, or the URL of a client ID metadata document)"
                    .into(),
            );
            *ok = false;
            String::new()
        }
    };
    let secret = raw.client_secret.as_deref().map(|s| SecretString::from((cx.expand)(s)));
    let method = match raw.client_auth.as_deref() {
        None if secret.is_some() => ClientAuthMethod::Basic,
        None => ClientAuthMethod::None,
        Some("basic" | "client_secret_basic") => ClientAuthMethod::Basic,
        Some("post" | "client_secret_post") => ClientAuthMethod::Post,
        Some("none") => ClientAuthMethod::None,
        Some(other) => {
            cx.fail_at("client_auth", format!("client_auth must be one of basic, post, none (got `{other}`)"));
            *ok = false;
            ClientAuthMethod::None
        }
    };
    if method != ClientAuthMethod::None && secret.is_none() {
        cx.fail_at("client_auth", "`client_auth` basic or post needs `client_secret`".into());
        *ok = false;
    }
    (id, secret, method)
}

/// An `http(s)` URL, expanded; the problem recorded at `key` otherwise.
fn url_of(cx: &AuthCx<'_>, key: &str, value: Option<&str>, ok: &mut bool) -> Option<Url> {
    let v = (cx.expand)(value?);
    match Url::parse(&v) {
        Ok(u) if matches!(u.scheme(), "http" | "https") => Some(u),
        _ => {
            cx.fail_at(
                key,
                format!("{key} must be an http:// or https:// URL (got `{}`)", crate::cause::redact_url(&v)),
            );
            *ok = false;
            None
        }
    }
}

/// An issuer's URL ([`url_of`]) without a query or fragment (RFC 8414 §2).
fn issuer_of(cx: &AuthCx<'_>, key: &str, value: Option<&str>, ok: &mut bool) -> Option<Url> {
    let u = url_of(cx, key, value, ok)?;
    if u.query().is_some() || u.fragment().is_some() {
        cx.fail_at(
            key,
            format!(
                "{key} is an issuer URL, which has no query or fragment (got `{}`); remove what follows `?` or `#`",
                crate::cause::redact_url(u.as_str())
            ),
        );
        *ok = false;
        return None;
    }
    Some(u)
}
