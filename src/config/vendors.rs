//! The vendors' own APIs under `serve:`: `anthropic` (the Messages API,
//! `POST /v1/messages`) and `gemini` (Gemini's `generateContent`), each an
//! upstream base URL and the operator's key for it. Owns their raw forms,
//! their settings and their checks; imports the config's error helpers and
//! `${VAR}` expansion.

use secrecy::SecretString;
use serde::Deserialize;

use super::env::{expand_vars, unexpanded};
use crate::error::Error;
use crate::yaml::{Node, Pos};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAnthropic {
    upstream: Option<String>,
    api_key: Option<String>,
    select: Option<crate::mode::SelectMode>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGemini {
    upstream: Option<String>,
    api_key: Option<String>,
}

/// The Messages API upstream when `serve.anthropic.upstream` names none.
pub const DEFAULT_ANTHROPIC_UPSTREAM: &str = "https://api.anthropic.com/v1";
/// Gemini's upstream when `serve.gemini.upstream` names none (the API's
/// version, `v1beta` or `v1`, is the caller's path's).
pub const DEFAULT_GEMINI_UPSTREAM: &str = "https://generativelanguage.googleapis.com";

/// `serve.anthropic`: where `POST /v1/messages` goes, with which key, and
/// how its context is chosen.
#[derive(Clone, Debug)]
pub struct AnthropicSettings {
    /// Base URL ending before `/messages` (default [`DEFAULT_ANTHROPIC_UPSTREAM`]).
    pub upstream: String,
    /// Sent upstream as `x-api-key` (unset: `serve` takes `$ANTHROPIC_API_KEY`; with
    /// `serve.forward_authorization` the caller's own `x-api-key` or `Authorization` goes instead).
    pub api_key: Option<SecretString>,
    /// How this route chooses resources (default `priority`: the block then
    /// depends only on the user, the policy and the resources, so it stays
    /// byte-identical turn after turn and the prompt cache after it holds).
    pub select: crate::mode::SelectMode,
}

/// `serve.gemini`: where `POST /v1beta/models/{model}:generateContent` (and
/// `:streamGenerateContent`, and the same under `/v1/`) goes, with which key.
#[derive(Clone, Debug)]
pub struct GeminiSettings {
    /// Base URL ending before the API version (default [`DEFAULT_GEMINI_UPSTREAM`]).
    pub upstream: String,
    /// Sent upstream as `x-goog-api-key` (unless `serve.forward_authorization`,
    /// where the caller's own `x-goog-api-key` goes instead).
    pub api_key: Option<SecretString>,
}

/// What every vendor section is checked with: where `serve:` is, how an
/// error is located and recorded, `${VAR}`, and whether the caller's own key goes upstream.
pub(super) struct Check<'a> {
    pub node: &'a Node<'a>,
    pub err_at: &'a dyn Fn(Pos, String) -> Error,
    pub fail: &'a dyn Fn(Error),
    pub env: &'a dyn Fn(&str) -> Option<String>,
    pub forward_authorization: bool,
}

impl Check<'_> {
    /// `serve.{section}`'s upstream (`default` when absent) and key, checked.
    fn upstream_and_key(
        &self,
        section: &str,
        upstream: Option<&str>,
        api_key: Option<&str>,
        default: &str,
    ) -> (String, Option<SecretString>) {
        let at = |k: &str| self.node.get(section).and_then(|n| n.get(k)).map_or(self.node.pos, |n| n.pos);
        let expand_at = |k: &str, v: &str| {
            expand_vars(v, self.env)
                .map_err(|token| (self.err_at)(at(k), format!("serve.{section}.{k}: {}", unexpanded(&token))))
                .unwrap_or_else(|e| {
                    (self.fail)(e);
                    String::new()
                })
        };
        let upstream = upstream.map(|u| expand_at("upstream", u)).unwrap_or_else(|| default.to_owned());
        if !(upstream.is_empty() || upstream.starts_with("http://") || upstream.starts_with("https://")) {
            (self.fail)((self.err_at)(
                at("upstream"),
                format!("serve.{section}.upstream must start with http:// or https://"),
            ));
        }
        let api_key = api_key.map(|k| expand_at("api_key", k));
        if self.forward_authorization && api_key.is_some() {
            (self.fail)((self.err_at)(
                at("api_key"),
                format!(
                    "serve: `forward_authorization: true` sends the caller's own key upstream, and \
                     `{section}.api_key` gives another; keep one"
                ),
            ));
        }
        (upstream, api_key.map(SecretString::from))
    }

    pub(super) fn anthropic(&self, raw: Option<&RawAnthropic>) -> Option<AnthropicSettings> {
        raw.map(|a| {
            let (upstream, api_key) = self.upstream_and_key(
                "anthropic",
                a.upstream.as_deref(),
                a.api_key.as_deref(),
                DEFAULT_ANTHROPIC_UPSTREAM,
            );
            AnthropicSettings { upstream, api_key, select: a.select.unwrap_or(crate::mode::SelectMode::Priority) }
        })
    }

    pub(super) fn gemini(&self, raw: Option<&RawGemini>) -> Option<GeminiSettings> {
        raw.map(|g| {
            let (upstream, api_key) =
                self.upstream_and_key("gemini", g.upstream.as_deref(), g.api_key.as_deref(), DEFAULT_GEMINI_UPSTREAM);
            GeminiSettings { upstream, api_key }
        })
    }
}
