//! PROXY protocol v1 (text) and v2 (binary) headers, as specified by HAProxy's
//! `proxy-protocol.txt`: a pure parser, a socket reader that consumes exactly
//! the header, and encoders for tests.
//!
//! Owns reading the header a load balancer prepends to a connection to tell
//! weir the real client address. It does not decide whether to believe that
//! address (only a trusted peer's header counts: `identity::forwarded`), does
//! not decide which listeners expect a header (configuration), and skips v2
//! TLVs (ALPN, SNI, AWS/Azure/GCP ids) rather than interpreting them.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::net::TcpStream;

/// The 12 bytes that open every v2 header. They contain `\r\n\r\n\0`, which
/// no HTTP, TLS or v1 stream can start with.
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
const V1_PREFIX: &[u8] = b"PROXY ";
/// Longest v1 line, CRLF included: "PROXY UNKNOWN" with two full IPv6
/// addresses and two 5-digit ports (spec §2.1).
pub const V1_MAX_LEN: usize = 107;
/// Signature, version/command, family/transport, 16-bit length.
const V2_FIXED_LEN: usize = 16;
/// Bytes looked at per peek. The spec suggests 536 (the minimum TCP MSS), so
/// one peek sees a whole header in practice and few application bytes.
const PEEK_LEN: usize = 536;

/// What a PROXY header says about the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyHeader {
    /// The original client. `None` for v1 `UNKNOWN`, v2 `LOCAL` (the proxy's
    /// own health check), and v2 `UNSPEC` or `UNIX` families.
    pub source: Option<SocketAddr>,
    /// The address the client connected to on the proxy; `None` as `source`.
    pub destination: Option<SocketAddr>,
    /// 1 or 2.
    pub version: u8,
}

/// The outcome of [`parse`] on the bytes received so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// A whole header: the first `consumed` bytes; the rest is application data.
    Complete {
        header: ProxyHeader,
        consumed: usize,
    },
    /// Every byte so far is a valid beginning of a header; more are needed.
    Incomplete,
}

/// Why a connection's opening bytes are not an acceptable PROXY header.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyProtocolError {
    #[error(
        "connection does not start with a PROXY protocol header \
         (\"PROXY \" or the v2 signature); first bytes: \"{prefix}\""
    )]
    NotProxy { prefix: String },
    #[error("PROXY v1 line has no CRLF within {V1_MAX_LEN} bytes: \"{prefix}\"")]
    V1TooLong { prefix: String },
    #[error("PROXY v1 line \"{line}\" is malformed: {reason}")]
    V1Malformed { line: String, reason: String },
    #[error("PROXY v2 header has version {version}, expected 2")]
    V2Version { version: u8 },
    #[error("PROXY v2 command {command:#x} is neither LOCAL (0x0) nor PROXY (0x1)")]
    V2Command { command: u8 },
    #[error(
        "PROXY v2 address family {family:#x} is not UNSPEC (0x0), INET (0x1), \
         INET6 (0x2) or UNIX (0x3)"
    )]
    V2Family { family: u8 },
    #[error("PROXY v2 transport {transport:#x} is not UNSPEC (0x0), STREAM (0x1) or DGRAM (0x2)")]
    V2Transport { transport: u8 },
    #[error("PROXY v2 length {length} is too short for {family} addresses ({needed} bytes)")]
    V2Length {
        family: &'static str,
        length: usize,
        needed: usize,
    },
    #[error("no complete PROXY header within {after:?} ({received} bytes received)")]
    Timeout { after: Duration, received: usize },
    #[error("connection closed after {received} bytes, before the PROXY header was complete")]
    Closed { received: usize },
    #[error("reading the PROXY header: {0}")]
    Io(#[from] io::Error),
}

/// Parses a PROXY header at the start of `buf`. Never panics; returns
/// `Incomplete` only while `buf` is a strict prefix of some valid header, so
/// garbage is rejected as soon as it is seen rather than after a timeout.
pub fn parse(buf: &[u8]) -> Result<Parsed, ProxyProtocolError> {
    match buf.first() {
        None => Ok(Parsed::Incomplete),
        Some(b'P') => parse_v1(buf),
        Some(b'\r') => parse_v2(buf),
        Some(_) => Err(not_proxy(buf)),
    }
}

fn escaped(bytes: &[u8], limit: usize) -> String {
    bytes[..bytes.len().min(limit)].escape_ascii().to_string()
}

fn not_proxy(buf: &[u8]) -> ProxyProtocolError {
    ProxyProtocolError::NotProxy {
        prefix: escaped(buf, 16),
    }
}

