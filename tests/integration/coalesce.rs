//! Request coalescing end to end: weir in-process in front of a slow upstream
//! (every answer takes 300 ms) that counts the requests it receives, with
//! clients on distinct 127.x.y.z addresses firing at the same moment.
//!
//! What each test proves:
//! - `storm_on_one_page_reaches_the_upstream_a_few_times`: 50 identical
//!   anonymous GETs to a `coalesce = true` class reach the upstream at most
//!   a few times; all 50 get `200` and an upstream's body; the access log
//!   and `weir_coalesced_requests_total` count the copies.
//! - `unshareable_responses_are_not_shared`: `Set-Cookie`,
//!   `Cache-Control: private`, `no-store`, `Vary: User-Agent` and a chunked
//!   body larger than the cap reach the upstream once per request (and the
//!   large one arrives whole).
//! - `chunked_bodies_within_the_cap_are_shared`.
//! - `personal_requests_are_never_coalesced`: `Cookie`, `Authorization`,
//!   POST and conditional GETs always go upstream themselves, and are not
//!   marked coalesced.
//! - `classes_without_the_key_never_coalesce`.
//!
//! Counts, not timings: the machine is shared, so a late client may start a
//! second group; the bound on upstream requests has room for that.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::fixtures::*;

/// How long the upstream takes for every answer.
const UPSTREAM_DELAY: Duration = Duration::from_millis(300);

/// Requests seen per path, e.g. `/page` → 3.
type Hits = Arc<Mutex<HashMap<String, usize>>>;

