//! Learned request shapes: which kinds of request are expensive for the app,
//! from what their answers took, so that a pool nobody configured still lets
//! cheap pages pass expensive ones while the app is full.
//!
//! A [`Shape`] is what a request's cost usually depends on: its path prefix
//! (up to two segments, the last segment left out unless it names a script
//! such as `index.php`, since a leaf is usually a title or an id) and the set
//! of its query keys. `/wiki/Foo` and `/wiki/Bar` are one shape;
//! `/w/index.php?title=X` and `/w/index.php?title=X&action=history` are two.
//! [`ShapeCosts`] keeps per shape (bounded in number) its *floor*, a smoothed
//! latency that falls quickly and rises slowly (queueing only adds, so the
//! floor is what the shape costs unqueued, near its lowest percentile), and per
//! pool the cheapest judged floor.
//!
//! - A shape is *expensive* once it has [`MIN_SAMPLES`] answers and its
//!   floor is at least [`EXPENSIVE_RATIO`] times the cheapest one and at
//!   least [`EXPENSIVE_FLOOR`]. (Judged by the mean, cheap pages queued in
//!   the app behind a flood looked expensive too.) A shape not learned yet
//!   (new, or past the table's bound) is judged by its path prefix alone, so
//!   random query keys do not buy a request the cheap lane. Only classes
//!   without a configured `lane` follow it (`proxy::admit`): expensive
//!   shapes wait in the lowest lane.
//! - [`ShapeCosts::record`] returns each answer's latency *as if the request
//!   had been of a typical shape* (scaled from its shape's floor to the
//!   typical one), for the adaptive limit: a flood of slow searches raises
//!   the mean latency without any queueing, and a limit fed raw latencies
//!   reads that as overload and cuts until the app stands idle.
//!
//! This module refuses nothing and queues nothing.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::Duration;

use weir_http::target::{Target, query_keys};

/// How many times the cheapest shape's unqueued latency an expensive one takes.
pub const EXPENSIVE_RATIO: f64 = 3.0;
/// An expensive shape takes at least this long (a 5 ms API call is not
/// expensive beside a 1 ms health check).
pub const EXPENSIVE_FLOOR: Duration = Duration::from_millis(50);
/// The most a shape's unqueued latency may be for it to be *fast*: a
/// health check that waits behind one such answer still has most of any
/// timeout it is given (see [`ShapeCosts::is_fast`]).
pub const FAST_FLOOR: Duration = Duration::from_millis(100);
/// Answers a shape needs before it can be judged.
pub const MIN_SAMPLES: u32 = 20;
/// Shapes remembered per pool; past it, the least answered are forgotten.
pub const MAX_SHAPES: usize = 4096;
/// Answers between two refreshes of the cheapest judged floor.
const CHEAPEST_EVERY: u64 = 64;
/// Query keys that make a shape; a request with more is its first ones'.
const MAX_KEYS: usize = 8;
/// Weight of one answer in the typical latency: a memory of about a
/// thousand answers, so a flood of expensive requests moves it slowly.
const BASELINE_ALPHA: f64 = 0.001;
/// Weights of an answer in its shape's floor: below the floor it pulls
/// quickly, above it (queueing, or a slower app) slowly.
const FLOOR_DOWN_ALPHA: f64 = 0.1;
const FLOOR_UP_ALPHA: f64 = 0.0005;

/// A request's shape: its path prefix, with and without its query keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    full: u64,
    prefix: u64,
}

impl Shape {
    /// The shape of a canonical target (no allocation: keys are hashed as
    /// they are decoded, in a fixed order by their own hash).
    pub fn of(target: &Target) -> Shape {
        let prefix_text = path_prefix(target.path());
        let prefix = hash_one(prefix_text);
        let mut keys = [0u64; MAX_KEYS];
        let mut n = 0;
        if let Some(query) = target.query() {
            for key in query_keys(query) {
                let h = hash_one(&*key);
                if n < MAX_KEYS && !keys[..n].contains(&h) {
                    keys[n] = h;
                    n += 1;
                }
            }
        }
        keys[..n].sort_unstable();
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        prefix.hash(&mut hasher);
        keys[..n].hash(&mut hasher);
        Shape {
            full: hasher.finish(),
            prefix,
        }
    }
}

