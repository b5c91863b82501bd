//! The console's transfer lookup: `GET /admin/transfers/{id}` (admin token, it shows
//! accounts and amounts), the transfer with its antifraud decision, its postings and a
//! timeline of what every stage did with it, from the tables.

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};
use tally_actors::ledger::{REJECTED_KIND, SETTLED_KIND};
use tally_actors::store::decisions::ANALYZED;
use tally_actors::store::lookup::{self, TransferStory};
use tally_actors::store::transfers::REQUESTED_KIND;
use tally_schema::events::derived_event_id;
use uuid::Uuid;

use crate::config::TopicsConfig;
use crate::http::auth::Admin;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::intake::TransferView;
use crate::http::AppState;

/// `GET /admin/transfers/{id}` (admin token).
#[utoipa::path(get, path = "/admin/transfers/{id}", tag = "console", params(("id" = Uuid, Path)), security(("admin" = [])),
    responses((status = 200, description = "The transfer, its decision, postings and timeline.", body = Object),
        (status = 404, description = "No such transfer.", body = ErrorBody)))]
pub(in crate::http) async fn transfer(
    _: Admin,
    state: web::Data<AppState>,
    id: web::Path<Uuid>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    let mut conn = state.pool.get().await?;
    let events: Vec<Uuid> =
        [REQUESTED_KIND, SETTLED_KIND, REJECTED_KIND].iter().map(|kind| derived_event_id(kind, id)).collect();
    let story = lookup::transfer_story(&mut conn, id, &events)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("Transfer {id} does not exist")))?;
    Ok(HttpResponse::Ok().json(view(&story, &state.topics)))
}

/// One thing that happened to a transfer.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Step {
    at: DateTime<Utc>,
    stage: &'static str,
    /// The topic the step read or wrote, when it is about one.
    topic: Option<String>,
    what: String,
}

fn view(story: &TransferStory, topics: &TopicsConfig) -> Value {
    json!({
        // The same view as the intake's GET /transfers/{id}.
        "transfer": TransferView::from(story.transfer.clone()),
        "decision": story.decision.as_ref().map(|d| json!({
            "outcome": d.outcome,
            "score": d.score,
            "reason": d.reason,
            "decidedAt": d.decided_at,
        })),
        "postings": story.postings.iter().map(|p| json!({
            "accountId": p.account_id,
            "kind": if p.kind == "D" { "debit" } else { "credit" },
            "amountCents": p.amount_cents,
            "createdAt": p.created_at,
        })).collect::<Vec<_>>(),
        "timeline": timeline(story, topics),
    })
}

