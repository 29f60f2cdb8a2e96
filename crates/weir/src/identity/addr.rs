//! Address newtypes and aggregation keys.
//!
//! [`PeerAddr`] (the socket we accepted) and [`ClientAddr`] (who we believe the
//! client is) are distinct types so that keying a limit by the wrong one does
//! not compile.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The direct TCP peer of a connection: a client, or a load balancer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerAddr(pub SocketAddr);

impl PeerAddr {
    /// The peer's IP, with IPv4-mapped IPv6 normalised to IPv4.
    pub fn ip(&self) -> IpAddr {
        normalize(self.0.ip())
    }
}

/// The address weir believes the client has, after trusted-proxy resolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientAddr(IpAddr);

impl ClientAddr {
    /// Wraps an address, normalising IPv4-mapped IPv6 (`::ffff:a.b.c.d`) to IPv4
    /// so one client never has two keys.
    pub fn new(ip: IpAddr) -> Self {
        ClientAddr(normalize(ip))
    }

    pub fn ip(&self) -> IpAddr {
        self.0
    }

    /// The aggregation key of this address at `level`.
    pub fn key(&self, level: Level) -> PrefixKey {
        PrefixKey::of(self.0, level)
    }
}

/// Where the client address came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrSource {
    /// The TCP peer itself (no trusted proxy in front).
    Peer,
    /// A PROXY protocol header from a trusted peer.
    ProxyProtocol,
    /// `X-Forwarded-For` from a trusted peer.
    XForwardedFor,
    /// RFC 7239 `Forwarded` from a trusted peer.
    Forwarded,
}

impl AddrSource {
    pub fn as_str(&self) -> &'static str {
        match self {
            AddrSource::Peer => "peer",
            AddrSource::ProxyProtocol => "proxy_protocol",
            AddrSource::XForwardedFor => "x_forwarded_for",
            AddrSource::Forwarded => "forwarded",
        }
    }
}

/// The identity of a request's client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientId {
    pub peer: PeerAddr,
    pub client: ClientAddr,
    pub source: AddrSource,
}

/// Aggregation levels for keys: the same level means a comparable share of the
/// address space for IPv4 and IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Level {
    /// One address: IPv4 /32, IPv6 /128.
    Address,
    /// A subnet: IPv4 /24, IPv6 /64 (one customer's LAN).
    Subnet,
    /// A network: IPv4 /16, IPv6 /48 (one site or provider block).
    Network,
}

impl Level {
    pub fn prefix_len(&self, ip: &IpAddr) -> u8 {
        match (self, ip) {
            (Level::Address, IpAddr::V4(_)) => 32,
            (Level::Subnet, IpAddr::V4(_)) => 24,
            (Level::Network, IpAddr::V4(_)) => 16,
            (Level::Address, IpAddr::V6(_)) => 128,
            (Level::Subnet, IpAddr::V6(_)) => 64,
            (Level::Network, IpAddr::V6(_)) => 48,
        }
    }
}

/// A masked address and its prefix length: a compact, hashable map key.
///
/// IPv4 keys live in the low 32 bits with `v4 = true`, so `10.0.0.0/8` and
/// `::a00:0/8` never collide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PrefixKey {
    bits: u128,
    len: u8,
    v4: bool,
}

impl PrefixKey {
    pub fn of(ip: IpAddr, level: Level) -> PrefixKey {
        let ip = normalize(ip);
        let len = level.prefix_len(&ip);
        match ip {
            IpAddr::V4(v4) => {
                let raw = u32::from(v4);
                let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
                PrefixKey {
                    bits: (raw & mask) as u128,
                    len,
                    v4: true,
                }
            }
            IpAddr::V6(v6) => {
                let raw = u128::from(v6);
                let mask = if len == 0 {
                    0
                } else {
                    u128::MAX << (128 - len)
                };
                PrefixKey {
                    bits: raw & mask,
                    len,
                    v4: false,
                }
            }
        }
    }

