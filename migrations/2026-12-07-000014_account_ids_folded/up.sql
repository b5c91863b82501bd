-- Account ids are unique regardless of letter case: `ACC-1` cannot be opened beside
-- `acc-1`, which a person reading a log or typing an id could not tell apart. (New ids
-- are ASCII letters, digits and . _ : @ + -, checked by the intake: case is the one
-- difference left to fold.) The index is built under a write lock on accounts: seconds
-- for a million accounts.
SET LOCAL lock_timeout = '5s';

DO $$
DECLARE
    twins text;
BEGIN
    SELECT string_agg(ids, '; ') INTO twins FROM (
        SELECT string_agg(id, ', ' ORDER BY id) AS ids FROM accounts GROUP BY lower(id) HAVING count(*) > 1 LIMIT 10
    ) AS t;
    IF twins IS NOT NULL THEN
        RAISE EXCEPTION 'account ids that differ only in letter case exist (%): rename all but one of each first', twins;
    END IF;
END
$$;

CREATE UNIQUE INDEX accounts_id_folded ON accounts (lower(id));
