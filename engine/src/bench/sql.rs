//! Every SQL statement of the bench: creating and filling its throwaway databases, reading
//! what the stages wrote to measure them, and the baseline's one statement that tally does
//! not have. tally's own statements stay in `tally_actors::store`; the floor's copies of
//! them are in [`floor`].

pub mod floor;

/// `ACC-00042` of an integer column `i`: the ids the bench creates in the database
/// (`super::account` in Rust). `lpad` alone truncates to its length (`lpad('100000', 5)` is
/// `10000`, a duplicate key past 99,999 accounts); padding to at least 5 digits is what
/// `{i:05}` does.
pub const ACCOUNT_ID_SQL: &str = "'ACC-' || lpad(i::text, greatest(5, length(i::text)), '0')";

/// Drops database `name` (its sessions ended).
#[must_use]
pub fn drop_database(name: &str) -> String {
    format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")
}

/// Inserts `$1` PENDING transfers over `$2` accounts; returns their ids and source accounts.
#[must_use]
pub fn insert_pending_transfers() -> String {
    format!(
        "INSERT INTO transfers (id, source_account, destination_account, amount_cents, currency, status) \
         SELECT gen_random_uuid(), {ACCOUNT_ID_SQL}, \
                (SELECT {ACCOUNT_ID_SQL} FROM (SELECT (s.i + 1) % $2 AS i) AS d), 1 + g % 1000, 'BRL', 'PENDING' \
         FROM (SELECT g, g % $2 AS i FROM generate_series(0, $1 - 1) AS g) AS s \
         RETURNING id::text, source_account"
    )
}

/// Adds `$1` to the balance of account `$2` (the classic consumer's balance update).
pub const ADD_TO_BALANCE: &str = "UPDATE accounts SET balance_cents = balance_cents + $1 WHERE id = $2";

// The outbox.

/// How many outbox rows are not published yet.
pub const OUTBOX_PENDING: &str = "SELECT count(*) FROM outbox_events WHERE published_at IS NULL";

/// Inserts `$1` committed, unpublished outbox rows (`TransferRequested` to
/// `transfers.requested`, 1,000 keys, 200-byte payloads).
pub const OUTBOX_INSERT_PENDING: &str = "INSERT INTO outbox_events (id, topic, key, event_type, payload) \
     SELECT gen_random_uuid(), 'transfers.requested', 'K-' || (i % 1000), 'TransferRequested', \
            repeat('x', 200) FROM generate_series(1, $1) AS i";

/// Rows, and seconds from the first publication to the last.
pub const OUTBOX_PUBLISHED_SPAN: &str =
    "SELECT count(*), EXTRACT(EPOCH FROM max(published_at) - min(published_at))::float8 FROM outbox_events";

/// Seconds from the first publication to each.
pub const OUTBOX_PUBLISHED_OFFSETS: &str =
    "SELECT EXTRACT(EPOCH FROM published_at - (SELECT min(published_at) FROM outbox_events))::float8 \
     FROM outbox_events";

pub const OUTBOX_DELETE_ALL: &str = "DELETE FROM outbox_events";

/// Commit to publication of every row, ms.
pub const OUTBOX_COMMIT_TO_PUBLISH_MS: &str =
    "SELECT (EXTRACT(EPOCH FROM published_at - created_at) * 1000)::float8 FROM outbox_events";

// Transfers and their final status.

pub const TRANSFERS_PENDING: &str = "SELECT count(*) FROM transfers WHERE status = 'PENDING'";

/// The database's clock, in seconds since the Unix epoch: where a phase starts.
pub const NOW_EPOCH: &str = "SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8";

/// The transfers a phase made: requested since `$1` (seconds since the epoch), finished.
/// Issuances and earlier phases' transfers stay in the ledger, uncounted.
const PHASE_FINISHED: &str = "kind = 'transfer' AND created_at >= to_timestamp($1) AND status <> 'PENDING'";

/// The phase's finished transfers, and seconds from the first creation to the last final
/// status.
#[must_use]
pub fn transfers_finished_span() -> String {
    format!(
        "SELECT count(*), COALESCE(EXTRACT(EPOCH FROM max(updated_at) - min(created_at)), 0)::float8 \
         FROM transfers WHERE {PHASE_FINISHED}"
    )
}

