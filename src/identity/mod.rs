//! Identity: who is the client of this request.
//!
//! Produces a [`ClientId`] from the direct TCP peer ([`PeerAddr`]), an optional
//! PROXY protocol source, and the forwarding headers. Forwarding information is
//! believed **only when the hop that supplied it is a trusted proxy**: a limiter
//! keyed by a spoofable header, or by the load balancer's own address, is how
//! incident 4 refused 97% of the world.
//!
//! This module does not decide anything about the request; it only names the
//! client. Sessions (verified users, pass tokens) are added by later stages.

mod addr;
pub mod dominance;
pub mod forwarded;
pub mod trusted;

pub use addr::{AddrSource, ClientAddr, ClientId, Level, PeerAddr, PrefixKey};
pub use dominance::{DominantPeer, DominantPeerDetector};
pub use forwarded::{ForwardedHeader, ForwardingWarning, Resolved, resolve};
pub use trusted::{TrustedProxies, TrustedProxyError};
