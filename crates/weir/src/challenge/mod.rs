//! The adaptive browser challenge: a browser navigation without a valid pass
//! gets a page whose script spends about a second of CPU (proof of work) and
//! earns a signed, network- and browser-bound `weir_pass` cookie.
//!
//! ```text
//! GET /wiki/Page ─► eligible? ─► pass()? ─Valid──► (rate-limit by pass id) ─► upstream
//!                      │no          │Missing/Invalid
//!                      ▼            ▼
//!                  upstream     page(): 429 + x-weir-challenge: 1
//!                                   │ script: SHA-256(nonce:counter) < 2^(256-bits)
//!                                   ▼
//!               POST /.weir/challenge/verify (handle()) ─► 303 to the page + Set-Cookie
//! ```
//!
//! ```
//! use std::time::SystemTime;
//! use weir::challenge::{ChallengeConfig, Challenger, PassCheck, pow};
//! use weir::identity::{AddrSource, ClientAddr, ClientId, PeerAddr};
//! use weir_http::target::{PathPolicy, Target};
//!
//! let config = ChallengeConfig {
//!     keys: vec!["0123456789abcdef0123456789abcdef".into()],
//!     difficulty: 8,
//!     ..ChallengeConfig::default()
//! };
//! let challenger = Challenger::new(&config).unwrap();
//! let peer: std::net::SocketAddr = "203.0.113.7:50000".parse().unwrap();
//! let client = ClientId { peer: PeerAddr(peer), client: ClientAddr::new(peer.ip()), source: AddrSource::Peer };
//! let now = SystemTime::now();
//! let mut headers = http::HeaderMap::new();
//! headers.insert("accept", "text/html".parse().unwrap());
//! headers.insert("user-agent", "Mozilla/5.0".parse().unwrap());
//! let page_target = Target::parse("GET", "/wiki/Page", Some("wiki.example"), PathPolicy::default()).unwrap();
//!
//! let navigation = weir::challenge::is_navigation(&headers);
//! assert!(challenger.eligible(&page_target, &headers, navigation, &client));
//! assert_eq!(challenger.pass(&headers, &client, now), PassCheck::Missing);
//! let page = challenger.page(&page_target, &client, &headers, challenger.base_difficulty(), now);
//! assert_eq!(page.headers()["x-weir-challenge"], "1");
//!
//! // What the page's script does:
//! let nonce = weir::challenge::page_nonce(page.body()).unwrap();
//! let counter = pow::solve(&nonce, 8);
//! let form = format!("nonce={nonce}&counter={counter}");
//! let verify = Target::parse("POST", "/.weir/challenge/verify", Some("wiki.example"), PathPolicy::default()).unwrap();
//! // The browser keeps cookies: it sends back the one the page set (without
//! // it, the pass would come in the address too).
//! headers.insert("cookie", "weir_cookies=1".parse().unwrap());
//! let answer = challenger
//!     .handle(&verify, &headers, form.as_bytes(), &client, true, now)
//!     .expect("a challenge path")
//!     .expect("served in its method");
//! assert_eq!(answer.status(), 303);
//! assert_eq!(answer.headers()["location"], "/wiki/Page");
//! let cookie = answer.headers()["set-cookie"].to_str().unwrap();
//! assert!(cookie.starts_with("weir_pass=") && cookie.contains("; Secure"));
//!
//! headers.insert("cookie", cookie.split(';').next().unwrap().parse().unwrap());
//! assert!(matches!(challenger.pass(&headers, &client, now), PassCheck::Valid(_)));
//! ```
//!
//! Owns: [`Challenger`] (eligibility, pass check, page, the `/.weir/` paths),
//! [`token`] (the cookie), [`pow`] (the work), [`page`] (HTML, script, CSP),
//! [`pressure`] (when `under_pressure` engages) and the `[challenge]` config
//! ([`ChallengeConfig`], [`ChallengeMode`]). Does not: read request bodies
//! (the caller hands [`Challenger::handle`] at most [`MAX_VERIFY_BODY`]
//! bytes), keep any per-client state, rate-limit pass holders (the rules do,
//! keyed by [`PassToken::id`]) or record metrics (it returns
//! [`ChallengeEvent`]s). See `docs/challenge.md`.

pub mod config;
pub mod keyfile;
pub mod keyring;
pub mod page;
pub mod pow;
pub mod pressure;
pub mod token;

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode};
use weir_http::target::Target;

