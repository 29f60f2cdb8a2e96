//! A crawler that signs its requests with Web Bot Auth: a fresh Ed25519
//! key, and the `Signature-Agent`, `Signature-Input` and `Signature` fields
//! the architecture draft asks for. For the tests of verified crawlers.
//!
//! Does not: serve a key directory (tests give weir the key's `x`).

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::signature::{Ed25519KeyPair, KeyPair as _};

/// A crawler's Ed25519 key, made fresh, signing requests the way the Web
/// Bot Auth architecture draft says (written here from the RFC, not with
/// weir's code, so the two check each other).
pub struct Crawler {
    pair: Ed25519KeyPair,
}

impl Crawler {
    pub fn new() -> Crawler {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        Crawler {
            pair: Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap(),
        }
    }

    /// The JWK's `x`.
    pub fn x(&self) -> String {
        URL_SAFE_NO_PAD.encode(self.pair.public_key().as_ref())
    }

    /// RFC 7638: SHA-256 over `{"crv","kty","x"}` in that order.
    pub fn keyid(&self) -> String {
        let jwk = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{}"}}"#, self.x());
        URL_SAFE_NO_PAD.encode(ring::digest::digest(&ring::digest::SHA256, jwk.as_bytes()))
    }

    /// `Signature-Agent`, `Signature-Input` and `Signature` for a request
    /// to `authority`, valid from `created` for `lifetime` seconds.
    pub fn sign(&self, authority: &str, created: u64, lifetime: u64) -> [(String, String); 3] {
        let agent = r#""https://crawler.example""#;
        let params = format!(
            r#"("@authority" "signature-agent");created={created};expires={};keyid="{}";alg="ed25519";nonce="n{created}";tag="web-bot-auth""#,
            created + lifetime,
            self.keyid()
        );
        let base = format!(
            "\"@authority\": {authority}\n\"signature-agent\": {agent}\n\"@signature-params\": {params}"
        );
        let signature = STANDARD.encode(self.pair.sign(base.as_bytes()).as_ref());
        [
            ("signature-agent".into(), agent.into()),
            ("signature-input".into(), format!("sig1={params}")),
            ("signature".into(), format!("sig1=:{signature}:")),
        ]
    }
}
