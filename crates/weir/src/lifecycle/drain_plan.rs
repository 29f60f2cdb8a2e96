//! How long a plain stop may keep accepting new connections: long enough
//! to serve them at once, short enough that what it accepts can finish
//! inside `process.drain_timeout`, the grace weir plans for (docker's 10 s,
//! Kubernetes' 30 s: `docs/operations.md`).
//!
//! It owns [`RequestSpans`], how long requests took lately, and the plan
//! drawn from it ([`accepting_for`]). It does not accept, drop handshakes or
//! close anything: `server`'s drain does, by this plan. Nor does it keep
//! them across processes: `state` writes them beside the snapshot.
//!
//! Why: a container's stop ends in SIGKILL. A drain that accepted until its
//! earlier work was done took in uploads, six seconds into docker's ten,
//! that needed more than the four left, and the kill cut them (issue 56).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long requests took lately, in 64 geometric buckets (each 19% wider
/// than the one before, from 64 ms to about an hour), one bit each: seen or
/// not, in this period or the one before.
///
/// Written on every request, so it is one relaxed load and, the first time
/// a bucket is seen in a period, one `fetch_or`: the line stays shared
/// between the workers' caches instead of bouncing on a counter. A maximum
/// would not do: a stream or a long poll longer than the whole drain says
/// nothing of what the drain can finish, and would hide the uploads that
/// it can.
#[derive(Debug)]
pub struct RequestSpans {
    epoch: Instant,
    period: AtomicU64,
    current: AtomicU64,
    previous: AtomicU64,
    /// Whether an earlier process's spans were taken ([`Self::remember`]).
    inherited: AtomicBool,
}

/// How long a period is: what a request took is remembered for one or two.
const PERIOD: Duration = Duration::from_secs(300);

/// The first bucket's upper edge; shorter requests all fall in it.
const FIRST_EDGE_MS: f64 = 64.0;

/// Buckets per doubling of the time.
const PER_DOUBLING: f64 = 4.0;

/// What the accepting phase leaves for the work it took in, at least: a
/// page accepted at its last moment still has time to be answered.
pub const MIN_RESERVE: Duration = Duration::from_secs(1);

impl Default for RequestSpans {
    fn default() -> Self {
        RequestSpans::new(Instant::now())
    }
}

impl RequestSpans {
    pub fn new(now: Instant) -> RequestSpans {
        RequestSpans {
            epoch: now,
            period: AtomicU64::new(0),
            current: AtomicU64::new(0),
            previous: AtomicU64::new(0),
            inherited: AtomicBool::new(false),
        }
    }

