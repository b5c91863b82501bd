//! Logging and trace export set-up: `tracing` with pretty or JSON lines (`RUST_LOG`
//! overrides `log.level`), and, when `telemetry.otlp_endpoint` is set, the hop spans of
//! [`tally_actors::trace`] exported over OTLP/HTTP as JSON.
//!
//! JSON lines carry the fields of the span they were written in (`"span":{...}`), so a
//! line written inside a hop carries its `trace_id`. Export runs on the SDK's batch
//! processor thread, through reqwest's blocking client, outside every actix runtime; it
//! gets the hop spans only (spans with a `trace_id` field), whatever `log.level` says.
//! Without an endpoint no OpenTelemetry layer exists at all.

use anyhow::Context;
use opentelemetry::trace::TracerProvider;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing::Metadata;
use tracing_subscriber::filter::{filter_fn, LevelFilter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, EnvFilter, Layer};

use crate::config::{LogFormat, TelemetryConfig};
use crate::Config;

/// The running trace export; [`TraceExport::shutdown`] sends the last spans.
#[derive(Debug, Default)]
pub struct TraceExport {
    provider: Option<SdkTracerProvider>,
}

impl TraceExport {
    /// Exports the spans still queued and stops the export (call it once every span has
    /// ended: after the actor system is gone).
    pub fn shutdown(self) {
        let Some(provider) = self.provider else { return };
        tally_actors::trace::set_exporting(false);
        match provider.shutdown() {
            Ok(()) => tracing::info!("Trace export stopped after sending the last spans."),
            Err(e) => tracing::warn!(error = %e, "Trace export stopped; the last spans may be lost."),
        }
    }
}

/// Installs the global subscriber once (later calls install nothing and export nothing):
/// log lines as `config.log` says, and the trace export when `config.telemetry` has an
/// endpoint.
///
/// # Errors
/// When the OTLP exporter cannot be built.
pub fn init(config: &Config) -> anyhow::Result<TraceExport> {
    let log = &config.log;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&log.level));
    let lines = match log.format {
        LogFormat::Json => fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(std::io::stderr)
            .boxed(),
        // Colours only for a terminal: not in a file, a pipe or the journal.
        LogFormat::Pretty => fmt::layer()
            .compact()
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let provider = match config.telemetry.traces_url() {
        Some(url) => Some(tracer_provider(&config.telemetry, &config.instance.id, &url)?),
        None => None,
    };
    // Hop spans are INFO: the hint keeps finer callsites (and `log` records) off for export.
    let hops_only = filter_fn(is_hop_span).with_max_level_hint(LevelFilter::INFO);
    let hops =
        provider.as_ref().map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("tally")).with_filter(hops_only));
    let installed = tracing_subscriber::registry().with(lines.with_filter(filter)).with(hops).try_init().is_ok();
    let Some(provider) = provider else { return Ok(TraceExport::default()) };
    if !installed {
        let _ = provider.shutdown();
        return Ok(TraceExport::default());
    }
    tally_actors::trace::set_exporting(true);
    tracing::info!(endpoint = config.telemetry.otlp_endpoint.as_deref(), "Exporting traces over OTLP/HTTP.");
    Ok(TraceExport { provider: Some(provider) })
}

/// The spans of [`tally_actors::trace`]: every hop span declares `trace_id`.
fn is_hop_span(meta: &Metadata<'_>) -> bool {
    meta.is_span() && meta.fields().field("trace_id").is_some()
}

fn tracer_provider(telemetry: &TelemetryConfig, instance: &str, url: &str) -> anyhow::Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpJson)
        .with_endpoint(url)
        .build()
        .with_context(|| format!("cannot build the OTLP exporter for {url}"))?;
    let resource = Resource::builder()
        .with_service_name(telemetry.service_name.clone())
        .with_attribute(KeyValue::new("service.instance.id", instance.to_owned()))
        .build();
    Ok(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
}
