//! Shared limits across instances: Redis first, the local store when Redis
//! cannot answer in time.
//!
//! [`SharedLimiter::check_all`] decides every rule of one request together,
//! all or nothing, and always answers: from Redis ([`Source::Redis`]), from
//! the local mirror without a round trip when it already knows the request
//! is over a limit ([`Source::Local`]), or from the local store alone while
//! Redis is unreachable or slower than [`RedisTimeouts::command`](super::redis::RedisTimeouts::command)
//! ([`Source::LocalFallback`]). It never refuses everyone because Redis is
//! gone (fail closed) and never waits for Redis to start (incident 4).
//!
//! The local store is a mirror. Every Redis answer carries the key's TAT
//! (`reset` is TAT minus the server's now), which is written into the local
//! [`ShardedStore`] as `sent_at + reset`; `sent_at` is taken before the round
//! trip, so the mirrored TAT is never later than Redis's own (other instances
//! only move Redis's TAT later). Hence:
//! - a request the mirror rejects, Redis would reject too: it is refused
//!   locally, with no round trip (a client hammering past its limit costs
//!   Redis nothing until its `retry_after` has passed);
//! - when Redis fails, the local store carries on from the shared state
//!   instead of from empty buckets.
//!
//! The mirror keeps the later of its own TAT and Redis's, so after an outage
//! the admissions this instance made alone still count here (for at most τ)
//! while Redis does not know them.
//!
//! Leases ([`super::lease`]): a round trip for a key this instance sees
//! often also takes tokens ahead of use, and later requests on that key are
//! decided from them with no round trip ([`Source::Lease`]); unused tokens
//! go back after a lease period (a background task, one script call per
//! hash slot) and at a stop ([`SharedLimiter::give_back_leases`]), and the
//! mirror gives them back too, so it stays no later than Redis.
//!
//! Outages: the first failed round trip switches the limiter to local
//! decisions (one warning in the log, `outages` + 1), a background task then
//! probes every [`RedisTimeouts::probe_interval`](super::redis::RedisTimeouts::probe_interval)
//! (one script call that writes, see [`RedisLimiter::probe`]) and switches
//! back on the first success (one info line). Requests never wait on a Redis known to be down,
//! and the probe is the only traffic to it, so a struggling Redis is not
//! buried under retries (incident 4). At start-up the limiter decides locally
//! until the first probe succeeds, a few milliseconds when Redis is up.
//!
//! Accuracy while falling back: each instance admits up to the full limit on
//! its own, so `n` instances admit up to `n` times a limit until Redis is
//! back. All or nothing on the local path is checked first and charged after,
//! rule by rule: two racing requests may both pass the check, and then the
//! second may be charged on rules it passed while another rule refuses it.
//! Nothing is ever admitted over a local limit.
//!
//! This module does not choose rules, keys or quotas (policy does), turn
//! outcomes into responses, or register metrics: [`SharedLimiter::stats`]
//! hands out the counters for the metrics module to export.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use weir_limiter::redis::{RedisLimiter, RedisTimeouts, RuleCheck};
//! use weir_limiter::shared::{SharedLimiter, all_allowed};
//! use weir_limiter::{key, MonotonicClock, Quota, RuleFingerprint, RuleStores, StoreConfig};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let per_24 = RuleFingerprint(0x24);
//! let site = RuleFingerprint(0x5173);
//! let local = RuleStores::build(
//!     &[(per_24, StoreConfig::with_max_keys(100_000)), (site, StoreConfig::with_max_keys(64))],
//!     None,
//! )?;
//! // Returns at once, even with Redis down; connects in the background.
//! let redis = RedisLimiter::new("redis://127.0.0.1:6379/", "weir:wiki:", RedisTimeouts::default())?;
//! let limiter = SharedLimiter::new(redis, local, Arc::new(MonotonicClock));
//! if limiter.wait_for_redis(Duration::from_secs(1)).await {
//!     let n = limiter.redis().count_keys("anon:subnet", per_24).await?;
//!     println!("restored {n} /24 keys from redis");
//! }
//! let q24 = Quota::new(300, Duration::from_secs(600), 300)?;
//! let qsite = Quota::new(1500, Duration::from_secs(600), 1500)?;
//! let decided = limiter
//!     .check_all(&[
//!         RuleCheck { rule: per_24, label: "anon:subnet", key: key(0, 1, 0x0a00_01), quota: &q24, cost: 1 },
//!         RuleCheck { rule: site, label: "anon:site", key: key(1, 0, 0), quota: &qsite, cost: 1 },
//!     ])
//!     .await;
//! let admitted = all_allowed(&decided);
//! # let _ = admitted;
//! # Ok(())
//! # }
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;

