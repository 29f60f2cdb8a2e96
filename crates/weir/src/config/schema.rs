//! The configuration file's schema: one serde struct per TOML table.
//!
//! Defaults are part of the product: a file with only a listener and a pool
//! already caps connections per address, times out slow headers and sheds idle
//! connections first. Each default below says why it was chosen.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use super::Secret;

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where weir accepts client connections. At least one.
    #[serde(default)]
    pub listeners: Vec<ListenerConfig>,
    /// The admin API (metrics, health, status, reload).
    #[serde(default)]
    pub admin: AdminConfig,
    /// How the client address is found.
    #[serde(default)]
    pub identity: IdentityConfig,
    /// Connection control at the edge.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// Which forwarding headers weir sets towards upstreams.
    #[serde(default)]
    pub forwarding: ForwardingConfig,
    /// The access log.
    #[serde(default)]
    pub access_log: AccessLogConfig,
    /// weir's own log (stderr): its format.
    #[serde(default)]
    pub log: ProcessLogConfig,
    /// Process-level settings: worker threads, drain, reload.
    #[serde(default)]
    pub process: ProcessConfig,
    /// When a starting generation reports ready (warm-up).
    #[serde(default)]
    pub lifecycle: LifecycleConfig,
    /// Upstream pools by name.
    #[serde(default)]
    pub pools: BTreeMap<String, PoolConfig>,
    /// Route classes by name: per-class timeouts (and later, rules).
    #[serde(default)]
    pub classes: BTreeMap<String, ClassConfig>,
    /// Routes, matched in order; the first match wins.
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// Settings for all rules: global shadow switch, memory caps.
    #[serde(default)]
    pub rules: RulesConfig,
    /// Where limiter state is kept across restarts.
    #[serde(default)]
    pub state: StateConfig,
    /// Bodies of rejection responses.
    #[serde(default)]
    pub rejection: RejectionConfig,
    /// How weir verifies logged-in sessions (the only exemption it honours).
    #[serde(default)]
    pub sessions: SessionsConfig,
    /// The browser challenge (keys, difficulty, pressure, allow-lists);
    /// required when any class sets `challenge`.
    #[serde(default)]
    pub challenge: Option<crate::challenge::ChallengeConfig>,
    /// Crawlers that prove who they are (Web Bot Auth keys, reverse DNS):
    /// not challenged, and queued in their own admission lane.
    #[serde(default)]
    pub bots: Option<BotsConfig>,
    /// The visit cookie: pages weir served in a visit, evidence of a person
    /// that costs a crawler what a person's visit costs (`crate::visit`).
    #[serde(default)]
    pub visit: crate::visit::VisitConfig,
}

/// Session verification: a signed cookie weir can check, and/or an auth
/// sub-request to the app. Without either, every request is anonymous.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SessionsConfig {
    /// A cookie signed by the app (or a login service) with one of `keys`.
    #[serde(default)]
    pub signed_cookie: Option<SignedCookieConfig>,
    /// Ask the app whether a request's cookies belong to a logged-in user.
    #[serde(default)]
    pub auth_subrequest: Option<AuthSubrequestSettings>,
}

/// A signed session cookie: `v1.<base64url user>.<expiry>.<base64url HMAC-SHA256>`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SignedCookieConfig {
    /// The cookie's name.
    pub cookie: String,
    /// HMAC keys, at least 32 bytes each; the first signs, all verify (rotation).
    /// Write them as `${ENV}` references, not literals.
    pub keys: Vec<Secret>,
}

/// The auth sub-request.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AuthSubrequestSettings {
    /// The pool whose first server is asked.
    pub pool: String,
    /// Path asked; 2xx means logged in, 401/403 not.
    #[serde(default = "default_auth_path")]
    pub path: String,
    /// Cookies forwarded (only these). Requests carrying none are anonymous and
    /// cause no sub-request. Never the session cookie every visitor gets.
    pub cookies: Vec<String>,
    /// Only requests carrying every one of these cookies are asked (default:
    /// any of `cookies`). For an app whose anonymous visitors get a session
    /// cookie that must still be forwarded for logins without "remember me"
    /// (MediaWiki: ask when `wikiUserID` is present, forward the session too).
    #[serde(default)]
    pub required_cookies: Vec<String>,
    /// Response header with the user id; unset: the first line of the body.
    #[serde(default)]
    pub user_header: Option<String>,
    /// A JSON pointer (RFC 6901) into a JSON answer that holds the user id:
    /// a non-zero number or a non-empty string verifies, `0`, `""`, `null`
    /// or `false` is the app saying "anonymous" (as MediaWiki's
    /// `meta=userinfo` answers 200 with `"id": 0`). Unset: `user_header`,
    /// or the body's first line.
    #[serde(default)]
    pub user_json_pointer: Option<String>,
    /// Whole sub-request deadline.
    #[serde(default = "default_auth_timeout")]
    pub timeout: ConfigDuration,
    /// How long a verified answer is reused.
    #[serde(default = "default_verified_ttl")]
    pub verified_ttl: ConfigDuration,
    /// How long a refusal (401/403) is reused.
    #[serde(default = "default_denied_ttl")]
    pub denied_ttl: ConfigDuration,
    /// How long an unknown answer (timeout, 5xx) is reused.
    #[serde(default = "default_unknown_ttl")]
    pub unknown_ttl: ConfigDuration,
    /// Sessions cached at once (about 120 bytes each).
    #[serde(default = "default_auth_max_entries")]
    pub max_entries: usize,
    /// Sub-requests in flight at once: each takes one of the app's workers.
    #[serde(default = "default_auth_max_in_flight")]
    pub max_in_flight: usize,
}

