//! A pool of upstream servers, the balancing among them, and the per-pool
//! and per-server state that outlives one request: the admission queue,
//! server health, slow start and the retry budget.
//!
//! This module decides *which* server gets a request (skipping dead servers,
//! weighting slow ones down, capping servers in slow start, panic mode when
//! all are dead). It does not send anything (`forward` does), run health
//! checks (`checks` does) or decide whether a request may wait (`admission`).

use std::net::{SocketAddr, ToSocketAddrs};
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use http::uri::Authority;

use super::health::{
    CheckResult, DeadCause, HealthConfig, HealthState, PoolMode, PoolSignal, RequestOutcome,
    ServerHealth, Transition,
};
use super::retry_budget::{RetryBudget, RetryBudgetConfig};
use super::slow_start::{Completion, SlowStart, SlowStartConfig};
use crate::admission::{
    AdmissionQueue, GradientConfig, Lane, LaneSpec, Lanes, LimitConfig, QueueConfig, Share,
};
use crate::config::{AdmissionSettings, Balance, HealthCheckSettings, PoolConfig};
use weir_http::connections::{ConnSettings, ServerConnections};

/// One server of a pool.
#[derive(Debug)]
pub struct Server {
    pub addr: SocketAddr,
    pub authority: Authority,
    /// Idle keep-alive connections, kept across reloads with the server.
    pub connections: Arc<ServerConnections>,
    in_flight: AtomicU32,
    state: Mutex<ServerState>,
}

/// What a server's health and ramp are, kept across reloads with the server.
#[derive(Debug)]
struct ServerState {
    health: ServerHealth,
    slow_start: Option<SlowStart>,
    /// A check of this server is running (never two at once).
    checking: bool,
    next_check: Instant,
}

/// A server's health as `/status` shows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServerView {
    pub state: HealthState,
    pub dead_cause: Option<DeadCause>,
    pub latency: Option<Duration>,
    /// The slow-start cap in force, if ramping.
    pub slow_start_cap: Option<u32>,
}

