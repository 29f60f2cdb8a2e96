//! The visit: a first-party cookie weir sets and signs on the pages it
//! serves, counting the page views of one visit and its age, so that
//! "browsing" is a visit weir itself saw rather than a header anyone can
//! write (a same-site `Referer` costs a crawler one header, so crawlers
//! that send it would be counted as people).
//!
//! ```text
//! GET /wiki/A  (no cookie)        ─► page ─► Set-Cookie: weir_visit=<1 view, started now>
//! GET /wiki/B  (weir_visit: 1)    ─► page ─► Set-Cookie: weir_visit=<2 views, same start>
//! ...
//! GET /?search=x (weir_visit: 5 views, 0 costly, 3 min) ─► "browsing": evidence of a person
//! ```
//!
//! A visit counts the pages weir served in it (`views`) and the navigations
//! to costly pages (`costly`: of a class the operator limited, or one the
//! app answers slowly), served or refused; a costly page served is not a
//! view. A request a rule judges is costly itself, and is browsing when its
//! visit has [`VisitConfig::min_views`] views or more, at least
//! [`VIEWS_PER_COSTLY`] for each costly navigation (this one included),
//! over [`VisitConfig::min_age`] or more: people read pages, and now and
//! then search; a crawler after the costly pages fetches an article before
//! each.
//!
//! Format (version 1), base64url without padding of 61 bytes, 82 characters:
//!
//! ```text
//! offset  bytes  field
//!      0      1  version = 1
//!      1      4  started    (Unix seconds, big-endian)
//!      5      4  last       (Unix seconds of the last answer counted)
//!      9      2  views      (pages served in the visit, not costly, saturating)
//!     11      2  costly     (navigations to costly pages answered, saturating)
//!     13      8  prefix tag (the client's /24 or /48, as the pass)
//!     21      8  agent tag  (the User-Agent, as the pass)
//!     29     32  HMAC-SHA256 over bytes 0..29 (visit key, see challenge/keyring.rs)
//! ```
//!
//! A visit with a page served before this request, and two for each costly
//! navigation, also earns its requests a turn of their own in admission,
//! and lifts its cheap pages out of the `newcomers` lane
//! ([`RequestVisit::turn`]): priority among people, not an exemption.
//!
//! What it costs a crawler to be counted as browsing: keep a cookie per /24
//! and User-Agent, fetch [`VisitConfig::min_views`] pages that weir serves,
//! two for each costly one it asks for, and wait [`VisitConfig::min_age`].
//! A person's visit costs that anyway. A crawler that keeps one good cookie
//! and drops the ones weir sends after its slow pages escapes the ratio,
//! not the pages and the wait, and only from one /24 and browser.
//!
//! Owns: the `[visit]` table, the cookie's format, reading it from a request,
//! the visit's turn, and making the next one for a page served. Does not: decide what a visit
//! is evidence for (`policy::rules::collateral_signal`), keep any state per
//! client (the cookie is the state), or choose which responses carry it (the
//! proxy's respond phase asks [`Visits::next`]).

use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::header::{self, HeaderMap, HeaderValue};
use serde::Deserialize;

use crate::challenge::keyring::{Binding, Keyring, Purpose, TAG_LEN};
use crate::challenge::token::{MAX_SIDE_BY_SIDE, SIDE_BY_SIDE};
use crate::config::ConfigDuration;
use crate::identity::ClientId;

const VERSION: u8 = 1;
const BODY_LEN: usize = 29;
/// Pages served for each costly navigation, the judged one included, in a
/// visit that is browsing. People on the 2026-09-23 wiki read about six
/// pages a search, its crawlers one article before each expensive page;
/// three (as admission's browsing evidence asks of an address,
/// `admission::browsing::PAGES_PER_EXPENSIVE`) missed one person refused in
/// five in the lab, whose searches came close together.
pub const VIEWS_PER_COSTLY: u16 = 2;
/// Pages served in a visit before its next navigation waits in a turn of
/// its own (`RequestVisit::turn`). One: a visit's first page has no visit
/// yet, and people open a site with a few pages in a row; behind a carrier
/// NAT those waited in the carrier's one turn, 2-8 s at the 2026-09-23
/// flood's peak in the lab.
pub const TURN_MIN_VIEWS: u16 = 1;
/// Pages served in a visit before a no-script pass is proof in it
/// ([`RequestVisit::reads_more_than_it_costs`]).
pub const PROOF_MIN_VIEWS: u16 = 3;
const TOKEN_LEN: usize = BODY_LEN + TAG_LEN;
const TOKEN_CHARS: usize = (TOKEN_LEN * 4).div_ceil(3);

