//! The `[challenge]` table: serde structs mirroring the TOML, with defaults
//! that say why they were chosen, and the error type for values that cannot
//! be turned into a working [`super::Challenger`].
//!
//! Owns: the file schema of the browser challenge (`[challenge]`,
//! `[challenge.pressure]`, `[challenge.text]`, `[[challenge.good_bots]]`) and
//! the per-class switch [`ChallengeMode`]. Does not: read files, substitute
//! `${ENV}` (the config loader does that on the raw text before parsing, so a
//! key written `"${WEIR_CHALLENGE_KEY}"` arrives here already substituted), or
//! build runtime values (that is [`super::Challenger::new`]).

use serde::Deserialize;

use crate::config::{ConfigDuration, Secret};
use crate::identity::TrustedProxyError;

/// Per class: when its browser navigations are challenged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChallengeMode {
    /// Never.
    Off,
    /// As `under_pressure`, for the request shapes the pool learned are
    /// expensive (`admission::shapes`) and only those. The default: a weir
    /// nobody configured offers proof where a flood of crawlers is costly,
    /// and nowhere else.
    #[default]
    Learned,
    /// Offered to a navigation that would not be served promptly (shed, over
    /// a rule a pass exempts, or a long wait): the page buys priority.
    UnderPressure,
    /// Every eligible request without a valid pass.
    Always,
}

/// `[challenge]`: keys, lifetimes, difficulty and who is never challenged.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChallengeConfig {
    /// `false`: no challenge anywhere, whatever a class says (the learned
    /// one of a weir nobody configured included).
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Secrets for signing pass tokens and challenges, at least 32 bytes each
    /// (e.g. `openssl rand -base64 32`). The first signs; all verify, so a new
    /// key is rotated in by putting it first and keeping the old one second
    /// for one `pass_ttl`. Write `"${WEIR_CHALLENGE_KEY}"` to keep it out of
    /// the file. Every weir instance behind one load balancer needs the same
    /// keys. Empty: weir's own, generated once and kept in the state
    /// directory (`state.dir`), shared by the processes that share it.
    #[serde(default)]
    pub keys: Vec<Secret>,
    /// How long a pass cookie is valid. 12 h: a reader solves about once a
    /// day; a leaked or farmed token expires the same day (and its id is rate
    /// limited meanwhile). Between 1 minute and 7 days.
    #[serde(default = "default_pass_ttl")]
    pub pass_ttl: ConfigDuration,
    /// How long a served challenge may be answered. 5 min: enough for a slow
    /// phone at the highest difficulty, short enough that a solved challenge
    /// is not a long-lived currency. Between 10 s and 1 h.
    #[serde(default = "default_solve_ttl")]
    pub solve_ttl: ConfigDuration,
    /// People without JavaScript get through: the page carries a
    /// `<noscript>` meta refresh to a signed link that earns the same pass
    /// once `no_script_delay` has passed (a crawler pays a round trip, the
    /// wait and a kept cookie). `false`: they are told to enable JavaScript.
    #[serde(default = "default_true")]
    pub no_script: bool,
    /// How long the refresh waits. The page asks the browser for the whole
    /// seconds of it (a meta refresh counts no fractions) and weir holds the
    /// link for the rest, so a person waits exactly this and no more. 500
    /// ms: a person's page still comes well within 2 s under pressure, a
    /// crawler's fetch loop stalls a round trip and the wait
    /// per network and agent, and keeps a cookie; the pass it earns is
    /// limited per id like any other. 100 ms ..= 1 min.
    #[serde(default = "default_no_script_delay")]
    pub no_script_delay: ConfigDuration,
    /// The pass cookie's name.
    #[serde(default = "default_cookie_name")]
    pub cookie_name: String,
    /// Leading zero bits of SHA-256 required when not under pressure. 12
    /// bits = 4,096 hashes on average: under 0.1 s on a phone (about
    /// 50,000 hashes/s), 1 visitor in 20 under 0.25 s. The challenge's value
    /// is that a crawler must run a browser and keep a cookie, not the
    /// hashing (native code does 4,096 hashes in 2 ms). 8..=28.
    #[serde(default = "default_difficulty")]
    pub difficulty: u8,
    /// The most bits pressure may raise `difficulty` to. 14 = 4x the base
    /// work: 1 phone in 20 still done within a second (`difficulty..=28`),
    /// so a person's first page under pressure stays within 2 s.
    #[serde(default = "default_max_difficulty")]
    pub max_difficulty: u8,
    /// When `under_pressure` classes start and stop being challenged.
    #[serde(default)]
    pub pressure: PressureConfig,
    /// Exact paths never challenged (robots, health, well-known files).
    #[serde(default = "default_exempt_paths")]
    pub exempt_paths: Vec<String>,
    /// Path prefixes never challenged (APIs, static assets, `/.well-known/`).
    #[serde(default = "default_exempt_prefixes")]
    pub exempt_prefixes: Vec<String>,
    /// Removed: a navigation whose path ends in `.css` can be a page
    /// (MediaWiki's `/wiki/Special:Search/x.css` is a search), and requests
    /// that are not navigations (assets, feeds, APIs) are never challenged.
    /// Set, it is refused with that explanation.
    #[serde(default)]
    pub exempt_suffixes: Option<Vec<String>>,
    /// Query keys that mark a request as never challenged (MediaWiki feeds:
    /// `?feed=atom`, `?feedformat=rss`).
    #[serde(default = "default_exempt_query_keys")]
    pub exempt_query_keys: Vec<String>,
    /// Client networks never challenged (monitoring, office, partners), as
    /// CIDRs or addresses. Matched against the resolved client address.
    #[serde(default)]
    pub allow_cidrs: Vec<String>,
    /// Crawlers allowed through without a challenge.
    #[serde(default)]
    pub good_bots: Vec<GoodBotConfig>,
    /// The page's words, for localisation.
    #[serde(default)]
    pub text: ChallengeText,
    /// When weir's cookies (the pass, the page's probe, the visit) carry
    /// `Secure`: `"auto"` (the default) when the client reached weir over
    /// TLS, weir's own listener's or a TLS-terminating proxy's in
    /// `identity.trusted_proxies` that says so with `X-Forwarded-Proto:
    /// https` (or `Forwarded: proto=https`); `"always"`; `"never"`.
    #[serde(default)]
    pub secure_cookies: SecureCookies,
}

