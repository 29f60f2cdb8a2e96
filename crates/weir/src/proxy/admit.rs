//! The admission phase: a slot in the pool's queue, in the lane the
//! request's proof buys (`admission`), or a reason to shed it; and what each
//! forwarded request tells the queue's adaptive limit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Response, StatusCode};
use weir_http::connections::UpstreamBody;

use super::Routed;
use super::challenging::page_at_admission;
use super::exchange::Exchange;
use super::log::Place;
use crate::admission::{AdmissionQueue, Lane, Standing};
use crate::challenge::Challenger;
use crate::gateway::ClassAdmission;
use crate::identity::ClientAddr;
use crate::observe::metrics::Metrics;
use crate::policy::route::RequestView;
use crate::policy::{Admitted, ChallengeInstead, PageWhen, RejectReason};
use crate::upstream::{ForwardError, Pool};

/// **Admission phase**: after the policy admitted the request (and after
/// coalescing: a follower never reaches it), before any server is picked.
/// Whether the request may go to `pool` now, waits for a slot (in the lane
/// its proof buys, its learned shape gives, or a deferring rule sent it to;
/// fair by client network, or by pass for a pass holder), or is shed; a
/// pool with `admission.enabled = false` passes everything at once. Proof
/// buys priority, not entry: an unproven navigation the policy marked
/// ([`ChallengeInstead`]) gets the challenge page where it would be shed,
/// where it would wait long under pressure (under pressure or not, for a
/// learned class), or once it has waited that long (`pressure.wait`; twice
/// that where a long wait alone does not get it); a deferred request shed
/// from the lowest lane gets its rule's refusal. May change: the queue,
/// what the pool learned of the request's shape (when its answer ends), the
/// log (lane, queue time, a deferral's refusal), metrics.
/// Result: `Ok` holding the slot in the log record until the response body
/// ends, or why not (answered by the rescue, or with the page).
pub(super) async fn admission(
    ex: &mut Exchange<'_>,
    routed: &Routed<'_>,
    view: &RequestView<'_>,
    admitted: Admitted,
) -> Result<(), Unadmitted> {
    let pool = &routed.pool;
    let Some(queue) = &pool.admission else {
        return Ok(());
    };
    let now = tokio::time::Instant::now();
    let mut place = place(ex, queue, &routed.class, &admitted, now);
    let ask = admitted.challenge.zip(ex.gw().challenger.as_deref());
    if let Some(ask) = ask {
        let deferred = admitted.deferred.is_some();
        match page_deadline(queue, &place, ask, deferred, now) {
            Some(deadline) => place.deadline = place.deadline.min(deadline),
            None => return Err(Unadmitted::Challenge(page_at_admission(ex, ask, view, now))),
        }
    }
    // Kept: a request the app refuses waits here again (`requeue`).
    ex.held().place = Some(place);
    match slot(ex, pool, queue, place).await {
        Ok(()) => {
            if ask.is_some_and(|(c, _)| c.engaged) {
                spared(ex.metrics(), pool);
            }
            Ok(())
        }
        Err(reason) => Err(match (ask, admitted.deferred) {
            (Some(ask), _) => Unadmitted::Challenge(page_at_admission(ex, ask, view, now)),
            (None, Some(d)) => Unadmitted::Deferred(d),
            (None, None) => Unadmitted::Reject(reason),
        }),
    }
}

/// Where a request waits for its slot in `queue`: the lane its standing
/// buys (proof, a visit weir counted, a deferring rule, else what its learned
/// shape gives), its turn in that lane ([`turn`]), whether it proved who it
/// is, and its class's deadline (or its lane's). Its shape is what its
/// answer teaches the pool (and lets the adaptive limit tell a slower mix
/// from queueing).
fn place(
    ex: &mut Exchange<'_>,
    queue: &AdmissionQueue,
    class: &ClassAdmission,
    admitted: &Admitted,
    now: tokio::time::Instant,
) -> Place {
    let shape = ex.shape();
    let class_lane = class.unproven_lane(queue, shape);
    let visit = ex.log().visit().and_then(|(v, _)| v.person());
    let proof = &admitted.proof;
    let standing = Standing {
        verified: proof.verified,
        pass: proof.pass.is_some(),
        bot: proof.bot.is_some(),
        deferred: admitted.deferred.is_some(),
        visit: visit.is_some(),
    };
    let lane = queue.lanes().clamp(Lane::for_request(standing, class_lane));
    let cheap = class_lane < Lane::ANONYMOUS;
    let client = ex.client().client;
    let browsing = ex.browsing().record(client, cheap, now);
    let key = turn(proof.pass, visit, browsing, client);
    Place {
        lane,
        key,
        proven: standing.verified || standing.pass || standing.bot || standing.visit,
        deadline: match class.queue_timeout {
            Some(t) => now + t,
            None => queue.deadline(lane, now),
        },
        shape,
    }
}

