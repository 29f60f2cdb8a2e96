//! Requests in flight per client address (`limits.max_requests_in_flight_per_ip`).
//!
//! Keyed by the resolved [`ClientAddr`], never the peer: behind a load
//! balancer the peer is the balancer. Sharded so concurrent requests rarely
//! contend; entries are removed when they reach zero, so memory follows the
//! number of active clients.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use crate::identity::ClientAddr;

const SHARDS: usize = 32;

/// In-flight request counts per client address.
#[derive(Debug)]
pub struct ClientInFlight {
    shards: Vec<Mutex<HashMap<IpAddr, u32>>>,
}

impl Default for ClientInFlight {
    fn default() -> Self {
        ClientInFlight {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }
}

/// One counted request; dropping it releases the count.
#[derive(Debug)]
pub struct InFlightGuard {
    table: Arc<ClientInFlight>,
    ip: IpAddr,
}

impl ClientInFlight {
    fn shard(&self, ip: &IpAddr) -> &Mutex<HashMap<IpAddr, u32>> {
        let h = match ip {
            IpAddr::V4(v4) => u32::from(*v4) as usize,
            IpAddr::V6(v6) => (u128::from(*v6) as usize) ^ ((u128::from(*v6) >> 64) as usize),
        };
        &self.shards[h.wrapping_mul(0x9E37_79B9) % SHARDS]
    }

    /// Counts a request from `client` (an IPv6 one under its first
    /// `ipv6_prefix` bits) unless it already has `max` in flight.
    pub fn acquire(
        self: &Arc<Self>,
        client: ClientAddr,
        max: usize,
        ipv6_prefix: u8,
    ) -> Option<InFlightGuard> {
        let ip = crate::identity::per_address_key(client.ip(), ipv6_prefix);
        let mut map = self.shard(&ip).lock().unwrap_or_else(|e| e.into_inner());
        let n = map.entry(ip).or_insert(0);
        if *n as usize >= max {
            return None;
        }
        *n += 1;
        Some(InFlightGuard {
            table: self.clone(),
            ip,
        })
    }

    /// Requests in flight from `client`.
    pub fn get(&self, client: ClientAddr) -> u32 {
        let ip = client.ip();
        let map = self.shard(&ip).lock().unwrap_or_else(|e| e.into_inner());
        map.get(&ip).copied().unwrap_or(0)
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let mut map = self
            .table
            .shard(&self.ip)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_per_client_and_release() {
        let t = Arc::new(ClientInFlight::default());
        let a = ClientAddr::new("127.0.0.2".parse().unwrap());
        let b = ClientAddr::new("127.0.0.3".parse().unwrap());
        let g1 = t.acquire(a, 2, 64).unwrap();
        let _g2 = t.acquire(a, 2, 64).unwrap();
        assert!(t.acquire(a, 2, 64).is_none());
        assert!(t.acquire(b, 2, 64).is_some());
        drop(g1);
        assert_eq!(t.get(a), 1);
        assert!(t.acquire(a, 2, 64).is_some());
    }

    #[test]
    fn ipv6_clients_share_their_prefix() {
        let t = Arc::new(ClientInFlight::default());
        let a = ClientAddr::new("2001:db8:0:1::a".parse().unwrap());
        let b = ClientAddr::new("2001:db8:0:1::b".parse().unwrap());
        let _g = t.acquire(a, 1, 64).unwrap();
        assert!(t.acquire(b, 1, 64).is_none(), "one /64, one count");
        assert!(t.acquire(b, 1, 128).is_some(), "per address at 128");
    }
}
