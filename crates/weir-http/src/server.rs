//! HTTP/1.1 towards clients on plain TCP: request heads in, request bodies
//! decoded as the proxy reads them, responses out, and the connection's life
//! between requests (keep-alive, pipelining, `Expect: 100-continue`,
//! upgrades, closing when the tracker asks).
//!
//! hyper's server still serves TLS and HTTP/2 connections. For plain
//! HTTP/1 (the traffic behind a load balancer, and most of any flood) it
//! was the largest cost left in a proxied request, and its per-connection
//! state (buffers, dispatcher, a task-sized future) was memory touched per
//! request, which at 1,000 busy connections missed the cache
//! (bench/README.md, "Client HTTP/1"). Here, as in nginx:
//! - a connection idle for a second holds no buffer: the tracker's sweep
//!   tells it to let go, and its client's next bytes allocate a new one;
//! - the response head and its first body bytes leave in one write;
//! - the request's header values are slices of the bytes read, not copies.
//!
//! Parsing is httparse's, the parser hyper uses; body framing is shared
//! with the upstream side ([`crate::framing`]).

use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use smallvec::SmallVec;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use crate::BoxError;
use crate::conn::{Command, ConnState, RequestInProgress, close_grace};
use crate::fields::ReceivedFields;
use crate::framing::{
    Chunk, FieldRole, Framing, FramingError, HopFields, chunk_size_line, decode_chunk,
    decode_chunk_until_data, take_up_to, write_content_length, write_field,
};

/// Free space a read needs before the buffer grows: a head fits in one
/// read; a large upload streams in reads of up to `BODY_READ`.
const HEAD_READ: usize = 4 * 1024;
const BODY_READ: usize = 32 * 1024;
/// Header slots on the stack; a configured `max_headers` above this parses
/// into a heap table.
const STACK_HEADERS: usize = 100;
/// How long a closing connection with unread input keeps reading (and
/// discarding) it, so that its close is a FIN after the response rather
/// than a reset that can destroy the response in the client's buffer.
const LINGER: Duration = Duration::from_secs(1);
/// Fields `upstream::forward` may add to a request (X-Forwarded-*,
/// X-Real-IP, Via, Forwarded).
const FORWARDING_ROOM: usize = 6;
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Why a client connection ended in error.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("request head larger than the limit, or too many fields")]
    HeadTooLarge,
    #[error("malformed request: {0}")]
    Malformed(&'static str),
    /// A `Transfer-Encoding` other than one `chunked`.
    #[error("transfer codings other than chunked are not supported")]
    UnsupportedCoding,
    #[error("connection closed in the middle of a request head")]
    HeadCut,
    #[error("connection closed in the middle of a request body")]
    BodyCut,
    #[error("client I/O: {0}")]
    Io(#[from] io::Error),
}

impl ClientError {
    /// The `kind` label of `weir_connection_errors_total`.
    pub fn label(&self) -> &'static str {
        match self {
            ClientError::HeadTooLarge => "header_too_large",
            ClientError::Malformed(_) => "bad_request",
            ClientError::UnsupportedCoding => "unsupported_coding",
            ClientError::HeadCut | ClientError::BodyCut => "client_closed",
            ClientError::Io(_) => "io",
        }
    }

    /// The status of the reply a client gets before the close, if any.
    pub fn reply_status(&self) -> Option<StatusCode> {
        match self {
            ClientError::HeadTooLarge => Some(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE),
            ClientError::Malformed(_) => Some(StatusCode::BAD_REQUEST),
            ClientError::UnsupportedCoding => Some(StatusCode::NOT_IMPLEMENTED),
            _ => None,
        }
    }
}

impl From<FramingError> for ClientError {
    fn from(e: FramingError) -> Self {
        ClientError::Malformed(e.0)
    }
}

/// Request-head limits, from the `[limits]` section.
#[derive(Debug, Clone, Copy)]
pub struct HeadLimits {
    pub max_bytes: usize,
    pub max_headers: usize,
}

/// What serves the requests of one connection: weir's proxy. The codec
/// hands it each request as its head is parsed and writes the answer; it
/// knows nothing of what happens in between.
pub trait Handler {
    /// The request body the handler reads, made from the codec's own.
    type RequestBody: From<EdgeBody>;
    /// The response body the codec writes.
    type ResponseBody: Outgoing;

    /// Serves one request. Never fails: every outcome is a response.
    /// (Boxed: the answer passes through the connection's future, whose
    /// memory is cold when many connections are busy; a pointer moves
    /// there instead of the response.) The future does not borrow the
    /// handler: hyper's connections need it to stand alone.
    fn handle(
        &self,
        req: Request<Self::RequestBody>,
    ) -> impl Future<Output = Box<Response<Self::ResponseBody>>> + Send + use<Self>;

    /// The connection gave its buffers back after being idle a while.
    fn buffers_released(&self) {}

    /// The answer to a request head the codec could not read (its status is
    /// `error.reply_status()`), written before the connection closes. `None`: the
    /// codec's own, an empty body.
    fn refusal(&self, error: &ClientError) -> Option<Box<Response<Self::ResponseBody>>> {
        let _ = error;
        None
    }
}

