CREATE OR REPLACE FUNCTION tally_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('tally_outbox', '');
    RETURN NULL;
END;
$$;
