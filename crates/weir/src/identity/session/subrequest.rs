//! Auth sub-requests: ask the app whether a request's session cookies are a login.
//!
//! For a request carrying at least one of the configured cookies, weir sends
//! `GET <path>` (e.g. `/whoami`) to the configured upstream with **only those cookies**
//! forwarded (never the rest of the client's cookies: the app's answer must depend on the
//! login cookies alone, and other cookies are none of the auth endpoint's business).
//!
//! | app answer                         | outcome                  | cached for     |
//! |------------------------------------|--------------------------|----------------|
//! | 2xx with a user id (header or body)| [`AuthOutcome::Verified`]| `verified_ttl` |
//! | 401, 403                           | [`AuthOutcome::Denied`]  | `denied_ttl`   |
//! | other status, timeout, no answer   | [`AuthOutcome::Unknown`] | `unknown_ttl`  |
//! | too many sub-requests in flight    | `Unknown(Busy)`          | not cached     |
//!
//! Outcomes are cached per session: the key is a SHA-256 digest of the forwarded cookie
//! names and values, so the cache holds no cookie values. The cache is bounded (see
//! `cache.rs` for the memory bound). Concurrent checks of the same session share one
//! in-flight sub-request (single flight): a crawler farm replaying one cookie costs one
//! sub-request per TTL, not one per request. The number of sub-requests in flight across
//! all sessions is capped (`max_in_flight`), because each one takes an app worker, the
//! resource incident 1 ran out of; past the cap the outcome is `Unknown(Busy)` at once.
//!
//! This module does not decide anything about the request, does not read response bodies
//! beyond a small limit, and does not retry: an unknown outcome is not a login.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::header::{COOKIE, HOST};
use http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::{OnceCell, Semaphore};

use super::cache::{CacheKey, OutcomeCache};
use super::signed::MAX_USER_LEN;
use weir_http::cookie::value as cookie_value;
use weir_limiter::Clock;

/// Largest response body read for the user id; the rest is ignored.
const MAX_BODY_BYTES: usize = 1024;

/// Largest JSON answer read (MediaWiki's `meta=userinfo` is about 100
/// bytes; more properties asked make it longer). A longer one is no answer.
const MAX_JSON_BYTES: usize = 16 * 1024;

/// Settings of the auth sub-request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthSubrequestConfig {
    /// The app server to ask.
    pub upstream: SocketAddr,
    /// `Host` header of the sub-request. Default: `upstream` as text.
    pub host: String,
    /// Path (and query) asked. Default `/whoami`.
    pub path: String,
    /// Cookies forwarded; a request with none of them is anonymous and causes no
    /// sub-request. Example: `["wikiUserID", "wikiToken"]`, **not** the session cookie
    /// the login page gives every visitor.
    pub cookies: Vec<String>,
    /// Asked only when every one of these is present; empty: any of `cookies`.
    pub required_cookies: Vec<String>,
    /// Response header holding the user id; `None`: `user_json`, or the
    /// first line of the body.
    pub user_header: Option<HeaderName>,
    /// A JSON pointer to the user id in a JSON body (see [`UserField`]).
    pub user_json: Option<String>,
    /// Whole sub-request deadline, connect included. Default 500 ms.
    pub timeout: Duration,
    /// How long a verified answer is reused. Default 60 s.
    pub verified_ttl: Duration,
    /// How long a 401/403 answer is reused. Default 10 s.
    pub denied_ttl: Duration,
    /// How long an unknown outcome (timeout, 5xx) is reused, so a struggling app is not
    /// asked again by every request. Default 1 s.
    pub unknown_ttl: Duration,
    /// Most sessions cached at once. Default 100,000 (about 12 MB, see `cache.rs`).
    pub max_entries: usize,
    /// Most sub-requests in flight at once. Default 4.
    pub max_in_flight: usize,
}

