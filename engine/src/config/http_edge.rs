//! The edge of both listeners: request deadlines, connection caps, the admin listener's
//! host names, trusted proxies, and the refusal to serve an unauthenticated intake beyond
//! loopback.

use std::net::IpAddr;

use super::*;

impl HttpConfig {
    pub(super) fn validate_edge(&self) -> Result<(), ConfigError> {
        if !(100..=600_000).contains(&self.request_timeout.as_millis()) {
            return invalid("http.request_timeout_ms", "must be between 100 and 600000");
        }
        if !(1..=1_000_000).contains(&self.max_connections) {
            return invalid("http.max_connections", "must be between 1 and 1000000");
        }
        if !(1..=self.max_connections).contains(&self.max_connections_per_address) {
            return invalid("http.max_connections_per_address", "must be between 1 and http.max_connections");
        }
        if !(1..=100_000).contains(&self.admin_max_connections) {
            return invalid("http.admin_max_connections", "must be between 1 and 100000");
        }
        if let Some(bad) = self.admin_hosts.iter().find(|h| h.is_empty() || h.contains(['/', ' ', ':'])) {
            return invalid("http.admin_hosts", format!("`{bad}` is not a host name (no port, no scheme)"));
        }
        if let Some(bad) = self.trusted_proxies.iter().find(|p| parse_network(p).is_none()) {
            return invalid("http.trusted_proxies", format!("`{bad}` is not an IP address or a CIDR block"));
        }
        let open = !self.intake_auth && !self.intake_addr.ip().is_loopback();
        if open && !self.insecure_anonymous_intake {
            return invalid(
                "http.intake_auth",
                format!(
                    "is off and http.intake_addr ({}) is not a loopback address: anyone who reaches it could open \
                     accounts, issue money and move it. Turn http.intake_auth on with an [[http.clients]] entry per \
                     caller, or bind the intake to loopback; set http.insecure_anonymous_intake = true only if \
                     something in front of tally authenticates every caller",
                    self.intake_addr
                ),
            );
        }
        Ok(())
    }

    /// The networks of `trusted_proxies`.
    #[must_use]
    pub fn trusted_networks(&self) -> Vec<ipnet::IpNet> {
        self.trusted_proxies.iter().filter_map(|p| parse_network(p)).collect()
    }
}

/// An address (as a /32 or /128) or a CIDR block.
fn parse_network(text: &str) -> Option<ipnet::IpNet> {
    let text = text.trim();
    text.parse::<ipnet::IpNet>().ok().or_else(|| text.parse::<IpAddr>().ok().map(ipnet::IpNet::from))
}

#[cfg(test)]
mod tests {
    use super::*;
    use figment::providers::{Format, Serialized, Toml};
    use figment::Figment;

    fn with(toml: &str) -> Result<Config, ConfigError> {
        Config::from_figment(&Figment::from(Serialized::defaults(Config::default())).merge(Toml::string(toml)))
    }

    #[test]
    fn an_unauthenticated_intake_beyond_loopback_needs_the_loud_override() {
        let e = with("[http]\nintake_addr = \"0.0.0.0:8080\"").unwrap_err().to_string();
        assert!(e.contains("http.intake_auth") && e.contains("anyone who reaches it"), "{e}");
        with("[http]\nintake_addr = \"0.0.0.0:8080\"\ninsecure_anonymous_intake = true").unwrap();
        with("[http]\nintake_addr = \"[::1]:8080\"").unwrap();
        let digest = "0".repeat(64);
        with(&format!(
            "[http]\nintake_addr = \"0.0.0.0:8080\"\nintake_auth = true\n[[http.clients]]\nname = \"a\"\n\
             token_sha256 = \"{digest}\""
        ))
        .unwrap();
    }

    #[test]
    fn edge_keys_are_checked() {
        for (toml, key) in [
            ("[http]\nrequest_timeout_ms = 0", "http.request_timeout_ms"),
            ("[http]\nmax_connections = 0", "http.max_connections"),
            ("[http]\nmax_connections = 10\nmax_connections_per_address = 11", "http.max_connections_per_address"),
            ("[http]\nadmin_hosts = [\"http://x\"]", "http.admin_hosts"),
            ("[http]\ntrusted_proxies = [\"10.0.0.0/33\"]", "http.trusted_proxies"),
            ("[http]\nanonymous_scopes = [\"read\", \"everything\"]", "http.anonymous_scopes"),
        ] {
            let e = with(toml).unwrap_err().to_string();
            assert!(e.contains(key), "{toml}: {e}");
        }
        let c = with("[http]\ntrusted_proxies = [\"10.0.0.0/8\", \"192.0.2.7\"]\nadmin_hosts = [\"tally.internal\"]")
            .unwrap();
        assert_eq!(c.http.trusted_networks().len(), 2);
        assert_eq!(c.http.anonymous_scopes(), tally_actors::authority::Scopes::all(), "no clients: every scope");
        let c = with("[http]\nclients = [{ name = \"a\", token_sha256 = [\"0000000000000000000000000000000000000000000000000000000000000000\"] }]").unwrap();
        assert_eq!(c.http.anonymous_scopes(), tally_actors::authority::Scopes::ordinary(), "clients: no issue");
        let c = with("[http]\nanonymous_scopes = [\"read\"]").unwrap();
        assert_eq!(c.http.anonymous_scopes(), [tally_actors::authority::Scope::Read].into_iter().collect());
    }
}
