//! Priority lanes: which waiting requests are served first and shed last.
//!
//! A [`Lane`] is an index into an ordered, validated list of [`LaneSpec`]s
//! ([`Lanes`]); index 0 is the most important. The standard set ranks by
//! the evidence of a person, not the proof of a browser (crawlers run
//! browsers): `verified` (a checked login) > `visits` (every request of a
//! visit weir counted as a person's: pages read over time) > `newcomers`
//! (cheap pages of clients weir has no evidence of: a visit's first page, a
//! crawler's article fetches) > `pass` (a challenge pass alone: a browser,
//! which a crawler can run) > `bots` (crawlers that proved who they are) >
//! `anonymous` (anonymous expensive requests) > `deferred` (requests over a
//! rule that defers instead of refusing: served only with capacity nobody
//! else wants, shed first), but the count, names, depths, waits and shares
//! are data, so a deployment can add or merge lanes without code changes.
//!
//! A lane may have a guaranteed [`Share`] of slot grants: while it has
//! waiters it gets at least that share even when higher lanes wait too
//! (the queue keeps a deficit per lane), and, like any lane, everything
//! when nobody above waits. Without a share, priority is strict.
//!
//! This module does not choose a request's lane (policy does, from the
//! verified identity and the route class) and does not queue anything
//! ([`crate::admission::queue`] does).

use std::time::Duration;

/// A priority lane. Lower index = higher priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lane(u8);

/// What a request proved, and whether a rule deferred it: all its lane
/// depends on besides its route class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Standing {
    /// A checked login.
    pub verified: bool,
    /// A valid pass token.
    pub pass: bool,
    /// A verified crawler (Web Bot Auth or reverse DNS).
    pub bot: bool,
    /// Over a rule with `when_over = "defer"`.
    pub deferred: bool,
    /// In a visit whose pages say a person is reading
    /// (`crate::visit::RequestVisit::person`).
    pub visit: bool,
}

impl Lane {
    /// Verified sessions, in [`Lanes::standard`].
    pub const VERIFIED: Lane = Lane(0);
    /// Every request of a visit weir counted as a person's, in
    /// [`Lanes::standard`].
    pub const VISITS: Lane = Lane(1);
    /// Cheap pages of clients weir has no evidence of, in
    /// [`Lanes::standard`].
    pub const NEWCOMERS: Lane = Lane(2);
    /// Expensive requests with a challenge pass (and no visit of a
    /// person's), in [`Lanes::standard`].
    pub const PASS: Lane = Lane(3);
    /// Verified crawlers (Web Bot Auth, reverse DNS), in [`Lanes::standard`].
    pub const BOTS: Lane = Lane(4);
    /// Anonymous expensive requests, in [`Lanes::standard`].
    pub const ANONYMOUS: Lane = Lane(5);
    /// Requests over a rule with `when_over = "defer"`, in
    /// [`Lanes::standard`]: the app's spare capacity, nothing more.
    pub const DEFERRED: Lane = Lane(6);

    /// The lane's position, 0 being the most important.
    pub fn index(self) -> usize {
        self.0 as usize
    }

    /// The lane at position `i` of a validated [`Lanes`] (at most
    /// [`MAX_LANES`], so the cast cannot truncate).
    pub(super) fn from_index(i: usize) -> Lane {
        Lane(i.min(MAX_LANES - 1) as u8)
    }

    /// The lane of one request, by the evidence of a person before the
    /// proof of a browser: a request a rule deferred waits in `deferred`
    /// whatever it showed (the rule judged it; only what the rule exempts
    /// escapes it); verified sessions use the top lane; a visit weir counted
    /// as a person's lifts every request of it to at least `visits` (its
    /// logins, edits and searches as its pages); a pass token to at least
    /// `pass`, below strangers' cheap pages (a pass proves a browser, and
    /// crawlers run browsers); a verified crawler to at least `bots`;
    /// everyone else gets the route class's lane. (Indices of
    /// [`Lanes::standard`].)
    pub fn for_request(standing: Standing, class_lane: Lane) -> Lane {
        if standing.deferred {
            Lane::DEFERRED
        } else if standing.verified {
            Lane::VERIFIED
        } else if standing.visit {
            class_lane.min(Lane::VISITS)
        } else if standing.pass {
            class_lane.min(Lane::PASS)
        } else if standing.bot {
            class_lane.min(Lane::BOTS)
        } else {
            class_lane
        }
    }

    /// Whether this lane is served before `other`.
    pub fn outranks(self, other: Lane) -> bool {
        self.0 < other.0
    }
}

