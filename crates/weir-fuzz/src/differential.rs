//! weir's HTTP/1 request-head reader against hyper's server on the same
//! bytes. weir may refuse more than hyper (it refuses codings other than
//! `chunked`, lengths over 2^63-1, both framing fields at once: the
//! smuggling probes, documented in docs/request-path.md), never less: a
//! head weir accepts and hyper refuses is a head two servers could read
//! differently. When both accept, they must agree on the method, target,
//! version, fields and framing.

use std::cell::RefCell;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::io::AsyncWriteExt;
use weir_http::framing::Framing;
use weir_http::server::read_head;

use super::LIMITS;

/// What hyper made of a request head.
#[derive(Debug)]
struct HyperSaw {
    method: http::Method,
    uri: String,
    version: http::Version,
    headers: http::HeaderMap,
}

thread_local! {
    static RUNTIME: RefCell<tokio::runtime::Runtime> = RefCell::new(
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime"),
    );
}

/// The first request hyper's HTTP/1 server reads from `data`, if any.
fn hyper_reads(data: &[u8]) -> Option<HyperSaw> {
    let seen: Arc<Mutex<Option<HyperSaw>>> = Arc::default();
    let record = seen.clone();
    RUNTIME.with(|rt| {
        rt.borrow().block_on(async {
            let (mut client, server) = tokio::io::duplex(64 * 1024);
            let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                // Recorded when hyper hands the request over, not when its
                // future first runs: hyper may drop that at the input's end.
                let mut slot = record.lock().unwrap_or_else(|e| e.into_inner());
                if slot.is_none() {
                    *slot = Some(HyperSaw {
                        method: req.method().clone(),
                        uri: req.uri().to_string(),
                        version: req.version(),
                        headers: req.headers().clone(),
                    });
                }
                drop(slot);
                async move {
                    let _ = req.into_body().collect().await;
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::new())))
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .max_buf_size(LIMITS.max_bytes.max(8192))
                .serve_connection(hyper_util::rt::TokioIo::new(server), service);
            let feed = async {
                let _ = client.write_all(data).await;
                let _ = client.shutdown().await;
                // Keep reading so hyper's writes never block.
                let mut sink = tokio::io::sink();
                let _ = tokio::io::copy(&mut client, &mut sink).await;
            };
            let _ =
                tokio::time::timeout(Duration::from_secs(2), async { tokio::join!(conn, feed) })
                    .await;
        })
    });
    seen.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// Fields that carry framing or connection state: weir spends them (they
/// are not in its map), hyper keeps them.
fn spent(name: &http::HeaderName) -> bool {
    matches!(
        name.as_str(),
        "content-length" | "transfer-encoding" | "connection" | "keep-alive" | "proxy-connection"
    )
}

/// The differential target: see the module's doc.
pub fn http1_request_vs_hyper(data: &[u8]) {
    // A complete head only: what a partial one becomes depends on bytes to come.
    let Ok(weir) = read_head(data, LIMITS) else {
        return;
    };
    let Some(weir) = weir else {
        return;
    };
    let head = &data[..weir.len];
    let Some(hyper) = hyper_reads(head) else {
        panic!(
            "weir accepted a head hyper refuses: {:?}",
            String::from_utf8_lossy(head)
        );
    };
    assert_eq!(weir.method, hyper.method);
    assert_eq!(weir.uri.to_string(), hyper.uri);
    assert_eq!(weir.version, hyper.version);
    // Framing fields are compared as framing below: weir writes a repeated
    // Content-Length (`03`, `3`) as the one decimal value both mean (RFC 9110
    // 8.6), where hyper keeps the first spelling.
    for (name, value) in weir.headers.iter().filter(|(n, _)| !spent(n)) {
        assert!(
            hyper.headers.get_all(name).iter().any(|v| v == value),
            "{name}: {value:?} only weir saw"
        );
    }
    for name in hyper.headers.keys().filter(|n| !spent(n)) {
        assert_eq!(
            weir.headers.get_all(name).iter().count(),
            hyper.headers.get_all(name).iter().count(),
            "{name} counted differently"
        );
    }
    let hyper_length = hyper
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    match weir.body {
        Framing::Length(n) => assert_eq!(Some(n), hyper_length, "body lengths differ"),
        Framing::Chunked(_) => assert!(
            hyper.headers.contains_key(http::header::TRANSFER_ENCODING),
            "weir reads chunks hyper does not"
        ),
        _ => assert!(
            hyper_length.unwrap_or(0) == 0
                && !hyper.headers.contains_key(http::header::TRANSFER_ENCODING),
            "weir reads no body, hyper does"
        ),
    }
}
