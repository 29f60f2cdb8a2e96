//! Keyed GCRA state in memory: sharded, compact, exactly expiring, hard-capped.
//!
//! A [`ShardedStore`] maps a 64-bit key (already a hash: see [`key`]) to one
//! TAT. Each shard is an open-addressing table of `(key, tat)` pairs, 16 bytes
//! a slot, with linear probing and backward-shift deletion (no tombstones),
//! kept between 53% and 80% full, so a live key costs 20 to 30 bytes including
//! the table's empty slots. Shards are chosen by the key's low bits and guarded
//! by one `Mutex` each, which is cheap with 2-8 threads as long as shards
//! outnumber threads several times over.
//!
//! Expiry is exact: a key whose TAT is not after `now` decides every request
//! exactly as an absent key would (see [`super::gcra`]), so dropping it loses
//! nothing. [`ShardedStore::sweep`] drops them; full shards also sweep.
//!
//! The cap is hard: a shard never holds more than its share of `max_keys`, and
//! its table never grows past the slots that share needs. When a shard is full
//! it first sweeps expired keys (at most once per quarter-cap of inserts, so a
//! spray cannot make every insert scan the table), then evicts, among 8 keys
//! next to the new key's slot, the one with the earliest TAT. That key owes the
//! least: forgetting it lets its owner through at most `(tat - now) / T` early.
//! Keys that are hammered have TATs near `now + τ` and survive a spray of
//! one-request keys, whose TATs sit at `now + T`.
//!
//! Failure mode: a spray of more distinct keys than the cap, each sending a
//! request or two, cycles through the table, so per-key limits *at that level*
//! stop holding for the sprayed keys (fail-open, never unbounded memory). It is
//! loud: [`StoreStats::evicted_live`] counts every live key dropped. It is also
//! confined: each rule has its own store ([`RuleStores`]), so a spray of 10
//! million addresses fills the per-address rule's store only, and the /24,
//! /16 and site-wide rules, which hold few keys, keep all of theirs and keep
//! rejecting.
//!
//! Why not the `governor` crate's keyed limiter: its state store cannot be
//! enumerated into a snapshot and rebased, cannot be moved to Redis behind the
//! same interface, and offers no memory cap at all (a `DashMap` that grows with
//! every distinct key until `retain_recent` is called), let alone a cap per
//! aggregation level. Per key it costs about the same (a 16-byte entry in a
//! hash table, 22-34 bytes a key as measured by `benches/limiter_memory.rs`),
//! so owning the store costs nothing in memory.
//!
//! This module does not decide which keys a request has or which rules apply
//! (policy does), and does not persist anything (see [`super::snapshot`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::gcra::{MonoTime, Outcome, Quota};

/// The identity of a rule across reloads and restarts: a hash of its
/// definition, computed by the caller. Unchanged rules keep their state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleFingerprint(pub u64);

/// Mixes a rule, an aggregation level and a key digest (for example
/// `PrefixKey::digest()`) into one store key.
///
/// For a fixed `(rule_id, level)` this is a bijection of `digest`, so two
/// distinct digests never collide within one rule and level; different rules
/// or levels land on unrelated keys, which matters when several share one key
/// space (a Redis backend).
pub fn key(rule_id: u32, level: u8, digest: u64) -> u64 {
    let tag = ((u64::from(rule_id) << 8) | u64::from(level)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    splitmix64(digest ^ tag)
}

/// The slot a key starts probing at, in a table of `len` slots.
fn home_index(key: u64, len: usize) -> usize {
    ((u128::from(key) * len as u128) >> 64) as usize
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Bytes per slot: a `u64` key and a `u64` TAT.
pub const SLOT_BYTES: usize = 16;

/// Tables grow past this load (4/5); linear probing stays short below it.
const MAX_LOAD_NUM: usize = 4;
const MAX_LOAD_DEN: usize = 5;
/// Growth factor 3/2, so a table is never below 4/5 · 2/3 = 53% full after
/// growing, which keeps a live key under 32 bytes.
const GROW_NUM: usize = 3;
const GROW_DEN: usize = 2;
const MIN_SLOTS: usize = 16;
/// Candidates looked at when evicting a live key.
const EVICTION_SAMPLE: usize = 8;
/// Default shard count: many more than the 2-8 threads that contend.
pub const DEFAULT_SHARDS: usize = 64;

/// Limits of one store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreConfig {
    /// Hard cap on keys held (live or not yet swept).
    pub max_keys: usize,
    /// Number of shards, a power of two.
    pub shards: usize,
}

impl StoreConfig {
    pub fn with_max_keys(max_keys: usize) -> StoreConfig {
        StoreConfig {
            max_keys,
            shards: DEFAULT_SHARDS,
        }
    }

    /// The most keys whose tables fit in `bytes` when full (20 bytes a key at
    /// the cap, where tables are 80% full).
    pub fn with_max_bytes(bytes: usize) -> StoreConfig {
        StoreConfig::with_max_keys(bytes / SLOT_BYTES * MAX_LOAD_NUM / MAX_LOAD_DEN)
    }
}

/// A store configuration that cannot hold state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("shard count {shards} is not a power of two between 1 and 65536")]
    BadShardCount { shards: usize },
    #[error(
        "max_keys {max_keys} is below the shard count {shards}: every shard needs room for a key"
    )]
    CapBelowShards { max_keys: usize, shards: usize },
}

