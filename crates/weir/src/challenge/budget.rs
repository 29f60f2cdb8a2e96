//! What one network may draw from the challenge: challenge pages (nonces)
//! shown, and passes redeemed, each at a rate no group of people reaches.
//!
//! A network is the binding's: a /24 (IPv4) or /48 (IPv6), the unit a pass
//! is bound to. Past its budget a network is not refused anything: the
//! nonces it is shown and the passes it redeems carry the network's own id
//! ([`network_id`]) instead of a random one. Passes count as clients by
//! their id (`per = "token"` rules; admission's turns sit under the real
//! network anyway), so a client that mints passes in a loop (a crawler
//! following the no-script refresh, or a farm of headless browsers behind
//! one /24) gets one client's budget for all of them, where each pass had
//! been a client of its own. People are never asked to solve twice for it:
//! a pass over the budget is as valid as any.
//!
//! Why so generous: a carrier's NAT puts thousands of phones behind a /24,
//! and each solves once for `pass_ttl` (12 hours). [`PAGES`] and
//! [`PASSES`] leave room for several hundred people a day in one /24 and
//! a burst of them at once; a loop mints one pass a second.
//!
//! It also keeps what one browser (a binding: network and User-Agent)
//! solved lately ([`ChallengeBudget::looping`]): a browser that did the
//! page's work [`LOOP_SOLVES`] times within about [`LOOP_WINDOW`] and comes
//! back without a pass again is in a loop (its pass does not come back: a cookie
//! refused, a fleet whose instances do not share a key, a clock apart), and
//! gets its page on priority instead of another challenge, as the
//! network's one pass id. It has proved it is a browser three times over;
//! one more proof would only keep a person from the page.
//!
//! Owns: the budgets, the ids past them, and the recent solves. Does not: sign anything
//! ([`super::token`], [`super::pow`]) or decide what a pass is worth.

use std::time::Duration;

use weir_limiter::{MonoTime, Quota, ShardedStore, StoreConfig, key};

use super::keyring::Binding;

/// Challenge pages a network is shown with nonces of their own: one a
/// second, 60 at once.
pub const PAGES: (u32, Duration, u32) = (60, Duration::from_secs(60), 60);

/// Passes a network redeems with ids of their own: one every 10 seconds,
/// 30 at once.
pub const PASSES: (u32, Duration, u32) = (6, Duration::from_secs(60), 30);

/// Solves of the page's work by one browser that make a loop...
pub const LOOP_SOLVES: u32 = 3;

/// ... within about this long; once in a loop, a browser is challenged
/// again at most once this long.
pub const LOOP_WINDOW: Duration = Duration::from_secs(60);

/// Networks tracked; past it the oldest are forgotten (their budgets start
/// full again), never more memory (about 20 bytes a network).
const MAX_NETWORKS: usize = 200_000;

/// The per-network budgets of one process, kept across reloads (a reload
/// must not hand every network a fresh budget).
#[derive(Debug)]
pub struct ChallengeBudget {
    store: ShardedStore,
    pages: Quota,
    passes: Quota,
    solves: Quota,
}

impl Default for ChallengeBudget {
    fn default() -> Self {
        let quota = |(count, period, burst)| {
            Quota::new(count, period, burst).expect("the budgets' constants are valid quotas")
        };
        ChallengeBudget {
            store: ShardedStore::new(StoreConfig::with_max_keys(MAX_NETWORKS))
                .expect("a power-of-two shard count below the key cap"),
            pages: quota(PAGES),
            passes: quota(PASSES),
            // One solve forgotten a window: three within about a window
            // leave the key empty for a window after the last.
            solves: quota((1, LOOP_WINDOW, LOOP_SOLVES)),
        }
    }
}

/// What is drawn from a network's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Draw {
    /// A challenge page: the nonce's seed, which becomes its pass's id.
    Page,
    /// A pass redeemed (an answer, or a no-script wait).
    Pass,
}

impl ChallengeBudget {
    /// The id to give what `binding`'s network draws now: `fresh` while the
    /// network is within its budget of `draw`, else the network's own.
    pub fn id(&self, draw: Draw, binding: Binding, fresh: u64, now: MonoTime) -> u64 {
        let (level, quota) = match draw {
            Draw::Page => (0, &self.pages),
            Draw::Pass => (1, &self.passes),
        };
        let network = u64::from_be_bytes(binding.prefix);
        if self
            .store
            .check(key(0, level, network), quota, now, 1)
            .is_allowed()
        {
            fresh
        } else {
            network_id(binding)
        }
    }

    /// Counts a solve of the page's work by `binding`'s browser.
    pub fn solved(&self, binding: Binding, now: MonoTime) {
        self.store.check(browser_key(binding), &self.solves, now, 1);
    }

