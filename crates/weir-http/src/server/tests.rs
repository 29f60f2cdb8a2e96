//! The client-side codec on real loopback sockets: request framing, limits,
//! bodies decoded at every read boundary, pipelining, `100 Continue`, and
//! the response head.

use std::time::Duration;

use http_body_util::BodyExt as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::body::{RequestBody, ResponseBody};

const LIMITS: HeadLimits = HeadLimits {
    max_bytes: 8192,
    max_headers: 20,
};

/// A wire around the server end of a loopback connection, and the client end.
async fn pair() -> (SharedWire, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (server, _) = listener.accept().await.unwrap();
    let wire = Arc::new(Mutex::new(Wire {
        stream: server,
        buf: BytesMut::new(),
        body: Framing::Empty,
        continue_owed: None,
        state: Arc::new(crate::conn::ConnState::new(
            0,
            crate::conn::ConnClock::new(),
        )),
    }));
    (wire, client)
}

/// Parses `bytes` as the buffered input of a fresh wire.
async fn parse(
    bytes: &[u8],
    limits: HeadLimits,
) -> (SharedWire, Result<Option<Head<RequestBody>>, ClientError>) {
    let (wire, _client) = pair().await;
    let parsed = {
        let mut w = lock(&wire);
        w.buf.extend_from_slice(bytes);
        parse_head::<RequestBody>(&wire, &mut w, limits)
    };
    (wire, parsed)
}

fn malformed(r: Result<Option<Head<RequestBody>>, ClientError>) -> &'static str {
    match r {
        Err(ClientError::Malformed(why)) => why,
        Err(e) => panic!("expected malformed, got {e}"),
        Ok(h) => panic!(
            "expected malformed, parsed {:?}",
            h.map(|h| h.request.uri().clone())
        ),
    }
}

#[tokio::test]
async fn request_framing_follows_rfc_9112() {
    let (wire, head) = parse(
        b"POST /a?q=1 HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\n",
        LIMITS,
    )
    .await;
    let head = head.unwrap().unwrap();
    assert_eq!(head.request.method(), Method::POST);
    assert_eq!(head.request.uri().path(), "/a");
    assert_eq!(head.request.uri().query(), Some("q=1"));
    assert_eq!(head.request.headers()["host"], "t");
    assert!(head.keep_alive);
    assert_eq!(lock(&wire).body, Framing::Length(5));

    let (wire, head) = parse(
        b"POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n",
        LIMITS,
    )
    .await;
    head.unwrap().unwrap();
    assert_eq!(lock(&wire).body, Framing::Chunked(Chunk::Size));
    // Issue 18: a coding other than one `chunked` was accepted and dropped
    // (nginx: 501); so was a second Transfer-Encoding field.
    for te in [
        &b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"[..],
        b"POST / HTTP/1.1\r\nTransfer-Encoding: identity, chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
    ] {
        let (_, head) = parse(te, LIMITS).await;
        assert!(
            matches!(head, Err(ClientError::UnsupportedCoding)),
            "{}",
            String::from_utf8_lossy(te)
        );
    }
    let huge = b"POST / HTTP/1.1\r\nContent-Length: 9999999999999999999\r\n\r\n";
    assert!(malformed(parse(huge, LIMITS).await.1).contains("too large"));

    let (wire, head) = parse(b"GET / HTTP/1.1\r\n\r\n", LIMITS).await;
    assert!(head.unwrap().unwrap().request.body().is_end_stream());
    assert_eq!(lock(&wire).body, Framing::Empty);

    // Smuggling shapes are refused.
    let both = b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n";
    assert!(malformed(parse(both, LIMITS).await.1).contains("both"));
    let old = b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n";
    assert!(malformed(parse(old, LIMITS).await.1).contains("1.0"));
    let conflicting = b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n";
    assert!(malformed(parse(conflicting, LIMITS).await.1).contains("Content-Length"));
    // A repeated identical length is one length (RFC 9110 §8.6).
    let (wire, head) = parse(b"POST / HTTP/1.1\r\nContent-Length: 3, 3\r\n\r\n", LIMITS).await;
    head.unwrap().unwrap();
    assert_eq!(lock(&wire).body, Framing::Length(3));
    // Two spellings of one decimal value (found by the differential fuzz
    // target, where hyper keeps the first field): one length. (The fields
    // stay in the map as sent; the client codec writes its own framing.)
    let (wire, head) = parse(
        b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length:03\r\nContent-Length: 3\r\n\r\n",
        LIMITS,
    )
    .await;
    head.unwrap().unwrap();
    assert_eq!(lock(&wire).body, Framing::Length(3));
    assert!(malformed(parse(b"\x00\x01garbage\r\n\r\n", LIMITS).await.1).contains("unparsable"));
}

