//! The access log: one JSON line per request.
//!
//! Lines are formatted on the request's task and handed to a writer thread
//! through a bounded channel; the request path never waits on disk or a pipe.
//! When the channel is full the line is dropped and counted
//! (`weir_access_log_dropped_total`): a slow log must not become an outage.
//! Field names match metric labels (`class`, `rule`, `pool`).

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use crate::identity::{write_ip, write_socket_addr};
use weir_http::target::Target;

/// A key as written after another pair: `,"name":`. Composed at compile
/// time so that writing a key is one copy (a line has 30 of them).
macro_rules! key {
    ($name:literal) => {
        concat!(",\"", $name, "\":")
    };
}

/// Everything the log says about one request.
#[derive(Debug, Clone)]
pub struct AccessRecord {
    /// Wall-clock time the request started (RFC 3339, milliseconds).
    pub time: SystemTime,
    /// The id the app and the client see as `X-Request-Id` (`request_id`).
    pub request_id: super::request_id::RequestId,
    pub client: IpAddr,
    pub peer: IpAddr,
    /// Where `client` came from: peer, proxy_protocol, x_forwarded_for, forwarded.
    pub client_source: crate::identity::AddrSource,
    pub method: http::Method,
    /// The request as weir read it (`weir_http::target`): written as `host`
    /// (lowercase, without port) and `path` (the canonical path and the
    /// query, as forwarded). Shared with the request, not copied. `None`
    /// when it could not be read one way (400/501).
    pub target: Option<Target>,
    /// The request target as the client sent it, when weir read it
    /// differently (`//w/./index.php`, the log's `raw_path`), or could not
    /// read it at all (then it is the log's `path`).
    pub raw_target: Option<String>,
    pub proto: http::Version,
    /// On a TLS listener, the protocol version the handshake agreed
    /// (`TLSv1.3`) and the application protocol ALPN chose (`h2`,
    /// `http/1.1`; `null` when the client offered none): `tls_version`
    /// and `alpn`, both `null` on a plain listener.
    pub tls_version: Option<&'static str>,
    pub alpn: Option<&'static str>,
    /// The request's `User-Agent` and `Referer`, as sent (shared with the
    /// request's fields, not copied).
    pub user_agent: Option<http::HeaderValue>,
    pub referer: Option<http::HeaderValue>,
    pub class: Arc<str>,
    pub decision: Verdict,
    /// The session: `anonymous`, `verified`, or `unverified` (a session
    /// cookie that failed its check).
    pub session: crate::evidence::SessionKind,
    /// The verified crawler (`[[bots.crawlers]]` name) the request proved
    /// to be, by Web Bot Auth or reverse DNS; `null` otherwise (a crawler
    /// name in the User-Agent alone is not one).
    pub bot: Option<Arc<str>>,
    /// Challenge outcome: `issued` (page served), `solved`, `failed`,
    /// `pass` (a valid pass token admitted the request), ...
    pub challenge: Option<crate::evidence::ChallengeMark>,
    /// The rule that rejected the request, if any.
    pub rule: Option<String>,
    /// The level of that rule that fired (`ip`, `subnet`, `network`, `site`, ...).
    pub rule_level: Option<&'static str>,
    /// The key that fired: an address, a prefix, `site`.
    pub rule_key: Option<String>,
    /// Rules that would have rejected the request in shadow mode.
    pub shadow_rules: Option<Vec<String>>,
    /// Why the rejected client may be a person, the strongest evidence it
    /// showed (found by `policy::rules::collateral_signal`): verified,
    /// pass, browsing, low_rate, browser.
    pub collateral: Option<crate::evidence::Collateral>,
    /// A navigation's visit (`crate::visit`) before this request.
    pub visit: Option<LoggedVisit>,
    pub pool: Option<Arc<str>>,
    pub upstream: Option<SocketAddr>,
    pub status: u16,
    pub upstream_status: Option<u16>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// From the request's head to the end of its response (`duration_ms`).
    pub duration: Duration,
    /// Time waiting in an admission queue (`queue_ms`).
    pub queue_time: Duration,
    /// The admission lane the request waited in (`verified`, `pass`,
    /// `anonymous`), when its pool has an admission queue.
    pub lane: Option<Arc<str>>,
    /// From sending the request upstream to its response head (`upstream_ms`).
    pub upstream_time: Option<Duration>,
    /// Request coalescing (classes with `coalesce = true`): `leader` (went
    /// upstream for identical requests), `shared` (answered with the
    /// leader's response, no upstream request), `unshared` (waited for a
    /// leader whose response could not be shared, then went upstream).
    pub coalesced: Option<Coalescing>,
    /// Set when the response did not complete (client gone, upstream reset).
    pub error: Option<String>,
}

