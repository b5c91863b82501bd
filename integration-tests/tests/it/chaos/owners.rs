//! Whose money moved: in a chaos run each client owns its accounts, and only the issuer
//! issues. No account was debited by anyone but its owner, no money was issued by anyone
//! but the issuer or from anywhere but the issuance account, and no request refused 403
//! left a transfer behind.

use std::collections::HashSet;

use tally_integration_tests::TestEnv;

use super::checks::Check;
use super::load::{client_name, owner_of, History, ACCOUNTS, ISSUER};

/// See the module doc.
pub(super) async fn only_owners_debit(env: &TestEnv, history: &History) -> Check {
    let db = &env.db;
    let owner = |account: &str| (0..ACCOUNTS).find(|i| format!("C-{i}") == account).map(|i| client_name(owner_of(i)));
    let mut violations = Vec::new();
    let debits = db
        .query(
            "SELECT t.id::text, t.kind::text, t.client::text, p.account_id::text, a.owner::text \
             FROM postings p JOIN transfers t ON t.id = p.transfer_id JOIN accounts a ON a.id = p.account_id \
             WHERE p.kind = 'D'",
            &[],
        )
        .await;
    for d in &debits {
        let (id, kind, client, account, stored_owner): (String, String, String, String, String) =
            (d.get(0), d.get(1), d.get(2), d.get(3), d.get(4));
        let ok = match kind.as_str() {
            "issuance" => client == ISSUER && account == "issuance:BRL",
            _ => owner(&account).is_some_and(|o| o == client && o == stored_owner),
        };
        if !ok {
            violations.push(format!("transfer {id} ({kind}) of {client} debited {account} (owner {stored_owner:?})"));
        }
    }
    let refused: HashSet<&str> =
        history.calls.iter().filter(|c| c.path == "/transfers" && c.status == 403).map(|c| c.key.as_str()).collect();
    for key in &refused {
        let n = db.scalar_i64("SELECT count(*) FROM transfers WHERE idempotency_key = $1", &[key]).await;
        if n > 0 {
            violations.push(format!("key {key} was refused 403, yet {n} transfers carry it"));
        }
    }
    Check { name: "only owners debit, only the issuer issues", checked: debits.len() + refused.len(), violations }
}
