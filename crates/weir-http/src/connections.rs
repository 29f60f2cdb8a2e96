//! Keep-alive connections to one upstream server: a stack of idle HTTP/1.1
//! connections, opened on demand and handed back when a response body ends.
//!
//! hyper-util's legacy `Client` is not used: it finds a connection through a
//! map keyed by URI authority behind one lock, and hands a connection back by
//! spawning a task per request that waits for it to become ready again. weir
//! already knows which server it picked and when the response body ended,
//! so a stack per server and a hand-back at body end do the same job without
//! either (bench/README.md, "Upstream connections").
//!
//! The stack is last-in first-out: the connection used most recently is the
//! warmest and the least likely to have been closed by the server's own idle
//! timeout. This module does not choose servers (`pool`) or rewrite requests
//! (`forward`).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use tokio::net::TcpStream;

use crate::client::{ExchangeError, Failure, Framing, ResponseHead, SendBody, UpstreamConnection};
use crate::fields::ReceivedFields;
use crate::scheduler::current_scheduler;

/// How a pool's connections are opened and kept.
#[derive(Debug, Clone, Copy)]
pub struct ConnSettings {
    pub connect_timeout: Duration,
    /// How long the server may take to answer a request sent whole, and the
    /// longest a write of a request body to it may stall. Not a bound on
    /// the whole exchange: an upload takes as long as its client does.
    pub response_timeout: Duration,
    /// Idle connections older than this are closed instead of reused.
    pub idle_timeout: Duration,
    /// Idle connections kept per server; more are closed once idle for
    /// [`SURPLUS_LINGER`] (0: none is kept).
    pub max_idle: usize,
}

/// How long idle connections beyond `max_idle` are kept. A burst of more
/// requests at once than `max_idle` gives back more connections than that,
/// and the next burst, a moment later, needs as many again. Closed at once
/// (as nginx's `keepalive N` does), each burst opened them anew: with
/// HTTP/2 clients at 1,000 connections, over half of the requests opened
/// an upstream connection, and weir's CPU a request doubled
/// (bench/README.md, "Upstream connections a burst gives back"). Kept a
/// moment, they are reused; what a burst that does not come back left is
/// closed this long after.
pub const SURPLUS_LINGER: Duration = Duration::from_secs(1);

/// Idle time after which a server's keep-alive timeout may close a
/// connection just as a request is written to it (node's default is 5 s,
/// some servers use well under a second). A connection reused sooner that
/// closes unanswered says more about the server (stopping, crashing) than
/// about the race: the request goes to another server instead.
const MAY_BE_CLOSED_AFTER: Duration = Duration::from_millis(100);

/// A read that may be sent again when a connection closed before any
/// response (RFC 9110 §9.2.2, as nginx's `proxy_next_upstream error` and
/// browsers assume): GET, HEAD, OPTIONS.
pub fn is_idempotent_read(method: &http::Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Why no connection could be had. Nothing was sent: always safe to retry.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("connect failed: {0}")]
    Io(#[from] io::Error),
    #[error("connect timed out after {0:?}")]
    Timeout(Duration),
}

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The request was (at least partly) sent.
    #[error(transparent)]
    Exchange(ExchangeError),
    /// A kept-alive connection closed after the request was written and
    /// before any response byte: the server most likely closed it as the
    /// request arrived (its idle timeout, or it stopped). An idempotent
    /// request may be sent again (RFC 9112 §9.3.1).
    #[error("kept-alive connection closed before a response: {0}")]
    Closed(ExchangeError),
}

/// Schedulers with idle stacks of their own; more share them (modulo).
const SCHEDULER_STACKS: usize = 16;

/// The idle connections of one server, one stack per scheduler. A socket's
/// readiness comes from the I/O driver of the scheduler that opened it:
/// used from another thread, each event waits for that thread to poll its
/// driver and wake this one (with two workers, a p99 three times nginx's at
/// 1,000 connections, bench/README.md "Two workers"). So a connection goes
/// back to the stack of the scheduler that opened it, and a request takes
/// one from its own scheduler's stack. `max_idle` holds per stack, as
/// nginx's `keepalive` does per worker.
#[derive(Debug)]
pub struct ServerConnections {
    idle: Box<[IdleStack]>,
}

