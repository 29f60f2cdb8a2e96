//! nginx/Apache combined log format, plus configurable trailing fields.
//!
//! `$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent
//! "$http_referer" "$http_user_agent"` then, in order, the fields named by
//! [`TrailingField`]s. One left-to-right pass over the bytes, no allocation: every string
//! field borrows from the line. Quoted fields end at the first `"` not escaped by `\`
//! (Apache writes `\"`, nginx `\x22`); escapes are kept as written. A trailing field the
//! line does not have is absent, not an error (logs often mix formats across a reload).
//!
//! This module does not read files or know about line numbers.

use std::borrow::Cow;

use super::time::TimeLocalMemo;
use super::{LogRecord, ParseError, parse_ip, parse_status};

/// What one extra field after the user agent holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TrailingField {
    /// `"$http_cookie"`
    Cookie,
    /// `"$http_x_forwarded_for"`
    XForwardedFor,
    /// `"$host"` / `"$http_host"`
    Host,
    /// `"$http_accept"`
    Accept,
    /// `"$http_sec_fetch_mode"`
    SecFetchMode,
    /// Any other field (e.g. `$request_time`): read past and dropped.
    Ignore,
}

impl std::str::FromStr for TrailingField {
    type Err = String;

    /// Names as in nginx variables, with or without `$`: `http_cookie`, `http_x_forwarded_for`,
    /// `host`, `http_accept`, `http_sec_fetch_mode`; `-` or `ignore` for anything else.
    fn from_str(s: &str) -> Result<TrailingField, String> {
        Ok(match s.trim_start_matches('$') {
            "http_cookie" | "cookie" => TrailingField::Cookie,
            "http_x_forwarded_for" | "x_forwarded_for" => TrailingField::XForwardedFor,
            "host" | "http_host" => TrailingField::Host,
            "http_accept" | "accept" => TrailingField::Accept,
            "http_sec_fetch_mode" | "sec_fetch_mode" => TrailingField::SecFetchMode,
            "-" | "ignore" => TrailingField::Ignore,
            other => {
                return Err(format!(
                    "unknown trailing field `{other}`: expected http_cookie, \
                     http_x_forwarded_for, host, http_accept, http_sec_fetch_mode or ignore"
                ));
            }
        })
    }
}

/// A cursor over the line's bytes.
struct Cursor<'a> {
    line: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn skip_spaces(&mut self) {
        let b = self.line.as_bytes();
        while self.pos < b.len() && b[self.pos] == b' ' {
            self.pos += 1;
        }
    }

    fn at_end(&self) -> bool {
        self.pos >= self.line.len()
    }

    /// Up to the next space (or the end).
    fn token(&mut self, what: &'static str) -> Result<&'a str, ParseError> {
        self.skip_spaces();
        let b = self.line.as_bytes();
        let start = self.pos;
        while self.pos < b.len() && b[self.pos] != b' ' {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(ParseError::Missing(what));
        }
        Ok(&self.line[start..self.pos])
    }

    /// `[...]`, without the brackets.
    fn bracketed(&mut self, what: &'static str) -> Result<&'a str, ParseError> {
        self.skip_spaces();
        let b = self.line.as_bytes();
        if b.get(self.pos) != Some(&b'[') {
            return Err(ParseError::Missing(what));
        }
        let start = self.pos + 1;
        let Some(len) = b[start..].iter().position(|&c| c == b']') else {
            return Err(ParseError::Missing(what));
        };
        self.pos = start + len + 1;
        Ok(&self.line[start..start + len])
    }

    /// `"..."`, without the quotes; `\` escapes the next byte.
    fn quoted(&mut self, what: &'static str) -> Result<&'a str, ParseError> {
        self.skip_spaces();
        let b = self.line.as_bytes();
        if b.get(self.pos) != Some(&b'"') {
            return Err(ParseError::Missing(what));
        }
        let open = self.pos;
        let start = open + 1;
        let mut i = start;
        // Jumps from one quote or backslash to the next (SIMD), not byte by
        // byte: quoted fields are most of a combined line.
        while let Some(n) = b
            .get(i..)
            .and_then(|rest| memchr::memchr2(b'"', b'\\', rest))
        {
            i += n;
            if b[i] == b'"' {
                self.pos = i + 1;
                return Ok(&self.line[start..i]);
            }
            i += 2;
        }
        Err(ParseError::UnterminatedQuote(open))
    }

    /// A quoted or bare trailing field; `None` at the end of the line.
    fn trailing(&mut self) -> Result<Option<&'a str>, ParseError> {
        self.skip_spaces();
        if self.at_end() {
            return Ok(None);
        }
        if self.line.as_bytes()[self.pos] == b'"' {
            self.quoted("trailing field").map(Some)
        } else {
            self.token("trailing field").map(Some)
        }
    }
}

/// `-` (and the empty string) mean "none" in combined logs.
fn present(s: &str) -> Option<Cow<'_, str>> {
    (!s.is_empty() && s != "-").then_some(Cow::Borrowed(s))
}

