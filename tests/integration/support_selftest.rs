//! Proves the fixtures work against the real servers, so a failing weir test
//! is about weir: nginx as a load balancer adding X-Forwarded-For and
//! reloading, HAProxy sending a PROXY v2 header, Redis answering PING, and the
//! weir guard's ready-file / signal / exit / early-failure contract (against a
//! stand-in script, independent of weir's own code).
//!
//! Does not: test weir's proxying; that lives in the area modules.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::nginx::load_balancer_http;
use crate::support::{
    FixtureError, Haproxy, HttpRequest, HttpUpstream, KeepAliveClient, Nginx, Redis, Signal, Weir,
};

const CLIENT: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 55);

/// nginx on `listen` balancing onto `upstream`.
fn load_balancer_config(listen: SocketAddr, upstream: SocketAddr) -> String {
    load_balancer_http(listen, "app", upstream, 8, "")
}

/// Sends SIGTERM to `weir` and waits (10 s at most) for it to exit;
/// `exits` says what it was expected to do.
async fn terminate(weir: &mut Weir, exits: &str) -> std::process::ExitStatus {
    weir.signal(Signal::Term).expect("send TERM");
    weir.wait_exit(Duration::from_secs(10)).await.expect(exits)
}

#[tokio::test]
async fn nginx_load_balancer_adds_client_address_to_x_forwarded_for() {
    let upstream = HttpUpstream::echo_headers().await.expect("upstream");
    let up = upstream.addr();
    let nginx = Nginx::builder()
        .http(move |addrs| load_balancer_config(addrs[0], up))
        .start()
        .await
        .expect("nginx starts");

    let resp = HttpRequest::get("/")
        .from(CLIENT)
        .send(nginx.addr(0))
        .await
        .expect("response via nginx");
    assert_eq!(resp.status, 200, "{resp}");
    assert!(
        resp.text().contains("x-forwarded-for: 127.0.0.55\n"),
        "{resp}"
    );

    // An incoming X-Forwarded-For is kept and the peer appended, as real load
    // balancers in front of weir do.
    let resp = HttpRequest::get("/")
        .header("X-Forwarded-For", "203.0.113.9")
        .from(CLIENT)
        .send(nginx.addr(0))
        .await
        .expect("response via nginx");
    assert!(
        resp.text()
            .contains("x-forwarded-for: 203.0.113.9, 127.0.0.55\n"),
        "{resp}"
    );

    // The keep-alive client reuses one connection for several requests.
    let mut client = KeepAliveClient::connect(IpAddr::V4(CLIENT), nginx.addr(0))
        .await
        .expect("keep-alive connect");
    for _ in 0..3 {
        let resp = client.get("/again").await.expect("keep-alive request");
        assert_eq!(resp.status, 200, "{resp}");
    }
    assert!(!client.is_closed());
    assert_eq!(upstream.requests(), 5);
    // nginx logs a request after answering it, so the last line may lag.
    assert_eventually_async!(
        nginx.access_log().lines().count() == 5,
        "{}",
        nginx.access_log()
    );
}

#[tokio::test]
async fn nginx_reload_applies_new_config_in_same_master() {
    let mut nginx = Nginx::builder()
        .http(|addrs| format!("server {{ listen {}; return 200 \"one\"; }}", addrs[0]))
        .start()
        .await
        .expect("nginx starts");
    let addr = nginx.addr(0);
    let master = nginx.pid();
    let resp = HttpRequest::get("/")
        .send(addr)
        .await
        .expect("first response");
    assert_eq!(resp.text(), "one");

    let old_workers = nginx.worker_pids();
    assert_eq!(old_workers.len(), 1, "{old_workers:?}");
    nginx
        .reload_http(|addrs| format!("server {{ listen {}; return 200 \"two\"; }}", addrs[0]))
        .await
        .expect("reload");
    // reload() returns once the old workers are gone, so no request can
    // reach the old config any more.
    for _ in 0..5 {
        let resp = HttpRequest::get("/")
            .send(addr)
            .await
            .expect("after reload");
        assert_eq!(resp.text(), "two");
    }
    assert_eq!(nginx.pid(), master);
    assert!(!nginx.worker_pids().contains(&old_workers[0]));

    // A config nginx rejects is reported and the running config stays.
    let err = nginx
        .reload_http(|_| "this is not nginx config".to_owned())
        .await
        .expect_err("bad config must be rejected");
    assert!(err.to_string().contains("rejected by nginx -t"), "{err}");
    let resp = HttpRequest::get("/")
        .send(addr)
        .await
        .expect("still serving");
    assert_eq!(resp.text(), "two");
}

