//! JSON access logs: Caddy's (`http.log.access*`) and weir's own.
//!
//! Strings borrow from the line unless they contain JSON escapes (then they are decoded
//! into an owned string). Caddy's header map is walked without building a map: only
//! `User-Agent`, `Referer`, `Cookie`, `Accept`, `Sec-Fetch-Mode` and `X-Forwarded-For` are
//! kept (first value of each), everything else is skipped. Caddy's `ts` may be a float
//! of Unix seconds (its default) or an RFC 3339 string.
//!
//! This module does not read files; a JSON line from another Caddy logger is a skip, not
//! an error.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::time::{UnixNanos, from_unix_float, parse_rfc3339};
use super::{LogRecord, ParseError, Parsed, WeirFields, parse_ip, parse_status};
use weir::observe::access_log::LoggedVisit;

/// A JSON string that borrows from the input when it has no escapes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Str<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Str<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Str<'a>, E> {
                Ok(Str(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_str(V(std::marker::PhantomData))
    }
}

/// The first string of a JSON array of strings (Caddy writes header values as arrays).
struct First<'a>(Option<Cow<'a, str>>);

impl<'de: 'a, 'a> Deserialize<'de> for First<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = First<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of strings")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<First<'a>, A::Error> {
                let first = seq.next_element::<Str<'a>>()?.map(|s| s.0);
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(First(first))
            }
        }
        d.deserialize_seq(V(std::marker::PhantomData))
    }
}

/// The request headers weir replays; the rest are skipped unread.
#[derive(Default)]
struct Headers<'a> {
    user_agent: Option<Cow<'a, str>>,
    referer: Option<Cow<'a, str>>,
    cookie: Option<Cow<'a, str>>,
    accept: Option<Cow<'a, str>>,
    sec_fetch_mode: Option<Cow<'a, str>>,
    forwarded_for: Option<Cow<'a, str>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for Headers<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Headers<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of header names to arrays of values")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Headers<'a>, A::Error> {
                let mut h = Headers::default();
                while let Some(name) = map.next_key::<Str<'a>>()? {
                    let name = name.0;
                    let slot = if name.eq_ignore_ascii_case("user-agent") {
                        &mut h.user_agent
                    } else if name.eq_ignore_ascii_case("referer") {
                        &mut h.referer
                    } else if name.eq_ignore_ascii_case("cookie") {
                        &mut h.cookie
                    } else if name.eq_ignore_ascii_case("accept") {
                        &mut h.accept
                    } else if name.eq_ignore_ascii_case("sec-fetch-mode") {
                        &mut h.sec_fetch_mode
                    } else if name.eq_ignore_ascii_case("x-forwarded-for") {
                        &mut h.forwarded_for
                    } else {
                        map.next_value::<IgnoredAny>()?;
                        continue;
                    };
                    *slot = map.next_value::<First<'a>>()?.0;
                }
                Ok(h)
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// Caddy `ts`: a number of seconds or an RFC 3339 string.
#[derive(Deserialize)]
#[serde(untagged)]
enum Ts<'a> {
    Secs(f64),
    #[serde(borrow)]
    Text(Str<'a>),
}

#[derive(Deserialize)]
struct CaddyRequest<'a> {
    #[serde(borrow)]
    remote_ip: Option<Str<'a>>,
    #[serde(borrow)]
    client_ip: Option<Str<'a>>,
    #[serde(borrow)]
    method: Option<Str<'a>>,
    #[serde(borrow)]
    host: Option<Str<'a>>,
    #[serde(borrow)]
    uri: Option<Str<'a>>,
    #[serde(borrow, default)]
    headers: Option<Headers<'a>>,
}

#[derive(Deserialize)]
struct CaddyLine<'a> {
    #[serde(borrow)]
    logger: Option<Str<'a>>,
    #[serde(borrow)]
    ts: Option<Ts<'a>>,
    #[serde(borrow)]
    request: Option<CaddyRequest<'a>>,
    status: Option<u16>,
    size: Option<u64>,
}

fn json_error(e: serde_json::Error) -> ParseError {
    ParseError::Json(e.to_string())
}

