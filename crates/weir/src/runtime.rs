//! What one running weir process shares across all its connections: the
//! current [`Gateway`] (swapped atomically on reload), metrics and the access
//! log, and the state each stage keeps across requests (and reloads), each
//! of a type of that stage's own: the edge's connection tracker and
//! per-client in-flight counts, the rules' activity table and rejected-client
//! tallies, the challenge's pressure per pool, the shared limiter.
//!
//! Reload lives here: validate, build, swap; an invalid file is refused with
//! its reasons and the running gateway stays.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use weir_limiter::shared::{SharedLimiter, SharedStats};

use crate::challenge::pressure::PressureTable;
use crate::config::{Config, ConfigErrors, Env, LoadedConfig, load_file};
use crate::edge::ConnTracker;
use crate::edge::inflight::ClientInFlight;
use crate::gateway::Gateway;
use crate::observe::metrics::ResultLabels;
use crate::observe::tallies::{RejectedClients, Warnings};
use crate::observe::{AccessLog, Metrics};
use crate::policy::rules::Activity;

/// Process-wide state.
pub struct Runtime {
    pub gateway: ArcSwap<Gateway>,
    pub metrics: Arc<Metrics>,
    pub access_log: AccessLog,
    /// The edge's: open connections, their caps and timeouts.
    pub tracker: Arc<ConnTracker>,
    /// The edge's: requests in flight per client address.
    pub client_in_flight: Arc<ClientInFlight>,
    /// The rules': recent requests per address (the `low_rate` signal).
    pub activity: Activity,
    /// The rules': distinct clients each rule refused this minute.
    pub rejected_clients: RejectedClients,
    /// The live page's last 15 minutes, second by second.
    pub timeline: crate::observe::timeline::Timeline,
    /// The challenge's: each pool's pressure (kept across reloads).
    pub pressure: PressureTable,
    /// The challenge's: pages and passes each network drew (kept across
    /// reloads).
    pub challenge_budget: crate::challenge::ChallengeBudget,
    /// Admission's: which addresses browse like people, across every pool
    /// (kept across reloads).
    pub browsing: crate::admission::BrowsingEvidence,
    /// The drain's: how long requests took lately (how long a stop may
    /// keep accepting).
    pub spans: crate::lifecycle::drain_plan::RequestSpans,
    /// Warnings logged at most once a minute per kind.
    pub warnings: Warnings,
    /// The last reload's outcome (the live page shows it).
    pub last_reload: Mutex<Option<ReloadRecord>>,
    pub started: Instant,
    /// This process's generation id, written into snapshots.
    pub generation: u64,
    config_path: Option<PathBuf>,
    env: Box<dyn Env + Send + Sync>,
    reload_lock: Mutex<()>,
    /// Start-up readiness: the warm-up gate (`/readyz`) and how limiter
    /// state came back.
    pub readiness: Arc<crate::lifecycle::warmup::Readiness>,
    /// Rate limits shared through Redis, when configured (set once at start).
    shared: std::sync::OnceLock<Arc<SharedLimiter>>,
    /// Shared-limiter counters already exported (deltas go to the metrics).
    shared_exported: Mutex<SharedStats>,
    /// Set when the expected limiter state was not restored and the
    /// configuration says not to report ready.
    pub state_missing: std::sync::atomic::AtomicBool,
}

/// Addresses tracked for the low-rate signal (about 25 bytes each).
const ACTIVITY_KEYS: usize = 200_000;

/// How often a repeated warning is logged (it is always counted).
const WARN_INTERVAL: Duration = Duration::from_secs(60);

/// What the last reload did, for the live page.
#[derive(Debug, Clone)]
pub struct ReloadRecord {
    pub at: std::time::SystemTime,
    /// Applied, or refused (the running configuration stayed).
    pub applied: bool,
    /// The configuration version serving after it.
    pub version: u64,
    /// Why it was refused.
    pub errors: Vec<String>,
}

/// The outcome of a reload.
#[derive(Debug)]
pub enum ReloadOutcome {
    /// The new configuration runs; `restart_needed` lists settings that only
    /// take effect after a restart.
    Applied {
        version: u64,
        restart_needed: Vec<&'static str>,
    },
    /// The file did not change.
    Unchanged,
}

impl Runtime {
    pub fn new(
        gateway: Gateway,
        metrics: Arc<Metrics>,
        access_log: AccessLog,
        config_path: Option<PathBuf>,
        env: Box<dyn Env + Send + Sync>,
    ) -> Arc<Runtime> {
        let tracker = ConnTracker::new(gateway.edge.conn, metrics.clone());
        metrics.config_version.set(gateway.version as i64);
        crate::observe::process_log::configure(gateway.loaded.config.log.format);
        for pool in &gateway.pools {
            metrics.pool_known(&pool.name);
        }
        Arc::new(Runtime {
            gateway: ArcSwap::from_pointee(gateway),
            metrics,
            tracker,
            client_in_flight: Arc::new(ClientInFlight::default()),
            access_log,
            started: Instant::now(),
            generation: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
            config_path,
            env,
            reload_lock: Mutex::new(()),
            activity: Activity::new(ACTIVITY_KEYS),
            rejected_clients: RejectedClients::default(),
            timeline: Default::default(),
            last_reload: Mutex::new(None),
            pressure: PressureTable::default(),
            challenge_budget: Default::default(),
            browsing: crate::admission::BrowsingEvidence::new(),
            spans: Default::default(),
            warnings: Warnings::new(WARN_INTERVAL),
            state_missing: std::sync::atomic::AtomicBool::new(false),
            shared: std::sync::OnceLock::new(),
            readiness: Arc::default(),
            shared_exported: Mutex::new(SharedStats::default()),
        })
    }

