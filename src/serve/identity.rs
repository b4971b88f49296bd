//! Who the caller is, decided once per request, first match wins:
//!
//! 1. `Authorization: Bearer KEY` whose SHA-256 is in `serve.keys` (compared
//!    in constant time against every digest; the key itself is never stored
//!    or logged). A bearer key that is present but unknown is refused,
//!    whatever else the request carries. When no `keys` are configured (or
//!    `forward_authorization` is on, where the bearer is the upstream's own
//!    key) the bearer does not identify anyone and step 1 is skipped.
//! 2. The configured `user_header`: only safe behind a gateway that sets it
//!    and strips it from clients.
//! 3. The body's `user` / `safety_identifier`, when `user_from_body` is on.
//! 4. `anonymous_user`, when set; else the request is refused (401).

use axum::http::HeaderMap;
use mcp_context::ServeSettings;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::ApiError;

/// The SHA-256 of a caller key, as `serve.keys` stores it (hex).
pub fn hash_key(key: &str) -> String {
    Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// The user a request acts for (see the module docs for the order).
pub fn identify(s: &ServeSettings, headers: &HeaderMap, body: Option<&serde_json::Value>) -> Result<String, ApiError> {
    if !s.keys.is_empty()
        && !s.forward_authorization
        && let Some(key) = bearer(headers)
    {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        // Every digest is compared, so the time taken says nothing about
        // which (or whether one) matched.
        let mut found: Option<&str> = None;
        for k in &s.keys {
            if bool::from(k.sha256.ct_eq(&digest)) {
                found = Some(&k.user);
            }
        }
        return found.map(str::to_owned).ok_or_else(|| {
            ApiError::unauthorized(
                "invalid_api_key",
                "Incorrect API key provided: it is not one of this proxy's keys (serve.keys)",
            )
        });
    }
    if let Some(h) = &s.user_header
        && let Some(v) = headers.get(h.as_str()).and_then(|v| v.to_str().ok()).map(str::trim)
        && !v.is_empty()
    {
        return Ok(v.to_owned());
    }
    if s.user_from_body
        && let Some(body) = body
        && let Some(u) = ["user", "safety_identifier"]
            .iter()
            .find_map(|k| body.get(*k).and_then(|v| v.as_str()).map(str::trim).filter(|v| !v.is_empty()))
    {
        return Ok(u.to_owned());
    }
    if let Some(anon) = &s.anonymous_user {
        return Ok(anon.clone());
    }
    Err(ApiError::unauthorized("missing_identity", &missing_identity_message(s)))
}

fn missing_identity_message(s: &ServeSettings) -> String {
    let mut ways = Vec::new();
    if !s.keys.is_empty() && !s.forward_authorization {
        ways.push("`Authorization: Bearer KEY` with a key listed in serve.keys".to_owned());
    }
    if let Some(h) = &s.user_header {
        ways.push(format!("the `{h}` header"));
    }
    if s.user_from_body {
        ways.push("`user` or `safety_identifier` in the body".to_owned());
    }
    if ways.is_empty() {
        "No identity: this proxy has no way to identify callers configured (serve.keys, serve.user_header, \
         serve.user_from_body or serve.anonymous_user)"
            .to_owned()
    } else {
        format!("No identity: send {}", ways.join(", or "))
    }
}

/// The token of `Authorization: Bearer TOKEN`, if any.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(axum::http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim()).filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcp_context::KeyDigest;

    fn settings() -> ServeSettings {
        let digest = |k: &str| -> [u8; 32] { Sha256::digest(k.as_bytes()).into() };
        ServeSettings {
            keys: vec![
                KeyDigest { sha256: digest("ka"), user: "alice".into() },
                KeyDigest { sha256: digest("kb"), user: "bob".into() },
            ],
            user_header: Some("X-User".into()),
            user_from_body: true,
            ..ServeSettings::default()
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    #[test]
    fn known_vector() {
        assert_eq!(hash_key("test"), "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
    }

    #[test]
    fn order_and_refusals() {
        let s = settings();
        let body = serde_json::json!({"user": "carol"});
        assert_eq!(identify(&s, &headers(&[("authorization", "Bearer kb")]), Some(&body)).unwrap(), "bob");
        // An unknown key is refused even when a header or the body would name someone.
        let e = identify(&s, &headers(&[("authorization", "Bearer nope"), ("x-user", "dave")]), Some(&body));
        assert_eq!(e.unwrap_err().status, 401);
        assert_eq!(identify(&s, &headers(&[("x-user", "dave")]), Some(&body)).unwrap(), "dave");
        assert_eq!(identify(&s, &headers(&[]), Some(&body)).unwrap(), "carol");
        let b2 = serde_json::json!({"safety_identifier": "erin"});
        assert_eq!(identify(&s, &headers(&[]), Some(&b2)).unwrap(), "erin");
        assert_eq!(identify(&s, &headers(&[]), None).unwrap_err().status, 401);
        let anon = ServeSettings { anonymous_user: Some("guest".into()), ..settings() };
        assert_eq!(identify(&anon, &headers(&[]), None).unwrap(), "guest");
    }

    #[test]
    fn bearer_is_ignored_without_keys() {
        let s = ServeSettings { anonymous_user: Some("guest".into()), ..ServeSettings::default() };
        assert_eq!(identify(&s, &headers(&[("authorization", "Bearer sk-upstream")]), None).unwrap(), "guest");
    }
}
