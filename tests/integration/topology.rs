//! weir as a process in production topologies: behind a real nginx load
//! balancer (the setup PostHog never tested, incident 4), behind HAProxy with
//! PROXY protocol, holding 10,000 keep-alive connections, and stopped by
//! signals under load.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::fixtures::{Upstream, assert_metric_at_least};
use crate::support::nginx::load_balancer_http;
use crate::support::{Haproxy, HttpRequest, Nginx, Signal, Weir, WeirConfig};

/// nginx on `listen` balancing onto `weir`, passing the Host on.
fn lb_config(listen: SocketAddr, weir: SocketAddr) -> String {
    load_balancer_http(listen, "weir", weir, 16, "proxy_set_header Host $host;")
}

/// Starts the weir binary with `config`.
async fn start_weir(config: impl Into<String>) -> Weir {
    Weir::builder()
        .config(config)
        .start()
        .await
        .expect("weir starts")
}

/// The app behind weir, two requests a minute per client, with the admin
/// endpoint and `identity` (tables that say how weir finds the client).
fn weir_config(upstream: SocketAddr, identity: &str) -> String {
    WeirConfig::new(upstream)
        .admin()
        .then(identity)
        .route("api")
        .then(
            r#"[[classes.api.rules]]
name = "per-client"
limits = [{ per = "ip", rate = 2, window = "1m" }]
"#,
        )
        .toml()
}

/// The app, a weir with [`weir_config`] in front of it, and a real nginx
/// load balancer in front of weir.
async fn weir_behind_nginx(identity: &str) -> (Upstream, Weir, Nginx) {
    let app = Upstream::start().await;
    let weir = start_weir(weir_config(app.addr, identity)).await;
    let target = weir.listener(0);
    let nginx = Nginx::builder()
        .http(move |a| lb_config(a[0], target))
        .start()
        .await
        .expect("nginx starts");
    (app, weir, nginx)
}