fn hash_one<T: Hash + ?Sized>(value: &T) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// Up to two leading segments; the last segment only if it names a script.
fn path_prefix(path: &str) -> &str {
    let mut end = 0;
    let mut segments = 0;
    for (i, b) in path.bytes().enumerate().skip(1) {
        if b == b'/' {
            end = i;
            segments += 1;
            if segments == 2 {
                return &path[..end];
            }
        }
    }
    // `path[end..]` is the leaf (after the last `/` seen).
    let leaf = &path[end..];
    if is_script(leaf) {
        path
    } else {
        &path[..end.max(1)]
    }
}

fn is_script(leaf: &str) -> bool {
    const SCRIPTS: [&str; 8] = [".php", ".cgi", ".pl", ".py", ".asp", ".aspx", ".jsp", ".do"];
    SCRIPTS.iter().any(|s| leaf.ends_with(s))
}

#[derive(Debug, Clone, Copy)]
struct Cost {
    floor_secs: f64,
    samples: u32,
}

impl Cost {
    /// Counts one answer of `secs`; `at_limit`: it was sent while the app
    /// held all weir lets it have (see [`ShapeCosts::record`]).
    fn add(&mut self, secs: f64, at_limit: bool) {
        self.samples = self.samples.saturating_add(1);
        if at_limit && self.samples > MIN_SAMPLES && secs > self.floor_secs {
            return;
        }
        // The first answers (until the shape can be judged) are a plain
        // mean, then the asymmetric average: a plain mean any longer would
        // let a flood's queueing lift a cheap page's floor within a hundred
        // answers (seen in CI: pages judged expensive).
        let floor_alpha = if self.samples <= MIN_SAMPLES {
            1.0 / self.samples as f64
        } else if secs < self.floor_secs {
            FLOOR_DOWN_ALPHA
        } else {
            FLOOR_UP_ALPHA
        };
        self.floor_secs += floor_alpha * (secs - self.floor_secs);
    }
}

/// Costs by shape hash. Looked up four or five times per answer: foldhash,
/// seeded per process, instead of SipHash (~110 instructions a lookup); the
/// keys are SipHash values of what clients sent, and the seed keeps which
/// of them share a bucket unpredictable.
type Costs = HashMap<u64, Cost, foldhash::fast::RandomState>;

#[derive(Debug, Default, Clone)]
struct Table {
    shapes: Costs,
    prefixes: Costs,
    /// Smoothed ln(latency in seconds) over every answer.
    baseline_ln: Option<f64>,
    /// The lowest floor of a judged shape (refreshed every
    /// [`CHEAPEST_EVERY`] answers): what expensive is measured against. Not
    /// a mean over answers, which a flood of one shape drags to itself.
    cheapest_secs: Option<f64>,
    answers: u64,
}

/// One answer as [`ShapeCosts::record_answer`] saw it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Recorded {
    /// The latency for the adaptive limit (see [`ShapeCosts::record`]).
    pub latency: Duration,
    /// The first shape was judged with this answer: later latencies are on
    /// another scale than those before.
    pub rescaled: bool,
}

/// What each shape of a pool's requests costs (see the module doc).
#[derive(Debug, Default)]
pub struct ShapeCosts {
    table: Mutex<Table>,
}

/// What a pool learned of its request shapes, for the next process (an
/// upgrade's hand-off, the file beside the limiter snapshot): the shapes
/// and prefixes judged already (at least [`MIN_SAMPLES`] answers), as
/// `(hash, floor in seconds, answers)`. Shape hashes are SipHash with fixed
/// keys: the same in every process.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LearnedShapes {
    pub shapes: Vec<(u64, f64, u32)>,
    pub prefixes: Vec<(u64, f64, u32)>,
    pub baseline_ln: Option<f64>,
}

impl ShapeCosts {
    pub fn new() -> ShapeCosts {
        ShapeCosts::default()
    }

    /// The judged shapes and prefixes, for the next process.
    pub fn learned(&self) -> LearnedShapes {
        let t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let judged = |m: &Costs| {
            m.iter()
                .filter(|(_, c)| c.samples >= MIN_SAMPLES)
                .map(|(k, c)| (*k, c.floor_secs, c.samples))
                .collect()
        };
        LearnedShapes {
            shapes: judged(&t.shapes),
            prefixes: judged(&t.prefixes),
            baseline_ln: t.baseline_ln,
        }
    }

