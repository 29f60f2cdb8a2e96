//! One variant's run: start the app, the gateway (weir, or a rival nginx or HAProxy),
//! the load balancer when the topology has one, the health check and the cohorts, each
//! in its own tokio runtime so the generator's lag measures the generator; then collect
//! what every side counted into a [`VariantReport`].
//!
//! Threads: the app (and its health checker, autoheal, sampler and, with `[alerts]`,
//! the scraper of weir's metrics) on one runtime, weir on another with two workers (a
//! rival runs as its own process), the load generator on a third. On a 2-core machine
//! they still share cores, which is why the generator reports its own scheduling lag.
//!
//! It does not judge results (checks are evaluated in [`crate::cli`]) and does not
//! print anything except the optional progress line on stderr.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::sync::watch;
use tokio::time::Instant;

use super::addresses::{AddressError, AddressSpace};
use super::alerts::{AlertError, MetricsRecorder};
use super::app::{AppConfig, AppSnapshot, AppStats, SimApp};
use super::cohort::{
    ClientPlan, CohortStats, CohortTotals, OUTCOMES, RunClock, RunContext, run_client,
};
use super::process::{ProcessError, ServerProcess};
use super::report::{
    AlertReport, CohortReport, GeneratorReport, RuleReport, Timeline, UpstreamReport,
    VariantReport, quantile_ms,
};
use super::scenario::{
    Cohort, CohortKind, GatewayKind, HealthConfig, LoadBalancer, REDIS_PLACEHOLDER, RedisOutage,
    Scenario, Variant,
};
use weir::config::{ConfigErrors, ProcessEnv, load_str};
use weir::server::{Server, StartError};

/// Why a variant could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot start a runtime or temp dir: {0}")]
    Setup(std::io::Error),
    #[error("the app did not start: {0}")]
    App(std::io::Error),
    #[error("variant {variant:?}: weir's config is invalid:\n{errors}")]
    WeirConfig {
        variant: String,
        errors: ConfigErrors,
    },
    #[error("variant {variant:?}: weir did not start: {source}")]
    WeirStart { variant: String, source: StartError },
    #[error("variant {0:?}: weir's config has no listener")]
    NoListener(String),
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error("cohort {cohort:?}: {source}")]
    Addresses {
        cohort: String,
        source: AddressError,
    },
    #[error("variant {variant:?}: the alert replay failed: {source}")]
    Alerts { variant: String, source: AlertError },
}

/// Lead time between starting the clients and the run's time zero.
const LEAD: Duration = Duration::from_millis(300);
/// How often the app's counters are sampled for the timeline.
const SAMPLE_EVERY: Duration = Duration::from_millis(50);
/// A scrape of weir's metrics for the alert replay not answered within this is
/// missing from the series, as a failed scrape is in Prometheus.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(1);

/// The three runtimes of a run (see the module doc).
struct Runtimes {
    app: tokio::runtime::Runtime,
    weir: tokio::runtime::Runtime,
    load: tokio::runtime::Runtime,
}

impl Runtimes {
    /// The app's (one thread), weir's (two) and the load's (one).
    fn start() -> Result<Runtimes, RunError> {
        Ok(Runtimes {
            app: runtime("weir-lab-app", 1)?,
            weir: runtime("weir-lab-weir", 2)?,
            load: runtime("weir-lab-load", 1)?,
        })
    }
}

/// The gateway in front of the app: weir in-process (one instance, or a
/// fleet behind the load balancer), or a rival's process.
enum Gateway {
    Weir(Vec<WeirInstance>),
    Rival(Box<ServerProcess>),
}

/// One weir instance of a variant, started in-process.
struct WeirInstance {
    server: Server,
    addr: SocketAddr,
    admin: Option<SocketAddr>,
    /// Where its access log goes (each instance its own).
    access_log: std::path::PathBuf,
}

impl Gateway {
    /// Starts the variant's gateway in front of the app at `app`; weir's access log
    /// goes to `access_log` unless its config says otherwise (a fleet's
    /// further instances beside it), `{{redis}}` becomes `redis`.
    fn start(
        variant: &Variant,
        app: SocketAddr,
        dir: &Path,
        (access_log, log_on): (&Path, bool),
        (weir_rt, redis): (&tokio::runtime::Runtime, Option<&str>),
    ) -> Result<Gateway, RunError> {
        match variant.gateway {
            GatewayKind::Nginx => Ok(Gateway::Rival(Box::new(super::nginx::start_gateway(
                &variant.config_text,
                app,
            )?))),
            GatewayKind::Haproxy => Ok(Gateway::Rival(Box::new(super::haproxy::start_gateway(
                &variant.config_text,
                app,
            )?))),
            GatewayKind::Weir => {
                let mut fleet = Vec::with_capacity(variant.instances);
                for i in 0..variant.instances {
                    let (own_dir, log) = if i == 0 {
                        (dir.to_path_buf(), access_log.to_path_buf())
                    } else {
                        let own = dir.join(format!("instance-{i}"));
                        std::fs::create_dir_all(&own).map_err(RunError::Setup)?;
                        (own, dir.join(format!("access-{i}.log")))
                    };
                    let text = weir_config_text(variant, app, &own_dir, &log, log_on)
                        .replace(REDIS_PLACEHOLDER, redis.unwrap_or_default());
                    fleet.push(start_weir(variant, &text, weir_rt, log)?);
                }
                Ok(Gateway::Weir(fleet))
            }
        }
    }

    /// Where clients (or the balancer) connect: each instance's listener.
    fn addrs(&self) -> Vec<SocketAddr> {
        match self {
            Gateway::Weir(fleet) => fleet.iter().map(|w| w.addr).collect(),
            Gateway::Rival(p) => vec![p.addr],
        }
    }

    fn addr(&self) -> SocketAddr {
        match self {
            Gateway::Weir(fleet) => fleet[0].addr,
            Gateway::Rival(p) => p.addr,
        }
    }

    /// The first weir instance's process state (admission queues), for the
    /// demand probe.
    fn weir_runtime(&self) -> Option<Arc<weir::runtime::Runtime>> {
        match self {
            Gateway::Weir(fleet) => Some(fleet[0].server.runtime.clone()),
            Gateway::Rival(_) => None,
        }
    }

    /// The first weir instance's admin API (alerts replay its metrics).
    fn admin(&self) -> Option<SocketAddr> {
        self.admins().into_iter().next()
    }

    fn admins(&self) -> Vec<SocketAddr> {
        match self {
            Gateway::Weir(fleet) => fleet.iter().filter_map(|w| w.admin).collect(),
            Gateway::Rival(_) => Vec::new(),
        }
    }

    /// Every weir instance's access log.
    fn access_logs(&self) -> Vec<std::path::PathBuf> {
        match self {
            Gateway::Weir(fleet) => fleet.iter().map(|w| w.access_log.clone()).collect(),
            Gateway::Rival(_) => Vec::new(),
        }
    }

    /// Stops the gateway: weir's tasks are aborted, a rival is stopped and reaped.
    fn stop(self) {
        match self {
            Gateway::Weir(fleet) => fleet.into_iter().for_each(|w| w.server.abort()),
            Gateway::Rival(mut p) => p.stop(),
        }
    }
}

