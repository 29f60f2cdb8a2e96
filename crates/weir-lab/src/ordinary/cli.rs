//! `weir harm`: the runs of the harmlessness table (or a soak) one after
//! another, each printed as it ends, the table at the end, and the verdict.
//!
//! Owns the order of the runs, the printing and the JSON. Reading the
//! command line is the CLI's; one run is [`super::run`]'s, a soak
//! [`super::soak`]'s.

use std::path::{Path, PathBuf};

use super::front::{FrontKind, Operation};
use super::mix::Mix;
use super::run::{Plan, Row, RunError, harmed, run, table};
use super::soak::{SoakPlan, SoakReport, soak};

/// What `weir harm` runs.
#[derive(Debug, Clone)]
pub struct HarmOptions {
    /// The short plan (CI's) instead of the full one.
    pub short: bool,
    /// Only pages and uploads ([`Mix::pages_and_uploads`]).
    pub pages_and_uploads: bool,
    pub fronts: Vec<FrontKind>,
    pub ops: Vec<Operation>,
    /// The weir binary to run.
    pub weir: PathBuf,
    /// Every row (or the soak's report) as JSON, here.
    pub json: Option<PathBuf>,
}

/// Why `weir harm` could not finish.
#[derive(Debug, thiserror::Error)]
pub enum HarmError {
    #[error("cannot start a runtime: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    Run(Box<RunError>),
    #[error("cannot write {path}: {source}")]
    Json {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl From<RunError> for HarmError {
    fn from(e: RunError) -> Self {
        HarmError::Run(Box::new(e))
    }
}

/// Runs every operation that applies to each front; prints each row as it
/// ends (on stderr) and the table (on stdout). `Ok(true)`: no harm (see
/// [`harmed`]).
pub fn harm(options: &HarmOptions) -> Result<bool, HarmError> {
    let mut plan = if options.short {
        Plan::short(options.weir.clone())
    } else {
        Plan::full(options.weir.clone())
    };
    if options.pages_and_uploads {
        plan.mix = Mix::pages_and_uploads();
    }
    let rt = runtime()?;
    let mut rows: Vec<Row> = Vec::new();
    for &front in &options.fronts {
        for &op in options.ops.iter().filter(|o| o.applies_to(front)) {
            eprintln!("weir harm: {} / {} ...", front.name(), op.name());
            let row = rt.block_on(run(&plan, front, op))?;
            let line = table(std::slice::from_ref(&row));
            eprintln!("{}", line.lines().last().unwrap_or(""));
            rows.push(row);
        }
    }
    println!("{}", table(&rows));
    write_json(options.json.as_deref(), &rows)?;
    Ok(!harmed(&rows))
}

/// A soak of `duration` through weir; prints a line a minute and the
/// summary. `Ok(true)`: nothing failed and memory stayed within 5% after
/// warm-up.
pub fn soak_command(
    weir: PathBuf,
    duration: std::time::Duration,
    json: Option<&Path>,
) -> Result<bool, HarmError> {
    let plan = SoakPlan::new(weir, duration);
    let report = runtime()?.block_on(soak(&plan))?;
    print_soak(&report);
    write_json(json, &report)?;
    Ok(report.summary.failed == 0 && report.rss_growth_pct <= 5.0)
}

fn print_soak(report: &SoakReport) {
    println!("| minute | pid | RSS MiB | fds | threads |\n|---|---|---|---|---|");
    for s in report.samples.iter().filter(|s| s.at_secs % 60 < 10) {
        println!(
            "| {} | {} | {:.1} | {} | {} |",
            s.at_secs / 60,
            s.pid,
            s.rss_kib as f64 / 1024.0,
            s.fds,
            s.threads
        );
    }
    let s = &report.summary;
    println!(
        "\n{} s, {} reloads, {} upgrades: {} requests, {} failed, {} uploads ({} cut), \
         weir 503/429 {}/{}; after warm-up RSS {:+.1}%, fds {:+}, threads {:+}",
        report.duration_secs,
        report.reloads,
        report.upgrades,
        s.sent,
        s.failed,
        s.uploads,
        s.uploads_cut,
        s.weir_503,
        s.weir_429,
        report.rss_growth_pct,
        report.fds_growth,
        report.threads_growth
    );
    for e in &s.examples {
        println!("  {e}");
    }
}

/// The lab's runtime: two workers (the machine's two cores), and weir's
/// upgraded generations reaped here.
fn runtime() -> Result<tokio::runtime::Runtime, HarmError> {
    super::process::become_subreaper();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(HarmError::Runtime)
}

fn write_json(path: Option<&Path>, value: &impl serde::Serialize) -> Result<(), HarmError> {
    let Some(path) = path else {
        return Ok(());
    };
    let failed = |source| HarmError::Json {
        path: path.to_path_buf(),
        source,
    };
    let text = serde_json::to_string_pretty(value).map_err(|e| failed(e.into()))?;
    std::fs::write(path, text).map_err(failed)
}
