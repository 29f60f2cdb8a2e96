//! Whether another socket listens on one of this process's addresses: a
//! weir started beside this one with `reuse_port` (the restart that
//! refuses nothing), to which a draining process leaves new connections.
//!
//! Asked of the kernel through `sock_diag` netlink (what `ss -l` uses), for
//! listening TCP sockets only: a listening socket on the same address whose
//! inode is not this socket's. The kernel then walks its table of
//! listeners, not every connection: `/proc/net/tcp`, read before, lists
//! every socket, and with the tens of thousands in TIME_WAIT a busy host
//! keeps it took more than 15 s, on the thread that drains (the restart
//! test stalled so about one run in five). Only a socket with
//! `SO_REUSEPORT` can have such a sibling, so only those are looked up.
//! Sockets shared by descriptor (systemd's copy, an upgraded successor's)
//! are one socket, one inode: not siblings.
//!
//! The request and the replies are written by hand: one fixed 72-byte
//! request and a fixed reply layout (`linux/inet_diag.h`), against three
//! crates of general netlink for it.
//!
//! Linux only; elsewhere (or if the kernel will not say) nobody is seen,
//! and a draining weir keeps accepting until its earlier work is done.

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Whether another socket listens on `socket`'s address beside it.
pub fn another_listens(socket: &std::net::TcpListener) -> bool {
    if !socket2::SockRef::from(socket).reuse_port().unwrap_or(false) {
        return false;
    }
    let (Ok(local), Some(own)) = (socket.local_addr(), inode(socket)) else {
        return false;
    };
    match listeners(local.is_ipv4()) {
        Ok(all) => all.iter().any(|&(addr, ino)| addr == local && ino != own),
        Err(e) => {
            tracing::debug!(error = %e, "sock_diag: cannot list the listening sockets");
            false
        }
    }
}

/// The socket's inode, from `/proc/self/fd` (`socket:[N]`).
fn inode(socket: &std::net::TcpListener) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", socket.as_raw_fd())).ok()?;
    let link = link.to_str()?;
    link.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 0x01;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_HDRLEN: usize = 16;
const TCP_LISTEN: u32 = 10;
/// `struct inet_diag_req_v2`.
const REQUEST_LEN: usize = 56;
/// `struct inet_diag_msg`.
const REPLY_LEN: usize = 72;
/// A look never holds the drain longer than this.
const ANSWER_WITHIN: Duration = Duration::from_millis(500);

/// Every listening TCP socket of one family: address and inode.
fn listeners(ipv4: bool) -> std::io::Result<Vec<(SocketAddr, u64)>> {
    let family = if ipv4 { libc::AF_INET } else { libc::AF_INET6 } as u8;
    let nl = socket2::Socket::new(
        socket2::Domain::from(libc::AF_NETLINK),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::from(NETLINK_SOCK_DIAG)),
    )?;
    nl.set_read_timeout(Some(ANSWER_WITHIN))?;
    // Unbound and unconnected, a netlink socket sends to the kernel.
    nl.send(&request(family))?;
    let mut found = Vec::new();
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = (&nl).read(&mut buf)?;
        let mut at = 0;
        while at + NLMSG_HDRLEN <= n {
            let len = u32::from_ne_bytes(buf[at..at + 4].try_into().expect("4 bytes")) as usize;
            let kind = u16::from_ne_bytes(buf[at + 4..at + 6].try_into().expect("2 bytes"));
            if len < NLMSG_HDRLEN || at + len > n {
                return Err(std::io::Error::other("a truncated netlink message"));
            }
            match kind {
                NLMSG_DONE => return Ok(found),
                NLMSG_ERROR => return Err(std::io::Error::other("the kernel refused the dump")),
                SOCK_DIAG_BY_FAMILY => {
                    found.extend(reply(&buf[at + NLMSG_HDRLEN..at + len], ipv4));
                }
                _ => {}
            }
            // Messages are aligned to four bytes.
            at += (len + 3) & !3;
        }
    }
}

/// A dump of one family's listening TCP sockets: `nlmsghdr` then
/// `inet_diag_req_v2` (the socket id left zero: a dump filters by state).
fn request(family: u8) -> [u8; NLMSG_HDRLEN + REQUEST_LEN] {
    let mut req = [0u8; NLMSG_HDRLEN + REQUEST_LEN];
    req[0..4].copy_from_slice(&((NLMSG_HDRLEN + REQUEST_LEN) as u32).to_ne_bytes());
    req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req[16] = family;
    req[17] = libc::IPPROTO_TCP as u8;
    req[20..24].copy_from_slice(&(1u32 << TCP_LISTEN).to_ne_bytes());
    req
}

/// One `inet_diag_msg`: the source port (big-endian) at 4, the source
/// address at 8 (4 or 16 bytes, network order), the inode at 68.
fn reply(msg: &[u8], ipv4: bool) -> Option<(SocketAddr, u64)> {
    if msg.len() < REPLY_LEN {
        return None;
    }
    let port = u16::from_be_bytes([msg[4], msg[5]]);
    let ip = if ipv4 {
        IpAddr::V4(Ipv4Addr::new(msg[8], msg[9], msg[10], msg[11]))
    } else {
        let bytes: [u8; 16] = msg[8..24].try_into().ok()?;
        IpAddr::V6(Ipv6Addr::from(bytes))
    };
    let inode = u32::from_ne_bytes(msg[68..72].try_into().ok()?);
    Some((SocketAddr::new(ip, port), u64::from(inode)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_kernels_replies() {
        let mut msg = [0u8; REPLY_LEN];
        msg[4..6].copy_from_slice(&8080u16.to_be_bytes());
        msg[8..12].copy_from_slice(&[127, 0, 0, 1]);
        msg[68..72].copy_from_slice(&4242u32.to_ne_bytes());
        assert_eq!(
            reply(&msg, true),
            Some(("127.0.0.1:8080".parse().unwrap(), 4242))
        );
        msg[8..24].copy_from_slice(&Ipv6Addr::LOCALHOST.octets());
        assert_eq!(
            reply(&msg, false),
            Some(("[::1]:8080".parse().unwrap(), 4242))
        );
        assert_eq!(reply(&msg[..40], true), None, "too short");
    }

    /// A second socket on the same address with `SO_REUSEPORT` is seen; a
    /// copy of the same socket (as systemd holds) is not a sibling.
    #[test]
    fn a_socket_beside_is_seen_and_a_copy_is_not() {
        for any in ["127.0.0.1:0", "[::1]:0"] {
            let any: SocketAddr = any.parse().unwrap();
            let bind = |addr: SocketAddr| {
                let s = socket2::Socket::new(
                    socket2::Domain::for_address(addr),
                    socket2::Type::STREAM,
                    None,
                )
                .unwrap();
                s.set_reuse_port(true).unwrap();
                s.bind(&addr.into()).unwrap();
                s.listen(16).unwrap();
                std::net::TcpListener::from(s)
            };
            let first = bind(any);
            let copy = first.try_clone().unwrap();
            assert!(
                !another_listens(&first),
                "{any}: alone (its copy is itself)"
            );
            drop(copy);
            let beside = bind(first.local_addr().unwrap());
            assert!(another_listens(&first), "{any}");
            assert!(another_listens(&beside), "{any}");
            drop(beside);
            assert!(!another_listens(&first), "{any}");
            let plain = std::net::TcpListener::bind(any).unwrap();
            assert!(
                !another_listens(&plain),
                "{any}: no SO_REUSEPORT, no sibling"
            );
        }
    }
}
