//! The canonical request target: a request's method, authority, path and
//! query, checked and normalised once, before any stage decides anything.
//!
//! Every stage of weir (routing, rules, the challenge's exemptions,
//! coalescing, the access log, forwarding, replay) reads a [`Target`], never
//! the raw request line or `Host` field, so no two stages can read one
//! request two ways. What the app receives is what was decided on: the
//! canonical path and authority are forwarded ([`Target::forward`]).
//!
//! The choices, beside nginx's (`docs/request-path.md` has the table):
//! - **method**: case-sensitive (RFC 9110 §9.1). A method with a lowercase
//!   letter (`get`) is not `GET` and is refused with 501, as is `CONNECT`
//!   (weir tunnels to no one). nginx answers 400 to both.
//! - **authority**: exactly one `Host` in HTTP/1.1 (none, or two: 400, as
//!   nginx); an absolute-form target or HTTP/2 `:authority` must name the
//!   same host and port as `Host` when both are present (400, as HAProxy;
//!   nginx forwards the target's); `reg-name` hosts are letters, digits,
//!   `-`, `_` and `.` without empty labels, lowercased, one trailing dot
//!   dropped (as nginx); IPv6 literals must parse; ports are decimal up to
//!   65535, leading zeros dropped.
//! - **path** (RFC 3986 §6.2.2): escapes of unreserved characters decoded
//!   (`%69` is `i`, `%2e` is `.`), and of `:` and `@`, which a path may hold
//!   as they are and every app reads alike (`Special%3ASearch` is
//!   `Special:Search`); other escapes kept, with uppercase hex;
//!   dot segments removed, repeated slashes merged (nginx's
//!   `merge_slashes`). Refused with 400: invalid escapes (`%zz`, as nginx),
//!   `%00` (as nginx), `\` raw or escaped (some servers read it as `/`),
//!   `%2F` unless [`PathPolicy::keep_encoded_slash`] (nginx decodes it into
//!   a separator; Apache refuses it by default), and dot segments carrying
//!   `;` parameters (`/..;/`: servlet containers read them as `..`).
//!   Other `;` are data, as RFC 3986 says (MediaWiki titles contain them).
//! - **query**: forwarded as received; keys are compared decoded after
//!   splitting on `&` and `=` (`+` is a space, `%73earch` is `search`,
//!   `search%3Da` is the key `search=a`), up to a `[` (`search[]=` is
//!   `search` to PHP and Rails), as the apps behind weir read them.
//!
//! A target already in canonical form (nearly every request) is not
//! rebuilt: the path and `Host` are shared with the request, not copied.
//!
//! ```
//! use weir_http::target::{PathPolicy, Target};
//!
//! let req = http::Request::builder()
//!     .uri("/static/%2e%2e/w//index%2ephp?%73earch=a")
//!     .header("host", "Wiki.Example.")
//!     .body(())
//!     .unwrap();
//! let target = Target::of(&req, PathPolicy::default()).unwrap();
//! assert_eq!(target.path(), "/w/index.php");
//! assert_eq!(target.host(), Some("wiki.example"));
//! assert!(target.has_query_key(&["search"]));
//!
//! let two_hosts = http::Request::builder()
//!     .uri("http://a.example/x")
//!     .header("host", "admin.example")
//!     .body(())
//!     .unwrap();
//! assert_eq!(
//!     Target::of(&two_hosts, PathPolicy::default()).unwrap_err().reason(),
//!     "host_mismatch"
//! );
//! ```
//!
//! This module decides nothing about whether a request may pass; it only
//! refuses requests whose target cannot be read one way.

use std::borrow::Cow;
use std::net::Ipv6Addr;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, Request, StatusCode, Uri, Version};

/// How paths are read where sites differ.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathPolicy {
    /// Forward `%2F` in a path as data (kept encoded, inside its segment)
    /// instead of refusing the request. For apps that put encoded slashes
    /// in identifiers (GitLab's `group%2Fproject`); their server must not
    /// decode it into a separator (nginx does, in `$uri`).
    pub keep_encoded_slash: bool,
}

