//! Distributed traces: one transfer, from POST /transfers to the webhook, is one trace of
//! hop spans exported over OTLP/HTTP, each hop the child of the one before; and the
//! daemon's JSON log lines written inside a hop carry the trace id; and a collector that is
//! down changes nothing but the log.
//!
//! The daemon runs as a child process (`tally run`): the trace export is process-wide.
//! Broker: the harness's embedded broker (librdkafka's mock cluster), an external cluster
//! to the child. Database: a fresh PostgreSQL database. Two local HTTP servers play the
//! OTLP collector and the webhook receiver.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use std::collections::HashMap;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Attr;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use serde_json::{json, Value};
use tally_integration_tests::{
    free_addr, spawn_tally_process, wait_exit, wait_settled, wait_until, Deadline, ReceivedCall, TallyProcess, TestEnv,
    WebhookReceiver,
};

/// The hops of a settled, notified transfer, in order; `outbox.publish` twice (the request
/// and the settlement), told apart by topic.
const HOPS: [(&str, Option<&str>); 7] = [
    ("http.transfer", None),
    ("outbox.publish", Some("transfers.requested")),
    ("antifraud.decide", Some("transfers.requested")),
    ("ledger.settle", Some("transfers.analyzed")),
    ("outbox.publish", Some("transfers.settled")),
    ("projection.apply", Some("transfers.settled")),
    ("notify.deliver", Some("transfers.settled")),
];

/// The hop each hop is the child of, by index in [`HOPS`].
const PARENT: [Option<usize>; 7] = [None, Some(0), Some(1), Some(2), Some(3), Some(4), Some(4)];

/// One span as the collector received it.
#[derive(Debug, Clone)]
struct Span {
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    start_ns: u64,
    kind: SpanKind,
    status: StatusCode,
    status_message: String,
    attributes: HashMap<String, String>,
}

impl Span {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }

    fn is_hop(&self, (name, topic): (&str, Option<&str>)) -> bool {
        self.name == name && topic.is_none_or(|t| self.attr("messaging.destination.name") == Some(t))
    }
}

