//! The state a client connection shares with whoever supervises it: the
//! request counts and idle times the supervisor's sweep reads, and the
//! commands (close gracefully, abort, give buffers back) it gives.
//!
//! The connection's codec ([`crate::server`], or hyper) obeys the commands;
//! the supervisor (weir's connection tracker) decides when to give them.
//! This module holds no policy of its own beyond how long a closing
//! connection may wait for its next request ([`close_grace`]).

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// What the connection's task is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    None = 0,
    /// Finish the request in flight (if any), then close.
    Graceful = 1,
    /// Close now: the client is stalling (slow headers).
    Abort = 2,
}

/// Shared state of one client connection.
#[derive(Debug)]
pub struct ConnState {
    pub id: u64,
    opened_ms: u64,
    in_flight: AtomicU32,
    requests: AtomicU64,
    /// When the connection last became idle (ms on the tracker clock).
    idle_since_ms: AtomicU64,
    /// When its requests in flight began (ms; the first of them, when
    /// several overlap on HTTP/2).
    busy_since_ms: AtomicU64,
    /// When bytes of a next request arrived while idle (0: none pending).
    pending_since_ms: AtomicU64,
    /// Since when writes to the client have found its window full with no
    /// byte written since (ms; 0: not stalled): the send timeout.
    write_stalled_since_ms: AtomicU64,
    /// HTTP/2 connections are exempt from the pending-bytes rule (pings and
    /// settings arrive while idle).
    h2: AtomicBool,
    command: AtomicU8,
    /// Whether the connection's buffers are to go back to the allocator
    /// (`server`): 0 held, 1 asked by the sweep (idle for
    /// [`RELEASE_AFTER`]), 2 given back. Asked once per idle spell.
    release: AtomicU8,
    close_reason: Mutex<Option<&'static str>>,
    notify: Notify,
    /// The task of a connection served by `server`, woken by a command
    /// (cheaper per request than registering with `notify`).
    waker: atomic_waker::AtomicWaker,
    clock: Arc<ConnClock>,
}

/// A request in progress on a connection: counted as started when made
/// ([`ConnState::start_request`]), as finished when dropped (its response
/// ended or was abandoned, or the request was dropped before one began).
#[derive(Debug)]
pub struct RequestInProgress(Arc<ConnState>);

impl Drop for RequestInProgress {
    fn drop(&mut self) {
        self.0.request_finished();
    }
}

impl ConnState {
    /// A connection opened now, with the supervisor's id for it.
    pub fn new(id: u64, clock: Arc<ConnClock>) -> ConnState {
        let now = clock.now_ms();
        ConnState {
            id,
            opened_ms: now,
            in_flight: AtomicU32::new(0),
            requests: AtomicU64::new(0),
            idle_since_ms: AtomicU64::new(now),
            busy_since_ms: AtomicU64::new(now),
            pending_since_ms: AtomicU64::new(0),
            write_stalled_since_ms: AtomicU64::new(0),
            h2: AtomicBool::new(false),
            command: AtomicU8::new(0),
            release: AtomicU8::new(0),
            close_reason: Mutex::new(None),
            notify: Notify::new(),
            waker: atomic_waker::AtomicWaker::new(),
            clock,
        }
    }

    /// When the connection was opened (ms on its clock).
    pub fn opened_ms(&self) -> u64 {
        self.opened_ms
    }

    /// When it last became idle (ms on its clock).
    pub fn idle_since_ms(&self) -> u64 {
        self.idle_since_ms.load(Ordering::Relaxed)
    }

    /// When bytes of a next request arrived while it was idle; 0: none.
    pub fn pending_since_ms(&self) -> u64 {
        self.pending_since_ms.load(Ordering::Relaxed)
    }

