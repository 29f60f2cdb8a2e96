//! Ordinary visitors: the traffic a web app sees on a normal day, sent to a
//! target (the app itself, nginx or weir) until a deadline, every request
//! counted in a [`Tally`].
//!
//! The mix (issue 35): pages on kept-alive connections and on connections
//! of their own, a share of slow pages, paced multi-megabyte uploads, large
//! downloads read slowly, long polls, server-sent events, WebSocket
//! conversations, and HTTP/2 connections carrying many streams at once.
//! Each visitor uses a source address of its own in 127.40.0.0/13, as
//! people behind a gateway have different addresses.
//!
//! A visitor behaves as a browser does: a request on a kept-alive
//! connection that the server closed as the request was written to it (no
//! byte of an answer) is sent again on a new connection, and so is an
//! HTTP/2 request the server refused before processing it; neither is a
//! failure. Anything else that is not the whole answer is.
//!
//! It does not: decide whether a run did harm ([`super::run`] does), or
//! speak TLS.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rand::RngExt;
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::tally::{Kind, Outcome, Tally};

/// Rates and sizes of the ordinary mix.
#[derive(Debug, Clone)]
pub struct Mix {
    /// Kept-alive connections loading pages, and their pages a second together.
    pub keepalive_connections: usize,
    pub keepalive_per_sec: f64,
    /// Pages a second, each on a new connection.
    pub fresh_per_sec: f64,
    /// The share of kept-alive pages that are slow pages.
    pub slow_share: f64,
    /// Uploads a second, their size and how long each takes to send.
    pub uploads_per_sec: f64,
    pub upload_bytes: (u64, u64),
    pub upload_secs: (f64, f64),
    /// Downloads a second, their size, and how fast they are read.
    pub downloads_per_sec: f64,
    pub download_bytes: u64,
    pub download_bytes_per_sec: u64,
    /// Visitors each holding a long poll open, one after another.
    pub long_polls: usize,
    /// Visitors each reading a server-sent-events stream, one after another,
    /// and the events a stream carries whole.
    pub event_streams: usize,
    pub events_per_stream: u32,
    /// Visitors each holding WebSocket conversations, one after another:
    /// `ws_messages` echoed messages, `ws_every` apart.
    pub websockets: usize,
    pub ws_messages: u32,
    pub ws_every: Duration,
    /// HTTP/2 connections, and the streams each opens at once, `h2_bursts_per_sec` times a second.
    pub h2_connections: usize,
    pub h2_streams: usize,
    pub h2_bursts_per_sec: f64,
    /// How long a visitor waits for an answer before giving up.
    pub patience: Duration,
}

impl Default for Mix {
    /// Issue 35's mix: about 200 requests a second (130 kept-alive pages, 7%
    /// of them slow, 40 fresh, 20 HTTP/2 streams), an upload of 2-5 MB over
    /// 5-10 s every two seconds, a 4 MB download read at 1 MB/s every three,
    /// four long polls, four event streams and four WebSockets at a time.
    fn default() -> Self {
        Mix {
            keepalive_connections: 8,
            keepalive_per_sec: 130.0,
            fresh_per_sec: 40.0,
            slow_share: 0.07,
            uploads_per_sec: 0.5,
            upload_bytes: (2 << 20, 5 << 20),
            upload_secs: (5.0, 10.0),
            downloads_per_sec: 0.33,
            download_bytes: 4 << 20,
            download_bytes_per_sec: 1 << 20,
            long_polls: 4,
            event_streams: 4,
            events_per_stream: 20,
            websockets: 4,
            ws_messages: 10,
            ws_every: Duration::from_millis(200),
            h2_connections: 2,
            h2_streams: 10,
            h2_bursts_per_sec: 1.0,
            patience: Duration::from_secs(30),
        }
    }
}

impl Mix {
    /// The traffic issue 35 measured restarts with: pages (kept-alive and
    /// fresh, 7% slow) and paced uploads, nothing held open.
    pub fn pages_and_uploads() -> Mix {
        Mix {
            keepalive_per_sec: 150.0,
            fresh_per_sec: 50.0,
            downloads_per_sec: 0.0,
            long_polls: 0,
            event_streams: 0,
            websockets: 0,
            h2_connections: 0,
            ..Mix::default()
        }
    }

