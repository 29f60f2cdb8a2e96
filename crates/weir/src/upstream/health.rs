//! Upstream health: whether each server is *healthy*, *slow* or *dead*, and
//! what a pool does with that (panic mode, and the signal for orchestrators).
//!
//! A [`ServerHealth`] is fed two kinds of evidence with the time they were
//! seen: active check results ([`CheckResult`]) and passive outcomes of real
//! requests ([`RequestOutcome`]). The rules:
//!
//! - **dead** = nobody is there: `fall` consecutive refused/reset connections
//!   ([`DeadCause::Refused`]), or `fall` consecutive timeouts with no answer
//!   of any kind for `silence` ([`DeadCause::Silent`]). A dead server needs
//!   `rise` consecutive answers to come back.
//! - **slow** = answering, but the smoothed latency is above `slow_latency`,
//!   or `fall` active checks in a row failed while real requests still got
//!   answers. Slow servers keep receiving traffic: slow is never dead
//!   (incident 1: treating busy as dead restarted the app ten times an hour).
//! - **healthy** otherwise; leaving slow needs the latency back under
//!   `slow_latency × recover_ratio` (hysteresis) and checks passing.
//!
//! [`PoolMode`] turns the servers' states into routing: normal (some healthy),
//! degraded (only slow ones: they take everything), panic (all dead: only
//! idempotent reads go out, to servers that may still answer). [`PoolSignal`]
//! is what `/livez` and `/readyz`-style endpoints report for a pool.
//!
//! Nothing here does I/O or reads a clock: the caller runs checks, classifies
//! failures (see [`crate::upstream::ForwardError`]) and passes `now`.

use std::time::{Duration, Instant};

use http::StatusCode;

/// A server's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HealthState {
    Healthy,
    Slow,
    Dead,
}

impl HealthState {
    /// Label in logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            HealthState::Healthy => "healthy",
            HealthState::Slow => "slow",
            HealthState::Dead => "dead",
        }
    }
}

/// Why a server is dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeadCause {
    /// Connections refused or reset: nothing is listening (restart, crash).
    Refused,
    /// Connections accepted (or hanging) but nothing answered for `silence`.
    Silent,
}

/// The result of one active health check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckResult {
    /// Answered with a passing status.
    Ok { latency: Duration },
    /// Answered, but with a failing status (e.g. 500 from the check URL).
    Failed { latency: Duration },
    /// No answer within the check timeout.
    Timeout,
    /// Connection refused or reset before an answer.
    Refused,
}

/// The outcome of one real request, as far as the server's health goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestOutcome {
    /// Any response, whatever the status: the server is alive.
    Answered { latency: Duration },
    /// Connection refused.
    Refused,
    /// Connection reset before a response.
    Reset,
    /// No response within the response timeout.
    Timeout,
}

/// Thresholds of [`ServerHealth`].
#[derive(Debug, Clone, PartialEq)]
pub struct HealthConfig {
    /// Smoothed latency above this makes a server slow.
    pub slow_latency: Duration,
    /// A slow server is healthy again below `slow_latency × recover_ratio`.
    pub recover_ratio: f64,
    /// Weight of each new latency in the average (0 < a ≤ 1).
    pub latency_smoothing: f64,
    /// Consecutive failures before slow (checks) or dead (connects, timeouts).
    pub fall: u32,
    /// Consecutive answers before a dead server is alive again.
    pub rise: u32,
    /// How long without any answer, with timeouts, before a server is dead.
    pub silence: Duration,
}

impl Default for HealthConfig {
    /// `fall` 3 / `rise` 2 as HAProxy; 2 s is "slow" for a page; 30 s of
    /// silence is ten missed 3 s checks, longer than a php-fpm worker stall.
    fn default() -> Self {
        HealthConfig {
            slow_latency: Duration::from_secs(2),
            recover_ratio: 0.8,
            latency_smoothing: 0.2,
            fall: 3,
            rise: 2,
            silence: Duration::from_secs(30),
        }
    }
}

/// A change of state, for the log line and for starting slow start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub from: HealthState,
    pub to: HealthState,
}

