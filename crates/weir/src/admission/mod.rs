//! Admission: whether a request that policy admitted may go upstream *now*,
//! wait for a slot, or be shed with `503` + `Retry-After`.
//!
//! Per upstream pool, an [`AdmissionQueue`] holds a concurrency limit (fixed,
//! e.g. the app's workers minus one, or learned by [`adaptive::GradientLimit`])
//! and bounded queues by priority [`Lane`], fair across client networks within
//! a lane ([`fair::FairQueue`]). Overload becomes waiting, then a fast refusal,
//! never an overflowing backlog at the app. [`coalesce`] lets identical
//! anonymous GETs share one upstream request.
//!
//! ```
//! use std::num::NonZeroUsize;
//! use weir::admission::{AdmissionQueue, FairKey, Lane, QueueConfig};
//! use weir::identity::ClientAddr;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let queue = AdmissionQueue::new(QueueConfig::fixed(NonZeroUsize::new(9).unwrap())).unwrap();
//! let key = FairKey::of(ClientAddr::new("203.0.113.7".parse().unwrap()));
//! let now = tokio::time::Instant::now();
//! let permit = queue.acquire(Lane::ANONYMOUS, key, queue.deadline(Lane::ANONYMOUS, now)).await.unwrap();
//! assert_eq!(queue.snapshot().in_flight, 1);
//! drop(permit); // frees the slot for the next waiter
//! assert_eq!(queue.snapshot().in_flight, 0);
//! # });
//! ```
//!
//! This stage does not choose a request's lane (`proxy::admit` does, from
//! the proof policy found and the shape costs learned here), pick servers
//! or track their health (upstream does). The algorithms, defaults and failure modes
//! are explained in `docs/admission.md`.

pub mod adaptive;
pub mod browsing;
pub mod coalesce;
pub mod fair;
pub mod lag;
pub mod lanes;
pub mod queue;
pub mod shapes;

pub use adaptive::{GradientConfig, GradientLimit, LimitState, PoolLimit};
pub use browsing::BrowsingEvidence;
pub use coalesce::{CoalesceKey, Coalescer, Role, SharedResponse};
pub use fair::{FairKey, FairQueue};
pub use lanes::{Lane, LaneSpec, Lanes, Share, Standing};
pub use queue::{
    AdmissionQueue, HealthPermit, LimitConfig, Outcome, Permit, QueueConfig, QueueConfigError,
    QueueSnapshot, Shed, ShedReason,
};
pub use shapes::{Shape, ShapeCosts};