pub use config::{
    ChallengeConfig, ChallengeConfigError, ChallengeMode, ChallengeText, GoodBotConfig,
    PressureConfig,
};
pub use page::{CHALLENGE_HEADER, REFRESH_PATH, SCRIPT_PATH, VERIFY_PATH};
pub use pow::PowRejection;
pub use pressure::{Pressure, PressureChange, PressureSettings};
pub use token::{PassToken, TokenRejection};

use crate::identity::{ClientId, TrustedProxies};
use keyring::{Binding, Keyring, Purpose};
use page::PageTemplate;

/// The largest verify body weir needs to read: a nonce (under 3 KiB with the
/// longest return path) and a counter. Read no more than this.
pub const MAX_VERIFY_BODY: usize = 4096;

/// Every weir-served path lives under this prefix; never challenged, never
/// forwarded when the challenge is on.
pub const WEIR_PREFIX: &str = "/.weir/";

/// Whether a request carries a valid pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassCheck {
    Valid(PassToken),
    Missing,
    Invalid(TokenRejection),
}

impl PassCheck {
    /// The event to record: a pass admitted or refused (none when absent).
    pub fn event(&self) -> Option<ChallengeEvent> {
        match self {
            PassCheck::Valid(t) => Some(ChallengeEvent::PassAdmitted { id: t.id }),
            PassCheck::Invalid(r) => Some(ChallengeEvent::PassRejected(*r)),
            PassCheck::Missing => None,
        }
    }
}

/// Something for metrics and logs. Responses from [`Challenger::page`] and
/// [`Challenger::handle`] carry theirs in their extensions (see [`events`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChallengeEvent {
    /// A challenge page was served.
    Issued { difficulty: u8 },
    /// A correct answer earned a pass. `time_to_solve` runs from the page
    /// being issued to the answer arriving (includes page load and network;
    /// a page offered after a queue wait is issued as of the wait's start).
    /// `no_script`: earned by waiting, by a browser without JavaScript
    /// (difficulty 0).
    Solved {
        difficulty: u8,
        time_to_solve: Duration,
        pass_id: u64,
        no_script: bool,
    },
    /// A wrong, expired, foreign or forged answer.
    Failed(PowRejection),
    /// A request carried a valid pass.
    PassAdmitted { id: u64 },
    /// A request carried a pass cookie that is not valid.
    PassRejected(TokenRejection),
}

impl ChallengeEvent {
    /// Bounded metric labels: `(event, reason)`.
    pub fn labels(&self) -> (&'static str, &'static str) {
        match self {
            ChallengeEvent::Issued { .. } => ("issued", ""),
            ChallengeEvent::Solved {
                no_script: true, ..
            } => ("solved", "no_script"),
            ChallengeEvent::Solved { .. } => ("solved", ""),
            ChallengeEvent::Failed(r) => ("failed", r.as_str()),
            ChallengeEvent::PassAdmitted { .. } => ("pass_admitted", ""),
            ChallengeEvent::PassRejected(r) => ("pass_rejected", r.as_str()),
        }
    }
}

/// The events a response from [`Challenger`] carries (stored in its
/// extensions so `page` and `handle` keep plain response signatures).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChallengeEvents(pub Vec<ChallengeEvent>);

/// The events recorded on a response from [`Challenger::page`] or
/// [`Challenger::handle`]; empty for any other response.
pub fn events<B>(resp: &Response<B>) -> &[ChallengeEvent] {
    resp.extensions()
        .get::<ChallengeEvents>()
        .map_or(&[], |e| e.0.as_slice())
}

/// Why a request is never challenged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exemption {
    /// Not GET or HEAD (forms, APIs: a challenge would lose the body).
    Method,
    /// Not a browser navigation (`Sec-Fetch-Mode` other than `navigate`, or
    /// no HTML in `Accept`): scripts, images, APIs, feeds readers.
    NotNavigation,
    /// A navigation from a client that could not pass the page: no fetch
    /// metadata, and a User-Agent that is no browser's (a search or archive
    /// crawler, a link-preview fetcher, a text browser). See
    /// [`is_browser`].
    NotABrowser,
    /// weir's own `/.weir/` paths.
    WeirPath,
    /// `exempt_paths` or `exempt_prefixes`.
    Path,
    /// A key in `exempt_query_keys`.
    Query,
    /// The client is in `allow_cidrs`.
    AllowedNetwork,
    /// A `good_bots` entry matched (its name).
    GoodBot(String),
}

#[derive(Debug)]
struct GoodBot {
    name: String,
    user_agent: String,
    /// `None`: the User-Agent alone is believed.
    networks: Option<TrustedProxies>,
}

