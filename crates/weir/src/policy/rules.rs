//! Rules: rate and concurrency limits attached to route classes.
//!
//! A class's rules are evaluated in order and all that apply must pass. A rate
//! rule may limit several levels at once (per address, per /24, per /16,
//! site-wide, per header or cookie value, per verified user); each level is a
//! GCRA quota over its own store partition, so a spray of addresses cannot
//! evict the few aggregate keys. A concurrency rule counts requests in flight
//! per key and holds a guard until the response ends.
//!
//! Exemptions depend only on something weir checked: a *verified* identity (a
//! signed cookie weir can check, or the app's own answer to an auth
//! sub-request), or a valid challenge *pass* when the rule names it (a pass
//! is then limited by its own key, `token`). A cookie's name or presence
//! never exempts anything: incident 1's crawlers carried the login page's
//! session cookie on one request in five.
//!
//! A rate rule over its limit refuses (429), or, with `when_over = "defer"`,
//! *defers*: the request is admitted to the lowest admission lane, served
//! only with capacity nobody else is waiting for, and refused with the
//! rule's answer only if that lane sheds it. A limit that exists to share
//! the app then never refuses anyone while the app has room (incident 1's
//! emergency bucket refused people for hours while workers sat idle).
//!
//! Shadow mode decides, logs and counts "would reject" without enforcing.
//! This module decides; it does not build responses (see `crate::respond`).

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, Method};
use smallvec::SmallVec;

use crate::config::digest;
use crate::evidence::Collateral;
use crate::identity::{ClientAddr, ClientId, Level};
use weir_http::cookie::value as cookie_value;
use weir_limiter::redis::RuleCheck;
use weir_limiter::shared::SharedLimiter;
use weir_limiter::{
    InflightGuard, InflightTable, MonoTime, Outcome, Quota, RuleFingerprint, ShardedStore,
};

/// What a rule level counts requests by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyKind {
    /// The client address (IPv4 /32, IPv6 /128).
    Address,
    /// IPv4 /24, IPv6 /64.
    Subnet,
    /// IPv4 /16, IPv6 /48.
    Network,
    /// One key for every client.
    Site,
    /// The value of a request header (level skipped when absent).
    Header(HeaderName),
    /// The value of a cookie (level skipped when absent).
    Cookie(String),
    /// The verified user (level skipped for anonymous requests).
    User,
    /// The challenge pass token (level skipped without one): a token shared
    /// by a crawler farm is limited as one client.
    Token,
}

impl KeyKind {
    /// Parses `ip`, `subnet`, `/24`, `/64`, `network`, `/16`, `/48`, `site`,
    /// `header:NAME`, `cookie:NAME`, `user`.
    pub fn parse(s: &str) -> Result<KeyKind, String> {
        let kind = match s.trim() {
            "ip" | "address" | "/32" | "/128" => KeyKind::Address,
            "subnet" | "/24" | "/64" => KeyKind::Subnet,
            "network" | "/16" | "/48" => KeyKind::Network,
            "site" => KeyKind::Site,
            "user" => KeyKind::User,
            "token" | "pass" => KeyKind::Token,
            other => {
                if let Some(name) = other.strip_prefix("header:") {
                    KeyKind::Header(
                        HeaderName::from_bytes(name.trim().to_ascii_lowercase().as_bytes())
                            .map_err(|_| format!("`{name}` is not a header name"))?,
                    )
                } else if let Some(name) = other.strip_prefix("cookie:") {
                    if name.trim().is_empty() {
                        return Err("`cookie:` needs a cookie name".into());
                    }
                    KeyKind::Cookie(name.trim().to_string())
                } else {
                    return Err(format!(
                        "`{other}` is not a key: use ip, subnet (/24, /64), network (/16, /48), site, header:NAME, cookie:NAME, user or token"
                    ));
                }
            }
        };
        Ok(kind)
    }

