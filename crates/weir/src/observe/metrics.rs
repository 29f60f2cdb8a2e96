//! Prometheus metrics (prometheus-client), all under the `weir_` prefix.
//!
//! Names and units follow Prometheus conventions: counters end in `_total`
//! (added by the registry), durations are in seconds. Every metric here is
//! listed in `docs/metrics.md`; a test keeps the two in step.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub class: Arc<str>,
    pub status: u16,
    pub decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub class: Arc<str>,
    pub decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabels {
    pub class: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabels {
    pub rule: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleResultLabels {
    pub rule: Arc<str>,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CollateralLabels {
    pub rule: Arc<str>,
    pub signal: &'static str,
    pub enforced: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLevelLabels {
    pub rule: Arc<str>,
    pub level: &'static str,
    pub enforced: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ChallengeLabels {
    pub event: &'static str,
    pub reason: &'static str,
}

/// `weir_bot_verifications_total`: how a crawler tried to prove itself
/// (`web_bot_auth`, `fcrdns`) and the result (`verified`, or a bounded
/// reason it was not).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BotLabels {
    pub method: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerLabels {
    pub worker: usize,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub pool: Arc<str>,
}

/// One pool's per-request metrics, looked up once per pool instead of once
/// per request (a family lookup hashes the labels under a lock).
#[derive(Debug, Clone)]
pub struct PoolHandles {
    pub in_flight: Gauge,
    pub duration: prometheus_client::metrics::histogram::Histogram,
}

/// Recently used children of a family, found by comparing the caller's
/// labels cheaply (an `Arc`'s pointer, a short string) instead of through
/// the family, whose lookup hashes the labels with SipHash under a lock: a
/// few hundred instructions per lookup, several lookups per request
/// (bench/README.md, "Where a request's instructions go"). A handful of
/// label sets covers nearly all requests (a few classes, pools, lanes,
/// rules, statuses); the oldest entry makes room for a new one. An entry
/// keeps its labels' `Arc`s, so a pointer match can never be a different
/// (freed and reallocated) name.
#[derive(Debug)]
struct Recent<L, S> {
    entries: std::sync::Mutex<Vec<(L, S)>>,
    capacity: usize,
}

impl<L, S: Clone> Recent<L, S> {
    fn new(capacity: usize) -> Self {
        Recent {
            entries: std::sync::Mutex::new(Vec::with_capacity(capacity)),
            capacity,
        }
    }

    /// The children of the first entry whose labels `matches`, or of the
    /// label set `make` looks up (then kept).
    fn get(&self, matches: impl Fn(&L) -> bool, make: impl FnOnce() -> (L, S)) -> S {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, series)) = entries.iter().find(|(l, _)| matches(l)) {
            return series.clone();
        }
        let (labels, series) = make();
        if entries.len() >= self.capacity {
            entries.remove(0);
        }
        entries.push((labels, series.clone()));
        series
    }
}

/// One label set's children: its count, and its class and decision's
/// duration histogram.
#[derive(Debug, Clone)]
struct RequestSeries {
    count: Counter,
    duration: Histogram,
}

/// A pool and lane's admission children, and the lane's name as the
/// access log records it (shared, not allocated per request).
#[derive(Debug, Clone)]
pub struct AdmittedSeries {
    pub lane: Arc<str>,
    pub admitted: Counter,
    pub wait: Histogram,
}

/// How many label sets each [`Recent`] keeps: more than a configuration's
/// classes x statuses x decisions seen at once, or its rules x results.
const RECENT_SERIES: usize = 32;

impl Metrics {
    /// Counts one finished request in `requests` and its time from the
    /// head's arrival to the last byte sent in `request_duration`.
    pub fn count_request(
        &self,
        class: &Arc<str>,
        status: u16,
        decision: &'static str,
        duration: std::time::Duration,
    ) {
        let series = self.recent_requests.get(
            |l| Arc::ptr_eq(&l.class, class) && l.status == status && l.decision == decision,
            || {
                let labels = RequestLabels {
                    class: class.clone(),
                    status,
                    decision,
                };
                let series = RequestSeries {
                    count: self.requests.get_or_create(&labels).clone(),
                    duration: self
                        .request_duration
                        .get_or_create(&DecisionLabels {
                            class: class.clone(),
                            decision,
                        })
                        .clone(),
                };
                (labels, series)
            },
        );
        series.count.inc();
        series.duration.observe(duration.as_secs_f64());
    }

    /// The admission children of `pool`'s lane named `lane`
    /// (`weir_admission_admitted_total`, `weir_admission_queue_wait_seconds`),
    /// with the lane's shared name.
    pub fn admitted(&self, pool: &Arc<str>, lane: &str) -> AdmittedSeries {
        self.recent_admitted.get(
            |l| Arc::ptr_eq(&l.pool, pool) && &*l.lane == lane,
            || {
                let labels = LaneLabels {
                    pool: pool.clone(),
                    lane: Arc::from(lane),
                };
                let series = AdmittedSeries {
                    lane: labels.lane.clone(),
                    admitted: self.admission_admitted.get_or_create(&labels).clone(),
                    wait: self.admission_queue_wait.get_or_create(&labels).clone(),
                };
                (labels, series)
            },
        )
    }

    /// Counts one rule's result for a request (`weir_rule_decisions_total`).
    pub fn rule_result(&self, rule: &Arc<str>, result: &'static str) {
        self.recent_rule_results
            .get(
                |l| Arc::ptr_eq(&l.rule, rule) && l.result == result,
                || {
                    let labels = RuleResultLabels {
                        rule: rule.clone(),
                        result,
                    };
                    let counter = self.rule_decisions.get_or_create(&labels).clone();
                    (labels, counter)
                },
            )
            .inc();
    }

    /// Counts the limiter stores' evictions since the last call, from their
    /// running `total`. A total below the last one means the stores were
    /// rebuilt (a reload that changed the rules): all of it is new.
    pub fn evictions(&self, total: u64) {
        let mut seen = self
            .evictions_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let new = if total >= *seen { total - *seen } else { total };
        self.limiter_evicted_keys.inc_by(new);
        *seen = total;
    }

    /// Creates a pool's error series at 0, so an alert on their increase
    /// sees the first error (called when a configuration names the pool).
    pub fn pool_known(&self, pool: &Arc<str>) {
        let _ = self
            .challenge_spared
            .get_or_create(&PoolLabels { pool: pool.clone() });
        let _ = self
            .admission_requeued
            .get_or_create(&PoolLabels { pool: pool.clone() });
        for kind in [
            "connect",
            "timeout",
            "closed",
            "exchange",
            "no_healthy_upstream",
        ] {
            let _ = self.upstream_errors.get_or_create(&PoolErrorLabels {
                pool: pool.clone(),
                kind,
            });
        }
    }

    pub fn pool_handles(&self, pool: &Arc<str>) -> PoolHandles {
        let labels = PoolLabels { pool: pool.clone() };
        PoolHandles {
            in_flight: self.upstream_in_flight.get_or_create(&labels).clone(),
            duration: self.upstream_duration.get_or_create(&labels).clone(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolErrorLabels {
    pub pool: Arc<str>,
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: &'static str,
    pub commit: &'static str,
    pub build_date: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LaneLabels {
    pub pool: Arc<str>,
    pub lane: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShedLabels {
    pub pool: Arc<str>,
    pub lane: Arc<str>,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolStateLabels {
    pub pool: Arc<str>,
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServerStateLabels {
    pub pool: Arc<str>,
    pub server: String,
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CheckLabels {
    pub pool: Arc<str>,
    pub result: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms .. ~65 s: from a cached page to a slow upload.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// All of weir's metrics, registered once per process and kept across reloads.
pub struct Metrics {
    /// The root registry: weir's own metrics sit in its `weir_` sub-registry
    /// ([`Metrics::weir_registry`]), the standard `process_*` set at the root.
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub request_duration: HistogramFamily<DecisionLabels>,
    recent_requests: Recent<RequestLabels, RequestSeries>,
    recent_admitted: Recent<LaneLabels, AdmittedSeries>,
    recent_rule_results: Recent<RuleResultLabels, Counter>,
    pub rejections: Family<RuleLabels, Counter>,
    pub connections_open: Gauge,
    /// Client connections open per worker thread (`edge::balance` counts in
    /// them).
    worker_connections: Family<WorkerLabels, Gauge>,
    pub connections_accepted: Counter,
    pub connection_buffers_released: Counter,
    pub connections_refused: Family<ReasonLabels, Counter>,
    pub connections_closed: Family<ReasonLabels, Counter>,
    pub connection_errors: Family<KindLabels, Counter>,
    pub upstream_in_flight: Family<PoolLabels, Gauge>,
    pub upstream_duration: HistogramFamily<PoolLabels>,
    pub upstream_errors: Family<PoolErrorLabels, Counter>,
    pub upstream_retries: Family<PoolLabels, Counter>,
    pub reloads: Family<ResultLabels, Counter>,
    pub config_version: Gauge,
    pub forwarding_warnings: Family<KindLabels, Counter>,
    pub dominant_peer_share: Gauge<f64, AtomicU64>,
    pub access_log_dropped: Counter,
    pub rule_decisions: Family<RuleResultLabels, Counter>,
    pub rule_collateral: Family<CollateralLabels, Counter>,
    pub rule_rejections: Family<RuleLevelLabels, Counter>,
    pub rule_rejected_clients: Family<RuleLabels, Gauge>,
    pub state_restored_keys: Gauge,
    pub state_snapshot_keys: Gauge,
    pub state_snapshots: Family<ResultLabels, Counter>,
    pub state_merged_keys: Counter,
    pub limiter_evicted_keys: Counter,
    /// The store's eviction total last counted into `limiter_evicted_keys`.
    evictions_seen: std::sync::Mutex<u64>,
    pub process_start_time: Gauge,
    pub build_info: Family<BuildLabels, Gauge>,
    pub redis_round_trips: Family<ResultLabels, Counter>,
    pub redis_fallback_decisions: Counter,
    pub redis_outages: Counter,
    pub redis_fallback_active: Gauge,
    pub redis_lease_decisions: Counter,
    pub redis_lease_tokens: Family<ResultLabels, Counter>,
    pub challenge_events: Family<ChallengeLabels, Counter>,
    pub challenge_solve: Histogram,
    pub challenge_engaged: Family<PoolLabels, Gauge>,
    pub challenge_spared: Family<PoolLabels, Counter>,
    pub bot_verifications: Family<BotLabels, Counter>,
    pub admission_limit: Family<PoolLabels, Gauge>,
    pub admission_open_bound: Family<PoolLabels, Gauge>,
    pub admission_expensive_shapes: Family<PoolLabels, Gauge>,
    pub admission_in_flight: Family<PoolLabels, Gauge>,
    pub admission_queued: Family<LaneLabels, Gauge>,
    pub admission_admitted: Family<LaneLabels, Counter>,
    pub admission_shed: Family<ShedLabels, Counter>,
    pub admission_requeued: Family<PoolLabels, Counter>,
    pub admission_queue_wait: HistogramFamily<LaneLabels>,
    pub pool_state: Family<PoolStateLabels, Gauge>,
    pub upstream_health: Family<ServerStateLabels, Gauge>,
    pub health_checks: Family<CheckLabels, Counter>,
    pub upstream_retries_denied: Family<PoolLabels, Counter>,
    pub coalesced_requests: Family<ClassLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut root = Registry::default();
        let registry = root.sub_registry_with_prefix("weir");
        let m = Metrics::unregistered();
        m.register_request_metrics(registry);
        m.register_connection_metrics(registry);
        m.register_upstream_metrics(registry);
        m.register_operation_metrics(registry);
        m.register_rule_metrics(registry);
        m.register_state_metrics(registry);
        m.register_process_metrics(registry);
        m.register_redis_metrics(registry);
        m.register_challenge_metrics(registry);
        m.register_admission_metrics(registry);
        m.register_health_metrics(registry);
        m.create_alerted_series();
        m.record_process_identity();
        root.register_collector(Box::new(super::process::ProcessCollector));
        Metrics {
            registry: root,
            ..m
        }
    }

    /// Every series empty, none registered yet: one line a field.
    #[expect(
        clippy::too_many_lines,
        reason = "a struct literal, one line a metric: splitting it would split `Metrics` (issue 58, item 1)"
    )]
    fn unregistered() -> Metrics {
        Metrics {
            requests: Family::default(),
            request_duration: Family::new_with_constructor(latency_histogram),
            recent_requests: Recent::new(RECENT_SERIES),
            recent_admitted: Recent::new(RECENT_SERIES),
            recent_rule_results: Recent::new(RECENT_SERIES),
            rejections: Family::default(),
            connections_open: Gauge::default(),
            worker_connections: Family::default(),
            connections_accepted: Counter::default(),
            connection_buffers_released: Counter::default(),
            connections_refused: Family::default(),
            connections_closed: Family::default(),
            connection_errors: Family::default(),
            upstream_in_flight: Family::default(),
            upstream_duration: Family::new_with_constructor(latency_histogram),
            upstream_errors: Family::default(),
            upstream_retries: Family::default(),
            reloads: Family::default(),
            config_version: Gauge::default(),
            forwarding_warnings: Family::default(),
            dominant_peer_share: Gauge::default(),
            access_log_dropped: Counter::default(),
            rule_decisions: Family::default(),
            rule_collateral: Family::default(),
            rule_rejections: Family::default(),
            rule_rejected_clients: Family::default(),
            state_restored_keys: Gauge::default(),
            state_snapshot_keys: Gauge::default(),
            state_snapshots: Family::default(),
            state_merged_keys: Counter::default(),
            limiter_evicted_keys: Counter::default(),
            evictions_seen: std::sync::Mutex::new(0),
            process_start_time: Gauge::default(),
            build_info: Family::default(),
            redis_round_trips: Family::default(),
            redis_fallback_decisions: Counter::default(),
            redis_outages: Counter::default(),
            redis_lease_decisions: Counter::default(),
            redis_lease_tokens: Family::default(),
            redis_fallback_active: Gauge::default(),
            challenge_events: Family::default(),
            challenge_solve: Histogram::new(exponential_buckets(0.05, 2.0, 10)),
            challenge_engaged: Family::default(),
            challenge_spared: Family::default(),
            bot_verifications: Family::default(),
            admission_limit: Family::default(),
            admission_open_bound: Family::default(),
            admission_expensive_shapes: Family::default(),
            admission_in_flight: Family::default(),
            admission_queued: Family::default(),
            admission_admitted: Family::default(),
            admission_shed: Family::default(),
            admission_requeued: Family::default(),
            admission_queue_wait: Family::new_with_constructor(latency_histogram),
            pool_state: Family::default(),
            upstream_health: Family::default(),
            health_checks: Family::default(),
            upstream_retries_denied: Family::default(),
            coalesced_requests: Family::default(),
            registry: Registry::default(),
        }
    }

    /// Requests: answered, how long they took, rejected before an upstream.
    fn register_request_metrics(&self, registry: &mut Registry) {
        registry.register(
            "requests",
            "Requests answered, by route class, status and decision",
            self.requests.clone(),
        );
        registry.register_with_unit(
            "request_duration",
            "Time from a request's head arriving to its answer's last byte sent, by route class and decision",
            Unit::Seconds,
            self.request_duration.clone(),
        );
        registry.register(
            "rejections",
            "Requests rejected before reaching an upstream, by rule",
            self.rejections.clone(),
        );
    }

    /// Client connections: open, accepted, refused, closed by weir, failed.
    fn register_connection_metrics(&self, registry: &mut Registry) {
        registry.register(
            "connections_open",
            "Client connections currently open",
            self.connections_open.clone(),
        );
        registry.register(
            "worker_connections",
            "Client connections currently open, by the worker thread that accepted them",
            self.worker_connections.clone(),
        );
        registry.register(
            "connections_accepted",
            "Client connections accepted",
            self.connections_accepted.clone(),
        );
        registry.register(
            "connection_buffers_released",
            "Times an idle HTTP/1 client connection gave its read buffer back",
            self.connection_buffers_released.clone(),
        );
        registry.register(
            "connections_refused",
            "Client connections refused at accept, by reason",
            self.connections_refused.clone(),
        );
        registry.register(
            "connections_closed",
            "Client connections closed by weir before the client closed them, by reason",
            self.connections_closed.clone(),
        );
        registry.register(
            "connection_errors",
            "Client connections that ended in a protocol or I/O error, by kind",
            self.connection_errors.clone(),
        );
    }

    /// Requests sent to the pools: in flight, response time, failures, retries.
    fn register_upstream_metrics(&self, registry: &mut Registry) {
        registry.register(
            "upstream_in_flight",
            "Requests in flight to each pool",
            self.upstream_in_flight.clone(),
        );
        registry.register_with_unit(
            "upstream_response_duration",
            "Time from sending a request upstream to its response headers, by pool",
            Unit::Seconds,
            self.upstream_duration.clone(),
        );
        registry.register(
            "upstream_errors",
            "Upstream failures by pool and kind (connect, timeout, reset)",
            self.upstream_errors.clone(),
        );
        registry.register(
            "upstream_retries",
            "Requests re-sent to another server after a connect failure, by pool",
            self.upstream_retries.clone(),
        );
    }

    /// Running the instance: configuration reloads and version, forwarding
    /// headers ignored, the dominant peer, access-log lines dropped.
    fn register_operation_metrics(&self, registry: &mut Registry) {
        registry.register(
            "reloads",
            "Configuration reloads by result (ok, invalid)",
            self.reloads.clone(),
        );
        registry.register(
            "config_version",
            "Version of the running configuration (1 at start, +1 per successful reload)",
            self.config_version.clone(),
        );
        registry.register(
            "forwarding_header_warnings",
            "Forwarding information ignored or suspicious, by kind (untrusted_peer, malformed, dominant_peer)",
            self.forwarding_warnings.clone(),
        );
        registry.register(
            "dominant_peer_share",
            "Share of requests from the busiest peer address in the last window, while no trusted proxy is configured",
            self.dominant_peer_share.clone(),
        );
        registry.register(
            "access_log_dropped",
            "Access-log lines dropped because the writer could not keep up",
            self.access_log_dropped.clone(),
        );
    }

    /// Rate-limit rules: outcomes, collateral, the levels that refused, clients
    /// refused.
    fn register_rule_metrics(&self, registry: &mut Registry) {
        registry.register(
            "rule_decisions",
            "Rule outcomes by rule and result (allow, reject, shadow_reject, exempt)",
            self.rule_decisions.clone(),
        );
        registry.register(
            "rule_collateral",
            "Rejections (enforced or shadow) of clients that look human, by the strongest evidence: verified (a verified session), pass (a challenge pass), browsing (a visit weir counted), low_rate (few requests before), browser (navigation headers)",
            self.rule_collateral.clone(),
        );
        registry.register(
            "rule_rejections",
            "Rule rejections (enforced or shadow) by rule and the level that refused: ip, subnet, network, site, ...",
            self.rule_rejections.clone(),
        );
        registry.register(
            "rule_rejected_clients",
            "Distinct client addresses rejected by a rule in the current minute",
            self.rule_rejected_clients.clone(),
        );
    }

    /// Limiter state: snapshots restored, written and merged, keys evicted.
    fn register_state_metrics(&self, registry: &mut Registry) {
        registry.register(
            "state_restored_keys",
            "Limiter keys restored from the snapshot at start (0 after a restart means state was lost)",
            self.state_restored_keys.clone(),
        );
        registry.register(
            "state_snapshot_keys",
            "Limiter keys written in the last snapshot",
            self.state_snapshot_keys.clone(),
        );
        registry.register(
            "state_snapshots",
            "Snapshot writes by result (ok, error)",
            self.state_snapshots.clone(),
        );
        registry.register(
            "state_merged_keys",
            "Limiter keys merged from snapshots another weir process wrote while this one ran",
            self.state_merged_keys.clone(),
        );
        registry.register(
            "limiter_evicted_keys",
            "Live limiter keys evicted because a level reached rules.max_keys_per_level",
            self.limiter_evicted_keys.clone(),
        );
    }

    /// This process: when it started and which build it is.
    fn register_process_metrics(&self, registry: &mut Registry) {
        registry.register_with_unit(
            "process_start_time",
            "Unix time this weir process started",
            Unit::Seconds,
            self.process_start_time.clone(),
        );
        registry.register(
            "build_info",
            "Always 1; the labels say which weir this is (version, git commit, build date)",
            self.build_info.clone(),
        );
    }

    /// Shared limits in Redis: round trips, and the local fallback when Redis is
    /// lost.
    fn register_redis_metrics(&self, registry: &mut Registry) {
        registry.register(
            "redis_round_trips",
            "Round trips to Redis for shared limits, by result (ok, error)",
            self.redis_round_trips.clone(),
        );
        registry.register(
            "redis_fallback_decisions",
            "Rate decisions taken with local state because Redis was unreachable or slow",
            self.redis_fallback_decisions.clone(),
        );
        registry.register(
            "redis_outages",
            "Times weir lost Redis and switched to local limits",
            self.redis_outages.clone(),
        );
        registry.register(
            "redis_fallback_active",
            "1 while Redis is unreachable and limits are enforced per instance",
            self.redis_fallback_active.clone(),
        );
        registry.register(
            "redis_lease_decisions",
            "Shared rate decisions taken from tokens leased earlier, with no round trip",
            self.redis_lease_decisions.clone(),
        );
        registry.register(
            "redis_lease_tokens",
            "Tokens leased from Redis ahead of use (leased), and given back unused (returned)",
            self.redis_lease_tokens.clone(),
        );
    }

    /// Browser challenges, and crawlers' attempts to prove who they are.
    fn register_challenge_metrics(&self, registry: &mut Registry) {
        registry.register(
            "challenge_events",
            "Browser challenge events: issued, solved, failed (by reason), pass_admitted, pass_rejected (by reason)",
            self.challenge_events.clone(),
        );
        registry.register_with_unit(
            "challenge_solve_duration",
            "Time from a challenge page being served to its answer arriving",
            Unit::Seconds,
            self.challenge_solve.clone(),
        );
        registry.register(
            "challenge_engaged",
            "1 while a pool is under pressure and under_pressure classes challenge",
            self.challenge_engaged.clone(),
        );
        registry.register(
            "challenge_spared",
            "Navigations without a pass served under pressure because the app had room (not challenged)",
            self.challenge_spared.clone(),
        );
        registry.register(
            "bot_verifications",
            "Crawlers' attempts to prove who they are, by method (web_bot_auth, fcrdns) and result (verified, or why not)",
            self.bot_verifications.clone(),
        );
    }

    /// Admission queues (limits, slots, waits, shedding) and request
    /// coalescing.
    fn register_admission_metrics(&self, registry: &mut Registry) {
        registry.register(
            "admission_limit",
            "Requests the pool's admission queue lets through at once (fixed, or learned by the adaptive limit)",
            self.admission_limit.clone(),
        );
        registry.register(
            "admission_open_bound",
            "While the adaptive limit is still open (never cut), how far requests in flight may go: doubles as the app keeps up, 0 once the limit is learned",
            self.admission_open_bound.clone(),
        );
        registry.register(
            "admission_expensive_shapes",
            "Request shapes (path prefix and query keys) the pool learned are expensive: classes without a lane send them to the anonymous lane",
            self.admission_expensive_shapes.clone(),
        );
        registry.register(
            "admission_in_flight",
            "Requests holding an admission slot, by pool",
            self.admission_in_flight.clone(),
        );
        registry.register(
            "admission_queued",
            "Requests waiting for an admission slot, by pool and lane",
            self.admission_queued.clone(),
        );
        registry.register(
            "admission_admitted",
            "Requests given an admission slot, by pool and lane",
            self.admission_admitted.clone(),
        );
        registry.register(
            "admission_shed",
            "Requests refused 503 by the admission queue, by pool, lane and reason (queue_full, deadline_exceeded, lower_lane_shed)",
            self.admission_shed.clone(),
        );
        registry.register(
            "admission_requeued",
            "Idempotent reads the app refused without a response (connection closed or reset) that waited for an admission slot again, by pool",
            self.admission_requeued.clone(),
        );
        registry.register(
            "coalesced_requests",
            "Requests answered with a copy of an identical request's upstream response (request coalescing), by route class",
            self.coalesced_requests.clone(),
        );
        registry.register_with_unit(
            "admission_queue_wait",
            "Time admitted requests waited for a slot, by pool and lane",
            Unit::Seconds,
            self.admission_queue_wait.clone(),
        );
    }

    /// Pool and server health, and retries the retry budget denied.
    fn register_health_metrics(&self, registry: &mut Registry) {
        registry.register(
            "pool_state",
            "1 for the pool's current signal (ready, busy, down), 0 for the others: busy means saturated or slow, do not restart",
            self.pool_state.clone(),
        );
        registry.register(
            "upstream_health",
            "1 for each server's current health state (healthy, slow, dead), 0 for the others",
            self.upstream_health.clone(),
        );
        registry.register(
            "health_checks",
            "Active health checks by pool and result (ok, failed, timeout, refused, skipped)",
            self.health_checks.clone(),
        );
        registry.register(
            "upstream_retries_denied",
            "Retries not sent because the pool's retry budget was spent, by pool",
            self.upstream_retries_denied.clone(),
        );
    }

    /// Creates at 0 the series an alert watches with `increase(...) > 0`: a
    /// series born with its first event has no earlier value, so that first
    /// event would never show as an increase.
    fn create_alerted_series(&self) {
        for result in ["ok", "invalid"] {
            let _ = self.reloads.get_or_create(&ResultLabels { result });
        }
        for reason in ["global_cap", "per_ip_cap", "accept_error"] {
            let _ = self
                .connections_refused
                .get_or_create(&ReasonLabels { reason });
        }
        for kind in [
            "dominant_peer",
            "untrusted_peer",
            "malformed",
            "missing_from_trusted_peer",
        ] {
            let _ = self.forwarding_warnings.get_or_create(&KindLabels { kind });
        }
    }

    /// Records which weir this is (`build_info`) and when it started.
    fn record_process_identity(&self) {
        self.build_info
            .get_or_create(&BuildLabels {
                version: crate::build_info::VERSION,
                commit: crate::build_info::COMMIT,
                build_date: crate::build_info::BUILD_DATE,
            })
            .set(1);
        self.process_start_time.set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64),
        );
    }

    /// Where a stage registers metrics of its own: names get the `weir_` prefix.
    pub fn weir_registry(&mut self) -> &mut Registry {
        self.registry.sub_registry_with_prefix("weir")
    }

    /// The gauge of client connections open on worker thread `worker`.
    pub fn worker_connections(&self, worker: usize) -> Gauge {
        self.worker_connections
            .get_or_create(&WorkerLabels { worker })
            .clone()
    }

    /// The OpenMetrics text exposition (what Prometheus asks for first).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// The exposition in `format`.
    pub fn encode_as(&self, format: Exposition) -> String {
        match format {
            Exposition::OpenMetrics => self.encode(),
            Exposition::Prometheus => openmetrics_to_prometheus(&self.encode()),
        }
    }

    pub fn refused(&self, reason: &'static str) {
        self.connections_refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub fn closed(&self, reason: &'static str) {
        self.connections_closed
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub fn connection_error(&self, kind: &'static str) {
        self.connection_errors
            .get_or_create(&KindLabels { kind })
            .inc();
    }

    pub fn forwarding_warning(&self, kind: &'static str) {
        self.forwarding_warnings
            .get_or_create(&KindLabels { kind })
            .inc();
    }
}

/// The two text formats `/metrics` speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposition {
    /// OpenMetrics 1.0: for a client that asks for it (Prometheus does).
    OpenMetrics,
    /// Prometheus text 0.0.4: for everyone else (`curl`, promtool, older
    /// scrapers, agents that only read the classic format).
    Prometheus,
}

impl Exposition {
    /// The format an `Accept` header asks for: OpenMetrics only when named
    /// (Prometheus names it first), else the classic text format that every
    /// tool reads.
    pub fn negotiate(accept: Option<&str>) -> Exposition {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Exposition::OpenMetrics,
            _ => Exposition::Prometheus,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Exposition::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Exposition::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// Prometheus text 0.0.4 from OpenMetrics text (prometheus-client writes only
/// the latter). The differences weir's metrics meet: a counter's family is
/// named with its `_total` in 0.0.4 (its samples already are), `# UNIT` and
/// `# EOF` do not exist there, `unknown` is `untyped`. Written here because
/// it is these few line rewrites, not a second encoder.
fn openmetrics_to_prometheus(om: &str) -> String {
    let mut out = String::with_capacity(om.len());
    let mut counters = std::collections::HashSet::new();
    for line in om.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ")
            && let Some(name) = rest.strip_suffix(" counter")
        {
            counters.insert(name.to_owned());
        }
    }
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(prefix);
                out.push_str(name);
                if counters.contains(name) && !name.ends_with("_total") {
                    out.push_str("_total");
                }
                out.push(' ');
                out.push_str(if tail == "unknown" { "untyped" } else { tail });
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_counts_through_the_recent_cache_match_the_family() {
        let m = Metrics::new();
        let page: Arc<str> = Arc::from("page");
        let api: Arc<str> = Arc::from("api");
        // More label sets than the cache keeps, each seen several times.
        for round in 0..3 {
            for status in 200..220u16 {
                m.count_request(&page, status, "admit", ms(3));
            }
            m.count_request(&api, 429, "reject", ms(1));
            // An equal class in a different allocation counts the same.
            m.count_request(&Arc::from("page"), 200, "admit", ms(3));
            let count = |class: &str, status, decision| {
                m.requests
                    .get_or_create(&RequestLabels {
                        class: Arc::from(class),
                        status,
                        decision,
                    })
                    .get()
            };
            let n = round + 1;
            assert_eq!(count("page", 200, "admit"), 2 * n);
            assert_eq!(count("page", 219, "admit"), n);
            assert_eq!(count("api", 429, "reject"), n);
            assert_eq!(count("api", 429, "admit"), 0);
        }
        // One duration histogram per class and decision, whatever the status.
        let text = m.encode();
        assert!(
            text.contains(
                "weir_request_duration_seconds_count{class=\"page\",decision=\"admit\"} 63"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "weir_request_duration_seconds_bucket{le=\"0.001\",class=\"api\",decision=\"reject\"} 3"
            ),
            "{text}"
        );
    }

    fn ms(n: u64) -> std::time::Duration {
        std::time::Duration::from_millis(n)
    }

    #[test]
    fn evictions_count_what_is_new_and_survive_a_store_rebuild() {
        let m = Metrics::new();
        m.evictions(5);
        m.evictions(5);
        m.evictions(12);
        assert_eq!(m.limiter_evicted_keys.get(), 12);
        // The stores were rebuilt: their total starts again from 0.
        m.evictions(3);
        assert_eq!(m.limiter_evicted_keys.get(), 15);
    }

    #[test]
    fn process_metrics_sit_beside_weirs_without_its_prefix() {
        let text = Metrics::new().encode_as(Exposition::Prometheus);
        for name in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
        ] {
            assert!(
                text.lines().any(|l| l.starts_with(&format!("{name} "))),
                "{name} missing:\n{text}"
            );
        }
        assert!(
            text.contains("# TYPE process_cpu_seconds_total counter"),
            "{text}"
        );
        assert!(!text.contains("weir_process_cpu"), "{text}");
    }

    #[test]
    fn exposition_names_and_labels() {
        let m = Metrics::new();
        m.requests
            .get_or_create(&RequestLabels {
                class: Arc::from("page"),
                status: 200,
                decision: "admit",
            })
            .inc();
        m.refused("per_ip_cap");
        m.upstream_duration
            .get_or_create(&PoolLabels {
                pool: Arc::from("app"),
            })
            .observe(0.003);
        let text = m.encode();
        assert!(
            text.contains(
                "weir_requests_total{class=\"page\",status=\"200\",decision=\"admit\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("weir_connections_refused_total{reason=\"per_ip_cap\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE weir_upstream_response_duration_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains(
                "weir_upstream_response_duration_seconds_bucket{le=\"0.004\",pool=\"app\"} 1"
            ),
            "{text}"
        );
    }
}