impl AuthSubrequestConfig {
    /// Defaults for everything but the upstream and the forwarded cookies.
    pub fn new(upstream: SocketAddr, cookies: &[&str]) -> AuthSubrequestConfig {
        AuthSubrequestConfig {
            upstream,
            host: upstream.to_string(),
            path: "/whoami".to_string(),
            cookies: cookies.iter().map(|c| c.to_string()).collect(),
            required_cookies: Vec::new(),
            user_header: None,
            user_json: None,
            timeout: Duration::from_millis(500),
            verified_ttl: Duration::from_secs(60),
            denied_ttl: Duration::from_secs(10),
            unknown_ttl: Duration::from_secs(1),
            max_entries: 100_000,
            max_in_flight: 4,
        }
    }
}

/// A configuration that cannot work; messages name the bad value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthSubrequestConfigError {
    #[error("auth sub-request cookies are empty: name the login cookies to forward")]
    NoCookies,
    #[error("auth sub-request cookie name `{0}` is not a valid cookie name")]
    BadCookieName(String),
    #[error("auth sub-request path `{0}` must start with `/` and be a valid request target")]
    BadPath(String),
    #[error("auth sub-request host `{0}` is not a valid Host header")]
    BadHost(String),
    #[error("auth sub-request timeout is zero")]
    ZeroTimeout,
    #[error("auth sub-request max_in_flight is zero: no session could ever be verified")]
    ZeroInFlight,
    #[error("auth sub-request required cookie `{0}` is not one of the forwarded `cookies`")]
    RequiredNotForwarded(String),
    #[error(
        "auth sub-request user_json_pointer `{0}` is not a JSON pointer (it starts with `/`, e.g. `/query/userinfo/id`)"
    )]
    BadJsonPointer(String),
    #[error("auth sub-request sets both user_header and user_json_pointer: choose one")]
    TwoUserFields,
}

/// Why the app's answer says nothing either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownCause {
    /// No answer within the timeout.
    Timeout,
    /// Connection refused or broken.
    Unreachable,
    /// A status other than 2xx, 401 or 403.
    Status(u16),
    /// 2xx without a usable user id.
    NoUser,
    /// Too many sub-requests already in flight.
    Busy,
}

impl UnknownCause {
    pub fn as_str(&self) -> &'static str {
        match self {
            UnknownCause::Timeout => "timeout",
            UnknownCause::Unreachable => "unreachable",
            UnknownCause::Status(_) => "status",
            UnknownCause::NoUser => "no_user",
            UnknownCause::Busy => "busy",
        }
    }
}

/// What the app said about a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthOutcome {
    Verified(Arc<str>),
    Denied,
    Unknown(UnknownCause),
}

/// Counters since start, for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuthSubrequestStats {
    /// Sub-requests sent to the app.
    pub sent: u64,
    /// Checks answered from the cache.
    pub cache_hits: u64,
    /// Checks that waited for a sub-request another check had started.
    pub coalesced: u64,
    /// Sub-requests answered verified.
    pub verified: u64,
    /// Sub-requests answered 401/403.
    pub denied: u64,
    /// Sub-requests with no usable answer (timeout, unreachable, other status, no user).
    pub unknown: u64,
    /// Checks refused a sub-request because `max_in_flight` were running.
    pub busy: u64,
    /// Sessions in the cache now.
    pub cached: u64,
}

#[derive(Debug, Default)]
struct Counters {
    sent: AtomicU64,
    cache_hits: AtomicU64,
    coalesced: AtomicU64,
    verified: AtomicU64,
    denied: AtomicU64,
    unknown: AtomicU64,
    busy: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

type InFlight = Arc<OnceCell<AuthOutcome>>;

#[derive(Debug)]
struct State {
    cache: OutcomeCache<AuthOutcome>,
    in_flight: std::collections::HashMap<CacheKey, InFlight>,
}

/// The auth sub-request checker with its cache; share it behind an `Arc`.
pub struct AuthSubrequest {
    cfg: AuthSubrequestConfig,
    uri: Uri,
    host: HeaderValue,
    client: Client<HttpConnector, Empty<Bytes>>,
    clock: Arc<dyn Clock>,
    permits: Semaphore,
    state: Mutex<State>,
    counters: Counters,
}

impl std::fmt::Debug for AuthSubrequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthSubrequest")
            .field("uri", &self.uri)
            .field("cookies", &self.cfg.cookies)
            .finish()
    }
}