    /// The mix at `share` of its rates and sizes (at least one of each
    /// visitor that holds something open), with uploads and downloads over
    /// `share` of their time too: for a short run in CI.
    pub fn scaled(share: f64) -> Mix {
        let d = Mix::default();
        let n = |v: usize| ((v as f64 * share).round() as usize).max(1);
        Mix {
            keepalive_connections: n(d.keepalive_connections),
            keepalive_per_sec: d.keepalive_per_sec * share,
            fresh_per_sec: d.fresh_per_sec * share,
            uploads_per_sec: d.uploads_per_sec * share.sqrt(),
            upload_secs: (
                d.upload_secs.0 * share.sqrt(),
                d.upload_secs.1 * share.sqrt(),
            ),
            downloads_per_sec: d.downloads_per_sec * share.sqrt(),
            long_polls: n(d.long_polls),
            event_streams: n(d.event_streams),
            websockets: n(d.websockets),
            h2_connections: n(d.h2_connections),
            ..d
        }
    }
}

/// Where the visitors go: HTTP/1.1 (and WebSockets) to `http1`, HTTP/2 with
/// prior knowledge to `h2` (the same address for weir and the app; nginx
/// speaks h2c on a listener of its own).
#[derive(Debug, Clone, Copy)]
pub struct Target {
    pub http1: SocketAddr,
    pub h2: SocketAddr,
}

/// Sends the mix to `target` until `until`, then lets every visitor finish
/// what it began. Returns when all have.
pub async fn run(mix: &Mix, target: Target, until: Instant, tally: Arc<Tally>) {
    let mut visitors = JoinSet::new();
    let ctx = Arc::new(Ctx {
        mix: mix.clone(),
        target,
        until,
        tally,
    });
    for i in 0..mix.keepalive_connections {
        visitors.spawn(keepalive_pages(ctx.clone(), i));
    }
    visitors.spawn(spawner(ctx.clone(), mix.fresh_per_sec, fresh_page));
    visitors.spawn(spawner(ctx.clone(), mix.uploads_per_sec, upload));
    visitors.spawn(spawner(ctx.clone(), mix.downloads_per_sec, download));
    for i in 0..mix.long_polls {
        visitors.spawn(long_polls(ctx.clone(), i));
    }
    for i in 0..mix.event_streams {
        visitors.spawn(event_streams(ctx.clone(), i));
    }
    for i in 0..mix.websockets {
        visitors.spawn(websockets(ctx.clone(), i));
    }
    for i in 0..mix.h2_connections {
        visitors.spawn(h2_visitor(ctx.clone(), i));
    }
    while visitors.join_next().await.is_some() {}
}

struct Ctx {
    mix: Mix,
    target: Target,
    until: Instant,
    tally: Arc<Tally>,
}

impl Ctx {
    fn running(&self) -> bool {
        Instant::now() < self.until
    }

    fn record(&self, kind: Kind, outcome: Outcome, started: Instant) {
        self.tally.record(kind, outcome, started.elapsed());
    }
}

/// A visitor's own source address: `group` names the kind of visitor.
fn source(group: u8, n: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 40 + group, (n / 250 % 250) as u8, (n % 250) as u8 + 1)
}

async fn connect(from: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from.into(), 0))?;
    let stream = socket.connect(to).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// How a failed connect is counted.
fn connect_failure(e: &std::io::Error) -> Outcome {
    if e.kind() == std::io::ErrorKind::ConnectionRefused {
        Outcome::Refused
    } else {
        Outcome::Failed {
            what: format!("connect: {e}"),
        }
    }
}

type Sender = hyper::client::conn::http1::SendRequest<http_body_util::Full<Bytes>>;

async fn handshake(stream: TcpStream) -> Result<Sender, String> {
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    Ok(sender)
}

fn get(path: &str) -> Request<http_body_util::Full<Bytes>> {
    Request::get(path)
        .header(http::header::HOST, "app.example")
        .body(http_body_util::Full::new(Bytes::new()))
        .expect("a literal request")
}

/// How a response that arrived is counted, its body read whole.
async fn answered(resp: Response<Incoming>) -> Outcome {
    let status = resp.status();
    let by_weir = resp.headers().contains_key("x-weir-reason");
    let body = resp.into_body().collect().await;
    match (status, body) {
        (StatusCode::OK, Ok(_)) => Outcome::Ok,
        (StatusCode::OK, Err(e)) => Outcome::Failed {
            what: format!("body cut: {e}"),
        },
        (s, _) => Outcome::Status {
            status: s.as_u16(),
            by_weir,
        },
    }
}

