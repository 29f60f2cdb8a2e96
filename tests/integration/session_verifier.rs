//! Session verification (`weir::identity::session`) against the lab's
//! simulated app over loopback: the login-page cookie stays anonymous, a
//! real login verifies, answers are cached and coalesced, a stalled app is
//! an unknown outcome.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request};
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use weir::identity::session::*;
use weir_lab::app::{AppConfig, SimApp};
use weir_limiter::{ManualClock, MonoTime};

fn start_app() -> SimApp {
    let cfg = AppConfig {
        workers: 4,
        backlog: 16,
        time_scale: 0.01,
        ..Default::default()
    };
    SimApp::start(cfg, "127.0.0.1:0".parse().expect("literal")).expect("start sim app")
}

/// The app ([`start_app`]), and a sub-request config asking it about the
/// `wikiToken` cookie, for the test to adjust.
fn app_checking_wiki_token() -> (SimApp, AuthSubrequestConfig) {
    let app = start_app();
    let cfg = AuthSubrequestConfig::new(app.addr(), &["wikiToken"]);
    (app, cfg)
}

/// `name=value` pairs of every `Set-Cookie` of one request to the app.
async fn cookies_from(app: SocketAddr, method: Method, path: &str) -> Vec<String> {
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut req = Request::new(Empty::new());
    *req.method_mut() = method;
    *req.uri_mut() = format!("http://{app}{path}").parse().expect("uri");
    let resp = client.request(req).await.expect("app answers");
    assert!(resp.status().is_success(), "{path}: {}", resp.status());
    (resp.headers().get_all("set-cookie").iter())
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| v.split(';').next())
        .map(str::to_string)
        .collect()
}

fn with_cookies(cookies: &[String]) -> HeaderMap {
    let mut h = HeaderMap::new();
    let line = cookies.join("; ");
    h.insert("cookie", HeaderValue::from_str(&line).expect("cookie line"));
    h
}

fn checker(app: SocketAddr, clock: Arc<ManualClock>) -> AuthSubrequest {
    let cfg = AuthSubrequestConfig::new(app, &["wikiUserID", "wikiToken"]);
    AuthSubrequest::new(cfg, clock).expect("valid config")
}

fn verifier(sub: AuthSubrequest) -> SessionVerifier {
    SessionVerifier::new(None, Some(sub), Arc::new(SystemWallClock))
}

#[tokio::test]
async fn login_page_cookie_is_anonymous_and_real_login_verifies() {
    let app = start_app();
    let v = verifier(checker(app.addr(), Arc::new(ManualClock::default())));

    // Incident 1: every visitor of the login page gets a cookie named after the site.
    let visitor = cookies_from(app.addr(), Method::GET, "/login").await;
    assert!(visitor[0].starts_with("wikisession="), "{visitor:?}");
    let state = v.check(&with_cookies(&visitor)).await;
    assert_eq!(state, SessionState::Anonymous);
    assert_eq!(
        app.snapshot().class("whoami"),
        0,
        "no cookie to forward, no ask"
    );

    // A made-up login cookie is asked about and denied.
    let fake = vec!["wikiUserID=1".to_string(), "wikiToken=0123".to_string()];
    let state = v.check(&with_cookies(&fake)).await;
    assert_eq!(
        state,
        SessionState::Unverified {
            reason: UnverifiedReason::Denied
        }
    );

    let login = cookies_from(app.addr(), Method::POST, "/login").await;
    let mut both = visitor.clone();
    both.extend(login);
    let state = v.check(&with_cookies(&both)).await;
    assert_eq!(state.user(), Some("1"), "{state:?}");
    assert_eq!(state.via(), Some(Via::AuthSubrequest));

    let stats = v.stats();
    assert_eq!((stats.anonymous, stats.verified_auth_subrequest), (1, 1));
    let sub = stats.subrequest.expect("configured");
    assert_eq!((sub.sent, sub.verified, sub.denied), (2, 1, 1));
    app.shutdown().await;
}