impl AuthSubrequestConfig {
    /// Checks the configuration, first problem first; returns the
    /// sub-request's URI and `Host` value.
    fn validate(&self) -> Result<(Uri, HeaderValue), AuthSubrequestConfigError> {
        if self.cookies.is_empty() {
            return Err(AuthSubrequestConfigError::NoCookies);
        }
        for name in &self.cookies {
            let valid = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b));
            if !valid {
                return Err(AuthSubrequestConfigError::BadCookieName(name.clone()));
            }
        }
        if !self.path.starts_with('/') {
            return Err(AuthSubrequestConfigError::BadPath(self.path.clone()));
        }
        let uri: Uri = format!("http://{}{}", self.upstream, self.path)
            .parse()
            .map_err(|_| AuthSubrequestConfigError::BadPath(self.path.clone()))?;
        let host = HeaderValue::from_str(&self.host)
            .map_err(|_| AuthSubrequestConfigError::BadHost(self.host.clone()))?;
        if self.timeout.is_zero() {
            return Err(AuthSubrequestConfigError::ZeroTimeout);
        }
        if self.max_in_flight == 0 {
            return Err(AuthSubrequestConfigError::ZeroInFlight);
        }
        if let Some(r) = self
            .required_cookies
            .iter()
            .find(|r| !self.cookies.contains(r))
        {
            return Err(AuthSubrequestConfigError::RequiredNotForwarded(r.clone()));
        }
        if let Some(p) = &self.user_json
            && !p.starts_with('/')
        {
            return Err(AuthSubrequestConfigError::BadJsonPointer(p.clone()));
        }
        if self.user_json.is_some() && self.user_header.is_some() {
            return Err(AuthSubrequestConfigError::TwoUserFields);
        }
        Ok((uri, host))
    }
}

/// The HTTP client of the sub-requests: connecting within the timeout,
/// keeping up to `max_in_flight` idle connections to the app.
fn http_client(cfg: &AuthSubrequestConfig) -> Client<HttpConnector, Empty<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(cfg.timeout));
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(cfg.max_in_flight)
        .build(connector)
}

