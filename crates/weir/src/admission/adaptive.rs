//! Adaptive concurrency: a latency-gradient limit in the style of Netflix's
//! Gradient2, for pools whose `max_in_flight` is not configured.
//!
//! Once per sample window (at least `window` long and `min_samples` samples)
//! the limit moves by the ratio of the long-term latency to this window's:
//!
//! ```text
//! gradient  = clamp(tolerance × long_rtt / short_rtt, 0.5, 1.0)
//! candidate = limit × gradient + headroom   // sqrt(limit) when gradient = 1, else 0
//! limit     = (1 − smoothing) × limit + smoothing × candidate, within [min, max]
//! ```
//!
//! Flat latency keeps the gradient at 1 and the limit grows by the headroom;
//! latency rising by more than the tolerance shrinks it. The long-term average
//! is an exponential average over `long_window` windows, pulled down quickly
//! (×0.95 per window) when the short latency falls far below it, so recovery
//! after a slow spell is not delayed by memory of the spell. A window with a
//! dropped request (upstream timeout, overload 503, reset) backs off
//! multiplicatively instead. A window in which fewer than half of the slots
//! were used cannot show whether more concurrency helps, so it never raises
//! the limit (the app-limited rule).
//!
//! Time is injected (`now` on every sample). This module holds no locks and
//! knows nothing about queues; [`crate::admission::queue`] feeds it.
//!
//! Known limit, as in Gradient2: latency that rises and then *stays* high is
//! slowly learned as the new normal and the limit creeps up again; the hard
//! ceiling (the app's workers minus the health reserve) bounds that.

use std::time::{Duration, Instant};

/// Parameters of [`GradientLimit`].
#[derive(Debug, Clone, PartialEq)]
pub struct GradientConfig {
    pub initial: usize,
    pub min: usize,
    pub max: usize,
    /// Share of each new estimate taken into the limit (0 < s ≤ 1).
    pub smoothing: f64,
    /// How much slower than the long-term latency a window may be before the
    /// limit shrinks (≥ 1).
    pub tolerance: f64,
    /// Windows averaged by the long-term latency.
    pub long_window: u32,
    /// Shortest sample window.
    pub window: Duration,
    /// Fewest samples in a window before it counts.
    pub min_samples: u32,
    /// Multiplier applied when a window saw a dropped request (0 < b < 1).
    pub backoff: f64,
}

impl Default for GradientConfig {
    /// Gradient2's published defaults where they apply (smoothing 0.2,
    /// tolerance 1.5, long window 600); `initial` 4 and `max` 64 suit an app
    /// with tens of workers, not thousands of threads.
    fn default() -> Self {
        GradientConfig {
            initial: 4,
            min: 1,
            max: 64,
            smoothing: 0.2,
            tolerance: 1.5,
            long_window: 600,
            window: Duration::from_secs(1),
            min_samples: 10,
            backoff: 0.9,
        }
    }
}

/// Why a [`GradientConfig`] cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GradientConfigError {
    #[error("adaptive limit bounds are inverted or zero: min {min}, initial {initial}, max {max}")]
    Bounds {
        min: usize,
        initial: usize,
        max: usize,
    },
    #[error("adaptive smoothing {0} is not in (0, 1]")]
    Smoothing(f64),
    #[error("adaptive tolerance {0} is below 1")]
    Tolerance(f64),
    #[error("adaptive backoff {0} is not in (0, 1)")]
    Backoff(f64),
    #[error("adaptive long_window must be at least 1 window")]
    LongWindow,
}

impl GradientConfig {
    pub fn validate(&self) -> Result<(), GradientConfigError> {
        if self.min == 0 || self.min > self.initial || self.initial > self.max {
            return Err(GradientConfigError::Bounds {
                min: self.min,
                initial: self.initial,
                max: self.max,
            });
        }
        if !(self.smoothing > 0.0 && self.smoothing <= 1.0) {
            return Err(GradientConfigError::Smoothing(self.smoothing));
        }
        if self.tolerance.is_nan() || self.tolerance < 1.0 {
            return Err(GradientConfigError::Tolerance(self.tolerance));
        }
        if !(self.backoff > 0.0 && self.backoff < 1.0) {
            return Err(GradientConfigError::Backoff(self.backoff));
        }
        if self.long_window == 0 {
            return Err(GradientConfigError::LongWindow);
        }
        Ok(())
    }
}

