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
//! use weir::challenge::{Asker, At, ChallengeBudget, ChallengeConfig, Challenger, PassCheck, PassKind, pow};
//! use weir::identity::{AddrSource, ClientAddr, ClientId, PeerAddr};
//! use weir_http::target::{PathPolicy, Target};
//!
//! let config = ChallengeConfig {
//!     keys: vec!["0123456789abcdef0123456789abcdef".into()],
//!     difficulty: 8,
//!     ..ChallengeConfig::default()
//! };
//! let challenger = Challenger::new(&config).unwrap();
//! let budget = ChallengeBudget::default(); // the process's, across reloads
//! let peer: std::net::SocketAddr = "203.0.113.7:50000".parse().unwrap();
//! let client = ClientId { peer: PeerAddr(peer), client: ClientAddr::new(peer.ip()), source: AddrSource::Peer };
//! let at = At { now: SystemTime::now(), budget: &budget };
//! let mut headers = http::HeaderMap::new();
//! headers.insert("accept", "text/html".parse().unwrap());
//! headers.insert("user-agent", "Mozilla/5.0".parse().unwrap());
//! let page_target = Target::parse("GET", "/wiki/Page", Some("wiki.example"), PathPolicy::default()).unwrap();
//!
//! let navigation = weir::challenge::is_navigation(&headers);
//! assert!(challenger.eligible(&page_target, &headers, navigation, &client));
//! assert_eq!(challenger.pass(&headers, &client, at.now), PassCheck::Missing);
//! let asker = Asker { client: &client, headers: &headers, tls: true };
//! let page = challenger.page(&page_target, asker, challenger.base_difficulty(), at);
//! assert_eq!(page.headers()["x-weir-challenge"], "1");
//! // The page's probe cookie, which the browser sends back with its answer.
//! let probe = page.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_owned();
//!
//! // What the page's script does:
//! let nonce = weir::challenge::page_nonce(page.body()).unwrap();
//! let counter = pow::solve(&nonce, 8);
//! let form = weir::challenge::answer_form(&nonce, counter);
//! let verify = Target::parse("POST", "/.weir/challenge/verify", Some("wiki.example"), PathPolicy::default()).unwrap();
//! headers.insert("cookie", probe.parse().unwrap());
//! let asker = Asker { client: &client, headers: &headers, tls: true };
//! let answer = challenger
//!     .handle(&verify, asker, form.as_bytes(), at)
//!     .expect("a challenge path")
//!     .expect("answered from the page's browser");
//! assert_eq!(answer.status(), 303);
//! assert_eq!(answer.headers()["location"], "/wiki/Page");
//! let cookie = answer.headers()["set-cookie"].to_str().unwrap();
//! assert!(cookie.starts_with("weir_pass=") && cookie.contains("; Secure"));
//!
//! headers.insert("cookie", cookie.split(';').next().unwrap().parse().unwrap());
//! assert!(matches!(challenger.pass(&headers, &client, at.now), PassCheck::Valid(p) if p.kind == PassKind::Work));
//! ```
//!
//! Owns: [`Challenger`] (eligibility, pass check, page, the `/.weir/` paths),
//! [`token`] (the cookie and its kinds), [`pow`] (the work), [`page`]
//! (HTML, script, CSP), [`pressure`] (when `under_pressure` engages),
//! [`budget`] (what one network may draw), [`secret`] (keeping the pass
//! one) and the `[challenge]` config ([`ChallengeConfig`],
//! [`ChallengeMode`]). Does not: read request bodies (the caller hands
//! [`Challenger::handle`] at most [`MAX_VERIFY_BODY`] bytes), keep any
//! per-client state (the budget is per network), decide what a pass is
//! worth (`proxy::deciding`: proof for work, or a wait in a person's
//! visit), rate-limit pass holders (the rules do, keyed by
//! [`PassToken::id`]) or record metrics (it returns [`ChallengeEvent`]s).
//! See `docs/challenge.md`.

pub mod budget;
pub mod config;
pub mod elsewhere;
pub mod fleet_key;
pub mod keyfile;
pub mod keyring;
pub mod page;
pub mod pow;
pub mod pressure;
pub mod secret;
pub mod token;

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode};
use weir_http::target::Target;