/// The challenge, built from a validated [`ChallengeConfig`].
#[derive(Debug)]
pub struct Challenger {
    token_keys: Keyring,
    pow_keys: Keyring,
    pass_ttl: Duration,
    solve_ttl: Duration,
    /// The `<noscript>` refresh's wait; `None` when `no_script` is off.
    no_script_delay: Option<Duration>,
    cookie_name: String,
    base_difficulty: u8,
    pressure: PressureSettings,
    exempt_paths: Vec<String>,
    exempt_prefixes: Vec<String>,
    exempt_query_keys: Vec<String>,
    allow: TrustedProxies,
    good_bots: Vec<GoodBot>,
    template: PageTemplate,
}

impl Challenger {
    /// Validates `c` and builds the challenge from it; the first invalid
    /// setting is the error.
    pub fn new(c: &ChallengeConfig) -> Result<Challenger, ChallengeConfigError> {
        check_ranges(c)?;
        let no_script_delay = c.no_script.then_some(c.no_script_delay.0);
        check_cookie_name(&c.cookie_name)?;
        check_exemptions(c)?;
        let allow =
            TrustedProxies::parse(&c.allow_cidrs).map_err(|source| ChallengeConfigError::Cidr {
                key: "allow_cidrs".into(),
                source,
            })?;
        let good_bots = parse_good_bots(c)?;
        Ok(Challenger {
            token_keys: Keyring::new(&c.keys, Purpose::PassToken)?,
            pow_keys: Keyring::new(&c.keys, Purpose::PowChallenge)?,
            pass_ttl: c.pass_ttl.0,
            solve_ttl: c.solve_ttl.0,
            no_script_delay,
            cookie_name: c.cookie_name.clone(),
            base_difficulty: c.difficulty,
            pressure: PressureSettings::from_config(c),
            exempt_paths: c.exempt_paths.clone(),
            exempt_prefixes: c.exempt_prefixes.clone(),
            exempt_query_keys: c.exempt_query_keys.clone(),
            allow,
            good_bots,
            template: PageTemplate::new(&c.text, no_script_delay),
        })
    }

    /// `difficulty` from the config: the bits served when not under pressure.
    pub fn base_difficulty(&self) -> u8 {
        self.base_difficulty
    }

    /// How long an unproven navigation under pressure may wait for an
    /// admission slot before it is challenged instead (`pressure.wait`:
    /// the wait that counts as pressure).
    pub fn pressure_wait(&self) -> Duration {
        self.pressure.engage_wait
    }

    /// A fresh pressure state machine with this config's thresholds. Serve
    /// `pressure.difficulty(challenger.base_difficulty())` while engaged.
    pub fn pressure(&self) -> Pressure {
        Pressure::new(self.pressure.clone())
    }

    /// The pass's name: its cookie's, and the query key it comes in when
    /// the browser keeps no cookies.
    pub fn pass_name(&self) -> &str {
        &self.cookie_name
    }

    /// The pass on this request, checked with no store. Any one valid
    /// `weir_pass` cookie among several is enough.
    pub fn pass(&self, headers: &HeaderMap, client: &ClientId, now: SystemTime) -> PassCheck {
        // The binding (two SHA-256 digests) only for a request that carries
        // a pass: most carry none, and it was a seventh of a request's work
        // (bench/README.md, "TLS and HTTP/2 under callgrind").
        let mut binding = None;
        let mut first_rejection = None;
        for value in weir_http::cookie::values(headers, &self.cookie_name) {
            let binding =
                *binding.get_or_insert_with(|| Binding::of(client.client, user_agent(headers)));
            match token::verify(&self.token_keys, value, binding, now) {
                Ok(pass) => return PassCheck::Valid(pass),
                Err(r) => {
                    first_rejection.get_or_insert(r);
                }
            }
        }
        first_rejection.map_or(PassCheck::Missing, PassCheck::Invalid)
    }

    /// Whether this request may be challenged: a browser navigation to a
    /// page that is not exempt, from a client that is not allow-listed.
    /// `navigation` is [`is_navigation`] of `headers`, read by the caller:
    /// the proxy reads it once for the visit and the challenge.
    pub fn eligible(
        &self,
        target: &Target,
        headers: &HeaderMap,
        navigation: bool,
        client: &ClientId,
    ) -> bool {
        self.exemption(target, headers, navigation, client)
            .is_none()
    }

