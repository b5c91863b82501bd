//! Decisions that stand: the first antifraud decision for a transfer is stored in
//! `antifraud_decisions` before the Kafka transaction that publishes it commits, and every
//! later delivery of the same transfer (outbox republish, restart, rebalance, a consumer
//! that re-reads its topic) publishes the stored decision again: same event id, outcome,
//! score, reason and time, whatever the velocity state says by then.
//!
//! [`decide_batch`] is the plain logic (unit-tested); [`load`], [`store`] and [`recent`]
//! are the table's SQL.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::sql_types::{Array, Integer, Nullable, Text, Timestamptz};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use tally_schema::events::TransferRequested;
use uuid::Uuid;

use super::risk::RiskEngine;

/// `antifraud_decisions.outcome` of a transfer let through to the ledger.
pub const ANALYZED: &str = "ANALYZED";
/// `antifraud_decisions.outcome` of a blocked transfer.
pub const BLOCKED: &str = "BLOCKED";

/// One stored decision.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct Decision {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    pub transfer_id: Uuid,
    #[diesel(sql_type = Text)]
    pub source_account: String,
    #[diesel(sql_type = Text)]
    pub destination_account: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub amount_cents: i64,
    #[diesel(sql_type = Text)]
    pub currency: String,
    #[diesel(sql_type = Text)]
    pub outcome: String,
    #[diesel(sql_type = Integer)]
    pub score: i32,
    #[diesel(sql_type = Nullable<Text>)]
    pub reason: Option<String>,
    #[diesel(sql_type = Timestamptz)]
    pub requested_at: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    pub decided_at: DateTime<Utc>,
}

impl Decision {
    #[must_use]
    pub fn blocked(&self) -> bool {
        self.outcome == BLOCKED
    }

    /// Whether `t` asks for what was decided: a request under the same transfer id with
    /// other accounts, amount or currency does not get this decision.
    #[must_use]
    pub fn decides(&self, t: &TransferRequested) -> bool {
        self.source_account == t.source_account
            && self.destination_account == t.destination_account
            && self.amount_cents == t.amount_cents
            && self.currency == t.currency
    }
}

/// The decision of every transfer in `requests`: the stored one when there is one, else a
/// new one scored now (once per transfer id, in batch order). Returns all decisions by
/// transfer id and, separately, the new ones to store.
pub fn decide_batch(
    requests: &[&TransferRequested],
    stored: &HashMap<Uuid, Decision>,
    risk: &mut dyn RiskEngine,
    block_limit: i32,
    blocked_reason: &str,
    now: DateTime<Utc>,
) -> (HashMap<Uuid, Decision>, Vec<Decision>) {
    let mut all = stored.clone();
    let mut new = Vec::new();
    for t in requests {
        if all.contains_key(&t.transfer_id) {
            continue;
        }
        let score = risk.score(t);
        let blocked = score >= block_limit;
        let decision = Decision {
            transfer_id: t.transfer_id,
            source_account: t.source_account.clone(),
            destination_account: t.destination_account.clone(),
            amount_cents: t.amount_cents,
            currency: t.currency.clone(),
            outcome: if blocked { BLOCKED } else { ANALYZED }.into(),
            score,
            reason: blocked.then(|| blocked_reason.to_owned()),
            requested_at: t.requested_at,
            decided_at: now,
        };
        all.insert(t.transfer_id, decision.clone());
        new.push(decision);
    }
    (all, new)
}

/// The stored decisions of `ids`.
///
/// # Errors
/// Any database error.
pub async fn load(
    conn: &mut AsyncPgConnection,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, Decision>, diesel::result::Error> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    Ok(diesel::sql_query(
        "SELECT transfer_id, source_account::text AS source_account, \
         destination_account::text AS destination_account, amount_cents, currency::text AS currency, \
         outcome::text AS outcome, score, reason, requested_at, decided_at \
         FROM antifraud_decisions WHERE transfer_id = ANY($1)",
    )
    .bind::<Array<diesel::sql_types::Uuid>, _>(ids)
    .load::<Decision>(conn)
    .await?
    .into_iter()
    .map(|d| (d.transfer_id, d))
    .collect())
}

#[derive(QueryableByName)]
struct Inserted {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    transfer_id: Uuid,
}

