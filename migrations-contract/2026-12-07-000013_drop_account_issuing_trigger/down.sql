-- Older releases' issuances are audited, and their opening balances issued as they
-- land, again (expand's rules).
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

CREATE FUNCTION tally_accounts_issued() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE TRIGGER accounts_issued AFTER INSERT ON accounts REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION tally_accounts_issued();
