//! The live page's last 15 minutes (`/ui`): one [`Second`] for each second
//! of what requests got (by outcome and by status class, p50 and p99
//! latency, the refusals and how many of them showed evidence of a person)
//! and what each pool held (in flight, the adaptive limit, waiting, the
//! mean queue wait of those admitted), and the user-agent families and
//! prefixes refused most, minute by minute.
//!
//! Owns the bookkeeping only. Requests are counted where their log record
//! is written (`proxy::log`), with relaxed atomics (no lock on the request
//! path but for a refusal's family and prefix); the server's timeline task
//! closes each second with its pool samples; `admin::ui` serves the result.
//! Memory is bounded whatever the traffic: [`KEPT_SECONDS`] seconds, and
//! [`KEPT_MINUTES`] minutes of at most [`MAX_FAMILIES`] families and
//! [`MAX_PREFIXES`] prefixes each.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use ipnet::IpNet;
use serde::Serialize;

use super::AccessRecord;
use super::access_log::{Coalescing, Verdict};
use crate::evidence::{ChallengeMark, SessionKind};

/// Seconds kept: the 15 minutes the page draws.
pub const KEPT_SECONDS: usize = 900;
/// Minutes of refused families and prefixes kept.
pub const KEPT_MINUTES: u64 = 15;
/// User-agent families counted per minute; one first seen past it is not
/// counted (a flood's families are among its first requests).
const MAX_FAMILIES: usize = 64;
/// Refused prefixes counted per minute, on the same terms.
const MAX_PREFIXES: usize = 1_000;
/// Latency buckets: two per power of two of microseconds (the last holds
/// everything from about 36 minutes up).
const BUCKETS: usize = 64;
/// The longest family name kept (a user agent is the client's to write).
const FAMILY_LEN: usize = 32;

/// What a request got, as the page's first chart splits it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// The app answered it (or a coalesced copy of the app's answer).
    Served,
    /// The challenge page, or the challenge's own endpoints.
    Challenged,
    /// A rule refused it.
    Refused,
    /// weir had no room for it: a `503` no server answered (admission
    /// shed it, or no server was healthy).
    Shed,
    /// Anything else weir answered: a request it could not read, a route
    /// it does not have, an app that failed, a client that left.
    Other,
}

impl Outcome {
    fn of(r: &AccessRecord) -> Outcome {
        if r.upstream_status.is_some() || r.coalesced == Some(Coalescing::Shared) {
            Outcome::Served
        } else if r.decision == Verdict::Challenge
            || r.challenge.is_some_and(ChallengeMark::is_challenge_answer)
        {
            Outcome::Challenged
        } else if r.rule_level.is_some() {
            Outcome::Refused
        } else if r.status == 503 {
            Outcome::Shed
        } else {
            Outcome::Other
        }
    }
}

/// Requests per outcome in one second.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Outcomes {
    pub served: u32,
    pub challenged: u32,
    pub refused: u32,
    pub shed: u32,
    pub other: u32,
}

/// Responses per status class in one second.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Statuses {
    #[serde(rename = "1xx")]
    pub s1: u32,
    #[serde(rename = "2xx")]
    pub s2: u32,
    #[serde(rename = "3xx")]
    pub s3: u32,
    #[serde(rename = "4xx")]
    pub s4: u32,
    #[serde(rename = "5xx")]
    pub s5: u32,
}

/// One pool at the end of a second.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoolSecond {
    #[serde(serialize_with = "name")]
    pub pool: Arc<str>,
    pub in_flight: u64,
    /// The adaptive limit in force; `None` without an admission queue.
    pub limit: Option<u64>,
    /// Requests waiting in the queue's lanes.
    pub queued: u64,
    /// The mean queue wait of the requests admitted in this second;
    /// `None` when none was.
    pub wait_ms: Option<f64>,
}

/// One second of the timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Second {
    /// The second's end, Unix time.
    pub at_unix_s: u64,
    pub outcomes: Outcomes,
    pub statuses: Statuses,
    /// Latency from the request's head to the end of its response, from a
    /// histogram of half-octave buckets (within about 20%); `None` in a
    /// second without requests.
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Of the refused and shed, those with evidence of a person (a
    /// verified session, a challenge pass, a visit that browses like one).
    pub refused_people: u32,
    pub pools: Vec<PoolSecond>,
}

