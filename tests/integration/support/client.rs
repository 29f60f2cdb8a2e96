//! HTTP clients for tests, each able to connect from a chosen 127.x.y.z source
//! address so one test can present many distinct clients without headers.
//!
//! Owns: [`HttpRequest`] (one raw HTTP/1.1 request per connection, parsed
//! strictly enough for tests: Content-Length, chunked, or read to close) and
//! [`KeepAliveClient`] (hyper's HTTP/1 client on one kept-alive connection).
//!
//! Does not: follow redirects, speak TLS or HTTP/2, or pool connections.
//!
//! ```ignore
//! let resp = HttpRequest::get("/search?q=x")
//!     .header("user-agent", "crawler")
//!     .from(Ipv4Addr::new(127, 9, 0, 1))
//!     .send(weir.listener(0))
//!     .await?;
//! assert_eq!(resp.status, 429, "{resp}");
//! ```

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Default bound on one request, connect to last byte.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connect to {addr} from {source_ip}: {error}")]
    Connect {
        addr: SocketAddr,
        source_ip: IpAddr,
        error: std::io::Error,
    },
    #[error("I/O with {addr}: {error}")]
    Io {
        addr: SocketAddr,
        error: std::io::Error,
    },
    #[error("no complete response from {addr} within {after:?}")]
    Timeout { addr: SocketAddr, after: Duration },
    #[error("malformed response from {addr}: {reason}; raw: {raw:?}")]
    Malformed {
        addr: SocketAddr,
        reason: String,
        raw: String,
    },
    #[error("HTTP error with {addr}: {error}")]
    Hyper {
        addr: SocketAddr,
        error: hyper::Error,
    },
    #[error("bad request built by the test: {0}")]
    BadRequest(#[from] http::Error),
}

/// Opens a TCP connection to `addr` from `source` (port chosen by the OS).
/// Any 127/8 address works as a source on loopback.
pub async fn connect_from(source: IpAddr, addr: SocketAddr) -> Result<TcpStream, ClientError> {
    let err = |error| ClientError::Connect {
        addr,
        source_ip: source,
        error,
    };
    let socket = match source {
        IpAddr::V4(_) => TcpSocket::new_v4(),
        IpAddr::V6(_) => TcpSocket::new_v6(),
    }
    .map_err(err)?;
    socket.bind(SocketAddr::new(source, 0)).map_err(err)?;
    socket.connect(addr).await.map_err(err)
}

/// A parsed response. Header names are lower-cased.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every value of header `name`, in order.
    pub fn headers_all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Shows status, headers and body, so `assert!(.., "{resp}")` explains itself.
impl fmt::Display for HttpResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "HTTP {}", self.status)?;
        for (n, v) in &self.headers {
            writeln!(f, "{n}: {v}")?;
        }
        write!(f, "\n{}", self.text())
    }
}

/// One request on its own connection (`Connection: close`).
#[derive(Debug, Clone)]
pub struct HttpRequest {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    source: IpAddr,
    timeout: Duration,
}

impl HttpRequest {
    pub fn new(method: &str, target: &str) -> Self {
        Self {
            method: method.to_owned(),
            target: target.to_owned(),
            headers: Vec::new(),
            body: Vec::new(),
            source: IpAddr::V4(Ipv4Addr::LOCALHOST),
            timeout: REQUEST_TIMEOUT,
        }
    }

    pub fn get(target: &str) -> Self {
        Self::new("GET", target)
    }

    pub fn post(target: &str, body: impl Into<Vec<u8>>) -> Self {
        Self::new("POST", target).body(body)
    }

    /// Adds a header (sent as given; a `Host` here replaces the default).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// The source address to connect from (default 127.0.0.1).
    pub fn from(mut self, source: impl Into<IpAddr>) -> Self {
        self.source = source.into();
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The exact bytes sent.
    pub fn to_bytes(&self, addr: SocketAddr) -> Vec<u8> {
        let mut head = format!("{} {} HTTP/1.1\r\n", self.method, self.target);
        if !self
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("host"))
        {
            head.push_str(&format!("Host: {addr}\r\n"));
        }
        for (n, v) in &self.headers {
            head.push_str(&format!("{n}: {v}\r\n"));
        }
        if !self.body.is_empty() || matches!(self.method.as_str(), "POST" | "PUT" | "PATCH") {
            head.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
        }
        head.push_str("Connection: close\r\n\r\n");
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(&self.body);
        bytes
    }

    /// Connects from the source address, sends, and reads until the server
    /// closes (or the response is complete), within the timeout.
    pub async fn send(&self, addr: SocketAddr) -> Result<HttpResponse, ClientError> {
        let exchange = async {
            let mut stream = connect_from(self.source, addr).await?;
            let io = |error| ClientError::Io { addr, error };
            stream.write_all(&self.to_bytes(addr)).await.map_err(io)?;
            let mut raw = Vec::new();
            stream.read_to_end(&mut raw).await.map_err(io)?;
            parse_response(addr, &raw, self.method == "HEAD")
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| ClientError::Timeout {
                addr,
                after: self.timeout,
            })?
    }
}

