//! Forged and stray events: records on tally's own topics that no stage of tally wrote, or
//! that contradict what the stages recorded, move no money, change no status and tell no
//! one anything; each is dead-lettered once, as poison, with its reason; the genuine flow
//! then finishes as it would have.
//!
//! Every event comes in four forms: unsigned, signed with another secret under the
//! daemon's key id, signed with a key the daemon does not hold (a retired one), and signed
//! with the daemon's own key (a neighbour holding the key, or a replayed dump): the first
//! three fail the signature check, the last the check against the system of record.
//!
//! Broker: the embedded broker (librdkafka's mock cluster, in this process).
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use std::collections::BTreeMap;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tally_actors::signing::{Keyring, SigningKey};
use tally_engine::config::{Secret, SecretUrl};
use tally_integration_tests::{
    assert_ledger_ok, balance_of, create_account, final_state, post_transfer, postings_of, read_topic, spawn_app,
    wait_until, Deadline, TestApp, TestEnv, Upstream, WebhookReceiver,
};
use uuid::Uuid;

const TOKEN: &str = "forged-token";

/// How a forged record is signed.
#[derive(Debug, Clone, Copy)]
enum Signed {
    Not,
    /// The daemon's key id, another secret.
    OtherSecret,
    /// A key id the daemon does not hold.
    Retired,
    /// The daemon's own key: only the system of record can refuse it.
    Genuinely,
}

impl Signed {
    const ALL: [Self; 4] = [Self::Not, Self::OtherSecret, Self::Retired, Self::Genuinely];

    /// What its dead letter's reason starts with, when the record is signed otherwise than
    /// [`Signed::Genuinely`].
    fn refusal(self) -> Option<&'static str> {
        match self {
            Self::Not => Some("bad signature: unsigned"),
            Self::OtherSecret => Some("bad signature: does not match key `embedded`"),
            Self::Retired => Some("bad signature: unknown key `retired`"),
            Self::Genuinely => None,
        }
    }
}

/// One forged record: where it went and what its dead letter must say.
struct Forged {
    topic: &'static str,
    partition: i32,
    offset: i64,
    reason: String,
    what: String,
}

struct Forger<'a> {
    upstream: Upstream<'a>,
    other_secret: Keyring,
    retired: Keyring,
    sent: Vec<Forged>,
}

impl Forger<'_> {
    /// Produces `payload` to `topic` keyed by `key` in every form; the genuinely signed
    /// one must be refused for `reason`.
    async fn forge(&mut self, what: &str, topic: &'static str, key: &str, payload: &Value, kind: &str, reason: &str) {
        let bytes = payload.to_string().into_bytes();
        for signed in Signed::ALL {
            let (partition, offset) = match signed {
                Signed::Not => self.upstream.forged(topic, None, key, &bytes, kind).await,
                Signed::OtherSecret => self.with(&self.other_secret).signed(topic, None, key, &bytes, kind).await,
                Signed::Retired => self.with(&self.retired).signed(topic, None, key, &bytes, kind).await,
                Signed::Genuinely => self.upstream.signed(topic, None, key, &bytes, kind).await,
            };
            let reason = signed.refusal().unwrap_or(reason).to_owned();
            self.sent.push(Forged { topic, partition, offset, reason, what: format!("{what} ({signed:?})") });
        }
    }

    fn with(&self, keyring: &Keyring) -> Upstream<'_> {
        self.upstream.with_keyring(keyring.clone())
    }
}

fn analyzed(id: Uuid, from: &str, to: &str, amount: i64, score: i32) -> Value {
    json!({ "eventId": Uuid::new_v4(), "transferId": id, "sourceAccount": from, "destinationAccount": to,
            "amountCents": amount, "currency": "BRL", "score": score, "analyzedAt": "2026-12-01T00:00:00Z" })
}

fn requested(id: Uuid, from: &str, to: &str, amount: i64) -> Value {
    json!({ "eventId": Uuid::new_v4(), "transferId": id, "sourceAccount": from, "destinationAccount": to,
            "amountCents": amount, "currency": "BRL", "requestedAt": "2026-12-01T00:00:00Z" })
}

fn settled(id: Uuid) -> Value {
    json!({ "eventId": tally_schema::derived_event_id("settled", id), "transferId": id, "settledAt": "2026-12-01T00:00:00Z" })
}

fn rejected(id: Uuid, reason: &str) -> Value {
    json!({ "eventId": tally_schema::derived_event_id("rejected", id), "transferId": id, "reason": reason,
            "rejectedAt": "2026-12-01T00:00:00Z" })
}

async fn admin_post(app: &TestApp, path: &str) {
    let res = app.send(app.client.post(format!("{}{path}", app.admin_url)).bearer_auth(TOKEN)).await;
    assert_eq!(res.status(), StatusCode::OK, "{path}");
}

