//! `serve.jwt`: verified OIDC/JWT callers. Read strictly, every problem
//! located; the role names of `role_map` are checked against the policy when
//! the proxy starts ([`JwtConfig::check_roles`]), where the policy is known.
//! May import the config's error helpers, the YAML tree and `identity`.
#![cfg_attr(not(feature = "jwt"), allow(dead_code, unused_imports))]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::config_error;
use super::env::{expand_vars, unexpanded};
use crate::error::{Error, Result};
use crate::yaml::{Node, Pos};

/// One string or a list of them.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJwt {
    issuer: String,
    audience: Option<OneOrMany>,
    jwks_url: Option<String>,
    jwks_file: Option<String>,
    user_claim: Option<String>,
    roles_claim: Option<String>,
    #[serde(default)]
    role_map: BTreeMap<String, OneOrMany>,
    #[serde(default)]
    required_claims: Vec<String>,
    leeway_s: Option<u64>,
    algorithms: Option<Vec<String>>,
    hmac_secret: Option<String>,
    jwks_min_refresh_s: Option<u64>,
    jwks_refresh_s: Option<u64>,
}

/// `serve.jwt` as loaded: the verifier's settings, and where each mapped
/// role was written (for [`JwtConfig::check_roles`]).
#[cfg(feature = "jwt")]
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct JwtConfig {
    /// What the verifier checks.
    pub settings: crate::identity::JwtSettings,
    /// Each role named in `role_map`, with its position in the config.
    role_at: Vec<(String, Pos)>,
    path: PathBuf,
}

#[cfg(feature = "jwt")]
impl JwtConfig {
    /// Every role named in `role_map` must be one the policy defines: a
    /// mapping to a missing role would silently grant nothing.
    ///
    /// # Errors
    /// [`Error::Config`] located at each unknown role (all of them at once).
    pub fn check_roles(&self, has_role: impl Fn(&str) -> bool) -> Result<()> {
        let mut problems: Vec<Error> = self
            .role_at
            .iter()
            .filter(|(r, _)| !has_role(r))
            .map(|(r, pos)| {
                config_error(
                    &self.path,
                    Some(*pos),
                    format!("serve.jwt.role_map: the policy defines no role `{r}`; add it under `roles:` or map to one it defines"),
                )
            })
            .collect();
        if problems.is_empty() {
            return Ok(());
        }
        let first = problems.remove(0);
        Err(match first {
            Error::Config { path, line, column, message, .. } => {
                Error::Config { path, line, column, message, more: problems }
            }
            other => other,
        })
    }
}

/// Validates `serve.jwt` (at `node`), recording each problem with `fail`.
#[cfg(feature = "jwt")]
pub(super) fn settings(
    raw: RawJwt,
    node: &Node,
    path: &Path,
    base: &Path,
    env: &dyn Fn(&str) -> Option<String>,
    fail: &dyn Fn(Error),
) -> Option<JwtConfig> {
    use crate::identity::{JwksSource, JwtSettings};
    use std::time::Duration;
    let at = |k: &str| node.get(k).map_or(node.pos, |n| n.pos);
    let err = |k: &str, m: String| config_error(path, Some(at(k)), format!("serve.jwt.{k}: {m}"));
    let expand = |k: &str, v: &str| {
        expand_vars(v, env).unwrap_or_else(|token| {
            fail(err(k, unexpanded(&token)));
            String::new()
        })
    };
    let url_ok = |u: &str| u.starts_with("https://") || u.starts_with("http://");
    let issuer = expand("issuer", &raw.issuer);
    if !url_ok(&issuer) {
        fail(err("issuer", format!("`{issuer}` is not an http(s) URL (the `iss` tokens carry, exactly)")));
    }
    let mut s = JwtSettings::new(issuer);
    s.audience = raw.audience.map(OneOrMany::into_vec).unwrap_or_default();
    if s.audience.is_empty() || s.audience.iter().any(String::is_empty) {
        fail(err("audience", "name the `aud` value(s) tokens for this service carry".into()));
    }
    s.jwks = match (&raw.jwks_url, &raw.jwks_file) {
        (Some(_), Some(_)) => {
            fail(err("jwks_file", "give `jwks_url` or `jwks_file`, not both".into()));
            JwksSource::Discover
        }
        (Some(u), None) => {
            let u = expand("jwks_url", u);
            if !url_ok(&u) {
                fail(err("jwks_url", "must start with https:// or http://".into()));
            }
            JwksSource::Url(u)
        }
        (None, Some(f)) => JwksSource::File(base.join(f)),
        (None, None) => JwksSource::Discover,
    };
    if let Some(c) = raw.user_claim {
        s.user_claim = c;
    }
    s.roles_claim = raw.roles_claim;
    let mut role_at = Vec::new();
    let map_node = node.get("role_map");
    for (group, roles) in raw.role_map {
        let value = map_node.and_then(|m| m.get(&group));
        let roles = roles.into_vec();
        for (i, r) in roles.iter().enumerate() {
            // At the role itself: the list item, else the single value.
            let pos = value.map_or(at("role_map"), |v| v.items().get(i).map_or(v.pos, |item| item.pos));
            role_at.push((r.clone(), pos));
        }
        s.role_map.insert(group, roles);
    }
    if s.roles_claim.is_none() && !s.role_map.is_empty() {
        fail(err("role_map", "needs `roles_claim`, the claim holding the groups (e.g. `groups`)".into()));
    }
    s.required_claims = raw.required_claims;
    s.leeway = Duration::from_secs(raw.leeway_s.unwrap_or(30));
    s.hmac_secret = raw.hmac_secret.map(|h| expand("hmac_secret", &h).into());
    if s.hmac_secret.as_ref().is_some_and(|h| secrecy::ExposeSecret::expose_secret(h).len() < 32) {
        fail(err("hmac_secret", "a shared secret of at least 32 characters (e.g. `${JWT_HMAC_SECRET}`)".into()));
    }
    if let Some(algs) = raw.algorithms {
        for a in &algs {
            match crate::identity::parse_algorithm_name(a) {
                None => fail(err("algorithms", format!("`{a}` is not accepted (`none` never is)"))),
                Some(true) if s.hmac_secret.is_none() => fail(err(
                    "algorithms",
                    format!("`{a}` needs `hmac_secret`: HMAC tokens verify only with a shared secret"),
                )),
                _ => {}
            }
        }
        s.algorithms = algs;
    }
    let secs = |k: &str, v: Option<u64>, d: u64| match v {
        Some(0) => {
            fail(err(k, "must be at least 1".into()));
            Duration::from_secs(d)
        }
        v => Duration::from_secs(v.unwrap_or(d)),
    };
    s.min_refresh_interval = secs("jwks_min_refresh_s", raw.jwks_min_refresh_s, 30);
    s.refresh_interval = secs("jwks_refresh_s", raw.jwks_refresh_s, 300);
    Some(JwtConfig { settings: s, role_at, path: path.to_owned() })
}

/// Without the `jwt` feature a `serve.jwt` section is an error, never ignored.
#[cfg(not(feature = "jwt"))]
pub(super) fn refuse(node: &Node, path: &Path) -> Error {
    config_error(path, Some(node.pos), "serve.jwt needs the `jwt` feature of mcp-context".into())
}
