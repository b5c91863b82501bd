//! The notifier's database calls as group commits: the delivery checks of records handled
//! at once share one query, and their delivery records one insert. Each has one writer, so
//! the two together leave one connection of the notifications' default pool of 3 to the
//! dead letters.

use std::time::Duration;

use diesel_async::AsyncPgConnection;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use uuid::Uuid;

use futures_util::future::try_join;

use crate::metrics::Metrics;
use crate::projection::{refused, StatusChange};
use crate::store::group_commit::{Batch, GroupCommit, GroupCommitSettings, Refusal};
use crate::store::notifications::{self, Delivery};
use crate::store::outcomes;
use crate::store::PgPool;
use crate::supervise::{ErrorClass, HandlerError};

/// How long a delivery record may wait for its writer: long enough that only a database
/// gone for good refuses it.
pub const RECORD_WAIT: Duration = Duration::from_secs(3_600);

/// Both group commits of a notifier.
#[derive(Clone)]
pub(super) struct Writes {
    pub seen: GroupCommit<SeenBatch>,
    pub delivered: GroupCommit<DeliveredBatch>,
}

impl Writes {
    /// Starts both on the current actix system, over `pool`. A lookup waits at most
    /// `max_wait` to be taken; a delivery record is never shed (it is written after the
    /// webhook got the event: refusing it would send the event again), only bounded by
    /// [`RECORD_WAIT`].
    pub fn start(pool: &PgPool, metrics: &Metrics, max_wait: Duration) -> Self {
        let lookups = GroupCommitSettings { max_batch: 256, writers: 1, max_wait };
        let records = GroupCommitSettings { max_wait: RECORD_WAIT, ..lookups };
        Self {
            seen: GroupCommit::start("notifications_seen", SeenBatch, pool.clone(), lookups, metrics),
            delivered: GroupCommit::start("notifications_delivered", DeliveredBatch, pool.clone(), records, metrics),
        }
    }
}

/// An event to deliver: whether it was delivered already, and whether the system of record
/// holds the outcome it announces.
pub(super) struct SeenBatch;

/// What [`SeenBatch`] is asked about.
#[derive(Debug, Clone)]
pub(super) struct Check {
    pub event_id: Uuid,
    pub change: StatusChange,
}

/// What [`SeenBatch`] answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Seen {
    /// Delivered before: nothing to send.
    Delivered,
    /// Not delivered, and the outcome it announces is the recorded one.
    Due,
    /// The system of record does not hold that outcome: poison, for this reason.
    Refused(String),
}

/// Records a delivery that got through.
pub(super) struct DeliveredBatch;

fn database_error(e: &diesel::result::Error) -> HandlerError {
    HandlerError::classified("database error", e)
}

impl Batch for SeenBatch {
    type Item = Check;
    type Outcome = Seen;
    type Error = HandlerError;

    fn write<'a>(
        &'a self,
        conn: &'a mut AsyncPgConnection,
        items: &'a [Check],
    ) -> BoxFuture<'a, Result<Vec<Seen>, HandlerError>> {
        async move {
            let transfers: Vec<Uuid> = items.iter().map(|c| c.change.transfer_id).collect();
            let events: Vec<Uuid> = items.iter().map(|c| c.event_id).collect();
            let recorded = outcomes::recorded(conn, &transfers);
            let (recorded, delivered) =
                try_join(recorded, notifications::delivered(conn, &events)).await.map_err(|e| database_error(&e))?;
            Ok(items
                .iter()
                .zip(delivered)
                .map(|(c, delivered)| {
                    let held = recorded.get(&c.change.transfer_id).cloned().unwrap_or_default();
                    // The system of record first: a forged outcome under the (derivable)
                    // id of an event delivered already is poison, not a redelivery.
                    match held.confirms(c.change.status, c.change.reason.as_deref()) {
                        Err(reason) => Seen::Refused(reason),
                        Ok(()) if delivered => Seen::Delivered,
                        Ok(()) => Seen::Due,
                    }
                })
                .collect())
        }
        .boxed()
    }

    fn refused(&self, why: Refusal<'_>) -> HandlerError {
        refused("notifier", why)
    }

    fn split(&self, error: &HandlerError) -> bool {
        error.class == ErrorClass::Poison
    }
}

impl Batch for DeliveredBatch {
    type Item = Delivery;
    type Outcome = ();
    type Error = HandlerError;

    fn write<'a>(
        &'a self,
        conn: &'a mut AsyncPgConnection,
        items: &'a [Delivery],
    ) -> BoxFuture<'a, Result<Vec<()>, HandlerError>> {
        async move {
            notifications::remember(conn, items).await.map_err(|e| database_error(&e))?;
            Ok(vec![(); items.len()])
        }
        .boxed()
    }

    fn refused(&self, why: Refusal<'_>) -> HandlerError {
        refused("notifier", why)
    }

    fn split(&self, error: &HandlerError) -> bool {
        error.class == ErrorClass::Poison
    }
}
