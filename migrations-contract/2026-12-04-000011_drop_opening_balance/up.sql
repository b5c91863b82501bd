-- The contract step of 2026-12-04-000010_owners_and_issuance, applied by
-- `tally migrate --contract` once no instance of an older release runs: opening balances
-- are issuance postings, and the column an older release wrote them to goes.
SET LOCAL lock_timeout = '5s';
DROP TRIGGER accounts_opening ON accounts;
DROP FUNCTION tally_account_opening();
ALTER TABLE accounts DROP COLUMN opening_balance_cents;
