//! Issue 36, the challenge with zero configuration: without `[challenge]`,
//! weir offers proof to browser navigations of the request shapes the pool
//! learned are expensive, and only where they would wait long; to a cheap
//! page only instead of a `503`; never to a request that is not a
//! navigation. Its key is generated
//! once and kept in the state directory; `enabled = false` turns it off.

use std::net::IpAddr;
use std::time::Duration;

use crate::fixtures::*;
use crate::support::WeirConfig;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// An app whose searches take ~200 ms and pages ~30 ms, behind weir with a
/// listener, a pool of one admission slot (so that a request waits) and
/// `rest`; the state directory is the test's.
fn config(app: &weir_lab::app::SimApp, rest: &str) -> String {
    WeirConfig::new(app.addr())
        .then("[state]\ndir = \"{{dir}}/state\"")
        .admission(&format!("max_in_flight = 1\nworkers = 2\n{rest}"))
        .toml()
}

fn slow_search_app() -> weir_lab::app::SimApp {
    two_worker_sim_app(0.5)
}

/// A [`slow_search_app`] behind weir with [`config`]`(rest)`, once weir has
/// learned its shapes ([`learn_shapes`]) and the app stalled with a page
/// from 127.121.0.1 holding its one slot (the handle gives its status).
async fn learned_then_stalled(
    rest: &str,
) -> (
    weir_lab::app::SimApp,
    TestWeir,
    tokio::task::JoinHandle<http::StatusCode>,
) {
    let app = slow_search_app();
    let weir = TestWeir::start(&config(&app, rest)).await;
    learn_shapes(&weir).await;
    let holder = stall_with_the_slot_held(&app, &weir, ip("127.121.0.1")).await;
    (app, weir, holder)
}

/// Teaches weir the app's shapes: enough answers of pages and of searches
/// that searches are judged expensive.
async fn learn_shapes(weir: &TestWeir) {
    for i in 0..24 {
        let me = ip(&format!("127.120.{}.1", i % 8));
        assert_eq!(
            get_from(me, weir.addr, &format!("/wiki/P{i}"), &[]).await.0,
            200
        );
        let search = format!("/w/index.php?search=s{i}");
        assert_eq!(get_from(me, weir.addr, &search, &[]).await.0, 200);
    }
    let m = weir.metrics().await;
    assert_eq!(
        metric(&m, "weir_admission_expensive_shapes{pool=\"app\"}"),
        1.0,
        "searches learned expensive, pages not: {m}"
    );
}

/// Requests holding a slot of the stalled app or waiting for one.
fn held_or_queued(metrics: &str) -> f64 {
    queued(metrics) + metric(metrics, "weir_admission_in_flight{pool=\"app\"}")
}

/// A request from `from`, once it holds a slot of the stalled app or waits
/// for one (no answer yet).
async fn still_waiting(
    weir: &TestWeir,
    from: &str,
    path: &str,
    headers: &'static [(&'static str, &'static str)],
) -> tokio::task::JoinHandle<http::StatusCode> {
    let before = held_or_queued(&weir.metrics().await);
    let (addr, from, path) = (weir.addr, ip(from), path.to_string());
    let waiter = tokio::spawn(async move { get_from(from, addr, &path, headers).await.0 });
    assert_eventually_async!(
        held_or_queued(&weir.metrics().await) > before,
        "it neither holds a slot nor waits for one"
    );
    assert!(!waiter.is_finished(), "answered while the app was stalled");
    waiter
}

/// [`offered_the_page`] within 5 s (`why` if not), but no sooner than 3 s
/// (the `pressure.wait` of the tests that call it) after this call (`early`
/// if sooner); its body.
async fn offered_the_page_after_the_wait(weir: &TestWeir, why: &str, early: &str) -> Vec<u8> {
    let started = std::time::Instant::now();
    let body = offered_the_page(weir, Duration::from_secs(5), why).await;
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "{early}: {:?}",
        started.elapsed()
    );
    body
}