impl AuthSubrequest {
    /// Checks the configuration and builds the client. Needs no runtime until first use.
    pub fn new(
        cfg: AuthSubrequestConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<AuthSubrequest, AuthSubrequestConfigError> {
        let (uri, host) = cfg.validate()?;
        let client = http_client(&cfg);
        Ok(AuthSubrequest {
            permits: Semaphore::new(cfg.max_in_flight),
            state: Mutex::new(State {
                cache: OutcomeCache::new(cfg.max_entries),
                in_flight: Default::default(),
            }),
            cfg,
            uri,
            host,
            client,
            clock,
            counters: Counters::default(),
        })
    }

    pub fn config(&self) -> &AuthSubrequestConfig {
        &self.cfg
    }

    /// The configured cookies' values in `headers`, in configuration order
    /// (`None` for an absent one): read once per request, then used to
    /// decide, key the cache and build the sub-request's `Cookie`.
    fn login_cookies<'h>(&self, headers: &'h HeaderMap) -> Vec<Option<&'h str>> {
        self.cfg
            .cookies
            .iter()
            .map(|name| cookie_value(headers, name))
            .collect()
    }

    /// Whether these cookies call for a sub-request: any of them, or every
    /// one of `required_cookies` (which are among `cookies`: `new` checks).
    fn applies(&self, values: &[Option<&str>]) -> bool {
        if self.cfg.required_cookies.is_empty() {
            return values.iter().any(Option::is_some);
        }
        self.cfg
            .cookies
            .iter()
            .zip(values)
            .all(|(name, value)| value.is_some() || !self.cfg.required_cookies.contains(name))
    }

    /// The app's verdict on the request's login cookies, from the cache or one
    /// sub-request; `None` when the request carries none of the configured cookies.
    pub async fn check(&self, headers: &HeaderMap) -> Option<AuthOutcome> {
        let values = self.login_cookies(headers);
        if !self.applies(&values) {
            return None;
        }
        let forwarded = self.forwarded_cookies(&values)?;
        let key = digest(&self.cfg.cookies, &values);
        let cell = {
            let mut state = self.lock();
            if let Some(hit) = state.cache.get(&key, self.clock.now()) {
                bump(&self.counters.cache_hits);
                return Some(hit);
            }
            match state.in_flight.get(&key) {
                Some(cell) => {
                    bump(&self.counters.coalesced);
                    cell.clone()
                }
                None => {
                    let cell = InFlight::default();
                    state.in_flight.insert(key, cell.clone());
                    cell
                }
            }
        };
        // If the task running the sub-request is cancelled, another waiter runs it.
        let outcome = cell.get_or_init(|| self.ask(forwarded)).await.clone();
        self.settle(key, &cell, &outcome);
        Some(outcome)
    }

    /// Counters since start.
    pub fn stats(&self) -> AuthSubrequestStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        AuthSubrequestStats {
            sent: get(&c.sent),
            cache_hits: get(&c.cache_hits),
            coalesced: get(&c.coalesced),
            verified: get(&c.verified),
            denied: get(&c.denied),
            unknown: get(&c.unknown),
            busy: get(&c.busy),
            cached: self.lock().cache.len() as u64,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent between statements; a panic elsewhere must not
        // disable session checks.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The first waiter to finish moves the outcome from in-flight to the cache.
    fn settle(&self, key: CacheKey, cell: &InFlight, outcome: &AuthOutcome) {
        let mut state = self.lock();
        let ours = state
            .in_flight
            .get(&key)
            .is_some_and(|c| Arc::ptr_eq(c, cell));
        if !ours {
            return;
        }
        state.in_flight.remove(&key);
        let ttl = match outcome {
            AuthOutcome::Verified(_) => self.cfg.verified_ttl,
            AuthOutcome::Denied => self.cfg.denied_ttl,
            AuthOutcome::Unknown(UnknownCause::Busy) => return,
            AuthOutcome::Unknown(_) => self.cfg.unknown_ttl,
        };
        if !ttl.is_zero() {
            let expires = self.clock.now() + ttl;
            state.cache.insert(key, outcome.clone(), expires);
        }
    }

    /// `name=value; ...` of the configured cookies present, in configuration order.
    fn forwarded_cookies(&self, values: &[Option<&str>]) -> Option<HeaderValue> {
        let mut line = String::new();
        for (name, value) in self.cfg.cookies.iter().zip(values) {
            if let Some(value) = value {
                if !line.is_empty() {
                    line.push_str("; ");
                }
                line.push_str(name);
                line.push('=');
                line.push_str(value);
            }
        }
        if line.is_empty() {
            return None;
        }
        // The value came out of a header that was valid text, so this only fails on
        // bytes a browser never sends; such a request is simply not verified.
        Some(HeaderValue::from_str(&line).unwrap_or(HeaderValue::from_static("")))
    }

    async fn ask(&self, cookies: HeaderValue) -> AuthOutcome {
        let Ok(_permit) = self.permits.try_acquire() else {
            bump(&self.counters.busy);
            return AuthOutcome::Unknown(UnknownCause::Busy);
        };
        bump(&self.counters.sent);
        let outcome = match tokio::time::timeout(self.cfg.timeout, self.exchange(cookies)).await {
            Ok(outcome) => outcome,
            Err(_elapsed) => AuthOutcome::Unknown(UnknownCause::Timeout),
        };
        match outcome {
            AuthOutcome::Verified(_) => bump(&self.counters.verified),
            AuthOutcome::Denied => bump(&self.counters.denied),
            AuthOutcome::Unknown(_) => bump(&self.counters.unknown),
        }
        outcome
    }

    async fn exchange(&self, cookies: HeaderValue) -> AuthOutcome {
        let mut req = Request::new(Empty::<Bytes>::new());
        *req.uri_mut() = self.uri.clone();
        req.headers_mut().insert(HOST, self.host.clone());
        req.headers_mut().insert(COOKIE, cookies);
        let response = match self.client.request(req).await {
            Ok(response) => response,
            Err(_) => return AuthOutcome::Unknown(UnknownCause::Unreachable),
        };
        let status = response.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return AuthOutcome::Denied;
        }
        if !status.is_success() {
            return AuthOutcome::Unknown(UnknownCause::Status(status.as_u16()));
        }
        if let Some(name) = &self.cfg.user_header {
            let user = (response.headers().get(name))
                .and_then(|v| v.to_str().ok())
                .and_then(user_id);
            return verified_or_no_user(user);
        }
        let limit = match self.cfg.user_json {
            Some(_) => MAX_JSON_BYTES,
            None => MAX_BODY_BYTES,
        };
        let Ok(body) = Limited::new(response.into_body(), limit).collect().await else {
            return AuthOutcome::Unknown(UnknownCause::NoUser);
        };
        let bytes = body.to_bytes();
        match &self.cfg.user_json {
            Some(pointer) => user_in_json(&bytes, pointer),
            None => verified_or_no_user(
                std::str::from_utf8(&bytes)
                    .ok()
                    .and_then(|text| user_id(text.lines().next().unwrap_or(""))),
            ),
        }
    }
}