/// `[visit]`: the visit cookie and what makes a visit evidence of a person.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VisitConfig {
    /// `false`: no visit cookie is set or read, and no request is
    /// "browsing" (the collateral signals fall back to `low_rate` and
    /// `browser`).
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// The cookie's name.
    #[serde(default = "default_cookie")]
    pub cookie: String,
    /// Page views weir must have served in a visit, before a request, for
    /// that request to be "browsing". 3: a person reading a site opens a few
    /// pages; a crawler after expensive pages fetched one article first.
    #[serde(default = "default_min_views")]
    pub min_views: u16,
    /// How old the visit must be: several page views over minutes, as a
    /// person reads (1 minute by default). The lab sets it in story time.
    #[serde(default = "default_min_age")]
    pub min_age: ConfigDuration,
    /// A visit ends after this long without a page view (30 minutes, the
    /// visit of web analytics); the next page starts a new one.
    #[serde(default = "default_idle")]
    pub idle: ConfigDuration,
}

impl Default for VisitConfig {
    fn default() -> Self {
        VisitConfig {
            enabled: true,
            cookie: default_cookie(),
            min_views: default_min_views(),
            min_age: default_min_age(),
            idle: default_idle(),
        }
    }
}

fn default_true() -> bool {
    true
}
fn default_cookie() -> String {
    "weir_visit".into()
}
fn default_min_views() -> u16 {
    3
}
fn default_min_age() -> ConfigDuration {
    ConfigDuration::secs(60)
}
fn default_idle() -> ConfigDuration {
    ConfigDuration::secs(30 * 60)
}

/// Why `[visit]` cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VisitConfigError {
    #[error("cookie: {0:?} is not a cookie name (letters, digits, `_`, `-`)")]
    CookieName(String),
    #[error("min_views: 0 would make every request with the cookie browsing; at least 1")]
    NoViews,
    #[error("idle: at least 1 minute and at most 1 day, not {0:?}")]
    Idle(ConfigDuration),
    #[error("signing key: {0}")]
    Key(String),
}

/// One visit, as its cookie said (signature, network and User-Agent checked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Visit {
    /// When its first page was served (Unix seconds).
    pub started: u32,
    /// When its last page was served (Unix seconds).
    pub last: u32,
    /// Pages served in it so far that were not costly.
    pub views: u16,
    /// Navigations to costly pages answered in it so far, served or refused.
    pub costly: u16,
}

impl Visit {
    /// How long ago the visit started.
    pub fn age(&self, now: SystemTime) -> Duration {
        Duration::from_secs(u64::from(unix_secs(now).saturating_sub(self.started)))
    }
}

/// A request's visit as the request path carries it: what its cookie
/// said, whether the request is a navigation (only a navigation counts in
/// the visit and carries the next cookie; a page's scripts and images only
/// share its turn), whether the page answered to it counts as a view (a
/// `GET` navigation), and whether it asks for a costly page (the proxy
/// says, once routed).
#[derive(Debug, Clone)]
pub struct RequestVisit {
    pub prior: Option<Visit>,
    pub navigation: bool,
    pub page_view: bool,
    pub costly: bool,
    /// The client's binding, for the next cookie.
    binding: Binding,
    /// Visits other instances signed (a fleet that shares no key), side by
    /// side in the cookie with `.`: kept beside the next one, so that each
    /// instance counts its own and none overwrites another's.
    others: Option<Box<str>>,
}

impl RequestVisit {
    /// The visit as a turn of its own in admission's fair share, when its
    /// pages say a person is reading: at least [`TURN_MIN_VIEWS`] page
    /// served before this one, and [`VIEWS_PER_COSTLY`] for each costly
    /// navigation, this one included (no age asked: a turn is priority
    /// among equals, not an exemption). The browser-like crawler's article
    /// before each expensive page never earns one. The turn names the visit
    /// by when it started, its /24 (/48) and its browser: people behind one
    /// carrier NAT are as many turns as visits, and two who started in the
    /// same second on one /24 with one browser share one, which costs them
    /// nothing they had before.
    pub fn turn(&self) -> Option<u128> {
        let v = self.prior?;
        let costly = u32::from(v.costly) + u32::from(self.costly);
        let earned =
            v.views >= TURN_MIN_VIEWS && u32::from(v.views) >= u32::from(VIEWS_PER_COSTLY) * costly;
        earned.then(|| self.name(v))
    }

    /// A visit's name, for its turn: when it started, its /24 (/48) and
    /// its browser.
    fn name(&self, v: Visit) -> u128 {
        let [a, b, c, d, ..] = self.binding.agent;
        let agent = u32::from_be_bytes([a, b, c, d]);
        u128::from(v.started) << 96
            | u128::from(u64::from_be_bytes(self.binding.prefix)) << 32
            | u128::from(agent)
    }

    /// The visit as a person's, for this request: its turn (the visit's
    /// name) when its pages say a person is reading, by the measure this
    /// request needs: a cheap one [`RequestVisit::turn`]'s, a costly one
    /// (a search, an edit: what a crawler is after)
    /// [`RequestVisit::reads_more_than_it_costs`]. What ranks the request
    /// in admission's `visits` lane, above a pass alone.
    pub fn person(&self) -> Option<u128> {
        if !self.costly {
            return self.turn();
        }
        let v = self.prior?;
        self.reads_more_than_it_costs().then(|| self.name(v))
    }

