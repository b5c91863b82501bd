//! `tally config --example`: the commented example configuration, generated from the
//! defaults of [`Config`] so that it cannot drift from them. Every key is listed with its
//! default and one line saying what it does; a key whose default is derived (from the
//! host, or from other keys) is shown commented out, so that the derivation still applies.

use super::Config;

/// One line per key, by its path. `*.retry.<key>` serves every pipeline's `[... .retry]`.
const KEYS: &[(&str, &str)] = &[
    ("instance", "Who this daemon is among the instances of one deployment."),
    (
        "instance.id",
        "Stable, unique per running instance; names the transactional and static member ids. Default: the host name.",
    ),
    (
        "instance.static_membership",
        "Join consumer groups as static members `<id>-<pipeline>` (no rebalance on a restart).",
    ),
    ("database", "Where PostgreSQL is. The database is created if missing and migrated at start."),
    ("database.url", "PostgreSQL URL (or TALLY__DATABASE__URL); its password never prints."),
    ("database.password", "The password, when not in the URL; never printed."),
    ("database.password_file", "A file holding database.password (a mounted secret)."),
    (
        "database.sslmode",
        "disable, prefer, require, verify-ca or verify-full (as libpq); empty: the URL's, else prefer.",
    ),
    ("database.sslrootcert", "PEM file of the server certificate's roots, or \"system\"; empty: the URL's."),
    ("database.statement_timeout_ms", "Longest run of one SQL statement."),
    ("database.connect_timeout_ms", "Longest wait for a pooled connection, and for a new one to open."),
    ("database.pools", "Connections per stage; each default is derived from the stage's concurrency."),
    ("kafka", "The Kafka cluster, or \"embedded\" for an in-process broker (tests and trials only)."),
    ("kafka.brokers", "\"embedded\" or a bootstrap list, e.g. \"k1:9092,k2:9092\" (or TALLY__KAFKA__BROKERS)."),
    ("kafka.embedded_brokers", "Brokers of the embedded cluster."),
    ("kafka.partitions", "Partitions of every topic tally creates."),
    ("kafka.replication_factor", "Replication factor of every topic tally creates."),
    ("kafka.create_topics", "Create missing topics (and their -dlt twins) at start; off: missing topics are reported."),
    ("kafka.admin_timeout_ms", "Bound of the topic lookup and of topic creation at start."),
    ("kafka.retention_ms", "retention.ms of every topic tally creates (-1: keep forever)."),
    (
        "kafka.topic_configs",
        "Topic-level configs per topic name, e.g. [kafka.topic_configs.\"transfers.requested-dlt\"].",
    ),
    ("kafka.topics", "Topic names."),
    ("kafka.topics.transfers_requested", "Transfers accepted by the intake."),
    ("kafka.topics.transfers_analyzed", "Transfers scored by antifraud and allowed."),
    ("kafka.topics.transfers_rejected", "Transfers blocked by antifraud or rejected by the ledger."),
    ("kafka.topics.transfers_settled", "Transfers settled by the ledger."),
    ("kafka.topics.orders_received", "Orders to materialise."),
    (
        "kafka.common",
        "librdkafka properties for every client, e.g. \"security.protocol\" = \"SASL_SSL\", \"sasl.password\" (never printed).",
    ),
    ("kafka.producer", "librdkafka properties for every producer (and admin client), e.g. \"linger.ms\" = \"5\"."),
    ("kafka.consumer", "librdkafka properties for every consumer, e.g. \"session.timeout.ms\" = \"45000\"."),
    (
        "kafka.group_protocol",
        "\"classic\" (any broker) or \"consumer\" (KIP-848, Kafka 4.0+: the broker assigns, no group-wide stop).",
    ),
    ("kafka.sasl_password_file", "A file holding the SASL password, given to every client as sasl.password (kafka.common)."),
    ("http", "The intake and admin listeners."),
    ("http.intake_addr", "Listener of the intake API (POST /transfers, /accounts, /orders)."),
    ("http.admin_addr", "Listener of the admin API: /healthz, /readyz, /metrics, /admin/*."),
    ("http.admin_token", "Bearer token of the admin endpoints that show records or change state; empty: refused."),
    ("http.admin_token_file", "A file holding http.admin_token (a mounted secret)."),
    ("http.intake_auth", "Every intake request needs an API client's token or certificate (http.clients); else 401."),
    (
        "http.clients",
        "API clients: [[http.clients]] name = \"shop\", token_sha256 = [\"<sha256 of a token>\", ...] (or \
         token_sha256_file), adopts_anonymous = false, scopes = [...] (default: all but \"issue\").",
    ),
    ("http.tls", "HTTPS on the intake listener; no cert_file: plain HTTP. Reloaded on SIGHUP and on file change."),
    ("http.tls.cert_file", "PEM certificate chain of the intake listener."),
    ("http.tls.key_file", "PEM private key of that certificate."),
    ("http.tls.client_ca_file", "PEM roots of client certificates; a certificate naming a client authenticates it."),
    ("http.tls.client_cert", "With client_ca_file: \"optional\" or \"required\" (no certificate, no handshake)."),
    ("http.admin_tls", "HTTPS on the admin listener; no cert_file: plain HTTP. Reloaded like http.tls."),
    ("http.admin_tls.cert_file", "PEM certificate chain of the admin listener."),
    ("http.admin_tls.key_file", "PEM private key of that certificate."),
    ("http.body_limit_bytes", "Largest request body accepted."),
    ("http.workers", "HTTP worker threads."),
    ("http.intake_batch_max", "Most POST /transfers written in one database transaction."),
    ("http.intake_writers", "Intake transactions in flight at once."),
    ("http.anonymous_scopes", "What anonymous requests may do (intake_auth off). Default: every scope without http.clients, all but issue with them."),
    ("http.insecure_anonymous_intake", "Allow intake_auth off on a non-loopback intake_addr: anyone who reaches it moves money."),
    ("http.request_timeout_ms", "A request's headers and body must arrive within this; else 408 and the connection closes."),
    ("http.max_connections", "Open intake connections at most; past it new ones wait in the kernel's backlog."),
    ("http.max_connections_per_address", "Open intake connections per client address; past it a new one is closed at once."),
    ("http.admin_max_connections", "Open admin connections at most, apart from the intake's."),
    ("http.admin_hosts", "Host names the admin listener answers besides IP addresses and localhost."),
    ("http.trusted_proxies", "Proxies (addresses or CIDR blocks) whose X-Forwarded-For names the client."),
    ("outbox", "The transactional outbox publisher."),
    ("outbox.batch_size", "Rows claimed per batch."),
    ("outbox.poll_interval_ms", "Claim again after this long even without a notification."),
    ("outbox.listen", "Wake on other daemons' commits through PostgreSQL LISTEN (this daemon's own commits wake it regardless)."),
    ("outbox.retention_secs", "How long published rows are kept before deletion."),
    ("outbox.cleanup_interval_secs", "How often published rows past their retention are deleted."),
    ("outbox.send_timeout_ms", "Longest wait for the broker's acknowledgement of one batch."),
    ("outbox.backoff_initial_ms", "First wait after a failed batch."),
    ("outbox.backoff_max_ms", "Longest wait after failed batches."),
    ("outbox.concurrency", "Publish loops per daemon."),
    ("outbox.parked_retry_initial_ms", "First wait before a row the broker refused for good is tried again."),
    ("outbox.parked_retry_max_ms", "Longest wait between tries of a parked row."),
    ("pipelines", "Which stages this daemon runs."),
    ("pipelines.outbox", "Publish outbox rows to Kafka."),
    ("consumer", "Consumption limits shared by every pipeline."),
    ("consumer.max_in_flight", "Records in flight per partition; as many again (at least 64) queue and as many are stashed before the partition stops fetching."),
    ("consumer.max_uncommitted", "Offsets at most between a partition's committed watermark and its newest record."),
    ("consumer.max_live_workers", "Live keyed worker actors per pipeline."),
    ("consumer.idle_after_secs", "Keyed workers idle this long are passivated."),
    (
        "consumer.drain_timeout_ms",
        "Least wait for in-flight records on revoke and shutdown (the service stop timeout exceeds it).",
    ),
    (
        "consumer.stall_after_ms",
        "Records waiting with none finished this long (at least the retry worst case + 10 s) restart the stage.",
    ),
    ("ledger", "The settlement stage."),
    ("ledger.group_id", "Consumer group of the ledger."),
    ("ledger.batch_size", "Transfers settled per database transaction at most."),
    ("ledger.max_concurrent_batches", "Settlement transactions running at once."),
    ("ledger.linger_ms", "How long a partial batch waits for more transfers while another batch runs."),
    ("ledger.max_balance_cents", "Ceiling of every balance and amount, in cents."),
    ("ledger.check_interval_secs", "How often the daemon checks the ledger invariants; 0: never."),
    ("ledger.extra_currencies", "Currency codes accepted besides ISO 4217's active ones, e.g. [\"PTS\"]; others get 422."),
    ("*.retry", "Blocking exponential retry of this stage."),
    ("*.retry.max_retries", "Attempts after the first."),
    ("*.retry.initial_ms", "First backoff."),
    ("*.retry.multiplier", "Growth of each further backoff."),
    ("*.retry.max_ms", "Longest backoff."),
    ("antifraud", "The scoring stage (Kafka transactions)."),
    ("antifraud.group_id", "Consumer group of antifraud."),
    (
        "antifraud.transactional_id",
        "Unique per running instance, stable across restarts; empty: tally-antifraud-<instance.id>.",
    ),
    ("antifraud.block_score", "Scores at or above this are blocked."),
    ("antifraud.base_score", "Score of every transfer."),
    ("antifraud.amount_tiers", "[[min_amount_cents, points], ...]; the highest matching tier counts."),
    ("antifraud.velocity_window_secs", "Window of the velocity rule."),
    ("antifraud.velocity_max", "More transfers than this from one account inside the window add velocity_points."),
    ("antifraud.velocity_points", "Points of the velocity rule."),
    ("antifraud.batch_max_records", "Records per Kafka transaction at most."),
    ("antifraud.batch_max_wait_ms", "How long a transaction waits for more records after the first."),
    ("antifraud.transaction_timeout_ms", "Broker-side limit of one transaction (transaction.timeout.ms)."),
    ("antifraud.call_timeout_ms", "Longest wait in one transaction call before it is resumed."),
    ("projection", "The status projection."),
    ("projection.group_id", "Consumer group of the projection."),
    ("projection.batch_max", "Most status moves written in one statement."),
    ("projection.writers", "Status statements in flight at once."),
    ("orders", "The order materializer."),
    ("orders.group_id", "Consumer group of the order materializer (not ledger.group_id)."),
    ("notifications", "Webhook delivery of settled and rejected transfers."),
    ("notifications.webhook_url", "Where events are POSTed (http:// or https://); empty: the pipeline does not run."),
    (
        "notifications.webhook_root_cert",
        "PEM file of the roots an https:// receiver must chain to; empty: the system's.",
    ),
    ("notifications.webhook_secret", "HMAC-SHA256 key of the X-Tally-Signature header."),
    ("notifications.webhook_secret_file", "A file holding notifications.webhook_secret (a mounted secret)."),
    ("notifications.timeout_ms", "Longest wait for the webhook's answer."),
    ("notifications.group_id", "Consumer group of notifications."),
    ("notifications.retry_initial_ms", "Delay of the first retry topic."),
    ("notifications.retry_multiplier", "Growth of each further retry topic's delay."),
    ("notifications.retry_max_ms", "Longest retry topic delay."),
    ("notifications.max_attempts", "Deliveries in all: the first plus one per retry topic."),
    ("signing", "Keys that sign the events tally produces; every stage refuses a record they did not sign."),
    (
        "signing.keys_dir",
        "Directory of <id>.key files (32+ bytes each, the same on every instance); empty: the embedded broker's key.",
    ),
    ("signing.key_id", "The key that signs (its file name less .key); empty: the only key of keys_dir."),
    ("signing.accept_unsigned", "Also take records without a signature: only while upgrading from a release that did not sign."),
    ("log", "Logging to standard output."),
    ("log.format", "\"pretty\" or \"json\"."),
    ("log.level", "A tracing filter directive, e.g. \"info,tally=debug\"."),
    ("telemetry", "Trace export."),
    (
        "telemetry.otlp_endpoint",
        "Base URL of an OTLP/HTTP collector, e.g. \"http://127.0.0.1:4318\"; empty: no traces.",
    ),
    ("telemetry.service_name", "service.name of the exported spans."),
];

