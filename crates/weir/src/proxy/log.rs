//! One request's record: the access-log line and request metrics, written
//! once when its response body ends (so bytes and durations are true), and
//! the slots it holds until then (client in flight, concurrency rules, the
//! upstream server; the admission permit only until the app's answer
//! begins, see `upstream::forward`).
//!
//! Every response weir makes itself passes through [`RequestLog::answer`]:
//! the rescue ([`crate::respond`]) builds it from a typed reason, this
//! records that reason once (the log's `rule`, `weir_rejections_total`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use weir_http::body::{OnComplete, ResponseBody};
use weir_http::target::Target;

use super::ConnCtx;
use crate::edge::inflight::InFlightGuard;
use crate::evidence::{ChallengeMark, SessionKind};
use crate::gateway::Gateway;
use crate::identity::ClientId;
use crate::observe::access_log::{AccessRecord, Coalescing, LoggedVisit, Verdict};
use crate::observe::metrics::RuleLabels;
use crate::observe::request_id::{RequestId, X_REQUEST_ID};
use crate::policy::Decision;
use crate::policy::rules::RuleRejection;
use crate::respond::{self, Accepts, Reason};
use crate::upstream::ServerGuard;
use crate::visit::{RequestVisit, Visits};

/// The access-log line and request metrics of one request, written once when
/// its response body ends. Holds the request's slots until then.
pub struct RequestLog {
    /// The line, written only here: the phases say what they found
    /// through the methods below, named for it.
    record: AccessRecord,
    /// What the client accepts, for the answers weir makes itself.
    accept: Accepts,
    started: Instant,
    /// The request body's bytes, counted as it is read (if it has one).
    bytes_in: Option<Arc<AtomicU64>>,
    pub(super) conn: Arc<ConnCtx>,
    /// What the request holds until its line is written.
    pub(super) held: Held,
    /// A navigation's visit: what its cookie said, and the cookie the page
    /// answered to it carries (`own_fields`).
    visit: Option<(RequestVisit, Arc<Visits>)>,
    /// The line is written (the response ended, or the request was dropped
    /// before one began): never twice.
    written: bool,
    /// A pass came in the request's address: the browser's address bar
    /// holds it, and the answer keeps it from going on in a `Referer`.
    pass_in_address: bool,
    /// The client reached weir over TLS (weir's, or a trusted proxy's that
    /// says so): weir's cookies may be `Secure` (`challenge.secure_cookies`).
    client_tls: bool,
}

/// The slots one request holds, each taken by the phase that got it and
/// all released together when the request's line is written (or, for the
/// admission permit, earlier: once the app's answer begins). Released on
/// drop, in this order.
#[derive(Default)]
pub(super) struct Held {
    /// The client's count of requests in flight (policy, `limits`).
    pub(super) in_flight: Option<InFlightGuard>,
    /// The upstream server the request went to (its in-flight count).
    pub(super) server: Option<ServerGuard>,
    /// The admission slot, released with how the request went once the
    /// app's answer begins (or, never sent, when the record is written:
    /// dropped unused is `Outcome::Abandoned`).
    pub(super) permit: Option<crate::admission::Permit>,
    /// Concurrency rules' slots.
    pub(super) rule_guards: Vec<weir_limiter::InflightGuard>,
    /// Where the request waited for its slot, to wait again if the app
    /// refuses it (`admit::requeue`).
    pub(super) place: Option<Place>,
}

/// Where a request waits for an admission slot: its lane, its turn's key,
/// whether it proved who it is (a lane's share that yields to proof never
/// takes its slot), until when, and the shape its answer teaches. Kept in
/// the record so a request the app refused can wait there again.
#[derive(Clone, Copy)]
pub(super) struct Place {
    pub(super) lane: crate::admission::Lane,
    pub(super) key: crate::admission::FairKey,
    pub(super) proven: bool,
    pub(super) deadline: tokio::time::Instant,
    pub(super) shape: crate::admission::Shape,
}

