//! The canonical request target end to end (issue 17): every spelling of a
//! page meets the page's rule and reaches the app as the page; two hosts,
//! a missing or invalid host, a lowercase method are refused the same on
//! HTTP/1.1 and HTTP/2; the host weir routed on is the host the app
//! receives; `Forwarded` cannot be injected; a malformed host is answered,
//! logged and counted, not a panic.

use std::net::SocketAddr;
use std::time::Duration;

use http::Request;
use http_body_util::BodyExt as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::fixtures::*;
use crate::support::WeirConfig;

/// Sends `head` (a whole request, CRLFs included) on a fresh connection and
/// returns the status and the body of the answer.
async fn raw(addr: SocketAddr, head: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("answered within 10 s")
        .unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

/// `GET target` with `Host: host`, `Connection: close`.
async fn get_as(addr: SocketAddr, target: &str, host: &str) -> (u16, String) {
    raw(
        addr,
        &format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
    )
    .await
}

fn wiki(up: SocketAddr, extra: &str) -> String {
    WeirConfig::new(up)
        .pool_name("wiki")
        .route_with(
            "expensive",
            "path_prefix = \"/w/index.php\"\nquery_keys = [\"search\"]",
        )
        .route_with("admin", "host = \"admin.example\"")
        .route("page")
        .then(format!(
            r#"[[classes.expensive.rules]]
name = "site-search"
limits = [{{ per = "site", rate = 1, window = "1h" }}]

[[classes.admin.rules]]
name = "admin"
limits = [{{ per = "site", rate = 1, window = "1h" }}]
{extra}
"#
        ))
        .toml()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spellings_of_a_page_meet_its_rule() {
    let up = Upstream::start().await;
    let weir = TestWeir::start(&wiki(up.addr, "")).await;
    let (status, body) = get_as(weir.addr, "/w/index.php?search=a", "wiki.example").await;
    assert_eq!(status, 200, "{body}");
    // Issue 17: each of these reached the app as the same page, with 200,
    // once the site-wide rule had refused.
    for spelling in [
        "//w/index.php?search=a",
        "/w//index.php?search=a",
        "/./w/index.php?search=a",
        "/w/./index.php?search=a",
        "/static/../w/index.php?search=a",
        "/static/%2e%2e/w/index.php?search=a",
        "/w/index%2ephp?search=a",
        "/w/%69ndex.php?search=a",
        "/w/index.php?%73earch=a",
        "/w/index.php?search[]=a",
    ] {
        let (status, _) = get_as(weir.addr, spelling, "wiki.example").await;
        assert_eq!(status, 429, "{spelling} walked past the rule");
    }
    // Spellings that cannot be read one way are refused before any rule.
    let mut refused: Vec<(&str, &str)> = Vec::new();
    for (spelling, reason) in [
        ("/w%2Findex.php?search=a", "encoded_slash"),
        ("/static/..;/w/index.php?search=a", "dot_parameter"),
        ("/w/index.php%00?search=a", "nul_in_path"),
        ("/w/index.php%zz?search=a", "invalid_escape"),
    ] {
        let (status, body) = get_as(weir.addr, spelling, "wiki.example").await;
        assert_eq!(status, 400, "{spelling}");
        assert!(body.contains("path"), "{spelling}: {body}");
        refused.push((spelling, reason));
    }
    let log = weir.access_log(15).await;
    for (spelling, reason) in refused {
        assert!(
            log.iter()
                .any(|l| l["rule"] == reason && l["path"] == spelling && l["decision"] == "reject"),
            "{spelling}: {log:?}"
        );
    }
    assert_eq!(up.hits.load(std::sync::atomic::Ordering::Relaxed), 1);
    let m = weir.metrics().await;
    assert_metric(&m, "weir_rejections_total{rule=\"site-search\"}", 10.0);
    assert_metric(&m, "weir_rejections_total{rule=\"encoded_slash\"}", 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_app_receives_what_was_decided_on() {
    let up = Upstream::start().await;
    let weir = TestWeir::start(&wiki(up.addr, "[forwarding]\nforwarded = true\n")).await;
    // A spelled path and host are forwarded canonical; the log keeps both.
    let (status, body) = get_as(weir.addr, "//wiki/./Main%5fPage?x=%41", "Wiki.Example.").await;
    assert_eq!(status, 200, "{body}");
    let e = echo(body.as_bytes());
    assert_eq!(e["uri"], "/wiki/Main_Page?x=%41");
    assert_eq!(e["headers"]["host"], "wiki.example");
    assert_eq!(
        e["headers"]["forwarded"],
        "for=127.0.0.1;host=\"wiki.example\";proto=http"
    );
    let log = weir.access_log(1).await;
    assert_eq!(log[0]["host"], "wiki.example");
    assert_eq!(log[0]["path"], "/wiki/Main_Page?x=%41");
    assert_eq!(log[0]["raw_path"], "//wiki/./Main%5fPage?x=%41");
    // An absolute-form target goes upstream in origin form with its host.
    let (status, body) = get_as(weir.addr, "http://wiki.example/wiki/A", "wiki.example").await;
    assert_eq!(status, 200);
    let e = echo(body.as_bytes());
    assert_eq!(
        (&e["uri"], &e["headers"]["host"]),
        (&"/wiki/A".into(), &"wiki.example".into())
    );
    // `Connection: host` used to remove Host before forwarding.
    let (status, body) = raw(
        weir.addr,
        "GET /wiki/B HTTP/1.1\r\nHost: wiki.example\r\nConnection: host, close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(echo(body.as_bytes())["headers"]["host"], "wiki.example");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_host_per_request_on_http1() {
    let up = Upstream::start().await;
    let weir = TestWeir::start(&wiki(up.addr, "")).await;
    assert_eq!(get_as(weir.addr, "/", "admin.example").await.0, 200);
    // Issue 17: each passed a 1/hour rule on admin.example 4 times of 4.
    for head in [
        "GET http://a.example/x HTTP/1.1\r\nHost: admin.example\r\n",
        "GET http://admin.example/x HTTP/1.1\r\nHost: a.example\r\n",
        "GET /x HTTP/1.1\r\nHost: a.example\r\nHost: admin.example\r\n",
        "GET /x HTTP/1.1\r\nHost: admin.example\r\nHost: admin.example\r\n",
        "GET a.example HTTP/1.1\r\nHost: admin.example\r\n",
        "GET /x HTTP/1.1\r\n",
        "GET /x HTTP/1.1\r\nHost: [abc\r\n",
        "GET /x HTTP/1.1\r\nHost: x\", for=6.6.6.6;host=\"y\r\n",
    ] {
        let (status, body) = raw(weir.addr, &format!("{head}Connection: close\r\n\r\n")).await;
        assert_eq!(status, 400, "{head:?}: {body}");
    }
    // The admin rule saw one request; the app got nothing else.
    let m = weir.metrics().await;
    assert_eq!(
        metric(&m, "weir_rejections_total{rule=\"admin\"}"),
        0.0,
        "no mismatched request reached the rule"
    );
    assert_eq!(up.hits.load(std::sync::atomic::Ordering::Relaxed), 1);
    // `Host: [abc` panicked in strip_port: now it is answered, logged and counted.
    let refused = |reason: &str| metric(&m, &format!("weir_rejections_total{{rule=\"{reason}\"}}"));
    assert_eq!(refused("invalid_host"), 2.0);
    assert_eq!(refused("host_mismatch"), 2.0);
    assert_eq!(refused("duplicate_host"), 2.0);
    assert_eq!(refused("missing_host"), 1.0);
    assert_eq!(refused("invalid_target"), 1.0);
    let log = weir.access_log(9).await;
    assert_eq!(log.iter().filter(|l| l["status"] == 400).count(), 8);
    // HTTP/1.0 may leave Host out.
    let (status, _) = raw(weir.addr, "GET /x HTTP/1.0\r\n\r\n").await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_are_case_sensitive_on_both_listeners() {
    let up = Upstream::start().await;
    let weir = TestWeir::start(&wiki(up.addr, "")).await;
    let (status, _) = raw(
        weir.addr,
        "get /x HTTP/1.1\r\nHost: wiki.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 501);
    // HTTP/2 (prior knowledge on the plain listener).
    let mut h2 = h2c(weir.addr).await;
    let req = Request::builder()
        .method(http::Method::from_bytes(b"get").unwrap())
        .uri("http://wiki.example/x")
        .body(full(""))
        .unwrap();
    assert_eq!(h2.send_request(req).await.unwrap().status(), 501);
    assert_eq!(up.hits.load(std::sync::atomic::Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authority_and_host_agree_on_http2() {
    let up = Upstream::start().await;
    let weir = TestWeir::start(&wiki(up.addr, "")).await;
    let mut h2 = h2c(weir.addr).await;
    let send = |uri: &str, host: Option<&str>| {
        let mut b = Request::get(uri);
        if let Some(h) = host {
            b = b.header("host", h);
        }
        b.body(full("")).unwrap()
    };
    // Issue 17: `:authority` and `host` disagreeing passed the admin rule 3 of 3.
    // RFC 9113 8.3.1: malformed, so a 400 and then RST_STREAM(PROTOCOL_ERROR);
    // hyper's client reports whichever it reads first.
    match h2
        .send_request(send("http://a.example/x", Some("admin.example")))
        .await
    {
        Ok(resp) => assert_eq!(resp.status(), 400),
        Err(e) => assert!(format!("{e:?}").contains("PROTOCOL_ERROR"), "{e:?}"),
    }
    assert_eq!(up.hits.load(std::sync::atomic::Ordering::Relaxed), 0);
    let resp = h2
        .send_request(send("http://Admin.Example/x", None))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(echo(&body)["headers"]["host"], "admin.example");
    let resp = h2
        .send_request(send("http://admin.example/x", Some("admin.example")))
        .await
        .unwrap();
    assert_eq!(resp.status(), 429, "the admin rule holds on HTTP/2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_host_cannot_name_the_client() {
    // Issue 17: `Host: x", for=6.6.6.6;host="y` put `for=6.6.6.6` into
    // `Forwarded`, and a second weir trusting the first logged 6.6.6.6.
    let up = Upstream::start().await;
    let inner = TestWeir::start(&format!(
        "{}\n[identity]\ntrusted_proxies = [\"127.0.0.1/32\"]\nclient_header = \"forwarded\"\n",
        config(&[up.addr], "")
    ))
    .await;
    let outer = TestWeir::start(&config(&[inner.addr], "[forwarding]\nforwarded = true\n")).await;
    let (status, _) = get_as(outer.addr, "/x", "x\", for=6.6.6.6;host=\"y").await;
    assert_eq!(status, 400);
    let (status, body) = get_as(outer.addr, "/x", "wiki.example").await;
    assert_eq!(status, 200);
    let e = echo(body.as_bytes());
    assert_eq!(
        e["headers"]["forwarded"],
        "for=127.0.0.1;host=\"wiki.example\";proto=http"
    );
    let log = inner.access_log(1).await;
    assert_eq!(log[0]["client"], "127.0.0.1");
    assert_eq!(log[0]["client_source"], "forwarded");
}