/// The protocol's name in the log (`proto`): what a client can send weir.
fn proto_name(v: http::Version) -> &'static str {
    match v {
        http::Version::HTTP_2 => "HTTP/2",
        http::Version::HTTP_10 => "HTTP/1.0",
        _ => "HTTP/1.1",
    }
}

/// What the policy decided (`decision`), without what it decided with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Admit,
    Reject,
    Challenge,
}

impl Verdict {
    /// Its name in the access log and in metrics' `decision` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Admit => "admit",
            Verdict::Reject => "reject",
            Verdict::Challenge => "challenge",
        }
    }
}

/// A request's part in coalescing (`coalesced`), for a request not alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coalescing {
    /// Went upstream for identical requests.
    Leader,
    /// Answered with the leader's response, no upstream request.
    Shared,
    /// Waited for a leader whose response could not be shared, then went
    /// upstream.
    Unshared,
}

impl Coalescing {
    /// Its name in the access log.
    pub fn as_str(self) -> &'static str {
        match self {
            Coalescing::Leader => "leader",
            Coalescing::Shared => "shared",
            Coalescing::Unshared => "unshared",
        }
    }
}

/// A navigation's visit as the log records it (`visit_views`,
/// `visit_costly`, `visit_age_s`): the pages weir had served in it before
/// the request, its navigations to slow pages, and its age in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoggedVisit {
    pub views: u16,
    pub costly: u16,
    pub age_s: u32,
}

impl LoggedVisit {
    pub fn of(v: &crate::visit::Visit, now: std::time::SystemTime) -> LoggedVisit {
        LoggedVisit {
            views: v.views,
            costly: v.costly,
            age_s: u32::try_from(v.age(now).as_secs()).unwrap_or(u32::MAX),
        }
    }
}

impl AccessRecord {
    /// Appends the record as one JSON object (no newline).
    ///
    /// Written by hand rather than with serde: this runs for every request,
    /// and most fields are known-safe tokens, numbers and addresses that need
    /// no escaping (serde_json was a sixth of weir's own per-request work).
    pub fn write_json(&self, out: &mut Vec<u8>) {
        // `time` first, so that every other key starts with its comma.
        out.extend_from_slice(b"{\"time\":");
        let mut w = JsonObject { out };
        w.quoted(|out| write_timestamp(out, self.time));
        self.write_client_fields(&mut w);
        self.write_request_fields(&mut w);
        self.write_decision_fields(&mut w);
        self.write_visit_fields(&mut w);
        self.write_outcome_fields(&mut w);
        w.out.push(b'}');
    }

    /// Writes who asked: the request's id, the client and the peer it came
    /// through, and where the client's address was read from.
    #[inline]
    fn write_client_fields(&self, w: &mut JsonObject<'_>) {
        w.token(key!("request_id"), self.request_id.as_str());
        w.key(key!("client"));
        w.quoted(|out| write_ip(out, self.client));
        w.key(key!("peer"));
        w.quoted(|out| write_ip(out, self.peer));
        w.token(key!("client_source"), self.client_source.as_str());
    }

