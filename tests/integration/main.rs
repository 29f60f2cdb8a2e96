//! weir's end-to-end tests: real sockets on loopback, one binary for all.
//!
//! - `fixtures`: in-process weir, test upstreams, clients from chosen sources.
//! - `proxy`: proxy semantics, HTTP/2, TLS, WebSocket, streaming.
//! - `identity`: client identity behind trusted and untrusted peers, PROXY protocol.
//! - `edge`: connection caps, timeouts, bad input.
//! - `lifecycle`: reload and drain.

mod edge;
mod fixtures;
mod identity;
mod lifecycle;
mod proxy;
