//! Bytes per live key, and memory under an address spray, measured by a
//! counting global allocator (so table overhead, shards and padding count).
//!
//! Prints, for about 1 million keys: weir's `ShardedStore`, the governor
//! crate's keyed limiter (DashMap) and a plain `HashMap<u64, u64>`; then a
//! spray of 10 million distinct addresses into a store capped at 1 million
//! keys (peak and final heap, against the store's own bound), and the same
//! spray into governor, which has no cap. Run with
//! `cargo bench --bench limiter_memory`.

#![allow(clippy::too_many_lines, reason = "a test or bench reads as one story")]
// A global allocator is an `unsafe impl`; this binary exists only to count.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use governor::{DefaultKeyedRateLimiter, RateLimiter};
use weir_limiter::{MonoTime, Quota, ShardedStore, StoreConfig, key};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to `System`; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            let now = LIVE.fetch_add(new_size, Ordering::Relaxed) + new_size;
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

fn reset_peak() {
    PEAK.store(live(), Ordering::Relaxed);
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

const SEC: Duration = Duration::from_secs(1);

fn weir_quota() -> Quota {
    Quota::new(10, 3600 * SEC, 10).expect("valid quota")
}

fn governor_limiter() -> DefaultKeyedRateLimiter<u64> {
    let quota = governor::Quota::with_period(360 * SEC)
        .expect("nonzero period")
        .allow_burst(NonZeroU32::new(10).expect("nonzero"));
    RateLimiter::keyed(quota)
}

fn per_key(n: usize) {
    let q = weir_quota();
    let now = MonoTime::from_nanos(1);

    let before = live();
    let store = ShardedStore::new(StoreConfig::with_max_keys(4 * n)).expect("valid config");
    for i in 0..n as u64 {
        store.check(key(0, 0, i), &q, now, 1);
    }
    let bytes = live() - before;
    println!(
        "weir ShardedStore    {n:>9} keys: {:>7.1} MiB, {:>5.1} bytes/key (tables alone {:.1})",
        mib(bytes),
        bytes as f64 / store.len() as f64,
        store.table_bytes() as f64 / store.len() as f64
    );
    drop(store);

    let before = live();
    let limiter = governor_limiter();
    for i in 0..n as u64 {
        let _ = limiter.check_key(&key(0, 0, i));
    }
    let bytes = live() - before;
    println!(
        "governor keyed       {n:>9} keys: {:>7.1} MiB, {:>5.1} bytes/key",
        mib(bytes),
        bytes as f64 / limiter.len() as f64
    );
    drop(limiter);

    let before = live();
    let mut map: HashMap<u64, u64> = HashMap::new();
    for i in 0..n as u64 {
        map.insert(key(0, 0, i), 1);
    }
    let bytes = live() - before;
    println!(
        "HashMap<u64, u64>    {n:>9} keys: {:>7.1} MiB, {:>5.1} bytes/key",
        mib(bytes),
        bytes as f64 / map.len() as f64
    );
}

fn spray(addresses: u64, cap: usize) {
    let q = weir_quota(); // T = 6 min: every sprayed key is still live at the end
    let base = live();
    reset_peak();
    let store = ShardedStore::new(StoreConfig::with_max_keys(cap)).expect("valid config");
    for i in 0..addresses {
        // 10 million requests over 100 s of simulated time.
        let now = MonoTime::from_nanos(1_000_000_000 + i * 10_000);
        store.check(key(0, 0, i), &q, now, 1);
    }
    let peak = PEAK.load(Ordering::Relaxed) - base;
    let stats = store.stats();
    println!(
        "spray {addresses} addresses, cap {cap}: {} keys held, {} live keys evicted; \
         heap now {:.1} MiB, peak {:.1} MiB, bound {:.1} MiB",
        stats.len,
        stats.evicted_live,
        mib(live() - base),
        mib(peak),
        mib(store.max_table_bytes())
    );
    drop(store);

    let base = live();
    reset_peak();
    let limiter = governor_limiter();
    for i in 0..addresses {
        let _ = limiter.check_key(&key(0, 0, i));
    }
    println!(
        "spray {addresses} addresses into governor (no cap): {} keys, heap {:.1} MiB, peak {:.1} MiB",
        limiter.len(),
        mib(live() - base),
        mib(PEAK.load(Ordering::Relaxed) - base)
    );
}

fn main() {
    // `cargo bench` passes `--bench`; there is nothing to filter.
    for n in [100_000, 1 << 20] {
        per_key(n);
    }
    spray(10_000_000, 1_000_000);
}