    /// Why this request is never challenged, if it is not eligible. Paths
    /// and query keys are the target's canonical ones, as the app reads
    /// them: `/static/../w/index.php` is not under `/static/`.
    /// `navigation`: as [`Challenger::eligible`]'s.
    pub fn exemption(
        &self,
        target: &Target,
        headers: &HeaderMap,
        navigation: bool,
        client: &ClientId,
    ) -> Option<Exemption> {
        let method = target.method();
        if method != Method::GET && method != Method::HEAD {
            return Some(Exemption::Method);
        }
        let path = target.match_path();
        if target.path().starts_with(WEIR_PREFIX) {
            return Some(Exemption::WeirPath);
        }
        if !navigation {
            return Some(Exemption::NotNavigation);
        }
        if self.exempt_paths.iter().any(|p| p == path)
            || self
                .exempt_prefixes
                .iter()
                .any(|p| path.starts_with(p.as_str()))
        {
            return Some(Exemption::Path);
        }
        if target.has_query_key(&self.exempt_query_keys) {
            return Some(Exemption::Query);
        }
        let ip = client.client.ip();
        if self.allow.contains(ip) {
            return Some(Exemption::AllowedNetwork);
        }
        let ua = user_agent(headers);
        if let Some(bot) = self.good_bots.iter().find(|bot| {
            contains(ua, bot.user_agent.as_bytes())
                && bot.networks.as_ref().is_none_or(|n| n.contains(ip))
        }) {
            return Some(Exemption::GoodBot(bot.name.clone()));
        }
        (!is_browser(headers)).then_some(Exemption::NotABrowser)
    }

    /// The challenge response for this request (status 429; see `page.rs`).
    /// Carries [`ChallengeEvent::Issued`].
    pub fn page(
        &self,
        target: &Target,
        client: &ClientId,
        headers: &HeaderMap,
        difficulty: u8,
        now: SystemTime,
    ) -> Response<Bytes> {
        self.page_after(target, client, headers, difficulty, now, Duration::ZERO)
    }

    /// [`Challenger::page`] for a navigation that has already `waited` for
    /// it (in the admission queue): the page is issued as of the wait's
    /// start, so the no-script delay (and `solve_ttl`) count the wait, and
    /// its refresh asks for the whole seconds of the delay left.
    ///
    /// Why: a person who waited for the page has spent that time already.
    /// Counted from the page, a person without JavaScript waited
    /// `pressure.wait`, then the whole delay again, then the page, and came
    /// past 2 s where the app was slow (docs/lab.md, crawlers like people).
    /// A crawler pays the same wait either way, in the queue or on the page.
    pub fn page_after(
        &self,
        target: &Target,
        client: &ClientId,
        headers: &HeaderMap,
        difficulty: u8,
        now: SystemTime,
        waited: Duration,
    ) -> Response<Bytes> {
        let return_path = target.path_and_query();
        let binding = Binding::of(client.client, user_agent(headers));
        let issued = Issued { now, waited };
        let status = StatusCode::TOO_MANY_REQUESTS;
        self.challenge(binding, difficulty, return_path, status, issued, Vec::new())
    }

    fn challenge(
        &self,
        binding: Binding,
        difficulty: u8,
        return_path: &str,
        status: StatusCode,
        issued: Issued,
        mut events: Vec<ChallengeEvent>,
    ) -> Response<Bytes> {
        let challenge = pow::issue(
            &self.pow_keys,
            binding,
            difficulty,
            rand::random::<u64>(),
            return_path,
            issued.now.checked_sub(issued.waited).unwrap_or(issued.now),
        );
        let mut resp = self.template.render(
            &challenge.nonce,
            challenge.difficulty,
            status,
            issued.waited,
        );
        events.push(ChallengeEvent::Issued {
            difficulty: challenge.difficulty,
        });
        resp.extensions_mut().insert(ChallengeEvents(events));
        resp
    }

    /// Whether `uri` is one of the paths [`Challenger::handle`] serves (so
    /// the caller knows to read up to [`MAX_VERIFY_BODY`] bytes of body).
    pub fn is_challenge_path(&self, path: &str) -> bool {
        matches!(path, SCRIPT_PATH | VERIFY_PATH | REFRESH_PATH)
    }

