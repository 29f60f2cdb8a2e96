//! Per-rule tallies of a replay: distinct rejected clients, rejections per
//! /24 and distinct /16s (IPv6: /128, /64, /48), kept compact because on a
//! log with a million addresses they reach millions of entries and their
//! inserts miss the cache.
//!
//! This module counts; it does not decide or format (see `engine`).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use weir::identity::{ClientAddr, Level, PrefixKey};

/// Distinct client addresses; IPv4 kept as `u32` (a quarter of an `IpAddr`'s
/// table space: these sets reach millions and their inserts miss the cache).
#[derive(Debug, Clone, Default)]
pub(super) struct ClientSet {
    v4: HashSet<u32, TallyHash>,
    v6: HashSet<u128, TallyHash>,
}

impl ClientSet {
    pub(super) fn insert(&mut self, ip: IpAddr) {
        match ip {
            IpAddr::V4(a) => self.v4.insert(a.to_bits()),
            IpAddr::V6(a) => self.v6.insert(a.to_bits()),
        };
    }

    pub(super) fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }
}

/// Rejections per /24 (IPv6: /64), keyed by the prefix's bits alone (IPv4
/// `u32`, IPv6 the upper 64 bits): a 16-byte entry where a [`PrefixKey`] and
/// its count take 48, for tables that reach millions of entries and miss
/// the cache on most inserts.
#[derive(Debug, Clone, Default)]
pub(super) struct SubnetCounts {
    v4: HashMap<u32, u64, TallyHash>,
    v6: HashMap<u64, u64, TallyHash>,
}

impl SubnetCounts {
    pub(super) fn add(&mut self, client: ClientAddr) {
        match client.ip() {
            IpAddr::V4(a) => *self.v4.entry(a.to_bits() >> 8).or_insert(0) += 1,
            IpAddr::V6(a) => *self.v6.entry((a.to_bits() >> 64) as u64).or_insert(0) += 1,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    /// Every prefix with its count, as the keys `ClientAddr::key(Level::Subnet)` gives.
    pub(super) fn drain(&mut self) -> impl Iterator<Item = (PrefixKey, u64)> + '_ {
        let v4 = self.v4.drain().map(|(bits, n)| {
            let ip = IpAddr::V4(Ipv4Addr::from_bits(bits << 8));
            (PrefixKey::of(ip, Level::Subnet), n)
        });
        let v6 = self.v6.drain().map(|(bits, n)| {
            let ip = IpAddr::V6(Ipv6Addr::from_bits(u128::from(bits) << 64));
            (PrefixKey::of(ip, Level::Subnet), n)
        });
        v4.chain(v6)
    }
}

/// Distinct /16s (IPv6: /48s). IPv4 has only 65,536 of them: a bit each
/// (8 KiB, allocated on the first one), which never leaves the cache.
#[derive(Debug, Clone, Default)]
pub(super) struct NetworkSet {
    v4: Vec<u64>,
    v4_len: usize,
    v6: HashSet<u64, TallyHash>,
}

impl NetworkSet {
    pub(super) fn insert(&mut self, client: ClientAddr) {
        match client.ip() {
            IpAddr::V4(a) => {
                if self.v4.is_empty() {
                    self.v4 = vec![0; (1 << 16) / 64];
                }
                let network = (a.to_bits() >> 16) as usize;
                let (word, bit) = (network / 64, 1u64 << (network % 64));
                if self.v4[word] & bit == 0 {
                    self.v4[word] |= bit;
                    self.v4_len += 1;
                }
            }
            IpAddr::V6(a) => {
                self.v6.insert((a.to_bits() >> 80) as u64);
            }
        }
    }

    pub(super) fn len(&self) -> usize {
        self.v4_len + self.v6.len()
    }
}

/// A hasher for the per-rule tallies (addresses and prefixes, millions of
/// inserts per replay): a multiply-rotate mix with a per-process random seed,
/// a fraction of SipHash's cost. The keys come from the replayed log only.
#[derive(Debug, Clone, Copy)]
struct TallyHash(u64);

impl Default for TallyHash {
    fn default() -> Self {
        TallyHash(std::collections::hash_map::RandomState::new().hash_one(0u8))
    }
}

impl BuildHasher for TallyHash {
    type Hasher = TallyHasher;
    fn build_hasher(&self) -> TallyHasher {
        TallyHasher(self.0)
    }
}

struct TallyHasher(u64);

impl Hasher for TallyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7C_C1_B7_27_22_0A_95);
    }
    fn write_u8(&mut self, x: u8) {
        self.write_u64(u64::from(x));
    }
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
    fn write_u128(&mut self, x: u128) {
        self.write_u64(x as u64);
        self.write_u64((x >> 64) as u64);
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
    fn finish(&self) -> u64 {
        // splitmix64's finaliser: hashbrown takes its control bits from the top.
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_tallies_count_as_prefix_keys_do() {
        let addrs = [
            "10.0.0.1",
            "10.0.0.2",
            "10.0.1.1",
            "10.1.0.1",
            "255.255.255.255",
            "0.0.0.0",
            "::ffff:10.0.0.3",
            "2001:db8::1",
            "2001:db8::2",
            "2001:db8:0:1::1",
            "2001:db8:1::1",
            "::",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        ];
        let mut subnets = SubnetCounts::default();
        let mut networks = NetworkSet::default();
        let mut want_subnets: HashMap<PrefixKey, u64> = HashMap::new();
        let mut want_networks: HashSet<PrefixKey> = HashSet::new();
        for (i, a) in addrs.iter().enumerate() {
            let client = ClientAddr::new(a.parse().expect("test address"));
            // Some addresses twice, to count.
            for _ in 0..=(i % 2) {
                subnets.add(client);
                networks.insert(client);
                *want_subnets.entry(client.key(Level::Subnet)).or_insert(0) += 1;
                want_networks.insert(client.key(Level::Network));
            }
        }
        assert_eq!(subnets.len(), want_subnets.len());
        assert_eq!(networks.len(), want_networks.len());
        let got: HashMap<PrefixKey, u64> = subnets.drain().collect();
        assert_eq!(got, want_subnets);
    }
}
