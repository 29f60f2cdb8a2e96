//! `weir sim` end to end: a tiny scenario whose report must agree with the app's own
//! counters (under weir, and under a real nginx and HAProxy as rival gateways), and the
//! incident scenarios, each run under its variants: the original reproduces the
//! incident, the recommended passes. Rival variants of the incident scenarios are
//! measurements for docs/lab.md, not checks, so CI runs only their weir variants (each
//! rival would add its scenario's whole duration); the tiny scenario proves the rivals
//! run at all.
//!
//! Runs are serialized: they share two cores, and a second run at the same time would
//! measure the other instead of weir.

use std::path::Path;
use std::sync::Mutex;

use weir_lab::cli::{SimOptions, run_scenario};
use weir_lab::cohort::Outcome;
use weir_lab::report::SimReport;
use weir_lab::scenario::{load_scenario_file, load_scenario_str};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn run_file(name: &str) -> SimReport {
    run_variants(name, &[])
}

/// Runs the named variants of a shipped scenario (all when `variants` is empty).
fn run_variants(name: &str, variants: &[&str]) -> SimReport {
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .join("scenarios")
        .join(name);
    let scenario = load_scenario_file(&path).unwrap_or_else(|e| panic!("{e}"));
    let options = SimOptions {
        variants: variants.iter().map(|v| v.to_string()).collect(),
        ..SimOptions::default()
    };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    run_scenario(&scenario, &options).unwrap_or_else(|e| panic!("{e}"))
}

/// Each check of `variant` and whether it holds; a pending check (reported, never
/// failing a run) holds.
fn check_results(report: &SimReport, variant: &str) -> Vec<(String, bool)> {
    (report.checks.iter())
        .filter(|c| c.variant == variant)
        .map(|c| (c.check.clone(), !c.fails_run()))
        .collect()
}

/// Every named variant has checks, and each holds (pending ones included).
fn assert_checks_hold(report: &SimReport, variants: &[&str]) {
    for variant in variants {
        let results = check_results(report, variant);
        assert!(!results.is_empty(), "{variant} has checks");
        assert!(
            results.iter().all(|(_, passed)| *passed),
            "{variant}: {results:?}\n{}",
            report.to_text()
        );
    }
    assert!(report.passed());
}

const TINY: &str = r#"
[scenario]
name = "tiny"
duration = "3s"
grace = "3s"

[app]
workers = 8
backlog = 64
default_service = { dist = "fixed", ms = 5 }
classes = []          # every request a cheap page: nothing should queue

[health]
enabled = false

[weir.plain]
config = """
[[listeners]]
address = "127.0.0.1:0"
[pools.app]
servers = ["{{app}}"]
"""

[[cohorts]]
kind = "humans"
count = 10
rate = 5
login_share = 0.1

[[cohorts]]
kind = "crawlers"
addresses = 20
networks = [{ share = 1.0, prefixes = 2, len = 20 }]
rate = 2
session_cookie_share = 0.5

[[expect]]
check = "humans.served == 1"
"#;

#[test]
fn tiny_run_agrees_with_the_apps_own_counters() {
    let scenario = load_scenario_str(TINY, None).unwrap_or_else(|e| panic!("{e}"));
    let report = {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        run_scenario(&scenario, &SimOptions::default()).unwrap_or_else(|e| panic!("{e}"))
    };
    let v = &report.variants[0];
    let (mut sent, mut served, mut reached, mut unfinished) = (0, 0, 0, 0);
    for c in &v.cohorts {
        sent += c.sent;
        served += c.count(Outcome::Served);
        reached += c.reached_app;
        unfinished += c.count(Outcome::Unfinished);
        // Every request lands in exactly one second of the timeline.
        let in_timeline: u64 = v.timeline.cohorts[&c.name]
            .values()
            .flatten()
            .map(|n| *n as u64)
            .sum();
        assert_eq!(in_timeline, c.sent, "{}", c.name);
    }
    // 10 people at 5/s and 20 crawlers at 2/s for 3 s: ~270 requests.
    assert!((180..=360).contains(&sent), "sent {sent}");
    assert_eq!(unfinished, 0, "all answered within the grace period");
    assert_eq!(served, sent, "nothing limits this run: {:#?}", v.cohorts);
    assert_eq!(reached, served, "every 2xx came from the app");
    assert_eq!(
        v.upstream.served, served,
        "the app served exactly what the cohorts saw: {:#?}",
        v.upstream
    );
    assert_eq!((v.upstream.refused, v.upstream.abandoned), (0, 0));
    assert!(v.upstream.max_in_flight <= 8);
    assert!(v.rules.is_empty(), "{:?}", v.rules);
    assert!(report.passed());
    assert_eq!(report.checks.len(), 1);
}

