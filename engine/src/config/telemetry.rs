//! `[telemetry]`: distributed traces exported over OTLP/HTTP.

use super::*;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The base URL of an OTLP/HTTP collector, e.g. `http://127.0.0.1:4318`: spans go to
    /// `<endpoint>/v1/traces` as JSON. Unset (or empty): no traces are exported and no
    /// OpenTelemetry layer is installed.
    #[serde(with = "empty_is_none")]
    pub otlp_endpoint: Option<String>,
    /// The `service.name` of the exported spans.
    pub service_name: String,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self { otlp_endpoint: None, service_name: "tally".into() }
    }
}

impl TelemetryConfig {
    /// Where spans are POSTed: `<otlp_endpoint>/v1/traces`; `None` when export is off.
    #[must_use]
    pub fn traces_url(&self) -> Option<String> {
        self.otlp_endpoint.as_deref().map(|base| format!("{}/v1/traces", base.trim_end_matches('/')))
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(endpoint) = &self.otlp_endpoint {
            let parsed = reqwest::Url::parse(endpoint).ok().filter(|u| u.scheme() == "http" && u.host().is_some());
            let Some(url) = parsed else {
                return invalid(
                    "telemetry.otlp_endpoint",
                    format!(
                        "is {endpoint:?}: it must be the http:// base URL of an OTLP/HTTP collector, such as \
                         http://127.0.0.1:4318 (traces go to a local collector over plain HTTP), or \
                         empty to export no traces"
                    ),
                );
            };
            if url.query().is_some() || url.fragment().is_some() {
                return invalid("telemetry.otlp_endpoint", "must have no query or fragment");
            }
            // It is logged at start and shown by `tally config`: no credentials in it.
            if !url.username().is_empty() || url.password().is_some() {
                return invalid("telemetry.otlp_endpoint", "must carry no user name or password");
            }
            if url.path().trim_end_matches('/').ends_with("/v1/traces") {
                return invalid(
                    "telemetry.otlp_endpoint",
                    "is the collector's base URL: spans go to <otlp_endpoint>/v1/traces, so leave /v1/traces out",
                );
            }
        }
        if self.service_name.trim().is_empty() {
            return invalid("telemetry.service_name", "must not be empty");
        }
        Ok(())
    }
}

/// An optional string that files and `tally config` spell as `""` when unset.
mod empty_is_none {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(value.as_deref().unwrap_or(""))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        let value = Option::<String>::deserialize(d)?;
        Ok(value.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()))
    }
}