impl Server {
    fn new(addr: SocketAddr, authority: Authority, health: HealthConfig, now: Instant) -> Server {
        Server {
            addr,
            authority,
            connections: Arc::default(),
            in_flight: AtomicU32::new(0),
            state: Mutex::new(ServerState {
                health: ServerHealth::new(health, now),
                slow_start: None,
                checking: false,
                next_check: now,
            }),
        }
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, ServerState> {
        // Health counters stay usable after a panic elsewhere.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn health(&self) -> HealthState {
        self.lock().health.state()
    }

    pub fn view(&self, now: Instant) -> ServerView {
        let st = self.lock();
        ServerView {
            state: st.health.state(),
            dead_cause: st.health.dead_cause(),
            latency: st.health.latency(),
            slow_start_cap: st.slow_start.as_ref().and_then(|s| s.max_in_flight(now)),
        }
    }

    fn slow_start_cap(&self, now: Instant) -> Option<u32> {
        self.lock()
            .slow_start
            .as_ref()
            .and_then(|s| s.max_in_flight(now))
    }
}

/// Holds one in-flight slot on a server; dropping it releases the slot.
#[derive(Debug)]
pub struct ServerGuard {
    pub server: Arc<Server>,
}

impl Drop for ServerGuard {
    fn drop(&mut self) {
        self.server.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Why no server was picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoServer {
    /// The pool has no server left to try (all excluded).
    Exhausted,
    /// Every server is dead and the request is not an idempotent read:
    /// it must not land on a server that may be mid-crash.
    AllDead,
}

/// Active check settings of a pool.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckSettings {
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
}

/// An upstream pool: its servers, balancing state and connection pool.
pub struct Pool {
    pub name: Arc<str>,
    pub servers: Vec<Arc<Server>>,
    pub balance: Balance,
    pub response_timeout: Duration,
    /// How connections to its servers are opened and kept.
    pub conn: ConnSettings,
    /// Its per-request metrics, resolved at first use.
    pub metrics: std::sync::OnceLock<crate::observe::metrics::PoolHandles>,
    /// The definition this pool was built from: a reload that leaves it
    /// unchanged keeps this pool (and its warm connections).
    pub definition: PoolConfig,
    /// The admission queue: every pool's, unless `admission.enabled = false`.
    pub admission: Option<AdmissionQueue>,
    /// Active checks, with `[pools.NAME.health]`; without them servers are
    /// never marked slow or dead.
    pub checks: Option<CheckSettings>,
    slow_start: Option<SlowStartConfig>,
    retry_budget: Mutex<RetryBudget>,
    /// When the admission queue last shed a request (for the busy signal).
    last_shed: Mutex<Option<Instant>>,
    next: AtomicUsize,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("name", &self.name)
            .field("servers", &self.servers)
            .finish()
    }
}

/// Why a pool definition could not be built.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("server `{0}` is not host:port")]
    BadServer(String),
    #[error("server `{0}` does not resolve: {1}")]
    Unresolvable(String, String),
    #[error("a pool needs at least one server")]
    Empty,
    #[error("{} = {value} must be at least {min}", key.join("."))]
    TooSmall {
        key: &'static [&'static str],
        value: u64,
        min: u64,
    },
    #[error(
        "max_in_flight = {max_in_flight} with workers = {workers} leaves no worker for health checks; use at most {}",
        workers - 1
    )]
    NoWorkerForChecks {
        max_in_flight: usize,
        workers: usize,
    },
    #[error("health.path `{0}` must start with '/'")]
    HealthPath(String),
    #[error("{0}")]
    RetryBudget(#[from] super::retry_budget::RetryBudgetError),
    #[error("{0}")]
    Admission(#[from] crate::admission::QueueConfigError),
    #[error("admission.{key} = {value} is not a share: write 0 ..= 1 (0.1 = a tenth of the app)")]
    Share { key: &'static str, value: f64 },
}

impl PoolError {
    /// The key under `[pools.NAME]` the error is about; `None` for servers.
    pub fn key(&self) -> Option<&'static [&'static str]> {
        match self {
            PoolError::BadServer(_) | PoolError::Unresolvable(..) | PoolError::Empty => None,
            PoolError::TooSmall { key, .. } => Some(key),
            PoolError::NoWorkerForChecks { .. } => Some(&["admission", "max_in_flight"]),
            PoolError::HealthPath(_) => Some(&["health", "path"]),
            PoolError::RetryBudget(_) => Some(&["retry_budget"]),
            PoolError::Admission(_) => Some(&["admission"]),
            PoolError::Share { key, .. } => Some(match *key {
                "anonymous_share" => &["admission", "anonymous_share"],
                "newcomers_share" => &["admission", "newcomers_share"],
                "pass_share" => &["admission", "pass_share"],
                _ => &["admission", "bots_share"],
            }),
        }
    }
}

/// Slots kept beyond traffic for health checks when `workers` is known.
const HEALTH_RESERVE: usize = 1;

/// How long after a shed a pool still reports itself busy.
const BUSY_AFTER_SHED: Duration = Duration::from_secs(10);

/// A candidate server as its health and slow start stood when a request
/// looked for one.
struct Seen<'a> {
    server: &'a Arc<Server>,
    state: HealthState,
    cause: Option<DeadCause>,
    /// Its slow-start cap on requests in flight, while ramping up.
    cap: Option<u32>,
}