/// Keys whose default is derived (from the host or from other keys): shown commented out.
fn derived(path: &str) -> bool {
    path == "instance.id" || path == "http.anonymous_scopes" || path.starts_with("database.pools.")
}

/// The line of `path`, or `None` when the table lacks it.
fn doc(path: &str) -> Option<&'static str> {
    let exact = KEYS.iter().find(|(k, _)| *k == path);
    let generic = || {
        let at = path.find(".retry")?;
        let key = format!("*{}", &path[at..]);
        KEYS.iter().find(|(k, _)| *k == key)
    };
    exact.or_else(generic).map(|(_, d)| *d).or_else(|| registered(path))
}

/// The line of a stage's `[pipelines]` switch or of a pool, from the stage registry.
fn registered(path: &str) -> Option<&'static str> {
    if let Some(name) = path.strip_prefix("pipelines.") {
        return crate::stages::find(name).map(|s| s.summary);
    }
    super::pools::summary(path.strip_prefix("database.pools.")?)
}

/// The example configuration (`deploy/tally.toml`).
#[must_use]
pub fn example_toml() -> String {
    let mut config = Config::default();
    // Not the host that generated the file: the one that reads it.
    config.instance.id = HOST.into();
    // Derived from whether API clients are configured; the example has none.
    config.http.anonymous_scopes =
        Some(config.http.anonymous_scopes().names().into_iter().map(str::to_owned).collect());
    render(&config).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
}