/// What the codec needs of a response body besides its frames.
pub trait Outgoing: Body<Data = Bytes> + Unpin {
    /// Upstream fields forwarded as received, written after the map's.
    fn received_fields(&self) -> Option<&ReceivedFields>;
    /// Ends a body the response does not carry (an answer to `HEAD`, a
    /// 204 or 304): complete, not abandoned by the client.
    fn not_sent(&mut self);
}

/// The socket and its read side. Shared by the connection's loop and the
/// request body the proxy is reading; both run on the connection's task, so
/// the lock is never contended.
struct Wire {
    stream: TcpStream,
    /// Bytes read and not yet consumed; unallocated while idle.
    buf: BytesMut,
    /// What is still to come of the current request's body.
    body: Framing,
    /// `100 Continue` owed before the body is first read: bytes sent so far.
    continue_owed: Option<usize>,
    /// Told when writes stall and progress (the send timeout).
    state: Arc<ConnState>,
}

type SharedWire = Arc<Mutex<Wire>>;

fn lock(wire: &SharedWire) -> MutexGuard<'_, Wire> {
    wire.lock().unwrap_or_else(|p| p.into_inner())
}

impl Wire {
    fn shared(stream: TcpStream, state: &Arc<ConnState>) -> SharedWire {
        Arc::new(Mutex::new(Wire {
            stream,
            buf: BytesMut::new(),
            body: Framing::Empty,
            continue_owed: None,
            state: state.clone(),
        }))
    }

    /// Reads into `buf`, first making room for `want` more bytes when little
    /// is free. (tokio's `poll_read` clears the socket's readiness after a
    /// short read, so an idle wait costs no extra system call.)
    fn poll_fill(&mut self, want: usize, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < want / 4 {
            self.buf.reserve(want);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.buf)
    }

    /// Decodes what the buffer holds of the body: a piece of data, or
    /// `None` when more input is needed or the body has ended.
    fn decode_body(&mut self) -> Result<Option<Bytes>, FramingError> {
        match &mut self.body {
            Framing::Length(left) if *left > 0 && !self.buf.is_empty() => {
                Ok(Some(take_up_to(&mut self.buf, left)))
            }
            Framing::Chunked(chunk) => {
                let data = decode_chunk(chunk, &mut self.buf)?;
                // The end is seen with the last data, not on one more poll.
                decode_chunk_until_data(chunk, &mut self.buf)?;
                Ok(data)
            }
            _ => Ok(None),
        }
    }

    /// Whether the rest of the request body is here (or taken): then the
    /// connection can be kept past an answer given before it was read.
    /// Decodes a copy of the buffer, so a proxy still reading loses nothing.
    fn body_ends_in_buffer(&self) -> bool {
        match self.body {
            Framing::Length(left) => self.buf.len() as u64 >= left,
            Framing::Chunked(chunk) if chunk != Chunk::Done => {
                let (mut chunk, mut buf) = (chunk, self.buf.clone());
                loop {
                    match decode_chunk(&mut chunk, &mut buf) {
                        Ok(Some(_)) => {}
                        Ok(None) => return chunk == Chunk::Done,
                        Err(_) => return false,
                    }
                }
            }
            other => other.is_end(),
        }
    }

    /// Discards what the buffer holds of the body; true once it has ended.
    fn skip_body(&mut self) -> bool {
        while let Ok(Some(_)) = self.decode_body() {}
        self.body.is_end()
    }
}

/// A request body, read from the client connection as the proxy polls it.
pub struct EdgeBody {
    wire: SharedWire,
}

