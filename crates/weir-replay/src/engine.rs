//! The policy run of `weir replay`: each log record through the same route
//! table and rules as live traffic, in log-time order, on log time.
//!
//! What replays exactly: routing, rate rules at every level (the limiter
//! clock is the log's clock), shadow mode, the human-collateral signals that
//! a log can carry (browser navigation headers, low rate before). What cannot:
//! concurrency rules (a log line has no duration, so nothing is ever in
//! flight), sessions verified by an auth sub-request (there is no app to
//! ask; such requests replay as anonymous), and edge limits.
//!
//! Speed (bench `replay`): a record costs no allocation on the way to a
//! verdict beyond the URI and the header values the configuration looks at
//! (headers no route or rule reads are not rebuilt, and one header map is
//! reused); log-time minutes are formatted once per minute; per-rule tallies
//! key on addresses and prefixes, formatted only in [`Replay::finish`].

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use serde::Serialize;

use super::tally::{ClientSet, NetworkSet, SubnetCounts};
use super::{LogRecord, UnixNanos};
use weir::gateway::Gateway;
use weir::identity::forwarded::resolve;
use weir::identity::{AddrSource, ClientAddr, ClientId, Level, PeerAddr, PrefixKey};
use weir::policy::route::RequestView;
use weir::policy::rules::{
    Activity, Judgement, KeyKind, RequestFacts, Rule, RuleBody, RuleObserver, RuleRejection,
    RuleResult, activity_key, judge,
};
use weir_http::target::{Target, TargetError};
use weir_limiter::{MonoTime, ShardedStore};

/// What the configuration decides for one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No route matched: live traffic would get 404.
    NoRoute,
    /// The target cannot be read one way (two hosts, `..;`, `%00`, a
    /// lowercase method): live traffic would get 400 or 501 before any rule.
    Invalid(TargetError),
    Admit,
    Reject(RuleRejection),
}

/// Rejections of one rule.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RuleReport {
    pub rejections: u64,
    /// Requests over this rule's limit that it deferred instead of refusing.
    pub deferrals: u64,
    /// Rejections in shadow mode (would have been refused).
    pub shadow_rejections: u64,
    pub distinct_clients: usize,
    pub distinct_subnets: usize,
    pub distinct_networks: usize,
    /// The busiest rejected /24s (or /64s): prefix, rejections.
    pub top_subnets: Vec<(String, u64)>,
    /// Rejections per minute of log time (`YYYY-MM-DDTHH:MM`, in the
    /// report's `zone`).
    pub per_minute: BTreeMap<String, u64>,
    /// Rejections per minute with evidence of a person (`verified`, `pass`,
    /// `browsing`; not `low_rate` or `browser` alone).
    pub people_per_minute: BTreeMap<String, u64>,
    /// Estimated human collateral, by signal: `low_rate`, `browser`.
    pub collateral: BTreeMap<&'static str, u64>,
    /// Rejections by the level that fired (`ip`, `subnet`, `network`, `site`, ...).
    pub by_level: BTreeMap<&'static str, u64>,
    /// Rejections by user-agent family (`crate::agent::family`).
    pub by_user_agent: BTreeMap<&'static str, u64>,
    #[serde(skip)]
    clients: ClientSet,
    #[serde(skip)]
    subnets: SubnetCounts,
    #[serde(skip)]
    networks: NetworkSet,
    /// Rejections per minute of log time, by minute number: compared as
    /// integers per rejection, formatted into `per_minute` by `finish`.
    #[serde(skip)]
    minutes: BTreeMap<i64, u64>,
    #[serde(skip)]
    people_minutes: BTreeMap<i64, u64>,
}

/// A rule the replay could not judge as live traffic would, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NotReplayed {
    pub rule: String,
    pub reason: &'static str,
}

/// What a replay found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayReport {
    pub records: u64,
    pub admitted: u64,
    /// Of `admitted`, those over a rule with `when_over = "defer"`: live,
    /// they wait in the lowest lane and are served only with capacity nobody
    /// else wants (refused if shed there); a log cannot say which.
    pub deferred: u64,
    pub rejected: u64,
    pub no_route: u64,
    /// Refused before any rule: the target cannot be read one way.
    pub invalid: u64,
    /// The first and last minute of log time, in `zone`.
    pub first: Option<String>,
    pub last: Option<String>,
    /// The UTC offset the report's times are in (`+01:00`): the log's own
    /// (nginx's `$time_local` says it; JSON logs are in UTC).
    pub zone: String,
    pub rules: BTreeMap<String, RuleReport>,
    /// Rules the replay does not judge (they never refuse here): concurrency
    /// rules, since a log line has no duration, so nothing is in flight.
    pub not_replayed: Vec<NotReplayed>,
    /// Requests of verified sessions cannot be told from anonymous ones
    /// (there is no app to ask): set when the configuration verifies them.
    pub sessions_replayed_as_anonymous: bool,
    #[serde(skip)]
    first_minute: Option<i64>,
    #[serde(skip)]
    last_minute: Option<i64>,
}

