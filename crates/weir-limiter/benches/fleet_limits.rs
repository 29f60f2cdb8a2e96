//! Decisions per second per instance and Redis calls per request, for a
//! fleet of three instances sharing limits through one Redis node and
//! through a three-node Redis Cluster, with and without leases
//! (`SharedLimiter::with_lease_period`).
//!
//! A request is checked against one rule of three levels (address, /24,
//! site), all admitted (quotas far above the load), in one `check_all`.
//! Three `SharedLimiter`s in this process stand for three instances, each
//! with its own connection; 16 tasks per instance send requests back to
//! back. Two loads:
//! - `busy`: 64 addresses (carrier NATs, office networks): every key is
//!   hot at every instance;
//! - `spread`: 65,536 addresses (a distributed crawl): the address level is
//!   new almost every time, so a request needs its round trip for that
//!   level whatever the leases do.
//!
//! Everything (three instances, the Redis servers, the bench) shares this
//! machine's two cores, so decisions/s are a floor, and Redis's own CPU is
//! what the lease rows save. Run: `cargo bench --bench fleet_limits` (needs
//! `redis-server` and `redis-cli` on PATH).
//!
//! Measured (redis-server 7.0.15, 2-core VM, one run; decisions are
//! requests, three levels each):
//! see bench/README.md, "Shared limits at a fleet's scale".

#![allow(clippy::too_many_lines, reason = "a test or bench reads as one story")]

