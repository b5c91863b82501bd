//! Replay: republish DLT records to their original topic and partition.

use rdkafka::consumer::BaseConsumer;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::{Deserialize, Serialize};
use tally_schema::headers;

use super::{plan, read, Deadline, DltError, DltRecord, Selection, MAX_REPLAY};

/// The body of `POST /admin/dlt/{topic}/replay`; every field optional, offsets inclusive.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReplayRequest {
    #[schema(minimum = 0)]
    pub partition: Option<i32>,
    #[schema(minimum = 0)]
    pub from_offset: Option<i64>,
    #[schema(minimum = 0)]
    pub to_offset: Option<i64>,
    /// Only records whose key is exactly this (UTF-8) string.
    pub key: Option<String>,
}

impl ReplayRequest {
    /// Parses an optional JSON body: empty (or blank) means "everything".
    ///
    /// # Errors
    /// [`DltError::BadSelection`] for invalid JSON, unknown fields or inconsistent values.
    pub fn parse(body: &[u8]) -> Result<Self, DltError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::default());
        }
        let req: Self =
            serde_json::from_slice(body).map_err(|e| DltError::BadSelection(format!("invalid replay body: {e}")))?;
        req.validate()?;
        Ok(req)
    }

    fn validate(&self) -> Result<(), DltError> {
        if self.partition.is_some_and(|p| p < 0) {
            return Err(DltError::BadSelection("partition must be >= 0".into()));
        }
        if self.from_offset.is_some_and(|o| o < 0) || self.to_offset.is_some_and(|o| o < 0) {
            return Err(DltError::BadSelection("fromOffset and toOffset must be >= 0".into()));
        }
        if let (Some(from), Some(to)) = (self.from_offset, self.to_offset) {
            if from > to {
                return Err(DltError::BadSelection("fromOffset must be <= toOffset".into()));
            }
        }
        Ok(())
    }

    #[must_use]
    pub fn selection(&self) -> Selection {
        Selection { partition: self.partition, from_offset: self.from_offset, to_offset: self.to_offset, limit: None }
    }

    fn matches(&self, record: &DltRecord) -> bool {
        self.key.as_deref().is_none_or(|k| record.key.as_deref() == Some(k.as_bytes()))
    }
}

/// What a replay republishes for one DLT record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Republish {
    pub topic: String,
    pub partition: i32,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    /// The original headers (every `dlt-*` and any earlier `replayed-from` removed) plus
    /// `replayed-from: <dlt topic>/<partition>/<offset>`.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

/// The record to republish for `record` of `dlt`, whose source topic is `source`.
///
/// # Errors
/// [`DltError::NotReplayable`] when the `dlt-original-topic` header is missing or names
/// another topic than `source`, or `dlt-original-partition` is missing or not a partition.
pub fn republish(dlt: &str, source: &str, record: &DltRecord) -> Result<Republish, DltError> {
    let refuse =
        |reason: String| DltError::NotReplayable { partition: record.partition, offset: record.offset, reason };
    let topic = record
        .header_str(headers::DLT_ORIGINAL_TOPIC)
        .ok_or_else(|| refuse(format!("no {} header", headers::DLT_ORIGINAL_TOPIC)))?;
    if topic != source {
        return Err(refuse(format!("{} is {topic}, not {source}", headers::DLT_ORIGINAL_TOPIC)));
    }
    let partition = record
        .header_str(headers::DLT_ORIGINAL_PARTITION)
        .and_then(|p| p.parse::<i32>().ok())
        .filter(|p| *p >= 0)
        .ok_or_else(|| refuse(format!("no valid {} header", headers::DLT_ORIGINAL_PARTITION)))?;
    let mut hdrs: Vec<(String, Option<Vec<u8>>)> =
        record.headers.iter().filter(|(k, _)| !k.starts_with("dlt-") && k != headers::REPLAYED_FROM).cloned().collect();
    hdrs.push((
        headers::REPLAYED_FROM.to_owned(),
        Some(format!("{dlt}/{}/{}", record.partition, record.offset).into_bytes()),
    ));
    Ok(Republish {
        topic: topic.to_owned(),
        partition,
        key: record.key.clone(),
        payload: record.payload.clone(),
        headers: hdrs,
    })
}

/// One replayed record, as answered by the replay endpoint.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Replayed {
    pub partition: i32,
    pub offset: i64,
    pub original_topic: String,
    pub original_partition: i32,
    /// Where the copy landed.
    pub replayed_offset: i64,
}

/// Reads what `request` selects from `dlt` and the [`Republish`] of each record, in offset
/// order per partition. Nothing is produced.
///
/// # Errors
/// [`DltError::BadSelection`] when the selection covers more than [`MAX_REPLAY`] records;
/// [`DltError::NotReplayable`] when any selected record cannot be replayed; Kafka errors.
pub fn prepare_replay(
    consumer: &BaseConsumer,
    dlt: &str,
    source: &str,
    request: &ReplayRequest,
    deadline: Deadline,
) -> Result<Vec<(DltRecord, Republish)>, DltError> {
    let selection = request.selection();
    let ranges = plan(consumer, dlt, &selection, deadline)?;
    let covered: i64 = ranges.iter().map(|(_, s, e)| e - s).sum();
    if covered > MAX_REPLAY {
        return Err(DltError::BadSelection(format!(
            "the selection covers {covered} records, more than {MAX_REPLAY}: narrow it with partition, fromOffset and toOffset"
        )));
    }
    let page = read(consumer, dlt, &selection, deadline)?;
    page.records
        .into_iter()
        .filter(|r| request.matches(r))
        .map(|r| republish(dlt, source, &r).map(|p| (r, p)))
        .collect()
}