/// Sleeps until `at`, unless the run ends first; false when it did.
async fn wait_until(ctx: &Ctx, at: Instant) -> bool {
    tokio::time::sleep_until(at.min(ctx.until)).await;
    ctx.running()
}

/// One kept-alive connection's visitor, loading pages (some slow) at its
/// share of the rate; a closed connection is opened again.
async fn keepalive_pages(ctx: Arc<Ctx>, i: usize) {
    let m = &ctx.mix;
    let every = Duration::from_secs_f64(m.keepalive_connections as f64 / m.keepalive_per_sec);
    let from = source(0, i);
    let mut sender: Option<Sender> = None;
    let mut next = Instant::now() + every.mul_f64(rand::rng().random::<f64>());
    let mut n = 0usize;
    while wait_until(&ctx, next).await {
        next += every;
        n += 1;
        let slow = rand::rng().random::<f64>() < m.slow_share;
        let (kind, path) = if slow {
            (Kind::SlowPage, format!("/slow/{i}-{n}"))
        } else {
            (Kind::Page, format!("/page/{i}-{n}"))
        };
        let started = Instant::now();
        let outcome = kept_alive_get(&ctx, &mut sender, from, &path).await;
        ctx.record(kind, outcome, started);
    }
}

/// A GET on the kept-alive connection in `sender` (opened when there is
/// none or it closed), sent again once on a new connection when a reused
/// one closed under it unanswered.
async fn kept_alive_get(
    ctx: &Ctx,
    sender: &mut Option<Sender>,
    from: Ipv4Addr,
    path: &str,
) -> Outcome {
    for attempt in 0..2 {
        let usable = match sender.as_mut() {
            Some(s) => !s.is_closed() && s.ready().await.is_ok(),
            None => false,
        };
        if !usable {
            let stream = match connect(from, ctx.target.http1).await {
                Ok(s) => s,
                Err(e) => return connect_failure(&e),
            };
            match handshake(stream).await {
                Ok(s) => *sender = Some(s),
                Err(what) => return Outcome::Failed { what },
            }
        }
        let reused = usable;
        let s = sender.as_mut().expect("set above");
        let sent = tokio::time::timeout(ctx.mix.patience, s.send_request(get(path))).await;
        match sent {
            Err(_) => {
                *sender = None;
                return Outcome::TimedOut;
            }
            Ok(Ok(resp)) => {
                let outcome = answered(resp).await;
                if !matches!(outcome, Outcome::Ok) {
                    *sender = None;
                }
                return outcome;
            }
            Ok(Err(e)) => {
                *sender = None;
                if reused && attempt == 0 && (e.is_incomplete_message() || e.is_canceled()) {
                    ctx.tally.retried_idle_close();
                    continue;
                }
                return Outcome::Failed {
                    what: format!("kept-alive request: {e}"),
                };
            }
        }
    }
    Outcome::Failed {
        what: "closed unanswered twice".into(),
    }
}

/// Starts `visit` about `per_sec` times a second (spaced at random, as
/// independent visitors arrive) until the run ends; each runs on its own.
async fn spawner<F, Fut>(ctx: Arc<Ctx>, per_sec: f64, visit: F)
where
    F: Fn(Arc<Ctx>, usize) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    if per_sec <= 0.0 {
        return;
    }
    let mut running = JoinSet::new();
    let mut next = Instant::now();
    let mut n = 0usize;
    loop {
        // Exponential gaps: a Poisson stream of arrivals.
        let u: f64 = rand::rng().random_range(1e-9..1.0);
        next += Duration::from_secs_f64(-u.ln() / per_sec);
        if !wait_until(&ctx, next).await {
            break;
        }
        running.spawn(visit(ctx.clone(), n));
        n += 1;
        while running.try_join_next().is_some() {}
    }
    while running.join_next().await.is_some() {}
}

/// A page on a connection of its own.
async fn fresh_page(ctx: Arc<Ctx>, n: usize) {
    let started = Instant::now();
    let outcome = match connect(source(1, n % 2000), ctx.target.http1).await {
        Err(e) => connect_failure(&e),
        Ok(stream) => match handshake(stream).await {
            Err(what) => Outcome::Failed { what },
            Ok(mut s) => {
                let mut req = get(&format!("/page/fresh-{n}"));
                req.headers_mut()
                    .insert(http::header::CONNECTION, "close".parse().expect("literal"));
                match tokio::time::timeout(ctx.mix.patience, s.send_request(req)).await {
                    Err(_) => Outcome::TimedOut,
                    Ok(Ok(resp)) => answered(resp).await,
                    Ok(Err(e)) => Outcome::Failed {
                        what: format!("fresh connection: {e}"),
                    },
                }
            }
        },
    };
    ctx.record(Kind::FreshPage, outcome, started);
}

