//! `/metrics` as the ecosystem's own tools read it (issue 20): Prometheus
//! text 0.0.4 unless OpenMetrics is asked for, `promtool check metrics`
//! clean, and the series the shipped alerts watch with `increase(...) > 0`
//! present at 0 from the start. promtool is Debian's `prometheus` package
//! (scripts/install-test-deps.sh).

use std::io::Write;
use std::process::{Command, Stdio};

use crate::support::{HttpRequest, Weir, WeirConfig};

/// One listener and the admin endpoint (the app is never reached).
fn config() -> String {
    WeirConfig::new("127.0.0.1:9").admin().toml()
}

/// `promtool check metrics` on `text`: its exit code and what it said.
fn promtool(text: &str) -> (i32, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (scripts/install-test-deps.sh installs prometheus)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), said)
}

#[tokio::test]
async fn metrics_pass_promtool_and_speak_both_formats() {
    let weir = Weir::builder().config(config()).start().await.unwrap();
    // Some traffic first, so labelled families and histograms have samples.
    for _ in 0..3 {
        let _ = HttpRequest::get("/x").send(weir.listener(0)).await;
    }
    let plain = HttpRequest::get("/metrics")
        .send(weir.admin())
        .await
        .unwrap();
    assert_eq!(
        plain.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = plain.text();
    assert!(
        !text.contains("# EOF") && !text.contains("# UNIT"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE weir_connections_accepted_total counter"),
        "{text}"
    );
    let (code, said) = promtool(&text);
    assert_eq!(code, 0, "promtool: {said}\n{text}");

    // What Prometheus sends: OpenMetrics first.
    let om = HttpRequest::get("/metrics")
        .header(
            "accept",
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
        )
        .send(weir.admin())
        .await
        .unwrap();
    assert!(
        om.header("content-type")
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    assert!(om.text().trim_end().ends_with("# EOF"));

    for series in [
        "weir_reloads_total{result=\"invalid\"} 0",
        "weir_connections_refused_total{reason=\"per_ip_cap\"} 0",
        "weir_forwarding_header_warnings_total{kind=\"dominant_peer\"} 0",
        // The pool's server-side errors, before any of that kind.
        "weir_upstream_errors_total{pool=\"app\",kind=\"timeout\"} 0",
    ] {
        assert!(text.contains(series), "{series} missing at start:\n{text}");
    }
    // The standard process set, unprefixed, and the end-to-end durations.
    for family in [
        "# TYPE process_cpu_seconds_total counter",
        "# TYPE process_open_fds gauge",
        "# TYPE process_resident_memory_bytes gauge",
        "# TYPE weir_request_duration_seconds histogram",
        "# TYPE weir_limiter_evicted_keys_total counter",
    ] {
        assert!(text.contains(family), "{family} missing:\n{text}");
    }
    // A request is counted when its answer's last byte is handed on, which
    // can be just after the client read it: scrape until all three show.
    let mut answered: u64;
    assert_eventually_async!(
        {
            let text = HttpRequest::get("/metrics")
                .send(weir.admin())
                .await
                .unwrap()
                .text();
            answered = (text.lines())
                .filter(|l| l.starts_with("weir_request_duration_seconds_count{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
                .sum::<u64>();
            answered >= 3
        },
        "{answered} of three requests timed"
    );
    assert_eq!(answered, 3, "three requests timed");
}

#[test]
fn shipped_alert_rules_pass_promtool() {
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/alerts.yml");
    let out = Command::new("promtool")
        .args(["check", "rules", rules])
        .output()
        .expect("promtool (scripts/install-test-deps.sh installs prometheus)");
    assert!(
        out.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