    /// The level's label in logs and metrics (bounded).
    pub fn label(&self) -> &'static str {
        match self {
            KeyKind::Address => "ip",
            KeyKind::Subnet => "subnet",
            KeyKind::Network => "network",
            KeyKind::Site => "site",
            KeyKind::Header(_) => "header",
            KeyKind::Cookie(_) => "cookie",
            KeyKind::User => "user",
            KeyKind::Token => "token",
        }
    }

    fn code(&self) -> u8 {
        match self {
            KeyKind::Address => 1,
            KeyKind::Subnet => 2,
            KeyKind::Network => 3,
            KeyKind::Site => 4,
            KeyKind::Header(_) => 5,
            KeyKind::Cookie(_) => 6,
            KeyKind::User => 7,
            KeyKind::Token => 8,
        }
    }

    /// The address level this kind keys on (`Address`, `Subnet`,
    /// `Network`); `None` for keys that are not the client's address.
    pub fn address_level(&self) -> Option<Level> {
        match self {
            KeyKind::Address => Some(Level::Address),
            KeyKind::Subnet => Some(Level::Subnet),
            KeyKind::Network => Some(Level::Network),
            _ => None,
        }
    }

    /// The key for this request, and how it is named in logs; `None` when
    /// the request has no value for this level. The name is formatted only
    /// when a request is refused (most are not).
    fn key<'a>(&'a self, facts: &RequestFacts<'a>) -> Option<(u64, KeyName<'a>)> {
        let client = facts.client.client;
        let (digest, shown) = match self {
            KeyKind::Address => {
                let k = client.key(Level::Address);
                (k.digest(), KeyName::Address(client.ip()))
            }
            KeyKind::Subnet => {
                let k = client.key(Level::Subnet);
                (k.digest(), KeyName::Prefix(k))
            }
            KeyKind::Network => {
                let k = client.key(Level::Network);
                (k.digest(), KeyName::Prefix(k))
            }
            KeyKind::Site => (0x5173_u64, KeyName::Site),
            KeyKind::Header(name) => {
                let v = facts.headers.get(name)?;
                let h = digest(v.as_bytes());
                // Values may be secrets (API keys): log a digest, not the value.
                (h, KeyName::Header(name, h as u32))
            }
            KeyKind::Cookie(name) => {
                let v = cookie_value(facts.headers, name)?;
                let h = digest(v.as_bytes());
                (h, KeyName::Cookie(name, h as u32))
            }
            KeyKind::User => {
                let u = facts.user?;
                (digest(u.as_bytes()), KeyName::User(u))
            }
            KeyKind::Token => {
                let t = facts.pass?;
                (t, KeyName::Token(t as u32))
            }
        };
        Some((weir_limiter::key(0, self.code(), digest), shown))
    }
}

/// How a level's key is named in logs ([`RuleRejection::key`]).
#[derive(Debug, Clone, Copy)]
enum KeyName<'a> {
    Address(std::net::IpAddr),
    Prefix(crate::identity::PrefixKey),
    Site,
    Header(&'a HeaderName, u32),
    Cookie(&'a str, u32),
    User(&'a str),
    Token(u32),
}

impl std::fmt::Display for KeyName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyName::Address(ip) => write!(f, "{ip}"),
            KeyName::Prefix(k) => write!(f, "{k}"),
            KeyName::Site => f.write_str("site"),
            KeyName::Header(name, h) => write!(f, "header:{name}#{h:08x}"),
            KeyName::Cookie(name, h) => write!(f, "cookie:{name}#{h:08x}"),
            KeyName::User(u) => write!(f, "user:{u}"),
            KeyName::Token(t) => write!(f, "token:{t:08x}"),
        }
    }
}

/// One level of a rate rule.
#[derive(Debug, Clone)]
pub struct RateLevel {
    /// The readable part of the level's shared-limiter key names
    /// (`rule:level`, `weir_limiter::redis::key_label`).
    pub label: Arc<str>,
    pub key: KeyKind,
    pub quota: Quota,
    pub store: Arc<ShardedStore>,
    pub fingerprint: RuleFingerprint,
}

/// What a rule limits.
#[derive(Debug, Clone)]
pub enum RuleBody {
    Rate(Vec<RateLevel>),
    Concurrency {
        key: KeyKind,
        max: u32,
        table: Arc<InflightTable>,
        fingerprint: RuleFingerprint,
    },
}

/// A compiled rule.
#[derive(Debug, Clone)]
pub struct Rule {
    pub name: Arc<str>,
    pub body: RuleBody,
    pub exempt_verified: bool,
    /// A valid challenge pass exempts (`exempt = ["pass"]`).
    pub exempt_pass: bool,
    /// Over the limit: defer to the lowest lane instead of refusing (rate
    /// rules only; `when_over = "defer"`).
    pub defer: bool,
    /// `exempt = ["verified_bot"]`: crawlers that proved who they are.
    pub exempt_bots: bool,
    pub shadow: bool,
    pub methods: Vec<Method>,
}

/// What the rules may look at.
pub struct RequestFacts<'a> {
    pub client: &'a ClientId,
    pub method: &'a Method,
    pub headers: &'a HeaderMap,
    /// The verified user, if the session was verified.
    pub user: Option<&'a str>,
    /// The challenge pass token's id, if the request holds a valid one.
    pub pass: Option<u64>,
    /// The pass is a loop's ([`crate::policy::Proof::looped`]): no evidence
    /// of a person.
    pub looped: bool,
    /// Whether the request proved to be a configured crawler
    /// (`identity::bots`).
    pub bot: bool,
    pub now: MonoTime,
    /// A navigation in a visit weir counted as a person's (`crate::visit`:
    /// several pages served over minutes, its signed cookie back).
    pub browsing: bool,
    /// An unproven browser navigation that the challenge may ask for proof:
    /// a rule a pass exempts then challenges it instead of refusing it.
    pub challengeable: bool,
}

/// Why a rule rejected a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleRejection {
    pub rule: Arc<str>,
    /// The level that fired (`ip`, `subnet`, `network`, `site`, ...).
    pub level: &'static str,
    /// The key that fired, as shown in logs (an address or prefix).
    pub key: String,
    pub retry_after: Duration,
    /// For `RateLimit-Policy`: quota (requests) and window (seconds).
    pub policy: Option<(u32, u64)>,
}

