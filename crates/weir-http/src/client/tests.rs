use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::body::RequestBody;
use crate::framing::MAX_CHUNK_LINE;

fn head(bytes: &[u8], head_request: bool) -> Result<Option<ResponseHead>, ExchangeError> {
    let mut buf = BytesMut::from(bytes);
    parse_head(&mut buf, head_request)
}

fn parsed(bytes: &[u8]) -> ResponseHead {
    head(bytes, false).expect("parses").expect("complete")
}

/// Every field a head's response carries, whether forwarded as received or
/// parsed into its map.
fn fields(h: ResponseHead) -> HeaderMap {
    let mut map = h.headers;
    if let Some(received) = h.received {
        received.append_to(&mut map);
    }
    map
}

#[test]
fn framing_follows_rfc_9112_section_6_3() {
    let h = parsed(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n");
    assert_eq!(h.framing, Framing::Length(12));
    assert!(h.keep_alive);

    let h = parsed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
    assert_eq!(h.framing, Framing::Chunked(Chunk::Size));
    assert!(h.keep_alive);

    // Both: the encoding wins and the connection is not trusted again.
    let h = parsed(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n");
    assert_eq!(h.framing, Framing::Chunked(Chunk::Size));
    assert!(!h.keep_alive);

    // An encoding that does not end in chunked: read until close.
    let h = parsed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n");
    assert_eq!(h.framing, Framing::UntilClose);
    assert!(!h.keep_alive);

    let h = parsed(b"HTTP/1.1 200 OK\r\n\r\n");
    assert_eq!(h.framing, Framing::UntilClose);
    assert!(!h.keep_alive);

    for status in ["204 No Content", "304 Not Modified"] {
        let h = parsed(format!("HTTP/1.1 {status}\r\nContent-Length: 5\r\n\r\n").as_bytes());
        assert_eq!(h.framing, Framing::Empty, "{status}");
    }
    // A HEAD response announces the length of a body it does not carry.
    let h = head(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", true)
        .unwrap()
        .unwrap();
    assert_eq!(h.framing, Framing::Empty);
    assert!(h.keep_alive);

    let h = parsed(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
    );
    assert_eq!(h.status, StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(h.framing, Framing::Empty);
    assert!(!h.keep_alive);
}

#[test]
fn connection_tokens_and_versions_decide_reuse() {
    assert!(
        !parsed(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n").keep_alive
    );
    assert!(
        !parsed(b"HTTP/1.1 200 OK\r\nConnection: foo, Close\r\nContent-Length: 0\r\n\r\n")
            .keep_alive
    );
    let h = parsed(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n");
    assert_eq!(h.version, Version::HTTP_10);
    assert!(!h.keep_alive);
    assert!(
        parsed(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n")
            .keep_alive
    );
}

#[test]
fn headers_are_kept_in_order_with_repeats() {
    let h = parsed(b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nX-App: v\r\nSet-Cookie: b=2\r\nContent-Length: 0\r\n\r\n");
    // A plain response: forwarded as received, nothing in the map.
    assert!(h.received.is_some() && h.headers.is_empty());
    let h = fields(h);
    let cookies: Vec<_> = h.get_all("set-cookie").iter().collect();
    assert_eq!(cookies, ["a=1", "b=2"]);
    assert_eq!(h["x-app"], "v");
    assert_eq!(h.len(), 4);
}

#[test]
fn fields_that_only_frame_this_hop_are_spent_in_the_parser() {
    let h = parsed(
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nX-App: v\r\nContent-Length: 0\r\n\r\n",
    );
    assert!(h.keep_alive);
    let map = fields(h);
    assert!(!map.contains_key("connection"));
    assert!(!map.contains_key("keep-alive"));
    assert_eq!(map.len(), 2);
    // A Connection header that names other fields stays, for the proxy to
    // remove those fields too.
    let h = parsed(
        b"HTTP/1.1 200 OK\r\nConnection: close, X-Hop\r\nX-Hop: 1\r\nContent-Length: 0\r\n\r\n",
    );
    assert!(!h.keep_alive);
    assert!(h.received.is_none(), "parsed into the map");
    assert_eq!(h.headers["connection"], "close, X-Hop");
    assert_eq!(h.headers["x-hop"], "1");
}

#[test]
fn interim_responses_are_skipped_and_partial_heads_wait() {
    let mut buf = BytesMut::from(
        &b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"[..],
    );
    let h = parse_head(&mut buf, false).unwrap().unwrap();
    assert_eq!(h.status, StatusCode::CREATED);
    assert_eq!(&buf[..], b"ok");

    let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\nContent-Le"[..]);
    assert!(parse_head(&mut buf, false).unwrap().is_none());
    assert_eq!(buf.len(), 27, "nothing consumed while incomplete");
}

#[test]
fn bad_heads_are_errors_not_panics() {
    let cases: [&[u8]; 7] = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 12abc\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nBad Header: x\r\n\r\n",
    ];
    for case in cases {
        assert!(
            head(case, false).is_err(),
            "{}",
            String::from_utf8_lossy(case)
        );
    }
    // Repeated equal lengths are one length.
    assert_eq!(
        parsed(b"HTTP/1.1 200 OK\r\nContent-Length: 7, 7\r\n\r\n").framing,
        Framing::Length(7)
    );

    let mut big = b"HTTP/1.1 200 OK\r\n".to_vec();
    while big.len() <= MAX_HEAD {
        big.extend_from_slice(
            b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n",
        );
    }
    assert!(matches!(
        head(&big, false),
        Err(ExchangeError::HeadTooLarge) | Err(ExchangeError::Malformed(_))
    ));

    let mut many = b"HTTP/1.1 200 OK\r\n".to_vec();
    for i in 0..=MAX_HEADERS {
        many.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    assert!(matches!(
        head(&many, false),
        Err(ExchangeError::Malformed(httparse::Error::TooManyHeaders))
    ));
}

/// Feeds `wire` to the chunked decoder `step` bytes at a time, as reads
/// would, collecting the data.
fn decode_all(wire: &[u8], step: usize) -> Result<(Vec<u8>, Chunk, usize), ExchangeError> {
    let mut chunk = Chunk::Size;
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for piece in wire.chunks(step) {
        buf.extend_from_slice(piece);
        while let Some(data) = decode_chunk(&mut chunk, &mut buf)? {
            out.extend_from_slice(&data);
        }
    }
    Ok((out, chunk, buf.len()))
}

#[test]
fn chunked_bodies_decode_whatever_the_read_boundaries() {
    let wire = b"5\r\nhello\r\n1;ext=\"x\"\r\n \r\nA\r\n0123456789\r\n0\r\nTrailer: t\r\n\r\n";
    for step in [1, 2, 3, 7, wire.len()] {
        let (data, state, left) = decode_all(wire, step).unwrap();
        assert_eq!(data, b"hello 0123456789", "step {step}");
        assert_eq!(state, Chunk::Done, "step {step}");
        assert_eq!(left, 0);
    }
    // Bytes after the body stay in the buffer (the connection is then not
    // reused).
    let (_, state, left) = decode_all(b"1\r\na\r\n0\r\n\r\nEXTRA", 64).unwrap();
    assert_eq!((state, left), (Chunk::Done, 5));

    for bad in [
        &b"zz\r\n"[..],
        b"5\r\nhelloXX",
        b"5\nhello\r\n",
        b"1\r\na\r\n0\r\nbad trailer\n",
    ] {
        assert!(
            decode_all(bad, 64).is_err(),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    let mut long = b"1;".to_vec();
    long.resize(MAX_CHUNK_LINE + 10, b'x');
    assert!(decode_all(&long, 64).is_err());
}

/// A connected pair on loopback: weir's side and the server's.
async fn pair() -> (UpstreamConnection, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap());
    let (client, server) = tokio::join!(client, listener.accept());
    (UpstreamConnection::new(client.unwrap()), server.unwrap().0)
}

/// Reads what the server side received until `end` is in it.
async fn received_until(s: &mut TcpStream, end: &[u8]) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(end.len()).any(|w| w == end) {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("in time")
            .unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    got
}

async fn body_of(
    conn: &mut UpstreamConnection,
    mut framing: Framing,
) -> Result<Vec<u8>, ExchangeError> {
    let mut out = Vec::new();
    while let Some(piece) = poll_fn(|cx| conn.poll_body(&mut framing, cx)).await {
        out.extend_from_slice(&piece?);
    }
    Ok(out)
}

fn request(method: Method, body: RequestBody) -> Request<RequestBody> {
    let mut req = Request::new(body);
    *req.method_mut() = method;
    *req.uri_mut() = "/path?q=1".parse().unwrap();
    req.headers_mut()
        .insert(header::HOST, HeaderValue::from_static("site"));
    // A client's stale length is never passed on: the body decides.
    req.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from_static("999"));
    req
}

/// Sends `req` on a new connection; the server reads the request head and
/// writes `answer`, then closes if `close`. Returns weir's side, the server's
/// (kept open unless closed), the request head as received, and the result.
async fn answered(
    req: &mut Request<RequestBody>,
    answer: &[u8],
    close: bool,
) -> (
    UpstreamConnection,
    Option<TcpStream>,
    String,
    Result<ResponseHead, Failure>,
) {
    let (mut conn, mut server) = pair().await;
    let server_side = async move {
        let got = received_until(&mut server, b"\r\n\r\n").await;
        server.write_all(answer).await.unwrap();
        (String::from_utf8(got).unwrap(), (!close).then_some(server))
    };
    let ((got, server), res) = tokio::join!(server_side, conn.exchange(req));
    (conn, server, got, res)
}

#[tokio::test]
async fn a_bodyless_exchange_over_a_real_socket_and_reuse() {
    let mut req = request(Method::GET, RequestBody::empty());
    let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
    let (mut conn, server, got, head) = answered(&mut req, answer, false).await;
    assert_eq!(got, "GET /path?q=1 HTTP/1.1\r\nhost: site\r\n\r\n");
    let head = head.unwrap();
    assert_eq!(body_of(&mut conn, head.framing).await.unwrap(), b"hello");
    assert!(conn.is_reusable());

    // The server closes the idle connection: it is no longer reusable.
    drop(server);
    tokio::time::timeout(Duration::from_secs(10), async {
        while conn.is_reusable() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("a closed connection is noticed");
}

#[tokio::test]
async fn a_post_is_framed_by_its_body_and_a_chunked_answer_decoded() {
    // An empty POST says so.
    let mut req = request(Method::POST, RequestBody::empty());
    let answer =
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
    let (mut conn, _server, got, head) = answered(&mut req, answer, false).await;
    assert!(got.ends_with("content-length: 0\r\n\r\n"), "{got}");
    assert!(!got.contains("999"), "{got}");
    let head = head.unwrap();
    assert_eq!(body_of(&mut conn, head.framing).await.unwrap(), b"abcde");
    assert!(conn.is_reusable());
}

#[tokio::test]
async fn a_response_cut_short_is_an_error_and_an_unanswered_request_says_so() {
    let mut req = request(Method::GET, RequestBody::empty());
    let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc";
    let (mut conn, _, _, head) = answered(&mut req, answer, true).await;
    let head = head.unwrap();
    assert!(matches!(
        body_of(&mut conn, head.framing).await,
        Err(ExchangeError::Incomplete)
    ));

    let (_, _, _, res) = answered(&mut req, b"", true).await;
    assert!(
        matches!(res, Err(Failure::Sent(ExchangeError::NoResponse(_)))),
        "{res:?}"
    );
}

#[tokio::test]
async fn a_body_until_close_ends_at_close() {
    let mut req = request(Method::GET, RequestBody::empty());
    let (mut conn, _, _, head) =
        answered(&mut req, b"HTTP/1.0 200 OK\r\n\r\nall of it", true).await;
    let head = head.unwrap();
    assert!(!head.keep_alive);
    assert_eq!(
        body_of(&mut conn, head.framing).await.unwrap(),
        b"all of it"
    );
}
