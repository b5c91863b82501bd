//! When a settlement batch starts, how large, and with which transfers.
//!
//! Two batches that touch one account cannot both run: the second waits in PostgreSQL for
//! the first's row locks until it commits, holding a connection and every lock it took
//! before. So a batch takes only transfers whose accounts no running batch holds, and the
//! others wait for the next one: concurrent batches run side by side instead of in a line.
//! (Batches of other instances can still meet on an account; the locks, taken in one
//! global order, keep that correct.)

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};

/// When to start a batch and how large (plain state, unit-tested): a request starts a
/// batch at once when no transaction is running or a full batch is waiting; otherwise it
/// waits at most `linger` for others to join. Batches start while a slot is free, with the
/// waiting requests whose accounts no running batch holds ([`take_free`]); when every
/// waiting request needs a held account, nothing starts until a batch ends or the linger
/// is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlushPolicy {
    max_batch: usize,
    /// The size batches start at now: halved after a batch failed on a timeout or another
    /// transient error (its transfers come back together after the same backoff and would
    /// form the same slow batch again), doubled back after each batch that committed.
    cap: usize,
    max_concurrent: usize,
    running: usize,
    pending: usize,
    flush_scheduled: bool,
    /// The last flush found every waiting request's accounts held by running batches.
    stalled: bool,
}

/// What to do after a request arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnRequest {
    /// Start what the free slots allow now.
    FlushNow,
    /// Flush after the linger (no flush was scheduled yet).
    FlushLater,
    /// A flush is already scheduled or a running batch will flush when it ends.
    Wait,
}

impl FlushPolicy {
    #[must_use]
    pub fn new(max_batch: usize, max_concurrent: usize) -> Self {
        Self {
            max_batch: max_batch.max(1),
            cap: max_batch.max(1),
            max_concurrent: max_concurrent.max(1),
            running: 0,
            pending: 0,
            flush_scheduled: false,
            stalled: false,
        }
    }

    /// A request was queued.
    pub fn on_request(&mut self) -> OnRequest {
        self.pending += 1;
        if self.running == 0 || (self.pending >= self.max_batch && !self.stalled) {
            OnRequest::FlushNow
        } else if self.flush_scheduled {
            OnRequest::Wait
        } else {
            self.flush_scheduled = true;
            OnRequest::FlushLater
        }
    }

    /// The scheduled flush is due.
    pub fn on_linger(&mut self) {
        self.flush_scheduled = false;
    }

    /// The size of the next batch to start, if a slot is free and requests wait; counts
    /// the batch as running.
    pub fn next_batch(&mut self) -> Option<usize> {
        if self.running >= self.max_concurrent || self.pending == 0 {
            return None;
        }
        let take = self.pending.min(self.cap);
        self.pending -= take;
        self.running += 1;
        Some(take)
    }

    /// The batch [`Self::next_batch`] offered `offered` requests for took `took` of them
    /// (the others need accounts running batches hold, and wait); one that took none does
    /// not run.
    pub fn on_started(&mut self, offered: usize, took: usize) {
        self.pending += offered.saturating_sub(took);
        self.stalled = took == 0;
        if self.stalled {
            self.running = self.running.saturating_sub(1);
        }
    }

    /// A batch of `size` finished; `transient` when it failed on a transient error.
    pub fn on_batch_done(&mut self, size: usize, transient: bool) {
        self.running = self.running.saturating_sub(1);
        self.stalled = false;
        self.cap = match (transient, size) {
            // One transfer alone says nothing about the size of the next batch.
            (true, 0 | 1) => self.cap,
            (true, size) => (size / 2).clamp(1, self.max_batch),
            (false, _) => (self.cap * 2).min(self.max_batch),
        };
    }
}

/// The accounts of the running batches, counted per batch that holds them. Kept by hash: a
/// collision only makes a transfer wait for a batch it did not need to wait for.
#[derive(Debug, Default)]
pub struct HeldAccounts(HashMap<u64, u32>);

/// An account's key in [`HeldAccounts`].
#[must_use]
pub fn account_key(id: &str) -> u64 {
    let mut h = DefaultHasher::new();
    id.hash(&mut h);
    h.finish()
}

impl HeldAccounts {
    fn is_free(&self, keys: &[u64]) -> bool {
        keys.iter().all(|k| !self.0.contains_key(k))
    }

