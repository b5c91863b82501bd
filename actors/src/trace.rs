//! Distributed traces: one `tracing` span per hop of a transfer (`http.transfer`,
//! `outbox.publish`, `antifraud.decide`, `ledger.settle`, `projection.apply`,
//! `notify.deliver`), joined into one trace by the W3C `traceparent` that travels in the
//! outbox rows and the Kafka headers.
//!
//! Every hop span declares a `trace_id` field; [`join`] records it from the traceparent,
//! so JSON log lines written inside a hop carry it whether or not traces are exported.
//! When the daemon exports traces (`telemetry.otlp_endpoint`, see
//! `engine/src/telemetry.rs`), [`join`] also makes the span a child of the traceparent's
//! span and returns the span's own traceparent, which the hop passes downstream: the trace
//! is a chain of hops. Without export nothing else happens and the traceparent travels on
//! unchanged.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tally_schema::headers::TRACEPARENT;
use tally_schema::values::is_valid_traceparent;
use tracing::{Instrument, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::supervise::HandlerError;

/// The span of one hop (`$name`, a literal) that consumes `$record` (a
/// [`Record`](crate::consume::Record)), with the fields every consuming hop has: the
/// OpenTelemetry span kind CONSUMER and, once known, its status (`otel.status_code`,
/// `otel.status_description`, `error.type`: see [`failed`]); `trace_id` (set by [`join`]),
/// `transfer.id` and `outcome` (recorded once known); and the semantic-convention
/// attributes of the record (`messaging.*`) and of the database the hop writes to
/// (`db.system`). More fields may follow the record.
macro_rules! hop_span {
    ($name:literal, $record:expr $(, $($extra:tt)+)?) => {{
        let record: &$crate::consume::Record = $record;
        tracing::info_span!(
            $name,
            otel.kind = "consumer",
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
            error.type = tracing::field::Empty,
            trace_id = tracing::field::Empty,
            transfer.id = tracing::field::Empty,
            outcome = tracing::field::Empty,
            messaging.system = "kafka",
            messaging.operation.type = "process",
            messaging.destination.name = record.topic.as_str(),
            messaging.kafka.destination.partition = i64::from(record.partition),
            messaging.kafka.offset = record.offset,
            messaging.kafka.message.key = record.routing_key(),
            db.system = "postgresql",
            $($($extra)+)?
        )
    }};
}
pub(crate) use hop_span;

/// Marks `span` as failed for OpenTelemetry: status ERROR with `message`, and the error's
/// class (`poison`, `transient`, `unavailable`, `dead_lettered`, an HTTP status...) as
/// `error.type`. Only spans that declare those fields (hop spans) take them.
pub fn failed(span: &Span, class: &str, message: &str) {
    span.record("otel.status_code", "error");
    span.record("error.type", class);
    span.record("otel.status_description", message);
}

/// The span of a poison record that reaches no handler (malformed as it came, or it
/// crashed its stage twice) in `pipeline`: a CONSUMER span named `record.poison`, in the
/// record's trace when it carries one, ending at once with status ERROR and `reason`.
pub fn poison(pipeline: &str, record: &crate::consume::Record, reason: &str) {
    let span = hop_span!("record.poison", record, tally.pipeline = pipeline);
    join(&span, record.traceparent());
    failed(&span, "poison", reason);
    span.record("outcome", "dead_lettered");
}

static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Declares that hop spans are exported (the daemon installed its OpenTelemetry layer):
/// from now on [`join`] links spans to their parents and passes their own traceparents on.
pub fn set_exporting(on: bool) {
    EXPORTING.store(on, Ordering::Relaxed);
}

/// Whether hop spans are exported.
#[must_use]
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// A new, sampled traceparent with random trace and span ids.
#[must_use]
pub fn new_traceparent() -> String {
    let trace = uuid::Uuid::new_v4().simple().to_string();
    let span = &uuid::Uuid::new_v4().simple().to_string()[..16];
    format!("00-{trace}-{span}-01")
}

/// The trace id (32 hex digits) of a valid traceparent.
#[must_use]
pub fn trace_id(traceparent: &str) -> Option<&str> {
    is_valid_traceparent(traceparent).then(|| &traceparent[3..35]).filter(|id| id.len() == 32)
}

/// The OpenTelemetry context whose remote parent span is the one `traceparent` names;
/// `None` for anything but a valid traceparent.
#[must_use]
pub fn remote_parent(traceparent: &str) -> Option<Context> {
    if !is_valid_traceparent(traceparent) {
        return None;
    }
    let cx = TraceContextPropagator::new().extract_with_context(&Context::new(), &Carrier::of(traceparent));
    cx.span().span_context().is_valid().then_some(cx)
}

/// The traceparent naming the span of `cx`; `None` when it has no valid span.
#[must_use]
pub fn traceparent_of(cx: &Context) -> Option<String> {
    let mut carrier = Carrier::default();
    TraceContextPropagator::new().inject_context(cx, &mut carrier);
    carrier.traceparent
}

/// Joins the hop span `span` to the trace of `parent` (the traceparent of the row or
/// record at hand, ignored unless valid), before the span is first entered. Records the
/// span's `trace_id`. Returns the traceparent to pass downstream: the span's own when
/// traces are exported, otherwise `parent` itself; `None` without a valid parent (the hop
/// then starts no trace of its own).
pub fn join(span: &Span, parent: Option<&str>) -> Option<String> {
    let parent = parent.filter(|p| is_valid_traceparent(p))?;
    if span.is_disabled() {
        return Some(parent.to_owned());
    }
    if exporting() {
        if let Some(cx) = remote_parent(parent) {
            // Fails only when the span is not exported (then it has no context of its own).
            let _ = span.set_parent(cx);
        }
        if let Some(own) = own_traceparent(span) {
            return Some(own);
        }
    }
    record_trace_id(span, parent);
    Some(parent.to_owned())
}

/// Like [`join`] for the first hop, which may start the trace: without a valid `incoming`
/// traceparent the span is the root of a new trace (when exported) or a new traceparent
/// is made up. Returns the traceparent to pass downstream.
pub fn start(span: &Span, incoming: Option<&str>) -> String {
    if let Some(tp) = join(span, incoming) {
        return tp;
    }
    if exporting() && !span.is_disabled() {
        if let Some(own) = own_traceparent(span) {
            return own;
        }
    }
    let tp = new_traceparent();
    record_trace_id(span, &tp);
    tp
}

/// The span's own traceparent (it starts the span for OpenTelemetry), with its trace id
/// recorded on the span; `None` when the span is not exported.
fn own_traceparent(span: &Span) -> Option<String> {
    let own = traceparent_of(&span.context())?;
    record_trace_id(span, &own);
    Some(own)
}

fn record_trace_id(span: &Span, traceparent: &str) {
    if let Some(id) = trace_id(traceparent) {
        span.record("trace_id", id);
    }
}

/// The outcome of a record its handler dead-lettered itself (a webhook's last attempt).
const DEAD_LETTERED: &str = "dead_lettered";

/// Runs a record handler's future inside its hop `span` and records the outcome there:
/// the handler's outcome label, or the error's class; an error or a dead letter marks the
/// span failed ([`failed`]).
pub fn handled(
    span: Span,
    work: impl Future<Output = Result<&'static str, HandlerError>> + Send + 'static,
) -> BoxFuture<'static, Result<&'static str, HandlerError>> {
    let outer = span.clone();
    async move {
        let result = work.instrument(span).await;
        outer.record("outcome", result.as_ref().map_or_else(|e| e.class.code(), |o| *o));
        match &result {
            Err(e) => failed(&outer, e.class.code(), &e.message),
            Ok(DEAD_LETTERED) => failed(&outer, DEAD_LETTERED, "dead-lettered after its last attempt"),
            Ok(_) => {}
        }
        result
    }
    .boxed()
}

/// A carrier of the one header this module reads and writes.
#[derive(Default)]
struct Carrier<'a> {
    incoming: Option<&'a str>,
    traceparent: Option<String>,
}

