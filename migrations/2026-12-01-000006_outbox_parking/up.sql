-- Rows the broker refuses for good (record too large, topic not authorised, unknown topic)
-- are parked instead of stopping their shard: the row stays unpublished, is tried again at
-- retry_at (a slow, capped backoff over attempts, or at once through the admin API), and
-- the later rows of its topic and key wait behind it, held.
--
-- attempts     refusals of this row so far
-- parked_at    when the broker first refused it (kept once it is published)
-- park_reason  the refusal's code (message_too_large, topic_authorization_failed, ...)
-- park_error   the broker's or the client's error text
-- retry_at     when the publisher tries the parked row again
-- held         the row waits behind a parked row of its topic and key
ALTER TABLE outbox_events
    ADD COLUMN attempts    INTEGER     NOT NULL DEFAULT 0,
    ADD COLUMN parked_at   TIMESTAMPTZ,
    ADD COLUMN park_reason VARCHAR(40),
    ADD COLUMN park_error  TEXT,
    ADD COLUMN retry_at    TIMESTAMPTZ,
    ADD COLUMN held        BOOLEAN     NOT NULL DEFAULT false;

-- The claim walks only the rows it can publish: parked and held rows leave this index, so
-- however many wait behind a refused row, no claim reads them again.
DROP INDEX outbox_events_pending;
CREATE INDEX outbox_events_pending ON outbox_events (seq)
    WHERE published_at IS NULL AND parked_at IS NULL AND NOT held;
-- Parked rows by topic and key (does this row wait behind one?) and by due time (which to
-- try again); held rows by topic and key (released when their parked row is published).
-- All three are empty while the broker takes every row.
CREATE INDEX outbox_events_parked ON outbox_events (key, topic)
    WHERE published_at IS NULL AND parked_at IS NOT NULL;
CREATE INDEX outbox_events_parked_due ON outbox_events (retry_at)
    WHERE published_at IS NULL AND parked_at IS NOT NULL;
CREATE INDEX outbox_events_held ON outbox_events (key, topic)
    WHERE held;
