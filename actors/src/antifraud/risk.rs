//! The risk engine behind a trait (seed 001 §5 `MotorDeRisco`). The default is
//! deterministic: it scores amount tiers and the velocity of the source account over a
//! sliding window measured in the events' own `requestedAt` times, so a replay of the same
//! input scores the same.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tally_schema::events::TransferRequested;

/// Scores a transfer from 0 (no risk) to 100.
pub trait RiskEngine: Send {
    fn score(&mut self, transfer: &TransferRequested) -> i32;
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
    recent: HashMap<String, VecDeque<DateTime<Utc>>>,
    seen: usize,
}

impl RulesRiskEngine {
    #[must_use]
    pub fn new(mut rules: RiskRules) -> Self {
        rules.amount_tiers.sort_unstable();
        Self { rules, recent: HashMap::new(), seen: 0 }
    }

    fn velocity(&mut self, account: &str, at: DateTime<Utc>) -> usize {
        let window = chrono::Duration::from_std(self.rules.velocity_window).unwrap_or(chrono::Duration::MAX);
        let times = self.recent.entry(account.to_owned()).or_default();
        times.push_back(at);
        while times.front().is_some_and(|t| *t + window < at) {
            times.pop_front();
        }
        let n = times.len();
        self.seen += 1;
        if self.seen % 10_000 == 0 {
            // Forget accounts with nothing inside the window, so memory stays bounded.
            self.recent.retain(|_, t| t.back().is_some_and(|last| *last + window >= at));
        }
        n
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
        let velocity = if self.velocity(&t.source_account, t.requested_at) > self.rules.velocity_max {
            self.rules.velocity_points
        } else {
            0
        };
        (self.rules.base + amount + velocity).clamp(0, 100)
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
        }
    }

    #[test]
    fn amount_tiers() {
        let mut e = RulesRiskEngine::new(RiskRules::default());
        assert_eq!(e.score(&transfer("A", 100, 0)), 5);
        assert_eq!(e.score(&transfer("B", 1_000_000, 0)), 30);
        assert_eq!(e.score(&transfer("C", 5_000_000, 0)), 55);
        assert_eq!(e.score(&transfer("D", 10_000_000, 0)), 85, "blocked at the seed's limit of 80");
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
    fn deterministic_for_the_same_input() {
        let input: Vec<_> = (0..50).map(|i| transfer(if i % 3 == 0 { "X" } else { "Y" }, i * 300_000, i)).collect();
        let run = || {
            let mut e = RulesRiskEngine::new(RiskRules::default());
            input.iter().map(|t| e.score(t)).collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
    }
}
