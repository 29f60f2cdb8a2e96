//! The app behind the harmlessness runs: a web app with room to spare, which
//! serves everything ordinary visitors ask for.
//!
//! It owns a real server on loopback (hyper, HTTP/1.1 with upgrades and h2c
//! with prior knowledge, so it can be reached directly as well as through a
//! gateway) and these endpoints:
//!
//! | path | what | holds a worker |
//! |---|---|---|
//! | `/page/..`, `/limited/..` | a 2 KB page after `page` | yes |
//! | `/slow/..` | a page after `slow` (a search, a report) | yes |
//! | `POST /upload` | reads the whole body, answers its length | only after the body |
//! | `/download?bytes=N` | N bytes, streamed with a known length | no |
//! | `/poll` | a long poll: answers after `poll` | no |
//! | `/events` | server-sent events: `events` of them, one every `event_every` | no |
//! | `/ws` | a WebSocket that echoes every message | no |
//! | `/healthz` | `ok` | no |
//!
//! Pages take one of `workers` workers; `backlog` more wait for one, first
//! come first served; past that a request is refused by closing its
//! connection without an answer (php-fpm past `listen.backlog`). The
//! defaults leave ordinary traffic most of the workers free: a gateway that
//! fails or delays a request in front of it did so on its own.
//!
//! It does not: speak TLS, time out anything, or limit anything per client.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};

/// The app's shape and its service times.
#[derive(Debug, Clone)]
pub struct OrdinaryAppConfig {
    pub workers: usize,
    pub backlog: usize,
    /// A page's service time.
    pub page: Duration,
    /// A slow page's service time.
    pub slow: Duration,
    /// How long a long poll is held before its answer.
    pub poll: Duration,
    /// Events in one server-sent-events stream, and the time between them.
    pub events: u32,
    pub event_every: Duration,
}

impl Default for OrdinaryAppConfig {
    /// Issue 35's app: 16 workers, a 64-deep backlog, 2 ms pages, 300 ms
    /// slow pages, 3 s long polls, 20 events 250 ms apart.
    fn default() -> Self {
        OrdinaryAppConfig {
            workers: 16,
            backlog: 64,
            page: Duration::from_millis(2),
            slow: Duration::from_millis(300),
            poll: Duration::from_secs(3),
            events: 20,
            event_every: Duration::from_millis(250),
        }
    }
}

/// What the app saw.
#[derive(Debug, Default)]
pub struct AppCounters {
    /// Requests answered (any endpoint).
    pub answered: AtomicU64,
    /// Requests refused: every worker busy and the backlog full.
    pub refused: AtomicU64,
    /// Most workers busy at once.
    pub max_busy: AtomicUsize,
    /// Most requests waiting for a worker at once.
    pub max_waiting: AtomicUsize,
    /// Upload bytes read.
    pub upload_bytes: AtomicU64,
    busy: AtomicUsize,
    waiting: AtomicUsize,
}

struct Shared {
    cfg: OrdinaryAppConfig,
    workers: Semaphore,
    counters: Arc<AppCounters>,
}