/// Settings shared by all rules.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RulesConfig {
    /// Run every rule in shadow mode: decide, log and count "would reject",
    /// never enforce. For trying a new configuration on real traffic.
    #[serde(default)]
    pub shadow: bool,
    /// Most live keys one rule level keeps in memory (about 20-30 bytes
    /// each). Past it, the keys that owe least are evicted (and counted).
    #[serde(default = "default_max_keys_per_level")]
    pub max_keys_per_level: usize,
    /// A rejected client counts as "low-rate before" (a possible human hit by
    /// an aggregate limit) when its address sent fewer than this many
    /// requests per minute.
    #[serde(default = "default_low_rate_per_minute")]
    pub low_rate_per_minute: u32,
}

impl Default for RulesConfig {
    fn default() -> Self {
        RulesConfig {
            shadow: false,
            max_keys_per_level: default_max_keys_per_level(),
            low_rate_per_minute: default_low_rate_per_minute(),
        }
    }
}

/// Limiter state persistence.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StateConfig {
    /// Where weir keeps what it makes for itself (the challenge's key when
    /// `[challenge]` has no `keys`). Unset: systemd's `$STATE_DIRECTORY`,
    /// else `snapshot_file`'s directory, else nowhere (kept in memory).
    #[serde(default)]
    pub dir: Option<String>,
    /// Snapshot file: written periodically and at shutdown, read at start.
    /// Unset: state lives in memory only and a restart forgets it.
    #[serde(default)]
    pub snapshot_file: Option<String>,
    /// How often the snapshot is written.
    #[serde(default = "default_snapshot_interval")]
    pub snapshot_interval: ConfigDuration,
    /// Share rate limits between instances through this Redis
    /// (`redis://host:6379/0`). Unset: limits are per instance. When Redis is
    /// unreachable weir decides with its local state and recovers by itself.
    #[serde(default)]
    pub redis_url: Option<Secret>,
    /// PEM CA certificates a `rediss://` Redis is checked against, instead
    /// of the system's roots.
    #[serde(default)]
    pub redis_ca_file: Option<String>,
    /// Share rate limits through the Redis primary these sentinels name,
    /// instead of `redis_url` (one or the other).
    #[serde(default)]
    pub redis_sentinel: Option<RedisSentinelConfig>,
    /// Share rate limits through this Redis Cluster (or Valkey cluster),
    /// reached through any of these nodes (`host:port` or
    /// `redis://[:password@]host:port`), instead of `redis_url`.
    #[serde(default)]
    pub redis_cluster: Option<Vec<String>>,
    /// Prefix of every key weir writes in Redis (one per deployment).
    #[serde(default = "default_redis_prefix")]
    pub redis_prefix: String,
    /// Longest wait for one Redis round trip before deciding locally.
    #[serde(default = "default_redis_command_timeout")]
    pub redis_command_timeout: ConfigDuration,
    /// Longest wait to (re)connect to Redis.
    #[serde(default = "default_redis_connect_timeout")]
    pub redis_connect_timeout: ConfigDuration,
    /// How long tokens leased from Redis ahead of use stay with an instance
    /// before going back unused; `"0s"` for no leases (a round trip per
    /// decision).
    #[serde(default = "default_redis_lease")]
    pub redis_lease: ConfigDuration,
    /// What to do when `snapshot_file` is set but no state could be restored
    /// at start (blue/green hand-over that lost its state, incident 2):
    /// `warn` (default: log an error, export `weir_state_restored_keys 0`),
    /// `not_ready` (also answer `/readyz` with 503 so an orchestrator keeps
    /// the old generation), or `off`.
    #[serde(default)]
    pub expect_restored: ExpectRestored,
}

/// `[state.redis_sentinel]`: Redis Sentinel in front of the shared limits.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RedisSentinelConfig {
    /// The name the sentinels monitor the primary under.
    pub master: String,
    /// Sentinel addresses, `host:port` or `redis://[:password@]host:port`.
    pub nodes: Vec<String>,
    /// The database on the primary.
    #[serde(default)]
    pub db: i64,
    /// The primary's password (`${WEIR_REDIS_PASSWORD}`), if it has one.
    #[serde(default)]
    pub password: Option<Secret>,
}

impl StateConfig {
    /// Whether limits are shared through a Redis (one, behind Sentinel, or
    /// a cluster): the store the challenge's fleet key is kept in too.
    pub fn shares_through_redis(&self) -> bool {
        self.redis_url.is_some() || self.redis_sentinel.is_some() || self.redis_cluster.is_some()
    }

    /// Whether the Redis the limits are shared through, or how, differs
    /// from `other`'s (a restart's change, not a reload's).
    pub fn redis_differs(&self, other: &StateConfig) -> bool {
        self.redis_url != other.redis_url
            || self.redis_prefix != other.redis_prefix
            || self.redis_ca_file != other.redis_ca_file
            || self.redis_sentinel != other.redis_sentinel
            || self.redis_cluster != other.redis_cluster
            || self.redis_lease != other.redis_lease
    }
}

impl RedisSentinelConfig {
    /// The limiter's view of these settings.
    pub fn settings(&self) -> weir_limiter::redis::SentinelSettings {
        weir_limiter::redis::SentinelSettings {
            nodes: self.nodes.clone(),
            master: self.master.clone(),
            db: self.db,
            password: self.password.as_deref().map(str::to_owned),
        }
    }
}

