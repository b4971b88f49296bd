//! The OTLP/HTTP (protobuf) exporter: a batch of spans posted to
//! `{otlp_endpoint}/v1/traces` from a background thread, through this
//! crate's own reqwest client (rustls; no second HTTP stack) run on the
//! application's tokio runtime.

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

use crate::config::TelemetrySettings;
use crate::error::{Error, Result};

/// The exporter's lifetime: [`Telemetry::shutdown`] sends what is still
/// buffered (call it before the runtime ends).
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// Exports the spans still buffered and stops the exporter.
    pub fn shutdown(self) {
        let _ = self.provider.force_flush();
        let _ = self.provider.shutdown();
    }
}

/// A `tracing` layer that turns this crate's spans (and the application's)
/// into OpenTelemetry spans exported as `settings` say, plus the handle
/// that flushes them. Must be called inside a tokio runtime: exports run on it.
///
/// Sampling is decided when a trace's first span opens (see `gate.rs`): a
/// request that arrives with a `traceparent` follows its caller's decision;
/// a new trace is kept with probability `sample_ratio`. Spans of traces not
/// kept never reach the OpenTelemetry layer, so they cost next to nothing.
pub fn otlp_layer<S>(settings: &TelemetrySettings) -> Result<(impl Layer<S> + Send + Sync + use<S>, Telemetry)>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    let rt = tokio::runtime::Handle::try_current()
        .map_err(|_| Error::Telemetry { what: "the OTLP exporter must be started inside a tokio runtime".into() })?;
    let http = reqwest::Client::builder().connect_timeout(Duration::from_secs(5)).timeout(Duration::from_secs(10));
    let http =
        http.build().map_err(|e| Error::Telemetry { what: format!("cannot build the OTLP HTTP client: {e}") })?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(Client { http, rt })
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(settings.traces_url())
        .build()
        .map_err(|e| Error::Telemetry { what: format!("cannot start the OTLP exporter: {e}") })?;
    // The gate below decided: every span that reaches the SDK is kept.
    let sampler = Sampler::AlwaysOn;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(sampler)
        .with_resource(Resource::builder().with_service_name(settings.service_name.clone()).build())
        .build();
    let tracer = provider.tracer("mcp-context");
    // Spans from `info`; events (which become span events) only from `warn`: the proxy's `info` events carry
    // the whole report as JSON (a thousand exclusions is 60 KB), and a layer that wanted them would have
    // every request build that text, copy it into its span and export it, whatever the log filter says.
    // rmcp's own events can quote request URLs (and so query-string keys): never.
    let filter = tracing_subscriber::filter::filter_fn(|meta| {
        let floor = if meta.is_span() { tracing::Level::INFO } else { tracing::Level::WARN };
        *meta.level() <= floor && !meta.target().starts_with("rmcp")
    })
    .with_max_level_hint(tracing::Level::INFO);
    // Per span, only what a trace reader uses: no `busy_ns`/`idle_ns` (a clock read on every poll of every
    // instrumented future), no thread name and id, no source file and line (four string attributes a span); no
    // OpenTelemetry context attached to the thread on each enter (nothing here reads `Context::current`).
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_tracked_inactivity(false)
        .with_threads(false)
        .with_location(false)
        .with_context_activation(false);
    let layer = super::Unpolled(super::gate::Gate::new::<S>(layer, settings.sample_ratio).with_filter(filter));
    Ok((layer, Telemetry { provider }))
}

/// The exporter's HTTP client: each request runs on the tokio runtime (the
/// batch processor's thread has none) and its answer comes back through a
/// channel.
#[derive(Debug)]
struct Client {
    http: reqwest::Client,
    rt: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Client {
    async fn send_bytes(
        &self,
        request: http::Request<opentelemetry_http::Bytes>,
    ) -> std::result::Result<http::Response<opentelemetry_http::Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let send = self.http.request(parts.method, parts.uri.to_string()).headers(parts.headers).body(body);
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.rt.spawn(async move {
            let answer = async {
                let response = send.send().await?;
                let (status, headers) = (response.status(), response.headers().clone());
                Ok::<_, reqwest::Error>((status, headers, response.bytes().await?))
            };
            let _ = tx.send(answer.await);
        });
        let (status, headers, body) = rx.await??;
        let mut response = http::Response::new(body);
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        Ok(response)
    }
}
