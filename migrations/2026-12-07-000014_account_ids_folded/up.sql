-- Account ids are unique regardless of letter case: `ACC-1` cannot be opened beside
-- `acc-1`, which a person reading a log or typing an id could not tell apart. (New ids
-- are ASCII letters, digits and . _ : @ + -, checked by the intake: case is the one
-- difference left to fold.) The issuance accounts' prefix is theirs in any letter case:
-- a customer account `Issuance:EUR`, which an older release could open, would otherwise
-- take the name of EUR's issuance account. The index is built under a write lock on
-- accounts (migrations run in a transaction, so not concurrently): seconds for a million
-- accounts, during which opening accounts and settling wait.
SET LOCAL lock_timeout = '5s';

DO $$
DECLARE
    twins text;
    prefixed text;
BEGIN
    SELECT string_agg(ids, '; ') INTO twins FROM (
        SELECT string_agg(id, ', ' ORDER BY id) AS ids FROM accounts WHERE kind = 'customer'
        GROUP BY lower(id) HAVING count(*) > 1 LIMIT 10
    ) AS t;
    IF twins IS NOT NULL THEN
        RAISE EXCEPTION 'account ids that differ only in letter case exist (%): rename all but one of each first', twins;
    END IF;
    SELECT string_agg(id, ', ' ORDER BY id) INTO prefixed FROM (
        SELECT id FROM accounts WHERE kind = 'customer' AND lower(id) LIKE 'issuance:%' LIMIT 10
    ) AS p;
    IF prefixed IS NOT NULL THEN
        RAISE EXCEPTION 'customer accounts named like issuance accounts exist (%): rename them first', prefixed;
    END IF;
END
$$;

ALTER TABLE accounts DROP CONSTRAINT accounts_issuance_name;
ALTER TABLE accounts ADD CONSTRAINT accounts_issuance_name
    CHECK ((kind = 'issuance') = (lower(id) LIKE 'issuance:%'));
-- Customer accounts only: the issuance accounts (`issuance:<CUR>`, one per currency, made by
-- tally_issue) are named by the rule above.
CREATE UNIQUE INDEX accounts_id_folded ON accounts (lower(id)) WHERE kind = 'customer';
