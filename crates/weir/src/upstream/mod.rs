//! Upstream: pools of servers, balancing, and forwarding with proxy semantics.
//!
//! Owns the connections to upstream servers (kept alive per server by
//! `weir_http::connections`), choosing a server per request, rewriting
//! headers for the hop, and classifying failures (connect, timeout, reset)
//! by side, retry safety, and what each means for health and for the
//! adaptive limit ([`forward::ForwardError`]). Per server it keeps health
//! (active checks and passive outcomes) and slow start; per pool, the
//! retry budget, and it holds the pool's admission queue
//! ([`crate::admission`], which owns it). It does not
//! decide whether a request may go upstream; that is policy's and
//! admission's job.

pub mod checks;
pub mod forward;
pub mod health;
pub mod pool;
pub mod retry_budget;
pub mod slow_start;

pub use forward::{ForwardError, ForwardingHeaders, Hop};
pub use pool::{NoServer, Pool, Server, ServerGuard};
