//! In-process fixtures for end-to-end tests of the proxy: weir started from a
//! TOML string, test upstreams, and HTTP clients bound to chosen loopback
//! source addresses. A test reads: start upstream, start weir, send, assert.

#![allow(dead_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use weir::config::{ProcessEnv, load_file};

use crate::support::WeirConfig;
use weir::server::Server;

pub type BoxBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

/// weir running in this process.
pub struct TestWeir {
    pub server: Option<Server>,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub dir: tempfile::TempDir,
    pub config_path: PathBuf,
}

impl TestWeir {
    /// Starts weir with `toml`; `{{dir}}` in it is replaced by a temp dir.
    /// Listeners and admin should use port 0. The access log goes to
    /// `{{dir}}/access.log` unless the config says otherwise.
    pub async fn start(toml: &str) -> TestWeir {
        let dir = tempfile::tempdir().unwrap();
        let mut text = toml.replace("{{dir}}", dir.path().to_str().unwrap());
        if !text.contains("[access_log]") {
            text.push_str(&format!(
                "\n[access_log]\ntarget = \"{}/access.log\"\n",
                dir.path().display()
            ));
        }
        if !text.contains("[admin]") {
            text.push_str("\n[admin]\naddress = \"127.0.0.1:0\"\n");
        }
        let config_path = dir.path().join("weir.toml");
        std::fs::write(&config_path, &text).unwrap();
        let loaded = load_file(&config_path, &ProcessEnv).unwrap_or_else(|e| panic!("{e}"));
        let server = Server::start(loaded, Some(config_path.clone()), Box::new(ProcessEnv))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        TestWeir {
            addr: server.listeners[0],
            admin: server.admin.unwrap(),
            server: Some(server),
            dir,
            config_path,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn server(&self) -> &Server {
        self.server.as_ref().unwrap()
    }

    /// The access log's lines as JSON, waiting until at least `n` are written.
    pub async fn access_log(&self, n: usize) -> Vec<serde_json::Value> {
        crate::support::json_lines(&self.dir.path().join("access.log"), n).await
    }

    /// The metrics exposition from the admin API.
    pub async fn metrics(&self) -> String {
        let (_, _, body) = get(self.admin, "/metrics", &[]).await;
        String::from_utf8(body).unwrap()
    }
}

impl Drop for TestWeir {
    fn drop(&mut self) {
        if let Some(s) = &self.server {
            s.abort();
        }
    }
}

/// The value of a metric line (exact name with labels), or 0 if absent.
pub fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            (name == series).then(|| value.parse().unwrap())
        })
        .unwrap_or(0.0)
}

/// A test upstream: echoes what it saw as headers, with a few special paths:
/// - `/bytes/N`: a streamed body of N bytes (in 64 KiB chunks);
/// - `/count`: reads the whole request body and answers its length;
/// - `/slow/MS`: answers after MS milliseconds;
/// - `/ws`: answers 101 and then echoes raw bytes (WebSocket stand-in).
pub struct Upstream {
    pub addr: SocketAddr,
    pub hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    pub async fn start() -> Upstream {
        Self::start_on("127.0.0.1:0".parse().unwrap()).await
    }

    pub async fn start_on(addr: SocketAddr) -> Upstream {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, peer)) = listener.accept().await else {
                    break;
                };
                let h = h.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        h.fetch_add(1, Ordering::Relaxed);
                        upstream_handle(req, peer)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .with_upgrades()
                        .await;
                });
            }
        });
        Upstream { addr, hits, task }
    }
}

