//! The operator docs stay true to the code: every configuration key in the
//! schema has an entry in docs/configuration.md, and every registered metric
//! one in docs/metrics.md.

use std::path::Path;

fn read(p: &str) -> String {
    std::fs::read_to_string(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join(p))
        .unwrap()
}

/// `pub name:` fields of the serde structs in the schema.
fn schema_keys() -> Vec<String> {
    read("crates/weir/src/config/schema.rs")
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l.strip_prefix("pub ")?;
            let (name, _) = rest.split_once(':')?;
            (!name.contains(' ') && !name.contains('(')).then(|| name.to_string())
        })
        .collect()
}

/// Nothing is `missing` from the document `doc`; else the failure lists
/// the `what` (keys, metrics) it lacks.
#[track_caller]
fn assert_none_missing(missing: &[&String], what: &str, doc: &str) {
    assert!(missing.is_empty(), "{what} missing from {doc}: {missing:?}");
}

#[test]
fn every_config_key_is_documented() {
    let doc = read("docs/configuration.md");
    let keys = schema_keys();
    assert!(keys.len() > 40, "found only {} keys", keys.len());
    // Fields whose TOML name differs from the Rust name.
    let renamed = [("kind", "type")];
    let missing: Vec<&String> = keys
        .iter()
        .filter(|k| {
            let toml = renamed
                .iter()
                .find(|(r, _)| r == k)
                .map_or(k.as_str(), |(_, t)| t);
            !doc.contains(&format!("`{toml}`"))
                && !doc.contains(&format!(".{toml}`"))
                && !doc.contains(&format!("`[{toml}"))
                && !doc.contains(&format!("`[[{toml}"))
        })
        .collect();
    assert_none_missing(&missing, "keys", "docs/configuration.md");
}

#[test]
fn every_metric_is_documented() {
    let src = read("crates/weir/src/observe/metrics.rs");
    let doc = read("docs/metrics.md");
    let mut names = Vec::new();
    let mut rest = src.as_str();
    while let Some(i) = rest.find("registry.register") {
        rest = &rest[i..];
        let q = rest.find('"').unwrap();
        let end = rest[q + 1..].find('"').unwrap();
        names.push(rest[q + 1..q + 1 + end].to_string());
        rest = &rest[q + 1 + end..];
    }
    assert!(names.len() > 20, "found only {} metrics", names.len());
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !doc.contains(&format!("`weir_{n}")))
        .collect();
    assert_none_missing(&missing, "metrics", "docs/metrics.md");
}

#[test]
fn every_alert_has_a_runbook_section() {
    let rules = read("docs/alerts.yml");
    let runbook = read("docs/alerts.md");
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert!(alerts.len() >= 5);
    for a in alerts {
        assert!(
            runbook.contains(&format!("## {a}")),
            "no runbook section for {a}"
        );
        assert!(
            rules.contains(&format!("docs/alerts.md#{}", a.to_lowercase())),
            "{a} links no runbook"
        );
    }
}

#[test]
fn examples_are_valid_configurations() {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let env = std::collections::HashMap::<String, String>::new();
            let loaded = weir::config::load_file(&path, &env).unwrap_or_else(|e| panic!("{e}"));
            weir::gateway::Gateway::build(loaded, None, 1).unwrap_or_else(|e| panic!("{e}"));
            checked += 1;
        }
    }
    assert!(checked >= 2);
}