/// A paced upload: the app must answer with the length sent.
async fn upload(ctx: Arc<Ctx>, n: usize) {
    let m = &ctx.mix;
    let (bytes, secs) = {
        let mut rng = rand::rng();
        let b = rng.random_range(m.upload_bytes.0..=m.upload_bytes.1);
        let s = rng.random_range(m.upload_secs.0..=m.upload_secs.1);
        (b, s)
    };
    let started = Instant::now();
    let outcome = upload_once(&ctx, source(2, n % 500), bytes, secs).await;
    ctx.record(Kind::Upload, outcome, started);
}

async fn upload_once(ctx: &Ctx, from: Ipv4Addr, bytes: u64, secs: f64) -> Outcome {
    const CHUNK: u64 = 64 * 1024;
    let stream = match connect(from, ctx.target.http1).await {
        Ok(s) => s,
        Err(e) => return connect_failure(&e),
    };
    let (mut sender, conn) =
        match hyper::client::conn::http1::handshake::<_, UploadBody>(TokioIo::new(stream)).await {
            Ok(pair) => pair,
            Err(e) => {
                return Outcome::Failed {
                    what: format!("handshake: {e}"),
                };
            }
        };
    tokio::spawn(conn);
    let chunks = bytes.div_ceil(CHUNK);
    let gap = Duration::from_secs_f64(secs / chunks as f64);
    let paced = futures_util::stream::unfold(0u64, move |sent| async move {
        if sent >= bytes {
            return None;
        }
        let n = (bytes - sent).min(CHUNK);
        if sent > 0 {
            tokio::time::sleep(gap).await;
        }
        let frame = Frame::data(Bytes::from(vec![b'u'; n as usize]));
        Some((Ok::<_, std::convert::Infallible>(frame), sent + n))
    });
    let body: UploadBody = BodyExt::boxed(http_body_util::StreamBody::new(paced));
    let req = Request::post("/upload")
        .header(http::header::HOST, "app.example")
        .header(http::header::CONTENT_LENGTH, bytes)
        .body(body)
        .expect("a literal request");
    let patience = ctx.mix.patience + Duration::from_secs_f64(secs);
    match tokio::time::timeout(patience, sender.send_request(req)).await {
        Err(_) => Outcome::TimedOut,
        Ok(Err(e)) => Outcome::Failed {
            what: format!("upload cut: {e}"),
        },
        Ok(Ok(resp)) if resp.status() == StatusCode::OK => {
            match resp.into_body().collect().await.map(|b| b.to_bytes()) {
                Ok(b) if b.trim_ascii() == bytes.to_string().as_bytes() => Outcome::Ok,
                Ok(b) => Outcome::Failed {
                    what: format!("the app read {b:?} of {bytes} bytes"),
                },
                Err(e) => Outcome::Failed {
                    what: format!("upload answer cut: {e}"),
                },
            }
        }
        Ok(Ok(resp)) => Outcome::Status {
            status: resp.status().as_u16(),
            by_weir: resp.headers().contains_key("x-weir-reason"),
        },
    }
}

type UploadBody = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

/// A GET of `path` on a connection of its own; the body of its `200` to
/// read, or how the visit ended without one.
async fn fresh_get(ctx: &Ctx, from: Ipv4Addr, path: &str) -> Result<Incoming, Outcome> {
    let stream = connect(from, ctx.target.http1)
        .await
        .map_err(|e| connect_failure(&e))?;
    let mut sender = handshake(stream)
        .await
        .map_err(|what| Outcome::Failed { what })?;
    let resp = match tokio::time::timeout(ctx.mix.patience, sender.send_request(get(path))).await {
        Err(_) => return Err(Outcome::TimedOut),
        Ok(Err(e)) => {
            return Err(Outcome::Failed {
                what: format!("{path}: {e}"),
            });
        }
        Ok(Ok(r)) => r,
    };
    if resp.status() != StatusCode::OK {
        return Err(Outcome::Status {
            status: resp.status().as_u16(),
            by_weir: resp.headers().contains_key("x-weir-reason"),
        });
    }
    Ok(resp.into_body())
}

