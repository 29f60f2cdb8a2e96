//! **The challenge's part in a request**, in one place: when the page is
//! offered and what a pass is worth. It answers for the phases that meet
//! it: the target phase (a pass that came in the address, or in the
//! `Referer`), the rules-and-challenge phase (a pass, a loop, the page now
//! or on a long wait, [`Challenged`]), admission (the page instead of a
//! shed, [`page_at_admission`]) and weir's own endpoints (the script and
//! the answers, [`challenge_endpoint`]), and it records the challenge's
//! events and pressure.
//!
//! Does not: decide what a proof buys (admission's lanes and the rules),
//! or keep any state (the challenger, its budget and the pressure table
//! are the stage's, `crate::challenge`).

use std::time::SystemTime;

use bytes::Bytes;
use http::{Request, Response, header};
use weir_http::body::{RequestBody, ResponseBody};
use weir_http::target::Target;

use super::exchange::Exchange;
use crate::admission::Lane;
use crate::challenge::{ChallengeEvent, ChallengeMode, Challenger, PassCheck, PassKind, PassToken};
use crate::gateway::Gateway;
use crate::observe::metrics::{ChallengeLabels, Metrics, PoolLabels};
use crate::policy::route::{RequestView, Route};
use crate::policy::{ChallengeInstead, PageWhen, Proof, RejectReason};
use crate::runtime::Runtime;

/// What the challenge says of a request of a challenging class.
pub(super) enum Challenged {
    /// It holds a valid pass (its id).
    Pass(u64),
    /// Its browser is in a loop: the network's pass id, instead of another
    /// challenge ([`Proof::looped`]).
    Looped(u64),
    /// Not challenged now.
    NotNow,
    /// It must show it is a browser first: the page.
    Page(Box<Response<Bytes>>),
    /// An unproven navigation of an `under_pressure` class: challenged if it
    /// cannot be served promptly (admission's call, or a rule's).
    Instead(ChallengeInstead),
}

/// The challenge's say on a request (see [`Challenged`]): none for a
/// verified session or crawler, or without `[challenge]`; the pass it
/// carries on a class that does not challenge; else [`challenge`]'s.
pub(super) fn challenge_of(
    ex: &mut Exchange<'_>,
    view: &RequestView<'_>,
    route: &Route,
    proof: &Proof,
) -> Challenged {
    let Some(ch) = &ex.gw().challenger else {
        return Challenged::NotNow;
    };
    if proof.verified || proof.bot.is_some() {
        return Challenged::NotNow;
    }
    // A pass is proof on every request, not only where the class
    // challenges: a person's cheap pages are their own turn too (a
    // carrier NAT's pages, keyed by its /16, had waited seconds behind
    // one turn while the same people's searches went by their passes).
    match route.challenge {
        ChallengeMode::Off => {
            carried_pass(ex, ch, view).map_or(Challenged::NotNow, |t| worth(ex, t))
        }
        _ => challenge(ex, ch, view, route),
    }
}

/// What a valid pass is worth to this request. A pass is proof (the
/// `pass` lane, its own client for the rules that count passes, exempt
/// from the rules that name `pass`) when its browser did the page's work,
/// or when it waited out the no-script refresh in a visit that has read
/// more pages than it asked costly ones of, this one included
/// (`crate::visit::RequestVisit::reads_more_than_it_costs`): a person
/// without JavaScript. A wait alone proves a client follows a meta
/// refresh, as Scrapy does by default: it only spends the challenge's
/// say (the request is not offered the page again) and the request waits
/// as the unproven do. A crawler that reads an article before each
/// expensive page reads as many as it costs, and stays there.
///
/// Why: a pass that cost a 500 ms wait had bought a turn of its own above
/// everyone unproven for 12 hours, and crawlers that followed the refresh
/// took people's turns: people within 2 s 86% in the lab
/// (`2026-09-23-crawlers-follow-refresh.toml`), 14% in the replay.
fn worth(ex: &mut Exchange<'_>, pass: PassToken) -> Challenged {
    let persons_visit = || (ex.log().visit()).is_some_and(|(v, _)| v.reads_more_than_it_costs());
    if pass.kind == PassKind::Work || persons_visit() {
        ex.log_mut().pass_carried();
        Challenged::Pass(pass.id)
    } else {
        ex.log_mut().wait_pass_alone();
        Challenged::NotNow
    }
}

