//! What one running weir process shares across all its connections: the
//! current [`Gateway`] (swapped atomically on reload), metrics, the connection
//! tracker, per-client in-flight counts and the access log.
//!
//! Reload lives here: validate, build, swap; an invalid file is refused with
//! its reasons and the running gateway stays.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::config::{ConfigErrors, Env, LoadedConfig, load_file};
use crate::edge::ConnTracker;
use crate::edge::inflight::ClientInFlight;
use crate::gateway::Gateway;
use crate::identity::PeerAddr;
use crate::identity::dominance::DominantPeer;
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use crate::identity::ClientAddr;
use crate::observe::metrics::{CollateralLabels, ResultLabels, RuleLabels};
use crate::observe::{AccessLog, Metrics};
use crate::policy::rules::RuleRejection;
use weir_limiter::shared::{SharedLimiter, SharedStats};
use weir_limiter::{MonoTime, ShardedStore, StoreConfig};

/// Process-wide state.
pub struct Runtime {
    pub gateway: ArcSwap<Gateway>,
    pub metrics: Arc<Metrics>,
    pub tracker: Arc<ConnTracker>,
    pub client_in_flight: Arc<ClientInFlight>,
    pub access_log: AccessLog,
    pub started: Instant,
    /// This process's generation id, written into snapshots.
    pub generation: u64,
    config_path: Option<PathBuf>,
    env: Box<dyn Env + Send + Sync>,
    reload_lock: Mutex<()>,
    /// Rate-limits warning logs: at most one per kind per interval.
    last_warning_ms: [AtomicU64; 3],
    /// Recent request rate per client address, for the "low-rate before
    /// rejection" collateral signal.
    activity: ShardedStore,
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
    /// Challenge pressure state per pool (hysteresis), kept across reloads.
    pressure: Mutex<HashMap<Arc<str>, crate::challenge::pressure::Pressure>>,
    /// Distinct clients rejected per rule in the current minute.
    rejected_clients: Mutex<HashMap<Arc<str>, MinuteClients>>,
}

/// The minute (since start) and the distinct addresses rejected in it.
type MinuteClients = (u64, HashSet<IpAddr>);

/// Distinct rejected clients remembered per rule per minute; past it the
/// gauge saturates (memory stays bounded under a spray).
const MAX_REJECTED_CLIENTS: usize = 100_000;

/// Addresses tracked for the low-rate signal (about 25 bytes each).
const ACTIVITY_KEYS: usize = 200_000;

