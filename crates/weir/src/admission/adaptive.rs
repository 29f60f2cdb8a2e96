//! Adaptive concurrency: a latency-gradient limit in the style of Netflix's
//! Gradient2, for pools whose `max_in_flight` is not configured.
//!
//! Once per sample window (at least `window` long and `min_samples` samples,
//! or at once on a dropped request) the limit moves:
//!
//! - **Congested** (the window's mean latency `short` above `tolerance ×
//!   long`, the long-term average, and by more than 5 ms of noise): the limit
//!   is cut *from what was in use* (`base = min(limit, most in flight)`), to
//!   the smaller of Gradient2's step (`base × (1 − s + s × gradient)`,
//!   `gradient = clamp(tolerance × long / short, 0.5, 1)`) and Little's
//!   estimate of what the app served without queueing (`tolerance × mean
//!   in-flight × long / short`: about `tolerance × W` for an app of W
//!   workers with a queue in front), but by at most half per window. An app
//!   whose own backlog fills is relieved in two or three windows, before its
//!   health checks fail; Gradient2 alone moves at most 10% a window.
//!   Latency that weir's own scheduler lag explains (twice the lag, see
//!   [`crate::admission::lag`]) is not congestion: on a saturated core the
//!   answers wait for weir, not the app, and a cut would shed requests the
//!   app could serve.
//! - **Every slot used, latency flat**: the limit grows by `s × sqrt(limit)`
//!   (Gradient2's headroom), or doubles while *probing*: until the first
//!   congestion, and again after five such windows in a row (demand grew),
//!   by a quarter instead once latency has cut it ([`REPROBE_GROWTH`]).
//! - **Fewer than half the slots used**: unchanged (the app-limited rule:
//!   nothing was learned about more concurrency).
//! - **A dropped request** (upstream timeout, overload 503, reset):
//!   at once (an overflowing backlog refuses thousands a second, and a
//!   window waited out lets them all through), `backoff ×` the in-flight
//!   count at which the first dropped request started, if below the limit (a small backlog overflows long before an
//!   unused limit is reached). A second such cut within [`CEILING_HOLD`]
//!   windows makes its limit a *ceiling* for as long: growth stops there,
//!   where a limit that grew back at once would overflow the same backlog
//!   again and again (a backlog does not grow by itself; an app that gained
//!   workers is found again when the ceiling lapses). One drop alone (an
//!   app's own `503` for a reason of its own) sets none. A request dropped that started with
//!   more in flight than the limit now allows was answered by an earlier
//!   cut (TCP's one cut per loss episode): it cuts nothing.
//!
//! The limit starts open (10,000): weir starts in front of apps it knows
//! nothing about (admission is on without configuration), and a limit
//! guessed before the app shows strain would hold back long polls and
//! streams. Until the first cut, an [`OpenBound`] keeps a flood's first
//! second out of the app's own backlog, and opens as the app keeps up. The long-term average is a plain mean over the first ten
//! calm windows (the limit not reached, no queueing), then exponential over `long_window` windows, pulled down
//! quickly (×0.95 per window) when the short latency falls far below it, so
//! recovery after a slow spell is not delayed by memory of the spell. The
//! queue feeds latencies normalised by request shape
//! ([`crate::admission::shapes`]), so a flood of slow pages is not read as
//! queueing.

//! Time is injected (`now` on every sample). This module holds no locks and
//! knows nothing about queues; [`crate::admission::queue`] feeds it.
//!
//! Known limit, as in Gradient2: latency that rises and then *stays* high is
//! slowly learned as the new normal and the limit creeps up again; the hard
//! ceiling (the app's workers minus the health reserve) bounds that.

use std::time::{Duration, Instant};

/// Latency a window must rise by, beyond the tolerance, to count as
/// congestion: below it is the clock's and a shared machine's noise.
const CONGESTION_FLOOR_SECS: f64 = 0.005;
/// Polls an answer may wait for when weir's scheduler lags: latency up to
/// this many times the lag is weir's, not the app's.
const OWN_LAG_POLLS: f64 = 2.0;
/// Flat windows with every slot used, in a row, before the limit probes
/// (doubles) again.
const REPROBE_AFTER: u32 = 5;
/// How much a probe grows the limit a window once latency has cut it:
/// the app's knee is known to be near, and a doubling past it filled the
/// app's own backlog, first in first out whatever weir's lanes said, for
/// the window it took to see it (issue 55: people's pages waited behind
/// 20-36 requests in a lab app's backlog). Before the first latency cut,
/// and after a cut for dropped requests, a probe doubles.
const REPROBE_GROWTH: f64 = 1.25;
/// Windows averaged plainly before the long-term latency becomes an
/// exponential average.
const WARM_UP_WINDOWS: u32 = 10;
/// How a calm window's peak in flight fades, a window at a time (half in
/// about seventy windows): the next process resumes from recent demand.
const CALM_PEAK_FADE: f64 = 0.99;
/// The least a resumed limit is seeded at, however quiet the app was.
const RESUMED_FLOOR: usize = 32;
/// Windows without a dropped request before a drop is forgotten: the
/// ceiling a second one set lapses.
const CEILING_HOLD: u32 = 60;
/// The least an open limit lets in flight before it has seen the app
/// answer that many (see [`OpenBound`]): an app's accept backlog is
/// commonly 64 or more (Apache's and nginx's default 511; the lab's 64),
/// and a page's own requests (50 at once in `drain_under_load_loses_no_request`)
/// are not held for an app weir has seen no traffic of yet.
const OPEN_FLOOR: f64 = 64.0;

/// How far in flight may go while the limit is still open (never cut):
/// TCP's slow start, for an app weir knows nothing about yet. The open
/// limit sent a flood's first second to the app at once (361 requests
/// into 10 workers and a backlog of 64, issue 55): the app's own backlog,
/// first in first out whatever weir's lanes said, overflowed before the
/// first window could show the latency, and people's pages waited in it,
/// or were refused, while it drained.
///
/// The bound starts at twice what calm windows had in flight (at least
/// [`OPEN_FLOOR`]), and doubles once in flight has reached it and:
///
/// - the app has answered as many requests, sent since then, within the
///   tolerance (an app that keeps up opens it in a few of its own
///   latencies: a 1 ms app gives a thousand slots in ten milliseconds);
/// - or a whole window has passed at the bound and the latest answers are
///   not a run of [`QUEUED_RUN`] late ones. Requests that do not answer
///   (long polls, streams), or a slow shape beside fast pages, open it by
///   time; an app's backlog delays every answer behind it, the cheap
///   pages' too, and such a run holds the bound until the window cuts.
///
/// Latency alone cannot tell a slow new shape from queueing: a slow start
/// that ended on late answers held `nginx-connection-exhaustion.toml`'s
/// people to 79% (2026-12-04). Once latency or a drop has cut the limit,
/// the limit itself is learned and the bound is gone.
#[derive(Debug, Clone)]
struct OpenBound {
    bound: f64,
    /// When in flight first reached the bound since it last grew.
    full_since: Option<Instant>,
    /// Answers within the tolerance to requests sent since then.
    calm_answers: u32,
    /// Late answers in a row, the latest last (any request's, since then).
    late_run: u32,
}

