//! The request path: the phases a request passes, composed in [`serve`]
//! in the order of the diagram in `docs/request-path.md` (the one diagram;
//! each phase's contract is there too). A file per phase:
//!
//! - [`serve`] (here): the composition, one comment per phase; identity,
//!   target and route (their stages: `identity`, `weir_http::target`,
//!   `policy::route`).
//! - [`deciding`]: visit, session, verified bots, rules and challenge:
//!   the [`Decision`].
//! - [`challenging`]: the challenge's part in every phase it meets, in one
//!   place: a pass in the address or the `Referer`, a pass's worth, a
//!   loop, when the page is offered (now, on a long wait, at admission),
//!   and weir's own endpoints (its script and answers, before any
//!   decision).
//! - [`coalescing`]: identical anonymous GETs sharing one upstream request.
//! - [`admit`]: a slot in the pool's admission queue.
//! - [`forwarding`]: the request sent upstream with failover.
//! - [`responding`]: the upstream's response made the client's.
//! - [`log`]: the request's record and held slots, and its answers through
//!   the rescue ([`crate::respond`]).
//!
//! Each phase gives a stage the request's facts and records what it said;
//! the stages themselves know neither the runtime nor the log (they would
//! import each other). [`Proxy`] is the edge's [`Service`]: a handler per
//! connection, over the gateway in force.

mod admit;
mod challenging;
mod coalescing;
mod deciding;
mod exchange;
mod forwarding;
mod log;
mod responding;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderValue};
use http::{Request, Response, Version};

use crate::edge::{Connection, EdgeSettings, ListenerSpec, Service};
use crate::gateway::{ClassAdmission, Gateway};
use crate::identity::ClientId;
use crate::identity::forwarded;
use crate::observe::tallies::Warning;
use crate::policy::route::{RequestView, Route};
use crate::policy::{Decision, RejectReason};
use crate::respond::Accepts;
use crate::runtime::Runtime;
use crate::upstream::Pool;
use coalescing::Coalesced;
use exchange::Exchange;
use forwarding::Unanswered;
use weir_http::body::{RequestBody, ResponseBody};
use weir_http::connections::UpstreamBody;
use weir_http::server::{ClientError, Handler};
use weir_http::target::Target;

pub use log::RequestLog;

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
            edge: c,
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

    /// A head the codec could not read is answered by the rescue too (in
    /// text: its `Accept` was not read), and counted with the codec's other
    /// errors (`weir_connection_errors_total`), not as a request.
    fn refusal(&self, error: &ClientError) -> Option<Box<Response<ResponseBody>>> {
        let gw = self.0.rt.gateway.load();
        let mut resp = crate::respond::answer(error, Accepts::Text, &gw.rejection);
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        Some(Box::new(resp))
    }
}

/// What a request knows about its connection: what the edge said of it,
/// and the process it is served by.
pub struct ConnCtx {
    pub edge: Connection,
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
    Boxed {
        serving: serve(req, conn),
    }
}

pin_project_lite::pin_project! {
    /// The request's answer, boxed: the HTTP/1 connection passes it on
    /// through its own future, whose memory is cold when many connections
    /// are busy; a pointer moves there instead of 416 bytes, several times
    /// a request. (A struct: an `async` block awaiting `serve` would keep
    /// its future twice, as the block's capture and as what it awaits.)
    struct Boxed<F> {
        #[pin]
        serving: F,
    }
}

impl<F> Future for Boxed<F>
where
    F: Future<Output = Response<ResponseBody>>,
{
    type Output = Box<Response<ResponseBody>>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let resp = std::task::ready!(self.project().serving.poll(cx));
        std::task::Poll::Ready(Box::new(resp))
    }
}

