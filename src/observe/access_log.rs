//! The access log: one JSON line per request.
//!
//! Lines are formatted on the request's task and handed to a writer thread
//! through a bounded channel; the request path never waits on disk or a pipe.
//! When the channel is full the line is dropped and counted
//! (`weir_access_log_dropped_total`): a slow log must not become an outage.
//! Field names match metric labels (`class`, `rule`, `pool`).

use std::fs::OpenOptions;
use std::io::{self, BufWriter, Write};
use std::net::IpAddr;
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError, sync_channel};
use std::time::{Duration, SystemTime};

use serde::Serialize;

/// Everything the log says about one request.
#[derive(Debug, Clone, Serialize)]
pub struct AccessRecord {
    /// Wall-clock time the request started (RFC 3339, milliseconds).
    pub time: String,
    pub client: IpAddr,
    pub peer: IpAddr,
    /// Where `client` came from: peer, proxy_protocol, x_forwarded_for, forwarded.
    pub client_source: &'static str,
    pub method: String,
    pub host: String,
    pub path: String,
    pub proto: &'static str,
    pub class: String,
    pub decision: &'static str,
    /// The session: `anonymous`, `verified`, or `unverified` (a session
    /// cookie that failed its check).
    pub session: &'static str,
    /// Challenge outcome: `issued` (page served), `solved`, `failed`,
    /// `pass` (a valid pass token admitted the request).
    pub challenge: Option<&'static str>,
    /// The rule that rejected the request, if any.
    pub rule: Option<String>,
    /// The level of that rule that fired (`ip`, `subnet`, `network`, `site`, ...).
    pub rule_level: Option<&'static str>,
    /// The key that fired: an address, a prefix, `site`.
    pub rule_key: Option<String>,
    /// Rules that would have rejected the request in shadow mode.
    pub shadow_rules: Option<Vec<String>>,
    /// Why the rejected client may be a person: low_rate, verified, browser.
    pub collateral: Option<&'static str>,
    pub pool: Option<String>,
    pub upstream: Option<String>,
    pub status: u16,
    pub upstream_status: Option<u16>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub duration_ms: f64,
    pub queue_ms: f64,
    /// The admission lane the request waited in (`verified`, `pass`,
    /// `anonymous`), when its pool has an admission queue.
    pub lane: Option<String>,
    pub upstream_ms: Option<f64>,
    /// Request coalescing (classes with `coalesce = true`): `leader` (went
    /// upstream for identical requests), `shared` (answered with the
    /// leader's response, no upstream request), `unshared` (waited for a
    /// leader whose response could not be shared, then went upstream).
    pub coalesced: Option<&'static str>,
    /// Set when the response did not complete (client gone, upstream reset).
    pub error: Option<String>,
}

/// Where lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogTarget {
    Off,
    Stdout,
    File(String),
}

impl LogTarget {
    pub fn parse(s: &str) -> LogTarget {
        match s {
            "off" | "" => LogTarget::Off,
            "stdout" | "-" => LogTarget::Stdout,
            path => LogTarget::File(path.to_string()),
        }
    }
}

/// A handle to the access log writer; cheap to clone.
#[derive(Clone)]
pub struct AccessLog {
    tx: Option<SyncSender<Vec<u8>>>,
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog")
            .field("on", &self.tx.is_some())
            .finish()
    }
}

/// Lines buffered between request tasks and the writer.
const CHANNEL_LINES: usize = 65_536;

impl AccessLog {
    /// A log that writes nothing.
    pub fn off() -> AccessLog {
        AccessLog { tx: None }
    }

    /// Starts the writer thread for `target`.
    pub fn start(target: &LogTarget) -> io::Result<AccessLog> {
        let out: Box<dyn Write + Send> = match target {
            LogTarget::Off => return Ok(AccessLog::off()),
            LogTarget::Stdout => Box::new(io::stdout()),
            LogTarget::File(path) => {
                Box::new(OpenOptions::new().create(true).append(true).open(path)?)
            }
        };
        let (tx, rx) = sync_channel(CHANNEL_LINES);
        std::thread::Builder::new()
            .name("weir-access-log".into())
            .spawn(move || write_lines(rx, out))?;
        Ok(AccessLog { tx: Some(tx) })
    }

    pub fn is_on(&self) -> bool {
        self.tx.is_some()
    }

    /// Queues a record; returns false if it had to be dropped.
    pub fn write(&self, record: &AccessRecord) -> bool {
        let Some(tx) = &self.tx else { return true };
        let mut line = Vec::with_capacity(384);
        if serde_json::to_writer(&mut line, record).is_err() {
            return false;
        }
        line.push(b'\n');
        match tx.try_send(line) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => false,
        }
    }
}

fn write_lines(rx: Receiver<Vec<u8>>, out: Box<dyn Write + Send>) {
    let mut out = BufWriter::with_capacity(256 * 1024, out);
    // The writer polls instead of blocking in `recv`: a sender then never has
    // to wake it (a futex call per request), and each pass writes everything
    // queued with one write(2). Lines reach the file within one interval.
    loop {
        let mut wrote = false;
        loop {
            match rx.try_recv() {
                Ok(line) => {
                    let _ = out.write_all(&line);
                    wrote = true;
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    let _ = out.flush();
                    return;
                }
            }
        }
        if wrote {
            let _ = out.flush();
        }
        std::thread::sleep(WRITE_INTERVAL);
    }
}

/// How often queued lines are written.
const WRITE_INTERVAL: Duration = Duration::from_millis(20);

/// RFC 3339 time with milliseconds, e.g. `2026-09-23T17:00:00.123Z`.
pub fn timestamp(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}
