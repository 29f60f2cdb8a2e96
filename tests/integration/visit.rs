//! The visit cookie end to end (issue 37): weir counts the pages it served a
//! browser in a signed first-party cookie, keeps that cookie from the app,
//! and a refused navigation is "browsing" (evidence of a person) only in a
//! visit of pages weir saw, never for a same-site `Referer` alone.

use std::net::IpAddr;

use crate::fixtures::*;
use crate::support::WeirConfig;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Pages under `/wiki/`, searches limited to one per address, and a visit
/// that is browsing after three pages (no minimum age, so the test need not
/// wait a minute).
fn visit_config(up: std::net::SocketAddr) -> String {
    WeirConfig::new(up)
        .route_with("expensive", r#"query_keys = ["search"]"#)
        .route("page")
        .then(
            r#"[visit]
min_age = "0s"

[[classes.expensive.rules]]
name = "one-search"
limits = [{ per = "ip", rate = 1, window = "10m" }]
"#,
        )
        .toml()
}

/// `NAV` from `source` with `cookie` (if any) and extra headers; returns the
/// status, the `weir_visit=...` the answer set (if any) and the app's echo.
async fn navigate(
    weir: &TestWeir,
    source: IpAddr,
    path: &str,
    cookie: Option<&str>,
    extra: &[(&str, &str)],
) -> (u16, Option<String>, Vec<u8>) {
    let mut headers: Vec<(&str, &str)> = NAV.to_vec();
    if let Some(c) = cookie {
        headers.push(("cookie", c));
    }
    headers.extend_from_slice(extra);
    let (status, h, body) = get_from(source, weir.addr, path, &headers).await;
    let visit = h
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("weir_visit="))
        .map(|v| v.split(';').next().unwrap_or_default().to_owned());
    (status.as_u16(), visit, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_visit_weir_counted_is_evidence_and_a_referer_alone_is_not() {
    let up = Upstream::start().await;
    let weir = TestWeir::start(&visit_config(up.addr)).await;

    // A person: three pages, each answered with the visit one page longer;
    // the app never sees weir's cookie, and the person's own cookies pass.
    let person = ip("127.0.7.1");
    let mut cookie: Option<String> = None;
    for page in 1..=3 {
        let sent = cookie.as_ref().map(|c| format!("{c}; theme=dark"));
        let (status, set, body) = navigate(
            &weir,
            person,
            &format!("/wiki/P{page}"),
            sent.as_deref(),
            &[],
        )
        .await;
        assert_eq!(status, 200);
        let app_saw = echo(&body)["headers"]["cookie"].clone();
        if page == 1 {
            assert!(app_saw.is_null(), "no cookie yet: {app_saw}");
        } else {
            assert_eq!(app_saw, "theme=dark", "weir's cookie is kept from the app");
        }
        cookie = Some(set.expect("a page served to a navigation carries the visit"));
    }
    let cookie = cookie.unwrap();
    // Not a navigation: an API call or an image neither reads nor moves it.
    let (_, h, _) = get_from(
        person,
        weir.addr,
        "/api/x",
        &[("accept", "application/json"), ("cookie", cookie.as_str())],
    )
    .await;
    assert!(h.get("set-cookie").is_none(), "{h:?}");
    // The first search is served, the second refused by the rule: a person
    // whose visit weir counted (three pages, then one search).
    let (status, set, _) =
        navigate(&weir, person, "/w/index.php?search=a", Some(&cookie), &[]).await;
    assert_eq!(status, 200);
    let cookie = set.expect("a costly page counts in the visit");
    let (_, set, _) = navigate(&weir, person, "/wiki/P4", Some(&cookie), &[]).await;
    let cookie = set.expect("a page");
    let (status, _, _) = navigate(&weir, person, "/w/index.php?search=b", Some(&cookie), &[]).await;
    assert_eq!(status, 429);

    // A crawler that sends a same-site `Referer` and a browser's headers,
    // but asks for the search at once: one header is not a visit.
    let crawler = ip("127.0.8.1");
    let referer = [("referer", "http://test.local/wiki/Main_Page")];
    let (status, _, _) = navigate(&weir, crawler, "/w/index.php?search=c", None, &referer).await;
    assert_eq!(status, 200);
    let (status, _, _) = navigate(&weir, crawler, "/w/index.php?search=d", None, &referer).await;
    assert_eq!(status, 429);
    // Nor is a cookie of someone else's visit: bound to the person's /24
    // and browser.
    let (status, _, _) = navigate(
        &weir,
        crawler,
        "/w/index.php?search=e",
        Some(&cookie),
        &referer,
    )
    .await;
    assert_eq!(status, 429);

    let lines = weir.access_log(10).await;
    let refused: Vec<_> = lines.iter().filter(|l| l["status"] == 429).collect();
    assert_eq!(refused.len(), 3, "{lines:?}");
    let signal = |i: usize| refused[i]["collateral"].as_str().unwrap_or("").to_owned();
    assert_eq!(signal(0), "browsing", "{}", refused[0]);
    assert_eq!(refused[0]["visit_views"], 4, "{}", refused[0]);
    assert_eq!(refused[0]["visit_costly"], 1, "{}", refused[0]);
    // Not people's evidence: the crawler sends little (`low_rate`).
    assert_eq!(signal(1), "low_rate", "a Referer alone: {}", refused[1]);
    assert_eq!(signal(2), "low_rate", "another's visit: {}", refused[2]);
    assert!(refused[2]["visit_views"].is_null(), "{}", refused[2]);
    let m = weir.metrics().await;
    let collateral = |signal: &str| {
        metric(
            &m,
            &format!(
                "weir_rule_collateral_total{{rule=\"one-search\",signal=\"{signal}\",enforced=\"yes\"}}"
            ),
        )
    };
    assert_eq!(
        (collateral("browsing"), collateral("low_rate")),
        (1.0, 2.0),
        "{m}"
    );
}

/// A page a shared cache may keep is never given a visit (a cached
/// `Set-Cookie` would go to everyone), and `visit.enabled = false` sets none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_visit_on_a_shared_cacheable_page_or_when_switched_off() {
    let app = crate::support::HttpUpstream::start(|req| {
        let public = req.head.uri.path().starts_with("/public");
        let mut resp = http::Response::new(http_body_util::Full::new(bytes::Bytes::from("page")));
        if public {
            resp.headers_mut()
                .insert("cache-control", "public, max-age=300".parse().unwrap());
        }
        resp
    })
    .await
    .unwrap();
    let on = TestWeir::start(&config(&[app.addr()], "")).await;
    let (status, set, body) = navigate(&on, ip("127.0.7.2"), "/public/p", None, &[]).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(set, None, "a page for shared caches");
    let (_, set, _) = navigate(&on, ip("127.0.7.2"), "/private/p", None, &[]).await;
    assert!(set.is_some(), "an ordinary page");
    let off = TestWeir::start(&config(&[app.addr()], "[visit]\nenabled = false\n")).await;
    let (_, set, _) = navigate(&off, ip("127.0.7.2"), "/private/p", None, &[]).await;
    assert_eq!(set, None, "switched off");
}
