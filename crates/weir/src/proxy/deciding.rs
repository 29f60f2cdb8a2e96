//! The policy phases of a routed request: its session, whether it is a
//! verified crawler, then the challenge and the rules, ending in the
//! request's [`Decision`].
//!
//! The stages decide (`identity::session`, `challenge`, `policy::rules`);
//! these phases give them the request's facts, and record what they said
//! (the log record, metrics, the human-collateral signals, the slots a rule
//! holds). They build no response: the composer answers a `Reject` through
//! the rescue and a `Challenge` with its page.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use weir_http::body::{RequestBody, ResponseBody};
use weir_http::target::Target;

use super::exchange::Exchange;
use super::log::RequestLog;
use crate::admission::Lane;
use crate::challenge::{ChallengeEvent, ChallengeMode, Challenger, PassCheck, PassKind, PassToken};
use crate::evidence::Collateral;
use crate::gateway::Gateway;
use crate::identity::ClientAddr;
use crate::identity::bots::BotId;
use crate::identity::bots::signature::SignedRequest;
use crate::identity::session::SessionState;
use crate::observe::metrics::{
    BotLabels, ChallengeLabels, CollateralLabels, Metrics, PoolLabels, RuleLabels, RuleLevelLabels,
};
use crate::policy::route::{RequestView, Route};
use crate::policy::rules::{
    Deferral, RequestFacts, Rule, RuleObserver, RuleRejection, RuleResult, judge,
};
use crate::policy::{Admitted, ChallengeInstead, Decision, PageWhen, Proof, RejectReason};
use crate::runtime::Runtime;
use crate::visit::{RequestVisit, Visits};
use weir_limiter::MonoTime;

/// **Visit phase**: after routing, for every routed request while
/// `[visit]` is on. Reads a navigation's visit cookie (`crate::visit`), or
/// another request's for its turn in admission, and notes whether a
/// navigation asks for a costly page: one of a class the operator
/// limited (it has rules), or whose unproven requests wait in the
/// `anonymous` lane or below (configured, or a shape the pool learned is
/// expensive). Takes weir's cookie out of the request: the app
/// has no use for it, and a cache keyed on `Cookie` (or coalescing, which
/// refuses requests with one) must not see people's requests as personal
/// because weir counted their pages. May change: the request's `Cookie`
/// fields. Result: the visit the request is part of, if it carries one
/// (`serve` keeps it in the log, where the rules and the answer's cookie
/// read it).
pub(super) fn visit(
    ex: &mut Exchange<'_>,
    req: &mut Request<RequestBody>,
    route: &Route,
) -> Option<(RequestVisit, Arc<Visits>)> {
    let gw = ex.gw();
    let visits = gw.visits.as_ref()?;
    let now = SystemTime::now();
    let navigation = ex.navigation(req.headers());
    let read = visits.read(req.method(), req.headers(), navigation, ex.client(), now);
    weir_http::cookie::remove(req.headers_mut(), visits.cookie_name());
    let mut visit = read?;
    if visit.navigation {
        let class = (gw.class_admission.get(route.class.as_str()).copied()).unwrap_or_default();
        let queue = gw.pools[route.pool].admission.as_ref();
        let shape = ex.shape();
        visit.costly = !route.rules.is_empty()
            || queue.is_some_and(|queue| class.unproven_lane(queue, shape) >= Lane::ANONYMOUS);
        // A learned class's page (a `GET`: a form's `POST`, a login, is
        // part of a person's path) of a shape not judged yet is weighed as
        // costly: the visit is evidence of a person, and a crawler whose
        // expensive pages were served before their shapes were learned had
        // counted them as pages read (and its turn, and its no-script
        // pass's proof, with them). While the pool has judged no shape at
        // all (its first second or so), pages count as they are.
        if class.lane.is_none() && !visit.costly && visit.page_view {
            use crate::admission::shapes::Judgement;
            let judged = queue.map(|q| q.shapes().judgement(shape));
            visit.costly = judged == Some(Judgement::Unknown);
        }
    }
    Some((visit, visits.clone()))
}

