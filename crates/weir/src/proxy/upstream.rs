//! The upstream phases: coalescing (identical anonymous GETs share one
//! upstream request), forwarding (the request made what was decided on, sent
//! with failover within the retry budget), and the response made the
//! client's (hop-by-hop fields, upgrades, a coalescing leader's buffering,
//! the client's protocol version).
//!
//! The stages do the work (`admission::coalesce`, `upstream::forward`,
//! `upstream::pool`); these phases record what happened in the request's log
//! and the pool's metrics. A failure is answered by the rescue from its
//! typed reason, by its side: the app's with 502/504, the client's own
//! upload with 400/408.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header;
use http::{Request, Response, StatusCode, Version};
use weir_http::body::{RequestBody, ResponseBody};
use weir_http::connections::UpstreamBody;
use weir_http::server::ClientUpgrade;
use weir_http::target::Target;

use super::ConnCtx;
use super::log::RequestLog;
use crate::admission::coalesce::{CoalesceKey, Leader, Role, SharedResponse, shareable};
use crate::gateway::{ClassAdmission, Gateway};
use crate::identity::ClientId;
use crate::observe::metrics::{ClassLabels, PoolErrorLabels, PoolLabels};
use crate::policy::route::Route;
use crate::policy::{Proof, RejectReason, ShedCause};
use crate::respond::{Accepts, Reason, Side};
use crate::runtime::Runtime;
use crate::upstream::forward::{self, ForwardError, Hop, strip_hop_by_hop};
use crate::upstream::{NoServer, Pool, ServerGuard};

/// A routed request's destination: its route, the pool it names and the
/// class's admission settings (looked up once, read by every later phase).
pub(super) struct Routed<'a> {
    pub route: &'a Route,
    pub pool: Arc<Pool>,
    pub class: ClassAdmission,
}

