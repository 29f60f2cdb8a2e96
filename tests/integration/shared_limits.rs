//! Three weir processes sharing one real Redis: together they admit the
//! configured rate; killing Redis mid-run causes no 5xx and no fail-closed;
//! they recover when it returns.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use crate::fixtures::Upstream;
use crate::support::{HttpRequest, Redis, Signal, Weir, WeirConfig};

fn config(app: SocketAddr, redis: SocketAddr) -> String {
    WeirConfig::new(app)
        .admin()
        .access_log_off()
        .then(format!(
            "[state]\nredis_url = \"redis://{redis}/0\"\nredis_command_timeout = \"100ms\""
        ))
        .route_with("other", "path_prefix = \"/other\"")
        .route("api")
        .then(
            r#"[[classes.api.rules]]
name = "site"
limits = [{ per = "site", rate = 300, window = "1m" }]
[[classes.other.rules]]
name = "per-ip"
limits = [{ per = "ip", rate = 100, window = "1m" }]
"#,
        )
        .toml()
}

/// The keys `redis-cli --scan` finds for `pattern`.
fn redis_keys(redis: SocketAddr, pattern: &str) -> Vec<String> {
    let out = std::process::Command::new("redis-cli")
        .args([
            "-h",
            &redis.ip().to_string(),
            "-p",
            &redis.port().to_string(),
        ])
        .args(["--scan", "--pattern", pattern])
        .output()
        .expect("redis-cli (installed with redis-server)");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The site rule admits 300 a minute across two instances (each alone
/// would admit all 200 it gets): 400 requests split between them, from
/// `127.0.SUBNET.x`, admit 300 plus the 5 a second refilled meanwhile (a
/// bound from the time taken, so a slow machine cannot fail it).
async fn assert_one_shared_rate(instances: &[Weir], subnet: u8, how: &str) {
    let started = std::time::Instant::now();
    let mut ok = 0;
    for i in 0..400 {
        let r = HttpRequest::get("/api")
            .from(IpAddr::V4(Ipv4Addr::new(
                127,
                0,
                subnet,
                (i % 200) as u8 + 1,
            )))
            .send(instances[i % 2].listener(0))
            .await
            .unwrap();
        ok += usize::from(r.status == 200);
    }
    let refilled = (started.elapsed().as_secs_f64() * 5.0).ceil() as usize + 1;
    assert!(
        ok >= 300 && ok <= 300 + refilled,
        "admitted {ok}: one shared rate {how} is 300 plus the {refilled} refilled meanwhile"
    );
}

/// How many of `tasks`' requests were admitted (200); every other answer
/// must be the rule's 429.
async fn count_admitted<E: std::fmt::Debug>(
    tasks: Vec<tokio::task::JoinHandle<Result<u16, E>>>,
) -> usize {
    let mut admitted = 0;
    for t in tasks {
        match t.await.unwrap().expect("every request is answered") {
            200 => admitted += 1,
            429 => {}
            other => panic!("unexpected status {other}"),
        }
    }
    admitted
}

async fn fallback_active(w: &Weir) -> bool {
    let m = HttpRequest::get("/metrics")
        .send(w.admin())
        .await
        .unwrap()
        .text();
    m.lines().any(|l| l == "weir_redis_fallback_active 1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_one_rate_and_survive_redis_loss() {
    let app = Upstream::start().await;
    let redis = Redis::builder().start().await.expect("redis starts");
    let redis_addr = redis.addr();
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(
            Weir::builder()
                .config(config(app.addr, redis_addr))
                .start()
                .await
                .expect("weir starts"),
        );
    }
    let listeners: Vec<SocketAddr> = instances.iter().map(|w| w.listener(0)).collect();
    // Let every instance reach Redis before measuring.
    for w in &instances {
        assert_eventually_async!(!fallback_active(w).await, "{}", w.stderr());
    }

    // 600 requests spread over the three instances, as fast as they go.
    let before = round_trips(&instances).await;
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..600usize {
        let to = listeners[i % 3];
        tasks.push(tokio::spawn(async move {
            let src = IpAddr::V4(Ipv4Addr::new(127, 80, (i / 250) as u8, (i % 250 + 1) as u8));
            HttpRequest::get("/api")
                .from(src)
                .send(to)
                .await
                .map(|r| r.status)
        }));
    }
    let mut admitted = count_admitted(tasks).await;
    // Tokens another instance leased and did not use go back after a
    // lease period (250 ms): until then a fleet may refuse early by what
    // they hold (docs/operations.md, leases; one CI run admitted 293 of
    // the burst). A second burst after the return takes them.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let mut tasks = Vec::new();
    for i in 0..60usize {
        let to = listeners[i % 3];
        tasks.push(tokio::spawn(async move {
            let src = IpAddr::V4(Ipv4Addr::new(127, 81, 0, (i + 1) as u8));
            HttpRequest::get("/api")
                .from(src)
                .send(to)
                .await
                .map(|r| r.status)
        }));
    }
    admitted += count_admitted(tasks).await;
    // 300 per minute: the burst, plus what refilled while the bursts ran.
    assert!(
        (300..=315).contains(&admitted),
        "admitted {admitted}, want 300 within 5%"
    );
    // At most one round trip a request (one rule); refusals the local
    // mirror already knew of needed none, and admissions from leased
    // tokens none either.
    let calls = round_trips_since(&instances, before, started.elapsed(), 660, "one redis").await;
    let leased = lease_decisions(&instances).await;
    assert!(
        calls + leased >= admitted as f64 && calls <= 660.0,
        "{calls} round trips and {leased} leased decisions for 660 requests, {admitted} admitted"
    );
    // Key names say which rule and level they count for: the site-wide
    // level is one key, found by the rule's name.
    let keys = redis_keys(redis_addr, "weir:site:*");
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(
        keys[0].starts_with("weir:site:site:") && keys[0].len() == "weir:site:site:".len() + 33,
        "{keys:?}"
    );
    assert!(redis_keys(redis_addr, "weir:per-ip:ip:*").is_empty());

    // Redis dies. Fresh keys need a round trip, which fails, and are decided
    // locally: served, never 5xx, never fail-closed.
    redis.signal(Signal::Kill).unwrap();
    drop(redis);
    for (i, to) in listeners.iter().enumerate() {
        // The spent site budget: refused locally where this instance's
        // mirror knows it is spent, decided from local state otherwise.
        let r = HttpRequest::get("/api")
            .from(Ipv4Addr::new(127, 81, 0, i as u8 + 1))
            .send(*to)
            .await
            .unwrap();
        assert!(r.status == 429 || r.status == 200, "{r}");
        for n in 0..3u8 {
            let r = HttpRequest::get("/other")
                .from(Ipv4Addr::new(127, 83, i as u8, n + 1))
                .send(*to)
                .await
                .unwrap();
            assert_eq!(r.status, 200, "decided locally while Redis is down: {r}");
        }
    }
    for w in &instances {
        assert_eventually_async!(fallback_active(w).await);
    }
    // Redis returns on the same address: every instance recovers by itself.
    let _redis = Redis::builder()
        .addr(redis_addr)
        .start()
        .await
        .expect("redis restarts");
    for w in &instances {
        assert_eventually_async!(!fallback_active(w).await);
        // A fresh Redis has no state: the shared budget starts again. The
        // mirror still counts what this instance admitted alone during the
        // outage (by design, for at most the rule's burst): one refill later
        // the request is admitted. Under load that can take a few tries
        // (CI once saw one 429 from the mirror right after the switch back).
        assert_eventually_async!(
            HttpRequest::get("/api")
                .from(Ipv4Addr::new(127, 82, 0, 1))
                .send(w.listener(0))
                .await
                .unwrap()
                .status
                == 200
        );
    }
}

/// `rediss://`: two instances share one rate through a Redis that speaks
/// only TLS, trusting its CA from `state.redis_ca_file`; without that CA
/// (the system's roots do not know it) the handshake is refused and weir
/// decides locally, as for any unreachable Redis: verification is on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_share_a_rate_through_redis_over_tls() {
    let app = Upstream::start().await;
    let redis = Redis::builder()
        .tls()
        .start()
        .await
        .expect("redis with TLS starts");
    let tls_config = |ca: Option<&std::path::Path>| {
        let plain = format!("redis_url = \"redis://{}/0\"", redis.addr());
        let mut tls = format!("redis_url = \"rediss://{}/0\"", redis.addr());
        if let Some(ca) = ca {
            tls.push_str(&format!("\nredis_ca_file = \"{}\"", ca.display()));
        }
        config(app.addr, redis.addr()).replace(&plain, &tls)
    };
    let ca = redis.ca_file();
    let mut instances = Vec::new();
    for _ in 0..2 {
        instances.push(
            Weir::builder()
                .config(tls_config(Some(&ca)))
                .start()
                .await
                .unwrap(),
        );
    }
    for w in &instances {
        assert_eventually_async!(!fallback_active(w).await, "{}", w.stderr());
    }
    assert_one_shared_rate(&instances, 7, "over TLS").await;
    for w in &instances {
        assert!(!fallback_active(w).await, "{}", w.stderr());
    }

    // The same Redis without its CA: not trusted, so never used. Had it
    // been used, the shared quota spent above would refuse this request;
    // deciding locally, with its own fresh state, admits it.
    let untrusting = Weir::builder()
        .config(tls_config(None))
        .start()
        .await
        .unwrap();
    let r = HttpRequest::get("/api")
        .send(untrusting.listener(0))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert_eventually_async!(
        fallback_active(&untrusting).await,
        "{}",
        untrusting.stderr()
    );
}

/// The primary the sentinel at `sentinel` names for `weir`, by redis-cli.
fn sentinel_primary(sentinel: SocketAddr) -> Option<u16> {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &sentinel.port().to_string()])
        .args(["sentinel", "get-master-addr-by-name", "weir"])
        .output()
        .ok()?;
    String::from_utf8(out.stdout)
        .ok()?
        .lines()
        .nth(1)?
        .trim()
        .parse()
        .ok()
}

