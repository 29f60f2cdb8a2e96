//! Verified-bot benchmarks: what a Web Bot Auth check costs a signed
//! request (the structured fields parsed, the signature base built, Ed25519
//! verified), against two baselines in the same run: a signature whose key
//! is unknown (everything but the signature check) and the test every
//! request pays when `[bots]` is configured (`BotVerifier::wants` on an
//! ordinary browser request).
//!
//! Run: `cargo bench --bench bots`; numbers are recorded in
//! `docs/admission.md` (verified bots).

#![allow(clippy::too_many_lines, reason = "a test or bench reads as one story")]

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use http::HeaderMap;
use weir::identity::bots::jwk::PublicKey;
use weir::identity::bots::signature::{Keyring, SignedRequest, verify};
use weir::identity::bots::{BotVerifier, Crawler};
use weir::identity::session::ManualWallClock;

/// The Web Bot Auth architecture draft's Ed25519 vector for `example.com`.
const INPUT: &str = r#"sig1=("@authority");created=1735689600;keyid="poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U";alg="ed25519";expires=1735693200;nonce="mYotfW3CUjI68sbGw6oKd7kyXqPjZEtU8xFPGWFrqOAf5qC6MDe3pys3SWWCudB0MvwslHy32WXUpkR7u0lt/w==";tag="web-bot-auth""#;
const SIGNATURE: &str = "sig1=:+NA/cssf4Y2bQTMTkyvTGRCaVzp9quyUevdwwMtMOWhhOOZ2T1subBj0BtvdnrpDEuwSAbiTeElXDzHL3WWKCw==:";
const NOW: u64 = 1_735_689_600;

fn signed() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("signature-input", INPUT.parse().expect("field"));
    h.insert("signature", SIGNATURE.parse().expect("field"));
    h
}

fn request(headers: &HeaderMap) -> SignedRequest<'_> {
    SignedRequest {
        method: "GET",
        scheme: "https",
        authority: "example.com",
        path: "/path/to/resource",
        query: None,
        headers,
    }
}

fn keyring(x: &str) -> Keyring {
    let mut keys = Keyring::default();
    keys.insert(&PublicKey::from_x(x).expect("key"), 0);
    keys
}

fn web_bot_auth(c: &mut Criterion) {
    let trusted = keyring("JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs");
    // Another key: the same parsing, no signature check.
    let other = keyring("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");
    let headers = signed();
    assert_eq!(verify(&request(&headers), &trusted, NOW, 60), Ok(0));
    let mut g = c.benchmark_group("web_bot_auth");
    g.bench_function("verify_signed_request", |b| {
        b.iter(|| verify(black_box(&request(&headers)), &trusted, NOW, 60))
    });
    g.bench_function("baseline_unknown_key_no_crypto", |b| {
        b.iter(|| verify(black_box(&request(&headers)), &other, NOW, 60))
    });
    let verifier = BotVerifier::new(
        vec![
            Crawler::new("examplebot", None, None),
            Crawler::new("googlebot", Some("Googlebot"), None),
        ],
        trusted.clone(),
        60,
        Arc::new(ManualWallClock::new(NOW)),
        None,
    )
    .expect("verifier");
    let mut browser = HeaderMap::new();
    browser.insert(
        "user-agent",
        "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/140.0 Safari/537.36"
            .parse()
            .expect("field"),
    );
    browser.insert("accept", "text/html".parse().expect("field"));
    g.bench_function("baseline_unsigned_browser_wants", |b| {
        b.iter(|| verifier.wants(black_box(&browser)))
    });
    g.finish();
}

criterion_group!(benches, web_bot_auth);
criterion_main!(benches);
