//! Which scheduler (worker thread) the calling thread runs, for what must
//! stay on it: an upstream connection's socket reports readiness to the
//! I/O driver of the scheduler that opened it, so `connections` reuses it
//! there alone. The embedding server names its threads; this module knows
//! nothing of how they are started.

use std::cell::Cell;

thread_local! {
    static SCHEDULER: Cell<usize> = const { Cell::new(0) };
}

/// Names the scheduler the calling thread runs: 0 (the default) for the
/// first, 1, 2, ... for weir's extra worker threads.
pub fn run_as_scheduler(index: usize) {
    SCHEDULER.with(|s| s.set(index));
}

/// The scheduler the calling thread runs (see [`run_as_scheduler`]).
pub fn current_scheduler() -> usize {
    SCHEDULER.with(Cell::get)
}