impl Transition {
    /// The server was dead and answers again: ramp it in with slow start.
    pub fn is_recovery(&self) -> bool {
        self.from == HealthState::Dead && self.to != HealthState::Dead
    }
}

/// One server's health state machine.
#[derive(Debug, Clone)]
pub struct ServerHealth {
    config: HealthConfig,
    state: HealthState,
    cause: Option<DeadCause>,
    since: Instant,
    latency: Option<f64>,
    last_answer: Instant,
    refused_streak: u32,
    timeout_streak: u32,
    check_fail_streak: u32,
    answer_streak: u32,
}

impl ServerHealth {
    /// A new server starts healthy (it gets a slow start, not a trial);
    /// `now` counts as its last answer so silence is measured from here.
    pub fn new(config: HealthConfig, now: Instant) -> ServerHealth {
        ServerHealth {
            config,
            state: HealthState::Healthy,
            cause: None,
            since: now,
            latency: None,
            last_answer: now,
            refused_streak: 0,
            timeout_streak: 0,
            check_fail_streak: 0,
            answer_streak: 0,
        }
    }

    pub fn state(&self) -> HealthState {
        self.state
    }

    /// Why the server is dead, while it is.
    pub fn dead_cause(&self) -> Option<DeadCause> {
        self.cause
    }

    /// When the current state began.
    pub fn since(&self) -> Instant {
        self.since
    }

    /// The smoothed latency of answers, once any were seen.
    pub fn latency(&self) -> Option<Duration> {
        self.latency.map(Duration::from_secs_f64)
    }

    pub fn observe_check(&mut self, now: Instant, result: CheckResult) -> Option<Transition> {
        match result {
            CheckResult::Ok { latency } => {
                self.check_fail_streak = 0;
                self.answered(now, latency);
            }
            CheckResult::Failed { latency } => {
                self.check_fail_streak += 1;
                // A failing status is still an answer: alive, so at worst slow.
                self.answered(now, latency);
            }
            CheckResult::Timeout => {
                self.check_fail_streak += 1;
                self.timed_out();
            }
            CheckResult::Refused => {
                self.check_fail_streak += 1;
                self.refused();
            }
        }
        self.evaluate(now)
    }

    pub fn observe_request(&mut self, now: Instant, outcome: RequestOutcome) -> Option<Transition> {
        match outcome {
            RequestOutcome::Answered { latency } => self.answered(now, latency),
            RequestOutcome::Refused | RequestOutcome::Reset => self.refused(),
            RequestOutcome::Timeout => self.timed_out(),
        }
        self.evaluate(now)
    }

    /// Re-evaluates with no new evidence (silence grows with time).
    pub fn tick(&mut self, now: Instant) -> Option<Transition> {
        self.evaluate(now)
    }

    fn answered(&mut self, now: Instant, latency: Duration) {
        let x = latency.as_secs_f64();
        let a = self.config.latency_smoothing;
        self.latency = Some(match self.latency {
            None => x,
            Some(avg) => avg + a * (x - avg),
        });
        self.last_answer = now;
        self.refused_streak = 0;
        self.timeout_streak = 0;
        self.answer_streak = self.answer_streak.saturating_add(1);
    }

    fn refused(&mut self) {
        self.refused_streak += 1;
        self.answer_streak = 0;
    }

    fn timed_out(&mut self) {
        self.timeout_streak += 1;
        self.answer_streak = 0;
    }

    fn evaluate(&mut self, now: Instant) -> Option<Transition> {
        let cfg = &self.config;
        let silent = now.saturating_duration_since(self.last_answer) >= cfg.silence;
        let dead_cause = if self.refused_streak >= cfg.fall {
            Some(DeadCause::Refused)
        } else if self.timeout_streak >= cfg.fall && silent {
            Some(DeadCause::Silent)
        } else {
            None
        };
        let slow_at = cfg.slow_latency.as_secs_f64();
        let latency = self.latency.unwrap_or(0.0);
        let next = if self.state == HealthState::Dead {
            if self.answer_streak >= cfg.rise {
                self.alive_state(latency > slow_at)
            } else {
                // Keep the cause current: a silent server may start refusing.
                if let Some(c) = dead_cause {
                    self.cause = Some(c);
                }
                HealthState::Dead
            }
        } else if let Some(c) = dead_cause {
            self.cause = Some(c);
            HealthState::Dead
        } else {
            let threshold = if self.state == HealthState::Slow {
                slow_at * cfg.recover_ratio
            } else {
                slow_at
            };
            self.alive_state(latency > threshold)
        };
        if next != HealthState::Dead {
            self.cause = None;
        }
        if next == self.state {
            return None;
        }
        let t = Transition {
            from: self.state,
            to: next,
        };
        self.state = next;
        self.since = now;
        Some(t)
    }

