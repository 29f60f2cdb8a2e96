//! User-agent families for replay reports: who a rule refused, by the
//! name their `User-Agent` claims (`GPTBot`, `curl`, `Chrome`, ...).
//!
//! A claim, not a proof (anyone can send "Googlebot"): this groups a report,
//! it decides nothing. Verified crawlers are the challenge's business
//! (`[[challenge.good_bots]]`). Known crawlers and tools are looked for
//! first, since their agents often also name a browser engine; browsers
//! last, most specific first (Edge and Opera say "Chrome", Chrome says
//! "Safari").

/// Crawlers and tools by a token their agent carries, and the family
/// reported; case-sensitive, as their owners document them.
const KNOWN: &[(&str, &str)] = &[
    ("Googlebot", "Googlebot"),
    ("bingbot", "bingbot"),
    ("GPTBot", "GPTBot"),
    ("ChatGPT-User", "ChatGPT-User"),
    ("OAI-SearchBot", "OAI-SearchBot"),
    ("ClaudeBot", "ClaudeBot"),
    ("Claude-User", "Claude-User"),
    ("anthropic-ai", "anthropic-ai"),
    ("PerplexityBot", "PerplexityBot"),
    ("Bytespider", "Bytespider"),
    ("Amazonbot", "Amazonbot"),
    ("meta-externalagent", "meta-externalagent"),
    ("facebookexternalhit", "facebookexternalhit"),
    ("CCBot", "CCBot"),
    ("Applebot", "Applebot"),
    ("YandexBot", "YandexBot"),
    ("Baiduspider", "Baiduspider"),
    ("DuckDuckBot", "DuckDuckBot"),
    ("AhrefsBot", "AhrefsBot"),
    ("SemrushBot", "SemrushBot"),
    ("MJ12bot", "MJ12bot"),
    ("DotBot", "DotBot"),
    ("PetalBot", "PetalBot"),
    ("DataForSeoBot", "DataForSeoBot"),
    ("ImagesiftBot", "ImagesiftBot"),
    ("HeadlessChrome", "HeadlessChrome"),
    ("curl/", "curl"),
    ("Wget/", "Wget"),
    ("python-requests", "python"),
    ("python-urllib", "python"),
    ("Python-urllib", "python"),
    ("aiohttp", "python"),
    ("httpx", "python"),
    ("Scrapy", "Scrapy"),
    ("Go-http-client", "Go"),
    ("okhttp", "okhttp"),
    ("Java/", "Java"),
    ("Apache-HttpClient", "Java"),
    ("node-fetch", "node"),
    ("axios/", "node"),
    ("libwww-perl", "perl"),
];

/// Browsers by their token, most specific first.
const BROWSERS: &[(&str, &str)] = &[
    ("Edg/", "Edge"),
    ("OPR/", "Opera"),
    ("SamsungBrowser/", "Samsung Internet"),
    ("Firefox/", "Firefox"),
    ("Chrome/", "Chrome"),
    ("CriOS/", "Chrome"),
    ("Safari/", "Safari"),
];

/// The family of a `User-Agent`: a known crawler or tool, `other bot` for an
/// agent that calls itself a bot, crawler or spider, a browser, `other`, or
/// `none` when the request sent no agent.
pub fn family(user_agent: Option<&str>) -> &'static str {
    let Some(ua) = user_agent.filter(|ua| !ua.is_empty() && *ua != "-") else {
        return "none";
    };
    if let Some((_, name)) = KNOWN.iter().find(|(token, _)| ua.contains(token)) {
        return name;
    }
    let lower = ua.to_ascii_lowercase();
    if ["bot", "crawl", "spider", "scrape"]
        .iter()
        .any(|w| lower.contains(w))
    {
        return "other bot";
    }
    if let Some((_, name)) = BROWSERS.iter().find(|(token, _)| ua.contains(token)) {
        return name;
    }
    "other"
}

/// [`family`] remembered per agent string: a flood's rejections repeat a
/// few agents millions of times, and each lookup would scan every token.
/// Bounded: past [`Families::MAX`] distinct agents, new ones are looked up
/// each time.
#[derive(Debug, Default)]
pub struct Families {
    known: std::collections::HashMap<Box<str>, &'static str>,
}

impl Families {
    const MAX: usize = 10_000;

    pub fn family(&mut self, user_agent: Option<&str>) -> &'static str {
        let Some(ua) = user_agent else {
            return "none";
        };
        if let Some(f) = self.known.get(ua) {
            return f;
        }
        let f = family(Some(ua));
        if self.known.len() < Self::MAX {
            self.known.insert(ua.into(), f);
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::{Families, family};

    #[test]
    fn remembered_families_are_the_same() {
        let mut f = Families::default();
        for ua in [Some("curl/8"), Some("curl/8"), None, Some("GPTBot/1.2")] {
            assert_eq!(f.family(ua), family(ua));
        }
        assert_eq!(f.known.len(), 2);
    }

    #[test]
    fn families_of_real_agents() {
        let cases: &[(Option<&str>, &str)] = &[
            (None, "none"),
            (Some(""), "none"),
            (Some("-"), "none"),
            (
                Some(
                    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
                ),
                "Chrome",
            ),
            (
                Some(
                    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36 Edg/131.0.0.0",
                ),
                "Edge",
            ),
            (
                Some("Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0"),
                "Firefox",
            ),
            (
                Some(
                    "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Mobile/15E148 Safari/604.1",
                ),
                "Safari",
            ),
            (
                Some(
                    "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; GPTBot/1.2; +https://openai.com/gptbot)",
                ),
                "GPTBot",
            ),
            (
                Some(
                    "Mozilla/5.0 (Linux; Android 6.0.1; Nexus 5X Build/MMB29P) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.6778.69 Mobile Safari/537.36 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
                ),
                "Googlebot",
            ),
            (
                Some(
                    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) HeadlessChrome/131.0.0.0 Safari/537.36",
                ),
                "HeadlessChrome",
            ),
            (Some("curl/8.11.0"), "curl"),
            (Some("python-requests/2.32.3"), "python"),
            (Some("Go-http-client/1.1"), "Go"),
            (
                Some("Mozilla/5.0 (compatible; SomeNewCrawler/0.1)"),
                "other bot",
            ),
            (Some("Lynx/2.9.0dev.12 libwww-FM/2.14"), "other"),
        ];
        for (ua, want) in cases {
            assert_eq!(family(*ua), *want, "{ua:?}");
        }
    }
}
