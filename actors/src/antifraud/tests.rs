//! Unit tests of the antifraud loop shell.

use std::collections::HashMap;

use chrono::Utc;

use super::decisions::Decision;
use super::output::Output;
use super::*;
use tally_schema::events::derived_event_id;

fn spec() -> AntifraudSpec {
    AntifraudSpec {
        group_id: "g".into(),
        input: "transfers.requested".into(),
        analyzed: "transfers.analyzed".into(),
        rejected: "transfers.rejected".into(),
        consumer: ClientConfig::new(),
        producer: ClientConfig::new(),
        transactional_id: "t".into(),
        block_limit: 80,
        max_batch: 10,
        max_batch_wait: Duration::from_millis(10),
        transaction_timeout: Duration::from_secs(10),
        call_timeout: Duration::from_secs(1),
        retry: RetryPolicy::default(),
        database: crate::store::build_pool(&crate::store::PoolSettings {
            url: "postgres://localhost/none".into(),
            max_size: 1,
            statement_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            application_name: "test".into(),
            outbox_notify_after_commit: false,
        })
        .expect("a pool (opens nothing)"),
        keyring: crate::signing::Keyring::single(
            crate::signing::SigningKey::new("test", &[7; 32]).expect("a valid key"),
        ),
    }
}

fn record(payload: &str, offset: i64) -> Record {
    Record {
        topic: "transfers.requested".into(),
        partition: 3,
        offset,
        key: Some(b"A".to_vec()),
        payload: Some(payload.as_bytes().to_vec()),
        headers: vec![(
            "traceparent".into(),
            Some(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_vec()),
        )],
        timestamp: Some(1),
        defect: None,
    }
}

fn requested(amount: i64) -> String {
    format!(
        r#"{{"eventId":"00000000-0000-0000-0000-000000000001","transferId":"00000000-0000-0000-0000-000000000002","sourceAccount":"A","destinationAccount":"B","amountCents":{amount},"currency":"BRL","requestedAt":"2026-01-01T00:00:00Z"}}"#
    )
}

fn decide_one(amount: i64) -> (Output, Decision) {
    let mut risk = RulesRiskEngine::new(RiskRules::default());
    let r = record(&requested(amount), 0);
    let t = output::decode(&r).unwrap();
    let (all, _) = decisions::decide_batch(&[&t], &HashMap::new(), &mut risk, 80, BLOCKED_BY_ANTIFRAUD, Utc::now());
    let d = all[&t.transfer_id].clone();
    (output::decided(&t, &d, &spec(), r.traceparent()), d)
}

#[test]
fn decisions_route_to_analyzed_or_rejected_with_derived_ids() {
    let tid = uuid::Uuid::from_u128(2);
    let (ok, d) = decide_one(100);
    assert_eq!((ok.topic.as_str(), ok.outcome), ("transfers.analyzed", "analyzed"));
    let json: serde_json::Value = serde_json::from_slice(ok.payload.as_deref().unwrap()).unwrap();
    assert_eq!(json["eventId"], serde_json::json!(derived_event_id(ANALYZED_KIND, tid)));
    assert_eq!(json["score"], 5);
    assert_eq!(json["analyzedAt"], serde_json::json!(d.decided_at), "the decision's own time");
    assert_eq!(ok.key.as_deref(), Some(b"A".as_slice()));
    let (blocked, _) = decide_one(10_000_000);
    assert_eq!((blocked.topic.as_str(), blocked.outcome), ("transfers.rejected", "blocked"));
    let json: serde_json::Value = serde_json::from_slice(blocked.payload.as_deref().unwrap()).unwrap();
    assert_eq!(json["reason"], BLOCKED_BY_ANTIFRAUD);
    assert_eq!(json["eventId"], serde_json::json!(derived_event_id(REJECTED_KIND, tid)));
}

#[test]
fn poison_goes_to_the_dlt_on_the_same_partition() {
    let r = record("{nope", 7);
    let reason = output::decode(&r).unwrap_err();
    let out = output::poison(&r, &spec(), reason.clone());
    assert_eq!((out.topic.as_str(), out.partition, out.outcome), ("transfers.requested-dlt", Some(3), "dead_lettered"));
    assert_eq!(out.dead_letter, Some(reason));
}
