//! Event signatures: every record tally produces carries an HMAC-SHA-256 over its key, its
//! value and the headers that say what it is (`event-id`, `event-type`), with the id of the
//! key that signed it; every stage refuses a record that is unsigned or badly signed, as
//! poison (`bad signature`), before it reads it. Kafka ACLs decide who may write to
//! tally's topics; this decides whether what was written came from tally.
//!
//! A [`Keyring`] holds the keys a daemon accepts and the one it signs with, so that a key
//! is rotated without a gap: every instance first accepts the new key, then signs with it,
//! then stops accepting the old one (`docs/ARCHITECTURE.md`, "Event signatures").
//!
//! The signed message is unambiguous: a domain tag, then each field as a presence byte and,
//! when present, its length (u32, big-endian) and bytes. Headers the transport adds on the
//! way (`traceparent`, the retry topics' `retry-*`, a dead letter's `dlt-*`, a replay's
//! `replayed-from`) are not signed, so a record keeps its signature through retry topics,
//! dead-letter topics and replays.

use std::fmt;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use rdkafka::message::{Header, OwnedHeaders};
use sha2::Sha256;
use tally_schema::headers;

use crate::record::Record;

/// The header holding a record's signature: `v1=` and the HMAC's 64 hexadecimal digits.
pub const SIGNATURE: &str = "signature";
/// The header naming the key that signed the record.
pub const SIGNATURE_KEY: &str = "signature-key";

const DOMAIN: &[u8] = b"tally-event-signature-v1\0";
const VERSION_PREFIX: &str = "v1=";
/// Fewest bytes of a key: HMAC-SHA-256's security needs at least as many as its output.
pub const MIN_KEY_BYTES: usize = 32;

/// One signing key: its id (carried in [`SIGNATURE_KEY`]) and its secret bytes, which never
/// print.
#[derive(Clone)]
pub struct SigningKey {
    id: String,
    secret: Arc<[u8]>,
    /// The HMAC keyed with `secret`, cloned for each message.
    keyed: Hmac<Sha256>,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey").field("id", &self.id).field("secret", &"<redacted>").finish()
    }
}

/// Why a key or a keyring cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    #[error("key id `{0}` is not 1 to 64 of A-Z, a-z, 0-9, `.`, `_`, `-`")]
    BadId(String),
    #[error("key `{id}` has {len} bytes; a key needs at least {MIN_KEY_BYTES}")]
    TooShort { id: String, len: usize },
    #[error("key id `{0}` names two keys")]
    Duplicate(String),
    #[error("no key is named `{0}`")]
    Unknown(String),
    #[error("no key to sign with")]
    Empty,
    #[error("cannot draw a random key: {0}")]
    Random(String),
}

impl SigningKey {
    /// A key named `id` with `secret`.
    ///
    /// # Errors
    /// When the id breaks its rule or the secret is shorter than [`MIN_KEY_BYTES`].
    pub fn new(id: &str, secret: &[u8]) -> Result<Self, KeyError> {
        let good = (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !good {
            return Err(KeyError::BadId(id.to_owned()));
        }
        if secret.len() < MIN_KEY_BYTES {
            return Err(KeyError::TooShort { id: id.to_owned(), len: secret.len() });
        }
        // HMAC takes keys of any length: this never fails.
        let keyed = <Hmac<Sha256> as Mac>::new_from_slice(secret)
            .map_err(|_| KeyError::TooShort { id: id.to_owned(), len: secret.len() })?;
        Ok(Self { id: id.to_owned(), secret: secret.into(), keyed })
    }

    /// A fresh random key named `id`: for a broker whose records live and die with the
    /// process that holds the key (the embedded broker). Its secret is the hexadecimal text
    /// of 32 random bytes, as `openssl rand -hex 32` makes one: written to a key file it
    /// reads back the same (raw bytes ending in a newline would lose it).
    ///
    /// # Errors
    /// When the operating system gives no random bytes.
    pub fn random(id: &str) -> Result<Self, KeyError> {
        let mut secret = [0_u8; MIN_KEY_BYTES];
        getrandom::fill(&mut secret).map_err(|e| KeyError::Random(e.to_string()))?;
        Self::new(id, hex::encode(secret).as_bytes())
    }

    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The secret's bytes, for writing it where another process reads it (tests, the
    /// bench's children).
    #[must_use]
    pub fn secret(&self) -> &[u8] {
        &self.secret
    }

    fn mac(&self, fields: &Fields<'_>) -> Hmac<Sha256> {
        let mut mac = self.keyed.clone();
        mac.update(DOMAIN);
        for field in [fields.key, fields.value, fields.event_id, fields.event_type] {
            match field {
                None => mac.update(&[0]),
                Some(bytes) => {
                    mac.update(&[1]);
                    mac.update(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
                    mac.update(bytes);
                }
            }
        }
        mac
    }
}

/// What a signature covers.
#[derive(Debug, Clone, Copy)]
pub struct Fields<'a> {
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub event_id: Option<&'a [u8]>,
    pub event_type: Option<&'a [u8]>,
}

/// The keys a daemon accepts and the one it signs with. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Keyring {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    signing: SigningKey,
    accepted: Vec<SigningKey>,
    /// Records without any signature are taken (a rolling upgrade from a release that did
    /// not sign); a record with a bad signature never is.
    accept_unsigned: bool,
}