/// Why a request's target cannot be read one way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TargetError {
    #[error("HTTP/1.1 request without a Host field")]
    MissingHost,
    #[error("more than one Host field")]
    DuplicateHost,
    #[error("invalid host")]
    InvalidHost,
    #[error("the request target's host differs from the Host field")]
    HostMismatch,
    #[error("request target is neither a path nor an absolute URI")]
    InvalidForm,
    #[error("methods are case-sensitive: this one has lowercase letters")]
    MethodCase,
    #[error("CONNECT is not served: weir tunnels to no one")]
    Connect,
    #[error("invalid percent-escape in the path")]
    InvalidEscape,
    #[error("%00 in the path")]
    NulInPath,
    #[error("backslash in the path")]
    Backslash,
    #[error("encoded slash (%2F) in the path")]
    EncodedSlash,
    #[error("dot segment with parameters (`..;`) in the path")]
    DotParameter,
}

impl TargetError {
    /// The status the client gets.
    pub fn status(&self) -> StatusCode {
        match self {
            TargetError::MethodCase | TargetError::Connect => StatusCode::NOT_IMPLEMENTED,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// A bounded label (metrics, `x-weir-reason`, the access log).
    pub fn reason(&self) -> &'static str {
        match self {
            TargetError::MissingHost => "missing_host",
            TargetError::DuplicateHost => "duplicate_host",
            TargetError::InvalidHost => "invalid_host",
            TargetError::HostMismatch => "host_mismatch",
            TargetError::InvalidForm => "invalid_target",
            TargetError::MethodCase => "method_case",
            TargetError::Connect => "connect",
            TargetError::InvalidEscape => "invalid_escape",
            TargetError::NulInPath => "nul_in_path",
            TargetError::Backslash => "backslash_in_path",
            TargetError::EncodedSlash => "encoded_slash",
            TargetError::DotParameter => "dot_parameter",
        }
    }
}

/// A request's host and port as weir routed on them and forwards them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authority {
    /// `host[:port]`, canonical (the `Host` field's own bytes when they
    /// already were).
    value: HeaderValue,
    host_len: usize,
    port: Option<u16>,
}

impl Authority {
    /// Parses and normalises a URI authority (`host[:port]`).
    pub fn parse(raw: &[u8]) -> Result<Authority, TargetError> {
        Authority::parse_with(raw, None)
    }

    /// Parses and normalises a `Host` field's value; a value already
    /// canonical is shared, not copied.
    pub fn from_field(value: &HeaderValue) -> Result<Authority, TargetError> {
        Authority::parse_with(value.as_bytes(), Some(value))
    }

    fn parse_with(raw: &[u8], field: Option<&HeaderValue>) -> Result<Authority, TargetError> {
        let (host, port_text) = split_host_port(raw)?;
        let port = match port_text {
            None | Some(b"") => None,
            Some(digits) => Some(parse_port(digits)?),
        };
        let host = canonical_host(host)?;
        // A port is written as received unless it is empty or has leading
        // zeros (`:0080` is `:80`).
        let port_as_received = match port_text {
            None => true,
            Some(t) => !t.is_empty() && (t[0] != b'0' || t.len() == 1),
        };
        let unchanged = matches!(host, Cow::Borrowed(_)) && port_as_received;
        let value = match field {
            Some(v) if unchanged => v.clone(),
            _ if unchanged => HeaderValue::from_bytes(raw).map_err(|_| TargetError::InvalidHost)?,
            _ => {
                let mut text = host.clone().into_owned();
                if let Some(p) = port {
                    text.push(':');
                    text.push_str(itoa::Buffer::new().format(p));
                }
                HeaderValue::try_from(text).map_err(|_| TargetError::InvalidHost)?
            }
        };
        Ok(Authority {
            host_len: host.len(),
            value,
            port,
        })
    }

    /// The host: lowercase, without port; IPv6 literals in brackets.
    pub fn host(&self) -> &str {
        // Checked ASCII at parse.
        std::str::from_utf8(&self.value.as_bytes()[..self.host_len]).unwrap_or("")
    }

    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// `host[:port]`, as forwarded in `Host`.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.value.as_bytes()).unwrap_or("")
    }

    /// The `Host` value to forward.
    pub fn header_value(&self) -> &HeaderValue {
        &self.value
    }

    /// The same host and port, a missing port meaning `default`.
    fn same_as(&self, other: &Authority, default: Option<u16>) -> bool {
        self.host() == other.host() && self.port.or(default) == other.port.or(default)
    }
}

