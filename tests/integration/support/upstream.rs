//! An in-test HTTP upstream: hyper's HTTP/1 server on 127.0.0.1:0 running a
//! closure per request, counting requests.
//!
//! Owns: accepting, serving keep-alive connections, the request counter, and
//! stopping every connection when dropped.
//!
//! Does not: simulate a slow or worker-bounded app server (that is weir's
//! `lab` module), TLS, or HTTP/2.
//!
//! ```ignore
//! let upstream = HttpUpstream::echo_headers().await?;
//! // body of every response: "peer: 127.0.0.1:PORT\nx-forwarded-for: ...\n..."
//! ```

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// What the handler sees of one request: head, whole body, and the peer.
#[derive(Debug)]
pub struct UpstreamRequest {
    pub head: http::request::Parts,
    pub body: Bytes,
    pub peer: SocketAddr,
}

type Handler = dyn Fn(UpstreamRequest) -> http::Response<Full<Bytes>> + Send + Sync;

/// A running upstream; all its connections end when it is dropped.
pub struct HttpUpstream {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
    accept: tokio::task::JoinHandle<()>,
}

impl HttpUpstream {
    /// Serves every request with `handler`.
    pub async fn start(
        handler: impl Fn(UpstreamRequest) -> http::Response<Full<Bytes>> + Send + Sync + 'static,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let requests = Arc::new(AtomicUsize::new(0));
        let handler: Arc<Handler> = Arc::new(handler);
        let counter = requests.clone();
        let accept = tokio::spawn(async move {
            // Dropping the set (when this task is aborted) aborts every
            // connection, so a dropped upstream really stops answering.
            let mut connections = JoinSet::new();
            while let Ok((stream, peer)) = listener.accept().await {
                let handler = handler.clone();
                let counter = counter.clone();
                let service = service_fn(move |req: http::Request<Incoming>| {
                    let handler = handler.clone();
                    let counter = counter.clone();
                    async move {
                        let (head, body) = req.into_parts();
                        // A body that fails mid-way is seen as empty; the test
                        // asserting on it will say so.
                        let body = body
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        counter.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Infallible>(handler(UpstreamRequest { head, body, peer }))
                    }
                });
                connections.spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
                // Reap finished connections so the set does not grow forever.
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(Self {
            addr,
            requests,
            accept,
        })
    }

    /// Answers 200 with the peer and every request header, one per line
    /// (`peer: ADDR`, then `name: value` in arrival order).
    pub async fn echo_headers() -> std::io::Result<Self> {
        Self::start(|req| {
            let mut body = format!("peer: {}\n", req.peer);
            for (name, value) in &req.head.headers {
                body.push_str(&format!(
                    "{}: {}\n",
                    name,
                    String::from_utf8_lossy(value.as_bytes())
                ));
            }
            http::Response::new(Full::new(Bytes::from(body)))
        })
        .await
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Requests answered so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for HttpUpstream {
    fn drop(&mut self) {
        self.accept.abort();
    }
}