/// A person's search navigation from 127.124.0.1, answered within `within`
/// with the challenge page (`why` if not); its body.
async fn offered_the_page(weir: &TestWeir, within: Duration, why: &str) -> Vec<u8> {
    let search = get_from(
        ip("127.124.0.1"),
        weir.addr,
        "/w/index.php?search=person",
        &NAV,
    );
    let (status, h, body) = tokio::time::timeout(within, search).await.expect(why);
    assert_eq!(status, 429);
    assert_eq!(h["x-weir-challenge"], "1");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_zero_configuration_a_long_wait_for_an_expensive_page_is_offered_the_challenge() {
    let app = slow_search_app();
    let weir = TestWeir::start(&config(&app, "")).await;
    learn_shapes(&weir).await;
    let holder = stall_with_the_slot_held(&app, &weir, ip("127.121.0.1")).await;
    // Waiting beside it, and never challenged: a cheap page, and a search
    // that is not a navigation (an API call, a `fetch()`).
    let long = Duration::from_millis(2_500);
    let page = still_waiting(&weir, "127.122.0.1", "/wiki/Cheap", &NAV).await;
    let api = still_waiting(&weir, "127.123.0.1", "/w/index.php?search=api", &[]).await;
    // The search a person navigates to gets the page: at once if its wait
    // is expected to be long, else after `pressure.wait` (500 ms).
    let body = offered_the_page(&weir, long, "the navigation was not offered the challenge").await;
    assert!(
        !page.is_finished() && !api.is_finished(),
        "they wait for the app, unchallenged"
    );
    // The page solves with weir's own key, kept in the state directory.
    let (answered, _, cookie) =
        solve_challenge(ip("127.124.0.1"), weir.addr, &body, 12, NAV[2].1).await;
    assert_eq!(answered, 303, "a pass for the solved page");
    assert!(cookie.starts_with("weir_pass="), "{cookie}");
    let key = weir.dir.path().join("state").join("challenge.key");
    assert!(key.exists(), "the key is kept in the state directory");
    app.unstall();
    assert_eq!(holder.await.unwrap(), 200);
    assert_eq!(page.await.unwrap(), 200);
    assert_eq!(api.await.unwrap(), 200);
    stop(app, weir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_challenge_offers_nothing() {
    let app = slow_search_app();
    // The visit cookie signs with the same key: off too, nothing is written.
    let off = "[challenge]\nenabled = false\n[visit]\nenabled = false\n";
    let weir = TestWeir::start(&config(&app, off)).await;
    learn_shapes(&weir).await;
    let holder = stall_with_the_slot_held(&app, &weir, ip("127.121.0.1")).await;
    let search = still_waiting(&weir, "127.124.0.1", "/w/index.php?search=person", &NAV).await;
    // Time is what this test is about: past `pressure.wait` (500 ms), when
    // an enabled challenge would have been offered, nothing is.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert!(!search.is_finished(), "answered while the app was stalled");
    app.unstall();
    assert_eq!(
        search.await.unwrap(),
        200,
        "served after its wait, never challenged"
    );
    assert!(!weir.dir.path().join("state").join("challenge.key").exists());
    resume_and_stop(app, weir, holder).await;
}

/// Item 3 of issue 36: a person shed from the queue gets the challenge, not a
/// `503`. The queue holds one waiter; a person's search (a learned expensive
/// shape, so the lowest lane) waits there, and a cheap page that arrives
/// after it takes its place (`lower_lane_shed`). `pressure.wait` is long here
/// so that the search waits instead of being offered the page at once: the
/// shed is what this test is about, and the generated key still serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_shed_from_the_queue_gets_the_challenge_not_a_503() {
    let rest = "max_queued = 1\n[challenge.pressure]\nwait = \"10s\"\n";
    let (app, weir, holder) = learned_then_stalled(rest).await;
    let (addr, person) = (weir.addr, ip("127.124.0.1"));
    let search =
        tokio::spawn(
            async move { get_from(person, addr, "/w/index.php?search=person", &NAV).await },
        );
    assert_eventually_async!(queued(&weir.metrics().await) == 1.0, "the search waits");
    // A cheap page takes the worker kept for health checks (lent to a fast
    // page); a second one takes the one place in the queue.
    let page = |from: &'static str| {
        tokio::spawn(async move { get_from(ip(from), addr, "/wiki/Cheap", &NAV).await.0 })
    };
    let lent = page("127.122.0.1");
    assert_eventually_async!(
        metric(
            &weir.metrics().await,
            "weir_admission_in_flight{pool=\"app\"}"
        ) == 2.0,
        "the first page holds the lent worker"
    );
    let queued_page = page("127.125.0.1");
    let (status, h, body) = tokio::time::timeout(Duration::from_secs(10), search)
        .await
        .expect("the shed search was answered")
        .unwrap();
    assert_eq!(status, 429, "the challenge, not a 503");
    assert_eq!(h["x-weir-challenge"], "1");
    let m = weir.metrics().await;
    assert_metric(
        &m,
        "weir_admission_shed_total{pool=\"app\",lane=\"anonymous\",reason=\"lower_lane_shed\"}",
        1.0,
    );
    // Its pass (weir's own key) is the pass lane: served once the app is back.
    let (answered, _, cookie) = solve_challenge(person, addr, &body, 12, NAV[2].1).await;
    assert_eq!(answered, 303);
    app.unstall();
    assert_eq!(lent.await.unwrap(), 200);
    assert_eq!(queued_page.await.unwrap(), 200);
    let with_pass = nav_with_cookie(&cookie);
    let (status, _, _) = get_from(person, addr, "/w/index.php?search=person", &with_pass).await;
    assert_eq!(status, 200);
    resume_and_stop(app, weir, holder).await;
}

/// A learned class offers the page once a navigation has waited
/// `pressure.wait`, not twice that: the estimate (from the app's fast
/// answers, before it stalled) says the search would not wait long, so it
/// waits, and gets the page when the wait proves long. At twice the wait, a
/// person without JavaScript had waited 1 s, then the no-script 500 ms, then
/// the page, and came past 2 s (`2026-09-23-crawlers-like-people.toml`).
/// `pressure.wait` is 3 s so that once (3 s) and twice (6 s) are far apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learned_class_offers_the_page_once_the_navigation_has_waited_pressure_wait() {
    let rest = "[challenge.pressure]\nwait = \"3s\"\n";
    let (app, weir, holder) = learned_then_stalled(rest).await;
    offered_the_page_after_the_wait(
        &weir,
        "no page after 5 s: twice `pressure.wait` (6 s) is the off-pressure fallback",
        "it waited first (the estimate was short)",
    )
    .await;
    resume_and_stop(app, weir, holder).await;
}

