//! GCRA state in Redis, so several weir instances share one set of limits.
//!
//! Each key's state is one Redis string, its TAT in nanoseconds since the Unix
//! epoch, under `{prefix}{label}:{rule fingerprint:016x}:{key:016x}`: the
//! label says which rule and level a key counts for (`weir:anon-expensive:subnet:...`,
//! [`key_label`]), the fingerprint keeps a changed definition's state apart
//! from the old one's, and the key is the same `u64` the local
//! [`ShardedStore`](super::ShardedStore) holds (an address or a prefix is not
//! written out: a digest is what the logs show for header and cookie keys too). One Lua script
//! (`redis/gcra.lua`, sent by `EVALSHA`, by `EVAL` when the server answers
//! `NOSCRIPT`) decides every rule of a request at once, all or nothing: if any
//! rule rejects, no rule is charged. Its arithmetic is [`Quota::check`]'s
//! (same `T`, `τ`, cost, `remaining`, `reset`, `retry_after`), on the Redis
//! server's clock (`TIME`), so instances whose clocks disagree still agree on
//! every decision. Each write sets `PX` to the key's TAT: a key expires when
//! its state stops mattering, so Redis holds only live keys (PostHog's Redis,
//! shared with the main app, ran out of memory: incident 4).
//!
//! The prefix is given once, to [`RedisLimiter::new`], and every key name and
//! every `SCAN` pattern is built from it by the same function, so state cannot
//! be written under one name and looked for under another (incident 2: the
//! new server's counters were written with a path prefix and listed without).
//!
//! [`RedisLimiter::new`] never waits for Redis: it returns at once and the
//! connection is made in the background (incident 4: pool creation slower
//! than the start-up timeout crash-looped pods). Every command is bounded by
//! [`RedisTimeouts::command`] (50 ms by default): a limiter must not add much
//! latency, and a slow Redis is treated like an unreachable one.
//!
//! [`RedisLimiter::probe`] also runs the script, on the key `{prefix}probe`
//! (it expires 1 ms after each probe).
//!
//! This module decides nothing when Redis fails: it returns the error. Falling
//! back to local state, counting and logging outages and probing for recovery
//! are [`super::shared`]'s.
//!
//! On a Redis Cluster ([`RedisLimiter::with_cluster`]) the rule's name in
//! each key is a hash tag (`{prefix}{rule}:level:...`): one script call
//! decides the levels of one rule, so its keys share a slot, and different
//! rules spread over the cluster's primaries. A rule's keys all live on
//! one primary: a rule hot enough to load one node is a rule to split.
//!
//! With Sentinel ([`RedisLimiter::with_sentinel`]) the primary is whatever
//! the sentinels name: asked before the first probe and again after each
//! failed one, so a failover (the old primary gone, or back as a read-only
//! replica) costs the decisions taken locally until the sentinels have
//! promoted another and one probe has reached it.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, ErrorKind, RedisError, RedisFuture, ServerErrorKind, Value};

use super::gcra::{Outcome, Quota};
use super::store::RuleFingerprint;

#[cfg(test)]
pub(crate) mod testing;

/// The script; its SHA-1 is what `EVALSHA` names.
const GCRA_SCRIPT: &str = include_str!("redis/gcra.lua");

/// With one URL, after this many failed probes in a row the connection is
/// rebuilt, in case it is wedged (a half-open socket) while Redis is fine.
pub const RESET_AFTER_FAILED_PROBES: u32 = 3;

/// Longest key prefix accepted: a prefix is a namespace, not data.
pub const MAX_PREFIX_BYTES: usize = 128;

/// Keys asked for per `SCAN` page when counting.
const SCAN_PAGE: usize = 1000;

/// How long Redis operations may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisTimeouts {
    /// One connection attempt (TCP connect and handshake).
    pub connect: Duration,
    /// One decision's round trip on the request path. When it passes, the
    /// caller decides without Redis; keep it a small part of a request's
    /// latency budget.
    pub command: Duration,
    /// One command off the request path: a probe, a `SCAN` page.
    pub admin: Duration,
    /// How often [`super::shared::SharedLimiter`] probes a Redis it cannot
    /// reach, to go back to shared limits when it returns.
    pub probe_interval: Duration,
}

impl Default for RedisTimeouts {
    fn default() -> RedisTimeouts {
        RedisTimeouts {
            connect: Duration::from_secs(1),
            command: Duration::from_millis(50),
            admin: Duration::from_secs(1),
            probe_interval: Duration::from_millis(250),
        }
    }
}

