//! `[signing]`: the keys that sign the events tally produces and that every stage checks
//! on the events it consumes (`tally_actors::signing`).

use std::path::Path;

use tally_actors::signing::{Keyring, SigningKey};

use super::*;

/// Where the event-signing keys are and which one signs.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SigningConfig {
    /// A directory of keys: each `<id>.key` file in it is a key tally accepts, named `<id>`;
    /// its content (at least 32 bytes, e.g. `openssl rand -hex 32`; a trailing newline is
    /// not part of it) is the secret. Every instance of a deployment needs the same keys.
    /// Empty: with `kafka.brokers = "embedded"`, a random key the embedded broker draws at
    /// start (its records die with it); on any other broker the start is refused.
    pub keys_dir: String,
    /// The id of the key that signs. Empty: the only key of `keys_dir`.
    pub key_id: String,
    /// Also take records that carry no signature at all (a record with a bad one is never
    /// taken): only while upgrading from a release that did not sign its events, until its
    /// records are consumed.
    pub accept_unsigned: bool,
}

impl SigningConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.keys_dir.is_empty() && !self.key_id.is_empty() {
            return invalid("signing.key_id", "is set, and signing.keys_dir is not: the key must come from there");
        }
        Ok(())
    }

    /// The keyring the daemon signs and checks with: the keys of `keys_dir`, or the
    /// embedded broker's key when there is no `keys_dir`.
    ///
    /// # Errors
    /// When `keys_dir` cannot be read, holds no usable key, or lacks `key_id`; or when
    /// neither `keys_dir` nor an embedded broker gives a key.
    pub fn keyring(&self, embedded: Option<&SigningKey>) -> anyhow::Result<Keyring> {
        use anyhow::{bail, Context};
        if self.keys_dir.is_empty() {
            let Some(key) = embedded else {
                bail!(
                    "signing.keys_dir is not set: on a shared Kafka cluster every instance signs and checks events \
                     with the same keys. Create one (`mkdir -p /etc/tally/signing && openssl rand -hex 32 > \
                     /etc/tally/signing/k1.key`), give every instance a copy, and set signing.keys_dir"
                );
            };
            return Ok(Keyring::new(vec![key.clone()], key.id(), self.accept_unsigned)?);
        }
        let keys = read_keys(Path::new(&self.keys_dir))?;
        let signing = match (self.key_id.as_str(), keys.as_slice()) {
            ("", [only]) => only.id().to_owned(),
            ("", []) => bail!("signing.keys_dir {} holds no `<id>.key` file", self.keys_dir),
            ("", _) => bail!(
                "signing.keys_dir {} holds {} keys ({}): set signing.key_id to the one that signs",
                self.keys_dir,
                keys.len(),
                keys.iter().map(SigningKey::id).collect::<Vec<_>>().join(", ")
            ),
            (id, _) => id.to_owned(),
        };
        Keyring::new(keys, &signing, self.accept_unsigned)
            .with_context(|| format!("signing.key_id: no key `{signing}` in {}", self.keys_dir))
    }
}

/// Every `<id>.key` file of `dir`, by id. Other files (an editor's backup, a README) are
/// left alone.
fn read_keys(dir: &Path) -> anyhow::Result<Vec<SigningKey>> {
    use anyhow::Context;
    let mut keys = Vec::new();
    let entries = std::fs::read_dir(dir).with_context(|| format!("signing.keys_dir: cannot read {}", dir.display()))?;
    for entry in entries {
        let path = entry.with_context(|| format!("signing.keys_dir: cannot read {}", dir.display()))?.path();
        let (Some(id), Some("key")) =
            (path.file_stem().and_then(|s| s.to_str()), path.extension().and_then(|e| e.to_str()))
        else {
            continue;
        };
        let bytes =
            std::fs::read(&path).with_context(|| format!("signing.keys_dir: cannot read {}", path.display()))?;
        let secret = bytes.strip_suffix(b"\n").map_or(bytes.as_slice(), |b| b.strip_suffix(b"\r").unwrap_or(b));
        keys.push(SigningKey::new(id, secret).with_context(|| format!("signing.keys_dir: {}", path.display()))?);
        warn_if_readable_by_others(&path);
    }
    keys.sort_by(|a, b| a.id().cmp(b.id()));
    Ok(keys)
}

fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o004 != 0) {
        tracing::warn!(path = %path.display(), "An event-signing key is readable by every user: chmod o-r it.");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(keys: &[(&str, &[u8])]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("tally-keys-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, content) in keys {
            std::fs::write(dir.join(name), content).unwrap();
        }
        dir
    }

    fn config(dir: &Path, key_id: &str) -> SigningConfig {
        SigningConfig { keys_dir: dir.display().to_string(), key_id: key_id.into(), accept_unsigned: false }
    }

    #[test]
    fn keys_come_from_their_files_and_one_signs() {
        let secret = [b'a'; 64];
        let mut with_newline = secret.to_vec();
        with_newline.push(b'\n');
        let dir = dir_with(&[("old.key", &secret), ("new.key", &with_newline), ("new.key~", b"x"), ("README", b"x")]);
        let ring = config(&dir, "new").keyring(None).unwrap();
        assert_eq!(ring.signing_id(), "new");
        assert_eq!(ring.accepted_ids().collect::<Vec<_>>(), ["new", "old"], "only *.key files");
        let e = config(&dir, "").keyring(None).unwrap_err().to_string();
        assert!(e.contains("set signing.key_id") && e.contains("new, old"), "{e}");
        let e = format!("{:#}", config(&dir, "gone").keyring(None).unwrap_err());
        assert!(e.contains("no key `gone`"), "{e}");
        let single = dir_with(&[("only.key", &secret)]);
        assert_eq!(config(&single, "").keyring(None).unwrap().signing_id(), "only");
    }

    #[test]
    fn unusable_keys_and_a_missing_source_stop_the_start() {
        let short = dir_with(&[("k.key", b"0123456789abcdef\n")]);
        let e = format!("{:#}", config(&short, "").keyring(None).unwrap_err());
        assert!(e.contains("k.key") && e.contains("at least 32"), "{e}");
        let empty = dir_with(&[]);
        assert!(config(&empty, "").keyring(None).unwrap_err().to_string().contains("holds no"));
        let missing = Path::new("/nonexistent/tally-keys");
        assert!(config(missing, "").keyring(None).unwrap_err().to_string().contains("cannot read"));
        let e = SigningConfig::default().keyring(None).unwrap_err().to_string();
        assert!(e.contains("signing.keys_dir is not set"), "{e}");
        let embedded = SigningKey::random("embedded").unwrap();
        assert_eq!(SigningConfig::default().keyring(Some(&embedded)).unwrap().signing_id(), "embedded");
        let c = SigningConfig { key_id: "k".into(), ..SigningConfig::default() };
        assert!(c.validate().is_err());
    }
}
