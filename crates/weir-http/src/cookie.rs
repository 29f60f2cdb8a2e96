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

/// Every value of the cookie `name`, in the order the request carries them.
pub fn values<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    pairs(headers).filter_map(move |(k, v)| (k == name).then_some(v))
}

/// The first value of the cookie `name`.
pub fn value<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    pairs(headers).find_map(|(k, v)| (k == name).then_some(v))
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
}