    /// Serves `/.weir/challenge.js`, `/.weir/challenge/verify` and
    /// `/.weir/challenge/refresh` (the no-script link); `None` for every
    /// other path. A correct answer gets `303` to where the visitor
    /// was going with the pass cookie (`Secure` when `tls`); a wrong or
    /// expired one a fresh challenge (429), a forged or malformed one a fresh
    /// challenge with 403. Events are in the response's extensions.
    /// A request to one of these paths that they do not serve is refused
    /// with its [`EndpointRefusal`], answered as any refusal.
    pub fn handle(
        &self,
        target: &Target,
        headers: &HeaderMap,
        body: &[u8],
        client: &ClientId,
        tls: bool,
        now: SystemTime,
    ) -> Option<Result<Response<Bytes>, EndpointRefusal>> {
        let method = target.method();
        let read = method == Method::GET || method == Method::HEAD;
        let refused = |allow| Err(EndpointRefusal::MethodNotAllowed { allow });
        Some(match target.path() {
            SCRIPT_PATH if read => Ok(self.template.script()),
            SCRIPT_PATH => refused("GET, HEAD"),
            VERIFY_PATH if method == Method::POST => {
                Ok(self.verify(headers, body, client, tls, now))
            }
            VERIFY_PATH => refused("POST"),
            REFRESH_PATH if read => self.refresh(target, headers, client, tls, now),
            REFRESH_PATH => refused("GET, HEAD"),
            _ => return None,
        })
    }

    /// A correct answer's response: `303` back to where the visitor was
    /// going, with the pass cookie (`Secure` when `tls`). An answer from a
    /// browser that kept no cookie of the page ([`page::COOKIE_PROBE`])
    /// gets the pass in the address too, for that page: with cookies off,
    /// the cookie alone would send it back to the page, again and again.
    /// (`jar`: the browser keeps cookies.)
    fn solved(
        &self,
        solved: &pow::Solved,
        (binding, jar): (Binding, bool),
        tls: bool,
        now: SystemTime,
        no_script: bool,
    ) -> Response<Bytes> {
        let cookie = token::issue(&self.token_keys, solved.seed, binding, now, self.pass_ttl);
        let location = if jar {
            solved.return_path.clone()
        } else {
            let joint = if solved.return_path.contains('?') {
                '&'
            } else {
                '?'
            };
            format!("{}{joint}{}={cookie}", solved.return_path, self.cookie_name)
        };
        let mut set_cookie = format!(
            "{}={cookie}; Path=/; Max-Age={}; HttpOnly; SameSite=Lax",
            self.cookie_name,
            self.pass_ttl.as_secs()
        );
        if tls {
            set_cookie.push_str("; Secure");
        }
        let mut resp = Response::new(Bytes::new());
        *resp.status_mut() = StatusCode::SEE_OTHER;
        let h = resp.headers_mut();
        // Both values are ASCII built here: a checked local path and
        // base64; fall back to `/` rather than fail.
        h.insert(
            header::LOCATION,
            HeaderValue::from_str(&location).unwrap_or(HeaderValue::from_static("/")),
        );
        if let Ok(v) = HeaderValue::from_str(&set_cookie) {
            h.insert(header::SET_COOKIE, v);
        }
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        resp.extensions_mut()
            .insert(ChallengeEvents(vec![ChallengeEvent::Solved {
                difficulty: solved.difficulty,
                time_to_solve: now.duration_since(solved.issued).unwrap_or_default(),
                pass_id: solved.seed,
                no_script,
            }]));
        resp
    }

    fn verify(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        client: &ClientId,
        tls: bool,
        now: SystemTime,
    ) -> Response<Bytes> {
        let binding = Binding::of(client.client, user_agent(headers));
        let answer = (body.len() <= MAX_VERIFY_BODY)
            .then(|| parse_answer(body))
            .flatten();
        let result = match &answer {
            Some((nonce, counter)) => pow::verify(
                &self.pow_keys,
                nonce,
                *counter,
                binding,
                self.solve_ttl,
                now,
            ),
            None => Err(PowRejection::Malformed),
        };
        match result {
            Ok(solved) => self.solved(&solved, (binding, keeps_cookies(headers)), tls, now, false),
            Err(reason) => self.failed(
                answer.as_ref().map(|(n, _)| n.as_str()),
                reason,
                binding,
                now,
            ),
        }
    }

    /// `GET /.weir/challenge/refresh?nonce=`: a browser without JavaScript
    /// that waited `no_script_delay` gets the pass as a solver does; too
    /// early, expired or foreign, a fresh challenge; with `no_script` off,
    /// 404 (weir serves no such path then).
    fn refresh(
        &self,
        target: &Target,
        headers: &HeaderMap,
        client: &ClientId,
        tls: bool,
        now: SystemTime,
    ) -> Result<Response<Bytes>, EndpointRefusal> {
        let Some(wait) = self.no_script_delay else {
            return Err(EndpointRefusal::NoScriptOff);
        };
        let binding = Binding::of(client.client, user_agent(headers));
        let nonce = refresh_nonce(target);
        let result = match &nonce {
            Some(nonce) => {
                pow::verify_waited(&self.pow_keys, nonce, binding, wait, self.solve_ttl, now)
            }
            None => Err(PowRejection::Malformed),
        };
        Ok(match result {
            Ok(solved) => self.solved(&solved, (binding, keeps_cookies(headers)), tls, now, true),
            Err(reason) => self.failed(nonce.as_deref(), reason, binding, now),
        })
    }

