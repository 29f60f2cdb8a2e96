//! The value the policy stage hands forward: admit, or reject with a reason.
//!
//! [`crate::proxy::respond`] is the one place that turns a rejection into a
//! response (status, `Retry-After`, reason header); stages never build error
//! responses themselves.

use std::time::Duration;

use http::StatusCode;

use super::rules::RuleRejection;
use weir_http::target::TargetError;

/// What happens to a request after the policy stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Forward to the upstream.
    Admit,
    /// Answer now; later stages are skipped.
    Reject(RejectReason),
}

impl Decision {
    /// A short label for logs and metrics (`admit`, `reject`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Decision::Admit => "admit",
            Decision::Reject(_) => "reject",
        }
    }
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
    /// weir is draining and takes no new requests on this connection.
    Draining,
    /// The upstream pool is full: the admission queue shed the request
    /// (`admission_queue_full`, `admission_deadline_exceeded`,
    /// `admission_lower_lane_shed`), or no server is alive for a request
    /// that is not an idempotent read (`no_healthy_upstream`).
    Shed {
        reason: &'static str,
        retry_after: Duration,
    },
}

impl RejectReason {
    pub fn status(&self) -> StatusCode {
        match self {
            RejectReason::ClientInFlight { .. } | RejectReason::Rule(_) => {
                StatusCode::TOO_MANY_REQUESTS
            }
            RejectReason::NoRoute => StatusCode::NOT_FOUND,
            RejectReason::BadRequest(_) => StatusCode::BAD_REQUEST,
            RejectReason::Target(e) => e.status(),
            RejectReason::Draining | RejectReason::Shed { .. } => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            RejectReason::ClientInFlight { .. } | RejectReason::Draining => {
                Some(Duration::from_secs(1))
            }
            RejectReason::Rule(r) => Some(r.retry_after),
            RejectReason::Shed { retry_after, .. } => Some(*retry_after),
            RejectReason::NoRoute | RejectReason::BadRequest(_) | RejectReason::Target(_) => None,
        }
    }

    /// The rule label in logs and metrics: bounded, never an address.
    pub fn rule(&self) -> &str {
        match self {
            RejectReason::Rule(r) => &r.rule,
            RejectReason::ClientInFlight { .. } => "client_in_flight",
            RejectReason::NoRoute => "no_route",
            RejectReason::BadRequest(_) => "bad_request",
            RejectReason::Target(e) => e.reason(),
            RejectReason::Draining => "draining",
            RejectReason::Shed { reason, .. } => reason,
        }
    }
}
