//! Limiter state: how much each key has used of each rule's quota.
//!
//! - [`gcra`]: the arithmetic of one rate limit ([`Quota`], [`Outcome`]) and
//!   weir's injected monotonic clock ([`Clock`], [`MonoTime`]).
//! - [`store`]: per-rule, sharded, hard-capped maps from key to TAT
//!   ([`ShardedStore`], [`RuleStores`]), and the key mixer [`key`].
//! - [`inflight`]: concurrency limits per key, a guard per request.
//! - [`prefetch`]: cache hints for loops that know their next accesses.
//! - [`snapshot`]: the state on disk across restarts, rebased through the wall
//!   clock, with a per-rule report of what came back.
//! - [`redis`]: the same GCRA in Redis (one Lua script, all of a request's
//!   rules at once), so several instances share limits.
//! - [`shared`]: Redis with the local store as mirror and fallback.
//! - [`lease`]: tokens an instance takes from Redis ahead of use, so hot
//!   keys are decided without a round trip.
//!
//! This module decides nothing about which rules a request meets or what
//! response a rejection gets (policy does); it keeps the counts.
//!
//! ```
//! use std::time::Duration;
//! use weir_limiter::{key, Clock, ManualClock, MonoTime, Quota, RuleFingerprint, RuleStores, StoreConfig};
//!
//! // Anonymous expensive requests: 300 per 10 minutes per /24, burst 300.
//! let quota = Quota::new(300, Duration::from_secs(600), 300).unwrap();
//! let rules = RuleStores::build(&[(RuleFingerprint(0xfeed), StoreConfig::with_max_keys(100_000))], None).unwrap();
//! let clock = ManualClock::new(MonoTime::ZERO);
//! let slash24 = key(0, 1, 0x0a00_0100); // rule 0, level /24, the prefix's digest
//! for _ in 0..300 {
//!     assert!(rules.store(0).unwrap().check(slash24, &quota, clock.now(), 1).is_allowed());
//! }
//! assert!(!rules.store(0).unwrap().check(slash24, &quota, clock.now(), 1).is_allowed());
//! clock.advance(quota.emission_interval());
//! assert!(rules.store(0).unwrap().check(slash24, &quota, clock.now(), 1).is_allowed());
//! ```

#![cfg_attr(
    test,
    allow(clippy::too_many_lines, reason = "a test reads as one story")
)]

pub mod gcra;
pub mod inflight;
pub mod lease;
pub mod prefetch;
pub mod redis;
pub mod shared;
pub mod snapshot;
pub mod store;

pub use gcra::{Clock, ManualClock, MonoTime, MonotonicClock, Outcome, Quota, QuotaError};
pub use inflight::{InflightFull, InflightGuard, InflightTable};
pub use snapshot::{RestoreReport, RuleRestore, Snapshot, SnapshotError};
pub use store::{
    RuleFingerprint, RuleStores, ShardedStore, StoreConfig, StoreError, StoreStats, key,
};
