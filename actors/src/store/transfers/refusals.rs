//! Whether the intake may write a transfer request: its client may debit the source and
//! credit the destination, as [`crate::authority`] decides, before anything is written.

use diesel_async::AsyncPgConnection;

use super::Intake;
use crate::authority::{AccountRef, Principal, Scopes, ISSUANCE_PREFIX};

/// Why the intake refuses a transfer request before writing anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The source account is not the client's (or does not exist: the same answer).
    Debit(String),
    /// The destination is an issuance account, which moves only by issuance.
    Credit(String),
}

impl Intake {
    /// Who debits the source account, for [`crate::authority`].
    fn debitor(&self) -> Principal {
        Principal { name: self.client.clone(), scopes: Scopes::default(), adopts_anonymous: self.adopts_anonymous }
    }
}

/// Why each request of `batch` is refused, if it is: its client may debit its source and
/// credit its destination ([`crate::authority::Principal`]), as the accounts are now (an
/// account's owner and kind never change).
pub(super) async fn refusals(
    conn: &mut AsyncPgConnection,
    batch: &[Intake],
) -> Result<Vec<Option<Refusal>>, diesel::result::Error> {
    let ids: Vec<&str> = batch
        .iter()
        .flat_map(|i| [i.request.source_account.as_str(), i.request.destination_account.as_str()])
        .collect();
    let accounts = crate::store::accounts::refs(conn, &ids).await?;
    let of = |id: &str| accounts.get(id).map(|(owner, kind)| AccountRef { owner, kind });
    Ok(batch
        .iter()
        .map(|intake| {
            let request = &intake.request;
            if !intake.debitor().may_debit(of(&request.source_account).as_ref()) {
                return Some(Refusal::Debit(request.source_account.clone()));
            }
            // Whether or not it exists yet: the name is the kind.
            if request.destination_account.starts_with(ISSUANCE_PREFIX) {
                return Some(Refusal::Credit(request.destination_account.clone()));
            }
            match of(&request.destination_account) {
                Some(destination) if !intake.debitor().may_credit(&destination) => {
                    Some(Refusal::Credit(request.destination_account.clone()))
                }
                // An unknown destination is the ledger's ACCOUNT_NOT_FOUND, as before.
                _ => None,
            }
        })
        .collect())
}
