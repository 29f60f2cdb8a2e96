//! Observe: the access log, Prometheus metrics, the tallies behind the
//! metrics that are more than a count, and the live page's timeline. (The
//! admin API that serves them is `crate::admin`.)
//!
//! Every request ends in exactly one access-log line and one increment of
//! `weir_requests_total`, whatever the decision. Metric labels are bounded
//! (`class`, `pool`, `rule`, `reason`); client addresses appear only in the log.

pub mod access_log;
pub mod metrics;
pub mod process;
pub mod process_log;
pub mod request_id;
pub mod tallies;
pub mod timeline;

pub use access_log::{AccessLog, AccessRecord};
pub use metrics::Metrics;
