//! The browser challenge wired into weir's request path: navigations without
//! a pass get the challenge page; APIs and POSTs never do; an answer computed
//! the way a browser does earns a pass that admits the next requests and
//! counts as its own rate-limit key.

use std::net::IpAddr;

use http::Request;

use crate::fixtures::*;
use crate::support::WeirConfig;

const KEY: &str = PRESSURE_KEY;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Pages always challenged, limited per pass; `[challenge]` last.
fn config(up: std::net::SocketAddr) -> String {
    WeirConfig::new(up)
        .route("page")
        .then(
            r#"[classes.page]
challenge = "always"
[[classes.page.rules]]
name = "per-pass"
limits = [{ per = "token", rate = 5, window = "1m" }]"#,
        )
        .challenge(KEY, 10)
        .toml()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn navigations_are_challenged_and_a_solved_answer_earns_a_pass() {
    let up = Upstream::start().await;
    let weir = TestWeir::start(&config(up.addr)).await;
    let me = ip("127.100.0.1");

    // A browser navigation without a pass: the challenge page.
    let (status, h, body) = get_from(me, weir.addr, "/wiki/Page?x=1", &NAV).await;
    assert_eq!(status, 429);
    assert_eq!(h["x-weir-challenge"], "1");
    assert!(h.contains_key("content-security-policy"));
    assert_eq!(up.hits.load(std::sync::atomic::Ordering::Relaxed), 0);

    // API clients and POSTs are never challenged.
    let (status, _, _) = get_from(
        me,
        weir.addr,
        "/api/v1/x",
        &[("accept", "application/json")],
    )
    .await;
    assert_eq!(status, 200);
    let mut c = H1::connect(me, weir.addr).await.unwrap();
    let (status, _, _) = c
        .send(
            Request::post("/wiki/Page")
                .header("host", "t")
                .header("accept", "text/html")
                .body(full("a=1"))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(status, 200);

    // Solve it as a browser would, natively, with the same algorithm.
    let (status, h, cookie) = solve_challenge(me, weir.addr, &body, 10, "Mozilla/5.0 test").await;
    assert_eq!(status, 303, "a correct answer redirects back");
    assert_eq!(h["location"], "/wiki/Page?x=1");
    assert!(cookie.starts_with("weir_pass="), "{cookie}");

    // The pass admits the navigation; its token is a rate-limit key: 5 a minute.
    let with_pass = nav_with_cookie(&cookie);
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(
            get_from(me, weir.addr, "/wiki/Page?x=1", &with_pass)
                .await
                .0
                .as_u16(),
        );
    }
    assert_eq!(statuses, vec![200, 200, 200, 200, 200, 429]);
    // The same pass from another /24 is not valid: challenged again.
    let (status, h, _) = get_from(ip("127.100.9.1"), weir.addr, "/wiki/Page", &with_pass).await;
    assert_eq!(status, 429);
    assert_eq!(h["x-weir-challenge"], "1");

    let m = weir.metrics().await;
    assert_metric_at_least(
        &m,
        "weir_challenge_events_total{event=\"issued\",reason=\"\"}",
        2.0,
    );
    assert_metric(
        &m,
        "weir_challenge_events_total{event=\"solved\",reason=\"\"}",
        1.0,
    );
    assert_metric_at_least(
        &m,
        "weir_challenge_events_total{event=\"pass_admitted\",reason=\"\"}",
        5.0,
    );
    // The page, the API read, the POST, the answer, six with the pass, the
    // other /24: 11.
    let log = weir.access_log(11).await;
    assert!(
        log.iter()
            .any(|l| l["decision"] == "challenge" && l["challenge"] == "issued")
    );
    assert!(
        log.iter()
            .any(|l| l["challenge"] == "pass" && l["status"] == 200)
    );
    // The pass holder the per-pass rule refused is flagged as maybe a person.
    assert!(
        log.iter()
            .any(|l| l["rule"] == "per-pass" && l["collateral"] == "pass"),
        "{log:?}"
    );
    assert_metric(
        &m,
        "weir_rule_collateral_total{rule=\"per-pass\",signal=\"pass\",enforced=\"yes\"}",
        1.0,
    );
}

/// A 2-worker app behind weir with one admission slot, a class challenged
/// `under_pressure` (4 queued requests engage it at once), calm after
/// `disengage_after`.
async fn pressure_site(disengage_after: &str) -> (weir_lab::app::SimApp, TestWeir) {
    pressure_site_with(disengage_after, "", "").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn challenges_appear_only_under_pressure_and_stop_after_it_passes() {
    let (app, weir) = pressure_site("300ms").await;

    // Calm: a navigation goes straight through.
    assert_eq!(
        get_from(ip("127.101.0.1"), weir.addr, "/wiki/A", &NAV)
            .await
            .0,
        200
    );

    // Pressure: the app stalls, requests queue in weir's admission; a
    // navigation finds no room and is challenged.
    let waiting = stall_and_queue(&app, &weir).await;
    assert_eventually_async!(
        {
            let (status, h, _) = get_from(ip("127.101.2.1"), weir.addr, "/wiki/B", &NAV).await;
            status == 429 && h.contains_key("x-weir-challenge")
        },
        "a navigation is challenged while the queue is deep"
    );

    // An API request during the same pressure is never challenged: it waits
    // for admission like before (and is answered once the app recovers).
    let api = {
        let addr = weir.addr;
        tokio::spawn(async move {
            get_from(
                ip("127.101.3.1"),
                addr,
                "/api/x",
                &[("accept", "application/json")],
            )
            .await
        })
    };

    // The pressure passes: the app recovers, the queue drains, and after the
    // calm period the challenge disengages.
    app.unstall();
    for w in waiting {
        assert_eq!(w.await.unwrap(), 200);
    }
    let (status, h, _) = api.await.unwrap();
    assert_eq!(status, 200);
    assert!(!h.contains_key("x-weir-challenge"));
    assert_eventually_async!(
        {
            let (status, _, _) = get_from(ip("127.101.4.1"), weir.addr, "/wiki/C", &NAV).await;
            let m = weir.metrics().await;
            status == 200 && metric(&m, "weir_challenge_engaged{pool=\"app\"}") == 0.0
        },
        "challenges stop after the pressure passes"
    );
    stop(app, weir).await;
}

/// Issue 19: the challenge is priority, not a gate. While the pressure is
/// still engaged (the calm period has not passed) but the app has room, a
/// navigation without a pass is served, not challenged: no app slot stays
/// free while someone is turned away. Counted as spared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_pressure_a_navigation_is_served_while_the_app_has_room() {
    let (app, weir) = pressure_site("10m").await;
    let waiting = stall_and_queue(&app, &weir).await;
    // Engaged and full: challenged (at once: no wait, no rule charged).
    let (status, h, _) = get_from(ip("127.102.0.1"), weir.addr, "/wiki/A", &NAV).await;
    assert_eq!(status, 429);
    assert!(h.contains_key("x-weir-challenge"));
    // The app recovers; the queue drains; the challenge stays engaged.
    app.unstall();
    for w in waiting {
        assert_eq!(w.await.unwrap(), 200);
    }
    let m = weir.metrics().await;
    assert_metric(&m, "weir_challenge_engaged{pool=\"app\"}", 1.0);
    assert_metric(&m, "weir_challenge_spared_total{pool=\"app\"}", 0.0);
    for i in 0..3u8 {
        let (status, h, body) = get_from(
            format!("127.102.1.{}", i + 1).parse().unwrap(),
            weir.addr,
            "/wiki/B",
            &NAV,
        )
        .await;
        assert_eq!(status, 200, "served while there is room: {body:?}");
        assert!(!h.contains_key("x-weir-challenge"));
    }
    let m = weir.metrics().await;
    assert_metric(&m, "weir_challenge_engaged{pool=\"app\"}", 1.0);
    assert_metric(&m, "weir_challenge_spared_total{pool=\"app\"}", 3.0);
    stop(app, weir).await;
}

/// Issue 17: exemptions match the page the app serves, not the spelling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exemptions_match_the_page_the_app_serves() {
    let up = Upstream::start().await;
    let weir = TestWeir::start(&config(up.addr)).await;
    let me = ip("127.100.1.1");
    for (path, challenged) in [
        // MediaWiki reads this as Special:Search: a `.css` suffix exempted it.
        ("/wiki/Special:Search/x.css", true),
        ("/static/../wiki/Page", true),
        ("/static/%2e%2e/wiki/Page", true),
        ("/api/v1/x", false),
        ("/%61pi/v1/x", false),
        ("/static/app.css", false),
    ] {
        let (status, h, _) = get_from(me, weir.addr, path, &NAV).await;
        assert_eq!(
            (status.as_u16(), h.contains_key("x-weir-challenge")),
            if challenged {
                (429, true)
            } else {
                (200, false)
            },
            "{path}"
        );
    }
    // A configuration that still exempts suffixes is refused, saying why.
    let text = format!("{}exempt_suffixes = [\".css\"]\n", config(up.addr));
    let loaded = weir::config::load_str(&text, None, &weir::config::ProcessEnv).unwrap();
    let err = weir::gateway::Gateway::build(loaded, None, 1)
        .expect_err("exempt_suffixes is refused")
        .to_string();
    assert!(err.contains("exempt_suffixes was removed"), "{err}");
}

