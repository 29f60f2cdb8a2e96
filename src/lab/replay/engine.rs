//! The policy run of `weir replay`: each log record through the same route
//! table and rules as live traffic, in log-time order, on log time.
//!
//! What replays exactly: routing, rate rules at every level (the limiter
//! clock is the log's clock), shadow mode, the human-collateral signals that
//! a log can carry (browser navigation headers, low rate before). What cannot:
//! concurrency rules (a log line has no duration, so nothing is ever in
//! flight), sessions verified by an auth sub-request (there is no app to
//! ask; such requests replay as anonymous), and edge limits.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};
use serde::Serialize;

use super::{LogRecord, UnixNanos};
use crate::gateway::Gateway;
use crate::identity::forwarded::resolve;
use crate::identity::{AddrSource, ClientAddr, ClientId, Level, PeerAddr};
use crate::limiter::{MonoTime, ShardedStore, StoreConfig};
use crate::policy::route::RequestView;
use crate::policy::rules::{RequestFacts, RuleRejection, evaluate};

/// What the configuration decides for one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No route matched: live traffic would get 404.
    NoRoute,
    Admit,
    Reject(RuleRejection),
}

/// Rejections of one rule.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RuleReport {
    pub rejections: u64,
    /// Rejections in shadow mode (would have been refused).
    pub shadow_rejections: u64,
    pub distinct_clients: usize,
    pub distinct_subnets: usize,
    pub distinct_networks: usize,
    /// The busiest rejected /24s (or /64s): prefix, rejections.
    pub top_subnets: Vec<(String, u64)>,
    /// Rejections per minute of log time (`YYYY-MM-DDTHH:MM`).
    pub per_minute: BTreeMap<String, u64>,
    /// Estimated human collateral, by signal: `low_rate`, `browser`.
    pub collateral: BTreeMap<&'static str, u64>,
    #[serde(skip)]
    clients: HashSet<IpAddr>,
    #[serde(skip)]
    subnets: HashMap<String, u64>,
    #[serde(skip)]
    networks: HashSet<String>,
}

/// What a replay found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayReport {
    pub records: u64,
    pub admitted: u64,
    pub rejected: u64,
    pub no_route: u64,
    pub first: Option<String>,
    pub last: Option<String>,
    pub rules: BTreeMap<String, RuleReport>,
}

/// Replays records through a gateway's routes and rules.
pub struct Replay {
    gateway: Gateway,
    activity: ShardedStore,
    start: Option<i64>,
    pub report: ReplayReport,
}

/// Addresses tracked for the low-rate signal.
const ACTIVITY_KEYS: usize = 1 << 20;
/// Prefixes listed per rule.
const TOP: usize = 10;

static SEC_FETCH_MODE: HeaderName = HeaderName::from_static("sec-fetch-mode");
static XFF: HeaderName = HeaderName::from_static("x-forwarded-for");

impl Replay {
    pub fn new(gateway: Gateway) -> Replay {
        Replay {
            gateway,
            activity: ShardedStore::new(StoreConfig::with_max_keys(ACTIVITY_KEYS))
                .expect("a constant, non-zero store size is valid"),
            start: None,
            report: ReplayReport::default(),
        }
    }

    /// Decides one record (records must come in log-time order).
    pub fn decide(&mut self, rec: &LogRecord<'_>) -> Verdict {
        let start = *self.start.get_or_insert(rec.time.0);
        // The limiter clock is the log's clock, from the first record.
        let now = MonoTime::from_nanos(u64::try_from(rec.time.0 - start).unwrap_or(0));
        self.report.records += 1;
        let stamp = minute(rec.time);
        if self.report.first.is_none() {
            self.report.first = Some(stamp.clone());
        }
        self.report.last = Some(stamp.clone());

        let headers = headers_of(rec);
        let gw = &self.gateway;
        let peer = PeerAddr(std::net::SocketAddr::new(rec.peer.unwrap_or(rec.client), 0));
        // A log written behind a trusted proxy may carry the chain.
        let client = if rec.forwarded_for.is_some() && gw.trusted.contains(peer.ip()) {
            resolve(peer, None, &headers, &gw.trusted, gw.client_header).client
        } else {
            ClientId {
                peer,
                client: ClientAddr::new(rec.client),
                source: AddrSource::Peer,
            }
        };
        let method = Method::from_bytes(rec.method.as_bytes()).unwrap_or(Method::GET);
        let uri: Uri = rec.target.parse().unwrap_or_else(|_| Uri::from_static("/"));
        let host = rec
            .host
            .as_deref()
            .map(|h| h.split(':').next().unwrap_or(h));
        let Some(route) = gw.routes.find(&RequestView {
            method: &method,
            uri: &uri,
            host,
            headers: &headers,
        }) else {
            self.report.no_route += 1;
            return Verdict::NoRoute;
        };
        if route.rules.is_empty() {
            self.report.admitted += 1;
            return Verdict::Admit;
        }
        let activity_key = crate::limiter::key(0, 0, client.client.key(Level::Address).digest());
        let low_rate = self
            .activity
            .check(activity_key, &gw.low_rate, now, 1)
            .is_allowed();
        let facts = RequestFacts {
            client: &client,
            method: &method,
            headers: &headers,
            user: None,
            pass: None,
            now,
        };
        let ev = poll_now(evaluate(&route.rules, &facts, gw.rules_shadow, None));
        let browser = rec.sec_fetch_mode.as_deref() == Some("navigate")
            || rec
                .accept
                .as_deref()
                .is_some_and(|a| a.contains("text/html"));
        let signal = if low_rate {
            Some("low_rate")
        } else if browser {
            Some("browser")
        } else {
            None
        };
        for s in &ev.shadow {
            self.report
                .rules
                .entry(s.rule.to_string())
                .or_default()
                .shadow_rejections += 1;
        }
        match ev.rejection {
            None => {
                self.report.admitted += 1;
                Verdict::Admit
            }
            Some(r) => {
                self.report.rejected += 1;
                let rr = self.report.rules.entry(r.rule.to_string()).or_default();
                rr.rejections += 1;
                rr.clients.insert(client.client.ip());
                *rr.subnets
                    .entry(client.client.key(Level::Subnet).to_string())
                    .or_insert(0) += 1;
                rr.networks
                    .insert(client.client.key(Level::Network).to_string());
                *rr.per_minute.entry(stamp).or_insert(0) += 1;
                if let Some(s) = signal {
                    *rr.collateral.entry(s).or_insert(0) += 1;
                }
                Verdict::Reject(r)
            }
        }
    }

