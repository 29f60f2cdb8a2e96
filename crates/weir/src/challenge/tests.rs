//! Tests of the [`Challenger`] facade: config checks, eligibility, the pass
//! check and the verify endpoint, all with injected time.

use super::*;
use crate::identity::{AddrSource, ClientAddr, PeerAddr};
use weir_http::target::PathPolicy;

const KEY: &str = "0123456789abcdef0123456789abcdef";
const UA: &str = "Mozilla/5.0 (X11; Linux x86_64) Firefox/140.0";

thread_local! {
    /// Each test's own per-network budget (a test runs on a thread of its
    /// own).
    static BUDGET: &'static ChallengeBudget = Box::leak(Box::default());
}

/// The challenge answering at `now`, with this test's budget.
fn at(now: SystemTime) -> At<'static> {
    At {
        now,
        budget: BUDGET.with(|b| *b),
    }
}

fn asker<'a>(client: &'a ClientId, headers: &'a HeaderMap, tls: bool) -> Asker<'a> {
    Asker {
        client,
        headers,
        tls,
    }
}

fn config() -> ChallengeConfig {
    ChallengeConfig {
        keys: vec![KEY.into()],
        difficulty: 8,
        max_difficulty: 10,
        allow_cidrs: vec!["192.0.2.0/24".into()],
        good_bots: vec![
            GoodBotConfig {
                name: "googlebot".into(),
                user_agent: "Googlebot/".into(),
                cidrs: vec!["66.249.64.0/19".into()],
            },
            GoodBotConfig {
                name: "uptime".into(),
                user_agent: "UptimeChecker/".into(),
                cidrs: vec![],
            },
        ],
        ..ChallengeConfig::default()
    }
}

fn challenger() -> Challenger {
    Challenger::new(&config()).unwrap()
}

fn client(ip: &str) -> ClientId {
    let addr = std::net::SocketAddr::new(ip.parse().unwrap(), 40000);
    ClientId {
        peer: PeerAddr(addr),
        client: ClientAddr::new(addr.ip()),
        source: AddrSource::Peer,
    }
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            http::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    h
}

fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

const NAV: &str = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";

#[test]
#[allow(clippy::type_complexity)] // one tuple per table row
fn config_errors_name_the_key() {
    #[rustfmt::skip]
    let cases: Vec<(&str, Box<dyn Fn(&mut ChallengeConfig)>, &str)> = vec![
        ("no keys",         Box::new(|c| c.keys.clear()),                         "challenge.keys is empty"),
        ("short key",       Box::new(|c| c.keys = vec!["x".into()]),              "challenge.keys[0] is 1 bytes"),
        ("difficulty low",  Box::new(|c| c.difficulty = 2),                       "challenge.difficulty = \"2\""),
        ("max below base",  Box::new(|c| c.max_difficulty = 7),                   "challenge.max_difficulty"),
        ("max above 28",    Box::new(|c| c.max_difficulty = 40),                  "challenge.max_difficulty"),
        ("pass ttl",        Box::new(|c| c.pass_ttl = crate::config::ConfigDuration::secs(30)), "challenge.pass_ttl"),
        ("solve ttl",       Box::new(|c| c.solve_ttl = crate::config::ConfigDuration::secs(1)), "challenge.solve_ttl"),
        ("queue depth",     Box::new(|c| c.pressure.queue_depth = 1),             "challenge.pressure.queue_depth"),
        ("cookie name",     Box::new(|c| c.cookie_name = "a b".into()),           "challenge.cookie_name"),
        ("empty prefix",    Box::new(|c| c.exempt_prefixes.push(String::new())),  "challenge.exempt_prefixes[6]"),
        ("relative path",   Box::new(|c| c.exempt_paths = vec!["robots.txt".into()]), "challenge.exempt_paths[0]"),
        ("bad cidr",        Box::new(|c| c.allow_cidrs = vec!["10.0.0.0/33".into()]), "challenge.allow_cidrs"),
        ("bad bot cidr",    Box::new(|c| c.good_bots[0].cidrs = vec!["x".into()]), "challenge.good_bots[0].cidrs"),
        ("bot ua empty",    Box::new(|c| c.good_bots[1].user_agent = "".into()),  "challenge.good_bots[1].user_agent"),
    ];
    for (name, change, want) in cases {
        let mut c = config();
        change(&mut c);
        let err = Challenger::new(&c).err().map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.contains(want)),
            "{name}: {err:?} does not contain {want:?}"
        );
    }
    assert!(Challenger::new(&config()).is_ok());
}

/// `method target` as received with `Host: wiki.example`.
fn target(method: &str, target: &str) -> Target {
    Target::parse(method, target, Some("wiki.example"), PathPolicy::default()).unwrap()
}

