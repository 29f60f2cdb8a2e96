//! Simulated app server: the stand-in for MediaWiki + php-fpm in tests and in `weir sim`.
//!
//! It owns a real HTTP/1.1 server (hyper) on a socket whose only scarce resource is a pool
//! of `W` workers with a bounded backlog, because that is what ran out in incidents 1 and 2
//! (10 PHP workers, a 64-entry backlog, a new pool starting at 2 workers and growing by one
//! per second) while CPU and database were fine. Per request:
//!
//! 1. a free worker is taken at once; otherwise
//! 2. the request waits, first come first served, in a backlog of `backlog` entries; otherwise
//! 3. it is **refused**: its connection is reset without a response, which is what php-fpm's
//!    `listen.backlog` overflow looks like to the proxy in front. Refusal happens exactly
//!    past `W + backlog` requests inside the app.
//!
//! Everything that needs PHP takes a worker: pages, the health check (so it slows down and
//! fails when workers are busy, exactly as in incident 1), the login page and `/whoami`.
//! A worker is held for a service time drawn per path class and multiplied by
//! [`AppConfig::time_scale`]. [`SimApp::stall`] holds workers until released, like a
//! database that stops answering; tests use it to fill the pool deterministically.
//!
//! Every response carries `x-app-class`, `x-app-peer` (the TCP peer the app saw) and, when
//! the request had one, `x-app-saw-xff`, so tests can see what reached the app.
//!
//! It deliberately does not: burn CPU (workers sleep: CPU was never the bottleneck), read
//! request bodies, persist or expire sessions, speak HTTP/2 or TLS, time out idle
//! keep-alive connections, or limit anything per client. It is not part of weir's
//! request path.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, COOKIE, HeaderValue, SET_COOKIE};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rand::RngExt;
use serde::Deserialize;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{Semaphore, oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};

// ───────────────────────────── configuration ─────────────────────────────

/// Session cookie that `GET /login` hands to any visitor, crawlers included.
pub const SESSION_COOKIE: &str = "wikisession";
/// Logged-in cookie naming the user, set by `POST /login`.
pub const USER_ID_COOKIE: &str = "wikiUserID";
/// Logged-in cookie carrying the login token, set by `POST /login`.
pub const TOKEN_COOKIE: &str = "wikiToken";

/// Class name counted for health checks; reserved.
pub const HEALTH_CLASS: &str = "health";
/// Class name counted for `GET`/`POST` on the login path; reserved.
pub const LOGIN_CLASS: &str = "login";
/// Class name counted for `/whoami`; reserved.
pub const WHOAMI_CLASS: &str = "whoami";

/// Largest `body_bytes` accepted: responses are meant to be small.
const MAX_BODY_BYTES: usize = 1 << 20;
/// Largest `sigma` accepted for a log-normal: beyond it the tail (e^(4 sigma) at 4
/// standard deviations) stops looking like any web page.
const MAX_SIGMA: f64 = 4.0;
/// Kernel accept queue of the listening socket. Large on purpose: refusals must come from
/// the simulated worker backlog, not from SYNs dropped by the kernel (it caps this at
/// `net.core.somaxconn`).
const LISTEN_QUEUE: u32 = 4096;

/// Schema of the simulated app, embeddable in scenario TOML files.
///
/// Every field has a default (see [`AppConfig::default`]); an empty table is a valid app
/// shaped like incident 1's: 10 workers, a 64-entry backlog.
///
/// ```toml
/// workers = 16
/// backlog = 64
/// start_workers = 2          # incident 2: grows +1 per warmup_step_ms
/// time_scale = 0.1           # run ten times faster
/// default_service = { dist = "log_normal", median_ms = 60, sigma = 0.4 }
/// [[classes]]
/// class = "expensive"
/// query_key = "diff"
/// service = { dist = "uniform", min_ms = 200, max_ms = 900 }
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AppConfig {
    /// Maximum number of workers (php-fpm `pm.max_children`). Default 10 (incident 1).
    pub workers: usize,
    /// Requests that may wait for a worker before new ones are refused (php-fpm
    /// `listen.backlog`). Default 64 (incident 2). 0 refuses as soon as all workers are busy.
    pub backlog: usize,
    /// Workers available at start; the pool then grows by one every `warmup_step_ms` up to
    /// `workers`. Default: absent, meaning all `workers` from the start. Incident 2 had 2.
    pub start_workers: Option<usize>,
    /// Milliseconds between two workers added during warm-up, before `time_scale`.
    /// Default 1000 (incident 2: +1 per second).
    pub warmup_step_ms: u64,
    /// Multiplies every duration of the app (service times, warm-up step, health timeout),
    /// to compress scenarios in time. Default 1.0. 0 makes service instantaneous.
    pub time_scale: f64,
    /// Path classes, first match wins. Default: `expensive` for requests with a `diff`,
    /// `oldid` or `search` query key (log-normal, median 400 ms, sigma 0.5).
    pub classes: Vec<ClassRule>,
    /// Class of requests no rule matches. Default `page`.
    pub default_class: String,
    /// Service time of `default_class`. Default log-normal, median 60 ms, sigma 0.4.
    pub default_service: ServiceTime,
    /// Health endpoint; it needs a worker like any PHP request. Default `/healthz`.
    pub health_path: String,
    /// Service time of a health check. Default fixed 2 ms.
    pub health_service: ServiceTime,
    /// A health check that waits longer than this (before `time_scale`) in the backlog is
    /// answered `503` instead of waiting for a worker, as a container health check with a
    /// timeout fails. Default: absent, it waits like any request.
    pub health_timeout_ms: Option<u64>,
    /// Login path: `GET` hands out a session cookie, `POST` logs in. Default `/login`.
    pub login_path: String,
    /// Who-am-I path: `200` with the user id when logged in, `401` otherwise.
    /// Default `/whoami`.
    pub whoami_path: String,
    /// Service time of login and who-am-I requests. Default fixed 5 ms.
    pub auth_service: ServiceTime,
    /// Size of a page response body in bytes (at least the few bytes naming the class).
    /// Default 2048.
    pub body_bytes: usize,
}

impl Default for AppConfig {
    fn default() -> Self {
        let expensive = ServiceTime::LogNormal {
            median_ms: 400.0,
            sigma: 0.5,
        };
        let by_query = |key: &str| ClassRule {
            class: "expensive".to_string(),
            path_prefix: None,
            query_key: Some(key.to_string()),
            service: expensive,
        };
        AppConfig {
            workers: 10,
            backlog: 64,
            start_workers: None,
            warmup_step_ms: 1000,
            time_scale: 1.0,
            classes: vec![by_query("diff"), by_query("oldid"), by_query("search")],
            default_class: "page".to_string(),
            default_service: ServiceTime::LogNormal {
                median_ms: 60.0,
                sigma: 0.4,
            },
            health_path: "/healthz".to_string(),
            health_service: ServiceTime::Fixed { ms: 2.0 },
            health_timeout_ms: None,
            login_path: "/login".to_string(),
            whoami_path: "/whoami".to_string(),
            auth_service: ServiceTime::Fixed { ms: 5.0 },
            body_bytes: 2048,
        }
    }
}

/// One path-class rule: a request matches when every condition given holds.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassRule {
    /// Class name, counted in [`AppSnapshot::classes`] and echoed in `x-app-class`.
    /// Several rules may share a class.
    pub class: String,
    /// The path starts with this.
    #[serde(default)]
    pub path_prefix: Option<String>,
    /// The query string has this key (`key` or `key=...`), compared without decoding.
    #[serde(default)]
    pub query_key: Option<String>,
    /// How long a worker is held.
    pub service: ServiceTime,
}

/// How long a request holds its worker, before `time_scale`. In TOML:
/// `{ dist = "fixed", ms = 20 }`, `{ dist = "uniform", min_ms = 10, max_ms = 50 }`,
/// `{ dist = "log_normal", median_ms = 60, sigma = 0.4 }`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(tag = "dist", rename_all = "snake_case", deny_unknown_fields)]
pub enum ServiceTime {
    /// Always `ms`.
    Fixed { ms: f64 },
    /// Uniform between `min_ms` and `max_ms`.
    Uniform { min_ms: f64, max_ms: f64 },
    /// Log-normal: half the requests take less than `median_ms`; `sigma` is the standard
    /// deviation of the logarithm (0.5 puts the 95th percentile at 2.3 x the median).
    LogNormal { median_ms: f64, sigma: f64 },
}

impl ServiceTime {
    fn problem(&self) -> Option<String> {
        let bad = |v: f64| !v.is_finite() || v < 0.0;
        match *self {
            ServiceTime::Fixed { ms } if bad(ms) => Some(format!("ms = {ms} must be >= 0")),
            ServiceTime::Uniform { min_ms, max_ms } if bad(min_ms) || bad(max_ms) => Some(format!(
                "min_ms = {min_ms}, max_ms = {max_ms} must both be >= 0"
            )),
            ServiceTime::Uniform { min_ms, max_ms } if min_ms > max_ms => {
                Some(format!("min_ms = {min_ms} is more than max_ms = {max_ms}"))
            }
            ServiceTime::LogNormal { median_ms, .. } if bad(median_ms) || median_ms == 0.0 => {
                Some(format!("median_ms = {median_ms} must be > 0"))
            }
            ServiceTime::LogNormal { sigma, .. } if bad(sigma) || sigma > MAX_SIGMA => {
                Some(format!("sigma = {sigma} must be between 0 and {MAX_SIGMA}"))
            }
            _ => None,
        }
    }

    /// Draws one service time in milliseconds (before `time_scale`).
    fn sample_ms(&self, rng: &mut impl rand::Rng) -> f64 {
        match *self {
            ServiceTime::Fixed { ms } => ms,
            ServiceTime::Uniform { min_ms, max_ms } => {
                min_ms + (max_ms - min_ms) * rng.random::<f64>()
            }
            ServiceTime::LogNormal { median_ms, sigma } => {
                // Box-Muller: a standard normal from two uniforms; u1 in (0, 1] keeps ln finite.
                let u1 = 1.0 - rng.random::<f64>();
                let u2 = rng.random::<f64>();
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                median_ms * (sigma * z).exp()
            }
        }
    }
}