/// Parses one HTTP/1.x response from everything read until close.
pub fn parse_response(
    addr: SocketAddr,
    raw: &[u8],
    head_only: bool,
) -> Result<HttpResponse, ClientError> {
    let malformed = |reason: &str| ClientError::Malformed {
        addr,
        reason: reason.to_owned(),
        raw: String::from_utf8_lossy(&raw[..raw.len().min(512)]).into_owned(),
    };
    let head_end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| malformed("no end of headers"))?;
    let head = std::str::from_utf8(&raw[..head_end]).map_err(|_| malformed("head not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    if !parts.next().unwrap_or_default().starts_with("HTTP/1.") {
        return Err(malformed("status line is not HTTP/1.x"));
    }
    let status = parts
        .next()
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| malformed("no numeric status"))?;
    let headers = lines
        .map(|line| {
            line.split_once(':')
                .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
                .ok_or_else(|| malformed("header line without ':'"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let rest = &raw[head_end + 4..];
    let find = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let body = if head_only || status == 204 || status == 304 {
        Vec::new()
    } else if find("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        decode_chunked(rest).ok_or_else(|| malformed("bad chunked body"))?
    } else if let Some(len) = find("content-length") {
        let len: usize = len.parse().map_err(|_| malformed("bad content-length"))?;
        rest.get(..len)
            .ok_or_else(|| malformed("body shorter than content-length"))?
            .to_vec()
    } else {
        rest.to_vec()
    };
    Ok(HttpResponse {
        status,
        headers,
        body,
    })
}

fn decode_chunked(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&data[..line_end]).ok()?;
        let size_hex = size_text.split(';').next()?.trim();
        let size = usize::from_str_radix(size_hex, 16).ok()?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}

/// hyper's HTTP/1 client on one connection that stays open between requests.
pub struct KeepAliveClient {
    addr: SocketAddr,
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    connection: tokio::task::JoinHandle<()>,
}

impl KeepAliveClient {
    /// Connects from `source` and completes the HTTP/1 handshake.
    pub async fn connect(source: IpAddr, addr: SocketAddr) -> Result<Self, ClientError> {
        let stream = connect_from(source, addr).await?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|error| ClientError::Hyper { addr, error })?;
        let connection = tokio::spawn(async move {
            // The connection ends when the server closes it or we drop the
            // sender; either is fine for a test client.
            let _ = conn.await;
        });
        Ok(Self {
            addr,
            sender,
            connection,
        })
    }

    /// Sends a GET for `target` on this connection.
    pub async fn get(&mut self, target: &str) -> Result<HttpResponse, ClientError> {
        let request = http::Request::get(target)
            .header(http::header::HOST, self.addr.to_string())
            .body(Full::new(Bytes::new()))?;
        self.send(request).await
    }

    /// Sends `request` on this connection and collects the whole response.
    pub async fn send(
        &mut self,
        request: http::Request<Full<Bytes>>,
    ) -> Result<HttpResponse, ClientError> {
        let addr = self.addr;
        let hyper_err = |error| ClientError::Hyper { addr, error };
        let exchange = async {
            self.sender.ready().await.map_err(hyper_err)?;
            let response = self.sender.send_request(request).await.map_err(hyper_err)?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await.map_err(hyper_err)?.to_bytes();
            Ok(HttpResponse {
                status: parts.status.as_u16(),
                headers: parts
                    .headers
                    .iter()
                    .map(|(n, v)| {
                        (
                            n.as_str().to_owned(),
                            String::from_utf8_lossy(v.as_bytes()).into_owned(),
                        )
                    })
                    .collect(),
                body: body.to_vec(),
            })
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| ClientError::Timeout {
                addr,
                after: REQUEST_TIMEOUT,
            })?
    }

    /// True once the server has closed this connection.
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }
}

impl Drop for KeepAliveClient {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &str) -> Option<(u16, String)> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 1));
        parse_response(addr, raw.as_bytes(), false)
            .ok()
            .map(|r| (r.status, r.text()))
    }

    #[test]
    fn parses_responses() {
        let ok = |status, body: &str| Some((status, body.to_owned()));
        #[rustfmt::skip]
        let cases: &[(&str, Option<(u16, String)>)] = &[
            ("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", ok(200, "hi")),
            ("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhiEXTRA", ok(200, "hi")),
            ("HTTP/1.0 404 Not Found\r\n\r\nuntil close", ok(404, "until close")),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n3;x=y\r\n!!!\r\n0\r\n\r\n", ok(200, "hi!!!")),
            ("HTTP/1.1 204 No Content\r\n\r\n", ok(204, "")),
            ("HTTP/1.1 429 Too Many Requests\r\nRetry-After: 5\r\nContent-Length: 0\r\n\r\n", ok(429, "")),
            ("HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort", None),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", None),
            ("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n", None),
            ("SSH-2.0-OpenSSH\r\n\r\n", None),
            ("HTTP/1.1 abc OK\r\n\r\n", None),
            ("HTTP/1.1 200 OK\r\nno colon\r\n\r\n", None),
        ];
        for (raw, want) in cases {
            assert_eq!(&parse(raw), want, "{raw:?}");
        }
    }

    #[test]
    fn request_bytes_carry_host_length_and_close() {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 8080));
        let get = HttpRequest::get("/a?b=c").header("X-Forwarded-For", "192.0.2.1");
        assert_eq!(
            String::from_utf8_lossy(&get.to_bytes(addr)),
            "GET /a?b=c HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nX-Forwarded-For: 192.0.2.1\r\n\
             Connection: close\r\n\r\n"
        );
        let post = HttpRequest::post("/upload", "xyz").header("host", "wiki");
        assert_eq!(
            String::from_utf8_lossy(&post.to_bytes(addr)),
            "POST /upload HTTP/1.1\r\nhost: wiki\r\nContent-Length: 3\r\nConnection: close\r\n\r\nxyz"
        );
    }
}
