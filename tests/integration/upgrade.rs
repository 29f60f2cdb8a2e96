//! In-place upgrades and the process life cycle of the weir binary: 100
//! upgrades back to back under load with nothing refused or failed and
//! limits carried over, a failed upgrade that leaves the old process serving,
//! drain on SIGTERM, fast stop on a second signal or SIGQUIT, systemd socket
//! activation with `READY=1`, and the start-up budget with a dead upstream.
//!
//! Upgraded processes are children of their predecessors, which exit: this
//! test binary makes itself a child subreaper so it inherits and reaps them
//! (and can read their exit status) instead of leaving zombies to PID 1.

use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::ordinary::*;
use crate::support::ports::unused_addr;
use crate::support::process::send_signal;
use crate::support::{HttpRequest, Signal, Weir, connect_from};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_upgrades_under_load_refuse_nothing_and_keep_limits() {
    let up = ok_upstream().await;
    let (mut weir, _group) = start_weir_to_upgrade(&up, "10s").await;
    let addr = weir.listener(0);
    let first = weir.pid();

    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    let mut load = get_workers(addr, 50, 6, 3, &stop, &counts);
    for i in 0..2u8 {
        load.push(tokio::spawn(upload_worker(
            i + 1,
            addr,
            stop.clone(),
            counts.clone(),
        )));
    }
    // Steady state first, so the rate below is meaningful.
    counts.under_way(50).await;

    let started = Instant::now();
    let mut pids = vec![first];
    let mut upgrade_times = Vec::new();
    let mut limit_checks = 0;
    let mut reaped = vec![first];
    // WEIR_UPGRADES: fewer rounds while debugging.
    let rounds: usize = std::env::var("WEIR_UPGRADES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    for k in 0..rounds {
        let old = *pids.last().unwrap();
        let check_limit = k % 10 == 0;
        if check_limit {
            // Limited before: at most 5 requests pass in the window.
            let mut status = 0;
            for _ in 0..8 {
                status = limited_client(addr).await;
                if status == 429 {
                    break;
                }
            }
            assert_eq!(status, 429, "the dedicated client never got limited");
        }
        let t = Instant::now();
        send_signal("weir", old, Signal::Usr2).unwrap();
        let new = wait_new_pid(&mut weir, old, Duration::from_secs(15)).await;
        upgrade_times.push(t.elapsed());
        pids.push(new);
        if check_limit {
            // Only the new process accepts once the old one has exited.
            if old == first {
                assert!(
                    weir.wait_exit(Duration::from_secs(15))
                        .await
                        .unwrap()
                        .success()
                );
            } else {
                let code = reap(old, Duration::from_secs(15)).await;
                reaped.push(old);
                if code == Ended::Lingering || matches!(code, Ended::Code(c) if c != 0) {
                    let log = weir.stderr();
                    let tail: Vec<&str> = log.lines().rev().take(40).collect();
                    panic!("pid {old}: {code:?}\n{}", tail.join("\n"));
                }
            }
            assert_eq!(
                limited_client(addr).await,
                429,
                "upgrade {k}: limit forgotten"
            );
            limit_checks += 1;
        }
    }
    let upgrading = started.elapsed();
    stop_load(load, &stop, &counts).await;

    // Every generation but the last exits 0 (reaped here as orphans).
    let reaping = Instant::now();
    let mut codes = 0;
    for &old in &pids[1..pids.len() - 1] {
        if reaped.contains(&old) {
            continue;
        }
        match reap(old, Duration::from_secs(15)).await {
            Ended::Code(0) => codes += 1,
            Ended::ReapedByParent => {}
            other => panic!("pid {old}: {other:?}"),
        }
    }
    eprintln!(
        "all {} old generations gone in {:?} ({codes} reaped here with exit 0, the rest by their parent)",
        pids.len() - 2,
        reaping.elapsed()
    );
    let _ = weir.wait_exit(Duration::from_secs(1)).await;
    let last = *pids.last().unwrap();
    send_signal("weir", last, Signal::Term).unwrap();
    assert_eq!(reap(last, Duration::from_secs(15)).await, Ended::Code(0));

    let mut unique = pids.clone();
    unique.sort_unstable();
    unique.dedup();
    let ok = counts.ok.load(Ordering::Relaxed);
    let errors = counts.errors.lock().unwrap().clone();
    upgrade_times.sort();
    eprintln!(
        "{rounds} upgrades in {upgrading:?}: {ok} requests ok ({:.0}/s), {} uploads, {} failed, \
         {} refused, {} idle keep-alive closes retried, {} fresh connections closed unanswered; upgrade (SIGUSR2 -> new ready) \
         p50 {:?} p99 {:?} max {:?}",
        ok as f64 / (upgrading.as_secs_f64() + 0.5),
        counts.uploads.load(Ordering::Relaxed),
        counts.failed.load(Ordering::Relaxed),
        counts.refused.load(Ordering::Relaxed),
        counts.idle_close_retries.load(Ordering::Relaxed),
        counts.fresh_closed.load(Ordering::Relaxed),
        upgrade_times[upgrade_times.len() / 2],
        upgrade_times[upgrade_times.len() * 99 / 100],
        upgrade_times[upgrade_times.len() - 1],
    );
    assert_eq!(counts.refused.load(Ordering::Relaxed), 0, "{errors:?}");
    assert_eq!(counts.failed.load(Ordering::Relaxed), 0, "{errors:?}");
    // A connection the drain asks to close before its first request started
    // keeps it: the close waits for that request (edge/serve.rs).
    assert_eq!(counts.fresh_closed.load(Ordering::Relaxed), 0, "{errors:?}");
    assert_eq!(
        unique.len(),
        rounds + 1,
        "every upgrade made a new pid: {pids:?}"
    );
    assert_eq!(limit_checks, rounds.div_ceil(10));
    assert!(counts.uploads.load(Ordering::Relaxed) >= 4);
    let log = std::fs::read_to_string(weir.stderr_path()).unwrap();
    assert_eq!(
        log.matches("inherited 2 listeners and").count(),
        rounds,
        "each new process logs what it inherited"
    );
}