use super::gcra::{Clock, MonoTime, Outcome, Quota};
use super::lease::{self, Due, LeaseBook};
use super::redis::{RedisCheckError, RedisLimiter, RuleCheck, Unused};
use super::store::{RuleFingerprint, RuleStores, ShardedStore};

/// Where a decision was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// By the Redis script: shared with every instance.
    Redis,
    /// By the local mirror, Redis being up: it already knew the request was
    /// over a limit, so no round trip was needed.
    Local,
    /// By the local store alone, Redis being unreachable or too slow.
    LocalFallback,
    /// From tokens this instance leased from Redis earlier ([`super::lease`]).
    Lease,
}

impl Source {
    /// A short name for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Redis => "redis",
            Source::Local => "local",
            Source::LocalFallback => "local_fallback",
            Source::Lease => "lease",
        }
    }
}

/// One rule's decision for a request, and where it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decided {
    pub outcome: Outcome,
    pub source: Source,
}

/// Whether a request passed: every one of its rules allowed it.
pub fn all_allowed(decisions: &[Decided]) -> bool {
    decisions.iter().all(|d| d.outcome.is_allowed())
}

/// Counters for metrics; each is a total since start except `fallback_active`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SharedStats {
    /// Round trips Redis answered (one per `check_all` call).
    pub redis_ok: u64,
    /// Round trips that failed or timed out on the request path (each then
    /// decided locally).
    pub redis_errors: u64,
    /// Calls decided by the local store alone ([`Source::LocalFallback`]).
    pub fallback_decisions: u64,
    /// Calls refused by the local mirror with no round trip ([`Source::Local`]).
    pub local_rejections: u64,
    /// Checks naming a rule that has no local store: decided as a fresh key
    /// when Redis could not be asked. Non-zero means the local stores are
    /// out of step with the rules (a wiring bug).
    pub unknown_rules: u64,
    /// Times Redis became unreachable (including not reachable at start-up).
    pub outages: u64,
    /// Calls decided wholly from leased tokens, with no round trip.
    pub lease_decisions: u64,
    /// Tokens leased ahead of use.
    pub leased_tokens: u64,
    /// Leased tokens given back unused.
    pub returned_tokens: u64,
    /// Deciding locally now (also before Redis first answers).
    pub fallback_active: bool,
}

/// Rate limits shared through Redis, with local fallback; see the module doc.
///
/// Dropping it stops its probe and lease tasks.
pub struct SharedLimiter {
    inner: Arc<Inner>,
    prober: tokio::task::JoinHandle<()>,
    returner: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for SharedLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedLimiter")
            .field("redis", &self.inner.redis)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

struct Inner {
    redis: RedisLimiter,
    local: ArcSwap<RuleStores>,
    leases: LeaseBook,
    clock: Arc<dyn Clock>,
    /// True while deciding locally; read on every request.
    fallback: AtomicBool,
    /// The opposite of `fallback`, for waiters.
    healthy: watch::Sender<bool>,
    outage_log: Mutex<OutageLog>,
    redis_ok: AtomicU64,
    redis_errors: AtomicU64,
    fallback_decisions: AtomicU64,
    local_rejections: AtomicU64,
    unknown_rules: AtomicU64,
    outages: AtomicU64,
    lease_decisions: AtomicU64,
    leased_tokens: AtomicU64,
    returned_tokens: AtomicU64,
}

/// What has been logged, so an outage is logged once and its end once.
#[derive(Debug, Default)]
struct OutageLog {
    connected_once: bool,
    in_outage: bool,
}

impl SharedLimiter {
    /// Starts deciding at once (locally until Redis first answers) and
    /// probes Redis in the background of the runtime `redis` was made in.
    ///
    /// `local` must hold a store for every rule fingerprint that will be
    /// checked (see [`SharedStats::unknown_rules`]); `clock` is the clock the
    /// local stores are used with.
    pub fn new(redis: RedisLimiter, local: RuleStores, clock: Arc<dyn Clock>) -> SharedLimiter {
        SharedLimiter::with_lease_period(redis, local, clock, lease::DEFAULT_PERIOD)
    }