/// Starts one weir instance from `text`.
fn start_weir(
    variant: &Variant,
    text: &str,
    weir_rt: &tokio::runtime::Runtime,
    access_log: std::path::PathBuf,
) -> Result<WeirInstance, RunError> {
    let loaded = load_str(text, variant.config_path.as_deref(), &ProcessEnv).map_err(|errors| {
        RunError::WeirConfig {
            variant: variant.name.clone(),
            errors,
        }
    })?;
    let server = weir_rt
        .block_on(Server::start(loaded, None, Box::new(ProcessEnv)))
        .map_err(|source| RunError::WeirStart {
            variant: variant.name.clone(),
            source,
        })?;
    let addr = *server
        .listeners
        .first()
        .ok_or_else(|| RunError::NoListener(variant.name.clone()))?;
    let admin = server.admin;
    Ok(WeirInstance {
        server,
        addr,
        admin,
        access_log,
    })
}

/// How a run shows itself on stderr while it runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Progress {
    /// Nothing (tests, and callers that print their own).
    #[default]
    Off,
    /// One status line, rewritten each second: stderr is a terminal.
    Line,
    /// A status line of its own at the start and every [`LOG_EVERY`]: stderr
    /// is a log or a pipe, where a rewritten line shows nothing until the
    /// run ends, and a demo of several variants that printed nothing for
    /// two minutes looked hung.
    Log,
}

/// How often [`Progress::Log`] writes a line.
pub const LOG_EVERY: Duration = Duration::from_secs(5);

impl Progress {
    /// [`Progress::Line`] when stderr is a terminal, else [`Progress::Log`].
    pub fn for_stderr() -> Progress {
        if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            Progress::Line
        } else {
            Progress::Log
        }
    }
}

/// Something run beside a variant's load, told where the gateway listens and
/// when the load runs ([`Running`]): it starts what it runs on a thread of
/// its own and returns at once. What the lab's cohorts cannot be: a real
/// headless browser reading pages through the flood, in the scenario
/// tests.
#[derive(Clone)]
pub struct Beside(pub Arc<dyn Fn(Running) + Send + Sync>);

impl std::fmt::Debug for Beside {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Beside(..)")
    }
}

/// A variant's run, as [`Beside`] is told it.
#[derive(Debug, Clone)]
pub struct Running {
    /// The variant's name.
    pub variant: String,
    /// Where the cohorts send: the gateway, or the load balancer in front.
    pub target: SocketAddr,
    /// When the load starts, and how long it runs (grace not included).
    pub start: std::time::Instant,
    pub duration: Duration,
}

/// How a variant runs besides its scenario: `progress` shows its status on
/// stderr while it runs; `alert_series` keeps the alert replay's promtool
/// file there (see [`crate::alerts`]); `beside` runs beside its load.
#[derive(Debug, Clone, Copy)]
pub struct RunOptions<'a> {
    pub progress: Progress,
    pub alert_series: Option<&'a Path>,
    pub beside: Option<&'a Beside>,
}

/// Runs one variant of `scenario` (see [`RunOptions`]).
pub fn run_variant(
    scenario: &Scenario,
    variant: &Variant,
    options: RunOptions<'_>,
) -> Result<VariantReport, RunError> {
    let meta = &scenario.file.scenario;
    let dir = tempfile::tempdir().map_err(RunError::Setup)?;
    let rts = Runtimes::start()?;

    let supervisor = start_app(scenario, &rts.app)?;
    let access_log = dir.path().join("access.log");
    let front = Front::start(
        scenario,
        variant,
        (dir.path(), &access_log),
        &supervisor,
        &rts,
    )?;
    let (gateway, target) = (front.gateway, front.target);
    let (plans, owners) = plan_clients(scenario)?;

    let clock = RunClock::new(Instant::now() + LEAD, meta.duration.0, meta.grace.0);
    let stats = cohort_stats(scenario, clock);
    let observers = Observers::start(scenario, &rts.app, &supervisor, &gateway, &stats, clock);
    let outage = (front.redis)
        .map(|r| RedisOutagePlan::start(r, scenario.file.topology.redis_outage, clock));
    if let Some(beside) = options.beside {
        beside.start(&variant.name, target, clock);
    }
    drive_load(
        scenario,
        &rts.load,
        plans,
        &stats,
        (target, clock),
        (options.progress, &variant.name, &supervisor),
    );
    let observed = observers.finish(&rts.app);

    let access_logs = gateway.access_logs();
    // `WEIR_SIM_KEEP` also keeps each instance's last metrics.
    let keep = std::env::var_os("WEIR_SIM_KEEP").map(|_| dir.path());
    let utilisation = observed.utilisation;
    let (metrics, upstream) = stop_all(rts, (gateway, keep), front.lb, supervisor, &utilisation);
    drop(outage.map(RedisOutagePlan::finish));

    let run = FinishedRun {
        dir,
        stats: &stats,
        owners: &owners,
        access_logs,
        gateway: (metrics, upstream),
        observed,
        clock,
    };
    report_run(scenario, variant, run, options.alert_series)
}

/// Each cohort's live counters, with a bucket per second of `clock`.
fn cohort_stats(scenario: &Scenario, clock: RunClock) -> Vec<Arc<CohortStats>> {
    (scenario.cohorts.iter())
        .map(|c| Arc::new(CohortStats::new(&c.name, c.kind, clock.buckets)))
        .collect()
}

/// What a variant's run left to report on.
struct FinishedRun<'a> {
    /// The run's temporary directory (kept with `WEIR_SIM_KEEP`).
    dir: tempfile::TempDir,
    stats: &'a [Arc<CohortStats>],
    /// The cohort each client address belongs to.
    owners: &'a HashMap<IpAddr, String>,
    /// weir's access logs (none for a rival).
    access_logs: Vec<std::path::PathBuf>,
    /// weir's metrics' text, and the app's totals.
    gateway: (String, UpstreamReport),
    observed: Observed,
    clock: RunClock,
}

/// A finished run's report: weir's rule counters (with its access log's
/// rejections by cohort when the scenario keeps the log), the cohorts'
/// outcomes, and the alert replay over the metrics recorded. The run's
/// directory is kept if asked (see [`keep_if_asked`]).
fn report_run(
    scenario: &Scenario,
    variant: &Variant,
    run: FinishedRun<'_>,
    alert_series: Option<&Path>,
) -> Result<VariantReport, RunError> {
    let is_weir = variant.gateway == GatewayKind::Weir;
    let (metrics, upstream) = run.gateway;
    let mut rules = rules_from_metrics(&metrics);
    if scenario.file.scenario.access_log && is_weir {
        count_logs_rejections(
            scenario,
            &run.access_logs,
            (run.owners, run.stats),
            &mut rules,
        );
    }
    let mut report = build_report(
        scenario,
        variant,
        lb_name(scenario),
        run.stats,
        upstream,
        rules,
        run.observed.buckets,
        run.clock,
    );
    if let Some(recorded) = &run.observed.metrics {
        report.alerts = replay_alerts(scenario, variant, recorded, run.stats, alert_series)?;
    }
    keep_if_asked(run.dir, &variant.name, run.stats, run.owners);
    Ok(report)
}

