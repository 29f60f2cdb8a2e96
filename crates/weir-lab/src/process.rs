//! Server programs the lab runs as children (nginx, HAProxy): each started in the
//! foreground from a config the caller wrote into the process's own temp dir, waited for
//! on its loopback port, and stopped by its process id (SIGTERM, then SIGKILL) and reaped
//! when dropped: PID 1 on the lab machines reaps orphans late.
//!
//! It owns a child's life only. The configs are written by [`crate::nginx`] and
//! [`crate::haproxy`]; nothing here installs, tunes or reloads a server.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

/// How long a server gets to accept connections on its port.
const START_DEADLINE: Duration = Duration::from_secs(10);
/// How long a server gets to exit on SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// Polling period while waiting for a port or an exit: short enough not to slow a run,
/// long enough not to take a core from the run on a 2-core machine.
const POLL: Duration = Duration::from_millis(20);

/// A server program the lab can run: where it is and how to get it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Program {
    /// Its name in messages (`nginx`).
    pub name: &'static str,
    /// Where it is looked for unless `env` names another binary.
    pub binary: &'static str,
    /// The environment variable naming another binary.
    pub env: &'static str,
    /// The Debian package that installs it.
    pub package: &'static str,
}

impl Program {
    /// The binary to run: `$env` when set, else the default path.
    pub fn path(&self) -> String {
        std::env::var(self.env).unwrap_or_else(|_| self.binary.to_string())
    }
}

/// Why a server program could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error(
        "this scenario needs {program} ({why}), but {binary} does not exist; install it \
         (apt-get install {package}, or scripts/install-test-deps.sh) or set {env}"
    )]
    Missing {
        program: &'static str,
        why: String,
        binary: String,
        package: &'static str,
        env: &'static str,
    },
    #[error("{program}: cannot prepare its directory: {source}")]
    Setup {
        program: &'static str,
        source: std::io::Error,
    },
    #[error("{program}: cannot start {binary}: {source}")]
    Spawn {
        program: &'static str,
        binary: String,
        source: std::io::Error,
    },
    #[error("{program} exited at start ({status}); it said:\n{log}")]
    Exited {
        program: &'static str,
        status: String,
        log: String,
    },
    #[error("{program} did not accept connections on {addr} within {START_DEADLINE:?}")]
    NotListening {
        program: &'static str,
        addr: SocketAddr,
    },
}

/// A server program's own temp dir and the loopback address it is to listen on:
/// what a config is written for before [`ServerProcess::start`].
#[derive(Debug)]
pub struct ServerDir {
    pub program: Program,
    pub dir: tempfile::TempDir,
    pub listen: SocketAddr,
}

impl ServerDir {
    /// A fresh dir (readable by the workers a server started as root runs as) and a
    /// free loopback port; `why` says in the error why the scenario needs the program.
    pub fn new(program: Program, why: &str) -> Result<ServerDir, ProcessError> {
        let binary = program.path();
        if !Path::new(&binary).exists() {
            return Err(ProcessError::Missing {
                program: program.name,
                why: why.to_string(),
                binary,
                package: program.package,
                env: program.env,
            });
        }
        let setup = |source| ProcessError::Setup {
            program: program.name,
            source,
        };
        let dir = tempfile::tempdir().map_err(setup)?;
        // nginx's workers run as `nobody` when started by root: let them reach temp paths.
        set_mode(dir.path());
        let listen = free_port().map_err(setup)?;
        Ok(ServerDir {
            program,
            dir,
            listen,
        })
    }

    /// A variant's config text with the lab's places filled in: `{{app}}` the app's
    /// address, `{{listen}}` this server's, `{{dir}}` this dir.
    pub fn fill(&self, config: &str, app: SocketAddr) -> String {
        config
            .replace("{{app}}", &app.to_string())
            .replace("{{listen}}", &self.listen.to_string())
            .replace("{{dir}}", &self.dir.path().display().to_string())
    }

    /// A path inside the dir.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes `name` into the dir.
    pub fn write(&self, name: &str, text: &str) -> Result<PathBuf, ProcessError> {
        let path = self.path(name);
        std::fs::write(&path, text).map_err(|source| ProcessError::Setup {
            program: self.program.name,
            source,
        })?;
        Ok(path)
    }
}

/// A running server program; dropping it stops and reaps it.
#[derive(Debug)]
pub struct ServerProcess {
    pub program: Program,
    /// Where it listens.
    pub addr: SocketAddr,
    child: Option<Child>,
    dir: ServerDir,
    /// What it was started with, to start it again.
    args: Vec<std::ffi::OsString>,
}

