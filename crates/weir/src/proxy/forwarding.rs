//! **Upstream phase**: the request made what was decided on, sent with
//! failover within the retry budget, and sent once more when the app
//! refused it without a word (after waiting for a slot again).
//!
//! The stages do the work (`upstream::forward`, `upstream::pool`); this
//! phase records what happened in the request's log and the pool's
//! metrics and health. A failure is returned typed, for the respond phase
//! to answer by its side: the app's with 502/504, the client's own upload
//! with 400/408.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header;
use http::{Request, Response, Version};
use weir_http::body::RequestBody;
use weir_http::connections::UpstreamBody;

use super::Routed;
use super::exchange::Exchange;
use super::log::Place;
use crate::observe::metrics::Metrics;
use crate::observe::metrics::{PoolErrorLabels, PoolLabels};
use crate::policy::RejectReason;
use crate::policy::route::Route;
use crate::respond::{Reason, Side};
use crate::upstream::forward::{self, ForwardError, Hop, strip_hop_by_hop};
use crate::upstream::{NoServer, Pool, ServerGuard};

/// **Upstream phase**: after admission gave the request a slot and
/// [`as_decided`] made it say what was decided on. Sends it with failover.
/// May change: the pool (connections, health, retry budget, the admission
/// limit), the log (server, upstream time, the admission slot and outcome).
/// Result: the upstream's response head or why there is none; for an
/// idempotent read the app refused without a word while it held a place
/// in the queue, [`Unanswered::Refused`] with that place, to wait for a
/// slot again and be sent once more (`serve` does, through
/// [`super::admit::requeue`]; the slot it held is still in the log, for
/// that to give back).
pub(super) async fn forward(
    ex: &mut Exchange<'_>,
    req: &mut Request<RequestBody>,
    routed: &Routed<'_>,
) -> Result<Box<Response<UpstreamBody>>, Unanswered> {
    let (route, pool) = (routed.route, &routed.pool);
    let timeout = route
        .settings
        .response_timeout
        .unwrap_or(pool.response_timeout);
    let result = send_with_failover(ex, pool, req, timeout).await;
    // A bodyless idempotent read goes again as it is (its head was only
    // borrowed). Not charged to the retry budget: the budget keeps retries
    // from multiplying an app's load, and this one reaches the app only in
    // a slot under the cut limit, in place of a new request. Once: the
    // place is taken.
    let refused_read = matches!(&result, Err(e) if e.refused())
        && weir_http::connections::is_idempotent_read(req.method())
        && http_body::Body::is_end_stream(req.body())
        && pool.admission.is_some();
    if refused_read
        && let Some(again) = ex.held().place.take()
        && let Err(error) = result
    {
        tracing::debug!(%error, "refused by the app; waiting for a slot again");
        let labels = PoolLabels {
            pool: pool.name.clone(),
        };
        ex.metrics().admission_requeued.get_or_create(&labels).inc();
        return Err(Unanswered::Refused {
            again: Box::new(again),
            error,
        });
    }
    let outcome = super::admit::admission_outcome(&result, ex.log().upstream_time());
    // The app has answered (or failed): the slot is free now. What follows
    // is the body at the client's pace (a download read slowly, an event
    // stream, a tunnel), which is no measure of the app's load: held to
    // the body's end, a few streams took every slot of a cut limit and
    // everyone else waited out their deadline.
    if let Some(permit) = ex.held().permit.take() {
        permit.complete(outcome);
    }
    result.map_err(Unanswered::Failed)
}

/// Makes the request say what was decided on: hop-by-hop fields gone,
/// `Expect` handled here, the canonical path and `Host`, the forwarding
/// fields, and the class's body read timeout (its bytes counted for the
/// log when it has a body). Once, before it is first sent.
pub(super) fn as_decided(ex: &mut Exchange<'_>, req: &mut Request<RequestBody>, route: &Route) {
    let (conn, target) = (ex.conn(), ex.target());
    let hop = Hop {
        client: ex.client(),
        peer_trusted: conn.edge.peer_trusted,
        proxy_source: conn.edge.proxy_source,
        tls: conn.edge.tls.is_some(),
        authority: target.authority(),
    };
    let upgrade = is_upgrade(req);
    strip_hop_by_hop(req.headers_mut(), upgrade);
    req.headers_mut().remove(header::EXPECT);
    // The pass is weir's and a secret: the app never sees it.
    if let Some(ch) = &ex.gw().challenger {
        weir_http::cookie::remove(req.headers_mut(), ch.pass_name());
    }
    // The app receives the path and host weir decided on.
    target.forward(req);
    let version = req.version();
    ex.gw().forwarding.apply(req.headers_mut(), &hop, version);
    // Counted only for a body there is: most requests have none.
    let bytes_in =
        (!http_body::Body::is_end_stream(req.body())).then(|| ex.log_mut().count_bytes_in());
    req.body_mut().watch(route.settings.body, bytes_in);
}

