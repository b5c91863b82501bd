//! An owned copy of a consumed Kafka record, shared between actors, and the [`Lease`] of
//! the partition assignment it was taken under: what every stage, the supervision and the
//! dead-letter writer handle, with no dependency on how records are consumed.
//!
//! Decoding is total: whatever bytes a record carries, [`Record::from_message`] returns a
//! `Record`. What tally cannot take as it is (a header name that is not UTF-8, more
//! headers than [`MAX_HEADERS`]) is kept as well as it can be (names decoded lossily, the
//! first headers only) and named in [`Record::defect`]: the record is poison, dead-lettered
//! once with that reason, and never handled.

use rdkafka::message::{BorrowedMessage, Message};

mod lease;
mod raw_headers;

pub use lease::Lease;
use raw_headers::RawHeader;

/// Headers a record may carry; past this the record is poison and only the first ones are
/// kept (for its dead letter).
pub const MAX_HEADERS: usize = 128;

/// A header as tally keeps it: its name and its value (`None` for a null value).
pub type Header = (String, Option<Vec<u8>>);

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub headers: Vec<Header>,
    /// Milliseconds since the epoch, when the broker gave one.
    pub timestamp: Option<i64>,
    /// Why this record cannot be handled as it came (decoding found it malformed, or it
    /// crashed its stage before): it is dead-lettered as poison with this reason.
    pub defect: Option<String>,
}

impl Record {
    /// An owned copy of `m`. Never panics, whatever the record carries.
    #[must_use]
    pub fn from_message(m: &BorrowedMessage<'_>) -> Self {
        let (raw, count) = raw_headers::read(m, MAX_HEADERS);
        let (headers, defect) = decode_headers(&raw, count);
        Self { headers, defect, ..Self::bare(m) }
    }

    /// Every header of `m`, however many, names decoded lossily: for readers that show or
    /// replay records rather than handle them (a dead letter carries the original's
    /// headers, then its own `dlt-*` ones).
    #[must_use]
    pub fn all_headers(m: &BorrowedMessage<'_>) -> Vec<Header> {
        let (raw, count) = raw_headers::read(m, usize::MAX);
        decode_headers(&raw, count).0
    }

    /// `m` without its headers: what can be read of any record without interpreting it.
    fn bare(m: &BorrowedMessage<'_>) -> Self {
        Self {
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            payload: m.payload().map(<[u8]>::to_vec),
            headers: Vec::new(),
            timestamp: m.timestamp().to_millis(),
            defect: None,
        }
    }

    /// The key as UTF-8, or an empty string for keyless or non-UTF-8 keys (they share one
    /// worker, which keeps their relative order).
    #[must_use]
    pub fn routing_key(&self) -> &str {
        self.key.as_deref().and_then(|k| std::str::from_utf8(k).ok()).unwrap_or("")
    }

