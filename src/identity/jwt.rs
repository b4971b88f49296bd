//! [`JwtVerifier`]: an OIDC/JWT bearer token in, an [`Identity`] out.
//!
//! What is checked, in order: the token is three base64url parts; its `alg`
//! is one of the accepted ones (never `none`; `HS*` only with an explicit
//! `hmac_secret`, and then only that secret verifies them: a published key is
//! never used as an HMAC secret); the key it names (`kid`) is published by the
//! provider, and of the type `alg` needs; the signature; `iss`, `aud`, `exp`
//! (required), `nbf`, with `leeway`; the user claim and `required_claims`.
//!
//! Keys: fetched by [`JwtVerifier::new`] (or the first [`JwtVerifier::refresh`]),
//! then kept. A token naming a `kid` not in the set triggers one refresh, at
//! most one per `min_refresh_interval` whatever the number of such tokens, so a
//! flood of forged key ids costs the provider nothing. When a refresh fails
//! the keys already held keep verifying, and [`JwtVerifier::problem`] says why.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use secrecy::{ExposeSecret, SecretString};

use super::keys::{self, KeySet, Origin};
use super::{Identity, IdentitySource};
use crate::error::{AuthFailure, Error, Result};

/// The algorithms accepted by default: the asymmetric ones.
pub const DEFAULT_ALGORITHMS: &[&str] =
    &["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA"];

/// Where the provider's keys are.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum JwksSource {
    /// `{issuer}/.well-known/openid-configuration`'s `jwks_uri`.
    Discover,
    /// This JWKS URL.
    Url(String),
    /// This JWKS file (no refresh: rotation means editing it and restarting).
    File(PathBuf),
}

/// How tokens are verified (`serve.jwt`). Start from [`JwtSettings::new`]
/// and set the fields that differ from the defaults.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct JwtSettings {
    /// The `iss` every token must carry, exactly.
    pub issuer: String,
    /// The `aud` values accepted (a token must carry one of them). Empty: refused at construction.
    pub audience: Vec<String>,
    /// Where the keys are (default: discovery).
    pub jwks: JwksSource,
    /// The claim naming the user (default `sub`).
    pub user_claim: String,
    /// The claim holding the caller's groups: a list of strings or one string of groups separated by
    /// ASCII spaces (U+0020 only: any other white space, a no-break space say, is part of a group's name).
    pub roles_claim: Option<String>,
    /// Group → policy roles; groups not listed give no role.
    pub role_map: BTreeMap<String, Vec<String>>,
    /// Claims that must be present (besides `iss`, `aud`, `exp` and the user claim).
    pub required_claims: Vec<String>,
    /// Clock skew allowed on `exp` and `nbf` (default 30 s).
    pub leeway: Duration,
    /// Accepted `alg` names (default [`DEFAULT_ALGORITHMS`]; `none` is never accepted).
    pub algorithms: Vec<String>,
    /// The shared secret for `HS256`/`HS384`/`HS512`, which are accepted only with it.
    pub hmac_secret: Option<SecretString>,
    /// The shortest time between two refreshes caused by unknown key ids (default 30 s).
    pub min_refresh_interval: Duration,
    /// How often the proxy refreshes the keys anyway (default 5 min).
    pub refresh_interval: Duration,
    /// Longest wait for the provider's answer (default 5 s).
    pub http_timeout: Duration,
}

impl JwtSettings {
    /// Settings for tokens from `issuer`, with the defaults (keys by discovery).
    pub fn new(issuer: impl Into<String>) -> Self {
        Self {
            issuer: issuer.into(),
            audience: Vec::new(),
            jwks: JwksSource::Discover,
            user_claim: "sub".into(),
            roles_claim: None,
            role_map: BTreeMap::new(),
            required_claims: Vec::new(),
            leeway: Duration::from_secs(30),
            algorithms: DEFAULT_ALGORITHMS.iter().map(|s| (*s).to_owned()).collect(),
            hmac_secret: None,
            min_refresh_interval: Duration::from_secs(30),
            refresh_interval: Duration::from_secs(300),
            http_timeout: Duration::from_secs(5),
        }
    }
}

/// Parses an `alg` name; `None` for `none` and anything unknown.
pub(crate) fn parse_algorithm(name: &str) -> Option<Algorithm> {
    if name.eq_ignore_ascii_case("none") {
        return None;
    }
    name.parse().ok()
}

