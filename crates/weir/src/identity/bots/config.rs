//! The `[bots]` table: serde structs mirroring the TOML, with defaults that
//! say why they were chosen.
//!
//! Owns: the file schema of verified crawlers (`[bots]`,
//! `[[bots.crawlers]]`). Does not: read key files or build a resolver
//! (`gateway` compiles this into a [`super::BotVerifier`], naming the key
//! and line of every problem).

use serde::Deserialize;

use crate::config::ConfigDuration;

/// `[bots]`: crawlers that prove who they are, and how they are checked.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BotsConfig {
    /// Clock difference allowed on a Web Bot Auth signature's `created`
    /// and `expires`. 60 s: crawlers run NTP, and a signature lives minutes.
    #[serde(default = "default_max_skew")]
    pub max_skew: ConfigDuration,
    /// Name servers for reverse DNS, `ip` or `ip:port` (port 53 when
    /// absent). Empty: the system's (`/etc/resolv.conf`).
    #[serde(default)]
    pub dns_servers: Vec<String>,
    /// The longest a request waits for a reverse-DNS check. 200 ms: the
    /// first request of a crawler's address pays it once; a check still
    /// running then finishes in the background and the next request gets
    /// its answer.
    #[serde(default = "default_dns_wait")]
    pub dns_wait: ConfigDuration,
    /// The longest one check (PTR, then A/AAAA) may take before it counts
    /// as failed. 2 s.
    #[serde(default = "default_dns_timeout")]
    pub dns_timeout: ConfigDuration,
    /// How long a confirmed address is believed. 1 h: crawler address
    /// ranges change over weeks.
    #[serde(default = "default_verified_ttl")]
    pub dns_verified_ttl: ConfigDuration,
    /// How long an address that did not confirm is remembered as such (a
    /// failed lookup: at most 30 s). 10 min: a spoofer's every request
    /// should not cost a lookup.
    #[serde(default = "default_negative_ttl")]
    pub dns_negative_ttl: ConfigDuration,
    /// (address, crawler) pairs remembered (about 100 bytes each).
    #[serde(default = "default_cache_size")]
    pub dns_cache_size: usize,
    /// Reverse-DNS checks running at once; a claim beyond them is not
    /// checked (not proven) rather than queued.
    #[serde(default = "default_max_lookups")]
    pub dns_max_lookups: usize,
    /// The crawlers that may prove themselves.
    #[serde(default)]
    pub crawlers: Vec<CrawlerConfig>,
}

impl Default for BotsConfig {
    fn default() -> Self {
        BotsConfig {
            max_skew: default_max_skew(),
            dns_servers: Vec::new(),
            dns_wait: default_dns_wait(),
            dns_timeout: default_dns_timeout(),
            dns_verified_ttl: default_verified_ttl(),
            dns_negative_ttl: default_negative_ttl(),
            dns_cache_size: default_cache_size(),
            dns_max_lookups: default_max_lookups(),
            crawlers: Vec::new(),
        }
    }
}

/// `[[bots.crawlers]]`: one crawler and how it proves itself: Web Bot Auth
/// keys, forward-confirmed reverse DNS, or both.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CrawlerConfig {
    /// The name in logs and metrics (`bot`), `[a-z0-9_-]`, unique.
    pub name: String,
    /// Reverse DNS: the User-Agent substring (case-sensitive) by which a
    /// request claims to be this crawler, e.g. `Googlebot`.
    #[serde(default)]
    pub user_agent: Option<String>,
    /// Reverse DNS: the domains the crawler's PTR names end in, e.g.
    /// `["googlebot.com", "google.com"]`.
    #[serde(default)]
    pub domains: Option<Vec<String>>,
    /// Web Bot Auth: a file of the crawler's Ed25519 public keys, as its
    /// `/.well-known/http-message-signatures-directory` serves them (a JWK
    /// Set) or one JWK. Read at start and on every reload.
    #[serde(default)]
    pub keys_file: Option<String>,
    /// Web Bot Auth: Ed25519 public keys written inline, each a JWK's `x`
    /// (base64url of the 32 key bytes).
    #[serde(default)]
    pub keys: Vec<String>,
}

fn default_max_skew() -> ConfigDuration {
    ConfigDuration::secs(60)
}
fn default_dns_wait() -> ConfigDuration {
    ConfigDuration(std::time::Duration::from_millis(200))
}
fn default_dns_timeout() -> ConfigDuration {
    ConfigDuration::secs(2)
}
fn default_verified_ttl() -> ConfigDuration {
    ConfigDuration::secs(3600)
}
fn default_negative_ttl() -> ConfigDuration {
    ConfigDuration::secs(600)
}
fn default_cache_size() -> usize {
    10_000
}
fn default_max_lookups() -> usize {
    16
}
