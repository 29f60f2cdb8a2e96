//! Signed session cookies: a login weir can check on its own, without asking the app.
//!
//! Format (version 1), as the value of one configured cookie:
//!
//! ```text
//! v1.<user, base64url without padding>.<expiry, unix seconds, decimal>.<mac, base64url without padding>
//! mac = HMAC-SHA256(key, "v1.<user b64>.<expiry>")   (everything before the last dot)
//! ```
//!
//! The user is base64url-encoded so that any user name (dots, spaces, non-ASCII) fits in a
//! cookie value and the fields stay unambiguous. The MAC covers the version, the user and the
//! expiry, so none can be changed without the key. Keys rotate through a list: the first key
//! signs, every key verifies, so an operator adds the new key in front, waits one cookie
//! lifetime, then removes the old one. The MAC is compared in constant time (`ring::hmac::verify`).
//!
//! Every failure (malformed, unknown version, wrong MAC, expired) is a
//! [`UnverifiedReason`], never a panic: the value comes from the client.
//!
//! This module does not read headers, keep state or decide anything about a request; it
//! does not encrypt (the user name is readable by whoever holds the cookie).

use std::sync::Arc;

use ring::hmac;

use super::UnverifiedReason;

/// The version prefix of the format this module reads and writes.
pub const SIGNED_COOKIE_VERSION: &str = "v1";
/// Longest cookie value looked at; longer ones are malformed without further work, so a
/// hostile client cannot make weir hash megabytes per request.
pub const MAX_SIGNED_VALUE_LEN: usize = 1024;
/// Longest user name accepted (bytes, before encoding).
pub const MAX_USER_LEN: usize = 256;
/// Shortest signing key accepted: HMAC-SHA256 gains nothing past 32 bytes, and loses
/// strength below it.
pub const MIN_KEY_LEN: usize = 32;

const MAC_LEN: usize = 32;

/// Why a signing key list cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SigningKeyError {
    #[error("no signing keys given: signed session cookies need at least one")]
    Empty,
    #[error("signing key #{index} is {len} bytes long; at least {MIN_KEY_LEN} are needed")]
    TooShort { index: usize, len: usize },
}

/// Why a cookie could not be issued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IssueError {
    #[error("user name is empty")]
    EmptyUser,
    #[error("user name is {len} bytes long; at most {MAX_USER_LEN} are allowed")]
    UserTooLong { len: usize },
}

/// HMAC-SHA256 keys: the first signs, all verify.
#[derive(Clone)]
pub struct SigningKeys {
    keys: Vec<hmac::Key>,
}

impl std::fmt::Debug for SigningKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("SigningKeys")
            .field("count", &self.keys.len())
            .finish()
    }
}