/// The fixed 12-byte PROXY protocol v2 signature.
const PROXY_V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";

/// What the in-test backend saw: signature, version/command, family and the
/// source address from the v2 header, then the payload after it.
#[derive(Debug, PartialEq, Eq)]
struct ProxyV2Seen {
    signature_ok: bool,
    version_command: u8,
    family: u8,
    source: SocketAddr,
    payload: Vec<u8>,
}

async fn read_proxy_v2(mut stream: TcpStream) -> std::io::Result<ProxyV2Seen> {
    let mut fixed = [0u8; 16];
    stream.read_exact(&mut fixed).await?;
    let len = usize::from(u16::from_be_bytes([fixed[14], fixed[15]]));
    let mut addrs = vec![0u8; len];
    stream.read_exact(&mut addrs).await?;
    let mut payload = vec![0u8; 5];
    stream.read_exact(&mut payload).await?;
    // AF_INET: src addr (4), dst addr (4), src port (2), dst port (2).
    let source = match addrs.get(..12) {
        Some(a) => SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3])),
            u16::from_be_bytes([a[8], a[9]]),
        ),
        None => return Err(std::io::Error::other("address block too short")),
    };
    Ok(ProxyV2Seen {
        signature_ok: &fixed[..12] == PROXY_V2_SIGNATURE,
        version_command: fixed[12],
        family: fixed[13],
        source,
        payload,
    })
}

#[tokio::test]
async fn haproxy_sends_proxy_v2_header_with_client_address() {
    let backend = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("backend");
    let backend_addr = backend.local_addr().expect("backend addr");
    let seen = tokio::spawn(async move {
        // The fixture's readiness probe is a real connection that HAProxy
        // forwards (header, then EOF): skip connections that carry no payload.
        loop {
            let (stream, _) = backend.accept().await?;
            match read_proxy_v2(stream).await {
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => continue,
                result => return result,
            }
        }
    });
    let haproxy = Haproxy::builder()
        .config(move |addrs| {
            format!(
                "defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 30s\n    \
                 timeout server 30s\n\
                 listen edge\n    bind {}\n    server s1 {backend_addr} send-proxy-v2\n",
                addrs[0]
            )
        })
        .start()
        .await
        .expect("haproxy starts");

    let mut client = crate::support::connect_from(IpAddr::V4(CLIENT), haproxy.addr(0))
        .await
        .expect("connect to haproxy");
    let client_addr = client.local_addr().expect("client addr");
    client.write_all(b"hello").await.expect("send payload");

    let seen = tokio::time::timeout(Duration::from_secs(10), seen)
        .await
        .expect("backend saw a connection in time")
        .expect("backend task")
        .expect("valid PROXY v2 header");
    assert_eq!(
        seen,
        ProxyV2Seen {
            signature_ok: true,
            version_command: 0x21, // v2, PROXY
            family: 0x11,          // TCP over IPv4
            source: client_addr,
            payload: b"hello".to_vec(),
        },
        "haproxy logs:\n{}",
        haproxy.logs()
    );
}

#[tokio::test]
async fn redis_answers_ping_and_keeps_a_value() {
    let redis = Redis::builder().start().await.expect("redis starts");
    let mut stream = TcpStream::connect(redis.addr()).await.expect("connect");
    stream
        .write_all(b"*1\r\n$4\r\nPING\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n")
        .await
        .expect("send");
    let expected = b"+PONG\r\n+OK\r\n$1\r\nv\r\n";
    let mut got = vec![0u8; expected.len()];
    tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut got))
        .await
        .expect("reply in time")
        .expect("read reply");
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(expected)
    );
}

/// Writes an executable shell script into `dir` and returns its path.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}")).expect("write script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// Stands in for `weir run -c CFG --ready-file READY`: prints its config,
/// writes the ready file atomically, reports SIGHUP, exits 3 on SIGTERM.
const FAKE_WEIR: &str = r#"
[ "$1" = run ] && [ "$2" = -c ] && [ "$4" = --ready-file ] || { echo "bad args: $*" >&2; exit 64; }
trap 'echo got-hup' HUP
trap 'echo got-term; exit 3' TERM
cat "$3"
printf '{"listeners":["127.0.0.1:1001","127.0.0.1:1002"],"admin":"127.0.0.1:1003","pid":%d}' $$ > "$5.tmp"
mv "$5.tmp" "$5"
# `wait` (not a foreground sleep) returns at once when a trapped signal
# arrives, so the trap runs then rather than after the next child exits.
while true; do sleep 0.02 & wait $!; done
"#;

