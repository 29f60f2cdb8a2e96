//! An upstream response's fields as they arrived, forwarded to the client
//! without first being parsed into a `HeaderMap`.
//!
//! A `HeaderMap` costs a name lookup, a hash and an insert per field, and
//! weir's own HTTP/1 codec would only iterate it to write the fields out
//! again: for a plain response that was a tenth of weir's work per request.
//! So a plain response keeps its field lines as spans of the head's bytes
//! ([`ReceivedFields`], carried by the response body) and the client codec
//! copies them as they came. A stage that reads upstream fields (request
//! coalescing, hyper's connections) first moves them into the response's
//! map with [`ReceivedFields::append_to`]; fields weir adds go in the map
//! either way.
//!
//! Only the common shape takes this path: no interim `101`, every line
//! ending in CRLF, and no `Connection` field naming other fields.
//! Anything else is parsed into the map as before.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use smallvec::SmallVec;

use crate::framing::{FieldRole, FramingError, HopFields, is_hop_by_hop, is_name};

/// A plain response's end-to-end field lines, as received.
#[derive(Debug, Clone)]
pub struct ReceivedFields {
    head: Bytes,
    /// Spans of `head` written as they are: runs of whole field lines, each
    /// ending in CRLF. The fields that framed the upstream hop are left out.
    runs: SmallVec<[(u32, u32); 2]>,
    /// What the upstream's `Content-Length` said. A response without a
    /// body (to `HEAD`, a `304`) keeps it: there it describes the resource.
    declared_length: Option<u64>,
    has_date: bool,
}

impl ReceivedFields {
    /// Reads the fields `parsed` found in `head` (whose bytes they borrow),
    /// noting framing in `hop`. `None`: not a plain response; the caller
    /// parses it into a map.
    pub fn read(
        head: &[u8],
        parsed: &[httparse::Header<'_>],
        hop: &mut HopFields,
    ) -> Result<Option<ReceivedFields>, FramingError> {
        let base = head.as_ptr() as usize;
        let mut runs: SmallVec<[(u32, u32); 2]> = SmallVec::new();
        let mut has_date = false;
        for field in parsed {
            let name = field.name.as_bytes();
            let start = name.as_ptr() as usize - base;
            // httparse drops trailing whitespace from the value: then the
            // line's end is found by looking for it.
            let value_end = if field.value.is_empty() {
                start + name.len()
            } else {
                field.value.as_ptr() as usize - base + field.value.len()
            };
            let end = if head.get(value_end..value_end + 2) == Some(b"\r\n") {
                value_end + 2
            } else {
                match head[value_end..].iter().position(|b| *b == b'\n') {
                    Some(i) if i > 0 && head[value_end + i - 1] == b'\r' => value_end + i + 1,
                    _ => return Ok(None),
                }
            };
            match hop.note(name, field.value)? {
                FieldRole::EndToEnd if !is_hop_by_hop(name) => {}
                FieldRole::ConnectionOptions => return Ok(None),
                _ => continue,
            }
            has_date |= is_name(name, b"date");
            let (start, end) = (start as u32, end as u32);
            match runs.last_mut() {
                Some(run) if run.1 == start => run.1 = end,
                _ => runs.push((start, end)),
            }
        }
        Ok(Some(ReceivedFields {
            head: Bytes::new(),
            runs,
            declared_length: hop.content_length,
            has_date,
        }))
    }

    /// Attaches the head's bytes, once the parser's borrow of them is over.
    pub fn with_head(mut self, head: Bytes) -> ReceivedFields {
        self.head = head;
        self
    }

    /// Whether the upstream sent a `Date`.
    pub fn has_date(&self) -> bool {
        self.has_date
    }

    pub fn declared_length(&self) -> Option<u64> {
        self.declared_length
    }

    /// The values of the fields named `name` (case-insensitive), trimmed,
    /// in the order received: for a stage that reads one field without
    /// moving them all into a map.
    pub fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.runs
            .iter()
            .flat_map(|&(start, end)| {
                self.head[start as usize..end as usize].split_inclusive(|b| *b == b'\n')
            })
            .filter_map(move |line| {
                let colon = line.iter().position(|b| *b == b':')?;
                line[..colon]
                    .eq_ignore_ascii_case(name.as_bytes())
                    .then(|| line[colon + 1..].trim_ascii())
            })
    }

