-- Room on each page for the one update every row of these tables gets, so that update is
-- a HOT update: the new version stays on the row's page and no index gets a new entry.
-- Neither update touches an indexed column.
--
-- processed_transfers: the ledger claims a transfer (outcome PROCESSING) and sets its
-- outcome in the same transaction, so every row is written twice within moments. On full
-- pages each second version went to another page with a new primary-key entry; at half
-- full it stays on the page, and the key index is half the size.
-- transfers: the intake inserts a row PENDING and the status projection moves it once
-- (SETTLED or REJECTED); with 30% free about half of those moves are HOT, against almost
-- none on full pages.
--
-- Only pages written from now on are affected; existing pages fill up as they were.
ALTER TABLE processed_transfers SET (fillfactor = 50);
ALTER TABLE transfers SET (fillfactor = 70);
