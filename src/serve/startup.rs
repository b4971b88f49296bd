//! What `mcp-context serve` settles and says before it listens: where each
//! upstream's key comes from (the config, else `$OPENAI_API_KEY` /
//! `$ANTHROPIC_API_KEY` / `$GEMINI_API_KEY`, never the caller's), said in one line each on
//! stderr without the key; and whether any caller can be identified at all
//! (a proxy that could only answer 401 refuses to start, naming the ways).
//! Imports the settings and the error type only.

use std::path::Path;

use secrecy::SecretString;

use crate::error::Error;
use crate::settings::ServeSettings;

/// The environment variable the chat upstream's key is taken from when the config names none.
pub(super) const OPENAI_KEY_VAR: &str = "OPENAI_API_KEY";
/// The same for `serve.anthropic` (the Messages API route).
pub(super) const ANTHROPIC_KEY_VAR: &str = "ANTHROPIC_API_KEY";
/// The same for `serve.gemini` (Gemini's `generateContent` routes).
pub(super) const GEMINI_KEY_VAR: &str = "GEMINI_API_KEY";

/// Fills the upstream keys the config leaves unset from `env`, and returns
/// one line per upstream saying where its key comes from (never the key).
/// With `forward_authorization` the caller's own credentials go upstream
/// and nothing is taken from the environment.
pub(super) fn upstream_keys(s: &mut ServeSettings, env: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let forward = s.forward_authorization;
    let chat = source(
        forward.then_some("Authorization"),
        &mut s.upstream_api_key,
        "serve.upstream_api_key",
        OPENAI_KEY_VAR,
        "Authorization",
        env,
    );
    let mut lines = vec![format!("upstream key: {chat}")];
    if let Some(a) = s.anthropic.as_mut() {
        let messages = source(
            forward.then_some("x-api-key"),
            &mut a.api_key,
            "serve.anthropic.api_key",
            ANTHROPIC_KEY_VAR,
            "x-api-key",
            env,
        );
        lines.push(format!("Messages API upstream key: {messages}"));
    }
    if let Some(g) = s.gemini.as_mut() {
        let gemini = source(
            forward.then_some("x-goog-api-key"),
            &mut g.api_key,
            "serve.gemini.api_key",
            GEMINI_KEY_VAR,
            "x-goog-api-key",
            env,
        );
        lines.push(format!("Gemini API upstream key: {gemini}"));
    }
    lines
}

/// Where one upstream's key comes from: the caller's own `forwarded` header,
/// the config's `setting`, else `$var` (then put in `key`), else nowhere (no
/// `header` goes upstream).
fn source(
    forwarded: Option<&str>,
    key: &mut Option<SecretString>,
    setting: &str,
    var: &str,
    header: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> String {
    if let Some(h) = forwarded {
        return format!("the caller's own `{h}` (serve.forward_authorization)");
    }
    if key.is_some() {
        return setting.to_owned();
    }
    if let Some(k) = env(var).filter(|v| !v.trim().is_empty()) {
        *key = Some(SecretString::from(k));
        return format!("${var} ({setting} is not set)");
    }
    format!(
        "none: neither {setting} nor ${var} is set, so requests go upstream without `{header}` (callers' keys are \
         never passed on)"
    )
}

/// Whether any request could be given a user: refused (with the ways to
/// fix it) when none of keys, jwt, a user header, the body's user or an
/// anonymous user is configured, since every request would then be 401.
pub(super) fn check_identifiable(s: &ServeSettings, config: &Path) -> crate::Result<()> {
    let keys = !s.keys.is_empty() && !s.forward_authorization;
    #[cfg(feature = "jwt")]
    let jwt = s.jwt.is_some();
    #[cfg(not(feature = "jwt"))]
    let jwt = false;
    if keys || jwt || s.user_header.is_some() || s.user_from_body || s.anonymous_user.is_some() {
        return Ok(());
    }
    let why = if s.forward_authorization && !s.keys.is_empty() {
        "with `forward_authorization: true` the keys cannot identify callers, and nothing else does"
    } else {
        "the `serve:` section names no way to identify callers"
    };
    Err(Error::Config {
        path: config.to_owned(),
        line: None,
        column: None,
        message: format!(
            "serve: {why}, so every request would be answered 401. Add one of: `serve.keys` (or `keys_file`), \
             caller keys by SHA-256 (`mcp-context serve hash-key KEY` prints one) with the user each stands for; \
             `serve.jwt`, tokens from an identity provider; `serve.user_header`, a header set by a trusted gateway; \
             `serve.user_from_body`, the body's `user`; or `serve.anonymous_user: NAME`, one user for every caller \
             (a local single-user proxy)"
        ),
        more: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::AnthropicSettings;

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn the_environment_fills_only_what_the_config_leaves_unset() {
        use secrecy::ExposeSecret;
        let mut s = ServeSettings::default();
        let lines = upstream_keys(&mut s, &env(&[("OPENAI_API_KEY", "sk-env")]));
        assert_eq!(s.upstream_api_key.as_ref().map(|k| k.expose_secret().to_owned()).as_deref(), Some("sk-env"));
        assert!(lines[0].contains("$OPENAI_API_KEY") && !lines[0].contains("sk-env"), "{lines:?}");

        let mut s = ServeSettings { upstream_api_key: Some("sk-conf".into()), ..ServeSettings::default() };
        let lines = upstream_keys(&mut s, &env(&[("OPENAI_API_KEY", "sk-env")]));
        assert_eq!(s.upstream_api_key.as_ref().map(|k| k.expose_secret().to_owned()).as_deref(), Some("sk-conf"));
        assert_eq!(lines, ["upstream key: serve.upstream_api_key"]);

        let mut s = ServeSettings { forward_authorization: true, ..ServeSettings::default() };
        s.anthropic =
            Some(AnthropicSettings { upstream: "http://a".into(), api_key: None, select: crate::SelectMode::Priority });
        let lines = upstream_keys(&mut s, &env(&[("OPENAI_API_KEY", "sk"), ("ANTHROPIC_API_KEY", "ak")]));
        assert!(s.upstream_api_key.is_none() && s.anthropic.as_ref().unwrap().api_key.is_none());
        assert!(lines.iter().all(|l| l.contains("caller's own")), "{lines:?}");
    }
}
