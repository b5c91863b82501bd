//! What the stages before a benched one would have written to the system of record for the
//! records the bench produces: every stage checks an event against that record before it
//! acts on it (the intake's `transfers` row, antifraud's decision, the ledger's outcome and
//! postings), so a stage benched alone needs it in place, as it would be in a real flow.
//! Written before the stage starts: not part of what is measured.

use std::collections::HashMap;

use anyhow::Context;
use serde_json::Value;

use super::Outgoing;

/// Rows per statement.
const CHUNK: usize = 10_000;

/// The intake's PENDING transfers of `$1..$5` (id, source, destination, amount, currency).
const REQUESTED: &str = "INSERT INTO transfers (id, source_account, destination_account, amount_cents, currency, \
            status) \
     SELECT id, s, d, a, c, 'PENDING' \
     FROM unnest($1::text[]::uuid[], $2::text[], $3::text[], $4::bigint[], $5::text[]) AS u(id, s, d, a, c) \
     ON CONFLICT (id) DO NOTHING";

/// Antifraud's ANALYZED decisions of the same columns.
const ANALYZED: &str = "INSERT INTO antifraud_decisions (transfer_id, source_account, destination_account, \
            amount_cents, currency, outcome, score, requested_at) \
     SELECT id, s, d, a, c, 'ANALYZED', 10, now() \
     FROM unnest($1::text[]::uuid[], $2::text[], $3::text[], $4::bigint[], $5::text[]) AS u(id, s, d, a, c) \
     ON CONFLICT (transfer_id) DO NOTHING";

/// The ledger's SETTLED outcome of the transfers `$1` (which the intake holds).
const SETTLED: &str = "INSERT INTO processed_transfers (transfer_id, outcome) \
     SELECT id, 'SETTLED' FROM unnest($1::text[]::uuid[]) AS u(id) ON CONFLICT (transfer_id) DO NOTHING";

/// Their postings: one debit and one credit each.
const POSTINGS: &str = "INSERT INTO postings (transfer_id, account_id, kind, amount_cents) \
     SELECT t.id, p.account, p.kind, t.amount_cents FROM transfers t \
     CROSS JOIN LATERAL (VALUES (t.source_account, 'D'), (t.destination_account, 'C')) AS p(account, kind) \
     WHERE t.id = ANY($1::text[]::uuid[]) ON CONFLICT DO NOTHING";

/// The ledger's REJECTED outcome of `$1` with the reasons `$2`.
const REJECTED: &str = "INSERT INTO processed_transfers (transfer_id, outcome, reason) \
     SELECT id, 'REJECTED', r FROM unnest($1::text[]::uuid[], $2::text[]) AS u(id, r) \
     ON CONFLICT (transfer_id) DO NOTHING";

/// The columns of transfer requests, for `unnest`.
#[derive(Default)]
struct Requests {
    ids: Vec<String>,
    sources: Vec<String>,
    destinations: Vec<String>,
    amounts: Vec<i64>,
    currencies: Vec<String>,
}

impl Requests {
    fn push(&mut self, event: &Value) -> anyhow::Result<()> {
        let text = |k: &str| event[k].as_str().map(str::to_owned).with_context(|| format!("no {k} in {event}"));
        self.ids.push(transfer_id(event)?);
        self.sources.push(text("sourceAccount")?);
        self.destinations.push(text("destinationAccount")?);
        self.amounts.push(event["amountCents"].as_i64().with_context(|| format!("no amountCents in {event}"))?);
        self.currencies.push(text("currency")?);
        Ok(())
    }
}

fn transfer_id(event: &Value) -> anyhow::Result<String> {
    event["transferId"].as_str().map(str::to_owned).with_context(|| format!("no transferId in {event}"))
}

/// Writes, on the database at `url`, what the stages before the consumer of each record
/// of `records` would have: a `TransferRequested` the intake's row, a `TransferAnalyzed`
/// that and antifraud's decision, a `TransferSettled` the ledger's outcome and postings
/// (of a transfer the intake holds), a `TransferRejected` the ledger's outcome.
///
/// # Errors
/// A record whose payload is not such an event, or a database error.
pub async fn record(url: &str, records: &[Outgoing]) -> anyhow::Result<()> {
    let client = super::connect(url).await?;
    for chunk in records.chunks(CHUNK) {
        let (mut requested, mut analyzed) = (Requests::default(), Requests::default());
        let mut settled = Vec::new();
        let mut rejected: HashMap<String, String> = HashMap::new();
        for out in chunk {
            let event: Value = serde_json::from_str(&out.payload).context("a bench record that is not JSON")?;
            match out.event_type {
                "TransferRequested" => requested.push(&event)?,
                "TransferAnalyzed" => analyzed.push(&event)?,
                "TransferSettled" => settled.push(transfer_id(&event)?),
                "TransferRejected" => {
                    let reason = event["reason"].as_str().unwrap_or_default().to_owned();
                    rejected.insert(transfer_id(&event)?, reason);
                }
                _ => {}
            }
        }
        for (rows, decided) in [(&requested, false), (&analyzed, false), (&analyzed, true)] {
            if rows.ids.is_empty() {
                continue;
            }
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
                [&rows.ids, &rows.sources, &rows.destinations, &rows.amounts, &rows.currencies];
            client.execute(if decided { ANALYZED } else { REQUESTED }, &params).await?;
        }
        if !settled.is_empty() {
            client.execute(SETTLED, &[&settled]).await?;
            client.execute(POSTINGS, &[&settled]).await?;
        }
        if !rejected.is_empty() {
            let (ids, reasons): (Vec<String>, Vec<String>) = rejected.into_iter().unzip();
            client.execute(REJECTED, &[&ids, &reasons]).await?;
        }
    }
    Ok(())
}
