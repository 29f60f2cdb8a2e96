//! Decisions per second and added latency of the Redis limiter, against the
//! local store in the same run.
//!
//! A request is checked against 4 rules (address, /24, /16, site-wide) with
//! quotas large enough that every request is admitted, so every Redis call
//! reads and writes 4 keys (the expensive path). Addresses cycle through
//! 65,536 keys. Redis is a local `redis-server` on loopback started by this
//! bench (persistence off), so the numbers are the floor of a real network:
//! add the network's round trip to every Redis latency below.
//!
//! Contenders, each for a fixed number of requests:
//! - `local`: 4 `ShardedStore::check` calls, the limiter without Redis.
//! - `redis 1 rule`: one `RedisLimiter::check` (one key per round trip).
//! - `redis 4 rules, 4 trips`: the 4 rules as 4 sequential round trips.
//! - `redis 4 rules, 1 trip`: `RedisLimiter::check_all`, one script call.
//! - `shared`: `SharedLimiter::check_all` (local mirror pre-check, one
//!   script call, mirror update), sequential and from 32 concurrent tasks
//!   sharing the instance's one multiplexed connection (so commands are
//!   pipelined on the socket).
//!
//! Printed: requests/s, rule decisions/s (requests x rules) and per-request
//! latency p50/p99. Simple timed loops rather than criterion: latency
//! percentiles of an I/O path are the point, and criterion reports means.
//! Run: `cargo bench --bench redis` (needs `redis-server` on PATH, or
//! `WEIR_REDIS_SERVER`).
//!
//! Measured (redis-server 7.0.15, 2-core VM shared with other builds, three
//! runs, range): local 4.3-5.4 M req/s, p50 110-150 ns; redis 1 rule p50
//! 46-123 us; 4 rules as 4 trips p50 362-523 us; 4 rules in one
//! `check_all` 6.4-14.6 k req/s, p50 62-146 us, p99 140-390 us; shared
//! sequential 6.8-13.0 k req/s, p50 68-132 us, p99 165-368 us; shared with
//! 32 tasks 30-40 k req/s (120-160 k rule decisions/s), p50 0.73-0.97 ms,
//! p99 1.9-2.9 ms. Redis (single-threaded) and the bench share 2 cores.

#![allow(clippy::too_many_lines, reason = "a test or bench reads as one story")]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_limiter::redis::{RedisLimiter, RedisTimeouts, RuleCheck};
use weir_limiter::shared::{SharedLimiter, all_allowed};
use weir_limiter::{Clock, MonotonicClock, Quota, RuleFingerprint, RuleStores, StoreConfig, key};

const SEQUENTIAL: usize = 20_000;
const TASKS: usize = 32;
const PER_TASK: usize = 2_000;
const ADDRESSES: u64 = 65_536;
const RULES: [RuleFingerprint; 4] = [
    RuleFingerprint(0xadd7),
    RuleFingerprint(0x0024),
    RuleFingerprint(0x0016),
    RuleFingerprint(0x5175),
];

struct RedisProcess(Child);

