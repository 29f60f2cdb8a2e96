//! Exemptions by verified identity only, against the simulated app: the
//! session cookie the login page gives every visitor exempts nothing; the
//! app's own answer about a real login does; a signed cookie weir can check
//! does; a forged one does not.

use std::net::{IpAddr, SocketAddr};

use weir::identity::session::{SignedCookie, SigningKeys};
use weir_lab::app::{AppConfig, SimApp};

use crate::fixtures::*;
use crate::support::WeirConfig;

const KEY: &str = "0123456789abcdef0123456789abcdef-test-key";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn weir_config(app: SocketAddr) -> String {
    WeirConfig::new(app)
        .route_with("expensive", r#"methods = ["GET"]"#)
        .route("other")
        .then(format!(
            r#"[[classes.expensive.rules]]
name = "anon"
exempt = ["verified"]
limits = [{{ per = "ip", rate = 1, window = "1m" }}]

[sessions.signed_cookie]
cookie = "weir_session"
keys = ["{KEY}"]

[sessions.auth_subrequest]
pool = "app"
path = "/whoami"
cookies = ["wikiUserID", "wikiToken"]
"#
        ))
        .toml()
}

/// Status of `n` GETs from `source` carrying `cookie`.
async fn statuses(weir: &TestWeir, source: IpAddr, cookie: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        let h: Vec<(&str, &str)> = if cookie.is_empty() {
            vec![]
        } else {
            vec![("cookie", cookie)]
        };
        out.push(
            get_from(source, weir.addr, "/w/index.php?search=x", &h)
                .await
                .0
                .as_u16(),
        );
    }
    out
}