pub use budget::ChallengeBudget;
pub use config::{
    ChallengeConfig, ChallengeConfigError, ChallengeMode, ChallengeText, GoodBotConfig,
    PressureConfig, SecureCookies,
};
pub use page::{CHALLENGE_HEADER, REFRESH_PATH, SCRIPT_PATH, VERIFY_PATH};
pub use pow::PowRejection;
pub use pressure::{Pressure, PressureChange, PressureSettings};
pub use token::{PassKind, PassToken, TokenRejection};

use crate::identity::{ClientId, TrustedProxies};
use budget::Draw;
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
    /// Its mark in the access log (`challenge`).
    pub fn mark(&self) -> crate::evidence::ChallengeMark {
        use crate::evidence::ChallengeMark;
        match self {
            ChallengeEvent::Issued { .. } => ChallengeMark::Issued,
            ChallengeEvent::Solved { .. } => ChallengeMark::Solved,
            ChallengeEvent::Failed(_) => ChallengeMark::Failed,
            ChallengeEvent::PassAdmitted { .. } => ChallengeMark::PassAdmitted,
            ChallengeEvent::PassRejected(_) => ChallengeMark::PassRejected,
        }
    }

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
    secure: SecureCookies,
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
            secure: c.secure_cookies,
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

    /// When weir's cookies (the pass, the page's probe, the visit) go out
    /// `Secure`.
    pub fn secure_cookies(&self) -> SecureCookies {
        self.secure
    }

    /// The pass on this request, checked with no store against the
    /// `pass_ttl` in force. Any one valid pass among several is enough:
    /// several `weir_pass` cookies, or several passes side by side in one
    /// (other instances', see [`elsewhere`]).
    pub fn pass(&self, headers: &HeaderMap, client: &ClientId, now: SystemTime) -> PassCheck {
        // The binding (two SHA-256 digests) only for a request that carries
        // a pass: most carry none, and it was a seventh of a request's work
        // (bench/README.md, "TLS and HTTP/2 under callgrind").
        let mut binding = None;
        let mut first_rejection = None;
        let values = weir_http::cookie::values(headers, &self.cookie_name);
        for value in values.flat_map(token::side_by_side) {
            let binding =
                *binding.get_or_insert_with(|| Binding::of(client.client, user_agent(headers)));
            match token::verify(&self.token_keys, value, binding, now, self.pass_ttl) {
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
        asker: Asker<'_>,
        difficulty: u8,
        at: At<'_>,
    ) -> Response<Bytes> {
        self.page_after(target, asker, difficulty, at, Duration::ZERO)
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
    ///
    /// The nonce's seed (its pass's id) is a fresh one while the client's
    /// network is within its budget of pages ([`budget`]), else the
    /// network's own.
    pub fn page_after(
        &self,
        target: &Target,
        asker: Asker<'_>,
        difficulty: u8,
        at: At<'_>,
        waited: Duration,
    ) -> Response<Bytes> {
        let binding = asker.binding();
        let seed = at.draw(Draw::Page, binding, rand::random::<u64>());
        let challenge = pow::issue(
            &self.pow_keys,
            binding,
            difficulty,
            seed,
            target.path_and_query(),
            at.now.checked_sub(waited).unwrap_or(at.now),
        );
        let probe = self.probe_cookie(seed, asker.tls);
        let mut resp = self
            .template
            .render(&challenge.nonce, challenge.difficulty, waited, &probe);
        resp.extensions_mut()
            .insert(ChallengeEvents(vec![ChallengeEvent::Issued {
                difficulty: challenge.difficulty,
            }]));
        resp
    }

    /// The `Set-Cookie` of a page's probe ([`page::COOKIE_PROBE`]): named
    /// after the page's seed, so each page's answer can tell whether the
    /// browser that brings it was shown that page, and two tabs' pages do
    /// not overwrite each other's; sent only to the challenge's own paths,
    /// for as long as the page can be answered.
    fn probe_cookie(&self, seed: u64, tls: bool) -> String {
        let mut cookie = format!(
            "{}{seed:016x}=1; Path={CHALLENGE_PATHS}; Max-Age={}; HttpOnly; SameSite=Lax",
            page::COOKIE_PROBE,
            self.solve_ttl.as_secs()
        );
        if self.secure.applies(tls) {
            cookie.push_str("; Secure");
        }
        cookie
    }

    /// Whether `uri` is one of the paths [`Challenger::handle`] serves (so
    /// the caller knows to read up to [`MAX_VERIFY_BODY`] bytes of body).
    pub fn is_challenge_path(&self, path: &str) -> bool {
        matches!(path, SCRIPT_PATH | VERIFY_PATH | REFRESH_PATH)
    }

    /// Serves `/.weir/challenge.js`, `/.weir/challenge/verify` and
    /// `/.weir/challenge/refresh` (the no-script link); `None` for every
    /// other path. Events are in the response's extensions.
    ///
    /// An answer or a link is redeemed ([`Challenger::redeem`]) only from
    /// the page's own site (never `Sec-Fetch-Site: cross-site` or
    /// `same-site`, nor an `Origin` of another host), and only for a nonce
    /// weir signed: anything else is refused with its [`EndpointRefusal`]
    /// (a plain `403`, no nonce: junk mints nothing). A request to one of
    /// these paths in a method they do not take is refused too.
    pub fn handle(
        &self,
        target: &Target,
        asker: Asker<'_>,
        body: &[u8],
        at: At<'_>,
    ) -> Option<Result<Response<Bytes>, EndpointRefusal>> {
        let method = target.method();
        let read = method == Method::GET || method == Method::HEAD;
        let refused = |allow| Err(EndpointRefusal::MethodNotAllowed { allow });
        Some(match target.path() {
            SCRIPT_PATH if read => Ok(self.template.script()),
            SCRIPT_PATH => refused("GET, HEAD"),
            VERIFY_PATH if method == Method::POST => self.verify(target, asker, body, at),
            VERIFY_PATH => refused("POST"),
            REFRESH_PATH if read => self.refresh(target, asker, at),
            REFRESH_PATH => refused("GET, HEAD"),
            _ => return None,
        })
    }

    /// `POST /.weir/challenge/verify`: the page's answer.
    fn verify(
        &self,
        target: &Target,
        asker: Asker<'_>,
        body: &[u8],
        at: At<'_>,
    ) -> Result<Response<Bytes>, EndpointRefusal> {
        let answer = (body.len() <= MAX_VERIFY_BODY)
            .then(|| parse_answer(body))
            .flatten();
        let Some((nonce, counter)) = answer else {
            return Err(EndpointRefusal::Forged(PowRejection::Malformed));
        };
        self.redeem(target, asker, &nonce, at, |binding| {
            pow::verify(
                &self.pow_keys,
                &nonce,
                counter,
                binding,
                self.solve_ttl,
                at.now,
            )
            .map(|solved| (solved, PassKind::Work))
        })
    }

    /// `GET /.weir/challenge/refresh?nonce=`: a browser without JavaScript
    /// that waited `no_script_delay` gets a [`PassKind::Wait`] pass; with
    /// `no_script` off, 404 (weir serves no such path then).
    fn refresh(
        &self,
        target: &Target,
        asker: Asker<'_>,
        at: At<'_>,
    ) -> Result<Response<Bytes>, EndpointRefusal> {
        let Some(wait) = self.no_script_delay else {
            return Err(EndpointRefusal::NoScriptOff);
        };
        let Some(nonce) = refresh_nonce(target) else {
            return Err(EndpointRefusal::Forged(PowRejection::Malformed));
        };
        self.redeem(target, asker, &nonce, at, |binding| {
            pow::verify_waited(
                &self.pow_keys,
                &nonce,
                binding,
                wait,
                self.solve_ttl,
                at.now,
            )
            .map(|solved| (solved, PassKind::Wait))
        })
    }

    /// Redeems `nonce` for a pass of the kind `check` finds, in order:
    ///
    /// 1. from the page's own site ([`cross_site`]), else refused;
    /// 2. a nonce weir signed, else refused (a plain `403`: no new nonce);
    /// 3. brought by the browser that was shown its page: the page set a
    ///    probe cookie named after it, and a browser that brings other
    ///    pages' probes but not this one's was sent by someone else's page
    ///    (refused: it would overwrite that browser's pass with another's);
    /// 4. `check`: the work or the wait, the age, the network and browser.
    ///    A signed nonce that fails it is answered `303` back to its page,
    ///    which decides afresh (a new page if the visitor still needs one;
    ///    nothing is minted here).
    ///
    /// The pass: `303` to where the visitor was going, with the cookie when
    /// the browser brought this page's probe (it keeps cookies), else in
    /// the address only: a browser that keeps no cookies would be sent
    /// back to the page, again and again, and one that was not shown the
    /// page keeps the pass it had. Its id is the nonce's seed while the
    /// network is within its budget of passes, else the network's.
    fn redeem(
        &self,
        target: &Target,
        asker: Asker<'_>,
        nonce: &str,
        at: At<'_>,
        check: impl FnOnce(Binding) -> Result<(pow::Solved, PassKind), PowRejection>,
    ) -> Result<Response<Bytes>, EndpointRefusal> {
        if cross_site(asker.headers, target) {
            return Err(EndpointRefusal::CrossSite);
        }
        let opened = match pow::open(&self.pow_keys, nonce) {
            // Signed by another instance, or forged: sent on to the
            // others ([`elsewhere`]) until the hops are spent.
            Err(PowRejection::BadSignature) => {
                return elsewhere::try_another_instance(target)
                    .ok_or(EndpointRefusal::Forged(PowRejection::BadSignature));
            }
            opened => opened.map_err(EndpointRefusal::Forged)?,
        };
        let jar = match probe(asker.headers, opened.seed) {
            Probe::This => true,
            Probe::None => false,
            Probe::Others => return Err(EndpointRefusal::NotShownThePage),
        };
        let binding = asker.binding();
        match check(binding) {
            Ok((solved, kind)) => {
                let values = elsewhere::pass_values(asker.headers, &self.cookie_name);
                let others = elsewhere::others_passes(
                    &self.token_keys,
                    values,
                    binding,
                    at.now,
                    self.pass_ttl,
                );
                let to = (binding, jar, &others[..]);
                Ok(self.solved(&solved, kind, to, asker.tls, at))
            }
            Err(reason) => Ok(back_to_the_page(&opened.return_path, reason)),
        }
    }

    /// A redeemed nonce's response: `303` back to where the visitor was
    /// going, with the pass cookie when the browser keeps cookies (`jar`),
    /// else the pass in the address (see [`Challenger::redeem`]); `others`,
    /// other instances' passes, kept beside it.
    fn solved(
        &self,
        solved: &pow::Solved,
        kind: PassKind,
        (binding, jar, others): (Binding, bool, &[&str]),
        tls: bool,
        at: At<'_>,
    ) -> Response<Bytes> {
        let id = at.draw(Draw::Pass, binding, solved.seed);
        if kind == PassKind::Work {
            at.solved(binding);
        }
        let minted = token::Minted {
            id,
            kind,
            now: at.now,
            ttl: self.pass_ttl,
        };
        // Beside the passes other instances signed (see [`elsewhere`]).
        let cookie = elsewhere::beside(&token::issue(&self.token_keys, minted, binding), others);
        let mut resp = Response::new(Bytes::new());
        *resp.status_mut() = StatusCode::SEE_OTHER;
        let h = resp.headers_mut();
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
        // Both values are ASCII built here: a checked local path and
        // base64; fall back to `/` rather than fail.
        h.insert(
            header::LOCATION,
            HeaderValue::from_str(&location).unwrap_or(HeaderValue::from_static("/")),
        );
        if let Some(v) = jar.then(|| self.pass_cookie(&cookie, tls)).flatten() {
            h.insert(header::SET_COOKIE, v);
        }
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        resp.extensions_mut()
            .insert(ChallengeEvents(vec![ChallengeEvent::Solved {
                difficulty: solved.difficulty,
                time_to_solve: at.now.duration_since(solved.issued).unwrap_or_default(),
                pass_id: id,
                no_script: kind == PassKind::Wait,
            }]));
        resp
    }

    /// The pass's `Set-Cookie` for a browser that keeps cookies.
    fn pass_cookie(&self, cookie: &str, tls: bool) -> Option<HeaderValue> {
        let mut set_cookie = format!(
            "{}={cookie}; Path=/; Max-Age={}; HttpOnly; SameSite=Lax",
            self.cookie_name,
            self.pass_ttl.as_secs()
        );
        if self.secure.applies(tls) {
            set_cookie.push_str("; Secure");
        }
        HeaderValue::from_str(&set_cookie).ok()
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
        asker: Asker<'_>,
        now: SystemTime,
    ) -> Option<Duration> {
        let wait = self.no_script_delay?;
        let method = target.method();
        if target.path() != REFRESH_PATH || !(method == Method::GET || method == Method::HEAD) {
            return None;
        }
        if cross_site(asker.headers, target) {
            return None;
        }
        let nonce = refresh_nonce(target)?;
        pow::wait_left(
            &self.pow_keys,
            &nonce,
            asker.binding(),
            wait,
            self.solve_ttl,
            now,
        )
        .ok()
        .filter(|left| !left.is_zero())
    }
}

/// The challenge's own paths: the probe cookie's `Path`.
const CHALLENGE_PATHS: &str = "/.weir/challenge/";

/// Who asks, as the challenge's pages and answers depend on it.
#[derive(Clone, Copy)]
pub struct Asker<'a> {
    pub client: &'a ClientId,
    pub headers: &'a HeaderMap,
    /// The client reached weir over TLS: weir's listener, or a trusted
    /// proxy that said so (`X-Forwarded-Proto: https`). Weir's cookies are
    /// then `Secure` (see [`SecureCookies`]).
    pub tls: bool,
}

impl Asker<'_> {
    /// What a pass or a nonce is bound to: the client's network and browser.
    fn binding(&self) -> Binding {
        Binding::of(self.client.client, user_agent(self.headers))
    }
}

