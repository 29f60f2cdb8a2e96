//! Issue 54, through weir's request path on real sockets: what a pass
//! costs and who sees it. The pass never reaches the app (its cookie, every
//! occurrence in the address, the `Referer`), the access log, or another
//! site; its cookies are `Secure` behind a TLS-terminating proxy that says
//! so; and a client that mints passes in a loop from one /24 waits one
//! network's turn for all of them.

use std::net::IpAddr;

use crate::fixtures::*;
use crate::support::WeirConfig;

const KEY: &str = "pass-tests-key-0123456789abcdef0123456789";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Pages always challenged, in front of `up`; `rest` after `[challenge]`.
fn always(up: std::net::SocketAddr, rest: &str) -> String {
    WeirConfig::new(up)
        .route("page")
        .then("[classes.page]\nchallenge = \"always\"\n")
        .challenge(KEY, 8)
        .then(rest.to_owned())
        .toml()
}

/// What the echoing upstream saw of a request: its target and headers.
fn seen(body: &[u8]) -> (String, serde_json::Value) {
    let doc: serde_json::Value = serde_json::from_slice(body).expect("the echo's JSON");
    (
        doc["uri"].as_str().unwrap().to_owned(),
        doc["headers"].clone(),
    )
}

/// A pass of `KEY`, in a browser that keeps no cookies: the pass comes in
/// the address of the page it returns to. Its value.
async fn pass_in_the_address(weir: &TestWeir, me: IpAddr, path: &str) -> String {
    let (status, _, page) = get_from(me, weir.addr, path, &NAV).await;
    assert_eq!(status, 429);
    let nonce = weir::challenge::page_nonce(&page).unwrap();
    let form = weir::challenge::answer_form(&nonce, weir::challenge::pow::solve(&nonce, 8));
    let mut c = H1::connect(me, weir.addr).await.unwrap();
    let (status, h, _) = c
        .send(
            http::Request::post("/.weir/challenge/verify")
                .header("host", "t")
                .header("user-agent", "Mozilla/5.0 test")
                .header("content-type", "application/x-www-form-urlencoded")
                .body(full(&form))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(status, 303);
    assert!(
        h.get("set-cookie").is_none(),
        "no cookie without the probe: {h:?}"
    );
    let location = h["location"].to_str().unwrap();
    location.split_once("weir_pass=").unwrap().1.to_owned()
}

/// Regression for each leak issue 54 found: the pass went to the app in
/// `Cookie` (only `weir_visit` was taken out), in the second of two
/// `weir_pass` pairs of the query (only the first was), and in the
/// `Referer` of the next navigation, which the access log wrote too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pass_never_reaches_the_app_or_the_log() {
    let up = Upstream::start().await;
    let weir = TestWeir::start(&always(up.addr, "")).await;
    let me = ip("127.130.0.1");
    let pass = pass_in_the_address(&weir, me, "/wiki/A?x=1").await;

    // The cookie: the app sees the others.
    let cookie = format!("theme=dark; weir_pass={pass}; lang=ko");
    let (status, _, body) = get_from(me, weir.addr, "/wiki/A", &nav_with_cookie(&cookie)).await;
    assert_eq!(status, 200);
    let (_, headers) = seen(&body);
    assert_eq!(headers["cookie"], "theme=dark; lang=ko", "{headers}");

    // The address, twice, the pass second: neither reaches the app, the
    // pass is read, and the page keeps the browser from sending it on.
    let path = format!("/wiki/A?x=1&weir_pass=junk&weir_pass={pass}");
    let (status, h, body) = get_from(me, weir.addr, &path, &NAV).await;
    assert_eq!(status, 200, "the pass in the address admits: {h:?}");
    let (uri, headers) = seen(&body);
    assert_eq!(uri, "/wiki/A?x=1");
    assert!(!headers.to_string().contains(&pass), "{headers}");
    assert_eq!(h["referrer-policy"], "strict-origin");

    // The `Referer` of the next navigation (a browser before the policy,
    // or one that ignores it): out before the app and the log.
    let referer = format!("http://t/wiki/A?x=1&weir_pass={pass}");
    let cookie = format!("weir_pass={pass}");
    let headers_sent: Vec<(&str, &str)> =
        [("referer", referer.as_str()), ("cookie", cookie.as_str())]
            .into_iter()
            .chain(NAV)
            .collect();
    let (status, h, body) = get_from(me, weir.addr, "/wiki/B", &headers_sent).await;
    assert_eq!(status, 200);
    assert!(
        h.get("referrer-policy").is_none(),
        "a pass in the cookie is no address's"
    );
    let (_, headers) = seen(&body);
    assert_eq!(headers["referer"], "http://t/wiki/A?x=1", "{headers}");

    // A target weir cannot read is logged as sent, without the pass.
    let bad = format!("/wiki/%zz?weir_pass={pass}");
    assert_eq!(get_from(me, weir.addr, &bad, &NAV).await.0, 400);

    // The page, the answer, the cookie, the address, the Referer, the 400.
    let log = weir.access_log(6).await;
    for line in &log {
        assert!(
            !line.to_string().contains(&pass),
            "the pass in the log: {line}"
        );
    }
    assert!(
        log.iter().any(|l| l["referer"] == "http://t/wiki/A?x=1"),
        "{log:?}"
    );
    assert!(log.iter().any(|l| l["path"] == "/wiki/%zz"), "{log:?}");
}

