//! Tests against a real `redis-server` (see [`super::testing`]).

use std::time::{Duration, Instant};

use redis::AsyncCommands;

use super::testing::{RedisServer, free_port};
use super::*;
use crate::gcra::MonoTime;

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);
const NS: Duration = Duration::from_nanos(1);

fn limiter(server: &RedisServer, prefix: &str) -> RedisLimiter {
    let timeouts = RedisTimeouts {
        // Generous for a loaded CI machine: these tests are about answers.
        command: Duration::from_secs(2),
        ..RedisTimeouts::default()
    };
    RedisLimiter::new(&server.url(), prefix, timeouts).expect("limiter")
}

async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

fn allowed(remaining: u32, reset: Duration) -> Outcome {
    Outcome::Allowed { remaining, reset }
}

fn rejected(retry_after: Duration, reset: Duration) -> Outcome {
    Outcome::Rejected { retry_after, reset }
}

/// One case: a quota and steps (time since the first step, cost). Periods
/// are long because keys expire on Redis's real clock while the script's
/// clock is the test's.
type Case = ((u32, Duration, u32), &'static [(Duration, u32)]);

const Z: Duration = Duration::ZERO;

const CASES: &[Case] = &[
    // burst 3 at one per 10 s: burst, reject, exact retry_after, 1 ns early
    (
        (10, Duration::from_secs(100), 3),
        &[
            (Z, 1),
            (Z, 1),
            (Z, 1),
            (Z, 1),
            (Duration::from_secs(5), 1),
            (Duration::from_nanos(9_999_999_999), 1),
            (Duration::from_secs(10), 1),
            (Duration::from_secs(10), 1),
        ],
    ),
    // steady rate, no burst: on time allowed, early rejected
    (
        (1, Duration::from_secs(20), 1),
        &[
            (Z, 1),
            (Duration::from_secs(10), 1),
            (Duration::from_secs(20), 1),
            (Duration::from_secs(40), 1),
            (Duration::from_secs(59), 1),
            (Duration::from_secs(60), 1),
        ],
    ),
    // costs, cost 0 reads, cost above burst
    (
        (10, Duration::from_secs(100), 5),
        &[
            (Z, 3),
            (Z, 3),
            (Z, 0),
            (Z, 2),
            (Z, 6),
            (Duration::from_secs(50), 5),
            (Duration::from_secs(50), 0),
        ],
    ),
    // T not a whole number of anything: 333.333333334 s
    (
        (3, Duration::from_secs(1000), 2),
        &[
            (Z, 1),
            (Z, 1),
            (Z, 1),
            (Duration::from_nanos(333_333_333_333), 1),
            (Duration::from_nanos(333_333_333_334), 1),
        ],
    ),
    // a day's window, refilled after a day
    (
        (2, Duration::from_secs(86_400), 2),
        &[
            (Z, 1),
            (Z, 1),
            (Z, 1),
            (Duration::from_secs(86_400), 1),
            (Duration::from_secs(86_400), 1),
        ],
    ),
];

#[tokio::test]
async fn lua_gcra_matches_quota_check_step_by_step() {
    let server = RedisServer::start();
    let redis = limiter(&server, "weir:test:");
    let unix_start = unix_now_ns();
    let mono_start = MonoTime::from_nanos(1_000 * 1_000_000_000);
    for (case, &((count, period, burst), steps)) in CASES.iter().enumerate() {
        let quota = Quota::new(count, period, burst).unwrap();
        let rule = RuleFingerprint(case as u64);
        let mut tat = MonoTime::ZERO;
        for (step, &(at, cost)) in steps.iter().enumerate() {
            let want = quota.check(&mut tat, mono_start + at, cost);
            let check = RuleCheck {
                label: "",
                rule,
                key: 42,
                quota: &quota,
                cost,
            };
            let now = unix_start + u64::try_from(at.as_nanos()).unwrap();
            let got = redis.check_all_at(&[check], Some(now)).await.unwrap();
            assert_eq!(got, vec![want], "case {case} step {step} at +{at:?}");
        }
    }
}

#[test]
fn cases_cover_every_kind_of_outcome() {
    // The table above would prove little if the local answers were all alike.
    let mut kinds = [false; 3];
    for &((count, period, burst), steps) in CASES {
        let quota = Quota::new(count, period, burst).unwrap();
        let mut tat = MonoTime::ZERO;
        for &(at, cost) in steps {
            let i = match quota.check(&mut tat, MonoTime::ZERO + S + at, cost) {
                Outcome::Allowed { .. } => 0,
                Outcome::Rejected { .. } => 1,
                Outcome::CostExceedsBurst { .. } => 2,
            };
            kinds[i] = true;
        }
    }
    assert_eq!(kinds, [true; 3]);
}

#[tokio::test]
async fn server_clock_answers_match_within_a_millisecond() {
    let server = RedisServer::start();
    let redis = limiter(&server, "weir:test:");
    // 1 per second, burst 3: T = 1 s, long enough that a stalled test
    // machine cannot refill a request between the calls.
    let quota = Quota::new(1, S, 3).unwrap();
    let started = Instant::now();
    let mut outcomes = Vec::new();
    for _ in 0..4 {
        outcomes.push(redis.check(RuleFingerprint(1), 7, &quota, 1).await.unwrap());
    }
    let elapsed = started.elapsed();
    // Redis's clock moved less than ours between the first and last call.
    let within = |d: Duration, ideal: Duration| d <= ideal && d + elapsed + MS >= ideal;
    assert_eq!(outcomes[0], allowed(2, S), "fresh key: exact");
    match (outcomes[1], outcomes[2], outcomes[3]) {
        (
            Outcome::Allowed {
                remaining: 1,
                reset: r1,
            },
            Outcome::Allowed {
                remaining: 0,
                reset: r2,
            },
            Outcome::Rejected { retry_after, reset },
        ) => {
            assert!(within(r1, 2 * S), "{r1:?}");
            assert!(within(r2, 3 * S), "{r2:?}");
            assert!(within(retry_after, S), "{retry_after:?}");
            assert!(within(reset, 3 * S), "{reset:?}");
        }
        other => panic!("unexpected outcomes {other:?}"),
    }
}

#[tokio::test]
async fn all_or_nothing_across_four_rules() {
    let server = RedisServer::start();
    let redis = limiter(&server, "weir:test:");
    let wide = Quota::new(10, 100 * S, 10).unwrap(); // T = 10 s
    let narrow = Quota::new(1, 100 * S, 1).unwrap(); // T = τ = 100 s
    let quotas = [&wide, &wide, &wide, &narrow];
    let checks = |n: usize| -> Vec<RuleCheck<'_>> {
        (0..n)
            .map(|i| RuleCheck {
                label: "",
                rule: RuleFingerprint(100 + i as u64),
                key: 0xabc,
                quota: quotas[i],
                cost: 1,
            })
            .collect()
    };
    let now = unix_now_ns();
    let first = redis.check_all_at(&checks(4), Some(now)).await.unwrap();
    assert_eq!(
        first,
        vec![
            allowed(9, 10 * S),
            allowed(9, 10 * S),
            allowed(9, 10 * S),
            allowed(0, 100 * S)
        ]
    );
    let mut conn = raw(&server).await;
    let names: Vec<String> = checks(4)
        .iter()
        .map(|c| redis.key_name("", c.rule, c.key))
        .collect();
    let before: Vec<Option<String>> = conn.mget(&names).await.unwrap();
    assert!(before.iter().all(Option::is_some));
    // The narrow rule refuses: the three wide ones report their state as
    // it is and are not charged.
    let second = redis.check_all_at(&checks(4), Some(now)).await.unwrap();
    assert_eq!(
        second,
        vec![
            allowed(9, 10 * S),
            allowed(9, 10 * S),
            allowed(9, 10 * S),
            rejected(100 * S, 100 * S)
        ]
    );
    let after: Vec<Option<String>> = conn.mget(&names).await.unwrap();
    assert_eq!(before, after, "a refused request wrote nothing");
    // Without the narrow rule the wide ones are charged once more, not twice.
    let third = redis.check_all_at(&checks(3), Some(now)).await.unwrap();
    assert_eq!(third, vec![allowed(8, 20 * S); 3]);
}

