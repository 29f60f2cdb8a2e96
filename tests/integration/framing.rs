//! Strict framing, the same on both listeners (issue 18): the plain listener
//! (weir's own HTTP/1 codec) and the TLS one (hyper's) answer each shape a
//! request gets smuggled with by the same status, and the app never sees it.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::fixtures::*;
use crate::support::WeirConfig;
use crate::support::tls::{tls_connect, tls_files};

/// The status line's code of everything `stream` answers to `bytes`.
async fn status<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, bytes: &[u8]) -> u16 {
    stream.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out);
    text.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"))
}

/// A weir with a plain and a TLS listener in front of `up`.
async fn both_listeners(up: SocketAddr, dir: &std::path::Path) -> (TestWeir, SocketAddr) {
    let (cert, key) = tls_files(dir);
    let weir = TestWeir::start(&WeirConfig::new(up).tls_listener(&cert, &key).toml()).await;
    let tls = weir.server().listeners[1];
    (weir, tls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smuggling_shapes_get_one_answer_on_both_listeners() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (weir, tls) = both_listeners(up.addr, dir.path()).await;
    let head = |fields: &str| {
        format!("POST /count HTTP/1.1\r\nHost: wiki.example\r\n{fields}Connection: close\r\n\r\n")
    };
    let cases: Vec<(&str, String, u16)> = vec![
        // Codings weir would drop on the way: nginx answers 501 too.
        (
            "gzip, chunked",
            head("Transfer-Encoding: gzip, chunked\r\n") + "0\r\n\r\n",
            501,
        ),
        (
            "two Transfer-Encoding fields",
            head("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n") + "0\r\n\r\n",
            501,
        ),
        (
            "a Content-Length over 2^63",
            head("Content-Length: 9999999999999999999\r\n"),
            400,
        ),
        // A bare LF in a chunk line once made one POST two requests upstream.
        (
            "a bare LF in a chunk extension",
            head("Transfer-Encoding: chunked\r\n") + "3;x\nabc\r\n0\r\n\r\n",
            400,
        ),
        (
            "an empty chunk-size line",
            head("Transfer-Encoding: chunked\r\n") + "\r\nabc\r\n0\r\n\r\n",
            400,
        ),
        (
            "an invalid trailer",
            head("Transfer-Encoding: chunked\r\n") + "3\r\nabc\r\n0\r\nno colon\r\n\r\n",
            400,
        ),
    ];
    for (what, bytes, want) in &cases {
        let plain = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
        assert_eq!(
            status(plain, bytes.as_bytes()).await,
            *want,
            "plain: {what}"
        );
        let secure = tls_connect(tls, &[b"http/1.1"]).await;
        assert_eq!(status(secure, bytes.as_bytes()).await, *want, "TLS: {what}");
    }
    // Each is a request of its own and the client's fault: the plain
    // codec refuses the three bad heads before they are requests (counted
    // as connection errors); the other nine are logged, none answered by
    // the app. (A chunked body that breaks mid-way has had its head sent.)
    let log = weir.access_log(9).await;
    assert_eq!(log.len(), 9, "{log:#?}");
    assert!(
        log.iter().all(|l| l["status"] == 400 || l["status"] == 501),
        "{log:#?}"
    );
    let m = weir.metrics().await;
    assert_metric(
        &m,
        "weir_connection_errors_total{kind=\"unsupported_coding\"}",
        2.0,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_no_one_asked_for_is_not_passed_on() {
    // The test upstream answers `/ws` with 101 whatever the request says.
    let (_up, weir) = weir_in_front("").await;
    let plain = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
    let got = status(
        plain,
        b"GET /ws HTTP/1.1\r\nHost: wiki.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(got, 502);
    let log = weir.access_log(1).await;
    assert_eq!(log[0]["rule"], "unasked_upgrade");
    assert_eq!(log[0]["upstream_status"], 101);
}
