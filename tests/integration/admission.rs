//! Admission and upstream health end to end, against the simulated app
//! (`SimApp`: W workers, a bounded backlog, per-path service times) over real
//! sockets, with clients on distinct 127.x.y.z addresses.
//!
//! What each test proves:
//! - `overload_waits_then_sheds_only_the_lowest_lane`: at several times the
//!   app's capacity the app never has more than its workers in flight and
//!   never refuses a connection; only anonymous expensive requests get
//!   `503` + `Retry-After`; cheap pages all succeed.
//! - `verified_lane_waits_little_while_anonymous_is_shed`: a signed session
//!   cookie puts a request in the top lane, whose p99 queue wait stays under
//!   a second while anonymous expensive requests are shed.
//! - `one_big_network_gets_one_share`: 1,000 addresses of one /16 get about
//!   one network's share against 50 small /16s, not the majority their
//!   numbers would take first come, first served.
//! - `slow_dead_and_panic`: checks timing out while requests succeed mean
//!   *slow* (still used); a killed server is *dead* within the configured
//!   time; when all are dead, GETs are still served and POSTs get `503`.
//! - `new_server_slow_starts`: a server added by a reload that starts with
//!   2 workers and grows one per second is never sent more than it can take.
//! - `retry_budget_caps_retries`: with half the connects refused, retries stay
//!   within 20% of requests and the rest fail fast.
//! - `zero_config_queues_a_flood_behind_cheap_pages_it_learned`: the shapes
//!   weir learns to be expensive wait behind cheap pages, with no config.
//! - `zero_config_backs_off_from_an_app_that_resets_when_full`: resets are
//!   overload; the learned limit backs off at once and stays below them.
//! - `zero_config_sends_a_refused_read_again_when_a_slot_frees`: a cold
//!   start's burst that overflows an app is served whole: each request the
//!   app refused waits for a slot again and is sent once more.
//! - `a_refused_read_that_waits_past_its_deadline_is_shed`: one that finds
//!   no slot before its deadline is weir's `503`, not the app's `502`.
//! - `zero_config_gives_people_behind_one_network_a_turn_each`: addresses
//!   that browse (mostly cheap pages) share as networks of their own, so
//!   twelve readers of one /16 are not one turn against a crawler's /16s.
//!
//! Timing is loose on purpose (a shared 2-core machine): every test bounds
//! its own run time and asserts counts, not latencies, except the verified
//! lane's p99 wait, which has a wide margin.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use http::{Request, StatusCode};
use weir_lab::app::{AppConfig, ClassRule, ServiceTime, SimApp};

use crate::fixtures::*;
use crate::support::WeirConfig;
use crate::support::ports::unused_addr;

const KEY: &str = "0123456789abcdef0123456789abcdef-admission";

/// 127.a.b.c
fn ip(a: u8, b: u8, c: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, a, b, c))
}

fn fixed(ms: f64) -> ServiceTime {
    ServiceTime::Fixed { ms }
}