/// One scheduler's idle connections, alone on its cache line: the threads
/// never contend for one line.
#[derive(Debug, Default)]
#[repr(align(64))]
struct IdleStack(Mutex<Vec<Idle>>);

impl Default for ServerConnections {
    fn default() -> Self {
        ServerConnections {
            idle: (0..SCHEDULER_STACKS)
                .map(|_| IdleStack::default())
                .collect(),
        }
    }
}

#[derive(Debug)]
struct Idle {
    conn: UpstreamConnection,
    since: Instant,
}

/// Closes a stack's idle connections that are past their time: any idle
/// longer than the idle timeout, and those beyond `max_idle` idle longer
/// than [`SURPLUS_LINGER`]. The oldest are at the bottom (parked in order,
/// taken from the top), so the purge stops at the first one still in
/// time: a look at one connection when nothing is due.
fn purge(idle: &mut Vec<Idle>, settings: &ConnSettings, now: Instant) {
    let len = idle.len();
    let due = idle
        .iter()
        .enumerate()
        .take_while(|(i, c)| {
            let age = now.saturating_duration_since(c.since);
            let surplus = len - i > settings.max_idle;
            age > settings.idle_timeout || (surplus && age > SURPLUS_LINGER)
        })
        .count();
    if due > 0 {
        idle.drain(..due);
    }
}

impl ServerConnections {
    fn stack(&self, scheduler: usize) -> &Mutex<Vec<Idle>> {
        &self.idle[scheduler % self.idle.len()].0
    }

    /// The most recently parked connection of this scheduler, and how long
    /// it was idle; those past their time are closed first ([`purge`]).
    fn pop(&self, settings: &ConnSettings) -> Option<(UpstreamConnection, Duration)> {
        let now = Instant::now();
        let stack = self.stack(current_scheduler());
        let mut idle = stack.lock().unwrap_or_else(|e| e.into_inner());
        purge(&mut idle, settings, now);
        let Idle { conn, since } = idle.pop()?;
        Some((conn, now.saturating_duration_since(since)))
    }

    /// Closes the idle connections past their time in every stack
    /// ([`purge`]): what parking and taking do as they go, for a server
    /// that traffic has left (the surplus of its last burst would otherwise
    /// hold its sockets until the next request). Run on a timer.
    pub fn purge_idle(&self, settings: &ConnSettings) {
        let now = Instant::now();
        for stack in &self.idle {
            purge(
                &mut stack.0.lock().unwrap_or_else(|e| e.into_inner()),
                settings,
                now,
            );
        }
    }

    fn push(&self, mut conn: UpstreamConnection, settings: &ConnSettings) {
        if settings.max_idle == 0 {
            return;
        }
        conn.park();
        let now = Instant::now();
        let stack = self.stack(conn.scheduler());
        let mut idle = stack.lock().unwrap_or_else(|e| e.into_inner());
        purge(&mut idle, settings, now);
        idle.push(Idle { conn, since: now });
    }

    /// Sends `req` to `addr` on an idle connection, or a new one. A request
    /// that a reused connection could not take (the server had just closed
    /// it) is sent again on a new one: it never left weir. So is a bodyless
    /// read written to a connection that had been idle long enough for the
    /// server's keep-alive timeout to close it as the request arrived.
    pub async fn send<B: SendBody>(
        self: &Arc<Self>,
        addr: SocketAddr,
        settings: &ConnSettings,
        req: &mut Request<B>,
    ) -> Result<Box<Response<UpstreamBody>>, SendError> {
        let resendable = is_idempotent_read(req.method()) && req.body().is_end_stream();
        while let Some((mut conn, idle_for)) = self.pop(settings) {
            if idle_for > settings.idle_timeout || !conn.is_reusable() {
                continue;
            }
            match self.exchange(conn, req, settings).await {
                Ok(sent) => return Ok(self.wrap(sent, settings)),
                Err(Failure::Unsent(_)) => continue,
                Err(Failure::Sent(e @ ExchangeError::NoResponse(_))) => {
                    if !(resendable && idle_for >= MAY_BE_CLOSED_AFTER) {
                        return Err(SendError::Closed(e));
                    }
                    tracing::debug!(%addr, "kept-alive connection closed; resending on a new one");
                    break;
                }
                Err(Failure::Sent(e)) => return Err(SendError::Exchange(e)),
            }
        }
        let conn = connect(addr, settings.connect_timeout).await?;
        match self.exchange(conn, req, settings).await {
            Ok(sent) => Ok(self.wrap(sent, settings)),
            Err(Failure::Unsent(e) | Failure::Sent(e)) => Err(SendError::Exchange(e)),
        }
    }

