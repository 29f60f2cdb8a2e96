//! Sessions: whether a request comes from a **verified** logged-in user.
//!
//! A session is verified in exactly two ways:
//!
//! - [`SignedCookie`]: a cookie value weir checks itself (HMAC-SHA256 with a configured key
//!   list, expiry against an injected wall clock); see [`signed`].
//! - [`AuthSubrequest`]: weir asks the app (`GET /whoami` with only the login cookies
//!   forwarded), caches the answer per session and coalesces concurrent asks; see
//!   [`subrequest`].
//!
//! **A cookie's name or mere presence never verifies anything.** In incident 1 any cookie
//! whose name contained the site name exempted a request from the crawler limit; the login
//! page hands such a cookie to every visitor, so one crawler request in five carried one and
//! walked past the limit. Anything a client can obtain without logging in (by visiting a
//! page, or by making a value up) must not buy an exemption. So [`SessionVerifier`] only
//! reports [`SessionState::Verified`] after a MAC check or the app's own yes, and a cookie
//! that is present but fails is [`SessionState::Unverified`] (never better than anonymous;
//! kept apart only so that humans with broken sessions can be counted).
//!
//! ```
//! use std::sync::Arc;
//! use weir::identity::session::{
//!     ManualWallClock, SessionState, SessionVerifier, SignedCookie, SigningKeys, Via,
//! };
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let keys = SigningKeys::new(&[b"0123456789abcdef0123456789abcdef"]).unwrap();
//! let signed = SignedCookie::new("weir_session", keys);
//! let value = signed.issue("alice", 2_000_000_000).unwrap();
//! let clock = Arc::new(ManualWallClock::new(1_900_000_000));
//! let verifier = SessionVerifier::new(Some(signed), None, clock);
//!
//! let mut headers = http::HeaderMap::new();
//! headers.insert("cookie", format!("weir_session={value}").parse().unwrap());
//! let state = verifier.check(&headers).await;
//! assert_eq!(state.user(), Some("alice"));
//! assert_eq!(state.via(), Some(Via::SignedCookie));
//!
//! // A cookie with the right name and a made-up value is not a login.
//! headers.insert("cookie", "weir_session=admin".parse().unwrap());
//! assert!(matches!(verifier.check(&headers).await, SessionState::Unverified { .. }));
//! # }
//! ```
//!
//! This module does not decide anything about the request (exemptions, lanes and limits
//! are the policy stage's), does not log users in, and does not issue pass tokens.

mod cache;
pub mod signed;
pub mod subrequest;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use http::HeaderMap;

pub use signed::{IssueError, SignedCookie, SigningKeyError, SigningKeys};
pub use subrequest::{
    AuthOutcome, AuthSubrequest, AuthSubrequestConfig, AuthSubrequestConfigError,
    AuthSubrequestStats, UnknownCause,
};

use weir_http::cookie::value as cookie_value;

/// How a session was verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Via {
    SignedCookie,
    AuthSubrequest,
}

impl Via {
    pub fn as_str(&self) -> &'static str {
        match self {
            Via::SignedCookie => "signed_cookie",
            Via::AuthSubrequest => "auth_subrequest",
        }
    }
}

/// Why a session cookie that was present did not verify. A bounded set, for metric labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnverifiedReason {
    /// The signed cookie is not in the documented format.
    Malformed,
    /// The signed cookie has a version this build does not read.
    UnsupportedVersion,
    /// Forged, tampered, or signed by a key not (or no longer) configured.
    BadSignature,
    /// Genuine but past its expiry.
    Expired,
    /// The app answered 401/403: not logged in.
    Denied,
    /// The app gave no usable answer (timeout, unreachable, other status, no user id).
    AuthUnknown,
    /// Too many auth sub-requests in flight; this one was not sent.
    AuthBusy,
}

impl UnverifiedReason {
    pub const ALL: [UnverifiedReason; 7] = [
        UnverifiedReason::Malformed,
        UnverifiedReason::UnsupportedVersion,
        UnverifiedReason::BadSignature,
        UnverifiedReason::Expired,
        UnverifiedReason::Denied,
        UnverifiedReason::AuthUnknown,
        UnverifiedReason::AuthBusy,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            UnverifiedReason::Malformed => "malformed",
            UnverifiedReason::UnsupportedVersion => "unsupported_version",
            UnverifiedReason::BadSignature => "bad_signature",
            UnverifiedReason::Expired => "expired",
            UnverifiedReason::Denied => "denied",
            UnverifiedReason::AuthUnknown => "auth_unknown",
            UnverifiedReason::AuthBusy => "auth_busy",
        }
    }

    fn index(&self) -> usize {
        *self as usize
    }
}

/// The session of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionState {
    /// No session cookie weir checks (cookies of other names may be present: they count
    /// for nothing).
    Anonymous,
    /// A checked login.
    Verified { user: Arc<str>, via: Via },
    /// A session cookie was present but did not verify. Treat as [`SessionState::Anonymous`]
    /// for every exemption; it exists to count humans whose sessions fail.
    Unverified { reason: UnverifiedReason },
}

impl SessionState {
    pub fn is_verified(&self) -> bool {
        matches!(self, SessionState::Verified { .. })
    }

    pub fn user(&self) -> Option<&str> {
        match self {
            SessionState::Verified { user, .. } => Some(user),
            _ => None,
        }
    }

    pub fn via(&self) -> Option<Via> {
        match self {
            SessionState::Verified { via, .. } => Some(*via),
            _ => None,
        }
    }

    /// What it proved, without its user: for logs and metric labels.
    pub fn kind(&self) -> crate::evidence::SessionKind {
        use crate::evidence::SessionKind;
        match self {
            SessionState::Anonymous => SessionKind::Anonymous,
            SessionState::Verified { .. } => SessionKind::Verified,
            SessionState::Unverified { .. } => SessionKind::Unverified,
        }
    }