fn non_empty(s: Option<Str<'_>>) -> Option<Cow<'_, str>> {
    s.map(|s| s.0).filter(|s| !s.is_empty())
}

pub(super) fn parse_caddy(line: &str) -> Result<Parsed<'_>, ParseError> {
    let l: CaddyLine<'_> = serde_json::from_str(line).map_err(json_error)?;
    if let Some(logger) = &l.logger
        && !logger.0.starts_with("http.log.access")
    {
        return Ok(Parsed::Skip);
    }
    let time = match l.ts.ok_or(ParseError::Missing("ts"))? {
        Ts::Secs(secs) => {
            from_unix_float(secs).ok_or_else(|| ParseError::BadTime(secs.to_string()))?
        }
        Ts::Text(text) => {
            parse_rfc3339(&text.0).ok_or_else(|| ParseError::BadTime(text.0.into_owned()))?
        }
    };
    let req = l.request.ok_or(ParseError::Missing("request"))?;
    let remote = req
        .remote_ip
        .ok_or(ParseError::Missing("request.remote_ip"))?;
    let peer = parse_ip(&remote.0)?;
    let client = match non_empty(req.client_ip) {
        Some(ip) => parse_ip(&ip)?,
        None => peer,
    };
    let status = l.status.ok_or(ParseError::Missing("status"))?;
    // Caddy logs 0 when a handler wrote nothing; anything else must look like HTTP.
    if status != 0 && !(100..=999).contains(&status) {
        return Err(ParseError::BadStatus(status.to_string()));
    }
    let h = req.headers.unwrap_or_default();
    Ok(Parsed::Record(LogRecord {
        time,
        client,
        peer: Some(peer),
        method: req.method.ok_or(ParseError::Missing("request.method"))?.0,
        host: non_empty(req.host),
        target: req.uri.ok_or(ParseError::Missing("request.uri"))?.0,
        status,
        bytes: l.size.unwrap_or(0),
        user_agent: h.user_agent,
        referer: h.referer,
        cookie: h.cookie,
        accept: h.accept,
        sec_fetch_mode: h.sec_fetch_mode,
        forwarded_for: h.forwarded_for,
        weir: None,
    }))
}

/// weir's `AccessRecord`, the fields replay uses.
#[derive(Deserialize)]
struct WeirLine<'a> {
    #[serde(borrow)]
    time: Str<'a>,
    #[serde(borrow)]
    client: Str<'a>,
    #[serde(borrow)]
    peer: Option<Str<'a>>,
    #[serde(borrow)]
    method: Str<'a>,
    #[serde(borrow)]
    host: Option<Str<'a>>,
    #[serde(borrow)]
    path: Str<'a>,
    status: u16,
    #[serde(borrow)]
    class: Option<Str<'a>>,
    #[serde(borrow)]
    decision: Option<Str<'a>>,
    #[serde(borrow)]
    rule: Option<Str<'a>>,
    bytes_out: Option<u64>,
    visit_views: Option<u16>,
    visit_costly: Option<u16>,
    visit_age_s: Option<u32>,
}

