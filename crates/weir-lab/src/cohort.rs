//! The load generator: one task per client connection, each bound to its own source
//! address in 127.0.0.0/8, speaking HTTP/1.1 over keep-alive connections, and counting
//! what came back.
//!
//! A client sends at Poisson arrival times (`rate`, times the current phase's factor) but
//! waits for its previous answer first, as a person or a crawler with a concurrency limit
//! does; when answers are slow it falls behind instead of bursting to catch up. The time
//! between an intended send and the actual one, when the client was idle and only waiting
//! for its timer, is the generator's own *scheduling lag*: if it grows, the machine (not
//! weir) was the bottleneck, and the report says so.
//!
//! Outcomes are classified from what the client saw: a response (by status, or by the
//! `x-weir-challenge` header for challenges), a connection refused or reset before any
//! response, or no answer within the cohort's timeout. Whether a response came from the
//! app is read from the app's `x-app-class` header.
//!
//! This module does not parse HTML, run JavaScript, follow redirects or retry: each request
//! is counted once, as sent.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, SET_COOKIE};
use http::{Method, Request};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use tokio::net::TcpSocket;
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

use super::app::SESSION_COOKIE;
use super::scenario::{Cohort, CohortKind};

/// What became of one request, as its client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx or 3xx.
    Served,
    /// 429.
    Rejected429,
    /// 503.
    Unavailable503,
    /// Any other 5xx (502 when the app reset the connection, 504).
    Error5xx,
    /// Connection refused, reset or closed before a response.
    ConnError,
    /// No complete answer within the cohort's timeout.
    Timeout,
    /// A response carrying `x-weir-challenge`.
    Challenged,
    /// Any other status (401, 403, 404, ...).
    Other,
    /// Still waiting when the run ended (after its grace period).
    Unfinished,
}

/// Every outcome, in report order; `Outcome as usize` indexes it.
pub const OUTCOMES: [Outcome; 9] = [
    Outcome::Served,
    Outcome::Rejected429,
    Outcome::Unavailable503,
    Outcome::Error5xx,
    Outcome::ConnError,
    Outcome::Timeout,
    Outcome::Challenged,
    Outcome::Other,
    Outcome::Unfinished,
];

impl Outcome {
    /// The name used in reports and checks.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Served => "served",
            Outcome::Rejected429 => "rejected_429",
            Outcome::Unavailable503 => "unavailable_503",
            Outcome::Error5xx => "error_5xx",
            Outcome::ConnError => "conn_error",
            Outcome::Timeout => "timeout",
            Outcome::Challenged => "challenged",
            Outcome::Other => "other",
            Outcome::Unfinished => "unfinished",
        }
    }

    /// Classifies a response.
    pub fn of_response(status: u16, challenged: bool) -> Outcome {
        match status {
            _ if challenged => Outcome::Challenged,
            200..=399 => Outcome::Served,
            429 => Outcome::Rejected429,
            503 => Outcome::Unavailable503,
            500..=599 => Outcome::Error5xx,
            _ => Outcome::Other,
        }
    }

    /// Whether the request failed for its sender (not a deliberate 429 or challenge).
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            Outcome::Unavailable503 | Outcome::Error5xx | Outcome::ConnError | Outcome::Timeout
        )
    }
}

/// What the gateway answers instead of the app when it turns a request away: a
/// refusal, a shed, or a challenge page the client did not get past.
const TURNED_AWAY: [Outcome; 3] = [
    Outcome::Rejected429,
    Outcome::Unavailable503,
    Outcome::Challenged,
];

/// Sends later than this after their intended time count as late.
pub const LATE: Duration = Duration::from_millis(10);

/// A served request answered within this (from its first send, a challenge
/// solved on the way included) counts in `served_2s`: issue 19's "a person's
/// page within 2 s".
pub const SERVED_FAST: Duration = Duration::from_secs(2);

/// The run's clock: where the run starts, how long it lasts, and its 1 s buckets.
#[derive(Debug, Clone, Copy)]
pub struct RunClock {
    pub start: Instant,
    pub duration: Duration,
    pub buckets: usize,
}

impl RunClock {
    /// A clock starting at `start`; buckets cover the run plus `grace`.
    pub fn new(start: Instant, duration: Duration, grace: Duration) -> RunClock {
        let buckets = (duration + grace).as_secs() as usize + 2;
        RunClock {
            start,
            duration,
            buckets,
        }
    }

    /// The instant at fraction `f` of the run.
    pub fn at(&self, f: f64) -> Instant {
        self.start + self.duration.mul_f64(f.clamp(0.0, 1.0))
    }

    /// Fraction of the run at `t`.
    pub fn fraction(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.start).as_secs_f64()
            / self.duration.as_secs_f64().max(1e-9)
    }

    /// The 1 s bucket of `t`, clamped to the last one.
    pub fn bucket(&self, t: Instant) -> usize {
        (t.saturating_duration_since(self.start).as_secs() as usize).min(self.buckets - 1)
    }
}

/// Live counters of one cohort, shared by its clients.
#[derive(Debug)]
pub struct CohortStats {
    pub name: String,
    pub kind: CohortKind,
    counts: [AtomicU64; OUTCOMES.len()],
    reached_app: AtomicU64,
    /// Served within [`SERVED_FAST`] of the first send.
    served_fast: AtomicU64,
    /// When a client was first turned away (429, 503, an unsolved challenge):
    /// microseconds since the run's start; `u64::MAX` while none was.
    first_turned_away_us: AtomicU64,
    in_flight: AtomicU64,
    /// Per 1 s bucket (by send time), per outcome.
    timeline: Vec<[AtomicU32; OUTCOMES.len()]>,
    latencies_us: Mutex<Vec<u32>>,
    lags_us: Mutex<Vec<u32>>,
    /// Requests served after the client solved a challenge.
    challenges_solved: AtomicU64,
    /// Challenges met by clients that had solved one in their visit.
    rechallenged: AtomicU64,
    /// Latency of those requests, challenge and retry included, microseconds.
    solved_latencies_us: Mutex<Vec<u32>>,
    /// The request ids of answers that were not pages (refusals, sheds,
    /// challenges): whose request an access log line is, where an address
    /// is shared by two cohorts.
    pub refused_ids: Mutex<Vec<String>>,
}

