//! Client resolution from forwarding information: `X-Forwarded-For`, RFC 7239
//! `Forwarded`, and a PROXY protocol source address.
//!
//! Owns the trust walk: the hop chain is
//! `[header entries left→right…, PROXY source (if any), TCP peer]`, and the
//! client is the rightmost hop that is not a trusted proxy. Anything a hop
//! wrote is believed only if that hop is trusted, so a client cannot spoof its
//! address by prepending entries, and an untrusted peer's headers are ignored
//! (but reported, so an operator who forgot to trust the load balancer sees it
//! in minutes: incident 4).
//!
//! It does not read PROXY protocol bytes (that is `edge::proxy_protocol`), does
//! not rewrite headers for the upstream, and does not decide anything about
//! the request.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv6Addr};

use http::HeaderMap;
use http::header::{FORWARDED, HeaderName};

use super::addr::{AddrSource, ClientAddr, ClientId, PeerAddr, normalize};
use super::trusted::TrustedProxies;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// Which forwarding header to believe from trusted proxies (configuration).
/// The other one is ignored entirely: believing whichever is present would let
/// a client add the header the proxy does not set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ForwardedHeader {
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=…`.
    Forwarded,
}

impl ForwardedHeader {
    /// The header name, lower case.
    pub fn header_name(&self) -> &'static str {
        match self {
            ForwardedHeader::XForwardedFor => "x-forwarded-for",
            ForwardedHeader::Forwarded => "forwarded",
        }
    }

    fn source(&self) -> AddrSource {
        match self {
            ForwardedHeader::XForwardedFor => AddrSource::XForwardedFor,
            ForwardedHeader::Forwarded => AddrSource::Forwarded,
        }
    }
}

/// Something about a request's forwarding information worth counting
/// (a bounded metric label, never an address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ForwardingWarning {
    /// The peer is not a trusted proxy but sent `X-Forwarded-For`,
    /// `Forwarded`, `X-Real-IP` or a PROXY header: it was ignored. Many of
    /// these from one address usually mean the load balancer is missing from
    /// the trusted list.
    UntrustedPeer,
    /// A hop in the configured header could not be parsed or was obfuscated
    /// (`unknown`, `_hidden`): the walk stopped at the nearest valid hop to
    /// its right.
    Malformed,
    /// The peer is trusted but supplied no forwarding information (no PROXY
    /// source, configured header absent or empty): the client is the proxy
    /// itself. A proxy's own health checks do this; user traffic doing it
    /// means the proxy does not set the configured header.
    MissingFromTrustedPeer,
}

impl ForwardingWarning {
    pub fn as_str(&self) -> &'static str {
        match self {
            ForwardingWarning::UntrustedPeer => "untrusted_peer",
            ForwardingWarning::Malformed => "malformed",
            ForwardingWarning::MissingFromTrustedPeer => "missing_from_trusted_peer",
        }
    }
}

/// The outcome of [`resolve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolved {
    pub client: ClientId,
    pub warning: Option<ForwardingWarning>,
}

/// One entry of a forwarding header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hop {
    Addr(IpAddr),
    /// Unparsable, obfuscated, or (for `Forwarded`) an element without `for=`.
    Invalid,
}

/// Names the client of a request.
///
/// The hop chain is `[header entries left→right…, proxy_source, peer]`; multiple
/// header lines concatenate in order. If the peer is not trusted it is the
/// client, and `proxy_source` and headers are ignored. Otherwise the chain is
/// walked right to left and the client is the first hop that is not trusted
/// (or the leftmost if all are). An invalid entry stops the walk at the valid
/// hop to its right. Never panics, whatever the header bytes.
pub fn resolve(
    peer: PeerAddr,
    proxy_source: Option<IpAddr>,
    headers: &HeaderMap,
    trusted: &TrustedProxies,
    header: ForwardedHeader,
) -> Resolved {
    let found = |ip: IpAddr, source: AddrSource, warning: Option<ForwardingWarning>| Resolved {
        client: ClientId {
            peer,
            client: ClientAddr::new(ip),
            source,
        },
        warning,
    };

    let peer_ip = peer.ip();
    if !trusted.contains(peer_ip) {
        let warning = untrusted_peer_warning(proxy_source, headers);
        return found(peer_ip, AddrSource::Peer, warning);
    }

    // `current` is the nearest valid hop walked so far: the answer if the walk
    // stops (invalid entry) or runs out (every hop trusted).
    let mut current = (peer_ip, AddrSource::Peer);
    if let Some(src) = proxy_source {
        let src = normalize(src);
        current = (src, AddrSource::ProxyProtocol);
        if !trusted.contains(src) {
            return found(src, AddrSource::ProxyProtocol, None);
        }
    }

    let warning = walk_forwarding_header(
        headers,
        trusted,
        header,
        proxy_source.is_some(),
        &mut current,
    );
    found(current.0, current.1, warning)
}

