//! The challenge page and its script, as HTTP responses.
//!
//! The page is one self-contained HTML document: inline CSS allowed by a CSP
//! hash, the script served by weir itself from `/.weir/challenge.js` under
//! `script-src 'self'`, no other assets. It is accessible (`lang`, one `h1`,
//! an `aria-live` status, `<noscript>` text, reduced motion respected) and
//! every word comes from `[challenge.text]`.
//!
//! Status `429 Too Many Requests`: the condition is temporary and lifted by
//! the client's own action; crawlers that honour HTTP back off instead of
//! dropping the URL from an index (as 403 can make them), and shared caches
//! never store it (`Cache-Control: no-store` besides). `x-weir-challenge: 1`
//! marks it for logs, the lab and any client that wants to know.
//!
//! Owns: rendering and headers. Does not: decide when to challenge or sign
//! anything (see `mod.rs` and `pow.rs`).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use ring::digest;

use super::config::ChallengeText;

/// Where weir serves the script.
pub const SCRIPT_PATH: &str = "/.weir/challenge.js";
/// Where the page posts its answer.
pub const VERIFY_PATH: &str = "/.weir/challenge/verify";
/// The start of the name of the cookie each page sets (its seed follows),
/// so that the answer can tell whether the browser keeps cookies and was
/// shown that page: an answer without any gets its pass in the address it
/// returns to instead, one with other pages' only is refused
/// (`Challenger::handle`). Sent only to the challenge's own paths.
pub const COOKIE_PROBE: &str = "weir_cookies_";
/// Where a browser without JavaScript is sent after the wait
/// (`?nonce=...`, by the page's `<noscript>` meta refresh).
pub const REFRESH_PATH: &str = "/.weir/challenge/refresh";
/// The header that marks a challenge response.
pub const CHALLENGE_HEADER: &str = "x-weir-challenge";

const SCRIPT: &str = include_str!("challenge.js");

