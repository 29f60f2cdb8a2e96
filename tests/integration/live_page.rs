//! The live operator page (`/ui` on the admin address, issue 20 item 6) in
//! headless Chromium, driven over the DevTools protocol: the page shows the
//! rule refusing now with its top prefix and the share that looked like
//! people, the pools with their lanes; updates arrive over server-sent
//! events without a reload; with `[admin] token` set, the page reloads the
//! configuration and shows the result. A screenshot is kept at
//! `target/test-artifacts/live-page.png`.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::fixtures::Upstream;
use crate::support::chromium::{Chromium, DevTools, artifacts_dir};
use crate::support::{HttpRequest, HttpUpstream, Weir, WeirConfig};

const TOKEN: &str = "live-page-token-0123456789";

fn config(upstream: std::net::SocketAddr) -> String {
    WeirConfig::new(upstream)
        .then(format!(
            "[admin]\naddress = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n"
        ))
        .admission("max_in_flight = 4")
        // Pages to read, and the page its rule limits.
        .route_with("reading", r#"path_prefix = "/read""#)
        .route_with("reading", r#"path_prefix = "/slow""#)
        .then(
            r#"[[routes]]
pool = "app"
# A visit of pages weir served makes a visit browsing here at once (a
# person's visit is several pages over a minute by default: docs/metrics.md).
[visit]
min_age = "0s"
[[classes.default.rules]]
name = "per-address"
limits = [{ per = "ip", rate = 1, window = "1m" }]
"#,
        )
        .toml()
}

/// From each of `n` addresses in 127.0.5.0/24, as a browser keeping weir's
/// visit cookie: four pages read, then the limited page twice, the second
/// refused by the rule in a visit of four pages and one costly one before
/// (evidence of a person: two pages for each costly one, this one included).
async fn refusals(weir: &Weir, first: u8, n: u8) {
    for i in first..first + n {
        let mut cookie = String::new();
        for path in ["/read/1", "/read/2", "/read/3", "/read/4", "/page", "/page"] {
            let mut req = HttpRequest::get(path)
                .from(IpAddr::from([127, 0, 5, i]))
                .header("accept", "text/html");
            if !cookie.is_empty() {
                req = req.header("cookie", &cookie);
            }
            if let Ok(resp) = req.send(weir.listener(0)).await
                && let Some(set) = resp.header("set-cookie")
            {
                cookie = set.split(';').next().unwrap_or_default().to_owned();
            }
        }
    }
}

/// The in-test app (with a `/slow/MS` path, to make requests wait) and weir
/// in front of it with [`config`].
async fn start() -> (Upstream, Weir) {
    let app = Upstream::start().await;
    let weir = Weir::builder()
        .config(config(app.addr))
        .start()
        .await
        .unwrap();
    (app, weir)
}

/// Checks that `png` is a PNG, keeps it as `name` in the artifacts dir,
/// and says where (`what screenshot: PATH (N bytes)`).
fn keep_png(png: &[u8], name: &str, what: &str) {
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    let shot = artifacts_dir().join(name);
    std::fs::write(&shot, png).unwrap();
    eprintln!(
        "{what} screenshot: {} ({} bytes)",
        shot.display(),
        png.len()
    );
}

/// Polls `expression` until `done` holds for its value (bounded).
async fn until(
    page: &mut DevTools,
    expression: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let mut v: serde_json::Value;
    assert_eventually_async!(
        within = Duration::from_secs(30),
        {
            v = page.eval(expression).await;
            done(&v)
        },
        "{expression} stayed {v}"
    );
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_page_shows_rules_pools_and_updates_and_reloads_with_the_token() {
    let (_app, weir) = start().await;
    refusals(&weir, 1, 3).await;

    // The page and its assets come from the admin address alone.
    let page = HttpRequest::get("/ui").send(weir.admin()).await.unwrap();
    assert_eq!(page.status, 200);
    assert!(
        !page.text().contains("://"),
        "an external asset: {}",
        page.text()
    );
    let csp = page.header("content-security-policy").expect("a CSP");
    assert!(
        csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );

    let url = format!("http://{}/ui", weir.admin());
    let chromium = Chromium::with_devtools(&url, "1200,900");
    let mut page = chromium.devtools().await;

    // Updates arrive (one a second) and fill the tables.
    until(
        &mut page,
        "Number(document.getElementById('updates').textContent)",
        |v| v.as_f64().is_some_and(|n| n >= 2.0),
    )
    .await;
    let rules = page
        .eval("document.querySelector('#rules tbody').innerText")
        .await;
    let rules = rules.as_str().unwrap_or_default().to_owned();
    assert!(rules.contains("per-address"), "{rules}");
    assert!(
        rules.contains("127.0.5.0/24 (3)"),
        "the top refused prefix: {rules}"
    );
    assert!(
        rules.contains("100%"),
        "browsers refused look like people: {rules}"
    );
    let pools = page
        .eval("document.querySelector('#pools tbody').innerText")
        .await;
    let pools = pools.as_str().unwrap_or_default().to_owned();
    assert!(pools.contains("app") && pools.contains("ready"), "{pools}");
    assert!(pools.contains("anonymous: 0"), "the lanes: {pools}");
    assert_eq!(
        page.eval("document.getElementById('stream').textContent")
            .await,
        "live"
    );

    // More refusals show up without reloading the page.
    refusals(&weir, 10, 4).await;
    until(
        &mut page,
        "document.querySelector('#rules tbody td:nth-child(2)').textContent",
        |v| v == "7",
    )
    .await;

    // Twice the admission limit of slow requests at once: half of them wait
    // about 300 ms for a slot, and the lane shows it.
    let burst: Vec<_> = (0..8u8)
        .map(|i| {
            let addr = weir.listener(0);
            tokio::spawn(async move {
                HttpRequest::get("/slow/300")
                    .from(IpAddr::from([127, 0, 6, i + 1]))
                    .send(addr)
                    .await
                    .map(|r| r.status)
            })
        })
        .collect();

    for t in burst {
        assert_eq!(t.await.unwrap().unwrap(), 200);
    }
    until(
        &mut page,
        "document.querySelector('#pools tbody').innerText",
        |v| {
            v.as_str().is_some_and(|t| {
                t.split("waited ").skip(1).any(|w| {
                    w.split(' ')
                        .next()
                        .and_then(|n| n.parse::<u64>().ok())
                        .is_some_and(|ms| ms >= 50)
                })
            })
        },
    )
    .await;

    // With the token set the page can reload; the result is shown.
    assert_eq!(
        page.eval("document.getElementById('reload-form').hidden")
            .await,
        false
    );
    page.eval(&format!(
        "document.getElementById('token').value = '{TOKEN}'; \
         document.querySelector('#reload-form button').click(); true"
    ))
    .await;
    until(
        &mut page,
        "document.getElementById('reload-result').textContent",
        |v| v == "ok",
    )
    .await;
    let reload = until(
        &mut page,
        "document.getElementById('reload').textContent",
        |v| v.as_str().is_some_and(|t| t.contains("version 2 serving")),
    )
    .await;
    assert!(
        reload.as_str().unwrap().starts_with("reloaded at"),
        "{reload}"
    );

    let png = page.screenshot().await;
    keep_png(&png, "live-page.png", "live page");
}

#[tokio::test]
async fn without_a_token_the_page_is_read_only_and_the_stream_speaks_sse() {
    let app = HttpUpstream::echo_headers().await.unwrap();
    let config = config(app.addr()).replace(&format!("token = \"{TOKEN}\"\n"), "");
    let weir = Weir::builder().config(config).start().await.unwrap();
    refusals(&weir, 1, 1).await;
    // The first document of the stream, read off the socket.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(weir.admin()).await.unwrap();
    s.write_all(b"GET /ui/events HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let complete = |t: &str| t.find("data: ").is_some_and(|i| t[i..].contains("\n\n"));
    while !complete(&String::from_utf8_lossy(&got)) {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("an event within 10 s")
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    assert!(text.contains("content-type: text/event-stream"), "{text}");
    let data = text
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .expect("a data line");
    let live: serde_json::Value = serde_json::from_str(data).unwrap();
    assert_eq!(live["admin_token"], false, "{live}");
    assert_eq!(live["rules"][0]["rule"], "per-address", "{live}");
    assert_eq!(live["rules"][0]["this_minute"]["rejections"], 1, "{live}");
    assert_eq!(live["pools"][0]["name"], "app", "{live}");
    let lanes = &live["pools"][0]["admission"]["lanes"];
    assert!(lanes[0]["waited_seconds_total"].is_number(), "{lanes}");
}

/// What the load below sent and got.
#[derive(Debug, Default, Clone, Copy)]
struct Sent {
    ok: u64,
    refused: u64,
    other: u64,
}

/// Ordinary traffic beside a crawler the rule refuses, `batches` rounds of
/// it or until `stop` (40 s at most): pages read from 127.0.7.0/24, the limited page from four
/// addresses of 127.0.8.0/24 as `python-requests` (all but each
/// address's first request refused), and now and then a burst of slow
/// requests that queue.
async fn load(addr: std::net::SocketAddr, batches: u32, stop: Arc<AtomicBool>) -> Sent {
    let mut sent = Sent::default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    let mut i: u32 = 0;
    while i < batches && !stop.load(Ordering::Relaxed) && tokio::time::Instant::now() < deadline {
        i += 1;
        let reader = IpAddr::from([127, 0, 7, (i % 200 + 1) as u8]);
        let crawler = IpAddr::from([127, 0, 8, (i % 4 + 1) as u8]);
        let mut batch = vec![
            HttpRequest::get(&format!("/read/{i}")).from(reader),
            HttpRequest::get("/page")
                .from(crawler)
                .header("user-agent", "python-requests/2.31.0"),
        ];
        if i.is_multiple_of(25) {
            batch.extend(
                (0..6u8)
                    .map(|j| HttpRequest::get("/slow/150").from(IpAddr::from([127, 0, 9, j + 1]))),
            );
        }
        let mut answers = tokio::task::JoinSet::new();
        for r in batch {
            answers.spawn(async move { r.send(addr).await.map(|r| r.status) });
        }
        while let Some(a) = answers.join_next().await {
            match a.unwrap() {
                Ok(200) => sent.ok += 1,
                Ok(429) => sent.refused += 1,
                _ => sent.other += 1,
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sent
}

/// Sums a number over the seconds of `/ui/history`.
fn summed(history: &serde_json::Value, path: &[&str]) -> u64 {
    history["seconds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| path.iter().fold(s, |v, k| &v[*k]).as_u64().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_fifteen_minutes_count_every_request_once() {
    let (_app, weir) = start().await;
    // Three bursts of slow requests among them.
    let sent = load(weir.listener(0), 75, Arc::default()).await;
    assert!(sent.ok > 0 && sent.refused > 0, "{sent:?}");
    assert_eq!(sent.other, 0, "{sent:?}");

    // Once the seconds they ended in are closed, every request is in one.
    let mut history: serde_json::Value;
    assert_eventually_async!(
        within = Duration::from_secs(10),
        {
            let r = HttpRequest::get("/ui/history")
                .send(weir.admin())
                .await
                .unwrap();
            history = serde_json::from_str(&r.text()).unwrap();
            summed(&history, &["outcomes", "served"]) == sent.ok
                && summed(&history, &["outcomes", "refused"]) == sent.refused
        },
        "sent {sent:?}, the history says {history}"
    );
    assert_eq!(summed(&history, &["statuses", "2xx"]), sent.ok);
    assert_eq!(summed(&history, &["statuses", "4xx"]), sent.refused);
    for k in ["challenged", "shed", "other"] {
        assert_eq!(summed(&history, &["outcomes", k]), 0, "{k}");
    }
    let seconds = history["seconds"].as_array().unwrap();
    let at: Vec<u64> = seconds
        .iter()
        .map(|s| s["at_unix_s"].as_u64().unwrap())
        .collect();
    assert!(
        at.windows(2).all(|w| w[0] < w[1]),
        "one entry a second: {at:?}"
    );
    let busy = seconds
        .iter()
        .find(|s| s["outcomes"]["served"].as_u64() > Some(0))
        .unwrap();
    let (p50, p99) = (
        busy["p50_ms"].as_f64().unwrap(),
        busy["p99_ms"].as_f64().unwrap(),
    );
    assert!(p50 > 0.0 && p50 <= p99, "{busy}");
    let pool = &busy["pools"][0];
    assert_eq!(pool["pool"], "app");
    assert_eq!(pool["limit"], 4, "the admission limit: {pool}");
    // The crawler's family and prefix lead what was refused.
    assert_eq!(
        history["refused"]["families"][0][0], "python-requests",
        "{history}"
    );
    assert_eq!(history["refused"]["families"][0][1], sent.refused);
    assert_eq!(history["refused"]["prefixes"][0][0], "127.0.8.0/24");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_page_draws_the_last_fifteen_minutes_and_they_move_under_load() {
    let (_app, weir) = start().await;
    // People refused by the rule (evidence of a person: their visits).
    refusals(&weir, 1, 3).await;
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = tokio::spawn(load(weir.listener(0), u32::MAX, stop.clone()));

    let url = format!("http://{}/ui", weir.admin());
    let chromium = Chromium::with_devtools(&url, "1400,1500");
    let mut page = chromium.devtools().await;

    // The charts draw, and move: the newest second drawn changes.
    let latest = "Number(document.querySelector('#chart-outcomes svg.chart')?.dataset.latest ?? 0)";
    let first = until(&mut page, latest, |v| v.as_f64().is_some_and(|n| n > 0.0)).await;
    let first = first.as_f64().unwrap();
    until(&mut page, latest, |v| {
        v.as_f64().is_some_and(|n| n >= first + 2.0)
    })
    .await;
    let drawn = page
        .eval(
            "[...document.querySelectorAll('#timeline svg.chart')].map(s => \
             `${s.closest('figure').querySelector('figcaption').textContent}: ${s.dataset.points}`)",
        )
        .await;
    let drawn: Vec<String> = serde_json::from_value(drawn).unwrap();
    // Four charts of the whole, two of the pool, each with its points
    // (the outcomes' five areas over three seconds at least).
    assert_eq!(drawn.len(), 6, "{drawn:?}");
    let points = |chart: &String| -> u64 { chart.rsplit(": ").next().unwrap().parse().unwrap() };
    assert!(
        drawn.iter().all(|c| points(c) > 0),
        "a chart without points: {drawn:?}"
    );
    assert!(points(&drawn[0]) >= 15, "{drawn:?}");
    // Every outcome's line is drawn, the served one rising above zero.
    let served = page
        .eval(
            "document.querySelector('#chart-outcomes polyline[data-series=served]')\
             .getAttribute('points').split(' ').some(p => Number(p.split(',')[1]) < 130)",
        )
        .await;
    assert_eq!(served, true, "served requests make the area rise");
    let legend = page
        .eval("document.querySelector('#pool-charts').innerText")
        .await;
    let legend = legend.as_str().unwrap_or_default().to_owned();
    assert!(
        legend.contains("pool app") && legend.contains("adaptive limit 4"),
        "{legend}"
    );
    let refused = until(
        &mut page,
        "document.querySelector('#refused-families tbody').innerText",
        |v| v.as_str().is_some_and(|t| t.contains("python-requests")),
    )
    .await;
    let prefixes = page
        .eval("document.querySelector('#refused-prefixes tbody').innerText")
        .await;
    assert!(
        prefixes
            .as_str()
            .unwrap_or_default()
            .contains("127.0.8.0/24"),
        "{prefixes} beside {refused}"
    );
    // The people's refusals were counted as such at their second.
    let people = page
        .eval("document.querySelector('#chart-people polyline') !== null")
        .await;
    assert_eq!(people, true, "the share of people among refusals is drawn");

    let png = page.screenshot().await;
    stop.store(true, Ordering::Relaxed);
    let sent = traffic.await.unwrap();
    assert!(sent.ok > 0 && sent.refused > 0, "{sent:?}");
    keep_png(&png, "live-page-charts.png", "live page charts");
}
