//! Tallies behind metrics that are more than a counter: the distinct
//! clients a rule refused this minute (`weir_rule_rejected_clients`, the
//! gauge that tells a rule hitting many people from one hitting one
//! crawler), and warnings logged at most once an interval per kind (always
//! counted; logged rarely, so a flood of bad fields cannot flood the log).
//!
//! Owns the bookkeeping only; the phases that see the events set the
//! metrics and write the log lines.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ipnet::IpNet;

/// Distinct rejected clients remembered per rule per minute; past it the
/// gauge saturates (memory stays bounded under a spray).
const MAX_REJECTED_CLIENTS: usize = 100_000;

/// Refused prefixes counted per rule per minute; a prefix first seen past
/// it is not counted (the top of a flood is found in its first thousands).
const MAX_REFUSED_PREFIXES: usize = 10_000;

/// One rule's refusals in one minute (since start).
#[derive(Debug, Clone, Default)]
struct RuleMinute {
    minute: u64,
    clients: HashSet<IpAddr>,
    rejections: u64,
    /// Rejections of clients with evidence of a person (verified, pass, browsing).
    looks_human: u64,
    /// Refusals per client prefix: IPv4 /24, IPv6 /48.
    prefixes: HashMap<IpNet, u64>,
}

/// A rule's current minute, and the one before when it ended just now.
type ThisAndLast = (RuleMinute, Option<RuleMinute>);

/// What a rule refused in a minute, for the live page (`/ui`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RuleActivity {
    pub rule: String,
    pub rejections: u64,
    pub distinct_clients: usize,
    /// Rejections with evidence of a person (verified, pass, browsing).
    pub looks_human: u64,
    /// The most refused prefixes, most first.
    pub top_prefixes: Vec<(String, u64)>,
}

/// The distinct clients, people-like refusals and prefixes each rule
/// refused in the current minute (and the one before, for the live page).
#[derive(Debug, Default)]
pub struct RejectedClients {
    rules: Mutex<HashMap<Arc<str>, ThisAndLast>>,
}

impl RejectedClients {
    /// Counts `client` as refused by `rule` in `minute` (`looks_human`:
    /// evidence of a person); returns how many distinct clients the rule
    /// refused in that minute so far.
    pub fn record(&self, rule: &Arc<str>, client: IpAddr, looks_human: bool, minute: u64) -> usize {
        let mut rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        let (now, before) = rules.entry(rule.clone()).or_insert_with(|| {
            let fresh = RuleMinute {
                minute,
                ..RuleMinute::default()
            };
            (fresh, None)
        });
        if now.minute != minute {
            let ended = std::mem::take(now);
            *before = (ended.minute + 1 == minute).then_some(ended);
            now.minute = minute;
        }
        if now.clients.len() < MAX_REJECTED_CLIENTS {
            now.clients.insert(client);
        }
        now.rejections += 1;
        now.looks_human += u64::from(looks_human);
        let prefix = refused_prefix(client);
        if let Some(n) = now.prefixes.get_mut(&prefix) {
            *n += 1;
        } else if now.prefixes.len() < MAX_REFUSED_PREFIXES {
            now.prefixes.insert(prefix, 1);
        }
        now.clients.len()
    }

    /// Each rule's refusals in `minute` (`this`) and in the minute before
    /// (`last`), with at most `top` prefixes each; rules without any in
    /// either are left out.
    pub fn activity(&self, minute: u64, top: usize) -> Vec<(RuleActivity, Option<RuleActivity>)> {
        let rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<_> = rules
            .iter()
            .filter_map(|(rule, (now, before))| {
                let (this, last) = match now.minute {
                    m if m == minute => (Some(now), before.as_ref()),
                    m if m + 1 == minute => (None, Some(now)),
                    _ => (None, None),
                };
                let view = |m: &RuleMinute| activity_of(rule, m, top);
                match (this, last) {
                    (None, None) => None,
                    (this, last) => Some((
                        this.map_or_else(|| activity_of(rule, &RuleMinute::default(), 0), view),
                        last.map(view),
                    )),
                }
            })
            .collect();
        out.sort_by(|a, b| {
            b.0.rejections
                .cmp(&a.0.rejections)
                .then(a.0.rule.cmp(&b.0.rule))
        });
        out
    }
}