/// Issue 54: behind a TLS-terminating proxy weir trusts, weir's cookies (the
/// page's probe, the pass, the visit) are `Secure` when the proxy says the
/// client's connection was TLS; never on the word of a peer weir does not
/// trust, nor when the proxy says `http`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookies_are_secure_behind_a_tls_terminating_proxy() {
    let up = Upstream::start().await;
    let cfg = WeirConfig::new(up.addr)
        .route_with("page", "path_prefix = \"/wiki/\"")
        .route("other")
        .then("[identity]\ntrusted_proxies = [\"127.131.0.1\"]\n[classes.page]\nchallenge = \"always\"\n")
        .challenge(KEY, 8);
    let weir = TestWeir::start(&cfg.toml()).await;
    let proxy = ip("127.131.0.1");
    let secure = |h: &http::HeaderMap| {
        let all: Vec<_> = h
            .get_all("set-cookie")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect();
        assert!(!all.is_empty(), "{h:?}");
        all.iter().all(|c| c.ends_with("; Secure"))
    };
    for (from, proto, want) in [
        (proxy, Some("https"), true),
        (proxy, Some("http"), false),
        (proxy, None, false),
        (ip("127.132.0.1"), Some("https"), false),
    ] {
        let mut sent: Vec<(&str, &str)> = NAV.to_vec();
        sent.push(("x-forwarded-for", "127.133.0.9"));
        if let Some(p) = proto {
            sent.push(("x-forwarded-proto", p));
        }
        let (status, h, page) = get_from(from, weir.addr, "/wiki/A", &sent).await;
        assert_eq!(status, 429, "{from} {proto:?}");
        assert_eq!(secure(&h), want, "the probe, {from} {proto:?}: {h:?}");
        // The answer, as the same browser through the same proxy.
        let nonce = weir::challenge::page_nonce(&page).unwrap();
        let form = weir::challenge::answer_form(&nonce, weir::challenge::pow::solve(&nonce, 8));
        let mut c = H1::connect(from, weir.addr).await.unwrap();
        let mut req = http::Request::post("/.weir/challenge/verify")
            .header("host", "t")
            .header("user-agent", "Mozilla/5.0 test")
            .header("cookie", jar(&page))
            .header("x-forwarded-for", "127.133.0.9")
            .header("content-type", "application/x-www-form-urlencoded");
        if let Some(p) = proto {
            req = req.header("x-forwarded-proto", p);
        }
        let (status, h, _) = c.send(req.body(full(&form)).unwrap()).await.unwrap();
        assert_eq!(status, 303, "{from} {proto:?}");
        assert_eq!(secure(&h), want, "the pass, {from} {proto:?}: {h:?}");
        // The visit's cookie on a page served.
        let (status, h, _) = get_from(from, weir.addr, "/other", &sent).await;
        assert_eq!(status, 200);
        assert_eq!(secure(&h), want, "the visit, {from} {proto:?}: {h:?}");
    }
}

/// How a looping client earns its passes.
#[derive(Clone, Copy, PartialEq)]
enum Earned {
    /// Following the page's no-script refresh (as Scrapy does).
    Waiting,
    /// Doing the page's work (a farm of headless browsers).
    Working,
}

/// Twelve passes minted at once from twelve addresses of 127.140.1.0/24
/// (each address under its own in-flight cap): page, then the refresh or
/// the answer. Each address with its pass's cookie.
async fn mint_twelve(weir: &TestWeir, how: Earned) -> Vec<(IpAddr, String)> {
    let addr = weir.addr;
    let minted: Vec<_> = (1..=12)
        .map(|i| {
            tokio::spawn(async move {
                let me = ip(&format!("127.140.1.{i}"));
                let (status, _, page) = get_from(me, addr, "/wiki/P", &NAV).await;
                assert_eq!(status, 429);
                let cookie = match how {
                    Earned::Waiting => {
                        let (probe, link) = (jar(&page), no_script_link(&page));
                        let (status, h, _) =
                            get_from(me, addr, &link, &nav_with_cookie(&probe)).await;
                        assert_eq!(status, 303, "{h:?}");
                        let set = h["set-cookie"].to_str().unwrap();
                        set.split(';').next().unwrap().to_owned()
                    }
                    Earned::Working => {
                        let (status, _, cookie) =
                            solve_challenge(me, addr, &page, 8, "Mozilla/5.0 test").await;
                        assert_eq!(status, 303);
                        cookie
                    }
                };
                (me, cookie)
            })
        })
        .collect();
    let mut passes = Vec::new();
    for m in minted {
        passes.push(m.await.unwrap());
    }
    passes
}

