//! The access log for an operator (issue 20 item 3): the user agent and
//! referer a crawler triage needs, a request id the app and the client see
//! too, a file reopened on SIGUSR1 after logrotate moved it, and weir's own
//! log as JSON lines when `[log] format = "json"`.

use crate::support::{HttpRequest, HttpUpstream, Signal, Weir, WeirConfig, json_lines};

/// The `[access_log]` table writing to the file `log`.
fn access_log_to(log: &std::path::Path) -> String {
    format!("[access_log]\ntarget = \"{}\"\n", log.display())
}

/// weir in front of `upstream` with the admin endpoint, the access log
/// written to `log`, then `extra` (tables).
fn config(upstream: std::net::SocketAddr, log: &std::path::Path, extra: &str) -> String {
    WeirConfig::new(upstream)
        .admin()
        .then(access_log_to(log))
        .then(extra)
        .toml()
}

/// A weir in front of `upstream` logging to a file in a fresh directory:
/// the weir, the directory (kept alive by the caller) and the log's path.
async fn start(
    upstream: std::net::SocketAddr,
    extra: &str,
) -> (Weir, tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let weir = Weir::builder()
        .config(config(upstream, &log, extra))
        .start()
        .await
        .unwrap();
    (weir, dir, log)
}

#[tokio::test]
async fn user_agent_referer_and_one_request_id_for_log_app_and_client() {
    // The app answers with the request id it received.
    let app = HttpUpstream::start(|req| {
        let id = req
            .head
            .headers
            .get_all("x-request-id")
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect::<Vec<_>>()
            .join(",");
        http::Response::new(http_body_util::Full::new(id.into()))
    })
    .await
    .unwrap();
    let (weir, _dir, log) = start(app.addr(), "").await;
    let r = HttpRequest::get("/page")
        .header("user-agent", "Mozilla/5.0 (X11; Linux) \"quoted\"")
        .header("referer", "https://a.example/from")
        // Not a trusted proxy: its id is replaced, not kept.
        .header("x-request-id", "chosen-by-the-client")
        .send(weir.listener(0))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    let id = r
        .header("x-request-id")
        .expect("the answer carries the id")
        .to_string();
    assert_eq!(r.text(), id, "the app received the same single id");
    assert_ne!(id, "chosen-by-the-client");
    let line = &json_lines(&log, 1).await[0];
    assert_eq!(line["request_id"], id.as_str(), "{line}");
    assert_eq!(
        line["user_agent"], "Mozilla/5.0 (X11; Linux) \"quoted\"",
        "{line}"
    );
    assert_eq!(line["referer"], "https://a.example/from", "{line}");

    // A refusal weir makes itself carries one too.
    let refused = HttpRequest::get("/%00")
        .send(weir.listener(0))
        .await
        .unwrap();
    assert_eq!(refused.status, 400);
    let id = refused
        .header("x-request-id")
        .expect("refusals carry the id");
    let line = &json_lines(&log, 2).await[1];
    assert_eq!(line["request_id"], id, "{line}");
    assert_eq!(line["user_agent"], serde_json::Value::Null, "{line}");
}

#[tokio::test]
async fn a_trusted_proxys_request_id_is_kept() {
    let app = HttpUpstream::echo_headers().await.unwrap();
    let (weir, _dir, log) = start(
        app.addr(),
        "[identity]\ntrusted_proxies = [\"127.0.0.0/8\"]\n",
    )
    .await;
    let r = HttpRequest::get("/")
        .header("x-forwarded-for", "198.51.100.9")
        .header("x-request-id", "Root=1-5f84c7a9-ab12")
        .send(weir.listener(0))
        .await
        .unwrap();
    assert_eq!(r.header("x-request-id"), Some("Root=1-5f84c7a9-ab12"));
    assert!(
        r.text().contains("x-request-id: Root=1-5f84c7a9-ab12\n"),
        "{}",
        r.text()
    );
    assert_eq!(
        json_lines(&log, 1).await[0]["request_id"],
        "Root=1-5f84c7a9-ab12"
    );
}

