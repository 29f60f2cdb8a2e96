//! Connection accounting: the global and per-address caps, the registry of
//! open connections, and the sweeps that enforce header and idle timeouts.
//!
//! Each accepted connection holds a [`ConnGuard`]; dropping it releases the
//! global and per-address slots. Timeouts are enforced by one periodic sweep
//! over the registry instead of a timer per connection: hyper's own header
//! timeout covers only the first request, and the sweep also tells idle
//! connections (cheap to close) from busy ones (never cut) when the global cap
//! is reached.

use crate::identity::per_address_key;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use weir_http::conn::{Command, ConnClock, ConnState, RELEASE_AFTER};

use crate::observe::Metrics;

/// Why a connection was refused at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// All `limits.max_connections` slots are busy and none was idle.
    GlobalCap,
    /// This client address already holds `limits.max_connections_per_ip`.
    PerIpCap,
}

impl Refusal {
    pub fn as_str(&self) -> &'static str {
        match self {
            Refusal::GlobalCap => "global_cap",
            Refusal::PerIpCap => "per_ip_cap",
        }
    }
}

#[derive(Debug, Default)]
struct Registry {
    conns: HashMap<u64, Arc<ConnState>>,
    per_ip: HashMap<IpAddr, u32>,
}

/// Caps and timeouts the tracker enforces; replaced on reload.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub max_connections: usize,
    pub max_per_ip: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    /// Longest a write to the client may stall (`limits.send_timeout`).
    pub send_timeout: Duration,
    /// IPv6 addresses are counted per this prefix (`limits.ipv6_prefix_len`).
    pub ipv6_prefix: u8,
}

/// The registry of open client connections.
#[derive(Debug)]
pub struct ConnTracker {
    limits: Mutex<ConnLimits>,
    /// Most connections the process can hold (open-file limit); the
    /// configured cap is lowered to this.
    ceiling: AtomicUsize,
    open: AtomicUsize,
    next_id: AtomicU64,
    draining: AtomicBool,
    registry: Mutex<Registry>,
    clock: Arc<ConnClock>,
    metrics: Arc<Metrics>,
}

/// One open connection's slots; dropping it releases them.
#[derive(Debug)]
pub struct ConnGuard {
    pub state: Arc<ConnState>,
    ip: Option<IpAddr>,
    tracker: Arc<ConnTracker>,
}

impl ConnGuard {
    /// Counts this connection against `ip`'s cap, for an address learned after
    /// accept (PROXY protocol).
    pub fn count_ip(&mut self, ip: IpAddr) -> Result<(), Refusal> {
        if self.ip.is_some() {
            return Ok(());
        }
        let limits = self.tracker.limits();
        let (max, ip) = (limits.max_per_ip, per_address_key(ip, limits.ipv6_prefix));
        let mut reg = self.tracker.registry();
        let n = reg.per_ip.entry(ip).or_insert(0);
        if *n as usize >= max {
            return Err(Refusal::PerIpCap);
        }
        *n += 1;
        self.ip = Some(ip);
        Ok(())
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        let mut reg = self.tracker.registry();
        reg.conns.remove(&self.state.id);
        if let Some(ip) = self.ip
            && let Some(n) = reg.per_ip.get_mut(&ip)
        {
            *n -= 1;
            if *n == 0 {
                reg.per_ip.remove(&ip);
            }
        }
        drop(reg);
        self.tracker.open.fetch_sub(1, Ordering::Relaxed);
        self.tracker.metrics.connections_open.dec();
    }
}