/// The warning for an untrusted peer that sent forwarding information
/// anyway (a PROXY header or a forwarding header), which weir ignores.
#[inline]
fn untrusted_peer_warning(
    proxy_source: Option<IpAddr>,
    headers: &HeaderMap,
) -> Option<ForwardingWarning> {
    // One pass over the names: cheaper than three hashed lookups of
    // fields most requests do not carry.
    let carries = proxy_source.is_some()
        || headers
            .keys()
            .any(|k| *k == X_FORWARDED_FOR || *k == FORWARDED || *k == X_REAL_IP);
    carries.then_some(ForwardingWarning::UntrustedPeer)
}

/// Walks the hops of the forwarding `header` right to left, moving
/// `current` (the nearest valid hop so far) to each, and stops at the first
/// untrusted one. Returns the walk's warning: `Malformed` when it stopped at
/// an invalid entry, `MissingFromTrustedPeer` when a trusted peer sent no hop
/// at all (and no PROXY header, `had_proxy_source`).
fn walk_forwarding_header(
    headers: &HeaderMap,
    trusted: &TrustedProxies,
    header: ForwardedHeader,
    had_proxy_source: bool,
    current: &mut (IpAddr, AddrSource),
) -> Option<ForwardingWarning> {
    let source = header.source();
    let mut walked_any = false;
    let mut walk = |hop: Hop| -> Option<Option<ForwardingWarning>> {
        walked_any = true;
        match hop {
            Hop::Invalid => Some(Some(ForwardingWarning::Malformed)),
            Hop::Addr(ip) => {
                *current = (ip, source);
                (!trusted.contains(ip)).then_some(None)
            }
        }
    };
    // Lines in reverse, entries in each line in reverse: right to left.
    let stopped = match header {
        ForwardedHeader::XForwardedFor => headers
            .get_all(X_FORWARDED_FOR)
            .iter()
            .rev()
            .flat_map(|line| line.as_bytes().rsplit(|&b| b == b','))
            .filter_map(xff_hop)
            .find_map(&mut walk),
        ForwardedHeader::Forwarded => headers
            .get_all(FORWARDED)
            .iter()
            .rev()
            .flat_map(|line| forwarded_hops(line.as_bytes()).into_iter().rev())
            .find_map(&mut walk),
    };
    match stopped {
        Some(warning) => warning,
        None if !walked_any && !had_proxy_source => Some(ForwardingWarning::MissingFromTrustedPeer),
        None => None,
    }
}

/// Whether the client's own connection was TLS, as the trusted proxy in
/// front says: `X-Forwarded-Proto: https` (the last value: the hop next to
/// weir wrote it), or the last `Forwarded` element's `proto=https`. Only
/// for a peer weir trusts; anyone else's word is no evidence. Decides
/// whether weir's cookies are `Secure` behind a TLS-terminating balancer.
pub fn proto_is_https(headers: &HeaderMap, peer_trusted: bool) -> bool {
    if !peer_trusted {
        return false;
    }
    let last = |name| {
        (headers.get_all(name).iter().next_back())
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.rsplit(',').next())
            .map(str::trim)
    };
    if let Some(proto) = last(X_FORWARDED_PROTO) {
        return proto.eq_ignore_ascii_case("https");
    }
    last(FORWARDED).is_some_and(|element| {
        element.split(';').any(|pair| {
            pair.split_once('=').is_some_and(|(k, v)| {
                k.trim().eq_ignore_ascii_case("proto")
                    && v.trim().trim_matches('"').eq_ignore_ascii_case("https")
            })
        })
    })
}

const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

fn is_ows(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if !is_ows(*first) {
            break;
        }
        s = rest;
    }
    while let [rest @ .., last] = s {
        if !is_ows(*last) {
            break;
        }
        s = rest;
    }
    s
}

