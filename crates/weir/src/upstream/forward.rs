//! Forwarding one request: header rewriting for the hop and the send itself.
//!
//! Proxy semantics (RFC 9110 §7.6): hop-by-hop headers (and any named in
//! `Connection`) are removed in both directions, `Host` is kept, and the
//! forwarding headers are set as configured. Forwarding information received
//! from an untrusted peer is never passed on: a spoofed `X-Forwarded-For` must
//! not reach the app either.

use std::net::IpAddr;
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use smallvec::SmallVec;

use super::health::RequestOutcome;
use super::pool::{Pool, Server};
use crate::config::{ForwardingConfig, XffMode};
use crate::identity::ClientId;
use crate::respond::{Reason, Side};
use weir_http::BoxError;
use weir_http::body::RequestBody;
use weir_http::client::ExchangeError;
use weir_http::connections::{ConnSettings, ConnectError, SendError, UpstreamBody};
use weir_http::framing::is_hop_by_hop;
use weir_http::target::Authority;

/// A failed exchange with an upstream server.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// The pool has no server to try.
    #[error("no server to send to")]
    NoServer,
    /// Every server is dead and the request is not an idempotent read.
    #[error("no healthy server, and the request is not an idempotent read")]
    NoHealthyServer,
    /// Nothing was sent: the connection could not be made. Safe to retry.
    #[error("connect to {server} failed: {source}")]
    Connect {
        server: std::net::SocketAddr,
        source: ConnectError,
    },
    /// No response headers within the response timeout.
    #[error("{server} sent no response within {after:?}")]
    Timeout {
        server: std::net::SocketAddr,
        after: Duration,
    },
    /// The exchange failed after the request was (partly) sent.
    #[error("exchange with {server} failed: {source}")]
    Exchange {
        server: std::net::SocketAddr,
        source: ExchangeError,
    },
    /// A kept-alive connection closed with the request sent and no response
    /// byte received: the server may or may not have seen the request.
    #[error("{server} closed a kept-alive connection before responding: {source}")]
    Closed {
        server: std::net::SocketAddr,
        source: ExchangeError,
    },
}

impl ForwardError {
    /// The client's request body failed (it stalled past its class's body
    /// timeout, or was cut): the client's fault, not the server's.
    pub fn client_body(&self) -> Option<&BoxError> {
        match self {
            ForwardError::Exchange {
                source: ExchangeError::RequestBody(e),
                ..
            } => Some(e),
            _ => None,
        }
    }

