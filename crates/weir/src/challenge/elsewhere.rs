//! Instances that share no key: what one does with a nonce or a pass
//! another signed, so that a browser behind a balancer over several
//! instances, each signing with a key of its own (no `challenge.keys`, no
//! shared Redis, separate state), solves at most one challenge per
//! instance, never one per page (issue 56: 265-316 documents for one page,
//! each instance refusing the others' answers and overwriting their
//! passes).
//!
//! - **An answer for another instance** (a nonce none of this instance's
//!   keys signed) is sent to try again: `307` to the same address, with a
//!   hop count, so the balancer hands it to another instance with the same
//!   method and body, until the one that signed it takes it. A browser
//!   follows 20 redirects; weir stops at [`MAX_HOPS`] and refuses as
//!   before. Forged nonces cost a crawler nothing more than before: they
//!   are refused after the hops, and mint nothing.
//! - **Passes side by side.** A pass this instance mints keeps, in the same
//!   cookie, the passes of up to three other instances the browser already
//!   holds ([`token::side_by_side`]), instead of replacing them. Every
//!   instance finds its own among them.
//!
//! Owns: the hop, and which passes a new one keeps beside it. Does not:
//! verify anything (`pow`, `token`), or share a key (`fleet_key`).

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};
use weir_http::target::Target;

use super::keyring::{Binding, Keyring};
use super::token::{self, TokenRejection};

/// The most times an answer is sent on to find the instance that signed
/// it: for a fleet of N instances with requests spread at random, the
/// chance it is not found is `(1 - 1/N)^16` (0.2% for three, 3% for five).
pub const MAX_HOPS: u32 = 16;

/// The query key that counts the hops.
const HOP_KEY: &str = "hop";

/// `307` to `target`'s own address with one more hop, or `None` once
/// [`MAX_HOPS`] are spent.
pub fn try_another_instance(target: &Target) -> Option<Response<Bytes>> {
    let query = target.query().unwrap_or("");
    let hops = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("hop="))
        .and_then(|n| n.parse::<u32>().ok())
        .unwrap_or(0);
    if hops >= MAX_HOPS {
        return None;
    }
    let kept: Vec<&str> = (query.split('&'))
        .filter(|kv| !kv.is_empty() && !kv.starts_with("hop="))
        .collect();
    let mut location = format!("{}?", target.path());
    for kv in kept {
        location.push_str(kv);
        location.push('&');
    }
    location.push_str(&format!("{HOP_KEY}={}", hops + 1));
    let mut resp = Response::new(Bytes::new());
    *resp.status_mut() = StatusCode::TEMPORARY_REDIRECT;
    let h = resp.headers_mut();
    // A checked path and a query weir read: ASCII; else no hop.
    h.insert(header::LOCATION, HeaderValue::from_str(&location).ok()?);
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Some(resp)
}

/// The passes among `values` (the request's pass cookies) that other
/// instances signed: well formed, and not signed by any of `keys`. A pass
/// of this instance's own, valid or not, is replaced by the new one.
pub fn others_passes<'a>(
    keys: &Keyring,
    values: impl Iterator<Item = &'a str>,
    binding: Binding,
    now: SystemTime,
    ttl: Duration,
) -> Vec<&'a str> {
    values
        .flat_map(token::side_by_side)
        .filter(|t| token::is_well_formed(t))
        .filter(|t| {
            matches!(
                token::verify(keys, t, binding, now, ttl),
                Err(TokenRejection::BadSignature)
            )
        })
        .take(token::MAX_SIDE_BY_SIDE - 1)
        .collect()
}

/// A new pass with `others` beside it, as one cookie value.
pub fn beside(own: &str, others: &[&str]) -> String {
    let mut value = own.to_owned();
    for other in others {
        value.push(token::SIDE_BY_SIDE);
        value.push_str(other);
    }
    value
}

/// The request's pass cookies named `name`.
pub fn pass_values<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = &'a str> {
    weir_http::cookie::values(headers, name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_http::target::PathPolicy;

    fn target(method: &str, path: &str) -> Target {
        Target::parse(method, path, Some("t"), PathPolicy::default()).unwrap()
    }

    fn location(r: &Response<Bytes>) -> &str {
        r.headers()[header::LOCATION].to_str().unwrap()
    }

    #[test]
    fn an_answer_for_another_instance_hops_until_the_hops_are_spent() {
        let first = try_another_instance(&target("POST", "/.weir/challenge/verify")).unwrap();
        assert_eq!(first.status(), StatusCode::TEMPORARY_REDIRECT);
        assert_eq!(location(&first), "/.weir/challenge/verify?hop=1");
        let refresh = target("GET", "/.weir/challenge/refresh?nonce=abc&hop=3");
        let next = try_another_instance(&refresh).unwrap();
        assert_eq!(location(&next), "/.weir/challenge/refresh?nonce=abc&hop=4");
        let spent = format!("/.weir/challenge/verify?hop={MAX_HOPS}");
        assert!(try_another_instance(&target("POST", &spent)).is_none());
    }

    #[test]
    fn a_new_pass_keeps_other_instances_passes_beside_it_and_drops_its_own() {
        let mine =
            Keyring::new(&["k".repeat(32)], super::super::keyring::Purpose::PassToken).unwrap();
        let theirs =
            Keyring::new(&["t".repeat(32)], super::super::keyring::Purpose::PassToken).unwrap();
        let client = crate::identity::ClientAddr::new("127.0.0.1".parse().unwrap());
        let binding = Binding::of(client, b"ua");
        let now = SystemTime::now();
        let ttl = Duration::from_secs(3600);
        let minted = |keys: &Keyring, id| {
            let m = token::Minted {
                id,
                kind: token::PassKind::Work,
                now,
                ttl,
            };
            token::issue(keys, m, binding)
        };
        let (old_mine, other) = (minted(&mine, 1), minted(&theirs, 2));
        let cookie = beside(&old_mine, &[&other]);
        let others = others_passes(&mine, [cookie.as_str()].into_iter(), binding, now, ttl);
        assert_eq!(others, vec![other.as_str()], "only the other instance's");
        let new = minted(&mine, 3);
        let value = beside(&new, &others);
        assert!(token::is_well_formed(&value));
        let found: Vec<_> = token::side_by_side(&value)
            .filter_map(|t| token::verify(&theirs, t, binding, now, ttl).ok())
            .collect();
        assert_eq!(found.len(), 1, "the other instance still finds its own");
        let junk = "x".repeat(7);
        let others = others_passes(&mine, [junk.as_str()].into_iter(), binding, now, ttl);
        assert!(others.is_empty(), "only well-formed passes are kept");
    }
}