/// Parses one line; `times` remembers the last timestamp (a reader keeps
/// one across lines).
pub(super) fn parse<'a>(
    line: &'a str,
    trailing: &[TrailingField],
    times: &mut TimeLocalMemo,
) -> Result<LogRecord<'a>, ParseError> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    let mut c = Cursor { line, pos: 0 };
    let client = parse_ip(c.token("remote_addr")?)?;
    c.token("ident")?;
    c.token("remote_user")?;
    let time_text = c.bracketed("time_local")?;
    let time = times
        .parse(time_text)
        .ok_or_else(|| ParseError::BadTime(time_text.into()))?;
    let request = c.quoted("request")?;
    let (method, target) = request_line(request)?;
    let status = parse_status(c.token("status")?)?;
    let bytes_text = c.token("body_bytes_sent")?;
    let bytes = match bytes_text {
        "-" => 0,
        digits => digits
            .parse()
            .map_err(|_| ParseError::BadBytes(digits.to_string()))?,
    };
    let referer = present(c.quoted("http_referer")?);
    let user_agent = present(c.quoted("http_user_agent")?);
    let mut record = LogRecord {
        time,
        client,
        peer: None,
        method: Cow::Borrowed(method),
        host: None,
        target: Cow::Borrowed(target),
        status,
        bytes,
        user_agent,
        referer,
        cookie: None,
        accept: None,
        sec_fetch_mode: None,
        forwarded_for: None,
        weir: None,
    };
    for field in trailing {
        let Some(value) = c.trailing()? else { break };
        let value = present(value);
        match field {
            TrailingField::Cookie => record.cookie = value,
            TrailingField::XForwardedFor => record.forwarded_for = value,
            TrailingField::Host => record.host = value,
            TrailingField::Accept => record.accept = value,
            TrailingField::SecFetchMode => record.sec_fetch_mode = value,
            TrailingField::Ignore => {}
        }
    }
    Ok(record)
}