    /// Writes what was asked: method, host, path, protocol and the headers
    /// the log keeps.
    #[inline]
    fn write_request_fields(&self, w: &mut JsonObject<'_>) {
        w.string(key!("method"), self.method.as_str());
        let (host, path, raw) = match &self.target {
            Some(t) => (
                t.host().unwrap_or(""),
                t.path_and_query(),
                self.raw_target.as_deref(),
            ),
            None => ("", self.raw_target.as_deref().unwrap_or(""), None),
        };
        w.string(key!("host"), host);
        w.string(key!("path"), path);
        w.opt_string(key!("raw_path"), raw);
        w.token(key!("proto"), proto_name(self.proto));
        w.opt_token(key!("tls_version"), self.tls_version);
        w.opt_token(key!("alpn"), self.alpn);
        w.opt_field(key!("user_agent"), self.user_agent.as_ref());
        w.opt_field(key!("referer"), self.referer.as_ref());
    }

    /// Writes what weir decided: class, decision, session, bot, challenge,
    /// the rule that decided and the rules that would have in shadow.
    #[inline]
    fn write_decision_fields(&self, w: &mut JsonObject<'_>) {
        w.string(key!("class"), &self.class);
        w.token(key!("decision"), self.decision.as_str());
        w.token(key!("session"), self.session.as_str());
        w.opt_string(key!("bot"), self.bot.as_deref());
        w.opt_token(key!("challenge"), self.challenge.map(|c| c.as_str()));
        w.opt_string(key!("rule"), self.rule.as_deref());
        w.opt_token(key!("rule_level"), self.rule_level);
        w.opt_string(key!("rule_key"), self.rule_key.as_deref());
        match &self.shadow_rules {
            None => w.null(key!("shadow_rules")),
            Some(rules) => {
                w.key(key!("shadow_rules"));
                w.out.push(b'[');
                for (i, r) in rules.iter().enumerate() {
                    if i > 0 {
                        w.out.push(b',');
                    }
                    escaped(w.out, r);
                }
                w.out.push(b']');
            }
        }
        w.opt_token(key!("collateral"), self.collateral.map(|c| c.as_str()));
    }

    /// Writes the navigation's visit (`visit_views`, `visit_costly`,
    /// `visit_age_s`), `null` each without one.
    #[inline]
    fn write_visit_fields(&self, w: &mut JsonObject<'_>) {
        match self.visit {
            Some(v) => {
                w.uint(key!("visit_views"), u64::from(v.views));
                w.uint(key!("visit_costly"), u64::from(v.costly));
                w.uint(key!("visit_age_s"), u64::from(v.age_s));
            }
            None => {
                w.null(key!("visit_views"));
                w.null(key!("visit_costly"));
                w.null(key!("visit_age_s"));
            }
        }
    }

    /// Writes how it went: pool and upstream, statuses, bytes, times,
    /// lane, coalescing and error.
    #[inline]
    fn write_outcome_fields(&self, w: &mut JsonObject<'_>) {
        w.opt_string(key!("pool"), self.pool.as_deref());
        match &self.upstream {
            Some(a) => {
                w.key(key!("upstream"));
                w.quoted(|out| write_socket_addr(out, *a));
            }
            None => w.null(key!("upstream")),
        }
        w.uint(key!("status"), u64::from(self.status));
        match self.upstream_status {
            Some(s) => w.uint(key!("upstream_status"), u64::from(s)),
            None => w.null(key!("upstream_status")),
        }
        w.uint(key!("bytes_in"), self.bytes_in);
        w.uint(key!("bytes_out"), self.bytes_out);
        w.millis(key!("duration_ms"), self.duration);
        w.millis(key!("queue_ms"), self.queue_time);
        w.opt_string(key!("lane"), self.lane.as_deref());
        match self.upstream_time {
            Some(v) => w.millis(key!("upstream_ms"), v),
            None => w.null(key!("upstream_ms")),
        }
        w.opt_token(key!("coalesced"), self.coalesced.map(Coalescing::as_str));
        w.opt_string(key!("error"), self.error.as_deref());
    }
}

