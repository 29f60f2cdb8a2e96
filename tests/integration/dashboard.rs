//! The shipped Grafana dashboard, `docs/grafana/weir.json` (issue 20 item
//! 5): every panel's PromQL passes `promtool check rules`, and a real
//! Prometheus scraping a weir under load (people, a rate rule refusing
//! browsers, a challenge solved, an admission queue that waits and sheds,
//! health checks, idle connections closed) has data for every one of them.
//! Prometheus and promtool are Debian's `prometheus` package
//! (scripts/install-test-deps.sh).

use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use weir::challenge::{page_nonce, pow};

use crate::fixtures::{H1, Upstream, urlencode};
use crate::support::WeirConfig;
use crate::support::{HttpRequest, Weir};

/// The window Grafana's `$__rate_interval` stands for here: four scrapes at
/// 1 s plus the load's last seconds.
const RATE_INTERVAL: &str = "15s";

struct PanelQuery {
    panel: String,
    expr: String,
}

/// Every panel's queries, with the dashboard's variables as a test sets
/// them (every instance, the rate window above). Checks the shape an
/// operator relies on on the way: a title, a description, the datasource
/// variable.
fn panel_queries() -> Vec<PanelQuery> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/grafana/weir.json");
    let text = std::fs::read_to_string(path).expect("docs/grafana/weir.json");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        if panel["type"] == "row" {
            continue;
        }
        let title = panel["title"].as_str().expect("every panel has a title");
        assert!(
            panel["description"].as_str().is_some_and(|d| d.len() > 20),
            "{title}: says what it shows"
        );
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        for t in targets {
            let expr = t["expr"].as_str().expect("a PromQL expr");
            out.push(PanelQuery {
                panel: title.to_owned(),
                expr: expr
                    .replace("$__rate_interval", RATE_INTERVAL)
                    .replace("$instance", ".+"),
            });
        }
    }
    assert!(out.len() >= 25, "{} queries", out.len());
    out
}

#[test]
fn every_panel_query_passes_promtool() {
    let queries = panel_queries();
    // A rules file is how promtool checks PromQL offline; YAML reads JSON.
    let rules = serde_json::json!({
        "groups": [{
            "name": "dashboard",
            "rules": queries.iter().enumerate().map(|(i, q)| serde_json::json!({
                "record": format!("dashboard:query_{i}"),
                "expr": q.expr,
            })).collect::<Vec<_>>(),
        }]
    });
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard-rules.yml");
    std::fs::write(&file, rules.to_string()).unwrap();
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect("promtool (scripts/install-test-deps.sh installs prometheus)");
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "promtool check rules: {said}");
    assert!(
        said.contains(&format!("{} rules found", queries.len())),
        "{said}"
    );
}

const KEY: &str = "dashboard-test-key-0123456789abcdef0123";

fn config(up: SocketAddr) -> String {
    WeirConfig::new(up)
        .admin()
        .then("[limits]\nkeepalive_idle_timeout = \"1s\"")
        .admission("max_in_flight = 2\nmax_queued = 3")
        .then("[pools.app.health]\npath = \"/healthz\"\ninterval = \"1s\"")
        .route_with("page", "path_prefix = \"/wiki/\"")
        .route_with("slow", "path_prefix = \"/slow/\"")
        .route("api")
        .then(
            r#"[classes.page]
challenge = "always"
[[classes.api.rules]]
name = "api-per-address"
limits = [{ per = "ip", rate = 2, window = "1m" }, { per = "site", rate = 100000, window = "1m" }]
"#,
        )
        .challenge(KEY, 8)
        .toml()
}

/// A Prometheus scraping `target` every second, its data in a scratch dir.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    async fn start(target: SocketAddr) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: weir\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        // A free port, taken back just before Prometheus binds it.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("prometheus (scripts/install-test-deps.sh installs it)");
        let p = Prometheus {
            child,
            addr,
            _dir: dir,
        };
        let ready = || async {
            let r = HttpRequest::get("/-/ready").send(addr).await;
            r.is_ok_and(|r| r.status == 200)
        };
        assert_eventually_async!(
            within = Duration::from_secs(30),
            ready().await,
            "prometheus not ready: {}",
            std::fs::read_to_string(p._dir.path().join("prometheus.log")).unwrap_or_default()
        );
        p
    }

    /// An instant query's result vector.
    async fn query(&self, expr: &str) -> Vec<serde_json::Value> {
        let r = HttpRequest::get(&format!("/api/v1/query?query={}", urlencode(expr)))
            .send(self.addr)
            .await
            .unwrap();
        let body: serde_json::Value =
            serde_json::from_str(&r.text()).unwrap_or_else(|e| panic!("{e}: {r}"));
        assert_eq!(body["status"], "success", "{expr}: {body}");
        body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

fn ip(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 3, last])
}

