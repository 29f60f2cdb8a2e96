//! Accept loops and the life of one client connection.
//!
//! For each accepted socket: admit it (caps), read a PROXY header if the
//! listener expects one, complete the TLS handshake, then let hyper serve
//! HTTP/1.1 or HTTP/2 until the client leaves or the tracker commands the
//! connection to close (idle, slow headers, shedding, drain).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::conn::{Command, ConnGuard, Refusal};
use super::io::TrackedIo;
use super::proxy_protocol;
use crate::gateway::{EdgeSettings, ListenerSpec};
use crate::identity::PeerAddr;
use crate::proxy::{self, ConnCtx};
use crate::runtime::Runtime;

/// Polls a hyper connection until it ends, obeying tracker commands:
/// `Graceful` lets the request in flight finish, `Abort` drops the connection.
macro_rules! drive {
    ($conn:expr, $state:expr) => {{
        let conn = $conn;
        tokio::pin!(conn);
        let mut graceful = false;
        // A connection told to close before its first request started may
        // already hold that request unread: closing it now would drop a
        // request the client sent. Such a close is deferred until the first
        // request starts (hyper then closes after answering it) or
        // `FIRST_REQUEST_GRACE` passes.
        let mut deferred: Option<tokio::time::Instant> = None;
        loop {
            let wanted = if graceful || deferred.is_some() {
                Command::Abort
            } else {
                Command::Graceful
            };
            tokio::select! {
                res = conn.as_mut() => break res.map_err(Into::into),
                cmd = $state.wait_for(wanted) => {
                    if cmd == Command::Abort {
                        break Ok(());
                    }
                    if $state.requests() == 0 {
                        deferred = Some(tokio::time::Instant::now() + FIRST_REQUEST_GRACE);
                    } else {
                        graceful = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
                _ = tokio::time::sleep(std::time::Duration::from_millis(10)), if deferred.is_some() => {
                    if $state.requests() > 0 || deferred.is_some_and(|d| tokio::time::Instant::now() >= d) {
                        deferred = None;
                        graceful = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
        }
    }};
}

/// How long a connection asked to close may still bring its first request.
const FIRST_REQUEST_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Accepts connections on `listener` until `stop` turns true.
pub async fn accept_loop(
    listener: TcpListener,
    index: usize,
    spec: ListenerSpec,
    rt: Arc<Runtime>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            biased;
            _ = crate::server::stopped(&mut stop) => break,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // EMFILE/ENFILE: out of descriptors. Back off briefly instead of
                // spinning; the connection stays in the backlog until then.
                rt.metrics.refused("accept_error");
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let peer = PeerAddr(peer);
        let gw = rt.gateway.load();
        let peer_trusted = gw.trusted.contains(peer.ip());
        // A trusted proxy's connections carry many clients: they are capped by
        // their PROXY source (below) and by request-level limits instead.
        let cap_ip = (!peer_trusted).then(|| peer.ip());
        let guard = match rt.tracker.try_open(cap_ip) {
            Ok(g) => g,
            Err(refusal) => {
                refuse(stream, refusal, spec.tls.is_none(), &rt);
                continue;
            }
        };
        rt.metrics.connections_accepted.inc();
        let spec = gw
            .listeners
            .get(index)
            .filter(|l| l.address == spec.address)
            .cloned()
            .unwrap_or_else(|| spec.clone());
        let edge = gw.edge;
        drop(gw);
        let rt = rt.clone();
        tokio::spawn(async move {
            serve_connection(stream, peer, peer_trusted, spec, edge, guard, rt).await;
        });
    }
}

/// Answers a refused connection as cheaply as possible and closes it.
fn refuse(stream: TcpStream, refusal: Refusal, plain: bool, rt: &Runtime) {
    rt.metrics.refused(refusal.as_str());
    if plain {
        // Best effort, never waits: a 503 the client can read, then close.
        let _ = stream.try_write(
            b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
    }
    // Linger 0: the slot and its memory are released at once, no TIME_WAIT.
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
}

async fn serve_connection(
    stream: TcpStream,
    peer: PeerAddr,
    peer_trusted: bool,
    spec: ListenerSpec,
    edge: EdgeSettings,
    mut guard: ConnGuard,
    rt: Arc<Runtime>,
) {
    let mut proxy_source: Option<IpAddr> = None;
    if spec.proxy_protocol {
        match proxy_protocol::read_header(&stream, edge.handshake_timeout).await {
            Ok(h) => {
                if peer_trusted {
                    proxy_source = h
                        .source
                        .map(|s| crate::identity::ClientAddr::new(s.ip()).ip());
                } else {
                    rt.metrics.forwarding_warning("untrusted_proxy_protocol");
                }
            }
            Err(e) => {
                rt.metrics.connection_error("proxy_protocol");
                tracing::debug!(peer = %peer.0, error = %e, "bad PROXY protocol header");
                return;
            }
        }
        if let Some(ip) = proxy_source
            && let Err(refusal) = guard.count_ip(ip)
        {
            refuse(stream, refusal, spec.tls.is_none(), &rt);
            return;
        }
    }
    let state = guard.state.clone();
    let guard = Arc::new(guard);
    let ctx = Arc::new(ConnCtx {
        peer,
        peer_trusted,
        proxy_source,
        tls: spec.tls.is_some(),
        state: state.clone(),
        guard: guard.clone(),
        rt: rt.clone(),
    });
    let service = service_fn(move |req| proxy::handle(req, ctx.clone()));

    let result: Result<(), Box<dyn std::error::Error + Send + Sync>> = match &spec.tls {
        Some(acceptor) => {
            let handshake = tokio::time::timeout(edge.handshake_timeout, acceptor.accept(stream));
            let tls = tokio::select! {
                r = handshake => r,
                _ = state.wait_for(Command::Graceful) => return,
            };
            let tls = match tls {
                Ok(Ok(s)) => s,
                Ok(Err(_)) | Err(_) => {
                    rt.metrics.connection_error("tls_handshake");
                    return;
                }
            };
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
            let io = TokioIo::new(TrackedIo::new(tls, state.clone()));
            if h2 {
                let conn = http2_builder(&edge).serve_connection(io, service);
                drive!(conn, state)
            } else {
                let conn = http1_builder(&edge)
                    .serve_connection(io, service)
                    .with_upgrades();
                drive!(conn, state)
            }
        }
        None => {
            stream.set_nodelay(true).ok();
            let io = TokioIo::new(TrackedIo::new(stream, state.clone()));
            if spec.http2 {
                let mut builder =
                    hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                configure_http1(&mut builder.http1(), &edge);
                configure_http2(&mut builder.http2(), &edge);
                let conn = builder.serve_connection_with_upgrades(io, service);
                drive!(conn, state)
            } else {
                let conn = http1_builder(&edge)
                    .serve_connection(io, service)
                    .with_upgrades();
                drive!(conn, state)
            }
        }
    };
    if let Some(reason) = state.close_reason() {
        rt.metrics.closed(reason);
    }
    if let Err(e) = result {
        rt.metrics.connection_error(classify(&*e));
    }
    // The guard is released when the last request on this connection (or an
    // upgraded tunnel) lets go of it.
    drop(guard);
}

fn configure_http1<T: Http1Settings>(b: &mut T, edge: &EdgeSettings) {
    b.apply(edge);
}

fn configure_http2<T: Http2Settings>(b: &mut T, edge: &EdgeSettings) {
    b.apply(edge);
}

/// The same HTTP/1 settings on hyper's builder and hyper-util's auto builder.
trait Http1Settings {
    fn apply(&mut self, edge: &EdgeSettings);
}

impl Http1Settings for hyper::server::conn::http1::Builder {
    fn apply(&mut self, edge: &EdgeSettings) {
        self.timer(TokioTimer::new())
            // Off: hyper's timer would also cut idle keep-alive connections at
            // the header timeout. The tracker's sweep enforces both separately.
            .header_read_timeout(None)
            .max_buf_size(edge.max_header_bytes)
            .max_headers(edge.max_headers)
            .keep_alive(true);
    }
}

impl<E> Http1Settings for hyper_util::server::conn::auto::Http1Builder<'_, E> {
    fn apply(&mut self, edge: &EdgeSettings) {
        self.timer(TokioTimer::new())
            // Off: hyper's timer would also cut idle keep-alive connections at
            // the header timeout. The tracker's sweep enforces both separately.
            .header_read_timeout(None)
            .max_buf_size(edge.max_header_bytes)
            .max_headers(edge.max_headers)
            .keep_alive(true);
    }
}

/// The same HTTP/2 settings on both builders.
trait Http2Settings {
    fn apply(&mut self, edge: &EdgeSettings);
}

/// Streams per HTTP/2 connection: like nginx's default of 128.
const H2_MAX_STREAMS: u32 = 128;

impl Http2Settings for hyper::server::conn::http2::Builder<TokioExecutor> {
    fn apply(&mut self, edge: &EdgeSettings) {
        self.timer(TokioTimer::new())
            .max_concurrent_streams(H2_MAX_STREAMS)
            .max_header_list_size(edge.max_header_bytes as u32)
            .keep_alive_interval(Some(Duration::from_secs(30)));
    }
}

impl<E> Http2Settings for hyper_util::server::conn::auto::Http2Builder<'_, E> {
    fn apply(&mut self, edge: &EdgeSettings) {
        self.timer(TokioTimer::new())
            .max_concurrent_streams(H2_MAX_STREAMS)
            .max_header_list_size(edge.max_header_bytes as u32)
            .keep_alive_interval(Some(Duration::from_secs(30)));
    }
}

fn http1_builder(edge: &EdgeSettings) -> hyper::server::conn::http1::Builder {
    let mut b = hyper::server::conn::http1::Builder::new();
    b.apply(edge);
    b
}

fn http2_builder(edge: &EdgeSettings) -> hyper::server::conn::http2::Builder<TokioExecutor> {
    let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    b.apply(edge);
    b
}

/// A bounded label for a connection that ended in an error.
fn classify(e: &(dyn std::error::Error + 'static)) -> &'static str {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<hyper::Error>() {
            return if h.is_parse_too_large() {
                "header_too_large"
            } else if h.is_parse() || h.is_parse_status() {
                "bad_request"
            } else if h.is_timeout() {
                "header_timeout"
            } else if h.is_incomplete_message() {
                "client_closed"
            } else if h.is_user() {
                "service"
            } else {
                "io"
            };
        }
        if err.is::<std::io::Error>() {
            return "io";
        }
        cur = err.source();
    }
    "other"
}