impl<'a> Carrier<'a> {
    fn of(traceparent: &'a str) -> Self {
        Self { incoming: Some(traceparent), traceparent: None }
    }
}

impl Extractor for Carrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.incoming.filter(|_| key == TRACEPARENT)
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT]
    }
}

impl Injector for Carrier<'_> {
    fn set(&mut self, key: &str, value: String) {
        if key == TRACEPARENT {
            self.traceparent = Some(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanId, TraceId};

    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_names_a_remote_parent_and_back() {
        let cx = remote_parent(TP).expect("a valid traceparent has a context");
        let span = cx.span();
        let sc = span.span_context();
        assert!(sc.is_remote() && sc.is_sampled());
        assert_eq!(sc.trace_id(), TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap());
        assert_eq!(sc.span_id(), SpanId::from_hex("00f067aa0ba902b7").unwrap());
        assert_eq!(traceparent_of(&cx).as_deref(), Some(TP));
        let unsampled = TP.replace("-01", "-00");
        assert!(!remote_parent(&unsampled).unwrap().span().span_context().is_sampled());
    }

    #[test]
    fn invalid_traceparents_have_no_context() {
        for bad in ["", "garbage", &TP.to_uppercase(), &TP.replace("4bf92f3577b34da6a3ce929d0e0e4736", &"0".repeat(32))]
        {
            assert!(remote_parent(bad).is_none(), "{bad}");
            assert!(trace_id(bad).is_none(), "{bad}");
        }
        assert!(traceparent_of(&Context::new()).is_none());
    }

    #[test]
    fn trace_ids_come_from_the_traceparent() {
        assert_eq!(trace_id(TP), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        let new = new_traceparent();
        assert!(is_valid_traceparent(&new), "{new}");
        assert_eq!(trace_id(&new), Some(&new[3..35]));
    }

    #[test]
    fn exported_hops_chain_to_their_parents() {
        use tracing::field::Empty;
        use tracing_subscriber::layer::SubscriberExt;
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let tracer = opentelemetry::trace::TracerProvider::tracer(&provider, "test");
        let subscriber = tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(tracer));
        set_exporting(true);
        tracing::subscriber::with_default(subscriber, || {
            let hop = tracing::info_span!("test.hop", trace_id = Empty);
            let own = join(&hop, Some(TP)).expect("joined");
            assert_eq!(trace_id(&own), trace_id(TP), "same trace");
            assert_ne!(own[36..52], TP[36..52], "the hop's own span id goes downstream");
            let sc = hop.context().span().span_context().clone();
            assert_eq!(format!("{:016x}", sc.span_id()), own[36..52]);
            let next = tracing::info_span!("test.next", trace_id = Empty);
            let after = join(&next, Some(&own)).expect("joined");
            assert_eq!(trace_id(&after), trace_id(TP));
            assert_ne!(after, own);
            let root = tracing::info_span!("test.root", trace_id = Empty);
            let started = start(&root, None);
            assert!(is_valid_traceparent(&started) && trace_id(&started) != trace_id(TP), "{started}");
            assert_eq!(join(&tracing::info_span!("test.orphan", trace_id = Empty), None), None);
        });
        set_exporting(false);
    }

    #[test]
    fn without_export_the_traceparent_travels_unchanged() {
        // No subscriber: the span is disabled, and the hop passes its parent on as it is.
        let span = tracing::info_span!("test.hop", trace_id = tracing::field::Empty);
        assert_eq!(join(&span, Some(TP)).as_deref(), Some(TP));
        assert_eq!(join(&span, Some("garbage")), None);
        assert_eq!(join(&span, None), None);
        assert_eq!(start(&span, Some(TP)), TP);
        let started = start(&span, None);
        assert!(is_valid_traceparent(&started) && started != TP, "{started}");
    }
}
