//! A bounded cache of auth sub-request outcomes, keyed by a digest of the session cookies.
//!
//! Eviction is oldest-inserted first (FIFO; a refreshed entry counts as new). FIFO rather
//! than LRU because a hit then needs no bookkeeping, and a session is re-asked every TTL
//! anyway. An insertion-order queue with generations lets a refreshed or removed entry leave
//! a stale queue slot behind; the queue is compacted when it reaches twice the bound, so it
//! never holds more than `2 * max_entries + COMPACT_SLACK` slots.
//!
//! Memory bound per entry: map entry (16-byte key, 8-byte expiry, 8-byte generation,
//! 16-byte outcome, about 56 bytes with hash-table control bytes and load factor ~70 bytes)
//! plus at most two queue slots of 24 bytes, plus the user name's bytes (at most
//! `MAX_USER_LEN`, shared with callers through an `Arc`): under 120 bytes + the user name,
//! so 100,000 entries stay under 12 MB + names.
//!
//! This module does no I/O and does not know what an outcome means; the caller picks TTLs.

use std::collections::{HashMap, VecDeque};

use weir_limiter::MonoTime;

/// A 128-bit digest of the forwarded cookie values (SHA-256, truncated).
pub(crate) type CacheKey = [u8; 16];

/// Extra queue slots tolerated before compaction, so small caches do not compact often.
const COMPACT_SLACK: usize = 64;

#[derive(Debug)]
struct Slot<V> {
    value: V,
    expires: MonoTime,
    generation: u64,
}

/// Outcomes with expiry; at most `max_entries` live at once.
#[derive(Debug)]
pub(crate) struct OutcomeCache<V> {
    map: HashMap<CacheKey, Slot<V>>,
    order: VecDeque<(CacheKey, u64)>,
    next_generation: u64,
    max_entries: usize,
}

impl<V: Clone> OutcomeCache<V> {
    /// `max_entries` of 0 caches nothing.
    pub(crate) fn new(max_entries: usize) -> OutcomeCache<V> {
        OutcomeCache {
            map: HashMap::new(),
            order: VecDeque::new(),
            next_generation: 0,
            max_entries,
        }
    }

    /// The live value for `key`; an expired one is removed and is a miss.
    pub(crate) fn get(&mut self, key: &CacheKey, now: MonoTime) -> Option<V> {
        let slot = self.map.get(key)?;
        if now >= slot.expires {
            self.map.remove(key);
            return None;
        }
        Some(slot.value.clone())
    }

    /// Stores `value` until `expires`, evicting the oldest entries beyond the bound.
    pub(crate) fn insert(&mut self, key: CacheKey, value: V, expires: MonoTime) {
        if self.max_entries == 0 {
            return;
        }
        let generation = self.next_generation;
        self.next_generation += 1;
        self.map.insert(
            key,
            Slot {
                value,
                expires,
                generation,
            },
        );
        self.order.push_back((key, generation));
        while self.map.len() > self.max_entries {
            let Some((old, old_generation)) = self.order.pop_front() else {
                break;
            };
            if self
                .map
                .get(&old)
                .is_some_and(|s| s.generation == old_generation)
            {
                self.map.remove(&old);
            }
        }
        if self.order.len() > 2 * self.max_entries + COMPACT_SLACK {
            let map = &self.map;
            self.order
                .retain(|(k, g)| map.get(k).is_some_and(|s| s.generation == *g));
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    #[cfg(test)]
    pub(crate) fn queue_len(&self) -> usize {
        self.order.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn key(i: u32) -> CacheKey {
        let mut k = [0u8; 16];
        k[..4].copy_from_slice(&i.to_le_bytes());
        k
    }

    const T0: MonoTime = MonoTime::from_nanos(1_000);

    #[test]
    fn expiry_is_a_miss() {
        let mut c = OutcomeCache::new(4);
        c.insert(key(1), "a", T0 + Duration::from_secs(10));
        assert_eq!(c.get(&key(1), T0), Some("a"));
        assert_eq!(c.get(&key(1), T0 + Duration::from_secs(9)), Some("a"));
        assert_eq!(c.get(&key(1), T0 + Duration::from_secs(10)), None);
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn oldest_is_evicted_first() {
        let mut c = OutcomeCache::new(3);
        let later = T0 + Duration::from_secs(60);
        for i in 1..=3 {
            c.insert(key(i), i, later);
        }
        c.insert(key(1), 10, later); // refreshed: now the newest
        c.insert(key(4), 4, later);
        let live: Vec<Option<u32>> = (1..=4).map(|i| c.get(&key(i), T0)).collect();
        assert_eq!(live, [Some(10), None, Some(3), Some(4)]);
    }

    #[test]
    fn never_exceeds_the_bound() {
        for max in [0, 1, 7, 100] {
            let mut c = OutcomeCache::new(max);
            for i in 0..20_000u32 {
                // Mix fresh keys with refreshes of a few hot keys, which leave stale slots.
                let k = if i % 3 == 0 { key(i % 5) } else { key(i) };
                c.insert(k, i, T0 + Duration::from_secs(60));
                assert!(c.len() <= max, "max {max}: {} entries", c.len());
                assert!(c.queue_len() <= 2 * max + COMPACT_SLACK + 1, "max {max}");
            }
        }
    }
}
