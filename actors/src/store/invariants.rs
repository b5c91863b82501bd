//! The ledger invariants, evaluated in one consistent snapshot
//! (REPEATABLE READ), for `/admin/ledger/check`, the tests and the bench.

use diesel::sql_types::BigInt;
use diesel::QueryableByName;
use diesel_async::scoped_futures::ScopedFutureExt;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;

use crate::metrics::Metrics;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InvariantResult {
    pub name: &'static str,
    pub ok: bool,
    /// What was measured: a count of violations, or the compared totals.
    pub detail: serde_json::Value,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LedgerCheck {
    pub ok: bool,
    pub invariants: Vec<InvariantResult>,
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// The sum of a currency's balances, as decimal text: PostgreSQL sums BIGINT as numeric,
/// which may pass i64.
#[derive(QueryableByName)]
struct Total {
    #[diesel(sql_type = diesel::sql_types::Text)]
    currency: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    balance: String,
    /// What was issued in it (minus the issuance account's balance).
    #[diesel(sql_type = diesel::sql_types::Text)]
    issued: String,
}

/// `{currency: field}` of every total.
fn by_currency(totals: &[Total], field: impl Fn(&Total) -> &String) -> serde_json::Value {
    totals.iter().map(|t| (t.currency.clone(), serde_json::Value::String(field(t).clone()))).collect()
}

async fn count(conn: &mut AsyncPgConnection, sql: &str) -> Result<i64, diesel::result::Error> {
    Ok(diesel::sql_query(sql).get_result::<Count>(conn).await?.n)
}

#[derive(QueryableByName)]
struct StatusCounts {
    #[diesel(sql_type = BigInt)]
    settled_without_two: i64,
    #[diesel(sql_type = BigInt)]
    rejected_with_postings: i64,
    #[diesel(sql_type = BigInt)]
    pending_with_postings: i64,
}

/// The intake's transfer status against the ledger's postings: SETTLED has exactly its
/// debit (on the source) and credit (on the destination) of its amount, REJECTED has none. (At most one decision per transfer
/// is the primary key of `antifraud_decisions`; a BLOCKED one must have no postings.)
async fn status_against_postings(conn: &mut AsyncPgConnection) -> Result<StatusCounts, diesel::result::Error> {
    diesel::sql_query(
        "WITH p AS ( \
           SELECT transfer_id, count(*) AS n, \
                  bool_and(amount_cents = t_amount \
                           AND account_id = CASE kind WHEN 'D' THEN t_source ELSE t_destination END) AS amounts_match, \
                  count(*) FILTER (WHERE kind = 'D') AS debits \
           FROM (SELECT p.transfer_id, p.kind, p.amount_cents, p.account_id, t.amount_cents AS t_amount, \
                        t.source_account AS t_source, t.destination_account AS t_destination \
                 FROM postings p JOIN transfers t ON t.id = p.transfer_id) x \
           GROUP BY transfer_id) \
         SELECT \
           count(*) FILTER (WHERE t.status = 'SETTLED' \
             AND (p.n IS NULL OR p.n <> 2 OR p.debits <> 1 OR NOT p.amounts_match)) AS settled_without_two, \
           count(*) FILTER (WHERE t.status = 'REJECTED' AND p.n IS NOT NULL) AS rejected_with_postings, \
           count(*) FILTER (WHERE t.status = 'PENDING' AND p.n IS NOT NULL) AS pending_with_postings \
         FROM transfers t LEFT JOIN p ON p.transfer_id = t.id",
    )
    .get_result(conn)
    .await
}

/// Evaluates every invariant, in one REPEATABLE READ snapshot. Over 80 lines because it is
/// the list of invariants, one query each, and they must share the transaction.
///
/// # Errors
/// When the database fails.
pub async fn check_ledger(conn: &mut AsyncPgConnection) -> Result<LedgerCheck, diesel::result::Error> {
    conn.build_transaction()
        .repeatable_read()
        .read_only()
        .run(|conn| {
            async move {
                // Every balance of a currency, issuance accounts included, sums to zero:
                // money enters only as an issuance posting.
                let totals: Vec<Total> = diesel::sql_query(
                    "SELECT currency::text AS currency, sum(balance_cents)::text AS balance, \
                            (-COALESCE(sum(balance_cents) FILTER (WHERE kind = 'issuance'), 0))::text AS issued \
                     FROM accounts GROUP BY currency ORDER BY currency",
                )
                .load(conn)
                .await?;
                let unbalanced_accounts = count(
                    conn,
                    "SELECT count(*) AS n FROM accounts a LEFT JOIN ( \
                       SELECT account_id, sum(CASE kind WHEN 'C' THEN amount_cents ELSE -amount_cents END) AS delta \
                       FROM postings GROUP BY account_id) p ON p.account_id = a.id \
                     WHERE a.balance_cents <> COALESCE(p.delta, 0)",
                )
                .await?;
                // Every posting has a known origin: a transfer the intake took that
                // antifraud analyzed, or an issuance from its currency's issuance account.
                let without_provenance = count(
                    conn,
                    "SELECT count(DISTINCT p.transfer_id) AS n FROM postings p \
                     LEFT JOIN transfers t ON t.id = p.transfer_id \
                     LEFT JOIN antifraud_decisions d ON d.transfer_id = p.transfer_id \
                     WHERE t.id IS NULL \
                        OR (t.kind = 'transfer' AND (d.outcome IS DISTINCT FROM 'ANALYZED' \
                            OR t.source_account LIKE 'issuance:%' OR t.destination_account LIKE 'issuance:%')) \
                        OR (t.kind = 'issuance' AND (t.source_account <> 'issuance:' || t.currency \
                            OR t.destination_account LIKE 'issuance:%'))",
                )
                .await?;
                let bad_settled = count(
                    conn,
                    "SELECT count(*) AS n FROM processed_transfers t \
                     LEFT JOIN postings d ON d.transfer_id = t.transfer_id AND d.kind = 'D' \
                     LEFT JOIN postings c ON c.transfer_id = t.transfer_id AND c.kind = 'C' \
                     WHERE t.outcome = 'SETTLED' \
                       AND (d.id IS NULL OR c.id IS NULL OR d.amount_cents <> c.amount_cents)",
                )
                .await?;
                let postings_without_settlement = count(
                    conn,
                    "SELECT count(DISTINCT p.transfer_id) AS n FROM postings p \
                     LEFT JOIN processed_transfers t ON t.transfer_id = p.transfer_id \
                     WHERE t.outcome IS DISTINCT FROM 'SETTLED'",
                )
                .await?;
                let unfinished = count(conn, "SELECT count(*) AS n FROM processed_transfers WHERE outcome = 'PROCESSING'")
                    .await?;
                let status = status_against_postings(conn).await?;
                let blocked_with_postings = count(
                    conn,
                    "SELECT count(*) AS n FROM antifraud_decisions d \
                     WHERE d.outcome = 'BLOCKED' AND EXISTS (SELECT 1 FROM postings p WHERE p.transfer_id = d.transfer_id)",
                )
                .await?;
                // Every issuance names the client on whose authority it was made, its own, in
                // a row written with it: money minted by hand in SQL has none.
                let unauthorized_issuances = count(
                    conn,
                    "SELECT count(*) AS n FROM transfers t \
                     WHERE t.kind = 'issuance' \
                       AND NOT EXISTS (SELECT 1 FROM issuance_audit a WHERE a.transfer_id = t.id AND a.client = t.client)",
                )
                .await?;
                let invariants = vec![
                    InvariantResult {
                        name: INVARIANTS[0],
                        ok: totals.iter().all(|t| t.balance == "0"),
                        detail: serde_json::json!({
                            "balanceCents": by_currency(&totals, |t| &t.balance),
                            "issuedCents": by_currency(&totals, |t| &t.issued),
                        }),
                    },
                    InvariantResult {
                        name: INVARIANTS[1],
                        ok: unbalanced_accounts == 0,
                        detail: serde_json::json!({ "violations": unbalanced_accounts }),
                    },
                    InvariantResult {
                        name: INVARIANTS[2],
                        ok: bad_settled == 0,
                        detail: serde_json::json!({ "violations": bad_settled }),
                    },
                    InvariantResult {
                        name: INVARIANTS[3],
                        ok: postings_without_settlement == 0,
                        detail: serde_json::json!({ "violations": postings_without_settlement }),
                    },
                    InvariantResult {
                        name: INVARIANTS[4],
                        ok: unfinished == 0,
                        detail: serde_json::json!({ "violations": unfinished }),
                    },
                    InvariantResult {
                        name: INVARIANTS[5],
                        ok: status.settled_without_two == 0 && status.rejected_with_postings == 0,
                        detail: serde_json::json!({
                            "settledWithoutTheirTwoPostings": status.settled_without_two,
                            "rejectedWithPostings": status.rejected_with_postings,
                            // The projection catching up, not a violation.
                            "pendingWithPostings": status.pending_with_postings,
                        }),
                    },
                    InvariantResult {
                        name: INVARIANTS[6],
                        ok: blocked_with_postings == 0,
                        detail: serde_json::json!({ "violations": blocked_with_postings }),
                    },
                    InvariantResult {
                        name: INVARIANTS[7],
                        ok: without_provenance == 0,
                        detail: serde_json::json!({ "violations": without_provenance }),
                    },
                    InvariantResult {
                        name: INVARIANTS[8],
                        ok: unauthorized_issuances == 0,
                        detail: serde_json::json!({ "violations": unauthorized_issuances }),
                    },
                ];
                Ok(LedgerCheck { ok: invariants.iter().all(|i| i.ok), invariants })
            }
            .scope_boxed()
        })
        .await
}

/// The name of every invariant a check measures, as `tally_ledger_invariant_ok` labels it.
pub const INVARIANTS: [&str; 9] = [
    "money_conserved",
    "balances_match_postings",
    "settled_have_one_debit_and_one_credit",
    "only_settled_have_postings",
    "no_unfinished_settlements",
    "status_agrees_with_postings",
    "blocked_transfers_have_no_postings",
    "postings_have_provenance",
    "issuances_authorized",
];

/// Publishes a check as `tally_ledger_invariant_ok{invariant}` gauges.
pub fn publish(check: &LedgerCheck, metrics: &Metrics) {
    for i in &check.invariants {
        metrics.ledger_invariant_ok.with_label_values(&[i.name]).set(i64::from(i.ok));
    }
}
