//! Compiling the edge's sections: `[[listeners]]`, `[admin]`,
//! `[identity]` and `[limits]`.

use std::net::SocketAddr;

use crate::admin::guard::{AdminGuard, MIN_TOKEN_LEN};
use crate::config::{ConfigError, KeyPath, LimitsConfig, LoadedConfig};
use crate::edge::tls;
use crate::edge::{ConnLimits, EdgeSettings, ListenerSpec};
use crate::identity::TrustedProxies;

/// Smallest buffer hyper accepts for request heads.
const MIN_HEADER_BYTES: usize = 8192;

/// `[[listeners]]`: addresses parsed, TLS acceptors built (binding happens
/// once, at start).
pub(super) fn listeners(loaded: &LoadedConfig, errors: &mut Vec<ConfigError>) -> Vec<ListenerSpec> {
    let cfg = &loaded.config;
    let root = KeyPath::root();
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
            reuse_port: l.reuse_port,
            tls,
        });
    }
    listeners
}

/// `[admin]`: the admin API's address, if it is enabled, and who may
/// change weir through it.
pub(super) fn admin(
    loaded: &LoadedConfig,
    errors: &mut Vec<ConfigError>,
) -> (Option<SocketAddr>, AdminGuard) {
    let cfg = &loaded.config.admin;
    let at = KeyPath::root().key("admin");
    if let Some(token) = &cfg.token
        && token.len() < MIN_TOKEN_LEN
    {
        // An empty one is most often `${WEIR_ADMIN_TOKEN:-}` with the
        // variable unset: refused, not taken as "no token".
        errors.push(loaded.error_at(
            &at.key("token"),
            format!(
                "a token of {} characters is too easy to guess: use at least {MIN_TOKEN_LEN} (e.g. `openssl rand -hex 16`)",
                token.len()
            ),
        ));
    }
    for (i, host) in cfg.hosts.iter().enumerate() {
        if host.is_empty() || host.contains([':', '/', ' ', '[', ']']) {
            errors.push(loaded.error_at(
                &at.key("hosts").index(i),
                format!("`{host}` is not a host name (no port, no scheme)"),
            ));
        }
    }
    let guard = AdminGuard::new(cfg.token.clone(), &cfg.hosts);
    if !cfg.enabled {
        return (None, guard);
    }
    match cfg.address.parse::<SocketAddr>() {
        Ok(a) => (Some(a), guard),
        Err(_) => {
            errors.push(loaded.error_at(
                &at.key("address"),
                format!("`{}` is not ip:port", cfg.address),
            ));
            (None, guard)
        }
    }
}

/// `[identity]`: the trusted proxies, and the dominant-peer share.
pub(super) fn identity(
    loaded: &LoadedConfig,
    errors: &mut Vec<ConfigError>,
) -> (TrustedProxies, f64) {
    let cfg = &loaded.config;
    let root = KeyPath::root();
    let id_at = root.key("identity");
    for (i, entry) in cfg.identity.trusted_proxies.iter().enumerate() {
        if let Err(e) = TrustedProxies::parse_entry(i, entry) {
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
    (trusted, share)
}

/// `[limits]`: the caps and timeouts of connections and request heads.
pub(super) fn limits(loaded: &LoadedConfig, errors: &mut Vec<ConfigError>) -> EdgeSettings {
    let lim = &loaded.config.limits;
    check_limits(loaded, lim, errors);
    EdgeSettings {
        conn: ConnLimits {
            max_connections: lim.max_connections,
            max_per_ip: lim.max_connections_per_ip,
            header_timeout: lim.header_read_timeout.0,
            idle_timeout: lim.keepalive_idle_timeout.0,
            send_timeout: lim.send_timeout.0,
            ipv6_prefix: lim.ipv6_prefix_len,
        },
        max_in_flight_per_ip: lim.max_requests_in_flight_per_ip,
        handshake_timeout: lim.handshake_timeout.0,
        max_header_bytes: lim.max_header_bytes,
        max_headers: lim.max_headers,
        body: weir_http::body::BodyLimits {
            read_timeout: lim.body_read_timeout.0,
            min_rate: lim.min_body_rate,
            max_bytes: lim.max_body_bytes,
        },
    }
}

/// Reports `[limits]` values that would refuse every connection or request:
/// zero caps, a header size below the minimum, a bad IPv6 prefix length,
/// zero timeouts.
fn check_limits(loaded: &LoadedConfig, lim: &LimitsConfig, errors: &mut Vec<ConfigError>) {
    let lim_at = KeyPath::root().key("limits");
    if lim.max_connections == 0 {
        errors.push(loaded.error_at(&lim_at.key("max_connections"), "must be at least 1"));
    }
    if lim.max_connections_per_ip == 0 {
        errors.push(loaded.error_at(&lim_at.key("max_connections_per_ip"), "must be at least 1"));
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
    if !(1..=128).contains(&lim.ipv6_prefix_len) {
        errors.push(loaded.error_at(
            &lim_at.key("ipv6_prefix_len"),
            format!(
                "{} is not a prefix length: 1 to 128 (64 for one site)",
                lim.ipv6_prefix_len
            ),
        ));
    }
    // A zero timeout would close every connection at the first sweep (or,
    // for the send timeout, at a write's first full window).
    for (key, value) in [
        ("header_read_timeout", lim.header_read_timeout.0),
        ("keepalive_idle_timeout", lim.keepalive_idle_timeout.0),
        ("handshake_timeout", lim.handshake_timeout.0),
        ("body_read_timeout", lim.body_read_timeout.0),
        ("send_timeout", lim.send_timeout.0),
    ] {
        if value.is_zero() {
            errors.push(loaded.error_at(&lim_at.key(key), "must be longer than 0s"));
        }
    }
}