/// Counters a store keeps for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Keys held now.
    pub len: usize,
    /// Expired keys dropped by sweeps or evictions (harmless).
    pub expired_removed: u64,
    /// Keys dropped while their TAT was still ahead: the cap was binding and
    /// some client got a fresh bucket early. Alert when this grows.
    pub evicted_live: u64,
}

/// GCRA state of one rule: a hard-capped, sharded map from key to TAT.
#[derive(Debug)]
pub struct ShardedStore {
    shards: Box<[Shard]>,
    shard_mask: u64,
    max_keys: usize,
}

/// Aligned to a cache line so that two shards' locks never share one.
#[derive(Debug)]
#[repr(align(64))]
struct Shard {
    table: Mutex<Table>,
    /// Where the table's slots are and how many, for [`ShardedStore::prefetch`],
    /// which must not take the lock (it would cost more than the miss it
    /// hides). Updated after checks; a stale pair only makes a prefetch miss.
    slots_at: AtomicUsize,
    slots_len: AtomicUsize,
}

impl Shard {
    fn new(table: Table) -> Shard {
        // Moving the table moves its `Vec` header, not the slots.
        Shard {
            slots_at: AtomicUsize::new(table.slots.as_ptr() as usize),
            slots_len: AtomicUsize::new(table.slots.len()),
            table: Mutex::new(table),
        }
    }

    /// The table, locked. Releasing it publishes where its slots are, so
    /// every path that grows or rebuilds the table keeps the hint true.
    fn lock(&self) -> ShardGuard<'_> {
        ShardGuard {
            shard: self,
            // A panic while holding a shard cannot leave a half-moved slot
            // behind (no code between reads and writes panics), so poison
            // is ignored.
            table: self.table.lock().unwrap_or_else(PoisonError::into_inner),
        }
    }

    /// Records where `table`'s slots are now. They move only when the table
    /// grows or is rebuilt, so this is normally two loads and no store.
    fn publish(&self, table: &Table) {
        let at = table.slots.as_ptr() as usize;
        if self.slots_at.load(Ordering::Relaxed) != at {
            self.slots_at.store(at, Ordering::Relaxed);
        }
        let len = table.slots.len();
        if self.slots_len.load(Ordering::Relaxed) != len {
            self.slots_len.store(len, Ordering::Relaxed);
        }
    }
}

/// A locked shard's table; see [`Shard::lock`].
struct ShardGuard<'a> {
    shard: &'a Shard,
    table: MutexGuard<'a, Table>,
}

impl std::ops::Deref for ShardGuard<'_> {
    type Target = Table;
    fn deref(&self) -> &Table {
        &self.table
    }
}

impl std::ops::DerefMut for ShardGuard<'_> {
    fn deref_mut(&mut self) -> &mut Table {
        &mut self.table
    }
}

impl Drop for ShardGuard<'_> {
    fn drop(&mut self) {
        self.shard.publish(&self.table);
    }
}

impl ShardedStore {
    pub fn new(config: StoreConfig) -> Result<ShardedStore, StoreError> {
        let StoreConfig { max_keys, shards } = config;
        if !shards.is_power_of_two() || shards > 65_536 {
            return Err(StoreError::BadShardCount { shards });
        }
        if max_keys < shards {
            return Err(StoreError::CapBelowShards { max_keys, shards });
        }
        // Remainder keys go to the first shards, so shares sum to max_keys.
        let base = max_keys / shards;
        let extra = max_keys % shards;
        let shards: Box<[Shard]> = (0..shards)
            .map(|i| Shard::new(Table::new(base + usize::from(i < extra))))
            .collect();
        Ok(ShardedStore {
            shard_mask: (shards.len() - 1) as u64,
            shards,
            max_keys,
        })
    }

