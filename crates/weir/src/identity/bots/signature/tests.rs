//! Tests of [`super::verify`] and [`super::signature_base`]: the published
//! Ed25519 vectors (RFC 9421 B.2.6, the Web Bot Auth architecture draft's
//! `web_bot_auth_architecture_v1.json`), then one line per way a signature
//! fails, signed here with a fresh `ring` key.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use http::HeaderMap;
use ring::signature::{Ed25519KeyPair, KeyPair as _};

use super::*;

/// RFC 9421 B.1.4 `test-key-ed25519`, used by every vector below.
const TEST_X: &str = "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs";
/// 2025-01-01T00:00:00Z, inside the vectors' `created..expires`.
const VECTOR_NOW: u64 = 1_735_689_600;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    h
}

fn request<'a>(authority: &'a str, headers: &'a HeaderMap) -> SignedRequest<'a> {
    SignedRequest {
        method: "GET",
        scheme: "https",
        authority,
        path: "/path/to/resource",
        query: None,
        headers,
    }
}

fn ring_with(x: &str, bot: usize) -> Keyring {
    let mut keys = Keyring::default();
    keys.insert(&PublicKey::from_x(x).unwrap(), bot);
    keys
}

fn inner_list(signature_input: &str, label: &str) -> InnerList {
    let dict: Dictionary = Parser::new(signature_input).parse().unwrap();
    match dict.get(label) {
        Some(ListEntry::InnerList(l)) => l.clone(),
        other => panic!("{other:?}"),
    }
}

/// RFC 9421 B.2.6: the published signature base, byte for byte, and its
/// signature verifies against the published key. (No `tag`: it is not a
/// Web Bot Auth signature, so only the base and the key are checked here.)
#[test]
fn rfc9421_b26_signature_base_and_signature() {
    let input = r#"sig-b26=("date" "@method" "@path" "@authority" "content-type" "content-length");created=1618884473;keyid="test-key-ed25519""#;
    let sig =
        "wqcAqbmYJ2ji2glfAMaRy4gruYYnx2nEFN2HN6jrnDnQCK1u02Gb04v9EDgwUPiu4A0w6vuQv5lIp5WPpBKRCw==";
    let h = headers(&[
        ("date", "Tue, 20 Apr 2021 02:07:55 GMT"),
        ("content-type", "application/json"),
        ("content-length", "18"),
    ]);
    let req = SignedRequest {
        method: "POST",
        scheme: "https",
        authority: "example.com",
        path: "/foo",
        query: Some("param=Value&Pet=dog"),
        headers: &h,
    };
    let base = signature_base(&req, &inner_list(input, "sig-b26")).unwrap();
    let want = [
        r#""date": Tue, 20 Apr 2021 02:07:55 GMT"#,
        r#""@method": POST"#,
        r#""@path": /foo"#,
        r#""@authority": example.com"#,
        r#""content-type": application/json"#,
        r#""content-length": 18"#,
        r#""@signature-params": ("date" "@method" "@path" "@authority" "content-type" "content-length");created=1618884473;keyid="test-key-ed25519""#,
    ]
    .join("\n");
    assert_eq!(base, want);
    let key = PublicKey::from_x(TEST_X).unwrap();
    ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, key.bytes)
        .verify(base.as_bytes(), &STANDARD.decode(sig).unwrap())
        .expect("RFC 9421 B.2.6 verifies");
}

