//! Binding listening sockets.
//!
//! Sockets are created with socket2 so weir controls the backlog and options,
//! and kept as std listeners so they can later be handed to a new process.

use std::net::{SocketAddr, TcpListener};

use socket2::{Domain, Protocol, Socket, Type};

/// Accept backlog: the kernel caps it at `net.core.somaxconn`. A deep backlog
/// absorbs accept bursts; admission happens after accept, where weir can count.
const BACKLOG: i32 = 4096;

/// Binds `addr` for accepting client connections.
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(false).ok();
    }
    socket.set_tcp_nodelay(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}
