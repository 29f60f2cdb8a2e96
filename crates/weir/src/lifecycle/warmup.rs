//! Warm-up: when a starting generation may call itself ready. With
//! `lifecycle.ready_requires_upstream` (the default) readiness waits until
//! every pool has a server that answers and, when limits are shared, until
//! Redis answers, bounded by `lifecycle.ready_upstream_timeout`. "Ready"
//! means `/readyz` 200 for blue/green, and in an in-place upgrade the
//! moment the old process is told to stop (`Server::start_with` returns
//! only then, and the `Ready` message follows it).
//!
//! A pool answers when one of its servers passes the pool's health check
//! (`GET health_check.path`, status below 500, taking the admission queue's
//! health slot like any check), or, for a pool without `health_check`,
//! accepts a TCP connection. Redis answers when the shared limiter left its
//! local fallback. These probes are this module's own and run only until the
//! gate opens: they do not feed the pools' health state (that is
//! `upstream::checks`), and traffic is never held back here: requests are
//! served throughout, readiness is only the orchestrator's cue.
//!
//! [`Phase`] is the gate itself, pure and driven with explicit times;
//! [`run`] probes and feeds it; [`Readiness`] is what the admin API reads.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use weir_limiter::shared::SharedLimiter;

use crate::upstream::Pool;
use crate::upstream::health::CheckResult;

/// Pause between probe rounds while something has not answered.
const PROBE_EVERY: Duration = Duration::from_millis(250);
/// Longest single probe: a blackholed server must not stall the rounds
/// (its pool's own timeouts may be much longer).
const PROBE_TIMEOUT_CAP: Duration = Duration::from_secs(2);

/// Something readiness waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Awaited {
    Pool(Arc<str>),
    Redis,
}

impl std::fmt::Display for Awaited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Awaited::Pool(name) => write!(f, "pool {name}"),
            Awaited::Redis => f.write_str("redis"),
        }
    }
}

/// The warm-up gate.
#[derive(Debug, Clone, PartialEq)]
pub enum Phase {
    /// Not gated: `ready_requires_upstream = false` (or not started yet).
    Off,
    /// Not ready: `pending` has not answered yet.
    Waiting {
        started: Instant,
        deadline: Instant,
        pending: Vec<Awaited>,
        /// Every pending thing has been probed at least once.
        probed: bool,
    },
    /// Everything answered after `took`.
    Ready { took: Duration },
    /// The deadline passed with `missing` still silent: ready anyway.
    TimedOut {
        took: Duration,
        missing: Vec<Awaited>,
    },
}

/// A change of [`Phase`] worth a log line.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Answered(Awaited),
    Ready {
        took: Duration,
    },
    TimedOut {
        took: Duration,
        missing: Vec<Awaited>,
    },
}

impl Phase {
    /// A gate opened at `now` that waits for `pending` until `deadline`
    /// (ready at once when there is nothing to wait for).
    pub fn start(now: Instant, deadline: Instant, pending: Vec<Awaited>) -> Phase {
        if pending.is_empty() {
            return Phase::Ready {
                took: Duration::ZERO,
            };
        }
        Phase::Waiting {
            started: now,
            deadline,
            pending,
            probed: false,
        }
    }

    /// `what` answered at `now`.
    pub fn answered(&mut self, now: Instant, what: &Awaited) -> Vec<Event> {
        let Phase::Waiting {
            started, pending, ..
        } = self
        else {
            return Vec::new();
        };
        let Some(i) = pending.iter().position(|p| p == what) else {
            return Vec::new();
        };
        pending.remove(i);
        let mut events = vec![Event::Answered(what.clone())];
        if pending.is_empty() {
            let took = now.saturating_duration_since(*started);
            events.push(Event::Ready { took });
            *self = Phase::Ready { took };
        }
        events
    }

    /// A probe round ended: everything still pending was probed once.
    pub fn probed(&mut self) {
        if let Phase::Waiting { probed, .. } = self {
            *probed = true;
        }
    }

    /// Opens the gate if the deadline has passed.
    pub fn tick(&mut self, now: Instant) -> Option<Event> {
        let Phase::Waiting {
            started,
            deadline,
            pending,
            ..
        } = self
        else {
            return None;
        };
        if now < *deadline {
            return None;
        }
        let took = now.saturating_duration_since(*started);
        let missing = std::mem::take(pending);
        *self = Phase::TimedOut {
            took,
            missing: missing.clone(),
        };
        Some(Event::TimedOut { took, missing })
    }

    /// Whether the gate is open (or was never closed).
    pub fn settled(&self) -> bool {
        !matches!(self, Phase::Waiting { .. })
    }

