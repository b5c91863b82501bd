-- Every issuance says on whose authority money entered the ledger, in a row written in
-- the transaction that issued it:
--
-- authority  'api': a client the intake found holding the `issue` scope at the time (an
--            opening balance of POST /accounts, or POST /issuances);
--            'older-release': an opening balance that an instance of an older release
--            inserted during the rolling upgrade (its pools' application_name is tally-*);
--            'before-audit': issued before this table existed.
--
-- The ledger check's `issuances_authorized` requires a row for every issuance, so money
-- minted by SQL (tally_issue called by hand) fails it. An account INSERTed with a balance
-- is refused unless it comes from tally's own connections (an older release opening an
-- account); the contract step drops that trigger, after which such an INSERT issues
-- nothing and fails `balances_match_postings`.
SET LOCAL lock_timeout = '5s';

CREATE TABLE issuance_audit (
    transfer_id UUID PRIMARY KEY REFERENCES transfers (id),
    client VARCHAR(64) NOT NULL,
    authority VARCHAR(16) NOT NULL CHECK (authority IN ('api', 'older-release', 'before-audit')),
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

INSERT INTO issuance_audit (transfer_id, client, authority)
SELECT id, client, 'before-audit' FROM transfers WHERE kind = 'issuance';

CREATE OR REPLACE FUNCTION tally_accounts_issued() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ids uuid[];
    ids_of varchar[];
    currencies text[];
    amounts bigint[];
    owners varchar[];
    at timestamptz[];
BEGIN
    SELECT array_agg(gen_random_uuid()), array_agg(id), array_agg(currency::text), array_agg(balance_cents),
           array_agg(owner), array_agg(created_at)
    INTO ids, ids_of, currencies, amounts, owners, at
    FROM inserted WHERE kind = 'customer' AND balance_cents > 0;
    IF ids IS NULL THEN
        RETURN NULL;
    END IF;
    IF current_setting('application_name', true) IS NULL
       OR current_setting('application_name', true) NOT LIKE 'tally%' THEN
        RAISE EXCEPTION 'an account inserted with a balance would mint money: money enters only by issuance, through tally (POST /accounts or POST /issuances by a client with the issue scope)'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM tally_issue(ids, ids_of, currencies, amounts, owners, at);
    INSERT INTO issuance_audit (transfer_id, client, authority)
    SELECT t, o, 'older-release' FROM unnest(ids, owners) AS u(t, o);
    RETURN NULL;
END;
$$;