/// What the example shows for `instance.id`, whose default is the host name.
const HOST: &str = "<host name>";

fn render(config: &Config) -> Result<String, String> {
    let config = config.with_pools_resolved();
    let value = toml::Value::try_from(&config).map_err(|e| e.to_string())?;
    let toml::Value::Table(root) = value else { return Err("not a table".into()) };
    let mut out = String::from(
        "# tally configuration: every key with its default (`tally config --example`).\n\
         # Layers: defaults, this file (--config), then TALLY__SECTION__KEY environment variables.\n\
         # A commented-out key has a derived default; set it to override the derivation.\n",
    );
    // Sections in the order of `Config`'s fields (the TOML value sorts its keys).
    let order = toml::to_string(&config).map_err(|e| e.to_string())?;
    let mut sections: Vec<&String> = root.keys().collect();
    sections.sort_by_key(|s| order.find(&format!("[{s}]")).unwrap_or(usize::MAX));
    for name in sections {
        if let Some(toml::Value::Table(t)) = root.get(name) {
            table(&mut out, name, t, &order)?;
        }
    }
    Ok(out)
}

fn table(out: &mut String, path: &str, t: &toml::Table, order: &str) -> Result<(), String> {
    let line = doc(path).ok_or_else(|| format!("no description for [{path}]"))?;
    out.push_str(&format!("\n# {line}\n[{path}]\n"));
    // Keys in declaration order: where `key = ` first appears after the section header.
    let start = order.find(&format!("[{path}]")).unwrap_or(0);
    let at = |k: &str| order[start..].find(&format!("\n{k} = ")).unwrap_or(usize::MAX);
    let mut keys: Vec<&String> = t.keys().collect();
    keys.sort_by_key(|k| at(k));
    let mut sub = Vec::new();
    for key in keys {
        let child = format!("{path}.{key}");
        match &t[key.as_str()] {
            toml::Value::Table(inner) => sub.push((child, inner)),
            value => {
                let line = doc(&child).ok_or_else(|| format!("no description for {child}"))?;
                let hash = if derived(&child) { "# " } else { "" };
                out.push_str(&format!("# {line}\n{hash}{} = {value}\n", bare(key)));
            }
        }
    }
    sub.sort_by_key(|(p, _)| order.find(&format!("[{p}]")).unwrap_or(usize::MAX));
    for (child, inner) in sub {
        table(out, &child, inner, order)?;
    }
    Ok(())
}

