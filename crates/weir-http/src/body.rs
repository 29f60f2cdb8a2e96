//! Body wrappers for the two directions of a proxied exchange.
//!
//! [`RequestBody`] streams the client's body upstream, counting bytes and
//! enforcing the class's body read timeout (the longest wait between two
//! chunks). [`ResponseBody`] streams the response to the client and runs a
//! completion hook exactly once, when the body ends or is dropped, so the
//! access log and in-flight counters see the true end of every request.
//! Neither buffers: memory stays flat for a 1 GiB upload.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::conn::RequestInProgress;
use crate::connections::UpstreamBody;
use crate::fields::ReceivedFields;
use crate::server::{EdgeBody, Outgoing};
use tokio::time::{Instant, Sleep};

pub use crate::BoxError;

/// The request body has stalled longer than the class allows.
#[derive(Debug, thiserror::Error)]
#[error("request body read timed out after {0:?} without data")]
pub struct BodyReadTimeout(pub Duration);

/// The request body came slower than the class's minimum rate allows.
#[derive(Debug, thiserror::Error)]
#[error("request body slower than {min_rate} bytes/s on average")]
pub struct BodyTooSlow {
    pub min_rate: u64,
}

/// The request body is longer than the class allows.
#[derive(Debug, thiserror::Error)]
#[error("request body over {max_bytes} bytes")]
pub struct BodyTooLarge {
    pub max_bytes: u64,
}

/// What a request body may take: a wait between pieces, an average rate
/// and a size. The rate is measured as Apache's `mod_reqtimeout` does: the
/// whole body must have arrived by `read_timeout` after it started plus one
/// second per `min_rate` bytes received, so a body dripped a byte at a
/// time within the read timeout still ends, and a slow honest upload
/// (a phone sends tens of KB/s) does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimits {
    pub read_timeout: Duration,
    /// Bytes per second; 0: no rate.
    pub min_rate: u64,
    pub max_bytes: u64,
}

impl BodyLimits {
    /// No limit at all (a body the edge hands over, before its route is known).
    pub const NONE: BodyLimits = BodyLimits {
        read_timeout: Duration::MAX,
        min_rate: 0,
        max_bytes: u64::MAX,
    };

    /// When a body that started at `started` and has brought `received`
    /// bytes must have ended; `None` without a rate.
    fn deadline(&self, started: Instant, received: u64) -> Option<Instant> {
        if self.min_rate == 0 || self.read_timeout == Duration::MAX {
            return None;
        }
        let earned = Duration::from_secs_f64(received as f64 / self.min_rate as f64);
        started.checked_add(self.read_timeout.saturating_add(earned))
    }
}

/// A request body as the client sends it: decoded by weir's own HTTP/1
/// codec (plain connections), or by hyper (TLS, HTTP/2).
pub enum ClientBody {
    Edge(EdgeBody),
    Hyper(Incoming),
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ClientBody::Edge(b) => Pin::new(b).poll_frame(cx),
            ClientBody::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Edge(b) => b.is_end_stream(),
            ClientBody::Hyper(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::Edge(b) => b.size_hint(),
            ClientBody::Hyper(b) => b.size_hint(),
        }
    }
}

/// The client's request body, on its way upstream.
pub struct RequestBody {
    inner: Option<ClientBody>,
    limits: BodyLimits,
    /// When the first poll found the body not ready (the rate's start).
    started: Option<Instant>,
    received: u64,
    timer: Option<Pin<Box<Sleep>>>,
    /// Where the bytes read are counted; `None` for a body that is empty.
    bytes: Option<Arc<AtomicU64>>,
    /// Read to its end when dropped unfinished ([`RequestBody::drained_when_dropped`]).
    drain: bool,
}