    fn shard_of(&self, key: u64) -> &Shard {
        // The table's slot index uses the key's high bits; shards use the low.
        &self.shards[(key & self.shard_mask) as usize]
    }

    fn shard(&self, key: u64) -> ShardGuard<'_> {
        self.shard_of(key).lock()
    }

    /// Decides a request of `cost` for `key` under `quota`, updating its TAT.
    pub fn check(&self, key: u64, quota: &Quota, now: MonoTime, cost: u32) -> Outcome {
        self.shard(key).check(key, quota, now, cost)
    }

    /// Starts loading `key`'s slot into the cache, for a check that comes
    /// soon. A caller that knows its next keys ahead (`weir replay` reads
    /// the next record before deciding this one) overlaps the memory
    /// latency of a store far larger than the cache with useful work.
    pub fn prefetch(&self, key: u64) {
        if let Some(at) = self.slot_hint(key) {
            crate::prefetch::prefetch_addr(at);
        }
    }

    /// The address of `key`'s home slot as last published (arithmetic only:
    /// it is never dereferenced, and may be stale while a table grows).
    fn slot_hint(&self, key: u64) -> Option<usize> {
        let shard = self.shard_of(key);
        let len = shard.slots_len.load(Ordering::Relaxed);
        if len == 0 {
            return None;
        }
        let at = shard.slots_at.load(Ordering::Relaxed);
        Some(at.wrapping_add(home_index(key, len) * size_of::<Slot>()))
    }

    /// Gives back a charge of `cost` that [`ShardedStore::check`] allowed at
    /// `now` (another level refused the request). A key left with its TAT
    /// not after `now` carries no information and is removed, so a refused
    /// request leaves the store as it found it.
    pub fn refund(&self, key: u64, quota: &Quota, now: MonoTime, cost: u32) {
        let mut table = self.shard(key);
        if let Some(i) = table.find(key) {
            let tat = table.slots[i].tat.saturating_sub(quota.charge_ns(cost));
            if tat <= now.as_nanos() {
                table.remove_at(i);
            } else {
                table.slots[i].tat = tat;
            }
        }
    }

    /// The TAT held for `key`, if any (it may be in the past until swept).
    pub fn tat(&self, key: u64) -> Option<MonoTime> {
        let table = self.shard(key);
        table
            .find(key)
            .map(|i| MonoTime::from_nanos(table.slots[i].tat))
    }

    /// Puts back a TAT read from a snapshot, keeping the later one if the key
    /// is already held. Returns false (and stores nothing) if `tat` is not
    /// after `now`: such a key carries no information.
    pub fn restore(&self, key: u64, tat: MonoTime, now: MonoTime) -> bool {
        if tat <= now {
            return false;
        }
        let mut table = self.shard(key);
        match table.find(key) {
            Some(i) => {
                let slot = &mut table.slots[i];
                slot.tat = slot.tat.max(tat.as_nanos());
            }
            None => table.insert(key, tat.as_nanos(), now),
        }
        true
    }

    /// Drops every key whose TAT is not after `now`; returns how many.
    /// Run it periodically so idle keys free memory before a shard fills up.
    pub fn sweep(&self, now: MonoTime) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().sweep(now.as_nanos()))
            .sum()
    }

    /// Calls `f` with every key whose TAT is after `now`, one shard at a time
    /// (each shard is locked only while it is walked).
    pub fn for_each_live(&self, now: MonoTime, mut f: impl FnMut(u64, MonoTime)) {
        for shard in self.shards.iter() {
            let table = shard.lock();
            for slot in table.slots.iter().filter(|s| s.tat > now.as_nanos()) {
                f(slot.key, MonoTime::from_nanos(slot.tat));
            }
        }
    }

    /// Keys held, live or expired-but-not-swept. Never above `max_keys`.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// Heap bytes of the tables now (the shard array adds 64 bytes a shard).
    pub fn table_bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().slots.len() * SLOT_BYTES)
            .sum()
    }

    /// The most heap this store can ever hold in steady state: every shard at
    /// its slot limit. While a shard grows or sweeps, its old table is briefly
    /// alive beside the new one (one shard at a time per thread).
    pub fn max_table_bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().max_slots * SLOT_BYTES)
            .sum::<usize>()
            + self.shards.len() * std::mem::size_of::<Shard>()
    }

    pub fn stats(&self) -> StoreStats {
        let mut stats = StoreStats::default();
        for shard in self.shards.iter() {
            let table = shard.lock();
            stats.len += table.len;
            stats.expired_removed += table.expired_removed;
            stats.evicted_live += table.evicted_live;
        }
        stats
    }
}