/// A running app; stops (every connection reset) when dropped.
pub struct OrdinaryApp {
    addr: SocketAddr,
    counters: Arc<AppCounters>,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl OrdinaryApp {
    /// Binds `bind` (port 0 for any) and serves. Must run inside a tokio runtime.
    pub fn start(cfg: OrdinaryAppConfig, bind: SocketAddr) -> io::Result<OrdinaryApp> {
        let listener = listen(bind)?;
        let addr = listener.local_addr()?;
        let counters = Arc::new(AppCounters::default());
        let shared = Arc::new(Shared {
            workers: Semaphore::new(cfg.workers),
            cfg,
            counters: counters.clone(),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(OrdinaryApp {
            addr,
            counters,
            shared,
            accept,
        })
    }

    /// A deploy of the app: every connection is reset (requests in flight
    /// get no answer), nothing listens for `down`, then the app serves
    /// again on the same address, as fast as before.
    pub async fn restart(&mut self, down: Duration) -> io::Result<()> {
        self.accept.abort();
        let _ = (&mut self.accept).await;
        tokio::time::sleep(down).await;
        let listener = listen(self.addr)?;
        self.accept = tokio::spawn(accept_loop(listener, self.shared.clone()));
        Ok(())
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn counters(&self) -> &AppCounters {
        &self.counters
    }
}

impl Drop for OrdinaryApp {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

fn listen(bind: SocketAddr) -> io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(bind)?;
    // Large: refusals come from the backlog of workers, never the kernel's.
    socket.listen(4096)
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    // Dropped with the task: every connection ends with the app.
    let mut connections = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        connections.spawn(async move {
            let service = service_fn(move |req| handle(shared.clone(), req));
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let _ = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .await;
        });
        while connections.try_join_next().is_some() {}
    }
}

type AppBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// The app's refusal: the connection is closed without an answer.
#[derive(Debug, thiserror::Error)]
#[error("refused: every worker busy and the backlog full")]
struct Refused;

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<AppBody>, Refused> {
    let cfg = &shared.cfg;
    let path = req.uri().path().to_owned();
    let resp = if path.starts_with("/page/") || path.starts_with("/limited/") {
        work(&shared, cfg.page).await?;
        text(StatusCode::OK, PAGE.clone())
    } else if path.starts_with("/slow/") {
        work(&shared, cfg.slow).await?;
        text(StatusCode::OK, PAGE.clone())
    } else if path == "/upload" && req.method() == Method::POST {
        upload(&shared, req).await?
    } else if path == "/download" {
        let bytes = query_number(req.uri().query(), "bytes").unwrap_or(1 << 20);
        let mut resp = Response::new(Zeros { left: bytes }.boxed());
        resp.headers_mut()
            .insert(header::CONTENT_LENGTH, bytes.into());
        resp
    } else if path == "/poll" {
        tokio::time::sleep(cfg.poll).await;
        text(StatusCode::OK, Bytes::from_static(b"poll\n"))
    } else if path == "/events" {
        events(cfg.events, cfg.event_every)
    } else if path == "/ws" {
        websocket(req)
    } else if path == "/healthz" {
        text(StatusCode::OK, Bytes::from_static(b"ok\n"))
    } else {
        text(StatusCode::NOT_FOUND, Bytes::from_static(b"no such page\n"))
    };
    shared.counters.answered.fetch_add(1, Ordering::Relaxed);
    Ok(resp)
}

/// A 2 KB page.
static PAGE: std::sync::LazyLock<Bytes> =
    std::sync::LazyLock::new(|| Bytes::from(format!("<html>{}</html>\n", "p".repeat(2036))));

fn text(status: StatusCode, body: Bytes) -> Response<AppBody> {
    let mut resp = Response::new(Full::new(body).boxed());
    *resp.status_mut() = status;
    resp
}

/// Holds a worker for `service`, waiting for one in the backlog if all are
/// busy, or refuses when the backlog is full too.
async fn work(shared: &Shared, service: Duration) -> Result<(), Refused> {
    let c = &shared.counters;
    let permit = match shared.workers.try_acquire() {
        Ok(p) => p,
        Err(_) => {
            let waiting = c.waiting.fetch_add(1, Ordering::Relaxed) + 1;
            if waiting > shared.cfg.backlog {
                c.waiting.fetch_sub(1, Ordering::Relaxed);
                c.refused.fetch_add(1, Ordering::Relaxed);
                return Err(Refused);
            }
            c.max_waiting.fetch_max(waiting, Ordering::Relaxed);
            let permit = shared.workers.acquire().await;
            c.waiting.fetch_sub(1, Ordering::Relaxed);
            permit.map_err(|_| Refused)?
        }
    };
    let busy = c.busy.fetch_add(1, Ordering::Relaxed) + 1;
    c.max_busy.fetch_max(busy, Ordering::Relaxed);
    tokio::time::sleep(service).await;
    c.busy.fetch_sub(1, Ordering::Relaxed);
    drop(permit);
    Ok(())
}

/// Reads the whole body (no worker: an async app's reactor does), then
/// takes a worker for a page's time; answers the byte count.
async fn upload(shared: &Shared, req: Request<Incoming>) -> Result<Response<AppBody>, Refused> {
    let mut body = req.into_body();
    let mut read: u64 = 0;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => read += f.data_ref().map_or(0, |d| d.len() as u64),
            // The upload was cut: there is no one to answer.
            Err(_) => return Err(Refused),
        }
    }
    shared
        .counters
        .upload_bytes
        .fetch_add(read, Ordering::Relaxed);
    work(shared, shared.cfg.page).await?;
    Ok(text(StatusCode::OK, Bytes::from(format!("{read}\n"))))
}

fn query_number(query: Option<&str>, key: &str) -> Option<u64> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.parse().ok())
}

/// `left` zero bytes, 64 KB a frame.
struct Zeros {
    left: u64,
}

static ZEROS: Bytes = Bytes::from_static(&[0u8; 64 * 1024]);

impl Body for Zeros {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let n = self.left.min(ZEROS.len() as u64);
        self.left -= n;
        Poll::Ready(Some(Ok(Frame::data(ZEROS.slice(..n as usize)))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.left)
    }
}

/// A server-sent-events stream of `n` events, `every` apart.
fn events(n: u32, every: Duration) -> Response<AppBody> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
    tokio::spawn(async move {
        for i in 0..n {
            let event = Bytes::from(format!("id: {i}\ndata: tick {i}\n\n"));
            if tx.send(Ok(Frame::data(event))).await.is_err() {
                return;
            }
            tokio::time::sleep(every).await;
        }
    });
    let body = http_body_util::StreamBody::new(tokio_stream_from(rx));
    let mut resp = Response::new(body.boxed());
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, "text/event-stream".parse().unwrap());
    h.insert(header::CACHE_CONTROL, "no-cache".parse().unwrap());
    // nginx would otherwise hold the events back in its buffers.
    h.insert("x-accel-buffering", "no".parse().unwrap());
    resp
}

/// A receiver as a stream (tokio's own wrapper lives in tokio-stream).
fn tokio_stream_from<T>(
    rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_core::Stream<Item = T> + Send + 'static
where
    T: Send + 'static,
{
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) })
}

/// Accepts a WebSocket and echoes every text and binary message.
fn websocket(mut req: Request<Incoming>) -> Response<AppBody> {
    use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
    use tokio_tungstenite::tungstenite::protocol::Role;
    let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY) else {
        return text(
            StatusCode::BAD_REQUEST,
            Bytes::from_static(b"not a websocket\n"),
        );
    };
    let accept = derive_accept_key(key.as_bytes());
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        use futures_util::{SinkExt, StreamExt};
        let Ok(upgraded) = upgrade.await else {
            return;
        };
        let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            TokioIo::new(upgraded),
            Role::Server,
            None,
        )
        .await;
        while let Some(Ok(msg)) = ws.next().await {
            if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
                return;
            }
        }
    });
    let mut resp = Response::new(Full::new(Bytes::new()).boxed());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::CONNECTION, "upgrade".parse().unwrap());
    h.insert(header::UPGRADE, "websocket".parse().unwrap());
    h.insert(header::SEC_WEBSOCKET_ACCEPT, accept.parse().unwrap());
    resp
}