/// Replays records through a gateway's routes and rules.
pub struct Replay {
    gateway: Gateway,
    activity: Activity,
    start: Option<i64>,
    /// Which of the headers a record can carry the configuration reads.
    wanted: HeaderSet,
    /// Rebuilt per record, reused to keep its allocation.
    headers: HeaderMap,
    /// The rate-rule stores keyed by the client's address or prefix, for
    /// [`Replay::prefetch`].
    address_stores: Vec<(std::sync::Arc<ShardedStore>, Level)>,
    /// Log time (limiter clock) of the next sweep of expired keys.
    next_sweep: MonoTime,
    /// User-agent families of rejected records, remembered per agent.
    families: crate::agent::Families,
    /// Whether [`Replay::prefetch`] is worth its cost: set at each sweep,
    /// when the stores it warms outgrow [`PREFETCH_ABOVE`].
    prefetch_stores: bool,
    pub report: ReplayReport,
}

/// The distinct stores of rate levels keyed by the client's address or
/// prefix, in any route's rules; a few at most are worth warming.
fn address_stores(gateway: &Gateway) -> Vec<(std::sync::Arc<ShardedStore>, Level)> {
    const MAX: usize = 8;
    let mut out: Vec<(std::sync::Arc<ShardedStore>, Level)> = Vec::new();
    let levels = gateway
        .routes
        .routes
        .iter()
        .flat_map(|r| r.rules.iter())
        .filter_map(|rule| match &rule.body {
            RuleBody::Rate(levels) => Some(levels),
            RuleBody::Concurrency { .. } => None,
        })
        .flatten();
    for level in levels {
        let Some(by) = level.key.address_level() else {
            continue;
        };
        if out.len() < MAX
            && !out
                .iter()
                .any(|(s, _)| std::sync::Arc::ptr_eq(s, &level.store))
        {
            out.push((level.store.clone(), by));
        }
    }
    out
}

/// The headers a log record can carry, as a bit set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HeaderSet(u8);

impl HeaderSet {
    const USER_AGENT: u8 = 1;
    const COOKIE: u8 = 2;
    const ACCEPT: u8 = 4;
    const HOST: u8 = 8;
    const SEC_FETCH_MODE: u8 = 16;
    const FORWARDED_FOR: u8 = 32;
    const REFERER: u8 = 64;

    /// The bit of a header name; 0 for a header no record carries.
    fn bit(name: &HeaderName) -> u8 {
        if name == http::header::USER_AGENT {
            Self::USER_AGENT
        } else if name == http::header::COOKIE {
            Self::COOKIE
        } else if name == http::header::ACCEPT {
            Self::ACCEPT
        } else if name == http::header::HOST {
            Self::HOST
        } else if name == SEC_FETCH_MODE {
            Self::SEC_FETCH_MODE
        } else if name == XFF {
            Self::FORWARDED_FOR
        } else if name == http::header::REFERER {
            Self::REFERER
        } else {
            0
        }
    }

    /// The headers routes and rules read: route header and cookie
    /// conditions, header and cookie rule keys. `X-Forwarded-For` always,
    /// for resolving a chain behind a trusted proxy; `Accept` and
    /// `Sec-Fetch-Mode` and `Referer` when there are rules, for the
    /// collateral signals.
    fn read_by(gateway: &Gateway) -> HeaderSet {
        let mut set = Self::FORWARDED_FOR;
        if gateway.routes.routes.iter().any(|r| !r.rules.is_empty()) {
            set |= Self::ACCEPT | Self::SEC_FETCH_MODE | Self::REFERER;
        }
        let mut key = |k: &KeyKind| match k {
            KeyKind::Header(name) => set |= Self::bit(name),
            KeyKind::Cookie(_) => set |= Self::COOKIE,
            _ => {}
        };
        for route in &gateway.routes.routes {
            for rule in route.rules.iter() {
                match &rule.body {
                    RuleBody::Rate(levels) => levels.iter().for_each(|l| key(&l.key)),
                    RuleBody::Concurrency { key: k, .. } => key(k),
                }
            }
        }
        for route in &gateway.routes.routes {
            for name in &route.headers {
                set |= Self::bit(name);
            }
            if !route.cookies.is_empty() {
                set |= Self::COOKIE;
            }
        }
        HeaderSet(set)
    }

    fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }
}

/// Addresses tracked for the low-rate signal.
const ACTIVITY_KEYS: usize = 1 << 20;
/// How often, in log time, the limiter stores drop keys that expired (as
/// the live proxy sweeps its stores every snapshot interval). Without it
/// a store keeps every key it ever held until it reaches its cap: tens of
/// megabytes of mostly expired slots at a million addresses, and a cache
/// miss on nearly every lookup. Keys are dropped only once expired for this
/// long too, so a record up to this much older than the newest one decided
/// (a log read in file order) still finds every key it could.
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// Table bytes of the stores [`Replay::prefetch`] warms above which it
/// pays: below, swept tables stay in the cache and computing each level's
/// key for the prefetch cost ~300 instructions a record for nothing.
const PREFETCH_ABOVE: usize = 1 << 20;
const NANOS_PER_MINUTE: i64 = 60_000_000_000;
/// Prefixes listed per rule.
const TOP: usize = 10;

static SEC_FETCH_MODE: HeaderName = HeaderName::from_static("sec-fetch-mode");
static XFF: HeaderName = HeaderName::from_static("x-forwarded-for");

impl Replay {
    pub fn new(gateway: Gateway) -> Replay {
        Replay {
            wanted: HeaderSet::read_by(&gateway),
            address_stores: address_stores(&gateway),
            activity: Activity::new(ACTIVITY_KEYS),
            start: None,
            headers: HeaderMap::new(),
            next_sweep: MonoTime::ZERO + SWEEP_EVERY,
            prefetch_stores: false,
            families: crate::agent::Families::default(),
            report: ReplayReport {
                not_replayed: not_replayed(&gateway),
                sessions_replayed_as_anonymous: gateway.sessions.is_some(),
                ..ReplayReport::default()
            },
            gateway,
        }
    }