/// One lane's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneSpec {
    /// Label in logs and metrics (`lane="anonymous"`): bounded, never a key.
    pub name: String,
    /// Most requests waiting in this lane; 0 = never wait, shed at once.
    pub max_depth: usize,
    /// Default longest wait in the queue (a route class may pass its own
    /// deadline instead).
    pub max_wait: Duration,
    /// The least share of slot grants this lane gets while it has waiters,
    /// even when higher lanes wait ([`Share::ZERO`]: strict priority).
    pub share: Share,
    /// The share is taken only from grants above to unproven requests
    /// (there by weir's guess about their cost) of a network that holds a
    /// backlog there; never from people who proved who they are, nor from
    /// networks that wait a turn at a time: they keep strict priority.
    pub yields_to_proof: bool,
}

/// A fraction of slot grants, 0 to 1, in millionths (so lane settings stay
/// comparable with `Eq`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Share(u32);

impl Share {
    pub const ZERO: Share = Share(0);
    const ONE: u32 = 1_000_000;

    /// `fraction` as a share; `None` outside 0..=1 (or NaN).
    pub fn from_fraction(fraction: f64) -> Option<Share> {
        (0.0..=1.0)
            .contains(&fraction)
            .then(|| Share((fraction * f64::from(Share::ONE)).round() as u32))
    }

    pub fn fraction(self) -> f64 {
        f64::from(self.0) / f64::from(Share::ONE)
    }

    pub fn is_zero(self) -> bool {
        self.0 == 0
    }
}

/// Why a lane list cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LanesError {
    #[error("at least one admission lane is needed")]
    Empty,
    #[error("{0} admission lanes configured; at most {MAX_LANES} are supported")]
    TooMany(usize),
    #[error("admission lane name `{0}` is used twice")]
    Duplicate(String),
    #[error("admission lane name `{0}` is not [a-z0-9_]+")]
    BadName(String),
}

/// The `bots` lane's share in [`Lanes::standard`], in millionths: a tenth
/// of the app while verified crawlers wait (`bots_share = 0.1`).
pub const DEFAULT_BOTS_SHARE: u32 = 100_000;

/// The `newcomers` lane's share in [`Lanes::standard`], in millionths: one
/// grant in twenty while cheap pages of clients weir has no evidence of
/// wait (`newcomers_share = 0.05`). Visits go first (people in the middle
/// of reading finish before new ones start, as session-based admission
/// control has it), but a site full of its regulars still lets new people
/// in.
pub const DEFAULT_NEWCOMERS_SHARE: u32 = 50_000;

/// The `pass` lane's share in [`Lanes::standard`], in millionths: one
/// grant in twenty of those that go to unproven networks with a backlog
/// of their own (`pass_share = 0.05`; the lane yields to proof). A pass
/// alone goes ahead of nothing, but a person who just solved the page
/// waits no longer than before for what it was for: without it a flood of
/// crawlers' cheap pages in `newcomers` held every pass until it ebbed.
pub const DEFAULT_PASS_SHARE: u32 = 50_000;

/// The `anonymous` lane's share in [`Lanes::standard`], in millionths: one
/// grant in twenty while unproven expensive requests wait
/// (`anonymous_share = 0.05`). Without it a flood of cheap requests from a
/// few addresses, each a turn in a higher lane, starved every expensive
/// one (a person's login or upload) for as long as the flood lasted.
pub const DEFAULT_ANONYMOUS_SHARE: u32 = 50_000;

/// Most lanes a pool may have: lanes are for a handful of trust levels, not
/// per-client queues, and metric labels must stay bounded.
pub const MAX_LANES: usize = 8;

/// An ordered, validated list of lanes (most important first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lanes {
    specs: Vec<LaneSpec>,
}

impl Lanes {
    pub fn new(specs: Vec<LaneSpec>) -> Result<Lanes, LanesError> {
        if specs.is_empty() {
            return Err(LanesError::Empty);
        }
        if specs.len() > MAX_LANES {
            return Err(LanesError::TooMany(specs.len()));
        }
        for (i, s) in specs.iter().enumerate() {
            let ok = !s.name.is_empty()
                && s.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !ok {
                return Err(LanesError::BadName(s.name.clone()));
            }
            if specs[..i].iter().any(|o| o.name == s.name) {
                return Err(LanesError::Duplicate(s.name.clone()));
            }
        }
        Ok(Lanes { specs })
    }