impl<'a> Seen<'a> {
    /// Reads `server`'s health and slow-start cap at `now`.
    fn of(server: &'a Arc<Server>, now: Instant) -> Seen<'a> {
        let st = server.lock();
        Seen {
            server,
            state: st.health.state(),
            cause: st.health.dead_cause(),
            cap: st.slow_start.as_ref().and_then(|s| s.max_in_flight(now)),
        }
    }
}

impl Pool {
    /// Builds a pool; server names are resolved now, once. Servers that
    /// `previous` (the pool of the same name before a reload) already had
    /// keep their health, ramp and in-flight count; new ones slow-start.
    pub fn build(
        name: &str,
        def: &PoolConfig,
        previous: Option<&Pool>,
    ) -> Result<Pool, Vec<(usize, PoolError)>> {
        let now = Instant::now();
        let mut errors = Vec::new();
        if def.servers.is_empty() {
            errors.push((0, PoolError::Empty));
        }
        let health_config = def.health.as_ref().map(health_config).unwrap_or_default();
        if let Some(h) = &def.health {
            check_health(h, &mut errors);
        }
        // A pool without `[pools.NAME.admission]` gets the defaults: the
        // limit learned from latency, so an unconfigured weir already keeps
        // a flooded app within what it serves.
        let settings = def.admission.clone().unwrap_or_default();
        let admission = admission_queue(def, &settings, previous, &mut errors);
        let retry_budget = build_retry_budget(def, now, &mut errors);
        let slow_start = slow_start_config(def, &settings, admission.as_ref());
        let servers = build_servers(
            def,
            previous,
            &health_config,
            slow_start.as_ref(),
            now,
            &mut errors,
        );
        let Some(retry_budget) = retry_budget else {
            return Err(errors);
        };
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Pool {
            name: Arc::from(name),
            servers,
            balance: def.balance,
            response_timeout: def.response_timeout.0,
            conn: ConnSettings {
                connect_timeout: def.connect_timeout.0,
                response_timeout: def.response_timeout.0,
                idle_timeout: def.idle_timeout.0,
                max_idle: def.max_idle_per_server,
            },
            metrics: std::sync::OnceLock::new(),
            definition: def.clone(),
            admission,
            checks: def.health.as_ref().map(|h| CheckSettings {
                path: h.path.clone(),
                interval: h.interval.0,
                timeout: h.timeout.0,
            }),
            slow_start,
            retry_budget: Mutex::new(retry_budget),
            last_shed: Mutex::new(None),
            next: AtomicUsize::new(0),
        })
    }