/// What is read of an HTTP/2 request body nobody wants any more, and for how
/// long, before its stream is let go (`RST_STREAM(NO_ERROR)`). A body
/// under this comes whole, as nginx reads and discards one: the client sees
/// its request end cleanly, and a request malformed after its answer (bad
/// trailers, a length its DATA does not make) still gets its
/// `PROTOCOL_ERROR` (RFC 9113 8.1.1), instead of a reset that depended on
/// whether the app answered first. A large upload the app refused early is
/// cut at the bound: its bytes are not worth the wait.
const DRAIN_MAX_BYTES: usize = 256 * 1024;
const DRAIN_MAX_WAIT: Duration = Duration::from_secs(1);

/// Reads and discards what is left of `body`, within the bounds above.
async fn drain(mut body: Incoming) {
    use http_body_util::BodyExt as _;
    let mut left = DRAIN_MAX_BYTES;
    let read = async {
        while let Some(Ok(frame)) = body.frame().await {
            let len = frame.data_ref().map_or(0, Bytes::len);
            left = left.saturating_sub(len);
            if left == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_MAX_WAIT, read).await;
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        if !self.drain {
            return;
        }
        let Some(ClientBody::Hyper(body)) = self.inner.take() else {
            return;
        };
        if body.is_end_stream() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(drain(body));
        }
    }
}

impl RequestBody {
    /// The client's body as the edge hands it over: no read timeout and
    /// not counted until the proxy says ([`RequestBody::watch`]).
    pub fn new(inner: ClientBody) -> Self {
        RequestBody {
            inner: Some(inner),
            limits: BodyLimits::NONE,
            started: None,
            received: 0,
            timer: None,
            bytes: None,
            drain: false,
        }
    }

    /// Sets what the body may take (its wait between pieces, rate and
    /// size), and where its bytes are counted. (Set on the request in
    /// place: wrapping the body once its route is known made a second copy
    /// of the request in every request's future.)
    pub fn watch(&mut self, limits: BodyLimits, bytes: Option<Arc<AtomicU64>>) {
        self.limits = limits;
        self.started = Some(Instant::now());
        self.bytes = bytes;
    }

    /// Read what is left of this body when it is dropped unfinished, within
    /// bounds, before its stream goes: for HTTP/2, where dropping a body
    /// resets its stream (see `DRAIN_MAX_BYTES`). HTTP/1 connections
    /// settle an unread body themselves.
    pub fn drained_when_dropped(mut self) -> Self {
        self.drain = true;
        self
    }

    /// An empty body (for a request re-sent after a connect failure).
    pub fn empty() -> Self {
        RequestBody {
            inner: None,
            limits: BodyLimits::NONE,
            started: None,
            received: 0,
            timer: None,
            bytes: None,
            drain: false,
        }
    }
}

/// weir's own codec's body, as it hands it to the handler.
impl From<EdgeBody> for RequestBody {
    fn from(body: EdgeBody) -> Self {
        RequestBody::new(ClientBody::Edge(body))
    }
}

/// hyper's body (TLS, HTTP/2), as it hands it to the service.
impl From<Incoming> for RequestBody {
    fn from(body: Incoming) -> Self {
        RequestBody::new(ClientBody::Hyper(body))
    }
}