/// `[state.redis_sentinel]`: two instances share one rate through the
/// primary a real Sentinel names; the primary is killed, the sentinel
/// promotes the replica, and both instances follow it by themselves:
/// requests answered throughout (local decisions meanwhile, no 5xx), then
/// shared again, written to the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_follow_a_sentinel_failover() {
    let app = Upstream::start().await;
    let primary = Redis::builder().start().await.expect("primary starts");
    let replica = Redis::builder()
        .config(format!("replicaof 127.0.0.1 {}", primary.addr().port()))
        .start()
        .await
        .expect("replica starts");
    let sentinel = Redis::builder()
        .sentinel()
        .config(format!(
            "sentinel monitor weir 127.0.0.1 {} 1\n\
             sentinel down-after-milliseconds weir 500\n\
             sentinel failover-timeout weir 2000",
            primary.addr().port()
        ))
        .start()
        .await
        .expect("sentinel starts");
    assert_eq!(
        sentinel_primary(sentinel.addr()),
        Some(primary.addr().port())
    );
    let cfg = config(app.addr, primary.addr()).replace(
        &format!("redis_url = \"redis://{}/0\"", primary.addr()),
        &format!(
            "[state.redis_sentinel]\nmaster = \"weir\"\nnodes = [\"{}\"]",
            sentinel.addr()
        ),
    );
    // `[state.redis_sentinel]` must follow the other `[state]` keys.
    let cfg = cfg
        .replace("redis_command_timeout = \"100ms\"\n", "")
        .replace("[state]\n", "[state]\nredis_command_timeout = \"100ms\"\n");
    let mut instances = Vec::new();
    for _ in 0..2 {
        instances.push(Weir::builder().config(cfg.clone()).start().await.unwrap());
    }
    for w in &instances {
        assert_eventually_async!(!fallback_active(w).await, "{}", w.stderr());
    }
    assert_one_shared_rate(&instances, 9, "through the sentinel's primary").await;

    // The primary dies; requests keep being answered while the sentinel
    // notices (500 ms) and promotes the replica.
    primary.signal(Signal::Kill).unwrap();
    let mut n = 0u8;
    assert_eventually_async!(
        within = Duration::from_secs(30),
        {
            for w in &instances {
                n = n.wrapping_add(1);
                let r = HttpRequest::get("/other")
                    .from(Ipv4Addr::new(127, 0, 10, n.max(1)))
                    .send(w.listener(0))
                    .await
                    .unwrap();
                assert!(r.status == 200, "answered during the failover: {r}");
            }
            sentinel_primary(sentinel.addr()) == Some(replica.addr().port())
        },
        "no failover: {}",
        sentinel.logs()
    );
    // Both find the new primary by themselves and share through it.
    for w in &instances {
        assert_eventually_async!(
            within = Duration::from_secs(30),
            !fallback_active(w).await,
            "{}",
            w.stderr()
        );
    }
    let r = HttpRequest::get("/other")
        .from(Ipv4Addr::new(127, 0, 11, 1))
        .send(instances[1].listener(0))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert!(
        !redis_keys(replica.addr(), "weir:per-ip:ip:*").is_empty(),
        "the new primary holds the per-ip rule's keys"
    );
    assert!(
        instances[0]
            .stderr()
            .contains("redis sentinel named the primary"),
        "{}",
        instances[0].stderr()
    );
}