/// Every span of every OTLP/HTTP JSON export the collector received, decoded with the
/// OpenTelemetry protocol's own message types (as a collector decodes them).
fn received_spans(calls: &[ReceivedCall]) -> Vec<Span> {
    let mut spans = Vec::new();
    for call in calls {
        let request: ExportTraceServiceRequest =
            serde_json::from_slice(&call.body).expect("an OTLP/JSON ExportTraceServiceRequest");
        for s in request.resource_spans.into_iter().flat_map(|r| r.scope_spans).flat_map(|s| s.spans) {
            let attributes = s
                .attributes
                .iter()
                .filter_map(|a| {
                    let value = match a.value.as_ref()?.value.as_ref()? {
                        Attr::StringValue(v) => v.clone(),
                        Attr::IntValue(v) => v.to_string(),
                        Attr::BoolValue(v) => v.to_string(),
                        Attr::DoubleValue(v) => v.to_string(),
                        other => format!("{other:?}"),
                    };
                    Some((a.key.clone(), value))
                })
                .collect();
            let status = s.status.clone().unwrap_or_default();
            spans.push(Span {
                name: s.name.clone(),
                trace_id: hex(&s.trace_id),
                span_id: hex(&s.span_id),
                parent: hex(&s.parent_span_id),
                start_ns: s.start_time_unix_nano,
                kind: SpanKind::try_from(s.kind).expect("a known span kind"),
                status: StatusCode::try_from(status.code).expect("a known status code"),
                status_message: status.message,
                attributes,
            });
        }
    }
    spans
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The child daemon, killed however the test ends.
async fn post(http: &reqwest::Client, url: String, body: Value) -> Value {
    let res = http.post(&url).json(&body).send().await.expect("POST");
    assert_eq!(res.status(), reqwest::StatusCode::CREATED, "POST {url}");
    res.json().await.expect("JSON body")
}

/// A `tally run` child on `env` exporting traces to `endpoint`, notifying `webhook`, with
/// JSON logs; once ready, with accounts T-A and T-B.
struct Child_ {
    daemon: TallyProcess,
    intake: String,
    admin: String,
    log_path: std::path::PathBuf,
}

async fn start_child(env: &TestEnv, endpoint: &str, webhook: &WebhookReceiver, extra: &[(&str, &str)]) -> Child_ {
    // The child does not create topics (the mock has no Admin API): the harness does.
    let mut config = tally_engine::Config::default();
    config.notifications.webhook_url = tally_engine::config::SecretUrl::new(webhook.url.clone());
    for spec in tally_engine::topics::topic_specs(&config) {
        env.broker.create_topic_if_missing(&spec.name, spec.partitions, 1).expect("topic");
    }
    let (intake, admin) = (free_addr(), free_addr());
    let instance = format!("traces-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let mut vars = vec![
        ("TALLY__INSTANCE__ID", instance.as_str()),
        ("TALLY__HTTP__INTAKE_ADDR", intake.as_str()),
        ("TALLY__HTTP__ADMIN_ADDR", admin.as_str()),
        ("TALLY__LOG__FORMAT", "json"),
        // The webhook delivery line (DEBUG) is written inside its hop.
        ("RUST_LOG", "info,tally_actors::notify=debug"),
        ("TALLY__TELEMETRY__OTLP_ENDPOINT", endpoint),
        ("TALLY__NOTIFICATIONS__WEBHOOK_URL", webhook.url.as_str()),
        ("TALLY__NOTIFICATIONS__WEBHOOK_SECRET", "traces-secret"),
        // The SDK's batch processor sends every 200 ms rather than every 5 s.
        ("OTEL_BSP_SCHEDULE_DELAY", "200"),
    ];
    vars.extend_from_slice(extra);
    let daemon = spawn_tally_process(env, &vars);
    let log_path = tally_integration_tests::logs::test_log_dir().join(format!("tally-{instance}.log"));
    let http = reqwest::Client::new();
    wait_until("the child is ready", Deadline::secs(120), || async {
        match http.get(format!("http://{admin}/readyz")).send().await {
            Ok(r) if r.status() == reqwest::StatusCode::OK => Ok(()),
            Ok(r) => Err(format!("{}: {}", r.status(), r.text().await.unwrap_or_default())),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    for (id, balance) in [("T-A", 1_000_000), ("T-B", 0)] {
        post(
            &http,
            format!("http://{intake}/accounts"),
            json!({ "id": id, "currency": "BRL", "initialBalanceCents": balance }),
        )
        .await;
    }
    Child_ { daemon, intake, admin, log_path }
}

/// Sends SIGTERM and waits for the exit; true when it exited 0.
async fn stop_cleanly(daemon: &mut TallyProcess) -> bool {
    let _ = std::process::Command::new("kill").arg("-TERM").arg(daemon.id().to_string()).status();
    wait_exit(daemon, "the child exits", Deadline::DEFAULT).await
}

async fn transfer(http: &reqwest::Client, intake: &str) -> String {
    let created = post(
        http,
        format!("http://{intake}/transfers"),
        json!({ "sourceAccount": "T-A", "destinationAccount": "T-B", "amountCents": 2_500, "currency": "BRL" }),
    )
    .await;
    created["id"].as_str().expect("transfer id").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hop_of_a_transfer_shares_one_trace() {
    let env = TestEnv::new().await;
    let collector = WebhookReceiver::start(|_, _| 200).await;
    let webhook = WebhookReceiver::start(|_, _| 200).await;
    let endpoint = collector.url.trim_end_matches("/hook").to_owned();
    let Child_ { mut daemon, intake, admin: _, log_path } = start_child(&env, &endpoint, &webhook, &[]).await;
    let http = reqwest::Client::new();
    let transfer = transfer(&http, &intake).await;
    wait_settled(&http, &intake, &transfer).await;
    wait_until("the webhook is notified", Deadline::DEFAULT, || async {
        let calls = webhook.calls();
        if calls.iter().any(|c| c.status == 200) {
            Ok(())
        } else {
            Err(format!("{} calls", calls.len()))
        }
    })
    .await;

    // Every hop of the transfer reached the collector.
    let spans = wait_until("every hop span of the transfer is exported", Deadline::DEFAULT, || async {
        let spans: Vec<Span> = received_spans(&collector.calls())
            .into_iter()
            .filter(|s| s.attr("transfer.id") == Some(transfer.as_str()))
            .collect();
        let missing: Vec<String> = HOPS
            .iter()
            .filter(|hop| !spans.iter().any(|s| s.is_hop(**hop)))
            .map(|(name, topic)| format!("{name} {}", topic.unwrap_or("")))
            .collect();
        if missing.is_empty() {
            Ok(spans)
        } else {
            Err(format!("missing {missing:?}; got {:?}", spans.iter().map(|s| &s.name).collect::<Vec<_>>()))
        }
    })
    .await;
    for call in collector.calls() {
        assert_eq!(call.request, "POST /v1/traces", "OTLP/HTTP traces path");
        assert_eq!(call.headers.get("content-type").map(String::as_str), Some("application/json"), "http/json");
    }

    print_trace(&spans);
    let root = spans.iter().find(|s| s.is_hop(HOPS[0])).expect("http.transfer");
    assert!(root.parent.is_empty(), "a request without a traceparent starts the trace: {root:?}");
    assert_eq!(root.trace_id.len(), 32, "{root:?}");
    assert!(spans.iter().all(|s| s.trace_id == root.trace_id), "one trace id: {spans:#?}");
    // A chain, not a star: each hop is the child of the hop before it.
    let by_id: HashMap<&str, &Span> = spans.iter().map(|s| (s.span_id.as_str(), s)).collect();
    for (hop, parent) in HOPS.iter().zip(PARENT) {
        let Some(parent) = parent else { continue };
        for span in spans.iter().filter(|s| s.is_hop(*hop)) {
            let up = by_id.get(span.parent.as_str()).unwrap_or_else(|| panic!("the parent of {span:?} is exported"));
            assert!(
                up.is_hop(HOPS[parent]),
                "{} {:?} is the child of {:?}, not {:?}",
                span.name,
                hop.1,
                up,
                HOPS[parent]
            );
        }
    }
    assert!(spans.iter().any(|s| s.is_hop(HOPS[3]) && s.attr("outcome") == Some("settled")), "{spans:#?}");
    // OpenTelemetry's conventions: span kinds, no error anywhere, the semantic attributes.
    for s in &spans {
        let kind = match s.name.as_str() {
            "http.transfer" => SpanKind::Server,
            "outbox.publish" => SpanKind::Producer,
            _ => SpanKind::Consumer,
        };
        assert_eq!(s.kind, kind, "{s:?}");
        assert_eq!(s.status, StatusCode::Unset, "a settled transfer fails nowhere: {s:?}");
        assert_eq!(s.attr("db.system"), Some("postgresql"), "{s:?}");
        if s.name == "http.transfer" {
            continue;
        }
        assert_eq!(s.attr("messaging.system"), Some("kafka"), "{s:?}");
        for key in ["messaging.kafka.destination.partition", "messaging.kafka.offset"] {
            assert!(s.attr(key).is_some_and(|v| v.parse::<i64>().is_ok_and(|n| n >= 0)), "{key} of {s:?}");
        }
        assert!(s.attr("messaging.kafka.message.key").is_some_and(|k| k.starts_with("T-")), "{s:?}");
    }
    for (key, value) in
        [("http.request.method", "POST"), ("http.route", "/transfers"), ("http.response.status_code", "201")]
    {
        assert_eq!(root.attr(key), Some(value), "{key} of {root:?}");
    }

    // The daemon's JSON log lines written inside a hop carry the trace id.
    let line = wait_until("a JSON log line carries the trace id", Deadline::DEFAULT, || async {
        let log = std::fs::read_to_string(&log_path).map_err(|e| e.to_string())?;
        log.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|l| l["span"]["trace_id"] == root.trace_id.as_str())
            .ok_or_else(|| format!("{} lines, none with trace_id {}", log.lines().count(), root.trace_id))
    })
    .await;
    println!("log line: {line}");

    // A clean stop sends the last spans and exits 0.
    let stopped = stop_cleanly(&mut daemon).await;
    assert!(stopped, "tally run exits 0 after SIGTERM with traces on");
}

/// The trace as a table for the reader: span name, topic, span id, parent, start offset.
fn print_trace(spans: &[Span]) {
    let mut sorted: Vec<&Span> = spans.iter().collect();
    sorted.sort_by_key(|s| s.start_ns);
    let first = sorted.first().map_or(0, |s| s.start_ns);
    println!("trace {}", sorted.first().map_or("", |s| s.trace_id.as_str()));
    println!("{:<18} {:<22} {:<16} {:<16} {:>9}", "span", "topic", "span id", "parent", "start ms");
    for s in sorted {
        let parent = if s.parent.is_empty() { "-" } else { s.parent.as_str() };
        let offset = s.start_ns.saturating_sub(first) as f64 / 1e6;
        let topic = s.attr("messaging.destination.name").unwrap_or("-");
        println!("{:<18} {:<22} {:<16} {:<16} {offset:>9.1}", s.name, topic, s.span_id, parent);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_costs_the_money_path_nothing() {
    let env = TestEnv::new().await;
    let webhook = WebhookReceiver::start(|_, _| 200).await;
    // Nothing listens there: every export fails.
    let endpoint = format!("http://{}", free_addr());
    let Child_ { mut daemon, intake, admin, log_path } = start_child(&env, &endpoint, &webhook, &[]).await;
    let http = reqwest::Client::new();
    let mut ids = Vec::new();
    for _ in 0..20 {
        ids.push(transfer(&http, &intake).await);
    }
    for id in &ids {
        wait_settled(&http, &intake, id).await;
    }
    let check: Value = http
        .get(format!("http://{admin}/admin/ledger/check"))
        .send()
        .await
        .expect("GET /admin/ledger/check")
        .json()
        .await
        .expect("JSON");
    assert_eq!(check["ok"], true, "{check}");
    // The exports failed (and said so), and a stop does not hang on them.
    let log = wait_until("the failed exports are logged", Deadline::DEFAULT, || async {
        let log = std::fs::read_to_string(&log_path).map_err(|e| e.to_string())?;
        if log.lines().any(|l| l.contains("ExportError")) {
            Ok(log)
        } else {
            Err(format!("{} lines, none from the exporter", log.lines().count()))
        }
    })
    .await;
    assert!(log.lines().all(|l| !l.contains("panicked")), "no panic");
    assert!(stop_cleanly(&mut daemon).await, "tally run exits 0 after SIGTERM with its collector down");
}

/// The spans with `pred` the collector has, once `ready` accepts them.
async fn wait_spans(
    collector: &WebhookReceiver,
    what: &str,
    pred: impl Fn(&Span) -> bool,
    ready: impl Fn(&[Span]) -> bool,
) -> Vec<Span> {
    wait_until(what, Deadline::DEFAULT, || async {
        let spans: Vec<Span> = received_spans(&collector.calls()).into_iter().filter(|s| pred(s)).collect();
        if ready(&spans) {
            Ok(spans)
        } else {
            Err(format!("got {:?}", spans.iter().map(|s| (&s.name, s.status)).collect::<Vec<_>>()))
        }
    })
    .await
}

/// A blocked transfer is a business outcome, not an error; a poison record is: its span
/// (in its trace when it carries one, a root otherwise) has status ERROR and the error's
/// class, whichever stage dead-letters it. A client's mistake (409) is not the server's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_transfers_and_poison_records_show_in_traces() {
    let env = TestEnv::new().await;
    let collector = WebhookReceiver::start(|_, _| 200).await;
    let webhook = WebhookReceiver::start(|_, _| 200).await;
    let endpoint = collector.url.trim_end_matches("/hook").to_owned();
    // Every transfer scores at least 1: every one is blocked.
    let child = start_child(&env, &endpoint, &webhook, &[("TALLY__ANTIFRAUD__BLOCK_SCORE", "1")]).await;
    let Child_ { mut daemon, intake, log_path, .. } = child;
    let http = reqwest::Client::new();

    let blocked = transfer(&http, &intake).await;
    let hops = wait_spans(
        &collector,
        "the spans of the blocked transfer",
        |s| s.attr("transfer.id") == Some(blocked.as_str()),
        |spans| ["antifraud.decide", "projection.apply"].iter().all(|n| spans.iter().any(|s| &s.name == n)),
    )
    .await;
    println!("a blocked transfer:");
    print_trace(&hops);
    let decide = hops.iter().find(|s| s.name == "antifraud.decide").expect("antifraud.decide");
    assert_eq!(decide.attr("outcome"), Some("blocked"), "{decide:?}");
    assert!(hops.iter().all(|s| s.status == StatusCode::Unset), "blocking is no error: {hops:#?}");
    assert!(hops.iter().all(|s| s.name != "ledger.settle"), "{hops:#?}");

    // Poison in the antifraud stage (signed, so that it is not refused at the door),
    // without a traceparent: a root span of its own.
    env.upstream().signed("transfers.requested", None, "T-POISON-1", b"{not json", "TransferRequested").await;
    // Poison for the ledger (signed, so that it reaches the stage), in a trace: its
    // ledger.settle hop fails, in that trace.
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    env.upstream()
        .signed_with("transfers.analyzed", None, "T-POISON-2", b"{not json", "TransferAnalyzed", &[("traceparent", tp)])
        .await;
    let poison = wait_spans(
        &collector,
        "the spans of both poison records",
        |s| s.attr("messaging.kafka.message.key").is_some_and(|k| k.starts_with("T-POISON")),
        |spans| spans.len() >= 2,
    )
    .await;
    println!("poison records:");
    print_trace(&poison);
    for s in &poison {
        println!("{} {:?} {:?} {:?}", s.name, s.status, s.status_message, s.attributes);
    }
    let antifraud = poison.iter().find(|s| s.attr("messaging.kafka.message.key") == Some("T-POISON-1")).expect("one");
    assert_eq!(antifraud.name, "record.poison", "{antifraud:?}");
    assert_eq!(antifraud.attr("tally.pipeline"), Some("antifraud"), "{antifraud:?}");
    assert!(antifraud.parent.is_empty(), "{antifraud:?}");
    let ledger = poison.iter().find(|s| s.attr("messaging.kafka.message.key") == Some("T-POISON-2")).expect("two");
    assert_eq!(ledger.name, "ledger.settle", "{ledger:?}");
    assert_eq!(ledger.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736", "in the record's trace: {ledger:?}");
    assert_eq!(ledger.parent, "00f067aa0ba902b7", "{ledger:?}");
    for s in [antifraud, ledger] {
        assert_eq!(s.kind, SpanKind::Consumer, "{s:?}");
        assert_eq!(s.status, StatusCode::Error, "{s:?}");
        assert_eq!(s.attr("error.type"), Some("poison"), "{s:?}");
        assert!(s.status_message.contains("undecodable"), "the reason: {s:?}");
        assert!(s.attr("messaging.destination.name").is_some(), "{s:?}");
    }

    // The antifraud stage logs its poison as every stage logs a dead letter.
    let logged = wait_until("the antifraud poison is logged", Deadline::DEFAULT, || async {
        let log = std::fs::read_to_string(&log_path).map_err(|e| e.to_string())?;
        log.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|l| l["message"] == "Record dead-lettered." && l["topic"] == "transfers.requested")
            .ok_or_else(|| format!("{} lines, none for the antifraud poison", log.lines().count()))
    })
    .await;
    println!("{logged}");
    assert_eq!(logged["level"], "ERROR", "{logged}");
    assert!(logged["reason"].as_str().is_some_and(|r| r.contains("undecodable")), "{logged}");

    // A request the client got wrong: 409, and the server span does not fail.
    let body = json!({ "sourceAccount": "T-A", "destinationAccount": "T-B", "amountCents": 10, "currency": "BRL" });
    let send = |amount: i64| {
        let mut body = body.clone();
        body["amountCents"] = json!(amount);
        http.post(format!("http://{intake}/transfers")).header("Idempotency-Key", "traces-409").json(&body).send()
    };
    assert_eq!(send(10).await.expect("POST").status(), reqwest::StatusCode::CREATED);
    assert_eq!(send(11).await.expect("POST").status(), reqwest::StatusCode::CONFLICT);
    let conflict = wait_spans(
        &collector,
        "the span of the 409",
        |s| s.name == "http.transfer" && s.attr("http.response.status_code") == Some("409"),
        |spans| !spans.is_empty(),
    )
    .await;
    assert_eq!(conflict[0].kind, SpanKind::Server, "{conflict:?}");
    assert_eq!(conflict[0].status, StatusCode::Unset, "a 4xx is not the server's error: {conflict:?}");
    assert!(stop_cleanly(&mut daemon).await, "tally run exits 0 after SIGTERM");
}