/// When the challenge answers, and the per-network budget it draws ids
/// from (the process's, kept across reloads).
#[derive(Clone, Copy)]
pub struct At<'a> {
    pub now: SystemTime,
    pub budget: &'a ChallengeBudget,
}

impl At<'_> {
    fn draw(&self, draw: Draw, binding: Binding, fresh: u64) -> u64 {
        use weir_limiter::Clock as _;
        self.budget
            .id(draw, binding, fresh, weir_limiter::MonotonicClock.now())
    }

    /// Counts a solve of the page's work by `binding`'s browser.
    fn solved(&self, binding: Binding) {
        use weir_limiter::Clock as _;
        self.budget
            .solved(binding, weir_limiter::MonotonicClock.now());
    }

    /// The pass id to admit `asker` with instead of another challenge, if
    /// its browser is in a loop ([`ChallengeBudget::looping`]).
    pub fn looping(&self, asker: Asker<'_>) -> Option<u64> {
        use weir_limiter::Clock as _;
        self.budget
            .looping(asker.binding(), weir_limiter::MonotonicClock.now())
    }
}

/// Whether a request to the challenge's paths comes from another site's
/// page: fetch metadata that says `cross-site` or `same-site` (a sibling
/// subdomain is another site's page too), or, from a browser that sends
/// none, an `Origin` that is not this host. A meta refresh and the page's
/// own form are `same-origin`; a typed or bookmarked link `none`.
fn cross_site(headers: &HeaderMap, target: &Target) -> bool {
    if let Some(site) = headers.get(SEC_FETCH_SITE) {
        let site = site.as_bytes();
        return !(site.eq_ignore_ascii_case(b"same-origin") || site.eq_ignore_ascii_case(b"none"));
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return false;
    };
    let host = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, host)| host);
    let ours = target.authority().map(|a| a.as_str());
    host.is_none() || ours.is_none_or(|ours| !host.is_some_and(|h| h.eq_ignore_ascii_case(ours)))
}