/// One `X-Forwarded-For` entry; `None` for an empty list element, which
/// RFC 9110 §5.6.1 says recipients ignore.
fn xff_hop(entry: &[u8]) -> Option<Hop> {
    let entry = trim_ows(entry);
    if entry.is_empty() {
        return None;
    }
    let hop = std::str::from_utf8(entry)
        .ok()
        .and_then(|s| parse_node(s, false))
        .map_or(Hop::Invalid, Hop::Addr);
    Some(hop)
}

/// An address with an optional port: `192.0.2.1`, `192.0.2.1:80`,
/// `2001:db8::1`, `[2001:db8::1]`, `[2001:db8::1]:80`. With `obfuscated_port`,
/// RFC 7239 `_name` ports are accepted too. The port is discarded.
fn parse_node(s: &str, obfuscated_port: bool) -> Option<IpAddr> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':')?),
        };
        (IpAddr::V6(host.parse::<Ipv6Addr>().ok()?), port)
    } else if let Ok(ip) = s.parse::<IpAddr>() {
        // Bare IPv6 is not RFC 7239 syntax, but proxies write it in XFF.
        (ip, None)
    } else {
        let (host, port) = s.split_once(':')?;
        (IpAddr::V4(host.parse().ok()?), Some(port))
    };
    let port_ok = match port {
        None => true,
        Some(p) => is_decimal_port(p) || (obfuscated_port && is_obfuscated_port(p)),
    };
    port_ok.then(|| normalize(host))
}

fn is_decimal_port(p: &str) -> bool {
    (1..=5).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok()
}