/// A plain copy of a cohort's counters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CohortTotals {
    pub counts: [u64; OUTCOMES.len()],
    pub reached_app: u64,
    /// Served within [`SERVED_FAST`] of their first send, challenge included.
    pub served_fast: u64,
    /// Latency of served requests, microseconds, sorted.
    pub latencies_us: Vec<u32>,
    /// Scheduling lag of sends, microseconds, sorted.
    pub lags_us: Vec<u32>,
    pub timeline: Vec<[u32; OUTCOMES.len()]>,
    /// Requests answered after the client solved a challenge (counted in
    /// their final outcome, e.g. `served`).
    pub challenges_solved: u64,
    /// Challenges met by clients that had already solved one in their visit.
    pub rechallenged: u64,
    /// Latency of served requests that went through a challenge
    /// (page, proof of work, answer, retry), microseconds, sorted.
    pub solved_latencies_us: Vec<u32>,
}

impl CohortTotals {
    pub fn sent(&self) -> u64 {
        self.counts.iter().sum()
    }
    pub fn count(&self, o: Outcome) -> u64 {
        self.counts[o as usize]
    }
}

impl CohortStats {
    pub fn new(name: &str, kind: CohortKind, buckets: usize) -> CohortStats {
        CohortStats {
            name: name.to_string(),
            kind,
            counts: Default::default(),
            reached_app: AtomicU64::new(0),
            served_fast: AtomicU64::new(0),
            first_turned_away_us: AtomicU64::new(u64::MAX),
            in_flight: AtomicU64::new(0),
            timeline: (0..buckets).map(|_| Default::default()).collect(),
            latencies_us: Mutex::new(Vec::new()),
            lags_us: Mutex::new(Vec::new()),
            challenges_solved: AtomicU64::new(0),
            rechallenged: AtomicU64::new(0),
            solved_latencies_us: Mutex::new(Vec::new()),
            refused_ids: Mutex::new(Vec::new()),
        }
    }

