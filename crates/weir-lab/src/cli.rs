//! `weir sim` and `weir demo`: load a scenario, run the chosen variants one after the
//! other, evaluate the checks, print the side-by-side table and write JSON/HTML.
//!
//! `main` only maps the result to an exit status: `Ok` with a failing check is exit 1,
//! an error (bad scenario, nginx missing, weir not starting) is exit 2.

use std::path::{Path, PathBuf};

use super::report::{CheckResult, SimReport, VariantReport};
use super::runner::{RunError, RunOptions, run_variant};
use super::scenario::{GatewayKind, Scenario, load_scenario_file, load_scenario_str};
use weir::config::ConfigErrors;

/// The scenario `weir demo` runs, built into the binary.
pub const DEMO_SCENARIO: &str = include_str!("../../../scenarios/2026-09-23-crawler-flood.toml");
/// Where `weir demo` writes its page unless told otherwise.
pub const DEMO_HTML: &str = "weir-demo.html";

/// Why `weir sim` could not produce a report.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("{0}")]
    Scenario(ConfigErrors),
    #[error("no variant {name:?} in the scenario; it has: {known}")]
    UnknownVariant { name: String, known: String },
    #[error("--duration {given:?}: must be more than 0 and at most {max:?}")]
    BadDuration {
        given: std::time::Duration,
        max: std::time::Duration,
    },
    #[error(transparent)]
    Run(#[from] RunError),
    #[error("[alerts] rules = {path}: {problem}")]
    AlertRules { path: PathBuf, problem: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What to run and where to write.
#[derive(Debug, Clone, Default)]
pub struct SimOptions {
    /// Variants to run, in this order; empty runs all.
    pub variants: Vec<String>,
    pub json: Option<PathBuf>,
    pub html: Option<PathBuf>,
    /// How the run shows itself on stderr while it runs.
    pub progress: crate::runner::Progress,
    /// Run each variant this long instead of the scenario's
    /// `scenario.duration` (a quick look, or a longer soak).
    pub duration: Option<std::time::Duration>,
    /// Keep each weir variant's alert replay (`VARIANT.yml`, a `promtool test
    /// rules` file of weir's series on the story's clock) in this directory, to
    /// tune alert rules against the run offline.
    pub alert_series: Option<PathBuf>,
    /// Something to run beside each variant's load (a real browser reading
    /// pages through the flood, in the scenario tests).
    pub beside: Option<super::runner::Beside>,
}

/// `weir sim SCENARIO.toml`: runs, prints the table to stdout, writes files.
pub fn sim(path: &Path, options: &SimOptions) -> Result<SimReport, SimError> {
    let mut scenario = load_scenario_file(path).map_err(SimError::Scenario)?;
    if let Some(d) = options.duration {
        let max = super::scenario::MAX_DURATION;
        if d.is_zero() || d > max {
            return Err(SimError::BadDuration { given: d, max });
        }
        scenario.file.scenario.duration = weir::config::ConfigDuration(d);
    }
    let report = run_scenario(&scenario, options)?;
    print!("{}", report.to_text());
    write_outputs(&report, options)?;
    Ok(report)
}

/// `weir demo`: the crawler-flood scenario, every variant, HTML to `html`.
pub fn demo(
    html: Option<PathBuf>,
    progress: crate::runner::Progress,
) -> Result<SimReport, SimError> {
    let scenario = demo_scenario()?;
    let options = SimOptions {
        variants: Vec::new(),
        json: None,
        html: Some(html.unwrap_or_else(|| PathBuf::from(DEMO_HTML))),
        progress,
        ..SimOptions::default()
    };
    println!("{}\n", scenario.file.scenario.description.trim());
    let report = run_scenario(&scenario, &options)?;
    print!("{}", demo_summary(&report));
    write_outputs(&report, &options)?;
    if let Some(p) = &options.html {
        println!("\nwrote {}", p.display());
    }
    Ok(report)
}

/// The demo's scenario: the crawler flood built into the binary, weir alone, wherever
/// the binary is: the rivals need nginx and HAProxy installed, the alert replay
/// promtool and docs/alerts.yml beside it.
fn demo_scenario() -> Result<Scenario, SimError> {
    let mut scenario = load_scenario_str(
        DEMO_SCENARIO,
        Some(Path::new("2026-09-23-crawler-flood.toml")),
    )
    .map_err(SimError::Scenario)?;
    scenario.variants.retain(|v| v.gateway == GatewayKind::Weir);
    scenario.alerts = None;
    scenario
        .checks
        .retain(|c| !matches!(c.check.subject, super::expect::Subject::Alert(_)));
    Ok(scenario)
}

/// Runs the selected variants and evaluates every check that applies to them.
pub fn run_scenario(scenario: &Scenario, options: &SimOptions) -> Result<SimReport, SimError> {
    let selected = selected_variants(scenario, &options.variants)?;
    if let Some(alerts) = &scenario.alerts
        && selected.iter().any(|v| v.gateway == GatewayKind::Weir)
    {
        ready_to_replay(&alerts.rules)?;
    }
    if let Some(dir) = &options.alert_series {
        std::fs::create_dir_all(dir).map_err(|source| SimError::Write {
            path: dir.clone(),
            source,
        })?;
    }
    let mut variants = Vec::new();
    for v in selected {
        let run = RunOptions {
            progress: options.progress,
            alert_series: options.alert_series.as_deref(),
            beside: options.beside.as_ref(),
        };
        variants.push(run_variant(scenario, v, run)?);
    }
    let checks = check_results(scenario, &variants);
    let meta = &scenario.file.scenario;
    Ok(SimReport {
        scenario: meta.name.clone(),
        description: meta.description.clone(),
        duration_s: meta.duration.0.as_secs_f64(),
        compression: meta.compression,
        story_start: meta.story_start.clone(),
        variants,
        checks,
    })
}

/// The variants `names` asks for, in its order (all of them, in the file's
/// order, when it names none); a name the scenario lacks is an error.
fn selected_variants<'s>(
    scenario: &'s Scenario,
    names: &[String],
) -> Result<Vec<&'s super::scenario::Variant>, SimError> {
    if names.is_empty() {
        return Ok(scenario.variants.iter().collect());
    }
    let known = || {
        scenario
            .variants
            .iter()
            .map(|v| v.name.clone())
            .collect::<Vec<_>>()
            .join(", ")
    };
    (names.iter())
        .map(|name| {
            (scenario.variants.iter().find(|v| &v.name == name)).ok_or_else(|| {
                SimError::UnknownVariant {
                    name: name.clone(),
                    known: known(),
                }
            })
        })
        .collect()
}

