//! A pool of upstream servers and the balancing among them.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use http::uri::Authority;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::body::RequestBody;
use crate::config::{Balance, PoolConfig};

/// One server of a pool.
#[derive(Debug)]
pub struct Server {
    pub addr: SocketAddr,
    pub authority: Authority,
    in_flight: AtomicU32,
}

impl Server {
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }
}

/// Holds one in-flight slot on a server; dropping it releases the slot.
#[derive(Debug)]
pub struct ServerGuard {
    pub server: Arc<Server>,
}

impl Drop for ServerGuard {
    fn drop(&mut self) {
        self.server.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The hyper client type weir uses towards upstreams.
pub type UpstreamClient = Client<HttpConnector, RequestBody>;

/// An upstream pool: its servers, balancing state and connection pool.
pub struct Pool {
    pub name: Arc<str>,
    pub servers: Vec<Arc<Server>>,
    pub balance: Balance,
    pub connect_timeout: Duration,
    pub response_timeout: Duration,
    pub client: UpstreamClient,
    /// The definition this pool was built from: a reload that leaves it
    /// unchanged keeps this pool (and its warm connections).
    pub definition: PoolConfig,
    next: AtomicUsize,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("name", &self.name)
            .field("servers", &self.servers)
            .finish()
    }
}

/// Why a pool definition could not be built.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("server `{0}` is not host:port")]
    BadServer(String),
    #[error("server `{0}` does not resolve: {1}")]
    Unresolvable(String, String),
    #[error("a pool needs at least one server")]
    Empty,
}

impl Pool {
    /// Builds a pool; server names are resolved now, once.
    pub fn build(name: &str, def: &PoolConfig) -> Result<Pool, Vec<(usize, PoolError)>> {
        let mut errors = Vec::new();
        let mut servers = Vec::new();
        if def.servers.is_empty() {
            errors.push((0, PoolError::Empty));
        }
        for (i, s) in def.servers.iter().enumerate() {
            match resolve(s) {
                Ok(addr) => match Authority::try_from(addr.to_string()) {
                    Ok(authority) => servers.push(Arc::new(Server {
                        addr,
                        authority,
                        in_flight: AtomicU32::new(0),
                    })),
                    Err(_) => errors.push((i, PoolError::BadServer(s.clone()))),
                },
                Err(e) => errors.push((i, e)),
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(def.connect_timeout.0));
        connector.set_nodelay(true);
        connector.enforce_http(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(def.idle_timeout.0)
            .pool_max_idle_per_host(def.max_idle_per_server)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            // weir forwards the client's `Host`; it must not be rewritten.
            .set_host(false)
            .build(connector);
        Ok(Pool {
            name: Arc::from(name),
            servers,
            balance: def.balance,
            connect_timeout: def.connect_timeout.0,
            response_timeout: def.response_timeout.0,
            client,
            definition: def.clone(),
            next: AtomicUsize::new(0),
        })
    }

    /// Picks a server, skipping `exclude` (a server that just failed to connect).
    pub fn pick(&self, exclude: Option<&Arc<Server>>) -> Option<ServerGuard> {
        let n = self.servers.len();
        if n == 0 {
            return None;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let candidates = (0..n)
            .map(|i| &self.servers[(start + i) % n])
            .filter(|s| exclude.is_none_or(|e| !Arc::ptr_eq(e, s)));
        let chosen = match self.balance {
            Balance::RoundRobin => candidates.into_iter().next(),
            // Ties go to the round-robin order, so an idle pool still spreads.
            Balance::LeastInFlight => candidates.min_by_key(|s| s.in_flight()),
        }?;
        chosen.in_flight.fetch_add(1, Ordering::Relaxed);
        Some(ServerGuard {
            server: chosen.clone(),
        })
    }

    /// Requests in flight to all servers of this pool.
    pub fn in_flight(&self) -> u32 {
        self.servers.iter().map(|s| s.in_flight()).sum()
    }
}

fn resolve(s: &str) -> Result<SocketAddr, PoolError> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if !s.contains(':') {
        return Err(PoolError::BadServer(s.to_string()));
    }
    s.to_socket_addrs()
        .map_err(|e| PoolError::Unresolvable(s.to_string(), e.to_string()))?
        .next()
        .ok_or_else(|| PoolError::Unresolvable(s.to_string(), "no addresses".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigDuration;

    fn def(servers: &[&str], balance: Balance) -> PoolConfig {
        PoolConfig {
            servers: servers.iter().map(|s| s.to_string()).collect(),
            balance,
            connect_timeout: ConfigDuration::secs(1),
            response_timeout: ConfigDuration::secs(1),
            idle_timeout: ConfigDuration::secs(1),
            max_idle_per_server: 1,
        }
    }

    #[tokio::test]
    async fn least_in_flight_prefers_idle_server() {
        let pool = Pool::build(
            "p",
            &def(&["127.0.0.1:1", "127.0.0.1:2"], Balance::LeastInFlight),
        )
        .unwrap();
        let a = pool.pick(None).unwrap();
        let b = pool.pick(None).unwrap();
        assert_ne!(
            a.server.addr, b.server.addr,
            "second pick goes to the idle server"
        );
        let held = pool.pick(None).unwrap();
        drop(a);
        let next = pool.pick(None).unwrap();
        assert_ne!(next.server.addr, held.server.addr);
        assert_eq!(pool.in_flight(), 3);
    }

    #[tokio::test]
    async fn round_robin_and_exclusion() {
        let pool = Pool::build(
            "p",
            &def(
                &["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"],
                Balance::RoundRobin,
            ),
        )
        .unwrap();
        let picks: Vec<u16> = (0..6)
            .map(|_| pool.pick(None).unwrap().server.addr.port())
            .collect();
        assert_eq!(picks, vec![1, 2, 3, 1, 2, 3]);
        let bad = pool.servers[0].clone();
        for _ in 0..5 {
            assert_ne!(pool.pick(Some(&bad)).unwrap().server.addr.port(), 1);
        }
    }

    #[test]
    fn bad_servers_are_named() {
        let errs = Pool::build(
            "p",
            &def(&["127.0.0.1:80", "nonsense", "x:y:z"], Balance::RoundRobin),
        )
        .unwrap_err();
        assert_eq!(errs.len(), 2);
        assert_eq!(errs[0].0, 1);
        assert!(errs[0].1.to_string().contains("nonsense"));
    }
}