impl Beside {
    /// Starts what runs beside the load, told where and when the run is.
    fn start(&self, variant: &str, target: SocketAddr, clock: RunClock) {
        let lead = clock.start.saturating_duration_since(Instant::now());
        (self.0)(Running {
            variant: variant.to_owned(),
            target,
            start: std::time::Instant::now() + lead,
            duration: clock.duration,
        });
    }
}

/// What stands in front of the app for one variant: the gateway, the load
/// balancer in front of it, and the Redis a fleet shares.
struct Front {
    redis: Option<ServerProcess>,
    gateway: Gateway,
    lb: Option<ServerProcess>,
    /// Where clients connect: the balancer, else the gateway.
    target: SocketAddr,
}

impl Front {
    /// Starts the Redis the variant names (`{{redis}}`), the gateway, then
    /// the balancer in front of it.
    fn start(
        scenario: &Scenario,
        variant: &Variant,
        (dir, access_log): (&Path, &Path),
        supervisor: &AppSupervisor,
        rts: &Runtimes,
    ) -> Result<Front, RunError> {
        let redis = variant
            .config_text
            .contains(REDIS_PLACEHOLDER)
            .then(|| super::redis::start("a variant whose config names {{redis}}"))
            .transpose()?;
        let redis_url = redis.as_ref().map(|r| format!("redis://{}/0", r.addr));
        let gateway = Gateway::start(
            variant,
            supervisor.addr,
            dir,
            (access_log, scenario.file.scenario.access_log),
            (&rts.weir, redis_url.as_deref()),
        )?;
        let lb = match scenario.file.topology.load_balancer {
            Some(LoadBalancer::Nginx) => Some(super::nginx::start_load_balancer(&gateway.addrs())?),
            None => None,
        };
        let target = lb.as_ref().map_or(gateway.addr(), |n| n.addr);
        Ok(Front {
            redis,
            gateway,
            lb,
            target,
        })
    }
}

/// [`count_log_rejections`] over every instance's access log.
fn count_logs_rejections(
    scenario: &Scenario,
    logs: &[std::path::PathBuf],
    (owners, stats): (&HashMap<IpAddr, String>, &[Arc<CohortStats>]),
    rules: &mut BTreeMap<String, RuleReport>,
) {
    let people = people_cohorts(scenario);
    let truth = GroundTruth::of(owners, stats);
    for log in logs {
        count_log_rejections(log, &truth, &people, rules);
    }
}

/// `WEIR_SIM_KEEP`: keep the run's directory (weir's access logs, each
/// instance's last metrics as `metrics-N.txt`, and state files,
/// `refused.tsv`: the request id of every answer that was not a page, and
/// whose client got it, and `owners.tsv`: each client address and its
/// cohort, `(shared)` for an address two cohorts share) to look at, and say
/// where it is.
fn keep_if_asked(
    dir: tempfile::TempDir,
    variant: &str,
    stats: &[Arc<CohortStats>],
    owners: &HashMap<IpAddr, String>,
) {
    if std::env::var_os("WEIR_SIM_KEEP").is_some() {
        let mut tsv = String::new();
        for s in stats {
            let ids = s.refused_ids.lock().unwrap_or_else(|p| p.into_inner());
            for id in ids.iter() {
                tsv.push_str(&format!("{id}\t{}\n", s.name));
            }
        }
        let _ = std::fs::write(dir.path().join("refused.tsv"), tsv);
        let owned: String = (owners.iter())
            .map(|(addr, cohort)| format!("{addr}\t{cohort}\n"))
            .collect();
        let _ = std::fs::write(dir.path().join("owners.tsv"), owned);
        let kept = dir.keep();
        eprintln!("weir sim: {variant}'s access log is in {}", kept.display());
    }
}

/// The app, and the supervisor that restarts it like autoheal did.
fn start_app(
    scenario: &Scenario,
    rt: &tokio::runtime::Runtime,
) -> Result<Arc<AppSupervisor>, RunError> {
    let _entered = rt.enter();
    let bind: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 0));
    let app = SimApp::start(scenario.file.app.clone(), bind).map_err(RunError::App)?;
    Ok(Arc::new(AppSupervisor::new(scenario.file.app.clone(), app)))
}

/// The lab's Redis for a fleet, and its outage if the topology plans one:
/// killed at `at` into the run, started again (empty, same port) `lasts`
/// later, on a thread of its own.
struct RedisOutagePlan {
    thread: std::thread::JoinHandle<ServerProcess>,
}

impl RedisOutagePlan {
    fn start(
        mut redis: ServerProcess,
        outage: Option<RedisOutage>,
        clock: RunClock,
    ) -> RedisOutagePlan {
        let thread = std::thread::spawn(move || {
            let Some(outage) = outage else {
                return redis;
            };
            let sleep_until =
                |at: Instant| std::thread::sleep(at.saturating_duration_since(Instant::now()));
            sleep_until(clock.start + outage.at.0);
            redis.stop();
            tracing::info!("lab: redis killed");
            sleep_until(clock.start + outage.at.0 + outage.lasts.0);
            if let Err(e) = redis.restart() {
                tracing::warn!(error = %e, "lab: redis did not start again");
            }
            redis
        });
        RedisOutagePlan { thread }
    }

    /// Waits for the plan's end (the run is over by then) and hands the
    /// process back, to be stopped.
    fn finish(self) -> Option<ServerProcess> {
        self.thread.join().ok()
    }
}

/// Reads what weir counted, then stops everything, the gateway first: its
/// metrics' text, and the app's totals with how busy it was under demand.
fn stop_all(
    rts: Runtimes,
    (gateway, keep_dir): (Gateway, Option<&Path>),
    lb: Option<ServerProcess>,
    supervisor: Arc<AppSupervisor>,
    utilisation: &Utilisation,
) -> (String, UpstreamReport) {
    // A fleet's texts one after another: rules_from_metrics sums them.
    let texts: Vec<String> = gateway
        .admins()
        .into_iter()
        .map(|a| rts.weir.block_on(scrape(a)))
        .collect();
    if let Some(dir) = keep_dir {
        for (i, text) in texts.iter().enumerate() {
            let _ = std::fs::write(dir.join(format!("metrics-{i}.txt")), text);
        }
    }
    let metrics = texts.join("\n");
    drop(lb);
    gateway.stop();
    let Runtimes { app, weir, load } = rts;
    weir.shutdown_timeout(Duration::from_secs(1));
    let upstream = UpstreamReport {
        demand_samples: utilisation.samples,
        busy_under_demand: utilisation.share(),
        ..supervisor.totals()
    };
    drop(supervisor);
    load.shutdown_timeout(Duration::from_secs(1));
    app.shutdown_timeout(Duration::from_secs(1));
    (metrics, upstream)
}

/// The alert replay of a weir variant's metrics, when the scenario has `[alerts]`.
fn replay_alerts(
    scenario: &Scenario,
    variant: &Variant,
    recorded: &MetricsRecorder,
    stats: &[Arc<CohortStats>],
    alert_series: Option<&Path>,
) -> Result<Option<AlertReport>, RunError> {
    let Some(cfg) = &scenario.alerts else {
        return Ok(None);
    };
    let compression = scenario.file.scenario.compression;
    let keep = alert_series.map(|d| d.join(format!("{}.yml", variant.name)));
    let firings =
        super::alerts::replay(recorded, cfg, compression, keep.as_deref()).map_err(|source| {
            RunError::Alerts {
                variant: variant.name.clone(),
                source,
            }
        })?;
    Ok(Some(AlertReport::new(
        &firings,
        first_person_refused(scenario, stats),
        compression,
    )))
}