/// The phases, in order: the diagram in `docs/request-path.md`. Each phase
/// is a function of its own (here and in this module's files) whose doc
/// says when it runs, what it may change and what its result means; an
/// answer weir makes itself (a refusal, a challenge, a failure) ends the
/// request there and goes through the rescue ([`crate::respond`]).
///
/// (An `async` block rather than an `async fn`: the block uses the request
/// where it was captured, the function would copy it into a second place
/// in its future.)
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
        let gw = conn.rt.gateway.load_full();
        // Identity: who is asking (first: a refused request's line names it).
        let client = identify(&req, &conn, &gw, started);
        // The pass is a secret: out of the `Referer` before the record copies it.
        if let Some(ch) = &gw.challenger {
            challenging::pass_out_of_the_referer(ch, &mut req);
        }
        let mut log = RequestLog::new(&mut req, &client, conn.clone(), started);
        // Target: the codec's leftover framing, then the one canonical reading.
        let target = match read_target(&mut req, &conn, &gw) {
            Ok((t, pass_in_address)) => {
                log.pass_in_address(pass_in_address);
                t
            }
            Err(why) => return unread(log, &req, why, &gw),
        };
        let mut ex = Exchange::new(&conn, &gw, &client, &target, log);
        ex.log_mut().set_target(&target, req.uri());
        // weir's own endpoints: the challenge's script and answer.
        if let Some(ch) = challenging::owner(&gw, &target) {
            // Boxed: rare, and its state would enlarge every request's future.
            return Box::pin(challenging::challenge_endpoint(ex, ch, req)).await;
        }
        // Route: the pool and class.
        let route = match route(&gw, &target, &req) {
            Ok(r) => r,
            Err(reason) => return ex.reject(&reason),
        };
        // Visit: a navigation's visit read; weir's cookie kept from the app.
        let visit = deciding::visit(&mut ex, &mut req, route);
        ex.log_mut().visited(visit);
        let view = RequestView::new(&target, req.headers());
        // Session, verified crawler, rules and challenge: the decision.
        let decision = deciding::policy(&mut ex, &view, route).await;
        let admitted = match ex.log_mut().decided(decision) {
            Decision::Admit(admitted) => admitted,
            Decision::Reject(reason) => return ex.answer(&reason),
            Decision::Challenge(page) => return challenging::challenged(ex, *page),
        };
        let routed = Routed::new(route, &mut ex);
        // Coalescing: identical anonymous GETs share one upstream request.
        let coalesced = coalescing::coalesce(&ex, &req, &routed, admitted.proof).await;
        let leader = match coalesced.recorded(ex.log_mut()) {
            Coalesced::Shared(shared) => return coalescing::shared_response(ex, &shared, &req),
            other => other.leader(),
        };
        // Admission: a slot in the lane the proof buys (or the challenge).
        if let Err(why) = admit::admission(&mut ex, &routed, &view, admitted).await {
            return unadmitted(ex, why);
        }
        // Upstream: as decided, with failover (a read refused unanswered: again).
        let client_side = responding::ClientSide::of(&mut req, leader);
        forwarding::as_decided(&mut ex, &mut req, routed.route);
        let mut result = forwarding::forward(&mut ex, &mut req, &routed).await;
        if let Err(Unanswered::Refused { again, .. }) = result {
            result = Box::pin(send_again(&mut ex, &mut req, &routed, *again)).await;
        }
        // Respond: the answer made the client's; its line written at its end.
        responding::respond(ex, result, client_side).await
    }
}

/// A read the app refused without a word, sent again once admission gives
/// it a slot again in `again`, its place in the queue; or shed while it
/// waited (no slot is held then, nothing to tell the limit). Its place is
/// taken now, so a second refusal is the answer. (`serve` boxes it: rare,
/// and its wait would enlarge every request's future.)
async fn send_again(
    ex: &mut Exchange<'_>,
    req: &mut Request<RequestBody>,
    routed: &Routed<'_>,
    again: log::Place,
) -> Result<Box<Response<UpstreamBody>>, Unanswered> {
    admit::requeue(ex, &routed.pool, again)
        .await
        .map_err(Unanswered::Shed)?;
    forwarding::forward(ex, req, routed).await
}

/// The answer to a request admission did not admit: the challenge page, a
/// deferring rule's refusal (reported as that rule's), or the shed's `503`.
fn unadmitted(mut ex: Exchange<'_>, why: admit::Unadmitted) -> Response<ResponseBody> {
    match why {
        admit::Unadmitted::Challenge(page) => challenging::challenged(ex, *page),
        admit::Unadmitted::Deferred(d) => {
            let reason = deciding::deferral_refused(&mut ex, *d);
            ex.answer(&reason)
        }
        admit::Unadmitted::Reject(reason) => ex.answer(&reason),
    }
}

