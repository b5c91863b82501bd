//! Records for the unit tests of the DLT module and its children.

use super::{headers, DltRecord};

pub(crate) fn record(headers: &[(&str, &[u8])]) -> DltRecord {
    DltRecord {
        partition: 3,
        offset: 7,
        timestamp: Some(1_700_000_000_000),
        key: Some(b"K-1".to_vec()),
        payload: Some(br#"{"a":1}"#.to_vec()),
        headers: headers.iter().map(|(k, v)| ((*k).to_owned(), Some(v.to_vec()))).collect(),
    }
}

pub(crate) fn dead(kind: &str) -> DltRecord {
    record(&[
        ("event-id", b"e-1"),
        ("replayed-from", b"old/0/0"),
        (headers::DLT_ORIGINAL_TOPIC, b"transfers.analyzed"),
        (headers::DLT_ORIGINAL_PARTITION, b"3"),
        (headers::DLT_ORIGINAL_OFFSET, b"41"),
        (headers::DLT_EXCEPTION_KIND, kind.as_bytes()),
        (headers::DLT_ATTEMPTS, b"6"),
    ])
}