/// One completed request, as the limiter sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub latency: Duration,
    /// Requests in flight when this one started (including itself).
    pub in_flight: usize,
    /// The upstream shed or lost the request (timeout, 503 overload, reset).
    pub dropped: bool,
}

#[derive(Debug, Clone)]
struct Window {
    start: Instant,
    count: u32,
    sum_secs: f64,
    dropped: bool,
    max_in_flight: usize,
}

impl Window {
    fn new(start: Instant) -> Window {
        Window {
            start,
            count: 0,
            sum_secs: 0.0,
            dropped: false,
            max_in_flight: 0,
        }
    }
}

/// A latency-gradient concurrency limit.
#[derive(Debug, Clone)]
pub struct GradientLimit {
    config: GradientConfig,
    limit: f64,
    long_rtt: Option<f64>,
    windows_seen: u32,
    window: Window,
}

impl GradientLimit {
    pub fn new(config: GradientConfig, now: Instant) -> Result<GradientLimit, GradientConfigError> {
        config.validate()?;
        Ok(GradientLimit {
            limit: config.initial as f64,
            config,
            long_rtt: None,
            windows_seen: 0,
            window: Window::new(now),
        })
    }

    /// The current limit (whole slots).
    pub fn limit(&self) -> usize {
        (self.limit.floor() as usize).clamp(self.config.min, self.config.max)
    }

    /// The long-term latency the gradient compares against, once known.
    pub fn long_rtt(&self) -> Option<Duration> {
        self.long_rtt.map(Duration::from_secs_f64)
    }

    /// Records a completed request; returns the new limit when a window closed.
    pub fn on_sample(&mut self, now: Instant, sample: Sample) -> Option<usize> {
        let w = &mut self.window;
        w.count += 1;
        w.sum_secs += sample.latency.as_secs_f64();
        w.dropped |= sample.dropped;
        w.max_in_flight = w.max_in_flight.max(sample.in_flight);
        let elapsed = now.saturating_duration_since(w.start);
        if elapsed < self.config.window || (w.count < self.config.min_samples && !w.dropped) {
            return None;
        }
        let closed = std::mem::replace(&mut self.window, Window::new(now));
        self.close_window(&closed);
        Some(self.limit())
    }