#[tokio::test]
async fn a_key_checked_twice_in_one_call_counts_twice() {
    let server = RedisServer::start();
    let redis = limiter(&server, "weir:test:");
    let quota = Quota::new(2, 100 * S, 2).unwrap();
    let check = RuleCheck {
        label: "",
        rule: RuleFingerprint(1),
        key: 1,
        quota: &quota,
        cost: 1,
    };
    let now = unix_now_ns();
    let got = redis
        .check_all_at(&[check, check], Some(now))
        .await
        .unwrap();
    assert_eq!(got, vec![allowed(1, 50 * S), allowed(0, 100 * S)]);
    let got = redis.check_all_at(&[check], Some(now)).await.unwrap();
    assert_eq!(got, vec![rejected(50 * S, 100 * S)]);
}

#[tokio::test]
async fn keys_expire_when_their_tat_passes_and_rejections_write_nothing() {
    let server = RedisServer::start();
    let redis = limiter(&server, "weir:test:");
    let quota = Quota::new(1, S, 3).unwrap(); // T = 1 s
    let name = redis.key_name("", RuleFingerprint(9), 5);
    let mut conn = raw(&server).await;
    let before_ns = unix_now_ns();
    redis.check(RuleFingerprint(9), 5, &quota, 3).await.unwrap();
    let pttl: i64 = conn.pttl(&name).await.unwrap();
    assert!(
        (1..=3000).contains(&pttl),
        "PTTL {pttl} ms, TAT is 3 s ahead"
    );
    let value: String = conn.get(&name).await.unwrap();
    let tat: u64 = value.parse().expect("TAT is decimal ns");
    assert!(
        tat >= before_ns + 3_000_000_000 && tat <= unix_now_ns() + 3_000_000_000,
        "TAT {tat} not 3 s after the call"
    );
    let refused = redis.check(RuleFingerprint(9), 5, &quota, 1).await.unwrap();
    assert!(!refused.is_allowed());
    let unchanged: String = conn.get(&name).await.unwrap();
    assert_eq!(unchanged, value);
    // Cost-0 reads of an absent key write nothing either.
    redis.check(RuleFingerprint(9), 6, &quota, 0).await.unwrap();
    let absent: Option<String> = conn
        .get(redis.key_name("", RuleFingerprint(9), 6))
        .await
        .unwrap();
    assert_eq!(absent, None);
}

