//! Mutations that show each check of a chaos run able to fail: fault switches inside the
//! daemons, and tampering with the final state and the history of a clean run.

use serde_json::json;
use tally_actors::faults::Fault;
use tally_integration_tests::{producer, TestEnv};
use uuid::Uuid;

use super::daemon::Daemon;
use super::load::{History, Injected};
use super::plan::Planned;

/// Each fault switch and the checks that must report it.
pub(super) const SWITCHES: [(Fault, &[&str]); 4] = [
    (Fault::Rescore, &["at most one antifraud decision per transfer"]),
    (
        Fault::OffsetBeforeCommit,
        &["every accepted transfer has one final status", "every accepted order received exactly once"],
    ),
    (Fault::OutboxOutOfOrder, &["per key, requests published in the order clients saw them"]),
    (
        Fault::SkipInbox,
        &["every poison record dead-lettered, and nothing else", "SETTLED: one D and one C of its amount; else none"],
    ),
];

/// Tampers with the final state and the history in one way per check, and asserts that
/// every check then reports the violation made for it (by the text of that violation, so
/// that a check tripped only by another check's tampering does not count). `daemon` runs
/// no outbox publisher and no notifications.
pub(super) async fn every_check_can_fail(env: &TestEnv, daemon: &Daemon, mut history: History, plan: &[Planned]) {
    let db = &env.db;
    let transfer = |sql: &'static str| async move {
        db.query(sql, &[]).await.first().map(|r| r.get::<_, Uuid>(0)).expect("a transfer to tamper with")
    };
    let settled =
        transfer("SELECT id FROM transfers WHERE status = 'SETTLED' AND kind = 'transfer' ORDER BY created_at LIMIT 1")
            .await;
    let other = transfer(
        "SELECT id FROM transfers WHERE status <> 'PENDING' AND kind = 'transfer' ORDER BY created_at DESC LIMIT 1",
    )
    .await;
    let keyed =
        transfer("SELECT id FROM transfers WHERE status <> 'PENDING' AND kind = 'transfer' ORDER BY created_at DESC OFFSET 1 LIMIT 1").await;
    let order: Uuid = history
        .calls
        .iter()
        .find(|c| c.path == "/orders" && c.status == 201)
        .and_then(|c| c.response["id"].as_str()?.parse().ok())
        .expect("an accepted order");
    let delay = tally_engine::Config::default().notifications.delays_ms()[0];
    let retry = tally_schema::topics::retry("transfers.settled", delay);
    let expected: Vec<(&str, String)> = vec![
        ("one transfer per Idempotency-Key, none without a request", "under key tampered-key".into()),
        ("every accepted transfer has one final status", format!("transfer {other} is still PENDING")),
        ("SETTLED: one D and one C of its amount; else none", format!("transfer {settled} SETTLED: postings")),
        ("money conserved, no negative balance, balances = postings", "account C-0:".into()),
        ("at most one antifraud decision per transfer", format!("transfer {settled}: decisions")),
        ("status, stored decision and outcome event agree", format!("transfer {settled} SETTLED")),
        ("every poison record dead-lettered, and nothing else", "without being poison: not poison".into()),
        ("no forged event moved money or changed a status", format!("({})", super::inject::FORGED_REASON)),
        ("only owners debit, only the issuer issues", "of chaos-nobody debited".into()),
        ("every accepted order received exactly once", format!("order {order} ")),
        ("every final transfer notified once, signed, as published", "bad signature on".into()),
        ("per key, requests published in the order clients saw them", "published after".into()),
        ("every outbox row published, and on its topic", "on transfers.requested unpublished".into()),
        ("every group's committed offsets at the end of its topics", format!("{retry}/")),
        ("every scheduled fault fired while work was in flight", "never fired".into()),
        ("the daemon's own ledger check", "money_conserved".into()),
    ];
    // Money and the ledger's own check: a cent from nowhere.
    db.execute("UPDATE accounts SET balance_cents = balance_cents + 1 WHERE id = 'C-0'", &[]).await;
    // Postings: a settled transfer loses its credit.
    db.execute("DELETE FROM postings WHERE transfer_id = $1 AND kind = 'C'", &[&settled]).await;
    // Final status: a decided transfer back to pending.
    db.execute("UPDATE transfers SET status = 'PENDING' WHERE id = $1", &[&other]).await;
    // Idempotency: a transfer under a key no client sent (and its own key left with none).
    db.execute("UPDATE transfers SET idempotency_key = 'tampered-key' WHERE id = $1", &[&keyed]).await;
    // Orders: an answered order's materialization lost.
    db.execute("DELETE FROM received_orders WHERE order_id = $1", &[&order]).await;
    // One decision per transfer, and outcomes agree: a settled transfer blocked as well.
    let producer = producer(env.bootstrap());
    let second = json!({ "eventId": Uuid::new_v4(), "transferId": settled, "reason": "BLOCKED_BY_ANTIFRAUD",
                         "rejectedAt": "2026-11-30T00:00:00Z" });
    tally_integration_tests::produce(&producer, "transfers.rejected", None, "C-0", second.to_string().as_bytes(), &[])
        .await;
    // Owners: a settled transfer claimed by a client that owns nothing.
    db.execute("UPDATE transfers SET client = 'chaos-nobody' WHERE id = $1", &[&settled]).await;
    // Forged events: a transfer takes a forged rejection's reason.
    db.execute("UPDATE transfers SET rejection_reason = $2 WHERE id = $1", &[&keyed, &super::inject::FORGED_REASON])
        .await;
    history.forged.push(super::load::Forged {
        topic: "transfers.rejected".into(),
        id: keyed.to_string(),
        what: super::inject::FORGED_REASON.into(),
    });
    // Dead letters: one that is no poison, and a poison record that never got there.
    tally_integration_tests::produce(&producer, "transfers.requested-dlt", None, "C-0", b"not poison", &[]).await;
    let lost = "a poison record that never reached a DLT".to_owned();
    history.poison.push(Injected { topic: "transfers.requested".into(), marker: lost });
    // Offsets: a record no running consumer reads (daemon a, the only notifier, is down).
    tally_integration_tests::produce(&producer, &retry, None, "C-0", b"left behind", &[]).await;
    // Notifications: a delivery whose signature does not match its body.
    if let Some(first) = history.deliveries.first_mut() {
        first.headers.insert("x-tally-signature".into(), "sha256=forged".into());
    }
    // Faults: the last one never fired.
    history.fired.pop();
    // Idempotency, as clients saw it: a second answer naming another transfer.
    let mut twin =
        history.calls.iter().find(|c| c.status == 201 && c.path == "/transfers").cloned().expect("an accepted call");
    twin.response["id"] = json!(Uuid::new_v4());
    history.calls.push(twin);
    // Publish order: as if every transfer had been answered at once, any request
    // published after another of its key was sent later than its answer.
    for c in history.calls.iter_mut().filter(|c| c.path == "/transfers") {
        c.at_ms = 0;
    }
    // Outbox: a row nobody publishes.
    db.execute(
        "INSERT INTO outbox_events (id, topic, key, event_type, payload) \
         VALUES (gen_random_uuid(), 'transfers.requested', 'C-0', 'TransferRequested', '{}')",
        &[],
    )
    .await;
    let tampered = super::checks::check(env, daemon, &history, plan).await;
    let mut blind = Vec::new();
    for c in &tampered {
        let want = expected.iter().find(|(name, _)| *name == c.name).map(|(_, w)| w.as_str());
        let seen = c.violations.iter().find(|v| want.is_some_and(|w| v.contains(w)));
        let shown = seen.map(|v| v.chars().take(140).collect::<String>()).unwrap_or_default();
        eprintln!("tampered: {:<62} {:>6} violated; {shown}", c.name, c.violations.len());
        if seen.is_none() {
            blind.push((c.name, want));
        }
    }
    assert!(blind.is_empty(), "checks that did not report their own tampering (check, expected text): {blind:?}");
}
