//! A new generation's readiness, end to end with weir processes: blue/green
//! through a shared Redis (the new generation enforces the old one's limits
//! from its first request, and says where its state comes from), and the
//! warm-up gate (`/readyz` 503 "waiting for pool X" until the pool answers,
//! ready anyway at `lifecycle.ready_upstream_timeout`, and an in-place
//! upgrade that does not hand over until the new process's pools answer).
//!
//! Deadlines are generous and polled; nothing asserts how fast weir is.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;

use crate::fixtures::{Upstream, assert_metric, metric};
use crate::support::ports::unused_addr;
use crate::support::process::send_signal;
use crate::support::{HttpRequest, HttpUpstream, Redis, Signal, Weir, WeirConfig};

async fn readyz(w: &Weir) -> (u16, String) {
    let r = HttpRequest::get("/readyz").send(w.admin()).await.unwrap();
    (r.status, r.text())
}

async fn get_from(w: &Weir, source: Ipv4Addr) -> u16 {
    HttpRequest::get("/limited")
        .from(source)
        .send(w.listener(0))
        .await
        .unwrap()
        .status
}

/// Polls `/readyz` until 200, or fails with what it last said.
async fn until_ready(w: &Weir, within: Duration) -> String {
    let mut said: (u16, String);
    assert_eventually_async!(
        within = within,
        {
            said = readyz(w).await;
            said.0 == 200
        },
        "/readyz still {} after {within:?}: {}\n{}",
        said.0,
        said.1,
        w.stderr()
    );
    said.1
}

fn redis_config(app: SocketAddr, redis: SocketAddr) -> String {
    WeirConfig::new(app)
        .admin()
        .access_log_off()
        .then(format!(
            "[process]\nwatch_config = false\n[state]\nredis_url = \"redis://{redis}/0\""
        ))
        .route_with("limited", "path_prefix = \"/limited\"")
        .route("open")
        .then(
            r#"[[classes.limited.rules]]
name = "per-ip"
limits = [{ per = "ip", rate = 3, window = "1m" }]
"#,
        )
        .toml()
}

/// Blue/green on two processes sharing one Redis, no snapshot file: a
/// client over its limit on the old generation is refused by the new one's
/// very first answer to it, while another client is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blue_green_through_redis_keeps_a_limited_client_limited() {
    let app = Upstream::start().await;
    let redis = Redis::builder().start().await.expect("redis starts");
    let cfg = redis_config(app.addr, redis.addr());
    let mut blue = Weir::builder().config(&cfg).start().await.unwrap();
    // Ready means Redis is in use (the warm-up waits for it).
    until_ready(&blue, Duration::from_secs(15)).await;
    assert_eq!(blue.status().await["state"]["shared"]["in_use"], true);

    let limited = Ipv4Addr::new(127, 61, 0, 1);
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(get_from(&blue, limited).await);
    }
    assert_eq!(seen, [200, 200, 200, 429], "{}", blue.stderr());

    // The new generation: its own process and port, the same Redis.
    let green = Weir::builder().config(&cfg).start().await.unwrap();
    assert_ne!(green.listener(0), blue.listener(0));
    let ready = until_ready(&green, Duration::from_secs(15)).await;
    assert!(ready.starts_with("ready\n"), "{ready}");
    let st = green.status().await;
    // It says where its limits come from: nothing restored, Redis in use.
    assert_eq!(st["state"]["restored"], "not_configured", "{st}");
    assert_eq!(st["state"]["restored_keys"], 0, "{st}");
    assert_eq!(st["state"]["shared"]["backend"], "redis", "{st}");
    assert_eq!(st["state"]["shared"]["in_use"], true, "{st}");
    assert_eq!(st["warm_up"]["phase"], "ready", "{st}");

    // Its first request from the limited client: still limited.
    assert_eq!(get_from(&green, limited).await, 429, "{}", green.stderr());
    assert_eq!(get_from(&green, Ipv4Addr::new(127, 61, 0, 2)).await, 200);
    let st = green.status().await;
    assert!(
        st["state"]["shared"]["round_trips_ok"].as_u64() >= Some(1),
        "decided through Redis: {st}"
    );

    // The old generation goes; the limit stays.
    blue.signal(Signal::Term).unwrap();
    assert!(
        blue.wait_exit(Duration::from_secs(15))
            .await
            .unwrap()
            .success()
    );
    assert_eq!(get_from(&green, limited).await, 429);
    assert_eq!(
        metric(&green.metrics().await, "weir_warmup_timeouts_total"),
        0.0
    );
}

fn warm_up_config(app: SocketAddr, api: SocketAddr, timeout: &str) -> String {
    // The route to `api` comes before the one to `app`.
    WeirConfig::new(app)
        .admin()
        .access_log_off()
        .then(format!(
            r#"[process]
watch_config = false
drain_timeout = "2s"
[lifecycle]
ready_upstream_timeout = "{timeout}"
[pools.api]
servers = ["{api}"]
[pools.api.health]
path = "/health"
interval = "200ms"
[[routes]]
pool = "api"
path_prefix = "/api"
class = "api""#
        ))
        .route("open")
        .toml()
}

async fn ok_upstream() -> HttpUpstream {
    HttpUpstream::start(|_| http::Response::new(Full::new(Bytes::from_static(b"ok\n"))))
        .await
        .unwrap()
}