#[tokio::test]
async fn prefix_round_trip_counts_exactly_what_was_written() {
    let server = RedisServer::start();
    // Glob characters in the prefix must match themselves only.
    let blue = limiter(&server, "weir[blue]*:");
    let other = limiter(&server, "weir[blue]x:");
    let quota = Quota::new(10, 100 * S, 10).unwrap();
    let (a, b) = (RuleFingerprint(0xaaaa), RuleFingerprint(0xbbbb));
    for key in 0..25u64 {
        blue.check(a, key, &quota, 1).await.unwrap();
    }
    for key in 0..7u64 {
        blue.check(b, key, &quota, 1).await.unwrap();
        other.check(a, key, &quota, 1).await.unwrap();
    }
    // A new instance with the same prefix, as after a blue/green swap.
    let green = limiter(&server, "weir[blue]*:");
    assert_eq!(green.count_keys("", a).await.unwrap(), 25);
    assert_eq!(green.count_keys("", b).await.unwrap(), 7);
    assert_eq!(green.count_all_keys().await.unwrap(), 32);
    assert_eq!(other.count_keys("", a).await.unwrap(), 7);
    assert_eq!(other.count_keys("", b).await.unwrap(), 0);
    let unrelated = limiter(&server, "weir:");
    assert_eq!(unrelated.count_all_keys().await.unwrap(), 0);
}