impl Body for EdgeBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut guard = lock(&self.wire);
        let w = &mut *guard;
        while let Some(sent) = w.continue_owed {
            match ready!(Pin::new(&mut w.stream).poll_write(cx, &CONTINUE[sent..])) {
                Ok(0) => {
                    return Poll::Ready(Some(
                        Err(io::Error::from(io::ErrorKind::WriteZero).into()),
                    ));
                }
                Ok(n) if sent + n == CONTINUE.len() => w.continue_owed = None,
                Ok(n) => w.continue_owed = Some(sent + n),
                Err(e) => return Poll::Ready(Some(Err(e.into()))),
            }
        }
        loop {
            match w.decode_body() {
                Ok(Some(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(None) if w.body.is_end() => return Poll::Ready(None),
                Ok(None) => {}
                Err(e) => return Poll::Ready(Some(Err(ClientError::from(e).into()))),
            }
            match ready!(w.poll_fill(BODY_READ, cx)) {
                Ok(0) => return Poll::Ready(Some(Err(ClientError::BodyCut.into()))),
                Ok(_) => {}
                Err(e) => return Poll::Ready(Some(Err(e.into()))),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        lock(&self.wire).body.is_end()
    }

    fn size_hint(&self) -> SizeHint {
        match lock(&self.wire).body {
            Framing::Length(n) => SizeHint::with_exact(n),
            Framing::Empty | Framing::Chunked(Chunk::Done) => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

/// An upgraded client connection: the socket, and the bytes read past the
/// request's head.
type Handoff = (TcpStream, Bytes);

/// The client's side of an upgrade (a WebSocket), for the proxy to tunnel
/// once the upstream has agreed.
pub enum ClientUpgrade {
    Edge(oneshot::Receiver<Handoff>),
    Hyper(hyper::upgrade::OnUpgrade),
}

/// Carries the receiving end of an upgrade in a request's extensions
/// (which must be `Clone`).
#[derive(Clone)]
struct UpgradeSlot(Arc<Mutex<Option<oneshot::Receiver<Handoff>>>>);

impl ClientUpgrade {
    /// Takes the request's upgrade, whichever server read it.
    pub fn on<B>(req: &mut Request<B>) -> ClientUpgrade {
        if let Some(slot) = req.extensions_mut().remove::<UpgradeSlot>()
            && let Some(rx) = slot.0.lock().ok().and_then(|mut r| r.take())
        {
            return ClientUpgrade::Edge(rx);
        }
        ClientUpgrade::Hyper(hyper::upgrade::on(req))
    }

    /// Copies both ways between the client and `upstream` until either side
    /// closes; `early` (what the server sent after its `101`) goes first.
    pub async fn tunnel(self, mut upstream: TcpStream, early: Bytes) {
        match self {
            ClientUpgrade::Edge(rx) => {
                let Ok((mut client, pending)) = rx.await else {
                    return;
                };
                // Bytes the client sent after its request head were read
                // with it; they are the tunnel's first.
                if !pending.is_empty() && upstream.write_all(&pending).await.is_err() {
                    return;
                }
                relay(&mut client, &mut upstream, &early).await;
            }
            ClientUpgrade::Hyper(on) => {
                if let Ok(client) = on.await {
                    let mut client = hyper_util::rt::TokioIo::new(client);
                    relay(&mut client, &mut upstream, &early).await;
                }
            }
        }
    }
}

/// Writes `early` to the client, then copies both ways until either side
/// closes.
async fn relay<C>(client: &mut C, upstream: &mut TcpStream, early: &[u8])
where
    C: tokio::io::AsyncRead + AsyncWrite + Unpin,
{
    if early.is_empty() || client.write_all(early).await.is_ok() {
        let _ = tokio::io::copy_bidirectional(client, upstream).await;
    }
}

/// A parsed request head, ready for the handler.
struct Head<B> {
    request: Request<B>,
    /// The client allows another request on the connection after this one.
    keep_alive: bool,
    head_request: bool,
    upgrade: Option<oneshot::Sender<Handoff>>,
}

/// A request being handled: the handler's future, and what the loop needs
/// of the request to write the answer and go on.
struct Handling<F> {
    handling: Pin<Box<F>>,
    /// Finished when the response is written, or the request dropped.
    _in_progress: RequestInProgress,
    version: Version,
    keep_alive: bool,
    head_request: bool,
    upgrade: Option<oneshot::Sender<Handoff>>,
}

/// Hands `head`'s request to the handler. Not async: the head and the
/// request (~700 bytes) are not kept in the connection's task across the
/// awaits that follow, and an idle connection's task is that much smaller
/// (10,000 idle connections are 10,000 of it: bench/README.md, "Idle
/// memory").
fn start<H: Handler>(
    head: Head<H::RequestBody>,
    handler: &H,
    state: &Arc<ConnState>,
) -> Handling<impl Future<Output = Box<Response<H::ResponseBody>>> + Send + use<H>> {
    let Head {
        request,
        keep_alive,
        head_request,
        upgrade,
    } = head;
    let version = request.version();
    let in_progress = state.start_request(false);
    // Boxed: an idle connection's task then holds a pointer, not the
    // request's state. The box is allocated before the future is made, so
    // that it is made in place: `Box::pin(future)` copied all of its 2.4
    // KB, most of it not yet used, into memory that is cold with many
    // connections busy (a third of weir's cache misses).
    let handling = Box::into_pin(Box::write(Box::new_uninit(), handler.handle(request)));
    Handling {
        handling,
        _in_progress: in_progress,
        version,
        keep_alive,
        head_request,
        upgrade,
    }
}

/// What the connection does once a response is written.
enum After {
    /// Reads the next request.
    Next,
    /// Closes: the response or a command said so, or a `101` came without
    /// an upgrade to hand over.
    Close,
    /// Hands the connection to the upgrade's tunnel.
    Upgrade(oneshot::Sender<Handoff>),
    /// Closes at once: the request's body was not read, and is not here to
    /// be skipped.
    Unread,
}

impl After {
    fn response(
        wire: &SharedWire,
        state: &ConnState,
        written: Written,
        is_101: bool,
        upgrade: Option<oneshot::Sender<Handoff>>,
    ) -> After {
        if is_101 {
            return upgrade.map_or(After::Close, After::Upgrade);
        }
        if written.close {
            return After::Close;
        }
        // A request body the proxy did not read (a rejection, an early
        // answer) is skipped if it is already here.
        if !lock(wire).skip_body() {
            return After::Unread;
        }
        if state.command() != Command::None {
            return After::Close;
        }
        After::Next
    }
}

/// Serves HTTP/1 on `stream` until the client leaves, an error, or the
/// tracker's command (`state`) closes it.
pub async fn serve<H: Handler>(
    stream: TcpStream,
    state: &Arc<ConnState>,
    handler: H,
    limits: HeadLimits,
) -> Result<(), ClientError> {
    let wire = Wire::shared(stream, state);
    let mut refused = None;
    loop {
        // The next head, handed to the handler (not in an await: `start`).
        // The request is in progress on the connection (for its
        // supervisor) until its response is written, whatever the handler.
        let mut h = match next_head(&wire, state, limits, &handler).await {
            Ok(Some(head)) => start(head, &handler, state),
            Ok(None) => break,
            Err(e) => {
                refused = Some(e);
                break;
            }
        };
        // A client that closes while its request is handled (its body read
        // whole) has gone: the request is dropped, as hyper does, freeing its
        // queue slot or upstream connection.
        let watch_close = lock(&wire).body.is_end();
        let response = tokio::select! {
            biased;
            r = &mut h.handling => r,
            _ = commanded(state, Command::Abort) => return Ok(()),
            () = client_gone(&wire), if watch_close => return Ok(()),
        };
        drop(h.handling);
        let is_101 = response.status() == StatusCode::SWITCHING_PROTOCOLS;
        let keep_alive = h.keep_alive && (is_101 || stays_open(&wire, state));
        let written = tokio::select! {
            biased;
            w = write_response(&wire, response, h.version, h.head_request, keep_alive) => w?,
            _ = commanded(state, Command::Abort) => return Ok(()),
        };
        match After::response(&wire, state, written, is_101, h.upgrade) {
            After::Next => {}
            After::Close => break,
            After::Upgrade(tx) => {
                hand_over(wire, tx);
                return Ok(());
            }
            After::Unread => {
                close(&wire, true).await;
                return Ok(());
            }
        }
    }
    if let Some(e) = refused {
        // Boxed: rare, and the task would carry its state on every connection.
        Box::pin(refuse(&wire, &handler, &e)).await;
        return Err(e);
    }
    let unread = !lock(&wire).buf.is_empty();
    close(&wire, unread).await;
    Ok(())
}

/// Whether the connection stays open after the answer being written, so
/// the answer may say keep-alive: not when a command (a drain, an idle or
/// shedding close) closes it, nor when the answer came before the request
/// body was read and the rest is not here to skip. A client must not send
/// its next request into a closing socket.
fn stays_open(wire: &SharedWire, state: &ConnState) -> bool {
    state.command() == Command::None && lock(wire).body_ends_in_buffer()
}

/// Answers a head the codec could not read (when it has an answer: a
/// reset or a cut head gets none) and closes: the handler's refusal, or a
/// bare status line.
async fn refuse<H: Handler>(wire: &SharedWire, handler: &H, e: &ClientError) {
    let Some(status) = e.reply_status() else {
        return;
    };
    match handler.refusal(e) {
        Some(resp) => {
            let _ = write_response(wire, resp, Version::HTTP_11, false, false).await;
        }
        None => {
            let answer = format!(
                "HTTP/1.1 {} {}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                status.as_str(),
                status.canonical_reason().unwrap_or("")
            );
            let _ = write_all(wire, &mut [IoSlice::new(answer.as_bytes())]).await;
        }
    }
    close(wire, true).await;
}

/// Gives the socket to the tunnel waiting for it (`ClientUpgrade::Edge`).
fn hand_over(wire: SharedWire, tx: oneshot::Sender<Handoff>) {
    // The request (and its body) is gone, so the loop holds the only
    // reference; if not, the upgrade fails and the connection closes.
    if let Ok(m) = Arc::try_unwrap(wire) {
        let w = m.into_inner().unwrap_or_else(|p| p.into_inner());
        let _ = tx.send((w.stream, w.buf.freeze()));
    }
}

/// Resolves when the tracker gives a command at least as strong as `min`.
async fn commanded(state: &ConnState, min: Command) -> Command {
    poll_fn(|cx| state.poll_command(min, cx)).await
}

/// Resolves if the client closes (or resets) the connection. Bytes it sends
/// meanwhile (a pipelined request) are kept for later, and the watch stops.
async fn client_gone(wire: &SharedWire) {
    let mut watching = true;
    poll_fn(|cx| {
        if !watching {
            return Poll::Pending;
        }
        let mut w = lock(wire);
        if !w.buf.is_empty() {
            watching = false;
            return Poll::Pending;
        }
        if ready!(w.stream.poll_read_ready(cx)).is_err() {
            return Poll::Ready(());
        }
        match ready!(w.poll_fill(HEAD_READ, cx)) {
            Ok(0) | Err(_) => Poll::Ready(()),
            Ok(_) => {
                watching = false;
                Poll::Pending
            }
        }
    })
    .await
}

/// Reads the next request head. `None`: the client closed between
/// requests, or the connection is to close (see [`close_grace`]).
async fn next_head<H: Handler>(
    wire: &SharedWire,
    state: &ConnState,
    limits: HeadLimits,
    handler: &H,
) -> Result<Option<Head<H::RequestBody>>, ClientError> {
    let mut deferred: Option<tokio::time::Instant> = None;
    loop {
        let idle = {
            let mut w = lock(wire);
            if !w.buf.is_empty()
                && let Some(head) = parse_head(wire, &mut w, limits)?
            {
                return Ok(Some(head));
            }
            w.buf.is_empty()
        };
        // Told to close: a head on its way is finished; an idle connection
        // may wait for one more request (`close_grace`), else closes now.
        let min = if idle && deferred.is_none() {
            Command::Graceful
        } else {
            Command::Abort
        };
        tokio::select! {
            biased;
            ready = poll_fn(|cx| lock(wire).stream.poll_read_ready(cx)) => {
                ready?;
                let read = poll_fn(|cx| match lock(wire).poll_fill(HEAD_READ, cx) {
                    // Readiness was stale: wait again.
                    Poll::Pending => Poll::Ready(None),
                    Poll::Ready(r) => Poll::Ready(Some(r)),
                })
                .await;
                if !still_reading(read, idle, state)? {
                    return Ok(None);
                }
            }
            cmd = commanded(state, min) => {
                if cmd == Command::Abort {
                    return Ok(None);
                }
                match close_grace(state) {
                    Some(grace) => deferred = Some(tokio::time::Instant::now() + grace),
                    None => return Ok(None),
                }
            }
            _ = tokio::time::sleep_until(deferred.unwrap_or_else(tokio::time::Instant::now)), if idle && deferred.is_some() => {
                return Ok(None);
            }
            // Idle for a while (the sweep says): the buffer goes back to the
            // allocator, and the connection costs its socket and a few
            // hundred bytes until its client's next bytes.
            () = poll_fn(|cx| state.poll_release(cx)), if idle => release_buffer(wire, handler),
        }
    }
}

/// What a read while waiting for a head says: go on (`true`), the client
/// left between requests (`false`: it closed, or reset, which between
/// requests is leaving too), or it cut a head short. `None`: readiness was
/// stale, nothing read.
fn still_reading(
    read: Option<std::io::Result<usize>>,
    idle: bool,
    state: &ConnState,
) -> Result<bool, ClientError> {
    match read {
        None => Ok(true),
        Some(Ok(0)) if idle => Ok(false),
        Some(Ok(0)) => Err(ClientError::HeadCut),
        Some(Ok(_)) => {
            state.bytes_read();
            Ok(true)
        }
        Some(Err(_)) if idle => Ok(false),
        Some(Err(e)) => Err(e.into()),
    }
}

/// Gives an idle connection's read buffer back to the allocator.
fn release_buffer<H: Handler>(wire: &SharedWire, handler: &H) {
    let mut w = lock(wire);
    if w.buf.is_empty() && w.buf.capacity() > 0 {
        w.buf = BytesMut::new();
        handler.buffers_released();
    }
}

/// A request head as httparse found it: its length, and where its target
/// is in the buffer (nothing copied; cut once the head is frozen). Its
/// fields are in the [`RawFields`] it was scanned into.
struct RawHead {
    len: usize,
    method: Method,
    version: Version,
    path: std::ops::Range<usize>,
}

/// A head's fields as scanned: each name, and where its value is in the
/// buffer. Lent to [`scan_head`] and [`decide_head`] by the caller, not
/// returned in the head: 16 slots are 800 bytes, and each move of the head
/// copied them all (four moves a request, some 500 instructions).
type RawFields = SmallVec<[(HeaderName, usize, usize); 16]>;

/// Finds the request head at the start of `buf`, its fields put in
/// `fields`; `None` if more bytes are needed. Field names are taken now
/// (they are few and short); the target and values are left as ranges of
/// `buf`.
fn scan_head(
    buf: &[u8],
    limits: HeadLimits,
    fields: &mut RawFields,
) -> Result<Option<RawHead>, ClientError> {
    let mut stack = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; STACK_HEADERS];
    let mut heap = Vec::new();
    let slots = if limits.max_headers <= STACK_HEADERS {
        &mut stack[..limits.max_headers]
    } else {
        heap.resize_with(limits.max_headers, MaybeUninit::uninit);
        &mut heap[..]
    };
    let mut parsed = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut parsed,
        buf,
        slots,
    ) {
        Ok(httparse::Status::Complete(len)) if len > limits.max_bytes => {
            return Err(ClientError::HeadTooLarge);
        }
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= limits.max_bytes => {
            return Err(ClientError::HeadTooLarge);
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(ClientError::HeadTooLarge),
        Err(_) => return Err(ClientError::Malformed("unparsable request head")),
    };
    let method = Method::from_bytes(parsed.method.unwrap_or("").as_bytes())
        .map_err(|_| ClientError::Malformed("invalid method"))?;
    let version = if parsed.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    let base = buf.as_ptr() as usize;
    let path = parsed.path.unwrap_or("");
    let path_at = path.as_ptr() as usize - base;
    fields.clear();
    for h in parsed.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| ClientError::Malformed("invalid header name"))?;
        let start = h.value.as_ptr() as usize - base;
        fields.push((name, start, start + h.value.len()));
    }
    Ok(Some(RawHead {
        len,
        method,
        version,
        path: path_at..path_at + path.len(),
    }))
}

/// A request head read whole: what the codec decided about it, before a
/// request is made of it. What [`read_head`] returns (the fuzz targets'
/// view of the codec).
#[derive(Debug)]
pub struct ReadHead {
    /// Bytes the head took.
    pub len: usize,
    pub method: Method,
    pub version: Version,
    pub uri: Uri,
    /// The fields, without the framing and connection fields spent on them.
    pub headers: HeaderMap,
    /// How the body is delimited.
    pub body: Framing,
    pub keep_alive: bool,
    pub expect_continue: bool,
    pub upgrade: bool,
}

/// Reads the request head at the start of `buf` exactly as a connection
/// does (`None`: more bytes are needed), copying it. For the fuzz targets
/// and tests; a connection reads its own buffer without the copy.
pub fn read_head(buf: &[u8], limits: HeadLimits) -> Result<Option<ReadHead>, ClientError> {
    let mut fields = RawFields::new();
    let Some(raw) = scan_head(buf, limits, &mut fields)? else {
        return Ok(None);
    };
    let head = Bytes::copy_from_slice(&buf[..raw.len]);
    decide_head(raw, &mut fields, head).map(Some)
}

/// Everything the codec decides about a head httparse found: the target,
/// the fields, the body's framing, keep-alive. `head_bytes` is the head
/// itself (values are sliced from it); `fields` are its fields as scanned
/// (taken out).
fn decide_head(
    raw: RawHead,
    fields: &mut RawFields,
    head_bytes: Bytes,
) -> Result<ReadHead, ClientError> {
    let RawHead {
        len,
        method,
        version,
        path: path_range,
    } = raw;
    let uri = Uri::from_maybe_shared(head_bytes.slice(path_range))
        .map_err(|_| ClientError::Malformed("invalid request target"))?;
    let (headers, hop, expect_continue, upgrade) = field_map(fields, &head_bytes)?;
    let body = body_framing(&hop, version)?;
    let HopFields {
        close,
        keep_alive: keep_alive_token,
        ..
    } = hop;
    Ok(ReadHead {
        len,
        method,
        version,
        uri,
        headers,
        body,
        keep_alive: !close && (version == Version::HTTP_11 || keep_alive_token),
        expect_continue,
        upgrade,
    })
}

/// Parses the request head at the start of `w.buf` and removes it; `None`
/// if more bytes are needed.
fn parse_head<B: From<EdgeBody>>(
    wire: &SharedWire,
    w: &mut Wire,
    limits: HeadLimits,
) -> Result<Option<Head<B>>, ClientError> {
    let mut fields = RawFields::new();
    let Some(raw) = scan_head(&w.buf, limits, &mut fields)? else {
        return Ok(None);
    };
    let head_bytes = w.buf.split_to(raw.len).freeze();
    let ReadHead {
        method,
        version,
        uri,
        headers,
        body,
        keep_alive,
        expect_continue,
        upgrade,
        ..
    } = decide_head(raw, &mut fields, head_bytes)?;
    w.continue_owed =
        (expect_continue && version == Version::HTTP_11 && !body.is_end()).then_some(0);
    w.body = body;
    let mut request = Request::new(B::from(EdgeBody { wire: wire.clone() }));
    let head_request = method == Method::HEAD;
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = version;
    *request.headers_mut() = headers;
    let upgrade = upgrade.then(|| {
        let (tx, rx) = oneshot::channel();
        request
            .extensions_mut()
            .insert(UpgradeSlot(Arc::new(Mutex::new(Some(rx)))));
        tx
    });
    Ok(Some(Head {
        request,
        keep_alive,
        head_request,
        upgrade,
    }))
}

/// The head's fields as a map (values sliced from the frozen head, not
/// copied), the framing and connection fields they carry (spent, not put
/// in the map), and whether they ask for `100 Continue` or an upgrade.
fn field_map(
    fields: &mut RawFields,
    head_bytes: &Bytes,
) -> Result<(HeaderMap, HopFields, bool, bool), ClientError> {
    // Room for the forwarding fields the proxy adds: growing the map
    // rehashes it.
    let mut headers = HeaderMap::with_capacity(fields.len() + FORWARDING_ROOM);
    let mut hop = HopFields::default();
    let mut expect_continue = false;
    let mut upgrade = false;
    // Drained, not moved into an iterator: that would copy all 16 slots.
    for (name, start, end) in fields.drain(..) {
        let value = HeaderValue::from_maybe_shared(head_bytes.slice(start..end))
            .map_err(|_| ClientError::Malformed("invalid header value"))?;
        if hop.note(name.as_str().as_bytes(), value.as_bytes())? == FieldRole::Spent {
            continue;
        }
        if name == header::EXPECT {
            expect_continue = value.as_bytes().eq_ignore_ascii_case(b"100-continue");
        } else if name == header::UPGRADE {
            upgrade = true;
        }
        headers.append(name, value);
    }
    Ok((headers, hop, expect_continue, upgrade))
}

/// How the request's body is delimited. RFC 9112 §6.3: both lengths, or a
/// coding other than chunked last, is how requests get smuggled past a
/// proxy; refused, as nginx does.
fn body_framing(hop: &HopFields, version: Version) -> Result<Framing, ClientError> {
    if hop.other_coding {
        return Err(ClientError::UnsupportedCoding);
    }
    match (hop.chunked, hop.content_length) {
        (Some(_), _) if version == Version::HTTP_10 => Err(ClientError::Malformed(
            "Transfer-Encoding in an HTTP/1.0 request",
        )),
        (Some(_), Some(_)) => Err(ClientError::Malformed(
            "both Transfer-Encoding and Content-Length",
        )),
        (Some(false), None) => Err(ClientError::Malformed(
            "Transfer-Encoding not ending in chunked",
        )),
        (Some(true), None) => Ok(Framing::Chunked(Chunk::Size)),
        (None, Some(n)) => Ok(Framing::Length(n)),
        (None, None) => Ok(Framing::Empty),
    }
}

/// How a response is written.
struct Written {
    /// The connection cannot take another request.
    close: bool,
}

/// How a response body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OutFraming {
    None,
    Length(u64),
    Chunked,
    UntilClose,
}

/// How a response's body goes on the wire: none (`HEAD`, 1xx, 204,
/// 304), its exact length, chunked, or until the close (HTTP/1.0 without a
/// length).
fn out_framing(
    status: StatusCode,
    head_request: bool,
    exact: Option<u64>,
    version: Version,
) -> OutFraming {
    let bodyless = head_request
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    if bodyless {
        OutFraming::None
    } else if let Some(n) = exact {
        OutFraming::Length(n)
    } else if version == Version::HTTP_11 {
        OutFraming::Chunked
    } else {
        OutFraming::UntilClose
    }
}

/// Writes the response head and streams its body.
async fn write_response(
    wire: &SharedWire,
    mut response: Box<http::Response<impl Outgoing>>,
    version: Version,
    head_request: bool,
    keep_alive: bool,
) -> Result<Written, ClientError> {
    let status = response.status();
    let exact = response.body().size_hint().exact();
    let framing = out_framing(status, head_request, exact, version);
    let asked_close = response
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| has_token(v.as_bytes(), b"close"));
    let close = !keep_alive || asked_close || framing == OutFraming::UntilClose;
    let mut head = Vec::with_capacity(256 + response.headers().len() * 48);
    let hop = HopFraming {
        version,
        framing,
        close,
    };
    let (map, received) = (response.headers(), response.body().received_fields());
    encode_head(&mut head, status, map, received, hop);
    let body = response.body_mut();
    if framing == OutFraming::None {
        write_all(wire, &mut [IoSlice::new(&head)]).await?;
        body.not_sent();
        return Ok(Written { close });
    }
    let cut = write_body(wire, body, head, framing).await?;
    Ok(Written {
        close: close || cut,
    })
}