#[tokio::test]
async fn user_id_from_a_response_header() {
    let app = start_app();
    let mut cfg = AuthSubrequestConfig::new(app.addr(), &["wikiUserID", "wikiToken"]);
    cfg.user_header = Some(http::HeaderName::from_static("x-app-user"));
    let sub = AuthSubrequest::new(cfg, Arc::new(ManualClock::default())).expect("config");
    let _first = cookies_from(app.addr(), Method::POST, "/login").await;
    let second = cookies_from(app.addr(), Method::POST, "/login").await;
    let got = sub.check(&with_cookies(&second)).await;
    assert_eq!(got, Some(AuthOutcome::Verified(Arc::from("2"))));
    app.shutdown().await;
}

#[tokio::test]
async fn cache_hit_then_expiry() {
    let app = start_app();
    let clock = Arc::new(ManualClock::new(MonoTime::from_nanos(1)));
    let sub = checker(app.addr(), clock.clone());
    let ttl = sub.config().verified_ttl;
    let login = with_cookies(&cookies_from(app.addr(), Method::POST, "/login").await);
    let whoami = || app.snapshot().class("whoami");

    assert!(matches!(
        sub.check(&login).await,
        Some(AuthOutcome::Verified(_))
    ));
    assert_eq!(whoami(), 1);
    clock.advance(ttl - Duration::from_millis(1));
    assert!(matches!(
        sub.check(&login).await,
        Some(AuthOutcome::Verified(_))
    ));
    assert_eq!(whoami(), 1, "a cached answer needs no sub-request");
    assert_eq!(sub.stats().cache_hits, 1);

    clock.advance(Duration::from_millis(1));
    assert!(matches!(
        sub.check(&login).await,
        Some(AuthOutcome::Verified(_))
    ));
    assert_eq!(whoami(), 2, "an expired answer is asked again");

    // Denials have their own, shorter TTL.
    let fake = with_cookies(&["wikiUserID=1".into(), "wikiToken=ff".into()]);
    assert_eq!(sub.check(&fake).await, Some(AuthOutcome::Denied));
    assert_eq!(sub.check(&fake).await, Some(AuthOutcome::Denied));
    assert_eq!(whoami(), 3);
    clock.advance(sub.config().denied_ttl);
    assert_eq!(sub.check(&fake).await, Some(AuthOutcome::Denied));
    assert_eq!(whoami(), 4);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shared_cookie_one_subrequest() {
    let app = start_app();
    let mut cfg = AuthSubrequestConfig::new(app.addr(), &["wikiUserID", "wikiToken"]);
    // The app is held below; a generous deadline keeps the sub-request alive meanwhile.
    cfg.timeout = Duration::from_secs(20);
    let sub = Arc::new(AuthSubrequest::new(cfg, Arc::new(ManualClock::default())).expect("cfg"));
    let login = with_cookies(&cookies_from(app.addr(), Method::POST, "/login").await);

    app.stall();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..100 {
        let (sub, login) = (sub.clone(), login.clone());
        tasks.spawn(async move { sub.check(&login).await });
    }
    // Every check has joined the one sub-request, which the app is holding.
    assert_eventually_async!(sub.stats().coalesced == 99, "99 coalesced checks");
    assert_eventually_async!(app.snapshot().stalled == 1, "one stalled sub-request");
    app.unstall();
    let mut verified = 0;
    while let Some(done) = tasks.join_next().await {
        let outcome = done.expect("check task");
        assert_eq!(outcome, Some(AuthOutcome::Verified(Arc::from("1"))));
        verified += 1;
    }
    assert_eq!(verified, 100);
    assert_eq!(app.snapshot().class("whoami"), 1);
    let stats = sub.stats();
    assert_eq!((stats.sent, stats.coalesced, stats.cache_hits), (1, 99, 0));
    app.shutdown().await;
}

#[tokio::test]
async fn app_down_is_unknown_and_counted() {
    // A port nothing listens on: bind, note it, close.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port");
    let v = verifier(checker(addr, Arc::new(ManualClock::default())));
    let cookies = with_cookies(&["wikiUserID=1".into(), "wikiToken=abc".into()]);
    let state = v.check(&cookies).await;
    assert_eq!(
        state,
        SessionState::Unverified {
            reason: UnverifiedReason::AuthUnknown
        }
    );
    assert!(!state.is_verified());
    // The unknown outcome is cached briefly: a dead app is not asked by every request.
    let _ = v.check(&cookies).await;
    let stats = v.stats();
    let sub = stats.subrequest.expect("configured");
    assert_eq!(
        (sub.sent, sub.unknown, sub.verified, sub.cache_hits),
        (1, 1, 0, 1)
    );
    let unknown = (stats.unverified.iter()).find(|(r, _)| *r == UnverifiedReason::AuthUnknown);
    assert_eq!(unknown, Some(&(UnverifiedReason::AuthUnknown, 2)));
}

#[tokio::test]
async fn slow_app_times_out_as_unknown() {
    let (app, mut cfg) = app_checking_wiki_token();
    cfg.timeout = Duration::from_millis(100);
    let sub = AuthSubrequest::new(cfg, Arc::new(ManualClock::default())).expect("cfg");
    app.stall();
    let got = sub.check(&with_cookies(&["wikiToken=abc".into()])).await;
    assert_eq!(got, Some(AuthOutcome::Unknown(UnknownCause::Timeout)));
    app.unstall();
    app.shutdown().await;
}

#[tokio::test]
async fn too_many_in_flight_is_busy_not_queued() {
    let (app, mut cfg) = app_checking_wiki_token();
    cfg.max_in_flight = 1;
    cfg.timeout = Duration::from_secs(20);
    let sub = Arc::new(AuthSubrequest::new(cfg, Arc::new(ManualClock::default())).expect("cfg"));
    app.stall();
    let held = {
        let sub = sub.clone();
        tokio::spawn(async move { sub.check(&with_cookies(&["wikiToken=a".into()])).await })
    };
    assert_eventually_async!(app.snapshot().stalled == 1, "one stalled sub-request");
    let other = sub.check(&with_cookies(&["wikiToken=b".into()])).await;
    assert_eq!(other, Some(AuthOutcome::Unknown(UnknownCause::Busy)));
    app.unstall();
    assert_eq!(held.await.expect("task"), Some(AuthOutcome::Denied));
    // Busy is not cached: the next check asks.
    let again = sub.check(&with_cookies(&["wikiToken=b".into()])).await;
    assert_eq!(again, Some(AuthOutcome::Denied));
    assert_eq!(sub.stats().busy, 1);
    app.shutdown().await;
}

#[tokio::test]
async fn bounded_cache_over_a_live_app() {
    let (app, mut cfg) = app_checking_wiki_token();
    cfg.max_entries = 8;
    let sub = AuthSubrequest::new(cfg, Arc::new(ManualClock::default())).expect("cfg");
    for i in 0..40 {
        let got = sub.check(&with_cookies(&[format!("wikiToken=t{i}")])).await;
        assert_eq!(got, Some(AuthOutcome::Denied));
        assert!(sub.stats().cached <= 8, "after {i}: {:?}", sub.stats());
    }
    assert_eq!(sub.stats().cached, 8);
    app.shutdown().await;
}

#[tokio::test]
async fn signed_cookie_before_subrequest() {
    let keys = SigningKeys::new(&[b"k".repeat(32)]).expect("key");
    let signed = SignedCookie::new("weir_session", keys);
    let wall = Arc::new(ManualWallClock::new(1_000));
    let good = signed.issue("carol", 2_000).expect("issue");
    let v = SessionVerifier::new(Some(signed), None, wall.clone());
    let h = |c: &str| with_cookies(&[c.to_string()]);

    let cases: &[(String, SessionState)] = &[
        (
            format!("weir_session={good}"),
            SessionState::Verified {
                user: Arc::from("carol"),
                via: Via::SignedCookie,
            },
        ),
        // The name alone, or a name containing the site name, is nothing.
        (
            "weir_session=1".into(),
            SessionState::Unverified {
                reason: UnverifiedReason::Malformed,
            },
        ),
        (format!("weir_session_x={good}"), SessionState::Anonymous),
        ("other=1".into(), SessionState::Anonymous),
    ];
    for (cookie, want) in cases {
        assert_eq!(&v.check(&h(cookie)).await, want, "{cookie}");
    }
    wall.set(2_000);
    assert_eq!(
        v.check(&h(&format!("weir_session={good}"))).await,
        SessionState::Unverified {
            reason: UnverifiedReason::Expired
        }
    );
}
