//! The pass is a bearer secret (bound to a /24 and a browser, for hours):
//! what weir does so it reaches no one but the browser that earned it.
//!
//! - The cookie: taken out of the request before it is forwarded
//!   (`proxy::forwarding`), as weir's visit cookie is.
//! - The address: a browser that keeps no cookies gets the pass in the
//!   address of the page it returns to (`Challenger::handle`); the target
//!   phase takes every occurrence out of the target before anything reads
//!   it (`weir_http::target::Target::take_query_pairs`), and the page's
//!   answer carries [`REFERRER_POLICY`], so the browser sends no more than
//!   the origin on from that page.
//! - The `Referer`: a page whose address held a pass names it in the
//!   `Referer` of the next request; [`referer_without_pass`] takes it out
//!   before the log records it or the app sees it.
//!
//! Owns: those rewritings of text. Does not: decide when they run (the
//! proxy's phases do).

use http::HeaderValue;

/// The `Referrer-Policy` of an answer to a request whose pass came in its
/// address: the browser's address bar holds the pass, and without it the
/// next request would carry it in its `Referer` to whoever the page links
/// to. `strict-origin`: never more than the origin, never over plain HTTP
/// from HTTPS.
pub const REFERRER_POLICY: HeaderValue = HeaderValue::from_static("strict-origin");

/// `referer` with every `name=` pair taken out of its query (any spelling
/// the app would read as `name`), or `None` when it carries none.
pub fn referer_without_pass(referer: &HeaderValue, name: &str) -> Option<HeaderValue> {
    let clean = without_pass(referer.to_str().ok()?, name)?;
    HeaderValue::from_str(&clean).ok()
}

/// `text` (a URL, or a path and query) with every `name=` pair taken out
/// of its query, or `None` when it carries none: for a target weir could
/// not read, which the log records as sent.
pub fn without_pass(text: &str, name: &str) -> Option<String> {
    let bytes = text.as_bytes();
    // Most carry none: look before reading.
    memchr::memmem::find(bytes, name.as_bytes()).or_else(|| memchr::memchr(b'%', bytes))?;
    let (base, query) = text.split_once('?')?;
    let mut taken = false;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let key = pair.split_once('=').map_or(*pair, |(k, _)| k);
            let ours = !key.is_empty()
                && weir_http::target::query_keys(key)
                    .next()
                    .is_some_and(|k| k == name);
            taken |= ours;
            !ours
        })
        .collect();
    if !taken {
        return None;
    }
    let mut out = base.to_owned();
    if !kept.is_empty() {
        out.push('?');
        out.push_str(&kept.join("&"));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pass_leaves_the_referer_and_the_rest_stays() {
        let strip = |r: &str| {
            referer_without_pass(&HeaderValue::from_str(r).unwrap(), "weir_pass")
                .map(|v| v.to_str().unwrap().to_owned())
        };
        let cases = [
            (
                "https://w.example/wiki/A?weir_pass=T",
                Some("https://w.example/wiki/A"),
            ),
            (
                "https://w.example/w?a=1&weir_pass=T&b=2",
                Some("https://w.example/w?a=1&b=2"),
            ),
            (
                "https://w.example/w?weir_pass=x&weir_pass=T",
                Some("https://w.example/w"),
            ),
            (
                "https://w.example/w?%77eir_pass=T&a=1",
                Some("https://w.example/w?a=1"),
            ),
            ("https://w.example/w?a=1", None),
            ("https://w.example/w?weir_passport=1", None),
            ("https://w.example/weir_pass", None),
            ("https://w.example/", None),
        ];
        for (referer, want) in cases {
            assert_eq!(strip(referer).as_deref(), want, "{referer}");
        }
    }
}