/// One problem in an [`AppConfig`]; keys are spelled as in TOML.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum AppConfigError {
    #[error("workers = 0: the app needs at least one worker")]
    NoWorkers,
    #[error("start_workers = {start} is more than workers = {workers}")]
    StartAboveWorkers { start: usize, workers: usize },
    #[error("warmup_step_ms = 0 while start_workers = {start} < workers = {workers}")]
    ZeroWarmupStep { start: usize, workers: usize },
    #[error("time_scale = {0} must be a finite number >= 0")]
    TimeScale(f64),
    #[error("{key}: {reason}")]
    ServiceTime { key: String, reason: String },
    #[error("{key} is empty")]
    EmptyClass { key: String },
    #[error("{key} = {class:?} is reserved for a built-in endpoint")]
    ReservedClass { key: String, class: String },
    #[error(
        "classes[{index}] (class {class:?}) has neither path_prefix nor query_key, so it \
         matches every request; use default_class for that"
    )]
    RuleMatchesAll { index: usize, class: String },
    #[error("{key} = {path:?} must start with '/'")]
    PathNotAbsolute { key: String, path: String },
    #[error("{first} and {second} are both {path:?}")]
    SamePath {
        first: &'static str,
        second: &'static str,
        path: String,
    },
    #[error("body_bytes = {0} is more than {MAX_BODY_BYTES}")]
    BodyTooLarge(usize),
}

/// Every problem found in an [`AppConfig`], reported together.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid app config: {}", join_problems(.problems))]
pub struct InvalidAppConfig {
    pub problems: Vec<AppConfigError>,
}

fn join_problems(problems: &[AppConfigError]) -> String {
    let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
    text.join("; ")
}

impl AppConfig {
    /// Checks every field and reports all problems at once.
    pub fn validate(&self) -> Result<(), InvalidAppConfig> {
        let mut problems = Vec::new();
        self.check_workers(&mut problems);
        if !self.time_scale.is_finite() || self.time_scale < 0.0 {
            problems.push(AppConfigError::TimeScale(self.time_scale));
        }
        self.check_classes(&mut problems);
        self.check_paths(&mut problems);
        if self.body_bytes > MAX_BODY_BYTES {
            problems.push(AppConfigError::BodyTooLarge(self.body_bytes));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(InvalidAppConfig { problems })
        }
    }

    /// Workers, and the warm-up from `start_workers` to them.
    fn check_workers(&self, problems: &mut Vec<AppConfigError>) {
        if self.workers == 0 {
            problems.push(AppConfigError::NoWorkers);
        }
        if let Some(start) = self.start_workers {
            if start > self.workers {
                problems.push(AppConfigError::StartAboveWorkers {
                    start,
                    workers: self.workers,
                });
            } else if start < self.workers && self.warmup_step_ms == 0 {
                problems.push(AppConfigError::ZeroWarmupStep {
                    start,
                    workers: self.workers,
                });
            }
        }
    }

    /// Service times, class names, and class rules that would match all.
    fn check_classes(&self, problems: &mut Vec<AppConfigError>) {
        let services = [
            ("default_service".to_string(), self.default_service),
            ("health_service".to_string(), self.health_service),
            ("auth_service".to_string(), self.auth_service),
        ];
        let rule_services = (self.classes.iter().enumerate())
            .map(|(i, rule)| (format!("classes[{i}].service"), rule.service));
        for (key, service) in services.into_iter().chain(rule_services) {
            if let Some(reason) = service.problem() {
                problems.push(AppConfigError::ServiceTime { key, reason });
            }
        }
        let class_names = std::iter::once(("default_class".to_string(), &self.default_class))
            .chain(
                (self.classes.iter().enumerate())
                    .map(|(i, rule)| (format!("classes[{i}].class"), &rule.class)),
            );
        for (key, class) in class_names {
            if class.is_empty() {
                problems.push(AppConfigError::EmptyClass { key });
            } else if [HEALTH_CLASS, LOGIN_CLASS, WHOAMI_CLASS].contains(&class.as_str()) {
                problems.push(AppConfigError::ReservedClass {
                    key,
                    class: class.clone(),
                });
            }
        }
        for (index, rule) in self.classes.iter().enumerate() {
            if rule.path_prefix.is_none() && rule.query_key.is_none() {
                problems.push(AppConfigError::RuleMatchesAll {
                    index,
                    class: rule.class.clone(),
                });
            }
        }
    }

    /// The app's own paths: absolute, and each its own.
    fn check_paths(&self, problems: &mut Vec<AppConfigError>) {
        let paths = [
            ("health_path", &self.health_path),
            ("login_path", &self.login_path),
            ("whoami_path", &self.whoami_path),
        ];
        for (key, path) in paths {
            if !path.starts_with('/') {
                problems.push(AppConfigError::PathNotAbsolute {
                    key: key.to_string(),
                    path: path.clone(),
                });
            }
        }
        for (i, (first, path)) in paths.iter().enumerate() {
            for (second, other) in &paths[i + 1..] {
                if path == other {
                    problems.push(AppConfigError::SamePath {
                        first,
                        second,
                        path: path.to_string(),
                    });
                }
            }
        }
    }
}

// ───────────────────────────── routing plan ─────────────────────────────

/// What a request is, decided from method, path and query before it takes a worker.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Endpoint {
    Health,
    LoginPage,
    LoginSubmit,
    WhoAmI,
    Page { class: usize, service: ServiceTime },
}

#[derive(Debug)]
struct CompiledRule {
    class: usize,
    path_prefix: Option<String>,
    query_key: Option<String>,
    service: ServiceTime,
}

/// The validated configuration in the form requests use: class indices, pre-built bodies,
/// durations.
#[derive(Debug)]
struct Plan {
    rules: Vec<CompiledRule>,
    default_class: usize,
    default_service: ServiceTime,
    class_names: Vec<String>,
    bodies: Vec<Bytes>,
    health_class: usize,
    login_class: usize,
    whoami_class: usize,
    health_path: String,
    login_path: String,
    whoami_path: String,
    health_service: ServiceTime,
    auth_service: ServiceTime,
    health_timeout: Option<Duration>,
    time_scale: f64,
}

impl Plan {
    fn build(cfg: &AppConfig) -> Result<Plan, InvalidAppConfig> {
        cfg.validate()?;
        let mut class_names: Vec<String> = Vec::new();
        let mut intern = |name: &str| match class_names.iter().position(|n| n == name) {
            Some(i) => i,
            None => {
                class_names.push(name.to_string());
                class_names.len() - 1
            }
        };
        let default_class = intern(&cfg.default_class);
        let rules = (cfg.classes.iter())
            .map(|rule| CompiledRule {
                class: intern(&rule.class),
                path_prefix: rule.path_prefix.clone(),
                query_key: rule.query_key.clone(),
                service: rule.service,
            })
            .collect();
        let health_class = intern(HEALTH_CLASS);
        let login_class = intern(LOGIN_CLASS);
        let whoami_class = intern(WHOAMI_CLASS);
        let bodies = (class_names.iter())
            .map(|name| page_body(name, cfg.body_bytes))
            .collect();
        Ok(Plan {
            rules,
            default_class,
            default_service: cfg.default_service,
            class_names,
            bodies,
            health_class,
            login_class,
            whoami_class,
            health_path: cfg.health_path.clone(),
            login_path: cfg.login_path.clone(),
            whoami_path: cfg.whoami_path.clone(),
            health_service: cfg.health_service,
            auth_service: cfg.auth_service,
            health_timeout: cfg
                .health_timeout_ms
                .map(|ms| scaled(ms as f64, cfg.time_scale)),
            time_scale: cfg.time_scale,
        })
    }

    fn route(&self, method: &Method, path: &str, query: Option<&str>) -> Endpoint {
        if path == self.health_path {
            return Endpoint::Health;
        }
        if path == self.login_path {
            return if method == Method::POST {
                Endpoint::LoginSubmit
            } else {
                Endpoint::LoginPage
            };
        }
        if path == self.whoami_path {
            return Endpoint::WhoAmI;
        }
        let matched = self.rules.iter().find(|rule| {
            let prefix_ok = (rule.path_prefix.as_deref()).is_none_or(|p| path.starts_with(p));
            let query_ok = (rule.query_key.as_deref()).is_none_or(|k| has_query_key(query, k));
            prefix_ok && query_ok
        });
        match matched {
            Some(rule) => Endpoint::Page {
                class: rule.class,
                service: rule.service,
            },
            None => Endpoint::Page {
                class: self.default_class,
                service: self.default_service,
            },
        }
    }

    fn class_of(&self, endpoint: Endpoint) -> usize {
        match endpoint {
            Endpoint::Health => self.health_class,
            Endpoint::LoginPage | Endpoint::LoginSubmit => self.login_class,
            Endpoint::WhoAmI => self.whoami_class,
            Endpoint::Page { class, .. } => class,
        }
    }

    fn service_of(&self, endpoint: Endpoint) -> ServiceTime {
        match endpoint {
            Endpoint::Health => self.health_service,
            Endpoint::LoginPage | Endpoint::LoginSubmit | Endpoint::WhoAmI => self.auth_service,
            Endpoint::Page { service, .. } => service,
        }
    }
}

fn has_query_key(query: Option<&str>, key: &str) -> bool {
    (query.unwrap_or_default().split('&'))
        .any(|pair| pair.split_once('=').map_or(pair, |(k, _)| k) == key)
}

/// A small HTML page naming its class, padded to `size` bytes.
fn page_body(class: &str, size: usize) -> Bytes {
    let mut body = format!(
        "<!doctype html><title>{class}</title><p>class={class}</p>\n",
        class = class
    );
    const PAD_OPEN: &str = "<!--";
    const PAD_CLOSE: &str = "-->\n";
    if body.len() + PAD_OPEN.len() + PAD_CLOSE.len() <= size {
        body.push_str(PAD_OPEN);
        let fill = size - body.len() - PAD_CLOSE.len();
        body.extend(std::iter::repeat_n('x', fill));
        body.push_str(PAD_CLOSE);
    }
    Bytes::from(body)
}

