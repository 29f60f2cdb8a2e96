//! The signals a weir process obeys, installed once at start (before the
//! ready file is written, so a signal right after readiness is never met by
//! the default action, which would kill the process):
//!
//! | signal          | serving            | draining  |
//! |-----------------|--------------------|-----------|
//! | SIGTERM, SIGINT | drain, then exit 0 | stop now  |
//! | SIGQUIT         | stop now           | stop now  |
//! | SIGHUP          | reload config      | ignored   |
//! | SIGUSR1         | reopen access log  | ignored   |
//! | SIGUSR2         | in-place upgrade   | ignored   |
//!
//! As PID 1 the kernel applies no default action to these, so each must be
//! handled here or it would be ignored. This module only reports signals; the
//! caller acts on them.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// What a signal asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// Finish in-flight requests, then exit.
    Drain,
    /// Close everything now.
    StopNow,
    /// Re-read the configuration.
    Reload,
    /// Replace this process with the executable on disk.
    Upgrade,
    /// Reopen the access-log file (after logrotate moved it).
    ReopenLogs,
}

/// Installed handlers.
pub struct Signals {
    term: Signal,
    int: Signal,
    quit: Signal,
    hup: Signal,
    usr1: Signal,
    usr2: Signal,
}

impl Signals {
    /// Installs every handler. Must run inside a tokio runtime.
    pub fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            quit: signal(SignalKind::quit())?,
            hup: signal(SignalKind::hangup())?,
            usr1: signal(SignalKind::user_defined1())?,
            usr2: signal(SignalKind::user_defined2())?,
        })
    }

    /// The next request while serving.
    pub async fn next(&mut self) -> Request {
        tokio::select! {
            _ = self.term.recv() => Request::Drain,
            _ = self.int.recv() => Request::Drain,
            _ = self.quit.recv() => Request::StopNow,
            _ = self.hup.recv() => Request::Reload,
            _ = self.usr1.recv() => Request::ReopenLogs,
            _ = self.usr2.recv() => Request::Upgrade,
        }
    }

    /// Resolves on the signal that cuts a drain short: a second SIGTERM or
    /// SIGINT, or SIGQUIT.
    pub async fn stop_now(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
            _ = self.quit.recv() => {}
        }
    }
}
