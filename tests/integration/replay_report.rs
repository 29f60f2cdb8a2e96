//! `weir replay` for an operator (issue 20 item 9): a progress bar on a
//! terminal, times in the log's own zone, breakdowns by level, user-agent
//! family and prefix, concurrency rules reported as not replayed, and an
//! HTML report with a per-minute chart that a real browser renders.

use std::fmt::Write as _;
use std::process::Command;

use crate::support::WeirConfig;
use crate::support::chromium::{Chromium, keep_screenshot};

/// The app (never reached: replay only reads the rules), searches in the
/// class `expensive`, the rest in `page`; `expensive`'s rules are
/// [`RULES`].
fn replay_config() -> String {
    WeirConfig::new("127.0.0.1:9")
        .route_with("expensive", r#"query_keys = ["search"]"#)
        .route("page")
        .then(RULES)
        .toml()
}

const RULES: &str = r#"
[[classes.expensive.rules]]
name = "anon"
limits = [
  { per = "ip",     rate = 3,  window = "1m" },
  { per = "subnet", rate = 8,  window = "1m" },
]

[[classes.expensive.rules]]
name = "in-flight"
type = "concurrency"
per = "subnet"
max = 2
"#;

const GPTBOT: &str = "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; GPTBot/1.2; +https://openai.com/gptbot)";
const CHROME: &str = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36";

/// A combined log written at +0100, 10:00 to 10:04 local time: a crawler
/// farm (GPTBot, 20 addresses in one /24) and a curl loop that trip the
/// rule, and people in Chrome who read a few pages.
fn log() -> String {
    let mut log = String::new();
    for minute in 0..5 {
        for second in 0..60 {
            let t = format!("02/Dec/2026:10:{minute:02}:{second:02} +0100");
            let bot = (minute * 60 + second) % 20;
            for (ip, ua) in [
                (format!("198.51.100.{bot}"), GPTBOT),
                ("203.0.113.50".to_string(), "curl/8.11.0"),
            ] {
                writeln!(
                    log,
                    "{ip} - - [{t}] \"GET /w/index.php?search=x{second} HTTP/1.1\" 200 512 \"-\" \"{ua}\""
                )
                .unwrap();
            }
            if second % 15 == 0 {
                let person = format!("192.0.2.{}", minute * 4 + second / 15);
                writeln!(
                    log,
                    "{person} - - [{t}] \"GET /w/index.php?search=weir HTTP/1.1\" 200 512 \"https://wiki.example/\" \"{CHROME}\""
                )
                .unwrap();
            }
        }
    }
    log
}

#[tokio::test]
async fn replay_reports_in_the_logs_zone_with_breakdowns_and_an_html_chart() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("weir.toml");
    std::fs::write(&config, replay_config()).unwrap();
    let access = dir.path().join("access.log");
    std::fs::write(&access, log()).unwrap();
    let (json, html) = (dir.path().join("r.json"), dir.path().join("r.html"));

    // Under `script`, stderr is a terminal: the progress bar is drawn.
    let cmd = format!(
        "{} replay -c {} {} --json {} --html {}",
        env!("CARGO_BIN_EXE_weir"),
        config.display(),
        access.display(),
        json.display(),
        html.display()
    );
    let out = Command::new("script")
        .args(["-qefc", &cmd, "/dev/null"])
        .env("TERM", "xterm")
        .output()
        .expect("script(1) from util-linux");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    assert!(text.contains("replaying ["), "a progress bar: {text}");
    assert!(
        text.contains("from 2026-12-02T10:00 to 2026-12-02T10:04 (+01:00)"),
        "times in the log's zone: {text}"
    );
    assert!(
        text.contains("not replayed: rule in-flight (a concurrency rule"),
        "{text}"
    );
    let line = |start: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(start).map(str::to_owned))
            .unwrap_or_else(|| panic!("no `{start}` line: {text}"))
    };
    // Largest first: the curl loop (one address) then the farm.
    assert!(line("by level: ").starts_with("ip "), "{text}");
    assert!(line("by user agent: ").starts_with("curl "), "{text}");
    assert!(line("by user agent: ").contains(", GPTBot "), "{text}");

    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let r = &report["report"];
    assert_eq!(r["zone"], "+01:00");
    assert_eq!(r["not_replayed"][0]["rule"], "in-flight");
    let anon = &r["rules"]["anon"];
    let rejections = anon["rejections"].as_u64().unwrap();
    let by = |field: &str| -> u64 {
        anon[field]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum()
    };
    assert!(rejections > 500, "{anon}");
    assert_eq!(by("by_level"), rejections, "every rejection has a level");
    assert_eq!(by("by_user_agent"), rejections, "and a family");
    assert!(
        anon["by_user_agent"]["GPTBot"].as_u64().unwrap() > 0,
        "{anon}"
    );
    assert!(
        anon["by_user_agent"]["curl"].as_u64().unwrap() > 0,
        "{anon}"
    );
    // The curl loop is one address: its rejections are at the ip level;
    // the farm's 20 addresses at 3 a minute each fill the /24's 8.
    assert!(anon["by_level"]["subnet"].as_u64().unwrap() > 0, "{anon}");
    assert_eq!(
        anon["per_minute"]
            .as_object()
            .unwrap()
            .keys()
            .next()
            .unwrap(),
        "2026-12-02T10:00",
        "minutes in the log's zone: {anon}"
    );
    assert_eq!(anon["top_subnets"][0][0], "203.0.113.0/24", "{anon}");
    assert_eq!(anon["top_subnets"][1][0], "198.51.100.0/24", "{anon}");

    // The page, as a real browser renders it.
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("in-flight"), "the not-replayed note");
    let url = format!("file://{}", html.display());
    let dom = Chromium::dump_dom(&url, "1000,1600").await;
    let bars = dom.matches("class=\"bar\"").count();
    assert!(
        (5..=10).contains(&bars),
        "one bar per minute with rejections (one rule): {bars}"
    );
    assert_eq!(dom.matches("class=\"breakdown\"").count(), 3, "{dom}");
    assert!(dom.contains("GPTBot") && dom.contains("198.51.100.0/24"));
    assert!(dom.contains("UTC+01:00"));
    keep_screenshot(&url, "1000,1600", "replay-report.png").await;
}
