//! The money path's guarantees: a transfer's antifraud decision is made once and stands,
//! money arithmetic cannot overflow, and database errors are classified by cause. (What
//! the stages refuse to act on, forged and stray events, is `forged.rs`.)
//!
//! Broker: the embedded broker (librdkafka's mock cluster, in this process). It stores no
//! offsets sent in a transaction, so the antifraud stage re-reads `transfers.requested`
//! from the start after every restart: exactly the redelivery these tests are about.
//! The antifraud ones run under both consumer group protocols.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use serde_json::json;
use tally_integration_tests::{
    assert_error, assert_ledger_ok, balance_of, create_account, final_state, post_transfer, postings_of, read_topic,
    spawn_app, spawn_app_under, under_both_protocols, wait_until, Deadline, GroupProtocol, KafkaRecord, TestDb,
    TestEnv,
};
use uuid::Uuid;

/// Publishes the transfer's `TransferRequested` outbox row again, as a crash between the
/// broker's ack and the row's mark does.
async fn republish_request(db: &TestDb, id: Uuid) {
    let n = db
        .execute(
            "UPDATE outbox_events SET published_at = NULL \
             WHERE topic = 'transfers.requested' AND payload::jsonb->>'transferId' = $1",
            &[&id.to_string()],
        )
        .await;
    assert_eq!(n, 1, "one TransferRequested row for {id}");
}

/// Waits until `topic` holds at least `n` records for transfer `id`; returns them.
async fn records_for(env: &TestEnv, topic: &str, id: Uuid, n: usize) -> Vec<KafkaRecord> {
    wait_until(&format!("{n} records of {id} on {topic}"), Deadline::DEFAULT, || async {
        let records = read_topic(env.bootstrap(), topic, Deadline::secs(10)).await.map_err(|e| e.to_string())?;
        let mine: Vec<_> = records.into_iter().filter(|r| r.payload_json()["transferId"] == json!(id)).collect();
        if mine.len() >= n {
            Ok(mine)
        } else {
            Err(format!("{} records", mine.len()))
        }
    })
    .await
}

async fn records_of(env: &TestEnv, topic: &str, id: Uuid) -> usize {
    let records = read_topic(env.bootstrap(), topic, Deadline::secs(10)).await.expect("read topic");
    records.iter().filter(|r| r.payload_json()["transferId"] == json!(id)).count()
}

async fn decisions_of(db: &TestDb, id: Uuid) -> i64 {
    db.scalar_i64("SELECT count(*) FROM antifraud_decisions WHERE transfer_id = $1", &[&id]).await
}