/// One rule a request must pass: the rule, the request's key for it (as the
/// local store keys it), the rule's quota and the request's cost.
#[derive(Debug, Clone, Copy)]
pub struct RuleCheck<'q> {
    pub rule: RuleFingerprint,
    /// The readable part of the rule's key names ([`key_label`]); empty for
    /// none.
    pub label: &'q str,
    pub key: u64,
    pub quota: &'q Quota,
    pub cost: u32,
}

/// A Redis limiter that cannot be built; messages name the bad input.
#[derive(Debug, thiserror::Error)]
pub enum RedisSetupError {
    #[error("redis URL {url} is not valid: {source}")]
    BadUrl {
        /// The URL with any password replaced by `***`.
        url: String,
        #[source]
        source: RedisError,
    },
    #[error(
        "redis key prefix is empty: give one (e.g. \"weir:\") so weir's keys cannot collide with the app's"
    )]
    EmptyPrefix,
    #[error("redis key prefix {prefix:?} is {len} bytes, more than {MAX_PREFIX_BYTES}")]
    PrefixTooLong { prefix: String, len: usize },
    #[error("redis connection cannot be set up: {0}")]
    Connection(#[source] RedisError),
    #[error("redis CA file {path}: {source}")]
    CaFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("redis CA certificates are not usable: {0}")]
    BadCa(#[source] RedisError),
    #[error(
        "the redis limiter must be created inside a tokio runtime (it connects in the background)"
    )]
    NoRuntime,
    #[error("redis sentinel nodes are empty: name at least one (three, for a quorum)")]
    NoSentinels,
    #[error("redis sentinel master name is empty: give the name of `sentinel monitor NAME ...`")]
    NoSentinelMaster,
    #[error("redis cluster nodes are empty: name at least one of the cluster's nodes")]
    NoClusterNodes,
}

/// What `rediss://` trusts beyond the system's root certificates.
#[derive(Clone, Default)]
pub struct RedisTls {
    /// PEM CA certificates to trust instead of the system's roots (a
    /// private CA, as managed Redis services and self-hosted ones use).
    pub ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca_pem_bytes", &self.ca_pem.as_ref().map(Vec::len))
            .finish()
    }
}

impl RedisTls {
    /// The trust `[state] redis_ca_file` asks for: the system's roots when
    /// unset, else the file's CA certificates.
    pub fn from_config(ca_file: Option<&std::path::Path>) -> Result<RedisTls, RedisSetupError> {
        ca_file.map_or(Ok(RedisTls::default()), RedisTls::from_ca_file)
    }

    /// Trust the CA certificates in the PEM file at `path`.
    pub fn from_ca_file(path: &std::path::Path) -> Result<RedisTls, RedisSetupError> {
        let pem = std::fs::read(path).map_err(|source| RedisSetupError::CaFile {
            path: path.display().to_string(),
            source,
        })?;
        Ok(RedisTls { ca_pem: Some(pem) })
    }
}

/// Checks a URL and key prefix as [`RedisLimiter::new`] does, without
/// connecting (what `weir check` can know): a URL the client cannot use,
/// an empty or long prefix.
pub fn check_settings(url: &str, prefix: &str) -> Result<redis::Client, RedisSetupError> {
    check_settings_with(url, prefix, &RedisTls::default())
}

/// [`check_settings`] with TLS trust for `rediss://` (a CA that does not
/// parse is an error here, not at the first connection).
pub fn check_settings_with(
    url: &str,
    prefix: &str,
    tls: &RedisTls,
) -> Result<redis::Client, RedisSetupError> {
    check_prefix(prefix)?;
    let bad_url = |source| RedisSetupError::BadUrl {
        url: redact_url(url),
        source,
    };
    let Some(ca) = &tls.ca_pem else {
        return redis::Client::open(url).map_err(bad_url);
    };
    // Parsed first, so a bad URL is named as one and not as a bad CA.
    let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(bad_url)?;
    let certs = redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(ca.clone()),
    };
    redis::Client::build_with_tls(info, certs).map_err(RedisSetupError::BadCa)
}

/// Checks Sentinel settings as [`RedisLimiter::with_sentinel`] does, without
/// connecting: at least one node, every one a usable address, a master name,
/// a prefix as for [`check_settings`].
pub fn check_sentinel_settings(
    settings: &SentinelSettings,
    prefix: &str,
) -> Result<redis::sentinel::Sentinel, RedisSetupError> {
    check_prefix(prefix)?;
    if settings.nodes.is_empty() {
        return Err(RedisSetupError::NoSentinels);
    }
    if settings.master.is_empty() {
        return Err(RedisSetupError::NoSentinelMaster);
    }
    for url in settings.urls() {
        redis::IntoConnectionInfo::into_connection_info(url.as_str()).map_err(|source| {
            RedisSetupError::BadUrl {
                url: redact_url(&url),
                source,
            }
        })?;
    }
    redis::sentinel::Sentinel::build(settings.urls()).map_err(|source| RedisSetupError::BadUrl {
        // A node's URL may carry the sentinels' password.
        url: (settings.urls().iter().map(|u| redact_url(u)))
            .collect::<Vec<_>>()
            .join(","),
        source,
    })
}

