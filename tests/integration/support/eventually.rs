//! Bounded polling for end states that arrive asynchronously (a reload taking
//! effect, a log line being written): check, wait a little, check again, and
//! fail with a message after a deadline. Never a fixed sleep.
//!
//! Owns: `assert_eventually!` (blocking, for sync code or conditions that do
//! not need this runtime to make progress) and `assert_eventually_async!`
//! (awaits between checks; the condition may use `.await`).
//!
//! Does not: advance time; unit tests inject clocks instead.
//!
//! The macros are textually scoped: `#[macro_use]` on `mod support` (before
//! the test modules in main.rs) and on `mod eventually` makes them visible.

use std::time::Duration;

/// How long a condition may take to become true.
pub const EVENTUALLY_DEADLINE: Duration = Duration::from_secs(10);
/// Pause between checks.
pub const EVENTUALLY_POLL: Duration = Duration::from_millis(20);

/// Polls `cond` until true or [`EVENTUALLY_DEADLINE`]; then panics with the
/// message (or the condition's text). Blocks the thread between checks.
macro_rules! assert_eventually {
    ($cond:expr $(,)?) => {
        assert_eventually!($cond, "{}", stringify!($cond))
    };
    ($cond:expr, $($msg:tt)+) => {{
        let start = ::std::time::Instant::now();
        loop {
            if $cond {
                break;
            }
            if start.elapsed() >= crate::support::eventually::EVENTUALLY_DEADLINE {
                panic!(
                    "condition not true after {:?}: {}",
                    crate::support::eventually::EVENTUALLY_DEADLINE,
                    format!($($msg)+)
                );
            }
            ::std::thread::sleep(crate::support::eventually::EVENTUALLY_POLL);
        }
    }};
}

/// Like [`assert_eventually!`] but yields to the async runtime between checks,
/// so in-test servers keep running; `cond` may contain `.await`. With
/// `within = DURATION,` first, that long instead of [`EVENTUALLY_DEADLINE`]
/// (a browser or a Prometheus starting).
macro_rules! assert_eventually_async {
    (within = $within:expr, $cond:expr, $($msg:tt)+) => {{
        let within: ::std::time::Duration = $within;
        let start = ::std::time::Instant::now();
        loop {
            if $cond {
                break;
            }
            if start.elapsed() >= within {
                panic!("condition not true after {within:?}: {}", format!($($msg)+));
            }
            ::tokio::time::sleep(crate::support::eventually::EVENTUALLY_POLL).await;
        }
    }};
    ($cond:expr $(,)?) => {
        assert_eventually_async!($cond, "{}", stringify!($cond))
    };
    ($cond:expr, $($msg:tt)+) => {
        assert_eventually_async!(
            within = crate::support::eventually::EVENTUALLY_DEADLINE,
            $cond,
            $($msg)+
        )
    };
}