/// The no-script delay counts the wait the page came after: a person
/// without JavaScript who waited `pressure.wait` in the queue for the page
/// has spent that time, and follows the refresh to a pass at once. Issued
/// at the end of the wait, the page made them wait the whole delay again
/// (500 ms after 500 ms, then the page: past 2 s where the app was slow).
/// Both are 3 s here, so that a refresh held for the delay (3 s) and one
/// answered at once (milliseconds) are far apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_no_script_delay_counts_the_wait_for_the_page() {
    let rest = "[challenge]\nno_script_delay = \"3s\"\n[challenge.pressure]\nwait = \"3s\"\n";
    let (app, weir, holder) = learned_then_stalled(rest).await;
    let body = offered_the_page_after_the_wait(
        &weir,
        "no page after the wait",
        "the page came after the wait",
    )
    .await;
    let link = no_script_link(&body);
    let probe = jar(&body);
    let headers = nav_with_cookie(&probe);
    let refresh = get_from(ip("127.124.0.1"), weir.addr, &link, &headers);
    let (status, h, _) = tokio::time::timeout(Duration::from_secs(2), refresh)
        .await
        .expect("the refresh was held for the delay the queue's wait had spent");
    assert_eq!(status, 303, "{h:?}");
    assert!(
        h["set-cookie"].to_str().unwrap().starts_with("weir_pass="),
        "{h:?}"
    );
    resume_and_stop(app, weir, holder).await;
}

/// Item 3 of issue 36 for a cheap page: a person's article that waits out
/// its queue deadline gets the challenge, not a `503`, and not before (its
/// shape is no flood's: it waits like anyone's, past `pressure.wait` and
/// twice that). A request that is not a navigation gets the `503`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cheap_page_that_waits_out_its_deadline_gets_the_challenge_not_a_503() {
    let app = slow_search_app();
    let rest = "queue_timeout = \"3s\"\n[challenge.pressure]\nwait = \"1s\"\n";
    let weir = TestWeir::start(&config(&app, rest)).await;
    let holder = stall_with_the_slot_held(&app, &weir, ip("127.121.0.1")).await;
    let addr = weir.addr;
    let started = std::time::Instant::now();
    let api =
        tokio::spawn(async move { get_from(ip("127.123.0.1"), addr, "/wiki/Api", &[]).await });
    let (status, h, body) = get_from(ip("127.124.0.1"), addr, "/wiki/Article", &NAV).await;
    assert_eq!(status, 429, "the challenge, not a 503");
    assert_eq!(h["x-weir-challenge"], "1");
    assert!(
        started.elapsed() >= Duration::from_millis(2_900),
        "not before its deadline (3 s): {:?}",
        started.elapsed()
    );
    let (status, h, _) = api.await.unwrap();
    assert_eq!(status, 503, "{h:?}");
    // Its pass (weir's own key) is the pass lane: served once the app is back.
    let person = ip("127.124.0.1");
    let (answered, _, cookie) = solve_challenge(person, addr, &body, 12, NAV[2].1).await;
    assert_eq!(answered, 303);
    app.unstall();
    let with_pass = nav_with_cookie(&cookie);
    assert_eq!(
        get_from(person, addr, "/wiki/Article", &with_pass).await.0,
        200
    );
    resume_and_stop(app, weir, holder).await;
}
