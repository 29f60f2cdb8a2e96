//! What ordinary visitors got: every request's kind, outcome and time,
//! counted as it ends, and summed into what the harmlessness table prints.
//!
//! It owns counting and summing; it does not send anything ([`super::mix`])
//! or judge a run ([`super::run`]).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

/// What a visitor was doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A page on a kept-alive connection.
    Page,
    /// A page on a connection of its own.
    FreshPage,
    /// A slow page (a search): ~300 ms of the app's time.
    SlowPage,
    /// A paced upload of a few megabytes.
    Upload,
    /// A large download read slowly.
    Download,
    /// A long poll.
    LongPoll,
    /// A server-sent-events stream, read to its end.
    Events,
    /// A WebSocket conversation of several messages.
    WebSocket,
    /// One stream of an HTTP/2 connection carrying many.
    H2Stream,
}

impl Kind {
    pub const ALL: [Kind; 9] = [
        Kind::Page,
        Kind::FreshPage,
        Kind::SlowPage,
        Kind::Upload,
        Kind::Download,
        Kind::LongPoll,
        Kind::Events,
        Kind::WebSocket,
        Kind::H2Stream,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Page => "page",
            Kind::FreshPage => "fresh_page",
            Kind::SlowPage => "slow_page",
            Kind::Upload => "upload",
            Kind::Download => "download",
            Kind::LongPoll => "long_poll",
            Kind::Events => "events",
            Kind::WebSocket => "websocket",
            Kind::H2Stream => "h2_stream",
        }
    }

    /// Whether its time says something about added wait (a page's does; a
    /// paced upload's is the visitor's own pace).
    fn timed(self) -> bool {
        matches!(
            self,
            Kind::Page | Kind::FreshPage | Kind::SlowPage | Kind::H2Stream
        )
    }
}

/// How one request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Served whole.
    Ok,
    /// An answer that is not the app's success: the status, and whether weir
    /// made it (it carries `x-weir-reason`).
    Status { status: u16, by_weir: bool },
    /// The connection was refused: nobody listened.
    Refused,
    /// The connection failed after the request began (reset, closed
    /// unanswered, cut mid-body); `what` says which.
    Failed { what: String },
    /// No answer within the client's patience.
    TimedOut,
}

/// The counts of one kind.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct KindCount {
    pub sent: u64,
    pub ok: u64,
    pub failed: u64,
    /// Of `failed`: answered with a status weir made.
    pub by_weir: u64,
    pub refused: u64,
    #[serde(skip)]
    latencies_ms: Vec<f64>,
}

/// Every visitor's outcomes in one run.
#[derive(Debug, Default)]
pub struct Tally {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    kinds: BTreeMap<Kind, KindCount>,
    /// The first few failures, for the report.
    examples: Vec<String>,
    /// Answers weir made, by status (`503`, `429`, ...).
    weir_statuses: BTreeMap<u16, u64>,
    /// Kept-alive connections that closed as a request was written to
    /// them, the request sent again on a new one (as browsers do).
    retried_idle_closes: u64,
}

const EXAMPLES: usize = 12;

impl Tally {
    /// Counts one request of `kind` that ended `outcome` after `took`.
    pub fn record(&self, kind: Kind, outcome: Outcome, took: Duration) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let k = inner.kinds.entry(kind).or_default();
        k.sent += 1;
        match &outcome {
            Outcome::Ok => {
                k.ok += 1;
                if kind.timed() {
                    k.latencies_ms.push(took.as_secs_f64() * 1000.0);
                }
                return;
            }
            Outcome::Status { by_weir, .. } => {
                k.failed += 1;
                k.by_weir += u64::from(*by_weir);
            }
            Outcome::Refused => {
                k.failed += 1;
                k.refused += 1;
            }
            Outcome::Failed { .. } | Outcome::TimedOut => k.failed += 1,
        }
        if let Outcome::Status {
            status,
            by_weir: true,
        } = outcome
        {
            *inner.weir_statuses.entry(status).or_default() += 1;
        }
        if inner.examples.len() < EXAMPLES {
            inner
                .examples
                .push(format!("{}: {outcome:?} after {took:.1?}", kind.name()));
        }
    }

    /// Counts a kept-alive connection closed under a request that was then
    /// sent again (not a failure: every HTTP client does this).
    pub fn retried_idle_close(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.retried_idle_closes += 1;
    }

    /// The sums.
    pub fn summary(&self) -> Summary {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut pages: Vec<f64> = Vec::new();
        for (kind, count) in &inner.kinds {
            if matches!(kind, Kind::Page | Kind::FreshPage | Kind::H2Stream) {
                pages.extend_from_slice(&count.latencies_ms);
            }
        }
        pages.sort_by(f64::total_cmp);
        let q = |p: f64| match pages.len() {
            0 => 0.0,
            n => pages[((n - 1) as f64 * p).round() as usize],
        };
        let kinds = inner.kinds.clone();
        Summary {
            sent: kinds.values().map(|k| k.sent).sum(),
            failed: kinds.values().map(|k| k.failed).sum(),
            refused: kinds.values().map(|k| k.refused).sum(),
            uploads: kinds.get(&Kind::Upload).map_or(0, |k| k.ok),
            uploads_cut: kinds.get(&Kind::Upload).map_or(0, |k| k.failed - k.refused),
            weir_503: inner.weir_statuses.get(&503).copied().unwrap_or(0),
            weir_429: inner.weir_statuses.get(&429).copied().unwrap_or(0),
            by_weir: kinds.values().map(|k| k.by_weir).sum(),
            page_p50_ms: q(0.5),
            page_p99_ms: q(0.99),
            retried_idle_closes: inner.retried_idle_closes,
            kinds: kinds.into_iter().map(|(k, v)| (k.name(), v)).collect(),
            examples: inner.examples.clone(),
        }
    }
}

/// One run's sums: what the harmlessness table prints.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Summary {
    pub sent: u64,
    /// Requests that did not get the app's answer whole.
    pub failed: u64,
    /// Of `failed`: connections refused.
    pub refused: u64,
    pub uploads: u64,
    /// Uploads that began and did not get the app's answer (a refused
    /// connection carried none: it is in `refused`).
    pub uploads_cut: u64,
    /// Answers weir made itself.
    pub weir_503: u64,
    pub weir_429: u64,
    pub by_weir: u64,
    /// Pages' (kept-alive, fresh, HTTP/2) time to their whole answer.
    pub page_p50_ms: f64,
    pub page_p99_ms: f64,
    pub retried_idle_closes: u64,
    pub kinds: BTreeMap<&'static str, KindCount>,
    pub examples: Vec<String>,
}