#[test]
fn connection_exhaustion_reproduces_and_per_ip_caps_fix_it() {
    let report = run_file("nginx-connection-exhaustion.toml");
    let original = check_results(&report, "original");
    assert!(
        original.iter().all(|(_, passed)| *passed),
        "the incident reproduces: {original:?}\n{}",
        report.to_text()
    );
    let recommended = check_results(&report, "recommended");
    assert!(
        recommended.iter().all(|(_, passed)| *passed),
        "{recommended:?}\n{}",
        report.to_text()
    );
    assert_eq!(recommended.len(), 3);
    assert!(report.passed());
}

#[test]
fn limit_behind_a_load_balancer_needs_trusted_proxies() {
    let report = run_file("2025-10-21-feature-flags-lb.toml");
    let original = check_results(&report, "original");
    assert!(
        original.iter().all(|(_, passed)| *passed),
        "the incident reproduces: {original:?}\n{}",
        report.to_text()
    );
    let recommended = check_results(&report, "recommended");
    assert!(
        recommended.iter().all(|(_, passed)| *passed),
        "{recommended:?}\n{}",
        report.to_text()
    );
    let v = &report.variants[0];
    assert_eq!(v.load_balancer.as_deref(), Some("nginx"));
    // Without trusted proxies weir saw the balancer, never a person.
    let rule = &v.rules["client_in_flight"];
    assert_eq!(rule.by_cohort.get("humans"), None, "{rule:?}");
    assert!(report.passed());
}

/// Incident 1 under its weir variants (the nginx and HAProxy variants are measured
/// for docs/lab.md, not run here), with the alert replay: WeirRuleHittingPeople fires
/// for the emergency bucket and not for the recommended rules or none.
#[test]
fn crawler_flood_reproduces_under_the_incident_configs_and_weir_holds_it() {
    let weir = ["original", "emergency", "zero-config", "recommended"];
    let report = run_variants("2026-09-23-crawler-flood.toml", &weir);
    assert_checks_hold(&report, &weir);
    let alert = |variant: &str| {
        let v = report.variants.iter().find(|v| v.name == variant).unwrap();
        let alerts = v.alerts.as_ref().expect("[alerts] replayed for weir");
        alerts.fired_at_min.get("WeirRuleHittingPeople").copied()
    };
    assert!(alert("emergency").is_some(), "{}", report.to_text());
    assert_eq!(alert("recommended"), None, "{}", report.to_text());
    assert!(report.passed());
}

/// Incident 1's flood by crawlers that hide among people (issue 36): a third
/// on people's own addresses, all with browser headers, kept cookies and an
/// article as `Referer`, one in ten solving challenges. The recommended
/// configuration and zero configuration each meet people's checks (the nginx
/// and HAProxy variants are measured for docs/lab.md, not run here); under
/// the emergency bucket, the people weir flags are people and most people
/// refused are flagged (issue 37: a `Referer` is not evidence).
#[test]
fn crawlers_like_people_meet_the_flood_scenarios_configs_and_people() {
    let weir = ["emergency", "zero-config", "recommended"];
    let report = run_variants("2026-09-23-crawlers-like-people.toml", &weir);
    assert_checks_hold(&report, &weir);
}