/// Writes `,"key":value` pairs of one JSON object after its first; keys
/// come from `key!`.
struct JsonObject<'a> {
    out: &'a mut Vec<u8>,
}

impl<'a> JsonObject<'a> {
    #[cfg(test)]
    fn new(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        JsonObject { out }
    }

    fn key(&mut self, key: &'static str) {
        self.out.extend_from_slice(key.as_bytes());
    }

    /// A value from weir's own vocabulary: never needs escaping.
    fn token(&mut self, key: &'static str, v: &str) {
        self.key(key);
        self.out.push(b'"');
        self.out.extend_from_slice(v.as_bytes());
        self.out.push(b'"');
    }

    fn opt_token(&mut self, key: &'static str, v: Option<&str>) {
        match v {
            Some(v) => self.token(key, v),
            None => self.null(key),
        }
    }

    /// A value from the request or the configuration: escaped as needed.
    fn string(&mut self, key: &'static str, v: &str) {
        self.key(key);
        escaped(self.out, v);
    }

    fn opt_string(&mut self, key: &'static str, v: Option<&str>) {
        match v {
            Some(v) => self.string(key, v),
            None => self.null(key),
        }
    }

    /// A request field's value: text as sent (bytes that are not UTF-8, which
    /// HTTP allows, become U+FFFD), escaped as needed.
    fn opt_field(&mut self, key: &'static str, v: Option<&http::HeaderValue>) {
        let Some(v) = v else {
            return self.null(key);
        };
        self.key(key);
        // The common case in one scan: visible ASCII with nothing to escape
        // (a check for text, then one for escapes, was twice the work).
        let bytes = v.as_bytes();
        if bytes.iter().all(|&b| b < 0x80 && PLAIN[usize::from(b)]) {
            self.out.push(b'"');
            self.out.extend_from_slice(bytes);
            self.out.push(b'"');
        } else {
            escaped(self.out, &String::from_utf8_lossy(bytes));
        }
    }

    /// A value that needs no escaping (addresses, times), written by `f`
    /// between quotes.
    fn quoted(&mut self, f: impl FnOnce(&mut Vec<u8>)) {
        self.out.push(b'"');
        f(self.out);
        self.out.push(b'"');
    }

    fn null(&mut self, key: &'static str) {
        self.key(key);
        self.out.extend_from_slice(b"null");
    }

    fn uint(&mut self, key: &'static str, v: u64) {
        self.key(key);
        self.out
            .extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
    }

    /// Milliseconds with microsecond precision, as the shortest decimal
    /// (`1.5`, `0.042`, `3.0`), which is how serde_json printed them.
    /// Integer arithmetic only: rounding a float here was a tenth of the
    /// line's cost.
    fn millis(&mut self, key: &'static str, d: Duration) {
        self.key(key);
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let mut int = itoa::Buffer::new();
        self.out
            .extend_from_slice(int.format(micros / 1000).as_bytes());
        let frac = micros % 1000;
        let digits = [
            b'.',
            b'0' + (frac / 100) as u8,
            b'0' + (frac / 10 % 10) as u8,
            b'0' + (frac % 10) as u8,
        ];
        let len = if frac == 0 || frac.is_multiple_of(100) {
            2
        } else if frac.is_multiple_of(10) {
            3
        } else {
            4
        };
        self.out.extend_from_slice(&digits[..len]);
    }
}

/// Bytes written inside a JSON string as they are: not a control character,
/// `"`, `\` or DEL. UTF-8's bytes past ASCII are plain in a `str`; a field
/// value's are not text yet ([`JsonObject::opt_field`] checks them apart).
/// A table: one load a byte, where four comparisons were (the request's
/// path, host and `User-Agent` are scanned on every line).
static PLAIN: [bool; 256] = {
    let mut plain = [false; 256];
    let mut b = 0x20;
    while b < 256 {
        plain[b] = b != b'"' as usize && b != b'\\' as usize && b != 0x7f;
        b += 1;
    }
    plain
};

