//! Reads a consumed record's headers as librdkafka holds them: names as bytes, so that a
//! name that is not UTF-8 is a fact to report, not a panic. (rdkafka's `Headers::get`
//! and `try_get` turn every name into `&str` with `unwrap`: one record with such a name
//! would take its consumer's thread down.) The only `unsafe` outside the embedded broker.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::ptr;

use rdkafka::message::BorrowedMessage;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka_sys as rdsys;

/// One header as it came: the name's bytes and the value (`None` for a null value).
pub(super) type RawHeader<'a> = (&'a [u8], Option<&'a [u8]>);

/// The headers of `m`, at most `limit` of them, and how many there are in all.
pub(super) fn read<'m>(m: &'m BorrowedMessage<'_>, limit: usize) -> (Vec<RawHeader<'m>>, usize) {
    let mut headers = ptr::null_mut();
    // SAFETY: `m.ptr()` is the live message `m` borrows; librdkafka writes the message's
    // header list (owned by the message, valid while `m` is) into `headers`.
    let err = unsafe { rdsys::rd_kafka_message_headers(m.ptr(), &mut headers) };
    if RDKafkaErrorCode::from(err) != RDKafkaErrorCode::NoError || headers.is_null() {
        return (Vec::new(), 0);
    }
    // SAFETY: `headers` is the non-null list librdkafka just handed out for `m`.
    let count = unsafe { rdsys::rd_kafka_header_cnt(headers) };
    let mut out = Vec::with_capacity(count.min(limit));
    for idx in 0..count.min(limit) {
        let (mut name, mut value, mut size) = (ptr::null(), ptr::null(), 0_usize);
        // SAFETY: `idx` is below the list's count; librdkafka points `name` at a
        // NUL-terminated copy of the name and `value` at `size` bytes (or null), both
        // owned by the list and valid while `m` is.
        let err = unsafe { rdsys::rd_kafka_header_get_all(headers, idx, &mut name, &mut value, &mut size) };
        if RDKafkaErrorCode::from(err) != RDKafkaErrorCode::NoError || name.is_null() {
            continue;
        }
        // SAFETY: as above: a NUL-terminated name that lives as long as `m`.
        let name = unsafe { CStr::from_ptr(name) }.to_bytes();
        let value = if value.is_null() {
            None
        } else {
            // SAFETY: `value` points at `size` bytes owned by the list (see above).
            Some(unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) })
        };
        out.push((name, value));
    }
    (out, count)
}
