//! A deadline for every stage of a connection (issue 18): a client that
//! stops reading its response, a body dripped within its read timeout, a
//! body longer than its class takes, and the challenge's verify endpoint
//! holding a connection with a cut body. Each case once held a connection
//! (and with it an admission slot) for as long as the client liked.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{HttpRequest, HttpUpstream, Weir, WeirConfig};

fn config(up: SocketAddr, extra: &str) -> String {
    WeirConfig::new(up)
        .then("[process]\nwatch_config = false")
        .admin()
        .access_log_off()
        .route("page")
        .then(extra)
        .toml()
}

/// [`upstream`], and weir in front of it with [`config`] and `extra`.
async fn start(extra: &str) -> (HttpUpstream, Weir) {
    let up = upstream().await;
    let weir = Weir::builder()
        .config(config(up.addr(), extra))
        .start()
        .await
        .unwrap();
    (up, weir)
}

/// [`start`], and a raw TCP connection to weir's listener.
async fn start_with_a_connection(extra: &str) -> (HttpUpstream, Weir, tokio::net::TcpStream) {
    let (up, weir) = start(extra).await;
    let s = tokio::net::TcpStream::connect(weir.listener(0))
        .await
        .unwrap();
    (up, weir, s)
}

/// An upstream answering `/big` with 64 MiB (more than loopback's socket
/// buffers hold) and anything else with the length of the body it read.
async fn upstream() -> HttpUpstream {
    let big = Bytes::from(vec![b'x'; 64 << 20]);
    HttpUpstream::start(move |req| {
        if req.head.uri.path() == "/big" {
            http::Response::new(Full::new(big.clone()))
        } else {
            http::Response::new(Full::new(Bytes::from(format!("read {}", req.body.len()))))
        }
    })
    .await
    .unwrap()
}

/// Reads one answer with a `content-length` (10 s at most).
async fn read_one_answer(stream: &mut tokio::net::TcpStream) -> String {
    let mut raw = Vec::new();
    let whole = |raw: &[u8]| {
        let text = String::from_utf8_lossy(raw);
        let (head, body) = text.split_once("\r\n\r\n")?;
        let length = (head.lines()).find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")?
                .parse()
                .ok()
        })?;
        (body.len() >= length).then(|| text.to_string())
    };
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            if let Some(answer) = whole(&raw) {
                return answer;
            }
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return String::from_utf8_lossy(&raw).into_owned(),
                Ok(n) => raw.extend_from_slice(&buf[..n]),
            }
        }
    };
    (tokio::time::timeout(Duration::from_secs(10), read).await).expect("an answer within 10 s")
}

/// Reads what the server sends until it closes (or `within` passes).
async fn read_answer(stream: &mut tokio::net::TcpStream, within: Duration) -> String {
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(within, stream.read_to_end(&mut raw)).await;
    String::from_utf8_lossy(&raw).into_owned()
}