/// Incident 1's 17:00 peak at compression 5 (a refusal in the run is 5 of the
/// story's, not 1,200): the shipped WeirRuleHittingPeople alert pages within 5 story
/// minutes of the emergency bucket refusing people, and never under the recommended
/// rules (issue 19 item 6).
#[test]
fn the_people_alert_fires_within_five_story_minutes_for_the_bucket_only() {
    let report = run_file("2026-09-23-alert.toml");
    for variant in ["emergency", "recommended"] {
        let results = check_results(&report, variant);
        assert!(!results.is_empty(), "{variant} has checks");
        assert!(
            results.iter().all(|(_, passed)| *passed),
            "{variant}: {results:?}\n{}",
            report.to_text()
        );
    }
    let emergency = report.variants.iter().find(|v| v.name == "emergency");
    let alerts = emergency.and_then(|v| v.alerts.as_ref()).expect("replayed");
    let fired = alerts.fired_at_min.get("WeirRuleHittingPeople").copied();
    let refused = alerts.first_person_refused_min;
    let after = fired.zip(refused).map(|(f, r)| f - r);
    assert!(after.is_some_and(|m| m <= 5.0), "{}", report.to_text());
    let recommended = report.variants.iter().find(|v| v.name == "recommended");
    let alerts = recommended
        .and_then(|v| v.alerts.as_ref())
        .expect("replayed");
    assert!(
        !alerts.fired_at_min.contains_key("WeirRuleHittingPeople"),
        "{}",
        report.to_text()
    );
    assert!(report.passed());
}

/// The alert's timing with crawlers that hide among people (issue 37): it still
/// pages within 5 story minutes for the emergency bucket, and never under the
/// recommended rules, where only crawlers are refused (a same-site `Referer`
/// counted as evidence would have paged there).
#[test]
fn the_people_alert_holds_against_crawlers_like_people() {
    let report = run_file("2026-09-23-alert-crawlers-like-people.toml");
    assert_checks_hold(&report, &["emergency", "recommended"]);
    let fired = |variant: &str| {
        let v = report.variants.iter().find(|v| v.name == variant);
        let alerts = v.and_then(|v| v.alerts.as_ref()).expect("replayed");
        alerts.fired_at_min.get("WeirRuleHittingPeople").copied()
    };
    assert!(fired("emergency").is_some(), "{}", report.to_text());
    assert_eq!(fired("recommended"), None, "{}", report.to_text());
}

/// A connection flood against weir's defaults: people, logins and uploads are served
/// while 3 addresses hold thousands of connections (the nginx and HAProxy variants
/// are measured for docs/lab.md).
#[test]
fn connection_flood_with_defaults_keeps_people_served() {
    let report = run_variants("connection-flood.toml", &["zero-config"]);
    let results = check_results(&report, "zero-config");
    assert!(results.len() >= 4, "{results:?}");
    assert!(
        results.iter().all(|(_, passed)| *passed),
        "{results:?}\n{}",
        report.to_text()
    );
    let flood = report.variants[0]
        .cohorts
        .iter()
        .find(|c| c.name == "flood")
        .unwrap();
    assert!(flood.sent > 1000, "the flood ran: {}", report.to_text());
}

/// The connection flood against an app it fills (4 workers, 40 ms): with
/// weir's defaults people, logins and uploads are all served, the app stays
/// busy, and the flood gets what people leave (max-min fair), not its
/// share of the demand. Regression for two bugs it found: the adaptive
/// limit learned the flood's queueing as normal when it began during
/// warm-up (people waited in the app's backlog), and a flood of cheap
/// requests starved every expensive one (logins, uploads: 503 after 10 s).
#[test]
fn connection_flood_that_fills_the_app_gets_only_what_people_leave() {
    let report = run_variants("connection-flood-app-full.toml", &["zero-config"]);
    let results = check_results(&report, "zero-config");
    assert!(results.len() >= 8, "{results:?}");
    assert!(
        results.iter().all(|(_, passed)| *passed),
        "{results:?}\n{}",
        report.to_text()
    );
}

/// A 3 s scenario's head: an app of 8 workers answering in 5 ms, no health check.
fn quick_scenario(name: &str, rest: &str) -> String {
    format!(
        "[scenario]\nname = {name:?}\nduration = \"3s\"\ngrace = \"3s\"\n\n\
         [app]\nworkers = 8\nbacklog = 64\n\
         default_service = {{ dist = \"fixed\", ms = 5 }}\nclasses = []\n\n\
         [health]\nenabled = false\n{rest}"
    )
}