    /// [`Self::new`] with leases whose unused tokens go back after
    /// `period`; zero for no leases (every decision a round trip, exact).
    pub fn with_lease_period(
        redis: RedisLimiter,
        local: RuleStores,
        clock: Arc<dyn Clock>,
        period: Duration,
    ) -> SharedLimiter {
        let probe_interval = redis.timeouts().probe_interval;
        let runtime = redis.runtime().clone();
        let inner = Arc::new(Inner {
            redis,
            local: ArcSwap::from_pointee(local),
            leases: LeaseBook::new(period),
            clock,
            fallback: AtomicBool::new(true),
            healthy: watch::Sender::new(false),
            outage_log: Mutex::new(OutageLog::default()),
            redis_ok: AtomicU64::new(0),
            redis_errors: AtomicU64::new(0),
            fallback_decisions: AtomicU64::new(0),
            local_rejections: AtomicU64::new(0),
            unknown_rules: AtomicU64::new(0),
            outages: AtomicU64::new(0),
            lease_decisions: AtomicU64::new(0),
            leased_tokens: AtomicU64::new(0),
            returned_tokens: AtomicU64::new(0),
        });
        let prober = runtime.spawn(probe_loop(Arc::downgrade(&inner), probe_interval));
        let returner = runtime.spawn(return_loop(Arc::downgrade(&inner), period));
        SharedLimiter {
            inner,
            prober,
            returner,
        }
    }

    /// Gives back every leased token now (at a stop, so the fleet gets
    /// them at once rather than when their TATs pass).
    pub async fn give_back_leases(&self) {
        let due = self.inner.leases.all_held();
        self.inner.give_back(due).await;
    }

    /// Swaps in the local stores of a reloaded config (build them with
    /// [`RuleStores::build`] from the previous ones to keep their state).
    pub fn set_rules(&self, local: RuleStores) {
        self.inner.local.store(Arc::new(local));
    }

    pub fn redis(&self) -> &RedisLimiter {
        &self.inner.redis
    }

    /// True while decisions are local: Redis unreachable, too slow, or not
    /// yet connected.
    pub fn fallback_active(&self) -> bool {
        self.inner.fallback.load(Ordering::Acquire)
    }

    /// Waits until Redis is in use or `within` has passed; true if it is.
    /// For start-up reports; requests never need to wait.
    pub async fn wait_for_redis(&self, within: Duration) -> bool {
        let mut healthy = self.inner.healthy.subscribe();
        matches!(
            tokio::time::timeout(within, healthy.wait_for(|h| *h)).await,
            Ok(Ok(_))
        )
    }

    pub fn stats(&self) -> SharedStats {
        let i = &self.inner;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SharedStats {
            redis_ok: get(&i.redis_ok),
            redis_errors: get(&i.redis_errors),
            fallback_decisions: get(&i.fallback_decisions),
            local_rejections: get(&i.local_rejections),
            unknown_rules: get(&i.unknown_rules),
            outages: get(&i.outages),
            lease_decisions: get(&i.lease_decisions),
            leased_tokens: get(&i.leased_tokens),
            returned_tokens: get(&i.returned_tokens),
            fallback_active: self.fallback_active(),
        }
    }

    /// One rule; see [`Self::check_all`].
    pub async fn check(
        &self,
        rule: RuleFingerprint,
        key: u64,
        quota: &Quota,
        cost: u32,
    ) -> Decided {
        let checks = [RuleCheck {
            label: "",
            rule,
            key,
            quota,
            cost,
        }];
        let decided = self.check_all(&checks).await;
        decided.first().copied().unwrap_or(Decided {
            // check_all answers once per check; this is unreachable in
            // practice, and failing open is the rule for the unexpected.
            outcome: fresh_key(quota, self.inner.clock.now(), cost),
            source: Source::LocalFallback,
        })
    }

