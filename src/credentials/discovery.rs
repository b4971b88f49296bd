//! Discovering one `oauth` server's authorization server, and what that
//! discovery may believe (issue 47, items 2 and 4). What an MCP server or an
//! authorization server publishes is another party's word; these rules keep
//! it from sending a token to the wrong server or our requests and our
//! client secret where it likes:
//!
//! - the protected resource metadata's `resource` must be the server's own
//!   resource identifier (its `url`, or the configured `resource`): other
//!   metadata is refused (RFC 9728 §3.3). The `resource` indicator we send
//!   (authorization, code and refresh requests) is always ours, never the
//!   metadata's, so a token's audience is the server it is kept for;
//! - an authorization server named by that metadata must be an `https` URL,
//!   or plain `http` on a loopback host when the MCP server is itself on
//!   loopback (the operator's own machine); it carries no query, fragment or
//!   userinfo (an issuer has none, RFC 8414 §2). The first such one is used.
//!   One the operator configured (`authorization_server`) is taken as written;
//! - the token endpoint must be on the issuer's origin, unless the operator
//!   configured `token_endpoint`;
//! - a configured client secret is only sent to an authorization server the
//!   configuration names (`authorization_server`, or `token_endpoint`), or to
//!   a loopback one for a loopback server; discovery elsewhere with a secret
//!   is refused, saying what to configure;
//! - an access token that is a JWT whose `aud` does not name the resource
//!   asked for (or the configured `audience`) is refused ([`check_audience`]).
//!   Its signature is not checked here: that is the resource server's
//!   business; the payload alone says whom the token is for. Opaque tokens
//!   and JWTs without `aud` are accepted.
//!
//! Layer: sources (credentials). Imports the settings through `oauth.rs`'s
//! [`OAuthServer`], `authz.rs`, `cause` and the error type.

use base64::Engine;
use url::{Host, Url};

use super::authz::{self, AuthServerMetadata};
use super::oauth::OAuthServer;
use crate::cause::redact_url;
use crate::error::{Error, Result, quote};

/// What discovery found for one server.
#[derive(Clone)]
pub(super) struct Discovered {
    pub(super) meta: AuthServerMetadata,
    /// The resource indicator sent: always the configured one.
    pub(super) resource: String,
    pub(super) scopes: Vec<String>,
}

/// The discovery of `server` (configured as `cfg`) under the module's rules.
///
/// # Errors
/// [`Error::Authorization`]: metadata missing or unreachable, or refused by
/// a rule (the message names the values at fault and what to configure).
pub(super) async fn discover(http: &reqwest::Client, server: &str, cfg: &OAuthServer) -> Result<Discovered> {
    let s = &cfg.settings;
    let resource = s.resource.clone().unwrap_or_else(|| cfg.url.to_string());
    let (issuer, configured, scopes) = match &s.authorization_server {
        Some(issuer) => (issuer.clone(), true, Vec::new()),
        None => {
            let rm = authz::resource_metadata(http, server, &cfg.url).await?;
            check_resource(server, &resource, &rm.resource)?;
            (choose_issuer(server, &cfg.url, &rm.authorization_servers)?, false, rm.scopes_supported)
        }
    };
    let mut meta = authz::auth_server_metadata(http, server, &issuer).await?;
    match &s.token_endpoint {
        Some(endpoint) => meta.token_endpoint = endpoint.clone(),
        None => check_token_endpoint(server, &issuer, &meta.token_endpoint)?,
    }
    let trusted = configured || s.token_endpoint.is_some() || (is_loopback(&issuer) && is_loopback(&cfg.url));
    if s.client_secret.is_some() && !trusted {
        return Err(Error::authorization(
            server,
            format!(
                "its metadata names the authorization server {}, which the configuration does not name, and a client \
                 secret is only sent to one it names: set `authorization_server: {}` in the server's `auth:` block \
                 if that is the right one",
                redact_url(issuer.as_str()),
                redact_url(issuer.as_str())
            ),
            false,
        ));
    }
    Ok(Discovered { meta, resource, scopes: if s.scopes.is_empty() { scopes } else { s.scopes.clone() } })
}

