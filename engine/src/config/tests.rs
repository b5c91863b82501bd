//! Unit tests of the configuration: layering, validation, redaction.

use super::*;

fn with(toml: &str) -> Result<Config, ConfigError> {
    let figment = Figment::from(Serialized::defaults(Config::default())).merge(Toml::string(toml));
    Config::from_figment(&figment)
}

#[test]
fn group_commit_sizes_are_validated_with_the_key_named() {
    let c = with("[http]\nintake_batch_max = 1\nintake_writers = 16\n[projection]\nbatch_max = 1").unwrap();
    assert_eq!((c.http.intake_batch_max, c.http.intake_writers, c.projection.batch_max), (1, 16, 1));
    for (toml, key) in [
        ("[http]\nintake_batch_max = 0", "http.intake_batch_max"),
        ("[http]\nintake_writers = 0", "http.intake_writers"),
        ("[projection]\nbatch_max = 0", "projection.batch_max"),
        ("[projection]\nwriters = 65", "projection.writers"),
    ] {
        let e = with(toml).unwrap_err().to_string();
        assert!(e.contains(key), "{toml}: {e}");
    }
}

#[test]
fn consumers_on_the_embedded_broker_wait_less_for_empty_fetches() {
    let wait =
        |c: &Config| c.kafka.clients("b:9092").group_consumer("ledger").get("fetch.wait.max.ms").map(str::to_owned);
    let embedded = with("").unwrap();
    assert_eq!(wait(&embedded).as_deref(), Some("5"));
    let external = with("[kafka]\nbrokers = \"k1:9092\"").unwrap();
    assert_eq!(wait(&external).as_deref(), Some("25"), "a Kafka broker answers as soon as records arrive");
    let chosen = with("[kafka.consumer]\n\"fetch.wait.max.ms\" = \"40\"").unwrap();
    assert_eq!(wait(&chosen).as_deref(), Some("40"), "the operator's word");
}