/// The request target in canonical form. See the module docs.
#[derive(Debug, Clone)]
pub struct Target {
    method: Method,
    authority: Option<Authority>,
    /// Canonical path and the query as received.
    path_and_query: PathAndQuery,
    /// The path with its remaining escapes decoded, for matching, when
    /// that differs from [`Target::path`].
    decoded: Option<Box<str>>,
    /// The path was rewritten: the request's own must be replaced.
    rewritten: bool,
}

impl Target {
    /// Reads `req`'s method, target and `Host` fields.
    pub fn of<B>(req: &Request<B>, policy: PathPolicy) -> Result<Target, TargetError> {
        Target::from_parts(
            req.method(),
            req.uri(),
            req.version(),
            req.headers(),
            policy,
        )
    }

    /// A target read from text: the request line's method and target, and
    /// its `Host` (HTTP/1.1; without one, HTTP/1.0). For logs read back
    /// (`weir replay`), tests and examples.
    pub fn parse(
        method: &str,
        target: &str,
        host: Option<&str>,
        policy: PathPolicy,
    ) -> Result<Target, TargetError> {
        let method = Method::from_bytes(method.as_bytes()).map_err(|_| TargetError::InvalidForm)?;
        let uri: Uri = target.parse().map_err(|_| TargetError::InvalidForm)?;
        let mut headers = HeaderMap::new();
        let version = match host {
            Some(h) => {
                let value = HeaderValue::from_str(h).map_err(|_| TargetError::InvalidHost)?;
                headers.insert(header::HOST, value);
                Version::HTTP_11
            }
            None => Version::HTTP_10,
        };
        Target::from_parts(&method, &uri, version, &headers, policy)
    }

    /// [`Target::of`] for a request already taken apart.
    pub fn from_parts(
        method: &Method,
        uri: &Uri,
        version: Version,
        headers: &HeaderMap,
        policy: PathPolicy,
    ) -> Result<Target, TargetError> {
        check_method(method)?;
        let authority = authority(uri, version, headers)?;
        let raw = match uri.path_and_query() {
            Some(pq) => pq,
            None if uri.authority().is_some() && uri.scheme().is_some() => {
                // `http://a.example` without a path: the path is `/`.
                return Ok(Target {
                    method: method.clone(),
                    authority,
                    path_and_query: PathAndQuery::from_static("/"),
                    decoded: None,
                    rewritten: true,
                });
            }
            None => return Err(TargetError::InvalidForm),
        };
        let path = raw.path();
        if path == "*" {
            // Asterisk form, for `OPTIONS *` alone.
            if method != Method::OPTIONS || raw.query().is_some() {
                return Err(TargetError::InvalidForm);
            }
            return Ok(Target {
                method: method.clone(),
                authority,
                path_and_query: raw.clone(),
                decoded: None,
                rewritten: false,
            });
        }
        if !path.starts_with('/') {
            return Err(TargetError::InvalidForm);
        }
        let (path_and_query, rewritten) = canonical(raw, policy)?;
        let decoded = match decode_for_matching(path_and_query.path()) {
            Cow::Borrowed(_) => None,
            Cow::Owned(d) => Some(d.into_boxed_str()),
        };
        Ok(Target {
            method: method.clone(),
            authority,
            path_and_query,
            decoded,
            rewritten,
        })
    }

    pub fn method(&self) -> &Method {
        &self.method
    }

    /// The host and port; `None` when the request named none (HTTP/1.0, or
    /// an empty `Host` with an origin-form target).
    pub fn authority(&self) -> Option<&Authority> {
        self.authority.as_ref()
    }

    /// The host without port, lowercase.
    pub fn host(&self) -> Option<&str> {
        self.authority.as_ref().map(Authority::host)
    }

    /// The canonical path, as forwarded (escapes of reserved characters
    /// kept). `*` for `OPTIONS *`.
    pub fn path(&self) -> &str {
        self.path_and_query.path()
    }

    /// The path as the app reads it, its escapes decoded (`%2F` stays
    /// `%2F`, and a path whose escapes are not UTF-8 stays as it is): what
    /// routes and exemptions match.
    pub fn match_path(&self) -> &str {
        self.decoded.as_deref().unwrap_or_else(|| self.path())
    }

