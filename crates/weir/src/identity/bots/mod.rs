//! Verified bots: crawlers that *prove* who they are, by a Web Bot Auth
//! signature ([`signature`], RFC 9421 with Ed25519 keys the operator
//! trusts) or by forward-confirmed reverse DNS against the domains the
//! operator lists for them ([`fcrdns`]). A request that only *claims* a
//! crawler's name in its User-Agent proves nothing (a crawler farm can send
//! `Googlebot` for free) and stays anonymous.
//!
//! ```
//! use std::sync::Arc;
//! use weir::identity::bots::{BotVerifier, Crawler, jwk::PublicKey, signature::Keyring};
//! use weir::identity::session::ManualWallClock;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // A crawler known by its Web Bot Auth key (RFC 9421's test key).
//! let key = PublicKey::from_x("JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs").unwrap();
//! let mut keys = Keyring::default();
//! keys.insert(&key, 0);
//! let crawlers = vec![Crawler::new("examplebot", None, None)];
//! let clock = Arc::new(ManualWallClock::new(1_735_689_600));
//! let verifier = BotVerifier::new(crawlers, keys, 60, clock, None).unwrap();
//!
//! // The architecture draft's test vector for https://example.com/…
//! let mut headers = http::HeaderMap::new();
//! headers.insert("signature-input", r#"sig1=("@authority");created=1735689600;keyid="poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U";alg="ed25519";expires=1735693200;nonce="mYotfW3CUjI68sbGw6oKd7kyXqPjZEtU8xFPGWFrqOAf5qC6MDe3pys3SWWCudB0MvwslHy32WXUpkR7u0lt/w==";tag="web-bot-auth""#.parse().unwrap());
//! headers.insert("signature", "sig1=:+NA/cssf4Y2bQTMTkyvTGRCaVzp9quyUevdwwMtMOWhhOOZ2T1subBj0BtvdnrpDEuwSAbiTeElXDzHL3WWKCw==:".parse().unwrap());
//! let req = weir::identity::bots::signature::SignedRequest {
//!     method: "GET", scheme: "https", authority: "example.com",
//!     path: "/path/to/resource", query: None, headers: &headers,
//! };
//! let check = verifier.check(&req, "192.0.2.1".parse().unwrap()).await;
//! assert_eq!(check.bot.map(|b| verifier.name(b)), Some("examplebot"));
//! assert_eq!(check.attempts[0].result, "verified");
//!
//! // Claiming the name proves nothing.
//! let mut claim = http::HeaderMap::new();
//! claim.insert("user-agent", "examplebot/1.0".parse().unwrap());
//! let req = weir::identity::bots::signature::SignedRequest { headers: &claim, ..req };
//! assert_eq!(verifier.check(&req, "192.0.2.1".parse().unwrap()).await.bot, None);
//! # }
//! ```
//!
//! Owns: the [`BotVerifier`] (which checks a request needs, in which
//! order). Does not: read the `[bots]` schema (`config::BotsConfig`,
//! compiled by `gateway`), decide what a verified
//! bot gets (the policy and admission stages read `policy::Proof`'s
//! `bot`), record metrics (it returns what it tried), or fetch key
//! directories over the network (operators keep the directory in a file).

pub mod fcrdns;
pub mod jwk;
pub mod signature;

use std::net::IpAddr;
use std::sync::Arc;

use http::HeaderMap;
use smallvec::SmallVec;

use fcrdns::{Answer, Fcrdns, Outcome};
use signature::{Keyring, Rejection, SignedRequest};

use crate::identity::session::WallClock;

/// Most crawlers a configuration may list: names label metrics and logs,
/// and must stay a bounded set.
pub const MAX_CRAWLERS: usize = 64;

/// A configured crawler, by its position in the configuration: the names
/// are a bounded set ([`MAX_CRAWLERS`]), so a proof carries this small
/// copyable index and the log reads the name from the gateway it was
/// verified under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BotId(u8);

impl BotId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// How a crawler proved itself (the `method` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    WebBotAuth,
    Fcrdns,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::WebBotAuth => "web_bot_auth",
            Method::Fcrdns => "fcrdns",
        }
    }
}

/// One check made for a request, and its result label (`verified`, or why
/// not: [`Rejection::as_str`], [`Answer::as_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    pub method: Method,
    pub result: &'static str,
}

/// What a request proved: the crawler, if any, and every check made (none
/// for a request that neither signs nor claims a listed crawler).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BotCheck {
    pub bot: Option<BotId>,
    pub attempts: SmallVec<[Attempt; 2]>,
}

/// One crawler as compiled: its name, and the User-Agent claim and domains
/// that reverse DNS checks (both or neither).
#[derive(Debug, Clone)]
pub struct Crawler {
    name: Arc<str>,
    user_agent: Option<String>,
    domains: Arc<[String]>,
}

