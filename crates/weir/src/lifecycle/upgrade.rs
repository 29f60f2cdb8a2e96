//! In-place upgrade, old side: the upgrade socket, starting the new binary as
//! a child, handing it the listening sockets and limiter state, and deciding
//! (on its `Ready`) that it owns them; plus `weir upgrade`, the operator's
//! client of the same socket.
//!
//! An upgrade must never cause an outage: until the child reports ready the
//! old process keeps accepting, and if the child exits, times out or says
//! anything unexpected the old process stops it, reaps it, logs why, and
//! serves on as before. Both processes hold the same listening sockets
//! during the overlap, so connections waiting in the kernel's accept queue
//! are taken by whichever accepts next; the old process never closes a
//! socket while the new one is not yet accepting.
//!
//! This module does not drain (see `Server::drain`) nor catch signals (see
//! `signals`); it refuses to run as PID 1, where the old process exiting
//! would end the container (docs/operations.md).

use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener as StdUnixListener;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime};

use tokio::net::UnixListener;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::handoff::{
    Channel, HandoffError, Message, SocketMeta, snapshot_from_bytes, snapshot_to_bytes,
};
use super::inherit::{Inherited, InheritedListener, ListeningSocket};
use super::systemd;
use crate::runtime::Runtime;
use weir_limiter::{Clock, MonotonicClock, RestoreReport, Snapshot};

/// The flag a child is started with; its value is the upgrade socket path.
pub const INHERIT_FLAG: &str = "--inherit";
/// How long a failed child gets to stop on SIGTERM before SIGKILL.
const CHILD_STOP_GRACE: Duration = Duration::from_secs(5);
/// How long a connecting peer gets to say what it wants.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);

/// Why an upgrade did not happen (the old process serves on in every case).
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error(
        "refusing an in-place upgrade as PID 1: the old process exiting would end the \
         container (use a blue/green replacement; see docs/operations.md)"
    )]
    Pid1,
    #[error("an upgrade is already in progress")]
    Busy,
    #[error("in-place upgrades are disabled: no upgrade socket")]
    NoSocket,
    #[error("cannot find this executable to start the new version: {0}")]
    Executable(std::io::Error),
    #[error("cannot start the new process `{program}`: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("the new process (pid {pid}) exited with {status} before it was ready")]
    ChildExited { pid: u32, status: ExitStatus },
    #[error("the new process (pid {pid}) did not report ready within {after:?}")]
    Timeout { pid: u32, after: Duration },
    #[error("hand-off to the new process (pid {pid}) failed: {source}")]
    Handoff { pid: u32, source: HandoffError },
    #[error("upgrade socket {path}: {source}")]
    Socket {
        path: String,
        source: std::io::Error,
    },
}

/// The default upgrade socket for a config file: under systemd's
/// `$RUNTIME_DIRECTORY`, else `$XDG_RUNTIME_DIR`, else the temp dir, named
/// after a stable hash of the config file's absolute path (so two weirs with
/// different configs never share one, and old and new binaries agree).
pub fn default_socket_path(config: &Path) -> PathBuf {
    let absolute = std::fs::canonicalize(config).unwrap_or_else(|_| config.to_path_buf());
    let hash = fnv1a(absolute.as_os_str().as_encoded_bytes());
    let name = format!("weir-{hash:016x}.sock");
    for var in ["RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR"] {
        if let Some(dir) = std::env::var_os(var).filter(|d| !d.is_empty()) {
            // RUNTIME_DIRECTORY may list several directories.
            let first = dir
                .to_string_lossy()
                .split(':')
                .next()
                .unwrap_or_default()
                .to_owned();
            return PathBuf::from(first).join(name);
        }
    }
    std::env::temp_dir().join(name)
}

/// FNV-1a: stable across Rust versions, unlike `DefaultHasher`.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The Unix socket this process listens on for upgrade requests.
#[derive(Debug)]
pub struct UpgradeSocket {
    path: PathBuf,
    listener: StdUnixListener,
}

