//! A spawned server process that is always reaped: the shared core of the
//! nginx, HAProxy, Redis and weir guards.
//!
//! Owns: spawning in its own process group with stdout/stderr captured to
//! files, waiting for TCP ports to accept with a deadline, signals, and the
//! stop sequence on drop (SIGTERM, a short grace, SIGKILL to the whole group,
//! then `wait`). PID 1 on the test machines reaps orphans late, so every
//! process started here is waited for by us.
//!
//! Does not: know any server's config format (see `nginx.rs`, `haproxy.rs`,
//! `redis.rs`, `weir.rs`) or retry anything; callers decide that.

use std::fs;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal as RawSignal};

/// A closure that writes a server's config for the listen addresses the
/// fixture allocated (nginx's `http {}` body, HAProxy's sections).
pub trait ConfigFn: Fn(&[SocketAddr]) -> String + Send + Sync + 'static {}
impl<F: Fn(&[SocketAddr]) -> String + Send + Sync + 'static> ConfigFn for F {}

/// A [`ConfigFn`] a builder keeps until the server starts (or reloads).
pub type ConfigBody = Box<dyn ConfigFn>;

/// How long a server gets to start accepting on its ports.
pub const START_DEADLINE: Duration = Duration::from_secs(15);
/// How long a server gets to stop on SIGTERM before the group is killed.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// Polling period while waiting for ports, files and exits: short enough not to
/// slow tests, long enough not to burn a core on a 2-core machine.
pub const POLL: Duration = Duration::from_millis(10);

/// Why a fixture could not start or control its server. Every message names the
/// server and, when it failed to start, carries its logs.
#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    #[error("{server}: cannot create {what}: {source}")]
    Setup {
        server: String,
        what: String,
        source: std::io::Error,
    },
    #[error("{server}: cannot spawn {program}: {source}")]
    Spawn {
        server: String,
        program: String,
        source: std::io::Error,
    },
    #[error("{server}: exited with {status} before it was ready\n{logs}")]
    ExitedEarly {
        server: String,
        status: ExitStatus,
        logs: String,
    },
    #[error("{server}: not ready after {waited:?} ({what})\n{logs}")]
    NotReady {
        server: String,
        waited: Duration,
        what: String,
        logs: String,
    },
    #[error("{server}: cannot send {signal:?} to pid {pid}: {source}")]
    Signal {
        server: String,
        signal: Signal,
        pid: u32,
        source: std::io::Error,
    },
    #[error("{server}: still running after {waited:?}")]
    StillRunning { server: String, waited: Duration },
}

/// Signals tests send to servers (a closed set, so tests never pass raw numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Hup,
    Term,
    Int,
    Quit,
    Usr1,
    Usr2,
    Kill,
    /// Stops the process where it is (it holds its sockets, answers nothing).
    Stop,
    Cont,
}

impl Signal {
    fn raw(self) -> RawSignal {
        match self {
            Signal::Hup => RawSignal::HUP,
            Signal::Term => RawSignal::TERM,
            Signal::Int => RawSignal::INT,
            Signal::Quit => RawSignal::QUIT,
            Signal::Usr1 => RawSignal::USR1,
            Signal::Usr2 => RawSignal::USR2,
            Signal::Kill => RawSignal::KILL,
            Signal::Stop => RawSignal::STOP,
            Signal::Cont => RawSignal::CONT,
        }
    }
}

/// Sends `signal` to one process.
pub fn send_signal(server: &str, pid: u32, signal: Signal) -> Result<(), FixtureError> {
    let to_err = |source: std::io::Error| FixtureError::Signal {
        server: server.to_owned(),
        signal,
        pid,
        source,
    };
    let raw_pid = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| to_err(std::io::Error::other("not a valid pid")))?;
    rustix::process::kill_process(raw_pid, signal.raw()).map_err(|e| to_err(e.into()))
}

/// A running server process. Dropping it stops and reaps it (and its group).
#[derive(Debug)]
pub struct ServerProcess {
    name: String,
    child: Child,
    exit: Option<ExitStatus>,
    stdout: PathBuf,
    stderr: PathBuf,
    /// Extra log files (e.g. nginx's error_log) shown when the server fails.
    extra_logs: Vec<PathBuf>,
}

