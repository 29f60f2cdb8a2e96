//! Client source addresses for cohorts, shaped like the networks in the incidents
//! ("30% in two /20s, the rest over 40 /16s") inside 127.0.0.0/8, where any address can
//! be bound as a source on loopback.
//!
//! weir sees `127.b.c.d`, so prefixes are laid out in that space: a /16 here is
//! `127.b.0.0/16`, a /24 is `127.b.c.0/24`. Each network group gets its own /16s
//! (never `127.0.0.0/16`, where `127.0.0.1` and the lab's listeners live), so cohorts never
//! share a network unless a scenario says so; addresses are spread evenly over a group's
//! prefixes and, inside a prefix, over its /24s, as a crawler spread over many networks is.
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

/// /16s a group uses: one per prefix, or fewer (packed) when prefixes are longer than /16
/// and there are more of them than /16s.
fn slash16s_of(g: &NetworkGroup) -> usize {
    if g.len == 16 {
        g.prefixes
    } else {
        g.prefixes.min(SLASH16_AVAILABLE)
    }
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
        let per_16 = slots_per_16(g.len) as usize;
        let sixteens = slash16s_of(g);
        if sixteens > SLASH16_AVAILABLE || g.prefixes.div_ceil(sixteens) > per_16 {
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
            let sixteens: Vec<u8> = (0..slash16s_of(g))
                .map(|_| self.take())
                .collect::<Result<_, _>>()?;
            let per_16 = g.prefixes.div_ceil(sixteens.len());
            // Prefix j: in /16 number j % m, the (j / m)-th of `per_16` spread across it.
            let stride = slots_per_16(g.len) / per_16 as u32;
            let prefix_base = |j: usize| -> u32 {
                let b = sixteens[j % sixteens.len()] as u32;
                let sub = (j / sixteens.len()) as u32 * stride;
                (127 << 24) | (b << 16) | (sub << (32 - g.len.min(24)))
            };
            for i in 0..n {
                let base = prefix_base(i % g.prefixes);
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
