-- Accounts have an owner and money has an origin.
--
-- owner   the API client that opened the account ('' for the anonymous scope of an intake
--         that does not authenticate): the only one that may debit it or read it.
-- kind    'customer', or 'issuance': one account per currency, named 'issuance:<CUR>',
--         whose balance is minus everything ever issued in that currency, so that the sum
--         of all balances of a currency is zero.
-- transfers.kind  'transfer' (between two customer accounts, through antifraud and the
--         ledger) or 'issuance' (from the issuance account, settled at once).
--
-- Expand only: a release that does not know these columns keeps working on this schema
-- during a rolling upgrade (its opening balances are issued by the trigger below). The
-- contract step, `tally migrate --contract` once every instance runs this release, drops
-- accounts.opening_balance_cents (migrations-contract/).
SET LOCAL lock_timeout = '5s';

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM accounts WHERE id LIKE 'issuance:%') THEN
        RAISE EXCEPTION 'accounts named issuance:* exist; that prefix is now reserved for issuance accounts: rename them first';
    END IF;
END
$$;

ALTER TABLE accounts ADD COLUMN owner VARCHAR(64) NOT NULL DEFAULT '';
ALTER TABLE accounts ADD COLUMN kind VARCHAR(10) NOT NULL DEFAULT 'customer'
    CHECK (kind IN ('customer', 'issuance'));
ALTER TABLE accounts DROP CONSTRAINT accounts_balance_cents_check;
ALTER TABLE accounts ADD CONSTRAINT accounts_balance_sign
    CHECK (CASE kind WHEN 'issuance' THEN balance_cents <= 0 ELSE balance_cents >= 0 END);
-- The name is the kind: no customer account (not even one an older release opens during
-- the upgrade) can take an issuance account's name.
ALTER TABLE accounts ADD CONSTRAINT accounts_issuance_name
    CHECK ((kind = 'issuance') = (id LIKE 'issuance:%'));
ALTER TABLE transfers ADD COLUMN kind VARCHAR(10) NOT NULL DEFAULT 'transfer'
    CHECK (kind IN ('transfer', 'issuance'));

-- Issues amounts[i] of currencies[i] to accounts[i] as transfer transfer_ids[i] of client
-- clients[i], at at[i]: the transfer row (unless it exists), its settlement in the inbox,
-- a debit of the currency's issuance account (created on first use) and a credit of the
-- account, and the issuance account's balance. The credited accounts' balances are the
-- caller's: an inserted account already holds its opening balance, a top-up adds it.
-- Customer rows are locked before issuance rows, by every caller.
CREATE FUNCTION tally_issue(transfer_ids uuid[], accounts varchar[], currencies text[], amounts bigint[],
                            clients varchar[], at timestamptz[]) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO accounts (id, balance_cents, currency, kind, owner)
    SELECT DISTINCT 'issuance:' || c, 0, c, 'issuance', '' FROM unnest(currencies) AS c
    ON CONFLICT (id) DO NOTHING;
    PERFORM 1 FROM accounts WHERE id IN (SELECT 'issuance:' || c FROM unnest(currencies) AS c) ORDER BY id FOR UPDATE;
    INSERT INTO transfers (id, source_account, destination_account, amount_cents, currency, status, kind, client,
                           created_at, updated_at)
    SELECT t, 'issuance:' || c, a, n, c, 'SETTLED', 'issuance', cl, w, w
    FROM unnest(transfer_ids, accounts, currencies, amounts, clients, at) AS u(t, a, c, n, cl, w)
    ON CONFLICT (id) DO NOTHING;
    INSERT INTO processed_transfers (transfer_id, outcome, processed_at)
    SELECT t, 'SETTLED', w FROM unnest(transfer_ids, at) AS u(t, w);
    INSERT INTO postings (transfer_id, account_id, kind, amount_cents, created_at)
    SELECT t, 'issuance:' || c, 'D', n, w FROM unnest(transfer_ids, currencies, amounts, at) AS u(t, c, n, w)
    UNION ALL
    SELECT t, a, 'C', n, w FROM unnest(transfer_ids, accounts, amounts, at) AS u(t, a, n, w);
    UPDATE accounts AS i SET balance_cents = i.balance_cents - s.total
    FROM (SELECT 'issuance:' || c AS id, sum(n) AS total FROM unnest(currencies, amounts) AS u(c, n) GROUP BY 1) AS s
    WHERE i.id = s.id AND i.kind = 'issuance';
END;
$$;

-- Every customer account inserted with a balance (an older release's POST /accounts, a
-- test's or an operator's INSERT) has that balance issued, with postings, from the
-- issuance account of its currency: no balance appears from nowhere. One statement, one
-- issuance, however many rows it inserted.
CREATE FUNCTION tally_accounts_issued() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tally_issue(array_agg(gen_random_uuid()), array_agg(id), array_agg(currency::text),
                        array_agg(balance_cents), array_agg(owner), array_agg(created_at))
    FROM inserted WHERE kind = 'customer' AND balance_cents > 0
    HAVING count(*) > 0;
    RETURN NULL;
END;
$$;

CREATE TRIGGER accounts_issued AFTER INSERT ON accounts REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION tally_accounts_issued();

-- Opening balances are postings now: the column stays 0 until the contract step drops it.
CREATE OR REPLACE FUNCTION tally_account_opening() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.opening_balance_cents := 0;
    RETURN NEW;
END;
$$;

-- Every opening balance so far, issued as it would be now.
SELECT tally_issue(array_agg(gen_random_uuid()), array_agg(id), array_agg(currency::text),
                   array_agg(opening_balance_cents), array_agg(''::varchar), array_agg(created_at))
FROM accounts WHERE kind = 'customer' AND opening_balance_cents > 0
HAVING count(*) > 0;
UPDATE accounts SET opening_balance_cents = 0 WHERE opening_balance_cents <> 0;
