//! weir as the operator runs it: `weir run -c FILE --ready-file FILE` as a
//! child process, signalled, upgraded with `weir upgrade`, and waited for.
//!
//! Owns one weir generation's life: spawn (optionally on a listening socket
//! handed over as systemd's socket activation does), wait for the ready
//! file, signal, wait for the exit and reap. An upgraded generation is the
//! old one's child: the caller makes itself a child subreaper
//! ([`become_subreaper`]) so it inherits and reaps it.
//!
//! Does not: write configurations ([`super::front`] does) or judge anything.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rustix::process::{Pid, Signal, WaitOptions, kill_process};
use tokio::time::Instant;

/// How long a generation gets to write its ready file.
const READY_WITHIN: Duration = Duration::from_secs(15);
/// How long a drain may take before the run calls it stuck (weir's own
/// deadline is 30 s by default).
const EXIT_WITHIN: Duration = Duration::from_secs(40);
const POLL: Duration = Duration::from_millis(5);

/// Why weir could not be run or stopped as asked.
#[derive(Debug, thiserror::Error)]
pub enum WeirProcessError {
    #[error("cannot start {binary}: {source}")]
    Spawn {
        binary: String,
        source: std::io::Error,
    },
    #[error("weir was not ready within {READY_WITHIN:?}; it said:\n{log}")]
    NotReady { log: String },
    #[error("weir (pid {pid}) did not exit within {EXIT_WITHIN:?} of SIGTERM; it said:\n{log}")]
    Stuck { pid: u32, log: String },
    #[error("weir (pid {pid}) exited with {code:?}; it said:\n{log}")]
    Failed {
        pid: u32,
        code: Option<i32>,
        log: String,
    },
    #[error("`weir upgrade` failed ({status}): {output}")]
    Upgrade { status: String, output: String },
}

/// Makes this process the reaper of orphaned descendants: an upgraded weir
/// outlives its parent, and would otherwise linger as a zombie.
pub fn become_subreaper() {
    // Best effort: without it an upgraded generation's exit is still seen
    // (its pid disappears), only later.
    let _ = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
}

/// What a generation wrote in its ready file.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Ready {
    pub listeners: Vec<SocketAddr>,
    pub pid: u32,
}

/// One weir generation.
pub struct WeirProcess {
    /// The spawned child, when this generation is one (an upgraded one is
    /// the previous generation's child).
    child: Option<Child>,
    pub pid: u32,
    pub ready: Ready,
    /// From the spawn to the ready file: start-up to listening.
    pub started_in: Duration,
    /// Where the generation writes its ready file (an upgraded one writes
    /// its predecessor's: it runs with the same arguments).
    ready_path: PathBuf,
    stderr: PathBuf,
}

