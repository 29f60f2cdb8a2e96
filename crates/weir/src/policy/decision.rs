//! The value the policy stage hands forward: admit, reject with a reason,
//! or challenge.
//!
//! [`crate::respond`] is the one place that turns a rejection into a
//! response (status, `Retry-After`, reason header): each [`RejectReason`]
//! says there, beside its doc here, what it answers. Stages never build
//! error responses themselves.

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue};
use http::{Response, StatusCode};

use super::rules::{Deferral, RuleRejection};
use crate::respond::{Reason, Side};
use weir_http::target::TargetError;

/// What a request proved about its client: what buys it a better lane in
/// admission (`admission::Lane::for_request`), and what keeps it out of
/// request coalescing (a personal answer is never shared).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Proof {
    /// A session weir verified (signed cookie or the app's own answer).
    pub verified: bool,
    /// The id of a valid challenge pass.
    pub pass: Option<u64>,
    /// The pass is the network's, given to a browser in a loop (it solved
    /// three challenges within a minute, and no pass came back): a pass for
    /// lanes and exemptions, but no evidence of a person (proof of work
    /// proves a browser, and this one kept nothing).
    pub looped: bool,
    /// A crawler that proved who it is (Web Bot Auth, reverse DNS): not
    /// challenged, exempt from rules that say `verified_bot`, queued in
    /// the `bots` lane.
    pub bot: Option<crate::identity::bots::BotId>,
}

/// What happens to a request after the policy stage.
#[derive(Debug)]
pub enum Decision {
    /// Forward to the upstream, through admission, with what the request
    /// proved and how admission is to treat it.
    Admit(Admitted),
    /// Answer now with the reason's response; later stages are skipped.
    Reject(RejectReason),
    /// Answer now with the challenge's page (429 and a proof of work; see
    /// `challenge`); later stages are skipped. Boxed: rare, and large.
    Challenge(Box<Response<Bytes>>),
}

/// A request the policy admitted: proof buys priority, not entry.
#[derive(Debug, Default)]
pub struct Admitted {
    /// What it proved: its lane and its share of the lane.
    pub proof: Proof,
    /// A deferring rule was over its limit: the request waits in the lowest
    /// lane, and if shed there is refused with the rule's answer (boxed:
    /// rare, and large).
    pub deferred: Option<Box<Deferral>>,
    /// An unproven browser navigation of a challenging class: if admission
    /// cannot serve it promptly, it gets the challenge page instead of a
    /// refusal (see [`ChallengeInstead`]).
    pub challenge: Option<ChallengeInstead>,
}

impl Admitted {
    /// Admitted with `proof`, nothing else to say.
    pub fn with(proof: Proof) -> Admitted {
        Admitted {
            proof,
            ..Admitted::default()
        }
    }
}

/// When admission answers a navigation with the challenge page instead of
/// serving or refusing it: the page is how a person earns a better lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChallengeInstead {
    /// The page's difficulty (pressure adds bits).
    pub difficulty: u8,
    /// Where, besides instead of a refusal, the page comes.
    pub when: PageWhen,
    /// Pressure is engaged (what `weir_challenge_spared_total` counts under).
    pub engaged: bool,
}

/// Where an unproven navigation gets the challenge page rather than its
/// wait: always where admission would shed it (or a rule a pass exempts
/// would refuse it), and, by the class and the pressure, on a long wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageWhen {
    /// Only instead of a refusal: a cheap page of a `learned` class. Its
    /// shape is no flood's signature, so it waits like anyone's; but a
    /// person who waited for it gets the page, not a `503`.
    Refused,
    /// Also once it has waited twice `pressure.wait`: an `under_pressure`
    /// class while pressure is off (a burst the app works off within a
    /// second shows nobody the page).
    TwiceTheWait,
    /// Also at once when it is expected to wait longer than
    /// `pressure.wait`, and once it has waited that long: pressure is
    /// engaged, or the class is `learned` and the shape expensive (a
    /// flood's signature already).
    LongWait,
}

/// Why a request was not forwarded, and how the client is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RejectReason {
    /// The client address has too many requests in flight.
    ClientInFlight { limit: usize },
    /// A configured rule (rate or concurrency limit) refused the request.
    Rule(RuleRejection),
    /// No route matches the request.
    NoRoute,
    /// The request is malformed (a cut challenge answer).
    BadRequest(&'static str),
    /// The request's target cannot be read one way (two hosts, a path
    /// spelled to slip past rules, a lowercase method): 400 or 501.
    Target(TargetError),
    /// The declared body is longer than the class allows (413), refused
    /// before anything is read or admitted.
    BodyTooLarge { max_bytes: u64 },
    /// A body weir read itself (the challenge's answer) stalled or came
    /// slower than `limits.min_body_rate` (408).
    BodyTimeout,
    /// The upstream pool cannot take it now (see [`ShedCause`]): `503`
    /// with `Retry-After`.
    Shed {
        cause: ShedCause,
        retry_after: Duration,
    },
}

