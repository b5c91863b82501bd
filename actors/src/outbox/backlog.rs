//! What the admin API and the gauges read of the outbox, and the one thing an operator
//! does to it: the backlog per topic, the parked rows, and trying parked rows again now.

use uuid::Uuid;

use super::listen::CHANNEL;
use super::OutboxError;
use crate::metrics::Metrics;
use crate::store::outbox::{self, PendingStats};
use crate::store::outbox_parked::{self, ParkedRow};
use crate::store::PgPool;

/// Unpublished rows per topic with the age of the oldest, parked and held rows counted
/// apart (for `/admin/outbox` and gauges).
///
/// # Errors
/// When the database fails.
pub async fn pending_by_topic(pool: &PgPool) -> Result<Vec<PendingStats>, OutboxError> {
    let mut conn = pool.get().await.map_err(|e| OutboxError::Pool(e.to_string()))?;
    Ok(outbox::pending_by_topic(&mut conn).await?)
}

/// Refreshes the outbox gauges from the database.
///
/// # Errors
/// When the database fails.
pub async fn refresh_gauges(pool: &PgPool, metrics: &Metrics) -> Result<Vec<PendingStats>, OutboxError> {
    let stats = pending_by_topic(pool).await?;
    metrics.outbox_pending.set(stats.iter().map(|s| s.pending).sum());
    metrics.outbox_parked_rows.set(stats.iter().map(|s| s.parked).sum());
    metrics.outbox_held_rows.set(stats.iter().map(|s| s.held).sum());
    metrics.outbox_oldest_pending_age_seconds.set(stats.iter().map(|s| s.oldest_age_seconds).fold(0.0, f64::max));
    metrics.outbox_pending_by_topic.reset();
    for s in &stats {
        metrics.outbox_pending_by_topic.with_label_values(&[&s.topic]).set(s.pending as f64);
    }
    Ok(stats)
}

/// The first `limit` parked rows, oldest refusal first.
///
/// # Errors
/// When the database fails.
pub async fn parked_rows(pool: &PgPool, limit: i64) -> Result<Vec<ParkedRow>, OutboxError> {
    let mut conn = pool.get().await.map_err(|e| OutboxError::Pool(e.to_string()))?;
    Ok(outbox_parked::parked_rows(&mut conn, limit).await?)
}

/// Makes parked row `id` (every parked row when `None`) due at once and wakes the
/// publishers of every daemon on the database; returns the ids made due (none when `id`
/// is not a parked row).
///
/// # Errors
/// When the database fails.
pub async fn retry_parked(pool: &PgPool, id: Option<Uuid>) -> Result<Vec<Uuid>, OutboxError> {
    let mut conn = pool.get().await.map_err(|e| OutboxError::Pool(e.to_string()))?;
    Ok(outbox_parked::retry_now(&mut conn, id, CHANNEL).await?)
}
