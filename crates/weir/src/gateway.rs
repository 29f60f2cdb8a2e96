//! The gateway: a validated configuration compiled into runtime values.
//!
//! A [`Gateway`] is immutable. A reload builds a new one and swaps it in
//! atomically; requests already running keep the one they started with. Pools
//! whose definition did not change are carried over, with their warm
//! connections and state.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::admission::{Coalescer, Lane, Lanes};
use crate::config::{ClientHeader, ConfigError, ConfigErrors, KeyPath, LoadedConfig};
use crate::edge::tls;
use crate::edge::{ConnLimits, EdgeSettings, ListenerSpec};
use crate::identity::TrustedProxies;
use crate::identity::dominance::DominantPeerDetector;
use crate::identity::forwarded::ForwardedHeader;
use crate::identity::session::{
    AuthSubrequest, AuthSubrequestConfig, SessionVerifier, SignedCookie, SigningKeys,
    SystemWallClock,
};
use crate::policy::route::{ClassSettings, HostMatch};
use crate::policy::rules::{self, KeyKind, RateLevel, Rule, RuleBody};
use crate::policy::{Route, RouteClass, RouteTable};
use crate::upstream::{ForwardingHeaders, Pool};
use weir_http::target::PathPolicy;
use weir_limiter::{InflightTable, Quota, RuleFingerprint, RuleStores, StoreConfig};

/// Everything a request needs from configuration, compiled.
pub struct Gateway {
    pub version: u64,
    pub loaded: LoadedConfig,
    pub listeners: Vec<ListenerSpec>,
    pub routes: RouteTable,
    pub pools: Vec<Arc<Pool>>,
    pub classes: HashMap<String, ClassSettings>,
    pub trusted: TrustedProxies,
    pub client_header: ForwardedHeader,
    /// How request paths are read where sites differ (`weir_http::target`).
    pub path_policy: PathPolicy,
    pub forwarding: ForwardingHeaders,
    pub edge: EdgeSettings,
    pub dominance: Arc<DominantPeerDetector>,
    pub admin_address: Option<SocketAddr>,
    pub drain_timeout: Duration,
    /// Every rule level's state, by fingerprint; carried across reloads.
    pub rule_stores: RuleStores,
    /// Concurrency rules' in-flight tables, by fingerprint.
    pub inflight_tables: HashMap<RuleFingerprint, Arc<InflightTable>>,
    /// All rules in shadow mode.
    pub rules_shadow: bool,
    /// Rejection bodies (templates).
    pub rejection: crate::config::RejectionConfig,
    /// Below this per-address rate a rejected client counts as "low-rate".
    pub low_rate: Quota,
    /// Session verification, if configured.
    pub sessions: Option<Arc<SessionVerifier>>,
    /// The browser challenge, if configured.
    pub challenger: Option<Arc<crate::challenge::Challenger>>,
    /// Admission lane and queue deadline per route class (classes not
    /// listed use [`ClassAdmission::default`]).
    pub class_admission: HashMap<String, ClassAdmission>,
    /// In-flight leaders of each class with `coalesce = true`; carried
    /// across reloads so a reload does not split a group in flight.
    pub coalescers: HashMap<String, Coalescer>,
}

/// How a route class waits in its pool's admission queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassAdmission {
    /// Lane of anonymous requests (verified sessions always use the top one).
    pub lane: Lane,
    /// Deadline in the queue; `None` uses the pool's `queue_timeout`.
    pub queue_timeout: Option<Duration>,
    /// Request coalescing: the largest body shared, or `None` (off).
    pub coalesce_max_body: Option<usize>,
}

impl Default for ClassAdmission {
    /// The middle lane: cheap pages from anyone.
    fn default() -> Self {
        ClassAdmission {
            lane: Lane::PASS,
            queue_timeout: None,
            coalesce_max_body: None,
        }
    }
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("version", &self.version)
            .field("pools", &self.pools)
            .finish()
    }
}

/// Default `coalesce_max_body_bytes`: a rendered article page.
const COALESCE_MAX_BODY: usize = 1 << 20;
/// Largest `coalesce_max_body_bytes`: every group in flight holds one copy.
const COALESCE_MAX_BODY_LIMIT: usize = 64 << 20;