/// RFC 7239 §6.3 `obfport = "_" 1*(ALPHA / DIGIT / "." / "_" / "-")`.
fn is_obfuscated_port(p: &str) -> bool {
    p.len() > 1
        && p.starts_with('_')
        && p[1..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// Splits `s` at `sep` outside quoted strings, without allocating. Yields
/// `(piece, unterminated)`; the flag is true for a piece whose quoted string
/// never closed.
fn split_unquoted(s: &[u8], sep: u8) -> impl Iterator<Item = (&[u8], bool)> {
    let mut rest = Some(s);
    std::iter::from_fn(move || {
        let s = rest?;
        let mut in_quote = false;
        let mut escaped = false;
        for (i, &b) in s.iter().enumerate() {
            if in_quote {
                if escaped {
                    escaped = false;
                } else if b == b'\\' {
                    escaped = true;
                } else if b == b'"' {
                    in_quote = false;
                }
            } else if b == b'"' {
                in_quote = true;
            } else if b == sep {
                rest = Some(&s[i + 1..]);
                return Some((&s[..i], false));
            }
        }
        rest = None;
        Some((s, in_quote))
    })
}

/// The hops of one `Forwarded` line, left to right; empty elements skipped.
fn forwarded_hops(line: &[u8]) -> Vec<Hop> {
    split_unquoted(line, b',')
        .filter(|(element, _)| !trim_ows(element).is_empty())
        .map(|(element, unterminated)| {
            if unterminated {
                return Hop::Invalid;
            }
            forwarded_element_for(element).map_or(Hop::Invalid, Hop::Addr)
        })
        .collect()
}

/// The `for=` node of one element. `None` if absent, repeated (RFC 7239 §4:
/// a parameter MUST NOT occur more than once per element), obfuscated or
/// unparsable.
fn forwarded_element_for(element: &[u8]) -> Option<IpAddr> {
    let mut node = None;
    for (pair, _) in split_unquoted(element, b';') {
        let pair = trim_ows(pair);
        if pair.is_empty() {
            continue;
        }
        let eq = pair.iter().position(|&b| b == b'=')?;
        let name = trim_ows(&pair[..eq]);
        if !name.eq_ignore_ascii_case(b"for") {
            continue;
        }
        if node.is_some() {
            return None;
        }
        node = Some(unquote(trim_ows(&pair[eq + 1..]))?);
    }
    let node = node?;
    let node = std::str::from_utf8(&node).ok()?;
    parse_node(node, true)
}

/// A token, or a quoted-string with its quotes and `\` escapes removed.
fn unquote(value: &[u8]) -> Option<Cow<'_, [u8]>> {
    let Some(inner) = value.strip_prefix(b"\"") else {
        return (!value.contains(&b'"')).then_some(Cow::Borrowed(value));
    };
    let inner = inner.strip_suffix(b"\"")?;
    if !inner.contains(&b'\\') {
        return Some(Cow::Borrowed(inner));
    }
    let mut out = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter();
    while let Some(&b) = bytes.next() {
        if b == b'\\' {
            out.push(*bytes.next()?);
        } else {
            out.push(b);
        }
    }
    Some(Cow::Owned(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use AddrSource as S;
    use ForwardedHeader as H;
    use ForwardingWarning as W;
    use http::HeaderValue;
    use std::net::SocketAddr;

    const XFF: &str = "x-forwarded-for";
    const FWD: &str = "forwarded";

    fn trusted() -> TrustedProxies {
        TrustedProxies::parse(&["10.0.0.0/8", "2001:db8:ffff::/48", "192.0.2.1"]).unwrap()
    }

    fn peer(ip: &str) -> PeerAddr {
        PeerAddr(SocketAddr::new(ip.parse().unwrap(), 40000))
    }

    fn headers(lines: &[(&str, &[u8])]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in lines {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(value).unwrap(),
            );
        }
        map
    }

    type Case<'a> = (
        &'a str,
        Option<&'a str>,
        &'a [(&'a str, &'a [u8])],
        H,
        &'a str,
        S,
        Option<W>,
    );

    #[test]
    fn resolves_client() {
        // Trusted: 10.0.0.0/8, 2001:db8:ffff::/48, 192.0.2.1.
        #[rustfmt::skip]
        let cases: &[Case] = &[
            // (peer, PROXY source, header lines, believe, client, source, warning)
            // Untrusted peer: itself, headers counted but ignored.
            ("203.0.113.5", None, &[], H::XForwardedFor, "203.0.113.5", S::Peer, None),
            ("203.0.113.5", None, &[(XFF, b"198.51.100.7")], H::XForwardedFor, "203.0.113.5", S::Peer, Some(W::UntrustedPeer)),
            ("203.0.113.5", None, &[(FWD, b"for=198.51.100.7")], H::XForwardedFor, "203.0.113.5", S::Peer, Some(W::UntrustedPeer)),
            ("203.0.113.5", None, &[("x-real-ip", b"198.51.100.7")], H::Forwarded, "203.0.113.5", S::Peer, Some(W::UntrustedPeer)),
            ("203.0.113.5", Some("198.51.100.7"), &[], H::XForwardedFor, "203.0.113.5", S::Peer, Some(W::UntrustedPeer)),
            ("::ffff:203.0.113.5", None, &[], H::XForwardedFor, "203.0.113.5", S::Peer, None),
            ("2001:db8::9", None, &[(XFF, b"10.0.0.1")], H::XForwardedFor, "2001:db8::9", S::Peer, Some(W::UntrustedPeer)),
            // Trusted peer, X-Forwarded-For.
            ("10.0.0.1", None, &[(XFF, b"198.51.100.7")], H::XForwardedFor, "198.51.100.7", S::XForwardedFor, None),
            ("::ffff:10.0.0.1", None, &[(XFF, b"198.51.100.7")], H::XForwardedFor, "198.51.100.7", S::XForwardedFor, None),
            ("10.0.0.1", None, &[(XFF, b"198.51.100.7, 10.0.0.2")], H::XForwardedFor, "198.51.100.7", S::XForwardedFor, None),
            ("10.0.0.1", None, &[(XFF, b"6.6.6.6, 198.51.100.7")], H::XForwardedFor, "198.51.100.7", S::XForwardedFor, None),
            ("10.0.0.1", None, &[(XFF, b"6.6.6.6, 198.51.100.7, 10.0.0.2, 192.0.2.1")], H::XForwardedFor, "198.51.100.7", S::XForwardedFor, None),
            ("10.0.0.1", None, &[(XFF, b"10.0.0.3, 10.0.0.2")], H::XForwardedFor, "10.0.0.3", S::XForwardedFor, None),
            ("10.0.0.1", None, &[(XFF, b"6.6.6.6"), (XFF, b"198.51.100.7, 10.0.0.2")], H::XForwardedFor, "198.51.100.7", S::XForwardedFor, None),
            ("10.0.0.1", None, &[(XFF, b"198.51.100.7"), (XFF, b"10.0.0.2")], H::XForwardedFor, "198.51.100.7", S::XForwardedFor, None),
            ("10.0.0.1", None, &[(XFF, b"198.51.100.7:5678")], H::XForwardedFor, "198.51.100.7", S::XForwardedFor, None),
            ("10.0.0.1", None, &[(XFF, b"[2001:db8::1]:80")], H::XForwardedFor, "2001:db8::1", S::XForwardedFor, None),
            ("10.0.0.1", None, &[(XFF, b"[2001:db8::1]")], H::XForwardedFor, "2001:db8::1", S::XForwardedFor, None),
            ("10.0.0.1", None, &[(XFF, b"2001:db8::1")], H::XForwardedFor, "2001:db8::1", S::XForwardedFor, None),
            ("10.0.0.1", None, &[(XFF, b"::ffff:198.51.100.7")], H::XForwardedFor, "198.51.100.7", S::XForwardedFor, None),
            ("10.0.0.1", None, &[(XFF, b"::ffff:10.0.0.5, ::ffff:198.51.100.7")], H::XForwardedFor, "198.51.100.7", S::XForwardedFor, None),
            ("10.0.0.1", None, &[(XFF, b"6.6.6.6, ::ffff:10.0.0.5")], H::XForwardedFor, "6.6.6.6", S::XForwardedFor, None),
            ("10.0.0.1", None, &[(XFF, b"  198.51.100.7  ,\t10.0.0.2 ")], H::XForwardedFor, "198.51.100.7", S::XForwardedFor, None),
            ("10.0.0.1", None, &[(XFF, b"198.51.100.7,, ,10.0.0.2,")], H::XForwardedFor, "198.51.100.7", S::XForwardedFor, None),
            ("2001:db8:ffff::1", None, &[(XFF, b"2001:db8::5, 2001:db8:ffff::9")], H::XForwardedFor, "2001:db8::5", S::XForwardedFor, None),
            ("2001:db8:ffff::1", None, &[(XFF, b"6.6.6.6, 2001:db8::5")], H::XForwardedFor, "2001:db8::5", S::XForwardedFor, None),
            // X-Forwarded-For garbage: stop at the nearest valid hop to the right.
            ("10.0.0.1", None, &[(XFF, b"6.6.6.6, garbage, 10.0.0.2")], H::XForwardedFor, "10.0.0.2", S::XForwardedFor, Some(W::Malformed)),
            ("10.0.0.1", None, &[(XFF, b"198.51.100.7, garbage")], H::XForwardedFor, "10.0.0.1", S::Peer, Some(W::Malformed)),
            ("10.0.0.1", None, &[(XFF, b"unknown")], H::XForwardedFor, "10.0.0.1", S::Peer, Some(W::Malformed)),
            ("10.0.0.1", None, &[(XFF, b"198.51.100.7:99999")], H::XForwardedFor, "10.0.0.1", S::Peer, Some(W::Malformed)),
            ("10.0.0.1", None, &[(XFF, b"198.51.100.7:")], H::XForwardedFor, "10.0.0.1", S::Peer, Some(W::Malformed)),
            ("10.0.0.1", None, &[(XFF, b"198.51.100.7:_x")], H::XForwardedFor, "10.0.0.1", S::Peer, Some(W::Malformed)),
            ("10.0.0.1", None, &[(XFF, b"1.2.3.4.5")], H::XForwardedFor, "10.0.0.1", S::Peer, Some(W::Malformed)),
            ("10.0.0.1", None, &[(XFF, b"[2001:db8::1")], H::XForwardedFor, "10.0.0.1", S::Peer, Some(W::Malformed)),
            ("10.0.0.1", None, &[(XFF, b"[198.51.100.7]")], H::XForwardedFor, "10.0.0.1", S::Peer, Some(W::Malformed)),
            ("10.0.0.1", None, &[(XFF, b"\"198.51.100.7\"")], H::XForwardedFor, "10.0.0.1", S::Peer, Some(W::Malformed)),
            ("10.0.0.1", None, &[(XFF, b"198.51.100.7, \xff\xfe")], H::XForwardedFor, "10.0.0.1", S::Peer, Some(W::Malformed)),
            ("10.0.0.1", None, &[(XFF, b"\xff, 198.51.100.7")], H::XForwardedFor, "198.51.100.7", S::XForwardedFor, None),
            ("10.0.0.1", None, &[(XFF, b"10.0.0.9"), (XFF, b"garbage")], H::XForwardedFor, "10.0.0.1", S::Peer, Some(W::Malformed)),
            // Trusted peer without the configured header: the proxy is the client.
            ("10.0.0.1", None, &[], H::XForwardedFor, "10.0.0.1", S::Peer, Some(W::MissingFromTrustedPeer)),
            ("10.0.0.1", None, &[(XFF, b"")], H::XForwardedFor, "10.0.0.1", S::Peer, Some(W::MissingFromTrustedPeer)),
            ("10.0.0.1", None, &[(FWD, b"for=198.51.100.7")], H::XForwardedFor, "10.0.0.1", S::Peer, Some(W::MissingFromTrustedPeer)),
            ("10.0.0.1", None, &[(XFF, b"198.51.100.7")], H::Forwarded, "10.0.0.1", S::Peer, Some(W::MissingFromTrustedPeer)),
            ("10.0.0.1", None, &[("x-real-ip", b"198.51.100.7")], H::XForwardedFor, "10.0.0.1", S::Peer, Some(W::MissingFromTrustedPeer)),
            // PROXY protocol source, believed only from a trusted peer.
            ("10.0.0.1", Some("198.51.100.7"), &[], H::XForwardedFor, "198.51.100.7", S::ProxyProtocol, None),
            ("10.0.0.1", Some("198.51.100.7"), &[(XFF, b"6.6.6.6")], H::XForwardedFor, "198.51.100.7", S::ProxyProtocol, None),
            ("10.0.0.1", Some("::ffff:198.51.100.7"), &[], H::XForwardedFor, "198.51.100.7", S::ProxyProtocol, None),
            ("10.0.0.1", Some("2001:db8::5"), &[], H::Forwarded, "2001:db8::5", S::ProxyProtocol, None),
            ("10.0.0.1", Some("10.0.0.9"), &[(XFF, b"198.51.100.7")], H::XForwardedFor, "198.51.100.7", S::XForwardedFor, None),
            ("10.0.0.1", Some("10.0.0.9"), &[(XFF, b"6.6.6.6, 198.51.100.7, 192.0.2.1")], H::XForwardedFor, "198.51.100.7", S::XForwardedFor, None),
            ("10.0.0.1", Some("10.0.0.9"), &[], H::XForwardedFor, "10.0.0.9", S::ProxyProtocol, None),
            ("10.0.0.1", Some("10.0.0.9"), &[(XFF, b"garbage")], H::XForwardedFor, "10.0.0.9", S::ProxyProtocol, Some(W::Malformed)),
            ("10.0.0.1", Some("10.0.0.9"), &[(XFF, b"10.0.0.8")], H::XForwardedFor, "10.0.0.8", S::XForwardedFor, None),
            // Forwarded (RFC 7239).
            ("10.0.0.1", None, &[(FWD, b"for=198.51.100.7")], H::Forwarded, "198.51.100.7", S::Forwarded, None),
            ("10.0.0.1", None, &[(FWD, b"For=198.51.100.7")], H::Forwarded, "198.51.100.7", S::Forwarded, None),
            ("10.0.0.1", None, &[(FWD, b"FOR=198.51.100.7")], H::Forwarded, "198.51.100.7", S::Forwarded, None),
            ("10.0.0.1", None, &[(FWD, b"for=\"[2001:db8::1]:4711\"")], H::Forwarded, "2001:db8::1", S::Forwarded, None),
            ("10.0.0.1", None, &[(FWD, b"for=\"[2001:db8::1]\"")], H::Forwarded, "2001:db8::1", S::Forwarded, None),
            ("10.0.0.1", None, &[(FWD, b"for=[2001:db8::1]")], H::Forwarded, "2001:db8::1", S::Forwarded, None),
            ("10.0.0.1", None, &[(FWD, b"for=\"198.51.100.7:8080\"")], H::Forwarded, "198.51.100.7", S::Forwarded, None),
            ("10.0.0.1", None, &[(FWD, b"for=198.51.100.7:_abc")], H::Forwarded, "198.51.100.7", S::Forwarded, None),
            ("10.0.0.1", None, &[(FWD, b"for=\"[2001:db8::1]:_p-1\"")], H::Forwarded, "2001:db8::1", S::Forwarded, None),
            ("10.0.0.1", None, &[(FWD, b"for=198.51.100.7;proto=https;by=10.0.0.1")], H::Forwarded, "198.51.100.7", S::Forwarded, None),
            ("10.0.0.1", None, &[(FWD, b"proto=https;for=198.51.100.7")], H::Forwarded, "198.51.100.7", S::Forwarded, None),
            ("10.0.0.1", None, &[(FWD, b"for=198.51.100.7 ; proto=https")], H::Forwarded, "198.51.100.7", S::Forwarded, None),
            ("10.0.0.1", None, &[(FWD, b"for = 198.51.100.7")], H::Forwarded, "198.51.100.7", S::Forwarded, None),
            ("10.0.0.1", None, &[(FWD, b"for=198.51.100.7;")], H::Forwarded, "198.51.100.7", S::Forwarded, None),
            ("10.0.0.1", None, &[(FWD, b",for=198.51.100.7,,")], H::Forwarded, "198.51.100.7", S::Forwarded, None),
            ("10.0.0.1", None, &[(FWD, b"for=6.6.6.6, for=198.51.100.7")], H::Forwarded, "198.51.100.7", S::Forwarded, None),
            ("10.0.0.1", None, &[(FWD, b"for=198.51.100.7, for=10.0.0.2;by=10.0.0.1")], H::Forwarded, "198.51.100.7", S::Forwarded, None),
            ("10.0.0.1", None, &[(FWD, b"for=6.6.6.6"), (FWD, b"for=198.51.100.7")], H::Forwarded, "198.51.100.7", S::Forwarded, None),
            ("10.0.0.1", None, &[(FWD, b"for=10.0.0.3, for=10.0.0.2")], H::Forwarded, "10.0.0.3", S::Forwarded, None),
            ("10.0.0.1", None, &[(FWD, b"for=\"a,b\";x=1, for=198.51.100.7")], H::Forwarded, "198.51.100.7", S::Forwarded, None),
            ("10.0.0.1", None, &[(FWD, b"for=198.51.100.7"), (XFF, b"6.6.6.6")], H::Forwarded, "198.51.100.7", S::Forwarded, None),
            // Forwarded garbage and obfuscation.
            ("10.0.0.1", None, &[(FWD, b"for=_hidden, for=10.0.0.2")], H::Forwarded, "10.0.0.2", S::Forwarded, Some(W::Malformed)),
            ("10.0.0.1", None, &[(FWD, b"for=unknown")], H::Forwarded, "10.0.0.1", S::Peer, Some(W::Malformed)),
            ("10.0.0.1", None, &[(FWD, b"for=\"_gazonk\"")], H::Forwarded, "10.0.0.1", S::Peer, Some(W::Malformed)),
            ("10.0.0.1", None, &[(FWD, b"by=10.0.0.2;proto=http")], H::Forwarded, "10.0.0.1", S::Peer, Some(W::Malformed)),
            ("10.0.0.1", None, &[(FWD, b"for=\"198.51.100.7")], H::Forwarded, "10.0.0.1", S::Peer, Some(W::Malformed)),
            ("10.0.0.1", None, &[(FWD, b"for=198.51.100.7;for=6.6.6.6")], H::Forwarded, "10.0.0.1", S::Peer, Some(W::Malformed)),
            ("10.0.0.1", None, &[(FWD, b"for=\"[2001:db8::1\"")], H::Forwarded, "10.0.0.1", S::Peer, Some(W::Malformed)),
            ("10.0.0.1", None, &[(FWD, b"for=\"198.51.100.7, 10.0.0.2\"")], H::Forwarded, "10.0.0.1", S::Peer, Some(W::Malformed)),
            ("10.0.0.1", None, &[(FWD, b"for=\xff")], H::Forwarded, "10.0.0.1", S::Peer, Some(W::Malformed)),
            ("10.0.0.1", None, &[(FWD, b"for=\"\"")], H::Forwarded, "10.0.0.1", S::Peer, Some(W::Malformed)),
            ("10.0.0.1", None, &[(FWD, b"for=\"\\\"198.51.100.7\"")], H::Forwarded, "10.0.0.1", S::Peer, Some(W::Malformed)),
            ("10.0.0.1", None, &[(FWD, b"for=198.51.100.7:99999")], H::Forwarded, "10.0.0.1", S::Peer, Some(W::Malformed)),
            ("10.0.0.1", None, &[(FWD, b"for")], H::Forwarded, "10.0.0.1", S::Peer, Some(W::Malformed)),
            ("10.0.0.1", None, &[(FWD, b"for=198.51.100.7\"x\"")], H::Forwarded, "10.0.0.1", S::Peer, Some(W::Malformed)),
            ("10.0.0.1", Some("10.0.0.9"), &[(FWD, b"for=unknown")], H::Forwarded, "10.0.0.9", S::ProxyProtocol, Some(W::Malformed)),
        ];
        let trusted = trusted();
        for (i, &(p, pp, lines, mode, want_ip, want_source, want_warning)) in
            cases.iter().enumerate()
        {
            let pp = pp.map(|s| s.parse().unwrap());
            let got = resolve(peer(p), pp, &headers(lines), &trusted, mode);
            let label = format!("case {i}: peer {p} pp {pp:?} {lines:?} {mode:?}");
            assert_eq!(
                got.client.client.ip(),
                want_ip.parse::<IpAddr>().unwrap(),
                "{label}"
            );
            assert_eq!(got.client.source, want_source, "{label}");
            assert_eq!(got.warning, want_warning, "{label}");
            assert_eq!(got.client.peer, peer(p), "{label}");
        }
    }

    #[test]
    fn warning_labels_are_distinct_snake_case() {
        let all = [W::UntrustedPeer, W::Malformed, W::MissingFromTrustedPeer];
        for w in all {
            let s = w.as_str();
            assert!(
                s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{s}"
            );
        }
        assert_eq!(
            all.map(|w| w.as_str())
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len(),
            3
        );
        assert_eq!(H::Forwarded.header_name(), "forwarded");
        assert_eq!(H::XForwardedFor.header_name(), "x-forwarded-for");
    }

    /// Random bytes drawn from the characters the parsers care about: no
    /// input may panic, and the result must obey the walk's invariants.
    #[test]
    fn never_panics_on_noise() {
        const PIECES: &[&[u8]] = &[
            b"198.51.100.7",
            b"10.0.0.2",
            b"6.6.6.6",
            b"[2001:db8::1]",
            b"2001:db8:ffff::3",
            b"::ffff:10.0.0.4",
            b":80",
            b":_p",
            b"for=",
            b"For=",
            b"by=",
            b"proto=https",
            b"\"",
            b"\\",
            b",",
            b", ",
            b";",
            b"=",
            b" ",
            b"\t",
            b"[",
            b"]",
            b":",
            b"_x",
            b"unknown",
            b"garbage",
            b"\xff",
            b"\x80",
            b"99999",
            b"1.2.3",
        ];
        let mut state: u64 = 0x243F_6A88_85A3_08D3;
        let mut next = move || {
            // xorshift64: deterministic, so a failure reproduces.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let trusted = trusted();
        let mut from_header = 0;
        for _ in 0..20_000 {
            let pieces = (next() % 12) as usize;
            let value: Vec<u8> = (0..pieces)
                .flat_map(|_| {
                    PIECES[(next() % PIECES.len() as u64) as usize]
                        .iter()
                        .copied()
                })
                .collect();
            for (name, mode) in [(XFF, H::XForwardedFor), (FWD, H::Forwarded)] {
                let map = headers(&[(name, &value)]);
                let got = resolve(peer("10.0.0.1"), None, &map, &trusted, mode);
                let ip = got.client.client.ip();
                assert_ne!(got.warning, Some(W::UntrustedPeer), "{value:?}");
                match got.client.source {
                    S::Peer => assert_eq!(ip.to_string(), "10.0.0.1", "{value:?}"),
                    S::XForwardedFor | S::Forwarded => {
                        from_header += 1;
                        // An untrusted winner ends the walk cleanly.
                        if !trusted.contains(ip) {
                            assert_eq!(got.warning, None, "{value:?}");
                        }
                    }
                    S::ProxyProtocol => panic!("no PROXY source was given: {value:?}"),
                }
            }
        }
        assert!(
            from_header > 100,
            "noise should sometimes parse: {from_header}"
        );
    }
}
