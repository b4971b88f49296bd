//! The CLI's logs (text or JSON on stderr) and, with `telemetry:`, the OTLP
//! exporter of traces: installed once the command knows its config.

/// How log lines are written.
#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// The log filter: `MCP_CONTEXT_LOG`, else by `-v`.
fn log_filter(verbose: u8) -> tracing_subscriber::EnvFilter {
    // rmcp's own logs can carry request URLs (and so query-string keys):
    // they stay off unless asked for by name in MCP_CONTEXT_LOG.
    let default = match verbose {
        0 => "warn,rmcp=off",
        1 => "info,rmcp=off",
        _ => "debug,rmcp=off,process_wrap=off",
    };
    tracing_subscriber::EnvFilter::try_from_env("MCP_CONTEXT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default))
}

/// The log lines on stderr: text, or (`--log-format json`) one JSON object
/// per event with its level, time, fields, the current span's and (`spans`)
/// those of every span it is in, outermost first: a request's ids are on
/// `mcp_context.request`.
fn log_layer<S>(verbose: u8, format: LogFormat) -> impl tracing_subscriber::Layer<S> + Send + Sync
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use mcp_context::telemetry::Unpolled;
    use tracing_subscriber::Layer;
    if format == LogFormat::Json {
        let layer = tracing_subscriber::fmt::layer().json().with_current_span(true).with_span_list(true);
        return Unpolled(layer.with_writer(std::io::stderr).boxed().with_filter(log_filter(verbose))).boxed();
    }
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_target(false);
    let layer = layer.with_ansi(colour_on_stderr());
    // Without -v only warnings show: a timestamp is noise next to `warning:` lines.
    let layer = if verbose == 0 { layer.without_time().boxed() } else { layer.boxed() };
    // Neither formatter writes span events, so neither needs to hear of each poll.
    Unpolled(layer.with_filter(log_filter(verbose))).boxed()
}

/// Logs only: what a config load may warn about, before the config says
/// whether traces are exported.
pub(crate) fn log_subscriber(verbose: u8, format: LogFormat) -> impl tracing::Subscriber + Send + Sync {
    use tracing_subscriber::layer::SubscriberExt;
    tracing_subscriber::registry().with(log_layer(verbose, format))
}

/// Installs the logs and, with `telemetry:` in the config (and the `otel`
/// feature), the OTLP exporter of traces, whose handle flushes them at the
/// end. Called once, when the command knows its config.
pub(crate) fn init_tracing(
    verbose: u8,
    format: LogFormat,
    telemetry: Option<&mcp_context::settings::TelemetrySettings>,
) -> anyhow::Result<Tracing> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let logs = tracing_subscriber::registry().with(log_layer(verbose, format));
    #[cfg(feature = "otel")]
    if let Some(settings) = telemetry {
        let (traces, handle) = mcp_context::telemetry::otlp_layer(settings)?;
        let _ = logs.with(traces).try_init();
        return Ok(Tracing(Some(handle)));
    }
    #[cfg(not(feature = "otel"))]
    if telemetry.is_some() {
        anyhow::bail!("telemetry: this build has no trace exporter (feature `otel`)");
    }
    let _ = logs.try_init();
    Ok(Tracing(None))
}

/// The trace exporter, when there is one: flushed by [`Tracing::end`].
pub(crate) struct Tracing(
    #[cfg(feature = "otel")] Option<mcp_context::telemetry::Telemetry>,
    #[cfg(not(feature = "otel"))] Option<()>,
);

impl Tracing {
    /// Sends the spans still buffered (off the runtime's threads: the export waits on them).
    pub(crate) async fn end(self) {
        #[cfg(feature = "otel")]
        if let Some(t) = self.0 {
            let _ = tokio::task::spawn_blocking(move || t.shutdown()).await;
        }
    }
}

/// ANSI colour only for a terminal, and never with `NO_COLOR` set (no-color.org).
fn colour_on_stderr() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}
