-- The contract step of 2026-12-07-000012_issuance_audit, applied by
-- `tally migrate --contract` once no instance of an older release runs: no INSERT issues
-- money any more, and tally_issue no longer audits an issuance as the older release's
-- (every issuance then writes its own client's row). An account inserted with a balance
-- holds money without postings, which the ledger check reports
-- (`balances_match_postings`).
SET LOCAL lock_timeout = '5s';
DROP TRIGGER accounts_issued ON accounts;
DROP FUNCTION tally_accounts_issued();
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
END;
$$;
