//! Token leases: tokens an instance took from Redis ahead of use, so that a
//! key this instance sees often is decided here without a round trip.
//!
//! A lease is charged in Redis when it is granted (the script takes the
//! request's cost and the lease together, [`RedisLimiter::check_all_leasing`](super::redis::RedisLimiter)),
//! so a fleet admits no more than a limit while Redis answers: every token an
//! instance spends was counted for every instance before it was spent. What
//! leases loosen is the other side. Tokens one instance holds are not there
//! for the others, so a key can be refused early, by at most what the other
//! instances hold for it, for at most [`LeaseBook::period`] (then unused
//! tokens are given back). Three bounds keep that small:
//! - a lease is what this instance asked for the key over the last period,
//!   scaled to one period: a key seen once gets none, so a flood of
//!   addresses leaves nothing stranded;
//! - a lease is at most an eighth of the limit's burst ([`BURST_SHARE`]), so
//!   a limit with a burst under 8 never leases and stays exact;
//! - Redis grants leases only out of the half of a bucket furthest from
//!   its limit, at most a quarter of that part each: once a key has used
//!   half its burst, no new lease is granted, and decisions there are one
//!   round trip each, exact, as without leases;
//! - one round trip at a time asks for a key's lease on an instance, and an
//!   instance holds at most a [`BURST_SHARE`]th of the burst per key.
//!
//! So a key is refused early only if it went from under half its burst to
//! its limit within one period, and then by at most what the other
//! instances still hold for it (each at most an eighth of the burst); the
//! refusal's `retry_after` is then longer than needed by at most one
//! period.
//!
//! This module keeps the book (who holds what, and how much was asked); it
//! talks to no Redis. [`super::shared`] asks it before a round trip, and
//! gives back what [`LeaseBook::expired`] hands it.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::gcra::{MonoTime, Quota};
use super::store::RuleFingerprint;

/// How long unused leased tokens stay with an instance by default.
pub const DEFAULT_PERIOD: Duration = Duration::from_millis(250);

/// A lease is at most a limit's burst divided by this.
pub const BURST_SHARE: u32 = 8;

/// How long a lease asked for and never answered keeps others from asking
/// (far above a round trip's timeout, 50 ms by default).
const ASKING_STALE: Duration = Duration::from_secs(1);

/// Keys the book tracks at most; beyond, new keys get no lease (they are
/// decided by a round trip each, as without leases).
const MAX_ENTRIES: usize = 65_536;

const SHARDS: usize = 16;

/// Shortest span a demand is measured over: two requests a microsecond
/// apart say little about a rate.
const MIN_SPAN: Duration = Duration::from_millis(30);

/// One key's lease and recent demand here.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Leased tokens not yet spent.
    left: u32,
    /// When `left` was last topped up.
    granted_at: MonoTime,
    /// Tokens asked for here since `counting_since`.
    demand: u32,
    counting_since: MonoTime,
    last_seen: MonoTime,
    /// Since when a round trip asking for a lease is under way: others do
    /// not ask too (a hundred requests at once would each take a lease,
    /// and strand them all). Stale after [`ASKING_STALE`]: a request whose
    /// future was dropped mid-trip (its client left) never answers.
    asking: Option<MonoTime>,
}

/// What a rule's leases need to be given back: its key label and quota.
#[derive(Debug, Clone)]
pub(crate) struct RuleInfo {
    pub(crate) label: String,
    pub(crate) quota: Quota,
}

/// Unused tokens due back to Redis ([`LeaseBook::expired`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Due {
    pub(crate) rule: RuleFingerprint,
    pub(crate) key: u64,
    pub(crate) tokens: u32,
}

/// One shard's entries, by (rule fingerprint, key).
type Entries = HashMap<(u64, u64), Entry>;

/// The leases of one instance; see the module doc.
#[derive(Debug)]
pub struct LeaseBook {
    period: Duration,
    shards: Box<[Mutex<Entries>]>,
    rules: Mutex<HashMap<RuleFingerprint, RuleInfo>>,
}

impl LeaseBook {
    /// A book whose unused tokens go back after `period`; a zero period
    /// leases nothing.
    pub fn new(period: Duration) -> LeaseBook {
        LeaseBook {
            period,
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            rules: Mutex::default(),
        }
    }

    pub fn period(&self) -> Duration {
        self.period
    }