/// Names of the cohorts that are people (humans, editors): the lab's ground truth.
fn people_cohorts(scenario: &Scenario) -> std::collections::HashSet<&str> {
    scenario
        .cohorts
        .iter()
        .filter(|c| matches!(c.kind, CohortKind::Humans | CohortKind::Editors))
        .map(|c| c.name.as_str())
        .collect()
}

/// When a person was first turned away (429, 503, a challenge not got past), run time
/// since the start, over the people cohorts.
fn first_person_refused(scenario: &Scenario, stats: &[Arc<CohortStats>]) -> Option<Duration> {
    let people = people_cohorts(scenario);
    stats
        .iter()
        .filter(|s| people.contains(s.name.as_str()))
        .filter_map(|s| s.first_turned_away())
        .min()
}

/// Which cohort owns each client address: the lab's ground truth for the access log.
type Owners = HashMap<IpAddr, String>;

/// Each cohort's clients (source address, seed, start offset) and which cohort owns
/// each address.
fn plan_clients(scenario: &Scenario) -> Result<(Vec<Vec<ClientPlan>>, Owners), RunError> {
    let seed = scenario.file.scenario.seed;
    let mut space = AddressSpace::new(seed);
    let mut owners = Owners::new();
    let mut plans = Vec::new();
    let mut by_cohort: Vec<Vec<Ipv4Addr>> = Vec::new();
    for (ci, cohort) in scenario.cohorts.iter().enumerate() {
        let addrs = cohort_addresses(scenario, cohort, &mut space, &by_cohort)?;
        claim_addresses(&mut owners, &addrs, &cohort.name);
        plans.push(cohort_clients(cohort, ci, seed, &addrs));
        by_cohort.push(addrs);
    }
    Ok((plans, owners))
}

/// A cohort's source addresses: its own, allocated from `space` in its
/// networks, then its share of the earlier cohorts' (`by_cohort`) it sends
/// among.
fn cohort_addresses(
    scenario: &Scenario,
    cohort: &Cohort,
    space: &mut AddressSpace,
    by_cohort: &[Vec<Ipv4Addr>],
) -> Result<Vec<Ipv4Addr>, RunError> {
    let shared: usize = cohort.among.iter().map(|(_, n)| n).sum();
    let mut addrs: Vec<Ipv4Addr> = if cohort.networks.is_empty() {
        Vec::new()
    } else {
        space
            .allocate(&cohort.networks, cohort.addresses - shared)
            .map_err(|source| RunError::Addresses {
                cohort: cohort.name.clone(),
                source,
            })?
    };
    for (other, n) in &cohort.among {
        let theirs = scenario
            .cohorts
            .iter()
            .position(|c| &c.name == other)
            .map_or(&[][..], |i| &by_cohort[i][..]);
        addrs.extend(spread_over(theirs, *n));
    }
    Ok(addrs)
}

/// Notes `cohort` as the owner of `addrs` in the access log's ground truth.
fn claim_addresses(owners: &mut Owners, addrs: &[Ipv4Addr], cohort: &str) {
    for a in addrs {
        // An address two cohorts send from is neither's in the access
        // log's ground truth: the log cannot tell them apart.
        owners
            .entry(IpAddr::V4(*a))
            .and_modify(|o| {
                if *o != cohort {
                    *o = SHARED_ADDRESS.to_string();
                }
            })
            .or_insert_with(|| cohort.to_owned());
    }
}

/// The clients of the `ci`th cohort, spread over its addresses `addrs`:
/// which of them carry a session cookie, run a headless browser or follow a
/// challenge's refresh, each one's seed (from the run's `seed`) and its
/// start in the cohort's ramp.
fn cohort_clients(cohort: &Cohort, ci: usize, seed: u64, addrs: &[Ipv4Addr]) -> Vec<ClientPlan> {
    let per = cohort.clients.div_ceil(cohort.addresses.max(1)).max(1);
    let mut clients = Vec::with_capacity(cohort.clients);
    for i in 0..cohort.clients {
        let a = match cohort.kind {
            CohortKind::Crawlers => i / per,
            _ => i % addrs.len(),
        };
        // Exactly round(share x addresses) addresses carry the session cookie, spread evenly.
        let share = cohort.session_cookie_share;
        let session_cookie = ((a + 1) as f64 * share).floor() > (a as f64 * share).floor();
        // The same even spread, offset so it does not coincide with the cookie one.
        let hs = cohort.headless_share;
        let headless = ((a + 2) as f64 * hs).floor() > ((a + 1) as f64 * hs).floor();
        // The addresses that follow the no-script refresh: the same
        // spread over the addresses that run no browser.
        let rs = cohort.refresh_share / (1.0 - hs).max(f64::EPSILON);
        let b = a - ((a + 1) as f64 * hs).floor() as usize;
        let follows_refresh = !headless
            && cohort.refresh_share > 0.0
            && ((b + 3) as f64 * rs).floor() > ((b + 2) as f64 * rs).floor();
        let seed = seed ^ ((ci as u64) << 40) ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let offset = cohort.ramp.mul_f64(i as f64 / cohort.clients.max(1) as f64);
        clients.push(ClientPlan {
            src: addrs[a.min(addrs.len() - 1)],
            session_cookie,
            seed,
            offset,
            headless,
            follows_refresh,
        });
    }
    clients
}

/// The owner the access log's ground truth gives an address two cohorts share.
const SHARED_ADDRESS: &str = "(shared)";

/// `n` of `addrs`, evenly spread over them (repeating when `n` is more).
fn spread_over(addrs: &[Ipv4Addr], n: usize) -> impl Iterator<Item = Ipv4Addr> + '_ {
    (0..n)
        .filter_map(move |j| addrs.get(j * addrs.len() / n.max(1) % addrs.len().max(1)))
        .copied()
}

/// What watches the run beside the load: health checks (and autoheal), the app's
/// sampler, and with `[alerts]` the scraper of weir's metrics.
struct Observers {
    stop: watch::Sender<bool>,
    health: Option<tokio::task::JoinHandle<()>>,
    sampler: tokio::task::JoinHandle<()>,
    scraper: Option<tokio::task::JoinHandle<MetricsRecorder>>,
    buckets: Arc<Mutex<Vec<UpstreamBucket>>>,
    utilisation: Arc<Mutex<Utilisation>>,
}

/// What the observers saw.
struct Observed {
    buckets: Vec<UpstreamBucket>,
    utilisation: Utilisation,
    metrics: Option<MetricsRecorder>,
}