/// Every check of the scenario evaluated on each variant it applies to.
fn check_results(scenario: &Scenario, variants: &[VariantReport]) -> Vec<CheckResult> {
    let mut checks = Vec::new();
    for e in &scenario.checks {
        for v in variants
            .iter()
            .filter(|v| e.variant.as_ref().is_none_or(|n| n == &v.name))
        {
            let (value, passed) = v.evaluate(&e.check);
            checks.push(CheckResult {
                variant: v.name.clone(),
                check: e.check.text.clone(),
                line: e.line,
                value,
                passed,
                pending: e.pending.clone(),
            });
        }
    }
    checks
}

/// Before any variant runs: the alert replay will find its rules file and promtool.
fn ready_to_replay(rules: &Path) -> Result<(), SimError> {
    let problem = if !rules.is_file() {
        Some("not a file".to_string())
    } else if !Path::new(&super::alerts::PROMTOOL.path()).exists() {
        Some(format!(
            "replaying alerts needs promtool ({}); install it (apt-get install prometheus, \
             or scripts/install-test-deps.sh) or set {}",
            super::alerts::PROMTOOL.binary,
            super::alerts::PROMTOOL.env
        ))
    } else {
        None
    };
    match problem {
        Some(problem) => Err(SimError::AlertRules {
            path: rules.to_path_buf(),
            problem,
        }),
        None => Ok(()),
    }
}

