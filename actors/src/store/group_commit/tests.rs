//! The group commit's races and its split, without a database: the callers' side through
//! [`GroupCommit::submit`] against a queue the test reads as a writer would, and the
//! writer's side through [`claim`] and [`write`] over a scripted [`Transactions`].

use std::sync::Mutex as StdMutex;
use std::time::Duration;

use super::*;

/// Items are numbers; a batch holding [`POISON`] fails with a splittable error.
struct Numbers;

const POISON: u32 = 5;

impl Batch for Numbers {
    type Item = u32;
    type Outcome = u32;
    type Error = String;

    fn write<'a>(&'a self, _: &'a mut AsyncPgConnection, _: &'a [u32]) -> BoxFuture<'a, Result<Vec<u32>, String>> {
        async { Err("no database here".to_owned()) }.boxed()
    }

    fn refused(&self, why: Refusal<'_>) -> String {
        format!("refused: {}", why.label())
    }

    fn split(&self, error: &String) -> bool {
        error == "bad item"
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime")
}

/// A group commit whose queue the test reads: nothing writes unless the test does.
fn group_commit(max_wait: Duration) -> (GroupCommit<Numbers>, mpsc::Receiver<Pending<Numbers>>) {
    let (queue, rx) = mpsc::channel(8);
    let counter = Metrics::new().expect("metrics").group_commit_refused_total.clone();
    let refused = Refused { name: "test".into(), counter };
    (GroupCommit { queue, batch: Arc::new(Numbers), max_wait, refused }, rx)
}

fn refused_overloaded(commit: &GroupCommit<Numbers>) -> u64 {
    commit.refused.counter.with_label_values(&["test", "overloaded"]).get()
}

#[test]
fn a_caller_whose_item_was_taken_waits_for_its_batch_past_its_deadline() {
    let (commit, mut rx) = group_commit(Duration::from_millis(50));
    let answer = runtime().block_on(async {
        let caller = commit.submit(7);
        let writer = async {
            let pending = rx.recv().await.expect("the item is queued");
            let (items, mut replies) = claim(vec![pending]);
            assert_eq!(items, [7], "taken before the caller's deadline");
            // The transaction outlasts the caller's deadline.
            tokio::time::sleep(Duration::from_millis(150)).await;
            let _ = replies.remove(0).send(Ok(70));
        };
        futures_util::future::join(caller, writer).await.0
    });
    assert_eq!(answer, Ok(70), "the outcome of the write, not a refusal");
    assert_eq!(refused_overloaded(&commit), 0);
}

#[test]
fn an_item_not_taken_in_time_is_refused_and_never_written() {
    let (commit, mut rx) = group_commit(Duration::from_millis(50));
    let runtime = runtime();
    let answer = runtime.block_on(commit.submit(7));
    assert_eq!(answer, Err("refused: overloaded".to_owned()));
    assert_eq!(refused_overloaded(&commit), 1);
    // The writer comes to it late: it is skipped, not written.
    let pending = runtime.block_on(rx.recv()).expect("still in the queue");
    let (items, replies) = claim(vec![pending]);
    assert!(items.is_empty() && replies.is_empty());
}

/// Item `item`, queued now, in state `state`.
fn pending(item: u32, state: Arc<AtomicU8>, reply: Reply<Numbers>) -> Pending<Numbers> {
    Pending { item, state, reply, queued: tokio::time::Instant::now() }
}

#[test]
fn an_item_whose_caller_is_gone_is_not_written() {
    let (reply, outcome) = oneshot::channel();
    drop(outcome);
    let gone = pending(1, Arc::new(AtomicU8::new(QUEUED)), reply);
    let (reply, _waiting) = oneshot::channel();
    let waiting = pending(2, Arc::new(AtomicU8::new(QUEUED)), reply);
    let (items, replies) = claim(vec![gone, waiting]);
    assert_eq!(items, [2]);
    assert_eq!(replies.len(), 1);
}

#[test]
fn take_and_abandon_settle_each_item_once() {
    for _ in 0..2_000 {
        let state = Arc::new(AtomicU8::new(QUEUED));
        let (reply, _outcome) = oneshot::channel();
        let queued = pending(1, Arc::clone(&state), reply);
        let writer = std::thread::spawn(move || claim(vec![queued]).0.len() == 1);
        let abandoned = abandon(&state);
        let taken = writer.join().expect("the writer thread");
        assert!(taken != abandoned, "taken {taken}, abandoned {abandoned}: exactly one must win");
        assert_eq!(state.load(Ordering::Acquire), if taken { TAKEN } else { ABANDONED });
    }
}