/// Why the upstream phase has no response for the client.
pub(super) enum Unanswered {
    /// Sending failed (no server, connect, timeout, exchange).
    Failed(ForwardError),
    /// The app refused the request without a word, and the admission queue
    /// shed it while it waited for a slot to be sent again: the shed's own
    /// `503`, as any shed.
    Shed(RejectReason),
    /// An idempotent read the app refused without a word: its place in the
    /// queue, to wait for a slot again in, and the refusal (the answer, if
    /// it is not sent again). Boxed: rare, and the place is large for
    /// every request's result to carry.
    Refused {
        again: Box<Place>,
        error: ForwardError,
    },
}

/// Sends the request; a bodyless request is re-sent once to another server,
/// within the pool's retry budget, when the connect failed (nothing reached
/// the first one) or, for an idempotent read, when a kept-alive connection
/// closed before any response. Every outcome feeds the server's health.
async fn send_with_failover(
    ex: &mut Exchange<'_>,
    pool: &Arc<Pool>,
    request: &mut Request<RequestBody>,
    timeout: Duration,
) -> Result<Box<Response<UpstreamBody>>, ForwardError> {
    let metrics = ex.metrics();
    let mut failover = Failover::of(request, pool);
    // One clock read before and one after each attempt serve every
    // timestamp and duration below (they are per request, and add up).
    let mut sent = Instant::now();
    pool.record_request(sent);
    let handles = pool
        .metrics
        .get_or_init(|| metrics.pool_handles(&pool.name));
    loop {
        // A block: what the attempt leaves (its result, large) is not held
        // across the wait for an app that did not listen.
        let refused_by = {
            let guard = pick(pool, failover.exclude(), failover.idempotent, sent, metrics)?;
            let req = failover.request(request)?;
            ex.log_mut().sent_to(guard.server.addr);
            handles.in_flight.inc();
            let res = forward::send(pool, &guard.server, req, timeout).await;
            handles.in_flight.dec();
            let took = observe_attempt(pool, &guard, &res, sent);
            let e = match res {
                Ok(resp) => {
                    handles.duration.observe(took.as_secs_f64());
                    ex.log_mut().answered_after(took);
                    ex.held().server = Some(guard);
                    return Ok(resp);
                }
                Err(e) => e,
            };
            count_failure(pool, &e, metrics);
            if !failover.waits_for_the_app(&e) {
                failover.retry(e, guard, pool, metrics)?;
                sent = Instant::now();
                continue;
            }
            guard.server.clone()
        };
        let away = failover
            .away
            .get_or_insert_with(|| NotListening::since(sent));
        away.again(pool, &refused_by).await;
        sent = Instant::now();
    }
}

/// What the failover knows across a request's attempts.
struct Failover {
    idempotent: bool,
    /// A request without a body to a pool of more than one server may go
    /// to a second one, once. It goes as it is: an attempt writes its head
    /// and leaves it whole (the connections' own resend on a stale
    /// connection relies on that too), so no copy is made up front.
    resendable: bool,
    /// The server the first attempt failed on, once it has.
    failed: Option<ServerGuard>,
    /// Only when an app did not listen.
    away: Option<NotListening>,
}

impl Failover {
    fn of(request: &Request<RequestBody>, pool: &Pool) -> Failover {
        use http_body::Body as _;
        let bodyless = request.body().is_end_stream();
        Failover {
            idempotent: weir_http::connections::is_idempotent_read(request.method()),
            resendable: bodyless && pool.servers.len() > 1,
            failed: None,
            away: None,
        }
    }

    /// The server the next attempt must not go to.
    fn exclude(&self) -> Option<&Arc<crate::upstream::Server>> {
        let skip = self.away.as_ref().and_then(|a| a.skip.as_ref());
        self.failed.as_ref().map(|g| &g.server).or(skip)
    }

    /// What the next attempt sends: the request, on a retry only if it
    /// may be sent again.
    fn request<'r>(
        &self,
        request: &'r mut Request<RequestBody>,
    ) -> Result<&'r mut Request<RequestBody>, ForwardError> {
        if self.failed.is_some() && !self.resendable {
            return Err(ForwardError::NoServer);
        }
        Ok(request)
    }

    /// Whether the request waits for an app that did not listen: nothing
    /// listened, and the failover has no second server to send it to (or
    /// used it), so the request itself was never sent, body and all.
    fn waits_for_the_app(&self, e: &ForwardError) -> bool {
        let unsent = !self.resendable || self.failed.is_some();
        e.not_listening() && unsent && self.away.as_ref().is_none_or(|a| a.may_wait())
    }

    /// After attempt on `guard` failed with `e`: another server, if the
    /// request may go once more and the pool's budget allows; else `e`.
    fn retry(
        &mut self,
        e: ForwardError,
        guard: ServerGuard,
        pool: &Pool,
        metrics: &Metrics,
    ) -> Result<(), ForwardError> {
        let once_more = e.retryable(self.idempotent) && self.failed.is_none();
        if !once_more || !self.resendable || !retry_allowed(pool, metrics) {
            return Err(e);
        }
        tracing::debug!(error = %e, "trying another server");
        self.failed = Some(guard);
        Ok(())
    }
}