const CSS: &str = "\
:root{color-scheme:light dark;--fg:#1b1b1b;--bg:#f6f6f4;--card:#fff;--muted:#555;--accent:#2457c5}
@media (prefers-color-scheme:dark){:root{--fg:#ececec;--bg:#16181b;--card:#202327;--muted:#b4b4b4;--accent:#8fb0ff}}
*{box-sizing:border-box}
body{margin:0;min-height:100vh;display:flex;align-items:center;justify-content:center;\
background:var(--bg);color:var(--fg);font:1.0625rem/1.55 system-ui,-apple-system,\"Segoe UI\",Roboto,sans-serif;padding:1rem}
main{max-width:34rem;width:100%;background:var(--card);border-radius:12px;padding:2rem 2.25rem;\
box-shadow:0 1px 3px rgba(0,0,0,.12),0 8px 24px rgba(0,0,0,.06)}
h1{font-size:1.5rem;line-height:1.25;margin:0 0 .75rem}
p{margin:.5rem 0}
.status{display:flex;align-items:center;gap:.75rem;min-height:2rem;margin-top:1.25rem;color:var(--muted);font-weight:500}
.spinner{display:none;flex:none;width:1.5rem;height:1.5rem;border-radius:50%;\
border:3px solid color-mix(in srgb,var(--accent) 25%,transparent);border-top-color:var(--accent);animation:spin .9s linear infinite}
.working .spinner{display:block}
.note{border-left:4px solid var(--accent);padding:.5rem .75rem;margin-top:1.25rem}
@keyframes spin{to{transform:rotate(360deg)}}
@media (prefers-reduced-motion:reduce){.spinner{animation-duration:3s}}
";

/// The parts of the page for a browser not running its script.
struct NoScriptParts<'a> {
    /// The `<noscript>` meta refresh for the head, or nothing.
    refresh: String,
    /// The text shown in the body's `<noscript>`.
    text: &'a str,
    /// The `data-refresh` attribute the script follows where it cannot do
    /// the work, or nothing.
    fallback: String,
}

/// The parts of the page that do not change per request.
#[derive(Debug, Clone)]
pub struct PageTemplate {
    text: ChallengeText,
    csp: HeaderValue,
    /// A short digest of the script: its URL changes when it does, so it can
    /// be cached for long.
    script_version: String,
    /// The `<noscript>` meta refresh's wait, when people without JavaScript
    /// are let through (`no_script`).
    no_script_delay: Option<std::time::Duration>,
}

impl PageTemplate {
    pub fn new(text: &ChallengeText, no_script_delay: Option<std::time::Duration>) -> PageTemplate {
        let style_hash = STANDARD.encode(digest::digest(&digest::SHA256, CSS.as_bytes()));
        let csp = format!(
            "default-src 'none'; script-src 'self'; style-src 'sha256-{style_hash}'; \
             form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
        );
        let script_digest = digest::digest(&digest::SHA256, SCRIPT.as_bytes());
        let script_version = script_digest.as_ref()[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        PageTemplate {
            text: text.clone(),
            // Made only of ASCII from this file and base64.
            csp: HeaderValue::from_str(&csp)
                .unwrap_or(HeaderValue::from_static("default-src 'none'")),
            script_version,
            no_script_delay,
        }
    }

    /// The challenge page for one request, whose navigation has already
    /// `waited` for it (the no-script refresh asks for the rest of its
    /// delay), setting the page's `probe` cookie (a `Set-Cookie` value).
    pub fn render(
        &self,
        nonce: &str,
        difficulty: u8,
        waited: std::time::Duration,
        probe: &str,
    ) -> Response<Bytes> {
        let no_script = self.no_script_parts(nonce, waited);
        let html = self.page_html(nonce, difficulty, &no_script);
        self.challenge_response(html, probe)
    }

    /// What the page says and does for a browser not running its script:
    /// the `<noscript>` meta refresh (when such browsers are let through),
    /// the text shown to them, and the script's `data-refresh` fallback.
    fn no_script_parts(&self, nonce: &str, waited: std::time::Duration) -> NoScriptParts<'_> {
        let t = &self.text;
        // Inside `<noscript>` in the head: only a browser not running the
        // script follows it (the nonce is base64url, safe in a URL).
        // The script follows it too where the browser is too old to do the
        // work (`data-refresh`).
        let link = format!("{REFRESH_PATH}?nonce={}", escape(nonce));
        match self.no_script_delay {
            Some(wait) => NoScriptParts {
                refresh: format!(
                    "<noscript><meta http-equiv=\"refresh\" content=\"{}; url={link}\"></noscript>\n",
                    // Whole seconds only (HTML ignores a fraction): 0
                    // for the default 500 ms; weir holds the link for
                    // the rest (`Challenger::refresh_hold`).
                    wait.saturating_sub(waited).as_secs(),
                ),
                text: &t.noscript_wait,
                fallback: format!(" data-refresh=\"{link}\""),
            },
            None => NoScriptParts {
                refresh: String::new(),
                text: &t.noscript,
                fallback: String::new(),
            },
        }
    }

    /// The page's HTML document, every text escaped.
    fn page_html(&self, nonce: &str, difficulty: u8, no_script: &NoScriptParts<'_>) -> String {
        let t = &self.text;
        let e = escape;
        format!(
            r#"<!doctype html>
<html lang="{lang}">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="robots" content="noindex, nofollow">
<title>{title}</title>
{refresh}<style>{css}</style>
</head>
<body>
<main id="weir-challenge" data-bits="{difficulty}" data-text-working="{working}" data-text-done="{done}" data-text-failed="{failed}" data-text-cookies="{cookies}"{fallback}>
<h1>{heading}</h1>
<p>{explanation}</p>
<div class="status"><div class="spinner" aria-hidden="true"></div><p id="weir-status" role="status" aria-live="polite"></p></div>
<noscript><p class="note">{noscript}</p></noscript>
<form id="weir-form" method="post" action="{verify}">
<input type="hidden" name="nonce" value="{nonce}">
<input type="hidden" name="counter" value="">
</form>
</main>
<script src="{script}?v={version}"></script>
</body>
</html>
"#,
            lang = e(&t.lang),
            title = e(&t.title),
            refresh = no_script.refresh,
            css = CSS,
            working = e(&t.working),
            done = e(&t.done),
            failed = e(&t.failed),
            cookies = e(&t.cookies_needed),
            fallback = no_script.fallback,
            heading = e(&t.heading),
            explanation = e(&t.explanation),
            noscript = e(no_script.text),
            verify = VERIFY_PATH,
            nonce = e(nonce),
            script = SCRIPT_PATH,
            version = self.script_version,
        )
    }

    /// The page as a `429` response with its security and caching headers,
    /// setting the `probe` cookie.
    fn challenge_response(&self, html: String, probe: &str) -> Response<Bytes> {
        let mut resp = Response::new(Bytes::from(html));
        *resp.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        h.insert(header::CONTENT_SECURITY_POLICY, self.csp.clone());
        h.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        h.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("same-origin"),
        );
        h.insert(CHALLENGE_HEADER, HeaderValue::from_static("1"));
        // Made here of a checked name, hex and constants.
        if let Ok(probe) = HeaderValue::from_str(probe) {
            h.insert(header::SET_COOKIE, probe);
        }
        resp
    }

    /// `GET /.weir/challenge.js`.
    pub fn script(&self) -> Response<Bytes> {
        let mut resp = Response::new(Bytes::from_static(SCRIPT.as_bytes()));
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/javascript; charset=utf-8"),
        );
        // The page asks for `?v=<digest>`, so a new script is a new URL.
        h.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("public, max-age=86400, immutable"),
        );
        h.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        resp
    }

    pub fn script_version(&self) -> &str {
        &self.script_version
    }
}

