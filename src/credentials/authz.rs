//! Talking to an authorization server: finding it (RFC 9728 protected
//! resource metadata from an MCP server's `401`, then RFC 8414 authorization
//! server metadata, then OpenID discovery) and calling its token endpoint
//! (client authentication, the OAuth error answer turned into an
//! [`Error::Authorization`] that says whether the user must authorize again).
//!
//! Shared by token exchange (`exchange.rs`) and the authorization code flow
//! (`oauth.rs`). No token is logged or put in an error: only the endpoint,
//! the HTTP status and the server's `error` code.
//!
//! Layer: sources (credentials). Imports the settings (`config::auth`),
//! `cause` and the error type.

use std::time::{Duration, SystemTime};

use secrecy::{ExposeSecret, SecretString};
use url::Url;

use super::TokenSet;
use crate::cause::{redact_url, reqwest_cause};
use crate::config::ClientAuthMethod;
use crate::error::{Error, Result};

/// The largest metadata document or token answer read (a hostile server
/// cannot make us buffer more).
const MAX_ANSWER_BYTES: usize = 256 * 1024;

/// What an authorization server publishes that we use (RFC 8414).
#[derive(Debug, Clone)]
pub(crate) struct AuthServerMetadata {
    pub(crate) issuer: String,
    pub(crate) authorization_endpoint: Option<Url>,
    pub(crate) token_endpoint: Url,
    /// `authorization_response_iss_parameter_supported` (RFC 9207): the
    /// redirect must then carry `iss`.
    pub(crate) iss_in_response: bool,
}

/// What an MCP server publishes about itself (RFC 9728).
#[derive(Debug, Clone)]
pub(crate) struct ResourceMetadata {
    /// The server's resource identifier: the audience of its tokens.
    pub(crate) resource: String,
    pub(crate) authorization_servers: Vec<Url>,
    pub(crate) scopes_supported: Vec<String>,
}

/// How we authenticate at a token endpoint.
pub(crate) struct ClientCredentials<'a> {
    pub(crate) client_id: &'a str,
    pub(crate) client_secret: Option<&'a SecretString>,
    pub(crate) method: ClientAuthMethod,
}

/// The client every call to an authorization server goes through: no
/// redirects followed, and each call (connect, answer and body) given up
/// after `timeout` (`credentials.auth_timeout_ms`), so that a server that
/// accepts and never answers cannot hold anyone.
pub(crate) fn http_client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(timeout)
        .connect_timeout(timeout)
        .build()
        .unwrap_or_default()
}

/// GETs `url` and parses its JSON answer (bounded).
async fn get_json(http: &reqwest::Client, server: &str, url: &Url) -> Result<(u16, serde_json::Value)> {
    let r = http
        .get(url.clone())
        .header("accept", "application/json")
        .send()
        .await
        .map_err(|e| unreachable_at(server, url, &e))?;
    let status = r.status().as_u16();
    let body = bounded_body(r, server, url).await?;
    Ok((status, serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null)))
}