/// A scripted database: records each attempt's items and answers as `answer` says.
struct Script {
    answer: fn(&[u32]) -> Attempt<Numbers>,
    attempts: StdMutex<Vec<Vec<u32>>>,
    committed: StdMutex<Vec<usize>>,
}

impl Script {
    fn new(answer: fn(&[u32]) -> Attempt<Numbers>) -> Self {
        Self { answer, attempts: StdMutex::default(), committed: StdMutex::default() }
    }

    /// Writes `items` through [`write`]; each caller's answer, in item order.
    fn run(&self, items: Vec<u32>) -> Vec<Result<u32, String>> {
        let (replies, outcomes): (Vec<_>, Vec<_>) = items.iter().map(|_| oneshot::channel()).unzip();
        runtime().block_on(async {
            write(self, items, replies).await;
            let mut answers = Vec::new();
            for outcome in outcomes {
                answers.push(outcome.await.unwrap_or_else(|_| Err("never answered".into())));
            }
            answers
        })
    }

    fn attempts(&self) -> Vec<Vec<u32>> {
        self.attempts.lock().expect("attempts").clone()
    }
}

impl Transactions<Numbers> for Script {
    fn attempt<'s>(&'s self, items: &'s [u32]) -> BoxFuture<'s, Attempt<Numbers>> {
        self.attempts.lock().expect("attempts").push(items.to_vec());
        let answer = (self.answer)(items);
        async move { answer }.boxed()
    }

    fn batch(&self) -> &Numbers {
        &Numbers
    }

    fn name(&self) -> &str {
        "test"
    }

    fn committed(&self, items: usize) {
        self.committed.lock().expect("committed").push(items);
    }

    fn refuse(&self, reply: Reply<Numbers>, why: Refusal<'_>) {
        let _ = reply.send(Err(Numbers.refused(why)));
    }
}

/// Fails a batch holding the poison with a splittable error; else each item times 10.
fn poisoned(items: &[u32]) -> Attempt<Numbers> {
    if items.contains(&POISON) {
        Attempt::Done(Err("bad item".into()))
    } else {
        Attempt::Done(Ok(items.iter().map(|i| i * 10).collect()))
    }
}

#[test]
fn a_batch_with_a_bad_item_is_halved_down_to_that_item() {
    let script = Script::new(poisoned);
    let answers = script.run((1..=8).collect());
    assert_eq!(
        script.attempts(),
        [vec![1, 2, 3, 4, 5, 6, 7, 8], vec![1, 2, 3, 4], vec![5, 6, 7, 8], vec![5, 6], vec![5], vec![6], vec![7, 8]]
    );
    let expected: Vec<Result<u32, String>> =
        (1..=8).map(|i| if i == POISON { Err("bad item".into()) } else { Ok(i * 10) }).collect();
    assert_eq!(answers, expected);
    assert_eq!(*script.committed.lock().expect("committed"), [4, 1, 2], "each half commits on its own");
}

#[test]
fn an_error_of_the_whole_batch_fails_it_once() {
    let script = Script::new(|_| Attempt::Done(Err("database down".into())));
    let answers = script.run(vec![1, 2, 3]);
    assert_eq!(script.attempts(), [vec![1, 2, 3]], "not split: each caller gets the error as it would alone");
    assert_eq!(answers, vec![Err("database down".to_owned()); 3]);
}

#[test]
fn a_write_that_panics_or_miscounts_is_refused_as_broken() {
    for answer in [(|_| Attempt::Panicked) as fn(&[u32]) -> Attempt<Numbers>, |_| Attempt::Done(Ok(vec![1]))] {
        let script = Script::new(answer);
        let answers = script.run(vec![1, 2]);
        assert_eq!(script.attempts().len(), 1);
        assert_eq!(answers, vec![Err("refused: broken".to_owned()); 2]);
        assert!(script.committed.lock().expect("committed").is_empty());
    }
}

#[test]
fn the_wait_for_company_leaves_an_item_half_its_max_wait() {
    let settings = |max_wait| GroupCommitSettings { max_batch: 8, writers: 2, max_wait };
    assert_eq!(settings(Duration::from_secs(5)).spare(), GroupCommitSettings::SPARE_AFTER);
    assert_eq!(settings(Duration::from_millis(8)).spare(), Duration::from_millis(4), "a short max_wait bounds it");
}