impl Observers {
    fn start(
        scenario: &Scenario,
        app_rt: &tokio::runtime::Runtime,
        supervisor: &Arc<AppSupervisor>,
        gateway: &Gateway,
        stats: &[Arc<CohortStats>],
        clock: RunClock,
    ) -> Observers {
        let buckets = Arc::new(Mutex::new(vec![UpstreamBucket::default(); clock.buckets]));
        let utilisation = Arc::new(Mutex::new(Utilisation::default()));
        let (stop, stop_rx) = watch::channel(false);
        let health = scenario.file.health.enabled.then(|| {
            app_rt.spawn(health_checks(
                supervisor.clone(),
                scenario.file.health.clone(),
                clock,
                buckets.clone(),
                stop_rx.clone(),
            ))
        });
        let demand = DemandProbe {
            weir: gateway.weir_runtime(),
            stats: stats.to_vec(),
            turned_away: 0,
        };
        let sampler = app_rt.spawn(sample(
            supervisor.clone(),
            clock,
            (buckets.clone(), utilisation.clone()),
            demand,
            stop_rx.clone(),
        ));
        let scraper = match (&scenario.alerts, gateway.admin()) {
            (Some(cfg), Some(admin)) => {
                Some(app_rt.spawn(record_metrics(admin, clock, cfg.scrape_every, stop_rx)))
            }
            _ => None,
        };
        Observers {
            stop,
            health,
            sampler,
            scraper,
            buckets,
            utilisation,
        }
    }

    /// Stops every observer and hands over what they saw.
    fn finish(self, app_rt: &tokio::runtime::Runtime) -> Observed {
        let _ = self.stop.send(true);
        if let Some(t) = self.health {
            let _ = app_rt.block_on(t);
        }
        let _ = app_rt.block_on(self.sampler);
        let metrics = self.scraper.and_then(|t| app_rt.block_on(t).ok());
        let buckets =
            std::mem::take(&mut *self.buckets.lock().unwrap_or_else(PoisonError::into_inner));
        let utilisation = *self
            .utilisation
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Observed {
            buckets,
            utilisation,
            metrics,
        }
    }
}

/// Runs every client until the run and its grace are over; `progress` shows how far
/// it is on stderr.
fn drive_load(
    scenario: &Scenario,
    load_rt: &tokio::runtime::Runtime,
    plans: Vec<Vec<ClientPlan>>,
    stats: &[Arc<CohortStats>],
    (target, clock): (SocketAddr, RunClock),
    (progress, label, supervisor): (Progress, &str, &AppSupervisor),
) {
    let (cancel_tx, cancel_rx) = watch::channel(false);
    let ctx = Arc::new(RunContext {
        target,
        clock,
        login_path: scenario.file.app.login_path.clone(),
        cancel: cancel_rx,
    });
    let workers = scenario.file.app.workers;
    let end = clock.start + clock.duration + scenario.file.scenario.grace.0;
    load_rt.block_on(async {
        let mut clients = tokio::task::JoinSet::new();
        for ((cohort, plans), stats) in scenario.cohorts.iter().zip(plans).zip(stats) {
            let cohort = Arc::new(cohort.clone());
            for plan in plans {
                clients.spawn(run_client(ctx.clone(), cohort.clone(), stats.clone(), plan));
            }
        }
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut cancelled = false;
        let mut ticks = 0u64;
        let log_every = LOG_EVERY.as_secs();
        loop {
            tokio::select! {
                joined = clients.join_next() => if joined.is_none() { break },
                _ = tick.tick() => {
                    let line = || progress_line(label, &clock, stats, supervisor, workers);
                    let mut err = std::io::stderr();
                    let _ = match progress {
                        Progress::Line => write!(err, "\r{}   ", line()),
                        Progress::Log if ticks.is_multiple_of(log_every) => writeln!(err, "{}", line()),
                        Progress::Log | Progress::Off => Ok(()),
                    };
                    let _ = err.flush();
                    ticks += 1;
                    if !cancelled && Instant::now() >= end {
                        cancelled = true;
                        let _ = cancel_tx.send(true);
                    }
                }
            }
        }
        if progress == Progress::Line {
            eprintln!();
        }
    });
}

/// Scrapes weir's `/metrics` every `every` of the run (not its grace) for the alert
/// replay; a scrape that fails or takes longer than the interval is skipped, as
/// Prometheus marks a failed scrape.
async fn record_metrics(
    admin: SocketAddr,
    clock: RunClock,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) -> MetricsRecorder {
    let mut recorded = MetricsRecorder::default();
    let mut tick = tokio::time::interval_at(clock.start, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        let at = Instant::now();
        if at > clock.start + clock.duration {
            break;
        }
        let scrape = http_get(admin, "/metrics");
        if let Ok(Ok((200, body))) = tokio::time::timeout(SCRAPE_TIMEOUT, scrape).await {
            recorded.record(at - clock.start, &String::from_utf8_lossy(&body));
        }
    }
    recorded
}

fn lb_name(scenario: &Scenario) -> Option<String> {
    scenario
        .file
        .topology
        .load_balancer
        .map(|LoadBalancer::Nginx| "nginx".to_string())
}

fn runtime(name: &str, threads: usize) -> Result<tokio::runtime::Runtime, RunError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(name)
        .enable_all()
        .build()
        .map_err(RunError::Setup)
}

/// The variant's text with `{{app}}` and `{{dir}}` filled in, an admin API on a free
/// port and the access log in the run's dir unless the text sets them.
pub fn weir_config_text(
    variant: &Variant,
    app: SocketAddr,
    dir: &Path,
    access_log: &Path,
    log_on: bool,
) -> String {
    let mut text = variant
        .config_text
        .replace("{{app}}", &app.to_string())
        .replace("{{dir}}", &dir.display().to_string());
    if !text.contains("[admin]") {
        text.push_str("\n[admin]\naddress = \"127.0.0.1:0\"\n");
    }
    if !text.contains("[access_log]") {
        let target = if log_on {
            access_log.display().to_string()
        } else {
            "off".into()
        };
        text.push_str(&format!("\n[access_log]\ntarget = {target:?}\n"));
    }
    text
}

/// The app and its replacements after autoheal restarts, with counters summed over all.
struct AppSupervisor {
    cfg: AppConfig,
    addr: SocketAddr,
    current: tokio::sync::Mutex<Option<SimApp>>,
    stats: ArcSwap<AppStats>,
    /// Counters of instances already killed.
    past: Mutex<AppSnapshot>,
    restarts: AtomicU64,
    health_checks: AtomicU64,
    health_failures: AtomicU64,
}

impl AppSupervisor {
    fn new(cfg: AppConfig, app: SimApp) -> AppSupervisor {
        let stats = app.stats();
        let mut past = app.snapshot();
        zero(&mut past);
        AppSupervisor {
            cfg,
            addr: app.addr(),
            current: tokio::sync::Mutex::new(Some(app)),
            stats: ArcSwap::new(stats),
            past: Mutex::new(past),
            restarts: AtomicU64::new(0),
            health_checks: AtomicU64::new(0),
            health_failures: AtomicU64::new(0),
        }
    }

    fn snapshot(&self) -> AppSnapshot {
        self.stats.load().snapshot()
    }

    /// The current instance's counters and those of the instances before it, read
    /// under the lock a restart swaps them under: one instance is never in both.
    fn current_and_past(&self) -> (AppSnapshot, AppSnapshot) {
        let past = self.past.lock().unwrap_or_else(PoisonError::into_inner);
        (self.snapshot(), past.clone())
    }

