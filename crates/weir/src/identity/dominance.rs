//! Dominant-peer detection: "one TCP peer carries most of the traffic".
//!
//! When no trusted proxy is configured but weir in fact sits behind a load
//! balancer, every request's client is the balancer, and any per-client limit
//! becomes one site-wide limit (incident 4: 97% of the world refused for 71
//! minutes). This detector notices the symptom from the traffic itself so the
//! server can log and count it loudly. It does not decide what to do about it,
//! does not know about trusted proxies (the caller observes only when the list
//! is empty, or only untrusted peers), and keeps no per-peer state beyond a
//! few counters.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, TryLockError};
use std::time::{Duration, Instant};

use super::addr::normalize;

/// Counters in the heavy-hitter sketch. Space-Saving with k counters keeps any
/// peer whose share exceeds 1/k and over-counts by at most 1/k of the window;
/// the decision uses the guaranteed lower bound, so a share threshold around
/// 0.5 or above is judged with no false alarms and at most 12.5% optimism.
const SLOTS: usize = 8;

/// A peer that carried more than the configured share of a window's requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DominantPeer {
    pub peer: IpAddr,
    /// Lower bound of the peer's share of the window's requests, in `0..=1`.
    pub share: f64,
    /// All requests observed in the window (every peer).
    pub requests: u64,
}

/// Watches peer addresses over tumbling windows and reports a peer that
/// dominates one.
///
/// Why a Space-Saving sketch under a `Mutex` taken with `try_lock`: the
/// request path must never wait for it. An uncontended lock is two atomic
/// operations plus a scan of eight slots; when another task holds the lock the
/// observation is only counted in an atomic total and left out of the sketch.
/// That is sampling that adapts to load, and since which request finds the
/// lock busy is unrelated to its peer, the share stays an unbiased estimate
/// while `requests` stays exact. A per-peer map would grow with the number of
/// clients (millions under a crawl); atomics alone cannot track "which peer is
/// on top" without a map.
#[derive(Debug)]
pub struct DominantPeerDetector {
    window: Duration,
    share: f64,
    min_requests: u64,
    sketch: Mutex<WindowSketch>,
    /// Observations that found the lock busy: in `requests`, not in the sketch.
    unsampled: AtomicU64,
}

impl DominantPeerDetector {
    /// `share` is the fraction (`0..1`) that the top peer must exceed; values
    /// outside are clamped and NaN never fires (config validation should
    /// reject them first). A window with fewer than `min_requests` requests is
    /// never reported: a quiet site's few requests from a monitor are no alarm.
    pub fn new(window: Duration, share: f64, min_requests: u64) -> Self {
        let share = if share.is_nan() {
            1.0
        } else {
            share.clamp(0.0, 1.0)
        };
        DominantPeerDetector {
            window,
            share,
            min_requests,
            sketch: Mutex::new(WindowSketch::default()),
            unsampled: AtomicU64::new(0),
        }
    }

    /// Counts one request from `peer` at `now`. Returns `Some` once, on the
    /// first observation at or after the end of a window in which the top
    /// peer's share exceeded the threshold with at least `min_requests`
    /// requests. A window therefore closes only when traffic continues; with
    /// no traffic there is nothing to warn about.
    pub fn observe(&self, peer: IpAddr, now: Instant) -> Option<DominantPeer> {
        let mut sketch = match self.sketch.try_lock() {
            Ok(guard) => guard,
            // Counters stay meaningful even if a holder panicked.
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                self.unsampled.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        let mut report = None;
        match sketch.started {
            None => sketch.started = Some(now),
            Some(start) if now.saturating_duration_since(start) >= self.window => {
                let unsampled = self.unsampled.swap(0, Ordering::Relaxed);
                report = sketch.verdict(unsampled, self.share, self.min_requests);
                *sketch = WindowSketch {
                    started: Some(now),
                    ..WindowSketch::default()
                };
            }
            Some(_) => {}
        }
        sketch.count(normalize(peer));
        report
    }
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    peer: IpAddr,
    count: u64,
    /// Over-count inherited from the evicted slot: true count is in
    /// `count - error ..= count`.
    error: u64,
}

#[derive(Debug, Default)]
struct WindowSketch {
    started: Option<Instant>,
    sampled: u64,
    slots: [Option<Slot>; SLOTS],
}

impl WindowSketch {
    fn count(&mut self, peer: IpAddr) {
        self.sampled += 1;
        if let Some(slot) = self.slots.iter_mut().flatten().find(|s| s.peer == peer) {
            slot.count += 1;
            return;
        }
        let fresh = Slot {
            peer,
            count: 1,
            error: 0,
        };
        if let Some(empty) = self.slots.iter_mut().find(|s| s.is_none()) {
            *empty = Some(fresh);
            return;
        }
        // Full: the newcomer replaces the smallest and inherits its count as
        // possible over-count (Space-Saving, Metwally et al. 2005).
        if let Some(smallest) = self.slots.iter_mut().flatten().min_by_key(|s| s.count) {
            *smallest = Slot {
                peer,
                count: smallest.count + 1,
                error: smallest.count,
            };
        }
    }