/// The policy phases in order, [`session`], [`bot`] and [`decide`]: the
/// request's decision (`serve` records it). Who the request proved to be
/// and its class are recorded before the decision is made (held across
/// its wait, they would be in every request's future).
pub(super) async fn policy(
    ex: &mut Exchange<'_>,
    view: &RequestView<'_>,
    route: &Route,
) -> Decision {
    let session = session(ex, route, view.headers).await;
    let bot = bot(ex, view).await;
    let verifier = ex.gw().bots.as_deref();
    let crawler = bot.zip(verifier).and_then(|(bot, v)| v.label(bot));
    ex.log_mut()
        .identified(session.kind(), crawler, route.class.shared());
    decide(ex, view, route, &session, bot).await
}

/// **Session phase**: after routing, for a routed request. Asks the
/// verifier (signed cookie, or the app's own answer) only when a rule or an
/// admission lane of the route could use the answer. May change: the
/// verifier's cache. Result: the session; a verified one is the only
/// exemption weir honours.
pub(super) async fn session(
    ex: &mut Exchange<'_>,
    route: &Route,
    headers: &HeaderMap,
) -> SessionState {
    let gw = ex.gw();
    match &gw.sessions {
        Some(v) if !route.rules.is_empty() || gw.pools[route.pool].admission.is_some() => {
            v.check(headers).await
        }
        _ => SessionState::Anonymous,
    }
}

/// **Bots phase**: after the session phase, for a routed request, when
/// `[bots]` lists crawlers and the request signs (Web Bot Auth) or claims a
/// crawler checked by reverse DNS. Checks the signature, then the claim
/// (waiting at most `bots.dns_wait` for a lookup). May change: the
/// reverse-DNS cache, `weir_bot_verifications_total`. Result: the crawler the request proved to be; `None` leaves it
/// anonymous, like any request (a name in the User-Agent buys nothing).
pub(super) async fn bot(ex: &mut Exchange<'_>, view: &RequestView<'_>) -> Option<BotId> {
    let verifier = ex.gw().bots.as_deref()?;
    if !verifier.wants(view.headers) {
        return None;
    }
    let target = view.target;
    let req = SignedRequest {
        method: target.method().as_str(),
        scheme: if ex.conn().edge.tls.is_some() {
            "https"
        } else {
            "http"
        },
        authority: target.authority().map_or("", |a| a.as_str()),
        path: target.path(),
        query: target.query(),
        headers: view.headers,
    };
    // Boxed: rare, and a lookup's state would enlarge every request's future.
    let check = Box::pin(verifier.check(&req, ex.client().client.ip())).await;
    for a in &check.attempts {
        let labels = BotLabels {
            method: a.method.as_str(),
            result: a.result,
        };
        ex.metrics().bot_verifications.get_or_create(&labels).inc();
    }
    check.bot
}