/// Milliseconds times the scale, as a duration; never panics on odd floats.
fn scaled(ms: f64, time_scale: f64) -> Duration {
    let secs = ms * time_scale / 1000.0;
    if secs.is_nan() || secs <= 0.0 {
        return Duration::ZERO;
    }
    // tokio caps sleeps far in the future anyway; a day is "forever" for a simulation.
    Duration::try_from_secs_f64(secs)
        .unwrap_or(Duration::MAX)
        .min(Duration::from_secs(86_400))
}

// ───────────────────────────── statistics ─────────────────────────────

/// Live counters of a [`SimApp`]; read them with [`AppStats::snapshot`].
///
/// Counters are independent atomics, so a snapshot is not one instant across fields, but
/// `in_flight`, `queued` and their maxima are written under the pool's lock and are exact.
/// Every request that reaches the app ends in exactly one of `served`, `refused`,
/// `health_timed_out` or `abandoned`, or is still in flight or queued.
#[derive(Debug)]
pub struct AppStats {
    workers: AtomicUsize,
    received: AtomicU64,
    served: AtomicU64,
    refused: AtomicU64,
    abandoned: AtomicU64,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    queued: AtomicUsize,
    max_queued: AtomicUsize,
    stalled: AtomicUsize,
    health_ok: AtomicU64,
    health_timed_out: AtomicU64,
    connections_open: AtomicUsize,
    connections_accepted: AtomicU64,
    class_names: Vec<String>,
    class_counts: Vec<AtomicU64>,
}

/// A plain copy of [`AppStats`] at one moment, for assertions and timelines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppSnapshot {
    /// Workers the pool has now (grows during warm-up).
    pub workers: usize,
    /// Requests whose head reached the app.
    pub received: u64,
    /// Requests that held a worker and got a response (any status, health checks included).
    pub served: u64,
    /// Requests refused because all workers and the backlog were full (connection reset).
    pub refused: u64,
    /// Requests dropped before their response: client gone, or the app killed.
    pub abandoned: u64,
    /// Requests holding a worker now.
    pub in_flight: usize,
    /// Most requests ever holding a worker at once.
    pub max_in_flight: usize,
    /// Requests waiting in the backlog now.
    pub queued: usize,
    /// Most requests ever waiting in the backlog at once.
    pub max_queued: usize,
    /// Workers held at the stall gate now (see [`SimApp::stall`]).
    pub stalled: usize,
    /// Health checks answered `200`.
    pub health_ok: u64,
    /// Health checks that left the backlog without a worker: answered `503` after
    /// `health_timeout_ms`, or their client went away while waiting.
    pub health_timed_out: u64,
    /// Client connections open now.
    pub connections_open: usize,
    /// Client connections accepted since start.
    pub connections_accepted: u64,
    /// Served requests per class, in configuration order, built-in classes last.
    pub classes: Vec<(String, u64)>,
}

impl AppSnapshot {
    /// Served count of one class (0 when the class does not exist).
    pub fn class(&self, name: &str) -> u64 {
        (self.classes.iter())
            .find(|(n, _)| n == name)
            .map_or(0, |(_, count)| *count)
    }
}

impl AppStats {
    fn new(class_names: Vec<String>, workers: usize) -> AppStats {
        let class_counts = class_names.iter().map(|_| AtomicU64::new(0)).collect();
        AppStats {
            workers: AtomicUsize::new(workers),
            received: AtomicU64::new(0),
            served: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
            max_queued: AtomicUsize::new(0),
            stalled: AtomicUsize::new(0),
            health_ok: AtomicU64::new(0),
            health_timed_out: AtomicU64::new(0),
            connections_open: AtomicUsize::new(0),
            connections_accepted: AtomicU64::new(0),
            class_names,
            class_counts,
        }
    }

    /// Copies every counter.
    pub fn snapshot(&self) -> AppSnapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let get_usize = |a: &AtomicUsize| a.load(Ordering::Relaxed);
        AppSnapshot {
            workers: get_usize(&self.workers),
            received: get(&self.received),
            served: get(&self.served),
            refused: get(&self.refused),
            abandoned: get(&self.abandoned),
            in_flight: get_usize(&self.in_flight),
            max_in_flight: get_usize(&self.max_in_flight),
            queued: get_usize(&self.queued),
            max_queued: get_usize(&self.max_queued),
            stalled: get_usize(&self.stalled),
            health_ok: get(&self.health_ok),
            health_timed_out: get(&self.health_timed_out),
            connections_open: get_usize(&self.connections_open),
            connections_accepted: get(&self.connections_accepted),
            classes: (self.class_names.iter().zip(&self.class_counts))
                .map(|(name, count)| (name.clone(), get(count)))
                .collect(),
        }
    }

    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

// ───────────────────────────── worker pool ─────────────────────────────

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave the counters half-written in a way that
    // matters more than losing the simulation, so keep going.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `W` workers and a FIFO backlog, like php-fpm: admission is decided under one lock so
/// that refusal happens exactly past `workers + backlog`.
#[derive(Debug)]
struct WorkerPool {
    state: Mutex<PoolState>,
    max_workers: usize,
    backlog: usize,
    stats: Arc<AppStats>,
}

#[derive(Debug)]
struct PoolState {
    /// Workers the pool has now.
    capacity: usize,
    /// Armed [`Worker`] guards alive, including ones in transit to a waiter.
    busy: usize,
    waiting: VecDeque<Waiter>,
    next_ticket: u64,
}

#[derive(Debug)]
struct Waiter {
    ticket: u64,
    tx: oneshot::Sender<Worker>,
}

/// A worker held by one request; dropping it hands the worker to the oldest waiter.
#[derive(Debug)]
struct Worker {
    pool: Arc<WorkerPool>,
    armed: bool,
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.armed {
            self.pool.release();
        }
    }
}

/// A place in the backlog; dropping it before a worker arrives leaves the backlog.
#[derive(Debug)]
struct QueuedTicket {
    pool: Arc<WorkerPool>,
    ticket: u64,
    rx: oneshot::Receiver<Worker>,
    got_worker: bool,
}

impl QueuedTicket {
    /// Waits for a worker; `None` only if the pool itself went away.
    async fn wait(mut self) -> Option<Worker> {
        let worker = (&mut self.rx).await.ok();
        self.got_worker = worker.is_some();
        worker
    }
}

impl Drop for QueuedTicket {
    fn drop(&mut self) {
        if !self.got_worker {
            // If a worker was already sent, it is dropped with `rx` and released then.
            self.pool.leave_backlog(self.ticket);
        }
    }
}

#[derive(Debug)]
enum Admission {
    Now(Worker),
    Queued(QueuedTicket),
    Refused,
}

impl WorkerPool {
    fn new(start: usize, max_workers: usize, backlog: usize, stats: Arc<AppStats>) -> Self {
        WorkerPool {
            state: Mutex::new(PoolState {
                capacity: start,
                busy: 0,
                waiting: VecDeque::new(),
                next_ticket: 0,
            }),
            max_workers,
            backlog,
            stats,
        }
    }

    fn admit(self: &Arc<Self>) -> Admission {
        let mut st = lock(&self.state);
        if st.busy < st.capacity && st.waiting.is_empty() {
            st.busy += 1;
            self.publish(&st);
            return Admission::Now(Worker {
                pool: self.clone(),
                armed: true,
            });
        }
        if st.waiting.len() >= self.backlog {
            return Admission::Refused;
        }
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        let (tx, rx) = oneshot::channel();
        st.waiting.push_back(Waiter { ticket, tx });
        self.publish(&st);
        Admission::Queued(QueuedTicket {
            pool: self.clone(),
            ticket,
            rx,
            got_worker: false,
        })
    }

    fn release(self: &Arc<Self>) {
        let mut st = lock(&self.state);
        st.busy = st.busy.saturating_sub(1);
        self.dispatch(&mut st);
    }

    fn leave_backlog(&self, ticket: u64) {
        let mut st = lock(&self.state);
        st.waiting.retain(|w| w.ticket != ticket);
        self.publish(&st);
    }

    /// Adds one worker (warm-up); returns whether the pool can still grow.
    fn add_worker(self: &Arc<Self>) -> bool {
        let mut st = lock(&self.state);
        st.capacity = (st.capacity + 1).min(self.max_workers);
        self.dispatch(&mut st);
        st.capacity < self.max_workers
    }

    /// Hands free workers to the oldest live waiters.
    fn dispatch(self: &Arc<Self>, st: &mut PoolState) {
        while st.busy < st.capacity {
            let Some(waiter) = st.waiting.pop_front() else {
                break;
            };
            st.busy += 1;
            let worker = Worker {
                pool: self.clone(),
                armed: true,
            };
            if let Err(mut unsent) = waiter.tx.send(worker) {
                // The waiter is gone; this worker was never handed out.
                unsent.armed = false;
                st.busy -= 1;
            }
        }
        self.publish(st);
    }

    fn publish(&self, st: &PoolState) {
        let s = &self.stats;
        s.workers.store(st.capacity, Ordering::Relaxed);
        s.in_flight.store(st.busy, Ordering::Relaxed);
        s.max_in_flight.fetch_max(st.busy, Ordering::Relaxed);
        s.queued.store(st.waiting.len(), Ordering::Relaxed);
        s.max_queued.fetch_max(st.waiting.len(), Ordering::Relaxed);
    }
}

/// Holds workers after they take a request, like a database that stopped answering.
#[derive(Debug, Default)]
struct StallGate {
    gate: Mutex<Option<Arc<Semaphore>>>,
}

impl StallGate {
    fn stall(&self) {
        let mut gate = lock(&self.gate);
        if gate.is_none() {
            *gate = Some(Arc::new(Semaphore::new(0)));
        }
    }

