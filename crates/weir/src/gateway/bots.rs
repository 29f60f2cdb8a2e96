//! Compiling `[bots]`: each crawler's keys read and checked, its reverse
//! DNS claim validated, and the resolver built, into an
//! [`identity::bots::BotVerifier`](crate::identity::bots::BotVerifier).
//! Every problem is reported with its key and line (a key file's own
//! problem names the file). Rebuilt on every reload, so an edited key file
//! takes effect with the reload (the reverse-DNS cache starts empty).

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{NameServerConfig, ResolveHosts, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;

use crate::config::{BotsConfig, ConfigError, CrawlerConfig, KeyPath, LoadedConfig};
use crate::identity::bots::fcrdns::{Fcrdns, Settings};
use crate::identity::bots::jwk::{self, PublicKey};
use crate::identity::bots::signature::Keyring;
use crate::identity::bots::{BotVerifier, Crawler, MAX_CRAWLERS};
use crate::identity::session::SystemWallClock;

/// The longest `max_skew`: a signature's lifetime is minutes; a larger
/// skew would let expired signatures through.
const MAX_SKEW: Duration = Duration::from_secs(600);

/// The verifier, when `[bots]` lists crawlers.
pub(super) fn bots(
    loaded: &LoadedConfig,
    errors: &mut Vec<ConfigError>,
) -> Option<Arc<BotVerifier>> {
    let cfg = loaded.config.bots.as_ref()?;
    let at = KeyPath::root().key("bots");
    let before = errors.len();
    settings(loaded, cfg, &at, errors);
    if cfg.crawlers.len() > MAX_CRAWLERS {
        errors.push(loaded.error_at(
            &at.key("crawlers"),
            format!("{} crawlers; at most {MAX_CRAWLERS}", cfg.crawlers.len()),
        ));
    }
    let mut keyring = Keyring::default();
    let mut crawlers = Vec::with_capacity(cfg.crawlers.len());
    for (i, c) in cfg.crawlers.iter().enumerate() {
        let cat = at.key("crawlers").index(i);
        if cfg.crawlers[..i].iter().any(|o| o.name == c.name) {
            errors.push(loaded.error_at(&cat.key("name"), format!("`{}` is used twice", c.name)));
        }
        crawler(loaded, c, &cat, i, &mut keyring, errors);
        crawlers.push(Crawler::new(
            &c.name,
            c.user_agent.as_deref(),
            c.domains.clone(),
        ));
    }
    let needs_dns = cfg.crawlers.iter().any(|c| c.domains.is_some());
    let fcrdns = if needs_dns {
        resolver(loaded, cfg, &at, errors)
    } else {
        None
    };
    if errors.len() > before {
        return None;
    }
    let skew = cfg.max_skew.0.as_secs();
    match BotVerifier::new(crawlers, keyring, skew, Arc::new(SystemWallClock), fcrdns) {
        Ok(v) => Some(Arc::new(v)),
        Err(e) => {
            errors.push(loaded.error_at(&at, e.to_string()));
            None
        }
    }
}

/// The table's own settings, each in its range.
fn settings(loaded: &LoadedConfig, cfg: &BotsConfig, at: &KeyPath, errors: &mut Vec<ConfigError>) {
    let mut range = |key: &str, ok: bool, what: String| {
        if !ok {
            errors.push(loaded.error_at(&at.key(key), what));
        }
    };
    let d = |c: &crate::config::ConfigDuration| format!("{c:?}");
    range(
        "max_skew",
        cfg.max_skew.0 <= MAX_SKEW,
        format!("{} is above 10m", d(&cfg.max_skew)),
    );
    range(
        "dns_wait",
        !cfg.dns_wait.0.is_zero() && cfg.dns_wait.0 <= Duration::from_secs(5),
        format!("{} is not in 1ms ..= 5s", d(&cfg.dns_wait)),
    );
    range(
        "dns_timeout",
        !cfg.dns_timeout.0.is_zero(),
        "must be more than 0s".into(),
    );
    range(
        "dns_verified_ttl",
        !cfg.dns_verified_ttl.0.is_zero(),
        "must be more than 0s".into(),
    );
    range(
        "dns_cache_size",
        cfg.dns_cache_size > 0,
        "must be at least 1".into(),
    );
    range(
        "dns_max_lookups",
        cfg.dns_max_lookups > 0,
        "must be at least 1".into(),
    );
}

/// One crawler: its name, its proof methods, its keys into `keyring`.
fn crawler(
    loaded: &LoadedConfig,
    c: &CrawlerConfig,
    at: &KeyPath,
    index: usize,
    keyring: &mut Keyring,
    errors: &mut Vec<ConfigError>,
) {
    check_crawler_name(loaded, c, at, errors);
    check_reverse_dns_claim(loaded, c, at, errors);
    let keys = read_crawler_keys(loaded, c, at, errors);
    for (key_at, key) in &keys {
        if !keyring.insert(key, index) && keyring.bot_of(&key.thumbprint) != Some(index) {
            errors.push(loaded.error_at(
                key_at,
                format!("key {} belongs to another crawler too", key.thumbprint),
            ));
        }
    }
    let has_keys = c.keys_file.is_some() || !c.keys.is_empty();
    if !has_keys && c.user_agent.is_none() && c.domains.is_none() {
        errors.push(loaded.error_at(
            at,
            "proves nothing: give Web Bot Auth keys (`keys`, `keys_file`) or reverse DNS (`user_agent` and `domains`)",
        ));
    }
}

/// Reports a crawler name that is not `[a-z0-9_-]`, 1 to 40 characters.
fn check_crawler_name(
    loaded: &LoadedConfig,
    c: &CrawlerConfig,
    at: &KeyPath,
    errors: &mut Vec<ConfigError>,
) {
    let name_ok = !c.name.is_empty()
        && c.name.len() <= 40
        && c.name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if !name_ok {
        errors.push(loaded.error_at(
            &at.key("name"),
            format!("`{}` is not [a-z0-9_-], 1 to 40 characters", c.name),
        ));
    }
}

/// Reports a reverse-DNS proof that is half given or cannot work: a
/// `user_agent` and its `domains` go together, and each domain must be one.
fn check_reverse_dns_claim(
    loaded: &LoadedConfig,
    c: &CrawlerConfig,
    at: &KeyPath,
    errors: &mut Vec<ConfigError>,
) {
    match (&c.user_agent, &c.domains) {
        (None, None) => {}
        (Some(ua), _) if ua.trim().len() < 3 => errors.push(loaded.error_at(
            &at.key("user_agent"),
            format!("{ua:?} is too short to identify a crawler (3+ characters)"),
        )),
        (Some(_), None) => errors.push(loaded.error_at(
            &at.key("user_agent"),
            "needs `domains`: a User-Agent alone proves nothing (reverse DNS checks it against the domains)",
        )),
        (None, Some(_)) => errors.push(loaded.error_at(
            &at.key("domains"),
            "needs `user_agent`: the claim that makes weir look the address up",
        )),
        (Some(_), Some(domains)) if domains.is_empty() => errors.push(loaded.error_at(
            &at.key("domains"),
            "is empty: no address can confirm (list the crawler's domains, e.g. [\"googlebot.com\"])",
        )),
        (Some(_), Some(domains)) => {
            for (j, d) in domains.iter().enumerate() {
                if let Err(why) = check_domain(d) {
                    errors.push(loaded.error_at(&at.key("domains").index(j), why));
                }
            }
        }
    }
}

/// The crawler's Web Bot Auth public keys, from its `keys_file` and `keys`,
/// each with where it was configured; a key that cannot be read is reported.
fn read_crawler_keys(
    loaded: &LoadedConfig,
    c: &CrawlerConfig,
    at: &KeyPath,
    errors: &mut Vec<ConfigError>,
) -> Vec<(KeyPath, PublicKey)> {
    let mut keys: Vec<(KeyPath, PublicKey)> = Vec::new();
    if let Some(path) = &c.keys_file {
        match jwk::read_key_file(path) {
            Ok(found) => keys.extend(found.into_iter().map(|k| (at.key("keys_file"), k))),
            Err(e) => errors.push(loaded.error_at(&at.key("keys_file"), format!("{path}: {e}"))),
        }
    }
    for (j, x) in c.keys.iter().enumerate() {
        match PublicKey::from_x(x) {
            Ok(k) => keys.push((at.key("keys").index(j), k)),
            Err(e) => errors.push(loaded.error_at(&at.key("keys").index(j), e.to_string())),
        }
    }
    keys
}

/// A domain as reverse DNS compares it: a DNS name of at least two labels.
fn check_domain(d: &str) -> Result<(), String> {
    let name = d.trim_end_matches('.');
    let labels_ok = name.split('.').all(|l| {
        !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    });
    if labels_ok && name.contains('.') && name.len() <= 253 {
        Ok(())
    } else {
        Err(format!("`{d}` is not a domain name like `googlebot.com`"))
    }
}

/// The reverse-DNS checker: the configured name servers, or the system's.
fn resolver(
    loaded: &LoadedConfig,
    cfg: &BotsConfig,
    at: &KeyPath,
    errors: &mut Vec<ConfigError>,
) -> Option<Fcrdns> {
    let provider = TokioRuntimeProvider::default();
    let mut builder = if cfg.dns_servers.is_empty() {
        match TokioResolver::builder(provider) {
            Ok(b) => b,
            Err(e) => {
                errors.push(loaded.error_at(
                    &at.key("dns_servers"),
                    format!("empty, and the system's resolver configuration cannot be read: {e}"),
                ));
                return None;
            }
        }
    } else {
        let servers = name_servers(loaded, cfg, at, errors);
        TokioResolver::builder_with_config(ResolverConfig::from_name_servers(servers), provider)
    };
    let opts = builder.options_mut();
    // One bound for the whole check is `dns_timeout`; a query gets all of it.
    opts.timeout = cfg.dns_timeout.0;
    opts.attempts = 1;
    // Only DNS answers confirm a crawler, never this machine's hosts file.
    opts.use_hosts_file = ResolveHosts::Never;
    let resolver = match builder.build() {
        Ok(r) => r,
        Err(e) => {
            errors.push(loaded.error_at(&at.key("dns_servers"), e.to_string()));
            return None;
        }
    };
    Some(Fcrdns::new(resolver, fcrdns_settings(cfg)))
}

/// The configured `dns_servers` (`ip` or `ip:port`, port 53 by default),
/// each asked over UDP and TCP; one that does not parse is reported.
fn name_servers(
    loaded: &LoadedConfig,
    cfg: &BotsConfig,
    at: &KeyPath,
    errors: &mut Vec<ConfigError>,
) -> Vec<NameServerConfig> {
    let mut servers = Vec::new();
    for (j, s) in cfg.dns_servers.iter().enumerate() {
        let parsed = s
            .parse::<SocketAddr>()
            .or_else(|_| s.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)));
        match parsed {
            Ok(addr) => {
                let mut server = NameServerConfig::udp_and_tcp(addr.ip());
                for conn in &mut server.connections {
                    conn.port = addr.port();
                }
                servers.push(server);
            }
            Err(_) => errors.push(loaded.error_at(
                &at.key("dns_servers").index(j),
                format!("`{s}` is not ip or ip:port"),
            )),
        }
    }
    servers
}