/// A pool as the timeline task samples it at a second's end.
#[derive(Debug, Clone)]
pub struct PoolSample {
    pub pool: Arc<str>,
    pub in_flight: u64,
    pub limit: Option<u64>,
    pub queued: u64,
    /// The queue's counters since start (summed over lanes): the second's
    /// mean wait is the growth of one over the other's.
    pub admitted_total: u64,
    pub waited_total: Duration,
}

/// The most refused families and prefixes over the kept minutes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TopRefused {
    pub families: Vec<(String, u64)>,
    pub prefixes: Vec<(String, u64)>,
}

fn name<S: serde::Serializer>(name: &Arc<str>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(name)
}

/// The counters of the second under way.
#[derive(Debug)]
struct Counting {
    outcomes: [AtomicU32; 5],
    statuses: [AtomicU32; 5],
    latency: [AtomicU32; BUCKETS],
    refused_people: AtomicU32,
}

impl Default for Counting {
    fn default() -> Self {
        Counting {
            outcomes: Default::default(),
            statuses: Default::default(),
            latency: std::array::from_fn(|_| AtomicU32::new(0)),
            refused_people: AtomicU32::new(0),
        }
    }
}

/// One minute's refusals by family and prefix.
#[derive(Debug, Default)]
struct RefusedMinute {
    minute: u64,
    families: HashMap<Box<str>, u64>,
    prefixes: HashMap<IpNet, u64>,
}

#[derive(Debug, Default)]
struct Kept {
    seconds: VecDeque<Second>,
    /// Each pool's queue counters at the last second's end.
    queue_before: HashMap<Arc<str>, (u64, Duration)>,
}

/// The last 15 minutes, second by second (see the module doc).
#[derive(Debug, Default)]
pub struct Timeline {
    counting: Counting,
    kept: Mutex<Kept>,
    refused: Mutex<VecDeque<RefusedMinute>>,
}

impl Timeline {
    /// Counts a finished request into the second under way (its log record,
    /// as written).
    pub fn record(&self, r: &AccessRecord) {
        let c = &self.counting;
        let outcome = Outcome::of(r);
        c.outcomes[outcome as usize].fetch_add(1, Ordering::Relaxed);
        if let class @ 1..=5 = r.status / 100 {
            c.statuses[usize::from(class - 1)].fetch_add(1, Ordering::Relaxed);
        }
        c.latency[bucket(r.duration)].fetch_add(1, Ordering::Relaxed);
        if matches!(outcome, Outcome::Refused | Outcome::Shed) {
            if shows_a_person(r) {
                c.refused_people.fetch_add(1, Ordering::Relaxed);
            }
            let minute = unix_s(r.time) / 60;
            self.count_refusal(minute, family(r.user_agent.as_ref()), r.client);
        }
    }

    fn count_refusal(&self, minute: u64, family: &str, client: IpAddr) {
        let mut minutes = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        if minutes.back().is_none_or(|m| m.minute < minute) {
            minutes.push_back(RefusedMinute {
                minute,
                ..RefusedMinute::default()
            });
        }
        while minutes
            .front()
            .is_some_and(|m| m.minute + KEPT_MINUTES <= minute)
        {
            minutes.pop_front();
        }
        // A request that began in the minute before the latest counts in
        // the latest (its end is what the page shows).
        let Some(m) = minutes.back_mut() else { return };
        if let Some(n) = m.families.get_mut(family) {
            *n += 1;
        } else if m.families.len() < MAX_FAMILIES {
            m.families.insert(family.into(), 1);
        }
        let prefix = super::tallies::refused_prefix(client);
        if let Some(n) = m.prefixes.get_mut(&prefix) {
            *n += 1;
        } else if m.prefixes.len() < MAX_PREFIXES {
            m.prefixes.insert(prefix, 1);
        }
    }

