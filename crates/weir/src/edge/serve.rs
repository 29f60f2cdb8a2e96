//! Accept loops and the life of one client connection.
//!
//! For each accepted socket: admit it (caps), read a PROXY header if the
//! listener expects one, complete the TLS handshake, then serve HTTP until
//! the client leaves or the tracker commands the connection to close (idle,
//! slow headers, shedding, drain): weir's own codec (`weir_http::server`) for
//! plain HTTP/1.1, hyper for TLS and HTTP/2.
//!
//! The edge serves a [`Service`] and knows nothing of what it does with a
//! request: the proxy (`crate::proxy`) is one, handed in by whoever starts
//! the accept loops.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use weir_http::body::{RequestBody, ResponseBody};
use weir_http::proxy_protocol;
use weir_http::server::Handler;

use super::balance::AcceptBalance;
use super::conn::{Command, ConnGuard, ConnState, ConnTracker, Refusal};
use super::io::TrackedIo;
use super::listener::{EdgeSettings, ListenerSpec};
use crate::identity::PeerAddr;
use crate::observe::Metrics;

/// What the edge serves: a handler per connection, and the settings in
/// force (a reload may change them between two connections).
pub trait Service: Send + Sync + 'static {
    /// Serves the requests of one connection (both codecs).
    type Handler: Handler<RequestBody = RequestBody, ResponseBody = ResponseBody>
        + Clone
        + Send
        + Sync
        + 'static;

    /// The settings of listener `index` in force now; `None` when it is no
    /// longer configured (the accept loop keeps its start-up settings).
    fn listener(&self, index: usize) -> Option<(ListenerSpec, EdgeSettings)>;

    /// Whether `peer` is a trusted proxy (its PROXY header and forwarding
    /// fields are believed, and it is not capped as one client).
    fn trusts(&self, peer: IpAddr) -> bool;

    /// The handler of a connection just set up.
    fn connection(&self, conn: Connection) -> Self::Handler;
}

/// What the edge knows about a connection, for its handler.
pub struct Connection {
    pub peer: PeerAddr,
    pub peer_trusted: bool,
    /// The PROXY protocol source, believed (peer trusted).
    pub proxy_source: Option<IpAddr>,
    /// The TLS session, on a TLS listener (after its handshake).
    pub tls: Option<TlsSession>,
    pub state: Arc<ConnState>,
    /// Keeps the connection's slots while any request or tunnel uses them.
    pub guard: Arc<ConnGuard>,
}

/// What a TLS handshake agreed, for the access log (`tls_version`, `alpn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TlsSession {
    /// `TLSv1.2` or `TLSv1.3`.
    pub version: &'static str,
    /// The application protocol ALPN chose (`h2`, `http/1.1`), when the
    /// client offered one weir serves.
    pub alpn: Option<&'static str>,
}

impl TlsSession {
    fn of(conn: &rustls::ServerConnection) -> TlsSession {
        let version = match conn.protocol_version() {
            Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3",
            Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
            // weir's acceptor allows only those two (`tls::acceptor`).
            _ => "unknown",
        };
        // Only protocols weir offered can be chosen: `tls::acceptor`.
        let alpn = match conn.alpn_protocol() {
            Some(b"h2") => Some("h2"),
            Some(b"http/1.1") => Some("http/1.1"),
            Some(_) => Some("unknown"),
            None => None,
        };
        TlsSession { version, alpn }
    }

    /// Whether ALPN chose HTTP/2.
    pub fn is_h2(&self) -> bool {
        self.alpn == Some("h2")
    }
}

/// What an accept loop needs: the tracker that admits connections, the
/// metrics it counts them in, and the service it hands them to.
pub struct Acceptor<S> {
    pub tracker: Arc<ConnTracker>,
    pub metrics: Arc<Metrics>,
    pub service: S,
    /// Open connections per accepting thread, to share them out.
    pub balance: Arc<AcceptBalance>,
}

