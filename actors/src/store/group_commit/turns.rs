//! How the writers of one group commit take turns at its queue.
//!
//! One writer at a time waits at the queue. Once an item arrives it takes whatever else is
//! waiting, up to `max_batch`. If other writers' transactions are running meanwhile, it
//! does not start one more beside them at once: it keeps gathering until one of them ends,
//! the batch is full, or `spare_after` has passed since the older of its first item's
//! arrival and the oldest running transaction's start. So a second writer works only while
//! the first is slow (a lock wait, a slow disk, a batch larger than the load lets through
//! in `spare_after`), and then at once. While transactions are quick, what arrives during
//! one goes in one batch: fewer, larger transactions. An item waits for company at most
//! `spare_after` in all.

use std::time::Duration;

use tokio::sync::{mpsc, watch, Mutex};
use tokio::time::Instant;

/// What the queue holds: something that knows when it was queued.
pub(super) trait Queued {
    fn queued_at(&self) -> Instant;
}

/// The writers' shared queue and the start of each running transaction.
pub(super) struct Turns<P> {
    queue: Mutex<mpsc::Receiver<P>>,
    running: watch::Sender<Vec<Instant>>,
    max_batch: usize,
    spare_after: Duration,
}

/// A writer's transaction, counted as running from `started` until this is dropped.
pub(super) struct Running<'a> {
    running: &'a watch::Sender<Vec<Instant>>,
    started: Instant,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let started = self.started;
        self.running.send_modify(|running| {
            if let Some(i) = running.iter().position(|s| *s == started) {
                running.swap_remove(i);
            }
        });
    }
}

impl<P: Queued> Turns<P> {
    pub(super) fn new(queue: mpsc::Receiver<P>, max_batch: usize, spare_after: Duration) -> Self {
        Self {
            queue: Mutex::new(queue),
            running: watch::Sender::new(Vec::new()),
            max_batch: max_batch.max(1),
            spare_after,
        }
    }