/// Bytes waiting unread in the receive queues of the connections to `port`
/// on loopback (`ss`'s Recv-Q of the listening side's sockets): what a
/// stopped server has been sent.
fn unread_bytes_at(port: u16) -> usize {
    let out = std::process::Command::new("ss")
        .args([
            "-Htn",
            "state",
            "established",
            &format!("( sport = :{port} )"),
        ])
        .output()
        .expect("ss (iproute2)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse::<usize>().ok())
        .sum()
}

/// A request whose client leaves while its rule waits for Redis is logged
/// (499) with what the phases before the decision found: its class, its
/// session. Recorded before the decision's wait, not after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_while_its_rule_waits_for_redis_is_logged_with_its_class() {
    use tokio::io::AsyncWriteExt;
    let app = Upstream::start().await;
    let redis = Redis::builder().start().await.expect("redis starts");
    let cfg = WeirConfig::new(app.addr)
        .then(format!(
            // No leases: the request must wait on its round trip.
            "[state]\nredis_url = \"redis://{}/0\"\nredis_command_timeout = \"10s\"\nredis_lease = \"0s\"",
            redis.addr()
        ))
        .route("api")
        .then(
            r#"[[classes.api.rules]]
name = "site"
limits = [{ per = "site", rate = 300, window = "1m" }]
"#,
        )
        .toml();
    let weir = crate::fixtures::TestWeir::start(&cfg).await;
    // weir starts deciding locally and reaches Redis by itself: the rule
    // must be Redis's (a round trip answered) before Redis stops answering.
    let answered = "weir_redis_round_trips_total{result=\"ok\"}";
    assert_eventually_async!(
        {
            let (status, _, _) = crate::fixtures::get(weir.addr, "/api/first", &[]).await;
            assert_eq!(status, 200);
            crate::fixtures::metric(&weir.metrics().await, answered) >= 1.0
        },
        "no rule reached Redis"
    );
    redis.signal(Signal::Stop).unwrap();
    let mut client = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
    client
        .write_all(b"GET /api/left HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    // The rule's round trip has reached the stopped Redis.
    let port = redis.addr().port();
    assert_eventually_async!(unread_bytes_at(port) > 0, "the rule never asked Redis");
    drop(client);
    let mut line: Option<serde_json::Value>;
    assert_eventually_async!(
        {
            let log = weir.access_log(1).await;
            line = log.into_iter().find(|r| r["path"] == "/api/left");
            line.is_some()
        },
        "no line for the request that was left"
    );
    redis.signal(Signal::Cont).unwrap();
    let line = line.unwrap();
    assert_eq!(line["status"], 499, "{line}");
    assert_eq!(line["class"], "api", "{line}");
    assert_eq!(line["session"], "anonymous", "{line}");
}

/// Three real Redis nodes made one cluster (`redis-cli --cluster create`),
/// each answering once the cluster's slots are all served.
async fn redis_cluster() -> Vec<Redis> {
    let mut nodes = Vec::new();
    for _ in 0..3 {
        // The bus port is the node's plus 10,000 unless given: past 55,535
        // that is no port at all.
        let [node, bus] = crate::support::ports::free_addrs("redis", 2)
            .unwrap()
            .try_into()
            .expect("two addresses");
        nodes.push(
            Redis::builder()
                .addr(node)
                .config(format!(
                    "cluster-enabled yes\ncluster-config-file nodes.conf\n\
                     cluster-node-timeout 2000\ncluster-port {}",
                    bus.port()
                ))
                .start()
                .await
                .expect("a cluster node starts"),
        );
    }
    let out = std::process::Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(nodes.iter().map(|n| n.addr().to_string()))
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .expect("redis-cli (installed with redis-server)");
    assert!(out.status.success(), "cluster create: {out:?}");
    for n in &nodes {
        assert_eventually_async!(
            within = Duration::from_secs(20),
            {
                let info = std::process::Command::new("redis-cli")
                    .args(["-p", &n.addr().port().to_string(), "cluster", "info"])
                    .output()
                    .unwrap();
                String::from_utf8_lossy(&info.stdout).contains("cluster_state:ok")
            },
            "the cluster at {} is not ok",
            n.addr()
        );
    }
    nodes
}

/// The sum over `instances` of `weir_redis_round_trips_total{result="ok"}`.
async fn round_trips(instances: &[Weir]) -> f64 {
    round_trips_by(instances, "ok").await
}

/// The sum over `instances` of one metric series.
async fn summed(instances: &[Weir], series: &str) -> f64 {
    let mut total = 0.0;
    for w in instances {
        total += crate::fixtures::metric(&w.metrics().await, series);
    }
    total
}

/// The sum over `instances` of `weir_redis_round_trips_total` for `result`.
async fn round_trips_by(instances: &[Weir], result: &str) -> f64 {
    summed(
        instances,
        &format!("weir_redis_round_trips_total{{result=\"{result}\"}}"),
    )
    .await
}

/// The sum over `instances` of `weir_redis_lease_decisions_total`.
async fn lease_decisions(instances: &[Weir]) -> f64 {
    summed(instances, "weir_redis_lease_decisions_total").await
}

/// The sum over `instances` of `weir_redis_lease_tokens_total` for `result`.
async fn lease_tokens(instances: &[Weir], result: &str) -> f64 {
    summed(
        instances,
        &format!("weir_redis_lease_tokens_total{{result=\"{result}\"}}"),
    )
    .await
}

/// The round trips `requests` requests took over `instances` since
/// `before` (in `took`), printed as `what` and returned.
async fn round_trips_since(
    instances: &[Weir],
    before: f64,
    took: std::time::Duration,
    requests: u32,
    what: &str,
) -> f64 {
    let calls = round_trips(instances).await - before;
    let n = f64::from(requests);
    eprintln!(
        "{what}: {requests} requests in {took:?} ({:.0}/s over {} instances), {calls} round trips ({:.2} a request)",
        n / took.as_secs_f64(),
        instances.len(),
        calls / n
    );
    calls
}

/// `[state] redis_cluster`: two instances share one rate through a real
/// three-node Redis Cluster, one round trip per request and rule. Each
/// rule's keys carry its name as a hash tag, so the levels of one rule are
/// decided in one script call on one node (without the tag, a decision
/// over several levels would be refused `CROSSSLOT`), and different rules
/// land where their slots are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_one_rate_through_a_redis_cluster() {
    let app = Upstream::start().await;
    let nodes = redis_cluster().await;
    let list = nodes
        .iter()
        .map(|n| format!("\"{}\"", n.addr()))
        .collect::<Vec<_>>()
        .join(", ");
    // The per-address rule gets a second level: two keys in one script.
    let cfg = config(app.addr, nodes[0].addr())
        .replace(
            &format!("redis_url = \"redis://{}/0\"", nodes[0].addr()),
            &format!("redis_cluster = [{list}]"),
        )
        .replace(
            "limits = [{ per = \"ip\", rate = 100, window = \"1m\" }]",
            "limits = [{ per = \"ip\", rate = 100, window = \"1m\" }, { per = \"site\", rate = 10000, window = \"1m\" }]",
        );
    assert!(cfg.contains("rate = 10000"), "{cfg}");
    assert!(cfg.contains("redis_cluster"), "{cfg}");
    let mut instances = Vec::new();
    for _ in 0..2 {
        instances.push(Weir::builder().config(cfg.clone()).start().await.unwrap());
    }
    for w in &instances {
        assert_eventually_async!(!fallback_active(w).await, "{}", w.stderr());
    }
    let before = round_trips(&instances).await;
    let started = std::time::Instant::now();
    assert_one_shared_rate(&instances, 11, "through a Redis Cluster").await;
    let calls =
        round_trips_since(&instances, before, started.elapsed(), 400, "redis cluster").await;
    // At most one round trip a request (one rule); a request the local
    // mirror already knows to be over the limit needs none, nor one
    // admitted from leased tokens.
    let leased = lease_decisions(&instances).await;
    assert!(
        calls + leased >= 300.0 && calls <= 400.0,
        "{calls} round trips and {leased} leased decisions for 400 requests, 300 admitted"
    );

    // Two levels of one rule in one script call: their keys share a slot
    // (a CROSSSLOT refusal would be an error, decided locally).
    for i in 0..20u8 {
        let r = HttpRequest::get("/other")
            .from(IpAddr::V4(Ipv4Addr::new(127, 0, 12, i + 1)))
            .send(instances[usize::from(i) % 2].listener(0))
            .await
            .unwrap();
        assert_eq!(r.status, 200);
    }
    let errors = round_trips_by(&instances, "error").await;
    assert_eq!(errors, 0.0, "every round trip answered");
    // Each address is new: its level needs the round trip.
    assert_eq!(round_trips(&instances).await - before, calls + 20.0);

    // Unused leased tokens of the site key go back through the cluster
    // (one script call per slot: no CROSSSLOT, no error).
    assert_eventually_async!(
        lease_tokens(&instances, "returned").await > 0.0,
        "no leased token given back: leased {}",
        lease_tokens(&instances, "leased").await
    );
    assert_eq!(round_trips_by(&instances, "error").await, 0.0);

    // The site rule's key is tagged with the rule's name, on the node
    // that serves its slot.
    let keys: Vec<String> = nodes
        .iter()
        .flat_map(|n| redis_keys(n.addr(), "weir:*"))
        .collect();
    assert!(
        keys.iter().any(|k| k.starts_with("weir:{site}:site:")),
        "tagged keys: {keys:?}"
    );
}

