-- Issued money back into opening balances (the sum of each account's issuance credits),
-- then the issuance transfers, their postings and the issuance accounts removed.
UPDATE accounts AS a SET opening_balance_cents = s.issued
FROM (SELECT p.account_id, sum(p.amount_cents) AS issued FROM postings AS p JOIN transfers AS t ON t.id = p.transfer_id
      WHERE t.kind = 'issuance' AND p.kind = 'C' GROUP BY p.account_id) AS s
WHERE a.id = s.account_id;
DROP TRIGGER accounts_issued ON accounts;
DROP FUNCTION tally_accounts_issued();
DROP FUNCTION tally_issue(uuid[], varchar[], text[], bigint[], varchar[], timestamptz[]);
DELETE FROM postings WHERE transfer_id IN (SELECT id FROM transfers WHERE kind = 'issuance');
DELETE FROM processed_transfers WHERE transfer_id IN (SELECT id FROM transfers WHERE kind = 'issuance');
DELETE FROM transfers WHERE kind = 'issuance';
DELETE FROM accounts WHERE kind = 'issuance';
CREATE OR REPLACE FUNCTION tally_account_opening() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.opening_balance_cents := COALESCE(NEW.opening_balance_cents, NEW.balance_cents);
    RETURN NEW;
END;
$$;
ALTER TABLE transfers DROP COLUMN kind;
ALTER TABLE accounts DROP CONSTRAINT accounts_balance_sign;
ALTER TABLE accounts DROP CONSTRAINT accounts_issuance_name;
ALTER TABLE accounts ADD CONSTRAINT accounts_balance_cents_check CHECK (balance_cents >= 0);
ALTER TABLE accounts DROP COLUMN kind;
ALTER TABLE accounts DROP COLUMN owner;