    /// What is still awaited (empty once settled).
    pub fn pending(&self) -> &[Awaited] {
        match self {
            Phase::Waiting { pending, .. } => pending,
            _ => &[],
        }
    }

    /// Why the instance is not ready at `now`, as `/readyz` says it; `None`
    /// when the gate does not hold readiness back.
    pub fn not_ready_reason(&self, now: Instant) -> Option<String> {
        let Phase::Waiting {
            deadline, pending, ..
        } = self
        else {
            return None;
        };
        let names: Vec<String> = pending.iter().map(Awaited::to_string).collect();
        let left = deadline.saturating_duration_since(now).as_secs();
        Some(format!(
            "waiting for {} to answer (lifecycle.ready_requires_upstream; at most {left}s more)",
            names.join(", ")
        ))
    }

    /// A line for `/readyz` once ready, if the warm-up did not end well.
    pub fn ready_note(&self) -> Option<String> {
        match self {
            Phase::TimedOut { took, missing } => Some(format!(
                "warm-up timed out after {}s: {} never answered",
                took.as_secs(),
                missing
                    .iter()
                    .map(Awaited::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            _ => None,
        }
    }

    /// Label for `/status`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Phase::Off => "off",
            Phase::Waiting { .. } => "waiting",
            Phase::Ready { .. } => "ready",
            Phase::TimedOut { .. } => "timed_out",
        }
    }

    /// The `/status` document of the warm-up.
    pub fn status(&self) -> serde_json::Value {
        let names = |v: &[Awaited]| v.iter().map(Awaited::to_string).collect::<Vec<_>>();
        match self {
            Phase::Off => serde_json::json!({ "phase": self.as_str() }),
            Phase::Waiting { pending, .. } => serde_json::json!({
                "phase": self.as_str(),
                "waiting_for": names(pending),
            }),
            Phase::Ready { took } => serde_json::json!({
                "phase": self.as_str(),
                "took_seconds": took.as_secs_f64(),
            }),
            Phase::TimedOut { took, missing } => serde_json::json!({
                "phase": self.as_str(),
                "took_seconds": took.as_secs_f64(),
                "never_answered": names(missing),
            }),
        }
    }
}

/// What a starting generation has found and still waits for, for the admin
/// API: the warm-up gate and how the limiter state came back.
pub struct Readiness {
    phase: watch::Sender<Phase>,
    restored: OnceLock<&'static str>,
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness {
            phase: watch::Sender::new(Phase::Off),
            restored: OnceLock::new(),
        }
    }
}

impl Readiness {
    pub fn phase(&self) -> Phase {
        self.phase.borrow().clone()
    }

    /// Closes the gate (at start, before the admin API listens).
    pub fn begin(&self, phase: Phase) {
        self.phase.send_replace(phase);
    }

    /// Changes the phase and returns what `change` reported.
    pub fn update<T: Default>(&self, change: impl FnOnce(&mut Phase) -> T) -> T {
        let mut out = T::default();
        self.phase.send_modify(|p| out = change(p));
        out
    }

    /// Resolves when `until` holds for the phase, or at `deadline`; returns
    /// the phase then.
    pub async fn wait(&self, until: impl Fn(&Phase) -> bool, deadline: Instant) -> Phase {
        let mut rx = self.phase.subscribe();
        let _ = tokio::time::timeout_at(deadline.into(), rx.wait_for(|p| until(p))).await;
        self.phase()
    }

    /// Notes how the start-up restore went (`state::Restored::label`).
    pub fn set_restored(&self, label: &'static str) {
        let _ = self.restored.set(label);
    }

    /// How the limiter state came back at start, once known.
    pub fn restored(&self) -> Option<&'static str> {
        self.restored.get().copied()
    }
}

/// The warm-up's metrics (registered by `Server::start_with`).
#[derive(Clone, Default)]
pub struct WarmUpMetrics {
    /// Things readiness still waits for.
    pub waiting: Gauge,
    /// How long the warm-up took (0 while it runs).
    pub seconds: Gauge<f64, AtomicU64>,
    /// Warm-ups that ended at the timeout.
    pub timeouts: Counter,
}

impl WarmUpMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "warmup_waiting",
            "Pools (and Redis) a starting generation's readiness still waits for",
            self.waiting.clone(),
        );
        registry.register(
            "warmup_seconds",
            "How long the start-up warm-up took until ready (0 while waiting)",
            self.seconds.clone(),
        );
        registry.register(
            "warmup_timeouts",
            "Warm-ups that reported ready at lifecycle.ready_upstream_timeout with something still not answering",
            self.timeouts.clone(),
        );
    }
}

