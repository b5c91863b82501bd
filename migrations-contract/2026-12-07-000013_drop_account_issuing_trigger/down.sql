-- Older releases' opening balances are issued as they land again (expand's rule).
CREATE FUNCTION tally_accounts_issued() RETURNS trigger LANGUAGE plpgsql AS $$
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
CREATE TRIGGER accounts_issued AFTER INSERT ON accounts REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION tally_accounts_issued();