    /// Starts loading the limiter slots that deciding a record from
    /// `client` will look up: its activity and every address-keyed level of
    /// every rate rule. With millions of distinct addresses each lookup
    /// misses the cache; called with the next record's client before the
    /// current record is decided, the loads overlap that work. Does
    /// nothing while those stores are small enough to stay in the cache.
    pub fn prefetch(&self, client: IpAddr) {
        if !self.prefetch_stores {
            return;
        }
        let client = ClientAddr::new(client);
        self.activity.store().prefetch(activity_key(client));
        for (store, level) in &self.address_stores {
            store.prefetch(client.key(*level).digest());
        }
    }

    /// Drops the keys that expired over [`SWEEP_EVERY`] before `now` from
    /// every store. Expiry is exact (an expired key decides as an absent one
    /// would), so this changes no verdict; it keeps the stores as small as
    /// the keys still live.
    fn sweep(&mut self, now: MonoTime) {
        let cutoff =
            MonoTime::from_nanos(now.as_nanos().saturating_sub(SWEEP_EVERY.as_nanos() as u64));
        for partition in self.gateway.rule_stores.partitions() {
            partition.store.sweep(cutoff);
        }
        self.activity.store().sweep(cutoff);
        self.next_sweep = now + SWEEP_EVERY;
        let warmed = self.activity.store().table_bytes()
            + self
                .address_stores
                .iter()
                .map(|(store, _)| store.table_bytes())
                .sum::<usize>();
        self.prefetch_stores = warmed > PREFETCH_ABOVE;
    }

    /// Decides one record (records must come in log-time order).
    pub fn decide(&mut self, rec: &LogRecord<'_>) -> Verdict {
        let (now, minute_number) = self.tick(rec);
        fill_headers(&mut self.headers, self.wanted, rec);
        let headers = &self.headers;
        let gw = &self.gateway;
        let client = client_of(gw, headers, rec);
        // The live path's reading of the request line and host.
        let target = match Target::parse(
            &rec.method,
            &rec.target,
            rec.host.as_deref(),
            gw.path_policy,
        ) {
            Ok(t) => t,
            Err(e) => {
                self.report.invalid += 1;
                return Verdict::Invalid(e);
            }
        };
        let Some(route) = gw.routes.find(&RequestView {
            target: &target,
            headers,
        }) else {
            self.report.no_route += 1;
            return Verdict::NoRoute;
        };
        if route.rules.is_empty() {
            self.report.admitted += 1;
            return Verdict::Admit;
        }
        // A visit only weir's own log records (a log of another server
        // cannot show one: no request of it is `browsing`).
        let in_visit = browsing(gw, rec);
        let facts = replay_facts(&client, target.method(), headers, now, in_visit);
        // The live rules phase, on the log's clock.
        let mut observer = Tally {
            activity: &self.activity,
            low_rate: &gw.low_rate,
            rules: &mut self.report.rules,
            minute: minute_number,
            user_agent: rec.user_agent.as_deref(),
            families: &mut self.families,
        };
        let judged = poll_now(judge(
            &route.rules,
            &facts,
            gw.rules_shadow,
            None,
            &mut observer,
        ));
        self.count(judged)
    }

    /// Moves the replay's clock to `rec`'s time: counts the record, sweeps
    /// when due, and notes its minute. Returns the limiter's time (the
    /// log's clock from the first record) and the minute's number (a
    /// number until `finish` formats it in the log's zone).
    fn tick(&mut self, rec: &LogRecord<'_>) -> (MonoTime, i64) {
        let start = *self.start.get_or_insert(rec.time.0);
        let now = MonoTime::from_nanos(u64::try_from(rec.time.0 - start).unwrap_or(0));
        self.report.records += 1;
        if now >= self.next_sweep {
            self.sweep(now);
        }
        let minute_number = rec.time.0.div_euclid(NANOS_PER_MINUTE);
        self.report.first_minute.get_or_insert(minute_number);
        self.report.last_minute = Some(minute_number);
        (now, minute_number)
    }

    /// Counts what the rules phase judged: a deferral, then the verdict.
    fn count(&mut self, judged: Judgement) -> Verdict {
        if let Some(d) = &judged.deferral {
            self.report.deferred += 1;
            let rr = self
                .report
                .rules
                .entry(d.rejection.rule.to_string())
                .or_default();
            rr.deferrals += 1;
        }
        match judged.rejection {
            None => {
                self.report.admitted += 1;
                Verdict::Admit
            }
            Some(r) => {
                self.report.rejected += 1;
                Verdict::Reject(r)
            }
        }
    }

    /// Finishes the per-rule summaries, with times in UTC.
    pub fn finish(self) -> ReplayReport {
        self.finish_in(0)
    }