/// How to reach the primary the sentinels of `settings` name: its
/// database and password.
pub fn sentinel_node(settings: &SentinelSettings) -> redis::sentinel::SentinelNodeConnectionInfo {
    let redis_info = redis::RedisConnectionInfo::default().set_db(settings.db);
    let redis_info = match &settings.password {
        Some(p) => redis_info.set_password(p.clone()),
        None => redis_info,
    };
    redis::sentinel::SentinelNodeConnectionInfo::default().set_redis_connection_info(redis_info)
}

/// Checks cluster settings as [`RedisLimiter::with_cluster`] does, without
/// connecting: at least one node, every one a usable address, a prefix as
/// for [`check_settings`].
pub fn check_cluster_settings(
    nodes: &[String],
    prefix: &str,
    timeouts: RedisTimeouts,
) -> Result<redis::cluster::ClusterClient, RedisSetupError> {
    check_prefix(prefix)?;
    if nodes.is_empty() {
        return Err(RedisSetupError::NoClusterNodes);
    }
    let urls = node_urls(nodes);
    let shown = || {
        urls.iter()
            .map(|u| redact_url(u))
            .collect::<Vec<_>>()
            .join(",")
    };
    for url in &urls {
        redis::IntoConnectionInfo::into_connection_info(url.as_str()).map_err(|source| {
            RedisSetupError::BadUrl {
                url: redact_url(url),
                source,
            }
        })?;
    }
    // Few, quick attempts, as for one primary (`unconnected`): an outage
    // is decided locally and probed, not waited out.
    redis::cluster::ClusterClient::builder(urls.clone())
        .connection_timeout(timeouts.connect)
        .response_timeout(timeouts.command)
        .retries(1)
        .build()
        .map_err(|source| RedisSetupError::BadUrl {
            url: shown(),
            source,
        })
}

fn check_prefix(prefix: &str) -> Result<(), RedisSetupError> {
    if prefix.is_empty() {
        return Err(RedisSetupError::EmptyPrefix);
    }
    if prefix.len() > MAX_PREFIX_BYTES {
        return Err(RedisSetupError::PrefixTooLong {
            prefix: prefix.to_owned(),
            len: prefix.len(),
        });
    }
    Ok(())
}

/// A Redis operation that did not produce an answer.
#[derive(Debug, thiserror::Error)]
pub enum RedisCheckError {
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("redis command failed: {0}")]
    Redis(#[from] RedisError),
    #[error("redis GCRA script returned {got} values for {checks} checks (expected 4 each)")]
    UnexpectedReply { got: usize, checks: usize },
    #[error("redis sentinels have not named a primary yet")]
    NoPrimary,
    #[error("keys are not counted on a Redis Cluster")]
    NotOnACluster,
}

/// Where the primary is: one URL, or wherever the sentinels say; or a
/// cluster's primaries, each key's where its slot is.
enum Primary {
    Fixed(redis::Client),
    Sentinel(SentinelSource),
    Cluster(redis::cluster::ClusterClient),
}

/// A connection to one primary (reconnecting by itself), or to a cluster
/// (routing each command by its keys' slot, following `MOVED`).
#[derive(Clone)]
enum Link {
    One(ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Link::One(c) => c.req_packed_command(cmd),
            Link::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Link::One(c) => c.req_packed_commands(pipeline, offset, count),
            Link::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::One(c) => c.get_db(),
            Link::Cluster(c) => c.get_db(),
        }
    }
}

/// The sentinels of one monitored primary, and how to reach what they name.
struct SentinelSource {
    /// `async_master_for` takes `&mut`; asked off the request path only.
    sentinel: tokio::sync::Mutex<redis::sentinel::Sentinel>,
    master: String,
    node: redis::sentinel::SentinelNodeConnectionInfo,
}

/// The sentinels to ask for the primary: [`RedisLimiter::with_sentinel`].
/// Its `Debug` shows no password (the primary's, or one in a node's URL).
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelSettings {
    /// Sentinel addresses (`host:port`) or URLs (`redis://[:password@]host:port`).
    pub nodes: Vec<String>,
    /// The name the sentinels monitor the primary as (`sentinel monitor NAME ...`).
    pub master: String,
    /// The database on the primary.
    pub db: i64,
    /// The primary's password, if it has one (the sentinels' own goes in
    /// their URLs).
    pub password: Option<String>,
}

