//! Forwarding headers (temporary stub until the identity branch lands).
use std::net::IpAddr;

use super::{AddrSource, ClientAddr, ClientId, PeerAddr, TrustedProxies};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardedHeader {
    XForwardedFor,
    Forwarded,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardingWarning {
    UntrustedPeer,
    Malformed,
}

impl ForwardingWarning {
    pub fn as_str(&self) -> &'static str {
        match self {
            ForwardingWarning::UntrustedPeer => "untrusted_peer",
            ForwardingWarning::Malformed => "malformed",
        }
    }
}

pub struct Resolved {
    pub client: ClientId,
    pub warning: Option<ForwardingWarning>,
}

pub fn resolve(
    peer: PeerAddr,
    proxy_source: Option<IpAddr>,
    _headers: &http::HeaderMap,
    trusted: &TrustedProxies,
    _header: ForwardedHeader,
) -> Resolved {
    let (ip, source) = match proxy_source {
        Some(ip) if trusted.contains(peer.ip()) => (ip, AddrSource::ProxyProtocol),
        _ => (peer.ip(), AddrSource::Peer),
    };
    Resolved {
        client: ClientId {
            peer,
            client: ClientAddr::new(ip),
            source,
        },
        warning: None,
    }
}
