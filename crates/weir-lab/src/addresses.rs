//! Client source addresses for cohorts, shaped like the networks in the incidents
//! ("30% in two /20s, the rest over 40 /16s") inside 127.0.0.0/8, where any address can
//! be bound as a source on loopback.
//!
//! weir sees `127.b.c.d`, so prefixes are laid out in that space: a /16 here is
//! `127.b.0.0/16`, a /24 is `127.b.c.0/24`. Each network group gets its own /16s
//! (never `127.0.0.0/16`, where `127.0.0.1` and the lab's listeners live), so cohorts never
//! share a network unless a scenario says so; addresses are spread evenly over a group's
//! prefixes and, inside a prefix, over its /24s, as a crawler spread over many networks is.
//! A group with `within` packs its prefixes into as few networks of that length as hold
//! them instead: a carrier's NAT pool is many people over a few /24s of ONE /16.
//!
//! It does not bind anything and does not model IPv6 (loopback has only `::1`).

use std::net::Ipv4Addr;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;

use serde::Deserialize;

/// A share of a cohort's addresses spread over `prefixes` networks of length `len`.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NetworkGroup {
    /// Share of the cohort's addresses (all groups sum to 1).
    pub share: f64,
    /// Number of distinct networks.
    pub prefixes: usize,
    /// Prefix length, 16..=32 (the lab's address space is 127.0.0.0/8).
    pub len: u8,
    /// Pack the prefixes into as few networks of this length (16..=24, shorter than
    /// `len`) as hold them, e.g. 16 /24s `within = 16`: one /16, as behind a carrier
    /// NAT. Default: every prefix in a /16 of its own while /16s last.
    #[serde(default)]
    pub within: Option<u8>,
}

/// /16s of 127.0.0.0/8 available to clients: `127.1` .. `127.255`.
pub const SLASH16_AVAILABLE: usize = 255;

/// A network layout that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddressError {
    #[error("network shares sum to {0}, not 1")]
    Shares(String),
    #[error("networks[{index}]: len = {len} must be between 16 and 32 (the lab uses 127.0.0.0/8)")]
    Length { index: usize, len: u8 },
    #[error("networks[{index}]: prefixes must be at least 1")]
    NoPrefixes { index: usize },
    #[error(
        "networks[{index}]: within = {within} must be between 16 and 24 and shorter than len = {len}"
    )]
    Within { index: usize, within: u8, len: u8 },
    #[error("networks[{index}]: {prefixes} /{len}s do not fit in the lab's /16s")]
    TooManyPrefixes {
        index: usize,
        prefixes: usize,
        len: u8,
    },
    #[error("networks[{index}]: {addresses} addresses do not fit in {prefixes} /{len}s")]
    TooManyAddresses {
        index: usize,
        addresses: usize,
        prefixes: usize,
        len: u8,
    },
    #[error("the cohorts need more /16s than 127.0.0.0/8 has ({SLASH16_AVAILABLE})")]
    OutOfSpace,
}

/// Addresses of each group: the group's share of `total`, the last group taking the rest.
fn split(groups: &[NetworkGroup], total: usize) -> Vec<usize> {
    let mut out = Vec::with_capacity(groups.len());
    let mut left = total;
    for (i, g) in groups.iter().enumerate() {
        let n = if i + 1 == groups.len() {
            left
        } else {
            ((g.share * total as f64).round() as usize).min(left)
        };
        left -= n;
        out.push(n);
    }
    out
}

/// The networks a group's prefixes are placed in: the prefixes themselves, or with
/// `within`, as few networks of that length as hold them.
fn outer_networks(g: &NetworkGroup) -> (usize, u8) {
    match g.within {
        None => (g.prefixes, g.len),
        Some(w) => (g.prefixes.div_ceil(prefixes_per_block(g.len, w)), w),
    }
}

/// Prefixes of length `len` that one network of length `within` holds (longer
/// prefixes than /24 take a /24 each, as in [`slots_per_16`]).
fn prefixes_per_block(len: u8, within: u8) -> usize {
    1usize << (len.min(24).saturating_sub(within))
}

