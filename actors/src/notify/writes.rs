//! The notifier's database calls as group commits: the delivery checks of records handled
//! at once share one query, and their delivery records one insert. Each has one writer, so
//! the two together leave one connection of the notifications' default pool of 3 to the
//! dead letters.

use std::time::Duration;

use diesel_async::AsyncPgConnection;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use uuid::Uuid;

use crate::metrics::Metrics;
use crate::projection::refused;
use crate::store::group_commit::{Batch, GroupCommit, GroupCommitSettings, Refusal};
use crate::store::notifications::{self, Delivery};
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

/// Whether an event was delivered already.
pub(super) struct SeenBatch;

/// Records a delivery that got through.
pub(super) struct DeliveredBatch;

fn database_error(e: &diesel::result::Error) -> HandlerError {
    HandlerError::classified("database error", e)
}

impl Batch for SeenBatch {
    type Item = Uuid;
    type Outcome = bool;
    type Error = HandlerError;

    fn write<'a>(
        &'a self,
        conn: &'a mut AsyncPgConnection,
        items: &'a [Uuid],
    ) -> BoxFuture<'a, Result<Vec<bool>, HandlerError>> {
        async move { notifications::delivered(conn, items).await.map_err(|e| database_error(&e)) }.boxed()
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