    /// `verified` > `visits` > `newcomers` > `pass` > `bots` > `anonymous` >
    /// `deferred`, each waiting up to 10 s. Lower lanes are shallower: they are shed first anyway, and
    /// a deep queue of crawler requests only delays the answer that tells
    /// them to back off. `newcomers` is guaranteed [`DEFAULT_NEWCOMERS_SHARE`]
    /// of grants while it waits; `pass` [`DEFAULT_PASS_SHARE`] of those to
    /// unproven floods; `bots` [`DEFAULT_BOTS_SHARE`] of
    /// grants while it waits: a verified crawler is slowed by people, never
    /// starved; `anonymous` [`DEFAULT_ANONYMOUS_SHARE`], so a flood of cheap
    /// requests does not starve every expensive one. `deferred` holds just enough to keep the app's slots busy
    /// between two arrivals of anyone else.
    pub fn standard() -> Lanes {
        let wait = Duration::from_secs(10);
        Lanes {
            specs: vec![
                LaneSpec {
                    name: "verified".into(),
                    max_depth: 1024,
                    max_wait: wait,
                    share: Share::ZERO,
                    yields_to_proof: false,
                },
                LaneSpec {
                    name: "visits".into(),
                    max_depth: 1024,
                    max_wait: wait,
                    share: Share::ZERO,
                    yields_to_proof: false,
                },
                LaneSpec {
                    name: "newcomers".into(),
                    max_depth: 1024,
                    max_wait: wait,
                    share: Share(DEFAULT_NEWCOMERS_SHARE),
                    yields_to_proof: false,
                },
                LaneSpec {
                    name: "pass".into(),
                    max_depth: 1024,
                    max_wait: wait,
                    share: Share(DEFAULT_PASS_SHARE),
                    yields_to_proof: true,
                },
                LaneSpec {
                    name: "bots".into(),
                    max_depth: 256,
                    max_wait: wait,
                    share: Share(DEFAULT_BOTS_SHARE),
                    yields_to_proof: false,
                },
                LaneSpec {
                    name: "anonymous".into(),
                    max_depth: 512,
                    max_wait: wait,
                    share: Share(DEFAULT_ANONYMOUS_SHARE),
                    yields_to_proof: true,
                },
                LaneSpec {
                    name: "deferred".into(),
                    max_depth: 256,
                    max_wait: wait,
                    share: Share::ZERO,
                    yields_to_proof: false,
                },
            ],
        }
    }

    pub fn len(&self) -> usize {
        self.specs.len()
    }

    /// Always false: a `Lanes` has at least one lane.
    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    /// The lane at `index`, if configured.
    pub fn lane(&self, index: usize) -> Option<Lane> {
        (index < self.specs.len()).then_some(Lane(index as u8))
    }

    /// The lane called `name`.
    pub fn by_name(&self, name: &str) -> Option<Lane> {
        self.specs
            .iter()
            .position(|s| s.name == name)
            .map(|i| Lane(i as u8))
    }

    /// The least important lane.
    pub fn lowest(&self) -> Lane {
        Lane((self.specs.len() - 1) as u8)
    }

    /// A lane from another configuration mapped into this one: past the end
    /// means the lowest lane, so a stale lane never panics or gains priority.
    pub fn clamp(&self, lane: Lane) -> Lane {
        if lane.index() < self.specs.len() {
            lane
        } else {
            self.lowest()
        }
    }

    pub fn spec(&self, lane: Lane) -> &LaneSpec {
        &self.specs[self.clamp(lane).index()]
    }