async fn upstream_handle(
    mut req: Request<Incoming>,
    peer: SocketAddr,
) -> Result<Response<BoxBody>, Infallible> {
    let path = req.uri().path().to_string();
    if let Some(n) = path.strip_prefix("/bytes/") {
        let n: usize = n.parse().unwrap();
        let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
        let stream = futures_stream(n, chunk);
        return Ok(Response::new(BodyExt::boxed(StreamBody::new(stream))));
    }
    if let Some(ms) = path.strip_prefix("/slow/") {
        tokio::time::sleep(Duration::from_millis(ms.parse().unwrap())).await;
    }
    if path == "/ws" {
        let on = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(up) = on.await {
                let mut io = TokioIo::new(up);
                let mut buf = [0u8; 1024];
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        });
        let mut resp = Response::new(full(""));
        *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        resp.headers_mut()
            .insert("upgrade", "websocket".parse().unwrap());
        resp.headers_mut()
            .insert("connection", "upgrade".parse().unwrap());
        return Ok(resp);
    }
    let mut seen: HashMap<String, String> = HashMap::new();
    for (k, v) in req.headers() {
        let entry = seen.entry(k.as_str().to_string()).or_default();
        if !entry.is_empty() {
            entry.push_str(" | ");
        }
        entry.push_str(v.to_str().unwrap_or("<bin>"));
    }
    let method = req.method().to_string();
    let uri = req.uri().to_string();
    let mut body = req.into_body();
    let mut len = 0usize;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => len += f.data_ref().map_or(0, |d| d.len()),
            Err(_) => break,
        }
    }
    let doc = serde_json::json!({
        "method": method,
        "uri": uri,
        "headers": seen,
        "body_len": len,
        "peer": peer.to_string(),
    });
    let mut resp = Response::new(full(&doc.to_string()));
    resp.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    resp.headers_mut().insert("x-app", "echo".parse().unwrap());
    // A plain response's fields pass through weir as received; one with a
    // field its Connection names is parsed into a map. Both get tested.
    if !uri.contains("/plain/") {
        resp.headers_mut()
            .insert("connection", "keep-alive, x-upstream-hop".parse().unwrap());
        resp.headers_mut()
            .insert("x-upstream-hop", "secret".parse().unwrap());
    }
    Ok(resp)
}

fn futures_stream(
    mut remaining: usize,
    chunk: Bytes,
) -> impl futures_core::Stream<Item = Result<Frame<Bytes>, std::io::Error>> + Send + Sync + 'static
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        while remaining > 0 {
            let n = remaining.min(chunk.len());
            if tx.send(Ok(Frame::data(chunk.slice(..n)))).await.is_err() {
                break;
            }
            remaining -= n;
        }
    });
    tokio_stream_from(rx)
}

/// The items a tokio channel receives, as a [`futures_core::Stream`] (for a
/// streamed body).
pub fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_core::Stream<Item = T> + Send + Sync + 'static {
    struct S<T>(tokio::sync::mpsc::Receiver<T>);
    impl<T> futures_core::Stream for S<T> {
        type Item = T;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<T>> {
            self.0.poll_recv(cx)
        }
    }
    let _ = &mut rx;
    S(rx)
}

pub fn full(s: &str) -> BoxBody {
    BodyExt::boxed(Full::new(Bytes::from(s.to_string())).map_err(|never| match never {}))
}

/// Opens a TCP connection from `source` (any 127.x.y.z) to `to`.
pub async fn connect_from(source: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source, 0))?;
    socket.connect(to).await
}

/// An HTTP/2 client connection over `io` (a TCP or TLS stream), the
/// connection driven by a task of its own.
pub async fn h2_over<T>(io: T) -> hyper::client::conn::http2::SendRequest<BoxBody>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .unwrap();
    tokio::spawn(conn);
    send
}