    fn totals(&self) -> UpstreamReport {
        let (now, past) = self.current_and_past();
        UpstreamReport {
            workers: self.cfg.workers,
            max_in_flight: now.max_in_flight.max(past.max_in_flight),
            max_queued: now.max_queued.max(past.max_queued),
            served: now.served + past.served,
            refused: now.refused + past.refused,
            abandoned: now.abandoned + past.abandoned,
            health_checks: self.health_checks.load(Ordering::Relaxed),
            health_failures: self.health_failures.load(Ordering::Relaxed),
            restarts: self.restarts.load(Ordering::Relaxed),
            demand_samples: 0,
            busy_under_demand: 1.0,
        }
    }

    /// Kills the app (cutting every request in it), leaves nothing listening for `down`,
    /// then starts a fresh one on the same address.
    ///
    /// The killed instance's counters stay the current ones until its replacement
    /// runs; then they move to `past` and the new ones become current under one lock,
    /// so a reader never counts an instance twice, even during the `down` time.
    async fn restart(&self, down: Duration) {
        let mut current = self.current.lock().await;
        if let Some(app) = current.take() {
            app.kill().await;
        }
        self.restarts.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(down).await;
        match SimApp::start(self.cfg.clone(), self.addr) {
            Ok(app) => {
                let mut past = self.past.lock().unwrap_or_else(PoisonError::into_inner);
                let s = self.snapshot();
                past.served += s.served;
                past.refused += s.refused;
                past.abandoned += s.abandoned;
                past.max_in_flight = past.max_in_flight.max(s.max_in_flight);
                past.max_queued = past.max_queued.max(s.max_queued);
                self.stats.store(app.stats());
                *current = Some(app);
            }
            Err(e) => tracing::warn!(error = %e, "lab app did not restart"),
        }
    }
}

fn zero(s: &mut AppSnapshot) {
    s.received = 0;
    s.served = 0;
    s.refused = 0;
    s.abandoned = 0;
    s.max_in_flight = 0;
    s.max_queued = 0;
}

#[derive(Debug, Clone, Copy, Default)]
struct UpstreamBucket {
    in_flight: u32,
    queued: u32,
    workers: u32,
    /// Refused so far (all instances), at the last sample in this second.
    refused_total: u64,
    health_failures: u32,
    restart: bool,
}

/// The app's busy share of its slots while demand exceeded capacity (see
/// [`UpstreamReport::busy_under_demand`]).
#[derive(Debug, Clone, Copy, Default)]
struct Utilisation {
    samples: u64,
    busy: f64,
}

impl Utilisation {
    fn share(&self) -> f64 {
        if self.samples == 0 {
            1.0
        } else {
            self.busy / self.samples as f64
        }
    }
}

/// Tells, at each sample, whether demand exceeds the app's capacity: the
/// gateway has turned requests away since the last sample, or requests
/// wait (in weir's admission queues; behind a rival, which has no queue of
/// its own the lab can see, in the app's backlog). Also reads weir's
/// admission limit: the app's slots are its workers or that limit, whichever
/// is lower.
struct DemandProbe {
    /// weir's state; `None` for a rival gateway.
    weir: Option<Arc<weir::runtime::Runtime>>,
    stats: Vec<Arc<CohortStats>>,
    turned_away: u64,
}

impl DemandProbe {
    /// `Some(slots)` when demand exceeds capacity now.
    fn exceeded(&mut self, workers: usize, app_queued: usize) -> Option<usize> {
        let turned_away = self.stats.iter().map(|s| s.turned_away()).sum();
        let fresh = turned_away > self.turned_away;
        self.turned_away = turned_away;
        let Some(weir) = &self.weir else {
            return (fresh || app_queued > 0).then_some(workers.max(1));
        };
        let gateway = weir.gateway.load();
        let queues = gateway.pools.iter().filter_map(|p| p.admission.as_ref());
        let (mut waiting, mut limit) = (0, None::<usize>);
        for q in queues {
            let snap = q.snapshot();
            waiting += snap.queued();
            limit = Some(limit.unwrap_or(0) + snap.limit);
        }
        (fresh || waiting > 0).then(|| limit.map_or(workers, |l| l.min(workers)).max(1))
    }
}

async fn sample(
    sup: Arc<AppSupervisor>,
    clock: RunClock,
    (buckets, utilisation): (Arc<Mutex<Vec<UpstreamBucket>>>, Arc<Mutex<Utilisation>>),
    mut demand: DemandProbe,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let now = Instant::now();
        if now < clock.start {
            continue;
        }
        let (s, past) = sup.current_and_past();
        if now < clock.start + clock.duration
            && let Some(slots) = demand.exceeded(s.workers, s.queued)
        {
            let mut u = utilisation.lock().unwrap_or_else(PoisonError::into_inner);
            u.samples += 1;
            u.busy += (s.in_flight as f64 / slots as f64).min(1.0);
        }
        let refused_total = s.refused + past.refused;
        let mut b = buckets.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(b) = b.get_mut(clock.bucket(now)) {
            b.in_flight = b.in_flight.max(s.in_flight as u32);
            b.queued = b.queued.max(s.queued as u32);
            b.workers = b.workers.max(s.workers as u32);
            b.refused_total = refused_total;
        }
    }
}

/// A container health check: `GET health_path` on the app itself every `interval`, like
/// Docker's; after `failures` in a row, autoheal restarts the app.
async fn health_checks(
    sup: Arc<AppSupervisor>,
    cfg: HealthConfig,
    clock: RunClock,
    buckets: Arc<Mutex<Vec<UpstreamBucket>>>,
    mut stop: watch::Receiver<bool>,
) {
    let path = sup.cfg.health_path.clone();
    let mut tick = tokio::time::interval_at(clock.start + cfg.interval.0, cfg.interval.0);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut in_a_row = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let ok = matches!(
            tokio::time::timeout(cfg.timeout.0, http_get(sup.addr, &path)).await,
            Ok(Ok((200, _)))
        );
        sup.health_checks.fetch_add(1, Ordering::Relaxed);
        if ok {
            in_a_row = 0;
            continue;
        }
        sup.health_failures.fetch_add(1, Ordering::Relaxed);
        in_a_row += 1;
        let bucket = clock.bucket(Instant::now());
        if let Some(b) = buckets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(bucket)
        {
            b.health_failures += 1;
        }
        if cfg.autoheal && in_a_row >= cfg.failures {
            in_a_row = 0;
            if let Some(b) = buckets
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_mut(bucket)
            {
                b.restart = true;
            }
            tokio::select! {
                _ = sup.restart(cfg.restart_time.0) => {}
                _ = stop.changed() => return,
            }
            tick.reset();
        }
    }
}

/// One `GET` on a fresh connection: status and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, Bytes)> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = http::Request::get(path)
        .header("host", "localhost")
        .body(Empty::<Bytes>::new())
        .map_err(std::io::Error::other)?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(std::io::Error::other)?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes();
    Ok((status, body))
}

async fn scrape(admin: SocketAddr) -> String {
    match tokio::time::timeout(Duration::from_secs(5), http_get(admin, "/metrics")).await {
        Ok(Ok((200, body))) => String::from_utf8_lossy(&body).into_owned(),
        _ => String::new(),
    }
}

