//! Clients that tools like weir are known to break (issue 40, item 2), run
//! against a real weir whose challenge is engaged for every page
//! (`challenge = "always"`, the strictest it gets; under pressure the page
//! is shown to fewer requests, never to more): feed readers, curl and
//! wget, a verified search crawler and an archive crawler, link-preview
//! fetchers, headless Chromium with cookies blocked and with two tabs
//! solving at once, text browsers without JavaScript, and a client that
//! asks for JSON.
//!
//! Each gets its content: through the page where it is a browser that can
//! pass it, else in the lane its proof buys (`bots` for a verified crawler)
//! or, an unproven expensive navigation, the lowest (`anonymous`). None
//! gets a loop, a `403`, or a page it cannot pass. The real programs run
//! where they exist here (newsboat, curl, wget, lynx, w3m, Chromium, from
//! scripts/install-test-deps.sh); crawlers and link previews are their
//! requests as they send them. `docs/challenge.md` has the table.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;

use crate::fixtures::*;
use crate::support::chromium::{Chromium, DevTools};
use crate::support::ports::find_program;
use crate::support::web_bot_auth::Crawler;
use crate::support::{HttpUpstream, UpstreamRequest};

/// The app behind weir: pages with Open Graph tags, an RSS and an Atom
/// feed, a JSON API; it keeps the target and `Cookie` of each request.
struct App {
    upstream: HttpUpstream,
    seen: Arc<Mutex<Vec<(String, String)>>>,
}

const RSS: &str = r#"<?xml version="1.0" encoding="utf-8"?>
<rss version="2.0"><channel><title>The app</title><link>http://test.local/</link>
<description>News</description>
<item><title>First</title><link>http://test.local/wiki/First</link><guid>rss-1</guid></item>
<item><title>Second</title><link>http://test.local/wiki/Second</link><guid>rss-2</guid></item>
</channel></rss>
"#;

const ATOM: &str = r#"<?xml version="1.0" encoding="utf-8"?>
<feed xmlns="http://www.w3.org/2005/Atom"><title>The app</title><id>urn:app</id>
<updated>2026-12-06T00:00:00Z</updated>
<entry><title>Third</title><id>urn:app:3</id><link href="http://test.local/wiki/Third"/><updated>2026-12-06T00:00:00Z</updated></entry>
<entry><title>Fourth</title><id>urn:app:4</id><link href="http://test.local/wiki/Fourth"/><updated>2026-12-06T00:00:00Z</updated></entry>
</feed>
"#;

impl App {
    async fn start() -> App {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let upstream = HttpUpstream::start(move |req: UpstreamRequest| {
            let target = req.head.uri.to_string();
            let cookie = req.head.headers.get("cookie").map_or(String::new(), |c| {
                String::from_utf8_lossy(c.as_bytes()).into_owned()
            });
            log.lock().unwrap().push((target, cookie));
            let (kind, body) = match req.head.uri.path() {
                "/feed.rss" => ("application/rss+xml", RSS.to_owned()),
                "/feed.atom" => ("application/atom+xml", ATOM.to_owned()),
                "/api/item" => ("application/json", r#"{"item":1}"#.to_owned()),
                path => ("text/html; charset=utf-8", page(path)),
            };
            let mut resp = http::Response::new(Full::new(Bytes::from(body)));
            resp.headers_mut()
                .insert("content-type", kind.parse().unwrap());
            resp
        })
        .await
        .expect("bind the app");
        App { upstream, seen }
    }

    fn seen(&self) -> Vec<(String, String)> {
        self.seen.lock().unwrap().clone()
    }
}

/// The app's page at `path`: what a preview reads (`og:title`) and what
/// the tests look for (`The original page`).
fn page(path: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><title>App {path}</title>\
         <meta property=\"og:title\" content=\"The app's page\"></head>\
         <body><h1 id=\"original\">The original page</h1><p id=\"path\">{path}</p></body></html>"
    )
}

