//! Rows the broker refuses for good, without the database or Kafka: which errors are
//! refusals ([`Refusal::of`]), and what a batch does with each row once every record has
//! its answer ([`settle`]).
//!
//! A refusal is an answer about one record (too large) or one topic (not authorised,
//! unknown), which the same record will get again until someone changes the broker's
//! configuration: the row is parked. Anything else (a timeout, a broker down, a full queue)
//! may pass by itself and fails the whole batch, as before.
//!
//! Order: a record's topic and key pick its partition, and the producer keeps a partition's
//! records in order. The first refused row of a topic and key is parked; its later rows in
//! the batch were either never sent (a refusal at enqueue stops the key there) or refused
//! too (a topic's refusal reaches each of its records): they are held. Rows of the same key
//! on other topics go to other partition logs, which have no order between them, and are
//! published. One case escapes: a broker whose own size limit refuses a record while a
//! later, smaller record of the same partition in another produce request is taken. That
//! later row was published ahead of the parked one; it is marked published and logged
//! (`overtaken`). A producer whose `message.max.bytes` is no larger than the topics'
//! `max.message.bytes` refuses such a record at enqueue, before any later one is sent.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use std::collections::HashMap;
use uuid::Uuid;

use crate::backoff::Backoff;
use crate::store::outbox::ClaimedOutboxEvent;
use crate::store::outbox_parked::Park;

/// Why the broker (or the producer, on its behalf) refuses a record for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refusal {
    /// Larger than the producer's `message.max.bytes` or the topic's `max.message.bytes`.
    MessageTooLarge,
    /// The producer may not write to the topic (ACL).
    TopicAuthorizationFailed,
    /// The topic does not exist (and is not created automatically) or its name is invalid.
    UnknownTopic,
    /// The broker rejects the record itself (e.g. no key on a compacted topic).
    InvalidRecord,
}

impl Refusal {
    /// Every refusal, for metrics published at 0.
    pub const ALL: [Refusal; 4] =
        [Self::MessageTooLarge, Self::TopicAuthorizationFailed, Self::UnknownTopic, Self::InvalidRecord];

    /// A stable code for the database, metrics and the admin API.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::MessageTooLarge => "message_too_large",
            Self::TopicAuthorizationFailed => "topic_authorization_failed",
            Self::UnknownTopic => "unknown_topic",
            Self::InvalidRecord => "invalid_record",
        }
    }

    /// The refusal `error` is, or `None` when it may pass by itself.
    #[must_use]
    pub fn of(error: &KafkaError) -> Option<Self> {
        Self::of_code(error.rdkafka_error_code()?)
    }

    fn of_code(code: RDKafkaErrorCode) -> Option<Self> {
        match code {
            RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::MessageBatchTooLarge => {
                Some(Self::MessageTooLarge)
            }
            RDKafkaErrorCode::TopicAuthorizationFailed => Some(Self::TopicAuthorizationFailed),
            RDKafkaErrorCode::UnknownTopic
            | RDKafkaErrorCode::UnknownTopicOrPartition
            | RDKafkaErrorCode::InvalidTopic => Some(Self::UnknownTopic),
            RDKafkaErrorCode::InvalidRecord => Some(Self::InvalidRecord),
            _ => None,
        }
    }
}

/// What became of one row's record.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Acknowledged by the broker.
    Published,
    /// Refused for good, at enqueue or in its delivery report.
    Refused { refusal: Refusal, error: String },
    /// Not sent: an earlier row of its topic and key was refused at enqueue.
    NotSent,
}

/// What one batch writes once every record has its answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settlement {
    /// Rows to mark published.
    pub published: Vec<Uuid>,
    /// Topics and keys whose parked row was published: their held rows go free.
    pub released: Vec<(String, String)>,
    /// Rows to park (again), with their refusal and the wait before the next attempt.
    pub parked: Vec<Park>,
    /// Rows to hold behind a parked row of their topic and key.
    pub held: Vec<Uuid>,
    /// Published rows acknowledged after an earlier row of their topic and key was refused
    /// (see the module's note on order).
    pub overtaken: Vec<Uuid>,
}