    /// Finishes the per-rule summaries, with times at `utc_offset` seconds
    /// east of UTC (the log's own zone: [`super::ParseStats::utc_offset`]).
    pub fn finish_in(mut self, utc_offset: i64) -> ReplayReport {
        let stamp = |m: i64| minute(m, utc_offset);
        let report = &mut self.report;
        report.zone = zone(utc_offset);
        report.first = report.first_minute.map(stamp);
        report.last = report.last_minute.map(stamp);
        for rr in report.rules.values_mut() {
            rr.distinct_clients = rr.clients.len();
            rr.distinct_subnets = rr.subnets.len();
            rr.distinct_networks = rr.networks.len();
            rr.top_subnets = top_prefixes(rr.subnets.drain(), TOP);
            let stamped = |m: &mut BTreeMap<i64, u64>| {
                std::mem::take(m)
                    .into_iter()
                    .map(|(m, n)| (stamp(m), n))
                    .collect()
            };
            rr.per_minute = stamped(&mut rr.minutes);
            rr.people_per_minute = stamped(&mut rr.people_minutes);
        }
        self.report
    }
}

/// The `n` busiest prefixes, busiest first, ties by their text. Only the
/// prefixes that can make the list are formatted (there may be millions).
fn top_prefixes(counts: impl Iterator<Item = (PrefixKey, u64)>, n: usize) -> Vec<(String, u64)> {
    let mut all: Vec<(PrefixKey, u64)> = counts.collect();
    if n == 0 {
        return Vec::new();
    }
    if all.len() > n {
        // The n-th largest count: everything below it cannot make the list.
        all.select_nth_unstable_by(n - 1, |a, b| b.1.cmp(&a.1));
        let floor = all[n - 1].1;
        all.retain(|(_, c)| *c >= floor);
    }
    let mut top: Vec<(String, u64)> = all.into_iter().map(|(k, c)| (k.to_string(), c)).collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    top.truncate(n);
    top
}

/// The report of rule `name`, created on its first rejection.
/// What the rules phase reports, in a replay: the activity table behind the
/// low-rate signal, and each rule's rejections in the report.
struct Tally<'a> {
    activity: &'a Activity,
    low_rate: &'a weir_limiter::Quota,
    rules: &'a mut BTreeMap<String, RuleReport>,
    /// The record's minute of log time.
    minute: i64,
    user_agent: Option<&'a str>,
    families: &'a mut crate::agent::Families,
}

impl RuleObserver for Tally<'_> {
    fn low_rate(&mut self, client: ClientAddr, now: MonoTime) -> bool {
        self.activity.observe(client, self.low_rate, now)
    }

    fn result(&mut self, _rule: &Rule, _result: RuleResult) {}

    fn rejected(
        &mut self,
        rejection: &RuleRejection,
        client: ClientAddr,
        signal: Option<weir::evidence::Collateral>,
        enforced: bool,
    ) {
        let rr = rule_report(self.rules, &rejection.rule);
        if !enforced {
            rr.shadow_rejections += 1;
            return;
        }
        rr.rejections += 1;
        rr.clients.insert(client.ip());
        rr.subnets.add(client);
        rr.networks.insert(client);
        *rr.minutes.entry(self.minute).or_insert(0) += 1;
        *rr.by_level.entry(rejection.level).or_insert(0) += 1;
        *rr.by_user_agent
            .entry(self.families.family(self.user_agent))
            .or_insert(0) += 1;
        if let Some(s) = signal {
            *rr.collateral.entry(s.as_str()).or_insert(0) += 1;
            if s.is_person_evidence() {
                *rr.people_minutes.entry(self.minute).or_insert(0) += 1;
            }
        }
    }
}

fn rule_report<'a>(rules: &'a mut BTreeMap<String, RuleReport>, name: &str) -> &'a mut RuleReport {
    // Looked up by `&str` first: a rule's name is copied once, not per rejection.
    if !rules.contains_key(name) {
        rules.insert(name.to_string(), RuleReport::default());
    }
    rules.get_mut(name).expect("inserted above")
}

/// Whether `rec` is a navigation in a visit weir counted as a person's, by
/// the replayed configuration's `[visit]`.
fn browsing(gw: &Gateway, rec: &LogRecord<'_>) -> bool {
    let visit = rec.weir.as_ref().and_then(|w| w.visit);
    gw.visits.as_ref().zip(visit).is_some_and(|(visits, v)| {
        let age = std::time::Duration::from_secs(u64::from(v.age_s));
        visits.logged_is_browsing(v.views, v.costly, age)
    })
}

/// What the rules know of a replayed request: what its log line shows, and
/// nothing a replay cannot re-verify (no user, no pass, no verified bot).
fn replay_facts<'a>(
    client: &'a ClientId,
    method: &'a Method,
    headers: &'a HeaderMap,
    now: MonoTime,
    browsing: bool,
) -> RequestFacts<'a> {
    RequestFacts {
        client,
        method,
        headers,
        user: None,
        pass: None,
        looped: false,
        // The log's `bot` is not believed: a replay cannot re-verify it.
        bot: false,
        now,
        browsing,
        // Replay has no challenge to offer: a refusal stays a refusal.
        challengeable: false,
    }
}

/// The client of a record: its address, or, for a log written behind a
/// trusted proxy, the client its forwarding chain names.
fn client_of(gw: &Gateway, headers: &HeaderMap, rec: &LogRecord<'_>) -> ClientId {
    let peer = PeerAddr(std::net::SocketAddr::new(rec.peer.unwrap_or(rec.client), 0));
    if rec.forwarded_for.is_some() && gw.trusted.contains(peer.ip()) {
        resolve(peer, None, headers, &gw.trusted, gw.client_header).client
    } else {
        ClientId {
            peer,
            client: ClientAddr::new(rec.client),
            source: AddrSource::Peer,
        }
    }
}