    /// Whether the visit reads more than it costs, as people read: at
    /// least [`PROOF_MIN_VIEWS`] pages served before this request, and at
    /// least one and a half for each costly navigation, this one included.
    /// What makes a costly request of the visit a person's
    /// ([`RequestVisit::person`]), and a no-script pass proof
    /// (`proxy::deciding`).
    ///
    /// A ratio, not a difference: a crawler that reads an article before
    /// each expensive page, and now and then one more (1.25 a page in the
    /// lab), reads more pages than it costs by a margin that grows with
    /// every round, and stays below one and a half (its first rounds, with
    /// an extra article, can reach it). People read about six pages a
    /// search; one and a half, not [`VIEWS_PER_COSTLY`], so a person who
    /// searched twice after three pages, or four times in ten, still counts
    /// (the lab's people without JavaScript had one page in 170 wait out
    /// its timeout at two, and people with it who searched twice early
    /// waited out theirs among the crawlers). Three pages at least: a visit
    /// of two is a crawler's article, article, search as often as a
    /// person's.
    pub fn reads_more_than_it_costs(&self) -> bool {
        self.prior.is_some_and(|v| {
            let costly = u32::from(v.costly) + u32::from(self.costly);
            v.views >= PROOF_MIN_VIEWS && 2 * u32::from(v.views) >= 3 * costly
        })
    }
}

/// The visit cookie of one configuration: its keys and thresholds.
pub struct Visits {
    keys: Keyring,
    /// When the cookie is `Secure` (`challenge.secure_cookies`).
    secure: crate::challenge::SecureCookies,
    cookie: String,
    min_views: u16,
    min_age: Duration,
    idle: Duration,
}

impl std::fmt::Debug for Visits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Visits")
            .field("cookie", &self.cookie)
            .field("min_views", &self.min_views)
            .field("min_age", &self.min_age)
            .finish_non_exhaustive()
    }
}

impl Visits {
    /// The visit cookie for `c`, signed with keys derived from `secrets`
    /// (the challenge's, or weir's own: one secret, a key per purpose).
    pub fn new<S: AsRef<str>>(
        c: &VisitConfig,
        secrets: &[S],
        secure: crate::challenge::SecureCookies,
    ) -> Result<Visits, VisitConfigError> {
        if !weir_http::cookie::is_settable_name(&c.cookie) {
            return Err(VisitConfigError::CookieName(c.cookie.clone()));
        }
        if c.min_views == 0 {
            return Err(VisitConfigError::NoViews);
        }
        if !(Duration::from_secs(60)..=Duration::from_secs(86_400)).contains(&c.idle.0) {
            return Err(VisitConfigError::Idle(c.idle));
        }
        let keys = Keyring::new(secrets, Purpose::Visit)
            .map_err(|e| VisitConfigError::Key(e.to_string()))?;
        Ok(Visits {
            keys,
            secure,
            cookie: c.cookie.clone(),
            min_views: c.min_views,
            min_age: c.min_age.0,
            idle: c.idle.0,
        })
    }

    /// The cookie's name (the proxy keeps it from the app).
    pub fn cookie_name(&self) -> &str {
        &self.cookie
    }

    /// The request's visit: for a navigation, its cookie read (the first
    /// valid one) or a visit to start (only a navigation can be browsing,
    /// and only a `GET` one is a page view that carries the next cookie);
    /// for anything else (scripts, images, APIs), the visit its cookie
    /// carries if it carries one, for its turn in admission alone. Nothing
    /// is hashed for a request that is no navigation and has no cookie.
    /// `navigation` is [`crate::challenge::is_navigation`] of `headers`,
    /// read by the caller (the proxy reads it once for every phase that
    /// asks).
    pub fn read(
        &self,
        method: &http::Method,
        headers: &HeaderMap,
        navigation: bool,
        client: &ClientId,
        now: SystemTime,
    ) -> Option<RequestVisit> {
        let mut cookies = weir_http::cookie::values(headers, &self.cookie).peekable();
        if !navigation && cookies.peek().is_none() {
            return None;
        }
        let binding = Binding::of(client.client, crate::challenge::user_agent(headers));
        let (prior, others) = self.own_and_others(cookies, binding, now);
        if !navigation && prior.is_none() {
            return None;
        }
        Some(RequestVisit {
            prior,
            navigation,
            page_view: navigation && *method == http::Method::GET,
            costly: false,
            binding,
            others,
        })
    }

