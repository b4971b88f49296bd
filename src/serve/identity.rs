//! Who the caller is, decided once per request, first match wins:
//!
//! 0. With `serve.jwt`: a bearer that is a JWT (three base64url parts) is
//!    verified ([`crate::identity::JwtVerifier`], in `verified`); a refused one is
//!    401 with the reason in `WWW-Authenticate`, never passed on to step 1 or later.
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

use crate::settings::ServeSettings;
use axum::http::HeaderMap;
use secrecy::ExposeSecret;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::ApiError;

/// The SHA-256 of a caller key, as `serve.keys` stores it (hex).
pub fn hash_key(key: &str) -> String {
    Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

use crate::identity::Identity;
/// How the caller was identified.
pub(super) use crate::identity::IdentitySource as Source;

/// Who is calling, as far as the headers tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum FromHeaders {
    /// Decided: the user, their identity provider's roles and how.
    User(Identity),
    /// Only the body can tell (`user_from_body`); `anonymous_user` if it does not.
    Body,
}

/// The identity the headers give (steps 1, 2 and 4 of the module docs),
/// before any body is read. A malformed `Authorization` (not `Bearer TOKEN`)
/// is refused whatever else the request carries, and so is a user header
/// sent twice or naming an invalid user.
pub(super) fn from_headers(s: &ServeSettings, headers: &HeaderMap) -> Result<FromHeaders, ApiError> {
    let auth: Vec<_> = headers.get_all(axum::http::header::AUTHORIZATION).iter().collect();
    if auth.len() > 1 {
        return Err(ApiError::unauthorized("invalid_authorization", "Send one `Authorization` header, not several"));
    }
    if !auth.is_empty() && bearer(headers).is_none() {
        return Err(ApiError::unauthorized(
            "invalid_authorization",
            "The `Authorization` header is not `Bearer KEY`; send `Authorization: Bearer KEY` or no Authorization",
        ));
    }
    if !s.keys.is_empty()
        && !s.forward_authorization
        && let Some(key) = bearer(headers)
    {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        // Every digest is compared, so the time taken says nothing about
        // which (or whether one) matched.
        let mut found: Option<&str> = None;
        for k in &s.keys {
            if bool::from(k.sha256.expose_secret().ct_eq(&digest[..])) {
                found = Some(&k.user);
            }
        }
        return found.map(|u| FromHeaders::User(Identity::new(u, Source::Key))).ok_or_else(|| {
            ApiError::unauthorized(
                "invalid_api_key",
                "Incorrect API key provided: it is not one of this proxy's keys (serve.keys)",
            )
        });
    }
    if let Some(h) = &s.user_header {
        let values: Vec<_> = headers.get_all(h.as_str()).iter().collect();
        if values.len() > 1 {
            return Err(ApiError::bad_request(
                "invalid_user",
                format!("The `{h}` header was sent {} times; send it once", values.len()),
            ));
        }
        if let Some(v) = values.first() {
            let v = v.to_str().map_err(|_| {
                ApiError::bad_request("invalid_user", format!("The `{h}` header is not visible ASCII text"))
            })?;
            let v = v.trim();
            if !v.is_empty() {
                return checked(v, &format!("the `{h}` header"))
                    .map(|u| FromHeaders::User(Identity::new(u, Source::Header)));
            }
        }
    }
    if s.user_from_body {
        return Ok(FromHeaders::Body);
    }
    anonymous_or_refuse(s)
}

/// Step 0, with `serve.jwt`: the identity a JWT bearer proves; `None` when
/// the bearer is not a JWT (or there is none, or several: step 1 refuses
/// those). A refused token is 401 with `WWW-Authenticate`, counted by
/// `failed` under its reason; the token itself is never logged.
pub(super) async fn verified(
    jwt: Option<&crate::identity::JwtVerifier>,
    headers: &HeaderMap,
    failed: impl Fn(&str),
) -> Result<Option<Identity>, ApiError> {
    let Some(v) = jwt else { return Ok(None) };
    if headers.get_all(axum::http::header::AUTHORIZATION).iter().count() != 1 {
        return Ok(None);
    }
    let Some(token) = bearer(headers).filter(|t| crate::identity::looks_like_jwt(t)) else { return Ok(None) };
    match v.verify(token).await {
        Ok(who) => Ok(Some(who)),
        Err(e) => {
            let reason = e.auth_failure().map_or("malformed", crate::identity::AuthFailure::as_str);
            failed(reason);
            let detail = match &e {
                crate::Error::Unauthenticated { detail, .. } => detail.clone(),
                other => other.to_string(),
            };
            tracing::info!(reason, "bearer token refused: {detail}");
            Err(ApiError::invalid_token(&detail))
        }
    }
}