/// **Target phase, its last step** (with the challenge on): a pass that
/// came in the address (a browser that keeps no cookies gets it there,
/// `Challenger::handle`) is taken out of the target and the request's URI,
/// every occurrence in every spelling, so the app, the rules and the log
/// never see it, and read as the cookie it stands for. Nothing changes
/// for a request without one. Result: whether a pass came in the address
/// (the answer then keeps the browser from sending it on,
/// `challenge::secret::REFERRER_POLICY`).
pub(super) fn pass_in_address(
    ch: &Challenger,
    req: &mut Request<RequestBody>,
    target: &mut Target,
) -> bool {
    let tokens = target.take_query_pairs(ch.pass_name());
    if tokens.is_empty() {
        return false;
    }
    let mut parts = req.uri().clone().into_parts();
    parts.path_and_query = target.path_and_query().parse().ok();
    if let Ok(uri) = http::Uri::from_parts(parts) {
        *req.uri_mut() = uri;
    }
    // Only a token's spelling becomes a cookie: `?weir_pass=x;session=y`
    // in a link someone was sent must not set the app's `session`.
    let pairs: Vec<String> = (tokens.iter())
        .filter(|t| crate::challenge::token::is_well_formed(t))
        .map(|t| format!("{}={t}", ch.pass_name()))
        .collect();
    if pairs.is_empty() {
        return true;
    }
    // Into one `Cookie` field with the others (RFC 6265 5.4; HTTP/2 sends
    // several, which RFC 9113 8.2.3 joins with "; " for HTTP/1): a browser
    // that keeps no cookies sends none. A field that is not text stays as
    // sent, and the pass goes beside it.
    let headers = req.headers_mut();
    let mut text: Vec<&str> = Vec::new();
    let mut opaque = Vec::new();
    for field in headers.get_all(http::header::COOKIE) {
        match field.to_str() {
            Ok(t) => text.push(t),
            Err(_) => opaque.push(field.clone()),
        }
    }
    text.extend(pairs.iter().map(String::as_str));
    // The name is a checked token and the pass base64url: a field value.
    let Ok(joined) = http::HeaderValue::from_str(&text.join("; ")) else {
        return true;
    };
    headers.insert(http::header::COOKIE, joined);
    for field in opaque {
        headers.append(http::header::COOKIE, field);
    }
    true
}

/// The valid pass the request carries, if any (a bad, expired or foreign
/// one counted as a challenge event, and the request unproven).
fn carried_pass(
    ex: &mut Exchange<'_>,
    ch: &Challenger,
    view: &RequestView<'_>,
) -> Option<PassToken> {
    let check = ch.pass(view.headers, ex.client(), SystemTime::now());
    if let Some(e) = check.event() {
        challenge_event(ex.metrics(), &e);
    }
    match check {
        PassCheck::Valid(t) => Some(t),
        _ => None,
    }
}

/// What a pass the request carries is worth; without one, a browser whose
/// passes do not come back gets its page on priority, not a fourth
/// challenge in a minute (`challenge::budget`, "never a loop").
fn pass_or_loop(
    ex: &mut Exchange<'_>,
    ch: &Challenger,
    view: &RequestView<'_>,
) -> Option<Challenged> {
    if let Some(pass) = carried_pass(ex, ch, view) {
        return Some(worth(ex, pass));
    }
    let id = ex.challenge_at().looping(ex.asker(view.headers))?;
    ex.log_mut().looped();
    Some(Challenged::Looped(id))
}

/// The challenge for a request of a challenging class (see [`Challenged`]).
fn challenge(
    ex: &mut Exchange<'_>,
    ch: &Challenger,
    view: &RequestView<'_>,
    route: &Route,
) -> Challenged {
    if let Some(said) = pass_or_loop(ex, ch, view) {
        return said;
    }
    let (navigation, shape) = (ex.navigation(view.headers), ex.shape());
    let (rt, gw, client) = (ex.rt(), ex.gw(), ex.client());
    let (asker, at) = (ex.asker(view.headers), ex.challenge_at());
    let pool = &gw.pools[route.pool];
    // Learned: only the shapes the app answers slowly, which a crawler flood
    // is made of, are worth a visitor's proof while they wait; a cheap page
    // waits like anyone's, and gets the page only instead of a refusal (a
    // person who waited gets the challenge, not a `503`). A pool without a
    // queue learns nothing and sheds nothing: no page.
    let queue = pool.admission.as_ref();
    let expensive = queue.is_some_and(|q| q.shapes().is_expensive(shape));
    if route.challenge == ChallengeMode::Learned && !expensive {
        if queue.is_none() || !ch.eligible(view.target, view.headers, navigation, client) {
            return Challenged::NotNow;
        }
        return Challenged::Instead(ChallengeInstead {
            difficulty: ch.base_difficulty(),
            when: PageWhen::Refused,
            engaged: false,
        });
    }
    let (engaged, difficulty) = observe_pressure(ch, pool, rt);
    if !ch.eligible(view.target, view.headers, navigation, client) {
        return Challenged::NotNow;
    }
    match route.challenge {
        ChallengeMode::Always => {
            Challenged::Page(Box::new(ch.page(view.target, asker, difficulty, at)))
        }
        // Proof buys priority: the page only where the navigation would
        // otherwise be refused, or wait long while pressure is on.
        // A learned class offers it on an expected long wait whether or not
        // pressure has engaged: pressure engages only after `engage_after`
        // (10 s by default), and a person's search that would wait a second
        // behind a flood of its shape gains from the page at once (people
        // without JavaScript had waited 1 s for it, then the no-script
        // wait, and came past 2 s: docs/lab.md, crawlers like people).
        _ => Challenged::Instead(ChallengeInstead {
            difficulty,
            when: if engaged || route.challenge == ChallengeMode::Learned {
                PageWhen::LongWait
            } else {
                PageWhen::TwiceTheWait
            },
            engaged,
        }),
    }
}