#[test]
#[allow(clippy::type_complexity)] // one tuple per table row
fn eligibility_table() {
    let ch = challenger();
    use Exemption::*;
    const B: (&str, &str) = ("user-agent", UA);
    #[rustfmt::skip]
    let cases: &[(&str, &str, &str, &[(&str, &str)], Option<Exemption>)] = &[
        // method, uri, client, headers, expected exemption (None = eligible)
        ("GET",  "/wiki/Page",              "203.0.113.7", &[("accept", NAV), ("user-agent", UA)], None),
        ("HEAD", "/wiki/Page",              "203.0.113.7", &[("accept", NAV), B], None),
        ("GET",  "/wiki/Page",              "203.0.113.7", &[("sec-fetch-mode", "navigate"), ("accept", "*/*")], None),
        ("GET",  "/index.php?title=X&action=history", "203.0.113.7", &[("accept", "text/html"), B], None),
        ("GET",  "/wiki/Page",              "2001:db8::1", &[("accept", "text/html"), B], None),
        ("POST", "/wiki/Page",              "203.0.113.7", &[("accept", NAV)], Some(Method)),
        ("PUT",  "/wiki/Page",              "203.0.113.7", &[("accept", NAV)], Some(Method)),
        ("GET",  "/wiki/Page",              "203.0.113.7", &[("accept", "application/json")], Some(NotNavigation)),
        ("GET",  "/wiki/Page",              "203.0.113.7", &[("accept", "*/*")], Some(NotNavigation)),
        ("GET",  "/wiki/Page",              "203.0.113.7", &[], Some(NotNavigation)),
        ("GET",  "/wiki/Page",              "203.0.113.7", &[("accept", "text/html;q=0, */*")], Some(NotNavigation)),
        ("GET",  "/wiki/Page",              "203.0.113.7", &[("sec-fetch-mode", "cors"), ("accept", "text/html")], Some(NotNavigation)),
        ("GET",  "/wiki/Page",              "203.0.113.7", &[("sec-fetch-mode", "no-cors"), ("accept", NAV)], Some(NotNavigation)),
        ("GET",  "/api/v1/items",           "203.0.113.7", &[("accept", NAV)], Some(Path)),
        ("GET",  "/api.php?action=query",   "203.0.113.7", &[("accept", NAV)], Some(Path)),
        ("GET",  "/robots.txt",             "203.0.113.7", &[("accept", NAV)], Some(Path)),
        ("GET",  "/healthz",                "203.0.113.7", &[("accept", NAV)], Some(Path)),
        ("GET",  "/.well-known/security.txt", "203.0.113.7", &[("accept", NAV)], Some(Path)),
        ("GET",  "/static/app.CSS",         "203.0.113.7", &[("accept", NAV)], Some(Path)),
        ("GET",  "/%61pi/v1/items",         "203.0.113.7", &[("accept", NAV)], Some(Path)),
        // Issue 17: exemptions match the path the app reads.
        ("GET",  "/static/../wiki/Page",    "203.0.113.7", &[("accept", NAV), B], None),
        ("GET",  "/static/%2e%2e/wiki/Page", "203.0.113.7", &[("accept", NAV), B], None),
        ("GET",  "/api//../wiki/Page",      "203.0.113.7", &[("accept", NAV), B], None),
        // A navigation ending in `.css` can be a page (MediaWiki reads this
        // as a search): no suffix exempts a navigation.
        ("GET",  "/wiki/Special:Search/x.css", "203.0.113.7", &[("accept", NAV), B], None),
        ("GET",  "/images/logo.png",        "203.0.113.7", &[("accept", NAV), B], None),
        ("GET",  "/images/logo.png",        "203.0.113.7", &[("accept", "image/avif,image/webp,*/*")], Some(NotNavigation)),
        ("GET",  "/index.php?%66eed=atom",  "203.0.113.7", &[("accept", NAV)], Some(Query)),
        ("GET",  "/index.php?title=Special:RecentChanges&feed=atom", "203.0.113.7", &[("accept", NAV)], Some(Query)),
        ("GET",  "/index.php?feedformat=rss", "203.0.113.7", &[("accept", NAV)], Some(Query)),
        ("GET",  "/.weir/challenge.js",     "203.0.113.7", &[("accept", NAV)], Some(WeirPath)),
        ("GET",  "/wiki/Page",              "192.0.2.55",  &[("accept", NAV)], Some(AllowedNetwork)),
        ("GET",  "/wiki/Page",              "66.249.66.1", &[("accept", NAV), ("user-agent", "Mozilla/5.0 (compatible; Googlebot/2.1)")], Some(GoodBot("googlebot".into()))),
        // Claims Googlebot from outside Google's networks, as a browser
        // (fetch metadata): challenged.
        ("GET",  "/wiki/Page",              "203.0.113.7", &[("accept", NAV), ("sec-fetch-mode", "navigate"), ("user-agent", "Mozilla/5.0 (compatible; Googlebot/2.1)")], None),
        // Without fetch metadata: a crawler, which cannot pass the page. It
        // meets the rules and the lowest lane, as curl does.
        ("GET",  "/wiki/Page",              "203.0.113.7", &[("accept", NAV), ("user-agent", "Mozilla/5.0 (compatible; Googlebot/2.1)")], Some(NotABrowser)),
        // Google's network without the claim: an ordinary client.
        ("GET",  "/wiki/Page",              "66.249.66.1", &[("accept", NAV), ("user-agent", UA)], None),
        // A bot listed without networks: the User-Agent alone (spoofable).
        ("GET",  "/wiki/Page",              "203.0.113.7", &[("accept", NAV), ("user-agent", "UptimeChecker/1.0")], Some(GoodBot("uptime".into()))),
        // Clients that cannot pass the page (issue 40): what they send.
        ("GET",  "/wiki/Page",              "203.0.113.7", &[("accept", NAV)], Some(NotABrowser)),
        ("GET",  "/wiki/Page",              "203.0.113.7", &[("accept", "text/html, text/plain, text/sgml, text/css, */*;q=0.01"), ("user-agent", "Lynx/2.9.0dev.12 libwww-FM/2.14 SSL-MM/1.4.1 GNUTLS/3.7.8")], Some(NotABrowser)),
        ("GET",  "/wiki/Page",              "203.0.113.7", &[("accept", "text/html, text/*;q=0.5, image/*, application/*"), ("user-agent", "w3m/0.5.3+git20230121")], Some(NotABrowser)),
        ("GET",  "/wiki/Page",              "203.0.113.7", &[("accept", NAV), ("user-agent", "Mozilla/5.0 (compatible; archive.org_bot +http://archive.org/details/archive.org_bot) Zeno/b0c5ba6")], Some(NotABrowser)),
        ("GET",  "/wiki/Page",              "203.0.113.7", &[("accept", NAV), ("user-agent", "Mozilla/5.0 (compatible; Discordbot/2.0; +https://discordapp.com)")], Some(NotABrowser)),
        ("GET",  "/wiki/Page",              "203.0.113.7", &[("accept", "text/html"), ("user-agent", "facebookexternalhit/1.1 (+http://www.facebook.com/externalhit_uatext.php)")], Some(NotABrowser)),
        ("GET",  "/wiki/Page",              "203.0.113.7", &[("accept", "text/html"), ("user-agent", "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_11_1) AppleWebKit/601.2.4 (KHTML, like Gecko) Version/9.0.1 Safari/601.2.4 facebookexternalhit/1.1 Facebot Twitterbot/1.0")], Some(NotABrowser)),
        ("GET",  "/wiki/Page",              "203.0.113.7", &[("accept", NAV), ("user-agent", "Mozilla/5.0 (Linux; Android 6.0.1; Nexus 5X Build/MMB29P) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/141.0.0.0 Mobile Safari/537.36 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)")], Some(NotABrowser)),
        // A phone too old for fetch metadata (Safari before 16.4) is a
        // browser: its script or its refresh passes the page.
        ("GET",  "/wiki/Page",              "203.0.113.7", &[("accept", NAV), ("user-agent", "Mozilla/5.0 (iPhone; CPU iPhone OS 15_8 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/15.6.6 Mobile/15E148 Safari/604.1")], None),
    ];
    for (method, uri, ip, hdrs, want) in cases {
        let t = target(method, uri);
        let h = headers(hdrs);
        let got = ch.exemption(&t, &h, is_navigation(&h), &client(ip));
        assert_eq!(&got, want, "{method} {uri} from {ip} {hdrs:?}");
        let eligible = ch.eligible(&t, &h, is_navigation(&h), &client(ip));
        assert_eq!(eligible, want.is_none());
    }
}