    fn alive_state(&self, latency_high: bool) -> HealthState {
        if latency_high || self.check_fail_streak >= self.config.fall {
            HealthState::Slow
        } else {
            HealthState::Healthy
        }
    }
}

/// How a pool routes, from its servers' states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// Some server is healthy: healthy and slow servers take traffic
    /// (balance slow ones lower, see [`PoolMode::weight`]).
    Normal,
    /// None healthy, some slow: the slow servers take everything.
    Degraded,
    /// All dead: idempotent reads still go out (see [`PoolMode::admits`]);
    /// anything else is refused at once with 503.
    Panic,
}

impl PoolMode {
    /// The mode of a pool whose servers are in `states`.
    pub fn of(states: impl IntoIterator<Item = HealthState>) -> PoolMode {
        let mut slow = false;
        for s in states {
            match s {
                HealthState::Healthy => return PoolMode::Normal,
                HealthState::Slow => slow = true,
                HealthState::Dead => {}
            }
        }
        if slow {
            PoolMode::Degraded
        } else {
            PoolMode::Panic
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            PoolMode::Normal => "normal",
            PoolMode::Degraded => "degraded",
            PoolMode::Panic => "panic",
        }
    }

    /// Whether a request may go to a server in `state` (dead for `cause`).
    ///
    /// In panic mode an idempotent read may go to any dead server: a silent
    /// one may answer late, and a refusing one costs one fast failed connect
    /// (the forwarder tries the next) and is how a restarted app is noticed
    /// before the next check. Callers should prefer [`DeadCause::Silent`]
    /// servers (see [`PoolMode::panic_preference`]). Non-idempotent requests
    /// are never sent to a dead server: a write must not land on a server
    /// that may be mid-crash.
    pub fn admits(&self, state: HealthState, idempotent: bool) -> bool {
        match (self, state) {
            (_, HealthState::Healthy) | (_, HealthState::Slow) => true,
            (PoolMode::Panic, HealthState::Dead) => idempotent,
            (_, HealthState::Dead) => false,
        }
    }

    /// Balancing weight of a server in `state` (relative, 0 = never).
    pub fn weight(&self, state: HealthState, idempotent: bool) -> u32 {
        if !self.admits(state, idempotent) {
            return 0;
        }
        match (self, state) {
            // Slow servers still work, but a healthy one answers sooner.
            (PoolMode::Normal, HealthState::Slow) => 1,
            (PoolMode::Normal, _) => 4,
            _ => 1,
        }
    }

    /// In panic mode, lower is tried first: silent before refusing.
    pub fn panic_preference(cause: Option<DeadCause>) -> u8 {
        match cause {
            Some(DeadCause::Silent) | None => 0,
            Some(DeadCause::Refused) => 1,
        }
    }
}

/// What a pool tells orchestrators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolSignal {
    /// Serving normally.
    Ready,
    /// Alive but saturated or slow: take it out of rotation if you can,
    /// **never restart it** (restarting turns slow into down).
    Busy,
    /// No server answers: restarting may help.
    Down,
}

impl PoolSignal {
    /// `mode` from [`PoolMode::of`]; `saturated` when the pool's admission
    /// queue has waiters or shed recently.
    pub fn of(mode: PoolMode, saturated: bool) -> PoolSignal {
        match mode {
            PoolMode::Panic => PoolSignal::Down,
            PoolMode::Degraded => PoolSignal::Busy,
            PoolMode::Normal if saturated => PoolSignal::Busy,
            PoolMode::Normal => PoolSignal::Ready,
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            PoolSignal::Ready => "ready",
            PoolSignal::Busy => "busy",
            PoolSignal::Down => "down",
        }
    }

