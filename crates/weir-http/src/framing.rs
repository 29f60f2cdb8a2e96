//! HTTP/1 message framing shared by both sides of the proxy (RFC 9112
//! §6-7): how a body is delimited, `Content-Length` values, and the
//! chunked decoder. The client side ([`crate::server`]) decodes request
//! bodies with it, the upstream side ([`crate::client`]) response bodies.

use bytes::{Buf, Bytes, BytesMut};

/// Longest chunk-size line (with extensions) or trailer field.
pub const MAX_CHUNK_LINE: usize = 4096;

/// What a message head's fields say about its body's framing and its
/// connection, read field by field by either side's parser.
#[derive(Debug, Default, Clone, Copy)]
pub struct HopFields {
    pub content_length: Option<u64>,
    /// `Transfer-Encoding` present: whether its last coding is `chunked`.
    pub chunked: Option<bool>,
    /// `Transfer-Encoding` names a coding other than one `chunked` (or came
    /// in more than one field): a request with it is refused, since weir
    /// would have to drop the coding or decode it (nginx: 501).
    pub other_coding: bool,
    /// `Connection: close`.
    pub close: bool,
    /// `Connection: keep-alive`.
    pub keep_alive: bool,
}

/// What one field of a head is to the hop that carried it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldRole {
    /// An end-to-end field.
    EndToEnd,
    /// `Content-Length` or `Transfer-Encoding`: framed this hop's body;
    /// the next hop gets its own framing.
    Framing,
    /// Only framed this hop's connection (a `Connection` naming only close
    /// or keep-alive, `Keep-Alive`): spent here rather than stored, hashed
    /// and removed again by the hop-by-hop pass.
    Spent,
    /// A `Connection` field naming other fields, which are then hop-by-hop
    /// too.
    ConnectionOptions,
}

impl HopFields {
    /// Notes one field; `name` in any case.
    pub fn note(&mut self, name: &[u8], value: &[u8]) -> Result<FieldRole, FramingError> {
        // Most fields are none of these: their length says so without a
        // look at their bytes.
        if !matches!(name.len(), 10 | 14 | 17) {
            return Ok(FieldRole::EndToEnd);
        }
        if is_name(name, b"content-length") {
            let n = parse_content_length(value)?;
            if self.content_length.is_some_and(|m| m != n) {
                return Err(FramingError("conflicting Content-Length values"));
            }
            self.content_length = Some(n);
            Ok(FieldRole::Framing)
        } else if is_name(name, b"transfer-encoding") {
            let last = value.rsplit(|b| *b == b',').next().unwrap_or(b"");
            let only_chunked = value.trim_ascii().eq_ignore_ascii_case(b"chunked");
            self.other_coding |= self.chunked.is_some() || !only_chunked;
            self.chunked = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            Ok(FieldRole::Framing)
        } else if is_name(name, b"connection") {
            let mut names_fields = false;
            for token in value.split(|b| *b == b',') {
                let token = token.trim_ascii();
                let is_close = is_name(token, b"close");
                let is_keep_alive = is_name(token, b"keep-alive");
                self.close |= is_close;
                self.keep_alive |= is_keep_alive;
                names_fields |= !(is_close || is_keep_alive || token.is_empty());
            }
            Ok(if names_fields {
                FieldRole::ConnectionOptions
            } else {
                FieldRole::Spent
            })
        } else if is_name(name, b"keep-alive") {
            Ok(FieldRole::Spent)
        } else {
            Ok(FieldRole::EndToEnd)
        }
    }
}

/// Whether a request's `Transfer-Encoding` fields (whichever codec read
/// them) are at most one, saying exactly `chunked`: the same check for
/// the HTTP/1 codec's requests and hyper's (TLS), which accepts
/// `gzip, chunked` and would leave the gzip to the app with nothing saying so.
pub fn only_chunked(headers: &http::HeaderMap) -> bool {
    let mut fields = headers.get_all(http::header::TRANSFER_ENCODING).iter();
    match (fields.next(), fields.next()) {
        (None, _) => true,
        (Some(v), None) => v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"chunked"),
        (Some(_), Some(_)) => false,
    }
}

/// Whether `name` is the field name `lower` (lowercase letters and
/// hyphens) in any case.
///
/// Names reaching here were parsed as tokens, and among token bytes setting
/// bit 5 maps only a letter's two cases onto a lowercase letter and only a
/// hyphen onto a hyphen: so one OR per byte, with none of
/// `eq_ignore_ascii_case`'s per-byte branches, which the compiler then does
/// a word at a time. (Also exact for the words of a `Connection` value,
/// which holds no CR, the one other byte that maps onto a hyphen.)
#[inline]
pub fn is_name(name: &[u8], lower: &[u8]) -> bool {
    debug_assert!(lower.iter().all(|b| b.is_ascii_lowercase() || *b == b'-'));
    name.len() == lower.len()
        && name
            .iter()
            .zip(lower)
            .fold(0u8, |diff, (a, b)| diff | ((a | 0x20) ^ b))
            == 0
}