/// A JSON string literal; request data seldom needs escaping, so the common
/// case is one scan and one copy.
fn escaped(out: &mut Vec<u8>, v: &str) {
    if v.bytes().all(|b| PLAIN[usize::from(b)]) {
        out.push(b'"');
        out.extend_from_slice(v.as_bytes());
        out.push(b'"');
    } else {
        let _ = serde_json::to_writer(&mut *out, v);
    }
}

/// Appends `t` as RFC 3339 UTC with milliseconds, e.g.
/// `2026-09-23T17:00:00.123Z` (what `humantime::format_rfc3339_millis`
/// prints, without its formatter machinery: this runs for every request).
/// The part up to the second is composed once a second per thread.
fn write_timestamp(out: &mut Vec<u8>, t: SystemTime) {
    use std::cell::Cell;
    thread_local! {
        /// A second since the epoch and its text, `2026-09-23T17:00:00.`.
        static SECOND: Cell<(u64, [u8; 20])> = const { Cell::new((u64::MAX, [0; 20])) };
    }
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (cached, mut text) = SECOND.get();
    if cached != secs {
        text = second_text(secs);
        SECOND.set((secs, text));
    }
    let ms = since.subsec_millis();
    let rest = [
        b'0' + (ms / 100) as u8,
        b'0' + (ms / 10 % 10) as u8,
        b'0' + (ms % 10) as u8,
        b'Z',
    ];
    out.extend_from_slice(&text);
    out.extend_from_slice(&rest);
}

/// `secs` since the epoch as `YYYY-MM-DDTHH:MM:SS.`.
fn second_text(secs: u64) -> [u8; 20] {
    let (year, month, day) = crate::calendar::civil_from_days((secs / 86_400) as i64);
    let of_day = secs % 86_400;
    // Years past 9999 do not occur in access logs; clamp rather than widen.
    let year = year.clamp(0, 9999) as u64;
    let mut text = [0u8; 20];
    for (i, div) in [1000, 100, 10, 1].into_iter().enumerate() {
        text[i] = b'0' + (year / div % 10) as u8;
    }
    let fields = [
        (u64::from(month), b'-'),
        (u64::from(day), b'T'),
        (of_day / 3600, b':'),
        (of_day / 60 % 60, b':'),
        (of_day % 60, b'.'),
    ];
    text[4] = b'-';
    for (i, (n, sep)) in fields.into_iter().enumerate() {
        let at = 5 + 3 * i;
        text[at] = b'0' + (n / 10) as u8;
        text[at + 1] = b'0' + (n % 10) as u8;
        text[at + 2] = sep;
    }
    text
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
    sink: Option<Arc<Sink>>,
}

/// Lines waiting to be written, and where they go.
struct Sink {
    /// The file, when the log is one (reopened by [`AccessLog::reopen`]).
    path: Option<String>,
    pending: Mutex<Vec<u8>>,
    /// Held while a batch is written, so two writers (the thread and a
    /// final [`AccessLog::flush`]) keep lines in order.
    out: Mutex<Box<dyn Write + Send>>,
}

impl Sink {
    /// Writes what is pending; `batch` is the buffer swapped in (and kept).
    fn write_pending(&self, batch: &mut Vec<u8>) {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::swap(
            batch,
            &mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()),
        );
        if !batch.is_empty() {
            let _ = out.write_all(batch);
            let _ = out.flush();
            batch.clear();
        }
    }
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog")
            .field("on", &self.sink.is_some())
            .finish()
    }
}

/// Bytes of lines waiting for the writer (some 50,000 lines); past this,
/// lines are dropped and counted.
const PENDING_CAP: usize = 32 << 20;

thread_local! {
    /// Where a line is formatted before it is appended to the shared
    /// buffer, so the lock is held only for a copy.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(Vec::with_capacity(1024));
}

impl AccessLog {
    /// A log that writes nothing.
    pub fn off() -> AccessLog {
        AccessLog { sink: None }
    }