impl RequestLog {
    /// The record of `req`, from `client`, started at `started`; `req` gets
    /// the request's id, so the app sees the id the log and the client see.
    /// Boxed: it goes to the response body's completion hook in the end,
    /// and meanwhile the request's future is smaller by its size.
    pub(super) fn new<B>(
        req: &mut Request<B>,
        client: &ClientId,
        conn: Arc<ConnCtx>,
        started: Instant,
    ) -> Box<Self> {
        let log = Box::new(RequestLog {
            client_tls: conn.edge.tls.is_some()
                || crate::identity::forwarded::proto_is_https(
                    req.headers(),
                    conn.edge.peer_trusted,
                ),
            record: first_record(req, client, &conn),
            accept: Accepts::of(req.headers()),
            started,
            bytes_in: None,
            conn,
            held: Held::default(),
            visit: None,
            written: false,
            pass_in_address: false,
        });
        log.stamp(req.headers_mut());
        log
    }

    /// The request as weir read it (shared with the request, not copied),
    /// and what the client sent when it was spelled otherwise.
    pub(super) fn set_target(&mut self, target: &Target, sent: &Uri) {
        if target.rewritten() {
            self.set_sent(sent);
        }
        self.record.target = Some(target.clone());
    }

    /// Puts the request's id on `headers` (the forwarded request's, or an
    /// answer's), replacing any the client sent.
    pub(super) fn stamp(&self, headers: &mut http::HeaderMap) {
        headers.insert(
            X_REQUEST_ID.clone(),
            self.record.request_id.header_value().clone(),
        );
    }

    /// Whether a pass came in the request's address (the target phase says).
    pub(super) fn pass_in_address(&mut self, came: bool) {
        self.pass_in_address = came;
    }

    /// What weir adds to every answer, the app's or its own (`served`): the
    /// next visit cookie on the answer to a navigation, when it counts
    /// (`crate::visit::Visits::next`; the answer's other `Set-Cookie`s
    /// stay), and, where the request's address held a pass, a
    /// `Referrer-Policy` that keeps it from going on
    /// (`challenge::secret::REFERRER_POLICY`).
    pub(super) fn own_fields(&self, served: crate::visit::ServedBy, headers: &mut http::HeaderMap) {
        if self.pass_in_address {
            headers.insert(
                http::header::REFERRER_POLICY,
                crate::challenge::secret::REFERRER_POLICY,
            );
        }
        let Some((visit, visits)) = &self.visit else {
            return;
        };
        let tls = self.client_tls;
        if let Some(cookie) = visits.next(visit, served, tls, SystemTime::now()) {
            headers.append(http::header::SET_COOKIE, cookie);
        }
    }

    /// A request's visit, as the visit phase read it: kept for the rules
    /// and the answer's cookie; a navigation's is the log's `visit`.
    pub(super) fn visited(&mut self, visit: Option<(RequestVisit, Arc<Visits>)>) {
        if let Some((v, _)) = &visit
            && v.navigation
        {
            let now = SystemTime::now();
            self.record.visit = v.prior.map(|v| LoggedVisit::of(&v, now));
        }
        self.visit = visit;
    }

    /// Who the request proved to be (its session: `anonymous`,
    /// `verified`, `unverified`; the verified crawler's name), and the
    /// class it is decided in: known before the decision, so a request
    /// dropped while the rules wait is logged with its class.
    pub(super) fn identified(
        &mut self,
        session: SessionKind,
        crawler: Option<Arc<str>>,
        class: Arc<str>,
    ) {
        self.record.session = session;
        self.record.bot = crawler;
        self.record.class = class;
    }

    /// The policy's decision, recorded and passed on. (Taken and given
    /// back: a result `serve` lent to the log would keep its place in the
    /// request's future past every later wait.)
    pub(super) fn decided(&mut self, decision: Decision) -> Decision {
        self.record.decision = match decision {
            Decision::Admit(_) => Verdict::Admit,
            Decision::Reject(_) => Verdict::Reject,
            Decision::Challenge(_) => Verdict::Challenge,
        };
        decision
    }

    /// The request's visit and the visits it is counted by, if it carries one.
    pub(super) fn visit(&self) -> Option<&(RequestVisit, Arc<Visits>)> {
        self.visit.as_ref()
    }

    /// A counter of the request body's bytes as they are read, for the
    /// log's `bytes_in` (made only for a request with a body).
    pub(super) fn count_bytes_in(&mut self) -> Arc<AtomicU64> {
        self.bytes_in.insert(Arc::default()).clone()
    }

    /// The request's class, for metrics of what happened to it.
    pub(super) fn class(&self) -> &Arc<str> {
        &self.record.class
    }

    /// Weir's own endpoints (the challenge's script and answer) are logged
    /// as the class `challenge`.
    pub(super) fn weir_endpoint(&mut self) {
        self.record.class = Arc::from("challenge");
    }