/// The outcome of one rule for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleResult {
    Allow,
    Reject,
    ShadowReject,
    Exempt,
    /// Over the limit of a rule that defers: admitted to the lowest lane.
    Defer,
    /// Over the limit of a rule a pass exempts, for a navigation that can
    /// earn one: the challenge page instead of a refusal.
    Challenge,
}

impl RuleResult {
    pub fn as_str(&self) -> &'static str {
        match self {
            RuleResult::Allow => "allow",
            RuleResult::Reject => "reject",
            RuleResult::ShadowReject => "shadow_reject",
            RuleResult::Exempt => "exempt",
            RuleResult::Defer => "defer",
            RuleResult::Challenge => "challenge",
        }
    }
}

/// A request a rule deferred: what it is refused with if the lowest lane
/// sheds it, and what the refusal is then reported as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deferral {
    pub rejection: RuleRejection,
    /// Why the client may be a person ([`collateral_signal`]).
    pub signal: Option<Collateral>,
    /// Whether a challenge pass would have exempted the request: a
    /// navigation that can earn one is better challenged than refused.
    pub pass_exempts: bool,
}

/// Everything the rules decided for one request.
#[derive(Debug, Default)]
pub struct Evaluation {
    /// The enforced rejection, if any (later rules were not evaluated).
    pub rejection: Option<RuleRejection>,
    /// The first deferral (a deferring rule over its limit), and whether a
    /// pass exempts from that rule. Later rules still run: one may refuse.
    pub deferral: Option<(RuleRejection, bool)>,
    /// A refusing rule a pass exempts was over its limit for a challengeable
    /// navigation: it is to be challenged (later rules were not evaluated).
    pub challenge: Option<RuleRejection>,
    /// Rejections in shadow mode: logged and counted, not enforced.
    pub shadow: Vec<RuleRejection>,
    /// Concurrency slots held until the response ends.
    pub guards: Vec<InflightGuard>,
    /// (index of the rule in the evaluated slice, result) for metrics. Most
    /// routes have a few rules: no allocation, no name copied per request.
    pub results: SmallVec<[(usize, RuleResult); 4]>,
}

/// A client's key in the activity store behind the low-rate collateral
/// signal (live traffic and `weir replay` alike).
pub fn activity_key(client: ClientAddr) -> u64 {
    weir_limiter::key(0, 0, client.key(Level::Address).digest())
}

/// Recent requests per client address, behind the `low_rate` collateral
/// signal: a client still under `rules.low_rate_per_minute` when a rule
/// refuses it may be a person. Owned by the process (live) or the replay;
/// bounded (about 25 bytes an address, the oldest dropped past the cap).
pub struct Activity {
    store: weir_limiter::ShardedStore,
}

impl Activity {
    pub fn new(max_addresses: usize) -> Activity {
        Activity {
            store: weir_limiter::ShardedStore::new(weir_limiter::StoreConfig::with_max_keys(
                max_addresses.max(1),
            ))
            .expect("a non-zero store size is valid"),
        }
    }

    /// Counts a request of `client` at `now`; true while it stays under
    /// `quota` (`rules.low_rate_per_minute`).
    pub fn observe(&self, client: ClientAddr, quota: &Quota, now: MonoTime) -> bool {
        self.store
            .check(activity_key(client), quota, now, 1)
            .is_allowed()
    }

    /// The store, for its upkeep (sweeps, prefetching, its size).
    pub fn store(&self) -> &weir_limiter::ShardedStore {
        &self.store
    }
}

/// What the rules phase reports as it runs, to whoever runs it: the live
/// process (metrics, the distinct-clients gauge) or `weir replay` (its
/// report). The phase itself ([`judge`]) is the same code for both.
pub trait RuleObserver {
    /// Counts a request of `client` at `now`; true while the client stays
    /// under `rules.low_rate_per_minute` (the `low_rate` collateral signal).
    fn low_rate(&mut self, client: ClientAddr, now: MonoTime) -> bool;
    /// One rule's result for this request.
    fn result(&mut self, rule: &Rule, result: RuleResult);
    /// A rejection (`enforced`) or a shadow one, and why the refused client
    /// may be a person (`signal`).
    fn rejected(
        &mut self,
        rejection: &RuleRejection,
        client: ClientAddr,
        signal: Option<Collateral>,
        enforced: bool,
    );
}

/// What the rules phase found for one request.
#[derive(Debug, Default)]
pub struct Judgement {
    /// The enforced rejection, if any.
    pub rejection: Option<RuleRejection>,
    /// Admitted to the lowest lane by a deferring rule (none if rejected).
    pub deferral: Option<Deferral>,
    /// To be challenged instead of refused by this rule (see
    /// [`RuleResult::Challenge`]): not a rejection, so not reported as one.
    pub challenge: Option<RuleRejection>,
    /// Rejections in shadow mode: logged and counted, not enforced.
    pub shadow: Vec<RuleRejection>,
    /// Concurrency slots held until the response ends.
    pub guards: Vec<InflightGuard>,
    /// Why a refused client may be a person (see [`collateral_signal`]);
    /// `None` too when nothing refused or deferred the request.
    pub signal: Option<Collateral>,
}