/// Step 3 then 4: the body's `user` / `safety_identifier` (validated), else `anonymous_user`.
pub(super) fn from_body(s: &ServeSettings, body: Option<&super::body::JsonObject<'_>>) -> Result<Identity, ApiError> {
    if let Some(body) = body {
        for k in ["user", "safety_identifier"] {
            if let Some(u) = body.str_field(k) {
                let u = u.trim();
                if !u.is_empty() {
                    return checked(u, &format!("the body's `{k}`")).map(|u| Identity::new(u, Source::Body));
                }
            }
        }
    }
    match anonymous_or_refuse(s)? {
        FromHeaders::User(who) => Ok(who),
        FromHeaders::Body => unreachable!("anonymous_or_refuse decides"),
    }
}

fn anonymous_or_refuse(s: &ServeSettings) -> Result<FromHeaders, ApiError> {
    match &s.anonymous_user {
        Some(anon) => Ok(FromHeaders::User(Identity::new(anon.clone(), Source::Anonymous))),
        None => Err(ApiError::unauthorized("missing_identity", &missing_identity_message(s))),
    }
}

/// A user name from outside, refused (400) unless it is one a policy could name.
fn checked(name: &str, from: &str) -> Result<String, ApiError> {
    match crate::access::user_name_problem(name) {
        None => Ok(name.to_owned()),
        Some(problem) => {
            Err(ApiError::bad_request("invalid_user", format!("The user in {from} is refused: {problem}")))
        }
    }
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
pub(super) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(axum::http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && !token.contains([' ', '\t'])).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::KeyDigest;

    fn settings() -> ServeSettings {
        let digest = |k: &str| -> secrecy::SecretSlice<u8> { Sha256::digest(k.as_bytes()).to_vec().into() };
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

    /// The whole decision: headers, then the body.
    fn identify(s: &ServeSettings, h: &HeaderMap, body: Option<&serde_json::Value>) -> Result<String, ApiError> {
        match from_headers(s, h)? {
            FromHeaders::User(who) => Ok(who.user),
            FromHeaders::Body => {
                let bytes = body.map(|b| axum::body::Bytes::from(b.to_string()));
                let body = bytes.as_ref().map(|b| super::super::body::JsonObject::parse(b, 64).unwrap());
                from_body(s, body.as_ref()).map(|who| who.user)
            }
        }
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
    fn malformed_credentials_and_names_are_refused_not_skipped() {
        let anon = ServeSettings { anonymous_user: Some("guest".into()), ..settings() };
        for auth in ["Basic YTpi", "Bearer", "Bearer ", "Bearer a b", "kb"] {
            let e = identify(&anon, &headers(&[("authorization", auth), ("x-user", "dave")]), None);
            assert_eq!(e.unwrap_err().status, 401, "{auth:?}");
        }
        let mut twice = headers(&[("x-user", "dave")]);
        twice.append("x-user", "alice".parse().unwrap());
        assert_eq!(identify(&anon, &twice, None).unwrap_err().status, 400);
        assert_eq!(identify(&anon, &headers(&[("x-user", "a\tb")]), None).unwrap_err().status, 400);
        let long = "x".repeat(crate::access::MAX_USER_NAME_BYTES + 1);
        assert_eq!(identify(&anon, &headers(&[("x-user", &long)]), None).unwrap_err().status, 400);
        let forged = serde_json::json!({"user": "x\nFAKE LOG LINE user=alice"});
        assert_eq!(identify(&anon, &headers(&[]), Some(&forged)).unwrap_err().status, 400);
    }

    #[test]
    fn bearer_is_ignored_without_keys() {
        let s = ServeSettings { anonymous_user: Some("guest".into()), ..ServeSettings::default() };
        assert_eq!(identify(&s, &headers(&[("authorization", "Bearer sk-upstream")]), None).unwrap(), "guest");
    }
}