/// Fills `h` with the headers of `rec` that rules and routes look at
/// (`wanted`); the others are never read, so not rebuilt.
fn fill_headers(h: &mut HeaderMap, wanted: HeaderSet, rec: &LogRecord<'_>) {
    if !h.is_empty() {
        h.clear();
    }
    let fields = [
        (
            HeaderSet::USER_AGENT,
            &http::header::USER_AGENT,
            &rec.user_agent,
        ),
        (HeaderSet::COOKIE, &http::header::COOKIE, &rec.cookie),
        (HeaderSet::ACCEPT, &http::header::ACCEPT, &rec.accept),
        (HeaderSet::HOST, &http::header::HOST, &rec.host),
        (
            HeaderSet::SEC_FETCH_MODE,
            &SEC_FETCH_MODE,
            &rec.sec_fetch_mode,
        ),
        (HeaderSet::FORWARDED_FOR, &XFF, &rec.forwarded_for),
        (HeaderSet::REFERER, &http::header::REFERER, &rec.referer),
    ];
    // Checked here, not in a helper per header: most records carry none of
    // the headers the configuration reads.
    for (bit, name, value) in fields {
        if wanted.has(bit)
            && let Some(value) = value
            && let Ok(value) = HeaderValue::from_str(value)
        {
            h.insert(name.clone(), value);
        }
    }
}

/// Replay never waits (no shared limiter, no I/O): the future is ready on
/// its first poll.
fn poll_now<F: std::future::Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        // Without a shared limiter nothing awaits; if that ever changes, wait
        // politely instead of failing the replay.
        Poll::Pending => loop {
            std::thread::sleep(Duration::from_millis(1));
            if let Poll::Ready(v) = fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
                break v;
            }
        },
    }
}

/// Minute number `m` of Unix time as `YYYY-MM-DDTHH:MM` at `utc_offset`
/// seconds east of UTC.
pub(crate) fn minute(m: i64, utc_offset: i64) -> String {
    let t = UnixNanos(m * NANOS_PER_MINUTE).saturating_add_secs(utc_offset);
    let s = humantime::format_rfc3339_seconds(t.to_system_time()).to_string();
    s[..16.min(s.len())].to_string()
}

/// An offset as ISO 8601 writes it: `+01:00`, `-05:30`, `+00:00`.
fn zone(utc_offset: i64) -> String {
    let sign = if utc_offset < 0 { '-' } else { '+' };
    let m = utc_offset.unsigned_abs() / 60;
    format!("{sign}{:02}:{:02}", m / 60, m % 60)
}

/// The rules no record can trip in a replay, with the reason.
fn not_replayed(gateway: &Gateway) -> Vec<NotReplayed> {
    let mut out: Vec<NotReplayed> = Vec::new();
    for rule in gateway.routes.routes.iter().flat_map(|r| r.rules.iter()) {
        if matches!(rule.body, RuleBody::Concurrency { .. })
            && !out.iter().any(|n| *n.rule == *rule.name)
        {
            out.push(NotReplayed {
                rule: rule.name.to_string(),
                reason: "a concurrency rule: a log line has no duration, so no request is in flight",
            });
        }
    }
    out
}

impl std::fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} requests from {} to {} ({}): {} admitted, {} rejected, {} unrouted",
            self.records,
            self.first.as_deref().unwrap_or("-"),
            self.last.as_deref().unwrap_or("-"),
            self.zone,
            self.admitted,
            self.rejected,
            self.no_route
        )?;
        if self.deferred > 0 {
            writeln!(
                f,
                "{} of those admitted were over a rule that defers: live, they wait in the lowest lane \
                 and are served only with capacity nobody else wants (a log cannot tell which would be)",
                self.deferred
            )?;
        }
        if self.invalid > 0 {
            writeln!(
                f,
                "{} refused before any rule: their target cannot be read one way (400/501)",
                self.invalid
            )?;
        }
        for n in &self.not_replayed {
            writeln!(f, "not replayed: rule {} ({})", n.rule, n.reason)?;
        }
        if self.sessions_replayed_as_anonymous {
            writeln!(
                f,
                "not replayed: session verification (no app to ask): every request replays as anonymous"
            )?;
        }
        for (name, r) in &self.rules {
            write_rule(f, name, r)?;
        }
        Ok(())
    }
}

/// A rule's section of the text report: whom it rejected, the likely
/// people among them, by level, user agent and prefix, and its busiest minute.
fn write_rule(f: &mut std::fmt::Formatter<'_>, name: &str, r: &RuleReport) -> std::fmt::Result {
    writeln!(
        f,
        "\nrule {name}: {} rejected ({} shadow, {} deferred) from {} clients in {} /24s and {} /16s",
        r.rejections,
        r.shadow_rejections,
        r.deferrals,
        r.distinct_clients,
        r.distinct_subnets,
        r.distinct_networks
    )?;
    if !r.collateral.is_empty() {
        let parts: Vec<String> = r
            .collateral
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        writeln!(f, "  possible human collateral: {}", parts.join(", "))?;
    }
    writeln!(f, "  by level: {}", breakdown(&r.by_level, usize::MAX))?;
    writeln!(f, "  by user agent: {}", breakdown(&r.by_user_agent, 8))?;
    for (prefix, n) in &r.top_subnets {
        writeln!(f, "  {n:>8}  {prefix}")?;
    }
    if !r.per_minute.is_empty() {
        let peak = r.per_minute.iter().max_by_key(|(_, n)| **n);
        if let Some((m, n)) = peak {
            writeln!(f, "  busiest minute: {m} with {n} rejections")?;
        }
    }
    Ok(())
}

