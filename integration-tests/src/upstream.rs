//! A test standing in for the stages upstream of the one it tests: it produces tally's
//! events signed with a key the daemon accepts, and writes first what those stages would
//! have written to the system of record (the intake's `transfers` and `orders` rows,
//! antifraud's decision, the ledger's settlement), because every stage checks an event
//! against that record before it acts on it.
//!
//! [`Upstream::forged`] produces what no stage of tally wrote: unsigned, or signed with a
//! key the daemon does not hold.

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureProducer;
use serde_json::Value;
use tally_actors::signing::{Keyring, SigningKey};

use super::*;

/// Produces events as the stages before the one under test would (see the module doc).
pub struct Upstream<'a> {
    pub producer: FutureProducer,
    pub keyring: Keyring,
    db: &'a TestDb,
}

impl TestEnv {
    /// The keyring of this environment's daemons: the embedded broker's key.
    #[must_use]
    pub fn keyring(&self) -> Keyring {
        Keyring::single(self.broker.signing_key().clone())
    }

    /// A directory holding this environment's key, for `signing.keys_dir` of a daemon in
    /// a child process (`TALLY__SIGNING__KEYS_DIR`).
    ///
    /// # Panics
    /// When the file cannot be written.
    #[must_use]
    pub fn keys_dir(&self) -> std::path::PathBuf {
        write_keys_dir(self.broker.signing_key())
    }

    /// An upstream of this environment's broker and database.
    #[must_use]
    pub fn upstream(&self) -> Upstream<'_> {
        Upstream { producer: producer(self.bootstrap()), keyring: self.keyring(), db: &self.db }
    }
}

/// A fresh directory holding `key` as `<id>.key`.
///
/// # Panics
/// When the file cannot be written.
#[must_use]
pub fn write_keys_dir(key: &SigningKey) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tally-test-keys-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("create the keys directory");
    std::fs::write(dir.join(format!("{}.key", key.id())), key.secret()).expect("write the key");
    dir
}

impl<'a> Upstream<'a> {
    /// An upstream of `bootstrap` signing with `keyring`, writing its records into `db`.
    #[must_use]
    pub fn new(bootstrap: &str, keyring: Keyring, db: &'a TestDb) -> Self {
        Self { producer: producer(bootstrap), keyring, db }
    }

    /// The same upstream signing with `keyring` instead.
    #[must_use]
    pub fn with_keyring(&self, keyring: Keyring) -> Upstream<'a> {
        Upstream { producer: self.producer.clone(), keyring, db: self.db }
    }

    /// The database it records in.
    #[must_use]
    pub fn db(&self) -> &'a TestDb {
        self.db
    }

    /// Produces `payload` keyed by `key` as event `event_type`, signed; the `event-id` is
    /// the payload's `eventId` when it has one. Nothing is written to the database.
    pub async fn signed(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: &str,
        payload: &[u8],
        event_type: &str,
    ) -> (i32, i64) {
        self.signed_with(topic, partition, key, payload, event_type, &[]).await
    }

    /// [`Upstream::signed`] with `extra` headers too (which the signature does not cover).
    pub async fn signed_with(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: &str,
        payload: &[u8],
        event_type: &str,
        extra: &[(&str, &str)],
    ) -> (i32, i64) {
        let event_id = event_id_of(payload);
        let mut headers = OwnedHeaders::new()
            .insert(Header { key: "event-id", value: Some(&event_id) })
            .insert(Header { key: "event-type", value: Some(event_type) });
        for (k, v) in extra {
            headers = headers.insert(Header { key: k, value: Some(*v) });
        }
        let headers = self.keyring.sign(headers, key.as_bytes(), payload, &event_id, event_type);
        send(&self.producer, topic, partition, key, payload, headers).await
    }

    /// Produces `payload` as [`Upstream::signed`] does but unsigned: what a producer that
    /// is not tally writes.
    pub async fn forged(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: &str,
        payload: &[u8],
        event_type: &str,
    ) -> (i32, i64) {
        let event_id = event_id_of(payload);
        let headers = OwnedHeaders::new()
            .insert(Header { key: "event-id", value: Some(&event_id) })
            .insert(Header { key: "event-type", value: Some(event_type) });
        send(&self.producer, topic, partition, key, payload, headers).await
    }

    /// Records the transfer `event` (as [`TestDb::record_analyzed`]) and produces it,
    /// signed, to `transfers.analyzed`, keyed by its source account.
    pub async fn analyzed(&self, event: &Value, partition: Option<i32>) -> (i32, i64) {
        self.db.record_analyzed(&[event]).await;
        let key = event["sourceAccount"].as_str().expect("sourceAccount");
        self.signed("transfers.analyzed", partition, key, event.to_string().as_bytes(), "TransferAnalyzed").await
    }
}

impl TestDb {
    /// Records what the intake and antifraud hold of each `TransferAnalyzed` of `events`
    /// (a PENDING transfer, an ANALYZED decision of the same accounts, amount and
    /// currency), unless they hold it already.
    pub async fn record_analyzed(&self, events: &[&Value]) {
        self.record_requested(events).await;
        let (ids, sources, destinations, amounts, currencies) = columns(events);
        self.execute(
            "INSERT INTO antifraud_decisions (transfer_id, source_account, destination_account, amount_cents, \
                                                  currency, outcome, score, requested_at) \
                 SELECT id, s, d, a, c, 'ANALYZED', 10, now() \
                 FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bigint[], $5::text[]) AS u(id, s, d, a, c) \
                 ON CONFLICT (transfer_id) DO NOTHING",
            &[&ids, &sources, &destinations, &amounts, &currencies],
        )
        .await;
    }

