//! The risk engine behind a trait. The default is deterministic: it scores amount tiers
//! and the velocity of the source account over a sliding window measured in the events'
//! own `requestedAt` times, counting distinct transfers (a redelivered transfer is not a
//! second one), so a replay of the same input scores the same. The window is rebuilt from
//! the stored decisions when partitions are assigned, so it survives restarts and
//! rebalances. The window itself is [`VelocityWindow`] (`velocity.rs`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use tally_schema::events::TransferRequested;
use uuid::Uuid;

use super::velocity::VelocityWindow;

/// Scores a transfer from 0 (no risk) to 100.
pub trait RiskEngine: Send {
    fn score(&mut self, transfer: &TransferRequested) -> i32;

    /// How far back (in event time) the engine remembers transfers; `None` when it keeps
    /// no state, so nothing needs rebuilding.
    fn window(&self) -> Option<Duration> {
        None
    }

    /// Replaces the remembered transfers with `recent` (source account, transfer id,
    /// requested at; oldest first), as stored by whichever instance decided them.
    fn rebuild(&mut self, recent: &[(String, Uuid, DateTime<Utc>)]) {
        let _ = recent;
    }
}

/// Settings of [`RulesRiskEngine`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RiskRules {
    /// Score of every transfer.
    pub base: i32,
    /// (amount in cents at least, points), highest tier that matches wins.
    pub amount_tiers: Vec<(i64, i32)>,
    pub velocity_window: Duration,
    /// More transfers than this from one source account inside the window add
    /// `velocity_points`.
    pub velocity_max: usize,
    pub velocity_points: i32,
}

impl Default for RiskRules {
    fn default() -> Self {
        Self {
            base: 5,
            amount_tiers: vec![(1_000_000, 25), (5_000_000, 50), (10_000_000, 80)],
            velocity_window: Duration::from_secs(60),
            velocity_max: 20,
            velocity_points: 40,
        }
    }
}

/// The default engine: amount tiers plus source-account velocity.
#[derive(Debug)]
pub struct RulesRiskEngine {
    rules: RiskRules,
    velocity: VelocityWindow,
}

impl RulesRiskEngine {
    #[must_use]
    pub fn new(mut rules: RiskRules) -> Self {
        rules.amount_tiers.sort_unstable();
        let velocity = VelocityWindow::new(rules.velocity_window);
        Self { rules, velocity }
    }
}

impl RiskEngine for RulesRiskEngine {
    fn score(&mut self, t: &TransferRequested) -> i32 {
        let amount = self
            .rules
            .amount_tiers
            .iter()
            .rev()
            .find(|(min, _)| t.amount_cents >= *min)
            .map_or(0, |(_, points)| *points);
        let recent = self.velocity.count(&t.source_account, t.transfer_id, t.requested_at);
        let velocity = if recent > self.rules.velocity_max { self.rules.velocity_points } else { 0 };
        (self.rules.base + amount + velocity).clamp(0, 100)
    }

    fn window(&self) -> Option<Duration> {
        Some(self.rules.velocity_window)
    }

    fn rebuild(&mut self, recent: &[(String, Uuid, DateTime<Utc>)]) {
        self.velocity.rebuild(recent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn transfer(account: &str, amount: i64, at_secs: i64) -> TransferRequested {
        TransferRequested {
            event_id: Uuid::new_v4(),
            transfer_id: Uuid::new_v4(),
            source_account: account.into(),
            destination_account: "B".into(),
            amount_cents: amount,
            currency: "BRL".into(),
            requested_at: DateTime::from_timestamp(at_secs, 0).unwrap_or_default(),
            client: None,
        }
    }

    #[test]
    fn amount_tiers() {
        let mut e = RulesRiskEngine::new(RiskRules::default());
        assert_eq!(e.score(&transfer("A", 100, 0)), 5);
        assert_eq!(e.score(&transfer("B", 1_000_000, 0)), 30);
        assert_eq!(e.score(&transfer("C", 5_000_000, 0)), 55);
        assert_eq!(e.score(&transfer("D", 10_000_000, 0)), 85, "blocked at the default limit of 80");
    }

    #[test]
    fn velocity_over_a_sliding_window_of_event_time() {
        let rules = RiskRules { velocity_max: 2, velocity_window: Duration::from_secs(10), ..RiskRules::default() };
        let mut e = RulesRiskEngine::new(rules);
        assert_eq!(e.score(&transfer("A", 100, 0)), 5);
        assert_eq!(e.score(&transfer("A", 100, 1)), 5);
        assert_eq!(e.score(&transfer("A", 100, 2)), 45, "third inside 10 s");
        assert_eq!(e.score(&transfer("B", 100, 2)), 5, "per account");
        assert_eq!(e.score(&transfer("A", 100, 30)), 5, "the window slid past the burst");
    }

    #[test]
    fn velocity_counts_distinct_transfers() {
        let rules = RiskRules { velocity_max: 2, velocity_window: Duration::from_secs(10), ..RiskRules::default() };
        let mut e = RulesRiskEngine::new(rules);
        let t = transfer("A", 100, 0);
        for _ in 0..5 {
            assert_eq!(e.score(&t), 5, "redeliveries of one transfer are one transfer");
        }
        assert_eq!(e.score(&transfer("A", 100, 1)), 5);
        assert_eq!(e.score(&transfer("A", 100, 2)), 45, "the third distinct transfer inside 10 s");
    }

    #[test]
    fn rebuilt_state_counts_like_the_original() {
        let rules = RiskRules { velocity_max: 2, velocity_window: Duration::from_secs(10), ..RiskRules::default() };
        let earlier: Vec<_> = (0..2).map(|i| transfer("A", 100, i)).collect();
        let mut restarted = RulesRiskEngine::new(rules.clone());
        assert_eq!(restarted.score(&transfer("A", 100, 2)), 5, "a fresh engine knows nothing");
        let mut rebuilt = RulesRiskEngine::new(rules);
        rebuilt.rebuild(
            &earlier.iter().map(|t| (t.source_account.clone(), t.transfer_id, t.requested_at)).collect::<Vec<_>>(),
        );
        assert_eq!(rebuilt.score(&transfer("A", 100, 2)), 45, "the rebuilt window holds the two earlier transfers");
    }

    #[test]
    fn deterministic_for_the_same_input() {
        let input: Vec<_> = (0..50).map(|i| transfer(if i % 3 == 0 { "X" } else { "Y" }, i * 300_000, i)).collect();
        let run = || {
            let mut e = RulesRiskEngine::new(RiskRules::default());
            input.iter().map(|t| e.score(t)).collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
    }
}
