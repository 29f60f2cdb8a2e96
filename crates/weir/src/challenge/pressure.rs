//! When `under_pressure` classes are challenged: a hysteresis state machine
//! fed with admission observations.
//!
//! ```text
//!            hot for engage_after                 calm for disengage_after
//!   Calm ──────────────────────────► Engaged ───────────────────────────► Calm
//!   hot:  depth ≥ N  or  wait ≥ W              calm: depth < N/4 and wait < W/4
//! ```
//!
//! Between the two thresholds nothing changes, and either timer restarts when
//! its condition breaks, so a queue hovering at the threshold flips rarely and
//! a finished flood disengages by itself. While engaged, every `step_after`
//! of continuous heat adds one bit of difficulty, up to `max_difficulty`.
//!
//! Owns: the decision, with time passed in, and [`PressureTable`], one state
//! per pool shared by the process's requests and kept across reloads. Does
//! not: read the queue (the challenge phase feeds [`Pressure::observe`]
//! from the admission snapshot) or export metrics.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::config::{ChallengeConfig, PressureConfig};

/// Thresholds, from `[challenge.pressure]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PressureSettings {
    pub engage_depth: usize,
    pub engage_wait: Duration,
    pub engage_after: Duration,
    /// A quarter of the engage thresholds: well below, so calm is real calm.
    pub calm_depth: usize,
    pub calm_wait: Duration,
    pub disengage_after: Duration,
    pub step_after: Duration,
    pub max_difficulty: u8,
}

impl PressureSettings {
    pub fn new(p: &PressureConfig, max_difficulty: u8) -> PressureSettings {
        PressureSettings {
            engage_depth: p.queue_depth,
            engage_wait: p.wait.0,
            engage_after: p.engage_after.0,
            calm_depth: p.queue_depth / 4,
            calm_wait: p.wait.0 / 4,
            disengage_after: p.disengage_after.0,
            step_after: p.step_after.0,
            max_difficulty,
        }
    }

    pub fn from_config(c: &ChallengeConfig) -> PressureSettings {
        PressureSettings::new(&c.pressure, c.max_difficulty)
    }
}

/// The pressure state machine.
#[derive(Debug, Clone)]
pub struct Pressure {
    settings: PressureSettings,
    engaged: bool,
    /// Start of the current unbroken run of hot (calm) observations.
    hot_since: Option<Instant>,
    calm_since: Option<Instant>,
    /// Extra difficulty bits earned by sustained heat while engaged.
    steps: u8,
    last_step: Option<Instant>,
}

/// A change of state, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PressureChange {
    Engaged,
    Disengaged,
}

impl Pressure {
    pub fn new(settings: PressureSettings) -> Pressure {
        Pressure {
            settings,
            engaged: false,
            hot_since: None,
            calm_since: None,
            steps: 0,
            last_step: None,
        }
    }

    /// Records one observation of the admission queue (its depth and the
    /// longest current wait) and returns whether challenges are engaged.
    pub fn observe(&mut self, now: Instant, queue_depth: usize, max_wait: Duration) -> bool {
        self.observe_change(now, queue_depth, max_wait);
        self.engaged
    }

    /// Like [`Pressure::observe`], returning the state change it caused.
    pub fn observe_change(
        &mut self,
        now: Instant,
        queue_depth: usize,
        max_wait: Duration,
    ) -> Option<PressureChange> {
        let s = &self.settings;
        let hot = queue_depth >= s.engage_depth || max_wait >= s.engage_wait;
        let calm = queue_depth < s.calm_depth.max(1) && max_wait < s.calm_wait;
        self.hot_since = if hot {
            self.hot_since.or(Some(now))
        } else {
            None
        };
        self.calm_since = if calm {
            self.calm_since.or(Some(now))
        } else {
            None
        };
        let lasted = |since: Option<Instant>, d: Duration| {
            since.is_some_and(|t| now.saturating_duration_since(t) >= d)
        };
        if !self.engaged {
            if lasted(self.hot_since, s.engage_after) {
                self.engaged = true;
                self.steps = 0;
                self.last_step = Some(now);
                return Some(PressureChange::Engaged);
            }
            return None;
        }
        if lasted(self.calm_since, s.disengage_after) {
            self.engaged = false;
            self.steps = 0;
            self.last_step = None;
            return Some(PressureChange::Disengaged);
        }
        if hot {
            // Only unbroken heat adds bits: the step clock restarts whenever
            // an observation is not hot.
            let from = self.last_step.unwrap_or(now);
            if now.saturating_duration_since(from) >= s.step_after && !s.step_after.is_zero() {
                self.steps = self.steps.saturating_add(1);
                self.last_step = Some(now);
            }
        } else {
            self.last_step = Some(now);
        }
        None
    }

    pub fn engaged(&self) -> bool {
        self.engaged
    }

    /// The difficulty to serve: `base` plus one bit per `step_after` of
    /// sustained pressure while engaged, capped at `max_difficulty` (and
    /// never below `base`).
    pub fn difficulty(&self, base: u8) -> u8 {
        let raised = base.saturating_add(if self.engaged { self.steps } else { 0 });
        raised.min(self.settings.max_difficulty.max(base))
    }
}

/// Each pool's pressure, shared by the process's requests (locked briefly
/// per challengeable request) and kept across reloads: a reload does not
/// forget that a pool is under a flood.
#[derive(Debug, Default)]
pub struct PressureTable {
    pools: Mutex<HashMap<Arc<str>, Pressure>>,
}

