//! Access-log parsers for `weir replay`: real logs in, [`LogRecord`]s out.
//!
//! Formats:
//! - [`LogFormat::Combined`]: nginx/Apache combined,
//!   `$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent
//!   "$http_referer" "$http_user_agent"`, optionally followed by the extra fields named in
//!   [`ReaderOptions::trailing`] (e.g. `"$http_cookie"`, `"$http_x_forwarded_for"`);
//! - [`LogFormat::Caddy`]: Caddy's JSON access log (`logger` `http.log.access*`);
//! - [`LogFormat::Weir`]: weir's own JSON access log ([`weir::observe::access_log`]).
//!
//! Gzip input is recognised by its magic bytes; the format is detected from the first
//! non-empty line unless forced. Parsing borrows from the line buffer ([`LogRecord`] fields
//! are `Cow::Borrowed` except where JSON escapes had to be decoded), so
//! [`LogReader::for_each_record`] allocates nothing per line; that is the fast path.
//! [`OrderedRecords`] yields owned records in log-time order (logs are written at request
//! completion, so they are only nearly sorted), and [`MergedRecords`] merges files by time.
//! Malformed lines are counted per reason with the first few kept as examples
//! ([`ParseStats`]); they are never fatal.
//!
//! ```
//! use weir_replay::{LogFormat, LogReader, ReaderOptions};
//!
//! let log = "203.0.113.9 - - [10/Oct/2026:13:55:36 +0900] \"GET /w/index.php?diff=2 HTTP/1.1\" 200 512 \"-\" \"curl/8\"\n\
//!            garbage\n";
//! let mut reader = LogReader::new(log.as_bytes(), ReaderOptions::default()).unwrap();
//! let mut paths = Vec::new();
//! reader.for_each_record(|r| paths.push(r.target.to_string())).unwrap();
//! assert_eq!(paths, ["/w/index.php?diff=2"]);
//! assert_eq!(reader.format(), Some(LogFormat::Combined));
//! assert_eq!(reader.stats().malformed, 1);
//! assert_eq!(reader.stats().examples[0].line, 2);
//! ```
//!
//! This module does not decide anything about the records (that is `weir replay`'s policy
//! run), does not resolve forwarded-for chains against trusted proxies (the record carries
//! the raw header for that), and does not unescape nginx/Apache `\xNN` sequences (fields are
//! kept as written).

#![cfg_attr(
    test,
    allow(clippy::too_many_lines, reason = "a test reads as one story")
)]

pub mod agent;
mod combined;
pub mod engine;
pub mod html;
mod json;
mod reader;
mod tally;
pub mod time;

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr};

pub use combined::TrailingField;
pub use reader::{
    ByteCount, LogReader, MalformedLine, MergedRecords, OrderedRecords, ParseStats, ParsedLine,
    ReaderOptions,
};
pub use time::UnixNanos;

/// A log format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogFormat {
    /// nginx/Apache combined, plus configured trailing fields.
    Combined,
    /// Caddy JSON access log.
    Caddy,
    /// weir's own JSON access log.
    Weir,
}

impl LogFormat {
    pub fn as_str(&self) -> &'static str {
        match self {
            LogFormat::Combined => "combined",
            LogFormat::Caddy => "caddy",
            LogFormat::Weir => "weir",
        }
    }

    /// The format a line is written in; `None` for a blank line.
    pub fn detect(line: &str) -> Option<LogFormat> {
        let line = line.trim();
        if line.is_empty() {
            return None;
        }
        if !line.starts_with('{') {
            return Some(LogFormat::Combined);
        }
        // weir writes `decision`; Caddy nests the request in `request`.
        if line.contains("\"decision\"") && line.contains("\"client\"") {
            Some(LogFormat::Weir)
        } else {
            Some(LogFormat::Caddy)
        }
    }
}

impl std::str::FromStr for LogFormat {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<LogFormat, ParseError> {
        match s {
            "combined" | "nginx" | "apache" => Ok(LogFormat::Combined),
            "caddy" => Ok(LogFormat::Caddy),
            "weir" => Ok(LogFormat::Weir),
            other => Err(ParseError::UnknownFormat(other.to_string())),
        }
    }
}

/// What weir's own log says it decided, when replaying a weir log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeirFields<'a> {
    pub class: Cow<'a, str>,
    pub decision: Cow<'a, str>,
    pub rule: Option<Cow<'a, str>>,
    /// A navigation's visit as weir counted it before the request
    /// (`visit_views`, `visit_costly`, `visit_age_s`).
    pub visit: Option<weir::observe::access_log::LoggedVisit>,
}