    /// [`UpstreamConnection::exchange`] on `conn`, which is not lost if
    /// the caller stops waiting once the request is sent whole (its client
    /// went away, or the response timeout passed): the response is then read
    /// and dropped in the background and the connection comes back to the
    /// idle stack ([`finish_abandoned`]), so a client that disconnects
    /// mid-request costs no upstream connection (a load generator stopping
    /// would cost about a hundred new ones).
    async fn exchange<B: SendBody>(
        self: &Arc<Self>,
        conn: UpstreamConnection,
        req: &mut Request<B>,
        settings: &ConnSettings,
    ) -> Result<Exchanged, Failure> {
        // Read only for a request with a body: for one without, the head
        // is written at once and the caller's own clock serves.
        let has_body = !req.body().is_end_stream();
        let mut waiting = Abandonable {
            conn: Some(conn),
            sent: false,
            home: self,
            settings,
            head_request: req.method() == Method::HEAD,
        };
        let timeout = settings.response_timeout;
        let early = waiting.conn().send_request(req, timeout).await?;
        let mut body_sent = None;
        let head = match early {
            Some(head) => Ok(head),
            None => {
                waiting.sent = true;
                body_sent = has_body.then(Instant::now);
                let head_request = waiting.head_request;
                let read = waiting.conn().read_response(head_request);
                // Past it the connection is closed: its answer may still
                // come, and no other request may read it.
                match tokio::time::timeout(timeout, read).await {
                    Ok(head) => head,
                    Err(_) => Err(ExchangeError::TimedOut(timeout)),
                }
            }
        };
        let conn = waiting.settle();
        head.map(|head| Exchanged {
            head,
            conn,
            body_sent,
        })
        .map_err(Failure::Sent)
    }

    /// The response, boxed: it passes through several futures on its way
    /// to the client (failover, the upstream and respond phases), and each
    /// would copy it (a header map and the body's state) once or twice.
    fn wrap(
        self: &Arc<Self>,
        sent: Exchanged,
        settings: &ConnSettings,
    ) -> Box<Response<UpstreamBody>> {
        let Exchanged {
            head,
            conn,
            body_sent,
        } = sent;
        let mut body = UpstreamBody {
            body_sent,
            conn: Some(conn),
            framing: head.framing,
            back: head.keep_alive.then(|| Return {
                home: self.clone(),
                settings: *settings,
            }),
            tunnel: head.status == StatusCode::SWITCHING_PROTOCOLS,
            received: head.received,
        };
        if let Some(conn) = body.conn.as_mut() {
            conn.settle(&mut body.framing);
        }
        if body.is_end_stream() && !body.tunnel {
            body.release();
        }
        let mut resp = Box::new(Response::new(body));
        *resp.status_mut() = head.status;
        *resp.version_mut() = head.version;
        *resp.headers_mut() = head.headers;
        resp
    }
}

/// A request sent and its response head read, on `conn`.
struct Exchanged {
    head: ResponseHead,
    conn: UpstreamConnection,
    body_sent: Option<Instant>,
}