/// The Ed25519 vectors of the Web Bot Auth architecture draft (generated
/// by its reference implementation): one covering `@authority`, one also
/// covering `signature-agent`.
#[test]
fn web_bot_auth_draft_vectors_verify() {
    let vectors: [(&str, &str, Option<&str>); 2] = [
        (
            r#"sig1=("@authority");created=1735689600;keyid="poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U";alg="ed25519";expires=1735693200;nonce="mYotfW3CUjI68sbGw6oKd7kyXqPjZEtU8xFPGWFrqOAf5qC6MDe3pys3SWWCudB0MvwslHy32WXUpkR7u0lt/w==";tag="web-bot-auth""#,
            "sig1=:+NA/cssf4Y2bQTMTkyvTGRCaVzp9quyUevdwwMtMOWhhOOZ2T1subBj0BtvdnrpDEuwSAbiTeElXDzHL3WWKCw==:",
            None,
        ),
        (
            r#"sig2=("@authority" "signature-agent");created=1735689600;keyid="poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U";alg="ed25519";expires=1735693200;nonce="e8N7S2MFd/qrd6T2R3tdfAuuANngKI7LFtKYI/vowzk4lAZYadIX6wW25MwG7DCT9RUKAJ0qVkU0mEeLElW1qg==";tag="web-bot-auth""#,
            "sig2=:jdq0SqOwHdyHr9+r5jw3iYZH6aNGKijYp/EstF4RQTQdi5N5YYKrD+mCT1HA1nZDsi6nJKuHxUi/5Syp3rLWBA==:",
            Some(r#""https://signature-agent.test""#),
        ),
    ];
    let keys = ring_with(TEST_X, 7);
    for (input, signature, agent) in vectors {
        let mut pairs = vec![("signature-input", input), ("signature", signature)];
        pairs.extend(agent.map(|a| ("signature-agent", a)));
        let h = headers(&pairs);
        assert_eq!(
            verify(&request("example.com", &h), &keys, VECTOR_NOW, 60),
            Ok(7),
            "{input}"
        );
        // The same signature for another site is not valid there.
        assert_eq!(
            verify(&request("example.org", &h), &keys, VECTOR_NOW, 60),
            Err(Rejection::BadSignature)
        );
    }
}

/// A crawler's key, made fresh, and a request it signs.
struct Signer {
    pair: Ed25519KeyPair,
    keyid: String,
}

impl Signer {
    fn new() -> Signer {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        let bytes: [u8; 32] = pair.public_key().as_ref().try_into().unwrap();
        Signer {
            keyid: super::super::jwk::thumbprint(&bytes),
            pair,
        }
    }

    fn x(&self) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.pair.public_key().as_ref())
    }

    /// Signs `authority` with the inner list `("components");params`;
    /// `{keyid}` in `params` is replaced by this key's thumbprint. Returns
    /// the two fields' values.
    fn sign(&self, authority: &str, agent: Option<&str>, inner: &str) -> (String, String) {
        let inner = inner.replace("{keyid}", &self.keyid);
        let input = format!("sig1={inner}");
        let mut pairs = vec![];
        pairs.extend(agent.map(|a| ("signature-agent", a)));
        let h = headers(&pairs);
        let base = signature_base(&request(authority, &h), &inner_list(&input, "sig1")).unwrap();
        let sig = STANDARD.encode(self.pair.sign(base.as_bytes()).as_ref());
        (input, format!("sig1=:{sig}:"))
    }
}