/// One request from a log. Absent fields (`-` in combined logs) are `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord<'a> {
    /// When the log says the request happened (nginx: completion; weir: start).
    pub time: UnixNanos,
    /// The client as the log's writer saw it (Caddy: `client_ip` when set).
    pub client: IpAddr,
    /// The direct TCP peer, when the log has it separately (Caddy `remote_ip`, weir `peer`).
    pub peer: Option<IpAddr>,
    pub method: Cow<'a, str>,
    pub host: Option<Cow<'a, str>>,
    /// Path and query, as requested.
    pub target: Cow<'a, str>,
    pub status: u16,
    /// Response body bytes.
    pub bytes: u64,
    pub user_agent: Option<Cow<'a, str>>,
    pub referer: Option<Cow<'a, str>>,
    /// The whole `Cookie` header.
    pub cookie: Option<Cow<'a, str>>,
    pub accept: Option<Cow<'a, str>>,
    pub sec_fetch_mode: Option<Cow<'a, str>>,
    /// The raw `X-Forwarded-For` header, unresolved.
    pub forwarded_for: Option<Cow<'a, str>>,
    /// Only for [`LogFormat::Weir`].
    pub weir: Option<WeirFields<'a>>,
}

fn own(c: Cow<'_, str>) -> Cow<'static, str> {
    Cow::Owned(c.into_owned())
}

impl LogRecord<'_> {
    /// A copy that owns its strings, to outlive the line buffer.
    pub fn into_owned(self) -> LogRecord<'static> {
        LogRecord {
            time: self.time,
            client: self.client,
            peer: self.peer,
            method: own(self.method),
            host: self.host.map(own),
            target: own(self.target),
            status: self.status,
            bytes: self.bytes,
            user_agent: self.user_agent.map(own),
            referer: self.referer.map(own),
            cookie: self.cookie.map(own),
            accept: self.accept.map(own),
            sec_fetch_mode: self.sec_fetch_mode.map(own),
            forwarded_for: self.forwarded_for.map(own),
            weir: self.weir.map(|w| WeirFields {
                class: own(w.class),
                decision: own(w.decision),
                rule: w.rule.map(own),
                visit: w.visit,
            }),
        }
    }
}

/// Why a line is not a record. Messages name the bad part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("line is not UTF-8")]
    NotUtf8,
    #[error("client address `{0}` is not an IP address")]
    BadAddress(String),
    #[error("time `{0}` is not a valid timestamp")]
    BadTime(String),
    #[error("request line `{0}` is not `METHOD TARGET PROTOCOL`")]
    BadRequestLine(String),
    #[error("status `{0}` is not a 3-digit HTTP status")]
    BadStatus(String),
    #[error("byte count `{0}` is not a number")]
    BadBytes(String),
    #[error("field `{0}` is missing")]
    Missing(&'static str),
    #[error("quoted field starting at byte {0} has no closing quote")]
    UnterminatedQuote(usize),
    #[error("JSON: {0}")]
    Json(String),
    #[error("unknown log format `{0}`: expected combined, caddy or weir")]
    UnknownFormat(String),
}

impl ParseError {
    /// A short label per kind, for counts and metric labels.
    pub fn kind(&self) -> &'static str {
        match self {
            ParseError::NotUtf8 => "not_utf8",
            ParseError::BadAddress(_) => "bad_address",
            ParseError::BadTime(_) => "bad_time",
            ParseError::BadRequestLine(_) => "bad_request_line",
            ParseError::BadStatus(_) => "bad_status",
            ParseError::BadBytes(_) => "bad_bytes",
            ParseError::Missing(_) => "missing_field",
            ParseError::UnterminatedQuote(_) => "unterminated_quote",
            ParseError::Json(_) => "json",
            ParseError::UnknownFormat(_) => "unknown_format",
        }
    }
}

/// A line parsed: a record, or a line that is valid but no request (a Caddy log line of
/// another logger, a blank line).
#[derive(Debug, Clone, PartialEq, Eq)]
// Boxing the record would cost an allocation per line, the one thing the fast path avoids.
#[allow(clippy::large_enum_variant)]
pub enum Parsed<'a> {
    Record(LogRecord<'a>),
    Skip,
}

/// Parses one line (without its newline) in `format`.
pub fn parse_line<'a>(
    format: LogFormat,
    line: &'a str,
    trailing: &[TrailingField],
) -> Result<Parsed<'a>, ParseError> {
    if line.trim().is_empty() {
        return Ok(Parsed::Skip);
    }
    match format {
        LogFormat::Combined => {
            combined::parse(line, trailing, &mut time::TimeLocalMemo::default()).map(Parsed::Record)
        }
        LogFormat::Caddy => json::parse_caddy(line),
        LogFormat::Weir => json::parse_weir(line).map(Parsed::Record),
    }
}