/// Every step the tables record, oldest first (ties keep pipeline order).
fn timeline(story: &TransferStory, topics: &TopicsConfig) -> Vec<Step> {
    let t = &story.transfer;
    let mut steps = vec![Step {
        at: t.created_at,
        stage: "intake",
        topic: None,
        what: format!(
            "accepted: {}.{:02} {} from {} to {}{}",
            t.amount_cents / 100,
            (t.amount_cents % 100).abs(),
            t.currency,
            t.source_account,
            t.destination_account,
            if t.client.is_empty() { String::new() } else { format!(" for client {}", t.client) },
        ),
    }];
    // An outbox row is written in the same transaction as the step that emits its event
    // (intake, settlement), so only its publication, or its wait, is a step of its own.
    for row in &story.outbox {
        let (at, what) = match row.published_at {
            Some(at) => (at, format!("{} published", row.event_type)),
            None => (row.created_at, format!("{} waiting in the outbox", row.event_type)),
        };
        steps.push(Step { at, stage: "outbox", topic: Some(row.topic.clone()), what });
    }
    if let Some(d) = &story.decision {
        let topic = if d.outcome == ANALYZED { &topics.transfers_analyzed } else { &topics.transfers_rejected };
        let reason = d.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
        steps.push(Step {
            at: d.decided_at,
            stage: "antifraud",
            topic: Some(topic.clone()),
            what: format!("{} with score {}{reason}", d.outcome, d.score),
        });
    }
    if let Some(s) = &story.settlement {
        let reason = s.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
        let what = format!("{} by the ledger{reason}", s.outcome.to_lowercase());
        steps.push(Step { at: s.processed_at, stage: "ledger", topic: None, what });
    }
    if t.status != tally_schema::models::status::PENDING {
        steps.push(Step { at: t.updated_at, stage: "projection", topic: None, what: format!("status {}", t.status) });
    }
    for d in &story.deliveries {
        steps.push(Step {
            at: d.delivered_at,
            stage: "notification",
            topic: Some(d.topic.clone()),
            what: format!("delivered (HTTP {}) after {} attempt(s)", d.response_status, d.attempts),
        });
    }
    for dl in &story.dead_letters {
        steps.push(Step {
            at: dl.created_at,
            stage: "dead letter",
            topic: Some(dl.original_topic.clone()),
            what: format!(
                "dead-lettered from partition {} offset {} ({}: {})",
                dl.original_partition, dl.original_offset, dl.exception_kind, dl.exception_message
            ),
        });
        if let Some(at) = dl.replayed_at {
            steps.push(Step {
                at,
                stage: "dead letter",
                topic: Some(dl.original_topic.clone()),
                what: format!("dead letter {} replayed", dl.id),
            });
        }
    }
    // Stable: steps written at the same instant keep the order of the pipeline above.
    steps.sort_by_key(|s| s.at);
    steps
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use tally_actors::store::dead_letters::DeadLetter;
    use tally_actors::store::decisions::{Decision, BLOCKED};
    use tally_actors::store::lookup::{DeliveryRow, OutboxRow, Settlement};
    use tally_schema::models::Transfer;

    use super::*;

    fn at(ms: i64) -> DateTime<Utc> {
        Utc.timestamp_millis_opt(1_800_000_000_000 + ms).single().expect("a time")
    }

    fn story(outcome: &str) -> TransferStory {
        let id = Uuid::now_v7();
        TransferStory {
            transfer: Transfer {
                id,
                source_account: "A".into(),
                destination_account: "B".into(),
                amount_cents: 500,
                currency: "BRL".into(),
                status: if outcome == ANALYZED { "SETTLED" } else { "REJECTED" }.into(),
                rejection_reason: None,
                idempotency_key: None,
                created_at: at(0),
                updated_at: at(40),
                client: "shop".into(),
                kind: "transfer".into(),
            },
            decision: Some(Decision {
                transfer_id: id,
                source_account: "A".into(),
                destination_account: "B".into(),
                amount_cents: 500,
                currency: "BRL".into(),
                outcome: outcome.into(),
                score: 12,
                reason: None,
                requested_at: at(0),
                decided_at: at(20),
            }),
            settlement: Some(Settlement { outcome: "SETTLED".into(), reason: None, processed_at: at(30) }),
            postings: vec![],
            // Listed out of time order: the timeline sorts.
            outbox: vec![
                OutboxRow {
                    topic: "transfers.settled".into(),
                    event_type: "TransferSettled".into(),
                    created_at: at(30),
                    published_at: Some(at(35)),
                },
                OutboxRow {
                    topic: "transfers.requested".into(),
                    event_type: "TransferRequested".into(),
                    created_at: at(0),
                    published_at: Some(at(10)),
                },
            ],
            deliveries: vec![DeliveryRow {
                topic: "transfers.settled".into(),
                attempts: 2,
                response_status: 200,
                delivered_at: at(50),
            }],
            dead_letters: vec![DeadLetter {
                id: 7,
                original_topic: "transfers.analyzed".into(),
                original_partition: 3,
                original_offset: 9,
                original_timestamp: None,
                consumer_group: "tally-ledger".into(),
                exception_kind: "poison".into(),
                exception_message: "bad".into(),
                attempts: 1,
                record_key: Some(b"A".to_vec()),
                payload: None,
                headers: serde_json::json!([]),
                dlt_error: String::new(),
                created_at: at(25),
                replayed_at: Some(at(60)),
            }],
        }
    }

    #[test]
    fn the_timeline_is_in_time_order_with_each_steps_topic() {
        let steps = timeline(&story(ANALYZED), &TopicsConfig::default());
        let seen: Vec<(i64, &str, Option<&str>)> =
            steps.iter().map(|s| ((s.at - at(0)).num_milliseconds(), s.stage, s.topic.as_deref())).collect();
        assert_eq!(
            seen,
            [
                (0, "intake", None),
                (10, "outbox", Some("transfers.requested")),
                (20, "antifraud", Some("transfers.analyzed")),
                (25, "dead letter", Some("transfers.analyzed")),
                (30, "ledger", None),
                (35, "outbox", Some("transfers.settled")),
                (40, "projection", None),
                (50, "notification", Some("transfers.settled")),
                (60, "dead letter", Some("transfers.analyzed")),
            ]
        );
        assert_eq!(steps[2].what, "ANALYZED with score 12");
        assert_eq!(steps[1].what, "TransferRequested published");
        assert_eq!(steps[7].what, "delivered (HTTP 200) after 2 attempt(s)");
        assert_eq!(steps[0].what, "accepted: 5.00 BRL from A to B for client shop");
        assert_eq!(steps[4].what, "settled by the ledger");
    }

    #[test]
    fn a_blocked_decision_is_shown_on_the_rejected_topic() {
        let steps = timeline(&story(BLOCKED), &TopicsConfig::default());
        let decision = steps.iter().find(|s| s.stage == "antifraud").expect("the decision");
        assert_eq!(decision.topic.as_deref(), Some("transfers.rejected"));
    }

    #[test]
    fn an_unprojected_transfer_and_an_unpublished_event_show_as_such() {
        let mut s = story(ANALYZED);
        s.transfer.status = tally_schema::models::status::PENDING.into();
        s.outbox[0].published_at = None;
        let steps = timeline(&s, &TopicsConfig::default());
        assert!(steps.iter().all(|s| s.stage != "projection"));
        let waiting = steps.iter().find(|s| s.what == "TransferSettled waiting in the outbox").expect("the wait");
        assert_eq!(waiting.at, at(30));
    }
}