    /// A bounded label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            ForwardError::NoServer => "no_server",
            // One name with the rescue's shed (`x-weir-reason`).
            ForwardError::NoHealthyServer => crate::policy::ShedCause::NoHealthyServer.label(),
            ForwardError::Connect { .. } => "connect",
            ForwardError::Closed { .. } => "closed",
            ForwardError::Timeout { .. } => "timeout",
            // The client's side of an upload failing says nothing about the
            // server (and does not count against its health).
            ForwardError::Exchange {
                source: ExchangeError::RequestBody(e),
                ..
            } => {
                use weir_http::body::{BodyReadTimeout, BodyTooLarge, BodyTooSlow};
                if e.is::<BodyReadTimeout>() {
                    "client_body_timeout"
                } else if e.is::<BodyTooSlow>() {
                    "client_body_too_slow"
                } else if e.is::<BodyTooLarge>() {
                    "client_body_too_large"
                } else {
                    "client_body"
                }
            }
            ForwardError::Exchange { .. } => "exchange",
        }
    }

    /// The side of the failure (see [`Reason::side`]).
    fn failed_side(&self) -> Side {
        if self.client_body().is_some() {
            Side::Client
        } else {
            Side::Upstream
        }
    }

    /// What the failure says about the server's health; `None` when it says
    /// nothing: the client's own upload stalled or stopped, or no server
    /// was tried.
    pub fn health(&self) -> Option<RequestOutcome> {
        if self.client_body().is_some() {
            return None;
        }
        match self {
            ForwardError::Connect { .. } => Some(RequestOutcome::Refused),
            ForwardError::Timeout { .. } => Some(RequestOutcome::Timeout),
            ForwardError::Exchange { .. } | ForwardError::Closed { .. } => {
                Some(RequestOutcome::Reset)
            }
            ForwardError::NoServer | ForwardError::NoHealthyServer => None,
        }
    }

    /// What the failure tells the adaptive limit about the app's load:
    /// overload for a timeout, a reset or a connection closed on the
    /// request (what an app whose backlog is full does, with no latency to
    /// show queueing: counted as nothing, the limit would stay where the
    /// backlog overflows); nothing when no server was
    /// tried, the connect failed (health's business) or the client's own
    /// upload failed.
    pub fn load(&self) -> crate::admission::Outcome {
        use crate::admission::Outcome;
        if self.client_body().is_some() {
            return Outcome::Abandoned;
        }
        match self {
            ForwardError::Timeout { .. }
            | ForwardError::Exchange { .. }
            | ForwardError::Closed { .. } => Outcome::Overloaded,
            ForwardError::NoServer
            | ForwardError::NoHealthyServer
            | ForwardError::Connect { .. } => Outcome::Abandoned,
        }
    }

    /// True when another server may be sent the request: the upstream never
    /// saw it, or (for an idempotent request, RFC 9110 §9.2.2) the kept-alive
    /// connection closed before any response, as nginx's `proxy_next_upstream
    /// error` also assumes.
    pub fn retryable(&self, idempotent: bool) -> bool {
        match self {
            ForwardError::Connect { .. } => true,
            ForwardError::Closed { .. } => idempotent,
            _ => false,
        }
    }

    /// True when nothing listened at the server's address (connection
    /// refused): the app is not running, as while it restarts. Nothing was
    /// sent, so waiting for it and trying again is safe for any request.
    pub fn not_listening(&self) -> bool {
        matches!(
            self,
            ForwardError::Connect {
                source: ConnectError::Io(e),
                ..
            } if e.kind() == std::io::ErrorKind::ConnectionRefused
        )
    }

    /// True when the app turned the request away without a word: the
    /// connection (kept alive or new) closed or was reset with the request
    /// sent and no response byte. That is how an app whose backlog is full
    /// refuses (php-fpm past `listen.backlog`), and what the first burst
    /// meets in front of an app whose limit weir has not learned yet.
    pub fn refused(&self) -> bool {
        match self {
            ForwardError::Closed { .. } => true,
            ForwardError::Exchange { source, .. } => {
                matches!(source, ExchangeError::NoResponse(_))
            }
            _ => false,
        }
    }
}

/// An exchange that failed is answered by its side: the app's failures
/// with 502/504 (told plainly, no template), the client's own upload that
/// stalled or broke with 408/400, counted as the client's: a client's
/// broken upload is not the app's failure, and must not page whoever
/// watches 5xx.
impl Reason for ForwardError {
    fn status(&self) -> StatusCode {
        match (self, self.client_body()) {
            (_, Some(e))
                if e.is::<weir_http::body::BodyReadTimeout>()
                    || e.is::<weir_http::body::BodyTooSlow>() =>
            {
                StatusCode::REQUEST_TIMEOUT
            }
            (_, Some(e)) if e.is::<weir_http::body::BodyTooLarge>() => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            (_, Some(_)) => StatusCode::BAD_REQUEST,
            (ForwardError::Timeout { .. }, _) => StatusCode::GATEWAY_TIMEOUT,
            (ForwardError::NoHealthyServer, _) => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::BAD_GATEWAY,
        }
    }

    fn label(&self) -> &str {
        self.kind()
    }

