//! The seed-style baselines the bench compares tally with: a classic Kafka consumer that
//! settles one transfer per database transaction ([`ledger`]) and a classic scheduled
//! outbox relay ([`relay`]). They are the comparison, not a mode of tally: they run in the
//! bench's own process beside (or instead of) the daemon, and nothing in the daemon knows
//! of them.

pub mod ledger;
pub mod relay;
