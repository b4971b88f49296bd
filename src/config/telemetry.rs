//! The `telemetry:` section: where traces go (OTLP over HTTP/protobuf) and
//! how many are kept. May import the config's error helpers and `${VAR}`
//! expansion.
//!
//! Off when the section is absent. Read once, when the process starts: a
//! `serve` reload (SIGHUP) keeps the exporter it started with.

use std::path::Path;

use serde::Deserialize;

use super::config_error;
use super::env::{expand_vars, unexpanded};
use crate::cause::redact_url;
use crate::error::Error;
use crate::yaml::Node;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTelemetry {
    otlp_endpoint: String,
    sample_ratio: Option<f64>,
    service_name: Option<String>,
}

/// Default `telemetry.service_name`.
pub const DEFAULT_SERVICE_NAME: &str = "mcp-context";

/// The `telemetry:` section.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct TelemetrySettings {
    /// The collector's OTLP/HTTP base URL (`http://127.0.0.1:4318`): spans go
    /// to `{otlp_endpoint}/v1/traces`, as with `OTEL_EXPORTER_OTLP_ENDPOINT`.
    /// A URL that already ends in `/v1/traces` is used as it is.
    pub otlp_endpoint: String,
    /// The share of new traces kept, 0.0 to 1.0 (default 1.0), decided when
    /// a trace's first span opens (a trace not kept makes no OpenTelemetry
    /// span). A request that arrives with a W3C `traceparent` follows its
    /// caller's decision.
    pub sample_ratio: f64,
    /// `service.name` of the exported spans (default `mcp-context`).
    pub service_name: String,
}

impl TelemetrySettings {
    /// The URL spans are posted to.
    pub fn traces_url(&self) -> String {
        let base = self.otlp_endpoint.trim_end_matches('/');
        if base.ends_with("/v1/traces") { base.to_owned() } else { format!("{base}/v1/traces") }
    }
}

/// Validates the `telemetry:` section: an http(s) endpoint (`${VAR}`
/// expanded), a ratio between 0 and 1; every problem at once.
pub(super) fn settings(
    raw: RawTelemetry,
    node: &Node,
    path: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<TelemetrySettings, Vec<Error>> {
    let err = |key: &str, message: String| config_error(path, Some(node.get(key).map_or(node.pos, |n| n.pos)), message);
    let mut errors = Vec::new();
    let endpoint = match expand_vars(&raw.otlp_endpoint, env) {
        Ok(url) if url.starts_with("http://") || url.starts_with("https://") => url,
        Ok(url) => {
            errors.push(err(
                "otlp_endpoint",
                format!(
                    "telemetry.otlp_endpoint must start with http:// or https:// (OTLP over HTTP; got `{}`)",
                    redact_url(&url)
                ),
            ));
            url
        }
        Err(token) => {
            errors.push(err("otlp_endpoint", format!("telemetry.otlp_endpoint: {}", unexpanded(&token))));
            String::new()
        }
    };
    let ratio = raw.sample_ratio.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&ratio) {
        errors.push(err("sample_ratio", format!("telemetry.sample_ratio must be between 0.0 and 1.0 (got {ratio})")));
    }
    let service_name = raw.service_name.unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned());
    if service_name.trim().is_empty() {
        errors.push(err("service_name", "telemetry.service_name must not be empty".into()));
    }
    if errors.is_empty() {
        Ok(TelemetrySettings { otlp_endpoint: endpoint, sample_ratio: ratio, service_name })
    } else {
        Err(errors)
    }
}