/// RFC 9728 §3.3: the metadata's `resource` must be ours (`expected`).
fn check_resource(server: &str, expected: &str, named: &str) -> Result<()> {
    if same_resource(expected, named) {
        return Ok(());
    }
    Err(Error::authorization(
        server,
        format!(
            "its protected resource metadata names the resource {}, not its own {}: refused (RFC 9728 §3.3); if \
             that really is this server's resource identifier, set `resource` to it in the server's `auth:` block",
            quote(named),
            quote(expected)
        ),
        false,
    ))
}

/// Equal as URLs (normalised, a trailing `/` aside), else as strings.
fn same_resource(a: &str, b: &str) -> bool {
    let norm = |s: &str| Url::parse(s).map_or_else(|_| s.to_owned(), |u| u.to_string());
    norm(a).trim_end_matches('/') == norm(b).trim_end_matches('/')
}

/// The first authorization server of `named` that discovery may use for
/// the MCP server at `server_url`.
fn choose_issuer(server: &str, server_url: &Url, named: &[Url]) -> Result<Url> {
    let mut refused = Vec::new();
    for issuer in named {
        match issuer_refusal(server_url, issuer) {
            None => return Ok(issuer.clone()),
            Some(why) => refused.push(format!("{} ({why})", redact_url(issuer.as_str()))),
        }
    }
    let what = if refused.is_empty() {
        "its protected resource metadata names no authorization server".to_owned()
    } else {
        format!(
            "its protected resource metadata names no authorization server we may use: {}; set \
             `authorization_server` in its `auth:` block to the right one",
            refused.join("; ")
        )
    };
    Err(Error::authorization(server, what, false))
}

/// Why `issuer` (from metadata) may not be used, if it may not.
fn issuer_refusal(server_url: &Url, issuer: &Url) -> Option<&'static str> {
    if issuer.query().is_some() {
        return Some("an issuer carries no query");
    }
    if issuer.fragment().is_some() {
        return Some("an issuer carries no fragment");
    }
    if !issuer.username().is_empty() || issuer.password().is_some() {
        return Some("an issuer carries no credentials");
    }
    match issuer.scheme() {
        "https" => None,
        "http" if is_loopback(issuer) && is_loopback(server_url) => None,
        "http" => Some("plain http only for a loopback authorization server of a loopback MCP server"),
        _ => Some("not an https URL"),
    }
}

