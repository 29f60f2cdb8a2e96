//! The pass token: the `weir_pass` cookie a browser earns by solving a
//! challenge, checked on every request with no store.
//!
//! Format (version 1), base64url without padding of 73 bytes, 98 characters:
//!
//! ```text
//! offset  bytes  field
//!      0      1  version = 1
//!      1      8  id         (u64 big-endian; the rate-limit key of the holder)
//!      9      8  issued     (Unix seconds, big-endian)
//!     17      8  expires    (Unix seconds, big-endian)
//!     25      8  prefix tag (SHA-256 of the client's /24 or /48, first 8 bytes)
//!     33      8  agent tag  (SHA-256 of the User-Agent, first 8 bytes)
//!     41     32  HMAC-SHA256 over bytes 0..41 (pass-token key, see keyring.rs)
//! ```
//!
//! Owns: encoding, signing and verifying that format. Does not: decide who
//! gets a token (the `/.weir/challenge/verify` handler does, in `mod.rs`),
//! remember tokens, or rate-limit by `id` (the lead's rules do).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::keyring::{Binding, Keyring, TAG_LEN};

const VERSION: u8 = 1;
const BODY_LEN: usize = 41;
/// Bytes of a decoded token.
pub const TOKEN_LEN: usize = BODY_LEN + TAG_LEN;
/// Characters of an encoded token (base64url, no padding).
pub const TOKEN_CHARS: usize = (TOKEN_LEN * 4).div_ceil(3);

/// Whether `text` is spelled as a token is (its length, base64url), before
/// any key is tried: what may be read from a URL into a `Cookie` field,
/// where anything else (`;`, a space) could add a cookie of its own.
pub fn is_well_formed(text: &str) -> bool {
    text.len() == TOKEN_CHARS
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A valid pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassToken {
    /// Random per solved challenge; the same for every token minted from one
    /// solution. Rate-limit pass holders by this: a token shared by a crawler
    /// farm is limited as one client.
    pub id: u64,
    pub issued: SystemTime,
    pub expires: SystemTime,
}

/// Why a cookie is not a valid pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenRejection {
    #[error("not a weir pass token")]
    Malformed,
    #[error("signature does not verify under any configured key")]
    BadSignature,
    #[error("expired")]
    Expired,
    #[error("issued to another network")]
    OtherPrefix,
    #[error("issued to another User-Agent")]
    OtherAgent,
}

impl TokenRejection {
    /// A bounded metric label.
    pub fn as_str(&self) -> &'static str {
        match self {
            TokenRejection::Malformed => "malformed",
            TokenRejection::BadSignature => "bad_signature",
            TokenRejection::Expired => "expired",
            TokenRejection::OtherPrefix => "other_prefix",
            TokenRejection::OtherAgent => "other_agent",
        }
    }
}

/// Makes a signed token for `binding`, valid from `now` for `ttl`.
pub fn issue(keys: &Keyring, id: u64, binding: Binding, now: SystemTime, ttl: Duration) -> String {
    let issued = unix_secs(now);
    let expires = issued.saturating_add(ttl.as_secs());
    let mut raw = [0u8; TOKEN_LEN];
    raw[0] = VERSION;
    raw[1..9].copy_from_slice(&id.to_be_bytes());
    raw[9..17].copy_from_slice(&issued.to_be_bytes());
    raw[17..25].copy_from_slice(&expires.to_be_bytes());
    raw[25..33].copy_from_slice(&binding.prefix);
    raw[33..41].copy_from_slice(&binding.agent);
    let tag = keys.sign(&raw[..BODY_LEN]);
    raw[BODY_LEN..].copy_from_slice(&tag);
    URL_SAFE_NO_PAD.encode(raw)
}

/// Checks a cookie value. Order matters for the reason reported: nothing
/// but the signature is believed until it verifies.
pub fn verify(
    keys: &Keyring,
    cookie_value: &str,
    binding: Binding,
    now: SystemTime,
) -> Result<PassToken, TokenRejection> {
    if cookie_value.len() != TOKEN_CHARS {
        return Err(TokenRejection::Malformed);
    }
    let raw = URL_SAFE_NO_PAD
        .decode(cookie_value)
        .map_err(|_| TokenRejection::Malformed)?;
    if raw.len() != TOKEN_LEN || raw[0] != VERSION {
        return Err(TokenRejection::Malformed);
    }
    if !keys.verify(&raw[..BODY_LEN], &raw[BODY_LEN..]) {
        return Err(TokenRejection::BadSignature);
    }
    let u64_at = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&raw[at..at + 8]);
        u64::from_be_bytes(b)
    };
    let id = u64_at(1);
    let issued = u64_at(9);
    let expires = u64_at(17);
    if unix_secs(now) >= expires {
        return Err(TokenRejection::Expired);
    }
    if raw[25..33] != binding.prefix {
        return Err(TokenRejection::OtherPrefix);
    }
    if raw[33..41] != binding.agent {
        return Err(TokenRejection::OtherAgent);
    }
    Ok(PassToken {
        id,
        issued: UNIX_EPOCH + Duration::from_secs(issued),
        expires: UNIX_EPOCH + Duration::from_secs(expires),
    })
}