    pub fn iter(&self) -> impl Iterator<Item = (Lane, &LaneSpec)> {
        self.specs
            .iter()
            .enumerate()
            .map(|(i, s)| (Lane(i as u8), s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str) -> LaneSpec {
        LaneSpec {
            name: name.into(),
            max_depth: 1,
            max_wait: Duration::from_secs(1),
            share: Share::ZERO,
            yields_to_proof: false,
        }
    }

    #[test]
    fn validation() {
        let cases: [(Vec<&str>, Option<LanesError>); 5] = [
            (vec!["a", "b"], None),
            (vec![], Some(LanesError::Empty)),
            (vec!["a", "a"], Some(LanesError::Duplicate("a".into()))),
            (
                vec!["Bad Name"],
                Some(LanesError::BadName("Bad Name".into())),
            ),
            (vec!["x"; 9], Some(LanesError::TooMany(9))),
        ];
        for (names, want) in cases {
            let got = Lanes::new(names.iter().map(|n| spec(n)).collect()).err();
            assert_eq!(got, want, "{names:?}");
        }
    }

    #[test]
    fn standard_order_and_lookup() {
        let lanes = Lanes::standard();
        assert_eq!(lanes.by_name("verified"), Some(Lane::VERIFIED));
        assert_eq!(lanes.by_name("bots"), Some(Lane::BOTS));
        assert_eq!(lanes.by_name("anonymous"), Some(Lane::ANONYMOUS));
        assert_eq!(lanes.by_name("deferred"), Some(Lane::DEFERRED));
        assert_eq!(lanes.lowest(), Lane::DEFERRED);
        assert!(Lane::VISITS.outranks(Lane::NEWCOMERS) && Lane::NEWCOMERS.outranks(Lane::PASS));
        assert!(Lane::PASS.outranks(Lane::BOTS) && Lane::BOTS.outranks(Lane::ANONYMOUS));
        assert_eq!(lanes.by_name("newcomers"), Some(Lane::NEWCOMERS));
        assert_eq!(lanes.by_name("visits"), Some(Lane::VISITS));
        assert_eq!(lanes.by_name("pass"), Some(Lane::PASS));
        assert_eq!(lanes.spec(Lane::NEWCOMERS).share.fraction(), 0.05);
        assert_eq!(lanes.spec(Lane::PASS).share.fraction(), 0.05);
        assert!(lanes.spec(Lane::PASS).yields_to_proof);
        assert_eq!(lanes.spec(Lane::BOTS).share.fraction(), 0.1);
        assert_eq!(lanes.spec(Lane::ANONYMOUS).share.fraction(), 0.05);
        assert!(lanes.spec(Lane::DEFERRED).share.is_zero());
        assert!(Lane::VERIFIED.outranks(Lane::PASS));
        assert!(!Lane::ANONYMOUS.outranks(Lane::PASS));
        assert!(Lane::ANONYMOUS.outranks(Lane::DEFERRED));
    }

    #[test]
    fn lane_of_a_request() {
        use Lane as L;
        #[rustfmt::skip]
        let cases = [
            // verified, pass, bot, deferred by a rule, visit, class lane, want
            (true,  false, false, false, false, L::ANONYMOUS, L::VERIFIED),
            (true,  true,  false, false, false, L::PASS,      L::VERIFIED),
            (true,  false, true,  false, false, L::ANONYMOUS, L::VERIFIED),
            (false, true,  false, false, false, L::ANONYMOUS, L::PASS),
            // A pass alone lifts no cheap page: it ranks below strangers'.
            (false, true,  false, false, false, L::NEWCOMERS, L::NEWCOMERS),
            (false, true,  false, false, false, L::VERIFIED,  L::VERIFIED),
            (false, false, true,  false, false, L::ANONYMOUS, L::BOTS),
            (false, false, true,  false, false, L::PASS,      L::PASS),
            (false, false, true,  false, false, L::NEWCOMERS, L::NEWCOMERS),
            (false, false, false, false, false, L::ANONYMOUS, L::ANONYMOUS),
            (false, false, false, false, false, L::PASS,      L::PASS),
            (false, false, false, false, false, L::NEWCOMERS, L::NEWCOMERS),
            // A person's visit lifts every request of it, above a pass.
            (false, false, false, false, true,  L::NEWCOMERS, L::VISITS),
            (false, false, false, false, true,  L::ANONYMOUS, L::VISITS),
            (false, true,  false, false, true,  L::ANONYMOUS, L::VISITS),
            (false, false, false, false, true,  L::BOTS,      L::VISITS),
            (false, false, false, true,  true,  L::NEWCOMERS, L::DEFERRED),
            (false, false, false, true,  false, L::PASS,      L::DEFERRED),
            (false, true,  false, true,  false, L::ANONYMOUS, L::DEFERRED),
            (false, false, true,  true,  false, L::ANONYMOUS, L::DEFERRED),
            (true,  false, false, true,  false, L::VERIFIED,  L::DEFERRED),
        ];
        for (verified, pass, bot, deferred, visit, class, want) in cases {
            let standing = Standing {
                verified,
                pass,
                bot,
                deferred,
                visit,
            };
            assert_eq!(
                Lane::for_request(standing, class),
                want,
                "{standing:?} {class:?}"
            );
        }
    }

    #[test]
    fn shares_are_fractions() {
        let cases = [
            (0.0, Some(0.0)),
            (0.1, Some(0.1)),
            (1.0, Some(1.0)),
            (-0.1, None),
            (1.5, None),
            (f64::NAN, None),
        ];
        for (fraction, want) in cases {
            assert_eq!(
                Share::from_fraction(fraction).map(Share::fraction),
                want,
                "{fraction}"
            );
        }
    }

    #[test]
    fn unknown_lane_is_clamped_to_lowest() {
        let lanes = Lanes::new(vec![spec("a"), spec("b")]).unwrap();
        assert_eq!(lanes.clamp(Lane::ANONYMOUS), Lane::VISITS);
        assert_eq!(lanes.spec(Lane::DEFERRED).name, "b");
        assert_eq!(lanes.lane(2), None);
    }
}