/// Whether `url`'s host is a loopback address (or `localhost`).
fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(Host::Ipv4(ip)) => ip.is_loopback(),
        Some(Host::Ipv6(ip)) => ip.is_loopback(),
        Some(Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

/// The token endpoint must be on the issuer's origin (else configured).
pub(super) fn check_token_endpoint(server: &str, issuer: &Url, endpoint: &Url) -> Result<()> {
    if endpoint.origin() == issuer.origin() {
        return Ok(());
    }
    Err(Error::authorization(
        server,
        format!(
            "the authorization server {} names a token endpoint on another origin ({}): refused; set \
             `token_endpoint` in the server's `auth:` block if that one is right",
            redact_url(issuer.as_str()),
            endpoint.origin().ascii_serialization()
        ),
        false,
    ))
}

/// Refuses `access_token` when it is a JWT whose `aud` names none of
/// `accepted` (the resource asked for, the configured `audience`).
///
/// # Errors
/// [`Error::Authorization`] naming the audience found and the one expected.
pub(super) fn check_audience(server: &str, endpoint: &Url, access_token: &str, accepted: &[&str]) -> Result<()> {
    let Some(aud) = jwt_audience(access_token) else { return Ok(()) };
    if aud.iter().any(|a| accepted.iter().any(|r| same_resource(a, r))) {
        return Ok(());
    }
    Err(Error::authorization(
        server,
        format!(
            "the token endpoint {} issued a token for another audience ({}), not for {}: refused, not stored",
            redact_url(endpoint.as_str()),
            quote(&aud.join(", ")),
            quote(accepted.first().copied().unwrap_or_default())
        ),
        false,
    ))
}

/// The `aud` of a JWT (three base64url parts, the middle one a JSON object
/// with `aud`); `None` for anything else (an opaque token).
fn jwt_audience(token: &str) -> Option<Vec<String>> {
    let mut parts = token.split('.');
    let (_, payload, _, None) = (parts.next()?, parts.next()?, parts.next()?, parts.next()) else { return None };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    match &claims["aud"] {
        serde_json::Value::String(s) => Some(vec![s.clone()]),
        serde_json::Value::Array(a) => Some(a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn which_authorization_servers_metadata_may_name() {
        let (local, remote) = (u("http://127.0.0.1:9/mcp"), u("https://drive.example/mcp"));
        assert_eq!(issuer_refusal(&remote, &u("https://login.example/tenant")), None);
        assert_eq!(issuer_refusal(&local, &u("http://127.0.0.1:8")), None);
        assert_eq!(issuer_refusal(&local, &u("http://localhost:8/t")), None);
        assert!(issuer_refusal(&remote, &u("http://127.0.0.1:8")).unwrap().contains("loopback"));
        assert!(issuer_refusal(&local, &u("http://10.0.0.1:8")).unwrap().contains("loopback"));
        assert!(issuer_refusal(&local, &u("http://127.0.0.1:8/a?confirm=yes")).unwrap().contains("query"));
        assert!(issuer_refusal(&remote, &u("https://login.example/#x")).unwrap().contains("fragment"));
        assert!(issuer_refusal(&remote, &u("https://a:b@login.example/")).unwrap().contains("credentials"));
        assert!(issuer_refusal(&remote, &u("ftp://login.example/")).is_some());
        // The first usable one is taken; none usable says why for each.
        let named = [u("http://127.0.0.1:8/x?y=1"), u("https://login.example")];
        assert_eq!(choose_issuer("s", &remote, &named).unwrap(), named[1]);
        let e = choose_issuer("s", &remote, &named[..1]).unwrap_err().to_string();
        assert!(e.contains("query") && !e.contains("y=1"), "{e}");
    }

    #[test]
    fn resources_token_endpoints_and_audiences() {
        assert!(check_resource("s", "http://h:1/mcp", "http://H:1/mcp/").is_ok());
        let e = check_resource("s", "http://h:1/mcp", "http://h:2/mcp").unwrap_err().to_string();
        assert!(e.contains("http://h:2/mcp") && e.contains("http://h:1/mcp"), "{e}");
        let issuer = u("https://login.example/t");
        assert!(check_token_endpoint("s", &issuer, &u("https://login.example/t/token")).is_ok());
        assert!(check_token_endpoint("s", &issuer, &u("https://other.example/token")).is_err());
        let b64 = |v: serde_json::Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        let jwt = |aud: serde_json::Value| format!("{}.{}.sig", b64(serde_json::json!({"alg": "RS256"})), b64(aud));
        let ep = u("https://login.example/token");
        let ok = ["https://drive.example/mcp"];
        assert!(check_audience("s", &ep, &jwt(serde_json::json!({"aud": "https://drive.example/mcp"})), &ok).is_ok());
        assert!(
            check_audience("s", &ep, &jwt(serde_json::json!({"aud": ["x", "https://drive.example/mcp"]})), &ok).is_ok()
        );
        assert!(check_audience("s", &ep, &jwt(serde_json::json!({"sub": "alice"})), &ok).is_ok(), "no aud");
        assert!(check_audience("s", &ep, "opaque-token", &ok).is_ok());
        let e = check_audience("s", &ep, &jwt(serde_json::json!({"aud": "https://payroll.example/mcp"})), &ok);
        let e = e.unwrap_err().to_string();
        assert!(e.contains("payroll.example") && e.contains("drive.example") && e.contains("not stored"), "{e}");
    }
}