/// A transfer blocked by velocity is delivered again after the window slid (scored now it
/// would pass); a transfer that settled is delivered again after a burst (scored now it
/// would be blocked). Both publish their first decision again, unchanged.
async fn an_antifraud_decision_stands_when_the_transfer_is_delivered_again(protocol: GroupProtocol) {
    const WINDOW_SECS: u64 = 4;
    let (env, app) =
        spawn_app_under(protocol, |c| c.antifraud.velocity_window = std::time::Duration::from_secs(WINDOW_SECS)).await;
    create_account(&app, "V-A", 100_000_000, "BRL").await;
    create_account(&app, "V-B", 0, "BRL").await;
    create_account(&app, "V-C", 100_000_000, "BRL").await;

    // V-C: 5,000,000 cents alone scores 55 and passes; then 21 more inside the window.
    let settled = post_transfer(&app, "V-C", "V-B", 5_000_000).await;
    // V-A: 21 small transfers then 6,000,000 cents inside the window: 95, blocked.
    let mut burst = Vec::new();
    for _ in 0..21 {
        burst.push(post_transfer(&app, "V-C", "V-B", 100).await);
        burst.push(post_transfer(&app, "V-A", "V-B", 100).await);
    }
    let blocked = post_transfer(&app, "V-A", "V-B", 6_000_000).await;
    let v = final_state(&app, blocked).await;
    assert_eq!((v["status"].as_str(), v["rejectionReason"].as_str()), (Some("REJECTED"), Some("BLOCKED_BY_ANTIFRAUD")));
    assert_eq!(final_state(&app, settled).await["status"], "SETTLED");
    for id in &burst {
        assert_eq!(final_state(&app, *id).await["status"], "SETTLED", "{id}");
    }
    let first_rejection = records_for(&env, "transfers.rejected", blocked, 1).await;
    let first_analysis = records_for(&env, "transfers.analyzed", settled, 1).await;

    // Let the window slide past the burst, and move V-A's window on with one more transfer.
    tokio::time::sleep(std::time::Duration::from_secs(WINDOW_SECS + 1)).await;
    let later = post_transfer(&app, "V-A", "V-B", 100).await;
    assert_eq!(final_state(&app, later).await["status"], "SETTLED");

    republish_request(&env.db, blocked).await;
    republish_request(&env.db, settled).await;
    let rejections = records_for(&env, "transfers.rejected", blocked, 2).await;
    let analyses = records_for(&env, "transfers.analyzed", settled, 2).await;
    for (records, first) in [(&rejections, &first_rejection[0]), (&analyses, &first_analysis[0])] {
        for r in records {
            assert_eq!(r.payload_json(), first.payload_json(), "the same decision: id, outcome, score, time");
            assert_eq!(r.header("event-id"), first.header("event-id"));
        }
    }
    assert_eq!(records_of(&env, "transfers.analyzed", blocked).await, 0, "the blocked transfer never analyzed");
    let rejected_settled = read_topic(env.bootstrap(), "transfers.rejected", Deadline::secs(10))
        .await
        .expect("read transfers.rejected")
        .into_iter()
        .filter(|r| r.payload_json()["transferId"] == json!(settled))
        .count();
    assert_eq!(rejected_settled, 0, "the settled transfer was never rejected");

    // The ledger saw the second analysis as a duplicate; the blocked transfer moved nothing.
    let v = final_state(&app, blocked).await;
    assert_eq!((v["status"].as_str(), v["rejectionReason"].as_str()), (Some("REJECTED"), Some("BLOCKED_BY_ANTIFRAUD")));
    assert_eq!(postings_of(&env.db, blocked).await, 0);
    assert_eq!(postings_of(&env.db, settled).await, 2);
    assert_eq!(balance_of(&app, "V-A").await, 100_000_000 - 22 * 100);
    for id in [blocked, settled] {
        assert_eq!(decisions_of(&env.db, id).await, 1, "one stored decision for {id}");
    }
    let check = assert_ledger_ok(&app).await;
    let names: Vec<&str> =
        check["invariants"].as_array().into_iter().flatten().filter_map(|i| i["name"].as_str()).collect();
    assert!(names.contains(&"status_agrees_with_postings") && names.contains(&"blocked_transfers_have_no_postings"));
}

/// The velocity window is rebuilt from stored decisions: a daemon restarted after a burst
/// still counts the burst, although it publishes the burst's decisions without scoring
/// them again.
async fn the_velocity_window_survives_a_restart(protocol: GroupProtocol) {
    let env = TestEnv::under(protocol).await;
    let configure =
        |c: &mut tally_engine::config::Config| c.antifraud.velocity_window = std::time::Duration::from_secs(120);
    let app = env.spawn(configure).await;
    create_account(&app, "R-A", 100_000_000, "BRL").await;
    create_account(&app, "R-B", 0, "BRL").await;
    let mut burst = Vec::new();
    for _ in 0..21 {
        burst.push(post_transfer(&app, "R-A", "R-B", 100).await);
    }
    for id in &burst {
        assert_eq!(final_state(&app, *id).await["status"], "SETTLED", "{id}");
    }
    app.stop().await;

    let app = env.spawn(configure).await;
    let big = post_transfer(&app, "R-A", "R-B", 6_000_000).await;
    let v = final_state(&app, big).await;
    assert_eq!(
        (v["status"].as_str(), v["rejectionReason"].as_str()),
        (Some("REJECTED"), Some("BLOCKED_BY_ANTIFRAUD")),
        "the 22nd transfer inside the window is blocked after the restart too"
    );
    assert_eq!(postings_of(&env.db, big).await, 0);
    assert_ledger_ok(&app).await;
}

fn analyzed(id: Uuid, from: &str, to: &str, amount: i64) -> serde_json::Value {
    json!({
        "eventId": Uuid::new_v4(), "transferId": id, "sourceAccount": from, "destinationAccount": to,
        "amountCents": amount, "currency": "BRL", "score": 5, "analyzedAt": "2026-01-01T00:00:00Z"
    })
}