    /// A batch touching `keys` (each once) started.
    pub fn hold(&mut self, keys: &[u64]) {
        for k in keys {
            *self.0.entry(*k).or_default() += 1;
        }
    }

    /// The batch that held `keys` ended.
    pub fn release(&mut self, keys: &[u64]) {
        for k in keys {
            if let Some(n) = self.0.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    self.0.remove(k);
                }
            }
        }
    }

    /// Whether no batch holds anything.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Takes out of `waiting`, in order, up to `want` items whose accounts (`keys`) `held` does
/// not hold and no earlier waiting item needs; the others stay, in order. Returns them with
/// their accounts, each once. (Without the second condition a transfer A -> B, skipped
/// while B is held, could see later transfers take A, then B, for as long as both see
/// traffic: each account is served first come, first served.)
pub fn take_free<T>(
    waiting: &mut VecDeque<T>,
    want: usize,
    held: &HeldAccounts,
    keys: impl Fn(&T) -> [u64; 2],
) -> (Vec<T>, Vec<u64>) {
    let mut taken = Vec::with_capacity(want.min(waiting.len()));
    let mut accounts = Vec::with_capacity(2 * taken.capacity());
    let mut kept = VecDeque::new();
    let mut behind = HashSet::new();
    while taken.len() < want {
        let Some(item) = waiting.pop_front() else { break };
        let k = keys(&item);
        if held.is_free(&k) && !k.iter().any(|a| behind.contains(a)) {
            accounts.extend(k);
            taken.push(item);
        } else {
            behind.extend(k);
            kept.push_back(item);
        }
    }
    // The skipped ones go back in front of those not looked at, in their order.
    kept.append(waiting);
    *waiting = kept;
    accounts.sort_unstable();
    accounts.dedup();
    (taken, accounts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_batcher_starts_at_once_and_a_busy_one_gathers() {
        let mut p = FlushPolicy::new(3, 1);
        assert_eq!(p.on_request(), OnRequest::FlushNow, "nothing running: no reason to wait");
        assert_eq!(p.next_batch(), Some(1));
        assert_eq!(p.next_batch(), None, "nothing left");
        assert_eq!(p.on_request(), OnRequest::FlushLater, "one running: wait for others to join");
        assert_eq!(p.on_request(), OnRequest::Wait, "a flush is already scheduled");
        assert_eq!(p.next_batch(), None, "the only slot is taken");
        assert_eq!(p.on_request(), OnRequest::FlushNow, "a full batch waits");
        assert_eq!(p.next_batch(), None, "still no free slot");
        p.on_batch_done(1, false);
        assert_eq!(p.next_batch(), Some(3), "the slot freed: the three waiting go together");
        p.on_linger();
        assert_eq!(p.on_request(), OnRequest::FlushLater, "the linger fired, so a new one is scheduled");
    }

    #[test]
    fn batches_start_while_slots_are_free_and_never_exceed_the_size() {
        let mut p = FlushPolicy::new(2, 2);
        for _ in 0..7 {
            let _ = p.on_request();
        }
        assert_eq!((p.next_batch(), p.next_batch(), p.next_batch()), (Some(2), Some(2), None));
        p.on_batch_done(1, false);
        p.on_batch_done(1, false);
        assert_eq!((p.next_batch(), p.next_batch(), p.next_batch()), (Some(2), Some(1), None));
    }

    #[test]
    fn a_batch_that_failed_transiently_halves_the_next_and_commits_restore_it() {
        let mut p = FlushPolicy::new(500, 1);
        for _ in 0..600 {
            p.on_request();
        }
        assert_eq!(p.next_batch(), Some(500));
        p.on_batch_done(500, true);
        assert_eq!(p.next_batch(), Some(100), "the rest, below the halved cap");
        p.on_batch_done(100, true);
        for _ in 0..400 {
            p.on_request();
        }
        assert_eq!(p.next_batch(), Some(50), "halved again: not the same slow batch");
        p.on_batch_done(50, false);
        assert_eq!(p.next_batch(), Some(100), "doubled after a commit");
        p.on_batch_done(100, false);
        assert_eq!(p.next_batch(), Some(200), "doubled again, up to the configured size");
        p.on_batch_done(2, true);
        assert_eq!(p.next_batch(), Some(1), "at least one");
        p.on_batch_done(1, true);
        assert_eq!(p.next_batch(), Some(1), "a single transfer that failed leaves the size as it was");
    }

    #[test]
    fn sizes_below_one_are_one() {
        let mut p = FlushPolicy::new(0, 0);
        let _ = p.on_request();
        let _ = p.on_request();
        assert_eq!((p.next_batch(), p.next_batch()), (Some(1), None));
    }

    #[test]
    fn a_batch_takes_the_transfers_no_running_batch_holds_in_order() {
        let mut held = HeldAccounts::default();
        held.hold(&[account_key("A")]);
        let pair = |t: &(&str, &str)| [account_key(t.0), account_key(t.1)];
        let mut waiting: VecDeque<(&str, &str)> = [("A", "B"), ("C", "D"), ("E", "A"), ("F", "G"), ("H", "I")].into();
        let (taken, accounts) = take_free(&mut waiting, 2, &held, pair);
        assert_eq!(taken, [("C", "D"), ("F", "G")], "in order, up to the size, past the held ones");
        assert_eq!(waiting, [("A", "B"), ("E", "A"), ("H", "I")], "the others wait, in their order");
        let mut expected: Vec<u64> = ["C", "D", "F", "G"].map(account_key).to_vec();
        expected.sort_unstable();
        assert_eq!(accounts, expected);
        held.hold(&accounts);
        held.release(&[account_key("A")]);
        let (taken, _) = take_free(&mut waiting, 10, &held, pair);
        assert_eq!(taken, [("A", "B"), ("E", "A"), ("H", "I")], "A is free again; one batch may touch it twice");
        held.release(&accounts);
        assert!(held.is_empty());
    }

    #[test]
    fn a_transfer_waiting_for_one_account_keeps_its_other_account_for_itself() {
        // A -> B waits while B is held; later transfers on A may not take A meanwhile, or
        // batches alternating on A and B would keep it waiting for as long as they come.
        let pair = |t: &(&str, &str)| [account_key(t.0), account_key(t.1)];
        let mut held = HeldAccounts::default();
        held.hold(&[account_key("B")]);
        let mut waiting: VecDeque<(&str, &str)> = [("A", "B"), ("A2", "A"), ("C", "D")].into();
        let (taken, _) = take_free(&mut waiting, 10, &held, pair);
        assert_eq!(taken, [("C", "D")], "A is promised to the transfer that waits for B");
        assert_eq!(waiting, [("A", "B"), ("A2", "A")]);
        held.release(&[account_key("B")]);
        let (taken, _) = take_free(&mut waiting, 10, &held, pair);
        assert_eq!(taken, [("A", "B"), ("A2", "A")], "B free: both go, in order");
    }

    #[test]
    fn two_batches_holding_one_account_release_it_when_both_end() {
        let mut held = HeldAccounts::default();
        let a = [account_key("A")];
        held.hold(&a);
        held.hold(&a);
        held.release(&a);
        assert!(!held.is_free(&a), "the other batch still holds it");
        held.release(&a);
        assert!(held.is_free(&a) && held.is_empty());
    }

    #[test]
    fn a_flush_that_finds_every_account_held_starts_nothing_until_a_batch_ends() {
        let mut p = FlushPolicy::new(3, 2);
        assert_eq!(p.on_request(), OnRequest::FlushNow);
        assert_eq!(p.next_batch(), Some(1));
        p.on_started(1, 1);
        // Two more, both on the running batch's accounts.
        assert_eq!(p.on_request(), OnRequest::FlushLater);
        assert_eq!(p.on_request(), OnRequest::Wait);
        p.on_linger();
        assert_eq!(p.next_batch(), Some(2), "a slot is free");
        p.on_started(2, 0);
        assert_eq!(p.on_request(), OnRequest::FlushLater, "stalled: a full batch waits for the linger, not at once");
        p.on_linger();
        assert_eq!(p.next_batch(), Some(3), "the slot the empty batch took is free again");
        p.on_started(3, 1);
        assert_eq!(p.on_request(), OnRequest::FlushNow, "a full batch waits and the last flush took some");
        assert_eq!(p.next_batch(), None, "both slots run");
        p.on_batch_done(1, false);
        assert_eq!(p.next_batch(), Some(3));
    }
}