fn activity_of(rule: &str, m: &RuleMinute, top: usize) -> RuleActivity {
    let mut prefixes: Vec<_> = m
        .prefixes
        .iter()
        .map(|(p, n)| (p.to_string(), *n))
        .collect();
    prefixes.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    prefixes.truncate(top);
    RuleActivity {
        rule: rule.to_owned(),
        rejections: m.rejections,
        distinct_clients: m.clients.len(),
        looks_human: m.looks_human,
        top_prefixes: prefixes,
    }
}

/// The prefix a refused client is shown under: an IPv4 /24 or an IPv6 /48
/// (one customer or site), as operators block them.
pub(crate) fn refused_prefix(ip: IpAddr) -> IpNet {
    let len = if ip.is_ipv4() { 24 } else { 48 };
    IpNet::new(ip, len).map_or(IpNet::from(ip), |n| n.trunc())
}

/// Kinds of warning, each logged at most once an interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Warning {
    /// Forwarding fields from a peer that is not a trusted proxy.
    UntrustedPeer,
    /// Other forwarding-field trouble (an unparsable chain, PROXY protocol
    /// from an untrusted peer).
    Forwarding,
    /// One peer carries most traffic while no proxy is trusted.
    DominantPeer,
}

/// When each kind of warning was last logged.
#[derive(Debug)]
pub struct Warnings {
    started: Instant,
    interval: Duration,
    /// Milliseconds since `started` (+1) of the last log line, per kind.
    last_ms: [AtomicU64; 3],
}

impl Warnings {
    pub fn new(interval: Duration) -> Warnings {
        Warnings {
            started: Instant::now(),
            interval,
            last_ms: Default::default(),
        }
    }

    /// Whether a warning of `kind` should be logged now (and, if so, notes
    /// that it was).
    pub fn should_log(&self, kind: Warning) -> bool {
        let slot = &self.last_ms[kind as usize];
        let now = self.started.elapsed().as_millis() as u64 + 1;
        let last = slot.load(Ordering::Relaxed);
        if last != 0 && now - last < self.interval.as_millis() as u64 {
            return false;
        }
        slot.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_clients_per_rule_per_minute() {
        let t = RejectedClients::default();
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(t.record(&a, ip("10.0.0.1"), false, 0), 1);
        assert_eq!(t.record(&a, ip("10.0.0.1"), false, 0), 1);
        assert_eq!(t.record(&a, ip("10.0.0.2"), true, 0), 2);
        assert_eq!(t.record(&b, ip("10.0.0.1"), false, 0), 1, "per rule");
        assert_eq!(
            t.record(&a, ip("10.0.0.3"), false, 1),
            1,
            "a new minute starts over"
        );
    }

    #[test]
    fn activity_this_minute_and_the_last_with_top_prefixes() {
        let t = RejectedClients::default();
        let rule: Arc<str> = Arc::from("r");
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        for s in ["203.0.113.1", "203.0.113.2", "203.0.113.2", "198.51.100.9"] {
            t.record(&rule, ip(s), false, 5);
        }
        t.record(&rule, ip("2001:db8:1:2::7"), true, 5);
        let now = t.activity(5, 2);
        assert_eq!(now.len(), 1);
        let (this, last) = &now[0];
        assert_eq!(
            (this.rejections, this.distinct_clients, this.looks_human),
            (5, 4, 1)
        );
        assert_eq!(
            this.top_prefixes,
            vec![
                ("203.0.113.0/24".to_string(), 3),
                ("198.51.100.0/24".to_string(), 1)
            ]
        );
        assert_eq!(last, &None);
        // The next minute: the ended one is "last", this one starts empty.
        let next = t.activity(6, 2);
        assert_eq!(next[0].0.rejections, 0);
        assert_eq!(next[0].1.as_ref().map(|l| l.rejections), Some(5));
        t.record(&rule, ip("2001:db8:1:ffff::1"), false, 6);
        let (this, last) = &t.activity(6, 3)[0];
        assert_eq!(this.top_prefixes, vec![("2001:db8:1::/48".to_string(), 1)]);
        assert_eq!(last.as_ref().map(|l| l.rejections), Some(5));
        assert!(t.activity(8, 3).is_empty(), "two minutes on: nothing");
    }

    #[test]
    fn a_warning_is_logged_once_an_interval_per_kind() {
        let w = Warnings::new(Duration::from_secs(60));
        assert!(w.should_log(Warning::UntrustedPeer));
        assert!(!w.should_log(Warning::UntrustedPeer));
        assert!(w.should_log(Warning::DominantPeer), "kinds apart");
        let every_time = Warnings::new(Duration::ZERO);
        assert!(every_time.should_log(Warning::Forwarding));
    }
}