/// For an unproven navigation the policy marked ([`ChallengeInstead`]): how
/// long it may wait at `place` before it gets the challenge page instead,
/// or `None` when it should get the page at once.
///
/// Under pressure a person should not wait long for what a page that takes
/// a moment would get them sooner: a better lane. A navigation a rule
/// deferred (and a pass would exempt: else no challenge) waits for capacity
/// nobody else wants, which a flood the pressure does not count may never
/// leave: it is offered the page on a long wait too (people behind a
/// carrier NAT, over their /16's share, had waited out their own timeout in
/// the lowest lane behind the crawlers).
///
/// Whatever the pressure, a wait that proves long gets the page: pressure
/// engages only after `engage_after`, and a flood's first seconds had kept
/// people's searches waiting 2-3.6 s in the lowest lane, where the page and
/// the pass lane take about one. Where a long wait gets the page (under
/// pressure, or a learned class), after `pressure.wait`: the estimate
/// missed, and a person without JavaScript pays the no-script wait and the
/// page after it too (1 s, then 500 ms, then the page came past 2 s). An
/// `under_pressure` class off pressure waits twice that: a burst the app
/// works off within a second shows nobody the page. A cheap page of a
/// learned class waits its whole deadline ([`PageWhen::Refused`]).
fn page_deadline(
    queue: &AdmissionQueue,
    place: &Place,
    (c, ch): (ChallengeInstead, &Challenger),
    deferred: bool,
    now: tokio::time::Instant,
) -> Option<tokio::time::Instant> {
    let wait = ch.pressure_wait();
    let long = c.when == PageWhen::LongWait;
    if (long || deferred) && queue.expected_wait(place.lane, &place.key) > wait {
        return None;
    }
    match c.when {
        PageWhen::Refused => Some(place.deadline),
        PageWhen::TwiceTheWait => Some(now + 2 * wait),
        PageWhen::LongWait => Some(now + wait),
    }
}

/// Whose turn in its lane the request waits for. A visit whose pages say
/// a person is reading is a visitor of its own (`visit`, see
/// `crate::visit::RequestVisit::turn`): a hundred people behind one
/// carrier NAT are a hundred turns, not one. So is an address that
/// browses like a person (mostly cheap pages, `cheap` saying whether this
/// request is one), for clients that keep no cookie (`browsing`, from
/// `admission::BrowsingEvidence`). A pass holder is a turn of its own
/// under its real network ([`FairKey::of_pass`]): a pass is proof of a
/// browser, not of a person, and passes minted from one network do not
/// multiply its turn (issue 54: each had been a network of its own, and
/// crawlers that followed the no-script refresh took people's turns).
/// Everyone else shares by address prefix.
///
/// [`FairKey::of_pass`]: crate::admission::FairKey::of_pass
fn turn(
    pass: Option<u64>,
    visit: Option<u128>,
    browsing: bool,
    client: ClientAddr,
) -> crate::admission::FairKey {
    use crate::admission::FairKey;
    match (visit, pass) {
        (Some(id), _) => FairKey::of_visit(id),
        (None, _) if browsing => FairKey::of_browser(client),
        (None, Some(id)) => FairKey::of_pass(client, id),
        (None, None) => FairKey::of(client),
    }
}