/// The dead letters of every forged record, by (its topic, partition, offset), with the
/// consumer group and reason of each.
async fn dead_letters(env: &TestEnv, topics: &[&str]) -> BTreeMap<(String, i32, i64), Vec<(String, String)>> {
    let mut all: BTreeMap<(String, i32, i64), Vec<(String, String)>> = BTreeMap::new();
    for topic in topics {
        let dlt = tally_schema::topics::dlt(topic);
        for r in read_topic(env.bootstrap(), &dlt, Deadline::secs(10)).await.unwrap_or_default() {
            let at = |h: &str| r.header(h).unwrap_or_default().to_owned();
            let key = (
                (*topic).to_owned(),
                at("dlt-original-partition").parse().unwrap_or(-1),
                at("dlt-original-offset").parse().unwrap_or(-1),
            );
            assert_eq!(r.header("dlt-exception-kind"), Some("poison"), "{r:?}");
            all.entry(key).or_default().push((at("dlt-consumer-group"), at("dlt-exception-message")));
        }
    }
    all
}

/// The groups that read `topic` in this test's daemon, sorted.
fn groups_of(topic: &str) -> Vec<&'static str> {
    match topic {
        "transfers.analyzed" => vec!["tally-ledger"],
        "transfers.requested" => vec!["tally-antifraud"],
        "orders.received" => vec!["tally-orders"],
        _ => vec!["tally-notifications", "tally-projection"],
    }
}

/// Waits until every forged record of `forged` is dead-lettered once by each group that
/// reads its topic, and checks each dead letter's reason.
async fn assert_each_dead_lettered_once(env: &TestEnv, forged: &[&Forged]) {
    let topics: Vec<&str> =
        forged.iter().map(|f| f.topic).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    let letters = wait_until("every forged record dead-lettered", Deadline::DEFAULT, || async {
        let letters = dead_letters(env, &topics).await;
        let missing: Vec<&str> = forged
            .iter()
            .filter(|f| {
                letters.get(&(f.topic.to_owned(), f.partition, f.offset)).map_or(0, Vec::len) < groups_of(f.topic).len()
            })
            .map(|f| f.what.as_str())
            .collect();
        if missing.is_empty() {
            Ok(letters)
        } else {
            Err(format!("not yet dead-lettered: {missing:?}"))
        }
    })
    .await;
    for f in forged {
        let mine = &letters[&(f.topic.to_owned(), f.partition, f.offset)];
        let mut groups: Vec<&str> = mine.iter().map(|(g, _)| g.as_str()).collect();
        groups.sort_unstable();
        assert_eq!(groups, groups_of(f.topic), "{}: dead-lettered once per group: {mine:?}", f.what);
        for (group, message) in mine {
            assert!(message.contains(&f.reason), "{} ({group}): {message:?} does not say {:?}", f.what, f.reason);
        }
    }
}

