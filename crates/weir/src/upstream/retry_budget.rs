//! Retry budget: retries are allowed only as a share of recent requests, so a
//! struggling upstream is not hit by a multiple of its load (incident 4: Envoy
//! retries multiplied requests while the service was at 90% CPU).
//!
//! Over a sliding window (default 10 s, in ten buckets) a pool may retry at
//! most `ratio × requests + min_per_second × window` times (default 20% plus
//! one per second, so a quiet pool can still retry a lone failed connect).
//! Every spend and every refusal is counted for metrics.
//!
//! This module decides *how many* retries; whether a given failure is *safe*
//! to retry (nothing sent, or an idempotent read whose kept-alive connection
//! closed before a response) is the forwarder's call
//! ([`crate::upstream::ForwardError::retryable`]), made before asking here.
//! Time is injected; wrap the budget in a `Mutex` to share it (every
//! operation is O(1)).

use std::time::{Duration, Instant};

/// Parameters of [`RetryBudget`].
#[derive(Debug, Clone, PartialEq)]
pub struct RetryBudgetConfig {
    /// Retries allowed per request in the window (0.2 = 20%).
    pub ratio: f64,
    /// Retries always allowed per second of window, on top of the ratio.
    pub min_per_second: u32,
    /// How far back requests and retries count.
    pub window: Duration,
}

impl Default for RetryBudgetConfig {
    fn default() -> Self {
        RetryBudgetConfig {
            ratio: 0.2,
            min_per_second: 1,
            window: Duration::from_secs(10),
        }
    }
}

/// Why a [`RetryBudgetConfig`] cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RetryBudgetError {
    #[error("retry budget ratio {0} is not in [0, 10]")]
    Ratio(f64),
    #[error("retry budget window {0:?} is not between 1 s and 60 s")]
    Window(Duration),
}

const BUCKETS: usize = 10;

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    requests: u64,
    retries: u64,
}

/// A sliding-window retry budget for one pool.
#[derive(Debug, Clone)]
pub struct RetryBudget {
    config: RetryBudgetConfig,
    width: Duration,
    epoch: Instant,
    /// Index (in bucket widths since `epoch`) of the newest bucket.
    head: u64,
    buckets: [Bucket; BUCKETS],
    spent_total: u64,
    denied_total: u64,
}

impl RetryBudget {
    pub fn new(config: RetryBudgetConfig, now: Instant) -> Result<RetryBudget, RetryBudgetError> {
        if !(0.0..=10.0).contains(&config.ratio) {
            return Err(RetryBudgetError::Ratio(config.ratio));
        }
        if config.window < Duration::from_secs(1) || config.window > Duration::from_secs(60) {
            return Err(RetryBudgetError::Window(config.window));
        }
        Ok(RetryBudget {
            width: config.window / BUCKETS as u32,
            config,
            epoch: now,
            head: 0,
            buckets: [Bucket::default(); BUCKETS],
            spent_total: 0,
            denied_total: 0,
        })
    }

    /// Counts one original (non-retry) request.
    pub fn record_request(&mut self, now: Instant) {
        self.advance(now);
        self.buckets[(self.head % BUCKETS as u64) as usize].requests += 1;
    }

    /// Spends one retry if the budget allows; `false` means do not retry.
    pub fn try_spend(&mut self, now: Instant) -> bool {
        self.advance(now);
        let (requests, retries) = self.totals();
        let allowed = self.config.ratio * requests as f64
            + self.config.min_per_second as f64 * self.config.window.as_secs_f64();
        if (retries as f64) < allowed.floor() {
            self.buckets[(self.head % BUCKETS as u64) as usize].retries += 1;
            self.spent_total += 1;
            true
        } else {
            self.denied_total += 1;
            false
        }
    }

    /// Retries spent since creation (`weir_retries_total`).
    pub fn spent_total(&self) -> u64 {
        self.spent_total
    }

    /// Retries refused for lack of budget (`weir_retries_denied_total`).
    pub fn denied_total(&self) -> u64 {
        self.denied_total
    }

    /// Requests and retries in the current window.
    pub fn totals(&self) -> (u64, u64) {
        self.buckets
            .iter()
            .fold((0, 0), |(q, r), b| (q + b.requests, r + b.retries))
    }

    fn advance(&mut self, now: Instant) {
        let width = self.width.as_nanos().max(1);
        let index = (now.saturating_duration_since(self.epoch).as_nanos() / width) as u64;
        if index <= self.head {
            return;
        }
        // Clear the buckets that slid out, at most all of them.
        let stale = (index - self.head).min(BUCKETS as u64);
        for i in 1..=stale {
            self.buckets[((self.head + i) % BUCKETS as u64) as usize] = Bucket::default();
        }
        self.head = index;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(ratio: f64, min_per_second: u32, t0: Instant) -> RetryBudget {
        let cfg = RetryBudgetConfig {
            ratio,
            min_per_second,
            window: Duration::from_secs(10),
        };
        RetryBudget::new(cfg, t0).unwrap()
    }

    fn spend_all(b: &mut RetryBudget, now: Instant) -> u32 {
        let mut n = 0;
        while b.try_spend(now) {
            n += 1;
        }
        n
    }

    #[test]
    fn twenty_percent_of_requests() {
        let t0 = Instant::now();
        let mut b = budget(0.2, 0, t0);
        for _ in 0..100 {
            b.record_request(t0);
        }
        assert_eq!(spend_all(&mut b, t0), 20);
        assert_eq!((b.spent_total(), b.denied_total()), (20, 1));
    }

    #[test]
    fn minimum_allows_retries_when_quiet() {
        let t0 = Instant::now();
        let mut b = budget(0.2, 1, t0);
        assert_eq!(spend_all(&mut b, t0), 10, "1/s over a 10 s window");
    }

    #[test]
    fn requests_and_retries_expire_with_the_window() {
        let t0 = Instant::now();
        let mut b = budget(0.2, 0, t0);
        for _ in 0..50 {
            b.record_request(t0);
        }
        assert_eq!(spend_all(&mut b, t0), 10);
        // 9.9 s later the deposits still count and the spends too.
        let later = t0 + Duration::from_millis(9_900);
        assert!(!b.try_spend(later));
        // After the window both have slid out.
        let after = t0 + Duration::from_secs(11);
        assert_eq!(b.totals(), (50, 10), "not advanced until touched");
        assert!(!b.try_spend(after));
        assert_eq!(b.totals(), (0, 0));
        for _ in 0..10 {
            b.record_request(after);
        }
        assert_eq!(spend_all(&mut b, after), 2);
    }

    #[test]
    fn partial_slide_keeps_recent_buckets() {
        let t0 = Instant::now();
        let mut b = budget(1.0, 0, t0);
        for s in 0..10u64 {
            b.record_request(t0 + Duration::from_secs(s));
        }
        assert_eq!(b.totals().0, 10);
        b.record_request(t0 + Duration::from_millis(12_500));
        // Buckets for seconds 0, 1 and 2 have slid out.
        assert_eq!(b.totals().0, 8);
    }

    #[test]
    fn rejects_bad_config() {
        let t0 = Instant::now();
        let bad = [
            RetryBudgetConfig {
                ratio: -0.1,
                ..RetryBudgetConfig::default()
            },
            RetryBudgetConfig {
                window: Duration::from_millis(10),
                ..RetryBudgetConfig::default()
            },
            RetryBudgetConfig {
                window: Duration::from_secs(120),
                ..RetryBudgetConfig::default()
            },
        ];
        for cfg in bad {
            assert!(RetryBudget::new(cfg.clone(), t0).is_err(), "{cfg:?}");
        }
    }
}
