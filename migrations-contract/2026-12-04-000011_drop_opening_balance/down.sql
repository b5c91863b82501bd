ALTER TABLE accounts ADD COLUMN opening_balance_cents BIGINT NOT NULL DEFAULT 0;
CREATE FUNCTION tally_account_opening() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.opening_balance_cents := 0;
    RETURN NEW;
END;
$$;
CREATE TRIGGER accounts_opening BEFORE INSERT ON accounts FOR EACH ROW EXECUTE FUNCTION tally_account_opening();
