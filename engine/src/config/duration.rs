//! Durations in the configuration: `Duration` in the code, whole milliseconds or seconds
//! in files and environment variables (the key says which: `*_ms`, `*_secs`).

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// `Duration` as whole milliseconds.
pub mod ms {
    use super::{Deserialize, Deserializer, Duration, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

/// `Duration` as whole seconds.
pub mod secs {
    use super::{Deserialize, Deserializer, Duration, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_secs)
    }
}