    fn message(&self) -> String {
        match (self, self.client_body()) {
            (_, Some(e)) if e.is::<weir_http::body::BodyReadTimeout>() => {
                "the request body stopped arriving".into()
            }
            (_, Some(_)) => "the request body could not be read".into(),
            (ForwardError::Timeout { .. }, _) => "the application did not answer in time".into(),
            _ => "the application could not be reached".into(),
        }
    }

    fn side(&self) -> Side {
        self.failed_side()
    }

    fn templated(&self) -> bool {
        false
    }
}

/// Sends `req` to `server` and waits up to `timeout` for response headers.
/// The request says what was decided on already (`Target::forward`: origin
/// form, the canonical path and `Host`); it goes as HTTP/1.1.
pub async fn send(
    pool: &Pool,
    server: &Server,
    req: &mut Request<RequestBody>,
    timeout: Duration,
) -> Result<Box<Response<UpstreamBody>>, ForwardError> {
    *req.version_mut() = Version::HTTP_11;
    // The timeout runs from the request sent whole (and bounds each stall
    // of its body): an upload at a client's pace is not the app's delay.
    let settings = ConnSettings {
        response_timeout: timeout,
        ..pool.conn
    };
    match server.connections.send(server.addr, &settings, req).await {
        Err(SendError::Exchange(ExchangeError::TimedOut(after))) => Err(ForwardError::Timeout {
            server: server.addr,
            after,
        }),
        Err(SendError::Connect(source)) => Err(ForwardError::Connect {
            server: server.addr,
            source,
        }),
        Err(SendError::Exchange(source)) => Err(ForwardError::Exchange {
            server: server.addr,
            source,
        }),
        Err(SendError::Closed(source)) => Err(ForwardError::Closed {
            server: server.addr,
            source,
        }),
        Ok(resp) => Ok(resp),
    }
}

/// Facts about this hop that the forwarding headers describe.
#[derive(Debug, Clone, Copy)]
pub struct Hop<'a> {
    pub client: &'a ClientId,
    /// The TCP peer is a trusted proxy (its forwarding headers are believed).
    pub peer_trusted: bool,
    /// The PROXY protocol source, when the peer sent one.
    pub proxy_source: Option<IpAddr>,
    /// The client connection is TLS.
    pub tls: bool,
    /// The request's canonical authority (what the app receives in
    /// `Host`), for `Forwarded: host=`.
    pub authority: Option<&'a Authority>,
}

/// The configured forwarding headers, ready to apply.
#[derive(Debug, Clone)]
pub struct ForwardingHeaders {
    config: ForwardingConfig,
}

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

impl ForwardingHeaders {
    pub fn new(config: ForwardingConfig) -> Self {
        ForwardingHeaders { config }
    }

    /// Rewrites forwarding headers on a request about to go upstream.
    pub fn apply(&self, headers: &mut HeaderMap, hop: &Hop<'_>, version: Version) {
        self.apply_x_forwarded_for(headers, hop);
        if !hop.peer_trusted {
            // Both are rare in requests: look before paying for two removals.
            if headers
                .keys()
                .any(|k| *k == X_REAL_IP || *k == header::FORWARDED)
            {
                headers.remove(&X_REAL_IP);
                headers.remove(header::FORWARDED);
            }
        }
        let proto = if hop.tls { "https" } else { "http" };
        if self.config.x_forwarded_proto {
            // A trusted load balancer that terminated TLS knows the real scheme.
            if !(hop.peer_trusted && headers.contains_key(&X_FORWARDED_PROTO)) {
                headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static(proto));
            }
        } else if !hop.peer_trusted {
            headers.remove(&X_FORWARDED_PROTO);
        }
        if self.config.forwarded {
            append_forwarded(headers, hop, proto);
        }
        if self.config.via {
            append_via(headers, version);
        }
    }

    /// Sets `X-Forwarded-For` as configured: removed, replaced by the
    /// client, or (from a trusted peer) the received chain with the nearest
    /// hop appended.
    #[inline]
    fn apply_x_forwarded_for(&self, headers: &mut HeaderMap, hop: &Hop<'_>) {
        let client = hop.client.client.ip();
        let nearest = hop.proxy_source.unwrap_or_else(|| hop.client.peer.ip());
        match self.config.x_forwarded_for {
            XffMode::Off => {
                headers.remove(&X_FORWARDED_FOR);
            }
            XffMode::Replace => {
                headers.insert(X_FORWARDED_FOR.clone(), ip_value(client));
            }
            XffMode::Append if hop.peer_trusted => {
                let received: Vec<&str> = headers
                    .get_all(&X_FORWARDED_FOR)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .collect();
                let value = if received.is_empty() {
                    nearest.to_string()
                } else {
                    format!("{}, {nearest}", received.join(", "))
                };
                set(headers, &X_FORWARDED_FOR, &value);
            }
            XffMode::Append => {
                headers.insert(X_FORWARDED_FOR.clone(), ip_value(client));
            }
        }
    }
}