#[test]
fn the_group_protocol_shapes_every_group_member_and_names_the_keys_that_do_not_apply() {
    let member = |c: &Config| c.kafka.clients("b:9092").group_consumer("ledger");
    let classic = with("").unwrap();
    assert_eq!(classic.kafka.group_protocol, GroupProtocol::Classic, "every broker speaks it");
    let m = member(&classic);
    assert_eq!(m.get("group.protocol"), Some("classic"));
    assert_eq!(m.get("partition.assignment.strategy"), Some("cooperative-sticky"));
    assert_eq!(m.get("session.timeout.ms"), Some("10000"));
    let consumer = with("[kafka]\ngroup_protocol = \"consumer\"").unwrap();
    // The seed's way: librdkafka's own property, passed through.
    let seed = with("[kafka.consumer]\n\"group.protocol\" = \"consumer\"").unwrap();
    for c in [&consumer, &seed] {
        let m = member(c);
        assert_eq!(m.get("group.protocol"), Some("consumer"));
        for key in ["session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy"] {
            assert_eq!(m.get(key), None, "{key} is the broker's under the consumer protocol");
        }
        let reader = c.kafka.clients("b:9092").reader("tally-dlt-admin", None);
        assert_eq!(reader.get("group.protocol"), None, "a reader joins no group");
    }
    let e = with(
        "[kafka]\ngroup_protocol = \"consumer\"\n[kafka.consumer]\n\"session.timeout.ms\" = \"45000\"\n\
                  \"partition.assignment.strategy\" = \"range\"",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("kafka.consumer") && e.contains("\"session.timeout.ms\" (the broker defines it"), "{e}");
    assert!(e.contains("\"partition.assignment.strategy\""), "every key that does not apply is named: {e}");
    let e = with("[kafka.consumer]\n\"group.remote.assignor\" = \"uniform\"").unwrap_err().to_string();
    assert!(e.contains("under the classic group protocol") && e.contains("group.remote.assignor"), "{e}");
    let ok = with("[kafka]\ngroup_protocol = \"consumer\"\n[kafka.consumer]\n\"group.remote.assignor\" = \"range\"");
    assert_eq!(member(&ok.unwrap()).get("group.remote.assignor"), Some("range"));
    let e = with("[kafka]\ngroup_protocol = \"consumer\"\n[kafka.consumer]\n\"group.protocol\" = \"classic\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("kafka.group_protocol"), "{e}");
    let e = with("[kafka.consumer]\n\"group.protocol\" = \"next\"").unwrap_err().to_string();
    assert!(e.contains("\"group.protocol\" must be"), "{e}");
    assert!(with("[kafka]\ngroup_protocol = \"next\"").is_err());
}

#[test]
fn defaults_are_valid_and_match_design() {
    let c = with("").unwrap();
    assert_eq!(c.http.intake_addr.to_string(), "127.0.0.1:8080");
    assert_eq!(c.http.admin_addr.to_string(), "127.0.0.1:9090");
    assert_eq!(c.database.url.expose(), "postgres://postgres@127.0.0.1:5432/tally");
    assert!(c.kafka.is_embedded());
    assert_eq!(c.kafka.partitions, 12);
}

#[test]
fn durations_keep_their_unit_in_the_key() {
    let c = with("[outbox]\npoll_interval_ms = 250\nretention_secs = 90\n[ledger.retry]\ninitial_ms = 7").unwrap();
    assert_eq!(c.outbox.poll_interval, Duration::from_millis(250));
    assert_eq!(c.outbox.retention, Duration::from_secs(90));
    assert_eq!(c.ledger.retry.initial, Duration::from_millis(7));
    let shown = c.to_redacted_toml();
    assert!(shown.contains("poll_interval_ms = 250") && shown.contains("retention_secs = 90"), "{shown}");
    let e = with("[outbox]\npoll_interval_ms = \"1s\"").unwrap_err().to_string();
    assert!(e.contains("poll_interval_ms"), "{e}");
    let e = with("[outbox]\npoll_interval = 250").unwrap_err().to_string();
    assert!(e.contains("poll_interval"), "the field's Rust name is not a key: {e}");
}

#[test]
fn defaults_have_one_source() {
    let c = Config::default();
    let policy = tally_actors::supervise::RetryPolicy::default();
    assert_eq!(c.ledger.retry.policy(), policy);
    let rules = tally_actors::antifraud::RiskRules::default();
    assert_eq!((c.antifraud.base_score, &c.antifraud.amount_tiers), (rules.base, &rules.amount_tiers));
    assert_eq!(c.antifraud.velocity_window, rules.velocity_window);
}

#[test]
fn errors_name_the_key() {
    let e = with("[database]\npool_size = 0").unwrap_err().to_string();
    assert!(e.contains("database.pool_size"), "{e}");
    let e = with("[outbox]\nbatch_size = \"many\"").unwrap_err().to_string();
    assert!(e.contains("batch_size"), "{e}");
    let e = with("[http]\nintake_adr = \"127.0.0.1:1\"").unwrap_err().to_string();
    assert!(e.contains("intake_adr"), "{e}");
    let e = with("[consumer]\ndrain_timeout_ms = 0").unwrap_err().to_string();
    assert!(e.contains("consumer.drain_timeout_ms"), "{e}");
    let e = with("[consumer]\nstall_after_ms = 0").unwrap_err().to_string();
    assert!(e.contains("consumer.stall_after_ms"), "{e}");
    let e = with("[database]\nurl = \"mysql://x\"").unwrap_err().to_string();
    assert!(e.contains("database.url"), "{e}");
}

#[test]
fn the_uncommitted_window_is_validated_against_max_in_flight() {
    let c = with("").unwrap();
    assert_eq!(c.consumer.max_uncommitted, 10_000);
    let e = with("[consumer]\nmax_in_flight = 64\nmax_uncommitted = 63").unwrap_err().to_string();
    assert!(e.contains("consumer.max_uncommitted") && e.contains("consumer.max_in_flight"), "{e}");
    assert!(with("[consumer]\nmax_in_flight = 64\nmax_uncommitted = 64").is_ok());
}

#[test]
fn a_transaction_call_waits_at_most_the_transaction_timeout() {
    let e = with("[antifraud]\ntransaction_timeout_ms = 2000\ncall_timeout_ms = 2001").unwrap_err().to_string();
    assert!(e.contains("antifraud.call_timeout_ms"), "{e}");
    assert!(with("[antifraud]\ncall_timeout_ms = 0").is_err());
    assert!(with("[antifraud]\ntransaction_timeout_ms = 2000\ncall_timeout_ms = 2000").is_ok());
}

#[test]
fn orders_pipeline_is_on_by_default_and_validated() {
    let c = with("").unwrap();
    assert!(c.pipelines.runs("orders"));
    assert_eq!(c.orders.group_id, "tally-orders");
    assert_eq!(c.orders.retry.max_retries, 5);
    let c = with("[pipelines]\norders = false\n[orders]\ngroup_id = \"g\"\n[orders.retry]\nmax_retries = 2").unwrap();
    assert!(!c.pipelines.runs("orders"));
    assert_eq!((c.orders.group_id.as_str(), c.orders.retry.max_retries), ("g", 2));
    let e = with("[orders]\ngroup_id = \" \"").unwrap_err().to_string();
    assert!(e.contains("orders.group_id"), "{e}");
    let e = with("[orders]\ngroup_id = \"tally-ledger\"").unwrap_err().to_string();
    assert!(e.contains("orders.group_id"), "{e}");
    let e = with("[orders.retry]\ninitial_ms = 0").unwrap_err().to_string();
    assert!(e.contains("orders.retry"), "{e}");
}

#[test]
#[allow(clippy::result_large_err)] // figment::Jail's closure type, not ours
fn environment_overrides_file() {
    figment::Jail::expect_with(|jail| {
        jail.create_file("tally.toml", "[outbox]\nbatch_size = 7\n[kafka]\nbrokers = \"a:1\"")?;
        jail.set_env("TALLY__OUTBOX__BATCH_SIZE", "9");
        jail.set_env("TALLY__HTTP__ADMIN_TOKEN", "s3cret");
        jail.set_env("TALLY__TELEMETRY__OTLP_ENDPOINT", "http://collector:4318");
        let c = Config::load(Some(Path::new("tally.toml"))).map_err(|e| e.to_string())?;
        assert_eq!(c.outbox.batch_size, 9);
        assert_eq!(c.telemetry.traces_url().as_deref(), Some("http://collector:4318/v1/traces"));
        assert_eq!(c.kafka.brokers, "a:1");
        assert_eq!(c.http.admin_token.expose(), "s3cret");
        Ok(())
    });
}

#[test]
fn secrets_never_print() {
    let mut c = Config::default();
    c.http.admin_token = Secret::new("s3cret-token");
    c.database.url = SecretUrl::new("postgres://app:hunter2@db:5432/tally?sslmode=require&password=hunter3");
    c.notifications.webhook_secret = Secret::new("s3cret-hook");
    c.notifications.webhook_url =
        SecretUrl::new("http://hook-user:hunter4@hooks.example:8080/pay?token=hunter5&Signature=hunter6&x=1");
    c.kafka.producer.insert("sasl.password".into(), "s3cret-sasl".into());
    c.kafka.consumer.insert("ssl.key.pem".into(), "s3cret-pem".into());
    c.kafka.producer.insert("linger.ms".into(), "7".into());
    let shown = c.to_redacted_toml();
    let debug = format!("{c:?}");
    for secret in ["s3cret", "hunter"] {
        assert!(!shown.contains(secret), "{shown}");
        assert!(!debug.contains(secret), "{debug}");
    }
    assert!(shown.contains("postgres://app:<redacted>@db:5432/tally?sslmode=require&password=<redacted>"), "{shown}");
    assert!(
        shown.contains(
            "webhook_url = \"http://hook-user:<redacted>@hooks.example:8080/pay?token=<redacted>&Signature=<redacted>&x=1\""
        ),
        "{shown}"
    );
    assert!(shown.contains("\"linger.ms\" = \"7\""), "{shown}");
    assert_eq!(c.notifications.webhook_secret.to_string(), "<redacted>");
    assert_eq!(Secret::default().to_string(), "", "an unset secret shows as unset");
}

#[test]
fn defaults_survive_the_redacting_serialisation() {
    // Figment layers the defaults through `Serialize`: an unset secret stays unset and a
    // URL without a password stays usable.
    let c = with("").unwrap();
    assert!(c.http.admin_token.is_empty());
    assert_eq!(c.database.url.expose(), "postgres://postgres@127.0.0.1:5432/tally");
}

#[test]
fn the_body_limit_must_fit_a_record() {
    let e = with("[http]\nbody_limit_bytes = 2000000").unwrap_err().to_string();
    assert!(e.contains("http.body_limit_bytes") && e.contains("message.max.bytes"), "{e}");
    with("[http]\nbody_limit_bytes = 2000000\n[kafka.producer]\n\"message.max.bytes\" = \"3000000\"").unwrap();
    let e = with("[kafka.producer]\n\"message.max.bytes\" = \"lots\"").unwrap_err().to_string();
    assert!(e.contains("kafka.producer"), "{e}");
}

#[test]
fn traces_are_off_by_default_and_the_endpoint_is_validated() {
    let c = with("").unwrap();
    assert_eq!((c.telemetry.otlp_endpoint.as_deref(), c.telemetry.service_name.as_str()), (None, "tally"));
    assert!(c.to_redacted_toml().contains("otlp_endpoint = \"\""), "tally config shows the key");
    assert_eq!(with("[telemetry]\notlp_endpoint = \" \"").unwrap().telemetry.otlp_endpoint, None);
    let c = with("[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318/\"\nservice_name = \"pay\"").unwrap();
    assert_eq!(c.telemetry.traces_url().as_deref(), Some("http://127.0.0.1:4318/v1/traces"));
    assert_eq!(c.telemetry.service_name, "pay");
    let shown = c.to_redacted_toml();
    assert!(shown.contains("otlp_endpoint = \"http://127.0.0.1:4318/\""), "{shown}");
    for bad in ["127.0.0.1:4318", "https://collector:4318", "http://c:4318/v1/traces", "http://c:4318?x=1", "nope"] {
        let e = with(&format!("[telemetry]\notlp_endpoint = \"{bad}\"")).unwrap_err().to_string();
        assert!(e.contains("telemetry.otlp_endpoint"), "{bad}: {e}");
    }
    let e = with("[telemetry]\nservice_name = \"\"").unwrap_err().to_string();
    assert!(e.contains("telemetry.service_name"), "{e}");
}

#[test]
fn webhooks_are_http_or_https_with_readable_roots() {
    let secret = "webhook_secret = \"s\"";
    with(&format!("[notifications]\nwebhook_url = \"http://127.0.0.1:9/hook\"\n{secret}")).unwrap();
    with(&format!("[notifications]\nwebhook_url = \"https://hooks.example/pay\"\n{secret}")).unwrap();
    for bad in ["ftp://x", "hooks.example"] {
        let e = with(&format!("[notifications]\nwebhook_url = \"{bad}\"\n{secret}")).unwrap_err().to_string();
        assert!(e.contains("notifications.webhook_url"), "{bad}: {e}");
    }
    let e = with("[notifications]\nwebhook_root_cert = \"/nonexistent/ca.pem\"").unwrap_err().to_string();
    assert!(e.contains("notifications.webhook_root_cert") && e.contains("/nonexistent/ca.pem"), "{e}");
    let e = with("[notifications]\nwebhook_root_cert = \"Cargo.toml\"").unwrap_err().to_string();
    assert!(e.contains("no PEM certificate"), "{e}");
}

#[test]
fn topic_configs_name_known_topics() {
    with("[kafka.topic_configs.\"transfers.requested-dlt\"]\n\"retention.ms\" = \"-1\"").unwrap();
    let e = with("[kafka.topic_configs.\"nope\"]\n\"retention.ms\" = \"1\"").unwrap_err().to_string();
    assert!(e.contains("kafka.topic_configs") && e.contains("nope"), "{e}");
    let e = with("[kafka]\nretention_ms = 5").unwrap_err().to_string();
    assert!(e.contains("kafka.retention_ms"), "{e}");
}

#[test]
#[allow(clippy::result_large_err)] // figment::Jail's closure type, not ours
fn librdkafka_properties_can_come_from_the_environment() {
    figment::Jail::expect_with(|jail| {
        jail.create_file("tally.toml", "[kafka.producer]\n\"linger.ms\" = \"7\"\n")?;
        jail.set_env("TALLY__KAFKA__PRODUCER__SASL.PASSWORD", "pw-from-env");
        jail.set_env("TALLY__KAFKA__PRODUCER__SASL.MECHANISM", "PLAIN");
        jail.set_env("TALLY__KAFKA__CONSUMER__FETCH.WAIT.MAX.MS", "25");
        jail.set_env("TALLY__KAFKA__CONSUMER__ENABLE.PARTITION.EOF", "false");
        let c = Config::load(Some(Path::new("tally.toml"))).map_err(|e| e.to_string())?;
        assert_eq!(c.kafka.producer.get("sasl.password").map(String::as_str), Some("pw-from-env"));
        assert_eq!(c.kafka.producer.get("sasl.mechanism").map(String::as_str), Some("PLAIN"));
        assert_eq!(c.kafka.producer.get("linger.ms").map(String::as_str), Some("7"));
        assert_eq!(c.kafka.consumer.get("fetch.wait.max.ms").map(String::as_str), Some("25"));
        assert_eq!(c.kafka.consumer.get("enable.partition.eof").map(String::as_str), Some("false"));
        assert!(!c.to_redacted_toml().contains("pw-from-env"));
        Ok(())
    });
}

#[test]
#[allow(clippy::result_large_err)] // figment::Jail's closure type, not ours
fn every_secret_can_come_from_a_file_and_none_prints() {
    figment::Jail::expect_with(|jail| {
        let digest = "ab".repeat(32);
        // One digest a line: two while a token is rotated.
        let shop_digests = format!("{digest}\n{}\n", "cd".repeat(32));
        for (file, content) in [
            ("db-password", "hunter-db\n"),
            ("admin-token", "hunter-admin"),
            ("webhook-secret", "hunter-hook\r\n"),
            ("sasl-password", "hunter-sasl\n"),
            ("shop-token", shop_digests.as_str()),
        ] {
            jail.create_file(file, content)?;
        }
        jail.create_file(
            "tally.toml",
            "[database]\npassword_file = \"db-password\"\nsslmode = \"require\"\n\
             [http]\nadmin_token_file = \"admin-token\"\nintake_auth = true\n\
             [[http.clients]]\nname = \"shop\"\ntoken_sha256_file = \"shop-token\"\n\
             [notifications]\nwebhook_url = \"http://127.0.0.1:9/hook\"\nwebhook_secret_file = \"webhook-secret\"\n\
             [kafka]\nsasl_password_file = \"sasl-password\"\n",
        )?;
        let c = Config::load(Some(Path::new("tally.toml"))).map_err(|e| e.to_string())?;
        assert_eq!(c.database.password.expose(), "hunter-db");
        assert_eq!(c.http.admin_token.expose(), "hunter-admin");
        assert_eq!(c.notifications.webhook_secret.expose(), "hunter-hook");
        let clients = c.kafka.clients("b:9092");
        assert_eq!(clients.producer("p", Duration::from_secs(1)).get("sasl.password"), Some("hunter-sasl"));
        assert_eq!(clients.group_consumer("ledger").get("sasl.password"), Some("hunter-sasl"));
        assert_eq!(c.http.clients[0].token_digests(), Some(vec![[0xab; 32], [0xcd; 32]]));
        assert_eq!(
            c.database.connect_url(),
            "postgres://postgres@127.0.0.1:5432/tally?sslmode=require&password=hunter%2Ddb"
        );
        let shown = c.to_redacted_toml();
        for secret in ["hunter", &digest] {
            assert!(!shown.contains(secret), "{shown}");
            assert!(!format!("{c:?}").contains(secret), "{c:?}");
        }
        assert!(shown.contains("password_file = \"db-password\""), "the file's name shows: {shown}");
        assert!(shown.contains("token_sha256 = [\n    \"<redacted>\",\n    \"<redacted>\",\n]"), "{shown}");
        Ok(())
    });
}

#[test]
#[allow(clippy::result_large_err)] // figment::Jail's closure type, not ours
fn a_secret_given_twice_or_from_a_missing_file_is_refused_by_key() {
    figment::Jail::expect_with(|jail| {
        jail.create_file("token", "t")?;
        for (toml, key) in [
            ("[http]\nadmin_token = \"x\"\nadmin_token_file = \"token\"", "http.admin_token_file"),
            ("[http]\nadmin_token_file = \"missing\"", "http.admin_token_file"),
            ("[database]\npassword_file = \"missing\"", "database.password_file"),
            (
                "[kafka]\nsasl_password_file = \"token\"\n[kafka.producer]\n\"sasl.password\" = \"x\"",
                "kafka.sasl_password_file",
            ),
            ("[database]\nurl = \"postgres://u:pw@h/db\"\npassword = \"x\"", "database.password"),
            ("[database]\nurl = \"postgres://h/db?sslmode=require\"\nsslmode = \"disable\"", "database.sslmode"),
            ("[database]\nsslmode = \"verify-full\"", "database.sslmode"),
            ("[database]\nurl = \"postgres://h/db?sslmode=sometimes\"", "database.url"),
        ] {
            jail.create_file("tally.toml", toml)?;
            let e = Config::load(Some(Path::new("tally.toml"))).unwrap_err().to_string();
            assert!(e.contains(key), "{toml}: {e}");
        }
        Ok(())
    });
}
