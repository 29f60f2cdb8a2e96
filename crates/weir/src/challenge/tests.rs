//! Tests of the [`Challenger`] facade: config checks, eligibility, the pass
//! check and the verify endpoint, all with injected time.

use super::*;
use crate::identity::{AddrSource, ClientAddr, PeerAddr};
use weir_http::target::PathPolicy;

const KEY: &str = "0123456789abcdef0123456789abcdef";
const UA: &str = "Mozilla/5.0 (X11; Linux x86_64) Firefox/140.0";
/// The cookie the page sets, as a browser that keeps cookies sends it back.
const JAR: &str = "weir_cookies=1";

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
    at: SystemTime,
) -> Response<Bytes> {
    let page = ch.page(
        &target("GET", uri),
        &client(from),
        h,
        ch.base_difficulty(),
        at,
    );
    // A browser that keeps cookies sends back the one the page set.
    let mut h = h.clone();
    h.append("cookie", HeaderValue::from_static(JAR));
    answer_page(ch, &page, (from, &h), tls, at + Duration::from_millis(1500))
}

/// Solves `page` and posts the answer from `from` with `h`, at `at`.
fn answer_page(
    ch: &Challenger,
    page: &Response<Bytes>,
    (from, h): (&str, &HeaderMap),
    tls: bool,
    at: SystemTime,
) -> Response<Bytes> {
    let nonce = page_nonce(page.body()).unwrap();
    let counter = pow::solve(&nonce, ch.base_difficulty());
    let body = format!("nonce={nonce}&counter={counter}");
    ch.handle(
        &target("POST", VERIFY_PATH),
        h,
        body.as_bytes(),
        &client(from),
        tls,
        at,
    )
    .unwrap()
    .unwrap()
}

fn cookie_of(resp: &Response<Bytes>) -> String {
    let set = resp.headers()["set-cookie"].to_str().unwrap();
    set.split(';').next().unwrap().to_string()
}

