//! Records no well-behaved producer writes: header names that are not UTF-8, more headers
//! than tally takes, null keys and values, bytes that are not JSON. rdkafka's typed API
//! only takes `&str` header names, so these go through librdkafka's `rd_kafka_produceva`
//! with the names as bytes. The only `unsafe` of the harness.
#![allow(unsafe_code)]

use std::ffi::{c_void, CStr, CString};
use std::time::Duration;

use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::ClientConfig;
use rdkafka_sys as rdsys;

/// One record as raw bytes.
#[derive(Debug, Clone, Default)]
pub struct RawRecord {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// Names as bytes; `None` values are null header values.
    pub headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl RawRecord {
    /// This record with a signature of `keyring` (over its key, value and first `event-id`
    /// and `event-type` headers, as tally signs), so that it passes the signature check
    /// and reaches the stage's decoding.
    #[must_use]
    pub fn signed(&self, keyring: &tally_actors::signing::Keyring) -> Self {
        let header = |name: &[u8]| self.headers.iter().find(|(k, _)| k == name).and_then(|(_, v)| v.as_deref());
        let fields = tally_actors::signing::Fields {
            key: self.key.as_deref(),
            value: self.value.as_deref(),
            event_id: header(b"event-id"),
            event_type: header(b"event-type"),
        };
        let mut signed = self.clone();
        signed.headers.push((tally_actors::signing::SIGNATURE_KEY.into(), Some(keyring.signing_id().into())));
        signed.headers.push((tally_actors::signing::SIGNATURE.into(), Some(keyring.signature(&fields).into_bytes())));
        signed
    }
}

/// The hostile records every consumed topic must survive, each with a name for messages.
#[must_use]
pub fn hostile_records() -> Vec<(&'static str, RawRecord)> {
    let json = br#"{"eventId":"00000000-0000-0000-0000-000000000000"}"#.to_vec();
    let key = Some(b"CC-HOSTILE".to_vec());
    vec![
        (
            "a header name that is not UTF-8",
            RawRecord {
                key: key.clone(),
                value: Some(json.clone()),
                headers: vec![(b"\xff\xfe".to_vec(), Some(b"x".to_vec()))],
            },
        ),
        (
            "500 headers",
            RawRecord {
                key: key.clone(),
                value: Some(json.clone()),
                headers: (0..500).map(|i| (format!("h{i}").into_bytes(), None)).collect(),
            },
        ),
        ("a tombstone", RawRecord { key: key.clone(), value: None, headers: Vec::new() }),
        (
            "no key and a value that is not JSON",
            RawRecord { key: None, value: Some(vec![0, 159, 146, 150]), headers: Vec::new() },
        ),
        (
            "a key that is not UTF-8 and a null header value",
            RawRecord {
                key: Some(b"\xc3\x28".to_vec()),
                value: Some(b"{}".to_vec()),
                headers: vec![(b"event-id".to_vec(), None), (b"traceparent".to_vec(), Some(b"\xff".to_vec()))],
            },
        ),
    ]
}

/// Produces `records` to partition `partition` of `topic` (idempotent producer, acks=all),
/// in order, and waits until the broker acknowledged them.
///
/// # Panics
/// When the producer cannot be created or a record is refused.
pub fn produce_raw(bootstrap: &str, topic: &str, partition: i32, records: &[RawRecord]) {
    if let Err(e) = try_produce_raw(bootstrap, topic, partition, records) {
        panic!("{e}");
    }
}

/// The delivery errors of a producer's records.
#[derive(Default)]
struct Deliveries(std::sync::Mutex<Vec<String>>);

impl rdkafka::ClientContext for Deliveries {}

impl rdkafka::producer::ProducerContext for Deliveries {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &rdkafka::message::DeliveryResult<'_>, (): ()) {
        if let Err((e, _)) = result {
            self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(e.to_string());
        }
    }
}

