//! One harmlessness run: the app, a front, the ordinary mix for a fixed
//! time, an operation repeated while it runs, and what visitors got,
//! as a [`Row`] of the table `docs/operations.md` prints.
//!
//! Owns the run's timeline (warm-up, operations at fixed times, a tail),
//! the per-address limit checked around every operation, and the table.
//! Does not judge: the tests and `weir harm` compare rows.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::app::{OrdinaryApp, OrdinaryAppConfig};
use super::front::{Front, FrontError, FrontKind, Operation};
use super::mix::{self, Mix};
use super::tally::{Summary, Tally};

/// How long, how often, and with what.
#[derive(Debug, Clone)]
pub struct Plan {
    pub mix: Mix,
    pub app: OrdinaryAppConfig,
    /// Operations in a run, `every` apart.
    pub times: u32,
    pub every: Duration,
    /// Visitors before the first operation, and after the last.
    pub warm: Duration,
    pub tail: Duration,
    /// The weir binary to run.
    pub weir: PathBuf,
}

impl Plan {
    /// Issue 35's: the whole mix, ten operations five seconds apart (a
    /// run of about a minute).
    pub fn full(weir: PathBuf) -> Plan {
        Plan {
            mix: Mix::default(),
            app: OrdinaryAppConfig::default(),
            times: 10,
            every: Duration::from_secs(5),
            warm: Duration::from_secs(5),
            tail: Duration::from_secs(5),
            weir,
        }
    }

    /// For CI: a third of the mix, three operations three seconds apart;
    /// an upload a second (of 2-5 MB over 3-6 s), so that every operation
    /// meets several in flight.
    pub fn short(weir: PathBuf) -> Plan {
        Plan {
            mix: Mix {
                uploads_per_sec: 1.0,
                ..Mix::scaled(1.0 / 3.0)
            },
            app: OrdinaryAppConfig::default(),
            times: 3,
            every: Duration::from_secs(3),
            warm: Duration::from_secs(3),
            tail: Duration::from_secs(3),
            weir,
        }
    }

    fn duration(&self) -> Duration {
        self.warm + self.every * self.times + self.tail
    }
}

/// How long the app is down in a deploy ([`Operation::AppRestart`]).
const APP_DOWN: Duration = Duration::from_millis(300);

/// What one run found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    pub front: FrontKind,
    pub operation: Operation,
    /// Operations performed.
    pub times: u32,
    pub summary: Summary,
    /// After how many operations the per-address limit was still in force,
    /// of how many it was checked after.
    pub limits_kept: Option<(u32, u32)>,
    /// The operations (counted from 0) after which it was not.
    pub limits_lost_after: Vec<u32>,
    /// What the app saw: requests refused (backlog full), most workers busy.
    pub app_refused: u64,
    pub app_max_busy: usize,
    pub app_workers: usize,
    /// How long each operation took until the front served again.
    pub operation_ms: Vec<u64>,
    /// Each weir process started: from its spawn to listening.
    pub start_ms: Vec<u64>,
    /// weir processes killed at the end of a container's grace.
    pub killed: u32,
}

impl Row {
    /// Whether the app had a worker to spare at every moment of the run.
    pub fn app_had_room(&self) -> bool {
        self.app_refused == 0 && self.app_max_busy < self.app_workers
    }
}

/// Why a run could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("the app did not start: {0}")]
    App(std::io::Error),
    #[error("{front}, {operation}: {source}")]
    Front {
        front: &'static str,
        operation: &'static str,
        source: FrontError,
    },
}

/// Runs the mix through `front` while `op` is performed `plan.times` times.
pub async fn run(plan: &Plan, front: FrontKind, op: Operation) -> Result<Row, RunError> {
    let failed = |source| RunError::Front {
        front: front.name(),
        operation: op.name(),
        source,
    };
    let mut app = OrdinaryApp::start(plan.app.clone(), "127.0.0.1:0".parse().expect("literal"))
        .map_err(RunError::App)?;
    let mut gateway = Front::start(front, op, app.addr(), &plan.weir)
        .await
        .map_err(failed)?;
    let tally = Arc::new(Tally::default());
    let mut mix_plan = plan.mix.clone();
    mix_plan.events_per_stream = plan.app.events;
    let began = Instant::now();
    let until = began + plan.duration();
    let visitors = tokio::spawn({
        let (target, tally) = (gateway.target, tally.clone());
        async move { mix::run(&mix_plan, target, until, tally).await }
    });
    let operated = op != Operation::Steady && op.applies_to(front);
    let done = match operate(plan, op, front, &mut gateway, &mut app, began).await {
        Ok(done) => done,
        Err(e) => {
            // Visitors still get what they get; the run reports the error.
            visitors.abort();
            return Err(e);
        }
    };
    let _ = visitors.await;
    let start_ms = gateway
        .starts()
        .iter()
        .map(|d| d.as_millis() as u64)
        .collect();
    let killed = gateway.killed();
    gateway.stop().await.map_err(failed)?;
    let counters = app.counters();
    Ok(Row {
        front,
        operation: op,
        times: if operated { plan.times } else { 0 },
        summary: tally.summary(),
        limits_kept: done.checks_limits.then_some((done.kept, done.checked)),
        limits_lost_after: done.limits_lost_after,
        app_refused: counters.refused.load(Ordering::Relaxed),
        app_max_busy: counters.max_busy.load(Ordering::Relaxed),
        app_workers: plan.app.workers,
        operation_ms: done.operation_ms,
        start_ms,
        killed,
    })
}