fn verified_or_no_user(user: Option<Arc<str>>) -> AuthOutcome {
    match user {
        Some(user) => AuthOutcome::Verified(user),
        None => AuthOutcome::Unknown(UnknownCause::NoUser),
    }
}

/// The verdict of a JSON answer at `pointer`: a non-zero number or a
/// non-empty string is a user; `0`, `""`, `null` or `false` is the app
/// saying "anonymous" (MediaWiki answers `meta=userinfo` with 200 and
/// `"id": 0` for everyone not logged in); no such field, or no JSON, says
/// nothing either way.
fn user_in_json(body: &[u8], pointer: &str) -> AuthOutcome {
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(body) else {
        return AuthOutcome::Unknown(UnknownCause::NoUser);
    };
    use serde_json::Value;
    match doc.pointer(pointer) {
        Some(Value::Number(n)) if n.as_f64() == Some(0.0) => AuthOutcome::Denied,
        Some(Value::Number(n)) => verified_or_no_user(user_id(&n.to_string())),
        Some(Value::String(s)) if s.trim().is_empty() => AuthOutcome::Denied,
        Some(Value::String(s)) => verified_or_no_user(user_id(s)),
        Some(Value::Null | Value::Bool(false)) => AuthOutcome::Denied,
        _ => AuthOutcome::Unknown(UnknownCause::NoUser),
    }
}

/// A user id as the app wrote it: trimmed, non-empty, bounded, no control characters.
fn user_id(text: &str) -> Option<Arc<str>> {
    let text = text.trim();
    let usable =
        !text.is_empty() && text.len() <= MAX_USER_LEN && !text.chars().any(|c| c.is_control());
    usable.then(|| Arc::from(text))
}

