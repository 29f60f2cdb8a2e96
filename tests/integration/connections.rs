//! Connections on both sides: idle client connections park (their HTTP state
//! freed between requests) without losing a byte, and upstream connections
//! are kept alive and reused, with a connection the upstream closed while
//! idle replaced instead of failing the request.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::edge::assert_eventually;
use crate::fixtures::*;

/// A raw HTTP/1.1 client connection that reads responses one at a time,
/// keeping bytes of the next one (pipelining).
struct RawConn {
    s: TcpStream,
    buf: Vec<u8>,
}

impl RawConn {
    async fn connect(to: SocketAddr) -> RawConn {
        RawConn {
            s: TcpStream::connect(to).await.unwrap(),
            buf: Vec::new(),
        }
    }

    async fn write(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).await.unwrap();
    }

    async fn fill(&mut self, what: &str) {
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), self.s.read(&mut chunk))
            .await
            .unwrap_or_else(|_| panic!("{what} in time"))
            .expect("read");
        assert!(
            n > 0,
            "closed before {what}: {}",
            String::from_utf8_lossy(&self.buf)
        );
        self.buf.extend_from_slice(&chunk[..n]);
    }

    /// One response with a `Content-Length` body: (head, body).
    async fn response(&mut self) -> (String, Vec<u8>) {
        let end = loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break end;
            }
            self.fill("a response head").await;
        };
        let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        let len: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .unwrap_or(0);
        while self.buf.len() < end + 4 + len {
            self.fill("a response body").await;
        }
        let body = self.buf[end + 4..end + 4 + len].to_vec();
        self.buf.drain(..end + 4 + len);
        (head, body)
    }
}

const GET: &[u8] = b"GET /one HTTP/1.1\r\nHost: t\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_connections_serve_their_next_requests_whole() {
    let up = Upstream::start().await;
    let weir = TestWeir::start(&config(&[up.addr], "")).await;
    let mut c = RawConn::connect(weir.addr).await;
    c.write(GET).await;
    let (head, body) = c.response().await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let first_peer = echo(&body)["peer"].clone();

    // Idle past the park delay (0.5 s): the connection holds no HTTP state.
    assert_eventually(Duration::from_secs(10), || async {
        metric(&weir.metrics().await, "weir_connections_parked_total") >= 1.0
    })
    .await;

    // The next request arrives in pieces, after the connection parked.
    c.write(b"GET /two HTTP/1.1\r\nHo").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    c.write(b"st: t\r\n\r\n").await;
    let (head, body) = c.response().await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let doc = echo(&body);
    assert_eq!(doc["uri"], "/two");
    // The upstream connection was kept and reused.
    assert_eq!(doc["peer"], first_peer);

    // Parked again, then two pipelined requests in one write.
    let parked = metric(&weir.metrics().await, "weir_connections_parked_total");
    assert_eventually(Duration::from_secs(10), || async {
        metric(&weir.metrics().await, "weir_connections_parked_total") > parked
    })
    .await;
    c.write(b"GET /three HTTP/1.1\r\nHost: t\r\n\r\nGET /four HTTP/1.1\r\nHost: t\r\n\r\n")
        .await;
    for want in ["/three", "/four"] {
        let (head, body) = c.response().await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(echo(&body)["uri"], want);
    }
}

/// An upstream that, like nginx with a short `keepalive_timeout`, answers
/// with keep-alive and then closes the idle connection without a word.
async fn closing_upstream(linger: Duration) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let counted = conns.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await;
                tokio::time::sleep(linger).await;
            });
        }
    });
    (addr, conns)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_closing_idle_connections_costs_no_request() {
    let (up, conns) = closing_upstream(Duration::from_millis(50)).await;
    let weir = TestWeir::start(&config(&[up], "")).await;
    for i in 0..5 {
        let (status, _, body) = get(weir.addr, "/", &[]).await;
        assert_eq!(status, 200, "request {i}");
        assert_eq!(body, b"ok");
        // Longer than the upstream keeps a connection.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Each request needed a new connection (weir's warm-up probe may have
    // opened one more), and none failed for it.
    assert!(conns.load(Ordering::Relaxed) >= 5);
    let m = weir.metrics().await;
    assert_eq!(
        metric(
            &m,
            "weir_upstream_errors_total{pool=\"app\",kind=\"exchange\"}"
        ),
        0.0,
        "{m}"
    );
}
