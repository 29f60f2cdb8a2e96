//! A weir process's life around its requests: how it gets its listening
//! sockets (bound, inherited from the previous process in an in-place
//! upgrade, or passed by systemd), which signals it obeys, and how it hands
//! its sockets and limiter state to its successor without refusing a
//! connection or forgetting whom it was limiting (incident 2).
//!
//! - [`inherit`]: sockets and state a starting instance takes over.
//! - [`handoff`]: the wire protocol (framed messages, `SCM_RIGHTS`).
//! - [`upgrade`]: the old side of an upgrade, the new side's `Taken`, and
//!   the `weir upgrade` client.
//! - [`systemd`]: socket activation and `sd_notify`.
//! - [`signals`]: the signal table.
//! - [`siblings`]: whether another process listens beside this one
//!   (`reuse_port`), to which a draining process leaves new connections.
//! - [`drain_plan`]: how long a stop may keep accepting, so that what it
//!   takes in finishes inside `process.drain_timeout`.
//! - [`warmup`]: when a starting generation may call itself ready (its
//!   pools and Redis answer, bounded by a timeout).
//! - [`workers`]: the worker threads beyond the first, each accepting with
//!   a single-threaded scheduler of its own.
//!
//! Operators' view (and the PID 1 story): `docs/operations.md`. Serving and
//! draining themselves are `server`.

pub mod drain_plan;
pub mod handoff;
pub mod inherit;
pub mod siblings;
pub mod signals;
pub mod systemd;
pub mod upgrade;
pub mod warmup;
pub mod workers;

pub use inherit::{Inherited, InheritedListener, ListeningSocket, SocketRole};
pub use upgrade::{Taken, UpgradeError, UpgradeSocket, Upgrader};