/// Polls a pinned hyper connection until it ends, obeying tracker commands:
/// `Graceful` lets the request in flight finish, `Abort` drops the connection.
macro_rules! drive {
    ($conn:expr, $state:expr) => {{
        let mut conn = $conn;
        let mut graceful = false;
        // A connection told to close between requests may have the next
        // one on its way: closing now would drop a request the client sent
        // (HTTP/1.1 allows it, but wrk and some clients count it failed).
        // A new connection's close waits for its first request
        // (`FIRST_REQUEST_GRACE`), an idle kept-alive one's during a drain
        // for one more (`DRAIN_IDLE_GRACE`): the request is answered with
        // `Connection: close` (`proxy` adds it while a close is pending),
        // or the wait runs out.
        let mut deferred: Option<(tokio::time::Instant, u64)> = None;
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
                    match weir_http::conn::close_grace($state) {
                        Some(grace) => {
                            deferred = Some((tokio::time::Instant::now() + grace, $state.requests()));
                        }
                        None => {
                            graceful = true;
                            conn.as_mut().graceful_shutdown();
                        }
                    }
                }
                _ = tokio::time::sleep(std::time::Duration::from_millis(10)), if deferred.is_some() => {
                    if deferred.is_some_and(|(until, seen)| {
                        $state.requests() > seen || tokio::time::Instant::now() >= until
                    }) {
                        deferred = None;
                        graceful = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
        }
    }};
}

/// The listener an accept loop serves: the accepting thread that runs the
/// loop (0: the main runtime), the listener's place in the configuration,
/// and its settings as the loop started (a connection takes the current
/// ones, see [`admit`]).
#[derive(Clone)]
pub struct Listening {
    pub thread: usize,
    pub index: usize,
    pub spec: ListenerSpec,
    pub edge: EdgeSettings,
}

/// A connection the caps admitted: its peer, whether the peer is a trusted
/// proxy, and its slot in the tracker (held until the connection ends).
struct Admitted {
    peer: PeerAddr,
    peer_trusted: bool,
    guard: ConnGuard,
}

