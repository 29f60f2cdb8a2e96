//! The bodies of weir's fuzz targets: one function per parser fed by the
//! network or by operators. Each takes arbitrary bytes, runs the parser as
//! weir runs it, and panics only when an invariant breaks (a parser that
//! panics, loops, or accepts what it should refuse).
//!
//! `fuzz/` (cargo-fuzz, nightly) wraps each in a libFuzzer target of the
//! same name; `scripts/fuzz.sh` runs them. The tests of this crate run every
//! target over its corpus in `fuzz/corpus/NAME` and a few thousand seeded
//! mutations of it on stable, so CI sees a parser regress without nightly.
//!
//! This crate owns no parser: each lives where weir uses it.

#![cfg_attr(
    test,
    allow(clippy::too_many_lines, reason = "a test reads as one story")
)]

mod differential;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use bytes::BytesMut;
use http::{HeaderMap, HeaderName, HeaderValue};
use weir::identity::forwarded::{ForwardedHeader, resolve};
use weir::identity::trusted::TrustedProxies;
use weir::identity::{AddrSource, ClientAddr, ClientId, PeerAddr};
use weir_http::framing::{Chunk, decode_chunk};
use weir_http::server::{HeadLimits, read_head};
use weir_http::target::{PathPolicy, Target as CanonicalTarget};

pub use differential::http1_request_vs_hyper;

/// A fuzz target's body: arbitrary bytes in, a panic on a broken invariant.
pub type Target = fn(&[u8]);

/// Every target, by the name its corpus directory and libFuzzer binary have.
pub const TARGETS: &[(&str, Target)] = &[
    ("http1_request_head", http1_request_head),
    ("http1_request_vs_hyper", http1_request_vs_hyper),
    ("chunked_body", chunked_body),
    ("response_head", response_head),
    ("canonical_target", canonical_target),
    ("proxy_protocol", proxy_protocol),
    ("forwarded_headers", forwarded_headers),
    ("cookies", cookies),
    ("challenge_answer", challenge_answer),
    ("pass_token", pass_token),
    ("web_bot_auth", web_bot_auth),
    ("config_toml", config_toml),
    ("replay_line", replay_line),
    ("snapshot_file", snapshot_file),
];

/// The limits a listener has by default.
pub const LIMITS: HeadLimits = HeadLimits {
    max_bytes: 32 * 1024,
    max_headers: 100,
};

/// The HTTP/1 request head as a plain connection reads it; an accepted
/// head is read again into the canonical target, and its length is what it
/// said.
pub fn http1_request_head(data: &[u8]) {
    match read_head(data, LIMITS) {
        Ok(Some(head)) => {
            assert!(head.len <= data.len() && head.len <= LIMITS.max_bytes);
            assert!(
                data[..head.len].ends_with(b"\n"),
                "a head ends at its blank line"
            );
            let _ = CanonicalTarget::from_parts(
                &head.method,
                &head.uri,
                head.version,
                &head.headers,
                PathPolicy::default(),
            );
        }
        Ok(None) => assert!(data.len() < LIMITS.max_bytes, "a full buffer is an answer"),
        Err(e) => {
            let _ = (e.label(), e.reply_status());
        }
    }
}

/// A chunked body fed in pieces of the sizes the first byte picks: the
/// data out is never more than the bytes in, and an error is final.
pub fn chunked_body(data: &[u8]) {
    let Some((&step, rest)) = data.split_first() else {
        return;
    };
    let step = usize::from(step % 16) + 1;
    let mut chunk = Chunk::Size;
    let mut buf = BytesMut::new();
    let mut out = 0usize;
    for piece in rest.chunks(step) {
        buf.extend_from_slice(piece);
        loop {
            match decode_chunk(&mut chunk, &mut buf) {
                Ok(Some(bytes)) => {
                    assert!(!bytes.is_empty(), "no empty data frames");
                    out += bytes.len();
                    assert!(out <= rest.len());
                }
                Ok(None) => break,
                Err(_) => return,
            }
            if matches!(chunk, Chunk::Done) {
                return;
            }
        }
    }
}

/// A response head from an upstream, as weir's client reads it (a HEAD
/// request's too).
pub fn response_head(data: &[u8]) {
    for head_request in [false, true] {
        let mut buf = BytesMut::from(data);
        if let Ok(Some(_)) = weir_http::client::parse_head(&mut buf, head_request) {
            assert!(buf.len() <= data.len());
        }
    }
}

/// The canonical target from a method, target and host split at the first
/// two newlines: an accepted target is canonical (reading its own path
/// again changes nothing), and its host is lowercase.
pub fn canonical_target(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(3, '\n');
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return;
    };
    let host = parts.next();
    for policy in [
        PathPolicy::default(),
        PathPolicy {
            keep_encoded_slash: true,
        },
    ] {
        let Ok(t) = CanonicalTarget::parse(method, target, host, policy) else {
            continue;
        };
        if let Some(h) = t.host() {
            assert_eq!(h, h.to_ascii_lowercase(), "hosts are lowercase");
        }
        let again = CanonicalTarget::parse(method, t.path_and_query(), host, policy)
            .unwrap_or_else(|e| panic!("{:?} does not read back: {e}", t.path_and_query()));
        assert_eq!(again.path(), t.path(), "normalising is idempotent");
        assert_eq!(again.query(), t.query());
    }
}