/// **The rules phase**, live and in `weir replay` alike: counts the
/// client's activity, evaluates `rules` in order ([`evaluate`]), tells
/// `observer` each result, and each rejection with its collateral signal.
/// Result: the [`Judgement`]; an enforced rejection ends the request.
pub async fn judge(
    rules: &[Rule],
    facts: &RequestFacts<'_>,
    global_shadow: bool,
    shared: Option<&SharedLimiter>,
    observer: &mut impl RuleObserver,
) -> Judgement {
    let client = facts.client.client;
    let low_rate = observer.low_rate(client, facts.now);
    let ev = evaluate(rules, facts, global_shadow, shared).await;
    for &(index, result) in &ev.results {
        observer.result(&rules[index], result);
    }
    // Read only for a request something refused or deferred: most pass,
    // and the headers' reading (`is_navigation`) is not free.
    let refused = ev.rejection.is_some() || ev.deferral.is_some() || !ev.shadow.is_empty();
    let signal = refused
        .then(|| {
            collateral_signal(
                facts.user.is_some(),
                facts.pass.is_some() && !facts.looped,
                facts.browsing,
                facts.headers,
                low_rate,
            )
        })
        .flatten();
    for shadow in &ev.shadow {
        observer.rejected(shadow, client, signal, false);
    }
    if let Some(r) = &ev.rejection {
        observer.rejected(r, client, signal, true);
    }
    let deferral = ev.deferral.map(|(rejection, pass_exempts)| Deferral {
        rejection,
        signal,
        pass_exempts,
    });
    Judgement {
        rejection: ev.rejection,
        deferral,
        challenge: ev.challenge,
        shadow: ev.shadow,
        guards: ev.guards,
        signal,
    }
}

/// Why a refused client may be a person rather than a crawler, strongest
/// evidence first (the one that decided is logged as `collateral`):
///
/// 1. `verified`: a session the app vouched for;
/// 2. `pass`: a valid challenge pass (its browser ran the challenge's script
///    or waited out its refresh, and kept the cookie);
/// 3. `browsing`: a navigation in a visit weir itself counted, several pages
///    over minutes (`crate::visit`; a `Referer` alone is one header to a
///    crawler and counts for nothing);
/// 4. `low_rate`: the address sends little (a crawler spread over many
///    addresses sends little from each);
/// 5. `browser`: a browser navigation's headers.
///
/// The first three are evidence of a person, the last two hints. None is
/// proof: `docs/metrics.md` says what each costs a crawler to forge.
pub fn collateral_signal(
    verified: bool,
    pass: bool,
    browsing: bool,
    headers: &HeaderMap,
    low_rate: bool,
) -> Option<Collateral> {
    if verified {
        Some(Collateral::Verified)
    } else if pass {
        Some(Collateral::Pass)
    } else if browsing {
        Some(Collateral::Browsing)
    } else if low_rate {
        Some(Collateral::LowRate)
    } else if crate::challenge::is_navigation(headers) {
        Some(Collateral::Browser)
    } else {
        None
    }
}

/// Evaluates `rules` in order. `global_shadow` puts every rule in shadow mode.
/// With `shared`, rate levels are decided through Redis (one round trip per
/// rule, all levels at once), falling back to the local stores.
pub async fn evaluate(
    rules: &[Rule],
    facts: &RequestFacts<'_>,
    global_shadow: bool,
    shared: Option<&SharedLimiter>,
) -> Evaluation {
    let mut ev = Evaluation::default();
    for (index, rule) in rules.iter().enumerate() {
        if !rule.methods.is_empty() && !rule.methods.contains(facts.method) {
            continue;
        }
        if is_exempt(rule, facts) {
            ev.results.push((index, RuleResult::Exempt));
            continue;
        }
        let verdict = match &rule.body {
            RuleBody::Rate(levels) => match shared {
                // Boxed: a Redis round trip anyway, and its state would
                // otherwise enlarge every request's future.
                Some(shared) => Box::pin(check_rate_shared(rule, levels, facts, shared)).await,
                None => check_rate(rule, levels, facts),
            },
            RuleBody::Concurrency {
                key, max, table, ..
            } => check_concurrency(rule, key, *max, table, facts),
        };
        let mode = RuleMode {
            shadow: rule.shadow || global_shadow,
            challengeable: facts.challengeable,
        };
        if ev.record(index, rule, verdict, mode).is_break() {
            return ev;
        }
    }
    ev
}

/// Whether the request is exempt from `rule`: a verified session, a
/// challenge pass or a verified bot, where the rule exempts it.
#[inline]
fn is_exempt(rule: &Rule, facts: &RequestFacts<'_>) -> bool {
    (rule.exempt_verified && facts.user.is_some())
        || (rule.exempt_pass && facts.pass.is_some())
        || (rule.exempt_bots && facts.bot)
}

