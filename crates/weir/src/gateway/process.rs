//! Checks of what only the running process meets: addresses it will bind,
//! the snapshot directory it will write ([`host`]), the Redis it will
//! reach. `weir check` runs them too, so it refuses what `weir run` would,
//! and names the key.
//!
//! Also the warnings: settings that run, but expose or trust too much (the
//! admin API on a public address, a trusted-proxy range that covers every
//! address). They are printed by `weir check` and logged by `weir run` and
//! every reload; they never refuse a configuration.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;

use crate::config::{ConfigError, KeyPath, LoadedConfig};
use crate::edge::ListenerSpec;

/// Two sockets configured on one address: the second bind would fail at
/// start (port 0 picks a fresh port each time, so it never clashes).
pub(super) fn addresses(
    loaded: &LoadedConfig,
    listeners: &[ListenerSpec],
    admin: Option<SocketAddr>,
    errors: &mut Vec<ConfigError>,
) {
    let root = KeyPath::root();
    let mut seen: HashMap<SocketAddr, String> = HashMap::new();
    let named = (0..listeners.len()).map(|i| root.key("listeners").index(i).key("address"));
    let mut all: Vec<(SocketAddr, KeyPath)> =
        listeners.iter().map(|l| l.address).zip(named).collect();
    if let Some(a) = admin {
        all.push((a, root.key("admin").key("address")));
    }
    for (addr, at) in all {
        if addr.port() == 0 {
            continue;
        }
        match seen.get(&addr) {
            Some(first) => errors.push(loaded.error_at(
                &at,
                format!("{addr} is also {first}: one address cannot be bound twice"),
            )),
            None => {
                seen.insert(addr, at.to_string());
            }
        }
    }
}

/// What this machine must have for the configuration to run: the snapshot
/// file's directory (the file itself may be missing, on a first start).
/// With `create`, a missing directory is made (as `weir run` and a reload
/// do, like nginx with its temporary directories) and only a failure to
/// make it is an error; without (`weir check`, which changes nothing), a
/// missing one is a warning. Not part of compiling a configuration:
/// replaying a production configuration on a laptop needs no
/// `/var/lib/weir`. Returns (errors, warnings).
pub fn host(loaded: &LoadedConfig, create: bool) -> (Vec<ConfigError>, Vec<ConfigError>) {
    let (mut errors, mut warnings) = (Vec::new(), Vec::new());
    if let Some(file) = &loaded.config.state.snapshot_file {
        let dir = Path::new(file)
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let at = KeyPath::root().key("state").key("snapshot_file");
        if dir.is_dir() {
            // Nothing to do.
        } else if !create {
            // Creatable, as far as can be told without trying: the nearest
            // path that exists is a directory (not, say, a file).
            let creatable = dir
                .ancestors()
                .find(|a| a.exists())
                .is_some_and(Path::is_dir);
            let problem = format!("the directory {} does not exist", dir.display());
            if creatable {
                warnings.push(loaded.error_at(&at, format!("{problem} yet: weir run creates it")));
            } else {
                errors.push(loaded.error_at(
                    &at,
                    format!("{problem} and cannot be created: snapshots could never be written"),
                ));
            }
        } else if let Err(e) = std::fs::create_dir_all(dir) {
            errors.push(loaded.error_at(
                &at,
                format!(
                    "the directory {} does not exist and cannot be created ({e}): snapshots could never be written",
                    dir.display()
                ),
            ));
        }
    }
    (errors, warnings)
}

