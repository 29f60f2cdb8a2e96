//! `weir replay`: the same requests, replayed from nginx combined, Caddy JSON
//! and weir JSON logs, get the same decisions as live traffic with the same
//! configuration; malformed lines are counted with line numbers.

use std::fmt::Write as _;
use std::net::IpAddr;

use weir_replay::engine::{Verdict, replay_files};
use weir_replay::{ReaderOptions, TrailingField};

use crate::fixtures::*;
use crate::support::json_lines;

// Windows long against the test's duration, so decisions depend on counts,
// not on the one-second resolution of combined logs.
const RULES: &str = r#"
[[classes.expensive.rules]]
name = "anon"
limits = [
  { per = "ip",      rate = 3,  window = "1m" },
  { per = "subnet",  rate = 5,  window = "1m" },
  { per = "network", rate = 12, window = "10m" },
  { per = "site",    rate = 30, window = "10m" },
]

[[classes.expensive.rules]]
name = "trial"
shadow = true
limits = [{ per = "subnet", rate = 2, window = "1m" }]
"#;

fn config(up: std::net::SocketAddr, log: &std::path::Path) -> String {
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n[access_log]\ntarget = \"{}\"\n[pools.app]\nservers = [\"{up}\"]\n\
         [[routes]]\npool = \"app\"\nclass = \"expensive\"\nquery_keys = [\"search\"]\n[[routes]]\npool = \"app\"\nclass = \"page\"\n{RULES}",
        log.display()
    )
}

fn month(m: &str) -> &'static str {
    [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ][m.parse::<usize>().unwrap() - 1]
}

/// `2026-11-29T23:18:58.123Z` → `29/Nov/2026:23:18:58 +0000`.
fn nginx_time(t: &str) -> String {
    format!(
        "{}/{}/{}:{} +0000",
        &t[8..10],
        month(&t[5..7]),
        &t[0..4],
        &t[11..19]
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_of_each_format_matches_live_decisions() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let live_log = dir.path().join("live.log");
    let cfg_text = config(up.addr, &live_log);
    let weir = TestWeir::start(&cfg_text).await;

    // Live traffic, sequential: 90 requests over 3 /16s, a few noisy clients.
    let mut sent = 0;
    for i in 0..90u32 {
        let (net, sub, host) = (90 + i % 3, (i / 3) % 4, 1 + (i / 12) % 5);
        let src: IpAddr = format!("127.{net}.{sub}.{host}").parse().unwrap();
        let path = if i % 5 == 4 {
            "/wiki/Page".to_string()
        } else {
            format!("/w/index.php?search={i}")
        };
        let accept = if i % 2 == 0 { "text/html" } else { "*/*" };
        get_from(
            src,
            weir.addr,
            &path,
            &[("accept", accept), ("user-agent", "test/1")],
        )
        .await;
        sent += 1;
    }
    let live = json_lines(&live_log, sent).await;
    let live_rejects: Vec<bool> = live.iter().map(|l| l["status"] == 429).collect();
    assert!(
        live_rejects.iter().filter(|r| **r).count() >= 10,
        "the rules must fire live"
    );

    // The same requests in each format.
    let mut combined = String::new();
    let mut caddy = String::new();
    for (n, l) in live.iter().enumerate() {
        let (client, path, status) = (
            l["client"].as_str().unwrap(),
            l["path"].as_str().unwrap(),
            &l["status"],
        );
        let accept = if n % 2 == 0 { "text/html" } else { "*/*" };
        writeln!(
            combined,
            "{client} - - [{}] \"GET {path} HTTP/1.1\" {status} 12 \"-\" \"test/1\"",
            nginx_time(l["time"].as_str().unwrap())
        )
        .unwrap();
        if n == 40 {
            combined.push_str("this line is not a log line\n");
        }
        let ts = humantime::parse_rfc3339(l["time"].as_str().unwrap()).unwrap();
        let ts = ts
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        writeln!(
            caddy,
            "{}",
            serde_json::json!({"level":"info","ts":ts,"logger":"http.log.access","msg":"handled request",
                "request":{"remote_ip":client,"client_ip":client,"method":"GET","host":"test.local","uri":path,
                "headers":{"User-Agent":["test/1"],"Accept":[accept]}},"status":status,"size":12,"duration":0.001})
        )
        .unwrap();
    }
    let files = [
        ("combined", combined),
        ("caddy", caddy),
        ("weir", std::fs::read_to_string(&live_log).unwrap()),
    ];
    for (name, text) in files {
        let path = dir.path().join(format!("{name}.log"));
        std::fs::write(&path, text).unwrap();
        let loaded = weir::config::load_str(&cfg_text, None, &weir::config::ProcessEnv).unwrap();
        let gateway = weir::gateway::Gateway::build(loaded, None, 1).unwrap();
        let mut verdicts = Vec::new();
        let run = replay_files(gateway, &[path], &ReaderOptions::default(), |rec, v| {
            verdicts.push((rec.client.to_string(), matches!(v, Verdict::Reject(_))));
        })
        .unwrap();
        assert_eq!(verdicts.len(), live.len(), "{name}: every record replayed");
        for (i, ((client, rejected), l)) in verdicts.iter().zip(&live).enumerate() {
            assert_eq!(
                client,
                l["client"].as_str().unwrap(),
                "{name}: order at {i}"
            );
            assert_eq!(
                *rejected, live_rejects[i],
                "{name}: record {i} ({client}) decided differently"
            );
        }
        let anon = &run.report.rules["anon"];
        assert_eq!(
            anon.rejections as usize,
            live_rejects.iter().filter(|r| **r).count(),
            "{name}"
        );
        assert!(run.report.rules["trial"].shadow_rejections > 0, "{name}");
        assert!(anon.distinct_clients > 0 && !anon.top_subnets.is_empty());
        if name == "combined" {
            assert_eq!(run.malformed, 1);
            assert_eq!(
                run.malformed_examples[0].1, 42,
                "line number of the garbage line"
            );
        }
    }
    let _ = TrailingField::Cookie;
}
