ALTER TABLE orders DROP CONSTRAINT orders_client_external_reference_key;
ALTER TABLE orders ADD CONSTRAINT orders_external_reference_key UNIQUE (external_reference);
ALTER TABLE orders DROP COLUMN client;

ALTER TABLE transfers DROP CONSTRAINT transfers_client_idempotency_key_key;
ALTER TABLE transfers ADD CONSTRAINT transfers_idempotency_key_key UNIQUE (idempotency_key);
ALTER TABLE transfers DROP COLUMN client;