/// **Requeue**: between two upstream phases, when the first found the app
/// refused an admitted idempotent read without a word ([`ForwardError::refused`]: its connection closed
/// or reset with no response byte, which is how an app whose backlog is
/// full turns requests away). Frees the request's slot as overload (the
/// adaptive limit cuts at once), then waits for a slot again, in the same
/// lane and turn and until the same deadline, so the request is sent again
/// only when the app has room under the cut limit (a retry sent at once
/// would meet the same full backlog). This is what keeps the first burst
/// in front of an app whose limit weir has not learned yet (a first start,
/// a new app) from failing with `502`s.
/// Result: `Ok` with the new slot held in the log record, or the shed's
/// reason (recorded as any shed).
pub(super) async fn requeue(
    ex: &mut Exchange<'_>,
    pool: &Pool,
    again: Place,
) -> Result<(), RejectReason> {
    // A pool without a queue has no place to wait in: sent again at once.
    let Some(queue) = &pool.admission else {
        return Ok(());
    };
    if let Some(permit) = ex.held().permit.take() {
        permit.complete(crate::admission::Outcome::Overloaded);
    }
    slot(ex, pool, queue, again).await
}

/// Waits for a slot in `place`'s lane and records it (metrics, the log's lane and
/// queue time, the permit held until the answer ends), or records the shed.
async fn slot(
    ex: &mut Exchange<'_>,
    pool: &Pool,
    queue: &AdmissionQueue,
    place: Place,
) -> Result<(), RejectReason> {
    let metrics = ex.metrics();
    let Place {
        lane,
        key,
        proven,
        deadline,
        shape,
    } = place;
    let series = metrics.admitted(&pool.name, &queue.lanes().spec(lane).name);
    ex.log_mut().in_lane(series.lane.clone());
    match queue
        .acquire_proven(lane, key, proven, deadline, Some(shape))
        .await
    {
        Ok(mut permit) => {
            permit.learn(shape);
            series.admitted.inc();
            series.wait.observe(permit.waited().as_secs_f64());
            ex.log_mut().waited(permit.waited());
            ex.held().permit = Some(permit);
            Ok(())
        }
        Err(shed) => Err(shed_reason(ex, pool, queue, &shed)),
    }
}

/// Counts a navigation served under pressure without being asked for proof
/// (`weir_challenge_spared_total`).
fn spared(metrics: &Metrics, pool: &Pool) {
    let labels = crate::observe::metrics::PoolLabels {
        pool: pool.name.clone(),
    };
    metrics.challenge_spared.get_or_create(&labels).inc();
}

/// Records a request the queue shed (metrics, the pool's busy signal, the
/// log's queue time) and names why, for the rescue's `503`.
fn shed_reason(
    ex: &mut Exchange<'_>,
    pool: &Pool,
    queue: &crate::admission::AdmissionQueue,
    shed: &crate::admission::Shed,
) -> RejectReason {
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
    ex.metrics().admission_shed.get_or_create(&labels).inc();
    ex.log_mut().waited(shed.waited);
    RejectReason::Shed {
        cause: shed.reason.into(),
        retry_after: shed.retry_after,
    }
}

/// Why the admission phase did not admit a request.
pub(super) enum Unadmitted {
    /// An unproven navigation admission would not serve promptly: the
    /// challenge page instead.
    Challenge(Box<Response<Bytes>>),
    /// A request a rule deferred, shed from its lane: refused with that
    /// rule's answer, which the rules phase reports
    /// (`deciding::deferral_refused`), not admission.
    Deferred(Box<crate::policy::rules::Deferral>),
    /// Shed (`503` + `Retry-After`, answered by the rescue).
    Reject(RejectReason),
}

/// What a forwarded request tells the adaptive limit: an answer and its
/// latency, or overload (timeout, reset, `503`), or nothing (no server, or
/// the client's own upload failed: that says nothing about the app's load).
/// A kept-alive connection closed on a request without an answer is
/// overload: it is what an app whose backlog is full does (php-fpm resets
/// past `listen.backlog`), and it came with no latency to show queueing:
/// counted as nothing, the limit would stay where the backlog overflows,
/// and its refusals reach people as 502s.
pub(super) fn admission_outcome(
    result: &Result<Box<Response<UpstreamBody>>, ForwardError>,
    upstream_time: Option<Duration>,
) -> crate::admission::Outcome {
    use crate::admission::Outcome;
    match result {
        Ok(resp) if resp.status() == StatusCode::SERVICE_UNAVAILABLE => Outcome::Overloaded,
        Ok(_) => Outcome::Answered(upstream_time.unwrap_or_default()),
        Err(e) => e.load(),
    }
}
