//! The gateway: a validated configuration compiled into runtime values.
//!
//! A [`Gateway`] is immutable. A reload builds a new one and swaps it in
//! atomically; requests already running keep the one they started with. Pools
//! whose definition did not change are carried over, with their warm
//! connections and state.

mod bots;
mod classes;
mod edge;
mod pools;
pub mod process;
mod routes;
mod sessions;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::admin::guard::AdminGuard;
use crate::admission::{Coalescer, Lane, Shape};
use crate::config::{ClientHeader, ConfigError, ConfigErrors, IdentityConfig, LoadedConfig};
use crate::edge::{EdgeSettings, ListenerSpec};
use crate::identity::TrustedProxies;
use crate::identity::dominance::DominantPeerDetector;
use crate::identity::forwarded::ForwardedHeader;
use crate::identity::session::SessionVerifier;
use crate::policy::RouteTable;
use crate::policy::route::ClassSettings;
use crate::upstream::{ForwardingHeaders, Pool};
use weir_http::target::PathPolicy;
use weir_limiter::{InflightTable, Quota, RuleFingerprint, RuleStores};

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
    /// Who may change weir through the admin API (`[admin] token`, `hosts`).
    pub admin_guard: AdminGuard,
    /// Settings that run but expose or trust too much: printed by `weir
    /// check`, logged at start and on reload.
    pub warnings: Vec<ConfigError>,
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
    /// The visit cookie (`[visit]`), unless switched off.
    pub visits: Option<Arc<crate::visit::Visits>>,
    /// Crawlers that may prove who they are (`[bots]`), if configured.
    pub bots: Option<Arc<crate::identity::bots::BotVerifier>>,
    /// Admission lane and queue deadline per route class (classes not
    /// listed use [`ClassAdmission::default`]).
    pub class_admission: ByClass<ClassAdmission>,
    /// In-flight leaders of each class with `coalesce = true`; carried
    /// across reloads so a reload does not split a group in flight.
    pub coalescers: ByClass<Coalescer>,
}

/// A map by class name, looked up on every request: foldhash instead of
/// SipHash (~400 instructions a lookup, two lookups a request; the names are
/// the configuration's, so no client chooses what is hashed).
pub type ByClass<V> = HashMap<String, V, foldhash::fast::RandomState>;

/// How a route class waits in its pool's admission queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassAdmission {
    /// Lane of anonymous requests (verified sessions always use the top
    /// one). `None` (no `lane` configured): `newcomers` (which a visit weir
    /// counted lifts to `pass`), or `anonymous` for a request whose shape
    /// the pool learned is expensive ([`crate::admission::shapes`]).
    pub lane: Option<Lane>,
    /// Deadline in the queue; `None` uses the pool's `queue_timeout`.
    pub queue_timeout: Option<Duration>,
    /// Request coalescing: the largest body shared, or `None` (off).
    pub coalesce_max_body: Option<usize>,
}

impl ClassAdmission {
    /// The lane of the class's unproven requests: its configured one, or
    /// what `queue` learned: expensive shapes wait in the `anonymous` lane,
    /// so cheap pages (in `newcomers`, or `pass` in a visit) pass them.
    pub fn unproven_lane(&self, queue: &crate::admission::AdmissionQueue, shape: Shape) -> Lane {
        self.lane.unwrap_or_else(|| {
            if queue.shapes().is_expensive(shape) {
                Lane::ANONYMOUS
            } else {
                Lane::NEWCOMERS
            }
        })
    }
}

impl Default for ClassAdmission {
    /// No configured lane: `newcomers` for cheap pages, `anonymous` for
    /// shapes learned expensive.
    fn default() -> Self {
        ClassAdmission {
            lane: None,
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

impl Gateway {
    /// Compiles `loaded`, collecting every problem. Pools identical to one in
    /// `previous` are reused.
    pub fn build(
        loaded: LoadedConfig,
        previous: Option<&Gateway>,
        version: u64,
    ) -> Result<Gateway, ConfigErrors> {
        let mut errors: Vec<ConfigError> = Vec::new();
        let e = &mut errors;
        // One compile step per stage, in the request's order; each collects
        // its problems and goes on, so one run reports them all.
        let listeners = edge::listeners(&loaded, e);
        let (admin_address, admin_guard) = edge::admin(&loaded, e);
        process::addresses(&loaded, &listeners, admin_address, e);
        process::state(&loaded, e);
        let (trusted, share) = edge::identity(&loaded, e);
        let edge = edge::limits(&loaded, e);
        let (pools, pool_index) = pools::pools(&loaded, previous, e);
        let classes = classes::classes(&loaded, previous, e);
        let routes = routes::routes(&loaded, &pool_index, &classes, e);
        let sessions = sessions::sessions(&loaded, previous, &pools, e);
        let challenger = sessions::challenger(&loaded, e);
        let visits = sessions::visits(&loaded, e);
        let bots = bots::bots(&loaded, e);
        let low_rate = sessions::low_rate(&loaded, e);
        drop(pool_index);
        let cfg = &loaded.config;
        let (true, Some(low_rate)) = (errors.is_empty(), low_rate) else {
            return Err(ConfigErrors(errors));
        };
        Ok(Gateway {
            version,
            listeners,
            routes: RouteTable { routes },
            pools,
            classes: classes.settings,
            client_header: forwarded_header(cfg.identity.client_header),
            trusted,
            path_policy: PathPolicy {
                keep_encoded_slash: cfg.limits.allow_encoded_slash,
            },
            forwarding: ForwardingHeaders::new(cfg.forwarding.clone()),
            edge,
            dominance: dominant_peer_detector(&cfg.identity, share),
            admin_address,
            admin_guard,
            warnings: process::warnings(&loaded, admin_address),
            drain_timeout: cfg.process.drain_timeout.0,
            rule_stores: classes.rule_stores,
            inflight_tables: classes.inflight_tables,
            rules_shadow: cfg.rules.shadow,
            rejection: cfg.rejection.clone(),
            low_rate,
            sessions,
            challenger,
            visits,
            bots,
            class_admission: classes.admission,
            coalescers: classes.coalescers,
            loaded,
        })
    }
}

/// The forwarding header weir reads the client from, as configured.
fn forwarded_header(h: ClientHeader) -> ForwardedHeader {
    match h {
        ClientHeader::XForwardedFor => ForwardedHeader::XForwardedFor,
        ClientHeader::Forwarded => ForwardedHeader::Forwarded,
    }
}

/// The detector of one peer sending a dominant `share` of requests, over
/// the configured window.
fn dominant_peer_detector(identity: &IdentityConfig, share: f64) -> Arc<DominantPeerDetector> {
    Arc::new(DominantPeerDetector::new(
        identity.dominant_peer_window.0,
        share,
        identity.dominant_peer_min_requests,
    ))
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