    /// How long to hold a `/.weir/challenge/refresh` link that came before
    /// `no_script_delay` was over, before [`Challenger::handle`] answers it;
    /// `None` for anything else (another path, a link already old enough,
    /// or one that would be refused anyway: it is answered at once).
    ///
    /// Why hold rather than refuse: a meta refresh counts whole seconds
    /// only, so the page tells the browser the delay's whole seconds (0 for
    /// the default 500 ms) and weir waits out the rest. The wait is the
    /// same for a person and a crawler; the person does not pay the round
    /// up to a whole second. The caller holds the request under the
    /// address's in-flight cap, so a crawler holds no more than any client.
    pub fn refresh_hold(
        &self,
        target: &Target,
        headers: &HeaderMap,
        client: &ClientId,
        now: SystemTime,
    ) -> Option<Duration> {
        let wait = self.no_script_delay?;
        let method = target.method();
        if target.path() != REFRESH_PATH || !(method == Method::GET || method == Method::HEAD) {
            return None;
        }
        let nonce = refresh_nonce(target)?;
        let binding = Binding::of(client.client, user_agent(headers));
        pow::wait_left(&self.pow_keys, &nonce, binding, wait, self.solve_ttl, now)
            .ok()
            .filter(|left| !left.is_zero())
    }

    /// A fresh challenge after a refused answer, counted as failed.
    fn failed(
        &self,
        nonce: Option<&str>,
        reason: PowRejection,
        binding: Binding,
        now: SystemTime,
    ) -> Response<Bytes> {
        // Keep the destination and difficulty only from a nonce we signed;
        // anything else starts over at `/`.
        let opened = nonce.and_then(|nonce| pow::open(&self.pow_keys, nonce).ok());
        let (path, bits) = opened.as_ref().map_or(("/", self.base_difficulty), |o| {
            (
                o.return_path.as_str(),
                o.difficulty.max(self.base_difficulty),
            )
        });
        let status = match reason {
            PowRejection::Malformed | PowRejection::BadSignature => StatusCode::FORBIDDEN,
            _ => StatusCode::TOO_MANY_REQUESTS,
        };
        let issued = Issued {
            now,
            waited: Duration::ZERO,
        };
        let events = vec![ChallengeEvent::Failed(reason)];
        self.challenge(binding, bits, path, status, issued, events)
    }
}

/// When a challenge is issued: `now`, less what the navigation `waited`
/// for its page (see [`Challenger::page_after`]).
#[derive(Clone, Copy)]
struct Issued {
    now: SystemTime,
    waited: Duration,
}

/// The `nonce` of a `/.weir/challenge/refresh?nonce=` link, decoded.
fn refresh_nonce(target: &Target) -> Option<String> {
    target.query().and_then(|q| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix("nonce="))
            .and_then(percent_decode)
    })
}

/// The nonce embedded in a challenge page's HTML (for tests and the lab's
/// simulated browsers, which answer with [`pow::solve`]).
pub fn page_nonce(html: &[u8]) -> Option<String> {
    let html = std::str::from_utf8(html).ok()?;
    let marker = "name=\"nonce\" value=\"";
    let start = html.find(marker)? + marker.len();
    let len = html[start..].find('"')?;
    Some(html[start..start + len].to_string())
}

/// The form a solved page posts to `/.weir/challenge/verify`, as the page's
/// script sends it (the nonce percent-encoded): for tests and the lab's
/// simulated browsers, beside [`page_nonce`].
pub fn answer_form(nonce: &str, counter: u64) -> String {
    let mut form = String::from("nonce=");
    for b in nonce.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                form.push(b as char)
            }
            _ => form.push_str(&format!("%{b:02X}")),
        }
    }
    form.push_str(&format!("&counter={counter}"));
    form
}

/// The User-Agent's raw bytes (empty when absent): what tokens are bound to.
pub fn user_agent(headers: &HeaderMap) -> &[u8] {
    headers
        .get(header::USER_AGENT)
        .map_or(&[], |v| v.as_bytes())
}

