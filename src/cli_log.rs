//! The CLI's logs (text or JSON on stderr) and, with `telemetry:`, the OTLP
//! exporter of traces: installed once the command knows its config. In the
//! text form every field's value (of events and of spans) is escaped
//! ([`EscapedFields`]): a resource URI, a server's stderr line or a caller's
//! value holding a newline, an escape sequence or a bidirectional control
//! stays on its line and reaches no terminal raw. The JSON form is exact.

use std::fmt;

use mcp_context::display::Escaped;
use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::Writer;

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
    let layer =
        tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_target(false).fmt_fields(EscapedFields);
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

/// The text log's fields as tracing-subscriber's default writes them
/// (`message` first, bare; then `name=value`, strings quoted), every value
/// escaped as [`mcp_context::display::escape`] does. The default escapes
/// only a few controls in the message, and none in fields written with `%`,
/// nor newlines or bidirectional controls anywhere.
struct EscapedFields;

impl<'writer> FormatFields<'writer> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut visitor = EscapingVisitor { writer: &mut writer, first: true, result: Ok(()) };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct EscapingVisitor<'a, 'writer> {
    writer: &'a mut Writer<'writer>,
    first: bool,
    result: fmt::Result,
}

impl EscapingVisitor<'_, '_> {
    fn write(&mut self, field: &Field, value: fmt::Arguments<'_>) {
        let name = field.name();
        if self.result.is_err() || name.starts_with("log.") {
            return;
        }
        let sep = if std::mem::take(&mut self.first) { "" } else { " " };
        self.result = match name.strip_prefix("r#").unwrap_or(name) {
            "message" => write!(self.writer, "{sep}{}", Escaped(value)),
            name => write!(self.writer, "{sep}{name}={}", Escaped(value)),
        };
    }
}

impl Visit for EscapingVisitor<'_, '_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.write(field, format_args!("{value}"));
        } else {
            self.write(field, format_args!("{value:?}"));
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        let mut text = value.to_string();
        let mut source = value.source();
        while let Some(s) = source {
            text.push_str(": ");
            text.push_str(&s.to_string());
            source = s.source();
        }
        self.write(field, format_args!("{text}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.write(field, format_args!("{value:?}"));
    }
}