    /// `anonymous`, `verified` or `unverified`, for logs and metric labels.
    pub fn as_str(&self) -> &'static str {
        self.kind().as_str()
    }
}

/// Wall-clock seconds since the Unix epoch, injected so that expiry tests never sleep.
pub trait WallClock: Send + Sync {
    fn unix_now(&self) -> u64;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemWallClock;

impl WallClock for SystemWallClock {
    fn unix_now(&self) -> u64 {
        // A clock set before 1970 reads as 1970: every cookie then looks unexpired, which
        // is no worse than a clock that is simply wrong.
        (SystemTime::now().duration_since(UNIX_EPOCH)).map_or(0, |d| d.as_secs())
    }
}

/// A wall clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualWallClock(AtomicU64);

impl ManualWallClock {
    pub fn new(unix_now: u64) -> ManualWallClock {
        ManualWallClock(AtomicU64::new(unix_now))
    }

    pub fn set(&self, unix_now: u64) {
        self.0.store(unix_now, Ordering::Relaxed);
    }
}

impl WallClock for ManualWallClock {
    fn unix_now(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Counts of [`SessionVerifier::check`] results since start.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SessionStats {
    pub anonymous: u64,
    pub verified_signed_cookie: u64,
    pub verified_auth_subrequest: u64,
    /// Per [`UnverifiedReason`], in [`UnverifiedReason::ALL`] order.
    pub unverified: Vec<(UnverifiedReason, u64)>,
    /// The sub-request checker's own counters, when configured.
    pub subrequest: Option<AuthSubrequestStats>,
}

#[derive(Debug, Default)]
struct Counters {
    anonymous: AtomicU64,
    verified_signed_cookie: AtomicU64,
    verified_auth_subrequest: AtomicU64,
    unverified: [AtomicU64; UnverifiedReason::ALL.len()],
}

/// Both verification methods, in order: the signed cookie (local, cheap) first, then the
/// auth sub-request. Either alone may be configured; with neither, everyone is anonymous.
pub struct SessionVerifier {
    signed: Option<SignedCookie>,
    subrequest: Option<Arc<AuthSubrequest>>,
    wall: Arc<dyn WallClock>,
    counters: Counters,
}

impl std::fmt::Debug for SessionVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionVerifier")
            .field("signed", &self.signed)
            .field("subrequest", &self.subrequest)
            .finish()
    }
}

impl SessionVerifier {
    pub fn new(
        signed: Option<SignedCookie>,
        subrequest: Option<AuthSubrequest>,
        wall: Arc<dyn WallClock>,
    ) -> SessionVerifier {
        SessionVerifier {
            signed,
            subrequest: subrequest.map(Arc::new),
            wall,
            counters: Counters::default(),
        }
    }

    /// The session state of a request with these headers. Awaits only when an auth
    /// sub-request is configured, the request carries its cookies, and the answer is
    /// neither cached nor being fetched (then at most the sub-request timeout).
    pub async fn check(&self, headers: &HeaderMap) -> SessionState {
        let state = self.decide(headers).await;
        let c = &self.counters;
        let counter = match &state {
            SessionState::Anonymous => &c.anonymous,
            SessionState::Verified {
                via: Via::SignedCookie,
                ..
            } => &c.verified_signed_cookie,
            SessionState::Verified {
                via: Via::AuthSubrequest,
                ..
            } => &c.verified_auth_subrequest,
            SessionState::Unverified { reason } => &c.unverified[reason.index()],
        };
        counter.fetch_add(1, Ordering::Relaxed);
        state
    }

    async fn decide(&self, headers: &HeaderMap) -> SessionState {
        let mut failure = None;
        if let Some(signed) = &self.signed
            && let Some(value) = cookie_value(headers, signed.cookie_name())
        {
            match signed.verify(value, self.wall.unix_now()) {
                Ok(user) => {
                    return SessionState::Verified {
                        user,
                        via: Via::SignedCookie,
                    };
                }
                Err(reason) => failure = Some(reason),
            }
        }
        if let Some(sub) = &self.subrequest {
            // Boxed: a network call, rare per request, whose state would
            // otherwise enlarge every request's future.
            let reason = match Box::pin(sub.check(headers)).await {
                None => None,
                Some(AuthOutcome::Verified(user)) => {
                    return SessionState::Verified {
                        user,
                        via: Via::AuthSubrequest,
                    };
                }
                Some(AuthOutcome::Denied) => Some(UnverifiedReason::Denied),
                Some(AuthOutcome::Unknown(UnknownCause::Busy)) => Some(UnverifiedReason::AuthBusy),
                Some(AuthOutcome::Unknown(_)) => Some(UnverifiedReason::AuthUnknown),
            };
            // A broken signed cookie is the more specific story; keep it.
            failure = failure.or(reason);
        }
        match failure {
            Some(reason) => SessionState::Unverified { reason },
            None => SessionState::Anonymous,
        }
    }

    /// The auth sub-request checker, when configured.
    pub fn subrequest(&self) -> Option<&AuthSubrequest> {
        self.subrequest.as_deref()
    }

    /// Counts since start.
    pub fn stats(&self) -> SessionStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SessionStats {
            anonymous: get(&c.anonymous),
            verified_signed_cookie: get(&c.verified_signed_cookie),
            verified_auth_subrequest: get(&c.verified_auth_subrequest),
            unverified: (UnverifiedReason::ALL.iter())
                .map(|r| (*r, get(&c.unverified[r.index()])))
                .collect(),
            subrequest: self.subrequest.as_ref().map(|s| s.stats()),
        }
    }
}