/// `weir_rejections_total{rule=..}` and `weir_connections_refused_total{reason=..}`.
pub fn rules_from_metrics(text: &str) -> BTreeMap<String, RuleReport> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        for (family, label) in [
            ("weir_rejections_total{", "rule=\""),
            ("weir_connections_refused_total{", "reason=\""),
        ] {
            let Some(rest) = line.strip_prefix(family) else {
                continue;
            };
            let Some(after) = rest.split_once(label).map(|(_, a)| a) else {
                continue;
            };
            let Some((name, _)) = after.split_once('"') else {
                continue;
            };
            let Some(value) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
                continue;
            };
            if value > 0.0 {
                let r: &mut RuleReport = out.entry(name.to_string()).or_default();
                r.count += value as u64;
            }
        }
    }
    out
}

/// Per-rule, per-cohort rejections from weir's access log, and how many of
/// them weir flagged as maybe a person (`collateral`: `verified`, `pass`,
/// `browsing`, the evidence signals), against the lab's ground truth:
/// whether the client belongs to one of the `people` cohorts.
fn count_log_rejections(
    path: &Path,
    truth: &GroundTruth<'_>,
    people: &std::collections::HashSet<&str>,
    rules: &mut BTreeMap<String, RuleReport>,
) {
    let Ok(file) = std::fs::File::open(path) else {
        return;
    };
    for line in std::io::BufReader::new(file).lines().map_while(Result::ok) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let Some(rule) = v.get("rule").and_then(|r| r.as_str()) else {
            continue;
        };
        let client = v
            .get("client")
            .and_then(|c| c.as_str())
            .and_then(|c| c.parse::<IpAddr>().ok());
        let id = v.get("request_id").and_then(|i| i.as_str());
        let cohort = truth.cohort(id, client);
        let flagged = v
            .get("collateral")
            .and_then(|c| c.as_str())
            .and_then(weir::evidence::Collateral::from_name)
            .is_some_and(weir::evidence::Collateral::is_person_evidence);
        let person = people.contains(cohort);
        let r = rules.entry(rule.to_string()).or_default();
        *r.by_cohort.entry(cohort.to_string()).or_default() += 1;
        r.people += u64::from(person);
        r.flagged += u64::from(flagged);
        r.flagged_people += u64::from(flagged && person);
    }
}

/// Whose request an access log line is: the owner of its address, and for an
/// address two cohorts share (crawlers on people's residential addresses),
/// the cohort whose client got the answer with its request id (every answer
/// that was not a page is noted).
struct GroundTruth<'a> {
    by_id: HashMap<String, &'a str>,
    owners: &'a HashMap<IpAddr, String>,
}

impl<'a> GroundTruth<'a> {
    fn of(owners: &'a HashMap<IpAddr, String>, stats: &'a [Arc<CohortStats>]) -> GroundTruth<'a> {
        let mut by_id = HashMap::new();
        for s in stats {
            let ids = s.refused_ids.lock().unwrap_or_else(|p| p.into_inner());
            for id in ids.iter() {
                by_id.insert(id.clone(), s.name.as_str());
            }
        }
        GroundTruth { by_id, owners }
    }

    /// The owner of the address weir logged; for an address two cohorts
    /// share, the cohort whose client got the answer. (An address of no
    /// cohort, a load balancer's, stays unknown: weir did not see the
    /// client, which is what a check on `unknown` asks.)
    fn cohort(&self, request_id: Option<&str>, client: Option<IpAddr>) -> &str {
        let owner = client.and_then(|c| self.owners.get(&c)).map(String::as_str);
        match owner {
            Some(SHARED_ADDRESS) => request_id
                .and_then(|id| self.by_id.get(id).copied())
                .unwrap_or(SHARED_ADDRESS),
            Some(owner) => owner,
            None => super::expect::UNKNOWN_CLIENT,
        }
    }
}

/// Where the run is: the variant, seconds run and left, each cohort's requests
/// and the share served so far, and the app's workers.
fn progress_line(
    label: &str,
    clock: &RunClock,
    stats: &[Arc<CohortStats>],
    sup: &AppSupervisor,
    workers: usize,
) -> String {
    let t = Instant::now()
        .saturating_duration_since(clock.start)
        .as_secs();
    let total = clock.duration.as_secs();
    let left = total.saturating_sub(t);
    let mut line = format!("{label}: {t:>3}/{total}s ({left}s left)");
    for s in stats {
        let (sent, served) = s.progress();
        let pct = if sent == 0 {
            100.0
        } else {
            served as f64 * 100.0 / sent as f64
        };
        line.push_str(&format!("  {} {sent} ({pct:.0}% served)", s.name));
    }
    let snap = sup.snapshot();
    line.push_str(&format!(
        "  app {}/{workers} busy, {} queued",
        snap.in_flight, snap.queued
    ));
    line
}

#[allow(clippy::too_many_arguments)]
fn build_report(
    scenario: &Scenario,
    variant: &Variant,
    load_balancer: Option<String>,
    stats: &[Arc<CohortStats>],
    upstream: UpstreamReport,
    rules: BTreeMap<String, RuleReport>,
    buckets: Vec<UpstreamBucket>,
    clock: RunClock,
) -> VariantReport {
    let mut all_lags: Vec<u32> = Vec::new();
    let mut timeline = Timeline {
        seconds: clock.buckets,
        ..Timeline::default()
    };
    let totals: Vec<_> = stats.iter().map(|s| s.totals()).collect();
    let app_total: u64 = totals.iter().map(|t| t.reached_app).sum();
    let cohorts = (scenario.cohorts.iter().zip(totals))
        .map(|(c, t)| {
            all_lags.extend_from_slice(&t.lags_us);
            timeline.cohorts.insert(c.name.clone(), outcome_series(&t));
            cohort_report(c, &t, app_total)
        })
        .collect();
    upstream_timeline(&mut timeline, &buckets);
    VariantReport {
        name: variant.name.clone(),
        description: variant.description.clone(),
        gateway: variant.gateway,
        load_balancer,
        cohorts,
        upstream,
        rules,
        alerts: None,
        generator: generator_report(all_lags),
        timeline,
    }
}

/// One cohort's outcomes per second of the run, for the outcomes it had.
fn outcome_series(t: &CohortTotals) -> BTreeMap<String, Vec<u32>> {
    let mut series = BTreeMap::new();
    for o in OUTCOMES {
        let v: Vec<u32> = t.timeline.iter().map(|b| b[o as usize]).collect();
        if v.iter().any(|n| *n > 0) {
            series.insert(o.as_str().to_string(), v);
        }
    }
    series
}

/// One cohort's line of the report; `app_total`: requests of every cohort
/// that reached the app.
fn cohort_report(c: &Cohort, t: &CohortTotals, app_total: u64) -> CohortReport {
    CohortReport {
        name: c.name.clone(),
        kind: c.kind,
        clients: c.clients,
        addresses: c.addresses,
        sent: t.sent(),
        outcomes: OUTCOMES
            .iter()
            .map(|o| (o.as_str().to_string(), t.count(*o)))
            .collect(),
        reached_app: t.reached_app,
        reached_app_share: if app_total == 0 {
            0.0
        } else {
            t.reached_app as f64 / app_total as f64
        },
        served_2s: t.served_fast,
        challenges_solved: t.challenges_solved,
        rechallenged: t.rechallenged,
        challenged_p50_ms: quantile_ms(&t.solved_latencies_us, 0.50),
        challenged_p95_ms: quantile_ms(&t.solved_latencies_us, 0.95),
        p50_ms: quantile_ms(&t.latencies_us, 0.50),
        p95_ms: quantile_ms(&t.latencies_us, 0.95),
        p99_ms: quantile_ms(&t.latencies_us, 0.99),
    }
}