/// Feeds `pool`'s pressure state machine with its queue now, and exports
/// whether it is engaged; the state and the page's difficulty.
///
/// Pressure is what people would wait behind: every lane above `deferred`
/// (deferred requests only take what nobody else wants). A pool without a
/// queue is never under it. (The wait threshold is not fed yet: depth
/// alone engages.)
fn observe_pressure(ch: &Challenger, pool: &crate::upstream::Pool, rt: &Runtime) -> (bool, u8) {
    let queue = pool.admission.as_ref();
    let depth = queue.map_or(0, |q| q.snapshot().queued_above(Lane::DEFERRED));
    let (engaged, difficulty) = rt.pressure.observe(
        &pool.name,
        &ch.pressure(),
        std::time::Instant::now(),
        depth,
        std::time::Duration::ZERO,
        ch.base_difficulty(),
    );
    let labels = PoolLabels {
        pool: pool.name.clone(),
    };
    let gauge = rt.metrics.challenge_engaged.get_or_create(&labels);
    gauge.set(i64::from(engaged));
    (engaged, difficulty)
}

/// Counts a challenge event (`weir_challenge_events_total`, and the time to
/// solve of a solved one).
pub(super) fn challenge_event(metrics: &Metrics, e: &ChallengeEvent) {
    let (event, reason) = e.labels();
    metrics
        .challenge_events
        .get_or_create(&ChallengeLabels { event, reason })
        .inc();
    if let ChallengeEvent::Solved { time_to_solve, .. } = e {
        metrics.challenge_solve.observe(time_to_solve.as_secs_f64());
    }
}

/// Answers with a challenger's response (a page, the script, a verdict),
/// recording its events.
pub(super) fn challenged(mut ex: Exchange<'_>, resp: Response<Bytes>) -> Response<ResponseBody> {
    let events = crate::challenge::events(&resp);
    for e in events {
        challenge_event(ex.metrics(), e);
    }
    ex.log_mut()
        .challenged(events.first().map(ChallengeEvent::mark));
    ex.respond_with(resp)
}

/// A pass in the `Referer` (the page before held it in its address) taken
/// out, before the log records the field or the app sees it
/// (`challenge::secret`).
pub(super) fn pass_out_of_the_referer(
    ch: &crate::challenge::Challenger,
    req: &mut Request<RequestBody>,
) {
    let headers = req.headers_mut();
    let Some(referer) = headers.get(header::REFERER) else {
        return;
    };
    if let Some(clean) = crate::challenge::secret::referer_without_pass(referer, ch.pass_name()) {
        headers.insert(header::REFERER, clean);
    }
}

/// The challenge page for a navigation admission would not serve promptly,
/// counting the wait since `asked` (when it came to the queue) towards the
/// no-script delay ([`Challenger::page_after`]).
pub(super) fn page_at_admission(
    ex: &Exchange<'_>,
    (c, ch): (ChallengeInstead, &Challenger),
    view: &RequestView<'_>,
    asked: tokio::time::Instant,
) -> Box<Response<Bytes>> {
    let asker = ex.asker(view.headers);
    let page = ch.page_after(
        view.target,
        asker,
        c.difficulty,
        ex.challenge_at(),
        asked.elapsed(),
    );
    Box::new(page)
}

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
        Some(Ok(resp)) => challenged(ex, resp),
        Some(Err(refusal)) => {
            if let Some(e) = refusal.event() {
                challenge_event(ex.metrics(), &e);
            }
            ex.reject(&refusal)
        }
        None => ex.answer(&RejectReason::NoRoute),
    }
}