/// Smallest buffer hyper accepts for request heads.
const MIN_HEADER_BYTES: usize = 8192;

impl Gateway {
    /// Compiles `loaded`, collecting every problem. Pools identical to one in
    /// `previous` are reused.
    pub fn build(
        loaded: LoadedConfig,
        previous: Option<&Gateway>,
        version: u64,
    ) -> Result<Gateway, ConfigErrors> {
        let cfg = &loaded.config;
        let root = KeyPath::root();
        let mut errors: Vec<ConfigError> = Vec::new();

        // Listeners.
        if cfg.listeners.is_empty() {
            errors.push(loaded.error_at(
                &root.key("listeners"),
                "at least one [[listeners]] entry is required",
            ));
        }
        let mut listeners = Vec::new();
        for (i, l) in cfg.listeners.iter().enumerate() {
            let at = root.key("listeners").index(i);
            let address = match l.address.parse::<SocketAddr>() {
                Ok(a) => a,
                Err(_) => {
                    errors.push(loaded.error_at(
                        &at.key("address"),
                        format!(
                            "`{}` is not ip:port (e.g. \"0.0.0.0:8080\" or \"[::]:443\")",
                            l.address
                        ),
                    ));
                    continue;
                }
            };
            let tls = match &l.tls {
                None => None,
                Some(t) => match tls::acceptor(&t.cert, &t.key, l.http2) {
                    Ok(a) => Some(a),
                    Err(e) => {
                        let key = if matches!(e, tls::TlsError::Key { .. }) {
                            "key"
                        } else {
                            "cert"
                        };
                        errors.push(loaded.error_at(&at.key("tls").key(key), e.to_string()));
                        None
                    }
                },
            };
            listeners.push(ListenerSpec {
                address,
                proxy_protocol: l.proxy_protocol,
                http2: l.http2,
                tls,
            });
        }

        // Admin.
        let admin_address = if cfg.admin.enabled {
            match cfg.admin.address.parse::<SocketAddr>() {
                Ok(a) => Some(a),
                Err(_) => {
                    errors.push(loaded.error_at(
                        &root.key("admin").key("address"),
                        format!("`{}` is not ip:port", cfg.admin.address),
                    ));
                    None
                }
            }
        } else {
            None
        };

        // Identity.
        let id_at = root.key("identity");
        for (i, entry) in cfg.identity.trusted_proxies.iter().enumerate() {
            if let Err(e) = TrustedProxies::parse(std::slice::from_ref(entry)) {
                errors.push(loaded.error_at(&id_at.key("trusted_proxies").index(i), e.to_string()));
            }
        }
        let trusted = TrustedProxies::parse(&cfg.identity.trusted_proxies).unwrap_or_default();
        let share = cfg.identity.dominant_peer_share;
        if !(share > 0.0 && share <= 1.0) {
            errors.push(loaded.error_at(
                &id_at.key("dominant_peer_share"),
                format!("{share} must be in (0, 1]"),
            ));
        }

        // Limits.
        let lim = &cfg.limits;
        let lim_at = root.key("limits");
        if lim.max_connections == 0 {
            errors.push(loaded.error_at(&lim_at.key("max_connections"), "must be at least 1"));
        }
        if lim.max_connections_per_ip == 0 {
            errors
                .push(loaded.error_at(&lim_at.key("max_connections_per_ip"), "must be at least 1"));
        }
        if lim.max_requests_in_flight_per_ip == 0 {
            errors.push(loaded.error_at(
                &lim_at.key("max_requests_in_flight_per_ip"),
                "must be at least 1",
            ));
        }
        if lim.max_header_bytes < MIN_HEADER_BYTES {
            errors.push(loaded.error_at(
                &lim_at.key("max_header_bytes"),
                format!(
                    "{} is below the minimum of {MIN_HEADER_BYTES}",
                    lim.max_header_bytes
                ),
            ));
        }
        if lim.max_headers == 0 {
            errors.push(loaded.error_at(&lim_at.key("max_headers"), "must be at least 1"));
        }

        // Pools.
        let mut pools: Vec<Arc<Pool>> = Vec::new();
        let mut pool_index: HashMap<&str, usize> = HashMap::new();
        for (name, def) in &cfg.pools {
            let reused = previous.and_then(|p| {
                p.pools
                    .iter()
                    .find(|old| &*old.name == name.as_str() && old.definition == *def)
                    .cloned()
            });
            let before =
                previous.and_then(|p| p.pools.iter().find(|old| &*old.name == name.as_str()));
            let pool = match reused {
                Some(p) => p,
                None => match Pool::build(name, def, before.map(|p| &**p)) {
                    Ok(p) => Arc::new(p),
                    Err(errs) => {
                        for (i, e) in errs {
                            let pool_at = root.key("pools").key(name);
                            let at = match e.key() {
                                Some(keys) => keys.iter().fold(pool_at, |at, k| at.key(k)),
                                None if def.servers.is_empty() => pool_at.key("servers"),
                                None => pool_at.key("servers").index(i),
                            };
                            errors.push(loaded.error_at(&at, e.to_string()));
                        }
                        continue;
                    }
                },
            };
            pool_index.insert(name.as_str(), pools.len());
            pools.push(pool);
        }

        // Classes and their rules.
        let mut classes = HashMap::new();
        let mut class_admission = HashMap::new();
        let mut coalescers = HashMap::new();
        let mut rule_defs = Vec::new();
        for (name, c) in &cfg.classes {
            let lane = match c.lane.as_deref() {
                None => Lane::PASS,
                Some(l) => match Lanes::standard().by_name(l) {
                    Some(lane) => lane,
                    None => {
                        errors.push(loaded.error_at(
                            &root.key("classes").key(name).key("lane"),
                            format!("`{l}` is not a lane (verified, pass, anonymous)"),
                        ));
                        Lane::PASS
                    }
                },
            };
            if c.queue_timeout.is_some_and(|t| t.0.is_zero()) {
                errors.push(loaded.error_at(
                    &root.key("classes").key(name).key("queue_timeout"),
                    "must be more than 0s",
                ));
            }
            let max_body = c.coalesce_max_body_bytes.unwrap_or(COALESCE_MAX_BODY);
            if max_body > COALESCE_MAX_BODY_LIMIT {
                errors.push(loaded.error_at(
                    &root.key("classes").key(name).key("coalesce_max_body_bytes"),
                    format!("{max_body} is above the maximum of {COALESCE_MAX_BODY_LIMIT}"),
                ));
            }
            if c.coalesce {
                let coalescer = previous
                    .and_then(|p| p.coalescers.get(name).cloned())
                    .unwrap_or_default();
                coalescers.insert(name.clone(), coalescer);
            }
            class_admission.insert(
                name.clone(),
                ClassAdmission {
                    lane,
                    queue_timeout: c.queue_timeout.map(|d| d.0),
                    coalesce_max_body: c.coalesce.then_some(max_body),
                },
            );
            classes.insert(
                name.clone(),
                ClassSettings {
                    body_read_timeout: c.body_read_timeout.map_or(lim.body_read_timeout.0, |d| d.0),
                    response_timeout: c.response_timeout.map(|d| d.0),
                },
            );
            let at = root.key("classes").key(name).key("rules");
            rule_defs.push((
                name.clone(),
                compile_rules(&loaded, &at, name, &c.rules, &mut errors),
            ));
        }
        let mut names = std::collections::HashSet::new();
        for (_, defs) in &rule_defs {
            for d in defs {
                if !names.insert(d.name.clone()) {
                    errors.push(loaded.error_at(
                        &root.key("classes"),
                        format!(
                            "rule name `{}` is used twice; rule names must be unique",
                            d.name
                        ),
                    ));
                }
            }
        }
        let store_config = StoreConfig::with_max_keys(cfg.rules.max_keys_per_level.max(1024));
        let level_fps: Vec<(RuleFingerprint, StoreConfig)> = rule_defs
            .iter()
            .flat_map(|(_, defs)| defs.iter())
            .flat_map(|d| d.levels.iter().map(|l| (l.fingerprint, store_config)))
            .collect();
        let rule_stores = RuleStores::build(&level_fps, previous.map(|p| &p.rule_stores))
            .unwrap_or_else(|e| {
                errors.push(
                    loaded.error_at(&root.key("rules").key("max_keys_per_level"), e.to_string()),
                );
                RuleStores::default()
            });
        let mut inflight_tables = HashMap::new();
        let mut class_rules: HashMap<String, Arc<[Rule]>> = HashMap::new();
        for (class, defs) in rule_defs {
            let mut compiled = Vec::new();
            for d in defs {
                let body = match d.concurrency {
                    Some((key, max, fp)) => {
                        let table = previous
                            .and_then(|p| p.inflight_tables.get(&fp).cloned())
                            .unwrap_or_default();
                        inflight_tables.insert(fp, table.clone());
                        RuleBody::Concurrency {
                            key,
                            max,
                            table,
                            fingerprint: fp,
                        }
                    }
                    None => RuleBody::Rate(
                        d.levels
                            .into_iter()
                            .filter_map(|l| {
                                let store = rule_stores.by_fingerprint(l.fingerprint)?.clone();
                                Some(RateLevel {
                                    key: l.key,
                                    quota: l.quota,
                                    store,
                                    fingerprint: l.fingerprint,
                                })
                            })
                            .collect(),
                    ),
                };
                compiled.push(Rule {
                    name: Arc::from(d.name.as_str()),
                    body,
                    exempt_verified: d.exempt_verified,
                    shadow: d.shadow,
                    methods: d.methods,
                });
            }
            class_rules.insert(class, Arc::from(compiled));
        }
        let no_rules: Arc<[Rule]> = Arc::from(Vec::new());
        let default_class = ClassSettings {
            body_read_timeout: lim.body_read_timeout.0,
            response_timeout: None,
        };

        // Routes.
        let mut routes = Vec::new();
        if cfg.routes.is_empty() {
            match cfg.pools.len() {
                1 => routes.push(Route {
                    pool: 0,
                    class: RouteClass::new("default"),
                    settings: classes.get("default").copied().unwrap_or(default_class),
                    rules: class_rules
                        .get("default")
                        .cloned()
                        .unwrap_or_else(|| no_rules.clone()),
                    challenge: cfg
                        .classes
                        .get("default")
                        .map(|c| c.challenge)
                        .unwrap_or_default(),
                    host: None,
                    path_prefix: None,
                    path_regex: None,
                    methods: vec![],
                    query_keys: vec![],
                    headers: vec![],
                    cookies: vec![],
                }),
                0 => errors
                    .push(loaded.error_at(&root.key("pools"), "at least one pool is required")),
                _ => errors.push(loaded.error_at(
                    &root.key("routes"),
                    "with several pools, [[routes]] must say which pool serves what",
                )),
            }
        }
        for (i, r) in cfg.routes.iter().enumerate() {
            let at = root.key("routes").index(i);
            let pool = match pool_index.get(r.pool.as_str()) {
                Some(p) => *p,
                None => {
                    if !cfg.pools.contains_key(&r.pool) {
                        let known: Vec<&str> = cfg.pools.keys().map(String::as_str).collect();
                        errors.push(loaded.error_at(
                            &at.key("pool"),
                            format!("no pool named `{}` (pools: {})", r.pool, known.join(", ")),
                        ));
                    }
                    continue;
                }
            };
            let path_regex = match r.path_regex.as_deref().map(regex::Regex::new) {
                None => None,
                Some(Ok(re)) => Some(re),
                Some(Err(e)) => {
                    errors.push(
                        loaded.error_at(&at.key("path_regex"), format!("invalid regex: {e}")),
                    );
                    None
                }
            };
            let mut methods = Vec::new();
            for (j, m) in r.methods.iter().enumerate() {
                match http::Method::from_bytes(m.to_ascii_uppercase().as_bytes()) {
                    Ok(m) => methods.push(m),
                    Err(_) => errors.push(loaded.error_at(
                        &at.key("methods").index(j),
                        format!("`{m}` is not an HTTP method"),
                    )),
                }
            }
            let mut headers = Vec::new();
            for (j, h) in r.headers.iter().enumerate() {
                match http::HeaderName::from_bytes(h.to_ascii_lowercase().as_bytes()) {
                    Ok(h) => headers.push(h),
                    Err(_) => errors.push(loaded.error_at(
                        &at.key("headers").index(j),
                        format!("`{h}` is not a header name"),
                    )),
                }
            }
            if r.class.is_empty() {
                errors.push(loaded.error_at(&at.key("class"), "must not be empty"));
            }
            let settings = classes.get(&r.class).copied().unwrap_or(default_class);
            routes.push(Route {
                pool,
                class: RouteClass::new(&r.class),
                settings,
                rules: class_rules
                    .get(&r.class)
                    .cloned()
                    .unwrap_or_else(|| no_rules.clone()),
                challenge: cfg
                    .classes
                    .get(&r.class)
                    .map(|c| c.challenge)
                    .unwrap_or_default(),
                host: r.host.as_deref().map(HostMatch::parse),
                path_prefix: r.path_prefix.clone(),
                path_regex,
                methods,
                query_keys: r.query_keys.clone(),
                headers,
                cookies: r.cookies.clone(),
            });
        }

        let sessions = match previous {
            // Unchanged: keep the verifier and its cache of answers.
            Some(p) if p.loaded.config.sessions == cfg.sessions => p.sessions.clone(),
            _ => build_sessions(&loaded, &pools, &mut errors),
        };
        let challenger = match &cfg.challenge {
            None => {
                for (name, c) in &cfg.classes {
                    if c.challenge != crate::challenge::ChallengeMode::Off {
                        errors.push(loaded.error_at(
                            &root.key("classes").key(name).key("challenge"),
                            "needs a [challenge] section (at least `keys`)",
                        ));
                    }
                }
                None
            }
            Some(c) => match crate::challenge::Challenger::new(c) {
                Ok(ch) => Some(Arc::new(ch)),
                Err(e) => {
                    errors.push(loaded.error_at(&root.key("challenge"), e.to_string()));
                    None
                }
            },
        };
        let low_rate = match Quota::new(
            cfg.rules.low_rate_per_minute.max(1),
            Duration::from_secs(60),
            cfg.rules.low_rate_per_minute.max(1),
        ) {
            Ok(q) => Some(q),
            Err(e) => {
                errors.push(
                    loaded.error_at(&root.key("rules").key("low_rate_per_minute"), e.to_string()),
                );
                None
            }
        };
        let (true, Some(low_rate)) = (errors.is_empty(), low_rate) else {
            return Err(ConfigErrors(errors));
        };
        let dominance = Arc::new(DominantPeerDetector::new(
            cfg.identity.dominant_peer_window.0,
            share,
            cfg.identity.dominant_peer_min_requests,
        ));
        Ok(Gateway {
            version,
            listeners,
            routes: RouteTable { routes },
            pools,
            classes,
            client_header: match cfg.identity.client_header {
                ClientHeader::XForwardedFor => ForwardedHeader::XForwardedFor,
                ClientHeader::Forwarded => ForwardedHeader::Forwarded,
            },
            trusted,
            path_policy: PathPolicy {
                keep_encoded_slash: lim.allow_encoded_slash,
            },
            forwarding: ForwardingHeaders::new(cfg.forwarding.clone()),
            edge: EdgeSettings {
                conn: ConnLimits {
                    max_connections: lim.max_connections,
                    max_per_ip: lim.max_connections_per_ip,
                    header_timeout: lim.header_read_timeout.0,
                    idle_timeout: lim.keepalive_idle_timeout.0,
                },
                max_in_flight_per_ip: lim.max_requests_in_flight_per_ip,
                handshake_timeout: lim.handshake_timeout.0,
                max_header_bytes: lim.max_header_bytes,
                max_headers: lim.max_headers,
            },
            dominance,
            admin_address,
            drain_timeout: cfg.process.drain_timeout.0,
            rule_stores,
            inflight_tables,
            rules_shadow: cfg.rules.shadow,
            rejection: cfg.rejection.clone(),
            low_rate,
            sessions,
            challenger,
            class_admission,
            coalescers,
            loaded,
        })
    }
}