/// `GET /path?q HTTP/1.1` → (`GET`, `/path?q`). HTTP/0.9 (`GET /`) is accepted.
fn request_line(request: &str) -> Result<(&str, &str), ParseError> {
    let bad = || ParseError::BadRequestLine(request.to_string());
    // Spaces are found with `memchr`: `str::split_once(' ')` and friends go
    // through the general pattern searcher, several times the cost here.
    let space = memchr::memchr(b' ', request.as_bytes()).ok_or_else(bad)?;
    let (method, rest) = (&request[..space], &request[space + 1..]);
    let target = match memchr::memrchr(b' ', rest.as_bytes()) {
        Some(p) if rest[p + 1..].starts_with("HTTP/") => &rest[..p],
        _ => rest,
    };
    let method_ok = !method.is_empty() && method.bytes().all(|b| b.is_ascii_uppercase());
    let target_ok = !target.is_empty() && memchr::memchr(b' ', target.as_bytes()).is_none();
    if method_ok && target_ok {
        Ok((method, target))
    } else {
        Err(bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "[10/Oct/2026:13:55:36 +0900]";
    const SECS: i64 = 1_791_608_136;

    fn line(rest: &str) -> String {
        format!("203.0.113.9 - - {T} {rest}")
    }

    #[test]
    fn good_lines() {
        use TrailingField::*;
        let base = r#""GET /w/index.php?title=A&diff=2 HTTP/1.1" 200 512 "https://ref/" "Mozilla/5.0 (X11)""#;
        // (line, trailing config, method, target, status, bytes, ua, referer, cookie, xff, host)
        type Case<'a> = (
            String,
            &'a [TrailingField],
            &'a str,
            &'a str,
            u16,
            u64,
            Option<&'a str>,
            Option<&'a str>,
            Option<&'a str>,
            Option<&'a str>,
            Option<&'a str>,
        );
        let cases: Vec<Case> = vec![
            (
                line(base),
                &[],
                "GET",
                "/w/index.php?title=A&diff=2",
                200,
                512,
                Some("Mozilla/5.0 (X11)"),
                Some("https://ref/"),
                None,
                None,
                None,
            ),
            (
                line(r#""HEAD / HTTP/1.0" 304 - "-" "-""#),
                &[],
                "HEAD",
                "/",
                304,
                0,
                None,
                None,
                None,
                None,
                None,
            ),
            (
                line(r#""GET /old" 200 1 "-" "x""#),
                &[],
                "GET",
                "/old",
                200,
                1,
                Some("x"),
                None,
                None,
                None,
                None,
            ),
            (
                line(&format!(
                    r#"{base} "wikisession=abc; wikiUserID=1" "198.51.100.7, 10.0.0.1""#
                )),
                &[Cookie, XForwardedFor],
                "GET",
                "/w/index.php?title=A&diff=2",
                200,
                512,
                Some("Mozilla/5.0 (X11)"),
                Some("https://ref/"),
                Some("wikisession=abc; wikiUserID=1"),
                Some("198.51.100.7, 10.0.0.1"),
                None,
            ),
            (
                line(&format!(r#"{base} 0.123 "wiki.example""#)),
                &[Ignore, Host],
                "GET",
                "/w/index.php?title=A&diff=2",
                200,
                512,
                Some("Mozilla/5.0 (X11)"),
                Some("https://ref/"),
                None,
                None,
                Some("wiki.example"),
            ),
            (
                line(&format!(r#"{base} "-""#)),
                &[Cookie, XForwardedFor],
                "GET",
                "/w/index.php?title=A&diff=2",
                200,
                512,
                Some("Mozilla/5.0 (X11)"),
                Some("https://ref/"),
                None,
                None,
                None,
            ),
            (
                line(r#""GET /a HTTP/1.1" 200 5 "-" "say \"hi\"""#),
                &[],
                "GET",
                "/a",
                200,
                5,
                Some(r#"say \"hi\""#),
                None,
                None,
                None,
                None,
            ),
            (
                line(r#""GET /a HTTP/1.1" 200 5 "-" "x\x22y"  "#) + "\r",
                &[],
                "GET",
                "/a",
                200,
                5,
                Some(r#"x\x22y"#),
                None,
                None,
                None,
                None,
            ),
        ];
        for (i, (text, trailing, method, target, status, bytes, ua, referer, cookie, xff, host)) in
            cases.iter().enumerate()
        {
            let r = parse(text, trailing, &mut TimeLocalMemo::default())
                .unwrap_or_else(|e| panic!("case {i}: {e}: {text}"));
            assert_eq!(r.time.as_secs(), SECS, "case {i}");
            assert_eq!(r.client.to_string(), "203.0.113.9", "case {i}");
            assert_eq!(
                (&*r.method, &*r.target, r.status, r.bytes),
                (*method, *target, *status, *bytes),
                "case {i}"
            );
            assert_eq!(r.user_agent.as_deref(), *ua, "case {i}");
            assert_eq!(r.referer.as_deref(), *referer, "case {i}");
            assert_eq!(r.cookie.as_deref(), *cookie, "case {i}");
            assert_eq!(r.forwarded_for.as_deref(), *xff, "case {i}");
            assert_eq!(r.host.as_deref(), *host, "case {i}");
            assert!(matches!(r.target, Cow::Borrowed(_)), "case {i}: zero-copy");
        }
        let v6 =
            "2001:db8::1 - alice [10/Oct/2026:13:55:36 +0900] \"GET / HTTP/2.0\" 200 1 \"-\" \"-\"";
        assert_eq!(
            parse(v6, &[], &mut TimeLocalMemo::default()).map(|r| r.client.to_string()),
            Ok("2001:db8::1".into())
        );
    }

    #[test]
    fn request_lines_split_as_str_methods_do() {
        // What `request_line` did with `split_once`/`rsplit_once`/`contains`.
        fn reference(request: &str) -> Option<(&str, &str)> {
            let (method, rest) = request.split_once(' ')?;
            let target = match rest.rsplit_once(' ') {
                Some((target, proto)) if proto.starts_with("HTTP/") => target,
                _ => rest,
            };
            let method_ok = !method.is_empty() && method.bytes().all(|b| b.is_ascii_uppercase());
            let target_ok = !target.is_empty() && !target.contains(' ');
            (method_ok && target_ok).then_some((method, target))
        }
        let cases = [
            "GET /a HTTP/1.1",
            "GET /a?b=c HTTP/2.0",
            "GET /",
            "GET / HTTP/",
            "GET / HTTPS/1.1",
            "GET  /a HTTP/1.1",
            "GET /a  HTTP/1.1",
            "GET /a b HTTP/1.1",
            "GET /a HTTP/1.1 ",
            "GET ",
            " /a HTTP/1.1",
            "get /a HTTP/1.1",
            "GET",
            "",
            "-",
            "GET HTTP/1.1",
            "OPTIONS * HTTP/1.1",
            "GET /é HTTP/1.1",
        ];
        for case in cases {
            assert_eq!(request_line(case).ok(), reference(case), "{case:?}");
        }
    }

    #[test]
    fn escaped_quotes_stay_inside_their_field() {
        let text = line(r#""GET /a HTTP/1.1" 200 5 "say \"hi\"" "a \\" "b\\\"c""#);
        let r = parse(&text, &[], &mut TimeLocalMemo::default()).unwrap();
        assert_eq!(r.referer.as_deref(), Some(r#"say \"hi\""#));
        assert_eq!(r.user_agent.as_deref(), Some(r#"a \\"#));
        assert_eq!(&*r.target, "/a");
    }

    #[test]
    fn malformed_lines() {
        let ok_tail = r#""GET / HTTP/1.1" 200 1 "-" "ua""#;
        let cases: &[(String, &str)] = &[
            ("nonsense".into(), "bad_address"),
            ("203.0.113.9".into(), "missing_field"),
            (format!("999.1.1.1 - - {T} {ok_tail}"), "bad_address"),
            (
                format!("203.0.113.9 - - [10/Foo/2026:13:55:36 +0900] {ok_tail}"),
                "bad_time",
            ),
            (
                format!("203.0.113.9 - - 10/Oct/2026:13:55:36 +0900 {ok_tail}"),
                "missing_field",
            ),
            (
                line(r#""\x16\x03\x01\x02" 400 157 "-" "-""#),
                "bad_request_line",
            ),
            (line(r#""-" 400 0 "-" "-""#), "bad_request_line"),
            (line(r#""GET / HTTP/1.1" 20 1 "-" "ua""#), "bad_status"),
            (line(r#""GET / HTTP/1.1" 200 1x "-" "ua""#), "bad_bytes"),
            (
                line(r#""GET / HTTP/1.1" 200 1 "-" "ua"#),
                "unterminated_quote",
            ),
            (
                line(r#""GET / HTTP/1.1" 200 1 "-" "ua\""#),
                "unterminated_quote",
            ),
            (
                line(r#""GET / HTTP/1.1" 200 1 "-" "ua\"#),
                "unterminated_quote",
            ),
            (line(r#""GET / HTTP/1.1" 200 1 "-""#), "missing_field"),
            (line(r#""GET / HTTP/1.1" 200"#), "missing_field"),
        ];
        for (text, kind) in cases {
            let got = parse(text, &[], &mut TimeLocalMemo::default())
                .map(|_| ())
                .map_err(|e| e.kind());
            assert_eq!(got, Err(*kind), "{text}");
        }
    }

    #[test]
    fn trailing_field_names() {
        let ok: Vec<TrailingField> = ["$http_cookie", "http_x_forwarded_for", "host", "-"]
            .iter()
            .map(|s| s.parse().expect("known"))
            .collect();
        assert_eq!(
            ok,
            [
                TrailingField::Cookie,
                TrailingField::XForwardedFor,
                TrailingField::Host,
                TrailingField::Ignore
            ]
        );
        let err = "request_time"
            .parse::<TrailingField>()
            .expect_err("unknown");
        assert!(err.contains("`request_time`"), "{err}");
    }
}