/// **Rules-and-challenge phase**: after the bots phase. In order: the
/// challenge (a valid pass is proof on any class; a browser navigation
/// without one, when the class challenges always, gets the page; of an
/// `under_pressure` class, it is marked to be challenged if admission
/// cannot serve it promptly; never a verified session or a verified
/// crawler), the client's requests in flight
/// (`limits.max_requests_in_flight_per_ip`), the class's rules (a rule a
/// pass exempts challenges such a navigation instead of refusing it; a
/// deferring rule sends the request to the lowest lane). May change:
/// limiter state, the log (challenge, rule fields, the slots the
/// client and the rules hold), metrics. Result: `Admit` with what the
/// request proved and how admission is to treat it, `Reject` (answered by
/// the rescue, later phases skipped), or `Challenge` (answered with the
/// page).
pub(super) async fn decide(
    ex: &mut Exchange<'_>,
    view: &RequestView<'_>,
    route: &Route,
    session: &SessionState,
    bot: Option<BotId>,
) -> Decision {
    let mut proof = Proof {
        verified: session.is_verified(),
        bot,
        ..Proof::default()
    };
    let mut instead = None;
    match challenge_of(ex, view, route, &proof) {
        Challenged::Pass(id) => proof.pass = Some(id),
        Challenged::Looped(id) => (proof.pass, proof.looped) = (Some(id), true),
        Challenged::NotNow => {}
        Challenged::Page(page) => return Decision::Challenge(page),
        Challenged::Instead(c) => instead = Some(c),
    }
    // A cheap page's page stands in for the queue's `503` only: a rule's
    // refusal stays the rule's (what it counts, and alerts on).
    let by_rules = instead.filter(|c| c.when != PageWhen::Refused);
    let facts = Facts {
        user: session.user(),
        proof,
        challengeable: by_rules.is_some(),
    };
    match decide_rules(ex, view, route, facts).await {
        Ruled::Admit(deferred) => {
            // A pass that would not lift a deferral is not worth asking for.
            let challenge = match &deferred {
                None => instead,
                Some(d) => by_rules.filter(|_| d.pass_exempts),
            };
            Decision::Admit(Admitted {
                proof,
                deferred,
                challenge,
            })
        }
        Ruled::Reject(reason) => Decision::Reject(reason),
        Ruled::Challenge => {
            let Some((ch, c)) = ex.gw().challenger.as_ref().zip(by_rules) else {
                unreachable!("only a challengeable request is challenged by a rule")
            };
            let page = ch.page(
                view.target,
                ex.asker(view.headers),
                c.difficulty,
                ex.challenge_at(),
            );
            Decision::Challenge(Box::new(page))
        }
    }
}

/// The challenge's say on a request (see [`Challenged`]): none for a
/// verified session or crawler, or without `[challenge]`; the pass it
/// carries on a class that does not challenge; else [`challenge`]'s.
fn challenge_of(
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

/// What the rules phase reads of the request beyond its target and client.
#[derive(Clone, Copy)]
struct Facts<'a> {
    user: Option<&'a str>,
    proof: Proof,
    /// An unproven navigation the challenge may ask for proof.
    challengeable: bool,
}

/// What the rules said.
enum Ruled {
    /// Admitted; deferred to the lowest lane by a rule over its limit.
    Admit(Option<Box<Deferral>>),
    Reject(RejectReason),
    /// Over a rule a pass exempts: the challenge page instead.
    Challenge,
}

/// The client's requests in flight, then the class's rules: the second half
/// of [`decide`].
async fn decide_rules(
    ex: &mut Exchange<'_>,
    view: &RequestView<'_>,
    route: &Route,
    facts: Facts<'_>,
) -> Ruled {
    if let Err(refusal) = ex.hold_client_slot() {
        return Ruled::Reject(refusal);
    }
    if route.rules.is_empty() {
        return Ruled::Admit(None);
    }
    rules(ex, &route.rules, view, facts).await
}