    /// The query without its `?`, as received.
    pub fn query(&self) -> Option<&str> {
        self.path_and_query.query()
    }

    /// The canonical path and the query, as forwarded.
    pub fn path_and_query(&self) -> &str {
        self.path_and_query.as_str()
    }

    /// Whether the client spelled the path otherwise (`//w/./index.php`):
    /// what was sent is then worth keeping for the log.
    pub fn rewritten(&self) -> bool {
        self.rewritten
    }

    /// Whether the query has any of `keys`, keys compared as apps decode
    /// them (see the module docs).
    pub fn has_query_key<S: AsRef<str>>(&self, keys: &[S]) -> bool {
        self.query()
            .is_some_and(|q| query_keys(q).any(|k| keys.iter().any(|want| *k == *want.as_ref())))
    }

    /// Takes every `key=value` pair whose key reads as `key` to the app
    /// (as [`query_keys`] reads keys: `weir_pass`, `%77eir_pass`,
    /// `weir_pass[]`) out of the query, and returns their values as
    /// written, in order; the rest of the query stays as received (no `?`
    /// when nothing is left). For a pair the gateway itself put in a URL,
    /// which the app must not see in any spelling or number.
    pub fn take_query_pairs(&mut self, key: &str) -> Vec<String> {
        let Some(query) = self.query() else {
            return Vec::new();
        };
        // Most queries carry no such key: look before splitting.
        let bytes = query.as_bytes();
        if memchr::memmem::find(bytes, key.as_bytes()).is_none()
            && memchr::memchr(b'%', bytes).is_none()
        {
            return Vec::new();
        }
        let mut values = Vec::new();
        let mut kept: Vec<&str> = Vec::new();
        for pair in query.split('&') {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            if !k.is_empty() && query_keys(k).next().is_some_and(|read| read == key) {
                values.push(v.to_owned());
            } else {
                kept.push(pair);
            }
        }
        if values.is_empty() {
            return values;
        }
        let mut text = self.path().to_owned();
        if !kept.is_empty() {
            text.push('?');
            text.push_str(&kept.join("&"));
        }
        // A path and query read before, less some pairs, reads again.
        if let Ok(pq) = PathAndQuery::from_maybe_shared(Bytes::from(text)) {
            self.path_and_query = pq;
        }
        values
    }

    /// Makes `req` say what was decided on: its path the canonical one (an
    /// absolute-form target becomes origin-form when written upstream) and
    /// its `Host` the canonical authority. Run last before forwarding, after
    /// hop-by-hop fields are gone (so `Connection: host` cannot remove it).
    pub fn forward<B>(&self, req: &mut Request<B>) {
        if self.rewritten || req.uri().authority().is_some() {
            *req.uri_mut() = Uri::from(self.path_and_query.clone());
        }
        let headers = req.headers_mut();
        match &self.authority {
            Some(a) => {
                if headers.get(header::HOST) != Some(&a.value) {
                    headers.insert(header::HOST, a.value.clone());
                }
            }
            None => {
                headers.remove(header::HOST);
            }
        }
    }
}

/// Method names are case-sensitive; weir serves no lowercase ones.
fn check_method(method: &Method) -> Result<(), TargetError> {
    if *method == Method::CONNECT {
        return Err(TargetError::Connect);
    }
    if method.as_str().bytes().any(|b| b.is_ascii_lowercase()) {
        return Err(TargetError::MethodCase);
    }
    Ok(())
}