    /// Records the intake's PENDING transfer of each event of `events` (with
    /// `transferId`, `sourceAccount`, `destinationAccount`, `amountCents`, `currency`),
    /// unless it holds it already.
    pub async fn record_requested(&self, events: &[&Value]) {
        let (ids, sources, destinations, amounts, currencies) = columns(events);
        self.execute(
            "INSERT INTO transfers (id, source_account, destination_account, amount_cents, currency, status) \
                 SELECT id, s, d, a, c, 'PENDING' \
                 FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bigint[], $5::text[]) AS u(id, s, d, a, c) \
                 ON CONFLICT (id) DO NOTHING",
            &[&ids, &sources, &destinations, &amounts, &currencies],
        )
        .await;
    }

    /// Records that the ledger settled transfer `id` of `amount` cents from `from` to `to`
    /// (the intake's row, the decision, the inbox outcome and the two postings; the
    /// accounts are created, empty, when missing).
    pub async fn record_settled(&self, id: uuid::Uuid, from: &str, to: &str, amount: i64) {
        let event = serde_json::json!({ "transferId": id, "sourceAccount": from, "destinationAccount": to,
                                        "amountCents": amount, "currency": "BRL" });
        self.record_analyzed(&[&event]).await;
        for account in [from, to] {
            self.execute(
                "INSERT INTO accounts (id, balance_cents, currency) VALUES ($1, 0, 'BRL') ON CONFLICT DO NOTHING",
                &[&account],
            )
            .await;
        }
        self.execute(
            "INSERT INTO processed_transfers (transfer_id, outcome) VALUES ($1, 'SETTLED') \
                 ON CONFLICT (transfer_id) DO NOTHING",
            &[&id],
        )
        .await;
        self.execute(
            "INSERT INTO postings (transfer_id, account_id, kind, amount_cents) \
                 VALUES ($1, $2, 'D', $4), ($1, $3, 'C', $4) ON CONFLICT DO NOTHING",
            &[&id, &from, &to, &amount],
        )
        .await;
    }

    /// Records that the ledger rejected transfer `id` (from `from`) with `reason`.
    pub async fn record_rejected(&self, id: uuid::Uuid, from: &str, reason: &str) {
        let event = serde_json::json!({ "transferId": id, "sourceAccount": from, "destinationAccount": "ANY-DEST",
                                        "amountCents": 1, "currency": "BRL" });
        self.record_analyzed(&[&event]).await;
        self.execute(
            "INSERT INTO processed_transfers (transfer_id, outcome, reason) VALUES ($1, 'REJECTED', $2) \
                 ON CONFLICT (transfer_id) DO NOTHING",
            &[&id, &reason],
        )
        .await;
    }

    /// Records the intake's order of an `OrderReceived` event.
    pub async fn record_order(&self, event: &Value) {
        let id: uuid::Uuid = serde_json::from_value(event["orderId"].clone()).expect("orderId");
        self.execute(
            "INSERT INTO orders (id, external_reference, customer_id, amount_cents, currency) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
            &[
                &id,
                &event["externalReference"].as_str().expect("externalReference"),
                &event["customerId"].as_str().expect("customerId"),
                &event["amountCents"].as_i64().expect("amountCents"),
                &event["currency"].as_str().expect("currency"),
            ],
        )
        .await;
    }
}

/// The columns of the transfers of `events`, for `unnest`.
#[allow(clippy::type_complexity)]
fn columns(events: &[&Value]) -> (Vec<uuid::Uuid>, Vec<String>, Vec<String>, Vec<i64>, Vec<String>) {
    let text = |e: &Value, k: &str| e[k].as_str().unwrap_or_else(|| panic!("{k} of {e}")).to_owned();
    let ids = events.iter().map(|e| serde_json::from_value(e["transferId"].clone()).expect("transferId")).collect();
    let sources = events.iter().map(|e| text(e, "sourceAccount")).collect();
    let destinations = events.iter().map(|e| text(e, "destinationAccount")).collect();
    let amounts = events.iter().map(|e| e["amountCents"].as_i64().expect("amountCents")).collect();
    let currencies = events.iter().map(|e| text(e, "currency")).collect();
    (ids, sources, destinations, amounts, currencies)
}

/// The payload's `eventId`, or a fresh id when it has none.
fn event_id_of(payload: &[u8]) -> String {
    serde_json::from_slice::<Value>(payload)
        .ok()
        .and_then(|v| v["eventId"].as_str().map(str::to_owned))
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
}

async fn send(
    producer: &FutureProducer,
    topic: &str,
    partition: Option<i32>,
    key: &str,
    payload: &[u8],
    headers: OwnedHeaders,
) -> (i32, i64) {
    let mut record = rdkafka::producer::FutureRecord::to(topic).key(key).payload(payload).headers(headers);
    if let Some(p) = partition {
        record = record.partition(p);
    }
    producer
        .send(record, Duration::from_secs(10))
        .await
        .map(|d| (d.partition, d.offset))
        .map_err(|(e, _)| e)
        .expect("produce")
}
