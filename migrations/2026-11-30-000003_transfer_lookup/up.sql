-- The operator console looks a transfer up across tables; every other table it reads is
-- reached through a primary key or an existing index. Notifications are off the money
-- path, so this index costs the ledger nothing.
CREATE INDEX notification_deliveries_transfer ON notification_deliveries (transfer_id);