/// `challenge.secure_cookies`: when weir's cookies are `Secure`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SecureCookies {
    /// When the client's connection is TLS (weir's, or a trusted proxy's
    /// that says so). Never on a plain-HTTP site, where a `Secure` cookie
    /// would never come back (and a pass that never comes back is a loop).
    #[default]
    Auto,
    Always,
    Never,
}

impl SecureCookies {
    /// Whether a cookie to a client whose connection is TLS (`tls`) is
    /// `Secure`.
    pub fn applies(self, tls: bool) -> bool {
        match self {
            SecureCookies::Auto => tls,
            SecureCookies::Always => true,
            SecureCookies::Never => false,
        }
    }
}

impl Default for ChallengeConfig {
    fn default() -> Self {
        ChallengeConfig {
            enabled: true,
            keys: Vec::new(),
            pass_ttl: default_pass_ttl(),
            solve_ttl: default_solve_ttl(),
            no_script: true,
            no_script_delay: default_no_script_delay(),
            cookie_name: default_cookie_name(),
            difficulty: default_difficulty(),
            max_difficulty: default_max_difficulty(),
            pressure: PressureConfig::default(),
            exempt_paths: default_exempt_paths(),
            exempt_prefixes: default_exempt_prefixes(),
            exempt_suffixes: None,
            exempt_query_keys: default_exempt_query_keys(),
            allow_cidrs: Vec::new(),
            good_bots: Vec::new(),
            text: ChallengeText::default(),
            secure_cookies: SecureCookies::Auto,
        }
    }
}

/// `[challenge.pressure]`: the hysteresis of `under_pressure`.
///
/// Engages when the admission queue is at least `queue_depth` deep *or* the
/// oldest waiter has waited at least `wait`, continuously for `engage_after`.
/// Disengages when depth is below a quarter of `queue_depth` *and* wait below
/// a quarter of `wait`, continuously for `disengage_after`. The gap between
/// the two thresholds and the longer calm period make it flip rarely.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PressureConfig {
    /// Queued requests (all lanes of the pool) that count as pressure. 20:
    /// two waiting requests per worker of a 10-worker PHP pool.
    #[serde(default = "default_pressure_depth")]
    pub queue_depth: usize,
    /// Longest current wait in the queue that counts as pressure. 500 ms: a
    /// person notices, and the default lanes shed at 10 s.
    #[serde(default = "default_pressure_wait")]
    pub wait: ConfigDuration,
    /// How long pressure must last before challenges start. 10 s: a burst
    /// that the queue absorbs by itself does not show anyone a challenge.
    #[serde(default = "default_engage_after")]
    pub engage_after: ConfigDuration,
    /// How long calm must last before challenges stop. 2 min: a flood that
    /// pauses between crawl batches does not switch the challenge on and off.
    #[serde(default = "default_disengage_after")]
    pub disengage_after: ConfigDuration,
    /// While engaged, each further period of continuous pressure this long
    /// adds one bit of difficulty (up to `max_difficulty`). 1 min.
    #[serde(default = "default_step_after")]
    pub step_after: ConfigDuration,
}