fn parse_status(s: &str) -> Result<u16, ParseError> {
    let b = s.as_bytes();
    if b.len() == 3 && b.iter().all(u8::is_ascii_digit) && b[0] != b'0' {
        Ok(b.iter().fold(0u16, |n, c| n * 10 + u16::from(c - b'0')))
    } else {
        Err(ParseError::BadStatus(s.to_string()))
    }
}

fn parse_ip(s: &str) -> Result<IpAddr, ParseError> {
    if let Some(v4) = parse_ipv4(s.as_bytes()) {
        return Ok(IpAddr::V4(v4));
    }
    // Some logs write IPv6 in brackets.
    let bare = s
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(s);
    bare.parse()
        .map_err(|_| ParseError::BadAddress(s.to_string()))
}

/// A dotted-quad IPv4 address exactly as `Ipv4Addr::from_str` accepts it
/// (four decimal octets of 1-3 digits, none above 255, no leading zeros);
/// `None` for anything else, IPv6 included. Hand-written because it runs
/// once per log line, and std's general address parser (which tries IPv4,
/// then IPv6) cost about as much as the rest of the client field.
fn parse_ipv4(s: &[u8]) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut i = 0;
    for (n, octet) in octets.iter_mut().enumerate() {
        if n > 0 {
            if s.get(i) != Some(&b'.') {
                return None;
            }
            i += 1;
        }
        let start = i;
        let mut value = 0u32;
        while i - start < 3
            && let Some(d) = s.get(i).filter(|d| d.is_ascii_digit())
        {
            value = value * 10 + u32::from(d - b'0');
            i += 1;
        }
        let digits = i - start;
        if digits == 0 || value > 255 || (digits > 1 && s[start] == b'0') {
            return None;
        }
        *octet = value as u8;
    }
    (i == s.len()).then_some(Ipv4Addr::from(octets))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_parses_as_std_does() {
        let cases = [
            "0.0.0.0",
            "1.2.3.4",
            "203.0.113.9",
            "255.255.255.255",
            "256.1.1.1",
            "1.1.1.256",
            "999.1.1.1",
            "01.2.3.4",
            "1.2.3.04",
            "1.2.3.00",
            "0.0.0.00",
            "1.2.3",
            "1.2.3.4.5",
            "1.2.3.",
            ".1.2.3",
            "1..2.3",
            "",
            ".",
            "...",
            "1.2.3.4 ",
            " 1.2.3.4",
            "1.2.3.4x",
            "1.2.3.4:80",
            "1234.1.1.1",
            "1.2.3.1234",
            "+1.2.3.4",
            "1.-2.3.4",
            "1.2.3.4\n",
            "::1",
            "::ffff:1.2.3.4",
            "2001:db8::1",
            "[2001:db8::1]",
            "1.2.3.4.",
            "12.34.56.78",
            "１.2.3.4",
        ];
        for case in cases {
            let fast = parse_ipv4(case.as_bytes());
            assert_eq!(fast, case.parse::<Ipv4Addr>().ok(), "{case:?}");
        }
        // Every string of up to 7 characters over digits, `.` and `x`,
        // and longer ones with three dots.
        let alphabet = b"0125.x";
        let mut text = Vec::new();
        for len in 0..=7u32 {
            for mut n in 0..(alphabet.len() as u64).pow(len) {
                text.clear();
                for _ in 0..len {
                    text.push(alphabet[(n % alphabet.len() as u64) as usize]);
                    n /= alphabet.len() as u64;
                }
                let s = std::str::from_utf8(&text).expect("ASCII");
                assert_eq!(parse_ipv4(&text), s.parse::<Ipv4Addr>().ok(), "{s:?}");
            }
        }
        for a in [
            0u32, 1, 9, 10, 25, 99, 100, 199, 200, 249, 250, 255, 256, 300, 999,
        ] {
            for b in [0u32, 7, 255, 256] {
                for lead in ["", "0", "00"] {
                    let s = format!("{lead}{a}.{b}.{a}.{lead}{b}");
                    assert_eq!(
                        parse_ipv4(s.as_bytes()),
                        s.parse::<Ipv4Addr>().ok(),
                        "{s:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn addresses_parse_as_std_does() {
        // (field, address)
        let cases: &[(&str, Option<&str>)] = &[
            ("203.0.113.9", Some("203.0.113.9")),
            ("2001:db8::1", Some("2001:db8::1")),
            ("[2001:db8::1]", Some("2001:db8::1")),
            ("::ffff:1.2.3.4", Some("::ffff:1.2.3.4")),
            ("01.2.3.4", None),
            ("256.0.0.1", None),
            ("-", None),
            ("", None),
        ];
        for (field, want) in cases {
            let got = parse_ip(field).ok();
            let want = want.map(|w| w.parse::<IpAddr>().expect("test address"));
            assert_eq!(got, want, "{field:?}");
        }
    }
}
