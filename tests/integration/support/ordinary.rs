//! Ordinary traffic run through an operation on the weir binary (an
//! in-place upgrade, a restart): the configuration those tests share, the
//! upstreams they put behind it, the clients that send requests throughout
//! and count every one that failed, and what they read of weir meanwhile
//! (its admission limit, its worker processes).
//!
//! Does not: run the operation itself, or assert (the tests do, on
//! [`Counts`]).

use super::{HttpRequest, HttpUpstream, Weir, WeirConfig, connect_from};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustix::process::{Pid, Signal as RawSignal, WaitOptions};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub fn config(upstream: SocketAddr, drain: &str) -> String {
    WeirConfig::new(upstream)
        .then(format!(
            "[process]\nwatch_config = false\ndrain_timeout = \"{drain}\""
        ))
        .admin()
        .access_log_off()
        .route_with("default", "path_prefix = \"/limited\"")
        .route("open")
        .then(
            r#"# 5 an hour: once limited, a client stays limited for the whole test. (At
# 5 a minute one request came free every 12 s, and a run of restarts that
# took longer than that found the client "forgotten".)
[[classes.default.rules]]
name = "r"
limits = [{ per = "ip", rate = 5, window = "1h" }]
"#,
        )
        .toml()
}

/// weir started with [`config`] in front of `upstream`, draining for
/// `drain`.
pub async fn start_weir(upstream: &HttpUpstream, drain: &str) -> Weir {
    Weir::builder()
        .config(config(upstream.addr(), drain))
        .start()
        .await
        .unwrap()
}

/// An upstream that answers `/overloaded` with `503` (an app out of
/// room), everything else with `200`.
pub async fn overloaded_upstream() -> HttpUpstream {
    HttpUpstream::start(|req| {
        let mut resp = http::Response::new(Full::new(Bytes::from_static(b"busy\n")));
        if req.head.uri.path() == "/overloaded" {
            *resp.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
        }
        resp
    })
    .await
    .unwrap()
}

/// The value of `series` (name and labels) as weir at `admin` exports it now.
pub async fn metric_at(admin: SocketAddr, series: &str) -> f64 {
    let r = HttpRequest::get("/metrics").send(admin).await.unwrap();
    let text = String::from_utf8_lossy(&r.body).into_owned();
    crate::fixtures::metric(&text, series)
}

/// `weir_admission_limit{pool="app"}` as weir at `admin` exports it.
pub async fn admission_limit(admin: SocketAddr) -> f64 {
    metric_at(admin, "weir_admission_limit{pool=\"app\"}").await
}

/// Cuts the open admission limit of weir at `addr` (one request the app
/// answers `503`, overloaded: a drop cuts at once); returns the new limit.
pub async fn cut_admission_limit(addr: SocketAddr, admin: SocketAddr) -> f64 {
    let open = admission_limit(admin).await;
    assert_eq!(open, 10_000.0, "open before the app shows strain");
    let r = HttpRequest::get("/overloaded").send(addr).await.unwrap();
    assert_eq!(r.status, 503);
    let learned = admission_limit(admin).await;
    assert!(learned < 10.0, "a dropped request cuts at once: {learned}");
    learned
}

pub async fn ok_upstream() -> HttpUpstream {
    HttpUpstream::start(|req| {
        let body = format!("ok {}\n", req.body.len());
        http::Response::new(Full::new(Bytes::from(body)))
    })
    .await
    .unwrap()
}

pub fn pid(raw: u32) -> Pid {
    Pid::from_raw(raw as i32).unwrap()
}

/// Makes this test process the reaper of orphaned descendants.
pub fn become_subreaper() {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).unwrap();
}

/// How a weir generation ended, as far as this test can see.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// Reaped here (an orphan reparented to us): its exit code.
    Code(i32),
    /// Gone, reaped by its own parent (it ended before its parent did).
    ReapedByParent,
    /// Still there at the deadline (running, or a zombie nobody reaps).
    Lingering,
}

