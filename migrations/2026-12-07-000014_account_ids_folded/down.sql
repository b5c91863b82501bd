DROP INDEX accounts_id_folded;