/// Whether a field name (any case) is hop-by-hop, always removed by a
/// proxy (RFC 9110 §7.6.1, plus the non-standard `Keep-Alive` and
/// `Proxy-Connection`). Fields a `Connection` names are hop-by-hop too.
pub fn is_hop_by_hop(name: &[u8]) -> bool {
    match name.len() {
        2 => is_name(name, b"te"),
        7 => is_name(name, b"trailer") || is_name(name, b"upgrade"),
        10 => is_name(name, b"connection") || is_name(name, b"keep-alive"),
        16 => is_name(name, b"proxy-connection"),
        17 => is_name(name, b"transfer-encoding"),
        19 => is_name(name, b"proxy-authorization"),
        _ => false,
    }
}

/// Appends one `name: value` field line to a head being written.
pub fn write_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Appends the `Content-Length: n` field line.
pub fn write_content_length(out: &mut Vec<u8>, n: u64) {
    write_field(
        out,
        b"content-length",
        itoa::Buffer::new().format(n).as_bytes(),
    );
}

/// `{len:x}\r\n`, a chunk's size line, in `buf`.
pub fn chunk_size_line(buf: &mut [u8; 18], len: usize) -> &[u8] {
    let digits = (usize::BITS - len.leading_zeros()).div_ceil(4).max(1) as usize;
    for (i, digit) in buf.iter_mut().take(digits).enumerate() {
        *digit = b"0123456789abcdef"[(len >> (4 * (digits - 1 - i))) & 0xf];
    }
    buf[digits] = b'\r';
    buf[digits + 1] = b'\n';
    &buf[..digits + 2]
}

/// A body's framing is broken; the message cannot be read further.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FramingError(pub &'static str);

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body: `HEAD`, 1xx, 204, 304 (or a body already read whole).
    Empty,
    /// `Content-Length`: this many bytes are still to come.
    Length(u64),
    Chunked(Chunk),
    /// No length: the body ends when the server closes the connection.
    UntilClose,
}

impl Framing {
    /// The whole body has been taken.
    pub fn is_end(&self) -> bool {
        matches!(
            self,
            Framing::Empty | Framing::Length(0) | Framing::Chunked(Chunk::Done)
        )
    }
}

/// Where a chunked body's decoder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunk {
    /// At a chunk-size line.
    Size,
    /// Inside a chunk's data, with this many bytes to go.
    Data(u64),
    /// After a chunk's data, at its CRLF.
    DataEnd,
    /// After the last chunk, at the trailer section (discarded).
    Trailers,
    Done,
}

/// The largest `Content-Length` read: a signed 64-bit size, as nginx's
/// `off_t` (a larger one is a smuggling probe, not a body).
pub const MAX_CONTENT_LENGTH: u64 = i64::MAX as u64;

/// `Content-Length`: digits, or a list of one value repeated (RFC 9110
/// §8.6 lets a recipient accept `42, 42`), at most [`MAX_CONTENT_LENGTH`].
pub fn parse_content_length(v: &[u8]) -> Result<u64, FramingError> {
    let bad = FramingError("invalid Content-Length");
    let mut value: Option<u64> = None;
    for part in v.split(|b| *b == b',') {
        let part = part.trim_ascii();
        if part.is_empty() || part.len() > 19 || !part.iter().all(u8::is_ascii_digit) {
            return Err(bad);
        }
        let n = part.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
        if n > MAX_CONTENT_LENGTH {
            return Err(FramingError("Content-Length too large"));
        }
        if value.is_some_and(|m| m != n) {
            return Err(bad);
        }
        value = Some(n);
    }
    value.ok_or(bad)
}

/// Decodes from `buf` until a piece of chunk data is ready (`Some`), the
/// body ends (`None`, `chunk` is `Done`), or more input is needed (`None`).
pub fn decode_chunk(chunk: &mut Chunk, buf: &mut BytesMut) -> Result<Option<Bytes>, FramingError> {
    decode_chunk_until_data(chunk, buf)?;
    if let Chunk::Data(left) = chunk
        && !buf.is_empty()
    {
        let data = take_up_to(buf, left);
        if *left == 0 {
            *chunk = Chunk::DataEnd;
        }
        return Ok(Some(data));
    }
    Ok(None)
}

/// Takes what `buf` holds of the `left` bytes still to come, counting them off.
pub fn take_up_to(buf: &mut BytesMut, left: &mut u64) -> Bytes {
    let take = buf.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
    *left -= take as u64;
    buf.split_to(take).freeze()
}