/// One round of the load: people's pages and API reads, a browser refused
/// by the rate rule, and a burst over the admission limit (waits and sheds).
async fn load_round(weir: &Weir, round: u8) {
    let addr = weir.listener(0);
    let mut tasks = Vec::new();
    for i in 0..8u8 {
        tasks.push(tokio::spawn(async move {
            HttpRequest::get("/slow/300")
                .from(ip(100 + i))
                .send(addr)
                .await
                .map(|r| r.status)
        }));
    }
    for i in 0..4u8 {
        // Each a fresh address: the rule lets two a minute through.
        let fresh = IpAddr::from([127, 0, 4, round.wrapping_mul(4).wrapping_add(i)]);
        let _ = HttpRequest::get("/api/items").from(fresh).send(addr).await;
    }
    // A browser past the rule's limit: refused, and counted as a person.
    for _ in 0..3 {
        let _ = HttpRequest::get("/api/items")
            .from(ip(250))
            .header("accept", "text/html")
            .header("sec-fetch-mode", "navigate")
            .send(addr)
            .await;
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// A browser's challenge, solved the way the page's script does it: a
/// browser of its own each `round` (one that solved three in a minute
/// without keeping its pass would be in a loop, and get the page).
async fn solve_a_challenge(weir: &Weir, round: u8) {
    let addr = weir.listener(0);
    let agent = format!("Mozilla/5.0 dashboard test {round}");
    let nav = |r: HttpRequest| {
        r.from(ip(200))
            .header("accept", "text/html,application/xhtml+xml")
            .header("sec-fetch-mode", "navigate")
            .header("user-agent", &agent)
    };
    let page = nav(HttpRequest::get("/wiki/Main"))
        .send(addr)
        .await
        .unwrap();
    assert_eq!(page.status, 429, "{page}");
    let nonce = page_nonce(page.text().as_bytes()).expect("a challenge page");
    let counter = pow::solve(&nonce, 8);
    let form = weir::challenge::answer_form(&nonce, counter);
    let answer = nav(HttpRequest::post("/.weir/challenge/verify", form))
        .header("content-type", "application/x-www-form-urlencoded")
        .send(addr)
        .await
        .unwrap();
    assert_eq!(answer.status, 303, "{answer}");
}

/// The panels whose query has no data in `prometheus`, each with what it got.
async fn panels_without_data(prometheus: &Prometheus, queries: &[PanelQuery]) -> Vec<String> {
    let mut missing = Vec::new();
    for q in queries {
        let result = prometheus.query(&q.expr).await;
        // Data: at least one series with a number (a quantile of nothing is
        // NaN, which a panel draws as nothing).
        let finite = result.iter().any(|s| {
            s["value"][1]
                .as_str()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(f64::is_finite)
        });
        if !finite {
            missing.push(format!("{}: {} -> {:?}", q.panel, q.expr, result));
        }
    }
    missing
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_query_returns_data_from_a_real_prometheus() {
    let queries = panel_queries();
    let up = Upstream::start().await;
    let weir = Weir::builder()
        .config(config(up.addr))
        .start()
        .await
        .unwrap();
    let prometheus = Prometheus::start(weir.admin()).await;

    // A kept-alive connection left idle past keepalive_idle_timeout: weir
    // closes it (weir_connections_closed_total{reason="idle_timeout"}).
    let mut idle = H1::connect(ip(240), weir.listener(0)).await.unwrap();
    let (status, _, _) = idle.get("/api/idle").await;
    assert_eq!(status, 200);
    // Rounds of load, each with a challenge solved, until every panel has
    // data: a rate needs an increase between two scrapes (a second apart).
    let started = Instant::now();
    let mut round = 0u8;
    let missing = loop {
        load_round(&weir, round).await;
        solve_a_challenge(&weir, round).await;
        round = round.wrapping_add(1);
        let missing = panels_without_data(&prometheus, &queries).await;
        if missing.is_empty() || started.elapsed() > Duration::from_secs(30) {
            break missing;
        }
    };
    drop(idle);
    assert!(
        missing.is_empty(),
        "{} of {} panel queries have no data:\n{}",
        missing.len(),
        queries.len(),
        missing.join("\n")
    );
}