    /// Starts the writer thread for `target`.
    pub fn start(target: &LogTarget) -> io::Result<AccessLog> {
        let (out, path): (Box<dyn Write + Send>, _) = match target {
            LogTarget::Off => return Ok(AccessLog::off()),
            LogTarget::Stdout => (Box::new(io::stdout()), None),
            LogTarget::File(path) => (Box::new(append(path)?), Some(path.clone())),
        };
        let sink = Arc::new(Sink {
            path,
            pending: Mutex::new(Vec::with_capacity(64 * 1024)),
            out: Mutex::new(out),
        });
        let shared = sink.clone();
        std::thread::Builder::new()
            .name("weir-access-log".into())
            .spawn(move || write_lines(shared))?;
        Ok(AccessLog { sink: Some(sink) })
    }

    pub fn is_on(&self) -> bool {
        self.sink.is_some()
    }

    /// Queues a record; returns false if it had to be dropped.
    ///
    /// Lines are appended to one shared buffer rather than sent one `Vec`
    /// each through a channel: a line allocated on a request thread and
    /// freed on the writer thread kept the allocator moving memory between
    /// its per-thread caches on every request.
    pub fn write(&self, record: &AccessRecord) -> bool {
        let Some(sink) = &self.sink else {
            return true;
        };
        SCRATCH.with_borrow_mut(|line| {
            line.clear();
            record.write_json(line);
            line.push(b'\n');
            let mut buf = sink.pending.lock().unwrap_or_else(|e| e.into_inner());
            if buf.len() + line.len() > PENDING_CAP {
                return false;
            }
            buf.extend_from_slice(line);
            true
        })
    }

    /// Reopens the log file by its name (SIGUSR1, after logrotate moved
    /// it): lines queued so far go to the old file, later ones to the new.
    /// `Ok(false)` when the log is not a file. On an error the old file is
    /// kept and written on.
    pub fn reopen(&self) -> io::Result<bool> {
        let Some(sink) = &self.sink else {
            return Ok(false);
        };
        let Some(path) = &sink.path else {
            return Ok(false);
        };
        let file = append(path)?;
        sink.write_pending(&mut Vec::new());
        *sink.out.lock().unwrap_or_else(|e| e.into_inner()) = Box::new(file);
        Ok(true)
    }

    /// Writes every queued line now, on the caller's thread: the end of a
    /// drain, so the last requests' lines are not left for a writer pass
    /// the process exits before.
    pub fn flush(&self) {
        if let Some(sink) = &self.sink {
            sink.write_pending(&mut Vec::new());
        }
    }
}

/// The log file opened for appending (created if missing).
fn append(path: &str) -> io::Result<std::fs::File> {
    OpenOptions::new().create(true).append(true).open(path)
}

fn write_lines(sink: Arc<Sink>) {
    // The writer polls instead of being woken: a request then never pays
    // for a wake-up (a futex call), and each pass writes everything queued
    // with one write(2). Lines reach the file within one interval.
    let mut batch = Vec::with_capacity(64 * 1024);
    loop {
        // The last handle gone (the server stopped): write what is left.
        let last = Arc::strong_count(&sink) == 1;
        sink.write_pending(&mut batch);
        // A burst may have grown the buffer far past a normal pass.
        if batch.capacity() > 4 << 20 {
            batch = Vec::with_capacity(64 * 1024);
        }
        if last {
            return;
        }
        std::thread::sleep(WRITE_INTERVAL);
    }
}

/// How often queued lines are written.
const WRITE_INTERVAL: Duration = Duration::from_millis(20);

#[cfg(test)]
mod tests {
    /// The record lives in the request's log box from its head to its
    /// line, and is touched again after the request's wait (issue 57: a
    /// request's state small and in one place). Its evidence is typed:
    /// `decision`, `session`, `challenge`, `coalesced`, `client_source` and
    /// `proto` were `&'static str`s, 16 bytes each, and the record 784
    /// bytes; one byte each now, and 696 bytes in all.
    #[test]
    fn the_record_stays_small() {
        let size = std::mem::size_of::<super::AccessRecord>();
        eprintln!("AccessRecord: {size} bytes");
        assert!(size <= 696, "AccessRecord is {size} bytes");
    }

