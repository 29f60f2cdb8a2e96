//! weir: an edge gateway that keeps a web application up under crawler floods
//! and load spikes without shutting real people out.
//!
//! The module tree follows the path of a request (see `docs/request-path.md`):
//!
//! ```text
//! accept ─► edge ─► identity ─► policy ─► upstream ─► response
//!                                                  └► observe (log, metrics)
//! ```
//!
//! - [`edge`]: listeners, TLS, PROXY protocol, connection caps and timeouts, drain.
//! - [`identity`]: who the client is ([`identity::ClientId`]), trusting forwarding
//!   headers only from configured proxies.
//! - [`policy`]: which route and [`policy::RouteClass`] a request belongs to, and
//!   the [`policy::Decision`] taken for it.
//! - [`upstream`]: pools of servers, balancing, forwarding with proxy semantics.
//! - [`observe`]: access log, Prometheus metrics, admin API.
//! - [`config`]: the TOML schema, `${VAR}` substitution, validation, reload.
//! - [`proxy`]: the one function that composes the stages for each request.

pub mod admin;
pub mod admission;
pub mod build_info;
pub mod calendar;
pub mod challenge;
pub mod config;
pub mod edge;
pub mod gateway;
pub mod identity;
pub mod lifecycle;
pub mod observe;
pub mod policy;
pub mod proxy;
pub mod respond;
pub mod runtime;
pub mod server;
pub mod state;
pub mod upstream;
pub mod visit;

#[cfg(test)]
mod spellings;