/// Streams `body` after `head` (which leaves with the first bytes, or
/// alone when they are not ready), framed as `framing`. `true`: the
/// connection must close (the body was cut, or longer or shorter than it
/// said).
async fn write_body(
    wire: &SharedWire,
    body: &mut impl Outgoing,
    head: Vec<u8>,
    framing: OutFraming,
) -> Result<bool, ClientError> {
    let mut close = false;
    let mut head = Some(head);
    let mut sent: u64 = 0;
    let mut size_line = [0u8; 18];
    loop {
        let next = match poll_fn(|cx| Poll::Ready(Pin::new(&mut *body).poll_frame(cx))).await {
            Poll::Ready(next) => next,
            Poll::Pending => {
                // The body is not ready: the head goes first, alone.
                if let Some(h) = head.take() {
                    write_all(wire, &mut [IoSlice::new(&h)]).await?;
                }
                poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
            }
        };
        let data = match next {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                // Trailers are dropped (few clients ask for them).
                Err(_) => continue,
            },
            None => Bytes::new(),
            Some(Err(_)) => {
                // The client sees the response cut short.
                if let Some(h) = head.take() {
                    write_all(wire, &mut [IoSlice::new(&h)]).await?;
                }
                return Ok(true);
            }
        };
        let ended = body.is_end_stream();
        // More than the length said is cut, and the connection closes.
        let data = match framing {
            OutFraming::Length(n) if sent + data.len() as u64 > n => {
                close = true;
                data.slice(..(n - sent) as usize)
            }
            _ => data,
        };
        sent += data.len() as u64;
        let chunked = (framing == OutFraming::Chunked).then_some(&mut size_line);
        write_all(
            wire,
            &mut wire_parts(head.as_deref(), &data, chunked, ended),
        )
        .await?;
        head = None;
        if ended {
            break;
        }
    }
    // Shorter than it said: the client cannot tell where the next begins.
    Ok(close || matches!(framing, OutFraming::Length(n) if sent != n))
}

