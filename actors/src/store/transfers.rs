//! The `transfers` table: the intake's rows (created with their outbox rows in one
//! transaction per batch), lookups, and the status projection's one-way move out of PENDING.
//! What the ledger and antifraud read of the intake's rows is in `known.rs`.

use std::collections::{HashMap, HashSet};

use chrono::Utc;
use diesel::prelude::*;
use diesel::sql_types::{Array, Nullable, Text, Uuid as SqlUuid};
use diesel::QueryableByName;
use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use tally_schema::events::{derived_event_id, TransferRequested};
use tally_schema::models::{status, Transfer};
use tally_schema::schema::transfers;
use tally_schema::EventType;
use uuid::Uuid;

use super::idempotency;

mod refusals;

use super::outbox::{self, OutboxColumns};
use refusals::refusals;
pub use refusals::Refusal;

/// A validated transfer request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferRequest {
    pub source_account: String,
    pub destination_account: String,
    pub amount_cents: i64,
    pub currency: String,
}

impl TransferRequest {
    fn matches(&self, t: &Transfer) -> bool {
        self.source_account == t.source_account
            && self.destination_account == t.destination_account
            && self.amount_cents == t.amount_cents
            && self.currency == t.currency
    }
}

/// What happened to a transfer request.
#[derive(Debug)]
pub enum Created {
    /// A new transfer (and its outbox row) was written.
    New(Transfer),
    /// The idempotency key was seen with the same request: nothing was written.
    Replayed(Transfer),
    /// The idempotency key was seen with a different request: nothing was written.
    KeyConflict,
    /// The client may not move money this way ([`crate::authority`]): nothing was written.
    Refused(Refusal),
}

/// Kind of a `TransferRequested` event id: derived from the transfer id like every other
/// event of a transfer, so its outbox row is found by primary key.
pub const REQUESTED_KIND: &str = "requested";

/// One transfer request of [`create_transfers`], with what came with it over HTTP.
#[derive(Debug, Clone)]
pub struct Intake {
    pub request: TransferRequest,
    /// The authenticated API client; empty when the intake does not authenticate.
    pub client: String,
    /// The key also matches an anonymous request's transfer (with an empty `client`)
    /// written before this client authenticated: see [`create_transfers`].
    pub adopts_anonymous: bool,
    /// Unique per client.
    pub idempotency_key: Option<String>,
    pub traceparent: Option<String>,
}

/// Inserts the transfers (PENDING) of `batch` and their `TransferRequested` outbox rows in
/// one transaction, honouring each request's idempotency key; answers one [`Created`] per
/// request, in order. Either every request's outcome is committed or none is.
///
/// A request whose client may not debit its source account (or whose destination is an
/// issuance account) is [`Created::Refused`] before anything else, whatever its key.
///
/// An idempotency key is scoped to its client: requests of two clients never meet. Requests
/// of one batch that share a client and key are answered as if they had come one after the
/// other: the first is written (or replays an older transfer), the others replay it or
/// conflict with it. A client that adopts anonymous requests, with no transfer of its own
/// under a key, meets an anonymous transfer under that key as if it were its own: so a
/// retry across the cut-over to an authenticated intake does not apply twice.
///
/// # Errors
/// When the database fails; nothing is written then.
pub async fn create_transfers(
    conn: &mut AsyncPgConnection,
    batch: &[Intake],
    topic: &str,
) -> Result<Vec<Created>, diesel::result::Error> {
    if batch.is_empty() {
        return Ok(Vec::new());
    }
    conn.transaction(|conn| {
        async move {
            let refusals = refusals(conn, batch).await?;
            let allowed: Vec<Intake> =
                batch.iter().zip(&refusals).filter(|(_, r)| r.is_none()).map(|(i, _)| i.clone()).collect();
            let mut created = create_allowed(conn, &allowed, topic).await?.into_iter();
            refusals
                .into_iter()
                .map(|r| match r {
                    Some(refusal) => Ok(Created::Refused(refusal)),
                    None => created.next().ok_or(diesel::result::Error::NotFound),
                })
                .collect()
        }
        .scope_boxed()
    })
    .await
}