use std::net::{Ipv4Addr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_limiter::redis::{RedisLimiter, RedisTimeouts, RuleCheck};
use weir_limiter::shared::{SharedLimiter, all_allowed};
use weir_limiter::{MonotonicClock, Quota, RuleFingerprint, RuleStores, StoreConfig, key};

const INSTANCES: usize = 3;
const TASKS_PER_INSTANCE: usize = 16;
const PER_TASK: usize = 600;
const LEVELS: [(RuleFingerprint, &str); 3] = [
    (RuleFingerprint(0xadd7), "fleet:ip"),
    (RuleFingerprint(0x0024), "fleet:s24"),
    (RuleFingerprint(0x5175), "fleet:site"),
];

struct Servers(Vec<Child>);

impl Drop for Servers {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

fn redis_server(dir: &std::path::Path, port: u16, extra: &[&str]) -> Child {
    Command::new("redis-server")
        .args(["--save", "", "--appendonly", "no", "--bind", "127.0.0.1"])
        .args(["--port", &port.to_string()])
        .args(extra)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server on PATH")
}

fn redis_cli(args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(args)
        .output()
        .expect("redis-cli on PATH");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready() {
        assert!(Instant::now() < deadline, "{what} not ready in 20 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One node: its URL.
fn one_node(dir: &std::path::Path, servers: &mut Servers) -> String {
    let port = free_port();
    servers.0.push(redis_server(dir, port, &[]));
    let p = port.to_string();
    wait_for("redis-server", || {
        redis_cli(&["-p", &p, "ping"]).contains("PONG")
    });
    format!("redis://127.0.0.1:{port}/")
}

/// Three cluster nodes, slots spread by `redis-cli --cluster create`.
fn cluster(dir: &std::path::Path, servers: &mut Servers) -> Vec<String> {
    let mut nodes = Vec::new();
    for i in 0..3 {
        let (port, bus) = (free_port(), free_port());
        let node_dir = dir.join(format!("node{i}"));
        std::fs::create_dir_all(&node_dir).expect("node directory");
        let bus = bus.to_string();
        let flags = ["--cluster-enabled", "yes", "--cluster-port", &bus];
        servers.0.push(redis_server(&node_dir, port, &flags));
        let p = port.to_string();
        wait_for("a cluster node", || {
            redis_cli(&["-p", &p, "ping"]).contains("PONG")
        });
        nodes.push(format!("127.0.0.1:{port}"));
    }
    let mut args = vec!["--cluster", "create"];
    args.extend(nodes.iter().map(String::as_str));
    args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
    redis_cli(&args);
    for node in &nodes {
        let port = node.rsplit(':').next().unwrap_or_default().to_owned();
        wait_for("the cluster", || {
            redis_cli(&["-p", &port, "cluster", "info"]).contains("cluster_state:ok")
        });
    }
    nodes
}

fn quotas() -> [Quota; 3] {
    let hour = Duration::from_secs(3600);
    [
        Quota::new(10_000_000, hour, 10_000_000).unwrap(),
        Quota::new(100_000_000, hour, 100_000_000).unwrap(),
        Quota::new(1_000_000_000, hour, 1_000_000_000).unwrap(),
    ]
}

fn checks(quotas: &[Quota; 3], addresses: u64, i: u64) -> [RuleCheck<'_>; 3] {
    let ip = 0x0a00_0000 + (i.wrapping_mul(0x9E37_79B1) % addresses);
    let digests = [ip, ip >> 8, 0];
    std::array::from_fn(|r| RuleCheck {
        label: LEVELS[r].1,
        rule: LEVELS[r].0,
        key: key(r as u32, 0, digests[r]),
        quota: &quotas[r],
        cost: 1,
    })
}

#[derive(Clone, Copy)]
enum Store<'a> {
    Node(&'a str),
    Cluster(&'a [String]),
}

fn limiter(store: Store<'_>, prefix: &str, lease: Duration) -> SharedLimiter {
    let redis = match store {
        Store::Node(url) => RedisLimiter::new(url, prefix, RedisTimeouts::default()),
        Store::Cluster(nodes) => {
            RedisLimiter::with_cluster(nodes, prefix, RedisTimeouts::default())
        }
    }
    .expect("limiter");
    let rules: Vec<_> = LEVELS
        .iter()
        .map(|&(fp, _)| (fp, StoreConfig::with_max_keys(1 << 20)))
        .collect();
    let stores = RuleStores::build(&rules, None).expect("stores");
    SharedLimiter::with_lease_period(redis, stores, Arc::new(MonotonicClock), lease)
}

async fn fleet_run(
    store: Store<'_>,
    store_name: &str,
    load: &str,
    addresses: u64,
    lease: Duration,
) {
    let prefix = format!("weir:bench:{store_name}:{load}:{}:", lease.as_millis());
    let mut fleet = Vec::new();
    for _ in 0..INSTANCES {
        let l = Arc::new(limiter(store, &prefix, lease));
        assert!(
            l.wait_for_redis(Duration::from_secs(10)).await,
            "redis not in use"
        );
        fleet.push(l);
    }
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..INSTANCES * TASKS_PER_INSTANCE {
        let shared = fleet[t % INSTANCES].clone();
        tasks.spawn(async move {
            let quotas = quotas();
            for i in 0..PER_TASK as u64 {
                let request = (t as u64) * 1_000_003 + i;
                let decided = shared.check_all(&checks(&quotas, addresses, request)).await;
                assert!(all_allowed(&decided), "a request refused");
            }
        });
    }
    while let Some(task) = tasks.join_next().await {
        task.expect("bench task");
    }
    let wall = started.elapsed();
    let requests = (INSTANCES * TASKS_PER_INSTANCE * PER_TASK) as f64;
    let stats: Vec<_> = fleet.iter().map(|l| l.stats()).collect();
    let trips: u64 = stats.iter().map(|s| s.redis_ok).sum();
    let fallback: u64 = stats.iter().map(|s| s.fallback_decisions).sum();
    assert_eq!(fallback, 0, "fell back during the bench: {stats:?}");
    println!(
        "{store_name:<8} {load:<7} lease {:>5}  {:>9.0} decisions/s per instance  {:>5.2} round trips a request",
        format!("{}ms", lease.as_millis()),
        requests / wall.as_secs_f64() / INSTANCES as f64,
        trips as f64 / requests,
    );
}

fn main() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut servers = Servers(Vec::new());
    let url = one_node(dir.path(), &mut servers);
    let nodes = cluster(dir.path(), &mut servers);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    println!(
        "{INSTANCES} instances x {TASKS_PER_INSTANCE} tasks x {PER_TASK} requests; \
         one rule of 3 levels a request"
    );
    runtime.block_on(async {
        for (store, name) in [
            (Store::Node(&url), "one node"),
            (Store::Cluster(&nodes), "cluster"),
        ] {
            for (load, addresses) in [("busy", 64), ("spread", 65_536)] {
                for lease in [Duration::ZERO, Duration::from_millis(250)] {
                    fleet_run(store, name, load, addresses, lease).await;
                }
            }
        }
    });
}
