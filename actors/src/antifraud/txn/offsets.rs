//! The thread that adds the consumer offsets to a transaction. librdkafka (2.12; fixed
//! upstream after its 2.15 release) does not enforce the timeout of
//! `send_offsets_to_transaction` on the request to the group coordinator: when the broker
//! it cached as coordinator has left the cluster's metadata (a broker restarted or taken
//! down for a moment), the call waits for that broker's handle to change state, which it
//! no longer does, and blocks until some other broker's state changes, if one ever does;
//! every other transaction call of the producer is refused as conflicting meanwhile.
//!
//! So the call runs on a thread of its own, and the loop waits for its answer for a
//! bounded time. One long-lived thread serves every call, of every producer the stage
//! renews (a channel in, answers out). A call that does not answer in time leaves its
//! thread busy with it and its producer wedged; when the loop replaces that producer it
//! gives the call up ([`OffsetsCalls::give_up`]): the thread is left to it, holding the
//! old producer until the call returns, and the next call starts a new thread.
//!
//! At most one call (so one producer, and one thread besides the serving one) is given up
//! at a time. A second producer whose call does not answer while the first given up is
//! still stuck is not given up ([`OffsetsCalls::may_give_up`] is false): it stays the
//! stage's (wedged) producer and the stage waits, holding its partitions and trying
//! again after every backoff, until the first call returns, or its own does.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use prometheus::IntGauge;
use rdkafka::error::{KafkaError, KafkaResult};

use super::PIPELINE;

/// One call: `send_offsets_to_transaction` on a producer it holds.
pub(in crate::antifraud) type Call = Box<dyn FnOnce() -> KafkaResult<()> + Send>;

/// A call's state, shared between its thread and the loop.
const WAITING: u8 = 0;
const RETURNED: u8 = 1;
const ABANDONED: u8 = 2;

struct Request {
    call: Call,
    state: Arc<AtomicU8>,
}

/// The serving thread, as the loop holds it.
struct Worker {
    requests: mpsc::Sender<Request>,
    answers: mpsc::Receiver<KafkaResult<()>>,
    /// The call that did not answer in time, while it has not been collected.
    outstanding: Option<Arc<AtomicU8>>,
}

/// Why [`OffsetsCalls::call`] has no answer.
#[derive(Debug, PartialEq, Eq)]
pub(in crate::antifraud) enum NoAnswer {
    /// The call did not answer within the wait: the thread is busy with it.
    TimedOut,
    /// The thread is still busy with an earlier call that did not answer: nothing was
    /// sent.
    Busy,
}

/// What [`OffsetsCalls::give_up`] did.
#[derive(Debug, PartialEq, Eq)]
pub(in crate::antifraud) enum GiveUp {
    /// No call was outstanding, or it returned meanwhile: the thread serves on.
    Nothing,
    /// The call is given up; its thread is left to it.
    Abandoned,
    /// Another call given up earlier is still stuck: this one is kept.
    Refused,
}

/// The loop's side of the offsets thread(s).
pub(in crate::antifraud) struct OffsetsCalls {
    current: Option<Worker>,
    /// The state of the call given up last, until it returns.
    abandoned: Option<Arc<AtomicU8>>,
    /// Calls given up whose thread has not returned yet (`tally_kafka_producers_abandoned`).
    gauge: IntGauge,
    /// Threads started so far.
    started: usize,
}

impl OffsetsCalls {
    pub(in crate::antifraud) fn new(gauge: IntGauge) -> Self {
        Self { current: None, abandoned: None, gauge, started: 0 }
    }