/// `name n, name n, ...`, largest first (ties by name), at most `top`
/// entries and `others n` for the rest.
fn breakdown(counts: &BTreeMap<&'static str, u64>, top: usize) -> String {
    let mut all: Vec<(&str, u64)> = counts.iter().map(|(k, v)| (*k, *v)).collect();
    all.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let rest: u64 = all.iter().skip(top).map(|(_, n)| n).sum();
    let mut parts: Vec<String> = all
        .iter()
        .take(top)
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    if rest > 0 {
        parts.push(format!("others {rest}"));
    }
    parts.join(", ")
}

/// The replay of one run: report plus parse statistics.
#[derive(Debug, Serialize)]
pub struct ReplayRun {
    pub report: ReplayReport,
    pub lines: u64,
    pub malformed: u64,
    /// The first malformed lines: (file index, line number, error).
    pub malformed_examples: Vec<(usize, u64, String)>,
}

/// Reads `logs` (merged by time) and replays them through `gateway`.
/// `each` sees every record's verdict (for tests and per-line output).
pub fn replay_files(
    gateway: Gateway,
    logs: &[std::path::PathBuf],
    options: &super::ReaderOptions,
    mut each: impl FnMut(&LogRecord<'_>, &Verdict),
) -> std::io::Result<ReplayRun> {
    let mut sources = Vec::new();
    for path in logs {
        let reader = super::LogReader::open(path, options.clone())
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        sources.push(reader.ordered());
    }
    let mut merged = super::MergedRecords::new(sources);
    let mut replay = Replay::new(gateway);
    merged.for_each_record(|_, rec, next| {
        if let Some(next) = next {
            replay.prefetch(next);
        }
        let v = replay.decide(rec);
        each(rec, &v);
    })?;
    let mut lines = 0;
    let mut malformed = 0;
    let mut malformed_examples = Vec::new();
    // Times in the zone of the first file that says one.
    let utc_offset = merged
        .stats()
        .iter()
        .find_map(|s| s.utc_offset)
        .unwrap_or(0);
    for (i, s) in merged.stats().into_iter().enumerate() {
        lines += s.lines;
        malformed += s.malformed;
        for e in &s.examples {
            malformed_examples.push((i, e.line, e.error.to_string()));
        }
    }
    Ok(ReplayRun {
        report: replay.finish_in(utc_offset),
        lines,
        malformed,
        malformed_examples,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(s: &str) -> PrefixKey {
        let ip: IpAddr = s.parse().expect("test address");
        ClientAddr::new(ip).key(Level::Subnet)
    }

    #[test]
    fn top_prefixes_busiest_first_ties_by_text() {
        // (counts, n, expected)
        type Case = (
            &'static [(&'static str, u64)],
            usize,
            &'static [(&'static str, u64)],
        );
        let cases: &[Case] = &[
            (&[], 3, &[]),
            (&[("10.0.0.1", 5)], 0, &[]),
            (
                &[("10.0.0.1", 1), ("10.0.1.1", 3)],
                3,
                &[("10.0.1.0/24", 3), ("10.0.0.0/24", 1)],
            ),
            (
                &[
                    ("10.0.3.1", 2),
                    ("10.0.1.1", 2),
                    ("10.0.2.1", 2),
                    ("10.0.9.1", 7),
                ],
                2,
                &[("10.0.9.0/24", 7), ("10.0.1.0/24", 2)],
            ),
            (
                &[
                    ("10.0.5.1", 1),
                    ("10.0.4.1", 9),
                    ("10.0.3.1", 1),
                    ("10.0.2.1", 8),
                ],
                2,
                &[("10.0.4.0/24", 9), ("10.0.2.0/24", 8)],
            ),
        ];
        for (i, (counts, n, want)) in cases.iter().enumerate() {
            let got = top_prefixes(counts.iter().map(|(ip, c)| (prefix(ip), *c)), *n);
            let want: Vec<(String, u64)> = want.iter().map(|(p, c)| (p.to_string(), *c)).collect();
            assert_eq!(got, want, "case {i}");
        }
    }

    fn replay_of(rules: &str) -> Replay {
        let text = format!(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n[pools.app]\nservers = [\"127.0.0.1:9\"]\n\
             [[routes]]\npool = \"app\"\nclass = \"page\"\n{rules}"
        );
        let env = std::collections::HashMap::<String, String>::new();
        let loaded = weir::config::load_str(&text, None, &env).expect("test config");
        Replay::new(Gateway::build(loaded, None, 1).expect("test gateway"))
    }

    fn record(secs: i64, ip: &str, ua: &str) -> LogRecord<'static> {
        LogRecord {
            time: UnixNanos(1_791_608_136_000_000_000 + secs * 1_000_000_000),
            client: ip.parse().expect("test address"),
            peer: None,
            method: "GET".into(),
            host: None,
            target: "/x".into(),
            status: 200,
            bytes: 1,
            user_agent: Some(ua.to_string().into()),
            referer: None,
            cookie: Some("s=1".into()),
            accept: None,
            sec_fetch_mode: None,
            forwarded_for: None,
            weir: None,
        }
    }

    #[test]
    fn targets_are_read_as_the_live_path_reads_them() {
        // Issue 17: replay split `host:port` on the first `:` (so
        // `[2001:db8::1]:8080` matched no host route) and matched raw paths.
        let text = "[[listeners]]\naddress = \"127.0.0.1:0\"\n[pools.app]\nservers = [\"127.0.0.1:9\"]\n\
             [[routes]]\npool = \"app\"\nclass = \"v6\"\nhost = \"[2001:db8::1]\"\n\
             [[routes]]\npool = \"app\"\nclass = \"search\"\npath_prefix = \"/w/index.php\"\nquery_keys = [\"search\"]\n\
             [[classes.v6.rules]]\nname = \"v6\"\nlimits = [{ per = \"site\", rate = 1, window = \"1h\" }]\n\
             [[classes.search.rules]]\nname = \"search\"\nlimits = [{ per = \"site\", rate = 1, window = \"1h\" }]\n";
        let env = std::collections::HashMap::<String, String>::new();
        let loaded = weir::config::load_str(text, None, &env).expect("test config");
        let mut replay = Replay::new(Gateway::build(loaded, None, 1).expect("test gateway"));
        let at = |secs: i64, host: Option<&'static str>, target: &'static str| LogRecord {
            host: host.map(Into::into),
            target: target.into(),
            ..record(secs, "10.0.0.1", "a")
        };
        let v6 = Some("[2001:DB8::1]:8080");
        let wiki = Some("wiki.example");
        assert_eq!(replay.decide(&at(0, v6, "/")), Verdict::Admit);
        assert!(matches!(replay.decide(&at(1, v6, "/x")), Verdict::Reject(r) if &*r.rule == "v6"));
        assert_eq!(
            replay.decide(&at(2, wiki, "/w/index.php?search=a")),
            Verdict::Admit
        );
        assert!(matches!(
            replay.decide(&at(3, wiki, "//w/./index.php?%73earch=b")),
            Verdict::Reject(r) if &*r.rule == "search"
        ));
        assert_eq!(replay.decide(&at(4, wiki, "/wiki/Page")), Verdict::NoRoute);
        assert_eq!(
            replay.decide(&at(5, Some("a.example:99999"), "/")),
            Verdict::Invalid(TargetError::InvalidHost)
        );
        assert_eq!(
            replay.decide(&at(6, wiki, "/static/..;/w/index.php?search=a")),
            Verdict::Invalid(TargetError::DotParameter)
        );
        let report = replay.finish();
        assert_eq!(
            (
                report.admitted,
                report.rejected,
                report.invalid,
                report.no_route
            ),
            (2, 2, 2, 1)
        );
    }

    #[test]
    fn headers_rules_read_are_rebuilt() {
        let rule = |per: &str| {
            format!(
                "[[classes.page.rules]]\nname = \"r\"\nlimits = [{{ per = \"{per}\", rate = 1, window = \"1m\" }}]\n"
            )
        };
        // (rule key, which headers are rebuilt, verdicts of: a, a again, b from another address)
        type Case = (&'static str, u8, [bool; 3]);
        let cases: &[Case] = &[
            (
                "header:user-agent",
                HeaderSet::USER_AGENT | HeaderSet::FORWARDED_FOR,
                [true, false, true],
            ),
            (
                "cookie:s",
                HeaderSet::COOKIE | HeaderSet::FORWARDED_FOR,
                [true, false, false],
            ),
            ("ip", HeaderSet::FORWARDED_FOR, [true, false, true]),
        ];
        for (per, wanted, admits) in cases {
            let mut replay = replay_of(&rule(per));
            // Every case has a rule: the collateral signal reads these too.
            let signal = HeaderSet::ACCEPT | HeaderSet::SEC_FETCH_MODE | HeaderSet::REFERER;
            assert_eq!(replay.wanted, HeaderSet(*wanted | signal), "{per}");
            let got: Vec<bool> = [
                record(0, "10.0.0.1", "a"),
                record(1, "10.0.0.1", "a"),
                record(2, "10.0.0.2", "b"),
            ]
            .iter()
            .map(|r| replay.decide(r) == Verdict::Admit)
            .collect();
            assert_eq!(got, admits, "{per}");
            let report = replay.finish();
            assert_eq!(
                report.rules["r"].rejections,
                admits.iter().filter(|a| !**a).count() as u64
            );
        }
    }

    #[test]
    fn stores_drop_expired_keys_without_changing_verdicts() {
        let mut replay = replay_of(
            "[[classes.page.rules]]\nname = \"r\"\nlimits = [{ per = \"ip\", rate = 1, window = \"1m\" }]\n",
        );
        let filler = |t: i64| record(t, &format!("10.0.{}.{}", t / 256, t % 256), "ua");
        // (record, admitted?)
        let mut cases = vec![(record(0, "192.0.2.1", "ua"), true)];
        cases.extend((1..=65).map(|t| (filler(t), true)));
        // 7 s out of order, after sweeps at 10 s steps up to 60 s: the key of
        // 192.0.2.1 (free again at 60 s) must still be there.
        cases.push((record(58, "192.0.2.1", "ua"), false));
        cases.extend((66..=200).map(|t| (filler(t), true)));
        cases.push((record(200, "192.0.2.1", "ua"), true));
        for (i, (rec, admit)) in cases.iter().enumerate() {
            assert_eq!(replay.decide(rec) == Verdict::Admit, *admit, "case {i}");
        }
        // Swept at 200 s: keys free again before 190 s (requests before
        // 130 s) are gone; about 70 of the 202 remain.
        let held: usize = replay
            .gateway
            .rule_stores
            .partitions()
            .iter()
            .map(|p| p.store.len())
            .sum();
        assert!((60..=80).contains(&held), "{held} keys held");
        assert!(
            replay.activity.store().len() < 20,
            "{}",
            replay.activity.store().len()
        );
        assert_eq!(replay.finish().rules["r"].rejections, 1);
    }

    #[test]
    fn a_deferring_rule_admits_and_counts_its_deferrals() {
        let mut replay = replay_of(
            "[[classes.page.rules]]\nname = \"d\"\nwhen_over = \"defer\"\nlimits = [{ per = \"ip\", rate = 1, window = \"1m\" }]\n",
        );
        for t in 0..3 {
            assert_eq!(replay.decide(&record(t, "10.0.0.1", "ua")), Verdict::Admit);
        }
        let report = replay.finish();
        assert_eq!(
            (report.admitted, report.deferred, report.rejected),
            (3, 2, 0)
        );
        assert_eq!(report.rules["d"].deferrals, 2);
        assert_eq!(report.rules["d"].rejections, 0);
        assert!(
            report
                .to_string()
                .contains("2 of those admitted were over a rule that defers")
        );
    }

    #[test]
    fn rejections_per_minute_of_log_time() {
        let mut replay = replay_of(
            "[[classes.page.rules]]\nname = \"r\"\nlimits = [{ per = \"site\", rate = 1, window = \"1h\" }]\n",
        );
        // The first and the last record are admitted, the others refused.
        // Record time 0 is 36 s into its minute.
        let secs = [0, 1, 20, 24, 25, 90, 3600 * 30];
        for s in secs {
            replay.decide(&record(s, "10.0.0.1", "ua"));
        }
        let stamp = |s: i64| {
            let t = record(s, "10.0.0.1", "ua").time;
            minute(t.0.div_euclid(NANOS_PER_MINUTE), 0)
        };
        let want: BTreeMap<String, u64> = [(stamp(1), 2), (stamp(24), 2), (stamp(90), 1)]
            .into_iter()
            .collect();
        assert_eq!(want.len(), 3, "{want:?}");
        let report = replay.finish();
        assert_eq!(report.rules["r"].per_minute, want);
        assert_eq!(report.first.as_deref(), Some(stamp(0).as_str()));
        assert_eq!(report.last.as_deref(), Some(stamp(3600 * 30).as_str()));
    }

    #[test]
    fn times_in_the_logs_zone() {
        let mut replay = replay_of(
            "[[classes.page.rules]]\nname = \"r\"\nlimits = [{ per = \"site\", rate = 1, window = \"1h\" }]\n",
        );
        for s in [0, 60] {
            replay.decide(&record(s, "10.0.0.1", "ua"));
        }
        let utc = |s: i64| {
            let t = record(s, "10.0.0.1", "ua").time;
            minute(t.0.div_euclid(NANOS_PER_MINUTE), 0)
        };
        let local = |s: i64| {
            let t = record(s, "10.0.0.1", "ua").time;
            minute(t.0.div_euclid(NANOS_PER_MINUTE), -(5 * 3600 + 30 * 60))
        };
        assert_ne!(utc(0), local(0));
        let report = replay.finish_in(-(5 * 3600 + 30 * 60));
        assert_eq!(report.zone, "-05:30");
        assert_eq!(report.first.as_deref(), Some(local(0).as_str()));
        assert_eq!(
            report.rules["r"].per_minute.keys().collect::<Vec<_>>(),
            [&local(60)]
        );
        assert_eq!(zone(3600), "+01:00");
        assert_eq!(zone(0), "+00:00");
    }

    #[test]
    fn prefetch_only_while_stores_outgrow_the_cache() {
        let mut replay = replay_of(
            "[[classes.page.rules]]\nname = \"r\"\nlimits = [{ per = \"ip\", rate = 1, window = \"1h\" }]\n",
        );
        let at = |t: i64, i: u32| {
            record(
                t,
                &std::net::Ipv4Addr::from_bits(0x0a00_0000 + i).to_string(),
                "ua",
            )
        };
        // 100,000 addresses in the first 10 s (their keys live an hour),
        // then the sweep at 10 s measures the tables.
        let n = 100_000;
        for i in 0..n {
            replay.decide(&at(i64::from(i) / 10_000, i));
        }
        assert!(!replay.prefetch_stores, "no sweep yet");
        replay.decide(&at(10, n));
        assert!(
            replay.prefetch_stores,
            "{} bytes",
            replay.activity.store().table_bytes()
        );
        // Two hours on, the sweep leaves a few keys: no more prefetching.
        replay.decide(&at(7200, n + 1));
        assert!(!replay.prefetch_stores);
    }

    #[test]
    fn header_set_bits() {
        let cases: &[(&str, u8)] = &[
            ("user-agent", HeaderSet::USER_AGENT),
            ("cookie", HeaderSet::COOKIE),
            ("accept", HeaderSet::ACCEPT),
            ("host", HeaderSet::HOST),
            ("sec-fetch-mode", HeaderSet::SEC_FETCH_MODE),
            ("x-forwarded-for", HeaderSet::FORWARDED_FOR),
            ("referer", HeaderSet::REFERER),
            ("x-api-key", 0),
        ];
        for (name, bit) in cases {
            let name = HeaderName::from_static(name);
            assert_eq!(HeaderSet::bit(&name), *bit, "{name}");
        }
    }
}