/// HTTP/2 with prior knowledge on a new TCP connection to `addr`.
pub async fn h2c(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<BoxBody> {
    h2_over(TcpStream::connect(addr).await.unwrap()).await
}

/// An HTTP/1.1 connection (hyper client) from a chosen source address.
pub struct H1 {
    pub sender: hyper::client::conn::http1::SendRequest<BoxBody>,
}

impl H1 {
    pub async fn connect(source: IpAddr, to: SocketAddr) -> std::io::Result<H1> {
        let stream = connect_from(source, to).await?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(conn.with_upgrades());
        Ok(H1 { sender })
    }

    /// An HTTP/1.1 connection from 127.0.0.1 to `to` (panics if it cannot
    /// connect).
    pub async fn local(to: SocketAddr) -> H1 {
        H1::connect(IpAddr::from([127, 0, 0, 1]), to).await.unwrap()
    }

    /// Sends a request; returns status, headers and the whole body.
    pub async fn send(
        &mut self,
        req: Request<BoxBody>,
    ) -> Result<(StatusCode, http::HeaderMap, Vec<u8>), hyper::Error> {
        self.sender.ready().await?;
        let resp = self.sender.send_request(req).await?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await?.to_bytes().to_vec();
        Ok((parts.status, parts.headers, body))
    }

    /// A GET of `path` with `Host: t` and no body; panics if the connection
    /// fails.
    pub async fn get(&mut self, path: &str) -> (StatusCode, http::HeaderMap, Vec<u8>) {
        self.send_to_t(Request::get(path), "").await
    }

    /// A POST of `body` to `path` with `Host: t`; panics if the connection
    /// fails.
    pub async fn post(&mut self, path: &str, body: &str) -> (StatusCode, http::HeaderMap, Vec<u8>) {
        self.send_to_t(Request::post(path), body).await
    }

    async fn send_to_t(
        &mut self,
        request: http::request::Builder,
        body: &str,
    ) -> (StatusCode, http::HeaderMap, Vec<u8>) {
        let request = request.header("host", "t").body(full(body)).unwrap();
        self.send(request).await.unwrap()
    }
}

/// A GET from 127.0.0.1 with extra headers, on a fresh connection.
pub async fn get(
    to: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, http::HeaderMap, Vec<u8>) {
    get_from("127.0.0.1".parse().unwrap(), to, path, headers).await
}

/// A GET from `source` with extra headers, on a fresh connection. `Host` is
/// `test.local` unless `headers` names one (two would be refused).
pub async fn get_from(
    source: IpAddr,
    to: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, http::HeaderMap, Vec<u8>) {
    let mut c = H1::connect(source, to).await.unwrap();
    let mut b = Request::get(path);
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        b = b.header("host", "test.local");
    }
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    c.send(b.body(full("")).unwrap()).await.unwrap()
}

/// Solves the challenge `page` (served to `source` with `user_agent`) as a
/// browser that keeps cookies does, natively (sending back the page's
/// [`JAR`]), and posts the answer; returns the status of the answer and
/// the `weir_pass=...` cookie it set (empty if none).
pub async fn solve_challenge(
    source: IpAddr,
    to: SocketAddr,
    page: &[u8],
    difficulty: u8,
    user_agent: &str,
) -> (StatusCode, http::HeaderMap, String) {
    let nonce = weir::challenge::page_nonce(page).expect("the page carries its challenge");
    let counter = weir::challenge::pow::solve(&nonce, difficulty);
    let form = weir::challenge::answer_form(&nonce, counter);
    let mut c = H1::connect(source, to).await.unwrap();
    let (status, h, _) = c
        .send(
            Request::post("/.weir/challenge/verify")
                .header("host", "t")
                .header("user-agent", user_agent)
                .header("cookie", jar(page))
                .header("content-type", "application/x-www-form-urlencoded")
                .body(full(&form))
                .unwrap(),
        )
        .await
        .unwrap();
    let cookie = h
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .unwrap_or("")
        .to_string();
    (status, h, cookie)
}

/// The headers of a browser navigation (what the challenge may ask for
/// proof).
pub const NAV: [(&str, &str); 3] = [
    ("accept", "text/html,application/xhtml+xml"),
    ("sec-fetch-mode", "navigate"),
    ("user-agent", "Mozilla/5.0 test"),
];

/// The cookie a challenge page sets (its probe), as a browser that keeps
/// cookies sends it back to the challenge's paths (without it, the pass
/// comes in the address instead).
pub fn jar(page: &[u8]) -> String {
    weir::challenge::page_probe(page).expect("the page carries its challenge")
}

/// The `<noscript>` refresh link of a challenge page, as a browser without
/// JavaScript follows it.
pub fn no_script_link(page: &[u8]) -> String {
    let html = String::from_utf8_lossy(page);
    let marker = "<meta http-equiv=\"refresh\" content=\"0; url=";
    let start = html.find(marker).unwrap_or_else(|| panic!("{html}")) + marker.len();
    html[start..start + html[start..].find('"').unwrap()].to_string()
}