/// `Sec-Fetch-Site`, named once.
const SEC_FETCH_SITE: HeaderName = HeaderName::from_static("sec-fetch-site");

/// Which of the challenge's probe cookies an answer brings.
enum Probe {
    /// This page's: the browser was shown it, and keeps cookies.
    This,
    /// None: a browser that keeps no cookies.
    None,
    /// Other pages' only: a browser that keeps cookies and was not shown
    /// this page (someone else's page sent it here).
    Others,
}

fn probe(headers: &HeaderMap, seed: u64) -> Probe {
    let ours = format!("{}{seed:016x}", page::COOKIE_PROBE);
    let mut any = false;
    for name in weir_http::cookie::names(headers) {
        if name == ours {
            return Probe::This;
        }
        any |= name.starts_with(page::COOKIE_PROBE);
    }
    if any { Probe::Others } else { Probe::None }
}

/// The answer to a nonce weir signed that did not earn a pass (a wrong
/// counter, expired, another network or browser, a link followed too
/// early): back to its page, which decides afresh, and counted as failed.
fn back_to_the_page(return_path: &str, reason: PowRejection) -> Response<Bytes> {
    let mut resp = Response::new(Bytes::new());
    *resp.status_mut() = StatusCode::SEE_OTHER;
    let h = resp.headers_mut();
    h.insert(
        header::LOCATION,
        HeaderValue::from_str(return_path).unwrap_or(HeaderValue::from_static("/")),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp.extensions_mut()
        .insert(ChallengeEvents(vec![ChallengeEvent::Failed(reason)]));
    resp
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

/// The probe cookie (`name=value`) a challenge page's HTML set, as its
/// browser sends it back with the answer: for tests and the lab's
/// simulated browsers, beside [`page_nonce`].
pub fn page_probe(html: &[u8]) -> Option<String> {
    let seed = pow::seed_of(&page_nonce(html)?)?;
    Some(format!("{}{seed:016x}=1", page::COOKIE_PROBE))
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
    /// Sent by another site's page (`Sec-Fetch-Site`, `Origin`): `403`.
    CrossSite,
    /// A nonce weir did not sign, or no nonce: `403`, and no new nonce.
    Forged(PowRejection),
    /// A browser that keeps cookies brought a nonce whose page it was not
    /// shown (its probe cookie is missing): `403`.
    NotShownThePage,
}

impl EndpointRefusal {
    /// The event a refusal counts as: a failed answer, for those that
    /// brought one.
    pub fn event(&self) -> Option<ChallengeEvent> {
        match self {
            EndpointRefusal::Forged(r) => Some(ChallengeEvent::Failed(*r)),
            EndpointRefusal::CrossSite => Some(ChallengeEvent::Failed(PowRejection::CrossSite)),
            EndpointRefusal::NotShownThePage => {
                Some(ChallengeEvent::Failed(PowRejection::NotShownThePage))
            }
            EndpointRefusal::MethodNotAllowed { .. } | EndpointRefusal::NoScriptOff => None,
        }
    }
}

impl crate::respond::Reason for EndpointRefusal {
    fn status(&self) -> StatusCode {
        match self {
            EndpointRefusal::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            EndpointRefusal::NoScriptOff => StatusCode::NOT_FOUND,
            EndpointRefusal::CrossSite
            | EndpointRefusal::Forged(_)
            | EndpointRefusal::NotShownThePage => StatusCode::FORBIDDEN,
        }
    }

    fn label(&self) -> &str {
        match self {
            EndpointRefusal::MethodNotAllowed { .. } => "challenge_method_not_allowed",
            EndpointRefusal::NoScriptOff => "challenge_no_script_off",
            EndpointRefusal::CrossSite => "challenge_cross_site",
            EndpointRefusal::Forged(_) => "challenge_forged",
            EndpointRefusal::NotShownThePage => "challenge_not_shown_the_page",
        }
    }

    fn message(&self) -> String {
        match self {
            EndpointRefusal::MethodNotAllowed { allow } => {
                format!("this path takes {allow} only")
            }
            EndpointRefusal::NoScriptOff => "no such path".into(),
            EndpointRefusal::CrossSite => "the check is answered from its own page only".into(),
            EndpointRefusal::Forged(_) => "not a check this site gave".into(),
            EndpointRefusal::NotShownThePage => {
                "this browser was not shown that check; open the page again".into()
            }
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