/// Writes the requests of `batch`, every one of which is allowed, inside the caller's
/// transaction.
async fn create_allowed(
    conn: &mut AsyncPgConnection,
    batch: &[Intake],
    topic: &str,
) -> Result<Vec<Created>, diesel::result::Error> {
    if batch.is_empty() {
        return Ok(Vec::new());
    }
    let now = Utc::now();
    let rows: Vec<Transfer> = batch.iter().map(|intake| new_row(intake, now)).collect();
    let shared: Vec<String> = rows
        .iter()
        .zip(batch)
        .filter(|(t, intake)| t.client.is_empty() || intake.adopts_anonymous)
        .filter_map(|(t, _)| t.idempotency_key.clone())
        .collect();
    idempotency::lock_keys(conn, "transfers", shared).await?;
    let mut adopted = adopted_transfers(conn, &rows, batch).await?;
    // An adopting request whose key an anonymous request of this batch holds (and
    // nothing older does) meets that request's transfer, once it is written.
    let anonymous_here: HashSet<&str> =
        rows.iter().filter(|t| t.client.is_empty()).filter_map(|t| t.idempotency_key.as_deref()).collect();
    let adopts_here: HashSet<(String, String)> = rows
        .iter()
        .zip(batch)
        .filter(|(t, intake)| intake.adopts_anonymous && !t.client.is_empty())
        .filter_map(|(t, _)| scoped_key(t))
        .filter(|(_, key)| anonymous_here.contains(key))
        .map(owned)
        .filter(|k| !adopted.contains_key(k))
        .collect();
    let own = keyed_transfers(conn, adopts_here.iter().map(|(c, k)| (c.as_str(), k.as_str()))).await?;
    let adopts_here: HashSet<(String, String)> = adopts_here.into_iter().filter(|k| !own.contains_key(k)).collect();
    // Only the first request of each client's key is offered to the insert, in
    // (client, key) order: two batches that share keys then wait on each other in
    // one order, never in a cycle (a deadlock). None whose key is adopted.
    let mut seen = HashSet::new();
    let mut offered: Vec<&Transfer> = rows
        .iter()
        .filter(|t| {
            scoped_key(t)
                .is_none_or(|k| !adopted.contains_key(&owned(k)) && !adopts_here.contains(&owned(k)) && seen.insert(k))
        })
        .collect();
    offered.sort_by(|a, b| scoped_key(a).cmp(&scoped_key(b)));
    let mut inserted: HashMap<Uuid, Transfer> = diesel::insert_into(transfers::table)
        .values(offered)
        .on_conflict((transfers::client, transfers::idempotency_key))
        .do_nothing()
        .returning(Transfer::as_returning())
        .get_results(conn)
        .await?
        .into_iter()
        .map(|t| (t.id, t))
        .collect();
    let unwritten = rows.iter().filter(|t| !inserted.contains_key(&t.id));
    let by_key = keyed_transfers(conn, unwritten.filter_map(scoped_key)).await?;
    for (client, key) in &adopts_here {
        let anonymous = inserted.values().find(|t| t.client.is_empty() && t.idempotency_key.as_ref() == Some(key));
        let anonymous = match anonymous {
            Some(t) => Some(t.clone()),
            None => keyed_transfers(conn, std::iter::once(("", key.as_str()))).await?.into_values().next(),
        };
        if let Some(t) = anonymous {
            adopted.insert((client.clone(), key.clone()), t);
        }
    }
    let mut outcomes = Vec::with_capacity(batch.len());
    let mut events = OutboxColumns::default();
    for (row, intake) in rows.iter().zip(batch) {
        if let Some(transfer) = inserted.remove(&row.id) {
            push_requested(&mut events, &transfer, topic, intake.traceparent.clone())?;
            outcomes.push(Created::New(transfer));
            continue;
        }
        // Not inserted: its client's key is taken, by an older transfer or by this
        // batch's.
        let existing = scoped_key(row)
            .map(owned)
            .and_then(|k| adopted.get(&k).or_else(|| by_key.get(&k)))
            .ok_or(diesel::result::Error::NotFound)?;
        outcomes.push(if intake.request.matches(existing) {
            Created::Replayed(existing.clone())
        } else {
            Created::KeyConflict
        });
    }
    outbox::insert_columns(conn, &events).await?;
    Ok(outcomes)
}

fn new_row(intake: &Intake, now: chrono::DateTime<Utc>) -> Transfer {
    let req = &intake.request;
    Transfer {
        id: Uuid::now_v7(),
        source_account: req.source_account.clone(),
        destination_account: req.destination_account.clone(),
        amount_cents: req.amount_cents,
        currency: req.currency.clone(),
        status: status::PENDING.into(),
        rejection_reason: None,
        idempotency_key: intake.idempotency_key.clone(),
        created_at: now,
        updated_at: now,
        client: intake.client.clone(),
        kind: tally_schema::models::transfer_kind::TRANSFER.into(),
    }
}

/// The idempotency key of `t` with its client, which scopes it; `None` without a key.
fn scoped_key(t: &Transfer) -> Option<(&str, &str)> {
    Some((t.client.as_str(), t.idempotency_key.as_deref()?))
}

fn owned((client, key): (&str, &str)) -> (String, String) {
    (client.to_owned(), key.to_owned())
}

/// The anonymous transfers that the rows of adopting clients meet, by the rows' (client,
/// key): those holding a row's key in the anonymous scope when the row's client holds no
/// transfer under it.
async fn adopted_transfers(
    conn: &mut AsyncPgConnection,
    rows: &[Transfer],
    batch: &[Intake],
) -> Result<HashMap<(String, String), Transfer>, diesel::result::Error> {
    let adopting: Vec<(&str, &str)> = rows
        .iter()
        .zip(batch)
        .filter(|(t, intake)| intake.adopts_anonymous && !t.client.is_empty())
        .filter_map(|(t, _)| scoped_key(t))
        .collect();
    if adopting.is_empty() {
        return Ok(HashMap::new());
    }
    let anonymous = adopting.iter().map(|(_, key)| ("", *key));
    let found = keyed_transfers(conn, adopting.iter().copied().chain(anonymous)).await?;
    Ok(adopting
        .into_iter()
        .filter(|k| !found.contains_key(&owned(*k)))
        .filter_map(|(client, key)| Some(((client.to_owned(), key.to_owned()), found.get(&owned(("", key)))?.clone())))
        .collect())
}

