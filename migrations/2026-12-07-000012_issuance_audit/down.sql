-- The trigger issues any balance an INSERT brings again, and the audit goes.
CREATE OR REPLACE FUNCTION tally_accounts_issued() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tally_issue(array_agg(gen_random_uuid()), array_agg(id), array_agg(currency::text),
                        array_agg(balance_cents), array_agg(owner), array_agg(created_at))
    FROM inserted WHERE kind = 'customer' AND balance_cents > 0
    HAVING count(*) > 0;
    RETURN NULL;
END;
$$;
DROP TABLE issuance_audit;