    /// Picks a server, skipping `exclude` (a server that just failed to
    /// connect). With health checks: dead servers are skipped, slow ones
    /// get a quarter of a healthy one's share, servers in slow start are
    /// not given more than their cap; when every server is dead, idempotent
    /// reads still go to the one most likely to answer (panic mode).
    pub fn pick(
        &self,
        exclude: Option<&Arc<Server>>,
        idempotent: bool,
        now: Instant,
    ) -> Result<ServerGuard, NoServer> {
        let n = self.servers.len();
        if n == 0 {
            return Err(NoServer::Exhausted);
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let order = (0..n)
            .map(|i| &self.servers[(start + i) % n])
            .filter(|s| exclude.is_none_or(|e| !Arc::ptr_eq(e, s)));
        let chosen = if self.checks.is_none() && self.slow_start.is_none() {
            match self.balance {
                Balance::RoundRobin => order.into_iter().next(),
                // Ties go to the round-robin order, so an idle pool still spreads.
                Balance::LeastInFlight => order.min_by_key(|s| s.in_flight()),
            }
        } else {
            self.pick_by_health(order.collect(), idempotent, now)?
        };
        let chosen = chosen.ok_or(NoServer::Exhausted)?;
        chosen.in_flight.fetch_add(1, Ordering::Relaxed);
        Ok(ServerGuard {
            server: chosen.clone(),
        })
    }

    /// Picks among the `candidates` by health: the servers the pool's mode
    /// admits, under their slow-start cap if any is, by the pool's balance
    /// (in panic, the least bad). `AllDead` when it admits none.
    fn pick_by_health<'a>(
        &self,
        candidates: Vec<&'a Arc<Server>>,
        idempotent: bool,
        now: Instant,
    ) -> Result<Option<&'a Arc<Server>>, NoServer> {
        let seen: Vec<Seen<'a>> = candidates
            .into_iter()
            .map(|server| Seen::of(server, now))
            .collect();
        if seen.is_empty() {
            return Ok(None);
        }
        let mode = PoolMode::of(self.servers.iter().map(|s| s.health()));
        let admitted: Vec<&Seen<'a>> = seen
            .iter()
            .filter(|s| mode.admits(s.state, idempotent))
            .collect();
        if admitted.is_empty() {
            return Err(NoServer::AllDead);
        }
        let under_cap = |s: &&&Seen<'a>| s.cap.is_none_or(|c| s.server.in_flight() < c);
        let room: Vec<&&Seen<'a>> = admitted.iter().filter(under_cap).collect();
        // All servers at their ramp cap: the admission queue normally prevents
        // this; if it happens, the least loaded server still gets it.
        let pool: Vec<&&Seen<'a>> = if room.is_empty() {
            admitted.iter().collect()
        } else {
            room
        };
        let best = match (mode, self.balance) {
            (PoolMode::Panic, _) => pool
                .into_iter()
                .min_by_key(|s| (PoolMode::panic_preference(s.cause), s.server.in_flight())),
            (_, Balance::RoundRobin) => pool
                .iter()
                .find(|s| s.state == HealthState::Healthy)
                .or_else(|| pool.first())
                .copied(),
            (_, Balance::LeastInFlight) => pool.into_iter().min_by_key(|s| {
                // Load per unit of weight: a slow server (weight 1) takes a
                // request when it has a quarter of a healthy one's (weight 4).
                let w = u64::from(mode.weight(s.state, idempotent).max(1));
                (u64::from(s.server.in_flight()) + 1) * 16 / w
            }),
        };
        Ok(best.map(|s| s.server))
    }

    /// Requests in flight to all servers of this pool.
    pub fn in_flight(&self) -> u32 {
        self.servers.iter().map(|s| s.in_flight()).sum()
    }

    /// Records how a real request went on `server` (passive health and
    /// slow start). `others` = the server's other requests in flight.
    pub fn observe_request(
        &self,
        server: &Server,
        now: Instant,
        outcome: RequestOutcome,
        others: u32,
    ) -> Option<Transition> {
        let mut st = server.lock();
        if let Some(ss) = st.slow_start.as_mut() {
            let (latency, ok) = match outcome {
                RequestOutcome::Answered { latency } => (latency, true),
                _ => (Duration::ZERO, false),
            };
            ss.on_completion(
                now,
                Completion {
                    latency,
                    ok,
                    in_flight: others,
                },
            );
            if ss.is_done() {
                st.slow_start = None;
            }
        }
        // Without active checks nothing would bring a dead server back.
        self.checks.as_ref()?;
        let t = st.health.observe_request(now, outcome);
        self.on_transition(&mut st, server, t, now)
    }

    /// Records an active check's result.
    pub fn observe_check(
        &self,
        server: &Server,
        now: Instant,
        result: CheckResult,
    ) -> Option<Transition> {
        let mut st = server.lock();
        st.checking = false;
        let t = st.health.observe_check(now, result);
        self.on_transition(&mut st, server, t, now)
    }

    /// Re-evaluates time-based health (silence) of every server.
    pub fn tick(&self, now: Instant) {
        for s in &self.servers {
            let mut st = s.lock();
            let t = st.health.tick(now);
            self.on_transition(&mut st, s, t, now);
        }
    }

    /// Closes the servers' idle connections past their time (the surplus
    /// of a burst after a second, any after the idle timeout), for servers
    /// no request has come to since.
    pub fn purge_idle(&self) {
        for s in &self.servers {
            s.connections.purge_idle(&self.conn);
        }
    }

    fn on_transition(
        &self,
        st: &mut ServerState,
        server: &Server,
        t: Option<Transition>,
        now: Instant,
    ) -> Option<Transition> {
        let t = t?;
        if t.is_recovery()
            && let Some(cfg) = &self.slow_start
        {
            st.slow_start = SlowStart::new(cfg.clone(), now).ok();
        }
        tracing::warn!(
            pool = %self.name,
            server = %server.addr,
            from = t.from.as_str(),
            to = t.to.as_str(),
            cause = ?st.health.dead_cause(),
            "upstream server health changed"
        );
        Some(t)
    }

    /// Servers due for an active check now; each is marked as being checked
    /// (the caller must report a result with [`Pool::observe_check`], or
    /// [`Pool::check_skipped`]).
    pub fn due_checks(&self, now: Instant) -> Vec<Arc<Server>> {
        let Some(checks) = &self.checks else {
            return Vec::new();
        };
        let mut due = Vec::new();
        for s in &self.servers {
            let mut st = s.lock();
            if !st.checking && st.next_check <= now {
                st.checking = true;
                st.next_check = now + checks.interval;
                due.push(s.clone());
            }
        }
        due
    }

    /// A due check did not run (no health slot free): not a failure.
    pub fn check_skipped(&self, server: &Server) {
        server.lock().checking = false;
    }

    /// The pool's routing mode from its servers' health.
    pub fn mode(&self) -> PoolMode {
        PoolMode::of(self.servers.iter().map(|s| s.health()))
    }

    /// What orchestrators are told about this pool.
    pub fn signal(&self, now: Instant) -> PoolSignal {
        let queued = self
            .admission
            .as_ref()
            .is_some_and(|q| q.snapshot().queued() > 0);
        let shed_recently = self
            .last_shed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|t| now.saturating_duration_since(t) < BUSY_AFTER_SHED);
        PoolSignal::of(self.mode(), queued || shed_recently)
    }

    /// Notes that the admission queue shed a request.
    pub fn shed(&self, now: Instant) {
        *self.last_shed.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
    }

    /// Counts an original request for the retry budget.
    pub fn record_request(&self, now: Instant) {
        self.budget().record_request(now);
    }

    /// Takes one retry from the budget; false when the budget is spent.
    pub fn try_retry(&self, now: Instant) -> bool {
        self.budget().try_spend(now)
    }

    fn budget(&self) -> MutexGuard<'_, RetryBudget> {
        self.retry_budget.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Caps the admission limit at what servers in slow start can take.
    /// Called periodically: the ramp also moves with time.
    pub fn update_capacity(&self, now: Instant) {
        let Some(q) = &self.admission else {
            return;
        };
        if self.slow_start.is_none() {
            return;
        }
        let mut total = 0usize;
        let mut capped = false;
        for s in &self.servers {
            if s.health() == HealthState::Dead && self.checks.is_some() {
                continue;
            }
            match s.slow_start_cap(now) {
                Some(c) => {
                    capped = true;
                    total += c as usize;
                }
                // A server at full share does not constrain the pool.
                None => total += usize::MAX / 2 / self.servers.len().max(1),
            }
        }
        q.set_capacity(capped.then_some(total.max(1)));
    }
}