fn parse_v1(buf: &[u8]) -> Result<Parsed, ProxyProtocolError> {
    let prefix_len = buf.len().min(V1_PREFIX.len());
    if buf[..prefix_len] != V1_PREFIX[..prefix_len] {
        return Err(not_proxy(buf));
    }
    let malformed = |end: usize, reason: String| ProxyProtocolError::V1Malformed {
        line: escaped(&buf[..end], V1_MAX_LEN),
        reason,
    };
    let Some(end) = v1_line_end(buf, &malformed)? else {
        return Ok(Parsed::Incomplete);
    };
    // Checked by `v1_line_end`: bytes 0..end are printable ASCII.
    let line = std::str::from_utf8(&buf[V1_PREFIX.len()..end])
        .map_err(|_| malformed(end, "not ASCII".into()))?;
    let fields: Vec<&str> = line.split(' ').collect();
    let header = v1_header(&fields, &|reason| malformed(end + 2, reason))?;
    Ok(Parsed::Complete {
        header,
        consumed: end + 2,
    })
}

/// Where a v1 line's CR is (its CRLF ends it); `None` while it may still
/// come. Every byte before it must be printable ASCII.
fn v1_line_end(
    buf: &[u8],
    malformed: &dyn Fn(usize, String) -> ProxyProtocolError,
) -> Result<Option<usize>, ProxyProtocolError> {
    let scan = buf.len().min(V1_MAX_LEN);
    for (i, &b) in buf.iter().enumerate().take(scan).skip(V1_PREFIX.len()) {
        match b {
            b'\r' => match buf.get(i + 1) {
                _ if i + 2 > V1_MAX_LEN => break,
                Some(b'\n') => return Ok(Some(i)),
                Some(_) => {
                    return Err(malformed(
                        i + 2,
                        format!("CR at byte {i} is not followed by LF"),
                    ));
                }
                None => return Ok(None),
            },
            b'\n' => return Err(malformed(i + 1, format!("LF without CR at byte {i}"))),
            0x20..=0x7e => {}
            other => {
                return Err(malformed(
                    i + 1,
                    format!("byte {other:#04x} at offset {i} is not printable ASCII"),
                ));
            }
        }
    }
    if buf.len() >= V1_MAX_LEN {
        Err(ProxyProtocolError::V1TooLong {
            prefix: escaped(buf, V1_MAX_LEN),
        })
    } else {
        Ok(None)
    }
}

/// The header a v1 line's space-separated fields describe.
fn v1_header(
    fields: &[&str],
    malformed: &dyn Fn(String) -> ProxyProtocolError,
) -> Result<ProxyHeader, ProxyProtocolError> {
    match fields.first().copied().unwrap_or_default() {
        // "the receiver must ignore anything presented before the CRLF"
        "UNKNOWN" => Ok(ProxyHeader {
            source: None,
            destination: None,
            version: 1,
        }),
        proto @ ("TCP4" | "TCP6") => {
            let [_, src, dst, sport, dport] = fields[..] else {
                return Err(malformed(format!(
                    "expected \"{proto} <src> <dst> <sport> <dport>\" separated by single spaces, got {} fields",
                    fields.len()
                )));
            };
            let ip = |s: &str, what: &str| -> Result<IpAddr, ProxyProtocolError> {
                let parsed = if proto == "TCP4" {
                    s.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
                } else {
                    s.parse::<Ipv6Addr>().ok().map(IpAddr::V6)
                };
                parsed.ok_or_else(|| malformed(format!("{what} {s:?} is not a {proto} address")))
            };
            let port = |s: &str, what: &str| -> Result<u16, ProxyProtocolError> {
                let digits = !s.is_empty() && s.len() <= 5 && s.bytes().all(|b| b.is_ascii_digit());
                digits
                    .then(|| s.parse::<u16>().ok())
                    .flatten()
                    .ok_or_else(|| malformed(format!("{what} {s:?} is not a port (0-65535)")))
            };
            Ok(ProxyHeader {
                source: Some(SocketAddr::new(
                    ip(src, "source")?,
                    port(sport, "source port")?,
                )),
                destination: Some(SocketAddr::new(
                    ip(dst, "destination")?,
                    port(dport, "destination port")?,
                )),
                version: 1,
            })
        }
        other => Err(malformed(format!(
            "protocol {other:?} is not TCP4, TCP6 or UNKNOWN"
        ))),
    }
}

