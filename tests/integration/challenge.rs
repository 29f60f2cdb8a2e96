//! The browser challenge in a real browser: Debian's headless Chromium loads
//! a page behind [`Challenger`], runs the proof of work in its own JavaScript
//! (WebCrypto, and the pure-JS fallback on a non-secure origin), posts the
//! answer, follows the 303 and arrives at the original page with a valid
//! `weir_pass` cookie. Also leaves a screenshot of the challenge page at
//! `target/test-artifacts/challenge.png` for people to look at.
//!
//! The site is an in-test hyper server wired the way the lead wires weir:
//! `handle()` for `/.weir/` paths, `pass()` then `eligible()` then `page()`
//! for everything else. Chromium comes from scripts/install-test-deps.sh;
//! without it these tests fail and say so.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body_util::Full;
use weir::challenge::{self, ChallengeConfig, ChallengeEvent, Challenger, PassCheck};
use weir::identity::{AddrSource, ClientAddr, ClientId, PeerAddr};
use weir_http::target::{PathPolicy, Target};

use crate::support::chromium::{Chromium, keep_screenshot};
use crate::support::{HttpUpstream, UpstreamRequest};

/// What the site saw, for assertions and the solve-rate measurement.
#[derive(Debug, Clone)]
struct Seen {
    at: Instant,
    path: String,
    events: Vec<ChallengeEvent>,
    /// The counter a verify request carried (= hashes the browser computed).
    counter: Option<u64>,
}

