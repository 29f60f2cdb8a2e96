//! The rescue end to end (issue 17): every answer weir makes itself comes
//! from one place with its reason, and a failure is the side's that caused
//! it: a client's stalled or broken upload is 408/400 and a client error,
//! never a 502 counted against the app.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::fixtures::*;

/// Everything the server sent on `s` until it closed (10 s at most),
/// asserting that it is weir's own answer with `status` and, in
/// `x-weir-reason`, `reason`.
async fn answer_with_reason(s: &mut tokio::net::TcpStream, status: u16, reason: &str) -> String {
    let answer = read_all(s).await;
    assert!(
        answer.starts_with(&format!("HTTP/1.1 {status} ")),
        "{answer}"
    );
    assert!(
        answer.contains(&format!("x-weir-reason: {reason}")),
        "{answer}"
    );
    answer
}

/// Everything the server sent on `s` until it closed (or 10 s).
async fn read_all(s: &mut tokio::net::TcpStream) -> String {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn upload_config(up: SocketAddr) -> String {
    config(
        &[up],
        "[[routes]]\npool = \"app\"\nclass = \"upload\"\n\
         [classes.upload]\nbody_read_timeout = \"300ms\"\n",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_is_the_clients_408_not_a_502() {
    let up = Upstream::start().await;
    let weir = TestWeir::start(&upload_config(up.addr)).await;
    let mut s = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
    s.write_all(
        b"POST /count HTTP/1.1\r\nHost: wiki.example\r\nContent-Length: 1000\r\n\r\n0123456789",
    )
    .await
    .unwrap();
    // ... and nothing more: the class allows 300 ms between chunks.
    let answer = answer_with_reason(&mut s, 408, "client_body_timeout").await;
    assert!(
        answer.contains("the request body stopped arriving"),
        "{answer}"
    );
    let log = weir.access_log(1).await;
    assert_eq!(log[0]["status"], 408);
    assert_eq!(log[0]["rule"], "client_body_timeout");
    let m = weir.metrics().await;
    assert_eq!(
        metric(
            &m,
            "weir_upstream_errors_total{pool=\"app\",kind=\"client_body_timeout\"}"
        ),
        0.0,
        "not the app's error"
    );
    assert_metric(
        &m,
        "weir_connection_errors_total{kind=\"client_body_timeout\"}",
        1.0,
    );
    assert_metric(
        &m,
        "weir_requests_total{class=\"upload\",status=\"408\",decision=\"admit\"}",
        1.0,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_the_codec_cannot_read_is_answered_with_its_reason() {
    let (up, weir) = weir_in_front("[limits]\nmax_headers = 20\n").await;
    let mut s = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
    let mut head = String::from("GET / HTTP/1.1\r\nHost: wiki.example\r\n");
    for i in 0..30 {
        head.push_str(&format!("X-Field-{i}: {i}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    let answer = answer_with_reason(&mut s, 431, "header_too_large").await;
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    let mut s = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: wiki.example\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    let answer = answer_with_reason(&mut s, 400, "bad_request").await;
    assert!(
        answer.contains("both Transfer-Encoding and Content-Length"),
        "{answer}"
    );
    assert_eq!(up.hits.load(std::sync::atomic::Ordering::Relaxed), 0);
}