    /// Counts one answer sent in `bucket`, which took `took` from its first send
    /// and came `at` into the run.
    fn record(&self, bucket: usize, answer: &Answer, took: Duration, at: Duration) {
        let outcome = answer.outcome;
        self.counts[outcome as usize].fetch_add(1, Ordering::Relaxed);
        if answer.reached_app {
            self.reached_app.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(b) = self.timeline.get(bucket) {
            b[outcome as usize].fetch_add(1, Ordering::Relaxed);
        }
        if TURNED_AWAY.contains(&outcome) {
            let us = at.as_micros().min(u128::from(u64::MAX - 1)) as u64;
            self.first_turned_away_us.fetch_min(us, Ordering::Relaxed);
        }
        if answer.rechallenged {
            self.rechallenged.fetch_add(1, Ordering::Relaxed);
        }
        if answer.solved_challenge {
            self.challenges_solved.fetch_add(1, Ordering::Relaxed);
        }
        if outcome == Outcome::Served && took <= SERVED_FAST {
            self.served_fast.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(id) = &answer.request_id {
            let mut ids = self.refused_ids.lock().unwrap_or_else(|p| p.into_inner());
            ids.push(id.clone());
        }
    }

    /// Requests counted so far, and how many of them were served.
    pub fn progress(&self) -> (u64, u64) {
        let sent = self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        (
            sent,
            self.counts[Outcome::Served as usize].load(Ordering::Relaxed),
        )
    }

    /// Requests weir answered without the app, so far: 429, 503, or a
    /// challenge page the client did not get past.
    pub fn turned_away(&self) -> u64 {
        TURNED_AWAY
            .iter()
            .map(|o| self.counts[*o as usize].load(Ordering::Relaxed))
            .sum()
    }

    /// When a client of this cohort was first turned away (429, 503, a challenge
    /// not got past), run time since the start.
    pub fn first_turned_away(&self) -> Option<Duration> {
        match self.first_turned_away_us.load(Ordering::Relaxed) {
            u64::MAX => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// Requests sent and not yet answered.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Copies everything; call after every client has finished.
    pub fn totals(&self) -> CohortTotals {
        let mut latencies_us = self
            .latencies_us
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        latencies_us.sort_unstable();
        let mut lags_us = self
            .lags_us
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        lags_us.sort_unstable();
        CohortTotals {
            counts: std::array::from_fn(|i| self.counts[i].load(Ordering::Relaxed)),
            reached_app: self.reached_app.load(Ordering::Relaxed),
            served_fast: self.served_fast.load(Ordering::Relaxed),
            latencies_us,
            lags_us,
            timeline: (self.timeline.iter())
                .map(|b| std::array::from_fn(|i| b[i].load(Ordering::Relaxed)))
                .collect(),
            challenges_solved: self.challenges_solved.load(Ordering::Relaxed),
            rechallenged: self.rechallenged.load(Ordering::Relaxed),
            solved_latencies_us: {
                let mut v = self
                    .solved_latencies_us
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                v.sort_unstable();
                v
            },
        }
    }
}

/// What every client of a run shares.
#[derive(Debug)]
pub struct RunContext {
    /// Where clients connect: weir, or the load balancer in front of it.
    pub target: SocketAddr,
    pub clock: RunClock,
    /// The app's login path (`GET` gives a session cookie, `POST` logs in).
    pub login_path: String,
    /// Turns true when requests still waiting must give up (end of grace).
    pub cancel: watch::Receiver<bool>,
}

/// One client: a source address and a connection slot.
#[derive(Debug, Clone, Copy)]
pub struct ClientPlan {
    pub src: Ipv4Addr,
    /// Fetches the login page first and sends its session cookie (crawlers).
    pub session_cookie: bool,
    pub seed: u64,
    /// Delay of this client's start after the cohort's (ramp-up).
    pub offset: Duration,
    /// A crawler that runs a real (headless) browser and so solves challenges.
    pub headless: bool,
    /// A crawler that runs no JavaScript but follows a challenge page's
    /// no-script refresh after its wait (Scrapy's default middleware does).
    pub follows_refresh: bool,
}

type ClientBody = http_body_util::Either<http_body_util::Full<Bytes>, TrickleBody>;

/// Runs one client until its cohort stops (or the run is cancelled).
pub async fn run_client(
    ctx: Arc<RunContext>,
    cohort: Arc<Cohort>,
    stats: Arc<CohortStats>,
    plan: ClientPlan,
) {
    let mut choices = ClientChoices::new(&cohort, plan.seed);
    let clock = ctx.clock;
    let stop_at = clock.at(cohort.stop);
    let mut session = ClientSession::default();
    let mut samples = ClientSamples::default();
    let mut cancel = ctx.cancel.clone();

    let mut next = clock.at(cohort.start) + plan.offset;
    match next_send(&cohort, &clock, next, &mut choices.rng) {
        Some(t) => next = t,
        None => return,
    }
    loop {
        if next >= stop_at || *cancel.borrow() {
            break;
        }
        if !wait_for_send(next, &mut cancel, &mut samples).await {
            break;
        }
        let sent_at = Instant::now();
        let (method, path) = choices.next_request(&ctx, &cohort, &plan, &session.jar);

        stats.in_flight.fetch_add(1, Ordering::Relaxed);
        let result = session
            .exchange_in_time(&ctx, &cohort, &plan, method, &path, &mut cancel)
            .await;
        stats.in_flight.fetch_sub(1, Ordering::Relaxed);
        session.count_request(&cohort);
        count_answer(&stats, &mut samples, &clock, sent_at, &result);
        if result.outcome == Outcome::Unfinished {
            break;
        }
        if result.outcome.is_failure() && cohort.kind == CohortKind::Flood {
            // A load tool retrying a refused connect at once would only measure itself.
            let pause = tokio::time::sleep(cohort.reconnect_delay);
            if !sleep_unless_cancelled(pause, &mut cancel).await {
                break;
            }
        }
        if choices.then.is_some() {
            // The page the article led to follows at once.
            next = Instant::now();
            continue;
        }
        match next_send(&cohort, &clock, next, &mut choices.rng) {
            // Behind schedule (slow answers): send now rather than burst to catch up.
            Some(t) => next = t.max(Instant::now()),
            None => break,
        }
    }
    samples.merge_into(&stats);
}

/// Waits for the client's next send at `next`, keeping how late it woke
/// (its scheduling lag) when it had to wait. False when the run was
/// cancelled meanwhile.
async fn wait_for_send(
    next: Instant,
    cancel: &mut watch::Receiver<bool>,
    samples: &mut ClientSamples,
) -> bool {
    let now = Instant::now();
    if next > now {
        if !sleep_unless_cancelled(tokio::time::sleep_until(next), cancel).await {
            return false;
        }
        samples.lag(Instant::now().saturating_duration_since(next));
    }
    true
}

/// Sleeps out `sleep` unless the run is cancelled first (or its sender is
/// gone): true when the sleep ended, false when cancelled.
async fn sleep_unless_cancelled(sleep: Sleep, cancel: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = sleep => true,
        _ = cancel.changed() => false,
    }
}

/// Counts an answer to a request sent at `sent_at` in the cohort's stats,
/// and a served one's latency among the client's samples.
fn count_answer(
    stats: &CohortStats,
    samples: &mut ClientSamples,
    clock: &RunClock,
    sent_at: Instant,
    result: &Answer,
) {
    let bucket = clock.bucket(sent_at);
    // From the first send: a challenged page counts its challenge.
    let took = sent_at.elapsed();
    let at = Instant::now().saturating_duration_since(clock.start);
    stats.record(bucket, result, took, at);
    if result.outcome == Outcome::Served {
        samples.served(took, result.solved_challenge);
    }
}

/// What a client sends and in which order: its random draws (seeded, so a
/// run can be repeated), its cohort's weighted mix, and where it is in its
/// visit.
struct ClientChoices {
    rng: SmallRng,
    /// The weights of the cohort's requests, in order, and their sum.
    weights: Vec<f64>,
    total_weight: f64,
    /// Nothing sent yet.
    first: bool,
    /// Requests sent so far.
    sent: u32,
    /// The page a browser-like crawler sends right after its article.
    then: Option<(Method, String)>,
}

impl ClientChoices {
    /// A client's choices before its first request, its draws seeded with `seed`.
    fn new(cohort: &Cohort, seed: u64) -> ClientChoices {
        let weights: Vec<f64> = cohort.requests.iter().map(|r| r.weight).collect();
        let total_weight: f64 = weights.iter().sum();
        ClientChoices {
            rng: SmallRng::seed_from_u64(seed),
            weights,
            total_weight,
            first: true,
            sent: 0,
            then: None,
        }
    }

    /// The request to send now: the page queued after an article, else the
    /// visit's landing page, else a pick (preceded by its article for a
    /// browser-like crawler).
    fn next_request(
        &mut self,
        ctx: &RunContext,
        cohort: &Cohort,
        plan: &ClientPlan,
        jar: &CookieJar,
    ) -> (Method, String) {
        let request = match self.then.take() {
            Some(queued) => queued,
            None => {
                let picked = if self.sent < cohort.landing_pages {
                    // The visit opens at a page (landing_pages).
                    let landing = &cohort.requests[0];
                    (Method::GET, fill_numbers(&landing.path, &mut self.rng))
                } else {
                    pick_request(
                        ctx,
                        cohort,
                        plan,
                        self.first,
                        &self.weights,
                        self.total_weight,
                        &mut self.rng,
                    )
                };
                // A browser-like crawler reaches a page from its article, as
                // a visitor following a link does: the article now, the page
                // next (whatever the article's answer).
                match article_of(cohort, jar, &picked.1) {
                    Some(article) => {
                        self.then = Some(picked);
                        (Method::GET, article)
                    }
                    None => picked,
                }
            }
        };
        self.first = false;
        self.sent += 1;
        request
    }
}

/// What a client sends next: kind-specific first steps (an editor logs in, a
/// crawler with a session cookie fetches the login page), people's
/// occasional visit to the login page, else a pick from the cohort's
/// weighted mix.
fn pick_request(
    ctx: &RunContext,
    cohort: &Cohort,
    plan: &ClientPlan,
    first: bool,
    weights: &[f64],
    total_weight: f64,
    rng: &mut SmallRng,
) -> (Method, String) {
    if first && cohort.kind == CohortKind::Editors {
        (Method::POST, ctx.login_path.clone())
    } else if (first && plan.session_cookie)
        || (cohort.kind == CohortKind::Humans && rng.random_bool(cohort.login_share))
    {
        // The login page: it hands out the session cookie the jar then keeps.
        (Method::GET, ctx.login_path.clone())
    } else {
        let mix = &cohort.requests[pick(weights, total_weight, rng)];
        let method = Method::from_bytes(mix.method.as_bytes()).unwrap_or(Method::GET);
        (method, fill_numbers(&mix.path, rng))
    }
}

/// The article a browser-like crawler fetches before `path`: `/wiki/T` for a
/// page with `title=T` in its query, unless that article is the page it is
/// on already.
fn article_of(cohort: &Cohort, jar: &CookieJar, path: &str) -> Option<String> {
    if !cohort.browser_like {
        return None;
    }
    let (_, query) = path.split_once('?')?;
    let title = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("title="))
        .filter(|t| !t.is_empty())?;
    let article = format!("/wiki/{title}");
    (jar.last_page.as_deref() != Some(article.as_str())).then_some(article)
}

/// How a cohort's client gets past the challenges it meets, if it does:
/// people by the page's script (or, with scripts off, its refresh), a
/// crawler only if it runs a headless browser (the script) or follows the
/// page's no-script refresh.
fn challenge_skill(cohort: &Cohort, plan: &ClientPlan) -> Option<Skill> {
    let script = match cohort.kind {
        CohortKind::Humans | CohortKind::Editors => cohort.javascript,
        CohortKind::Crawlers if plan.headless => true,
        CohortKind::Crawlers if plan.follows_refresh => false,
        _ => return None,
    };
    Some(if script {
        Skill::Script
    } else {
        Skill::Refresh
    })
}

/// How a client passes a challenge page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Skill {
    /// Runs the page's script: the proof of work.
    Script,
    /// Runs no script, follows the page's `<noscript>` refresh after its wait.
    Refresh,
}

/// What a client keeps from one request to the next: its connection (and
/// how many requests that has carried) and its cookies.
#[derive(Default)]
struct ClientSession {
    conn: Option<SendRequest<ClientBody>>,
    on_connection: u32,
    jar: CookieJar,
}

impl ClientSession {
    /// Sends one request and reads its answer, giving up at the cohort's
    /// timeout or at the end of grace (then dropping the connection, which
    /// may still carry the abandoned answer).
    async fn exchange_in_time(
        &mut self,
        ctx: &RunContext,
        cohort: &Cohort,
        plan: &ClientPlan,
        method: Method,
        path: &str,
        cancel: &mut watch::Receiver<bool>,
    ) -> Answer {
        let skill = challenge_skill(cohort, plan);
        let exchange = exchange(
            ctx,
            cohort,
            plan.src,
            &mut self.conn,
            &mut self.jar,
            method,
            path,
            skill,
        );
        tokio::select! {
            r = tokio::time::timeout(cohort.timeout, exchange) => match r {
                Ok(r) => r,
                Err(_) => {
                    self.conn = None;
                    Answer::failed(Outcome::Timeout)
                }
            },
            _ = wait_true(cancel) => {
                self.conn = None;
                Answer::failed(Outcome::Unfinished)
            }
        }
    }