#[tokio::test]
async fn weir_fixture_reads_ready_file_signals_and_waits_for_exit() {
    let bin = tempfile::tempdir().expect("tempdir");
    let inner = script(bin.path(), "fake-weir-inner", FAKE_WEIR);
    // A shell cannot trap a signal it was started with ignored (POSIX), and
    // a test run under `nohup` starts everything with SIGHUP ignored: the
    // stand-in then never saw its HUP (CI run of 2026-12-02). Real weir
    // installs its handlers regardless; the stand-in gets default
    // dispositions back first.
    let program = script(
        bin.path(),
        "fake-weir",
        &format!(
            "exec env --default-signal=HUP,TERM /bin/sh {} \"$@\"\n",
            inner.display()
        ),
    );
    let mut weir = Weir::builder()
        .program(program)
        .config("# marker-config\n")
        .start()
        .await
        .expect("fake weir becomes ready");
    let addr = |s: &str| s.parse::<SocketAddr>().expect("literal address");
    assert_eq!(
        weir.listeners(),
        [addr("127.0.0.1:1001"), addr("127.0.0.1:1002")]
    );
    assert_eq!(weir.listener(1), addr("127.0.0.1:1002"));
    assert_eq!(weir.admin(), addr("127.0.0.1:1003"));
    assert_eq!(weir.pid(), weir.child_pid());
    assert_eventually_async!(
        weir.stdout().contains("# marker-config"),
        "{}",
        weir.stdout()
    );

    // The stand-in is another process: blocking between checks is fine here.
    // HUP is sent again each time it has not shown within a second: what
    // this checks is that signals reach the pid in the ready file, not the
    // shell's timing on a busy machine.
    let mut sent = std::time::Instant::now() - Duration::from_secs(1);
    assert_eventually!(
        {
            if sent.elapsed() >= Duration::from_secs(1) {
                weir.signal(Signal::Hup).expect("send HUP");
                sent = std::time::Instant::now();
            }
            weir.stdout().contains("got-hup")
        },
        "{}",
        weir.stdout()
    );
    let status = terminate(&mut weir, "exits").await;
    assert_eq!(status.code(), Some(3));
    assert!(weir.stdout().contains("got-term"));
}

#[tokio::test]
async fn weir_fixture_reports_early_exit_with_stderr() {
    let bin = tempfile::tempdir().expect("tempdir");
    let program = script(
        bin.path(),
        "failing-weir",
        "echo 'key pools.app: bad' >&2; exit 2\n",
    );
    let err = Weir::builder()
        .program(program)
        .start()
        .await
        .err()
        .expect("a process that exits is not ready");
    assert!(matches!(err, FixtureError::ExitedEarly { .. }), "{err}");
    assert!(err.to_string().contains("key pools.app: bad"), "{err}");
}

#[tokio::test]
async fn weir_fixture_times_out_without_ready_file() {
    let bin = tempfile::tempdir().expect("tempdir");
    let program = script(bin.path(), "silent-weir", "exec sleep 30\n");
    let err = Weir::builder()
        .program(program)
        .ready_deadline(Duration::from_millis(300))
        .start()
        .await
        .err()
        .expect("no ready file means not ready");
    assert!(matches!(err, FixtureError::NotReady { .. }), "{err}");
}

/// The real binary against the fixture's contract: bound, proxying, access log
/// on stdout, clean exit on SIGTERM.
#[tokio::test]
async fn weir_binary_runs_proxies_and_drains_on_term() {
    let upstream = HttpUpstream::echo_headers().await.expect("upstream");
    let mut weir = Weir::builder()
        .config(format!(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[admin]\naddress = \"127.0.0.1:0\"\n\n\
             [pools.app]\nservers = [\"{}\"]\n\n[[routes]]\npool = \"app\"\nclass = \"page\"\n",
            upstream.addr()
        ))
        .start()
        .await
        .expect("weir starts");
    assert_eq!(weir.pid(), weir.child_pid());
    let resp = HttpRequest::get("/")
        .from(Ipv4Addr::new(127, 0, 0, 66))
        .send(weir.listener(0))
        .await
        .expect("response via weir");
    assert_eq!(resp.status, 200, "{resp}\nstderr:\n{}", weir.stderr());
    assert!(resp.text().starts_with("peer: 127.0.0.1:"), "{resp}");
    assert_eq!(upstream.requests(), 1);
    assert_eventually!(
        weir.stdout().contains("127.0.0.66"),
        "access log: {}",
        weir.stdout()
    );

    let status = terminate(&mut weir, "drains and exits").await;
    assert!(status.success(), "{status}\nstderr:\n{}", weir.stderr());
}
