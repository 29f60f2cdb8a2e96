//! Connections on both sides: idle client connections give their buffers
//! back and serve what comes next without losing a byte, and upstream connections
//! are kept alive and reused, with a connection the upstream closed while
//! idle replaced instead of failing the request.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{Request, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

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
async fn idle_connections_serve_their_next_requests_whole() {
    let (_up, weir) = weir_in_front("").await;
    let mut c = RawConn::connect(weir.addr).await;
    c.write(GET).await;
    let (head, body) = c.response().await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let first_peer = echo(&body)["peer"].clone();

    // Idle past a second: the connection gives its buffer back.
    assert_eventually_async!(
        metric(
            &weir.metrics().await,
            "weir_connection_buffers_released_total",
        ) >= 1.0,
        "the idle connection's buffer released"
    );

    // The next request arrives in pieces.
    c.write(b"GET /two HTTP/1.1\r\nHo").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    c.write(b"st: t\r\n\r\n").await;
    let (head, body) = c.response().await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let doc = echo(&body);
    assert_eq!(doc["uri"], "/two");
    // The upstream connection was kept and reused.
    assert_eq!(doc["peer"], first_peer);

    // Released again, then two pipelined requests in one write.
    let released = metric(
        &weir.metrics().await,
        "weir_connection_buffers_released_total",
    );
    assert_eventually_async!(
        metric(
            &weir.metrics().await,
            "weir_connection_buffers_released_total",
        ) > released,
        "released again"
    );
    c.write(b"GET /three HTTP/1.1\r\nHost: t\r\n\r\nGET /four HTTP/1.1\r\nHost: t\r\n\r\n")
        .await;
    for want in ["/three", "/four"] {
        let (head, body) = c.response().await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(echo(&body)["uri"], want);
    }
}

/// When a raw test upstream closes a connection that answered one request.
#[derive(Clone, Copy)]
enum CloseAfterAnswer {
    /// Idle this long (like nginx with a short `keepalive_timeout`).
    Idle(Duration),
    /// As the next request arrives, unanswered: the keep-alive race of a
    /// server whose idle timeout fires just as a proxy reuses the connection.
    NextRequest,
}

/// An upstream that answers one request per connection with keep-alive, then
/// closes it without a word as `close` says; counts connections.
async fn one_answer_upstream(close: CloseAfterAnswer) -> (SocketAddr, Arc<AtomicUsize>) {
    answering_upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", close).await
}

/// An upstream that writes `answer` as soon as a request head is in (whether
/// or not a body follows), once per connection; counts connections.
async fn answering_upstream(
    answer: &'static [u8],
    close: CloseAfterAnswer,
) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let counted = conns.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                if !read_head(&mut s).await {
                    return;
                }
                let _ = s.write_all(answer).await;
                match close {
                    CloseAfterAnswer::Idle(linger) => tokio::time::sleep(linger).await,
                    CloseAfterAnswer::NextRequest => {
                        read_head(&mut s).await;
                    }
                }
            });
        }
    });
    (addr, conns)
}