/// How weir reacts to starting without the state it expected.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ExpectRestored {
    Off,
    #[default]
    Warn,
    NotReady,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            dir: None,
            snapshot_file: None,
            snapshot_interval: default_snapshot_interval(),
            redis_url: None,
            redis_ca_file: None,
            redis_sentinel: None,
            redis_cluster: None,
            redis_prefix: default_redis_prefix(),
            redis_command_timeout: default_redis_command_timeout(),
            redis_connect_timeout: default_redis_connect_timeout(),
            redis_lease: default_redis_lease(),
            expect_restored: ExpectRestored::default(),
        }
    }
}

/// Rejection response bodies. `{status}`, `{retry_after}` and `{rule}` are
/// replaced. HTML goes to browsers (`Accept: text/html`), JSON to clients
/// that accept `application/json`, text to the rest.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RejectionConfig {
    #[serde(default)]
    pub html: Option<String>,
    #[serde(default)]
    pub json: Option<String>,
    #[serde(default)]
    pub text: Option<String>,
}

/// One rule of a route class.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// Unique name: in rejections, logs and metrics.
    pub name: String,
    /// `rate` (default) or `concurrency`.
    #[serde(default, rename = "type")]
    pub kind: RuleKind,
    /// Rate rules: one or more levels, all of which must pass.
    #[serde(default)]
    pub limits: Vec<LimitConfig>,
    /// Concurrency rules: what is counted (`ip`, `subnet`, `network`, `site`,
    /// `header:NAME`, `cookie:NAME`, `user`).
    #[serde(default)]
    pub per: Option<String>,
    /// Concurrency rules: most requests in flight per key.
    #[serde(default)]
    pub max: Option<u32>,
    /// Who the rule does not apply to: `verified` (a session weir verified:
    /// signed cookie or auth sub-request), `pass` (a valid challenge pass;
    /// limit passes with a `token` level of their own). Never a cookie name.
    #[serde(default)]
    pub exempt: Vec<String>,
    /// Rate rules over their limit: `refuse` (429, the default) or `defer`
    /// (admitted to the lowest admission lane: served with capacity nobody
    /// else waits for, refused with the rule's 429 only if shed there).
    #[serde(default)]
    pub when_over: WhenOver,
    /// Methods the rule applies to; empty means all.
    #[serde(default)]
    pub methods: Vec<String>,
    /// Decide, log and count, but never enforce.
    #[serde(default)]
    pub shadow: bool,
}

/// What a rate rule does with a request over its limit.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WhenOver {
    /// Refuse it (429 with `Retry-After`).
    #[default]
    Refuse,
    /// Admit it to the lowest lane: served only with spare capacity.
    Defer,
}

/// The kind of a rule.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RuleKind {
    #[default]
    Rate,
    Concurrency,
}

/// One level of a rate rule: `rate` requests per `window` per key.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LimitConfig {
    /// What is counted: `ip`, `subnet` (IPv4 /24, IPv6 /64), `network`
    /// (IPv4 /16, IPv6 /48), `site` (one key for everyone), `header:NAME`,
    /// `cookie:NAME`, `user` (verified user).
    pub per: String,
    /// Requests per window.
    pub rate: u32,
    /// The window, from seconds to a day (`10s`, `10m`, `1d`).
    pub window: ConfigDuration,
    /// Requests allowed at once before the rate applies (default: `rate`).
    #[serde(default)]
    pub burst: Option<u32>,
}

/// One listening socket.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    /// `ip:port` to bind, e.g. `0.0.0.0:80` or `[::]:443`. Port 0 picks a free port.
    pub address: String,
    /// Expect a PROXY protocol v1 or v2 header on every connection. Only
    /// believed when the peer is in `identity.trusted_proxies`.
    #[serde(default)]
    pub proxy_protocol: bool,
    /// Serve TLS with these PEM files; ALPN offers h2 and http/1.1.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Accept HTTP/2 (h2c prior knowledge on plain listeners, ALPN on TLS).
    #[serde(default = "yes")]
    pub http2: bool,
    /// Bind with `SO_REUSEPORT`, so a new weir can listen on this address
    /// before the old one stops (a restart that refuses nothing). Every
    /// process sharing the port must set it. Needs a restart to change.
    #[serde(default)]
    pub reuse_port: bool,
}

/// Certificate and key for a TLS listener.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file with the certificate chain, leaf first.
    pub cert: String,
    /// PEM file with the private key (PKCS#8, PKCS#1 or SEC1).
    pub key: String,
}

/// The admin listener.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// `ip:port` of the admin API. Loopback by default: it can reload config.
    #[serde(default = "default_admin_address")]
    pub address: String,
    /// Set to false to run without an admin listener.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// When set, `POST /reload` (and any request that changes something)
    /// needs `Authorization: Bearer TOKEN`. Reloadable.
    #[serde(default)]
    pub token: Option<Secret>,
    /// Names accepted in `Host` on a changing request, besides IP
    /// addresses and `localhost` (DNS rebinding). Reloadable.
    #[serde(default)]
    pub hosts: Vec<String>,
}

impl AdminConfig {
    /// What only a restart changes: the listener.
    pub fn listener(&self) -> (&str, bool) {
        (&self.address, self.enabled)
    }
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            address: default_admin_address(),
            enabled: true,
            token: None,
            hosts: Vec::new(),
        }
    }
}