/// SHA-256 over each configured cookie's name and value, length-prefixed so that no two
/// different cookie sets give the same input; truncated to 128 bits.
fn digest(names: &[String], values: &[Option<&str>]) -> CacheKey {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for (name, value) in names.iter().zip(values) {
        ctx.update(&(name.len() as u64).to_le_bytes());
        ctx.update(name.as_bytes());
        match value {
            Some(value) => {
                ctx.update(&[1]);
                ctx.update(&(value.len() as u64).to_le_bytes());
                ctx.update(value.as_bytes());
            }
            None => ctx.update(&[0]),
        }
    }
    let full = ctx.finish();
    let mut key = [0u8; 16];
    key.copy_from_slice(&full.as_ref()[..16]);
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(cookie: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(COOKIE, HeaderValue::from_str(cookie).expect("cookie"));
        h
    }

    #[test]
    fn digest_depends_on_configured_cookies_only() {
        let names = vec!["wikiUserID".to_string(), "wikiToken".to_string()];
        let d = |c: &str| {
            let h = headers(c);
            let values: Vec<_> = names.iter().map(|n| cookie_value(&h, n)).collect();
            digest(&names, &values)
        };
        let base = d("wikiUserID=1; wikiToken=abc");
        let cases: &[(&str, bool)] = &[
            ("wikiToken=abc; wikiUserID=1", true),
            ("wikiUserID=1; wikiToken=abc; wikisession=zzz; _ga=1", true),
            ("wikiUserID=1; wikiToken=abd", false),
            ("wikiUserID=2; wikiToken=abc", false),
            ("wikiUserID=1", false),
            ("wikiUserID=1wikiToken=abc", false),
            ("wikiUserID=; wikiToken=1abc", false),
        ];
        for (cookie, same) in cases {
            assert_eq!(d(cookie) == base, *same, "{cookie}");
        }
    }

    #[test]
    fn json_answers_as_mediawiki_gives_them() {
        let p = "/query/userinfo/id";
        let cases: &[(&str, AuthOutcome)] = &[
            (
                r#"{"batchcomplete":"","query":{"userinfo":{"id":42,"name":"Alice"}}}"#,
                AuthOutcome::Verified(Arc::from("42")),
            ),
            (
                r#"{"batchcomplete":"","query":{"userinfo":{"id":0,"name":"192.0.2.7","anon":""}}}"#,
                AuthOutcome::Denied,
            ),
            (
                r#"{"query":{"userinfo":{"id":"alice"}}}"#,
                AuthOutcome::Verified(Arc::from("alice")),
            ),
            (r#"{"query":{"userinfo":{"id":""}}}"#, AuthOutcome::Denied),
            (r#"{"query":{"userinfo":{"id":null}}}"#, AuthOutcome::Denied),
            (
                r#"{"query":{"userinfo":{"id":false}}}"#,
                AuthOutcome::Denied,
            ),
            (r#"{"query":{"userinfo":{"id":0.0}}}"#, AuthOutcome::Denied),
            (
                r#"{"query":{"userinfo":{"id":[1]}}}"#,
                AuthOutcome::Unknown(UnknownCause::NoUser),
            ),
            (
                r#"{"error":{"code":"readapidenied"}}"#,
                AuthOutcome::Unknown(UnknownCause::NoUser),
            ),
            (
                "<html>maintenance</html>",
                AuthOutcome::Unknown(UnknownCause::NoUser),
            ),
        ];
        for (body, want) in cases {
            assert_eq!(&user_in_json(body.as_bytes(), p), want, "{body}");
        }
    }

    #[test]
    fn user_ids() {
        let cases: &[(&str, Option<&str>)] = &[
            ("42", Some("42")),
            ("  alice \r", Some("alice")),
            ("", None),
            ("   ", None),
            ("a\u{7}b", None),
        ];
        for (text, want) in cases {
            assert_eq!(user_id(text).as_deref(), *want, "{text:?}");
        }
        assert_eq!(user_id(&"x".repeat(MAX_USER_LEN + 1)), None);
    }

    #[test]
    fn config_errors_name_the_value() {
        let addr: SocketAddr = "127.0.0.1:9".parse().expect("literal");
        let clock: Arc<dyn Clock> = Arc::new(weir_limiter::ManualClock::default());
        let base = AuthSubrequestConfig::new(addr, &["wikiToken"]);
        type Edit = fn(&mut AuthSubrequestConfig);
        let cases: &[(Edit, &str)] = &[
            (|c| c.cookies.clear(), "cookies are empty"),
            (|c| c.cookies.push("a;b".into()), "`a;b`"),
            (|c| c.path = "whoami".into(), "`whoami`"),
            (|c| c.host = "a\nb".into(), "host `a\nb`"),
            (|c| c.timeout = Duration::ZERO, "timeout is zero"),
            (|c| c.max_in_flight = 0, "max_in_flight is zero"),
            (
                |c| c.required_cookies.push("wikiUserID".into()),
                "`wikiUserID` is not one",
            ),
            (
                |c| c.user_json = Some("query.id".into()),
                "`query.id` is not a JSON pointer",
            ),
            (
                |c| {
                    c.user_json = Some("/id".into());
                    c.user_header = Some(HeaderName::from_static("x-user"));
                },
                "both user_header and user_json_pointer",
            ),
        ];
        for (edit, want) in cases {
            let mut cfg = base.clone();
            edit(&mut cfg);
            let err = AuthSubrequest::new(cfg, clock.clone()).expect_err(want);
            assert!(err.to_string().contains(want), "{err} lacks {want}");
        }
        assert!(AuthSubrequest::new(base, clock).is_ok());
    }
}