impl ConnTracker {
    pub fn new(limits: ConnLimits, metrics: Arc<Metrics>) -> Arc<ConnTracker> {
        Arc::new(ConnTracker {
            limits: Mutex::new(limits),
            ceiling: AtomicUsize::new(usize::MAX),
            open: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            draining: AtomicBool::new(false),
            registry: Mutex::new(Registry::default()),
            clock: ConnClock::new(),
            metrics,
        })
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        // A panic while holding this lock cannot leave the maps inconsistent
        // in a way that matters more than refusing every connection would.
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The limits in force (the configured cap lowered to the ceiling).
    pub fn limits(&self) -> ConnLimits {
        let mut l = *self.limits.lock().unwrap_or_else(|e| e.into_inner());
        l.max_connections = l.max_connections.min(self.ceiling.load(Ordering::Relaxed));
        l
    }

    /// Sets the most connections the process can hold, and warns when the
    /// configured cap is above it.
    pub fn set_ceiling(&self, ceiling: usize) {
        self.ceiling.store(ceiling, Ordering::Relaxed);
        let configured = self
            .limits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .max_connections;
        if configured > ceiling {
            tracing::warn!(
                configured,
                ceiling,
                "limits.max_connections is above what the open-file limit allows; using the lower value"
            );
        }
    }

    pub fn set_limits(&self, limits: ConnLimits) {
        *self.limits.lock().unwrap_or_else(|e| e.into_inner()) = limits;
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Admits a new connection. `cap_ip` is the address counted against the
    /// per-address cap: the peer when it is a client, `None` when the peer is
    /// a trusted proxy (its clients are counted after PROXY protocol, and by
    /// request-level limits).
    pub fn try_open(self: &Arc<Self>, cap_ip: Option<IpAddr>) -> Result<ConnGuard, Refusal> {
        let limits = self.limits();
        if self.open.load(Ordering::Relaxed) >= limits.max_connections && self.shed_idle(1) == 0 {
            return Err(Refusal::GlobalCap);
        }
        let cap_ip = cap_ip.map(|ip| per_address_key(ip, limits.ipv6_prefix));
        let mut reg = self.registry();
        if let Some(ip) = cap_ip {
            let n = reg.per_ip.entry(ip).or_insert(0);
            if *n as usize >= limits.max_per_ip {
                return Err(Refusal::PerIpCap);
            }
            *n += 1;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(ConnState::new(id, self.clock.clone()));
        reg.conns.insert(state.id, state.clone());
        drop(reg);
        // Accepted while a drain began (the accept loop is stopping, or a new
        // process now accepts on the same socket): serve the request the
        // client already sent, then close.
        if self.draining.load(Ordering::Relaxed) {
            state.give(Command::Graceful, "drain");
        }
        self.open.fetch_add(1, Ordering::Relaxed);
        self.metrics.connections_open.inc();
        Ok(ConnGuard {
            state,
            ip: cap_ip,
            tracker: self.clone(),
        })
    }

    /// Asks up to `n` idle connections (longest idle first) to close.
    /// Returns how many were asked.
    pub fn shed_idle(&self, n: usize) -> usize {
        let reg = self.registry();
        let mut idle: Vec<&Arc<ConnState>> = reg
            .conns
            .values()
            // Only kept-alive connections between requests: a fresh one is
            // about to send its first request (and the header timeout bounds it).
            .filter(|c| c.in_flight() == 0 && c.requests() > 0 && c.command() == Command::None)
            .collect();
        if idle.is_empty() {
            return 0;
        }
        let n = n.min(idle.len());
        idle.select_nth_unstable_by_key(n - 1, |c| c.idle_since_ms());
        let mut asked = 0;
        for c in &idle[..n] {
            if c.give(Command::Graceful, "shed_idle") {
                asked += 1;
            }
        }
        asked
    }

    /// Enforces header, idle and send timeouts; run about once a second.
    pub fn sweep(&self, now: Instant) {
        let limits = self.limits();
        let now = self.clock.ms_at(now);
        let header_ms = limits.header_timeout.as_millis() as u64;
        let idle_ms = limits.idle_timeout.as_millis() as u64;
        let send_ms = limits.send_timeout.as_millis() as u64;
        let reg = self.registry();
        for c in reg.conns.values() {
            // A client that stopped reading its response: closed (whatever
            // else the connection is doing), so the request's admission slot
            // and upstream connection are freed, as nginx's `send_timeout`.
            let stalled = c.write_stalled_since_ms();
            if stalled != 0
                && now.saturating_sub(stalled) > send_ms
                && c.command() != Command::Abort
            {
                c.give(Command::Abort, "send_timeout");
                continue;
            }
            if c.in_flight() > 0 || c.command() != Command::None {
                continue;
            }
            let pending = c.pending_since_ms();
            let never_requested = c.requests() == 0;
            let head_stalled = if never_requested {
                now.saturating_sub(c.opened_ms()) > header_ms
            } else {
                pending != 0 && now.saturating_sub(pending) > header_ms
            };
            let idle = now.saturating_sub(c.idle_since_ms());
            if head_stalled {
                c.give(Command::Abort, "header_timeout");
            } else if !never_requested && idle > idle_ms {
                c.give(Command::Graceful, "idle_timeout");
            } else if !never_requested && idle >= RELEASE_AFTER.as_millis() as u64 {
                c.ask_release();
            }
        }
    }

    /// Stops admitting and asks every connection to finish and close.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
        let reg = self.registry();
        for c in reg.conns.values() {
            c.give(Command::Graceful, "drain");
        }
    }

    /// The id the next connection will get: every connection open now has
    /// a lower one (see [`ConnTracker::opened_before`]).
    pub fn next_id(&self) -> u64 {
        self.next_id.load(Ordering::Relaxed)
    }

    /// Connections still open among those opened before `id`.
    pub fn opened_before(&self, id: u64) -> usize {
        self.registry().conns.keys().filter(|&&c| c < id).count()
    }

    /// How long the oldest request in flight has run (per connection, the
    /// oldest of its overlapping requests), if any is.
    pub fn oldest_request(&self) -> Option<std::time::Duration> {
        self.registry()
            .conns
            .values()
            .filter_map(|c| c.busy_for())
            .max()
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Closes every connection now (second signal, or drain deadline).
    pub fn abort_all(&self) {
        let reg = self.registry();
        for c in reg.conns.values() {
            c.give(Command::Abort, "drain_deadline");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracker(max: usize, per_ip: usize) -> Arc<ConnTracker> {
        ConnTracker::new(
            ConnLimits {
                max_connections: max,
                max_per_ip: per_ip,
                header_timeout: Duration::from_secs(10),
                idle_timeout: Duration::from_secs(60),
                send_timeout: Duration::from_secs(30),
                ipv6_prefix: 64,
            },
            Arc::new(Metrics::new()),
        )
    }

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn per_ip_cap_leaves_neighbours_alone() {
        let t = tracker(100, 2);
        let a1 = t.try_open(ip("127.0.0.2")).unwrap();
        let _a2 = t.try_open(ip("127.0.0.2")).unwrap();
        assert_eq!(t.try_open(ip("127.0.0.2")).unwrap_err(), Refusal::PerIpCap);
        let _b = t.try_open(ip("127.0.0.3")).unwrap();
        drop(a1);
        let _a3 = t.try_open(ip("127.0.0.2")).unwrap();
        assert_eq!(t.open(), 3);
    }

    #[test]
    fn ipv6_clients_are_capped_per_64_unless_told_otherwise() {
        let t = tracker(100, 2);
        // Two addresses of one /64 (one site), then a third: refused.
        let _a = t.try_open(ip("2001:db8:1:2::1")).unwrap();
        let _b = t.try_open(ip("2001:db8:1:2:ffff::9")).unwrap();
        assert_eq!(
            t.try_open(ip("2001:db8:1:2::3")).unwrap_err(),
            Refusal::PerIpCap
        );
        // The next /64 is someone else; IPv4 is per address as before.
        let _c = t.try_open(ip("2001:db8:1:3::1")).unwrap();
        let _d = t.try_open(ip("::ffff:127.0.0.9")).unwrap();
        let _e = t.try_open(ip("127.0.0.9")).unwrap();
        assert_eq!(t.try_open(ip("127.0.0.9")).unwrap_err(), Refusal::PerIpCap);
        // With 128, single addresses again.
        let mut limits = t.limits();
        limits.ipv6_prefix = 128;
        t.set_limits(limits);
        let _f = t.try_open(ip("2001:db8:1:2::3")).unwrap();
    }

    #[test]
    fn global_cap_sheds_idle_before_refusing() {
        let t = tracker(2, 10);
        let busy = t.try_open(ip("127.0.0.2")).unwrap();
        busy.state.request_started(false);
        let idle = t.try_open(ip("127.0.0.3")).unwrap();
        idle.state.request_started(false);
        idle.state.request_finished();
        // At the cap: the idle connection is asked to close, the new one admitted.
        let third = t.try_open(ip("127.0.0.4")).unwrap();
        assert_eq!(idle.state.command(), Command::Graceful);
        assert_eq!(idle.state.close_reason(), Some("shed_idle"));
        assert_eq!(busy.state.command(), Command::None);
        // Nothing idle left (the idle one is already closing): refuse.
        third.state.request_started(false);
        assert_eq!(t.try_open(ip("127.0.0.5")).unwrap_err(), Refusal::GlobalCap);
    }

    #[test]
    fn sweep_times_out_slow_headers_and_idle() {
        let t = tracker(10, 10);
        let start = Instant::now();
        let silent = t.try_open(ip("127.0.0.2")).unwrap();
        let kept = t.try_open(ip("127.0.0.3")).unwrap();
        kept.state.request_started(false);
        kept.state.request_finished();
        let busy = t.try_open(ip("127.0.0.4")).unwrap();
        busy.state.request_started(false);
        t.sweep(start + Duration::from_secs(5));
        assert_eq!(silent.state.command(), Command::None);
        t.sweep(start + Duration::from_secs(11));
        assert_eq!(silent.state.command(), Command::Abort);
        assert_eq!(kept.state.command(), Command::None);
        // Bytes of a next request that never completes: header timeout.
        kept.state.bytes_read();
        t.sweep(start + Duration::from_secs(30));
        assert_eq!(kept.state.command(), Command::Abort);
        assert_eq!(
            busy.state.command(),
            Command::None,
            "busy connections are never cut"
        );
        t.sweep(start + Duration::from_secs(120));
        assert_eq!(busy.state.command(), Command::None);
    }

    #[test]
    fn idle_keepalive_closes_gracefully() {
        let t = tracker(10, 10);
        let start = Instant::now();
        let c = t.try_open(ip("127.0.0.2")).unwrap();
        c.state.request_started(false);
        c.state.request_finished();
        t.sweep(start + Duration::from_secs(61));
        assert_eq!(c.state.command(), Command::Graceful);
        assert_eq!(c.state.close_reason(), Some("idle_timeout"));
    }

    #[test]
    fn draining_closes_after_the_request_in_hand() {
        let t = tracker(10, 10);
        let c = t.try_open(ip("127.0.0.2")).unwrap();
        t.drain();
        assert_eq!(c.state.command(), Command::Graceful);
        // A connection accepted as the drain began is served once, then closed.
        let late = t.try_open(ip("127.0.0.3")).unwrap();
        assert_eq!(late.state.command(), Command::Graceful);
        assert_eq!(late.state.close_reason(), Some("drain"));
    }

    #[test]
    fn the_sweep_asks_an_idle_connection_once_to_give_its_buffers_back() {
        use std::task::{Context, Poll, Waker};
        let mut cx = Context::from_waker(Waker::noop());
        let t = tracker(10, 10);
        let start = Instant::now();
        let c = t.try_open(ip("127.0.0.2")).unwrap();
        let never = t.try_open(ip("127.0.0.3")).unwrap();
        c.state.request_started(false);
        c.state.request_finished();
        t.sweep(start + RELEASE_AFTER / 2);
        assert_eq!(c.state.poll_release(&mut cx), Poll::Pending, "too early");
        t.sweep(start + RELEASE_AFTER + Duration::from_millis(10));
        assert_eq!(c.state.poll_release(&mut cx), Poll::Ready(()));
        assert_eq!(c.state.poll_release(&mut cx), Poll::Pending, "taken once");
        // Still idle: not asked again (each sweep would wake every idle task).
        t.sweep(start + RELEASE_AFTER * 3);
        assert_eq!(c.state.poll_release(&mut cx), Poll::Pending);
        // The next request holds buffers again; its idle spell asks anew.
        c.state.request_started(false);
        c.state.request_finished();
        t.sweep(start + RELEASE_AFTER * 5);
        assert_eq!(c.state.poll_release(&mut cx), Poll::Ready(()));
        // A connection that never brought a request is left to the header timeout.
        assert_eq!(never.state.poll_release(&mut cx), Poll::Pending);
    }
}
