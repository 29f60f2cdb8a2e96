//! The request path: one function that runs the stages in order.
//!
//! ```text
//! handle ─► identity ─► policy ─► upstream ─► response
//!   │        ClientId    Route,     pool,        │
//!   │                    Decision   server       ▼
//!   └──────────────────────────────────────► observe (on body end)
//! ```
//!
//! Each stage hands the next a typed value. [`reject`] is the one place that
//! turns a rejection or failure into a response; [`RequestLog`] is the one
//! place that writes the access log and request metrics, when the response
//! body ends, so the log's bytes and durations are true.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode, Version};

use crate::admission::coalesce::{CoalesceKey, Leader, Role, SharedResponse, shareable};
use crate::edge::inflight::InFlightGuard;
use crate::edge::{ConnGuard, ConnState, Connection, EdgeSettings, ListenerSpec, Service};
use crate::identity::forwarded;
use crate::identity::session::SessionState;
use crate::identity::{ClientId, PeerAddr};
use crate::observe::access_log::AccessRecord;
use crate::observe::metrics::{ClassLabels, PoolErrorLabels, PoolLabels, RuleLabels};
use crate::policy::route::RequestView;
use crate::policy::{Decision, RejectReason};
use crate::runtime::Runtime;
use crate::upstream::forward::{self, ForwardError, Hop, strip_hop_by_hop};
use crate::upstream::{NoServer, Pool, ServerGuard};
use weir_http::body::{OnComplete, RequestBody, ResponseBody};
use weir_http::connections::UpstreamBody;
use weir_http::server::{ClientUpgrade, Handler};
use weir_http::target::Target;

/// The proxy as the edge's [`Service`]: a handler per connection, over the
/// gateway in force.
pub struct Proxy {
    rt: Arc<Runtime>,
}

impl Proxy {
    pub fn new(rt: Arc<Runtime>) -> Proxy {
        Proxy { rt }
    }
}

impl Service for Proxy {
    type Handler = ConnHandler;

    fn listener(&self, index: usize) -> Option<(ListenerSpec, EdgeSettings)> {
        let gw = self.rt.gateway.load();
        gw.listeners.get(index).map(|l| (l.clone(), gw.edge))
    }

    fn trusts(&self, peer: IpAddr) -> bool {
        self.rt.gateway.load().trusted.contains(peer)
    }

    fn connection(&self, c: Connection) -> ConnHandler {
        ConnHandler(Arc::new(ConnCtx {
            peer: c.peer,
            peer_trusted: c.peer_trusted,
            proxy_source: c.proxy_source,
            tls: c.tls,
            state: c.state,
            guard: c.guard,
            rt: self.rt.clone(),
        }))
    }
}

/// The requests of one connection, served by [`handle`].
#[derive(Clone)]
pub struct ConnHandler(Arc<ConnCtx>);

impl Handler for ConnHandler {
    type RequestBody = RequestBody;
    type ResponseBody = ResponseBody;

    fn handle(
        &self,
        req: Request<RequestBody>,
    ) -> impl Future<Output = Box<Response<ResponseBody>>> + Send + use<> {
        handle(req, self.0.clone())
    }

    fn buffers_released(&self) {
        self.0.rt.metrics.connection_buffers_released.inc();
    }
}

/// What a request knows about its connection.
pub struct ConnCtx {
    pub peer: PeerAddr,
    pub peer_trusted: bool,
    /// The PROXY protocol source, believed (peer trusted).
    pub proxy_source: Option<IpAddr>,
    pub tls: bool,
    pub state: Arc<ConnState>,
    /// Keeps the connection's slots while any request or tunnel uses them.
    pub guard: Arc<ConnGuard>,
    pub rt: Arc<Runtime>,
}

/// Serves one request. Never fails: every outcome is a response.
///
/// The future lives in a box the connection holds, and its size is memory
/// touched per request (cache misses, with a thousand connections busy):
/// rare branches keep their state boxed, and no stage keeps a second copy
/// of the request.
pub fn handle(
    req: Request<RequestBody>,
    conn: Arc<ConnCtx>,
) -> impl Future<Output = Box<Response<ResponseBody>>> + Send {
    CloseWhenAsked {
        http1: req.version() != Version::HTTP_2,
        state: conn.state.clone(),
        serving: serve(req, conn),
    }
}

