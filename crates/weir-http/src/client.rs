//! HTTP/1.1 towards an upstream server on one connection: the request head
//! and body out, the response head in, and the response body's framing
//! (RFC 9112 §6-7) decoded as the client reads it.
//!
//! hyper's client (`hyper::client::conn::http1`) is not used: it drives each
//! connection from a task of its own, so every request crossed to that task
//! through a channel, its response came back through a oneshot, and every
//! body chunk through a third hand-off, with both tasks woken for each. That
//! was a third of a proxied request's instructions, and at 1,000
//! connections the hand-offs missed the cache (bench/README.md, "Upstream
//! HTTP/1"). Here the task that serves the client does the upstream I/O
//! itself, as nginx does in its one event loop. Parsing is httparse's, the
//! parser hyper uses; this module owns framing and connection reuse only.

use std::future::poll_fn;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, StatusCode, Version};
use http_body::Body;
use http_body_util::BodyExt as _;
use smallvec::SmallVec;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::BoxError;
use crate::fields::ReceivedFields;
pub use crate::framing::{Chunk, Framing};
use crate::framing::{
    FieldRole, FramingError, HopFields, chunk_size_line, decode_chunk, decode_chunk_until_data,
    take_up_to, write_content_length, write_field,
};

/// Largest response head read (hyper's client allows ~400 KiB; an app that
/// sends more than 64 KiB of headers is broken, not busy).
pub const MAX_HEAD: usize = 64 * 1024;
/// Most header fields in a response head (as hyper's default).
pub const MAX_HEADERS: usize = 100;
/// Free space a read needs before the buffer grows: heads and small bodies
/// fit in one read; a large body streams in reads of up to `BODY_READ`.
const HEAD_READ: usize = 8 * 1024;
const BODY_READ: usize = 32 * 1024;
/// An idle connection keeps a read buffer up to this size; a larger one
/// (after a big body) is let go.
const KEEP_BUFFER: usize = 64 * 1024;

/// A request body the codec can send: frames of bytes, read on the
/// connection's task.
pub trait SendBody: Body<Data = Bytes, Error = BoxError> + Unpin + Send {}

impl<B> SendBody for B where B: Body<Data = Bytes, Error = BoxError> + Unpin + Send {}

