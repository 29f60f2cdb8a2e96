//! The trusted-proxy CIDR list. (stub: being written)
use std::net::IpAddr;

/// The set of networks whose forwarding information weir believes.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies {
    nets: Vec<ipnet::IpNet>,
}

impl TrustedProxies {
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = super::addr::normalize(ip);
        self.nets.iter().any(|n| n.contains(&ip))
    }
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }
}
