//! Edge: everything between the socket and the first HTTP request.
//!
//! Listeners accept connections, the [`conn::ConnTracker`] admits or refuses
//! them (global cap with idle-first shedding, per-address cap), the PROXY
//! protocol header and TLS handshake are read under a deadline, and HTTP is
//! served with header size and count limits: plain HTTP/1.1 by weir's own
//! codec (`weir_http::server`), TLS and HTTP/2 by hyper. Timeouts for
//! slow headers and idle keep-alive connections are enforced by the tracker's
//! sweep. Draining stops accepting and lets in-flight requests finish.

pub mod balance;
pub mod conn;
pub mod inflight;
pub mod io;
pub mod listener;
pub mod serve;
pub mod tls;

pub use conn::{ConnGuard, ConnLimits, ConnState, ConnTracker, Refusal};
pub use listener::{EdgeSettings, ListenerSpec};
pub use serve::{Acceptor, Connection, Service, TlsSession};