impl std::fmt::Debug for SentinelSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<String> = self.nodes.iter().map(|n| redact_url(n)).collect();
        f.debug_struct("SentinelSettings")
            .field("nodes", &nodes)
            .field("master", &self.master)
            .field("db", &self.db)
            .field("password", &self.password.as_ref().map(|_| "[redacted]"))
            .finish()
    }
}

impl SentinelSettings {
    /// The nodes as URLs the client accepts.
    fn urls(&self) -> Vec<String> {
        node_urls(&self.nodes)
    }
}

/// Nodes given as `host:port` or as URLs, as URLs the client accepts.
fn node_urls(nodes: &[String]) -> Vec<String> {
    nodes
        .iter()
        .map(|n| {
            if n.contains("://") {
                n.clone()
            } else {
                format!("redis://{n}")
            }
        })
        .collect()
}

/// GCRA decisions made in Redis; shared by every instance using the same
/// Redis and prefix.
pub struct RedisLimiter {
    primary: Primary,
    config: ConnectionManagerConfig,
    /// Swapped for a fresh manager by [`Self::recover_connection`] when the
    /// current one stays broken (a half-open socket, a failed handshake that
    /// the manager does not retry) or the sentinels name another primary;
    /// `None` until the sentinels have named one, or a cluster has
    /// answered.
    connection: ArcSwap<Option<Link>>,
    prefix: String,
    url: String,
    timeouts: RedisTimeouts,
    script_sha: String,
    runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("url", &self.url)
            .field("prefix", &self.prefix)
            .field("timeouts", &self.timeouts)
            .finish_non_exhaustive()
    }
}

impl RedisLimiter {
    /// Prepares a limiter for the Redis at `url` (`redis://[user:pass@]host:port/db`)
    /// with every key under `prefix`. Returns at once, without connecting:
    /// the first command (or [`Self::probe`]) connects, in the background of
    /// the caller's tokio runtime, which must exist.
    pub fn new(
        url: &str,
        prefix: &str,
        timeouts: RedisTimeouts,
    ) -> Result<RedisLimiter, RedisSetupError> {
        Self::with_tls(url, prefix, timeouts, &RedisTls::default())
    }

    /// [`Self::new`], trusting `tls` for a `rediss://` URL.
    pub fn with_tls(
        url: &str,
        prefix: &str,
        timeouts: RedisTimeouts,
        tls: &RedisTls,
    ) -> Result<RedisLimiter, RedisSetupError> {
        let client = check_settings_with(url, prefix, tls)?;
        let limiter = Self::unconnected(Primary::Fixed(client), prefix, redact_url(url), timeouts)?;
        if let Primary::Fixed(client) = &limiter.primary {
            let _entered = limiter.runtime.enter();
            let connection = lazy_manager(client, &limiter.config)?;
            limiter.connection.store(Arc::new(Some(connection)));
        }
        Ok(limiter)
    }

    /// A limiter on the primary the sentinels `settings.nodes` name as
    /// `settings.master`. Returns at once: the sentinels are first asked by
    /// the first probe; until then (and whenever the primary is lost)
    /// commands fail at once and the caller decides locally.
    pub fn with_sentinel(
        settings: &SentinelSettings,
        prefix: &str,
        timeouts: RedisTimeouts,
    ) -> Result<RedisLimiter, RedisSetupError> {
        let sentinel = check_sentinel_settings(settings, prefix)?;
        let node = sentinel_node(settings);
        let shown = format!(
            "sentinel {} at {}",
            settings.master,
            settings
                .urls()
                .iter()
                .map(|u| redact_url(u))
                .collect::<Vec<_>>()
                .join(",")
        );
        Self::unconnected(
            Primary::Sentinel(SentinelSource {
                sentinel: tokio::sync::Mutex::new(sentinel),
                master: settings.master.clone(),
                node,
            }),
            prefix,
            shown,
            timeouts,
        )
    }

    /// A limiter on the Redis Cluster reached through any of `nodes`
    /// (`host:port` or `redis://[:password@]host:port`). Returns at once: the
    /// first probe connects; until then commands fail at once and the
    /// caller decides locally.
    pub fn with_cluster(
        nodes: &[String],
        prefix: &str,
        timeouts: RedisTimeouts,
    ) -> Result<RedisLimiter, RedisSetupError> {
        let client = check_cluster_settings(nodes, prefix, timeouts)?;
        let shown = format!(
            "cluster at {}",
            nodes
                .iter()
                .map(|u| redact_url(u))
                .collect::<Vec<_>>()
                .join(",")
        );
        Self::unconnected(Primary::Cluster(client), prefix, shown, timeouts)
    }

