//! GCRA (generic cell rate algorithm): the arithmetic of one rate limit.
//!
//! A [`Quota`] of `count` per `period` with a `burst` becomes two numbers: the
//! emission interval `T = period / count` (the spacing of a steady stream) and
//! the tolerance `τ = burst · T` (how far ahead of schedule a client may get).
//! The whole state of a key is one number, its theoretical arrival time (TAT):
//! the time at which the key's bucket would be full again. A request of `cost`
//! is allowed when `max(TAT, now) + cost·T - now <= τ`, and then moves the TAT
//! there. So a fresh key may send `burst` requests at once, then one per `T`.
//!
//! A TAT at or before `now` says exactly what an absent key says (the bucket is
//! full): that is why stores may drop such keys without changing any decision.
//!
//! Time is a [`MonoTime`] (nanoseconds on weir's own monotonic clock) and comes
//! from a [`Clock`] passed in by the caller, so tests move time by hand.
//!
//! This module owns no keys and no storage (see [`super::store`]), and it
//! formats no headers: it hands out the numbers (`remaining`, `reset`,
//! `retry_after`) that the response stage writes as `RateLimit`/`Retry-After`.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The longest tolerance (`burst · T`) a quota may have.
///
/// A key's state lives at most `τ` after its last request, so this bounds how
/// long an idle key can occupy a store; a day-long window with a burst of a few
/// days' worth still fits. Longer looks like a unit mistake in the config.
pub const MAX_TOLERANCE: Duration = Duration::from_secs(7 * 24 * 3600);

/// A point on weir's monotonic clock, in nanoseconds since the process epoch.
///
/// Not comparable across processes: snapshots rebase these through the wall
/// clock (see [`super::snapshot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MonoTime(u64);

impl MonoTime {
    /// The process epoch; also the TAT of a key that has never been seen.
    pub const ZERO: MonoTime = MonoTime(0);

    pub const fn from_nanos(nanos: u64) -> MonoTime {
        MonoTime(nanos)
    }

    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    pub fn saturating_add(self, d: Duration) -> MonoTime {
        MonoTime(self.0.saturating_add(duration_nanos(d)))
    }

    /// `self - earlier`, or zero when `earlier` is later.
    pub fn saturating_duration_since(self, earlier: MonoTime) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl std::ops::Add<Duration> for MonoTime {
    type Output = MonoTime;

    /// Saturating: a TAT never wraps around to the past.
    fn add(self, d: Duration) -> MonoTime {
        self.saturating_add(d)
    }
}

/// A source of [`MonoTime`]; injected so that no test sleeps.
pub trait Clock: Send + Sync {
    fn now(&self) -> MonoTime;
}

/// The real clock: [`Instant`] measured from a fixed process epoch.
#[derive(Debug, Clone, Copy, Default)]
pub struct MonotonicClock;

impl MonotonicClock {
    /// The epoch is taken on first use, so `now()` starts near zero and a `u64`
    /// of nanoseconds lasts 584 years.
    fn epoch() -> Instant {
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        *EPOCH.get_or_init(Instant::now)
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> MonoTime {
        MonoTime(duration_nanos(Self::epoch().elapsed()))
    }
}

/// A clock that moves only when told to; for tests and simulations.
#[derive(Debug, Default)]
pub struct ManualClock {
    nanos: AtomicU64,
}

impl ManualClock {
    pub fn new(start: MonoTime) -> ManualClock {
        ManualClock {
            nanos: AtomicU64::new(start.0),
        }
    }

    pub fn advance(&self, by: Duration) {
        self.nanos.fetch_add(duration_nanos(by), Ordering::Relaxed);
    }

    pub fn set(&self, to: MonoTime) {
        self.nanos.store(to.0, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> MonoTime {
        MonoTime(self.nanos.load(Ordering::Relaxed))
    }
}

/// A quota that cannot be turned into a GCRA; messages name the bad value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    #[error("rate count is 0 per {period:?}: a limit must allow at least 1 request")]
    ZeroCount { period: Duration },
    #[error("rate period is zero (count {count}): a period must be longer than zero")]
    ZeroPeriod { count: u32 },
    #[error("burst is 0: a limit must allow a burst of at least 1 request")]
    ZeroBurst,
    #[error("rate {count} per {period:?} is faster than one request per nanosecond")]
    TooFast { count: u32, period: Duration },
    #[error(
        "burst {burst} at {count} per {period:?} takes {tolerance:?} to refill, \
         more than the maximum of {max:?}"
    )]
    ToleranceTooLong {
        count: u32,
        period: Duration,
        burst: u32,
        tolerance: Duration,
        max: Duration,
    },
}

/// A rate limit: `count` requests per `period`, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    count: u32,
    period: Duration,
    burst: u32,
    /// `T`, nanoseconds between requests of a steady stream.
    emission_ns: u64,
    /// `τ = burst · T`, nanoseconds.
    tolerance_ns: u64,
}