/// Waits for `raw` to exit and reaps it if it is ours (directly, or by
/// reparenting once its parent exited).
pub async fn reap(raw: u32, deadline: Duration) -> Ended {
    let start = Instant::now();
    while start.elapsed() < deadline {
        match rustix::process::waitpid(Some(pid(raw)), WaitOptions::NOHANG) {
            Ok(Some((_, status))) => return Ended::Code(status.exit_status().unwrap_or(-1)),
            Ok(None) => {}
            // Not our child: its parent is alive (then it is the parent's to
            // reap) or it is gone already.
            Err(_) => {
                if !Path::new(&format!("/proc/{raw}")).exists() {
                    return Ended::ReapedByParent;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ended::Lingering
}

/// Kills every weir generation (they share the first one's process group).
pub struct GroupGuard(pub u32);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process_group(pid(self.0), RawSignal::KILL);
    }
}

/// For a test that upgrades weir: this process becomes the generations'
/// subreaper ([`become_subreaper`]), weir starts in front of `upstream`
/// ([`start_weir`]), and the guard kills every generation when dropped.
pub async fn start_weir_to_upgrade(upstream: &HttpUpstream, drain: &str) -> (Weir, GroupGuard) {
    become_subreaper();
    let weir = start_weir(upstream, drain).await;
    let group = GroupGuard(weir.child_pid());
    (weir, group)
}

pub async fn wait_new_pid(weir: &mut Weir, old: u32, deadline: Duration) -> u32 {
    let start = Instant::now();
    loop {
        if let Ok(r) = weir.reread_ready()
            && r.pid != old
        {
            return r.pid;
        }
        assert!(
            start.elapsed() < deadline,
            "no new process within {deadline:?}\n{}",
            weir.stderr()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A listening socket on loopback as systemd holds one for socket
/// activation (it outlives the processes it is handed to), and its address.
pub fn activation_socket() -> (std::net::TcpListener, SocketAddr) {
    let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = socket.local_addr().unwrap();
    (socket, addr)
}

/// Sets `stop`, then waits (20 s each at most) until every load worker in
/// `load` has ended; a stuck one fails the test with the first errors in
/// `counts`.
pub async fn stop_load(load: Vec<tokio::task::JoinHandle<()>>, stop: &AtomicBool, counts: &Counts) {
    stop.store(true, Ordering::Relaxed);
    for task in load {
        let joined = tokio::time::timeout(Duration::from_secs(20), task).await;
        assert!(
            joined.is_ok(),
            "a load worker is stuck: {:?}",
            counts.errors.lock().unwrap()
        );
    }
}

#[derive(Default)]
pub struct Counts {
    pub ok: AtomicU64,
    pub failed: AtomicU64,
    pub refused: AtomicU64,
    /// Idempotent GETs resent because a kept-alive connection was closed by
    /// the server while idle (RFC 9112 §9.3.1: clients retry these).
    pub idle_close_retries: AtomicU64,
    pub uploads: AtomicU64,
    /// Fresh connections closed by a draining process before their request
    /// was read (see the assertion in the 100-upgrade test).
    pub fresh_closed: AtomicU64,
    pub errors: Mutex<Vec<String>>,
}

impl Counts {
    /// Waits until `n` requests have been answered well: the load is under
    /// way, so what an operation does next happens to traffic in flight.
    pub async fn under_way(&self, n: u64) {
        assert_eventually_async!(
            self.ok.load(Ordering::Relaxed) >= n,
            "the load answered {} of {n} requests, failed {}: {:?}",
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
            self.errors.lock().unwrap()
        );
    }

    pub fn fail(&self, what: String) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        let mut e = self.errors.lock().unwrap();
        if e.len() < 20 {
            e.push(what);
        }
    }
}

/// GETs on one kept-alive connection at a time, reconnecting when the server
/// closes it.
pub async fn keep_alive_worker(
    source: IpAddr,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    c: Arc<Counts>,
) {
    'connect: while !stop.load(Ordering::Relaxed) {
        let stream = match connect_from(source, addr).await {
            Ok(s) => s,
            Err(e) => {
                c.refused.fetch_add(1, Ordering::Relaxed);
                c.fail(format!("keep-alive connect: {e}"));
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok((mut sender, conn)) =
            hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream)).await
        else {
            c.fail("handshake".into());
            continue;
        };
        let conn = tokio::spawn(conn);
        let mut used = false;
        while !stop.load(Ordering::Relaxed) {
            let req = http::Request::get("/ka")
                .header("host", "weir")
                .body(Full::new(Bytes::new()))
                .unwrap();
            if sender.ready().await.is_err() {
                // Closed while idle, before anything was sent.
                conn.abort();
                continue 'connect;
            }
            match sender.send_request(req).await {
                Ok(resp) => {
                    let status = resp.status();
                    match resp.into_body().collect().await {
                        Ok(_) if status == 200 => {
                            c.ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(_) => c.fail(format!("keep-alive status {status}")),
                        Err(e) => c.fail(format!("keep-alive body: {e}")),
                    }
                    used = true;
                }
                Err(e) if used && (e.is_canceled() || e.is_incomplete_message()) => {
                    c.idle_close_retries.fetch_add(1, Ordering::Relaxed);
                    conn.abort();
                    continue 'connect;
                }
                Err(e) => {
                    c.fail(format!("keep-alive request: {e}"));
                    conn.abort();
                    continue 'connect;
                }
            }
        }
        conn.abort();
    }
}

/// One new connection per GET (`Connection: close`).
pub async fn new_connection_worker(
    worker: u8,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    c: Arc<Counts>,
) {
    let mut n: u32 = 0;
    while !stop.load(Ordering::Relaxed) {
        n = n.wrapping_add(1);
        let source = IpAddr::V4(Ipv4Addr::new(127, 51, worker, (n % 250) as u8 + 1));
        match HttpRequest::get("/new").from(source).send(addr).await {
            Ok(r) if r.status == 200 => {
                c.ok.fetch_add(1, Ordering::Relaxed);
            }
            Ok(r) => c.fail(format!("new-connection status {}", r.status)),
            Err(e) => {
                let text = e.to_string();
                if text.contains("reset by peer") || text.contains("raw: \"\"") {
                    c.fresh_closed.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                if text.contains("refused") {
                    c.refused.fetch_add(1, Ordering::Relaxed);
                }
                c.fail(format!("new connection: {text}"));
            }
        }
    }
}

/// Sends a `size`-byte body in `chunks` pieces over about `over`, then reads
/// the response; true on a 200 that saw the whole body.
pub async fn slow_upload(
    source: IpAddr,
    addr: SocketAddr,
    size: usize,
    chunks: usize,
    over: Duration,
) -> Result<(), String> {
    let mut s = connect_from(source, addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let head = format!(
        "POST /upload HTTP/1.1\r\nhost: weir\r\ncontent-length: {size}\r\nconnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes())
        .await
        .map_err(|e| format!("head: {e}"))?;
    let piece = vec![b'u'; size / chunks];
    for _ in 0..chunks {
        s.write_all(&piece)
            .await
            .map_err(|e| format!("body: {e}"))?;
        tokio::time::sleep(over / chunks as u32).await;
    }
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut raw))
        .await
        .map_err(|_| "response timed out".to_string())?
        .map_err(|e| format!("response: {e}"))?;
    let text = String::from_utf8_lossy(&raw);
    if text.starts_with("HTTP/1.1 200") && text.contains(&format!("ok {size}")) {
        Ok(())
    } else {
        Err(format!("bad upload response: {:.200}", text))
    }
}

pub async fn upload_worker(worker: u8, addr: SocketAddr, stop: Arc<AtomicBool>, c: Arc<Counts>) {
    while !stop.load(Ordering::Relaxed) {
        let source = IpAddr::V4(Ipv4Addr::new(127, 52, 0, worker));
        match slow_upload(source, addr, 256 * 1024, 16, Duration::from_millis(800)).await {
            Ok(()) => {
                c.uploads.fetch_add(1, Ordering::Relaxed);
                c.ok.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => c.fail(format!("upload: {e}")),
        }
    }
}

/// `keep_alive` kept-alive GET workers from 127.`net`.0.x and `fresh`
/// one-request-per-connection workers: the GET load of the upgrade and
/// restart tests.
pub fn get_workers(
    addr: SocketAddr,
    net: u8,
    keep_alive: u8,
    fresh: u8,
    stop: &Arc<AtomicBool>,
    counts: &Arc<Counts>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut load = Vec::new();
    for i in 0..keep_alive {
        let source = IpAddr::V4(Ipv4Addr::new(127, net, 0, i + 1));
        load.push(tokio::spawn(keep_alive_worker(
            source,
            addr,
            stop.clone(),
            counts.clone(),
        )));
    }
    for i in 0..fresh {
        load.push(tokio::spawn(new_connection_worker(
            i,
            addr,
            stop.clone(),
            counts.clone(),
        )));
    }
    load
}

/// Status of one GET /limited from the dedicated limited client.
pub async fn limited_client(addr: SocketAddr) -> u16 {
    HttpRequest::get("/limited")
        .from([127, 9, 9, 9])
        .send(addr)
        .await
        .map(|r| r.status)
        .unwrap_or(0)
}