/// Moves the decoder over everything but data, as far as `buf` allows.
pub fn decode_chunk_until_data(chunk: &mut Chunk, buf: &mut BytesMut) -> Result<(), FramingError> {
    loop {
        match *chunk {
            Chunk::Data(_) | Chunk::Done => return Ok(()),
            Chunk::DataEnd => {
                if buf.len() < 2 {
                    return Ok(());
                }
                if &buf[..2] != b"\r\n" {
                    return Err(FramingError("chunk data not followed by CRLF"));
                }
                buf.advance(2);
                *chunk = Chunk::Size;
            }
            Chunk::Size => {
                let Some(line) = take_line(buf, "chunk-size line")? else {
                    return Ok(());
                };
                let size = chunk_size(&line)?;
                *chunk = if size == 0 {
                    Chunk::Trailers
                } else {
                    Chunk::Data(size)
                };
            }
            Chunk::Trailers => {
                let Some(line) = take_line(buf, "trailer field")? else {
                    return Ok(());
                };
                // Trailer fields are checked, then dropped: few clients ask
                // for them, and the head has already gone.
                if line.is_empty() {
                    *chunk = Chunk::Done;
                } else {
                    check_trailer(&line)?;
                }
            }
        }
    }
}

/// Takes one CRLF-ended line (a chunk-size line or a trailer field) from
/// `buf`, without its CRLF. A bare CR or LF anywhere in it is refused: one
/// reader taking it as a line end and the next not is how a body gets
/// split into two requests (RFC 9112 §7.1: CRLF, and nothing else).
fn take_line(buf: &mut BytesMut, what: &'static str) -> Result<Option<BytesMut>, FramingError> {
    let Some(lf) = memchr::memchr(b'\n', buf) else {
        if buf.len() > MAX_CHUNK_LINE {
            return Err(FramingError(match what {
                "trailer field" => "trailer field too long",
                _ => "chunk-size line too long",
            }));
        }
        if memchr::memchr(b'\r', buf).is_some_and(|cr| cr + 1 < buf.len()) {
            return Err(FramingError("bare CR in a chunk line"));
        }
        return Ok(None);
    };
    if lf == 0 || buf[lf - 1] != b'\r' {
        return Err(FramingError("bare LF in a chunk line"));
    }
    if memchr::memchr(b'\r', &buf[..lf - 1]).is_some() {
        return Err(FramingError("bare CR in a chunk line"));
    }
    let mut line = buf.split_to(lf + 1);
    line.truncate(lf - 1);
    Ok(Some(line))
}

/// A chunk-size line (RFC 9112 §7.1): hex digits (at least one, at most 16),
/// then extensions (`;name` or `;name=value`, discarded), whose bytes must
/// be visible ASCII, space or tab.
fn chunk_size(line: &[u8]) -> Result<u64, FramingError> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err(FramingError("invalid chunk size"));
    }
    if digits > 16 {
        return Err(FramingError("chunk size too large"));
    }
    let rest = &line[digits..];
    let rest = rest.trim_ascii_start();
    if !(rest.is_empty() || rest[0] == b';') {
        return Err(FramingError("invalid chunk size"));
    }
    if !rest
        .iter()
        .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b))
    {
        return Err(FramingError("invalid chunk extension"));
    }
    let size = line[..digits].iter().fold(0u64, |n, &d| {
        let v = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            _ => d - b'A' + 10,
        };
        n << 4 | u64::from(v)
    });
    Ok(size)
}