impl ServerProcess {
    /// Spawns `command` in its own process group, stdout/stderr to
    /// `<dir>/<name>.stdout` and `<dir>/<name>.stderr`.
    pub fn spawn(
        name: &str,
        mut command: Command,
        dir: &Path,
        extra_logs: Vec<PathBuf>,
    ) -> Result<Self, FixtureError> {
        let stdout = dir.join(format!("{name}.stdout"));
        let stderr = dir.join(format!("{name}.stderr"));
        let open = |path: &Path| {
            fs::File::create(path).map_err(|source| FixtureError::Setup {
                server: name.to_owned(),
                what: path.display().to_string(),
                source,
            })
        };
        command
            .stdin(Stdio::null())
            .stdout(open(&stdout)?)
            .stderr(open(&stderr)?)
            // Own group: a SIGKILL on drop reaches nginx's workers too.
            .process_group(0);
        let child = command.spawn().map_err(|source| FixtureError::Spawn {
            server: name.to_owned(),
            program: command.get_program().to_string_lossy().into_owned(),
            source,
        })?;
        Ok(Self {
            name: name.to_owned(),
            child,
            exit: None,
            stdout,
            stderr,
            extra_logs,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stdout_path(&self) -> &Path {
        &self.stdout
    }

    pub fn stderr_path(&self) -> &Path {
        &self.stderr
    }

    /// Everything the server has written to stdout so far.
    pub fn stdout(&self) -> String {
        fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// Everything the server has written to stderr so far.
    pub fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// All captured output and extra logs, labelled, for error messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for path in [&self.stdout, &self.stderr]
            .into_iter()
            .chain(&self.extra_logs)
        {
            let text = fs::read_to_string(path).unwrap_or_else(|e| format!("<unreadable: {e}>"));
            out.push_str(&format!(
                "--- {} ---\n{}\n",
                path.display(),
                text.trim_end()
            ));
        }
        out
    }

    /// The exit status if the process has exited (reaping it), else `None`.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
        }
        self.exit
    }

    pub fn signal(&self, signal: Signal) -> Result<(), FixtureError> {
        send_signal(&self.name, self.pid(), signal)
    }

    /// Waits (polling, async) until the process exits or `deadline` passes.
    pub async fn wait_exit(&mut self, deadline: Duration) -> Result<ExitStatus, FixtureError> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.try_exit() {
                return Ok(status);
            }
            if start.elapsed() >= deadline {
                return Err(FixtureError::StillRunning {
                    server: self.name.clone(),
                    waited: deadline,
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Fails early (with logs) if the process has already exited.
    pub fn check_running(&mut self) -> Result<(), FixtureError> {
        match self.try_exit() {
            Some(status) => Err(FixtureError::ExitedEarly {
                server: self.name.clone(),
                status,
                logs: self.logs(),
            }),
            None => Ok(()),
        }
    }

    /// Waits until every address accepts a TCP connection, failing with the
    /// server's logs if it exits first or `deadline` passes. The probe is a
    /// real connection, opened and closed at once: a TCP proxy forwards it, so
    /// a backend behind it may see one empty connection per port.
    pub async fn wait_accepting(
        &mut self,
        addrs: &[SocketAddr],
        deadline: Duration,
    ) -> Result<(), FixtureError> {
        let start = Instant::now();
        for addr in addrs {
            loop {
                self.check_running()?;
                if tokio::net::TcpStream::connect(addr).await.is_ok() {
                    break;
                }
                if start.elapsed() >= deadline {
                    return Err(FixtureError::NotReady {
                        server: self.name.clone(),
                        waited: deadline,
                        what: format!("{addr} does not accept connections"),
                        logs: self.logs(),
                    });
                }
                tokio::time::sleep(POLL).await;
            }
        }
        Ok(())
    }

    /// SIGTERM, a short grace, then SIGKILL to the whole group; always reaps.
    fn stop(&mut self) {
        if self.try_exit().is_some() {
            return;
        }
        let _ = self.signal(Signal::Term);
        let start = Instant::now();
        while start.elapsed() < STOP_GRACE {
            if self.try_exit().is_some() {
                return;
            }
            std::thread::sleep(POLL);
        }
        // The group id is the leader's pid (process_group(0)); the leader is
        // not reaped yet, so the id cannot have been reused. This also ends any
        // worker an nginx master would leave behind.
        if let Some(pgid) = i32::try_from(self.pid()).ok().and_then(Pid::from_raw) {
            let _ = rustix::process::kill_process_group(pgid, RawSignal::KILL);
        }
        self.exit = self.child.wait().ok();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Makes a fresh temp dir for one server instance.
pub fn temp_dir(server: &str) -> Result<tempfile::TempDir, FixtureError> {
    tempfile::Builder::new()
        .prefix(&format!("weir-it-{server}-"))
        .tempdir()
        .map_err(|source| FixtureError::Setup {
            server: server.to_owned(),
            what: "temp dir".to_owned(),
            source,
        })
}

/// Writes `contents` to `path`, naming the server on failure.
pub fn write_file(server: &str, path: &Path, contents: &str) -> Result<(), FixtureError> {
    fs::write(path, contents).map_err(|source| FixtureError::Setup {
        server: server.to_owned(),
        what: path.display().to_string(),
        source,
    })
}