fn write_outputs(report: &SimReport, options: &SimOptions) -> Result<(), SimError> {
    let write = |path: &PathBuf, text: String| {
        std::fs::write(path, text).map_err(|source| SimError::Write {
            path: path.clone(),
            source,
        })
    };
    if let Some(p) = &options.json {
        // Serializing plain structs of numbers and strings cannot fail.
        write(p, serde_json::to_string_pretty(report).unwrap_or_default())?;
    }
    if let Some(p) = &options.html {
        write(p, report.to_html())?;
    }
    Ok(())
}

/// The demo's short comparison: what people got, and what the app went through.
pub fn demo_summary(report: &SimReport) -> String {
    use super::report::Tally;
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<14} {:>14} {:>15} {:>14} {:>16} {:>24}",
        "variant",
        "people served",
        "people refused",
        "people failed",
        "all 5xx/errors",
        "app workers busy/W"
    );
    for v in &report.variants {
        let people = v.people();
        let all = Tally::of(v.cohorts.iter());
        let _ = writeln!(
            out,
            "{:<14} {:>13.1}% {:>14.1}% {:>13.1}% {:>16} {:>24}",
            v.name,
            people.pct(people.served),
            people.pct(people.refused),
            people.pct(people.failed),
            all.failed,
            format!(
                "{}/{} (backlog full {})",
                v.upstream.max_in_flight, v.upstream.workers, v.upstream.refused
            )
        );
    }
    let _ = writeln!(
        out,
        "\nrefused: 429, 503 or a challenge left unsolved (the gateway said no); \
         failed: other 5xx, connection errors, timeouts (the site looked down)"
    );
    out
}

#[cfg(test)]
mod demo_tests {
    use super::*;
    use crate::report::{CohortReport, Tally};
    use crate::scenario::CohortKind;

    fn cohort(outcomes: &[(&str, u64)]) -> CohortReport {
        CohortReport {
            name: "people".into(),
            kind: CohortKind::Humans,
            clients: 1,
            addresses: 1,
            sent: outcomes.iter().map(|(_, n)| n).sum(),
            outcomes: outcomes.iter().map(|(o, n)| (o.to_string(), *n)).collect(),
            reached_app: 0,
            reached_app_share: 0.0,
            served_2s: 0,
            challenges_solved: 0,
            rechallenged: 0,
            challenged_p50_ms: 0.0,
            challenged_p95_ms: 0.0,
            p50_ms: 0.0,
            p95_ms: 0.0,
            p99_ms: 0.0,
        }
    }

    /// The demo runs weir's variants of the built-in scenario and needs neither
    /// nginx, HAProxy nor promtool.
    #[test]
    fn the_demo_is_weir_alone() {
        let s = demo_scenario().expect("the built-in scenario loads");
        let names: Vec<&str> = s.variants.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(
            names,
            ["original", "emergency", "recommended", "zero-config"]
        );
        assert!(s.alerts.is_none());
        let alert_checks = (s.checks.iter())
            .filter(|c| matches!(c.check.subject, crate::expect::Subject::Alert(_)))
            .count();
        assert_eq!(alert_checks, 0);
    }

    /// Regression: the demo counted every request not served as "refused",
    /// so an app's 502s under nginx read as the gateway saying no.
    #[test]
    fn five_hundreds_are_failures_not_refusals() {
        let c = cohort(&[
            ("served", 60),
            ("rejected_429", 10),
            ("unavailable_503", 5),
            ("challenged", 5),
            ("error_5xx", 15),
            ("conn_error", 3),
            ("timeout", 2),
        ]);
        let t = Tally::of(std::iter::once(&c));
        assert_eq!(
            t,
            Tally {
                sent: 100,
                served: 60,
                refused: 20,
                failed: 20
            }
        );
    }
}