struct Site {
    upstream: HttpUpstream,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Site {
    async fn start(difficulty: u8) -> Site {
        let config = ChallengeConfig {
            keys: vec!["integration-test-key-0123456789abcdef".into()],
            difficulty,
            max_difficulty: difficulty,
            ..ChallengeConfig::default()
        };
        let challenger = Arc::new(Challenger::new(&config).expect("valid challenge config"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let upstream = HttpUpstream::start(move |req| {
            let (resp, counter) = respond(&challenger, difficulty, &req);
            let events = challenge::events(&resp).to_vec();
            if let Ok(mut log) = log.lock() {
                log.push(Seen {
                    at: Instant::now(),
                    path: req.head.uri.path().to_string(),
                    events,
                    counter,
                });
            }
            resp.map(Full::new)
        })
        .await
        .expect("bind the test site");
        Site { upstream, seen }
    }

    fn url(&self, host: &str, path: &str) -> String {
        format!("http://{host}:{}{path}", self.upstream.addr().port())
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// The site's request path: weir's paths, then the pass, then the challenge,
/// else the "original page", which says whether a valid pass arrived.
/// This harness's per-network budget (one process's, as weir's).
fn budget() -> &'static weir::challenge::ChallengeBudget {
    static BUDGET: std::sync::OnceLock<weir::challenge::ChallengeBudget> =
        std::sync::OnceLock::new();
    BUDGET.get_or_init(Default::default)
}

fn respond(
    ch: &Challenger,
    difficulty: u8,
    req: &UpstreamRequest,
) -> (http::Response<Bytes>, Option<u64>) {
    let client = ClientId {
        peer: PeerAddr(req.peer),
        client: ClientAddr::new(req.peer.ip()),
        source: AddrSource::Peer,
    };
    let (method, uri, headers) = (&req.head.method, &req.head.uri, &req.head.headers);
    let target = Target::from_parts(
        method,
        uri,
        req.head.version,
        headers,
        PathPolicy::default(),
    )
    .expect("the browser's request reads one way");
    let now = SystemTime::now();
    let asker = weir::challenge::Asker {
        client: &client,
        headers,
        tls: false,
    };
    let budget = budget();
    let at = weir::challenge::At { now, budget };
    if let Some(left) = ch.refresh_hold(&target, asker, now) {
        // As weir does: an early no-script link waits out its delay. This
        // handler is synchronous; `block_in_place` keeps the runtime's
        // other tasks (the browser's devtools connection) moving.
        tokio::task::block_in_place(|| std::thread::sleep(left));
        return respond(ch, difficulty, req);
    }
    if ch.is_challenge_path(target.path()) {
        let counter = std::str::from_utf8(&req.body).ok().and_then(|b| {
            b.split('&')
                .find_map(|kv| kv.strip_prefix("counter="))
                .and_then(|c| c.parse().ok())
        });
        let body = &req.body[..req.body.len().min(challenge::MAX_VERIFY_BODY + 1)];
        if let Some(answered) = ch.handle(&target, asker, body, at) {
            // A path in the wrong method: weir's rescue answers it; its status
            // is all this harness's browser needs.
            let resp = answered.unwrap_or_else(|refused| {
                let mut resp = http::Response::new(Bytes::new());
                *resp.status_mut() = weir::respond::Reason::status(&refused);
                resp
            });
            return (resp, counter);
        }
    }
    let pass = ch.pass(headers, &client, now);
    let navigation = weir::challenge::is_navigation(headers);
    if !matches!(pass, PassCheck::Valid(_)) && ch.eligible(&target, headers, navigation, &client) {
        return (ch.page(&target, asker, difficulty, at), None);
    }
    let marker = match pass {
        PassCheck::Valid(t) => format!("<p id=\"ok\">passed</p><p id=\"pass\">{}</p>", t.id),
        _ => "<p id=\"nopass\">no pass</p>".to_string(),
    };
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><title>Page</title></head>\
         <body><h1 id=\"original\">The original page</h1>{marker}</body></html>"
    );
    let mut resp = http::Response::new(Bytes::from(html));
    resp.headers_mut()
        .insert("content-type", "text/html; charset=utf-8".parse().unwrap());
    (resp, None)
}

/// What the site saw, a line per request, for failure messages.
fn summary(seen: &[Seen]) -> Vec<String> {
    seen.iter()
        .map(|s| format!("{} {:?}", s.path, s.events))
        .collect()
}

/// Loads `/wiki/Page` and checks that Chromium ends on the original page
/// with a pass, and that the site saw issue → solve → admit in that order.
async fn solve_in_chromium(host: &str, extra: &[String]) -> (Vec<Seen>, String) {
    let difficulty = 16;
    let site = Site::start(difficulty).await;
    let mut args = vec![
        "--virtual-time-budget=30000".to_string(),
        "--dump-dom".to_string(),
    ];
    args.extend_from_slice(extra);
    let dom = Chromium::run(&args, &site.url(host, "/wiki/Page"))
        .output()
        .await;
    let seen = site.seen();
    let summary = summary(&seen);
    assert!(
        dom.contains("<p id=\"ok\">passed</p>") && dom.contains("The original page"),
        "Chromium did not end on the original page with a pass.\nDOM:\n{dom}\nrequests: {summary:#?}"
    );
    let issued = seen
        .iter()
        .position(|s| s.events.contains(&ChallengeEvent::Issued { difficulty }))
        .expect("a challenge was issued");
    let solved = seen
        .iter()
        .position(|s| matches!(s.events.as_slice(), [ChallengeEvent::Solved { .. }]))
        .unwrap_or_else(|| panic!("no solved answer: {summary:#?}"));
    assert!(issued < solved, "{summary:#?}");
    assert!(
        seen.iter()
            .all(|s| !matches!(s.events.first(), Some(ChallengeEvent::Failed(_)))),
        "a failed answer: {summary:#?}"
    );
    assert_eq!(seen[0].path, "/wiki/Page");
    let last = seen.iter().rev().find(|s| s.path != "/favicon.ico");
    assert_eq!(
        last.map(|s| s.path.as_str()),
        Some("/wiki/Page"),
        "{summary:#?}"
    );
    (seen, dom)
}

/// Hashes per second the browser did: the counter it found over the time
/// from the page going out to the answer arriving (includes loading the
/// script, so a lower bound).
fn browser_rate(seen: &[Seen]) -> (u64, Duration, f64) {
    let page = seen.iter().find(|s| !s.events.is_empty()).map(|s| s.at);
    let answer = seen.iter().find(|s| s.counter.is_some());
    match (page, answer) {
        (Some(p), Some(a)) => {
            let hashes = a.counter.unwrap_or(0) + 1;
            let took = a.at.duration_since(p);
            (hashes, took, hashes as f64 / took.as_secs_f64())
        }
        _ => (0, Duration::ZERO, 0.0),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_solves_the_challenge_with_webcrypto_and_returns_with_a_pass() {
    let (seen, _) = solve_in_chromium("127.0.0.1", &[]).await;
    let (hashes, took, rate) = browser_rate(&seen);
    eprintln!("chromium webcrypto: {hashes} hashes in {took:?} = {rate:.0} hashes/s (lower bound)");
    assert!(hashes > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_on_a_plain_http_origin_uses_the_javascript_sha256() {
    // `weir.test` is not localhost, so the page is not a secure context and
    // `crypto.subtle` does not exist: the script's own SHA-256 must agree
    // with the server's, or the answer fails.
    let rules = "--host-resolver-rules=MAP weir.test 127.0.0.1".to_string();
    let (seen, _) = solve_in_chromium("weir.test", &[rules]).await;
    let (hashes, took, rate) = browser_rate(&seen);
    eprintln!("chromium pure JS: {hashes} hashes in {took:?} = {rate:.0} hashes/s (lower bound)");
    assert!(hashes > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn challenge_page_screenshot() {
    // 28 bits (~2^28 hashes) keeps the browser on the challenge page. No
    // virtual-time budget: a page that never idles never spends it; without
    // one Chromium shoots right after the load event, when the script has
    // already started (it runs before `load`).
    let site = Site::start(28).await;
    // Only the scripted page: `--blink-settings=scriptEnabled=false` stops
    // headless Chromium from taking screenshots at all, and
    // `--disable-javascript` does not disable it (tried on Chromium 156).
    let url = site.url("127.0.0.1", "/wiki/Page");
    keep_screenshot(&url, "1000,800", "challenge.png").await;
    let seen = site.seen();
    assert!(
        seen.iter()
            .any(|s| s.events == vec![ChallengeEvent::Issued { difficulty: 28 }]),
        "{seen:?}"
    );
    assert!(
        seen.iter().all(|s| s.counter.is_none()),
        "nothing was solved at 28 bits"
    );
}

/// People without JavaScript (issue 19): Chromium with scripting off
/// follows the page's `<noscript>` meta refresh after the wait and arrives
/// at the original page with a pass, never having run the proof of work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_without_javascript_follows_the_refresh_to_a_pass() {
    let site = Site::start(16).await;
    let chromium = Chromium::run(
        &[
            "--blink-settings=scriptEnabled=false".to_string(),
            "--remote-debugging-port=0".to_string(),
        ],
        &site.url("127.0.0.1", "/wiki/Page"),
    );
    let mut page = chromium.devtools().await;
    // The wait is 500 ms (the default: the page says 0 s and the site holds
    // the link for the rest); the inspector's evaluation runs even with the
    // page's scripts off.
    let body = (page.body_once_it_shows("<p id=\"ok\">passed</p>", Duration::from_secs(30))).await;
    let seen = site.seen();
    let summary = summary(&seen);
    assert!(
        body.contains("<p id=\"ok\">passed</p>") && body.contains("The original page"),
        "no pass without JavaScript:\n{body}\n{summary:#?}"
    );
    let issued = seen
        .iter()
        .find(|s| matches!(s.events.as_slice(), [ChallengeEvent::Issued { .. }]))
        .map(|s| s.at)
        .expect("a challenge was issued");
    let solved = seen
        .iter()
        .find(|s| {
            matches!(
                s.events.as_slice(),
                [ChallengeEvent::Solved {
                    no_script: true,
                    ..
                }]
            )
        })
        .unwrap_or_else(|| panic!("not solved by waiting: {summary:#?}"));
    assert_eq!(solved.path, challenge::REFRESH_PATH);
    // Counted from the nonce's own time, as the hold is: the site's note of
    // the page comes a little after the nonce was made.
    let [ChallengeEvent::Solved { time_to_solve, .. }] = solved.events.as_slice() else {
        unreachable!("matched above");
    };
    assert!(
        *time_to_solve >= Duration::from_millis(500),
        "the refresh waited: {summary:#?}"
    );
    assert!(
        seen.iter()
            .all(|s| s.path != challenge::SCRIPT_PATH && s.counter.is_none()),
        "no script was loaded and no answer posted: {summary:#?}"
    );
    eprintln!(
        "no-JS pass after {:?} from the page",
        solved.at.duration_since(issued)
    );
}