    /// Liveness (restart if failing): only `Down` fails.
    pub fn livez_status(&self) -> StatusCode {
        match self {
            PoolSignal::Down => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::OK,
        }
    }

    /// Readiness (route traffic here): only `Ready` passes.
    pub fn readyz_status(&self) -> StatusCode {
        match self {
            PoolSignal::Ready => StatusCode::OK,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use CheckResult as C;
    use HealthState::*;
    use RequestOutcome as R;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// An event at `at_ms` after start: an active check or a request outcome.
    #[derive(Clone, Copy)]
    enum Ev {
        Check(C),
        Req(R),
        Tick,
    }

    fn run(events: &[(u64, Ev)]) -> (ServerHealth, Vec<Transition>) {
        let t0 = Instant::now();
        let mut h = ServerHealth::new(HealthConfig::default(), t0);
        let mut ts = Vec::new();
        for &(at, ev) in events {
            let now = t0 + ms(at);
            let t = match ev {
                Ev::Check(c) => h.observe_check(now, c),
                Ev::Req(r) => h.observe_request(now, r),
                Ev::Tick => h.tick(now),
            };
            ts.extend(t);
        }
        (h, ts)
    }

    fn ok(l: u64) -> Ev {
        Ev::Check(C::Ok { latency: ms(l) })
    }
    fn ans(l: u64) -> Ev {
        Ev::Req(R::Answered { latency: ms(l) })
    }

    #[test]
    fn state_table() {
        use Ev::*;
        type Case = (&'static str, Vec<(u64, Ev)>, HealthState, Option<DeadCause>);
        let cases: Vec<Case> = vec![
            ("fresh server", vec![], Healthy, None),
            (
                "fast answers",
                vec![(0, ok(50)), (10, ans(80))],
                Healthy,
                None,
            ),
            (
                "two refusals are not dead",
                vec![(0, Check(C::Refused)), (1, Req(R::Refused))],
                Healthy,
                None,
            ),
            (
                "three refusals",
                vec![
                    (0, Check(C::Refused)),
                    (1, Req(R::Reset)),
                    (2, Req(R::Refused)),
                ],
                Dead,
                Some(DeadCause::Refused),
            ),
            (
                "refusals broken by an answer",
                vec![
                    (0, Req(R::Refused)),
                    (1, Req(R::Refused)),
                    (2, ans(10)),
                    (3, Req(R::Refused)),
                ],
                Healthy,
                None,
            ),
            (
                "slow answers",
                (0..10).map(|i| (i * 100, ans(5000))).collect(),
                Slow,
                None,
            ),
            (
                "checks time out, requests answer: slow",
                vec![
                    (0, Check(C::Timeout)),
                    (3000, Check(C::Timeout)),
                    (5000, ans(300)),
                    (6000, Check(C::Timeout)),
                    (40_000, ans(300)),
                    (45_000, Tick),
                ],
                Slow,
                None,
            ),
            (
                "timeouts but not yet silent",
                vec![
                    (0, Check(C::Timeout)),
                    (3000, Check(C::Timeout)),
                    (6000, Check(C::Timeout)),
                ],
                Slow,
                None,
            ),
            (
                "timeouts and silence: dead",
                vec![
                    (0, Check(C::Timeout)),
                    (3000, Check(C::Timeout)),
                    (6000, Check(C::Timeout)),
                    (31_000, Tick),
                ],
                Dead,
                Some(DeadCause::Silent),
            ),
            (
                "failing check status while answering",
                vec![
                    (0, Check(C::Failed { latency: ms(20) })),
                    (1, Check(C::Failed { latency: ms(20) })),
                    (2, Check(C::Failed { latency: ms(20) })),
                ],
                Slow,
                None,
            ),
            (
                "dead needs rise answers",
                vec![
                    (0, Req(R::Refused)),
                    (1, Req(R::Refused)),
                    (2, Req(R::Refused)),
                    (3, ok(10)),
                ],
                Dead,
                Some(DeadCause::Refused),
            ),
            (
                "dead, then failing checks answer: slow",
                vec![
                    (0, Req(R::Refused)),
                    (1, Req(R::Refused)),
                    (2, Req(R::Refused)),
                    (3, Check(C::Failed { latency: ms(20) })),
                    (4, Check(C::Failed { latency: ms(20) })),
                    (5, Check(C::Failed { latency: ms(20) })),
                ],
                Slow,
                None,
            ),
            (
                "dead then two answers",
                vec![
                    (0, Req(R::Refused)),
                    (1, Req(R::Refused)),
                    (2, Req(R::Refused)),
                    (3, ok(10)),
                    (4, ans(10)),
                ],
                Healthy,
                None,
            ),
        ];
        for (name, events, want, cause) in cases {
            let (h, _) = run(&events);
            assert_eq!((h.state(), h.dead_cause()), (want, cause), "{name}");
        }
    }

    #[test]
    fn slow_has_hysteresis() {
        let mut events: Vec<(u64, Ev)> = (0..10).map(|i| (i, ans(3000))).collect();
        // Average drifts down through 2 s; it must get under 1.6 s to recover.
        let (h, _) = run(&events);
        assert_eq!(h.state(), Slow);
        events.extend((10..15).map(|i| (i, ans(1500))));
        let (h, _) = run(&events);
        let avg = h.latency().unwrap();
        assert!(avg > ms(1600) && avg < ms(2000), "avg {avg:?}");
        assert_eq!(h.state(), Slow, "between 1.6 s and 2 s stays slow");
        events.extend((15..40).map(|i| (i, ans(500))));
        assert_eq!(run(&events).0.state(), Healthy);
    }

    #[test]
    fn recovery_is_reported_for_slow_start() {
        let events = [
            (0, Ev::Req(R::Refused)),
            (1, Ev::Req(R::Refused)),
            (2, Ev::Req(R::Refused)),
            (3, ok(10)),
            (4, ok(10)),
        ];
        let (_, ts) = run(&events);
        assert_eq!(ts.len(), 2);
        assert_eq!((ts[0].from, ts[0].to), (Healthy, Dead));
        assert!(ts[1].is_recovery());
    }

    #[test]
    fn pool_modes_and_admission() {
        let cases = [
            (vec![Healthy, Slow, Dead], PoolMode::Normal),
            (vec![Slow, Dead], PoolMode::Degraded),
            (vec![Dead, Dead], PoolMode::Panic),
            (vec![], PoolMode::Panic),
        ];
        for (states, want) in cases {
            assert_eq!(PoolMode::of(states.clone()), want, "{states:?}");
        }
        // (mode, server state, idempotent) -> admitted
        let admits = [
            (PoolMode::Normal, Slow, false, true),
            (PoolMode::Normal, Dead, true, false),
            (PoolMode::Degraded, Slow, false, true),
            (PoolMode::Panic, Dead, true, true),
            (PoolMode::Panic, Dead, false, false),
        ];
        for (mode, state, idem, want) in admits {
            assert_eq!(
                mode.admits(state, idem),
                want,
                "{mode:?} {state:?} idempotent={idem}"
            );
        }
        assert!(PoolMode::Normal.weight(Healthy, false) > PoolMode::Normal.weight(Slow, false));
        assert!(
            PoolMode::panic_preference(Some(DeadCause::Silent))
                < PoolMode::panic_preference(Some(DeadCause::Refused))
        );
    }

    #[test]
    fn orchestrator_signals() {
        let cases = [
            (PoolMode::Normal, false, PoolSignal::Ready, 200, 200),
            (PoolMode::Normal, true, PoolSignal::Busy, 200, 503),
            (PoolMode::Degraded, false, PoolSignal::Busy, 200, 503),
            (PoolMode::Panic, false, PoolSignal::Down, 503, 503),
        ];
        for (mode, saturated, want, live, ready) in cases {
            let s = PoolSignal::of(mode, saturated);
            assert_eq!(s, want);
            assert_eq!(s.livez_status().as_u16(), live, "{want:?} livez");
            assert_eq!(s.readyz_status().as_u16(), ready, "{want:?} readyz");
        }
    }
}
