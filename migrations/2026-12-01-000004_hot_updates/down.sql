ALTER TABLE processed_transfers RESET (fillfactor);
ALTER TABLE transfers RESET (fillfactor);
