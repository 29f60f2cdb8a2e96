//! weir: an edge gateway that keeps a web application up under crawler floods
//! and load spikes without shutting real people out.
//!
//! The module tree follows the path of a request; its one diagram, with each
//! phase's function, input, result and what it may change, is
//! `docs/request-path.md`. [`proxy`] composes the phases for each request:
//!
//! - [`edge`]: listeners, TLS, PROXY protocol, connection caps and timeouts, drain.
//! - [`identity`]: who the client is ([`identity::ClientId`]), trusting forwarding
//!   headers only from configured proxies; sessions and verified crawlers.
//! - [`policy`]: which route and [`policy::RouteClass`] a request belongs to, its
//!   rules, and the [`policy::Decision`] taken for it.
//! - [`challenge`] and [`visit`]: the browser challenge's pass, and the visit
//!   cookie: what a browser proved, and what weir saw of it.
//! - [`admission`]: lanes, fair queues and the adaptive limit in front of a pool.
//! - [`upstream`]: pools of servers, health, balancing, forwarding.
//! - [`respond`]: the rescue: every answer weir makes itself, from a typed reason.
//! - [`observe`]: access log, Prometheus metrics; [`admin`]: the admin API.
//! - [`config`] and [`gateway`]: the TOML schema, and its compilation.

#![cfg_attr(
    test,
    allow(clippy::too_many_lines, reason = "a test reads as one story")
)]

pub mod admin;
pub mod admission;
pub mod build_info;
pub mod calendar;
pub mod challenge;
pub mod config;
pub mod edge;
pub mod evidence;
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
