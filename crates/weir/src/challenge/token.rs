//! The pass token: the `weir_pass` cookie a browser earns by solving a
//! challenge (or, without JavaScript, by waiting out its refresh), checked
//! on every request with no store.
//!
//! Format (version 2), base64url without padding of 74 bytes, 99 characters:
//!
//! ```text
//! offset  bytes  field
//!      0      1  version = 2
//!      1      1  kind       (1 = work: the page's proof of work; 2 = wait: its no-script refresh)
//!      2      8  id         (u64 big-endian; the rate-limit key of the holder)
//!     10      8  issued     (Unix seconds, big-endian)
//!     18      8  expires    (Unix seconds, big-endian)
//!     26      8  prefix tag (SHA-256 of the client's /24 or /48, first 8 bytes)
//!     34      8  agent tag  (SHA-256 of the User-Agent, first 8 bytes)
//!     42     32  HMAC-SHA256 over bytes 0..42 (pass-token key, see keyring.rs)
//! ```
//!
//! Version 1 (no kind: every pass was worth the same, however it was
//! earned) is refused: its holder solves once more.
//!
//! A cookie may carry up to four tokens joined by `.` ([`SIDE_BY_SIDE`]):
//! the passes of instances that sign with keys of their own, each of which
//! finds its own among them (see `elsewhere.rs`).
//!
//! Owns: encoding, signing and verifying that format, and the lifetime a
//! pass has under the configuration in force. Does not: decide who gets a
//! token (the `/.weir/challenge/verify` handler does, in `mod.rs`), what a
//! kind is worth (`proxy::deciding`), remember tokens, or rate-limit by
//! `id` (the rules do).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::keyring::{Binding, Keyring, TAG_LEN};

const VERSION: u8 = 2;
const BODY_LEN: usize = 42;
/// Bytes of a decoded token.
pub const TOKEN_LEN: usize = BODY_LEN + TAG_LEN;
/// Characters of an encoded token (base64url, no padding).
pub const TOKEN_CHARS: usize = (TOKEN_LEN * 4).div_ceil(3);

/// Joins the passes of several instances in one cookie value: not in
/// base64url, allowed in a cookie and an address.
pub const SIDE_BY_SIDE: char = '.';
/// The most passes one cookie carries side by side: a fleet of instances
/// that sign with keys of their own (no shared `keys`, no shared Redis)
/// each add theirs, up to this many (about 400 bytes).
pub const MAX_SIDE_BY_SIDE: usize = 4;

/// The passes a cookie value carries side by side (see [`SIDE_BY_SIDE`]),
/// at most [`MAX_SIDE_BY_SIDE`].
pub fn side_by_side(value: &str) -> impl Iterator<Item = &str> {
    value.split(SIDE_BY_SIDE).take(MAX_SIDE_BY_SIDE)
}

/// Whether `text` is spelled as a token is (its length, base64url), or as
/// several side by side, before any key is tried: what may be read from a
/// URL into a `Cookie` field, where anything else (`;`, a space) could add
/// a cookie of its own.
pub fn is_well_formed(text: &str) -> bool {
    let pieces = text.split(SIDE_BY_SIDE).count();
    pieces <= MAX_SIDE_BY_SIDE && text.split(SIDE_BY_SIDE).all(is_one_token)
}

fn is_one_token(text: &str) -> bool {
    text.len() == TOKEN_CHARS
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// How a pass was earned, which decides what it is worth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassKind {
    /// The page's proof of work: the browser ran its script.
    Work,
    /// The page's no-script refresh, followed after its wait: a browser
    /// without JavaScript, or any client that follows a meta refresh (as
    /// Scrapy does by default). Worth less than work: proof only in a visit
    /// weir counts as a person's (`proxy::deciding`).
    Wait,
}

impl PassKind {
    fn byte(self) -> u8 {
        match self {
            PassKind::Work => 1,
            PassKind::Wait => 2,
        }
    }

    fn of_byte(b: u8) -> Option<PassKind> {
        match b {
            1 => Some(PassKind::Work),
            2 => Some(PassKind::Wait),
            _ => None,
        }
    }

    /// A bounded label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            PassKind::Work => "work",
            PassKind::Wait => "wait",
        }
    }
}

/// A valid pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassToken {
    /// Random per solved challenge; the same for every token minted from one
    /// solution, and one per network for the passes a network redeemed
    /// over its budget (`super::budget`). Rate-limit pass holders by this:
    /// a token shared by a crawler farm is limited as one client.
    pub id: u64,
    pub kind: PassKind,
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

/// What a new token says besides its binding.
#[derive(Debug, Clone, Copy)]
pub struct Minted {
    pub id: u64,
    pub kind: PassKind,
    pub now: SystemTime,
    pub ttl: Duration,
}

/// Makes a signed token for `binding`, valid from `now` for `ttl`.
pub fn issue(keys: &Keyring, m: Minted, binding: Binding) -> String {
    let issued = unix_secs(m.now);
    let expires = issued.saturating_add(m.ttl.as_secs());
    let mut raw = [0u8; TOKEN_LEN];
    raw[0] = VERSION;
    raw[1] = m.kind.byte();
    raw[2..10].copy_from_slice(&m.id.to_be_bytes());
    raw[10..18].copy_from_slice(&issued.to_be_bytes());
    raw[18..26].copy_from_slice(&expires.to_be_bytes());
    raw[26..34].copy_from_slice(&binding.prefix);
    raw[34..42].copy_from_slice(&binding.agent);
    let tag = keys.sign(&raw[..BODY_LEN]);
    raw[BODY_LEN..].copy_from_slice(&tag);
    URL_SAFE_NO_PAD.encode(raw)
}

