//! Tests against a real `redis-server`, killed, paused and restarted.
//!
//! Outages are waited for by bounded polling of `fallback_active()`, never
//! by sleeping a fixed time; the local stores run on a `ManualClock`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::gcra::ManualClock;
use crate::redis::RedisTimeouts;
use crate::redis::testing::{RedisServer, free_port};
use crate::store::StoreConfig;

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);
/// Bound for every wait on an outage or a recovery.
const WITHIN: Duration = Duration::from_secs(15);
/// Slack over the command timeout for a busy 2-core machine.
const SLACK: Duration = Duration::from_millis(400);

fn timeouts() -> RedisTimeouts {
    RedisTimeouts {
        connect: 200 * MS,
        command: 100 * MS,
        admin: 200 * MS,
        probe_interval: 20 * MS,
    }
}

fn stores(rules: &[u64]) -> RuleStores {
    let rules: Vec<_> = rules
        .iter()
        .map(|&fp| (RuleFingerprint(fp), StoreConfig::with_max_keys(10_000)))
        .collect();
    RuleStores::build(&rules, None).unwrap()
}

fn shared(url: &str, rules: &[u64], clock: Arc<ManualClock>) -> SharedLimiter {
    let redis = RedisLimiter::new(url, "weir:test:", timeouts()).unwrap();
    SharedLimiter::new(redis, stores(rules), clock)
}

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(MonoTime::ZERO + 1000 * S))
}

async fn connected(limiter: &SharedLimiter) {
    assert!(
        limiter.wait_for_redis(WITHIN).await,
        "redis not in use within {WITHIN:?}: {:?}",
        limiter.stats()
    );
}

/// Polls `cond` every 10 ms until it holds or `WITHIN` passes.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WITHIN;
    while !cond() {
        assert!(Instant::now() < deadline, "not within {WITHIN:?}: {what}");
        tokio::time::sleep(10 * MS).await;
    }
}

/// A check that must answer within the command timeout (plus slack).
async fn timed_check(limiter: &SharedLimiter, rule: u64, key: u64, quota: &Quota) -> Decided {
    let started = Instant::now();
    let decided = limiter.check(RuleFingerprint(rule), key, quota, 1).await;
    let took = started.elapsed();
    assert!(
        took < timeouts().command + SLACK,
        "check took {took:?} with a {:?} command timeout",
        timeouts().command
    );
    decided
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_admit_exactly_the_quota_together() {
    let server = RedisServer::start();
    // Without leases: exact (leases may hold a few tokens back for a period).
    let exact = |url: &str| {
        let redis = RedisLimiter::new(url, "weir:test:", timeouts()).unwrap();
        Arc::new(SharedLimiter::with_lease_period(
            redis,
            stores(&[1]),
            clock(),
            Duration::ZERO,
        ))
    };
    let a = exact(&server.url());
    let b = exact(&server.url());
    connected(&a).await;
    connected(&b).await;
    // 50 per hour, burst 50; 200 attempts at once, half through each.
    let quota = Quota::new(50, 3600 * S, 50).unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let limiter = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.spawn(async move { limiter.check(RuleFingerprint(1), 77, &quota, 1).await });
    }
    let mut admitted = 0;
    while let Some(decided) = tasks.join_next().await {
        let decided = decided.unwrap();
        if decided.outcome.is_allowed() {
            admitted += 1;
            assert_eq!(decided.source, Source::Redis);
        } else {
            assert_ne!(decided.source, Source::LocalFallback, "{decided:?}");
        }
    }
    assert_eq!(admitted, 50);
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa.fallback_decisions + sb.fallback_decisions, 0);
    assert_eq!(sa.redis_errors + sb.redis_errors, 0);
    assert_eq!(
        a.redis().count_keys("", RuleFingerprint(1)).await.unwrap(),
        1
    );
}

