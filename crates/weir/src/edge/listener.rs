//! Listeners: how each is configured ([`ListenerSpec`], [`EdgeSettings`])
//! and how its socket is bound.
//!
//! Sockets are created with socket2 so weir controls the backlog and options,
//! and kept as std listeners so they can later be handed to a new process.

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use super::ConnLimits;

use socket2::{Domain, Protocol, Socket, Type};

/// Accept backlog: the kernel caps it at `net.core.somaxconn`. A deep backlog
/// absorbs accept bursts; admission happens after accept, where weir can count.
const BACKLOG: i32 = 4096;

/// Binds `addr` for accepting client connections; with `reuse_port`, other
/// processes that set it too may listen on the same address (the kernel
/// spreads new connections over them).
pub fn bind(addr: SocketAddr, reuse_port: bool) -> std::io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    if addr.is_ipv6() {
        socket.set_only_v6(false).ok();
    }
    socket.set_tcp_nodelay(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// A listener as configured (binding happens once, at start).
#[derive(Clone)]
pub struct ListenerSpec {
    pub address: SocketAddr,
    pub proxy_protocol: bool,
    pub http2: bool,
    /// Bound with `SO_REUSEPORT` (a start-up choice: not reloaded).
    pub reuse_port: bool,
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

impl std::fmt::Debug for ListenerSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerSpec")
            .field("address", &self.address)
            .field("proxy_protocol", &self.proxy_protocol)
            .field("http2", &self.http2)
            .field("reuse_port", &self.reuse_port)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// Edge settings for the codecs and the connection tracker.
#[derive(Debug, Clone, Copy)]
pub struct EdgeSettings {
    pub conn: ConnLimits,
    pub max_in_flight_per_ip: usize,
    pub handshake_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    /// `[limits]`' request-body limits, for bodies read before a route is
    /// known (the challenge's answer).
    pub body: weir_http::body::BodyLimits,
}
