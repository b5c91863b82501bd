//! Records produced straight to the consumed topics during a chaos run: poison, hostile
//! (odd headers or keys) and duplicates of real records, due on the logical clock.

use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use tally_integration_tests::hostile::{try_produce_raw, RawRecord};
use tally_integration_tests::{producer, read_topic, Deadline, TestEnv};

use super::checks::json_of;
use super::load::{hash, History, Injected, Progress};
use super::CONSUMED;

/// Answered requests between two injections.
const EVERY: usize = 50;

/// After every [`EVERY`] answered requests, a poison record, a hostile record and a copy
/// of the newest record (same key, headers and partition, as a redelivery) to the next
/// consumed topic; until `progress.stop`. Markers come from the seed.
pub(super) async fn records(env: &TestEnv, seed: u64, (progress, history): (&Progress, &Mutex<History>)) {
    let producer = producer(env.bootstrap());
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
        let Ok(records) = read_topic(env.bootstrap(), topic, Deadline::secs(10)).await else {
            continue;
        };
        if let Some(r) = records.iter().rev().find(|r| !json_of(r).is_null()) {
            let payload = r.payload.clone().unwrap_or_default();
            let key = r.key.clone().unwrap_or_default();
            let headers: Vec<(String, String)> = ["event-id", "event-type", "traceparent"]
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
