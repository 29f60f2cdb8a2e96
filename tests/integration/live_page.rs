//! The live operator page (`/ui` on the admin address, issue 20 item 6) in
//! headless Chromium, driven over the DevTools protocol: the page shows the
//! rule refusing now with its top prefix and the share that looked like
//! people, the pools with their lanes; updates arrive over server-sent
//! events without a reload; with `[admin] token` set, the page reloads the
//! configuration and shows the result. A screenshot is kept at
//! `target/test-artifacts/live-page.png`.

use std::net::IpAddr;
use std::time::Duration;

use crate::fixtures::Upstream;
use crate::support::chromium::{Chromium, DevTools, artifacts_dir};
use crate::support::{HttpRequest, HttpUpstream, Weir};

const TOKEN: &str = "live-page-token-0123456789";

fn config(upstream: std::net::SocketAddr) -> String {
    format!(
        r#"[[listeners]]
address = "127.0.0.1:0"
[admin]
address = "127.0.0.1:0"
token = "{TOKEN}"
[pools.app]
servers = ["{upstream}"]
[pools.app.admission]
max_in_flight = 4
# Pages to read, and the page its rule limits.
[[routes]]
pool = "app"
path_prefix = "/read"
class = "reading"
[[routes]]
pool = "app"
# A visit of pages weir served makes a visit browsing here at once (a
# person's visit is several pages over a minute by default: docs/metrics.md).
[visit]
min_age = "0s"
[[classes.default.rules]]
name = "per-address"
limits = [{{ per = "ip", rate = 1, window = "1m" }}]
"#
    )
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
    // The in-test app with a `/slow/MS` path, to make requests wait.
    let app = Upstream::start().await;
    let weir = Weir::builder()
        .config(config(app.addr))
        .start()
        .await
        .unwrap();
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
    let chromium = Chromium::run(
        &[
            "--remote-debugging-port=0".to_string(),
            "--window-size=1200,900".to_string(),
        ],
        &url,
    );
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
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    let shot = artifacts_dir().join("live-page.png");
    std::fs::write(&shot, &png).unwrap();
    eprintln!(
        "live page screenshot: {} ({} bytes)",
        shot.display(),
        png.len()
    );
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