/// Why weir shed a request it had admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShedCause {
    /// The admission queue (or the request's lane in it) was full.
    QueueFull,
    /// The request waited in the queue past its deadline.
    Deadline,
    /// Evicted from the queue to make room for a request of a higher lane.
    LowerLane,
    /// No server of the pool is alive.
    NoHealthyServer,
}

impl ShedCause {
    /// The label in logs, metrics and `x-weir-reason`.
    pub fn label(self) -> &'static str {
        match self {
            ShedCause::QueueFull => "admission_queue_full",
            ShedCause::Deadline => "admission_deadline_exceeded",
            ShedCause::LowerLane => "admission_lower_lane_shed",
            ShedCause::NoHealthyServer => "no_healthy_upstream",
        }
    }
}

impl From<crate::admission::ShedReason> for ShedCause {
    fn from(reason: crate::admission::ShedReason) -> ShedCause {
        use crate::admission::ShedReason;
        match reason {
            ShedReason::QueueFull => ShedCause::QueueFull,
            ShedReason::DeadlineExceeded => ShedCause::Deadline,
            ShedReason::LowerLaneShed => ShedCause::LowerLane,
        }
    }
}

impl Reason for RejectReason {
    fn status(&self) -> StatusCode {
        match self {
            RejectReason::ClientInFlight { .. } | RejectReason::Rule(_) => {
                StatusCode::TOO_MANY_REQUESTS
            }
            RejectReason::NoRoute => StatusCode::NOT_FOUND,
            RejectReason::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            RejectReason::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            RejectReason::BadRequest(_) => StatusCode::BAD_REQUEST,
            RejectReason::Target(e) => e.status(),
            RejectReason::Shed { .. } => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            RejectReason::ClientInFlight { .. } => Some(Duration::from_secs(1)),
            RejectReason::Rule(r) => Some(r.retry_after),
            RejectReason::Shed { retry_after, .. } => Some(*retry_after),
            RejectReason::NoRoute
            | RejectReason::BadRequest(_)
            | RejectReason::Target(_)
            | RejectReason::BodyTooLarge { .. }
            | RejectReason::BodyTimeout => None,
        }
    }

    /// The rule label in logs and metrics: bounded, never an address.
    fn label(&self) -> &str {
        match self {
            RejectReason::Rule(r) => &r.rule,
            RejectReason::ClientInFlight { .. } => "client_in_flight",
            RejectReason::NoRoute => "no_route",
            RejectReason::BodyTooLarge { .. } => "client_body_too_large",
            RejectReason::BodyTimeout => "client_body_timeout",
            RejectReason::BadRequest(_) => "bad_request",
            RejectReason::Target(e) => e.reason(),
            RejectReason::Shed { cause, .. } => cause.label(),
        }
    }

    fn message(&self) -> String {
        match self {
            RejectReason::ClientInFlight { limit } => {
                format!("too many requests in flight from your address (limit {limit})")
            }
            RejectReason::NoRoute => "no route for this request".into(),
            RejectReason::BodyTooLarge { max_bytes } => {
                format!("the request body is longer than {max_bytes} bytes")
            }
            RejectReason::BodyTimeout => "the request body came too slowly".into(),
            RejectReason::BadRequest(why) => (*why).into(),
            RejectReason::Target(e) => e.to_string(),
            RejectReason::Rule(_) => "too many requests; please retry later".into(),
            RejectReason::Shed {
                cause: ShedCause::NoHealthyServer,
                ..
            } => "the application is not answering; please retry".into(),
            RejectReason::Shed { .. } => "the application is busy; please retry".into(),
        }
    }

    fn side(&self) -> Side {
        match self {
            RejectReason::NoRoute
            | RejectReason::BadRequest(_)
            | RejectReason::Target(_)
            | RejectReason::BodyTooLarge { .. }
            | RejectReason::BodyTimeout => Side::Client,
            RejectReason::Shed {
                cause: ShedCause::NoHealthyServer,
                ..
            } => Side::Upstream,
            RejectReason::ClientInFlight { .. }
            | RejectReason::Rule(_)
            | RejectReason::Shed { .. } => Side::Weir,
        }
    }

    /// draft-ietf-httpapi-ratelimit-headers: the policy that fired and what
    /// is left of it (nothing, for `t` seconds).
    fn extra_fields(&self, h: &mut HeaderMap) {
        let RejectReason::Rule(r) = self else {
            return;
        };
        let Some((quota, window)) = r.policy else {
            return;
        };
        let name = r.rule.replace('"', "");
        if let Ok(v) = HeaderValue::from_str(&format!("\"{name}\";q={quota};w={window}")) {
            h.insert("ratelimit-policy", v);
        }
        let t = r.retry_after.as_secs_f64().ceil() as u64;
        if let Ok(v) = HeaderValue::from_str(&format!("\"{name}\";r=0;t={t}")) {
            h.insert("ratelimit", v);
        }
    }
}