/// Takes a slot of a concurrency rule's `table` for the request's key, or
/// refuses when the key already holds `max`. Requests without the key
/// (e.g. no session) are not counted.
#[inline]
fn check_concurrency(
    rule: &Rule,
    key: &KeyKind,
    max: u32,
    table: &Arc<InflightTable>,
    facts: &RequestFacts<'_>,
) -> Result<Option<InflightGuard>, RuleRejection> {
    match key.key(facts) {
        None => Ok(None),
        Some((k, shown)) => match table.try_acquire(k, max) {
            Ok(guard) => Ok(Some(guard)),
            Err(_) => Err(RuleRejection {
                rule: rule.name.clone(),
                level: key.label(),
                key: shown.to_string(),
                retry_after: Duration::from_secs(1),
                policy: None,
            }),
        },
    }
}

/// How a rule's refusal is taken for one request.
#[derive(Debug, Clone, Copy)]
struct RuleMode {
    /// The rule (or every rule) is in shadow mode: a refusal is only logged.
    shadow: bool,
    /// The request is a navigation that can be shown a challenge.
    challengeable: bool,
}

impl Evaluation {
    /// Records the `verdict` of the rule at `index`: its slot kept, or its
    /// refusal taken as shadow, deferral, challenge or rejection. Breaks when
    /// the refusal decides the request (later rules are not evaluated).
    #[inline]
    fn record(
        &mut self,
        index: usize,
        rule: &Rule,
        verdict: Result<Option<InflightGuard>, RuleRejection>,
        mode: RuleMode,
    ) -> ControlFlow<()> {
        match verdict {
            Ok(guard) => {
                self.guards.extend(guard);
                self.results.push((index, RuleResult::Allow));
            }
            Err(rejection) if mode.shadow => {
                self.results.push((index, RuleResult::ShadowReject));
                self.shadow.push(rejection);
            }
            Err(rejection) if rule.defer => {
                self.results.push((index, RuleResult::Defer));
                if self.deferral.is_none() {
                    self.deferral = Some((rejection, rule.exempt_pass));
                }
            }
            Err(rejection) if rule.exempt_pass && mode.challengeable => {
                self.results.push((index, RuleResult::Challenge));
                self.challenge = Some(rejection);
                self.deferral = None;
                self.guards.clear();
                return ControlFlow::Break(());
            }
            Err(rejection) => {
                self.results.push((index, RuleResult::Reject));
                self.rejection = Some(rejection);
                self.deferral = None;
                // A rejected request holds no slots.
                self.guards.clear();
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }
}

/// Charges every level, and gives back what was charged if one refuses, so a
/// request refused at /16 does not use up its address's quota. Charging first
/// and refunding on refusal takes one store lookup per level for the common
/// case (admitted); a peek before charging would take two. Shadow rules run
/// the same way: they charge what they would allow, so "would reject" counts
/// match what enforcing would do.
fn check_rate(
    rule: &Rule,
    levels: &[RateLevel],
    facts: &RequestFacts<'_>,
) -> Result<Option<InflightGuard>, RuleRejection> {
    let mut charged: [Option<u64>; MAX_LEVELS] = [None; MAX_LEVELS];
    for (i, level) in levels.iter().enumerate().take(MAX_LEVELS) {
        let Some((k, shown)) = level.key.key(facts) else {
            continue;
        };
        if let Outcome::Rejected { retry_after, .. } =
            level.store.check(k, &level.quota, facts.now, 1)
        {
            for (earlier, key) in levels.iter().zip(&charged).take(i) {
                if let Some(key) = key {
                    earlier.store.refund(*key, &earlier.quota, facts.now, 1);
                }
            }
            return Err(rejection(rule, level, shown.to_string(), retry_after));
        }
        charged[i] = Some(k);
    }
    Ok(None)
}

/// Like [`check_rate`], through the shared limiter: all levels in one call,
/// charged only if all pass.
async fn check_rate_shared(
    rule: &Rule,
    levels: &[RateLevel],
    facts: &RequestFacts<'_>,
    shared: &SharedLimiter,
) -> Result<Option<InflightGuard>, RuleRejection> {
    let mut keyed = Vec::with_capacity(levels.len());
    for level in levels {
        if let Some(k) = level.key.key(facts) {
            keyed.push((level, k));
        }
    }
    let checks: Vec<RuleCheck<'_>> = keyed
        .iter()
        .map(|(level, (key, _))| RuleCheck {
            rule: level.fingerprint,
            label: &level.label,
            key: *key,
            quota: &level.quota,
            cost: 1,
        })
        .collect();
    let decided = shared.check_all(&checks).await;
    for ((level, (_, shown)), d) in keyed.iter().zip(&decided) {
        if let Outcome::Rejected { retry_after, .. } = d.outcome {
            return Err(rejection(rule, level, shown.to_string(), retry_after));
        }
    }
    Ok(None)
}

fn rejection(rule: &Rule, level: &RateLevel, key: String, retry_after: Duration) -> RuleRejection {
    RuleRejection {
        rule: rule.name.clone(),
        level: level.key.label(),
        key,
        retry_after,
        policy: Some((level.quota.count(), level.quota.period().as_secs().max(1))),
    }
}

/// The most levels one rate rule may have.
pub const MAX_LEVELS: usize = 8;

/// A stable fingerprint of a rule level's meaning: a reload keeps the state
/// of every level whose fingerprint is unchanged.
pub fn fingerprint(parts: &[&str]) -> RuleFingerprint {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.as_bytes().iter().chain(std::iter::once(&0u8)) {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    RuleFingerprint(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{AddrSource, ClientAddr, PeerAddr};
    use std::future::Future as _;
    use weir_limiter::StoreConfig;

    fn client(ip: &str) -> ClientId {
        ClientId {
            peer: PeerAddr(format!("{ip}:1000").parse().unwrap()),
            client: ClientAddr::new(ip.parse().unwrap()),
            source: AddrSource::Peer,
        }
    }

    fn level(per: &str, rate: u32, window_s: u64) -> RateLevel {
        RateLevel {
            label: Arc::from(per),
            key: KeyKind::parse(per).unwrap(),
            quota: Quota::new(rate, Duration::from_secs(window_s), rate).unwrap(),
            store: Arc::new(ShardedStore::new(StoreConfig::with_max_keys(10_000)).unwrap()),
            fingerprint: fingerprint(&[per]),
        }
    }

    fn rate_rule(name: &str, levels: Vec<RateLevel>) -> Rule {
        Rule {
            name: Arc::from(name),
            body: RuleBody::Rate(levels),
            exempt_verified: false,
            exempt_pass: false,
            defer: false,
            exempt_bots: false,
            shadow: false,
            methods: vec![],
        }
    }

    fn run(rules: &[Rule], ip: &str, user: Option<&str>, now: MonoTime) -> Evaluation {
        run_facts(rules, ip, user, None, false, false, now)
    }

    /// [`run`] for a request that did (`bot`) or did not prove to be a crawler.
    fn run_as(
        rules: &[Rule],
        ip: &str,
        user: Option<&str>,
        bot: bool,
        now: MonoTime,
    ) -> Evaluation {
        run_facts(rules, ip, user, None, false, bot, now)
    }

    fn run_with_pass(
        rules: &[Rule],
        ip: &str,
        user: Option<&str>,
        pass: Option<u64>,
        now: MonoTime,
    ) -> Evaluation {
        run_facts(rules, ip, user, pass, false, false, now)
    }

    fn run_facts(
        rules: &[Rule],
        ip: &str,
        user: Option<&str>,
        pass: Option<u64>,
        challengeable: bool,
        bot: bool,
        now: MonoTime,
    ) -> Evaluation {
        let c = client(ip);
        let h = HeaderMap::new();
        let facts = RequestFacts {
            client: &c,
            method: &Method::GET,
            headers: &h,
            user,
            pass,
            looped: false,
            bot,
            now,
            browsing: false,
            challengeable,
        };
        // No shared limiter: evaluation never waits, so a no-op waker suffices.
        let fut = std::pin::pin!(evaluate(rules, &facts, false, None));
        match fut.poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
            std::task::Poll::Ready(ev) => ev,
            std::task::Poll::Pending => unreachable!("local evaluation does not wait"),
        }
    }

    #[test]
    fn collateral_signals_strongest_first() {
        let nav = {
            let mut h = HeaderMap::new();
            h.insert("sec-fetch-mode", "navigate".parse().unwrap());
            h
        };
        let none = HeaderMap::new();
        // Issue 37: a same-site `Referer` cost a crawler one header.
        let mut from_the_site = nav.clone();
        from_the_site.insert(
            "referer",
            "https://wiki.example/wiki/Main_Page".parse().unwrap(),
        );
        let mut fetch_for_html = HeaderMap::new();
        fetch_for_html.insert("sec-fetch-mode", "cors".parse().unwrap());
        fetch_for_html.insert("accept", "text/html".parse().unwrap());
        // (verified, pass, browsing, headers, low rate, signal)
        type Case<'a> = (bool, bool, bool, &'a HeaderMap, bool, Option<&'a str>);
        let cases: [Case<'_>; 10] = [
            (true, true, true, &nav, true, Some("verified")),
            (false, true, true, &nav, true, Some("pass")),
            (false, true, false, &none, false, Some("pass")),
            (false, false, true, &nav, true, Some("browsing")),
            (false, false, false, &from_the_site, false, Some("browser")),
            (false, false, false, &from_the_site, true, Some("low_rate")),
            (false, false, false, &nav, true, Some("low_rate")),
            (false, false, false, &nav, false, Some("browser")),
            (false, false, false, &fetch_for_html, false, None),
            (false, false, false, &none, false, None),
        ];
        for (i, (verified, pass, browsing, h, low, want)) in cases.into_iter().enumerate() {
            let got = collateral_signal(verified, pass, browsing, h, low);
            assert_eq!(got.map(Collateral::as_str), want, "case {i}");
        }
    }

    #[test]
    fn key_kinds_parse() {
        for (s, ok) in [
            ("ip", true),
            ("/24", true),
            ("/48", true),
            ("site", true),
            ("header:X-Api-Key", true),
            ("cookie:session", true),
            ("cookie:", false),
            ("header:bad name", false),
            ("planet", false),
        ] {
            assert_eq!(KeyKind::parse(s).is_ok(), ok, "{s}");
        }
    }

    #[test]
    fn slash16_holds_a_flood_spread_over_many_24s() {
        let rules = [rate_rule(
            "anon",
            vec![
                level("ip", 5, 60),
                level("/24", 20, 60),
                level("/16", 50, 60),
            ],
        )];
        let now = MonoTime::ZERO;
        let mut admitted = 0;
        let mut fired = std::collections::HashMap::new();
        // 200 /24s inside 10.1.0.0/16, 2 requests each: under every per-IP and per-/24 limit.
        for net in 0..200 {
            for host in 1..=2 {
                let ev = run(&rules, &format!("10.1.{net}.{host}"), None, now);
                match ev.rejection {
                    None => admitted += 1,
                    Some(r) => *fired.entry(r.level).or_insert(0) += 1,
                }
            }
        }
        assert_eq!(admitted, 50, "the /16 level admits exactly its quota");
        assert_eq!(fired.get("network"), Some(&350));
        // A neighbour /16 is unaffected.
        assert!(run(&rules, "10.2.0.1", None, now).rejection.is_none());
    }

    #[test]
    fn refused_requests_do_not_use_lower_levels() {
        let rules = [rate_rule(
            "r",
            vec![level("ip", 3, 60), level("site", 2, 60)],
        )];
        let now = MonoTime::ZERO;
        assert!(run(&rules, "10.0.0.1", None, now).rejection.is_none());
        assert!(run(&rules, "10.0.0.2", None, now).rejection.is_none());
        // The site level is exhausted: 10.0.0.3 is refused at `site`...
        let r = run(&rules, "10.0.0.3", None, now).rejection.unwrap();
        assert_eq!(r.level, "site");
        assert_eq!(r.key, "site");
        assert_eq!(r.policy, Some((2, 60)));
        assert!(r.retry_after > Duration::ZERO && r.retry_after <= Duration::from_secs(30));
        // ...and its own address quota was given back: no key is left.
        let RuleBody::Rate(levels) = &rules[0].body else {
            unreachable!()
        };
        let k = KeyKind::Address
            .key(&RequestFacts {
                client: &client("10.0.0.3"),
                method: &Method::GET,
                headers: &HeaderMap::new(),
                user: None,
                pass: None,
                looped: false,
                bot: false,
                now,
                browsing: false,
                challengeable: false,
            })
            .map(|(k, _)| k);
        assert!(levels[0].store.tat(k.unwrap()).is_none());
    }

    #[test]
    fn address_rule_leaves_neighbours_alone() {
        let rules = [rate_rule("ip", vec![level("ip", 2, 60)])];
        let now = MonoTime::ZERO;
        for _ in 0..2 {
            assert!(run(&rules, "10.0.0.1", None, now).rejection.is_none());
        }
        assert!(run(&rules, "10.0.0.1", None, now).rejection.is_some());
        assert!(run(&rules, "10.0.0.2", None, now).rejection.is_none());
    }

    #[test]
    fn verified_users_are_exempt_and_shadow_never_enforces() {
        let mut rule = rate_rule("r", vec![level("site", 1, 60)]);
        rule.exempt_verified = true;
        let mut shadow = rate_rule("s", vec![level("site", 1, 60)]);
        shadow.shadow = true;
        let rules = [rule, shadow];
        let now = MonoTime::ZERO;
        assert!(run(&rules, "10.0.0.1", None, now).rejection.is_none());
        // Anonymous: refused by `r`.
        assert_eq!(
            run(&rules, "10.0.0.2", None, now)
                .rejection
                .unwrap()
                .rule
                .as_ref(),
            "r"
        );
        // Verified: exempt from `r`; `s` would reject but only in shadow.
        let ev = run(&rules, "10.0.0.3", Some("editor"), now);
        assert!(ev.rejection.is_none());
        assert_eq!(ev.shadow.len(), 1);
        assert_eq!(
            ev.results
                .iter()
                .map(|(_, r)| r.as_str())
                .collect::<Vec<_>>(),
            vec!["exempt", "shadow_reject"]
        );
    }

    /// `exempt = ["verified_bot"]` lets a proven crawler past the rule, and
    /// only the rule that says so; `verified` alone does not.
    #[test]
    fn verified_bots_are_exempt_where_the_rule_says() {
        let mut for_bots = rate_rule("b", vec![level("site", 1, 60)]);
        for_bots.exempt_bots = true;
        let mut for_users = rate_rule("u", vec![level("site", 1, 60)]);
        for_users.exempt_verified = true;
        let now = MonoTime::ZERO;
        let cases: [(&[Rule], bool, &[&str]); 4] = [
            (
                std::slice::from_ref(&for_bots),
                true,
                &["exempt", "exempt", "exempt"],
            ),
            (
                std::slice::from_ref(&for_bots),
                false,
                &["allow", "reject", "reject"],
            ),
            (
                std::slice::from_ref(&for_users),
                true,
                &["allow", "reject", "reject"],
            ),
            (
                std::slice::from_ref(&for_users),
                false,
                &["reject", "reject", "reject"],
            ),
        ];
        for (rules, bot, want) in cases {
            let got: Vec<&str> = (1..=3)
                .map(|i| run_as(rules, &format!("10.9.0.{i}"), None, bot, now))
                .map(|ev| ev.results[0].1.as_str())
                .collect();
            assert_eq!(got, want, "{} bot={bot}", rules[0].name);
        }
    }

    #[test]
    fn a_deferring_rule_defers_and_a_later_refusal_still_refuses() {
        let mut defer = rate_rule("d", vec![level("site", 1, 60)]);
        defer.defer = true;
        defer.exempt_pass = true;
        let refuse = rate_rule("r", vec![level("ip", 2, 60)]);
        let rules = [defer, refuse];
        let now = MonoTime::ZERO;
        let first = run(&rules, "10.0.0.1", None, now);
        assert!(first.rejection.is_none() && first.deferral.is_none());
        // Over `d`: deferred, and `r` still counts it.
        let second = run(&rules, "10.0.0.1", None, now);
        let (deferred, pass_exempts) = second.deferral.expect("deferred");
        assert_eq!((deferred.rule.as_ref(), pass_exempts), ("d", true));
        assert!(second.rejection.is_none());
        let results: Vec<_> = second.results.iter().map(|(_, r)| r.as_str()).collect();
        assert_eq!(results, ["defer", "allow"]);
        // Over `r` too: refused, not deferred.
        let third = run(&rules, "10.0.0.1", None, now);
        assert_eq!(third.rejection.expect("refused").rule.as_ref(), "r");
        assert!(third.deferral.is_none());
        // A pass exempts from `d` only.
        let with_pass = run_with_pass(&rules, "10.0.0.2", None, Some(7), now);
        let results: Vec<_> = with_pass.results.iter().map(|(_, r)| r.as_str()).collect();
        assert_eq!(results, ["exempt", "allow"]);
        assert!(with_pass.deferral.is_none());
    }

    #[test]
    fn a_navigation_that_can_earn_a_pass_is_challenged_not_refused() {
        let mut by_pass = rate_rule("p", vec![level("ip", 1, 60)]);
        by_pass.exempt_pass = true;
        let mut deferring = rate_rule("d", vec![level("subnet", 1, 60)]);
        deferring.exempt_pass = true;
        deferring.defer = true;
        let plain = rate_rule("r", vec![level("site", 10, 60)]);
        let now = MonoTime::ZERO;
        let rules = [by_pass, plain];
        assert!(
            run_facts(&rules, "10.0.0.1", None, None, true, false, now)
                .challenge
                .is_none()
        );
        // Over `p`: a navigation is challenged, anything else refused.
        let nav = run_facts(&rules, "10.0.0.1", None, None, true, false, now);
        assert_eq!(nav.challenge.expect("challenged").rule.as_ref(), "p");
        assert!(nav.rejection.is_none());
        let other = run_facts(&rules, "10.0.0.1", None, None, false, false, now);
        assert_eq!(other.rejection.expect("refused").rule.as_ref(), "p");
        // A rule no pass exempts refuses a navigation too.
        let rules = [rate_rule("s", vec![level("ip", 1, 60)])];
        run_facts(&rules, "10.0.0.9", None, None, true, false, now);
        let nav = run_facts(&rules, "10.0.0.9", None, None, true, false, now);
        assert!(nav.challenge.is_none() && nav.rejection.is_some());
        // A deferring rule defers a navigation (admission decides).
        let rules = [deferring];
        run_facts(&rules, "10.0.1.1", None, None, true, false, now);
        let nav = run_facts(&rules, "10.0.1.2", None, None, true, false, now);
        assert!(nav.challenge.is_none() && nav.deferral.is_some());
    }

    #[test]
    fn concurrency_rule_holds_until_guard_drops() {
        let rules = [Rule {
            name: Arc::from("c"),
            body: RuleBody::Concurrency {
                key: KeyKind::Subnet,
                max: 2,
                table: InflightTable::new(),
                fingerprint: fingerprint(&["c"]),
            },
            exempt_verified: false,
            exempt_pass: false,
            defer: false,
            exempt_bots: false,
            shadow: false,
            methods: vec![],
        }];
        let now = MonoTime::ZERO;
        let a = run(&rules, "10.0.0.1", None, now);
        let b = run(&rules, "10.0.0.2", None, now);
        assert!(a.rejection.is_none() && b.rejection.is_none());
        let c = run(&rules, "10.0.0.3", None, now);
        assert_eq!(c.rejection.as_ref().unwrap().key, "10.0.0.0/24");
        assert!(
            run(&rules, "10.0.1.1", None, now).rejection.is_none(),
            "another /24"
        );
        drop(a);
        assert!(run(&rules, "10.0.0.3", None, now).rejection.is_none());
    }
}