/// What [`run`] waits for: `pools`, and Redis when a shared limiter is
/// installed.
pub fn awaited(pools: &[Arc<Pool>], shared: Option<&SharedLimiter>) -> Vec<Awaited> {
    let mut out: Vec<Awaited> = pools
        .iter()
        .map(|p| Awaited::Pool(p.name.clone()))
        .collect();
    if shared.is_some() {
        out.push(Awaited::Redis);
    }
    out
}

/// What the warm-up probes: the pools of the gateway it started with, and
/// the shared limiter, if any.
pub struct WarmUp {
    pub readiness: Arc<Readiness>,
    pub pools: Vec<Arc<Pool>>,
    pub shared: Option<Arc<SharedLimiter>>,
    pub metrics: WarmUpMetrics,
}

/// Probes until every awaited thing answered or the phase timed out
/// (the phase must have been begun). Stops early when `stop` is cancelled.
pub async fn run(warm_up: WarmUp, stop: CancellationToken) {
    let WarmUp {
        readiness,
        pools,
        shared,
        metrics,
    } = warm_up;
    let deadline = match readiness.phase() {
        Phase::Waiting { deadline, .. } => deadline,
        _ => return,
    };
    metrics
        .waiting
        .set(readiness.phase().pending().len() as i64);
    loop {
        let pending = readiness.phase().pending().to_vec();
        let Some(mut answered) = probe_pending_pools(&pools, &pending, deadline, &stop).await
        else {
            return;
        };
        if pending.contains(&Awaited::Redis)
            && shared.as_ref().is_some_and(|s| !s.fallback_active())
        {
            answered.push(Awaited::Redis);
        }
        if record_answers(&readiness, &metrics, &answered) {
            metrics.waiting.set(0);
            return;
        }
        let next = (Instant::now() + PROBE_EVERY).min(deadline);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep_until(next.into()) => {}
        }
    }
}

/// Probes, all at once, the `pools` still `pending`, until each answered or
/// the `deadline`; returns the pools that answered, or `None` when `stop` was
/// cancelled meanwhile.
async fn probe_pending_pools(
    pools: &[Arc<Pool>],
    pending: &[Awaited],
    deadline: Instant,
    stop: &CancellationToken,
) -> Option<Vec<Awaited>> {
    let waiting: Vec<Arc<Pool>> = pools
        .iter()
        .filter(|p| pending.contains(&Awaited::Pool(p.name.clone())))
        .cloned()
        .collect();
    let mut round = tokio::task::JoinSet::new();
    for pool in waiting {
        round.spawn(async move {
            let up = probe_pool(&pool).await;
            (pool.name.clone(), up)
        });
    }
    let mut answered = Vec::new();
    let collect = async {
        while let Some(r) = round.join_next().await {
            if let Ok((name, true)) = r {
                answered.push(Awaited::Pool(name));
            }
        }
    };
    tokio::select! {
        _ = stop.cancelled() => return None,
        _ = tokio::time::timeout_at(deadline.into(), collect) => {}
    }
    Some(answered)
}

/// Records a probe round's `answered` things in the phase, the waiting gauge
/// and the log; returns whether the phase has settled (ready or timed out).
fn record_answers(readiness: &Readiness, metrics: &WarmUpMetrics, answered: &[Awaited]) -> bool {
    let now = Instant::now();
    let mut events = Vec::new();
    let settled = readiness.update(|phase| {
        for a in answered {
            events.extend(phase.answered(now, a));
        }
        phase.probed();
        events.extend(phase.tick(now));
        phase.settled()
    });
    // Set with the phase, so the gauge and `/readyz` never disagree
    // for a probe interval.
    metrics
        .waiting
        .set(readiness.phase().pending().len() as i64);
    for e in events {
        report(&e, metrics);
    }
    settled
}

fn report(e: &Event, metrics: &WarmUpMetrics) {
    match e {
        Event::Answered(what) => tracing::info!(%what, "warm-up: answered"),
        Event::Ready { took } => {
            metrics.seconds.set(took.as_secs_f64());
            tracing::info!(?took, "warm-up done: every pool answers; ready");
        }
        Event::TimedOut { took, missing } => {
            metrics.seconds.set(took.as_secs_f64());
            metrics.timeouts.inc();
            let missing: Vec<String> = missing.iter().map(Awaited::to_string).collect();
            tracing::error!(
                ?took,
                never_answered = ?missing,
                "warm-up timed out (lifecycle.ready_upstream_timeout): reporting ready although \
                 these never answered; requests to them will fail until they do"
            );
        }
    }
}

/// True when a server of `pool` answers now (probed concurrently).
async fn probe_pool(pool: &Arc<Pool>) -> bool {
    let mut probes = tokio::task::JoinSet::new();
    for i in 0..pool.servers.len() {
        let pool = pool.clone();
        probes.spawn(async move { probe_server(&pool, i).await });
    }
    while let Some(r) = probes.join_next().await {
        if matches!(r, Ok(true)) {
            return true;
        }
    }
    false
}

