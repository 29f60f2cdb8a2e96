//! weir's HTTP: what a message looks like on the wire, and nothing about
//! what weir decides about it.
//!
//! - [`framing`]: body delimiting (RFC 9112 §6-7), `Content-Length`, the
//!   chunked decoder, hop-by-hop field names; shared by both sides.
//! - [`server`]: HTTP/1.1 towards clients on plain TCP (heads in, bodies
//!   decoded as they are read, responses out, keep-alive, pipelining,
//!   `Expect: 100-continue`, upgrades). It serves a [`server::Handler`]
//!   and knows nothing of the proxy behind it.
//! - [`client`]: HTTP/1.1 towards an upstream server on one connection;
//!   [`connections`]: the keep-alive connections of one server.
//! - [`fields`]: an upstream response's fields forwarded as received.
//! - [`body`]: the request and response bodies of a proxied exchange.
//! - [`conn`]: what a client connection shares with its supervisor.
//! - [`cookie`]: the one reader of `Cookie` fields.
//! - [`proxy_protocol`]: PROXY protocol v1 and v2 headers.
//! - [`target`]: the canonical request target every stage reads.
//! - [`scheduler`]: which worker thread the caller runs, for the upstream
//!   connections that must stay on it.
//!
//! TLS and HTTP/2 are hyper's (weir's `edge` drives them); this crate
//! decides nothing about which requests may pass.

#![cfg_attr(
    test,
    allow(clippy::too_many_lines, reason = "a test reads as one story")
)]

pub mod body;
pub mod client;
pub mod conn;
pub mod connections;
pub mod cookie;
pub mod fields;
pub mod framing;
pub mod proxy_protocol;
pub mod scheduler;
pub mod server;
pub mod target;

/// A boxed error of either side's body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
