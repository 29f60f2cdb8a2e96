//! Issue 19, priority instead of gates: a rule that defers serves what is
//! over its limit from capacity nobody else waits for, and refuses it only
//! when the lowest lane sheds it; a navigation over a rule a pass exempts is
//! challenged instead of refused, and its pass lets it through.

use std::net::IpAddr;
use std::time::Duration;

use crate::fixtures::*;
use crate::support::WeirConfig;

const KEY: &str = "priority-key-for-tests-0123456789abcdef";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The admission keys of a pool with one slot (two workers: the second is
/// the health check's).
const ONE_SLOT: &str = "max_in_flight = 1\nworkers = 2\n";

/// A config in front of `app` with one admission slot.
fn one_slot(app: &weir_lab::app::SimApp) -> WeirConfig {
    WeirConfig::new(app.addr()).admission(ONE_SLOT)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferring_rule_serves_from_spare_capacity_and_refuses_when_the_app_is_busy() {
    let app = small_sim_app();
    let cfg = one_slot(&app).route("page").then(
        r#"[classes.page]
queue_timeout = "300ms"
[[classes.page.rules]]
name = "share"
when_over = "defer"
limits = [{ per = "site", rate = 1, window = "1m" }]
"#,
    );
    let weir = TestWeir::start(&cfg.toml()).await;
    // Within the limit, then over it while the app is idle: both served.
    for who in ["127.110.0.1", "127.110.0.2"] {
        let (status, _, _) = get_from(ip(who), weir.addr, "/wiki/A", &[]).await;
        assert_eq!(status, 200, "{who}");
    }
    let m = weir.metrics().await;
    assert_metric(
        &m,
        "weir_rule_decisions_total{rule=\"share\",result=\"defer\"}",
        1.0,
    );
    assert_metric(&m, "weir_rejections_total{rule=\"share\"}", 0.0);
    let log = weir.access_log(2).await;
    assert_eq!(log[1]["lane"], "deferred", "{log:?}");
    assert_eq!(log[1]["status"], 200);

    // The app stalls with a deferred request in its one slot: the next
    // deferred request waits, is shed at its deadline, and is refused with
    // the rule's answer (429, not the queue's 503).
    let holder = stall_with_the_slot_held(&app, &weir, ip("127.110.1.1")).await;
    let (status, h, _) = get_from(ip("127.110.2.1"), weir.addr, "/wiki/C", &[]).await;
    assert_eq!(status, 429);
    assert_eq!(h["x-weir-reason"], "share");
    assert!(h.contains_key("retry-after"));
    let m = weir.metrics().await;
    assert_metric(&m, "weir_rejections_total{rule=\"share\"}", 1.0);
    let refused = weir.access_log(3).await;
    let refused = refused.last().unwrap();
    assert_eq!(refused["rule"], "share", "{refused}");
    assert_eq!(refused["rule_level"], "site");
    assert_eq!(refused["lane"], "deferred");
    resume_and_stop(app, weir, holder).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_navigation_over_a_rule_a_pass_exempts_is_challenged_and_its_pass_lets_it_through() {
    let up = Upstream::start().await;
    let cfg = WeirConfig::new(up.addr)
        .route("page")
        .then(
            r#"[classes.page]
challenge = "under_pressure"
[[classes.page.rules]]
name = "per-ip"
exempt = ["pass"]
limits = [{ per = "ip", rate = 1, window = "1m" }]
[[classes.page.rules]]
name = "per-pass"
limits = [{ per = "token", rate = 3, window = "1m" }]
"#,
        )
        .challenge(KEY, 8);
    let weir = TestWeir::start(&cfg.toml()).await;
    let me = ip("127.111.0.1");
    assert_eq!(get_from(me, weir.addr, "/wiki/A", &NAV).await.0, 200);
    // Over `per-ip`: a navigation is asked for proof, not refused...
    let (status, h, page) = get_from(me, weir.addr, "/wiki/B", &NAV).await;
    assert_eq!(status, 429);
    assert_eq!(h["x-weir-challenge"], "1");
    // ...anything else is refused.
    let json = [("accept", "application/json")];
    let (status, h, _) = get_from(me, weir.addr, "/api/x", &json).await;
    assert_eq!(status, 429);
    assert_eq!(h["x-weir-reason"], "per-ip");
    assert!(!h.contains_key("x-weir-challenge"));
    let m = weir.metrics().await;
    assert_metric(
        &m,
        "weir_rule_decisions_total{rule=\"per-ip\",result=\"challenge\"}",
        1.0,
    );
    // Only the API request was a refusal.
    assert_metric(&m, "weir_rejections_total{rule=\"per-ip\"}", 1.0);

    // The pass exempts from `per-ip`; `per-pass` limits it by its own key.
    let (status, _, cookie) = solve_challenge(me, weir.addr, &page, 8, "Mozilla/5.0 test").await;
    assert_eq!(status, 303);
    let with_pass = nav_with_cookie(&cookie);
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let (status, h, _) = get_from(me, weir.addr, "/wiki/B", &with_pass).await;
        assert!(
            !h.contains_key("x-weir-challenge"),
            "never a second challenge"
        );
        statuses.push(status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
}

/// A carrier NAT's person over their /16's share is deferred to the lowest
/// lane; while pressure (which counts the lanes above it) is off, they were
/// asked for proof only when shed, after waiting out the class's whole
/// deadline behind whatever else was deferred. A deferred navigation a pass
/// would exempt gets the page as soon as its wait is expected to be long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_navigation_a_pass_exempts_is_challenged_on_a_long_wait_without_pressure() {
    let app = small_sim_app();
    let cfg = one_slot(&app)
        .route("page")
        .then(
            r#"[classes.page]
challenge = "under_pressure"
queue_timeout = "30s"
[[classes.page.rules]]
name = "per-16"
exempt = ["pass"]
when_over = "defer"
limits = [{ per = "network", rate = 1, window = "1m" }]
"#,
        )
        .challenge(KEY, 8);
    let weir = TestWeir::start(&cfg.toml()).await;
    // The /16's share, then the app stalls with one request in its one slot.
    assert_eq!(
        get_from(ip("127.112.0.1"), weir.addr, "/wiki/A", &NAV)
            .await
            .0,
        200
    );
    let holder = stall_with_the_slot_held(&app, &weir, ip("127.113.0.1")).await;
    // Another person of the same /16: over its share, deferred, nothing
    // queued above the deferred lane (no pressure). The page, not a wait
    // of the class's 30 s.
    let neighbour = ip("127.112.5.1");
    let (status, h, page) = tokio::time::timeout(
        Duration::from_secs(10),
        get_from(neighbour, weir.addr, "/wiki/C", &NAV),
    )
    .await
    .expect("a deferred navigation waited instead of being offered the challenge");
    assert_eq!(status, 429);
    assert_eq!(h["x-weir-challenge"], "1");
    let m = weir.metrics().await;
    assert_metric(
        &m,
        "weir_rule_decisions_total{rule=\"per-16\",result=\"defer\"}",
        1.0,
    );
    assert_metric(&m, "weir_rejections_total{rule=\"per-16\"}", 0.0);
    // Its pass exempts from the /16's share: served once the app is back.
    let (status, _, cookie) =
        solve_challenge(neighbour, weir.addr, &page, 8, "Mozilla/5.0 test").await;
    assert_eq!(status, 303);
    app.unstall();
    assert_eq!(holder.await.unwrap(), 200);
    let with_pass = nav_with_cookie(&cookie);
    let (status, h, _) = get_from(neighbour, weir.addr, "/wiki/C", &with_pass).await;
    assert_eq!(status, 200, "{h:?}");
    stop(app, weir).await;
}

/// A pass is proof on every request, not only on the class that challenged:
/// a person's cheap pages are exempt from rules that name `pass` too, and
/// go in a turn of their pass's own (under its network). Before, a class
/// without a challenge never read the pass, and a carrier NAT's pages
/// shared one turn for its /16 (waits of 1-3.6 s in the 2026-09-23
/// scenario) while the same people's searches went by their passes. A pass
/// alone lifts no cheap page above strangers' (issue 55: it proves a
/// browser, and crawlers run browsers); a person's visit does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_is_proof_on_a_class_that_does_not_challenge() {
    let up = Upstream::start().await;
    let cfg = WeirConfig::new(up.addr)
        .route_with("search", r#"query_keys = ["search"]"#)
        .route("page")
        .then(
            r#"[classes.search]
challenge = "always"
[[classes.page.rules]]
name = "per-ip"
exempt = ["pass"]
limits = [{ per = "ip", rate = 1, window = "1m" }]
"#,
        )
        .challenge(KEY, 8);
    let weir = TestWeir::start(&cfg.toml()).await;
    let me = ip("127.114.0.1");
    let (status, h, page) = get_from(me, weir.addr, "/w/index.php?search=x", &NAV).await;
    assert_eq!(status, 429);
    assert_eq!(h["x-weir-challenge"], "1");
    let (status, _, cookie) = solve_challenge(me, weir.addr, &page, 8, "Mozilla/5.0 test").await;
    assert_eq!(status, 303);
    let with_pass = nav_with_cookie(&cookie);
    // `page` does not challenge; its rule exempts a pass: every page served.
    for n in 0..3 {
        let (status, h, _) = get_from(me, weir.addr, "/wiki/A", &with_pass).await;
        assert_eq!(status, 200, "page {n} with a pass: {h:?}");
    }
    let log = weir.access_log(5).await;
    let pages: Vec<_> = log.iter().filter(|r| r["path"] == "/wiki/A").collect();
    assert_eq!(pages.len(), 3, "{log:?}");
    for r in pages {
        assert_eq!(r["challenge"], "pass", "{r}");
        assert_eq!(r["lane"], "newcomers", "{r}");
        assert!(r["rule"].is_null(), "{r}");
    }
    // Without it, the same address is over `per-ip` at once.
    let other = ip("127.114.0.2");
    assert_eq!(get_from(other, weir.addr, "/wiki/A", &NAV).await.0, 200);
    let (status, h, _) = get_from(other, weir.addr, "/wiki/A", &NAV).await;
    assert_eq!(status, 429);
    assert_eq!(h["x-weir-reason"], "per-ip");
}

/// An unproven navigation of an `under_pressure` class that has waited twice
/// `pressure.wait` for a slot gets the page, whether or not pressure has
/// engaged: in a flood's first seconds (before `engage_after`) people's
/// searches had waited 2-3.6 s in the lowest lane, where the page and the
/// pass lane take about one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_navigation_that_waits_twice_pressure_wait_gets_the_page_before_pressure_engages() {
    let app = small_sim_app();
    let cfg = one_slot(&app)
        .route("page")
        .then(
            r#"[classes.page]
challenge = "under_pressure"
queue_timeout = "30s"
"#,
        )
        .challenge(KEY, 8)
        .then(
            r#"[challenge.pressure]
wait = "100ms"
engage_after = "10m"
"#,
        );
    let weir = TestWeir::start(&cfg.toml()).await;
    let holder = stall_with_the_slot_held(&app, &weir, ip("127.115.0.1")).await;
    let started = std::time::Instant::now();
    let (status, h, _) = tokio::time::timeout(
        Duration::from_secs(10),
        get_from(ip("127.116.0.1"), weir.addr, "/wiki/C", &NAV),
    )
    .await
    .expect("the navigation waited out its class's deadline instead of being offered the page");
    assert_eq!(status, 429);
    assert_eq!(h["x-weir-challenge"], "1");
    // It did wait first: the page is for a wait, not for a queue.
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "{:?}",
        started.elapsed()
    );
    let m = weir.metrics().await;
    assert_metric(&m, "weir_challenge_engaged{pool=\"app\"}", 0.0);
    resume_and_stop(app, weir, holder).await;
}

/// The access-log line of the request for `path`.
async fn line_for(weir: &TestWeir, path: &str) -> serde_json::Value {
    let log = weir.access_log(1).await;
    let line = log.iter().find(|r| r["path"] == path).cloned();
    line.unwrap_or_else(|| panic!("no line for {path}: {log:?}"))
}

/// A client that gives up while its request waits for a slot leaves a line
/// (nginx's 499, with its lane and wait) and counts in
/// `weir_requests_total`; before, it left nothing, and people who gave up
/// waiting were invisible to the operator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_while_queued_is_logged_as_499() {
    use tokio::io::AsyncWriteExt;
    let app = small_sim_app();
    // The slot's queue waits 30 s.
    let cfg =
        WeirConfig::new(app.addr()).admission(&format!("{ONE_SLOT}queue_timeout = \"30s\"\n"));
    let weir = TestWeir::start(&cfg.toml()).await;
    let holder = stall_with_the_slot_held(&app, &weir, ip("127.117.0.1")).await;
    let mut client = connect_from(ip("127.118.0.1"), weir.addr).await.unwrap();
    client
        .write_all(b"GET /wiki/Given_up HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    assert_eventually_async!(queued(&weir.metrics().await) >= 1.0, "never queued");
    // The client's patience, the stimulus: it gives up 100 ms into its wait.
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(client);
    let line = line_for(&weir, "/wiki/Given_up").await;
    assert_eq!(line["status"], 499, "{line}");
    assert!(line["lane"].is_string(), "it waited in a lane: {line}");
    // What the phases before the wait found is in the line too.
    assert_eq!(line["class"], "default", "{line}");
    assert_eq!(line["pool"], "app", "{line}");
    assert_eq!(line["decision"], "admit", "{line}");
    assert!(line["upstream"].is_null(), "{line}");
    assert!(line["duration_ms"].as_f64().unwrap() >= 100.0, "{line}");
    let m = weir.metrics().await;
    assert_eq!(queued(&m), 0.0, "{m}");
    resume_and_stop(app, weir, holder).await;
}

/// An HTTP/2 stream the client resets while its request waits: the line is
/// written (499), and the connection, with nothing in flight, is idle again,
/// so `keepalive_idle_timeout` closes it. Before, the connection counted
/// the dropped request in flight for ever: never idle, never closed for
/// idleness, never the first to go at `max_connections`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_stream_reset_while_queued_is_logged_and_its_connection_idles_out() {
    let app = small_sim_app();
    let cfg = one_slot(&app).then("[limits]\nkeepalive_idle_timeout = \"1s\"\n");
    let weir = TestWeir::start(&cfg.toml()).await;
    let holder = stall_with_the_slot_held(&app, &weir, ip("127.119.0.1")).await;
    let stream = connect_from(ip("127.120.0.1"), weir.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    let conn = tokio::spawn(conn);
    let req = http::Request::get("http://a/wiki/Reset")
        .body(full(""))
        .unwrap();
    let waiting = tokio::spawn(send.send_request(req));
    assert_eventually_async!(queued(&weir.metrics().await) >= 1.0, "never queued");
    // Dropping the response resets the stream (RST_STREAM, CANCEL).
    waiting.abort();
    let line = line_for(&weir, "/wiki/Reset").await;
    assert_eq!(line["status"], 499, "{line}");
    assert_eq!(line["proto"], "HTTP/2", "{line}");
    // `send` is kept: the client would close an unused connection itself.
    tokio::time::timeout(Duration::from_secs(10), conn)
        .await
        .expect("weir never closed the idle HTTP/2 connection")
        .unwrap()
        .ok();
    drop(send);
    resume_and_stop(app, weir, holder).await;
}

#[test]
fn a_pass_without_a_challenge_and_a_deferring_concurrency_rule_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    std::fs::write(
        &path,
        WeirConfig::new("127.0.0.1:9")
            .then("[challenge]\nenabled = false\n")
            .route("page")
            .then(
                r#"[[classes.page.rules]]
name = "per-ip"
exempt = ["pass"]
limits = [{ per = "ip", rate = 1, window = "1m" }]
[[classes.page.rules]]
name = "slots"
type = "concurrency"
per = "subnet"
max = 4
when_over = "defer"
"#,
            )
            .toml(),
    )
    .unwrap();
    let loaded = weir::config::load_file(&path, &weir::config::ProcessEnv).unwrap();
    let err = weir::gateway::Gateway::build(loaded, None, 1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("classes.page.rules[0].exempt[0]"), "{err}");
    assert!(
        err.contains("`challenge.enabled = false` grants no passes"),
        "{err}"
    );
    assert!(err.contains("classes.page.rules[1].when_over"), "{err}");
    assert!(err.contains("a concurrency rule cannot defer"), "{err}");
}