    /// Runs `call` on the serving thread (started on first use, or after its predecessor
    /// was given up) and waits at most `wait` for its answer.
    ///
    /// # Errors
    /// [`NoAnswer`]: the call did not answer in time, or an earlier one still keeps the
    /// thread busy.
    pub(in crate::antifraud) fn call(&mut self, call: Call, wait: Duration) -> Result<KafkaResult<()>, NoAnswer> {
        if let Some(worker) = &mut self.current {
            if let Some(state) = &worker.outstanding {
                if state.load(Ordering::Acquire) == WAITING {
                    return Err(NoAnswer::Busy);
                }
                // It returned after all: its answer is stale.
                let _ = worker.answers.recv();
                worker.outstanding = None;
            }
        }
        let worker = match self.current.take() {
            Some(worker) => worker,
            None => match self.spawn() {
                Ok(worker) => worker,
                Err(e) => {
                    // Nothing was sent: the transaction is aborted and produced again.
                    tracing::warn!(pipeline = PIPELINE, error = %e, "Cannot start the thread that adds offsets to transactions.");
                    return Ok(Err(KafkaError::Canceled));
                }
            },
        };
        let state = Arc::new(AtomicU8::new(WAITING));
        if worker.requests.send(Request { call, state: Arc::clone(&state) }).is_err() {
            // The thread is gone (it panicked): the next call starts another.
            return Ok(Err(KafkaError::Canceled));
        }
        let answer = match worker.answers.recv_timeout(wait) {
            Ok(answer) => answer,
            Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(Err(KafkaError::Canceled)),
            Err(mpsc::RecvTimeoutError::Timeout) if state.load(Ordering::Acquire) == RETURNED => {
                // It returned just now: its answer is on its way.
                worker.answers.recv().unwrap_or(Err(KafkaError::Canceled))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                self.current = Some(Worker { outstanding: Some(state), ..worker });
                return Err(NoAnswer::TimedOut);
            }
        };
        self.current = Some(worker);
        Ok(answer)
    }

    /// Whether the outstanding call, if any, may be given up now: no call given up
    /// earlier is still stuck.
    pub(in crate::antifraud) fn may_give_up(&self) -> bool {
        !self.outstanding() || !self.abandoned_stuck()
    }

    /// Gives up the outstanding call (its producer is being replaced), unless a call
    /// given up earlier is still stuck.
    pub(in crate::antifraud) fn give_up(&mut self) -> GiveUp {
        if !self.outstanding() {
            return GiveUp::Nothing;
        }
        if self.abandoned_stuck() {
            return GiveUp::Refused;
        }
        let Some(worker) = self.current.take() else { return GiveUp::Nothing };
        let Some(state) = worker.outstanding.clone() else { return GiveUp::Nothing };
        if state.compare_exchange(WAITING, ABANDONED, Ordering::AcqRel, Ordering::Acquire).is_err() {
            // It returned just now: the thread serves on once its answer is collected.
            self.current = Some(worker);
            return GiveUp::Nothing;
        }
        self.gauge.inc();
        self.abandoned = Some(state);
        // Dropping the channels lets the thread end once its call returns.
        drop(worker);
        GiveUp::Abandoned
    }

    /// Threads started so far: one, unless calls were given up.
    #[cfg(test)]
    fn started(&self) -> usize {
        self.started
    }

    fn outstanding(&self) -> bool {
        self.current.as_ref().and_then(|w| w.outstanding.as_ref()).is_some_and(|s| s.load(Ordering::Acquire) == WAITING)
    }

    fn abandoned_stuck(&self) -> bool {
        self.abandoned.as_ref().is_some_and(|s| s.load(Ordering::Acquire) == ABANDONED)
    }

    fn spawn(&mut self) -> std::io::Result<Worker> {
        let (requests, inbox) = mpsc::channel::<Request>();
        let (outbox, answers) = mpsc::channel();
        let gauge = self.gauge.clone();
        std::thread::Builder::new().name("tally-txn-offsets".into()).spawn(move || serve(&inbox, &outbox, &gauge))?;
        self.started += 1;
        Ok(Worker { requests, answers, outstanding: None })
    }
}

