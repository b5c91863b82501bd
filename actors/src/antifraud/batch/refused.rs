//! Outputs refused for good. A record the producer takes but the broker refuses (larger
//! than its topic's `max.message.bytes`, a topic this stage may not write) makes the
//! transaction abortable, and producing the same outputs again would be refused again,
//! for good, on the one loop that serves every partition. So a transaction whose records
//! the broker refused is not produced again as it was: its batch is committed in
//! [`Parts`], halves of halves, until the input whose output is refused stands alone;
//! that input is then [set aside](set_aside): a decision goes to the input's DLT instead
//! (kind poison, saying the broker refused its output), a dead letter the DLT refuses to
//! the `dead_letters` table. Every other record commits as it would have, in order.
//!
//! A refusal is told apart from a broker that is away or slow by its error code: only the
//! codes that judge the record itself (or its topic's permission) count. A send the
//! producer refuses at once names its output, which is set aside without splitting.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tracing::warn;

use super::{Item, LoopIo, PIPELINE};
use crate::antifraud::output;
use crate::antifraud::txn::{permanently_refused, recovery, Recovery, TxnError, TxnFailure};
use crate::supervise::{store_dead_letter, DeadLetterRow};

/// The parts a batch is committed in, front to back: the whole batch at first; a part
/// whose records the broker refused is split in halves, the first half committed first.
/// A part is a run of consecutive items, so each partition's records still commit in their
/// order. Only the lengths are kept, the front part last.
#[derive(Debug)]
pub(super) struct Parts(Vec<usize>);

impl Parts {
    pub(super) fn new(len: usize) -> Self {
        Self(vec![len])
    }

    /// How many items, from the front of the batch (`len` items left), the next
    /// transaction takes.
    pub(super) fn front(&self, len: usize) -> usize {
        self.0.last().copied().unwrap_or(len).min(len)
    }

    /// Splits the front part in halves; false when it is a single item.
    pub(super) fn split(&mut self) -> bool {
        match self.0.pop() {
            Some(n) if n > 1 => {
                self.0.push(n - n / 2);
                self.0.push(n / 2);
                true
            }
            Some(n) => {
                self.0.push(n);
                false
            }
            None => false,
        }
    }

    /// The front part committed: the next one comes to the front.
    pub(super) fn committed(&mut self) {
        self.0.pop();
    }

    /// Items left the batch (revoked partitions, records committed after all): the parts
    /// no longer match it, so what is left is one part again.
    pub(super) fn reset(&mut self, len: usize) {
        self.0 = vec![len];
    }
}

/// Whether an error code judges a record (or its topic's permission) rather than the
/// broker's state: the same record would be refused every time.
fn judges_record(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::MessageBatchTooLarge
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::InvalidRecord
            | RDKafkaErrorCode::TopicAuthorizationFailed
    )
}

/// [`judges_record`] for an error.
pub(super) fn record_refused(e: &KafkaError) -> bool {
    e.rdkafka_error_code().is_some_and(judges_record)
}

/// Whether the transaction failed because the broker refused records it was sent (not a
/// send the producer refused at once, which names its output): it must be aborted, and
/// its error, or that of one of its failed deliveries (a commit fails with a plain
/// "message(s) failed delivery" when the transaction was not made abortable first),
/// judges a record.
pub(super) fn refused_by_broker(failure: &TxnFailure) -> bool {
    failure.refused.is_none()
        && recovery(failure) == Recovery::Abort
        && (failure.error.kafka().is_some_and(record_refused) || failure.deliveries.iter().copied().any(judges_record))
}

/// What the broker refused, in words: the failure's own error when it judges a record,
/// else the first failed delivery that does. A delivery the broker refused makes the
/// transaction abortable, and the transaction's next call (adding the offsets, say) then
/// fails with a plain "erroneous state" that names no cause.
pub(super) fn refusal(failure: &TxnFailure) -> String {
    let judged = failure.deliveries.iter().copied().find(|&code| judges_record(code));
    match (&failure.error, judged) {
        (TxnError::Kafka(e), Some(code)) if !record_refused(e) => KafkaError::MessageProduction(code).to_string(),
        (error, _) => error.to_string(),
    }
}