impl SigningKeys {
    /// Keys from raw secrets, newest (signing) first.
    pub fn new<K: AsRef<[u8]>>(secrets: &[K]) -> Result<SigningKeys, SigningKeyError> {
        if secrets.is_empty() {
            return Err(SigningKeyError::Empty);
        }
        let mut keys = Vec::with_capacity(secrets.len());
        for (index, secret) in secrets.iter().enumerate() {
            let secret = secret.as_ref();
            if secret.len() < MIN_KEY_LEN {
                return Err(SigningKeyError::TooShort {
                    index,
                    len: secret.len(),
                });
            }
            keys.push(hmac::Key::new(hmac::HMAC_SHA256, secret));
        }
        Ok(SigningKeys { keys })
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// A signed session cookie: its name and the keys that check it.
#[derive(Debug, Clone)]
pub struct SignedCookie {
    name: String,
    keys: SigningKeys,
}

impl SignedCookie {
    pub fn new(cookie_name: &str, keys: SigningKeys) -> SignedCookie {
        SignedCookie {
            name: cookie_name.to_string(),
            keys,
        }
    }

    /// The name of the cookie that carries the signed value.
    pub fn cookie_name(&self) -> &str {
        &self.name
    }

    /// A cookie value for `user`, valid while the clock reads before `expires_unix`,
    /// signed with the first key. For the app's login hook, tests and tools.
    pub fn issue(&self, user: &str, expires_unix: u64) -> Result<String, IssueError> {
        if user.is_empty() {
            return Err(IssueError::EmptyUser);
        }
        if user.len() > MAX_USER_LEN {
            return Err(IssueError::UserTooLong { len: user.len() });
        }
        let mut value = format!(
            "{SIGNED_COOKIE_VERSION}.{}.{expires_unix}",
            base64url_encode(user.as_bytes())
        );
        // `new` refuses an empty key list, so there is always a first key.
        let Some(key) = self.keys.keys.first() else {
            return Err(IssueError::EmptyUser);
        };
        let tag = hmac::sign(key, value.as_bytes());
        value.push('.');
        value.push_str(&base64url_encode(tag.as_ref()));
        Ok(value)
    }

    /// The user a cookie value names, if the value is well formed, signed by one of the
    /// keys and not expired at `now_unix`.
    pub fn verify(&self, value: &str, now_unix: u64) -> Result<Arc<str>, UnverifiedReason> {
        if value.len() > MAX_SIGNED_VALUE_LEN {
            return Err(UnverifiedReason::Malformed);
        }
        let (signed, mac_b64) = value.rsplit_once('.').ok_or(UnverifiedReason::Malformed)?;
        let mut fields = signed.split('.');
        let (Some(version), Some(user_b64), Some(expiry), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(UnverifiedReason::Malformed);
        };
        if version != SIGNED_COOKIE_VERSION {
            return Err(UnverifiedReason::UnsupportedVersion);
        }
        let expiry = parse_decimal(expiry).ok_or(UnverifiedReason::Malformed)?;
        let mac = base64url_decode(mac_b64).ok_or(UnverifiedReason::Malformed)?;
        if mac.len() != MAC_LEN {
            return Err(UnverifiedReason::Malformed);
        }
        let user = base64url_decode(user_b64).ok_or(UnverifiedReason::Malformed)?;
        if user.is_empty() || user.len() > MAX_USER_LEN {
            return Err(UnverifiedReason::Malformed);
        }
        // Check the MAC before trusting anything else about the content, then the expiry:
        // an expired but genuine cookie is "expired", a forged one is "bad signature".
        let genuine =
            (self.keys.keys.iter()).any(|k| hmac::verify(k, signed.as_bytes(), &mac).is_ok());
        if !genuine {
            return Err(UnverifiedReason::BadSignature);
        }
        if now_unix >= expiry {
            return Err(UnverifiedReason::Expired);
        }
        let user = String::from_utf8(user).map_err(|_| UnverifiedReason::Malformed)?;
        Ok(Arc::from(user))
    }
}

/// Plain ASCII digits only (no sign, no spaces), at most 19 of them so it fits a `u64`.
fn parse_decimal(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 19 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

const B64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// base64url (RFC 4648 §5) without padding.
pub(crate) fn base64url_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for i in 0..chars {
            let idx = (n >> (18 - 6 * i)) & 0x3f;
            out.push(char::from(B64URL[idx as usize]));
        }
    }
    out
}

/// Strict base64url without padding: other alphabets, padding, impossible lengths and
/// non-zero trailing bits are refused, so each byte string has exactly one encoding and a
/// changed character is always a changed value.
pub(crate) fn base64url_decode(s: &str) -> Option<Vec<u8>> {
    fn sextet(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        } as u32)
    }
    let bytes = s.as_bytes();
    if bytes.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= sextet(c)? << (18 - 6 * i);
        }
        let produced = chunk.len() - 1;
        // Bits below the last whole byte must be zero (canonical encoding).
        let spare_mask = (1u32 << (24 - 8 * produced)) - 1;
        if n & spare_mask != 0 {
            return None;
        }
        for i in 0..produced {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &[u8] = b"old-key-old-key-old-key-old-key-old-key!";
    const NEW: &[u8] = b"new-key-new-key-new-key-new-key-new-key!";
    const OTHER: &[u8] = b"someone-elses-key-someone-elses-key-0123";
    const NOW: u64 = 1_790_000_000;

    fn signer(keys: &[&[u8]]) -> SignedCookie {
        SignedCookie::new("weir_session", SigningKeys::new(keys).expect("test keys"))
    }

    /// Replaces the character `from_end` places before the last with another base64url
    /// one; for the last character of a 32-byte MAC, `B` and `D` set bits past the last byte.
    fn flip(value: &str, from_end: usize) -> String {
        let mut b = value.as_bytes().to_vec();
        let i = b.len() - 1 - from_end;
        b[i] = if b[i] == b'B' { b'D' } else { b'B' };
        String::from_utf8(b).expect("ascii")
    }

    #[test]
    fn verify_table() {
        let old = signer(&[OLD]);
        let rotated = signer(&[NEW, OLD]);
        let other = signer(&[OTHER]);
        let good = old.issue("alice", NOW + 60).expect("issue");
        let by_new = rotated.issue("alice", NOW + 60).expect("issue");
        let forged = other.issue("alice", NOW + 60).expect("issue");
        let expired = old.issue("alice", NOW).expect("issue");
        let long_ago = old.issue("alice", 1).expect("issue");
        let dotted = old.issue("a.b c/é", NOW + 60).expect("issue");
        let (signed, mac) = good.rsplit_once('.').expect("dot");
        let as_bob = format!("v1.{}.{}.{mac}", base64url_encode(b"bob"), NOW + 60);
        let later = format!("v1.{}.{}.{mac}", base64url_encode(b"alice"), NOW + 6000);
        let v2 = format!("v2{}.{mac}", &signed[2..]);
        let padded = format!("{good}=");
        let huge = format!("{good}{}", "A".repeat(MAX_SIGNED_VALUE_LEN));
        let no_user = format!("v1..{}.{mac}", NOW + 60);
        let neg = format!("v1.{}.-5.{mac}", base64url_encode(b"alice"));
        let short_mac = format!("{signed}.{}", &mac[..20]);
        type Case<'a> = (
            &'a str,
            &'a SignedCookie,
            &'a str,
            Result<&'a str, UnverifiedReason>,
        );
        use UnverifiedReason::*;
        let cases: &[Case] = &[
            ("genuine", &old, &good, Ok("alice")),
            (
                "user with dots, spaces, non-ASCII",
                &old,
                &dotted,
                Ok("a.b c/é"),
            ),
            (
                "old key still accepted after rotation",
                &rotated,
                &good,
                Ok("alice"),
            ),
            (
                "new key signs after rotation",
                &rotated,
                &by_new,
                Ok("alice"),
            ),
            (
                "new key unknown before rotation",
                &old,
                &by_new,
                Err(BadSignature),
            ),
            ("other key (forged)", &old, &forged, Err(BadSignature)),
            ("user swapped, MAC kept", &old, &as_bob, Err(BadSignature)),
            ("expiry extended, MAC kept", &old, &later, Err(BadSignature)),
            (
                "last MAC character non-canonical",
                &old,
                &flip(&good, 0),
                Err(Malformed),
            ),
            (
                "MAC character changed",
                &old,
                &flip(&good, 5),
                Err(BadSignature),
            ),
            ("expires exactly now", &old, &expired, Err(Expired)),
            ("expired long ago", &old, &long_ago, Err(Expired)),
            ("version 2", &old, &v2, Err(UnsupportedVersion)),
            ("empty", &old, "", Err(Malformed)),
            ("no dots", &old, "v1", Err(Malformed)),
            ("three fields", &old, "v1.YWxpY2U.123", Err(Malformed)),
            ("five fields", &old, &format!("v1.x.{good}"), Err(Malformed)),
            ("padding", &old, &padded, Err(Malformed)),
            ("too long", &old, &huge, Err(Malformed)),
            ("empty user", &old, &no_user, Err(Malformed)),
            ("negative expiry", &old, &neg, Err(Malformed)),
            ("short MAC", &old, &short_mac, Err(Malformed)),
            ("cookie name as value", &old, "weir_session", Err(Malformed)),
            ("not base64", &old, "v1.!!!.1.????", Err(Malformed)),
        ];
        for (what, signer, value, want) in cases {
            let got = signer.verify(value, NOW);
            let got = got.as_deref().map_err(|e| *e);
            assert_eq!(got, *want, "{what}: {value}");
        }
    }

    #[test]
    fn keys_and_issue_are_checked() {
        assert_eq!(
            SigningKeys::new::<&[u8]>(&[]).map(|_| ()),
            Err(SigningKeyError::Empty)
        );
        assert_eq!(
            SigningKeys::new(&[NEW, b"short"]).map(|_| ()),
            Err(SigningKeyError::TooShort { index: 1, len: 5 })
        );
        let s = signer(&[NEW]);
        assert_eq!(s.issue("", 1), Err(IssueError::EmptyUser));
        assert_eq!(
            s.issue(&"x".repeat(MAX_USER_LEN + 1), 1),
            Err(IssueError::UserTooLong {
                len: MAX_USER_LEN + 1
            })
        );
        let value = s
            .issue(&"x".repeat(MAX_USER_LEN), NOW + 1)
            .expect("longest user");
        assert!(value.len() <= MAX_SIGNED_VALUE_LEN, "{}", value.len());
        assert!(value.starts_with("v1."), "{value}");
        assert!(!format!("{:?}", s).contains("new-key"));
    }

    #[test]
    fn base64url_round_trip_and_strictness() {
        for len in 0..40 {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            let text = base64url_encode(&bytes);
            assert_eq!(base64url_decode(&text), Some(bytes), "len {len}");
        }
        let cases: &[(&str, Option<&[u8]>)] = &[
            ("", Some(b"")),
            ("YQ", Some(b"a")),
            ("YR", None), // non-zero trailing bits
            ("YWI", Some(b"ab")),
            ("YWJ", None),
            ("YWJj", Some(b"abc")),
            ("Y", None),
            ("YQ==", None),
            ("_-8", Some(&[0xff, 0xef])),
            ("/+8", None),
        ];
        for (text, want) in cases {
            assert_eq!(base64url_decode(text).as_deref(), *want, "{text}");
        }
    }
}