    /// Counts a request on the connection, and lets the connection go when
    /// it broke or has carried the cohort's `requests_per_connection`.
    fn count_request(&mut self, cohort: &Cohort) {
        self.on_connection += 1;
        if self.conn.is_none()
            || (cohort.requests_per_connection > 0
                && self.on_connection >= cohort.requests_per_connection)
        {
            self.conn = None;
            self.on_connection = 0;
        }
    }
}

/// The timings one client collects while it runs (in µs), merged into its
/// cohort's stats once at the end rather than locked for on every request.
#[derive(Default)]
struct ClientSamples {
    latencies: Vec<u32>,
    solved_latencies: Vec<u32>,
    lags: Vec<u32>,
}

impl ClientSamples {
    /// Keeps how late the client woke for a send it was waiting for.
    fn lag(&mut self, lag: Duration) {
        self.lags.push(lag.as_micros().min(u32::MAX as u128) as u32);
    }

    /// Keeps a served request's latency (also among the solved ones when it
    /// passed a challenge on the way).
    fn served(&mut self, took: Duration, solved_challenge: bool) {
        let us = took.as_micros().min(u32::MAX as u128) as u32;
        self.latencies.push(us);
        if solved_challenge {
            self.solved_latencies.push(us);
        }
    }

    /// Adds everything collected to the cohort's stats.
    fn merge_into(self, stats: &CohortStats) {
        let lock = |m: &Mutex<Vec<u32>>, v: Vec<u32>| {
            m.lock().unwrap_or_else(PoisonError::into_inner).extend(v)
        };
        lock(&stats.latencies_us, self.latencies);
        lock(&stats.solved_latencies_us, self.solved_latencies);
        lock(&stats.lags_us, self.lags);
    }
}

async fn wait_true(rx: &mut watch::Receiver<bool>) {
    // An error means the sender is gone: the run is over, treat as cancelled.
    let _ = rx.wait_for(|v| *v).await;
}

/// The next intended send after `prev`: a Poisson gap at the rate of the current phase.
/// A gap that crosses a phase boundary is redrawn from the boundary at the new rate
/// (exact for Poisson arrivals: they have no memory). A phase with factor 0 pauses until
/// the next phase; `None` when nothing follows.
fn next_send(
    cohort: &Cohort,
    clock: &RunClock,
    prev: Instant,
    rng: &mut SmallRng,
) -> Option<Instant> {
    let mut from = prev;
    loop {
        // Phases by their instants, not by the fraction of the run: a
        // phase's start read back as a fraction can fall just short of it
        // (0.44 of 28 s), and the send then waited for that same boundary
        // forever (a run with such a phase never began).
        let phase = (cohort.phases.iter()).rfind(|p| clock.at(p.at) <= from);
        let rate = cohort.rate * phase.map_or(1.0, |p| p.factor);
        let boundary = (cohort.phases.iter())
            .map(|p| clock.at(p.at))
            .find(|at| *at > from);
        if rate > 0.0 {
            let u: f64 = rng.random();
            let gap = -(1.0 - u).ln() / rate;
            let t = from + Duration::from_secs_f64(gap.min(86_400.0));
            match boundary {
                Some(b) if t > b => from = b,
                _ => return Some(t),
            }
        } else {
            from = boundary?;
        }
    }
}

fn pick(weights: &[f64], total: f64, rng: &mut SmallRng) -> usize {
    let mut x = rng.random::<f64>() * total;
    for (i, w) in weights.iter().enumerate() {
        if x < *w {
            return i;
        }
        x -= w;
    }
    weights.len().saturating_sub(1)
}

/// Replaces each `{n}` with a random number, so requests spread over many pages.
fn fill_numbers(path: &str, rng: &mut SmallRng) -> String {
    if !path.contains("{n}") {
        return path.to_string();
    }
    let mut out = String::with_capacity(path.len() + 16);
    let mut parts = path.split("{n}");
    if let Some(first) = parts.next() {
        out.push_str(first);
    }
    for part in parts {
        out.push_str(&rng.random_range(1..1_000_000u32).to_string());
        out.push_str(part);
    }
    out
}

struct Answer {
    outcome: Outcome,
    reached_app: bool,
    /// The client met a challenge, solved it and then got this outcome.
    solved_challenge: bool,
    /// The client met a challenge although it had solved one before.
    rechallenged: bool,
    /// The `x-request-id` of an answer that was not a page (the lab's
    /// ground truth for the access log's line of a request it refused).
    request_id: Option<String>,
}

impl Answer {
    fn failed(outcome: Outcome) -> Answer {
        Answer {
            outcome,
            reached_app: false,
            solved_challenge: false,
            rechallenged: false,
            request_id: None,
        }
    }
}

/// The challenge in a page: its nonce and difficulty (`data-bits`).
fn challenge_of(html: &[u8]) -> Option<(String, u8)> {
    let nonce = weir::challenge::page_nonce(html)?;
    let text = std::str::from_utf8(html).ok()?;
    let marker = "data-bits=\"";
    let start = text.find(marker)? + marker.len();
    let len = text[start..].find('"')?;
    Some((nonce, text[start..start + len].parse().ok()?))
}

async fn connect(src: Ipv4Addr, target: SocketAddr) -> std::io::Result<SendRequest<ClientBody>> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(IpAddr::V4(src), 0))?;
    let stream = socket.connect(target).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(async move {
        // Errors surface on the sender as a failed request; nothing to do here.
        let _ = conn.await;
    });
    Ok(sender)
}

