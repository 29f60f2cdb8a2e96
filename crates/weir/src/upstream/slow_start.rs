//! Slow start: ramping a new or recovered server in by what it *measurably*
//! handles, not only by the clock.
//!
//! Incident 2: a fresh php-fpm started with 2 workers and added one per
//! second; a full share of traffic at once overflowed its backlog and turned
//! a replacement into a minute of 502s. A time-only ramp (HAProxy's
//! `slowstart`) fixes that only if the ramp happens to be slower than the
//! server's own warm-up.
//!
//! [`SlowStart`] keeps a per-server concurrency cap that is the smaller of:
//! - a **capacity estimate**, AIMD on completions: +1/cap for each answer no
//!   slower than `latency_tolerance ×` the fastest answer seen (about +1 per
//!   round trip), ×`decrease` on a slower answer or an error (at most once per
//!   round trip, so one burst is not punished many times);
//! - a **time floor** on the ramp: the cap rises linearly from `initial` to
//!   `target` over `min_duration`, so even a fast-answering server is not
//!   handed its full share in its first second (caches cold, pools empty).
//!
//! When the estimate has reached `target` and `min_duration` has passed, the
//! ramp is done and the server is treated like any other. Time is injected;
//! the caller reports completions and asks for the cap.

use std::time::{Duration, Instant};

/// Parameters of [`SlowStart`].
#[derive(Debug, Clone, PartialEq)]
pub struct SlowStartConfig {
    /// Concurrency a new server starts with.
    pub initial: u32,
    /// Concurrency at full share (the server's worker count, or its share of
    /// the pool's admission limit).
    pub target: u32,
    /// Shortest ramp from `initial` to `target`.
    pub min_duration: Duration,
    /// An answer slower than this multiple of the fastest seen means the
    /// server is queueing: back off.
    pub latency_tolerance: f64,
    /// Multiplier on back-off (0 < d < 1).
    pub decrease: f64,
}

impl Default for SlowStartConfig {
    /// `initial` 1 and 10 s: a php-fpm that starts with 2 workers and adds
    /// one per second needs about 14 s to reach 16, and the capacity estimate
    /// follows it rather than the clock. Tolerance 1.5 lets the server queue
    /// about half a worker's worth before backing off.
    fn default() -> Self {
        SlowStartConfig {
            initial: 1,
            target: 16,
            min_duration: Duration::from_secs(10),
            latency_tolerance: 1.5,
            decrease: 0.7,
        }
    }
}

/// Why a [`SlowStartConfig`] cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SlowStartError {
    #[error("slow start initial {initial} must be between 1 and target {target}")]
    Bounds { initial: u32, target: u32 },
    #[error("slow start latency_tolerance {0} is below 1")]
    Tolerance(f64),
    #[error("slow start decrease {0} is not in (0, 1)")]
    Decrease(f64),
}

/// A finished request to the ramping server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub latency: Duration,
    /// False when it failed in a way that means overload (reset, refused,
    /// timeout, 503).
    pub ok: bool,
    /// Other requests still in flight to this server as it finished.
    pub in_flight: u32,
}

/// One server's ramp.
#[derive(Debug, Clone)]
pub struct SlowStart {
    config: SlowStartConfig,
    started: Instant,
    estimate: f64,
    fastest: Option<Duration>,
    last_cut: Option<Instant>,
    done: bool,
}

impl SlowStart {
    pub fn new(config: SlowStartConfig, now: Instant) -> Result<SlowStart, SlowStartError> {
        if config.initial == 0 || config.initial > config.target {
            return Err(SlowStartError::Bounds {
                initial: config.initial,
                target: config.target,
            });
        }
        if config.latency_tolerance.is_nan() || config.latency_tolerance < 1.0 {
            return Err(SlowStartError::Tolerance(config.latency_tolerance));
        }
        if !(config.decrease > 0.0 && config.decrease < 1.0) {
            return Err(SlowStartError::Decrease(config.decrease));
        }
        Ok(SlowStart {
            estimate: config.initial as f64,
            config,
            started: now,
            fastest: None,
            last_cut: None,
            done: false,
        })
    }