#[tokio::test]
async fn forgotten_script_is_sent_whole_once() {
    let server = RedisServer::start();
    let redis = limiter(&server, "weir:test:");
    let quota = Quota::new(10, 100 * S, 10).unwrap();
    let mut conn = raw(&server).await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    let outcome = redis.check(RuleFingerprint(1), 1, &quota, 1).await.unwrap();
    assert_eq!(outcome, allowed(9, 10 * S));
    let cached: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(&redis.script_sha)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(cached, vec![true]);
    redis.probe().await.expect("probe loads the script");
}

#[tokio::test]
async fn probe_and_checks_fail_while_redis_refuses_writes() {
    let server = RedisServer::start();
    let redis = limiter(&server, "weir:test:");
    let quota = Quota::new(10, 100 * S, 10).unwrap();
    for _ in 0..3 {
        redis.probe().await.expect("healthy probe");
    }
    let mut conn = raw(&server).await;
    let set_maxmemory = |bytes: &'static str| {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("SET").arg("maxmemory").arg(bytes);
        cmd
    };
    // Out of memory with no eviction: every write is refused (incident 4's
    // Redis). A PING would still pass; the probe must not.
    let _: () = set_maxmemory("1").query_async(&mut conn).await.unwrap();
    // Probes in quick succession, as several instances' would be: each must
    // try to write (a refused probe would write nothing and pass).
    for _ in 0..3 {
        let probe = redis.probe().await.unwrap_err();
        assert!(probe.to_string().contains("OOM"), "{probe}");
    }
    let check = redis.check(RuleFingerprint(1), 1, &quota, 1).await;
    assert!(check.is_err(), "{check:?}");
    let _: () = set_maxmemory("0").query_async(&mut conn).await.unwrap();
    redis.probe().await.expect("probe after memory is back");
    assert_eq!(
        redis.check(RuleFingerprint(1), 1, &quota, 1).await.unwrap(),
        allowed(9, 10 * S)
    );
}

#[tokio::test]
async fn a_stalled_server_times_out_within_the_command_timeout() {
    let server = RedisServer::start();
    let timeouts = RedisTimeouts {
        command: 100 * MS,
        ..RedisTimeouts::default()
    };
    let redis = RedisLimiter::new(&server.url(), "weir:test:", timeouts).unwrap();
    let quota = Quota::new(10, 100 * S, 10).unwrap();
    redis.check(RuleFingerprint(1), 1, &quota, 1).await.unwrap();
    server.pause();
    let started = Instant::now();
    let err = redis
        .check(RuleFingerprint(1), 1, &quota, 1)
        .await
        .unwrap_err();
    let took = started.elapsed();
    server.resume();
    assert!(
        matches!(err, RedisCheckError::Timeout(_)) || err.to_string().contains("timed out"),
        "{err}"
    );
    // The bound, with slack for a busy machine (never the 1 s connect).
    assert!(took < 600 * MS, "took {took:?}");
}

#[tokio::test]
async fn new_returns_at_once_when_nothing_listens() {
    let port = free_port();
    let started = Instant::now();
    let redis = RedisLimiter::new(
        &format!("redis://127.0.0.1:{port}/"),
        "weir:",
        RedisTimeouts::default(),
    )
    .unwrap();
    assert!(started.elapsed() < 100 * MS);
    let quota = Quota::new(1, S, 1).unwrap();
    let err = redis.check(RuleFingerprint(1), 1, &quota, 1).await;
    assert!(err.is_err());
}