/// Why an exchange with an upstream server failed.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// The connection ended (or was reset) before any byte of a response.
    #[error("connection closed before any response byte{}", .0.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    NoResponse(Option<io::Error>),
    /// The connection ended in the middle of a response head or body.
    #[error("connection closed in the middle of a response")]
    Incomplete,
    #[error("upstream I/O: {0}")]
    Io(#[from] io::Error),
    #[error("malformed response head: {0}")]
    Malformed(#[from] httparse::Error),
    #[error("bad response framing: {0}")]
    Framing(&'static str),
    #[error("response head larger than {MAX_HEAD} bytes")]
    HeadTooLarge,
    /// The server took longer than this to answer a request sent whole, or
    /// to take the next piece of its body.
    #[error("no progress within {0:?}")]
    TimedOut(Duration),
    /// The client's request body failed (it stalled past its class's body
    /// timeout, or the client went away).
    #[error("request body: {0}")]
    RequestBody(#[source] BoxError),
}

impl From<FramingError> for ExchangeError {
    fn from(e: FramingError) -> Self {
        ExchangeError::Framing(e.0)
    }
}

/// How far a failed exchange got, which decides whether it may be tried
/// again.
#[derive(Debug)]
pub enum Failure {
    /// The request head could not be written: the server saw no request.
    Unsent(ExchangeError),
    /// The request was (at least partly) sent.
    Sent(ExchangeError),
}

/// A bound that never binds, for [`UpstreamConnection::exchange`]'s callers
/// that bound the whole exchange themselves.
const NO_STALL_BOUND: Duration = Duration::from_secs(365 * 24 * 3600);

/// A parsed response head and what follows it.
#[derive(Debug)]
pub struct ResponseHead {
    pub status: StatusCode,
    pub version: Version,
    /// Fields to read, or (with `received`) only those weir adds.
    pub headers: HeaderMap,
    /// A plain response's fields, forwarded as received ([`crate::fields`]).
    pub received: Option<ReceivedFields>,
    pub framing: Framing,
    /// The connection may take another request once the body is read.
    pub keep_alive: bool,
}

/// How the request body is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RequestFraming {
    None,
    Length(u64),
    Chunked,
}

/// One HTTP/1.1 connection to an upstream server.
#[derive(Debug)]
pub struct UpstreamConnection {
    io: TcpStream,
    /// Bytes read and not yet consumed (a head, body bytes).
    read_buf: BytesMut,
    /// The request head being written (kept: its capacity is reused).
    write_buf: Vec<u8>,
    /// The scheduler whose I/O driver `io` is registered with (see
    /// [`crate::scheduler::run_as_scheduler`]).
    scheduler: usize,
}

impl UpstreamConnection {
    /// A connection over `io`, registered with the calling thread's
    /// scheduler.
    pub fn new(io: TcpStream) -> Self {
        UpstreamConnection {
            io,
            read_buf: BytesMut::new(),
            write_buf: Vec::new(),
            scheduler: crate::scheduler::current_scheduler(),
        }
    }

    /// The scheduler whose I/O driver reports this connection's readiness.
    pub fn scheduler(&self) -> usize {
        self.scheduler
    }

    /// Whether an idle connection can take a request: the server has not
    /// closed it and sent nothing unasked. Costs no system call unless the
    /// socket was reported readable since it was last read dry.
    pub fn is_reusable(&mut self) -> bool {
        if !self.read_buf.is_empty() {
            return false;
        }
        let mut cx = Context::from_waker(Waker::noop());
        match self.io.poll_read_ready(&mut cx) {
            Poll::Pending => true,
            Poll::Ready(Err(_)) => false,
            // Readiness may be left over from the last response; a read
            // that would block settles it.
            Poll::Ready(Ok(())) => {
                let mut probe = [0u8; 1];
                matches!(self.io.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
        }
    }

    /// Makes the connection idle: a large read buffer is let go.
    pub fn park(&mut self) {
        if self.read_buf.capacity() > KEEP_BUFFER {
            self.read_buf = BytesMut::new();
        }
    }

    /// Sends `req` (head and body) and reads the response head. `req`'s
    /// head is only borrowed, so a request that failed unsent (or a bodyless
    /// one) can be sent again; its body is consumed.
    pub async fn exchange<B: SendBody>(
        &mut self,
        req: &mut Request<B>,
    ) -> Result<ResponseHead, Failure> {
        match self.send_request(req, NO_STALL_BOUND).await? {
            Some(head) => Ok(head),
            None => self
                .read_response(req.method() == Method::HEAD)
                .await
                .map_err(Failure::Sent),
        }
    }

    /// The first half of [`UpstreamConnection::exchange`]: sends `req`'s
    /// head and body, failing when a write of the body stalls longer than
    /// `stall` (the server stopped reading). `Some`: the server answered
    /// before the body ended (the rest was not sent, and the connection is
    /// not to be reused).
    pub async fn send_request<B: SendBody>(
        &mut self,
        req: &mut Request<B>,
        stall: Duration,
    ) -> Result<Option<ResponseHead>, Failure> {
        let framing = request_framing(req);
        encode_head(&mut self.write_buf, req, framing);
        if let Err(e) = self.io.write_all(&self.write_buf).await {
            return Err(Failure::Unsent(e.into()));
        }
        let head_request = req.method() == Method::HEAD;
        match framing {
            RequestFraming::None => Ok(None),
            RequestFraming::Length(_) => {
                self.send_body(req.body_mut(), false, head_request, stall)
                    .await
            }
            RequestFraming::Chunked => {
                self.send_body(req.body_mut(), true, head_request, stall)
                    .await
            }
        }
        .map_err(Failure::Sent)
    }

    /// The second half: reads the final response head to a request sent
    /// whole (`head_request`: it was a `HEAD`, so no body follows).
    pub async fn read_response(
        &mut self,
        head_request: bool,
    ) -> Result<ResponseHead, ExchangeError> {
        read_head(&mut self.io, &mut self.read_buf, head_request).await
    }

    /// Streams the request body, watching for a response that comes before
    /// it ends (a 413 or a redirect for an upload the app will not read):
    /// then the rest of the body is not sent, and the connection is not
    /// reused, its request being incomplete.
    async fn send_body<B: SendBody>(
        &mut self,
        body: &mut B,
        chunked: bool,
        head_request: bool,
        stall: Duration,
    ) -> Result<Option<ResponseHead>, ExchangeError> {
        let UpstreamConnection { io, read_buf, .. } = self;
        let (mut rd, mut wr) = io.split();
        let upload = write_body(&mut wr, body, chunked, stall);
        let early = read_head(&mut rd, read_buf, head_request);
        tokio::pin!(upload, early);
        tokio::select! {
            biased;
            sent = &mut upload => sent.map(|()| None),
            head = &mut early => head.map(|mut h| {
                h.keep_alive = false;
                Some(h)
            }),
        }
    }

    /// Polls the next piece of a response body framed as `framing`.
    /// `Ready(None)` at its end.
    pub fn poll_body(
        &mut self,
        framing: &mut Framing,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, ExchangeError>>> {
        loop {
            match framing {
                Framing::Empty | Framing::Length(0) => return Poll::Ready(None),
                Framing::Length(left) => {
                    if !self.read_buf.is_empty() {
                        return Poll::Ready(Some(Ok(take_up_to(&mut self.read_buf, left))));
                    }
                }
                Framing::Chunked(chunk) => match decode_chunk(chunk, &mut self.read_buf) {
                    Ok(Some(data)) => return Poll::Ready(Some(Ok(data))),
                    Ok(None) if *chunk == Chunk::Done => return Poll::Ready(None),
                    Ok(None) => {}
                    Err(e) => return Poll::Ready(Some(Err(e.into()))),
                },
                Framing::UntilClose => {
                    if !self.read_buf.is_empty() {
                        return Poll::Ready(Some(Ok(self.read_buf.split().freeze())));
                    }
                }
            }
            let n =
                match std::task::ready!(poll_fill(&mut self.io, &mut self.read_buf, BODY_READ, cx))
                {
                    Ok(n) => n,
                    Err(e) => return Poll::Ready(Some(Err(e.into()))),
                };
            if n == 0 {
                if *framing == Framing::UntilClose {
                    *framing = Framing::Empty;
                    return Poll::Ready(None);
                }
                return Poll::Ready(Some(Err(ExchangeError::Incomplete)));
            }
        }
    }

    /// Advances a chunked body past what needs no more input (the CRLF after
    /// data, the last chunk, the trailers), so that its end is seen with its
    /// last data rather than on one more poll.
    pub fn settle(&mut self, framing: &mut Framing) {
        // The decoder stops at data (taken only when polled); an error
        // surfaces on the next poll.
        if let Framing::Chunked(chunk) = framing {
            let _ = decode_chunk_until_data(chunk, &mut self.read_buf);
        }
    }

    /// The connection for a tunnel after `101 Switching Protocols`, with any
    /// bytes the server sent after its head.
    pub fn into_tunnel(self) -> (TcpStream, Bytes) {
        (self.io, self.read_buf.freeze())
    }

    /// True when bytes past the response are buffered (the server sent more
    /// than it framed): the connection cannot be trusted with another
    /// request.
    pub fn has_leftover(&self) -> bool {
        !self.read_buf.is_empty()
    }
}

/// Reads into `buf`, first making room for at least `want` more bytes when
/// little is free.
fn poll_fill<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut BytesMut,
    want: usize,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    if buf.capacity() - buf.len() < want / 4 {
        buf.reserve(want);
    }
    tokio_util::io::poll_read_buf(Pin::new(io), cx, buf)
}

/// Reads until a final response head is whole and parses it.
async fn read_head<R: AsyncRead + Unpin>(
    io: &mut R,
    buf: &mut BytesMut,
    head_request: bool,
) -> Result<ResponseHead, ExchangeError> {
    loop {
        if let Some(head) = parse_head(buf, head_request)? {
            return Ok(head);
        }
        match poll_fn(|cx| poll_fill(io, buf, HEAD_READ, cx)).await {
            Ok(0) if buf.is_empty() => return Err(ExchangeError::NoResponse(None)),
            Ok(0) => return Err(ExchangeError::Incomplete),
            Ok(_) => {}
            Err(e) if buf.is_empty() && is_reset(&e) => {
                return Err(ExchangeError::NoResponse(Some(e)));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// A server that closes with a request unread sends a reset, not a FIN.
fn is_reset(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted
    )
}

/// Parses the final response head at the start of `buf` and removes it
/// (with any interim 1xx responses before it); `None` if more bytes are
/// needed.
pub fn parse_head(
    buf: &mut BytesMut,
    head_request: bool,
) -> Result<Option<ResponseHead>, ExchangeError> {
    loop {
        if buf.is_empty() {
            return Ok(None);
        }
        let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut []);
        let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut parsed,
            buf,
            &mut slots,
        ) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
                return Err(ExchangeError::HeadTooLarge);
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let status = StatusCode::from_u16(parsed.code.unwrap_or(0))
            .map_err(|_| ExchangeError::Framing("invalid status code"))?;
        if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
            // 100 Continue, 103 Early Hints: interim, not forwarded.
            buf.advance(len);
            continue;
        }
        let version = http_version(parsed.version);
        let mut hop = HopFields::default();
        let plain = if status == StatusCode::SWITCHING_PROTOCOLS {
            None
        } else {
            ReceivedFields::read(buf, parsed.headers, &mut hop)?
        };
        let (headers, received) = match plain {
            Some(fields) => (
                HeaderMap::new(),
                Some(fields.with_head(buf.split_to(len).freeze())),
            ),
            None => {
                hop = HopFields::default();
                let named = names(buf, parsed.headers)?;
                let head = buf.split_to(len).freeze();
                (into_map(&head, named, &mut hop)?, None)
            }
        };
        let (framing, keep_alive) = response_framing(status, head_request, &hop, version);
        return Ok(Some(ResponseHead {
            status,
            version,
            headers,
            received,
            framing,
            keep_alive,
        }));
    }
}

/// The version httparse read (its minor digit: it reads HTTP/1.0 and 1.1
/// only).
fn http_version(minor: Option<u8>) -> Version {
    match minor {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    }
}

/// How a response's body is delimited (RFC 9112 §6.3), and whether its
/// connection may be reused after it.
fn response_framing(
    status: StatusCode,
    head_request: bool,
    hop: &HopFields,
    version: Version,
) -> (Framing, bool) {
    let mut keep_alive = !hop.close && (version == Version::HTTP_11 || hop.keep_alive);
    let framing = if head_request
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
        || status == StatusCode::SWITCHING_PROTOCOLS
    {
        Framing::Empty
    } else if let Some(chunked) = hop.chunked {
        // Both lengths present is how requests get smuggled: the
        // encoding wins (RFC 9112 §6.3) and the connection is not reused.
        if hop.content_length.is_some() || !chunked {
            keep_alive = false;
        }
        if chunked {
            Framing::Chunked(Chunk::Size)
        } else {
            Framing::UntilClose
        }
    } else if let Some(n) = hop.content_length {
        Framing::Length(n)
    } else {
        keep_alive = false;
        Framing::UntilClose
    };
    if status == StatusCode::SWITCHING_PROTOCOLS {
        keep_alive = false;
    }
    (framing, keep_alive)
}

/// Each field's name, and where its value lies in `head`: names are taken
/// before the head is frozen, values cut from it after, without a copy.
fn names(head: &[u8], fields: &[httparse::Header<'_>]) -> Result<NamedFields, ExchangeError> {
    let base = head.as_ptr() as usize;
    let mut named = NamedFields::new();
    for h in fields {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| ExchangeError::Framing("invalid header name"))?;
        let start = h.value.as_ptr() as usize - base;
        named.push((name, start, start + h.value.len()));
    }
    Ok(named)
}

type NamedFields = SmallVec<[(HeaderName, usize, usize); 16]>;

/// The fields of a frozen `head` in a map, framing noted in `hop`.
fn into_map(
    head: &Bytes,
    named: NamedFields,
    hop: &mut HopFields,
) -> Result<HeaderMap, ExchangeError> {
    let mut headers = HeaderMap::with_capacity(named.len());
    for (name, start, end) in named {
        let value = HeaderValue::from_maybe_shared(head.slice(start..end))
            .map_err(|_| ExchangeError::Framing("invalid header value"))?;
        if hop.note(name.as_str().as_bytes(), value.as_bytes())? != FieldRole::Spent {
            headers.append(name, value);
        }
    }
    Ok(headers)
}

/// How the request's body will be framed, from what the body itself says
/// (not from a `Content-Length` header a client may have got wrong).
fn request_framing<B: Body>(req: &Request<B>) -> RequestFraming {
    let body = req.body();
    if body.is_end_stream() {
        return RequestFraming::None;
    }
    match body.size_hint().exact() {
        Some(n) => RequestFraming::Length(n),
        None => RequestFraming::Chunked,
    }
}

/// Writes the request head into `out`: origin-form target, HTTP/1.1, every
/// header but the framing ones, then the framing of `framing`.
fn encode_head<B>(out: &mut Vec<u8>, req: &Request<B>, framing: RequestFraming) {
    out.clear();
    out.extend_from_slice(req.method().as_str().as_bytes());
    out.push(b' ');
    let target = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
    out.extend_from_slice(if target.is_empty() {
        b"/"
    } else {
        target.as_bytes()
    });
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in req.headers() {
        if *name == header::CONTENT_LENGTH || *name == header::TRANSFER_ENCODING {
            continue;
        }
        write_field(out, name.as_str().as_bytes(), value.as_bytes());
    }
    match framing {
        RequestFraming::Length(n) => write_content_length(out, n),
        RequestFraming::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        // A method that defines a body says it is empty.
        RequestFraming::None
            if matches!(*req.method(), Method::POST | Method::PUT | Method::PATCH) =>
        {
            out.extend_from_slice(b"content-length: 0\r\n");
        }
        RequestFraming::None => {}
    }
    out.extend_from_slice(b"\r\n");
}

/// Streams `body` to `io`, chunk-encoded when `chunked`.
async fn write_body<W: AsyncWrite + Unpin, B: SendBody>(
    io: &mut W,
    body: &mut B,
    chunked: bool,
    stall: Duration,
) -> Result<(), ExchangeError> {
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(ExchangeError::RequestBody)?;
        // Request trailers are dropped, as for responses.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        // Bounded per piece, not for the whole body: a slow client's upload
        // takes as long as it takes (its own pace is watched where it is
        // read); a server that stops reading is found.
        let piece = async {
            if chunked {
                let mut line = [0u8; 18];
                io.write_all(chunk_size_line(&mut line, data.len())).await?;
                io.write_all(&data).await?;
                io.write_all(b"\r\n").await
            } else {
                io.write_all(&data).await
            }
        };
        tokio::time::timeout(stall, piece)
            .await
            .map_err(|_| ExchangeError::TimedOut(stall))??;
    }
    if chunked {
        io.write_all(b"0\r\n\r\n").await?;
    }
    io.flush().await?;
    Ok(())
}

#[cfg(test)]
mod tests;