/// How long a connection whose exchange was abandoned may take to finish
/// its response in the background before it is closed after all: a fast
/// app's answer arrives well within it, a slow one's costs a new connection
/// later, as before.
const FINISH_WITHIN: Duration = Duration::from_secs(1);
/// Most response body bytes read and dropped to save a connection; a longer
/// body is cheaper to cut (a new connection is a round trip and a few
/// hundred bytes of kernel state).
const FINISH_MAX_BYTES: usize = 64 * 1024;

/// A connection during an exchange. Dropped with its request sent whole
/// and the response head not read yet, it finishes the exchange in the
/// background; dropped earlier (the request cut short), the connection is
/// closed: the server is waiting for the rest of a request.
struct Abandonable<'a> {
    conn: Option<UpstreamConnection>,
    /// The request was sent whole.
    sent: bool,
    home: &'a Arc<ServerConnections>,
    settings: &'a ConnSettings,
    head_request: bool,
}

impl Abandonable<'_> {
    fn conn(&mut self) -> &mut UpstreamConnection {
        self.conn.as_mut().expect("held until settled")
    }

    /// The exchange is over (a head, or an error): the connection back.
    fn settle(mut self) -> UpstreamConnection {
        self.conn.take().expect("held until settled")
    }
}

impl Drop for Abandonable<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take()
            && self.sent
        {
            finish_abandoned(
                conn,
                None,
                self.home.clone(),
                *self.settings,
                self.head_request,
            );
        }
    }
}

/// Reads what is left of an abandoned exchange's response (its head, unless
/// `framing` says the head was read and how the rest is framed) and drops
/// it, then returns the connection to `home`'s idle stack; within
/// [`FINISH_WITHIN`] and [`FINISH_MAX_BYTES`], else the connection is
/// closed. A body already whole in the buffer is finished at once, without
/// a task.
fn finish_abandoned(
    mut conn: UpstreamConnection,
    framing: Option<Framing>,
    home: Arc<ServerConnections>,
    settings: ConnSettings,
    head_request: bool,
) {
    if let Some(mut framing) = framing {
        let mut budget = FINISH_MAX_BYTES;
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match drain(&mut conn, &mut framing, &mut budget, &mut cx) {
            Poll::Ready(true) => return home.push(conn, &settings),
            Poll::Ready(false) => return,
            Poll::Pending => {}
        }
    }
    // Outside a runtime (a test's own thread) there is no task to finish it.
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let finished = tokio::time::timeout(FINISH_WITHIN, async {
            let mut framing = match framing {
                Some(framing) => framing,
                None => match conn.read_response(head_request).await {
                    Ok(head)
                        if head.keep_alive && head.status != StatusCode::SWITCHING_PROTOCOLS =>
                    {
                        head.framing
                    }
                    _ => return false,
                },
            };
            let mut budget = FINISH_MAX_BYTES;
            std::future::poll_fn(|cx| drain(&mut conn, &mut framing, &mut budget, cx)).await
        })
        .await;
        if finished == Ok(true) {
            home.push(conn, &settings);
        }
    });
}

/// Reads and drops a response body framed as `framing`, at most `budget`
/// bytes more. `Ready(true)`: it ended cleanly and the connection may be
/// reused; `Ready(false)`: it failed, or was too long.
fn drain(
    conn: &mut UpstreamConnection,
    framing: &mut Framing,
    budget: &mut usize,
    cx: &mut Context<'_>,
) -> Poll<bool> {
    loop {
        match std::task::ready!(conn.poll_body(framing, cx)) {
            None => return Poll::Ready(!conn.has_leftover()),
            Some(Ok(data)) => match budget.checked_sub(data.len()) {
                Some(left) => *budget = left,
                None => return Poll::Ready(false),
            },
            Some(Err(_)) => return Poll::Ready(false),
        }
    }
}

/// Opens a connection.
async fn connect(addr: SocketAddr, timeout: Duration) -> Result<UpstreamConnection, ConnectError> {
    let stream = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Err(_) => return Err(ConnectError::Timeout(timeout)),
        Ok(r) => r?,
    };
    stream.set_nodelay(true)?;
    Ok(UpstreamConnection::new(stream))
}

