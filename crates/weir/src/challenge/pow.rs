//! Proof of work: a signed nonce the browser must find a counter for.
//!
//! The work: find `counter` (a decimal integer) such that
//! `SHA-256(nonce + ":" + counter)` starts with at least `difficulty` zero
//! bits. Expected cost 2^difficulty hashes; checking it costs one.
//!
//! The nonce is base64url (no padding) of:
//!
//! ```text
//! offset  bytes  field
//!      0      1  version = 1
//!      1      8  issued      (Unix milliseconds, big-endian)
//!      9      1  difficulty  (leading zero bits)
//!     10      8  prefix tag  (client /24 or /48, see keyring.rs)
//!     18      8  agent tag   (User-Agent)
//!     26      8  seed        (random; becomes the pass token's id)
//!     34      n  return path (UTF-8, a local path, at most 2,000 bytes)
//!   34+n     32  HMAC-SHA256 over bytes 0..34+n (challenge key)
//! ```
//!
//! Verification is stateless: signature, age below `solve_ttl`, binding, bits.
//! A solved nonce can be replayed until it expires, but every token minted
//! from it has the same id (the seed), so replays share one rate-limit key.
//!
//! Owns: the nonce format, [`solve`] (the same algorithm as the page's
//! script, for the lab's simulated humans and for tests), and the
//! return-path check that prevents an open redirect. Does not: serve pages
//! or set cookies (see `mod.rs`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::digest;

use super::keyring::{Binding, Keyring, TAG_LEN};

const VERSION: u8 = 1;
const HEADER_LEN: usize = 34;
/// The longest return path carried; a longer one returns the visitor to `/`.
pub const MAX_RETURN_PATH: usize = 2000;
/// The most bits accepted anywhere: 2^28 hashes is minutes on a phone.
pub const MAX_BITS: u8 = 28;

/// A challenge to serve: the nonce string the page embeds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    pub nonce: String,
    pub difficulty: u8,
}

/// A correctly answered challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Solved {
    pub issued: SystemTime,
    pub difficulty: u8,
    /// The random seed of the nonce: the id of the pass it earns.
    pub seed: u64,
    /// Where the visitor was going (a checked local path).
    pub return_path: String,
}

/// Why an answer is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PowRejection {
    #[error("not a weir challenge")]
    Malformed,
    #[error("signature does not verify under any configured key")]
    BadSignature,
    #[error("challenge expired")]
    Expired,
    #[error("answered from another network")]
    OtherPrefix,
    #[error("answered by another User-Agent")]
    OtherAgent,
    #[error("counter does not meet the difficulty")]
    InsufficientWork,
    #[error("no-script link followed before its wait was over")]
    TooEarly,
    #[error("sent by another site's page")]
    CrossSite,
    #[error("brought by a browser that was not shown its page")]
    NotShownThePage,
}

impl PowRejection {
    /// A bounded metric label.
    pub fn as_str(&self) -> &'static str {
        match self {
            PowRejection::Malformed => "malformed",
            PowRejection::BadSignature => "bad_signature",
            PowRejection::Expired => "expired",
            PowRejection::OtherPrefix => "other_prefix",
            PowRejection::OtherAgent => "other_agent",
            PowRejection::InsufficientWork => "insufficient_work",
            PowRejection::TooEarly => "too_early",
            PowRejection::CrossSite => "cross_site",
            PowRejection::NotShownThePage => "not_shown_the_page",
        }
    }
}

/// Makes a signed challenge. `return_path` is checked with
/// [`safe_return_path`]; anything unsafe or too long becomes `/`.
pub fn issue(
    keys: &Keyring,
    binding: Binding,
    difficulty: u8,
    seed: u64,
    return_path: &str,
    now: SystemTime,
) -> Challenge {
    let difficulty = difficulty.min(MAX_BITS);
    let path = safe_return_path(return_path).unwrap_or("/");
    let mut raw = Vec::with_capacity(HEADER_LEN + path.len() + TAG_LEN);
    raw.push(VERSION);
    raw.extend_from_slice(&unix_millis(now).to_be_bytes());
    raw.push(difficulty);
    raw.extend_from_slice(&binding.prefix);
    raw.extend_from_slice(&binding.agent);
    raw.extend_from_slice(&seed.to_be_bytes());
    raw.extend_from_slice(path.as_bytes());
    let tag = keys.sign(&raw);
    raw.extend_from_slice(&tag);
    Challenge {
        nonce: URL_SAFE_NO_PAD.encode(raw),
        difficulty,
    }
}

