//! The request id: one value per request that the access log, the app (as
//! `X-Request-Id`) and the client (the same header on the answer) all see,
//! so a line in weir's log, the app's log and a user's bug report can be
//! matched.
//!
//! A trusted proxy's id (a request whose client came from a trusted peer's
//! forwarding information) is kept, so one id follows a request through the
//! load balancer, weir and the app. Anyone else's is replaced: an id a
//! client chose could point an operator at someone else's line.

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

use crate::identity::{AddrSource, ClientId};

/// The header carrying the id, both ways.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The longest id kept from a trusted proxy.
const MAX_LEN: usize = 128;

/// One request's id, shared by the log record, the forwarded request and
/// the answer (a clone is a reference count).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(HeaderValue);

impl RequestId {
    /// The id for a request from `client` with `headers`: the trusted
    /// proxy's when it sent a usable one, else a new one.
    pub fn of(headers: &HeaderMap, client: &ClientId) -> RequestId {
        let trusted = client.source != AddrSource::Peer;
        match headers.get(&X_REQUEST_ID) {
            Some(v) if trusted && usable(v.as_bytes()) => RequestId(v.clone()),
            _ => RequestId::new(),
        }
    }

    /// A new id: 128 random bits as 32 lowercase hex digits (no two weir
    /// processes will meet the same one).
    pub fn new() -> RequestId {
        let n: u128 = rand::random();
        let mut text = [0u8; 32];
        for (i, b) in text.iter_mut().enumerate() {
            let nibble = (n >> (124 - 4 * i)) as u8 & 0xf;
            *b = b"0123456789abcdef"[nibble as usize];
        }
        // Hex digits are a valid field value.
        RequestId(HeaderValue::from_bytes(&text).unwrap_or(HeaderValue::from_static("0")))
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII ever gets in (`usable`, or hex).
        self.0.to_str().unwrap_or("")
    }

    pub fn header_value(&self) -> &HeaderValue {
        &self.0
    }
}

impl Default for RequestId {
    fn default() -> Self {
        RequestId::new()
    }
}

/// An id worth keeping: 1 to 128 characters, letters, digits and
/// `-_.:/+=` (UUIDs, hex, base64, W3C trace ids, AWS's `Root=1-...`).
fn usable(v: &[u8]) -> bool {
    (1..=MAX_LEN).contains(&v.len())
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/+=".contains(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{ClientAddr, PeerAddr};
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};

    fn client(source: AddrSource) -> ClientId {
        let ip = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
        ClientId {
            peer: PeerAddr(SocketAddr::new(ip, 1)),
            client: ClientAddr::new(ip),
            source,
        }
    }

    fn with(id: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(&X_REQUEST_ID, HeaderValue::from_str(id).unwrap());
        h
    }

    #[test]
    fn a_trusted_proxys_id_is_kept_anyone_elses_replaced() {
        let lb = "Root=1-67891233-abcdef012345678912345678";
        let kept = RequestId::of(&with(lb), &client(AddrSource::XForwardedFor));
        assert_eq!(kept.as_str(), lb);
        let replaced = RequestId::of(&with(lb), &client(AddrSource::Peer));
        assert_ne!(replaced.as_str(), lb);
        assert_eq!(replaced.as_str().len(), 32);
        for bad in ["", "a b", "<script>", &"x".repeat(129)] {
            let mut h = HeaderMap::new();
            h.insert(&X_REQUEST_ID, HeaderValue::from_str(bad).unwrap());
            let id = RequestId::of(&h, &client(AddrSource::ProxyProtocol));
            assert_ne!(id.as_str(), bad, "{bad:?} kept");
        }
    }

    #[test]
    fn new_ids_are_hex_and_differ() {
        let a = RequestId::new();
        let b = RequestId::new();
        assert_ne!(a, b);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()), "{a:?}");
        assert_eq!(a.as_str().len(), 32);
    }
}