#[test]
fn setup_errors_name_the_input() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let long = "p".repeat(MAX_PREFIX_BYTES + 1);
    let cases: [(&str, &str, &str); 4] = [
        ("redis://127.0.0.1/", "", "prefix is empty"),
        ("redis://127.0.0.1/", &long, "129 bytes"),
        ("http://127.0.0.1/", "weir:", "http://127.0.0.1/"),
        (
            "redis://user:s3cret@127.0.0.1:notaport/",
            "weir:",
            "redis://user:***@127.0.0.1:notaport/",
        ),
    ];
    let _entered = runtime.enter();
    for (url, prefix, want) in cases {
        let err = RedisLimiter::new(url, prefix, RedisTimeouts::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{url} {prefix:?}: {err}");
        assert!(!err.contains("s3cret"), "password leaked: {err}");
    }
}

#[test]
fn new_outside_a_runtime_says_so() {
    let err =
        RedisLimiter::new("redis://127.0.0.1/", "weir:", RedisTimeouts::default()).unwrap_err();
    assert!(matches!(err, RedisSetupError::NoRuntime), "{err}");
}

#[test]
fn redact_url_hides_passwords_only() {
    let cases = [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:pw@h:1/", "redis://:***@h:1/"),
        ("redis://u:pw@h:1/", "redis://u:***@h:1/"),
        ("rediss://u:p@w@h/", "rediss://u:***@h/"),
        ("redis://pw@h/", "redis://***@h/"),
        ("redis://h/a@b", "redis://h/a@b"),
        ("not a url", "not a url"),
    ];
    for (url, want) in cases {
        assert_eq!(redact_url(url), want, "{url}");
    }
}

/// Issue 54: no secret in any `Debug`: the primary's password and one in a
/// sentinel's URL.
#[test]
fn sentinel_settings_show_no_password() {
    let settings = SentinelSettings {
        nodes: vec![
            "redis://:node-secret@127.0.0.1:26379".into(),
            "127.0.0.1:26380".into(),
        ],
        master: "m".into(),
        db: 0,
        password: Some("primary-secret".into()),
    };
    let shown = format!("{settings:?}");
    assert!(!shown.contains("secret"), "{shown}");
    assert!(
        shown.contains("127.0.0.1:26379") && shown.contains("***"),
        "{shown}"
    );
}

#[test]
fn key_names_and_patterns_share_one_prefix() {
    let cases = [
        (
            "weir:",
            "",
            1,
            2,
            "weir:0000000000000001:0000000000000002",
            "weir:0000000000000001:",
        ),
        (
            "weir:",
            "anon-expensive:subnet",
            1,
            2,
            "weir:anon-expensive:subnet:0000000000000001:0000000000000002",
            "weir:anon\\-expensive:subnet:0000000000000001:",
        ),
        (
            "a*b?",
            "",
            0xff,
            0,
            "a*b?00000000000000ff:0000000000000000",
            "a\\*b\\?00000000000000ff:",
        ),
        (
            "x[1-2]\\",
            "",
            0,
            0,
            "x[1-2]\\0000000000000000:0000000000000000",
            "x\\[1\\-2\\]\\\\0000000000000000:",
        ),
    ];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    for (prefix, label, rule, key, name, pattern) in cases {
        let redis =
            RedisLimiter::new("redis://127.0.0.1/", prefix, RedisTimeouts::default()).unwrap();
        assert_eq!(redis.key_name(label, RuleFingerprint(rule), key), name);
        let start = rule_prefix(prefix, label, RuleFingerprint(rule), false);
        assert_eq!(glob_escape(&start), pattern);
        assert!(name.starts_with(&start));
    }
}

/// On a cluster the rule's name is each key's hash tag, so the levels of
/// one rule (one script call) share a slot; without a label, the
/// fingerprint is.
#[test]
fn on_a_cluster_a_rules_levels_share_a_hash_slot() {
    let tagged = |label: &str, rule: u64| rule_prefix("weir:", label, RuleFingerprint(rule), true);
    assert_eq!(
        tagged("anon:subnet", 1),
        "weir:{anon}:subnet:0000000000000001:"
    );
    assert_eq!(tagged("", 1), "weir:{0000000000000001}:");
    // The tag is what a cluster hashes: the same for every level of a rule.
    let tag = |name: String| {
        let open = name.find('{').expect("a tag");
        let close = name[open..].find('}').expect("closed") + open;
        name[open + 1..close].to_string()
    };
    assert_eq!(tag(tagged("anon:subnet", 1)), tag(tagged("anon:site", 2)));
    assert!(!rule_prefix("weir:", "anon:subnet", RuleFingerprint(1), false).contains('{'));
}