    fn release(&self, n: usize) {
        if let Some(gate) = lock(&self.gate).as_ref() {
            let room = Semaphore::MAX_PERMITS - gate.available_permits();
            gate.add_permits(n.min(room));
        }
    }

    fn unstall(&self) {
        if let Some(gate) = lock(&self.gate).take() {
            gate.close();
        }
    }

    async fn pass(&self, stats: &AppStats) {
        let gate = lock(&self.gate).clone();
        let Some(gate) = gate else { return };
        stats.stalled.fetch_add(1, Ordering::Relaxed);
        let _count = DecrementOnDrop(&stats.stalled);
        // A closed gate (unstall) lets everyone through.
        if let Ok(permit) = gate.acquire().await {
            permit.forget();
        }
    }
}

struct DecrementOnDrop<'a>(&'a AtomicUsize);

impl Drop for DecrementOnDrop<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

// ───────────────────────────── sessions ─────────────────────────────

/// Issued login tokens; a request is logged in when its `wikiToken` was issued by this app
/// for the user its `wikiUserID` names. Never expires: a simulation runs for minutes.
#[derive(Debug, Default)]
struct Sessions {
    tokens: Mutex<HashMap<String, u64>>,
    next_user: AtomicU64,
}

impl Sessions {
    fn log_in(&self) -> (u64, String) {
        let user = self.next_user.fetch_add(1, Ordering::Relaxed) + 1;
        let token = random_token();
        lock(&self.tokens).insert(token.clone(), user);
        (user, token)
    }

    fn user_of(&self, headers: &HeaderMap) -> Option<u64> {
        let token = cookie(headers, TOKEN_COOKIE)?;
        let claimed: u64 = cookie(headers, USER_ID_COOKIE)?.parse().ok()?;
        let issued = *lock(&self.tokens).get(token)?;
        (issued == claimed).then_some(issued)
    }
}

fn random_token() -> String {
    format!("{:032x}", rand::rng().random::<u128>())
}

/// The value of the first cookie called `name` in any `Cookie` header.
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    (headers.get_all(COOKIE).iter())
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

// ───────────────────────────── HTTP handling ─────────────────────────────

/// Returned by the service to make hyper drop the connection; it is then reset.
#[derive(Debug, thiserror::Error)]
#[error("refused: all workers busy and the backlog full")]
struct BacklogFull;

#[derive(Debug)]
struct Shared {
    plan: Plan,
    pool: Arc<WorkerPool>,
    stats: Arc<AppStats>,
    stall: StallGate,
    sessions: Sessions,
}

/// Where a request is, so that a dropped request is counted once in the right place.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stage {
    Arrived,
    Queued,
    Working,
    Done,
}

struct RequestLedger<'a> {
    stats: &'a AppStats,
    health: bool,
    stage: Stage,
}

impl Drop for RequestLedger<'_> {
    fn drop(&mut self) {
        match self.stage {
            Stage::Done => {}
            Stage::Queued if self.health => AppStats::bump(&self.stats.health_timed_out),
            Stage::Arrived | Stage::Queued | Stage::Working => {
                AppStats::bump(&self.stats.abandoned)
            }
        }
    }
}

type AppResponse = Response<Full<Bytes>>;

async fn handle(
    shared: Arc<Shared>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<AppResponse, BacklogFull> {
    let stats = &*shared.stats;
    let plan = &shared.plan;
    AppStats::bump(&stats.received);
    let endpoint = plan.route(req.method(), req.uri().path(), req.uri().query());
    let mut ledger = RequestLedger {
        stats,
        health: endpoint == Endpoint::Health,
        stage: Stage::Arrived,
    };
    let worker = match shared.pool.admit() {
        Admission::Now(worker) => worker,
        Admission::Queued(ticket) => {
            ledger.stage = Stage::Queued;
            let waited = match plan.health_timeout.filter(|_| ledger.health) {
                Some(limit) => match tokio::time::timeout(limit, ticket.wait()).await {
                    Ok(waited) => waited,
                    Err(_elapsed) => {
                        ledger.stage = Stage::Done;
                        AppStats::bump(&stats.health_timed_out);
                        return Ok(text(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "health check timed out waiting for a worker\n",
                        ));
                    }
                },
                None => ticket.wait().await,
            };
            // `None` means the pool is gone, which only happens while the app is torn down.
            waited.ok_or(BacklogFull)?
        }
        Admission::Refused => {
            ledger.stage = Stage::Done;
            AppStats::bump(&stats.refused);
            return Err(BacklogFull);
        }
    };
    ledger.stage = Stage::Working;
    shared.stall.pass(stats).await;
    let service_ms = plan.service_of(endpoint).sample_ms(&mut rand::rng());
    tokio::time::sleep(scaled(service_ms, plan.time_scale)).await;

    let user = shared.sessions.user_of(req.headers());
    let mut response = answer(&shared, endpoint, user);
    // The worker is free once the response is built; it goes to the next waiter now.
    drop(worker);

    let class = plan.class_of(endpoint);
    annotate(&mut response, plan, class, peer, req.headers(), user);
    ledger.stage = Stage::Done;
    AppStats::bump(&stats.served);
    if let Some(count) = stats.class_counts.get(class) {
        AppStats::bump(count);
    }
    Ok(response)
}

/// What an endpoint answers, once its worker has done the work (the sleep).
fn answer(shared: &Shared, endpoint: Endpoint, user: Option<u64>) -> AppResponse {
    match endpoint {
        Endpoint::Health => {
            AppStats::bump(&shared.stats.health_ok);
            text(StatusCode::OK, "ok\n")
        }
        Endpoint::LoginPage => {
            let mut response = html(StatusCode::OK, Bytes::from_static(LOGIN_FORM));
            let session = format!("{SESSION_COOKIE}={}; Path=/; HttpOnly", random_token());
            set_cookie(&mut response, &session);
            response
        }
        Endpoint::LoginSubmit => {
            let (user, token) = shared.sessions.log_in();
            let mut response = html(
                StatusCode::OK,
                Bytes::from(format!("logged in as {user}\n")),
            );
            set_cookie(&mut response, &format!("{USER_ID_COOKIE}={user}; Path=/"));
            set_cookie(
                &mut response,
                &format!("{TOKEN_COOKIE}={token}; Path=/; HttpOnly"),
            );
            response
        }
        Endpoint::WhoAmI => match user {
            Some(user) => text(StatusCode::OK, &format!("{user}\n")),
            None => text(StatusCode::UNAUTHORIZED, "not logged in\n"),
        },
        Endpoint::Page { class, .. } => {
            let body = shared.plan.bodies.get(class).cloned().unwrap_or_default();
            html(StatusCode::OK, body)
        }
    }
}

const LOGIN_FORM: &[u8] = b"<!doctype html><title>login</title>\
<form method=post><input name=wpName><input name=wpPassword type=password></form>\n";

fn html(status: StatusCode, body: Bytes) -> AppResponse {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    (response.headers_mut()).insert(CONTENT_TYPE, HeaderValue::from_static("text/html"));
    response
}

fn text(status: StatusCode, body: &str) -> AppResponse {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    (response.headers_mut()).insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    response
}

fn set_cookie(response: &mut AppResponse, cookie: &str) {
    if let Ok(value) = HeaderValue::from_str(cookie) {
        response.headers_mut().append(SET_COOKIE, value);
    }
}

/// Echo headers that let tests see what reached the app.
fn annotate(
    response: &mut AppResponse,
    plan: &Plan,
    class: usize,
    peer: SocketAddr,
    request_headers: &HeaderMap,
    user: Option<u64>,
) {
    let mut put = |name: &'static str, value: &str| {
        if let Ok(value) = HeaderValue::from_str(value) {
            response.headers_mut().insert(name, value);
        }
    };
    if let Some(name) = plan.class_names.get(class) {
        put("x-app-class", name);
    }
    put("x-app-peer", &peer.to_string());
    let mut xff = String::new();
    for value in request_headers.get_all("x-forwarded-for") {
        if !xff.is_empty() {
            xff.push_str(", ");
        }
        xff.push_str(&String::from_utf8_lossy(value.as_bytes()));
    }
    if !xff.is_empty() {
        put("x-app-saw-xff", &xff);
    }
    if let Some(user) = user {
        put("x-app-user", &user.to_string());
    }
}

// ───────────────────────────── server ─────────────────────────────

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Running,
    /// Stop accepting; finish in-flight and queued requests; close idle connections.
    Draining,
    /// Reset every connection now.
    Killed,
}

/// A running simulated app server. See the module documentation.
///
/// Dropping it kills it (as [`SimApp::kill`] does, without waiting).
#[derive(Debug)]
pub struct SimApp {
    addr: SocketAddr,
    shared: Arc<Shared>,
    mode: watch::Sender<Mode>,
    accept: Option<JoinHandle<()>>,
    warmup: Option<JoinHandle<()>>,
}