/// Settles a batch: `rows` as claimed (any order) and the `outcomes` of their records, in
/// the same order; `curve` gives the wait before a row's next attempt from its refusals so
/// far.
#[must_use]
pub fn settle(rows: &[ClaimedOutboxEvent], outcomes: &[Outcome], curve: Backoff) -> Settlement {
    let topic_key = |r: &ClaimedOutboxEvent| (r.event.topic.clone(), r.event.key.clone());
    // The first refused row of each topic and key.
    let mut first_refused: HashMap<(String, String), i64> = HashMap::new();
    for (row, outcome) in rows.iter().zip(outcomes) {
        if matches!(outcome, Outcome::Refused { .. }) {
            let seq = first_refused.entry(topic_key(row)).or_insert(row.event.seq);
            *seq = (*seq).min(row.event.seq);
        }
    }
    let mut settlement = Settlement::default();
    for (row, outcome) in rows.iter().zip(outcomes) {
        let refused_before = first_refused.get(&topic_key(row)).copied();
        match outcome {
            Outcome::Published => {
                settlement.published.push(row.event.id);
                match refused_before {
                    Some(first) if first < row.event.seq => settlement.overtaken.push(row.event.id),
                    Some(_) => {}
                    None if row.parked => settlement.released.push(topic_key(row)),
                    None => {}
                }
            }
            Outcome::Refused { refusal, error } if refused_before == Some(row.event.seq) => {
                let refusals_so_far = u32::try_from(row.attempts).unwrap_or(0);
                settlement.parked.push(Park {
                    id: row.event.id,
                    reason: refusal.code(),
                    error: error.clone(),
                    retry_after: curve.nth(refusals_so_far),
                });
            }
            Outcome::Refused { .. } | Outcome::NotSent => settlement.held.push(row.event.id),
        }
    }
    settlement
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use chrono::Utc;
    use tally_schema::models::PendingOutboxEvent;

    fn row(seq: i64, topic: &str, key: &str) -> ClaimedOutboxEvent {
        ClaimedOutboxEvent {
            event: PendingOutboxEvent {
                id: Uuid::from_u128(seq as u128),
                seq,
                topic: topic.into(),
                key: key.into(),
                event_type: "T".into(),
                payload: "{}".into(),
                traceparent: None,
                created_at: Utc::now(),
            },
            attempts: 0,
            parked: false,
            behind_parked: false,
            any_parked: false,
        }
    }

    fn refused() -> Outcome {
        Outcome::Refused { refusal: Refusal::TopicAuthorizationFailed, error: "denied".into() }
    }

    fn id(seq: i64) -> Uuid {
        Uuid::from_u128(seq as u128)
    }

    const CURVE: Backoff = Backoff::doubling(Duration::from_secs(5), Duration::from_secs(300));

    #[test]
    fn refusals_are_the_errors_the_same_record_gets_again() {
        let refusal = |code| Refusal::of(&KafkaError::MessageProduction(code));
        assert_eq!(refusal(RDKafkaErrorCode::MessageSizeTooLarge), Some(Refusal::MessageTooLarge));
        assert_eq!(refusal(RDKafkaErrorCode::TopicAuthorizationFailed), Some(Refusal::TopicAuthorizationFailed));
        assert_eq!(refusal(RDKafkaErrorCode::UnknownTopic), Some(Refusal::UnknownTopic));
        assert_eq!(refusal(RDKafkaErrorCode::InvalidRecord), Some(Refusal::InvalidRecord));
        for passing in [
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::AllBrokersDown,
            RDKafkaErrorCode::BrokerTransportFailure,
            RDKafkaErrorCode::QueueFull,
            RDKafkaErrorCode::NotEnoughReplicas,
            RDKafkaErrorCode::LeaderNotAvailable,
            RDKafkaErrorCode::ClusterAuthorizationFailed,
        ] {
            assert_eq!(refusal(passing), None, "{passing:?} may pass by itself");
        }
        assert_eq!(Refusal::of(&KafkaError::Canceled), None);
        let codes: std::collections::HashSet<_> = Refusal::ALL.iter().map(|r| r.code()).collect();
        assert_eq!(codes.len(), Refusal::ALL.len());
    }

    #[test]
    fn the_first_refused_row_of_a_topic_and_key_is_parked_and_its_later_rows_held() {
        let rows = [
            row(1, "a", "k"),
            row(2, "r", "k"), // refused: parked
            row(3, "a", "other"),
            row(4, "r", "k"), // refused too: held
            row(5, "a", "k"), // the same key on another topic: published
            row(6, "r", "k"), // not sent after an enqueue refusal: held
            row(7, "r", "j"), // another key on the refused topic, refused: parked
        ];
        let outcomes = [
            Outcome::Published,
            refused(),
            Outcome::Published,
            refused(),
            Outcome::Published,
            Outcome::NotSent,
            refused(),
        ];
        let s = settle(&rows, &outcomes, CURVE);
        assert_eq!(s.published, [id(1), id(3), id(5)]);
        assert_eq!(s.parked.iter().map(|p| p.id).collect::<Vec<_>>(), [id(2), id(7)]);
        assert!(s.parked.iter().all(|p| p.reason == "topic_authorization_failed" && p.error == "denied"));
        assert_eq!(s.parked[0].retry_after, Duration::from_secs(5), "the first wait after a first refusal");
        assert_eq!(s.held, [id(4), id(6)]);
        assert!(s.released.is_empty() && s.overtaken.is_empty());
    }

    #[test]
    fn a_parked_row_refused_again_waits_longer_and_published_releases_its_key() {
        let mut again = row(2, "r", "k");
        again.parked = true;
        again.attempts = 3;
        let mut through = row(8, "r", "j");
        through.parked = true;
        through.attempts = 9;
        let s = settle(&[again, through], &[refused(), Outcome::Published], CURVE);
        assert_eq!(s.parked.len(), 1);
        assert_eq!(s.parked[0].retry_after, Duration::from_secs(40), "5 s doubled three times");
        assert_eq!(s.published, [id(8)]);
        assert_eq!(s.released, [("r".to_owned(), "j".to_owned())]);
    }

    #[test]
    fn a_later_row_acknowledged_behind_a_refused_one_is_published_and_reported() {
        // Claimed in any order: settle goes by seq.
        let rows = [row(4, "r", "k"), row(2, "r", "k")];
        let s = settle(&rows, &[Outcome::Published, refused()], CURVE);
        assert_eq!(s.parked.iter().map(|p| p.id).collect::<Vec<_>>(), [id(2)]);
        assert_eq!(s.published, [id(4)]);
        assert_eq!(s.overtaken, [id(4)]);
        assert!(s.released.is_empty());
    }
}