    /// Decides all of a request's rules in one round trip, all or nothing:
    /// if any rule refuses, no rule is charged (rules that would have allowed
    /// report their state as it is). One [`Decided`] per check, in order.
    /// Rules whose keys this instance holds leased tokens for are decided
    /// here; a request whose every rule is leased makes no round trip.
    /// Takes at most about [`RedisTimeouts::command`](super::redis::RedisTimeouts::command); never fails.
    pub async fn check_all(&self, checks: &[RuleCheck<'_>]) -> Vec<Decided> {
        let inner = &self.inner;
        let now = inner.clock.now();
        let leased: Vec<bool> = checks
            .iter()
            .map(|c| inner.leases.take(c.rule, c.key, c.cost, now))
            .collect();
        let rest: Vec<RuleCheck<'_>> = checks
            .iter()
            .zip(&leased)
            .filter(|&(_, &leased)| !leased)
            .map(|(c, _)| *c)
            .collect();
        if rest.is_empty() {
            inner.lease_decisions.fetch_add(1, Ordering::Relaxed);
        }
        let decided = inner.decide(&rest, now).await;
        let admitted = all_allowed(&decided);
        let stores = inner.local.load();
        let mut decided = decided.into_iter();
        checks
            .iter()
            .zip(&leased)
            .map(|(c, &leased)| {
                if !leased {
                    return decided.next().unwrap_or(Decided {
                        // `decide` answers once per check; failing open is
                        // the rule for the unexpected.
                        outcome: fresh_key(c.quota, now, c.cost),
                        source: Source::LocalFallback,
                    });
                }
                if !admitted {
                    inner.leases.untake(c.rule, c.key, c.cost);
                }
                Decided {
                    outcome: inner.lease_outcome(&stores, c, now),
                    source: Source::Lease,
                }
            })
            .collect()
    }
}

impl Drop for SharedLimiter {
    fn drop(&mut self) {
        self.prober.abort();
        self.returner.abort();
    }
}

impl Inner {
    /// Decides `checks` (the ones no lease covered): locally while Redis is
    /// down, by the mirror when it already knows a check is over its limit,
    /// else in one round trip that also leases what the book wants.
    async fn decide(&self, checks: &[RuleCheck<'_>], sent_at: MonoTime) -> Vec<Decided> {
        if checks.is_empty() {
            return Vec::new();
        }
        let stores = self.local.load();
        if self.fallback.load(Ordering::Acquire) {
            return self.decide_locally(&stores, checks, sent_at);
        }
        let (reads, admitted) = self.read_locally(&stores, checks, sent_at);
        if !admitted {
            self.local_rejections.fetch_add(1, Ordering::Relaxed);
            return with_source(reads, Source::Local);
        }
        let wanted: Vec<u32> = checks
            .iter()
            .map(|c| self.leases.wanted(c.rule, c.key, c.quota, sent_at))
            .collect();
        match self.redis.check_all_leasing(checks, &wanted, None).await {
            Ok(answers) => {
                self.redis_ok.fetch_add(1, Ordering::Relaxed);
                for ((c, &(_, tokens)), &asked) in checks.iter().zip(&answers).zip(&wanted) {
                    if tokens > 0 {
                        self.leases.note_rule(c.rule, c.label, c.quota);
                        self.leased_tokens
                            .fetch_add(u64::from(tokens), Ordering::Relaxed);
                    }
                    if asked > 0 {
                        self.leases.granted(c.rule, c.key, tokens, sent_at);
                    }
                }
                let outcomes: Vec<Outcome> = answers.into_iter().map(|(o, _)| o).collect();
                mirror(&stores, checks, &outcomes, sent_at);
                with_source(outcomes, Source::Redis)
            }
            Err(e) => {
                self.redis_errors.fetch_add(1, Ordering::Relaxed);
                for (c, &asked) in checks.iter().zip(&wanted) {
                    if asked > 0 {
                        self.leases.granted(c.rule, c.key, 0, sent_at);
                    }
                }
                self.trip(&e);
                let stores = self.local.load();
                self.decide_locally(&stores, checks, self.clock.now())
            }
        }
    }

    /// A leased check's outcome: allowed, with the mirror's state plus the
    /// tokens still held.
    fn lease_outcome(&self, stores: &RuleStores, c: &RuleCheck<'_>, now: MonoTime) -> Outcome {
        let tat = self
            .store(stores, c.rule)
            .and_then(|s| s.tat(c.key))
            .unwrap_or(MonoTime::ZERO);
        Outcome::Allowed {
            remaining: c
                .quota
                .remaining(tat, now)
                .saturating_add(self.leases.left(c.rule, c.key)),
            reset: c.quota.reset(tat, now),
        }
    }

    /// Gives `due` back to Redis, and takes the same tokens off the mirror so
    /// it stays no later than Redis. Tokens that cannot be given back stay
    /// charged until their keys' TATs pass.
    async fn give_back(&self, due: Vec<Due>) {
        if due.is_empty() {
            return;
        }
        let infos: Vec<_> = due.iter().map(|d| self.leases.rule(d.rule)).collect();
        let unused: Vec<Unused<'_>> = due
            .iter()
            .zip(&infos)
            .filter_map(|(d, info)| {
                let info = info.as_ref()?;
                Some(Unused {
                    rule: d.rule,
                    label: &info.label,
                    key: d.key,
                    quota: &info.quota,
                    cost: d.tokens,
                })
            })
            .collect();
        if let Err(e) = self.redis.give_back(&unused).await {
            tracing::debug!(error = %e, "leased tokens not given back: they stay charged until their keys' TATs pass");
            return;
        }
        let stores = self.local.load();
        let now = self.clock.now();
        for u in &unused {
            if let Some(store) = stores.by_fingerprint(u.rule) {
                store.refund(u.key, u.quota, now, u.cost);
            }
            self.returned_tokens
                .fetch_add(u64::from(u.cost), Ordering::Relaxed);
        }
    }

    /// The outcome each check would have now, charging nothing; allowed
    /// checks report a cost-0 read when some other check refuses.
    fn read_locally(
        &self,
        stores: &RuleStores,
        checks: &[RuleCheck<'_>],
        now: MonoTime,
    ) -> (Vec<Outcome>, bool) {
        let tats: Vec<MonoTime> = checks
            .iter()
            .map(|c| {
                self.store(stores, c.rule)
                    .and_then(|s| s.tat(c.key))
                    .unwrap_or(MonoTime::ZERO)
            })
            .collect();
        let mut outcomes: Vec<Outcome> = checks
            .iter()
            .zip(&tats)
            .map(|(c, &tat)| c.quota.check(&mut { tat }, now, c.cost))
            .collect();
        let admitted = outcomes.iter().all(Outcome::is_allowed);
        if !admitted {
            for ((outcome, c), &tat) in outcomes.iter_mut().zip(checks).zip(&tats) {
                if outcome.is_allowed() {
                    *outcome = Outcome::Allowed {
                        remaining: c.quota.remaining(tat, now),
                        reset: c.quota.reset(tat, now),
                    };
                }
            }
        }
        (outcomes, admitted)
    }

    /// Decides with the local stores only: check every rule, then charge
    /// them all if all allowed.
    fn decide_locally(
        &self,
        stores: &RuleStores,
        checks: &[RuleCheck<'_>],
        now: MonoTime,
    ) -> Vec<Decided> {
        self.fallback_decisions.fetch_add(1, Ordering::Relaxed);
        let (reads, admitted) = self.read_locally(stores, checks, now);
        if !admitted {
            return with_source(reads, Source::LocalFallback);
        }
        let charged = checks
            .iter()
            .map(|c| match stores.by_fingerprint(c.rule) {
                Some(store) => store.check(c.key, c.quota, now, c.cost),
                None => fresh_key(c.quota, now, c.cost),
            })
            .collect();
        with_source(charged, Source::LocalFallback)
    }

    fn store<'s>(&self, stores: &'s RuleStores, rule: RuleFingerprint) -> Option<&'s ShardedStore> {
        let store = stores.by_fingerprint(rule).map(|s| &**s);
        if store.is_none() {
            self.unknown_rules.fetch_add(1, Ordering::Relaxed);
        }
        store
    }

    /// A request-path failure: switch to local decisions, log if news.
    fn trip(&self, error: &RedisCheckError) {
        if self.fallback.swap(true, Ordering::AcqRel) {
            return;
        }
        self.healthy.send_replace(false);
        let mut log = self
            .outage_log
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !log.in_outage {
            log.in_outage = true;
            self.outages.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                redis = %self.redis.url(),
                error = %error,
                "redis limiter unreachable: deciding rate limits locally per instance until it answers"
            );
        }
    }