/// `[state]`: the Redis URL and prefix are ones the limiter can use, and
/// leases short enough that unused tokens come back soon.
pub(super) fn state(loaded: &LoadedConfig, errors: &mut Vec<ConfigError>) {
    let st = &loaded.config.state;
    let at = KeyPath::root().key("state");
    lease(loaded, errors);
    if let Some(url) = &st.redis_url {
        use weir_limiter::redis::{RedisSetupError, RedisTls, check_settings_with};
        let tls =
            RedisTls::from_config(st.redis_ca_file.as_deref().map(Path::new)).unwrap_or_else(|e| {
                errors.push(loaded.error_at(&at.key("redis_ca_file"), e.to_string()));
                RedisTls::default()
            });
        if let Err(e) = check_settings_with(url, &st.redis_prefix, &tls) {
            let key = match e {
                RedisSetupError::BadUrl { .. } => "redis_url",
                RedisSetupError::BadCa(_) | RedisSetupError::CaFile { .. } => "redis_ca_file",
                _ => "redis_prefix",
            };
            errors.push(loaded.error_at(&at.key(key), e.to_string()));
        }
    }
    if let Some(nodes) = &st.redis_cluster {
        use weir_limiter::redis::{RedisSetupError, RedisTimeouts, check_cluster_settings};
        let at = at.key("redis_cluster");
        if st.redis_url.is_some() || st.redis_sentinel.is_some() {
            errors.push(loaded.error_at(
                &at,
                "give one of redis_url, redis_sentinel and redis_cluster".to_string(),
            ));
        }
        if let Err(e) = check_cluster_settings(nodes, &st.redis_prefix, RedisTimeouts::default()) {
            let key = match e {
                RedisSetupError::NoClusterNodes | RedisSetupError::BadUrl { .. } => at,
                _ => KeyPath::root().key("state").key("redis_prefix"),
            };
            errors.push(loaded.error_at(&key, e.to_string()));
        }
    }
    if let Some(sentinel) = &st.redis_sentinel {
        use weir_limiter::redis::{RedisSetupError, check_sentinel_settings};
        let at = at.key("redis_sentinel");
        if st.redis_url.is_some() {
            errors.push(loaded.error_at(
                &at,
                "give redis_url or redis_sentinel, not both".to_string(),
            ));
        }
        let settings = sentinel.settings();
        if let Err(e) = check_sentinel_settings(&settings, &st.redis_prefix) {
            let key = match e {
                RedisSetupError::NoSentinels | RedisSetupError::BadUrl { .. } => at.key("nodes"),
                RedisSetupError::NoSentinelMaster => at.key("master"),
                _ => KeyPath::root().key("state").key("redis_prefix"),
            };
            errors.push(loaded.error_at(&key, e.to_string()));
        }
    }
}

/// `state.redis_lease` is at most [`MAX_REDIS_LEASE`].
fn lease(loaded: &LoadedConfig, errors: &mut Vec<ConfigError>) {
    let lease = loaded.config.state.redis_lease.0;
    if lease > MAX_REDIS_LEASE {
        errors.push(loaded.error_at(
            &KeyPath::root().key("state").key("redis_lease"),
            format!(
                "at most {MAX_REDIS_LEASE:?}, not {lease:?}: unused leased tokens stay away from the fleet that long"
            ),
        ));
    }
}

/// The longest `state.redis_lease`: how early a key may be refused for
/// tokens another instance holds (docs/operations.md, leases).
const MAX_REDIS_LEASE: std::time::Duration = std::time::Duration::from_secs(5);

/// Settings that work but expose or trust too much.
pub(super) fn warnings(loaded: &LoadedConfig, admin: Option<SocketAddr>) -> Vec<ConfigError> {
    let cfg = &loaded.config;
    let root = KeyPath::root();
    let mut warnings = Vec::new();
    if let Some(a) = admin
        && !a.ip().is_loopback()
    {
        let token = if cfg.admin.token.is_some() {
            "changes need the token, but anyone who reaches it reads /status and /metrics"
        } else {
            "anyone who reaches it reads /status and /metrics and, without [admin] token, may reload"
        };
        warnings.push(loaded.error_at(
            &root.key("admin").key("address"),
            format!("the admin API listens on {a}, not a loopback address: {token}"),
        ));
    }
    for (i, entry) in cfg.identity.trusted_proxies.iter().enumerate() {
        if let Ok(net) = crate::identity::TrustedProxies::parse_entry(i, entry)
            && net.prefix_len() == 0
        {
            warnings.push(loaded.error_at(
                &root.key("identity").key("trusted_proxies").index(i),
                format!(
                    "{entry} trusts every address: any client can name itself with X-Forwarded-For, and escape every per-address limit"
                ),
            ));
        }
    }
    warnings
}