    /// Records a finished request to this server.
    pub fn on_completion(&mut self, now: Instant, done: Completion) {
        let Completion {
            latency,
            ok,
            in_flight,
        } = done;
        if self.done {
            return;
        }
        if ok {
            self.fastest = Some(self.fastest.map_or(latency, |f| f.min(latency)));
        }
        let fastest = self.fastest.unwrap_or(latency).as_secs_f64();
        let good = ok && latency.as_secs_f64() <= fastest * self.config.latency_tolerance;
        let target = self.config.target as f64;
        // Growing while the cap is not reached would prove nothing about
        // capacity: a server kept at 5 by the time floor says nothing about 16.
        let cap_reached = in_flight as f64 + 1.0 >= self.estimate.floor();
        if good && cap_reached {
            self.estimate = (self.estimate + 1.0 / self.estimate.max(1.0)).min(target);
        } else if !good {
            // A request that was already in flight at the last cut reports
            // the same congestion; cut once per round trip.
            let recently_cut = self
                .last_cut
                .is_some_and(|cut| now.saturating_duration_since(cut) < latency);
            if !recently_cut {
                self.estimate =
                    (self.estimate * self.config.decrease).max(self.config.initial as f64);
                self.last_cut = Some(now);
            }
        }
        let floor_passed = now.saturating_duration_since(self.started) >= self.config.min_duration;
        if floor_passed && self.estimate >= target {
            self.done = true;
        }
    }

    /// Most requests to have in flight to this server now; `None` once the
    /// ramp is done (the pool's own limits apply).
    pub fn max_in_flight(&self, now: Instant) -> Option<u32> {
        if self.done {
            return None;
        }
        let cfg = &self.config;
        let elapsed = now.saturating_duration_since(self.started).as_secs_f64();
        let share = (elapsed / cfg.min_duration.as_secs_f64().max(f64::MIN_POSITIVE)).min(1.0);
        let time_cap = cfg.initial as f64 + (cfg.target - cfg.initial) as f64 * share;
        Some((self.estimate.min(time_cap).floor() as u32).clamp(cfg.initial, cfg.target))
    }

    /// Balancing weight in (0, 1]: the cap as a share of `target`.
    pub fn weight(&self, now: Instant) -> f64 {
        match self.max_in_flight(now) {
            None => 1.0,
            Some(cap) => cap as f64 / self.config.target as f64,
        }
    }