    use super::*;

    #[test]
    fn timestamps_match_humantime() {
        // Epoch, leap days, century rules (2000 is leap, 2100 is not), the
        // end of a year, and a spread of ordinary instants.
        let mut secs: Vec<u64> = vec![
            0,
            951_782_400,     // 2000-02-29
            951_868_799,     // 2000-02-29T23:59:59
            1_709_164_800,   // 2024-02-29
            1_735_689_599,   // 2024-12-31T23:59:59
            4_107_542_400,   // 2100-03-01
            253_402_300_799, // 9999-12-31T23:59:59
        ];
        secs.extend((0..2000u64).map(|i| i * 7_919_993 + i % 1000));
        for s in secs {
            for ms in [0, 7, 42, 999] {
                let t = SystemTime::UNIX_EPOCH + Duration::from_millis(s * 1000 + ms);
                let mut out = Vec::new();
                write_timestamp(&mut out, t);
                let want = humantime::format_rfc3339_millis(t).to_string();
                assert_eq!(String::from_utf8(out).unwrap(), want, "{s}.{ms}");
            }
        }
    }

    /// One fixed id, as a trusted proxy would have sent it.
    fn request_id() -> crate::observe::request_id::RequestId {
        use crate::identity::{AddrSource, ClientAddr, ClientId, PeerAddr};
        let mut h = http::HeaderMap::new();
        h.insert("x-request-id", http::HeaderValue::from_static("lb-7f3a"));
        let ip = "192.0.2.1".parse().unwrap();
        let client = ClientId {
            peer: PeerAddr(std::net::SocketAddr::new(ip, 1)),
            client: ClientAddr::new(ip),
            source: AddrSource::XForwardedFor,
        };
        crate::observe::request_id::RequestId::of(&h, &client)
    }

    fn record() -> AccessRecord {
        AccessRecord {
            time: SystemTime::UNIX_EPOCH + Duration::from_millis(1_790_000_000_123),
            request_id: request_id(),
            client: "198.51.100.7".parse().unwrap(),
            peer: "2001:db8::1".parse().unwrap(),
            client_source: crate::identity::AddrSource::XForwardedFor,
            method: http::Method::GET,
            target: Some(
                Target::parse(
                    "GET",
                    "/w/index.php?title=%22x%22%5Cy%01",
                    Some("Wiki.Example"),
                    Default::default(),
                )
                .unwrap(),
            ),
            raw_target: Some("//w/index.php?title=\"x\"\\y\u{1}".into()),
            proto: http::Version::HTTP_11,
            tls_version: Some("TLSv1.3"),
            alpn: Some("http/1.1"),
            user_agent: Some(http::HeaderValue::from_static("Mozilla/5.0 \"quoted\"")),
            // obs-text: bytes HTTP allows that are not UTF-8.
            referer: Some(http::HeaderValue::from_bytes(b"https://a.example/\xe9").unwrap()),
            class: Arc::from("page"),
            decision: Verdict::Reject,
            session: crate::evidence::SessionKind::Anonymous,
            bot: Some(Arc::from("googlebot")),
            challenge: None,
            rule: Some("per-ip".into()),
            rule_level: Some("ip"),
            rule_key: Some("198.51.100.7".into()),
            shadow_rules: Some(vec!["site".into(), "q\"uote".into()]),
            collateral: None,
            visit: Some(LoggedVisit {
                views: 4,
                costly: 1,
                age_s: 185,
            }),
            pool: Some(Arc::from("app")),
            upstream: Some("127.0.0.1:8080".parse().unwrap()),
            status: 429,
            upstream_status: None,
            bytes_in: 0,
            bytes_out: 1234,
            duration: Duration::from_micros(1500),
            queue_time: Duration::ZERO,
            lane: None,
            upstream_time: Some(Duration::from_micros(42)),
            coalesced: None,
            error: None,
        }
    }

