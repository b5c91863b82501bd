-- One row per stage, written by the dependency probe: before an error of unknown kind is
-- counted against a record, the stage checks that the database still takes a write.
CREATE TABLE heartbeats (
    stage   VARCHAR(255) PRIMARY KEY,
    beat_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