pub(crate) fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::challenge::keyring::Purpose;
    use crate::identity::ClientAddr;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    const HOUR: Duration = Duration::from_secs(3600);

    fn keys(secrets: &[&str]) -> Keyring {
        Keyring::new(secrets, Purpose::PassToken).unwrap()
    }

    fn bind(ip: &str, ua: &str) -> Binding {
        Binding::of(ClientAddr::new(ip.parse().unwrap()), ua.as_bytes())
    }

    fn t(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// Flips one base64 character of the body (not the tag).
    fn tamper(token: &str, at: usize) -> String {
        let mut c: Vec<char> = token.chars().collect();
        c[at] = if c[at] == 'A' { 'B' } else { 'A' };
        c.into_iter().collect()
    }

    #[test]
    #[allow(clippy::type_complexity)] // one tuple per table row
    fn verify_table() {
        let now = t(1_800_000_000);
        let ua = "Mozilla/5.0 Firefox/140.0";
        let good = issue(&keys(&[A]), 42, bind("203.0.113.7", ua), now, HOUR);
        let v6 = issue(&keys(&[A]), 7, bind("2001:db8:1:2::1", ua), now, HOUR);
        let other_key = issue(&keys(&[B]), 42, bind("203.0.113.7", ua), now, HOUR);
        let pow_key = {
            let pow = Keyring::new(&[A], Purpose::PowChallenge).unwrap();
            issue(&pow, 42, bind("203.0.113.7", ua), now, HOUR)
        };
        assert_eq!(good.len(), TOKEN_CHARS);
        let ok = |id| Ok::<u64, TokenRejection>(id);
        use TokenRejection::*;
        #[rustfmt::skip]
        let cases: Vec<(&str, String, &[&str], &str, &str, SystemTime, Result<u64, TokenRejection>)> = vec![
            ("valid, no store",           good.clone(), &[A],    "203.0.113.7",   ua, now,                         ok(42)),
            ("valid, same /24",           good.clone(), &[A],    "203.0.113.250", ua, now,                         ok(42)),
            ("valid until the last sec",  good.clone(), &[A],    "203.0.113.7",   ua, now + HOUR - Duration::from_secs(1), ok(42)),
            ("rotated in: old key 2nd",   good.clone(), &[B, A], "203.0.113.7",   ua, now,                         ok(42)),
            ("rotated out: old key gone", good.clone(), &[B],    "203.0.113.7",   ua, now,                         Err(BadSignature)),
            ("signed by another key",     other_key,    &[A],    "203.0.113.7",   ua, now,                         Err(BadSignature)),
            ("a pow-key signature",       pow_key,      &[A],    "203.0.113.7",   ua, now,                         Err(BadSignature)),
            ("forged id",                 tamper(&good, 3),  &[A], "203.0.113.7", ua, now,                         Err(BadSignature)),
            ("forged expiry",             tamper(&good, 28), &[A], "203.0.113.7", ua, now,                         Err(BadSignature)),
            ("forged tag",                tamper(&good, 90), &[A], "203.0.113.7", ua, now,                         Err(BadSignature)),
            ("expired",                   good.clone(), &[A],    "203.0.113.7",   ua, now + HOUR,                  Err(Expired)),
            ("other /24",                 good.clone(), &[A],    "203.0.114.7",   ua, now,                         Err(OtherPrefix)),
            ("other UA",                  good.clone(), &[A],    "203.0.113.7",   "curl/8", now,                   Err(OtherAgent)),
            ("v6 same /48, new /64",      v6.clone(),   &[A],    "2001:db8:1:ffff::9", ua, now,                    ok(7)),
            ("v6 other /48",              v6,           &[A],    "2001:db8:2:2::1", ua, now,                       Err(OtherPrefix)),
            ("empty",                     String::new(), &[A],   "203.0.113.7",   ua, now,                         Err(Malformed)),
            ("truncated",                 good[..97].to_string(), &[A], "203.0.113.7", ua, now,                    Err(Malformed)),
            ("not base64",                "!".repeat(TOKEN_CHARS), &[A], "203.0.113.7", ua, now,                   Err(Malformed)),
            ("other version",             format!("Ag{}", &good[2..]), &[A], "203.0.113.7", ua, now,              Err(Malformed)),
        ];
        for (name, token, secrets, ip, agent, at, want) in cases {
            let got = verify(&keys(secrets), &token, bind(ip, agent), at).map(|p| p.id);
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn times_round_trip() {
        let now = t(1_800_000_000);
        let token = issue(&keys(&[A]), 1, bind("10.0.0.1", ""), now, HOUR);
        let pass = verify(&keys(&[A]), &token, bind("10.0.0.1", ""), now).unwrap();
        assert_eq!(pass.issued, now);
        assert_eq!(pass.expires, now + HOUR);
    }
}