impl<'a> Routed<'a> {
    pub fn new(route: &'a Route, gw: &Gateway) -> Routed<'a> {
        Routed {
            route,
            pool: gw.pools[route.pool].clone(),
            class: gw
                .class_admission
                .get(route.class.as_str())
                .copied()
                .unwrap_or_default(),
        }
    }
}

/// How a request joined request coalescing.
pub(super) enum Coalesced {
    /// Not coalesced: a personal request, a body, a class without it.
    Alone,
    /// The first of its key: it goes upstream, and its response is shared
    /// if it can be (bodies up to the byte cap). Boxed: rare, and large.
    Leader(Box<Leader>, usize),
    /// Its leader's response, to answer with a copy: no upstream request.
    Shared(Arc<SharedResponse>),
}

impl Coalesced {
    /// The group this request leads, if it leads one.
    pub fn leader(self) -> Option<(Box<Leader>, usize)> {
        match self {
            Coalesced::Leader(leader, max) => Some((leader, max)),
            Coalesced::Alone | Coalesced::Shared(_) => None,
        }
    }
}

/// What the respond phase needs of the request, taken before it is sent
/// (the upstream phase changes its head): the client's protocol version,
/// its side of an upgrade, and the coalescing group it leads.
pub(super) struct Answer {
    version: Version,
    upgrade: Option<ClientUpgrade>,
    leader: Option<(Box<Leader>, usize)>,
}

impl Answer {
    pub fn of(req: &mut Request<RequestBody>, leader: Option<(Box<Leader>, usize)>) -> Answer {
        Answer {
            version: req.version(),
            upgrade: is_upgrade(req).then(|| ClientUpgrade::on(req)),
            leader,
        }
    }
}

/// **Coalescing phase**: after the policy (rules see and count every
/// request, followers too), before admission (a follower waits for its
/// leader holding no admission slot and no server, so a storm on one page
/// costs one worker). Only anonymous requests coalesce: no verified session,
/// no pass, no body, and (the key refuses them) no `Cookie`,
/// `Authorization`, `Range`, `Upgrade` or condition. A follower whose
/// leader's response cannot be shared goes upstream itself, through
/// admission like any request. May change: the coalescer, the log's
/// `coalesced`.
pub(super) async fn coalesce(
    req: &Request<RequestBody>,
    target: &Target,
    routed: &Routed<'_>,
    proof: Proof,
    gw: &Gateway,
    log: &mut RequestLog,
) -> Coalesced {
    let (Some(max), Some(coalescer)) = (
        routed.class.coalesce_max_body,
        gw.coalescers.get(routed.route.class.as_str()),
    ) else {
        return Coalesced::Alone;
    };
    if proof != Proof::default() || !http_body::Body::is_end_stream(req.body()) {
        return Coalesced::Alone;
    }
    let Some(key) = CoalesceKey::for_request(target, req.headers()) else {
        return Coalesced::Alone;
    };
    match coalescer.join(key.in_pool(&routed.pool.name)) {
        Role::Leader(l) => {
            log.record.coalesced = Some("leader");
            Coalesced::Leader(Box::new(l), max)
        }
        Role::Follower(f) => match f.wait().await {
            Some(shared) => Coalesced::Shared(shared),
            None => {
                log.record.coalesced = Some("unshared");
                Coalesced::Alone
            }
        },
    }
}

/// **Upstream phase**: after admission gave the request a slot. Makes the
/// request say what was decided on (hop-by-hop fields gone, `Expect`
/// handled here, the canonical path and `Host`, the forwarding fields, the
/// class's body read timeout), then sends it with failover; an idempotent
/// read the app refused without a word is sent once more after waiting for
/// a slot again ([`super::admit::requeue`]). May change: the request, the
/// pool (connections, health, retry budget, the admission limit), the log
/// (server, upstream time, queue time, the admission slot and outcome).
/// Result: the upstream's response head, or why there is none.
pub(super) async fn forward(
    req: &mut Request<RequestBody>,
    target: &Target,
    client: &ClientId,
    routed: &Routed<'_>,
    conn: &ConnCtx,
    gw: &Gateway,
    log: &mut RequestLog,
) -> Result<Response<UpstreamBody>, Unanswered> {
    let (route, pool) = (routed.route, &routed.pool);
    let hop = Hop {
        client,
        peer_trusted: conn.edge.peer_trusted,
        proxy_source: conn.edge.proxy_source,
        tls: conn.edge.tls.is_some(),
        authority: target.authority(),
    };
    let upgrade = is_upgrade(req);
    strip_hop_by_hop(req.headers_mut(), upgrade);
    req.headers_mut().remove(header::EXPECT);
    // The app receives the path and host weir decided on.
    target.forward(req);
    let version = req.version();
    gw.forwarding.apply(req.headers_mut(), &hop, version);
    // Counted only for a body there is: most requests have none.
    let bytes_in = (!http_body::Body::is_end_stream(req.body()))
        .then(|| log.bytes_in.insert(Arc::default()).clone());
    req.body_mut().watch(route.settings.body, bytes_in);
    let timeout = route
        .settings
        .response_timeout
        .unwrap_or(pool.response_timeout);
    let mut result = send_with_failover(pool, req, timeout, log, &conn.rt).await;
    // An idempotent read the app refused without a word waits for a slot
    // again and is sent once more (a bodyless GET as it is: its head was
    // only borrowed). Not charged to the retry budget: the budget keeps
    // retries from multiplying an app's load, and this one reaches the app
    // only in a slot under the cut limit, in place of a new request.
    if let Err(e) = &result
        && e.refused()
        && weir_http::connections::is_idempotent_read(req.method())
        && http_body::Body::is_end_stream(req.body())
        && let (Some(queue), Some(again)) = (&pool.admission, log.held.place.take())
    {
        tracing::debug!(error = %e, "refused by the app; waiting for a slot again");
        let labels = PoolLabels {
            pool: pool.name.clone(),
        };
        conn.rt
            .metrics
            .admission_requeued
            .get_or_create(&labels)
            .inc();
        // Boxed: rare, and its wait would enlarge every request's future.
        // Shed while it waited: no slot is held, nothing to tell the limit.
        Box::pin(super::admit::requeue(pool, queue, again, log))
            .await
            .map_err(Unanswered::Shed)?;
        result = send_with_failover(pool, req, timeout, log, &conn.rt).await;
    }
    let outcome = super::admit::admission_outcome(&result, log.record.upstream_time);
    // The app has answered (or failed): the slot is free now. What follows
    // is the body at the client's pace (a download read slowly, an event
    // stream, a tunnel), which is no measure of the app's load: held to
    // the body's end, a few streams took every slot of a cut limit and
    // everyone else waited out their deadline.
    if let Some(permit) = log.held.permit.take() {
        permit.complete(outcome);
    }
    result.map_err(Unanswered::Failed)
}

/// Why the upstream phase has no response for the client.
pub(super) enum Unanswered {
    /// Sending failed (no server, connect, timeout, exchange).
    Failed(ForwardError),
    /// The app refused the request without a word, and the admission queue
    /// shed it while it waited for a slot to be sent again: the shed's own
    /// `503`, as any shed.
    Shed(RejectReason),
}

/// **Respond phase**: after the upstream phase. The upstream's response
/// made the client's: hop-by-hop fields removed, an agreed upgrade turned
/// into a tunnel, a coalescing leader's body buffered and shared, the
/// client's protocol version. A failure is answered by the rescue from its
/// reason. Result: the response; the log record goes with its body, and is
/// written when the body ends.
pub(super) async fn respond(
    result: Result<Response<UpstreamBody>, Unanswered>,
    answer: Answer,
    conn: &ConnCtx,
    mut log: Box<RequestLog>,
    accept: Accepts,
) -> Response<ResponseBody> {
    let Answer {
        version: client_version,
        upgrade: client_upgrade,
        leader,
    } = answer;
    let mut resp = match result {
        Ok(resp) => resp,
        Err(Unanswered::Shed(reason)) => return log.answer(&reason, accept),
        Err(Unanswered::Failed(ForwardError::NoHealthyServer)) => {
            let reason = RejectReason::Shed {
                cause: ShedCause::NoHealthyServer,
                retry_after: Duration::from_secs(1),
            };
            return log.answer(&reason, accept);
        }
        Err(Unanswered::Failed(e)) => {
            log.record.error = Some(e.to_string());
            return log.answer(&e, accept);
        }
    };
    log.record.upstream_status = Some(resp.status().as_u16());
    let is_101 = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
    if is_101 && client_upgrade.is_none() {
        // A switch no one asked for: the client would get a connection it
        // cannot speak on (and the app's end of it is closed with `resp`).
        return log.answer(&AppFault::UnaskedUpgrade, accept);
    }
    strip_hop_by_hop(resp.headers_mut(), is_101 && client_upgrade.is_some());
    if is_101
        && let Some(client_upgrade) = client_upgrade
        && let Some((upstream, early)) = resp.body_mut().take_tunnel()
    {
        let tunnel_guard = conn.edge.guard.clone();
        tokio::spawn(async move {
            client_upgrade.tunnel(upstream, early).await;
            drop(tunnel_guard);
        });
    }
    let (mut parts, body) = resp.into_parts();
    let body = match leader {
        // Boxed: rare, and large for every request's future to carry.
        Some((leader, max)) => match Box::pin(lead(*leader, &mut parts, body, max)).await {
            Ok(b) => b,
            Err(e) => {
                log.record.error = Some(format!("upstream body: {e}"));
                return log.answer(&AppFault::BodyCut, accept);
            }
        },
        None => ResponseBody::upstream(body),
    };
    // The client gets its own protocol version, whatever the upstream spoke.
    parts.version = client_version;
    log.record.status = parts.status.as_u16();
    log.stamp(&mut parts.headers);
    if log.visit.is_some() {
        // A plain response's fields are not in the map (weir_http::fields).
        use weir_http::server::Outgoing as _;
        let received = body.received_fields().map(|r| r.values("cache-control"));
        let shared = crate::visit::shared_cacheable_map(&parts.headers)
            || received.is_some_and(crate::visit::shared_cacheable);
        log.visit_cookie(Some((parts.status, shared)), &mut parts.headers);
    }
    Response::from_parts(parts, body.on_complete(log))
}

/// An answer from the app that cannot be passed on: 502.
enum AppFault {
    /// `101 Switching Protocols` to a request that asked for no upgrade.
    UnaskedUpgrade,
    /// A coalescing leader's upstream body failed while it was buffered.
    BodyCut,
}

impl Reason for AppFault {
    fn status(&self) -> StatusCode {
        StatusCode::BAD_GATEWAY
    }
    fn label(&self) -> &str {
        match self {
            AppFault::UnaskedUpgrade => "unasked_upgrade",
            AppFault::BodyCut => "upstream_body",
        }
    }
    fn message(&self) -> String {
        match self {
            AppFault::UnaskedUpgrade => "the application switched protocols without being asked",
            AppFault::BodyCut => "the application's answer was cut",
        }
        .into()
    }
    fn side(&self) -> Side {
        Side::Upstream
    }
    fn templated(&self) -> bool {
        false
    }
}

/// A coalescing leader's response: buffered and published to its followers
/// when shareable, streamed to this client alone otherwise. A body without a
/// known length (chunked) is read until it ends or passes the cap; past the
/// cap, this client gets what was read followed by the rest, and the
/// followers go upstream themselves. A body error drops the leader, which
/// sends the followers upstream too.
async fn lead(
    leader: Leader,
    parts: &mut http::response::Parts,
    mut body: UpstreamBody,
    max: usize,
) -> Result<ResponseBody, weir_http::body::BoxError> {
    use http_body::Body as _;
    use http_body_util::BodyExt as _;
    // Shareable or not is read from the fields, and followers get a copy.
    body.fields_into(&mut parts.headers);
    let known = body
        .size_hint()
        .exact()
        .and_then(|n| usize::try_from(n).ok());
    let len_fits = known.is_none_or(|n| n <= max);
    if !len_fits || !shareable(parts.status, &parts.headers, 0, max) {
        leader.finish(None);
        return Ok(ResponseBody::upstream(body));
    }
    let mut read = std::collections::VecDeque::new();
    let mut bytes = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        match frame.data_ref() {
            Some(d) if bytes.len() + d.len() <= max => bytes.extend_from_slice(d),
            // Past the cap, or trailers: not shared; this client still gets
            // every byte, in order.
            _ => {
                leader.finish(None);
                if !bytes.is_empty() {
                    read.push_back(http_body::Frame::data(bytes.freeze()));
                }
                read.push_back(frame);
                return Ok(ResponseBody::resumed(read, body));
            }
        }
    }
    let bytes = bytes.freeze();
    leader.finish(Some(SharedResponse {
        status: parts.status,
        headers: parts.headers.clone(),
        body: bytes.clone(),
    }));
    Ok(ResponseBody::full(bytes))
}