impl SimApp {
    /// Validates `cfg`, binds `bind` (port 0 picks a free port) and starts serving.
    ///
    /// Must be called inside a tokio runtime. Errors: `InvalidInput` (wrapping
    /// [`InvalidAppConfig`]) for a bad config or when there is no runtime; bind errors as is.
    pub fn start(cfg: AppConfig, bind: SocketAddr) -> io::Result<SimApp> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|err| io::Error::new(io::ErrorKind::InvalidInput, err))?;
        let plan =
            Plan::build(&cfg).map_err(|err| io::Error::new(io::ErrorKind::InvalidInput, err))?;
        let start_workers = cfg.start_workers.unwrap_or(cfg.workers);
        let stats = Arc::new(AppStats::new(plan.class_names.clone(), start_workers));
        let pool = Arc::new(WorkerPool::new(
            start_workers,
            cfg.workers,
            cfg.backlog,
            stats.clone(),
        ));

        let socket = if bind.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        // So that a lab can kill an app and start another on the same port at once.
        socket.set_reuseaddr(true)?;
        socket.bind(bind)?;
        let listener = {
            let _entered = runtime.enter();
            socket.listen(LISTEN_QUEUE)?
        };
        let addr = listener.local_addr()?;

        let shared = Arc::new(Shared {
            plan,
            pool: pool.clone(),
            stats,
            stall: StallGate::default(),
            sessions: Sessions::default(),
        });
        let (mode, mode_rx) = watch::channel(Mode::Running);
        let accept = runtime.spawn(accept_loop(listener, shared.clone(), mode_rx));
        let warmup = (start_workers < cfg.workers).then(|| {
            let step = scaled(cfg.warmup_step_ms as f64, cfg.time_scale);
            runtime.spawn(async move {
                loop {
                    tokio::time::sleep(step).await;
                    if !pool.add_worker() {
                        break;
                    }
                }
            })
        });
        Ok(SimApp {
            addr,
            shared,
            mode,
            accept: Some(accept),
            warmup,
        })
    }

    /// The address the app listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The live counters (shared; they keep counting after this call).
    pub fn stats(&self) -> Arc<AppStats> {
        self.shared.stats.clone()
    }

    /// Shorthand for `self.stats().snapshot()`.
    pub fn snapshot(&self) -> AppSnapshot {
        self.shared.stats.snapshot()
    }

    /// From now on every worker, after taking a request and before its service time, waits
    /// until released: a database that stopped answering. Workers already past the gate
    /// are not affected.
    pub fn stall(&self) {
        self.shared.stall.stall();
    }

    /// Lets the next `n` stalled workers through (now or when they arrive at the gate).
    /// Does nothing when not stalled.
    pub fn release_stalled(&self, n: usize) {
        self.shared.stall.release(n);
    }

    /// Ends the stall: every held worker proceeds, and new ones are not held.
    pub fn unstall(&self) {
        self.shared.stall.unstall();
    }

    /// Graceful stop: stops accepting, lets in-flight and queued requests finish, closes
    /// keep-alive connections after their current response, and returns when every
    /// connection is closed. Stalled workers stay stalled: [`SimApp::unstall`] first.
    pub async fn shutdown(mut self) {
        self.stop(Mode::Draining).await;
    }

    /// Abrupt stop, like a container restart: stops accepting and resets every connection
    /// at once (in-flight and queued requests get no response). Returns when all are closed.
    pub async fn kill(mut self) {
        self.stop(Mode::Killed).await;
    }

    async fn stop(&mut self, mode: Mode) {
        self.mode.send_replace(mode);
        if let Some(warmup) = self.warmup.take() {
            warmup.abort();
        }
        if let Some(accept) = self.accept.take() {
            // A panic in the accept loop is a bug; the app is stopped either way.
            let _ = accept.await;
        }
    }
}

impl Drop for SimApp {
    fn drop(&mut self) {
        self.mode.send_replace(Mode::Killed);
        if let Some(warmup) = self.warmup.take() {
            warmup.abort();
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, mut mode: watch::Receiver<Mode>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    AppStats::bump(&shared.stats.connections_accepted);
                    connections.spawn(serve_connection(stream, peer, shared.clone(), mode.clone()));
                }
                Err(err) => {
                    // Out of file descriptors and the like: back off instead of spinning,
                    // the connections already open keep being served.
                    tracing::debug!(error = %err, "sim app accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            changed = mode.changed() => {
                if changed.is_err() || *mode.borrow_and_update() != Mode::Running {
                    break;
                }
            }
        }
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    mut mode: watch::Receiver<Mode>,
) {
    let stats = shared.stats.clone();
    stats.connections_open.fetch_add(1, Ordering::Relaxed);
    let _open = DecrementOnDrop(&stats.connections_open);
    // Small responses: do not let Nagle hold them back.
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |req| handle(shared.clone(), peer, req));
    let mut conn = http1::Builder::new()
        .keep_alive(true)
        .header_read_timeout(None)
        .serve_connection(TokioIo::new(stream), service);
    let mut draining = false;
    let finished_cleanly = loop {
        tokio::select! {
            result = &mut conn => break result.is_ok(),
            changed = mode.changed() => {
                // A dropped SimApp (closed channel) means killed.
                let now = match changed {
                    Ok(()) => *mode.borrow_and_update(),
                    Err(_closed) => Mode::Killed,
                };
                match now {
                    Mode::Running => {}
                    Mode::Draining if !draining => {
                        draining = true;
                        std::pin::Pin::new(&mut conn).graceful_shutdown();
                    }
                    Mode::Draining => {}
                    Mode::Killed => break false,
                }
            }
        }
    };
    if !finished_cleanly {
        reset(conn);
    }
}