/// Accepts connections on `listener` until `stop` is cancelled.
pub async fn accept_loop<S: Service>(
    listener: TcpListener,
    at: Listening,
    acceptor: Arc<Acceptor<S>>,
    stop: CancellationToken,
) {
    loop {
        // A thread over its share of the connections lets the others take
        // the next ones (for a few milliseconds at most).
        let accepted = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            a = async {
                acceptor.balance.hold_off(at.thread).await;
                listener.accept().await
            } => a,
        };
        match accepted {
            Ok((stream, peer)) => admit(stream, peer, &at, &acceptor),
            Err(e) => {
                // EMFILE/ENFILE: out of descriptors. Back off briefly instead of
                // spinning; the connection stays in the backlog until then.
                acceptor.metrics.refused("accept_error");
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    take_backlog(listener, &at, &acceptor);
}

/// Stopping: connections the kernel has completed wait in this socket's
/// queue, and closing the socket would reset them. They are taken (plain
/// non-blocking accepts until the queue is empty, not tokio's readiness,
/// which may not have seen the last ones yet) and served like any other;
/// the caller then closes the socket.
fn take_backlog<S: Service>(listener: TcpListener, at: &Listening, acceptor: &Arc<Acceptor<S>>) {
    let Ok(listener) = listener.into_std() else {
        return;
    };
    let mut taken = 0;
    while let Ok((stream, peer)) = listener.accept() {
        let stream = match stream
            .set_nonblocking(true)
            .and_then(|()| TcpStream::from_std(stream))
        {
            Ok(s) => s,
            Err(_) => continue,
        };
        admit(stream, peer, at, acceptor);
        taken += 1;
    }
    if taken > 0 {
        tracing::info!(listener = %at.spec.address, connections = taken, "stopping: served the connections left in the accept queue");
    }
}

/// Admits one accepted connection (or refuses it at the connection caps)
/// and spawns its task.
fn admit<S: Service>(
    stream: TcpStream,
    peer: std::net::SocketAddr,
    at: &Listening,
    acceptor: &Arc<Acceptor<S>>,
) {
    let peer = PeerAddr(peer);
    let peer_trusted = acceptor.service.trusts(peer.ip());
    // A trusted proxy's connections carry many clients: they are capped by
    // their PROXY source (below) and by request-level limits instead.
    let cap_ip = (!peer_trusted).then(|| peer.ip());
    let guard = match acceptor.tracker.try_open(cap_ip) {
        Ok(g) => g,
        Err(refusal) => {
            refuse(stream, refusal, at.spec.tls.is_none(), &acceptor.metrics);
            return;
        }
    };
    acceptor.metrics.connections_accepted.inc();
    let (spec, edge) = acceptor
        .service
        .listener(at.index)
        .filter(|(l, _)| l.address == at.spec.address)
        .unwrap_or_else(|| (at.spec.clone(), at.edge));
    let acceptor = acceptor.clone();
    let share = acceptor.balance.opened(at.thread);
    let admitted = Admitted {
        peer,
        peer_trusted,
        guard,
    };
    tokio::spawn(async move {
        serve_connection(stream, admitted, spec, edge, acceptor).await;
        drop(share);
    });
}

/// Answers a refused connection as cheaply as possible and closes it.
fn refuse(stream: TcpStream, refusal: Refusal, plain: bool, metrics: &Metrics) {
    metrics.refused(refusal.as_str());
    if plain {
        // Best effort, never waits: a 503 the client can read, then close.
        let _ = stream.try_write(crate::respond::REFUSED_AT_ACCEPT);
    }
    // Linger 0: the slot and its memory are released at once, no TIME_WAIT.
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
}

/// A connection's task, from its PROXY header (if any) and TLS handshake to
/// its close. Every open connection holds this future, idle or not, so its
/// size is memory per connection: an `async` block rather than an
/// `async fn` (which keeps a second copy of its arguments), the rare states
/// boxed (bench/README.md, "Idle memory").
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn keeps a second copy of its arguments"
)]
fn serve_connection<S: Service>(
    stream: TcpStream,
    Admitted {
        peer,
        peer_trusted,
        mut guard,
    }: Admitted,
    spec: ListenerSpec,
    edge: EdgeSettings,
    acceptor: Arc<Acceptor<S>>,
) -> impl Future<Output = ()> + Send + 'static {
    async move {
        let metrics = &acceptor.metrics;
        let mut proxy_source: Option<IpAddr> = None;
        if spec.proxy_protocol {
            // Boxed: its read buffer would otherwise be in every connection's
            // task for as long as it is open.
            let Ok(source) =
                Box::pin(proxy_header(&stream, &edge, peer, peer_trusted, metrics)).await
            else {
                return;
            };
            proxy_source = source;
            if let Some(ip) = proxy_source
                && let Err(refusal) = guard.count_ip(ip)
            {
                refuse(stream, refusal, spec.tls.is_none(), metrics);
                return;
            }
        }
        let state = guard.state.clone();
        let guard = Arc::new(guard);
        let conn = |tls| Connection {
            peer,
            peer_trusted,
            proxy_source,
            tls,
            state: state.clone(),
            guard: guard.clone(),
        };
        let result: Result<(), BoxError> = match &spec.tls {
            // Boxed: a task is as large as its largest state, and most
            // connections are plain.
            Some(tls) => {
                let handshake = Box::pin(tls_handshake(stream, tls, &edge, &state)).await;
                let Some(stream) = handshake.done(metrics) else {
                    return;
                };
                let session = TlsSession::of(stream.get_ref().1);
                let handler = acceptor.service.connection(conn(Some(session)));
                Box::pin(serve_tls(
                    stream,
                    session,
                    &edge,
                    hyper_service(handler, &state),
                    &state,
                ))
                .await
            }
            None => {
                stream.set_nodelay(true).ok();
                let handler = acceptor.service.connection(conn(None));
                serve_plain(stream, spec.http2, &edge, handler, &state).await
            }
        };
        if let Some(reason) = state.close_reason() {
            metrics.closed(reason);
        }
        if let Err(e) = result {
            metrics.connection_error(classify(&*e));
        }
        // The guard is released when the last request on this connection (or an
        // upgraded tunnel) lets go of it.
        drop(guard);
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A connection's handler as a hyper service (TLS and HTTP/2 connections).
/// Each request is in progress on the connection (for the tracker's idle
/// and drain decisions) from its head until its response body ends or is
/// dropped. An HTTP/1 answer says `close` when the connection is to close
/// after it (a drain, an idle or shedding close): hyper then closes it
/// after this response instead of the client sending its next request into
/// a closing socket. (Weir's own HTTP/1 codec does the same itself.)
fn hyper_service<H>(handler: H, state: &Arc<ConnState>) -> impl ConnService
where
    H: Handler<RequestBody = RequestBody, ResponseBody = ResponseBody> + Clone + Send + 'static,
{
    let state = state.clone();
    service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let http1 = req.version() != http::Version::HTTP_2;
        let in_progress = state.start_request(!http1);
        // Boxed, and made in the box: hyper moves the service's future into
        // the stream's task (HTTP/2 spawns one a stream) and tokio moves it
        // on; inline, each move copied the handler's whole future (about 6
        // KB of copies a request, bench/README.md "HTTP/2 over TLS under
        // callgrind").
        let request = if http1 {
            req.map(RequestBody::from)
        } else {
            req.map(|body| RequestBody::from(body).drained_when_dropped())
        };
        let answer = Box::into_pin(Box::write(Box::new_uninit(), handler.handle(request)));
        let state = state.clone();
        async move {
            // hyper writes only the response's map.
            let (mut parts, mut body) = (*answer.await).into_parts();
            body.fields_into(&mut parts.headers);
            if http1
                && state.command() != Command::None
                && parts.status != http::StatusCode::SWITCHING_PROTOCOLS
            {
                (parts.headers).insert(http::header::CONNECTION, CLOSE);
            }
            let body = body.in_progress(in_progress);
            Ok::<_, std::convert::Infallible>(hyper::Response::from_parts(parts, body))
        }
    })
}