/// `key` as a TOML key: bare when it can be.
fn bare(key: &str) -> String {
    if key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        key.to_owned()
    } else {
        format!("{key:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use figment::providers::{Format, Serialized, Toml};
    use figment::Figment;

    #[test]
    fn every_key_has_a_line_and_every_line_a_key() {
        // `render` fails on a key without a line; here: no line without a key.
        let shown = example_toml();
        let mut paths = Vec::new();
        let mut section = String::new();
        for line in shown.lines() {
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = name.to_owned();
                paths.push(section.clone());
            } else if let Some((key, _)) = line.trim_start_matches("# ").split_once(" = ") {
                paths.push(format!("{section}.{key}"));
            }
        }
        for (key, _) in KEYS {
            let found = match key.strip_prefix('*') {
                Some(tail) => paths.iter().any(|p| p.ends_with(tail)),
                None => paths.iter().any(|p| p == key),
            };
            assert!(found, "{key} is described but not a key:\n{shown}");
        }
    }

    #[test]
    fn the_example_is_the_defaults() {
        let text = example_toml();
        assert!(!text.contains("cannot render"), "{text}");
        let parsed =
            Config::from_figment(&Figment::from(Serialized::defaults(Config::default())).merge(Toml::string(&text)))
                .unwrap();
        let defaults = Config::default();
        assert_eq!(parsed.to_redacted_toml(), defaults.to_redacted_toml());
        // Derived keys stay derived: a changed concurrency moves its pool.
        let file: toml::Table = text.parse().unwrap();
        assert_eq!(file["database"]["pools"].as_table().map(toml::Table::len), Some(0), "{text}");
        assert!(file["instance"].get("id").is_none(), "{text}");
        assert!(text.contains("\n# ledger = 6\n") && text.contains("\n# id = \"<host name>\"\n"), "{text}");
        assert!(text.contains("amount_tiers = [[1000000, 25], [5000000, 50], [10000000, 80]]"), "{text}");
    }
}
