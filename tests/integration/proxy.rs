//! Proxy semantics over real sockets: methods, bodies both ways, HTTP/2, TLS,
//! WebSocket upgrade, hop-by-hop headers, failover on connect errors.

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::fixtures::*;
use crate::support::ports::unused_addr;
use crate::support::tls::tls_connect;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_keeps_host_sets_forwarding_headers_and_strips_hop_by_hop() {
    let (_up, weir) = weir_in_front("").await;
    let (status, headers, body) = get(
        weir.addr,
        "/wiki/Main_Page?x=1",
        &[
            ("connection", "keep-alive, x-drop-me"),
            ("x-drop-me", "1"),
            ("te", "trailers"),
        ],
    )
    .await;
    assert_eq!(status, 200);
    let e = echo(&body);
    assert_eq!(e["uri"], "/wiki/Main_Page?x=1");
    assert_eq!(e["headers"]["host"], "test.local");
    assert_eq!(e["headers"]["x-forwarded-for"], "127.0.0.1");
    assert_eq!(e["headers"]["x-forwarded-proto"], "http");
    assert!(e["headers"].get("x-drop-me").is_none(), "{e}");
    assert!(e["headers"].get("te").is_none(), "{e}");
    // The upstream's hop-by-hop header (named in its Connection) is removed.
    assert!(headers.get("x-upstream-hop").is_none(), "{headers:?}");
    assert_eq!(headers["x-app"], "echo");
    assert_eq!(headers["content-type"], "application/json");
    let log = weir.access_log(1).await;
    assert_eq!(log[0]["status"], 200);
    assert_eq!(log[0]["upstream_status"], 200);
    assert_eq!(log[0]["client"], "127.0.0.1");
    assert_eq!(log[0]["class"], "default");
    assert_eq!(log[0]["path"], "/wiki/Main_Page?x=1");

    // A plain response: its fields forwarded as received.
    let (status, headers, _) = get(weir.addr, "/plain/wiki", &[]).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-app"], "echo");
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers.get_all("date").iter().count(), 1, "{headers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_body_and_keepalive_reuse() {
    let (_up, weir) = weir_in_front("").await;
    let mut c = H1::local(weir.addr).await;
    for i in 0..5 {
        let req = Request::post("/submit")
            .header("host", "test.local")
            .header("expect", "100-continue")
            .body(full(&"y".repeat(1000 + i)))
            .unwrap();
        let (status, _, body) = c.send(req).await.unwrap();
        assert_eq!(status, 200);
        let e = echo(&body);
        assert_eq!(e["method"], "POST");
        assert_eq!(e["body_len"], 1000 + i);
        assert!(e["headers"].get("expect").is_none());
    }
    let log = weir.access_log(5).await;
    assert_eq!(log[4]["bytes_in"], 1004);
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap();
    kb * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gib_upload_and_large_download_stream_with_flat_memory() {
    const GIB: u64 = 1 << 30;
    let up = Upstream::start().await;
    // Over the 100 MiB default: an operator who takes such uploads says so.
    let weir = TestWeir::start(&config(
        &[up.addr],
        "[limits]\nmax_body_bytes = 2147483648\n",
    ))
    .await;
    let before = rss_bytes();

    // Upload: a 1 GiB body produced chunk by chunk, never held whole.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(4);
    tokio::spawn(async move {
        let chunk = Bytes::from(vec![b'u'; 256 * 1024]);
        for _ in 0..(GIB / chunk.len() as u64) {
            if tx.send(Ok(Frame::data(chunk.clone()))).await.is_err() {
                break;
            }
        }
    });
    let stream = tokio_stream_from(rx);
    let body = BodyExt::boxed(StreamBody::new(stream));
    let mut c = H1::local(weir.addr).await;
    let req = Request::put("/upload")
        .header("host", "t")
        .body(body)
        .unwrap();
    let (status, _, resp) = c.send(req).await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(echo(&resp)["body_len"], GIB);
    let after_upload = rss_bytes();

    // Download: 256 MiB streamed back, counted without keeping it.
    let mut c = H1::local(weir.addr).await;
    c.sender.ready().await.unwrap();
    let resp = c
        .sender
        .send_request(
            Request::get(format!("/bytes/{}", 256 << 20))
                .header("host", "t")
                .body(full(""))
                .unwrap(),
        )
        .await
        .unwrap();
    let mut body = resp.into_body();
    let mut got = 0u64;
    while let Some(f) = body.frame().await {
        got += f.unwrap().data_ref().map_or(0, |d| d.len() as u64);
    }
    assert_eq!(got, 256 << 20);
    let after_download = rss_bytes();
    let growth = after_upload.max(after_download).saturating_sub(before);
    assert!(
        growth < 64 << 20,
        "memory grew by {} MiB while streaming",
        growth >> 20
    );
    let log = weir.access_log(2).await;
    assert_eq!(log[0]["bytes_in"], GIB);
    assert_eq!(log[1]["bytes_out"], 256u64 << 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_upgrade_is_passed_through() {
    let (_up, weir) = weir_in_front("").await;
    let mut s = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
    s.write_all(
        b"GET /ws HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap().to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    for msg in [&b"hello"[..], b"second frame"] {
        s.write_all(msg).await.unwrap();
        let mut buf = vec![0u8; msg.len()];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(buf, msg);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_prior_knowledge() {
    let (_up, weir) = weir_in_front("").await;
    let mut send = h2c(weir.addr).await;
    let mut handles = Vec::new();
    for i in 0..10 {
        // Odd pages come back as plain responses, forwarded as received.
        let page = if i % 2 == 1 { "plain/page" } else { "page" };
        let req = Request::get(format!("http://wiki.example/{page}/{i}"))
            .body(full(""))
            .unwrap();
        handles.push(send.send_request(req));
    }
    for (i, h) in handles.into_iter().enumerate() {
        let resp = h.await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.version(), http::Version::HTTP_2);
        assert_eq!(resp.headers()["content-type"], "application/json");
        assert_eq!(resp.headers()["x-app"], "echo");
        assert!(!resp.headers().contains_key("x-upstream-hop"));
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let e = echo(&body);
        let page = if i % 2 == 1 { "plain/page" } else { "page" };
        assert_eq!(e["uri"], format!("/{page}/{i}"));
        assert_eq!(e["headers"]["host"], "wiki.example");
    }
    let log = weir.access_log(10).await;
    assert!(log.iter().all(|l| l["proto"] == "HTTP/2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_alpn_h2_and_http11() {
    let dir = tempfile::tempdir().unwrap();
    let (_up, weir) = weir_on_tls(dir.path()).await;

    // HTTP/2 over TLS.
    let tls = tls_connect(weir.addr, &[b"h2"]).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let mut send = h2_over(tls).await;
    let resp = send
        .send_request(
            Request::get("https://weir.test/secure")
                .body(full(""))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(echo(&body)["headers"]["x-forwarded-proto"], "https");

    // HTTP/1.1 over TLS.
    let tls = tls_connect(weir.addr, &[b"http/1.1"]).await;
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let resp = send
        .send_request(
            Request::get("/plain/secure")
                .header("host", "weir.test")
                .body(full(""))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), http::Version::HTTP_11);
    assert_eq!(resp.headers()["x-app"], "echo");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_refused_fails_over_to_another_server() {
    let up = Upstream::start().await;
    let dead = unused_addr();
    let cfg = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n[pools.app]\nservers = [\"{dead}\", \"{}\"]\nbalance = \"round_robin\"\n",
        up.addr
    );
    let weir = TestWeir::start(&cfg).await;
    for _ in 0..6 {
        let (status, _, body) = get(weir.addr, "/", &[("x-mark", "kept")]).await;
        assert_eq!(status, 200);
        // Sent again as it is (no copy): the retry carries the whole head.
        let seen: serde_json::Value = serde_json::from_slice(&body).unwrap();
        for field in ["x-mark", "x-request-id", "x-forwarded-for", "host"] {
            assert!(seen["headers"][field].is_string(), "{field}: {seen}");
        }
    }
    let m = weir.metrics().await;
    assert!(
        metric(&m, "weir_upstream_retries_total{pool=\"app\"}") >= 2.0,
        "{m}"
    );
    assert_metric_at_least(
        &m,
        "weir_upstream_errors_total{pool=\"app\",kind=\"connect\"}",
        2.0,
    );

    // A POST whose connection was refused was never sent, body and all: it
    // goes to the other server too (issue 35; it was a 502).
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let mut c = H1::local(weir.addr).await;
        let req = Request::post("/x")
            .header("host", "t")
            .body(full("data"))
            .unwrap();
        statuses.push(c.send(req).await.unwrap().0.as_u16());
    }
    assert_eq!(statuses, [200; 4]);
}