    pub fn is_done(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn done(latency_ms: u64, ok: bool, in_flight: u32) -> Completion {
        Completion {
            latency: ms(latency_ms),
            ok,
            in_flight,
        }
    }

    #[test]
    fn no_growth_while_the_cap_is_not_used() {
        let t0 = Instant::now();
        let mut ss = SlowStart::new(SlowStartConfig::default(), t0).unwrap();
        for i in 0..1000 {
            ss.on_completion(t0 + ms(i), done(10, true, 0));
        }
        assert_eq!(ss.estimate, 2.0, "grew once, while 1 was the cap");
    }

    /// Incident 2's php-fpm: 2 workers at start, one more per second up to
    /// 16, 100 ms per request, a 64-entry backlog that resets when full.
    struct Server {
        started: Instant,
        busy: Vec<Instant>,
        backlog: VecDeque<Instant>,
        overflows: u32,
        max_backlog: usize,
    }

    impl Server {
        fn workers(&self, now: Instant) -> usize {
            (2 + now.duration_since(self.started).as_secs() as usize).min(16)
        }
    }

    struct Run {
        max_backlog: usize,
        overflows: u32,
        mean_busy_last_5s: f64,
        done_at: Option<Duration>,
    }

    /// Runs 30 s in 1 ms steps with unbounded demand, capped by `cap(now)`.
    fn simulate(
        mut cap: impl FnMut(&mut SlowStart, Instant) -> u32,
        ss: &mut SlowStart,
        t0: Instant,
    ) -> Run {
        let service = ms(100);
        let mut srv = Server {
            started: t0,
            busy: Vec::new(),
            backlog: VecDeque::new(),
            overflows: 0,
            max_backlog: 0,
        };
        // Requests in flight: (sent at, service ends at or None while queued).
        let mut in_flight: Vec<(Instant, Option<Instant>)> = Vec::new();
        let (mut busy_sum, mut busy_n, mut done_at) = (0usize, 0usize, None);
        for step in 0..30_000u64 {
            let now = t0 + ms(step);
            // Completions.
            let mut i = 0;
            while i < in_flight.len() {
                if in_flight[i].1.is_some_and(|end| end <= now) {
                    let (sent, _) = in_flight.swap_remove(i);
                    ss.on_completion(
                        now,
                        Completion {
                            latency: now - sent,
                            ok: true,
                            in_flight: in_flight.len() as u32,
                        },
                    );
                } else {
                    i += 1;
                }
            }
            srv.busy.retain(|&end| end > now);
            // Backlog to free workers (FIFO).
            while srv.busy.len() < srv.workers(now) {
                let Some(sent) = srv.backlog.pop_front() else {
                    break;
                };
                let end = now + service;
                srv.busy.push(end);
                if let Some(r) = in_flight.iter_mut().find(|r| r.0 == sent && r.1.is_none()) {
                    r.1 = Some(end);
                }
            }
            // New requests up to the cap; one per ms keeps send times unique.
            if in_flight.len() < cap(ss, now) as usize {
                if srv.backlog.len() >= 64 {
                    srv.overflows += 1;
                    ss.on_completion(
                        now,
                        Completion {
                            latency: Duration::ZERO,
                            ok: false,
                            in_flight: in_flight.len() as u32,
                        },
                    );
                } else {
                    srv.backlog.push_back(now);
                    in_flight.push((now, None));
                }
            }
            srv.max_backlog = srv.max_backlog.max(srv.backlog.len());
            if step >= 25_000 {
                busy_sum += srv.busy.len();
                busy_n += 1;
            }
            if done_at.is_none() && ss.is_done() {
                done_at = Some(ms(step));
            }
        }
        Run {
            max_backlog: srv.max_backlog,
            overflows: srv.overflows,
            mean_busy_last_5s: busy_sum as f64 / busy_n as f64,
            done_at,
        }
    }

    #[test]
    fn follows_a_server_that_grows_one_worker_per_second() {
        let t0 = Instant::now();
        let mut ss = SlowStart::new(SlowStartConfig::default(), t0).unwrap();
        let run = simulate(|ss, now| ss.max_in_flight(now).unwrap_or(16), &mut ss, t0);
        assert_eq!(run.overflows, 0);
        assert!(run.max_backlog <= 8, "backlog reached {}", run.max_backlog);
        assert!(
            run.mean_busy_last_5s >= 14.0,
            "busy {}",
            run.mean_busy_last_5s
        );
        let done = run.done_at.expect("ramp finished");
        assert!(done >= ms(10_000) && done <= ms(25_000), "done at {done:?}");
    }

    #[test]
    fn a_time_only_ramp_floods_the_same_server() {
        // HAProxy-style 2 s ramp ignoring capacity: at 2 s it sends 16 to a
        // server with 4 workers.
        let t0 = Instant::now();
        let mut ss = SlowStart::new(SlowStartConfig::default(), t0).unwrap();
        let time_only = |_: &mut SlowStart, now: Instant| {
            let share = (now.duration_since(t0).as_secs_f64() / 2.0).min(1.0);
            1 + (15.0 * share) as u32
        };
        let flood = simulate(time_only, &mut ss, t0);
        let mut ss = SlowStart::new(SlowStartConfig::default(), t0).unwrap();
        let measured = simulate(|ss, now| ss.max_in_flight(now).unwrap_or(16), &mut ss, t0);
        assert!(
            flood.max_backlog >= 10,
            "time-only backlog {}",
            flood.max_backlog
        );
        assert!(measured.max_backlog * 2 <= flood.max_backlog);
    }

    #[test]
    fn time_floor_holds_back_a_fast_server() {
        let t0 = Instant::now();
        let mut ss = SlowStart::new(SlowStartConfig::default(), t0).unwrap();
        for i in 0..1000 {
            ss.on_completion(t0 + ms(i), done(10, true, 16));
        }
        assert_eq!(ss.max_in_flight(t0 + ms(1000)), Some(2), "1 + 15 × 1/10");
        assert_eq!(ss.max_in_flight(t0 + ms(5000)), Some(8));
        ss.on_completion(t0 + ms(10_000), done(10, true, 16));
        assert!(ss.is_done());
        assert_eq!(ss.max_in_flight(t0 + ms(10_000)), None);
        assert_eq!(ss.weight(t0 + ms(10_000)), 1.0);
    }

    #[test]
    fn errors_cut_once_per_round_trip() {
        let t0 = Instant::now();
        let mut ss = SlowStart::new(SlowStartConfig::default(), t0).unwrap();
        for i in 0..200 {
            ss.on_completion(t0 + ms(i), done(100, true, 16));
        }
        let before = ss.estimate;
        ss.on_completion(t0 + ms(300), done(100, false, 16));
        ss.on_completion(t0 + ms(350), done(100, false, 16));
        assert!(
            (ss.estimate - before * 0.7).abs() < 1e-9,
            "one cut, not two"
        );
        ss.on_completion(t0 + ms(500), done(100, false, 16));
        assert!((ss.estimate - (before * 0.49).max(1.0)).abs() < 1e-9);
    }

    #[test]
    fn rejects_bad_config() {
        let t0 = Instant::now();
        let bad = [
            SlowStartConfig {
                initial: 0,
                ..SlowStartConfig::default()
            },
            SlowStartConfig {
                initial: 20,
                ..SlowStartConfig::default()
            },
            SlowStartConfig {
                latency_tolerance: 0.9,
                ..SlowStartConfig::default()
            },
            SlowStartConfig {
                decrease: 1.0,
                ..SlowStartConfig::default()
            },
        ];
        for cfg in bad {
            assert!(SlowStart::new(cfg.clone(), t0).is_err(), "{cfg:?}");
        }
    }
}
