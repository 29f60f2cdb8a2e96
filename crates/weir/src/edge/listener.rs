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

/// Makes the kernel drop new connection attempts (a SYN without ACK) to
/// `socket`, while handshakes already under way, and connections already
/// open, go on. For the last moments before weir closes a socket it alone
/// holds: closing a listening socket resets every connection the kernel
/// completed since the last `accept`, after the client had sent its request
/// (a failure the client cannot tell from any other). A dropped SYN is sent
/// again after a second, to the next process or to a closed port (a
/// refusal, which a client can tell). Never for a socket another process
/// keeps (systemd's, a successor's): the filter is the socket's, not this
/// process's.
///
/// A classic BPF socket filter: written by hand because it is four
/// instructions, and the kernel runs it on the TCP header (offset 13: the
/// flags).
#[cfg(target_os = "linux")]
pub fn stop_new_handshakes(socket: &TcpListener) -> std::io::Result<()> {
    use bpf::*;
    use socket2::SockFilter;
    const SYN: u32 = 0x02;
    const ACK: u32 = 0x10;
    let program = [
        // A = the TCP flags byte.
        SockFilter::new(LD | B | ABS, 0, 0, 13),
        SockFilter::new(ALU | AND | K, 0, 0, SYN | ACK),
        // SYN without ACK: the next instruction (drop), else the one after.
        SockFilter::new(JMP | JEQ | K, 0, 1, SYN),
        SockFilter::new(RET | K, 0, 0, 0),
        SockFilter::new(RET | K, 0, 0, u32::MAX),
    ];
    socket2::SockRef::from(socket).attach_filter(&program)
}

#[cfg(not(target_os = "linux"))]
pub fn stop_new_handshakes(_socket: &TcpListener) -> std::io::Result<()> {
    Ok(())
}

/// Removes a filter [`stop_new_handshakes`] may have left on a socket
/// handed to this process (none is expected: a process hands its sockets
/// on only when it does not close them).
#[cfg(target_os = "linux")]
pub fn accept_new_handshakes(socket: &TcpListener) {
    // ENOENT when there is none, the usual case.
    let _ = socket2::SockRef::from(socket).detach_filter();
}

#[cfg(not(target_os = "linux"))]
pub fn accept_new_handshakes(_socket: &TcpListener) {}

/// Classic BPF opcodes (linux/bpf_common.h).
#[cfg(target_os = "linux")]
mod bpf {
    pub const LD: u16 = 0x00;
    pub const B: u16 = 0x10;
    pub const ABS: u16 = 0x20;
    pub const ALU: u16 = 0x04;
    pub const AND: u16 = 0x50;
    pub const K: u16 = 0x00;
    pub const JMP: u16 = 0x05;
    pub const JEQ: u16 = 0x10;
    pub const RET: u16 = 0x06;
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

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::io::{ErrorKind, Read, Write};
    use std::net::TcpStream;

    use super::*;

    /// With new handshakes stopped, an open connection still carries data
    /// and a new one is never completed: its SYN is dropped (no accept, no
    /// refusal, no reset). With the filter removed, new ones complete.
    #[test]
    fn a_listener_that_stops_new_handshakes_keeps_its_open_connections() {
        let listener = bind("127.0.0.1:0".parse().unwrap(), false).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut open = TcpStream::connect(addr).unwrap();
        listener.set_nonblocking(false).unwrap();
        let (mut served, _) = listener.accept().unwrap();

        stop_new_handshakes(&listener).unwrap();
        let late = TcpStream::connect_timeout(&addr, Duration::from_millis(300));
        assert_eq!(late.map_err(|e| e.kind()).err(), Some(ErrorKind::TimedOut));
        open.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        served.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
        listener.set_nonblocking(true).unwrap();
        assert_eq!(
            listener.accept().map_err(|e| e.kind()).err(),
            Some(ErrorKind::WouldBlock),
            "nothing completed behind the filter"
        );

        accept_new_handshakes(&listener);
        TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    }
}