#[allow(clippy::too_many_arguments)]
async fn exchange(
    ctx: &RunContext,
    cohort: &Cohort,
    src: Ipv4Addr,
    conn: &mut Option<SendRequest<ClientBody>>,
    jar: &mut CookieJar,
    method: Method,
    path: &str,
    skill: Option<Skill>,
) -> Answer {
    let method_again = method.clone();
    let Some(sender) = ready_connection(ctx, src, conn).await else {
        return Answer::failed(Outcome::ConnError);
    };
    let browser = sends_as_browser(cohort, skill.is_some());
    let Ok(request) = build_request(cohort, jar, method, path, browser) else {
        return Answer::failed(Outcome::Other);
    };
    let Ok(response) = sender.send_request(request).await else {
        *conn = None;
        return Answer::failed(Outcome::ConnError);
    };
    let status = response.status().as_u16();
    let head = read_head(response.headers(), status, jar, path, browser);
    let Some(body) = read_body(response, conn, head.keep).await else {
        return Answer::failed(Outcome::ConnError);
    };
    let passed = match skill.filter(|_| head.challenged) {
        Some(skill) => pass_challenge(ctx, cohort, src, jar, &body, skill).await,
        None => false,
    };
    if passed {
        jar.solved = true;
        let retry = Box::pin(exchange(
            ctx,
            cohort,
            src,
            conn,
            jar,
            method_again,
            path,
            None,
        ))
        .await;
        return Answer {
            solved_challenge: true,
            rechallenged: head.rechallenged || retry.rechallenged,
            ..retry
        };
    }
    Answer {
        outcome: Outcome::of_response(status, head.challenged),
        reached_app: head.reached_app,
        solved_challenge: false,
        rechallenged: head.rechallenged,
        request_id: head.request_id,
    }
}

/// What a response's head told a client.
struct ResponseHead {
    /// It carries `x-weir-challenge`.
    challenged: bool,
    /// Challenged although the client had solved a challenge before.
    rechallenged: bool,
    /// It carries the app's `x-app-class`: the app answered.
    reached_app: bool,
    /// The `x-request-id` of an answer that was not a 200.
    request_id: Option<String>,
    /// The server keeps the connection open (no `connection: close`).
    keep: bool,
}

/// Reads a response's head, keeping in `jar` the cookies it sets and, for a
/// browser, the app's page at `path` it answered with.
fn read_head(
    headers: &http::HeaderMap,
    status: u16,
    jar: &mut CookieJar,
    path: &str,
    browser: bool,
) -> ResponseHead {
    let challenged = headers.contains_key("x-weir-challenge");
    let rechallenged = challenged && jar.solved;
    let reached_app = headers.contains_key("x-app-class");
    let request_id = (status != 200)
        .then(|| {
            headers
                .get("x-request-id")?
                .to_str()
                .ok()
                .map(str::to_owned)
        })
        .flatten();
    if reached_app && status == 200 && browser {
        jar.last_page = Some(path.to_owned());
    }
    let keep = !headers
        .get("connection")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
    for v in headers.get_all(SET_COOKIE) {
        jar.set(v);
    }
    ResponseHead {
        challenged,
        rechallenged,
        reached_app,
        request_id,
        keep,
    }
}

