//! What the database did in each soak window: WAL written and checkpoints, from
//! PostgreSQL's own statistics.
//!
//! After a checkpoint, the first change to a page writes the whole page to the WAL. The
//! ledger changes pages at random (accounts, postings by account, outbox ids), so a server
//! that checkpoints for WAL volume (`max_wal_size` reached, "requested" in its statistics)
//! every few tens of seconds writes mostly page images and runs slower in the windows that
//! holds. These figures say which windows that was, apart from the daemon's own cost.

use serde::Serialize;

use crate::bench::sql;

/// The server's counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Mark {
    /// WAL position, bytes.
    wal_bytes: f64,
    timed: i64,
    requested: i64,
}

/// What the server did between two marks.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Load {
    pub(super) wal_mib: f64,
    /// Checkpoints counted in the window, whatever their cause.
    pub(super) checkpoints: i64,
    /// Of those, the ones requested because the WAL reached `max_wal_size` (or by hand).
    pub(super) checkpoints_requested: i64,
}

impl Mark {
    pub(super) fn since(self, earlier: Mark) -> Load {
        let timed = self.timed - earlier.timed;
        let requested = self.requested - earlier.requested;
        Load {
            wal_mib: (self.wal_bytes - earlier.wal_bytes) / (1024.0 * 1024.0),
            checkpoints: timed + requested,
            checkpoints_requested: requested,
        }
    }
}

/// Reads [`Mark`]s; the checkpoint counters moved to `pg_stat_checkpointer` in PostgreSQL 17.
pub(super) struct Probe {
    sql: &'static str,
}

impl Probe {
    /// # Errors
    /// When the server's version cannot be read.
    pub(super) async fn new(db: &tokio_postgres::Client) -> anyhow::Result<Self> {
        let version: i32 = db.query_one(sql::SERVER_VERSION_NUM, &[]).await?.get(0);
        let sql = if version >= 170_000 { sql::WAL_AND_CHECKPOINTS } else { sql::WAL_AND_CHECKPOINTS_BEFORE_17 };
        Ok(Self { sql })
    }

    /// # Errors
    /// When the statistics cannot be read.
    pub(super) async fn mark(&self, db: &tokio_postgres::Client) -> anyhow::Result<Mark> {
        let row = db.query_one(self.sql, &[]).await?;
        Ok(Mark { wal_bytes: row.get(0), timed: row.get(1), requested: row.get(2) })
    }
}

/// The mean ratio to the first window of the windows with a requested checkpoint and of
/// those without, for the summary line; `None` for a group with no window.
pub(super) fn ratio_by_checkpoints<'a>(
    windows: impl Iterator<Item = (f64, Option<&'a Load>)>,
) -> (Option<f64>, Option<f64>) {
    let (mut with, mut without) = ((0.0, 0u32), (0.0, 0u32));
    for (ratio, load) in windows {
        match load {
            Some(l) if l.checkpoints_requested > 0 => with = (with.0 + ratio, with.1 + 1),
            Some(_) => without = (without.0 + ratio, without.1 + 1),
            None => {}
        }
    }
    let mean = |(sum, n): (f64, u32)| (n > 0).then(|| sum / f64::from(n));
    (mean(with), mean(without))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_counts_what_happened_between_its_marks() {
        let start = Mark { wal_bytes: 1024.0 * 1024.0, timed: 3, requested: 10 };
        let end = Mark { wal_bytes: 513.0 * 1024.0 * 1024.0, timed: 4, requested: 12 };
        assert_eq!(end.since(start), Load { wal_mib: 512.0, checkpoints: 3, checkpoints_requested: 2 });
    }

    #[test]
    fn windows_are_grouped_by_a_requested_checkpoint() {
        let ckpt = Load { wal_mib: 500.0, checkpoints: 1, checkpoints_requested: 1 };
        let timed = Load { wal_mib: 10.0, checkpoints: 1, checkpoints_requested: 0 };
        let quiet = Load { wal_mib: 10.0, checkpoints: 0, checkpoints_requested: 0 };
        let rows = [(1.0, Some(&quiet)), (0.7, Some(&ckpt)), (0.9, Some(&ckpt)), (0.8, Some(&timed)), (0.1, None)];
        let (with, without) = ratio_by_checkpoints(rows.into_iter());
        assert!((with.unwrap() - 0.8).abs() < 1e-9, "{with:?}");
        assert!((without.unwrap() - 0.9).abs() < 1e-9, "{without:?}");
        assert_eq!(ratio_by_checkpoints(std::iter::empty()), (None, None));
    }
}