/// Cookies from a response's Set-Cookie headers, as a Cookie header value.
fn cookies_of(headers: &http::HeaderMap) -> String {
    headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok()?.split(';').next().map(str::to_string))
        .collect::<Vec<_>>()
        .join("; ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_verified_sessions_are_exempt() {
    let app = SimApp::start(
        AppConfig {
            workers: 4,
            backlog: 16,
            time_scale: 0.01,
            ..Default::default()
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .unwrap();
    let weir = TestWeir::start(&weir_config(app.addr())).await;

    // The login page gives anyone a session cookie; it exempts nothing.
    let (_, h, _) = get_from(ip("127.70.0.9"), weir.addr, "/login", &[]).await;
    let visitor = cookies_of(&h);
    assert!(visitor.contains("wikisession="), "{visitor}");
    assert_eq!(
        statuses(&weir, ip("127.70.0.1"), &visitor, 3).await,
        vec![200, 429, 429]
    );

    // A real login (through weir): the app says who it is; exempt.
    let mut c = H1::connect(ip("127.70.0.2"), weir.addr).await.unwrap();
    let (status, h, _) = c.post("/login", "").await;
    assert_eq!(status, 200);
    let editor = cookies_of(&h);
    assert!(editor.contains("wikiToken="), "{editor}");
    assert_eq!(
        statuses(&weir, ip("127.70.0.2"), &editor, 5).await,
        vec![200; 5]
    );
    // The answer is cached: one sub-request for five requests.
    assert_eq!(app.snapshot().class("whoami"), 1);

    // Made-up login cookies: the app denies them; not exempt.
    let fake = "wikiUserID=1; wikiToken=00000000000000000000000000000000";
    assert_eq!(
        statuses(&weir, ip("127.70.0.3"), fake, 2).await,
        vec![200, 429]
    );

    // A signed cookie weir can check: exempt; a forged one: not.
    let signer = session_signer(KEY);
    let expires = an_hour_from_now();
    let good = format!("weir_session={}", signer.issue("alice", expires).unwrap());
    assert_eq!(
        statuses(&weir, ip("127.70.0.4"), &good, 4).await,
        vec![200; 4]
    );
    let forger = SignedCookie::new(
        "weir_session",
        SigningKeys::new(&["another key of at least thirty-two bytes!"]).unwrap(),
    );
    let forged = format!("weir_session={}", forger.issue("alice", expires).unwrap());
    assert_eq!(
        statuses(&weir, ip("127.70.0.5"), &forged, 2).await,
        vec![200, 429]
    );

    let log = weir.access_log(18).await;
    let sessions: Vec<&str> = log.iter().filter_map(|l| l["session"].as_str()).collect();
    assert!(
        sessions.contains(&"verified") && sessions.contains(&"unverified"),
        "{sessions:?}"
    );
    stop(app, weir).await;
}

/// Issue 20 item 7: examples/mediawiki.toml as shipped, in front of a
/// stand-in that answers `api.php?action=query&meta=userinfo` as MediaWiki
/// does (200 for everyone; `"id": 0` unless the session is a login).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mediawiki_recipe_verifies_editors_by_their_userinfo() {
    use crate::support::HttpUpstream;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let asked = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = asked.clone();
    let wiki = HttpUpstream::start(move |req| {
        let userinfo = req.head.uri.path() == "/w/api.php"
            && req
                .head
                .uri
                .query()
                .is_some_and(|q| q.contains("meta=userinfo"));
        if !userinfo {
            return http::Response::new(http_body_util::Full::new("a page".into()));
        }
        counted.fetch_add(1, Ordering::SeqCst);
        let cookie = req
            .head
            .headers
            .get("cookie")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        // MediaWiki: the session names the user; UserID must agree with it.
        let logged_in = cookie.contains("wiki_session=s-alice") && cookie.contains("wikiUserID=42");
        let body = if logged_in {
            r#"{"batchcomplete":"","query":{"userinfo":{"id":42,"name":"Alice"}}}"#
        } else {
            r#"{"batchcomplete":"","query":{"userinfo":{"id":0,"name":"127.0.0.1","anon":""}}}"#
        };
        http::Response::builder()
            .header("content-type", "application/json; charset=utf-8")
            .body(http_body_util::Full::new(body.into()))
            .unwrap()
    })
    .await
    .unwrap();
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/mediawiki.toml"
    ))
    .unwrap()
    .replace("${WEIR_LISTEN:-0.0.0.0:8080}", "127.0.0.1:0")
    .replace("127.0.0.1:9901", "127.0.0.1:0")
    .replace(
        "${WEIR_STATE:-/var/lib/weir/limits.snap}",
        "{{dir}}/limits.snap",
    )
    .replace("${WIKI_BACKEND:-127.0.0.1:8081}", &wiki.addr().to_string());
    let weir = TestWeir::start(&example).await;

    // The rule lets 20 anonymous searches from one address through per 10
    // min, and defers the rest.
    let editor = "wiki_session=s-alice; wikiUserID=42";
    assert!(
        statuses(&weir, ip("127.71.0.1"), editor, 25)
            .await
            .iter()
            .all(|&s| s == 200),
        "a verified editor is exempt"
    );
    // One sub-request for the whole session (cached for verified_ttl).
    assert_eq!(asked.load(Ordering::SeqCst), 1);

    // A session cookie alone (what the login page gives anyone) is not asked
    // about: the 5 searches over the limit are deferred (the example defers:
    // served here, where the app is idle, from capacity nobody else wants).
    let deferred = |m: &str| {
        metric(
            m,
            "weir_rule_decisions_total{rule=\"anon-expensive\",result=\"defer\"}",
        )
    };
    let visitor = statuses(&weir, ip("127.71.0.2"), "wiki_session=s-crawler", 25).await;
    assert!(visitor.iter().all(|&s| s == 200), "{visitor:?}");
    assert_eq!(deferred(&weir.metrics().await), 5.0);
    assert_eq!(
        asked.load(Ordering::SeqCst),
        1,
        "no sub-request without wikiUserID"
    );

    // A made-up UserID: MediaWiki answers id 0, so the client is anonymous.
    let forged = statuses(
        &weir,
        ip("127.71.0.3"),
        "wiki_session=s-crawler; wikiUserID=42",
        25,
    )
    .await;
    assert!(forged.iter().all(|&s| s == 200), "{forged:?}");
    assert_eq!(deferred(&weir.metrics().await), 10.0);
    assert_eq!(asked.load(Ordering::SeqCst), 2, "one denial, cached");
}

/// `weir check` refuses an exemption for verified sessions when no session
/// method is configured: it would exempt nobody, silently.
#[test]
fn exempting_verified_without_a_session_method_is_refused() {
    let config = "[[listeners]]\naddress = \"127.0.0.1:0\"\n[pools.app]\nservers = [\"127.0.0.1:9\"]\n\
                  [[routes]]\npool = \"app\"\nclass = \"page\"\n\
                  [[classes.page.rules]]\nname = \"r\"\nexempt = [\"verified\"]\n\
                  limits = [{ per = \"ip\", rate = 1, window = \"1m\" }]\n";
    let env = std::collections::HashMap::<String, String>::new();
    let loaded = weir::config::load_str(config, None, &env).unwrap();
    let err = weir::gateway::Gateway::build(loaded, None, 1)
        .expect_err("refused")
        .to_string();
    assert!(
        err.contains("classes.page.rules[0].exempt[0]") && err.contains("exempts nobody"),
        "{err}"
    );
}
