//! weir does no harm (issue 35): with a listener and a pool only, ordinary
//! traffic through weir fails nothing that the app alone would serve, in
//! steady state and through every operation.
//!
//! What each test proves:
//! - `a_slow_upload_is_the_clients_time_not_the_apps`: the admission limit
//!   and the pool's health read the app's time from the request sent whole
//!   to its answer, not an upload's pace; the limit stays open.
//! - `a_slow_reader_does_not_hold_an_admission_slot`: a download read slowly
//!   gives its slot back once the app's answer begins; with one slot, a
//!   page behind it is served at once, not after the download.
//! - `an_upload_slower_than_the_response_timeout_is_answered`: the response
//!   timeout counts from the request sent whole (it had cut uploads slower
//!   than it into 504s).
//! - `a_reload_that_changes_admission_keeps_what_it_learned`: a reload that
//!   changes the pool's admission settings keeps its learned limit and shapes.
//! - `ordinary_traffic_*`: the lab's ordinary mix (pages, slow pages, paced
//!   uploads, slow downloads, long polls, server-sent events, WebSockets,
//!   HTTP/2 streams) against the app itself and through the weir binary under
//!   each operation, a short version of `weir harm` (docs/operations.md has
//!   the full table next to nginx).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use weir_lab::ordinary::app::{OrdinaryApp, OrdinaryAppConfig};
use weir_lab::ordinary::front::{FrontKind, Operation};
use weir_lab::ordinary::run::{Plan, Row, run, table};

use crate::fixtures::*;

fn ordinary_app() -> OrdinaryApp {
    OrdinaryApp::start(OrdinaryAppConfig::default(), "127.0.0.1:0".parse().unwrap()).unwrap()
}

/// A listener and the pool `app` of `app`, then `extra` (tables).
fn zero_config(app: SocketAddr, extra: &str) -> String {
    config(&[app], extra)
}

fn source(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 35, 0, n))
}

type UploadBody = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

/// POSTs `bytes` to `/upload` in 64 KB pieces spread over `over`; returns
/// the status and what the app said it read.
async fn paced_upload(to: SocketAddr, from: IpAddr, bytes: u64, over: Duration) -> (u16, String) {
    let stream = connect_from(from, to).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, UploadBody>(TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let pieces = bytes.div_ceil(64 * 1024);
    let gap = over / pieces as u32;
    let paced = futures_util::stream::unfold(0u64, move |sent| async move {
        if sent >= bytes {
            return None;
        }
        if sent > 0 {
            tokio::time::sleep(gap).await;
        }
        let n = (bytes - sent).min(64 * 1024);
        let frame = http_body::Frame::data(Bytes::from(vec![b'u'; n as usize]));
        Some((Ok(frame), sent + n))
    });
    let req = Request::post("/upload")
        .header("host", "app.test")
        .header("content-length", bytes)
        .body(BodyExt::boxed(http_body_util::StreamBody::new(paced)))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).trim().to_string())
}