    /// Finishes the per-rule summaries.
    pub fn finish(mut self) -> ReplayReport {
        for rr in self.report.rules.values_mut() {
            rr.distinct_clients = rr.clients.len();
            rr.distinct_subnets = rr.subnets.len();
            rr.distinct_networks = rr.networks.len();
            let mut top: Vec<(String, u64)> = rr.subnets.drain().collect();
            top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            top.truncate(TOP);
            rr.top_subnets = top;
        }
        self.report
    }
}

/// The headers rules and routes can look at, rebuilt from the record.
fn headers_of(rec: &LogRecord<'_>) -> HeaderMap {
    let mut h = HeaderMap::new();
    let mut put = |name: HeaderName, v: Option<&str>| {
        if let Some(v) = v
            && let Ok(v) = HeaderValue::from_str(v)
        {
            h.insert(name, v);
        }
    };
    put(http::header::USER_AGENT, rec.user_agent.as_deref());
    put(http::header::COOKIE, rec.cookie.as_deref());
    put(http::header::ACCEPT, rec.accept.as_deref());
    put(http::header::HOST, rec.host.as_deref());
    put(SEC_FETCH_MODE.clone(), rec.sec_fetch_mode.as_deref());
    put(XFF.clone(), rec.forwarded_for.as_deref());
    h
}

/// Replay never waits (no shared limiter, no I/O): the future is ready on
/// its first poll.
fn poll_now<F: std::future::Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        // Without a shared limiter nothing awaits; if that ever changes, wait
        // politely instead of failing the replay.
        Poll::Pending => loop {
            std::thread::sleep(Duration::from_millis(1));
            if let Poll::Ready(v) = fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
                break v;
            }
        },
    }
}

fn minute(t: UnixNanos) -> String {
    let s = humantime::format_rfc3339_seconds(t.to_system_time()).to_string();
    s[..16.min(s.len())].to_string()
}

impl std::fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} requests from {} to {}: {} admitted, {} rejected, {} unrouted",
            self.records,
            self.first.as_deref().unwrap_or("-"),
            self.last.as_deref().unwrap_or("-"),
            self.admitted,
            self.rejected,
            self.no_route
        )?;
        for (name, r) in &self.rules {
            writeln!(
                f,
                "\nrule {name}: {} rejected ({} shadow) from {} clients in {} /24s and {} /16s",
                r.rejections,
                r.shadow_rejections,
                r.distinct_clients,
                r.distinct_subnets,
                r.distinct_networks
            )?;
            if !r.collateral.is_empty() {
                let parts: Vec<String> = r
                    .collateral
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect();
                writeln!(f, "  possible human collateral: {}", parts.join(", "))?;
            }
            for (prefix, n) in &r.top_subnets {
                writeln!(f, "  {n:>8}  {prefix}")?;
            }
            if !r.per_minute.is_empty() {
                let peak = r.per_minute.iter().max_by_key(|(_, n)| **n);
                if let Some((m, n)) = peak {
                    writeln!(f, "  busiest minute: {m} with {n} rejections")?;
                }
            }
        }
        Ok(())
    }
}

/// The replay of one run: report plus parse statistics.
#[derive(Debug, Serialize)]
pub struct ReplayRun {
    pub report: ReplayReport,
    pub lines: u64,
    pub malformed: u64,
    /// The first malformed lines: (file index, line number, error).
    pub malformed_examples: Vec<(usize, u64, String)>,
}

/// Reads `logs` (merged by time) and replays them through `gateway`.
/// `each` sees every record's verdict (for tests and per-line output).
pub fn replay_files(
    gateway: Gateway,
    logs: &[std::path::PathBuf],
    options: &super::ReaderOptions,
    mut each: impl FnMut(&LogRecord<'_>, &Verdict),
) -> std::io::Result<ReplayRun> {
    let mut sources = Vec::new();
    for path in logs {
        let reader = super::LogReader::open(path, options.clone())
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        sources.push(reader.ordered());
    }
    let mut merged = super::MergedRecords::new(sources);
    let mut replay = Replay::new(gateway);
    for item in merged.by_ref() {
        let (_, rec) = item?;
        let v = replay.decide(&rec);
        each(&rec, &v);
    }
    let mut lines = 0;
    let mut malformed = 0;
    let mut malformed_examples = Vec::new();
    for (i, s) in merged.stats().into_iter().enumerate() {
        lines += s.lines;
        malformed += s.malformed;
        for e in &s.examples {
            malformed_examples.push((i, e.line, e.error.to_string()));
        }
    }
    Ok(ReplayRun {
        report: replay.finish(),
        lines,
        malformed,
        malformed_examples,
    })
}