    /// Appends the field lines, as received.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        for &(start, end) in &self.runs {
            out.extend_from_slice(&self.head[start as usize..end as usize]);
        }
    }

    /// Moves the fields into `headers` (after any already there), with the
    /// upstream's `Content-Length`, for a stage or codec that reads a map.
    pub fn append_to(self, headers: &mut HeaderMap) {
        for &(start, end) in &self.runs {
            let mut at = start as usize;
            for line in self.head[start as usize..end as usize].split_inclusive(|b| *b == b'\n') {
                let colon = line.iter().position(|b| *b == b':').unwrap_or(line.len());
                let value = line.get(colon + 1..).unwrap_or_default();
                let trimmed = value.trim_ascii();
                let value_at = at + colon + 1 + (value.len() - value.trim_ascii_start().len());
                // The parser accepted both already; a failure here would be
                // a bug, and the field is dropped rather than the response.
                if let (Ok(name), Ok(value)) = (
                    HeaderName::from_bytes(&line[..colon]),
                    HeaderValue::from_maybe_shared(
                        self.head.slice(value_at..value_at + trimmed.len()),
                    ),
                ) {
                    headers.append(name, value);
                }
                at += line.len();
            }
        }
        if let Some(n) = self.declared_length {
            headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from(n));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses a response head the way [`crate::client`] does.
    fn read(head: &'static [u8]) -> (Option<ReceivedFields>, HopFields) {
        let mut slots = [httparse::EMPTY_HEADER; 32];
        let mut parsed = httparse::Response::new(&mut slots);
        let len = match parsed.parse(head).expect("head parses") {
            httparse::Status::Complete(len) => len,
            httparse::Status::Partial => panic!("partial head"),
        };
        let mut hop = HopFields::default();
        let fields = ReceivedFields::read(head, parsed.headers, &mut hop).expect("framing");
        let bytes = Bytes::from_static(&head[..len]);
        (fields.map(|f| f.with_head(bytes)), hop)
    }

    fn written(f: &ReceivedFields) -> String {
        let mut out = Vec::new();
        f.write_to(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn end_to_end_lines_pass_as_received_and_framing_is_noted() {
        let (f, hop) = read(
            b"HTTP/1.1 200 OK\r\nServer: app\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\
              Keep-Alive: timeout=5\r\nX-Trace:  a b \r\nDate: Mon, 30 Nov 2026 18:00:00 GMT\r\n\r\nhello",
        );
        let f = f.expect("plain response");
        assert_eq!(
            written(&f),
            "Server: app\r\nX-Trace:  a b \r\nDate: Mon, 30 Nov 2026 18:00:00 GMT\r\n"
        );
        assert!(f.has_date());
        assert_eq!(f.declared_length(), Some(5));
        assert_eq!(hop.content_length, Some(5));
        assert!(hop.keep_alive && !hop.close);
    }

    #[test]
    fn one_field_is_read_without_a_map() {
        let (f, _) = read(
            b"HTTP/1.1 200 OK\r\nCache-Control: public, max-age=300\r\nX: 1\r\n\
              cache-control:  s-maxage=60 \r\nContent-Length: 0\r\n\r\n",
        );
        let f = f.expect("plain response");
        let got: Vec<&[u8]> = f.values("Cache-Control").collect();
        assert_eq!(got, [&b"public, max-age=300"[..], &b"s-maxage=60"[..]]);
        assert_eq!(f.values("x").collect::<Vec<_>>(), [&b"1"[..]]);
        assert_eq!(f.values("missing").count(), 0);
    }

    #[test]
    fn hop_by_hop_fields_are_left_out() {
        let (f, hop) = read(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTE: trailers\r\nTrailer: x\r\n\
              Proxy-Connection: close\r\nUpgrade: h2c\r\nConnection: close\r\n\
              Proxy-Authorization: x\r\nA: 1\r\n\r\n",
        );
        let f = f.expect("plain response");
        assert_eq!(written(&f), "A: 1\r\n");
        assert!(!f.has_date());
        assert_eq!(hop.chunked, Some(true));
        assert!(hop.close);
    }

    #[test]
    fn unusual_heads_are_left_to_the_map() {
        // A Connection naming another field, and bare LF line ends.
        let (f, _) = read(b"HTTP/1.1 200 OK\r\nConnection: x-secret\r\nX-Secret: 1\r\n\r\n");
        assert!(f.is_none());
        let (f, _) = read(b"HTTP/1.1 200 OK\nA: 1\nB: 2\n\n");
        assert!(f.is_none());
    }

    #[test]
    fn empty_values_and_the_map_agree_with_the_lines() {
        let (f, _) = read(
            b"HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\nX-Empty:\r\nSet-Cookie: a=1\r\n\
              Content-Length: 9\r\nSet-Cookie: b=2 \r\n\r\n",
        );
        let f = f.expect("plain response");
        assert_eq!(
            written(&f),
            "ETag: \"x\"\r\nX-Empty:\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2 \r\n"
        );
        let mut map = HeaderMap::new();
        map.insert("x-weir", HeaderValue::from_static("added"));
        f.append_to(&mut map);
        assert_eq!(map["etag"], "\"x\"");
        assert_eq!(map["x-empty"], "");
        let cookies: Vec<_> = map.get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert_eq!(map["content-length"], "9");
        assert_eq!(map["x-weir"], "added");
        assert_eq!(map.len(), 6);
    }
}
