//! A property of the whole request path: for any spelling of a
//! URL a client can send (escaped letters, dot segments, repeated slashes,
//! detours through other directories, a host in other case with a trailing
//! dot, query keys escaped or with `[]`), every stage decides as it does
//! for the canonical form: the route, the challenge's exemption, the
//! coalescing key, and what is forwarded.
//!
//! Tests only; the property runs a few hundred generated spellings per case.

use proptest::prelude::*;
use weir_http::target::{PathPolicy, Target};

use crate::admission::CoalesceKey;
use crate::challenge::{ChallengeConfig, Challenger};
use crate::gateway::Gateway;
use crate::identity::{AddrSource, ClientAddr, ClientId, PeerAddr};
use crate::policy::route::RequestView;

const CONFIG: &str = r#"
[[listeners]]
address = "127.0.0.1:0"
[pools.wiki]
servers = ["127.0.0.1:9"]
[[routes]]
pool = "wiki"
class = "expensive"
path_prefix = "/w/index.php"
query_keys = ["search", "diff"]
[[routes]]
pool = "wiki"
class = "special"
path_regex = '^/wiki/Special:'
[[routes]]
pool = "wiki"
class = "admin"
host = "admin.example"
[[routes]]
pool = "wiki"
class = "page"
"#;

/// Canonical URLs: (host, path, query).
const URLS: &[(&str, &str, &str)] = &[
    ("wiki.example", "/w/index.php", "search=a"),
    ("wiki.example", "/w/index.php", "title=X&diff=2"),
    ("wiki.example", "/w/index.php", "title=X"),
    ("wiki.example", "/wiki/Special:Search", "search=x"),
    ("wiki.example", "/wiki/Main_Page", ""),
    ("wiki.example", "/api/v1/items", ""),
    ("wiki.example", "/static/app.css", ""),
    ("wiki.example", "/index.php", "feed=atom"),
    ("admin.example", "/settings/users", ""),
];

/// One way to write a byte of a path or query key: as itself, or escaped
/// with lower or upper hex.
fn spell_byte(b: u8, how: u8) -> String {
    let unreserved = b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~');
    match how % 4 {
        1 if unreserved => format!("%{b:02x}"),
        2 if unreserved => format!("%{b:02X}"),
        _ => (b as char).to_string(),
    }
}

/// A spelling of `path`: each segment maybe escaped, preceded by `./`,
/// a repeated slash or a detour (`junk/../`), driven by `choices`.
fn spell_path(path: &str, choices: &[u8]) -> String {
    let mut c = choices.iter().copied().cycle();
    let mut out = String::new();
    for segment in path.split('/').skip(1) {
        match c.next().unwrap_or(0) % 6 {
            1 => out.push_str("/."),
            2 => out.push('/'),
            3 => out.push_str("/junk/.."),
            4 => out.push_str("/%2e/x/%2E%2E"),
            _ => {}
        }
        out.push('/');
        for b in segment.bytes() {
            // `:` is not unreserved: escaped, it must still match as `:`.
            if b == b':' && c.next().unwrap_or(0) % 2 == 1 {
                out.push_str("%3A");
            } else {
                out.push_str(&spell_byte(b, c.next().unwrap_or(0)));
            }
        }
    }
    out
}

/// A spelling of a query: keys escaped, or given `[]` (PHP's arrays).
fn spell_query(query: &str, choices: &[u8]) -> String {
    let mut c = choices.iter().copied().cycle();
    query
        .split('&')
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let key: String = k
                .bytes()
                .map(|b| spell_byte(b, c.next().unwrap_or(0)))
                .collect();
            let brackets = if c.next().unwrap_or(0) % 5 == 1 {
                "[]"
            } else {
                ""
            };
            format!("{key}{brackets}={v}")
        })
        .collect::<Vec<_>>()
        .join("&")
}

fn spell_host(host: &str, choices: &[u8]) -> String {
    let mut c = choices.iter().copied().cycle();
    let mut out: String = host
        .chars()
        .map(|ch| {
            if c.next().unwrap_or(0) % 2 == 1 {
                ch.to_ascii_uppercase()
            } else {
                ch
            }
        })
        .collect();
    if c.next().unwrap_or(0) % 3 == 1 {
        out.push('.');
    }
    out
}