/// Where a connection goes when its response body ends.
struct Return {
    home: Arc<ServerConnections>,
    settings: ConnSettings,
}

/// A response body from an upstream server, read from its connection by
/// whoever polls it. When it ends cleanly the connection goes back to the
/// server's idle stack; dropped early (the client went away), the rest is
/// read and dropped first, within bounds ([`finish_abandoned`]).
pub struct UpstreamBody {
    /// When the request's body was sent whole (a request with one): the
    /// app's own time is from here to the response head; before it, the
    /// upload's pace is the client's.
    body_sent: Option<Instant>,
    conn: Option<UpstreamConnection>,
    framing: Framing,
    /// `None`: the connection is not to be reused.
    back: Option<Return>,
    /// A `101 Switching Protocols`: the connection becomes a tunnel.
    tunnel: bool,
    /// The response's fields, when they are forwarded as received rather
    /// than in its map ([`crate::fields`]).
    received: Option<ReceivedFields>,
}

impl UpstreamBody {
    fn release(&mut self) {
        let conn = self.conn.take();
        if let (Some(conn), Some(r)) = (conn, self.back.take())
            && !conn.has_leftover()
        {
            r.home.push(conn, &r.settings);
        }
    }

    /// When the request's body finished going to the app, for a request
    /// that had one (see [`UpstreamBody`]'s field).
    pub fn request_body_sent(&self) -> Option<Instant> {
        self.body_sent
    }

    /// The response's fields forwarded as received, if they were not put in
    /// its map.
    pub fn received_fields(&self) -> Option<&ReceivedFields> {
        self.received.as_ref()
    }

    /// Moves those fields into `headers` (the response's map), for a stage
    /// or codec that reads only the map.
    pub fn fields_into(&mut self, headers: &mut http::HeaderMap) {
        if let Some(fields) = self.received.take() {
            fields.append_to(headers);
        }
    }