/// Late answers in a row that say the app queues: its backlog delays
/// every answer behind it.
const QUEUED_RUN: u32 = 8;

impl OpenBound {
    fn new() -> OpenBound {
        OpenBound {
            bound: OPEN_FLOOR,
            full_since: None,
            calm_answers: 0,
            late_run: 0,
        }
    }

    fn grow(&mut self) {
        self.bound *= 2.0;
        self.full_since = None;
        self.calm_answers = 0;
        self.late_run = 0;
    }
}

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
    /// tolerance 1.5, long window 600). The limit starts *open* (`initial`
    /// = `max` = 10,000, weir's default connection cap): it binds once
    /// latency shows queueing, and then falls from what was in use (two or
    /// three windows to an app's workers). An app of long requests (long
    /// polls, streams) is never held to a guess before it shows strain. A
    /// pool's `workers` caps it lower.
    fn default() -> Self {
        GradientConfig {
            initial: 10_000,
            min: 1,
            max: 10_000,
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
    /// When it was granted its slot: a drop of a request granted before
    /// the last cut was answered by that cut.
    pub started: Instant,
    /// Requests in flight when this one started (including itself).
    pub in_flight: usize,
    /// The upstream shed or lost the request (timeout, 503 overload, reset).
    pub dropped: bool,
    /// How late weir's own scheduler was polling ready tasks when the
    /// answer was read ([`crate::admission::lag`]): latency it explains is
    /// weir's, not the app's.
    pub own_lag: Duration,
}

/// Latencies a window keeps to take its median from; past this, a uniform
/// sample of them (Algorithm R).
const WINDOW_LATENCIES: usize = 256;

#[derive(Debug, Clone)]
struct Window {
    start: Instant,
    count: u32,
    /// A uniform sample of the window's latencies, in seconds.
    latencies: Vec<f32>,
    sum_in_flight: f64,
    sum_own_lag_secs: f64,
    dropped: bool,
    max_in_flight: usize,
    /// The fewest in flight at which a dropped request started.
    min_dropped_in_flight: usize,
    /// The most in flight at which an answered request started.
    max_answered_in_flight: usize,
}

impl Window {
    /// Keeps `secs` in the window's sample: every latency while there is
    /// room, then each with the chance a uniform sample gives it.
    fn keep(&mut self, secs: f64) {
        let secs = secs as f32;
        if self.latencies.len() < WINDOW_LATENCIES {
            self.latencies.push(secs);
            return;
        }
        // A multiplicative hash of the count picks the slot: uniform
        // enough, and no generator to carry.
        let at = (u64::from(self.count).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 33) as usize
            % self.count as usize;
        if at < WINDOW_LATENCIES {
            self.latencies[at] = secs;
        }
    }

    /// The median latency, in seconds (0 for an empty window).
    fn median(&mut self) -> f64 {
        let n = self.latencies.len();
        if n == 0 {
            return 0.0;
        }
        let (_, mid, _) = self.latencies.select_nth_unstable_by(n / 2, f32::total_cmp);
        f64::from(*mid)
    }

    fn new(start: Instant) -> Window {
        Window {
            start,
            count: 0,
            latencies: Vec::new(),
            sum_in_flight: 0.0,
            sum_own_lag_secs: 0.0,
            dropped: false,
            max_in_flight: 0,
            min_dropped_in_flight: usize::MAX,
            max_answered_in_flight: 0,
        }
    }
}

/// What a [`GradientLimit`] has learned, handed to the next process in an
/// in-place upgrade: a new process that started open (10,000) in front of
/// an app the old one had cut to a handful would send the app a burst it
/// cannot hold, once, before its own first cut. A drop's ceiling and the
/// current window are not carried: they are about seconds, not the app.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LimitState {
    pub limit: f64,
    /// The long-term latency, in seconds, once known.
    pub long_rtt_secs: Option<f64>,
    pub probing: bool,
    /// The most requests in flight of a recent calm window (latency within
    /// the tolerance), once seen: what the app was asked for without
    /// strain. Absent from files written before it was kept.
    #[serde(default)]
    pub calm_peak: Option<f64>,
}

/// One pool's [`LimitState`], named: what goes to the next process (in an
/// upgrade's hand-off, or beside the limiter snapshot), matched to its pool
/// by name, with the request shapes it learned (absent from files written
/// before they were carried).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PoolLimit {
    pub pool: String,
    pub state: LimitState,
    #[serde(default)]
    pub shapes: Option<super::shapes::LearnedShapes>,
}