async fn processed(db: &TestDb, id: Uuid) -> (String, Option<String>) {
    wait_until(&format!("the ledger processes {id}"), Deadline::DEFAULT, || async {
        let rows = db
            .query(
                "SELECT outcome, reason FROM processed_transfers WHERE transfer_id = $1 AND outcome <> 'PROCESSING'",
                &[&id],
            )
            .await;
        rows.first().map(|r| (r.get::<_, String>(0), r.get::<_, Option<String>>(1))).ok_or_else(|| "not yet".to_owned())
    })
    .await
}

/// Balances and amounts have a ceiling: intake refuses past it, and a credit that would
/// pass it is a business rejection, not an overflow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn balances_and_amounts_stay_under_the_ceiling() {
    let (env, app) = spawn_app(|_| {}).await;
    let ceiling: i64 = 1_000_000_000_000_000; // ledger.max_balance_cents default
    let res =
        app.post_json("/accounts", &json!({ "id": "O-MAX", "currency": "BRL", "initialBalanceCents": i64::MAX })).await;
    assert_error(res, reqwest::StatusCode::UNPROCESSABLE_ENTITY, "validation_failed", "balance past the ceiling").await;
    assert_eq!(env.db.count("accounts").await, 0, "nothing written");
    create_account(&app, "O-TOP", ceiling, "BRL").await;
    create_account(&app, "O-SRC", 100, "BRL").await;
    let res = app
        .post_json(
            "/transfers",
            &json!({ "sourceAccount": "O-SRC", "destinationAccount": "O-TOP", "amountCents": ceiling + 1, "currency": "BRL" }),
        )
        .await;
    assert_error(res, reqwest::StatusCode::UNPROCESSABLE_ENTITY, "validation_failed", "amount past the ceiling").await;
    let id = post_transfer(&app, "O-SRC", "O-TOP", 1).await;
    let v = final_state(&app, id).await;
    assert_eq!(
        (v["status"].as_str(), v["rejectionReason"].as_str()),
        (Some("REJECTED"), Some("BALANCE_LIMIT_EXCEEDED"))
    );
    assert_eq!(postings_of(&env.db, id).await, 0);
    assert_eq!(balance_of(&app, "O-TOP").await, ceiling);
    assert_eq!(balance_of(&app, "O-SRC").await, 100);
    assert_ledger_ok(&app).await;
}

/// A deterministic database error (here a CHECK the test adds) is poison: the batch split
/// isolates the transfer, which goes to the DLT once, as `poison`, while the others of its
/// batch settle. A header that cannot fit its column is ignored, not a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_errors_are_classified_by_cause() {
    let (env, app) = spawn_app(|c| {
        c.pipelines.set("antifraud", false);
        c.ledger.retry.initial = std::time::Duration::from_millis(50);
        c.ledger.retry.max = std::time::Duration::from_millis(100);
    })
    .await;
    env.db.batch("ALTER TABLE postings ADD CONSTRAINT test_no_13_cents CHECK (amount_cents <> 13)").await;
    create_account(&app, "C-A", 1_000_000, "BRL").await;
    create_account(&app, "C-B", 0, "BRL").await;
    let p = env.upstream();
    let ids: Vec<Uuid> = (10..=16).map(|_| Uuid::new_v4()).collect();
    for (id, amount) in ids.iter().zip(10..=16) {
        p.analyzed(&analyzed(*id, "C-A", "C-B", amount), Some(0)).await;
    }
    let long_trace = format!("00-{}-{}-01-and-more", "a".repeat(32), "b".repeat(16));
    let traced = analyzed(Uuid::new_v4(), "C-A", "C-B", 20);
    let traced_id: Uuid = serde_json::from_value(traced["transferId"].clone()).expect("id");
    p.db().record_analyzed(&[&traced]).await;
    p.signed_with(
        "transfers.analyzed",
        Some(0),
        "C-A",
        traced.to_string().as_bytes(),
        "TransferAnalyzed",
        &[("traceparent", &long_trace)],
    )
    .await;
    let traced = traced_id;

    let dlt = wait_until("the 13-cent transfer in the DLT", Deadline::DEFAULT, || async {
        let records = read_topic(env.bootstrap(), "transfers.analyzed-dlt", Deadline::secs(5))
            .await
            .map_err(|e| e.to_string())?;
        if records.is_empty() {
            Err("empty".to_owned())
        } else {
            Ok(records)
        }
    })
    .await;
    assert_eq!(processed(&env.db, traced).await, ("SETTLED".into(), None), "an oversized traceparent is ignored");
    for (id, amount) in ids.iter().zip(10..=16) {
        if amount != 13 {
            assert_eq!(processed(&env.db, *id).await, ("SETTLED".into(), None), "{amount} cents");
        }
    }
    assert_eq!(dlt.len(), 1, "dead-lettered once");
    assert_eq!(dlt[0].payload_json()["amountCents"], 13);
    assert_eq!(dlt[0].header("dlt-exception-kind"), Some("poison"));
    assert_eq!(dlt[0].header("dlt-attempts"), Some("1"), "not retried: it would fail the same way");
    assert_eq!(balance_of(&app, "C-B").await, (10..=16).filter(|a| *a != 13).sum::<i64>() + 20);
    assert_eq!(
        env.db.scalar_i64("SELECT count(*) FROM processed_transfers WHERE transfer_id = $1", &[&ids[3]]).await,
        0,
        "the poison transfer left nothing behind"
    );
    assert_ledger_ok(&app).await;
}

