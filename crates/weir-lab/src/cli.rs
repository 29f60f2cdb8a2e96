//! `weir sim` and `weir demo`: load a scenario, run the chosen variants one after the
//! other, evaluate the checks, print the side-by-side table and write JSON/HTML.
//!
//! `main` only maps the result to an exit status: `Ok` with a failing check is exit 1,
//! an error (bad scenario, nginx missing, weir not starting) is exit 2.

use std::path::{Path, PathBuf};

use super::report::{CheckResult, SimReport};
use super::runner::{RunError, run_variant};
use super::scenario::{Scenario, load_scenario_file, load_scenario_str};
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
    #[error(transparent)]
    Run(#[from] RunError),
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
    /// Print a progress line on stderr while running.
    pub progress: bool,
}

/// `weir sim SCENARIO.toml`: runs, prints the table to stdout, writes files.
pub fn sim(path: &Path, options: &SimOptions) -> Result<SimReport, SimError> {
    let scenario = load_scenario_file(path).map_err(SimError::Scenario)?;
    let report = run_scenario(&scenario, options)?;
    print!("{}", report.to_text());
    write_outputs(&report, options)?;
    Ok(report)
}

/// `weir demo`: the crawler-flood scenario, every variant, HTML to `html`.
pub fn demo(html: Option<PathBuf>, progress: bool) -> Result<SimReport, SimError> {
    let scenario = load_scenario_str(
        DEMO_SCENARIO,
        Some(Path::new("2026-09-23-crawler-flood.toml")),
    )
    .map_err(SimError::Scenario)?;
    let options = SimOptions {
        variants: Vec::new(),
        json: None,
        html: Some(html.unwrap_or_else(|| PathBuf::from(DEMO_HTML))),
        progress,
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

/// Runs the selected variants and evaluates every check that applies to them.
pub fn run_scenario(scenario: &Scenario, options: &SimOptions) -> Result<SimReport, SimError> {
    let selected: Vec<&super::scenario::Variant> = if options.variants.is_empty() {
        scenario.variants.iter().collect()
    } else {
        let known = || {
            scenario
                .variants
                .iter()
                .map(|v| v.name.clone())
                .collect::<Vec<_>>()
                .join(", ")
        };
        (options.variants.iter())
            .map(|name| {
                (scenario.variants.iter().find(|v| &v.name == name)).ok_or_else(|| {
                    SimError::UnknownVariant {
                        name: name.clone(),
                        known: known(),
                    }
                })
            })
            .collect::<Result<_, _>>()?
    };
    let mut variants = Vec::new();
    for v in selected {
        variants.push(run_variant(scenario, v, options.progress)?);
    }
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
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<14} {:>14} {:>16} {:>10} {:>22}",
        "variant", "humans served", "humans refused", "5xx", "app workers busy/W"
    );
    for v in &report.variants {
        let humans = v
            .cohorts
            .iter()
            .filter(|c| c.kind == super::scenario::CohortKind::Humans);
        let (mut sent, mut served, mut refused) = (0, 0, 0);
        for h in humans {
            sent += h.sent;
            served += h.count(super::cohort::Outcome::Served);
            refused += h.sent - h.count(super::cohort::Outcome::Served);
        }
        let errors: u64 = v.cohorts.iter().map(|c| c.failed()).sum();
        let pct = |n: u64| {
            if sent == 0 {
                0.0
            } else {
                n as f64 * 100.0 / sent as f64
            }
        };
        let _ = writeln!(
            out,
            "{:<14} {:>13.1}% {:>15.1}% {:>10} {:>22}",
            v.name,
            pct(served),
            pct(refused),
            errors,
            format!(
                "{}/{} (refused {})",
                v.upstream.max_in_flight, v.upstream.workers, v.upstream.refused
            )
        );
    }
    out
}
