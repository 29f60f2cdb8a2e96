//! Concurrency limits per key: how many requests of one key are in flight.
//!
//! [`InflightTable::try_acquire`] returns an [`InflightGuard`] whose `Drop`
//! gives the slot back, so a request that errors, times out or is cancelled
//! (its future dropped) can never leak a slot. A key is stored only while it
//! has a request in flight (12 bytes of key and count, in a map that shrinks
//! after a spike), so the table holds at most as many keys as there are
//! concurrent requests, which the edge already caps: it needs no eviction.
//!
//! Example: at most 4 expensive requests in flight per /24.
//!
//! This module does not queue or wait (admission does): a full key is
//! refused at once with how many are in flight.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// A key already at its limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("key {key:#018x} has {in_flight} requests in flight, at its limit of {limit}")]
pub struct InflightFull {
    pub key: u64,
    pub in_flight: u32,
    pub limit: u32,
}

/// Keys are store keys (see [`super::store::key`]), already well mixed, so
/// hashing them again would only cost time.
#[derive(Debug, Default, Clone, Copy)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed; fold anything else in rather than panic.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type Counts = HashMap<u64, u32, BuildHasherDefault<PassThrough>>;

const SHARDS: usize = 16;

/// In-flight counts per key, sharded like the rate store.
#[derive(Debug)]
pub struct InflightTable {
    shards: Box<[Mutex<Counts>]>,
}

impl Default for InflightTable {
    fn default() -> Self {
        InflightTable {
            shards: (0..SHARDS).map(|_| Mutex::new(Counts::default())).collect(),
        }
    }
}

impl InflightTable {
    pub fn new() -> Arc<InflightTable> {
        Arc::new(InflightTable::default())
    }

    fn shard(&self, key: u64) -> MutexGuard<'_, Counts> {
        // Poison is ignored: a count is updated in one step, never half-done.
        self.shards[(key as usize) % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes one of `limit` slots of `key`, or says how full it is.
    pub fn try_acquire(
        self: &Arc<Self>,
        key: u64,
        limit: u32,
    ) -> Result<InflightGuard, InflightFull> {
        let mut counts = self.shard(key);
        let in_flight = counts.get(&key).copied().unwrap_or(0);
        if in_flight >= limit {
            return Err(InflightFull {
                key,
                in_flight,
                limit,
            });
        }
        counts.insert(key, in_flight + 1);
        Ok(InflightGuard {
            table: Arc::clone(self),
            key,
        })
    }

    /// Requests of `key` in flight now.
    pub fn in_flight(&self, key: u64) -> u32 {
        self.shard(key).get(&key).copied().unwrap_or(0)
    }

    /// Keys with at least one request in flight.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn release(&self, key: u64) {
        let mut counts = self.shard(key);
        match counts.get_mut(&key) {
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => {
                counts.remove(&key);
                // Give memory back after a spike, with slack so a steady
                // load near a boundary does not shrink and regrow each time.
                if counts.capacity() > 64 && counts.len() * 8 < counts.capacity() {
                    let len = counts.len();
                    counts.shrink_to(len * 2);
                }
            }
            // Unreachable while guards are the only way to release.
            None => {}
        }
    }
}

/// One in-flight request of a key; dropping it frees the slot.
#[derive(Debug)]
pub struct InflightGuard {
    table: Arc<InflightTable>,
    key: u64,
}

impl InflightGuard {
    pub fn key(&self) -> u64 {
        self.key
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.table.release(self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_limit_in_flight_and_drop_frees() {
        let table = InflightTable::new();
        let per_24 = 0xabcd;
        let mut guards: Vec<_> = (0..4)
            .map(|_| table.try_acquire(per_24, 4).unwrap())
            .collect();
        assert_eq!(table.in_flight(per_24), 4);
        let err = table.try_acquire(per_24, 4).unwrap_err();
        assert_eq!(
            err,
            InflightFull {
                key: per_24,
                in_flight: 4,
                limit: 4
            }
        );
        assert!(err.to_string().contains("0x000000000000abcd"), "{err}");
        // Another key is independent.
        let other = table.try_acquire(1, 4).unwrap();
        drop(guards.pop());
        assert_eq!(table.in_flight(per_24), 3);
        assert!(
            table.try_acquire(per_24, 4).is_ok(),
            "the freed slot is usable"
        );
        drop(other);
        assert_eq!(table.in_flight(1), 0);
    }

    #[test]
    fn keys_are_removed_at_zero_and_memory_returns() {
        let table = InflightTable::new();
        let guards: Vec<_> = (0..10_000u64)
            .map(|k| table.try_acquire(k, 1).unwrap())
            .collect();
        assert_eq!(table.len(), 10_000);
        drop(guards);
        assert!(table.is_empty());
        let capacity: usize = table
            .shards
            .iter()
            .map(|s| s.lock().unwrap().capacity())
            .sum();
        assert!(
            capacity <= SHARDS * 64,
            "capacity {capacity} kept after the spike"
        );
    }

    #[test]
    fn guards_release_across_threads() {
        let table = InflightTable::new();
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let table = Arc::clone(&table);
                s.spawn(move || {
                    for i in 0..10_000u64 {
                        let g = table.try_acquire(i % 7, u32::MAX).unwrap();
                        assert!(table.in_flight(g.key()) >= 1, "thread {t}");
                    }
                });
            }
        });
        assert!(table.is_empty());
    }
}