/// Reads up to the end of a request head; false if the connection ended first.
async fn read_head(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_closing_idle_connections_costs_no_request() {
    let (up, conns) = one_answer_upstream(CloseAfterAnswer::Idle(Duration::from_millis(50))).await;
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
    assert_metric(
        &m,
        "weir_upstream_errors_total{pool=\"app\",kind=\"exchange\"}",
        0.0,
    );
}

async fn send_on(weir: SocketAddr, method: http::Method) -> StatusCode {
    let mut c = H1::local(weir).await;
    let req = Request::builder()
        .method(method)
        .uri("/")
        .header("host", "t")
        .body(full(""))
        .unwrap();
    c.send(req).await.unwrap().0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_on_a_connection_closed_as_it_arrived_is_sent_again() {
    let (up, conns) = one_answer_upstream(CloseAfterAnswer::NextRequest).await;
    let weir = TestWeir::start(&config(&[up], "")).await;
    let closed = "weir_upstream_errors_total{pool=\"app\",kind=\"closed\"}";

    // Each read after an idle pause lands on a connection that closes: it is
    // sent again on a new one, and the client never sees the race.
    for i in 0..3 {
        assert_eq!(send_on(weir.addr, http::Method::GET).await, 200, "GET {i}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(conns.load(Ordering::Relaxed) >= 3);
    assert_eq!(metric(&weir.metrics().await, closed), 0.0);

    // A POST may have been acted on: it is not sent twice, the client gets
    // 502 and the metric names why.
    assert_eq!(
        send_on(weir.addr, http::Method::POST).await,
        StatusCode::BAD_GATEWAY
    );
    assert_eq!(metric(&weir.metrics().await, closed), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_cut_by_a_closing_server_goes_to_another_server() {
    // Back to back, connections are reused at once (no idle pause): the
    // closed read is retried on the other server, within the retry budget.
    let (closing, _) = one_answer_upstream(CloseAfterAnswer::NextRequest).await;
    let steady = Upstream::start().await;
    let weir = TestWeir::start(&config(&[closing, steady.addr], "")).await;
    let closed = "weir_upstream_errors_total{pool=\"app\",kind=\"closed\"}";
    let mut n = 0;
    while n < 60 && metric(&weir.metrics().await, closed) < 1.0 {
        assert_eq!(send_on(weir.addr, http::Method::GET).await, 200, "GET {n}");
        n += 1;
    }
    let m = weir.metrics().await;
    assert!(metric(&m, closed) >= 1.0, "never reused a connection: {m}");
    assert_metric_at_least(&m, "weir_upstream_retries_total{pool=\"app\"}", 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_before_the_upload_ends_reaches_the_client_and_the_connection_is_not_reused() {
    // The app refuses an upload from its head alone and never reads the body
    // (as php-fpm does past `post_max_size`); it keeps the connection open.
    let (up, conns) = answering_upstream(
        b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 4\r\n\r\nbig!",
        CloseAfterAnswer::Idle(Duration::from_secs(30)),
    )
    .await;
    let weir = TestWeir::start(&config(&[up], "")).await;
    let opened = conns.load(Ordering::Relaxed);

    // 64 MiB announced: far more than the socket buffers between the three.
    let mut client = RawConn::connect(weir.addr).await;
    client
        .write(b"PUT /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 67108864\r\n\r\n")
        .await;
    let (mut reader, mut writer) = client.s.into_split();
    tokio::spawn(async move {
        let chunk = vec![b'u'; 64 * 1024];
        for _ in 0..1024 {
            if writer.write_all(&chunk).await.is_err() {
                break;
            }
        }
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"big!") {
        let n = tokio::time::timeout(Duration::from_secs(20), reader.read(&mut buf))
            .await
            .expect("the answer arrives while the upload is still going")
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");

    // The upstream connection carried half a request: the next request
    // gets a new one.
    let (status, _, body) = get(weir.addr, "/", &[]).await;
    assert_eq!(status, 413);
    assert_eq!(body, b"big!");
    assert!(conns.load(Ordering::Relaxed) >= opened + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_upstream_answer_is_a_502_and_a_bad_body_is_cut_short() {
    let exchange = "weir_upstream_errors_total{pool=\"app\",kind=\"exchange\"}";
    let bad_heads: [&'static [u8]; 2] = [
        b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
    ];
    for (i, answer) in bad_heads.into_iter().enumerate() {
        let (up, _) =
            answering_upstream(answer, CloseAfterAnswer::Idle(Duration::from_secs(5))).await;
        let weir = TestWeir::start(&config(&[up], "")).await;
        let (status, _, _) = get(weir.addr, "/", &[]).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "answer {i}");
        assert_eq!(metric(&weir.metrics().await, exchange), 1.0, "answer {i}");
    }

    // A bad chunk after a good head: the head has gone to the client, so
    // the client sees the response end early, never a whole one.
    let (up, _) = answering_upstream(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\nzz\r\n",
        CloseAfterAnswer::Idle(Duration::from_secs(5)),
    )
    .await;
    let weir = TestWeir::start(&config(&[up], "")).await;
    let mut c = H1::local(weir.addr).await;
    let req = Request::get("/")
        .header("host", "t")
        .body(full(""))
        .unwrap();
    assert!(
        c.send(req).await.is_err(),
        "a cut-short body must not look whole"
    );
}

/// A keep-alive upstream that answers every request on a connection, each
/// answer `head` then `body` (a `Content-Length` of `body`'s length) with a
/// pause before the head and another after `split` body bytes; counts
/// connections, request heads read and answers written.
struct PausingUpstream {
    addr: SocketAddr,
    conns: Arc<AtomicUsize>,
    heads: Arc<AtomicUsize>,
    answered: Arc<AtomicUsize>,
}

impl PausingUpstream {
    async fn start(before_head: Duration, body: usize, split: usize, mid_body: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let counts = [(); 3].map(|()| Arc::new(AtomicUsize::new(0)));
        let [conns, heads, answered] = counts.clone();
        let answer = format!("HTTP/1.1 200 OK\r\nContent-Length: {body}\r\n\r\n").into_bytes();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                conns.fetch_add(1, Ordering::Relaxed);
                let (heads, answered, answer) = (heads.clone(), answered.clone(), answer.clone());
                tokio::spawn(async move {
                    let payload = vec![b'x'; body];
                    while read_head(&mut s).await {
                        heads.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(before_head).await;
                        let first = [&answer[..], &payload[..split]].concat();
                        if s.write_all(&first).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(mid_body).await;
                        if s.write_all(&payload[split..]).await.is_err() {
                            return;
                        }
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        let [conns, heads, answered] = counts;
        PausingUpstream {
            addr,
            conns,
            heads,
            answered,
        }
    }

    fn count(&self, which: &AtomicUsize) -> usize {
        which.load(Ordering::Relaxed)
    }
}

/// Clients that leave mid-request, `aborts` times one after another: each
/// sends a GET, waits until the upstream has the request (and, with
/// `after_head`, until the client has the response head), then resets its
/// connection. Then as many GETs that finish. Returns the upstream
/// connections opened from the first abort on.
async fn connections_after_aborts(up: &PausingUpstream, after_head: bool, aborts: usize) -> usize {
    let weir = TestWeir::start(&config(&[up.addr], "")).await;
    for i in 0..3 {
        assert_eq!(get(weir.addr, "/", &[]).await.0, 200, "warm-up {i}");
    }
    let before = up.count(&up.conns);
    for i in 0..aborts {
        let mut client = RawConn::connect(weir.addr).await;
        client.write(GET).await;
        let heads = i + 4;
        assert_eventually_async!(up.count(&up.heads) >= heads, "abort {i}: request upstream");
        if after_head {
            client.fill("a response head").await;
        }
        // A reset, as a load generator stopping: nothing more is read.
        client.s.set_zero_linger().unwrap();
        drop(client);
        // The abandoned exchange ends upstream before the next one starts.
        assert_eventually_async!(up.count(&up.answered) >= heads, "abort {i}: answered");
    }
    for i in 0..aborts {
        assert_eq!(
            get(weir.addr, "/", &[]).await.0,
            200,
            "after the aborts {i}"
        );
    }
    up.count(&up.conns) - before
}

/// Issue 21: weir opened hundreds of upstream connections at 1,000 client
/// connections where nginx opened none, because a client that left
/// mid-request took its upstream connection with it. Now the exchange is
/// finished in the background and the connection kept: six aborts, then
/// six requests, open no connection (one is allowed for the race between a
/// connection's return and the next request; before, each abort cost one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_mid_request_costs_no_upstream_connection() {
    let up = PausingUpstream::start(Duration::from_millis(150), 2, 2, Duration::ZERO).await;
    let opened = connections_after_aborts(&up, false, 6).await;
    assert!(opened <= 1, "{opened} upstream connections opened");
}

/// The same when the client leaves during the response body: the rest of
/// the body (within the bound) is read and dropped, and the connection kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_mid_body_costs_no_upstream_connection() {
    let up =
        PausingUpstream::start(Duration::ZERO, 40_000, 1_000, Duration::from_millis(150)).await;
    let opened = connections_after_aborts(&up, true, 6).await;
    assert!(opened <= 1, "{opened} upstream connections opened");
}
