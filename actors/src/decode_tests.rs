//! Property tests of every decoder a consumed record meets: whatever bytes, headers and
//! near-valid JSON a record carries, decoding returns (a value or a poison error), never
//! panics, and a failure is always poison, never a retry.

use proptest::collection::vec;
use proptest::prelude::*;

use crate::record::{Record, MAX_HEADERS};
use crate::supervise::ErrorClass;

/// JSON values at the edges of what the events' fields accept.
fn edge_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("null".to_owned()),
        Just("\"\"".to_owned()),
        Just("\"\\u0000\"".to_owned()),
        Just("-1".to_owned()),
        Just("0".to_owned()),
        Just("9223372036854775807".to_owned()),
        Just("9223372036854775808".to_owned()),
        Just("1e400".to_owned()),
        Just("{}".to_owned()),
        Just("[]".to_owned()),
        Just("\"00000000-0000-0000-0000-000000000000\"".to_owned()),
        Just("\"BRL\"".to_owned()),
        Just("\"CC-001\"".to_owned()),
        Just("\"2026-11-30T00:00:00Z\"".to_owned()),
        Just("\"+275760-09-13T00:00:00Z\"".to_owned()),
        Just(format!("\"{}\"", "x".repeat(5_000))),
        any::<i64>().prop_map(|n| n.to_string()),
        "[a-zA-Z0-9 ._-]{0,40}".prop_map(|s| format!("\"{s}\"")),
    ]
}

/// A JSON object over the events' field names (and a stray one), each with an edge value.
fn near_valid_event() -> impl Strategy<Value = Vec<u8>> {
    const FIELDS: [&str; 14] = [
        "eventId",
        "transferId",
        "sourceAccount",
        "destinationAccount",
        "amountCents",
        "currency",
        "score",
        "analyzedAt",
        "requestedAt",
        "settledAt",
        "rejectedAt",
        "reason",
        "orderId",
        "externalReference",
    ];
    vec((0..FIELDS.len() + 1, edge_value()), 0..16).prop_map(|fields| {
        let body: Vec<String> = fields
            .into_iter()
            .map(|(i, v)| format!("\"{}\":{v}", FIELDS.get(i).copied().unwrap_or("customerId")))
            .collect();
        format!("{{{}}}", body.join(",")).into_bytes()
    })
}

fn payload() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![Just(None), vec(any::<u8>(), 0..300).prop_map(Some), near_valid_event().prop_map(Some)]
}

fn record() -> impl Strategy<Value = Record> {
    let headers = vec((".{0,12}", proptest::option::of(vec(any::<u8>(), 0..40))), 0..6);
    (
        proptest::option::of(vec(any::<u8>(), 0..40)),
        payload(),
        headers,
        prop_oneof![Just("transfers.settled".to_owned()), Just("transfers.rejected".to_owned())],
    )
        .prop_map(|(key, payload, headers, topic)| Record { topic, key, payload, headers, ..Record::default() })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn every_decoder_is_total_and_fails_only_as_poison(r in record()) {
        let failures = [
            crate::ledger::decode_analyzed(&r).err(),
            crate::orders::decode_order_received(&r).err(),
            crate::projection::decode(&r, "transfers.settled").err(),
        ];
        for e in failures.into_iter().flatten() {
            prop_assert_eq!(e.class, ErrorClass::Poison, "{}", e.message);
        }
        // What the consumption machinery reads of any record.
        let _ = (r.routing_key(), r.origin(), r.traceparent());
    }

    #[test]
    fn any_header_bytes_decode_and_every_oddity_is_named(
        raw in vec((vec(any::<u8>(), 0..24), proptest::option::of(vec(any::<u8>(), 0..24))), 0..(MAX_HEADERS + 20)),
    ) {
        let borrowed: Vec<(&[u8], Option<&[u8]>)> =
            raw.iter().map(|(n, v)| (n.as_slice(), v.as_deref())).collect();
        let kept = &borrowed[..borrowed.len().min(MAX_HEADERS)];
        let (headers, defect) = crate::record::decode_headers(kept, borrowed.len());
        prop_assert_eq!(headers.len(), kept.len());
        for ((name, value), (raw_name, raw_value)) in headers.iter().zip(kept) {
            prop_assert_eq!(value.as_deref(), *raw_value, "values are kept byte for byte");
            if let Ok(exact) = std::str::from_utf8(raw_name) {
                prop_assert_eq!(name.as_str(), exact);
            }
        }
        let odd = borrowed.len() > MAX_HEADERS || kept.iter().any(|(n, _)| std::str::from_utf8(n).is_err());
        prop_assert_eq!(defect.is_some(), odd, "{:?}", defect);
    }
}