/// The new process `new` answers a request on `addr`; then it is killed
/// (the test is done with it).
async fn serves_then_kill(addr: std::net::SocketAddr, new: u32) {
    let r = HttpRequest::get("/x").send(addr).await.unwrap();
    assert_eq!(r.status, 200);
    send_signal("weir", new, Signal::Kill).unwrap();
}

/// The admission limit weir learned goes to the new process with the
/// sockets: an app the old process had cut to one request at a time (it
/// answered `503`, overloaded) does not meet a new process that starts open
/// and sends it everything at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_keeps_the_learned_admission_limit() {
    let up = overloaded_upstream().await;
    let (mut weir, _group) = start_weir_to_upgrade(&up, "5s").await;
    let (addr, old) = (weir.listener(0), weir.pid());
    let learned = cut_admission_limit(addr, weir.admin()).await;

    weir.signal(Signal::Usr2).unwrap();
    let new = wait_new_pid(&mut weir, old, Duration::from_secs(15)).await;
    assert_ne!(new, old);
    let now = admission_limit(weir.admin()).await;
    assert_eq!(now, learned, "{}", weir.stderr());
    serves_then_kill(addr, new).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_upgrade_leaves_the_old_process_serving() {
    let up = ok_upstream().await;
    let good = config(up.addr(), "5s");
    let mut weir = Weir::builder().config(&good).start().await.unwrap();
    let addr = weir.listener(0);
    let old = weir.pid();
    weir.write_config("[[listeners]]\naddress = \"nope\"\n")
        .unwrap();
    weir.signal(Signal::Usr2).unwrap();
    assert_eventually_async!(
        within = Duration::from_secs(15),
        weir.stderr().contains("the failed new process"),
        "{}",
        weir.stderr()
    );
    let log = weir.stderr();
    // The failure is named, and the child was waited for (no zombie): it
    // failed on the config, either before or after taking the sockets.
    assert!(
        log.contains("upgrade failed; this process keeps serving"),
        "{log}"
    );
    assert!(
        log.contains("the failed new process stopped") && log.contains("exit status: 2"),
        "{log}"
    );
    assert_eq!(weir.reread_ready().unwrap().pid, old);
    for _ in 0..5 {
        let r = HttpRequest::get("/x").send(addr).await.unwrap();
        assert_eq!(r.status, 200);
    }

    // With the config fixed, `weir upgrade` succeeds and says so.
    weir.write_config(&good).unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["upgrade", "-c"])
        .arg(weir.config_path())
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let new = wait_new_pid(&mut weir, old, Duration::from_secs(15)).await;
    assert!(text.contains(&format!("pid {new} is serving")), "{text}");
    assert!(
        weir.wait_exit(Duration::from_secs(10))
            .await
            .unwrap()
            .success()
    );
    serves_then_kill(addr, new).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_finishes_every_request_and_exits_0() {
    let up = ok_upstream().await;
    let mut weir = start_weir(&up, "20s").await;
    let addr = weir.listener(0);
    let mut uploads = Vec::new();
    for i in 0..6u8 {
        uploads.push(tokio::spawn(slow_upload(
            IpAddr::V4(Ipv4Addr::new(127, 53, 0, i + 1)),
            addr,
            128 * 1024,
            16,
            Duration::from_millis(1500),
        )));
    }
    assert_eventually_async!(
        metric_at(weir.admin(), "weir_upstream_in_flight{pool=\"app\"}").await >= 6.0,
        "the six uploads reached the app"
    );
    let t = Instant::now();
    weir.signal(Signal::Term).unwrap();
    for u in uploads {
        assert_eq!(u.await.unwrap(), Ok(()));
    }
    let status = weir.wait_exit(Duration::from_secs(10)).await.unwrap();
    assert!(status.success(), "{status}");
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(800),
        "exited before the uploads ended: {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_sigterm_or_sigquit_stops_a_drain_fast() {
    let up = ok_upstream().await;
    // (signals, in order)
    let cases: [&[Signal]; 2] = [&[Signal::Term, Signal::Term], &[Signal::Quit]];
    for signals in cases {
        let mut weir = start_weir(&up, "60s").await;
        let addr = weir.listener(0);
        // An upload that stalls: a drain alone would wait 60 s for it.
        let mut stalled = connect_from([127, 54, 0, 1].into(), addr).await.unwrap();
        stalled
            .write_all(b"POST /upload HTTP/1.1\r\nhost: weir\r\ncontent-length: 1000\r\n\r\nabc")
            .await
            .unwrap();
        assert_eventually_async!(
            metric_at(weir.admin(), "weir_upstream_in_flight{pool=\"app\"}").await >= 1.0,
            "the upload reached the app"
        );
        let t = Instant::now();
        for (i, s) in signals.iter().enumerate() {
            weir.signal(*s).unwrap();
            if i + 1 < signals.len() {
                // The next signal is the second only once the first began the drain.
                assert_eventually_async!(weir.stderr().contains("draining:"), "{}", weir.stderr());
            }
        }
        let status = weir.wait_exit(Duration::from_secs(5)).await.unwrap();
        assert!(status.success(), "{signals:?}: {status}");
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "{signals:?}: {:?}",
            t.elapsed()
        );
        let mut rest = Vec::new();
        let _ = stalled.read_to_end(&mut rest).await;
    }
}

