//! Signing keys and the client binding shared by pass tokens and challenges.
//!
//! Owns: turning configured secrets into HMAC-SHA256 keys, one set per
//! purpose (a pass token and a challenge nonce are signed with different
//! derived keys, so one can never be passed off as the other); and
//! [`Binding`], the 8-byte digests of the client's network and User-Agent
//! that both carry. Does not: encode or parse anything (see `token.rs`,
//! `pow.rs`).

use std::net::IpAddr;

use ring::{digest, hmac};

use super::config::ChallengeConfigError;
use crate::identity::{ClientAddr, Level, PrefixKey};

/// The shortest secret accepted: HMAC-SHA256 gains nothing beyond 32 bytes
/// and anything much shorter can be brute-forced offline from one cookie.
pub const MIN_KEY_BYTES: usize = 32;

/// The HMAC keys of one purpose: the first signs, all verify (rotation).
#[derive(Clone)]
pub struct Keyring {
    keys: Vec<hmac::Key>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        write!(f, "Keyring({} keys)", self.keys.len())
    }
}

/// What a key signs: each purpose derives its own key from every secret.
#[derive(Debug, Clone, Copy)]
pub enum Purpose {
    PassToken,
    PowChallenge,
    /// The visit cookie (`crate::visit`).
    Visit,
}

impl Purpose {
    fn label(self) -> &'static [u8] {
        match self {
            Purpose::PassToken => b"weir pass token v1",
            Purpose::PowChallenge => b"weir pow challenge v1",
            Purpose::Visit => b"weir visit v1",
        }
    }
}

impl Keyring {
    /// Derives this purpose's keys from the configured secrets, checking
    /// that there is at least one and each is long enough and unique.
    pub fn new<S: AsRef<str>>(
        secrets: &[S],
        purpose: Purpose,
    ) -> Result<Keyring, ChallengeConfigError> {
        if secrets.is_empty() {
            return Err(ChallengeConfigError::NoKeys);
        }
        let mut keys = Vec::with_capacity(secrets.len());
        for (index, secret) in secrets.iter().enumerate() {
            let secret = secret.as_ref().as_bytes();
            if secret.len() < MIN_KEY_BYTES {
                return Err(ChallengeConfigError::ShortKey {
                    index,
                    len: secret.len(),
                    min: MIN_KEY_BYTES,
                });
            }
            if let Some(first) = secrets[..index]
                .iter()
                .position(|s| s.as_ref().as_bytes() == secret)
            {
                return Err(ChallengeConfigError::DuplicateKey { index, first });
            }
            // Derived key = HMAC(secret, purpose label): the secret itself
            // never signs anything directly.
            let root = hmac::Key::new(hmac::HMAC_SHA256, secret);
            let derived = hmac::sign(&root, purpose.label());
            keys.push(hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref()));
        }
        Ok(Keyring { keys })
    }

    /// The tag of `message` under the current (first) key.
    pub fn sign(&self, message: &[u8]) -> [u8; TAG_LEN] {
        let mut out = [0u8; TAG_LEN];
        // `new` refuses an empty list, so the first key exists.
        if let Some(key) = self.keys.first() {
            out.copy_from_slice(hmac::sign(key, message).as_ref());
        }
        out
    }

    /// Whether any key made `tag` for `message` (constant-time per key).
    pub fn verify(&self, message: &[u8], tag: &[u8]) -> bool {
        self.keys
            .iter()
            .any(|key| hmac::verify(key, message, tag).is_ok())
    }
}

/// Bytes in an HMAC-SHA256 tag.
pub const TAG_LEN: usize = 32;

/// Who a token or challenge is bound to: digests of the client's network and
/// User-Agent. Digests, not the values: fixed size, and the cookie does not
/// spell out the address to anyone who reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    pub prefix: [u8; 8],
    pub agent: [u8; 8],
}

impl Binding {
    pub fn of(client: ClientAddr, user_agent: &[u8]) -> Binding {
        Binding {
            prefix: digest8(b"prefix\0", binding_prefix(client).to_string().as_bytes()),
            agent: digest8(b"agent\0", user_agent),
        }
    }
}

/// The network a pass is bound to: /24 for IPv4 (a carrier-grade NAT or a
/// home router may move a phone between addresses of one /24, rarely
/// further), /48 for IPv6 (privacy addresses change the interface bits and
/// many providers hand out a fresh /64 per connection inside one /48).
pub fn binding_prefix(client: ClientAddr) -> PrefixKey {
    match client.ip() {
        IpAddr::V4(_) => client.key(Level::Subnet),
        IpAddr::V6(_) => client.key(Level::Network),
    }
}

fn digest8(domain: &[u8], value: &[u8]) -> [u8; 8] {
    let mut ctx = digest::Context::new(&digest::SHA256);
    ctx.update(domain);
    ctx.update(value);
    let full = ctx.finish();
    let mut out = [0u8; 8];
    out.copy_from_slice(&full.as_ref()[..8]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    fn addr(s: &str) -> ClientAddr {
        ClientAddr::new(s.parse().unwrap())
    }

    #[test]
    fn key_checks() {
        let cases: &[(&[&str], Option<ChallengeConfigError>)] = &[
            (&[], Some(ChallengeConfigError::NoKeys)),
            (
                &["short"],
                Some(ChallengeConfigError::ShortKey {
                    index: 0,
                    len: 5,
                    min: 32,
                }),
            ),
            (
                &[A, B, A],
                Some(ChallengeConfigError::DuplicateKey { index: 2, first: 0 }),
            ),
            (&[A, B], None),
        ];
        for (secrets, want) in cases {
            let got = Keyring::new(secrets, Purpose::PassToken).err();
            assert_eq!(&got, want, "{secrets:?}");
        }
    }

    #[test]
    fn rotation_and_purpose_separation() {
        let old = Keyring::new(&[A], Purpose::PassToken).unwrap();
        let rotated = Keyring::new(&[B, A], Purpose::PassToken).unwrap();
        let new_only = Keyring::new(&[B], Purpose::PassToken).unwrap();
        let pow = Keyring::new(&[A], Purpose::PowChallenge).unwrap();
        let tag = old.sign(b"m");
        assert!(old.verify(b"m", &tag));
        assert!(rotated.verify(b"m", &tag), "old key still verifies");
        assert!(
            !new_only.verify(b"m", &tag),
            "dropped key no longer verifies"
        );
        assert!(!pow.verify(b"m", &tag), "purposes use different keys");
        assert!(!old.verify(b"n", &tag));
        assert!(
            new_only.verify(b"m", &rotated.sign(b"m")),
            "first key signs"
        );
    }

    #[test]
    fn binding_prefixes() {
        let cases = [
            ("203.0.113.7", "203.0.113.99", true),
            ("203.0.113.7", "203.0.114.7", false),
            ("::ffff:203.0.113.7", "203.0.113.1", true),
            ("2001:db8:1:2::1", "2001:db8:1:ffff::2", true),
            ("2001:db8:1:2::1", "2001:db8:2:2::1", false),
        ];
        for (a, b, same) in cases {
            let (ba, bb) = (Binding::of(addr(a), b"ua"), Binding::of(addr(b), b"ua"));
            assert_eq!(ba.prefix == bb.prefix, same, "{a} vs {b}");
        }
        assert_eq!(
            binding_prefix(addr("2001:db8:1:2::1")).to_string(),
            "2001:db8:1::/48"
        );
        assert_ne!(
            Binding::of(addr("203.0.113.7"), b"Firefox").agent,
            Binding::of(addr("203.0.113.7"), b"Chrome").agent
        );
    }
}