/// The reverse-DNS check's waits, lifetimes and bounds from the config.
fn fcrdns_settings(cfg: &BotsConfig) -> Settings {
    Settings {
        wait: cfg.dns_wait.0,
        timeout: cfg.dns_timeout.0,
        verified_ttl: cfg.dns_verified_ttl.0,
        negative_ttl: cfg.dns_negative_ttl.0,
        cache_size: NonZeroUsize::new(cfg.dns_cache_size).unwrap_or(NonZeroUsize::MIN),
        max_lookups: cfg.dns_max_lookups.max(1),
    }
}

#[cfg(test)]
mod tests {
    use crate::config::load_str;
    use crate::gateway::Gateway;
    use std::collections::HashMap as Map;
    use std::path::Path;

    const BASE: &str =
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n[pools.app]\nservers = [\"127.0.0.1:9000\"]\n";

    fn errors(text: &str) -> Vec<String> {
        let loaded = load_str(
            &format!("{BASE}{text}"),
            Some(Path::new("weir.toml")),
            &Map::<String, String>::new(),
        )
        .unwrap();
        match Gateway::build(loaded, None, 1) {
            Ok(_) => Vec::new(),
            Err(e) => e.0.iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn every_bad_setting_names_its_line_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let bad_file = dir.path().join("bad.json");
        std::fs::write(
            &bad_file,
            r#"{"keys":[{"kty":"OKP","crv":"Ed25519","x":"AAAA"}]}"#,
        )
        .unwrap();
        let good_file = dir.path().join("good.json");
        std::fs::write(
            &good_file,
            r#"{"keys":[{"kty":"OKP","crv":"Ed25519","x":"JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs"}]}"#,
        )
        .unwrap();
        let x = "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs";
        let bad = bad_file.display();
        let good = good_file.display();
        let cases: Vec<(String, &str)> = vec![
            (
                "[bots]\nmax_skew = \"1h\"\n".to_string(),
                "weir.toml:6: bots.max_skew: 1h is above 10m",
            ),
            (
                "[bots]\ndns_servers = [\"nope\"]\n[[bots.crawlers]]\nname = \"g\"\nuser_agent = \"Googlebot\"\ndomains = [\"googlebot.com\"]\n".to_string(),
                "weir.toml:6: bots.dns_servers[0]: `nope` is not ip or ip:port",
            ),
            (
                "[[bots.crawlers]]\nname = \"g\"\nuser_agent = \"Googlebot\"\ndomains = []\n".to_string(),
                "weir.toml:8: bots.crawlers[0].domains: is empty",
            ),
            (
                "[[bots.crawlers]]\nname = \"g\"\nuser_agent = \"Googlebot\"\n".to_string(),
                "weir.toml:7: bots.crawlers[0].user_agent: needs `domains`",
            ),
            (
                "[[bots.crawlers]]\nname = \"g\"\nuser_agent = \"Googlebot\"\ndomains = [\"-\"]\n".to_string(),
                "weir.toml:8: bots.crawlers[0].domains[0]: `-` is not a domain name",
            ),
            (
                format!("[[bots.crawlers]]\nname = \"G B\"\nkeys = [\"{x}\"]\n"),
                "weir.toml:6: bots.crawlers[0].name: `G B` is not [a-z0-9_-]",
            ),
            (
                format!("[[bots.crawlers]]\nname = \"g\"\nkeys_file = \"{bad}\"\n"),
                "weir.toml:7: bots.crawlers[0].keys_file: ",
            ),
            (
                "[[bots.crawlers]]\nname = \"g\"\nkeys_file = \"/nonexistent/k.json\"\n".to_string(),
                "weir.toml:7: bots.crawlers[0].keys_file: /nonexistent/k.json: cannot read",
            ),
            (
                format!("[[bots.crawlers]]\nname = \"g\"\nkeys = [\"{x}\", \"shortkey\"]\n"),
                "weir.toml:7: bots.crawlers[0].keys[1]: an Ed25519 key is 32 bytes",
            ),
            (
                format!(
                    "[[bots.crawlers]]\nname = \"a\"\nkeys_file = \"{good}\"\n[[bots.crawlers]]\nname = \"b\"\nkeys = [\"{x}\"]\n"
                ),
                "weir.toml:10: bots.crawlers[1].keys[0]: key poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U belongs to another crawler",
            ),
            (
                "[[bots.crawlers]]\nname = \"a\"\n".to_string(),
                "weir.toml:5: bots.crawlers[0]: proves nothing",
            ),
            (
                format!(
                    "[[bots.crawlers]]\nname = \"a\"\nkeys = [\"{x}\"]\n[[bots.crawlers]]\nname = \"a\"\nuser_agent = \"Abot\"\ndomains = [\"a.example\"]\n"
                ),
                "weir.toml:9: bots.crawlers[1].name: `a` is used twice",
            ),
        ];
        for (text, want) in &cases {
            let got = errors(text);
            assert!(
                got.iter().any(|e| e.starts_with(want) || e.contains(want)),
                "{text}\nwant {want:?}\ngot {got:#?}"
            );
        }
        let share = errors("[pools.app.admission]\nbots_share = -0.1\n");
        assert!(
            share[0].starts_with("weir.toml:6: pools.app.admission.bots_share: admission.bots_share = -0.1 is not a share"),
            "{share:?}"
        );
        let share = errors("[pools.app.admission]\nanonymous_share = 1.5\n");
        assert!(
            share[0].starts_with("weir.toml:6: pools.app.admission.anonymous_share: admission.anonymous_share = 1.5 is not a share"),
            "{share:?}"
        );
        let share = errors("[pools.app.admission]\nnewcomers_share = 2\n");
        assert!(
            share[0].starts_with("weir.toml:6: pools.app.admission.newcomers_share: admission.newcomers_share = 2 is not a share"),
            "{share:?}"
        );
        let share = errors("[pools.app.admission]\npass_share = 1.01\n");
        assert!(
            share[0].starts_with("weir.toml:6: pools.app.admission.pass_share: admission.pass_share = 1.01 is not a share"),
            "{share:?}"
        );
        // Good: keys from a file and inline, and reverse DNS on a given server.
        let ok = format!(
            "[bots]\ndns_servers = [\"127.0.0.1:5353\"]\n[[bots.crawlers]]\nname = \"a\"\nkeys_file = \"{good}\"\n[[bots.crawlers]]\nname = \"googlebot\"\nuser_agent = \"Googlebot\"\ndomains = [\"googlebot.com\", \"google.com.\"]\n"
        );
        assert_eq!(errors(&ok), Vec::<String>::new());
    }
}
