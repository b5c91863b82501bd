//! The whole transfer flow, end to end: POST /transfers -> outbox -> antifraud (Kafka
//! transactions) -> ledger -> outbox -> projection -> GET /transfers/{id}.
//!
//! Broker: unless a test says otherwise, the embedded broker (librdkafka's mock cluster, 3
//! brokers, in this process). The mock does not hide aborted records from read_committed
//! consumers and does not store offsets sent in a transaction, so these tests assert that
//! downstream stages stay exactly-once in effect (derived ids + the ledger inbox); the
//! isolation, fencing and restart tests run on noida-db (`noida.rs` beside this file).
//! Every test runs under both consumer group protocols (`name::classic`, `name::consumer`).
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::types::RDKafkaRespErr;
use reqwest::StatusCode;
use serde_json::json;
use tally_engine::broker::api_key;
use tally_engine::config::Secret;
use tally_integration_tests::{
    antifraud_decisions, balance_of as balance, create_account as account, final_state, json_body, metric_value,
    post_transfer as transfer, postings_of, read_topic, spawn_app_under, under_both_protocols, wait_until, Deadline,
    GroupProtocol, TestApp, TestEnv,
};
use uuid::Uuid;

async fn transfers_reach_their_final_status_end_to_end(protocol: GroupProtocol) {
    let (env, app) = spawn_app_under(protocol, |_| {}).await;
    account(&app, "F-A", 100_000_000, "BRL").await;
    account(&app, "F-B", 0, "BRL").await;
    account(&app, "F-USD", 0, "USD").await;

    let ok = transfer(&app, "F-A", "F-B", 30_000).await;
    let blocked = transfer(&app, "F-A", "F-B", 20_000_000).await; // over the block tier
    let poor = transfer(&app, "F-B", "F-A", 5_000_000).await; // F-B holds 30,000 at most
    let unknown = transfer(&app, "F-A", "F-NOPE", 100).await;
    let currency = transfer(&app, "F-A", "F-USD", 100).await;

    let v = final_state(&app, ok).await;
    assert_eq!((v["status"].as_str(), v["rejectionReason"].as_str()), (Some("SETTLED"), None));
    assert_ne!(v["updatedAt"], v["createdAt"]);
    for (id, reason) in [
        (blocked, "BLOCKED_BY_ANTIFRAUD"),
        (poor, "INSUFFICIENT_FUNDS"),
        (unknown, "ACCOUNT_NOT_FOUND"),
        (currency, "CURRENCY_MISMATCH"),
    ] {
        let v = final_state(&app, id).await;
        assert_eq!((v["status"].as_str(), v["rejectionReason"].as_str()), (Some("REJECTED"), Some(reason)), "{id}");
        assert_eq!(postings_of(&env.db, id).await, 0, "{reason}: no postings");
    }
    assert_eq!(postings_of(&env.db, ok).await, 2);
    assert_eq!(balance(&app, "F-A").await, 100_000_000 - 30_000);
    assert_eq!(balance(&app, "F-B").await, 30_000);
    // The antifraud block never reached the ledger.
    assert_eq!(
        env.db.scalar_i64("SELECT count(*) FROM processed_transfers WHERE transfer_id = $1", &[&blocked]).await,
        0
    );
    // The mock shows records before their transaction commits, so downstream may finish
    // before the commit returns: wait for it rather than read it once.
    let metrics = wait_until("a committed Kafka transaction", Deadline::DEFAULT, || async {
        let m = app.metrics().await;
        let committed = metric_value(&m, r#"tally_kafka_transactions_total{outcome="committed"}"#).unwrap_or(0.0);
        if committed >= 1.0 {
            Ok(m)
        } else {
            Err(format!("{committed} committed"))
        }
    })
    .await;
    assert!(metrics.contains("tally_antifraud_score_bucket"), "score histogram exposed");
    let check = json_body(app.admin_get("/admin/ledger/check").await).await;
    assert_eq!(check["ok"], true, "{check}");
}

/// The outbox republishes a TransferRequested (a crash between ack and mark does this):
/// one analysis id, one settlement.
async fn a_republished_request_is_analyzed_under_one_id_and_settled_once(protocol: GroupProtocol) {
    let (env, app) = spawn_app_under(protocol, |_| {}).await;
    account(&app, "D-A", 1_000_000, "BRL").await;
    account(&app, "D-B", 0, "BRL").await;
    let id = transfer(&app, "D-A", "D-B", 700).await;
    assert_eq!(final_state(&app, id).await["status"], "SETTLED");
    // Publish the same TransferRequested row again.
    let n = env
        .db
        .execute(
            "UPDATE outbox_events SET published_at = NULL WHERE topic = 'transfers.requested' AND payload::jsonb->>'transferId' = $1",
            &[&id.to_string()],
        )
        .await;
    assert_eq!(n, 1);
    let analyzed = wait_until("the republished request is analyzed again", Deadline::DEFAULT, || async {
        let records =
            read_topic(env.bootstrap(), "transfers.analyzed", Deadline::secs(10)).await.map_err(|e| e.to_string())?;
        let mine: Vec<_> = records.into_iter().filter(|r| r.payload_json()["transferId"] == json!(id)).collect();
        if mine.len() >= 2 {
            Ok(mine)
        } else {
            Err(format!("{} analyses", mine.len()))
        }
    })
    .await;
    let ids: std::collections::HashSet<String> =
        analyzed.iter().map(|r| r.payload_json()["eventId"].to_string()).collect();
    assert_eq!(ids.len(), 1, "one analysis id for both deliveries: {ids:?}");
    assert_eq!(analyzed[0].header("event-id"), analyzed[1].header("event-id"));
    wait_until("the ledger sees the second analysis as a duplicate", Deadline::DEFAULT, || async {
        let m = app.metrics().await;
        let dup = metric_value(&m, r#"tally_records_total{outcome="duplicate",pipeline="ledger"}"#).unwrap_or(0.0);
        if dup >= 1.0 {
            Ok(())
        } else {
            Err(format!("{dup} duplicates"))
        }
    })
    .await;
    assert_eq!(postings_of(&env.db, id).await, 2, "settled once");
    assert_eq!(balance(&app, "D-B").await, 700);
}

/// Errors injected into the Kafka transaction (the mock's request_errors): transactions
/// abort and the batches are redone; every transfer still ends settled exactly once.
async fn errors_mid_transaction_abort_and_redo_without_double_effects(protocol: GroupProtocol) {
    let (env, app) = spawn_app_under(protocol, |c| {
        c.antifraud.retry.initial = std::time::Duration::from_millis(50);
        c.antifraud.retry.max = std::time::Duration::from_millis(200);
    })
    .await;
    account(&app, "X-A", 1_000_000, "BRL").await;
    account(&app, "X-B", 0, "BRL").await;
    // Fail the next commits of transactions (EndTxn) and their offset commits.
    env.broker.push_request_errors(api_key::END_TXN, &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_INVALID_TXN_STATE; 2]);
    env.broker.push_request_errors(api_key::TXN_OFFSET_COMMIT, &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN; 2]);
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(transfer(&app, "X-A", "X-B", 100 + i).await);
    }
    for id in &ids {
        assert_eq!(final_state(&app, *id).await["status"], "SETTLED", "{id}");
        assert_eq!(postings_of(&env.db, *id).await, 2, "{id} settled exactly once");
    }
    let expected: i64 = (0..20).map(|i| 100 + i).sum();
    assert_eq!(balance(&app, "X-B").await, expected);
    let m = app.metrics().await;
    let failed = metric_value(&m, r#"tally_kafka_transactions_total{outcome="failed"}"#).unwrap_or(0.0);
    assert!(failed >= 1.0, "the injected errors failed at least one transaction ({failed})");
    let renewed = metric_value(&m, r#"tally_kafka_transactions_total{outcome="producer_renewed"}"#).unwrap_or(0.0);
    assert!(renewed >= 1.0, "the fatal EndTxn error (INVALID_TXN_STATE) re-created the producer ({renewed})");
    let check = json_body(app.admin_get("/admin/ledger/check").await).await;
    assert_eq!(check["ok"], true, "{check}");
}

/// A commit that outlasts its call (the coordinator answers EndTxn after 5 s; the call
/// waits 1 s) fails with a retriable error, and librdkafka says: commit again. Aborting or
/// re-creating the producer and producing the batch again instead would publish the batch
/// twice, since the first commit does go through (the mock shows every produced record,
/// so a second copy would be seen). Each decision is published once.
async fn a_commit_that_outlasts_its_call_is_committed_again_not_redone(protocol: GroupProtocol) {
    let (env, app) = spawn_app_under(protocol, |c| {
        c.antifraud.call_timeout = std::time::Duration::from_millis(1_000);
        c.antifraud.retry.initial = std::time::Duration::from_millis(50);
        c.antifraud.retry.max = std::time::Duration::from_millis(200);
    })
    .await;
    account(&app, "T-A", 1_000_000, "BRL").await;
    account(&app, "T-B", 0, "BRL").await;
    // The transaction coordinator is one of the brokers: slow down the next EndTxn on each.
    for broker in 1..=env.broker.broker_count() {
        env.broker
            .push_slow_answer(
                broker,
                api_key::END_TXN,
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR,
                Duration::from_secs(5),
            )
            .expect("slow down EndTxn");
    }
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(transfer(&app, "T-A", "T-B", 100 + i).await);
    }
    for id in &ids {
        assert_eq!(final_state(&app, *id).await["status"], "SETTLED", "{id}");
        assert_eq!(postings_of(&env.db, *id).await, 2, "{id} settled exactly once");
    }
    // The mock shows records of open transactions: wait for the commit itself.
    wait_until("the slow transaction commits", Deadline::DEFAULT, || async {
        let m = app.metrics().await;
        let committed = metric_value(&m, r#"tally_kafka_transactions_total{outcome="committed"}"#).unwrap_or(0.0);
        if committed >= 1.0 {
            Ok(())
        } else {
            Err(format!("{committed} committed"))
        }
    })
    .await;
    let analyzed = read_topic(env.bootstrap(), "transfers.analyzed", Deadline::DEFAULT).await.expect("read");
    let mut copies: HashMap<String, usize> = HashMap::new();
    for r in &analyzed {
        *copies.entry(r.payload_json()["transferId"].as_str().unwrap_or_default().to_owned()).or_default() += 1;
    }
    for id in &ids {
        assert_eq!(copies.get(&id.to_string()).copied(), Some(1), "{id} published once: {copies:?}");
    }
    let m = app.metrics().await;
    let retried = metric_value(&m, r#"tally_kafka_transactions_total{outcome="retried"}"#).unwrap_or(0.0);
    assert!(retried >= 1.0, "the timed-out commit was made again ({retried})");
    // Published at 0 from the start, so that alerts see the first one.
    assert_eq!(metric_value(&m, r#"tally_kafka_transactions_total{outcome="producer_renewed"}"#), Some(0.0));
    assert_eq!(metric_value(&m, r#"tally_kafka_transactions_total{outcome="failed"}"#), Some(0.0));
}

/// A group coordinator that leaves the cluster's metadata for a moment (a broker restart)
/// wedges librdkafka's `send_offsets_to_transaction` for good: it waits for the broker it
/// cached as coordinator to change state, and that broker's handle is gone. The stage gives
/// such a producer up after twice its call timeout, re-creates it (fencing the old one)
/// and redoes what is not committed: every transfer settles, once, under one decision
/// (the mock shows the records of aborted transactions too: every copy must carry the
/// same decision). Broker 2 is the group coordinator here; broker 1 the transaction
/// coordinator, so that only the offsets' path is cut. Seen failing without the
/// workaround: the transfers posted while broker 2 was away stayed PENDING.
async fn a_group_coordinator_leaving_the_cluster_costs_a_producer_not_the_stage(protocol: GroupProtocol) {
    const TXN_ID: &str = "flow-wedge-txn";
    let env = TestEnv::under(protocol).await;
    env.broker.set_coordinator("transaction", TXN_ID, 1).expect("transaction coordinator");
    env.broker.set_coordinator("group", "tally-antifraud", 2).expect("group coordinator");
    let app = env
        .spawn(|c| {
            c.antifraud.transactional_id = TXN_ID.into();
            c.antifraud.call_timeout = Duration::from_millis(1_000);
            c.antifraud.retry.initial = Duration::from_millis(50);
            c.antifraud.retry.max = Duration::from_millis(200);
            // Metadata every second: a broker that is down leaves it quickly.
            c.kafka.producer.insert("topic.metadata.refresh.interval.ms".into(), "1000".into());
        })
        .await;
    // Sources on several partitions, so that some are led by brokers that stay up.
    let sources: Vec<String> = (0..6).map(|i| format!("W-A{i}")).collect();
    for source in &sources {
        account(&app, source, 1_000_000, "BRL").await;
    }
    account(&app, "W-B", 0, "BRL").await;
    // Transactions with offsets first: the producer caches broker 2 as coordinator.
    let mut ids = Vec::new();
    for source in &sources {
        ids.push(transfer(&app, source, "W-B", 1).await);
    }
    for id in &ids {
        assert_eq!(final_state(&app, *id).await["status"], "SETTLED", "{id}");
    }
    // Broker 2 leaves the metadata; transfers keep coming meanwhile and after.
    env.broker.broker_down(2).expect("broker 2 down");
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (i, source) in sources.iter().enumerate() {
        ids.push(transfer(&app, source, "W-B", 10 + i as i64).await);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    env.broker.broker_up(2).expect("broker 2 up");
    for (i, source) in sources.iter().enumerate() {
        ids.push(transfer(&app, source, "W-B", 100 + i as i64).await);
    }
    for id in &ids {
        assert_eq!(final_state(&app, *id).await["status"], "SETTLED", "{id}");
        assert_eq!(postings_of(&env.db, *id).await, 2, "{id} settled exactly once");
    }
    let expected: i64 = 6 + (0..6).map(|i| 110 + 2 * i).sum::<i64>();
    assert_eq!(balance(&app, "W-B").await, expected);
    let decisions = antifraud_decisions(env.bootstrap(), Deadline::DEFAULT).await.expect("read decisions");
    for id in &ids {
        assert_eq!(decisions.get(&id.to_string()).map(|d| d.len()), Some(1), "{id}: one decision, {decisions:?}");
    }
    let m = app.metrics().await;
    let wedged = metric_value(&m, r#"tally_kafka_transactions_total{outcome="producer_wedged"}"#).unwrap_or(0.0);
    // Should librdkafka enforce the call's timeout one day, this fails: the workaround
    // is then no longer exercised here (and may go).
    assert!(wedged >= 1.0, "the offsets call wedged a producer, which was given up ({wedged})");
    let abandoned = metric_value(&m, "tally_kafka_producers_abandoned").unwrap_or(0.0);
    assert!(abandoned <= wedged, "abandoned producers ({abandoned}) are the wedged ones still blocked");
    assert!(abandoned <= 1.0, "at most one producer is given up at a time ({abandoned})");
}

const TOKEN: &str = "flow-token";

/// An admin pause of antifraud lasts across rebalances: when a second instance leaves the
/// group, the partitions that come back to the paused instance stay paused too, and
/// nothing is decided until the pipeline is resumed.
async fn an_antifraud_pause_lasts_across_a_rebalance(protocol: GroupProtocol) {
    let env = TestEnv::under(protocol).await;
    let a = env.spawn(|c| c.http.admin_token = Secret::new(TOKEN)).await;
    let pause = a.client.post(format!("{}/admin/pipelines/antifraud/pause", a.admin_url)).bearer_auth(TOKEN);
    assert_eq!(a.send(pause).await.status(), StatusCode::OK);
    // A second instance running antifraud only joins the group, then leaves it.
    let b = env.spawn(|c| tally_integration_tests::run_only(c, &["antifraud"])).await;
    TestApp::wait_for_shares(&[&a, &b], "antifraud", 12).await;
    b.stop().await;
    TestApp::wait_for_shares(&[&a], "antifraud", 12).await;
    account(&a, "P-D", 0, "BRL").await;
    let mut ids = Vec::new();
    for i in 0..12 {
        let source = format!("P-{i}");
        account(&a, &source, 10_000, "BRL").await;
        ids.push(transfer(&a, &source, "P-D", 100).await);
    }
    env.db.wait_outbox_published().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let decided = env.db.count("antifraud_decisions").await;
    assert_eq!(decided, 0, "nothing is decided while antifraud is paused, on any partition");
    let resume = a.client.post(format!("{}/admin/pipelines/antifraud/resume", a.admin_url)).bearer_auth(TOKEN);
    assert_eq!(a.send(resume).await.status(), StatusCode::OK);
    for id in &ids {
        assert_eq!(final_state(&a, *id).await["status"], "SETTLED", "{id}");
    }
}

/// The projection is monotonic: a late or contradictory event never moves a final state.
/// A late copy of the transfer's own outcome changes nothing; a rejection the ledger never
/// decided (signed with the daemon's key, as a neighbour holding it would) is poison.
async fn late_events_never_move_a_final_status(protocol: GroupProtocol) {
    let (env, app) = spawn_app_under(protocol, |_| {}).await;
    account(&app, "M-A", 1_000_000, "BRL").await;
    account(&app, "M-B", 0, "BRL").await;
    let id = transfer(&app, "M-A", "M-B", 500).await;
    let settled = final_state(&app, id).await;
    assert_eq!(settled["status"], "SETTLED");
    let upstream = env.upstream();
    let late = json!({ "eventId": tally_schema::derived_event_id("settled", id), "transferId": id,
                       "settledAt": "2026-11-30T00:00:00Z" });
    upstream.signed("transfers.settled", None, "M-A", late.to_string().as_bytes(), "TransferSettled").await;
    let contradicting = json!({ "eventId": Uuid::new_v4(), "transferId": id, "reason": "INSUFFICIENT_FUNDS",
                                "rejectedAt": "2026-11-30T00:00:00Z" });
    upstream.signed("transfers.rejected", None, "M-A", contradicting.to_string().as_bytes(), "TransferRejected").await;
    wait_until("the projection handles both late events", Deadline::DEFAULT, || async {
        let m = app.metrics().await;
        let outcome = |o: &str| {
            metric_value(&m, &format!(r#"tally_records_total{{outcome="{o}",pipeline="projection"}}"#)).unwrap_or(0.0)
        };
        if outcome("unchanged") >= 1.0 && outcome("dead_lettered") >= 1.0 {
            Ok(())
        } else {
            Err(format!("{} unchanged, {} dead-lettered", outcome("unchanged"), outcome("dead_lettered")))
        }
    })
    .await;
    let after = json_body(app.get(&format!("/transfers/{id}")).await).await;
    assert_eq!(after["status"], "SETTLED", "a final state does not move");
    assert_eq!(after["updatedAt"], settled["updatedAt"]);
}

under_both_protocols!(
    transfers_reach_their_final_status_end_to_end,
    a_republished_request_is_analyzed_under_one_id_and_settled_once,
    errors_mid_transaction_abort_and_redo_without_double_effects,
    a_commit_that_outlasts_its_call_is_committed_again_not_redone,
    a_group_coordinator_leaving_the_cluster_costs_a_producer_not_the_stage,
    an_antifraud_pause_lasts_across_a_rebalance,
    late_events_never_move_a_final_status,
);