    /// The request carried a valid challenge pass that is proof here
    /// (`challenge: "pass"`).
    pub(super) fn pass_carried(&mut self) {
        self.record.challenge = Some(ChallengeMark::Pass);
    }

    /// No pass came, but the browser solved the page's work three times
    /// lately: a loop, admitted as proven (`challenge: "looped"`).
    pub(super) fn looped(&mut self) {
        self.record.challenge = Some(ChallengeMark::Looped);
    }

    /// The request carried a valid no-script pass outside a visit weir
    /// counts as a person's: not proof (`challenge: "wait_pass"`).
    pub(super) fn wait_pass_alone(&mut self) {
        self.record.challenge = Some(ChallengeMark::WaitPass);
    }

    /// Rules in shadow mode that would have refused the request.
    pub(super) fn shadowed(&mut self, rules: Vec<String>) {
        self.record.shadow_rules = Some(rules);
    }

    /// A rule's refusal: its level, key and the collateral signal (why the
    /// refused client may be a person).
    pub(super) fn refused_by_rule(
        &mut self,
        r: &RuleRejection,
        signal: Option<crate::evidence::Collateral>,
    ) {
        self.record.rule_level = Some(r.level);
        self.record.rule_key = Some(r.key.clone());
        self.record.collateral = signal;
    }

    /// Answered with the challenge: its first event (`issued`, `solved`, ...).
    pub(super) fn challenged(&mut self, event: Option<ChallengeMark>) {
        self.record.decision = Verdict::Challenge;
        self.record.challenge = event;
    }

    /// The pool the route named.
    pub(super) fn routed(&mut self, pool: Arc<str>) {
        self.record.pool = Some(pool);
    }

    /// The request's role in coalescing (`leader`, `shared`, `unshared`).
    pub(super) fn coalesced(&mut self, role: Coalescing) {
        self.record.coalesced = Some(role);
    }

    /// The admission lane the request waits in.
    pub(super) fn in_lane(&mut self, lane: Arc<str>) {
        self.record.lane = Some(lane);
    }

    /// A wait in the admission queue (a request sent again after the app
    /// refused it waits twice: the log's `queue_ms` is both).
    pub(super) fn waited(&mut self, wait: Duration) {
        self.record.queue_time += wait;
    }

    /// The upstream server an attempt went to (the last one is logged).
    pub(super) fn sent_to(&mut self, server: std::net::SocketAddr) {
        self.record.upstream = Some(server);
    }

    /// The app's response head came `took` after the request was sent.
    pub(super) fn answered_after(&mut self, took: Duration) {
        self.record.upstream_time = Some(took);
    }

    /// When the app's response head came, after the request was sent.
    pub(super) fn upstream_time(&self) -> Option<Duration> {
        self.record.upstream_time
    }

    /// The status the app answered with (the client's may differ: a `101`
    /// no one asked for is weir's `502`).
    pub(super) fn app_answered(&mut self, status: StatusCode) {
        self.record.upstream_status = Some(status.as_u16());
    }

    /// Why the request failed, for the log's `error`, before weir's answer.
    pub(super) fn failed(&mut self, error: String) {
        self.record.error = Some(error);
    }

    /// The status the client gets with the app's response (or a
    /// coalesced copy of it).
    pub(super) fn passed_on(&mut self, status: StatusCode) {
        self.record.status = status.as_u16();
    }

    /// The request target as the client sent it.
    pub(super) fn set_sent(&mut self, sent: &Uri) {
        let text = sent.path_and_query().map_or("/", |p| p.as_str());
        // A pass in an address weir could not read stays out of the log too.
        let gw = self.conn.rt.gateway.load();
        let clean = (gw.challenger.as_deref())
            .and_then(|ch| crate::challenge::secret::without_pass(text, ch.pass_name()));
        self.record.raw_target = Some(clean.unwrap_or_else(|| text.to_owned()));
    }

