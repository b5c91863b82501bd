//! What a batch decided, and why antifraud refuses to decide a request: under an id the
//! intake never took, asking for other than it took, or for a transfer final already.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use chrono::{SubsecRound, Utc};
use rdkafka::consumer::Consumer;
use tally_schema::events::TransferRequested;
use tally_schema::models::status;
use tracing::warn;
use uuid::Uuid;

use super::super::decisions::{self, Decision};
use super::super::hold::{drop_partitions, Hold};
use super::super::output;
use super::super::{LoopIo, RiskEngine, BLOCKED_BY_ANTIFRAUD, PIPELINE};
use super::backoff;
use crate::record::Record;
use crate::store;
use crate::store::known::Taken;
use crate::supervise::HandlerError;

/// The decisions of a batch, and the transfers it refuses to decide.
#[derive(Debug, Default)]
pub(crate) struct Decided {
    pub decisions: HashMap<Uuid, Decision>,
    /// What the intake took under each transfer id of the batch that it took. A request
    /// under an id it never took, or asking for other accounts, amount or currency, is
    /// poison: nothing is decided or stored for it.
    pub taken: HashMap<Uuid, Taken>,
}

impl Decided {
    /// Why the request `t` is refused by what the intake took, if it is.
    pub(crate) fn taken_refusal(&self, t: &TransferRequested) -> Option<&'static str> {
        match self.taken.get(&t.transfer_id) {
            None => Some(UNKNOWN_TRANSFER),
            Some(row) if !row.matches(t) => Some(CONTRADICTS_TRANSFER),
            Some(_) => None,
        }
    }

    /// Why the request `t` is refused, if it is: by what the intake took, or because its
    /// transfer is final without a decision (no stage made it final but through one).
    pub(crate) fn refusal(&self, t: &TransferRequested) -> Option<&'static str> {
        self.taken_refusal(t).or_else(|| {
            let pending = self.taken.get(&t.transfer_id).is_some_and(|row| row.status == status::PENDING);
            (!pending && !self.decisions.contains_key(&t.transfer_id)).then_some(NOT_PENDING)
        })
    }
}

/// Why antifraud refuses to decide a transfer that is final already.
const NOT_PENDING: &str = "contradicts the transfer: it is no longer PENDING";

/// Why antifraud refuses a request whose transfer id the intake never took.
const UNKNOWN_TRANSFER: &str = "unknown transfer: the intake never took it";
/// Why antifraud refuses a request that asks for other than what the intake took.
const CONTRADICTS_TRANSFER: &str = "contradicts the transfer: other accounts, amount or currency than the intake took";

/// The decision of every decoded transfer of the batch that the intake took as requested:
/// stored ones as they are, new ones scored and stored first. Rebuilds the velocity window
/// first after an assignment. Waits out database failures with capped backoff, holding its
/// partitions (records of partitions revoked meanwhile leave `batch`); `None` when the
/// stage stops meanwhile.
pub(crate) fn decide(io: &LoopIo<'_>, batch: &mut Vec<Record>, risk: &mut dyn RiskEngine) -> Option<Decided> {
    let mut hold = None;
    let mut attempt = 0_u32;
    loop {
        let inputs: Vec<TransferRequested> = batch.iter().filter_map(|r| output::decode(r).ok()).collect();
        if inputs.is_empty() {
            // Nothing to decide (every record is poison, or none is left): no database.
            return Some(Decided::default());
        }
        let requests: Vec<&TransferRequested> = inputs.iter().collect();
        match io.runtime.block_on(decide_stored(io, &requests, risk)) {
            Ok(decided) => return Some(decided),
            Err(e) => {
                attempt += 1;
                warn!(pipeline = PIPELINE, error = %e, attempt, "Cannot read or store antifraud decisions; retrying.");
                if io.stopping.load(Ordering::Relaxed) {
                    return None;
                }
                io.metrics.retries_total.with_label_values(&[PIPELINE]).inc();
                let revoked = hold.get_or_insert_with(|| Hold::begin(io.consumer)).wait(io, backoff(io.spec, attempt));
                drop_partitions(batch, &revoked);
                if io.stopping.load(Ordering::Relaxed) {
                    return None;
                }
            }
        }
    }
}

async fn decide_stored(
    io: &LoopIo<'_>,
    requests: &[&TransferRequested],
    risk: &mut dyn RiskEngine,
) -> Result<Decided, HandlerError> {
    let mut conn = io.pool.get().await.map_err(|e| HandlerError::classified("no database connection", &e))?;
    let db = |e: diesel::result::Error| HandlerError::classified("antifraud decisions", &e);
    if io.consumer.context().assigned.load(Ordering::Relaxed) {
        if let Some(window) = risk.window() {
            let recent = store::decisions::recent(&mut conn, window).await.map_err(db)?;
            risk.rebuild(
                &recent.into_iter().map(|r| (r.source_account, r.transfer_id, r.requested_at)).collect::<Vec<_>>(),
            );
        }
        io.consumer.context().assigned.store(false, Ordering::Relaxed);
    }
    let mut seen = HashSet::new();
    let ids: Vec<Uuid> = requests.iter().map(|t| t.transfer_id).filter(|id| seen.insert(*id)).collect();
    // Only what the intake took is decided: a request under an id it never took, or
    // asking for other than it took, moves nothing and is stored nowhere.
    let mut decided = Decided { taken: store::known::taken(&mut conn, &ids).await.map_err(db)?, ..Decided::default() };
    let requests: Vec<&TransferRequested> =
        requests.iter().copied().filter(|t| decided.taken_refusal(t).is_none()).collect();
    let ids: Vec<Uuid> = ids.into_iter().filter(|id| decided.taken.contains_key(id)).collect();
    let mut stored = store::decisions::load(&mut conn, &ids).await.map_err(db)?;
    let rescore = crate::faults::is_on(crate::faults::Fault::Rescore);
    if rescore {
        // Broken on purpose (test builds only): every delivery is scored again.
        stored.clear();
    }
    // A transfer that is final has its decision already; one without it is decided never.
    // (Broken on purpose under the fault: a redelivery is scored again whatever the
    // transfer's status, so that every redelivery makes a second decision.)
    let requests: Vec<&TransferRequested> = requests
        .into_iter()
        .filter(|t| {
            rescore
                || stored.contains_key(&t.transfer_id)
                || decided.taken.get(&t.transfer_id).is_some_and(|row| row.status == status::PENDING)
        })
        .collect();
    let requests = requests.as_slice();
    // Stored with microsecond precision: keep the same precision, so the first delivery
    // and every later one publish the same time.
    let now = Utc::now().trunc_subsecs(6);
    let (mut all, new) =
        decisions::decide_batch(requests, &stored, risk, io.spec.block_limit, BLOCKED_BY_ANTIFRAUD, now);
    let inserted = store::decisions::store(&mut conn, &new).await.map_err(db)?;
    let lost: Vec<Uuid> = new.iter().map(|d| d.transfer_id).filter(|id| !inserted.contains(id)).collect();
    if !lost.is_empty() && !rescore {
        // Another instance decided these first: its decision stands.
        all.extend(store::decisions::load(&mut conn, &lost).await.map_err(db)?);
    }
    decided.decisions = all;
    Ok(decided)
}
