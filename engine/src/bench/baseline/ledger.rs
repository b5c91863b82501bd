//! The ledger baseline of `make bench`: a classic Kafka consumer. One consumer reads every
//! partition of the topic, each partition in a task of its own and one record at a time;
//! each transfer is settled in a database transaction of its own with the classic
//! statement sequence, and its offset is committed after it (asynchronously, so that the
//! partitions stay parallel, as with one consumer per partition). The rules and statements
//! are tally's own (`tally_actors::ledger::plan`, `tally_actors::store`), apart from the
//! balance update of one account, so the two compare like for like. It runs on a thread
//! of its own with a single-threaded runtime, as a stage of the daemon runs on its actor
//! system's one thread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context;
use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use tally_actors::ledger::plan::{admits, decide, Effects};
use tally_actors::ledger::{write_outcomes_and_events, LedgerTopics, SettleOutcome, SettleRequest};
use tally_actors::store::accounts::{self, PostingColumns};
use tally_actors::store::invariants::LedgerCheck;
use tally_actors::store::{build_pool, known, PgPool, PoolSettings};
use tally_schema::events::TransferAnalyzed;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::bench::sql;

/// Where the classic consumer reads and writes.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The database URL.
    pub url: String,
    pub bootstrap: String,
    pub topic: String,
    pub partitions: i32,
    pub group: String,
    /// Connections of its pool: at most this many settlements at once.
    pub connections: usize,
    pub topics: LedgerTopics,
    pub statement_timeout: Duration,
    pub connect_timeout: Duration,
}

/// What the consumer did so far.
#[derive(Debug, Default)]
struct Counts {
    settled: AtomicU64,
    rejected: AtomicU64,
    duplicates: AtomicU64,
    /// Records that did not decode: skipped (the daemon would dead-letter them).
    undecodable: AtomicU64,
    /// Receive to commit of every record, ms.
    latencies_ms: Mutex<Vec<f64>>,
}

/// A running classic consumer; [`ClassicConsumer::stop`] ends it.
pub struct ClassicConsumer {
    stop: watch::Sender<bool>,
    thread: std::thread::JoinHandle<anyhow::Result<LedgerCheck>>,
    counts: Arc<Counts>,
}

impl ClassicConsumer {
    /// Assigns every partition of the topic from the group's committed offsets (the
    /// beginning when none) and starts reading, on a thread of its own with a
    /// single-threaded runtime, as a daemon's stage runs on its actor system's thread.
    ///
    /// # Errors
    /// When the thread, the pool or the consumer cannot be created.
    pub fn start(settings: &Settings) -> anyhow::Result<Self> {
        let counts = Arc::new(Counts::default());
        let (stop, stopped) = watch::channel(false);
        let (ready, started) = std::sync::mpsc::channel();
        let (settings, shared) = (settings.clone(), Arc::clone(&counts));
        let thread = std::thread::Builder::new()
            .name("bench-baseline".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                runtime.block_on(serve(settings, shared, stopped, ready))
            })
            .context("cannot start the baseline's thread")?;
        match started.recv() {
            Ok(Ok(())) => Ok(Self { stop, thread, counts }),
            Ok(Err(e)) => Err(e),
            Err(_) => match thread.join() {
                Ok(Err(e)) => Err(e),
                _ => anyhow::bail!("the baseline's thread ended at start"),
            },
        }
    }

    /// Records handled so far (settled, rejected, duplicate, or undecodable or refused).
    #[must_use]
    pub fn done(&self) -> u64 {
        self.outcomes().iter().sum()
    }

    /// Settled, rejected, duplicate, and undecodable or refused records so far.
    #[must_use]
    pub fn outcomes(&self) -> [u64; 4] {
        let c = &self.counts;
        [&c.settled, &c.rejected, &c.duplicates, &c.undecodable].map(|n| n.load(Ordering::Relaxed))
    }

    /// Quantile `q` of the receive-to-commit time of each record, ms.
    #[must_use]
    pub fn latency_ms(&self, q: f64) -> Option<f64> {
        let mut all = self.counts.latencies_ms.lock().unwrap_or_else(PoisonError::into_inner).clone();
        all.sort_by(f64::total_cmp);
        crate::bench::quantile(&all, q)
    }

    /// Stops reading (a record being settled finishes first) and checks the ledger
    /// invariants.
    ///
    /// # Errors
    /// When the database cannot be read, or the consumer's thread panicked.
    pub fn stop(self) -> anyhow::Result<LedgerCheck> {
        let _ = self.stop.send(true);
        self.thread.join().map_err(|_| anyhow::anyhow!("the baseline's thread panicked"))?
    }
}