fn parse_v2(buf: &[u8]) -> Result<Parsed, ProxyProtocolError> {
    let sig_len = buf.len().min(V2_SIGNATURE.len());
    if buf[..sig_len] != V2_SIGNATURE[..sig_len] {
        return Err(not_proxy(buf));
    }
    let [.., ver_cmd, fam, len_hi, len_lo] = match buf.get(..V2_FIXED_LEN) {
        Some(&[.., a, b, c, d]) => [a, b, c, d],
        _ => return Ok(Parsed::Incomplete),
    };
    let version = ver_cmd >> 4;
    if version != 2 {
        return Err(ProxyProtocolError::V2Version { version });
    }
    let local = match ver_cmd & 0x0f {
        0x0 => true,
        0x1 => false,
        command => return Err(ProxyProtocolError::V2Command { command }),
    };
    let family = fam >> 4;
    let transport = fam & 0x0f;
    if transport > 0x2 {
        return Err(ProxyProtocolError::V2Transport { transport });
    }
    let length = usize::from(u16::from_be_bytes([len_hi, len_lo]));
    let (family_name, needed) = match family {
        0x0 => ("UNSPEC", 0),
        0x1 => ("INET", 12),
        0x2 => ("INET6", 36),
        0x3 => ("UNIX", 216),
        family => return Err(ProxyProtocolError::V2Family { family }),
    };
    // LOCAL: "the receiver must accept this connection as valid and must use
    // the real connection endpoints and discard the protocol block".
    if !local && length < needed {
        return Err(ProxyProtocolError::V2Length {
            family: family_name,
            length,
            needed,
        });
    }
    let Some(body) = buf.get(V2_FIXED_LEN..V2_FIXED_LEN + length) else {
        return Ok(Parsed::Incomplete);
    };
    let addrs = if local {
        None
    } else {
        v2_addresses(family, body)
    };
    Ok(Parsed::Complete {
        header: ProxyHeader {
            source: addrs.map(|(s, _)| s),
            destination: addrs.map(|(_, d)| d),
            version: 2,
        },
        consumed: V2_FIXED_LEN + length,
    })
}

/// Source and destination from a v2 address block (TLVs after it ignored).
fn v2_addresses(family: u8, body: &[u8]) -> Option<(SocketAddr, SocketAddr)> {
    let port = |at: usize| Some(u16::from_be_bytes(body.get(at..at + 2)?.try_into().ok()?));
    match family {
        0x1 => {
            let src: [u8; 4] = body.get(0..4)?.try_into().ok()?;
            let dst: [u8; 4] = body.get(4..8)?.try_into().ok()?;
            Some((
                SocketAddr::new(IpAddr::from(src), port(8)?),
                SocketAddr::new(IpAddr::from(dst), port(10)?),
            ))
        }
        0x2 => {
            let src: [u8; 16] = body.get(0..16)?.try_into().ok()?;
            let dst: [u8; 16] = body.get(16..32)?.try_into().ok()?;
            Some((
                SocketAddr::new(IpAddr::from(src), port(32)?),
                SocketAddr::new(IpAddr::from(dst), port(34)?),
            ))
        }
        // UNSPEC and UNIX carry no IP address.
        _ => None,
    }
}

/// Reads a PROXY header from the start of `stream`, consuming exactly its
/// bytes: whatever follows (HTTP, a TLS ClientHello) stays in the socket for
/// the next reader. Fails with [`ProxyProtocolError::Timeout`] if no complete
/// header arrives within `deadline`, and as soon as the bytes cannot be a
/// header.
///
/// It peeks, and consumes only bytes known to be header: all of them when the
/// header is complete, or all those peeked while it is still incomplete. The
/// latter is not just an optimisation: peeking again at unchanged data returns
/// at once, so waiting for the rest of a fragmented header would spin.
pub async fn read_header(
    stream: &TcpStream,
    deadline: Duration,
) -> Result<ProxyHeader, ProxyProtocolError> {
    let mut received = 0;
    match tokio::time::timeout(deadline, read_header_until_done(stream, &mut received)).await {
        Ok(result) => result,
        Err(_elapsed) => Err(ProxyProtocolError::Timeout {
            after: deadline,
            received,
        }),
    }
}

async fn read_header_until_done(
    stream: &TcpStream,
    received: &mut usize,
) -> Result<ProxyHeader, ProxyProtocolError> {
    // Bytes already consumed from the socket, all part of the header.
    let mut taken: Vec<u8> = Vec::new();
    let mut peeked = [0u8; PEEK_LEN];
    loop {
        let n = stream.peek(&mut peeked).await?;
        if n == 0 {
            return Err(ProxyProtocolError::Closed {
                received: taken.len(),
            });
        }
        let before = taken.len();
        taken.extend_from_slice(&peeked[..n]);
        *received = taken.len();
        match parse(&taken)? {
            Parsed::Complete { header, consumed } => {
                discard_exact(stream, consumed - before).await?;
                return Ok(header);
            }
            Parsed::Incomplete => discard_exact(stream, n).await?,
        }
    }
}