async fn statuses_via(lb: SocketAddr, client: Ipv4Addr, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        let r = HttpRequest::get("/flags")
            .from(client)
            .send(lb)
            .await
            .expect("response via nginx");
        out.push(r.status);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_real_nginx_load_balancer_each_client_is_limited_alone() {
    let (_app, weir, nginx) =
        weir_behind_nginx("[identity]\ntrusted_proxies = [\"127.0.0.1/32\"]\n").await;
    let a = Ipv4Addr::new(127, 50, 0, 1);
    let b = Ipv4Addr::new(127, 50, 0, 2);
    assert_eq!(statuses_via(nginx.addr(0), a, 3).await, vec![200, 200, 429]);
    // The neighbour behind the same load balancer is a different client.
    assert_eq!(statuses_via(nginx.addr(0), b, 2).await, vec![200, 200]);
    // A spoofed X-Forwarded-For sent through nginx does not make a new client.
    let r = HttpRequest::get("/flags")
        .header("X-Forwarded-For", "198.51.100.1")
        .from(a)
        .send(nginx.addr(0))
        .await
        .unwrap();
    assert_eq!(r.status, 429, "{r}");
    // The access log is written within a few tens of milliseconds.
    assert_eventually_async!(
        weir.stdout().contains("\"client\":\"127.50.0.1\"")
            && weir.stdout().contains("\"peer\":\"127.0.0.1\""),
        "{}",
        weir.stdout()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_trusted_proxies_weir_says_so_instead_of_silently_limiting_the_balancer() {
    // The PostHog configuration: an IP limit, a load balancer in front, no
    // trusted proxies. Every client looks like the balancer...
    let (_app, weir, nginx) = weir_behind_nginx(
        "[identity]\ndominant_peer_min_requests = 4\ndominant_peer_window = \"1s\"\n",
    )
    .await;
    assert_eq!(
        statuses_via(nginx.addr(0), Ipv4Addr::new(127, 51, 0, 1), 2).await,
        vec![200, 200]
    );
    // ...so a different person is refused: the incident, reproduced.
    assert_eq!(
        statuses_via(nginx.addr(0), Ipv4Addr::new(127, 51, 0, 2), 1).await,
        vec![429]
    );
    // But weir counts and reports it: forwarding headers from an untrusted
    // peer, and one peer carrying all traffic (the window needs 4 requests;
    // the next window's first request closes it).
    statuses_via(nginx.addr(0), Ipv4Addr::new(127, 51, 0, 4), 2).await;
    // Time is the subject: the share is judged per one-second window, and
    // only a request after it ends closes it (no event says it ended).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    statuses_via(nginx.addr(0), Ipv4Addr::new(127, 51, 0, 3), 1).await;
    let m = weir.metrics().await;
    assert_metric_at_least(
        &m,
        "weir_forwarding_header_warnings_total{kind=\"untrusted_peer\"}",
        1.0,
    );
    assert!(
        m.contains("weir_forwarding_header_warnings_total{kind=\"dominant_peer\"} 1"),
        "{m}"
    );
    assert!(
        weir.stderr()
            .contains("one peer address sends most requests"),
        "{}",
        weir.stderr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_haproxy_with_proxy_protocol_v1_and_v2() {
    let app = Upstream::start().await;
    let cfg = WeirConfig::new(app.addr)
        .listener_keys("proxy_protocol = true")
        .admin()
        .then("[identity]\ntrusted_proxies = [\"127.0.0.1\"]\n")
        .toml();
    let weir = start_weir(cfg).await;
    let target = weir.listener(0);
    let haproxy = Haproxy::builder()
        .ports(2)
        .config(move |a| {
            format!(
                "defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n\
                 listen v1\n    bind {}\n    server w {target} send-proxy\n\
                 listen v2\n    bind {}\n    server w {target} send-proxy-v2\n",
                a[0], a[1]
            )
        })
        .start()
        .await
        .expect("haproxy starts");
    for (i, client) in [Ipv4Addr::new(127, 52, 0, 1), Ipv4Addr::new(127, 52, 0, 2)]
        .into_iter()
        .enumerate()
    {
        let r = HttpRequest::get("/pp")
            .from(client)
            .send(haproxy.addr(i))
            .await
            .expect("via haproxy");
        assert_eq!(r.status, 200, "{r}");
        assert!(
            r.text()
                .contains(&format!("\"x-forwarded-for\":\"{client}\"")),
            "{r}"
        );
    }
    assert_eventually_async!(
        {
            let log = weir.stdout();
            log.contains("\"client\":\"127.52.0.1\"") && log.contains("\"client\":\"127.52.0.2\"")
        },
        "{}",
        weir.stdout()
    );
    assert!(
        weir.stdout()
            .contains("\"client_source\":\"proxy_protocol\"")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_completes_every_in_flight_request_and_sighup_reloads() {
    let app = Upstream::start().await;
    let cfg = WeirConfig::new(app.addr).admin().access_log_off().toml();
    let mut weir = start_weir(cfg.clone()).await;
    // SIGHUP: a changed file is applied.
    weir.write_config(&cfg.replace("[access_log]", "[limits]\nmax_headers = 50\n[access_log]"))
        .unwrap();
    weir.signal(Signal::Hup).unwrap();
    assert_eventually_async!(
        weir.status().await["config_version"].as_u64().unwrap() == 2,
        "SIGHUP applies the changed file"
    );

    let addr = weir.listener(0);
    let mut inflight = Vec::new();
    for i in 0..40u8 {
        inflight.push(tokio::spawn(async move {
            HttpRequest::get(&format!("/slow/{}", 500 + u32::from(i) * 20))
                .from(IpAddr::V4(Ipv4Addr::new(127, 53, 0, i + 1)))
                .timeout(Duration::from_secs(30))
                .send(addr)
                .await
                .map(|r| r.status)
        }));
    }
    assert_eventually_async!(
        app.hits.load(Ordering::Relaxed) >= 40,
        "all 40 requests reached the app"
    );
    weir.signal(Signal::Term).unwrap();
    for r in inflight {
        assert_eq!(r.await.unwrap().expect("request completes"), 200);
    }
    let status = weir
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("weir exits");
    assert!(status.success(), "{status:?}");
}

/// Sends one keep-alive request on `s` and reads one small response.
async fn request_on(s: &mut tokio::net::TcpStream) -> std::io::Result<bool> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(b"GET /held HTTP/1.1\r\nHost: t\r\n\r\n")
        .await?;
    let mut buf = vec![0u8; 4096];
    let mut got = 0;
    // The echo body is small; read until the JSON closes.
    loop {
        let n = s.read(&mut buf[got..]).await?;
        if n == 0 {
            return Ok(false);
        }
        got += n;
        if buf[..got].ends_with(b"}") || got == buf.len() {
            return Ok(buf.starts_with(b"HTTP/1.1 200"));
        }
    }
}

fn rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .unwrap_or(0)
        / 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_ten_thousand_keep_alive_connections() {
    const CONNS: usize = 10_000;
    let app = Upstream::start().await;
    let cfg = WeirConfig::new(app.addr)
        .admin()
        .access_log_off()
        .then("[limits]\nmax_connections = 12000\nkeepalive_idle_timeout = \"5m\"\n")
        .toml();
    let weir = start_weir(cfg).await;
    let addr = weir.listener(0);
    let rss_before = rss_mib(weir.pid());
    // The clients live in this test process, weir in its own: each side needs
    // one descriptor per connection and the limit is 20,000 per process.
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(256));
    let mut tasks = Vec::with_capacity(CONNS);
    for i in 0..CONNS {
        let gate = gate.clone();
        tasks.push(tokio::spawn(async move {
            let _p = gate.acquire().await.unwrap();
            // 100 addresses x 100 connections: under the per-address cap.
            let src = Ipv4Addr::new(127, 60, (i / 100) as u8, (i % 100 + 1) as u8);
            let mut s = crate::support::connect_from(IpAddr::V4(src), addr)
                .await
                .ok()?;
            request_on(&mut s).await.ok()?.then_some(s)
        }));
    }
    let mut held = Vec::with_capacity(CONNS);
    for t in tasks {
        if let Some(s) = t.await.unwrap() {
            held.push(s);
        }
    }
    assert_eq!(
        held.len(),
        CONNS,
        "every connection was accepted and served"
    );
    let status = weir.status().await;
    assert!(
        status["connections"]["open"].as_u64().unwrap() >= CONNS as u64,
        "{status}"
    );
    // They are alive: a second request on a sample of them succeeds.
    for s in held.iter_mut().step_by(97) {
        assert!(
            request_on(s).await.unwrap(),
            "a held connection still serves"
        );
    }
    let m = weir.metrics().await;
    // The refusal series exist from the start (at 0); none may have counted.
    let refused: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("weir_connections_refused_total") && !l.ends_with(" 0"))
        .collect();
    assert!(refused.is_empty(), "{refused:?}");
    let rss = rss_mib(weir.pid());
    eprintln!("weir RSS: {rss_before} MiB idle, {rss} MiB holding {CONNS} keep-alive connections");
    drop(held);
}

/// Blue/green behind a real nginx, with the snapshot on a shared path: the
/// new generation refuses a client the old one limited from its first
/// request, and a client the old one limited after the new one started
/// (its last requests) too, once the old one has stopped (issue 18).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blue_green_behind_nginx_keeps_the_old_generations_limits() {
    let app = Upstream::start().await;
    let state = tempfile::tempdir().unwrap();
    let identity = format!(
        "[identity]\ntrusted_proxies = [\"127.0.0.0/8\"]\n[state]\nsnapshot_file = \"{}\"\n",
        state.path().join("limiter.snap").display()
    );
    let cfg = weir_config(app.addr, &identity);
    let merges = |w: &Weir| {
        w.stderr()
            .matches("merged limiter state another weir process wrote")
            .count()
    };
    let blue = Weir::builder()
        .config(cfg.clone())
        .start()
        .await
        .expect("blue starts");
    let blue_addr = blue.listener(0);
    let mut nginx = Nginx::builder()
        .http(move |a| lb_config(a[0], blue_addr))
        .start()
        .await
        .expect("nginx starts");
    let lb = nginx.addr(0);
    let early = Ipv4Addr::new(127, 50, 0, 9);
    let late = Ipv4Addr::new(127, 50, 0, 10);
    assert_eq!(statuses_via(lb, early, 3).await, vec![200, 200, 429]);

    // Green starts beside blue; blue answers its announcement with its state.
    let green = Weir::builder()
        .config(cfg)
        .start()
        .await
        .expect("green starts");
    assert_eventually_async!(
        merges(&green) >= 1,
        "green merged nothing\n{}",
        green.stderr()
    );
    assert!(
        blue.stderr()
            .contains("a newer weir generation shares the snapshot file"),
        "{}",
        blue.stderr()
    );
    // Blue still serves: this client is limited there after green started.
    assert_eq!(statuses_via(lb, late, 3).await, vec![200, 200, 429]);

    // The switch: green's first request for the early client is refused.
    let green_addr = green.listener(0);
    nginx
        .reload_http(move |a| lb_config(a[0], green_addr))
        .await
        .expect("nginx reloads");
    let before = merges(&green);
    blue.signal(Signal::Term).expect("stop blue");
    assert_eq!(
        statuses_via(lb, early, 1).await,
        vec![429],
        "green forgot blue's limit"
    );
    // Blue's last state (written when its drain starts and ends) reaches green.
    assert_eventually_async!(merges(&green) > before, "{}", green.stderr());
    assert_eq!(
        statuses_via(lb, late, 1).await,
        vec![429],
        "green forgot blue's last limit"
    );
    assert_eq!(
        statuses_via(lb, Ipv4Addr::new(127, 50, 0, 11), 1).await,
        vec![200]
    );
    assert_eventually_async!(
        green.stdout().contains("\"client\":\"127.50.0.9\"")
            && green.stdout().contains("\"status\":429"),
        "green did not answer: {}",
        green.stdout()
    );
}

/// Each worker thread of a `weir run` process (the main thread, whose
/// scheduler is the first worker, and those named `weir-worker`), with its
/// time on a CPU so far (`/proc/PID/task/TID/schedstat`).
fn worker_run_times(pid: u32) -> Vec<(String, u64)> {
    let mut threads = Vec::new();
    let mut tasks: Vec<_> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("tasks")
        .map(|t| t.expect("task").path())
        .collect();
    tasks.sort();
    for dir in tasks {
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let main = dir.file_name().and_then(|n| n.to_str()) == Some(&pid.to_string());
        if !main && comm.trim() != "weir-worker" {
            continue;
        }
        // Nanoseconds on a CPU: an idle worker sleeps in epoll_wait (the
        // read counts in `io` miss socket reads, which are not vfs reads).
        let schedstat = std::fs::read_to_string(dir.join("schedstat")).unwrap_or_default();
        let ran = schedstat
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        threads.push((dir.display().to_string(), ran));
    }
    threads
}

/// `process.workers = 2`: two threads, each with a scheduler of its own,
/// both accepting and serving connections (issue 21: tokio's multi-threaded
/// scheduler gave two workers a p99 nine times nginx's), and a drain that
/// ends cleanly with connections on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_each_accept_and_serve_connections() {
    let app = Upstream::start().await;
    let mut weir = start_weir(
        WeirConfig::new(app.addr)
            .admin()
            .route("page")
            .then("[process]\nworkers = 2\n"),
    )
    .await;
    let pid = weir.child_pid();
    let before = worker_run_times(pid);
    assert_eq!(before.len(), 2, "worker threads: {before:?}");
    // Connections one at a time, each with a few requests, until both
    // threads have read from one (the kernel wakes both accepting threads
    // and the quicker takes the connection), within a bound.
    let mut kept = Vec::new();
    for n in 0.. {
        let mut c = crate::support::KeepAliveClient::connect(
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            weir.listener(0),
        )
        .await
        .expect("connects");
        for _ in 0..3 {
            assert_eq!(c.get("/").await.expect("answered").status, 200);
        }
        kept.push(c);
        let grew = worker_run_times(pid)
            .iter()
            .zip(&before)
            .filter(|((_, now), (_, then))| now > then)
            .count();
        if grew == 2 {
            break;
        }
        assert!(
            n < 200,
            "one thread served all {n} connections: {:?}",
            worker_run_times(pid)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    weir.signal(Signal::Term).expect("SIGTERM");
    drop(kept);
    assert!(
        weir.wait_exit(Duration::from_secs(15))
            .await
            .expect("exits")
            .success(),
        "{}",
        weir.stderr()
    );
}