/// The thread: one call at a time, until the loop drops its side of the channels.
fn serve(inbox: &mpsc::Receiver<Request>, outbox: &mpsc::Sender<KafkaResult<()>>, gauge: &IntGauge) {
    while let Ok(Request { call, state }) = inbox.recv() {
        // The call owns its producer handle: it is released here, when the call returns.
        let answer = call();
        if state.swap(RETURNED, Ordering::AcqRel) == ABANDONED {
            gauge.dec();
            tracing::info!(pipeline = PIPELINE, "A wedged transactional producer's call returned; it is freed.");
            return;
        }
        if outbox.send(answer).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_millis(50);

    /// A call that blocks until its release is sent (or dropped).
    fn stuck() -> (Call, mpsc::Sender<()>) {
        let (release, released) = mpsc::channel::<()>();
        (
            Box::new(move || {
                let _ = released.recv();
                Ok(())
            }),
            release,
        )
    }

    fn quick() -> Call {
        Box::new(|| Ok(()))
    }

    fn wait_until(what: &str, done: impl Fn() -> bool) {
        let started = std::time::Instant::now();
        while !done() {
            assert!(started.elapsed() < Duration::from_secs(10), "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn one_thread_serves_every_call() {
        let mut calls = OffsetsCalls::new(IntGauge::new("g", "g").expect("gauge"));
        for _ in 0..100 {
            assert_eq!(calls.call(quick(), WAIT), Ok(Ok(())));
        }
        assert_eq!(calls.call(Box::new(|| Err(KafkaError::Canceled)), WAIT), Ok(Err(KafkaError::Canceled)));
        assert_eq!(calls.started(), 1);
        assert_eq!(calls.give_up(), GiveUp::Nothing, "nothing outstanding");
    }

    #[test]
    fn at_most_one_call_is_given_up_at_a_time() {
        let gauge = IntGauge::new("g", "g").expect("gauge");
        let mut calls = OffsetsCalls::new(gauge.clone());
        // The first producer's call never answers: it is given up, its thread left to it.
        let (first, release_first) = stuck();
        assert_eq!(calls.call(first, WAIT), Err(NoAnswer::TimedOut));
        assert_eq!(calls.call(quick(), WAIT), Err(NoAnswer::Busy), "the thread is busy with it");
        assert!(calls.may_give_up());
        assert_eq!(calls.give_up(), GiveUp::Abandoned);
        assert_eq!(gauge.get(), 1);
        // The second producer's call is served by a new thread, and never answers either.
        let (second, release_second) = stuck();
        assert_eq!(calls.call(second, WAIT), Err(NoAnswer::TimedOut));
        assert_eq!(calls.started(), 2);
        // It is not given up while the first is stuck: still one abandoned, two threads.
        assert!(!calls.may_give_up());
        assert_eq!(calls.give_up(), GiveUp::Refused);
        assert_eq!(calls.call(quick(), WAIT), Err(NoAnswer::Busy), "its producer stays wedged, nothing new is sent");
        assert_eq!((gauge.get(), calls.started()), (1, 2));
        // The first call returns: its thread ends, and the second may be given up.
        drop(release_first);
        wait_until("the first call's thread frees it", || gauge.get() == 0);
        assert!(calls.may_give_up());
        assert_eq!(calls.give_up(), GiveUp::Abandoned);
        assert_eq!(gauge.get(), 1);
        // A third producer's calls are answered by a third thread.
        assert_eq!(calls.call(quick(), WAIT), Ok(Ok(())));
        assert_eq!(calls.started(), 3);
        drop(release_second);
        wait_until("the second call's thread frees it", || gauge.get() == 0);
    }

    #[test]
    fn a_late_answer_keeps_the_thread() {
        let gauge = IntGauge::new("g", "g").expect("gauge");
        let mut calls = OffsetsCalls::new(gauge.clone());
        let (slow, release) = stuck();
        assert_eq!(calls.call(slow, WAIT), Err(NoAnswer::TimedOut));
        release.send(()).expect("release");
        wait_until("the slow call returns", || !calls.outstanding());
        // Returned before it was given up: nothing to give up, the thread serves on.
        assert_eq!(calls.give_up(), GiveUp::Nothing);
        assert_eq!(calls.call(quick(), WAIT), Ok(Ok(())));
        assert_eq!((gauge.get(), calls.started()), (0, 1));
    }
}