/// Appends this hop's `Forwarded` element (`for`, `host`, `proto`) to a
/// trusted peer's, or sets it alone.
#[inline]
fn append_forwarded(headers: &mut HeaderMap, hop: &Hop<'_>, proto: &str) {
    let mut element = format!("for={}", forwarded_node(hop.client.client.ip()));
    if let Some(a) = hop.authority {
        element.push_str(";host=");
        push_quoted(&mut element, a.as_str());
    }
    element.push_str(&format!(";proto={proto}"));
    let value = match headers.get(header::FORWARDED).and_then(|v| v.to_str().ok()) {
        Some(prev) if hop.peer_trusted => format!("{prev}, {element}"),
        _ => element,
    };
    set(headers, &header::FORWARDED, &value);
}

/// Appends weir to `Via`, with the protocol version it received.
#[inline]
fn append_via(headers: &mut HeaderMap, version: Version) {
    let v = match version {
        Version::HTTP_2 => "2 weir",
        Version::HTTP_10 => "1.0 weir",
        _ => "1.1 weir",
    };
    let value = match headers.get(header::VIA).and_then(|x| x.to_str().ok()) {
        Some(prev) => format!("{prev}, {v}"),
        None => v.to_string(),
    };
    set(headers, &header::VIA, &value);
}

/// An address as a header value, without a UTF-8 re-check and, for IPv4,
/// in one allocation of its exact length (a `Bytes` made from a vector
/// with room to spare allocates twice).
fn ip_value(ip: IpAddr) -> HeaderValue {
    let bytes = match ip {
        IpAddr::V4(v4) => {
            let (text, len) = crate::identity::v4_text(v4);
            bytes::Bytes::copy_from_slice(&text[..len])
        }
        IpAddr::V6(_) => {
            let mut buf = Vec::with_capacity(45);
            crate::identity::write_ip(&mut buf, ip);
            bytes::Bytes::from(buf)
        }
    };
    // Digits, dots, colons and hex letters are all valid header bytes.
    HeaderValue::from_maybe_shared(bytes).unwrap_or_else(|_| HeaderValue::from_static(""))
}

fn forwarded_node(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("\"[{v6}]\""),
    }
}

/// `text` as an RFC 9110 §5.6.4 quoted-string: `"` and `\` escaped, so a
/// value cannot close the quotes and add elements of its own. (A canonical
/// authority holds neither; this holds without relying on that.)
fn push_quoted(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

fn set(headers: &mut HeaderMap, name: &HeaderName, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        headers.insert(name.clone(), v);
    }
}