/// The one authority of a request: `Host` (exactly one in HTTP/1.1), and
/// the target's or `:authority`, which must agree with it.
fn authority(
    uri: &Uri,
    version: Version,
    headers: &HeaderMap,
) -> Result<Option<Authority>, TargetError> {
    let mut hosts = headers.get_all(header::HOST).iter();
    let host_field = hosts.next();
    if hosts.next().is_some() {
        return Err(TargetError::DuplicateHost);
    }
    let from_field = match host_field {
        Some(v) if v.is_empty() => None,
        Some(v) => Some(Authority::from_field(v)?),
        None => None,
    };
    let from_target = match uri.authority() {
        Some(a) => {
            if uri.scheme().is_none() {
                // Authority form (`GET a.example HTTP/1.1`): CONNECT's alone.
                return Err(TargetError::InvalidForm);
            }
            if a.as_str().contains('@') {
                return Err(TargetError::InvalidHost);
            }
            Some(Authority::parse(a.as_str().as_bytes())?)
        }
        None => None,
    };
    let http1 = version == Version::HTTP_11 || version == Version::HTTP_10;
    if version == Version::HTTP_11 && host_field.is_none() {
        return Err(TargetError::MissingHost);
    }
    match (from_target, from_field) {
        (Some(t), Some(f)) => {
            let default = match uri.scheme_str() {
                Some("https") => Some(443),
                _ => Some(80),
            };
            if !t.same_as(&f, default) {
                return Err(TargetError::HostMismatch);
            }
            Ok(Some(t))
        }
        (Some(t), None) => {
            // HTTP/1.1 with an absolute target and an empty `Host`: the
            // client broke RFC 9112 §3.2 (it must send the same value).
            if http1 && host_field.is_some() {
                return Err(TargetError::HostMismatch);
            }
            Ok(Some(t))
        }
        (None, f) => Ok(f),
    }
}

/// Splits `host[:port]`; an IPv6 literal is kept with its brackets.
fn split_host_port(raw: &[u8]) -> Result<(&[u8], Option<&[u8]>), TargetError> {
    if raw.first() == Some(&b'[') {
        let close = memchr::memchr(b']', raw).ok_or(TargetError::InvalidHost)?;
        let (host, rest) = raw.split_at(close + 1);
        return match rest {
            [] => Ok((host, None)),
            [b':', port @ ..] => Ok((host, Some(port))),
            _ => Err(TargetError::InvalidHost),
        };
    }
    match memchr::memchr(b':', raw) {
        Some(at) => Ok((&raw[..at], Some(&raw[at + 1..]))),
        None => Ok((raw, None)),
    }
}

fn parse_port(digits: &[u8]) -> Result<u16, TargetError> {
    if digits.is_empty() || digits.len() > 5 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(TargetError::InvalidHost);
    }
    let n = digits
        .iter()
        .fold(0u32, |n, d| n * 10 + u32::from(d - b'0'));
    u16::try_from(n).map_err(|_| TargetError::InvalidHost)
}

/// What a byte of a reg-name host may be: letters, digits, `-`, `_` as they
/// are (uppercase ones lowercased), `.` between labels; nothing else.
const HOST_BYTES: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = if c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'_' {
            HOST_AS_IS
        } else if c.is_ascii_uppercase() {
            HOST_UPPER
        } else if c == b'.' {
            HOST_DOT
        } else {
            0
        };
        b += 1;
    }
    t
};
const HOST_AS_IS: u8 = 1;
const HOST_UPPER: u8 = 2;
const HOST_DOT: u8 = 3;

/// Checks a host and returns it lowercase, without a trailing dot.
fn canonical_host(host: &[u8]) -> Result<Cow<'_, str>, TargetError> {
    if host.first() == Some(&b'[') {
        let inner = &host[1..host.len() - 1];
        let text = std::str::from_utf8(inner).map_err(|_| TargetError::InvalidHost)?;
        let addr: Ipv6Addr = text.parse().map_err(|_| TargetError::InvalidHost)?;
        let canonical = format!("[{addr}]");
        return Ok(if canonical.as_bytes() == host {
            Cow::Borrowed(std::str::from_utf8(host).unwrap_or(""))
        } else {
            Cow::Owned(canonical)
        });
    }
    let trimmed = host.strip_suffix(b".").unwrap_or(host);
    if trimmed.is_empty() || trimmed[0] == b'.' {
        return Err(TargetError::InvalidHost);
    }
    let mut previous_dot = false;
    let mut upper = false;
    for &b in trimmed {
        // One table load a byte: this runs for every request's `Host`.
        match HOST_BYTES[usize::from(b)] {
            HOST_DOT if previous_dot => return Err(TargetError::InvalidHost),
            HOST_DOT => {
                previous_dot = true;
                continue;
            }
            HOST_UPPER => upper = true,
            HOST_AS_IS => {}
            _ => return Err(TargetError::InvalidHost),
        }
        previous_dot = false;
    }
    // Checked ASCII above.
    let text = std::str::from_utf8(trimmed).map_err(|_| TargetError::InvalidHost)?;
    Ok(if upper {
        Cow::Owned(text.to_ascii_lowercase())
    } else if trimmed.len() != host.len() {
        Cow::Owned(text.to_owned())
    } else {
        Cow::Borrowed(text)
    })
}