/// Serves a page, solves it like the browser, posts the answer.
fn solve_and_verify(
    ch: &Challenger,
    uri: &str,
    from: &str,
    h: &HeaderMap,
    tls: bool,
    when: SystemTime,
) -> Response<Bytes> {
    let c = client(from);
    let page = ch.page(
        &target("GET", uri),
        asker(&c, h, tls),
        ch.base_difficulty(),
        at(when),
    );
    // A browser that keeps cookies sends back the one the page set.
    let mut h = h.clone();
    h.append("cookie", cookie_of(&page).parse().unwrap());
    answer_page(
        ch,
        &page,
        (from, &h),
        tls,
        when + Duration::from_millis(1500),
    )
}

/// Solves `page` and posts the answer from `from` with `h`, at `when`.
fn answer_page(
    ch: &Challenger,
    page: &Response<Bytes>,
    (from, h): (&str, &HeaderMap),
    tls: bool,
    when: SystemTime,
) -> Response<Bytes> {
    post_answer(ch, page, (from, h), tls, when).unwrap()
}

/// [`answer_page`], refused or not.
fn post_answer(
    ch: &Challenger,
    page: &Response<Bytes>,
    (from, h): (&str, &HeaderMap),
    tls: bool,
    when: SystemTime,
) -> Result<Response<Bytes>, EndpointRefusal> {
    let nonce = page_nonce(page.body()).unwrap();
    let counter = pow::solve(&nonce, ch.base_difficulty());
    let body = answer_form(&nonce, counter);
    let c = client(from);
    ch.handle(
        &target("POST", VERIFY_PATH),
        asker(&c, h, tls),
        body.as_bytes(),
        at(when),
    )
    .unwrap()
}

/// The first `Set-Cookie`'s `name=value`: a page's probe, a pass.
fn cookie_of(resp: &Response<Bytes>) -> String {
    let set = resp.headers()["set-cookie"].to_str().unwrap();
    set.split(';').next().unwrap().to_string()
}

/// The page for a browser navigation to `uri` from 203.0.113.7.
fn page_for(ch: &Challenger, uri: &str, difficulty: u8) -> Response<Bytes> {
    let h = headers(&[("accept", NAV), ("user-agent", UA)]);
    let c = client("203.0.113.7");
    ch.page(
        &target("GET", uri),
        asker(&c, &h, false),
        difficulty,
        at(now()),
    )
}