impl WeirProcess {
    /// Runs `binary run -c config --ready-file ready`, its access log to
    /// `dir/access.N.log` and its own log to `dir/weir.N.log`; with
    /// `activated`, that listening socket is descriptor 3 and
    /// `LISTEN_FDS=1`, as systemd starts a socket-activated service.
    pub async fn start(
        binary: &Path,
        config: &Path,
        dir: &Path,
        generation: usize,
        activated: Option<&std::net::TcpListener>,
    ) -> Result<WeirProcess, WeirProcessError> {
        let ready = dir.join(format!("ready.{generation}.json"));
        let stderr = dir.join(format!("weir.{generation}.log"));
        let spawn = |source| WeirProcessError::Spawn {
            binary: binary.display().to_string(),
            source,
        };
        let out =
            std::fs::File::create(dir.join(format!("access.{generation}.log"))).map_err(spawn)?;
        let err = std::fs::File::create(&stderr).map_err(spawn)?;
        let mut command = match activated {
            // The shell puts the socket on descriptor 3 and names itself
            // (LISTEN_PID) before it becomes weir.
            Some(socket) => {
                let fd = socket.try_clone().map_err(spawn)?;
                let mut c = Command::new("/bin/sh");
                c.arg("-c")
                    .arg(r#"exec 3<&0 0</dev/null; LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" "$@""#)
                    .arg(binary)
                    .stdin(Stdio::from(std::os::fd::OwnedFd::from(fd)));
                c
            }
            None => {
                let mut c = Command::new(binary);
                c.stdin(Stdio::null());
                c
            }
        };
        command
            .args(["run", "-c"])
            .arg(config)
            .arg("--ready-file")
            .arg(&ready)
            .stdout(out)
            .stderr(err);
        let spawned = Instant::now();
        let child = command.spawn().map_err(spawn)?;
        let mut process = WeirProcess {
            started_in: Duration::ZERO,
            pid: child.id(),
            child: Some(child),
            ready: Ready {
                listeners: Vec::new(),
                pid: 0,
            },
            ready_path: ready.clone(),
            stderr,
        };
        process.ready = process.wait_ready(&ready).await?;
        process.started_in = spawned.elapsed();
        Ok(process)
    }

    async fn wait_ready(&mut self, path: &Path) -> Result<Ready, WeirProcessError> {
        let started = Instant::now();
        loop {
            if let Some(ready) = std::fs::read_to_string(path)
                .ok()
                .and_then(|t| serde_json::from_str::<Ready>(&t).ok())
            {
                return Ok(ready);
            }
            let exited = match self.child.as_mut() {
                Some(c) => matches!(c.try_wait(), Ok(Some(_))),
                None => false,
            };
            if exited || started.elapsed() > READY_WITHIN {
                return Err(WeirProcessError::NotReady { log: self.log() });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// What this generation logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    pub fn signal(&self, signal: Signal) {
        if let Some(pid) = pid(self.pid) {
            let _ = kill_process(pid, signal);
        }
    }

    /// `weir upgrade -c config`: the next generation takes over, and this
    /// one drains and exits. Returns the new generation (this one's child),
    /// read from its ready file, which the upgrade rewrote.
    pub async fn upgrade(
        mut self,
        binary: &Path,
        config: &Path,
    ) -> Result<(WeirProcess, ExitWait), WeirProcessError> {
        let ready_file = self.ready_path.clone();
        let _ = std::fs::remove_file(&ready_file);
        let out = tokio::process::Command::new(binary)
            .args(["upgrade", "-c"])
            .arg(config)
            .output()
            .await
            .map_err(|source| WeirProcessError::Spawn {
                binary: binary.display().to_string(),
                source,
            })?;
        if !out.status.success() {
            return Err(WeirProcessError::Upgrade {
                status: out.status.to_string(),
                output: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        let mut next = WeirProcess {
            started_in: Duration::ZERO,
            child: None,
            pid: 0,
            ready: Ready {
                listeners: Vec::new(),
                pid: 0,
            },
            ready_path: ready_file.clone(),
            stderr: self.stderr.clone(),
        };
        next.ready = next.wait_ready_file(&ready_file, self.pid).await?;
        next.pid = next.ready.pid;
        let old = ExitWait {
            child: self.child.take(),
            pid: self.pid,
            raw: self.pid,
            stderr: self.stderr.clone(),
        };
        // The old generation is `old`'s to wait for now, not this drop's to kill.
        self.pid = 0;
        Ok((next, old))
    }

    /// The ready file once a generation other than `previous` wrote it.
    async fn wait_ready_file(&self, path: &Path, previous: u32) -> Result<Ready, WeirProcessError> {
        let started = Instant::now();
        loop {
            if let Some(ready) = std::fs::read_to_string(path)
                .ok()
                .and_then(|t| serde_json::from_str::<Ready>(&t).ok())
                .filter(|r| r.pid != previous)
            {
                return Ok(ready);
            }
            if started.elapsed() > READY_WITHIN {
                return Err(WeirProcessError::NotReady { log: self.log() });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// SIGTERM: drain and exit; the wait for the exit.
    pub fn stop(mut self) -> ExitWait {
        self.signal(Signal::TERM);
        let wait = ExitWait {
            child: self.child.take(),
            pid: self.pid,
            raw: self.pid,
            stderr: self.stderr.clone(),
        };
        self.pid = 0;
        wait
    }
}

impl Drop for WeirProcess {
    fn drop(&mut self) {
        self.signal(Signal::KILL);
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        } else {
            reap(self.pid);
        }
    }
}

/// A stopping generation, to wait for.
pub struct ExitWait {
    child: Option<Child>,
    pid: u32,
    /// The pid as it was, for the error (`pid` is 0 once reaped).
    raw: u32,
    stderr: PathBuf,
}

impl ExitWait {
    /// Waits until the generation exited (and reaps it); an exit other than
    /// 0 is an error.
    pub async fn exited(mut self) -> Result<(), WeirProcessError> {
        match self.exit_code(EXIT_WITHIN).await {
            Some(code) => self.judge(code),
            None => Err(WeirProcessError::Stuck {
                pid: self.pid,
                log: std::fs::read_to_string(&self.stderr).unwrap_or_default(),
            }),
        }
    }

    /// Waits up to `grace` for the exit, then kills the generation
    /// (SIGKILL) and reaps it, as docker's stop does. Whether it had to be
    /// killed; an exit other than 0 before that is an error.
    pub async fn exited_or_killed(mut self, grace: Duration) -> Result<bool, WeirProcessError> {
        match self.exit_code(grace).await {
            Some(code) => self.judge(code).map(|()| false),
            // The drop kills and reaps it.
            None => Ok(true),
        }
    }

    /// The exit code once the generation exited (reaped: nothing left for
    /// the drop to kill), `None` if it still runs after `limit`.
    async fn exit_code(&mut self, limit: Duration) -> Option<Option<i32>> {
        let started = Instant::now();
        loop {
            let code = match self.child.as_mut() {
                Some(c) => c.try_wait().ok().flatten().map(|s| s.code()),
                None => gone(self.pid),
            };
            if code.is_some() {
                self.child = None;
                self.pid = 0;
                return code;
            }
            if started.elapsed() > limit {
                return None;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    fn judge(&self, code: Option<i32>) -> Result<(), WeirProcessError> {
        match code {
            Some(0) => Ok(()),
            code => Err(WeirProcessError::Failed {
                pid: self.raw,
                code,
                log: std::fs::read_to_string(&self.stderr).unwrap_or_default(),
            }),
        }
    }
}

impl Drop for ExitWait {
    fn drop(&mut self) {
        if let Some(p) = pid(self.pid) {
            let _ = kill_process(p, Signal::KILL);
        }
        match self.child.take() {
            Some(mut c) => {
                let _ = c.wait();
            }
            None => reap(self.pid),
        }
    }
}

fn pid(raw: u32) -> Option<Pid> {
    i32::try_from(raw).ok().and_then(Pid::from_raw)
}

/// Whether a generation that is not our direct child is gone: reaped here
/// (as its subreaper) with its exit code, or gone from the process table.
/// `None` while it runs.
fn gone(raw: u32) -> Option<Option<i32>> {
    let p = pid(raw)?;
    match rustix::process::waitpid(Some(p), WaitOptions::NOHANG) {
        Ok(Some((_, status))) => Some(status.exit_status()),
        Ok(None) => None,
        // Not ours to reap: gone when its /proc entry is.
        Err(_) => (!Path::new(&format!("/proc/{raw}")).exists()).then_some(Some(0)),
    }
}

fn reap(raw: u32) {
    if let Some(p) = pid(raw) {
        let _ = rustix::process::waitpid(Some(p), WaitOptions::NOHANG);
    }
}
