//! A vendor's own API upstream (Anthropic's Messages API, Gemini's API):
//! its own connection pool, the header its callers send their key in
//! (`x-api-key`, `x-goog-api-key`), which the identity chain reads as the
//! bearer it stands for, and the operator's key sent upstream in that same
//! header. Owns [`Vendor`]; imports the proxy's relay, identity and error
//! shape.

use std::borrow::Cow;

use crate::settings::ServeSettings;
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use secrecy::{ExposeSecret, SecretString};

use super::error::ApiError;
use super::identity;
use super::relay::Upstream;

/// A vendor's upstream and the key it takes.
pub(super) struct Vendor {
    pub(super) upstream: Upstream,
    /// The header callers and the upstream carry the key in.
    key_header: HeaderName,
    api_key: Option<HeaderValue>,
    forward: bool,
}

impl Vendor {
    /// The upstream at `base` with the operator's `api_key` (`setting` names
    /// it in errors, e.g. `serve.anthropic.api_key`).
    pub(super) fn new(
        s: &ServeSettings,
        base: String,
        key_header: &'static str,
        api_key: Option<&SecretString>,
        setting: &str,
    ) -> crate::Result<Self> {
        // The shared relay sends no credentials of its own here: ours go in
        // the vendor's header, set per request.
        let relay_settings = ServeSettings { upstream_api_key: None, ..s.clone() };
        let upstream = Upstream::new(&relay_settings, base)?;
        let api_key = api_key
            .map(|k| HeaderValue::from_str(k.expose_secret()))
            .transpose()
            .map_err(|_| crate::Error::serve(format!("{setting} holds characters an HTTP header cannot carry")))?
            .map(|mut v| {
                v.set_sensitive(true);
                v
            });
        Ok(Self {
            upstream,
            key_header: HeaderName::from_static(key_header),
            api_key,
            forward: s.forward_authorization,
        })
    }

    /// The upstream's credentials: the caller's own key header when
    /// `forward_authorization` (the upstream authenticates the caller), else
    /// the operator's key.
    pub(super) fn credentials(&self, incoming: &HeaderMap, out: &mut HeaderMap) {
        if self.forward {
            if let Some(k) = incoming.get(&self.key_header) {
                out.insert(self.key_header.clone(), k.clone());
            }
        } else if let Some(k) = &self.api_key {
            out.insert(self.key_header.clone(), k.clone());
        }
    }

    /// The caller's headers as the identity chain reads them: the key header
    /// becomes the bearer key it stands for. Two different keys, or a key
    /// sent twice, are refused rather than one of them chosen.
    pub(super) fn identity_headers<'h>(&self, headers: &'h HeaderMap) -> Result<Cow<'h, HeaderMap>, ApiError> {
        key_as_bearer(headers, &self.key_header)
    }

    /// An identity refusal, told the way this API's callers send their key.
    pub(super) fn identity_refusal(&self, mut e: ApiError) -> ApiError {
        if e.status == 401 {
            let how = format!("`{}: KEY` (or `Authorization: Bearer KEY`)", self.key_header);
            e.message = e.message.replace("`Authorization: Bearer KEY`", &how);
        }
        e
    }
}

/// The 404 of a vendor's route when its section is not configured.
pub(super) fn not_enabled(api: &str, setting: &str) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        "invalid_request_error",
        "unknown_url",
        format!(
            "{api} is not enabled on this proxy: its operator has to add `{setting}` (upstream and api_key) to the config"
        ),
    )
}

/// `name`'s key as `Authorization: Bearer KEY` for the identity chain.
pub(super) fn key_as_bearer<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Result<Cow<'h, HeaderMap>, ApiError> {
    let keys: Vec<_> = headers.get_all(name).iter().collect();
    let refuse = |m: String| ApiError::unauthorized("invalid_api_key", &m);
    match keys.as_slice() {
        [] => Ok(Cow::Borrowed(headers)),
        [key] => {
            let key = key.to_str().ok().map(str::trim).filter(|k| !k.is_empty() && !k.contains([' ', '\t']));
            let key = key.ok_or_else(|| refuse(format!("The `{name}` header is not a key; send `{name}: KEY`")))?;
            if headers.contains_key(header::AUTHORIZATION) {
                return match identity::bearer(headers) {
                    Some(b) if b == key => Ok(Cow::Borrowed(headers)),
                    _ => Err(refuse(format!(
                        "`{name}` and `Authorization` name different keys; send one of them (or the same key in both)"
                    ))),
                };
            }
            let mut h = headers.clone();
            let bearer = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| refuse(format!("bad {name}")))?;
            h.insert(header::AUTHORIZATION, bearer);
            Ok(Cow::Owned(h))
        }
        _ => Err(refuse(format!("Send one `{name}` header, not several"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        m
    }

    #[test]
    fn a_key_header_stands_for_the_bearer_and_two_keys_are_refused() {
        for name in ["x-api-key", "x-goog-api-key"] {
            let n = HeaderName::from_static(name);
            let sent = h(&[(name, "k1")]);
            let got = key_as_bearer(&sent, &n).unwrap();
            assert_eq!(identity::bearer(&got), Some("k1"));
            assert!(key_as_bearer(&h(&[(name, "k1"), ("authorization", "Bearer k1")]), &n).is_ok());
            for bad in [
                h(&[(name, "k1"), ("authorization", "Bearer k2")]),
                h(&[(name, "k1"), (name, "k1")]),
                h(&[(name, "a b")]),
                h(&[(name, "")]),
            ] {
                let e = key_as_bearer(&bad, &n).unwrap_err();
                assert_eq!(e.status, 401, "{bad:?}");
                assert!(e.message.contains(name), "{}", e.message);
            }
            let none = h(&[]);
            assert!(identity::bearer(&key_as_bearer(&none, &n).unwrap()).is_none());
        }
    }
}