const RIVALS: &str = r#"
[weir.nginx]
gateway = "nginx"
config = """
upstream app { server {{app}}; keepalive 16; }
server {
    listen {{listen}};
    location / {
        proxy_pass http://app;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
    }
}
"""

[weir.haproxy]
gateway = "haproxy"
config = """
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend web
    bind {{listen}}
    # One address may send 2 requests a second: the crawlers below send 5.
    stick-table type ip size 1k expire 30s store http_req_rate(1s)
    http-request track-sc0 src
    http-request deny deny_status 429 if { path_beg /w/ } { sc_http_req_rate(0) gt 2 }
    default_backend app
backend app
    server app {{app}}
"""

[[cohorts]]
kind = "humans"
count = 10
rate = 2
requests = [ { path = "/wiki/Page_{n}" } ]

[[cohorts]]
kind = "crawlers"
addresses = 4
rate = 5
requests = [ { path = "/w/index.php?title=Page_{n}&diff={n}" } ]

[[expect]]
check = "humans.served == 1"
[[expect]]
check = "humans.served_2s == 1"
[[expect]]
variant = "haproxy"
check = "crawlers.rejected_429 >= 0.3"
"#;

/// nginx and HAProxy as the gateway in front of the app: every request counted once,
/// the app's own count agrees, the rival's own limit shows in what clients saw, and
/// the weir-only parts of the report stay empty.
#[test]
fn rival_gateways_run_in_front_of_the_app() {
    let scenario = load_scenario_str(&quick_scenario("rivals", RIVALS), None)
        .unwrap_or_else(|e| panic!("{e}"));
    let report = {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        run_scenario(&scenario, &SimOptions::default()).unwrap_or_else(|e| panic!("{e}"))
    };
    assert!(report.passed(), "{}", report.to_text());
    for v in &report.variants {
        let reached: u64 = v.cohorts.iter().map(|c| c.reached_app).sum();
        assert!(reached > 50, "{}: {}", v.name, report.to_text());
        assert_eq!(
            v.upstream.served, reached,
            "{}: the app served what reached it",
            v.name
        );
        assert!(
            v.rules.is_empty() && v.alerts.is_none(),
            "weir-only parts stay empty"
        );
        let shares: f64 = v.cohorts.iter().map(|c| c.reached_app_share).sum();
        assert!((shares - 1.0).abs() < 1e-9, "{shares}");
    }
    let nginx = &report.variants[0];
    assert_eq!(nginx.gateway.as_str(), "nginx");
    let crawlers = &nginx.cohorts[1];
    assert_eq!(
        crawlers.count(Outcome::Served),
        crawlers.sent,
        "nginx has no limit here"
    );
}

#[test]
fn container_replacement_warming_pool_is_not_flooded() {
    let report = run_file("2026-10-04-container-replacement.toml");
    for variant in ["original", "recommended"] {
        let results = check_results(&report, variant);
        assert!(
            results.iter().all(|(_, passed)| *passed),
            "{variant}: {results:?}\n{}",
            report.to_text()
        );
    }
}

const CHALLENGED: &str = r#"
[weir.always]
config = """
[[listeners]]
address = "127.0.0.1:0"
[pools.app]
servers = ["{{app}}"]
[classes.default]
challenge = "always"
[challenge]
keys = ["lab-challenge-key-0123456789abcdef0123456789"]
difficulty = 10
"""

[[cohorts]]
kind = "humans"
count = 5
rate = 2

[[cohorts]]
kind = "crawlers"
addresses = 10
rate = 2
headless_share = 0.3

[[expect]]
check = "humans.served >= 0.99"
[[expect]]
check = "humans.challenges_solved_count >= 1"
# Crawlers without a browser send `Accept: */*`: not a navigation, so never
# sent a challenge page (they get the normal admission decision); the 30% that
# run a headless browser look like one and solve it.
[[expect]]
check = "crawlers.challenged == 0"
[[expect]]
check = "crawlers.challenges_solved_count >= 1"
"#;

