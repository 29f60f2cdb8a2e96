//! The admission phase: a slot in the pool's queue, in the lane the
//! request's proof buys (`admission`), or a reason to shed it; and what each
//! forwarded request tells the queue's adaptive limit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Response, StatusCode};
use weir_http::connections::UpstreamBody;
use weir_http::target::Target;

use super::log::RequestLog;
use crate::gateway::ClassAdmission;
use crate::identity::ClientId;
use crate::policy::route::RequestView;
use crate::policy::{Proof, RejectReason};
use crate::respond::Side;
use crate::upstream::{ForwardError, Pool};

/// **Admission phase**: after the policy admitted the request (and after
/// coalescing: a follower never reaches it), before any server is picked.
/// Whether the request may go to `pool` now, waits for a slot (in the lane
/// its proof buys or its learned shape gives, fair by client network), or is
/// shed with `503` + `Retry-After`; a pool with `admission.enabled = false`
/// passes everything at once. May change: the queue, what the pool learned
/// of the request's shape (when its answer ends), the log (lane, queue
/// time), metrics.
/// Result: `Ok` holding the slot in the log record until the response body
/// ends, or the reason to shed it (answered by the rescue).
pub(super) async fn admit(
    pool: &Pool,
    class: ClassAdmission,
    target: &Target,
    proof: Proof,
    client: &ClientId,
    log: &mut RequestLog,
) -> Result<(), RejectReason> {
    use crate::admission::{FairKey, Lane, Shape};
    let Some(queue) = &pool.admission else {
        return Ok(());
    };
    // Every answer teaches the pool what its shape costs (and lets the
    // adaptive limit tell a slower mix from queueing); a class without a
    // configured lane follows what was learned: expensive shapes wait in the
    // lowest lane, so cheap pages pass them.
    let shape = Shape::of(target);
    let class_lane = class.lane.unwrap_or_else(|| {
        if queue.shapes().is_expensive(shape) {
            Lane::ANONYMOUS
        } else {
            Lane::PASS
        }
    });
    let lane = queue.lanes().clamp(Lane::for_request(
        proof.verified,
        proof.pass.is_some(),
        class_lane,
    ));
    let metrics = &log.conn.rt.metrics;
    let series = metrics.admitted(&pool.name, &queue.lanes().spec(lane).name);
    log.record.lane = Some(series.lane.clone());
    let now = tokio::time::Instant::now();
    let deadline = match class.queue_timeout {
        Some(t) => now + t,
        None => queue.deadline(lane, now),
    };
    match queue
        .acquire(lane, FairKey::of(client.client), deadline)
        .await
    {
        Ok(mut permit) => {
            permit.learn(shape);
            series.admitted.inc();
            series.wait.observe(permit.waited().as_secs_f64());
            log.record.queue_time = permit.waited();
            log.permit = Some(permit);
            Ok(())
        }
        Err(shed) => Err(shed_reason(pool, queue, &shed, log)),
    }
}

/// Records a request the queue shed (metrics, the pool's busy signal, the
/// log's queue time) and names why, for the rescue's `503`.
fn shed_reason(
    pool: &Pool,
    queue: &crate::admission::AdmissionQueue,
    shed: &crate::admission::Shed,
    log: &mut RequestLog,
) -> RejectReason {
    use crate::admission::ShedReason;
    use crate::observe::metrics::ShedLabels;
    pool.shed(Instant::now());
    // A waiter may be shed from its lane to make room above it; the label
    // names the lane it was in.
    let shed_lane: Arc<str> = Arc::from(queue.lanes().spec(shed.lane).name.as_str());
    let labels = ShedLabels {
        pool: pool.name.clone(),
        lane: shed_lane,
        reason: shed.reason.as_str(),
    };
    log.conn
        .rt
        .metrics
        .admission_shed
        .get_or_create(&labels)
        .inc();
    log.record.queue_time = shed.waited;
    let reason = match shed.reason {
        ShedReason::QueueFull => "admission_queue_full",
        ShedReason::DeadlineExceeded => "admission_deadline_exceeded",
        ShedReason::LowerLaneShed => "admission_lower_lane_shed",
    };
    RejectReason::Shed {
        reason,
        retry_after: shed.retry_after,
    }
}

/// Why the admission phase did not admit a request.
pub(super) enum Unadmitted {
    /// An unproven navigation under pressure that would have been shed: the
    /// challenge page instead.
    Challenge(Box<Response<Bytes>>),
    /// Shed (`503` + `Retry-After`, answered by the rescue).
    Reject(RejectReason),
}

/// The admission phase as the request path runs it: [`admit`], where a
/// navigation the policy spared from the challenge while the app had room
/// (`spared`: the difficulty it would get, and the challenge) waits only the
/// challenge's `pressure_wait` and, if it would be shed, gets the page
/// instead; admitted, it is counted in `weir_challenge_spared_total`.
pub(super) async fn admission(
    pool: &Pool,
    mut class: ClassAdmission,
    view: &RequestView<'_>,
    proof: Proof,
    spared: Option<(u8, &crate::challenge::Challenger)>,
    client: &ClientId,
    log: &mut RequestLog,
) -> Result<(), Unadmitted> {
    if let Some((_, ch)) = spared {
        let wait = ch.pressure_wait();
        class.queue_timeout = Some(class.queue_timeout.map_or(wait, |t| t.min(wait)));
    }
    match (
        admit(pool, class, view.target, proof, client, log).await,
        spared,
    ) {
        (Ok(()), None) => Ok(()),
        (Ok(()), Some(_)) => {
            let labels = crate::observe::metrics::PoolLabels {
                pool: pool.name.clone(),
            };
            log.conn
                .rt
                .metrics
                .challenge_spared
                .get_or_create(&labels)
                .inc();
            Ok(())
        }
        (Err(RejectReason::Shed { .. }), Some((difficulty, ch))) => {
            let now = std::time::SystemTime::now();
            let page = ch.page(view.target, client, view.headers, difficulty, now);
            Err(Unadmitted::Challenge(Box::new(page)))
        }
        (Err(reason), _) => Err(Unadmitted::Reject(reason)),
    }
}

/// What a forwarded request tells the adaptive limit: an answer and its
/// latency, or overload (timeout, reset, `503`), or nothing (no server, or
/// the client's own upload failed: that says nothing about the app's load).
pub(super) fn admission_outcome(
    result: &Result<Response<UpstreamBody>, ForwardError>,
    upstream_time: Option<Duration>,
) -> crate::admission::Outcome {
    use crate::admission::Outcome;
    use crate::respond::Reason as _;
    match result {
        Ok(resp) if resp.status() == StatusCode::SERVICE_UNAVAILABLE => Outcome::Overloaded,
        Ok(_) => Outcome::Answered(upstream_time.unwrap_or_default()),
        Err(e) if e.side() == Side::Client => Outcome::Abandoned,
        Err(ForwardError::Timeout { .. } | ForwardError::Exchange { .. }) => Outcome::Overloaded,
        Err(_) => Outcome::Abandoned,
    }
}
