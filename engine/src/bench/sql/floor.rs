//! The statements of `tally bench floor` (`super::super::floor`) that it does not take
//! from tally itself: copies of tally's own statements from `tally_actors::store`, with the
//! same shapes and bind types, so the floor pays what PostgreSQL pays for them and nothing
//! of tally's machinery. A change to one of tally's statements belongs here too (the
//! module each is copied from is named). The ledger's batch, the outbox inserts and the
//! publisher's claim are not copied: the floor calls `settle_batch` and the `outbox`
//! store functions themselves.

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
