//! Identity: who is the client of this request.
//!
//! Produces a [`ClientId`] from the direct TCP peer ([`PeerAddr`]), an optional
//! PROXY protocol source, and the forwarding headers. Forwarding information is
//! believed **only when the hop that supplied it is a trusted proxy**: a limiter
//! keyed by a spoofable header, or by the load balancer's own address, is how
//! incident 4 refused 97% of the world.
//!
//! ```
//! use weir::identity::{AddrSource, ForwardedHeader, PeerAddr, TrustedProxies, resolve};
//!
//! let trusted = TrustedProxies::parse(&["10.0.0.0/8"]).unwrap();
//! let mut headers = http::HeaderMap::new();
//! // 6.6.6.6 was written by the client itself; 198.51.100.7 by our balancer.
//! headers.insert("x-forwarded-for", "6.6.6.6, 198.51.100.7".parse().unwrap());
//! let peer = PeerAddr("10.0.0.1:40000".parse().unwrap());
//!
//! let got = resolve(peer, None, &headers, &trusted, ForwardedHeader::XForwardedFor);
//! assert_eq!(got.client.client.ip().to_string(), "198.51.100.7");
//! assert_eq!(got.client.source, AddrSource::XForwardedFor);
//! assert_eq!(got.warning, None);
//! ```
//!
//! This module does not decide anything about the request; it only names the
//! client. Sessions (verified users, pass tokens) are added by later stages.

mod addr;
pub mod bots;
pub mod dominance;
pub mod forwarded;
pub mod session;
pub mod trusted;

pub use addr::{
    AddrSource, ClientAddr, ClientId, Level, PeerAddr, PrefixKey, per_address_key, v4_text,
    write_ip, write_socket_addr,
};
pub use dominance::{DominantPeer, DominantPeerDetector};
pub use forwarded::{ForwardedHeader, ForwardingWarning, Resolved, resolve};
pub use trusted::{TrustedProxies, TrustedProxyError};