/// The pool's admission queue: `previous`'s when its `[admission]` is
/// unchanged, none when `settings` disable it, else a new one that
/// continues what `previous`'s had learned.
fn admission_queue(
    def: &PoolConfig,
    settings: &AdmissionSettings,
    previous: Option<&Pool>,
    errors: &mut Vec<(usize, PoolError)>,
) -> Option<AdmissionQueue> {
    // An unchanged queue is kept: its in-flight count and waiters stay
    // true across the reload (a new one would let the app get twice the
    // limit while old requests finish).
    let kept_queue = previous
        .filter(|p| p.definition.admission == def.admission)
        .and_then(|p| p.admission.clone());
    match kept_queue {
        Some(q) => Some(q),
        None if !settings.enabled => None,
        None => {
            let q = build_admission(settings, errors)?;
            // New settings, the same app: what was learned of it goes on.
            if let Some(old) = previous.and_then(|p| p.admission.as_ref()) {
                q.continue_from(old);
            }
            Some(q)
        }
    }
}

/// The pool's retry budget from `[retry_budget]`; `None` (with the error
/// reported) when its settings are invalid.
fn build_retry_budget(
    def: &PoolConfig,
    now: Instant,
    errors: &mut Vec<(usize, PoolError)>,
) -> Option<RetryBudget> {
    match RetryBudget::new(
        RetryBudgetConfig {
            ratio: def.retry_budget.ratio,
            min_per_second: def.retry_budget.min_per_second,
            window: def.retry_budget.window.0,
        },
        now,
    ) {
        Ok(b) => Some(b),
        Err(e) => {
            errors.push((0, e.into()));
            None
        }
    }
}

/// How servers new to a pool ramp in: up to each server's share of the
/// admission limit over `admission.slow_start`. `None` without an
/// admission queue or with a zero `slow_start`.
fn slow_start_config(
    def: &PoolConfig,
    settings: &AdmissionSettings,
    admission: Option<&AdmissionQueue>,
) -> Option<SlowStartConfig> {
    match admission {
        Some(q) if !settings.slow_start.0.is_zero() => {
            let servers = def.servers.len().max(1);
            let share = q.limit().div_ceil(servers).max(1);
            Some(SlowStartConfig {
                target: u32::try_from(share).unwrap_or(u32::MAX),
                min_duration: settings.slow_start.0,
                ..SlowStartConfig::default()
            })
        }
        _ => None,
    }
}