pub(super) fn parse_weir(line: &str) -> Result<LogRecord<'_>, ParseError> {
    let l: WeirLine<'_> = serde_json::from_str(line).map_err(json_error)?;
    let time: UnixNanos =
        parse_rfc3339(&l.time.0).ok_or_else(|| ParseError::BadTime(l.time.0.to_string()))?;
    let status = parse_status(&l.status.to_string())?;
    let peer = match l.peer {
        Some(p) => Some(parse_ip(&p.0)?),
        None => None,
    };
    Ok(LogRecord {
        time,
        client: parse_ip(&l.client.0)?,
        peer,
        method: l.method.0,
        host: non_empty(l.host),
        target: l.path.0,
        status,
        bytes: l.bytes_out.unwrap_or(0),
        user_agent: None,
        referer: None,
        cookie: None,
        accept: None,
        sec_fetch_mode: None,
        forwarded_for: None,
        weir: Some(WeirFields {
            class: l.class.map(|s| s.0).unwrap_or(Cow::Borrowed("")),
            decision: l.decision.map(|s| s.0).unwrap_or(Cow::Borrowed("")),
            rule: l.rule.map(|s| s.0),
            visit: match (l.visit_views, l.visit_costly, l.visit_age_s) {
                (Some(views), Some(costly), Some(age_s)) => Some(LoggedVisit {
                    views,
                    costly,
                    age_s,
                }),
                _ => None,
            },
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CADDY: &str = r#"{"level":"info","ts":1791608136.5,"logger":"http.log.access.log0","msg":"handled request","request":{"remote_ip":"10.0.0.1","remote_port":"5555","client_ip":"203.0.113.9","proto":"HTTP/2.0","method":"GET","host":"wiki.example","uri":"/w/index.php?diff=2","headers":{"User-Agent":["Mozilla/5.0"],"Cookie":["wikisession=abc"],"Accept":["text/html","x"],"Sec-Fetch-Mode":["navigate"],"Accept-Encoding":["gzip"],"X-Forwarded-For":["203.0.113.9"]},"tls":{"resumed":false}},"bytes_read":0,"user_id":"","duration":0.0123,"size":2048,"status":200,"resp_headers":{"Server":["Caddy"]}}"#;

    #[test]
    fn caddy_good_line() {
        let Ok(Parsed::Record(r)) = parse_caddy(CADDY) else {
            panic!("{:?}", parse_caddy(CADDY));
        };
        assert_eq!(r.time.0, 1_791_608_136_500_000_000);
        assert_eq!(
            (r.client.to_string(), r.peer.map(|p| p.to_string())),
            ("203.0.113.9".into(), Some("10.0.0.1".into()))
        );
        assert_eq!(
            (&*r.method, r.host.as_deref(), &*r.target),
            ("GET", Some("wiki.example"), "/w/index.php?diff=2")
        );
        assert_eq!((r.status, r.bytes), (200, 2048));
        assert_eq!(r.user_agent.as_deref(), Some("Mozilla/5.0"));
        assert_eq!(r.cookie.as_deref(), Some("wikisession=abc"));
        assert_eq!(r.accept.as_deref(), Some("text/html"));
        assert_eq!(r.sec_fetch_mode.as_deref(), Some("navigate"));
        assert_eq!(r.forwarded_for.as_deref(), Some("203.0.113.9"));
        assert_eq!(r.referer, None);
        assert!(matches!(r.target, Cow::Borrowed(_)), "zero-copy");
    }

    #[test]
    fn caddy_variants() {
        let with = |from: &str, to: &str| CADDY.replacen(from, to, 1);
        // (line, Ok(target) or Err(kind) or skip)
        let cases: &[(String, Result<Option<&str>, &str>)] = &[
            (
                with(r#""ts":1791608136.5"#, r#""ts":"2026-10-10T04:55:36.5Z""#),
                Ok(Some("/w/index.php?diff=2")),
            ),
            (
                with(r#""client_ip":"203.0.113.9","#, ""),
                Ok(Some("/w/index.php?diff=2")),
            ),
            (
                with(r#""uri":"/w/index.php?diff=2""#, r#""uri":"/a\"b""#),
                Ok(Some("/a\"b")),
            ),
            (
                with("http.log.access.log0", "http.handlers.reverse_proxy"),
                Ok(None),
            ),
            (with(r#""ts":1791608136.5,"#, ""), Err("missing_field")),
            (
                with(r#""ts":1791608136.5"#, r#""ts":"yesterday""#),
                Err("bad_time"),
            ),
            (
                with(r#""remote_ip":"10.0.0.1""#, r#""remote_ip":"nope""#),
                Err("bad_address"),
            ),
            (with(r#""status":200"#, r#""status":"200""#), Err("json")),
            (CADDY[..100].to_string(), Err("json")),
            ("{}".to_string(), Err("missing_field")),
        ];
        for (line, want) in cases {
            let got = match parse_caddy(line) {
                Ok(Parsed::Record(r)) => Ok(Some(r.target.into_owned())),
                Ok(Parsed::Skip) => Ok(None),
                Err(e) => Err(e.kind()),
            };
            let want = want.map(|o| o.map(str::to_string));
            assert_eq!(got, want, "{line}");
        }
    }

    #[test]
    fn weir_lines() {
        let good = r#"{"time":"2026-10-10T04:55:36.123Z","client":"203.0.113.9","peer":"10.0.0.1","client_source":"x_forwarded_for","method":"GET","host":"wiki.example","path":"/w/index.php?diff=2","proto":"HTTP/1.1","class":"expensive","decision":"reject","rule":"anon_expensive","pool":"app","upstream":null,"status":429,"upstream_status":null,"bytes_in":0,"bytes_out":17,"duration_ms":0.2,"queue_ms":0.0,"upstream_ms":null,"error":null}"#;
        let r = parse_weir(good).expect("good line");
        assert_eq!(r.time.0, 1_791_608_136_123_000_000);
        assert_eq!(
            (r.status, r.bytes, &*r.target),
            (429, 17, "/w/index.php?diff=2")
        );
        let w = r.weir.expect("weir fields");
        assert_eq!(
            (&*w.class, &*w.decision, w.rule.as_deref()),
            ("expensive", "reject", Some("anon_expensive"))
        );
        let cases: &[(String, &str)] = &[
            (
                good.replace("2026-10-10T04:55:36.123Z", "10/Oct/2026"),
                "bad_time",
            ),
            (
                good.replace(r#""client":"203.0.113.9""#, r#""client":"x""#),
                "bad_address",
            ),
            (
                good.replace(r#""status":429"#, r#""status":42"#),
                "bad_status",
            ),
            (good.replace(r#""method":"GET","#, ""), "json"),
            ("not json".to_string(), "json"),
        ];
        for (line, kind) in cases {
            assert_eq!(
                parse_weir(line).map(|_| ()).map_err(|e| e.kind()),
                Err(*kind),
                "{line}"
            );
        }
    }
}