pin_project_lite::pin_project! {
    /// The request's answer, marked `Connection: close` when the connection
    /// is to close (a drain, an idle or shedding close): hyper then closes
    /// it after this response instead of the client sending its next
    /// request into a closing socket. (A struct, not an `async fn`, which
    /// would keep a copy of the request beside `serve`'s.)
    struct CloseWhenAsked<F> {
        #[pin]
        serving: F,
        http1: bool,
        state: Arc<ConnState>,
    }
}

impl<F> Future for CloseWhenAsked<F>
where
    F: Future<Output = Response<ResponseBody>>,
{
    /// Boxed: the HTTP/1 connection passes the answer on through its own
    /// future, whose memory is cold when many connections are busy; a
    /// pointer moves there instead of 416 bytes, several times a request.
    type Output = Box<Response<ResponseBody>>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = self.project();
        let mut resp = std::task::ready!(this.serving.poll(cx));
        if *this.http1
            && this.state.command() != crate::edge::conn::Command::None
            && resp.status() != StatusCode::SWITCHING_PROTOCOLS
        {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        std::task::Poll::Ready(Box::new(resp))
    }
}

/// The stages, in order. (An `async` block rather than an `async fn`: the
/// block uses the request where it was captured, the function would copy it
/// into a second place in its future.)
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn keeps a second copy of `req`"
)]
fn serve(
    mut req: Request<RequestBody>,
    conn: Arc<ConnCtx>,
) -> impl Future<Output = Response<ResponseBody>> + Send {
    async move {
        let started = Instant::now();
        conn.state.request_started(req.version() == Version::HTTP_2);
        let rt = &conn.rt;
        let gw = rt.gateway.load_full();

        // Identity: who is the client.
        let resolved = forwarded::resolve(
            conn.peer,
            conn.proxy_source,
            req.headers(),
            &gw.trusted,
            gw.client_header,
        );
        if let Some(w) = resolved.warning {
            rt.forwarding_warning(w.as_str(), conn.peer);
        }
        if gw.trusted.is_empty()
            && let Some(d) = gw.dominance.observe(conn.peer.ip(), started)
        {
            rt.dominant_peer(d);
        }
        let client = resolved.client;

        // Boxed: it goes to the response body's completion hook in the end, and
        // meanwhile the request's future (moved whole into hyper's slot) is
        // smaller by its size.
        let mut log = Box::new(RequestLog::new(&req, &client, conn.clone(), started));
        // Target: the one reading of method, authority, path and query that
        // every later stage uses; what cannot be read one way is refused.
        let target = match Target::of(&req, gw.path_policy) {
            Ok(t) => t,
            Err(e) => {
                log.record.decision = "reject";
                let accept = Accepts::of(req.headers());
                return reject(&RejectReason::Target(e), log, accept);
            }
        };
        log.set_target(&target);
        // Policy: which route, and may it go upstream.
        let view = RequestView {
            target: &target,
            headers: req.headers(),
        };
        let route = gw.routes.find(&view);
        // Challenge endpoints (the page's script, the answer) are weir's own.
        if let Some(ch) = gw.challenger.clone()
            && ch.is_challenge_path(target.path())
        {
            // Boxed: rare, and its state would enlarge every request's future.
            return Box::pin(challenge_endpoint(
                &ch, req, &target, &client, log, conn.tls,
            ))
            .await;
        }
        // Session: verified only by a signed cookie or the app's own answer,
        // and only looked up when a rule or an admission lane could use it.
        let session = match (&gw.sessions, route) {
            (Some(v), Some(r)) if !r.rules.is_empty() || gw.pools[r.pool].admission.is_some() => {
                v.check(req.headers()).await
            }
            _ => SessionState::Anonymous,
        };
        log.record.session = session.as_str();
        // Challenge: browser navigations without a valid pass, when the class
        // challenges (always, or while its pool is under pressure).
        let mut pass = None;
        if let (Some(ch), Some(route)) = (&gw.challenger, route)
            && route.challenge != crate::challenge::ChallengeMode::Off
            && !session.is_verified()
        {
            let now = SystemTime::now();
            let check = ch.pass(req.headers(), &client, now);
            if let Some(e) = check.event() {
                rt.challenge_event(&e);
            }
            if let crate::challenge::PassCheck::Valid(t) = check {
                pass = Some(t.id);
                log.record.challenge = Some("pass");
            } else {
                let pool = &gw.pools[route.pool];
                let (engaged, difficulty) =
                    rt.challenge_pressure(pool, ch.base_difficulty(), &ch.pressure());
                if route.challenge.applies(engaged) && ch.eligible(&target, req.headers(), &client)
                {
                    log.record.class = route.class.shared();
                    let page = ch.page(&target, &client, req.headers(), difficulty, now);
                    return challenge_response(page, log, rt);
                }
            }
        }
        let decision = match route {
            None => Decision::Reject(RejectReason::NoRoute),
            Some(route) => {
                log.record.class = route.class.shared();
                let max = gw.edge.max_in_flight_per_ip;
                match rt.client_in_flight.acquire(client.client, max) {
                    None => Decision::Reject(RejectReason::ClientInFlight { limit: max }),
                    Some(g) => {
                        log.in_flight = Some(g);
                        if route.rules.is_empty() {
                            Decision::Admit
                        } else {
                            apply_rules(
                                &route.rules,
                                &view,
                                &client,
                                session.user(),
                                pass,
                                &gw,
                                &mut log,
                            )
                            .await
                        }
                    }
                }
            }
        };
        log.record.decision = decision.as_str();
        let accept = Accepts::of(req.headers());
        let route = match (decision, route) {
            (Decision::Admit, Some(route)) => route,
            (Decision::Reject(reason), _) => return reject(&reason, log, accept),
            (Decision::Admit, None) => return reject(&RejectReason::NoRoute, log, accept),
        };

        // Upstream: wait for an admission slot, pick a server and forward.
        let pool = gw.pools[route.pool].clone();
        log.record.pool = Some(pool.name.clone());
        // A pass token (the challenge stage) lifts a request to the `pass` lane.
        let pass_token = pass.is_some();
        let class = gw
            .class_admission
            .get(route.class.as_str())
            .copied()
            .unwrap_or_default();
        // Coalescing joins after the policy (rules see and count every request,
        // followers too) and before admission: a follower waits for its leader
        // holding no admission slot and no server, so a storm on one page costs
        // one worker. Anonymous means: no verified session, no pass token, no
        // request body, and (the key refuses them) no Cookie, Authorization,
        // Range, Upgrade or condition. A follower whose leader's response cannot be shared
        // goes upstream itself, through admission like any request.
        let mut leader = None;
        if let (Some(max), Some(coalescer)) = (
            class.coalesce_max_body,
            gw.coalescers.get(route.class.as_str()),
        ) && !session.is_verified()
            && pass.is_none()
            && http_body::Body::is_end_stream(req.body())
            && let Some(key) = CoalesceKey::for_request(&target, req.headers())
        {
            match coalescer.join(key.in_pool(&pool.name)) {
                Role::Leader(l) => {
                    log.record.coalesced = Some("leader");
                    // Boxed, as the log: rare, and large for the future to carry.
                    leader = Some((Box::new(l), max));
                }
                Role::Follower(f) => match f.wait().await {
                    Some(shared) => return shared_response(&shared, log, req.version()),
                    None => log.record.coalesced = Some("unshared"),
                },
            }
        }
        if let Err(reason) = admit(
            &pool,
            class,
            session.is_verified(),
            pass_token,
            &client,
            &mut log,
        )
        .await
        {
            return reject(&reason, log, accept);
        }
        let hop = Hop {
            client: &client,
            peer_trusted: conn.peer_trusted,
            proxy_source: conn.proxy_source,
            tls: conn.tls,
            authority: target.authority(),
        };
        let client_version = req.version();
        let upgrade = is_upgrade(&req);
        let client_upgrade = upgrade.then(|| ClientUpgrade::on(&mut req));
        strip_hop_by_hop(req.headers_mut(), upgrade);
        req.headers_mut().remove(header::EXPECT);
        // The app receives the path and host weir decided on.
        target.forward(&mut req);
        let version = req.version();
        gw.forwarding.apply(req.headers_mut(), &hop, version);
        // Counted only for a body there is: most requests have none.
        let bytes_in = (!http_body::Body::is_end_stream(req.body()))
            .then(|| log.bytes_in.insert(Arc::default()).clone());
        req.body_mut()
            .watch(route.settings.body_read_timeout, bytes_in);
        let timeout = route
            .settings
            .response_timeout
            .unwrap_or(pool.response_timeout);
        let result = send_with_failover(&pool, &mut req, timeout, &mut log, rt).await;
        log.admission_outcome = admission_outcome(&result, log.record.upstream_time);
        match result {
            Ok(mut resp) => {
                log.record.upstream_status = Some(resp.status().as_u16());
                let is_101 = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
                strip_hop_by_hop(resp.headers_mut(), is_101 && upgrade);
                if is_101
                    && let Some(client_upgrade) = client_upgrade
                    && let Some((upstream, early)) = resp.body_mut().take_tunnel()
                {
                    let tunnel_guard = conn.guard.clone();
                    tokio::spawn(async move {
                        client_upgrade.tunnel(upstream, early).await;
                        drop(tunnel_guard);
                    });
                }
                let (mut parts, body) = resp.into_parts();
                let body = match leader {
                    // Boxed: rare, and large for every request's future to carry.
                    Some((leader, max)) => {
                        match Box::pin(lead(*leader, &mut parts, body, max)).await {
                            Ok(b) => b,
                            Err(e) => {
                                log.record.error = Some(format!("upstream body: {e}"));
                                let status = StatusCode::BAD_GATEWAY;
                                return failure(status, "upstream_body", log, accept);
                            }
                        }
                    }
                    None => ResponseBody::upstream(body),
                };
                // The client gets its own protocol version, whatever the upstream spoke.
                parts.version = client_version;
                log.record.status = parts.status.as_u16();
                Response::from_parts(parts, body.on_complete(log))
            }
            Err(ForwardError::NoHealthyServer) => {
                let reason = RejectReason::Shed {
                    reason: "no_healthy_upstream",
                    retry_after: Duration::from_secs(1),
                };
                reject(&reason, log, accept)
            }
            Err(e) => {
                log.record.error = Some(e.to_string());
                let status = e.status();
                failure(status, e.kind(), log, accept)
            }
        }
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
fn shared_response(
    shared: &SharedResponse,
    mut log: Box<RequestLog>,
    version: Version,
) -> Response<ResponseBody> {
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
    let body = ResponseBody::full(shared.body.clone()).on_complete(log);
    let mut resp = Response::new(body);
    *resp.status_mut() = shared.status;
    *resp.version_mut() = version;
    *resp.headers_mut() = shared.headers.clone();
    resp
}

/// The admission stage: whether an admitted request may go to `pool` now,
/// waits for a slot (in its lane, fair by client network), or is shed with
/// `503` + `Retry-After`. Pools without `[pools.NAME.admission]` pass
/// everything at once. The slot is held by the request's log record until
/// the response body ends.
async fn admit(
    pool: &Pool,
    class: crate::gateway::ClassAdmission,
    verified: bool,
    pass_token: bool,
    client: &ClientId,
    log: &mut RequestLog,
) -> Result<(), RejectReason> {
    use crate::admission::{FairKey, Lane, ShedReason};
    use crate::observe::metrics::{LaneLabels, ShedLabels};
    let Some(queue) = &pool.admission else {
        return Ok(());
    };
    let lane = queue
        .lanes()
        .clamp(Lane::for_request(verified, pass_token, class.lane));
    let lane_name: Arc<str> = Arc::from(queue.lanes().spec(lane).name.as_str());
    log.record.lane = Some(lane_name.clone());
    let now = tokio::time::Instant::now();
    let deadline = match class.queue_timeout {
        Some(t) => now + t,
        None => queue.deadline(lane, now),
    };
    let metrics = &log.conn.rt.metrics;
    match queue
        .acquire(lane, FairKey::of(client.client), deadline)
        .await
    {
        Ok(permit) => {
            let labels = LaneLabels {
                pool: pool.name.clone(),
                lane: lane_name,
            };
            metrics.admission_admitted.get_or_create(&labels).inc();
            metrics
                .admission_queue_wait
                .get_or_create(&labels)
                .observe(permit.waited().as_secs_f64());
            log.record.queue_time = permit.waited();
            log.permit = Some(permit);
            Ok(())
        }
        Err(shed) => {
            pool.shed(Instant::now());
            // A waiter may be shed from its lane to make room above it; the
            // label names the lane it was in.
            let shed_lane: Arc<str> = Arc::from(queue.lanes().spec(shed.lane).name.as_str());
            metrics
                .admission_shed
                .get_or_create(&ShedLabels {
                    pool: pool.name.clone(),
                    lane: shed_lane,
                    reason: shed.reason.as_str(),
                })
                .inc();
            log.record.queue_time = shed.waited;
            let reason = match shed.reason {
                ShedReason::QueueFull => "admission_queue_full",
                ShedReason::DeadlineExceeded => "admission_deadline_exceeded",
                ShedReason::LowerLaneShed => "admission_lower_lane_shed",
            };
            Err(RejectReason::Shed {
                reason,
                retry_after: shed.retry_after,
            })
        }
    }
}

/// What a forwarded request tells the adaptive limit: an answer and its
/// latency, or overload (timeout, reset, `503`), or nothing (no server).
fn admission_outcome(
    result: &Result<Response<UpstreamBody>, ForwardError>,
    upstream_time: Option<Duration>,
) -> crate::admission::Outcome {
    use crate::admission::Outcome;
    match result {
        Ok(resp) if resp.status() == StatusCode::SERVICE_UNAVAILABLE => Outcome::Overloaded,
        Ok(_) => Outcome::Answered(upstream_time.unwrap_or_default()),
        Err(ForwardError::Timeout { .. } | ForwardError::Exchange { .. }) => Outcome::Overloaded,
        Err(_) => Outcome::Abandoned,
    }
}

/// The rules stage: evaluates the route class's rules and records what they
/// decided (metrics, shadow rejections, human-collateral signals).
async fn apply_rules(
    rules: &[crate::policy::rules::Rule],
    req: &RequestView<'_>,
    client: &ClientId,
    user: Option<&str>,
    pass: Option<u64>,
    gw: &crate::gateway::Gateway,
    log: &mut RequestLog,
) -> Decision {
    use crate::policy::rules::{RequestFacts, evaluate};
    use weir_limiter::Clock as _;
    let rt = &log.conn.rt;
    let now = weir_limiter::MonotonicClock.now();
    let low_rate = rt.record_activity(client.client, gw, now);
    let facts = RequestFacts {
        client,
        method: req.target.method(),
        headers: req.headers,
        user,
        pass,
        now,
    };
    let ev = evaluate(rules, &facts, gw.rules_shadow, rt.shared_limiter()).await;
    for &(index, result) in &ev.results {
        rt.metrics
            .rule_decisions
            .get_or_create(&crate::observe::metrics::RuleResultLabels {
                rule: rules[index].name.clone(),
                result: result.as_str(),
            })
            .inc();
    }
    let signal = collateral_signal(user.is_some(), req.headers, low_rate);
    for shadow in &ev.shadow {
        rt.rule_rejected(shadow, client.client, signal, false);
    }
    if !ev.shadow.is_empty() {
        log.record.shadow_rules = Some(ev.shadow.iter().map(|r| r.rule.to_string()).collect());
    }
    log.rule_guards = ev.guards;
    match ev.rejection {
        None => Decision::Admit,
        Some(r) => {
            rt.rule_rejected(&r, client.client, signal, true);
            log.record.rule_level = Some(r.level);
            log.record.rule_key = Some(r.key.clone());
            log.record.collateral = signal;
            Decision::Reject(RejectReason::Rule(r))
        }
    }
}

/// Why a rejected client may be a person rather than a crawler, strongest
/// signal first. Browser headers can be faked; they are a signal to watch,
/// not proof.
fn collateral_signal(
    verified: bool,
    headers: &http::HeaderMap,
    low_rate: bool,
) -> Option<&'static str> {
    let navigates = headers
        .get("sec-fetch-mode")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"navigate"))
        || headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("text/html"));
    if verified {
        Some("verified")
    } else if low_rate {
        Some("low_rate")
    } else if navigates {
        Some("browser")
    } else {
        None
    }
}