    /// The first going visit of this instance's among the cookie's values
    /// (each may hold several side by side), and the visits other
    /// instances signed, joined, at most [`MAX_SIDE_BY_SIDE`] − 1. A visit
    /// of this instance's that no longer counts (idle, another browser) is
    /// dropped: the next one replaces it.
    fn own_and_others<'a>(
        &self,
        values: impl Iterator<Item = &'a str>,
        binding: Binding,
        now: SystemTime,
    ) -> (Option<Visit>, Option<Box<str>>) {
        let mut prior = None;
        let mut others = String::new();
        let mut kept = 0;
        for value in values {
            for piece in value.split(SIDE_BY_SIDE).take(MAX_SIDE_BY_SIDE) {
                if prior.is_none() {
                    prior = self.verify(piece, binding, now);
                    if prior.is_some() {
                        continue;
                    }
                }
                if kept + 1 < MAX_SIDE_BY_SIDE && self.signed_elsewhere(piece) {
                    if kept > 0 {
                        others.push(SIDE_BY_SIDE);
                    }
                    others.push_str(piece);
                    kept += 1;
                }
            }
        }
        (prior, (kept > 0).then(|| others.into_boxed_str()))
    }

    /// Whether `piece` is spelled as a visit is and signed by none of this
    /// instance's keys: another instance's.
    fn signed_elsewhere(&self, piece: &str) -> bool {
        if piece.len() != TOKEN_CHARS {
            return false;
        }
        let Ok(raw) = URL_SAFE_NO_PAD.decode(piece) else {
            return false;
        };
        raw.len() == TOKEN_LEN
            && raw[0] == VERSION
            && !self.keys.verify(&raw[..BODY_LEN], &raw[BODY_LEN..])
    }

    /// Whether a costly request (one a rule judges) in `visit` is evidence
    /// of a person at `now`: at least `min_views` views, [`VIEWS_PER_COSTLY`]
    /// for each costly navigation and this one, over at least `min_age`.
    pub fn is_browsing(&self, visit: &Visit, now: SystemTime) -> bool {
        self.logged_is_browsing(visit.views, visit.costly, visit.age(now))
    }

    /// [`Visits::is_browsing`] of a visit as an access log line records it
    /// (`visit_views`, `visit_costly`, `visit_age_s`), for `weir replay`.
    pub fn logged_is_browsing(&self, views: u16, costly: u16, age: Duration) -> bool {
        views >= self.min_views
            && u32::from(views) >= u32::from(VIEWS_PER_COSTLY) * (u32::from(costly) + 1)
            && age >= self.min_age
    }

    /// The `Set-Cookie` for the answer to `visit`'s request, when it counts:
    /// a page served (a `GET`, 2xx) that is not costly is a view; a costly
    /// navigation counts as costly however it is answered (the app's page, weir's refusal or
    /// challenge). Never on an answer a shared cache may keep (`public`,
    /// `s-maxage`: a page cached with a visit would hand it to everyone, and
    /// caches that refuse `Set-Cookie` would stop caching it). `None` when
    /// nothing counts.
    pub fn next(
        &self,
        visit: &RequestVisit,
        served: ServedBy,
        tls: bool,
        now: SystemTime,
    ) -> Option<HeaderValue> {
        let view = match served {
            ServedBy::App {
                status,
                shared_cacheable,
            } => {
                if shared_cacheable {
                    return None;
                }
                visit.page_view && status.is_success() && !visit.costly
            }
            ServedBy::Weir => false,
            ServedBy::Challenge => return None,
        };
        if !visit.navigation || (!view && !visit.costly) {
            return None;
        }
        let now_secs = unix_secs(now);
        let prior = visit.prior.unwrap_or(Visit {
            started: now_secs,
            last: now_secs,
            views: 0,
            costly: 0,
        });
        let next = Visit {
            last: now_secs,
            views: prior.views.saturating_add(u16::from(view)),
            costly: prior.costly.saturating_add(u16::from(visit.costly)),
            ..prior
        };
        let mut token = self.issue(next, visit.binding);
        if let Some(others) = &visit.others {
            token.push(SIDE_BY_SIDE);
            token.push_str(others);
        }
        let mut cookie = format!(
            "{}={token}; Path=/; Max-Age={}; HttpOnly; SameSite=Lax",
            self.cookie,
            self.idle.as_secs()
        );
        if self.secure.applies(tls) {
            cookie.push_str("; Secure");
        }
        HeaderValue::from_str(&cookie).ok()
    }

    fn issue(&self, v: Visit, binding: Binding) -> String {
        let mut raw = [0u8; TOKEN_LEN];
        raw[0] = VERSION;
        raw[1..5].copy_from_slice(&v.started.to_be_bytes());
        raw[5..9].copy_from_slice(&v.last.to_be_bytes());
        raw[9..11].copy_from_slice(&v.views.to_be_bytes());
        raw[11..13].copy_from_slice(&v.costly.to_be_bytes());
        raw[13..21].copy_from_slice(&binding.prefix);
        raw[21..29].copy_from_slice(&binding.agent);
        let tag = self.keys.sign(&raw[..BODY_LEN]);
        raw[BODY_LEN..].copy_from_slice(&tag);
        URL_SAFE_NO_PAD.encode(raw)
    }

    /// The going visit one cookie value carries, if it does: nothing but
    /// the signature is believed until it verifies; a visit of another
    /// network or browser, from the future, or idle past `idle` is none (a
    /// new visit starts).
    fn verify(&self, value: &str, binding: Binding, now: SystemTime) -> Option<Visit> {
        if value.len() != TOKEN_CHARS {
            return None;
        }
        let raw = URL_SAFE_NO_PAD.decode(value).ok()?;
        if raw.len() != TOKEN_LEN
            || raw[0] != VERSION
            || !self.keys.verify(&raw[..BODY_LEN], &raw[BODY_LEN..])
            || raw[13..21] != binding.prefix
            || raw[21..29] != binding.agent
        {
            return None;
        }
        let u32_at =
            |at: usize| u32::from_be_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]]);
        let visit = Visit {
            started: u32_at(1),
            last: u32_at(5),
            views: u16::from_be_bytes([raw[9], raw[10]]),
            costly: u16::from_be_bytes([raw[11], raw[12]]),
        };
        let now = unix_secs(now);
        // A minute of clock skew between the instances that share a key.
        let from_future = visit.last > now.saturating_add(60) || visit.started > visit.last;
        let idle = u64::from(now.saturating_sub(visit.last)) > self.idle.as_secs();
        (!from_future && !idle).then_some(visit)
    }
}