/// The page for a browser navigation to `uri` from 203.0.113.7.
fn page_for(ch: &Challenger, uri: &str, difficulty: u8) -> Response<Bytes> {
    let h = headers(&[("accept", NAV), ("user-agent", UA)]);
    ch.page(
        &target("GET", uri),
        &client("203.0.113.7"),
        &h,
        difficulty,
        now(),
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
/// pass comes in the address it returns to as well (for that page), or it
/// would get the page again and again.
#[test]
fn an_answer_without_the_page_s_cookie_gets_its_pass_in_the_address() {
    let ch = challenger();
    let h = headers(&[("accept", NAV), ("user-agent", UA)]);
    let page = page_for(&ch, "/wiki/Page?oldid=5", 8);
    let probe = page.headers()["set-cookie"].to_str().unwrap();
    assert!(
        probe.starts_with("weir_cookies=1; Path=/.weir/challenge/;"),
        "{probe}"
    );
    let resp = answer_page(&ch, &page, ("203.0.113.7", &h), false, now());
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    let location = resp.headers()["location"].to_str().unwrap();
    let pass = location
        .strip_prefix("/wiki/Page?oldid=5&weir_pass=")
        .unwrap_or_else(|| panic!("{location}"));
    assert_eq!(format!("weir_pass={pass}"), cookie_of(&resp));
    let carried = headers(&[("user-agent", UA), ("cookie", &format!("weir_pass={pass}"))]);
    assert!(matches!(
        ch.pass(&carried, &client("203.0.113.7"), now()),
        PassCheck::Valid(_)
    ));
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

    let tls = solve_and_verify(&ch, "/wiki/Page", "203.0.113.7", &h, true, now());
    assert!(
        tls.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .ends_with("; Secure")
    );
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
    let h = headers(&[("accept", NAV), ("user-agent", UA)]);
    let page = ch.page(&target("GET", "/"), &client("203.0.113.7"), &h, 8, now());
    let nonce = page_nonce(page.body()).unwrap();
    let body = format!("nonce={nonce}&counter={}", pow::solve(&nonce, 8));
    let ids: Vec<u64> = (0..3)
        .map(|i| {
            let resp = ch
                .handle(
                    &target("POST", VERIFY_PATH),
                    &h,
                    body.as_bytes(),
                    &client("203.0.113.7"),
                    false,
                    now() + Duration::from_secs(i),
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

#[test]
#[allow(clippy::type_complexity)] // one tuple per table row
fn failed_answers() {
    let ch = challenger();
    let h = headers(&[("accept", NAV), ("user-agent", UA)]);
    let page = ch.page(
        &target("GET", "/wiki/Page"),
        &client("203.0.113.7"),
        &h,
        8,
        now(),
    );
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
    let cases: Vec<(&str, String, &str, &str, SystemTime, PowRejection, StatusCode, &str)> = vec![
        ("wrong counter", format!("nonce={nonce}&counter={wrong}"), "203.0.113.7", UA, now(), InsufficientWork, StatusCode::TOO_MANY_REQUESTS, "/wiki/Page"),
        ("expired",       format!("nonce={nonce}&counter={good}"),  "203.0.113.7", UA, now() + ttl, Expired, StatusCode::TOO_MANY_REQUESTS, "/wiki/Page"),
        ("other network", format!("nonce={nonce}&counter={good}"),  "198.51.100.7", UA, now(), OtherPrefix, StatusCode::TOO_MANY_REQUESTS, "/wiki/Page"),
        ("other browser", format!("nonce={nonce}&counter={good}"),  "203.0.113.7", "curl/8", now(), OtherAgent, StatusCode::TOO_MANY_REQUESTS, "/wiki/Page"),
        ("forged nonce",  format!("nonce={forged}&counter={good}"), "203.0.113.7", UA, now(), BadSignature, StatusCode::FORBIDDEN, "/"),
        ("no counter",    format!("nonce={nonce}"),                 "203.0.113.7", UA, now(), Malformed, StatusCode::FORBIDDEN, "/"),
        ("bad counter",   format!("nonce={nonce}&counter=-1"),      "203.0.113.7", UA, now(), Malformed, StatusCode::FORBIDDEN, "/"),
        ("huge body",     "x".repeat(MAX_VERIFY_BODY + 1),          "203.0.113.7", UA, now(), Malformed, StatusCode::FORBIDDEN, "/"),
    ];
    for (name, body, ip, ua, at, reason, status, path) in cases {
        let hh = headers(&[("user-agent", ua), ("cookie", JAR)]);
        let resp = ch
            .handle(
                &target("POST", VERIFY_PATH),
                &hh,
                body.as_bytes(),
                &client(ip),
                false,
                at,
            )
            .unwrap()
            .unwrap();
        assert_eq!(resp.status(), status, "{name}");
        assert_eq!(
            resp.headers()["x-weir-challenge"],
            "1",
            "{name}: a fresh challenge"
        );
        assert!(
            !resp
                .headers()
                .get_all("set-cookie")
                .iter()
                .any(|c| c.as_bytes().starts_with(b"weir_pass=")),
            "{name}: no pass"
        );
        assert_eq!(
            events(&resp),
            &[
                ChallengeEvent::Failed(reason),
                ChallengeEvent::Issued { difficulty: 8 }
            ],
            "{name}"
        );
        // The fresh challenge returns to the original path only when the
        // failed nonce was ours.
        let fresh = page_nonce(resp.body()).unwrap();
        let counter = pow::solve(&fresh, 8);
        let again = ch
            .handle(
                &target("POST", VERIFY_PATH),
                &hh,
                format!("nonce={fresh}&counter={counter}").as_bytes(),
                &client(ip),
                false,
                at,
            )
            .unwrap()
            .unwrap();
        assert_eq!(again.status(), StatusCode::SEE_OTHER, "{name}: retry");
        assert_eq!(again.headers()["location"], path, "{name}");
    }
}

#[test]
fn served_paths() {
    let ch = challenger();
    let h = HeaderMap::new();
    let c = client("203.0.113.7");
    let call = |m: Method, p: &str| ch.handle(&target(m.as_str(), p), &h, b"", &c, false, now());
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
        let page = ch.page(&t, &client("203.0.113.7"), &h, 8, now());
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
    ch.page(&page, &client("203.0.113.7"), h, 8, now())
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
fn without_javascript_waiting_earns_the_same_pass() {
    let ch = challenger();
    let h = headers(&[("accept", NAV), ("user-agent", UA)]);
    let page = ch.page(
        &target("GET", "/wiki/Page?oldid=5"),
        &client("203.0.113.7"),
        &h,
        ch.base_difficulty(),
        now(),
    );
    let html = std::str::from_utf8(page.body()).unwrap();
    assert!(
        html.contains("<noscript><meta http-equiv=\"refresh\" content=\"0; url=/.weir/challenge/refresh?nonce="),
        "{html}"
    );
    let link = refresh_link(&page);
    let follow = |from: &str, ua: &str, after_ms: u64| {
        let h = headers(&[("accept", NAV), ("user-agent", ua), ("cookie", JAR)]);
        ch.handle(
            &target("GET", &link),
            &h,
            b"",
            &client(from),
            true,
            now() + Duration::from_millis(after_ms),
        )
        .unwrap()
        .unwrap()
    };
    // The page says 0 s (the default 500 ms has no whole second): weir
    // holds a link that comes early for the rest of the delay, and only a
    // link that would earn a pass.
    let hold = |from: &str, ua: &str, after_ms: u64, link: &str| {
        let h = headers(&[("accept", NAV), ("user-agent", ua)]);
        ch.refresh_hold(
            &target("GET", link),
            &h,
            &client(from),
            now() + Duration::from_millis(after_ms),
        )
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
    // (from, agent, after, status, event): too early, another network or
    // browser, expired: a fresh challenge; waited: the pass.
    let cases: [(&str, &str, u64, u16, &str); 5] = [
        ("203.0.113.7", UA, 499, 429, "too_early"),
        ("198.51.100.7", UA, 3000, 429, "other_prefix"),
        ("203.0.113.7", "curl/8", 3000, 429, "other_agent"),
        ("203.0.113.7", UA, 301_000, 429, "expired"),
        ("203.0.113.9", UA, 500, 303, "solved"),
    ];
    for (from, ua, after, status, event) in cases {
        let resp = follow(from, ua, after);
        assert_eq!(resp.status().as_u16(), status, "{from} {ua} {after}");
        let labels = events(&resp)[0].labels();
        let got = if labels.0 == "solved" {
            "solved"
        } else {
            labels.1
        };
        assert_eq!(got, event, "{from} {ua} {after}");
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
    // The pass is as good as a solver's, counted by its id.
    let mut with = h.clone();
    with.insert("cookie", cookie_of(&resp).parse().unwrap());
    match ch.pass(
        &with,
        &client("203.0.113.7"),
        now() + Duration::from_secs(5),
    ) {
        PassCheck::Valid(t) => assert_eq!(t.id, *pass_id),
        other => panic!("{other:?}"),
    }
    // A garbled link: 403 and a fresh challenge.
    let garbled = ch
        .handle(
            &target("GET", "/.weir/challenge/refresh?nonce=AAAA"),
            &h,
            b"",
            &client("203.0.113.7"),
            true,
            now(),
        )
        .unwrap()
        .unwrap();
    assert_eq!(garbled.status(), StatusCode::FORBIDDEN);
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
    let resp = ch
        .handle(
            &target("GET", "/.weir/challenge/refresh?nonce=x"),
            &h,
            b"",
            &client("203.0.113.7"),
            false,
            now(),
        )
        .unwrap()
        .unwrap_err();
    assert_eq!(resp, EndpointRefusal::NoScriptOff);
    assert_eq!(crate::respond::Reason::status(&resp), StatusCode::NOT_FOUND);
    assert_eq!(
        ch.refresh_hold(
            &target("GET", "/.weir/challenge/refresh?nonce=x"),
            &h,
            &client("203.0.113.7"),
            now()
        ),
        None
    );
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
    let left = ch.refresh_hold(
        &target("GET", &link),
        &h,
        &client("203.0.113.7"),
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
    let page = ch.page_after(&wiki, &me, &h, 8, now(), Duration::from_millis(1_200));
    let html = std::str::from_utf8(page.body()).unwrap();
    assert!(
        html.contains("http-equiv=\"refresh\" content=\"1; url="),
        "1.3 s of the delay left: {html}"
    );
    let link = target("GET", &refresh_link(&page));
    let left = ch.refresh_hold(&link, &h, &me, now());
    assert_eq!(left, Some(Duration::from_millis(1_300)));
    let resp = ch.handle(
        &link,
        &h,
        b"",
        &me,
        false,
        now() + Duration::from_millis(1_300),
    );
    assert_eq!(resp.unwrap().unwrap().status(), StatusCode::SEE_OTHER);
    // A wait longer than the delay leaves nothing to wait.
    let page = ch.page_after(&wiki, &me, &h, 8, now(), Duration::from_secs(3));
    let html = std::str::from_utf8(page.body()).unwrap();
    assert!(html.contains("content=\"0; url="), "{html}");
    let link = target("GET", &refresh_link(&page));
    assert_eq!(ch.refresh_hold(&link, &h, &me, now()), None);
    let resp = ch.handle(&link, &h, b"", &me, false, now());
    assert_eq!(resp.unwrap().unwrap().status(), StatusCode::SEE_OTHER);
}