/// Reads a response's body whole, letting the connection go when that
/// fails (then `None`) or when the server does not `keep` it.
async fn read_body(
    response: http::Response<hyper::body::Incoming>,
    conn: &mut Option<SendRequest<ClientBody>>,
    keep: bool,
) -> Option<Bytes> {
    let body = match response.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            *conn = None;
            return None;
        }
    };
    if !keep {
        *conn = None;
    }
    Some(body)
}

/// The client's connection, ready to send on: `conn` if it is still open,
/// else a new one from `src` (kept in `conn`). `None`, and no connection
/// kept, when connecting fails or the connection will not take a request.
async fn ready_connection<'c>(
    ctx: &RunContext,
    src: Ipv4Addr,
    conn: &'c mut Option<SendRequest<ClientBody>>,
) -> Option<&'c mut SendRequest<ClientBody>> {
    if conn.as_ref().is_some_and(|c| c.is_closed()) {
        *conn = None;
    }
    let sender = match conn {
        Some(s) => s,
        None => conn.insert(connect(src, ctx.target).await.ok()?),
    };
    if sender.ready().await.is_err() {
        *conn = None;
        return None;
    }
    conn.as_mut()
}

/// Whether a cohort's client sends what a browser sends (navigation
/// headers, a referer): people do, and so does a headless-browser crawler
/// (one that `solves` challenges) or a browser-like one; floods never.
fn sends_as_browser(cohort: &Cohort, solves: bool) -> bool {
    match cohort.kind {
        CohortKind::Humans | CohortKind::Editors | CohortKind::Uploads => true,
        CohortKind::Crawlers => solves || cohort.browser_like,
        CohortKind::Flood => false,
    }
}

/// The request a cohort's client sends for `method` and `path`: its host and
/// user agent, a browser's headers if it is one, the jar's cookies, and for
/// an upload's POST a body trickled at the cohort's upload rate.
fn build_request(
    cohort: &Cohort,
    jar: &CookieJar,
    method: Method,
    path: &str,
    browser: bool,
) -> http::Result<Request<ClientBody>> {
    let upload = cohort.kind == CohortKind::Uploads && method == Method::POST;
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", &cohort.host);
    req = req.header("user-agent", &cohort.user_agent);
    if browser {
        req = req
            .header(
                "accept",
                "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
            )
            .header("accept-language", "ko-KR,ko;q=0.9,en;q=0.8")
            .header("sec-fetch-mode", "navigate")
            .header("sec-fetch-site", "same-origin")
            .header("sec-fetch-dest", "document");
        if let Some(page) = &jar.last_page {
            req = req.header("referer", format!("http://{}{page}", cohort.host));
        }
    } else {
        req = req.header("accept", "*/*");
    }
    if let Some(cookies) = jar.header() {
        req = req.header("cookie", cookies);
    }
    let body = if upload {
        req = req.header("content-length", cohort.upload_bytes);
        ClientBody::Right(TrickleBody::new(cohort.upload_bytes, cohort.upload_rate))
    } else {
        ClientBody::Left(http_body_util::Full::new(Bytes::new()))
    };
    req.body(body)
}

/// Passes the challenge page `body` as a browser would (people, and the
/// share of crawlers that run one): solves it the way the page's script
/// does, or, with scripts off, follows the page's refresh after its wait.
/// True once weir accepted the pass.
async fn pass_challenge(
    ctx: &RunContext,
    cohort: &Cohort,
    src: Ipv4Addr,
    jar: &mut CookieJar,
    body: &[u8],
    skill: Skill,
) -> bool {
    if skill == Skill::Refresh {
        return follow_refresh(ctx, cohort, src, jar, body).await == Some(true);
    }
    let Some((nonce, bits)) = challenge_of(body) else {
        return false;
    };
    let started = Instant::now();
    let counter = tokio::task::spawn_blocking(move || weir::challenge::pow::solve(&nonce, bits))
        .await
        .unwrap_or_default();
    // A slower browser: the time its hashes would have taken.
    if let Some(rate) = cohort.hash_rate {
        let at_rate = Duration::from_secs_f64((counter + 1) as f64 / rate);
        tokio::time::sleep(at_rate.saturating_sub(started.elapsed())).await;
    }
    let nonce = weir::challenge::page_nonce(body).unwrap_or_default();
    let form = weir::challenge::answer_form(&nonce, counter);
    submit_answer(ctx, cohort, src, jar, form).await == Some(true)
}

/// The `<noscript>` meta refresh of a challenge page: its wait and link.
fn refresh_of(html: &[u8]) -> Option<(Duration, String)> {
    let text = std::str::from_utf8(html).ok()?;
    let meta = text.find("http-equiv=\"refresh\"")?;
    let content = meta + text[meta..].find("content=\"")? + "content=\"".len();
    let value = &text[content..content + text[content..].find('"')?];
    let (secs, url) = value.split_once(';')?;
    let url = url.trim().strip_prefix("url=")?;
    Some((
        Duration::from_secs(secs.trim().parse().ok()?),
        url.replace("&amp;", "&"),
    ))
}

/// What a browser with scripts off does on a challenge page: waits as its
/// refresh says, then follows it on a fresh connection, keeping the pass
/// cookie; `Some(true)` when that earned a pass (303).
async fn follow_refresh(
    ctx: &RunContext,
    cohort: &Cohort,
    src: Ipv4Addr,
    jar: &mut CookieJar,
    html: &[u8],
) -> Option<bool> {
    let (wait, url) = refresh_of(html)?;
    tokio::time::sleep(wait).await;
    let req = Request::builder()
        .method(Method::GET)
        .uri(url)
        .header("host", &cohort.host)
        .header("user-agent", &cohort.user_agent)
        .header("accept", "text/html");
    earns_pass(ctx, src, jar, req, Bytes::new()).await
}

