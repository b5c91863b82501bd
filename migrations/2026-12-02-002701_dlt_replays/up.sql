-- Every replay of a dead letter, from a DLT topic or the dead_letters table: a DLT topic's
-- records cannot be marked (Kafka records are immutable and stay until retention), so the
-- admin API looks here before a replay and warns about records already replayed.
--
-- source            the DLT topic, or 'dead_letters' for a row of that table
-- source_partition  the record's partition in its DLT topic (NULL for a table row)
-- source_offset     the record's offset in its DLT topic, or the table row's id
-- original_topic    where the copy was produced
-- original_partition, replayed_offset  where the copy landed
-- record_key        the record's key
-- replayed_at       when the broker acknowledged the copy
CREATE TABLE dlt_replays (
    id                 BIGSERIAL PRIMARY KEY,
    source             VARCHAR(255) NOT NULL,
    source_partition   INTEGER,
    source_offset      BIGINT       NOT NULL,
    original_topic     VARCHAR(255) NOT NULL,
    original_partition INTEGER      NOT NULL,
    replayed_offset    BIGINT       NOT NULL,
    record_key         BYTEA,
    replayed_at        TIMESTAMPTZ  NOT NULL DEFAULT now()
);
CREATE INDEX dlt_replays_record ON dlt_replays (source, source_partition, source_offset);

-- The console's transfer list searches by account (either side), newest first. Both
-- statements lock transfers against writes while they build: give up (and let the start
-- fail, to be retried) rather than queue the money path behind a long transaction.
SET LOCAL lock_timeout = '5s';
CREATE INDEX transfers_source_account ON transfers (source_account, id);
CREATE INDEX transfers_destination_account ON transfers (destination_account, id);