async fn probe_server(pool: &Pool, index: usize) -> bool {
    let Some(server) = pool.servers.get(index) else {
        return false;
    };
    match &pool.checks {
        Some(settings) => {
            // Like any check: the reserved slot or nothing (never the app's
            // last worker); a busy slot means a check is running anyway.
            let _permit = match &pool.admission {
                None => None,
                Some(q) => match q.try_acquire_health() {
                    Some(p) => Some(p),
                    None => return false,
                },
            };
            let mut settings = settings.clone();
            settings.timeout = settings.timeout.min(PROBE_TIMEOUT_CAP);
            matches!(
                crate::upstream::checks::check(pool, server, &settings).await,
                CheckResult::Ok { .. }
            )
        }
        None => {
            let within = pool.conn.connect_timeout.min(PROBE_TIMEOUT_CAP);
            matches!(
                tokio::time::timeout(within, tokio::net::TcpStream::connect(server.addr)).await,
                Ok(Ok(_))
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(name: &str) -> Awaited {
        Awaited::Pool(name.into())
    }

    #[test]
    fn the_gate_opens_when_everything_answered_or_at_the_deadline() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let deadline = t0 + s(30);
        // (answers as (seconds after start, what), tick at, phase label, not-ready reason contains)
        type Case = (
            &'static [(u64, &'static str)],
            u64,
            &'static str,
            Option<&'static str>,
        );
        let cases: [Case; 6] = [
            (&[], 1, "waiting", Some("waiting for pool app, redis")),
            (&[(1, "app")], 2, "waiting", Some("waiting for redis")),
            (&[(1, "app"), (2, "redis")], 3, "ready", None),
            (&[(1, "other"), (1, "app")], 2, "waiting", Some("redis")),
            (&[(1, "app")], 30, "timed_out", None),
            (
                &[(1, "app"), (1, "app")],
                29,
                "waiting",
                Some("at most 1s more"),
            ),
        ];
        for (answers, tick, want, reason) in cases {
            let mut p = Phase::start(t0, deadline, vec![pool("app"), Awaited::Redis]);
            for (at, what) in answers {
                let a = if *what == "redis" {
                    Awaited::Redis
                } else {
                    pool(what)
                };
                p.answered(t0 + s(*at), &a);
            }
            p.tick(t0 + s(tick));
            assert_eq!(p.as_str(), want, "{answers:?} tick {tick}");
            let got = p.not_ready_reason(t0 + s(tick));
            match reason {
                None => assert!(got.is_none(), "{answers:?}: {got:?}"),
                Some(r) => assert!(got.as_deref().is_some_and(|g| g.contains(r)), "{got:?}"),
            }
        }
    }

    #[test]
    fn events_say_what_answered_and_how_it_ended() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut p = Phase::start(t0, t0 + s(10), vec![pool("a"), pool("b")]);
        assert_eq!(
            p.answered(t0 + s(1), &pool("a")),
            [Event::Answered(pool("a"))]
        );
        assert_eq!(p.answered(t0 + s(1), &pool("a")), [], "answered twice");
        assert_eq!(p.tick(t0 + s(9)), None);
        assert!(!p.settled());
        assert_eq!(
            p.tick(t0 + s(10)),
            Some(Event::TimedOut {
                took: s(10),
                missing: vec![pool("b")]
            })
        );
        assert!(p.settled());
        assert_eq!(
            p.ready_note().as_deref(),
            Some("warm-up timed out after 10s: pool b never answered")
        );
        // Late answers change nothing once open.
        assert_eq!(p.answered(t0 + s(11), &pool("b")), []);

        let mut q = Phase::start(t0, t0 + s(10), vec![pool("a")]);
        assert_eq!(
            q.answered(t0 + s(2), &pool("a")),
            [Event::Answered(pool("a")), Event::Ready { took: s(2) }]
        );
        assert_eq!(q.ready_note(), None);
        assert_eq!(Phase::start(t0, t0, vec![]), Phase::Ready { took: s(0) });
        assert!(Phase::Off.settled() && Phase::Off.not_ready_reason(t0).is_none());
    }

    #[test]
    fn probed_is_set_only_while_waiting() {
        let t0 = Instant::now();
        let mut p = Phase::start(t0, t0 + Duration::from_secs(1), vec![pool("a")]);
        assert!(matches!(p, Phase::Waiting { probed: false, .. }));
        p.probed();
        assert!(matches!(p, Phase::Waiting { probed: true, .. }));
        let mut off = Phase::Off;
        off.probed();
        assert_eq!(off, Phase::Off);
    }
}