#[tokio::test]
async fn killed_redis_falls_back_within_the_timeout_and_recovers() {
    let mut server = RedisServer::start();
    let limiter = shared(&server.url(), &[1], clock());
    connected(&limiter).await;
    let quota = Quota::new(1000, 3600 * S, 1000).unwrap();
    for key in 0..20 {
        let decided = timed_check(&limiter, 1, key, &quota).await;
        assert_eq!(decided.source, Source::Redis);
        assert!(decided.outcome.is_allowed());
    }

    server.kill();
    let mut sources = Vec::new();
    for key in 0..50 {
        let decided = timed_check(&limiter, 1, key, &quota).await;
        assert!(
            decided.outcome.is_allowed(),
            "never fail closed: {decided:?}"
        );
        sources.push(decided.source);
    }
    assert!(limiter.fallback_active());
    assert!(
        sources.iter().skip(1).all(|&s| s == Source::LocalFallback),
        "{sources:?}"
    );
    let stats = limiter.stats();
    assert!(
        stats.redis_errors >= 1 && stats.fallback_decisions >= 49,
        "{stats:?}"
    );
    assert_eq!(stats.outages, 1, "one outage, logged once");

    server.restart();
    eventually("recovery after restart", || !limiter.fallback_active()).await;
    let decided = timed_check(&limiter, 1, 1000, &quota).await;
    assert_eq!(decided.source, Source::Redis);
    let stats = limiter.stats();
    assert_eq!(stats.outages, 1);
    assert!(!stats.fallback_active);
}

#[tokio::test]
async fn stalled_redis_falls_back_within_the_timeout_and_recovers() {
    let server = RedisServer::start();
    let limiter = shared(&server.url(), &[1], clock());
    connected(&limiter).await;
    let quota = Quota::new(1000, 3600 * S, 1000).unwrap();
    assert_eq!(
        timed_check(&limiter, 1, 1, &quota).await.source,
        Source::Redis
    );
    server.pause();
    for key in 0..10 {
        let decided = timed_check(&limiter, 1, key, &quota).await;
        assert_eq!(decided.source, Source::LocalFallback);
        assert!(decided.outcome.is_allowed());
    }
    server.resume();
    eventually("recovery after resume", || !limiter.fallback_active()).await;
    assert_eq!(
        timed_check(&limiter, 1, 1, &quota).await.source,
        Source::Redis
    );
}

#[tokio::test]
async fn fallback_carries_on_from_the_shared_state() {
    let mut server = RedisServer::start();
    let limiter = shared(&server.url(), &[1], clock());
    connected(&limiter).await;
    let quota = Quota::new(3, 3600 * S, 3).unwrap();
    for _ in 0..3 {
        let decided = limiter.check(RuleFingerprint(1), 5, &quota, 1).await;
        assert_eq!(decided.source, Source::Redis);
        assert!(decided.outcome.is_allowed());
    }
    server.kill();
    // The burst was spent in Redis; the local store knows it, so the outage
    // does not hand this client a fresh bucket.
    let decided = timed_check(&limiter, 1, 5, &quota).await;
    assert!(!decided.outcome.is_allowed(), "{decided:?}");
    assert_ne!(decided.source, Source::Redis);
    let other_key = limiter.check(RuleFingerprint(1), 6, &quota, 1).await;
    assert_eq!(other_key.source, Source::LocalFallback);
    assert!(other_key.outcome.is_allowed());
}

#[tokio::test]
async fn mirror_refuses_locally_until_retry_after() {
    let server = RedisServer::start();
    let clock = clock();
    let limiter = shared(&server.url(), &[1], clock.clone());
    connected(&limiter).await;
    let quota = Quota::new(1, 3600 * S, 1).unwrap();
    let first = limiter.check(RuleFingerprint(1), 9, &quota, 1).await;
    assert_eq!(first.source, Source::Redis);
    assert!(first.outcome.is_allowed());
    let second = limiter.check(RuleFingerprint(1), 9, &quota, 1).await;
    assert_eq!(second.source, Source::Local);
    match second.outcome {
        Outcome::Rejected { retry_after, .. } => {
            // Never later than Redis's own answer (an hour less a little).
            assert!(
                retry_after <= 3600 * S && retry_after > 3590 * S,
                "{retry_after:?}"
            );
        }
        other => panic!("expected a local rejection, got {other:?}"),
    }
    let stats = limiter.stats();
    assert_eq!((stats.redis_ok, stats.local_rejections), (1, 1));
    // Once the mirror's retry_after has passed here, Redis is asked again
    // (its clock has not moved an hour, so it still refuses).
    clock.advance(3600 * S);
    let third = limiter.check(RuleFingerprint(1), 9, &quota, 1).await;
    assert_eq!(third.source, Source::Redis);
    assert!(!third.outcome.is_allowed());
    assert_eq!(limiter.stats().redis_ok, 2);
}