#[test]
fn what_a_signature_must_be() {
    let now = 1_800_000_000u64;
    let good = format!(
        r#"("@authority");created={};expires={};keyid="{{keyid}}";alg="ed25519";tag="web-bot-auth""#,
        now - 10,
        now + 300
    );
    let signer = Signer::new();
    let stranger = Signer::new();
    let keys = ring_with(&signer.x(), 0);
    let t = |created: u64, expires: u64| {
        format!(
            r#"("@authority");created={created};expires={expires};keyid="{{keyid}}";tag="web-bot-auth""#
        )
    };
    type Case<'a> = (
        &'a str,
        &'a Signer,
        String,
        Option<&'a str>,
        Result<usize, Rejection>,
    );
    let cases: Vec<Case> = vec![
        ("good", &signer, good.clone(), None, Ok(0)),
        (
            "no alg is fine",
            &signer,
            t(now - 10, now + 300),
            None,
            Ok(0),
        ),
        (
            "skew: created a little ahead",
            &signer,
            t(now + 30, now + 300),
            None,
            Ok(0),
        ),
        (
            "skew: expired a little ago",
            &signer,
            t(now - 300, now - 30),
            None,
            Ok(0),
        ),
        (
            "created in the future",
            &signer,
            t(now + 120, now + 300),
            None,
            Err(Rejection::NotYetValid),
        ),
        (
            "expired",
            &signer,
            t(now - 600, now - 120),
            None,
            Err(Rejection::Expired),
        ),
        (
            "expires before created",
            &signer,
            t(now - 10, now - 20),
            None,
            Err(Rejection::Expired),
        ),
        (
            "unknown key",
            &stranger,
            good.clone(),
            None,
            Err(Rejection::UnknownKey),
        ),
        (
            "other tag",
            &signer,
            good.replace("web-bot-auth", "other"),
            None,
            Err(Rejection::NotWebBotAuth),
        ),
        (
            "other alg",
            &signer,
            good.replace("\"ed25519\"", "\"rsa-pss-sha512\""),
            None,
            Err(Rejection::Malformed),
        ),
        (
            "alg not a string",
            &signer,
            good.replace("\"ed25519\"", "ed25519"),
            None,
            Err(Rejection::Malformed),
        ),
        (
            "no expires",
            &signer,
            good.replace(&format!(";expires={}", now + 300), ""),
            None,
            Err(Rejection::Malformed),
        ),
        (
            "no created",
            &signer,
            good.replace(&format!(";created={}", now - 10), ""),
            None,
            Err(Rejection::Malformed),
        ),
        (
            "no keyid",
            &signer,
            good.replace(r#";keyid="{keyid}""#, ""),
            None,
            Err(Rejection::Malformed),
        ),
        (
            "authority not covered",
            &signer,
            good.replace(r#"("@authority")"#, r#"("@method")"#),
            None,
            Err(Rejection::NotCovered),
        ),
        (
            "agent sent, not covered",
            &signer,
            good.clone(),
            Some(r#""https://a.example""#),
            Err(Rejection::NotCovered),
        ),
        (
            "agent covered",
            &signer,
            good.replace(r#"("@authority")"#, r#"("@authority" "signature-agent")"#),
            Some(r#""https://a.example""#),
            Ok(0),
        ),
        (
            "agent member covered",
            &signer,
            good.replace(
                r#"("@authority")"#,
                r#"("@authority" "signature-agent";key="sig1")"#,
            ),
            Some(r#"sig1="https://a.example""#),
            Ok(0),
        ),
        (
            "component twice",
            &signer,
            good.replace(r#"("@authority")"#, r#"("@authority" "@authority")"#),
            None,
            Err(Rejection::Malformed),
        ),
        (
            "unsupported component",
            &signer,
            good.replace(r#"("@authority")"#, r#"("@authority" "@status")"#),
            None,
            Err(Rejection::Malformed),
        ),
        (
            "unsupported parameter",
            &signer,
            good.replace(
                r#"("@authority")"#,
                r#"("@authority" "signature-agent";bs)"#,
            ),
            Some(r#""x""#),
            Err(Rejection::Malformed),
        ),
    ];
    for (name, by, inner, agent, want) in cases {
        let (input, signature) = match (name, want) {
            // Cases the signer itself cannot build a base for: sign the
            // good list, then swap in the case's.
            (_, Err(Rejection::Malformed)) => {
                let (_, sig) = by.sign("wiki.example", None, &good);
                (format!("sig1={}", inner.replace("{keyid}", &by.keyid)), sig)
            }
            _ => by.sign("wiki.example", agent, &inner),
        };
        let mut pairs = vec![
            ("signature-input", input.as_str()),
            ("signature", signature.as_str()),
        ];
        pairs.extend(agent.map(|a| ("signature-agent", a)));
        let h = headers(&pairs);
        let got = verify(&request("wiki.example", &h), &keys, now, 60);
        assert_eq!(got, want, "{name}: {input}");
    }
}

#[test]
fn tampering_and_garbage() {
    let now = 1_800_000_000u64;
    let signer = Signer::new();
    let keys = ring_with(&signer.x(), 3);
    let inner = format!(
        r#"("@authority" "signature-agent");created={};expires={};keyid="{{keyid}}";tag="web-bot-auth""#,
        now,
        now + 60
    );
    let agent = r#""https://crawler.example""#;
    let (input, signature) = signer.sign("wiki.example", Some(agent), &inner);
    type Case<'a> = (&'a str, &'a str, &'a str, &'a str, Result<usize, Rejection>);
    let cases: &[Case] = &[
        // name, signature-input, signature, signature-agent, want
        ("as signed", &input, &signature, agent, Ok(3)),
        (
            "other agent",
            &input,
            &signature,
            r#""https://evil.example""#,
            Err(Rejection::BadSignature),
        ),
        (
            "signature of another label",
            &input,
            &signature.replace("sig1=", "sig2="),
            agent,
            Err(Rejection::Malformed),
        ),
        (
            "signature not bytes",
            &input,
            r#"sig1="abc""#,
            agent,
            Err(Rejection::Malformed),
        ),
        (
            "flipped bytes",
            &input,
            &signature.replacen(':', ":AAAA", 1),
            agent,
            Err(Rejection::BadSignature),
        ),
        (
            "input not a dictionary",
            "(((",
            &signature,
            agent,
            Err(Rejection::Malformed),
        ),
        (
            "input an item, not a list",
            r#"sig1="x""#,
            &signature,
            agent,
            Err(Rejection::NotWebBotAuth),
        ),
    ];
    for (name, input, signature, agent, want) in cases {
        let h = headers(&[
            ("signature-input", input),
            ("signature", signature),
            ("signature-agent", agent),
        ]);
        assert_eq!(
            verify(&request("wiki.example", &h), &keys, now, 60),
            *want,
            "{name}"
        );
    }
    // A second, untagged member beside the tagged one is ignored.
    let both = format!(r#"other=("@method");created=1, {input}"#);
    let h = headers(&[
        ("signature-input", &both),
        ("signature", &format!("other=:AAAA:, {signature}")),
        ("signature-agent", agent),
    ]);
    assert_eq!(verify(&request("wiki.example", &h), &keys, now, 60), Ok(3));
    assert!(is_signed(&h));
    assert!(!is_signed(&headers(&[("signature", "x=:AA==:")])));
}

#[test]
fn derived_components() {
    let h = headers(&[("x-a", " one "), ("x-a", "two")]);
    let req = SignedRequest {
        method: "GET",
        scheme: "https",
        authority: "Wiki.Example:8443",
        path: "/w/index.php",
        query: Some("title=A&action=raw"),
        headers: &h,
    };
    let cases = [
        (r#""@method""#, "GET"),
        (r#""@authority""#, "wiki.example:8443"),
        (r#""@scheme""#, "https"),
        (r#""@path""#, "/w/index.php"),
        (r#""@query""#, "?title=A&action=raw"),
        (
            r#""@target-uri""#,
            "https://Wiki.Example:8443/w/index.php?title=A&action=raw",
        ),
        (r#""@request-target""#, "/w/index.php?title=A&action=raw"),
        (r#""x-a""#, "one, two"),
    ];
    for (component, want) in cases {
        let list = inner_list(&format!("s=({component})"), "s");
        let base = signature_base(&req, &list).unwrap();
        let first = base.lines().next().unwrap();
        assert_eq!(first, format!("{component}: {want}"));
    }
    let missing = inner_list(r#"s=("x-missing")"#, "s");
    assert_eq!(signature_base(&req, &missing), Err(Rejection::Malformed));
}