    #[test]
    fn line_is_json_with_every_field() {
        let mut out = Vec::new();
        record().write_json(&mut out);
        let v: serde_json::Value = serde_json::from_slice(&out).expect("valid JSON");
        let want = serde_json::json!({
            "time": "2026-09-21T14:13:20.123Z",
            "request_id": request_id().as_str(),
            "client": "198.51.100.7",
            "peer": "2001:db8::1",
            "client_source": "x_forwarded_for",
            "method": "GET",
            "host": "wiki.example",
            "path": "/w/index.php?title=%22x%22%5Cy%01",
            "raw_path": "//w/index.php?title=\"x\"\\y\u{1}",
            "proto": "HTTP/1.1",
            "tls_version": "TLSv1.3",
            "alpn": "http/1.1",
            "user_agent": "Mozilla/5.0 \"quoted\"",
            "referer": "https://a.example/\u{fffd}",
            "class": "page",
            "decision": "reject",
            "session": "anonymous",
            "bot": "googlebot",
            "challenge": null,
            "rule": "per-ip",
            "rule_level": "ip",
            "rule_key": "198.51.100.7",
            "shadow_rules": ["site", "q\"uote"],
            "collateral": null,
            "visit_views": 4,
            "visit_costly": 1,
            "visit_age_s": 185,
            "pool": "app",
            "upstream": "127.0.0.1:8080",
            "status": 429,
            "upstream_status": null,
            "bytes_in": 0,
            "bytes_out": 1234,
            "duration_ms": 1.5,
            "queue_ms": 0.0,
            "lane": null,
            "upstream_ms": 0.042,
            "coalesced": null,
            "error": null,
        });
        assert_eq!(v, want);
    }

    #[test]
    fn milliseconds_print_as_shortest_decimals() {
        let cases = [
            (0, "0.0"),
            (1_500, "1.5"),
            (42, "0.042"),
            (12_340, "12.34"),
            (3_000, "3.0"),
            (1_234_567, "1234.567"),
        ];
        for (micros, want) in cases {
            let mut out = Vec::new();
            JsonObject::new(&mut out).millis(key!("m"), Duration::from_micros(micros));
            assert_eq!(
                String::from_utf8(out).unwrap(),
                format!("{{,\"m\":{want}"),
                "{micros}"
            );
        }
        // Nanoseconds are cut, not rounded.
        let mut out = Vec::new();
        JsonObject::new(&mut out).millis(key!("m"), Duration::from_nanos(1_999));
        assert_eq!(String::from_utf8(out).unwrap(), "{,\"m\":0.001");
    }

    #[test]
    fn writer_keeps_every_line_whole_and_drains_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let log = AccessLog::start(&LogTarget::File(path.display().to_string())).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let log = log.clone();
                std::thread::spawn(move || {
                    for i in 0..500u64 {
                        let mut r = record();
                        r.bytes_in = t * 1000 + i;
                        assert!(log.write(&r));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(log);
        // The writer notices the last handle is gone within one interval.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut seen = std::collections::BTreeSet::new();
        while std::time::Instant::now() < deadline {
            let text = std::fs::read_to_string(&path).unwrap();
            // Read while the writer may be mid-line (a flaky failure
            // before): a line is whole once its newline is written.
            let written = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
            seen.clear();
            for line in written.lines() {
                let v: serde_json::Value = serde_json::from_str(line).expect("whole JSON line");
                seen.insert(v["bytes_in"].as_u64().unwrap());
            }
            if seen.len() == 2000 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let want: std::collections::BTreeSet<u64> = (0..4)
            .flat_map(|t| (0..500).map(move |i| t * 1000 + i))
            .collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn flush_writes_queued_lines_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let log = AccessLog::start(&LogTarget::File(path.display().to_string())).unwrap();
        for _ in 0..10 {
            assert!(log.write(&record()));
        }
        log.flush();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 10);
    }
}