/// Client identity settings.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct IdentityConfig {
    /// CIDRs of proxies/load balancers whose forwarding information is believed.
    /// Empty (the default) means the TCP peer is the client.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// Which header carries the client chain from trusted proxies:
    /// `x-forwarded-for` (default) or `forwarded` (RFC 7239).
    #[serde(default)]
    pub client_header: ClientHeader,
    /// Warn when one peer address sends more than this share of requests
    /// while `trusted_proxies` is empty: weir is probably behind an
    /// unconfigured load balancer and sees every client as one (incident 4).
    #[serde(default = "default_dominant_share")]
    pub dominant_peer_share: f64,
    /// The window over which that share is measured.
    #[serde(default = "default_dominant_window")]
    pub dominant_peer_window: ConfigDuration,
    /// Minimum requests in a window before the share is judged.
    #[serde(default = "default_dominant_min")]
    pub dominant_peer_min_requests: u64,
}

impl Default for IdentityConfig {
    fn default() -> Self {
        IdentityConfig {
            trusted_proxies: Vec::new(),
            client_header: ClientHeader::default(),
            dominant_peer_share: default_dominant_share(),
            dominant_peer_window: default_dominant_window(),
            dominant_peer_min_requests: default_dominant_min(),
        }
    }
}

/// Which forwarding header to believe from trusted proxies.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ClientHeader {
    #[default]
    XForwardedFor,
    Forwarded,
}

/// Connection control at the edge.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Connections open at once, all listeners together. At the cap weir closes
    /// idle keep-alive connections first, then refuses new ones. Default 10,000;
    /// lowered at start-up if the open-file limit cannot hold it.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Connections from one client address. Default 256: generous for carrier
    /// NAT, yet a flood from a handful of addresses cannot fill the global cap.
    #[serde(default = "default_max_connections_per_ip")]
    pub max_connections_per_ip: usize,
    /// Requests in flight from one client address (after trusted-proxy
    /// resolution). Default 128.
    #[serde(default = "default_max_in_flight_per_ip")]
    pub max_requests_in_flight_per_ip: usize,
    /// Time to receive a complete request head, from connection start or from
    /// the first byte of a request on a kept-alive connection (slowloris).
    #[serde(default = "default_header_read_timeout")]
    pub header_read_timeout: ConfigDuration,
    /// An idle keep-alive connection is closed after this long.
    #[serde(default = "default_keepalive_idle_timeout")]
    pub keepalive_idle_timeout: ConfigDuration,
    /// Time to complete a TLS handshake or read a PROXY protocol header.
    #[serde(default = "default_handshake_timeout")]
    pub handshake_timeout: ConfigDuration,
    /// Largest request head in bytes (request line plus headers). Larger heads
    /// get 431. Minimum 8192.
    #[serde(default = "default_max_header_bytes")]
    pub max_header_bytes: usize,
    /// Most header fields in one request. More get 431.
    #[serde(default = "default_max_headers")]
    pub max_headers: usize,
    /// Default longest wait between two chunks of a request body; classes may
    /// override (an `upload` class may need minutes).
    #[serde(default = "default_body_read_timeout")]
    pub body_read_timeout: ConfigDuration,
    /// Lowest average rate of a request body, in bytes per second, after a
    /// grace of `body_read_timeout` (a body dripped a byte at a time ends).
    /// 0 turns it off. Classes may override.
    #[serde(default = "default_min_body_rate")]
    pub min_body_rate: u64,
    /// Largest request body in bytes; a longer one gets 413. Classes may
    /// override (an upload class).
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: u64,
    /// Longest a response write to the client may make no progress (its
    /// receive window stays full) before the connection is closed, freeing
    /// the request's admission slot: nginx's `send_timeout`.
    #[serde(default = "default_send_timeout")]
    pub send_timeout: ConfigDuration,
    /// IPv6 clients are counted by the per-address caps under this prefix
    /// (one site's /64, by default); 128 counts single addresses.
    #[serde(default = "default_ipv6_prefix_len")]
    pub ipv6_prefix_len: u8,
    /// Forward `%2F` in a path as data instead of refusing the request with
    /// 400. For apps whose identifiers hold encoded slashes (GitLab's
    /// `group%2Fproject`), behind a server that does not decode it into a
    /// separator (nginx does, in `$uri`). Default false.
    #[serde(default)]
    pub allow_encoded_slash: bool,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_connections: default_max_connections(),
            max_connections_per_ip: default_max_connections_per_ip(),
            max_requests_in_flight_per_ip: default_max_in_flight_per_ip(),
            header_read_timeout: default_header_read_timeout(),
            keepalive_idle_timeout: default_keepalive_idle_timeout(),
            handshake_timeout: default_handshake_timeout(),
            max_header_bytes: default_max_header_bytes(),
            max_headers: default_max_headers(),
            body_read_timeout: default_body_read_timeout(),
            min_body_rate: default_min_body_rate(),
            max_body_bytes: default_max_body_bytes(),
            send_timeout: default_send_timeout(),
            ipv6_prefix_len: default_ipv6_prefix_len(),
            allow_encoded_slash: false,
        }
    }
}

/// Forwarding headers set on requests to upstreams.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ForwardingConfig {
    /// `append` (default): add the client to the received chain when the peer is
    /// trusted, or start a new chain with the client when it is not (an
    /// untrusted chain is never passed on); `replace`: send only the client;
    /// `off`: send none.
    #[serde(default)]
    pub x_forwarded_for: XffMode,
    /// Set `X-Forwarded-Proto` to `http` or `https`.
    #[serde(default = "yes")]
    pub x_forwarded_proto: bool,
    /// Set an RFC 7239 `Forwarded` header (`for=`, `proto=`, `host=`).
    #[serde(default)]
    pub forwarded: bool,
    /// Add a `Via` header naming weir (RFC 9110 §7.6.3).
    #[serde(default)]
    pub via: bool,
}