/// Whether `name` is an accepted `alg` name: `Some(true)` for an HMAC one,
/// `Some(false)` for an asymmetric one, `None` for `none` or an unknown name.
pub(crate) fn parse_algorithm_name(name: &str) -> Option<bool> {
    parse_algorithm(name).map(|a| matches!(a, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512))
}

/// Whether `token` has the shape of a JWS (three base64url parts, the first
/// two non-empty): such a bearer is verified, never taken for a static key.
pub fn looks_like_jwt(token: &str) -> bool {
    let b64 = |p: &str| p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    let parts: Vec<&str> = token.split('.').collect();
    parts.len() == 3 && !parts[0].is_empty() && !parts[1].is_empty() && parts.iter().all(|p| b64(p))
}

/// Verifies tokens of one issuer. A cheap `Clone` handle: clones share the keys.
#[derive(Clone)]
pub struct JwtVerifier {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier").field("issuer", &self.inner.settings.issuer).finish_non_exhaustive()
    }
}

struct Inner {
    settings: JwtSettings,
    algorithms: Vec<Algorithm>,
    hmac: Option<DecodingKey>,
    /// The validation of claims (issuer, audience, times), algorithms set per token.
    validation: Validation,
    keys: RwLock<Arc<KeySet>>,
    http: reqwest::Client,
    /// The JWKS URL once discovered.
    origin: tokio::sync::Mutex<Option<Origin>>,
    /// When the keys were last fetched (or tried): the rate limit of refreshes.
    last_fetch: tokio::sync::Mutex<Option<Instant>>,
    /// Why the last refresh failed, while the held keys are older than it.
    problem: std::sync::Mutex<Option<String>>,
    /// Tokens already verified, by SHA-256, with their `exp`: a client sends
    /// the same access token on every request until it expires, and an RSA
    /// verification costs ~0.25 ms on the RustCrypto backend. Bounded
    /// (emptied when full); an entry is used only while `exp` + leeway holds.
    verified: std::sync::Mutex<std::collections::HashMap<[u8; 32], (Identity, u64)>>,
}

/// Verified tokens remembered at most (then the memory is emptied and refilled).
const VERIFIED_MAX: usize = 10_000;

impl JwtVerifier {
    /// A verifier with its keys fetched.
    ///
    /// # Errors
    /// [`Error::Jwks`] when the keys cannot be fetched or hold no usable
    /// key; [`Error::Config`]-like problems of the settings (no audience, an
    /// unknown or `none` algorithm) as [`Error::Jwks`] too.
    pub async fn new(settings: JwtSettings) -> Result<Self> {
        let v = Self::unfetched(settings)?;
        v.refresh().await?;
        Ok(v)
    }