/// The signed contents of a nonce, before the binding, age and work checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    pub issued: SystemTime,
    pub difficulty: u8,
    pub seed: u64,
    pub return_path: String,
    binding: Binding,
}

/// Decodes a nonce and checks its signature only. A failed answer's fresh
/// challenge keeps the visitor's destination only when this succeeds.
pub fn open(keys: &Keyring, nonce: &str) -> Result<Opened, PowRejection> {
    // The longest valid nonce, in base64 characters.
    const MAX_CHARS: usize = (HEADER_LEN + MAX_RETURN_PATH + TAG_LEN) * 4 / 3 + 4;
    if nonce.len() > MAX_CHARS {
        return Err(PowRejection::Malformed);
    }
    let raw = URL_SAFE_NO_PAD
        .decode(nonce)
        .map_err(|_| PowRejection::Malformed)?;
    if raw.len() < HEADER_LEN + 1 + TAG_LEN || raw[0] != VERSION {
        return Err(PowRejection::Malformed);
    }
    let (body, tag) = raw.split_at(raw.len() - TAG_LEN);
    if !keys.verify(body, tag) {
        return Err(PowRejection::BadSignature);
    }
    let mut u = [0u8; 8];
    u.copy_from_slice(&body[1..9]);
    let issued = UNIX_EPOCH + Duration::from_millis(u64::from_be_bytes(u));
    let mut binding = Binding {
        prefix: [0; 8],
        agent: [0; 8],
    };
    binding.prefix.copy_from_slice(&body[10..18]);
    binding.agent.copy_from_slice(&body[18..26]);
    u.copy_from_slice(&body[26..34]);
    let seed = u64::from_be_bytes(u);
    // Signed by us, so a local path; checked again in case a key leaked.
    let return_path = std::str::from_utf8(&body[HEADER_LEN..])
        .ok()
        .and_then(safe_return_path)
        .ok_or(PowRejection::Malformed)?
        .to_string();
    Ok(Opened {
        issued,
        difficulty: body[9],
        seed,
        return_path,
        binding,
    })
}

/// The seed a nonce carries, read without its signature: what names the
/// page's probe cookie. For simulated browsers (tests, the lab) that know
/// the page's body but not its fields; weir itself reads it from a nonce
/// it verified ([`open`]).
pub fn seed_of(nonce: &str) -> Option<u64> {
    let raw = URL_SAFE_NO_PAD.decode(nonce).ok()?;
    let seed = raw.get(26..34)?;
    (raw.first() == Some(&VERSION)).then(|| u64::from_be_bytes(seed.try_into().unwrap_or_default()))
}

/// Checks an answer: signature, age, binding, then the work itself.
pub fn verify(
    keys: &Keyring,
    nonce: &str,
    counter: u64,
    binding: Binding,
    solve_ttl: Duration,
    now: SystemTime,
) -> Result<Solved, PowRejection> {
    let (opened, _) = open_bound(keys, nonce, binding, solve_ttl, now)?;
    if leading_zero_bits(&hash(nonce, counter)) < u32::from(opened.difficulty) {
        return Err(PowRejection::InsufficientWork);
    }
    Ok(Solved {
        issued: opened.issued,
        difficulty: opened.difficulty,
        seed: opened.seed,
        return_path: opened.return_path,
    })
}

/// Opens `nonce` and checks what every way of answering it shares: not
/// expired, the same network and agent it was issued to. Also its age.
fn open_bound(
    keys: &Keyring,
    nonce: &str,
    binding: Binding,
    solve_ttl: Duration,
    now: SystemTime,
) -> Result<(Opened, Duration), PowRejection> {
    let opened = open(keys, nonce)?;
    // A nonce from the future (another instance's clock) counts as new.
    let age = now.duration_since(opened.issued).unwrap_or(Duration::ZERO);
    if age >= solve_ttl {
        return Err(PowRejection::Expired);
    }
    if opened.binding.prefix != binding.prefix {
        return Err(PowRejection::OtherPrefix);
    }
    if opened.binding.agent != binding.agent {
        return Err(PowRejection::OtherAgent);
    }
    Ok((opened, age))
}