impl Default for ForwardingConfig {
    fn default() -> Self {
        ForwardingConfig {
            x_forwarded_for: XffMode::default(),
            x_forwarded_proto: true,
            forwarded: false,
            via: false,
        }
    }
}

/// How `X-Forwarded-For` is written.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum XffMode {
    #[default]
    Append,
    Replace,
    Off,
}

/// The access log.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AccessLogConfig {
    /// `stdout` (default), `off`, or a file path (appended to).
    #[serde(default = "default_access_log_target")]
    pub target: String,
}

impl Default for AccessLogConfig {
    fn default() -> Self {
        AccessLogConfig {
            target: default_access_log_target(),
        }
    }
}

/// weir's own log on stderr (what `WEIR_LOG` filters).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProcessLogConfig {
    /// `text` (default) or `json`: one JSON object per line, for Loki,
    /// Vector or journald's JSON readers. Applied at start and on reload.
    #[serde(default)]
    pub format: crate::observe::process_log::Format,
}

/// Process-level settings; changing them needs a restart, not a reload.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProcessConfig {
    /// Worker threads. 0 (default) means one per CPU core.
    #[serde(default)]
    pub workers: usize,
    /// On SIGTERM, how long in-flight requests may take to finish.
    #[serde(default = "default_drain_timeout")]
    pub drain_timeout: ConfigDuration,
    /// Reload when the config file's content changes.
    #[serde(default = "yes")]
    pub watch_config: bool,
    /// How often the config file is checked for changes.
    #[serde(default = "default_watch_interval")]
    pub watch_interval: ConfigDuration,
}

impl Default for ProcessConfig {
    fn default() -> Self {
        ProcessConfig {
            workers: 0,
            drain_timeout: default_drain_timeout(),
            watch_config: true,
            watch_interval: default_watch_interval(),
        }
    }
}

/// When a starting generation calls itself ready: `/readyz`, and in an
/// in-place upgrade the moment the old process is told to stop.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LifecycleConfig {
    /// Readiness waits until every pool has a server that answers (its
    /// health check passes; without `health_check`, it accepts a
    /// connection) and, with `state.redis_url`, until Redis answers: a new
    /// generation then takes traffic with warm upstreams and the shared
    /// limits in force. On by default: a hand-over to a generation that
    /// cannot reach its app is an outage.
    #[serde(default = "yes")]
    pub ready_requires_upstream: bool,
    /// The longest readiness waits for that; then weir reports ready anyway,
    /// logs an error naming what never answered and counts
    /// `weir_warmup_timeouts_total` (a dead app must not keep weir unready
    /// forever, nor an upgrade from finishing).
    #[serde(default = "default_ready_upstream_timeout")]
    pub ready_upstream_timeout: ConfigDuration,
}

impl Default for LifecycleConfig {
    fn default() -> Self {
        LifecycleConfig {
            ready_requires_upstream: true,
            ready_upstream_timeout: default_ready_upstream_timeout(),
        }
    }
}

/// 30 s: an app container's start-up (php-fpm, a JVM) fits, and an
/// orchestrator's readiness budget is usually longer.
fn default_ready_upstream_timeout() -> ConfigDuration {
    ConfigDuration::secs(30)
}

/// An upstream pool.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// `host:port` of each server (IP literals; names are resolved at load).
    pub servers: Vec<String>,
    /// `least_in_flight` (default) or `round_robin`.
    #[serde(default)]
    pub balance: Balance,
    /// How long to wait for a TCP connection to a server. Default 10 s: a
    /// server whose workers are warming up is slow, not dead (incident 2 needed
    /// 10 s where 3 s produced 502s).
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout: ConfigDuration,
    /// How long to wait for response headers once the request is sent.
    #[serde(default = "default_response_timeout")]
    pub response_timeout: ConfigDuration,
    /// Idle pooled connections to a server are closed after this long.
    #[serde(default = "default_pool_idle_timeout")]
    pub idle_timeout: ConfigDuration,
    /// Idle pooled connections kept per server.
    #[serde(default = "default_max_idle_per_server")]
    pub max_idle_per_server: usize,
    /// Admission control: how many requests the app gets at once, and who
    /// waits. Absent: on, with every setting at its default (the limit
    /// learned from latency); `enabled = false` sends requests straight
    /// through, as without weir.
    #[serde(default)]
    pub admission: Option<AdmissionSettings>,
    /// Active health checks. Absent: no checks, and servers are never
    /// marked slow or dead.
    #[serde(default)]
    pub health: Option<HealthCheckSettings>,
    /// How many failed requests may be re-sent to another server.
    #[serde(default)]
    pub retry_budget: RetryBudgetSettings,
}