/// Builds the session verifier from `[sessions]`, or `None` when neither
/// method is configured.
fn build_sessions(
    loaded: &LoadedConfig,
    pools: &[Arc<Pool>],
    errors: &mut Vec<ConfigError>,
) -> Option<Arc<SessionVerifier>> {
    let cfg = &loaded.config.sessions;
    let at = KeyPath::root().key("sessions");
    let before = errors.len();
    let signed = cfg.signed_cookie.as_ref().and_then(|s| {
        let at = at.key("signed_cookie");
        if s.cookie.trim().is_empty() {
            errors.push(loaded.error_at(&at.key("cookie"), "a cookie name is required"));
        }
        match SigningKeys::new(&s.keys) {
            Ok(keys) => Some(SignedCookie::new(&s.cookie, keys)),
            Err(e) => {
                errors.push(loaded.error_at(&at.key("keys"), e.to_string()));
                None
            }
        }
    });
    let subrequest = cfg.auth_subrequest.as_ref().and_then(|a| {
        let at = at.key("auth_subrequest");
        let Some(server) = pools
            .iter()
            .find(|p| &*p.name == a.pool.as_str())
            .and_then(|p| p.servers.first())
        else {
            errors.push(loaded.error_at(&at.key("pool"), format!("no pool named `{}`", a.pool)));
            return None;
        };
        let cookies: Vec<&str> = a.cookies.iter().map(String::as_str).collect();
        let mut c = AuthSubrequestConfig::new(server.addr, &cookies);
        c.path = a.path.clone();
        c.user_header = match a
            .user_header
            .as_deref()
            .map(|h| http::HeaderName::from_bytes(h.to_ascii_lowercase().as_bytes()))
        {
            None => None,
            Some(Ok(h)) => Some(h),
            Some(Err(_)) => {
                errors.push(loaded.error_at(&at.key("user_header"), "not a header name"));
                None
            }
        };
        c.timeout = a.timeout.0;
        c.verified_ttl = a.verified_ttl.0;
        c.denied_ttl = a.denied_ttl.0;
        c.unknown_ttl = a.unknown_ttl.0;
        c.max_entries = a.max_entries;
        c.max_in_flight = a.max_in_flight;
        match AuthSubrequest::new(c, Arc::new(weir_limiter::MonotonicClock)) {
            Ok(s) => Some(s),
            Err(e) => {
                errors.push(loaded.error_at(&at, e.to_string()));
                None
            }
        }
    });
    if errors.len() > before || (signed.is_none() && subrequest.is_none()) {
        return None;
    }
    Some(Arc::new(SessionVerifier::new(
        signed,
        subrequest,
        Arc::new(SystemWallClock),
    )))
}