/// Stores `decisions` unless a decision for the same transfer is there already (another
/// instance decided it first); returns the ids that were inserted.
///
/// # Errors
/// Any database error.
pub async fn store(
    conn: &mut AsyncPgConnection,
    decisions: &[Decision],
) -> Result<HashSet<Uuid>, diesel::result::Error> {
    if decisions.is_empty() {
        return Ok(HashSet::new());
    }
    let ids: Vec<Uuid> = decisions.iter().map(|d| d.transfer_id).collect();
    let accounts: Vec<&str> = decisions.iter().map(|d| d.source_account.as_str()).collect();
    let destinations: Vec<&str> = decisions.iter().map(|d| d.destination_account.as_str()).collect();
    let amounts: Vec<i64> = decisions.iter().map(|d| d.amount_cents).collect();
    let currencies: Vec<&str> = decisions.iter().map(|d| d.currency.as_str()).collect();
    let outcomes: Vec<&str> = decisions.iter().map(|d| d.outcome.as_str()).collect();
    let scores: Vec<i32> = decisions.iter().map(|d| d.score).collect();
    let reasons: Vec<Option<&str>> = decisions.iter().map(|d| d.reason.as_deref()).collect();
    let requested: Vec<DateTime<Utc>> = decisions.iter().map(|d| d.requested_at).collect();
    let decided: Vec<DateTime<Utc>> = decisions.iter().map(|d| d.decided_at).collect();
    Ok(diesel::sql_query(
        "INSERT INTO antifraud_decisions (transfer_id, source_account, destination_account, amount_cents, currency, \
                                          outcome, score, reason, requested_at, decided_at) \
         SELECT * FROM unnest($1::uuid[], $2::text[], $8::text[], $9::bigint[], $10::text[], $3::text[], $4::int[], \
                              $5::text[], $6::timestamptz[], $7::timestamptz[]) \
         ON CONFLICT (transfer_id) DO NOTHING RETURNING transfer_id",
    )
    .bind::<Array<diesel::sql_types::Uuid>, _>(&ids)
    .bind::<Array<Text>, _>(&accounts)
    .bind::<Array<Text>, _>(&outcomes)
    .bind::<Array<Integer>, _>(&scores)
    .bind::<Array<Nullable<Text>>, _>(&reasons)
    .bind::<Array<Timestamptz>, _>(&requested)
    .bind::<Array<Timestamptz>, _>(&decided)
    .bind::<Array<Text>, _>(&destinations)
    .bind::<Array<diesel::sql_types::BigInt>, _>(&amounts)
    .bind::<Array<Text>, _>(&currencies)
    .load::<Inserted>(conn)
    .await?
    .into_iter()
    .map(|r| r.transfer_id)
    .collect())
}

/// One transfer inside the velocity window, as stored.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct Recent {
    #[diesel(sql_type = Text)]
    pub source_account: String,
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    pub transfer_id: Uuid,
    #[diesel(sql_type = Timestamptz)]
    pub requested_at: DateTime<Utc>,
}

/// Every decided transfer requested within `window` of the newest decided one (event
/// time, but never later than now, so one future-dated request cannot empty the window),
/// oldest first: what a velocity window needs after a restart or rebalance.
///
/// # Errors
/// Any database error.
pub async fn recent(conn: &mut AsyncPgConnection, window: Duration) -> Result<Vec<Recent>, diesel::result::Error> {
    diesel::sql_query(
        "SELECT source_account::text AS source_account, transfer_id, requested_at FROM antifraud_decisions \
         WHERE requested_at >= LEAST((SELECT max(requested_at) FROM antifraud_decisions), now()) \
                               - make_interval(secs => $1) \
         ORDER BY requested_at",
    )
    .bind::<diesel::sql_types::Double, _>(window.as_secs_f64())
    .load(conn)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::antifraud::{RiskRules, RulesRiskEngine};

    fn request(amount: i64, at: i64) -> TransferRequested {
        TransferRequested {
            event_id: Uuid::new_v4(),
            transfer_id: Uuid::new_v4(),
            source_account: "A".into(),
            destination_account: "B".into(),
            amount_cents: amount,
            currency: "BRL".into(),
            requested_at: DateTime::from_timestamp(at, 0).unwrap_or_default(),
        }
    }

    #[test]
    fn a_stored_decision_stands_whatever_the_engine_would_say_now() {
        let mut risk = RulesRiskEngine::new(RiskRules::default());
        let big = request(6_000_000, 100);
        let blocked = Decision {
            transfer_id: big.transfer_id,
            source_account: "A".into(),
            destination_account: "B".into(),
            amount_cents: big.amount_cents,
            currency: "BRL".into(),
            outcome: BLOCKED.into(),
            score: 95,
            reason: Some("BLOCKED_BY_ANTIFRAUD".into()),
            requested_at: big.requested_at,
            decided_at: Utc::now(),
        };
        let stored = HashMap::from([(big.transfer_id, blocked.clone())]);
        // Scored now, 6,000,000 cents alone would pass (55 < 80).
        let (all, new) = decide_batch(&[&big], &stored, &mut risk, 80, "BLOCKED_BY_ANTIFRAUD", Utc::now());
        assert!(new.is_empty(), "nothing new to store");
        assert_eq!(all.get(&big.transfer_id), Some(&blocked));
        assert!(blocked.decides(&big));
        let other = TransferRequested { amount_cents: 9_000_000, ..big.clone() };
        assert!(!blocked.decides(&other), "the same id asking for another amount is not this decision");
    }

    #[test]
    fn a_transfer_is_scored_once_per_batch() {
        let rules = RiskRules { velocity_max: 1, ..RiskRules::default() };
        let mut risk = RulesRiskEngine::new(rules);
        let t = request(100, 0);
        let (all, new) = decide_batch(&[&t, &t, &t], &HashMap::new(), &mut risk, 80, "X", Utc::now());
        assert_eq!(new.len(), 1);
        assert_eq!(all[&t.transfer_id].outcome, ANALYZED);
        assert_eq!(all[&t.transfer_id].score, 5, "the same transfer three times is one transfer for velocity");
    }

    #[test]
    fn blocked_decisions_carry_the_reason() {
        let mut risk = RulesRiskEngine::new(RiskRules::default());
        let t = request(10_000_000, 0);
        let (all, _) = decide_batch(&[&t], &HashMap::new(), &mut risk, 80, "BLOCKED_BY_ANTIFRAUD", Utc::now());
        let d = &all[&t.transfer_id];
        assert!(d.blocked());
        assert_eq!(d.reason.as_deref(), Some("BLOCKED_BY_ANTIFRAUD"));
    }
}
