-- The contract step of 2026-12-07-000012_issuance_audit, applied by
-- `tally migrate --contract` once no instance of an older release runs: no INSERT issues
-- money any more. An account inserted with a balance then holds money without postings,
-- which the ledger check reports (`balances_match_postings`).
SET LOCAL lock_timeout = '5s';
DROP TRIGGER accounts_issued ON accounts;
DROP FUNCTION tally_accounts_issued();