/// A PROXY protocol v1 or v2 header: a parsed one is no longer than its
/// input.
pub fn proxy_protocol(data: &[u8]) {
    if let Ok(weir_http::proxy_protocol::Parsed::Complete { header, consumed }) =
        weir_http::proxy_protocol::parse(data)
    {
        assert!(consumed <= data.len());
        assert!(header.version == 1 || header.version == 2);
    }
}

/// `X-Forwarded-For` and `Forwarded` lines split from the input at
/// newlines, resolved behind a trusted peer: the client is an address the
/// header named or the peer.
pub fn forwarded_headers(data: &[u8]) {
    let trusted = TrustedProxies::parse(&["127.0.0.0/8", "10.0.0.0/8"]).expect("literal ranges");
    let peer = PeerAddr(SocketAddr::from((Ipv4Addr::LOCALHOST, 4000)));
    for (name, which) in [
        ("x-forwarded-for", ForwardedHeader::XForwardedFor),
        ("forwarded", ForwardedHeader::Forwarded),
    ] {
        let mut headers = HeaderMap::new();
        for line in data.split(|&b| b == b'\n') {
            if let Ok(v) = HeaderValue::from_bytes(line) {
                headers.append(HeaderName::from_static(name), v);
            }
        }
        let resolved = resolve(peer, None, &headers, &trusted, which);
        let _ = resolved.client.client.ip();
    }
}

/// `Cookie` lines: every value found for a name is a substring of a line.
pub fn cookies(data: &[u8]) {
    let mut headers = HeaderMap::new();
    for line in data.split(|&b| b == b'\n') {
        if let Ok(v) = HeaderValue::from_bytes(line) {
            headers.append(http::header::COOKIE, v);
        }
    }
    // A value is a slice of one of the lines, checked by address (ranges
    // sorted, binary search): searching the input for each value made this
    // target quadratic.
    let mut lines: Vec<(usize, usize)> = headers
        .get_all(http::header::COOKIE)
        .iter()
        .map(|v| (v.as_bytes().as_ptr() as usize, v.len()))
        .map(|(start, len)| (start, start + len))
        .collect();
    lines.sort_unstable();
    let within = |v: &str| {
        let (start, end) = (v.as_ptr() as usize, v.as_ptr() as usize + v.len());
        let i = lines.partition_point(|&(s, _)| s <= start);
        i > 0 && end <= lines[i - 1].1
    };
    for name in ["weir_pass", "session", ""] {
        for v in weir_http::cookie::values(&headers, name) {
            assert!(v.is_empty() || within(v), "a cookie value outside its line");
        }
        let _ = weir_http::cookie::value(&headers, name);
    }
}

/// A gateway with a challenge, built once.
fn challenging() -> &'static weir::gateway::Gateway {
    static GATEWAY: OnceLock<weir::gateway::Gateway> = OnceLock::new();
    GATEWAY.get_or_init(|| {
        let config = "[[listeners]]\naddress = \"127.0.0.1:0\"\n[pools.app]\nservers = [\"127.0.0.1:9\"]\n\
             [[routes]]\npool = \"app\"\nclass = \"page\"\n[classes.page]\nchallenge = \"always\"\n\
             [challenge]\nkeys = [\"fuzz-key-0123456789abcdef0123456789\"]\ndifficulty = 8\n";
        let env = std::collections::HashMap::<String, String>::new();
        let loaded = weir::config::load_str(config, None, &env).expect("the fuzz config loads");
        weir::gateway::Gateway::build(loaded, None, 1).expect("the fuzz config builds")
    })
}

fn client() -> ClientId {
    let ip = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7));
    ClientId {
        peer: PeerAddr(SocketAddr::new(ip, 5000)),
        client: ClientAddr::new(ip),
        source: AddrSource::Peer,
    }
}

/// The challenge's answer form posted to its verify endpoint: answered,
/// whatever the body.
pub fn challenge_answer(data: &[u8]) {
    let gw = challenging();
    let ch = gw
        .challenger
        .as_ref()
        .expect("the fuzz config has a challenge");
    let target = CanonicalTarget::parse(
        "POST",
        "/.weir/challenge/verify",
        Some("t"),
        PathPolicy::default(),
    )
    .expect("literal target");
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-www-form-urlencoded"),
    );
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let client = client();
    let asker = weir::challenge::Asker {
        client: &client,
        headers: &headers,
        tls: false,
    };
    let budget = weir::challenge::ChallengeBudget::default();
    let at = weir::challenge::At {
        now,
        budget: &budget,
    };
    let answered = ch.handle(&target, asker, data, at);
    // Answered (a pass, or back to the page) or refused as junk; a forged
    // answer never earns a pass.
    match answered {
        Some(Ok(resp)) => assert!(
            resp.headers().get(http::header::SET_COOKIE).is_none()
                && !resp.headers()[http::header::LOCATION]
                    .as_bytes()
                    .windows(10)
                    .any(|w| w == b"weir_pass="),
            "a pass for an answer nobody was asked"
        ),
        Some(Err(_)) => {}
        None => panic!("a POST to the verify path is always the challenge's"),
    }
}

