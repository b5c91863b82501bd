//! Where the end-to-end time goes: per-hop latencies of the settled transfers of a bench
//! phase, from the times each stage writes in its tables. No extra instrumentation: the
//! same columns an operator's transfer lookup shows.
//!
//! | hop | from | to |
//! |---|---|---|
//! | intake -> publish | `transfers.created_at` | the `TransferRequested` row's `published_at` |
//! | publish -> decision | that | `antifraud_decisions.decided_at` |
//! | decision -> settlement | that | `processed_transfers.processed_at` |
//! | settlement -> publish | that | the `TransferSettled` row's `published_at` |
//! | publish -> final status | that | `transfers.updated_at` |
//!
//! What each time is: `transfers.created_at` is taken by intake inside its transaction;
//! `published_at` is set after the broker acknowledged the record (so a consumer may have
//! read it a little before); `decided_at` is when antifraud decided, before its Kafka
//! transaction commits; `processed_at` and the final `updated_at` are `now()` of the
//! writing transaction, i.e. its start. One clock (one host) in the bench; the hops add up
//! to the whole, and a hop can show a few ms below zero where a stage read a record before
//! the previous one marked it.

use serde::Serialize;

use super::quantile;

/// One hop's latencies over a phase, in ms.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Hop {
    pub name: &'static str,
    pub samples: usize,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// The hops, in pipeline order, with the SQL expression of each (NULL when a row is gone).
const HOPS: [(&str, &str); 5] = [
    ("intake -> publish", "rq.published_at - t.created_at"),
    ("publish -> decision", "d.decided_at - rq.published_at"),
    ("decision -> settlement", "p.processed_at - d.decided_at"),
    ("settlement -> publish", "st.published_at - p.processed_at"),
    ("publish -> final status", "t.updated_at - st.published_at"),
];

fn breakdown_sql() -> String {
    let columns: Vec<String> =
        HOPS.iter().map(|(_, expr)| format!("(EXTRACT(EPOCH FROM {expr}) * 1000)::float8")).collect();
    format!(
        "WITH o AS ( \
           SELECT (payload::jsonb ->> 'transferId')::uuid AS transfer_id, event_type, published_at \
           FROM outbox_events WHERE event_type IN ('TransferRequested', 'TransferSettled')) \
         SELECT {} FROM transfers t \
         JOIN antifraud_decisions d ON d.transfer_id = t.id \
         JOIN processed_transfers p ON p.transfer_id = t.id \
         LEFT JOIN o rq ON rq.transfer_id = t.id AND rq.event_type = 'TransferRequested' \
         LEFT JOIN o st ON st.transfer_id = t.id AND st.event_type = 'TransferSettled' \
         WHERE t.status = 'SETTLED'",
        columns.join(", ")
    )
}

/// The per-hop p50 and p99 of every settled transfer in the database.
///
/// # Errors
/// When the query fails.
pub async fn breakdown(db: &tokio_postgres::Client) -> anyhow::Result<Vec<Hop>> {
    let rows = db.query(&breakdown_sql(), &[]).await?;
    Ok(HOPS
        .iter()
        .enumerate()
        .map(|(i, (name, _))| {
            let mut ms: Vec<f64> = rows.iter().filter_map(|r| r.get::<_, Option<f64>>(i)).collect();
            ms.sort_by(f64::total_cmp);
            Hop { name, samples: ms.len(), p50_ms: quantile(&ms, 0.5), p99_ms: quantile(&ms, 0.99) }
        })
        .collect())
}

/// The breakdown as lines of a table, under a phase's row.
#[must_use]
pub fn lines(hops: &[Hop]) -> Vec<String> {
    let opt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
    hops.iter()
        .map(|h| {
            format!(
                "    {:<26} p50 {:>8} ms  p99 {:>8} ms  ({} transfers)",
                h.name,
                opt(h.p50_ms),
                opt(h.p99_ms),
                h.samples
            )
        })
        .collect()
}
