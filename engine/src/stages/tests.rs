use super::*;

#[test]
fn names_are_unique_and_name_a_switch_and_a_pool() {
    let config = Config::default();
    let names: Vec<_> = STAGES.iter().map(|s| s.name).collect();
    for (i, name) in names.iter().enumerate() {
        assert!(!names[..i].contains(name), "{name} twice");
        assert!(find(name).is_some());
        assert!(crate::config::PipelinesConfig::names().contains(name), "{name} has no [pipelines] switch");
        assert!(DbPool::all().iter().any(|p| p.name() == *name), "{name} has no pool");
        assert!(config.pipelines.runs(name), "{name} runs by default");
    }
    assert!(find("outbox").is_none(), "the outbox publisher is the frame's, not a stage");
}

#[test]
fn every_input_has_a_dead_letter_topic() {
    let config = Config::default();
    let created = config.topics_to_create();
    for stage in STAGES {
        for topic in (stage.inputs)(&config).iter().chain(&(stage.outputs)(&config)) {
            assert!(created.contains(topic), "{}: {topic} is not created", stage.name);
        }
        for topic in (stage.inputs)(&config) {
            let dlt = tally_schema::topics::dlt(&topic);
            assert!(created.contains(&dlt), "{}: {topic} has no dead-letter topic", stage.name);
        }
    }
}

#[test]
fn two_stages_in_one_group_are_refused_with_both_keys() {
    let mut config = Config::default();
    config.orders.group_id = config.ledger.group_id.clone();
    let e = validate(&config).unwrap_err().to_string();
    assert!(e.contains("orders.group_id") && e.contains("ledger.group_id"), "{e}");
    let mut config = Config::default();
    config.projection.group_id = config.notifications.group_id.clone();
    let e = validate(&config).unwrap_err().to_string();
    assert!(e.contains("projection.group_id") && e.contains("notifications.group_id"), "{e}");
}

#[test]
fn a_stage_switched_off_opens_no_pool() {
    let mut config = Config::default();
    config.notifications.webhook_url = crate::config::SecretUrl::new("http://127.0.0.1:1/hook");
    let all = crate::app::pools::in_use(&config);
    assert_eq!(all.len(), DbPool::all().len(), "{all:?}");
    config.pipelines.set("orders", false);
    config.pipelines.set("outbox", false);
    let some = crate::app::pools::in_use(&config);
    assert!(!some.contains(&DbPool::named("orders")) && !some.contains(&DbPool::OUTBOX), "{some:?}");
    assert!(some.contains(&DbPool::HTTP) && some.contains(&DbPool::named("ledger")), "{some:?}");
}

#[test]
fn unknown_switches_are_refused() {
    let mut config = Config::default();
    config.pipelines.set("reporting", true);
    let e = config.validate().unwrap_err().to_string();
    assert!(e.contains("pipelines") && e.contains("reporting"), "{e}");
}
