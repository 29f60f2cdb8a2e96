//! Priority lanes: which waiting requests are served first and shed last.
//!
//! A [`Lane`] is an index into an ordered, validated list of [`LaneSpec`]s
//! ([`Lanes`]); index 0 is the most important. The standard set is
//! `verified` (a checked login) > `pass` (holders of a pass token, and cheap
//! pages) > `anonymous` (anonymous expensive requests) > `deferred`
//! (requests over a rule that defers instead of refusing: served only with
//! capacity nobody else wants, shed first), but the count, names, depths and
//! waits are data, so a deployment can add or merge lanes without code
//! changes.
//!
//! This module does not choose a request's lane (policy does, from the
//! verified identity and the route class) and does not queue anything
//! ([`crate::admission::queue`] does).

use std::time::Duration;

/// A priority lane. Lower index = higher priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lane(u8);

impl Lane {
    /// Verified sessions, in [`Lanes::standard`].
    pub const VERIFIED: Lane = Lane(0);
    /// Pass-token holders and cheap pages, in [`Lanes::standard`].
    pub const PASS: Lane = Lane(1);
    /// Anonymous expensive requests, in [`Lanes::standard`].
    pub const ANONYMOUS: Lane = Lane(2);
    /// Requests over a rule with `when_over = "defer"`, in
    /// [`Lanes::standard`]: the app's spare capacity, nothing more.
    pub const DEFERRED: Lane = Lane(3);

    /// The lane's position, 0 being the most important.
    pub fn index(self) -> usize {
        self.0 as usize
    }

    /// The lane at position `i` of a validated [`Lanes`] (at most
    /// [`MAX_LANES`], so the cast cannot truncate).
    pub(super) fn from_index(i: usize) -> Lane {
        Lane(i.min(MAX_LANES - 1) as u8)
    }

    /// The lane of one request: a request a rule deferred waits in
    /// `deferred` whatever it proved (the rule judged it; only what the rule
    /// exempts escapes it); verified sessions use the top lane; a pass token
    /// lifts a request to at least `pass`; everyone else gets the route
    /// class's lane. (Indices of [`Lanes::standard`].)
    pub fn for_request(verified: bool, pass_token: bool, deferred: bool, class_lane: Lane) -> Lane {
        if deferred {
            Lane::DEFERRED
        } else if verified {
            Lane::VERIFIED
        } else if pass_token {
            class_lane.min(Lane::PASS)
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

    /// `verified` > `pass` > `anonymous` > `deferred`, each waiting up to
    /// 10 s. Lower lanes are shallower: they are shed first anyway, and a
    /// deep queue of crawler requests only delays the answer that tells them
    /// to back off. `deferred` holds just enough to keep the app's slots
    /// busy between two arrivals of anyone else.
    pub fn standard() -> Lanes {
        let wait = Duration::from_secs(10);
        Lanes {
            specs: vec![
                LaneSpec {
                    name: "verified".into(),
                    max_depth: 1024,
                    max_wait: wait,
                },
                LaneSpec {
                    name: "pass".into(),
                    max_depth: 1024,
                    max_wait: wait,
                },
                LaneSpec {
                    name: "anonymous".into(),
                    max_depth: 512,
                    max_wait: wait,
                },
                LaneSpec {
                    name: "deferred".into(),
                    max_depth: 256,
                    max_wait: wait,
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
        assert_eq!(lanes.by_name("anonymous"), Some(Lane::ANONYMOUS));
        assert_eq!(lanes.by_name("deferred"), Some(Lane::DEFERRED));
        assert_eq!(lanes.lowest(), Lane::DEFERRED);
        assert!(Lane::VERIFIED.outranks(Lane::PASS));
        assert!(!Lane::ANONYMOUS.outranks(Lane::PASS));
        assert!(Lane::ANONYMOUS.outranks(Lane::DEFERRED));
    }

    #[test]
    fn lane_of_a_request() {
        use Lane as L;
        // (verified, pass, deferred by a rule, class lane) -> lane
        let cases = [
            (true, false, false, L::ANONYMOUS, L::VERIFIED),
            (true, true, false, L::PASS, L::VERIFIED),
            (false, true, false, L::ANONYMOUS, L::PASS),
            (false, true, false, L::VERIFIED, L::VERIFIED),
            (false, false, false, L::ANONYMOUS, L::ANONYMOUS),
            (false, false, false, L::PASS, L::PASS),
            (false, false, true, L::PASS, L::DEFERRED),
            (false, true, true, L::ANONYMOUS, L::DEFERRED),
            (true, false, true, L::VERIFIED, L::DEFERRED),
        ];
        for (verified, pass, deferred, class, want) in cases {
            assert_eq!(
                Lane::for_request(verified, pass, deferred, class),
                want,
                "{verified} {pass} {deferred} {class:?}"
            );
        }
    }

    #[test]
    fn unknown_lane_is_clamped_to_lowest() {
        let lanes = Lanes::new(vec![spec("a"), spec("b")]).unwrap();
        assert_eq!(lanes.clamp(Lane::ANONYMOUS), Lane::PASS);
        assert_eq!(lanes.spec(Lane::DEFERRED).name, "b");
        assert_eq!(lanes.lane(2), None);
    }
}
