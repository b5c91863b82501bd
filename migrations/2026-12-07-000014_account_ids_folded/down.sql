DROP INDEX accounts_id_folded;
ALTER TABLE accounts DROP CONSTRAINT accounts_issuance_name;
ALTER TABLE accounts ADD CONSTRAINT accounts_issuance_name
    CHECK ((kind = 'issuance') = (id LIKE 'issuance:%'));