/// Forged `transfers.analyzed`, `.settled`, `.rejected`, `.requested` and
/// `orders.received` records, for transfers the intake never took, a PENDING one, a
/// blocked one and with another amount, each unsigned, badly signed or signed with the
/// daemon's own key: no posting, no balance or status change, no notification; each
/// dead-lettered once per group with its reason. Then the genuine transfer settles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_stray_events_move_no_money_and_change_no_status() {
    let receiver = WebhookReceiver::start(|_, _| 200).await;
    let (env, app) = spawn_app(|c| {
        c.http.admin_token = Secret::new(TOKEN);
        c.notifications.webhook_url = SecretUrl::new(receiver.url.clone());
        c.notifications.webhook_secret = Secret::new("s3cret");
    })
    .await;
    create_account(&app, "F-A", 50_000_000, "BRL").await;
    create_account(&app, "F-B", 0, "BRL").await;
    // Antifraud blocks 20,000,000 cents; the rejection is projected and notified.
    let blocked = post_transfer(&app, "F-A", "F-B", 20_000_000).await;
    assert_eq!(final_state(&app, blocked).await["rejectionReason"], "BLOCKED_BY_ANTIFRAUD");
    // With antifraud paused, this one stays PENDING with no decision.
    admin_post(&app, "/admin/pipelines/antifraud/pause").await;
    let pending = post_transfer(&app, "F-A", "F-B", 1_000).await;
    let (unknown, unknown_requested) = (Uuid::new_v4(), Uuid::new_v4());

    let upstream = env.upstream();
    let foreign = |id: &str, byte: u8| Keyring::single(SigningKey::new(id, &[byte; 32]).expect("key"));
    let mut f =
        Forger { upstream, other_secret: foreign("embedded", 1), retired: foreign("retired", 2), sent: Vec::new() };
    let analyzed_topic = "transfers.analyzed";
    f.forge(
        "analyzed, unknown",
        analyzed_topic,
        "F-A",
        &analyzed(unknown, "F-A", "F-B", 700, 5),
        "TransferAnalyzed",
        "unknown transfer",
    )
    .await;
    f.forge(
        "analyzed, pending",
        analyzed_topic,
        "F-A",
        &analyzed(pending, "F-A", "F-B", 1_000, 5),
        "TransferAnalyzed",
        "no decision",
    )
    .await;
    f.forge(
        "analyzed, pending, other amount",
        analyzed_topic,
        "F-A",
        &analyzed(pending, "F-A", "F-B", 9_000, 5),
        "TransferAnalyzed",
        "contradicts the transfer",
    )
    .await;
    f.forge(
        "analyzed, blocked",
        analyzed_topic,
        "F-A",
        &analyzed(blocked, "F-A", "F-B", 20_000_000, 5),
        "TransferAnalyzed",
        "contradicts",
    )
    .await;
    f.forge(
        "settled, pending",
        "transfers.settled",
        "F-A",
        &settled(pending),
        "TransferSettled",
        "contradicts the ledger",
    )
    .await;
    f.forge("settled, unknown", "transfers.settled", "F-A", &settled(unknown), "TransferSettled", "unknown transfer")
        .await;
    f.forge(
        "settled, blocked",
        "transfers.settled",
        "F-A",
        &settled(blocked),
        "TransferSettled",
        "contradicts the ledger",
    )
    .await;
    f.forge(
        "rejected, pending",
        "transfers.rejected",
        "F-A",
        &rejected(pending, "you lost"),
        "TransferRejected",
        "contradicts the ledger",
    )
    .await;
    f.forge(
        "rejected, blocked, other reason",
        "transfers.rejected",
        "F-A",
        &rejected(blocked, "INSUFFICIENT_FUNDS"),
        "TransferRejected",
        "contradicts the ledger",
    )
    .await;
    let order = json!({ "eventId": Uuid::new_v4(), "orderId": Uuid::new_v4(), "externalReference": "EXT-F",
                        "customerId": "C-F", "amountCents": 10, "currency": "BRL", "receivedAt": "2026-12-01T00:00:00Z" });
    f.forge("order, unknown", "orders.received", "EXT-F", &order, "OrderReceived", "unknown order").await;
    let before_antifraud: Vec<&Forged> = f.sent.iter().collect();
    assert_each_dead_lettered_once(&env, &before_antifraud).await;

    // Nothing moved and nothing changed.
    for id in [pending, unknown, blocked] {
        assert_eq!(postings_of(&env.db, id).await, 0, "transfer {id}: no postings");
    }
    assert_eq!(balance_of(&app, "F-A").await, 50_000_000);
    assert_eq!(balance_of(&app, "F-B").await, 0);
    let view = tally_integration_tests::json_body(app.get(&format!("/transfers/{pending}")).await).await;
    assert_eq!(view["status"], "PENDING", "{view}");
    let view = final_state(&app, blocked).await;
    assert_eq!(
        (view["status"].as_str(), view["rejectionReason"].as_str()),
        (Some("REJECTED"), Some("BLOCKED_BY_ANTIFRAUD"))
    );
    assert_eq!(env.db.count("received_orders").await, 0);
    assert_eq!(env.db.scalar_i64("SELECT count(*) FROM transfers WHERE id = $1", &[&unknown]).await, 0);

    // Requests antifraud must refuse, then the genuine flow goes on.
    let n = f.sent.len();
    let requested_topic = "transfers.requested";
    f.forge(
        "requested, unknown",
        requested_topic,
        "F-A",
        &requested(unknown_requested, "F-A", "F-B", 700),
        "TransferRequested",
        "unknown transfer",
    )
    .await;
    f.forge(
        "requested, pending, other amount",
        requested_topic,
        "F-A",
        &requested(pending, "F-A", "F-B", 9_000),
        "TransferRequested",
        "contradicts the transfer",
    )
    .await;
    admin_post(&app, "/admin/pipelines/antifraud/resume").await;
    let view = final_state(&app, pending).await;
    assert_eq!(view["status"], "SETTLED", "the genuine transfer settles: {view}");
    let after_antifraud: Vec<&Forged> = f.sent[n..].iter().collect();
    assert_each_dead_lettered_once(&env, &after_antifraud).await;
    assert_eq!(postings_of(&env.db, pending).await, 2);
    assert_eq!(balance_of(&app, "F-A").await, 50_000_000 - 1_000);
    assert_eq!(balance_of(&app, "F-B").await, 1_000);
    for id in [unknown, unknown_requested] {
        assert_eq!(
            env.db.scalar_i64("SELECT count(*) FROM antifraud_decisions WHERE transfer_id = $1", &[&id]).await,
            0,
            "nothing decided for {id}"
        );
    }
    // The webhook heard of the two genuine outcomes only.
    let calls = wait_until("both genuine outcomes notified", Deadline::DEFAULT, || async {
        let calls = receiver.calls();
        if calls.len() >= 2 {
            Ok(calls)
        } else {
            Err(format!("{} calls", calls.len()))
        }
    })
    .await;
    let mut told: Vec<String> = calls
        .iter()
        .map(|c| {
            serde_json::from_slice::<Value>(&c.body).expect("json")["transferId"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    told.sort();
    let mut genuine = vec![blocked.to_string(), pending.to_string()];
    genuine.sort();
    assert_eq!(told, genuine, "no one was told of a forged outcome");
    assert_ledger_ok(&app).await;
}