    /// Closes the second under way at `at_unix_s` with the pools as they
    /// are now, keeps it (dropping the oldest past [`KEPT_SECONDS`]) and
    /// returns it.
    pub fn close_second(&self, at_unix_s: u64, pools: &[PoolSample]) -> Second {
        let c = &self.counting;
        let take = |a: &AtomicU32| a.swap(0, Ordering::Relaxed);
        let [served, challenged, refused, shed, other] = c.outcomes.each_ref().map(take);
        let [s1, s2, s3, s4, s5] = c.statuses.each_ref().map(take);
        let latency = c.latency.each_ref().map(take);
        let refused_people = take(&c.refused_people);
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let pools: Vec<PoolSecond> = pools
            .iter()
            .map(|p| {
                let (admitted, waited) = kept
                    .queue_before
                    .insert(p.pool.clone(), (p.admitted_total, p.waited_total))
                    .unwrap_or((p.admitted_total, p.waited_total));
                let newly = p.admitted_total.saturating_sub(admitted);
                let wait_ms = (newly > 0).then(|| {
                    p.waited_total.saturating_sub(waited).as_secs_f64() * 1e3 / newly as f64
                });
                PoolSecond {
                    pool: p.pool.clone(),
                    in_flight: p.in_flight,
                    limit: p.limit,
                    queued: p.queued,
                    wait_ms,
                }
            })
            .collect();
        // A pool a reload removed is forgotten.
        kept.queue_before
            .retain(|name, _| pools.iter().any(|p: &PoolSecond| p.pool == *name));
        let second = Second {
            at_unix_s,
            outcomes: Outcomes {
                served,
                challenged,
                refused,
                shed,
                other,
            },
            statuses: Statuses { s1, s2, s3, s4, s5 },
            p50_ms: quantile(&latency, 0.5),
            p99_ms: quantile(&latency, 0.99),
            refused_people,
            pools,
        };
        if kept.seconds.len() == KEPT_SECONDS {
            kept.seconds.pop_front();
        }
        kept.seconds.push_back(second.clone());
        second
    }

    /// The kept seconds, oldest first; the last `n` of them with `Some(n)`.
    pub fn seconds(&self, last: Option<usize>) -> Vec<Second> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let skip = last.map_or(0, |n| kept.seconds.len().saturating_sub(n));
        kept.seconds.iter().skip(skip).cloned().collect()
    }

    /// The `top` most refused families and prefixes over the minutes kept
    /// up to `now_unix_s`, most first.
    pub fn top_refused(&self, now_unix_s: u64, top: usize) -> TopRefused {
        let minute = now_unix_s / 60;
        let minutes = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        let mut families: HashMap<&str, u64> = HashMap::new();
        let mut prefixes: HashMap<IpNet, u64> = HashMap::new();
        for m in minutes.iter().filter(|m| m.minute + KEPT_MINUTES > minute) {
            for (f, n) in &m.families {
                *families.entry(f).or_default() += n;
            }
            for (p, n) in &m.prefixes {
                *prefixes.entry(*p).or_default() += n;
            }
        }
        TopRefused {
            families: most(families.into_iter().map(|(f, n)| (f.to_owned(), n)), top),
            prefixes: most(prefixes.into_iter().map(|(p, n)| (p.to_string(), n)), top),
        }
    }
}

fn most(items: impl Iterator<Item = (String, u64)>, top: usize) -> Vec<(String, u64)> {
    let mut v: Vec<_> = items.collect();
    v.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v.truncate(top);
    v
}