const CLOSE: http::HeaderValue = http::HeaderValue::from_static("close");

/// What hyper needs of the service a connection runs (the handler's).
trait ConnService:
    hyper::service::HttpService<
        hyper::body::Incoming,
        ResBody = weir_http::body::ResponseBody,
        Error = std::convert::Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
{
}

impl<S> ConnService for S where
    S: hyper::service::HttpService<
            hyper::body::Incoming,
            ResBody = weir_http::body::ResponseBody,
            Error = std::convert::Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static
{
}

/// How a TLS handshake ended.
enum Handshake {
    /// Boxed: the stream is large and the other outcomes empty.
    Done(Box<TlsStream>),
    /// It failed or timed out.
    Failed,
    /// The connection was told to close first.
    Stopped,
}

impl Handshake {
    /// The stream to serve, or `None`, with a failure counted (a stop is
    /// nothing to count).
    fn done(self, metrics: &Metrics) -> Option<Box<TlsStream>> {
        match self {
            Handshake::Done(stream) => Some(stream),
            Handshake::Failed => {
                metrics.connection_error("tls_handshake");
                None
            }
            Handshake::Stopped => None,
        }
    }
}

/// A connection's PROXY protocol header, read within `handshake_timeout`:
/// the client it names when the peer is a trusted proxy (an untrusted
/// peer's is read, counted and ignored), or `Err` when it is bad (counted;
/// the connection closes).
async fn proxy_header(
    stream: &TcpStream,
    edge: &EdgeSettings,
    peer: PeerAddr,
    peer_trusted: bool,
    metrics: &Metrics,
) -> Result<Option<IpAddr>, ()> {
    match proxy_protocol::read_header(stream, edge.handshake_timeout).await {
        Ok(h) if peer_trusted => Ok(h
            .source
            .map(|s| crate::identity::ClientAddr::new(s.ip()).ip())),
        Ok(_) => {
            metrics.forwarding_warning("untrusted_proxy_protocol");
            Ok(None)
        }
        Err(e) => {
            metrics.connection_error("proxy_protocol");
            tracing::debug!(peer = %peer.0, error = %e, "bad PROXY protocol header");
            Err(())
        }
    }
}

/// A TLS connection's handshake, bounded by `handshake_timeout`.
async fn tls_handshake(
    stream: TcpStream,
    acceptor: &tokio_rustls::TlsAcceptor,
    edge: &EdgeSettings,
    state: &Arc<ConnState>,
) -> Handshake {
    let handshake = tokio::time::timeout(edge.handshake_timeout, acceptor.accept(stream));
    tokio::select! {
        r = handshake => match r {
            Ok(Ok(stream)) => Handshake::Done(Box::new(stream)),
            _ => Handshake::Failed,
        },
        _ = state.wait_for(Command::Graceful) => Handshake::Stopped,
    }
}

type TlsStream = tokio_rustls::server::TlsStream<TcpStream>;

/// Serves a TLS connection after its handshake (HTTP/2 when ALPN chose it).
async fn serve_tls<S: ConnService>(
    tls: Box<TlsStream>,
    session: TlsSession,
    edge: &EdgeSettings,
    service: S,
    state: &Arc<ConnState>,
) -> Result<(), BoxError> {
    let io = TokioIo::new(TrackedIo::new(tls, state.clone()));
    if session.is_h2() {
        let conn = http2_builder(edge).serve_connection(io, service);
        drive!(std::pin::pin!(conn), state)
    } else {
        let conn = http1_builder(edge)
            .serve_connection(io, service)
            .with_upgrades();
        drive!(std::pin::pin!(conn), state)
    }
}

