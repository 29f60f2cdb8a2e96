//! Verified crawlers (issue 19, item 4): a crawler that proves who it is
//! (a Web Bot Auth signature made here with a fresh Ed25519 key, or
//! forward-confirmed reverse DNS answered by a real dnsmasq on loopback)
//! is not challenged, waits in the `bots` lane and passes rules that
//! exempt `verified_bot`; a bad, expired or unknown signature, a spoofed
//! PTR record or a name in the User-Agent alone leaves a request anonymous,
//! challenged under pressure like anyone.

use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use weir::identity::bots::signature::SignedRequest;
use weir::identity::bots::{BotCheck, BotVerifier};

use crate::fixtures::*;
use crate::support::dnsmasq::Dnsmasq;
use crate::support::web_bot_auth::Crawler;

/// The crawler's zone as dnsmasq serves it: a genuine crawler address
/// (PTR and A agree), a spoofer whose own PTR record names the crawler's
/// domain while the crawler's zone says the name is elsewhere, and an
/// address whose PTR is outside the crawler's domains. 192.0.2.40 has no
/// PTR at all.
///
/// The addresses are TEST-NET-1 (RFC 5737), only ever data in DNS answers
/// and `X-Forwarded-For` from a trusted proxy: no packet goes to them. Not
/// 127.0.0.0/8: resolvers answer its reverse zone themselves ("localhost",
/// RFC 6761) without asking any server, as hickory does.
const ZONE: &[&str] = &[
    "--host-record=crawl-192-0-2-10.googlebot.test,192.0.2.10",
    "--ptr-record=20.2.0.192.in-addr.arpa,crawl-spoof.googlebot.test",
    "--address=/crawl-spoof.googlebot.test/192.0.2.99",
    "--host-record=crawler.elsewhere.test,192.0.2.30",
    "--local=/2.0.192.in-addr.arpa/",
];

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// `[bots]` with a reverse-DNS crawler whose domain is `googlebot.test`,
/// asking `dns`; `settings` are more `[bots]` keys.
fn bots_table(dns: SocketAddr, settings: &str) -> String {
    format!(
        r#"[bots]
dns_servers = ["{dns}"]
{settings}
[[bots.crawlers]]
name = "googlebot"
user_agent = "Googlebot"
domains = ["googlebot.test"]
"#
    )
}

/// The verifier a gateway compiles from `[bots]`.
fn verifier(tables: &str) -> Arc<BotVerifier> {
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n[pools.app]\nservers = [\"127.0.0.1:9\"]\n{tables}"
    );
    let loaded = weir::config::load_str(&text, None, &weir::config::ProcessEnv).unwrap();
    let gw = weir::gateway::Gateway::build(loaded, None, 1).unwrap_or_else(|e| panic!("{e}"));
    gw.bots.clone().expect("[bots] compiled")
}

