//! The statements of each step of the lifecycle floor ([`super::lifecycle`]), as each stage
//! sends them: the intake's transaction, the publisher's claim, antifraud's decisions, the
//! projection's status move (the ledger's are [`super::ledger::settle`]).

use chrono::{SubsecRound, Utc};
use diesel::sql_types::{Array, BigInt, Integer, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel::QueryableByName;
use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use tally_actors::store::decisions::{Decision, ANALYZED};
use tally_actors::store::outbox::{self, ClaimedOutboxEvent, OutboxColumns};
use tally_schema::events::{derived_event_id, TransferAnalyzed, TransferRequested};
use tally_schema::models::status;
use tally_schema::EventType;
use uuid::Uuid;

use crate::bench::sql::floor as sql;
use crate::bench::{account, pair};

/// The rows the intake's insert returns (every column, as the intake reads them).
#[derive(QueryableByName)]
#[diesel(table_name = tally_schema::schema::transfers)]
#[allow(dead_code)] // read back as the intake reads them, not used
struct Written {
    id: Uuid,
    source_account: String,
    destination_account: String,
    amount_cents: i64,
    currency: String,
    status: String,
    rejection_reason: Option<String>,
    idempotency_key: Option<String>,
    created_at: chrono::DateTime<Utc>,
    updated_at: chrono::DateTime<Utc>,
    client: String,
}

/// Transfers `first..first + n` over `accounts` (accounts and amounts as the e2e load sends
/// them) and their `TransferRequested` rows to `topic`, in one transaction; returns how
/// many were written.
pub async fn intake(
    conn: &mut AsyncPgConnection,
    first: usize,
    n: usize,
    accounts: usize,
    topic: &str,
) -> anyhow::Result<usize> {
    let now = Utc::now();
    let ids: Vec<Uuid> = (0..n).map(|_| Uuid::now_v7()).collect();
    let pairs: Vec<(usize, usize)> = (first..first + n).map(|i| pair(i, accounts)).collect();
    let sources: Vec<String> = pairs.iter().map(|(f, _)| account(*f)).collect();
    let destinations: Vec<String> = pairs.iter().map(|(_, t)| account(*t)).collect();
    let amounts: Vec<i64> = (first..first + n).map(|i| 1 + (i % 500) as i64).collect();
    let mut events = OutboxColumns::default();
    for (i, id) in ids.iter().enumerate() {
        let event = TransferRequested {
            event_id: derived_event_id("requested", *id),
            transfer_id: *id,
            source_account: sources[i].clone(),
            destination_account: destinations[i].clone(),
            amount_cents: amounts[i],
            currency: "BRL".into(),
            requested_at: now,
            client: None,
        };
        events.id.push(event.event_id);
        events.topic.push(topic.to_owned());
        events.key.push(event.source_account.clone());
        events.event_type.push(EventType::TransferRequested.as_str().into());
        events.payload.push(serde_json::to_string(&event)?);
        events.traceparent.push(None);
    }
    let text = |v: &str| vec![v.to_owned(); n];
    let none: Vec<Option<String>> = vec![None; n];
    let (currencies, statuses, clients) = (text("BRL"), text(status::PENDING), text(""));
    let times = vec![now; n];
    let written = conn
        .transaction(|conn| {
            async move {
                let written: Vec<Written> = diesel::sql_query(sql::INSERT_TRANSFERS)
                    .bind::<Array<SqlUuid>, _>(&ids)
                    .bind::<Array<Text>, _>(&sources)
                    .bind::<Array<Text>, _>(&destinations)
                    .bind::<Array<BigInt>, _>(&amounts)
                    .bind::<Array<Text>, _>(&currencies)
                    .bind::<Array<Text>, _>(&statuses)
                    .bind::<Array<Nullable<Text>>, _>(&none)
                    .bind::<Array<Nullable<Text>>, _>(&none)
                    .bind::<Array<Timestamptz>, _>(&times)
                    .bind::<Array<Text>, _>(&clients)
                    .load(conn)
                    .await?;
                outbox::insert_columns(conn, &events).await?;
                Ok::<_, diesel::result::Error>(written.len())
            }
            .scope_boxed()
        })
        .await?;
    Ok(written)
}

/// One publisher transaction: half the free shards locked (`all`: every free one), up to
/// `batch` of their rows claimed and marked published (the broker's part left out), by
/// the publisher's own store functions; returns the rows.
pub async fn claim(conn: &mut AsyncPgConnection, batch: usize, all: bool) -> anyhow::Result<Vec<ClaimedOutboxEvent>> {
    let limit = i64::try_from(batch)?;
    let claimed = conn
        .transaction(|conn| {
            async move {
                let reach = if all { outbox::Reach::AllFree } else { outbox::Reach::Half };
                let shards = outbox::lock_free_shards(conn, reach).await?;
                if shards.is_empty() {
                    return Ok(Vec::new());
                }
                let rows = outbox::claim_pending(conn, &shards, limit).await?;
                let ids: Vec<Uuid> = rows.iter().map(|r| r.event.id).collect();
                if !ids.is_empty() {
                    outbox::mark_published(conn, &ids).await?;
                }
                Ok::<_, diesel::result::Error>(rows)
            }
            .scope_boxed()
        })
        .await?;
    Ok(claimed)
}

#[derive(QueryableByName)]
struct Inserted {
    #[diesel(sql_type = SqlUuid)]
    #[allow(dead_code)] // returned as antifraud reads it
    transfer_id: Uuid,
}

/// Antifraud's statements for a batch: the stored decisions, then the new ones (every
/// transfer let through). Returns what goes on to the ledger.
pub async fn decide(
    conn: &mut AsyncPgConnection,
    requests: &[TransferRequested],
) -> anyhow::Result<Vec<TransferAnalyzed>> {
    let ids: Vec<Uuid> = requests.iter().map(|t| t.transfer_id).collect();
    let _stored: Vec<Decision> =
        diesel::sql_query(sql::LOAD_DECISIONS).bind::<Array<SqlUuid>, _>(&ids).load(conn).await?;
    let now = Utc::now().trunc_subsecs(6);
    let col = |f: fn(&TransferRequested) -> String| requests.iter().map(f).collect::<Vec<_>>();
    let (sources, destinations, currencies) =
        (col(|t| t.source_account.clone()), col(|t| t.destination_account.clone()), col(|t| t.currency.clone()));
    let amounts: Vec<i64> = requests.iter().map(|t| t.amount_cents).collect();
    let requested_at: Vec<_> = requests.iter().map(|t| t.requested_at.trunc_subsecs(6)).collect();
    let n = requests.len();
    let _inserted: Vec<Inserted> = diesel::sql_query(sql::STORE_DECISIONS)
        .bind::<Array<SqlUuid>, _>(&ids)
        .bind::<Array<Text>, _>(&sources)
        .bind::<Array<Text>, _>(&vec![ANALYZED.to_owned(); n])
        .bind::<Array<Integer>, _>(&vec![10_i32; n])
        .bind::<Array<Nullable<Text>>, _>(&vec![None::<String>; n])
        .bind::<Array<Timestamptz>, _>(&requested_at)
        .bind::<Array<Timestamptz>, _>(&vec![now; n])
        .bind::<Array<Text>, _>(&destinations)
        .bind::<Array<BigInt>, _>(&amounts)
        .bind::<Array<Text>, _>(&currencies)
        .load(conn)
        .await?;
    Ok(requests
        .iter()
        .map(|t| TransferAnalyzed {
            event_id: derived_event_id("analyzed", t.transfer_id),
            transfer_id: t.transfer_id,
            source_account: t.source_account.clone(),
            destination_account: t.destination_account.clone(),
            amount_cents: t.amount_cents,
            currency: t.currency.clone(),
            score: 10,
            analyzed_at: now,
            client: None,
        })
        .collect())
}

#[derive(QueryableByName)]
struct Moved {
    #[diesel(sql_type = SqlUuid)]
    #[allow(dead_code)] // counted, as the projection counts what moved
    id: Uuid,
}

/// The projection's move of `ids` to SETTLED; returns how many moved.
pub async fn finish(conn: &mut AsyncPgConnection, ids: &[Uuid]) -> anyhow::Result<usize> {
    let n = ids.len();
    let moved: Vec<Moved> = diesel::sql_query(sql::FINISH_ALL)
        .bind::<Array<SqlUuid>, _>(ids)
        .bind::<Array<Text>, _>(&vec![status::SETTLED.to_owned(); n])
        .bind::<Array<Nullable<Text>>, _>(&vec![None::<String>; n])
        .load(conn)
        .await?;
    Ok(moved.len())
}