    /// The first header named `name`.
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(k, _)| k == name).and_then(|(_, v)| v.as_deref())
    }

    /// Where this record first came from: its own coordinates, or those carried in the
    /// `retry-original-*` headers when it was read from a retry topic of that original
    /// topic. Anywhere else those headers are not trusted (anyone may set headers): a
    /// record carrying a forged origin dead-letters to its own topic's DLT.
    #[must_use]
    pub fn origin(&self) -> Origin {
        use tally_schema::headers as h;
        match self.header_str(h::RETRY_ORIGINAL_TOPIC).filter(|original| is_retry_topic_of(&self.topic, original)) {
            Some(topic) => Origin {
                topic: topic.to_owned(),
                partition: self
                    .header_str(h::RETRY_ORIGINAL_PARTITION)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(self.partition),
                offset: self.header_str(h::RETRY_ORIGINAL_OFFSET).and_then(|v| v.parse().ok()).unwrap_or(self.offset),
                timestamp: self.header_str(h::RETRY_ORIGINAL_TIMESTAMP).and_then(|v| v.parse().ok()),
            },
            None => Origin {
                topic: self.topic.clone(),
                partition: self.partition,
                offset: self.offset,
                timestamp: self.timestamp,
            },
        }
    }

    /// Headers other than the retry machinery's own.
    pub fn headers_without_retry(&self) -> impl Iterator<Item = &(String, Option<Vec<u8>>)> {
        self.headers.iter().filter(|(k, _)| !k.starts_with(tally_schema::headers::RETRY_PREFIX))
    }

    /// The first header named `name`, as UTF-8.
    #[must_use]
    pub fn header_str(&self, name: &str) -> Option<&str> {
        self.header(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The `traceparent` header when it is a valid W3C one.
    #[must_use]
    pub fn traceparent(&self) -> Option<&str> {
        self.header_str(tally_schema::headers::TRACEPARENT).filter(|v| tally_schema::values::is_valid_traceparent(v))
    }
}

/// The headers of a record as tally keeps them, and the first defect found: `count`
/// headers in all, of which `raw` are the first (at most [`MAX_HEADERS`]). Names that are
/// not UTF-8 are decoded lossily.
pub(crate) fn decode_headers(raw: &[RawHeader<'_>], count: usize) -> (Vec<Header>, Option<String>) {
    let mut defect = (count > MAX_HEADERS).then(|| format!("{count} headers, more than the {MAX_HEADERS} allowed"));
    let headers = raw
        .iter()
        .enumerate()
        .map(|(i, (name, value))| {
            let name = match std::str::from_utf8(name) {
                Ok(name) => name.to_owned(),
                Err(_) => {
                    let lossy = String::from_utf8_lossy(name).into_owned();
                    defect.get_or_insert_with(|| format!("header {i} has a name that is not UTF-8 ({lossy:?})"));
                    lossy
                }
            };
            (name, value.map(<[u8]>::to_vec))
        })
        .collect();
    (headers, defect)
}

/// Whether `topic` is a retry topic of `original` (`tally_schema::topics::retry`).
fn is_retry_topic_of(topic: &str, original: &str) -> bool {
    topic
        .strip_prefix(original)
        .and_then(|rest| rest.strip_prefix("-retry-"))
        .and_then(|delay| delay.parse::<u64>().ok())
        .is_some_and(|delay| tally_schema::topics::retry(original, delay) == topic)
}

/// The coordinates a record was first consumed at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub timestamp: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_schema::headers as h;

    fn record(topic: &str, headers: &[(&str, &str)]) -> Record {
        Record {
            topic: topic.into(),
            partition: 3,
            offset: 70,
            key: None,
            payload: None,
            headers: headers.iter().map(|(k, v)| ((*k).to_owned(), Some(v.as_bytes().to_vec()))).collect(),
            timestamp: Some(5),
            defect: None,
        }
    }

    #[test]
    fn headers_decode_totally() {
        let (headers, defect) = decode_headers(&[(b"event-id", Some(b"1")), (b"null", None)], 2);
        assert_eq!(headers, [("event-id".into(), Some(b"1".to_vec())), ("null".into(), None)]);
        assert_eq!(defect, None);
        let (headers, defect) = decode_headers(&[(b"ok", None), (b"\xff\xfe", Some(b"x"))], 2);
        assert_eq!(headers[1].0, "\u{fffd}\u{fffd}");
        assert!(defect.is_some_and(|d| d.contains("header 1") && d.contains("not UTF-8")));
        let (headers, defect) = decode_headers(&[(b"a", None)], MAX_HEADERS + 1);
        assert_eq!(headers.len(), 1);
        assert!(defect.is_some_and(|d| d.contains("more than")));
    }

    const RETRY_HEADERS: [(&str, &str); 3] = [
        (h::RETRY_ORIGINAL_TOPIC, "transfers.settled"),
        (h::RETRY_ORIGINAL_PARTITION, "1"),
        (h::RETRY_ORIGINAL_OFFSET, "9"),
    ];

    #[test]
    fn retry_topics_carry_their_origin() {
        let r = record(&tally_schema::topics::retry("transfers.settled", 2_000), &RETRY_HEADERS);
        assert_eq!(r.origin(), Origin { topic: "transfers.settled".into(), partition: 1, offset: 9, timestamp: None });
    }

    #[test]
    fn forged_origins_are_ignored_outside_retry_topics() {
        for topic in
            ["transfers.analyzed", "transfers.settled", "transfers.settled-retry-x", "transfers.settled-retry-01"]
        {
            let r = record(topic, &RETRY_HEADERS);
            assert_eq!(
                r.origin(),
                Origin { topic: topic.into(), partition: 3, offset: 70, timestamp: Some(5) },
                "{topic}"
            );
        }
    }
}