    /// A request took `took`, from its head to the end of its answer.
    pub fn note(&self, took: Duration) {
        let bit = 1u64 << bucket(took);
        if self.current.load(Ordering::Relaxed) & bit == 0 {
            self.current.fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// Starts a new period once [`PERIOD`] has passed (the sweep calls this
    /// twice a second). A period skipped forgets both.
    pub fn rotate(&self, now: Instant) {
        let period = now.saturating_duration_since(self.epoch).as_secs() / PERIOD.as_secs();
        let was = self.period.swap(period, Ordering::Relaxed);
        if was == period {
            return;
        }
        let seen = self.current.swap(0, Ordering::Relaxed);
        let kept = if period == was + 1 { seen } else { 0 };
        self.previous.store(kept, Ordering::Relaxed);
    }

    /// The buckets seen lately, for the next process (`state` keeps them
    /// beside the snapshot): a process stopped soon after its start has
    /// seen few long requests of its own.
    pub fn seen(&self) -> u64 {
        self.current.load(Ordering::Relaxed) | self.previous.load(Ordering::Relaxed)
    }

    /// Takes what an earlier process saw ([`Self::seen`]) as this
    /// process's previous period.
    pub fn remember(&self, seen: u64) {
        self.previous.fetch_or(seen, Ordering::Relaxed);
        self.inherited.store(true, Ordering::Relaxed);
    }

    /// Whether these spans may not yet show the site's long requests: a
    /// process younger than a period, that took none from an earlier one.
    pub fn unproven(&self, now: Instant) -> bool {
        !self.inherited.load(Ordering::Relaxed)
            && now.saturating_duration_since(self.epoch) < PERIOD
    }

    /// The longest time requests took lately that is still within `limit`:
    /// the upper edge of the highest bucket seen that begins within it, at
    /// most `limit` (0 if none was).
    pub fn longest_within(&self, limit: Duration) -> Duration {
        let seen = self.seen();
        (0..64u32)
            .rev()
            .filter(|b| seen & (1u64 << b) != 0)
            .find(|b| lower_edge(*b) <= limit)
            .map_or(Duration::ZERO, |b| upper_edge(b).min(limit))
    }
}

/// How long a drain with `deadline` may keep accepting: until what requests
/// lately took (those that could finish in the drain at all) is all that is
/// left, and never less than [`MIN_RESERVE`] before the deadline.
///
/// A process that has not watched its site for a period yet
/// ([`RequestSpans::unproven`]) may not have seen its long requests finish;
/// it also leaves twice what the oldest request in flight at the signal
/// has run (`oldest`, at most the whole drain). A request caught under
/// way is, on average, half done: an upload 4 s into its body says
/// uploads here take about 8.
pub fn accepting_for(
    deadline: Duration,
    spans: &RequestSpans,
    now: Instant,
    oldest: Option<Duration>,
) -> Duration {
    let mut reserve = spans.longest_within(deadline).max(MIN_RESERVE);
    if spans.unproven(now) {
        let caught = oldest.unwrap_or_default().saturating_mul(2).min(deadline);
        reserve = reserve.max(caught);
    }
    deadline.saturating_sub(reserve)
}

fn bucket(took: Duration) -> u32 {
    let ms = took.as_secs_f64() * 1000.0;
    if ms < FIRST_EDGE_MS {
        return 0;
    }
    // Bucket b (b >= 1) holds [edge(b-1), edge(b)).
    let b = ((ms / FIRST_EDGE_MS).log2() * PER_DOUBLING).floor() as u32 + 1;
    b.min(63)
}

fn lower_edge(bucket: u32) -> Duration {
    match bucket {
        0 => Duration::ZERO,
        b => upper_edge(b - 1),
    }
}

fn upper_edge(bucket: u32) -> Duration {
    Duration::from_secs_f64(FIRST_EDGE_MS * 2f64.powf(f64::from(bucket) / PER_DOUBLING) / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_holds_its_time_and_its_edge_is_at_most_a_fifth_above() {
        for ms in [1u64, 63, 64, 100, 999, 4_000, 6_000, 60_000, 3_000_000] {
            let took = Duration::from_millis(ms);
            let edge = upper_edge(bucket(took));
            assert!(edge > took, "{ms} ms: edge {edge:?}");
            assert!(lower_edge(bucket(took)) <= took, "{ms} ms");
            if ms >= 64 {
                assert!(
                    edge.as_secs_f64() <= took.as_secs_f64() * 1.2,
                    "{ms} ms: edge {edge:?}"
                );
            }
        }
        assert_eq!(bucket(Duration::from_secs(100_000)), 63);
    }

    #[test]
    fn accepting_leaves_room_for_the_longest_request_that_could_finish() {
        let now = Instant::now();
        let spans = RequestSpans::new(now);
        let nine = Duration::from_secs(9);
        // A process a period old has watched its site long enough.
        let later = now + PERIOD;
        // Nothing seen: accept until a second before the deadline.
        assert_eq!(
            accepting_for(nine, &spans, later, None),
            Duration::from_secs(8)
        );
        spans.note(Duration::from_millis(30));
        assert_eq!(
            accepting_for(nine, &spans, later, None),
            Duration::from_secs(8)
        );
        // Six-second uploads: they need six of the nine seconds.
        spans.note(Duration::from_secs(6));
        let accept = accepting_for(nine, &spans, later, None);
        assert!(
            accept < Duration::from_secs(3) && accept > Duration::from_secs(2),
            "{accept:?}"
        );
        // A stream of an hour says nothing of what a drain can finish.
        spans.note(Duration::from_secs(3_600));
        assert_eq!(accepting_for(nine, &spans, later, None), accept);
        // A poll of eight and a half seconds leaves it no time to accept in.
        spans.note(Duration::from_millis(8_500));
        assert_eq!(accepting_for(nine, &spans, later, None), Duration::ZERO);
    }

    #[test]
    fn a_young_process_leaves_twice_what_its_oldest_request_ran_unless_it_took_spans() {
        let now = Instant::now();
        let nine = Duration::from_secs(9);
        let three = Some(Duration::from_secs(3));
        let young = RequestSpans::new(now);
        assert_eq!(
            accepting_for(nine, &young, now, None),
            Duration::from_secs(8)
        );
        assert_eq!(
            accepting_for(nine, &young, now, three),
            Duration::from_secs(3)
        );
        let five = Some(Duration::from_secs(5));
        assert_eq!(accepting_for(nine, &young, now, five), Duration::ZERO);
        // A period old, it has seen for itself.
        assert_eq!(
            accepting_for(nine, &young, now + PERIOD, three),
            Duration::from_secs(8)
        );
        // Given an earlier process's spans, it goes by them.
        let heir = RequestSpans::new(now);
        heir.remember(0);
        assert_eq!(
            accepting_for(nine, &heir, now, three),
            Duration::from_secs(8)
        );
        let earlier = RequestSpans::new(now);
        earlier.note(Duration::from_secs(6));
        heir.remember(earlier.seen());
        let accept = accepting_for(nine, &heir, now, None);
        assert!(accept < Duration::from_secs(3), "{accept:?}");
    }

    #[test]
    fn what_requests_took_is_forgotten_after_two_periods() {
        let now = Instant::now();
        let spans = RequestSpans::new(now);
        let long = Duration::from_secs(5);
        spans.note(long);
        spans.rotate(now + PERIOD);
        assert!(spans.longest_within(Duration::from_secs(30)) > long);
        spans.rotate(now + PERIOD + Duration::from_secs(1));
        assert!(spans.longest_within(Duration::from_secs(30)) > long);
        spans.rotate(now + PERIOD * 2);
        assert_eq!(
            spans.longest_within(Duration::from_secs(30)),
            Duration::ZERO
        );
        // A period skipped (no sweep ran) forgets at once.
        spans.note(long);
        spans.rotate(now + PERIOD * 4);
        assert_eq!(
            spans.longest_within(Duration::from_secs(30)),
            Duration::ZERO
        );
    }
}