    /// A verifier whose keys are fetched by its first [`refresh`](Self::refresh)
    /// (or, failing that, by the first token).
    pub(crate) fn unfetched(settings: JwtSettings) -> Result<Self> {
        let bad = |what: String| Error::Jwks { what, source: None };
        if settings.audience.is_empty() {
            return Err(bad(
                "no audience: set `audience` to the value(s) of `aud` tokens for this service carry".into()
            ));
        }
        let mut algorithms = Vec::new();
        for name in &settings.algorithms {
            let a = parse_algorithm(name).ok_or_else(|| bad(format!("`{name}` is not an accepted algorithm")))?;
            if matches!(a, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512) && settings.hmac_secret.is_none() {
                return Err(bad(format!("`{name}` needs `hmac_secret`: HMAC tokens verify only with a shared secret")));
            }
            algorithms.push(a);
        }
        let hmac = settings.hmac_secret.as_ref().map(|s| DecodingKey::from_secret(s.expose_secret().as_bytes()));
        let mut validation = Validation::new(Algorithm::RS256);
        validation.set_issuer(&[&settings.issuer]);
        validation.set_audience(&settings.audience);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.leeway = settings.leeway.as_secs();
        validation.validate_nbf = true;
        let origin = match &settings.jwks {
            JwksSource::Discover => None,
            JwksSource::Url(u) => Some(Origin::Url(u.clone())),
            JwksSource::File(p) => Some(Origin::File(p.clone())),
        };
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::Jwks { what: "cannot build the HTTP client".into(), source: Some(Arc::new(e)) })?;
        Ok(Self {
            inner: Arc::new(Inner {
                algorithms,
                hmac,
                validation,
                keys: RwLock::new(Arc::new(KeySet::default())),
                http,
                origin: tokio::sync::Mutex::new(origin),
                last_fetch: tokio::sync::Mutex::new(None),
                problem: std::sync::Mutex::new(None),
                verified: std::sync::Mutex::default(),
                settings,
            }),
        })
    }

    /// The settings in force.
    pub fn settings(&self) -> &JwtSettings {
        &self.inner.settings
    }

    /// Why the keys could not be refreshed last time (the held keys keep
    /// verifying meanwhile); `None` when the last fetch worked.
    pub fn problem(&self) -> Option<String> {
        self.inner.problem.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Fetches the keys now (discovery first, when needed). On failure the
    /// keys held stay in use and [`problem`](Self::problem) says why.
    ///
    /// # Errors
    /// [`Error::Jwks`] when the provider cannot be reached or answers no usable JWKS.
    pub async fn refresh(&self) -> Result<()> {
        let mut last = self.inner.last_fetch.lock().await;
        self.refresh_locked(&mut last).await
    }

    /// The fetch, under the lock of `last_fetch`: tasks that wait for it see
    /// its time when they get the lock, and do not fetch again.
    async fn refresh_locked(&self, last: &mut Option<Instant>) -> Result<()> {
        *last = Some(Instant::now());
        let result = self.fetch().await;
        let mut problem = self.inner.problem.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(set) => {
                *self.inner.keys.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(set);
                *problem = None;
                Ok(())
            }
            Err(e) => {
                *problem = Some(format!("{e}{}", source_text(&e)));
                Err(e)
            }
        }
    }

    /// One refresh for an unknown key id, unless one ran within `min_refresh_interval`.
    async fn refresh_for_unknown_kid(&self) -> bool {
        let mut last = self.inner.last_fetch.lock().await;
        if last.is_some_and(|t| t.elapsed() < self.inner.settings.min_refresh_interval) {
            return false;
        }
        self.refresh_locked(&mut last).await.is_ok()
    }

    async fn fetch(&self) -> Result<KeySet> {
        let s = &self.inner.settings;
        let mut origin = self.inner.origin.lock().await;
        if origin.is_none() {
            *origin = Some(Origin::Url(keys::discover(&self.inner.http, &s.issuer, s.http_timeout).await?));
        }
        match origin.as_ref().expect("set above") {
            Origin::Url(u) => {
                let body = keys::get(&self.inner.http, u, s.http_timeout).await?;
                KeySet::parse(&body, &crate::cause::redact_url(u))
            }
            Origin::File(p) => keys::read_file(p).await,
        }
    }

    /// The identity `token` proves.
    ///
    /// # Errors
    /// [`Error::Unauthenticated`] with the reason ([`Error::auth_failure`]).
    pub async fn verify(&self, token: &str) -> Result<Identity> {
        let refuse = |reason: AuthFailure, detail: &str| Error::Unauthenticated {
            reason,
            detail: detail.to_owned(),
            source: None,
        };
        if !looks_like_jwt(token) {
            return Err(refuse(AuthFailure::Malformed, "the token is not a JWS (three base64url parts)"));
        }
        let digest: [u8; 32] = <sha2::Sha256 as sha2::Digest>::digest(token.as_bytes()).into();
        // The memo keeps identities without their tokens; the caller's copy carries it (token exchange).
        if let Some(who) = self.remembered(&digest) {
            return Ok(who.with_token(token));
        }
        let (who, exp) = self.verify_signed(token).await?;
        let mut memo = self.inner.verified.lock().unwrap_or_else(|e| e.into_inner());
        if memo.len() >= VERIFIED_MAX {
            memo.clear();
        }
        memo.insert(digest, (who.clone(), exp));
        Ok(who.with_token(token))
    }

    /// A token verified before, while its `exp` (with the leeway) holds.
    fn remembered(&self, digest: &[u8; 32]) -> Option<Identity> {
        let memo = self.inner.verified.lock().unwrap_or_else(|e| e.into_inner());
        let (who, exp) = memo.get(digest)?;
        let now = jsonwebtoken::get_current_timestamp();
        (now <= exp.saturating_add(self.inner.settings.leeway.as_secs())).then(|| who.clone())
    }

    /// The signature and claims checked: the identity and the token's `exp`.
    async fn verify_signed(&self, token: &str) -> Result<(Identity, u64)> {
        let refuse = |reason: AuthFailure, detail: &str| Error::Unauthenticated {
            reason,
            detail: detail.to_owned(),
            source: None,
        };
        let (alg, kid) = header(token)?;
        let Some(alg) = alg.filter(|a| self.inner.algorithms.contains(a)) else {
            return Err(refuse(AuthFailure::Algorithm, "the token's `alg` is not one this service accepts"));
        };
        let hmac = matches!(alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512);
        let mut validation = self.inner.validation.clone();
        validation.algorithms = vec![alg];
        if hmac {
            let key = self.inner.hmac.as_ref().ok_or_else(|| refuse(AuthFailure::Algorithm, "HMAC is not accepted"))?;
            return self.claims(token, key, &validation);
        }
        let mut set = self.keys();
        let (mut keys, mut known) = set.candidates(kid.as_deref(), alg);
        if !known && self.refresh_for_unknown_kid().await {
            set = self.keys();
            (keys, known) = set.candidates(kid.as_deref(), alg);
        }
        if !known {
            return Err(refuse(
                AuthFailure::UnknownKey,
                "the token names a key the identity provider does not publish",
            ));
        }
        if keys.is_empty() {
            return Err(refuse(AuthFailure::Algorithm, "the token's `alg` does not fit the key it names"));
        }
        let mut last = None;
        // Without a `kid` every key of the right type is tried; the first that verifies wins.
        for k in keys {
            match self.claims(token, &k.key, &validation) {
                Err(e) if e.auth_failure() == Some(AuthFailure::BadSignature) => last = Some(e),
                other => return other,
            }
        }
        Err(last.unwrap_or_else(|| refuse(AuthFailure::BadSignature, "the signature does not verify")))
    }

    fn keys(&self) -> Arc<KeySet> {
        self.inner.keys.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Signature and claims with one key, then the identity.
    fn claims(&self, token: &str, key: &DecodingKey, validation: &Validation) -> Result<(Identity, u64)> {
        let data = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(token, key, validation)
            .map_err(refusal)?;
        // `exp` is required and checked by `decode`, so it is a number here.
        let exp = data.claims.get("exp").and_then(serde_json::Value::as_u64).unwrap_or(0);
        Ok((identity(&self.inner.settings, &data.claims)?, exp))
    }
}

