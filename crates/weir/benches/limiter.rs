//! ns per rule check: weir's limiter against the governor crate, same run.
//!
//! A request is checked against 4 rules: per address, per /24, per /16 and
//! site-wide, with 2^20 (about 1 million) live address keys, 4,096 /24 keys,
//! 16 /16 keys and one site-wide key. Each contender first sees every
//! address once, then is timed on a fixed pseudo-random order of addresses.
//!
//! - `weir`: one [`ShardedStore`] per rule, keys mixed with `limiter::key`,
//!   one clock read per request (as the proxy will do).
//! - `governor`: one `DefaultKeyedRateLimiter<u64>` (DashMap) per rule with
//!   the same quotas, keyed by the same digests; it reads its clock in every
//!   check, which is part of its cost as used.
//! - `naive`: one `Mutex<HashMap<u64, u64>>` (SipHash) per rule running the
//!   same GCRA: the floor any store should beat.
//!
//! Key digests (`PrefixKey::digest`) are computed from the address inside
//! the timed request, as identity does for a live request: that cost is in
//! every contender's figure. (An earlier version read them from a table
//! computed beforehand: 32 MiB read at random, a cache miss per request that
//! no proxy has, since a request's address is in hand.) Single-threaded; throughput is
//! set to 4 elements so criterion prints checks per second, and ns per rule
//! check is the time per request divided by 4.
//! Bytes per key are measured in `benches/limiter_memory.rs`.

#![allow(clippy::too_many_lines, reason = "a test or bench reads as one story")]

use std::collections::HashMap;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use governor::{DefaultKeyedRateLimiter, RateLimiter};
use weir::identity::{ClientAddr, Level};
use weir_limiter::{Clock, MonoTime, MonotonicClock, Quota, ShardedStore, StoreConfig, key};

// The allocator weir runs with (src/main.rs), for every contender.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const ADDRESSES: u32 = 1 << 20;
const ORDER_LEN: usize = 1 << 16;

/// (count, period, burst) per rule: address, /24, /16, site-wide. Long
/// periods keep every key live for the whole run.
const QUOTAS: [(u32, u64, u32); 4] = [
    (10, 3600, 10),
    (300, 600, 300),
    (3000, 600, 3000),
    (600, 600, 600),
];

/// The key digests of address number `i` of 10.0.0.0/12 (visited in a
/// scrambled order: an odd multiplier mod 2^20), as identity computes them
/// for a request.
fn digests(i: u32) -> [u64; 4] {
    let ip = IpAddr::V4(Ipv4Addr::from(
        0x0a00_0000 + (i.wrapping_mul(0x9E37_79B1) % ADDRESSES),
    ));
    let c = ClientAddr::new(ip);
    [
        c.key(Level::Address).digest(),
        c.key(Level::Subnet).digest(),
        c.key(Level::Network).digest(),
        0,
    ]
}

/// Request order over the first `distinct` addresses (xorshift).
fn order(distinct: u32) -> Vec<u32> {
    let mut x = 0x1234_5678_u64;
    (0..ORDER_LEN)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % u64::from(distinct)) as u32
        })
        .collect()
}

struct Weir {
    stores: Vec<ShardedStore>,
    quotas: Vec<Quota>,
    clock: MonotonicClock,
}

impl Weir {
    fn new() -> Weir {
        let stores = (0..4)
            .map(|_| {
                ShardedStore::new(StoreConfig::with_max_keys(2 * ADDRESSES as usize))
                    .expect("valid config")
            })
            .collect();
        let quotas = QUOTAS
            .iter()
            .map(|&(c, p, b)| Quota::new(c, Duration::from_secs(p), b).expect("valid quota"))
            .collect();
        Weir {
            stores,
            quotas,
            clock: MonotonicClock,
        }
    }

    fn request(&self, digests: &[u64; 4]) -> usize {
        let now = self.clock.now();
        let mut allowed = 0;
        for (rule, (store, quota)) in self.stores.iter().zip(&self.quotas).enumerate() {
            let k = key(rule as u32, rule as u8, digests[rule]);
            allowed += usize::from(store.check(k, quota, now, 1).is_allowed());
        }
        allowed
    }
}

struct Governor {
    limiters: Vec<DefaultKeyedRateLimiter<u64>>,
}

impl Governor {
    fn new() -> Governor {
        let limiters = QUOTAS
            .iter()
            .map(|&(c, p, b)| {
                let burst = NonZeroU32::new(b).expect("nonzero burst");
                let quota = governor::Quota::with_period(Duration::from_secs(p) / c)
                    .expect("nonzero period")
                    .allow_burst(burst);
                RateLimiter::keyed(quota)
            })
            .collect();
        Governor { limiters }
    }

    fn request(&self, digests: &[u64; 4]) -> usize {
        let mut allowed = 0;
        for (limiter, digest) in self.limiters.iter().zip(digests) {
            allowed += usize::from(limiter.check_key(digest).is_ok());
        }
        allowed
    }
}

struct Naive {
    maps: Vec<Mutex<HashMap<u64, u64>>>,
    quotas: Vec<Quota>,
    clock: MonotonicClock,
}

impl Naive {
    fn new() -> Naive {
        Naive {
            maps: (0..4).map(|_| Mutex::new(HashMap::new())).collect(),
            quotas: Weir::new().quotas,
            clock: MonotonicClock,
        }
    }

    fn request(&self, digests: &[u64; 4]) -> usize {
        let now = self.clock.now();
        let mut allowed = 0;
        for ((map, quota), digest) in self.maps.iter().zip(&self.quotas).zip(digests) {
            let mut map = map.lock().expect("no panics while held");
            let tat = map.entry(*digest).or_insert(0);
            let mut t = MonoTime::from_nanos(*tat);
            allowed += usize::from(quota.check(&mut t, now, 1).is_allowed());
            *tat = t.as_nanos();
        }
        allowed
    }
}

fn bench(c: &mut Criterion) {
    let weir = Weir::new();
    let governor = Governor::new();
    let naive = Naive::new();
    for i in 0..ADDRESSES {
        let d = digests(i);
        weir.request(&d);
        governor.request(&d);
        naive.request(&d);
    }
    let live: usize = weir.stores.iter().map(|s| s.len()).sum();
    let governor_live: usize = governor.limiters.iter().map(|l| l.len()).sum();
    eprintln!("live keys: weir {live}, governor {governor_live} (address, /24, /16, site-wide)");

    // `spread`: any of the 2^20 addresses, so the address key is a cache miss
    // (as in a crawler spray). `hot`: 1,024 addresses, so it is in cache and
    // the figure is the CPU cost of a check.
    for (group_name, distinct) in [
        ("request_4_rules_spread", ADDRESSES),
        ("request_4_rules_hot", 1024),
    ] {
        let order = order(distinct);
        let mut group = c.benchmark_group(group_name);
        group.throughput(Throughput::Elements(4));
        let mut run = |name: &str, f: &dyn Fn(&[u64; 4]) -> usize| {
            let mut i = 0;
            group.bench_function(name, |b| {
                b.iter(|| {
                    i = (i + 1) % ORDER_LEN;
                    black_box(f(&digests(order[i])))
                })
            });
        };
        run("weir", &|d| weir.request(d));
        run("governor", &|d| governor.request(d));
        run("naive_mutex_hashmap", &|d| naive.request(d));
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    targets = bench
}
criterion_main!(benches);