/// Creation to final status of each of the phase's finished transfers, ms.
#[must_use]
pub fn transfers_final_ms() -> String {
    format!("SELECT (EXTRACT(EPOCH FROM updated_at - created_at) * 1000)::float8 FROM transfers WHERE {PHASE_FINISHED}")
}

/// Seconds from the phase's first creation to each final status.
#[must_use]
pub fn transfers_final_offsets() -> String {
    format!(
        "SELECT EXTRACT(EPOCH FROM updated_at - (SELECT min(created_at) FROM transfers WHERE {PHASE_FINISHED}))::float8 \
         FROM transfers WHERE {PHASE_FINISHED}"
    )
}

// Where the time went, hop by hop (`super::hops`).

/// `column` (a timestamp) in ms since the Unix epoch.
fn ms(column: &str) -> String {
    format!("(EXTRACT(EPOCH FROM {column}) * 1000)::float8")
}

/// Transfer id, event type and publication time (ms) of the published requested and settled
/// events.
#[must_use]
pub fn hops_published() -> String {
    format!(
        "SELECT payload::jsonb ->> 'transferId', event_type::text, {} FROM outbox_events \
         WHERE event_type IN ('TransferRequested', 'TransferSettled') AND published_at IS NOT NULL",
        ms("published_at")
    )
}

/// Id, creation, antifraud decision, settlement and final status (ms) of every transfer
/// requested since `$1` (seconds since the epoch) and settled.
#[must_use]
pub fn hops_settled() -> String {
    format!(
        "SELECT t.id::text, {}, {}, {}, {} FROM transfers t \
         JOIN antifraud_decisions d ON d.transfer_id = t.id \
         JOIN processed_transfers p ON p.transfer_id = t.id \
         WHERE t.status = 'SETTLED' AND t.created_at >= to_timestamp($1)",
        ms("t.created_at"),
        ms("d.decided_at"),
        ms("p.processed_at"),
        ms("t.updated_at")
    )
}

// A stage alone (`super::stages::alone`).

/// How many of `records` rows are not in `table` yet.
#[must_use]
pub fn rows_left(records: usize, table: &str) -> String {
    format!("SELECT {records} - count(*) FROM {table}")
}

/// The first and last `column` (epoch seconds) of the rows of `table` matching `rows`,
/// and how many rows have the first.
#[must_use]
pub fn completion_span(table: &str, column: &str, rows: &str) -> String {
    format!(
        "SELECT EXTRACT(EPOCH FROM s.first)::float8, EXTRACT(EPOCH FROM s.last)::float8, \
                (SELECT count(*) FROM {table} WHERE {column} = s.first AND {rows}) \
         FROM (SELECT min({column}) AS first, max({column}) AS last FROM {table} WHERE {rows}) AS s"
    )
}

// The ledger's inbox (`super::scale`, `super::soak`).

pub const PROCESSED_COUNT: &str = "SELECT count(*) FROM processed_transfers p \
     WHERE NOT EXISTS (SELECT 1 FROM transfers t WHERE t.id = p.transfer_id AND t.kind = 'issuance')";

/// Id and settlement time (ms since the epoch) of the transfers `$1` (text ids).
pub const PROCESSED_AT_MS: &str =
    "SELECT transfer_id::text, (EXTRACT(EPOCH FROM processed_at) * 1000)::float8 FROM processed_transfers \
     WHERE transfer_id = ANY($1::text[]::uuid[])";

pub const POSTINGS_COUNT: &str = "SELECT count(*) FROM postings";

// The database server (`super::soak`).

pub const SERVER_VERSION_NUM: &str = "SELECT current_setting('server_version_num')::int";

/// WAL position (bytes) and checkpoints timed and requested, PostgreSQL 17 and later.
pub const WAL_AND_CHECKPOINTS: &str = "SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::float8, num_timed, \
     num_requested FROM pg_stat_checkpointer";

/// [`WAL_AND_CHECKPOINTS`] before PostgreSQL 17.
pub const WAL_AND_CHECKPOINTS_BEFORE_17: &str = "SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::float8, \
     checkpoints_timed, checkpoints_req FROM pg_stat_bgwriter";

/// Seconds from the first settlement transaction's start to the last one's.
pub const SETTLED_SPAN: &str =
    "SELECT EXTRACT(EPOCH FROM max(processed_at) - min(processed_at))::float8 FROM processed_transfers";
