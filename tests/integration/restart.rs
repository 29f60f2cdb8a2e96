//! Restarts that fail no request (issue 18): ten stop/start cycles under
//! keep-alive, new-connection and 2 MB upload load, counting every request
//! that did not get its 200, and a rate-limited client that must stay
//! limited across every cycle.
//!
//! - With `reuse_port = true` the next process starts beside the old one,
//!   then the old one is stopped: it closes its listening socket at once
//!   (after serving what its accept queue held), finishes its requests and
//!   writes its state, which the new one merges.
//! - With socket activation the test holds the listening socket as systemd
//!   does: the old process stops, the new one starts on the same socket, and
//!   connections made in between wait in its backlog instead of failing.
//!
//! The load workers and the limited client are the upgrade tests'.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::support::ordinary::{
    Counts, activation_socket, admission_limit, config, cut_admission_limit, get_workers,
    limited_client, metric_at, ok_upstream, overloaded_upstream, slow_upload, start_weir,
    stop_load,
};
use crate::support::process::send_signal;
use crate::support::{Signal, Weir};

const RESTARTS: usize = 10;

/// The upgrade tests' configuration on `listen`, with a snapshot file.
fn restart_config(upstream: SocketAddr, listen: &str, snapshot: &Path) -> String {
    let cfg = config(upstream, "10s").replace(
        "address = \"127.0.0.1:0\"\n\n[pools",
        &format!("address = \"{listen}\"\n\n[pools"),
    );
    assert!(cfg.contains(listen), "listener address replaced");
    format!(
        "{cfg}\n[state]\nsnapshot_file = \"{}\"\n",
        snapshot.display()
    )
}

