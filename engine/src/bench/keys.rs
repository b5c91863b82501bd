//! The bench's event-signing key: one random key in `target/bench/keys/bench.key`, made on
//! first use, that every daemon a bench starts reads (`signing.keys_dir`) and every record
//! the bench produces itself is signed with, as a stage upstream of the one measured would.

use std::path::PathBuf;

use anyhow::Context;
use tally_actors::signing::{Keyring, SigningKey};

/// Where the bench's key lives.
pub const KEYS_DIR: &str = "target/bench/keys";
const ID: &str = "bench";

/// The bench's keys directory (for `signing.keys_dir`) and its keyring.
///
/// # Errors
/// When the key cannot be drawn, written or read back.
pub fn bench_keys() -> anyhow::Result<(PathBuf, Keyring)> {
    let dir = PathBuf::from(KEYS_DIR);
    let path = dir.join(format!("{ID}.key"));
    if !path.exists() {
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let key = SigningKey::random(ID)?;
        std::fs::write(&path, hex::encode(key.secret())).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let secret = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let dir = std::fs::canonicalize(&dir).with_context(|| format!("cannot resolve {}", dir.display()))?;
    Ok((dir, Keyring::single(SigningKey::new(ID, &secret)?)))
}