/// Checks a challenge followed by a browser without JavaScript
/// (`/.weir/challenge/refresh?nonce=`): signed, bound to this client's
/// network and agent like an answer, not expired, and at least `wait` old.
/// No work is asked: the wait, the round trip and the kept cookie are the
/// cost.
pub fn verify_waited(
    keys: &Keyring,
    nonce: &str,
    binding: Binding,
    wait: Duration,
    solve_ttl: Duration,
    now: SystemTime,
) -> Result<Solved, PowRejection> {
    let (opened, age) = open_bound(keys, nonce, binding, solve_ttl, now)?;
    if age < wait {
        return Err(PowRejection::TooEarly);
    }
    Ok(Solved {
        issued: opened.issued,
        difficulty: 0,
        seed: opened.seed,
        return_path: opened.return_path,
    })
}

/// How much of `wait` a no-script link still has to wait before
/// [`verify_waited`] accepts it: zero once it is old enough. The same
/// refusals as [`verify_waited`] otherwise, so only a link that would earn a
/// pass is ever held (see `Challenger::refresh_hold`).
pub fn wait_left(
    keys: &Keyring,
    nonce: &str,
    binding: Binding,
    wait: Duration,
    solve_ttl: Duration,
    now: SystemTime,
) -> Result<Duration, PowRejection> {
    let (_, age) = open_bound(keys, nonce, binding, solve_ttl, now)?;
    Ok(wait.saturating_sub(age))
}

/// Finds the smallest counter meeting `difficulty`, exactly as the page's
/// script does (counting up from 0). Expected 2^difficulty hashes.
pub fn solve(nonce: &str, difficulty: u8) -> u64 {
    let want = u32::from(difficulty.min(MAX_BITS));
    let mut input = String::with_capacity(nonce.len() + 21);
    input.push_str(nonce);
    input.push(':');
    let base = input.len();
    let mut counter = 0u64;
    loop {
        input.truncate(base);
        push_decimal(&mut input, counter);
        if leading_zero_bits(digest::digest(&digest::SHA256, input.as_bytes()).as_ref()) >= want {
            return counter;
        }
        counter += 1;
    }
}