    fn close_window(&mut self, w: &Window) {
        let cfg = &self.config;
        if w.dropped {
            self.limit = (self.limit * cfg.backoff).max(cfg.min as f64);
            return;
        }
        // A zero-latency window (clock granularity) carries no signal.
        let short = w.sum_secs / w.count.max(1) as f64;
        if short <= 0.0 {
            return;
        }
        self.windows_seen = self.windows_seen.saturating_add(1);
        let long = match self.long_rtt {
            None => short,
            Some(long) => {
                // Plain mean while warming up, then an exponential average.
                let n = self.windows_seen.min(cfg.long_window) as f64;
                let alpha = if self.windows_seen <= 10 {
                    1.0 / n
                } else {
                    2.0 / (cfg.long_window as f64 + 1.0)
                };
                let mut long = long + alpha * (short - long);
                if long / short > 2.0 {
                    long *= 0.95;
                }
                long
            }
        };
        self.long_rtt = Some(long);
        let gradient = (cfg.tolerance * long / short).clamp(0.5, 1.0);
        // Headroom only while latency is within tolerance: with tens of
        // workers, a sqrt term added under pressure would pin the limit near 4
        // however slow the app gets (the fixed point of 0.5·L + sqrt(L)).
        let headroom = if gradient >= 1.0 {
            self.limit.sqrt()
        } else {
            0.0
        };
        let candidate = self.limit * gradient + headroom;
        let mut next = self.limit * (1.0 - cfg.smoothing) + candidate * cfg.smoothing;
        let app_limited = (w.max_in_flight as f64) < self.limit / 2.0;
        if app_limited && next > self.limit {
            next = self.limit;
        }
        self.limit = next.clamp(cfg.min as f64, cfg.max as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Feeds `windows` one-second windows of 20 samples at `latency`, with
    /// in-flight equal to the current limit (saturated) unless `in_flight`.
    fn drive(
        g: &mut GradientLimit,
        now: &mut Instant,
        windows: u32,
        latency: Duration,
        in_flight: Option<usize>,
    ) {
        for _ in 0..windows {
            for _ in 0..20 {
                *now += ms(50);
                let sample = Sample {
                    latency,
                    in_flight: in_flight.unwrap_or(g.limit()),
                    dropped: false,
                };
                g.on_sample(*now, sample);
            }
        }
    }

    fn limiter(now: Instant) -> GradientLimit {
        GradientLimit::new(GradientConfig::default(), now).unwrap()
    }

    #[test]
    fn grows_while_latency_is_flat() {
        let mut now = Instant::now();
        let mut g = limiter(now);
        drive(&mut g, &mut now, 30, ms(100), None);
        assert!(g.limit() > 10, "limit {}", g.limit());
    }

    #[test]
    fn shrinks_when_latency_rises() {
        let mut now = Instant::now();
        let mut g = limiter(now);
        drive(&mut g, &mut now, 40, ms(100), None);
        let before = g.limit();
        drive(&mut g, &mut now, 8, ms(400), None);
        let after = g.limit();
        assert!(after < before * 3 / 4, "before {before}, after {after}");
    }

    #[test]
    fn recovers_after_latency_falls_back() {
        let mut now = Instant::now();
        let mut g = limiter(now);
        drive(&mut g, &mut now, 40, ms(100), None);
        drive(&mut g, &mut now, 10, ms(400), None);
        let low = g.limit();
        drive(&mut g, &mut now, 20, ms(100), None);
        assert!(g.limit() > low, "low {low}, now {}", g.limit());
    }

    #[test]
    fn does_not_grow_when_app_limited() {
        let mut now = Instant::now();
        let mut g = limiter(now);
        drive(&mut g, &mut now, 30, ms(100), Some(1));
        assert_eq!(g.limit(), 4);
    }

    #[test]
    fn drops_back_off() {
        let mut now = Instant::now();
        let mut g = limiter(now);
        drive(&mut g, &mut now, 30, ms(100), None);
        let before = g.limit();
        now += ms(1100);
        let sample = Sample {
            latency: ms(100),
            in_flight: before,
            dropped: true,
        };
        let after = g.on_sample(now, sample).unwrap_or(usize::MAX);
        // ×0.9 of the unrounded limit: within one of ×0.9 of the rounded one.
        assert!(
            after < before && after + 1 >= before * 9 / 10,
            "{before} -> {after}"
        );
    }

    #[test]
    fn stays_within_bounds() {
        let mut now = Instant::now();
        let cfg = GradientConfig {
            min: 2,
            initial: 3,
            max: 8,
            ..GradientConfig::default()
        };
        let mut g = GradientLimit::new(cfg, now).unwrap();
        drive(&mut g, &mut now, 200, ms(10), None);
        assert_eq!(g.limit(), 8);
        drive(&mut g, &mut now, 200, ms(5000), None);
        assert_eq!(g.limit(), 2);
    }

    #[test]
    fn windows_need_time_and_samples() {
        let now = Instant::now();
        let mut g = limiter(now);
        let s = Sample {
            latency: ms(100),
            in_flight: 4,
            dropped: false,
        };
        assert_eq!(g.on_sample(now + ms(100), s), None, "too early");
        for _ in 0..5 {
            assert_eq!(g.on_sample(now + ms(2000), s), None, "too few samples");
        }
    }

    #[test]
    fn rejects_bad_config() {
        let now = Instant::now();
        let cases = [
            GradientConfig {
                min: 0,
                ..GradientConfig::default()
            },
            GradientConfig {
                initial: 100,
                ..GradientConfig::default()
            },
            GradientConfig {
                smoothing: 0.0,
                ..GradientConfig::default()
            },
            GradientConfig {
                tolerance: 0.5,
                ..GradientConfig::default()
            },
            GradientConfig {
                backoff: 1.0,
                ..GradientConfig::default()
            },
            GradientConfig {
                long_window: 0,
                ..GradientConfig::default()
            },
        ];
        for cfg in cases {
            assert!(GradientLimit::new(cfg.clone(), now).is_err(), "{cfg:?}");
        }
    }
}
