//! Active health checks: one `GET` of the configured path on a server, and
//! the periodic round over every pool that runs them.
//!
//! A check takes the pool's reserved health slot
//! ([`crate::admission::AdmissionQueue::try_acquire_health`]), so it never
//! queues behind traffic and never takes the app's last worker; when the
//! slot is busy the round is skipped, which is not a failure. The round also
//! re-evaluates silence, moves slow-start caps with time, closes idle
//! upstream connections past their time, and refreshes the pool gauges.
//! What a result *means* is `health`'s business, not this module's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, header};

use super::health::CheckResult;
use super::pool::{CheckSettings, Pool, Server};
use crate::admission::AdmissionQueue;
use crate::observe::Metrics;
use crate::observe::metrics::CheckLabels;
use weir_http::body::RequestBody;

/// How often the round runs: fine enough for slow-start ramps and check
/// intervals down to a tenth of a second.
pub const ROUND: Duration = Duration::from_millis(100);

/// Runs one round over `pools` at `now`: ticks health, updates slow-start
/// capacity, closes idle connections past their time, starts due checks
/// (each on its own task) and exports gauges.
pub fn round(pools: &[Arc<Pool>], metrics: &Arc<Metrics>, now: Instant) {
    for pool in pools {
        pool.tick(now);
        pool.update_capacity(now);
        pool.purge_idle();
        let Some(settings) = pool.checks.clone() else {
            continue;
        };
        for server in pool.due_checks(now) {
            let permit = match &pool.admission {
                None => None,
                Some(q) => match q.try_acquire_health() {
                    Some(p) => Some(p),
                    None => {
                        pool.check_skipped(&server);
                        count(metrics, pool, "skipped");
                        continue;
                    }
                },
            };
            let pool = pool.clone();
            let metrics = metrics.clone();
            let settings = settings.clone();
            tokio::spawn(async move {
                let result = check(&pool, &server, &settings).await;
                drop(permit);
                count(&metrics, &pool, label(&result));
                pool.observe_check(&server, Instant::now(), result);
            });
        }
    }
    export_gauges(pools, metrics, now);
}

/// Refreshes the pools' gauges: admission limit, in-flight and queue
/// depth, pool signal and server health.
pub fn export_gauges(pools: &[Arc<Pool>], metrics: &Metrics, now: Instant) {
    for pool in pools {
        if let Some(q) = &pool.admission {
            export_admission_gauges(pool, q, metrics);
        }
        export_health_gauges(pool, metrics, now);
    }
}

/// Refreshes one pool's admission gauges: limit, open bound, expensive
/// shapes, in flight, and each lane's queue depth.
fn export_admission_gauges(pool: &Pool, q: &AdmissionQueue, metrics: &Metrics) {
    use crate::observe::metrics::{LaneLabels, PoolLabels};
    let labels = PoolLabels {
        pool: pool.name.clone(),
    };
    let snap = q.snapshot();
    metrics
        .admission_limit
        .get_or_create(&labels)
        .set(snap.limit as i64);
    metrics
        .admission_open_bound
        .get_or_create(&labels)
        .set(snap.open_bound.map_or(0, |b| b as i64));
    metrics
        .admission_expensive_shapes
        .get_or_create(&labels)
        .set(q.shapes().expensive_shapes() as i64);
    metrics
        .admission_in_flight
        .get_or_create(&labels)
        .set(snap.in_flight as i64);
    for lane in &snap.lanes {
        metrics
            .admission_queued
            .get_or_create(&LaneLabels {
                pool: pool.name.clone(),
                lane: Arc::from(lane.name.as_str()),
            })
            .set(lane.queued as i64);
    }
}

/// Refreshes one pool's signal gauge (1 on its current state) and, when it
/// is checked, its servers' health gauges.
fn export_health_gauges(pool: &Pool, metrics: &Metrics, now: Instant) {
    use super::health::{HealthState, PoolSignal};
    use crate::observe::metrics::{PoolStateLabels, ServerStateLabels};
    let signal = pool.signal(now);
    for s in [PoolSignal::Ready, PoolSignal::Busy, PoolSignal::Down] {
        metrics
            .pool_state
            .get_or_create(&PoolStateLabels {
                pool: pool.name.clone(),
                state: s.as_str(),
            })
            .set(i64::from(s == signal));
    }
    if pool.checks.is_some() {
        for server in &pool.servers {
            let state = server.health();
            for h in [HealthState::Healthy, HealthState::Slow, HealthState::Dead] {
                metrics
                    .upstream_health
                    .get_or_create(&ServerStateLabels {
                        pool: pool.name.clone(),
                        server: server.addr.to_string(),
                        state: h.as_str(),
                    })
                    .set(i64::from(h == state));
            }
        }
    }
}

fn count(metrics: &Metrics, pool: &Pool, result: &'static str) {
    metrics
        .health_checks
        .get_or_create(&CheckLabels {
            pool: pool.name.clone(),
            result,
        })
        .inc();
}

fn label(r: &CheckResult) -> &'static str {
    match r {
        CheckResult::Ok { .. } => "ok",
        CheckResult::Failed { .. } => "failed",
        CheckResult::Timeout => "timeout",
        CheckResult::Refused => "refused",
    }
}

/// Largest check answer read to keep its connection.
const MAX_CHECK_BODY: usize = 64 * 1024;

/// One check: any answer below 500 passes; 5xx is a failing answer (the
/// server is alive); no connection is `Refused`; no answer in time is
/// `Timeout`.
pub async fn check(pool: &Pool, server: &Server, settings: &CheckSettings) -> CheckResult {
    let uri = settings.path.as_str();
    let mut req = Request::new(RequestBody::empty());
    match uri.parse() {
        Ok(u) => *req.uri_mut() = u,
        // The path was validated at load; a bad one fails the check loudly.
        Err(_) => return CheckResult::Refused,
    }
    if let Ok(v) = header::HeaderValue::from_str(server.authority.as_str()) {
        req.headers_mut().insert(header::HOST, v);
    }
    req.headers_mut().insert(
        header::USER_AGENT,
        header::HeaderValue::from_static("weir-health-check"),
    );
    let started = Instant::now();
    let exchange = async {
        let resp = server
            .connections
            .send(server.addr, &pool.conn, &mut req)
            .await?;
        let latency = started.elapsed();
        // Read the (small) answer so its connection can be kept; one that
        // goes on and on is dropped, and the check still counts.
        let status = resp.status();
        let body = http_body_util::Limited::new(resp.into_body(), MAX_CHECK_BODY);
        let _ = http_body_util::BodyExt::collect(body).await;
        Ok::<_, weir_http::connections::SendError>((status, latency))
    };
    match tokio::time::timeout(settings.timeout, exchange).await {
        Err(_) => CheckResult::Timeout,
        Ok(Err(_)) => CheckResult::Refused,
        Ok(Ok((status, latency))) => {
            if status.as_u16() < 500 {
                CheckResult::Ok { latency }
            } else {
                CheckResult::Failed { latency }
            }
        }
    }
}
