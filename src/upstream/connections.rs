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
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::body::{RequestBody, copy_bodyless};

/// How a pool's connections are opened and kept.
#[derive(Debug, Clone, Copy)]
pub struct ConnSettings {
    pub connect_timeout: Duration,
    /// Idle connections older than this are closed instead of reused.
    pub idle_timeout: Duration,
    /// Idle connections kept per server; more are closed.
    pub max_idle: usize,
}

/// Idle time after which a server's keep-alive timeout may close a
/// connection just as a request is written to it (node's default is 5 s,
/// some servers use well under a second).
const MAY_BE_CLOSED_AFTER: Duration = Duration::from_millis(100);

/// A read that may be sent again when a connection closed before any
/// response (RFC 9110 §9.2.2, as nginx's `proxy_next_upstream error` and
/// browsers assume): GET, HEAD, OPTIONS.
pub fn is_idempotent_read(method: &http::Method) -> bool {
    use http::Method;
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// A copy of a bodyless idempotent read, which may be sent again.
fn replayable_copy(req: &Request<RequestBody>) -> Option<Request<RequestBody>> {
    if !is_idempotent_read(req.method()) || !req.body().is_end_stream() {
        return None;
    }
    Some(copy_bodyless(req))
}

/// The server closed (or reset) the connection instead of answering. A
/// server that closes with the request unread sends a reset, not a FIN.
fn closed_before_response(e: &hyper::Error) -> bool {
    use std::error::Error as _;
    if e.is_incomplete_message() {
        return true;
    }
    let mut source = e.source();
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<io::Error>() {
            return matches!(
                io.kind(),
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionAborted
            );
        }
        source = s.source();
    }
    false
}

/// Why no connection could be had. Nothing was sent: always safe to retry.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("connect failed: {0}")]
    Io(#[from] io::Error),
    #[error("connect timed out after {0:?}")]
    Timeout(Duration),
    #[error("HTTP/1.1 handshake failed: {0}")]
    Handshake(#[source] hyper::Error),
}

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The request was (at least partly) sent.
    #[error(transparent)]
    Exchange(hyper::Error),
    /// A kept-alive connection closed after the request was written and
    /// before any response byte: the server most likely closed it as the
    /// request arrived (its idle timeout, or it stopped). An idempotent
    /// request may be sent again (RFC 9112 §9.3.1).
    #[error("kept-alive connection closed before a response: {0}")]
    Closed(hyper::Error),
}

/// The idle connections of one server.
#[derive(Debug, Default)]
pub struct ServerConnections {
    idle: Mutex<Vec<Idle>>,
}

#[derive(Debug)]
struct Idle {
    sender: SendRequest<RequestBody>,
    since: Instant,
}

impl ServerConnections {
    fn pop(&self) -> Option<Idle> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    fn push(&self, sender: SendRequest<RequestBody>, settings: &ConnSettings) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() >= settings.max_idle {
            return;
        }
        let now = Instant::now();
        // The oldest are at the bottom; drop those past the idle timeout.
        let expired = idle
            .iter()
            .take_while(|i| now.duration_since(i.since) > settings.idle_timeout)
            .count();
        if expired > 0 {
            idle.drain(..expired);
        }
        idle.push(Idle { sender, since: now });
    }

    /// Sends `req` to `addr` on an idle connection, or a new one. A request
    /// that a reused connection could not take (the server had just closed
    /// it) is sent again on a new one: it never left weir. So is a bodyless
    /// read written to a connection that had been idle long enough for the
    /// server's keep-alive timeout to close it as the request arrived.
    pub async fn send(
        self: &Arc<Self>,
        addr: SocketAddr,
        settings: &ConnSettings,
        mut req: Request<RequestBody>,
    ) -> Result<Response<UpstreamBody>, SendError> {
        while let Some(idle) = self.pop() {
            let idle_for = idle.since.elapsed();
            if idle.sender.is_closed() || idle_for > settings.idle_timeout {
                continue;
            }
            let mut sender = idle.sender;
            if sender.ready().await.is_err() {
                continue;
            }
            // Copying the head costs a header-map clone, so only where the
            // race is possible: under load connections idle for microseconds.
            let copy = (idle_for >= MAY_BE_CLOSED_AFTER)
                .then(|| replayable_copy(&req))
                .flatten();
            match sender.try_send_request(req).await {
                Ok(resp) => return Ok(self.wrap(resp, sender, settings)),
                Err(mut e) => match e.take_message() {
                    Some(unsent) => req = unsent,
                    None => {
                        let e = e.into_error();
                        if !closed_before_response(&e) {
                            return Err(SendError::Exchange(e));
                        }
                        let Some(copy) = copy else {
                            return Err(SendError::Closed(e));
                        };
                        tracing::debug!(%addr, "kept-alive connection closed; resending on a new one");
                        req = copy;
                        break;
                    }
                },
            }
        }
        let mut sender = connect(addr, settings.connect_timeout).await?;
        match sender.send_request(req).await {
            Ok(resp) => Ok(self.wrap(resp, sender, settings)),
            Err(e) => Err(SendError::Exchange(e)),
        }
    }

    fn wrap(
        self: &Arc<Self>,
        resp: Response<Incoming>,
        sender: SendRequest<RequestBody>,
        settings: &ConnSettings,
    ) -> Response<UpstreamBody> {
        // A switched protocol owns the connection now; `Connection: close`
        // means the server will not take another request on it.
        let reusable = resp.status() != StatusCode::SWITCHING_PROTOCOLS
            && !resp
                .headers()
                .get(http::header::CONNECTION)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")));
        let back = reusable.then(|| Return {
            home: self.clone(),
            sender,
            settings: *settings,
        });
        resp.map(|inner| UpstreamBody { inner, back })
    }
}

/// Opens a connection and starts its driving task.
async fn connect(
    addr: SocketAddr,
    timeout: Duration,
) -> Result<SendRequest<RequestBody>, ConnectError> {
    let stream = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Err(_) => return Err(ConnectError::Timeout(timeout)),
        Ok(r) => r?,
    };
    stream.set_nodelay(true)?;
    let (sender, conn) = http1::Builder::new()
        .handshake(TokioIo::new(stream))
        .await
        .map_err(ConnectError::Handshake)?;
    tokio::spawn(async move {
        // Errors surface on the request that was using the connection.
        let _ = conn.with_upgrades().await;
    });
    Ok(sender)
}

/// Where a connection goes when its response body ends.
struct Return {
    home: Arc<ServerConnections>,
    sender: SendRequest<RequestBody>,
    settings: ConnSettings,
}

/// A response body from an upstream server. When it ends cleanly its
/// connection goes back to the server's idle stack; dropped early, the
/// connection is closed (hyper cannot reuse a half-read one).
pub struct UpstreamBody {
    inner: Incoming,
    back: Option<Return>,
}

impl UpstreamBody {
    fn release(&mut self) {
        if let Some(r) = self.back.take() {
            r.home.push(r.sender, &r.settings);
        }
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        // An empty body (204, 304, HEAD, `Content-Length: 0`) may never be
        // polled: it is complete as it stands.
        if self.inner.is_end_stream() {
            self.release();
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        match &polled {
            None => self.release(),
            Some(Ok(_)) if self.inner.is_end_stream() => self.release(),
            Some(Err(_)) => self.back = None,
            Some(Ok(_)) => {}
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