/// Sends `n` requests for `/other` from one address, 30 at a time, spread
/// over `instances`; every one must be served.
async fn busy_address(instances: &[Weir], n: usize) {
    for batch in 0..n / 30 {
        let mut tasks = Vec::new();
        for i in 0..30 {
            let to = instances[(batch * 30 + i) % instances.len()].listener(0);
            tasks.push(tokio::spawn(async move {
                HttpRequest::get("/other")
                    .from(IpAddr::V4(Ipv4Addr::new(127, 0, 30, 1)))
                    .send(to)
                    .await
                    .map(|r| r.status)
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap().expect("answered"), 200);
        }
    }
}

/// `state.redis_lease`: one busy address (a carrier NAT) well under its
/// limit, through three instances, is decided mostly from tokens each
/// instance leased, not one round trip a request; with `"0s"` every
/// decision is a round trip again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_address_is_decided_mostly_from_leases() {
    let app = Upstream::start().await;
    let redis = Redis::builder().start().await.expect("redis starts");
    let generous = |lease: &str| {
        config(app.addr, redis.addr())
            .replace(
                "limits = [{ per = \"ip\", rate = 100, window = \"1m\" }]",
                "limits = [{ per = \"ip\", rate = 100000, window = \"1m\" }]",
            )
            .replace(
                "redis_command_timeout = \"100ms\"",
                &format!("redis_command_timeout = \"100ms\"\nredis_lease = \"{lease}\""),
            )
    };
    for (lease, most) in [("250ms", 0.5), ("0s", 1.0)] {
        let cfg = generous(lease);
        assert!(
            cfg.contains("rate = 100000") && cfg.contains("redis_lease"),
            "{cfg}"
        );
        let mut instances = Vec::new();
        for _ in 0..3 {
            instances.push(Weir::builder().config(cfg.clone()).start().await.unwrap());
        }
        for w in &instances {
            assert_eventually_async!(!fallback_active(w).await, "{}", w.stderr());
        }
        let before = round_trips(&instances).await;
        let started = std::time::Instant::now();
        busy_address(&instances, 900).await;
        let what = format!("one busy address, redis_lease = {lease}");
        let calls = round_trips_since(&instances, before, started.elapsed(), 900, &what).await;
        let leased = lease_decisions(&instances).await;
        assert_eq!(calls + leased, 900.0, "every request decided once");
        assert!(
            calls <= 900.0 * most,
            "{what}: {calls} round trips for 900 requests"
        );
    }
}