    /// A key that names no address prefix but one visitor (`id`: a
    /// challenge pass) at `level`, for shares counted per visitor instead of
    /// per network. Its length (253 to 255 by level) is no prefix's, so it
    /// never equals one, nor the same visitor's key at another level.
    pub fn visitor(id: u64, level: Level) -> PrefixKey {
        let len = match level {
            Level::Network => 255,
            Level::Subnet => 254,
            Level::Address => 253,
        };
        PrefixKey {
            bits: u128::from(id),
            len,
            v4: false,
        }
    }

    /// A key that names one visit (`id`: `crate::visit::RequestVisit::turn`)
    /// at `level`, for shares counted per visit. Its length (247 to 249 by
    /// level) is no prefix's, no visitor's and no browsing address's.
    pub fn visit(id: u128, level: Level) -> PrefixKey {
        let len = match level {
            Level::Network => 249,
            Level::Subnet => 248,
            Level::Address => 247,
        };
        PrefixKey {
            bits: id,
            len,
            v4: false,
        }
    }

    /// A key that names one address as a share of its own at `level` (a
    /// browsing address, see `admission::browsing`), apart from the keys of
    /// the same address inside its network. Its length (250 to 252 by
    /// level) is no prefix's and no visitor's.
    pub fn browser(ip: IpAddr, level: Level) -> PrefixKey {
        let len = match level {
            Level::Network => 252,
            Level::Subnet => 251,
            Level::Address => 250,
        };
        PrefixKey {
            len,
            ..PrefixKey::of(ip, Level::Address)
        }
    }

    /// The network address of the prefix.
    pub fn network(&self) -> IpAddr {
        if self.v4 {
            IpAddr::V4(Ipv4Addr::from(self.bits as u32))
        } else {
            IpAddr::V6(Ipv6Addr::from(self.bits))
        }
    }

    /// The prefix length in bits (not a count of items, so no `is_empty`).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u8 {
        self.len
    }

    /// A 64-bit digest for compact stores (not a cryptographic hash).
    pub fn digest(&self) -> u64 {
        let hi = (self.bits >> 64) as u64;
        let lo = self.bits as u64;
        let mixed = hi.rotate_left(17) ^ lo ^ ((self.len as u64) << 56) ^ (self.v4 as u64);
        // splitmix64 finaliser: spreads nearby prefixes over the whole range.
        let mut z = mixed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl std::fmt::Display for PrefixKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network(), self.len)
    }
}

/// IPv4-mapped IPv6 (`::ffff:a.b.c.d`) becomes plain IPv4.
pub fn normalize(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// The key an address is counted under by the per-address caps: IPv4 as
/// it is, IPv6 cut to its first `ipv6_prefix` bits. One customer's IPv6
/// site gets a /64 (or a /56, /48) and may use any address in it, so a cap
/// on single addresses caps nothing (`limits.ipv6_prefix_len`).
pub fn per_address_key(ip: IpAddr, ipv6_prefix: u8) -> IpAddr {
    match normalize(ip) {
        IpAddr::V6(v6) if ipv6_prefix < 128 => {
            let bits = u128::from(v6);
            let mask = u128::MAX
                .checked_shl(128 - u32::from(ipv6_prefix))
                .unwrap_or(0);
            IpAddr::V6((bits & mask).into())
        }
        other => other,
    }
}

/// Appends `ip` in its usual text form (`203.0.113.7`, `2001:db8::1`).
///
/// IPv4 is written digit by digit: `Display` goes through a padding-aware
/// formatter and cost more than the rest of an access-log line together.
pub fn write_ip(out: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            let (text, len) = v4_text(v4);
            out.extend_from_slice(&text[..len]);
        }
        IpAddr::V6(v6) => {
            use std::io::Write as _;
            let _ = write!(out, "{v6}");
        }
    }
}

/// Appends `addr` as `ip:port` (`[ip]:port` for IPv6).
pub fn write_socket_addr(out: &mut Vec<u8>, addr: SocketAddr) {
    match addr {
        SocketAddr::V4(v4) => write_ip(out, IpAddr::V4(*v4.ip())),
        SocketAddr::V6(v6) => {
            out.push(b'[');
            write_ip(out, IpAddr::V6(*v6.ip()));
            out.push(b']');
        }
    }
    out.push(b':');
    out.extend_from_slice(itoa::Buffer::new().format(addr.port()).as_bytes());
}