/// The cause chain of `e` after its own message, for the readiness report.
pub(crate) fn source_text(e: &Error) -> String {
    let mut out = String::new();
    let mut cur = std::error::Error::source(e);
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

/// The header's `alg` (`None`: `none` or unknown) and `kid`, read by hand so
/// that `none` is told apart from a malformed header.
fn header(token: &str) -> Result<(Option<Algorithm>, Option<String>)> {
    use base64::Engine;
    let malformed = |detail: &str| Error::Unauthenticated {
        reason: AuthFailure::Malformed,
        detail: detail.to_owned(),
        source: None,
    };
    let first = token.split('.').next().unwrap_or_default();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(first)
        .map_err(|_| malformed("the token's header is not base64url"))?;
    #[derive(serde::Deserialize)]
    struct Head {
        alg: String,
        kid: Option<String>,
    }
    let h: Head = serde_json::from_slice(&bytes).map_err(|_| malformed("the token's header is not a JOSE header"))?;
    Ok((parse_algorithm(&h.alg), h.kid))
}

/// The reason for a `jsonwebtoken` failure.
fn refusal(e: jsonwebtoken::errors::Error) -> Error {
    let (reason, detail) = match e.kind() {
        ErrorKind::ExpiredSignature => (AuthFailure::Expired, "the token has expired"),
        ErrorKind::ImmatureSignature => (AuthFailure::NotYetValid, "the token is not valid yet (`nbf`)"),
        ErrorKind::InvalidSignature => (AuthFailure::BadSignature, "the signature does not verify"),
        ErrorKind::InvalidAudience => (AuthFailure::WrongAudience, "the token is for another audience"),
        ErrorKind::InvalidIssuer => (AuthFailure::WrongIssuer, "the token is from another issuer"),
        ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm => {
            (AuthFailure::Algorithm, "the token's `alg` does not fit the key")
        }
        ErrorKind::MissingRequiredClaim(c) if c == "aud" => (AuthFailure::WrongAudience, "the token has no `aud`"),
        ErrorKind::MissingRequiredClaim(c) if c == "iss" => (AuthFailure::WrongIssuer, "the token has no `iss`"),
        ErrorKind::MissingRequiredClaim(_) | ErrorKind::InvalidClaimFormat(_) => {
            (AuthFailure::MissingClaim, "a required claim is missing or malformed")
        }
        ErrorKind::InvalidEcdsaKey | ErrorKind::InvalidRsaKey(_) | ErrorKind::InvalidEddsaKey => {
            (AuthFailure::BadSignature, "the signature does not verify")
        }
        _ => (AuthFailure::Malformed, "the token is malformed"),
    };
    Error::Unauthenticated { reason, detail: detail.to_owned(), source: Some(Arc::new(e)) }
}

/// The user and mapped roles of verified claims.
fn identity(s: &JwtSettings, claims: &serde_json::Map<String, serde_json::Value>) -> Result<Identity> {
    let missing = |detail: String| Error::Unauthenticated { reason: AuthFailure::MissingClaim, detail, source: None };
    for c in &s.required_claims {
        if claims.get(c).is_none_or(serde_json::Value::is_null) {
            return Err(missing(format!("the token has no `{c}` claim")));
        }
    }
    let user = claims
        .get(&s.user_claim)
        .and_then(|v| v.as_str())
        .ok_or_else(|| missing(format!("the token has no string `{}` claim (the user)", s.user_claim)))?;
    if let Some(problem) = crate::id::user_name_problem(user) {
        return Err(missing(format!("the token's `{}` is not a usable user name: {problem}", s.user_claim)));
    }
    let groups: Vec<&str> = match s.roles_claim.as_ref().and_then(|c| claims.get(c)) {
        // Split on the ASCII space only, as `roles_claim` documents (the OAuth `scope` convention):
        // `"Marketing\u{a0}engineering"` is one group, not `engineering`.
        Some(serde_json::Value::String(s)) => s.split(' ').filter(|g| !g.is_empty()).collect(),
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(|v| v.as_str()).collect(),
        _ => Vec::new(),
    };
    let roles = groups.into_iter().filter_map(|g| s.role_map.get(g)).flatten().cloned();
    Ok(Identity::new(user, IdentitySource::Jwt).with_roles(roles))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape() {
        assert!(looks_like_jwt("eyJh.eyJz.c2ln"));
        assert!(looks_like_jwt("eyJh.eyJz."));
        assert!(!looks_like_jwt("sk-alice-1"));
        assert!(!looks_like_jwt("a.b"));
        assert!(!looks_like_jwt("a.b.c.d"));
        assert!(!looks_like_jwt("a+.b.c"));
        assert!(parse_algorithm("none").is_none());
        assert!(parse_algorithm("NONE").is_none());
        assert_eq!(parse_algorithm("RS256"), Some(Algorithm::RS256));
    }

    #[test]
    fn roles_from_a_list_or_a_string() {
        let mut s = JwtSettings::new("https://idp");
        s.roles_claim = Some("groups".into());
        s.role_map.insert("eng".into(), vec!["staff".into()]);
        s.role_map.insert("ops".into(), vec!["staff".into(), "oncall".into()]);
        let claims =
            |g: serde_json::Value| serde_json::json!({"sub": "alice", "groups": g}).as_object().unwrap().clone();
        let i = identity(&s, &claims(serde_json::json!(["eng", "ops", "nope"]))).unwrap();
        assert_eq!(i.roles, ["staff", "oncall"]);
        assert_eq!(i.user, "alice");
        assert_eq!(identity(&s, &claims(serde_json::json!("ops nope"))).unwrap().roles, ["staff", "oncall"]);
        assert_eq!(identity(&s, &claims(serde_json::json!("  nope  eng "))).unwrap().roles, ["staff"]);
        for other_space in ["Marketing\u{a0}eng", "x\u{2003}eng", "x\teng", "x\neng"] {
            assert!(identity(&s, &claims(serde_json::json!(other_space))).unwrap().roles.is_empty(), "{other_space:?}");
        }
        assert!(identity(&s, &claims(serde_json::json!(null))).unwrap().roles.is_empty());
        s.required_claims.push("email".into());
        let e = identity(&s, &claims(serde_json::json!([]))).unwrap_err();
        assert_eq!(e.auth_failure(), Some(AuthFailure::MissingClaim));
        s.required_claims.clear();
        s.user_claim = "email".into();
        assert!(identity(&s, &claims(serde_json::json!([]))).is_err());
    }
}