/// `[pools.NAME.admission]`: a concurrency limit in front of the app and a
/// bounded, prioritised, fair queue for what is over it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AdmissionSettings {
    /// `false`: no queue and no limit, every request goes straight to the app.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Requests in flight to the whole pool at once (e.g. the app's worker
    /// count minus one). Absent: learned from latency (Gradient2).
    #[serde(default)]
    pub max_in_flight: Option<usize>,
    /// The app's real worker count (all servers together). One worker beyond
    /// traffic is kept for health checks; traffic never gets more than
    /// `workers - 1` whatever the limit says.
    #[serde(default)]
    pub workers: Option<usize>,
    /// Requests waiting in all lanes together; past it, the lowest lane is
    /// shed first.
    #[serde(default = "default_max_queued")]
    pub max_queued: usize,
    /// Longest wait for a slot before `503` + `Retry-After` (a class may
    /// set its own).
    #[serde(default = "default_queue_timeout")]
    pub queue_timeout: ConfigDuration,
    /// Ramp a server added by a reload, or back from dead, over at least
    /// this long, by what it measurably handles. `"0s"` turns it off.
    #[serde(default = "default_slow_start")]
    pub slow_start: ConfigDuration,
    /// The least share of the app's slots the `newcomers` lane (cheap pages
    /// of clients weir has no evidence of: a visit's first page) gets while
    /// it waits, even when visits wait too (0 ..= 1; 0 = strict priority).
    #[serde(default = "default_newcomers_share")]
    pub newcomers_share: f64,
    /// The least share of the app's slots the `pass` lane (a pass alone,
    /// no visit of a person's) gets while it waits behind unproven floods
    /// (0 ..= 1; 0 = strict priority). Taken only from grants to networks
    /// with a backlog and no proof.
    #[serde(default = "default_pass_share")]
    pub pass_share: f64,
    /// The least share of the app's slots verified crawlers get while they
    /// wait, even when people wait too (0 ..= 1; 0 = only what people
    /// leave). Everything, when nobody else waits.
    #[serde(default = "default_bots_share")]
    pub bots_share: f64,
    /// The least share of the app's slots the `anonymous` lane gets while
    /// it waits, even when higher lanes wait too (0 ..= 1; 0 = strict
    /// priority). Keeps a flood of cheap requests from starving every
    /// expensive one (a login, an upload) for as long as it lasts.
    #[serde(default = "default_anonymous_share")]
    pub anonymous_share: f64,
}

impl Default for AdmissionSettings {
    /// What a pool without `[pools.NAME.admission]` gets.
    fn default() -> Self {
        AdmissionSettings {
            enabled: true,
            max_in_flight: None,
            workers: None,
            max_queued: default_max_queued(),
            queue_timeout: default_queue_timeout(),
            slow_start: default_slow_start(),
            newcomers_share: default_newcomers_share(),
            pass_share: default_pass_share(),
            bots_share: default_bots_share(),
            anonymous_share: default_anonymous_share(),
        }
    }
}

/// `[pools.NAME.health]`: active checks, which never queue behind traffic.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HealthCheckSettings {
    /// Path asked on each server; any answer below 500 passes.
    #[serde(default = "default_health_path")]
    pub path: String,
    /// Time between two checks of a server.
    #[serde(default = "default_health_interval")]
    pub interval: ConfigDuration,
    /// A check without an answer after this long has timed out.
    #[serde(default = "default_health_timeout")]
    pub timeout: ConfigDuration,
    /// A server whose smoothed latency is above this is *slow* (still used,
    /// with a lower weight).
    #[serde(default = "default_slow_threshold")]
    pub slow_threshold: ConfigDuration,
    /// Consecutive failures before a server is slow (checks failing) or dead
    /// (connections refused, or timeouts plus `silence`).
    #[serde(default = "default_health_fall")]
    pub fall: u32,
    /// Consecutive answers that bring a dead server back.
    #[serde(default = "default_health_rise")]
    pub rise: u32,
    /// A server that times out is only dead once nothing at all (checks or
    /// requests) was answered for this long: slow is never dead.
    #[serde(default = "default_health_silence")]
    pub silence: ConfigDuration,
}

/// `[pools.NAME.retry_budget]`: re-sends are at most `ratio` of requests
/// plus `min_per_second`, over `window`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RetryBudgetSettings {
    /// Share of requests that may be retried (0.2 = 20%).
    #[serde(default = "default_retry_ratio")]
    pub ratio: f64,
    /// Retries always allowed per second, so a quiet pool can still retry.
    #[serde(default = "default_retry_min_per_second")]
    pub min_per_second: u32,
    /// The sliding window the budget is counted over (1 s to 60 s).
    #[serde(default = "default_retry_window")]
    pub window: ConfigDuration,
}

impl Default for RetryBudgetSettings {
    fn default() -> Self {
        RetryBudgetSettings {
            ratio: default_retry_ratio(),
            min_per_second: default_retry_min_per_second(),
            window: default_retry_window(),
        }
    }
}

/// Balancing across a pool's servers.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    #[default]
    LeastInFlight,
    RoundRobin,
}

