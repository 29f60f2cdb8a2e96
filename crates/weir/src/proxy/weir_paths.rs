//! **weir's own endpoints**: `/.weir/challenge.js` and
//! `/.weir/challenge/verify`, served before any policy phase (the page
//! they serve is the decision's; see `deciding`).

use std::sync::Arc;
use std::time::SystemTime;

use http::{Request, Response};
use weir_http::body::{RequestBody, ResponseBody};
use weir_http::target::Target;

use super::log::RequestLog;
use crate::challenge::Challenger;
use crate::identity::ClientId;
use crate::policy::RejectReason;
use crate::respond::Accepts;

/// **Challenge endpoints**: `/.weir/challenge.js` and
/// `/.weir/challenge/verify`, weir's own paths, served before any policy
/// phase. Reads at most `challenge::MAX_VERIFY_BODY` of the answer, under
/// the per-address in-flight cap and `[limits]`' body timeouts like any
/// body (a verify that sent 6 of its 1,000 bytes once stayed open for
/// good). A no-script refresh link that came early is held until its delay
/// is over. Result: the script, a redirect with a pass, or a fresh challenge.
pub(super) async fn challenge_endpoint(
    ch: &Challenger,
    req: Request<RequestBody>,
    target: &Target,
    client: &ClientId,
    mut log: Box<RequestLog>,
    gw: &crate::gateway::Gateway,
) -> Response<ResponseBody> {
    use http_body_util::BodyExt as _;
    log.record.class = Arc::from("challenge");
    let (parts, mut body) = req.into_parts();
    let accept = Accepts::of(&parts.headers);
    let max = gw.edge.max_in_flight_per_ip;
    let Some(slot) =
        log.conn
            .rt
            .client_in_flight
            .acquire(client.client, max, gw.edge.conn.ipv6_prefix)
    else {
        log.record.decision = "reject";
        return log.answer(&RejectReason::ClientInFlight { limit: max }, accept);
    };
    log.held.in_flight = Some(slot);
    // The timeouts of any body; the size is `Limited`'s, below.
    body.watch(gw.edge.body, None);
    let limited = http_body_util::Limited::new(body, crate::challenge::MAX_VERIFY_BODY);
    let bytes = match limited.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            log.record.decision = "reject";
            let timed_out = e.is::<weir_http::body::BodyReadTimeout>()
                || e.is::<weir_http::body::BodyTooSlow>();
            let reason = if timed_out {
                RejectReason::BodyTimeout
            } else {
                RejectReason::BadRequest("challenge answer too large or cut")
            };
            return log.answer(&reason, accept);
        }
    };
    // A no-script link that came before its delay (the page asks for whole
    // seconds only) waits out the rest here, under the address's in-flight
    // slot, instead of bouncing to a fresh challenge.
    if let Some(left) = ch.refresh_hold(target, &parts.headers, client, SystemTime::now()) {
        tokio::time::sleep(left).await;
    }
    let tls = log.conn.edge.tls.is_some();
    match ch.handle(
        target,
        &parts.headers,
        &bytes,
        client,
        tls,
        SystemTime::now(),
    ) {
        Some(Ok(resp)) => super::deciding::challenged(resp, log),
        Some(Err(refusal)) => {
            log.record.decision = "reject";
            log.answer(&refusal, accept)
        }
        None => log.answer(&RejectReason::NoRoute, accept),
    }
}