/// Started before its app: `/readyz` says which pool it waits for (the
/// health-checked one that answers is not named), then turns 200 once the
/// app listens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_waits_for_a_pool_until_it_answers() {
    let api = ok_upstream().await;
    let app_addr = unused_addr();
    let weir = Weir::builder()
        .config(warm_up_config(app_addr, api.addr(), "60s"))
        .start()
        .await
        .unwrap();
    // The health-checked pool answers within a probe round or two.
    let (mut code, mut body): (u16, String);
    assert_eventually_async!(
        {
            (code, body) = readyz(&weir).await;
            // Its first line names what readiness still waits for.
            code != 503 || !body.lines().next().unwrap_or_default().contains("pool api")
        },
        "{code}: {body}"
    );
    assert_eq!(code, 503, "{body}");
    assert!(body.starts_with("waiting for pool app to answer"), "{body}");
    assert!(!body.contains("pool api,"), "{body}");
    let st = weir.status().await;
    assert_eq!(st["warm_up"]["phase"], "waiting", "{st}");
    assert_eq!(
        st["warm_up"]["waiting_for"],
        serde_json::json!(["pool app"])
    );
    assert_eq!(metric(&weir.metrics().await, "weir_warmup_waiting"), 1.0);
    // Traffic is served meanwhile: readiness is only the orchestrator's cue.
    let r = HttpRequest::get("/api/x")
        .send(weir.listener(0))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");

    let _app = Upstream::start_on(app_addr).await;
    let body = until_ready(&weir, Duration::from_secs(15)).await;
    assert!(!body.contains("timed out"), "{body}");
    let st = weir.status().await;
    assert_eq!(st["warm_up"]["phase"], "ready", "{st}");
    let m = weir.metrics().await;
    assert_metric(&m, "weir_warmup_waiting", 0.0);
    assert_metric(&m, "weir_warmup_timeouts_total", 0.0);
    assert!(metric(&m, "weir_warmup_seconds") > 0.0, "{m}");
    assert!(weir.stderr().contains("warm-up done"), "{}", weir.stderr());
}

/// An app that never comes: ready anyway at the timeout, loudly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_stops_waiting_at_the_timeout() {
    let api = ok_upstream().await;
    let weir = Weir::builder()
        .config(warm_up_config(unused_addr(), api.addr(), "2s"))
        .start()
        .await
        .unwrap();
    let (code, body) = readyz(&weir).await;
    // Unless this machine took the whole 2 s to get here.
    if code == 503 {
        assert!(body.contains("waiting for pool app"), "{body}");
    }
    let body = until_ready(&weir, Duration::from_secs(15)).await;
    assert!(
        body.contains("warm-up timed out after 2s: pool app never answered"),
        "{body}"
    );
    let st = weir.status().await;
    assert_eq!(st["warm_up"]["phase"], "timed_out", "{st}");
    assert_eq!(
        st["warm_up"]["never_answered"],
        serde_json::json!(["pool app"])
    );
    let m = weir.metrics().await;
    assert_metric(&m, "weir_warmup_timeouts_total", 1.0);
    assert_metric(&m, "weir_warmup_waiting", 0.0);
    let log = weir.stderr();
    assert!(
        log.contains("warm-up timed out") && log.contains("ERROR"),
        "{log}"
    );
}

/// In an in-place upgrade the new process does not tell the old one to stop
/// while its pools do not answer: the old one keeps the sockets until the
/// app is back, then the hand-over completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_hands_over_only_once_the_new_pools_answer() {
    // Upgraded processes outlive their parents: reap them here.
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).unwrap();
    let api = ok_upstream().await;
    let app = Upstream::start().await;
    let app_addr = app.addr;
    let mut weir = Weir::builder()
        .config(warm_up_config(app_addr, api.addr(), "60s"))
        .start()
        .await
        .unwrap();
    until_ready(&weir, Duration::from_secs(15)).await;
    let old = weir.pid();

    drop(app);
    // The app's port is closed once nothing accepts on it.
    assert_eventually_async!(
        tokio::net::TcpStream::connect(app_addr).await.is_err(),
        "app still up"
    );
    let answered = || weir.stderr().matches("warm-up: answered").count();
    let answered_before = answered();
    weir.signal(Signal::Usr2).unwrap();
    assert_eventually_async!(
        weir.stderr().contains("upgrade: started the new process"),
        "{}",
        weir.stderr()
    );
    // The new process has probed: the API answers it, the app does not.
    assert_eventually_async!(
        answered() > answered_before,
        "the new process never probed: {}",
        weir.stderr()
    );
    let pid_now = weir.reread_ready().unwrap().pid;
    assert_eq!(pid_now, old, "{}", weir.stderr());
    assert!(
        !weir.stderr().contains("the new process is serving"),
        "{}",
        weir.stderr()
    );
    assert!(Path::new(&format!("/proc/{old}")).exists());

    let _app = Upstream::start_on(app_addr).await;
    assert_eventually_async!(
        weir.reread_ready().is_ok_and(|r| r.pid != old),
        "no hand-over: {}",
        weir.stderr()
    );
    let new = weir.reread_ready().unwrap().pid;
    let log = weir.stderr();
    assert!(log.contains("warm-up: answered"), "{log}");
    assert!(!log.contains("upgrade failed"), "{log}");
    assert!(
        weir.wait_exit(Duration::from_secs(15))
            .await
            .unwrap()
            .success()
    );
    let r = HttpRequest::get("/x").send(weir.listener(0)).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    send_signal("weir", new, Signal::Kill).unwrap();
    // Reparented to this process when the old one exited: reap it.
    let pid = rustix::process::Pid::from_raw(new as i32).unwrap();
    assert_eventually_async!(
        !matches!(
            rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::NOHANG),
            Ok(None)
        ),
        "the new process outlived SIGKILL"
    );
}