    fn unconnected(
        primary: Primary,
        prefix: &str,
        url: String,
        timeouts: RedisTimeouts,
    ) -> Result<RedisLimiter, RedisSetupError> {
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| RedisSetupError::NoRuntime)?;
        // Few, quick reconnection attempts: an outage is handled by deciding
        // locally and probing (see `shared`), not by commands queueing behind
        // a long backoff. Retries that multiply load on a struggling Redis are
        // what incident 4 warns about.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(Some(timeouts.command))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(timeouts.probe_interval.max(Duration::from_millis(50)));
        Ok(RedisLimiter {
            primary,
            config,
            connection: ArcSwap::from_pointee(None),
            prefix: prefix.to_owned(),
            url,
            timeouts,
            script_sha: redis::Script::new(GCRA_SCRIPT).get_hash().to_owned(),
            runtime,
        })
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether key names carry a hash tag (on a cluster).
    fn tagged(&self) -> bool {
        matches!(self.primary, Primary::Cluster(_))
    }

    /// The URL, with any password replaced by `***` (for logs).
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn timeouts(&self) -> RedisTimeouts {
        self.timeouts
    }

    /// The runtime the limiter was created in (background tasks run there).
    pub(crate) fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }

    /// The Redis key holding `key`'s TAT under `rule` (labelled `label`).
    pub fn key_name(&self, label: &str, rule: RuleFingerprint, key: u64) -> String {
        let mut name = rule_prefix(&self.prefix, label, rule, self.tagged());
        push_hex(&mut name, key);
        name
    }

    /// Decides every check at once, all or nothing, on the server's clock.
    /// Outcomes come back in the order of `checks`. Bounded by
    /// [`RedisTimeouts::command`].
    pub async fn check_all(
        &self,
        checks: &[RuleCheck<'_>],
    ) -> Result<Vec<Outcome>, RedisCheckError> {
        self.check_all_at(checks, None).await
    }

    /// One check; see [`Self::check_all`].
    pub async fn check(
        &self,
        rule: RuleFingerprint,
        key: u64,
        quota: &Quota,
        cost: u32,
    ) -> Result<Outcome, RedisCheckError> {
        let checks = [RuleCheck {
            label: "",
            rule,
            key,
            quota,
            cost,
        }];
        let mut outcomes = self.check_all(&checks).await?;
        outcomes
            .pop()
            .ok_or(RedisCheckError::UnexpectedReply { got: 0, checks: 1 })
    }

    /// [`Self::check_all`] with `now` (ns since the Unix epoch) instead of the
    /// server's clock, so tests can compare with [`Quota::check`] exactly.
    pub(crate) async fn check_all_at(
        &self,
        checks: &[RuleCheck<'_>],
        now_unix_ns: Option<u64>,
    ) -> Result<Vec<Outcome>, RedisCheckError> {
        let none = vec![0; checks.len()];
        let leased = self.check_all_leasing(checks, &none, now_unix_ns).await?;
        Ok(leased.into_iter().map(|(outcome, _)| outcome).collect())
    }

    /// [`Self::check_all`], and if every check is allowed, each also takes up
    /// to `extras[i]` tokens more ahead of use (a lease: at most a quarter of
    /// what its key has left). Returns each outcome with the tokens leased.
    pub(crate) async fn check_all_leasing(
        &self,
        checks: &[RuleCheck<'_>],
        extras: &[u32],
        now_unix_ns: Option<u64>,
    ) -> Result<Vec<(Outcome, u32)>, RedisCheckError> {
        if checks.is_empty() {
            return Ok(Vec::new());
        }
        let names: Vec<String> = checks
            .iter()
            .map(|c| self.key_name(c.label, c.rule, c.key))
            .collect();
        let args = ScriptArgs::Check { checks, extras };
        let values = self
            .run_script(&names, &args, now_unix_ns, self.timeouts.command)
            .await?;
        if values.len() != checks.len() * 5 {
            return Err(RedisCheckError::UnexpectedReply {
                got: values.len(),
                checks: checks.len(),
            });
        }
        Ok(checks
            .iter()
            .zip(values.chunks_exact(5))
            .map(|(check, v)| {
                let leased = u32::try_from(v[4].max(0)).unwrap_or(0);
                (outcome_from_reply(check, v), leased)
            })
            .collect())
    }

    /// Gives leased tokens back unused: each key's TAT moves `cost`
    /// intervals earlier (not before now). One script call per hash slot on
    /// a cluster, one in all otherwise; bounded by [`RedisTimeouts::admin`]
    /// each.
    pub async fn give_back(&self, returns: &[Unused<'_>]) -> Result<(), RedisCheckError> {
        // Keys of one hash slot per call on a cluster (one rule's keys
        // share a tag); all in one call otherwise.
        let mut batches: Vec<ReturnBatch<'_>> = Vec::new();
        for r in returns {
            let slot = if self.tagged() { hash_tag(r.label) } else { "" };
            let at = match batches.iter().position(|b| b.slot == slot) {
                Some(at) => at,
                None => {
                    batches.push(ReturnBatch {
                        slot,
                        names: Vec::new(),
                        tokens: Vec::new(),
                    });
                    batches.len() - 1
                }
            };
            batches[at]
                .names
                .push(self.key_name(r.label, r.rule, r.key));
            batches[at]
                .tokens
                .push((nanos(r.quota.emission_interval()), r.cost));
        }
        for batch in &batches {
            let args = ScriptArgs::Return(&batch.tokens);
            self.run_script(&batch.names, &args, None, self.timeouts.admin)
                .await?;
        }
        Ok(())
    }

    /// Runs the script on `names` (one per check or return), within `limit`.
    async fn run_script(
        &self,
        names: &[String],
        args: &ScriptArgs<'_, '_>,
        now_unix_ns: Option<u64>,
        limit: Duration,
    ) -> Result<Vec<i64>, RedisCheckError> {
        let mut connection = self.current()?;
        let evalsha = script_cmd("EVALSHA", &self.script_sha, names, args, now_unix_ns);
        let call = async {
            match evalsha.query_async::<Vec<i64>>(&mut connection).await {
                // A restarted or flushed Redis has forgotten the script: send
                // it whole once, which also caches it for the next EVALSHA.
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    script_cmd("EVAL", GCRA_SCRIPT, names, args, now_unix_ns)
                        .query_async::<Vec<i64>>(&mut connection)
                        .await
                }
                other => other,
            }
        };
        Ok(tokio::time::timeout(limit, call)
            .await
            .map_err(|_| RedisCheckError::Timeout(limit))??)
    }

    /// Whether Redis can decide a request now: runs the script, writing one
    /// key (`{prefix}probe`, expiring after 1 ms), within
    /// [`RedisTimeouts::connect`] plus [`RedisTimeouts::admin`]. A `PING`
    /// would pass where requests fail (a Redis out of memory refuses the
    /// write; one that restarted has lost the script, which this re-sends).
    pub async fn probe(&self) -> Result<(), RedisCheckError> {
        if self.connection.load().is_none() {
            self.recover_connection(1).await;
        }
        let quota = probe_quota();
        let check = RuleCheck {
            label: "",
            rule: RuleFingerprint(0),
            key: 0,
            quota: &quota,
            cost: 1,
        };
        let names = [format!("{}probe", self.prefix)];
        let limit = self.timeouts.connect + self.timeouts.admin;
        let args = ScriptArgs::Check {
            checks: &[check],
            extras: &[0],
        };
        self.run_script(&names, &args, None, limit).await.map(drop)
    }

    /// After `failed_probes` failed probes in a row: with one URL, every
    /// [`RESET_AFTER_FAILED_PROBES`]th replaces the connection with a fresh
    /// one, connected on first use (for a connection that stays broken
    /// although Redis may be back); with Sentinel, every one asks the
    /// sentinels for the primary and connects to what they name (bounded by
    /// [`RedisTimeouts::connect`] plus [`RedisTimeouts::admin`]; on failure the
    /// connection is kept, to be tried again).
    pub async fn recover_connection(&self, failed_probes: u32) {
        match &self.primary {
            Primary::Fixed(client) => {
                if failed_probes.is_multiple_of(RESET_AFTER_FAILED_PROBES) {
                    let _entered = self.runtime.enter();
                    if let Ok(fresh) = lazy_manager(client, &self.config) {
                        self.connection.store(Arc::new(Some(fresh)));
                    }
                }
            }
            Primary::Sentinel(source) => {
                let limit = self.timeouts.connect + self.timeouts.admin;
                let asked = async {
                    let mut sentinel = source.sentinel.lock().await;
                    sentinel
                        .async_master_for(&source.master, Some(&source.node))
                        .await
                };
                match tokio::time::timeout(limit, asked).await {
                    Ok(Ok(client)) => {
                        let _entered = self.runtime.enter();
                        if let Ok(fresh) = lazy_manager(&client, &self.config) {
                            tracing::info!(
                                primary = %client.get_connection_info().addr(),
                                "redis sentinel named the primary"
                            );
                            self.connection.store(Arc::new(Some(fresh)));
                        }
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "redis sentinel: no primary"),
                    Err(_) => tracing::debug!("redis sentinel: no answer within {limit:?}"),
                }
            }
            Primary::Cluster(client) => {
                // The cluster connection follows slots and reconnects by
                // itself; it is made anew only if there is none, or it
                // stays broken as a wedged one-node connection would.
                let fresh = self.connection.load().is_none()
                    || failed_probes.is_multiple_of(RESET_AFTER_FAILED_PROBES);
                if !fresh {
                    return;
                }
                let limit = self.timeouts.connect + self.timeouts.admin;
                match tokio::time::timeout(limit, client.get_async_connection()).await {
                    Ok(Ok(cluster)) => {
                        self.connection
                            .store(Arc::new(Some(Link::Cluster(cluster))));
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "redis cluster: no connection"),
                    Err(_) => tracing::debug!("redis cluster: no answer within {limit:?}"),
                }
            }
        }
    }

    /// The connection to use now; an error at once while there is none.
    fn current(&self) -> Result<Link, RedisCheckError> {
        match &**self.connection.load() {
            Some(c) => Ok(c.clone()),
            None => Err(RedisCheckError::NoPrimary),
        }
    }

    /// Live keys Redis holds for `rule` under this limiter's prefix (`SCAN`,
    /// so it never blocks Redis). A start-up check that state is there:
    /// "restored N keys". Approximate while keys are written or expire, and
    /// `SCAN` may return a key twice if Redis resizes its table meanwhile.
    pub async fn count_keys(
        &self,
        label: &str,
        rule: RuleFingerprint,
    ) -> Result<u64, RedisCheckError> {
        self.count_matching(&glob_escape(&rule_prefix(
            &self.prefix,
            label,
            rule,
            self.tagged(),
        )))
        .await
    }

    /// Live keys under this limiter's prefix, all rules together.
    pub async fn count_all_keys(&self) -> Result<u64, RedisCheckError> {
        self.count_matching(&glob_escape(&self.prefix)).await
    }

    async fn count_matching(&self, escaped_prefix: &str) -> Result<u64, RedisCheckError> {
        // `SCAN` walks one node's keys; a cluster's are spread over several.
        if self.tagged() {
            return Err(RedisCheckError::NotOnACluster);
        }
        let pattern = format!("{escaped_prefix}*");
        let mut connection = self.current()?;
        let mut cursor: u64 = 0;
        let mut count: u64 = 0;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_PAGE);
            let page = scan.query_async::<(u64, Vec<redis::Value>)>(&mut connection);
            let (next, keys) = tokio::time::timeout(self.timeouts.admin, page)
                .await
                .map_err(|_| RedisCheckError::Timeout(self.timeouts.admin))??;
            count += keys.len() as u64;
            if next == 0 {
                return Ok(count);
            }
            cursor = next;
        }
    }
}