/// Checks a cookie value. Order matters for the reason reported: nothing
/// but the signature is believed until it verifies. A pass lives until its
/// `expires`, and no longer than `ttl` (the `pass_ttl` in force) from when
/// it was issued: shortening `pass_ttl` shortens the passes out there too.
pub fn verify(
    keys: &Keyring,
    cookie_value: &str,
    binding: Binding,
    now: SystemTime,
    ttl: Duration,
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
    let kind = PassKind::of_byte(raw[1]).ok_or(TokenRejection::Malformed)?;
    let id = u64_at(2);
    let issued = u64_at(10);
    let expires = u64_at(18);
    let ends = expires.min(issued.saturating_add(ttl.as_secs()));
    if unix_secs(now) >= ends {
        return Err(TokenRejection::Expired);
    }
    if raw[26..34] != binding.prefix {
        return Err(TokenRejection::OtherPrefix);
    }
    if raw[34..42] != binding.agent {
        return Err(TokenRejection::OtherAgent);
    }
    Ok(PassToken {
        id,
        kind,
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

    fn mint(secrets: &[&str], id: u64, b: Binding, now: SystemTime, ttl: Duration) -> String {
        let kind = PassKind::Work;
        issue(&keys(secrets), Minted { id, kind, now, ttl }, b)
    }

    #[test]
    #[allow(clippy::type_complexity)] // one tuple per table row
    fn verify_table() {
        let now = t(1_800_000_000);
        let ua = "Mozilla/5.0 Firefox/140.0";
        let good = mint(&[A], 42, bind("203.0.113.7", ua), now, HOUR);
        let v6 = mint(&[A], 7, bind("2001:db8:1:2::1", ua), now, HOUR);
        let other_key = mint(&[B], 42, bind("203.0.113.7", ua), now, HOUR);
        let pow_key = {
            let pow = Keyring::new(&[A], Purpose::PowChallenge).unwrap();
            let m = Minted {
                id: 42,
                kind: PassKind::Work,
                now,
                ttl: HOUR,
            };
            issue(&pow, m, bind("203.0.113.7", ua))
        };
        // A kind no version-2 token has, signed as one would be.
        let odd_kind = {
            let mut raw = URL_SAFE_NO_PAD.decode(&good).unwrap();
            raw[1] = 9;
            let tag = keys(&[A]).sign(&raw[..BODY_LEN]);
            raw[BODY_LEN..].copy_from_slice(&tag);
            URL_SAFE_NO_PAD.encode(raw)
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
            ("truncated",                 good[..98].to_string(), &[A], "203.0.113.7", ua, now,                    Err(Malformed)),
            ("not base64",                "!".repeat(TOKEN_CHARS), &[A], "203.0.113.7", ua, now,                   Err(Malformed)),
            ("version 1",                 format!("AQ{}", &good[2..]), &[A], "203.0.113.7", ua, now,              Err(Malformed)),
            ("a kind of no version",      odd_kind,     &[A],    "203.0.113.7",   ua, now,                         Err(Malformed)),
        ];
        for (name, token, secrets, ip, agent, at, want) in cases {
            let got = verify(&keys(secrets), &token, bind(ip, agent), at, HOUR).map(|p| p.id);
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn times_and_kind_round_trip() {
        let now = t(1_800_000_000);
        for kind in [PassKind::Work, PassKind::Wait] {
            let m = Minted {
                id: 1,
                kind,
                now,
                ttl: HOUR,
            };
            let token = issue(&keys(&[A]), m, bind("10.0.0.1", ""));
            let pass = verify(&keys(&[A]), &token, bind("10.0.0.1", ""), now, HOUR).unwrap();
            assert_eq!(
                (pass.issued, pass.expires, pass.kind),
                (now, now + HOUR, kind)
            );
        }
    }

    /// Regression (issue 54): only `expires` was checked, so shortening
    /// `pass_ttl` left every pass already issued its old lifetime.
    #[test]
    fn a_shortened_pass_ttl_shortens_the_passes_out_there() {
        let now = t(1_800_000_000);
        let twelve_hours = 12 * HOUR;
        let token = mint(&[A], 5, bind("10.0.0.1", "ua"), now, twelve_hours);
        let check = |at, ttl| verify(&keys(&[A]), &token, bind("10.0.0.1", "ua"), at, ttl);
        assert!(check(now + 2 * HOUR, twelve_hours).is_ok());
        assert_eq!(check(now + 2 * HOUR, HOUR), Err(TokenRejection::Expired));
        assert!(check(now + HOUR / 2, HOUR).is_ok());
        // A longer ttl does not lengthen a pass past its own expiry.
        assert_eq!(
            check(now + twelve_hours, 24 * HOUR),
            Err(TokenRejection::Expired)
        );
    }
}
