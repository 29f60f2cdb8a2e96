//! Forward-confirmed reverse DNS: whether a client that claims a listed
//! crawler in its User-Agent really is one.
//!
//! The check search engines document for their crawlers: the address's PTR
//! name must end in one of the crawler's domains (`crawl-66-249-66-1.googlebot.com`
//! for `googlebot.com`), and that name's A/AAAA records must hold the
//! address again. A PTR record alone proves nothing: whoever owns an
//! address range writes its PTR names, so a spoofer can point its own
//! address at `googlebot.com`; only the forward lookup, answered by the
//! crawler's own zone, confirms it (A records for an IPv4 client, AAAA
//! for an IPv6 one).
//!
//! Lookups go through `hickory-resolver` to the configured name servers
//! (or resolv.conf's). Results are remembered per (address, crawler) in a
//! bounded LRU, confirmed ones for `verified_ttl`, refused ones for
//! `negative_ttl` (a failure to look up, for at most 30 s). A request never
//! waits longer than `wait` for a lookup: a lookup still running, one the
//! `max_lookups` bound turned away, or one that failed all mean "not
//! proven", and the request goes on as anonymous; the lookup finishes in
//! its own task and the next request gets the answer.
//!
//! Time is tokio's (`tokio::time::Instant`), paused in tests. Does not: read
//! the User-Agent (the caller says which crawler is claimed), decide
//! anything about the request, or count results (they are returned).

use std::net::IpAddr;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::proto::rr::RData;
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;

/// Most PTR names of one address looked at: an address has one or two;
/// a zone that lists dozens is making the verifier work.
const MAX_PTR_NAMES: usize = 4;

/// The longest a failed lookup (timeout, server failure) is remembered,
/// whatever `negative_ttl` says: a DNS blip should not hide a real
/// crawler for long.
const MAX_FAILED_TTL: Duration = Duration::from_secs(30);

/// What a lookup found for one address and one crawler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// PTR in the crawler's domains, and the name resolves to the address.
    Confirmed,
    /// No PTR name in the crawler's domains, or none that resolves back.
    NotConfirmed,
    /// The lookup timed out or the servers failed: nothing is known.
    Failed,
}

/// What a request learns: an [`Outcome`], or why there is none yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Done(Outcome),
    /// A lookup is running and did not end within `wait`.
    Pending,
    /// `max_lookups` were running already: none was started.
    Busy,
}

impl Answer {
    /// The `result` label of `weir_bot_verifications_total{method="fcrdns"}`.
    pub fn as_str(self) -> &'static str {
        match self {
            Answer::Done(Outcome::Confirmed) => "verified",
            Answer::Done(Outcome::NotConfirmed) => "not_confirmed",
            Answer::Done(Outcome::Failed) => "lookup_failed",
            Answer::Pending => "pending",
            Answer::Busy => "busy",
        }
    }
}

/// Timeouts, lifetimes and bounds of the checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// The longest a request waits for a lookup.
    pub wait: Duration,
    /// The longest one whole check (PTR, then A/AAAA) may take.
    pub timeout: Duration,
    pub verified_ttl: Duration,
    pub negative_ttl: Duration,
    /// (address, crawler) pairs remembered.
    pub cache_size: NonZeroUsize,
    /// Checks running at once.
    pub max_lookups: usize,
}

enum Entry {
    /// A check is running; its result comes on the channel.
    Pending(watch::Receiver<Option<Outcome>>),
    Done {
        outcome: Outcome,
        until: Instant,
    },
}

/// The checker: a resolver, the cache and the bound on lookups. Cheap to
/// clone (shared state).
#[derive(Clone)]
pub struct Fcrdns {
    shared: Arc<Shared>,
}

struct Shared {
    resolver: TokioResolver,
    settings: Settings,
    cache: Mutex<lru::LruCache<(IpAddr, usize), Entry>>,
    lookups: Arc<Semaphore>,
}

impl std::fmt::Debug for Fcrdns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fcrdns")
            .field("settings", &self.shared.settings)
            .finish()
    }
}

impl Fcrdns {
    pub fn new(resolver: TokioResolver, settings: Settings) -> Fcrdns {
        Fcrdns {
            shared: Arc::new(Shared {
                resolver,
                cache: Mutex::new(lru::LruCache::new(settings.cache_size)),
                lookups: Arc::new(Semaphore::new(settings.max_lookups)),
                settings,
            }),
        }
    }