    /// Asks an idle connection to give its buffers back (once per idle
    /// spell: each ask wakes its task). Returns whether it asked.
    pub fn ask_release(&self) -> bool {
        let asked = self
            .release
            .compare_exchange(0, 1, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok();
        if asked {
            self.waker.wake();
        }
        asked
    }

    /// A request started on this connection, finished when what this
    /// returns is dropped: the codec that read the request holds it until
    /// the response is written (HTTP/1) or hands it to the response body
    /// (hyper: [`crate::body::ResponseBody::in_progress`]). So the
    /// supervisor's counts hold whatever handler serves the request.
    pub fn start_request(self: &Arc<Self>, h2: bool) -> RequestInProgress {
        self.request_started(h2);
        RequestInProgress(self.clone())
    }

    /// A request started on this connection ([`ConnState::start_request`]
    /// pairs it with its finish).
    pub fn request_started(&self, h2: bool) {
        if h2 {
            self.h2.store(true, Ordering::Relaxed);
        }
        if self.in_flight.fetch_add(1, Ordering::Relaxed) == 0 {
            self.busy_since_ms
                .store(self.clock.now_ms(), Ordering::Relaxed);
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.pending_since_ms.store(0, Ordering::Relaxed);
        self.release.store(0, Ordering::Relaxed);
    }

    /// A request's response ended (body complete or abandoned).
    pub fn request_finished(&self) {
        if self.in_flight.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.idle_since_ms
                .store(self.clock.now_ms(), Ordering::Relaxed);
        }
    }

    /// Bytes arrived from the client (called by the I/O wrapper).
    pub fn bytes_read(&self) {
        if self.in_flight.load(Ordering::Relaxed) == 0
            && !self.h2.load(Ordering::Relaxed)
            && self.pending_since_ms.load(Ordering::Relaxed) == 0
        {
            self.pending_since_ms
                .store(self.clock.now_ms().max(1), Ordering::Relaxed);
        }
    }

    /// A write to the client could not proceed (its receive window is
    /// full). Marks the start of a stall, if one is not already running.
    pub fn write_blocked(&self) {
        if self.write_stalled_since_ms.load(Ordering::Relaxed) == 0 {
            self.write_stalled_since_ms
                .store(self.clock.now_ms().max(1), Ordering::Relaxed);
        }
    }

    /// Bytes were written to the client: no stall.
    pub fn write_progressed(&self) {
        if self.write_stalled_since_ms.load(Ordering::Relaxed) != 0 {
            self.write_stalled_since_ms.store(0, Ordering::Relaxed);
        }
    }

    /// Since when writes have stalled (ms on the clock; 0: they have not).
    pub fn write_stalled_since_ms(&self) -> u64 {
        self.write_stalled_since_ms.load(Ordering::Relaxed)
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// How long its requests in flight have run, if it has any (the
    /// oldest's time, when several overlap).
    pub fn busy_for(&self) -> Option<Duration> {
        if self.in_flight() == 0 {
            return None;
        }
        let since = self.busy_since_ms.load(Ordering::Relaxed);
        Some(Duration::from_millis(
            self.clock.now_ms().saturating_sub(since),
        ))
    }

    /// How long the connection has been between requests, if it is (and has
    /// served at least one).
    pub fn idle_for(&self) -> Option<Duration> {
        if self.in_flight() > 0 || self.requests() == 0 {
            return None;
        }
        let since = self.idle_since_ms.load(Ordering::Relaxed);
        Some(Duration::from_millis(
            self.clock.now_ms().saturating_sub(since),
        ))
    }

    /// Requests started on this connection so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    pub fn command(&self) -> Command {
        match self.command.load(Ordering::Acquire) {
            1 => Command::Graceful,
            2 => Command::Abort,
            _ => Command::None,
        }
    }

    /// Waits until a command at least as strong as `min` is given.
    pub async fn wait_for(&self, min: Command) -> Command {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Register before checking, so a command given in between is seen.
            notified.as_mut().enable();
            let c = self.command();
            if c as u8 >= min as u8 {
                return c;
            }
            notified.await;
        }
    }

    /// Polls for a command at least as strong as `min`.
    pub fn poll_command(
        &self,
        min: Command,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Command> {
        self.waker.register(cx.waker());
        let c = self.command();
        if c as u8 >= min as u8 {
            std::task::Poll::Ready(c)
        } else {
            std::task::Poll::Pending
        }
    }

    /// Polls for the sweep's word that the connection has been idle long
    /// enough to give its buffers back; clears it.
    pub fn poll_release(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        self.waker.register(cx.waker());
        if self
            .release
            .compare_exchange(1, 2, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    }

    /// Gives a command; a stronger one replaces a weaker one. Returns whether
    /// it changed anything.
    pub fn give(&self, cmd: Command, reason: &'static str) -> bool {
        let prev = self.command.fetch_max(cmd as u8, Ordering::AcqRel);
        if prev >= cmd as u8 {
            return false;
        }
        if let Ok(mut r) = self.close_reason.lock() {
            *r = Some(reason);
        }
        self.notify.notify_waiters();
        self.waker.wake();
        true
    }

    /// Why weir closed this connection, if it did.
    pub fn close_reason(&self) -> Option<&'static str> {
        self.close_reason.lock().ok().and_then(|r| *r)
    }
}

/// How long a connection is idle before the sweep asks it to give its
/// buffers back. Kept until then, a busy connection reuses its buffer in
/// place; allocated per request, buffers of a thousand busy connections
/// overflow the allocator's thread cache, and each one costs a trip to its
/// arena (bench/README.md, "Client HTTP/1").
pub const RELEASE_AFTER: Duration = Duration::from_secs(1);

/// A monotonic millisecond clock shared by a supervisor and its
/// connections: timestamps kept as `u64` fit in atomics.
#[derive(Debug)]
pub struct ConnClock {
    epoch: Instant,
}

impl ConnClock {
    pub fn new() -> Arc<ConnClock> {
        Arc::new(ConnClock {
            epoch: Instant::now(),
        })
    }

    /// Milliseconds since the clock was made.
    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// `t` in this clock's milliseconds.
    pub fn ms_at(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_millis() as u64
    }
}

/// How long a connection asked to close may still bring its first request.
const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(5);

/// How long an idle kept-alive connection may still bring one more request
/// once a drain began (an upgrade, SIGTERM): a busy client's next request is
/// answered, with `Connection: close`, instead of meeting a closed socket.
const DRAIN_IDLE_GRACE: Duration = Duration::from_secs(1);

/// How long a close just commanded waits for the connection's next request;
/// `None`: close now (a request is in flight, which the codec then finishes,
/// or the close is to free the slot: idle timeout, shedding).
pub fn close_grace(state: &ConnState) -> Option<Duration> {
    if state.requests() == 0 {
        Some(FIRST_REQUEST_GRACE)
    } else if state.in_flight() == 0 && state.close_reason() == Some("drain") {
        Some(DRAIN_IDLE_GRACE)
    } else {
        None
    }
}