/// Serves `/.weir/challenge.js` and `/.weir/challenge/verify`.
async fn challenge_endpoint(
    ch: &crate::challenge::Challenger,
    req: Request<RequestBody>,
    target: &Target,
    client: &ClientId,
    mut log: Box<RequestLog>,
    tls: bool,
) -> Response<ResponseBody> {
    use http_body_util::BodyExt as _;
    log.record.class = Arc::from("challenge");
    let (parts, body) = req.into_parts();
    let limited = http_body_util::Limited::new(body, crate::challenge::MAX_VERIFY_BODY);
    let bytes = match limited.collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            let accept = Accepts::of(&parts.headers);
            return reject(
                &RejectReason::BadRequest("challenge answer too large or cut"),
                log,
                accept,
            );
        }
    };
    let rt = log.conn.rt.clone();
    match ch.handle(
        target,
        &parts.headers,
        &bytes,
        client,
        tls,
        SystemTime::now(),
    ) {
        Some(resp) => challenge_response(resp, log, &rt),
        None => reject(&RejectReason::NoRoute, log, Accepts::of(&parts.headers)),
    }
}

/// Turns a challenger's response into weir's, recording its events.
fn challenge_response(
    resp: Response<bytes::Bytes>,
    mut log: Box<RequestLog>,
    rt: &Runtime,
) -> Response<ResponseBody> {
    for e in crate::challenge::events(&resp) {
        rt.challenge_event(e);
    }
    log.record.decision = "challenge";
    log.record.status = resp.status().as_u16();
    log.record.challenge = crate::challenge::events(&resp)
        .first()
        .map(|e| e.labels().0);
    resp.map(|b| ResponseBody::full(b).on_complete(log))
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
    loop {
        let guard = match pool.pick(failed.as_ref().map(|g| &g.server), idempotent, sent) {
            Ok(g) => g,
            Err(NoServer::AllDead) => return Err(ForwardError::NoHealthyServer),
            Err(NoServer::Exhausted) => return Err(ForwardError::NoServer),
        };
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
        let answered = Instant::now();
        let took = answered.saturating_duration_since(sent);
        if let Some(outcome) = health_outcome(&res, took) {
            let others = guard.server.in_flight().saturating_sub(1);
            pool.observe_request(&guard.server, answered, outcome, others);
        }
        match res {
            Ok(resp) => {
                handles.duration.observe(took.as_secs_f64());
                log.record.upstream_time = Some(took);
                log.server = Some(guard);
                return Ok(resp);
            }
            Err(e) => {
                rt.metrics
                    .upstream_errors
                    .get_or_create(&PoolErrorLabels {
                        pool: pool.name.clone(),
                        kind: e.kind(),
                    })
                    .inc();
                let can_retry = e.retryable(idempotent) && failed.is_none() && retry_copy.is_some();
                if !can_retry {
                    return Err(e);
                }
                let labels = PoolLabels {
                    pool: pool.name.clone(),
                };
                if !pool.try_retry(Instant::now()) {
                    rt.metrics
                        .upstream_retries_denied
                        .get_or_create(&labels)
                        .inc();
                    return Err(e);
                }
                rt.metrics.upstream_retries.get_or_create(&labels).inc();
                tracing::debug!(error = %e, "trying another server");
                failed = Some(guard);
                sent = Instant::now();
            }
        }
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
        Err(ForwardError::Connect { .. }) => Some(RequestOutcome::Refused),
        Err(ForwardError::Timeout { .. }) => Some(RequestOutcome::Timeout),
        Err(e @ ForwardError::Exchange { .. }) if e.kind() == "exchange" => {
            Some(RequestOutcome::Reset)
        }
        Err(ForwardError::Closed { .. }) => Some(RequestOutcome::Reset),
        Err(_) => None,
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

/// The one place a rejection becomes a response.
pub fn reject(
    reason: &RejectReason,
    mut log: Box<RequestLog>,
    accept: Accepts,
) -> Response<ResponseBody> {
    log.record.rule = Some(reason.rule().to_string());
    let label: Arc<str> = match reason {
        RejectReason::Rule(r) => r.rule.clone(),
        other => Arc::from(other.rule()),
    };
    log.conn
        .rt
        .metrics
        .rejections
        .get_or_create(&RuleLabels { rule: label })
        .inc();
    let message = match reason {
        RejectReason::ClientInFlight { limit } => {
            format!("too many requests in flight from your address (limit {limit})")
        }
        RejectReason::NoRoute => "no route for this request".into(),
        RejectReason::BadRequest(why) => (*why).into(),
        RejectReason::Target(e) => e.to_string(),
        RejectReason::Draining => "this server is restarting; please retry".into(),
        RejectReason::Rule(_) => "too many requests; please retry later".into(),
        RejectReason::Shed { reason, .. } if *reason == "no_healthy_upstream" => {
            "the application is not answering; please retry".into()
        }
        RejectReason::Shed { .. } => "the application is busy; please retry".into(),
    };
    let gw = log.conn.rt.gateway.load_full();
    let mut resp = respond(
        reason.status(),
        reason.retry_after(),
        reason.rule(),
        &message,
        log,
        accept,
        &gw.rejection,
    );
    if let RejectReason::Rule(r) = reason
        && let Some((quota, window)) = r.policy
    {
        // draft-ietf-httpapi-ratelimit-headers: the policy that fired and
        // what is left of it (nothing, for `t` seconds).
        let h = resp.headers_mut();
        let name = r.rule.replace('"', "");
        if let Ok(v) = HeaderValue::from_str(&format!("\"{name}\";q={quota};w={window}")) {
            h.insert("ratelimit-policy", v);
        }
        let t = r.retry_after.as_secs_f64().ceil() as u64;
        if let Ok(v) = HeaderValue::from_str(&format!("\"{name}\";r=0;t={t}")) {
            h.insert("ratelimit", v);
        }
    }
    resp
}

/// Which body format a client prefers for an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepts {
    Html,
    Json,
    Text,
}

impl Accepts {
    fn of(headers: &http::HeaderMap) -> Accepts {
        let accept = headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if accept.contains("text/html") {
            Accepts::Html
        } else if accept.contains("json") {
            Accepts::Json
        } else {
            Accepts::Text
        }
    }
}

/// The one place an upstream failure becomes a response.
fn failure(
    status: StatusCode,
    kind: &'static str,
    log: Box<RequestLog>,
    accept: Accepts,
) -> Response<ResponseBody> {
    let message = match status {
        StatusCode::GATEWAY_TIMEOUT => "the application did not answer in time",
        _ => "the application could not be reached",
    };
    let no_templates = crate::config::RejectionConfig::default();
    respond(status, None, kind, message, log, accept, &no_templates)
}

fn respond(
    status: StatusCode,
    retry_after: Option<Duration>,
    reason: &str,
    message: &str,
    mut log: Box<RequestLog>,
    accept: Accepts,
    templates: &crate::config::RejectionConfig,
) -> Response<ResponseBody> {
    log.record.status = status.as_u16();
    let retry = retry_after.map(|d| d.as_secs_f64().ceil().max(1.0) as u64);
    let fill = |t: &str| {
        t.replace("{status}", status.as_str())
            .replace("{retry_after}", &retry.unwrap_or(0).to_string())
            .replace("{rule}", reason)
    };
    let (content_type, body) = match accept {
        Accepts::Html => (
            "text/html; charset=utf-8",
            templates.html.as_deref().map(fill).unwrap_or_else(|| {
                format!(
                    "<!doctype html><html lang=\"en\"><meta charset=\"utf-8\"><title>{code}</title><h1>Please wait a moment</h1><p>{message}.</p>{retry_line}</html>\n",
                    code = status.as_u16(),
                    retry_line = retry.map_or(String::new(), |s| format!("<p>Try again in {s} seconds.</p>")),
                )
            }),
        ),
        Accepts::Json => (
            "application/json",
            templates.json.as_deref().map(fill).unwrap_or_else(|| {
                serde_json::json!({"status": status.as_u16(), "error": message, "reason": reason, "retry_after": retry})
                    .to_string()
            }),
        ),
        Accepts::Text => (
            "text/plain; charset=utf-8",
            templates.text.as_deref().map(fill).unwrap_or_else(|| {
                format!("{} {}: {message}\n", status.as_u16(), status.canonical_reason().unwrap_or(""))
            }),
        ),
    };
    let mut resp = Response::new(ResponseBody::full(body).on_complete(log));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(after) = retry {
        h.insert(header::RETRY_AFTER, HeaderValue::from(after));
    }
    if let Ok(v) = HeaderValue::from_str(reason) {
        h.insert("x-weir-reason", v);
    }
    resp
}

/// The access-log line and request metrics of one request, written once when
/// its response body ends. Holds the request's slots until then.
pub struct RequestLog {
    pub record: AccessRecord,
    started: Instant,
    /// The request body's bytes, counted as it is read (if it has one).
    bytes_in: Option<Arc<AtomicU64>>,
    conn: Arc<ConnCtx>,
    in_flight: Option<InFlightGuard>,
    server: Option<ServerGuard>,
    rule_guards: Vec<weir_limiter::InflightGuard>,
    /// The admission slot, released (with how the request went) at body end.
    permit: Option<crate::admission::Permit>,
    admission_outcome: crate::admission::Outcome,
}

impl RequestLog {
    fn new<B>(req: &Request<B>, client: &ClientId, conn: Arc<ConnCtx>, started: Instant) -> Self {
        let proto = match req.version() {
            Version::HTTP_2 => "HTTP/2",
            Version::HTTP_10 => "HTTP/1.0",
            _ => "HTTP/1.1",
        };
        RequestLog {
            record: AccessRecord {
                time: SystemTime::now(),
                client: client.client.ip(),
                peer: client.peer.ip(),
                client_source: client.source.as_str(),
                method: req.method().clone(),
                // Until the target is read: the request line as received.
                host: String::new(),
                path: req
                    .uri()
                    .path_and_query()
                    .map_or("/", |p| p.as_str())
                    .to_owned(),
                raw_path: None,
                proto,
                class: unrouted(),
                decision: "admit",
                session: "anonymous",
                challenge: None,
                rule: None,
                rule_level: None,
                rule_key: None,
                shadow_rules: None,
                collateral: None,
                pool: None,
                upstream: None,
                status: 0,
                upstream_status: None,
                bytes_in: 0,
                bytes_out: 0,
                duration: Duration::ZERO,
                queue_time: Duration::ZERO,
                lane: None,
                upstream_time: None,
                coalesced: None,
                error: None,
            },
            started,
            bytes_in: None,
            conn,
            in_flight: None,
            server: None,
            rule_guards: Vec::new(),
            permit: None,
            admission_outcome: crate::admission::Outcome::Abandoned,
        }
    }
}

impl RequestLog {
    /// The request as weir read it: the canonical host and path, and what
    /// the client sent when that differs.
    fn set_target(&mut self, target: &Target) {
        let r = &mut self.record;
        r.host.clear();
        r.host.push_str(target.host().unwrap_or(""));
        if r.path != target.path_and_query() {
            let sent = std::mem::replace(&mut r.path, target.path_and_query().to_owned());
            r.raw_path = Some(sent);
        }
    }
}

impl OnComplete for RequestLog {
    fn complete(mut self: Box<Self>, bytes_out: u64, error: Option<String>) {
        let rt = &self.conn.rt;
        self.record.bytes_out = bytes_out;
        self.record.bytes_in = self
            .bytes_in
            .as_ref()
            .map_or(0, |b| b.load(Ordering::Relaxed));
        self.record.duration = self.started.elapsed();
        if error.is_some() && self.record.error.is_none() {
            self.record.error = error;
        }
        rt.metrics
            .count_request(&self.record.class, self.record.status, self.record.decision);
        if !rt.access_log.write(&self.record) {
            rt.metrics.access_log_dropped.inc();
        }
        self.in_flight.take();
        self.server.take();
        if let Some(p) = self.permit.take() {
            p.complete(self.admission_outcome);
        }
        self.rule_guards.clear();
        self.conn.state.request_finished();
    }
}

/// The class of a request no route took, shared (one per process).
fn unrouted() -> Arc<str> {
    static UNROUTED: std::sync::LazyLock<Arc<str>> =
        std::sync::LazyLock::new(|| Arc::from("unrouted"));
    UNROUTED.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of what `f` returns, without calling it.
    fn returned_size<F, A, B, R>(_: F) -> usize
    where
        F: FnOnce(A, B) -> R,
    {
        std::mem::size_of::<R>()
    }

    /// The request's future lives in a box its connection holds (hyper's
    /// slot for TLS and HTTP/2), and each stage's future is moved into its
    /// parent's. At 6.5 KB (three copies of
    /// the request, rare branches inline) a cache simulation counted 272
    /// last-level misses per request with 1,000 connections busy; at 2.4 KB,
    /// 208 (bench/README.md, "Request path, session 6").
    #[test]
    fn the_request_future_stays_small() {
        let size = returned_size(handle);
        assert!(size <= 3 * 1024, "handle's future is {size} bytes");
    }
}