/// Whether a path may need work: an escape, a backslash, a repeated slash
/// or a segment that starts with a dot. Most paths have none.
fn needs_normalising(path: &[u8]) -> bool {
    let mut previous = 0u8;
    for &b in path {
        match b {
            b'%' | b'\\' => return true,
            b'/' | b'.' if previous == b'/' => return true,
            _ => {}
        }
        previous = b;
    }
    false
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// The origin-form path and query the app gets for `raw` (its path
/// normalised under `policy`, its query as sent), and whether that is
/// other than what the client wrote.
fn canonical(raw: &PathAndQuery, policy: PathPolicy) -> Result<(PathAndQuery, bool), TargetError> {
    match normalise_path(raw.path(), policy)? {
        // `http://a.example?q`: `path()` says `/`, the text has none, and
        // the app must get `/?q` (found by the canonical_target fuzz
        // target: weir forwarded `?q` as the request target).
        Cow::Borrowed(_) if raw.as_str().starts_with('/') => Ok((raw.clone(), false)),
        normalised => {
            let mut text = normalised.into_owned();
            if let Some(q) = raw.query() {
                text.push('?');
                text.push_str(q);
            }
            let pq = PathAndQuery::from_maybe_shared(Bytes::from(text))
                .map_err(|_| TargetError::InvalidForm)?;
            Ok((pq, true))
        }
    }
}

/// RFC 3986 §6.2.2 for an origin-form path (it starts with `/`): see the
/// module docs for what is decoded, kept and refused.
fn normalise_path(path: &str, policy: PathPolicy) -> Result<Cow<'_, str>, TargetError> {
    let bytes = path.as_bytes();
    if !needs_normalising(bytes) {
        return Ok(Cow::Borrowed(path));
    }
    let mut out = Segments {
        out: Vec::with_capacity(bytes.len()),
        starts: Vec::new(),
    };
    let mut segment: Vec<u8> = Vec::new();
    let mut i = 1; // past the leading `/`
    loop {
        let end = memchr::memchr(b'/', &bytes[i..]).map_or(bytes.len(), |n| i + n);
        segment.clear();
        decode_segment(&bytes[i..end], policy, &mut segment)?;
        let last = end == bytes.len();
        out.push(&segment, last)?;
        if last {
            break;
        }
        i = end + 1;
    }
    let mut out = out.out;
    if out.is_empty() {
        out.push(b'/');
    }
    // Built from ASCII path bytes and escapes.
    let text = String::from_utf8(out).map_err(|_| TargetError::InvalidEscape)?;
    Ok(if text == path {
        Cow::Borrowed(path)
    } else {
        Cow::Owned(text)
    })
}

/// One segment's escapes normalised into `out`: unreserved characters,
/// `:` and `@` decoded, others kept with uppercase hex; what cannot be
/// read one way refused.
fn decode_segment(raw: &[u8], policy: PathPolicy, out: &mut Vec<u8>) -> Result<(), TargetError> {
    let mut j = 0;
    while j < raw.len() {
        match raw[j] {
            b'%' => {
                let value = match (raw.get(j + 1), raw.get(j + 2)) {
                    (Some(&h), Some(&l)) => hex_value(h).zip(hex_value(l)),
                    _ => None,
                };
                let Some((h, l)) = value else {
                    return Err(TargetError::InvalidEscape);
                };
                match h << 4 | l {
                    0 => return Err(TargetError::NulInPath),
                    b'\\' => return Err(TargetError::Backslash),
                    b'/' if !policy.keep_encoded_slash => return Err(TargetError::EncodedSlash),
                    v if is_unreserved(v) || v == b':' || v == b'@' => out.push(v),
                    v => out.extend_from_slice(&[
                        b'%',
                        HEX_UPPER[usize::from(v >> 4)],
                        HEX_UPPER[usize::from(v & 15)],
                    ]),
                }
                j += 3;
            }
            b'\\' => return Err(TargetError::Backslash),
            b => {
                out.push(b);
                j += 1;
            }
        }
    }
    Ok(())
}

