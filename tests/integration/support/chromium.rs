//! Headless Chromium (Debian's, from scripts/install-test-deps.sh) for the
//! tests that need a real browser: a run that ends on its own (`--dump-dom`,
//! `--screenshot`) and its output, or a browser kept open and driven over
//! the DevTools protocol ([`DevTools`]: evaluate script, take a screenshot)
//! for pages that update live.
//!
//! Does not: install Chromium, or load anything but the loopback URLs a
//! test gives it (background networking is off).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use super::ports::find_program;
use super::process::{ServerProcess, temp_dir};

/// Upper bound on one Chromium run, start to exit. A solve at 16 bits takes
/// well under a second; the rest is browser start-up on a busy 2-core box.
const CHROMIUM_DEADLINE: Duration = Duration::from_secs(90);

/// One headless Chromium run in a fresh profile; killed and reaped on drop
/// (own process group, see support/process.rs).
pub struct Chromium {
    process: ServerProcess,
    _dir: tempfile::TempDir,
}

impl Chromium {
    /// Starts `chromium <standard flags> <extra> <url>`. Panics with a clear
    /// message when Chromium is not installed (CI installs it).
    pub fn run(extra: &[String], url: &str) -> Chromium {
        Chromium::run_with_preferences(extra, url, None)
    }

    /// [`Chromium::run`] in a profile that starts with these `Preferences`
    /// (what a person sets in the browser's settings, such as
    /// `{"profile": {"default_content_setting_values": {"cookies": 2}}}`
    /// for cookies blocked).
    pub fn run_with_preferences(
        extra: &[String],
        url: &str,
        preferences: Option<serde_json::Value>,
    ) -> Chromium {
        let program = find_program("chromium").unwrap_or_else(|e| {
            panic!("headless Chromium is required for the challenge tests: {e}")
        });
        let dir = temp_dir("chromium").expect("temp dir");
        if let Some(preferences) = preferences {
            let default = dir.path().join("profile").join("Default");
            std::fs::create_dir_all(&default).expect("profile dir");
            std::fs::write(default.join("Preferences"), preferences.to_string())
                .expect("write Preferences");
        }
        let mut cmd = Command::new(program);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
        ])
        .arg(format!(
            "--user-data-dir={}",
            dir.path().join("profile").display()
        ))
        .args(extra)
        .arg(url);
        let process =
            ServerProcess::spawn("chromium", cmd, dir.path(), vec![]).expect("spawn chromium");
        Chromium { process, _dir: dir }
    }

    /// Starts Chromium with the DevTools protocol on
    /// (`--remote-debugging-port=0`, for [`Chromium::devtools`]) showing
    /// `url` in a `window` (`"W,H"`).
    pub fn with_devtools(url: &str, window: &str) -> Chromium {
        Chromium::run(
            &[
                "--remote-debugging-port=0".to_string(),
                format!("--window-size={window}"),
            ],
            url,
        )
    }

    /// The DOM of `url` as Chromium renders it in a `window` (`"W,H"`): what
    /// a `--dump-dom` run prints.
    pub async fn dump_dom(url: &str, window: &str) -> String {
        Chromium::run(
            &["--dump-dom".to_string(), format!("--window-size={window}")],
            url,
        )
        .output()
        .await
    }

    /// Waits for Chromium to exit (bounded) and returns what it printed.
    pub async fn output(mut self) -> String {
        match self.process.wait_exit(CHROMIUM_DEADLINE).await {
            Ok(status) => assert!(
                status.success(),
                "chromium failed: {status}\n{}",
                self.process.logs()
            ),
            Err(e) => panic!("chromium did not finish: {e}\n{}", self.process.logs()),
        }
        self.process.stdout()
    }
}

/// Loads `url` in a `window` (`"W,H"`) and keeps a screenshot as `name` in
/// [`artifacts_dir`]; returns its path after checking it is a PNG of some
/// substance (a blank page is a few kilobytes).
pub async fn keep_screenshot(url: &str, window: &str, name: &str) -> PathBuf {
    let shot = artifacts_dir().join(name);
    let _ = std::fs::remove_file(&shot);
    let args = [
        format!("--screenshot={}", shot.display()),
        format!("--window-size={window}"),
    ];
    let logs = Chromium::run(&args, url).output().await;
    let png = std::fs::read(&shot)
        .unwrap_or_else(|e| panic!("no screenshot at {}: {e}\n{logs}", shot.display()));
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{} is not a PNG",
        shot.display()
    );
    assert!(
        png.len() > 10_000,
        "{} is suspiciously small",
        shot.display()
    );
    shot
}

pub fn artifacts_dir() -> PathBuf {
    let dir =
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("target/test-artifacts");
    std::fs::create_dir_all(&dir).expect("create target/test-artifacts");
    dir
}