/// Posts a challenge answer on a fresh connection, keeping the pass cookie;
/// `Some(true)` when it was accepted (303).
async fn submit_answer(
    ctx: &RunContext,
    cohort: &Cohort,
    src: Ipv4Addr,
    jar: &mut CookieJar,
    form: String,
) -> Option<bool> {
    let req = Request::builder()
        .method(Method::POST)
        .uri("/.weir/challenge/verify")
        .header("host", &cohort.host)
        .header("user-agent", &cohort.user_agent)
        .header("content-type", "application/x-www-form-urlencoded");
    earns_pass(ctx, src, jar, req, Bytes::from(form)).await
}

/// Sends `req` with the jar's cookies on a fresh connection and keeps what
/// it sets; `Some(true)` when weir answered 303 (a pass earned).
async fn earns_pass(
    ctx: &RunContext,
    src: Ipv4Addr,
    jar: &mut CookieJar,
    mut req: http::request::Builder,
    body: Bytes,
) -> Option<bool> {
    let mut sender = connect(src, ctx.target).await.ok()?;
    sender.ready().await.ok()?;
    if let Some(cookies) = jar.header() {
        req = req.header("cookie", cookies);
    }
    let body = ClientBody::Left(http_body_util::Full::new(body));
    let resp = sender.send_request(req.body(body).ok()?).await.ok()?;
    for v in resp.headers().get_all(SET_COOKIE) {
        jar.set(v);
    }
    let ok = resp.status().as_u16() == 303;
    let _ = resp.into_body().collect().await;
    Some(ok)
}

/// The cookies a browser would keep for one site: name=value pairs, latest wins.
#[derive(Debug, Default, Clone)]
pub struct CookieJar {
    pairs: Vec<(String, String)>,
    /// The last page the site served (a browser's `Referer` for the next
    /// navigation, as when following a link).
    last_page: Option<String>,
    /// This client has solved a challenge (earned a pass) in its visit.
    solved: bool,
}

impl CookieJar {
    /// Stores the cookie of one `Set-Cookie` header (attributes ignored).
    pub fn set(&mut self, header: &HeaderValue) {
        let Ok(text) = header.to_str() else { return };
        let pair = text.split(';').next().unwrap_or("");
        let Some((name, value)) = pair.split_once('=') else {
            return;
        };
        let (name, value) = (name.trim(), value.trim());
        if name.is_empty() {
            return;
        }
        match self.pairs.iter_mut().find(|(n, _)| n == name) {
            Some(p) => p.1 = value.to_string(),
            None => self.pairs.push((name.to_string(), value.to_string())),
        }
    }

    /// The `Cookie` header to send, if any cookie is kept.
    pub fn header(&self) -> Option<String> {
        (!self.pairs.is_empty()).then(|| {
            let parts: Vec<String> = self.pairs.iter().map(|(n, v)| format!("{n}={v}")).collect();
            parts.join("; ")
        })
    }

    /// Whether the jar holds the login page's session cookie.
    pub fn has_session(&self) -> bool {
        self.pairs.iter().any(|(n, _)| n == SESSION_COOKIE)
    }
}

/// A request body sent at `rate` bytes per second in 100 ms chunks: a phone uploading a
/// photo over a slow uplink.
pub struct TrickleBody {
    left: u64,
    chunk: u64,
    tick: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl TrickleBody {
    pub fn new(bytes: u64, rate: u64) -> TrickleBody {
        let tick = Duration::from_millis(100);
        TrickleBody {
            left: bytes,
            chunk: (rate / 10).max(1),
            tick,
            sleep: None,
        }
    }
}

impl Body for TrickleBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        if let Some(sleep) = self.sleep.as_mut()
            && sleep.as_mut().poll(cx).is_pending()
        {
            return Poll::Pending;
        }
        let tick = self.tick;
        self.sleep = Some(Box::pin(tokio::time::sleep(tick)));
        let n = self.chunk.min(self.left);
        self.left -= n;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![b'x'; n as usize])))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