impl UpgradeSocket {
    /// Binds `path` (mode 0600). A stale file from a dead process is replaced;
    /// a socket another live process answers on is an error (two weirs would
    /// otherwise steal each other's upgrades).
    pub fn bind(path: &Path) -> Result<UpgradeSocket, UpgradeError> {
        let err = |source| UpgradeError::Socket {
            path: path.display().to_string(),
            source,
        };
        if path.exists() {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    "another running process listens on it",
                )));
            }
            std::fs::remove_file(path).map_err(err)?;
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let listener = StdUnixListener::bind(path).map_err(err)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
        Ok(UpgradeSocket {
            path: path.to_path_buf(),
            listener,
        })
    }

    /// Wraps the upgrade socket received from the previous process.
    pub fn inherited(path: PathBuf, listener: StdUnixListener) -> UpgradeSocket {
        UpgradeSocket { path, listener }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the socket file (on a stop that hands nothing on).
    pub fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// An operator's `weir upgrade` connection, waiting for the outcome.
#[derive(Debug)]
pub struct OperatorRequest(Channel);

impl OperatorRequest {
    /// Tells the operator how the upgrade ended.
    pub async fn reply(self, outcome: Result<u32, String>) {
        let message = match outcome {
            Ok(pid) => Message::UpgradeResult {
                ok: true,
                new_pid: Some(pid),
                message: format!("upgraded: pid {pid} is serving"),
            },
            Err(why) => Message::UpgradeResult {
                ok: false,
                new_pid: None,
                message: why,
            },
        };
        let _ = self.0.send(&message).await;
    }
}

enum Incoming {
    Take { channel: Channel, pid: u32 },
    Operator(OperatorRequest),
}

/// Runs upgrades for one process: owns the upgrade socket's accept loop and
/// at most one child at a time.
pub struct Upgrader {
    socket: Option<UpgradeSocket>,
    incoming: mpsc::Receiver<Incoming>,
    accept: Option<JoinHandle<()>>,
    ready_timeout: Duration,
}

impl Upgrader {
    /// Starts accepting on `socket` (`None`: upgrades disabled, requests are
    /// refused with a reason). Must run inside a tokio runtime.
    pub fn start(socket: Option<UpgradeSocket>, ready_timeout: Duration) -> Upgrader {
        let (tx, incoming) = mpsc::channel(8);
        let accept = socket.as_ref().and_then(|s| {
            let dup = s.listener.try_clone().ok()?;
            dup.set_nonblocking(true).ok()?;
            let listener = UnixListener::from_std(dup).ok()?;
            Some(tokio::spawn(accept_loop(listener, tx)))
        });
        if socket.is_some() && accept.is_none() {
            tracing::error!("cannot watch the upgrade socket: in-place upgrades are disabled");
        }
        Upgrader {
            socket,
            incoming,
            accept,
            ready_timeout,
        }
    }

    pub fn socket(&self) -> Option<&UpgradeSocket> {
        self.socket.as_ref()
    }

    /// The next `weir upgrade` request. Stray `Take`s (not from a child of an
    /// upgrade in progress) are refused here. Pending forever without a socket.
    pub async fn requested(&mut self) -> OperatorRequest {
        loop {
            match self.incoming.recv().await {
                Some(Incoming::Operator(op)) => return op,
                Some(Incoming::Take { channel, pid }) => {
                    tracing::warn!(
                        pid,
                        "hand-off request from a process this one did not start: refused"
                    );
                    refuse(channel, "no upgrade in progress").await;
                }
                None => std::future::pending::<()>().await,
            }
        }
    }

    /// Starts the current executable as a child and hands it the sockets and
    /// limiter state. On `Ok` the child is accepting and owns the sockets:
    /// the caller must stop accepting and drain (then [`Handover::finish`]).
    /// On `Err` the child has been stopped and reaped.
    pub async fn upgrade(
        &mut self,
        runtime: &Runtime,
        sockets: &[ListeningSocket],
    ) -> Result<Handover, UpgradeError> {
        if std::process::id() == 1 {
            return Err(UpgradeError::Pid1);
        }
        let Some(socket) = &self.socket else {
            return Err(UpgradeError::NoSocket);
        };
        let started = Instant::now();
        systemd::notify_reloading();
        let mut child = spawn_child(socket.path())?;
        let pid = child.id().unwrap_or(0);
        tracing::info!(pid, "upgrade: started the new process");
        let deadline = started + self.ready_timeout;
        let outcome = self
            .hand_over(&mut child, pid, deadline, runtime, sockets)
            .await;
        match outcome {
            Ok(channel) => {
                // Stop taking upgrade requests: the new process answers them
                // from now on (it holds the same socket).
                if let Some(a) = self.accept.take() {
                    a.abort();
                }
                systemd::notify_main_pid(pid);
                if let Err(e) = channel.send(&Message::Committed).await {
                    // The child is accepting already; it will notice the
                    // closed channel and carry on alone.
                    tracing::warn!(error = %e, "upgrade: cannot confirm the hand-off");
                }
                tracing::info!(pid, took = ?started.elapsed(), "upgrade: the new process is serving; draining this one");
                Ok(Handover {
                    channel,
                    _child: child,
                    pid,
                })
            }
            Err(e) => {
                tracing::error!(error = %e, "upgrade failed; this process keeps serving");
                log_child_end(pid, &stop_child(&mut child, pid).await);
                systemd::notify_ready();
                Err(e)
            }
        }
    }

    /// Hands this process's listeners and limiter state to the child `pid`
    /// and waits until it says it serves: the child connects to the
    /// upgrade socket, receives the sockets and the state, and answers
    /// `Ready`, all before `deadline`. Its result is the channel, kept
    /// open until this process has drained.
    async fn hand_over(
        &mut self,
        child: &mut Child,
        pid: u32,
        deadline: Instant,
        runtime: &Runtime,
        sockets: &[ListeningSocket],
    ) -> Result<Channel, UpgradeError> {
        let mut channel = self.child_channel(child, pid, deadline).await?;
        self.send_sockets_and_state(&mut channel, pid, runtime, sockets)
            .await?;
        let timeout = UpgradeError::Timeout {
            pid,
            after: self.ready_timeout,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let ready = tokio::select! {
            status = child.wait() => return Err(child_exited(pid, status)),
            m = channel.recv_message("ready", left) => m,
        };
        match ready {
            Ok(Message::Ready {
                listeners, keys, ..
            }) => {
                tracing::info!(pid, listeners, keys, "upgrade: the new process is ready");
                Ok(channel)
            }
            Ok(other) => Err(UpgradeError::Handoff {
                pid,
                source: HandoffError::Unexpected {
                    expected: "ready",
                    got: format!("{other:?}"),
                },
            }),
            Err(HandoffError::Timeout { .. }) => Err(timeout),
            Err(source) => Err(UpgradeError::Handoff { pid, source }),
        }
    }

    /// Waits for the child `pid` to connect to the upgrade socket (or die,
    /// or run out of time); anyone else who connects meanwhile is refused,
    /// and an operator asking for another upgrade is told one is running.
    async fn child_channel(
        &mut self,
        child: &mut Child,
        pid: u32,
        deadline: Instant,
    ) -> Result<Channel, UpgradeError> {
        loop {
            let next = tokio::select! {
                status = child.wait() => return Err(child_exited(pid, status)),
                _ = tokio::time::sleep_until(deadline.into()) => {
                    return Err(UpgradeError::Timeout {
                        pid,
                        after: self.ready_timeout,
                    });
                }
                next = self.incoming.recv() => next,
            };
            match next {
                Some(Incoming::Take { channel, pid: from }) if from == pid => return Ok(channel),
                Some(Incoming::Take { channel, pid: from }) => {
                    tracing::warn!(
                        from,
                        "hand-off request from a process this one did not start: refused"
                    );
                    refuse(channel, "not the child of this upgrade").await;
                }
                Some(Incoming::Operator(op)) => {
                    op.reply(Err(UpgradeError::Busy.to_string())).await;
                }
                None => return Err(UpgradeError::NoSocket),
            }
        }
    }

    /// Sends the listening sockets (their descriptors, and the upgrade
    /// socket's own) and then the limiter state to the child `pid`.
    async fn send_sockets_and_state(
        &self,
        channel: &mut Channel,
        pid: u32,
        runtime: &Runtime,
        sockets: &[ListeningSocket],
    ) -> Result<(), UpgradeError> {
        let handoff = |source| UpgradeError::Handoff { pid, source };
        let mut metas = Vec::new();
        let mut fds: Vec<BorrowedFd<'_>> = Vec::new();
        for s in sockets {
            metas.push(SocketMeta {
                role: Some(s.role),
                configured: s.configured.to_string(),
                local: s
                    .socket
                    .local_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_default(),
            });
            fds.push(s.socket.as_fd());
        }
        if let Some(socket) = &self.socket {
            metas.push(SocketMeta {
                role: None,
                configured: socket.path.display().to_string(),
                local: socket.path.display().to_string(),
            });
            fds.push(socket.listener.as_fd());
        }
        let message = Message::Sockets {
            generation: runtime.generation,
            sockets: metas,
            admission: crate::state::capture_admission(runtime),
        };
        channel
            .send_with_fds(&message, &fds)
            .await
            .map_err(handoff)?;
        let state = capture_bytes(runtime).await;
        channel.send_blob(&state).await.map_err(handoff)
    }
}

/// Why an upgrade failed when its child ended first (or could not be
/// waited for).
fn child_exited(pid: u32, status: std::io::Result<ExitStatus>) -> UpgradeError {
    match status {
        Ok(status) => UpgradeError::ChildExited { pid, status },
        Err(e) => UpgradeError::Spawn {
            program: "wait".into(),
            source: e,
        },
    }
}

impl Drop for Upgrader {
    fn drop(&mut self) {
        if let Some(a) = self.accept.take() {
            a.abort();
        }
    }
}

/// A committed upgrade: the new process serves; this one drains, then sends
/// its final limiter state with [`Handover::finish`].
pub struct Handover {
    channel: Channel,
    /// Kept so the child is not reaped as an orphan by tokio while this
    /// process still runs; it outlives us (reparented when we exit).
    _child: Child,
    pub pid: u32,
}

impl Handover {
    /// Sends the limiter state as it stands after the drain (requests
    /// finished here after the first hand-off still count).
    pub async fn finish(self, runtime: &Runtime) {
        let state = capture_bytes(runtime).await;
        if let Err(e) = self.channel.send_blob(&state).await {
            tracing::warn!(error = %e, "upgrade: the final limiter state did not reach the new process");
        }
    }
}

async fn refuse(channel: Channel, reason: &str) {
    let _ = channel
        .send(&Message::Refused {
            reason: reason.to_owned(),
        })
        .await;
}

/// Captures the limiter state and encodes it for the channel; empty on error
/// (logged: the new process then starts from its snapshot file or empty).
async fn capture_bytes(runtime: &Runtime) -> Vec<u8> {
    let gw = runtime.gateway.load_full();
    let snapshot = Snapshot::capture(
        runtime.generation,
        &gw.rule_stores,
        MonotonicClock.now(),
        SystemTime::now(),
    );
    let encoded = tokio::task::spawn_blocking(move || snapshot_to_bytes(&snapshot)).await;
    match encoded {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => {
            tracing::error!(error = %e, "upgrade: cannot encode limiter state; the new process starts without it");
            Vec::new()
        }
        Err(e) => {
            tracing::error!(error = %e, "upgrade: limiter state encoding failed");
            Vec::new()
        }
    }
}

/// The running executable as it is on disk now (after a package upgrade
/// replaced the file, `/proc/self/exe` names it with a ` (deleted)` suffix).
fn current_executable() -> Result<PathBuf, UpgradeError> {
    let exe = std::env::current_exe().map_err(UpgradeError::Executable)?;
    let text = exe.as_os_str().to_string_lossy();
    Ok(match text.strip_suffix(" (deleted)") {
        Some(stripped) => PathBuf::from(stripped),
        None => exe,
    })
}

/// This process's arguments without any `--inherit PATH`, plus
/// `--inherit socket`.
pub fn child_args(args: impl IntoIterator<Item = OsString>, socket: &Path) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut skip_next = false;
    for a in args {
        if skip_next {
            skip_next = false;
            continue;
        }
        if a == INHERIT_FLAG {
            skip_next = true;
            continue;
        }
        if a.to_string_lossy().starts_with("--inherit=") {
            continue;
        }
        out.push(a);
    }
    out.push(INHERIT_FLAG.into());
    out.push(socket.as_os_str().to_owned());
    out
}

fn spawn_child(socket: &Path) -> Result<Child, UpgradeError> {
    let program = current_executable()?;
    let args = child_args(std::env::args_os().skip(1), socket);
    // Same process group, cwd, stdout/stderr and environment: the new
    // process is a drop-in replacement (group signals reach it; its logs go
    // where ours went).
    Command::new(&program)
        .args(&args)
        .stdin(Stdio::null())
        .kill_on_drop(false)
        .spawn()
        .map_err(|source| UpgradeError::Spawn {
            program: program.display().to_string(),
            source,
        })
}

/// How a failed new process ended.
#[derive(Debug)]
enum ChildEnd {
    /// It exited by itself or on SIGTERM.
    Stopped(std::process::ExitStatus),
    /// It outlived the grace and got SIGKILL.
    Killed(std::io::Result<std::process::ExitStatus>),
}

/// SIGTERM (the child drains what it may have accepted), then SIGKILL after
/// a grace; always reaped, so a failed upgrade leaves no zombie. A child
/// that has exited already (a bad config fails it at once) is reaped too,
/// and its status reported like any other.
async fn stop_child(child: &mut Child, pid: u32) -> ChildEnd {
    if let Ok(Some(status)) = child.try_wait() {
        return ChildEnd::Stopped(status);
    }
    if let Some(p) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
    }
    match tokio::time::timeout(CHILD_STOP_GRACE, child.wait()).await {
        Ok(Ok(status)) => ChildEnd::Stopped(status),
        _ => {
            let _ = child.start_kill();
            ChildEnd::Killed(child.wait().await)
        }
    }
}