impl Chromium {
    /// The DevTools endpoint of a browser started with
    /// `--remote-debugging-port=0`, once it has written it, connected to the
    /// first page (the URL it was started with).
    pub async fn devtools(&self) -> DevTools {
        let start = std::time::Instant::now();
        let addr = self.devtools_addr().await;
        let ws_url = loop {
            let page = devtools_json(addr, "GET", "/json/list")
                .await
                .and_then(|targets| {
                    targets
                        .as_array()?
                        .iter()
                        .find(|t| t["type"] == "page")
                        .and_then(|t| t["webSocketDebuggerUrl"].as_str().map(str::to_owned))
                });
            if let Some(url) = page {
                break url;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "chromium lists no page: {}",
                self.process.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        DevTools::connect(&ws_url).await
    }

    /// Opens `url` in a new tab (the browser must have been started with
    /// `--remote-debugging-port=0`) and connects to it. Headless Chromium
    /// takes one URL on its command line; more tabs come this way.
    pub async fn open_tab(&self, url: &str) -> DevTools {
        let addr = self.devtools_addr().await;
        let tab = devtools_json(addr, "PUT", &format!("/json/new?{url}"))
            .await
            .unwrap_or_else(|| panic!("chromium opened no tab: {}", self.process.logs()));
        let ws_url = tab["webSocketDebuggerUrl"]
            .as_str()
            .unwrap_or_else(|| panic!("a tab without a DevTools URL: {tab}"));
        DevTools::connect(ws_url).await
    }

    /// The DevTools HTTP endpoint, once Chromium has written its port.
    async fn devtools_addr(&self) -> std::net::SocketAddr {
        let port_file = self._dir.path().join("profile").join("DevToolsActivePort");
        let start = std::time::Instant::now();
        loop {
            if let Some(port) = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|t| t.lines().next().and_then(|l| l.trim().parse::<u16>().ok()))
            {
                return std::net::SocketAddr::from(([127, 0, 0, 1], port));
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "chromium wrote no DevToolsActivePort: {}",
                self.process.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// `method path` on the DevTools HTTP endpoint, its answer as JSON. By
/// hand: it keeps the connection open after its answer (even asked to
/// close), so a client that reads to the end waits forever; this one reads
/// `Content-Length`.
async fn devtools_json(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
) -> Option<serde_json::Value> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    let req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        let Some(end) = text.find("\r\n\r\n") else {
            continue;
        };
        let length: usize = text[..end].lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })?;
        if got.len() >= end + 4 + length {
            return serde_json::from_slice(&got[end + 4..end + 4 + length]).ok();
        }
    }
}

/// One page's DevTools protocol session.
pub struct DevTools {
    socket: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    next_id: u64,
}

impl DevTools {
    async fn connect(ws_url: &str) -> DevTools {
        let (socket, _) = tokio_tungstenite::connect_async(ws_url)
            .await
            .unwrap_or_else(|e| panic!("DevTools WebSocket {ws_url}: {e}"));
        DevTools { socket, next_id: 1 }
    }

    /// Sends `method` with `params`; returns its `result` (events that
    /// arrive meanwhile are skipped).
    pub async fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        match self.try_call(method, params).await {
            Ok(result) => result,
            Err(error) => panic!("{method}: {error}"),
        }
    }

    /// [`Self::call`], with the protocol's error as `Err` (an evaluation
    /// caught by a navigation answers "Inspected target navigated or
    /// closed": the page moved on, nothing is wrong).
    pub async fn try_call(
        &mut self,
        method: &str,
        params: serde_json::Value,
    ) -> Result<serde_json::Value, serde_json::Value> {
        let id = self.next_id;
        self.next_id += 1;
        let msg = serde_json::json!({"id": id, "method": method, "params": params});
        self.socket
            .send(Message::text(msg.to_string()))
            .await
            .expect("DevTools send");
        loop {
            let frame = tokio::time::timeout(Duration::from_secs(30), self.socket.next())
                .await
                .unwrap_or_else(|_| panic!("DevTools: no answer to {method}"))
                .expect("DevTools closed")
                .expect("DevTools read");
            let Message::Text(text) = frame else { continue };
            let v: serde_json::Value = serde_json::from_str(&text).expect("DevTools JSON");
            if v["id"] == id {
                return match v.get("error") {
                    Some(error) => Err(error.clone()),
                    None => Ok(v["result"].clone()),
                };
            }
        }
    }

    /// The value of a JavaScript expression in the page, or `None` when a
    /// navigation caught the evaluation (the expression itself may have
    /// navigated: `location.href = ...`).
    pub async fn eval_while_navigating(&mut self, expression: &str) -> Option<serde_json::Value> {
        let params = serde_json::json!({"expression": expression, "returnByValue": true});
        match self.try_call("Runtime.evaluate", params).await {
            Ok(r) => Some(r["result"]["value"].clone()),
            Err(e) if e.to_string().contains("navigated or closed") => None,
            Err(e) => panic!("Runtime.evaluate: {e}"),
        }
    }

    /// The value of a JavaScript expression in the page.
    pub async fn eval(&mut self, expression: &str) -> serde_json::Value {
        let r = self
            .call(
                "Runtime.evaluate",
                serde_json::json!({"expression": expression, "returnByValue": true}),
            )
            .await;
        r["result"]["value"].clone()
    }

    /// The page's body (its HTML) once it contains `what`, or as it is
    /// after `within`: the caller asserts, with what else it knows.
    pub async fn body_once_it_shows(&mut self, what: &str, within: Duration) -> String {
        let mut body = String::new();
        let shown = async {
            loop {
                // A navigation under way (a challenge answered) may catch
                // the evaluation: look again.
                if let Some(now) = self
                    .eval_while_navigating("document.body ? document.body.innerHTML : ''")
                    .await
                {
                    body = now.as_str().unwrap_or_default().to_owned();
                }
                if body.contains(what) {
                    return;
                }
                // A browser's page changes at its own pace; a check costs a round trip.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        let _ = tokio::time::timeout(within, shown).await;
        body
    }

    /// A PNG of the page as it is now.
    pub async fn screenshot(&mut self) -> Vec<u8> {
        let r = self
            .call(
                "Page.captureScreenshot",
                serde_json::json!({"format": "png"}),
            )
            .await;
        base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().expect("screenshot data"))
            .expect("screenshot base64")
    }
}
