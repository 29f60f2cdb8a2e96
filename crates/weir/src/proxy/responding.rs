//! **Respond phase**: the upstream's response made the client's
//! (hop-by-hop fields, upgrades, a coalescing leader's buffering, the
//! client's protocol version), or a failure answered by the rescue from
//! its typed reason.

use std::time::Duration;

use http::{Request, Response, StatusCode, Version};
use weir_http::body::{RequestBody, ResponseBody};
use weir_http::connections::UpstreamBody;
use weir_http::server::ClientUpgrade;

use super::coalescing::lead;
use super::exchange::Exchange;
use super::forwarding::Unanswered;
use super::log::RequestLog;
use crate::admission::coalesce::Leader;
use crate::policy::{RejectReason, ShedCause};
use crate::respond::{Reason, Side};
use crate::upstream::forward::{ForwardError, strip_hop_by_hop};

/// The client's side of the exchange, taken before the request is sent
/// (the upstream phase changes its head): its protocol version, its side
/// of an upgrade, and the coalescing group it leads. The respond phase
/// needs it to make the upstream's response the client's.
pub(super) struct ClientSide {
    version: Version,
    upgrade: Option<ClientUpgrade>,
    leader: Option<(Box<Leader>, usize)>,
}

impl ClientSide {
    pub fn of(req: &mut Request<RequestBody>, leader: Option<(Box<Leader>, usize)>) -> ClientSide {
        ClientSide {
            version: req.version(),
            upgrade: super::forwarding::is_upgrade(req).then(|| ClientUpgrade::on(req)),
            leader,
        }
    }
}

/// **Respond phase**: after the upstream phase. The upstream's response
/// made the client's: hop-by-hop fields removed, an agreed upgrade turned
/// into a tunnel, a coalescing leader's body buffered and shared, the
/// client's protocol version. A failure is answered by the rescue from its
/// reason. Result: the response; the log record goes with its body, and is
/// written when the body ends.
pub(super) async fn respond(
    mut ex: Exchange<'_>,
    result: Result<Box<Response<UpstreamBody>>, Unanswered>,
    client_side: ClientSide,
) -> Response<ResponseBody> {
    let ClientSide {
        version: client_version,
        upgrade: client_upgrade,
        leader,
    } = client_side;
    let mut resp = match result {
        Ok(resp) => resp,
        Err(why) => return unanswered(ex, why),
    };
    ex.log_mut().app_answered(resp.status());
    if let Err(fault) = switch_protocols(&ex, &mut resp, client_upgrade) {
        return ex.answer(&fault);
    }
    let (mut parts, body) = resp.into_parts();
    let body = match leader {
        // Boxed: rare, and large for every request's future to carry.
        Some((leader, max)) => match Box::pin(lead(*leader, &mut parts, body, max)).await {
            Ok(b) => b,
            Err(e) => {
                ex.log_mut().failed(format!("upstream body: {e}"));
                return ex.answer(&AppFault::BodyCut);
            }
        },
        None => ResponseBody::upstream(body),
    };
    // The client gets its own protocol version, whatever the upstream spoke.
    parts.version = client_version;
    let mut log = ex.into_log();
    log.passed_on(parts.status);
    log.stamp(&mut parts.headers);
    if log.visit().is_some() {
        visit_fields(&mut log, &mut parts, &body);
    }
    Response::from_parts(parts, body.on_complete(log))
}

/// The response's hop-by-hop fields removed, and an upgrade the client
/// asked for and the app agreed to (`101`) turned into a tunnel between
/// them. A switch no one asked for is the app's fault: the client would get
/// a connection it cannot speak on (the app's end closes with `resp`).
fn switch_protocols(
    ex: &Exchange<'_>,
    resp: &mut Response<UpstreamBody>,
    client_upgrade: Option<ClientUpgrade>,
) -> Result<(), AppFault> {
    let is_101 = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
    if is_101 && client_upgrade.is_none() {
        return Err(AppFault::UnaskedUpgrade);
    }
    strip_hop_by_hop(resp.headers_mut(), is_101 && client_upgrade.is_some());
    if is_101
        && let Some(client_upgrade) = client_upgrade
        && let Some((upstream, early)) = resp.body_mut().take_tunnel()
    {
        let tunnel_guard = ex.conn().edge.guard.clone();
        tokio::spawn(async move {
            client_upgrade.tunnel(upstream, early).await;
            drop(tunnel_guard);
        });
    }
    Ok(())
}

/// The visit's own fields on an app's page (its next cookie, unless the
/// page may be cached for others), for a request that carries a visit.
fn visit_fields(log: &mut RequestLog, parts: &mut http::response::Parts, body: &ResponseBody) {
    // A plain response's fields are not in the map (weir_http::fields).
    use weir_http::server::Outgoing as _;
    let received = body.received_fields().map(|r| r.values("cache-control"));
    let shared = crate::visit::shared_cacheable_map(&parts.headers)
        || received.is_some_and(crate::visit::shared_cacheable);
    let served = crate::visit::ServedBy::App {
        status: parts.status,
        shared_cacheable: shared,
    };
    log.own_fields(served, &mut parts.headers);
}

/// The rescue's answer to a request the upstream phase has no response
/// for: a shed's `503`, no healthy server's (a shed too: nothing was
/// sent), or the failure's own, by its side.
fn unanswered(mut ex: Exchange<'_>, why: Unanswered) -> Response<ResponseBody> {
    match why {
        Unanswered::Shed(reason) => ex.answer(&reason),
        Unanswered::Failed(ForwardError::NoHealthyServer) => {
            let reason = RejectReason::Shed {
                cause: ShedCause::NoHealthyServer,
                retry_after: Duration::from_secs(1),
            };
            ex.answer(&reason)
        }
        Unanswered::Failed(e) | Unanswered::Refused { error: e, .. } => {
            ex.log_mut().failed(e.to_string());
            ex.answer(&e)
        }
    }
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