/// One rule's store, with the fingerprint it was built for.
#[derive(Debug, Clone)]
pub struct RulePartition {
    pub fingerprint: RuleFingerprint,
    pub store: Arc<ShardedStore>,
}

/// The stores of every configured rule, indexed by rule id (the rule's
/// position in the current config). One store per rule is the partition that
/// keeps a spray at one level from evicting another level's keys.
#[derive(Debug, Clone, Default)]
pub struct RuleStores {
    rules: Vec<RulePartition>,
}

impl RuleStores {
    /// Builds stores for `rules` (in rule-id order). A rule whose fingerprint
    /// was in `previous` keeps that store and its state, so a reload forgets
    /// only rules that changed. Include anything that changes a rule's meaning
    /// (quota, level, match) in its fingerprint.
    pub fn build(
        rules: &[(RuleFingerprint, StoreConfig)],
        previous: Option<&RuleStores>,
    ) -> Result<RuleStores, StoreError> {
        let mut built = Vec::with_capacity(rules.len());
        for &(fingerprint, config) in rules {
            let kept = previous
                .and_then(|p| p.by_fingerprint(fingerprint))
                .cloned();
            let store = match kept {
                Some(store) => store,
                None => Arc::new(ShardedStore::new(config)?),
            };
            built.push(RulePartition { fingerprint, store });
        }
        Ok(RuleStores { rules: built })
    }

    pub fn store(&self, rule_id: u32) -> Option<&ShardedStore> {
        self.rules.get(rule_id as usize).map(|p| &*p.store)
    }

    pub fn by_fingerprint(&self, fingerprint: RuleFingerprint) -> Option<&Arc<ShardedStore>> {
        self.rules
            .iter()
            .find(|p| p.fingerprint == fingerprint)
            .map(|p| &p.store)
    }

    pub fn partitions(&self) -> &[RulePartition] {
        &self.rules
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    key: u64,
    /// Nanoseconds on the monotonic clock; 0 marks an empty slot (a stored TAT
    /// is always after some `now >= 0`, so it is never 0).
    tat: u64,
}

/// One shard: linear probing over a slot array of any length (slot index by
/// multiply-shift, so growth need not double).
#[derive(Debug)]
struct Table {
    slots: Vec<Slot>,
    len: usize,
    max_keys: usize,
    max_slots: usize,
    inserts_since_sweep: usize,
    expired_removed: u64,
    evicted_live: u64,
}

impl Table {
    fn new(max_keys: usize) -> Table {
        // At the cap the table is at most 80% full, and always has an empty
        // slot (which ends every probe).
        let max_slots = (max_keys * MAX_LOAD_DEN)
            .div_ceil(MAX_LOAD_NUM)
            .max(max_keys + 1);
        Table {
            slots: Vec::new(),
            len: 0,
            max_keys,
            max_slots,
            inserts_since_sweep: 0,
            expired_removed: 0,
            evicted_live: 0,
        }
    }

    fn home(&self, key: u64) -> usize {
        home_index(key, self.slots.len())
    }

    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() { 0 } else { i + 1 }
    }