/// Removes hop-by-hop headers, including any listed in `Connection`.
/// With `keep_upgrade`, `Connection: upgrade` and `Upgrade` stay (WebSocket).
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    // One pass over the names finds what is present; only those are removed
    // (a hashed removal per hop-by-hop name cost more than the rest of the
    // rewrite, and most responses carry just `Connection: keep-alive`).
    let mut remove: SmallVec<[HeaderName; 4]> = headers
        .keys()
        .filter(|n| is_hop_by_hop(n.as_str().as_bytes()))
        .cloned()
        .collect();
    if remove.is_empty() && !keep_upgrade {
        return;
    }
    for value in headers.get_all(header::CONNECTION) {
        let Ok(value) = value.to_str() else { continue };
        for token in value.split(',').map(str::trim) {
            // `close` names no header; `keep-alive` is removed anyway.
            if token.is_empty()
                || token.eq_ignore_ascii_case("close")
                || token.eq_ignore_ascii_case("keep-alive")
            {
                continue;
            }
            if let Ok(name) = HeaderName::from_bytes(token.as_bytes())
                && !remove.contains(&name)
            {
                remove.push(name);
            }
        }
    }
    for name in &remove {
        if keep_upgrade && *name == header::UPGRADE {
            continue;
        }
        headers.remove(name);
    }
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_uploads_are_labelled_by_whose_side_failed() {
        let server: std::net::SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let exchange = |source| ForwardError::Exchange { server, source };
        let stalled = exchange(ExchangeError::RequestBody(Box::new(
            weir_http::body::BodyReadTimeout(Duration::from_secs(1)),
        )));
        assert_eq!(stalled.kind(), "client_body_timeout");
        let gone = exchange(ExchangeError::RequestBody("client went away".into()));
        assert_eq!(gone.kind(), "client_body");
        let incomplete = exchange(ExchangeError::Incomplete);
        assert_eq!(incomplete.kind(), "exchange");
        // Issue 17: a client's broken upload was a 502 `exchange`.
        assert_eq!(
            (stalled.status(), stalled.side()),
            (StatusCode::REQUEST_TIMEOUT, Side::Client)
        );
        assert_eq!(
            (gone.status(), gone.side()),
            (StatusCode::BAD_REQUEST, Side::Client)
        );
        assert_eq!(
            (incomplete.status(), incomplete.side()),
            (StatusCode::BAD_GATEWAY, Side::Upstream)
        );
        let timeout = ForwardError::Timeout {
            server,
            after: Duration::from_secs(1),
        };
        assert_eq!(timeout.status(), StatusCode::GATEWAY_TIMEOUT);
        assert!(!gone.retryable(true));
    }
    use crate::identity::{AddrSource, ClientAddr, PeerAddr};

    fn id(peer: &str, client: &str) -> ClientId {
        ClientId {
            peer: PeerAddr(format!("{peer}:5000").parse().unwrap()),
            client: ClientAddr::new(client.parse().unwrap()),
            source: AddrSource::Peer,
        }
    }

    fn run(
        mode: XffMode,
        trusted: bool,
        incoming: &[(&str, &str)],
        peer: &str,
        client: &str,
    ) -> HeaderMap {
        let mut h = header_map(incoming);
        let cid = id(peer, client);
        let authority = Authority::parse(b"wiki.example").unwrap();
        let fh = ForwardingHeaders::new(ForwardingConfig {
            x_forwarded_for: mode,
            x_forwarded_proto: true,
            forwarded: true,
            via: true,
        });
        fh.apply(
            &mut h,
            &Hop {
                client: &cid,
                peer_trusted: trusted,
                proxy_source: None,
                tls: false,
                authority: Some(&authority),
            },
            Version::HTTP_11,
        );
        h
    }

    #[test]
    fn forwarded_host_is_a_quoted_string_that_cannot_add_elements() {
        // Issue 17: `Host: x", for=6.6.6.6;host="y` became `for=6.6.6.6`.
        let mut out = String::new();
        push_quoted(&mut out, r#"x", for=6.6.6.6;host="y\"#);
        assert_eq!(out, r#""x\", for=6.6.6.6;host=\"y\\""#);
        let h = run(XffMode::Append, false, &[], "9.9.9.9", "9.9.9.9");
        assert_eq!(
            get(&h, "forwarded"),
            Some(r#"for=9.9.9.9;host="wiki.example";proto=http"#)
        );
    }

    fn get<'a>(h: &'a HeaderMap, k: &str) -> Option<&'a str> {
        h.get(k).and_then(|v| v.to_str().ok())
    }

    #[test]
    fn xff_table() {
        let spoof = [("x-forwarded-for", "6.6.6.6")];
        let chain = [
            ("x-forwarded-for", "1.1.1.1, 2.2.2.2"),
            ("x-forwarded-for", "3.3.3.3"),
        ];
        type Case<'a> = (
            XffMode,
            bool,
            &'a [(&'a str, &'a str)],
            &'a str,
            &'a str,
            Option<&'a str>,
        );
        let cases: &[Case] = &[
            (
                XffMode::Append,
                false,
                &spoof,
                "9.9.9.9",
                "9.9.9.9",
                Some("9.9.9.9"),
            ),
            (
                XffMode::Append,
                true,
                &chain,
                "10.0.0.1",
                "3.3.3.3",
                Some("1.1.1.1, 2.2.2.2, 3.3.3.3, 10.0.0.1"),
            ),
            (
                XffMode::Append,
                true,
                &[],
                "10.0.0.1",
                "10.0.0.1",
                Some("10.0.0.1"),
            ),
            (
                XffMode::Replace,
                true,
                &chain,
                "10.0.0.1",
                "3.3.3.3",
                Some("3.3.3.3"),
            ),
            (XffMode::Off, true, &chain, "10.0.0.1", "3.3.3.3", None),
        ];
        for (i, (mode, trusted, incoming, peer, client, want)) in cases.iter().enumerate() {
            let h = run(*mode, *trusted, incoming, peer, client);
            assert_eq!(get(&h, "x-forwarded-for"), *want, "case {i}");
        }
    }

    #[test]
    fn untrusted_forwarding_headers_are_not_passed_on() {
        let h = run(
            XffMode::Append,
            false,
            &[
                ("forwarded", "for=6.6.6.6"),
                ("x-real-ip", "6.6.6.6"),
                ("x-forwarded-proto", "https"),
            ],
            "9.9.9.9",
            "9.9.9.9",
        );
        assert_eq!(
            get(&h, "forwarded"),
            Some("for=9.9.9.9;host=\"wiki.example\";proto=http")
        );
        assert_eq!(get(&h, "x-real-ip"), None);
        assert_eq!(get(&h, "x-forwarded-proto"), Some("http"));
        assert_eq!(get(&h, "via"), Some("1.1 weir"));
    }

    #[test]
    fn trusted_proto_is_kept() {
        let h = run(
            XffMode::Append,
            true,
            &[("x-forwarded-proto", "https")],
            "10.0.0.1",
            "1.2.3.4",
        );
        assert_eq!(get(&h, "x-forwarded-proto"), Some("https"));
    }

    fn header_map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn hop_by_hop_removed() {
        let mut h = header_map(&[
            ("connection", "keep-alive, x-secret"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("host", "a"),
        ]);
        let mut plain = h.clone();
        strip_hop_by_hop(&mut plain, false);
        let names: Vec<&str> = plain.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, vec!["host"]);
        strip_hop_by_hop(&mut h, true);
        assert_eq!(get(&h, "upgrade"), Some("websocket"));
        assert_eq!(get(&h, "connection"), Some("upgrade"));
        assert_eq!(get(&h, "x-secret"), None);

        // Several `Connection` lines, a name listed twice, odd spacing.
        let mut h = header_map(&[
            ("connection", "close"),
            ("connection", " x-a ,x-b, x-a,,"),
            ("x-a", "1"),
            ("x-b", "2"),
            ("x-c", "3"),
        ]);
        strip_hop_by_hop(&mut h, false);
        let names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, vec!["x-c"]);
    }
}