/// HTML text and attribute escaping.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page() -> (String, http::HeaderMap) {
        let resp = PageTemplate::new(&ChallengeText::default(), None).render(
            "Tk9OQ0U",
            16,
            std::time::Duration::ZERO,
            "weir_cookies_1=1",
        );
        let headers = resp.headers().clone();
        (
            String::from_utf8(resp.into_body().to_vec()).unwrap(),
            headers,
        )
    }

    #[test]
    fn page_headers() {
        let (_, h) = page();
        let cases = [
            ("cache-control", "no-store"),
            ("x-weir-challenge", "1"),
            ("content-type", "text/html; charset=utf-8"),
            ("x-content-type-options", "nosniff"),
        ];
        for (name, want) in cases {
            assert_eq!(h.get(name).unwrap(), want, "{name}");
        }
        let csp = h.get("content-security-policy").unwrap().to_str().unwrap();
        assert!(csp.contains("script-src 'self'"), "{csp}");
        assert!(!csp.contains("unsafe-inline"), "{csp}");
    }

    #[test]
    fn style_hash_matches_the_inline_style() {
        // The browser hashes the exact text between <style> and </style>.
        let (html, h) = page();
        let start = html.find("<style>").unwrap() + "<style>".len();
        let end = html.find("</style>").unwrap();
        let want = STANDARD.encode(digest::digest(
            &digest::SHA256,
            &html.as_bytes()[start..end],
        ));
        let csp = h.get("content-security-policy").unwrap().to_str().unwrap();
        assert!(csp.contains(&format!("'sha256-{want}'")), "{csp}");
    }

    #[test]
    fn page_is_accessible_and_self_contained() {
        let (html, _) = page();
        for needle in [
            "<html lang=\"en\">",
            "<h1>",
            "role=\"status\" aria-live=\"polite\"",
            "<noscript>",
            "action=\"/.weir/challenge/verify\"",
            "name=\"nonce\" value=\"Tk9OQ0U\"",
            "data-bits=\"16\"",
            "<script src=\"/.weir/challenge.js?v=",
        ] {
            assert!(html.contains(needle), "missing {needle}");
        }
        for absent in ["http://", "https://", "<script>", " onload=", "<img"] {
            assert!(!html.contains(absent), "page contains {absent}");
        }
    }

    #[test]
    fn text_is_escaped() {
        let text = ChallengeText {
            heading: "<script>alert(1)</script>".into(),
            lang: "en\" onload=\"x".into(),
            ..ChallengeText::default()
        };
        let resp = PageTemplate::new(&text, None).render(
            "n",
            1,
            std::time::Duration::ZERO,
            "weir_cookies_1=1",
        );
        let html = String::from_utf8(resp.into_body().to_vec()).unwrap();
        assert!(html.contains("<h1>&lt;script&gt;alert(1)&lt;/script&gt;</h1>"));
        assert!(html.contains("lang=\"en&quot; onload=&quot;x\""));
    }

    #[test]
    fn script_is_cacheable_javascript() {
        let resp = PageTemplate::new(&ChallengeText::default(), None).script();
        assert_eq!(
            resp.headers()["content-type"],
            "text/javascript; charset=utf-8"
        );
        let body = std::str::from_utf8(resp.body()).unwrap();
        assert!(body.contains("crypto.subtle") || body.contains("subtle.digest"));
        assert!(body.contains("'SHA-256'"));
    }
}