/// Keep-alive GETs, one request per connection, and 2 MB uploads sent over
/// about a second (so a stop always finds some in flight).
fn start_load(
    addr: SocketAddr,
    stop: &Arc<AtomicBool>,
    counts: &Arc<Counts>,
) -> Vec<JoinHandle<()>> {
    let mut load = get_workers(addr, 60, 4, 2, stop, counts);
    for i in 0..2u8 {
        let (stop, c) = (stop.clone(), counts.clone());
        load.push(tokio::spawn(async move {
            let source = IpAddr::V4(Ipv4Addr::new(127, 61, 0, i + 1));
            while !stop.load(Ordering::Relaxed) {
                match slow_upload(source, addr, 2 << 20, 32, Duration::from_secs(1)).await {
                    Ok(()) => {
                        c.uploads.fetch_add(1, Ordering::Relaxed);
                        c.ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => c.fail(format!("upload: {e}")),
                }
            }
        }));
    }
    load
}

/// Makes the dedicated client limited (5 a minute) and checks it is.
async fn limit_the_client(addr: SocketAddr, when: &str) {
    let mut status = 0;
    for _ in 0..8 {
        status = limited_client(addr).await;
        if status == 429 {
            return;
        }
    }
    panic!("{when}: the dedicated client never got limited (last status {status})");
}

/// Requests that did not get their answer: errors and statuses, and fresh
/// connections closed unanswered (which the upgrade test tolerates and this
/// one does not).
fn failed(counts: &Counts) -> u64 {
    counts.failed.load(Ordering::Relaxed) + counts.fresh_closed.load(Ordering::Relaxed)
}

fn report(what: &str, counts: &Counts, took: Duration) {
    eprintln!(
        "{RESTARTS} {what} in {took:?}: {} requests ok ({:.0}/s), {} uploads of 2 MB, {} failed \
         ({} refused, {} fresh connections closed unanswered), {} idle keep-alive closes retried; \
         first errors: {:?}",
        counts.ok.load(Ordering::Relaxed),
        counts.ok.load(Ordering::Relaxed) as f64 / took.as_secs_f64(),
        counts.uploads.load(Ordering::Relaxed),
        failed(counts),
        counts.refused.load(Ordering::Relaxed),
        counts.fresh_closed.load(Ordering::Relaxed),
        counts.idle_close_retries.load(Ordering::Relaxed),
        counts.errors.lock().unwrap(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_restarts_beside_the_old_process_fail_at_most_one_request_each_and_keep_limits() {
    let up = ok_upstream().await;
    let state = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let cfg = restart_config(
        up.addr(),
        &port.to_string(),
        &state.path().join("limiter.snap"),
    )
    .replace("[pools", "reuse_port = true\n\n[pools");
    let start = || Weir::builder().config(cfg.clone()).start();
    let mut old = start().await.unwrap();
    assert_eq!(old.listener(0), port);

    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    let load = start_load(port, &stop, &counts);
    counts.under_way(20).await;
    let began = Instant::now();
    for k in 0..RESTARTS {
        limit_the_client(port, &format!("restart {k}, before")).await;
        let new = start().await.unwrap();
        assert_eq!(new.listener(0), port, "the new process shares the port");
        old.signal(Signal::Term).unwrap();
        let status = match old.wait_exit(Duration::from_secs(15)).await {
            Ok(status) => status,
            Err(e) => panic!("restart {k}: {e}\n{}", old.stderr()),
        };
        assert!(
            status.success(),
            "restart {k}: old process {status:?}\n{}",
            old.stderr()
        );
        // The old process's last state reaches the new one through the file
        // (looked at every 500 ms).
        assert_eventually_async!(
            new.stderr()
                .contains("merged limiter state another weir process wrote"),
            "restart {k}: nothing merged\n{}",
            new.stderr()
        );
        assert_eq!(
            limited_client(port).await,
            429,
            "restart {k}: limit forgotten"
        );
        old = new;
    }
    let took = began.elapsed();
    stop_load(load, &stop, &counts).await;
    report("restarts with reuse_port", &counts, took);
    assert!(
        counts.uploads.load(Ordering::Relaxed) >= RESTARTS as u64,
        "uploads ran"
    );
    assert!(
        failed(&counts) <= RESTARTS as u64,
        "more than one failed request per restart: {:?}",
        counts.errors.lock().unwrap()
    );
}

/// A weir started as systemd starts a socket-activated service: the
/// listening socket is descriptor 3, `LISTEN_FDS=1`, `LISTEN_PID` its pid.
struct Activated {
    child: std::process::Child,
    stderr: PathBuf,
}

impl Activated {
    async fn start(socket: &std::net::TcpListener, cfg: &Path, dir: &Path, k: usize) -> Activated {
        let ready = dir.join("ready.json");
        let _ = std::fs::remove_file(&ready);
        let stderr = dir.join(format!("stderr.{k}"));
        let child = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(r#"exec 3<&0 0</dev/null; LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" "$@""#)
            .arg(env!("CARGO_BIN_EXE_weir"))
            .args(["run", "-c"])
            .arg(cfg)
            .arg("--ready-file")
            .arg(&ready)
            .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(
                socket.try_clone().unwrap(),
            )))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        assert_eventually_async!(
            within = Duration::from_secs(15),
            ready.exists(),
            "generation {k} not ready\n{}",
            std::fs::read_to_string(&stderr).unwrap_or_default()
        );
        Activated { child, stderr }
    }

    async fn stop(mut self) -> std::process::ExitStatus {
        send_signal("weir", self.child.id(), Signal::Term).unwrap();
        let mut status: Option<std::process::ExitStatus>;
        assert_eventually_async!(
            within = Duration::from_secs(15),
            {
                status = self.child.try_wait().unwrap();
                status.is_some()
            },
            "still draining\n{}",
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        );
        status.unwrap()
    }
}

impl Drop for Activated {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_stop_starts_on_an_activated_socket_fail_nothing_and_keep_limits() {
    let up = ok_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    // What systemd holds for weir.socket: it outlives every process.
    let (socket, port) = activation_socket();
    let cfg_path = dir.path().join("weir.toml");
    let cfg = restart_config(
        up.addr(),
        &port.to_string(),
        &dir.path().join("limiter.snap"),
    );
    std::fs::write(&cfg_path, cfg).unwrap();
    let mut running = Activated::start(&socket, &cfg_path, dir.path(), 0).await;

    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    let load = start_load(port, &stop, &counts);
    counts.under_way(20).await;
    let began = Instant::now();
    for k in 1..=RESTARTS {
        limit_the_client(port, &format!("restart {k}, before")).await;
        // `systemctl restart`: stop, wait for the exit, start.
        let status = running.stop().await;
        assert!(status.success(), "restart {k}: {status:?}");
        running = Activated::start(&socket, &cfg_path, dir.path(), k).await;
        assert_eq!(
            limited_client(port).await,
            429,
            "restart {k}: limit forgotten"
        );
    }
    let took = began.elapsed();
    stop_load(load, &stop, &counts).await;
    report("stop/starts on an activated socket", &counts, took);
    assert!(
        counts.uploads.load(Ordering::Relaxed) >= RESTARTS as u64,
        "uploads ran"
    );
    assert_eq!(failed(&counts), 0, "{:?}", counts.errors.lock().unwrap());
    drop(running);
}

/// Issue 35: a plain stop (SIGTERM, no successor) keeps accepting while
/// the work it had at the signal finishes: a connection made during the
/// drain is served, with `Connection: close`, instead of refused (before,
/// the listener closed at the signal, and a stop/start refused every
/// connection for the whole drain). Once that work is done, it stops
/// accepting and exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_weir_serves_new_connections_until_its_earlier_work_is_done() {
    let up = ok_upstream().await;
    let mut weir = start_weir(&up, "20s").await;
    let addr = weir.listener(0);
    let source = IpAddr::V4(Ipv4Addr::new(127, 62, 0, 1));
    // Earlier work: an upload sent over 2.5 s, in flight at the signal.
    let upload = tokio::spawn(slow_upload(
        source,
        addr,
        1 << 20,
        32,
        Duration::from_millis(2500),
    ));
    assert_eventually_async!(
        metric_at(weir.admin(), "weir_upstream_in_flight{pool=\"app\"}").await >= 1.0,
        "the upload reached the app"
    );
    weir.signal(Signal::Term).unwrap();
    assert_eventually_async!(
        weir.stderr().contains("still accepting"),
        "{}",
        weir.stderr()
    );
    let during = crate::support::HttpRequest::get("/during-the-drain")
        .from([127, 62, 0, 2])
        .send(addr)
        .await;
    let during = during.expect("a connection during the drain is served, not refused");
    assert_eq!(during.status, 200);
    assert_eq!(during.header("connection"), Some("close"));
    upload
        .await
        .unwrap()
        .expect("the upload in flight is finished");
    let status = weir.wait_exit(Duration::from_secs(15)).await.unwrap();
    assert!(status.success(), "{status:?}");
    let logs = weir.stderr();
    assert!(
        logs.contains("still accepting") && logs.contains("stopped accepting"),
        "{logs}"
    );
}

/// Issue 20: the very first start (an empty state directory) warns once that
/// limits start from zero and logs no error; a snapshot missing from a
/// directory a weir has written to before is an error, as it was.
#[tokio::test]
async fn a_first_start_logs_no_error_and_lost_state_still_does() {
    let up = ok_upstream().await;
    let fresh = tempfile::tempdir().unwrap();
    let cfg = restart_config(up.addr(), "127.0.0.1:0", &fresh.path().join("limiter.snap"));
    let first = Weir::builder().config(cfg).start().await.unwrap();
    let logs = first.stderr();
    assert!(logs.contains("no limiter snapshot yet"), "{logs}");
    assert!(
        !logs.contains("ERROR"),
        "a first start logged an error:\n{logs}"
    );

    let used = tempfile::tempdir().unwrap();
    std::fs::write(used.path().join("limiter.snap.tmp"), b"half").unwrap();
    let cfg = restart_config(up.addr(), "127.0.0.1:0", &used.path().join("limiter.snap"));
    let lost = Weir::builder().config(cfg).start().await.unwrap();
    let logs = lost.stderr();
    assert!(
        logs.contains("ERROR") && logs.contains("expected limiter state"),
        "{logs}"
    );
}

/// A restart continues the admission limit the previous process learned
/// (written beside the snapshot, `<snapshot>.admission.json`), so a flood's
/// first burst after it does not meet a limit that starts open. A file older
/// than ten minutes is not continued: the app may have changed since.
#[tokio::test]
async fn a_restart_keeps_the_learned_admission_limit_unless_it_is_old() {
    let up = overloaded_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("limiter.snap");
    let cfg = restart_config(up.addr(), "127.0.0.1:0", &snapshot);
    let mut first = Weir::builder().config(cfg.clone()).start().await.unwrap();
    let learned = cut_admission_limit(first.listener(0), first.admin()).await;
    first.signal(Signal::Term).unwrap();
    let status = first.wait_exit(Duration::from_secs(15)).await.unwrap();
    assert!(status.success());
    let admission = dir.path().join("limiter.snap.admission.json");
    assert!(admission.exists(), "written beside the snapshot");

    let mut second = Weir::builder().config(cfg.clone()).start().await.unwrap();
    let continued = admission_limit(second.admin()).await;
    assert_eq!(continued, learned, "{}", second.stderr());
    second.signal(Signal::Term).unwrap();
    let status = second.wait_exit(Duration::from_secs(15)).await.unwrap();
    assert!(status.success());

    let long_ago = std::time::SystemTime::now() - Duration::from_secs(11 * 60);
    std::fs::File::options()
        .write(true)
        .open(&admission)
        .and_then(|f| f.set_modified(long_ago))
        .unwrap();
    let third = Weir::builder().config(cfg).start().await.unwrap();
    assert_eq!(admission_limit(third.admin()).await, 10_000.0);
    let logs = third.stderr();
    assert!(logs.contains("too old to continue"), "{logs}");
}