impl Drop for RedisProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis(dir: &std::path::Path) -> (RedisProcess, u16) {
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let binary = std::env::var("WEIR_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
    let child = Command::new(&binary)
        .args(["--save", "", "--appendonly", "no", "--bind", "127.0.0.1"])
        .args(["--port", &port.to_string()])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start `{binary}` (install redis-server): {e}"));
    let process = RedisProcess(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pong = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).and_then(|mut s| {
            s.write_all(b"PING\r\n")?;
            let mut reply = [0u8; 7];
            s.read_exact(&mut reply)?;
            Ok(reply)
        });
        if matches!(pong, Ok(r) if &r == b"+PONG\r\n") {
            return (process, port);
        }
        assert!(Instant::now() < deadline, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn quotas() -> [Quota; 4] {
    let hour = Duration::from_secs(3600);
    [
        Quota::new(1_000_000, hour, 1_000_000).unwrap(),
        Quota::new(10_000_000, hour, 10_000_000).unwrap(),
        Quota::new(100_000_000, hour, 100_000_000).unwrap(),
        Quota::new(1_000_000_000, hour, 1_000_000_000).unwrap(),
    ]
}

fn checks(quotas: &[Quota; 4], i: u64) -> [RuleCheck<'_>; 4] {
    let ip = 0x0a00_0000 + (i.wrapping_mul(0x9E37_79B1) % ADDRESSES);
    let digests = [ip, ip >> 8, ip >> 16, 0];
    std::array::from_fn(|r| RuleCheck {
        label: "",
        rule: RULES[r],
        key: key(r as u32, 0, digests[r]),
        quota: &quotas[r],
        cost: 1,
    })
}

struct Run {
    name: &'static str,
    rules: usize,
    requests: usize,
    wall: Duration,
    latencies: Vec<Duration>,
}

impl Run {
    fn print(&mut self, baseline_p50: Option<Duration>) {
        self.latencies.sort_unstable();
        let pct = |p: f64| self.latencies[((self.latencies.len() - 1) as f64 * p) as usize];
        let per_s = self.requests as f64 / self.wall.as_secs_f64();
        let added = baseline_p50
            .map(|b| format!("  (+{:?} p50 over local)", pct(0.5).saturating_sub(b)))
            .unwrap_or_default();
        println!(
            "{:<34} {:>10.0} req/s {:>11.0} decisions/s   p50 {:>9.1?}   p99 {:>9.1?}{added}",
            self.name,
            per_s,
            per_s * self.rules as f64,
            pct(0.5),
            pct(0.99),
        );
    }
}

async fn sequential<F, Fut>(name: &'static str, rules: usize, mut request: F) -> Run
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    // Warm-up: connections, script cache, store tables.
    for i in 0..1_000 {
        assert!(request(i).await, "{name}: warm-up request refused");
    }
    let mut latencies = Vec::with_capacity(SEQUENTIAL);
    let started = Instant::now();
    for i in 0..SEQUENTIAL as u64 {
        let t = Instant::now();
        let admitted = request(i).await;
        latencies.push(t.elapsed());
        assert!(admitted, "{name}: request {i} refused");
    }
    Run {
        name,
        rules,
        requests: SEQUENTIAL,
        wall: started.elapsed(),
        latencies,
    }
}

fn main() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (_redis, port) = start_redis(dir.path());
    let url = format!("redis://127.0.0.1:{port}/");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run(url));
}

async fn run(url: String) {
    let quotas = quotas();
    let clock = MonotonicClock;
    let local_rules = || {
        let rules: Vec<_> = RULES
            .iter()
            .map(|&fp| (fp, StoreConfig::with_max_keys(1 << 20)))
            .collect();
        RuleStores::build(&rules, None).expect("stores")
    };
    println!(
        "4 rules per request; redis-server on loopback; {SEQUENTIAL} sequential requests, \
         {TASKS} tasks x {PER_TASK} concurrent"
    );

    let stores = local_rules();
    let mut local = sequential("local (4 ShardedStore checks)", 4, |i| {
        let now = clock.now();
        let admitted = checks(&quotas, i).iter().enumerate().all(|(r, c)| {
            stores
                .store(r as u32)
                .unwrap()
                .check(c.key, c.quota, now, 1)
                .is_allowed()
        });
        std::future::ready(admitted)
    })
    .await;
    local.print(None);
    local.latencies.sort_unstable();
    let base = Some(local.latencies[local.latencies.len() / 2]);

    let redis = RedisLimiter::new(&url, "weir:bench:", RedisTimeouts::default()).expect("limiter");
    let redis = &redis;
    sequential("redis 1 rule (1 key, 1 trip)", 1, |i| async move {
        let c = checks(&quotas, i)[0];
        redis
            .check(c.rule, c.key, c.quota, 1)
            .await
            .expect("redis")
            .is_allowed()
    })
    .await
    .print(base);
    sequential("redis 4 rules, 4 trips", 4, |i| async move {
        let mut admitted = true;
        for c in checks(&quotas, i) {
            admitted &= redis
                .check(c.rule, c.key, c.quota, 1)
                .await
                .expect("redis")
                .is_allowed();
        }
        admitted
    })
    .await
    .print(base);
    sequential("redis 4 rules, 1 trip (check_all)", 4, |i| async move {
        let outcomes = redis.check_all(&checks(&quotas, i)).await.expect("redis");
        outcomes.iter().all(|o| o.is_allowed())
    })
    .await
    .print(base);

    let shared_limiter = Arc::new(SharedLimiter::new(
        RedisLimiter::new(&url, "weir:bench:shared:", RedisTimeouts::default()).expect("limiter"),
        local_rules(),
        Arc::new(MonotonicClock),
    ));
    assert!(
        shared_limiter.wait_for_redis(Duration::from_secs(5)).await,
        "redis not in use"
    );
    let shared = &shared_limiter;
    sequential("shared check_all, sequential", 4, |i| async move {
        all_allowed(&shared.check_all(&checks(&quotas, i)).await)
    })
    .await
    .print(base);

    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..TASKS as u64 {
        let shared = shared_limiter.clone();
        tasks.spawn(async move {
            let quotas = self::quotas();
            let mut latencies = Vec::with_capacity(PER_TASK);
            for i in 0..PER_TASK as u64 {
                let t0 = Instant::now();
                let admitted =
                    all_allowed(&shared.check_all(&checks(&quotas, t * 100_003 + i)).await);
                latencies.push(t0.elapsed());
                assert!(admitted, "concurrent request refused");
            }
            latencies
        });
    }
    let mut latencies = Vec::with_capacity(TASKS * PER_TASK);
    while let Some(task) = tasks.join_next().await {
        latencies.extend(task.expect("bench task"));
    }
    Run {
        name: "shared check_all, 32 tasks",
        rules: 4,
        requests: TASKS * PER_TASK,
        wall: started.elapsed(),
        latencies,
    }
    .print(base);
    let stats = shared_limiter.stats();
    assert_eq!(
        stats.fallback_decisions, 0,
        "fell back during the bench: {stats:?}"
    );
    println!("shared stats: {stats:?}");
}
