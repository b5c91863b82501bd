DROP INDEX transfers_destination_account;
DROP INDEX transfers_source_account;
DROP TABLE dlt_replays;
