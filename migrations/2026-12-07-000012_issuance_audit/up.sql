-- Every issuance says on whose authority money entered the ledger, in a row written in
-- the transaction that issued it:
--
-- authority  'api': a client the intake found holding the `issue` scope at the time (an
--            opening balance of POST /accounts, or POST /issuances);
--            'older-release': an issuance of an instance of the older release during the
--            rolling upgrade (its opening balances and top-ups, on its pools' connections,
--            whose application_name is tally-*);
--            'before-audit': issued before this table existed.
--
-- The ledger check's `issuances_authorized` requires a row for every issuance, naming the
-- transfer's own client. An account INSERTed with a balance is refused unless it comes
-- from tally's own connections (an older release opening an account); the contract step
-- drops that trigger and the older release's audit, after which such an INSERT issues
-- nothing and fails `balances_match_postings`. These rules keep mistakes out, not someone
-- with write access to the database (who can do anything): the check is what catches
-- either.
SET LOCAL lock_timeout = '5s';
-- No issuance commits while the audit is set up and backfilled: every one is either
-- backfilled or made under the new rules.
LOCK TABLE transfers IN SHARE MODE;

CREATE TABLE issuance_audit (
    transfer_id UUID PRIMARY KEY REFERENCES transfers (id),
    client VARCHAR(64) NOT NULL,
    authority VARCHAR(16) NOT NULL CHECK (authority IN ('api', 'older-release', 'before-audit')),
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION tally_issue(transfer_ids uuid[], accounts varchar[], currencies text[], amounts bigint[],
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
    -- An issuance made while the audit existed, on a connection of tally's (an older
    -- release's top-up or opening balance, during the rolling upgrade): audited as that
    -- release's. This release's own issuances overwrite the row with their client's
    -- authority ('api') in the same transaction; the contract step removes this.
    IF current_setting('application_name', true) LIKE 'tally-%' THEN
        INSERT INTO issuance_audit (transfer_id, client, authority)
        SELECT t, cl, 'older-release' FROM unnest(transfer_ids, clients) AS u(t, cl)
        ON CONFLICT (transfer_id) DO NOTHING;
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION tally_accounts_issued() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted WHERE kind = 'customer' AND balance_cents > 0)
       AND COALESCE(current_setting('application_name', true), '') NOT LIKE 'tally-%' THEN
        RAISE EXCEPTION 'an account inserted with a balance would mint money: money enters only by issuance, through tally (POST /accounts or POST /issuances by a client with the issue scope)'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM tally_issue(array_agg(gen_random_uuid()), array_agg(id), array_agg(currency::text),
                        array_agg(balance_cents), array_agg(owner), array_agg(created_at))
    FROM inserted WHERE kind = 'customer' AND balance_cents > 0
    HAVING count(*) > 0;
    RETURN NULL;
END;
$$;

INSERT INTO issuance_audit (transfer_id, client, authority)
SELECT id, client, 'before-audit' FROM transfers WHERE kind = 'issuance';