    /// After `101 Switching Protocols`: the upstream connection for the
    /// tunnel, and the bytes the server sent past its head.
    pub fn take_tunnel(&mut self) -> Option<(TcpStream, Bytes)> {
        if !self.tunnel {
            return None;
        }
        self.conn.take().map(UpstreamConnection::into_tunnel)
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        if self.tunnel {
            return;
        }
        if let (Some(conn), Some(back)) = (self.conn.take(), self.back.take()) {
            finish_abandoned(conn, Some(self.framing), back.home, back.settings, false);
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = ExchangeError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ExchangeError>>> {
        let this = &mut *self;
        let Some(conn) = this.conn.as_mut() else {
            return Poll::Ready(None);
        };
        if this.tunnel {
            return Poll::Ready(None);
        }
        let polled = std::task::ready!(conn.poll_body(&mut this.framing, cx));
        match &polled {
            Some(Ok(_)) => {
                conn.settle(&mut this.framing);
                if this.is_end_stream() {
                    this.release();
                }
            }
            None => this.release(),
            Some(Err(_)) => {
                this.back = None;
                this.conn = None;
            }
        }
        Poll::Ready(polled.map(|r| r.map(Frame::data)))
    }

    fn is_end_stream(&self) -> bool {
        self.framing.is_end()
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Empty => SizeHint::with_exact(0),
            Framing::Length(n) => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection goes back to the stack of the scheduler that opened it,
    /// and a request takes one from its own scheduler's stack: used from
    /// another thread, its readiness would come from the other thread's
    /// driver.
    #[tokio::test]
    async fn an_idle_connection_is_kept_for_the_scheduler_that_opened_it() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let settings = ConnSettings {
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(60),
            max_idle: 4,
        };
        let home = ServerConnections::default();
        crate::scheduler::run_as_scheduler(1);
        let conn = connect(listener.local_addr().unwrap(), settings.connect_timeout)
            .await
            .unwrap();
        let _server_side = listener.accept().await.unwrap();
        home.push(conn, &settings);
        crate::scheduler::run_as_scheduler(0);
        assert!(
            home.pop(&settings).is_none(),
            "scheduler 0 took scheduler 1's"
        );
        crate::scheduler::run_as_scheduler(1);
        let (conn, _) = home.pop(&settings).expect("scheduler 1 takes its own back");
        assert_eq!(conn.scheduler(), 1);
        crate::scheduler::run_as_scheduler(0);
    }

    fn settings(max_idle: usize) -> ConnSettings {
        ConnSettings {
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(60),
            max_idle,
        }
    }

    /// `n` connections to a listener on loopback (and their server sides,
    /// kept open).
    async fn connections(n: usize) -> (Vec<UpstreamConnection>, Vec<tokio::net::TcpStream>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (mut conns, mut servers) = (Vec::new(), Vec::new());
        for _ in 0..n {
            conns.push(connect(addr, Duration::from_secs(5)).await.unwrap());
            servers.push(listener.accept().await.unwrap().0);
        }
        (conns, servers)
    }

    /// A burst of more requests at once than `max_idle` gives back more
    /// connections than that: all are kept for the next burst. (They were
    /// closed beyond `max_idle`, and each burst opened them anew.)
    #[tokio::test]
    async fn a_burst_s_connections_beyond_max_idle_are_kept_for_the_next_burst() {
        let settings = settings(2);
        let (conns, _servers) = connections(5).await;
        let pool = ServerConnections::default();
        for conn in conns {
            pool.push(conn, &settings);
        }
        let mut again = 0;
        while pool.pop(&settings).is_some() {
            again += 1;
        }
        assert_eq!(
            again, 5,
            "the burst's five connections are there for the next"
        );
    }

    /// Beyond `max_idle`, a connection idle for `SURPLUS_LINGER` is closed,
    /// the oldest first; within it, at the idle timeout.
    #[tokio::test]
    async fn the_surplus_goes_a_moment_after_the_burst_and_the_rest_at_the_idle_timeout() {
        let settings = settings(2);
        let (conns, _servers) = connections(5).await;
        let start = Instant::now();
        let mut idle: Vec<Idle> = conns
            .into_iter()
            .enumerate()
            .map(|(i, conn)| Idle {
                conn,
                since: start + Duration::from_millis(100 * i as u64),
            })
            .collect();
        purge(&mut idle, &settings, start + Duration::from_millis(900));
        assert_eq!(idle.len(), 5, "within the linger: all kept");
        // 1.15 s: the two oldest are past the linger, and beyond max_idle.
        purge(&mut idle, &settings, start + Duration::from_millis(1_150));
        assert_eq!(idle.len(), 3, "the two oldest went; the third is in time");
        purge(&mut idle, &settings, start + Duration::from_secs(5));
        let kept: Vec<_> = idle.iter().map(|i| i.since - start).collect();
        let newest = [Duration::from_millis(300), Duration::from_millis(400)];
        assert_eq!(kept, newest, "max_idle kept, the most recent");
        purge(&mut idle, &settings, start + Duration::from_secs(61));
        assert!(idle.is_empty(), "past the idle timeout: none");
    }

    /// The timer's purge closes what parking and taking would have, with
    /// no request coming (here: an idle timeout every connection is past).
    #[tokio::test]
    async fn the_timer_purges_a_server_no_request_comes_to() {
        let (conns, _servers) = connections(3).await;
        let pool = ServerConnections::default();
        for conn in conns {
            pool.push(conn, &settings(2));
        }
        std::thread::sleep(Duration::from_millis(2));
        let lapsed = ConnSettings {
            idle_timeout: Duration::from_millis(1),
            ..settings(2)
        };
        pool.purge_idle(&lapsed);
        assert!(
            pool.pop(&settings(2)).is_none(),
            "all past the idle timeout"
        );
    }

    /// `max_idle = 0` keeps none, not even for a moment.
    #[tokio::test]
    async fn max_idle_zero_keeps_no_connection() {
        let settings = settings(0);
        let (conns, _servers) = connections(2).await;
        let pool = ServerConnections::default();
        for conn in conns {
            pool.push(conn, &settings);
        }
        assert!(pool.pop(&settings).is_none());
    }
}