/// weir in front of `app`: every route challenged `always`, its unproven
/// requests in the lowest lane (`anonymous`: an expensive class), and a
/// crawler that signs with `crawler`'s key verified.
async fn weir_in_front(app: &App, crawler: &Crawler) -> TestWeir {
    let tables = format!(
        r#"[pools.app.admission]
max_in_flight = 8
[[routes]]
pool = "app"
class = "page"
[classes.page]
challenge = "always"
lane = "anonymous"
[challenge]
keys = ["{PRESSURE_KEY}"]
difficulty = 12
[[bots.crawlers]]
name = "examplebot"
keys = ["{}"]
"#,
        crawler.x()
    );
    TestWeir::start(&config(&[app.upstream.addr()], &tables)).await
}

/// Runs a client program to its end (at most a minute) with `HOME` in a
/// temp dir of its own; its standard output. Fails the test, saying so,
/// when it is missing or fails.
async fn run(program: &str, args: &[&str]) -> String {
    let path = find_program(program)
        .unwrap_or_else(|e| panic!("{program} is required (scripts/install-test-deps.sh): {e}"));
    let home = tempfile::tempdir().unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(path)
            .args(args)
            .env("HOME", home.path())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{program} {args:?} did not finish in a minute"))
    .unwrap_or_else(|e| panic!("{program}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The access log's lines for one User-Agent (by a word of it).
fn lines_of<'a>(log: &'a [serde_json::Value], agent: &str) -> Vec<&'a serde_json::Value> {
    log.iter()
        .filter(|l| {
            l["user_agent"]
                .as_str()
                .is_some_and(|ua| ua.contains(agent))
        })
        .collect()
}

/// `(status, path, lane, challenge)` of each line, for assertions that
/// show the whole story when they fail.
fn story(lines: &[&serde_json::Value]) -> Vec<(u64, String, String, String)> {
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("").to_owned();
    lines
        .iter()
        .map(|l| {
            (
                l["status"].as_u64().unwrap_or(0),
                text(&l["path"]),
                text(&l["lane"]),
                text(&l["challenge"]),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn programs_that_cannot_pass_the_page_get_their_content() {
    let app = App::start().await;
    let weir = weir_in_front(&app, &Crawler::new()).await;
    let url = |path: &str| weir.url(path);

    // A feed reader: RSS and Atom, every item read.
    let home = tempfile::tempdir().unwrap();
    let urls = home.path().join("urls");
    std::fs::write(
        &urls,
        format!("{}\n{}\n", url("/feed.rss"), url("/feed.atom")),
    )
    .unwrap();
    let (urls, cache) = (urls.display().to_string(), home.path().join("cache.db"));
    let cache = cache.display().to_string();
    let feed_args = ["-u", &urls, "-c", &cache, "-C", "/dev/null"];
    run("newsboat", &[&feed_args[..], &["-x", "reload"]].concat()).await;
    let unread = run(
        "newsboat",
        &[&feed_args[..], &["-x", "print-unread"]].concat(),
    )
    .await;
    assert_eq!(
        unread.trim(),
        "4 unread articles",
        "newsboat read every item"
    );

    // curl and wget: the page itself.
    let curl = run("curl", &["-sS", "-w", "\n%{http_code}", &url("/wiki/Curl")]).await;
    assert!(
        curl.contains("The original page") && curl.ends_with("\n200"),
        "{curl}"
    );
    let wget = run("wget", &["-q", "-O", "-", &url("/wiki/Wget")]).await;
    assert!(wget.contains("The original page"), "{wget}");

    // Text browsers without JavaScript: they send `text/html` and no fetch
    // metadata, and would stop at the page; they get the app's.
    let lynx = run("lynx", &["-dump", "-nolist", &url("/wiki/Lynx")]).await;
    assert!(lynx.contains("The original page"), "lynx: {lynx}");
    let w3m = run("w3m", &["-dump", &url("/wiki/W3m")]).await;
    assert!(w3m.contains("The original page"), "w3m: {w3m}");

    let log = weir.access_log(6).await;
    for (agent, paths) in [
        ("newsboat", &["/feed.rss", "/feed.atom"][..]),
        ("curl", &["/wiki/Curl"]),
        ("Wget", &["/wiki/Wget"]),
        ("Lynx", &["/wiki/Lynx"]),
        ("w3m", &["/wiki/W3m"]),
    ] {
        let lines = lines_of(&log, agent);
        let want: Vec<_> = paths
            .iter()
            .map(|p| (200, p.to_string(), "anonymous".into(), String::new()))
            .collect();
        assert_eq!(
            story(&lines),
            want,
            "{agent}: served once each, lowest lane"
        );
    }
}

/// A client that sends its requests as the named crawler or preview
/// fetcher does.
struct Sent {
    who: &'static str,
    user_agent: &'static str,
    accept: &'static str,
    path: &'static str,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crawlers_and_link_previews_get_the_page_not_the_challenge() {
    let app = App::start().await;
    let crawler = Crawler::new();
    let weir = weir_in_front(&app, &crawler).await;
    let html = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
    let cases = [
        Sent {
            who: "archive crawler",
            user_agent: "Mozilla/5.0 (compatible; archive.org_bot +http://archive.org/details/archive.org_bot) Zeno/b0c5ba6",
            accept: html,
            path: "/wiki/Archived",
        },
        Sent {
            who: "search crawler, unverified",
            user_agent: "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
            accept: html,
            path: "/wiki/Indexed",
        },
        Sent {
            who: "Facebook preview",
            user_agent: "facebookexternalhit/1.1 (+http://www.facebook.com/externalhit_uatext.php)",
            accept: "*/*",
            path: "/wiki/Shared1",
        },
        Sent {
            who: "Slack preview",
            user_agent: "Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)",
            accept: "text/html",
            path: "/wiki/Shared2",
        },
        Sent {
            who: "Discord preview",
            user_agent: "Mozilla/5.0 (compatible; Discordbot/2.0; +https://discordapp.com)",
            accept: "text/html",
            path: "/wiki/Shared3",
        },
        Sent {
            who: "iMessage preview",
            user_agent: "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_11_1) AppleWebKit/601.2.4 (KHTML, like Gecko) Version/9.0.1 Safari/601.2.4 facebookexternalhit/1.1 Facebot Twitterbot/1.0",
            accept: html,
            path: "/wiki/Shared4",
        },
        Sent {
            who: "JSON client",
            user_agent: "app/2.0",
            accept: "application/json",
            path: "/api/item",
        },
    ];
    for (i, c) in cases.iter().enumerate() {
        let from: IpAddr = format!("127.106.0.{}", i + 1).parse().unwrap();
        let headers = [("user-agent", c.user_agent), ("accept", c.accept)];
        let (status, h, body) = get_from(from, weir.addr, c.path, &headers).await;
        let body = String::from_utf8_lossy(&body);
        assert_eq!(status, 200, "{}: {body}", c.who);
        assert!(!h.contains_key("x-weir-challenge"), "{}", c.who);
        if c.path == "/api/item" {
            assert_eq!(body, r#"{"item":1}"#);
        } else {
            assert!(
                body.contains(r#"<meta property="og:title" content="The app's page">"#),
                "{}: {body}",
                c.who
            );
        }
    }

    // The verified crawler (Web Bot Auth) waits in its own lane.
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let signed = crawler.sign("test.local", now - 5, 300);
    let mut headers: Vec<(&str, &str)> = vec![("user-agent", "examplebot/1.0"), ("accept", html)];
    headers.extend(signed.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let (status, h, body) = get_from(
        "127.106.1.1".parse().unwrap(),
        weir.addr,
        "/wiki/Crawled",
        &headers,
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(!h.contains_key("x-weir-challenge"));

    let log = weir.access_log(cases.len() + 1).await;
    let lanes: Vec<(String, String, u64)> = log
        .iter()
        .map(|l| {
            (
                l["path"].as_str().unwrap_or("").to_owned(),
                l["lane"].as_str().unwrap_or("").to_owned(),
                l["status"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    for c in &cases {
        assert!(
            lanes.contains(&(c.path.to_owned(), "anonymous".to_owned(), 200)),
            "{}: the lowest lane: {lanes:?}",
            c.who
        );
    }
    assert!(
        lanes.contains(&("/wiki/Crawled".to_owned(), "bots".to_owned(), 200)),
        "{lanes:?}"
    );
}

/// Headless Chromium with cookies blocked in its settings: the page cannot
/// leave a pass in a cookie, so it comes in the address of the page the
/// answer returns to (for that page). The browser ends on the app's page,
/// once; the app never sees the pass, in its address or its cookies, and
/// the page keeps the browser from sending it on in a `Referer`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_with_cookies_blocked_gets_the_page_once_and_then_the_app() {
    let app = App::start().await;
    let weir = weir_in_front(&app, &Crawler::new()).await;
    let blocked =
        serde_json::json!({"profile": {"default_content_setting_values": {"cookies": 2}}});
    let args = [
        "--virtual-time-budget=30000".to_string(),
        "--dump-dom".to_string(),
    ];
    let dom = Chromium::run_with_preferences(&args, &weir.url("/wiki/Cookieless"), Some(blocked))
        .output()
        .await;
    let log = weir.access_log(3).await;
    let lines = story(&log.iter().collect::<Vec<_>>());
    assert!(
        dom.contains("The original page") && dom.contains("<p id=\"path\">/wiki/Cookieless</p>"),
        "Chromium without cookies did not reach the app's page:\n{dom}\n{lines:#?}"
    );
    let page = |l: &&(u64, String, String, String)| l.1 == "/wiki/Cookieless";
    let pages: Vec<_> = lines.iter().filter(page).collect();
    assert_eq!(
        pages
            .iter()
            .map(|l| (l.0, l.3.as_str()))
            .collect::<Vec<_>>(),
        [(429, "issued"), (200, "pass")],
        "one page, then the app with the pass: {lines:#?}"
    );
    for (target, cookie) in app.seen() {
        assert!(!target.contains("weir_pass"), "the app saw {target}");
        assert!(!cookie.contains("weir_pass"), "the app saw {cookie}");
    }
}

/// Waits until a tab shows the app's page at `path` (a minute at most);
/// its body.
async fn until_the_app(tab: &mut DevTools, path: &str) -> String {
    let want = format!("<p id=\"path\">{path}</p>");
    tab.body_once_it_shows(&want, Duration::from_secs(60)).await
}

/// Two tabs of one browser open two pages at once: each gets the page,
/// both solve at the same time, the second pass cookie replaces the
/// first, and each tab ends on its own page with a pass, without a
/// second page (no loop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_chromium_tabs_solving_at_once_both_reach_their_pages() {
    let app = App::start().await;
    let weir = weir_in_front(&app, &Crawler::new()).await;
    let browser = Chromium::run(&["--remote-debugging-port=0".to_string()], "about:blank");
    let (one, two) = (weir.url("/wiki/One"), weir.url("/wiki/Two"));
    let (mut a, mut b) = tokio::join!(browser.open_tab(&one), browser.open_tab(&two));
    let (body_a, body_b) = tokio::join!(
        until_the_app(&mut a, "/wiki/One"),
        until_the_app(&mut b, "/wiki/Two")
    );
    let log = weir.access_log(6).await;
    let lines = story(&log.iter().collect::<Vec<_>>());
    for (path, body) in [("/wiki/One", &body_a), ("/wiki/Two", &body_b)] {
        assert!(
            body.contains(&format!("<p id=\"path\">{path}</p>")),
            "{path}: {body}\n{lines:#?}"
        );
        let of_page: Vec<_> = lines
            .iter()
            .filter(|l| l.1 == path)
            .map(|l| (l.0, l.3.as_str()))
            .collect();
        assert_eq!(
            of_page,
            [(429, "issued"), (200, "pass")],
            "{path}: one page, then the app: {lines:#?}"
        );
    }
    assert!(lines.iter().all(|l| l.0 != 403), "{lines:#?}");
}

/// An old phone's browser runs scripts but lacks what the work needs
/// (`TextEncoder` came to Safari in 10.1, to Android's WebView in 38): the
/// script takes the way a browser without JavaScript takes, the refresh,
/// and the browser ends on the app's page with a pass of the wait. On a
/// first page, outside any visit, that pass is not proof (the log's
/// `wait_pass`): it only keeps the page from being offered again. Emulated
/// in Chromium by removing `TextEncoder` before any of the page's scripts
/// run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_too_old_for_the_work_takes_the_refresh_to_a_pass() {
    let app = App::start().await;
    let weir = weir_in_front(&app, &Crawler::new()).await;
    let browser = Chromium::run(&["--remote-debugging-port=0".to_string()], "about:blank");
    let mut tab = browser.devtools().await;
    tab.call("Page.enable", serde_json::json!({})).await;
    tab.call(
        "Page.addScriptToEvaluateOnNewDocument",
        serde_json::json!({"source": "delete window.TextEncoder;"}),
    )
    .await;
    let url = weir.url("/wiki/Old");
    tab.call("Page.navigate", serde_json::json!({ "url": url }))
        .await;
    let body = until_the_app(&mut tab, "/wiki/Old").await;
    let log = weir.access_log(4).await;
    let lines = story(&log.iter().collect::<Vec<_>>());
    assert!(
        body.contains("<p id=\"path\">/wiki/Old</p>"),
        "{body}\n{lines:#?}"
    );
    let of_page: Vec<_> = lines
        .iter()
        .filter(|l| l.1 == "/wiki/Old")
        .map(|l| (l.0, l.3.as_str()))
        .collect();
    assert_eq!(of_page, [(429, "issued"), (200, "wait_pass")], "{lines:#?}");
    assert_eq!(
        metric(
            &weir.metrics().await,
            "weir_challenge_events_total{event=\"solved\",reason=\"no_script\"}"
        ),
        1.0,
        "the refresh earned the pass, not the work"
    );
}

/// A pass in the address is weir's to read, and only as a pass: a link
/// whose `weir_pass` carries anything but a token's spelling sets no
/// cookie (`;session=...` would have set the app's session), and the app
/// never sees the key in its address either way, nor the pass in its
/// cookies (issue 54).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_cannot_set_a_cookie_through_the_pass_in_the_address() {
    let app = App::start().await;
    let weir = weir_in_front(&app, &Crawler::new()).await;
    let json = [("accept", "application/json")];
    for path in [
        "/api/item?a=1&weir_pass=x;session=evil",
        "/api/item?weir_pass=x%3B%20session%3Devil&a=1",
    ] {
        let (status, _, _) = get_from("127.107.0.1".parse().unwrap(), weir.addr, path, &json).await;
        assert_eq!(status, 200, "{path}");
    }
    // A token's spelling joins the cookies sent, none of them lost, and
    // leaves them again before the app.
    let spelled = "A".repeat(weir::challenge::token::TOKEN_CHARS);
    let path = format!("/api/item?weir_pass={spelled}");
    let sent = [json[0], ("cookie", "a=1"), ("cookie", "b=2")];
    let (status, _, _) = get_from("127.107.0.1".parse().unwrap(), weir.addr, &path, &sent).await;
    assert_eq!(status, 200);
    let seen = app.seen();
    assert_eq!(
        seen,
        [
            ("/api/item?a=1".to_owned(), String::new()),
            ("/api/item?a=1".to_owned(), String::new()),
            ("/api/item".to_owned(), "a=1; b=2".to_owned()),
        ],
        "the key gone, no cookie set, the pass read and kept from the app"
    );
}
