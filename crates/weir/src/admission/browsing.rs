//! Browsing evidence: which client addresses browse like people, so that
//! admission's fair share can give each of them a turn of its own instead of
//! one turn for their whole network.
//!
//! A person on a site reads pages: most of their requests are cheap pages,
//! a few are expensive (a search, a diff, a history). A crawler after the
//! expensive pages mostly asks for those (the 2026-09-23 crawlers: 80% of
//! their requests). [`BrowsingEvidence`] keeps, per client address, a
//! decaying count of its cheap and its expensive requests (half-life
//! [`HALF_LIFE`]) and calls the address *browsing* once it has made at least
//! [`MIN_PAGES`] cheap requests and at least [`PAGES_PER_EXPENSIVE`] for
//! each expensive one. Admission then shares by that address alone
//! ([`crate::admission::FairKey::of_browser`]), as it does by pass for a
//! pass holder: 100 people behind one carrier /16 are 100 turns, not one,
//! with no challenge configured (weir's defaults have none).
//!
//! Evidence, not proof: a crawler can browse too, at the price of three
//! cheap pages for every expensive one from every address, which is what
//! browsing costs a person. Its reward is a person's turn, no more.
//!
//! One table for the process (`Runtime::browsing`): how an address browses
//! is the client's, whichever pool its pages come from. Bounded: a fixed
//! table of [`SLOTS`] entries, direct-mapped by a seeded hash of the
//! address. An address that lands on another's slot takes it
//! over; the table forgets, it never grows, and an address forgotten only
//! shares by its network again until it has browsed anew.
//!
//! This module refuses nothing and queues nothing; what is cheap is the
//! caller's call (a request whose lane is above `anonymous`: a learned cheap
//! shape, or a class configured into a better lane).

use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::identity::{ClientAddr, Level};

/// How fast old requests stop counting: a request a minute ago counts half.
pub const HALF_LIFE: Duration = Duration::from_secs(60);
/// Cheap requests (decayed) an address must have made to be browsing.
pub const MIN_PAGES: f32 = 3.0;
/// Cheap requests a browsing address makes for each expensive one (people on
/// the 2026-09-23 wiki: about 6; its crawlers: 0.25).
pub const PAGES_PER_EXPENSIVE: f32 = 3.0;
/// Addresses remembered: 64 shards of 1,024 (24 bytes each, 1.5 MiB).
pub const SLOTS: usize = SHARDS * PER_SHARD;
const SHARDS: usize = 64;
const PER_SHARD: usize = 1024;

/// One address's decayed counts, as of `at` (milliseconds since the table's
/// start). `tag` is the address's hash; 0 marks an empty slot.
#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    tag: u64,
    at_ms: u64,
    cheap: f32,
    expensive: f32,
}

/// Per client address, how its requests split between cheap pages and
/// expensive ones, and whether that is how people browse.
#[derive(Debug)]
pub struct BrowsingEvidence {
    shards: Box<[Mutex<Box<[Entry]>>]>,
    hashing: foldhash::fast::RandomState,
    start: Instant,
}

impl Default for BrowsingEvidence {
    fn default() -> Self {
        BrowsingEvidence::new()
    }
}

impl BrowsingEvidence {
    pub fn new() -> BrowsingEvidence {
        BrowsingEvidence {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(vec![Entry::default(); PER_SHARD].into_boxed_slice()))
                .collect(),
            hashing: foldhash::fast::RandomState::default(),
            start: Instant::now(),
        }
    }

    /// Counts one request from `client`, cheap or not, at `now`, and says
    /// whether the address browses like a person (this request counted).
    pub fn record(&self, client: ClientAddr, cheap: bool, now: Instant) -> bool {
        // Never 0: that marks an empty slot.
        let tag = self.hashing.hash_one(client.key(Level::Address)) | 1;
        // Apart bits of a seeded hash for the shard and the slot in it.
        let shard = (tag >> 40) as usize % SHARDS;
        let slot = (tag >> 8) as usize % PER_SHARD;
        let at_ms = now.saturating_duration_since(self.start).as_millis() as u64;
        let mut entries = self.shards[shard]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let e = &mut entries[slot];
        if e.tag == tag {
            let decay = decay_since(e.at_ms, at_ms);
            e.cheap *= decay;
            e.expensive *= decay;
        } else {
            *e = Entry {
                tag,
                ..Entry::default()
            };
        }
        e.at_ms = at_ms;
        if cheap {
            e.cheap += 1.0;
        } else {
            e.expensive += 1.0;
        }
        e.cheap >= MIN_PAGES && e.cheap >= PAGES_PER_EXPENSIVE * e.expensive
    }
}

/// The factor counts shrink by from `then_ms` to `now_ms`.
fn decay_since(then_ms: u64, now_ms: u64) -> f32 {
    let elapsed = now_ms.saturating_sub(then_ms) as f32 / 1000.0;
    (-elapsed * std::f32::consts::LN_2 / HALF_LIFE.as_secs_f32()).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> ClientAddr {
        ClientAddr::new(s.parse().unwrap())
    }

    /// Sends `pages` cheap then `searches` expensive requests from `a`, one
    /// a second from `now`; returns the last judgement.
    fn visit(
        b: &BrowsingEvidence,
        a: ClientAddr,
        pages: u32,
        searches: u32,
        now: &mut Instant,
    ) -> bool {
        let mut last = false;
        for i in 0..pages + searches {
            *now += Duration::from_secs(1);
            last = b.record(a, i < pages, *now);
        }
        last
    }

    #[test]
    fn a_reader_browses_and_a_crawler_does_not() {
        let b = BrowsingEvidence::new();
        let mut now = Instant::now();
        let person = addr("198.51.100.7");
        let crawler = addr("203.0.113.9");
        assert!(
            !b.record(person, false, now),
            "a first request proves nothing"
        );
        assert!(
            visit(&b, person, 12, 2, &mut now),
            "12 pages, then 2 searches"
        );
        // The crawlers' mix: one page for four diffs.
        for _ in 0..10 {
            assert!(!visit(&b, crawler, 1, 4, &mut now));
        }
    }

    #[test]
    fn too_many_expensive_requests_end_the_evidence() {
        let b = BrowsingEvidence::new();
        let mut now = Instant::now();
        let a = addr("2001:db8::1");
        assert!(visit(&b, a, 9, 0, &mut now));
        assert!(visit(&b, a, 0, 2, &mut now), "9 pages carry 2 searches");
        assert!(!visit(&b, a, 0, 2, &mut now), "not 4");
    }

    #[test]
    fn evidence_fades() {
        let b = BrowsingEvidence::new();
        let mut now = Instant::now();
        let a = addr("192.0.2.1");
        assert!(visit(&b, a, 4, 0, &mut now));
        now += HALF_LIFE * 2;
        assert!(
            !b.record(a, true, now),
            "4 pages two half-lives ago count as 1, and this one"
        );
    }

    #[test]
    fn addresses_are_counted_apart() {
        let b = BrowsingEvidence::new();
        let mut now = Instant::now();
        assert!(visit(&b, addr("192.0.2.1"), 5, 0, &mut now));
        assert!(!b.record(addr("192.0.2.2"), false, now));
        assert!(b.record(addr("192.0.2.1"), true, now));
    }
}