/// A coalescing follower's answer: a copy of its leader's response.
pub(super) fn shared_response(
    shared: &SharedResponse,
    mut log: Box<RequestLog>,
    req: &Request<RequestBody>,
) -> Response<ResponseBody> {
    let version = req.version();
    log.record.coalesced = Some("shared");
    log.record.status = shared.status.as_u16();
    let labels = ClassLabels {
        class: log.record.class.clone(),
    };
    log.conn
        .rt
        .metrics
        .coalesced_requests
        .get_or_create(&labels)
        .inc();
    let mut headers = shared.headers.clone();
    log.stamp(&mut headers);
    let cacheable = crate::visit::shared_cacheable_map(&headers);
    log.visit_cookie(Some((shared.status, cacheable)), &mut headers);
    let body = ResponseBody::full(shared.body.clone()).on_complete(log);
    let mut resp = Response::new(body);
    *resp.status_mut() = shared.status;
    *resp.version_mut() = version;
    *resp.headers_mut() = headers;
    resp
}

/// Sends the request; a bodyless request is re-sent once to another server,
/// within the pool's retry budget, when the connect failed (nothing reached
/// the first one) or, for an idempotent read, when a kept-alive connection
/// closed before any response. Every outcome feeds the server's health.
async fn send_with_failover(
    pool: &Arc<Pool>,
    request: &mut Request<RequestBody>,
    timeout: Duration,
    log: &mut RequestLog,
    rt: &Runtime,
) -> Result<Response<UpstreamBody>, ForwardError> {
    use http_body::Body as _;
    let idempotent = weir_http::connections::is_idempotent_read(request.method());
    // At most one retry: the copy it will send, made while the request is
    // whole. Boxed: the request's future stays small for the common case.
    let mut retry_copy = (request.body().is_end_stream() && pool.servers.len() > 1)
        .then(|| Box::new(weir_http::body::copy_bodyless(request)));
    // One clock read before and one after each attempt serve every
    // timestamp and duration below (they are per request, and add up).
    let mut sent = Instant::now();
    pool.record_request(sent);
    let mut failed: Option<ServerGuard> = None;
    // Only when an app did not listen.
    let mut away: Option<NotListening> = None;
    loop {
        // A block: what the attempt leaves (its result, large) is not held
        // across the wait for an app that did not listen.
        let refused_by = {
            let skip = away.as_ref().and_then(|a| a.skip.as_ref());
            let exclude = failed.as_ref().map(|g| &g.server).or(skip);
            let guard = pick(pool, exclude, idempotent, sent, rt)?;
            // The copy is only taken on a retry, which requires it.
            let req = match (&failed, retry_copy.as_deref_mut()) {
                (None, _) => &mut *request,
                (Some(_), Some(copy)) => copy,
                (Some(_), None) => return Err(ForwardError::NoServer),
            };
            log.record.upstream = Some(guard.server.addr);
            let handles = pool
                .metrics
                .get_or_init(|| rt.metrics.pool_handles(&pool.name));
            handles.in_flight.inc();
            let res = forward::send(pool, &guard.server, req, timeout).await;
            handles.in_flight.dec();
            let took = observe_attempt(pool, &guard, &res, sent);
            match res {
                Ok(resp) => {
                    handles.duration.observe(took.as_secs_f64());
                    log.record.upstream_time = Some(took);
                    log.held.server = Some(guard);
                    return Ok(resp);
                }
                // Nothing listened, and the failover below has no copy to send
                // (or was used): the request itself was never sent, body and all.
                Err(e)
                    if e.not_listening()
                        && (retry_copy.is_none() || failed.is_some())
                        && away.as_ref().is_none_or(|a| a.may_wait()) =>
                {
                    count_failure(pool, &e, rt);
                    guard.server.clone()
                }
                Err(e) => {
                    count_failure(pool, &e, rt);
                    let can_retry =
                        e.retryable(idempotent) && failed.is_none() && retry_copy.is_some();
                    if !can_retry || !retry_allowed(pool, rt) {
                        return Err(e);
                    }
                    tracing::debug!(error = %e, "trying another server");
                    failed = Some(guard);
                    sent = Instant::now();
                    continue;
                }
            }
        };
        let away = away.get_or_insert_with(|| NotListening::since(sent));
        away.again(pool, &refused_by).await;
        sent = Instant::now();
    }
}