/// Whether a request to the challenge's paths carries the cookie its page
/// set: the browser keeps cookies.
fn keeps_cookies(headers: &HeaderMap) -> bool {
    weir_http::cookie::value(headers, page::COOKIE_PROBE).is_some()
}

/// `Sec-Fetch-Mode`, named once: a `&str` name is parsed on every lookup.
const SEC_FETCH_MODE: HeaderName = HeaderName::from_static("sec-fetch-mode");

/// A browser navigation: `Sec-Fetch-Mode: navigate` when the browser sends
/// fetch metadata (it then decides; a `fetch()` asking for HTML is not a
/// navigation), else an `Accept` that lists HTML with a non-zero q.
pub fn is_navigation(headers: &HeaderMap) -> bool {
    if let Some(mode) = headers.get(SEC_FETCH_MODE) {
        return mode.as_bytes().eq_ignore_ascii_case(b"navigate");
    }
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|range| {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim();
            let html = media.eq_ignore_ascii_case("text/html")
                || media.eq_ignore_ascii_case("application/xhtml+xml");
            let q_zero = parts.any(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            html && !q_zero
        })
}

/// Whether the client of a navigation is a browser, which can pass the
/// page (by its script, or without JavaScript by its refresh): one that
/// sends fetch metadata (every engine since 2023), or else a User-Agent
/// that starts as browsers' do and names no crawler.
///
/// Why: a client that cannot pass the page gets nothing from it. A search
/// or archive crawler, a link preview and a text browser send `text/html`
/// and no fetch metadata; shown the page, a preview shows the page's title
/// instead of the app's, and a text browser stops there. They meet the
/// rules and the lowest lane instead, as `curl` does. A crawler that drops
/// its fetch metadata to skip the page gains nothing it would not get by
/// asking for `*/*`.
pub fn is_browser(headers: &HeaderMap) -> bool {
    if headers.contains_key(SEC_FETCH_MODE) {
        return true;
    }
    let ua = user_agent(headers);
    ua.starts_with(b"Mozilla/")
        && !NOT_A_BROWSER
            .iter()
            .any(|word| ua.windows(word.len()).any(|w| w.eq_ignore_ascii_case(word)))
}

/// Words in a User-Agent that starts as a browser's which say its client is
/// none: crawlers (`Googlebot`, `bingbot`, `archive.org_bot`, `Slurp`),
/// link previews (`facebookexternalhit`, `Discordbot`, `Twitterbot`) and
/// the `(compatible; ...)` that crawlers and the browsers too old to run
/// the page (Internet Explorer 10 and before) put in theirs.
const NOT_A_BROWSER: &[&[u8]] = &[
    b"bot",
    b"crawl",
    b"spider",
    b"slurp",
    b"archive",
    b"externalhit",
    b"preview",
    b"compatible;",
];

/// `nonce=...&counter=...` from an `application/x-www-form-urlencoded` body.
fn parse_answer(body: &[u8]) -> Option<(String, u64)> {
    let text = std::str::from_utf8(body).ok()?;
    let mut nonce = None;
    let mut counter = None;
    for pair in text.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "nonce" => nonce = Some(percent_decode(v)?),
            "counter" => counter = Some(percent_decode(v)?.parse::<u64>().ok()?),
            _ => {}
        }
    }
    Some((nonce?, counter?))
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// A request to one of the challenge's paths that it does not serve,
/// answered by the rescue as any refusal (`x-weir-reason`, the access log's
/// `rule`, decision `reject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointRefusal {
    /// Not the path's method: `405` with `Allow`.
    MethodNotAllowed { allow: &'static str },
    /// The no-script refresh while `no_script` is off: `404`, as for any
    /// path weir does not serve.
    NoScriptOff,
}

impl crate::respond::Reason for EndpointRefusal {
    fn status(&self) -> StatusCode {
        match self {
            EndpointRefusal::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            EndpointRefusal::NoScriptOff => StatusCode::NOT_FOUND,
        }
    }

    fn label(&self) -> &str {
        match self {
            EndpointRefusal::MethodNotAllowed { .. } => "challenge_method_not_allowed",
            EndpointRefusal::NoScriptOff => "challenge_no_script_off",
        }
    }

    fn message(&self) -> String {
        match self {
            EndpointRefusal::MethodNotAllowed { allow } => {
                format!("this path takes {allow} only")
            }
            EndpointRefusal::NoScriptOff => "no such path".into(),
        }
    }

    fn side(&self) -> crate::respond::Side {
        crate::respond::Side::Client
    }

    fn extra_fields(&self, h: &mut HeaderMap) {
        if let EndpointRefusal::MethodNotAllowed { allow } = self {
            h.insert(header::ALLOW, HeaderValue::from_static(allow));
        }
    }
}