/// The consumer's life on its thread: starts reading (`ready` says whether it could),
/// reads until `stopped`, then checks the ledger.
async fn serve(
    settings: Settings,
    counts: Arc<Counts>,
    mut stopped: watch::Receiver<bool>,
    ready: std::sync::mpsc::Sender<anyhow::Result<()>>,
) -> anyhow::Result<LedgerCheck> {
    let started = read(&settings, &counts, &stopped);
    let (pool, tasks) = match started {
        Ok(running) => {
            let _ = ready.send(Ok(()));
            running
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            anyhow::bail!("the baseline did not start");
        }
    };
    let _ = stopped.changed().await;
    for task in tasks {
        let _ = task.await;
    }
    let mut conn = pool.get().await.context("cannot reach the database")?;
    Ok(tally_actors::store::invariants::check_ledger(&mut conn).await?)
}

/// Creates the pool and the consumer and starts a reader per partition; returns the pool
/// and the readers' tasks.
fn read(
    settings: &Settings,
    counts: &Arc<Counts>,
    stopped: &watch::Receiver<bool>,
) -> anyhow::Result<(PgPool, Vec<JoinHandle<()>>)> {
    let pool = build_pool(&PoolSettings {
        url: settings.url.clone(),
        max_size: settings.connections,
        statement_timeout: settings.statement_timeout,
        connect_timeout: settings.connect_timeout,
        application_name: "tally-bench-baseline".into(),
        outbox_notify_after_commit: false,
    })
    .context("cannot build the baseline's pool")?;
    let consumer: Arc<StreamConsumer> = Arc::new(
        ClientConfig::new()
            .set("bootstrap.servers", &settings.bootstrap)
            .set("group.id", &settings.group)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .create()
            .context("cannot create the baseline's consumer")?,
    );
    let mut assignment = TopicPartitionList::new();
    for p in 0..settings.partitions {
        assignment.add_partition_offset(&settings.topic, p, Offset::Stored)?;
    }
    consumer.assign(&assignment)?;
    let mut tasks = Vec::new();
    for partition in 0..settings.partitions {
        let queue =
            consumer.split_partition_queue(&settings.topic, partition).context("cannot read a partition on its own")?;
        let part = Partition {
            consumer: Arc::clone(&consumer),
            topic: settings.topic.clone(),
            partition,
            pool: pool.clone(),
            topics: settings.topics.clone(),
            counts: Arc::clone(counts),
        };
        let mut stopped = stopped.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    m = queue.recv() => m,
                    _ = stopped.changed() => return,
                };
                match message {
                    Ok(m) => part.handle(m.offset(), m.payload().unwrap_or_default()).await,
                    Err(e) => tracing::warn!(error = %e, "Baseline consumer error."),
                }
            }
        }));
    }
    // The main queue serves the consumer's events; no record arrives there.
    let mut stopped = stopped.clone();
    tasks.push(tokio::spawn(async move {
        loop {
            tokio::select! {
                m = consumer.recv() => if let Err(e) = m {
                    tracing::warn!(error = %e, "Baseline consumer error.");
                },
                _ = stopped.changed() => return,
            }
        }
    }));
    Ok((pool, tasks))
}

/// One partition's reader.
struct Partition {
    consumer: Arc<StreamConsumer>,
    topic: String,
    partition: i32,
    pool: PgPool,
    topics: LedgerTopics,
    counts: Arc<Counts>,
}