impl Default for PressureConfig {
    fn default() -> Self {
        PressureConfig {
            queue_depth: default_pressure_depth(),
            wait: default_pressure_wait(),
            engage_after: default_engage_after(),
            disengage_after: default_disengage_after(),
            step_after: default_step_after(),
        }
    }
}

/// `[[challenge.good_bots]]`: a crawler let through without a challenge.
///
/// A User-Agent is a claim anyone can make ("Googlebot" costs a crawler farm
/// one header), so an entry with `cidrs` requires both: the substring in the
/// User-Agent *and* the address in one of the networks the operator
/// publishes. An entry without `cidrs` trusts the claim alone: use it only for
/// crawlers whose disguise would not matter.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoodBotConfig {
    /// A label for logs and docs (e.g. `googlebot`).
    pub name: String,
    /// A substring of the User-Agent (case-sensitive, e.g. `Googlebot/`).
    pub user_agent: String,
    /// The crawler's published networks. Empty = the User-Agent alone.
    #[serde(default)]
    pub cidrs: Vec<String>,
}

/// `[challenge.text]`: every word the page shows, English by default.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChallengeText {
    /// The page's `lang` attribute (BCP 47).
    pub lang: String,
    /// The `<title>`.
    pub title: String,
    /// The `<h1>`.
    pub heading: String,
    /// Why the page is shown and what happens next.
    pub explanation: String,
    /// Status while the browser works.
    pub working: String,
    /// Status when done, before the page loads.
    pub done: String,
    /// Status when the browser cannot do the check.
    pub failed: String,
    /// Shown while the check runs when cookies are disabled: the pass then
    /// comes in the address of the page it opens, for that page only.
    pub cookies_needed: String,
    /// Shown instead of the check when JavaScript is off and `no_script`
    /// is `false`.
    pub noscript: String,
    /// Shown when JavaScript is off and the page continues by itself
    /// (`no_script`, the default).
    pub noscript_wait: String,
}

impl Default for ChallengeText {
    fn default() -> Self {
        ChallengeText {
            lang: "en".into(),
            title: "Checking your browser".into(),
            heading: "One moment, please".into(),
            explanation: "This site is very busy. To keep it available for people, your \
                browser does a short calculation before the page opens. This usually takes \
                a second or two."
                .into(),
            working: "Checking your browser…".into(),
            done: "Done. Opening the page…".into(),
            failed: "Your browser could not complete the check. Please reload the page to try \
                again."
                .into(),
            cookies_needed: "Cookies are off for this site, so this check will run again on \
                the next page."
                .into(),
            noscript: "This check needs JavaScript. Please enable JavaScript for this site and \
                reload the page, or come back later when the site is less busy."
                .into(),
            noscript_wait: "Your browser is not running JavaScript, so this page continues by \
                itself in a few seconds."
                .into(),
        }
    }
}

/// A `[challenge]` value that cannot work. Each names its key.
#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum ChallengeConfigError {
    #[error(
        "challenge.keys is empty: give at least one secret of 32+ bytes (e.g. \"${{WEIR_CHALLENGE_KEY}}\" set to `openssl rand -base64 32`)"
    )]
    NoKeys,
    #[error(
        "challenge.keys[{index}] is {len} bytes; use at least {min} random bytes (e.g. `openssl rand -base64 32`)"
    )]
    ShortKey {
        index: usize,
        len: usize,
        min: usize,
    },
    #[error("challenge.keys[{index}] repeats challenge.keys[{first}]")]
    DuplicateKey { index: usize, first: usize },
    #[error("challenge.{key} = {value:?} is out of range: {range}")]
    OutOfRange {
        key: &'static str,
        value: String,
        range: &'static str,
    },
    #[error("challenge.cookie_name = {0:?} is not a cookie name: use letters, digits, `_` or `-`")]
    CookieName(String),
    #[error("challenge.{key}[{index}] = {value:?} {reason}")]
    BadEntry {
        key: &'static str,
        index: usize,
        value: String,
        reason: &'static str,
    },
    #[error(
        "challenge.good_bots[{index}].user_agent = {value:?} is too short to identify a crawler (3+ characters)"
    )]
    BotUserAgent { index: usize, value: String },
    #[error(
        "challenge.exempt_suffixes was removed: a navigation whose path ends in .css can be a page \
         (MediaWiki's /wiki/Special:Search/x.css is a search), and requests that are not \
         navigations (assets, feeds, APIs) are never challenged; use exempt_paths or exempt_prefixes"
    )]
    SuffixesRemoved,
    #[error("challenge.{key}: {source}")]
    Cidr {
        key: String,
        source: TrustedProxyError,
    },
}