fn check_paths(
    key: &'static str,
    items: &[String],
    must_be_path: bool,
) -> Result<(), ChallengeConfigError> {
    for (index, item) in items.iter().enumerate() {
        let reason = if item.is_empty() {
            Some("is empty (it would match everything)")
        } else if must_be_path && !item.starts_with('/') {
            Some("must start with `/`")
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(ChallengeConfigError::BadEntry {
                key,
                index,
                value: item.clone(),
                reason,
            });
        }
    }
    Ok(())
}

/// Checks that the challenge's durations, difficulties and pressure
/// settings are within their ranges; the first one out of range is the
/// error.
fn check_ranges(c: &ChallengeConfig) -> Result<(), ChallengeConfigError> {
    let range = |key, ok: bool, value: String, range| {
        if ok {
            Ok(())
        } else {
            Err(ChallengeConfigError::OutOfRange { key, value, range })
        }
    };
    let secs = |d: &crate::config::ConfigDuration| format!("{d:?}");
    range(
        "pass_ttl",
        (60..=7 * 86400).contains(&c.pass_ttl.0.as_secs()),
        secs(&c.pass_ttl),
        "1m ..= 7days",
    )?;
    range(
        "solve_ttl",
        (10..=3600).contains(&c.solve_ttl.0.as_secs()),
        secs(&c.solve_ttl),
        "10s ..= 1h",
    )?;
    range(
        "difficulty",
        (8..=pow::MAX_BITS).contains(&c.difficulty),
        c.difficulty.to_string(),
        "8 ..= 28",
    )?;
    range(
        "max_difficulty",
        (c.difficulty..=pow::MAX_BITS).contains(&c.max_difficulty),
        c.max_difficulty.to_string(),
        "difficulty ..= 28",
    )?;
    let p = &c.pressure;
    range(
        "pressure.queue_depth",
        p.queue_depth >= 4,
        p.queue_depth.to_string(),
        ">= 4 (disengage is below a quarter of it)",
    )?;
    range("pressure.wait", !p.wait.0.is_zero(), secs(&p.wait), "> 0")?;
    range(
        "no_script_delay",
        (Duration::from_millis(100)..=Duration::from_secs(60)).contains(&c.no_script_delay.0),
        secs(&c.no_script_delay),
        "100ms ..= 1m",
    )?;
    range(
        "pressure.step_after",
        !p.step_after.0.is_zero(),
        secs(&p.step_after),
        "> 0",
    )
}

/// A cookie name weir can set without quoting: non-empty ASCII letters,
/// digits, `_` and `-`.
fn check_cookie_name(name: &str) -> Result<(), ChallengeConfigError> {
    if !weir_http::cookie::is_settable_name(name) {
        return Err(ChallengeConfigError::CookieName(name.to_owned()));
    }
    Ok(())
}

/// Checks the exempt paths, prefixes and query keys, and refuses the
/// removed `exempt_suffixes`.
fn check_exemptions(c: &ChallengeConfig) -> Result<(), ChallengeConfigError> {
    check_paths("exempt_paths", &c.exempt_paths, true)?;
    check_paths("exempt_prefixes", &c.exempt_prefixes, true)?;
    if c.exempt_suffixes.is_some() {
        return Err(ChallengeConfigError::SuffixesRemoved);
    }
    check_paths("exempt_query_keys", &c.exempt_query_keys, false)
}

/// The `good_bots` entries: each needs a User-Agent of at least three
/// characters, and its `cidrs` (when given) must parse.
fn parse_good_bots(c: &ChallengeConfig) -> Result<Vec<GoodBot>, ChallengeConfigError> {
    let mut good_bots = Vec::with_capacity(c.good_bots.len());
    for (i, bot) in c.good_bots.iter().enumerate() {
        if bot.user_agent.trim().len() < 3 {
            return Err(ChallengeConfigError::BotUserAgent {
                index: i,
                value: bot.user_agent.clone(),
            });
        }
        let networks = if bot.cidrs.is_empty() {
            None
        } else {
            Some(TrustedProxies::parse(&bot.cidrs).map_err(|source| {
                ChallengeConfigError::Cidr {
                    key: format!("good_bots[{i}].cidrs"),
                    source,
                }
            })?)
        };
        good_bots.push(GoodBot {
            name: bot.name.clone(),
            user_agent: bot.user_agent.clone(),
            networks,
        });
    }
    Ok(good_bots)
}

#[cfg(test)]
mod tests;