    /// Waits for one item, then gathers as the module says; the batch with its transaction
    /// counted as running (from before the queue is let go, so that the next writer at the
    /// queue sees it). `None` once the queue is closed and empty.
    pub(super) async fn next_batch(&self) -> Option<(Vec<P>, Running<'_>)> {
        let mut queue = self.queue.lock().await;
        let first = queue.recv().await?;
        let mut batch = Vec::with_capacity(self.max_batch.min(64));
        let since = first.queued_at();
        batch.push(first);
        self.take_waiting(&mut queue, &mut batch);
        // Transactions start only under the queue's lock, which this writer holds: the
        // running ones can only end while it gathers.
        let (others, oldest) = {
            let running = self.running.borrow();
            (running.len(), running.iter().min().copied())
        };
        if let Some(oldest) = oldest.filter(|_| batch.len() < self.max_batch) {
            let spare = tokio::time::sleep_until(since.min(oldest) + self.spare_after);
            tokio::pin!(spare);
            let mut ended = self.running.subscribe();
            loop {
                tokio::select! {
                    _ = ended.wait_for(|running| running.len() < others) => break,
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
            // Whichever way the wait ended, what is already queued goes too: the end of a
            // transaction and an arrival can be ready together, and either may be seen first.
            self.take_waiting(&mut queue, &mut batch);
        }
        let started = Instant::now();
        self.running.send_modify(|running| running.push(started));
        Some((batch, Running { running: &self.running, started }))
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
    use std::pin::Pin;

    use super::*;

    const NEVER: Duration = Duration::from_secs(600);
    /// Longer than any step of these tests takes on a loaded machine.
    const SOON: Duration = Duration::from_secs(5);

    /// An item queued at `.1`.
    struct Item(u32, Instant);

    impl Queued for Item {
        fn queued_at(&self) -> Instant {
            self.1
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime")
    }

    fn turns(max_batch: usize, spare_after: Duration) -> (mpsc::Sender<Item>, Turns<Item>) {
        let (tx, rx) = mpsc::channel(64);
        (tx, Turns::new(rx, max_batch, spare_after))
    }

    async fn send(tx: &mpsc::Sender<Item>, items: impl IntoIterator<Item = u32>) {
        for n in items {
            tx.send(Item(n, Instant::now())).await.expect("queued");
        }
    }

    /// The next batch's items, failing the test if it takes longer than [`SOON`].
    async fn soon<'a, F>(next: F) -> (Vec<u32>, Running<'a>)
    where
        F: Future<Output = Option<(Vec<Item>, Running<'a>)>>,
    {
        let (batch, running) = tokio::time::timeout(SOON, next).await.expect("in time").expect("a batch");
        (batch.iter().map(|i| i.0).collect(), running)
    }

    /// Whether `f` is still pending after the others had 50 ms to run.
    async fn still_pending<F: Future + Unpin>(f: &mut F) -> bool {
        tokio::time::timeout(Duration::from_millis(50), f).await.is_err()
    }

    fn running(turns: &Turns<Item>) -> usize {
        turns.running.borrow().len()
    }

    type Next<'a> = Pin<Box<dyn Future<Output = Option<(Vec<Item>, Running<'a>)>> + 'a>>;

    /// A transaction of item 1 running (its guard), and the next turn holding item 2,
    /// still waiting behind it.
    async fn one_waiting_behind_one<'a>(tx: &mpsc::Sender<Item>, turns: &'a Turns<Item>) -> (Running<'a>, Next<'a>) {
        send(tx, [1]).await;
        let (first, running) = soon(turns.next_batch()).await;
        assert_eq!(first, [1]);
        let mut next: Next<'a> = Box::pin(turns.next_batch());
        send(tx, [2]).await;
        assert!(still_pending(&mut next).await, "a second transaction started beside a quick one");
        (running, next)
    }

    #[test]
    fn with_no_transaction_running_the_first_item_goes_at_once() {
        let (tx, turns) = turns(10, NEVER);
        runtime().block_on(async {
            send(&tx, [1]).await;
            let (batch, _running) = soon(turns.next_batch()).await;
            assert_eq!(batch, [1]);
            assert_eq!(running(&turns), 1, "counted as running");
        });
        assert_eq!(running(&turns), 0, "no longer once its guard is gone");
    }

    #[test]
    fn arrivals_during_a_running_transaction_wait_for_it_and_go_in_one_batch() {
        let (tx, turns) = turns(10, NEVER);
        runtime().block_on(async {
            let (running, next) = one_waiting_behind_one(&tx, &turns).await;
            send(&tx, 3..=4).await;
            drop(running);
            let (batch, _running) = soon(next).await;
            assert_eq!(batch, [2, 3, 4], "what came while the first ran, together, once it ended");
        });
    }

    #[test]
    fn a_slow_transaction_holds_the_next_batch_back_only_for_spare_after() {
        let (tx, turns) = turns(10, Duration::from_millis(300));
        runtime().block_on(async {
            send(&tx, [1]).await;
            let (_, _stuck) = soon(turns.next_batch()).await;
            send(&tx, [2]).await;
            let mut next = Box::pin(turns.next_batch());
            assert!(still_pending(&mut next).await, "held back while the first is young");
            let (batch, _running) = soon(next).await;
            assert_eq!(batch, [2], "a second writer, beside the stuck one");
            assert_eq!(running(&turns), 2);
        });
    }

    #[test]
    fn a_transaction_already_slow_does_not_hold_the_next_batch_back() {
        let spare = Duration::from_secs(3);
        let (tx, turns) = turns(10, spare);
        runtime().block_on(async {
            send(&tx, [1]).await;
            let (_, _stuck) = soon(turns.next_batch()).await;
            tokio::time::sleep(spare).await;
            send(&tx, [2]).await;
            // Counted from the item's arrival, this would wait `spare` again.
            let taken = tokio::time::timeout(spare / 2, turns.next_batch()).await;
            assert!(taken.is_ok(), "a transaction running longer than spare_after is slow: go at once");
        });
    }

    #[test]
    fn a_full_batch_does_not_wait_for_the_running_transaction() {
        let (tx, turns) = turns(3, NEVER);
        runtime().block_on(async {
            let (_running, next) = one_waiting_behind_one(&tx, &turns).await;
            send(&tx, 3..=5).await;
            let (batch, _running) = soon(next).await;
            assert_eq!(batch, [2, 3, 4], "full at max_batch; the rest waits for the next");
        });
    }

    #[test]
    fn a_queue_closed_while_gathering_ends_the_wait_and_then_the_turns() {
        let (tx, turns) = turns(10, NEVER);
        runtime().block_on(async {
            let (_running, next) = one_waiting_behind_one(&tx, &turns).await;
            drop(tx);
            let (batch, _second) = soon(next).await;
            assert_eq!(batch, [2], "what was gathered is written");
            assert!(tokio::time::timeout(SOON, turns.next_batch()).await.expect("in time").is_none());
        });
    }
}