struct Stages {
    gateway: Gateway,
    challenger: Challenger,
}

impl Stages {
    fn new() -> Stages {
        let env = std::collections::HashMap::<String, String>::new();
        let loaded = crate::config::load_str(CONFIG, None, &env).expect("test config");
        let config = ChallengeConfig {
            keys: vec!["0123456789abcdef0123456789abcdef".into()],
            ..ChallengeConfig::default()
        };
        Stages {
            gateway: Gateway::build(loaded, None, 1).expect("test gateway"),
            challenger: Challenger::new(&config).expect("test challenger"),
        }
    }

    /// What every stage decides for `target`, sent as `raw` with `Host: host`.
    fn decide(
        &self,
        target: &Target,
        raw: &str,
        host: &str,
    ) -> (Option<String>, bool, Option<CoalesceKey>, String) {
        let mut headers = http::HeaderMap::new();
        headers.insert("accept", http::HeaderValue::from_static("text/html"));
        let route = self
            .gateway
            .routes
            .find(&RequestView {
                target,
                headers: &headers,
            })
            .map(|r| r.class.as_str().to_string());
        let peer: std::net::SocketAddr = "203.0.113.7:5000".parse().expect("literal");
        let client = ClientId {
            peer: PeerAddr(peer),
            client: ClientAddr::new(peer.ip()),
            source: AddrSource::Peer,
        };
        let navigation = crate::challenge::is_navigation(&headers);
        let challenged = self
            .challenger
            .eligible(target, &headers, navigation, &client);
        let key = CoalesceKey::for_request(target, &http::HeaderMap::new());
        let mut forwarded = http::Request::builder()
            .uri(raw)
            .header(http::header::HOST, host)
            .body(())
            .expect("the spelling is a request");
        target.forward(&mut forwarded);
        let sent = format!(
            "{} {:?}",
            forwarded.uri(),
            forwarded.headers().get(http::header::HOST)
        );
        (route, challenged, key, sent)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn every_stage_decides_a_spelling_as_its_canonical_form(
        url in 0..URLS.len(),
        choices in prop::collection::vec(any::<u8>(), 1..64),
    ) {
        let stages = Stages::new();
        let (host, path, query) = URLS[url];
        let canonical_text = if query.is_empty() { path.to_string() } else { format!("{path}?{query}") };
        let canonical = Target::parse("GET", &canonical_text, Some(host), PathPolicy::default())
            .expect("canonical URLs read");
        let mut spelled = spell_path(path, &choices);
        if !query.is_empty() {
            spelled.push('?');
            spelled.push_str(&spell_query(query, &choices));
        }
        let spelled_host = spell_host(host, &choices);
        let target = Target::parse("GET", &spelled, Some(&spelled_host), PathPolicy::default())
            .expect("a spelling reads");
        prop_assert_eq!(target.path(), canonical.path(), "{}", spelled);
        prop_assert_eq!(target.match_path(), canonical.match_path(), "{}", spelled);
        prop_assert_eq!(target.host(), canonical.host());
        let (route, challenged, key, sent) = stages.decide(&target, &spelled, &spelled_host);
        let (want_route, want_challenged, want_key, want_sent) =
            stages.decide(&canonical, &canonical_text, host);
        prop_assert_eq!(route, want_route, "{} {}", spelled_host, spelled);
        prop_assert_eq!(challenged, want_challenged, "{}", spelled);
        // The path is forwarded canonical; the query as sent (the app reads
        // its keys as weir did).
        if spelled.split_once('?').map(|(_, q)| q) == Some(query) || query.is_empty() {
            prop_assert_eq!(key, want_key, "{}", spelled);
            prop_assert_eq!(sent, want_sent, "{}", spelled);
        }
    }

    #[test]
    fn reading_is_idempotent_and_never_panics(raw in "/[a-zA-Z0-9%./;:~_+\\-\\[\\]=&?]{0,40}") {
        if let Ok(t) = Target::parse("GET", &raw, Some("wiki.example"), PathPolicy::default()) {
            let again = Target::parse("GET", t.path_and_query(), Some("wiki.example"), PathPolicy::default())
                .expect("a canonical target reads");
            prop_assert_eq!(again.path_and_query(), t.path_and_query());
            prop_assert_eq!(again.match_path(), t.match_path());
        }
    }
}