#[tokio::test]
async fn sigusr1_reopens_the_access_log_after_rotation() {
    let app = HttpUpstream::echo_headers().await.unwrap();
    let (weir, dir, log) = start(app.addr(), "").await;
    let addr = weir.listener(0);
    let get = |path: &'static str| async move { HttpRequest::get(path).send(addr).await.unwrap() };
    get("/before").await;
    json_lines(&log, 1).await;
    // logrotate: move the file, then signal.
    let rotated = dir.path().join("access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    weir.signal(Signal::Usr1).unwrap();
    assert_eventually_async!(
        weir.stderr().contains("access log reopened"),
        "{}",
        weir.stderr()
    );
    get("/after").await;
    let fresh = json_lines(&log, 1).await;
    assert_eq!(fresh.len(), 1);
    assert_eq!(fresh[0]["path"], "/after");
    let old = std::fs::read_to_string(&rotated).unwrap();
    assert!(
        old.contains("\"/before\"") && !old.contains("/after"),
        "{old}"
    );
}

#[tokio::test]
async fn the_process_log_is_json_lines_when_configured() {
    let app = HttpUpstream::echo_headers().await.unwrap();
    let (weir, _dir, _log) = start(app.addr(), "[log]\nformat = \"json\"\n").await;
    let stderr = weir.stderr();
    let serving = stderr
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("each line is JSON"))
        .find(|v| v["fields"]["message"] == "weir is serving")
        .unwrap_or_else(|| panic!("no JSON 'weir is serving' line:\n{stderr}"));
    assert_eq!(serving["level"], "INFO", "{serving}");
    assert!(serving["timestamp"].is_string(), "{serving}");
}

/// One request over `tls` with hyper's HTTP/1 or HTTP/2 client, by what
/// ALPN chose; its status.
async fn tls_request(tls: tokio_rustls::client::TlsStream<tokio::net::TcpStream>) -> u16 {
    use http_body_util::Empty;
    let io = hyper_util::rt::TokioIo::new(tls);
    let h2 = io.inner().get_ref().1.alpn_protocol() == Some(b"h2");
    let req = http::Request::get("https://weir.test/secure")
        .header("host", "weir.test")
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = if h2 {
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                .await
                .unwrap();
        tokio::spawn(conn);
        send.send_request(req).await.unwrap()
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        send.send_request(req).await.unwrap()
    };
    resp.status().as_u16()
}

#[tokio::test]
async fn tls_version_and_alpn_are_logged() {
    let app = HttpUpstream::echo_headers().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = crate::support::tls::tls_files(dir.path());
    let log = dir.path().join("access.log");
    let weir = Weir::builder()
        .config(
            WeirConfig::new(app.addr())
                .tls_listener(&cert, &key)
                .then(access_log_to(&log)),
        )
        .start()
        .await
        .unwrap();
    let secure = weir.listener(1);
    for alpn in [&[&b"h2"[..]][..], &[b"http/1.1"], &[]] {
        let tls = crate::support::tls::tls_connect(secure, alpn).await;
        assert_eq!(tls_request(tls).await, 200);
    }
    // TLS 1.2, asked for by the client.
    let tls12 =
        crate::support::tls::tls_connect_with(secure, &[b"http/1.1"], &[&rustls::version::TLS12])
            .await;
    assert_eq!(tls_request(tls12).await, 200);
    let plain = HttpRequest::get("/").send(weir.listener(0)).await.unwrap();
    assert_eq!(plain.status, 200);

    let lines = json_lines(&log, 5).await;
    let seen: Vec<(String, &serde_json::Value, &serde_json::Value)> = lines
        .iter()
        .map(|l| (l["proto"].to_string(), &l["tls_version"], &l["alpn"]))
        .collect();
    let null = serde_json::Value::Null;
    let s = |v: &str| serde_json::Value::String(v.into());
    let want = [
        ("\"HTTP/2\"", s("TLSv1.3"), s("h2")),
        ("\"HTTP/1.1\"", s("TLSv1.3"), s("http/1.1")),
        ("\"HTTP/1.1\"", s("TLSv1.3"), null.clone()),
        ("\"HTTP/1.1\"", s("TLSv1.2"), s("http/1.1")),
        ("\"HTTP/1.1\"", null.clone(), null.clone()),
    ];
    for (got, want) in seen.iter().zip(&want) {
        assert_eq!(
            (got.0.as_str(), got.1, got.2),
            (want.0, &want.1, &want.2),
            "{lines:?}"
        );
    }
}