impl Quota {
    /// `count` per `period`, allowing `burst` at once (often `burst == count`).
    ///
    /// `T` is rounded up to whole nanoseconds, so a quota never admits more
    /// than stated (it may admit a few nanoseconds' worth less).
    pub fn new(count: u32, period: Duration, burst: u32) -> Result<Quota, QuotaError> {
        if count == 0 {
            return Err(QuotaError::ZeroCount { period });
        }
        if period.is_zero() {
            return Err(QuotaError::ZeroPeriod { count });
        }
        if burst == 0 {
            return Err(QuotaError::ZeroBurst);
        }
        let period_ns = period.as_nanos();
        if period_ns < u128::from(count) {
            return Err(QuotaError::TooFast { count, period });
        }
        let emission_ns = period_ns.div_ceil(u128::from(count));
        let tolerance_ns = emission_ns.saturating_mul(u128::from(burst));
        let too_long = || QuotaError::ToleranceTooLong {
            count,
            period,
            burst,
            tolerance: Duration::from_nanos(u64::try_from(tolerance_ns).unwrap_or(u64::MAX)),
            max: MAX_TOLERANCE,
        };
        if tolerance_ns > MAX_TOLERANCE.as_nanos() {
            return Err(too_long());
        }
        // Both fit: tolerance <= MAX_TOLERANCE (~6e14 ns) and emission <= tolerance.
        let emission_ns = u64::try_from(emission_ns).map_err(|_| too_long())?;
        let tolerance_ns = u64::try_from(tolerance_ns).map_err(|_| too_long())?;
        Ok(Quota {
            count,
            period,
            burst,
            emission_ns,
            tolerance_ns,
        })
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    pub fn period(&self) -> Duration {
        self.period
    }

    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// `T`: the spacing of a steady stream at exactly the rate.
    pub fn emission_interval(&self) -> Duration {
        Duration::from_nanos(self.emission_ns)
    }

    /// `τ = burst · T`: the time an idle key takes to refill completely, and
    /// the longest a key's state can matter after its last request.
    pub fn tolerance(&self) -> Duration {
        Duration::from_nanos(self.tolerance_ns)
    }

    /// Decides a request of `cost` for a key whose TAT is `tat`, and moves
    /// `tat` forward when it is allowed (a rejection leaves it untouched, so
    /// rejected requests do not push a client's recovery further away).
    ///
    /// `cost == 0` only reads: it reports `remaining` and `reset` as they are.
    pub fn check(&self, tat: &mut MonoTime, now: MonoTime, cost: u32) -> Outcome {
        let now_ns = now.0;
        let start = tat.0.max(now_ns);
        if cost > self.burst {
            return Outcome::CostExceedsBurst {
                cost,
                burst: self.burst,
            };
        }
        // cost <= burst, so cost · T <= τ <= MAX_TOLERANCE: no overflow.
        let new_tat = start.saturating_add(u64::from(cost) * self.emission_ns);
        let allow_at = new_tat.saturating_sub(self.tolerance_ns);
        if now_ns < allow_at {
            return Outcome::Rejected {
                retry_after: Duration::from_nanos(allow_at - now_ns),
                reset: Duration::from_nanos(start - now_ns),
            };
        }
        if cost > 0 {
            tat.0 = new_tat;
        }
        Outcome::Allowed {
            remaining: self.remaining_from(new_tat, now_ns),
            reset: Duration::from_nanos(new_tat - now_ns),
        }
    }

    /// How far an allowed request of `cost` moves a TAT forward.
    pub fn charge_ns(&self, cost: u32) -> u64 {
        u64::from(cost) * self.emission_ns
    }

    /// How many cost-1 requests a key with TAT `tat` may still send at `now`.
    pub fn remaining(&self, tat: MonoTime, now: MonoTime) -> u32 {
        self.remaining_from(tat.0.max(now.0), now.0)
    }

    /// Time until a key with TAT `tat` is back to its full burst.
    pub fn reset(&self, tat: MonoTime, now: MonoTime) -> Duration {
        tat.saturating_duration_since(now)
    }

    /// The `RateLimit-Policy` pair (quota units, window seconds): a full
    /// burst, refilled over `τ` (rounded up to whole seconds).
    pub fn policy_header_values(&self) -> (u32, u64) {
        (self.burst, self.tolerance_ns.div_ceil(1_000_000_000))
    }

    fn remaining_from(&self, tat_ns: u64, now_ns: u64) -> u32 {
        let used = tat_ns.saturating_sub(now_ns);
        let left = self.tolerance_ns.saturating_sub(used) / self.emission_ns;
        // left <= burst, which is a u32.
        u32::try_from(left).unwrap_or(self.burst)
    }
}

/// The decision for one request against one quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted. `remaining` more cost-1 requests fit now; the bucket is full
    /// again after `reset` (the `r` and `t` of an IETF `RateLimit` header).
    Allowed { remaining: u32, reset: Duration },
    /// Refused; the same request is allowed exactly `retry_after` from now
    /// (if nothing else is admitted for the key meanwhile).
    Rejected {
        retry_after: Duration,
        reset: Duration,
    },
    /// `cost` is larger than `burst`, so no amount of waiting admits it: a
    /// configuration error that the policy layer should report, not retry.
    CostExceedsBurst { cost: u32, burst: u32 },
}

