//! HTTP/2 to the letter (issue 40, item 1): a malformed request (RFC 9113
//! section 8.1.1) never reaches the app. Each is sent frame by frame on
//! h2c; weir must refuse the stream (`RST_STREAM` with `PROTOCOL_ERROR`, or
//! a `400` before it) and keep the connection, and the app must never be
//! handed a complete request.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

use crate::fixtures::*;
use crate::support::h2frames::{Outcome, PROTOCOL_ERROR, RawH2};

/// An app that counts the requests it was handed whole: head and body to
/// their end (a body cut short is no request the app would serve).
async fn counting_app() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let whole = Arc::new(AtomicUsize::new(0));
    let count = whole.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let count = count.clone();
            let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let count = count.clone();
                async move {
                    if req.into_body().collect().await.is_ok() {
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                        Bytes::from_static(b"ok"),
                    )))
                }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, whole)
}

fn head(
    method: &'static str,
    extra: &[(&'static str, &'static str)],
) -> Vec<(&'static str, &'static str)> {
    let mut h = vec![
        (":method", method),
        (":scheme", "http"),
        (":path", "/wiki/Page"),
        (":authority", "test.local"),
    ];
    h.extend_from_slice(extra);
    h
}

/// One frame a case sends on stream 1.
enum Step {
    Headers(Vec<(&'static str, &'static str)>, bool),
    Data(&'static [u8], bool),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_request_never_reaches_the_app() {
    use Step::{Data, Headers};
    let (app, whole) = counting_app().await;
    let weir = TestWeir::start(&config(&[app], "")).await;
    let post = |extra| Headers(head("POST", extra), false);
    let cases = [
        (
            "a field value with a leading space",
            vec![Headers(head("GET", &[("x-a", " leading")]), true)],
        ),
        (
            "a field value with a trailing tab",
            vec![Headers(head("GET", &[("x-a", "trailing\t")]), true)],
        ),
        (
            "a pseudo-header in trailers",
            vec![
                post(&[]),
                Data(b"abc", false),
                Headers(vec![(":path", "/elsewhere")], true),
            ],
        ),
        (
            "a second HEADERS without END_STREAM",
            vec![
                post(&[]),
                Headers(vec![("x-b", "1")], false),
                Data(b"abc", true),
            ],
        ),
        (
            "DATA frames short of the content length",
            vec![
                post(&[("content-length", "10")]),
                Data(b"abc", false),
                Data(b"def", true),
            ],
        ),
        (
            "DATA frames past the content length",
            vec![
                post(&[("content-length", "4")]),
                Data(b"abc", false),
                Data(b"def", true),
            ],
        ),
    ];
    let total = cases.len();
    let mut wrong = Vec::new();
    for (case, steps) in cases {
        let mut h2 = RawH2::connect(weir.addr).await;
        for step in steps {
            match step {
                Headers(fields, end) => h2.headers(1, &fields, end).await,
                Data(bytes, end) => h2.data(1, bytes, end).await,
            }
        }
        let outcome = h2.outcome(1).await;
        let refused = matches!(
            outcome,
            Outcome::Reset(PROTOCOL_ERROR) | Outcome::Answered(Some(400))
        );
        // The connection stays for the client's other streams.
        h2.headers(3, &head("GET", &[]), true).await;
        let next = h2.outcome(3).await;
        if !refused || next != Outcome::Answered(Some(200)) {
            wrong.push(format!("{case}: {outcome:?}, then {next:?}"));
        }
    }
    // Every well-formed request after a malformed one was the app's: any
    // more it was handed whole are the malformed ones.
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert_eq!(
        whole.load(Ordering::SeqCst),
        total,
        "the app saw a malformed request"
    );
}