#[tokio::test]
async fn start_up_with_redis_down_decides_locally_at_once() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}/");
    let started = Instant::now();
    let limiter = shared(&url, &[1], clock());
    assert!(
        started.elapsed() < S,
        "start-up waited {:?}",
        started.elapsed()
    );
    let quota = Quota::new(2, 3600 * S, 2).unwrap();
    let outcomes: Vec<Decided> = [
        timed_check(&limiter, 1, 3, &quota).await,
        timed_check(&limiter, 1, 3, &quota).await,
        timed_check(&limiter, 1, 3, &quota).await,
    ]
    .into();
    assert!(outcomes.iter().all(|d| d.source == Source::LocalFallback));
    let allowed: Vec<bool> = outcomes.iter().map(|d| d.outcome.is_allowed()).collect();
    assert_eq!(allowed, [true, true, false], "local limits hold meanwhile");
    eventually("start-up outage noted", || limiter.stats().outages == 1).await;
    assert!(!limiter.wait_for_redis(50 * MS).await);

    // Redis comes up later: the limiter finds it by itself.
    let _server = RedisServer::start_on(port);
    connected(&limiter).await;
    let decided = limiter.check(RuleFingerprint(1), 4, &quota, 1).await;
    assert_eq!(decided.source, Source::Redis);
    assert_eq!(limiter.stats().outages, 1);
}

#[tokio::test]
async fn local_path_is_all_or_nothing_across_four_rules() {
    let limiter = shared(
        &format!("redis://127.0.0.1:{}/", free_port()),
        &[1, 2, 3, 4],
        clock(),
    );
    let wide = Quota::new(10, 100 * S, 10).unwrap(); // T = 10 s
    let narrow = Quota::new(1, 100 * S, 1).unwrap();
    let quotas = [&wide, &wide, &wide, &narrow];
    let checks = |n: usize| -> Vec<RuleCheck<'_>> {
        (0..n)
            .map(|i| RuleCheck {
                label: "",
                rule: RuleFingerprint(1 + i as u64),
                key: 0xabc,
                quota: quotas[i],
                cost: 1,
            })
            .collect()
    };
    let outcomes = |d: Vec<Decided>| -> Vec<Outcome> {
        assert!(d.iter().all(|d| d.source == Source::LocalFallback), "{d:?}");
        d.into_iter().map(|d| d.outcome).collect()
    };
    let allowed = |remaining, reset| Outcome::Allowed { remaining, reset };
    let first = outcomes(limiter.check_all(&checks(4)).await);
    assert_eq!(first[..3], [allowed(9, 10 * S); 3]);
    assert!(all_allowed(&limiter.check_all(&checks(3)).await));
    let second = limiter.check_all(&checks(4)).await;
    assert!(!all_allowed(&second));
    assert_eq!(
        outcomes(second),
        vec![
            allowed(8, 20 * S),
            allowed(8, 20 * S),
            allowed(8, 20 * S),
            Outcome::Rejected {
                retry_after: 100 * S,
                reset: 100 * S
            }
        ]
    );
    let third = outcomes(limiter.check_all(&checks(3)).await);
    assert_eq!(
        third,
        vec![allowed(7, 30 * S); 3],
        "the refused call charged nothing"
    );
}

#[tokio::test]
async fn unknown_rule_is_decided_as_a_fresh_key_and_counted() {
    let limiter = shared(
        &format!("redis://127.0.0.1:{}/", free_port()),
        &[1],
        clock(),
    );
    let quota = Quota::new(1, 3600 * S, 1).unwrap();
    for _ in 0..3 {
        let decided = limiter.check(RuleFingerprint(999), 1, &quota, 1).await;
        assert!(decided.outcome.is_allowed());
    }
    assert!(limiter.stats().unknown_rules >= 3);
}

