-- A transaction that has sent a NOTIFY takes, as it commits, a lock that every other
-- such transaction of the whole server waits for, and keeps it until its commit is
-- flushed to disk. With the trigger on every outbox insert, the intake's and the ledger's
-- commits were flushed one after the other instead of together (at 1,000 transfers/s
-- about as much time waiting for that lock at COMMIT as for the flush itself).
--
-- tally's intake and ledger now wake the publishers themselves after their commit: this
-- daemon's at once, and other daemons' with a notification sent on a connection of its
-- own, outside any transaction that writes. Their connections set
-- tally.outbox_notify = 'after_commit', and for them the trigger sends nothing. Every
-- other writer of outbox rows is notified by the trigger at commit, as before.
CREATE OR REPLACE FUNCTION tally_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('tally.outbox_notify', true) IS DISTINCT FROM 'after_commit' THEN
        PERFORM pg_notify('tally_outbox', '');
    END IF;
    RETURN NULL;
END;
$$;