    fn shard(&self, rule: RuleFingerprint, key: u64) -> std::sync::MutexGuard<'_, Entries> {
        let at = (key ^ rule.0).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60;
        self.shards[at as usize % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts `cost` as asked for here, and spends it from the key's lease
    /// if the lease holds that much: true if it did (the request needs no
    /// round trip for this key).
    pub fn take(&self, rule: RuleFingerprint, key: u64, cost: u32, now: MonoTime) -> bool {
        if self.period.is_zero() {
            return false;
        }
        let mut shard = self.shard(rule, key);
        let room = shard.len() < MAX_ENTRIES / SHARDS;
        let entry = match shard.get_mut(&(rule.0, key)) {
            Some(entry) => entry,
            None if room => shard.entry((rule.0, key)).or_insert(Entry {
                left: 0,
                granted_at: now,
                demand: 0,
                counting_since: now,
                last_seen: now,
                asking: None,
            }),
            None => return false,
        };
        entry.demand = entry.demand.saturating_add(cost);
        entry.last_seen = now;
        if entry.left >= cost {
            entry.left -= cost;
            return true;
        }
        false
    }

    /// Puts back what [`Self::take`] spent for a request another rule
    /// refused.
    pub fn untake(&self, rule: RuleFingerprint, key: u64, cost: u32) {
        if let Some(entry) = self.shard(rule, key).get_mut(&(rule.0, key)) {
            entry.left = entry.left.saturating_add(cost);
        }
    }

    /// Tokens left in the key's lease.
    pub fn left(&self, rule: RuleFingerprint, key: u64) -> u32 {
        self.shard(rule, key)
            .get(&(rule.0, key))
            .map_or(0, |e| e.left)
    }

    /// How many tokens to lease with this round trip: what was asked here
    /// since the last lease, scaled to one period, with what is held at most
    /// a [`BURST_SHARE`]th of the burst. None for a key asked for once, or
    /// while another round trip is asking for this key; a non-zero answer
    /// must be followed by [`Self::granted`].
    pub fn wanted(&self, rule: RuleFingerprint, key: u64, quota: &Quota, now: MonoTime) -> u32 {
        let cap = quota.burst() / BURST_SHARE;
        if self.period.is_zero() || cap == 0 {
            return 0;
        }
        let mut shard = self.shard(rule, key);
        let Some(entry) = shard.get_mut(&(rule.0, key)) else {
            return 0;
        };
        let asked_lately = entry
            .asking
            .is_some_and(|since| now.saturating_duration_since(since) < ASKING_STALE);
        if entry.demand < 2 || asked_lately {
            return 0;
        }
        let span = now
            .saturating_duration_since(entry.counting_since)
            .max(MIN_SPAN);
        let per_period = u128::from(entry.demand) * self.period.as_nanos() / span.as_nanos();
        let wanted = u32::try_from(per_period)
            .unwrap_or(u32::MAX)
            .min(cap.saturating_sub(entry.left));
        entry.asking = (wanted > 0).then_some(now);
        wanted
    }

    /// Records the answer to a round trip that asked for a lease: `tokens`
    /// more leased (0 if Redis granted none, refused, or did not answer),
    /// and the demand counted afresh from `now` after a grant.
    pub fn granted(&self, rule: RuleFingerprint, key: u64, tokens: u32, now: MonoTime) {
        if let Some(entry) = self.shard(rule, key).get_mut(&(rule.0, key)) {
            entry.asking = None;
            if tokens > 0 {
                entry.left = entry.left.saturating_add(tokens);
                entry.granted_at = now;
                entry.demand = 0;
                entry.counting_since = now;
            }
        }
    }

    /// Remembers how to give back a rule's tokens (its label and quota).
    pub(crate) fn note_rule(&self, rule: RuleFingerprint, label: &str, quota: &Quota) {
        let mut rules = self.rules.lock().unwrap_or_else(PoisonError::into_inner);
        rules.entry(rule).or_insert_with(|| RuleInfo {
            label: label.to_owned(),
            quota: *quota,
        });
    }

    pub(crate) fn rule(&self, rule: RuleFingerprint) -> Option<RuleInfo> {
        self.rules
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&rule)
            .cloned()
    }