/// /16s `prefixes` networks of length `len` use: one each, or fewer (packed) when they
/// are longer than /16 and there are more of them than /16s.
fn slash16s_for(prefixes: usize, len: u8) -> usize {
    if len == 16 {
        prefixes
    } else {
        prefixes.min(SLASH16_AVAILABLE)
    }
}

/// /16s a group uses.
fn slash16s_of(g: &NetworkGroup) -> usize {
    let (n, len) = outer_networks(g);
    slash16s_for(n, len)
}

/// Total /16s a set of groups needs.
pub fn slash16_needed<'a>(groups: impl Iterator<Item = &'a NetworkGroup>) -> usize {
    groups.map(slash16s_of).sum()
}

/// Checks a cohort's groups for `addresses` addresses without allocating any.
pub fn check_groups(groups: &[NetworkGroup], addresses: usize) -> Result<(), AddressError> {
    let sum: f64 = groups.iter().map(|g| g.share).sum();
    if (sum - 1.0).abs() > 1e-6 || groups.iter().any(|g| g.share.is_nan() || g.share < 0.0) {
        return Err(AddressError::Shares(format!("{sum}")));
    }
    for ((index, g), n) in groups.iter().enumerate().zip(split(groups, addresses)) {
        if !(16..=32).contains(&g.len) {
            return Err(AddressError::Length { index, len: g.len });
        }
        if g.prefixes == 0 {
            return Err(AddressError::NoPrefixes { index });
        }
        if let Some(within) = g.within
            && (!(16..=24).contains(&within) || within >= g.len)
        {
            return Err(AddressError::Within {
                index,
                within,
                len: g.len,
            });
        }
        let (outer, outer_len) = outer_networks(g);
        let per_16 = slots_per_16(outer_len) as usize;
        let sixteens = slash16s_of(g);
        if sixteens > SLASH16_AVAILABLE || outer.div_ceil(sixteens) > per_16 {
            return Err(AddressError::TooManyPrefixes {
                index,
                prefixes: g.prefixes,
                len: g.len,
            });
        }
        if n.div_ceil(g.prefixes) > hosts_in(g.len) {
            return Err(AddressError::TooManyAddresses {
                index,
                addresses: n,
                prefixes: g.prefixes,
                len: g.len,
            });
        }
    }
    Ok(())
}

/// Usable client addresses in one prefix: .0 and .255 of every /24 are skipped.
fn hosts_in(len: u8) -> usize {
    match len {
        16..=24 => (1usize << (24 - len)) * 254,
        25..=30 => (1usize << (32 - len)) - 2,
        _ => 1,
    }
}

/// Prefixes of length `len` placed per /16: longer prefixes than /24 get a /24 each, so
/// their hosts never touch a .0 or .255.
fn slots_per_16(len: u8) -> u32 {
    1u32 << (len.min(24) - 16)
}

/// Hands out disjoint /16s of 127.0.0.0/8 in a seeded random order, across cohorts.
#[derive(Debug, Clone)]
pub struct AddressSpace {
    free: Vec<u8>,
}

impl AddressSpace {
    /// Every /16 except `127.0.0.0/16`, shuffled by `seed`.
    pub fn new(seed: u64) -> AddressSpace {
        let mut free: Vec<u8> = (1..=255).collect();
        free.shuffle(&mut SmallRng::seed_from_u64(seed));
        AddressSpace { free }
    }

    fn take(&mut self) -> Result<u8, AddressError> {
        self.free.pop().ok_or(AddressError::OutOfSpace)
    }

    /// `total` addresses laid out over `groups`; group order is kept, so the first
    /// `round(share x total)` addresses belong to the first group.
    pub fn allocate(
        &mut self,
        groups: &[NetworkGroup],
        total: usize,
    ) -> Result<Vec<Ipv4Addr>, AddressError> {
        check_groups(groups, total)?;
        let mut out = Vec::with_capacity(total);
        for (g, n) in groups.iter().zip(split(groups, total)) {
            let bases = self.prefix_bases(g)?;
            for i in 0..n {
                let base = bases[i % g.prefixes];
                let q = (i / g.prefixes) as u32;
                let addr = if g.len <= 24 {
                    let n24 = 1u32 << (24 - g.len);
                    base | ((q % n24) << 8) | (1 + q / n24)
                } else {
                    base | (1 + q)
                };
                out.push(Ipv4Addr::from(addr));
            }
        }
        Ok(out)
    }