/// [`NAV`]'s headers with a `Cookie` (a pass from [`solve_challenge`]).
pub fn nav_with_cookie(cookie: &str) -> Vec<(&'static str, &str)> {
    NAV.iter().copied().chain([("cookie", cookie)]).collect()
}

/// A simulated app (weir_lab's) with 2 workers answering in a few
/// milliseconds, on loopback: one that can be stalled.
pub fn small_sim_app() -> weir_lab::app::SimApp {
    two_worker_sim_app(0.01)
}

/// A simulated app (weir_lab's) with 2 workers, a backlog of 64 and its
/// times scaled by `time_scale`, on loopback.
pub fn two_worker_sim_app(time_scale: f64) -> weir_lab::app::SimApp {
    weir_lab::app::SimApp::start(
        weir_lab::app::AppConfig {
            workers: 2,
            backlog: 64,
            time_scale,
            ..Default::default()
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .unwrap()
}

/// The upstream's echo document.
pub fn echo(body: &[u8]) -> serde_json::Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|_| panic!("not an echo: {}", String::from_utf8_lossy(body)))
}

/// A client for HTTP/2 (prior knowledge) or any version over a given stream.
pub fn legacy_client()
-> hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, BoxBody> {
    hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http()
}

/// A minimal config: one listener, one pool with the given servers, then
/// `extra` (tables).
pub fn config(servers: &[SocketAddr], extra: &str) -> String {
    WeirConfig::servers(servers).then(extra).toml()
}

/// An [`Upstream`], and weir in front of it with [`config`] (one listener,
/// the pool `app` of that upstream) and `extra`.
pub async fn weir_in_front(extra: &str) -> (Upstream, TestWeir) {
    let up = Upstream::start().await;
    let weir = TestWeir::start(&config(&[up.addr], extra)).await;
    (up, weir)
}

/// An [`Upstream`], and weir in front of it on one TLS listener, its
/// self-signed certificate and key written to `dir`.
pub async fn weir_on_tls(dir: &std::path::Path) -> (Upstream, TestWeir) {
    let up = Upstream::start().await;
    let (cert, key) = crate::support::tls::tls_files(dir);
    let tls = format!("tls = {{ cert = \"{cert}\", key = \"{key}\" }}");
    let weir = TestWeir::start(&WeirConfig::new(up.addr).listener_keys(&tls).toml()).await;
    (up, weir)
}

/// The value of `series` in `metrics` (an exposition) is `expected`.
#[track_caller]
pub fn assert_metric(metrics: &str, series: &str, expected: f64) {
    assert_eq!(metric(metrics, series), expected, "{series} in:\n{metrics}");
}

/// Sends 30 searches (`/w/index.php?search=qN`), each followed by three
/// pages (`/wiki/PageN`), one at a time to `addr`; each is served (200).
pub async fn searches_then_pages(addr: SocketAddr) {
    for i in 0..30u8 {
        let (s, _, _) = get(addr, &format!("/w/index.php?search=q{i}"), &[]).await;
        assert_eq!(s, 200);
        for _ in 0..3 {
            let (s, _, _) = get(addr, &format!("/wiki/Page{i}"), &[]).await;
            assert_eq!(s, 200);
        }
    }
}

/// What signs `weir_session` cookies with `key`, as weir checks them.
pub fn session_signer(key: &str) -> weir::identity::session::SignedCookie {
    use weir::identity::session::{SignedCookie, SigningKeys};
    SignedCookie::new("weir_session", SigningKeys::new(&[key]).unwrap())
}

/// An hour from now, in seconds since the Unix epoch (a session's expiry).
pub fn an_hour_from_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600
}

/// The value of `series` in `metrics` (an exposition) is at least `least`.
#[track_caller]
pub fn assert_metric_at_least(metrics: &str, series: &str, least: f64) {
    assert!(
        metric(metrics, series) >= least,
        "{series} below {least} in:\n{metrics}"
    );
}