/// A trailer field line: a token name, `:`, and a value of visible ASCII,
/// space, tab or obs-text.
fn check_trailer(line: &[u8]) -> Result<(), FramingError> {
    let bad = FramingError("malformed trailer field");
    let colon = memchr::memchr(b':', line).ok_or(bad)?;
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    let token = |b: &u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b);
    if name.is_empty() || !name.iter().all(token) {
        return Err(bad);
    }
    if !value.iter().all(|&b| b == b'\t' || b >= b' ' && b != 0x7f) {
        return Err(bad);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `wire` as a chunked body in one piece: the data, or the error.
    fn dechunk(wire: &[u8]) -> Result<Vec<u8>, FramingError> {
        let mut buf = BytesMut::from(wire);
        let mut chunk = Chunk::Size;
        let mut out = Vec::new();
        while let Some(data) = decode_chunk(&mut chunk, &mut buf)? {
            out.extend_from_slice(&data);
        }
        if chunk != Chunk::Done {
            return Err(FramingError("incomplete"));
        }
        Ok(out)
    }

    #[test]
    fn chunked_framing_is_strict() {
        let ok: &[(&[u8], &[u8])] = &[
            (b"3\r\nabc\r\n0\r\n\r\n", b"abc"),
            (b"3;name=value\r\nabc\r\n0\r\n\r\n", b"abc"),
            (b"3 ;x\r\nabc\r\n0\r\n\r\n", b"abc"),
            (b"A\r\n0123456789\r\n0\r\nX-Sum: 1\r\n\r\n", b"0123456789"),
            (b"0000000000000003\r\nabc\r\n0\r\n\r\n", b"abc"),
        ];
        for (wire, want) in ok {
            assert_eq!(
                dechunk(wire).as_deref(),
                Ok(*want),
                "{}",
                String::from_utf8_lossy(wire)
            );
        }
        // Issue 18: a bare LF in a chunk extension made one POST two
        // requests upstream; an empty size line ended the body.
        let refused: &[(&[u8], &str)] = &[
            (b"3;x\nabc\r\n0\r\n\r\n", "bare LF"),
            (b"3\nabc\r\n0\r\n\r\n", "bare LF"),
            (b"3;a\rb\r\nabc\r\n0\r\n\r\n", "bare CR"),
            (b"\r\nabc\r\n0\r\n\r\n", "invalid chunk size"),
            (b"x\r\n", "invalid chunk size"),
            (b"3x\r\nabc\r\n", "invalid chunk size"),
            (b"10000000000000000\r\n", "chunk size too large"),
            (b"3;\x01\r\nabc\r\n0\r\n\r\n", "invalid chunk extension"),
            (b"3\r\nabc\r\n0\r\nno colon\r\n\r\n", "malformed trailer"),
            (b"3\r\nabc\r\n0\r\nBad Name: 1\r\n\r\n", "malformed trailer"),
            (b"3\r\nabc\r\n0\r\nX: a\x00b\r\n\r\n", "malformed trailer"),
            (b"3\r\nabc\r\n0\r\nX: 1\n\r\n", "bare LF"),
            (b"3\r\nabcd\r\n0\r\n\r\n", "not followed by CRLF"),
        ];
        for (wire, why) in refused {
            let got = dechunk(wire);
            assert!(
                got.as_ref().is_err_and(|e| e.0.contains(why)),
                "{}: {got:?}",
                String::from_utf8_lossy(wire)
            );
        }
    }

    #[test]
    fn lengths_and_codings() {
        assert_eq!(parse_content_length(b"42"), Ok(42));
        assert_eq!(parse_content_length(b"42, 42"), Ok(42));
        assert_eq!(
            parse_content_length(b"9223372036854775807"),
            Ok(MAX_CONTENT_LENGTH)
        );
        assert!(parse_content_length(b"9223372036854775808").is_err());
        assert!(parse_content_length(b"9999999999999999999").is_err());
        assert!(parse_content_length(b"-1").is_err());
        let note = |fields: &[(&str, &str)]| {
            let mut hop = HopFields::default();
            for (n, v) in fields {
                hop.note(n.as_bytes(), v.as_bytes()).unwrap();
            }
            hop
        };
        assert!(!note(&[("Transfer-Encoding", "chunked")]).other_coding);
        assert!(note(&[("Transfer-Encoding", "gzip, chunked")]).other_coding);
        assert!(
            note(&[
                ("Transfer-Encoding", "chunked"),
                ("transfer-encoding", "chunked")
            ])
            .other_coding
        );
        let mut h = http::HeaderMap::new();
        assert!(only_chunked(&h));
        h.append(
            "transfer-encoding",
            http::HeaderValue::from_static("chunked"),
        );
        assert!(only_chunked(&h));
        h.append(
            "transfer-encoding",
            http::HeaderValue::from_static("chunked"),
        );
        assert!(!only_chunked(&h));
    }

    /// `is_name` agrees with `eq_ignore_ascii_case` for every name that
    /// differs from a field name in one byte, over every byte a parsed
    /// name or `Connection` value can hold (visible ASCII, space, tab,
    /// obs-text).
    #[test]
    fn names_compare_like_eq_ignore_ascii_case() {
        let bytes = (0x20..=0x7eu8).chain([b'\t']).chain(0x80..=0xff);
        let bytes: Vec<u8> = bytes.collect();
        for lower in [&b"content-length"[..], b"connection", b"close", b"te"] {
            assert!(is_name(&lower.to_ascii_uppercase(), lower));
            for at in 0..lower.len() {
                for &b in &bytes {
                    let mut name = lower.to_vec();
                    name[at] = b;
                    assert_eq!(
                        is_name(&name, lower),
                        name.eq_ignore_ascii_case(lower),
                        "{:?}",
                        String::from_utf8_lossy(&name)
                    );
                }
            }
            assert!(!is_name(&lower[1..], lower));
        }
    }
}