/// The pool's servers, each resolved: `previous`'s own server for an
/// address it already had (when its health checks are unchanged), else a
/// new one, which ramps in with `slow_start` when a reload adds it. A
/// server that does not resolve is reported with its index.
fn build_servers(
    def: &PoolConfig,
    previous: Option<&Pool>,
    health_config: &HealthConfig,
    slow_start: Option<&SlowStartConfig>,
    now: Instant,
    errors: &mut Vec<(usize, PoolError)>,
) -> Vec<Arc<Server>> {
    let mut servers = Vec::new();
    for (i, s) in def.servers.iter().enumerate() {
        match resolve(s) {
            Ok(addr) => match Authority::try_from(addr.to_string()) {
                Ok(authority) => {
                    let kept = previous.and_then(|p| {
                        (p.definition.health == def.health)
                            .then(|| p.servers.iter().find(|o| o.addr == addr).cloned())
                            .flatten()
                    });
                    let server = match kept {
                        Some(s) => s,
                        None => {
                            let server = Server::new(addr, authority, health_config.clone(), now);
                            // A server added by a reload is new to traffic:
                            // ramp it in. At start-up the app is assumed warm.
                            if previous.is_some()
                                && let Some(cfg) = slow_start
                            {
                                server.lock().slow_start = SlowStart::new(cfg.clone(), now).ok();
                            }
                            Arc::new(server)
                        }
                    };
                    servers.push(server);
                }
                Err(_) => errors.push((i, PoolError::BadServer(s.clone()))),
            },
            Err(e) => errors.push((i, e)),
        }
    }
    servers
}

fn health_config(h: &HealthCheckSettings) -> HealthConfig {
    HealthConfig {
        slow_latency: h.slow_threshold.0,
        fall: h.fall,
        rise: h.rise,
        silence: h.silence.0,
        ..HealthConfig::default()
    }
}

fn check_health(h: &HealthCheckSettings, errors: &mut Vec<(usize, PoolError)>) {
    if !h.path.starts_with('/') {
        errors.push((0, PoolError::HealthPath(h.path.clone())));
    }
    let small: [(&'static [&'static str], u64, u64); 5] = [
        (&["health", "interval"], h.interval.0.as_millis() as u64, 10),
        (&["health", "timeout"], h.timeout.0.as_millis() as u64, 1),
        (
            &["health", "slow_threshold"],
            h.slow_threshold.0.as_millis() as u64,
            1,
        ),
        (&["health", "fall"], u64::from(h.fall), 1),
        (&["health", "rise"], u64::from(h.rise), 1),
    ];
    for (key, value, min) in small {
        if value < min {
            errors.push((0, PoolError::TooSmall { key, value, min }));
        }
    }
}

/// The shares of the standard lanes that have one, as a pool sets them.
struct LaneShares {
    newcomers: Share,
    pass: Share,
    bots: Share,
    anonymous: Share,
}

/// The standard lanes with a pool's depths, wait and shares.
fn pool_lanes(a: &AdmissionSettings, shares: LaneShares) -> Lanes {
    let standard = Lanes::standard();
    let specs = standard.iter().map(|(lane, spec)| LaneSpec {
        name: spec.name.clone(),
        max_depth: spec.max_depth.min(a.max_queued),
        max_wait: a.queue_timeout.0,
        share: match lane {
            Lane::NEWCOMERS => shares.newcomers,
            Lane::PASS => shares.pass,
            Lane::BOTS => shares.bots,
            Lane::ANONYMOUS => shares.anonymous,
            _ => spec.share,
        },
        yields_to_proof: spec.yields_to_proof,
    });
    Lanes::new(specs.collect()).unwrap_or(standard)
}

/// The pool's admission queue from its settings; `None`, with the reasons in
/// `errors`, when a setting is out of range.
fn build_admission(
    a: &AdmissionSettings,
    errors: &mut Vec<(usize, PoolError)>,
) -> Option<AdmissionQueue> {
    let before = errors.len();
    let workers = admission_workers(a, errors);
    let limit = admission_limit(a, workers, errors)?;
    if a.queue_timeout.0.is_zero() {
        errors.push((
            0,
            PoolError::TooSmall {
                key: &["admission", "queue_timeout"],
                value: 0,
                min: 1,
            },
        ));
    }
    let mut share = |key: &'static str, value: f64| {
        Share::from_fraction(value).unwrap_or_else(|| {
            errors.push((0, PoolError::Share { key, value }));
            Share::ZERO
        })
    };
    let shares = LaneShares {
        newcomers: share("newcomers_share", a.newcomers_share),
        pass: share("pass_share", a.pass_share),
        bots: share("bots_share", a.bots_share),
        anonymous: share("anonymous_share", a.anonymous_share),
    };
    if errors.len() > before {
        return None;
    }
    let lanes = pool_lanes(a, shares);
    let config = QueueConfig {
        lanes,
        limit,
        workers,
        health_reserve: HEALTH_RESERVE,
        max_queued: a.max_queued,
        retry_after_min: Duration::from_secs(1),
        retry_after_max: Duration::from_secs(30),
    };
    match AdmissionQueue::new(config) {
        Ok(q) => Some(q),
        Err(e) => {
            errors.push((0, e.into()));
            None
        }
    }
}