/// The transfers holding the (client, idempotency key) pairs `wanted` (committed, or
/// written by this transaction), by pair.
async fn keyed_transfers<'r>(
    conn: &mut AsyncPgConnection,
    wanted: impl Iterator<Item = (&'r str, &'r str)>,
) -> Result<HashMap<(String, String), Transfer>, diesel::result::Error> {
    let wanted: HashSet<(&str, &str)> = wanted.collect();
    if wanted.is_empty() {
        return Ok(HashMap::new());
    }
    let clients: Vec<&str> = wanted.iter().map(|(c, _)| *c).collect();
    let keys: Vec<&str> = wanted.iter().map(|(_, k)| *k).collect();
    let found: Vec<Transfer> = transfers::table
        .filter(transfers::idempotency_key.eq_any(&keys))
        .filter(transfers::client.eq_any(&clients))
        .select(Transfer::as_select())
        .load(conn)
        .await?;
    Ok(found
        .into_iter()
        .filter(|t| scoped_key(t).is_some_and(|k| wanted.contains(&k)))
        .filter_map(|t| Some(((t.client.clone(), t.idempotency_key.clone()?), t)))
        .collect())
}

/// Adds `transfer`'s `TransferRequested` outbox row to `events`.
fn push_requested(
    events: &mut OutboxColumns,
    transfer: &Transfer,
    topic: &str,
    traceparent: Option<String>,
) -> Result<(), diesel::result::Error> {
    let event = TransferRequested {
        event_id: derived_event_id(REQUESTED_KIND, transfer.id),
        transfer_id: transfer.id,
        source_account: transfer.source_account.clone(),
        destination_account: transfer.destination_account.clone(),
        amount_cents: transfer.amount_cents,
        currency: transfer.currency.clone(),
        requested_at: transfer.created_at,
        client: Some(transfer.client.clone()).filter(|c| !c.is_empty()),
    };
    let payload = serde_json::to_string(&event).map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))?;
    events.id.push(event.event_id);
    events.topic.push(topic.to_owned());
    events.key.push(transfer.source_account.clone());
    events.event_type.push(EventType::TransferRequested.as_str().to_owned());
    events.payload.push(payload);
    events.traceparent.push(traceparent);
    Ok(())
}

/// # Errors
/// When the database fails.
pub async fn find_transfer(conn: &mut AsyncPgConnection, id: Uuid) -> Result<Option<Transfer>, diesel::result::Error> {
    transfers::table.find(id).select(Transfer::as_select()).first(conn).await.optional()
}

/// A transfer's move to a final status, for [`finish_all`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finish {
    pub id: Uuid,
    pub status: &'static str,
    pub reason: Option<String>,
}

/// Moves every PENDING transfer of `moves` to its final status (with the reason of a
/// rejection), in one statement; whether each moved, in order. Idempotent and monotonic:
/// a final transfer never moves again, and of several moves of one transfer only the
/// first can move it, as if they came one after the other.
///
/// # Errors
/// Any database error; then none moved.
pub async fn finish_all(conn: &mut AsyncPgConnection, moves: &[Finish]) -> Result<Vec<bool>, diesel::result::Error> {
    let mut seen = HashSet::new();
    let first: Vec<&Finish> = moves.iter().filter(|m| seen.insert(m.id)).collect();
    let ids: Vec<Uuid> = first.iter().map(|m| m.id).collect();
    let statuses: Vec<&str> = first.iter().map(|m| m.status).collect();
    let reasons: Vec<Option<&str>> = first.iter().map(|m| m.reason.as_deref()).collect();
    let moved: HashSet<Uuid> = diesel::sql_query(
        "UPDATE transfers t SET status = u.status, rejection_reason = u.reason, updated_at = now() \
         FROM unnest($1::uuid[], $2::text[], $3::text[]) AS u(id, status, reason) \
         WHERE t.id = u.id AND t.status = 'PENDING' \
         RETURNING t.id",
    )
    .bind::<Array<SqlUuid>, _>(&ids)
    .bind::<Array<Text>, _>(&statuses)
    .bind::<Array<Nullable<Text>>, _>(&reasons)
    .load::<MovedId>(conn)
    .await?
    .into_iter()
    .map(|m| m.id)
    .collect();
    let mut answered = HashSet::new();
    Ok(moves.iter().map(|m| answered.insert(m.id) && moved.contains(&m.id)).collect())
}

#[derive(QueryableByName)]
struct MovedId {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
}
