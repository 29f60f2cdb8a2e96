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

/// Distinct rejected clients remembered per rule per minute; past it the
/// gauge saturates (memory stays bounded under a spray).
const MAX_REJECTED_CLIENTS: usize = 100_000;

/// A minute (since start) and the addresses refused in it.
type Minute = (u64, HashSet<IpAddr>);

/// The distinct clients each rule refused in the current minute.
#[derive(Debug, Default)]
pub struct RejectedClients {
    rules: Mutex<HashMap<Arc<str>, Minute>>,
}

impl RejectedClients {
    /// Counts `client` as refused by `rule` in `minute`; returns how many
    /// distinct clients the rule refused in that minute so far.
    pub fn record(&self, rule: &Arc<str>, client: IpAddr, minute: u64) -> usize {
        let mut rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        let entry = rules
            .entry(rule.clone())
            .or_insert_with(|| (minute, HashSet::new()));
        if entry.0 != minute {
            *entry = (minute, HashSet::new());
        }
        if entry.1.len() < MAX_REJECTED_CLIENTS {
            entry.1.insert(client);
        }
        entry.1.len()
    }
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
        assert_eq!(t.record(&a, ip("10.0.0.1"), 0), 1);
        assert_eq!(t.record(&a, ip("10.0.0.1"), 0), 1);
        assert_eq!(t.record(&a, ip("10.0.0.2"), 0), 2);
        assert_eq!(t.record(&b, ip("10.0.0.1"), 0), 1, "per rule");
        assert_eq!(
            t.record(&a, ip("10.0.0.3"), 1),
            1,
            "a new minute starts over"
        );
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