/// What the script is asked to do, with its arguments per key.
enum ScriptArgs<'a, 'q> {
    /// Decide `checks`, each taking up to `extras[i]` leased tokens more.
    Check {
        checks: &'a [RuleCheck<'q>],
        extras: &'a [u32],
    },
    /// Give back unused tokens: (T in ns, tokens) per key.
    Return(&'a [(u64, u32)]),
}

/// `EVALSHA`/`EVAL` of the script over `names`, one per check or return.
fn script_cmd(
    verb: &str,
    script: &str,
    names: &[String],
    args: &ScriptArgs<'_, '_>,
    now_unix_ns: Option<u64>,
) -> Cmd {
    let mut cmd = redis::cmd(verb);
    cmd.arg(script).arg(names.len()).arg(names);
    match now_unix_ns {
        Some(now) => cmd.arg(now.to_string()),
        None => cmd.arg(""),
    };
    match args {
        ScriptArgs::Check { checks, extras } => {
            cmd.arg("check");
            for (check, extra) in checks.iter().zip(extras.iter()) {
                cmd.arg(nanos(check.quota.emission_interval()))
                    .arg(nanos(check.quota.tolerance()))
                    .arg(check.quota.burst())
                    .arg(check.cost)
                    .arg(*extra);
            }
        }
        ScriptArgs::Return(tokens) => {
            cmd.arg("return");
            for (interval, n) in tokens.iter() {
                cmd.arg(*interval).arg(*n);
            }
        }
    }
    cmd
}