/// How late the load generator sent, from every cohort's lags (µs), and
/// whether it was the run's bottleneck.
fn generator_report(mut all_lags: Vec<u32>) -> GeneratorReport {
    all_lags.sort_unstable();
    let late = all_lags
        .iter()
        .filter(|l| **l as u128 > super::cohort::LATE.as_micros())
        .count();
    let late_share = if all_lags.is_empty() {
        0.0
    } else {
        late as f64 / all_lags.len() as f64
    };
    let lag_p99_ms = quantile_ms(&all_lags, 0.99);
    GeneratorReport {
        timed_sends: all_lags.len() as u64,
        lag_p50_ms: quantile_ms(&all_lags, 0.5),
        lag_p99_ms,
        lag_max_ms: all_lags.last().map_or(0.0, |l| *l as f64 / 1000.0),
        late_share,
        bottleneck: lag_p99_ms > 50.0 || late_share > 0.05,
    }
}

/// The app's side of the timeline, one entry per second: in flight,
/// queued, workers, refusals that second, health failures, restarts.
fn upstream_timeline(timeline: &mut Timeline, buckets: &[UpstreamBucket]) {
    let mut prev_refused = 0;
    let mut last_workers = 0;
    for (s, b) in buckets.iter().enumerate() {
        timeline.upstream_in_flight.push(b.in_flight);
        timeline.upstream_queued.push(b.queued);
        // A second with no sample keeps the previous second's pool size.
        last_workers = if b.workers > 0 {
            b.workers
        } else {
            last_workers
        };
        timeline.upstream_workers.push(last_workers);
        let total = b.refused_total.max(prev_refused);
        timeline
            .upstream_refused
            .push((total - prev_refused) as u32);
        prev_refused = total;
        timeline.health_failures.push(b.health_failures);
        if b.restart {
            timeline.restarts.push(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a report taken while autoheal's restart left nothing listening
    /// counted the killed instance twice (nginx-best's app "served" 2,294 requests
    /// for 1,147 in one crawler-flood run).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restart_never_counts_the_killed_instance_twice() {
        let cfg = AppConfig::default();
        let app = SimApp::start(cfg.clone(), "127.0.0.1:0".parse().expect("literal"))
            .expect("app starts");
        let sup = Arc::new(AppSupervisor::new(cfg, app));
        for _ in 0..3 {
            let (status, _) = http_get(sup.addr, "/wiki/Page").await.expect("served");
            assert_eq!(status, 200);
        }
        assert_eq!(sup.totals().served, 3);
        let restart = tokio::spawn({
            let sup = sup.clone();
            async move { sup.restart(Duration::from_secs(1)).await }
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        while sup.restarts.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(sup.totals().served, 3, "while nothing listens");
        restart.await.expect("restart");
        assert_eq!(sup.totals().served, 3, "after the restart");
        http_get(sup.addr, "/wiki/Page").await.expect("the new app");
        assert_eq!(sup.totals().served, 4);
    }

    /// Residential crawlers: a share of their addresses are people's own
    /// (a carrier's NAT pool, people's home networks), which the access
    /// log's ground truth then gives to neither cohort.
    #[test]
    fn crawlers_among_people_send_from_the_peoples_addresses() {
        let text = r#"[scenario]
name = "t"
duration = "3s"

[weir.only]
config = "[[listeners]]\naddress = \"127.0.0.1:0\"\n"

[[cohorts]]
kind = "humans"
name = "carrier"
count = 20
rate = 1.0
networks = [{ share = 1.0, prefixes = 4, len = 24, within = 16 }]

[[cohorts]]
kind = "crawlers"
addresses = 40
rate = 1.0
among = [{ cohort = "carrier", share = 0.25 }]
networks = [{ share = 1.0, prefixes = 30, len = 16 }]
"#;
        let scenario =
            crate::scenario::load_scenario_str(text, None).unwrap_or_else(|e| panic!("{e}"));
        let (plans, owners) = plan_clients(&scenario).expect("planned");
        let people: std::collections::HashSet<Ipv4Addr> = plans[0].iter().map(|p| p.src).collect();
        let crawlers: Vec<Ipv4Addr> = plans[1].iter().map(|p| p.src).collect();
        assert_eq!(crawlers.len(), 40);
        let inside: std::collections::HashSet<Ipv4Addr> = crawlers
            .iter()
            .filter(|a| people.contains(a))
            .copied()
            .collect();
        assert_eq!(inside.len(), 10, "a quarter, each a different person's");
        for a in &inside {
            assert_eq!(owners[&IpAddr::V4(*a)], SHARED_ADDRESS);
        }
        let own = crawlers
            .iter()
            .find(|a| !people.contains(a))
            .expect("own addresses");
        assert_eq!(owners[&IpAddr::V4(*own)], "crawlers");
        let person = people
            .iter()
            .find(|a| !inside.contains(a))
            .expect("a person alone");
        assert_eq!(owners[&IpAddr::V4(*person)], "carrier");
    }

    #[test]
    fn rules_come_from_both_metric_families() {
        let text = "# HELP x\nweir_rejections_total{rule=\"client_in_flight\"} 12\n\
                    weir_rejections_total{rule=\"no_route\"} 0\n\
                    weir_connections_refused_total{reason=\"per_ip_cap\"} 3\n\
                    weir_requests_total{class=\"x\",status=\"200\",decision=\"admit\"} 99\n";
        let rules = rules_from_metrics(text);
        let counts: Vec<(&str, u64)> = rules.iter().map(|(k, v)| (k.as_str(), v.count)).collect();
        assert_eq!(counts, vec![("client_in_flight", 12), ("per_ip_cap", 3)]);
    }

    #[test]
    fn weir_config_gets_app_admin_and_log() {
        let v = Variant {
            name: "x".into(),
            description: String::new(),
            gateway: GatewayKind::Weir,
            config_text: "[pools.app]\nservers = [\"{{app}}\"]\n".into(),
            config_path: None,
            instances: 1,
        };
        let app: SocketAddr = "127.0.0.1:8080".parse().expect("literal");
        let text = weir_config_text(
            &v,
            app,
            Path::new("/tmp/d"),
            Path::new("/tmp/d/a.log"),
            true,
        );
        assert!(text.contains("servers = [\"127.0.0.1:8080\"]"), "{text}");
        assert!(
            text.contains("[admin]\naddress = \"127.0.0.1:0\""),
            "{text}"
        );
        assert!(text.contains("target = \"/tmp/d/a.log\""), "{text}");
        let off = weir_config_text(
            &v,
            app,
            Path::new("/tmp/d"),
            Path::new("/tmp/d/a.log"),
            false,
        );
        assert!(off.contains("target = \"off\""), "{off}");
    }
}