fn log_child_end(pid: u32, end: &ChildEnd) {
    match end {
        ChildEnd::Stopped(status) => {
            tracing::info!(pid, %status, "upgrade: the failed new process stopped")
        }
        ChildEnd::Killed(status) => {
            tracing::warn!(pid, ?status, "upgrade: the failed new process was killed")
        }
    }
}

async fn accept_loop(listener: UnixListener, tx: mpsc::Sender<Incoming>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut channel = Channel::new(stream);
            let hello = channel.recv_message("take or upgrade", HELLO_TIMEOUT).await;
            let incoming = match hello {
                Ok(Message::Take { .. }) => {
                    // Trust the kernel's word for the pid, not the message's.
                    let Some(pid) = channel.peer_pid() else {
                        return refuse(channel, "peer pid unknown").await;
                    };
                    Incoming::Take { channel, pid }
                }
                Ok(Message::Upgrade) => {
                    let ours = rustix::process::getuid().as_raw();
                    match channel.peer_uid() {
                        Some(uid) if uid == ours || uid == 0 => {
                            Incoming::Operator(OperatorRequest(channel))
                        }
                        _ => return refuse(channel, "not the same user").await,
                    }
                }
                Ok(other) => {
                    return refuse(channel, &format!("unexpected {other:?}")).await;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "upgrade socket: bad request");
                    return;
                }
            };
            let _ = tx.send(incoming).await;
        });
    }
}

