//! Decisions that stand: the first antifraud decision for a transfer is stored in
//! `antifraud_decisions` before the Kafka transaction that publishes it commits, and every
//! later delivery of the same transfer (outbox republish, restart, rebalance, a consumer
//! that re-reads its topic) publishes the stored decision again: same event id, outcome,
//! score, reason and time, whatever the velocity state says by then.
//!
//! [`decide_batch`] is the plain logic (unit-tested); the table's statements are in
//! [`crate::store::decisions`].

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use tally_schema::events::TransferRequested;
use uuid::Uuid;

use super::risk::RiskEngine;
pub use crate::store::decisions::{Decision, ANALYZED, BLOCKED};

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
            client: None,
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
