//! A bounded soak (issue 35): the ordinary mix through weir for a long
//! while, with a reload every minute and an upgrade every five, weir's
//! memory, descriptors and threads sampled as it goes. What leaks shows as
//! growth; what breaks shows in the tally.
//!
//! Owns the schedule and the samples (read from `/proc/PID` of whichever
//! generation serves). Does not judge beyond the summary's growth figures:
//! `weir harm --soak` prints them, `bench/README.md` keeps a run.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::app::{OrdinaryApp, OrdinaryAppConfig};
use super::front::{Front, FrontError, FrontKind, Operation};
use super::mix::{self, Mix};
use super::run::RunError;
use super::tally::{Summary, Tally};

/// How long, and how often each operation.
#[derive(Debug, Clone)]
pub struct SoakPlan {
    pub duration: Duration,
    pub reload_every: Duration,
    pub upgrade_every: Duration,
    /// How often weir's process is sampled.
    pub sample_every: Duration,
    /// Samples before this are warm-up: growth is measured from the first
    /// sample after it.
    pub warm_up: Duration,
    pub mix: Mix,
    pub app: OrdinaryAppConfig,
    pub weir: PathBuf,
}

impl SoakPlan {
    /// Issue 35's: 30 minutes, a reload a minute, an upgrade every five.
    pub fn new(weir: PathBuf, duration: Duration) -> SoakPlan {
        SoakPlan {
            duration,
            reload_every: Duration::from_secs(60),
            upgrade_every: Duration::from_secs(300),
            sample_every: Duration::from_secs(10),
            warm_up: Duration::from_secs(120).min(duration / 4),
            mix: Mix::default(),
            app: OrdinaryAppConfig::default(),
            weir,
        }
    }
}

/// One look at the serving generation.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Sample {
    pub at_secs: u64,
    pub pid: u32,
    pub rss_kib: u64,
    pub fds: u64,
    pub threads: u64,
}

/// What a soak found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SoakReport {
    pub duration_secs: u64,
    pub reloads: u32,
    pub upgrades: u32,
    pub summary: Summary,
    pub samples: Vec<Sample>,
    /// The last sample's resident memory over the first after warm-up, as
    /// a growth in percent (both of whichever generation served then).
    pub rss_growth_pct: f64,
    pub fds_growth: i64,
    pub threads_growth: i64,
}

/// Runs the soak.
pub async fn soak(plan: &SoakPlan) -> Result<SoakReport, RunError> {
    let app = OrdinaryApp::start(plan.app.clone(), "127.0.0.1:0".parse().expect("literal"))
        .map_err(RunError::App)?;
    let mut front = Front::start(FrontKind::Weir, Operation::Upgrade, app.addr(), &plan.weir)
        .await
        .map_err(soak_failed)?;
    let tally = Arc::new(Tally::default());
    let began = Instant::now();
    let until = began + plan.duration;
    let mut mix_plan = plan.mix.clone();
    mix_plan.events_per_stream = plan.app.events;
    let visitors = tokio::spawn({
        let (target, tally) = (front.target, tally.clone());
        async move { mix::run(&mix_plan, target, until, tally).await }
    });
    let operated = operate_on_schedule(&mut front, plan, began, until).await?;
    let _ = visitors.await;
    front.stop().await.map_err(soak_failed)?;
    let (rss_growth_pct, fds_growth, threads_growth) = growth(&operated.samples, plan.warm_up);
    Ok(SoakReport {
        duration_secs: plan.duration.as_secs(),
        reloads: operated.reloads,
        upgrades: operated.upgrades,
        summary: tally.summary(),
        samples: operated.samples,
        rss_growth_pct,
        fds_growth,
        threads_growth,
    })
}

/// A soak's failure to operate weir.
fn soak_failed(source: FrontError) -> RunError {
    RunError::Front {
        front: "weir",
        operation: "soak",
        source,
    }
}

/// What the schedule did: how many reloads and upgrades, and the samples.
struct Operated {
    reloads: u32,
    upgrades: u32,
    samples: Vec<Sample>,
}

/// Until `until`, upgrades and reloads weir on the plan's schedule (from
/// `began`) and samples the serving generation's process.
async fn operate_on_schedule(
    front: &mut Front,
    plan: &SoakPlan,
    began: Instant,
    until: Instant,
) -> Result<Operated, RunError> {
    let (mut reloads, mut upgrades) = (0, 0);
    let mut samples = Vec::new();
    let mut next_reload = began + plan.reload_every;
    let mut next_upgrade = began + plan.upgrade_every;
    let mut next_sample = began;
    while Instant::now() < until {
        let next = next_reload.min(next_upgrade).min(next_sample).min(until);
        tokio::time::sleep_until(next).await;
        let now = Instant::now();
        if now >= until {
            break;
        }
        if now >= next_upgrade {
            front
                .operate(Operation::Upgrade)
                .await
                .map_err(soak_failed)?;
            upgrades += 1;
            next_upgrade += plan.upgrade_every;
            // An upgrade is a reload too: the next one comes a minute later.
            next_reload = now + plan.reload_every;
        } else if now >= next_reload {
            front
                .operate(Operation::Reload)
                .await
                .map_err(soak_failed)?;
            reloads += 1;
            next_reload += plan.reload_every;
        }
        if now >= next_sample {
            if let Some(pid) = front.pid()
                && let Some(s) = look(pid, now.duration_since(began))
            {
                samples.push(s);
            }
            next_sample += plan.sample_every;
        }
    }
    Ok(Operated {
        reloads,
        upgrades,
        samples,
    })
}

/// Growth from the first sample after `warm_up` to the last: resident
/// memory in percent, descriptors and threads in number; zeros without
/// such samples.
fn growth(samples: &[Sample], warm_up: Duration) -> (f64, i64, i64) {
    let warm = warm_up.as_secs();
    let first = samples.iter().find(|s| s.at_secs >= warm).copied();
    let last = samples.last().copied();
    match (first, last) {
        (Some(f), Some(l)) => (
            (l.rss_kib as f64 / f.rss_kib.max(1) as f64 - 1.0) * 100.0,
            l.fds as i64 - f.fds as i64,
            l.threads as i64 - f.threads as i64,
        ),
        _ => (0.0, 0, 0),
    }
}

/// Resident memory, descriptors and threads of `pid`, from `/proc`.
fn look(pid: u32, at: Duration) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some(Sample {
        at_secs: at.as_secs(),
        pid,
        rss_kib: field("VmRSS:")?,
        fds,
        threads: field("Threads:")?,
    })
}