    /// Continues from what the previous process learned: each shape it
    /// judged and this one has not yet, and its baseline while this one
    /// has none. Values that are not finite and positive are ignored.
    pub fn resume(&self, learned: &LearnedShapes) {
        let mut guard = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let t = &mut *guard;
        for (map, entries) in [
            (&mut t.shapes, &learned.shapes),
            (&mut t.prefixes, &learned.prefixes),
        ] {
            for &(key, floor_secs, samples) in entries.iter().take(MAX_SHAPES) {
                if floor_secs.is_finite() && floor_secs > 0.0 && map.len() < MAX_SHAPES {
                    map.entry(key).or_insert(Cost {
                        floor_secs,
                        samples: samples.max(MIN_SAMPLES),
                    });
                }
            }
        }
        if t.baseline_ln.is_none() {
            t.baseline_ln = learned.baseline_ln.filter(|b| b.is_finite());
        }
        // Judged at once, not after the next CHEAPEST_EVERY answers.
        t.cheapest_secs = (t.shapes.values())
            .filter(|c| c.samples >= MIN_SAMPLES)
            .map(|c| c.floor_secs)
            .reduce(f64::min);
        t.answers = t
            .answers
            .max(t.shapes.values().map(|c| u64::from(c.samples)).sum());
    }

    /// Takes over what `other` learned (a reload that rebuilt the pool's
    /// queue: the app's shapes did not change with its settings).
    pub fn continue_from(&self, other: &ShapeCosts) {
        let learned = other
            .table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        *self.table.lock().unwrap_or_else(|p| p.into_inner()) = learned;
    }

    /// Records one answer of `shape` that took `latency` (to its head), and
    /// returns the latency the adaptive limit should see: `latency` scaled
    /// from its shape's floor to the pool's typical latency (unchanged while
    /// the shape has too few answers).
    ///
    /// `at_limit`: the request was sent at the admission limit, so it may
    /// have queued in the app. Such an answer may lower a judged shape's
    /// floor, never raise it: a flood keeps the app at its limit for as
    /// long as it lasts, and the pages answered all that while (the
    /// shape answered most) crept up by their queueing until they were
    /// judged expensive, while a shape answered rarely kept its floor
    /// (seen in the 2026-09-23 replay: pages from 33 ms to 50 ms in nine
    /// seconds, and a carrier's people behind the crawlers).
    pub fn record(&self, shape: Shape, latency: Duration, at_limit: bool) -> Duration {
        self.record_answer(shape, latency, at_limit).latency
    }

    /// [`ShapeCosts::record`], also saying whether this answer made the
    /// first shape judged: the latencies it returns change scale then (a
    /// judged shape's are normalised to the typical floor, which lies above
    /// a cheap page's own), and what was learned of them before is on the
    /// other scale.
    pub fn record_answer(&self, shape: Shape, latency: Duration, at_limit: bool) -> Recorded {
        let secs = latency.as_secs_f64().max(1e-6);
        let mut guard = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let t = &mut *guard;
        let normalised = match (t.shapes.get(&shape.full), t.baseline_ln) {
            (Some(c), Some(b)) if c.samples >= MIN_SAMPLES && c.floor_secs > 0.0 => {
                Duration::from_secs_f64((secs / c.floor_secs * b.exp()).min(3600.0))
            }
            _ => latency,
        };
        t.answers += 1;
        for (map, key) in [(&mut t.shapes, shape.full), (&mut t.prefixes, shape.prefix)] {
            if map.len() >= MAX_SHAPES && !map.contains_key(&key) {
                forget_least_answered(map);
            }
            map.entry(key)
                .or_insert(Cost {
                    floor_secs: secs,
                    samples: 0,
                })
                .add(secs, at_limit);
        }
        let unjudged = t.cheapest_secs.is_none();
        if t.answers % CHEAPEST_EVERY == 1 || unjudged {
            t.cheapest_secs = (t.shapes.values())
                .filter(|c| c.samples >= MIN_SAMPLES)
                .map(|c| c.floor_secs)
                .reduce(f64::min);
        }
        let floor = t.shapes.get(&shape.full).map_or(secs, |c| c.floor_secs);
        let alpha = (1.0 / t.answers as f64).max(BASELINE_ALPHA);
        t.baseline_ln = Some(match t.baseline_ln {
            None => floor.ln(),
            Some(b) => b + alpha * (floor.ln() - b),
        });
        Recorded {
            latency: normalised,
            rescaled: unjudged && t.cheapest_secs.is_some(),
        }
    }