    /// Answers with weir's own response for `reason` (the rescue), recording
    /// the reason as the request's `rule` and in `weir_rejections_total`.
    /// The record is written when the answer's body ends.
    pub(super) fn answer(
        mut self: Box<Self>,
        reason: &(impl Reason + ?Sized),
        gw: &Gateway,
    ) -> Response<ResponseBody> {
        let label: Arc<str> = Arc::from(reason.label());
        self.record.rule = Some(label.to_string());
        self.conn
            .rt
            .metrics
            .rejections
            .get_or_create(&RuleLabels { rule: label })
            .inc();
        let resp = respond::answer(reason, self.accept, &gw.rejection);
        self.record.status = resp.status().as_u16();
        let mut resp = resp;
        self.stamp(resp.headers_mut());
        self.own_fields(crate::visit::ServedBy::Weir, resp.headers_mut());
        resp.map(|b| b.on_complete(self))
    }

    /// [`RequestLog::answer`] for a request refused before any decision
    /// (no route, a target not read): logged with `decision: "reject"`.
    pub(super) fn reject(
        mut self: Box<Self>,
        reason: &(impl Reason + ?Sized),
        gw: &Gateway,
    ) -> Response<ResponseBody> {
        self.record.decision = Verdict::Reject;
        self.answer(reason, gw)
    }

    /// Responds with a response weir made without a reason to record (the
    /// challenge's pages and script): its status is the log's.
    pub(super) fn respond_with(
        mut self: Box<Self>,
        resp: Response<Bytes>,
    ) -> Response<ResponseBody> {
        self.record.status = resp.status().as_u16();
        let mut resp = resp;
        self.stamp(resp.headers_mut());
        self.own_fields(crate::visit::ServedBy::Challenge, resp.headers_mut());
        resp.map(|b| ResponseBody::full(b).on_complete(self))
    }
}

impl OnComplete for RequestLog {
    fn complete(mut self: Box<Self>, bytes_out: u64, error: Option<String>) {
        self.write(bytes_out, error);
    }
}

impl Drop for RequestLog {
    /// A request dropped before its response began: the client left (its
    /// HTTP/1 connection closed, its HTTP/2 stream reset) while the request
    /// waited for a slot or for the app. Written with nginx's 499, so that
    /// people who gave up waiting are in the log and in
    /// `weir_requests_total`. (The connection's count of requests in flight
    /// is the edge's: `weir_http::conn::RequestInProgress`.)
    fn drop(&mut self) {
        if self.written {
            return;
        }
        if self.record.status == 0 {
            self.record.status = CLIENT_CLOSED;
        }
        self.write(
            0,
            Some("client closed before the response began".to_string()),
        );
    }
}

/// nginx's status for a request whose client closed before the answer.
const CLIENT_CLOSED: u16 = 499;

impl RequestLog {
    /// Writes the line and the request metrics, and frees the request's
    /// slots (an admission permit still held says nothing of the app).
    fn write(&mut self, bytes_out: u64, error: Option<String>) {
        self.written = true;
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
        rt.metrics.count_request(
            &self.record.class,
            self.record.status,
            self.record.decision.as_str(),
            self.record.duration,
        );
        rt.timeline.record(&self.record);
        // A WebSocket's time is its conversation's, not a request's.
        if self.record.status != 101 {
            rt.spans.note(self.record.duration);
        }
        if !rt.access_log.write(&self.record) {
            rt.metrics.access_log_dropped.inc();
        }
        drop(std::mem::take(&mut self.held));
    }
}

/// A request's record as it begins: who sent what, and how; the phases
/// fill in the rest.
fn first_record<B>(req: &Request<B>, client: &ClientId, conn: &ConnCtx) -> AccessRecord {
    AccessRecord {
        time: SystemTime::now(),
        request_id: RequestId::of(req.headers(), client),
        client: client.client.ip(),
        peer: client.peer.ip(),
        client_source: client.source,
        method: req.method().clone(),
        target: None,
        raw_target: None,
        proto: req.version(),
        tls_version: conn.edge.tls.map(|t| t.version),
        alpn: conn.edge.tls.and_then(|t| t.alpn),
        user_agent: req.headers().get(http::header::USER_AGENT).cloned(),
        referer: req.headers().get(http::header::REFERER).cloned(),
        class: unrouted(),
        decision: Verdict::Admit,
        session: SessionKind::Anonymous,
        bot: None,
        challenge: None,
        rule: None,
        rule_level: None,
        rule_key: None,
        shadow_rules: None,
        collateral: None,
        visit: None,
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
    }
}

/// The class of a request no route took, shared (one per process).
fn unrouted() -> Arc<str> {
    static UNROUTED: std::sync::LazyLock<Arc<str>> =
        std::sync::LazyLock::new(|| Arc::from("unrouted"));
    UNROUTED.clone()
}
