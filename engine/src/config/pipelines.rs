//! `[pipelines]`: which parts of tally run on this daemon.

use super::*;

/// Which parts run on this daemon, by name: `outbox` (publish outbox rows to Kafka) and
/// each stage of [`crate::stages::STAGES`]. Every part runs unless switched off.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(transparent)]
pub struct PipelinesConfig(BTreeMap<String, bool>);

/// The `[pipelines]` switch of the outbox publisher, the one part of the frame that can be
/// switched off.
pub const OUTBOX: &str = "outbox";

impl PipelinesConfig {
    /// Whether the part called `name` runs here.
    #[must_use]
    pub fn runs(&self, name: &str) -> bool {
        self.0.get(name).copied().unwrap_or(true)
    }

    /// Switches the part called `name` on or off.
    pub fn set(&mut self, name: &str, on: bool) {
        self.0.insert(name.to_owned(), on);
    }

    /// Every part's name: `outbox`, then the stages in their start order.
    #[must_use]
    pub fn names() -> Vec<&'static str> {
        std::iter::once(OUTBOX).chain(crate::stages::STAGES.iter().map(|s| s.name)).collect()
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let names = Self::names();
        if let Some(unknown) = self.0.keys().find(|k| !names.contains(&k.as_str())) {
            return invalid(
                "pipelines",
                format!("names {unknown}, which is not a part of tally ({})", names.join(", ")),
            );
        }
        Ok(())
    }
}

impl Serialize for PipelinesConfig {
    /// Every part, in [`PipelinesConfig::names`] order, as `tally config` shows them.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        for name in Self::names() {
            map.serialize_entry(name, &self.runs(name))?;
        }
        map.end()
    }
}
