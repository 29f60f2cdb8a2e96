//! Rules over real sockets, clients on distinct 127.x.y.z addresses: levels
//! (address, /24, /16, site) alone and combined, shadow mode, 429 responses,
//! state across restart and reload.

use std::net::IpAddr;

use crate::fixtures::*;
use crate::support::WeirConfig;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Every request in class `expensive`, and `rules` (tables).
fn rules_config(up: std::net::SocketAddr, rules: &str) -> String {
    WeirConfig::new(up).route("expensive").then(rules).toml()
}

/// An upstream, and weir in front of it with [`rules_config`]'s `rules`.
async fn rules_weir(rules: &str) -> (Upstream, TestWeir) {
    let up = Upstream::start().await;
    let weir = TestWeir::start(&rules_config(up.addr, rules)).await;
    (up, weir)
}

/// Sends one GET from each source; returns how many got each status.
async fn burst(weir: &TestWeir, sources: &[IpAddr], headers: &[(&str, &str)]) -> (usize, usize) {
    let mut ok = 0;
    let mut limited = 0;
    for s in sources {
        match get_from(*s, weir.addr, "/w/index.php?search=x", headers)
            .await
            .0
            .as_u16()
        {
            200 => ok += 1,
            429 => limited += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    (ok, limited)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_level_holds_a_flood_from_many_24s_in_one_16() {
    let (_up, weir) = rules_weir(
        r#"[[classes.expensive.rules]]
name = "anon-expensive"
limits = [
  { per = "ip", rate = 5, window = "10m" },
  { per = "subnet", rate = 20, window = "10m" },
  { per = "network", rate = 30, window = "10m" },
]
"#,
    )
    .await;
    // 40 /24s inside 127.20.0.0/16, two addresses each: every address and
    // every /24 stays under its own limit; only the /16 level can hold them.
    let sources: Vec<IpAddr> = (0..40)
        .flat_map(|n| [ip(&format!("127.20.{n}.1")), ip(&format!("127.20.{n}.2"))])
        .collect();
    let (ok, limited) = burst(&weir, &sources, &[]).await;
    assert_eq!(ok, 30, "the /16 admits exactly its quota");
    assert_eq!(limited, 50);
    // A client in another /16 is unaffected.
    assert_eq!(burst(&weir, &[ip("127.21.0.1")], &[]).await, (1, 0));
    let log = weir.access_log(81).await;
    let fired: Vec<_> = log.iter().filter(|l| l["status"] == 429).collect();
    assert!(
        fired
            .iter()
            .all(|l| l["rule"] == "anon-expensive" && l["rule_level"] == "network")
    );
    assert_eq!(fired[0]["rule_key"], "127.20.0.0/16");
    let m = weir.metrics().await;
    assert_metric(&m, "weir_rejections_total{rule=\"anon-expensive\"}", 50.0);
    assert_metric(
        &m,
        "weir_rule_decisions_total{rule=\"anon-expensive\",result=\"reject\"}",
        50.0,
    );
    // The level that did the work, as the dashboard shows it.
    assert_metric(
        &m,
        "weir_rule_rejections_total{rule=\"anon-expensive\",level=\"network\",enforced=\"yes\"}",
        50.0,
    );
    assert_metric(
        &m,
        "weir_rule_rejected_clients{rule=\"anon-expensive\"}",
        50.0,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn site_level_holds_a_flood_over_many_16s_and_ip_level_spares_neighbours() {
    let (_up, weir) = rules_weir(
        r#"[[classes.expensive.rules]]
name = "per-ip"
limits = [{ per = "ip", rate = 3, window = "1m" }]

[[classes.expensive.rules]]
name = "site"
limits = [{ per = "site", rate = 25, window = "1m" }]
"#,
    )
    .await;
    // One noisy address: limited by `per-ip` after 3; its neighbour is not.
    let noisy = vec![ip("127.30.0.1"); 5];
    assert_eq!(burst(&weir, &noisy, &[]).await, (3, 2));
    assert_eq!(burst(&weir, &[ip("127.30.0.2")], &[]).await, (1, 0));
    // A spread flood: one request from each of 40 /16s. `site` holds it.
    let spread: Vec<IpAddr> = (40..80).map(|n| ip(&format!("127.{n}.0.1"))).collect();
    let (ok, limited) = burst(&weir, &spread, &[]).await;
    assert_eq!(ok, 25 - 4, "site quota minus the 4 requests admitted above");
    assert_eq!(limited, 40 - ok);
    let log = weir.access_log(46).await;
    assert!(log.iter().any(|l| l["rule"] == "per-ip"
        && l["rule_level"] == "ip"
        && l["rule_key"] == "127.30.0.1"));
    assert!(
        log.iter()
            .any(|l| l["rule"] == "site" && l["rule_level"] == "site")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejections_carry_retry_after_ratelimit_headers_and_negotiated_bodies() {
    let (_up, weir) = rules_weir(
        r#"[[classes.expensive.rules]]
name = "tight"
limits = [{ per = "ip", rate = 1, window = "1m" }]
"#,
    )
    .await;
    let me = ip("127.31.0.1");
    assert_eq!(get_from(me, weir.addr, "/", &[]).await.0, 200);
    let (status, h, body) = get_from(me, weir.addr, "/", &[("accept", "application/json")]).await;
    assert_eq!(status, 429);
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    assert_eq!(h["ratelimit-policy"], "\"tight\";q=1;w=60");
    assert_eq!(
        h["ratelimit"].to_str().unwrap(),
        format!("\"tight\";r=0;t={retry}")
    );
    let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(doc["reason"], "tight");
    let (_, h, body) = get_from(me, weir.addr, "/", &[("accept", "text/html,*/*")]).await;
    assert!(h["content-type"].to_str().unwrap().starts_with("text/html"));
    assert!(String::from_utf8_lossy(&body).contains("Try again in"));
    // A browser navigation that is refused counts as possible human collateral.
    let m = weir.metrics().await;
    assert_metric_at_least(
        &m,
        "weir_rule_collateral_total{rule=\"tight\",signal=\"low_rate\",enforced=\"yes\"}",
        1.0,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_changes_no_response_but_counts() {
    let (_up, weir) = rules_weir(
        r#"[[classes.expensive.rules]]
name = "trial"
shadow = true
limits = [{ per = "subnet", rate = 2, window = "1m" }]
"#,
    )
    .await;
    let sources: Vec<IpAddr> = (1..=6).map(|n| ip(&format!("127.32.0.{n}"))).collect();
    assert_eq!(burst(&weir, &sources, &[]).await, (6, 0));
    let m = weir.metrics().await;
    assert_metric(
        &m,
        "weir_rule_decisions_total{rule=\"trial\",result=\"shadow_reject\"}",
        4.0,
    );
    assert_metric(&m, "weir_rejections_total{rule=\"trial\"}", 0.0);
    let log = weir.access_log(6).await;
    assert_eq!(log[5]["shadow_rules"][0], "trial");
    assert_eq!(log[5]["status"], 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookie_presence_can_never_exempt() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    std::fs::write(
        &path,
        rules_config(
            up.addr,
            "[[classes.expensive.rules]]\nname = \"r\"\nexempt = [\"cookie:wikisession\"]\nlimits = [{ per = \"ip\", rate = 1, window = \"1m\" }]\n",
        ),
    )
    .unwrap();
    let loaded = weir::config::load_file(&path, &weir::config::ProcessEnv).unwrap();
    let err = weir::gateway::Gateway::build(loaded, None, 1)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("classes.expensive.rules[0].exempt[0]"),
        "{err}"
    );
    assert!(err.contains("only `verified` sessions"), "{err}");
    // With the exemption for verified sessions only, a session cookie anyone
    // can get from the login page changes nothing.
    let weir = TestWeir::start(&rules_config(
        up.addr,
        "[[classes.expensive.rules]]\nname = \"r\"\nexempt = [\"verified\"]\nlimits = [{ per = \"ip\", rate = 1, window = \"1m\" }]\n\
         [sessions.signed_cookie]\ncookie = \"weir_session\"\nkeys = [\"0123456789abcdef0123456789abcdef-rules\"]\n",
    ))
    .await;
    let me = ip("127.33.0.1");
    let cookie = [("cookie", "wikisession=abc123; mywiki_session=x")];
    assert_eq!(get_from(me, weir.addr, "/", &cookie).await.0, 200);
    assert_eq!(get_from(me, weir.addr, "/", &cookie).await.0, 429);
}

const SNAPSHOT_RULES: &str = r#"[[classes.expensive.rules]]
name = "per-ip"
limits = [{ per = "ip", rate = 3, window = "10m" }]

[[classes.expensive.rules]]
name = "other"
limits = [{ per = "site", rate = 1000, window = "10m" }]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_hold_from_the_first_request_after_a_restart() {
    let up = Upstream::start().await;
    let state = tempfile::tempdir().unwrap();
    let snap = state.path().join("limits.snap");
    let cfg = format!(
        "{}\n[state]\nsnapshot_file = \"{}\"\n",
        rules_config(up.addr, SNAPSHOT_RULES),
        snap.display()
    );
    let mut first = TestWeir::start(&cfg).await;
    assert!(matches!(
        first.server().restored,
        weir::state::Restored::Missing { .. }
    ));
    let me = ip("127.34.0.1");
    assert_eq!(burst(&first, &[me; 4], &[]).await, (3, 1));
    // Graceful stop writes the snapshot.
    first
        .server
        .take()
        .unwrap()
        .drain(
            std::time::Duration::from_secs(5),
            weir::server::Accepting::WhileEarlierWork,
        )
        .await;
    assert!(snap.exists());

    let second = TestWeir::start(&cfg).await;
    let restored = second.server().restored.keys();
    assert!(restored >= 2, "restored {restored} keys");
    let m = second.metrics().await;
    assert_eq!(metric(&m, "weir_state_restored_keys"), restored as f64);
    // The very first request from the limited client is still refused.
    assert_eq!(burst(&second, &[me], &[]).await, (0, 1));
    assert_eq!(burst(&second, &[ip("127.34.0.2")], &[]).await, (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_keeps_state_of_unchanged_rules_only() {
    let up = Upstream::start().await;
    let base = "[process]\nwatch_config = false\n";
    let weir = TestWeir::start(&format!("{base}{}", rules_config(up.addr, SNAPSHOT_RULES))).await;
    let me = ip("127.35.0.1");
    assert_eq!(burst(&weir, &[me; 4], &[]).await, (3, 1));

    // An unrelated change (the other rule): `per-ip` keeps its state.
    let changed_other = SNAPSHOT_RULES.replace("rate = 1000", "rate = 2000");
    std::fs::write(
        &weir.config_path,
        format!("{base}{}", rules_config(up.addr, &changed_other)),
    )
    .unwrap();
    weir.server().runtime.reload(true).unwrap();
    assert_eq!(
        burst(&weir, &[me], &[]).await,
        (0, 1),
        "state kept across reload"
    );

    // Changing the rule itself starts it afresh.
    let changed_rule = changed_other.replace("rate = 3,", "rate = 5,");
    std::fs::write(
        &weir.config_path,
        format!("{base}{}", rules_config(up.addr, &changed_rule)),
    )
    .unwrap();
    weir.server().runtime.reload(true).unwrap();
    assert_eq!(burst(&weir, &[me], &[]).await, (1, 0));
}
