//! The trusted-proxy list: the networks whose forwarding information
//! (`X-Forwarded-For`, `Forwarded`, PROXY protocol) weir believes.
//!
//! Owns parsing the configured entries (CIDRs or bare addresses) into a compact
//! runtime table and answering "is this hop a trusted proxy?". It does not read
//! headers or decide who the client is; that is [`super::forwarded`].

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::addr::normalize;

/// A configured trusted-proxy entry that is not an address or a CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustedProxyError {
    #[error(
        "trusted proxy entry #{index} {entry:?} is not an IP address or CIDR \
         (expected e.g. 10.0.0.0/8, 2001:db8::/32 or 192.0.2.7)"
    )]
    NotAnAddress { index: usize, entry: String },
    #[error(
        "trusted proxy entry #{index} {entry:?} has host bits set below /{prefix_len}; \
         write the network address {network} (a typo here silently trusts or distrusts a different range)"
    )]
    HostBitsSet {
        index: usize,
        entry: String,
        prefix_len: u8,
        network: IpNet,
    },
}

/// The set of networks whose forwarding information weir believes.
///
/// Lookup is a linear scan over masked integers, split by family. Real
/// deployments list a handful of ranges (a load balancer subnet, a CDN's few
/// blocks): scanning ten `(addr & mask) == net` comparisons over contiguous
/// memory is a few nanoseconds and branch-predictable, which beats the pointer
/// chasing of a trie until lists reach the hundreds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    /// `(network, mask, prefix_len)`; IPv4-mapped IPv6 ranges are stored here.
    v4: Vec<(u32, u32, u8)>,
    v6: Vec<(u128, u128, u8)>,
}

impl TrustedProxies {
    /// Parses configured entries: `10.0.0.0/8`, `2001:db8::/32`, or a bare
    /// address (`192.0.2.7` = /32, `2001:db8::7` = /128). Surrounding
    /// whitespace is ignored. IPv4-mapped IPv6 ranges (`::ffff:10.0.0.0/104`)
    /// are stored as IPv4, because addresses are normalised before lookup.
    ///
    /// Fails on the first entry that is not an address or CIDR, naming it and
    /// its index, and on a CIDR with host bits set (`10.1.2.3/8`).
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, TrustedProxyError> {
        let mut trusted = TrustedProxies::default();
        for (index, raw) in entries.iter().enumerate() {
            trusted.insert(Self::parse_entry(index, raw.as_ref())?);
        }
        Ok(trusted)
    }

    /// Parses entry number `index` of a list alone (to report every bad
    /// entry of a list, each under its own number).
    pub fn parse_entry(index: usize, raw: &str) -> Result<IpNet, TrustedProxyError> {
        let net = parse_entry(raw.trim()).ok_or_else(|| TrustedProxyError::NotAnAddress {
            index,
            entry: raw.to_string(),
        })?;
        if net.addr() != net.network() {
            return Err(TrustedProxyError::HostBitsSet {
                index,
                entry: raw.to_string(),
                prefix_len: net.prefix_len(),
                network: net.trunc(),
            });
        }
        Ok(net)
    }

    fn insert(&mut self, net: IpNet) {
        match net {
            IpNet::V4(n) => self.insert_v4(n.network(), n.prefix_len()),
            IpNet::V6(n) => {
                // `::ffff:0:0/96` and longer prefixes are IPv4 ranges in disguise.
                match n.network().to_ipv4_mapped() {
                    Some(v4) if n.prefix_len() >= 96 => self.insert_v4(v4, n.prefix_len() - 96),
                    _ => {
                        let len = n.prefix_len();
                        let mask = if len == 0 {
                            0
                        } else {
                            u128::MAX << (128 - len)
                        };
                        let entry = (u128::from(n.network()) & mask, mask, len);
                        if !self.v6.contains(&entry) {
                            self.v6.push(entry);
                        }
                    }
                }
            }
        }
    }

    fn insert_v4(&mut self, network: Ipv4Addr, len: u8) {
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
        let entry = (u32::from(network) & mask, mask, len);
        if !self.v4.contains(&entry) {
            self.v4.push(entry);
        }
    }

    /// Whether `ip` lies in a trusted network. IPv4-mapped IPv6 is looked up
    /// as IPv4, so `::ffff:10.0.0.1` matches `10.0.0.0/8`.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match normalize(ip) {
            IpAddr::V4(v4) => {
                let raw = u32::from(v4);
                self.v4.iter().any(|&(net, mask, _)| raw & mask == net)
            }
            IpAddr::V6(v6) => {
                let raw = u128::from(v6);
                self.v6.iter().any(|&(net, mask, _)| raw & mask == net)
            }
        }
    }

    /// True when no proxy is trusted: every peer is then taken as the client,
    /// which is right only when nothing sits in front of weir.
    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }

    /// Number of distinct networks (after normalisation and de-duplication).
    pub fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    /// The networks, IPv4 first, for logs and the admin API.
    pub fn networks(&self) -> impl Iterator<Item = IpNet> + '_ {
        let v4 = self.v4.iter().filter_map(|&(net, _, len)| {
            Ipv4Net::new(Ipv4Addr::from(net), len).ok().map(IpNet::V4)
        });
        let v6 = self.v6.iter().filter_map(|&(net, _, len)| {
            Ipv6Net::new(Ipv6Addr::from(net), len).ok().map(IpNet::V6)
        });
        v4.chain(v6)
    }
}