/// Issue 54: a client that mints passes in a loop from one /24 waits one
/// network's turn for all of them. Twelve passes wait for the one slot of a
/// stalled app, then a person's request from another network: the
/// person's is answered first or second. Each pass had been a network of
/// its own, above everyone unproven, and the person's came thirteenth.
/// Passes of the no-script wait buy no lane either: they wait where the
/// unproven do (here `anonymous`, the class's lane), as the person without a
/// pass does; passes of work wait in `pass`, as the person's does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_minted_in_a_loop_wait_one_network_s_turn() {
    for (how, lane) in [(Earned::Waiting, "anonymous"), (Earned::Working, "pass")] {
        let app = small_sim_app();
        let cfg = WeirConfig::new(app.addr())
            .admission("max_in_flight = 1\nworkers = 2\n")
            .route("page")
            .then("[classes.page]\nchallenge = \"always\"\nlane = \"anonymous\"\n")
            .challenge(KEY, 8)
            .then("no_script_delay = \"100ms\"\n");
        let weir = TestWeir::start(&cfg.toml()).await;
        let addr = weir.addr;
        let passes = mint_twelve(&weir, how).await;
        // The person: a pass of work when the loop's are, else none (a
        // navigation of a class that always challenges: an image of it,
        // which is not, waits where a stranger's page does).
        let person = ip("127.141.0.1");
        let theirs = match how {
            Earned::Working => {
                let (_, _, page) = get_from(person, addr, "/wiki/P", &NAV).await;
                let (status, _, cookie) =
                    solve_challenge(person, addr, &page, 8, "Mozilla/5.0 test").await;
                assert_eq!(status, 303);
                Some(cookie)
            }
            Earned::Waiting => None,
        };

        let holder = stall_with_the_slot_held(&app, &weir, ip("127.142.0.1")).await;
        let queued = format!("weir_admission_queued{{pool=\"app\",lane=\"{lane}\"}}");
        let waiting: Vec<_> = passes
            .into_iter()
            .map(|(me, cookie)| {
                tokio::spawn(async move {
                    let path = format!("/wiki/minted-{me}");
                    get_from(me, addr, &path, &nav_with_cookie(&cookie)).await.0
                })
            })
            .collect();
        assert_eventually_async!(
            metric(&weir.metrics().await, &queued) >= 12.0,
            "the minted passes never queued in {lane}"
        );
        let person_waits = tokio::spawn(async move {
            let sent = match &theirs {
                Some(cookie) => nav_with_cookie(cookie),
                None => vec![("accept", "image/avif,*/*")],
            };
            get_from(person, addr, "/wiki/person", &sent).await.0
        });
        assert_eventually_async!(
            metric(&weir.metrics().await, &queued) >= 13.0,
            "the person's request never queued in {lane}"
        );
        app.unstall();
        assert_eq!(holder.await.unwrap(), 200);
        assert_eq!(person_waits.await.unwrap(), 200);
        for w in waiting {
            assert_eq!(w.await.unwrap(), 200);
        }
        // The order they were answered in (the app answers one at a time).
        let pages = 12 * 2 + usize::from(how == Earned::Working) * 2;
        let log = weir.access_log(pages + 1 + 13).await;
        let order: Vec<&str> = (log.iter())
            .filter(|l| l["lane"] == lane)
            .filter_map(|l| l["path"].as_str())
            .filter(|p| p.starts_with("/wiki/minted-") || *p == "/wiki/person")
            .collect();
        assert_eq!(order.len(), 13, "{order:?}");
        let at = order.iter().position(|p| *p == "/wiki/person").unwrap();
        assert!(
            at <= 1,
            "{lane}: the person's request came {}th: {order:?}",
            at + 1
        );
        if how == Earned::Waiting {
            let wait_passes = (log.iter())
                .filter(|l| l["challenge"] == "wait_pass")
                .count();
            assert_eq!(wait_passes, 12, "a wait alone is not proof: {log:?}");
        }
        stop(app, weir).await;
    }
}