/// Issue 55: admission ranks by the evidence of a person, not the proof of
/// a browser (crawlers run browsers). With the app's one slot held, a
/// crawler's search with a pass of work waits in `pass`, a stranger's
/// first page in `newcomers`, and a person's search in a visit weir counted
/// (three pages read, then a pass) in `visits`. Released, the person's goes
/// first and the stranger's second, though they came last and second; the
/// crawler's waits for both. Before, a pass was the top rank a stranger
/// could earn, and a browser earned it as a person did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persons_visit_ranks_above_a_pass_and_a_pass_below_strangers_pages() {
    let app = small_sim_app();
    let cfg = one_slot(&app)
        .route_with("search", r#"query_keys = ["search"]"#)
        .route("page")
        .then("[classes.search]\nchallenge = \"always\"\nlane = \"anonymous\"\n")
        .challenge(KEY, 8);
    let weir = TestWeir::start(&cfg.toml()).await;
    let addr = weir.addr;
    // A pass each, from the search's page.
    let pass_of = |who: IpAddr| async move {
        let (_, _, page) = get_from(who, addr, "/w/index.php?search=a", &NAV).await;
        let (status, _, cookie) = solve_challenge(who, addr, &page, 8, "Mozilla/5.0 test").await;
        assert_eq!(status, 303);
        cookie
    };
    let (crawler, person, stranger) = (ip("127.150.0.1"), ip("127.151.0.1"), ip("127.152.0.1"));
    let crawler_pass = pass_of(crawler).await;
    let person_pass = pass_of(person).await;
    let visit = read_three_pages(person, addr).await;
    let person_cookie = format!("{visit}; {person_pass}");

    let holder = stall_with_the_slot_held(&app, &weir, ip("127.153.0.1")).await;
    let crawls = tokio::spawn(async move {
        get_from(
            crawler,
            addr,
            "/w/index.php?search=crawl",
            &nav_with_cookie(&crawler_pass),
        )
        .await
        .0
    });
    assert_eventually_async!(
        waiting_in(&weir, "pass").await >= 1.0,
        "the crawler's search never queued"
    );
    let reads = tokio::spawn(async move { get_from(stranger, addr, "/wiki/First", &NAV).await.0 });
    assert_eventually_async!(
        waiting_in(&weir, "newcomers").await >= 1.0,
        "the stranger's page never queued"
    );
    let searches = tokio::spawn(async move {
        get_from(
            person,
            addr,
            "/w/index.php?search=person",
            &nav_with_cookie(&person_cookie),
        )
        .await
        .0
    });
    assert_eventually_async!(
        waiting_in(&weir, "visits").await >= 1.0,
        "the person's search never queued"
    );
    app.unstall();
    assert_eq!(holder.await.unwrap(), 200);
    for waiting in [searches, reads, crawls] {
        assert_eq!(waiting.await.unwrap(), 200);
    }
    let log = weir.access_log(2 * 2 + 3 + 1 + 3).await;
    let order: Vec<(&str, &str)> = (log.iter())
        .filter_map(|l| Some((l["path"].as_str()?, l["lane"].as_str()?)))
        .filter(|(p, _)| {
            [
                "/w/index.php?search=crawl",
                "/wiki/First",
                "/w/index.php?search=person",
            ]
            .contains(p)
        })
        .collect();
    assert_eq!(
        order,
        [
            ("/w/index.php?search=person", "visits"),
            ("/wiki/First", "newcomers"),
            ("/w/index.php?search=crawl", "pass"),
        ]
    );
    stop(app, weir).await;
}