impl Crawler {
    /// `domains` lowercase, without trailing dots; reverse DNS is checked
    /// only with both a `user_agent` and domains.
    pub fn new(name: &str, user_agent: Option<&str>, domains: Option<Vec<String>>) -> Crawler {
        let domains: Vec<String> = domains
            .unwrap_or_default()
            .into_iter()
            .map(|d| d.trim_end_matches('.').to_ascii_lowercase())
            .collect();
        Crawler {
            name: Arc::from(name),
            user_agent: user_agent.map(str::to_string),
            domains: Arc::from(domains),
        }
    }

    fn checks_dns(&self) -> bool {
        self.user_agent.is_some() && !self.domains.is_empty()
    }
}

/// Why a [`BotVerifier`] cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BotsError {
    #[error("{0} crawlers configured; at most {MAX_CRAWLERS} are supported")]
    TooMany(usize),
    #[error("crawlers check reverse DNS but no resolver is configured")]
    NoResolver,
}

/// The crawlers a gateway trusts, and how it checks them.
pub struct BotVerifier {
    crawlers: Vec<Crawler>,
    keyring: Keyring,
    skew: u64,
    clock: Arc<dyn WallClock>,
    fcrdns: Option<Fcrdns>,
}

impl std::fmt::Debug for BotVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BotVerifier")
            .field("crawlers", &self.crawlers)
            .field("skew", &self.skew)
            .field("fcrdns", &self.fcrdns)
            .finish()
    }
}

impl BotVerifier {
    /// `keyring` maps key thumbprints to indices of `crawlers`; `skew` is
    /// seconds; `fcrdns` is needed when a crawler lists domains.
    pub fn new(
        crawlers: Vec<Crawler>,
        keyring: Keyring,
        skew: u64,
        clock: Arc<dyn WallClock>,
        fcrdns: Option<Fcrdns>,
    ) -> Result<BotVerifier, BotsError> {
        if crawlers.len() > MAX_CRAWLERS {
            return Err(BotsError::TooMany(crawlers.len()));
        }
        if fcrdns.is_none() && crawlers.iter().any(Crawler::checks_dns) {
            return Err(BotsError::NoResolver);
        }
        Ok(BotVerifier {
            crawlers,
            keyring,
            skew,
            clock,
            fcrdns,
        })
    }

    /// The configured name of `bot` (`bot` in logs).
    pub fn name(&self, bot: BotId) -> &str {
        self.crawlers.get(bot.index()).map_or("", |c| &c.name)
    }

    /// The name of `bot`, shared (for the access log).
    pub fn label(&self, bot: BotId) -> Option<Arc<str>> {
        self.crawlers.get(bot.index()).map(|c| Arc::clone(&c.name))
    }

    /// Whether a request has anything to check: a Web Bot Auth signature
    /// (when keys are configured), or a User-Agent that claims a crawler
    /// checked by reverse DNS. Cheap; most requests answer `false`.
    pub fn wants(&self, headers: &HeaderMap) -> bool {
        (!self.keyring.is_empty() && signature::is_signed(headers))
            || self.claimed(headers).is_some()
    }

    /// **When it runs:** for a routed request, before the rules and the
    /// challenge. A Web Bot Auth signature is checked first (no I/O); a
    /// User-Agent that claims a crawler with domains is then checked by
    /// reverse DNS (waits at most `dns_wait`). **Result:** the crawler the
    /// request proved to be, if any, and every check made.
    pub async fn check(&self, req: &SignedRequest<'_>, client: IpAddr) -> BotCheck {
        let mut check = BotCheck::default();
        if !self.keyring.is_empty() && signature::is_signed(req.headers) {
            let now = self.clock.unix_now();
            let verdict = signature::verify(req, &self.keyring, now, self.skew);
            check.attempts.push(Attempt {
                method: Method::WebBotAuth,
                result: verdict.map_or_else(Rejection::as_str, |_| "verified"),
            });
            if let Ok(bot) = verdict {
                check.bot = Some(BotId(bot as u8));
                return check;
            }
        }
        let (Some(fcrdns), Some((bot, crawler))) = (&self.fcrdns, self.claimed(req.headers)) else {
            return check;
        };
        let answer = fcrdns.check(client, bot, &crawler.domains).await;
        check.attempts.push(Attempt {
            method: Method::Fcrdns,
            result: answer.as_str(),
        });
        if answer == Answer::Done(Outcome::Confirmed) {
            check.bot = Some(BotId(bot as u8));
        }
        check
    }

    /// The first crawler checked by reverse DNS whose User-Agent substring
    /// the request's User-Agent holds.
    fn claimed(&self, headers: &HeaderMap) -> Option<(usize, &Crawler)> {
        let ua = headers.get(http::header::USER_AGENT)?.as_bytes();
        self.crawlers.iter().enumerate().find(|(_, c)| {
            c.checks_dns()
                && c.user_agent
                    .as_deref()
                    .is_some_and(|claim| contains(ua, claim.as_bytes()))
        })
    }
}

/// Whether `needle` (not empty: configuration refuses that) occurs in `haystack`.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}