/// People without JavaScript (issue 19): the page asks the browser to
/// refresh at once (the default 500 ms delay has no whole second, and a
/// meta refresh counts whole seconds only), and weir holds the early link
/// until the delay is over, then answers it with a pass. Before, the page
/// said 1 s and a person waited that long before even asking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_no_script_refresh_followed_at_once_is_held_until_its_delay_and_earns_a_pass() {
    let up = Upstream::start().await;
    let weir = TestWeir::start(&config(up.addr)).await;
    let me = ip("127.100.0.2");
    let asked = std::time::Instant::now();
    let (status, _, body) = get_from(me, weir.addr, "/wiki/Page?x=2", &NAV).await;
    assert_eq!(status, 429);
    let link = no_script_link(&body);
    let probe = jar(&body);
    let (status, h, _) = get_from(me, weir.addr, &link, &nav_with_cookie(&probe)).await;
    let waited = asked.elapsed();
    assert_eq!(status, 303, "{h:?}");
    assert_eq!(h["location"], "/wiki/Page?x=2");
    assert!(
        h["set-cookie"].to_str().unwrap().starts_with("weir_pass="),
        "{h:?}"
    );
    // The delay is weir's to enforce: no pass before it is over (counted
    // from before the page was asked for; the nonce's time is in whole ms).
    assert!(
        waited >= std::time::Duration::from_millis(499),
        "{waited:?}"
    );
    let m = weir.metrics().await;
    assert_metric(
        &m,
        "weir_challenge_events_total{event=\"solved\",reason=\"no_script\"}",
        1.0,
    );
    assert_metric(
        &m,
        "weir_challenge_events_total{event=\"failed\",reason=\"too_early\"}",
        0.0,
    );
}

/// Issue 38: a request to a challenge path in a method it does not take is
/// refused as any refusal is: `405` with `Allow`, its reason in
/// `x-weir-reason` and `weir_rejections_total`, never passed to the app.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_challenge_path_in_the_wrong_method_is_refused_with_its_reason() {
    let up = Upstream::start().await;
    let weir = TestWeir::start(&config(up.addr)).await;
    let (status, h, _) = get_from(
        ip("127.100.0.2"),
        weir.addr,
        weir::challenge::VERIFY_PATH,
        &[],
    )
    .await;
    assert_eq!(status, 405);
    assert_eq!(h["allow"], "POST");
    assert_eq!(h["x-weir-reason"], "challenge_method_not_allowed");
    let m = weir.metrics().await;
    assert_metric(
        &m,
        "weir_rejections_total{rule=\"challenge_method_not_allowed\"}",
        1.0,
    );
    assert_eq!(up.hits.load(std::sync::atomic::Ordering::Relaxed), 0);
}