#[test]
fn page_response() {
    let ch = challenger();
    let page = page_for(&ch, "/wiki/Page", 9);
    assert_eq!(page.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(page.headers()["x-weir-challenge"], "1");
    assert_eq!(page.headers()["cache-control"], "no-store");
    assert_eq!(events(&page), &[ChallengeEvent::Issued { difficulty: 9 }]);
    let html = std::str::from_utf8(page.body()).unwrap();
    assert!(html.contains("data-bits=\"9\""));
}

/// A browser with cookies off sends back no cookie of the page's: its
/// pass comes in the address it returns to (for that page), or it would
/// get the page again and again; no cookie is set, so a browser that was
/// sent the answer by someone else's page keeps the pass it had.
#[test]
fn an_answer_without_the_page_s_cookie_gets_its_pass_in_the_address() {
    let ch = challenger();
    let h = headers(&[("accept", NAV), ("user-agent", UA)]);
    let page = page_for(&ch, "/wiki/Page?oldid=5", 8);
    let probe = page.headers()["set-cookie"].to_str().unwrap();
    assert!(
        probe.starts_with("weir_cookies_")
            && probe.contains("=1; Path=/.weir/challenge/; Max-Age=300;"),
        "{probe}"
    );
    let resp = answer_page(&ch, &page, ("203.0.113.7", &h), false, now());
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    let location = resp.headers()["location"].to_str().unwrap();
    let pass = location
        .strip_prefix("/wiki/Page?oldid=5&weir_pass=")
        .unwrap_or_else(|| panic!("{location}"));
    assert!(
        resp.headers().get("set-cookie").is_none(),
        "no cookie to set"
    );
    let carried = headers(&[("user-agent", UA), ("cookie", &format!("weir_pass={pass}"))]);
    assert!(matches!(
        ch.pass(&carried, &client("203.0.113.7"), now()),
        PassCheck::Valid(_)
    ));
}

/// Issue 54: an answer sent by another site's page is refused, and so is
/// one a browser brings that keeps cookies but was not shown its page (it
/// has other pages' probes, not this one's): either would set that
/// browser's pass to another client's.
#[test]
#[allow(clippy::type_complexity)] // one tuple per table row
fn answers_only_from_the_page_s_own_site_and_browser() {
    let ch = challenger();
    let me = client("203.0.113.7");
    let page = page_for(&ch, "/wiki/Page", 8);
    let other = page_for(&ch, "/wiki/Other", 8);
    let probe = cookie_of(&page);
    let h = |extra: &[(&str, &str)]| {
        let mut h = headers(&[("accept", NAV), ("user-agent", UA)]);
        for (k, v) in extra {
            h.append(
                http::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    };
    let refused = |extra: &[(&str, &str)]| {
        post_answer(&ch, &page, ("203.0.113.7", &h(extra)), false, now()).err()
    };
    let theirs = cookie_of(&other);
    #[rustfmt::skip]
    let cases: &[(&[(&str, &str)], Option<EndpointRefusal>)] = &[
        (&[("sec-fetch-site", "same-origin"), ("cookie", &probe)], None),
        (&[("sec-fetch-site", "none"), ("cookie", &probe)],        None),
        (&[("cookie", &probe)],                                    None),
        (&[("origin", "http://wiki.example"), ("cookie", &probe)], None),
        (&[("sec-fetch-site", "cross-site"), ("cookie", &probe)],  Some(EndpointRefusal::CrossSite)),
        (&[("sec-fetch-site", "same-site"), ("cookie", &probe)],   Some(EndpointRefusal::CrossSite)),
        (&[("origin", "https://evil.example"), ("cookie", &probe)], Some(EndpointRefusal::CrossSite)),
        (&[("origin", "null"), ("cookie", &probe)],                Some(EndpointRefusal::CrossSite)),
        (&[("cookie", &theirs)],                                   Some(EndpointRefusal::NotShownThePage)),
        (&[("cookie", &format!("{theirs}; {probe}"))],             None),
    ];
    for (extra, want) in cases {
        assert_eq!(&refused(extra), want, "{extra:?}");
    }
    use crate::respond::Reason as _;
    assert_eq!(EndpointRefusal::CrossSite.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        EndpointRefusal::NotShownThePage.event(),
        Some(ChallengeEvent::Failed(PowRejection::NotShownThePage))
    );
    // The refresh link too.
    let link = refresh_link(&page);
    let cross = h(&[("sec-fetch-site", "cross-site"), ("cookie", &probe)]);
    let resp = ch.handle(
        &target("GET", &link),
        asker(&me, &cross, false),
        b"",
        at(now() + Duration::from_secs(1)),
    );
    assert_eq!(resp.unwrap().unwrap_err(), EndpointRefusal::CrossSite);
    assert_eq!(
        ch.refresh_hold(&target("GET", &link), asker(&me, &cross, false), now()),
        None
    );
}

#[test]
fn solved_challenge_earns_a_pass() {
    let ch = challenger();
    let h = headers(&[("accept", NAV), ("user-agent", UA)]);
    let resp = solve_and_verify(&ch, "/wiki/Page?oldid=5", "203.0.113.7", &h, false, now());
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    assert_eq!(resp.headers()["location"], "/wiki/Page?oldid=5");
    let set = resp.headers()["set-cookie"].to_str().unwrap();
    for part in [
        "weir_pass=",
        "; Path=/",
        "; HttpOnly",
        "; SameSite=Lax",
        "; Max-Age=43200",
    ] {
        assert!(set.contains(part), "{set} lacks {part}");
    }
    assert!(!set.contains("Secure"), "not TLS: {set}");
    let [
        ChallengeEvent::Solved {
            difficulty: 8,
            time_to_solve,
            pass_id,
            no_script: false,
        },
    ] = events(&resp)
    else {
        panic!("events: {:?}", events(&resp));
    };
    assert_eq!(*time_to_solve, Duration::from_millis(1500));

    // The cookie is a valid pass from the same /24 and browser, with no store.
    let mut with_cookie = h.clone();
    with_cookie.insert(
        "cookie",
        format!("theme=dark; {}", cookie_of(&resp)).parse().unwrap(),
    );
    let check = ch.pass(&with_cookie, &client("203.0.113.99"), now());
    assert!(
        matches!(check, PassCheck::Valid(t) if t.id == *pass_id),
        "{check:?}"
    );
    assert_eq!(
        check.event(),
        Some(ChallengeEvent::PassAdmitted { id: *pass_id })
    );
    assert_eq!(
        ch.pass(&with_cookie, &client("198.51.100.1"), now()),
        PassCheck::Invalid(TokenRejection::OtherPrefix)
    );
    assert_eq!(
        ch.pass(
            &with_cookie,
            &client("203.0.113.7"),
            now() + Duration::from_secs(43201)
        ),
        PassCheck::Invalid(TokenRejection::Expired)
    );
    assert_eq!(
        ch.pass(&h, &client("203.0.113.7"), now()),
        PassCheck::Missing
    );

    assert!(matches!(check, PassCheck::Valid(t) if t.kind == PassKind::Work));

    // `Secure` when the client's connection is TLS (`auto`), or always, or
    // never, as `secure_cookies` says.
    for (setting, tls, secure) in [
        (SecureCookies::Auto, true, true),
        (SecureCookies::Auto, false, false),
        (SecureCookies::Always, false, true),
        (SecureCookies::Never, true, false),
    ] {
        let ch = Challenger::new(&ChallengeConfig {
            secure_cookies: setting,
            ..config()
        })
        .unwrap();
        let c = client("203.0.113.7");
        let page = ch.page(&target("GET", "/"), asker(&c, &h, tls), 8, at(now()));
        let resp = solve_and_verify(&ch, "/wiki/Page", "203.0.113.7", &h, tls, now());
        for set in [&page, &resp].map(|r| r.headers()["set-cookie"].to_str().unwrap().to_owned()) {
            assert_eq!(
                set.ends_with("; Secure"),
                secure,
                "{setting:?} tls {tls}: {set}"
            );
        }
    }
}

#[test]
fn any_valid_cookie_among_several_is_enough() {
    let ch = challenger();
    let h = headers(&[("accept", NAV), ("user-agent", UA)]);
    let resp = solve_and_verify(&ch, "/", "203.0.113.7", &h, false, now());
    let mut with = h.clone();
    with.append("cookie", "weir_pass=junk".parse().unwrap());
    with.append("cookie", cookie_of(&resp).parse().unwrap());
    assert!(matches!(
        ch.pass(&with, &client("203.0.113.7"), now()),
        PassCheck::Valid(_)
    ));
    let mut junk = h.clone();
    junk.append("cookie", "weir_pass=junk; weir_pass_x=1".parse().unwrap());
    assert_eq!(
        ch.pass(&junk, &client("203.0.113.7"), now()),
        PassCheck::Invalid(TokenRejection::Malformed)
    );
}

#[test]
fn replayed_solution_mints_the_same_pass_id() {
    let ch = challenger();
    let mut h = headers(&[("accept", NAV), ("user-agent", UA)]);
    let c = client("203.0.113.7");
    let page = ch.page(&target("GET", "/"), asker(&c, &h, false), 8, at(now()));
    h.append("cookie", cookie_of(&page).parse().unwrap());
    let nonce = page_nonce(page.body()).unwrap();
    let body = format!("nonce={nonce}&counter={}", pow::solve(&nonce, 8));
    let ids: Vec<u64> = (0..3)
        .map(|i| {
            let resp = ch
                .handle(
                    &target("POST", VERIFY_PATH),
                    asker(&c, &h, false),
                    body.as_bytes(),
                    at(now() + Duration::from_secs(i)),
                )
                .unwrap()
                .unwrap();
            match events(&resp) {
                [ChallengeEvent::Solved { pass_id, .. }] => *pass_id,
                other => panic!("{other:?}"),
            }
        })
        .collect();
    assert!(ids.windows(2).all(|w| w[0] == w[1]), "{ids:?}");
}

/// A signed nonce that does not earn a pass is sent back to its page,
/// which decides afresh; junk is refused with a plain 403 and mints no
/// nonce (issue 54: it had answered with a freshly signed one).
#[test]
#[allow(clippy::type_complexity)] // one tuple per table row
fn failed_answers() {
    let ch = challenger();
    let c = client("203.0.113.7");
    let page = ch.page(
        &target("GET", "/wiki/Page"),
        asker(&c, &headers(&[("accept", NAV), ("user-agent", UA)]), false),
        8,
        at(now()),
    );
    let probe = cookie_of(&page);
    let nonce = page_nonce(page.body()).unwrap();
    let good = pow::solve(&nonce, 8);
    let wrong = (0..)
        .find(|&n| pow::leading_zero_bits(&pow::hash(&nonce, n)) < 8)
        .unwrap();
    let ttl = Duration::from_secs(300);
    let flip = if &nonce[10..11] == "A" { "B" } else { "A" };
    let forged = format!("{}{flip}{}", &nonce[..10], &nonce[11..]);
    use PowRejection::*;
    #[rustfmt::skip]
    let cases: Vec<(&str, String, &str, &str, SystemTime, Result<PowRejection, PowRejection>)> = vec![
        ("wrong counter", format!("nonce={nonce}&counter={wrong}"), "203.0.113.7", UA, now(), Ok(InsufficientWork)),
        ("expired",       format!("nonce={nonce}&counter={good}"),  "203.0.113.7", UA, now() + ttl, Ok(Expired)),
        ("other network", format!("nonce={nonce}&counter={good}"),  "198.51.100.7", UA, now(), Ok(OtherPrefix)),
        ("other browser", format!("nonce={nonce}&counter={good}"),  "203.0.113.7", "curl/8", now(), Ok(OtherAgent)),
        ("no counter",    format!("nonce={nonce}"),                 "203.0.113.7", UA, now(), Err(Malformed)),
        ("bad counter",   format!("nonce={nonce}&counter=-1"),      "203.0.113.7", UA, now(), Err(Malformed)),
        ("huge body",     "x".repeat(MAX_VERIFY_BODY + 1),          "203.0.113.7", UA, now(), Err(Malformed)),
    ];
    for (name, body, ip, ua, when, want) in cases {
        let hh = headers(&[("user-agent", ua), ("cookie", &probe)]);
        let c = client(ip);
        let answered = ch
            .handle(
                &target("POST", VERIFY_PATH),
                asker(&c, &hh, false),
                body.as_bytes(),
                at(when),
            )
            .unwrap();
        match (want, answered) {
            (Ok(reason), Ok(resp)) => {
                assert_eq!(resp.status(), StatusCode::SEE_OTHER, "{name}");
                assert_eq!(
                    resp.headers()["location"],
                    "/wiki/Page",
                    "{name}: back to its page"
                );
                assert!(
                    resp.headers().get("set-cookie").is_none(),
                    "{name}: no pass"
                );
                assert!(
                    resp.headers().get("x-weir-challenge").is_none(),
                    "{name}: no page"
                );
                assert!(resp.body().is_empty(), "{name}: no nonce");
                assert_eq!(events(&resp), &[ChallengeEvent::Failed(reason)], "{name}");
            }
            (Err(reason), Err(refusal)) => {
                assert_eq!(refusal, EndpointRefusal::Forged(reason), "{name}");
                use crate::respond::Reason as _;
                assert_eq!(refusal.status(), StatusCode::FORBIDDEN, "{name}");
                assert_eq!(
                    refusal.event(),
                    Some(ChallengeEvent::Failed(reason)),
                    "{name}"
                );
            }
            (want, got) => panic!("{name}: want {want:?}, got {got:?}"),
        }
    }
    // A nonce no key of this instance signed may be another instance's:
    // sent on to try another (`elsewhere`), and refused once the hops
    // are spent.
    let hh = headers(&[("user-agent", UA), ("cookie", &probe)]);
    let c = client("203.0.113.7");
    let forged = format!("nonce={forged}&counter={good}");
    let answer = |path: &str| {
        ch.handle(
            &target("POST", path),
            asker(&c, &hh, false),
            forged.as_bytes(),
            at(now()),
        )
        .unwrap()
    };
    let hop = answer(VERIFY_PATH).expect("sent on");
    assert_eq!(hop.status(), StatusCode::TEMPORARY_REDIRECT);
    assert_eq!(hop.headers()["location"], "/.weir/challenge/verify?hop=1");
    assert!(hop.headers().get("set-cookie").is_none(), "no pass");
    let spent = format!("{VERIFY_PATH}?hop={}", super::elsewhere::MAX_HOPS);
    assert_eq!(
        answer(&spent).unwrap_err(),
        EndpointRefusal::Forged(BadSignature)
    );
}

#[test]
fn served_paths() {
    let ch = challenger();
    let h = HeaderMap::new();
    let c = client("203.0.113.7");
    let call = |m: Method, p: &str| {
        ch.handle(&target(m.as_str(), p), asker(&c, &h, false), b"", at(now()))
    };
    let script = call(Method::GET, "/.weir/challenge.js?v=abc")
        .unwrap()
        .unwrap();
    assert_eq!(script.status(), StatusCode::OK);
    assert!(
        script.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/javascript")
    );
    use crate::respond::Reason as _;
    let refused = call(Method::GET, VERIFY_PATH).unwrap().unwrap_err();
    assert_eq!(refused.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(refused, EndpointRefusal::MethodNotAllowed { allow: "POST" });
    assert_eq!(
        call(Method::POST, SCRIPT_PATH)
            .unwrap()
            .unwrap_err()
            .status(),
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert!(call(Method::GET, "/wiki/Page").is_none());
    assert!(call(Method::GET, "/.weir/other").is_none());
    assert!(ch.is_challenge_path(VERIFY_PATH));
    assert!(!ch.is_challenge_path("/wiki/Page"));
}

#[test]
fn open_redirects_are_impossible() {
    let ch = challenger();
    let h = headers(&[("accept", NAV), ("user-agent", UA)]);
    // An absolute-form request target (`GET http://evil/ HTTP/1.1`) or a
    // path that browsers read as another host returns the visitor to `/`.
    for (spelled, host) in [
        ("http://evil.example/x", "evil.example"),
        ("//evil.example/x", "wiki.example"),
        ("/\\evil.example", "wiki.example"),
    ] {
        let Ok(t) = Target::parse("GET", spelled, Some(host), PathPolicy::default()) else {
            continue;
        };
        let c = client("203.0.113.7");
        let page = ch.page(&t, asker(&c, &h, false), 8, at(now()));
        let resp = answer_page(&ch, &page, ("203.0.113.7", &h), false, now());
        let location = resp.headers()["location"].to_str().unwrap();
        assert!(
            location == "/"
                || (location.starts_with('/')
                    && !location.starts_with("//")
                    && !location.contains('\\')),
            "{spelled} -> {location}"
        );
    }
}

#[test]
fn form_decoding() {
    let cases: &[(&str, Option<(&str, u64)>)] = &[
        ("nonce=abc&counter=12", Some(("abc", 12))),
        ("counter=12&nonce=a%2Db", Some(("a-b", 12))),
        ("nonce=abc&counter=12&extra=1", Some(("abc", 12))),
        ("nonce=abc", None),
        ("counter=1", None),
        ("nonce=abc&counter=x", None),
        ("nonce=%zz&counter=1", None),
        ("nonce=abc&counter=18446744073709551616", None),
    ];
    for (body, want) in cases {
        let got = parse_answer(body.as_bytes());
        assert_eq!(got.as_ref().map(|(n, c)| (n.as_str(), *c)), *want, "{body}");
    }
}

/// The challenge page for a navigation to `/wiki/Page` from 203.0.113.7
/// (difficulty 8).
fn wiki_page(ch: &Challenger, h: &HeaderMap) -> Response<Bytes> {
    let page = target("GET", "/wiki/Page");
    let c = client("203.0.113.7");
    ch.page(&page, asker(&c, h, false), 8, at(now()))
}

/// The page's `<noscript>` refresh link (`/.weir/challenge/refresh?nonce=`).
fn refresh_link(page: &Response<Bytes>) -> String {
    let html = std::str::from_utf8(page.body()).unwrap();
    let marker = "url=";
    let start = html.find("http-equiv=\"refresh\"").expect("a meta refresh");
    let start = start + html[start..].find(marker).unwrap() + marker.len();
    let len = html[start..].find('"').unwrap();
    html[start..start + len].to_string()
}

#[test]
fn without_javascript_waiting_earns_a_wait_pass() {
    let ch = challenger();
    let h = headers(&[("accept", NAV), ("user-agent", UA)]);
    let me = client("203.0.113.7");
    let page = ch.page(
        &target("GET", "/wiki/Page?oldid=5"),
        asker(&me, &h, false),
        ch.base_difficulty(),
        at(now()),
    );
    let probe = cookie_of(&page);
    let html = std::str::from_utf8(page.body()).unwrap();
    assert!(
        html.contains("<noscript><meta http-equiv=\"refresh\" content=\"0; url=/.weir/challenge/refresh?nonce="),
        "{html}"
    );
    let link = refresh_link(&page);
    let follow = |from: &str, ua: &str, after_ms: u64| {
        let h = headers(&[("accept", NAV), ("user-agent", ua), ("cookie", &probe)]);
        let c = client(from);
        let when = now() + Duration::from_millis(after_ms);
        ch.handle(&target("GET", &link), asker(&c, &h, true), b"", at(when))
            .unwrap()
            .unwrap()
    };
    // The page says 0 s (the default 500 ms has no whole second): weir
    // holds a link that comes early for the rest of the delay, and only a
    // link that would earn a pass.
    let hold = |from: &str, ua: &str, after_ms: u64, link: &str| {
        let h = headers(&[("accept", NAV), ("user-agent", ua)]);
        let c = client(from);
        let when = now() + Duration::from_millis(after_ms);
        ch.refresh_hold(&target("GET", link), asker(&c, &h, false), when)
    };
    assert_eq!(
        hold("203.0.113.7", UA, 0, &link),
        Some(Duration::from_millis(500))
    );
    assert_eq!(
        hold("203.0.113.9", UA, 200, &link),
        Some(Duration::from_millis(300))
    );
    for (from, ua, after, what) in [
        ("203.0.113.7", UA, 500, "old enough"),
        ("198.51.100.7", UA, 0, "another network"),
        ("203.0.113.7", "curl/8", 0, "another browser"),
        ("203.0.113.7", UA, 301_000, "expired"),
    ] {
        assert_eq!(hold(from, ua, after, &link), None, "{what}");
    }
    let garbled = "/.weir/challenge/refresh?nonce=AAAA";
    assert_eq!(hold("203.0.113.7", UA, 0, garbled), None, "garbled");
    assert_eq!(
        hold("203.0.113.7", UA, 0, "/wiki/Page"),
        None,
        "another path"
    );
    // (from, agent, after, event): too early, another network or browser,
    // expired: back to the page; waited: the pass.
    let cases: [(&str, &str, u64, &str); 5] = [
        ("203.0.113.7", UA, 499, "too_early"),
        ("198.51.100.7", UA, 3000, "other_prefix"),
        ("203.0.113.7", "curl/8", 3000, "other_agent"),
        ("203.0.113.7", UA, 301_000, "expired"),
        ("203.0.113.9", UA, 500, "solved"),
    ];
    for (from, ua, after, event) in cases {
        let resp = follow(from, ua, after);
        assert_eq!(resp.status(), StatusCode::SEE_OTHER, "{from} {ua} {after}");
        let labels = events(&resp)[0].labels();
        let got = if labels.0 == "solved" {
            "solved"
        } else {
            labels.1
        };
        assert_eq!(got, event, "{from} {ua} {after}");
        let passed = resp.headers().get("set-cookie").is_some();
        assert_eq!(passed, event == "solved", "{from} {ua} {after}");
        assert_eq!(resp.headers()["location"], "/wiki/Page?oldid=5");
    }
    let resp = follow("203.0.113.7", UA, 4000);
    assert_eq!(resp.headers()["location"], "/wiki/Page?oldid=5");
    assert!(
        resp.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .starts_with("weir_pass=")
    );
    let [
        ChallengeEvent::Solved {
            no_script: true,
            difficulty: 0,
            pass_id,
            ..
        },
    ] = events(&resp)
    else {
        panic!("{:?}", events(&resp));
    };
    assert_eq!(events(&resp)[0].labels(), ("solved", "no_script"));
    // A pass of its own kind, counted by its id: what it is worth is the
    // proxy's to say (in a visit weir counts as a person's, as a solver's).
    let mut with = h.clone();
    with.insert("cookie", cookie_of(&resp).parse().unwrap());
    match ch.pass(&with, &me, now() + Duration::from_secs(5)) {
        PassCheck::Valid(t) => assert_eq!((t.id, t.kind), (*pass_id, PassKind::Wait)),
        other => panic!("{other:?}"),
    }
    // A garbled link: a plain 403, no nonce.
    let garbled = ch
        .handle(
            &target("GET", "/.weir/challenge/refresh?nonce=AAAA"),
            asker(&me, &h, true),
            b"",
            at(now()),
        )
        .unwrap()
        .unwrap_err();
    assert_eq!(garbled, EndpointRefusal::Forged(PowRejection::Malformed));
    let none = ch.handle(
        &target("GET", REFRESH_PATH),
        asker(&me, &h, true),
        b"",
        at(now()),
    );
    assert_eq!(
        none.unwrap().unwrap_err(),
        EndpointRefusal::Forged(PowRejection::Malformed)
    );
}

/// Issue 54: a client that follows the refresh in a loop from one /24
/// mints passes whose ids are its own only for its network's budget;
/// then every pass it redeems has the network's id: one client to the
/// rules that count passes.
#[test]
fn passes_minted_in_a_loop_share_their_network_s_id() {
    let ch = challenger();
    let h = headers(&[("accept", NAV), ("user-agent", UA)]);
    let mut ids = std::collections::HashSet::new();
    for i in 0..100u64 {
        let me = client(&format!("203.0.113.{}", i % 200));
        let page = ch.page(
            &target("GET", "/w?search=x"),
            asker(&me, &h, false),
            8,
            at(now()),
        );
        let link = refresh_link(&page);
        let mut h = h.clone();
        h.append("cookie", cookie_of(&page).parse().unwrap());
        let resp = ch
            .handle(
                &target("GET", &link),
                asker(&me, &h, false),
                b"",
                at(now() + Duration::from_secs(1)),
            )
            .unwrap()
            .unwrap();
        let [ChallengeEvent::Solved { pass_id, .. }] = events(&resp) else {
            panic!("{:?}", events(&resp));
        };
        ids.insert(*pass_id);
    }
    // `budget::PASSES`: 30 at once (the loop runs in well under its refill).
    assert!((30..=32).contains(&ids.len()), "{} ids", ids.len());
    let elsewhere = client("198.51.100.7");
    let page = ch.page(
        &target("GET", "/"),
        asker(&elsewhere, &h, false),
        8,
        at(now()),
    );
    let resp = answer_page(&ch, &page, ("198.51.100.7", &h), false, now());
    let [ChallengeEvent::Solved { pass_id, .. }] = events(&resp) else {
        panic!("{:?}", events(&resp));
    };
    assert!(!ids.contains(pass_id), "another network keeps its own");
}

#[test]
fn without_no_script_the_page_has_no_refresh_and_the_link_is_gone() {
    let ch = Challenger::new(&ChallengeConfig {
        no_script: false,
        ..config()
    })
    .unwrap();
    let h = headers(&[("accept", NAV), ("user-agent", UA)]);
    let page = wiki_page(&ch, &h);
    let html = std::str::from_utf8(page.body()).unwrap();
    assert!(!html.contains("http-equiv"), "{html}");
    assert!(html.contains("This check needs JavaScript"), "{html}");
    let me = client("203.0.113.7");
    let link = target("GET", "/.weir/challenge/refresh?nonce=x");
    let resp = ch
        .handle(&link, asker(&me, &h, false), b"", at(now()))
        .unwrap()
        .unwrap_err();
    assert_eq!(resp, EndpointRefusal::NoScriptOff);
    assert_eq!(crate::respond::Reason::status(&resp), StatusCode::NOT_FOUND);
    assert_eq!(ch.refresh_hold(&link, asker(&me, &h, false), now()), None);
    for ms in [0, 99, 60_001] {
        let delay = crate::config::ConfigDuration(Duration::from_millis(ms));
        let built = Challenger::new(&ChallengeConfig {
            no_script_delay: delay,
            ..config()
        });
        assert!(built.is_err(), "{ms} ms");
    }
}

/// The test challenger with `delay` as its no-script delay.
fn with_no_script_delay(delay: Duration) -> Challenger {
    Challenger::new(&ChallengeConfig {
        no_script_delay: crate::config::ConfigDuration(delay),
        ..config()
    })
    .unwrap()
}

#[test]
fn a_delay_past_whole_seconds_is_asked_of_the_browser_and_held_for_the_rest() {
    let ch = with_no_script_delay(Duration::from_millis(2_500));
    let h = headers(&[("accept", NAV), ("user-agent", UA)]);
    let page = wiki_page(&ch, &h);
    let html = std::str::from_utf8(page.body()).unwrap();
    assert!(
        html.contains("http-equiv=\"refresh\" content=\"2; url="),
        "{html}"
    );
    let link = refresh_link(&page);
    // A browser that followed the 2 s is held for the last half second.
    let me = client("203.0.113.7");
    let left = ch.refresh_hold(
        &target("GET", &link),
        asker(&me, &h, false),
        now() + Duration::from_millis(2_000),
    );
    assert_eq!(left, Some(Duration::from_millis(500)));
}

/// A page offered after a wait in the queue counts the wait: issued as of
/// its start, it asks the browser for the whole seconds left of the delay,
/// and its link is held only for the rest (none once the wait covered it).
#[test]
fn a_page_after_a_wait_counts_the_wait_toward_the_delay() {
    let ch = with_no_script_delay(Duration::from_millis(2_500));
    let h = headers(&[("accept", NAV), ("user-agent", UA)]);
    let me = client("203.0.113.7");
    let wiki = target("GET", "/wiki/Page");
    let page = ch.page_after(
        &wiki,
        asker(&me, &h, false),
        8,
        at(now()),
        Duration::from_millis(1_200),
    );
    let mut h = h.clone();
    h.append("cookie", cookie_of(&page).parse().unwrap());
    let html = std::str::from_utf8(page.body()).unwrap();
    assert!(
        html.contains("http-equiv=\"refresh\" content=\"1; url="),
        "1.3 s of the delay left: {html}"
    );
    let link = target("GET", &refresh_link(&page));
    let left = ch.refresh_hold(&link, asker(&me, &h, false), now());
    assert_eq!(left, Some(Duration::from_millis(1_300)));
    let when = now() + Duration::from_millis(1_300);
    let resp = ch.handle(&link, asker(&me, &h, false), b"", at(when));
    assert_eq!(resp.unwrap().unwrap().status(), StatusCode::SEE_OTHER);
    // A wait longer than the delay leaves nothing to wait.
    let page = ch.page_after(
        &wiki,
        asker(&me, &h, false),
        8,
        at(now()),
        Duration::from_secs(3),
    );
    let mut h = h.clone();
    h.append("cookie", cookie_of(&page).parse().unwrap());
    let html = std::str::from_utf8(page.body()).unwrap();
    assert!(html.contains("content=\"0; url="), "{html}");
    let link = target("GET", &refresh_link(&page));
    assert_eq!(ch.refresh_hold(&link, asker(&me, &h, false), now()), None);
    let resp = ch.handle(&link, asker(&me, &h, false), b"", at(now()));
    assert_eq!(resp.unwrap().unwrap().status(), StatusCode::SEE_OTHER);
}