/// SHA-256 of `nonce:counter`.
pub fn hash(nonce: &str, counter: u64) -> [u8; 32] {
    let mut ctx = digest::Context::new(&digest::SHA256);
    ctx.update(nonce.as_bytes());
    ctx.update(b":");
    ctx.update(counter.to_string().as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// Leading zero bits of a digest.
pub fn leading_zero_bits(bytes: &[u8]) -> u32 {
    let mut n = 0;
    for &b in bytes {
        n += b.leading_zeros();
        if b != 0 {
            break;
        }
    }
    n
}

/// `path` if it is a local path on this site, else `None`. A return path is
/// a redirect target, so anything a browser might read as another origin is
/// refused: it must start with one `/`, and no `\` (browsers treat `/\evil`
/// as `//evil`), no control characters or spaces.
pub fn safe_return_path(path: &str) -> Option<&str> {
    let local = path.starts_with('/')
        && !path.starts_with("//")
        && path.len() <= MAX_RETURN_PATH
        && !path
            .bytes()
            .any(|b| b == b'\\' || b.is_ascii_control() || b == b' ' || b >= 0x80);
    local.then_some(path)
}

fn push_decimal(out: &mut String, n: u64) {
    use std::fmt::Write;
    let _ = write!(out, "{n}");
}

fn unix_millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::challenge::keyring::Purpose;
    use crate::identity::ClientAddr;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    const TTL: Duration = Duration::from_secs(300);

    fn keys(s: &str) -> Keyring {
        Keyring::new(&[s], Purpose::PowChallenge).unwrap()
    }

    fn bind(ip: &str, ua: &str) -> Binding {
        Binding::of(ClientAddr::new(ip.parse().unwrap()), ua.as_bytes())
    }

    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000)
    }

    #[test]
    fn zero_bits() {
        let cases: &[(&[u8], u32)] = &[
            (&[0xff], 0),
            (&[0x80, 0], 0),
            (&[0x7f], 1),
            (&[0x00, 0x01], 15),
            (&[0x00, 0x00, 0x0f], 20),
            (&[0, 0], 16),
        ];
        for (bytes, want) in cases {
            assert_eq!(leading_zero_bits(bytes), *want, "{bytes:?}");
        }
    }

    #[test]
    fn solve_verify_round_trip() {
        let b = bind("203.0.113.7", "ua");
        for bits in [0u8, 4, 10, 12] {
            let c = issue(&keys(A), b, bits, 99, "/wiki/Page?x=1", now());
            let counter = solve(&c.nonce, c.difficulty);
            assert!(leading_zero_bits(&hash(&c.nonce, counter)) >= u32::from(bits));
            let got = verify(&keys(A), &c.nonce, counter, b, TTL, now()).unwrap();
            assert_eq!(got.return_path, "/wiki/Page?x=1");
            assert_eq!((got.seed, got.difficulty), (99, bits));
            assert_eq!(got.issued, now());
        }
    }

    #[test]
    #[allow(clippy::type_complexity)] // one tuple per table row
    fn refusals() {
        let b = bind("203.0.113.7", "ua");
        let c = issue(&keys(A), b, 12, 1, "/wiki/Page", now());
        let good = solve(&c.nonce, 12);
        // The smallest counter below the solution cannot meet 12 bits
        // (solve returns the first that does).
        let bad = (0..good)
            .rev()
            .find(|&n| leading_zero_bits(&hash(&c.nonce, n)) < 12)
            .unwrap_or(good + 1);
        // Another path, same everything else: the signature does not cover it.
        let other_path = {
            let mut raw = URL_SAFE_NO_PAD.decode(&c.nonce).unwrap();
            raw[HEADER_LEN] = b'/';
            raw[HEADER_LEN + 1] = b'x';
            URL_SAFE_NO_PAD.encode(raw)
        };
        let easier = {
            let mut raw = URL_SAFE_NO_PAD.decode(&c.nonce).unwrap();
            raw[9] = 0;
            URL_SAFE_NO_PAD.encode(raw)
        };
        use PowRejection::*;
        #[rustfmt::skip]
        let cases: Vec<(&str, String, u64, &str, Binding, SystemTime, Result<(), PowRejection>)> = vec![
            ("valid",               c.nonce.clone(), good, A, b, now(), Ok(())),
            ("wrong counter",       c.nonce.clone(), bad,  A, b, now(), Err(InsufficientWork)),
            ("other key",           c.nonce.clone(), good, B, b, now(), Err(BadSignature)),
            ("tampered path",       other_path,      good, A, b, now(), Err(BadSignature)),
            ("tampered difficulty", easier,          0,    A, b, now(), Err(BadSignature)),
            ("expired",             c.nonce.clone(), good, A, b, now() + TTL, Err(Expired)),
            ("other /24",           c.nonce.clone(), good, A, bind("203.0.114.7", "ua"), now(), Err(OtherPrefix)),
            ("other UA",            c.nonce.clone(), good, A, bind("203.0.113.7", "x"), now(), Err(OtherAgent)),
            ("garbage",             "%%".into(),     good, A, b, now(), Err(Malformed)),
            ("too short",           "AQ".into(),     good, A, b, now(), Err(Malformed)),
            ("too long",            "A".repeat(5000), good, A, b, now(), Err(Malformed)),
        ];
        for (name, nonce, counter, key, binding, at, want) in cases {
            let got = verify(&keys(key), &nonce, counter, binding, TTL, at).map(|_| ());
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn return_paths() {
        let cases = [
            ("/wiki/Page", true),
            ("/index.php?title=X&action=history", true),
            ("/", true),
            ("//evil.com", false),
            ("//evil.com/path", false),
            ("https://evil", false),
            ("http://evil.com/", false),
            ("\\\\evil", false),
            ("/\\evil", false),
            ("/%2F%2Fevil", true), // encoded: the browser keeps it a path
            ("", false),
            ("evil.com", false),
            ("javascript:alert(1)", false),
            ("/a\r\nSet-Cookie: x=1", false),
            ("/a b", false),
        ];
        for (path, ok) in cases {
            assert_eq!(safe_return_path(path).is_some(), ok, "{path:?}");
        }
        assert!(safe_return_path(&format!("/{}", "a".repeat(MAX_RETURN_PATH))).is_none());
    }

    #[test]
    fn unsafe_return_path_is_issued_as_root() {
        let b = bind("203.0.113.7", "ua");
        for path in ["//evil.com", "https://evil", "\\\\evil"] {
            let c = issue(&keys(A), b, 0, 1, path, now());
            let got = verify(&keys(A), &c.nonce, 0, b, TTL, now()).unwrap();
            assert_eq!(got.return_path, "/", "{path}");
        }
    }

    #[test]
    fn difficulty_is_capped() {
        let c = issue(&keys(A), bind("10.0.0.1", ""), 60, 1, "/", now());
        assert_eq!(c.difficulty, MAX_BITS);
    }
}
