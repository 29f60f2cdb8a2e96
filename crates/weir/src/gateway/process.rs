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
/// Not part of compiling a configuration: replaying or simulating a
/// production configuration on a laptop needs no `/var/lib/weir`. `weir
/// check`, `weir run` and every reload call it.
pub fn host(loaded: &LoadedConfig) -> Vec<ConfigError> {
    let mut errors = Vec::new();
    if let Some(file) = &loaded.config.state.snapshot_file {
        let dir = Path::new(file)
            .parent()
            .filter(|d| !d.as_os_str().is_empty());
        let dir = dir.unwrap_or(Path::new("."));
        if !dir.is_dir() {
            errors.push(loaded.error_at(
                &KeyPath::root().key("state").key("snapshot_file"),
                format!(
                    "the directory {} does not exist: snapshots could never be written (create it, or mount the shared volume)",
                    dir.display()
                ),
            ));
        }
    }
    errors
}

/// `[state]`: the Redis URL and prefix are ones the limiter can use.
pub(super) fn state(loaded: &LoadedConfig, errors: &mut Vec<ConfigError>) {
    let st = &loaded.config.state;
    let at = KeyPath::root().key("state");
    if let Some(url) = &st.redis_url
        && let Err(e) = weir_limiter::redis::check_settings(url, &st.redis_prefix)
    {
        let key = if matches!(e, weir_limiter::redis::RedisSetupError::BadUrl { .. }) {
            "redis_url"
        } else {
            "redis_prefix"
        };
        errors.push(loaded.error_at(&at.key(key), e.to_string()));
    }
}

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