/// The slow upstream. Every body names the upstream request that produced
/// it (`/page #2`), so a client's body says which request it copies. Paths:
/// `/set-cookie`, `/private`, `/no-store`, `/vary-ua` add the header that
/// makes the response personal; `/chunked` answers without a length;
/// `/chunked-big` without a length and past the test's 4 KiB cap, in three
/// chunks; anything else is a plain shareable page.
struct SlowUpstream {
    addr: SocketAddr,
    hits: Hits,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SlowUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SlowUpstream {
    async fn start() -> SlowUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits: Hits = Arc::default();
        let h = hits.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let h = h.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| answer(req, h.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        SlowUpstream { addr, hits, task }
    }

    fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

async fn answer(req: Request<Incoming>, hits: Hits) -> Result<Response<BoxBody>, Infallible> {
    let path = req.uri().path().to_string();
    let n = {
        let mut hits = hits.lock().unwrap();
        let n = hits.entry(path.clone()).or_default();
        *n += 1;
        *n
    };
    let _ = req.into_body().collect().await;
    tokio::time::sleep(UPSTREAM_DELAY).await;
    let text = format!("{path} #{n}");
    if path == "/chunked" {
        return Ok(Response::new(BodyExt::boxed(Unsized(
            [Bytes::from(text)].into(),
        ))));
    }
    if path == "/chunked-big" {
        let pad = Bytes::from(vec![b'.'; 2048]);
        return Ok(Response::new(BodyExt::boxed(Unsized(
            [Bytes::from(text), pad.clone(), pad.clone(), pad].into(),
        ))));
    }
    let mut resp = Response::new(BodyExt::boxed(
        Full::new(Bytes::from(text)).map_err(|never| match never {}),
    ));
    let h = resp.headers_mut();
    h.insert("content-type", "text/plain".parse().unwrap());
    match path.as_str() {
        "/set-cookie" => h.insert("set-cookie", "s=1; Path=/".parse().unwrap()),
        "/private" => h.insert("cache-control", "max-age=60, private".parse().unwrap()),
        "/no-store" => h.insert("cache-control", "no-store".parse().unwrap()),
        "/vary-ua" => h.insert("vary", "User-Agent".parse().unwrap()),
        _ => None,
    };
    Ok(resp)
}

/// A body that does not say its length (sent chunked), one frame per chunk.
struct Unsized(std::collections::VecDeque<Bytes>);

impl http_body::Body for Unsized {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        std::task::Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }
}

/// Runs the storms at the same time.
async fn storms(to: SocketAddr, n: usize, asks: &[Ask]) -> Vec<Vec<(u16, String)>> {
    let tasks: Vec<_> = asks
        .iter()
        .zip(40..)
        .map(|(a, net)| tokio::spawn(storm(to, n, a.clone(), net)))
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// `page` coalesces; `/plain/` routes to `plain`, which does not.
fn weir_config(upstream: SocketAddr) -> String {
    config(
        &[upstream],
        r#"
[classes.page]
coalesce = true
coalesce_max_body_bytes = 4096

[classes.plain]

[[routes]]
pool = "app"
class = "plain"
path_prefix = "/plain/"

[[routes]]
pool = "app"
class = "page"
"#,
    )
}

/// One request of a storm.
#[derive(Clone)]
struct Ask {
    method: &'static str,
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
}

/// Sends `n` copies of `ask` from `n` addresses in 127.`net`.0.0/16 at once
/// (all connections are open before the first request leaves); returns
/// (status, body) of each.
async fn storm(to: SocketAddr, n: usize, ask: Ask, net: u8) -> Vec<(u16, String)> {
    let mut clients = Vec::new();
    for i in 0..n {
        let source = IpAddr::V4(Ipv4Addr::new(
            127,
            net,
            (i / 200) as u8,
            (i % 200 + 1) as u8,
        ));
        clients.push(H1::connect(source, to).await.unwrap());
    }
    let start = Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut c| {
            let (start, ask) = (start.clone(), ask.clone());
            tokio::spawn(async move {
                let mut b = Request::builder()
                    .method(ask.method)
                    .uri(ask.path)
                    .header("host", "wiki.test");
                for (k, v) in ask.headers {
                    b = b.header(*k, *v);
                }
                let req = b.body(full("")).unwrap();
                start.wait().await;
                let (status, _, body) = c.send(req).await.unwrap();
                (status.as_u16(), String::from_utf8(body).unwrap())
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(
            tokio::time::timeout(Duration::from_secs(20), t)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    out
}

fn get(path: &'static str) -> Ask {
    Ask {
        method: "GET",
        path,
        headers: &[],
    }
}

/// How many access-log lines of `path` have `coalesced` = `value` (or null).
fn coalesced(lines: &[serde_json::Value], path: &str, value: Option<&str>) -> usize {
    lines
        .iter()
        .filter(|l| l["path"] == path && l["coalesced"].as_str() == value)
        .count()
}

#[tokio::test]
async fn storm_on_one_page_reaches_the_upstream_a_few_times() {
    let upstream = SlowUpstream::start().await;
    let weir = TestWeir::start(&weir_config(upstream.addr)).await;
    let answers = storm(weir.addr, 50, get("/page"), 31).await;

    let hits = upstream.hits("/page");
    assert!(
        (1..=4).contains(&hits),
        "50 identical GETs reached the upstream {hits} times"
    );
    assert!(answers.iter().all(|(s, _)| *s == 200), "{answers:?}");
    // Every body is one of the upstream's answers, and each answer served
    // at least its own request: nothing else was invented or mixed.
    let bodies: HashSet<&str> = answers.iter().map(|(_, b)| b.as_str()).collect();
    let produced: HashSet<String> = (1..=hits).map(|n| format!("/page #{n}")).collect();
    assert_eq!(
        bodies,
        produced.iter().map(String::as_str).collect(),
        "bodies served vs upstream answers"
    );

    let log = weir.access_log(50).await;
    assert_eq!(coalesced(&log, "/page", Some("leader")), hits, "{log:#?}");
    assert_eq!(coalesced(&log, "/page", Some("shared")), 50 - hits);
    let shared_lines = log.iter().filter(|l| l["coalesced"] == "shared");
    for l in shared_lines {
        assert_eq!(l["status"], 200);
        assert!(l["upstream"].is_null(), "a copy has no upstream: {l}");
    }
    let metrics = weir.metrics().await;
    assert_eq!(
        metric(&metrics, "weir_coalesced_requests_total{class=\"page\"}"),
        (50 - hits) as f64,
    );

    // The group ends with its leader: the next request goes upstream again.
    let (status, _, body) = get_from(
        "127.31.9.9".parse().unwrap(),
        weir.addr,
        "/page",
        &[("host", "wiki.test")],
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        String::from_utf8(body).unwrap(),
        format!("/page #{}", hits + 1)
    );
}

#[tokio::test]
async fn unshareable_responses_are_not_shared() {
    let upstream = SlowUpstream::start().await;
    let weir = TestWeir::start(&weir_config(upstream.addr)).await;
    let paths = [
        "/set-cookie",
        "/private",
        "/no-store",
        "/vary-ua",
        "/chunked-big",
    ];
    let results = storms(weir.addr, 8, &paths.map(get)).await;
    for (path, answers) in paths.iter().zip(results) {
        assert!(
            answers.iter().all(|(s, _)| *s == 200),
            "{path}: {answers:?}"
        );
        if *path == "/chunked-big" {
            // Past the cap midway: the leader's client still gets it whole.
            assert!(
                answers
                    .iter()
                    .all(|(_, b)| b.len() > 6144 && b.ends_with("...")),
                "{path}: {answers:?}"
            );
        }
        assert_eq!(
            upstream.hits(path),
            8,
            "{path}: every request goes upstream"
        );
        let bodies: HashSet<&str> = answers.iter().map(|(_, b)| b.as_str()).collect();
        assert_eq!(bodies.len(), 8, "{path}: nobody got another's response");
    }
    let log = weir.access_log(40).await;
    for path in paths {
        let leaders = coalesced(&log, path, Some("leader"));
        let unshared = coalesced(&log, path, Some("unshared"));
        assert!(leaders >= 1 && leaders + unshared == 8, "{path}: {log:#?}");
    }
    let metrics = weir.metrics().await;
    assert_metric(
        &metrics,
        "weir_coalesced_requests_total{class=\"page\"}",
        0.0,
    );
}

#[tokio::test]
async fn chunked_bodies_within_the_cap_are_shared() {
    let upstream = SlowUpstream::start().await;
    let weir = TestWeir::start(&weir_config(upstream.addr)).await;
    let results = storms(weir.addr, 20, &[get("/chunked")]).await;
    let hits = upstream.hits("/chunked");
    assert!(
        (1..=4).contains(&hits),
        "20 identical GETs reached the upstream {hits} times"
    );
    let answers = &results[0];
    assert!(answers.iter().all(|(s, _)| *s == 200), "{answers:?}");
    let produced: HashSet<String> = (1..=hits).map(|n| format!("/chunked #{n}")).collect();
    assert!(
        answers.iter().all(|(_, b)| produced.contains(b)),
        "{answers:?}"
    );
    let metrics = weir.metrics().await;
    assert_eq!(
        metric(&metrics, "weir_coalesced_requests_total{class=\"page\"}"),
        (20 - hits) as f64,
    );
}

#[tokio::test]
async fn personal_requests_are_never_coalesced() {
    let upstream = SlowUpstream::start().await;
    let weir = TestWeir::start(&weir_config(upstream.addr)).await;
    let asks = [
        Ask {
            method: "GET",
            path: "/with-cookie",
            headers: &[("cookie", "session=abc")],
        },
        Ask {
            method: "GET",
            path: "/with-auth",
            headers: &[("authorization", "Bearer abc")],
        },
        Ask {
            method: "POST",
            path: "/post",
            headers: &[],
        },
        Ask {
            method: "GET",
            path: "/conditional",
            headers: &[("if-none-match", "\"v1\"")],
        },
    ];
    let results = storms(weir.addr, 8, &asks).await;
    let log = weir.access_log(32).await;
    for (ask, answers) in asks.iter().zip(results) {
        assert!(answers.iter().all(|(s, _)| *s == 200), "{answers:?}");
        assert_eq!(upstream.hits(ask.path), 8, "{}", ask.path);
        assert_eq!(coalesced(&log, ask.path, None), 8, "{}", ask.path);
    }
}

#[tokio::test]
async fn classes_without_the_key_never_coalesce() {
    let upstream = SlowUpstream::start().await;
    let weir = TestWeir::start(&weir_config(upstream.addr)).await;
    let answers = storm(weir.addr, 10, get("/plain/page"), 32).await;
    assert!(answers.iter().all(|(s, _)| *s == 200), "{answers:?}");
    assert_eq!(upstream.hits("/plain/page"), 10);
    let log = weir.access_log(10).await;
    assert_eq!(coalesced(&log, "/plain/page", None), 10);
}

/// Issue 17: the key took the URI's host while the app got `Host`'s, so one
/// `GET http://wiki.test/page` with `Host: evil.example` led a group and its
/// followers got a page rendered for evil.example. Now that request is
/// refused before coalescing, and absolute-form requests that agree with
/// `Host` share one group with origin-form ones.
#[tokio::test]
async fn a_request_for_another_host_cannot_lead_a_group() {
    let upstream = SlowUpstream::start().await;
    let weir = TestWeir::start(&weir_config(upstream.addr)).await;
    let mut attacker = H1::connect("127.33.0.1".parse().unwrap(), weir.addr)
        .await
        .unwrap();
    let spoofed = Request::get("http://wiki.test/page")
        .header("host", "evil.example")
        .body(full(""))
        .unwrap();
    let (status, _, _) = attacker.send(spoofed).await.unwrap();
    assert_eq!(status, 400);
    assert_eq!(upstream.hits("/page"), 0, "refused before it could lead");
    let (absolute, origin) = tokio::join!(
        storm(weir.addr, 20, get("http://wiki.test/page"), 34),
        storm(weir.addr, 20, get("/page"), 35),
    );
    let hits = upstream.hits("/page");
    assert!((1..=4).contains(&hits), "40 requests, {hits} upstream");
    assert!(
        absolute.iter().chain(&origin).all(|(s, _)| *s == 200),
        "{absolute:?} {origin:?}"
    );
}