/// The returns of one script call: key names and (T in ns, tokens).
struct ReturnBatch<'a> {
    slot: &'a str,
    names: Vec<String>,
    tokens: Vec<(u64, u32)>,
}

/// Leased tokens to give back ([`RedisLimiter::give_back`]): the rule's
/// key as checked, its `cost` the tokens unused.
pub type Unused<'q> = RuleCheck<'q>;

/// The part of a label a cluster hashes: the rule's name, as
/// [`rule_prefix`] tags it.
fn hash_tag(label: &str) -> &str {
    label.split_once(':').map_or(label, |(rule, _)| rule)
}

/// T = 1 ns and τ = 1 ms: every probe is admitted, so every probe writes
/// (a refused probe would write nothing and pass an out-of-memory Redis),
/// however many instances probe at once, and the key expires 1 ms later.
fn probe_quota() -> Quota {
    match Quota::new(1_000_000, Duration::from_millis(1), 1_000_000) {
        Ok(quota) => quota,
        // Constant arguments that Quota::new accepts (see its tests).
        Err(e) => unreachable!("probe quota rejected: {e}"),
    }
}

fn lazy_manager(
    client: &redis::Client,
    config: &ConnectionManagerConfig,
) -> Result<Link, RedisSetupError> {
    ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
        .map(Link::One)
        .map_err(RedisSetupError::Connection)
}