    /// Whether `ip` is crawler `bot`, whose PTR names end in one of
    /// `domains` (lowercase, without a trailing dot). Waits at most
    /// `wait`; see the module docs.
    pub async fn check(&self, ip: IpAddr, bot: usize, domains: &Arc<[String]>) -> Answer {
        let shared = &self.shared;
        let now = Instant::now();
        let mut rx = {
            let mut cache = shared.lock();
            match cache.get(&(ip, bot)) {
                Some(Entry::Done { outcome, until }) if *until > now => {
                    return Answer::Done(*outcome);
                }
                Some(Entry::Pending(rx)) => rx.clone(),
                _ => {
                    let Ok(permit) = Arc::clone(&shared.lookups).try_acquire_owned() else {
                        return Answer::Busy;
                    };
                    let (tx, rx) = watch::channel(None);
                    cache.put((ip, bot), Entry::Pending(rx.clone()));
                    let task = Arc::clone(shared);
                    let domains = Arc::clone(domains);
                    tokio::spawn(async move { task.run(ip, bot, &domains, tx, permit).await });
                    rx
                }
            }
        };
        let waited = tokio::time::timeout(shared.settings.wait, rx.wait_for(Option::is_some)).await;
        match waited {
            Ok(Ok(outcome)) => Answer::Done(outcome.unwrap_or(Outcome::Failed)),
            // The task ended without a word (cannot happen: it always sends).
            Ok(Err(_)) => Answer::Done(Outcome::Failed),
            Err(_) => Answer::Pending,
        }
    }

    /// (address, crawler) pairs remembered or being checked.
    pub fn cached(&self) -> usize {
        self.shared.lock().len()
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, lru::LruCache<(IpAddr, usize), Entry>> {
        // A panic while holding the lock leaves a usable cache.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One check in its own task (holding one of `max_lookups`): the
    /// lookups under `timeout`, the outcome remembered and sent to whoever
    /// waits.
    async fn run(
        self: Arc<Self>,
        ip: IpAddr,
        bot: usize,
        domains: &[String],
        tx: watch::Sender<Option<Outcome>>,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) {
        let outcome = tokio::time::timeout(self.settings.timeout, self.confirm(ip, domains))
            .await
            .unwrap_or(Outcome::Failed);
        // Free before the outcome is seen: whoever reads it may start the
        // next lookup at once.
        drop(permit);
        let ttl = match outcome {
            Outcome::Confirmed => self.settings.verified_ttl,
            Outcome::NotConfirmed => self.settings.negative_ttl,
            Outcome::Failed => self.settings.negative_ttl.min(MAX_FAILED_TTL),
        };
        self.lock().put(
            (ip, bot),
            Entry::Done {
                outcome,
                until: Instant::now() + ttl,
            },
        );
        let _ = tx.send(Some(outcome));
    }

    /// PTR, then forward lookups of the names in `domains`.
    async fn confirm(&self, ip: IpAddr, domains: &[String]) -> Outcome {
        let names = match self.resolver.reverse_lookup(ip).await {
            Ok(lookup) => lookup
                .answers()
                .iter()
                .filter_map(|r| match &r.data {
                    RData::PTR(ptr) => Some(ptr.0.to_ascii()),
                    _ => None,
                })
                .take(MAX_PTR_NAMES)
                .collect::<Vec<_>>(),
            Err(e) if e.is_no_records_found() => return Outcome::NotConfirmed,
            Err(e) => {
                tracing::debug!(%ip, error = %e, "crawler reverse lookup failed");
                return Outcome::Failed;
            }
        };
        let mut failed = false;
        for name in names {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            if !in_domains(&name, domains) {
                continue;
            }
            // Fully qualified (no search domain is tried), and only the
            // client's own family: A for IPv4, AAAA for IPv6.
            let fqdn = format!("{name}.");
            let forward = match ip {
                IpAddr::V4(_) => self.resolver.ipv4_lookup(fqdn).await,
                IpAddr::V6(_) => self.resolver.ipv6_lookup(fqdn).await,
            };
            match forward {
                Ok(lookup) if lookup.answers().iter().any(|r| holds(&r.data, ip)) => {
                    return Outcome::Confirmed;
                }
                Ok(_) => {}
                Err(e) if e.is_no_records_found() => {}
                Err(e) => {
                    tracing::debug!(%ip, name, error = %e, "crawler forward lookup failed");
                    failed = true;
                }
            }
        }
        if failed {
            Outcome::Failed
        } else {
            Outcome::NotConfirmed
        }
    }
}

/// Whether a forward answer's record is the address `ip`.
fn holds(data: &RData, ip: IpAddr) -> bool {
    match (data, ip) {
        (RData::A(a), IpAddr::V4(v4)) => a.0 == v4,
        (RData::AAAA(a), IpAddr::V6(v6)) => a.0 == v6,
        _ => false,
    }
}

/// Whether `name` is one of `domains` or below one (`a.googlebot.com` is
/// below `googlebot.com`; `evilgooglebot.com` is not).
pub fn in_domains(name: &str, domains: &[String]) -> bool {
    domains.iter().any(|d| {
        name == d
            || name
                .strip_suffix(d.as_str())
                .is_some_and(|head| head.ends_with('.'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domain_suffixes() {
        let domains = vec!["googlebot.com".to_string(), "google.com".to_string()];
        let cases = [
            ("crawl-66-249-66-1.googlebot.com", true),
            ("googlebot.com", true),
            ("rate-limited-proxy-66-249-90-77.google.com", true),
            ("evilgooglebot.com", false),
            ("googlebot.com.evil.example", false),
            ("crawl.googlebot.co", false),
            ("", false),
        ];
        for (name, want) in cases {
            assert_eq!(in_domains(name, &domains), want, "{name}");
        }
    }
}
