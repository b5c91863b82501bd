-- The API client that created each transfer and order ('' when the intake does not
-- authenticate its callers), and idempotency scoped per client: two clients may use the
-- same Idempotency-Key, or the same externalReference, without meeting.
ALTER TABLE transfers ADD COLUMN client VARCHAR(64) NOT NULL DEFAULT '';
ALTER TABLE transfers DROP CONSTRAINT transfers_idempotency_key_key;
ALTER TABLE transfers ADD CONSTRAINT transfers_client_idempotency_key_key UNIQUE (client, idempotency_key);

ALTER TABLE orders ADD COLUMN client VARCHAR(64) NOT NULL DEFAULT '';
ALTER TABLE orders DROP CONSTRAINT orders_external_reference_key;
ALTER TABLE orders ADD CONSTRAINT orders_client_external_reference_key UNIQUE (client, external_reference);
