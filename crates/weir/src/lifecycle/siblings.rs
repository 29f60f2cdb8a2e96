//! Whether another socket listens on one of this process's addresses: a
//! weir started beside this one with `reuse_port` (the restart that
//! refuses nothing), to which a draining process leaves new connections.
//!
//! Read from the kernel's tables of TCP sockets (`/proc/net/tcp`,
//! `/proc/net/tcp6`): a listening socket on the same address whose inode is
//! not this socket's. Only a socket with `SO_REUSEPORT` can have such a
//! sibling, so only those are looked up (the tables grow with every
//! connection). Sockets shared by descriptor (systemd's copy, an upgraded
//! successor's) are one socket, one inode: not siblings.
//!
//! Linux only; elsewhere (or without `/proc`) nobody is seen, and a
//! draining weir keeps accepting until its earlier work is done.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;

/// `TCP_LISTEN` in the tables' `st` column.
const LISTEN: &str = "0A";

/// Whether another socket listens on `socket`'s address beside it.
pub fn another_listens(socket: &std::net::TcpListener) -> bool {
    if !socket2::SockRef::from(socket).reuse_port().unwrap_or(false) {
        return false;
    }
    let (Ok(local), Some(own)) = (socket.local_addr(), inode(socket)) else {
        return false;
    };
    let table = if local.is_ipv4() {
        "/proc/net/tcp"
    } else {
        "/proc/net/tcp6"
    };
    std::fs::read_to_string(table)
        .map(|text| listeners(&text).any(|(addr, ino)| addr == local && ino != own))
        .unwrap_or(false)
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

/// The listening sockets of a table: address and inode.
fn listeners(table: &str) -> impl Iterator<Item = (SocketAddr, u64)> + '_ {
    table.lines().skip(1).filter_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 10 || f[3] != LISTEN {
            return None;
        }
        Some((address(f[1])?, f[9].parse().ok()?))
    })
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6): the address
/// in the kernel's byte order, four bytes at a time.
fn address(field: &str) -> Option<SocketAddr> {
    let (ip, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let words: Vec<u32> = (0..ip.len() / 8)
        .map(|i| u32::from_str_radix(&ip[i * 8..i * 8 + 8], 16).map(u32::from_be))
        .collect::<Result<_, _>>()
        .ok()?;
    let ip = match words.as_slice() {
        [v4] => IpAddr::V4(Ipv4Addr::from(v4.to_be_bytes())),
        [a, b, c, d] => {
            let mut bytes = [0u8; 16];
            for (i, w) in [a, b, c, d].iter().enumerate() {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_be_bytes());
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_kernels_addresses() {
        assert_eq!(
            address("0100007F:1F90"),
            Some("127.0.0.1:8080".parse().unwrap())
        );
        assert_eq!(
            address("00000000000000000000000001000000:0050"),
            Some("[::1]:80".parse().unwrap())
        );
        assert_eq!(address("nonsense"), None);
    }

    /// A second socket on the same address with `SO_REUSEPORT` is seen; a
    /// copy of the same socket (as systemd holds) is not a sibling.
    #[test]
    fn a_socket_beside_is_seen_and_a_copy_is_not() {
        let bind = |addr: SocketAddr| {
            let s =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            s.set_reuse_port(true).unwrap();
            s.bind(&addr.into()).unwrap();
            s.listen(16).unwrap();
            std::net::TcpListener::from(s)
        };
        let first = bind("127.0.0.1:0".parse().unwrap());
        let copy = first.try_clone().unwrap();
        assert!(!another_listens(&first), "alone (its copy is itself)");
        drop(copy);
        let beside = bind(first.local_addr().unwrap());
        assert!(another_listens(&first));
        assert!(another_listens(&beside));
        drop(beside);
        assert!(!another_listens(&first));
        let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(!another_listens(&plain), "no SO_REUSEPORT: no sibling");
    }
}