/// Percent-encodes everything but RFC 3986's unreserved characters (a form
/// value, a query parameter).
pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Stalls the app, then sends a request from `from` and waits until it holds
/// the app's one admission slot; the handle gives its status once the app
/// resumes.
pub async fn stall_with_the_slot_held(
    app: &weir_lab::app::SimApp,
    weir: &TestWeir,
    from: IpAddr,
) -> tokio::task::JoinHandle<http::StatusCode> {
    app.stall();
    let addr = weir.addr;
    let holder = tokio::spawn(async move { get_from(from, addr, "/wiki/B", &[]).await.0 });
    assert_eventually_async!(
        metric(
            &weir.metrics().await,
            "weir_admission_in_flight{pool=\"app\"}",
        ) >= 1.0,
        "the slot was never taken"
    );
    holder
}

/// Resumes the stalled app: the request holding the slot is served; then
/// stops weir and the app.
pub async fn resume_and_stop(
    app: weir_lab::app::SimApp,
    weir: TestWeir,
    holder: tokio::task::JoinHandle<http::StatusCode>,
) {
    app.unstall();
    assert_eq!(holder.await.unwrap(), 200);
    stop(app, weir).await;
}

/// Stops weir, then the app behind it (within 5 s).
pub async fn stop(app: weir_lab::app::SimApp, weir: TestWeir) {
    drop(weir);
    tokio::time::timeout(Duration::from_secs(5), app.shutdown())
        .await
        .unwrap();
}

/// The challenge key of [`pressure_site_with`]'s site.
pub const PRESSURE_KEY: &str = "challenge-key-for-tests-0123456789abcdef";

/// Requests waiting in every admission queue (every pool, every lane) of
/// `metrics`, weir's exposition.
pub fn queued(metrics: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("weir_admission_queued{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Requests waiting in `lane` of the pool `app`.
pub async fn waiting_in(weir: &TestWeir, lane: &str) -> f64 {
    let series = format!("weir_admission_queued{{pool=\"app\",lane=\"{lane}\"}}");
    metric(&weir.metrics().await, &series)
}

/// A 2-worker app behind weir with one admission slot, a class challenged
/// `under_pressure` (4 queued requests engage it at once), calm after
/// `disengage_after`; `page` adds lines to `[classes.page]` and `tables`
/// tables after the rest (the verified-bots tests' site).
pub async fn pressure_site_with(
    disengage_after: &str,
    page: &str,
    tables: &str,
) -> (weir_lab::app::SimApp, TestWeir) {
    let app = small_sim_app();
    let cfg = format!(
        r#"[[listeners]]
address = "127.0.0.1:0"
[pools.app]
servers = ["{}"]
[pools.app.admission]
max_in_flight = 1
workers = 2
queue_timeout = "20s"
[[routes]]
pool = "app"
class = "page"
[classes.page]
challenge = "under_pressure"
{page}
[challenge]
keys = ["{PRESSURE_KEY}"]
difficulty = 8
[challenge.pressure]
queue_depth = 4
engage_after = "0s"
disengage_after = "{disengage_after}"
{tables}
"#,
        app.addr()
    );
    (app, TestWeir::start(&cfg).await)
}

/// Stalls the app and queues 8 API requests (never challenged) in weir's
/// admission until they are waiting: the pressure. Their statuses, once
/// the app recovers.
pub async fn stall_and_queue(
    app: &weir_lab::app::SimApp,
    weir: &TestWeir,
) -> Vec<tokio::task::JoinHandle<http::StatusCode>> {
    app.stall();
    let mut waiting = Vec::new();
    for i in 0..8u8 {
        let addr = weir.addr;
        waiting.push(tokio::spawn(async move {
            get_from(
                format!("127.101.1.{}", i + 1).parse().unwrap(),
                addr,
                "/api/feed.json",
                &[],
            )
            .await
            .0
        }));
    }
    // A navigation sent before the pressure engages would itself wait in
    // the queue (until the app recovers).
    assert_eventually_async!(
        queued(&weir.metrics().await) >= 4.0,
        "requests never queued"
    );
    waiting
}
