DROP INDEX outbox_events_held;
DROP INDEX outbox_events_parked_due;
DROP INDEX outbox_events_parked;
DROP INDEX outbox_events_pending;
CREATE INDEX outbox_events_pending ON outbox_events (seq) WHERE published_at IS NULL;
ALTER TABLE outbox_events
    DROP COLUMN held,
    DROP COLUMN retry_at,
    DROP COLUMN park_error,
    DROP COLUMN park_reason,
    DROP COLUMN parked_at,
    DROP COLUMN attempts;