/// A path being rebuilt segment by segment, dot segments removed and
/// empty ones merged (RFC 3986 §5.2.4).
struct Segments {
    out: Vec<u8>,
    /// Where each kept segment starts (its `/`), for `..` to remove it.
    starts: Vec<usize>,
}

impl Segments {
    /// Appends one decoded segment; `last`: no `/` follows it.
    fn push(&mut self, segment: &[u8], last: bool) -> Result<(), TargetError> {
        let name = segment.split(|&b| b == b';').next().unwrap_or(&[]);
        let with_parameters = segment.contains(&b';');
        match (name, with_parameters) {
            (b"." | b"..", true) => return Err(TargetError::DotParameter),
            (b".", false) => {}
            (b"..", false) => {
                if let Some(start) = self.starts.pop() {
                    self.out.truncate(start);
                }
            }
            // An empty segment: repeated slashes merge.
            ([], false) => {}
            _ => {
                self.starts.push(self.out.len());
                self.out.push(b'/');
                self.out.extend_from_slice(segment);
                return Ok(());
            }
        }
        // A path that ended in `/`, `/.` or `/..` still ends in `/`.
        if last && !self.out.ends_with(b"/") {
            self.out.push(b'/');
        }
        Ok(())
    }
}

/// The canonical path with its escapes decoded, for matching: `%2F` stays
/// (it is not a separator to the app either), and a path whose decoded
/// bytes are not UTF-8 stays as it is.
fn decode_for_matching(path: &str) -> Cow<'_, str> {
    if !path.contains('%') {
        return Cow::Borrowed(path);
    }
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let (Some(h), Some(l)) = (
                bytes.get(i + 1).copied().and_then(hex_value),
                bytes.get(i + 2).copied().and_then(hex_value),
            )
            && (h << 4 | l) != b'/'
        {
            out.push(h << 4 | l);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    match String::from_utf8(out) {
        Ok(s) => Cow::Owned(s),
        Err(_) => Cow::Borrowed(path),
    }
}

/// The keys of a query as PHP, Rails and Django read them: pairs split on
/// `&`, the key before the first `=`, `+` a space, escapes decoded
/// (invalid ones kept as written), and cut at a `[`.
pub fn query_keys(query: &str) -> impl Iterator<Item = Cow<'_, str>> {
    // Split with `memchr`, not `str::split`: the general pattern searcher
    // cost more than the rest of route matching (bench/README.md).
    let mut rest = Some(query);
    std::iter::from_fn(move || {
        loop {
            let text = rest?;
            let end = memchr::memchr(b'&', text.as_bytes());
            let pair = &text[..end.unwrap_or(text.len())];
            rest = end.map(|e| &text[e + 1..]);
            if pair.is_empty() {
                continue;
            }
            let key = memchr::memchr(b'=', pair.as_bytes()).map_or(pair, |eq| &pair[..eq]);
            return Some(cut_at_bracket(decode_form(key)));
        }
    })
}

/// `search[]` and `search[x]` are `search` to PHP and Rails.
fn cut_at_bracket(key: Cow<'_, str>) -> Cow<'_, str> {
    match key.find('[') {
        Some(0) | None => key,
        Some(at) => match key {
            Cow::Borrowed(k) => Cow::Borrowed(&k[..at]),
            Cow::Owned(mut k) => {
                k.truncate(at);
                Cow::Owned(k)
            }
        },
    }
}

/// `application/x-www-form-urlencoded` decoding of one key or value.
fn decode_form(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    if !bytes.iter().any(|&b| b == b'%' || b == b'+') {
        return Cow::Borrowed(text);
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) => hex_value(h).zip(hex_value(l)),
            _ => None,
        };
        match (bytes[i], escaped) {
            (_, Some((h, l))) => {
                out.push(h << 4 | l);
                i += 3;
            }
            (b'+', None) => {
                out.push(b' ');
                i += 1;
            }
            (b, None) => {
                out.push(b);
                i += 1;
            }
        }
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests;
