//! An owned copy of a consumed Kafka record, shared between actors.

use rdkafka::message::{BorrowedMessage, Headers, Message};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Milliseconds since the epoch, when the broker gave one.
    pub timestamp: Option<i64>,
}

impl Record {
    #[must_use]
    pub fn from_message(m: &BorrowedMessage<'_>) -> Self {
        let headers = m
            .headers()
            .map(|h| h.iter().map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec))).collect())
            .unwrap_or_default();
        Self {
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            payload: m.payload().map(<[u8]>::to_vec),
            headers,
            timestamp: m.timestamp().to_millis(),
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

    /// The first header named `name`, as UTF-8.
    #[must_use]
    pub fn header_str(&self, name: &str) -> Option<&str> {
        self.header(name).and_then(|v| std::str::from_utf8(v).ok())
    }
}
