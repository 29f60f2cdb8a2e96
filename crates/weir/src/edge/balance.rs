//! Sharing accepted connections out between worker threads.
//!
//! With `process.workers = N` every thread accepts on the same listening
//! socket and serves what it accepted, start to end. The kernel wakes every
//! thread waiting in `accept` and the first to get there wins, so the split
//! follows who happened to be free: wrk's 1,000 connections landed unevenly
//! on two threads, and the busier thread's clients waited (p99 2.6x nginx's
//! with 2 workers, bench/README.md "Two workers").
//!
//! [`AcceptBalance`] counts each thread's open connections. A thread holding
//! more than its share (the least loaded other thread's count plus a slack
//! of 8 and an eighth) stays out of `accept` for up to [`HOLD_OFF`], so the
//! others take what arrives meanwhile; nginx's `accept_mutex` does the same
//! with a lock. The hold-off is bounded, so a thread that stopped accepting
//! (busy, or gone) delays the others' accepts, never stops them.
//!
//! It refuses nothing: the connection caps are the tracker's.
//!
//! The counts are the exported `weir_worker_connections{worker}` gauges, so
//! an operator (and the bench) sees the split the hold-off acts on.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;

/// Longest a thread over its share stays out of `accept` before it accepts
/// anyway.
pub const HOLD_OFF: Duration = Duration::from_millis(5);
/// How often a held-off thread looks again.
const RECHECK: Duration = Duration::from_millis(1);
/// Connections a thread may hold beyond the least loaded other thread
/// before it holds off (plus an eighth of that thread's count).
const SLACK: usize = 8;

/// Open connections per accepting thread (index 0: the first thread).
#[derive(Debug)]
pub struct AcceptBalance {
    open: Box<[Gauge]>,
}

impl AcceptBalance {
    /// A balance over `threads` accepting threads (at least one), counting
    /// in the gauges `gauge(thread)` gives.
    pub fn new(threads: usize, gauge: impl Fn(usize) -> Gauge) -> AcceptBalance {
        AcceptBalance {
            open: (0..threads.max(1)).map(gauge).collect(),
        }
    }

    /// A balance whose counts are its own (not exported).
    #[cfg(test)]
    fn unexported(threads: usize) -> AcceptBalance {
        AcceptBalance::new(threads, |_| Gauge::default())
    }

    /// Whether `thread` holds more than its share of the connections.
    pub fn over_share(&self, thread: usize) -> bool {
        let mine = self.count(thread);
        let least_other = (self.open.iter().enumerate())
            .filter(|(i, _)| *i != thread)
            .map(|(_, n)| open_count(n))
            .min();
        least_other.is_some_and(|least| mine > least + SLACK + least / 8)
    }

    /// Waits (up to [`HOLD_OFF`]) while `thread` is over its share.
    pub async fn hold_off(&self, thread: usize) {
        let mut waited = Duration::ZERO;
        while waited < HOLD_OFF && self.over_share(thread) {
            tokio::time::sleep(RECHECK).await;
            waited += RECHECK;
        }
    }

    /// Counts a connection `thread` accepted until the returned guard drops.
    pub fn opened(self: &Arc<Self>, thread: usize) -> ThreadConn {
        let thread = thread.min(self.open.len() - 1);
        self.open[thread].inc();
        ThreadConn {
            balance: self.clone(),
            thread,
        }
    }

    /// Open connections counted for `thread`.
    pub fn count(&self, thread: usize) -> usize {
        self.open.get(thread).map_or(0, open_count)
    }
}

fn open_count(gauge: &Gauge) -> usize {
    usize::try_from(gauge.get()).unwrap_or(0)
}

/// One open connection of one thread; dropping it uncounts it.
#[derive(Debug)]
pub struct ThreadConn {
    balance: Arc<AcceptBalance>,
    thread: usize,
}

impl Drop for ThreadConn {
    fn drop(&mut self) {
        self.balance.open[self.thread].dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_ahead_by_more_than_the_slack_is_over_its_share() {
        let b = Arc::new(AcceptBalance::unexported(2));
        let mut held: Vec<ThreadConn> = (0..20).map(|_| b.opened(0)).collect();
        held.extend((0..10).map(|_| b.opened(1)));
        assert!(b.over_share(0), "20 against 10: 10 > 8 + 1");
        assert!(!b.over_share(1));
        held.truncate(15);
        assert_eq!((b.count(0), b.count(1)), (15, 0));
        assert!(b.over_share(0), "15 against none");
        drop(held);
        assert!(!b.over_share(0));
    }

    #[test]
    fn one_thread_is_never_over_its_share() {
        let b = Arc::new(AcceptBalance::unexported(1));
        let _held: Vec<ThreadConn> = (0..100).map(|_| b.opened(0)).collect();
        assert!(!b.over_share(0));
    }

    #[tokio::test(start_paused = true)]
    async fn holding_off_is_bounded() {
        let b = Arc::new(AcceptBalance::unexported(2));
        let _held: Vec<ThreadConn> = (0..50).map(|_| b.opened(0)).collect();
        let start = tokio::time::Instant::now();
        b.hold_off(0).await;
        assert_eq!(start.elapsed(), HOLD_OFF, "the other thread never accepted");
        let start = tokio::time::Instant::now();
        b.hold_off(1).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