/// Who served a navigation, and how, for the next visit cookie.
#[derive(Debug, Clone, Copy)]
pub enum ServedBy {
    /// The app's response (or a copy of it, coalesced): its status, and
    /// whether a shared cache may keep it ([`shared_cacheable`]).
    App {
        status: http::StatusCode,
        shared_cacheable: bool,
    },
    /// weir's own: a refusal, a shed.
    Weir,
    /// The challenge's page: nothing counts. The navigation comes back
    /// once the page is passed and counts then; counted twice, a person's
    /// search under pressure had weighed two costly pages against their
    /// reading, and a person without JavaScript lost the visit that makes
    /// their no-script pass proof (issue 54).
    Challenge,
}

/// Whether a shared cache may store a response whose `Cache-Control`
/// fields are `values` (`public`, or `s-maxage`).
pub fn shared_cacheable<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> bool {
    values
        .into_iter()
        .flat_map(|v| v.split(|b| *b == b','))
        .any(|d| {
            let name = d
                .split(|b| *b == b'=')
                .next()
                .unwrap_or_default()
                .trim_ascii();
            name.eq_ignore_ascii_case(b"public") || name.eq_ignore_ascii_case(b"s-maxage")
        })
}

/// [`shared_cacheable`] of the `Cache-Control` fields in `headers`.
pub fn shared_cacheable_map(headers: &HeaderMap) -> bool {
    shared_cacheable(
        headers
            .get_all(header::CACHE_CONTROL)
            .iter()
            .map(HeaderValue::as_bytes),
    )
}

