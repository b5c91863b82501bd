//! How the writers of one group commit take turns at its queue.
//!
//! One writer at a time waits at the queue. Once an item arrives it takes whatever else is
//! waiting, up to `max_batch`. If another writer's transaction is running meanwhile, it
//! does not start a second transaction beside it at once: it keeps gathering until that
//! transaction ends, the batch is full, or the first item has waited `spare_after`. So a
//! second writer works only while the first is slow (a lock wait, a slow disk, a batch
//! larger than the load lets through in `spare_after`). While transactions are quick
//! the arrivals of one transaction's span go in one batch: fewer, larger transactions,
//! and no arrival waits longer than it would behind the one writer anyway.

use std::time::Duration;

use tokio::sync::{mpsc, watch, Mutex};

/// The writers' shared queue and the count of their transactions running.
pub(super) struct Turns<P> {
    queue: Mutex<mpsc::Receiver<P>>,
    busy: watch::Sender<usize>,
    max_batch: usize,
    spare_after: Duration,
}

/// A writer's transaction, counted as running until this is dropped.
pub(super) struct Busy<'a> {
    busy: &'a watch::Sender<usize>,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.busy.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl<P> Turns<P> {
    pub(super) fn new(queue: mpsc::Receiver<P>, max_batch: usize, spare_after: Duration) -> Self {
        Self { queue: Mutex::new(queue), busy: watch::Sender::new(0), max_batch: max_batch.max(1), spare_after }
    }

    /// Waits for one item, then gathers as the module says; the batch with its writer
    /// counted as running (from before the queue is let go, so that the next writer at
    /// the queue sees it). `None` once the queue is closed and empty.
    pub(super) async fn next_batch(&self) -> Option<(Vec<P>, Busy<'_>)> {
        let mut queue = self.queue.lock().await;
        let first = queue.recv().await?;
        let mut batch = Vec::with_capacity(self.max_batch.min(64));
        batch.push(first);
        self.take_waiting(&mut queue, &mut batch);
        if batch.len() < self.max_batch && *self.busy.borrow() > 0 {
            let spare = tokio::time::sleep(self.spare_after);
            tokio::pin!(spare);
            let mut running = self.busy.subscribe();
            loop {
                tokio::select! {
                    _ = running.wait_for(|n| *n == 0) => break,
                    () = &mut spare => break,
                    next = queue.recv() => match next {
                        Some(next) => {
                            batch.push(next);
                            self.take_waiting(&mut queue, &mut batch);
                            if batch.len() >= self.max_batch {
                                break;
                            }
                        }
                        None => break,
                    },
                }
            }
        }
        self.busy.send_modify(|n| *n += 1);
        Some((batch, Busy { busy: &self.busy }))
    }

    fn take_waiting(&self, queue: &mut mpsc::Receiver<P>, batch: &mut Vec<P>) {
        while batch.len() < self.max_batch {
            match queue.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use super::*;

    const NEVER: Duration = Duration::from_secs(600);

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime")
    }

    /// Whether `f` is still pending after the others had 50 ms to run.
    async fn still_pending<F: Future + Unpin>(f: &mut F) -> bool {
        tokio::time::timeout(Duration::from_millis(50), f).await.is_err()
    }

    fn turns(max_batch: usize, spare_after: Duration) -> (mpsc::Sender<u32>, Turns<u32>) {
        let (tx, rx) = mpsc::channel(64);
        (tx, Turns::new(rx, max_batch, spare_after))
    }

    #[test]
    fn with_no_transaction_running_the_first_item_goes_at_once() {
        let (tx, turns) = turns(10, NEVER);
        runtime().block_on(async {
            tx.send(1).await.expect("queued");
            let (batch, _busy) = turns.next_batch().await.expect("a batch");
            assert_eq!(batch, [1]);
            assert_eq!(*turns.busy.borrow(), 1, "counted as running");
        });
        assert_eq!(*turns.busy.borrow(), 0, "no longer once its guard is gone");
    }

    #[test]
    fn arrivals_during_a_running_transaction_wait_for_it_and_go_in_one_batch() {
        let (tx, turns) = turns(10, NEVER);
        runtime().block_on(async {
            tx.send(1).await.expect("queued");
            let (first, running) = turns.next_batch().await.expect("a batch");
            assert_eq!(first, [1]);
            let mut next = Box::pin(turns.next_batch());
            for i in 2..=4 {
                tx.send(i).await.expect("queued");
            }
            assert!(still_pending(&mut next).await, "a second transaction started beside a quick one");
            drop(running);
            let (batch, _busy) = next.await.expect("a batch");
            assert_eq!(batch, [2, 3, 4], "what came while the first ran, together");
        });
    }

    #[test]
    fn a_slow_transaction_holds_the_next_batch_back_only_for_spare_after() {
        let (tx, turns) = turns(10, Duration::from_millis(100));
        runtime().block_on(async {
            tx.send(1).await.expect("queued");
            let (_, _stuck) = turns.next_batch().await.expect("a batch");
            tx.send(2).await.expect("queued");
            let (batch, _busy) = turns.next_batch().await.expect("a second writer, beside the stuck one");
            assert_eq!(batch, [2]);
            assert_eq!(*turns.busy.borrow(), 2);
        });
    }

    #[test]
    fn a_full_batch_does_not_wait_for_the_running_transaction() {
        let (tx, turns) = turns(3, NEVER);
        runtime().block_on(async {
            tx.send(1).await.expect("queued");
            let (_, _running) = turns.next_batch().await.expect("a batch");
            let mut next = Box::pin(turns.next_batch());
            tx.send(2).await.expect("queued");
            assert!(still_pending(&mut next).await, "waits while the batch is not full");
            for i in 3..=5 {
                tx.send(i).await.expect("queued");
            }
            let (batch, _busy) = next.await.expect("a full batch");
            assert_eq!(batch, [2, 3, 4], "full at max_batch; the rest waits for the next");
        });
    }

    #[test]
    fn a_closed_queue_ends_the_turns_once_it_is_empty() {
        let (tx, turns) = turns(10, NEVER);
        runtime().block_on(async {
            tx.send(1).await.expect("queued");
            drop(tx);
            let (batch, _busy) = turns.next_batch().await.expect("what was queued first");
            assert_eq!(batch, [1]);
            assert!(turns.next_batch().await.is_none());
        });
    }
}