    fn find(&self, key: u64) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let mut i = self.home(key);
        loop {
            let slot = self.slots[i];
            if slot.tat == 0 {
                return None;
            }
            if slot.key == key {
                return Some(i);
            }
            i = self.next(i);
        }
    }

    fn check(&mut self, key: u64, quota: &Quota, now: MonoTime, cost: u32) -> Outcome {
        match self.find(key) {
            Some(i) => {
                let mut tat = MonoTime::from_nanos(self.slots[i].tat);
                let outcome = quota.check(&mut tat, now, cost);
                self.slots[i].tat = tat.as_nanos();
                outcome
            }
            None => {
                let mut tat = MonoTime::ZERO;
                let outcome = quota.check(&mut tat, now, cost);
                // Only an admitted request with a cost leaves information.
                if tat > now {
                    self.insert(key, tat.as_nanos(), now);
                }
                outcome
            }
        }
    }

    /// Inserts a key known to be absent, making room first if needed.
    fn insert(&mut self, key: u64, tat: u64, now: MonoTime) {
        debug_assert!(tat > 0);
        if self.len >= self.max_keys {
            self.make_room(key, now.as_nanos());
        }
        if (self.len + 1) * MAX_LOAD_DEN > self.slots.len() * MAX_LOAD_NUM {
            let grown = (self.slots.len() * GROW_NUM / GROW_DEN).max(MIN_SLOTS);
            self.rebuild(grown.min(self.max_slots), 0);
        }
        self.inserts_since_sweep += 1;
        self.place(Slot { key, tat });
    }

    /// Places a slot at the end of its probe run; there is always an empty slot.
    fn place(&mut self, slot: Slot) {
        let mut i = self.home(slot.key);
        while self.slots[i].tat != 0 {
            i = self.next(i);
        }
        self.slots[i] = slot;
        self.len += 1;
    }

    fn make_room(&mut self, new_key: u64, now: u64) {
        // Sweeping scans the shard, so it runs at most once per quarter-cap
        // of inserts; in between, the eviction sample prefers expired keys
        // anyway (their TATs are the earliest).
        if self.inserts_since_sweep >= (self.max_keys / 4).max(1) {
            self.sweep(now);
            self.inserts_since_sweep = 0;
        }
        if self.len < self.max_keys {
            return;
        }
        let mut victim: Option<usize> = None;
        let mut seen = 0;
        let mut i = self.home(new_key);
        for _ in 0..self.slots.len() {
            if self.slots[i].tat != 0 {
                if victim.is_none_or(|v| self.slots[i].tat < self.slots[v].tat) {
                    victim = Some(i);
                }
                seen += 1;
                if seen == EVICTION_SAMPLE {
                    break;
                }
            }
            i = self.next(i);
        }
        if let Some(v) = victim {
            if self.slots[v].tat > now {
                self.evicted_live += 1;
            } else {
                self.expired_removed += 1;
            }
            self.remove_at(v);
        }
    }

    /// Backward-shift deletion: pulls later members of the probe run into the
    /// hole so every key stays reachable from its home without tombstones.
    fn remove_at(&mut self, mut hole: usize) {
        let mut j = self.next(hole);
        while self.slots[j].tat != 0 {
            let home = self.home(self.slots[j].key);
            // The slot at j may move to the hole unless its home lies
            // cyclically in (hole, j].
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
            j = self.next(j);
        }
        self.slots[hole] = Slot::default();
        self.len -= 1;
    }

    /// Drops keys whose TAT is not after `now`, shrinking the table to fit.
    fn sweep(&mut self, now: u64) -> usize {
        let expired = self
            .slots
            .iter()
            .filter(|s| s.tat != 0 && s.tat <= now)
            .count();
        if expired == 0 {
            return 0;
        }
        let live = self.len - expired;
        // Leave room to grow: about 53% full, the load right after a growth.
        let slots = (live * GROW_NUM * MAX_LOAD_DEN)
            .div_ceil(GROW_DEN * MAX_LOAD_NUM)
            .max(MIN_SLOTS)
            .min(self.max_slots);
        self.rebuild(slots, now);
        self.expired_removed += expired as u64;
        expired
    }

    /// Moves every slot with a TAT after `keep_after` into a table of `slots`.
    fn rebuild(&mut self, slots: usize, keep_after: u64) {
        let old = std::mem::replace(&mut self.slots, vec![Slot::default(); slots]);
        self.len = 0;
        for slot in old.into_iter().filter(|s| s.tat != 0 && s.tat > keep_after) {
            self.place(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn at(d: Duration) -> MonoTime {
        MonoTime::ZERO.saturating_add(d)
    }

    fn small(max_keys: usize) -> ShardedStore {
        sharded(max_keys, 4)
    }

    fn sharded(max_keys: usize, shards: usize) -> ShardedStore {
        ShardedStore::new(StoreConfig { max_keys, shards }).unwrap()
    }

    /// One request a minute: every check of a new key is allowed.
    fn per_minute() -> Quota {
        Quota::new(1, Duration::from_secs(60), 1).unwrap()
    }

    #[test]
    fn config_errors_name_the_value() {
        let cases = [
            (
                StoreConfig {
                    max_keys: 100,
                    shards: 3,
                },
                "shard count 3",
            ),
            (
                StoreConfig {
                    max_keys: 100,
                    shards: 0,
                },
                "shard count 0",
            ),
            (
                StoreConfig {
                    max_keys: 2,
                    shards: 4,
                },
                "max_keys 2",
            ),
        ];
        for (config, want) in cases {
            let err = ShardedStore::new(config).unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn key_mixer_separates_rules_and_levels() {
        let d = 0x1234_5678_9abc_def0;
        let keys = [key(0, 0, d), key(1, 0, d), key(0, 1, d), key(0, 0, d + 1)];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(key(7, 2, d), key(7, 2, d));
    }

    #[test]
    fn refund_gives_back_exactly_one_charge() {
        let store = small(1000);
        let q = Quota::new(2, Duration::from_secs(10), 2).unwrap();
        let (k, now) = (key(0, 0, 7), at(S));
        // From idle: charged then refunded, the key is gone, as before.
        assert!(store.check(k, &q, now, 1).is_allowed());
        store.refund(k, &q, now, 1);
        assert_eq!((store.tat(k), store.len()), (None, 0));
        assert!(store.check(k, &q, now, 1).is_allowed());
        // From busy: the refund restores the TAT the charge moved.
        let before = store.tat(k).unwrap();
        assert!(store.check(k, &q, now, 1).is_allowed());
        assert!(!store.check(k, &q, now, 1).is_allowed());
        store.refund(k, &q, now, 1);
        assert_eq!(store.tat(k), Some(before));
        assert!(store.check(k, &q, now, 1).is_allowed());
        // Refunding an absent key does nothing.
        store.refund(key(0, 0, 9), &q, now, 1);
        assert_eq!((store.tat(key(0, 0, 9)), store.len()), (None, 1));
    }

    #[test]
    fn removal_keeps_every_other_key_reachable() {
        // Long probe runs that wrap around: 600 keys in one shard's ~750
        // slots, removed in a scrambled order, each removal checked against
        // every key still held.
        let store = sharded(600, 1);
        let q = per_minute();
        let now = at(S);
        let keys: Vec<u64> = (0..600u64).map(|i| key(0, 0, i)).collect();
        for &k in &keys {
            assert!(store.check(k, &q, now, 1).is_allowed());
        }
        let mut held: Vec<u64> = keys.clone();
        let mut x = 0x9e37_79b9_u64;
        while !held.is_empty() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let gone = held.swap_remove((x % held.len() as u64) as usize);
            store.refund(gone, &q, now, 1);
            assert_eq!(store.tat(gone), None);
            if held.len().is_multiple_of(50) {
                for &k in &held {
                    assert!(store.tat(k).is_some(), "key {k:x} lost");
                }
            }
        }
        assert_eq!(store.len(), 0);
    }

    #[test]
    fn prefetch_hint_follows_the_table_as_it_grows() {
        let store = small(100_000);
        let q = per_minute();
        let probe = key(9, 9, 9);
        let actual = |store: &ShardedStore| {
            let shard = &store.shards[(probe & store.shard_mask) as usize];
            let table = shard.table.lock().unwrap();
            std::ptr::from_ref(&table.slots[table.home(probe)]) as usize
        };
        // Tables start empty; the first check allocates.
        assert_eq!(store.slot_hint(probe), None);
        for i in 0..4u64 {
            assert!(store.check(key(0, 0, i), &q, at(S), 1).is_allowed());
        }
        assert_eq!(store.slot_hint(probe), Some(actual(&store)));
        let before = actual(&store);
        for i in 4..50_000u64 {
            assert!(store.check(key(0, 0, i), &q, at(S), 1).is_allowed());
        }
        assert_ne!(actual(&store), before, "the tables grew");
        assert_eq!(store.slot_hint(probe), Some(actual(&store)));
        store.prefetch(probe);
        assert_eq!(store.tat(probe), None, "a prefetch changes nothing");
    }

    #[test]
    fn check_keeps_state_per_key() {
        let store = small(1000);
        let q = Quota::new(10, S, 2).unwrap();
        let now = at(10 * S);
        for k in 1..=100u64 {
            assert!(store.check(k, &q, now, 1).is_allowed());
            assert!(store.check(k, &q, now, 1).is_allowed());
            assert!(!store.check(k, &q, now, 1).is_allowed(), "key {k}");
        }
        assert_eq!(store.len(), 100);
        // Rejections and zero-cost reads of unknown keys store nothing.
        assert!(store.check(5000, &q, now, 0).is_allowed());
        assert_eq!(store.len(), 100);
    }

    #[test]
    fn sweep_drops_exactly_the_expired_keys() {
        let store = small(1000);
        let slow = Quota::new(1, 10 * S, 1).unwrap(); // τ = 10 s
        let fast = Quota::new(1, S, 1).unwrap(); // τ = 1 s
        let now = at(100 * S);
        for k in 0..200u64 {
            let q = if k % 2 == 0 { &slow } else { &fast };
            store.check(k, q, now, 1);
        }
        let just_before = now + (S - Duration::from_nanos(1));
        assert_eq!(store.sweep(just_before), 0, "no TAT has passed yet");
        // At now + 1 s the fast keys' TATs are reached: they expire.
        assert_eq!(store.sweep(at(101 * S)), 100);
        assert_eq!(store.len(), 100);
        for k in 0..200u64 {
            assert_eq!(store.tat(k).is_some(), k % 2 == 0, "key {k}");
        }
        // A swept key behaves as before it was swept: a full bucket.
        assert!(store.check(1, &fast, at(101 * S), 1).is_allowed());
        assert_eq!(store.sweep(at(111 * S)), 101);
        assert!(store.is_empty());
        assert_eq!(store.stats().expired_removed, 201);
    }

    #[test]
    fn deletion_keeps_every_other_key_reachable() {
        // Many removals through evictions and sweeps, then every survivor is found.
        let store = small(64);
        let q = Quota::new(1, 1000 * S, 1).unwrap();
        for k in 1..=5000u64 {
            let now = at(S + Duration::from_millis(k));
            store.check(k.wrapping_mul(0x9E37_79B9_7F4A_7C15), &q, now, 1);
        }
        let mut live = Vec::new();
        store.for_each_live(at(S), |k, _| live.push(k));
        assert_eq!(live.len(), store.len());
        for k in live {
            assert!(store.tat(k).is_some());
        }
        assert!(store.len() <= 64);
    }

    #[test]
    fn full_store_evicts_expired_before_live() {
        let store = small(8); // 2 keys per shard
        let q = Quota::new(1, 10 * S, 1).unwrap();
        let mut keys_in_shard0 = (1..).map(|i: u64| i << 2).map(|k| k | (k << 40));
        let (a, b, c) = (
            keys_in_shard0.next().unwrap(),
            keys_in_shard0.next().unwrap(),
            keys_in_shard0.next().unwrap(),
        );
        store.check(a, &q, at(S), 1); // expires at 11 s
        store.check(b, &q, at(5 * S), 1); // expires at 15 s
        store.check(c, &q, at(12 * S), 1); // shard full: a is expired
        assert_eq!(store.tat(a), None);
        assert!(store.tat(b).is_some() && store.tat(c).is_some());
        let stats = store.stats();
        assert_eq!((stats.evicted_live, stats.expired_removed), (0, 1));
        // Now only live keys: the one owing least (b) goes.
        let d = keys_in_shard0.next().unwrap();
        store.check(d, &q, at(13 * S), 1);
        assert_eq!(store.tat(b), None);
        assert!(store.tat(c).is_some() && store.tat(d).is_some());
        assert_eq!(store.stats().evicted_live, 1);
    }

    #[test]
    fn spray_stays_under_cap_and_hammered_keys_keep_rejecting() {
        // 1 million distinct addresses through a 20,000-key per-address store,
        // while a few keys send steadily above their rate.
        let cap = 20_000;
        let store = ShardedStore::new(StoreConfig::with_max_keys(cap)).unwrap();
        let q = Quota::new(10, 600 * S, 10).unwrap(); // T = 60 s, τ = 600 s
        let heavy: Vec<u64> = (0..4u64).map(|i| key(0, 0, i)).collect();
        let mut heavy_rejected = 0;
        for i in 0..1_000_000u64 {
            let now = at(1000 * S + Duration::from_micros(i * 300)); // 5 minutes
            store.check(key(0, 0, 1_000_000 + i), &q, now, 1);
            if i % 100 == 0 {
                for &h in &heavy {
                    heavy_rejected += usize::from(!store.check(h, &q, now, 1).is_allowed());
                }
            }
            if i % 65_536 == 0 {
                assert!(store.len() <= cap);
            }
        }
        assert!(store.len() <= cap, "{} > {cap}", store.len());
        assert!(store.table_bytes() <= store.max_table_bytes());
        // 40,000 heavy checks, about 4 x 15 allowed (burst + 5 min of rate).
        assert!(
            heavy_rejected > 39_900,
            "heavy keys evicted: {heavy_rejected}"
        );
        for &h in &heavy {
            assert!(store.tat(h).is_some());
        }
        assert!(store.stats().evicted_live > 900_000);
    }

    #[test]
    fn per_rule_partitions_keep_aggregates_under_an_address_spray() {
        let fp = |n| RuleFingerprint(n);
        let rules = RuleStores::build(
            &[
                (fp(10), StoreConfig::with_max_keys(10_000)), // per address
                (fp(24), StoreConfig::with_max_keys(8_192)),  // per /24
                (fp(16), StoreConfig::with_max_keys(256)),    // per /16
                (fp(0), StoreConfig::with_max_keys(64)),      // site-wide
            ],
            None,
        )
        .unwrap();
        let addr_q = Quota::new(100, 600 * S, 100).unwrap();
        let net_q = Quota::new(300, 600 * S, 300).unwrap();
        let site_q = Quota::new(600, 600 * S, 600).unwrap();
        let mut site_rejected = 0;
        let mut net_rejected = 0;
        // 1 million addresses from 10.0.0.0 up: 16 /16s and 3,907 /24s, in 1 s.
        for i in 0..1_000_000u32 {
            let now = at(1000 * S + Duration::from_micros(u64::from(i)));
            let ip = 0x0a00_0000 + i;
            let checks = [
                (0, u64::from(ip)),
                (1, u64::from(ip >> 8)),
                (2, u64::from(ip >> 16)),
                (3, 0),
            ];
            for (rule_id, digest) in checks {
                let store = rules.store(rule_id).unwrap();
                let q = match rule_id {
                    0 => &addr_q,
                    3 => &site_q,
                    _ => &net_q,
                };
                let allowed = store.check(key(rule_id, 0, digest), q, now, 1).is_allowed();
                site_rejected += usize::from(rule_id == 3 && !allowed);
                net_rejected += usize::from(rule_id == 2 && !allowed);
            }
        }
        let addr = rules.store(0).unwrap();
        assert!(addr.len() <= 10_000);
        assert!(addr.stats().evicted_live > 0, "the address store was full");
        for rule_id in 1..=3 {
            let stats = rules.store(rule_id).unwrap().stats();
            assert_eq!(stats.evicted_live, 0, "rule {rule_id} lost keys");
        }
        assert_eq!(rules.store(1).unwrap().len(), 3_907);
        assert_eq!(rules.store(2).unwrap().len(), 16);
        assert_eq!(rules.store(3).unwrap().len(), 1);
        // Site-wide admits 600 + 1 s of rate; each /16 300 + 1 s of rate.
        assert!(site_rejected >= 1_000_000 - 602, "{site_rejected}");
        assert!(net_rejected >= 1_000_000 - 16 * 301, "{net_rejected}");
    }

    #[test]
    fn rebuild_keeps_state_of_unchanged_rules_only() {
        let q = Quota::new(1, S, 1).unwrap();
        let cfg = StoreConfig::with_max_keys(1000);
        let first = RuleStores::build(
            &[(RuleFingerprint(1), cfg), (RuleFingerprint(2), cfg)],
            None,
        )
        .unwrap();
        for rule_id in 0..2 {
            first.store(rule_id).unwrap().check(42, &q, at(S), 1);
        }
        let second = RuleStores::build(
            &[(RuleFingerprint(3), cfg), (RuleFingerprint(1), cfg)],
            Some(&first),
        )
        .unwrap();
        assert!(second.store(0).unwrap().is_empty(), "new rule starts empty");
        assert_eq!(second.store(1).unwrap().len(), 1, "rule 1 kept its state");
        assert!(second.store(2).is_none());
    }

    #[test]
    fn memory_stays_between_20_and_32_bytes_per_key() {
        let store = ShardedStore::new(StoreConfig::with_max_keys(1_000_000)).unwrap();
        let q = Quota::new(1, S, 1).unwrap();
        for i in 0..200_000u64 {
            store.check(splitmix64(i), &q, at(S), 1);
            if i > 10_000 && i % 997 == 0 {
                let per_key = store.table_bytes() as f64 / store.len() as f64;
                assert!(
                    (19.9..32.0).contains(&per_key),
                    "{per_key} bytes/key at {i}"
                );
            }
        }
    }

    #[test]
    fn restore_keeps_the_later_tat_and_skips_the_past() {
        let store = small(100);
        let now = at(10 * S);
        assert!(!store.restore(1, now, now));
        assert!(store.restore(1, at(20 * S), now));
        assert!(store.restore(1, at(15 * S), now));
        assert_eq!(store.tat(1), Some(at(20 * S)));
        assert_eq!(store.len(), 1);
    }
}