impl fmt::Display for TrustedProxies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, net) in self.networks().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{net}")?;
        }
        Ok(())
    }
}

fn parse_entry(entry: &str) -> Option<IpNet> {
    if entry.contains('/') {
        entry.parse::<IpNet>().ok()
    } else {
        entry.parse::<IpAddr>().ok().map(IpNet::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn membership() {
        // (configured entries, address, trusted?)
        let cases: &[(&[&str], &str, bool)] = &[
            (&["10.0.0.0/8"], "10.255.1.2", true),
            (&["10.0.0.0/8"], "11.0.0.1", false),
            (&["10.0.0.0/8"], "::ffff:10.1.2.3", true),
            (&["192.0.2.7"], "192.0.2.7", true),
            (&["192.0.2.7"], "192.0.2.8", false),
            (&[" 192.0.2.7 "], "192.0.2.7", true),
            (&["2001:db8::/32"], "2001:db8:ffff::1", true),
            (&["2001:db8::/32"], "2001:db9::1", false),
            (&["2001:db8::7"], "2001:db8::7", true),
            (&["2001:db8::7"], "2001:db8::8", false),
            (&["::ffff:10.0.0.0/104"], "10.9.9.9", true),
            (&["::ffff:10.0.0.0/104"], "::ffff:10.9.9.9", true),
            (&["::ffff:10.0.0.0/104"], "11.0.0.1", false),
            (&["0.0.0.0/0"], "203.0.113.1", true),
            (&["0.0.0.0/0"], "2001:db8::1", false),
            (&["::/0"], "2001:db8::1", true),
            (&["10.0.0.0/8"], "2001:db8::1", false),
            (&["172.16.0.0/12", "2001:db8::/32"], "172.31.255.255", true),
            (&["172.16.0.0/12", "2001:db8::/32"], "172.32.0.0", false),
            (&[], "10.0.0.1", false),
            (&["127.0.0.1"], "::1", false),
            (&["::1"], "::1", true),
        ];
        for (entries, addr, want) in cases {
            let trusted = TrustedProxies::parse(entries).unwrap();
            assert_eq!(
                trusted.contains(ip(addr)),
                *want,
                "{entries:?} contains {addr}"
            );
        }
    }

    #[test]
    fn rejects_garbage_naming_entry_and_index() {
        // (entries, index of the bad one, words the message must contain)
        let cases: &[(&[&str], usize, &str)] = &[
            (&["10.0.0.0/8", "garbage"], 1, "\"garbage\""),
            (&[""], 0, "\"\""),
            (&["10.0.0.0/33"], 0, "10.0.0.0/33"),
            (&["10.0.0/8"], 0, "10.0.0/8"),
            (&["2001:db8::/129"], 0, "2001:db8::/129"),
            (&["10.0.0.0/"], 0, "10.0.0.0/"),
            (&["10.0.0.0/8/8"], 0, "10.0.0.0/8/8"),
            (&["localhost"], 0, "localhost"),
            (&["::1", "1.2.3.4", "1.2.3.4:80"], 2, "1.2.3.4:80"),
            (&["10.1.2.3/8"], 0, "10.0.0.0/8"),
            (&["2001:db8::1/32"], 0, "2001:db8::/32"),
        ];
        for (entries, index, needle) in cases {
            let err = TrustedProxies::parse(entries).unwrap_err();
            let got = match &err {
                TrustedProxyError::NotAnAddress { index, .. } => *index,
                TrustedProxyError::HostBitsSet { index, .. } => *index,
            };
            assert_eq!(got, *index, "{entries:?}: {err}");
            let msg = err.to_string();
            assert!(msg.contains(needle), "{entries:?}: {msg:?} lacks {needle}");
            assert!(msg.contains(&format!("#{index}")), "{msg:?} lacks index");
        }
    }

    #[test]
    fn empty_len_and_display() {
        let none = TrustedProxies::parse::<&str>(&[]).unwrap();
        assert!(none.is_empty());
        let some =
            TrustedProxies::parse(&["10.0.0.0/8", "10.0.0.0/8", "::ffff:10.0.0.0/104", "::1"])
                .unwrap();
        assert!(!some.is_empty());
        assert_eq!(some.len(), 2, "duplicates and mapped duplicates collapse");
        assert_eq!(some.to_string(), "10.0.0.0/8, ::1/128");
    }
}