    /// The id to give `binding`'s browser instead of another challenge, if
    /// it is in a loop: it solved [`LOOP_SOLVES`] times lately.
    pub fn looping(&self, binding: Binding, now: MonoTime) -> Option<u64> {
        let tat = self.store.tat(browser_key(binding))?;
        (self.solves.remaining(tat, now) == 0).then(|| network_id(binding))
    }

    /// Forgets networks whose budgets are full again (the process's sweep).
    pub fn sweep(&self, now: MonoTime) -> usize {
        self.store.sweep(now)
    }
}

/// One browser's key among the networks': its network and User-Agent.
fn browser_key(binding: Binding) -> u64 {
    let browser =
        u64::from_be_bytes(binding.prefix) ^ u64::from_be_bytes(binding.agent).rotate_left(17);
    key(0, 2, browser)
}

/// The id every pass of `binding`'s network gets past its budget: one
/// client, as far as the rules that count passes can tell.
pub fn network_id(binding: Binding) -> u64 {
    // Marked so it never equals the prefix digest a rule may key on.
    u64::from_be_bytes(binding.prefix) ^ 0x6e65_7477_6f72_6b21
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::ClientAddr;

    fn bind(ip: &str) -> Binding {
        Binding::of(ClientAddr::new(ip.parse().unwrap()), b"Mozilla/5.0")
    }

    /// A browser that solved three times within a minute is in a loop for a
    /// minute after the last (then one more challenge lets it in for
    /// another minute); two solves are not a loop, nor three over three
    /// minutes, nor is another browser of the network.
    #[test]
    fn three_solves_in_a_minute_are_a_loop() {
        let budget = ChallengeBudget::default();
        let at = |s: u64| MonoTime::ZERO + Duration::from_secs(1000 + s);
        let person = bind("10.0.0.1");
        let other = Binding::of(ClientAddr::new("10.0.0.2".parse().unwrap()), b"Other/1.0");
        budget.solved(person, at(0));
        budget.solved(person, at(1));
        assert_eq!(budget.looping(person, at(2)), None);
        budget.solved(person, at(2));
        assert_eq!(budget.looping(person, at(3)), Some(network_id(person)));
        assert_eq!(budget.looping(other, at(3)), None);
        assert!(budget.looping(person, at(59)).is_some());
        assert_eq!(budget.looping(person, at(61)), None);
        budget.solved(person, at(61));
        assert!(budget.looping(person, at(119)).is_some());
        // Three solves a minute apart: a person now and then, not a loop.
        let slow = bind("10.9.0.1");
        for minute in 0..3 {
            budget.solved(slow, at(60 * minute));
            assert_eq!(budget.looping(slow, at(60 * minute + 1)), None);
        }
    }

    /// A loop that redeems a pass a second from one /24 gets its own ids for
    /// the burst, then only the network's; another /24 is untouched; the
    /// budget fills again at its rate.
    #[test]
    fn a_network_past_its_budget_gets_one_id() {
        let budget = ChallengeBudget::default();
        let (net, other) = (bind("203.0.113.7"), bind("198.51.100.7"));
        let mut t = MonoTime::ZERO.saturating_add(Duration::from_secs(1));
        let mut ids = std::collections::HashSet::new();
        for fresh in 0..100u64 {
            ids.insert(budget.id(Draw::Pass, net, fresh, t));
            t = t.saturating_add(Duration::from_secs(1));
        }
        // 30 at once and one every 10 s over the 100 s, then the network's.
        assert!((39..=42).contains(&ids.len()), "{} ids", ids.len());
        assert!(ids.contains(&network_id(net)));
        // The same /24, another address, at the loop's last draw: the same
        // network, over budget.
        let last = MonoTime::ZERO.saturating_add(Duration::from_secs(100));
        assert_eq!(
            budget.id(Draw::Pass, bind("203.0.113.99"), 7, last),
            network_id(net)
        );
        assert_eq!(budget.id(Draw::Pass, other, 7, t), 7);
        // Pages are a budget of their own.
        assert_eq!(budget.id(Draw::Page, net, 8, t), 8);
        let later = t.saturating_add(Duration::from_secs(10));
        assert_eq!(budget.id(Draw::Pass, net, 9, later), 9);
    }

    #[test]
    fn people_of_one_network_within_the_budget_keep_their_ids() {
        let budget = ChallengeBudget::default();
        let t = MonoTime::ZERO.saturating_add(Duration::from_secs(1));
        for i in 0..30u64 {
            let b = bind(&format!("203.0.113.{i}"));
            assert_eq!(budget.id(Draw::Pass, b, i, t), i);
        }
    }
}