/// A rule as validated, before its state is attached.
struct RuleDef {
    name: String,
    levels: Vec<LevelDef>,
    concurrency: Option<(KeyKind, u32, RuleFingerprint)>,
    exempt_verified: bool,
    shadow: bool,
    methods: Vec<http::Method>,
}

struct LevelDef {
    key: KeyKind,
    quota: Quota,
    fingerprint: RuleFingerprint,
}

/// Longest window a rate level may have: a day (state is kept in memory and
/// snapshots; longer windows belong in the application).
const MAX_WINDOW: Duration = Duration::from_secs(86_400);

fn compile_rules(
    loaded: &LoadedConfig,
    at: &KeyPath,
    class: &str,
    defs: &[crate::config::RuleConfig],
    errors: &mut Vec<ConfigError>,
) -> Vec<RuleDef> {
    use crate::config::RuleKind;
    let mut out = Vec::new();
    for (i, d) in defs.iter().enumerate() {
        let at = at.index(i);
        let before = errors.len();
        if d.name.trim().is_empty() {
            errors.push(loaded.error_at(&at.key("name"), "a rule needs a name"));
        }
        let mut exempt_verified = false;
        for (j, e) in d.exempt.iter().enumerate() {
            match e.as_str() {
                "verified" => exempt_verified = true,
                other => errors.push(loaded.error_at(
                    &at.key("exempt").index(j),
                    format!(
                        "`{other}` cannot exempt: only `verified` sessions can (a cookie's name or presence proves nothing; any visitor can get one)"
                    ),
                )),
            }
        }
        let mut methods = Vec::new();
        for (j, m) in d.methods.iter().enumerate() {
            match http::Method::from_bytes(m.to_ascii_uppercase().as_bytes()) {
                Ok(m) => methods.push(m),
                Err(_) => errors.push(loaded.error_at(
                    &at.key("methods").index(j),
                    format!("`{m}` is not an HTTP method"),
                )),
            }
        }
        let mut levels = Vec::new();
        let mut concurrency = None;
        match d.kind {
            RuleKind::Rate => {
                if d.limits.is_empty() {
                    errors.push(loaded.error_at(
                        &at.key("limits"),
                        "a rate rule needs at least one entry in `limits`",
                    ));
                }
                if d.limits.len() > rules::MAX_LEVELS {
                    errors.push(loaded.error_at(
                        &at.key("limits"),
                        format!("at most {} levels per rule", rules::MAX_LEVELS),
                    ));
                }
                if d.per.is_some() || d.max.is_some() {
                    errors.push(loaded.error_at(
                        &at.key("type"),
                        "`per` and `max` belong to concurrency rules; rate rules use `limits`",
                    ));
                }
                for (j, l) in d.limits.iter().enumerate() {
                    let lat = at.key("limits").index(j);
                    let key = match KeyKind::parse(&l.per) {
                        Ok(k) => k,
                        Err(e) => {
                            errors.push(loaded.error_at(&lat.key("per"), e));
                            continue;
                        }
                    };
                    if l.window.0 > MAX_WINDOW {
                        errors.push(loaded.error_at(
                            &lat.key("window"),
                            format!("{:?} is longer than a day", l.window),
                        ));
                        continue;
                    }
                    let burst = l.burst.unwrap_or(l.rate);
                    match Quota::new(l.rate, l.window.0, burst) {
                        Ok(quota) => levels.push(LevelDef {
                            fingerprint: rules::fingerprint(&[
                                class,
                                &d.name,
                                &l.per,
                                &l.rate.to_string(),
                                &l.window.0.as_nanos().to_string(),
                                &burst.to_string(),
                            ]),
                            key,
                            quota,
                        }),
                        Err(e) => errors.push(loaded.error_at(&lat, e.to_string())),
                    }
                }
            }
            RuleKind::Concurrency => {
                if !d.limits.is_empty() {
                    errors.push(loaded.error_at(
                        &at.key("limits"),
                        "concurrency rules use `per` and `max`, not `limits`",
                    ));
                }
                match (&d.per, d.max) {
                    (Some(per), Some(max)) if max > 0 => match KeyKind::parse(per) {
                        Ok(k) => {
                            concurrency = Some((
                                k,
                                max,
                                rules::fingerprint(&[class, &d.name, per, "concurrency"]),
                            ))
                        }
                        Err(e) => errors.push(loaded.error_at(&at.key("per"), e)),
                    },
                    (_, Some(0)) => {
                        errors.push(loaded.error_at(&at.key("max"), "must be at least 1"))
                    }
                    _ => errors
                        .push(loaded.error_at(&at, "a concurrency rule needs `per` and `max`")),
                }
            }
        }
        if errors.len() == before {
            out.push(RuleDef {
                name: d.name.clone(),
                levels,
                concurrency,
                exempt_verified,
                shadow: d.shadow,
                methods,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_str;
    use std::collections::HashMap as Map;
    use std::path::Path;

    fn build(text: &str) -> Result<Gateway, ConfigErrors> {
        let loaded = load_str(
            text,
            Some(Path::new("weir.toml")),
            &Map::<String, String>::new(),
        )?;
        Gateway::build(loaded, None, 1)
    }

    #[test]
    fn minimal_config_gets_a_default_route() {
        let g = build("[[listeners]]\naddress = \"127.0.0.1:0\"\n[pools.app]\nservers = [\"127.0.0.1:9000\"]\n").unwrap();
        assert_eq!(g.routes.routes.len(), 1);
        assert_eq!(g.routes.routes[0].class.as_str(), "default");
        assert_eq!(g.edge.conn.max_per_ip, 256);
    }

    #[test]
    fn every_problem_is_reported_with_line_and_key() {
        let text = r#"[[listeners]]
address = "nope"

[identity]
trusted_proxies = ["10.0.0.0/8", "banana"]

[pools.app]
servers = ["127.0.0.1:9000"]

[[routes]]
pool = "ap"
class = "page"

[[routes]]
pool = "app"
path_regex = "(unclosed"
methods = ["GET", "G E T"]
"#;
        let errs = build(text).unwrap_err();
        let lines: Vec<String> = errs.0.iter().map(|e| e.to_string()).collect();
        let want = [
            "weir.toml:2: listeners[0].address: `nope` is not ip:port",
            "weir.toml:5: identity.trusted_proxies[1]: ",
            "weir.toml:11: routes[0].pool: no pool named `ap` (pools: app)",
            "weir.toml:16: routes[1].path_regex: invalid regex",
            "weir.toml:17: routes[1].methods[1]: `G E T` is not an HTTP method",
        ];
        assert_eq!(lines.len(), want.len(), "{lines:#?}");
        for (got, want) in lines.iter().zip(want) {
            assert!(got.starts_with(want), "got {got:?}, want prefix {want:?}");
        }
    }

    #[test]
    fn unchanged_pools_are_reused_on_reload() {
        let text = "[[listeners]]\naddress = \"127.0.0.1:0\"\n[pools.a]\nservers = [\"127.0.0.1:1\"]\n[pools.b]\nservers = [\"127.0.0.1:2\"]\n[[routes]]\npool = \"a\"\n";
        let first = build(text).unwrap();
        let changed = text.replace("127.0.0.1:2", "127.0.0.1:3");
        let loaded = load_str(&changed, None, &Map::<String, String>::new()).unwrap();
        let second = Gateway::build(loaded, Some(&first), 2).unwrap();
        assert!(Arc::ptr_eq(&first.pools[0], &second.pools[0]));
        assert!(!Arc::ptr_eq(&first.pools[1], &second.pools[1]));
    }

    #[test]
    fn coalescing_is_per_class_opt_in_and_survives_reloads() {
        use crate::admission::{CoalesceKey, Role};
        let text = "[[listeners]]\naddress = \"127.0.0.1:0\"\n[pools.app]\nservers = [\"127.0.0.1:1\"]\n[classes.page]\ncoalesce = true\n[classes.search]\nlane = \"anonymous\"\n[classes.big]\ncoalesce = true\ncoalesce_max_body_bytes = 10\n";
        let first = build(text).unwrap();
        let max = |g: &Gateway, c: &str| g.class_admission[c].coalesce_max_body;
        assert_eq!(max(&first, "page"), Some(1 << 20));
        assert_eq!(max(&first, "search"), None);
        assert_eq!(max(&first, "big"), Some(10));
        assert!(!first.coalescers.contains_key("search"));
        // A leader in flight across a reload is still found by the new gateway.
        let target = weir_http::target::Target::parse(
            "GET",
            "/",
            Some("wiki.example"),
            PathPolicy::default(),
        )
        .unwrap();
        let key = || CoalesceKey::for_request(&target, &http::HeaderMap::new());
        let lead = first.coalescers["page"].join(key().unwrap());
        assert!(matches!(lead, Role::Leader(_)));
        let loaded = load_str(text, None, &Map::<String, String>::new()).unwrap();
        let second = Gateway::build(loaded, Some(&first), 2).unwrap();
        assert!(matches!(
            second.coalescers["page"].join(key().unwrap()),
            Role::Follower(_)
        ));
        drop(lead);

        let errs = build(&text.replace("= 10\n", "= 1000000000\n")).unwrap_err();
        assert!(
            errs.0[0]
                .to_string()
                .contains("classes.big.coalesce_max_body_bytes: 1000000000 is above"),
            "{errs}"
        );
    }
}