/// The server for the next attempt, or why there is none (counted as the
/// pool's failure).
fn pick(
    pool: &Pool,
    exclude: Option<&Arc<crate::upstream::Server>>,
    idempotent: bool,
    now: Instant,
    metrics: &Metrics,
) -> Result<ServerGuard, ForwardError> {
    pool.pick(exclude, idempotent, now).map_err(|none| {
        let e = match none {
            NoServer::AllDead => ForwardError::NoHealthyServer,
            NoServer::Exhausted => ForwardError::NoServer,
        };
        count_failure(pool, &e, metrics);
        e
    })
}

/// Feeds an attempt's outcome to its server's health; returns the app's
/// time for it.
fn observe_attempt(
    pool: &Pool,
    guard: &ServerGuard,
    res: &Result<Box<Response<UpstreamBody>>, ForwardError>,
    sent: Instant,
) -> Duration {
    let answered = Instant::now();
    let took = app_time(res, sent, answered);
    if let Some(outcome) = health_outcome(res, took) {
        let others = guard.server.in_flight().saturating_sub(1);
        pool.observe_request(&guard.server, answered, outcome, others);
    }
    took
}

/// The app's own time for an exchange sent at `sent` and answered (or
/// failed) at `answered`: from the request sent whole to its answer (an
/// upload's pace is the client's, and says nothing of the app).
fn app_time(
    res: &Result<Box<Response<UpstreamBody>>, ForwardError>,
    sent: Instant,
    answered: Instant,
) -> Duration {
    let from = match res {
        Ok(resp) => resp.body().request_body_sent().unwrap_or(sent),
        Err(_) => sent,
    };
    answered.saturating_duration_since(from)
}

/// A request that met no listener: the app is restarting (a deploy), or
/// gone. Nothing was sent, so it may try again without loading the app:
/// another server at once if the pool has one, else the same one after a
/// wait that backs off, until [`APP_RETURN_WAIT`]. A deploy behind weir had
/// cost visitors more than the same deploy without it: their kept-alive
/// connections to weir outlived the app's restart, and each of their
/// requests met it as a `502`.
struct NotListening {
    since: Instant,
    backoff: Duration,
    /// The server that refused, skipped once for another.
    skip: Option<Arc<crate::upstream::Server>>,
}

impl NotListening {
    fn since(now: Instant) -> NotListening {
        NotListening {
            since: now,
            backoff: APP_BACKOFF_FIRST,
            skip: None,
        }
    }

    /// Whether the request may still wait for the app.
    fn may_wait(&self) -> bool {
        self.since.elapsed() < APP_RETURN_WAIT
    }

    /// Before trying again after `server` refused: another server at once,
    /// if there is one; else a wait.
    async fn again(&mut self, pool: &Pool, server: &Arc<crate::upstream::Server>) {
        self.skip = match self.skip.take() {
            None if pool.servers.len() > 1 => Some(server.clone()),
            _ => {
                tokio::time::sleep(self.backoff).await;
                self.backoff = (self.backoff * 2).min(APP_BACKOFF_MAX);
                None
            }
        };
    }
}

/// How long a request waits for an app that is not listening (a restart)
/// before its `502`, and how it backs off meanwhile: a deploy's gap is well
/// under it; an app that is down for good costs each request this much.
const APP_RETURN_WAIT: Duration = Duration::from_secs(2);

const APP_BACKOFF_FIRST: Duration = Duration::from_millis(25);

const APP_BACKOFF_MAX: Duration = Duration::from_millis(400);

/// Counts a failed exchange: the app's in `weir_upstream_errors_total`; the
/// client's own upload failing is not the server's error (and must not
/// page whoever watches upstream errors).
fn count_failure(pool: &Pool, e: &ForwardError, metrics: &Metrics) {
    if e.side() == Side::Client {
        metrics.connection_error(e.kind());
    } else {
        metrics
            .upstream_errors
            .get_or_create(&PoolErrorLabels {
                pool: pool.name.clone(),
                kind: e.kind(),
            })
            .inc();
    }
}

/// Whether the pool's retry budget allows one more attempt, counted either way.
fn retry_allowed(pool: &Pool, metrics: &Metrics) -> bool {
    let labels = PoolLabels {
        pool: pool.name.clone(),
    };
    if pool.try_retry(Instant::now()) {
        metrics.upstream_retries.get_or_create(&labels).inc();
        true
    } else {
        metrics.upstream_retries_denied.get_or_create(&labels).inc();
        false
    }
}

/// What one exchange says about the server's health; `None` when it says
/// nothing (the client's upload stalled or stopped).
fn health_outcome(
    res: &Result<Box<Response<UpstreamBody>>, ForwardError>,
    took: Duration,
) -> Option<crate::upstream::health::RequestOutcome> {
    use crate::upstream::health::RequestOutcome;
    match res {
        Ok(_) => Some(RequestOutcome::Answered { latency: took }),
        Err(e) => e.health(),
    }
}

/// Whether an HTTP/1.1 request asks to switch protocols (`Upgrade` named
/// in `Connection`).
pub(super) fn is_upgrade(req: &Request<RequestBody>) -> bool {
    req.version() == Version::HTTP_11
        && req.headers().contains_key(header::UPGRADE)
        && req
            .headers()
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}
