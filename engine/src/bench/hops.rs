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

use std::collections::HashMap;

use serde::Serialize;

use super::{quantile, sql};

/// One hop's latencies over a phase, in ms.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Hop {
    pub name: &'static str,
    pub samples: usize,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// The hops, in pipeline order.
const HOPS: [&str; 5] = [
    "intake -> publish",
    "publish -> decision",
    "decision -> settlement",
    "settlement -> publish",
    "publish -> final status",
];

/// The per-hop p50 and p99 of every settled transfer in the database. Two plain queries
/// joined here: the outbox rows are matched on the transfer id in their payload, which no
/// index serves, so a join in SQL would be planned blind.
///
/// # Errors
/// When a query fails.
pub async fn breakdown(db: &tokio_postgres::Client, since: f64) -> anyhow::Result<Vec<Hop>> {
    let published: HashMap<(String, String), f64> = db
        .query(&sql::hops_published(), &[])
        .await?
        .iter()
        .filter_map(|r| Some(((r.get::<_, Option<String>>(0)?, r.get::<_, String>(1)), r.get::<_, f64>(2))))
        .collect();
    let rows = db.query(&sql::hops_settled(), &[&since]).await?;
    let mut samples: [Vec<f64>; 5] = Default::default();
    for r in &rows {
        let id: String = r.get(0);
        let (created, decided, settled, last): (f64, f64, f64, f64) = (r.get(1), r.get(2), r.get(3), r.get(4));
        let requested = published.get(&(id.clone(), "TransferRequested".to_owned())).copied();
        let announced = published.get(&(id, "TransferSettled".to_owned())).copied();
        let hops = [
            requested.map(|p| p - created),
            requested.map(|p| decided - p),
            Some(settled - decided),
            announced.map(|p| p - settled),
            announced.map(|p| last - p),
        ];
        for (sample, hop) in samples.iter_mut().zip(hops) {
            sample.extend(hop);
        }
    }
    Ok(HOPS
        .iter()
        .zip(samples)
        .map(|(name, mut ms)| {
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