impl PressureTable {
    /// Observes `pool`'s queue (`depth`, longest `wait`) at `now`; a pool
    /// seen for the first time starts as `fresh`. Returns whether
    /// challenges are engaged, and the difficulty to ask for from `base`.
    pub fn observe(
        &self,
        pool: &Arc<str>,
        fresh: &Pressure,
        now: Instant,
        depth: usize,
        wait: Duration,
        base: u8,
    ) -> (bool, u8) {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        let p = pools.entry(pool.clone()).or_insert_with(|| fresh.clone());
        let engaged = p.observe(now, depth, wait);
        (engaged, p.difficulty(base))
    }

    /// Each pool seen so far and whether its challenges are engaged, by
    /// name (the live page).
    pub fn engaged(&self) -> Vec<(Arc<str>, bool)> {
        let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<_> = pools
            .iter()
            .map(|(n, p)| (n.clone(), p.engaged()))
            .collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn settings() -> PressureSettings {
        PressureSettings {
            engage_depth: 20,
            engage_wait: 500 * MS,
            engage_after: Duration::from_secs(10),
            calm_depth: 5,
            calm_wait: 125 * MS,
            disengage_after: Duration::from_secs(120),
            step_after: Duration::from_secs(60),
            max_difficulty: 18,
        }
    }

    /// Feeds one observation per second: `(seconds, depth, wait_ms)` runs.
    fn run(p: &mut Pressure, t0: Instant, at: &mut u64, secs: u64, depth: usize, wait_ms: u64) {
        for _ in 0..secs {
            p.observe(
                t0 + Duration::from_secs(*at),
                depth,
                Duration::from_millis(wait_ms),
            );
            *at += 1;
        }
    }

    #[test]
    fn settings_from_config_quarter_the_thresholds() {
        let s = PressureSettings::from_config(&ChallengeConfig::default());
        assert_eq!((s.engage_depth, s.calm_depth), (20, 5));
        assert_eq!((s.engage_wait, s.calm_wait), (500 * MS, 125 * MS));
        assert_eq!(s.max_difficulty, 14);
    }

    #[test]
    #[allow(clippy::type_complexity)] // one tuple per table row
    fn hysteresis_table() {
        // Each case: a sequence of (seconds, depth, wait ms) runs and whether
        // the machine is engaged at the end.
        #[rustfmt::skip]
        let cases: &[(&str, &[(u64, usize, u64)], bool)] = &[
            ("idle stays calm",                  &[(300, 0, 0)], false),
            ("short burst absorbed",             &[(9, 50, 0), (1, 0, 0)], false),
            ("deep queue for 10 s engages",      &[(11, 20, 0)], true),
            ("long wait alone engages",          &[(11, 0, 600)], true),
            ("interrupted heat does not",        &[(8, 30, 0), (1, 10, 0), (8, 30, 0)], false),
            ("in the band: stays engaged",       &[(11, 30, 0), (600, 10, 200)], true),
            ("calm 119 s: still engaged",        &[(11, 30, 0), (119, 0, 0)], true),
            ("calm 121 s: disengaged",           &[(11, 30, 0), (121, 0, 0)], false),
            ("calm broken by a band value",      &[(11, 30, 0), (100, 0, 0), (1, 6, 0), (100, 0, 0)], true),
            ("engage again after disengaging",   &[(11, 30, 0), (121, 0, 0), (11, 30, 0)], true),
        ];
        for (name, runs, want) in cases {
            let t0 = Instant::now();
            let mut p = Pressure::new(settings());
            let mut at = 0;
            for &(secs, depth, wait) in *runs {
                run(&mut p, t0, &mut at, secs, depth, wait);
            }
            assert_eq!(p.engaged(), *want, "{name}");
        }
    }

    #[test]
    fn reports_changes_once() {
        let t0 = Instant::now();
        let mut p = Pressure::new(settings());
        let mut changes = Vec::new();
        for s in 0..200u64 {
            let depth = if s < 30 { 40 } else { 0 };
            if let Some(c) = p.observe_change(t0 + Duration::from_secs(s), depth, Duration::ZERO) {
                changes.push((s, c));
            }
        }
        assert_eq!(
            changes,
            vec![
                (10, PressureChange::Engaged),
                (150, PressureChange::Disengaged)
            ]
        );
    }

    #[test]
    fn difficulty_rises_with_sustained_pressure_and_resets() {
        let t0 = Instant::now();
        let mut p = Pressure::new(settings());
        let mut at = 0;
        assert_eq!(p.difficulty(16), 16);
        run(&mut p, t0, &mut at, 11, 40, 0); // engaged at 10 s
        assert_eq!(p.difficulty(16), 16);
        run(&mut p, t0, &mut at, 60, 40, 0);
        assert_eq!(p.difficulty(16), 17, "one step after a minute");
        run(&mut p, t0, &mut at, 30, 10, 0); // band: holds, step clock restarts
        run(&mut p, t0, &mut at, 59, 40, 0);
        assert_eq!(p.difficulty(16), 17, "heat must be unbroken to step");
        run(&mut p, t0, &mut at, 600, 40, 0);
        assert_eq!(p.difficulty(16), 18, "capped at max_difficulty");
        assert_eq!(p.difficulty(20), 20, "never below base");
        run(&mut p, t0, &mut at, 121, 0, 0);
        assert!(!p.engaged());
        assert_eq!(p.difficulty(16), 16, "reset on disengage");
    }
}