/// A routed request's destination: its route, the pool it names and the
/// class's admission settings (looked up once, read by every later phase).
struct Routed<'a> {
    pub route: &'a Route,
    pub pool: Arc<Pool>,
    pub class: ClassAdmission,
}

impl<'a> Routed<'a> {
    /// The destination of `route`, recorded as the request's pool.
    pub(super) fn new(route: &'a Route, ex: &mut Exchange<'_>) -> Routed<'a> {
        let gw = ex.gw();
        let pool = gw.pools[route.pool].clone();
        ex.log_mut().routed(pool.name.clone());
        Routed {
            route,
            pool,
            class: gw
                .class_admission
                .get(route.class.as_str())
                .copied()
                .unwrap_or_default(),
        }
    }
}

/// Why a request's target was not read.
enum Unread {
    /// Framing refused (the body cannot be read either).
    Framing(ClientError),
    Target(RejectReason),
}

/// **Target phase**: after identity. Framing the codec left to weir, with
/// the same refusals on both listeners (HTTP/2's header count, codings
/// other than chunked), then the canonical target every later phase reads.
/// Changes only a pass that came in the address (with the challenge on:
/// [`challenging::pass_in_address`]). Result: the target and whether a pass
/// came in its address, or why the request is refused.
fn read_target(
    req: &mut Request<RequestBody>,
    conn: &ConnCtx,
    gw: &crate::gateway::Gateway,
) -> Result<(Target, bool), Unread> {
    let hyper_read = conn.edge.tls.is_some() || req.version() == Version::HTTP_2;
    if let Some(refusal) = hyper_read.then(|| framing(req, gw)).flatten() {
        return Err(Unread::Framing(refusal));
    }
    let mut target =
        Target::of(req, gw.path_policy).map_err(|e| Unread::Target(RejectReason::Target(e)))?;
    let pass_in_address = (gw.challenger.as_deref())
        .is_some_and(|ch| challenging::pass_in_address(ch, req, &mut target));
    Ok((target, pass_in_address))
}

/// A refusal of a request whose target was not read (its framing, or the
/// target itself): the log keeps the target as sent.
fn unread(
    mut log: Box<RequestLog>,
    req: &Request<RequestBody>,
    why: Unread,
    gw: &Gateway,
) -> Response<ResponseBody> {
    log.set_sent(req.uri());
    match why {
        // RFC 9113 8.1.1: on HTTP/2 a malformed request is a stream error;
        // the 400 comes first, then `RST_STREAM(PROTOCOL_ERROR)`.
        Unread::Framing(refusal) if req.version() == Version::HTTP_2 => {
            log.reject(&refusal, gw).map(ResponseBody::then_reset)
        }
        Unread::Framing(refusal) => {
            // The body is not read: the connection cannot carry another request.
            let mut resp = log.reject(&refusal, gw);
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            resp
        }
        Unread::Target(reason) => log.reject(&reason, gw),
    }
}

/// **Route phase**: after the target. The pool and class the request goes
/// to, and the class's body limit on what it declared: a body longer than
/// the class takes is refused (413) before it costs a rule, a slot or a
/// byte read (a chunked one is cut when it passes the size).
fn route<'g>(
    gw: &'g crate::gateway::Gateway,
    target: &Target,
    req: &Request<RequestBody>,
) -> Result<&'g crate::policy::Route, RejectReason> {
    let view = RequestView {
        target,
        headers: req.headers(),
    };
    let route = gw.routes.find(&view).ok_or(RejectReason::NoRoute)?;
    let max_bytes = route.settings.body.max_bytes;
    match http_body::Body::size_hint(req.body()).exact() {
        Some(declared) if declared > max_bytes => Err(RejectReason::BodyTooLarge { max_bytes }),
        _ => Ok(route),
    }
}