    /// What is known of `shape`'s cost: judged by its own answers once
    /// learned, else by its prefix's; `Unknown` when neither has enough
    /// answers; `Learning` while no shape of the pool has been judged.
    pub fn judgement(&self, shape: Shape) -> Judgement {
        let t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let Some(cheapest) = t.cheapest_secs else {
            return Judgement::Learning;
        };
        let cost = t
            .shapes
            .get(&shape.full)
            .filter(|c| c.samples >= MIN_SAMPLES)
            .or_else(|| t.prefixes.get(&shape.prefix))
            .filter(|c| c.samples >= MIN_SAMPLES);
        match cost {
            None => Judgement::Unknown,
            Some(c) if is_expensive(c.floor_secs, cheapest) => Judgement::Expensive,
            Some(_) => Judgement::Cheap,
        }
    }

    /// Whether `shape` is expensive: its own cost once learned, else its
    /// prefix's.
    pub fn is_expensive(&self, shape: Shape) -> bool {
        self.judgement(shape) == Judgement::Expensive
    }

    /// Whether `shape` is fast: judged by its own answers (not its
    /// prefix's), not expensive, and its floor at most [`FAST_FLOOR`]. Only
    /// such a request may use the worker kept for health checks
    /// ([`crate::admission::AdmissionQueue`]); a shape not learned yet is
    /// never fast.
    pub fn is_fast(&self, shape: Shape) -> bool {
        let t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let Some(cheapest) = t.cheapest_secs else {
            return false;
        };
        (t.shapes.get(&shape.full)).is_some_and(|c| {
            c.samples >= MIN_SAMPLES
                && c.floor_secs <= FAST_FLOOR.as_secs_f64()
                && !is_expensive(c.floor_secs, cheapest)
        })
    }

    /// How many learned shapes are expensive now (for the metric).
    pub fn expensive_shapes(&self) -> usize {
        let t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let Some(typical) = t.cheapest_secs else {
            return 0;
        };
        t.shapes
            .values()
            .filter(|c| c.samples >= MIN_SAMPLES && is_expensive(c.floor_secs, typical))
            .count()
    }
}

/// What [`ShapeCosts::judgement`] knows of a shape's cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judgement {
    Cheap,
    Expensive,
    /// The pool has judged shapes, but neither this one nor its prefix.
    Unknown,
    /// The pool has judged no shape yet (a first start).
    Learning,
}

fn is_expensive(floor_secs: f64, typical_secs: f64) -> bool {
    floor_secs >= EXPENSIVE_FLOOR.as_secs_f64() && floor_secs >= EXPENSIVE_RATIO * typical_secs
}

