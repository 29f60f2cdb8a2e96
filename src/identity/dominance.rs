//! Dominant peer detection (temporary stub until the identity branch lands).
use std::net::IpAddr;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DominantPeer {
    pub peer: IpAddr,
    pub share: f64,
    pub requests: u64,
}

#[derive(Debug)]
pub struct DominantPeerDetector;

impl DominantPeerDetector {
    pub fn new(_window: Duration, _share: f64, _min_requests: u64) -> Self {
        DominantPeerDetector
    }
    pub fn observe(&self, _peer: IpAddr, _now: Instant) -> Option<DominantPeer> {
        None
    }
}
