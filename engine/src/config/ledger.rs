//! `[ledger]`: settlement into the double-entry ledger.

use super::*;

/// The highest `ledger.max_balance_cents` allowed: nine such balances still sum inside an
/// i64, and PostgreSQL sums balances as numeric anyway.
pub(super) const MAX_BALANCE_CEILING: i64 = 1_000_000_000_000_000_000;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LedgerConfig {
    pub group_id: String,
    /// Transfers settled per database transaction at most. Batches only grow this large
    /// under a backlog; there, 1,000 settles about 45% more per second than 200 did (the
    /// per-statement work is paid once per batch).
    pub batch_size: usize,
    /// Settlement transactions running at once, each on a connection of
    /// `database.pools.ledger`.
    pub max_concurrent_batches: usize,
    /// How long a partial batch waits for more transfers while another batch runs.
    #[serde(rename = "linger_ms", with = "super::duration::ms")]
    pub linger: Duration,
    /// The ceiling of every balance and amount, in cents. Intake refuses a larger opening
    /// balance or amount (422); settlement rejects a credit that would pass it
    /// (BALANCE_LIMIT_EXCEEDED). Keeps every sum far from 64-bit overflow.
    pub max_balance_cents: i64,
    /// How often the daemon evaluates the ledger invariants by itself, publishing
    /// `tally_ledger_invariant_ok` for the alert rules; zero turns it off. The check reads
    /// every account and posting in one snapshot: on a large ledger, space it out.
    #[serde(rename = "check_interval_secs", with = "super::duration::secs")]
    pub check_interval: Duration,
    /// Currency codes the intake accepts besides ISO 4217's active list (three capital
    /// letters each, e.g. a loyalty point); it refuses any other code with 422.
    pub extra_currencies: Vec<String>,
    pub retry: RetryConfig,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        Self {
            group_id: "tally-ledger".into(),
            batch_size: 1_000,
            max_concurrent_batches: 4,
            linger: Duration::from_millis(2),
            max_balance_cents: 1_000_000_000_000_000,
            check_interval: Duration::from_secs(300),
            extra_currencies: Vec::new(),
            retry: RetryConfig::default(),
        }
    }
}

impl LedgerConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        validate_group("ledger.group_id", &self.group_id)?;
        if !(1..=5_000).contains(&self.batch_size) {
            return invalid("ledger.batch_size", "must be between 1 and 5000");
        }
        if !(1..=1000).contains(&self.max_concurrent_batches) {
            return invalid("ledger.max_concurrent_batches", "must be between 1 and 1000");
        }
        if !(1..=MAX_BALANCE_CEILING).contains(&self.max_balance_cents) {
            return invalid("ledger.max_balance_cents", "must be between 1 and 1000000000000000000 (10^18)");
        }
        if let Some(bad) = self.extra_currencies.iter().find(|c| tally_schema::Currency::parse("c", c).is_err()) {
            return invalid("ledger.extra_currencies", format!("{bad:?} is not a code of three capital letters"));
        }
        self.retry.validate("ledger.retry")
    }
}