/// An IPv4 address in dotted decimal, composed on the stack (a push per
/// digit into a vector checked its capacity fifteen times): the text and
/// its length. Each octet is three bytes copied from [`OCTETS`] and a
/// length, without dividing (addresses are written several times a request:
/// the log's client and peer, `X-Forwarded-For`).
pub fn v4_text(v4: std::net::Ipv4Addr) -> ([u8; 16], usize) {
    // Room for a whole three-byte copy at the last octet's start (at most
    // 12): the bytes past `len` are not part of the text.
    let mut text = [0u8; 16];
    let mut len = 0;
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            text[len] = b'.';
            len += 1;
        }
        let (digits, n) = OCTETS[usize::from(octet)];
        text[len..len + 3].copy_from_slice(&digits);
        len += usize::from(n);
    }
    (text, len)
}

/// Every octet's decimal digits (left-aligned in three bytes) and how many.
static OCTETS: [([u8; 3], u8); 256] = {
    let mut table = [([0u8; 3], 0u8); 256];
    let mut n = 0;
    while n < 256 {
        let (h, t, u) = ((n / 100) as u8, (n / 10 % 10) as u8, (n % 10) as u8);
        table[n] = if n >= 100 {
            ([b'0' + h, b'0' + t, b'0' + u], 3)
        } else if n >= 10 {
            ([b'0' + t, b'0' + u, 0], 2)
        } else {
            ([b'0' + u, 0, 0], 1)
        };
        n += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ip: &str, level: Level) -> String {
        PrefixKey::of(ip.parse().unwrap(), level).to_string()
    }

    #[test]
    fn every_octet_as_text() {
        for n in 0..=255u8 {
            let ip = std::net::Ipv4Addr::new(n, 255 - n, n / 3, 9);
            let (text, len) = v4_text(ip);
            assert_eq!(std::str::from_utf8(&text[..len]).unwrap(), ip.to_string());
        }
    }

    #[test]
    fn addresses_as_text() {
        let cases = [
            "0.0.0.0",
            "9.10.99.100",
            "255.255.255.255",
            "127.1.2.3",
            "2001:db8::1",
            "::ffff:1.2.3.4",
            "::",
        ];
        for text in cases {
            let ip: IpAddr = text.parse().unwrap();
            let mut out = Vec::new();
            write_ip(&mut out, ip);
            assert_eq!(String::from_utf8(out).unwrap(), ip.to_string(), "{text}");
            for port in [0, 80, 65535] {
                let addr = SocketAddr::new(ip, port);
                let mut out = Vec::new();
                write_socket_addr(&mut out, addr);
                assert_eq!(String::from_utf8(out).unwrap(), addr.to_string());
            }
        }
    }

    #[test]
    fn prefixes_per_level() {
        let cases = [
            ("203.0.113.77", Level::Address, "203.0.113.77/32"),
            ("203.0.113.77", Level::Subnet, "203.0.113.0/24"),
            ("203.0.113.77", Level::Network, "203.0.0.0/16"),
            ("::ffff:203.0.113.77", Level::Subnet, "203.0.113.0/24"),
            (
                "2001:db8:1:2:3:4:5:6",
                Level::Address,
                "2001:db8:1:2:3:4:5:6/128",
            ),
            ("2001:db8:1:2:3:4:5:6", Level::Subnet, "2001:db8:1:2::/64"),
            ("2001:db8:1:2:3:4:5:6", Level::Network, "2001:db8:1::/48"),
        ];
        for (ip, level, want) in cases {
            assert_eq!(key(ip, level), want, "{ip} at {level:?}");
        }
    }

    #[test]
    fn mapped_and_plain_v4_are_one_client() {
        let a = ClientAddr::new("::ffff:10.1.2.3".parse().unwrap());
        let b = ClientAddr::new("10.1.2.3".parse().unwrap());
        assert_eq!(a, b);
        assert_eq!(
            a.key(Level::Address).digest(),
            b.key(Level::Address).digest()
        );
    }

    #[test]
    fn v4_and_v6_keys_differ() {
        let v4 = PrefixKey::of("10.0.0.0".parse().unwrap(), Level::Address);
        let v6 = PrefixKey::of("::a00:0".parse().unwrap(), Level::Address);
        assert_ne!(v4, v6);
    }
}