/// A large download, read no faster than the visitor's line.
async fn download(ctx: Arc<Ctx>, n: usize) {
    let started = Instant::now();
    let outcome = download_once(&ctx, source(3, n % 500)).await;
    ctx.record(Kind::Download, outcome, started);
}

async fn download_once(ctx: &Ctx, from: Ipv4Addr) -> Outcome {
    let m = &ctx.mix;
    let path = format!("/download?bytes={}", m.download_bytes);
    let mut body = match fresh_get(ctx, from, &path).await {
        Ok(body) => body,
        Err(outcome) => return outcome,
    };
    let began = Instant::now();
    let mut read = 0u64;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => read += f.data_ref().map_or(0, |d| d.len() as u64),
            Err(e) => {
                return Outcome::Failed {
                    what: format!("download cut after {read} bytes: {e}"),
                };
            }
        }
        // Read no faster than the line: the rest waits in the sockets.
        let due = Duration::from_secs_f64(read as f64 / m.download_bytes_per_sec as f64);
        tokio::time::sleep_until(began + due).await;
    }
    if read == m.download_bytes {
        Outcome::Ok
    } else {
        Outcome::Failed {
            what: format!("download of {read} of {} bytes", m.download_bytes),
        }
    }
}

/// One visitor's long polls, one after another on a kept-alive connection.
async fn long_polls(ctx: Arc<Ctx>, i: usize) {
    let from = source(4, i);
    let mut sender = None;
    while ctx.running() {
        let started = Instant::now();
        let outcome = kept_alive_get(&ctx, &mut sender, from, "/poll").await;
        record_and_pause(&ctx, Kind::LongPoll, outcome, started).await;
    }
}

/// One visitor's event streams, each read to its end.
async fn event_streams(ctx: Arc<Ctx>, i: usize) {
    let from = source(5, i);
    while ctx.running() {
        let started = Instant::now();
        let outcome = events_once(&ctx, from).await;
        record_and_pause(&ctx, Kind::Events, outcome, started).await;
    }
}

/// Counts a visit of a visitor who comes back at once; after a failed one
/// it waits a moment first, as a page's script would.
async fn record_and_pause(ctx: &Ctx, kind: Kind, outcome: Outcome, started: Instant) {
    let failed = !matches!(outcome, Outcome::Ok);
    ctx.record(kind, outcome, started);
    if failed {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn events_once(ctx: &Ctx, from: Ipv4Addr) -> Outcome {
    let mut body = match fresh_get(ctx, from, "/events").await {
        Ok(body) => body,
        Err(outcome) => return outcome,
    };
    let mut text = Vec::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => text.extend_from_slice(f.data_ref().map_or(&[][..], |d| d)),
            Err(e) => {
                return Outcome::Failed {
                    what: format!("event stream cut: {e}"),
                };
            }
        }
    }
    let events = text.windows(6).filter(|w| w == b"data: ").count();
    if events as u32 == ctx.mix.events_per_stream {
        Outcome::Ok
    } else {
        Outcome::Failed {
            what: format!("{events} of {} events", ctx.mix.events_per_stream),
        }
    }
}

/// One visitor's WebSocket conversations, one after another.
async fn websockets(ctx: Arc<Ctx>, i: usize) {
    let from = source(6, i);
    while ctx.running() {
        let started = Instant::now();
        let outcome = websocket_once(&ctx, from).await;
        record_and_pause(&ctx, Kind::WebSocket, outcome, started).await;
    }
}