    /// A failed probe: log once if this is a new outage (at start-up).
    fn probe_failed(&self, error: &RedisCheckError) {
        let mut log = self
            .outage_log
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if log.in_outage {
            return;
        }
        log.in_outage = true;
        self.outages.fetch_add(1, Ordering::Relaxed);
        if log.connected_once {
            tracing::warn!(
                redis = %self.redis.url(),
                error = %error,
                "redis limiter unreachable: deciding rate limits locally per instance until it answers"
            );
        } else {
            tracing::warn!(
                redis = %self.redis.url(),
                error = %error,
                "redis limiter not reachable at start-up: deciding rate limits locally per instance until it answers"
            );
        }
    }

    /// A successful probe: back to Redis, log if this ends an outage.
    fn recover(&self) {
        {
            let mut log = self
                .outage_log
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if log.in_outage {
                tracing::info!(redis = %self.redis.url(), "redis limiter reachable again: limits are shared again");
            } else if !log.connected_once {
                tracing::info!(redis = %self.redis.url(), prefix = %self.redis.prefix(), "redis limiter connected");
            }
            log.in_outage = false;
            log.connected_once = true;
        }
        self.fallback.store(false, Ordering::Release);
        self.healthy.send_replace(true);
    }
}

/// Copies the TAT each Redis answer implies into the local store, keeping
/// the later of the two (see the module doc for why this is never later
/// than Redis's).
fn mirror(stores: &RuleStores, checks: &[RuleCheck<'_>], outcomes: &[Outcome], sent_at: MonoTime) {
    for (c, outcome) in checks.iter().zip(outcomes) {
        let reset = match *outcome {
            Outcome::Allowed { reset, .. } | Outcome::Rejected { reset, .. } => reset,
            Outcome::CostExceedsBurst { .. } => continue,
        };
        if let Some(store) = stores.by_fingerprint(c.rule) {
            store.restore(c.key, sent_at + reset, sent_at);
        }
    }
}

/// The decision for a key with no state: fail open on an unknown rule, but
/// still as strict as one fresh bucket.
fn fresh_key(quota: &Quota, now: MonoTime, cost: u32) -> Outcome {
    let mut tat = MonoTime::ZERO;
    quota.check(&mut tat, now, cost)
}

fn with_source(outcomes: Vec<Outcome>, source: Source) -> Vec<Decided> {
    outcomes
        .into_iter()
        .map(|outcome| Decided { outcome, source })
        .collect()
}

/// Every lease period, gives back the tokens of leases older than one
/// (while Redis answers; during an outage they stay usable here).
async fn return_loop(inner: Weak<Inner>, period: Duration) {
    if period.is_zero() {
        return;
    }
    loop {
        tokio::time::sleep(period).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if !inner.fallback.load(Ordering::Acquire) {
            let due = inner.leases.expired(inner.clock.now());
            inner.give_back(due).await;
        }
    }
}

async fn probe_loop(inner: Weak<Inner>, interval: Duration) {
    let mut failures: u32 = 0;
    loop {
        {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            if inner.fallback.load(Ordering::Acquire) {
                match inner.redis.probe().await {
                    Ok(()) => {
                        failures = 0;
                        inner.recover();
                    }
                    Err(e) => {
                        failures += 1;
                        inner.probe_failed(&e);
                        inner.redis.recover_connection(failures).await;
                    }
                }
            } else {
                failures = 0;
            }
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests;