/// Drops the least answered half of a full map (rare: once per
/// `MAX_SHAPES / 2` new shapes), so a stream of one-off shapes cannot push
/// out the well-known ones.
fn forget_least_answered(map: &mut Costs) {
    let mut counts: Vec<u32> = map.values().map(|c| c.samples).collect();
    let mid = counts.len() / 2;
    let (_, median, _) = counts.select_nth_unstable(mid);
    let median = *median;
    let mut to_drop = map.len() - mid;
    map.retain(|_, c| {
        if to_drop > 0 && c.samples <= median {
            to_drop -= 1;
            false
        } else {
            true
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(path_and_query: &str) -> Target {
        use weir_http::target::PathPolicy;
        Target::parse(
            "GET",
            path_and_query,
            Some("a.example"),
            PathPolicy::default(),
        )
        .unwrap()
    }

    fn shape(path_and_query: &str) -> Shape {
        Shape::of(&target(path_and_query))
    }

    #[test]
    fn prefixes() {
        let cases = [
            ("/", "/"),
            ("/foo", "/"),
            ("/wiki/Foo", "/wiki"),
            ("/wiki/Foo/bar", "/wiki/Foo"),
            ("/w/index.php", "/w/index.php"),
            ("/index.php", "/index.php"),
            ("/api/v1/users/7", "/api/v1"),
            ("/static/app.css", "/static"),
        ];
        for (path, want) in cases {
            assert_eq!(path_prefix(path), want, "{path}");
        }
    }

    /// The answer that judges the first shape says so, once: the adaptive
    /// limit learns its baseline again on the normalised scale.
    #[test]
    fn the_first_judged_shape_rescales_once() {
        let costs = ShapeCosts::new();
        let rescaled: Vec<bool> = (0..60)
            .map(|i| {
                let path = if i % 2 == 0 { "/wiki/Page" } else { "/search" };
                let ms = if i % 2 == 0 { 50 } else { 400 };
                (costs.record_answer(shape(path), Duration::from_millis(ms), false)).rescaled
            })
            .collect();
        let at: Vec<usize> = (rescaled.iter().enumerate())
            .filter(|(_, r)| **r)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(at, [MIN_SAMPLES as usize * 2 - 2], "the pages' 20th answer");
    }

    #[test]
    fn shapes_group_by_prefix_and_query_keys() {
        assert_eq!(shape("/wiki/Foo"), shape("/wiki/Bar"));
        assert_eq!(
            shape("/w/index.php?search=a&title=b"),
            shape("/w/index.php?title=x&search=y")
        );
        assert_eq!(
            shape("/w/index.php?%73earch=a"),
            shape("/w/index.php?search=b")
        );
        assert_ne!(
            shape("/w/index.php?title=X"),
            shape("/w/index.php?title=X&action=history")
        );
        assert_ne!(shape("/w/index.php?search=a"), shape("/w/api.php?search=a"));
    }

    fn learn(costs: &ShapeCosts, path: &str, ms: u64, n: u32) {
        for _ in 0..n {
            costs.record(shape(path), Duration::from_millis(ms), false);
        }
    }

    #[test]
    fn slow_shapes_become_expensive_cheap_ones_never() {
        let costs = ShapeCosts::new();
        learn(&costs, "/wiki/Page", 20, 200);
        learn(&costs, "/w/index.php?search=a", 400, 30);
        assert!(costs.is_expensive(shape("/w/index.php?search=other")));
        assert!(!costs.is_expensive(shape("/wiki/Other")));
        assert_eq!(costs.expensive_shapes(), 1);
    }

    /// What a process learned goes on in the next (an upgrade, a restart
    /// within ten minutes): its judged shapes are judged at once, through
    /// JSON as beside the snapshot; unjudged ones are not carried.
    #[test]
    fn learned_shapes_go_on_in_the_next_process() {
        let old = ShapeCosts::new();
        learn(&old, "/wiki/Page", 20, 200);
        learn(&old, "/w/index.php?search=a", 400, 30);
        learn(&old, "/rare/thing", 900, 3);
        let text = serde_json::to_string(&old.learned()).unwrap();
        let new = ShapeCosts::new();
        assert!(!new.is_expensive(shape("/w/index.php?search=b")));
        new.resume(&serde_json::from_str(&text).unwrap());
        assert!(new.is_expensive(shape("/w/index.php?search=b")));
        assert!(!new.is_expensive(shape("/wiki/Other")));
        assert_eq!(new.expensive_shapes(), 1);
        assert_eq!(
            new.learned().shapes.len(),
            2,
            "the rare shape was not judged"
        );
    }

    #[test]
    fn a_change_of_mix_is_not_queueing_but_queueing_is() {
        let costs = ShapeCosts::new();
        learn(&costs, "/wiki/Page", 60, 300);
        learn(&costs, "/w/index.php?search=a", 400, 100);
        let seen = |path: &str, ms: u64| {
            costs
                .record(shape(path), Duration::from_millis(ms), false)
                .as_secs_f64()
        };
        // Unqueued, a search and a page look alike to the limit.
        let (search, page) = (seen("/w/index.php?search=b", 400), seen("/wiki/P", 60));
        assert!((search / page - 1.0).abs() < 0.05, "{search} vs {page}");
        // Queued for as long again, a search looks twice as slow.
        let queued = seen("/w/index.php?search=c", 800);
        assert!((queued / search - 2.0).abs() < 0.1, "{queued} vs {search}");
    }

    #[test]
    fn pages_queued_behind_a_flood_stay_cheap() {
        let costs = ShapeCosts::new();
        learn(&costs, "/wiki/Page", 20, 300);
        learn(&costs, "/w/index.php?search=a", 200, 50);
        // The flood: searches, and pages waiting a second in the app's queue.
        for _ in 0..100 {
            learn(&costs, "/w/index.php?search=a", 1200, 3);
            learn(&costs, "/wiki/Page", 1000, 1);
        }
        assert!(!costs.is_expensive(shape("/wiki/Other")));
        assert!(costs.is_expensive(shape("/w/index.php?search=b")));
    }

    /// Regression: the floor followed a plain mean until 1/n fell below
    /// its rising weight, so 90 answers at 10 ms then 150 queued at 400 ms
    /// made a cheap page expensive.
    #[test]
    fn a_young_cheap_shape_stays_cheap_when_its_answers_queue() {
        let costs = ShapeCosts::new();
        learn(&costs, "/wiki/Page", 10, 90);
        learn(&costs, "/w/index.php?search=a", 100, 30);
        learn(&costs, "/wiki/Page", 400, 150);
        assert!(!costs.is_expensive(shape("/wiki/Other")));
    }

    /// Regression (2026-09-23 replay, weir's defaults): through the flood
    /// the app was always at weir's limit, so every page waited a little in
    /// its backlog. The pages (most answers) crept up from 33 ms until they
    /// were judged expensive beside a login answered rarely at 6 ms, and
    /// waited behind the crawlers; a carrier's people timed out.
    #[test]
    fn answers_at_the_limit_never_raise_a_floor() {
        let run = |at_limit: bool| {
            let costs = ShapeCosts::new();
            learn(&costs, "/wiki/Page", 35, 300);
            learn(&costs, "/w/index.php?title=Special:UserLogin", 6, 30);
            learn(&costs, "/w/index.php?search=a", 250, 50);
            for _ in 0..1500 {
                let page = shape("/wiki/Page");
                costs.record(page, Duration::from_millis(100), at_limit);
            }
            let search = shape("/w/index.php?search=b");
            (
                costs.is_expensive(shape("/wiki/Other")),
                costs.is_expensive(search),
            )
        };
        assert_eq!(run(true), (false, true), "the flood's queueing ignored");
        assert_eq!(
            run(false),
            (true, true),
            "unqueued, a slower page is learned"
        );
    }

    #[test]
    fn too_few_answers_judge_nothing() {
        let costs = ShapeCosts::new();
        learn(&costs, "/wiki/Page", 20, 200);
        learn(&costs, "/w/index.php?search=a", 400, MIN_SAMPLES - 1);
        assert!(!costs.is_expensive(shape("/w/index.php?search=a")));
    }

    #[test]
    fn a_fast_app_has_no_expensive_shapes() {
        let costs = ShapeCosts::new();
        learn(&costs, "/health", 1, 200);
        learn(&costs, "/api/v1/items", 10, 200);
        assert!(
            !costs.is_expensive(shape("/api/v1/items")),
            "under the floor"
        );
    }

    #[test]
    fn unknown_query_keys_are_judged_by_their_prefix() {
        let costs = ShapeCosts::new();
        learn(&costs, "/wiki/Page", 20, 400);
        learn(&costs, "/w/index.php?search=a", 400, 100);
        assert!(costs.is_expensive(shape("/w/index.php?search=a&x9f3=1")));
    }

    #[test]
    fn the_table_stays_bounded_and_keeps_well_known_shapes() {
        let costs = ShapeCosts::new();
        learn(&costs, "/wiki/Page", 20, 400);
        learn(&costs, "/w/index.php?search=a", 400, 100);
        for i in 0..MAX_SHAPES * 2 {
            costs.record(
                shape(&format!("/w/index.php?k{i}=1")),
                Duration::from_millis(20),
                false,
            );
        }
        let t = costs.table.lock().unwrap();
        assert!(t.shapes.len() <= MAX_SHAPES);
        drop(t);
        assert!(costs.is_expensive(shape("/w/index.php?search=b")));
    }
}
