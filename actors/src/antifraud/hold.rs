//! Waiting without leaving the group. While a batch waits out a failure (the database
//! away, a transaction to redo), the loop keeps polling its consumer with every assigned
//! partition paused: no record is fetched, the rebalance callbacks run, and
//! `max.poll.interval.ms` never passes, so the member keeps its partitions instead of being
//! expelled and rebalancing the group. Records of partitions revoked meanwhile leave the
//! batch: they are no longer this member's to commit.
//!
//! After a transaction that may or may not have committed, [`rewind`] drops the records
//! the group's committed offsets already cover, so nothing is produced twice into a
//! committed transaction.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tracing::warn;

use super::{set_admin_pause, AntifraudContext, LoopIo, PIPELINE};
use crate::consume::Control;
use crate::record::Record;

/// Something held in a batch, by the input record it stands for.
pub(super) trait OfRecord {
    fn record(&self) -> &Record;
}

impl OfRecord for Record {
    fn record(&self) -> &Record {
        self
    }
}

/// Every assigned partition paused while this lives; on drop the assignment resumes
/// (unless the pipeline is paused through the admin API). Partitions assigned meanwhile
/// are paused by the rebalance callback.
pub(super) struct Hold<'a> {
    consumer: &'a BaseConsumer<AntifraudContext>,
}

impl<'a> Hold<'a> {
    pub(super) fn begin(consumer: &'a BaseConsumer<AntifraudContext>) -> Self {
        consumer.context().holding.store(true, Ordering::Relaxed);
        set_paused(consumer, true);
        Self { consumer }
    }

    /// Polls (serving the group) for `duration`, or until the stage stops. Returns the
    /// partitions revoked meanwhile: their records are no longer this member's to commit.
    pub(super) fn wait(&self, io: &LoopIo<'_>, duration: Duration) -> Vec<(String, i32)> {
        let until = Instant::now() + duration;
        loop {
            // Admin commands are answered while holding; the partitions stay paused until
            // the hold ends, which then follows the admin state. A stop raised the stopping
            // flag before it was sent: the batch gives up at once and the loop ends.
            while let Ok(c) = io.control.try_recv() {
                match c {
                    Control::Pause(applied) => {
                        set_admin_pause(self.consumer, io.status, true, false);
                        let _ = applied.send(());
                    }
                    Control::Resume(applied) => {
                        set_admin_pause(self.consumer, io.status, false, false);
                        let _ = applied.send(());
                    }
                    Control::Stop(done) => drop(done),
                }
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || io.stopping.load(Ordering::Relaxed) {
                break;
            }
            match self.consumer.poll(left.min(Duration::from_millis(100))) {
                // Every partition is paused, so no record should come; should one come
                // anyway, put the position back so that it is read again after the hold.
                Some(Ok(m)) => {
                    let (topic, partition, offset) = (m.topic().to_owned(), m.partition(), m.offset());
                    drop(m);
                    if let Err(e) =
                        self.consumer.seek(&topic, partition, Offset::Offset(offset), Duration::from_secs(5))
                    {
                        warn!(pipeline = PIPELINE, error = %e, "Cannot seek back a record fetched while holding.");
                    }
                    set_paused(self.consumer, true);
                }
                Some(Err(e)) => warn!(pipeline = PIPELINE, error = %e, "Consumer error while holding."),
                None => {}
            }
        }
        take_revoked(self.consumer)
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        let context = self.consumer.context();
        context.holding.store(false, Ordering::Relaxed);
        if !context.admin_paused.load(Ordering::Relaxed) {
            set_paused(self.consumer, false);
        }
    }
}

pub(super) fn set_paused(consumer: &BaseConsumer<AntifraudContext>, pause: bool) {
    let Ok(tpl) = consumer.assignment() else { return };
    if tpl.count() == 0 {
        return;
    }
    let result = if pause { consumer.pause(&tpl) } else { consumer.resume(&tpl) };
    if let Err(e) = result {
        warn!(pipeline = PIPELINE, error = %e, pause, "Cannot change the pause state of the assignment.");
    }
}

/// The partitions revoked since the last look.
pub(super) fn take_revoked(consumer: &BaseConsumer<AntifraudContext>) -> Vec<(String, i32)> {
    std::mem::take(&mut *consumer.context().revoked.lock().unwrap_or_else(PoisonError::into_inner))
}

/// Drops from `batch` the records of the `revoked` partitions; returns how many.
pub(super) fn drop_partitions<T: OfRecord>(batch: &mut Vec<T>, revoked: &[(String, i32)]) -> usize {
    let before = batch.len();
    if !revoked.is_empty() {
        batch.retain(|item| {
            let r = item.record();
            !revoked.iter().any(|(t, p)| *t == r.topic && *p == r.partition)
        });
    }
    before - batch.len()
}

/// Drops from `batch` the records below the group's committed offsets: a transaction that
/// reported failure may still have committed (a fatal error after the commit reached the
/// coordinator; a lost member whose partitions another member processed meanwhile). With
/// `read_committed`, librdkafka asks for stable offsets, so a transaction still completing
/// is waited for (brokers from Kafka 2.5 on, KIP-447). Returns the dropped records.
///
/// # Errors
/// When the committed offsets cannot be read; the batch is then left as it is.
pub(super) fn rewind<T: OfRecord>(
    consumer: &BaseConsumer<AntifraudContext>,
    batch: &mut Vec<T>,
    timeout: Duration,
) -> KafkaResult<Vec<T>> {
    let mut tpl = TopicPartitionList::new();
    for r in batch.iter().map(OfRecord::record) {
        if tpl.find_partition(&r.topic, r.partition).is_none() {
            tpl.add_partition(&r.topic, r.partition);
        }
    }
    if tpl.count() == 0 {
        return Ok(Vec::new());
    }
    let committed = consumer.committed_offsets(tpl, timeout)?;
    let next: HashMap<(String, i32), i64> = committed
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some(((e.topic().to_owned(), e.partition()), o)),
            _ => None,
        })
        .collect();
    Ok(retain_uncommitted(batch, &next))
}

/// The plain part of [`rewind`]: keeps the records at or past their partition's committed
/// offset (all of a partition with none); returns the others.
fn retain_uncommitted<T: OfRecord>(batch: &mut Vec<T>, committed: &HashMap<(String, i32), i64>) -> Vec<T> {
    let (keep, done): (Vec<T>, Vec<T>) = std::mem::take(batch).into_iter().partition(|item| {
        let r = item.record();
        committed.get(&(r.topic.clone(), r.partition)).is_none_or(|c| r.offset >= *c)
    });
    *batch = keep;
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(partition: i32, offset: i64) -> Record {
        Record { topic: "t".into(), partition, offset, ..Record::default() }
    }

    #[test]
    fn records_below_the_committed_offset_are_dropped() {
        let mut batch = vec![record(0, 4), record(0, 5), record(0, 6), record(1, 2), record(2, 9)];
        let committed = HashMap::from([(("t".to_owned(), 0), 6), (("t".to_owned(), 1), 2)]);
        let done: Vec<(i32, i64)> =
            retain_uncommitted(&mut batch, &committed).iter().map(|r| (r.partition, r.offset)).collect();
        assert_eq!(done, vec![(0, 4), (0, 5)]);
        let left: Vec<(i32, i64)> = batch.iter().map(|r| (r.partition, r.offset)).collect();
        assert_eq!(left, vec![(0, 6), (1, 2), (2, 9)], "partition 2 has no committed offset: all kept");
    }
}
