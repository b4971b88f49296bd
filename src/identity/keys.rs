//! The identity provider's public keys: found through discovery or named,
//! fetched over HTTP (or read from a file), and kept as decoding keys by key id.
//!
//! Only signing keys of asymmetric types are kept (`RSA`, `EC`, `OKP`): an
//! `oct` (symmetric) key in a JWKS is skipped, so a published key can never
//! become an HMAC secret. A key that says its `alg` is used for that one only.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};

use crate::error::{Error, Result};

/// One usable key.
pub(super) struct Key {
    pub(super) kid: Option<String>,
    /// The `alg` the JWK pins, if it does.
    pub(super) alg: Option<Algorithm>,
    pub(super) key: DecodingKey,
}

/// The keys of one fetch.
#[derive(Default)]
pub(super) struct KeySet {
    pub(super) keys: Vec<Key>,
}

impl KeySet {
    /// Keys named `kid` (all keys when the token names none) whose type
    /// fits `alg`; and whether the kid is known at all.
    pub(super) fn candidates<'a>(&'a self, kid: Option<&'a str>, alg: Algorithm) -> (Vec<&'a Key>, bool) {
        let named: Vec<&Key> = self.keys.iter().filter(|k| kid.is_none() || k.kid.as_deref() == kid).collect();
        let known = !named.is_empty();
        let fits =
            named.into_iter().filter(|k| k.key.family() == alg.family() && k.alg.is_none_or(|a| a == alg)).collect();
        (fits, known)
    }

    /// Parses a JWKS document, keeping the asymmetric signing keys.
    pub(super) fn parse(text: &[u8], from: &str) -> Result<KeySet> {
        #[derive(serde::Deserialize)]
        struct Doc {
            keys: Vec<serde_json::Value>,
        }
        let doc: Doc = serde_json::from_slice(text).map_err(|e| Error::Jwks {
            what: format!("{from} is not a JWK set (`{{\"keys\": [...]}}`)"),
            source: Some(Arc::new(e)),
        })?;
        let mut keys = Vec::new();
        for v in doc.keys {
            // Keys this crate cannot read (another kty, an encryption key) are skipped, not fatal.
            let Ok(jwk) = serde_json::from_value::<Jwk>(v) else { continue };
            if matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_))
                || matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption))
            {
                continue;
            }
            let alg = match jwk.common.key_algorithm {
                None => None,
                Some(a) => match signing_alg(a) {
                    Some(a) => Some(a),
                    None => continue,
                },
            };
            let Ok(key) = DecodingKey::from_jwk(&jwk) else { continue };
            keys.push(Key { kid: jwk.common.key_id.clone(), alg, key });
        }
        if keys.is_empty() {
            return Err(Error::Jwks { what: format!("{from} holds no usable signing key"), source: None });
        }
        Ok(KeySet { keys })
    }
}

fn signing_alg(a: KeyAlgorithm) -> Option<Algorithm> {
    Some(match a {
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        _ => return None,
    })
}

/// Where keys come from, resolved: a URL or a file.
pub(super) enum Origin {
    Url(String),
    File(std::path::PathBuf),
}

/// GET `url` as bytes, within `timeout`, refusing non-2xx answers and bodies over 1 MiB.
pub(super) async fn get(http: &reqwest::Client, url: &str, timeout: Duration) -> Result<Vec<u8>> {
    let shown = crate::cause::redact_url(url);
    let fail = |what: String, e: Option<Arc<dyn std::error::Error + Send + Sync>>| Error::Jwks { what, source: e };
    let resp = tokio::time::timeout(timeout, http.get(url).send())
        .await
        .map_err(|_| fail(format!("{shown} did not answer within {} ms", timeout.as_millis()), None))?
        .map_err(|e| fail(format!("cannot fetch {shown}"), Some(Arc::new(e))))?;
    if !resp.status().is_success() {
        return Err(fail(format!("{shown} answered {}", resp.status()), None));
    }
    let body = tokio::time::timeout(timeout, resp.bytes())
        .await
        .map_err(|_| fail(format!("{shown} did not finish its answer within {} ms", timeout.as_millis()), None))?
        .map_err(|e| fail(format!("cannot read {shown}"), Some(Arc::new(e))))?;
    if body.len() > 1 << 20 {
        return Err(fail(format!("{shown} answered more than 1 MiB"), None));
    }
    Ok(body.to_vec())
}

/// The `jwks_uri` of `issuer`'s discovery document (whose `issuer` must be `issuer`).
pub(super) async fn discover(http: &reqwest::Client, issuer: &str, timeout: Duration) -> Result<String> {
    let url = format!("{}/.well-known/openid-configuration", issuer.trim_end_matches('/'));
    let body = get(http, &url, timeout).await?;
    let shown = crate::cause::redact_url(&url);
    let doc: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| Error::Jwks { what: format!("{shown} is not JSON"), source: Some(Arc::new(e)) })?;
    if doc.get("issuer").and_then(|v| v.as_str()) != Some(issuer) {
        return Err(Error::Jwks {
            what: format!("{shown} names another issuer than `{issuer}` (OpenID Connect Discovery 1.0, 4.3)"),
            source: None,
        });
    }
    doc.get("jwks_uri")
        .and_then(|v| v.as_str())
        .filter(|u| u.starts_with("https://") || u.starts_with("http://"))
        .map(str::to_owned)
        .ok_or_else(|| Error::Jwks { what: format!("{shown} has no `jwks_uri`"), source: None })
}

/// Reads a JWKS from a file.
pub(super) async fn read_file(path: &Path) -> Result<KeySet> {
    let text = tokio::fs::read(path)
        .await
        .map_err(|e| Error::Jwks { what: format!("cannot read {}", path.display()), source: Some(Arc::new(e)) })?;
    KeySet::parse(&text, &path.display().to_string())
}