/// The server for the next attempt, or why there is none (counted as the
/// pool's failure).
fn pick(
    pool: &Pool,
    exclude: Option<&Arc<crate::upstream::Server>>,
    idempotent: bool,
    now: Instant,
    rt: &Runtime,
) -> Result<ServerGuard, ForwardError> {
    pool.pick(exclude, idempotent, now).map_err(|none| {
        let e = match none {
            NoServer::AllDead => ForwardError::NoHealthyServer,
            NoServer::Exhausted => ForwardError::NoServer,
        };
        count_failure(pool, &e, rt);
        e
    })
}

/// Feeds an attempt's outcome to its server's health; returns the app's
/// time for it.
fn observe_attempt(
    pool: &Pool,
    guard: &ServerGuard,
    res: &Result<Response<UpstreamBody>, ForwardError>,
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
    res: &Result<Response<UpstreamBody>, ForwardError>,
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
fn count_failure(pool: &Pool, e: &ForwardError, rt: &Runtime) {
    if e.side() == Side::Client {
        rt.metrics.connection_error(e.kind());
    } else {
        rt.metrics
            .upstream_errors
            .get_or_create(&PoolErrorLabels {
                pool: pool.name.clone(),
                kind: e.kind(),
            })
            .inc();
    }
}

/// Whether the pool's retry budget allows one more attempt, counted either way.
fn retry_allowed(pool: &Pool, rt: &Runtime) -> bool {
    let labels = PoolLabels {
        pool: pool.name.clone(),
    };
    if pool.try_retry(Instant::now()) {
        rt.metrics.upstream_retries.get_or_create(&labels).inc();
        true
    } else {
        rt.metrics
            .upstream_retries_denied
            .get_or_create(&labels)
            .inc();
        false
    }
}

/// What one exchange says about the server's health; `None` when it says
/// nothing (the client's upload stalled or stopped).
fn health_outcome(
    res: &Result<Response<UpstreamBody>, ForwardError>,
    took: Duration,
) -> Option<crate::upstream::health::RequestOutcome> {
    use crate::upstream::health::RequestOutcome;
    match res {
        Ok(_) => Some(RequestOutcome::Answered { latency: took }),
        Err(e) => e.health(),
    }
}

fn is_upgrade(req: &Request<RequestBody>) -> bool {
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
