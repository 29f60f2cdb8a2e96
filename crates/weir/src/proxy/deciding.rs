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

use http::{HeaderMap, Request};
use weir_http::body::RequestBody;

use super::challenging::{Challenged, challenge_of};
use super::exchange::Exchange;
use super::log::RequestLog;
use crate::admission::Lane;
use crate::evidence::Collateral;
use crate::gateway::Gateway;
use crate::identity::ClientAddr;
use crate::identity::bots::BotId;
use crate::identity::bots::signature::SignedRequest;
use crate::identity::session::SessionState;
use crate::observe::metrics::{BotLabels, CollateralLabels, RuleLabels, RuleLevelLabels};
use crate::policy::route::{RequestView, Route};
use crate::policy::rules::{
    Deferral, RequestFacts, Rule, RuleObserver, RuleRejection, RuleResult, judge,
};
use crate::policy::{Admitted, Decision, PageWhen, Proof, RejectReason};
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