/// A person reads three pages from `who`, keeping the visit's cookie: its
/// `weir_visit=...` after the third.
async fn read_three_pages(who: IpAddr, addr: std::net::SocketAddr) -> String {
    let mut visit = String::new();
    for n in 0..3 {
        let mut sent = NAV.to_vec();
        if !visit.is_empty() {
            sent.push(("cookie", &visit));
        }
        let (status, h, _) = get_from(who, addr, &format!("/wiki/Read{n}"), &sent).await;
        assert_eq!(status, 200);
        let mut set = h
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok());
        let next = set.rfind(|v| v.starts_with("weir_visit="));
        visit = next
            .expect("a page read counts")
            .split(';')
            .next()
            .unwrap()
            .to_owned();
    }
    visit
}

/// A `POST` from `who` with `headers` and a small form body, on a fresh
/// connection: its status.
async fn post_from(
    who: IpAddr,
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> http::StatusCode {
    let mut c = H1::connect(who, addr).await.unwrap();
    let mut b = http::Request::post(path)
        .header("host", "test.local")
        .header("content-type", "application/x-www-form-urlencoded");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    c.send(b.body(full("user=a&password=b")).unwrap())
        .await
        .unwrap()
        .0
}

/// Issue 55: a person's logins and API calls rank as their visit does,
/// before any session exists. With the app's one slot held, a stranger's
/// login `POST` (a form's navigation) waits in `anonymous`, the class's
/// lane; the same login from a person who has read three pages, and that
/// person's API call (a script's `fetch`, no navigation), wait in
/// `visits`, and both are answered before the stranger's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persons_login_and_api_calls_rank_as_their_visit() {
    let app = small_sim_app();
    let cfg = one_slot(&app)
        .route_with("api", r#"query_keys = ["action"]"#)
        .route("page")
        .then("[classes.api]\nlane = \"anonymous\"\n");
    let weir = TestWeir::start(&cfg.toml()).await;
    let addr = weir.addr;
    let (person, stranger) = (ip("127.160.0.1"), ip("127.161.0.1"));
    let visit = read_three_pages(person, addr).await;

    let holder = stall_with_the_slot_held(&app, &weir, ip("127.162.0.1")).await;
    let form: Vec<(&str, &str)> = NAV.to_vec();
    let strangers = tokio::spawn(async move {
        post_from(
            stranger,
            addr,
            "/w/api.php?action=login&who=stranger",
            &form,
        )
        .await
    });
    assert_eventually_async!(
        waiting_in(&weir, "anonymous").await >= 1.0,
        "the stranger's login never queued"
    );
    let login_cookie = visit.clone();
    let logs_in = tokio::spawn(async move {
        let sent = nav_with_cookie(&login_cookie);
        post_from(person, addr, "/w/api.php?action=login&who=person", &sent).await
    });
    let calls = tokio::spawn(async move {
        let sent = [
            ("accept", "application/json"),
            ("sec-fetch-mode", "cors"),
            ("user-agent", "Mozilla/5.0 test"),
            ("cookie", visit.as_str()),
        ];
        post_from(person, addr, "/w/api.php?action=edit&who=person", &sent).await
    });
    assert_eventually_async!(
        waiting_in(&weir, "visits").await >= 2.0,
        "the person's login and API call never queued in visits"
    );
    app.unstall();
    assert_eq!(holder.await.unwrap(), 200);
    for waiting in [logs_in, calls, strangers] {
        assert!(waiting.await.unwrap().as_u16() < 500);
    }
    let log = weir.access_log(3 + 1 + 3).await;
    let lane_of = |who: &str| {
        let line = (log.iter())
            .position(|l| l["path"].as_str().is_some_and(|p| p.ends_with(who)))
            .unwrap_or_else(|| panic!("no line for {who}"));
        (
            line,
            log[line]["lane"].as_str().unwrap_or_default().to_owned(),
        )
    };
    let (stranger_at, stranger_lane) = lane_of("action=login&who=stranger");
    let (login_at, login_lane) = lane_of("action=login&who=person");
    let (call_at, call_lane) = lane_of("action=edit&who=person");
    assert_eq!(
        [
            stranger_lane.as_str(),
            login_lane.as_str(),
            call_lane.as_str()
        ],
        ["anonymous", "visits", "visits"]
    );
    assert!(login_at < stranger_at && call_at < stranger_at, "{log:#?}");
    stop(app, weir).await;
}