/// An app with `workers` workers, `backlog` backlog, pages taking `page_ms`
/// and `?search` requests taking `expensive_ms`.
fn app(workers: usize, backlog: usize, page_ms: f64, expensive_ms: f64) -> SimApp {
    SimApp::start(
        AppConfig {
            workers,
            backlog,
            default_service: fixed(page_ms),
            classes: vec![ClassRule {
                class: "expensive".into(),
                path_prefix: None,
                query_key: Some("search".into()),
                service: fixed(expensive_ms),
            }],
            health_service: fixed(1.0),
            ..AppConfig::default()
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .unwrap()
}

/// One client's results: (status, retry-after present, x-weir-reason).
type Answer = (u16, bool, String);

/// What a group of clients has been answered so far, counted as it happens:
/// what the tests wait on instead of a fixed run time.
#[derive(Default)]
struct Tally {
    answered: AtomicUsize,
    ok: AtomicUsize,
    shed: AtomicUsize,
}

impl Tally {
    fn count(&self, status: u16) {
        self.answered.fetch_add(1, Ordering::Relaxed);
        match status {
            200 => self.ok.fetch_add(1, Ordering::Relaxed),
            503 => self.shed.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
    }

    fn answered(&self) -> usize {
        self.answered.load(Ordering::Relaxed)
    }

    fn ok(&self) -> usize {
        self.ok.load(Ordering::Relaxed)
    }

    fn shed(&self) -> usize {
        self.shed.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (n, ok, shed) = (self.answered(), self.ok(), self.shed());
        write!(f, "{n} answered ({ok} ok, {shed} shed)")
    }
}

/// Sends GETs of `path` from `source` on one keep-alive connection until
/// `stop`, with `cookie` if not empty, counting each answer in `tally`.
async fn client_loop(
    source: IpAddr,
    to: SocketAddr,
    path: &'static str,
    cookie: String,
    (stop, tally): (Arc<AtomicBool>, Arc<Tally>),
) -> Vec<Answer> {
    let mut out = Vec::new();
    let Ok(mut c) = H1::connect(source, to).await else {
        return out;
    };
    while !stop.load(Ordering::Relaxed) {
        let mut b = Request::get(path).header("host", "wiki.test");
        if !cookie.is_empty() {
            b = b.header("cookie", cookie.as_str());
        }
        let Ok((status, h, _)) = c.send(b.body(full("")).unwrap()).await else {
            break;
        };
        tally.count(status.as_u16());
        out.push((
            status.as_u16(),
            h.contains_key("retry-after"),
            h.get("x-weir-reason")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string(),
        ));
    }
    out
}

/// Closed-loop clients ([`client_loop`]) started in groups and stopped
/// together: the load the tests below put on weir while they watch.
struct Traffic {
    to: SocketAddr,
    stop: Arc<AtomicBool>,
    groups: Vec<Vec<tokio::task::JoinHandle<Vec<Answer>>>>,
    tallies: Vec<Arc<Tally>>,
}

impl Traffic {
    fn to(weir: SocketAddr) -> Traffic {
        Traffic {
            to: weir,
            stop: Arc::new(AtomicBool::new(false)),
            groups: Vec::new(),
            tallies: Vec::new(),
        }
    }

    /// Starts `count` clients, the `i`-th from `ip(net, i, 1)`, each asking
    /// for `path` with the cookie `cookie(i)` (none if empty).
    fn clients(&mut self, net: u8, count: u8, path: &'static str, cookie: impl Fn(u8) -> String) {
        let tally = Arc::new(Tally::default());
        let group = (0..count)
            .map(|i| {
                let to = self.to;
                let ends = (self.stop.clone(), tally.clone());
                tokio::spawn(client_loop(ip(net, i, 1), to, path, cookie(i), ends))
            })
            .collect();
        self.groups.push(group);
        self.tallies.push(tally);
    }

    /// Waits (30 s at most) until the groups' answers so far, in the order
    /// started, are `enough`.
    async fn until(&self, enough: impl Fn(&[Arc<Tally>]) -> bool) {
        assert_eventually_async!(
            within = Duration::from_secs(30),
            enough(&self.tallies),
            "the clients were answered too little: {:?}",
            self.tallies
        );
    }

    /// Stops every client; each group's answers, in the order started.
    async fn stop(self) -> Vec<Vec<Answer>> {
        self.stop.store(true, Ordering::Relaxed);
        let mut answers = Vec::new();
        for group in self.groups {
            let mut of_group = Vec::new();
            for client in group {
                of_group.extend(client.await.unwrap());
            }
            answers.push(of_group);
        }
        answers
    }
}

/// No cookie, for [`Traffic::clients`].
fn no_cookie(_: u8) -> String {
    String::new()
}

async fn status_doc(weir: &TestWeir) -> serde_json::Value {
    let (_, _, body) = get(weir.admin, "/status", &[]).await;
    serde_json::from_slice(&body).unwrap()
}

/// The health of server `addr` in `/status`.
async fn health_of(weir: &TestWeir, addr: SocketAddr) -> String {
    let doc = status_doc(weir).await;
    doc["pools"][0]["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["address"] == addr.to_string())
        .map(|s| s["health"].as_str().unwrap().to_string())
        .unwrap_or_default()
}

fn overload_config(app: SocketAddr, expensive_timeout: &str) -> String {
    WeirConfig::new(app)
        .admission("max_in_flight = 3\nworkers = 4\nqueue_timeout = \"5s\"")
        .route_with("expensive", r#"query_keys = ["search"]"#)
        .route("page")
        .then(format!(
            r#"[classes.expensive]
lane = "anonymous"
queue_timeout = "{expensive_timeout}"

[sessions.signed_cookie]
cookie = "weir_session"
keys = ["{KEY}"]
"#
        ))
        .toml()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_waits_then_sheds_only_the_lowest_lane() {
    // 4 workers, a backlog of 2: more than 6 requests inside the app and it
    // resets connections, as php-fpm's listen.backlog does.
    let app = app(4, 2, 20.0, 100.0);
    let weir = TestWeir::start(&overload_config(app.addr(), "300ms")).await;
    let mut traffic = Traffic::to(weir.addr);
    // 12 closed-loop crawlers on 100 ms requests against 3 slots: 4x.
    traffic.clients(20, 12, "/w/index.php?search=x", no_cookie);
    traffic.clients(30, 3, "/wiki/Page", no_cookie);
    // Long enough that the queue overflows many times over.
    traffic
        .until(|g| g[0].shed() >= 20 && g[0].ok() >= 20 && g[1].answered() >= 100)
        .await;
    let [crawled, read] = <[_; 2]>::try_from(traffic.stop().await).unwrap();

    let snap = app.snapshot();
    assert!(
        snap.max_in_flight <= 4,
        "app had {} in flight",
        snap.max_in_flight
    );
    assert_eq!(snap.refused, 0, "the app's backlog never overflowed");
    assert!(
        !read.is_empty() && read.iter().all(|a| a.0 == 200),
        "pages: {read:?}"
    );
    let shed: Vec<&Answer> = crawled.iter().filter(|a| a.0 == 503).collect();
    assert!(!shed.is_empty(), "4x overload sheds something");
    assert!(
        shed.iter().all(|a| a.1 && a.2.starts_with("admission_")),
        "503s carry Retry-After and an admission reason: {shed:?}"
    );
    assert!(
        crawled.iter().all(|a| a.0 == 200 || a.0 == 503),
        "only 200 or 503, never 502: {:?}",
        crawled
            .iter()
            .filter(|a| a.0 != 200 && a.0 != 503)
            .collect::<Vec<_>>()
    );
    assert!(
        crawled.iter().any(|a| a.0 == 200),
        "crawlers are served too"
    );

    let log = weir.access_log(read.len() + crawled.len()).await;
    let shed_lanes: Vec<&str> = log
        .iter()
        .filter(|l| l["status"] == 503)
        .map(|l| l["lane"].as_str().unwrap_or("none"))
        .collect();
    assert!(
        shed_lanes.iter().all(|l| *l == "anonymous"),
        "{shed_lanes:?}"
    );
    // The readers keep no cookie: weir knows no visit of theirs, so their
    // cheap pages wait in `newcomers`, still ahead of every search.
    assert!(
        log.iter()
            .any(|l| l["lane"] == "newcomers" && l["status"] == 200)
    );
    let m = weir.metrics().await;
    assert!(
        metric(
            &m,
            "weir_admission_shed_total{pool=\"app\",lane=\"anonymous\",reason=\"deadline_exceeded\"}"
        ) + metric(
            &m,
            "weir_admission_shed_total{pool=\"app\",lane=\"anonymous\",reason=\"queue_full\"}"
        ) >= shed.len() as f64,
        "{m}"
    );
    assert_metric(&m, "weir_admission_limit{pool=\"app\"}", 3.0);
    drop(weir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verified_lane_waits_little_while_anonymous_is_shed() {
    let app = app(4, 2, 20.0, 100.0);
    let weir = TestWeir::start(&overload_config(app.addr(), "300ms")).await;
    let signer = session_signer(KEY);
    let expires = an_hour_from_now();
    let mut traffic = Traffic::to(weir.addr);
    traffic.clients(21, 12, "/w/index.php?search=x", no_cookie);
    // Editors ask for the same expensive pages as the crawlers.
    let session = |i: u8| {
        let token = signer.issue(&format!("editor{i}"), expires).unwrap();
        format!("weir_session={token}")
    };
    traffic.clients(31, 2, "/w/index.php?search=x", session);
    traffic
        .until(|g| g[0].shed() >= 20 && g[1].answered() >= 40)
        .await;
    let [crawled, edited] = <[_; 2]>::try_from(traffic.stop().await).unwrap();
    assert!(crawled.iter().any(|a| a.0 == 503), "anonymous is shed");
    assert!(
        !edited.is_empty() && edited.iter().all(|a| a.0 == 200),
        "verified never shed: {edited:?}"
    );
    let log = weir.access_log(crawled.len() + edited.len()).await;
    let mut waits: Vec<f64> = log
        .iter()
        .filter(|l| l["lane"] == "verified")
        .map(|l| l["queue_ms"].as_f64().unwrap())
        .collect();
    assert_eq!(waits.len(), edited.len());
    waits.sort_by(f64::total_cmp);
    let p99 = waits[(waits.len() * 99 / 100).min(waits.len() - 1)];
    assert!(p99 < 1000.0, "verified p99 queue wait {p99} ms");
    assert_eq!(app.snapshot().refused, 0);
    drop(weir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_big_network_gets_one_share() {
    // 2 slots of 50 ms: ~40 requests/s for everyone.
    let app = app(3, 2, 50.0, 50.0);
    let cfg = WeirConfig::new(app.addr())
        .admission("max_in_flight = 2\nworkers = 3\nqueue_timeout = \"1s\"\nmax_queued = 400");
    let weir = TestWeir::start(&cfg.toml()).await;
    let stop = Arc::new(AtomicBool::new(false));
    let to = weir.addr;
    // One /16 (127.200.0.0/16) with 1,000 addresses, each sending rarely:
    // 150 tasks, each cycling over its own addresses, one request per
    // connection.
    let (big_tally, small_tally) = (Arc::new(Tally::default()), Arc::new(Tally::default()));
    let mut big = Vec::new();
    for t in 0..150u16 {
        let (stop, tally) = (stop.clone(), big_tally.clone());
        big.push(tokio::spawn(async move {
            let (mut ok, mut sent) = (0u32, 0u32);
            let mut n = t;
            while !stop.load(Ordering::Relaxed) {
                let addr = 1000 + (n % 1000);
                let ip = IpAddr::V4(Ipv4Addr::new(
                    127,
                    200,
                    (addr / 250) as u8,
                    (addr % 250) as u8 + 1,
                ));
                n += 150;
                let Ok(mut c) = H1::connect(ip, to).await else {
                    continue;
                };
                let req = Request::get("/page")
                    .header("host", "t")
                    .body(full(""))
                    .unwrap();
                if let Ok((s, _, _)) = c.send(req).await {
                    tally.count(s.as_u16());
                    sent += 1;
                    ok += u32::from(s == StatusCode::OK);
                }
            }
            (ok, sent)
        }));
    }
    // 50 /16s (127.1.0.0 .. 127.50.0.0) with 3 addresses each, one client each.
    let mut small = Vec::new();
    for net in 1..=50u8 {
        for host in 1..=3u8 {
            let ends = (stop.clone(), small_tally.clone());
            small.push(tokio::spawn(async move {
                let ip = IpAddr::V4(Ipv4Addr::new(127, net, 0, host));
                let answers = client_loop(ip, to, "/page", String::new(), ends).await;
                (net, answers.iter().filter(|a| a.0 == 200).count() as u32)
            }));
        }
    }
    // Enough served for a share to mean something (2 slots serve ~40 a second).
    assert_eventually_async!(
        within = Duration::from_secs(30),
        big_tally.ok() + small_tally.ok() >= 150 && big_tally.answered() > 100,
        "big {big_tally:?}, small {small_tally:?}"
    );
    stop.store(true, Ordering::Relaxed);
    let (mut big_ok, mut big_sent) = (0, 0);
    for b in big {
        let (o, s) = b.await.unwrap();
        big_ok += o;
        big_sent += s;
    }
    let mut small_ok = 0;
    for s in small {
        small_ok += s.await.unwrap().1;
    }
    let total = big_ok + small_ok;
    assert!(total >= 40, "served {total}");
    assert!(big_sent > 100, "the big network kept asking: {big_sent}");
    // Fair share is 1/51 (2%); first come, first served would give the
    // big network about 150/300 of the queue. Allow 4x the fair share.
    let share = big_ok as f64 / total as f64;
    assert!(
        share < 4.0 / 51.0,
        "big /16 got {big_ok} of {total} ({share:.3}); small networks {small_ok}"
    );
    assert_eq!(app.snapshot().refused, 0);
    drop(weir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_dead_and_panic() {
    // A's checks take 200 ms and time out at 50 ms; its pages take 5 ms.
    let a = SimApp::start(
        AppConfig {
            workers: 6,
            backlog: 8,
            default_service: fixed(5.0),
            health_service: fixed(200.0),
            ..AppConfig::default()
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .unwrap();
    let b = app(4, 8, 5.0, 5.0);
    let (a_addr, b_addr) = (a.addr(), b.addr());
    let weir = TestWeir::start(
        &WeirConfig::servers(&[a_addr, b_addr])
            .admission("max_in_flight = 8\nworkers = 10")
            .then(
                r#"[pools.app.health]
path = "/healthz"
interval = "100ms"
timeout = "50ms"
fall = 2
rise = 2
silence = "1s"
"#,
            )
            .toml(),
    )
    .await;

    // Traffic while A's checks time out: A is slow, not dead, and still used.
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = tokio::spawn(client_loop(
        ip(40, 0, 1),
        weir.addr,
        "/page",
        String::new(),
        (stop.clone(), Arc::default()),
    ));
    assert_eventually_async!(
        within = Duration::from_secs(5),
        health_of(&weir, a_addr).await == "slow",
        "A never became slow: {}",
        status_doc(&weir).await
    );
    assert_eq!(health_of(&weir, b_addr).await, "healthy");

    // B is killed: dead within fall x interval (+ generous slack).
    b.kill().await;
    assert_eventually_async!(
        within = Duration::from_secs(3),
        health_of(&weir, b_addr).await == "dead",
        "B not dead: {}",
        status_doc(&weir).await
    );

    // Only A is left, slow: it takes all the traffic and stays slow.
    let served_when_alone = a.snapshot().class("page");
    assert_eventually_async!(
        a.snapshot().class("page") > served_when_alone,
        "a slow server keeps traffic"
    );
    assert_eq!(
        health_of(&weir, a_addr).await,
        "slow",
        "slow is never dead while answering"
    );
    stop.store(true, Ordering::Relaxed);
    let answers = traffic.await.unwrap();
    // One client, one request at a time. A read cut on a kept-alive
    // connection to B, and connect failures after that, are retried on A;
    // only a read on a connection opened just before the kill may be cut.
    let failed: Vec<&Answer> = answers.iter().filter(|a| a.0 != 200).collect();
    assert!(failed.len() <= 1, "{failed:?}");
    assert!(answers.len() > 20, "traffic ran: {}", answers.len());

    // No traffic: A's checks keep timing out and it falls silent: all dead.
    assert_eventually_async!(
        within = Duration::from_secs(5),
        status_doc(&weir).await["pools"][0]["mode"] == "panic",
        "{}",
        status_doc(&weir).await
    );
    let (s, _, body) = get(weir.admin, "/readyz/pools/app", &[]).await;
    assert_eq!(
        (s, body.as_slice()),
        (StatusCode::SERVICE_UNAVAILABLE, &b"down\n"[..])
    );
    assert_eq!(get(weir.admin, "/livez", &[]).await.0, StatusCode::OK);
    let (_, _, ready) = get(weir.admin, "/readyz", &[]).await;
    assert!(String::from_utf8_lossy(&ready).contains("pool app down"));

    // Panic mode: a write gets 503 at once, a read still reaches A.
    let mut c = H1::connect(ip(40, 0, 2), weir.addr).await.unwrap();
    let (s, h, _) = c.post("/page", "x").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(h["x-weir-reason"], "no_healthy_upstream");
    assert!(h.contains_key("retry-after"));
    let (s, _, _) = c.get("/page").await;
    assert_eq!(s, StatusCode::OK, "panic mode serves reads");
    let m = weir.metrics().await;
    assert_metric(&m, "weir_pool_state{pool=\"app\",state=\"down\"}", 1.0);
    assert!(
        metric(
            &m,
            "weir_health_checks_total{pool=\"app\",result=\"timeout\"}"
        ) >= 2.0
    );
    drop(weir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_server_slow_starts() {
    let warm = app(8, 8, 50.0, 50.0);
    // Incident 2's replacement: 2 workers, +1 per second, here a backlog of
    // 1, so anything beyond workers + 1 is refused.
    let fresh = SimApp::start(
        AppConfig {
            workers: 8,
            backlog: 1,
            start_workers: Some(2),
            warmup_step_ms: 1000,
            default_service: fixed(50.0),
            ..AppConfig::default()
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .unwrap();
    let config = |servers: &str| {
        format!(
            r#"[[listeners]]
address = "127.0.0.1:0"

[process]
watch_config = false

[pools.app]
servers = [{servers}]

[pools.app.admission]
max_in_flight = 14
workers = 16
queue_timeout = "10s"
slow_start = "8s"
"#
        )
    };
    let weir = TestWeir::start(&config(&format!("\"{}\"", warm.addr()))).await;
    let mut traffic = Traffic::to(weir.addr);
    traffic.clients(50, 30, "/page", no_cookie);
    traffic.until(|g| g[0].ok() >= 100).await;
    // The replacement joins the pool by a reload.
    std::fs::write(
        &weir.config_path,
        config(&format!("\"{}\", \"{}\"", warm.addr(), fresh.addr())),
    )
    .unwrap();
    let mut admin = H1::connect(ip(0, 0, 1), weir.admin).await.unwrap();
    let (s, _, body) = admin
        .send(
            Request::post("/reload")
                .header("host", weir.admin.to_string())
                .body(full(""))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let doc = status_doc(&weir).await;
    assert!(
        doc["pools"][0]["servers"][1]["slow_start_cap"]
            .as_u64()
            .is_some(),
        "{doc}"
    );
    // The replacement grows a worker a second from 2 while weir's cap on it
    // grows over 8 s: 150 answers take it a few seconds into both.
    assert_eventually_async!(
        within = Duration::from_secs(20),
        fresh.snapshot().served >= 150,
        "the new server takes traffic as it warms: {:?}",
        fresh.snapshot()
    );
    let answers = traffic.stop().await.concat();
    let fresh_snap = fresh.snapshot();
    assert_eq!(fresh_snap.refused, 0, "never sent more than it could take");
    assert!(
        fresh_snap.served > 10,
        "the new server took traffic: {fresh_snap:?}"
    );
    assert!(
        answers.iter().all(|a| a.0 == 200),
        "{:?}",
        answers
            .iter()
            .filter(|a| a.0 != 200)
            .take(5)
            .collect::<Vec<_>>()
    );
    assert_eq!(warm.snapshot().refused, 0);
    drop(weir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_budget_caps_retries() {
    let good = Upstream::start().await;
    let closed = unused_addr();
    let weir = TestWeir::start(&format!(
        r#"[[listeners]]
address = "127.0.0.1:0"

[pools.app]
servers = ["{closed}", "{}"]
balance = "round_robin"

[pools.app.retry_budget]
ratio = 0.2
min_per_second = 0
"#,
        good.addr
    ))
    .await;
    let mut c = H1::connect(ip(60, 0, 1), weir.addr).await.unwrap();
    let (mut ok, mut bad) = (0, 0);
    for _ in 0..40 {
        let (s, _, _) = c.get("/x").await;
        match s {
            StatusCode::OK => ok += 1,
            StatusCode::BAD_GATEWAY => bad += 1,
            other => panic!("unexpected {other}"),
        }
    }
    let m = weir.metrics().await;
    let retries = metric(&m, "weir_upstream_retries_total{pool=\"app\"}");
    let denied = metric(&m, "weir_upstream_retries_denied_total{pool=\"app\"}");
    assert!(
        retries <= 8.0,
        "at most 20% of 40 requests retried: {retries}"
    );
    assert!(denied >= 5.0, "the budget said no: {denied}");
    assert_eq!(bad as f64, denied, "every denied retry is a fast 502");
    assert_eq!(ok + bad, 40);
    drop(weir);
}

/// weir with a listener and a pool in front of `app`, nothing else.
async fn zero_config(app: &SimApp) -> TestWeir {
    TestWeir::start(&WeirConfig::new(app.addr()).toml()).await
}

/// Sends 30 searches and 90 pages one at a time, then waits (up to 2 s)
/// until the pool counts one expensive shape.
async fn learn_that_searches_are_expensive(weir: &TestWeir) {
    searches_then_pages(weir.addr).await;
    assert_eventually_async!(
        within = Duration::from_secs(2),
        metric(
            &weir.metrics().await,
            "weir_admission_expensive_shapes{pool=\"app\"}",
        ) == 1.0,
        "one shape learned expensive"
    );
}

/// Issue 19, item 5: with a listener and a pool only, admission is on. The
/// pool learns from its answers that `?search` is expensive (a shape: path
/// prefix and query keys) and, in a flood of searches, pages wait in `pass`
/// ahead of them while searches wait in `anonymous`; the app's backlog never
/// overflows and nobody gets a 5xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_config_queues_a_flood_behind_cheap_pages_it_learned() {
    // 4 workers, a backlog of 64 (php-fpm's is larger still): without weir,
    // pages would wait in the app's own first-come queue behind searches.
    let app = app(4, 64, 10.0, 100.0);
    let weir = zero_config(&app).await;
    // A quiet spell: the app answers both shapes, weir learns which is slow.
    learn_that_searches_are_expensive(&weir).await;

    // The flood: 24 closed-loop searchers (6x the workers) and 3 readers.
    let mut traffic = Traffic::to(weir.addr);
    traffic.clients(20, 24, "/w/index.php?search=x", no_cookie);
    traffic.clients(30, 3, "/wiki/Page", no_cookie);
    traffic
        .until(|g| g[0].answered() >= 120 && g[1].answered() >= 120)
        .await;
    assert_eventually_async!(
        metric(&weir.metrics().await, "weir_admission_limit{pool=\"app\"}") < 24.0,
        "the limit was cut below the flood"
    );
    let answers = traffic.stop().await.concat();
    assert!(
        answers.iter().all(|a| a.0 == 200),
        "no 5xx, nothing shed: {:?}",
        answers.iter().filter(|a| a.0 != 200).collect::<Vec<_>>()
    );
    assert_eq!(
        app.snapshot().refused,
        0,
        "the app's backlog never overflowed"
    );

    let log = weir.access_log(120 + answers.len()).await;
    let flood = &log[120..];
    let lanes_of = |path: &str| -> Vec<(String, f64)> {
        flood
            .iter()
            .filter(|l| l["path"].as_str().is_some_and(|p| p.starts_with(path)))
            .map(|l| {
                (
                    l["lane"].as_str().unwrap_or("none").to_string(),
                    l["queue_ms"].as_f64().unwrap_or(0.0),
                )
            })
            .collect()
    };
    let searches = lanes_of("/w/index.php");
    let pages = lanes_of("/wiki/");
    assert!(
        searches.iter().all(|(l, _)| l == "anonymous"),
        "{searches:?}"
    );
    // Clients that keep no cookie: cheap pages of nobody weir knows.
    assert!(pages.iter().all(|(l, _)| l == "newcomers"), "{pages:?}");
    // Who waits: the searches, in their lane; pages pass them.
    let median = |v: &[(String, f64)]| {
        let mut ms: Vec<f64> = v.iter().map(|(_, q)| *q).collect();
        ms.sort_by(f64::total_cmp);
        ms[ms.len() / 2]
    };
    assert!(
        median(&pages) < median(&searches),
        "pages wait less than searches: {} ms against {} ms",
        median(&pages),
        median(&searches)
    );
    drop(weir);
}

/// An app that resets past its workers (no backlog, so its latency never
/// rises) tells weir's defaults it is full only by those resets: the
/// adaptive limit backs off to what the app takes and stays there, and the
/// app stops refusing. Regressions: a reset on a kept-alive connection once
/// told the limit nothing (it stayed above the app's workers), and a drop
/// cut the limit only when its one-second window ended (the app refused
/// 18,000 requests in that second, each a 502).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_config_backs_off_from_an_app_that_resets_when_full() {
    let app = app(4, 0, 20.0, 20.0);
    let weir = zero_config(&app).await;
    let mut traffic = Traffic::to(weir.addr);
    traffic.clients(40, 16, "/api/tile", no_cookie);
    let limit = || async { metric(&weir.metrics().await, "weir_admission_limit{pool=\"app\"}") };
    assert_eventually_async!(
        limit().await <= 4.0,
        "the limit backs off to the app's 4 workers: {}",
        limit().await
    );
    let refused_before = app.snapshot().refused;
    // Then two seconds' worth of answers (4 workers, 20 ms).
    let answered = traffic.tallies[0].answered();
    traffic.until(|g| g[0].answered() >= answered + 400).await;
    let refused_after = app.snapshot().refused;
    let answers = traffic.stop().await.concat();
    assert!(refused_before > 0, "the flood overflowed the app at first");
    assert!(
        refused_before < 100,
        "the first refusals cut the limit at once: {refused_before}"
    );
    assert!(
        refused_after - refused_before < 10,
        "the app stopped refusing once the limit backed off: {} refusals in 400 \
         answers (of {refused_after})",
        refused_after - refused_before
    );
    assert!(
        limit().await <= 4.0,
        "the limit holds at most the app's 4 workers: {}",
        limit().await
    );
    let served = answers.iter().filter(|a| a.0 == 200).count();
    let mut statuses = std::collections::BTreeMap::new();
    for a in &answers {
        *statuses.entry((a.0, a.2.clone())).or_insert(0) += 1;
    }
    assert!(
        served * 2 > answers.len(),
        "most answers served: {served} of {}: {statuses:?}",
        answers.len()
    );
    drop(weir);
}

/// A cold start in front of an app that resets what it cannot take: the
/// limit starts open, so the first burst overflows the app once. Each
/// request the app refused waits for a slot again, under the limit the
/// refusals cut, and is sent once more: the burst is served whole. (Each
/// refusal was a `502` before: `weir_admission_requeued_total` counts them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_config_sends_a_refused_read_again_when_a_slot_frees() {
    let app = app(4, 0, 20.0, 20.0);
    let weir = zero_config(&app).await;
    let burst: Vec<_> = (0..32u8)
        .map(|i| {
            let to = weir.addr;
            tokio::spawn(async move {
                let (s, h, _) = get_from(ip(41, i, 1), to, &format!("/api/tile/{i}"), &[]).await;
                let reason = h
                    .get("x-weir-reason")
                    .map(|v| v.to_str().unwrap().to_owned());
                (s.as_u16(), reason)
            })
        })
        .collect();
    let mut answers = Vec::new();
    for b in burst {
        answers.push(b.await.unwrap());
    }
    let refused = app.snapshot().refused;
    assert!(refused > 0, "the burst overflowed the app at first");
    let failed: Vec<_> = answers.iter().filter(|a| a.0 != 200).collect();
    assert!(failed.is_empty(), "every request served: {failed:?}");
    let m = weir.metrics().await;
    let requeued = metric(&m, "weir_admission_requeued_total{pool=\"app\"}");
    assert_eq!(
        requeued, refused as f64,
        "each refusal waited for a slot again"
    );
    drop(weir);
}

/// A refused read that finds no slot before its deadline is shed as any
/// wait is: weir's `503` with `Retry-After`, not the app's refusal as a
/// `502`. One worker busy for 800 ms, no backlog: the second read is
/// refused, the limit cuts to 1, and its 150 ms wait for the busy slot ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_read_that_waits_past_its_deadline_is_shed() {
    let app = app(1, 0, 800.0, 800.0);
    let weir = TestWeir::start(&format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.app]\nservers = [\"{}\"]\n\n\
         [pools.app.admission]\nqueue_timeout = \"150ms\"\n",
        app.addr()
    ))
    .await;
    let to = weir.addr;
    let first = tokio::spawn(async move { get_from(ip(42, 0, 1), to, "/api/slow", &[]).await });
    assert_eventually_async!(
        app.snapshot().in_flight == 1,
        "the first read holds the app's one worker"
    );
    let (status, headers, _) = get_from(ip(42, 1, 1), to, "/api/slow", &[]).await;
    let reason = headers.get("x-weir-reason").and_then(|v| v.to_str().ok());
    assert_eq!(status, 503, "shed while waiting again: {reason:?}");
    assert_eq!(reason, Some("admission_deadline_exceeded"));
    assert!(headers.contains_key("retry-after"));
    assert_eq!(
        first.await.unwrap().0,
        200,
        "the busy worker's read is served"
    );
    assert_eq!(app.snapshot().refused, 1);
    let m = weir.metrics().await;
    assert_metric(&m, "weir_admission_requeued_total{pool=\"app\"}", 1.0);
    drop(weir);
}

/// Reads 4 pages, then one search, over and over from `source` until `stop`;
/// returns the requests answered.
async fn browse_loop(
    source: IpAddr,
    to: SocketAddr,
    (stop, tally): (Arc<AtomicBool>, Arc<Tally>),
) -> usize {
    let Ok(mut c) = H1::connect(source, to).await else {
        return 0;
    };
    let mut answered = 0;
    while !stop.load(Ordering::Relaxed) {
        let path = if answered % 5 == 4 {
            format!("/w/index.php?search=q{answered}")
        } else {
            format!("/wiki/Page{answered}")
        };
        let req = Request::get(path).header("host", "wiki.test");
        let Ok((status, _, _)) = c.send(req.body(full("")).unwrap()).await else {
            break;
        };
        tally.count(status.as_u16());
        answered += 1;
    }
    answered
}

/// weir's defaults with twelve people in one /16 reading pages and now and
/// then searching, against six crawler addresses in six /16s asking for
/// nothing but searches: the app (4 workers) is full of searches. Without
/// browsing evidence the twelve people are one network's turn, and their
/// searches wait about five times as long as a crawler's (two runs: 4.8x,
/// 5.0x); browsing (four pages per search), each is a turn of their own
/// (three runs: 0.7x to 1.0x).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_config_gives_people_behind_one_network_a_turn_each() {
    let app = app(4, 64, 2.0, 100.0);
    let weir = zero_config(&app).await;
    // A quiet spell: weir learns that searches are the expensive shape.
    learn_that_searches_are_expensive(&weir).await;

    let stop = Arc::new(AtomicBool::new(false));
    let (crawled, browsed) = (Arc::new(Tally::default()), Arc::new(Tally::default()));
    let crawlers: Vec<_> = (0..6u8)
        .map(|i| {
            tokio::spawn(client_loop(
                ip(50 + i, 0, 1),
                weir.addr,
                "/w/index.php?search=x",
                String::new(),
                (stop.clone(), crawled.clone()),
            ))
        })
        .collect();
    let people: Vec<_> = (0..12u8)
        .map(|i| {
            let ends = (stop.clone(), browsed.clone());
            tokio::spawn(browse_loop(ip(70, i, 1), weir.addr, ends))
        })
        .collect();
    // Forty searches of each side at least (one in five of people's requests).
    assert_eventually_async!(
        within = Duration::from_secs(30),
        crawled.answered() >= 40 && browsed.answered() >= 200,
        "crawlers {crawled:?}, people {browsed:?}"
    );
    stop.store(true, Ordering::Relaxed);
    let mut answered = 120;
    for c in crawlers {
        answered += c.await.unwrap().len();
    }
    for p in people {
        answered += p.await.unwrap();
    }
    // How long each side's searches waited for a slot.
    let log = weir.access_log(answered).await;
    let median_wait = |client_prefix: &str| {
        let mut waits: Vec<f64> = (log[120..].iter())
            .filter(|l| l["path"].as_str().is_some_and(|p| p.contains("search")))
            .filter(|l| {
                l["client"]
                    .as_str()
                    .is_some_and(|c| c.starts_with(client_prefix))
            })
            .map(|l| l["queue_ms"].as_f64().unwrap_or(0.0))
            .collect();
        assert!(
            waits.len() >= 10,
            "{client_prefix}: {} searches",
            waits.len()
        );
        waits.sort_by(f64::total_cmp);
        waits[waits.len() / 2]
    };
    let people_wait = median_wait("127.70.");
    let crawler_wait = median_wait("127.5");
    assert!(
        crawler_wait >= 100.0,
        "the crawlers kept the app full: their searches waited {crawler_wait} ms"
    );
    assert!(
        people_wait <= 2.0 * crawler_wait,
        "each person's search waited about a crawler's turn: {people_wait} ms against \
         {crawler_wait} ms"
    );
    drop(weir);
}

/// The `weir_visit=...` an answer set, if any.
fn visit_cookie(h: &http::HeaderMap) -> Option<String> {
    h.get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("weir_visit="))
        .map(|v| v.split(';').next().unwrap_or_default().to_owned())
}

/// People in the middle of reading go before the pages of clients weir
/// knows nothing of (issue 36: the crawlers of 2026 fetch an article before
/// each expensive page, and at the 2026-09-23 flood's peak people's pages
/// waited 2 to 8 s behind those articles in one lane). A visit weir counted
/// (one page served before) lifts a person's pages, and the scripts of
/// those pages, from `newcomers` to `visits`; a flood of cookieless page
/// fetches waits in `newcomers` and is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_visit_goes_before_the_pages_of_clients_weir_does_not_know() {
    let app = app(2, 64, 40.0, 40.0);
    let weir = TestWeir::start(&format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[pools.app]\nservers = [\"{}\"]\n\
         [pools.app.admission]\nmax_in_flight = 1\n",
        app.addr()
    ))
    .await;
    // The person's first page, before the flood: it starts the visit.
    let person = ip(80, 0, 1);
    let (s, h, _) = get_from(person, weir.addr, "/wiki/Start", &NAV).await;
    assert_eq!(s, 200);
    let mut cookie = visit_cookie(&h).expect("a page starts a visit");

    let stop = Arc::new(AtomicBool::new(false));
    let flood: Vec<_> = (0..12u8)
        .map(|i| {
            tokio::spawn(client_loop(
                ip(50 + i, 0, 1),
                weir.addr,
                "/wiki/Article",
                String::new(),
                (stop.clone(), Arc::default()),
            ))
        })
        .collect();
    // Once the flood holds a backlog, the person reads on: each page with
    // the visit the last one set, and one script of the page.
    assert_eventually_async!(
        within = Duration::from_secs(5),
        metric(
            &weir.metrics().await,
            "weir_admission_queued{pool=\"app\",lane=\"newcomers\"}",
        ) >= 6.0,
        "a backlog of newcomers"
    );
    let mut sent = 1;
    for page in 0..6 {
        let mut headers = NAV.to_vec();
        headers.push(("cookie", cookie.as_str()));
        let (s, h, _) = get_from(person, weir.addr, &format!("/wiki/P{page}"), &headers).await;
        assert_eq!(s, 200);
        cookie = visit_cookie(&h).expect("each page served moves the visit on");
        sent += 1;
    }
    let script = [
        ("sec-fetch-mode", "no-cors"),
        ("user-agent", NAV[2].1),
        ("cookie", cookie.as_str()),
    ];
    let (s, h, _) = get_from(person, weir.addr, "/load.php?modules=site", &script).await;
    assert_eq!(s, 200);
    assert!(visit_cookie(&h).is_none(), "a script counts nothing");
    sent += 1;
    stop.store(true, Ordering::Relaxed);
    let mut answers = Vec::new();
    for c in flood {
        answers.extend(c.await.unwrap());
    }
    assert!(
        answers.iter().all(|a| a.0 == 200),
        "the flood is served too: {:?}",
        answers.iter().filter(|a| a.0 != 200).collect::<Vec<_>>()
    );

    let log = weir.access_log(sent + answers.len()).await;
    let of = |client: &str| -> Vec<(String, f64)> {
        (log.iter())
            .filter(|l| l["client"] == client)
            .map(|l| {
                let lane = l["lane"].as_str().unwrap_or("none").to_owned();
                (lane, l["queue_ms"].as_f64().unwrap_or(0.0))
            })
            .collect()
    };
    let read = of("127.80.0.1");
    assert_eq!(read.len(), sent, "{read:?}");
    assert_eq!(read[0].0, "newcomers", "a first page: no visit yet");
    assert!(
        read[1..].iter().all(|(lane, _)| lane == "visits"),
        "pages and the script in the visit: {read:?}"
    );
    let mut flood_waits: Vec<f64> = (0..12u8)
        .flat_map(|i| of(&format!("127.{}.0.1", 50 + i)))
        .map(|(lane, wait)| {
            assert_eq!(lane, "newcomers");
            wait
        })
        .collect();
    flood_waits.sort_by(f64::total_cmp);
    let flood_median = flood_waits[flood_waits.len() / 2];
    let person_max = read[1..].iter().map(|(_, w)| *w).fold(0.0, f64::max);
    assert!(
        flood_median >= 100.0 && person_max * 3.0 < flood_median,
        "the person waited at most {person_max} ms, the flood's median {flood_median} ms"
    );
}