/// Adopts the handed-over sockets, each with its descriptor: listeners go
/// to `inherited` with the role and address they were configured for; the
/// upgrade socket is returned, to keep listening on for the next upgrade.
fn adopt_sockets(
    sockets: Vec<SocketMeta>,
    fds: Vec<OwnedFd>,
    inherited: &mut Inherited,
) -> Result<Option<UpgradeSocket>, HandoffError> {
    let mut upgrade_socket = None;
    for (meta, fd) in sockets.into_iter().zip(fds) {
        match meta.role {
            Some(role) => {
                let configured = meta.configured.parse().map_err(|e| {
                    HandoffError::BadFrame(format!("socket address `{}`: {e}", meta.configured))
                })?;
                inherited.listeners.push(InheritedListener {
                    tag: Some((role, configured)),
                    listener: std::net::TcpListener::from(fd),
                });
            }
            None => {
                upgrade_socket = Some(UpgradeSocket::inherited(
                    PathBuf::from(meta.configured),
                    StdUnixListener::from(fd),
                ));
            }
        }
    }
    Ok(upgrade_socket)
}

/// New side: what the previous process handed over.
pub struct Taken {
    channel: Channel,
    pub inherited: Inherited,
    /// The upgrade socket, to keep listening on for the next upgrade.
    pub upgrade_socket: Option<UpgradeSocket>,
    pub generation: u64,
}