/// A latency-gradient concurrency limit.
#[derive(Debug, Clone)]
pub struct GradientLimit {
    config: GradientConfig,
    limit: f64,
    long_rtt: Option<f64>,
    windows_seen: u32,
    /// Doubling while saturated: until the first congestion, and again
    /// after [`REPROBE_AFTER`] flat saturated windows in a row.
    probing: bool,
    flat_saturated: u32,
    /// Windows since the last cut for a dropped request, while remembered
    /// (for [`CEILING_HOLD`] windows).
    since_drop: Option<u32>,
    /// The limit a repeated drop set, which growth does not pass while the
    /// drop is remembered.
    ceiling: Option<f64>,
    /// When the limit was last cut for a dropped request: drops of
    /// requests granted before it were answered by it.
    last_drop_cut: Option<Instant>,
    /// The last cut was for dropped requests, not for latency.
    cut_by_drop: bool,
    /// Latency has cut the limit at least once ([`REPROBE_GROWTH`]).
    cut_by_latency_once: bool,
    /// The most in flight of a recent calm window (0 until one closes),
    /// fading by [`CALM_PEAK_FADE`] a window.
    calm_peak: f64,
    /// The most in flight at which a request of the last closed window was
    /// answered (see [`GradientLimit::drop_floor`]).
    answered_peak: usize,
    /// While the limit is open (never cut), how far in flight may go.
    open: Option<OpenBound>,
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
            probing: true,
            calm_peak: 0.0,
            answered_peak: 0,
            flat_saturated: 0,
            since_drop: None,
            ceiling: None,
            last_drop_cut: None,
            cut_by_drop: false,
            cut_by_latency_once: false,
            open: Some(OpenBound::new()),
            window: Window::new(now),
        })
    }

    /// What this limit has learned, for the next process.
    pub fn state(&self) -> LimitState {
        LimitState {
            limit: self.limit,
            long_rtt_secs: self.long_rtt,
            probing: self.probing,
            calm_peak: (self.calm_peak > 0.0).then_some(self.calm_peak),
        }
    }

    /// Continues from `state`, learned by the previous process: its limit
    /// (within this one's bounds), its long-term latency (past warm-up: it
    /// was learned from calm windows already) and whether it was probing.
    /// Values that are not finite are ignored.
    pub fn resume(&mut self, state: &LimitState) {
        if state.limit.is_finite() {
            self.limit = state
                .limit
                .clamp(self.config.min as f64, self.config.max as f64);
        }
        if let Some(long) = state.long_rtt_secs.filter(|l| l.is_finite() && *l > 0.0) {
            self.long_rtt = Some(long);
            self.windows_seen = WARM_UP_WINDOWS + 1;
        }
        self.probing = state.probing;
        // A limit the app never came near (the open start, never cut)
        // resumes at twice what a calm window asked of it, and probes up
        // from there: a restarted process takes over a backlog of
        // connections made while none listened (on a socket systemd
        // holds), and an open limit sent that whole burst to the app at
        // once (its backlog overflowed: 55 refused, 13 failed requests in
        // ten restarts). Ordinary traffic never reaches twice its calm
        // peak; a burst above it waits in weir for a window or two.
        if let Some(peak) = state.calm_peak.filter(|p| p.is_finite() && *p > 0.0) {
            self.calm_peak = peak;
            let seeded = (2.0 * peak).max(RESUMED_FLOOR as f64);
            if self.limit > seeded {
                self.limit = seeded.clamp(self.config.min as f64, self.config.max as f64);
                self.probing = true;
            }
        }
        // A limit the last process had cut, or seeded above, is learned:
        // the open bound is for a limit that knows nothing yet.
        if self.limit < self.config.max as f64 {
            self.open = None;
        }
    }

    /// The learned limit (whole slots).
    pub fn limit(&self) -> usize {
        (self.limit.floor() as usize).clamp(self.config.min, self.config.max)
    }

    /// The limit in force: the learned one, or while it is open, the
    /// [`OpenBound`].
    pub fn allowed(&self) -> usize {
        match &self.open {
            Some(open) => self.limit().min((open.bound as usize).max(self.config.min)),
            None => self.limit(),
        }
    }

    /// How far in flight may go while the limit is open, if it is.
    pub fn open_bound(&self) -> Option<usize> {
        self.open.as_ref().map(|o| o.bound as usize)
    }

    /// Whether the open bound, not the learned limit, is what holds
    /// `in_flight` back now.
    pub fn held_by_open_bound(&self, in_flight: usize) -> bool {
        in_flight >= self.allowed() && in_flight < self.limit()
    }

    /// Grows the open bound, if `in_flight` has reached it and the app has
    /// kept up since it last grew (see [`OpenBound`]); a grant decision
    /// calls it first.
    pub fn grow_open(&mut self, now: Instant, in_flight: usize) {
        let window = self.config.window;
        let Some(open) = &mut self.open else {
            return;
        };
        let full_since = match open.full_since {
            Some(at) => at,
            None if (in_flight as f64) >= open.bound => *open.full_since.insert(now),
            None => return,
        };
        let kept_up = f64::from(open.calm_answers) >= open.bound;
        let not_queueing =
            now.saturating_duration_since(full_since) >= window && open.late_run < QUEUED_RUN;
        if kept_up || not_queueing {
            open.grow();
        }
    }

    /// Counts an answer to a request sent at `started` towards the open
    /// bound's growth.
    fn count_open_answer(&mut self, started: Instant, latency: Duration) {
        let calm_below = self
            .long_rtt
            .map(|long| self.config.tolerance * long + CONGESTION_FLOOR_SECS);
        let Some(open) = self.open.as_mut() else {
            return;
        };
        let Some(full_since) = open.full_since else {
            return;
        };
        // Before the first window there is nothing to compare against:
        // that window's own cut is what holds a slow app's flood.
        if calm_below.is_some_and(|below| latency.as_secs_f64() > below) {
            open.late_run = open.late_run.saturating_add(1);
            return;
        }
        open.late_run = 0;
        // Only requests sent since in flight reached the bound say whether
        // the app keeps up with it: earlier ones did not meet its queue.
        if started >= full_since {
            open.calm_answers = open.calm_answers.saturating_add(1);
        }
    }

    /// The long-term latency the gradient compares against, once known.
    pub fn long_rtt(&self) -> Option<Duration> {
        self.long_rtt.map(Duration::from_secs_f64)
    }

    /// Records a completed request; returns the new limit when a window closed.
    pub fn on_sample(&mut self, now: Instant, sample: Sample) -> Option<usize> {
        // Dropped, but granted before the last cut: that cut answered it
        // (TCP's one cut per loss episode). A burst of resets, an app
        // restarting under its requests, is one cut, not a ceiling.
        let answered_by_cut = self.last_drop_cut.is_some_and(|at| sample.started < at);
        if sample.dropped && answered_by_cut {
            // The same episode: its cut is from the fewest in flight that
            // dropped (a burst into a small backlog is refused past it,
            // in whatever order the refusals come back), but it is one cut.
            let from = self.drop_floor(sample.in_flight) * self.config.backoff;
            if from >= self.limit {
                return None;
            }
            self.limit = from.max(self.config.min as f64);
            return Some(self.limit());
        }
        let dropped = sample.dropped && sample.in_flight <= self.limit();
        if !sample.dropped {
            self.count_open_answer(sample.started, sample.latency);
        }
        let w = &mut self.window;
        w.count += 1;
        w.keep(sample.latency.as_secs_f64());
        w.sum_in_flight += sample.in_flight as f64;
        w.sum_own_lag_secs += sample.own_lag.as_secs_f64();
        w.dropped |= dropped;
        if dropped {
            w.min_dropped_in_flight = w.min_dropped_in_flight.min(sample.in_flight);
        } else if !sample.dropped {
            w.max_answered_in_flight = w.max_answered_in_flight.max(sample.in_flight);
        }
        w.max_in_flight = w.max_in_flight.max(sample.in_flight);
        let elapsed = now.saturating_duration_since(w.start);
        if !dropped && (elapsed < self.config.window || w.count < self.config.min_samples) {
            return None;
        }
        let mut closed = std::mem::replace(&mut self.window, Window::new(now));
        self.close_window(&mut closed, now);
        // A window a drop closed at once holds few answers: the peak before
        // it still stands.
        self.answered_peak = if closed.dropped {
            self.answered_peak.max(closed.max_answered_in_flight)
        } else {
            closed.max_answered_in_flight
        };
        Some(self.limit())
    }

    /// Where a cut for a request dropped with `in_flight` in flight backs
    /// off from: that many, unless the app answered more at once in this
    /// window or the last. A backlog overflows past what the app holds, so
    /// its refusals start above every answer; an app restarting under its
    /// requests resets even the one it held alone, and that says nothing
    /// about how many it can hold (the cut went to 1, and people waited
    /// while the limit doubled back).
    fn drop_floor(&self, in_flight: usize) -> f64 {
        in_flight
            .max(self.window.max_answered_in_flight)
            .max(self.answered_peak) as f64
    }

    /// A window a dropped request closed: the app dropped a request that
    /// started with this many in flight, so the limit backs off from there,
    /// not from a limit far above what was used (a small backlog overflows
    /// long before a limit of 64 is reached, and ×0.9 of 64 would take
    /// twenty windows). A second such cut while the first is remembered
    /// makes a ceiling.
    fn cut_for_drop(&mut self, w: &Window, now: Instant) {
        let cfg = &self.config;
        self.last_drop_cut = Some(now);
        self.cut_by_drop = true;
        self.open = None;
        self.flat_saturated = 0;
        self.probing = false;
        let from = self.limit.min(self.drop_floor(w.min_dropped_in_flight));
        self.limit = (from * cfg.backoff).max(cfg.min as f64);
        if self.since_drop.is_some() {
            self.ceiling = Some(self.limit);
        }
        self.since_drop = Some(0);
    }

    fn close_window(&mut self, w: &mut Window, now: Instant) {
        if w.dropped {
            self.cut_for_drop(w, now);
            return;
        }
        self.since_drop = self.since_drop.map(|n| n + 1).filter(|&n| n < CEILING_HOLD);
        if self.since_drop.is_none() {
            self.ceiling = None;
        }
        // The median, not the mean: a long poll or a stream among a
        // window's pages is one slow answer, not queueing (the mean of a
        // window with one 3 s poll among 200 pages of 3 ms read as 6x
        // congestion, and cut an idle app's limit to 1). Queueing in the
        // app delays every answer, and moves the median.
        // A zero-latency window (clock granularity) carries no signal.
        let short = w.median();
        if short <= 0.0 {
            return;
        }
        let long = self.update_long(w, short);
        // Once a window: a copy keeps `self` free for the cuts below.
        let cfg = self.config.clone();
        // Congestion: latency beyond the tolerance by more than noise (a
        // 1 ms app answering in 2 ms is not queueing) and by more than
        // weir's own scheduler lag explains (an answer waits up to twice
        // for a poll: the connection's task, then the request's).
        let own_lag = w.sum_own_lag_secs / w.count.max(1) as f64;
        let congested = short > cfg.tolerance * long
            && short - long > CONGESTION_FLOOR_SECS + OWN_LAG_POLLS * own_lag;
        if !congested {
            self.note_calm(w);
        }
        let app_limited = (w.max_in_flight as f64) < self.limit / 2.0;
        let saturated = w.max_in_flight >= self.limit();
        let next = if congested {
            self.cut_for_latency(w, short, long)
        } else if saturated {
            self.next_when_saturated()
        } else {
            self.flat_saturated = 0;
            if app_limited {
                self.limit
            } else {
                self.limit + cfg.smoothing * self.limit.sqrt()
            }
        };
        let next = match self.ceiling {
            Some(at) => next.min(at),
            None => next,
        };
        self.limit = next.clamp(cfg.min as f64, cfg.max as f64);
    }

    /// The next limit after a saturated window (every slot used, latency
    /// flat): a step up, or a doubling while probing.
    #[inline]
    fn next_when_saturated(&mut self) -> f64 {
        // Every slot used and latency flat: the limit, not the app, is
        // what holds requests back. After a few such windows in a row,
        // probe again by doubling (demand grew since the last cut). A
        // cut for one episode of drops (an app that restarted under its
        // requests, a burst it refused once) probes at the first such
        // window: an app that drops again at the same concurrency sets
        // a ceiling, one that does not should not wait behind it.
        self.flat_saturated = self.flat_saturated.saturating_add(1);
        let reprobe_after = match (self.since_drop, self.ceiling) {
            (Some(_), None) if self.cut_by_drop => 1,
            _ => REPROBE_AFTER,
        };
        if self.flat_saturated >= reprobe_after {
            self.probing = true;
        }
        if self.probing {
            let near_the_knee = self.cut_by_latency_once && !self.cut_by_drop;
            self.limit * if near_the_knee { REPROBE_GROWTH } else { 2.0 }
        } else {
            self.limit + self.config.smoothing * self.limit.sqrt()
        }
    }

    /// A window within the tolerance: its peak in flight is what the app
    /// was asked without strain.
    fn note_calm(&mut self, w: &Window) {
        self.calm_peak = (self.calm_peak * CALM_PEAK_FADE).max(w.max_in_flight as f64);
        // What calm traffic had in flight, twice over, is never held; once
        // the bound holds requests back, only the app's answers (or time)
        // move it: a flood's first window reads calm on the answers that
        // came before its queue.
        if let Some(open) = self.open.as_mut().filter(|o| o.full_since.is_none()) {
            open.bound = open.bound.max(2.0 * self.calm_peak);
        }
    }

    /// The limit after a congested window: cut from what was used, not
    /// from a limit far above it, to the smaller of Gradient2's step and
    /// Little's estimate of what the app served unqueued, by at most half.
    fn cut_for_latency(&mut self, w: &Window, short: f64, long: f64) -> f64 {
        let cfg = &self.config;
        self.probing = false;
        self.flat_saturated = 0;
        self.cut_by_drop = false;
        self.cut_by_latency_once = true;
        self.open = None;
        let base = self.limit.min(w.max_in_flight as f64);
        let gradient = (cfg.tolerance * long / short).clamp(0.5, 1.0);
        let smoothed = base * (1.0 - cfg.smoothing) + base * gradient * cfg.smoothing;
        let mean_in_flight = w.sum_in_flight / w.count.max(1) as f64;
        let unqueued = cfg.tolerance * mean_in_flight * long / short;
        smoothed.min(unqueued).max(base / 2.0)
    }

    /// Moves the long-term latency by a closed window's mean `short`, and
    /// returns it.
    fn update_long(&mut self, w: &Window, short: f64) -> f64 {
        let cfg = &self.config;
        let long = match self.long_rtt {
            None => {
                self.windows_seen = 1;
                short
            }
            Some(long) => {
                // Plain mean while warming up, then an exponential average.
                // Only a window the limit did not hold back, and that did
                // not queue beyond the tolerance, enters the warm-up's
                // mean: a flood that begins in weir's first seconds would
                // otherwise be learned as the app's normal, and the app's
                // own backlog kept full behind it. Other windows move the
                // average at the slow rate, as after warm-up.
                let calm = short <= cfg.tolerance * long && w.max_in_flight < self.limit();
                if calm || self.windows_seen > WARM_UP_WINDOWS {
                    self.windows_seen = self.windows_seen.saturating_add(1);
                }
                let n = self.windows_seen.min(cfg.long_window) as f64;
                let alpha = if self.windows_seen <= WARM_UP_WINDOWS && calm {
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
        // One request at a time cannot queue behind another of weir's:
        // this is the app's own latency, and a baseline below it was
        // learned on another scale or mix. Holding it as congestion kept
        // the limit at the floor for good.
        let long = if w.max_in_flight <= 1 {
            long.max(short)
        } else {
            long
        };
        self.long_rtt = Some(long);
        long
    }

    /// Forgets the long-term latency and learns it again from the next
    /// windows, as at the start (the limit itself stays): the latencies fed
    /// in have changed scale (the first request shape was judged, and
    /// answers are normalised from then on). A baseline learned from a
    /// first second of raw answers, mostly cheap pages (84 ms), read the
    /// normalised answers after it (130-170 ms, with 10 in flight before 10
    /// workers, which cannot queue) as congestion and cut the limit to 4
    /// while people's pages waited out their timeouts in weir's queue (2 of
    /// 17 runs of the 2026-09-23 replay with crawlers like people).
    ///
    /// The window under way starts again too: answers before the change
    /// are on the old scale, and a first window mostly of them (84 ms in a
    /// window that would have read 130 ms) taught the low baseline all the
    /// same (1 of 9 runs, which cut to 1).
    pub fn learn_baseline_again(&mut self, now: Instant) {
        self.long_rtt = None;
        self.windows_seen = 0;
        self.window = Window::new(now);
    }

    /// Whether the limit is probing: doubling while every slot is used.
    pub fn probing(&self) -> bool {
        self.probing
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
                    started: *now,
                    in_flight: in_flight.unwrap_or(g.limit()),
                    dropped: false,
                    own_lag: Duration::ZERO,
                };
                g.on_sample(*now, sample);
            }
        }
    }

    fn limiter(now: Instant) -> GradientLimit {
        GradientLimit::new(GradientConfig::default(), now).unwrap()
    }

    /// A limit that starts closed (4, at most 64), as an operator may set.
    fn small(now: Instant) -> GradientLimit {
        let cfg = GradientConfig {
            initial: 4,
            max: 64,
            ..GradientConfig::default()
        };
        GradientLimit::new(cfg, now).unwrap()
    }

    const OPEN: usize = 10_000;

    /// What a limit learned survives an upgrade: the next process's limit
    /// continues from it, past warm-up; values that are not numbers are
    /// ignored.
    #[test]
    fn a_resumed_limit_continues_where_the_last_one_was() {
        let mut now = Instant::now();
        let mut old = limiter(now);
        drive(&mut old, &mut now, 12, ms(100), None);
        drive(&mut old, &mut now, 3, ms(400), None);
        let state = old.state();
        assert!(state.limit < OPEN as f64 && !state.probing);
        let mut new = limiter(now);
        new.resume(&state);
        assert_eq!(new.limit(), old.limit());
        assert_eq!(new.long_rtt(), old.long_rtt());
        assert!(!new.probing());
        // The same windows move both alike from here.
        drive(&mut old, &mut now, 2, ms(400), None);
        drive(&mut new, &mut now, 2, ms(400), None);
        assert_eq!(new.limit(), old.limit());
        let mut cold = limiter(now);
        cold.resume(&LimitState {
            limit: f64::NAN,
            long_rtt_secs: Some(f64::INFINITY),
            probing: true,
            calm_peak: Some(f64::NAN),
        });
        assert_eq!((cold.limit(), cold.long_rtt()), (OPEN, None));
    }

    /// Issue 35: a limit the app never came near resumes at twice the calm
    /// peak (at least 32), probing; one that was cut resumes as it was.
    #[test]
    fn an_open_limit_resumes_at_twice_what_the_app_was_asked_and_probes_up() {
        let mut now = Instant::now();
        let mut old = limiter(now);
        drive(&mut old, &mut now, 12, ms(3), Some(40));
        let state = old.state();
        assert_eq!((old.limit(), state.calm_peak), (OPEN, Some(40.0)));
        let mut new = limiter(now);
        new.resume(&state);
        assert_eq!(new.limit(), 80);
        assert!(new.probing());
        // A burst above it waits a window, then the limit doubles.
        drive(&mut new, &mut now, 1, ms(3), None);
        assert_eq!(new.limit(), 160);
        // A cut limit is continued, not raised.
        let mut cut = limiter(now);
        cut.resume(&LimitState {
            limit: 6.0,
            ..state.clone()
        });
        assert_eq!(cut.limit(), 6);
        let mut quiet = limiter(now);
        quiet.resume(&LimitState {
            calm_peak: Some(2.0),
            ..state
        });
        assert_eq!(quiet.limit(), RESUMED_FLOOR);
    }

    /// A model app for the limit to drive, on an injected clock: `workers`
    /// serve a request `service` long each, `backlog` more wait in its
    /// accept queue, and a request sent beyond both is refused (dropped).
    /// weir's own queue holds what the limit does not let through.
    struct ModelApp {
        workers: usize,
        backlog: usize,
        service: Duration,
        /// Requests being served: when each ends, when it was sent, how
        /// many were in flight when it was.
        serving: Vec<(Instant, Instant, usize)>,
        /// Requests in the app's backlog: when sent, in flight then.
        waiting: std::collections::VecDeque<(Instant, usize)>,
        /// Requests waiting in weir for a slot.
        queued: u64,
        /// Requests its full backlog refused.
        refused: u64,
    }

    impl ModelApp {
        fn new(workers: usize, backlog: usize, service: Duration) -> ModelApp {
            ModelApp {
                workers,
                backlog,
                service,
                serving: Vec::new(),
                waiting: Default::default(),
                queued: 0,
                refused: 0,
            }
        }

        fn in_flight(&self) -> usize {
            self.serving.len() + self.waiting.len()
        }

        /// One tick at `now`: answers that end feed the limit, the backlog
        /// moves to free workers, then weir sends what the limit allows.
        fn tick(&mut self, g: &mut GradientLimit, now: Instant) {
            let (done, busy): (Vec<_>, Vec<_>) = self
                .serving
                .drain(..)
                .partition(|(ends, _, _)| *ends <= now);
            self.serving = busy;
            for (_, sent, in_flight) in done {
                let latency = now.saturating_duration_since(sent);
                let sample = Sample {
                    latency,
                    started: sent,
                    in_flight,
                    dropped: false,
                    own_lag: Duration::ZERO,
                };
                g.on_sample(now, sample);
            }
            while self.serving.len() < self.workers {
                let Some((sent, in_flight)) = self.waiting.pop_front() else {
                    break;
                };
                self.serving.push((now + self.service, sent, in_flight));
            }
            g.grow_open(now, self.in_flight());
            while self.queued > 0 && self.in_flight() < g.allowed() {
                self.queued -= 1;
                let in_flight = self.in_flight() + 1;
                if self.serving.len() < self.workers {
                    self.serving.push((now + self.service, now, in_flight));
                } else if self.waiting.len() < self.backlog {
                    self.waiting.push_back((now, in_flight));
                } else {
                    self.refused += 1;
                    let sample = Sample {
                        latency: ms(1),
                        started: now,
                        in_flight,
                        dropped: true,
                        own_lag: Duration::ZERO,
                    };
                    g.on_sample(now, sample);
                }
            }
            // As the queue does when requests are left waiting.
            if self.queued > 0 {
                g.grow_open(now, self.in_flight());
            }
        }
    }

    /// Issue 55, item 3: under a flood the app cannot serve, the limit
    /// does not overfill the app's own backlog again and again by probing
    /// (a backlog is first in, first out, whatever weir's lanes said). An
    /// app of 10 workers (400 ms a request) and a backlog of 64, asked 40 a
    /// second (1.6x what it serves) after 10 calm seconds: from 10 s into
    /// the flood on, the backlog holds at most 10 (a probe that doubled
    /// filled it to 18).
    #[test]
    fn under_a_flood_probes_do_not_fill_the_apps_backlog() {
        let start = Instant::now();
        let mut now = start;
        let mut g = limiter(now);
        let mut app = ModelApp::new(10, 64, ms(400));
        let tick = ms(10);
        let mut owed = 0.0;
        let (mut deepest, mut sum, mut n, mut idle) = (0usize, 0usize, 0usize, 0usize);
        for _ in 0..6000u32 {
            now += tick;
            let t = now.duration_since(start).as_secs_f64();
            owed += if t < 10.0 { 15.0 } else { 40.0 } * tick.as_secs_f64();
            while owed >= 1.0 {
                app.queued += 1;
                owed -= 1.0;
            }
            app.tick(&mut g, now);
            if t > 20.0 {
                deepest = deepest.max(app.waiting.len());
                sum += app.waiting.len();
                n += 1;
                idle += usize::from(app.serving.len() < app.workers);
            }
        }
        let mean = sum as f64 / n as f64;
        assert!(
            deepest <= 10,
            "the app's backlog reached {deepest} (mean {mean:.1})"
        );
        // And no worker idles while weir holds the flood back.
        let idle = idle as f64 / n as f64;
        assert!(
            idle < 0.01,
            "workers idled {:.1}% of the time",
            idle * 100.0
        );
    }

    /// Issue 55, item 3: the flood's first second does not overfill the
    /// app's own backlog. After ten calm seconds (15 a second to 10
    /// workers of 400 ms), 361 requests arrive in one second, then 40 a
    /// second. The open limit sent the whole burst at once: the backlog
    /// (64) filled and refused one, and its drain left the limit below the
    /// workers, with weir's queue full: workers idled beside it for a
    /// second. The open bound (64 here) keeps the backlog from filling (54
    /// at most), refuses nothing, and no worker idles beside weir's queue.
    #[test]
    fn a_burst_into_an_open_limit_does_not_overfill_the_apps_backlog() {
        let start = Instant::now();
        let mut now = start;
        let mut g = limiter(now);
        let mut app = ModelApp::new(10, 64, ms(400));
        let tick = ms(10);
        let mut owed = 0.0;
        let (mut deepest, mut idle_beside_queue) = (0usize, 0u32);
        for _ in 0..3000u32 {
            now += tick;
            let t = now.duration_since(start).as_secs_f64();
            owed += match t {
                t if t < 10.0 => 15.0,
                t if t < 11.0 => 361.0,
                _ => 40.0,
            } * tick.as_secs_f64();
            while owed >= 1.0 {
                app.queued += 1;
                owed -= 1.0;
            }
            app.tick(&mut g, now);
            deepest = deepest.max(app.waiting.len());
            if t > 12.0 && app.queued > 0 && app.serving.len() < app.workers {
                idle_beside_queue += 1;
            }
        }
        assert_eq!(app.refused, 0, "the app's backlog refused requests");
        assert!(deepest < 64, "the app's backlog reached {deepest}");
        assert_eq!(
            idle_beside_queue, 0,
            "workers idled beside weir's queue for {idle_beside_queue} ticks"
        );
    }

    /// The open bound holds no ordinary traffic back: a fast app asked
    /// for a thousand at once is given them within a few of its own
    /// latencies, and long polls that never answer open it by time.
    #[test]
    fn the_open_bound_opens_fast_for_an_app_that_keeps_up_and_by_time_for_long_polls() {
        let start = Instant::now();
        let mut now = start;
        let mut g = limiter(now);
        let mut app = ModelApp::new(2000, 64, ms(1));
        app.queued = 1000;
        let mut ticks = 0;
        while app.queued > 0 {
            now += ms(1);
            ticks += 1;
            app.tick(&mut g, now);
            assert!(ticks < 20, "1,000 waited {ticks} ms for a 1 ms app");
        }
        // Long polls: none answers within the run.
        let mut g = limiter(now);
        let mut polls = ModelApp::new(2000, 64, Duration::from_secs(60));
        polls.queued = 500;
        let began = now;
        while polls.queued > 0 {
            now += ms(10);
            polls.tick(&mut g, now);
            assert!(
                now.duration_since(began) < Duration::from_secs(6),
                "long polls held {} s",
                now.duration_since(began).as_secs()
            );
        }
    }

    #[test]
    fn grows_while_latency_is_flat() {
        let mut now = Instant::now();
        let mut g = small(now);
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

    /// Regression (2 of 17 runs of the crawlers-like-people replay): a
    /// baseline learned from raw answers, mostly cheap pages, then fed
    /// normalised answers half again as long with no more in flight than
    /// the app has workers. Learned again, the new scale is the baseline,
    /// not congestion.
    #[test]
    fn a_baseline_learned_again_takes_the_new_scale_for_unqueued() {
        let run = |again: bool| {
            let mut now = Instant::now();
            let mut g = limiter(now);
            drive(&mut g, &mut now, 3, ms(84), Some(10));
            if again {
                g.learn_baseline_again(now);
            }
            drive(&mut g, &mut now, 6, ms(140), Some(10));
            g.limit()
        };
        assert!(run(false) < 10, "the bug: cut below what was in flight");
        assert!(run(true) >= 10, "limit {}", run(true));
    }

    /// Regression (1 of 9 runs since the baseline is learned again): the
    /// first shape was judged mid-window, and the window's answers before
    /// it, on the old scale, made the new baseline. The window starts again.
    #[test]
    fn a_baseline_learned_again_mid_window_ignores_the_old_scale() {
        let mut now = Instant::now();
        let mut g = limiter(now);
        drive(&mut g, &mut now, 1, ms(140), Some(10));
        // Three quarters of a window of raw cheap answers, then the change.
        for _ in 0..15 {
            now += ms(50);
            let sample = Sample {
                latency: ms(84),
                started: now,
                in_flight: 10,
                dropped: false,
                own_lag: Duration::ZERO,
            };
            g.on_sample(now, sample);
        }
        g.learn_baseline_again(now);
        drive(&mut g, &mut now, 6, ms(140), Some(10));
        let long = g.long_rtt().unwrap().as_secs_f64();
        assert!((long - 0.140).abs() < 1e-3, "baseline {long}");
        assert!(g.limit() >= 10, "limit {}", g.limit());
    }

    /// With one request in flight at once nothing weir sends can queue in
    /// the app: latency there is the app's own, and a baseline below it is
    /// wrong. Learned there, the limit grows back instead of staying at
    /// the floor while the app serves one request at a time (a baseline of
    /// 68 ms against 110-210 ms answers had held the limit at 1 for 25 s).
    #[test]
    fn latency_at_one_in_flight_is_never_congestion() {
        let mut now = Instant::now();
        let mut g = limiter(now);
        drive(&mut g, &mut now, 3, ms(68), Some(10));
        for _ in 0..60 {
            if g.limit() == 1 {
                break;
            }
            drive(&mut g, &mut now, 1, ms(140), None);
        }
        assert_eq!(g.limit(), 1, "cut while latency stayed high");
        drive(&mut g, &mut now, 20, ms(140), None);
        assert!(g.limit() > 2, "stuck at {}", g.limit());
        assert!(g.long_rtt().unwrap() >= ms(130), "{:?}", g.long_rtt());
    }

    #[test]
    fn does_not_grow_when_app_limited() {
        let mut now = Instant::now();
        let mut g = limiter(now);
        drive(&mut g, &mut now, 30, ms(100), Some(1));
        assert_eq!(g.limit(), OPEN, "open until the app shows strain");
        assert!(g.probing(), "an idle app ends no slow start");
        let mut g = small(now);
        drive(&mut g, &mut now, 30, ms(100), Some(1));
        assert_eq!(g.limit(), 4);
    }

    #[test]
    fn slow_start_doubles_while_every_slot_is_used() {
        let mut now = Instant::now();
        let mut g = small(now);
        drive(&mut g, &mut now, 4, ms(1), None);
        assert_eq!(g.limit(), 64, "four windows: 4 -> 64");
        assert!(g.probing());
    }

    #[test]
    fn probes_again_after_flat_saturated_windows() {
        let mut now = Instant::now();
        let mut g = small(now);
        drive(&mut g, &mut now, 2, ms(100), None);
        drive(&mut g, &mut now, 1, ms(400), None);
        assert!(!g.probing());
        drive(&mut g, &mut now, REPROBE_AFTER - 1, ms(100), None);
        assert!(!g.probing(), "{}", g.limit());
        drive(&mut g, &mut now, 1, ms(100), None);
        assert!(g.probing(), "five flat windows with every slot used");
    }

    #[test]
    fn slow_start_ends_when_latency_first_rises() {
        let mut now = Instant::now();
        let mut g = limiter(now);
        drive(&mut g, &mut now, 30, ms(100), Some(10));
        drive(&mut g, &mut now, 1, ms(400), None);
        assert!(!g.probing());
        let after_rise = g.limit();
        drive(&mut g, &mut now, 1, ms(100), None);
        assert!(
            g.limit() < after_rise * 2,
            "grows by headroom now: {after_rise} -> {}",
            g.limit()
        );
    }

    /// An app of `workers` workers with a queue in front: a request's
    /// latency is its service time times how many requests share each worker.
    fn queued_latency(workers: usize, in_flight: usize) -> Duration {
        ms(400) * (in_flight.max(workers) as u32) / workers as u32
    }

    #[test]
    fn cuts_to_what_the_app_serves_without_queueing_within_three_windows() {
        let mut now = Instant::now();
        let mut g = limiter(now);
        // A normal day: 3 of 10 workers busy, the limit untouched (open).
        drive(&mut g, &mut now, 30, ms(400), Some(3));
        assert_eq!(g.limit(), OPEN);
        // The flood: 80 at once, the app's own backlog holding the rest.
        let flood = |g: &GradientLimit| g.limit().min(80);
        for _ in 0..3 {
            let n = flood(&g);
            drive(&mut g, &mut now, 1, queued_latency(10, n), Some(n));
        }
        let limit = g.limit();
        assert!(
            (10..=16).contains(&limit),
            "about tolerance x workers (15), got {limit}"
        );
        // And it holds there while the flood lasts.
        for _ in 0..30 {
            let n = flood(&g);
            drive(&mut g, &mut now, 1, queued_latency(10, n), Some(n));
        }
        assert!((10..=20).contains(&g.limit()), "held: {}", g.limit());
    }

    /// Regression (connection-flood-app-full.toml): a flood that began two
    /// seconds after weir started filled the warm-up's plain mean with its
    /// queueing, so the app's backlog (64 deep) stayed full and people
    /// waited in it behind the flood.
    #[test]
    fn a_flood_during_warm_up_is_not_learned_as_normal() {
        let mut now = Instant::now();
        let mut g = limiter(now);
        drive(&mut g, &mut now, 2, ms(400), Some(3));
        for _ in 0..12 {
            let n = g.limit().min(80);
            drive(&mut g, &mut now, 1, queued_latency(10, n), Some(n));
        }
        assert!(
            (10..=20).contains(&g.limit()),
            "about tolerance x workers (15), got {}",
            g.limit()
        );
    }

    #[test]
    fn one_slow_window_cuts_at_most_half_of_what_was_in_use() {
        let mut now = Instant::now();
        let mut g = limiter(now);
        drive(&mut g, &mut now, 30, ms(100), Some(40));
        assert_eq!(g.limit(), OPEN);
        drive(&mut g, &mut now, 1, ms(1000), Some(40));
        assert_eq!(g.limit(), 20, "half of the 40 in use");
    }

    #[test]
    fn noise_on_a_fast_app_is_not_congestion() {
        let mut now = Instant::now();
        let mut g = limiter(now);
        drive(&mut g, &mut now, 30, ms(1), Some(40));
        drive(&mut g, &mut now, 1, ms(4), Some(40));
        assert_eq!(g.limit(), OPEN, "1 ms to 4 ms is under the 5 ms floor");
    }

    /// Answers from a 1 ms app read 100 ms late: with weir's scheduler 60 ms
    /// behind (two polls explain 120 ms) that is weir's saturation, and the
    /// limit stays; with no lag it is the app's queueing, and it is cut.
    #[test]
    fn latency_weirs_own_lag_explains_is_not_congestion() {
        let run = |own_lag: Duration| {
            let mut now = Instant::now();
            let mut g = limiter(now);
            drive(&mut g, &mut now, 30, ms(1), Some(4000));
            for _ in 0..3 {
                for _ in 0..20 {
                    now += ms(50);
                    let sample = Sample {
                        latency: ms(100),
                        started: now,
                        in_flight: 4000,
                        dropped: false,
                        own_lag,
                    };
                    g.on_sample(now, sample);
                }
            }
            g.limit()
        };
        assert_eq!(run(ms(60)), OPEN, "weir's own lag");
        assert!(run(Duration::ZERO) < OPEN / 2, "the app's queueing");
    }

    /// Issue 35: one long poll (3 s) in a window of 3 ms pages is one slow
    /// answer, not queueing. The window's mean read it as congestion and
    /// cut an idle app's limit; the median does not move.
    #[test]
    fn a_long_poll_among_pages_is_not_congestion() {
        let mut now = Instant::now();
        let mut g = limiter(now);
        drive(&mut g, &mut now, 30, ms(3), Some(40));
        for window in 0..10 {
            for i in 0..200 {
                now += ms(5);
                let latency = if i == 100 { ms(3000) } else { ms(3) };
                let sample = Sample {
                    latency,
                    started: now,
                    in_flight: 40,
                    dropped: false,
                    own_lag: Duration::ZERO,
                };
                g.on_sample(now, sample);
            }
            assert_eq!(g.limit(), OPEN, "window {window}");
        }
        // Queueing delays every answer: that is still seen.
        drive(&mut g, &mut now, 3, ms(30), Some(40));
        assert!(g.limit() < OPEN, "{}", g.limit());
    }

    /// Issue 35: an app restarting under its requests resets every one it
    /// held, each having started with fewer in flight than the last. One
    /// episode is one cut, from the most the app had just answered at once
    /// (a reset of a request it held alone says nothing about how many it
    /// holds): no ceiling, and the limit probes back (doubles) at the first
    /// window with every slot used and latency flat, instead of creeping
    /// for five. A burst into a small backlog is still cut to below its
    /// fewest refused, refused in any order.
    #[test]
    fn a_burst_of_resets_is_one_cut_and_the_limit_comes_back_at_once() {
        let mut now = Instant::now();
        let mut g = small(now);
        drive(&mut g, &mut now, 3, ms(10), None);
        assert_eq!(g.limit(), 32, "probing: 4 -> 32");
        drive(&mut g, &mut now, 1, ms(10), Some(20));
        let granted = now;
        now += ms(1100);
        let reset = |in_flight| Sample {
            latency: ms(5),
            started: granted,
            in_flight,
            dropped: true,
            own_lag: Duration::ZERO,
        };
        assert_eq!(g.on_sample(now, reset(20)), Some(18), "20 x 0.9");
        for in_flight in (1..20).rev() {
            assert_eq!(g.on_sample(now, reset(in_flight)), None, "{in_flight}");
        }
        assert_eq!(g.limit(), 18, "one cut for the episode");
        drive(&mut g, &mut now, 1, ms(10), None);
        assert_eq!(g.limit(), 36, "probing again after one flat window");

        // A cold burst of 32 into 4 workers and no backlog: refused from
        // the fifth, the refusals read back in any order.
        let mut g = limiter(now);
        now += ms(10);
        for in_flight in [17, 32, 5, 9, 6] {
            g.on_sample(now, reset(in_flight));
        }
        assert_eq!(g.limit(), 4, "from the fewest refused, 5 x 0.9");
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
            started: now,
            in_flight: before,
            dropped: true,
            own_lag: Duration::ZERO,
        };
        let after = g.on_sample(now, sample).unwrap_or(usize::MAX);
        // ×0.9 of the unrounded limit: within one of ×0.9 of the rounded one.
        assert!(
            after < before && after + 1 >= before * 9 / 10,
            "{before} -> {after}"
        );
    }

    #[test]
    fn drops_back_off_from_the_concurrency_that_dropped() {
        let mut now = Instant::now();
        let mut g = limiter(now);
        drive(&mut g, &mut now, 5, ms(100), Some(3));
        assert_eq!(g.limit(), OPEN);
        // 4 workers and a backlog of 2: the seventh request is refused.
        now += ms(1100);
        let refused = Sample {
            latency: ms(1),
            started: now,
            in_flight: 7,
            dropped: true,
            own_lag: Duration::ZERO,
        };
        assert_eq!(g.on_sample(now, refused), Some(6), "7 x 0.9");
    }

    #[test]
    fn a_drop_cuts_at_once_and_drops_from_before_the_cut_do_not_cut_again() {
        let mut now = Instant::now();
        let mut g = limiter(now);
        now += ms(10);
        let dropped = |in_flight| Sample {
            latency: ms(1),
            started: now,
            in_flight,
            dropped: true,
            own_lag: Duration::ZERO,
        };
        // Within the first window: 80 requests in flight, the app takes 40.
        assert_eq!(g.on_sample(now, dropped(41)), Some(36), "41 x 0.9, at once");
        for in_flight in 42..=80 {
            assert_eq!(g.on_sample(now, dropped(in_flight)), None, "{in_flight}");
        }
        assert_eq!(g.limit(), 36, "one cut for the burst");
        assert_eq!(
            g.on_sample(now, dropped(36)),
            Some(32),
            "a drop under the new limit"
        );
    }

    #[test]
    fn a_drop_is_a_ceiling_until_it_lapses() {
        let mut now = Instant::now();
        let mut g = small(now);
        drive(&mut g, &mut now, 3, ms(100), None);
        assert_eq!(g.limit(), 32, "probing: 4 -> 32");
        // The app's backlog overflows at 20 in flight: it answers 19 at
        // once, and its latency stays flat (a full backlog refuses, it
        // does not queue).
        drive(&mut g, &mut now, 1, ms(100), Some(19));
        let refused = |now: Instant| Sample {
            latency: ms(1),
            started: now,
            in_flight: 20,
            dropped: true,
            own_lag: Duration::ZERO,
        };
        now += ms(1100);
        assert_eq!(g.on_sample(now, refused(now)), Some(18), "20 x 0.9");
        drive(&mut g, &mut now, 3, ms(100), Some(19));
        assert!(g.limit() > 18, "one drop sets no ceiling: {}", g.limit());
        // Again at 20: a backlog that overflows where it did before.
        now += ms(1100);
        assert_eq!(g.on_sample(now, refused(now)), Some(18));
        drive(&mut g, &mut now, CEILING_HOLD - 2, ms(100), None);
        assert_eq!(g.limit(), 18, "every slot used and flat, yet held");
        drive(&mut g, &mut now, 10, ms(100), None);
        assert!(g.limit() > 18, "the ceiling lapsed: {}", g.limit());
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
            started: now,
            in_flight: 4,
            dropped: false,
            own_lag: Duration::ZERO,
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
                initial: 20_000,
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