/// What a request's head must be, whichever codec read it: weir's HTTP/1
/// codec refuses these itself (so they are checked here only for hyper's
/// requests); hyper's (TLS, HTTP/2) lets through a
/// `Transfer-Encoding` other than `chunked` and, on HTTP/2, any number of
/// fields, and a `Content-Length` weir would not read (over 2^63).
/// `Some`: the refusal (501, 400, 431).
fn framing(req: &Request<RequestBody>, gw: &crate::gateway::Gateway) -> Option<ClientError> {
    use weir_http::framing::{only_chunked, parse_content_length};
    if !only_chunked(req.headers()) {
        return Some(ClientError::UnsupportedCoding);
    }
    for length in req.headers().get_all(header::CONTENT_LENGTH) {
        if let Err(e) = parse_content_length(length.as_bytes()) {
            return Some(ClientError::Malformed(e.0));
        }
    }
    // RFC 9113 8.2.1: malformed, never forwarded. HTTP/1 parsers trim the
    // whitespace; hyper's HTTP/2 keeps it and passes it on.
    let padded = |v: &HeaderValue| {
        let b = v.as_bytes();
        matches!(b.first(), Some(b' ' | b'\t')) || matches!(b.last(), Some(b' ' | b'\t'))
    };
    if req.headers().values().any(padded) {
        return Some(ClientError::Malformed(
            "a field value that starts or ends with whitespace",
        ));
    }
    if req.version() == Version::HTTP_2 && !host_is_authority(req) {
        return Some(ClientError::Malformed("a Host that is not the :authority"));
    }
    (req.headers().len() > gw.edge.max_headers).then_some(ClientError::HeadTooLarge)
}

/// Whether an HTTP/2 request's `Host`, if it has one, names what its
/// `:authority` names. RFC 9113 8.3.1: a server should treat a request whose
/// two differ as malformed, after scheme-based normalization (RFC 3986
/// 6.2.3): the host's case and a default port do not count. Several `Host`
/// fields, or one without an `:authority`, are left to the target phase's
/// reading (which takes the `Host` as HTTP/1 does).
fn host_is_authority(req: &Request<RequestBody>) -> bool {
    let (Some(authority), Some(host)) = (req.uri().authority(), req.headers().get(header::HOST))
    else {
        return true;
    };
    let Ok(host) = host.to_str() else {
        return false;
    };
    let default_port = if req.uri().scheme() == Some(&http::uri::Scheme::HTTPS) {
        ":443"
    } else {
        ":80"
    };
    // Compared in place: no copy made to lowercase either side.
    let a = authority.as_str();
    let a = a.strip_suffix(default_port).unwrap_or(a);
    let h = host.strip_suffix(default_port).unwrap_or(host);
    a.eq_ignore_ascii_case(h)
}

/// **Identity phase**: first, before the target is read. Names the client:
/// the peer, or (only through a trusted proxy) the PROXY protocol source or
/// a forwarding field; warns when fields came from an untrusted peer, or
/// when one peer carries most traffic while no proxy is trusted (weir may
/// be behind a load balancer it does not know). May change: the warnings'
/// metrics, the dominance detector. Result: the [`ClientId`].
fn identify(
    req: &Request<RequestBody>,
    conn: &ConnCtx,
    gw: &crate::gateway::Gateway,
    now: Instant,
) -> ClientId {
    let resolved = forwarded::resolve(
        conn.edge.peer,
        conn.edge.proxy_source,
        req.headers(),
        &gw.trusted,
        gw.client_header,
    );
    let rt = &conn.rt;
    if let Some(w) = resolved.warning {
        let kind = w.as_str();
        rt.metrics.forwarding_warning(kind);
        let slot = if kind == "untrusted_peer" {
            Warning::UntrustedPeer
        } else {
            Warning::Forwarding
        };
        if rt.warnings.should_log(slot) {
            tracing::warn!(
                kind,
                peer = %conn.edge.peer.ip(),
                "forwarding headers ignored: the peer is not in identity.trusted_proxies \
                 (if weir runs behind a load balancer, add its addresses there)"
            );
        }
    }
    if gw.trusted.is_empty()
        && let Some(d) = gw.dominance.observe(conn.edge.peer.ip(), now)
    {
        rt.metrics.forwarding_warning("dominant_peer");
        rt.metrics.dominant_peer_share.set(d.share);
        if rt.warnings.should_log(Warning::DominantPeer) {
            tracing::warn!(
                peer = %d.peer,
                share = d.share,
                requests = d.requests,
                "one peer address sends most requests and no trusted proxy is configured: \
                 weir may be behind a load balancer and see every client as one address"
            );
        }
    }
    resolved.client
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
        eprintln!("handle's future: {size} bytes");
        assert!(size <= 3 * 1024, "handle's future is {size} bytes");
    }
}