#[test]
fn people_solve_the_challenge_and_non_navigations_never_see_it() {
    let scenario = load_scenario_str(&quick_scenario("challenge in the lab", CHALLENGED), None)
        .unwrap_or_else(|e| panic!("{e}"));
    let report = {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        run_scenario(&scenario, &SimOptions::default()).unwrap_or_else(|e| panic!("{e}"))
    };
    let results = check_results(&report, "always");
    assert!(
        results.iter().all(|(_, p)| *p),
        "{results:?}\n{}",
        report.to_text()
    );
    let humans = &report.variants[0].cohorts[0];
    // The report says what the challenge cost people.
    assert!(humans.challenged_p50_ms > 0.0, "{}", report.to_text());
    assert!(report.to_text().contains("solved challenges"));
}

#[test]
fn sim_duration_overrides_the_scenarios_and_refuses_nonsense() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("tiny.toml");
    std::fs::write(&scenario, TINY).unwrap();
    let json = dir.path().join("report.json");
    let weir = |extra: &[&str]| {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
            .arg("sim")
            .arg(&scenario)
            .args(extra)
            .output()
            .unwrap()
    };
    let out = weir(&["--duration", "1s", "--json", json.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["duration_s"], 1.0, "{}", report["duration_s"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("(1s per variant)"));
    // stderr is a pipe here: progress comes as lines of their own (the demo
    // once printed nothing for two minutes when it was not a terminal), one
    // at each variant's start at least, saying which, how long is left and
    // how much each cohort was served.
    let said = String::from_utf8_lossy(&out.stderr);
    let variants = report["variants"].as_array().unwrap();
    for v in variants {
        let name = v["name"].as_str().unwrap();
        let line = said
            .lines()
            .find(|l| l.starts_with(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("a progress line for {name}: {said}"));
        assert!(
            line.contains("/1s (") && line.contains("s left)") && line.contains("% served)"),
            "{line}"
        );
    }
    assert!(
        !said.contains('\r'),
        "no rewritten line on a pipe: {said:?}"
    );

    let out = weir(&["--duration", "11m"]);
    assert_eq!(out.status.code(), Some(2));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("--duration") && said.contains("at most"),
        "{said}"
    );
}

/// The HTML report opens with a picture (issue 40): what people got under
/// each variant as a bar, then each variant's seconds, and only then the
/// detail table; checked in headless Chromium, with a screenshot kept at
/// target/test-artifacts/sim-report.png.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_opens_with_what_people_got() {
    use crate::support::chromium::{Chromium, artifacts_dir};
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("tiny.toml");
    std::fs::write(&scenario, TINY).unwrap();
    let html = dir.path().join("report.html");
    let out = {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
            .args(["sim", scenario.to_str().unwrap(), "--duration", "1s"])
            .args(["--html", html.to_str().unwrap()])
            .output()
            .unwrap()
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = std::fs::read_to_string(&html).unwrap();
    let at = |what: &str| {
        page.find(what)
            .unwrap_or_else(|| panic!("{what} in the page"))
    };
    assert!(
        at("<h2>People</h2>") < at("requests/s by outcome")
            && at("requests/s by outcome") < at("<pre>"),
        "the picture, the seconds, then the table"
    );
    let dom = Chromium::run(
        &[
            "--dump-dom".to_string(),
            "--window-size=1000,1200".to_string(),
        ],
        &format!("file://{}", html.display()),
    )
    .output()
    .await;
    assert!(
        dom.contains("plain: served 100.0% (") && dom.contains("% served</text>"),
        "one labelled bar for the one variant: {dom}"
    );
    let shot = artifacts_dir().join("sim-report.png");
    Chromium::run(
        &[
            format!("--screenshot={}", shot.display()),
            "--window-size=1000,1200".to_string(),
        ],
        &format!("file://{}", html.display()),
    )
    .output()
    .await;
    assert!(
        std::fs::metadata(&shot).unwrap().len() > 10_000,
        "a screenshot"
    );
}