use std::future::Future as _;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Phase;

    #[test]
    fn a_page_without_javascript_is_followed_by_its_refresh() {
        use weir::challenge::{ChallengeConfig, Challenger};
        use weir::identity::{AddrSource, ClientAddr, ClientId, PeerAddr};
        let ch = Challenger::new(&ChallengeConfig {
            keys: vec!["lab-test-key-0123456789abcdef0123456789".into()],
            no_script_delay: weir::config::ConfigDuration::secs(4),
            ..ChallengeConfig::default()
        })
        .unwrap();
        let peer: std::net::SocketAddr = "192.0.2.1:4000".parse().unwrap();
        let client = ClientId {
            peer: PeerAddr(peer),
            client: ClientAddr::new(peer.ip()),
            source: AddrSource::Peer,
        };
        let target = weir_http::target::Target::parse(
            "GET",
            "/w/index.php?search=a&fulltext=1",
            Some("wiki.example.org"),
            Default::default(),
        )
        .unwrap();
        let headers = http::HeaderMap::new();
        let asker = weir::challenge::Asker {
            client: &client,
            headers: &headers,
            tls: false,
        };
        let budget = weir::challenge::ChallengeBudget::default();
        let at = weir::challenge::At {
            now: std::time::SystemTime::now(),
            budget: &budget,
        };
        let page = ch.page(&target, asker, 12, at);
        let (wait, url) = refresh_of(page.body()).expect("a refresh");
        assert_eq!(wait, Duration::from_secs(4));
        let nonce = weir::challenge::page_nonce(page.body()).unwrap();
        assert_eq!(
            url,
            format!("{}?nonce={nonce}", weir::challenge::REFRESH_PATH)
        );
        assert_eq!(refresh_of(b"<html>no refresh</html>"), None);
    }

    #[test]
    fn outcomes_from_statuses() {
        #[rustfmt::skip]
        let cases = [
            (200, false, Outcome::Served), (302, false, Outcome::Served),
            (429, false, Outcome::Rejected429), (503, false, Outcome::Unavailable503),
            (502, false, Outcome::Error5xx), (504, false, Outcome::Error5xx),
            (401, false, Outcome::Other), (404, false, Outcome::Other),
            (403, true, Outcome::Challenged), (200, true, Outcome::Challenged),
        ];
        for (status, challenged, want) in cases {
            assert_eq!(
                Outcome::of_response(status, challenged),
                want,
                "{status} {challenged}"
            );
        }
        for (i, o) in OUTCOMES.iter().enumerate() {
            assert_eq!(*o as usize, i, "OUTCOMES is indexed by discriminant");
        }
    }

    #[test]
    fn cookie_jar_keeps_latest_values() {
        let mut jar = CookieJar::default();
        assert_eq!(jar.header(), None);
        jar.set(&HeaderValue::from_static(
            "wikisession=abc; Path=/; HttpOnly",
        ));
        jar.set(&HeaderValue::from_static("wikiUserID=1; Path=/"));
        jar.set(&HeaderValue::from_static("wikisession=def"));
        jar.set(&HeaderValue::from_static("=novalue"));
        assert_eq!(
            jar.header().as_deref(),
            Some("wikisession=def; wikiUserID=1")
        );
        assert!(jar.has_session());
    }

    #[test]
    fn poisson_arrivals_follow_phases() {
        let start = Instant::now();
        let clock = RunClock::new(start, Duration::from_secs(100), Duration::ZERO);
        let cohort = Cohort {
            phases: vec![
                Phase {
                    at: 0.5,
                    factor: 0.0,
                },
                Phase {
                    at: 0.8,
                    factor: 4.0,
                },
            ],
            ..test_cohort(10.0)
        };
        let mut rng = SmallRng::seed_from_u64(1);
        let mut t = start;
        let mut per_phase = [0u32; 3];
        while let Some(next) = next_send(&cohort, &clock, t, &mut rng) {
            if next >= clock.at(1.0) {
                break;
            }
            let f = clock.fraction(next);
            per_phase[if f < 0.5 {
                0
            } else if f < 0.8 {
                1
            } else {
                2
            }] += 1;
            t = next;
        }
        // 50 s at 10/s, a pause, 20 s at 40/s: within 10% (seeded, so exact per run).
        assert!((450..=550).contains(&per_phase[0]), "{per_phase:?}");
        assert_eq!(per_phase[1], 0, "paused");
        assert!((720..=880).contains(&per_phase[2]), "{per_phase:?}");
    }

    /// Regression: a phase at 0.44 of a 28 s run began at an instant that,
    /// read back as a fraction of the run, fell just short of 0.44, and the
    /// next send waited for that boundary again and again: the run never
    /// began, its generator spinning a core.
    #[test]
    fn phases_at_any_fraction_end_their_waits() {
        let start = Instant::now();
        let clock = RunClock::new(start, Duration::from_secs(28), Duration::ZERO);
        let at = |at, factor| Phase { at, factor };
        let cohort = Cohort {
            phases: vec![
                at(0.214, 2.0),
                at(0.40, 30.0),
                at(0.44, 2.0),
                at(0.643, 6.0),
            ],
            ..test_cohort(0.02)
        };
        // On a thread of its own: the bug spun inside `next_send`.
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for seed in 0..50 {
                let mut rng = SmallRng::seed_from_u64(seed);
                let mut t = start;
                while let Some(next) = next_send(&cohort, &clock, t, &mut rng) {
                    assert!(next >= t, "time runs forward");
                    if next >= clock.at(1.0) {
                        break;
                    }
                    t = next;
                }
            }
            let _ = done.send(());
        });
        finished
            .recv_timeout(Duration::from_secs(20))
            .expect("every send was planned: no phase boundary was waited for forever");
    }

    #[test]
    fn a_browser_like_crawler_reaches_a_page_from_its_article() {
        let mut cohort = test_cohort(1.0);
        cohort.kind = CohortKind::Crawlers;
        let mut jar = CookieJar::default();
        let diff = "/w/index.php?title=Page_7&diff=3";
        assert_eq!(article_of(&cohort, &jar, diff), None, "not browser-like");
        cohort.browser_like = true;
        assert_eq!(
            article_of(&cohort, &jar, diff).as_deref(),
            Some("/wiki/Page_7")
        );
        assert_eq!(
            article_of(&cohort, &jar, "/wiki/Page_7"),
            None,
            "an article itself"
        );
        assert_eq!(
            article_of(&cohort, &jar, "/w/index.php?search=x"),
            None,
            "no title"
        );
        jar.last_page = Some("/wiki/Page_7".into());
        assert_eq!(
            article_of(&cohort, &jar, diff),
            None,
            "on the article already"
        );
        assert!(
            sends_as_browser(&cohort, false),
            "navigation headers, Referer"
        );
    }

    #[test]
    fn numbers_are_filled_in() {
        let mut rng = SmallRng::seed_from_u64(2);
        let p = fill_numbers("/w/index.php?title=P{n}&diff={n}", &mut rng);
        assert!(
            !p.contains("{n}") && p.starts_with("/w/index.php?title=P"),
            "{p}"
        );
        assert_eq!(fill_numbers("/plain", &mut rng), "/plain");
    }

    pub(crate) fn test_cohort(rate: f64) -> Cohort {
        Cohort {
            name: "humans".into(),
            kind: CohortKind::Humans,
            clients: 1,
            addresses: 1,
            networks: Vec::new(),
            among: Vec::new(),
            browser_like: false,
            rate,
            requests: Vec::new(),
            login_share: 0.0,
            landing_pages: 0,
            javascript: true,
            hash_rate: None,
            session_cookie_share: 0.0,
            headless_share: 0.0,
            refresh_share: 0.0,
            user_agent: "test".into(),
            host: "wiki.example.org".into(),
            timeout: Duration::from_secs(1),
            start: 0.0,
            stop: 1.0,
            phases: Vec::new(),
            reconnect_delay: Duration::from_millis(500),
            upload_bytes: 0,
            upload_rate: 1,
            requests_per_connection: 0,
            ramp: Duration::ZERO,
        }
    }
}
