//! A transfer's outcome as the system of record holds it, read-only: its status, the
//! ledger's inbox outcome and postings, antifraud's decision. The status projection and the
//! notifier act on a `transfers.settled` or `transfers.rejected` event only when this
//! confirms it ([`Recorded::confirms`]): an event the ledger or antifraud did not decide
//! changes no status and tells no one anything.

use std::collections::HashMap;

use diesel::sql_types::{Array, BigInt, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use futures_util::FutureExt;
use tally_schema::models::status;
use uuid::Uuid;

use super::decisions::BLOCKED;
use super::Sent;
use crate::antifraud::BLOCKED_BY_ANTIFRAUD;

/// What the system of record holds of one transfer's outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq, QueryableByName)]
pub struct Recorded {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    pub id: Uuid,
    /// The intake's status; `None` when the intake never took the transfer.
    #[diesel(sql_type = Nullable<Text>)]
    pub status: Option<String>,
    /// The ledger's inbox outcome (`SETTLED`, `REJECTED`, `PROCESSING`).
    #[diesel(sql_type = Nullable<Text>)]
    pub ledger: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub ledger_reason: Option<String>,
    #[diesel(sql_type = BigInt)]
    pub postings: i64,
    /// Antifraud's stored outcome (`ANALYZED`, `BLOCKED`).
    #[diesel(sql_type = Nullable<Text>)]
    pub decision: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub decision_reason: Option<String>,
}

impl Recorded {
    /// Whether the ledger or antifraud decided `final_status` (with `reason`, for a
    /// rejection) for this transfer: SETTLED only with the ledger's settlement and its two
    /// postings; REJECTED only with that reason stored, by the ledger's inbox or antifraud's
    /// blocking decision.
    ///
    /// # Errors
    /// Why not, as a dead letter's reason.
    pub fn confirms(&self, final_status: &str, reason: Option<&str>) -> Result<(), String> {
        if self.status.is_none() {
            return Err("unknown transfer: the intake never took it".into());
        }
        let ledger = self.ledger.as_deref();
        let blocked = self.decision.as_deref() == Some(BLOCKED);
        if final_status == status::SETTLED {
            return if ledger == Some(status::SETTLED) && self.postings == 2 && !blocked {
                Ok(())
            } else {
                Err(format!("contradicts the ledger: it has not settled this transfer ({})", self.held()))
            };
        }
        // Never a transfer that moved money, whatever else is stored of it.
        let unsettled = ledger != Some(status::SETTLED) && self.postings == 0;
        let by_ledger = ledger == Some(status::REJECTED) && self.ledger_reason.as_deref() == reason;
        let by_antifraud = blocked && Some(self.decision_reason.as_deref().unwrap_or(BLOCKED_BY_ANTIFRAUD)) == reason;
        if final_status == status::REJECTED && unsettled && (by_ledger || by_antifraud) {
            Ok(())
        } else {
            Err(format!(
                "contradicts the ledger: no {final_status} with reason {} is stored for this transfer ({})",
                reason.unwrap_or("none"),
                self.held()
            ))
        }
    }

    /// What is held, for a refusal's reason.
    fn held(&self) -> String {
        let or_none = |v: &Option<String>| v.clone().unwrap_or_else(|| "none".into());
        format!(
            "status {}, ledger {}{}, decision {}",
            or_none(&self.status),
            or_none(&self.ledger),
            self.ledger_reason.as_deref().map(|r| format!(" {r}")).unwrap_or_default(),
            or_none(&self.decision)
        )
    }
}

/// What is held of each of `ids` (one entry per distinct id, found or not).
///
/// # Errors
/// Any database error.
pub fn recorded<'a>(conn: &mut AsyncPgConnection, ids: &'a [Uuid]) -> Sent<'a, HashMap<Uuid, Recorded>> {
    let sent = (!ids.is_empty()).then(|| {
        diesel::sql_query(
            "SELECT u.id, t.status::text AS status, p.outcome::text AS ledger, p.reason AS ledger_reason, \
                    (SELECT count(*) FROM postings x WHERE x.transfer_id = u.id) AS postings, \
                    d.outcome::text AS decision, d.reason AS decision_reason \
             FROM (SELECT DISTINCT id FROM unnest($1::uuid[]) AS id) AS u(id) \
             LEFT JOIN transfers t ON t.id = u.id \
             LEFT JOIN processed_transfers p ON p.transfer_id = u.id \
             LEFT JOIN antifraud_decisions d ON d.transfer_id = u.id",
        )
        .bind::<Array<diesel::sql_types::Uuid>, _>(ids)
        .load::<Recorded>(conn)
    });
    async move {
        let Some(sent) = sent else { return Ok(HashMap::new()) };
        Ok(sent.await?.into_iter().map(|r| (r.id, r)).collect())
    }
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(
        status: &str,
        ledger: Option<(&str, Option<&str>)>,
        postings: i64,
        decision: Option<(&str, Option<&str>)>,
    ) -> Recorded {
        Recorded {
            id: Uuid::nil(),
            status: Some(status.into()),
            ledger: ledger.map(|(o, _)| o.into()),
            ledger_reason: ledger.and_then(|(_, r)| r.map(Into::into)),
            postings,
            decision: decision.map(|(o, _)| o.into()),
            decision_reason: decision.and_then(|(_, r)| r.map(Into::into)),
        }
    }

    #[test]
    fn settled_only_with_the_ledgers_settlement_and_its_postings() {
        let analyzed = Some(("ANALYZED", None));
        assert_eq!(held("PENDING", Some(("SETTLED", None)), 2, analyzed).confirms("SETTLED", None), Ok(()));
        for (case, r) in [
            ("nothing settled", held("PENDING", None, 0, analyzed)),
            ("claimed, not settled", held("PENDING", Some(("PROCESSING", None)), 0, analyzed)),
            ("rejected by the ledger", held("PENDING", Some(("REJECTED", Some("INSUFFICIENT_FUNDS"))), 0, analyzed)),
            ("postings missing", held("PENDING", Some(("SETTLED", None)), 0, analyzed)),
            ("blocked", held("PENDING", None, 0, Some(("BLOCKED", None)))),
        ] {
            let e = r.confirms("SETTLED", None).expect_err(case);
            assert!(e.starts_with("contradicts the ledger"), "{case}: {e}");
        }
        let unknown = Recorded { status: None, ..held("PENDING", Some(("SETTLED", None)), 2, analyzed) };
        assert!(unknown.confirms("SETTLED", None).unwrap_err().starts_with("unknown transfer"));
    }

    #[test]
    fn rejected_only_with_the_stored_reason() {
        let by_ledger = held("PENDING", Some(("REJECTED", Some("INSUFFICIENT_FUNDS"))), 0, Some(("ANALYZED", None)));
        assert_eq!(by_ledger.confirms("REJECTED", Some("INSUFFICIENT_FUNDS")), Ok(()));
        assert!(by_ledger.confirms("REJECTED", Some("you lost")).is_err(), "any other reason text");
        let blocked = held("PENDING", None, 0, Some(("BLOCKED", None)));
        assert_eq!(blocked.confirms("REJECTED", Some(BLOCKED_BY_ANTIFRAUD)), Ok(()));
        assert!(blocked.confirms("REJECTED", Some("INSUFFICIENT_FUNDS")).is_err());
        let analyzed = held("PENDING", None, 0, Some(("ANALYZED", None)));
        assert!(analyzed.confirms("REJECTED", Some(BLOCKED_BY_ANTIFRAUD)).is_err(), "antifraud let it through");
        let settled = held("SETTLED", Some(("SETTLED", None)), 2, Some(("ANALYZED", None)));
        assert!(settled.confirms("REJECTED", Some("INSUFFICIENT_FUNDS")).is_err());
        // A settlement that a blocking decision was stored for afterwards (a request forged
        // under a settled id): neither outcome is confirmed for the other.
        let both = held("SETTLED", Some(("SETTLED", None)), 2, Some(("BLOCKED", None)));
        assert!(both.confirms("REJECTED", Some(BLOCKED_BY_ANTIFRAUD)).is_err(), "money moved");
        assert!(both.confirms("SETTLED", None).is_err(), "antifraud blocked it");
    }
}
