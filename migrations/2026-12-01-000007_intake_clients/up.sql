-- The API client that created each transfer and order ('' when the intake does not
-- authenticate its callers), and idempotency scoped per client: two clients may use the
-- same Idempotency-Key, or the same externalReference, without meeting.
-- Every statement here locks its table: give up (and let the start fail, to be retried)
-- rather than queue the money path behind a long transaction.
SET LOCAL lock_timeout = '5s';

ALTER TABLE transfers ADD COLUMN client VARCHAR(64) NOT NULL DEFAULT '';
ALTER TABLE transfers DROP CONSTRAINT transfers_idempotency_key_key;
ALTER TABLE transfers ADD CONSTRAINT transfers_client_idempotency_key_key UNIQUE (client, idempotency_key);

ALTER TABLE orders ADD COLUMN client VARCHAR(64) NOT NULL DEFAULT '';
ALTER TABLE orders DROP CONSTRAINT orders_external_reference_key;
ALTER TABLE orders ADD CONSTRAINT orders_client_external_reference_key UNIQUE (client, external_reference);