/// Whether the producer refused the send of `item`'s output at once for good: a dead
/// letter whose DLT cannot take it (too large, the partition or topic missing, not
/// permitted), a decision the broker would refuse.
pub(super) fn refused_at_once(item: &Item, error: &TxnError) -> bool {
    let Some(e) = error.kafka() else { return false };
    if item.output.dead_letter.is_some() {
        permanently_refused(e)
    } else {
        record_refused(e)
    }
}

/// Sets aside the input of an output refused for good with `error`: a decision is
/// replaced by the input's dead letter (produced in the next transaction); a dead letter
/// is stored in the `dead_letters` table and produces nothing. False when that cannot be
/// done now (the table unreachable, or nothing of the item is produced): the transaction is
/// retried as it is.
pub(super) fn set_aside(io: &LoopIo<'_>, item: &mut Item, error: &str) -> bool {
    if item.stored {
        return false;
    }
    if item.output.dead_letter.is_some() {
        item.stored = store_refused(io, item, error);
        return item.stored;
    }
    let record = &item.record;
    warn!(pipeline = PIPELINE, topic = %record.topic, partition = record.partition, offset = record.offset,
          output = %item.output.topic, error = %error, "The broker refused an output; its input goes to the DLT.");
    let reason = format!("the broker refused its output to {}: {error}", item.output.topic);
    item.output = output::poison(record, io.spec, reason);
    true
}