/// What the challenge says of a request of a challenging class.
enum Challenged {
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

/// The class's rules (`policy::rules::judge`, the phase `weir replay` runs
/// too), and what they decided recorded in the log: the slots concurrency
/// rules hold, shadow rejections, the rejection's level, key and
/// collateral signal.
async fn rules(
    ex: &mut Exchange<'_>,
    rules: &[Rule],
    view: &RequestView<'_>,
    facts: Facts<'_>,
) -> Ruled {
    use weir_limiter::Clock as _;
    let (rt, gw) = (ex.rt(), ex.gw());
    let request = RequestFacts {
        client: ex.client(),
        method: view.target.method(),
        headers: view.headers,
        user: facts.user,
        pass: facts.proof.pass,
        looped: facts.proof.looped,
        bot: facts.proof.bot.is_some(),
        now: weir_limiter::MonotonicClock.now(),
        browsing: browsing(ex.log()),
        challengeable: facts.challengeable,
    };
    let mut observer = Live { rt, gw };
    let judged = judge(
        rules,
        &request,
        gw.rules_shadow,
        rt.shared_limiter(),
        &mut observer,
    )
    .await;
    if !judged.shadow.is_empty() {
        ex.log_mut()
            .shadowed(judged.shadow.iter().map(|r| r.rule.to_string()).collect());
    }
    ex.held().rule_guards = judged.guards;
    if judged.challenge.is_some() {
        return Ruled::Challenge;
    }
    let Some(r) = judged.rejection else {
        return Ruled::Admit(judged.deferral.map(Box::new));
    };
    ex.log_mut().refused_by_rule(&r, judged.signal);
    Ruled::Reject(RejectReason::Rule(r))
}

/// Whether the request is a navigation in a visit weir counts as a
/// person's (`crate::visit::Visits::is_browsing`).
fn browsing(log: &RequestLog) -> bool {
    log.visit().is_some_and(|(visit, visits)| {
        visit.navigation && (visit.prior).is_some_and(|v| visits.is_browsing(&v, SystemTime::now()))
    })
}

/// A deferred request the lowest lane shed: refused with its rule's answer,
/// reported and logged as that rule's rejection (which it now is).
pub(super) fn deferral_refused(ex: &mut Exchange<'_>, deferral: Deferral) -> RejectReason {
    let rejection = &deferral.rejection;
    let client = ex.client().client;
    count_rejection(ex.rt(), rejection, client, deferral.signal, true);
    ex.log_mut().refused_by_rule(rejection, deferral.signal);
    RejectReason::Rule(deferral.rejection)
}

/// What the rules phase reports, in the live process: the activity table
/// behind the low-rate signal, `weir_rule_decisions_total`, the collateral
/// and distinct-client metrics.
struct Live<'a> {
    rt: &'a Runtime,
    gw: &'a Gateway,
}

impl RuleObserver for Live<'_> {
    fn low_rate(&mut self, client: ClientAddr, now: MonoTime) -> bool {
        self.rt.activity.observe(client, &self.gw.low_rate, now)
    }

    fn result(&mut self, rule: &Rule, result: RuleResult) {
        self.rt.metrics.rule_result(&rule.name, result.as_str());
    }

    fn rejected(
        &mut self,
        rejection: &RuleRejection,
        client: ClientAddr,
        signal: Option<Collateral>,
        enforced: bool,
    ) {
        count_rejection(self.rt, rejection, client, signal, enforced);
    }
}

/// Counts a rule's refusal, enforced or shadow: `weir_rejections_total`,
/// the collateral signal that decided, and the distinct clients refused.
fn count_rejection(
    rt: &Runtime,
    rejection: &RuleRejection,
    client: ClientAddr,
    signal: Option<Collateral>,
    enforced: bool,
) {
    let m = &rt.metrics;
    let enforced = if enforced { "yes" } else { "shadow" };
    m.rule_rejections
        .get_or_create(&RuleLevelLabels {
            rule: rejection.rule.clone(),
            level: rejection.level,
            enforced,
        })
        .inc();
    if let Some(signal) = signal {
        m.rule_collateral
            .get_or_create(&CollateralLabels {
                rule: rejection.rule.clone(),
                signal: signal.as_str(),
                enforced,
            })
            .inc();
    }
    let minute = rt.started.elapsed().as_secs() / 60;
    let distinct = rt.rejected_clients.record(
        &rejection.rule,
        client.ip(),
        signal.is_some_and(Collateral::is_person_evidence),
        minute,
    );
    m.rule_rejected_clients
        .get_or_create(&RuleLabels {
            rule: rejection.rule.clone(),
        })
        .set(distinct as i64);
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