async fn websocket_once(ctx: &Ctx, from: Ipv4Addr) -> Outcome {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::{Error, Message};
    let stream = match connect(from, ctx.target.http1).await {
        Ok(s) => s,
        Err(e) => return connect_failure(&e),
    };
    let url = format!("ws://{}/ws", ctx.target.http1);
    let handshake = tokio_tungstenite::client_async(url, stream);
    let mut ws = match tokio::time::timeout(ctx.mix.patience, handshake).await {
        Err(_) => return Outcome::TimedOut,
        Ok(Err(Error::Http(resp))) => {
            return Outcome::Status {
                status: resp.status().as_u16(),
                by_weir: resp.headers().contains_key("x-weir-reason"),
            };
        }
        Ok(Err(e)) => {
            return Outcome::Failed {
                what: format!("websocket handshake: {e}"),
            };
        }
        Ok(Ok((ws, _))) => ws,
    };
    for k in 0..ctx.mix.ws_messages {
        let said = format!("message {k}");
        if let Err(e) = ws.send(Message::text(said.clone())).await {
            return Outcome::Failed {
                what: format!("websocket send: {e}"),
            };
        }
        match tokio::time::timeout(ctx.mix.patience, ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) if t.as_str() == said => {}
            other => {
                return Outcome::Failed {
                    what: format!("websocket echo {k}: {other:?}"),
                };
            }
        }
        tokio::time::sleep(ctx.mix.ws_every).await;
    }
    let _ = ws.close(None).await;
    Outcome::Ok
}

/// One HTTP/2 connection's visitor: bursts of streams at once.
async fn h2_visitor(ctx: Arc<Ctx>, i: usize) {
    let m = &ctx.mix;
    let from = source(7, i);
    let every = Duration::from_secs_f64(1.0 / m.h2_bursts_per_sec);
    let mut next = Instant::now() + every.mul_f64(rand::rng().random::<f64>());
    let mut sender: Option<H2Sender> = None;
    let mut n = 0usize;
    while wait_until(&ctx, next).await {
        next += every;
        let mut burst = JoinSet::new();
        for _ in 0..m.h2_streams {
            n += 1;
            let path = format!("/page/h2-{i}-{n}");
            let s = match h2_sender(&ctx, &mut sender, from).await {
                Ok(s) => s,
                Err(outcome) => {
                    ctx.record(Kind::H2Stream, outcome, Instant::now());
                    continue;
                }
            };
            let ctx = ctx.clone();
            burst.spawn(async move {
                let started = Instant::now();
                let outcome = h2_get(&ctx, s, from, &path).await;
                ctx.record(Kind::H2Stream, outcome, started);
            });
        }
        while burst.join_next().await.is_some() {}
    }
}

type H2Sender = hyper::client::conn::http2::SendRequest<Empty<Bytes>>;

/// The visitor's HTTP/2 connection, opened again when it closed.
async fn h2_sender(
    ctx: &Ctx,
    sender: &mut Option<H2Sender>,
    from: Ipv4Addr,
) -> Result<H2Sender, Outcome> {
    if let Some(s) = sender
        && !s.is_closed()
        && s.ready().await.is_ok()
    {
        return Ok(s.clone());
    }
    let stream = connect(from, ctx.target.h2)
        .await
        .map_err(|e| connect_failure(&e))?;
    let (s, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(|e| Outcome::Failed {
                what: format!("h2 handshake: {e}"),
            })?;
    tokio::spawn(conn);
    *sender = Some(s.clone());
    Ok(s)
}

/// One stream; a stream the server refused unprocessed (GOAWAY past it,
/// REFUSED_STREAM) is sent again once on a new connection, as browsers do.
async fn h2_get(ctx: &Ctx, mut s: H2Sender, from: Ipv4Addr, path: &str) -> Outcome {
    let req = || {
        Request::get(format!("http://app.example{path}"))
            .version(http::Version::HTTP_2)
            .body(Empty::<Bytes>::new())
            .expect("a literal request")
    };
    for attempt in 0..2 {
        match tokio::time::timeout(ctx.mix.patience, s.send_request(req())).await {
            Err(_) => return Outcome::TimedOut,
            Ok(Ok(resp)) => return answered(resp).await,
            Ok(Err(e)) if attempt == 0 && unprocessed(&e) => {
                ctx.tally.retried_idle_close();
                let mut fresh = None;
                s = match h2_sender(ctx, &mut fresh, from).await {
                    Ok(s) => s,
                    Err(outcome) => return outcome,
                };
            }
            Ok(Err(e)) => {
                return Outcome::Failed {
                    what: format!("h2 stream: {e}"),
                };
            }
        }
    }
    Outcome::Failed {
        what: "h2 stream refused twice".into(),
    }
}

/// Whether an HTTP/2 request failed before the server processed it.
fn unprocessed(e: &hyper::Error) -> bool {
    if e.is_canceled() || e.is_closed() {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(h2) = s.downcast_ref::<h2::Error>() {
            return h2.reason() == Some(h2::Reason::REFUSED_STREAM) || h2.is_go_away();
        }
        source = s.source();
    }
    false
}