    /// The base address of each of a group's prefixes, in prefix order. With `within`,
    /// prefix `j` is the `j / blocks`-th of its block `j % blocks`, packed from the
    /// block's start, so a carrier's /24s sit side by side in one /16.
    fn prefix_bases(&mut self, g: &NetworkGroup) -> Result<Vec<u32>, AddressError> {
        let Some(within) = g.within else {
            return self.spread(g.prefixes, g.len);
        };
        let (blocks, _) = outer_networks(g);
        let block_bases = self.spread(blocks, within)?;
        let shift = 32 - u32::from(g.len.min(24));
        Ok((0..g.prefixes)
            .map(|j| block_bases[j % blocks] | (((j / blocks) as u32) << shift))
            .collect())
    }

    /// Base addresses of `prefixes` networks of length `len` over fresh /16s: prefix
    /// `j` in /16 number `j % m`, the `(j / m)`-th of those spread evenly across it.
    fn spread(&mut self, prefixes: usize, len: u8) -> Result<Vec<u32>, AddressError> {
        let sixteens: Vec<u8> = (0..slash16s_for(prefixes, len))
            .map(|_| self.take())
            .collect::<Result<_, _>>()?;
        let per_16 = prefixes.div_ceil(sixteens.len());
        let stride = slots_per_16(len) / per_16 as u32;
        Ok((0..prefixes)
            .map(|j| {
                let b = sixteens[j % sixteens.len()] as u32;
                let sub = (j / sixteens.len()) as u32 * stride;
                (127 << 24) | (b << 16) | (sub << (32 - len.min(24)))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn group(share: f64, prefixes: usize, len: u8) -> NetworkGroup {
        NetworkGroup {
            share,
            prefixes,
            len,
            within: None,
        }
    }

    fn packed(prefixes: usize, len: u8, within: u8) -> NetworkGroup {
        NetworkGroup {
            within: Some(within),
            ..group(1.0, prefixes, len)
        }
    }

    fn count_prefixes(addrs: &[Ipv4Addr], len: u8) -> usize {
        let mask = u32::MAX << (32 - len);
        addrs
            .iter()
            .map(|a| u32::from(*a) & mask)
            .collect::<BTreeSet<_>>()
            .len()
    }

    #[test]
    fn distributions_give_the_requested_networks() {
        // (groups, addresses, /16s, /20s, /24s) — incident 1: 30% in two /20s, the rest
        // over 40 /16s, each /24 with a single address.
        #[rustfmt::skip]
        let cases: Vec<(Vec<NetworkGroup>, usize, usize, usize, usize)> = vec![
            (vec![group(0.3, 2, 20), group(0.7, 40, 16)], 200, 42, 42, 32 + 140),
            (vec![group(1.0, 300, 24)], 300, 255, 300, 300),
            (vec![group(1.0, 4, 32)], 4, 4, 4, 4),
            (vec![group(1.0, 1, 24)], 100, 1, 1, 1),
            (vec![group(1.0, 10, 16)], 10, 10, 10, 10),
            (vec![group(0.5, 1, 20), group(0.5, 1, 20)], 64, 2, 2, 32),
            // A carrier NAT: 100 people over 16 /24s of ONE /16.
            (vec![packed(16, 24, 16)], 100, 1, 1, 16),
            // 300 /24s packed into /16s: two /16s, 150 /24s side by side in each.
            (vec![packed(300, 24, 16)], 300, 2, 20, 300),
            // 8 /24s packed into one /20 (of one /16).
            (vec![packed(8, 24, 20)], 40, 1, 1, 8),
        ];
        for (groups, total, s16, s20, s24) in cases {
            let addrs = AddressSpace::new(7).allocate(&groups, total).expect("fits");
            assert_eq!(addrs.len(), total, "{groups:?}");
            let distinct: BTreeSet<_> = addrs.iter().collect();
            assert_eq!(distinct.len(), total, "addresses unique: {groups:?}");
            assert_eq!(
                (
                    count_prefixes(&addrs, 16),
                    count_prefixes(&addrs, 20),
                    count_prefixes(&addrs, 24)
                ),
                (s16, s20, s24),
                "{groups:?}"
            );
            for a in &addrs {
                let o = a.octets();
                assert_eq!(o[0], 127);
                assert_ne!(o[1], 0, "never 127.0.x.x");
                assert!(o[3] != 0 && o[3] != 255, "{a}");
            }
        }
    }

    #[test]
    fn a_carrier_nat_packs_its_24s_side_by_side_in_one_16() {
        let mut space = AddressSpace::new(5);
        let carrier = space.allocate(&[packed(16, 24, 16)], 100).expect("fits");
        let b = carrier[0].octets()[1];
        // 100 people over 127.b.0.0/24 .. 127.b.15.0/24, 6 or 7 per /24.
        let mut per_24 = std::collections::BTreeMap::new();
        for a in &carrier {
            let [_, x, c, d] = a.octets();
            assert_eq!(x, b, "{a} outside the carrier's /16");
            assert!(c < 16 && (1..=7).contains(&d), "{a}");
            *per_24.entry(c).or_insert(0) += 1;
        }
        assert_eq!(per_24.len(), 16);
        assert!(per_24.values().all(|n| *n == 6 || *n == 7), "{per_24:?}");
        // The next cohort still gets /16s of its own.
        let other = space.allocate(&[group(1.0, 10, 16)], 10).expect("fits");
        assert!(other.iter().all(|a| a.octets()[1] != b));
    }

    #[test]
    fn group_shares_are_kept_in_order() {
        let groups = [group(0.3, 2, 20), group(0.7, 40, 16)];
        let addrs = AddressSpace::new(1).allocate(&groups, 100).expect("fits");
        assert_eq!(count_prefixes(&addrs[..30], 20), 2);
        assert_eq!(count_prefixes(&addrs[30..], 16), 40);
    }

    #[test]
    fn cohorts_never_share_a_slash16() {
        let mut space = AddressSpace::new(3);
        let a = space.allocate(&[group(1.0, 50, 24)], 50).expect("fits");
        let b = space.allocate(&[group(1.0, 40, 16)], 80).expect("fits");
        let sixteens = |v: &[Ipv4Addr]| v.iter().map(|x| x.octets()[1]).collect::<BTreeSet<_>>();
        assert!(sixteens(&a).is_disjoint(&sixteens(&b)));
    }

    #[test]
    fn impossible_layouts_are_errors() {
        #[rustfmt::skip]
        let cases: Vec<(Vec<NetworkGroup>, usize, AddressError)> = vec![
            (vec![group(0.5, 1, 24)], 10, AddressError::Shares("0.5".into())),
            (vec![group(1.0, 1, 8)], 10, AddressError::Length { index: 0, len: 8 }),
            (vec![group(1.0, 0, 24)], 10, AddressError::NoPrefixes { index: 0 }),
            (vec![group(1.0, 300, 16)], 300, AddressError::TooManyPrefixes { index: 0, prefixes: 300, len: 16 }),
            (vec![group(1.0, 1, 32)], 2, AddressError::TooManyAddresses { index: 0, addresses: 2, prefixes: 1, len: 32 }),
            (vec![group(1.0, 1, 24)], 255, AddressError::TooManyAddresses { index: 0, addresses: 255, prefixes: 1, len: 24 }),
            (vec![packed(4, 24, 24)], 4, AddressError::Within { index: 0, within: 24, len: 24 }),
            (vec![packed(4, 28, 12)], 4, AddressError::Within { index: 0, within: 12, len: 28 }),
            (vec![packed(256 * 256, 24, 16)], 256 * 256, AddressError::TooManyPrefixes { index: 0, prefixes: 65536, len: 24 }),
        ];
        for (groups, total, want) in cases {
            assert_eq!(
                check_groups(&groups, total),
                Err(want.clone()),
                "{groups:?}"
            );
            assert_eq!(AddressSpace::new(0).allocate(&groups, total), Err(want));
        }
        let mut space = AddressSpace::new(0);
        space.allocate(&[group(1.0, 250, 16)], 250).expect("fits");
        assert_eq!(
            space.allocate(&[group(1.0, 10, 16)], 10),
            Err(AddressError::OutOfSpace)
        );
    }
}