#[tokio::test]
async fn keep_alive_follows_the_version_and_connection_field() {
    for (raw, want) in [
        (&b"GET / HTTP/1.1\r\n\r\n"[..], true),
        (b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n", false),
        (b"GET / HTTP/1.0\r\n\r\n", false),
        (b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", true),
    ] {
        let head = parse(raw, LIMITS).await.1.unwrap().unwrap();
        assert_eq!(head.keep_alive, want, "{}", String::from_utf8_lossy(raw));
    }
}

#[tokio::test]
async fn oversized_heads_and_too_many_fields_are_refused_with_431() {
    let big = format!("GET / HTTP/1.1\r\nX-Big: {}\r\n\r\n", "a".repeat(9000));
    let r = parse(big.as_bytes(), LIMITS).await.1;
    assert!(matches!(r, Err(ClientError::HeadTooLarge)));
    // Still arriving, but already past the limit.
    let r = parse(&big.as_bytes()[..8500], LIMITS).await.1;
    assert!(matches!(r, Err(ClientError::HeadTooLarge)));
    let many: String = (0..21).map(|i| format!("X-H{i}: v\r\n")).collect();
    let r = parse(format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes(), LIMITS)
        .await
        .1;
    let e = r.err().unwrap();
    assert_eq!(
        e.reply_status(),
        Some(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
    );
    assert_eq!(e.label(), "header_too_large");
    // Above the stack table's size, the limit still holds.
    let wide = HeadLimits {
        max_bytes: 64 * 1024,
        max_headers: 150,
    };
    let fields: String = (0..140).map(|i| format!("X-H{i}: v\r\n")).collect();
    let head = parse(format!("GET / HTTP/1.1\r\n{fields}\r\n").as_bytes(), wide)
        .await
        .1;
    assert_eq!(head.unwrap().unwrap().request.headers().len(), 140);
    // Incomplete and within the limit: more bytes are needed.
    assert!(
        parse(b"GET / HTTP/1.1\r\nHo", LIMITS)
            .await
            .1
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn pipelined_requests_stay_buffered_for_their_turn() {
    let (wire, head) = parse(
        b"POST /one HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET /two HTTP/1.1\r\n\r\n",
        LIMITS,
    )
    .await;
    let mut first = head.unwrap().unwrap();
    let mut body = Vec::new();
    while let Some(frame) = first.request.body_mut().frame().await {
        body.extend_from_slice(&frame.unwrap().into_data().unwrap());
    }
    assert_eq!(body, b"abc");
    let second = {
        let mut w = lock(&wire);
        parse_head::<RequestBody>(&wire, &mut w, LIMITS)
            .unwrap()
            .unwrap()
    };
    assert_eq!(second.request.uri().path(), "/two");
    assert!(lock(&wire).buf.is_empty());
}

/// Reads a chunked body sent in pieces of `step` bytes.
async fn chunked_body_in_steps(step: usize) -> Vec<u8> {
    let (wire, mut client) = pair().await;
    let wire_bytes: &[u8] =
        b"5\r\nhello\r\n1;ext=1\r\n \r\n6\r\nworld!\r\n0\r\nTrailer: x\r\n\r\nNEXT";
    {
        let mut w = lock(&wire);
        w.buf
            .extend_from_slice(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
    }
    let mut head = {
        let mut w = lock(&wire);
        parse_head::<RequestBody>(&wire, &mut w, LIMITS)
            .unwrap()
            .unwrap()
    };
    let writer = tokio::spawn(async move {
        for piece in wire_bytes.chunks(step) {
            client.write_all(piece).await.unwrap();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        client
    });
    let mut body = Vec::new();
    while let Some(frame) = head.request.body_mut().frame().await {
        body.extend_from_slice(&frame.unwrap().into_data().unwrap());
    }
    assert!(head.request.body().is_end_stream());
    let _client = writer.await.unwrap();
    // What follows the body is the next request's, and stays.
    let mut left = Vec::new();
    for _ in 0..100 {
        left = lock(&wire).buf.to_vec();
        if left == b"NEXT" {
            break;
        }
        // The last bytes may not have been read with the body's end.
        let _ = poll_fn(|cx| Poll::Ready(lock(&wire).poll_fill(16, cx))).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(left, b"NEXT", "step {step}");
    body
}

#[tokio::test]
async fn chunked_bodies_decode_at_every_read_boundary() {
    for step in [1, 2, 3, 7, 64] {
        assert_eq!(
            chunked_body_in_steps(step).await,
            b"hello world!",
            "step {step}"
        );
    }
}

#[tokio::test]
async fn a_body_cut_short_is_an_error_not_an_end() {
    let (wire, mut client) = pair().await;
    let mut head = {
        let mut w = lock(&wire);
        w.buf
            .extend_from_slice(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc");
        parse_head::<RequestBody>(&wire, &mut w, LIMITS)
            .unwrap()
            .unwrap()
    };
    client.shutdown().await.unwrap();
    drop(client);
    let first = head.request.body_mut().frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "abc");
    let err = head.request.body_mut().frame().await.unwrap().unwrap_err();
    assert!(
        err.to_string().contains("middle of a request body"),
        "{err}"
    );
}

#[tokio::test]
async fn expect_continue_is_answered_when_the_body_is_first_read() {
    let (wire, mut client) = pair().await;
    let mut head = {
        let mut w = lock(&wire);
        w.buf.extend_from_slice(
            b"PUT / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n",
        );
        parse_head::<RequestBody>(&wire, &mut w, LIMITS)
            .unwrap()
            .unwrap()
    };
    // Nothing is sent before the proxy wants the body.
    let mut probe = [0u8; 64];
    let early = tokio::time::timeout(Duration::from_millis(100), client.read(&mut probe)).await;
    assert!(early.is_err(), "sent before the body was wanted");
    let reading = tokio::spawn(async move {
        let frame = head.request.body_mut().frame().await.unwrap().unwrap();
        frame.into_data().unwrap()
    });
    let mut got = vec![0u8; CONTINUE.len()];
    client.read_exact(&mut got).await.unwrap();
    assert_eq!(got, CONTINUE);
    client.write_all(b"ok").await.unwrap();
    assert_eq!(reading.await.unwrap(), "ok");
    // Without a body, nothing is owed.
    let (wire, _c) = pair().await;
    let mut w = lock(&wire);
    w.buf
        .extend_from_slice(b"GET / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n");
    parse_head::<RequestBody>(&wire, &mut w, LIMITS)
        .unwrap()
        .unwrap();
    assert_eq!(w.continue_owed, None);
}

fn head_text(
    status: StatusCode,
    headers: &[(&str, &str)],
    version: Version,
    framing: OutFraming,
    close: bool,
) -> String {
    let parts = response_parts(status, headers);
    let mut out = Vec::new();
    encode_head(
        &mut out,
        parts.status,
        &parts.headers,
        None,
        HopFraming {
            version,
            framing,
            close,
        },
    );
    String::from_utf8(out).unwrap()
}

/// A response's parts with `status` and `headers` in its map.
fn response_parts(status: StatusCode, headers: &[(&str, &str)]) -> http::response::Parts {
    let mut resp = http::Response::new(());
    *resp.status_mut() = status;
    for (k, v) in headers {
        resp.headers_mut().append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    resp.into_parts().0
}

#[test]
fn response_heads_carry_this_hop_s_framing_only() {
    let h = head_text(
        StatusCode::OK,
        &[
            ("content-length", "999"),
            ("transfer-encoding", "chunked"),
            ("connection", "keep-alive"),
            ("x-app", "1"),
        ],
        Version::HTTP_11,
        OutFraming::Length(5),
        false,
    );
    assert!(h.starts_with("HTTP/1.1 200 OK\r\n"), "{h}");
    assert!(h.contains("x-app: 1\r\n"));
    assert!(h.contains("content-length: 5\r\n"));
    assert!(!h.contains("999") && !h.contains("transfer-encoding") && !h.contains("connection"));
    assert!(h.contains("date: "), "{h}");
    assert!(h.ends_with("\r\n\r\n"));

    let h = head_text(
        StatusCode::OK,
        &[],
        Version::HTTP_11,
        OutFraming::Chunked,
        true,
    );
    assert!(h.contains("transfer-encoding: chunked\r\n") && h.contains("connection: close\r\n"));

    // HTTP/1.0 keep-alive is said explicitly.
    let h = head_text(
        StatusCode::OK,
        &[],
        Version::HTTP_10,
        OutFraming::Length(0),
        false,
    );
    assert!(
        h.starts_with("HTTP/1.0 200") && h.contains("connection: keep-alive\r\n"),
        "{h}"
    );

    // A HEAD answer keeps the resource's length; a 204 has none.
    let h = head_text(
        StatusCode::OK,
        &[("content-length", "42")],
        Version::HTTP_11,
        OutFraming::None,
        false,
    );
    assert!(h.contains("content-length: 42\r\n"), "{h}");
    let h = head_text(
        StatusCode::NO_CONTENT,
        &[("content-length", "0")],
        Version::HTTP_11,
        OutFraming::None,
        false,
    );
    assert!(!h.contains("content-length"), "{h}");

    // A 101 keeps the fields that name the new protocol.
    let h = head_text(
        StatusCode::SWITCHING_PROTOCOLS,
        &[("connection", "upgrade"), ("upgrade", "websocket")],
        Version::HTTP_11,
        OutFraming::None,
        false,
    );
    assert!(
        h.contains("connection: upgrade\r\n") && h.contains("upgrade: websocket\r\n"),
        "{h}"
    );
    // An unknown status has an empty reason.
    let h = head_text(
        StatusCode::from_u16(599).unwrap(),
        &[("date", "x")],
        Version::HTTP_11,
        OutFraming::Length(0),
        false,
    );
    assert!(h.starts_with("HTTP/1.1 599 \r\ndate: x\r\n"), "{h}");
}

/// The head weir writes for an upstream head forwarded as received, with
/// `added` in the response's map and `framing` towards the client.
fn forwarded_head_text(upstream: &[u8], added: &[(&str, &str)], framing: OutFraming) -> String {
    let mut buf = bytes::BytesMut::from(upstream);
    let head_request = framing == OutFraming::None;
    let head = crate::client::parse_head(&mut buf, head_request)
        .unwrap()
        .unwrap();
    let received = head.received.expect("a plain response");
    let parts = response_parts(head.status, added);
    let mut out = Vec::new();
    encode_head(
        &mut out,
        parts.status,
        &parts.headers,
        Some(&received),
        HopFraming {
            version: Version::HTTP_11,
            framing,
            close: false,
        },
    );
    String::from_utf8(out).unwrap()
}

#[test]
fn upstream_fields_received_pass_through_verbatim() {
    let upstream = b"HTTP/1.1 200 OK\r\nServer: app\r\nContent-Length: 5\r\n\
        Connection: keep-alive\r\nSet-Cookie: a=1\r\nDate: Mon, 30 Nov 2026 18:00:00 GMT\r\n\r\n";
    let h = forwarded_head_text(upstream, &[("x-weir", "1")], OutFraming::Length(5));
    assert_eq!(
        h,
        "HTTP/1.1 200 OK\r\nx-weir: 1\r\nServer: app\r\nSet-Cookie: a=1\r\n\
         Date: Mon, 30 Nov 2026 18:00:00 GMT\r\ncontent-length: 5\r\n\r\n"
    );
    // No Date from the upstream: weir's own; a HEAD answer keeps the
    // declared length.
    let upstream = b"HTTP/1.1 200 OK\r\nContent-Length: 42\r\nX-App: v\r\n\r\n";
    let h = forwarded_head_text(upstream, &[], OutFraming::None);
    assert!(
        h.contains("X-App: v\r\ncontent-length: 42\r\ndate: "),
        "{h}"
    );
    assert_eq!(h.matches("date: ").count(), 1, "{h}");
}

#[test]
fn chunk_size_lines_are_lowercase_hex() {
    let mut buf = [0u8; 18];
    for (n, want) in [
        (1usize, "1\r\n"),
        (15, "f\r\n"),
        (16, "10\r\n"),
        (4096, "1000\r\n"),
        (0xabcdef, "abcdef\r\n"),
    ] {
        assert_eq!(chunk_size_line(&mut buf, n), want.as_bytes());
    }
    assert_eq!(chunk_size_line(&mut buf, usize::MAX).len(), 18);
}

/// How a response body ended: bytes sent, and the error if any.
type Ending = Option<(u64, Option<String>)>;

/// Records how a response body ended.
struct Ended(Arc<Mutex<Ending>>);

impl crate::body::OnComplete for Ended {
    fn complete(self: Box<Self>, bytes_out: u64, error: Option<String>) {
        *self.0.lock().unwrap() = Some((bytes_out, error));
    }
}

#[tokio::test]
async fn a_full_response_leaves_in_one_write_with_its_length() {
    let (wire, mut client) = pair().await;
    let resp = Box::new(http::Response::new(ResponseBody::full("hello")));
    let written = write_response(&wire, resp, Version::HTTP_11, false, true)
        .await
        .unwrap();
    assert!(!written.close);
    let mut got = vec![0u8; 4096];
    let n = client.read(&mut got).await.unwrap();
    let text = String::from_utf8_lossy(&got[..n]);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.contains("content-length: 5\r\n"), "{text}");
    assert!(text.ends_with("\r\n\r\nhello"), "{text}");
    // A HEAD request gets the head alone, and its log line no error (the
    // body was not sent, not abandoned).
    let ended = Arc::new(Mutex::new(None));
    let resp = Box::new(http::Response::new(
        ResponseBody::full("hello").on_complete(Box::new(Ended(ended.clone()))),
    ));
    write_response(&wire, resp, Version::HTTP_11, true, true)
        .await
        .unwrap();
    let n = client.read(&mut got).await.unwrap();
    assert!(String::from_utf8_lossy(&got[..n]).ends_with("\r\n\r\n"));
    assert_eq!(*ended.lock().unwrap(), Some((0, None)));
}

#[tokio::test]
async fn closing_with_unread_input_reads_on_instead_of_resetting() {
    let (wire, mut client) = pair().await;
    client.write_all(b"unread request bytes").await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    write_all(&wire, &mut [IoSlice::new(b"answer")])
        .await
        .unwrap();
    let closing = tokio::spawn(async move { close(&wire, true).await });
    let mut got = Vec::new();
    client.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"answer");
    // A client still uploading keeps writing after the answer. Had the
    // server closed with input unread, the kernel would have reset the
    // connection, and this write would fail.
    tokio::time::sleep(Duration::from_millis(50)).await;
    client.write_all(b"more of the upload").await.unwrap();
    client.shutdown().await.unwrap();
    closing.await.unwrap();
}

/// The size of what `f` returns, without calling it.
fn returned_size<F, A, B, C, D, R>(_: F) -> usize
where
    F: FnOnce(A, B, C, D) -> R,
{
    std::mem::size_of::<R>()
}

/// Every open connection's task holds this future, idle or not: 10,000
/// idle connections cost ten thousand of it. (A 4 KiB scratch array held
/// across an await in `close` once made it 6.8 KB here; the request head
/// kept across the handling's awaits, 1.9 KB.) The handler's own future is
/// boxed apart, so any handler will do.
#[test]
fn a_connection_s_future_stays_small() {
    let size = returned_size(serve::<WhenTold>);
    eprintln!("serve future: {size} bytes");
    assert!(size <= 1024, "serve's future is {size} bytes");
}

/// A handler that answers each request with an empty 200 once `go` says
/// so, and knows nothing of the connection's counts.
#[derive(Clone)]
struct WhenTold {
    go: Arc<tokio::sync::Semaphore>,
}

impl Handler for WhenTold {
    type RequestBody = RequestBody;
    type ResponseBody = ResponseBody;

    fn handle(
        &self,
        _: Request<RequestBody>,
    ) -> impl Future<Output = Box<Response<ResponseBody>>> + Send + use<> {
        let go = self.go.clone();
        async move {
            go.acquire().await.unwrap().forget();
            Box::new(Response::new(ResponseBody::empty()))
        }
    }
}

/// Waits (at most 5 s) until `done` holds of `state`.
async fn until(state: &ConnState, done: impl Fn(&ConnState) -> bool) {
    let waited = tokio::time::timeout(Duration::from_secs(5), async {
        while !done(state) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "requests {}, in flight {}",
        state.requests(),
        state.in_flight()
    );
}

/// The codec counts a request in progress on its connection from its head
/// to its response written, whatever the handler does: the supervisor's
/// idle and drain decisions read it.
#[tokio::test]
async fn the_codec_counts_each_request_in_progress_until_its_response_is_written() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (server, _) = listener.accept().await.unwrap();
    let state = Arc::new(ConnState::new(0, crate::conn::ConnClock::new()));
    let go = Arc::new(tokio::sync::Semaphore::new(0));
    let serving = tokio::spawn({
        let (state, handler) = (state.clone(), WhenTold { go: go.clone() });
        async move { serve(server, &state, handler, LIMITS).await }
    });
    let mut got = vec![0u8; 4096];
    for n in 1..=2 {
        client
            .write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
            .await
            .unwrap();
        until(&state, |s| s.requests() == n).await;
        assert_eq!(state.in_flight(), 1, "request {n} is in progress");
        assert!(state.idle_for().is_none());
        go.add_permits(1);
        let read = client.read(&mut got).await.unwrap();
        assert!(got[..read].starts_with(b"HTTP/1.1 200 OK\r\n"));
        until(&state, |s| s.in_flight() == 0).await;
        assert!(state.idle_for().is_some(), "idle after request {n}");
    }
    // A request dropped before its answer (the client left) is finished too.
    client
        .write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    until(&state, |s| s.requests() == 3).await;
    drop(client);
    serving.await.unwrap().unwrap();
    assert_eq!(state.in_flight(), 0);
}
