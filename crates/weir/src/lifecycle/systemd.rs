//! systemd integration: socket activation (`LISTEN_FDS`/`LISTEN_PID`,
//! descriptors from 3) and readiness notification (`READY=1`, `RELOADING=1`,
//! `STOPPING=1`, `MAINPID=` over `$NOTIFY_SOCKET`).
//!
//! Both are no-ops outside systemd (no variables set), so weir calls them
//! unconditionally. Activated sockets are taken with `listenfd`, which checks
//! `LISTEN_PID`, marks each descriptor close-on-exec (so an upgrade child does
//! not inherit strays) and clears the variables; it must run before any
//! thread starts, i.e. before the tokio runtime.
//!
//! This module does not bind anything nor decide which configured listener
//! an activated socket serves (see `inherit`).

use sd_notify::NotifyState;

use super::inherit::InheritedListener;

/// Takes every socket systemd passed to this process (none outside systemd).
/// Call before starting threads: it clears `LISTEN_*` from the environment.
pub fn activated_listeners() -> Vec<InheritedListener> {
    let mut fds = listenfd::ListenFd::from_env();
    let mut out = Vec::new();
    for i in 0..fds.len() {
        match fds.take_tcp_listener(i) {
            Ok(Some(listener)) => out.push(InheritedListener {
                tag: None,
                listener,
            }),
            Ok(None) => {}
            Err(e) => {
                tracing::error!(index = i, error = %e, "socket activation: descriptor is not a TCP listener; ignored");
            }
        }
    }
    if !out.is_empty() {
        tracing::info!(
            sockets = out.len(),
            "socket activation: received listening sockets"
        );
    }
    out
}

fn notify(states: &[NotifyState]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "cannot notify the service manager");
    }
}

/// Serving: `READY=1`, with `MAINPID` (a new process after an upgrade is the
/// service's main process).
pub fn notify_ready() {
    notify(&[NotifyState::MainPid(std::process::id()), NotifyState::Ready]);
}

/// An upgrade started: `RELOADING=1` (with the timestamp `Type=notify-reload`
/// wants).
pub fn notify_reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => notify(&[NotifyState::Reloading, now]),
        Err(_) => notify(&[NotifyState::Reloading]),
    }
}

/// The upgrade committed: the child is the main process now. Sent by the old
/// process, which systemd still accepts notifications from.
pub fn notify_main_pid(pid: u32) {
    notify(&[NotifyState::MainPid(pid), NotifyState::Ready]);
}

/// A drain started: `STOPPING=1`.
pub fn notify_stopping() {
    notify(&[NotifyState::Stopping]);
}