fn admission_limit(metrics: &str) -> f64 {
    metric(metrics, "weir_admission_limit{pool=\"app\"}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upload_is_the_clients_time_not_the_apps() {
    let app = ordinary_app();
    let weir = TestWeir::start(&zero_config(app.addr(), "")).await;
    // Pages at about 100 a second beside two uploads of 1 MB sent over 2.5
    // s: every window of the adaptive limit holds a few pages and, before,
    // an upload's 2.5 s "latency" that read as congestion.
    let pages = tokio::spawn({
        let addr = weir.addr;
        async move {
            let mut c = H1::connect(source(1), addr).await.unwrap();
            for i in 0..400 {
                let req = Request::get(format!("/page/{i}"))
                    .header("host", "app.test")
                    .body(full(""))
                    .unwrap();
                let (status, _, _) = c.send(req).await.unwrap();
                assert_eq!(status, StatusCode::OK);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    });
    let uploads: Vec<_> = (0..2u8)
        .map(|i| {
            tokio::spawn(paced_upload(
                weir.addr,
                source(10 + i),
                1 << 20,
                Duration::from_millis(2500),
            ))
        })
        .collect();
    for u in uploads {
        assert_eq!(u.await.unwrap(), (200, (1u64 << 20).to_string()));
    }
    pages.await.unwrap();
    let metrics = weir.metrics().await;
    assert_eq!(
        admission_limit(&metrics),
        10_000.0,
        "an upload's pace is not the app's congestion"
    );
    let log = weir.access_log(402).await;
    let uploads: Vec<f64> = log
        .iter()
        .filter(|l| l["path"] == "/upload")
        .map(|l| l["upstream_ms"].as_f64().unwrap())
        .collect();
    assert_eq!(uploads.len(), 2, "{log:?}");
    for ms in uploads {
        assert!(
            ms < 1000.0,
            "the app's time is from the body sent whole to its answer, not the upload: {ms} ms"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_does_not_hold_an_admission_slot() {
    let app = ordinary_app();
    let extra = "[pools.app.admission]\nmax_in_flight = 1\nqueue_timeout = \"5s\"\n";
    let weir = TestWeir::start(&zero_config(app.addr(), extra)).await;
    // A 32 MB download: its head is read, then nothing more for now, so
    // the body waits in the sockets and weir's response is far from done.
    let mut reader = H1::connect(source(1), weir.addr).await.unwrap();
    let req = Request::get("/download?bytes=33554432")
        .header("host", "app.test")
        .body(full(""))
        .unwrap();
    reader.sender.ready().await.unwrap();
    let resp = reader.sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    // With one slot, a page must not wait for the download to be read.
    let started = std::time::Instant::now();
    let (status, headers, _) = get_from(source(2), weir.addr, "/page/behind", &[]).await;
    let waited = started.elapsed();
    assert_eq!(
        status,
        StatusCode::OK,
        "{:?} after {waited:?}",
        headers.get("x-weir-reason")
    );
    assert!(waited < Duration::from_secs(2), "waited {waited:?}");
    drop(body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_slower_than_the_response_timeout_is_answered() {
    let app = ordinary_app();
    let extra = "response_timeout = \"1s\"\n";
    let weir = TestWeir::start(&zero_config(app.addr(), extra)).await;
    let (status, read) =
        paced_upload(weir.addr, source(1), 512 << 10, Duration::from_millis(2500)).await;
    assert_eq!((status, read.as_str()), (200, "524288"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_admission_keeps_what_it_learned() {
    use weir_lab::app::{AppConfig, ClassRule, ServiceTime, SimApp};
    // Two workers, a backlog of 8 (a burst of 120 overflows it), pages in
    // 2 ms and searches in 60.
    let app = SimApp::start(
        AppConfig {
            workers: 2,
            backlog: 8,
            default_service: ServiceTime::Fixed { ms: 2.0 },
            classes: vec![ClassRule {
                class: "expensive".into(),
                path_prefix: None,
                query_key: Some("search".into()),
                service: ServiceTime::Fixed { ms: 60.0 },
            }],
            health_service: ServiceTime::Fixed { ms: 1.0 },
            ..AppConfig::default()
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .unwrap();
    let cfg = |timeout: &str| {
        zero_config(
            app.addr(),
            &format!("[pools.app.admission]\nqueue_timeout = \"{timeout}\"\n"),
        )
    };
    let weir = TestWeir::start(&cfg("10s")).await;
    // What weir learns of the app: a cut limit (the app refuses a burst
    // beyond its backlog), and that its searches are expensive (a shape).
    let burst: Vec<_> = (0..120u8)
        .map(|i| {
            let addr = weir.addr;
            tokio::spawn(async move { get_from(source(i), addr, "/wiki/Burst", &[]).await.0 })
        })
        .collect();
    for b in burst {
        b.await.unwrap();
    }
    searches_then_pages(weir.addr).await;
    let shapes = |m: &str| metric(m, "weir_admission_expensive_shapes{pool=\"app\"}");
    let mut before: String;
    assert_eventually_async!(
        within = Duration::from_secs(2),
        {
            before = weir.metrics().await;
            shapes(&before) == 1.0
        },
        "searches learned expensive"
    );
    let limit = admission_limit(&before);
    assert!(limit < 10_000.0, "the burst cut the limit: {limit}");

    std::fs::write(&weir.config_path, cfg("5s")).unwrap();
    let outcome = weir.server().runtime.reload(false).unwrap();
    assert!(
        matches!(outcome, weir::runtime::ReloadOutcome::Applied { .. }),
        "{outcome:?}"
    );
    // A scrape exports the pools' gauges as they are now.
    let after = weir.metrics().await;
    assert_eq!(admission_limit(&after), limit, "the learned limit goes on");
    assert_eq!(shapes(&after), 1.0, "the learned shapes go on");
}

/// The weir binary the tests run, for the lab's runs.
fn plan() -> Plan {
    Plan::short(PathBuf::from(env!("CARGO_BIN_EXE_weir")))
}

/// Runs the short mix through weir under `op`, and against the app alone.
async fn ordinary(op: Operation) -> (Row, Row) {
    ordinary_by(&plan(), op).await
}

/// [`ordinary`] by `plan`.
async fn ordinary_by(plan: &Plan, op: Operation) -> (Row, Row) {
    weir_lab::ordinary::process::become_subreaper();
    let direct = run(plan, FrontKind::Direct, Operation::Steady)
        .await
        .unwrap();
    let weir = run(plan, FrontKind::Weir, op).await.unwrap();
    eprintln!("{}", table(&[direct.clone(), weir.clone()]));
    (direct, weir)
}

/// What the done-when asks of weir next to the app alone: nothing
/// failed where the app alone failed nothing (`allowed` per operation for a
/// plain stop/start), no upload cut, no answer weir made itself, and the
/// per-address limit kept through every operation.
fn assert_harmless(direct: &Row, weir: &Row, allowed: u64) {
    let (d, w) = (&direct.summary, &weir.summary);
    assert_eq!(d.failed, 0, "the app alone failed: {:?}", d.examples);
    assert!(
        d.sent > 500 && w.sent > 500,
        "traffic ran: {} / {}",
        d.sent,
        w.sent
    );
    assert!(w.uploads >= 3, "uploads ran: {}", w.uploads);
    assert!(
        w.failed <= allowed,
        "{} failed through weir ({}), at most {allowed}: {:?}",
        w.failed,
        weir.operation.name(),
        w.examples
    );
    assert_eq!(w.uploads_cut, 0, "uploads cut: {:?}", w.examples);
    assert_eq!(w.by_weir, 0, "answers weir made: {:?}", w.examples);
    if let Some((kept, checked)) = weir.limits_kept {
        assert_eq!(kept, checked, "the per-address limit was lost");
        assert_eq!(
            checked, weir.times,
            "the limit was checked after each operation"
        );
    }
}

/// For each of `operations` in turn: the ordinary mix against the app
/// alone and through weir ([`ordinary`]), and through weir nothing fails
/// ([`assert_harmless`] with none allowed).
async fn assert_no_failures_through(operations: &[Operation]) {
    for &op in operations {
        let (direct, weir) = ordinary(op).await;
        assert_harmless(&direct, &weir, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordinary_traffic_steady_and_through_reloads_fails_nothing() {
    assert_no_failures_through(&[Operation::Steady, Operation::Reload]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordinary_traffic_through_upgrades_fails_nothing() {
    assert_no_failures_through(&[Operation::Upgrade]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordinary_traffic_through_restarts_beside_and_on_an_activated_socket_fails_nothing() {
    assert_no_failures_through(&[Operation::ReusePortRestart, Operation::ActivatedRestart]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordinary_traffic_through_a_blue_green_switch_behind_nginx_fails_nothing() {
    assert_no_failures_through(&[Operation::BlueGreen]).await;
}

/// Three instances behind a round-robin nginx, sharing their limits
/// through a real Redis, restarted one by one as a Deployment's rollout
/// does: the balancer stops sending to one (readiness going false), it
/// drains and exits, the next generation starts on its port, the balancer
/// sends to it again, then the next instance. Nothing fails, no upload is
/// cut, weir answers nothing itself, and a client the fleet limited before
/// is limited after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordinary_traffic_through_a_rolling_restart_of_three_behind_nginx_fails_nothing() {
    let plan = Plan { times: 1, ..plan() };
    let (direct, weir) = ordinary_by(&plan, Operation::RollingRestart).await;
    assert_harmless(&direct, &weir, 0);
    assert_eq!(weir.start_ms.len(), 6, "three started, three restarted");
}

/// A plain stop/start (the next process starts once the old has exited):
/// the old keeps accepting while its earlier work finishes, so what fails
/// is only what the gap between the two refuses (a refused connection
/// carried no request; nginx's stop cuts every upload in flight instead).
/// Nothing is cut or answered by weir, and the limit is kept every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordinary_traffic_through_stop_starts_cuts_nothing_and_keeps_limits() {
    let (direct, weir) = ordinary(Operation::Restart).await;
    let w = &weir.summary;
    assert_harmless(&direct, &weir, u64::MAX);
    assert_eq!(
        w.failed, w.refused,
        "every failure a refused connection: {:?}",
        w.examples
    );
    assert!(
        weir.start_ms.iter().all(|&ms| ms < 1000),
        "start-up to listening: {:?} ms",
        weir.start_ms
    );
}

/// A stop as docker makes it (SIGTERM, SIGKILL 10 s later), then a start,
/// with weir's drain matched to it (`drain_timeout = "9s"`, as
/// docs/operations.md says): weir stops accepting early enough that what it
/// took in finishes before the kill, so no upload is cut and none is
/// killed; afterwards connection attempts wait for the next process
/// (new handshakes dropped, sent again by the client) instead of being
/// refused, so at most nginx's 11 a stop fail, each a refused connection.
/// Before, weir accepted until its earlier uploads were done and refused
/// everything after: 355 and 776 refused in two of the four stops,
/// and the kill cut an upload it had taken in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordinary_traffic_through_container_stops_cuts_no_upload_and_refuses_at_most_nginxs_11() {
    let (direct, weir) = ordinary(Operation::ContainerStop).await;
    let w = &weir.summary;
    assert_harmless(&direct, &weir, 11 * u64::from(weir.times));
    assert_eq!(
        w.failed, w.refused,
        "every failure a refused connection: {:?}",
        w.examples
    );
    assert_eq!(weir.killed, 0, "weir drained inside the grace");
}

/// A deploy of the app behind weir (every connection reset, the app down
/// for 300 ms, back as before): weir fails no more than the app alone
/// does through the same deploy, and makes no `503` of its own while its
/// limit comes back. (Requests that met no listener wait for the app and
/// are sent when it is back; reads it reset are sent again: in one run 9
/// failed through weir, 85 without it. Before, each such request was a
/// `502` at once: 109.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordinary_traffic_through_deploys_of_the_app_fails_no_more_than_without_weir() {
    weir_lab::ordinary::process::become_subreaper();
    let plan = plan();
    let direct = run(&plan, FrontKind::Direct, Operation::AppRestart)
        .await
        .unwrap();
    let weir = run(&plan, FrontKind::Weir, Operation::AppRestart)
        .await
        .unwrap();
    eprintln!("{}", table(&[direct.clone(), weir.clone()]));
    let (d, w) = (&direct.summary, &weir.summary);
    assert!(d.failed > 0, "the deploys cost the app alone something");
    assert!(
        w.failed <= d.failed,
        "weir {} failed, the app alone {}: {:?}",
        w.failed,
        d.failed,
        w.examples
    );
    assert_eq!(
        (w.weir_503, w.weir_429),
        (0, 0),
        "no refusal of weir's own: {:?}",
        w.examples
    );
}
