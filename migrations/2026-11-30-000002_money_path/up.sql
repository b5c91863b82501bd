-- Decisions that stand and dead letters that cannot be lost.

-- The first antifraud decision for a transfer. It is written before the Kafka transaction
-- that publishes it commits, and every later delivery of the same transfer publishes it
-- again (same event id, outcome, score and reason), so restarts, rebalances and outbox
-- republishes never flip a decision. `requested_at` and `source_account` let a restarted
-- instance rebuild the velocity window from stored decisions; the destination, amount and
-- currency let it refuse a later request under the same id that asks for something else.
CREATE TABLE antifraud_decisions (
    transfer_id         UUID        PRIMARY KEY,
    source_account      VARCHAR(32) NOT NULL,
    destination_account VARCHAR(32) NOT NULL,
    amount_cents        BIGINT      NOT NULL,
    currency            CHAR(3)     NOT NULL,
    outcome             VARCHAR(20) NOT NULL CHECK (outcome IN ('ANALYZED', 'BLOCKED')),
    score               INTEGER     NOT NULL,
    reason              TEXT,
    requested_at        TIMESTAMPTZ NOT NULL,
    decided_at          TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX antifraud_decisions_requested ON antifraud_decisions (requested_at);

-- Records whose dead-letter topic write can never succeed (too large once the dlt-*
-- headers are added, a partition or topic missing, forbidden). Same metadata as the dlt-*
-- headers; key, payload and the original headers as they were. One row per consumed
-- record and group, so a redelivered record is not dead-lettered twice.
CREATE TABLE dead_letters (
    id                 BIGSERIAL    PRIMARY KEY,
    original_topic     VARCHAR(255) NOT NULL,
    original_partition INTEGER      NOT NULL,
    original_offset    BIGINT       NOT NULL,
    original_timestamp BIGINT,
    consumer_group     VARCHAR(255) NOT NULL,
    exception_kind     VARCHAR(20)  NOT NULL,
    exception_message  TEXT         NOT NULL,
    attempts           INTEGER      NOT NULL,
    record_key         BYTEA,
    payload            BYTEA,
    -- [{"key": "...", "value": "<base64>" | null}, ...] in the record's order.
    headers            JSONB        NOT NULL DEFAULT '[]',
    -- Why the dead-letter topic refused the record.
    dlt_error          TEXT         NOT NULL,
    created_at         TIMESTAMPTZ  NOT NULL DEFAULT now(),
    replayed_at        TIMESTAMPTZ,
    UNIQUE (consumer_group, original_topic, original_partition, original_offset)
);