impl Keyring {
    /// Signs with the key named `signing` and accepts every key of `keys`.
    ///
    /// # Errors
    /// When `keys` is empty, names a key twice, or has none named `signing`.
    pub fn new(keys: Vec<SigningKey>, signing: &str, accept_unsigned: bool) -> Result<Self, KeyError> {
        if keys.is_empty() {
            return Err(KeyError::Empty);
        }
        for (i, k) in keys.iter().enumerate() {
            if keys[..i].iter().any(|other| other.id == k.id) {
                return Err(KeyError::Duplicate(k.id.clone()));
            }
        }
        let signing =
            keys.iter().find(|k| k.id == signing).cloned().ok_or_else(|| KeyError::Unknown(signing.into()))?;
        Ok(Self { inner: Arc::new(Inner { signing, accepted: keys, accept_unsigned }) })
    }

    /// A keyring of the one key `key`, signing with it.
    #[must_use]
    pub fn single(key: SigningKey) -> Self {
        Self { inner: Arc::new(Inner { signing: key.clone(), accepted: vec![key], accept_unsigned: false }) }
    }

    /// The id of the key it signs with.
    #[must_use]
    pub fn signing_id(&self) -> &str {
        &self.inner.signing.id
    }

    /// The ids of every key it accepts.
    pub fn accepted_ids(&self) -> impl Iterator<Item = &str> {
        self.inner.accepted.iter().map(|k| k.id.as_str())
    }

    /// The signature header value of `fields` under the signing key.
    #[must_use]
    pub fn signature(&self, fields: &Fields<'_>) -> String {
        format!("{VERSION_PREFIX}{}", hex::encode(self.inner.signing.mac(fields).finalize().into_bytes()))
    }

    /// `headers` with the signature of a record of `key` and `value` whose `event-id` and
    /// `event-type` headers are `event_id` and `event_type` (which `headers` must carry).
    #[must_use]
    pub fn sign(
        &self,
        headers: OwnedHeaders,
        key: &[u8],
        value: &[u8],
        event_id: &str,
        event_type: &str,
    ) -> OwnedHeaders {
        let fields = Fields {
            key: Some(key),
            value: Some(value),
            event_id: Some(event_id.as_bytes()),
            event_type: Some(event_type.as_bytes()),
        };
        let signature = self.signature(&fields);
        headers
            .insert(Header { key: SIGNATURE_KEY, value: Some(self.inner.signing.id.as_bytes()) })
            .insert(Header { key: SIGNATURE, value: Some(signature.as_bytes()) })
    }

    /// Whether `record` was signed by a key of this keyring (or is unsigned while unsigned
    /// records are accepted). `Err` says what is wrong, for the dead letter's reason.
    ///
    /// # Errors
    /// The reason the record is refused.
    pub fn verify(&self, record: &Record) -> Result<(), String> {
        let one = |name: &str| -> Result<Option<&[u8]>, String> {
            let mut found = record.headers.iter().filter(|(k, _)| k == name);
            let first = found.next();
            if found.next().is_some() {
                return Err(format!("more than one `{name}` header"));
            }
            match first {
                None => Ok(None),
                Some((_, None)) => Err(format!("the `{name}` header has no value")),
                Some((_, Some(v))) => Ok(Some(v.as_slice())),
            }
        };
        let event_id = one(headers::EVENT_ID)?;
        let event_type = one(headers::EVENT_TYPE)?;
        let (key_id, signature) = match (one(SIGNATURE_KEY)?, one(SIGNATURE)?) {
            (None, None) if self.inner.accept_unsigned => return Ok(()),
            (None, None) => return Err("unsigned".into()),
            (Some(id), Some(signature)) => (id, signature),
            _ => return Err(format!("needs both the `{SIGNATURE_KEY}` and `{SIGNATURE}` headers")),
        };
        let key = self
            .inner
            .accepted
            .iter()
            .find(|k| k.id.as_bytes() == key_id)
            .ok_or_else(|| format!("unknown key `{}`", String::from_utf8_lossy(key_id).escape_debug()))?;
        let digest = std::str::from_utf8(signature)
            .ok()
            .and_then(|s| s.strip_prefix(VERSION_PREFIX))
            .and_then(|hex_digest| hex::decode(hex_digest).ok())
            .ok_or("the signature is not `v1=` and hexadecimal digits")?;
        let fields = Fields { key: record.key.as_deref(), value: record.payload.as_deref(), event_id, event_type };
        key.mac(&fields).verify_slice(&digest).map_err(|_| format!("does not match key `{}`", key.id))
    }

    /// [`Keyring::verify`], as the defect of a record that fails it: `bad signature: ...`.
    /// A record that already has a defect keeps it.
    pub fn check(&self, record: &mut Record) {
        if record.defect.is_none() {
            if let Err(why) = self.verify(record) {
                record.defect = Some(format!("bad signature: {why}"));
            }
        }
    }
}

#[cfg(test)]
mod tests;
