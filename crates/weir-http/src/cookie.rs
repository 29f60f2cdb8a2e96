//! Reading cookies from a request's `Cookie` fields (RFC 6265 §5.4): one
//! reader for every stage that looks at a cookie (sessions, rules, the
//! challenge's pass), so no two stages can disagree on what a request
//! carries.
//!
//! Names match exactly (case-sensitive, as browsers send them); pairs are
//! split on `;` across every `Cookie` field (HTTP/2 sends one field per
//! cookie), and whitespace around names and values is not part of them.
//! Values are returned as sent: no quotes removed, no percent-decoding.

use http::HeaderMap;
use http::header::COOKIE;

/// Whether `name` is a cookie name weir sets: letters, digits, `_` and `-`
/// (a subset of RFC 6265's token every browser keeps).
pub fn is_settable_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Every value of the cookie `name`, in the order the request carries them.
pub fn values<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    pairs(headers).filter_map(move |(k, v)| (k == name).then_some(v))
}

/// The first value of the cookie `name`.
pub fn value<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    pairs(headers).find_map(|(k, v)| (k == name).then_some(v))
}

/// The name of every cookie the request carries, in order.
pub fn names(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    pairs(headers).map(|(k, _)| k)
}

/// Removes every pair of the cookie `name` from the request's `Cookie`
/// fields (a field left empty goes), keeping the others as sent. Returns
/// whether any was removed. For cookies that are the gateway's own, which
/// the app has no use for (and which a cache keyed on `Cookie` would see).
pub fn remove(headers: &mut HeaderMap, name: &str) -> bool {
    let named = |pair: &str| pair.split_once('=').is_some_and(|(k, _)| k.trim() == name);
    let carries = |v: &str| v.split(';').any(named);
    // Most requests carry none of it: look before copying anything.
    if !(headers.get_all(COOKIE).iter()).any(|f| f.to_str().is_ok_and(carries)) {
        return false;
    }
    let fields: Vec<_> = headers.get_all(COOKIE).iter().cloned().collect();
    headers.remove(COOKIE);
    for field in fields {
        let Ok(text) = field.to_str() else {
            headers.append(COOKIE, field);
            continue;
        };
        if !carries(text) {
            headers.append(COOKIE, field);
            continue;
        }
        let kept: Vec<&str> = text
            .split(';')
            .map(str::trim)
            .filter(|pair| !pair.is_empty() && !named(pair))
            .collect();
        if kept.is_empty() {
            continue;
        }
        if let Ok(v) = http::HeaderValue::from_str(&kept.join("; ")) {
            headers.append(COOKIE, v);
        }
    }
    true
}

/// Every `name=value` pair, trimmed, in order; pairs without `=` skipped.
fn pairs(headers: &HeaderMap) -> impl Iterator<Item = (&str, &str)> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| {
            let (k, v) = pair.trim().split_once('=')?;
            Some((k.trim(), v.trim()))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(fields: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for f in fields {
            h.append(COOKIE, f.parse().unwrap());
        }
        h
    }

    #[test]
    fn cookies_across_fields_exact_names() {
        let h = headers(&["a=1; wiki_session=abc ; b=2", "wiki_session=second"]);
        assert_eq!(value(&h, "wiki_session"), Some("abc"));
        assert_eq!(
            values(&h, "wiki_session").collect::<Vec<_>>(),
            ["abc", "second"]
        );
        assert_eq!(value(&h, "Wiki_session"), None, "names are case-sensitive");
        assert_eq!(value(&h, "wiki"), None, "no prefix match");
        assert_eq!(value(&h, "missing"), None);
        assert_eq!(value(&headers(&["novalue; c=3"]), "c"), Some("3"));
    }

    #[test]
    fn removing_a_cookie_keeps_the_others_as_sent() {
        let mut h = headers(&["a=1; weir_visit=xyz ;b=2", "weir_visit=again", "c=3"]);
        assert!(remove(&mut h, "weir_visit"));
        let left: Vec<_> = h
            .get_all(COOKIE)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(left, ["a=1; b=2", "c=3"]);
        assert_eq!(value(&h, "weir_visit"), None);
        assert!(!remove(&mut h, "weir_visit"), "nothing left to remove");
        let mut only = headers(&["weir_visit=x"]);
        assert!(remove(&mut only, "weir_visit"));
        assert!(only.get(COOKIE).is_none(), "an empty field goes");
        let mut prefix = headers(&["weir_visitor=1"]);
        assert!(!remove(&mut prefix, "weir_visit"), "names match exactly");
        assert_eq!(value(&prefix, "weir_visitor"), Some("1"));
    }
}