/// How often a repeated warning is logged (it is always counted).
const WARN_INTERVAL: Duration = Duration::from_secs(60);

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
            last_warning_ms: Default::default(),
            activity: ShardedStore::new(StoreConfig::with_max_keys(ACTIVITY_KEYS))
                .expect("a constant, non-zero store size is valid"),
            rejected_clients: Mutex::new(HashMap::new()),
            pressure: Mutex::new(HashMap::new()),
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
        let next = match Gateway::build(loaded, Some(&current), version) {
            Ok(g) => g,
            Err(e) => return Err(self.reload_failed(e)),
        };
        let mut restart_needed = Vec::new();
        if next.loaded.config.listeners != current.loaded.config.listeners {
            restart_needed.push("listeners");
        }
        if next.loaded.config.admin != current.loaded.config.admin {
            restart_needed.push("admin");
        }
        if next.loaded.config.access_log != current.loaded.config.access_log {
            restart_needed.push("access_log");
        }
        if next.loaded.config.process.workers != current.loaded.config.process.workers {
            restart_needed.push("process.workers");
        }
        if next.loaded.config.state.redis_url != current.loaded.config.state.redis_url
            || next.loaded.config.state.redis_prefix != current.loaded.config.state.redis_prefix
        {
            restart_needed.push("state.redis_url");
        }
        if let Some(shared) = self.shared.get() {
            shared.set_rules(next.rule_stores.clone());
        }
        self.tracker.set_limits(next.edge.conn);
        self.gateway.store(Arc::new(next));
        self.metrics.config_version.set(version as i64);
        self.metrics
            .reloads
            .get_or_create(&ResultLabels { result: "ok" })
            .inc();
        tracing::info!(version, ?restart_needed, "configuration reloaded");
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
        e
    }

    /// Counts a forwarding-header warning and logs it at most once a minute.
    pub fn forwarding_warning(&self, kind: &'static str, peer: PeerAddr) {
        self.metrics.forwarding_warning(kind);
        let slot = if kind == "untrusted_peer" { 0 } else { 1 };
        if self.should_log(slot) {
            tracing::warn!(
                kind,
                peer = %peer.0.ip(),
                "forwarding headers ignored: the peer is not in identity.trusted_proxies \
                 (if weir runs behind a load balancer, add its addresses there)"
            );
        }
    }

    /// Reports a peer that carries most traffic while no proxy is trusted.
    pub fn dominant_peer(&self, d: DominantPeer) {
        self.metrics.forwarding_warning("dominant_peer");
        self.metrics.dominant_peer_share.set(d.share);
        if self.should_log(2) {
            tracing::warn!(
                peer = %d.peer,
                share = d.share,
                requests = d.requests,
                "one peer address sends most requests and no trusted proxy is configured: \
                 weir may be behind a load balancer and see every client as one address"
            );
        }
    }

    /// Records a challenge event in the metrics.
    pub fn challenge_event(&self, e: &crate::challenge::ChallengeEvent) {
        let (event, reason) = e.labels();
        self.metrics
            .challenge_events
            .get_or_create(&crate::observe::metrics::ChallengeLabels { event, reason })
            .inc();
        if let crate::challenge::ChallengeEvent::Solved { time_to_solve, .. } = e {
            self.metrics
                .challenge_solve
                .observe(time_to_solve.as_secs_f64());
        }
    }

    /// Whether `pool` is under pressure (the admission queue's depth and
    /// oldest wait, through the challenge's hysteresis), and the difficulty
    /// to ask for now.
    pub fn challenge_pressure(
        &self,
        pool: &crate::upstream::Pool,
        base: u8,
        fresh: &crate::challenge::pressure::Pressure,
    ) -> (bool, u8) {
        let (depth, wait) = pool_pressure(pool);
        let mut map = self.pressure.lock().unwrap_or_else(|e| e.into_inner());
        let p = map
            .entry(pool.name.clone())
            .or_insert_with(|| fresh.clone());
        let engaged = p.observe(std::time::Instant::now(), depth, wait);
        self.metrics
            .challenge_engaged
            .get_or_create(&crate::observe::metrics::PoolLabels {
                pool: pool.name.clone(),
            })
            .set(i64::from(engaged));
        (engaged, p.difficulty(base))
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
        m.redis_fallback_active.set(i64::from(now.fallback_active));
        *last = now;
    }

    /// Counts a request of `client` for the low-rate signal; true when the
    /// client is still under `rules.low_rate_per_minute`.
    pub fn record_activity(&self, client: ClientAddr, gw: &Gateway, now: MonoTime) -> bool {
        let key = crate::policy::rules::activity_key(client);
        self.activity.check(key, &gw.low_rate, now, 1).is_allowed()
    }

    /// Records a rule rejection (enforced or shadow) for the metrics that
    /// tell whether a rule is hitting people.
    pub fn rule_rejected(
        &self,
        r: &RuleRejection,
        client: ClientAddr,
        collateral: Option<&'static str>,
        enforced: bool,
    ) {
        if let Some(signal) = collateral {
            self.metrics
                .rule_collateral
                .get_or_create(&CollateralLabels {
                    rule: r.rule.clone(),
                    signal,
                    enforced: if enforced { "yes" } else { "shadow" },
                })
                .inc();
        }
        let minute = self.started.elapsed().as_secs() / 60;
        let mut map = self
            .rejected_clients
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let entry = map
            .entry(r.rule.clone())
            .or_insert_with(|| (minute, HashSet::new()));
        if entry.0 != minute {
            *entry = (minute, HashSet::new());
        }
        if entry.1.len() < MAX_REJECTED_CLIENTS {
            entry.1.insert(client.ip());
        }
        let distinct = entry.1.len() as i64;
        drop(map);
        self.metrics
            .rule_rejected_clients
            .get_or_create(&RuleLabels {
                rule: r.rule.clone(),
            })
            .set(distinct);
    }

    fn should_log(&self, slot: usize) -> bool {
        let now = self.started.elapsed().as_millis() as u64 + 1;
        let last = self.last_warning_ms[slot].load(Ordering::Relaxed);
        if last != 0 && now - last < WARN_INTERVAL.as_millis() as u64 {
            return false;
        }
        self.last_warning_ms[slot]
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }
}

/// A pool's admission pressure: requests waiting in its queue (the wait
/// threshold is not fed yet: depth alone engages). Without an admission
/// queue a pool never reports pressure.
fn pool_pressure(pool: &crate::upstream::Pool) -> (usize, Duration) {
    match &pool.admission {
        Some(q) => (q.snapshot().queued(), Duration::ZERO),
        None => (0, Duration::ZERO),
    }
}