impl RequestBody {
    /// When the body next times out if nothing arrives: the read timeout
    /// from now, or the rate's deadline if sooner.
    fn next_wake(&self, limits: BodyLimits) -> Instant {
        let now = Instant::now();
        let idle = now
            .checked_add(limits.read_timeout)
            .unwrap_or(now + Duration::from_secs(86_400 * 365));
        match self.started.and_then(|s| limits.deadline(s, self.received)) {
            Some(d) => d.min(idle),
            None => idle,
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let limits = this.limits;
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.received += data.len() as u64;
                    if let Some(bytes) = &this.bytes {
                        bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                    }
                    if this.received > limits.max_bytes {
                        let e = BodyTooLarge {
                            max_bytes: limits.max_bytes,
                        };
                        return Poll::Ready(Some(Err(Box::new(e))));
                    }
                }
                if this.timer.is_some() {
                    let wake = this.next_wake(limits);
                    if let Some(t) = this.timer.as_mut() {
                        t.as_mut().reset(wake);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                if limits.read_timeout == Duration::MAX {
                    return Poll::Pending;
                }
                let wake = this.next_wake(limits);
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(wake)));
                ready!(timer.as_mut().poll(cx));
                let too_slow = this
                    .started
                    .and_then(|s| limits.deadline(s, this.received))
                    .is_some_and(|d| Instant::now() >= d);
                if too_slow {
                    let e = BodyTooSlow {
                        min_rate: limits.min_rate,
                    };
                    return Poll::Ready(Some(Err(Box::new(e))));
                }
                Poll::Ready(Some(Err(Box::new(BodyReadTimeout(limits.read_timeout)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint())
    }
}

/// Runs once when a response body ends (or is abandoned).
pub trait OnComplete: Send + Sync + 'static {
    /// `bytes_out`: body bytes sent; `error`: why it did not end cleanly.
    fn complete(self: Box<Self>, bytes_out: u64, error: Option<String>);
}

enum Inner {
    Upstream(UpstreamBody),
    /// Frames already read from the upstream body (a coalescing leader that
    /// gave up buffering), then the rest of it.
    Resumed(std::collections::VecDeque<Frame<Bytes>>, UpstreamBody),
    Full(Option<Bytes>),
}

/// A response body towards the client.
pub struct ResponseBody {
    inner: Inner,
    bytes_out: u64,
    on_complete: Option<Box<dyn OnComplete>>,
    /// The request this answers, finished on the connection once the hook
    /// ran (or the body is dropped): for a codec that lets go of the body
    /// only when it is done with it (hyper).
    request: Option<RequestInProgress>,
    /// Ends with `RST_STREAM(PROTOCOL_ERROR)` instead of `END_STREAM`
    /// ([`ResponseBody::then_reset`]).
    reset_after: bool,
}

impl ResponseBody {
    pub fn upstream(body: UpstreamBody) -> Self {
        ResponseBody {
            inner: Inner::Upstream(body),
            bytes_out: 0,
            on_complete: None,
            request: None,
            reset_after: false,
        }
    }

    /// `read` (frames taken from `rest` already), then the rest of `rest`.
    pub fn resumed(read: std::collections::VecDeque<Frame<Bytes>>, rest: UpstreamBody) -> Self {
        ResponseBody {
            inner: Inner::Resumed(read, rest),
            bytes_out: 0,
            on_complete: None,
            request: None,
            reset_after: false,
        }
    }

    pub fn full(bytes: impl Into<Bytes>) -> Self {
        let b: Bytes = bytes.into();
        ResponseBody {
            inner: Inner::Full((!b.is_empty()).then_some(b)),
            bytes_out: 0,
            on_complete: None,
            request: None,
            reset_after: false,
        }
    }

    pub fn empty() -> Self {
        Self::full(Bytes::new())
    }

    /// Moves those fields into `headers`, for a codec that writes only a
    /// map (hyper's).
    pub fn fields_into(&mut self, headers: &mut http::HeaderMap) {
        if let Inner::Upstream(b) | Inner::Resumed(_, b) = &mut self.inner {
            b.fields_into(headers);
        }
    }

    /// Attaches the completion hook.
    pub fn on_complete(mut self, hook: Box<dyn OnComplete>) -> Self {
        self.on_complete = Some(hook);
        self
    }

    /// Finishes `request` on its connection when the body ends, after the
    /// completion hook (or when the body is dropped).
    pub fn in_progress(mut self, request: RequestInProgress) -> Self {
        self.request = Some(request);
        self
    }

    /// Ends the stream with `RST_STREAM(PROTOCOL_ERROR)` after this body,
    /// not with `END_STREAM`: the answer to a malformed HTTP/2 request,
    /// which RFC 9113 (8.1.1) makes a stream error, after a response if the
    /// server likes. hyper resets with the reason of the `h2::Error` the
    /// body yields; only for HTTP/2 (on HTTP/1 hyper would cut the
    /// connection instead).
    pub fn then_reset(mut self) -> Self {
        self.reset_after = true;
        self
    }

    fn finish(&mut self, error: Option<String>) {
        if let Some(hook) = self.on_complete.take() {
            hook.complete(self.bytes_out, error);
        }
        self.request = None;
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let polled = match &mut this.inner {
            Inner::Upstream(b) => match ready!(Pin::new(b).poll_frame(cx)) {
                Some(Ok(f)) => Some(Ok(f)),
                Some(Err(e)) => Some(Err(BoxError::from(e))),
                None => None,
            },
            Inner::Resumed(read, rest) => match read.pop_front() {
                Some(f) => Some(Ok(f)),
                None => match ready!(Pin::new(rest).poll_frame(cx)) {
                    Some(Ok(f)) => Some(Ok(f)),
                    Some(Err(e)) => Some(Err(BoxError::from(e))),
                    None => None,
                },
            },
            Inner::Full(b) => b.take().map(|d| Ok(Frame::data(d))),
        };
        if polled.is_none() && std::mem::take(&mut this.reset_after) {
            // The answer was sent whole: its line says so, then the reset.
            this.finish(None);
            return Poll::Ready(Some(
                Err(h2::Error::from(h2::Reason::PROTOCOL_ERROR).into()),
            ));
        }
        match &polled {
            Some(Ok(frame)) => {
                if let Some(d) = frame.data_ref() {
                    this.bytes_out += d.len() as u64;
                }
                if this.is_end_stream() {
                    this.finish(None);
                }
            }
            Some(Err(e)) => this.finish(Some(format!("upstream body: {e}"))),
            None => this.finish(None),
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        !self.reset_after
            && match &self.inner {
                Inner::Upstream(b) => b.is_end_stream(),
                Inner::Resumed(read, rest) => read.is_empty() && rest.is_end_stream(),
                Inner::Full(b) => b.is_none(),
            }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Upstream(b) => b.size_hint(),
            Inner::Resumed(read, rest) => {
                let buffered: u64 = read
                    .iter()
                    .filter_map(|f| f.data_ref().map(|d| d.len() as u64))
                    .sum();
                let mut hint = rest.size_hint();
                hint.set_lower(hint.lower() + buffered);
                if let Some(upper) = hint.upper() {
                    hint.set_upper(upper + buffered);
                }
                hint
            }
            Inner::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
        }
    }
}

impl Outgoing for ResponseBody {
    /// An upstream response's fields forwarded as received
    /// ([`crate::fields`]): a client codec writes them after the map's.
    fn received_fields(&self) -> Option<&ReceivedFields> {
        match &self.inner {
            Inner::Upstream(b) | Inner::Resumed(_, b) => b.received_fields(),
            Inner::Full(_) => None,
        }
    }

    fn not_sent(&mut self) {
        self.finish(None);
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        if self.on_complete.is_some() {
            let error = if self.is_end_stream() {
                None
            } else {
                Some("client closed before the response ended".to_string())
            };
            self.finish(error);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_deadline_grows_a_second_per_min_rate_bytes() {
        let limits = BodyLimits {
            read_timeout: Duration::from_secs(2),
            min_rate: 100,
            max_bytes: u64::MAX,
        };
        let t = Instant::now();
        // (bytes received, deadline after start)
        for (received, after) in [(0, 2_000), (100, 3_000), (1_050, 12_500)] {
            let got = limits.deadline(t, received).unwrap();
            assert_eq!(got - t, Duration::from_millis(after), "{received} bytes");
        }
        let off = BodyLimits {
            min_rate: 0,
            ..limits
        };
        assert_eq!(off.deadline(t, 5), None);
        assert_eq!(BodyLimits::NONE.deadline(t, 5), None);
    }
}