/// Closes the connection with a TCP reset rather than a FIN: a refused or killed request
/// must look like a failure to the client, never like an empty keep-alive close.
fn reset<S>(conn: http1::Connection<TokioIo<TcpStream>, S>)
where
    S: hyper::service::HttpService<Incoming, ResBody = Full<Bytes>>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = conn.into_parts().io.into_inner();
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Empty};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::time::Instant;

    // ─────────── fixtures ───────────

    fn loopback() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    fn fixed(ms: f64) -> ServiceTime {
        ServiceTime::Fixed { ms }
    }

    /// `workers` and `backlog`, every service instantaneous, no rules: pages are `page`.
    fn instant_app(workers: usize, backlog: usize) -> AppConfig {
        AppConfig {
            workers,
            backlog,
            classes: vec![],
            default_service: fixed(0.0),
            health_service: fixed(0.0),
            auth_service: fixed(0.0),
            ..AppConfig::default()
        }
    }

    #[derive(Debug)]
    struct Reply {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    }

    impl Reply {
        fn header(&self, name: &str) -> Option<&str> {
            self.all(name).into_iter().next()
        }
        fn all(&self, name: &str) -> Vec<&str> {
            (self.headers.iter())
                .filter(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
                .collect()
        }
    }

    /// Sends one request on `stream` with `Connection: close` and reads to the end.
    /// `None`: the connection closed or was reset without a single response byte.
    async fn exchange(
        mut stream: TcpStream,
        method: &str,
        target: &str,
        extra: &[(&str, &str)],
    ) -> Option<Reply> {
        let mut head = format!("{method} {target} HTTP/1.1\r\nhost: app\r\nconnection: close\r\n");
        for (name, value) in extra {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        if method == "POST" {
            head.push_str("content-length: 0\r\n");
        }
        head.push_str("\r\n");
        if stream.write_all(head.as_bytes()).await.is_err() {
            return None;
        }
        let mut raw = Vec::new();
        // A reset after some bytes still leaves them in `raw`.
        let _ = stream.read_to_end(&mut raw).await;
        if raw.is_empty() {
            return None;
        }
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").expect("response head ends");
        let mut lines = head.lines();
        let status_line = lines.next().expect("status line");
        let status = status_line
            .split(' ')
            .nth(1)
            .expect("status code")
            .parse()
            .expect("numeric status");
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
            .collect();
        Some(Reply {
            status,
            headers,
            body: body.to_string(),
        })
    }

    async fn send(
        addr: SocketAddr,
        method: &str,
        target: &str,
        extra: &[(&str, &str)],
    ) -> Option<Reply> {
        let stream = TcpStream::connect(addr).await.expect("connect to sim app");
        exchange(stream, method, target, extra).await
    }

    async fn get(addr: SocketAddr, target: &str) -> Option<Reply> {
        send(addr, "GET", target, &[]).await
    }

    /// Polls the app's counters until `cond` holds; panics with the last snapshot after 20 s.
    async fn eventually(
        stats: &AppStats,
        what: &str,
        cond: impl Fn(&AppSnapshot) -> bool,
    ) -> AppSnapshot {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let snap = stats.snapshot();
            if cond(&snap) {
                return snap;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {snap:#?}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    // ─────────── configuration ───────────

    #[test]
    fn empty_toml_is_the_default_app() {
        let cfg: AppConfig = toml::from_str("").expect("empty table");
        assert_eq!(cfg, AppConfig::default());
        assert_eq!((cfg.workers, cfg.backlog), (10, 64));
        assert!(cfg.validate().is_ok());
    }

    #[test]
    fn toml_example_parses() {
        let cfg: AppConfig = toml::from_str(
            r#"
            workers = 16
            backlog = 64
            start_workers = 2
            time_scale = 0.1
            health_timeout_ms = 5000
            default_service = { dist = "log_normal", median_ms = 60, sigma = 0.4 }
            [[classes]]
            class = "expensive"
            query_key = "diff"
            service = { dist = "uniform", min_ms = 200, max_ms = 900 }
            [[classes]]
            class = "static"
            path_prefix = "/static/"
            service = { dist = "fixed", ms = 0.5 }
            "#,
        )
        .expect("example parses");
        assert_eq!(cfg.workers, 16);
        assert_eq!(cfg.start_workers, Some(2));
        assert_eq!(cfg.health_timeout_ms, Some(5000));
        assert_eq!(
            cfg.default_service,
            ServiceTime::LogNormal {
                median_ms: 60.0,
                sigma: 0.4
            }
        );
        assert_eq!(
            cfg.classes[0].service,
            ServiceTime::Uniform {
                min_ms: 200.0,
                max_ms: 900.0
            }
        );
        assert_eq!(cfg.classes[1].path_prefix.as_deref(), Some("/static/"));
        assert_eq!(cfg.classes[1].service, fixed(0.5));
        assert_eq!(cfg.health_path, "/healthz");
        assert!(cfg.validate().is_ok());
    }

    #[test]
    fn toml_unknown_keys_are_named() {
        let cases = [
            ("worker = 3", "worker"),
            ("default_service = { dist = \"fixed\", msec = 3 }", "msec"),
            ("default_service = { dist = \"gamma\", ms = 3 }", "gamma"),
            (
                "[[classes]]\nclass = \"x\"\nquery = \"a\"\nservice = { dist = \"fixed\", ms = 1 }",
                "query",
            ),
        ];
        for (text, named) in cases {
            let err = toml::from_str::<AppConfig>(text)
                .expect_err(text)
                .to_string();
            assert!(err.contains(named), "{text:?}: {err}");
        }
    }

    #[test]
    fn validation_reports_each_problem() {
        type Edit = fn(&mut AppConfig);
        let rule = |class: &str, prefix: Option<&str>, query: Option<&str>, service| ClassRule {
            class: class.to_string(),
            path_prefix: prefix.map(str::to_string),
            query_key: query.map(str::to_string),
            service,
        };
        let cases: Vec<(Edit, &str)> = vec![
            (|c| c.workers = 0, "workers = 0"),
            (
                |c| c.start_workers = Some(11),
                "start_workers = 11 is more than workers = 10",
            ),
            (
                |c| {
                    c.start_workers = Some(2);
                    c.warmup_step_ms = 0
                },
                "warmup_step_ms = 0",
            ),
            (|c| c.time_scale = -1.0, "time_scale = -1"),
            (|c| c.time_scale = f64::NAN, "time_scale = NaN"),
            (
                |c| c.default_service = fixed(-3.0),
                "default_service: ms = -3",
            ),
            (
                |c| {
                    c.health_service = ServiceTime::Uniform {
                        min_ms: 5.0,
                        max_ms: 1.0,
                    }
                },
                "health_service: min_ms = 5 is more than max_ms = 1",
            ),
            (
                |c| {
                    c.auth_service = ServiceTime::LogNormal {
                        median_ms: 0.0,
                        sigma: 0.1,
                    }
                },
                "auth_service: median_ms = 0",
            ),
            (
                |c| {
                    c.default_service = ServiceTime::LogNormal {
                        median_ms: 5.0,
                        sigma: 9.0,
                    }
                },
                "sigma = 9",
            ),
            (
                |c| c.default_class = String::new(),
                "default_class is empty",
            ),
            (
                |c| c.default_class = "health".into(),
                "default_class = \"health\" is reserved",
            ),
            (
                |c| c.health_path = "healthz".into(),
                "health_path = \"healthz\" must start with '/'",
            ),
            (
                |c| c.whoami_path = "/login".into(),
                "login_path and whoami_path are both \"/login\"",
            ),
            (|c| c.body_bytes = 10 << 20, "body_bytes = 10485760"),
        ];
        for (edit, expected) in cases {
            let mut cfg = AppConfig::default();
            edit(&mut cfg);
            let err = cfg.validate().expect_err(expected).to_string();
            assert!(err.contains(expected), "expected {expected:?} in {err:?}");
        }
        // Rules: several problems in one config are all reported.
        let cfg = AppConfig {
            classes: vec![
                rule("everything", None, None, fixed(1.0)),
                rule("login", Some("/x"), None, fixed(1.0)),
                rule("slow", Some("/y"), None, fixed(f64::INFINITY)),
            ],
            ..AppConfig::default()
        };
        let problems = cfg.validate().expect_err("three bad rules").problems;
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(
            matches!(problems[0], AppConfigError::ServiceTime { ref key, .. } if key == "classes[2].service")
        );
        assert!(
            matches!(problems[1], AppConfigError::ReservedClass { ref key, .. } if key == "classes[1].class")
        );
        assert!(matches!(
            problems[2],
            AppConfigError::RuleMatchesAll { index: 0, .. }
        ));
    }

    #[test]
    fn start_refuses_bad_config_and_missing_runtime() {
        let err = SimApp::start(
            AppConfig {
                workers: 0,
                ..AppConfig::default()
            },
            loopback(),
        )
        .expect_err("no runtime");
        // Outside a runtime that is reported first; both are InvalidInput, never a panic.
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let _entered = rt.enter();
        let err = SimApp::start(
            AppConfig {
                workers: 0,
                ..AppConfig::default()
            },
            loopback(),
        )
        .expect_err("bad config");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("workers = 0"), "{err}");
    }

    // ─────────── routing and small parsers ───────────

    #[test]
    fn requests_route_to_classes() {
        let cfg = AppConfig {
            classes: vec![
                ClassRule {
                    class: "static".into(),
                    path_prefix: Some("/static/".into()),
                    query_key: None,
                    service: fixed(1.0),
                },
                ClassRule {
                    class: "history".into(),
                    path_prefix: Some("/w/index.php".into()),
                    query_key: Some("action".into()),
                    service: fixed(2.0),
                },
                ClassRule {
                    class: "expensive".into(),
                    path_prefix: None,
                    query_key: Some("diff".into()),
                    service: fixed(3.0),
                },
            ],
            ..AppConfig::default()
        };
        let plan = Plan::build(&cfg).expect("valid");
        let cases: [(Method, &str, Option<&str>, &str); 13] = [
            (Method::GET, "/wiki/Main_Page", None, "page"),
            (Method::GET, "/static/logo.png", None, "static"),
            (Method::GET, "/staticfoo", None, "page"),
            (
                Method::GET,
                "/w/index.php",
                Some("title=X&action=history"),
                "history",
            ),
            (
                Method::GET,
                "/w/index.php",
                Some("title=X&actions=1"),
                "page",
            ),
            (
                Method::GET,
                "/w/index.php",
                Some("title=X&diff=12&oldid=3"),
                "expensive",
            ),
            (Method::GET, "/wiki/X", Some("diff"), "expensive"),
            (Method::GET, "/static/x", Some("diff=1"), "static"),
            (Method::GET, "/healthz", None, "health"),
            (Method::GET, "/login", None, "login"),
            (Method::POST, "/login", None, "login"),
            (Method::GET, "/whoami", Some("diff=1"), "whoami"),
            (Method::GET, "/healthz/deep", None, "page"),
        ];
        for (method, path, query, class) in cases {
            let endpoint = plan.route(&method, path, query);
            assert_eq!(
                plan.class_names[plan.class_of(endpoint)],
                class,
                "{method} {path} {query:?}"
            );
        }
        assert_eq!(
            plan.route(&Method::POST, "/login", None),
            Endpoint::LoginSubmit
        );
        assert_eq!(
            plan.route(&Method::HEAD, "/login", None),
            Endpoint::LoginPage
        );
        assert_eq!(
            plan.service_of(plan.route(&Method::GET, "/w/index.php", Some("action=raw"))),
            fixed(2.0)
        );
    }

    #[test]
    fn query_keys() {
        let cases = [
            (None, "diff", false),
            (Some(""), "diff", false),
            (Some("diff"), "diff", true),
            (Some("diff="), "diff", true),
            (Some("a=1&diff=2"), "diff", true),
            (Some("a=diff"), "diff", false),
            (Some("diffs=1"), "diff", false),
            (Some("x=1&&diff"), "diff", true),
        ];
        for (query, key, expected) in cases {
            assert_eq!(has_query_key(query, key), expected, "{query:?} {key}");
        }
    }

    #[test]
    fn cookies() {
        let cases: [(&[&str], &str, Option<&str>); 7] = [
            (&[], "a", None),
            (&["a=1"], "a", Some("1")),
            (&["a=1; b=2"], "b", Some("2")),
            (&["a=1;b=2"], "b", Some("2")),
            (&["xa=1; a=3"], "a", Some("3")),
            (&["b=1", "a=2"], "a", Some("2")),
            (&["wikisession=abc"], "wikiToken", None),
        ];
        for (values, name, expected) in cases {
            let mut headers = HeaderMap::new();
            for v in values {
                headers.append(COOKIE, HeaderValue::from_str(v).expect("ascii"));
            }
            assert_eq!(cookie(&headers, name), expected, "{values:?} {name}");
        }
    }

    #[test]
    fn bodies_have_the_configured_size_and_name_the_class() {
        for size in [0, 10, 70, 71, 512, 4096] {
            let body = page_body("expensive", size);
            let text = std::str::from_utf8(&body).expect("utf8");
            assert!(text.contains("class=expensive"), "{size}");
            assert!(
                body.len() == size || (body.len() > size && !text.contains("<!--")),
                "{size}: {}",
                body.len()
            );
        }
        assert_eq!(page_body("page", 2048).len(), 2048);
    }

    #[test]
    fn durations_scale_and_never_panic() {
        let cases = [
            (100.0, 1.0, Duration::from_millis(100)),
            (100.0, 0.1, Duration::from_millis(10)),
            (100.0, 0.0, Duration::ZERO),
            (-5.0, 1.0, Duration::ZERO),
            (f64::NAN, 1.0, Duration::ZERO),
            (f64::INFINITY, 1.0, Duration::from_secs(86_400)),
            (1e30, 1.0, Duration::from_secs(86_400)),
        ];
        for (ms, scale, expected) in cases {
            let got = scaled(ms, scale);
            let diff = got.abs_diff(expected);
            assert!(diff < Duration::from_micros(1), "{ms} x {scale}: {got:?}");
        }
    }

    #[test]
    fn service_times_follow_their_distribution() {
        let mut rng = rand::rng();
        assert_eq!(fixed(7.5).sample_ms(&mut rng), 7.5);
        let uniform = ServiceTime::Uniform {
            min_ms: 10.0,
            max_ms: 20.0,
        };
        let draws: Vec<f64> = (0..2000).map(|_| uniform.sample_ms(&mut rng)).collect();
        assert!(draws.iter().all(|d| (10.0..=20.0).contains(d)));
        assert!(draws.iter().any(|d| *d < 12.0) && draws.iter().any(|d| *d > 18.0));
        let flat = ServiceTime::LogNormal {
            median_ms: 50.0,
            sigma: 0.0,
        };
        assert!((flat.sample_ms(&mut rng) - 50.0).abs() < 1e-9);
        // The sample median of 2001 draws is within a few percent of 50; 15% is ~10 sd.
        let log_normal = ServiceTime::LogNormal {
            median_ms: 50.0,
            sigma: 0.5,
        };
        let mut draws: Vec<f64> = (0..2001).map(|_| log_normal.sample_ms(&mut rng)).collect();
        draws.sort_by(f64::total_cmp);
        let median = draws[1000];
        assert!((42.5..57.5).contains(&median), "median {median}");
        assert!(draws.iter().all(|d| d.is_finite() && *d > 0.0));
        assert!(draws[1990] > 2.0 * median, "right tail: {}", draws[1990]);
    }

    // ─────────── worker pool (no network) ───────────

    fn pool(start: usize, max: usize, backlog: usize) -> (Arc<WorkerPool>, Arc<AppStats>) {
        let stats = Arc::new(AppStats::new(vec![], start));
        (
            Arc::new(WorkerPool::new(start, max, backlog, stats.clone())),
            stats,
        )
    }

    fn worker(a: Admission) -> Worker {
        match a {
            Admission::Now(w) => w,
            other => panic!("expected a worker, got {other:?}"),
        }
    }

    fn ticket(a: Admission) -> QueuedTicket {
        match a {
            Admission::Queued(t) => t,
            other => panic!("expected a backlog place, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn pool_admits_queues_then_refuses_and_hands_over_in_order() {
        let (pool, stats) = pool(2, 2, 2);
        let first = worker(pool.admit());
        let _second = worker(pool.admit());
        let mut a = ticket(pool.admit());
        let mut b = ticket(pool.admit());
        assert!(matches!(pool.admit(), Admission::Refused));
        let snap = stats.snapshot();
        assert_eq!((snap.in_flight, snap.queued), (2, 2));
        drop(first);
        // The oldest waiter gets the worker, the younger keeps waiting.
        let handed = a.rx.try_recv().expect("oldest waiter served first");
        assert!(handed.armed);
        a.got_worker = true;
        assert!(b.rx.try_recv().is_err());
        let snap = stats.snapshot();
        assert_eq!(
            (
                snap.in_flight,
                snap.queued,
                snap.max_in_flight,
                snap.max_queued
            ),
            (2, 1, 2, 2)
        );
        drop(handed);
        // Its worker went on to `b`: still two busy, nobody waiting.
        let handed = b.rx.try_recv().expect("next waiter served");
        b.got_worker = true;
        assert_eq!(
            (stats.snapshot().in_flight, stats.snapshot().queued),
            (2, 0)
        );
        drop((a, b, handed));
        assert_eq!(stats.snapshot().in_flight, 1);
    }

    #[tokio::test]
    async fn pool_waiter_that_leaves_frees_its_backlog_place() {
        let (pool, stats) = pool(1, 1, 1);
        let busy = worker(pool.admit());
        let gone = ticket(pool.admit());
        assert!(matches!(pool.admit(), Admission::Refused));
        drop(gone);
        assert_eq!(stats.snapshot().queued, 0);
        let stays = ticket(pool.admit());
        drop(busy);
        assert!(stays.wait().await.is_some());
        assert_eq!(
            stats.snapshot().in_flight,
            0,
            "the worker was released after use"
        );
    }

    #[tokio::test]
    async fn pool_warm_up_serves_the_backlog_first() {
        let (pool, stats) = pool(0, 2, 5);
        let a = ticket(pool.admit());
        let b = ticket(pool.admit());
        assert_eq!(stats.snapshot().workers, 0);
        assert!(pool.add_worker(), "can still grow to 2");
        let wa = a
            .wait()
            .await
            .expect("first waiter served by the new worker");
        assert_eq!(stats.snapshot().queued, 1);
        assert!(!pool.add_worker(), "full grown");
        let wb = b.wait().await.expect("second waiter served");
        assert!(!pool.add_worker(), "never beyond max");
        let snap = stats.snapshot();
        assert_eq!((snap.workers, snap.in_flight, snap.queued), (2, 2, 0));
        drop((wa, wb));
        assert_eq!(stats.snapshot().in_flight, 0);
    }

    // ─────────── over real sockets ───────────

    #[tokio::test]
    async fn refusal_happens_exactly_past_workers_plus_backlog() {
        let app = SimApp::start(instant_app(2, 3), loopback()).expect("start");
        let (addr, stats) = (app.addr(), app.stats());
        app.stall();
        let inside: Vec<_> = (0..5)
            .map(|_| tokio::spawn(get(addr, "/wiki/Held")))
            .collect();
        let snap = eventually(&stats, "2 working, 3 waiting", |s| {
            s.in_flight == 2 && s.queued == 3 && s.stalled == 2
        })
        .await;
        assert_eq!((snap.received, snap.refused), (5, 0));

        assert!(
            get(addr, "/sixth").await.is_none(),
            "6th request must get no response"
        );
        assert_eq!(stats.snapshot().refused, 1);

        // One completes: its worker goes to the oldest waiter and one backlog place frees.
        app.release_stalled(1);
        eventually(&stats, "one served", |s| {
            s.served == 1 && s.in_flight == 2 && s.queued == 2 && s.stalled == 2
        })
        .await;
        let seventh = tokio::spawn(get(addr, "/seventh"));
        let snap = eventually(&stats, "7th queued", |s| s.received == 7 && s.queued == 3).await;
        assert_eq!(snap.refused, 1, "7th accepted");
        assert!(get(addr, "/eighth").await.is_none(), "full again");
        assert_eq!(stats.snapshot().refused, 2);

        app.unstall();
        for handle in inside.into_iter().chain([seventh]) {
            let reply = handle
                .await
                .expect("task")
                .expect("accepted request answered");
            assert_eq!(reply.status, 200);
        }
        let snap = stats.snapshot();
        assert_eq!(
            (snap.received, snap.served, snap.refused, snap.abandoned),
            (8, 6, 2, 0)
        );
        assert_eq!((snap.max_in_flight, snap.max_queued), (2, 3));
        assert_eq!(snap.class("page"), 6);
    }

    async fn burst(addr: SocketAddr, n: usize) -> Vec<tokio::task::JoinHandle<Option<Reply>>> {
        (0..n)
            .map(|_| tokio::spawn(get(addr, "/wiki/Burst")))
            .collect()
    }

    async fn tally(handles: Vec<tokio::task::JoinHandle<Option<Reply>>>) -> (u64, u64) {
        let (mut ok, mut refused) = (0, 0);
        for handle in handles {
            match handle.await.expect("task") {
                Some(reply) => {
                    assert_eq!(reply.status, 200);
                    ok += 1;
                }
                None => refused += 1,
            }
        }
        (ok, refused)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn burst_of_200_fills_10_workers_and_64_places_and_refuses_the_rest_exactly() {
        let app = SimApp::start(instant_app(10, 64), loopback()).expect("start");
        let stats = app.stats();
        app.stall();
        let handles = burst(app.addr(), 200).await;
        let snap = eventually(&stats, "all 200 arrived and settled", |s| {
            s.received == 200 && s.in_flight + s.queued + s.refused as usize == 200
        })
        .await;
        assert_eq!((snap.in_flight, snap.queued, snap.refused), (10, 64, 126));
        app.unstall();
        let (ok, refused) = tally(handles).await;
        assert_eq!((ok, refused), (74, 126), "client side");
        let snap = stats.snapshot();
        assert_eq!((snap.served, snap.refused), (74, 126), "server side");
        assert_eq!(snap.served + snap.refused, 200);
        assert_eq!((snap.max_in_flight, snap.max_queued), (10, 64));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn burst_of_200_with_real_service_times_never_exceeds_10_workers() {
        let cfg = AppConfig {
            default_service: fixed(20.0),
            ..instant_app(10, 64)
        };
        let app = SimApp::start(cfg, loopback()).expect("start");
        let stats = app.stats();
        let (ok, refused) = tally(burst(app.addr(), 200).await).await;
        let snap = stats.snapshot();
        assert_eq!(ok + refused, 200);
        assert_eq!(
            (snap.served, snap.refused),
            (ok, refused),
            "both sides count the same"
        );
        assert!(
            snap.max_in_flight <= 10 && snap.max_queued <= 64,
            "{snap:#?}"
        );
        assert_eq!((snap.in_flight, snap.queued, snap.abandoned), (0, 0, 0));
    }

    #[tokio::test]
    async fn health_check_waits_behind_traffic_for_a_worker() {
        let app = SimApp::start(instant_app(1, 8), loopback()).expect("start");
        let (addr, stats) = (app.addr(), app.stats());
        app.stall();
        let page = tokio::spawn(get(addr, "/wiki/Slow"));
        eventually(&stats, "page holds the only worker", |s| s.stalled == 1).await;
        let health = tokio::spawn(get(addr, "/healthz"));
        let snap = eventually(&stats, "health check queued", |s| s.queued == 1).await;
        assert_eq!(snap.health_ok, 0);
        assert!(!health.is_finished());
        app.unstall();
        let reply = health.await.expect("task").expect("answered");
        assert_eq!((reply.status, reply.body.as_str()), (200, "ok\n"));
        assert_eq!(page.await.expect("task").expect("answered").status, 200);
        let snap = stats.snapshot();
        assert_eq!(
            (snap.health_ok, snap.health_timed_out, snap.class("health")),
            (1, 0, 1)
        );
    }

    #[tokio::test]
    async fn health_check_times_out_in_the_backlog() {
        let cfg = AppConfig {
            health_timeout_ms: Some(50),
            ..instant_app(1, 8)
        };
        let app = SimApp::start(cfg, loopback()).expect("start");
        let (addr, stats) = (app.addr(), app.stats());
        app.stall();
        let page = tokio::spawn(get(addr, "/wiki/Slow"));
        eventually(&stats, "page holds the only worker", |s| s.stalled == 1).await;
        let reply = get(addr, "/healthz").await.expect("answered");
        assert_eq!(reply.status, 503);
        let snap = stats.snapshot();
        assert_eq!(
            (
                snap.health_ok,
                snap.health_timed_out,
                snap.queued,
                snap.in_flight
            ),
            (0, 1, 0, 1)
        );
        app.unstall();
        assert_eq!(page.await.expect("task").expect("answered").status, 200);
        // With a free worker the same check passes.
        assert_eq!(get(addr, "/healthz").await.expect("answered").status, 200);
    }

    #[tokio::test]
    async fn login_page_cookie_is_not_a_login() {
        let app = SimApp::start(instant_app(2, 4), loopback()).expect("start");
        let addr = app.addr();

        let page = get(addr, "/login").await.expect("login page");
        assert_eq!(page.status, 200);
        let session = page
            .header("set-cookie")
            .expect("session cookie")
            .to_string();
        let value = session
            .strip_prefix("wikisession=")
            .and_then(|v| v.split(';').next())
            .expect("wikisession=...");
        assert_eq!(value.len(), 32);
        assert!(session.contains("Path=/"));
        let crawler_cookie = format!("wikisession={value}");
        let whoami = send(addr, "GET", "/whoami", &[("cookie", &crawler_cookie)])
            .await
            .expect("whoami");
        assert_eq!(whoami.status, 401);

        let login = send(addr, "POST", "/login", &[]).await.expect("login");
        assert_eq!(login.status, 200);
        let set = login.all("set-cookie");
        assert_eq!(set.len(), 2, "{set:?}");
        assert!(set[0].starts_with("wikiUserID=1;"), "{set:?}");
        let token = set[1]
            .strip_prefix("wikiToken=")
            .and_then(|v| v.split(';').next())
            .expect("wikiToken=...");

        let cases = [
            (format!("wikiUserID=1; wikiToken={token}"), 200),
            (
                format!("{crawler_cookie}; wikiToken={token}; wikiUserID=1"),
                200,
            ),
            (format!("wikiUserID=2; wikiToken={token}"), 401),
            (
                "wikiUserID=1; wikiToken=00000000000000000000000000000000".to_string(),
                401,
            ),
            (format!("wikiToken={token}"), 401),
            ("wikiUserID=1".to_string(), 401),
        ];
        for (cookies, status) in &cases {
            let reply = send(addr, "GET", "/whoami", &[("cookie", cookies)])
                .await
                .expect("whoami");
            assert_eq!(reply.status, *status, "{cookies}");
            if *status == 200 {
                assert_eq!(
                    (reply.body.as_str(), reply.header("x-app-user")),
                    ("1\n", Some("1"))
                );
            }
        }
        let page = send(addr, "GET", "/wiki/X", &[("cookie", &cases[0].0)])
            .await
            .expect("page");
        assert_eq!(page.header("x-app-user"), Some("1"));

        let second = send(addr, "POST", "/login", &[])
            .await
            .expect("second login");
        assert!(second.all("set-cookie")[0].starts_with("wikiUserID=2;"));
        assert_eq!(app.snapshot().class("login"), 3);
    }

    #[tokio::test]
    async fn warm_up_grows_workers_monotonically_to_the_maximum() {
        let cfg = AppConfig {
            start_workers: Some(2),
            warmup_step_ms: 1000,
            time_scale: 0.02,
            ..instant_app(6, 4)
        };
        let app = SimApp::start(cfg, loopback()).expect("start");
        let stats = app.stats();
        let mut seen = vec![stats.snapshot().workers];
        let deadline = Instant::now() + Duration::from_secs(20);
        while seen.last() != Some(&6) {
            assert!(Instant::now() < deadline, "warm-up stuck: {seen:?}");
            tokio::time::sleep(Duration::from_millis(3)).await;
            seen.push(stats.snapshot().workers);
        }
        assert_eq!(seen[0], 2, "starts with start_workers");
        assert!(seen.windows(2).all(|w| w[0] <= w[1]), "monotone: {seen:?}");
        // Requests are served by grown workers: 6 stalled at once fit without queueing.
        app.stall();
        let held: Vec<_> = (0..6)
            .map(|_| tokio::spawn(get(app.addr(), "/wiki/X")))
            .collect();
        let snap = eventually(&stats, "6 working", |s| s.in_flight == 6).await;
        assert_eq!(snap.workers, 6);
        app.unstall();
        for h in held {
            assert_eq!(h.await.expect("task").expect("answered").status, 200);
        }
    }

    #[tokio::test]
    async fn responses_echo_what_reached_the_app_over_keep_alive() {
        let cfg = AppConfig {
            classes: vec![ClassRule {
                class: "expensive".into(),
                path_prefix: None,
                query_key: Some("diff".into()),
                service: fixed(0.0),
            }],
            body_bytes: 700,
            ..instant_app(2, 2)
        };
        let app = SimApp::start(cfg, loopback()).expect("start");
        let stream = TcpStream::connect(app.addr()).await.expect("connect");
        let local = stream.local_addr().expect("local addr");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        let driver = tokio::spawn(conn);
        let cases = [
            ("/wiki/Main_Page", Some("203.0.113.7, 10.0.0.1"), "page"),
            (
                "/w/index.php?title=X&diff=5",
                Some("198.51.100.1"),
                "expensive",
            ),
            ("/wiki/Other", None, "page"),
        ];
        for (target, xff, class) in cases {
            let mut req = Request::get(target).header("host", "app");
            if let Some(xff) = xff {
                req = req.header("x-forwarded-for", xff);
            }
            let resp = sender
                .send_request(req.body(Empty::<Bytes>::new()).expect("request"))
                .await
                .expect("response");
            assert_eq!(resp.status(), 200);
            let header = |name: &str| {
                resp.headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            };
            assert_eq!(header("content-type").as_deref(), Some("text/html"));
            assert_eq!(
                header("x-app-peer"),
                Some(local.to_string()),
                "same connection, same peer"
            );
            assert_eq!(header("x-app-saw-xff").as_deref(), xff);
            assert_eq!(header("x-app-class").as_deref(), Some(class));
            let body = resp.into_body().collect().await.expect("body").to_bytes();
            assert_eq!(body.len(), 700);
            assert!(
                std::str::from_utf8(&body)
                    .expect("utf8")
                    .contains(&format!("class={class}"))
            );
        }
        let snap = app.snapshot();
        assert_eq!(
            (
                snap.connections_accepted,
                snap.connections_open,
                snap.served
            ),
            (1, 1, 3)
        );
        drop(sender);
        driver.await.expect("task").expect("clean close");
        eventually(&app.stats(), "connection closed", |s| {
            s.connections_open == 0
        })
        .await;
    }

    #[tokio::test]
    async fn kill_resets_in_flight_requests_and_stops_listening() {
        let app = SimApp::start(instant_app(1, 4), loopback()).expect("start");
        let (addr, stats) = (app.addr(), app.stats());
        app.stall();
        let working = tokio::spawn(get(addr, "/wiki/A"));
        let waiting = tokio::spawn(get(addr, "/wiki/B"));
        eventually(&stats, "one working, one waiting", |s| {
            s.in_flight == 1 && s.queued == 1
        })
        .await;
        app.kill().await;
        assert!(
            working.await.expect("task").is_none(),
            "in-flight request cut without response"
        );
        assert!(
            waiting.await.expect("task").is_none(),
            "queued request cut without response"
        );
        let refused = TcpStream::connect(addr)
            .await
            .expect_err("nothing listens after kill");
        assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
        let snap = stats.snapshot();
        assert_eq!(
            (
                snap.abandoned,
                snap.served,
                snap.in_flight,
                snap.queued,
                snap.connections_open
            ),
            (2, 0, 0, 0, 0)
        );
        // The port can be taken again at once, as a restarted container does.
        let again = SimApp::start(instant_app(1, 4), addr).expect("restart on the same port");
        assert_eq!(
            get(again.addr(), "/wiki/A").await.expect("answered").status,
            200
        );
    }

    #[tokio::test]
    async fn shutdown_finishes_in_flight_and_queued_requests() {
        let cfg = AppConfig {
            default_service: fixed(100.0),
            ..instant_app(1, 4)
        };
        let app = SimApp::start(cfg, loopback()).expect("start");
        let (addr, stats) = (app.addr(), app.stats());
        let idle = TcpStream::connect(addr)
            .await
            .expect("idle keep-alive connection");
        let working = tokio::spawn(get(addr, "/wiki/A"));
        let waiting = tokio::spawn(get(addr, "/wiki/B"));
        eventually(&stats, "one working, one waiting", |s| {
            s.in_flight == 1 && s.queued == 1 && s.connections_open == 3
        })
        .await;
        app.shutdown().await;
        assert_eq!(working.await.expect("task").expect("finished").status, 200);
        assert_eq!(waiting.await.expect("task").expect("finished").status, 200);
        let snap = stats.snapshot();
        assert_eq!(
            (snap.served, snap.abandoned, snap.connections_open),
            (2, 0, 0),
            "idle connection closed too"
        );
        drop(idle);
        let refused = TcpStream::connect(addr)
            .await
            .expect_err("nothing listens after shutdown");
        assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn holds_thousands_of_keep_alive_connections() {
        const CONNECTIONS: usize = 3000;
        let cfg = AppConfig {
            default_service: fixed(1.0),
            ..instant_app(64, CONNECTIONS)
        };
        let app = SimApp::start(cfg, loopback()).expect("start");
        let (addr, stats) = (app.addr(), app.stats());
        let run = async {
            let mut streams = Vec::with_capacity(CONNECTIONS);
            for _ in 0..CONNECTIONS {
                streams.push(TcpStream::connect(addr).await.expect("connect"));
            }
            eventually(&stats, "all connections open", |s| {
                s.connections_open == CONNECTIONS
            })
            .await;
            let handles: Vec<_> = streams
                .into_iter()
                .map(|s| tokio::spawn(exchange(s, "GET", "/wiki/X", &[])))
                .collect();
            let mut ok = 0;
            for h in handles {
                ok += usize::from(h.await.expect("task").is_some_and(|r| r.status == 200));
            }
            ok
        };
        let ok = tokio::time::timeout(Duration::from_secs(120), run)
            .await
            .expect("bounded in time");
        assert_eq!(ok, CONNECTIONS);
        let snap = stats.snapshot();
        assert_eq!((snap.served, snap.refused), (CONNECTIONS as u64, 0));
        assert!(snap.max_in_flight <= 64);
    }
}