/// What the operations of a run found.
#[derive(Default)]
struct Operated {
    checks_limits: bool,
    kept: u32,
    checked: u32,
    limits_lost_after: Vec<u32>,
    operation_ms: Vec<u64>,
}

/// Performs `op` `plan.times` times on `gateway` (or on `app`, a deploy),
/// on the plan's schedule, probing the per-address limit around each.
async fn operate(
    plan: &Plan,
    op: Operation,
    front: FrontKind,
    gateway: &mut Front,
    app: &mut OrdinaryApp,
    began: Instant,
) -> Result<Operated, RunError> {
    let failed = |source| RunError::Front {
        front: front.name(),
        operation: op.name(),
        source,
    };
    let operated = op != Operation::Steady && op.applies_to(front);
    // A deploy of the app is no operation on the front's limits.
    let mut done = Operated {
        checks_limits: operated && front != FrontKind::Direct && op != Operation::AppRestart,
        ..Operated::default()
    };
    let mut served_from = began;
    for k in 0..plan.times {
        let due = began + plan.warm + plan.every * k;
        // A front serves for the plan's spacing at least between two
        // operations: stops that take longer (a drain of seconds) would
        // else follow each other at once, and measure a front that never
        // serves (connections held through one drain met the next).
        tokio::time::sleep_until(due.max(served_from + plan.every)).await;
        if !operated {
            continue;
        }
        let limited = done.checks_limits && gateway.limit_probe(k).await;
        let started = Instant::now();
        match op {
            Operation::AppRestart => app.restart(APP_DOWN).await.map_err(RunError::App)?,
            _ => gateway.operate(op).await.map_err(failed)?,
        };
        done.operation_ms.push(started.elapsed().as_millis() as u64);
        served_from = Instant::now();
        if limited {
            done.checked += 1;
            if gateway.probe_still_limited(k).await {
                done.kept += 1;
            } else {
                done.limits_lost_after.push(k);
            }
        }
    }
    Ok(done)
}

/// Whether weir did harm among `rows`: it failed more requests or cut more
/// uploads than the app alone under the same operation (or in steady state
/// when there is no such row), or answered `503`/`429` itself. A plain
/// stop/start is allowed its refused connections (the gap between the two
/// processes: see docs/operations.md).
pub fn harmed(rows: &[Row]) -> bool {
    let direct = |op: Operation| {
        rows.iter()
            .find(|r| r.front == FrontKind::Direct && r.operation == op)
    };
    rows.iter().filter(|r| r.front == FrontKind::Weir).any(|r| {
        let (failed, cut) = direct(r.operation)
            .or_else(|| direct(Operation::Steady))
            .map_or((0, 0), |d| (d.summary.failed, d.summary.uploads_cut));
        let s = &r.summary;
        let allowed = match r.operation {
            Operation::Restart | Operation::ContainerStop => failed + s.refused,
            _ => failed,
        };
        s.uploads_cut > cut || s.weir_503 + s.weir_429 > 0 || s.failed > allowed
    })
}

/// The rows as a Markdown table, pages' latency also as added to
/// `direct`'s when a steady direct row is among them.
pub fn table(rows: &[Row]) -> String {
    let direct = rows
        .iter()
        .find(|r| r.front == FrontKind::Direct && r.operation == Operation::Steady);
    let mut out = String::from(
        "| front | operation | requests | failed | refused | uploads (cut) | weir 503 / 429 | page p50 / p99 ms | added p50 / p99 | limit kept |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let s = &r.summary;
        let op = if r.times > 0 {
            format!("{} x{}", r.operation.name(), r.times)
        } else {
            r.operation.name().to_string()
        };
        let added = match direct {
            Some(d) if !std::ptr::eq(d, r) => format!(
                "{:+.1} / {:+.1}",
                s.page_p50_ms - d.summary.page_p50_ms,
                s.page_p99_ms - d.summary.page_p99_ms
            ),
            _ => "-".into(),
        };
        let kept = match r.limits_kept {
            Some((k, n)) => format!("{k} of {n}"),
            None => "-".into(),
        };
        out.push_str(&format!(
            "| {} | {op} | {} | {} | {} | {} ({}) | {} / {} | {:.1} / {:.1} | {added} | {kept} |\n",
            r.front.name(),
            s.sent,
            s.failed,
            s.refused,
            s.uploads + s.uploads_cut,
            s.uploads_cut,
            s.weir_503,
            s.weir_429,
            s.page_p50_ms,
            s.page_p99_ms,
        ));
    }
    out
}
