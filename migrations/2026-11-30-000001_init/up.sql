-- tally: every table of the engine, created up front so later work adds
-- logic rather than schema churn. Money is BIGINT cents, currency CHAR(3).

-- Intake: one row per accepted transfer request.
CREATE TABLE transfers (
    id                  UUID         PRIMARY KEY,
    source_account      VARCHAR(32)  NOT NULL,
    destination_account VARCHAR(32)  NOT NULL,
    amount_cents        BIGINT       NOT NULL CHECK (amount_cents > 0),
    currency            CHAR(3)      NOT NULL,
    status              VARCHAR(20)  NOT NULL CHECK (status IN ('PENDING', 'SETTLED', 'REJECTED')),
    rejection_reason    TEXT,
    idempotency_key     VARCHAR(255) UNIQUE,
    created_at          TIMESTAMPTZ  NOT NULL DEFAULT now(),
    updated_at          TIMESTAMPTZ  NOT NULL DEFAULT now(),
    CHECK (source_account <> destination_account)
);

-- Transactional outbox, shared by every producer of events.
-- `seq` orders rows of one key; `shard` partitions the key space so that one publisher at
-- a time owns a key (advisory lock per shard), which keeps per-key order with several
-- publishers. Unpublished rows are found through the partial index.
CREATE TABLE outbox_events (
    id           UUID         PRIMARY KEY,
    seq          BIGSERIAL    NOT NULL UNIQUE,
    topic        VARCHAR(255) NOT NULL,
    key          VARCHAR(64)  NOT NULL,
    event_type   VARCHAR(100) NOT NULL,
    payload      TEXT         NOT NULL,
    traceparent  VARCHAR(55),
    shard        INTEGER      NOT NULL GENERATED ALWAYS AS ((hashtext(key) & 2147483647) % 64) STORED,
    created_at   TIMESTAMPTZ  NOT NULL DEFAULT now(),
    published_at TIMESTAMPTZ
);

CREATE INDEX outbox_events_pending ON outbox_events (seq) WHERE published_at IS NULL;
CREATE INDEX outbox_events_published ON outbox_events (published_at) WHERE published_at IS NOT NULL;

-- Wake the publisher when rows commit (NOTIFY is delivered at commit, once per statement).
CREATE FUNCTION tally_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('tally_outbox', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_events_notify
    AFTER INSERT ON outbox_events
    FOR EACH STATEMENT EXECUTE FUNCTION tally_outbox_notify();

-- Ledger: accounts, double-entry postings and the inbox of processed transfers.
CREATE TABLE accounts (
    id                    VARCHAR(32) PRIMARY KEY,
    balance_cents         BIGINT      NOT NULL CHECK (balance_cents >= 0),
    currency              CHAR(3)     NOT NULL,
    -- The balance at creation, so that the ledger check can prove
    -- balance = opening + credits - debits for every account. Filled in by the trigger
    -- below when an insert leaves it out.
    opening_balance_cents BIGINT      NOT NULL,
    created_at            TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE FUNCTION tally_account_opening() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.opening_balance_cents := COALESCE(NEW.opening_balance_cents, NEW.balance_cents);
    RETURN NEW;
END;
$$;

CREATE TRIGGER accounts_opening
    BEFORE INSERT ON accounts
    FOR EACH ROW EXECUTE FUNCTION tally_account_opening();

CREATE TABLE postings (
    id           BIGSERIAL   PRIMARY KEY,
    transfer_id  UUID        NOT NULL,
    account_id   VARCHAR(32) NOT NULL REFERENCES accounts (id),
    kind         CHAR(1)     NOT NULL CHECK (kind IN ('D', 'C')),
    amount_cents BIGINT      NOT NULL CHECK (amount_cents > 0),
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- A transfer has at most one debit and one credit: a second application is impossible
    -- even if the inbox row were bypassed.
    UNIQUE (transfer_id, kind)
);

CREATE INDEX postings_account ON postings (account_id, id);

CREATE TABLE processed_transfers (
    transfer_id  UUID        PRIMARY KEY,
    outcome      VARCHAR(20) NOT NULL,
    reason       TEXT,
    processed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Orders: reception keyed by the business idempotency key, consumption keyed by
-- the aggregate identity.
CREATE TABLE orders (
    id                 UUID         PRIMARY KEY,
    external_reference VARCHAR(128) NOT NULL UNIQUE,
    customer_id        VARCHAR(64)  NOT NULL,
    amount_cents       BIGINT       NOT NULL CHECK (amount_cents > 0),
    currency           CHAR(3)      NOT NULL,
    lines              JSONB,
    created_at         TIMESTAMPTZ  NOT NULL DEFAULT now()
);

CREATE TABLE received_orders (
    order_id           UUID         PRIMARY KEY,
    event_id           UUID         NOT NULL,
    external_reference VARCHAR(128) NOT NULL,
    customer_id        VARCHAR(64)  NOT NULL,
    amount_cents       BIGINT       NOT NULL,
    currency           CHAR(3)      NOT NULL,
    received_at        TIMESTAMPTZ  NOT NULL DEFAULT now()
);

-- Notifications: one row per delivered event, so a retry never sends twice
-- after a success.
CREATE TABLE notification_deliveries (
    event_id        UUID         PRIMARY KEY,
    topic           VARCHAR(255) NOT NULL,
    transfer_id     UUID         NOT NULL,
    attempts        INTEGER      NOT NULL,
    response_status INTEGER      NOT NULL,
    delivered_at    TIMESTAMPTZ  NOT NULL DEFAULT now()
);