impl Taken {
    /// Connects to the previous process at `path` and takes its sockets and
    /// limiter state. `timeout` is the previous process's `--upgrade-timeout`
    /// (the child runs with the same arguments): three quarters of it from
    /// now become [`Inherited::ready_by`], so a warm-up ends while the old
    /// process still waits for `Ready`.
    pub async fn connect(path: &Path, timeout: Duration) -> Result<Taken, HandoffError> {
        let ready_by = Instant::now() + timeout * 3 / 4;
        let mut channel = Channel::connect(path).await?;
        channel
            .send(&Message::Take {
                pid: std::process::id(),
            })
            .await?;
        let Message::Sockets {
            generation,
            sockets,
            admission,
        } = channel.recv_message("sockets", timeout).await?
        else {
            return Err(HandoffError::Unexpected {
                expected: "sockets",
                got: "another message".into(),
            });
        };
        let fds = channel.take_fds();
        if fds.len() != sockets.len() {
            return Err(HandoffError::FdCount {
                sent: sockets.len(),
                received: fds.len(),
            });
        }
        let mut inherited = Inherited {
            from_generation: Some(generation),
            ready_by: Some(ready_by),
            admission,
            ..Inherited::default()
        };
        let upgrade_socket = adopt_sockets(sockets, fds, &mut inherited)?;
        let state = channel.recv_blob("limiter state", timeout).await?;
        if !state.is_empty() {
            let snapshot = tokio::task::spawn_blocking(move || snapshot_from_bytes(&state))
                .await
                .map_err(|e| HandoffError::BadFrame(format!("decoding state: {e}")))??;
            inherited.snapshot = Some(snapshot);
        }
        Ok(Taken {
            channel,
            inherited,
            upgrade_socket,
            generation,
        })
    }