/// `admission.workers`, when set and above the health checks' reserve.
fn admission_workers(
    a: &AdmissionSettings,
    errors: &mut Vec<(usize, PoolError)>,
) -> Option<NonZeroUsize> {
    match a.workers {
        Some(w) if w <= HEALTH_RESERVE => {
            errors.push((
                0,
                PoolError::TooSmall {
                    key: &["admission", "workers"],
                    value: w as u64,
                    min: HEALTH_RESERVE as u64 + 1,
                },
            ));
            None
        }
        w => w.and_then(NonZeroUsize::new),
    }
}

/// The admission limit: `max_in_flight` when set (leaving the app's
/// `workers` a slot for health checks), else learned from latency. `None`
/// for a limit of 0.
fn admission_limit(
    a: &AdmissionSettings,
    workers: Option<NonZeroUsize>,
    errors: &mut Vec<(usize, PoolError)>,
) -> Option<LimitConfig> {
    let Some(n) = a.max_in_flight else {
        return Some(LimitConfig::Adaptive(GradientConfig::default()));
    };
    let Some(n) = NonZeroUsize::new(n) else {
        errors.push((
            0,
            PoolError::TooSmall {
                key: &["admission", "max_in_flight"],
                value: 0,
                min: 1,
            },
        ));
        return None;
    };
    if let Some(w) = workers
        && n.get() > w.get() - HEALTH_RESERVE
    {
        errors.push((
            0,
            PoolError::NoWorkerForChecks {
                max_in_flight: n.get(),
                workers: w.get(),
            },
        ));
    }
    Some(LimitConfig::Fixed(n))
}