/// What `client` proves with a plain request whose User-Agent is `ua`.
async fn claim(v: &BotVerifier, client: &str, ua: &str) -> (Option<String>, Vec<&'static str>) {
    let mut headers = http::HeaderMap::new();
    headers.insert("user-agent", ua.parse().unwrap());
    let req = SignedRequest {
        method: "GET",
        scheme: "http",
        authority: "test.local",
        path: "/wiki/A",
        query: None,
        headers: &headers,
    };
    let BotCheck { bot, attempts } = v.check(&req, ip(client)).await;
    (
        bot.map(|b| v.name(b).to_string()),
        attempts.iter().map(|a| a.result).collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reverse_dns_confirms_only_forward_confirmed_crawlers() {
    let dns = Dnsmasq::start(ZONE).await.unwrap();
    let v = verifier(&bots_table(dns.addr(), "dns_wait = \"5s\""));
    let ua = "Mozilla/5.0 (compatible; Googlebot/2.1)";
    let googlebot = Some("googlebot".to_string());
    // client, User-Agent, the crawler proved, the checks' results
    let cases: &[(&str, &str, Option<String>, &[&str])] = &[
        ("192.0.2.10", ua, googlebot, &["verified"]),
        ("192.0.2.20", ua, None, &["not_confirmed"]),
        ("192.0.2.30", ua, None, &["not_confirmed"]),
        ("192.0.2.40", ua, None, &["not_confirmed"]),
        ("192.0.2.10", "Mozilla/5.0", None, &[]),
    ];
    for round in ["looked up", "remembered"] {
        for (client, ua, want_bot, want_results) in cases {
            let (bot, results) = claim(&v, client, ua).await;
            assert_eq!(
                (&bot, results.as_slice()),
                (want_bot, *want_results),
                "{round}: {client} {ua}\n{}",
                dns.logs()
            );
        }
        if round == "looked up" {
            let spoofer = dns.logs();
            assert!(
                spoofer.contains("query[A] crawl-spoof.googlebot.test"),
                "the spoofer's PTR name was looked up forward: {spoofer}"
            );
        }
    }
    // The second round came from the cache, confirmed and refused alike:
    // one PTR query per address, and forward queries only for names in the
    // crawler's domains (not for crawler.elsewhere.test).
    let logs = dns.logs();
    assert_eq!(dns.queries(), 4 + 2, "{logs}");
    assert!(!logs.contains("query[A] crawler.elsewhere.test"), "{logs}");
}

/// A name server that never answers: a real UDP socket nobody reads from,
/// and a TCP listener on the same port that never accepts.
fn silent_name_server() -> (UdpSocket, TcpListener) {
    // The OS picks a free TCP port; its UDP twin may be taken: try again.
    for _ in 0..20 {
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        if let Ok(udp) = UdpSocket::bind(tcp.local_addr().unwrap()) {
            return (udp, tcp);
        }
    }
    panic!("no loopback port free for both UDP and TCP");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_or_busy_resolver_never_holds_a_request() {
    let silent = silent_name_server();
    let settings =
        "dns_wait = \"50ms\"\ndns_timeout = \"1s\"\ndns_max_lookups = 1\ndns_negative_ttl = \"1h\"";
    let v = verifier(&bots_table(silent.0.local_addr().unwrap(), settings));
    let ua = "Googlebot/2.1";
    // The request waits dns_wait at most, then goes on unproven; the
    // lookup runs on.
    assert_eq!(claim(&v, "192.0.2.10", ua).await, (None, vec!["pending"]));
    // The one lookup allowed is running: another address is not looked up.
    assert_eq!(claim(&v, "192.0.2.11", ua).await, (None, vec!["busy"]));
    // When the lookup times out it is remembered as failed (for at most
    // 30 s, whatever dns_negative_ttl says), and the slot is free again.
    assert_eventually_async!(
        claim(&v, "192.0.2.10", ua).await == (None, vec!["lookup_failed"]),
        "the silent server's lookup never timed out"
    );
    assert_eq!(claim(&v, "192.0.2.11", ua).await, (None, vec!["pending"]));
    drop(silent);
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A navigation with these extra fields (`Host` is `test.local`).
fn navigation<'a>(ua: &'a str, fields: &'a [(String, String)]) -> Vec<(&'a str, &'a str)> {
    let mut h = vec![
        ("accept", "text/html,application/xhtml+xml"),
        ("sec-fetch-mode", "navigate"),
        ("user-agent", ua),
    ];
    h.extend(fields.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    h
}

/// `X-Forwarded-For` naming `client`, from the trusted proxy (127.0.0.0/8)
/// in front of weir: the client address reverse DNS looks up.
fn behind_proxy(client: &str) -> Vec<(String, String)> {
    vec![("x-forwarded-for".into(), client.into())]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verified_crawlers_skip_the_challenge_and_wait_in_their_lane() {
    let dns = Dnsmasq::start(ZONE).await.unwrap();
    let crawler = Crawler::new();
    let stranger = Crawler::new();
    let tables = format!(
        "[identity]\ntrusted_proxies = [\"127.0.0.0/8\"]\n{}[[bots.crawlers]]\nname = \"examplebot\"\nkeys = [\"{}\"]\n",
        bots_table(dns.addr(), "dns_wait = \"5s\""),
        crawler.x()
    );
    let page = "lane = \"anonymous\"\n[[classes.page.rules]]\nname = \"per-ip\"\n\
                limits = [{ per = \"ip\", rate = 1, window = \"1m\" }]\n\
                exempt = [\"verified_bot\"]";
    let (app, weir) = pressure_site_with("10m", page, &tables).await;
    let waiting = stall_and_queue(&app, &weir).await;
    let now = unix_now();

    // Under pressure, with the app full, everything unproven is challenged.
    let good = crawler.sign("test.local", now - 5, 300);
    let mut bad_signature = crawler.sign("test.local", now - 5, 300);
    bad_signature[0].1 = r#""https://other.example""#.into();
    // case, User-Agent, extra fields
    type Case<'a> = (&'a str, &'a str, Vec<(String, String)>);
    let refused: [Case; 8] = [
        ("anonymous", "Mozilla/5.0", vec![]),
        ("bad signature", "examplebot/1.0", bad_signature.to_vec()),
        (
            "expired",
            "examplebot/1.0",
            crawler.sign("test.local", now - 900, 300).to_vec(),
        ),
        (
            "unknown key",
            "examplebot/1.0",
            stranger.sign("test.local", now - 5, 300).to_vec(),
        ),
        (
            "other site",
            "examplebot/1.0",
            crawler.sign("other.local", now - 5, 300).to_vec(),
        ),
        ("name only", "examplebot/1.0 (Web Bot Auth)", vec![]),
        ("spoofed PTR", "Googlebot/2.1", behind_proxy("192.0.2.20")),
        ("no PTR", "Googlebot/2.1", behind_proxy("192.0.2.40")),
    ];
    for (i, (case, ua, fields)) in refused.iter().enumerate() {
        let from = ip(&format!("127.103.0.{}", i + 1));
        let (status, h, _) = get_from(from, weir.addr, "/wiki/A", &navigation(ua, fields)).await;
        assert_eq!(
            (status.as_u16(), h.contains_key("x-weir-challenge")),
            (429, true),
            "{case}"
        );
    }

    // The signed crawler and the genuine Googlebot are not challenged: they
    // wait for the app in the bots lane.
    let addr = weir.addr;
    let fields = good.to_vec();
    let signed = tokio::spawn(async move {
        get_from(
            ip("127.104.0.1"),
            addr,
            "/wiki/A",
            &navigation("examplebot/1.0", &fields),
        )
        .await
    });
    let genuine = tokio::spawn(async move {
        get_from(
            ip("127.104.0.2"),
            addr,
            "/wiki/B",
            &navigation("Googlebot/2.1", &behind_proxy("192.0.2.10")),
        )
        .await
    });
    assert_eventually_async!(
        waiting_in(&weir, "bots").await == 2.0,
        "the crawlers never queued in the bots lane: {}",
        weir.metrics().await
    );
    app.unstall();
    for w in waiting {
        assert_eq!(w.await.unwrap(), 200);
    }
    for bot in [signed, genuine] {
        let (status, h, _) = bot.await.unwrap();
        assert_eq!(status, 200);
        assert!(!h.contains_key("x-weir-challenge"));
    }
    // A rule that exempts verified_bot lets the crawler past its 1 a minute.
    for path in ["/wiki/C", "/wiki/D"] {
        let (status, _, _) = get_from(
            ip("127.104.0.1"),
            weir.addr,
            path,
            &navigation("examplebot/1.0", &good),
        )
        .await;
        assert_eq!(status, 200, "{path}");
    }

    let log = weir.access_log(8 + 8 + 4).await;
    let bots: Vec<(&str, &str, &str)> = log
        .iter()
        .filter(|l| !l["bot"].is_null())
        .map(|l| {
            (
                l["bot"].as_str().unwrap(),
                l["lane"].as_str().unwrap_or(""),
                l["path"].as_str().unwrap(),
            )
        })
        .collect();
    assert!(
        bots.contains(&("examplebot", "bots", "/wiki/A")),
        "{bots:?}"
    );
    assert!(bots.contains(&("googlebot", "bots", "/wiki/B")), "{bots:?}");
    assert_eq!(bots.len(), 4, "{bots:?}");
    let m = weir.metrics().await;
    let count = |method: &str, result: &str| {
        metric(
            &m,
            &format!("weir_bot_verifications_total{{method=\"{method}\",result=\"{result}\"}}"),
        )
    };
    assert_eq!(count("web_bot_auth", "verified"), 3.0, "{m}");
    assert_eq!(count("web_bot_auth", "bad_signature"), 2.0, "{m}");
    assert_eq!(count("web_bot_auth", "expired"), 1.0, "{m}");
    assert_eq!(count("web_bot_auth", "unknown_key"), 1.0, "{m}");
    assert_eq!(count("fcrdns", "verified"), 1.0, "{m}");
    assert_eq!(count("fcrdns", "not_confirmed"), 2.0, "{m}");
    stop(app, weir).await;
}