/// A pass-token cookie: a forged one never passes.
pub fn pass_token(data: &[u8]) {
    let gw = challenging();
    let ch = gw
        .challenger
        .as_ref()
        .expect("the fuzz config has a challenge");
    let Ok(value) = HeaderValue::from_bytes(&[b"weir_pass=", data].concat()) else {
        return;
    };
    let mut headers = HeaderMap::new();
    headers.insert(http::header::COOKIE, value);
    let check = ch.pass(&headers, &client(), SystemTime::now());
    assert!(
        !matches!(check, weir::challenge::PassCheck::Valid(_)),
        "a token nobody signed passed"
    );
}

/// The Web Bot Auth test vectors' signatures (RFC 9421's Ed25519 test key
/// over `example.com`): the only ones [`web_bot_auth`] may see verify.
const WEB_BOT_AUTH_SIGNATURES: [&str; 2] = [
    "+NA/cssf4Y2bQTMTkyvTGRCaVzp9quyUevdwwMtMOWhhOOZ2T1subBj0BtvdnrpDEuwSAbiTeElXDzHL3WWKCw==",
    "jdq0SqOwHdyHr9+r5jw3iYZH6aNGKijYp/EstF4RQTQdi5N5YYKrD+mCT1HA1nZDsi6nJKuHxUi/5Syp3rLWBA==",
];

/// A Web Bot Auth request: its `Signature-Input`, `Signature` and
/// `Signature-Agent` fields (the input's first three lines), checked
/// against RFC 9421's Ed25519 test key at the vectors' time. A signature
/// that key never made (here: any but the published vectors') never
/// verifies.
pub fn web_bot_auth(data: &[u8]) {
    use weir::identity::bots::jwk::PublicKey;
    use weir::identity::bots::signature::{Keyring, SignedRequest, verify};
    static KEYS: OnceLock<Keyring> = OnceLock::new();
    let keys = KEYS.get_or_init(|| {
        let mut keys = Keyring::default();
        let key = PublicKey::from_x("JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs")
            .expect("RFC 9421's test key");
        keys.insert(&key, 0);
        keys
    });
    let mut headers = HeaderMap::new();
    let names = ["signature-input", "signature", "signature-agent"];
    for (name, line) in names.iter().zip(data.splitn(3, |b| *b == b'\n')) {
        let Ok(value) = HeaderValue::from_bytes(line) else {
            return;
        };
        headers.insert(*name, value);
    }
    let req = SignedRequest {
        method: "GET",
        scheme: "https",
        authority: "example.com",
        path: "/path/to/resource",
        query: None,
        headers: &headers,
    };
    if verify(&req, keys, 1_735_689_600, 60).is_ok() {
        let signature = headers
            .get("signature")
            .map(HeaderValue::as_bytes)
            .unwrap_or_default();
        let published = WEB_BOT_AUTH_SIGNATURES
            .iter()
            .any(|s| signature.windows(s.len()).any(|w| w == s.as_bytes()));
        assert!(published, "a signature nobody made verified");
    }
}

/// A configuration file: loaded and built, or refused with errors that
/// name a line or key; never a panic.
pub fn config_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let env = std::collections::HashMap::<String, String>::new();
    match weir::config::load_str(text, Some(Path::new("fuzz.toml")), &env) {
        Ok(loaded) => {
            if let Err(errors) = weir::gateway::Gateway::build(loaded, None, 1) {
                assert!(!errors.0.is_empty());
            }
        }
        Err(errors) => assert!(!errors.0.is_empty(), "a refusal says why"),
    }
}

/// One access-log line in each format weir replays.
pub fn replay_line(data: &[u8]) {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    for format in [
        weir_replay::LogFormat::Combined,
        weir_replay::LogFormat::Caddy,
        weir_replay::LogFormat::Weir,
    ] {
        let _ = weir_replay::parse_line(format, line, &[]);
    }
}

/// A snapshot file: read, or refused with an error naming the file.
pub fn snapshot_file(data: &[u8]) {
    let path = Path::new("fuzz.snap");
    match weir_limiter::Snapshot::read_bytes(path, data) {
        Ok(snap) => {
            let keys: usize = snap.sections.iter().map(|s| s.entries.len()).sum();
            assert!(keys * 16 <= data.len());
        }
        Err(e) => assert!(e.to_string().contains("fuzz.snap")),
    }
}