fn resolve(s: &str) -> Result<SocketAddr, PoolError> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if !s.contains(':') {
        return Err(PoolError::BadServer(s.to_string()));
    }
    s.to_socket_addrs()
        .map_err(|e| PoolError::Unresolvable(s.to_string(), e.to_string()))?
        .next()
        .ok_or_else(|| PoolError::Unresolvable(s.to_string(), "no addresses".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigDuration;

    fn def(servers: &[&str], balance: Balance) -> PoolConfig {
        PoolConfig {
            servers: servers.iter().map(|s| s.to_string()).collect(),
            balance,
            connect_timeout: ConfigDuration::secs(1),
            response_timeout: ConfigDuration::secs(1),
            idle_timeout: ConfigDuration::secs(1),
            max_idle_per_server: 1,
            admission: None,
            health: None,
            retry_budget: Default::default(),
        }
    }

    #[tokio::test]
    async fn least_in_flight_prefers_idle_server() {
        let pool = Pool::build(
            "p",
            &def(&["127.0.0.1:1", "127.0.0.1:2"], Balance::LeastInFlight),
            None,
        )
        .unwrap();
        let a = pool.pick(None, true, Instant::now()).unwrap();
        let b = pool.pick(None, true, Instant::now()).unwrap();
        assert_ne!(
            a.server.addr, b.server.addr,
            "second pick goes to the idle server"
        );
        let held = pool.pick(None, true, Instant::now()).unwrap();
        drop(a);
        let next = pool.pick(None, true, Instant::now()).unwrap();
        assert_ne!(next.server.addr, held.server.addr);
        assert_eq!(pool.in_flight(), 3);
    }

    #[tokio::test]
    async fn round_robin_and_exclusion() {
        let pool = Pool::build(
            "p",
            &def(
                &["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"],
                Balance::RoundRobin,
            ),
            None,
        )
        .unwrap();
        let picks: Vec<u16> = (0..6)
            .map(|_| {
                pool.pick(None, true, Instant::now())
                    .unwrap()
                    .server
                    .addr
                    .port()
            })
            .collect();
        assert_eq!(picks, vec![1, 2, 3, 1, 2, 3]);
        let bad = pool.servers[0].clone();
        for _ in 0..5 {
            assert_ne!(
                pool.pick(Some(&bad), true, Instant::now())
                    .unwrap()
                    .server
                    .addr
                    .port(),
                1
            );
        }
    }

    fn checked(servers: &[&str]) -> PoolConfig {
        let mut d = def(servers, Balance::LeastInFlight);
        d.health = Some(HealthCheckSettings {
            path: "/healthz".into(),
            interval: ConfigDuration::secs(1),
            timeout: ConfigDuration::secs(1),
            slow_threshold: ConfigDuration::secs(2),
            fall: 1,
            rise: 1,
            silence: ConfigDuration::secs(30),
        });
        d
    }

    #[tokio::test]
    async fn dead_servers_are_skipped_and_panic_serves_only_reads() {
        let pool = Pool::build("p", &checked(&["127.0.0.1:1", "127.0.0.1:2"]), None).unwrap();
        let now = Instant::now();
        let (a, b) = (pool.servers[0].clone(), pool.servers[1].clone());
        pool.observe_check(&a, now, CheckResult::Refused);
        assert_eq!(a.health(), HealthState::Dead);
        for _ in 0..4 {
            let g = pool.pick(None, false, now).unwrap();
            assert_eq!(g.server.addr, b.addr, "a dead server gets nothing");
        }
        pool.observe_check(&b, now, CheckResult::Refused);
        assert_eq!(pool.mode(), PoolMode::Panic);
        assert_eq!(pool.signal(now), PoolSignal::Down);
        assert_eq!(pool.pick(None, false, now).unwrap_err(), NoServer::AllDead);
        assert!(pool.pick(None, true, now).is_ok(), "panic mode tries reads");
        pool.observe_check(
            &a,
            now,
            CheckResult::Ok {
                latency: Duration::from_millis(5),
            },
        );
        assert_eq!(a.health(), HealthState::Healthy, "rise = 1");
        assert_eq!(pool.pick(None, false, now).unwrap().server.addr, a.addr);
    }

    #[tokio::test]
    async fn servers_added_by_reload_slow_start_and_cap_the_queue() {
        let mut d = checked(&["127.0.0.1:1"]);
        d.admission = Some(AdmissionSettings {
            max_in_flight: Some(8),
            workers: Some(10),
            max_queued: 100,
            queue_timeout: ConfigDuration::secs(10),
            slow_start: ConfigDuration::secs(10),
            ..AdmissionSettings::default()
        });
        let first = Pool::build("p", &d, None).unwrap();
        let now = Instant::now();
        assert_eq!(
            first.servers[0].view(now).slow_start_cap,
            None,
            "warm at start"
        );
        d.servers.push("127.0.0.1:2".into());
        let second = Pool::build("p", &d, Some(&first)).unwrap();
        assert!(Arc::ptr_eq(&first.servers[0], &second.servers[0]), "kept");
        let fresh = &second.servers[1];
        assert_eq!(fresh.view(now).slow_start_cap, Some(1));
        // The fresh server takes one request; the next goes to the warm one.
        let g1 = second.pick(None, true, now).unwrap();
        let g2 = second.pick(None, true, now).unwrap();
        let g3 = second.pick(None, true, now).unwrap();
        let on_fresh = [&g1, &g2, &g3]
            .iter()
            .filter(|g| g.server.addr == fresh.addr)
            .count();
        assert_eq!(on_fresh, 1);
        let (q1, q2) = (first.admission.unwrap(), second.admission.unwrap());
        assert!(q1.same_queue(&q2), "an unchanged admission queue is kept");
    }

    #[test]
    fn bad_servers_are_named() {
        let errs = Pool::build(
            "p",
            &def(&["127.0.0.1:80", "nonsense", "x:y:z"], Balance::RoundRobin),
            None,
        )
        .unwrap_err();
        assert_eq!(errs.len(), 2);
        assert_eq!(errs[0].0, 1);
        assert!(errs[0].1.to_string().contains("nonsense"));
    }
}