    /// Re-reads the config file and applies it. `force` applies it even when
    /// the file did not change.
    pub fn reload(&self, force: bool) -> Result<ReloadOutcome, ConfigErrors> {
        let Some(path) = self.config_path.clone() else {
            return Ok(ReloadOutcome::Unchanged);
        };
        let _one_at_a_time = self.reload_lock.lock().unwrap_or_else(|e| e.into_inner());
        let loaded = match load_file(&path, &*self.env) {
            Ok(l) => l,
            Err(e) => return Err(self.reload_failed(e)),
        };
        if !force && loaded.digest == self.gateway.load().loaded.digest {
            return Ok(ReloadOutcome::Unchanged);
        }
        self.apply(loaded)
    }

    /// Builds and swaps in a parsed configuration.
    pub fn apply(&self, loaded: LoadedConfig) -> Result<ReloadOutcome, ConfigErrors> {
        let current = self.gateway.load_full();
        let version = current.version + 1;
        let (host, _) = crate::gateway::process::host(&loaded, true);
        if !host.is_empty() {
            return Err(self.reload_failed(ConfigErrors(host)));
        }
        crate::challenge::keyfile::prepare(&loaded.config);
        let next = match Gateway::build(loaded, Some(&current), version) {
            Ok(g) => g,
            Err(e) => return Err(self.reload_failed(e)),
        };
        for w in &next.warnings {
            tracing::warn!("configuration: {w}");
        }
        let restart_needed = restart_needed(&next.loaded.config, &current.loaded.config);
        if let Some(shared) = self.shared.get() {
            shared.set_rules(next.rule_stores.clone());
        }
        self.tracker.set_limits(next.edge.conn);
        for pool in &next.pools {
            self.metrics.pool_known(&pool.name);
        }
        crate::observe::process_log::configure(next.loaded.config.log.format);
        self.gateway.store(Arc::new(next));
        self.metrics.config_version.set(version as i64);
        self.metrics
            .reloads
            .get_or_create(&ResultLabels { result: "ok" })
            .inc();
        tracing::info!(version, ?restart_needed, "configuration reloaded");
        self.note_reload(ReloadRecord {
            at: std::time::SystemTime::now(),
            applied: true,
            version,
            errors: Vec::new(),
        });
        Ok(ReloadOutcome::Applied {
            version,
            restart_needed,
        })
    }

    fn reload_failed(&self, e: ConfigErrors) -> ConfigErrors {
        self.metrics
            .reloads
            .get_or_create(&ResultLabels { result: "invalid" })
            .inc();
        tracing::error!(errors = %e, "configuration reload refused; the running configuration stays");
        self.note_reload(ReloadRecord {
            at: std::time::SystemTime::now(),
            applied: false,
            version: self.gateway.load().version,
            errors: e.0.iter().map(|e| e.to_string()).collect(),
        });
        e
    }

    fn note_reload(&self, record: ReloadRecord) {
        *self.last_reload.lock().unwrap_or_else(|e| e.into_inner()) = Some(record);
    }

    /// The shared (Redis) limiter, if configured.
    pub fn shared_limiter(&self) -> Option<&SharedLimiter> {
        self.shared.get().map(|s| &**s)
    }

    /// The shared limiter, if configured, for a task of its own.
    pub fn shared_limiter_handle(&self) -> Option<Arc<SharedLimiter>> {
        self.shared.get().cloned()
    }

    /// Installs the shared limiter (once, at start).
    pub fn set_shared_limiter(&self, shared: Arc<SharedLimiter>) {
        let _ = self.shared.set(shared);
    }

    /// Copies the shared limiter's counters into the metrics (before a scrape).
    pub fn export_shared_stats(&self) {
        let Some(shared) = self.shared.get() else {
            return;
        };
        let now = shared.stats();
        let mut last = self
            .shared_exported
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let m = &self.metrics;
        let delta = |a: u64, b: u64| a.saturating_sub(b);
        m.redis_round_trips
            .get_or_create(&ResultLabels { result: "ok" })
            .inc_by(delta(now.redis_ok, last.redis_ok));
        m.redis_round_trips
            .get_or_create(&ResultLabels { result: "error" })
            .inc_by(delta(now.redis_errors, last.redis_errors));
        m.redis_fallback_decisions
            .inc_by(delta(now.fallback_decisions, last.fallback_decisions));
        m.redis_outages.inc_by(delta(now.outages, last.outages));
        m.redis_lease_decisions
            .inc_by(delta(now.lease_decisions, last.lease_decisions));
        m.redis_lease_tokens
            .get_or_create(&ResultLabels { result: "leased" })
            .inc_by(delta(now.leased_tokens, last.leased_tokens));
        m.redis_lease_tokens
            .get_or_create(&ResultLabels { result: "returned" })
            .inc_by(delta(now.returned_tokens, last.returned_tokens));
        m.redis_fallback_active.set(i64::from(now.fallback_active));
        *last = now;
    }
}

/// The changed settings a reload cannot apply, from the `current`
/// configuration to the `next`: they take effect at the next restart.
fn restart_needed(next: &Config, current: &Config) -> Vec<&'static str> {
    let mut restart_needed = Vec::new();
    if next.listeners != current.listeners {
        restart_needed.push("listeners");
    }
    if next.admin.listener() != current.admin.listener() {
        restart_needed.push("admin");
    }
    if next.access_log != current.access_log {
        restart_needed.push("access_log");
    }
    if next.process.workers != current.process.workers {
        restart_needed.push("process.workers");
    }
    if next.state.redis_differs(&current.state) {
        restart_needed.push("state.redis_url");
    }
    restart_needed
}