/// Per-route-class settings.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClassConfig {
    /// Longest wait between two chunks of a request body for this class
    /// (overrides `limits.body_read_timeout`).
    #[serde(default)]
    pub body_read_timeout: Option<ConfigDuration>,
    /// Lowest average request-body rate for this class (overrides
    /// `limits.min_body_rate`).
    #[serde(default)]
    pub min_body_rate: Option<u64>,
    /// Largest request body for this class (overrides `limits.max_body_bytes`).
    #[serde(default)]
    pub max_body_bytes: Option<u64>,
    /// Time to wait for the upstream's response headers (overrides the pool's).
    #[serde(default)]
    pub response_timeout: Option<ConfigDuration>,
    /// Rules, evaluated in order; all that apply must pass.
    #[serde(default)]
    pub rules: Vec<RuleConfig>,
    /// Browser challenge for this class: `off` (default), `under_pressure`
    /// (when the pool's admission queue is saturated), `always`.
    #[serde(default)]
    pub challenge: crate::challenge::ChallengeMode,
    /// Admission lane of anonymous requests of this class, when its pool has
    /// `[pools.NAME.admission]`: unset, `newcomers` for cheap pages (a visit
    /// weir counted lifts them to `pass`) and `anonymous` for shapes the pool
    /// learned are expensive; or any standard lane by name (`pass`,
    /// `anonymous`: shed first, ...). Verified sessions always use
    /// `verified`; pass-token holders at least `pass`.
    #[serde(default)]
    pub lane: Option<String>,
    /// Longest wait in the admission queue for this class (overrides the
    /// pool's `queue_timeout`).
    #[serde(default)]
    pub queue_timeout: Option<ConfigDuration>,
    /// Request coalescing (off by default): identical anonymous GET/HEAD
    /// requests in flight at once share one upstream request when its
    /// response is shareable (cacheable status, no `Set-Cookie`, not
    /// `private`/`no-store`). Off because sharing is only right for pages
    /// that are the same for every anonymous visitor.
    #[serde(default)]
    pub coalesce: bool,
    /// Largest response body coalescing shares, in bytes (default 1 MiB:
    /// a rendered article); larger responses go to each request.
    #[serde(default)]
    pub coalesce_max_body_bytes: Option<usize>,
}

/// A route: conditions (all must hold) leading to a pool and a class.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// The pool that serves matching requests.
    pub pool: String,
    /// The route class (default `default`): a name for limits, timeouts and metrics.
    #[serde(default = "default_class")]
    pub class: String,
    /// Host to match: exact (`wiki.example.org`) or suffix (`*.example.org`).
    /// Compared without port, case-insensitively.
    #[serde(default)]
    pub host: Option<String>,
    /// Path prefix to match, e.g. `/w/`.
    #[serde(default)]
    pub path_prefix: Option<String>,
    /// Regular expression the path must match (Rust `regex` syntax, unanchored).
    #[serde(default)]
    pub path_regex: Option<String>,
    /// Methods to match, e.g. `["GET", "HEAD"]`. Empty means any.
    #[serde(default)]
    pub methods: Vec<String>,
    /// The route matches if the query string has any of these keys
    /// (e.g. `["search", "diff", "oldid"]`). Empty means no condition.
    #[serde(default)]
    pub query_keys: Vec<String>,
    /// Header names that must be present.
    #[serde(default)]
    pub headers: Vec<String>,
    /// Cookie names that must be present. Presence routes; it never exempts
    /// anyone from a limit (anyone can set a cookie).
    #[serde(default)]
    pub cookies: Vec<String>,
}

/// A duration written as text: `500ms`, `10s`, `5m`, `1h 30m`, `1d`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ConfigDuration(pub Duration);

impl ConfigDuration {
    pub const fn secs(s: u64) -> Self {
        ConfigDuration(Duration::from_secs(s))
    }
}

impl fmt::Debug for ConfigDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for ConfigDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(text.trim())
            .map(ConfigDuration)
            .map_err(|e| {
                serde::de::Error::custom(format!(
                    "`{text}` is not a duration ({e}); write e.g. \"500ms\", \"10s\", \"5m\""
                ))
            })
    }
}

fn yes() -> bool {
    true
}
fn default_admin_address() -> String {
    "127.0.0.1:9901".into()
}
fn default_dominant_share() -> f64 {
    0.5
}
fn default_dominant_window() -> ConfigDuration {
    ConfigDuration::secs(60)
}
fn default_dominant_min() -> u64 {
    1000
}
fn default_max_connections() -> usize {
    10_000
}
fn default_max_connections_per_ip() -> usize {
    256
}
fn default_max_in_flight_per_ip() -> usize {
    128
}
fn default_header_read_timeout() -> ConfigDuration {
    ConfigDuration::secs(10)
}
fn default_keepalive_idle_timeout() -> ConfigDuration {
    ConfigDuration::secs(60)
}
fn default_handshake_timeout() -> ConfigDuration {
    ConfigDuration::secs(10)
}
fn default_max_header_bytes() -> usize {
    // nginx's large_client_header_buffers default is 4 x 8k; 32 KiB keeps big
    // cookies working while bounding memory per connection.
    32 * 1024
}
fn default_max_headers() -> usize {
    100
}
fn default_body_read_timeout() -> ConfigDuration {
    ConfigDuration::secs(30)
}
fn default_min_body_rate() -> u64 {
    1024
}
fn default_max_body_bytes() -> u64 {
    // MediaWiki's and PHP's usual upload ceiling; nginx's 1 MiB refuses
    // ordinary uploads.
    100 << 20
}
fn default_ipv6_prefix_len() -> u8 {
    64
}
fn default_send_timeout() -> ConfigDuration {
    ConfigDuration::secs(30)
}
fn default_access_log_target() -> String {
    "stdout".into()
}
fn default_drain_timeout() -> ConfigDuration {
    ConfigDuration::secs(30)
}
fn default_watch_interval() -> ConfigDuration {
    ConfigDuration::secs(2)
}
fn default_connect_timeout() -> ConfigDuration {
    ConfigDuration::secs(10)
}
fn default_response_timeout() -> ConfigDuration {
    ConfigDuration::secs(60)
}
fn default_pool_idle_timeout() -> ConfigDuration {
    ConfigDuration::secs(60)
}
fn default_max_idle_per_server() -> usize {
    256
}
fn default_max_keys_per_level() -> usize {
    1_000_000
}
fn default_low_rate_per_minute() -> u32 {
    30
}
fn default_snapshot_interval() -> ConfigDuration {
    ConfigDuration::secs(30)
}
fn default_redis_prefix() -> String {
    "weir:".into()
}
fn default_redis_command_timeout() -> ConfigDuration {
    ConfigDuration(Duration::from_millis(50))
}
fn default_redis_connect_timeout() -> ConfigDuration {
    ConfigDuration::secs(1)
}
fn default_redis_lease() -> ConfigDuration {
    ConfigDuration(weir_limiter::lease::DEFAULT_PERIOD)
}
fn default_auth_path() -> String {
    "/whoami".into()
}
fn default_auth_timeout() -> ConfigDuration {
    ConfigDuration(Duration::from_millis(500))
}
fn default_verified_ttl() -> ConfigDuration {
    ConfigDuration::secs(60)
}
fn default_denied_ttl() -> ConfigDuration {
    ConfigDuration::secs(10)
}
fn default_unknown_ttl() -> ConfigDuration {
    ConfigDuration::secs(1)
}
fn default_auth_max_entries() -> usize {
    100_000
}
fn default_auth_max_in_flight() -> usize {
    4
}
fn default_max_queued() -> usize {
    2048
}
fn default_queue_timeout() -> ConfigDuration {
    ConfigDuration::secs(10)
}
fn default_newcomers_share() -> f64 {
    0.05
}
fn default_pass_share() -> f64 {
    0.05
}
fn default_bots_share() -> f64 {
    0.1
}
fn default_anonymous_share() -> f64 {
    0.05
}
fn default_slow_start() -> ConfigDuration {
    ConfigDuration::secs(10)
}
fn default_health_path() -> String {
    "/healthz".into()
}
fn default_health_interval() -> ConfigDuration {
    ConfigDuration::secs(5)
}
fn default_health_timeout() -> ConfigDuration {
    ConfigDuration::secs(2)
}
fn default_slow_threshold() -> ConfigDuration {
    ConfigDuration::secs(2)
}
fn default_health_fall() -> u32 {
    3
}
fn default_health_rise() -> u32 {
    2
}
fn default_health_silence() -> ConfigDuration {
    ConfigDuration::secs(30)
}
fn default_retry_ratio() -> f64 {
    0.2
}
fn default_retry_min_per_second() -> u32 {
    1
}
fn default_retry_window() -> ConfigDuration {
    ConfigDuration::secs(10)
}
fn default_class() -> String {
    "default".into()
}