fn default_pass_ttl() -> ConfigDuration {
    ConfigDuration::secs(12 * 3600)
}
fn default_solve_ttl() -> ConfigDuration {
    ConfigDuration::secs(300)
}
fn default_no_script_delay() -> ConfigDuration {
    ConfigDuration(std::time::Duration::from_millis(500))
}
fn default_true() -> bool {
    true
}
fn default_cookie_name() -> String {
    "weir_pass".into()
}
fn default_difficulty() -> u8 {
    12
}
fn default_max_difficulty() -> u8 {
    14
}
fn default_pressure_depth() -> usize {
    20
}
fn default_pressure_wait() -> ConfigDuration {
    ConfigDuration(std::time::Duration::from_millis(500))
}
fn default_engage_after() -> ConfigDuration {
    ConfigDuration::secs(10)
}
fn default_disengage_after() -> ConfigDuration {
    ConfigDuration::secs(120)
}
fn default_step_after() -> ConfigDuration {
    ConfigDuration::secs(60)
}
fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}
fn default_exempt_paths() -> Vec<String> {
    strings(&[
        "/robots.txt",
        "/favicon.ico",
        "/sitemap.xml",
        "/health",
        "/healthz",
        "/opensearch_desc.php",
    ])
}
fn default_exempt_prefixes() -> Vec<String> {
    strings(&[
        "/.well-known/",
        "/api/",
        "/api.php",
        "/rest.php/",
        "/static/",
        "/assets/",
    ])
}
fn default_exempt_query_keys() -> Vec<String> {
    strings(&["feed", "feedformat"])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_table_takes_documented_defaults() {
        let c: ChallengeConfig = toml::from_str("").unwrap();
        assert_eq!(c, ChallengeConfig::default());
        assert_eq!((c.difficulty, c.max_difficulty), (12, 14));
        assert_eq!(
            (c.no_script, c.no_script_delay.0),
            (true, std::time::Duration::from_millis(500))
        );
        assert_eq!(c.pass_ttl.0.as_secs(), 12 * 3600);
        assert_eq!(c.text.lang, "en");
    }

    #[test]
    fn unknown_keys_are_refused() {
        for text in [
            "difficulty_bits = 3",
            "[pressure]\ndepth = 3",
            "[text]\nheadline = \"x\"",
            "[[good_bots]]\nname = \"g\"\nuser_agent = \"G\"\nip = \"1.2.3.4\"",
        ] {
            assert!(
                toml::from_str::<ChallengeConfig>(text).is_err(),
                "{text:?} was accepted"
            );
        }
    }

    #[test]
    fn full_table_parses() {
        let c: ChallengeConfig = toml::from_str(
            r#"
            keys = ["0123456789abcdef0123456789abcdef"]
            pass_ttl = "1h"
            difficulty = 14
            [pressure]
            queue_depth = 8
            wait = "250ms"
            [text]
            lang = "ko"
            heading = "잠시만 기다려 주세요"
            [[good_bots]]
            name = "googlebot"
            user_agent = "Googlebot/"
            cidrs = ["66.249.64.0/19"]
            "#,
        )
        .unwrap();
        assert_eq!(c.pass_ttl.0.as_secs(), 3600);
        assert_eq!(c.pressure.queue_depth, 8);
        assert_eq!(c.pressure.engage_after, default_engage_after());
        assert_eq!(c.text.lang, "ko");
        assert_eq!(c.text.title, ChallengeText::default().title);
        assert_eq!(c.good_bots[0].cidrs, vec!["66.249.64.0/19"]);
    }

    #[test]
    fn modes() {
        #[derive(Deserialize)]
        struct Class {
            #[serde(default)]
            challenge: ChallengeMode,
        }
        let cases = [
            ("off", ChallengeMode::Off),
            ("learned", ChallengeMode::Learned),
            ("under_pressure", ChallengeMode::UnderPressure),
            ("always", ChallengeMode::Always),
        ];
        for (text, mode) in cases {
            let c: Class = toml::from_str(&format!("challenge = \"{text}\"")).unwrap();
            assert_eq!(c.challenge, mode);
        }
        let unsaid: Class = toml::from_str("").unwrap();
        assert_eq!(unsaid.challenge, ChallengeMode::Learned, "the default");
        assert!(toml::from_str::<Class>("challenge = \"sometimes\"").is_err());
    }
}