/// Maps one check's 4 integers (status, remaining, retry_after, reset).
fn outcome_from_reply(check: &RuleCheck<'_>, v: &[i64]) -> Outcome {
    let ns = |x: i64| Duration::from_nanos(u64::try_from(x).unwrap_or(0));
    match v[0] {
        0 => Outcome::Allowed {
            remaining: u32::try_from(v[1].max(0)).unwrap_or(check.quota.burst()),
            reset: ns(v[3]),
        },
        1 => Outcome::Rejected {
            retry_after: ns(v[2]),
            reset: ns(v[3]),
        },
        _ => Outcome::CostExceedsBurst {
            cost: check.cost,
            burst: check.quota.burst(),
        },
    }
}

/// `{prefix}{label}:{fingerprint:016x}:`, the start of every key of one
/// rule level: the one place key names begin, for writing and for counting
/// alike.
/// `{prefix}{label}:{rule:016x}:`; `tagged` (a cluster), with the rule's
/// name in the label as the hash tag (`{prefix}{{rule}}:level:...`), or the
/// fingerprint when there is no label, so one rule's keys share a slot.
fn rule_prefix(prefix: &str, label: &str, rule: RuleFingerprint, tagged: bool) -> String {
    let mut name = String::with_capacity(prefix.len() + label.len() + 37);
    name.push_str(prefix);
    if tagged && label.is_empty() {
        name.push('{');
        push_hex(&mut name, rule.0);
        name.push_str("}:");
        return name;
    }
    if tagged {
        // `rule:level` becomes `{rule}:level`; a label without a level is
        // all tag.
        let (rule_name, level) = label.split_once(':').unwrap_or((label, ""));
        name.push('{');
        name.push_str(rule_name);
        name.push('}');
        if !level.is_empty() {
            name.push(':');
            name.push_str(level);
        }
        name.push(':');
    } else if !label.is_empty() {
        name.push_str(label);
        name.push(':');
    }
    push_hex(&mut name, rule.0);
    name.push(':');
    name
}

/// The label of a rule level's key names: `{rule}:{level}`, e.g.
/// `anon-expensive:subnet`, so that `redis-cli --scan --pattern
/// 'weir:anon-expensive:*'` finds one rule's keys. Characters other than
/// letters, digits, `-`, `_` and `.` become `_` (`:` separates the parts,
/// and glob characters would make patterns awkward to write).
pub fn key_label(rule: &str, level: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    format!("{}:{}", clean(rule), clean(level))
}

fn push_hex(out: &mut String, x: u64) {
    use std::fmt::Write;
    let _ = write!(out, "{x:016x}");
}

/// Escapes `SCAN MATCH` glob characters, so a prefix such as `weir[blue]:`
/// matches itself only.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 4);
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^' | '-') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `url` with the password (between `user:` and `@`) replaced by `***`.
fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let authority_end = url[scheme_end..]
        .find('/')
        .map_or(url.len(), |i| scheme_end + i);
    let Some(at) = url[scheme_end..authority_end]
        .rfind('@')
        .map(|i| scheme_end + i)
    else {
        return url.to_owned();
    };
    let redacted = match url[scheme_end..at].split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        // `redis://secret@host`: treat a lone user part as a secret too.
        None => "***".to_owned(),
    };
    format!("{}{redacted}{}", &url[..scheme_end], &url[at..])
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Nanoseconds since the Unix epoch on this machine's clock (tests pass it
/// as `now`; production uses the server's `TIME`).
#[cfg(test)]
pub(crate) fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, nanos)
}

#[cfg(test)]
mod tests;
