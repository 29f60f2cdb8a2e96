//! The live operator page on the admin address: `/ui` (a self-contained
//! page: its script and style come from `/ui/ui.js` and `/ui/ui.css`, no
//! other origin), `/ui/history`, the last 15 minutes second by second
//! (`observe::timeline`) that the page's charts start from, and
//! `/ui/events`, a server-sent event stream with one `live` document a
//! second: the latest seconds of the timeline, the user-agent families and
//! prefixes refused most in the last 15 minutes, the rules refusing now
//! (this minute and the last, distinct clients, how many looked like
//! people, the top refused prefixes), each pool's signal, lanes and
//! servers, whether its challenge is engaged, and the last reload's result.
//!
//! Read-only: the page can reload only with `[admin] token` set and typed
//! in (the guard checks the `POST`, as for any client). Owns the page and
//! the document; the numbers come from the runtime's tallies and `status`.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Response, StatusCode, header};
use http_body::Frame;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::AdminBody;
use crate::runtime::Runtime;

const PAGE: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/ui.js");
const STYLE: &str = include_str!("ui/ui.css");

/// How often the stream sends a document.
const EVERY: Duration = Duration::from_secs(1);
/// Prefixes listed per rule.
const TOP_PREFIXES: usize = 5;
/// Families and prefixes listed as refused most in the last 15 minutes.
const TOP_REFUSED: usize = 8;
/// Seconds of the timeline each `live` document repeats: the page keeps
/// each second once, and a document a tick late misses none.
const RECENT_SECONDS: usize = 5;

/// `/ui`, `/ui/ui.js`, `/ui/ui.css`; `None` for other paths.
pub fn asset(path: &str) -> Option<Response<AdminBody>> {
    let (body, content_type) = match path {
        "/ui" | "/ui/" => (PAGE, "text/html; charset=utf-8"),
        "/ui/ui.js" => (SCRIPT, "text/javascript; charset=utf-8"),
        "/ui/ui.css" => (STYLE, "text/css; charset=utf-8"),
        _ => return None,
    };
    let mut resp = super::text(StatusCode::OK, content_type, body.to_owned());
    let h = resp.headers_mut();
    // Nothing from elsewhere, no inline script: a rule name or an error
    // shown on the page cannot become code.
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
             img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
    Some(resp)
}

/// `/ui/events`: a `live` event now and every second after, until the
/// client goes or `stop` is cancelled.
pub fn events(rt: &Arc<Runtime>, stop: CancellationToken) -> Response<AdminBody> {
    let (tx, rx) = mpsc::channel::<Bytes>(2);
    let rt = rt.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            let event = format!("event: live\ndata: {}\n\n", live(&rt));
            // The client went away (hyper dropped the body): stop.
            if tx.send(Bytes::from(event)).await.is_err() {
                break;
            }
        }
    });
    let body = http_body_util::BodyExt::boxed(EventStream { rx });
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/event-stream"),
    );
    h.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    resp
}

/// The stream's body: each message the producer task sends, as one frame.
struct EventStream {
    rx: mpsc::Receiver<Bytes>,
}

impl http_body::Body for EventStream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|m| m.map(|b| Ok(Frame::data(b))))
    }
}

/// `/ui/history`: every second kept (`observe::timeline`, at most 15
/// minutes), oldest first, and the families and prefixes refused most.
pub fn history(rt: &Runtime) -> Response<AdminBody> {
    let doc = json!({
        "seconds": rt.timeline.seconds(None),
        "refused": rt.timeline.top_refused(unix_ms(SystemTime::now()) / 1000, TOP_REFUSED),
    });
    let mut resp = super::text(StatusCode::OK, "application/json", doc.to_string());
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    resp
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The document the page renders.
pub fn live(rt: &Runtime) -> serde_json::Value {
    let elapsed = rt.started.elapsed().as_secs();
    // The same minute count the rules phase records under (policy.rs).
    let minute = elapsed / 60;
    let rules: Vec<_> = rt
        .rejected_clients
        .activity(minute, TOP_PREFIXES)
        .into_iter()
        .map(|(this, last)| {
            json!({
                "rule": this.rule,
                "this_minute": this,
                "last_minute": last,
            })
        })
        .collect();
    let challenge: Vec<_> = rt
        .pressure
        .engaged()
        .into_iter()
        .map(|(pool, engaged)| json!({"pool": &*pool, "engaged": engaged}))
        .collect();
    let reload = rt
        .last_reload
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .map(|r| {
            json!({
                "at_unix_ms": unix_ms(r.at),
                "applied": r.applied,
                "version": r.version,
                "errors": r.errors,
            })
        });
    let gw = rt.gateway.load();
    let now = unix_ms(SystemTime::now());
    json!({
        "at_unix_ms": now,
        "recent": rt.timeline.seconds(Some(RECENT_SECONDS)),
        "refused": rt.timeline.top_refused(now / 1000, TOP_REFUSED),
        "uptime_seconds": elapsed,
        "seconds_into_minute": elapsed % 60,
        "config_version": gw.version,
        "draining": rt.tracker.is_draining(),
        "connections": {
            "open": rt.tracker.open(),
            "max": rt.tracker.limits().max_connections,
        },
        "rules": rules,
        "pools": super::pools(&gw),
        "challenge": challenge,
        "reload": reload,
        "admin_token": gw.admin_guard.has_token(),
    })
}
