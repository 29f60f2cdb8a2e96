//! A raw HTTP/2 client for conformance tests: frames written by hand (RFC
//! 9113 section 4) and header blocks as HPACK literals without indexing or
//! Huffman coding (RFC 7541 section 6.2.2), so a test can send what a
//! well-behaved library never would; and the frames the server answers
//! with, read back.
//!
//! Does not: decode the server's header blocks beyond a status from the
//! static table, or keep any stream state (a test says what it sends).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const PRIORITY: u8 = 0x2;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PUSH_PROMISE: u8 = 0x5;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY_FLAG: u8 = 0x20;

// Error codes (RFC 9113 section 7).
pub const NO_ERROR: u32 = 0x0;
pub const PROTOCOL_ERROR: u32 = 0x1;
pub const FLOW_CONTROL_ERROR: u32 = 0x3;
pub const STREAM_CLOSED: u32 = 0x5;
pub const FRAME_SIZE_ERROR: u32 = 0x6;
pub const REFUSED_STREAM: u32 = 0x7;
pub const COMPRESSION_ERROR: u32 = 0x9;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// One frame as read.
#[derive(Debug, Clone)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

/// What the server did with a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It answered (the status, when the static table names it).
    Answered(Option<u16>),
    /// It reset the stream with this error code.
    Reset(u32),
    /// It ended the connection with this error code.
    GoAway(u32),
    /// The connection closed, or nothing came within the wait.
    Nothing,
}

/// What came next on a connection.
#[derive(Debug)]
pub enum Next {
    Frame(Frame),
    /// The server closed the connection (or reset it).
    Closed,
    /// Nothing within the wait.
    Quiet,
}

/// A byte stream HTTP/2 runs on: TCP (h2c) or TLS.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// One HTTP/2 connection.
pub struct RawH2 {
    socket: Box<dyn Io>,
    read: Vec<u8>,
}

impl RawH2 {
    /// Connects (h2c, prior knowledge), sends the preface and empty
    /// SETTINGS; the server's are acknowledged as they are read.
    pub async fn connect(to: SocketAddr) -> RawH2 {
        let socket = TcpStream::connect(to).await.expect("connect");
        let mut h2 = RawH2::over(Box::new(socket));
        h2.preface().await;
        h2
    }

    /// A connection on `socket` (TLS with ALPN `h2`, say) that has sent
    /// nothing yet.
    pub fn over(socket: Box<dyn Io>) -> RawH2 {
        RawH2 {
            socket,
            read: Vec::new(),
        }
    }

    /// The client's connection preface and empty SETTINGS.
    pub async fn preface(&mut self) {
        self.send_raw(PREFACE).await;
        self.send(SETTINGS, 0, 0, &[]).await;
    }

    /// Writes bytes as they are (a frame spelled wrong, say).
    pub async fn send_raw(&mut self, bytes: &[u8]) {
        let _ = self.socket.write_all(bytes).await;
    }

    /// Writes one frame. (The server may have closed the connection
    /// already: what it sent is what the test reads.)
    pub async fn send(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        self.send_raw(&frame(kind, flags, stream, payload)).await;
    }

    /// A HEADERS frame (one block, END_HEADERS) with these fields.
    pub async fn headers(&mut self, stream: u32, fields: &[(&str, &str)], end_stream: bool) {
        let flags = END_HEADERS | if end_stream { END_STREAM } else { 0 };
        self.send(HEADERS, flags, stream, &block(fields)).await;
    }

    /// A DATA frame.
    pub async fn data(&mut self, stream: u32, bytes: &[u8], end_stream: bool) {
        let flags = if end_stream { END_STREAM } else { 0 };
        self.send(DATA, flags, stream, bytes).await;
    }

    /// The next frame within `wait`, or `None` when the connection closed
    /// or nothing came; SETTINGS and PING are acknowledged on the way and
    /// not returned.
    pub async fn next(&mut self, wait: Duration) -> Option<Frame> {
        match self.next_or_end(wait).await {
            Next::Frame(f) => Some(f),
            Next::Closed | Next::Quiet => None,
        }
    }

    /// The next frame within `wait`, telling a closed connection from
    /// silence.
    pub async fn next_or_end(&mut self, wait: Duration) -> Next {
        loop {
            let frame = match tokio::time::timeout(wait, self.read_frame()).await {
                Err(_) => return Next::Quiet,
                Ok(None) => return Next::Closed,
                Ok(Some(frame)) => frame,
            };
            match (frame.kind, frame.flags & ACK) {
                (SETTINGS, 0) => self.send(SETTINGS, ACK, 0, &[]).await,
                (SETTINGS, _) => {}
                (PING, 0) => self.send(PING, ACK, 0, &frame.payload).await,
                _ => return Next::Frame(frame),
            }
        }
    }

    /// What the server did with `stream`: its answer, its reset, or the
    /// connection's end, whichever comes first (5 s at most).
    pub async fn outcome(&mut self, stream: u32) -> Outcome {
        while let Some(f) = self.next(Duration::from_secs(5)).await {
            match f.kind {
                HEADERS if f.stream == stream => return Outcome::Answered(status(&f.payload)),
                RST_STREAM if f.stream == stream => return Outcome::Reset(code(&f.payload, 0)),
                GOAWAY => return Outcome::GoAway(code(&f.payload, 4)),
                _ => {}
            }
        }
        Outcome::Nothing
    }

    async fn read_frame(&mut self) -> Option<Frame> {
        loop {
            if self.read.len() >= 9 {
                let len =
                    u32::from_be_bytes([0, self.read[0], self.read[1], self.read[2]]) as usize;
                if self.read.len() >= 9 + len {
                    let head: Vec<u8> = self.read.drain(..9).collect();
                    let payload = self.read.drain(..len).collect();
                    return Some(Frame {
                        kind: head[3],
                        flags: head[4],
                        stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]])
                            & 0x7fff_ffff,
                        payload,
                    });
                }
            }
            let mut buf = [0u8; 16384];
            let n = self.socket.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            self.read.extend_from_slice(&buf[..n]);
        }
    }
}

/// One frame's bytes: the 9-byte header (RFC 9113 4.1), then `payload`.
/// The stream's reserved bit is sent as given.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut frame = len.to_be_bytes()[1..].to_vec();
    frame.extend([kind, flags]);
    frame.extend(stream.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// A header block of literals without indexing, names and values as given
/// (RFC 7541 section 6.2.2, no Huffman).
pub fn block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0x00);
        integer(&mut out, name.len(), 7);
        out.extend_from_slice(name.as_bytes());
        integer(&mut out, value.len(), 7);
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541 section 5.1), the
/// prefix's other bits zero.
fn integer(out: &mut Vec<u8>, mut value: usize, n: u32) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(value as u8);
        return;
    }
    out.push(max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128 + 128) as u8);
        value /= 128;
    }
    out.push(value as u8);
}

/// The status of a response block whose first field is an indexed
/// `:status` of the static table (RFC 7541 appendix A).
pub fn status(block: &[u8]) -> Option<u16> {
    match block.first()? & 0x7f {
        8 => Some(200),
        9 => Some(204),
        10 => Some(206),
        11 => Some(304),
        12 => Some(400),
        13 => Some(404),
        14 => Some(500),
        _ => None,
    }
}

fn code(payload: &[u8], at: usize) -> u32 {
    payload
        .get(at..at + 4)
        .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}