#[test]
fn source_names_are_stable_labels() {
    let cases = [
        (Source::Redis, "redis"),
        (Source::Local, "local"),
        (Source::LocalFallback, "local_fallback"),
        (Source::Lease, "lease"),
    ];
    for (source, name) in cases {
        assert_eq!(source.as_str(), name);
    }
}

/// `rounds` rounds of 90 concurrent requests for one key, 30 through each
/// of `fleet`: how many were admitted.
async fn hot_key_rounds(fleet: &[Arc<SharedLimiter>], quota: Quota, rounds: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..rounds {
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..90 {
            let limiter = fleet[i % fleet.len()].clone();
            tasks.spawn(async move { limiter.check(RuleFingerprint(1), 5, &quota, 1).await });
        }
        while let Some(decided) = tasks.join_next().await {
            let decided = decided.unwrap();
            assert_ne!(decided.source, Source::LocalFallback, "{decided:?}");
            admitted += usize::from(decided.outcome.is_allowed());
        }
    }
    admitted
}

async fn fleet_of_three(server: &RedisServer) -> Vec<Arc<SharedLimiter>> {
    let fleet: Vec<Arc<SharedLimiter>> = (0..3)
        .map(|_| Arc::new(shared(&server.url(), &[1], clock())))
        .collect();
    for limiter in &fleet {
        connected(limiter).await;
    }
    fleet
}

/// Three instances, one hot key well under its limit: most decisions come
/// from leases, with no round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_decide_a_hot_key_without_round_trips() {
    let server = RedisServer::start();
    let fleet = fleet_of_three(&server).await;
    let quota = Quota::new(100_000, 3600 * S, 100_000).unwrap();
    assert_eq!(hot_key_rounds(&fleet, quota, 60).await, 5400);
    let stats: Vec<SharedStats> = fleet.iter().map(|l| l.stats()).collect();
    let round_trips: u64 = stats.iter().map(|s| s.redis_ok).sum();
    assert!(
        round_trips * 3 < 5400,
        "{round_trips} round trips for 5400 requests: {stats:?}"
    );
}

/// Three instances, one hot key pushed past its limit: together they admit
/// exactly the limit, never more (a lease is charged in Redis before it is
/// spent, and none is granted past half the burst).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_leases_the_fleet_admits_exactly_the_limit() {
    let server = RedisServer::start();
    let fleet = fleet_of_three(&server).await;
    let quota = Quota::new(2000, 3600 * S, 2000).unwrap();
    let admitted = hot_key_rounds(&fleet, quota, 40).await;
    let stats: Vec<SharedStats> = fleet.iter().map(|l| l.stats()).collect();
    assert_eq!(admitted, 2000, "{stats:?}");
    assert!(
        stats.iter().map(|s| s.lease_decisions).sum::<u64>() > 300,
        "{stats:?}"
    );
}

/// Tokens one instance leased and did not spend go back after a period, so
/// another instance can spend the whole rest of the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_leased_tokens_go_back_to_the_fleet() {
    let server = RedisServer::start();
    let clock_a = clock();
    let a = shared(&server.url(), &[1], clock_a.clone());
    let b = shared(&server.url(), &[1], clock());
    connected(&a).await;
    connected(&b).await;
    let quota = Quota::new(80, 3600 * S, 80).unwrap(); // leases of up to 10
    for _ in 0..4 {
        assert!(
            a.check(RuleFingerprint(1), 6, &quota, 1)
                .await
                .outcome
                .is_allowed()
        );
    }
    let leased = a.stats().leased_tokens;
    assert!(leased > 0, "{:?}", a.stats());
    // A's clock passes the lease period; its return loop gives back.
    clock_a.advance(lease::DEFAULT_PERIOD + 10 * MS);
    eventually("a's unused tokens given back", || {
        a.stats().returned_tokens > 0
    })
    .await;
    let spent_from_lease = a.stats().lease_decisions;
    assert_eq!(a.stats().returned_tokens + spent_from_lease, leased);
    let mut admitted_b = 0;
    while b
        .check(RuleFingerprint(1), 6, &quota, 1)
        .await
        .outcome
        .is_allowed()
    {
        admitted_b += 1;
        assert!(admitted_b <= 80);
    }
    // What B holds in its own lease when refused, it could still spend.
    assert_eq!(admitted_b, 80 - 4, "b: {:?}", b.stats());
}