    /// Tells the previous process this one is accepting, and waits for it to
    /// stop accepting. Returns the channel on which its final state arrives.
    pub async fn report_ready(
        mut self,
        listeners: usize,
        keys: usize,
        timeout: Duration,
    ) -> Result<FinalState, HandoffError> {
        self.channel
            .send(&Message::Ready {
                pid: std::process::id(),
                listeners,
                keys,
            })
            .await?;
        match self.channel.recv_message("committed", timeout).await? {
            Message::Committed => Ok(FinalState(self.channel)),
            other => Err(HandoffError::Unexpected {
                expected: "committed",
                got: format!("{other:?}"),
            }),
        }
    }
}

/// The previous process's state after its drain, still to come.
pub struct FinalState(Channel);

impl FinalState {
    /// Waits (up to `timeout`: the old drain timeout plus a margin) for the
    /// final state and merges it into `runtime`'s stores (max TAT per key).
    pub async fn merge_into(
        mut self,
        runtime: &Runtime,
        timeout: Duration,
    ) -> Result<Option<RestoreReport>, HandoffError> {
        let bytes = self.0.recv_blob("final limiter state", timeout).await?;
        if bytes.is_empty() {
            return Ok(None);
        }
        let snapshot = tokio::task::spawn_blocking(move || snapshot_from_bytes(&bytes))
            .await
            .map_err(|e| HandoffError::BadFrame(format!("decoding state: {e}")))??;
        Ok(Some(restore(runtime, &snapshot)))
    }
}