async fn bounded_body(mut r: reqwest::Response, server: &str, url: &Url) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(chunk) = r.chunk().await.map_err(|e| unreachable_at(server, url, &e))? {
        if out.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(Error::authorization(
                server,
                format!("the answer of {} is larger than {MAX_ANSWER_BYTES} bytes", redact_url(url.as_str())),
                false,
            ));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

fn unreachable_at(server: &str, url: &Url, e: &reqwest::Error) -> Error {
    Error::authorization(server, format!("cannot reach {}: {}", redact_url(url.as_str()), reqwest_cause(e)), false)
}

/// The authorization server metadata of `issuer`: RFC 8414
/// (`/.well-known/oauth-authorization-server`, path-inserted), then OpenID
/// discovery; its `issuer` must be `issuer` exactly.
pub(crate) async fn auth_server_metadata(
    http: &reqwest::Client,
    server: &str,
    issuer: &Url,
) -> Result<AuthServerMetadata> {
    let path = issuer.path().trim_end_matches('/');
    let mut candidates = Vec::new();
    for well_known in ["oauth-authorization-server", "openid-configuration"] {
        let mut u = issuer.clone();
        u.set_path(&format!("/.well-known/{well_known}{path}"));
        candidates.push(u);
    }
    let mut oidc = issuer.clone();
    oidc.set_path(&format!("{path}/.well-known/openid-configuration"));
    candidates.push(oidc);
    let expected = issuer.as_str().trim_end_matches('/');
    for url in candidates {
        let Ok((200, doc)) = get_json(http, server, &url).await else { continue };
        let Some(found) = doc["issuer"].as_str() else { continue };
        if found.trim_end_matches('/') != expected {
            return Err(Error::authorization(
                server,
                format!("the authorization server metadata at {url} names another issuer (`{found}`)"),
                false,
            ));
        }
        let endpoint = |k: &str| doc[k].as_str().and_then(|s| Url::parse(s).ok());
        let Some(token_endpoint) = endpoint("token_endpoint") else { continue };
        return Ok(AuthServerMetadata {
            issuer: found.to_owned(),
            authorization_endpoint: endpoint("authorization_endpoint"),
            token_endpoint,
            iss_in_response: doc["authorization_response_iss_parameter_supported"] == true,
        });
    }
    Err(Error::authorization(server, format!("no authorization server metadata found for issuer {issuer}"), false))
}

/// The protected resource metadata of the MCP server at `server_url`: the
/// URL its `401` names (`WWW-Authenticate: Bearer resource_metadata=...`),
/// else the well-known URL (path-inserted, then at the root).
pub(crate) async fn resource_metadata(
    http: &reqwest::Client,
    server: &str,
    server_url: &Url,
) -> Result<ResourceMetadata> {
    let mut candidates = Vec::new();
    // An unauthenticated request: a protected MCP server answers 401 with where its metadata is.
    let probe = http
        .post(server_url.clone())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":0,"method":"ping"}"#)
        .send()
        .await
        .map_err(|e| unreachable_at(server, server_url, &e))?;
    if let Some(u) = probe
        .headers()
        .get_all("www-authenticate")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| challenge_param(v, "resource_metadata"))
        .and_then(|u| server_url.join(&u).ok())
    {
        candidates.push(u);
    }
    let path = server_url.path().trim_end_matches('/');
    let mut inserted = server_url.clone();
    inserted.set_path(&format!("/.well-known/oauth-protected-resource{path}"));
    inserted.set_query(None);
    candidates.push(inserted);
    let mut root = server_url.clone();
    root.set_path("/.well-known/oauth-protected-resource");
    root.set_query(None);
    candidates.push(root);
    for url in candidates {
        // The metadata must be on the server's own origin: a 401 cannot send us elsewhere.
        if url.origin() != server_url.origin() {
            continue;
        }
        let Ok((200, doc)) = get_json(http, server, &url).await else { continue };
        let Some(resource) = doc["resource"].as_str() else { continue };
        let list = |k: &str| -> Vec<String> {
            doc[k]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
                .unwrap_or_default()
        };
        return Ok(ResourceMetadata {
            resource: resource.to_owned(),
            authorization_servers: list("authorization_servers").iter().filter_map(|s| Url::parse(s).ok()).collect(),
            scopes_supported: list("scopes_supported"),
        });
    }
    Err(Error::authorization(
        server,
        format!(
            "{} publishes no protected resource metadata (RFC 9728); set `authorization_server` in its `auth:` block",
            redact_url(server_url.as_str())
        ),
        false,
    ))
}

/// The value of `name` in a `WWW-Authenticate: Bearer k="v", ...` challenge.
pub(crate) fn challenge_param(header: &str, name: &str) -> Option<String> {
    let rest = header.trim().strip_prefix("Bearer").or_else(|| header.trim().strip_prefix("bearer"))?;
    for part in rest.split(',') {
        let (k, v) = part.trim().split_once('=')?;
        if k.trim().eq_ignore_ascii_case(name) {
            return Some(v.trim().trim_matches('"').to_owned());
        }
    }
    None
}