/// `[bots]`: crawlers that prove who they are, and how they are checked.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BotsConfig {
    /// Clock difference allowed on a Web Bot Auth signature's `created`
    /// and `expires`. 60 s: crawlers run NTP, and a signature lives minutes.
    #[serde(default = "default_bots_max_skew")]
    pub max_skew: ConfigDuration,
    /// Name servers for reverse DNS, `ip` or `ip:port` (port 53 when
    /// absent). Empty: the system's (`/etc/resolv.conf`).
    #[serde(default)]
    pub dns_servers: Vec<String>,
    /// The longest a request waits for a reverse-DNS check. 200 ms: the
    /// first request of a crawler's address pays it once; a check still
    /// running then finishes in the background and the next request gets
    /// its answer.
    #[serde(default = "default_bots_dns_wait")]
    pub dns_wait: ConfigDuration,
    /// The longest one check (PTR, then A/AAAA) may take before it counts
    /// as failed. 2 s.
    #[serde(default = "default_bots_dns_timeout")]
    pub dns_timeout: ConfigDuration,
    /// How long a confirmed address is believed. 1 h: crawler address
    /// ranges change over weeks.
    #[serde(default = "default_bots_verified_ttl")]
    pub dns_verified_ttl: ConfigDuration,
    /// How long an address that did not confirm is remembered as such (a
    /// failed lookup: at most 30 s). 10 min: a spoofer's every request
    /// should not cost a lookup.
    #[serde(default = "default_bots_negative_ttl")]
    pub dns_negative_ttl: ConfigDuration,
    /// (address, crawler) pairs remembered (about 100 bytes each).
    #[serde(default = "default_bots_cache_size")]
    pub dns_cache_size: usize,
    /// Reverse-DNS checks running at once; a claim beyond them is not
    /// checked (not proven) rather than queued.
    #[serde(default = "default_bots_max_lookups")]
    pub dns_max_lookups: usize,
    /// The crawlers that may prove themselves.
    #[serde(default)]
    pub crawlers: Vec<CrawlerConfig>,
}

impl Default for BotsConfig {
    fn default() -> Self {
        BotsConfig {
            max_skew: default_bots_max_skew(),
            dns_servers: Vec::new(),
            dns_wait: default_bots_dns_wait(),
            dns_timeout: default_bots_dns_timeout(),
            dns_verified_ttl: default_bots_verified_ttl(),
            dns_negative_ttl: default_bots_negative_ttl(),
            dns_cache_size: default_bots_cache_size(),
            dns_max_lookups: default_bots_max_lookups(),
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

fn default_bots_max_skew() -> ConfigDuration {
    ConfigDuration::secs(60)
}
fn default_bots_dns_wait() -> ConfigDuration {
    ConfigDuration(Duration::from_millis(200))
}
fn default_bots_dns_timeout() -> ConfigDuration {
    ConfigDuration::secs(2)
}
fn default_bots_verified_ttl() -> ConfigDuration {
    ConfigDuration::secs(3600)
}
fn default_bots_negative_ttl() -> ConfigDuration {
    ConfigDuration::secs(600)
}
fn default_bots_cache_size() -> usize {
    10_000
}
fn default_bots_max_lookups() -> usize {
    16
}