/// Stores the poison record of `item` in the `dead_letters` table; true once stored (or
/// already there). False for an item that is no dead letter.
fn store_refused(io: &LoopIo<'_>, item: &Item, dlt_error: &str) -> bool {
    let Some(reason) = &item.output.dead_letter else { return false };
    let record = &item.record;
    let row = DeadLetterRow {
        record,
        group: &io.spec.group_id,
        kind: tally_schema::headers::dlt_kind::POISON,
        message: reason,
        attempts: 1,
        dlt_error,
    };
    let result = io.runtime.block_on(async {
        let mut conn = io.pool.get().await.map_err(|e| e.to_string())?;
        store_dead_letter(&mut conn, &row).await.map_err(|e| e.to_string())
    });
    match result {
        Ok(_) => {
            warn!(pipeline = PIPELINE, topic = %record.topic, partition = record.partition, offset = record.offset,
                  error = dlt_error, "The DLT refused a poison record; stored it in the dead_letters table.");
            true
        }
        Err(e) => {
            warn!(pipeline = PIPELINE, error = %e, "Cannot store a refused poison record; retrying the batch.");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commits items `0..len` in parts while the broker refuses every part holding an
    /// item of `refused` until it is set aside alone; returns the items in the order they
    /// were committed and the number of transactions.
    fn commit(len: usize, refused: &[usize]) -> (Vec<usize>, usize, Vec<usize>) {
        let mut items: Vec<usize> = (0..len).collect();
        let mut aside = Vec::new();
        let mut parts = Parts::new(items.len());
        let (mut committed, mut transactions) = (Vec::new(), 0);
        while !items.is_empty() {
            let n = parts.front(items.len());
            transactions += 1;
            let bad = items[..n].iter().any(|i| refused.contains(i) && !aside.contains(i));
            if !bad {
                committed.extend(items.drain(..n));
                parts.committed();
            } else if !parts.split() {
                aside.push(items[0]);
            }
        }
        (committed, transactions, aside)
    }

    #[test]
    fn a_refused_item_is_isolated_and_everything_commits_in_order() {
        let (committed, transactions, aside) = commit(8, &[5]);
        assert_eq!(committed, (0..8).collect::<Vec<_>>(), "every item, in batch order");
        assert_eq!(aside, vec![5]);
        // 0..8 refused, 0..4 commits, 4..8 refused, 4..6 refused, 4 commits, 5 refused
        // (set aside), 5 commits, 6..8 commits.
        assert_eq!(transactions, 8);
    }

    #[test]
    fn several_refused_items_and_odd_lengths() {
        for len in 1..40 {
            let refused: Vec<usize> = (0..len).filter(|i| i % 7 == 3 || *i == len - 1).collect();
            let (committed, transactions, aside) = commit(len, &refused);
            assert_eq!(committed, (0..len).collect::<Vec<_>>(), "len {len}");
            assert_eq!(aside, refused, "len {len}");
            // Bounded by a binary search per refused item, plus the parts between.
            let bound = 1 + refused.len() * (2 * (usize::BITS - len.leading_zeros()) as usize + 2);
            assert!(transactions <= bound, "len {len}: {transactions} transactions > {bound}");
        }
    }

    #[test]
    fn parts_start_again_whole_after_a_reset() {
        let mut parts = Parts::new(10);
        assert!(parts.split());
        assert_eq!(parts.front(10), 5);
        parts.reset(7);
        assert_eq!(parts.front(7), 7);
        parts.committed();
        assert_eq!(parts.front(3), 3, "no part left: what is left of the batch");
        assert_eq!(Parts::new(1).front(1), 1);
        assert!(!Parts::new(1).split());
    }

    #[test]
    fn refusals_that_judge_the_record() {
        let produce = KafkaError::MessageProduction;
        assert!(record_refused(&produce(RDKafkaErrorCode::MessageSizeTooLarge)));
        assert!(record_refused(&produce(RDKafkaErrorCode::TopicAuthorizationFailed)));
        assert!(!record_refused(&produce(RDKafkaErrorCode::MessageTimedOut)));
        assert!(!record_refused(&produce(RDKafkaErrorCode::NotEnoughReplicas)));
        assert!(!record_refused(&produce(RDKafkaErrorCode::UnknownTopicOrPartition)), "may be a topic not known yet");
    }

    #[test]
    fn a_refusal_names_the_refused_delivery_not_the_state_it_left() {
        let failure = |error: KafkaError, deliveries: Vec<RDKafkaErrorCode>| TxnFailure {
            error: TxnError::Kafka(error),
            phase: crate::antifraud::txn::Phase::SendOffsets,
            open: true,
            refused: None,
            deliveries: deliveries.into(),
        };
        let erroneous = || KafkaError::MessageProduction(RDKafkaErrorCode::State);
        let said = refusal(&failure(
            erroneous(),
            vec![RDKafkaErrorCode::MessageTimedOut, RDKafkaErrorCode::MessageSizeTooLarge],
        ));
        assert!(said.contains("too large"), "{said}");
        let own = KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed);
        let said = refusal(&failure(own, vec![RDKafkaErrorCode::MessageSizeTooLarge]));
        assert!(said.contains("uthoriz"), "the failure's own refusal first: {said}");
        let said = refusal(&failure(erroneous(), vec![RDKafkaErrorCode::MessageTimedOut]));
        assert!(said.contains("rroneous state"), "no refused delivery: the error as it is: {said}");
    }

    #[test]
    fn a_commit_refused_for_a_delivery_that_judges_a_record() {
        let commit = |deliveries: Vec<RDKafkaErrorCode>| TxnFailure {
            error: TxnError::Kafka(KafkaError::MessageProduction(RDKafkaErrorCode::Inconsistent)),
            phase: crate::antifraud::txn::Phase::Commit,
            open: true,
            refused: None,
            deliveries: deliveries.into(),
        };
        assert!(refused_by_broker(&commit(vec![
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::TopicAuthorizationFailed
        ])));
        assert!(!refused_by_broker(&commit(vec![RDKafkaErrorCode::MessageTimedOut])), "a broker away is no refusal");
        assert!(!refused_by_broker(&commit(vec![])));
    }
}