    fn verdict(&self, unsampled: u64, threshold: f64, min_requests: u64) -> Option<DominantPeer> {
        let requests = self.sampled + unsampled;
        if requests < min_requests || self.sampled == 0 {
            return None;
        }
        let top = self
            .slots
            .iter()
            .flatten()
            .max_by_key(|slot| slot.count - slot.error)?;
        let share = (top.count - top.error) as f64 / self.sampled as f64;
        (share > threshold).then_some(DominantPeer {
            peer: top.peer,
            share,
            requests,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    const WINDOW: Duration = Duration::from_secs(60);

    /// Feeds `n` requests spread evenly over the window starting at `t0`,
    /// taking the peer from `pick(i)`; returns every report seen.
    fn feed(
        d: &DominantPeerDetector,
        t0: Instant,
        n: u64,
        pick: impl Fn(u64) -> IpAddr,
    ) -> Vec<DominantPeer> {
        let step = WINDOW / (n as u32 + 1);
        (0..n)
            .filter_map(|i| d.observe(pick(i), t0 + step * i as u32))
            .collect()
    }

    #[test]
    fn single_balancer_is_reported_once_at_window_end() {
        let d = DominantPeerDetector::new(WINDOW, 0.5, 100);
        let t0 = Instant::now();
        let lb = ip("10.0.0.1");
        assert!(feed(&d, t0, 1000, |_| lb).is_empty(), "nothing mid-window");
        let report = d.observe(lb, t0 + WINDOW).expect("window closed");
        assert_eq!(report.peer, lb);
        assert_eq!(report.share, 1.0);
        assert_eq!(report.requests, 1000);
        // The next window has just started: no repeat.
        assert_eq!(d.observe(lb, t0 + WINDOW + Duration::from_secs(1)), None);
    }

    #[test]
    fn verdicts() {
        // (requests, share threshold, min_requests, peer of request i, expected share if reported)
        type Pick = fn(u64) -> IpAddr;
        #[rustfmt::skip]
        let cases: &[(u64, f64, u64, Pick, Option<f64>)] = &[
            (1000, 0.5, 100, |_| IpAddr::from([10, 0, 0, 1]), Some(1.0)),
            (50, 0.5, 100, |_| IpAddr::from([10, 0, 0, 1]), None),
            (1000, 0.5, 100, |i| IpAddr::from([198, 51, (i % 100) as u8, 1]), None),
            (1000, 0.6, 100, |i| if i % 10 < 7 { IpAddr::from([10, 0, 0, 1]) } else { IpAddr::from([198, 51, 100, (i % 97) as u8]) }, Some(0.7)),
            (1000, 0.8, 100, |i| if i % 10 < 7 { IpAddr::from([10, 0, 0, 1]) } else { IpAddr::from([198, 51, 100, (i % 97) as u8]) }, None),
            (1000, 0.55, 100, |i| if i % 5 < 3 { IpAddr::from([10, 0, 0, 1]) } else { IpAddr::from([10, 0, 0, 2]) }, Some(0.6)),
            (1000, 0.5, 100, |i| if i % 2 == 0 { IpAddr::from([10, 0, 0, 1]) } else { IpAddr::from([10, 0, 0, 2]) }, None),
            (1000, 0.5, 100, |i| if i % 2 == 0 { IpAddr::from([10, 0, 0, 1]) } else { "::ffff:10.0.0.1".parse().unwrap() }, Some(1.0)),
            (1000, f64::NAN, 1, |_| IpAddr::from([10, 0, 0, 1]), None),
        ];
        for (i, &(n, share, min, pick, want)) in cases.iter().enumerate() {
            let d = DominantPeerDetector::new(WINDOW, share, min);
            let t0 = Instant::now();
            assert!(
                feed(&d, t0, n, pick).is_empty(),
                "case {i}: mid-window report"
            );
            let got = d.observe(ip("192.0.2.99"), t0 + WINDOW);
            match (got, want) {
                (None, None) => {}
                (Some(r), Some(w)) => {
                    assert!(
                        (r.share - w).abs() < 0.01,
                        "case {i}: share {} want {w}",
                        r.share
                    );
                    assert_eq!(r.requests, n, "case {i}");
                    assert_eq!(r.peer, pick(0), "case {i}");
                }
                (got, want) => panic!("case {i}: got {got:?}, want share {want:?}"),
            }
        }
    }

    #[test]
    fn each_dominated_window_is_reported_and_quiet_ones_are_not() {
        let d = DominantPeerDetector::new(WINDOW, 0.5, 10);
        let t0 = Instant::now();
        let lb = ip("2001:db8::1");
        assert!(feed(&d, t0, 100, |_| lb).is_empty());
        // Closes window 1 and opens window 2 at t0 + WINDOW.
        let first = d.observe(lb, t0 + WINDOW).expect("window 1 dominated");
        assert_eq!(first.requests, 100);
        let t1 = t0 + WINDOW;
        assert!(feed(&d, t1, 99, |i| IpAddr::from([198, 51, 100, i as u8])).is_empty());
        // Window 2: one lb request plus 99 distinct peers: not dominated.
        assert_eq!(d.observe(lb, t1 + WINDOW), None);
        // A long idle gap: window 3 (one request) closes late and is too small.
        let t3 = t1 + WINDOW * 10;
        assert_eq!(d.observe(lb, t3), None);
        assert!(feed(&d, t3, 50, |_| lb).is_empty());
        let again = d.observe(lb, t3 + WINDOW).expect("window 4 dominated");
        assert_eq!(
            again.requests, 51,
            "the request that closed window 3 opened window 4"
        );
    }

    #[test]
    fn out_of_order_instants_do_not_close_windows() {
        let d = DominantPeerDetector::new(WINDOW, 0.5, 1);
        let t0 = Instant::now() + WINDOW;
        assert_eq!(d.observe(ip("10.0.0.1"), t0), None);
        // A task that read the clock earlier but locked later.
        assert_eq!(d.observe(ip("10.0.0.1"), t0 - Duration::from_secs(5)), None);
        assert!(d.observe(ip("10.0.0.1"), t0 + WINDOW).is_some());
    }

    #[test]
    fn concurrent_observers_keep_an_exact_total() {
        const THREADS: u64 = 4;
        const PER_THREAD: u64 = 20_000;
        let d = Arc::new(DominantPeerDetector::new(WINDOW, 0.9, 1));
        let t0 = Instant::now();
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let d = Arc::clone(&d);
                std::thread::spawn(move || {
                    (0..PER_THREAD)
                        .filter_map(|_| d.observe(IpAddr::from([10, 0, 0, 1]), t0))
                        .count()
                })
            })
            .collect();
        let mid_window_reports: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(mid_window_reports, 0);
        let report = d
            .observe(IpAddr::from([10, 0, 0, 1]), t0 + WINDOW)
            .expect("dominated");
        assert_eq!(
            report.requests,
            THREADS * PER_THREAD,
            "busy-lock skips still counted"
        );
        assert_eq!(report.share, 1.0);
    }

    #[test]
    fn sketch_bounds_hold_under_churn() {
        // One heavy peer at 30% among 5,000 distinct light ones: Space-Saving
        // must keep it and its lower bound must not exceed the truth.
        let mut sketch = WindowSketch::default();
        let heavy = IpAddr::from([10, 0, 0, 1]);
        for i in 0..10_000u32 {
            let peer = if i % 10 < 3 {
                heavy
            } else {
                IpAddr::from((0xC633_0000u32 + i).to_be_bytes())
            };
            sketch.count(peer);
        }
        let slot = sketch
            .slots
            .iter()
            .flatten()
            .find(|s| s.peer == heavy)
            .expect("heavy hitter kept");
        assert!(slot.count - slot.error <= 3_000, "lower bound {slot:?}");
        assert!(slot.count >= 3_000, "upper bound {slot:?}");
        assert!(slot.count - slot.error >= 3_000 - 10_000 / SLOTS as u64);
    }
}