/// `read_exact` into nothing, on a shared `&TcpStream`.
async fn discard_exact(stream: &TcpStream, mut remaining: usize) -> io::Result<()> {
    let mut sink = [0u8; PEEK_LEN];
    while remaining > 0 {
        stream.readable().await?;
        let want = remaining.min(sink.len());
        match stream.try_read(&mut sink[..want]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(read) => remaining -= read,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Both addresses in one family: mixed pairs become IPv6 (IPv4-mapped), as
/// v1 `TCP6` and v2 `INET6` require one family.
fn same_family(src: SocketAddr, dst: SocketAddr) -> (SocketAddr, SocketAddr) {
    let v6 = |a: SocketAddr| match a.ip() {
        IpAddr::V4(v4) => SocketAddr::new(IpAddr::V6(v4.to_ipv6_mapped()), a.port()),
        IpAddr::V6(_) => a,
    };
    if src.is_ipv4() == dst.is_ipv4() {
        (src, dst)
    } else {
        (v6(src), v6(dst))
    }
}

/// A v1 header: `PROXY TCP4|TCP6 …\r\n`, or `PROXY UNKNOWN\r\n` for `None`.
pub fn encode_v1(addrs: Option<(SocketAddr, SocketAddr)>) -> Vec<u8> {
    let Some((src, dst)) = addrs else {
        return b"PROXY UNKNOWN\r\n".to_vec();
    };
    let (src, dst) = same_family(src, dst);
    let proto = if src.is_ipv4() { "TCP4" } else { "TCP6" };
    format!(
        "PROXY {proto} {} {} {} {}\r\n",
        src.ip(),
        dst.ip(),
        src.port(),
        dst.port()
    )
    .into_bytes()
}

/// A v2 header with no TLVs: `PROXY` over TCP, or `LOCAL` for `None`.
pub fn encode_v2(addrs: Option<(SocketAddr, SocketAddr)>) -> Vec<u8> {
    encode_v2_with_tlvs(addrs, &[])
}

/// A v2 header followed by `(type, value)` TLVs, for testing that they are
/// skipped. TLVs that would push the block past 65535 bytes are left out.
pub fn encode_v2_with_tlvs(
    addrs: Option<(SocketAddr, SocketAddr)>,
    tlvs: &[(u8, &[u8])],
) -> Vec<u8> {
    let mut body = Vec::new();
    let (ver_cmd, fam) = match addrs.map(|(s, d)| same_family(s, d)) {
        None => (0x20, 0x00),
        Some((src, dst)) => {
            let fam = match (src.ip(), dst.ip()) {
                (IpAddr::V4(s), IpAddr::V4(d)) => {
                    body.extend_from_slice(&s.octets());
                    body.extend_from_slice(&d.octets());
                    0x11
                }
                (s, d) => {
                    let v6 = |ip: IpAddr| match ip {
                        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                        IpAddr::V6(v6) => v6,
                    };
                    body.extend_from_slice(&v6(s).octets());
                    body.extend_from_slice(&v6(d).octets());
                    0x21
                }
            };
            body.extend_from_slice(&src.port().to_be_bytes());
            body.extend_from_slice(&dst.port().to_be_bytes());
            (0x21, fam)
        }
    };
    for &(kind, value) in tlvs {
        let Ok(len) = u16::try_from(value.len()) else {
            continue;
        };
        if body.len() + 3 + value.len() > usize::from(u16::MAX) {
            continue;
        }
        body.push(kind);
        body.extend_from_slice(&len.to_be_bytes());
        body.extend_from_slice(value);
    }
    let mut out = Vec::with_capacity(V2_FIXED_LEN + body.len());
    out.extend_from_slice(&V2_SIGNATURE);
    out.push(ver_cmd);
    out.push(fam);
    // Bounded to u16::MAX by the TLV loop above.
    out.extend_from_slice(&(body.len() as u16).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// One line of text per outcome, so table rows read as what they mean.
    fn describe(buf: &[u8]) -> String {
        match parse(buf) {
            Ok(Parsed::Incomplete) => "incomplete".into(),
            Ok(Parsed::Complete { header, consumed }) => {
                let addrs = match (header.source, header.destination) {
                    (Some(s), Some(d)) => format!("{s} -> {d}"),
                    (None, None) => "no address".into(),
                    (s, d) => format!("{s:?} -> {d:?}"),
                };
                let rest = buf[consumed..].escape_ascii();
                format!("v{} {addrs} rest={rest}", header.version)
            }
            Err(e) => format!("error: {e}"),
        }
    }

    fn v2(ver_cmd: u8, fam: u8, body: &[u8], rest: &[u8]) -> Vec<u8> {
        let mut out = V2_SIGNATURE.to_vec();
        out.push(ver_cmd);
        out.push(fam);
        out.extend_from_slice(&(body.len() as u16).to_be_bytes());
        out.extend_from_slice(body);
        out.extend_from_slice(rest);
        out
    }

    const V4_BODY: [u8; 12] = [192, 0, 2, 1, 198, 51, 100, 2, 0xdc, 0x04, 0x01, 0xbb];

    fn v6_body() -> Vec<u8> {
        let mut body = "2001:db8::1".parse::<Ipv6Addr>().unwrap().octets().to_vec();
        body.extend_from_slice(&"2001:db8::2".parse::<Ipv6Addr>().unwrap().octets());
        body.extend_from_slice(&[0xdc, 0x04, 0x01, 0xbb]);
        body
    }

    fn with_tlvs(body: &[u8]) -> Vec<u8> {
        let mut out = body.to_vec();
        out.extend_from_slice(&[0x01, 0x00, 0x02, b'h', b'2']); // ALPN
        out.extend_from_slice(&[0x02, 0x00, 0x03, b'a', b'.', b'b']); // authority
        out
    }

    const UNKNOWN_107: &str = "PROXY UNKNOWN ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n";
    const TCP6_104: &str = "PROXY TCP6 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n";

    #[test]
    fn parses() {
        let long_108 = UNKNOWN_107.replace("UNKNOWN", "UNKNOWN_");
        let no_crlf = format!("PROXY {}", "A".repeat(101));
        let cr_at_106 = format!("PROXY {}\r\n", "A".repeat(100));
        let mut sig_typo = V2_SIGNATURE.to_vec();
        sig_typo[11] = b'X';
        #[rustfmt::skip]
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            // v1
            ("v1 tcp4", b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\nGET".to_vec(), "v1 192.0.2.1:56324 -> 198.51.100.2:443 rest=GET"),
            ("v1 tcp6", b"PROXY TCP6 2001:db8::1 2001:db8::2 56324 443\r\n".to_vec(), "v1 [2001:db8::1]:56324 -> [2001:db8::2]:443 rest="),
            ("v1 mapped", b"PROXY TCP6 ::ffff:192.0.2.1 2001:db8::2 1 2\r\n".to_vec(), "v1 [::ffff:192.0.2.1]:1 -> [2001:db8::2]:2 rest="),
            ("v1 port edges", b"PROXY TCP4 192.0.2.1 198.51.100.2 0 65535\r\n".to_vec(), "v1 192.0.2.1:0 -> 198.51.100.2:65535 rest="),
            ("v1 unknown", b"PROXY UNKNOWN\r\nGET".to_vec(), "v1 no address rest=GET"),
            ("v1 unknown, 107 bytes", UNKNOWN_107.as_bytes().to_vec(), "v1 no address rest="),
            ("v1 tcp6, 104 bytes", TCP6_104.as_bytes().to_vec(), "v1 [ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535 -> [ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535 rest="),
            ("v1 header then tls", b"PROXY TCP4 192.0.2.1 198.51.100.2 1 2\r\n\x16\x03\x01".to_vec(), "v1 192.0.2.1:1 -> 198.51.100.2:2 rest=\\x16\\x03\\x01"),
            ("empty", b"".to_vec(), "incomplete"),
            ("v1 one byte", b"P".to_vec(), "incomplete"),
            ("v1 prefix", b"PROXY".to_vec(), "incomplete"),
            ("v1 half line", b"PROXY TCP4 192.0.2.1".to_vec(), "incomplete"),
            ("v1 CR only", b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r".to_vec(), "incomplete"),
            ("http", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), "error: connection does not start with a PROXY protocol header (\"PROXY \" or the v2 signature); first bytes: \"GET / HTTP/1.1\\r\\n\""),
            ("tls", b"\x16\x03\x01\x02\x00".to_vec(), "not start with a PROXY protocol header"),
            ("PROXZ", b"PROXZ TCP4".to_vec(), "first bytes: \"PROXZ TCP4\""),
            ("lower case", b"proxy TCP4".to_vec(), "not start with a PROXY"),
            ("v1 port too big", b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 65536\r\n".to_vec(), "destination port \"65536\" is not a port"),
            ("v1 port sign", b"PROXY TCP4 192.0.2.1 198.51.100.2 +1 2\r\n".to_vec(), "source port \"+1\" is not a port"),
            ("v1 port hex", b"PROXY TCP4 192.0.2.1 198.51.100.2 0x50 2\r\n".to_vec(), "source port \"0x50\""),
            ("v1 v6 in tcp4", b"PROXY TCP4 2001:db8::1 198.51.100.2 1 2\r\n".to_vec(), "source \"2001:db8::1\" is not a TCP4 address"),
            ("v1 v4 in tcp6", b"PROXY TCP6 2001:db8::1 198.51.100.2 1 2\r\n".to_vec(), "destination \"198.51.100.2\" is not a TCP6 address"),
            ("v1 bad v4", b"PROXY TCP4 192.0.2 198.51.100.2 1 2\r\n".to_vec(), "source \"192.0.2\""),
            ("v1 missing port", b"PROXY TCP4 192.0.2.1 198.51.100.2 56324\r\n".to_vec(), "got 4 fields"),
            ("v1 extra field", b"PROXY TCP4 192.0.2.1 198.51.100.2 1 2 3\r\n".to_vec(), "got 6 fields"),
            ("v1 double space", b"PROXY TCP4  192.0.2.1 198.51.100.2 1 2\r\n".to_vec(), "got 6 fields"),
            ("v1 trailing space", b"PROXY TCP4 192.0.2.1 198.51.100.2 1 2 \r\n".to_vec(), "got 6 fields"),
            ("v1 udp", b"PROXY UDP4 192.0.2.1 198.51.100.2 1 2\r\n".to_vec(), "protocol \"UDP4\" is not TCP4, TCP6 or UNKNOWN"),
            ("v1 empty proto", b"PROXY \r\n".to_vec(), "protocol \"\" is not"),
            ("v1 LF only", b"PROXY TCP4 192.0.2.1 198.51.100.2 1 2\n".to_vec(), "LF without CR at byte 37"),
            ("v1 CR then X", b"PROXY TCP4 192.0.2.1 198.51.100.2 1 2\rX".to_vec(), "CR at byte 37 is not followed by LF"),
            ("v1 binary", b"PROXY TCP4 \xff".to_vec(), "byte 0xff at offset 11 is not printable ASCII"),
            ("v1 NUL", b"PROXY \0".to_vec(), "byte 0x00 at offset 6"),
            ("v1 107 without CRLF", no_crlf.into_bytes(), "no CRLF within 107 bytes"),
            ("v1 108-byte line", long_108.into_bytes(), "no CRLF within 107 bytes"),
            ("v1 CR at 106", cr_at_106.into_bytes(), "no CRLF within 107 bytes"),
            // v2
            ("v2 inet", v2(0x21, 0x11, &V4_BODY, b"GET"), "v2 192.0.2.1:56324 -> 198.51.100.2:443 rest=GET"),
            ("v2 inet dgram", v2(0x21, 0x12, &V4_BODY, b""), "v2 192.0.2.1:56324 -> 198.51.100.2:443 rest="),
            ("v2 inet unspec transport", v2(0x21, 0x10, &V4_BODY, b""), "v2 192.0.2.1:56324 -> 198.51.100.2:443 rest="),
            ("v2 inet6", v2(0x21, 0x21, &v6_body(), b"\x16\x03"), "v2 [2001:db8::1]:56324 -> [2001:db8::2]:443 rest=\\x16\\x03"),
            ("v2 inet + tlvs", v2(0x21, 0x11, &with_tlvs(&V4_BODY), b"GET"), "v2 192.0.2.1:56324 -> 198.51.100.2:443 rest=GET"),
            ("v2 inet6 + tlvs", v2(0x21, 0x21, &with_tlvs(&v6_body()), b""), "v2 [2001:db8::1]:56324 -> [2001:db8::2]:443 rest="),
            ("v2 local", v2(0x20, 0x00, &[], b"GET"), "v2 no address rest=GET"),
            ("v2 local ignores addrs", v2(0x20, 0x11, &V4_BODY, b"GET"), "v2 no address rest=GET"),
            ("v2 local short addrs", v2(0x20, 0x11, &[1, 2], b""), "v2 no address rest="),
            ("v2 proxy unspec", v2(0x21, 0x00, &[], b"GET"), "v2 no address rest=GET"),
            ("v2 proxy unix", v2(0x21, 0x31, &[0; 216], b"GET"), "v2 no address rest=GET"),
            ("v2 sig prefix", V2_SIGNATURE[..5].to_vec(), "incomplete"),
            ("v2 fixed part short", v2(0x21, 0x11, &V4_BODY, b"")[..15].to_vec(), "incomplete"),
            ("v2 body short", v2(0x21, 0x11, &V4_BODY, b"")[..27].to_vec(), "incomplete"),
            ("v2 sig typo", sig_typo, "not start with a PROXY protocol header"),
            ("v2 CRLF only", b"\r\n\r\nGET".to_vec(), "first bytes: \"\\r\\n\\r\\nGET\""),
            ("v2 version 1", v2(0x11, 0x11, &V4_BODY, b""), "version 1, expected 2"),
            ("v2 version 3", v2(0x31, 0x11, &V4_BODY, b""), "version 3, expected 2"),
            ("v2 command 2", v2(0x22, 0x11, &V4_BODY, b""), "command 0x2 is neither LOCAL"),
            ("v2 command f", v2(0x2f, 0x11, &V4_BODY, b""), "command 0xf"),
            ("v2 family 4", v2(0x21, 0x41, &V4_BODY, b""), "address family 0x4 is not"),
            ("v2 transport 3", v2(0x21, 0x13, &V4_BODY, b""), "transport 0x3 is not"),
            ("v2 inet too short", v2(0x21, 0x11, &V4_BODY[..8], b""), "length 8 is too short for INET addresses (12 bytes)"),
            ("v2 inet6 too short", v2(0x21, 0x21, &V4_BODY, b""), "length 12 is too short for INET6 addresses (36 bytes)"),
            ("v2 unix too short", v2(0x21, 0x31, &V4_BODY, b""), "length 12 is too short for UNIX"),
            ("v2 bad version before body", v2(0x11, 0x11, &V4_BODY, b"")[..16].to_vec(), "version 1"),
        ];
        for (name, input, want) in &cases {
            let got = describe(input);
            if want.starts_with("v1 ") || want.starts_with("v2 ") || *want == "incomplete" {
                assert_eq!(got, *want, "{name}");
            } else {
                assert!(got.starts_with("error: "), "{name}: {got}");
                assert!(got.contains(want), "{name}: {got:?} lacks {want:?}");
            }
        }
    }

    #[test]
    fn every_prefix_of_a_valid_header_is_incomplete() {
        let headers = [
            encode_v1(Some((
                "192.0.2.1:1".parse().unwrap(),
                "198.51.100.2:2".parse().unwrap(),
            ))),
            encode_v1(None),
            encode_v2_with_tlvs(
                Some((
                    "[2001:db8::1]:1".parse().unwrap(),
                    "[2001:db8::2]:2".parse().unwrap(),
                )),
                &[(0x01, b"h2")],
            ),
            encode_v2(None),
        ];
        for header in headers {
            for cut in 0..header.len() {
                assert_eq!(
                    parse(&header[..cut]).ok(),
                    Some(Parsed::Incomplete),
                    "{} cut at {cut}",
                    header.escape_ascii()
                );
            }
            assert!(matches!(
                parse(&header),
                Ok(Parsed::Complete { consumed, .. }) if consumed == header.len()
            ));
        }
    }

    #[test]
    fn encoders_round_trip() {
        let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
        #[rustfmt::skip]
        type Addrs = Option<(SocketAddr, SocketAddr)>;
        // (encoded addresses, parsed source, parsed destination)
        let cases: &[(Addrs, Option<&str>, Option<&str>)] = &[
            (
                Some((sa("192.0.2.1:56324"), sa("198.51.100.2:443"))),
                Some("192.0.2.1:56324"),
                Some("198.51.100.2:443"),
            ),
            (
                Some((sa("[2001:db8::1]:1"), sa("[2001:db8::2]:65535"))),
                Some("[2001:db8::1]:1"),
                Some("[2001:db8::2]:65535"),
            ),
            (
                Some((sa("192.0.2.1:1"), sa("[2001:db8::2]:2"))),
                Some("[::ffff:192.0.2.1]:1"),
                Some("[2001:db8::2]:2"),
            ),
            (None, None, None),
        ];
        for &(addrs, src, dst) in cases {
            for (version, bytes) in [(1, encode_v1(addrs)), (2, encode_v2(addrs))] {
                let Ok(Parsed::Complete { header, consumed }) = parse(&bytes) else {
                    panic!(
                        "v{version} {addrs:?} did not parse: {}",
                        bytes.escape_ascii()
                    );
                };
                assert_eq!(consumed, bytes.len());
                assert_eq!(header.version, version);
                assert_eq!(header.source, src.map(sa), "v{version} {addrs:?}");
                assert_eq!(header.destination, dst.map(sa), "v{version} {addrs:?}");
            }
        }
    }

    #[test]
    fn never_panics_on_noise() {
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let seeds = [
            encode_v1(Some((
                "192.0.2.1:1".parse().unwrap(),
                "198.51.100.2:2".parse().unwrap(),
            ))),
            encode_v2(Some((
                "[2001:db8::1]:1".parse().unwrap(),
                "[2001:db8::2]:2".parse().unwrap(),
            ))),
        ];
        let mut completes = 0;
        for _ in 0..50_000 {
            let mut bytes = seeds[(next() % 2) as usize].clone();
            // Flip a few bytes and truncate: near-misses reach every branch.
            for _ in 0..(next() % 3) {
                let at = (next() % bytes.len() as u64) as usize;
                bytes[at] = next() as u8;
            }
            bytes.truncate((next() % (bytes.len() as u64 + 1)) as usize);
            if let Ok(Parsed::Complete { consumed, .. }) = parse(&bytes) {
                assert!(consumed <= bytes.len());
                completes += 1;
            }
        }
        assert!(
            completes > 100,
            "mutations should sometimes still parse: {completes}"
        );
    }

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        client.set_nodelay(true).unwrap();
        (client, server)
    }

    const HTTP: &[u8] = b"GET / HTTP/1.1\r\nHost: weir.test\r\n\r\n";

    /// After the header, the application bytes are all still there.
    async fn rest_of(mut server: TcpStream) -> Vec<u8> {
        let mut rest = Vec::new();
        server.read_to_end(&mut rest).await.unwrap();
        rest
    }

    #[tokio::test]
    async fn reads_header_and_leaves_application_bytes() {
        let src: SocketAddr = "192.0.2.1:56324".parse().unwrap();
        let dst: SocketAddr = "198.51.100.2:443".parse().unwrap();
        let tlvs: &[(u8, &[u8])] = &[(0x01, b"h2"), (0xea, &[7; 40])];
        for (version, header) in [
            (1, encode_v1(Some((src, dst)))),
            (2, encode_v2_with_tlvs(Some((src, dst)), tlvs)),
        ] {
            let (mut client, server) = pair().await;
            client
                .write_all(&[header.as_slice(), HTTP].concat())
                .await
                .unwrap();
            client.shutdown().await.unwrap();
            let got = read_header(&server, Duration::from_secs(5)).await.unwrap();
            assert_eq!(got.source, Some(src));
            assert_eq!(got.destination, Some(dst));
            assert_eq!(got.version, version);
            assert_eq!(rest_of(server).await, HTTP, "v{version}");
        }
    }

    #[tokio::test]
    async fn waits_for_a_fragmented_header() {
        let src: SocketAddr = "[2001:db8::1]:4711".parse().unwrap();
        let dst: SocketAddr = "[2001:db8::2]:443".parse().unwrap();
        for (version, header) in [
            (1, encode_v1(Some((src, dst)))),
            (2, encode_v2(Some((src, dst)))),
        ] {
            let (mut client, server) = pair().await;
            let mut reading = tokio::spawn(async move {
                let got = read_header(&server, Duration::from_secs(5)).await;
                (got, server)
            });
            let (first, second) = header.split_at(header.len() / 2);
            client.write_all(first).await.unwrap();
            // The reader must still be waiting: half a header is not a header.
            let early = tokio::time::timeout(Duration::from_millis(100), &mut reading).await;
            assert!(early.is_err(), "v{version}: finished on half a header");
            client.write_all(&[second, HTTP].concat()).await.unwrap();
            client.shutdown().await.unwrap();
            let (got, server) = reading.await.unwrap();
            let got = got.unwrap();
            assert_eq!(
                (got.source, got.destination, got.version),
                (Some(src), Some(dst), version)
            );
            assert_eq!(rest_of(server).await, HTTP, "v{version}");
        }
    }

    #[tokio::test]
    async fn times_out_on_silence_and_on_half_a_header() {
        for sent in [&b""[..], b"PROXY TCP4 192.0.2.1"] {
            let (mut client, server) = pair().await;
            client.write_all(sent).await.unwrap();
            let err = read_header(&server, Duration::from_millis(100))
                .await
                .unwrap_err();
            match err {
                ProxyProtocolError::Timeout { after, received } => {
                    assert_eq!(after, Duration::from_millis(100));
                    assert_eq!(received, sent.len());
                }
                other => panic!("sent {:?}: {other}", sent.escape_ascii().to_string()),
            }
            drop(client);
        }
    }

    #[tokio::test]
    async fn rejects_non_proxy_and_early_close() {
        let (mut client, server) = pair().await;
        client.write_all(HTTP).await.unwrap();
        let err = read_header(&server, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, ProxyProtocolError::NotProxy { .. }), "{err}");
        assert!(err.to_string().contains("GET / HTTP/1.1"), "{err}");

        let (mut client, server) = pair().await;
        client.write_all(b"PROXY TCP4 ").await.unwrap();
        client.shutdown().await.unwrap();
        let err = read_header(&server, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(
            matches!(err, ProxyProtocolError::Closed { received: 11 }),
            "{err}"
        );

        let (mut client, server) = pair().await;
        client
            .write_all(&[b"PROXY ", &[b'A'; 120][..]].concat())
            .await
            .unwrap();
        let err = read_header(&server, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, ProxyProtocolError::V1TooLong { .. }), "{err}");
    }
}