fn requested(id: Uuid, from: &str, to: &str, amount: i64, at: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "eventId": Uuid::new_v4(), "transferId": id, "sourceAccount": from, "destinationAccount": to,
        "amountCents": amount, "currency": "BRL", "requestedAt": at
    }))
    .expect("json")
}

/// Poison `TransferRequested` records never stop the antifraud stage: one the DLT refuses
/// for good (too large once the dlt-* headers are added) goes to the `dead_letters` table;
/// one with a time PostgreSQL cannot store, and one that reuses a decided transfer's id to
/// ask for another amount, go to the DLT. Transfers after them are decided as usual.
async fn poison_requests_do_not_stop_antifraud(protocol: GroupProtocol) {
    let (env, app) = spawn_app_under(protocol, |c| {
        c.antifraud.retry.initial = std::time::Duration::from_millis(50);
        c.antifraud.retry.max = std::time::Duration::from_millis(200);
    })
    .await;
    create_account(&app, "Z-A", 1_000_000, "BRL").await;
    create_account(&app, "Z-B", 0, "BRL").await;
    let decided = post_transfer(&app, "Z-A", "Z-B", 100).await;
    assert_eq!(final_state(&app, decided).await["status"], "SETTLED");

    let p = env.upstream();
    // Under the broker's 1 MB with its signature; over it with the `dlt-*` headers too.
    let huge = vec![b'x'; 999_500];
    let (partition, offset) = p.signed("transfers.requested", None, "Z-A", &huge, "TransferRequested").await;
    let ancient = requested(Uuid::new_v4(), "Z-A", "Z-B", 100, "-5000-01-01T00:00:00Z");
    p.signed("transfers.requested", None, "Z-A", &ancient, "TransferRequested").await;
    let conflicting = requested(decided, "Z-A", "Z-B", 900_000, "2026-11-30T00:00:00Z");
    p.signed("transfers.requested", None, "Z-A", &conflicting, "TransferRequested").await;

    let id = post_transfer(&app, "Z-A", "Z-B", 200).await;
    assert_eq!(final_state(&app, id).await["status"], "SETTLED", "the stage goes on after the poison");
    let rows = env
        .db
        .query(
            "SELECT original_topic, original_partition, original_offset, exception_kind, octet_length(payload) \
             FROM dead_letters",
            &[],
        )
        .await;
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(
        (
            row.get::<_, String>(0),
            row.get::<_, i32>(1),
            row.get::<_, i64>(2),
            row.get::<_, String>(3),
            row.get::<_, i32>(4)
        ),
        ("transfers.requested".to_owned(), partition, offset, "poison".to_owned(), 999_500)
    );
    let metrics = app.metrics().await;
    assert!(metrics.contains(r#"tally_dlt_records_total{topic="dead_letters"} 1"#), "counted as dead-lettered");
    let dlt = read_topic(env.bootstrap(), "transfers.requested-dlt", Deadline::secs(10)).await.expect("read DLT");
    let kinds: Vec<_> =
        dlt.iter().map(|r| (r.payload_json()["amountCents"].clone(), r.header("dlt-exception-kind"))).collect();
    assert_eq!(kinds, vec![(json!(100), Some("poison")), (json!(900_000), Some("poison"))], "{kinds:?}");
    let analyses = records_for(&env, "transfers.analyzed", decided, 1).await;
    assert!(
        analyses.iter().all(|r| r.payload_json()["amountCents"] == 100),
        "the conflicting request was not analyzed"
    );
    assert_eq!(postings_of(&env.db, decided).await, 2);
    assert_eq!(balance_of(&app, "Z-B").await, 300);
    assert_ledger_ok(&app).await;
}

/// A topic the stage may not write costs the inputs bound for it, not the stage: with
/// `transfers.rejected` refused as an ACL would (topic authorization failed, when the
/// partition is added to a transaction or, once the producer's metadata says so, at once
/// when the record is sent), a blocked transfer's input goes to the DLT, saying that its
/// output was refused, and the transfers after it on the same partition settle. Its
/// decision was stored once, and no decision of it reached the ledger. A refusal is no
/// broker trouble: it is told from the failed deliveries (the first commit fails with a
/// plain "message(s) failed delivery") and costs no backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_antifraud_may_not_write_costs_the_inputs_bound_for_it() {
    use rdkafka::types::RDKafkaRespErr;
    let (env, app) = spawn_app(|c| {
        c.antifraud.retry.initial = std::time::Duration::from_millis(50);
        c.antifraud.retry.max = std::time::Duration::from_millis(200);
        // Metadata every second: the producer soon knows the topic is forbidden.
        c.kafka.producer.insert("topic.metadata.refresh.interval.ms".into(), "1000".into());
    })
    .await;
    create_account(&app, "ACL-A", 100_000_000, "BRL").await;
    create_account(&app, "ACL-B", 0, "BRL").await;
    let first = post_transfer(&app, "ACL-A", "ACL-B", 100).await;
    assert_eq!(final_state(&app, first).await["status"], "SETTLED");
    env.broker
        .set_topic_error("transfers.rejected", RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED)
        .expect("forbid transfers.rejected");
    let mut blocked = Vec::new();
    let mut ids = Vec::new();
    for round in 0..3 {
        blocked.push(post_transfer(&app, "ACL-A", "ACL-B", 20_000_000).await);
        ids.push(post_transfer(&app, "ACL-A", "ACL-B", 200 + round).await);
        tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    }
    for id in &ids {
        assert_eq!(final_state(&app, *id).await["status"], "SETTLED", "{id}: the stage goes on");
    }
    assert_eq!(balance_of(&app, "ACL-B").await, 100 + 200 + 201 + 202);
    let dlt = read_topic(env.bootstrap(), "transfers.requested-dlt", Deadline::secs(10)).await.expect("read DLT");
    for id in &blocked {
        let mine: Vec<_> = dlt.iter().filter(|r| r.payload_json()["transferId"] == json!(id)).collect();
        assert!(!mine.is_empty(), "{id}: its input is in the DLT");
        for r in mine {
            assert_eq!(r.header("dlt-exception-kind"), Some("poison"));
            let message = r.header("dlt-exception-message").unwrap_or_default();
            assert!(message.contains("refused its output to transfers.rejected"), "{id}: {message}");
        }
        assert_eq!(decisions_of(&env.db, *id).await, 1, "{id} decided once");
        let status = app.get(&format!("/transfers/{id}")).await.json::<serde_json::Value>().await.expect("json");
        assert_eq!(status["status"], "PENDING", "{id}: no decision reached the ledger");
    }
    assert_eq!(env.db.count("dead_letters").await, 0, "the DLT took every refused input");
    let metrics = app.metrics().await;
    let waits = tally_integration_tests::metric_value(&metrics, r#"tally_retries_total{pipeline="antifraud"}"#);
    assert_eq!(waits, Some(0.0), "no backoff for a refusal");
    env.broker
        .set_topic_error("transfers.rejected", RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR)
        .expect("allow transfers.rejected");
    assert_ledger_ok(&app).await;
}

under_both_protocols!(
    an_antifraud_decision_stands_when_the_transfer_is_delivered_again,
    the_velocity_window_survives_a_restart,
    poison_requests_do_not_stop_antifraud,
);
