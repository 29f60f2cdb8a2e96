//! Scheduler lag: how late this thread's scheduler polls a task that is
//! ready, so the adaptive limit ([`crate::admission::adaptive`]) can tell
//! weir's own saturation from the app's.
//!
//! An upstream answer's latency is measured from the request's send to
//! the moment weir's task reads the answer. When weir itself has more ready
//! work than its thread gets through (10,000 HTTP/2 streams on one core),
//! answers that came back at once wait to be polled, and the limit read
//! that wait as the app's queueing: it cut itself to 3,900, and weir shed
//! requests with `503 queue_full` while the app idled (bench/README.md,
//! "HTTP/2"). [`probe`] runs on every scheduler thread (weir's are all
//! single-threaded): it sleeps [`TICK`] over and over and keeps how late
//! each wake came, smoothed, in a thread-local that [`this_thread`] reads
//! where the answer is recorded (the same thread: a connection is served
//! start to end by the thread that accepted it). The server spawns it on
//! its first thread, `lifecycle::workers` on each worker thread.
//!
//! This module measures; it decides nothing.

use std::cell::Cell;
use std::time::Duration;

use tokio::time::Instant;

/// How often the probe wakes.
pub const TICK: Duration = Duration::from_millis(5);
/// Lateness the timer's own granularity explains (tokio's wheel ticks in
/// milliseconds): not lag.
const GRANULARITY: Duration = Duration::from_millis(1);

thread_local! {
    /// Smoothed lateness of this thread's probe wakes, in microseconds.
    static LAG_MICROS: Cell<u64> = const { Cell::new(0) };
}

/// This thread's smoothed scheduler lag (zero where no probe runs).
pub fn this_thread() -> Duration {
    Duration::from_micros(LAG_MICROS.with(Cell::get))
}

/// Measures this thread's scheduler lag until dropped. Spawn it (or
/// `select!` it) on the thread it is to measure.
pub async fn probe() {
    loop {
        let asleep = Instant::now();
        tokio::time::sleep(TICK).await;
        let late = asleep.elapsed().saturating_sub(TICK + GRANULARITY);
        record(late);
    }
}

/// Folds one wake's lateness into the thread's lag: up at once (saturation
/// shows at once in answers), down by a quarter per wake.
fn record(late: Duration) {
    let late = late.as_micros().min(u128::from(u64::MAX)) as u64;
    LAG_MICROS.with(|lag| {
        let was = lag.get();
        lag.set(if late >= was {
            late
        } else {
            was - (was - late) / 4
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_rises_at_once_and_falls_by_quarters() {
        record(Duration::from_millis(100));
        assert_eq!(this_thread(), Duration::from_millis(100));
        record(Duration::ZERO);
        assert_eq!(this_thread(), Duration::from_millis(75));
        for _ in 0..40 {
            record(Duration::ZERO);
        }
        assert!(
            this_thread() < Duration::from_millis(1),
            "{:?}",
            this_thread()
        );
    }

    /// A thread kept busy by a task that never yields for 50 ms shows the
    /// probe's wakes late by about that much.
    #[test]
    fn a_busy_scheduler_shows_lag() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let probing = tokio::spawn(probe());
            tokio::time::sleep(Duration::from_millis(20)).await;
            let idle = this_thread();
            // Blocks the thread: the probe's timer fires but is not polled.
            std::thread::sleep(Duration::from_millis(50));
            tokio::time::sleep(Duration::from_millis(10)).await;
            let busy = this_thread();
            probing.abort();
            assert!(
                busy >= Duration::from_millis(30),
                "idle {idle:?}, busy {busy:?}"
            );
            assert!(idle < busy, "idle {idle:?}, busy {busy:?}");
        });
    }
}