impl ServerProcess {
    /// Runs the program with `args` (stdout and stderr to `output.log` in its dir) and
    /// waits until it accepts connections on the dir's address.
    pub fn start(dir: ServerDir, args: &[&std::ffi::OsStr]) -> Result<ServerProcess, ProcessError> {
        let program = dir.program;
        let binary = program.path();
        let setup = |source| ProcessError::Setup {
            program: program.name,
            source,
        };
        let output = std::fs::File::options()
            .create(true)
            .append(true)
            .open(dir.path("output.log"))
            .map_err(setup)?;
        let child = Command::new(&binary)
            .args(args)
            .current_dir(dir.dir.path())
            .stdin(Stdio::null())
            .stdout(output.try_clone().map_err(setup)?)
            .stderr(output)
            .spawn()
            .map_err(|source| ProcessError::Spawn {
                program: program.name,
                binary,
                source,
            })?;
        let mut server = ServerProcess {
            program,
            addr: dir.listen,
            child: Some(child),
            dir,
            args: args.iter().map(|a| a.to_os_string()).collect(),
        };
        server.wait_listening()?;
        Ok(server)
    }

    /// Stops the program as [`ServerProcess::stop`] does, then starts it
    /// again with the same arguments and waits until it listens: a plain
    /// restart, with the gap between the two.
    pub fn restart(&mut self) -> Result<(), ProcessError> {
        self.stop();
        let binary = self.program.path();
        let setup = |source| ProcessError::Setup {
            program: self.program.name,
            source,
        };
        let output = std::fs::File::options()
            .append(true)
            .open(self.dir.path("output.log"))
            .map_err(setup)?;
        let child = Command::new(&binary)
            .args(&self.args)
            .current_dir(self.dir.dir.path())
            .stdin(Stdio::null())
            .stdout(output.try_clone().map_err(setup)?)
            .stderr(output)
            .spawn()
            .map_err(|source| ProcessError::Spawn {
                program: self.program.name,
                binary,
                source,
            })?;
        self.child = Some(child);
        self.wait_listening()
    }

    /// Sends `signal` to the program (nginx: HUP reloads its configuration).
    pub fn signal(&self, signal: Signal) {
        if let Some(pid) = self
            .child
            .as_ref()
            .and_then(|c| i32::try_from(c.id()).ok())
            .and_then(Pid::from_raw)
        {
            let _ = kill_process(pid, signal);
        }
    }

    /// Writes `name` into the program's dir (a configuration to reload).
    pub fn write(&self, name: &str, text: &str) -> Result<PathBuf, ProcessError> {
        self.dir.write(name, text)
    }

    /// The program's own dir.
    pub fn dir(&self) -> &Path {
        self.dir.dir.path()
    }

    fn wait_listening(&mut self) -> Result<(), ProcessError> {
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(ProcessError::Exited {
                    program: self.program.name,
                    status: status.to_string(),
                    log: self.logs(),
                });
            }
            if Instant::now() > deadline {
                return Err(ProcessError::NotListening {
                    program: self.program.name,
                    addr: self.addr,
                });
            }
            std::thread::sleep(POLL);
        }
    }

    /// What the program wrote: its output and, when there is one, its `error.log`.
    pub fn logs(&self) -> String {
        ["output.log", "error.log"]
            .iter()
            .filter_map(|f| std::fs::read_to_string(self.dir.path(f)).ok())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Stops the program (SIGTERM to its pid, SIGKILL after a grace) and reaps it.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(pid) = i32::try_from(child.id()).ok().and_then(Pid::from_raw) {
            let _ = kill_process(pid, Signal::TERM);
        }
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(POLL);
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

fn set_mode(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    // Best effort: the server still runs when the directory stays private to its owner.
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755));
}

/// A free loopback port; the server binds it right after (a race only another binder
/// can lose).
fn free_port() -> std::io::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    l.local_addr()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A program that is not there, with an environment variable no one sets.
    fn absent() -> Program {
        Program {
            name: "absent",
            binary: "/nonexistent/weir-lab-absent",
            env: "WEIR_LAB_TEST_NEVER_SET",
            package: "absent-package",
        }
    }

    #[test]
    fn a_missing_program_says_how_to_get_it() {
        let err = ServerDir::new(absent(), "a variant with gateway = \"absent\"").unwrap_err();
        let text = err.to_string();
        for needle in [
            "gateway = \"absent\"",
            "/nonexistent/weir-lab-absent",
            "apt-get install absent-package",
            "WEIR_LAB_TEST_NEVER_SET",
        ] {
            assert!(text.contains(needle), "{needle:?} in {text}");
        }
    }

    /// A server that exits at start is reported with what it said, not waited for.
    #[test]
    fn a_server_that_exits_at_start_is_reported_with_its_output() {
        let sh = Program {
            name: "sh",
            binary: "/bin/sh",
            ..absent()
        };
        let dir = ServerDir::new(sh, "a test").expect("sh exists");
        let started = Instant::now();
        let err = ServerProcess::start(
            dir,
            &["-c".as_ref(), "echo bad config line 3 >&2; exit 1".as_ref()],
        )
        .unwrap_err();
        assert!(started.elapsed() < START_DEADLINE, "not waited out");
        match err {
            ProcessError::Exited { log, .. } => assert!(log.contains("bad config line 3"), "{log}"),
            other => panic!("{other}"),
        }
    }
}
