//! An I/O wrapper that tells the connection tracker when client bytes arrive,
//! so a request head that trickles in on a kept-alive connection is timed
//! (hyper times only the first request's head), and when writes to the
//! client stall and move again (the send timeout). Used for the connections
//! hyper serves (TLS, HTTP/2); `weir_http::server` reports its reads itself.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::conn::ConnState;

/// A client stream whose reads are reported to its [`ConnState`].
pub struct TrackedIo<S> {
    inner: S,
    state: Arc<ConnState>,
}

impl<S> TrackedIo<S> {
    pub fn new(inner: S, state: Arc<ConnState>) -> Self {
        TrackedIo { inner, state }
    }

    /// Tells the state whether a write stalled or moved (the send timeout).
    fn wrote(&self, polled: &Poll<io::Result<usize>>) {
        match polled {
            Poll::Pending => self.state.write_blocked(),
            Poll::Ready(Ok(n)) if *n > 0 => self.state.write_progressed(),
            Poll::Ready(_) => {}
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for TrackedIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let res = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(res, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.state.bytes_read();
        }
        res
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for TrackedIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.wrote(&polled);
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.wrote(&polled);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