impl Partition {
    /// Settles the record at `offset` (retrying until the database answers), then
    /// commits it.
    async fn handle(&self, offset: i64, payload: &[u8]) {
        let received = Instant::now();
        let counter = match serde_json::from_slice::<TransferAnalyzed>(payload) {
            Err(_) => &self.counts.undecodable,
            Ok(transfer) => {
                let request = SettleRequest { transfer, traceparent: None };
                let outcome = loop {
                    match self.settle(&request).await {
                        Ok(outcome) => break outcome,
                        Err(e) => {
                            tracing::warn!(error = %e, "Baseline settlement failed; retrying.");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                };
                match outcome {
                    SettleOutcome::Settled => &self.counts.settled,
                    SettleOutcome::Rejected(_) => &self.counts.rejected,
                    SettleOutcome::Duplicate => &self.counts.duplicates,
                    // What the system of record does not hold: poison, as undecodable is.
                    SettleOutcome::Refused(_) => &self.counts.undecodable,
                }
            }
        };
        let mut at = TopicPartitionList::new();
        let committed =
            at.add_partition_offset(&self.topic, self.partition, Offset::Offset(offset + 1)).map_err(|e| e.to_string());
        if let Err(e) = committed.and_then(|()| self.consumer.commit(&at, CommitMode::Async).map_err(|e| e.to_string()))
        {
            tracing::debug!(error = %e, "Baseline commit failed.");
        }
        self.counts
            .latencies_ms
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(received.elapsed().as_secs_f64() * 1e3);
        counter.fetch_add(1, Ordering::Relaxed);
    }

    async fn settle(&self, request: &SettleRequest) -> anyhow::Result<SettleOutcome> {
        let mut conn = self.pool.get().await.context("cannot reach the database")?;
        Ok(settle_one(&mut conn, &self.topics, request).await?)
    }
}

/// The classic statement sequence for one transfer, in a transaction of its own.
///
/// # Errors
/// Any database error; the transaction is rolled back.
async fn settle_one(
    conn: &mut AsyncPgConnection,
    topics: &LedgerTopics,
    req: &SettleRequest,
) -> Result<SettleOutcome, diesel::result::Error> {
    conn.transaction(|conn| {
        async move {
            let t = &req.transfer;
            let inserted = accounts::claim_inbox(conn, &[t.transfer_id]).await?;
            if inserted.is_empty() {
                return Ok(SettleOutcome::Duplicate);
            }
            let mut pair = [t.source_account.clone(), t.destination_account.clone()];
            pair.sort_unstable();
            let locked = accounts::lock(conn, &pair).await?;
            let known = known::load_known(conn, &[t.transfer_id]).await?;
            let to_db = |e: serde_json::Error| diesel::result::Error::SerializationError(Box::new(e));
            let mut effects = Effects::default();
            if let Err(refusal) = admits(known.get(&t.transfer_id), t) {
                effects.released.push(t.transfer_id);
                write_outcomes_and_events(conn, &effects).await?;
                return Ok(SettleOutcome::Refused(refusal));
            }
            let outcome = match decide(&locked, t, topics.max_balance_cents) {
                Err(reason) => {
                    effects.reject(topics, req, reason).map_err(to_db)?;
                    SettleOutcome::Rejected(reason)
                }
                Ok(_) => {
                    for (account, kind, delta) in
                        [(&t.source_account, "D", -t.amount_cents), (&t.destination_account, "C", t.amount_cents)]
                    {
                        add_to_balance(conn, account, delta).await?;
                        let one = PostingColumns {
                            transfer_id: vec![t.transfer_id],
                            account_id: vec![account.clone()],
                            kind: vec![kind.into()],
                            amount_cents: vec![t.amount_cents],
                        };
                        accounts::insert_postings(conn, &one).await?;
                    }
                    effects.settle(topics, req).map_err(to_db)?;
                    SettleOutcome::Settled
                }
            };
            // The postings and balances were written one by one above, as the classic consumer does.
            write_outcomes_and_events(conn, &effects).await?;
            Ok(outcome)
        }
        .scope_boxed()
    })
    .await
}

/// Adds `delta` to one account's balance.
async fn add_to_balance(conn: &mut AsyncPgConnection, id: &str, delta: i64) -> Result<(), diesel::result::Error> {
    use diesel::sql_types::{BigInt, Text};
    diesel::sql_query(sql::ADD_TO_BALANCE).bind::<BigInt, _>(delta).bind::<Text, _>(id).execute(conn).await?;
    Ok(())
}