/// What one write of a body sends, in order: the head if it has not left
/// yet, then `data`, framed as a chunk (its size line written into
/// `chunked`'s buffer) with the last chunk after it when the body `ended`.
fn wire_parts<'a>(
    head: Option<&'a [u8]>,
    data: &'a [u8],
    chunked: Option<&'a mut [u8; 18]>,
    ended: bool,
) -> SmallVec<[IoSlice<'a>; 5]> {
    let mut parts: SmallVec<[IoSlice<'a>; 5]> = SmallVec::new();
    parts.extend(head.map(IoSlice::new));
    let Some(size_line) = chunked else {
        parts.push(IoSlice::new(data));
        return parts;
    };
    if !data.is_empty() {
        parts.push(IoSlice::new(chunk_size_line(size_line, data.len())));
        parts.push(IoSlice::new(data));
        parts.push(IoSlice::new(b"\r\n"));
    }
    if ended {
        parts.push(IoSlice::new(b"0\r\n\r\n"));
    }
    parts
}

/// Whether a comma-separated header value holds `token` (any case).
fn has_token(value: &[u8], token: &[u8]) -> bool {
    value
        .split(|b| *b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

/// How this hop sends a response: in the client's version, with the body's
/// framing, and whether the connection closes after it.
#[derive(Clone, Copy)]
struct HopFraming {
    version: Version,
    framing: OutFraming,
    close: bool,
}

/// The response head: status line, the response's fields but those that
/// frame this hop (those in its map, then those `received` from the
/// upstream as they came), then this hop's framing.
fn encode_head(
    out: &mut Vec<u8>,
    status: StatusCode,
    map: &HeaderMap,
    received: Option<&ReceivedFields>,
    HopFraming {
        version,
        framing,
        close,
    }: HopFraming,
) {
    out.extend_from_slice(if version == Version::HTTP_10 {
        b"HTTP/1.0 "
    } else {
        b"HTTP/1.1 "
    });
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let upgrade = status == StatusCode::SWITCHING_PROTOCOLS;
    // A length the response declares is kept where no body is sent (HEAD,
    // 304): it describes the resource.
    let keep_length = framing == OutFraming::None
        && status != StatusCode::NO_CONTENT
        && !status.is_informational();
    for (name, value) in map {
        let skip = if *name == header::CONTENT_LENGTH {
            !keep_length
        } else {
            *name == header::TRANSFER_ENCODING || (*name == header::CONNECTION && !upgrade)
        };
        if skip {
            continue;
        }
        write_field(out, name.as_str().as_bytes(), value.as_bytes());
    }
    let mut has_date = false;
    if let Some(fields) = received {
        fields.write_to(out);
        has_date = fields.has_date();
        if keep_length && let Some(n) = fields.declared_length() {
            write_content_length(out, n);
        }
    }
    if !has_date && !map.contains_key(header::DATE) {
        out.extend_from_slice(b"date: ");
        http_date(out);
        out.extend_from_slice(b"\r\n");
    }
    match framing {
        OutFraming::Length(n) => write_content_length(out, n),
        OutFraming::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        OutFraming::None | OutFraming::UntilClose => {}
    }
    if !upgrade && close {
        out.extend_from_slice(b"connection: close\r\n");
    } else if !upgrade && version == Version::HTTP_10 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Appends the current time as an HTTP date, formatted once a second per
/// thread (as hyper does).
fn http_date(out: &mut Vec<u8>) {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};
    thread_local! {
        static CACHED: RefCell<(u64, String)> = const { RefCell::new((0, String::new())) };
    }
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != secs || c.1.is_empty() {
            *c = (secs, httpdate::fmt_http_date(now));
        }
        out.extend_from_slice(c.1.as_bytes());
    });
}

/// Writes every byte of `bufs`.
async fn write_all(wire: &SharedWire, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        let n = poll_fn(|cx| {
            let mut w = lock(wire);
            let polled = Pin::new(&mut w.stream).poll_write_vectored(cx, bufs);
            match polled {
                Poll::Pending => w.state.write_blocked(),
                Poll::Ready(Ok(n)) if n > 0 => w.state.write_progressed(),
                Poll::Ready(_) => {}
            }
            polled
        })
        .await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut bufs, n);
    }
    Ok(())
}

/// Ends the connection with a FIN. With `unread` input, the input is read
/// and dropped for a moment first, so the close does not turn into a reset
/// that could destroy the response before the client reads it.
async fn close(wire: &SharedWire, unread: bool) {
    let _ = socket2::SockRef::from(&lock(wire).stream).shutdown(std::net::Shutdown::Write);
    if !unread {
        return;
    }
    let drained = async {
        // On the heap: a task is as large as its largest state, and every
        // connection's task would carry it.
        let mut scratch = vec![0u8; 4096];
        loop {
            let ready = poll_fn(|cx| lock(wire).stream.poll_read_ready(cx)).await;
            if ready.is_err() {
                return;
            }
            match lock(wire).stream.try_read(&mut scratch) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drained).await;
}

#[cfg(test)]
mod tests;
