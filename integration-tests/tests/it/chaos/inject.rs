//! Records produced straight to the consumed topics during a chaos run: poison, hostile
//! (odd headers or keys), forged events (signed with the daemons' key, each contradicting
//! what the stages recorded) and replays of real records, due on the logical clock.

use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use serde_json::{json, Value};
use tally_integration_tests::hostile::{try_produce_raw, RawRecord};
use tally_integration_tests::{producer, read_topic, Deadline, TestEnv};

use super::checks::json_of;
use super::load::{hash, Forged, History, Injected, Progress};
use super::CONSUMED;

/// Answered requests between two injections.
const EVERY: usize = 50;

/// After every [`EVERY`] answered requests, a poison record, a hostile record, a forged
/// event ([`forged`]) and a copy of the newest record (same key, headers and partition, as
/// a redelivery or a replayed dump) to the next consumed topic; until `progress.stop`.
/// Markers and forged ids come from the seed.
pub(super) async fn records(env: &TestEnv, seed: u64, (progress, history): (&Progress, &Mutex<History>)) {
    let producer = producer(env.bootstrap());
    let keyring = env.keyring();
    let mut n = 0;
    loop {
        while progress.now() < (n + 1) * EVERY {
            if progress.stop.load(Ordering::SeqCst) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let topic = CONSUMED[n % CONSUMED.len()];
        n += 1;
        let marker = format!("chaos-poison-{n}-{:016x}", hash(seed, &format!("poison {n}")));
        let poison =
            RawRecord { key: Some(b"C-0".to_vec()), value: Some(marker.clone().into_bytes()), headers: vec![] };
        let hostile_marker = format!("chaos-hostile-{n}-{:016x}", hash(seed, &format!("hostile {n}")));
        let hostile = hostile_record(n, hostile_marker.as_bytes());
        // Until the broker takes them (a fault may refuse the topic for a while).
        let bootstrap = env.bootstrap().to_owned();
        tokio::task::spawn_blocking(move || loop {
            match try_produce_raw(&bootstrap, topic, (n % 2) as i32, &[poison.clone(), hostile.clone()]) {
                Ok(()) => return,
                Err(e) => eprintln!("chaos: poison to {topic} not taken yet ({e}); again"),
            }
            std::thread::sleep(Duration::from_millis(500));
        })
        .await
        .expect("produce poison and hostile records");
        let injected = [marker, hostile_marker].map(|marker| Injected { topic: topic.to_owned(), marker });
        history.lock().expect("history").poison.extend(injected);
        let newest_transfer = history
            .lock()
            .expect("history")
            .calls
            .iter()
            .rev()
            .find(|c| c.path == "/transfers" && c.status == 201)
            .and_then(|c| c.response["id"].as_str().map(str::to_owned));
        let (event, kind, forged) = forged(seed, n, topic, newest_transfer);
        let payload = event.to_string();
        let event_id = event["eventId"].as_str().unwrap_or_default().to_owned();
        let headers = keyring.sign(
            OwnedHeaders::new()
                .insert(Header { key: "event-id", value: Some(&event_id) })
                .insert(Header { key: "event-type", value: Some(kind) }),
            b"C-0",
            payload.as_bytes(),
            &event_id,
            kind,
        );
        // Until the broker takes it, as the poison above.
        loop {
            let record =
                FutureRecord::to(topic).partition((n % 2) as i32).key("C-0").payload(&payload).headers(headers.clone());
            match producer.send(record, Duration::from_secs(10)).await {
                Ok(_) => break,
                Err((e, _)) => eprintln!("chaos: forged {kind} not taken yet ({e}); again"),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        {
            let mut history = history.lock().expect("history");
            history.poison.push(Injected { topic: topic.to_owned(), marker: payload });
            history.forged.push(forged);
        }
        let Ok(records) = read_topic(env.bootstrap(), topic, Deadline::secs(10)).await else {
            continue;
        };
        if let Some(r) = records.iter().rev().find(|r| !json_of(r).is_null()) {
            let payload = r.payload.clone().unwrap_or_default();
            let key = r.key.clone().unwrap_or_default();
            let headers: Vec<(String, String)> =
                ["event-id", "event-type", "traceparent", "signature-key", "signature"]
                    .iter()
                    .filter_map(|h| r.header(h).map(|v| ((*h).to_owned(), v.to_owned())))
                    .collect();
            let mut owned = OwnedHeaders::new_with_capacity(headers.len());
            for (k, v) in &headers {
                owned = owned.insert(Header { key: k, value: Some(v.as_bytes()) });
            }
            let copy = FutureRecord::to(topic).partition(r.partition).key(&key).payload(&payload).headers(owned);
            // Skipped when the broker refuses it (a fault): a duplicate is optional.
            if producer.send(copy, Duration::from_secs(10)).await.is_ok() {
                history.lock().expect("history").duplicates += 1;
            }
        }
    }
}

/// The `n`-th forged event, for `topic`, its event type and what it names: a transfer or
/// order id no client ever sent (every event type), or, for `transfers.rejected`, the
/// newest real transfer with a reason no stage gives. Each contradicts what the stages
/// recorded, so each is poison; none may change money or status.
fn forged(seed: u64, n: usize, topic: &str, newest_transfer: Option<String>) -> (Value, &'static str, Forged) {
    let id = uuid::Uuid::from_u64_pair(hash(seed, &format!("forged {n}")), hash(seed, &format!("forged id {n}")));
    let event_id = uuid::Uuid::from_u64_pair(hash(seed, &format!("forged event {n}")), n as u64);
    let at = "2026-12-01T00:00:00Z";
    let transfer = |extra: Value| {
        let mut event = json!({ "eventId": event_id, "transferId": id, "sourceAccount": "C-0",
                                "destinationAccount": "C-1", "amountCents": 1, "currency": "BRL" });
        event.as_object_mut().expect("object").extend(extra.as_object().cloned().unwrap_or_default());
        event
    };
    let named = |what: &str| Forged { topic: topic.to_owned(), id: id.to_string(), what: what.to_owned() };
    match topic {
        "transfers.requested" => {
            (transfer(json!({ "requestedAt": at })), "TransferRequested", named("unknown transfer"))
        }
        "transfers.analyzed" => {
            (transfer(json!({ "score": 1, "analyzedAt": at })), "TransferAnalyzed", named("unknown transfer"))
        }
        "transfers.settled" => (
            json!({ "eventId": tally_schema::derived_event_id("settled", id), "transferId": id, "settledAt": at }),
            "TransferSettled",
            named("unknown transfer"),
        ),
        "transfers.rejected" => {
            let target = newest_transfer.unwrap_or_else(|| id.to_string());
            let forged = Forged { topic: topic.to_owned(), id: target.clone(), what: FORGED_REASON.to_owned() };
            (
                json!({ "eventId": target.parse().map_or(event_id, |t| tally_schema::derived_event_id("rejected", t)),
                        "transferId": target, "reason": FORGED_REASON, "rejectedAt": at }),
                "TransferRejected",
                forged,
            )
        }
        _ => (
            json!({ "eventId": event_id, "orderId": id, "externalReference": format!("CHAOS-FORGED-{n}"),
                    "customerId": "CHAOS", "amountCents": 1, "currency": "BRL", "receivedAt": at }),
            "OrderReceived",
            named("unknown order"),
        ),
    }
}

/// The reason of forged rejections: no stage gives it.
pub(super) const FORGED_REASON: &str = "CHAOS_FORGED";

/// The `n`-th hostile record with `value`: a header name that is not UTF-8, more headers
/// than tally takes, or a key that is not UTF-8 with a null header value, in turn.
fn hostile_record(n: usize, value: &[u8]) -> RawRecord {
    let (key, headers) = match n % 3 {
        0 => (b"C-0".to_vec(), vec![(b"\xff\xfe".to_vec(), Some(b"x".to_vec()))]),
        1 => (b"C-0".to_vec(), (0..300).map(|i| (format!("h{i}").into_bytes(), None)).collect()),
        _ => (b"\xc3\x28".to_vec(), vec![(b"event-id".to_vec(), None)]),
    };
    RawRecord { key: Some(key), value: Some(value.to_vec()), headers }
}
