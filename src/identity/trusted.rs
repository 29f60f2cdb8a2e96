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

impl TrustedProxies {
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, String> {
        let mut nets = Vec::new();
        for e in entries {
            let e = e.as_ref().trim();
            let net = e
                .parse::<ipnet::IpNet>()
                .or_else(|_| e.parse::<IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| format!("`{e}` is not a CIDR"))?;
            nets.push(net);
        }
        Ok(TrustedProxies { nets })
    }
}