#[test]
fn key_labels_name_the_rule_and_level_in_safe_characters() {
    let cases = [
        ("anon-expensive", "subnet", "anon-expensive:subnet"),
        ("per ip*", "ip", "per_ip_:ip"),
        ("a:b[1]", "site", "a_b_1_:site"),
        ("v2.api_x", "header", "v2.api_x:header"),
        ("caf\u{e9}", "ip", "caf_:ip"),
    ];
    for (rule, level, want) in cases {
        assert_eq!(key_label(rule, level), want, "{rule}");
    }
}

#[test]
fn cost_above_burst_is_reported_with_the_check_values() {
    let quota = Quota::new(10, S, 5).unwrap();
    let check = RuleCheck {
        label: "",
        rule: RuleFingerprint(1),
        key: 1,
        quota: &quota,
        cost: 6,
    };
    assert_eq!(
        outcome_from_reply(&check, &[2, 0, 0, 0]),
        Outcome::CostExceedsBurst { cost: 6, burst: 5 }
    );
    assert_eq!(
        outcome_from_reply(&check, &[1, 0, 5, -3]),
        rejected(5 * NS, Duration::ZERO),
        "negative values never wrap"
    );
}

/// A lease is granted only out of the half of the bucket furthest from the
/// limit, a quarter of that part at most; a key named twice in one call
/// gets none; tokens given back move the TAT back by as many intervals.
#[tokio::test]
async fn leases_come_from_the_far_half_of_a_bucket_and_go_back() {
    let server = RedisServer::start();
    let redis = limiter(&server, "weir:test:");
    let quota = Quota::new(100, 1000 * S, 100).unwrap(); // T = 10 s
    let check = RuleCheck {
        label: "lease:ip",
        rule: RuleFingerprint(1),
        key: 1,
        quota: &quota,
        cost: 1,
    };
    let now = unix_now_ns();
    // 99 left after the cost, 49 of them above half the burst: 12 leased.
    let got = redis
        .check_all_leasing(&[check], &[50], Some(now))
        .await
        .unwrap();
    assert_eq!(got, vec![(allowed(87, 130 * S), 12)]);
    // 86 left after the cost, 36 above half: 9.
    let got = redis
        .check_all_leasing(&[check], &[50], Some(now))
        .await
        .unwrap();
    assert_eq!(got, vec![(allowed(77, 230 * S), 9)]);
    // Named twice: charged twice, leased nothing.
    let got = redis
        .check_all_leasing(&[check, check], &[50, 50], Some(now))
        .await
        .unwrap();
    assert_eq!(
        got,
        vec![(allowed(76, 240 * S), 0), (allowed(75, 250 * S), 0)]
    );
    // Past half the burst: no lease at all.
    for _ in 0..30 {
        redis.check_all_at(&[check], Some(now)).await.unwrap();
    }
    let got = redis
        .check_all_leasing(&[check], &[50], Some(now))
        .await
        .unwrap();
    assert_eq!(got, vec![(allowed(44, 560 * S), 0)]);
    // The 21 leased tokens back: the TAT 210 s earlier.
    let unused = Unused {
        rule: check.rule,
        label: check.label,
        key: check.key,
        quota: &quota,
        cost: 21,
    };
    redis.give_back(&[unused]).await.unwrap();
    let got = redis.check_all_at(&[check], Some(now)).await.unwrap();
    assert_eq!(got, vec![allowed(64, 360 * S)]);
}