impl Outcome {
    pub fn is_allowed(&self) -> bool {
        matches!(self, Outcome::Allowed { .. })
    }
}

fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const MS: Duration = Duration::from_millis(1);

    fn at(d: Duration) -> MonoTime {
        MonoTime::ZERO.saturating_add(d)
    }

    fn allowed(remaining: u32, reset: Duration) -> Outcome {
        Outcome::Allowed { remaining, reset }
    }

    fn rejected(retry_after: Duration, reset: Duration) -> Outcome {
        Outcome::Rejected { retry_after, reset }
    }

    #[test]
    fn quota_derives_interval_and_tolerance() {
        // (count, period, burst) -> (T, τ)
        let cases = [
            (10, S, 10, 100 * MS, S),
            (300, 600 * S, 300, 2 * S, 600 * S),
            (1, 86_400 * S, 5, 86_400 * S, 5 * 86_400 * S),
            (
                3,
                S,
                1,
                Duration::from_nanos(333_333_334),
                Duration::from_nanos(333_333_334),
            ),
            (
                1_000_000_000,
                S,
                1,
                Duration::from_nanos(1),
                Duration::from_nanos(1),
            ),
        ];
        for (count, period, burst, t, tau) in cases {
            let q = Quota::new(count, period, burst).unwrap();
            assert_eq!(q.emission_interval(), t, "{count}/{period:?}");
            assert_eq!(q.tolerance(), tau, "{count}/{period:?}");
        }
    }

    #[test]
    fn quota_rejects_bad_values() {
        let cases: [(u32, Duration, u32, QuotaError); 5] = [
            (0, S, 1, QuotaError::ZeroCount { period: S }),
            (1, Duration::ZERO, 1, QuotaError::ZeroPeriod { count: 1 }),
            (1, S, 0, QuotaError::ZeroBurst),
            (
                2,
                Duration::from_nanos(1),
                1,
                QuotaError::TooFast {
                    count: 2,
                    period: Duration::from_nanos(1),
                },
            ),
            (
                1,
                86_400 * S,
                8,
                QuotaError::ToleranceTooLong {
                    count: 1,
                    period: 86_400 * S,
                    burst: 8,
                    tolerance: 8 * 86_400 * S,
                    max: MAX_TOLERANCE,
                },
            ),
        ];
        for (count, period, burst, err) in cases {
            assert_eq!(Quota::new(count, period, burst), Err(err.clone()));
            assert!(!err.to_string().is_empty());
        }
    }

    /// One line per step: (time since start, cost, expected outcome).
    fn run(q: Quota, steps: &[(Duration, u32, Outcome)]) {
        let mut tat = MonoTime::ZERO;
        let start = Duration::from_secs(1000);
        for (i, &(t, cost, want)) in steps.iter().enumerate() {
            let got = q.check(&mut tat, at(start + t), cost);
            assert_eq!(got, want, "step {i} at +{t:?}");
        }
    }

    #[test]
    fn burst_then_reject_with_exact_retry_after() {
        // 10 per second, burst 3: T = 100 ms, τ = 300 ms.
        let q = Quota::new(10, S, 3).unwrap();
        let z = Duration::ZERO;
        run(
            q,
            &[
                (z, 1, allowed(2, 100 * MS)),
                (z, 1, allowed(1, 200 * MS)),
                (z, 1, allowed(0, 300 * MS)),
                (z, 1, rejected(100 * MS, 300 * MS)),
                (50 * MS, 1, rejected(50 * MS, 250 * MS)),
                // one nanosecond early is still too early; on time is allowed
                (
                    100 * MS - Duration::from_nanos(1),
                    1,
                    rejected(Duration::from_nanos(1), 200 * MS + Duration::from_nanos(1)),
                ),
                (100 * MS, 1, allowed(0, 300 * MS)),
                (100 * MS, 1, rejected(100 * MS, 300 * MS)),
            ],
        );
    }

    #[test]
    fn steady_rate_at_exactly_t_is_always_allowed() {
        let q = Quota::new(300, 600 * S, 1).unwrap(); // one per 2 s, no burst
        let mut tat = MonoTime::ZERO;
        for i in 0..1000u32 {
            let now = at(Duration::from_secs(10 + 2 * u64::from(i)));
            assert_eq!(q.check(&mut tat, now, 1), allowed(0, 2 * S), "request {i}");
            let early = now.saturating_add(S);
            assert_eq!(q.check(&mut tat, early, 1), rejected(S, S), "extra {i}");
        }
    }

    #[test]
    fn cost_counts_as_several_requests() {
        let q = Quota::new(10, S, 5).unwrap();
        let z = Duration::ZERO;
        run(
            q,
            &[
                (z, 3, allowed(2, 300 * MS)),
                (z, 3, rejected(100 * MS, 300 * MS)),
                (z, 0, allowed(2, 300 * MS)),
                (z, 2, allowed(0, 500 * MS)),
                (z, 6, Outcome::CostExceedsBurst { cost: 6, burst: 5 }),
                (500 * MS, 5, allowed(0, 500 * MS)),
            ],
        );
    }

    #[test]
    fn day_window_refills_after_a_day() {
        let q = Quota::new(2, 86_400 * S, 2).unwrap(); // T = 12 h
        let h = 3600 * S;
        let z = Duration::ZERO;
        run(
            q,
            &[
                (z, 1, allowed(1, 12 * h)),
                (z, 1, allowed(0, 24 * h)),
                (z, 1, rejected(12 * h, 24 * h)),
                (24 * h, 1, allowed(1, 12 * h)),
                (24 * h, 1, allowed(0, 24 * h)),
            ],
        );
    }

    #[test]
    fn past_tat_is_the_same_as_no_state() {
        // Why stores may drop expired keys: every answer matches a fresh key.
        let q = Quota::new(10, S, 3).unwrap();
        let now = at(100 * S);
        for old in [MonoTime::ZERO, at(S), at(100 * S)] {
            let (mut a, mut b) = (old, MonoTime::ZERO);
            assert_eq!(q.check(&mut a, now, 1), q.check(&mut b, now, 1));
            assert_eq!(a, b);
            assert_eq!(q.remaining(old, now), 3);
            assert_eq!(q.reset(old, now), Duration::ZERO);
        }
    }

    #[test]
    fn rejection_does_not_move_tat() {
        let q = Quota::new(1, S, 1).unwrap();
        let mut tat = MonoTime::ZERO;
        let now = at(5 * S);
        assert!(q.check(&mut tat, now, 1).is_allowed());
        let before = tat;
        for _ in 0..100 {
            assert!(!q.check(&mut tat, now, 1).is_allowed());
        }
        assert_eq!(tat, before);
    }

    #[test]
    fn policy_header_values_round_up() {
        assert_eq!(
            Quota::new(300, 600 * S, 300)
                .unwrap()
                .policy_header_values(),
            (300, 600)
        );
        assert_eq!(Quota::new(3, S, 1).unwrap().policy_header_values(), (1, 1));
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(at(S));
        assert_eq!(clock.now(), at(S));
        clock.advance(500 * MS);
        assert_eq!(clock.now(), at(1500 * MS));
        clock.set(at(10 * S));
        assert_eq!(clock.now(), at(10 * S));
        let real = MonotonicClock;
        let (a, b) = (real.now(), real.now());
        assert!(b >= a);
    }
}