fn unix_secs(t: SystemTime) -> u32 {
    let secs = crate::challenge::token::unix_secs(t);
    u32::try_from(secs).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{AddrSource, ClientAddr, PeerAddr};
    use std::time::UNIX_EPOCH;

    /// What the proxy passes `Visits::read` for `headers`.
    fn navigating(headers: &HeaderMap) -> bool {
        crate::challenge::is_navigation(headers)
    }

    const KEY: &str = "0123456789abcdef0123456789abcdef";
    const UA: &str = "Mozilla/5.0 Firefox/140.0";

    fn visits() -> Visits {
        Visits::new(&VisitConfig::default(), &[KEY], Default::default()).unwrap()
    }

    fn client(ip: &str) -> ClientId {
        let peer: std::net::SocketAddr = format!("{ip}:40000").parse().unwrap();
        ClientId {
            peer: PeerAddr(peer),
            client: ClientAddr::new(peer.ip()),
            source: AddrSource::Peer,
        }
    }

    fn navigation(ua: &str, cookie: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("sec-fetch-mode", HeaderValue::from_static("navigate"));
        h.insert("user-agent", ua.parse().unwrap());
        if let Some(c) = cookie {
            h.insert("cookie", format!("other=1; {c}").parse().unwrap());
        }
        h
    }

    fn t(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    fn page(status: http::StatusCode, headers: &HeaderMap) -> ServedBy {
        ServedBy::App {
            status,
            shared_cacheable: shared_cacheable_map(headers),
        }
    }

    /// One navigation answered `answer`, `costly` or not: the visit the
    /// request carried, and the `name=value` to send next (the old one when
    /// nothing counted).
    fn answered(
        v: &Visits,
        (ip, ua): (&str, &str),
        cookie: Option<&str>,
        at: u64,
        costly: bool,
        served: ServedBy,
    ) -> (Option<Visit>, Option<String>) {
        let h = navigation(ua, cookie);
        let mut rv = v
            .read(&http::Method::GET, &h, navigating(&h), &client(ip), t(at))
            .expect("a navigation");
        rv.costly = costly;
        let set = v.next(&rv, served, false, t(at)).map(|set| {
            let set = set.to_str().unwrap().to_owned();
            assert!(set.contains("; HttpOnly; SameSite=Lax"), "{set}");
            set.split(';').next().unwrap().to_owned()
        });
        (rv.prior, set.or(cookie.map(str::to_owned)))
    }

    /// A page served: the visit the request carried, the cookie to send next.
    fn view(
        v: &Visits,
        ip: &str,
        ua: &str,
        cookie: Option<&str>,
        at: u64,
    ) -> (Option<Visit>, String) {
        let none = HeaderMap::new();
        let (prior, next) = answered(
            v,
            (ip, ua),
            cookie,
            at,
            false,
            page(http::StatusCode::OK, &none),
        );
        (
            prior,
            next.expect("a page served to a navigation carries the visit"),
        )
    }

    /// Two instances that share no key, a browser's pages alternating
    /// between them: each keeps the other's visit beside its own, so each
    /// counts the pages it served (three each of six). Before, each
    /// replaced the other's cookie, and no visit passed one view.
    #[test]
    fn instances_that_share_no_key_keep_each_others_visits_side_by_side() {
        let a = visits();
        let b = Visits::new(
            &VisitConfig::default(),
            &["fedcba9876543210fedcba9876543210"],
            Default::default(),
        )
        .unwrap();
        let mut cookie: Option<String> = None;
        let mut seen = Vec::new();
        for page in 0..6u64 {
            let instance = if page % 2 == 0 { &a } else { &b };
            let (prior, next) = view(instance, "203.0.113.7", UA, cookie.as_deref(), page);
            seen.push(prior.map_or(0, |p| p.views));
            cookie = Some(next);
        }
        assert_eq!(seen, [0, 0, 1, 1, 2, 2]);
        let cookie = cookie.unwrap();
        assert_eq!(cookie.matches('.').count(), 1, "two visits: {cookie}");
        // A forged piece is neither instance's visit, and is not believed.
        let forged = format!("{cookie}.{}", "A".repeat(TOKEN_CHARS));
        let (prior, _) = view(&a, "203.0.113.7", UA, Some(&forged), 7);
        assert_eq!(prior.map(|p| p.views), Some(3));
    }

    #[test]
    fn a_visit_counts_the_pages_weir_served_and_its_age() {
        let v = visits();
        let (prior, c1) = view(&v, "203.0.113.7", UA, None, 0);
        assert_eq!(prior, None);
        let (prior, c2) = view(&v, "203.0.113.7", UA, Some(&c1), 20);
        assert_eq!(prior.map(|p| p.views), Some(1));
        let (_, c3) = view(&v, "203.0.113.9", UA, Some(&c2), 40);
        let (prior, _) = view(&v, "203.0.113.7", UA, Some(&c3), 70);
        let visit = prior.expect("a going visit, from anywhere in its /24");
        assert_eq!(
            (visit.views, visit.costly, visit.started, visit.age(t(70))),
            (3, 0, 1_800_000_000, Duration::from_secs(70))
        );
        assert!(v.is_browsing(&visit, t(70)));
        assert!(!v.is_browsing(&visit, t(59)), "younger than a minute");
        let two = Visit { views: 2, ..visit };
        assert!(!v.is_browsing(&two, t(3600)), "two pages are not several");
        let searched = Visit {
            views: 3,
            costly: 1,
            ..visit
        };
        assert!(
            !v.is_browsing(&searched, t(3600)),
            "a second search after three pages"
        );
        let read = Visit {
            views: 4,
            costly: 1,
            ..visit
        };
        assert!(v.is_browsing(&read, t(3600)), "after four");
    }

    /// Issue 37's browser-like crawler: an article, then the expensive page
    /// it is after (refused, or served), again and again. Its articles are
    /// views, but never three for each expensive page, as a person's are.
    #[test]
    fn an_article_before_each_expensive_page_is_not_browsing() {
        let v = visits();
        let none = HeaderMap::new();
        let ok = page(http::StatusCode::OK, &none);
        let who = ("203.0.113.7", UA);
        let mut cookie: Option<String> = None;
        for round in 0..10u64 {
            let at = round * 60;
            let (_, c) = answered(&v, who, cookie.as_deref(), at, false, ok);
            let answer = if round % 2 == 0 { ServedBy::Weir } else { ok };
            let (prior, c) = answered(&v, who, c.as_deref(), at + 1, true, answer);
            let visit = prior.expect("kept cookies");
            assert_eq!(
                (visit.views, visit.costly),
                (round as u16 + 1, round as u16)
            );
            assert!(
                !v.is_browsing(&visit, t(at + 1)),
                "round {round}: {visit:?}"
            );
            cookie = c;
        }
        // A person: pages, and now and then a search (refused or not).
        let mut cookie: Option<String> = None;
        for n in 0..12u64 {
            let costly = n % 4 == 3;
            let answer = if costly { ServedBy::Weir } else { ok };
            let (prior, c) = answered(&v, who, cookie.as_deref(), n * 20, costly, answer);
            if n == 11 {
                let visit = prior.expect("kept cookies");
                assert_eq!((visit.views, visit.costly), (9, 2));
                assert!(v.is_browsing(&visit, t(n * 20)));
            }
            cookie = c;
        }
    }

    #[test]
    fn a_visit_is_no_visit_elsewhere_forged_or_over() {
        let v = visits();
        let (_, c1) = view(&v, "203.0.113.7", UA, None, 0);
        let value = c1.split_once('=').unwrap().1.to_owned();
        let going = |ip: &str, ua: &str, cookie: &str, at: u64| {
            v.read(
                &http::Method::GET,
                &navigation(ua, Some(cookie)),
                true,
                &client(ip),
                t(at),
            )
            .and_then(|rv| rv.prior)
        };
        assert!(going("203.0.113.7", UA, &c1, 10).is_some());
        assert_eq!(going("198.51.100.7", UA, &c1, 10), None, "another network");
        assert_eq!(
            going("203.0.113.7", "curl/8", &c1, 10),
            None,
            "another browser"
        );
        assert_eq!(
            going("203.0.113.7", UA, &c1, 31 * 60),
            None,
            "idle past 30 min"
        );
        let mut forged: Vec<char> = value.chars().collect();
        forged[12] = if forged[12] == 'A' { 'B' } else { 'A' };
        let forged: String = forged.into_iter().collect();
        assert_eq!(
            going("203.0.113.7", UA, &format!("weir_visit={forged}"), 10),
            None,
            "forged"
        );
        let other_key = Visits::new(
            &VisitConfig::default(),
            &["another-key-of-32-bytes-or-more-0000"],
            Default::default(),
        )
        .unwrap();
        let rv = other_key.read(
            &http::Method::GET,
            &navigation(UA, Some(&c1)),
            true,
            &client("203.0.113.7"),
            t(10),
        );
        assert_eq!(rv.and_then(|rv| rv.prior), None, "another key");
        assert_eq!(
            going("203.0.113.7", UA, "weir_visit=!!", 10),
            None,
            "malformed"
        );
    }

    /// The turn a request with `cookie` waits in: a navigation's, `costly`
    /// or not, or a script's of the same page.
    fn turn_of(v: &Visits, cookie: &str, costly: bool, script: bool) -> Option<u128> {
        let mut h = navigation(UA, Some(cookie));
        if script {
            h.insert("sec-fetch-mode", HeaderValue::from_static("no-cors"));
        }
        let mut rv = v.read(
            &http::Method::GET,
            &h,
            navigating(&h),
            &client("203.0.113.7"),
            t(30),
        )?;
        assert_eq!(rv.navigation, !script);
        rv.costly = costly;
        rv.turn()
    }

    #[test]
    fn reading_earns_a_turn_and_the_article_before_each_expensive_page_does_not() {
        let v = visits();
        let ip = "203.0.113.7";
        let (_, one) = view(&v, ip, UA, None, 0);
        let turn = turn_of(&v, &one, false, false).expect("a page read: the next one's turn");
        assert_eq!(
            turn_of(&v, &one, false, true),
            Some(turn),
            "its scripts share it"
        );
        assert_eq!(
            turn_of(&v, &one, true, false),
            None,
            "one page, then a search"
        );
        let (_, two) = view(&v, ip, UA, Some(&one), 10);
        assert_eq!(
            turn_of(&v, &two, true, false),
            Some(turn),
            "two pages, then a search"
        );
        let (_, other) = view(&v, ip, UA, None, 1);
        assert_ne!(
            turn_of(&v, &other, false, false),
            Some(turn),
            "another visit, another turn"
        );

        // The browser-like crawler: an article, then the expensive page,
        // cookies kept; neither request ever waits in a turn of its own.
        let none = HeaderMap::new();
        let (mut cookie, mut at) = (None::<String>, 0);
        for _ in 0..5 {
            let (_, article) = view(&v, ip, UA, cookie.as_deref(), at);
            assert_eq!(turn_of(&v, &article, true, false), None, "{at}");
            let refused = ServedBy::App {
                status: http::StatusCode::TOO_MANY_REQUESTS,
                shared_cacheable: shared_cacheable_map(&none),
            };
            let (_, next) = answered(&v, (ip, UA), Some(&article), at + 1, true, refused);
            let next = next.expect("a costly navigation counts");
            assert_eq!(turn_of(&v, &next, false, false), None, "{at}");
            (cookie, at) = (Some(next), at + 2);
        }
    }

    /// What makes a no-script pass proof (issue 54): three pages read or
    /// more, and more than one and a half for each costly navigation, this
    /// one included. A person's visit passes (also one with a run of
    /// searches); a crawler's article before each expensive page, with now
    /// and then one more, never does, however long it goes on.
    #[test]
    fn a_visit_reads_more_than_it_costs_as_people_read() {
        let binding = Binding::of(
            ClientAddr::new("203.0.113.7".parse().unwrap()),
            UA.as_bytes(),
        );
        let rv = |prior: Option<(u16, u16)>, this_costly| RequestVisit {
            prior: prior.map(|(views, costly)| Visit {
                started: 0,
                last: 0,
                views,
                costly,
            }),
            navigation: true,
            page_view: true,
            costly: this_costly,
            binding,
            others: None,
        };
        #[rustfmt::skip]
        let cases = [
            (None,          true,  false, "no visit yet"),
            (Some((3, 0)),  true,  true,  "three pages, then a search"),
            (Some((2, 0)),  true,  false, "two pages are too few"),
            (Some((7, 3)),  true,  true,  "four searches in eleven pages"),
            (Some((40, 7)), true,  true,  "a person's 85% pages"),
            (Some((6, 3)),  true,  true,  "four searches in ten pages"),
            (Some((5, 3)),  true,  false, "four searches in nine pages"),
            (Some((3, 1)),  true,  true,  "three pages, a search, and another"),
            (Some((4, 3)),  true,  false, "an article before each, and one more"),
            (Some((25, 20)), true, false, "an article before each, and one in five more"),
            (Some((4, 2)),  false, true,  "a page, not costly"),
        ];
        for (prior, this, want, what) in cases {
            assert_eq!(rv(prior, this).reads_more_than_it_costs(), want, "{what}");
        }
    }

    #[test]
    fn a_script_in_a_visit_shares_its_turn_and_counts_nothing() {
        let v = visits();
        let (_, one) = view(&v, "203.0.113.7", UA, None, 0);
        let mut script = navigation(UA, Some(&one));
        script.insert("sec-fetch-mode", HeaderValue::from_static("no-cors"));
        let rv = (v.read(
            &http::Method::GET,
            &script,
            navigating(&script),
            &client("203.0.113.7"),
            t(5),
        ))
        .expect("a visit's cookie is read on any request");
        assert_eq!((rv.navigation, rv.page_view), (false, false));
        assert_eq!(rv.prior.map(|p| p.views), Some(1));
        let none = HeaderMap::new();
        let ok = page(http::StatusCode::OK, &none);
        assert!(
            v.next(&rv, ok, false, t(5)).is_none(),
            "a script is no view"
        );
        let costly = RequestVisit { costly: true, ..rv };
        assert!(v.next(&costly, ok, false, t(5)).is_none(), "nor costly");
        let mut bare = script.clone();
        bare.remove("cookie");
        let rv = v.read(
            &http::Method::GET,
            &bare,
            navigating(&bare),
            &client("203.0.113.7"),
            t(5),
        );
        assert!(rv.is_none(), "no cookie: nothing read");
    }

    #[test]
    fn only_what_counts_carries_the_cookie() {
        let v = visits();
        let c = client("203.0.113.7");
        let ok = http::StatusCode::OK;
        let nav = v
            .read(&http::Method::GET, &navigation(UA, None), true, &c, t(0))
            .unwrap();
        let costly = RequestVisit {
            costly: true,
            ..nav.clone()
        };
        let mut api = HeaderMap::new();
        api.insert("accept", HeaderValue::from_static("application/json"));
        api.insert("cookie", HeaderValue::from_static("weir_visit=x"));
        assert!(
            v.read(&http::Method::GET, &api, navigating(&api), &c, t(0))
                .is_none(),
            "not a navigation: not read"
        );
        let post = v
            .read(&http::Method::POST, &navigation(UA, None), true, &c, t(0))
            .unwrap();
        let none = HeaderMap::new();
        let mut public = HeaderMap::new();
        public.insert(
            "cache-control",
            HeaderValue::from_static("max-age=0, s-maxage=300"),
        );
        let mut private = HeaderMap::new();
        private.insert(
            "cache-control",
            HeaderValue::from_static("private, max-age=60"),
        );
        let next = |rv: &RequestVisit, a: ServedBy| v.next(rv, a, false, t(0));
        assert!(next(&nav, page(ok, &none)).is_some());
        assert!(next(&nav, page(ok, &private)).is_some());
        assert!(
            next(&nav, page(ok, &public)).is_none(),
            "a shared cache could keep it"
        );
        assert!(next(&nav, page(http::StatusCode::NOT_FOUND, &none)).is_none());
        assert!(
            next(&nav, ServedBy::Weir).is_none(),
            "a cheap page refused counts nothing"
        );
        assert!(
            next(&costly, ServedBy::Weir).is_some(),
            "a costly one refused counts"
        );
        // Regression (issue 54): the page and the navigation that comes
        // back after it had counted as two costly pages.
        assert!(
            next(&costly, ServedBy::Challenge).is_none(),
            "the challenge's page counts nothing: its navigation comes back"
        );
        assert!(next(&post, page(ok, &none)).is_none(), "not a page view");
        let secure = v.next(&nav, page(ok, &none), true, t(0)).unwrap();
        assert!(secure.to_str().unwrap().ends_with("; Secure"));
    }

    #[test]
    fn bad_settings_are_refused_by_name() {
        let bad = |c: VisitConfig| {
            Visits::new(&c, &[KEY], Default::default())
                .unwrap_err()
                .to_string()
        };
        let name = bad(VisitConfig {
            cookie: "a b".into(),
            ..VisitConfig::default()
        });
        assert!(name.starts_with("cookie:"), "{name}");
        let views = bad(VisitConfig {
            min_views: 0,
            ..VisitConfig::default()
        });
        assert!(views.starts_with("min_views:"), "{views}");
        let idle = bad(VisitConfig {
            idle: ConfigDuration::secs(5),
            ..VisitConfig::default()
        });
        assert!(idle.starts_with("idle:"), "{idle}");
        let short = Visits::new(&VisitConfig::default(), &["short"], Default::default())
            .unwrap_err()
            .to_string();
        assert!(short.starts_with("signing key:"), "{short}");
    }
}