/// A client that stops reading holds no admission slot (the slot is the
/// app's, and is freed once its answer begins: issue 35), and is cut at
/// the send timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_holds_no_admission_slot_and_is_cut_at_the_send_timeout() {
    let (up, weir) = start("[limits]\nsend_timeout = \"2s\"\n\n[pools.app.admission]\nmax_in_flight = 1\nqueue_timeout = \"60s\"\n").await;
    // Asks for 64 MiB and reads none of it, with a small receive window.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stalled = socket.connect(weir.listener(0)).await.unwrap();
    stalled
        .write_all(b"GET /big HTTP/1.1\r\nhost: t\r\n\r\n")
        .await
        .unwrap();
    assert_eventually_async!(
        up.requests() == 1
            && weir
                .metrics()
                .await
                .contains("weir_admission_in_flight{pool=\"app\"} 0"),
        "the app answered /big and its slot was given back:\n{}",
        weir.metrics().await
    );

    // The only slot was the stalled client's until its answer began; the
    // next request does not wait for the send timeout (before: 2 s).
    let started = Instant::now();
    let r = HttpRequest::get("/small")
        .timeout(Duration::from_secs(30))
        .send(weir.listener(0))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let waited = started.elapsed();
    assert!(waited < Duration::from_millis(1500), "{waited:?}");
    let cut = "weir_connections_closed_total{reason=\"send_timeout\"} 1";
    assert_eventually_async!(
        weir.metrics().await.contains(cut),
        "never cut at the send timeout:\n{}",
        weir.metrics().await
    );
    eprintln!("a request behind a client that stopped reading waited {waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_dripped_within_its_read_timeout_is_cut_at_the_minimum_rate() {
    let (_up, _weir, mut s) =
        start_with_a_connection("[limits]\nbody_read_timeout = \"2s\"\nmin_body_rate = 100\n")
            .await;
    s.write_all(b"POST /up HTTP/1.1\r\nhost: t\r\ncontent-length: 1000\r\n\r\n")
        .await
        .unwrap();
    let (mut rd, mut wr) = s.into_split();
    // One byte every 300 ms: each within the 2 s read timeout, 1,000 of
    // them would take five minutes.
    let drip = tokio::spawn(async move {
        for _ in 0..1000 {
            if wr.write_all(b"d").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let started = Instant::now();
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), rd.read_to_end(&mut raw)).await;
    let took = started.elapsed();
    drip.abort();
    let answer = String::from_utf8_lossy(&raw);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:.300}");
    assert!(answer.contains("client_body_too_slow"), "{answer:.300}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    eprintln!("a dripped body was answered 408 after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_longer_than_its_class_takes_is_413() {
    let (up, weir) = start("[classes.page]\nmax_body_bytes = 1000\n").await;
    let addr = weir.listener(0);

    let r = HttpRequest::post("/up", vec![b'a'; 1000])
        .send(addr)
        .await
        .unwrap();
    assert_eq!((r.status, r.text()), (200, "read 1000".to_string()));
    // Declared too long: refused before a byte of it is read or forwarded.
    let before = up.requests();
    let r = HttpRequest::post("/up", vec![b'a'; 1001])
        .send(addr)
        .await
        .unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.header("x-weir-reason"), Some("client_body_too_large"));
    assert_eq!(up.requests(), before, "a refused body reached the app");
    // Chunked, so its length shows only as it comes: cut when it passes.
    // Sent whole, the rest is here to skip, and the connection serves on.
    let chunk = format!("258\r\n{}\r\n", "c".repeat(600));
    let head = "POST /up HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n";
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let whole =
        format!("{head}{chunk}{chunk}{chunk}0\r\n\r\nGET /next HTTP/1.1\r\nhost: t\r\n\r\n");
    s.write_all(whole.as_bytes()).await.unwrap();
    let answer = read_one_answer(&mut s).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer:.300}");
    assert!(!answer.contains("connection: close"), "{answer:.300}");
    let next = read_one_answer(&mut s).await;
    assert!(next.starts_with("HTTP/1.1 200"), "kept alive: {next:.300}");
    // Cut before the rest is sent: the answer says `close`, and it closes.
    // (It once kept the keep-alive framing and closed without a word.)
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("{head}{chunk}{chunk}").as_bytes())
        .await
        .unwrap();
    let answer = read_one_answer(&mut s).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer:.300}");
    assert!(answer.contains("connection: close"), "{answer:.300}");
    assert_eq!(read_answer(&mut s, Duration::from_secs(10)).await, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_verify_endpoint_times_out_a_cut_body_like_any_other() {
    let (_up, _weir, mut s) = start_with_a_connection("[limits]\nbody_read_timeout = \"2s\"\n\n[classes.page]\nchallenge = \"always\"\n\n[challenge]\nkeys = [\"challenge-key-for-tests-0123456789abcdef\"]\n").await;
    s.write_all(
        b"POST /.weir/challenge/verify HTTP/1.1\r\nhost: t\r\ncontent-type: application/x-www-form-urlencoded\r\ncontent-length: 1000\r\n\r\nnonce=",
    )
    .await
    .unwrap();
    let started = Instant::now();
    let answer = read_answer(&mut s, Duration::from_secs(20)).await;
    let took = started.elapsed();
    assert!(
        answer.starts_with("HTTP/1.1 408"),
        "{answer:.300} after {took:?}"
    );
    assert!(took < Duration::from_secs(20), "{took:?}");
}