/// Runs weir as systemd would: the listening socket as fd 3, `LISTEN_PID`
/// set to weir's own pid (the shell `exec`s it, keeping its pid), and a
/// notify socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_activation_and_ready_notification() {
    let up = ok_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let (listener, port) = activation_socket();
    let cfg =
        config(up.addr(), "5s").replace("127.0.0.1:0\"\n\n[pools", &format!("{port}\"\n\n[pools"));
    assert!(cfg.contains(&port.to_string()));
    let cfg_path = dir.path().join("weir.toml");
    std::fs::write(&cfg_path, cfg).unwrap();
    let notify_path = dir.path().join("notify.sock");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let ready_path = dir.path().join("ready.json");
    let mut child = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(r#"exec 3<&0 0</dev/null; LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" "$@""#)
        .arg(env!("CARGO_BIN_EXE_weir"))
        .args(["run", "-c"])
        .arg(&cfg_path)
        .arg("--ready-file")
        .arg(&ready_path)
        .arg("--upgrade-socket")
        .arg(dir.path().join("u.sock"))
        .env("NOTIFY_SOCKET", &notify_path)
        .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(
            listener,
        )))
        .stderr(std::fs::File::create(dir.path().join("stderr")).unwrap())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 512];
    let n = notify.recv(&mut buf).unwrap();
    let message = String::from_utf8_lossy(&buf[..n]).into_owned();
    let log = || std::fs::read_to_string(dir.path().join("stderr")).unwrap_or_default();
    assert!(message.contains("READY=1"), "{message}\n{}", log());
    assert!(
        message.contains(&format!("MAINPID={}", child.id())),
        "{message}"
    );
    let ready: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&ready_path).unwrap()).unwrap();
    assert_eq!(ready["listeners"][0], port.to_string());
    let r = HttpRequest::get("/x").send(port).await.unwrap();
    assert_eq!(r.status, 200);
    assert!(
        log().contains("socket activation: received listening sockets"),
        "{}",
        log()
    );

    send_signal("weir", child.id(), Signal::Term).unwrap();
    let n = notify.recv(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).contains("STOPPING=1"));
    assert!(child.wait().unwrap().success());
    let _ = std::io::stderr().flush();
}

/// weir serves within a second even when its only upstream is down: it
/// connects to upstreams per request, never at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_serving_within_a_second_with_an_unreachable_upstream() {
    let closed = unused_addr();
    let t = Instant::now();
    let weir = Weir::builder()
        .config(config(closed, "5s"))
        .start()
        .await
        .unwrap();
    let took = t.elapsed();
    eprintln!("spawn to ready file with an unreachable upstream: {took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    let r = HttpRequest::get("/x").send(weir.listener(0)).await.unwrap();
    assert!(r.status >= 500, "an answer, not a hang: {}", r.status);
    assert!(Path::new(weir.stderr_path()).exists());
}
