//! **Coalescing phase**: identical anonymous GETs share one upstream
//! request. The stage is `admission::coalesce`; this phase joins a request
//! to its group, buffers a leader's response
//! for its followers, and answers a follower with a copy.

use std::sync::Arc;

use http::{Request, Response};
use weir_http::body::{RequestBody, ResponseBody};
use weir_http::connections::UpstreamBody;

use super::Routed;
use super::exchange::Exchange;
use super::log::RequestLog;
use crate::admission::coalesce::{CoalesceKey, Leader, Role, SharedResponse, shareable};
use crate::observe::access_log::Coalescing;
use crate::observe::metrics::ClassLabels;
use crate::policy::Proof;

/// How a request joined request coalescing.
pub(super) enum Coalesced {
    /// Not coalesced: a personal request, a body, a class without it.
    Alone,
    /// The first of its key: it goes upstream, and its response is shared
    /// if it can be (bodies up to the byte cap). Boxed: rare, and large.
    Leader(Box<Leader>, usize),
    /// Its leader's response, to answer with a copy: no upstream request.
    Shared(Arc<SharedResponse>),
    /// A follower whose leader's response could not be shared: it goes
    /// upstream itself.
    Unshared,
}

impl Coalesced {
    /// The group this request leads, if it leads one.
    pub fn leader(self) -> Option<(Box<Leader>, usize)> {
        match self {
            Coalesced::Leader(leader, max) => Some((leader, max)),
            Coalesced::Alone | Coalesced::Shared(_) | Coalesced::Unshared => None,
        }
    }

    /// Recorded in `log` (its `coalesced`, for a request not alone), and
    /// passed on. (Taken and given back: a result `serve` lent out would
    /// keep its place in the request's future past every later wait.)
    pub fn recorded(self, log: &mut RequestLog) -> Coalesced {
        let role = match self {
            Coalesced::Alone => return self,
            Coalesced::Leader(..) => Coalescing::Leader,
            Coalesced::Shared(_) => Coalescing::Shared,
            Coalesced::Unshared => Coalescing::Unshared,
        };
        log.coalesced(role);
        self
    }
}

/// **Coalescing phase**: after the policy (rules see and count every
/// request, followers too), before admission (a follower waits for its
/// leader holding no admission slot and no server, so a storm on one page
/// costs one worker). Only anonymous requests coalesce: no verified session,
/// no pass, no body, and (the key refuses them) no `Cookie`,
/// `Authorization`, `Range`, `Upgrade` or condition. A follower whose
/// leader's response cannot be shared goes upstream itself, through
/// admission like any request. May change: the coalescer. Result: how the
/// request joined (`serve` records its role).
pub(super) async fn coalesce(
    ex: &Exchange<'_>,
    req: &Request<RequestBody>,
    routed: &Routed<'_>,
    proof: Proof,
) -> Coalesced {
    let (Some(max), Some(coalescer)) = (
        routed.class.coalesce_max_body,
        ex.gw().coalescers.get(routed.route.class.as_str()),
    ) else {
        return Coalesced::Alone;
    };
    if proof != Proof::default() || !http_body::Body::is_end_stream(req.body()) {
        return Coalesced::Alone;
    }
    let Some(key) = CoalesceKey::for_request(ex.target(), req.headers()) else {
        return Coalesced::Alone;
    };
    match coalescer.join(key.in_pool(&routed.pool.name)) {
        Role::Leader(l) => Coalesced::Leader(Box::new(l), max),
        Role::Follower(f) => match f.wait().await {
            Some(shared) => Coalesced::Shared(shared),
            None => Coalesced::Unshared,
        },
    }
}

/// A coalescing leader's response: buffered and published to its followers
/// when shareable, streamed to this client alone otherwise. A body without a
/// known length (chunked) is read until it ends or passes the cap; past the
/// cap, this client gets what was read followed by the rest, and the
/// followers go upstream themselves. A body error drops the leader, which
/// sends the followers upstream too.
pub(super) async fn lead(
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
    ex: Exchange<'_>,
    shared: &SharedResponse,
    req: &Request<RequestBody>,
) -> Response<ResponseBody> {
    let metrics = ex.metrics();
    let mut log = ex.into_log();
    let version = req.version();
    log.passed_on(shared.status);
    let labels = ClassLabels {
        class: log.class().clone(),
    };
    metrics.coalesced_requests.get_or_create(&labels).inc();
    let mut headers = shared.headers.clone();
    log.stamp(&mut headers);
    let cacheable = crate::visit::shared_cacheable_map(&headers);
    let served = crate::visit::ServedBy::App {
        status: shared.status,
        shared_cacheable: cacheable,
    };
    log.own_fields(served, &mut headers);
    let body = ResponseBody::full(shared.body.clone()).on_complete(log);
    let mut resp = Response::new(body);
    *resp.status_mut() = shared.status;
    *resp.version_mut() = version;
    *resp.headers_mut() = headers;
    resp
}