    /// Takes the tokens of every lease older than a period out of the book,
    /// to be given back, and forgets keys not asked for in four periods.
    pub(crate) fn expired(&self, now: MonoTime) -> Vec<Due> {
        let mut due = Vec::new();
        let forget_after = self.period * 4;
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            shard.retain(|&(rule, key), entry| {
                if entry.left > 0 && now.saturating_duration_since(entry.granted_at) >= self.period
                {
                    due.push(Due {
                        rule: RuleFingerprint(rule),
                        key,
                        tokens: entry.left,
                    });
                    entry.left = 0;
                }
                entry.left > 0 || now.saturating_duration_since(entry.last_seen) < forget_after
            });
        }
        due
    }

    /// Every token held, to give back (at a stop).
    pub(crate) fn all_held(&self) -> Vec<Due> {
        let mut due = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            for (&(rule, key), entry) in shard.iter_mut() {
                if entry.left > 0 {
                    due.push(Due {
                        rule: RuleFingerprint(rule),
                        key,
                        tokens: std::mem::take(&mut entry.left),
                    });
                }
            }
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> MonoTime {
        MonoTime::ZERO + Duration::from_secs(1000) + Duration::from_millis(ms)
    }

    #[test]
    fn a_key_asked_for_once_gets_no_lease() {
        let book = LeaseBook::new(DEFAULT_PERIOD);
        let quota = Quota::new(1000, Duration::from_secs(1), 800).unwrap();
        let rule = RuleFingerprint(1);
        assert!(!book.take(rule, 7, 1, at(0)));
        assert_eq!(book.wanted(rule, 7, &quota, at(0)), 0);
    }

    #[test]
    fn a_lease_is_the_rate_asked_for_over_one_period_capped_by_the_burst() {
        let book = LeaseBook::new(DEFAULT_PERIOD);
        let rule = RuleFingerprint(1);
        let roomy = Quota::new(100_000, Duration::from_secs(1), 80_000).unwrap();
        // 10 asked over 100 ms: 25 a period.
        for i in 0..10 {
            assert!(!book.take(rule, 7, 1, at(i * 10)));
        }
        assert_eq!(book.wanted(rule, 7, &roomy, at(100)), 25);
        book.granted(rule, 7, 0, at(100)); // Redis granted none
        // A burst of 80 caps a lease at 10; a burst under 8 leases nothing.
        let small = Quota::new(100, Duration::from_secs(1), 80).unwrap();
        assert_eq!(book.wanted(rule, 7, &small, at(100)), 10);
        book.granted(rule, 7, 0, at(100));
        let tiny = Quota::new(100, Duration::from_secs(1), 7).unwrap();
        assert_eq!(book.wanted(rule, 7, &tiny, at(100)), 0);
        // Two asked ten seconds apart: no lease.
        assert!(!book.take(rule, 8, 1, at(0)));
        assert!(!book.take(rule, 8, 1, at(10_000)));
        assert_eq!(book.wanted(rule, 8, &roomy, at(10_000)), 0);
    }

    #[test]
    fn leased_tokens_are_spent_then_given_back_after_a_period() {
        let book = LeaseBook::new(DEFAULT_PERIOD);
        let rule = RuleFingerprint(1);
        assert!(!book.take(rule, 7, 1, at(0)));
        assert!(!book.take(rule, 7, 1, at(0)));
        let quota = Quota::new(1000, Duration::from_secs(1), 800).unwrap();
        assert!(book.wanted(rule, 7, &quota, at(0)) > 0);
        // One asks at a time.
        assert_eq!(book.wanted(rule, 7, &quota, at(0)), 0);
        book.granted(rule, 7, 3, at(0));
        assert!(book.take(rule, 7, 1, at(1)));
        assert!(book.take(rule, 7, 1, at(2)));
        book.untake(rule, 7, 1);
        assert_eq!(book.left(rule, 7), 2);
        assert!(book.expired(at(249)).is_empty());
        let due = book.expired(at(250));
        assert_eq!(
            due,
            vec![Due {
                rule,
                key: 7,
                tokens: 2
            }]
        );
        assert_eq!(book.left(rule, 7), 0);
        // Forgotten once not asked for in four periods.
        assert!(book.expired(at(1002)).is_empty());
        assert_eq!(
            book.shards
                .iter()
                .map(|s| s.lock().unwrap().len())
                .sum::<usize>(),
            0
        );
    }

    /// A request that asked for a lease and was dropped mid-trip (its
    /// client left) does not keep the key from leasing for good.
    #[test]
    fn a_lease_asked_for_and_never_answered_goes_stale() {
        let book = LeaseBook::new(DEFAULT_PERIOD);
        let quota = Quota::new(100_000, Duration::from_secs(1), 80_000).unwrap();
        let rule = RuleFingerprint(1);
        for i in 0..10 {
            book.take(rule, 7, 1, at(i));
        }
        assert!(book.wanted(rule, 7, &quota, at(10)) > 0);
        // No `granted`: the asking request is gone.
        assert_eq!(book.wanted(rule, 7, &quota, at(500)), 0);
        assert!(book.wanted(rule, 7, &quota, at(1010)) > 0);
    }

    #[test]
    fn a_zero_period_leases_nothing() {
        let book = LeaseBook::new(Duration::ZERO);
        let quota = Quota::new(1000, Duration::from_secs(1), 800).unwrap();
        let rule = RuleFingerprint(1);
        for i in 0..10 {
            assert!(!book.take(rule, 7, 1, at(i)));
        }
        assert_eq!(book.wanted(rule, 7, &quota, at(10)), 0);
    }
}