/// Puts `snapshot` into the runtime's stores now (keys already present keep
/// the later of the two TATs).
pub fn restore(runtime: &Runtime, snapshot: &Snapshot) -> RestoreReport {
    let gw = runtime.gateway.load();
    snapshot.restore_into(&gw.rule_stores, MonotonicClock.now(), SystemTime::now())
}

/// `weir upgrade`: asks the process listening on `path` to upgrade and waits
/// for the outcome. `Ok(new pid)` or the reason it failed.
pub async fn request(path: &Path, timeout: Duration) -> Result<u32, String> {
    let mut channel = Channel::connect(path).await.map_err(|e| e.to_string())?;
    channel
        .send(&Message::Upgrade)
        .await
        .map_err(|e| e.to_string())?;
    match channel.recv_message("upgrade result", timeout).await {
        Ok(Message::UpgradeResult {
            ok: true,
            new_pid: Some(pid),
            ..
        }) => Ok(pid),
        Ok(Message::UpgradeResult { message, .. }) => Err(message),
        Ok(other) => Err(format!("unexpected answer {other:?}")),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a child that had exited before the old process looked
    /// (its config was bad) went unreported, and the log never said how it
    /// ended (CI, 2026-12-02).
    #[tokio::test]
    async fn a_child_that_exited_already_is_reported_with_its_status() {
        let mut child = Command::new("sh").args(["-c", "exit 2"]).spawn().unwrap();
        let pid = child.id().unwrap();
        // Wait for the exit without reaping it: the zombie is what
        // stop_child sees when the config error came first.
        let raw = rustix::process::Pid::from_raw(pid as i32).unwrap();
        let waited = rustix::process::waitid(
            rustix::process::WaitId::Pid(raw),
            rustix::process::WaitIdOptions::EXITED | rustix::process::WaitIdOptions::NOWAIT,
        );
        assert!(waited.is_ok(), "{waited:?}");
        match stop_child(&mut child, pid).await {
            ChildEnd::Stopped(status) => assert_eq!(status.code(), Some(2)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn child_args_replace_any_previous_inherit() {
        let s = Path::new("/run/weir/u.sock");
        let os = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        // (this process's args, the child's)
        let cases: [(&[&str], &[&str]); 4] = [
            (
                &["run", "-c", "w.toml"],
                &["run", "-c", "w.toml", "--inherit", "/run/weir/u.sock"],
            ),
            (
                &["run", "--inherit", "/old", "-c", "w.toml"],
                &["run", "-c", "w.toml", "--inherit", "/run/weir/u.sock"],
            ),
            (
                &["run", "--inherit=/old"],
                &["run", "--inherit", "/run/weir/u.sock"],
            ),
            (
                &["run", "--inherit"],
                &["run", "--inherit", "/run/weir/u.sock"],
            ),
        ];
        for (args, want) in cases {
            assert_eq!(child_args(os(args), s), os(want), "{args:?}");
        }
    }

    #[test]
    fn default_socket_path_is_stable_and_per_config() {
        let a = default_socket_path(Path::new("/nonexistent/a/weir.toml"));
        let b = default_socket_path(Path::new("/nonexistent/b/weir.toml"));
        assert_ne!(a, b);
        assert_eq!(
            a,
            default_socket_path(Path::new("/nonexistent/a/weir.toml"))
        );
        assert!(a.to_string_lossy().ends_with(".sock"), "{}", a.display());
        // FNV-1a test vectors: the name must not change between versions.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn a_live_socket_is_not_stolen_and_a_stale_one_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.sock");
        let first = UpgradeSocket::bind(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let err = UpgradeSocket::bind(&path).unwrap_err().to_string();
        assert!(err.contains("another running process"), "{err}");
        drop(first); // the file stays, nobody listens: stale
        assert!(path.exists());
        UpgradeSocket::bind(&path).unwrap();
    }
}
