//! The statements of `tally bench floor` (`super::super::floor`) that it does not take
//! from tally itself: copies of tally's own statements from `tally_actors::store`, with the
//! same shapes and bind types, so the floor pays what PostgreSQL pays for them and nothing
//! of tally's machinery. A change to one of tally's statements belongs here too (the
//! module each is copied from is named). The ledger's batch and outbox inserts are not
//! copied: the floor calls `settle_batch` and `outbox::insert_columns` themselves.

/// The intake's insert of PENDING transfers, idempotent per (client, key); returns every
/// column of the rows written, as the intake does (diesel's multi-row `VALUES` there, the
/// same rows here as arrays).
pub const INSERT_TRANSFERS: &str = "INSERT INTO transfers (id, source_account, destination_account, amount_cents, \
            currency, status, rejection_reason, idempotency_key, created_at, updated_at, client) \
     SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[], \
                          $8::text[], $9::timestamptz[], $9::timestamptz[], $10::text[]) \
     ON CONFLICT (client, idempotency_key) DO NOTHING \
     RETURNING id, source_account, destination_account, amount_cents, currency, status, rejection_reason, \
               idempotency_key, created_at, updated_at, client";

// The outbox publisher (`store::outbox`).

/// `outbox::lock_free_shards`: `$1` shards, lock space `$2`, at most `$3` of them.
pub const LOCK_FREE_SHARDS: &str = "SELECT shard FROM (SELECT shard FROM generate_series(0, $1 - 1) AS shard \
                        ORDER BY random()) AS s \
     WHERE pg_try_advisory_xact_lock($2, shard) LIMIT $3";

/// What `outbox::claim_pending` sets before its claim.
pub const CLAIM_SETTING: &str = "SET LOCAL enable_bitmapscan = off";

/// `outbox::claim_pending`: up to `$2` publishable rows of shards `$1`, in `seq` order.
pub const CLAIM_PENDING: &str = "SELECT o.id, o.seq, o.topic, o.key, o.event_type, o.payload, o.traceparent, \
            o.created_at, o.attempts, false AS parked, \
            (SELECT EXISTS (SELECT 1 FROM outbox_events AS a \
                            WHERE a.published_at IS NULL AND a.parked_at IS NOT NULL)) \
            AND EXISTS (SELECT 1 FROM outbox_events AS p \
                        WHERE p.published_at IS NULL AND p.parked_at IS NOT NULL \
                          AND p.key = o.key AND p.topic = o.topic) AS behind_parked, \
            (SELECT EXISTS (SELECT 1 FROM outbox_events AS a \
                            WHERE a.published_at IS NULL AND a.parked_at IS NOT NULL)) AS any_parked \
     FROM outbox_events AS o \
     WHERE o.published_at IS NULL AND o.parked_at IS NULL AND NOT o.held AND o.shard = ANY($1) \
     ORDER BY o.seq LIMIT $2 FOR UPDATE OF o SKIP LOCKED";

/// `outbox::mark_published` (diesel's `eq_any` is `= ANY($1)`).
pub const MARK_PUBLISHED: &str =
    "UPDATE outbox_events SET published_at = statement_timestamp() WHERE id = ANY($1::uuid[])";

// Antifraud (`store::decisions`).

/// `decisions::load`: the stored decisions of `$1`.
pub const LOAD_DECISIONS: &str = "SELECT transfer_id, source_account::text AS source_account, \
     destination_account::text AS destination_account, amount_cents, currency::text AS currency, \
     outcome::text AS outcome, score, reason, requested_at, decided_at \
     FROM antifraud_decisions WHERE transfer_id = ANY($1)";

/// `decisions::store`: new decisions, unless one is there; returns the ids inserted.
pub const STORE_DECISIONS: &str = "INSERT INTO antifraud_decisions (transfer_id, source_account, \
            destination_account, amount_cents, currency, outcome, score, reason, requested_at, decided_at) \
     SELECT * FROM unnest($1::uuid[], $2::text[], $8::text[], $9::bigint[], $10::text[], $3::text[], $4::int[], \
                          $5::text[], $6::timestamptz[], $7::timestamptz[]) \
     ON CONFLICT (transfer_id) DO NOTHING RETURNING transfer_id";

// The status projection (`store::transfers::finish_all`).

/// Moves every PENDING transfer of `$1` to its final status; returns those that moved.
pub const FINISH_ALL: &str = "UPDATE transfers t SET status = u.status, rejection_reason = u.reason, \
            updated_at = now() \
     FROM unnest($1::uuid[], $2::text[], $3::text[]) AS u(id, status, reason) \
     WHERE t.id = u.id AND t.status = 'PENDING' \
     RETURNING t.id";
