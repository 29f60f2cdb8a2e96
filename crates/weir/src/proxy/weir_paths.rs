//! **weir's own endpoints**: `/.weir/challenge.js` and
//! `/.weir/challenge/verify`, served before any policy phase (the page
//! they serve is the decision's; see `deciding`).

use std::time::SystemTime;

use http::{Request, Response};
use weir_http::body::{RequestBody, ResponseBody};

use weir_http::target::Target;

use super::exchange::Exchange;
use crate::challenge::Challenger;
use crate::gateway::Gateway;
use crate::policy::RejectReason;

/// What serves `target` when it is one of weir's own paths: the
/// challenger, for its script and its answers.
pub(super) fn owner<'g>(gw: &'g Gateway, target: &Target) -> Option<&'g Challenger> {
    gw.challenger
        .as_deref()
        .filter(|ch| ch.is_challenge_path(target.path()))
}

/// **Challenge endpoints**: `/.weir/challenge.js` and
/// `/.weir/challenge/verify`, weir's own paths, served before any policy
/// phase. Reads at most `challenge::MAX_VERIFY_BODY` of the answer, under
/// the per-address in-flight cap and `[limits]`' body timeouts like any
/// body (a verify that sent 6 of its 1,000 bytes once stayed open for
/// good). A no-script refresh link that came early is held until its delay
/// is over. Result: the script, a redirect with a pass, or a fresh challenge.
pub(super) async fn challenge_endpoint(
    mut ex: Exchange<'_>,
    ch: &Challenger,
    req: Request<RequestBody>,
) -> Response<ResponseBody> {
    use http_body_util::BodyExt as _;
    let (gw, target) = (ex.gw(), ex.target());
    ex.log_mut().weir_endpoint();
    let (parts, mut body) = req.into_parts();
    if let Err(refusal) = ex.hold_client_slot() {
        return ex.reject(&refusal);
    }
    // The timeouts of any body; the size is `Limited`'s, below.
    body.watch(gw.edge.body, None);
    let limited = http_body_util::Limited::new(body, crate::challenge::MAX_VERIFY_BODY);
    let bytes = match limited.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            let timed_out = e.is::<weir_http::body::BodyReadTimeout>()
                || e.is::<weir_http::body::BodyTooSlow>();
            let reason = if timed_out {
                RejectReason::BodyTimeout
            } else {
                RejectReason::BadRequest("challenge answer too large or cut")
            };
            return ex.reject(&reason);
        }
    };
    // A no-script link that came before its delay (the page asks for whole
    // seconds only) waits out the rest here, under the address's in-flight
    // slot, instead of bouncing back to its page.
    let asker = ex.asker(&parts.headers);
    if let Some(left) = ch.refresh_hold(target, asker, SystemTime::now()) {
        tokio::time::sleep(left).await;
    }
    match ch.handle(target, asker, &bytes, ex.challenge_at()) {
        Some(Ok(resp)) => super::deciding::challenged(ex, resp),
        Some(Err(refusal)) => {
            if let Some(e) = refusal.event() {
                super::deciding::challenge_event(ex.metrics(), &e);
            }
            ex.reject(&refusal)
        }
        None => ex.answer(&RejectReason::NoRoute),
    }
}