/// Unix time in whole seconds.
pub fn unix_s(t: std::time::SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Whether a refused request showed evidence of a person: the rules'
/// collateral evidence ([`crate::evidence::Collateral::is_person_evidence`]), a verified
/// session, or a challenge pass.
fn shows_a_person(r: &AccessRecord) -> bool {
    r.collateral
        .is_some_and(crate::evidence::Collateral::is_person_evidence)
        || r.session == SessionKind::Verified
        || r.challenge == Some(ChallengeMark::Pass)
}

/// The latency bucket of `d`: two per power of two of microseconds, split
/// at one and a half.
fn bucket(d: Duration) -> usize {
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
    let log2 = 63 - us.leading_zeros() as usize;
    let half = if log2 == 0 {
        0
    } else {
        (us >> (log2 - 1)) as usize & 1
    };
    (2 * log2 + half).min(BUCKETS - 1)
}

/// The middle of bucket `i`, in milliseconds.
fn bucket_ms(i: usize) -> f64 {
    let low = f64::powi(2.0, (i / 2) as i32);
    let (from, to) = if i.is_multiple_of(2) {
        (low, 1.5 * low)
    } else {
        (1.5 * low, 2.0 * low)
    };
    (from + to) / 2.0 / 1e3
}

/// The `q` quantile of the counts in `buckets`; `None` when empty.
fn quantile(buckets: &[u32; BUCKETS], q: f64) -> Option<f64> {
    let total: u64 = buckets.iter().map(|&n| u64::from(n)).sum();
    if total == 0 {
        return None;
    }
    // The rank of the quantile, counted from 1.
    let rank = ((q * total as f64).ceil() as u64).max(1);
    let mut seen = 0;
    for (i, &n) in buckets.iter().enumerate() {
        seen += u64::from(n);
        if seen >= rank {
            return Some(bucket_ms(i));
        }
    }
    Some(bucket_ms(BUCKETS - 1))
}

/// The family a user agent belongs to, for the page's top refused: the
/// crawler a `compatible;` comment names (`Googlebot`, `GPTBot`), the
/// browser a `Mozilla/` agent ends in (`Edge`, `Opera`, `Firefox`,
/// `Chrome`, `Safari`), or else the first product's name (`curl`,
/// `python-requests`). Bounded in length and to visible ASCII: the client
/// writes it.
pub fn family(ua: Option<&http::HeaderValue>) -> &str {
    let Some(ua) = ua
        .and_then(|v| v.to_str().ok())
        .filter(|s| !s.trim().is_empty())
    else {
        return "(none)";
    };
    if let Some((_, after)) = ua.split_once("compatible; ") {
        let name = after.split(['/', ';', ')', ' ']).next().unwrap_or_default();
        if !name.is_empty() {
            return clip(name);
        }
    }
    if ua.starts_with("Mozilla/") {
        const BROWSERS: [(&str, &str); 6] = [
            ("Edg/", "Edge"),
            ("OPR/", "Opera"),
            ("Firefox/", "Firefox"),
            ("HeadlessChrome/", "HeadlessChrome"),
            ("Chrome/", "Chrome"),
            ("Safari/", "Safari"),
        ];
        return BROWSERS
            .iter()
            .find(|(token, _)| ua.contains(token))
            .map_or("Mozilla (other)", |(_, name)| name);
    }
    clip(ua.split(['/', ' ', ';', '(']).next().unwrap_or_default())
}

fn clip(name: &str) -> &str {
    let end = name
        .char_indices()
        .find(|&(i, c)| i >= FAMILY_LEN || !c.is_ascii_graphic())
        .map_or(name.len(), |(i, _)| i);
    if end == 0 {
        "(unreadable)"
    } else {
        &name[..end]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    /// A request weir answered itself in no time, admitted and anonymous.
    fn blank() -> AccessRecord {
        AccessRecord {
            time: SystemTime::now(),
            request_id: crate::observe::request_id::RequestId::new(),
            client: IpAddr::from([192, 0, 2, 1]),
            peer: IpAddr::from([192, 0, 2, 1]),
            client_source: crate::identity::AddrSource::Peer,
            method: http::Method::GET,
            target: None,
            raw_target: None,
            proto: http::Version::HTTP_11,
            tls_version: None,
            alpn: None,
            user_agent: None,
            referer: None,
            class: Arc::from("default"),
            decision: Verdict::Admit,
            session: crate::evidence::SessionKind::Anonymous,
            bot: None,
            challenge: None,
            rule: None,
            rule_level: None,
            rule_key: None,
            shadow_rules: None,
            collateral: None,
            visit: None,
            pool: None,
            upstream: None,
            status: 200,
            upstream_status: None,
            bytes_in: 0,
            bytes_out: 0,
            duration: Duration::from_millis(10),
            queue_time: Duration::ZERO,
            lane: None,
            upstream_time: None,
            coalesced: None,
            error: None,
        }
    }

    fn request(status: u16, ms: u64) -> AccessRecord {
        let mut r = blank();
        r.status = status;
        r.upstream_status = Some(status);
        r.duration = Duration::from_millis(ms);
        r
    }

    fn refused(ua: &str, client: [u8; 4], collateral: Option<&'static str>) -> AccessRecord {
        let mut r = blank();
        r.status = 429;
        r.decision = Verdict::Reject;
        r.rule_level = Some("ip");
        r.user_agent = Some(http::HeaderValue::from_str(ua).unwrap());
        r.client = IpAddr::from(client);
        r.collateral = collateral.and_then(crate::evidence::Collateral::from_name);
        r
    }

    #[test]
    fn a_second_counts_outcomes_statuses_and_quantiles_then_starts_again() {
        let t = Timeline::default();
        for _ in 0..98 {
            t.record(&request(200, 10));
        }
        t.record(&request(500, 10));
        t.record(&request(200, 900));
        t.record(&refused("curl/8.0", [10, 0, 0, 1], None));
        let mut shed = blank();
        shed.status = 503;
        t.record(&shed);
        let mut challenged = blank();
        challenged.decision = Verdict::Challenge;
        challenged.status = 200;
        t.record(&challenged);

        let s = t.close_second(1_000, &[]);
        assert_eq!(
            s.outcomes,
            Outcomes {
                served: 100,
                challenged: 1,
                refused: 1,
                shed: 1,
                other: 0
            }
        );
        assert_eq!((s.statuses.s2, s.statuses.s4, s.statuses.s5), (100, 1, 2));
        // 10 ms sits in the bucket 8.192..12.288 ms; 900 ms in 786..1049.
        let p50 = s.p50_ms.unwrap();
        assert!((8.0..12.5).contains(&p50), "{p50}");
        let p99 = s.p99_ms.unwrap();
        assert!(
            (8.0..12.5).contains(&p99),
            "one slow request in 103 is not the p99: {p99}"
        );

        let next = t.close_second(1_001, &[]);
        assert_eq!(next.outcomes, Outcomes::default());
        assert_eq!(next.p50_ms, None);
        assert_eq!(t.seconds(None).len(), 2);
        assert_eq!(t.seconds(Some(1))[0].at_unix_s, 1_001);
    }

    #[test]
    fn the_p99_finds_the_slow_tail() {
        let t = Timeline::default();
        for _ in 0..90 {
            t.record(&request(200, 2));
        }
        for _ in 0..10 {
            t.record(&request(200, 2_000));
        }
        let s = t.close_second(5, &[]);
        assert!(s.p50_ms.unwrap() < 3.0, "{:?}", s.p50_ms);
        let p99 = s.p99_ms.unwrap();
        assert!((1_500.0..2_700.0).contains(&p99), "{p99}");
    }

    #[test]
    fn memory_is_bounded_by_seconds_minutes_families_and_prefixes() {
        let t = Timeline::default();
        for at in 0..(KEPT_SECONDS as u64 + 50) {
            t.close_second(at, &[]);
        }
        let kept = t.seconds(None);
        assert_eq!(kept.len(), KEPT_SECONDS);
        assert_eq!(kept[0].at_unix_s, 50, "the oldest went first");

        // A spray of agents and addresses in one minute.
        for i in 0..5_000u32 {
            let [a, b, c, d] = i.to_be_bytes();
            t.count_refusal(7, &format!("agent{i}"), IpAddr::from([10, b ^ a, c, d]));
        }
        // Minutes long past are dropped as new ones come.
        for minute in 8..40 {
            t.count_refusal(minute, "late", IpAddr::from([10, 9, 9, 9]));
        }
        let minutes = t.refused.lock().unwrap();
        assert_eq!(minutes.len(), KEPT_MINUTES as usize);
        assert!(minutes.iter().all(|m| m.families.len() <= MAX_FAMILIES));
        assert!(minutes.iter().all(|m| m.prefixes.len() <= MAX_PREFIXES));
        drop(minutes);
        let spray = Timeline::default();
        for i in 0..5_000u32 {
            let [_, b, c, d] = i.to_be_bytes();
            spray.count_refusal(7, &format!("agent{i}"), IpAddr::from([10, b, c, d]));
        }
        let m = spray.refused.lock().unwrap();
        assert_eq!(m[0].families.len(), MAX_FAMILIES);
        assert!(m[0].prefixes.len() <= MAX_PREFIXES);
    }

    #[test]
    fn the_top_refused_adds_the_kept_minutes_and_shows_people() {
        let t = Timeline::default();
        let now = unix_s(SystemTime::now());
        for _ in 0..5 {
            t.record(&refused("python-requests/2.31", [203, 0, 113, 9], None));
        }
        t.record(&refused(
            "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36",
            [198, 51, 100, 7],
            Some("browsing"),
        ));
        let top = t.top_refused(now, 10);
        assert_eq!(
            top.families,
            vec![("python-requests".into(), 5), ("Chrome".into(), 1)]
        );
        assert_eq!(top.prefixes[0], ("203.0.113.0/24".into(), 5));
        assert_eq!(t.close_second(now, &[]).refused_people, 1);
        // Fifteen minutes on, they are gone.
        assert_eq!(t.top_refused(now + 16 * 60, 10), TopRefused::default());
    }

    #[test]
    fn a_pools_wait_is_the_mean_of_those_admitted_in_the_second() {
        let t = Timeline::default();
        let sample = |admitted, waited_ms| PoolSample {
            pool: Arc::from("app"),
            in_flight: 3,
            limit: Some(8),
            queued: 2,
            admitted_total: admitted,
            waited_total: Duration::from_millis(waited_ms),
        };
        assert_eq!(
            t.close_second(1, &[sample(10, 1_000)]).pools[0].wait_ms,
            None
        );
        let p = &t.close_second(2, &[sample(14, 1_200)]).pools[0];
        assert_eq!(p.wait_ms, Some(50.0));
        assert_eq!((p.in_flight, p.limit, p.queued), (3, Some(8), 2));
        assert_eq!(
            t.close_second(3, &[sample(14, 1_200)]).pools[0].wait_ms,
            None
        );
    }

    #[test]
    fn families_name_crawlers_browsers_and_tools() {
        let f = |ua: &str| family(Some(&http::HeaderValue::from_str(ua).unwrap())).to_owned();
        assert_eq!(
            f("Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"),
            "Googlebot"
        );
        assert_eq!(
            f(
                "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; GPTBot/1.2; +https://openai.com/gptbot)"
            ),
            "GPTBot"
        );
        assert_eq!(
            f(
                "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36 Edg/120.0"
            ),
            "Edge"
        );
        assert_eq!(
            f("Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 Firefox/120.0"),
            "Firefox"
        );
        assert_eq!(
            f(
                "Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.0 Mobile/15E148 Safari/604.1"
            ),
            "Safari"
        );
        assert_eq!(f("curl/8.5.0"), "curl");
        assert_eq!(f("Go-http-client/1.1"), "Go-http-client");
        assert_eq!(f(&"x".repeat(200)), "x".repeat(FAMILY_LEN));
        assert_eq!(f("Mozilla/4.0"), "Mozilla (other)");
        assert_eq!(family(None), "(none)");
    }

    #[test]
    fn buckets_split_each_octave_at_one_and_a_half() {
        assert_eq!(bucket(Duration::ZERO), 0);
        assert_eq!(bucket(Duration::from_micros(1)), 0);
        assert_eq!(bucket(Duration::from_micros(1024)), 20);
        assert_eq!(bucket(Duration::from_micros(1535)), 20);
        assert_eq!(bucket(Duration::from_micros(1536)), 21);
        assert_eq!(bucket(Duration::from_secs(100_000)), BUCKETS - 1);
        for i in 0..BUCKETS - 1 {
            assert!(bucket_ms(i) < bucket_ms(i + 1));
        }
        // Each bucket's middle falls in it (1 us has no half: bucket 1 is
        // never used).
        for i in 2..BUCKETS {
            let mid = Duration::from_secs_f64(bucket_ms(i) / 1e3);
            assert_eq!(bucket(mid), i, "bucket {i}");
        }
    }
}