/// Serves a plain-TCP connection: HTTP/2 with prior knowledge when the
/// listener allows it and the client opens with the preface, else HTTP/1
/// (weir's own codec, `weir_http::server`).
async fn serve_plain<H>(
    stream: TcpStream,
    h2c: bool,
    edge: &EdgeSettings,
    handler: H,
    state: &Arc<ConnState>,
) -> Result<(), BoxError>
where
    H: Handler<RequestBody = RequestBody, ResponseBody = ResponseBody> + Clone + Send + 'static,
{
    if h2c && starts_with_h2_preface(&stream, state).await {
        let io = TokioIo::new(TrackedIo::new(stream, state.clone()));
        let mut conn =
            Box::pin(http2_builder(edge).serve_connection(io, hyper_service(handler, state)));
        return drive!(conn.as_mut(), state);
    }
    let limits = weir_http::server::HeadLimits {
        max_bytes: edge.max_header_bytes,
        max_headers: edge.max_headers,
    };
    Ok(weir_http::server::serve(stream, state, handler, limits).await?)
}

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether the client opens with the HTTP/2 preface, looked at without
/// consuming it. A preface split over segments is waited for, woken by
/// the socket (no timer: 200 connections that sent one byte cost nothing
/// until they send another); the sweep's header timeout bounds the wait.
async fn starts_with_h2_preface(stream: &TcpStream, state: &ConnState) -> bool {
    let mut buf = [0u8; H2_PREFACE.len()];
    let peeked = async {
        loop {
            stream.readable().await?;
            let peek = stream.try_io(tokio::io::Interest::READABLE, || {
                let (n, _) = rustix::net::recv(stream, &mut buf[..], rustix::net::RecvFlags::PEEK)?;
                if n > 0 && n < H2_PREFACE.len() && buf[..n] == H2_PREFACE[..n] {
                    // The preface's start and no more yet: told as "would
                    // block", tokio clears the socket's readiness, so the
                    // next segment's arrival is what wakes this task.
                    return Err(std::io::ErrorKind::WouldBlock.into());
                }
                Ok(n)
            });
            match peek {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                r => return r,
            }
        }
    };
    let n = tokio::select! {
        r = peeked => match r {
            Ok(n) => n,
            Err(_) => return false,
        },
        _ = state.wait_for(Command::Abort) => return false,
    };
    n == H2_PREFACE.len() && buf == *H2_PREFACE
}

/// Streams per HTTP/2 connection: like nginx's default of 128.
const H2_MAX_STREAMS: u32 = 128;

fn http1_builder(edge: &EdgeSettings) -> hyper::server::conn::http1::Builder {
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new())
        // Off: hyper's timer would also cut idle keep-alive connections at
        // the header timeout. The tracker's sweep enforces both separately.
        .header_read_timeout(None)
        .max_buf_size(edge.max_header_bytes)
        .keep_alive(true);
    // hyper's own limit is 100 on the stack; setting any limit, even 100,
    // makes it allocate and fill a header table for every request.
    if edge.max_headers != HYPER_MAX_HEADERS {
        b.max_headers(edge.max_headers);
    }
    b
}

/// hyper's header count limit when none is set.
const HYPER_MAX_HEADERS: usize = 100;

fn http2_builder(edge: &EdgeSettings) -> hyper::server::conn::http2::Builder<TokioExecutor> {
    let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    b.timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        .max_header_list_size(edge.max_header_bytes as u32)
        .keep_alive_interval(Some(Duration::from_secs(30)));
    b
}

/// A bounded label for a connection that ended in an error.
fn classify(e: &(dyn std::error::Error + 'static)) -> &'static str {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(c) = err.downcast_ref::<weir_http::server::ClientError>() {
            return c.label();
        }
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

#[cfg(test)]
mod tests {
    /// The size of what `f` returns, without calling it.
    fn returned_size<F, A, B, C, D, E, R>(_: F) -> usize
    where
        F: FnOnce(A, B, C, D, E) -> R,
    {
        std::mem::size_of::<R>()
    }

    /// Every open connection's task is this future, idle or not: 10,000
    /// idle keep-alive connections hold ten thousand of it. It was 2.8 KB
    /// (the arguments kept twice, the PROXY header's buffer and the HTTP/1
    /// codec's request head inline); 1.4 KB since (bench/README.md, "Idle
    /// memory").
    #[test]
    fn a_connection_s_task_stays_small() {
        let size = returned_size(super::serve_connection::<crate::proxy::Proxy>);
        eprintln!("serve_connection's future: {size} bytes");
        assert!(size <= 1536, "serve_connection's future is {size} bytes");
    }
}