/// POSTs `form` to the token endpoint with the client's authentication and
/// reads the token answer for `resource`.
///
/// # Errors
/// [`Error::Authorization`]: unreachable, or refused (`reauthorize` when
/// the server says `invalid_grant`: the code, refresh or subject token is
/// no good any more), or the access token is a JWT for another audience
/// than `resource` (or the form's `audience`).
pub(crate) async fn token_request(
    http: &reqwest::Client,
    server: &str,
    endpoint: &Url,
    client: &ClientCredentials<'_>,
    form: &[(&str, &str)],
    resource: &str,
) -> Result<TokenSet> {
    let mut req = http.post(endpoint.clone()).header("accept", "application/json");
    // The serializer is not `Send`: the body is finished before any await.
    let body = {
        let mut body = url::form_urlencoded::Serializer::new(String::new());
        for (k, v) in form {
            body.append_pair(k, v);
        }
        match (client.method, client.client_secret) {
            (ClientAuthMethod::Basic, Some(secret)) => {
                // RFC 6749 §2.3.1: both parts form-encoded before the Basic encoding.
                let enc = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
                req = req.basic_auth(enc(client.client_id), Some(enc(secret.expose_secret())));
            }
            (ClientAuthMethod::Post, Some(secret)) => {
                body.append_pair("client_id", client.client_id);
                body.append_pair("client_secret", secret.expose_secret());
            }
            _ => {
                body.append_pair("client_id", client.client_id);
            }
        }
        body.finish()
    };
    let r = req
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .map_err(|e| unreachable_at(server, endpoint, &e))?;
    let status = r.status().as_u16();
    let raw = bounded_body(r, server, endpoint).await?;
    let doc: serde_json::Value = serde_json::from_slice(&raw).unwrap_or(serde_json::Value::Null);
    if status != 200 {
        let code = doc["error"].as_str().unwrap_or("no error code");
        // The description is the server's text, cut short. A server that echoes what it was sent (a code, a refresh or subject token) does not get it into
        // our messages and logs.
        let desc = doc["error_description"].as_str().map(|d| {
            let mut d = d.to_owned();
            let secret = client.client_secret.map(|s| s.expose_secret());
            for v in form.iter().map(|(_, v)| *v).chain(secret).filter(|v| v.len() >= 8) {
                d = d.replace(v, "…");
            }
            format!(": {}", crate::cause::one_line(&d, 200))
        });
        return Err(Error::authorization(
            server,
            format!(
                "the token endpoint {} refused ({status}, `{code}`{})",
                redact_url(endpoint.as_str()),
                desc.unwrap_or_default()
            ),
            code == "invalid_grant",
        ));
    }
    let Some(access) = doc["access_token"].as_str() else {
        return Err(Error::authorization(
            server,
            format!("the token endpoint {} answered without an access_token", redact_url(endpoint.as_str())),
            false,
        ));
    };
    if let Some(kind) = doc["token_type"].as_str()
        && !kind.eq_ignore_ascii_case("bearer")
    {
        return Err(Error::authorization(server, format!("token type `{kind}` is not supported (only Bearer)"), false));
    }
    // A JWT for another audience is refused: kept and sent to this server, it would hand it another's token.
    let audiences: Vec<&str> =
        std::iter::once(resource).chain(form.iter().filter(|(k, _)| *k == "audience").map(|(_, v)| *v)).collect();
    super::discovery::check_audience(server, endpoint, access, &audiences)?;
    let mut set = TokenSet::bearer(SecretString::from(access.to_owned()), resource);
    set.refresh_token = doc["refresh_token"].as_str().map(|s| SecretString::from(s.to_owned()));
    set.expires_at = doc["expires_in"].as_u64().map(|s| SystemTime::now() + Duration::from_secs(s));
    set.scopes = doc["scope"].as_str().map(|s| s.split(' ').map(str::to_owned).collect()).unwrap_or_default();
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::challenge_param;

    #[test]
    fn challenge_params() {
        let h =
            r#"Bearer error="invalid_token", resource_metadata="http://h/.well-known/oauth-protected-resource/mcp""#;
        assert_eq!(
            challenge_param(h, "resource_metadata").as_deref(),
            Some("http://h/.well-known/oauth-protected-resource/mcp")
        );
        assert_eq!(challenge_param(h, "scope"), None);
        assert_eq!(challenge_param("Basic realm=x", "realm"), None);
    }
}