/// Produces every [`Republish`] in order (an idempotent producer keeps per-partition
/// order) and waits for every acknowledgement: per record, where its copy landed
/// (`(partition, offset)`) or why it failed. Stops enqueueing at the first refused send;
/// the records not enqueued are reported with that error.
pub async fn send_all(producer: &FutureProducer, planned: &[&Republish]) -> Vec<Result<(i32, i64), KafkaError>> {
    let mut pending = Vec::with_capacity(planned.len());
    let mut refused = None;
    for out in planned {
        let mut hdrs = OwnedHeaders::new_with_capacity(out.headers.len());
        for (k, v) in &out.headers {
            hdrs = hdrs.insert(Header { key: k, value: v.as_deref() });
        }
        let mut fr: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&out.topic).partition(out.partition).headers(hdrs);
        if let Some(key) = &out.key {
            fr = fr.key(key.as_slice());
        }
        if let Some(payload) = &out.payload {
            fr = fr.payload(payload.as_slice());
        }
        match producer.send_result(fr) {
            Ok(delivery) => pending.push(delivery),
            Err((e, _)) => {
                refused = Some(e);
                break;
            }
        }
    }
    let mut results = Vec::with_capacity(planned.len());
    for delivery in pending {
        results.push(match delivery.await {
            Ok(Ok(d)) => Ok((d.partition, d.offset)),
            Ok(Err((e, _))) => Err(e),
            Err(_) => Err(KafkaError::Canceled),
        });
    }
    if let Some(e) = refused {
        results.resize_with(planned.len(), || Err(e.clone()));
    }
    results
}

/// Produces every [`Republish`] of `planned` in order and waits for every acknowledgement.
///
/// # Errors
/// [`DltError::Produce`] with the number acknowledged when a send fails.
pub async fn replay(producer: &FutureProducer, planned: &[(DltRecord, Republish)]) -> Result<Vec<Replayed>, DltError> {
    let (done, failure) = replay_each(producer, planned).await;
    match failure {
        None => Ok(done),
        Some(source) => Err(DltError::Produce { acked: done.len(), selected: planned.len(), source }),
    }
}

/// [`replay`] that hands back the acknowledged copies even when a send failed (to log
/// them): every record replayed, and the first failure.
pub async fn replay_each(
    producer: &FutureProducer,
    planned: &[(DltRecord, Republish)],
) -> (Vec<Replayed>, Option<KafkaError>) {
    let outs: Vec<&Republish> = planned.iter().map(|(_, out)| out).collect();
    let results = send_all(producer, &outs).await;
    let mut done = Vec::with_capacity(planned.len());
    let mut failure = None;
    for ((record, out), result) in planned.iter().zip(results) {
        match result {
            Ok((partition, offset)) => done.push(Replayed {
                partition: record.partition,
                offset: record.offset,
                original_topic: out.topic.clone(),
                original_partition: partition,
                replayed_offset: offset,
            }),
            Err(e) => failure = failure.or(Some(e)),
        }
    }
    (done, failure)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::dlt::fixtures::{dead, record};

    #[test]
    fn republish_strips_dlt_headers_and_marks_the_copy() {
        let out = republish("transfers.analyzed-dlt", "transfers.analyzed", &dead("exhausted")).unwrap();
        assert_eq!(out.topic, "transfers.analyzed");
        assert_eq!(out.partition, 3);
        assert_eq!(out.key.as_deref(), Some(b"K-1".as_slice()));
        let names: Vec<&str> = out.headers.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["event-id", "replayed-from"]);
        assert_eq!(out.headers[1].1.as_deref(), Some(b"transfers.analyzed-dlt/3/7".as_slice()));
    }

    #[test]
    fn republish_refuses_records_without_or_with_foreign_origin() {
        let e = republish("x-dlt", "x", &record(&[])).unwrap_err();
        assert_eq!(e.code(), "dlt_record_not_replayable");
        let e = republish("x-dlt", "x", &dead("poison")).unwrap_err();
        assert!(e.to_string().contains("not x"), "{e}");
    }

    #[test]
    fn replay_request_parsing() {
        assert_eq!(ReplayRequest::parse(b"").unwrap(), ReplayRequest::default());
        assert_eq!(ReplayRequest::parse(b" \n").unwrap(), ReplayRequest::default());
        assert_eq!(ReplayRequest::parse(b"{}").unwrap(), ReplayRequest::default());
        let r = ReplayRequest::parse(br#"{"partition":1,"fromOffset":2,"toOffset":3,"key":"A"}"#).unwrap();
        assert_eq!(
            r.selection(),
            Selection { partition: Some(1), from_offset: Some(2), to_offset: Some(3), limit: None }
        );
        assert!(r.matches(&DltRecord { key: Some(b"A".to_vec()), ..record(&[]) }));
        assert!(!r.matches(&record(&[])));
        for bad in [&b"{"[..], br#"{"partition":-1}"#, br#"{"fromOffset":5,"toOffset":4}"#, br#"{"nope":1}"#] {
            assert_eq!(ReplayRequest::parse(bad).unwrap_err().code(), "bad_selection");
        }
    }
}