/// [`produce_raw`], with a refused or unacknowledged record as an error.
///
/// # Errors
/// When a record is refused at once or in its delivery report, or not acknowledged
/// within 30 s.
///
/// # Panics
/// When the producer cannot be created.
pub fn try_produce_raw(bootstrap: &str, topic: &str, partition: i32, records: &[RawRecord]) -> Result<(), String> {
    let producer: BaseProducer<Deliveries> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("log_level", "3")
        .create_with_context(Deliveries::default())
        .expect("raw producer");
    let topic_name = CString::new(topic).expect("topic name");
    for record in records {
        // SAFETY: a fresh header list, owned here until `rd_kafka_produceva` takes it.
        let headers = unsafe { rdsys::rd_kafka_headers_new(record.headers.len()) };
        for (name, value) in &record.headers {
            let (value_ptr, value_len) =
                value.as_ref().map_or((std::ptr::null(), 0), |v| (v.as_ptr().cast::<c_void>(), v.len()));
            // SAFETY: `headers` is live; librdkafka copies `name` and `value` (with the
            // sizes given), so they need not outlive the call.
            unsafe {
                rdsys::rd_kafka_header_add(
                    headers,
                    name.as_ptr().cast(),
                    name.len() as isize,
                    value_ptr,
                    value_len as isize,
                );
            }
        }
        let mem = |bytes: &Option<Vec<u8>>| rdsys::rd_kafka_vu_s__bindgen_ty_1 {
            mem: rdsys::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
                ptr: bytes.as_ref().map_or(std::ptr::null_mut(), |b| b.as_ptr().cast_mut().cast()),
                size: bytes.as_ref().map_or(0, Vec::len),
            },
        };
        use rdsys::rd_kafka_vtype_t as V;
        let vus = [
            rdsys::rd_kafka_vu_t {
                vtype: V::RD_KAFKA_VTYPE_TOPIC,
                u: rdsys::rd_kafka_vu_s__bindgen_ty_1 { cstr: topic_name.as_ptr() },
            },
            rdsys::rd_kafka_vu_t {
                vtype: V::RD_KAFKA_VTYPE_PARTITION,
                u: rdsys::rd_kafka_vu_s__bindgen_ty_1 { i32_: partition },
            },
            rdsys::rd_kafka_vu_t { vtype: V::RD_KAFKA_VTYPE_KEY, u: mem(&record.key) },
            rdsys::rd_kafka_vu_t { vtype: V::RD_KAFKA_VTYPE_VALUE, u: mem(&record.value) },
            rdsys::rd_kafka_vu_t {
                vtype: V::RD_KAFKA_VTYPE_MSGFLAGS,
                u: rdsys::rd_kafka_vu_s__bindgen_ty_1 { i: rdsys::RD_KAFKA_MSG_F_COPY },
            },
            rdsys::rd_kafka_vu_t {
                vtype: V::RD_KAFKA_VTYPE_HEADERS,
                u: rdsys::rd_kafka_vu_s__bindgen_ty_1 { headers },
            },
        ];
        // SAFETY: the producer's handle is live; every pointer in `vus` is valid for the
        // call, and with RD_KAFKA_MSG_F_COPY librdkafka copies key and value. On success
        // it owns `headers`; on failure they are still ours and destroyed below.
        let error = unsafe { rdsys::rd_kafka_produceva(producer.client().native_ptr(), vus.as_ptr(), vus.len()) };
        if !error.is_null() {
            // SAFETY: a non-null error object returned to us, with its NUL-terminated text.
            let message = unsafe { CStr::from_ptr(rdsys::rd_kafka_error_string(error)) }.to_string_lossy().into_owned();
            // SAFETY: both are ours to destroy after a failed call.
            unsafe {
                rdsys::rd_kafka_error_destroy(error);
                rdsys::rd_kafka_headers_destroy(headers);
            }
            return Err(format!("producing a raw record to {topic} failed: {message}"));
        }
    }
    producer.flush(Duration::from_secs(30)).map_err(|e| format!("raw records to {topic} not acknowledged: {e}"))?;
    let refused = std::mem::take(&mut *producer.context().0.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    match refused.is_empty() {
        true => Ok(()),
        false => Err(format!("raw records to {topic} refused: {refused:?}")),
    }
}
